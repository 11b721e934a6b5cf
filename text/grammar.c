// grammar — regex -> AST -> Thompson NFA over byte sets -> DFA over byte classes; see grammar.h.
//
// The DFA is built by subset construction over byte equivalence classes (bytes that every set
// of the NFA treats alike share a column), so a state's row is a few dozen ints rather than 256.
// It is not minimized: the states are bounded instead, and a grammar is compiled once per
// distinct source (grammar_cache.c). After construction, states that cannot reach an accepting
// state are dropped (their transitions become -1), which is what lets a mask be computed by
// walking bytes without looking ahead.
#include "grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

// ---- AST ------------------------------------------------------------------------------------

typedef enum { N_SET, N_CAT, N_ALT, N_REP } s_node_type_t;

typedef struct {
    s_node_type_t type;
    int set;           // N_SET: index into sets
    int first, next;   // children (N_CAT, N_ALT, N_REP: one), siblings; -1 ends
    int min, max;      // N_REP; max -1: unbounded
} s_node_t;

typedef struct {
    uint64_t w[4];
} s_bset_t;

enum { S_MAX_REPEAT = 1000, S_MAX_NEST = 200 };

typedef struct {
    const unsigned char *p, *end, *start;
    s_node_t *nodes;
    int n_nodes, cap_nodes;
    s_bset_t *sets;
    int n_sets, cap_sets;
    int depth;
    char *err;
    size_t errlen;
    int failed;
} s_parser_t;

static int s_fail(s_parser_t *ps, const char *what) {
    if (!ps->failed)
        snprintf(ps->err, ps->errlen, "regex: %s at offset %zu", what, (size_t)(ps->p - ps->start));
    ps->failed = 1;
    return -1;
}

// Room for one more element of size bytes in *v (n used of *cap); 0, or -1 out of memory.
static int s_grow(void **v, int n, int *cap, size_t size) {
    if (n < *cap)
        return 0;
    int c = *cap ? *cap * 2 : 64;
    void *p = realloc(*v, (size_t)c * size);
    if (!p)
        return -1;
    *v = p;
    *cap = c;
    return 0;
}

static int s_node(s_parser_t *ps, s_node_type_t type) {
    if (s_grow((void **)&ps->nodes, ps->n_nodes, &ps->cap_nodes, sizeof *ps->nodes) < 0)
        return s_fail(ps, "out of memory");
    ps->nodes[ps->n_nodes] = (s_node_t){.type = type, .set = -1, .first = -1, .next = -1};
    return ps->n_nodes++;
}

static int s_set_node(s_parser_t *ps, const s_bset_t *b) {
    if (s_grow((void **)&ps->sets, ps->n_sets, &ps->cap_sets, sizeof *ps->sets) < 0)
        return s_fail(ps, "out of memory");
    int k = s_node(ps, N_SET);
    if (k < 0)
        return -1;
    ps->sets[ps->n_sets] = *b;
    ps->nodes[k].set = ps->n_sets++;
    return k;
}

static void s_bset_add(s_bset_t *b, int lo, int hi) {
    for (int c = lo; c <= hi; c++)
        b->w[c >> 6] |= 1ull << (c & 63);
}

static int s_bset_has(const s_bset_t *b, int c) {
    return (b->w[c >> 6] >> (c & 63)) & 1;
}

static int s_byte_node(s_parser_t *ps, int lo, int hi) {
    s_bset_t b = {{0}};
    s_bset_add(&b, lo, hi);
    return s_set_node(ps, &b);
}

// Appends child to parent's children.
static void s_adopt(s_parser_t *ps, int parent, int child) {
    int *at = &ps->nodes[parent].first;
    while (*at >= 0)
        at = &ps->nodes[*at].next;
    *at = child;
}

// A CAT of byte-range nodes, each range given as lo,hi pairs (n pairs).
static int s_seq(s_parser_t *ps, const int *ranges, int n) {
    int cat = s_node(ps, N_CAT);
    for (int i = 0; i < n && cat >= 0; i++) {
        int b = s_byte_node(ps, ranges[2 * i], ranges[2 * i + 1]);
        if (b < 0)
            return -1;
        s_adopt(ps, cat, b);
    }
    return cat;
}

