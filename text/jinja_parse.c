// jinja_parse — template source to syntax tree, in three steps as @huggingface/jinja takes
// them: preprocessing (one trailing newline dropped, lstrip_blocks, trim_blocks, the
// {% generation %} markers removed), tokens, and a recursive-descent parser with its operator
// precedence (tests bind tighter than arithmetic, filters tighter than tests, and `-x|f` is
// `(-x)|f`). Every step keeps, per byte, the offset it came from in the source, so errors name
// the source's line and column.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

#define S_MAX_NEST 200  // nested brackets, expressions and blocks

// ---- preprocessing ------------------------------------------------------------------------

typedef struct {
    char *s;
    uint32_t *m;  // m[i]: the source offset of s[i]; m[n]: the end
    size_t n;
} ssrc_t;

static ssrc_t s_src_new(jx_t *x, size_t cap) {
    ssrc_t o = {jx_alloc(x, cap + 1), jx_alloc(x, (cap + 1) * sizeof(uint32_t)), 0};
    return o;
}

static void s_src_put(ssrc_t *o, const ssrc_t *in, size_t i) {
    o->s[o->n] = in->s[i];
    o->m[o->n++] = in->m[i];
}

static void s_src_end(ssrc_t *o, const ssrc_t *in) {
    o->s[o->n] = 0;
    o->m[o->n] = in->m[in->n];
}

static bool s_space_at(const ssrc_t *in, size_t i, size_t *next) {
    size_t j = i;
    uint32_t cp = jstr_next(in->s, in->n, &j);
    *next = j;
    return jstr_is_space(cp);
}

// JavaScript's multiline ^: the start, or after \n, \r, U+2028, U+2029.
static bool s_line_start(const ssrc_t *in, size_t i) {
    if (i == 0 || in->s[i - 1] == '\n' || in->s[i - 1] == '\r')
        return true;
    return i >= 3 && (unsigned char)in->s[i - 3] == 0xe2 && (unsigned char)in->s[i - 2] == 0x80 &&
           ((unsigned char)in->s[i - 1] == 0xa8 || (unsigned char)in->s[i - 1] == 0xa9);
}

// lstrip_blocks: /^[ \t]*({[#%-])/gm -> "$1".
static ssrc_t s_lstrip_blocks(jx_t *x, const ssrc_t *in) {
    ssrc_t o = s_src_new(x, in->n);
    for (size_t i = 0; i < in->n;) {
        if (s_line_start(in, i)) {
            size_t j = i;
            while (j < in->n && (in->s[j] == ' ' || in->s[j] == '\t'))
                j++;
            if (j > i && j + 1 < in->n && in->s[j] == '{' && strchr("#%-", in->s[j + 1]) && in->s[j + 1])
                i = j;
        }
        s_src_put(&o, in, i++);
    }
    s_src_end(&o, in);
    return o;
}

// trim_blocks: /([#%-]})\n/g -> "$1".
static ssrc_t s_trim_blocks(jx_t *x, const ssrc_t *in) {
    ssrc_t o = s_src_new(x, in->n);
    for (size_t i = 0; i < in->n;) {
        if (i + 2 < in->n && in->s[i] && strchr("#%-", in->s[i]) && in->s[i + 1] == '}' && in->s[i + 2] == '\n') {
            s_src_put(&o, in, i);
            s_src_put(&o, in, i + 1);
            i += 3;
            continue;
        }
        s_src_put(&o, in, i++);
    }
    s_src_end(&o, in);
    return o;
}

// The end of a {% generation %} / {% endgeneration %} tag starting at i ('{'), or 0; *strip_l
// and *strip_r say whether it has the '-' marks.
static size_t s_generation_tag(const ssrc_t *in, size_t i, bool *strip_l, bool *strip_r) {
    size_t j = i + 2, k;
    if (i + 1 >= in->n || in->s[i] != '{' || in->s[i + 1] != '%')
        return 0;
    *strip_l = j < in->n && in->s[j] == '-';
    j += *strip_l;
    while (j < in->n && s_space_at(in, j, &k))
        j = k;
    if (in->n - j >= 3 && memcmp(in->s + j, "end", 3) == 0)
        j += 3;
    if (in->n - j < 10 || memcmp(in->s + j, "generation", 10) != 0)
        return 0;
    j += 10;
    while (j < in->n && s_space_at(in, j, &k))
        j = k;
    *strip_r = j < in->n && in->s[j] == '-';
    j += *strip_r;
    if (j + 1 >= in->n || in->s[j] != '%' || in->s[j + 1] != '}')
        return 0;
    return j + 2;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs: the markers of assistant-mask templates
// render as nothing; their '-' marks eat the whitespace around them.
static ssrc_t s_drop_generation(jx_t *x, const ssrc_t *in) {
    ssrc_t o = s_src_new(x, in->n);
    size_t ws = 0;  // start of the whitespace run before i
    for (size_t i = 0; i < in->n;) {
        bool sl, sr;
        size_t end = s_generation_tag(in, i, &sl, &sr), k;
        if (end) {
            if (sl)
                o.n -= i - ws;  // the run was copied already: take it back
            size_t after = end;
            while (after < in->n && s_space_at(in, after, &k))
                after = k;
            if (!sr)
                for (size_t q = end; q < after; q++)
                    s_src_put(&o, in, q);
            i = ws = after;
            continue;
        }
        bool sp = s_space_at(in, i, &k);
        while (i < k)
            s_src_put(&o, in, i++);
        if (!sp)
            ws = i;
    }
    s_src_end(&o, in);
    return o;
}

// ---- tokens -------------------------------------------------------------------------------

typedef enum {
    T_TEXT, T_NUM, T_STR, T_ID, T_EQUALS, T_LPAREN, T_RPAREN, T_OSTMT, T_CSTMT, T_OEXPR, T_CEXPR,
    T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT, T_COLON, T_PIPE, T_ADD, T_MUL,
    T_POW, T_CMP, T_UNARY, T_COMMENT, T_EOF,
} stok_kind_t;

static const char *s_tok_names[] = {
    "Text", "NumericLiteral", "StringLiteral", "Identifier", "Equals", "OpenParen", "CloseParen",
    "OpenStatement", "CloseStatement", "OpenExpression", "CloseExpression", "OpenSquareBracket",
    "CloseSquareBracket", "OpenCurlyBracket", "CloseCurlyBracket", "Comma", "Dot", "Colon", "Pipe",
    "AdditiveBinaryOperator", "MultiplicativeBinaryOperator", "ExponentiationBinaryOperator",
    "ComparisonBinaryOperator", "UnaryOperator", "Comment", "end of template",
};

typedef struct {
    uint8_t k;
    const char *s;
    size_t n;
    uint32_t pos;
} stok_t;

typedef struct {
    jx_t *x;
    const ssrc_t *src;
    size_t i;
    stok_t *v;
    size_t n, cap;
} slex_t;

static void s_push(slex_t *l, stok_kind_t k, const char *s, size_t n, size_t pos) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        l->v = jx_grow(l->x, l->v, l->cap * sizeof *l->v, cap * sizeof *l->v);
        l->cap = cap;
    }
    l->v[l->n++] = (stok_t){(uint8_t)k, s, n, (uint32_t)pos};
}

