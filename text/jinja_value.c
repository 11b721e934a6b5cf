// jinja_value — the arena, values, and how values become text: printed ({{ v }}), concatenated
// (JavaScript's String(v)) and written as JSON (tojson), each as @huggingface/jinja does it.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"
#include "ls_err.h"

// ---- arena ----------------------------------------------------------------------------------

#define S_CHUNK (64u << 10)

struct jchunk {
    jchunk_t *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *jx_alloc(jx_t *x, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    jchunk_t *c = x->chunks;
    if (!c || c->size - c->used < n) {
        size_t size = n > S_CHUNK ? n : S_CHUNK;
        if (n > x->limit || x->used > x->limit - n)
            jx_fail(x, UINT32_MAX, "the template needs more than %zu MiB of memory", x->limit >> 20);
        if (!(c = malloc(sizeof *c + size)))
            jx_fail(x, UINT32_MAX, "out of memory");
        c->size = size;
        c->used = 0;
        c->next = x->chunks;
        x->chunks = c;
        x->used += size;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void *jx_grow(jx_t *x, void *old, size_t old_n, size_t new_n) {
    void *p = jx_alloc(x, new_n);
    if (old_n)
        memcpy(p, old, old_n < new_n ? old_n : new_n);
    return p;
}

char *jx_strdup(jx_t *x, const char *s, size_t n) {
    char *p = jx_alloc(x, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jx_free_all(jx_t *x) {
    while (x->chunks) {
        jchunk_t *c = x->chunks;
        x->chunks = c->next;
        free(c);
    }
    x->used = 0;
}

void jx_fail(jx_t *x, uint32_t pos, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos != UINT32_MAX && x->map && x->src) {
        size_t off = x->map[pos <= x->map_n ? pos : x->map_n], line = 1, col = 1;
        for (size_t i = 0; i < off; i++) {
            if (x->src[i] == '\n') {
                line++;
                col = 1;
            } else if (((unsigned char)x->src[i] & 0xc0) != 0x80) {
                col++;
            }
        }
        ls_err_set(x->err, x->errlen, "%s (line %zu, column %zu)", msg, line, col);
    } else {
        ls_err_set(x->err, x->errlen, "%s", msg);
    }
    longjmp(*x->fail, 1);
}

// Buffers of a render live in the arena too, so a failure anywhere frees them with the rest.
void jx_put(jx_t *x, ls_buf_t *out, const void *p, size_t n) {
    if (n > LS_JINJA_MAX_OUTPUT || out->n + n > LS_JINJA_MAX_OUTPUT)
        jx_fail(x, UINT32_MAX, "the rendered text is longer than %u MiB", LS_JINJA_MAX_OUTPUT >> 20);
    if (out->n + n + 1 > out->cap) {
        size_t cap = out->cap ? out->cap : 64;
        while (cap < out->n + n + 1)
            cap *= 2;
        out->s = jx_grow(x, out->s, out->n, cap);
        out->cap = cap;
    }
    if (n)
        memcpy(out->s + out->n, p, n);
    out->n += n;
    out->s[out->n] = 0;
}

static void s_puts(jx_t *x, ls_buf_t *out, const char *s) { jx_put(x, out, s, strlen(s)); }

jv_t jx_buf_take(jx_t *x, ls_buf_t *b) {
    jv_t v = jv_str(b->s ? b->s : jx_strdup(x, "", 0), b->n);
    memset(b, 0, sizeof *b);
    return v;
}

// ---- values ---------------------------------------------------------------------------------

const char *jv_type_name(jv_type_t t) {
    static const char *names[] = {"UndefinedValue", "NullValue",   "BooleanValue", "IntegerValue", "FloatValue",
                                  "StringValue",    "ArrayValue",  "ObjectValue",  "NamespaceValue", "FunctionValue"};
    return t <= JV_FUNC ? names[t] : "?";
}

jv_t jv_cstr(jx_t *x, const char *s) { return jv_str(jx_strdup(x, s, strlen(s)), strlen(s)); }

jlist_t *jv_list_new(jx_t *x, size_t cap) {
    jlist_t *l = jx_alloc(x, sizeof *l);
    l->n = 0;
    l->cap = cap;
    l->v = cap ? jx_alloc(x, cap * sizeof *l->v) : NULL;
    return l;
}

void jv_list_push(jx_t *x, jlist_t *l, jv_t v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        l->v = jx_grow(x, l->v, l->n * sizeof *l->v, cap * sizeof *l->v);
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

jdict_t *jv_dict_new(jx_t *x) {
    jdict_t *d = jx_alloc(x, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

jv_t *jv_dict_get(const jdict_t *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].kn == kn && memcmp(d->e[i].k, k, kn) == 0)
            return &d->e[i].v;
    return NULL;
}

void jv_dict_set(jx_t *x, jdict_t *d, const char *k, size_t kn, jv_t v) {
    jv_t *have = jv_dict_get(d, k, kn);
    if (have) {
        *have = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        d->e = jx_grow(x, d->e, d->n * sizeof *d->e, cap * sizeof *d->e);
        d->cap = cap;
    }
    d->e[d->n++] = (jentry_t){k, kn, v};
}

bool jv_truthy(jv_t v) {
    switch (v.t) {
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0 && !isnan(v.u.f);
    case JV_STR:
        return v.u.s.n > 0;
    case JV_LIST:
        return v.u.l->n > 0;
    case JV_DICT:
        return v.u.d->n > 0;
    case JV_NS:
    case JV_FUNC:
        return true;
    default:
        return false;
    }
}

static bool s_is_num(jv_t v) { return v.t == JV_INT || v.t == JV_FLOAT; }
static double s_num(jv_t v) { return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : v.u.b ? 1 : 0; }

// JavaScript's ToNumber of a string: trimmed, empty is 0, else a decimal (or 0x/0o/0b) literal.
static double s_str_to_num(const char *p, size_t n) {
    jstr_trim(&p, &n, true, true);
    if (n == 0)
        return 0;
    char buf[128];
    if (n >= sizeof buf)
        return NAN;
    memcpy(buf, p, n);
    buf[n] = 0;
    if (strcmp(buf, "Infinity") == 0 || strcmp(buf, "+Infinity") == 0)
        return INFINITY;
    if (strcmp(buf, "-Infinity") == 0)
        return -INFINITY;
    char *end;
    double d;
    if (n > 2 && buf[0] == '0' && strchr("xXoObB", buf[1])) {
        int base = buf[1] == 'x' || buf[1] == 'X' ? 16 : buf[1] == 'o' || buf[1] == 'O' ? 8 : 2;
        d = (double)strtoull(buf + 2, &end, base);
    } else {
        // strtod also reads hex floats, "inf" and "nan", which JavaScript does not
        for (size_t i = 0; i < n; i++)
            if (!strchr("0123456789.eE+-", buf[i]))
                return NAN;
        d = strtod(buf, &end);
    }
    return *end ? NAN : d;
}

bool jv_strict_eq(jv_t a, jv_t b) {
    if (s_is_num(a) && s_is_num(b))
        return s_num(a) == s_num(b);
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_BOOL:
        return a.u.b == b.u.b;
    case JV_STR:
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case JV_LIST:
        return a.u.l == b.u.l;
    case JV_DICT:
    case JV_NS:
        return a.u.d == b.u.d;
    default:
        return a.u.fn == b.u.fn;
    }
}

bool jv_loose_eq(jv_t a, jv_t b) {
    bool an = a.t == JV_UNDEF || a.t == JV_NONE, bn = b.t == JV_UNDEF || b.t == JV_NONE;
    if (an || bn)
        return an && bn;
    bool ap = s_is_num(a) || a.t == JV_BOOL || a.t == JV_STR, bp = s_is_num(b) || b.t == JV_BOOL || b.t == JV_STR;
    if (ap && bp) {
        if (a.t == JV_STR && b.t == JV_STR)
            return jv_strict_eq(a, b);
        double x = a.t == JV_STR ? s_str_to_num(a.u.s.p, a.u.s.n) : s_num(a);
        double y = b.t == JV_STR ? s_str_to_num(b.u.s.p, b.u.s.n) : s_num(b);
        return x == y;
    }
    return jv_strict_eq(a, b);
}

jv_t jv_from_json(jx_t *x, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv_t v = {.t = JV_DICT, .u.d = jv_dict_new(x)};
        const char *k;
        size_t kn;
        json_t *e;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)j, tmp, k, kn, e) {
            jv_dict_set(x, v.u.d, jx_strdup(x, k, kn), kn, jv_from_json(x, e));
        }
        return v;
    }
    case JSON_ARRAY: {
        jv_t v = {.t = JV_LIST, .u.l = jv_list_new(x, json_array_size(j))};
        for (size_t i = 0; i < json_array_size(j); i++)
            jv_list_push(x, v.u.l, jv_from_json(x, json_array_get(j, i)));
        return v;
    }
    case JSON_STRING:
        return jv_str(jx_strdup(x, json_string_value(j), json_string_length(j)), json_string_length(j));
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL: {
        // JavaScript has one number type: 2.0 is an integer there
        double d = json_real_value(j);
        return d == floor(d) && fabs(d) < 9e15 ? jv_int((int64_t)d) : jv_float(d);
    }
    case JSON_TRUE:
        return jv_bool(true);
    case JSON_FALSE:
        return jv_bool(false);
    default:
        return jv_none();
    }
}