// One well-formed UTF-8 character of two to four bytes (no overlongs, no surrogates), as
// RFC 3629's table: what JSON parsers accept.
static int s_utf8_multibyte(s_parser_t *ps) {
    static const int seqs[][9] = {
        {2, 0xC2, 0xDF, 0x80, 0xBF},
        {3, 0xE0, 0xE0, 0xA0, 0xBF, 0x80, 0xBF},
        {3, 0xE1, 0xEC, 0x80, 0xBF, 0x80, 0xBF},
        {3, 0xED, 0xED, 0x80, 0x9F, 0x80, 0xBF},
        {3, 0xEE, 0xEF, 0x80, 0xBF, 0x80, 0xBF},
        {4, 0xF0, 0xF0, 0x90, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {4, 0xF1, 0xF3, 0x80, 0xBF, 0x80, 0xBF, 0x80, 0xBF},
        {4, 0xF4, 0xF4, 0x80, 0x8F, 0x80, 0xBF, 0x80, 0xBF},
    };
    int alt = s_node(ps, N_ALT);
    for (size_t i = 0; i < sizeof seqs / sizeof *seqs && alt >= 0; i++) {
        int s = s_seq(ps, seqs[i] + 1, seqs[i][0]);
        if (s < 0)
            return -1;
        s_adopt(ps, alt, s);
    }
    return alt;
}

// A character class: ASCII members as a set, whether every non-ASCII character is in, and
// single non-ASCII characters (their UTF-8 bytes, up to 16 of them).
typedef struct {
    s_bset_t ascii;
    int nonascii;
    int n_chars;
    unsigned char chars[16][4];
    int char_len[16];
} s_class_t;

static int s_class_node(s_parser_t *ps, const s_class_t *c) {
    int alt = s_node(ps, N_ALT);
    if (alt < 0)
        return -1;
    s_bset_t a = c->ascii;
    a.w[2] = a.w[3] = 0;
    if (a.w[0] || a.w[1]) {
        int k = s_set_node(ps, &a);
        if (k < 0)
            return -1;
        s_adopt(ps, alt, k);
    }
    if (c->nonascii) {
        int k = s_utf8_multibyte(ps);
        if (k < 0)
            return -1;
        s_adopt(ps, alt, k);
    }
    for (int i = 0; i < c->n_chars; i++) {
        int r[8];
        for (int j = 0; j < c->char_len[i]; j++)
            r[2 * j] = r[2 * j + 1] = c->chars[i][j];
        int k = s_seq(ps, r, c->char_len[i]);
        if (k < 0)
            return -1;
        s_adopt(ps, alt, k);
    }
    if (ps->nodes[alt].first < 0)
        return s_fail(ps, "a class that matches nothing");
    return alt;
}

// \d \w \s and their negations into c; 0, or -1 when e is not one of them.
static int s_class_escape(s_class_t *c, int e) {
    s_class_t k;
    memset(&k, 0, sizeof k);
    switch (e | 0x20) {
    case 'd': s_bset_add(&k.ascii, '0', '9'); break;
    case 'w':
        s_bset_add(&k.ascii, '0', '9');
        s_bset_add(&k.ascii, 'a', 'z');
        s_bset_add(&k.ascii, 'A', 'Z');
        s_bset_add(&k.ascii, '_', '_');
        break;
    case 's':
        s_bset_add(&k.ascii, ' ', ' ');
        s_bset_add(&k.ascii, '\t', '\r');
        break;
    default: return -1;
    }
    if (e >= 'A' && e <= 'Z') {  // \D \W \S: every other character
        for (int i = 0; i < 2; i++)
            k.ascii.w[i] = ~k.ascii.w[i];
        k.nonascii = 1;
    }
    for (int i = 0; i < 2; i++)
        c->ascii.w[i] |= k.ascii.w[i];
    c->nonascii |= k.nonascii;
    return 0;
}

static int s_hex(int c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

// One character of the pattern (escapes resolved) as a code point, its UTF-8 in buf/len; *cls
// set (and nothing else) for a class escape \d \w \s \D \W \S, which goes into cls_out.
static int s_char(s_parser_t *ps, uint32_t *cp, unsigned char *buf, int *len, int *cls, s_class_t *cls_out) {
    *cls = 0;
    if (ps->p >= ps->end)
        return s_fail(ps, "unexpected end");
    int c = *ps->p;
    if (c != '\\') {
        size_t bad;
        int k = ls_utf8_seq(ps->p, (size_t)(ps->end - ps->p), &bad);
        if (k <= 0)
            return s_fail(ps, "invalid UTF-8");
        *cp = ls_utf8_cp(ps->p, k);
        memcpy(buf, ps->p, (size_t)k);
        *len = k;
        ps->p += k;
        return 0;
    }
    if (++ps->p >= ps->end)
        return s_fail(ps, "a trailing backslash");
    int e = *ps->p++;
    uint32_t v = 0;
    switch (e) {
    case 'n': v = '\n'; break;
    case 'r': v = '\r'; break;
    case 't': v = '\t'; break;
    case 'f': v = '\f'; break;
    case 'v': v = '\v'; break;
    case 'x':
    case 'u': {
        int nd = e == 'x' ? 2 : 4;
        for (int i = 0; i < nd; i++) {
            int h = ps->p < ps->end ? s_hex(*ps->p) : -1;
            if (h < 0)
                return s_fail(ps, e == 'x' ? "\\x needs two hex digits" : "\\u needs four hex digits");
            v = v * 16 + (uint32_t)h;
            ps->p++;
        }
        if (v >= 0xD800 && v < 0xE000)
            return s_fail(ps, "a surrogate code point");
        break;
    }
    default:
        if (s_class_escape(cls_out, e) == 0) {
            *cls = 1;
            return 0;
        }
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return s_fail(ps, "an unsupported escape (backreferences, anchors and Unicode classes are not supported)");
        v = (uint32_t)e;  // escaped punctuation stands for itself
    }
    *cp = v;
    *len = ls_utf8_put((char *)buf, v);
    return 0;
}

static void s_class_add_char(s_parser_t *ps, s_class_t *c, uint32_t cp, const unsigned char *buf, int len) {
    if (cp < 0x80) {
        s_bset_add(&c->ascii, (int)cp, (int)cp);
        return;
    }
    if (c->n_chars == 16) {
        s_fail(ps, "more than 16 non-ASCII characters in one class");
        return;
    }
    memcpy(c->chars[c->n_chars], buf, (size_t)len);
    c->char_len[c->n_chars++] = len;
}

static int s_parse_class(s_parser_t *ps) {
    s_class_t c;
    memset(&c, 0, sizeof c);
    int neg = 0;
    if (ps->p < ps->end && *ps->p == '^') {
        neg = 1;
        ps->p++;
    }
    int first = 1;
    while (ps->p < ps->end && (*ps->p != ']' || first)) {
        first = 0;
        uint32_t lo, hi;
        unsigned char buf[4], buf2[4];
        int len, len2, cls;
        if (s_char(ps, &lo, buf, &len, &cls, &c) < 0)
            return -1;
        if (cls)
            continue;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if (s_char(ps, &hi, buf2, &len2, &cls, &c) < 0)
                return -1;
            if (cls)
                return s_fail(ps, "a class escape as the end of a range");
            if (hi < lo)
                return s_fail(ps, "a range out of order");
            if (hi >= 0x80)
                return s_fail(ps, "a range reaching past ASCII (name the non-ASCII characters one by one)");
            s_bset_add(&c.ascii, (int)lo, (int)hi);
            continue;
        }
        s_class_add_char(ps, &c, lo, buf, len);
        if (ps->failed)
            return -1;
    }
    if (ps->p >= ps->end)
        return s_fail(ps, "an unterminated class");
    ps->p++;
    if (neg) {
        if (c.n_chars)
            return s_fail(ps, "a negated class naming non-ASCII characters");
        c.ascii.w[0] = ~c.ascii.w[0];
        c.ascii.w[1] = ~c.ascii.w[1];
        c.nonascii = !c.nonascii;
    }
    return s_class_node(ps, &c);
}

static int s_parse_alt(s_parser_t *ps);

static int s_parse_atom(s_parser_t *ps) {
    int c = *ps->p;
    if (c == '(') {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?') {
            if (ps->p + 1 < ps->end && ps->p[1] == ':')
                ps->p += 2;
            else
                return s_fail(ps, "an unsupported group (lookaround, named groups and flags are not supported)");
        }
        if (++ps->depth > S_MAX_NEST)
            return s_fail(ps, "groups nested too deep");
        int k = s_parse_alt(ps);
        ps->depth--;
        if (k < 0)
            return -1;
        if (ps->p >= ps->end || *ps->p != ')')
            return s_fail(ps, "an unclosed group");
        ps->p++;
        return k;
    }
    if (c == '[') {
        ps->p++;
        return s_parse_class(ps);
    }
    if (c == '.') {
        ps->p++;
        s_class_t cl;
        memset(&cl, 0, sizeof cl);
        s_bset_add(&cl.ascii, 0, 127);
        cl.ascii.w[0] &= ~(1ull << '\n');
        cl.nonascii = 1;
        return s_class_node(ps, &cl);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return s_fail(ps, "a quantifier with nothing to repeat");
    if (c == '^' || c == '$')
        return s_fail(ps, "an anchor inside the pattern (only ^ at the start and $ at the end)");
    if (c == ')')
        return s_fail(ps, "an unopened ')'");
    s_class_t cl;
    memset(&cl, 0, sizeof cl);
    uint32_t cp;
    unsigned char buf[4];
    int len, cls;
    if (s_char(ps, &cp, buf, &len, &cls, &cl) < 0)
        return -1;
    if (cls)
        return s_class_node(ps, &cl);
    int r[8];
    for (int j = 0; j < len; j++)
        r[2 * j] = r[2 * j + 1] = buf[j];
    return s_seq(ps, r, len);
}

// A decimal count of a {n,m} quantifier; -1 when absent.
static int s_count(s_parser_t *ps) {
    int v = -1;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (*ps->p++ - '0');
        if (v > S_MAX_REPEAT)
            return S_MAX_REPEAT + 1;
    }
    return v;
}