static stok_kind_t s_last(const slex_t *l) { return l->n ? l->v[l->n - 1].k : T_EOF; }

static bool s_at(const slex_t *l, const char *lit) {
    size_t n = strlen(lit);
    return l->src->n - l->i >= n && memcmp(l->src->s + l->i, lit, n) == 0;
}

static bool s_is_space_here(const slex_t *l) {
    size_t k;
    return l->i < l->src->n && s_space_at(l->src, l->i, &k);
}

static void s_skip_space(slex_t *l) {
    size_t k;
    while (l->i < l->src->n && s_space_at(l->src, l->i, &k))
        l->i = k;
}

static bool s_digit(char c) { return c >= '0' && c <= '9'; }
static bool s_word(char c) { return s_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

// {%- and {{- remove the whitespace at the end of the text before them.
static void s_strip_trailing(slex_t *l) {
    if (s_last(l) != T_TEXT)
        return;
    stok_t *t = &l->v[l->n - 1];
    const char *s = t->s;
    jstr_trim(&s, &t->n, false, true);
    if (t->n == 0)
        l->n--;
}

static int s_hex(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// A quoted string from l->i (just after the quote) to the closing quote q, escapes decoded.
static void s_string(slex_t *l, char q, size_t start) {
    const ssrc_t *src = l->src;
    ls_buf_t b = {0};
    uint32_t high = 0;  // a \uD800-\uDBFF waiting for its low half
    while (l->i < src->n && src->s[l->i] != q) {
        char c = src->s[l->i++];
        uint32_t cp = (unsigned char)c;
        bool escaped_cp = false;
        if (c == '\\') {
            if (l->i >= src->n)
                break;
            char e = src->s[l->i++];
            if (e == 'x' || e == 'u') {
                size_t len = e == 'x' ? 2 : 4;
                cp = 0;
                for (size_t k = 0; k < len; k++) {
                    int h = l->i + k < src->n ? s_hex(src->s[l->i + k]) : -1;
                    if (h < 0) {
                        ls_buf_free(&b);
                        jx_fail(l->x, src->m[l->i - 2], "Invalid hexadecimal escape sequence: \\%c", e);
                    }
                    cp = cp * 16 + (uint32_t)h;
                }
                l->i += len;
                escaped_cp = true;
            } else {
                const char *from = "ntrbfv'\"\\", *to = "\n\t\r\b\f\v'\"\\";
                const char *p = e ? strchr(from, e) : NULL;
                if (!p) {
                    ls_buf_free(&b);
                    jx_fail(l->x, src->m[l->i - 1], "Unexpected escaped character: %c", e);
                }
                cp = (unsigned char)to[p - from];
            }
        }
        int rc = 0;
        if (escaped_cp && cp >= 0xd800 && cp <= 0xdbff) {
            if (high)
                rc |= ls_buf_append_cp(&b, 0xfffd);
            high = cp;
            continue;
        }
        if (high) {
            if (escaped_cp && cp >= 0xdc00 && cp <= 0xdfff) {
                cp = 0x10000 + ((high - 0xd800) << 10) + (cp - 0xdc00);
            } else {
                rc |= ls_buf_append_cp(&b, 0xfffd);
            }
            high = 0;
        } else if (escaped_cp && cp >= 0xdc00 && cp <= 0xdfff) {
            cp = 0xfffd;
        }
        rc |= escaped_cp || c == '\\' ? ls_buf_append_cp(&b, cp) : ls_buf_append(&b, &c, 1);
        if (rc < 0) {
            ls_buf_free(&b);
            jx_fail(l->x, UINT32_MAX, "out of memory");
        }
    }
    if (high && ls_buf_append_cp(&b, 0xfffd) < 0) {
        ls_buf_free(&b);
        jx_fail(l->x, UINT32_MAX, "out of memory");
    }
    if (l->i >= src->n) {
        ls_buf_free(&b);
        jx_fail(l->x, src->m[start], "Unexpected end of input: unterminated string");
    }
    l->i++;  // the closing quote
    s_push(l, T_STR, jx_strdup(l->x, b.s ? b.s : "", b.n), b.n, start);
    ls_buf_free(&b);
}

static void s_number(slex_t *l, size_t start, bool sign) {
    const ssrc_t *src = l->src;
    size_t from = l->i;
    while (l->i < src->n && s_digit(src->s[l->i]))
        l->i++;
    // "x.0.1": an integer after a dot is an index, never a fraction
    if (l->i > from && (sign || s_last(l) != T_DOT) && l->i + 1 < src->n && src->s[l->i] == '.' &&
        s_digit(src->s[l->i + 1])) {
        l->i++;
        while (l->i < src->n && s_digit(src->s[l->i]))
            l->i++;
    }
    if (sign && l->i == from) {
        s_push(l, T_UNARY, src->s + start, 1, start);
        return;
    }
    s_push(l, T_NUM, src->s + start, l->i - start, start);
}

static const struct {
    const char *lit;
    stok_kind_t k;
} s_puncts[] = {
    {"{%", T_OSTMT}, {"%}", T_CSTMT}, {"{{", T_OEXPR}, {"}}", T_CEXPR}, {"(", T_LPAREN}, {")", T_RPAREN},
    {"{", T_LBRACE}, {"}", T_RBRACE}, {"[", T_LBRACKET}, {"]", T_RBRACKET}, {",", T_COMMA}, {".", T_DOT},
    {":", T_COLON}, {"|", T_PIPE}, {"<=", T_CMP}, {">=", T_CMP}, {"==", T_CMP}, {"!=", T_CMP}, {"<", T_CMP},
    {">", T_CMP}, {"+", T_ADD}, {"-", T_ADD}, {"~", T_ADD}, {"**", T_POW}, {"*", T_MUL}, {"//", T_MUL},
    {"/", T_MUL}, {"%", T_MUL}, {"=", T_EQUALS},
};

static void s_lex(slex_t *l) {
    const ssrc_t *src = l->src;
    int curly = 0;  // '{' open inside an expression: "}}" there closes two dicts
    while (l->i < src->n) {
        stok_kind_t last = s_last(l);
        if (last == T_EOF || last == T_CSTMT || last == T_CEXPR || last == T_COMMENT) {
            size_t from = l->i;
            while (l->i < src->n &&
                   !(src->s[l->i] == '{' && l->i + 1 < src->n && strchr("%{#", src->s[l->i + 1]) && src->s[l->i + 1]))
                l->i++;
            if (l->i > from) {
                s_push(l, T_TEXT, src->s + from, l->i - from, from);
                continue;
            }
        }
        size_t start = l->i;
        if (s_at(l, "{#")) {
            l->i += 2;
            bool strip_before = l->i < src->n && src->s[l->i] == '-';
            l->i += strip_before;
            size_t from = l->i;
            while (!s_at(l, "#}")) {
                if (l->i + 2 >= src->n)
                    jx_fail(l->x, src->m[start], "Missing end of comment tag");
                l->i++;
            }
            bool strip_after = l->i > from && src->s[l->i - 1] == '-';
            if (strip_before)
                s_strip_trailing(l);
            s_push(l, T_COMMENT, src->s + from, l->i - from - strip_after, start);
            l->i += 2;
            if (strip_after)
                s_skip_space(l);
            continue;
        }
        if (s_at(l, "{%-") || s_at(l, "{{-")) {
            s_strip_trailing(l);
            bool stmt = src->s[l->i + 1] == '%';
            s_push(l, stmt ? T_OSTMT : T_OEXPR, stmt ? "{%" : "{{", 2, start);
            if (!stmt)
                curly = 0;
            l->i += 3;
            continue;
        }
        while (s_is_space_here(l)) {
            s_skip_space(l);
            if (l->i >= src->n)
                jx_fail(l->x, src->m[start], "Unexpected end of input");
        }
        start = l->i;
        if (s_at(l, "-%}") || s_at(l, "-}}")) {
            bool stmt = src->s[l->i + 1] == '%';
            s_push(l, stmt ? T_CSTMT : T_CEXPR, stmt ? "%}" : "}}", 2, start);
            l->i += 3;
            s_skip_space(l);
            continue;
        }
        char c = src->s[l->i];
        if (c == '-' || c == '+') {
            stok_kind_t lt = s_last(l);
            if (lt == T_TEXT || lt == T_EOF)
                jx_fail(l->x, src->m[start], "Unexpected character: %c", c);
            if (lt != T_ID && lt != T_NUM && lt != T_STR && lt != T_RPAREN && lt != T_RBRACKET) {
                l->i++;
                s_number(l, start, true);
                continue;
            }
        }
        bool matched = false;
        for (size_t k = 0; k < sizeof s_puncts / sizeof *s_puncts && !matched; k++) {
            if (s_puncts[k].k == T_CEXPR && curly > 0)
                continue;
            if (!s_at(l, s_puncts[k].lit))
                continue;
            size_t n = strlen(s_puncts[k].lit);
            s_push(l, s_puncts[k].k, src->s + l->i, n, start);
            if (s_puncts[k].k == T_OEXPR)
                curly = 0;
            else if (s_puncts[k].k == T_LBRACE)
                curly++;
            else if (s_puncts[k].k == T_RBRACE)
                curly--;
            l->i += n;
            matched = true;
        }
        if (matched)
            continue;
        if (c == '\'' || c == '"') {
            l->i++;
            s_string(l, c, start);
        } else if (s_digit(c)) {
            s_number(l, start, false);
        } else if (s_word(c)) {
            while (l->i < src->n && s_word(src->s[l->i]))
                l->i++;
            s_push(l, T_ID, src->s + start, l->i - start, start);
        } else {
            size_t k = l->i;
            uint32_t cp = jstr_next(src->s, src->n, &k);
            char u[8] = {0};
            ls_utf8_put(u, cp);
            jx_fail(l->x, src->m[start], "Unexpected character: %s", cp ? u : "NUL");
        }
    }
    s_push(l, T_EOF, "", 0, src->n);
}

// ---- parser -------------------------------------------------------------------------------

typedef struct {
    jx_t *x;
    stok_t *v;
    size_t n, i;
    int depth;
} sparse_t;

static jnode_t *s_node(sparse_t *p, jnode_kind_t k, uint32_t pos) {
    jnode_t *e = jx_alloc(p->x, sizeof *e);
    memset(e, 0, sizeof *e);
    e->kind = (uint8_t)k;
    e->pos = pos;
    return e;
}

static void s_add(sparse_t *p, jnodes_t *l, jnode_t *e) {
    // Doubling by powers of two: the capacity is implied by n.
    if ((l->n & (l->n - 1)) == 0) {
        size_t cap = l->n ? 2 * l->n : 1;
        l->v = jx_grow(p->x, l->v, l->n * sizeof *l->v, cap * sizeof *l->v);
    }
    l->v[l->n++] = e;
}

static stok_t *s_peek(sparse_t *p) { return &p->v[p->i]; }
static bool s_is(sparse_t *p, stok_kind_t k) { return p->v[p->i].k == k; }

static bool s_is_id(sparse_t *p, size_t ahead, const char *name) {
    if (p->i + ahead >= p->n)
        return false;
    const stok_t *t = &p->v[p->i + ahead];
    return t->k == T_ID && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static bool s_tok_is(const stok_t *t, const char *lit) { return t->n == strlen(lit) && memcmp(t->s, lit, t->n) == 0; }

static _Noreturn void s_unexpected(sparse_t *p, const char *what) {
    const stok_t *t = s_peek(p);
    if (t->k == T_EOF)
        jx_fail(p->x, t->pos, "%s, got the end of the template", what);
    jx_fail(p->x, t->pos, "%s, got %s '%.*s'", what, s_tok_names[t->k], (int)(t->n > 40 ? 40 : t->n), t->s);
}

static stok_t *s_expect(sparse_t *p, stok_kind_t k, const char *what) {
    if (!s_is(p, k))
        s_unexpected(p, what);
    return &p->v[p->i++];
}

static bool s_is_stmt(sparse_t *p, const char *a, const char *b, const char *c) {
    if (!s_is(p, T_OSTMT))
        return false;
    return s_is_id(p, 1, a) || (b && s_is_id(p, 1, b)) || (c && s_is_id(p, 1, c));
}

static void s_enter(sparse_t *p) {
    if (++p->depth > S_MAX_NEST)
        jx_fail(p->x, s_peek(p)->pos, "the template nests deeper than %d levels", S_MAX_NEST);
}

static jnode_t *s_expr(sparse_t *p);
static jnode_t *s_primary(sparse_t *p);
static jnode_t *s_any(sparse_t *p);

// Statements until one of the closing names (the caller consumes it); `what` names the block
// in the error at the end of the template.
static void s_block(sparse_t *p, jnodes_t *into, const char *what, const char *a, const char *b, const char *c) {
    while (!s_is_stmt(p, a, b, c)) {
        if (s_is(p, T_EOF))
            jx_fail(p->x, s_peek(p)->pos, "unexpected end of template: %s is not closed", what);
        s_add(p, into, s_any(p));
    }
}

static void s_end_tag(sparse_t *p, const char *name) {
    s_expect(p, T_OSTMT, "Expected {% token");
    if (!s_is_id(p, 0, name))
        jx_fail(p->x, s_peek(p)->pos, "Expected %s", name);
    p->i++;
    s_expect(p, T_CSTMT, "Expected %} token");
}

static jop_t s_binop(const stok_t *t) {
    static const struct {
        const char *s;
        jop_t op;
    } ops[] = {{"+", OP_ADD}, {"-", OP_SUB}, {"~", OP_CONCAT}, {"*", OP_MUL}, {"/", OP_DIV}, {"//", OP_FLOORDIV},
               {"%", OP_MOD}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {"<", OP_LT}, {">", OP_GT},
               {"<=", OP_LE}, {">=", OP_GE}, {"in", OP_IN}, {"and", OP_AND}, {"or", OP_OR}};
    for (size_t k = 0; k < sizeof ops / sizeof *ops; k++)
        if (s_tok_is(t, ops[k].s))
            return ops[k].op;
    return OP_ADD;  // unreachable: the callers pass operator tokens only
}

static jnode_t *s_binary(sparse_t *p, jop_t op, jnode_t *a, jnode_t *b, uint32_t pos) {
    jnode_t *e = s_node(p, N_BINARY, pos);
    e->op = (uint8_t)op;
    e->a = a;
    e->b = b;
    return e;
}

// Arguments of a call ("call") or parameters of a macro ("parameters"), after the '('.
static void s_args(sparse_t *p, jnodes_t *out, bool params) {
    s_expect(p, T_LPAREN, "Expected opening parenthesis for arguments list");
    bool saw_kw = false, saw_spread = false;
    while (!s_is(p, T_RPAREN)) {
        uint32_t pos = s_peek(p)->pos;
        bool kw_spread = s_is(p, T_POW), spread = s_is(p, T_MUL) && s_tok_is(s_peek(p), "*");
        if (params && (kw_spread || spread))
            jx_fail(p->x, pos, "Argument unpacking is not allowed in parameter declarations");
        jnode_t *arg;
        if (kw_spread) {
            p->i++;
            arg = s_node(p, N_KWSPREAD, pos);
            arg->a = s_expr(p);
            s_add(p, out, arg);
            if (s_is(p, T_COMMA))
                p->i++;
            if (!s_is(p, T_RPAREN))
                jx_fail(p->x, s_peek(p)->pos, "Expected closing parenthesis: `**` must be applied to the final argument");
            break;
        }
        if (spread) {
            if (saw_spread)
                jx_fail(p->x, pos, "Only one `*` argument unpacking is allowed");
            saw_spread = true;
            p->i++;
            arg = s_node(p, N_SPREAD, pos);
            arg->a = s_expr(p);
        } else {
            arg = s_expr(p);
            if (s_is(p, T_EQUALS)) {
                p->i++;
                if (arg->kind != N_NAME)
                    jx_fail(p->x, pos, params ? "Expected identifier for parameter declaration"
                                              : "Expected identifier for keyword argument");
                jnode_t *kw = s_node(p, N_KWARG, pos);
                kw->s = arg->s;
                kw->n = arg->n;
                kw->a = s_expr(p);
                arg = kw;
            }
            if (params) {
                if (arg->kind != N_NAME && arg->kind != N_KWARG)
                    jx_fail(p->x, pos, "Expected identifier for parameter declaration");
                for (size_t k = 0; k < out->n; k++)
                    if (out->v[k]->n == arg->n && memcmp(out->v[k]->s, arg->s, arg->n) == 0)
                        jx_fail(p->x, pos, "Duplicate parameter name: %.*s", (int)arg->n, arg->s);
            }
            if (arg->kind == N_KWARG)
                saw_kw = true;
            else if (saw_kw)
                jx_fail(p->x, pos, params ? "Non-default argument follows default argument"
                                          : "Positional arguments must come before keyword arguments");
            else if (saw_spread)
                jx_fail(p->x, pos, "Positional arguments must not follow `*` argument unpacking");
        }
        s_add(p, out, arg);
        if (s_is(p, T_COMMA))
            p->i++;
        else if (!s_is(p, T_RPAREN))
            s_unexpected(p, "Expected ',' or ')' in the arguments list");
    }
    p->i++;
}

static jnode_t *s_member(sparse_t *p, jnode_t *obj);

static jnode_t *s_call(sparse_t *p, jnode_t *callee) {
    for (;;) {
        jnode_t *e = s_node(p, N_CALL, callee->pos);  // errors point at the name called
        e->a = callee;
        s_args(p, &e->list, false);
        callee = s_member(p, e);
        if (!s_is(p, T_LPAREN))
            return callee;
    }
}

static jnode_t *s_subscript(sparse_t *p) {
    jnode_t *parts[3] = {NULL, NULL, NULL};
    size_t n = 0;
    bool slice = false;
    uint32_t pos = s_peek(p)->pos;
    while (!s_is(p, T_RBRACKET)) {
        if (n == 3)
            jx_fail(p->x, pos, "Expected 0-3 arguments for slice expression");
        if (s_is(p, T_COLON)) {
            n++;
            p->i++;
            slice = true;
        } else {
            parts[n++] = s_expr(p);
            if (s_is(p, T_COLON)) {
                p->i++;
                slice = true;
            } else if (!s_is(p, T_RBRACKET)) {
                s_unexpected(p, "Expected ']' or ':'");
            }
        }
    }
    if (n == 0)
        jx_fail(p->x, pos, "Expected at least one argument for member/slice expression");
    if (!slice)
        return parts[0];
    jnode_t *e = s_node(p, N_SLICE, pos);
    e->a = parts[0];
    e->b = parts[1];
    e->c = parts[2];
    return e;
}

static jnode_t *s_member(sparse_t *p, jnode_t *obj) {
    while (s_is(p, T_DOT) || s_is(p, T_LBRACKET)) {
        bool computed = s_is(p, T_LBRACKET);
        jnode_t *e = s_node(p, N_MEMBER, s_peek(p)->pos);
        p->i++;
        e->a = obj;
        e->flag = computed;
        if (computed) {
            s_enter(p);
            e->b = s_subscript(p);
            p->depth--;
            s_expect(p, T_RBRACKET, "Expected closing square bracket");
        } else {
            e->b = s_primary(p);
            if (e->b->kind != N_NAME && e->b->kind != N_INT)
                jx_fail(p->x, e->b->pos, "Expected identifier or integer following dot operator");
        }
        obj = e;
    }
    return obj;
}

// The tests that take an argument: `x is eq 3`, `x is in [1, 2]`, `x is divisibleby(3)`.
static bool s_test_takes_arg(const stok_t *t) {
    static const char *names[] = {"equalto", "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">",
                                  "ge", ">=", "in", "sameas", "divisibleby"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (s_tok_is(t, names[k]))
            return true;
    return false;
}

static jnode_t *s_unary_sign(sparse_t *p) {
    const stok_t *t = s_peek(p);
    if ((t->k == T_UNARY || t->k == T_ADD) && (s_tok_is(t, "-") || s_tok_is(t, "+"))) {
        jnode_t *e = s_node(p, N_UNARY, t->pos);
        e->op = s_tok_is(t, "-") ? OP_NEG : OP_POS;
        p->i++;
        s_enter(p);
        e->a = s_unary_sign(p);
        p->depth--;
        return e;
    }
    jnode_t *e = s_member(p, s_primary(p));
    return s_is(p, T_LPAREN) ? s_call(p, e) : e;
}

static jnode_t *s_filtered(sparse_t *p) {
    jnode_t *e = s_unary_sign(p);
    while (s_is(p, T_PIPE)) {
        jnode_t *f = s_node(p, N_FILTER, s_peek(p)->pos);
        p->i++;
        f->a = e;
        f->b = s_primary(p);
        if (f->b->kind != N_NAME)
            jx_fail(p->x, f->b->pos, "Expected identifier for the filter");
        if (s_is(p, T_LPAREN))
            f->b = s_call(p, f->b);
        e = f;
    }
    return e;
}

static jnode_t *s_tested(sparse_t *p) {
    jnode_t *e = s_filtered(p);
    while (s_is_id(p, 0, "is")) {
        jnode_t *t = s_node(p, N_TEST, s_peek(p)->pos);
        p->i++;
        if (s_is_id(p, 0, "not")) {
            t->flag = true;
            p->i++;
        }
        const stok_t *name = s_peek(p);
        // the name of a test, or a comparison operator as Jinja2's `x is == 3`
        if (name->k != T_ID && !(name->k == T_CMP && s_test_takes_arg(name)))
            s_unexpected(p, "Expected identifier for the test");
        p->i++;
        t->a = e;
        t->s = name->s;
        t->n = name->n;
        if (s_test_takes_arg(name)) {
            if (s_is(p, T_LPAREN)) {
                jnode_t *call = s_node(p, N_CALL, s_peek(p)->pos);
                s_args(p, &call->list, false);
                t->list = call->list;
            } else {
                s_add(p, &t->list, s_member(p, s_primary(p)));
            }
        }
        e = t;
    }
    return e;
}

static jnode_t *s_power(sparse_t *p) {
    jnode_t *e = s_tested(p);
    while (s_is(p, T_POW)) {
        uint32_t pos = p->v[p->i++].pos;
        e = s_binary(p, OP_POW, e, s_tested(p), pos);
    }
    return e;
}

static jnode_t *s_mul(sparse_t *p) {
    jnode_t *e = s_power(p);
    while (s_is(p, T_MUL)) {
        const stok_t *t = &p->v[p->i++];
        e = s_binary(p, s_binop(t), e, s_power(p), t->pos);
    }
    return e;
}

static jnode_t *s_add_expr(sparse_t *p) {
    jnode_t *e = s_mul(p);
    while (s_is(p, T_ADD)) {
        const stok_t *t = &p->v[p->i++];
        e = s_binary(p, s_binop(t), e, s_mul(p), t->pos);
    }
    return e;
}

static jnode_t *s_compare(sparse_t *p) {
    jnode_t *e = s_add_expr(p);
    for (;;) {
        const stok_t *t = s_peek(p);
        jop_t op;
        if (s_is_id(p, 0, "not") && s_is_id(p, 1, "in")) {
            op = OP_NOTIN;
            p->i += 2;
        } else if (s_is_id(p, 0, "in") || t->k == T_CMP) {
            op = s_binop(t);
            p->i++;
        } else {
            return e;
        }
        e = s_binary(p, op, e, s_add_expr(p), t->pos);
    }
}

static jnode_t *s_not(sparse_t *p) {
    if (s_is_id(p, 0, "not")) {
        jnode_t *e = s_node(p, N_UNARY, s_peek(p)->pos);
        e->op = OP_NOT;
        p->i++;
        s_enter(p);
        e->a = s_not(p);
        p->depth--;
        return e;
    }
    return s_compare(p);
}

static jnode_t *s_and(sparse_t *p) {
    jnode_t *e = s_not(p);
    while (s_is_id(p, 0, "and")) {
        uint32_t pos = p->v[p->i++].pos;
        e = s_binary(p, OP_AND, e, s_not(p), pos);
    }
    return e;
}

static jnode_t *s_or(sparse_t *p) {
    jnode_t *e = s_and(p);
    while (s_is_id(p, 0, "or")) {
        uint32_t pos = p->v[p->i++].pos;
        e = s_binary(p, OP_OR, e, s_and(p), pos);
    }
    return e;
}

static jnode_t *s_expr(sparse_t *p) {
    s_enter(p);
    jnode_t *a = s_or(p);
    if (s_is_id(p, 0, "if")) {
        uint32_t pos = p->v[p->i++].pos;
        jnode_t *test = s_or(p);
        jnode_t *e;
        if (s_is_id(p, 0, "else")) {
            p->i++;
            e = s_node(p, N_TERNARY, pos);
            e->a = test;
            e->b = a;
            e->c = s_expr(p);
        } else {
            e = s_node(p, N_SELECT, pos);
            e->a = a;
            e->b = test;
        }
        a = e;
    }
    p->depth--;
    return a;
}

// `a, b` (a tuple) or `a`; primary: names only (for and set targets).
static jnode_t *s_sequence(sparse_t *p, bool primary) {
    jnode_t *first = primary ? s_primary(p) : s_expr(p);
    if (!s_is(p, T_COMMA))
        return first;
    jnode_t *t = s_node(p, N_TUPLE, first->pos);
    s_add(p, &t->list, first);
    while (s_is(p, T_COMMA)) {
        p->i++;
        s_add(p, &t->list, primary ? s_primary(p) : s_expr(p));
    }
    return t;
}

static jnode_t *s_primary(sparse_t *p) {
    stok_t *t = &p->v[p->i];
    if (t->k == T_EOF)
        s_unexpected(p, "Expected an expression");
    p->i++;
    jnode_t *e;
    switch (t->k) {
    case T_NUM: {
        char buf[64];
        snprintf(buf, sizeof buf, "%.*s", (int)(t->n < 63 ? t->n : 63), t->s);
        if (memchr(t->s, '.', t->n)) {
            e = s_node(p, N_FLOAT, t->pos);
            e->f = strtod(buf, NULL);
        } else {
            // JavaScript reads integer literals as doubles: beyond int64 they are floats
            double d = strtod(buf, NULL);
            if (d >= -9.2e18 && d <= 9.2e18) {
                e = s_node(p, N_INT, t->pos);
                e->i = strtoll(buf, NULL, 10);
            } else {
                e = s_node(p, N_FLOAT, t->pos);
                e->f = d;
            }
        }
        return e;
    }
    case T_STR: {
        // adjacent literals concatenate: 'a' "b" is "ab"
        size_t n = t->n;
        for (size_t k = p->i; p->v[k].k == T_STR; k++)
            n += p->v[k].n;
        char *s = jx_alloc(p->x, n + 1);
        size_t at = 0;
        memcpy(s, t->s, t->n);
        at = t->n;
        while (s_is(p, T_STR)) {
            memcpy(s + at, p->v[p->i].s, p->v[p->i].n);
            at += p->v[p->i++].n;
        }
        s[at] = 0;
        e = s_node(p, N_STR, t->pos);
        e->s = s;
        e->n = n;
        return e;
    }
    case T_ID:
        e = s_node(p, N_NAME, t->pos);
        e->s = t->s;
        e->n = t->n;
        return e;
    case T_LPAREN:
        s_enter(p);
        e = s_sequence(p, false);
        p->depth--;
        s_expect(p, T_RPAREN, "Expected closing parenthesis");
        return e;
    case T_LBRACKET:
        s_enter(p);
        e = s_node(p, N_LIST, t->pos);
        while (!s_is(p, T_RBRACKET)) {
            s_add(p, &e->list, s_expr(p));
            if (s_is(p, T_COMMA))
                p->i++;
            else if (!s_is(p, T_RBRACKET))
                s_unexpected(p, "Expected ',' or ']' in a list");
        }
        p->i++;
        p->depth--;
        return e;
    case T_LBRACE:
        s_enter(p);
        e = s_node(p, N_DICT, t->pos);
        while (!s_is(p, T_RBRACE)) {
            s_add(p, &e->list, s_expr(p));
            s_expect(p, T_COLON, "Expected colon between key and value in object literal");
            s_add(p, &e->list2, s_expr(p));
            if (s_is(p, T_COMMA))
                p->i++;
            else if (!s_is(p, T_RBRACE))
                s_unexpected(p, "Expected ',' or '}' in a dict");
        }
        p->i++;
        p->depth--;
        return e;
    default:
        p->i--;
        s_unexpected(p, "Unexpected token");
    }
}

static jnode_t *s_if(sparse_t *p, uint32_t pos) {
    jnode_t *e = s_node(p, N_IF, pos);
    e->a = s_expr(p);
    s_expect(p, T_CSTMT, "Expected closing statement token");
    s_block(p, &e->list, "{% if %}", "elif", "else", "endif");
    if (s_is_stmt(p, "elif", NULL, NULL)) {
        uint32_t at = p->v[p->i].pos;
        p->i += 2;
        s_enter(p);
        s_add(p, &e->list2, s_if(p, at));
        p->depth--;
    } else if (s_is_stmt(p, "else", NULL, NULL)) {
        p->i += 2;
        s_expect(p, T_CSTMT, "Expected closing statement token");
        s_block(p, &e->list2, "{% if %}", "endif", NULL, NULL);
    }
    return e;
}

static jnode_t *s_statement(sparse_t *p) {
    uint32_t pos = s_expect(p, T_OSTMT, "Expected opening statement token")->pos;
    if (!s_is(p, T_ID))
        s_unexpected(p, "Unknown statement");
    const stok_t *name = &p->v[p->i++];
    jnode_t *e;
    s_enter(p);
    if (s_tok_is(name, "set")) {
        e = s_node(p, N_SET, pos);
        e->a = s_sequence(p, false);
        if (s_is(p, T_EQUALS)) {
            p->i++;
            e->b = s_sequence(p, false);
        } else {
            s_expect(p, T_CSTMT, "Expected %} token");
            s_block(p, &e->list, "{% set %}", "endset", NULL, NULL);
            s_expect(p, T_OSTMT, "Expected {% token");
            p->i++;
        }
        s_expect(p, T_CSTMT, "Expected closing statement token");
    } else if (s_tok_is(name, "if")) {
        e = s_if(p, pos);
        s_end_tag(p, "endif");
    } else if (s_tok_is(name, "macro")) {
        e = s_node(p, N_MACRO, pos);
        jnode_t *id = s_primary(p);
        if (id->kind != N_NAME)
            jx_fail(p->x, id->pos, "Expected identifier following macro statement");
        e->s = id->s;
        e->n = id->n;
        s_args(p, &e->list, true);
        s_expect(p, T_CSTMT, "Expected closing statement token");
        s_block(p, &e->list2, "{% macro %}", "endmacro", NULL, NULL);
        s_end_tag(p, "endmacro");
    } else if (s_tok_is(name, "for")) {
        e = s_node(p, N_FOR, pos);
        e->a = s_sequence(p, true);
        if (e->a->kind != N_NAME && e->a->kind != N_TUPLE)
            jx_fail(p->x, e->a->pos, "Expected identifier/tuple for the loop variable");
        for (size_t k = 0; e->a->kind == N_TUPLE && k < e->a->list.n; k++)
            if (e->a->list.v[k]->kind != N_NAME)
                jx_fail(p->x, e->a->list.v[k]->pos, "Cannot unpack to a non-identifier in a for loop");
        if (!s_is_id(p, 0, "in"))
            s_unexpected(p, "Expected `in` keyword following loop variable");
        p->i++;
        e->b = s_expr(p);
        s_expect(p, T_CSTMT, "Expected closing statement token");
        s_block(p, &e->list, "{% for %}", "endfor", "else", NULL);
        if (s_is_stmt(p, "else", NULL, NULL)) {
            p->i += 2;
            s_expect(p, T_CSTMT, "Expected closing statement token");
            s_block(p, &e->list2, "{% for %}", "endfor", NULL, NULL);
        }
        s_end_tag(p, "endfor");
    } else if (s_tok_is(name, "call")) {
        e = s_node(p, N_CALLBLOCK, pos);
        if (s_is(p, T_LPAREN)) {
            e->flag = true;
            s_args(p, &e->list, true);
        }
        jnode_t *callee = s_primary(p);
        if (callee->kind != N_NAME)
            jx_fail(p->x, callee->pos, "Expected identifier following call statement");
        e->a = s_node(p, N_CALL, callee->pos);
        e->a->a = callee;
        s_args(p, &e->a->list, false);
        s_expect(p, T_CSTMT, "Expected closing statement token");
        s_block(p, &e->list2, "{% call %}", "endcall", NULL, NULL);
        s_end_tag(p, "endcall");
    } else if (s_tok_is(name, "break") || s_tok_is(name, "continue")) {
        e = s_node(p, s_tok_is(name, "break") ? N_BREAK : N_CONTINUE, pos);
        s_expect(p, T_CSTMT, "Expected closing statement token");
    } else if (s_tok_is(name, "filter")) {
        e = s_node(p, N_FILTERBLOCK, pos);
        e->b = s_primary(p);
        if (e->b->kind != N_NAME)
            jx_fail(p->x, e->b->pos, "Expected identifier for the filter");
        if (s_is(p, T_LPAREN))
            e->b = s_call(p, e->b);
        s_expect(p, T_CSTMT, "Expected closing statement token");
        s_block(p, &e->list, "{% filter %}", "endfilter", NULL, NULL);
        s_end_tag(p, "endfilter");
    } else {
        jx_fail(p->x, name->pos, "Unknown statement type: %.*s", (int)(name->n > 40 ? 40 : name->n), name->s);
    }
    p->depth--;
    return e;
}

static jnode_t *s_any(sparse_t *p) {
    const stok_t *t = s_peek(p);
    jnode_t *e;
    switch (t->k) {
    case T_COMMENT:
        p->i++;
        return s_node(p, N_COMMENT, t->pos);
    case T_TEXT:
        p->i++;
        e = s_node(p, N_STR, t->pos);
        e->s = t->s;
        e->n = t->n;
        return e;
    case T_OSTMT:
        return s_statement(p);
    case T_OEXPR:
        p->i++;
        e = s_expr(p);
        s_expect(p, T_CEXPR, "Expected closing expression token");
        return e;
    default:
        s_unexpected(p, "Unexpected token");
    }
}

void jparse_run(ls_jinja_t *t, const char *src, size_t len) {
    jx_t *x = &t->x;
    if (len >= UINT32_MAX / 2)
        jx_fail(x, UINT32_MAX, "the template is too large");
    if (memchr(src, 0, len))
        jx_fail(x, UINT32_MAX, "the template holds a NUL byte");
    ssrc_t in = s_src_new(x, len);
    memcpy(in.s, src, len);
    for (size_t i = 0; i <= len; i++)
        in.m[i] = (uint32_t)i;
    in.n = len;
    in.s[len] = 0;
    x->src = in.s;
    if (in.n && in.s[in.n - 1] == '\n')
        in.n--;
    ssrc_t a = s_lstrip_blocks(x, &in);
    ssrc_t b = s_trim_blocks(x, &a);
    ssrc_t c = s_drop_generation(x, &b);
    x->map = c.m;
    x->map_n = c.n;
    slex_t l = {.x = x, .src = &c};
    s_lex(&l);
    sparse_t p = {.x = x, .v = l.v, .n = l.n};
    while (!s_is(&p, T_EOF))
        s_add(&p, &t->body, s_any(&p));
}