// ---- numbers as JavaScript writes them ---------------------------------------------------------

void jv_put_number(jx_t *x, ls_buf_t *out, double f) {
    if (isnan(f)) {
        s_puts(x, out, "NaN");
        return;
    }
    if (isinf(f)) {
        s_puts(x, out, f < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (f == 0) {
        s_puts(x, out, "0");
        return;
    }
    // The shortest digits that read back as f, then ECMAScript's Number::toString layout.
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    char digits[24];
    size_t k = 0;
    const char *p = buf;
    bool neg = *p == '-';
    p += neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0')
        k--;
    digits[k] = 0;
    int e = atoi(p + 1), n = e + 1;  // the value is 0.DIGITS × 10^n
    char o[64];
    size_t at = 0;
    if (neg)
        o[at++] = '-';
    if ((int)k <= n && n <= 21) {
        memcpy(o + at, digits, k);
        at += k;
        for (int i = 0; i < n - (int)k; i++)
            o[at++] = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o + at, digits, (size_t)n);
        at += (size_t)n;
        o[at++] = '.';
        memcpy(o + at, digits + n, k - (size_t)n);
        at += k - (size_t)n;
    } else if (-6 < n && n <= 0) {
        o[at++] = '0';
        o[at++] = '.';
        for (int i = 0; i < -n; i++)
            o[at++] = '0';
        memcpy(o + at, digits, k);
        at += k;
    } else {
        o[at++] = digits[0];
        if (k > 1) {
            o[at++] = '.';
            memcpy(o + at, digits + 1, k - 1);
            at += k - 1;
        }
        at += (size_t)snprintf(o + at, sizeof o - at, "e%c%d", n - 1 < 0 ? '-' : '+', abs(n - 1));
    }
    jx_put(x, out, o, at);
}

static void s_put_int(jx_t *x, ls_buf_t *out, int64_t i) {
    char b[32];
    jx_put(x, out, b, (size_t)snprintf(b, sizeof b, "%lld", (long long)i));
}

// ---- JSON ---------------------------------------------------------------------------------------

static void s_json_string(jx_t *x, ls_buf_t *out, const char *s, size_t n, bool ascii) {
    jx_put(x, out, "\"", 1);
    size_t i = 0;
    while (i < n) {
        size_t from = i;
        uint32_t cp = jstr_next(s, n, &i);
        char esc[16];
        const char *e = NULL;
        switch (cp) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7f && cp < 0x80000000u)) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", cp);
                }
                e = esc;
            }
        }
        if (e)
            s_puts(x, out, e);
        else
            jx_put(x, out, s + from, i - from);
    }
    jx_put(x, out, "\"", 1);
}