static int s_parse_quant(s_parser_t *ps, int atom) {
    while (ps->p < ps->end) {
        int c = *ps->p, min, max;
        if (c == '*')
            min = 0, max = -1;
        else if (c == '+')
            min = 1, max = -1;
        else if (c == '?')
            min = 0, max = 1;
        else if (c == '{') {
            const unsigned char *save = ps->p++;
            min = s_count(ps);
            max = min;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                max = s_count(ps);
            }
            if (min < 0 || ps->p >= ps->end || *ps->p != '}') {
                ps->p = save;
                return s_fail(ps, "a malformed {n,m} quantifier");
            }
            if (min > S_MAX_REPEAT || max > S_MAX_REPEAT)
                return s_fail(ps, "a repetition count above 1000");
            if (max >= 0 && max < min)
                return s_fail(ps, "a {n,m} quantifier with m < n");
        } else
            break;
        ps->p++;
        if (ps->p < ps->end && *ps->p == '?')
            ps->p++;  // lazy: the same language
        else if (ps->p < ps->end && *ps->p == '+')
            return s_fail(ps, "a possessive quantifier");
        int rep = s_node(ps, N_REP);
        if (rep < 0)
            return -1;
        ps->nodes[rep].min = min;
        ps->nodes[rep].max = max;
        ps->nodes[rep].first = atom;
        atom = rep;
    }
    return atom;
}

static int s_parse_cat(s_parser_t *ps) {
    int cat = s_node(ps, N_CAT);
    while (cat >= 0 && ps->p < ps->end && *ps->p != '|' && *ps->p != ')') {
        if (*ps->p == '$' && ps->p + 1 == ps->end && ps->depth == 0) {
            ps->p++;  // the end anchor: a whole match ends there anyway
            break;
        }
        int a = s_parse_atom(ps);
        if (a < 0 || (a = s_parse_quant(ps, a)) < 0)
            return -1;
        s_adopt(ps, cat, a);
    }
    return cat;
}

static int s_parse_alt(s_parser_t *ps) {
    int alt = s_node(ps, N_ALT);
    for (;;) {
        int k = alt < 0 ? -1 : s_parse_cat(ps);
        if (k < 0)
            return -1;
        s_adopt(ps, alt, k);
        if (ps->p < ps->end && *ps->p == '|')
            ps->p++;
        else
            return alt;
    }
}

// ---- NFA ----------------------------------------------------------------------------------

typedef struct {
    int set, to;   // a byte-set edge (set -1: none)
    int eps[2];    // epsilon edges (-1: none)
} s_nstate_t;

typedef struct {
    s_nstate_t *st;
    int n, cap;
    long work;
    s_parser_t *ps;
} s_nfa_t;