static void s_pad(jx_t *x, ls_buf_t *out, int indent, int depth) {
    jx_put(x, out, "\n", 1);
    for (int i = 0; i < indent * depth; i++)
        jx_put(x, out, " ", 1);
}

static int s_key_cmp(const void *a, const void *b) {
    const jentry_t *p = *(const jentry_t *const *)a, *q = *(const jentry_t *const *)b;
    size_t n = p->kn < q->kn ? p->kn : q->kn;
    int c = memcmp(p->k, q->k, n);
    return c ? c : (p->kn > q->kn) - (p->kn < q->kn);
}

void jv_to_json(jx_t *x, ls_buf_t *out, jv_t v, const jjson_opts_t *o, int depth) {
    if (depth > LS_JINJA_MAX_DEPTH)
        jx_fail(x, UINT32_MAX, "a value nests deeper than %d levels (does it contain itself?)", LS_JINJA_MAX_DEPTH);
    const char *item_sep = o->item_sep ? o->item_sep : o->indent ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    switch (v.t) {
    case JV_UNDEF:
        s_puts(x, out, o->undefined_as_null ? "null" : "undefined");
        return;
    case JV_NONE:
        s_puts(x, out, "null");
        return;
    case JV_BOOL:
    case JV_INT:
        jv_print_raw(x, out, v);
        return;
    case JV_FLOAT:
        if (isfinite(v.u.f))
            jv_put_number(x, out, v.u.f);
        else
            s_puts(x, out, "null");
        return;
    case JV_STR:
        s_json_string(x, out, v.u.s.p, v.u.s.n, o->ensure_ascii);
        return;
    case JV_LIST: {
        const jlist_t *l = v.u.l;
        jx_put(x, out, "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                s_puts(x, out, item_sep);
            if (o->indent)
                s_pad(x, out, o->indent, depth + 1);
            jv_to_json(x, out, l->v[i], o, depth + 1);
        }
        if (o->indent && l->n)
            s_pad(x, out, o->indent, depth);
        jx_put(x, out, "]", 1);
        return;
    }
    case JV_DICT:
    case JV_NS: {
        const jdict_t *d = v.u.d;
        const jentry_t **order = jx_alloc(x, (d->n + 1) * sizeof *order);
        for (size_t i = 0; i < d->n; i++)
            order[i] = &d->e[i];
        if (o->sort_keys)
            qsort(order, d->n, sizeof *order, s_key_cmp);
        jx_put(x, out, "{", 1);
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                s_puts(x, out, item_sep);
            if (o->indent)
                s_pad(x, out, o->indent, depth + 1);
            s_json_string(x, out, order[i]->k, order[i]->kn, o->ensure_ascii);
            s_puts(x, out, key_sep);
            jv_to_json(x, out, order[i]->v, o, depth + 1);
        }
        if (o->indent && d->n)
            s_pad(x, out, o->indent, depth);
        jx_put(x, out, "}", 1);
        return;
    }
    default:
        jx_fail(x, UINT32_MAX, "Cannot convert to JSON: %s", jv_type_name(v.t));
    }
}

// ---- printing -----------------------------------------------------------------------------------

void jv_print(jx_t *x, ls_buf_t *out, jv_t v) {
    switch (v.t) {
    case JV_UNDEF:
        s_puts(x, out, "undefined");
        return;
    case JV_NONE:
        s_puts(x, out, "null");
        return;
    case JV_FLOAT:
        // Python's float repr for whole numbers: 1.0, -0.0
        if (v.u.f == 0 && signbit(v.u.f))
            s_puts(x, out, "-0.0");
        else if (isfinite(v.u.f) && v.u.f == floor(v.u.f) && fabs(v.u.f) < 1e21) {
            char b[64];
            jx_put(x, out, b, (size_t)snprintf(b, sizeof b, "%.1f", v.u.f));
        } else
            jv_put_number(x, out, v.u.f);
        return;
    case JV_LIST:
    case JV_DICT:
    case JV_NS: {
        jjson_opts_t o = {0};
        jv_to_json(x, out, v, &o, 0);
        return;
    }
    case JV_FUNC:
        s_puts(x, out, "[function]");
        return;
    default:
        jv_print_raw(x, out, v);
    }
}

void jv_print_raw(jx_t *x, ls_buf_t *out, jv_t v) {
    switch (v.t) {
    case JV_BOOL:
        s_puts(x, out, v.u.b ? "true" : "false");
        return;
    case JV_INT:
        s_put_int(x, out, v.u.i);
        return;
    case JV_FLOAT:
        jv_put_number(x, out, v.u.f);
        return;
    case JV_STR:
        jx_put(x, out, v.u.s.p, v.u.s.n);
        return;
    case JV_LIST:
        // Array#toString: the items' own toString, joined by ","
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jx_put(x, out, ",", 1);
            jv_print(x, out, v.u.l->v[i]);
        }
        return;
    case JV_DICT:
    case JV_NS:
        s_puts(x, out, "[object Map]");
        return;
    default:
        jv_print(x, out, v);
    }
}

// ---- strings --------------------------------------------------------------------------------------

bool jstr_is_space(uint32_t cp) {
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000 || cp == 0xfeff;
}

uint32_t jstr_next(const char *s, size_t n, size_t *i) {
    size_t bad;
    int k = ls_utf8_seq((const unsigned char *)s + *i, n - *i, &bad);
    if (k <= 0) {
        // an invalid byte stands for itself; 0x80000000 keeps it apart from code points
        return 0x80000000u | (unsigned char)s[(*i)++];
    }
    uint32_t cp = ls_utf8_cp((const unsigned char *)s + *i, k);
    *i += (size_t)k;
    return cp;
}

size_t jstr_utf16_len(const char *s, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = jstr_next(s, n, &i);
        len += cp >= 0x10000 && cp < 0x80000000u ? 2 : 1;  // a surrogate pair in UTF-16
    }
    return len;
}

void jstr_trim(const char **s, size_t *n, bool left, bool right) {
    const char *p = *s;
    size_t len = *n, i = 0;
    if (left) {
        while (i < len) {
            size_t j = i;
            if (!jstr_is_space(jstr_next(p, len, &j)))
                break;
            i = j;
        }
        p += i;
        len -= i;
    }
    if (right) {
        size_t end = 0;  // end of the last non-space code point
        for (size_t j = 0; j < len;) {
            uint32_t cp = jstr_next(p, len, &j);
            if (!jstr_is_space(cp))
                end = j;
        }
        len = end;
    }
    *s = p;
    *n = len;
}