static int s_nnew(s_nfa_t *f) {
    if (f->n >= LS_GRAMMAR_MAX_NFA)
        return s_fail(f->ps, "the pattern expands past 200000 NFA states (counted repetitions are expanded)");
    if (s_grow((void **)&f->st, f->n, &f->cap, sizeof *f->st) < 0)
        return s_fail(f->ps, "out of memory");
    f->st[f->n] = (s_nstate_t){.set = -1, .to = -1, .eps = {-1, -1}};
    return f->n++;
}

static void s_eps(s_nfa_t *f, int from, int to) {
    s_nstate_t *s = &f->st[from];
    s->eps[s->eps[0] < 0 ? 0 : 1] = to;
}

// Emits node k from state s (which has no edges yet); returns the end state (no edges yet).
static int s_emit(s_nfa_t *f, int k, int s) {
    if (++f->work > 4L * LS_GRAMMAR_MAX_NFA)
        return s_fail(f->ps, "the pattern is too complex (repetitions of empty groups)");
    const s_node_t *n = &f->ps->nodes[k];
    switch (n->type) {
    case N_SET: {
        int e = s_nnew(f);
        if (e < 0)
            return -1;
        f->st[s].set = n->set;
        f->st[s].to = e;
        return e;
    }
    case N_CAT:
        for (int c = n->first; c >= 0 && s >= 0; c = f->ps->nodes[c].next)
            s = s_emit(f, c, s);
        return s;
    case N_ALT: {
        if (n->first >= 0 && f->ps->nodes[n->first].next < 0)
            return s_emit(f, n->first, s);
        int e = s_nnew(f), cur = s;
        for (int c = n->first; c >= 0 && e >= 0; c = f->ps->nodes[c].next) {
            int start = cur;
            if (f->ps->nodes[c].next >= 0) {
                int a = s_nnew(f), b = s_nnew(f);
                if (a < 0 || b < 0)
                    return -1;
                s_eps(f, cur, a);
                s_eps(f, cur, b);
                start = a;
                cur = b;
            }
            int end = s_emit(f, c, start);
            if (end < 0)
                return -1;
            s_eps(f, end, e);
        }
        return e;
    }
    case N_REP: {
        int child = n->first, min = n->min, max = n->max;
        for (int i = 0; i < min && s >= 0; i++)
            s = s_emit(f, child, s);
        if (s < 0)
            return -1;
        int e = s_nnew(f);
        if (e < 0)
            return -1;
        if (max < 0) {
            int a = s_nnew(f);
            if (a < 0)
                return -1;
            s_eps(f, s, a);
            s_eps(f, s, e);
            int end = s_emit(f, child, a);
            if (end < 0)
                return -1;
            s_eps(f, end, a);
            s_eps(f, end, e);
            return e;
        }
        for (int i = min; i < max; i++) {
            int a = s_nnew(f);
            if (a < 0)
                return -1;
            s_eps(f, s, a);
            s_eps(f, s, e);
            if ((s = s_emit(f, child, a)) < 0)
                return -1;
        }
        s_eps(f, s, e);
        return e;
    }
    }
    return -1;
}

// ---- DFA ----------------------------------------------------------------------------------

enum { S_MAX_WORK = 50 * 1000 * 1000 };

typedef struct {
    int *v;
    int n;
} s_ints_t;

// Open-addressing map from NFA-state sets (stored in a pool) to DFA states.
typedef struct {
    int *pool;
    size_t n_pool, cap_pool;
    size_t *off;  // per DFA state: its set in pool, and its length
    int *len;
    uint64_t *hash;
    int *table;  // DFA state + 1; 0 empty
    size_t table_cap;
} s_dmap_t;

static uint64_t s_hash_ints(const int *v, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++)
        h = (h ^ (uint64_t)(uint32_t)v[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static int s_int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

// The epsilon closure of the n states in v (sorted into out, which holds at most n_nfa).
static int s_closure(const s_nfa_t *f, const int *v, int n, int *out, int *stack, uint32_t *mark, uint32_t gen,
                     long *work) {
    int k = 0, sp = 0;
    for (int i = 0; i < n; i++)
        if (mark[v[i]] != gen) {
            mark[v[i]] = gen;
            stack[sp++] = v[i];
        }
    while (sp > 0) {
        int s = stack[--sp];
        out[k++] = s;
        for (int j = 0; j < 2; j++) {
            int t = f->st[s].eps[j];
            if (t >= 0 && mark[t] != gen) {
                mark[t] = gen;
                stack[sp++] = t;
            }
        }
    }
    *work += k;
    qsort(out, (size_t)k, sizeof *out, s_int_cmp);
    return k;
}

static void s_grammar_free(ls_grammar_t *g) {
    free(g->trans);
    free(g->accept);
    free(g->final);
    free(g->masks);
    free(g);
}

typedef struct {
    s_dmap_t m;
    ls_grammar_t *g;
    int n_states, cap_states, ncls;
    s_parser_t *ps;
} s_builder_t;

// The DFA state of the closure out[0..k): found, or added (its row left to fill). -1 + the
// parser's error when over the state bound or out of memory.
static int s_intern(s_builder_t *b, const int *out, int k) {
    s_dmap_t *m = &b->m;
    uint64_t h = s_hash_ints(out, k);
    size_t at = h & (m->table_cap - 1);
    for (;; at = (at + 1) & (m->table_cap - 1)) {
        int e = m->table[at];
        if (!e)
            break;
        if (m->hash[e - 1] == h && m->len[e - 1] == k && !memcmp(m->pool + m->off[e - 1], out, (size_t)k * sizeof *out))
            return e - 1;
    }
    if (b->n_states >= LS_GRAMMAR_MAX_STATES)
        return s_fail(b->ps, "the pattern needs more than 50000 DFA states");
    if (b->n_states == b->cap_states) {
        int nc = b->cap_states ? b->cap_states * 2 : 64;
        size_t *o = realloc(m->off, (size_t)nc * sizeof *o);
        if (o)
            m->off = o;
        int *l = realloc(m->len, (size_t)nc * sizeof *l);
        if (l)
            m->len = l;
        uint64_t *hh = realloc(m->hash, (size_t)nc * sizeof *hh);
        if (hh)
            m->hash = hh;
        int *t = realloc(b->g->trans, (size_t)nc * b->ncls * sizeof *t);
        if (t)
            b->g->trans = t;
        if (!o || !l || !hh || !t)
            return s_fail(b->ps, "out of memory");
        b->cap_states = nc;
    }
    if (m->n_pool + (size_t)k > m->cap_pool) {
        size_t nc = m->cap_pool ? m->cap_pool * 2 : 4096;
        while (nc < m->n_pool + (size_t)k)
            nc *= 2;
        int *p = realloc(m->pool, nc * sizeof *p);
        if (!p)
            return s_fail(b->ps, "out of memory");
        m->pool = p;
        m->cap_pool = nc;
    }
    int id = b->n_states++;
    memcpy(m->pool + m->n_pool, out, (size_t)k * sizeof *out);
    m->off[id] = m->n_pool;
    m->n_pool += (size_t)k;
    m->len[id] = k;
    m->hash[id] = h;
    m->table[at] = id + 1;
    if ((size_t)b->n_states * 2 > m->table_cap) {  // grow and rehash
        size_t nc = m->table_cap * 2;
        int *t = calloc(nc, sizeof *t);
        if (!t)
            return s_fail(b->ps, "out of memory");
        for (int i = 0; i < b->n_states; i++) {
            size_t a = m->hash[i] & (nc - 1);
            while (t[a])
                a = (a + 1) & (nc - 1);
            t[a] = i + 1;
        }
        free(m->table);
        m->table = t;
        m->table_cap = nc;
    }
    return id;
}

// Builds the DFA of f (accepting NFA state acc) into g. 0, or -1 + the parser's error.
static int s_build_dfa(ls_grammar_t *g, const s_nfa_t *f, int acc, s_parser_t *ps) {
    // byte classes: refine the partition of 0..255 by every set the NFA uses
    int cls[256] = {0}, ncls = 1;
    for (int si = 0; si < ps->n_sets; si++) {
        int map[512];
        for (int i = 0; i < 2 * ncls; i++)
            map[i] = -1;
        int nn = 0;
        for (int b = 0; b < 256; b++) {
            int key = cls[b] * 2 + s_bset_has(&ps->sets[si], b);
            if (map[key] < 0)
                map[key] = nn++;
            cls[b] = map[key];
        }
        ncls = nn;
    }
    int rep[256];
    for (int b = 255; b >= 0; b--)
        rep[cls[b]] = b;
    memcpy(g->cls, cls, sizeof cls);
    g->n_cls = ncls;

    int nn = f->n, rc = -1;
    int *buf = malloc((size_t)nn * sizeof *buf), *out = malloc((size_t)nn * sizeof *out),
        *stack = malloc((size_t)nn * sizeof *stack);
    uint32_t *mark = calloc((size_t)nn, sizeof *mark), gen = 0;
    s_builder_t b = {.g = g, .ncls = ncls, .ps = ps};
    b.m.table_cap = 1024;
    b.m.table = calloc(b.m.table_cap, sizeof *b.m.table);
    long work = 0;
    if (!buf || !out || !stack || !mark || !b.m.table) {
        s_fail(ps, "out of memory");
        goto done;
    }
    int start = 0;
    if (s_intern(&b, out, s_closure(f, &start, 1, out, stack, mark, ++gen, &work)) < 0)
        goto done;
    // the states' numbering is the work queue: state cur's row is filled at step cur
    for (int cur = 0; cur < b.n_states; cur++) {
        for (int c = 0; c < ncls; c++) {
            int n = 0, id = -1;
            const int *set = b.m.pool + b.m.off[cur];
            for (int i = 0; i < b.m.len[cur]; i++) {
                const s_nstate_t *s = &f->st[set[i]];
                if (s->set >= 0 && s_bset_has(&ps->sets[s->set], rep[c]))
                    buf[n++] = s->to;
            }
            work += b.m.len[cur];
            if (n && (id = s_intern(&b, out, s_closure(f, buf, n, out, stack, mark, ++gen, &work))) < 0)
                goto done;
            g->trans[(size_t)cur * ncls + c] = id;
        }
        if (work > S_MAX_WORK) {
            s_fail(ps, "the pattern is too complex to compile");
            goto done;
        }
    }
    g->n_states = b.n_states;
    g->accept = calloc((size_t)b.n_states + 1, 1);
    g->final = calloc((size_t)b.n_states + 1, 1);
    if (!g->accept || !g->final) {
        s_fail(ps, "out of memory");
        goto done;
    }
    for (int i = 0; i < b.n_states; i++)
        g->accept[i] = bsearch(&acc, b.m.pool + b.m.off[i], (size_t)b.m.len[i], sizeof(int), s_int_cmp) != NULL;
    rc = 0;
done:
    free(buf);
    free(out);
    free(stack);
    free(mark);
    free(b.m.pool);
    free(b.m.off);
    free(b.m.len);
    free(b.m.hash);
    free(b.m.table);
    return rc;
}

// Drops the states that reach no accepting state (their transitions become -1) and renumbers
// the rest; marks the final ones. -1 when even the start is dead: the pattern matches nothing.
static int s_prune(ls_grammar_t *g, s_parser_t *ps) {
    int n = g->n_states, nc = g->n_cls;
    char *live = calloc((size_t)n, 1);
    int *map = malloc((size_t)n * sizeof *map);
    if (!live || !map) {
        free(live);
        free(map);
        return s_fail(ps, "out of memory");
    }
    for (int i = 0; i < n; i++)
        live[i] = g->accept[i];
    for (int changed = 1; changed;) {  // fixed point; state counts are bounded
        changed = 0;
        for (int i = n - 1; i >= 0; i--)
            for (int c = 0; c < nc && !live[i]; c++) {
                int t = g->trans[(size_t)i * nc + c];
                if (t >= 0 && live[t])
                    live[i] = changed = 1;
            }
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        map[i] = live[i] ? k++ : -1;
    int rc = 0;
    if (!live[0])
        rc = s_fail(ps, "the pattern matches nothing");
    for (int i = 0; i < n && rc == 0; i++) {
        if (!live[i])
            continue;
        int j = map[i], any = 0;
        for (int c = 0; c < nc; c++) {
            int t = g->trans[(size_t)i * nc + c];
            t = t >= 0 ? map[t] : -1;
            g->trans[(size_t)j * nc + c] = t;
            any |= t >= 0;
        }
        g->accept[j] = g->accept[i];
        g->final[j] = g->accept[i] && !any;
    }
    g->n_states = k;
    free(live);
    free(map);
    return rc;
}

ls_grammar_t *ls_grammar_compile(const char *regex, size_t len, char *err, size_t errlen) {
    if (len > LS_GRAMMAR_MAX_SOURCE) {
        snprintf(err, errlen, "regex: longer than %d bytes", LS_GRAMMAR_MAX_SOURCE);
        return NULL;
    }
    return ls_grammar_compile_unbounded(regex, len, err, errlen);
}

ls_grammar_t *ls_grammar_compile_unbounded(const char *regex, size_t len, char *err, size_t errlen) {
    if (!regex) // no source (a message's unset text field): the empty one, as NULL + 0 is undefined
        regex = "";
    s_parser_t ps = {.p = (const unsigned char *)regex, .end = (const unsigned char *)regex + len,
                     .start = (const unsigned char *)regex, .err = err, .errlen = errlen};
    if (ps.p < ps.end && *ps.p == '^')
        ps.p++;
    int root = s_parse_alt(&ps);
    if (root >= 0 && ps.p < ps.end)
        root = s_fail(&ps, "an unopened ')'");
    ls_grammar_t *g = calloc(1, sizeof *g);
    s_nfa_t f = {.ps = &ps};
    int acc = -1;
    if (!g && root >= 0)
        root = s_fail(&ps, "out of memory");
    if (root >= 0) {
        int s = s_nnew(&f);
        acc = s < 0 ? -1 : s_emit(&f, root, s);
    }
    if (acc < 0 || s_build_dfa(g, &f, acc, &ps) < 0 || s_prune(g, &ps) < 0) {
        if (g)
            s_grammar_free(g);
        g = NULL;
    }
    free(f.st);
    free(ps.nodes);
    free(ps.sets);
    return g;
}

void ls_grammar_destroy(ls_grammar_t **self_p) {
    if (!*self_p)
        return;
    s_grammar_free(*self_p);
    *self_p = NULL;
}

int ls_grammar_start(const ls_grammar_t *self) {
    (void)self;
    return 0;
}

int ls_grammar_n_states(const ls_grammar_t *self) {
    return self->n_states;
}

int ls_grammar_step(const ls_grammar_t *self, int state, uint8_t b) {
    return state < 0 ? -1 : self->trans[(size_t)state * self->n_cls + self->cls[b]];
}

int ls_grammar_walk(const ls_grammar_t *self, int state, const void *bytes, size_t n) {
    const uint8_t *p = bytes;
    for (size_t i = 0; i < n && state >= 0; i++)
        state = self->trans[(size_t)state * self->n_cls + self->cls[p[i]]];
    return state;
}

bool ls_grammar_accepting(const ls_grammar_t *self, int state) {
    return state >= 0 && self->accept[state];
}

bool ls_grammar_final(const ls_grammar_t *self, int state) {
    return state >= 0 && self->final[state];
}

bool ls_grammar_matches(const ls_grammar_t *self, const void *bytes, size_t n) {
    return ls_grammar_accepting(self, ls_grammar_walk(self, 0, bytes, n));
}

char *ls_grammar_regex_escape(const char *s, size_t n) {
    char *out = malloc(2 * n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\.^$|?*+()[]{}-/", s[i]) && s[i])
            *o++ = '\\';
        *o++ = s[i];
    }
    *o = 0;
    return out;
}
