// jinja_filter — the library a template calls: filters (`x | trim`), tests (`x is string`),
// methods (`s.strip()`, `d.items()`), and the global functions (range, namespace,
// raise_exception, strftime_now). Each follows @huggingface/jinja; a few that it lacks and
// Jinja2 has are here too (the `count`, `select`, `reject` filters, `map` with a filter name,
// tests that take an argument), since a template that renders there never reaches them.
#define _GNU_SOURCE  // memmem
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "jinja_internal.h"

#define S_MAX_RANGE 1000000  // items of one range(); the step limit would stop a longer loop anyway

typedef enum {
    B_RANGE, B_NAMESPACE, B_RAISE, B_STRFTIME,
    B_UPPER, B_LOWER, B_STRIP, B_LSTRIP, B_RSTRIP, B_TITLE, B_CAPITALIZE, B_STARTSWITH, B_ENDSWITH,
    B_SPLIT, B_REPLACE,
    B_GET, B_ITEMS, B_KEYS, B_VALUES, B_DICTSORT,
} sbuiltin_t;

static const char *s_names[] = {
    "range", "namespace", "raise_exception", "strftime_now",
    "upper", "lower", "strip", "lstrip", "rstrip", "title", "capitalize", "startswith", "endswith",
    "split", "replace",
    "get", "items", "keys", "values", "dictsort",
};

static bool s_is(const char *s, size_t n, const char *lit) { return n == strlen(lit) && memcmp(s, lit, n) == 0; }

static jv_t s_func(jrun_t *r, sbuiltin_t b, jv_t self) {
    jfunc_t *f = jx_alloc(r->x, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = JF_BUILTIN;
    f->builtin = (int)b;
    f->self = self;
    return (jv_t){.t = JV_FUNC, .u.fn = f};
}

static jv_t s_list(jrun_t *r, size_t cap) { return (jv_t){.t = JV_LIST, .u.l = jv_list_new(r->x, cap)}; }

// ---- string helpers --------------------------------------------------------------------------

typedef enum { S_CASE_UPPER, S_CASE_LOWER, S_CASE_TITLE, S_CASE_CAPITALIZE } scase_t;

static bool s_ascii_word(uint32_t c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

// toUpperCase / toLowerCase by code point; title: /\b\w/ upper-cased (the rest kept, as
// @huggingface/jinja's titleCase); capitalize: the first character upper-cased, the rest kept.
static jv_t s_case(jrun_t *r, jv_t s, scase_t how) {
    ls_buf_t b = {0};
    uint32_t prev = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t from = i;
        uint32_t cp = jstr_next(s.u.s.p, s.u.s.n, &i), to = cp;
        if (cp < 0x80000000u) {
            if (how == S_CASE_UPPER || (how == S_CASE_CAPITALIZE && from == 0) ||
                (how == S_CASE_TITLE && s_ascii_word(cp) && !s_ascii_word(prev)))
                to = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
            else if (how == S_CASE_LOWER)
                to = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        }
        prev = cp;
        if (to == cp) {
            jx_put(r->x, &b, s.u.s.p + from, i - from);
        } else {
            char u[4];
            jx_put(r->x, &b, u, (size_t)ls_utf8_put(u, to));
        }
    }
    return jx_buf_take(r->x, &b);
}

static jv_t s_trimmed(jv_t s, bool left, bool right) {
    jstr_trim(&s.u.s.p, &s.u.s.n, left, right);
    return s;
}

static bool s_starts(jv_t s, jv_t p) { return s.u.s.n >= p.u.s.n && memcmp(s.u.s.p, p.u.s.p, p.u.s.n) == 0; }
static bool s_ends(jv_t s, jv_t p) {
    return s.u.s.n >= p.u.s.n && memcmp(s.u.s.p + s.u.s.n - p.u.s.n, p.u.s.p, p.u.s.n) == 0;
}

static const char *s_find(const char *hay, size_t hn, const char *needle, size_t nn) {
    return nn <= hn ? memmem(hay, hn, needle, nn) : NULL;
}

static jv_t s_substr(jrun_t *r, const char *p, size_t n) { return jv_str(jx_strdup(r->x, p, n), n); }

static jv_t s_split(jrun_t *r, jv_t s, jv_t *sep, jv_t *maxsplit, uint32_t pos) {
    if (sep && sep->t != JV_STR && sep->t != JV_NONE)
        jx_fail(r->x, pos, "sep argument must be a string or null");
    if (maxsplit && maxsplit->t != JV_INT)
        jx_fail(r->x, pos, "maxsplit argument must be a number");
    int64_t max = maxsplit ? maxsplit->u.i : -1;
    jv_t out = s_list(r, 4);
    if (!sep || sep->t == JV_NONE) {
        // runs of non-space; past maxsplit the rest of the text, as it is
        const char *p = s.u.s.p;
        size_t n = s.u.s.n, i = 0;
        jstr_trim(&p, &n, true, false);
        while (i < n) {
            size_t start = i, end = i;
            while (end < n) {
                size_t k = end;
                if (jstr_is_space(jstr_next(p, n, &k)))
                    break;
                end = k;
            }
            if (max != -1 && (int64_t)out.u.l->n >= max) {
                jv_list_push(r->x, out.u.l, s_substr(r, p + start, n - start));
                break;
            }
            jv_list_push(r->x, out.u.l, s_substr(r, p + start, end - start));
            i = end;
            while (i < n) {
                size_t k = i;
                if (!jstr_is_space(jstr_next(p, n, &k)))
                    break;
                i = k;
            }
        }
        return out;
    }
    if (sep->u.s.n == 0)
        jx_fail(r->x, pos, "empty separator");
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    for (;;) {
        const char *hit = (max == -1 || (int64_t)out.u.l->n < max) ? s_find(p, (size_t)(end - p), sep->u.s.p, sep->u.s.n)
                                                                    : NULL;
        if (!hit) {
            jv_list_push(r->x, out.u.l, s_substr(r, p, (size_t)(end - p)));
            return out;
        }
        jv_list_push(r->x, out.u.l, s_substr(r, p, (size_t)(hit - p)));
        p = hit + sep->u.s.n;
    }
}

static jv_t s_replace(jrun_t *r, jv_t s, jargs_t *a, uint32_t pos) {
    if (a->npos < 2)
        jx_fail(r->x, pos, "replace() requires at least two arguments");
    jv_t old = a->pos[0], new = a->pos[1], *count = jargs_get(a, 2, "count");
    if (old.t != JV_STR || new.t != JV_STR)
        jx_fail(r->x, pos, "replace() arguments must be strings");
    if (count && count->t != JV_INT && count->t != JV_NONE)
        jx_fail(r->x, pos, "replace() count argument must be a number or null");
    int64_t left = count && count->t == JV_INT && count->u.i >= 0 ? count->u.i : INT64_MAX;
    ls_buf_t b = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    if (old.u.s.n == 0) {
        // an empty pattern matches before each code point and at the end
        for (;;) {
            if (left > 0) {
                jx_put(r->x, &b, new.u.s.p, new.u.s.n);
                left--;
            }
            if (p == end)
                break;
            size_t k = 0;
            jstr_next(p, (size_t)(end - p), &k);
            jx_put(r->x, &b, p, k);
            p += k;
        }
        return jx_buf_take(r->x, &b);
    }
    while (p < end) {
        const char *hit = left > 0 ? s_find(p, (size_t)(end - p), old.u.s.p, old.u.s.n) : NULL;
        if (!hit)
            break;
        jx_put(r->x, &b, p, (size_t)(hit - p));
        jx_put(r->x, &b, new.u.s.p, new.u.s.n);
        p = hit + old.u.s.n;
        left--;
    }
    jx_put(r->x, &b, p, (size_t)(end - p));
    return jx_buf_take(r->x, &b);
}

static bool s_affix(jrun_t *r, jv_t s, jargs_t *a, bool start, uint32_t pos) {
    const char *name = start ? "startswith" : "endswith";
    if (a->npos == 0)
        jx_fail(r->x, pos, "%s() requires at least one argument", name);
    jv_t p = a->pos[0];
    if (p.t == JV_STR)
        return start ? s_starts(s, p) : s_ends(s, p);
    if (p.t != JV_LIST)
        jx_fail(r->x, pos, "%s() argument must be a string or tuple of strings", name);
    for (size_t i = 0; i < p.u.l->n; i++) {
        if (p.u.l->v[i].t != JV_STR)
            jx_fail(r->x, pos, "%s() tuple elements must be strings", name);
        if (start ? s_starts(s, p.u.l->v[i]) : s_ends(s, p.u.l->v[i]))
            return true;
    }
    return false;
}

// ---- comparing and sorting --------------------------------------------------------------------

static bool s_numlike(jv_t v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double s_dbl(jv_t v) { return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : v.u.b; }

static int s_compare(jrun_t *r, jv_t a, jv_t b, bool case_sensitive, uint32_t pos) {
    if ((a.t == JV_NONE && b.t == JV_NONE) || (a.t == JV_UNDEF && b.t == JV_UNDEF))
        return 0;
    if (a.t == JV_NONE || b.t == JV_NONE || a.t == JV_UNDEF || b.t == JV_UNDEF)
        jx_fail(r->x, pos, "Cannot compare %s with %s", jv_type_name(a.t), jv_type_name(b.t));
    if (s_numlike(a) && s_numlike(b))
        return s_dbl(a) < s_dbl(b) ? -1 : s_dbl(a) > s_dbl(b) ? 1 : 0;
    if (a.t != b.t)
        jx_fail(r->x, pos, "Cannot compare different types: %s and %s", jv_type_name(a.t), jv_type_name(b.t));
    if (a.t != JV_STR)
        jx_fail(r->x, pos, "Cannot compare type: %s", jv_type_name(a.t));
    if (!case_sensitive) {
        a = s_case(r, a, S_CASE_LOWER);
        b = s_case(r, b, S_CASE_LOWER);
    }
    size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
    int c = memcmp(a.u.s.p, b.u.s.p, n);
    return c < 0 ? -1 : c > 0 ? 1 : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
}

typedef struct {
    jrun_t *r;
    bool case_sensitive, reverse;
    uint32_t pos;
} ssort_t;

// Stable (as JavaScript's Array#sort): a merge sort of values by their keys.
static void s_sort(ssort_t *c, jv_t *v, jv_t *keys, size_t n, jv_t *tv, jv_t *tk) {
    if (n < 2)
        return;
    size_t h = n / 2;
    s_sort(c, v, keys, h, tv, tk);
    s_sort(c, v + h, keys + h, n - h, tv, tk);
    size_t i = 0, j = h, k = 0;
    while (i < h || j < n) {
        bool take_left = j >= n;
        if (!take_left && i < h) {
            int cmp = s_compare(c->r, keys[i], keys[j], c->case_sensitive, c->pos);
            take_left = (c->reverse ? -cmp : cmp) <= 0;
        }
        size_t from = take_left ? i++ : j++;
        tv[k] = v[from];
        tk[k++] = keys[from];
    }
    memcpy(v, tv, n * sizeof *v);
    memcpy(keys, tk, n * sizeof *keys);
}

static jv_t s_sorted(jrun_t *r, const jlist_t *in, jv_t *keys, bool case_sensitive, bool reverse, uint32_t pos) {
    jrun_charge(r, (uint64_t)in->n * (uint64_t)(log2((double)in->n + 1) + 1), pos);
    jv_t out = s_list(r, in->n);
    memcpy(out.u.l->v, in->v, in->n * sizeof *in->v);
    out.u.l->n = in->n;
    jv_t *tv = jx_alloc(r->x, (in->n + 1) * sizeof *tv), *tk = jx_alloc(r->x, (in->n + 1) * sizeof *tk);
    ssort_t c = {.r = r, .case_sensitive = case_sensitive, .reverse = reverse, .pos = pos};
    s_sort(&c, out.u.l->v, keys, in->n, tv, tk);
    return out;
}

// An attribute path "a.b.0" of a dict, namespace or list item; undefined where it leads nowhere.
static jv_t s_attr_path(jv_t v, const char *p, size_t n) {
    while (n > 0 || p) {
        const char *dot = memchr(p, '.', n);
        size_t k = dot ? (size_t)(dot - p) : n;
        if (v.t == JV_DICT || v.t == JV_NS) {
            const jv_t *e = jv_dict_get(v.u.d, p, k);
            v = e ? *e : jv_undef();
        } else if (v.t == JV_LIST) {
            char buf[24];
            snprintf(buf, sizeof buf, "%.*s", (int)(k < 23 ? k : 23), p);
            char *end;
            long i = strtol(buf, &end, 10);
            if (end == buf || i < 0 || (size_t)i >= v.u.l->n)
                return jv_undef();
            v = v.u.l->v[i];
        } else {
            return jv_undef();
        }
        if (!dot)
            break;
        n -= k + 1;
        p = dot + 1;
    }
    return v;
}

static jv_t s_items(jrun_t *r, const jdict_t *d) {
    jv_t out = s_list(r, d->n);
    for (size_t i = 0; i < d->n; i++) {
        jv_t pair = s_list(r, 2);
        jv_list_push(r->x, pair.u.l, jv_str(d->e[i].k, d->e[i].kn));
        jv_list_push(r->x, pair.u.l, d->e[i].v);
        jv_list_push(r->x, out.u.l, pair);
    }
    return out;
}

static bool s_flag(jrun_t *r, jv_t *v, bool dflt, const char *what, uint32_t pos) {
    if (!v)
        return dflt;
    if (v->t != JV_BOOL)
        jx_fail(r->x, pos, "%s must be a boolean", what);
    return v->u.b;
}

static jv_t s_dictsort(jrun_t *r, const jdict_t *d, jargs_t *a, uint32_t pos) {
    bool cs = s_flag(r, jargs_get(a, 0, "case_sensitive"), false, "case_sensitive", pos);
    jv_t *by = jargs_get(a, 1, "by");
    if (by && by->t != JV_STR)
        jx_fail(r->x, pos, "by must be a string");
    bool by_value = by && s_is(by->u.s.p, by->u.s.n, "value");
    if (by && !by_value && !s_is(by->u.s.p, by->u.s.n, "key"))
        jx_fail(r->x, pos, "by must be either 'key' or 'value'");
    bool rev = s_flag(r, jargs_get(a, 2, "reverse"), false, "reverse", pos);
    jv_t items = s_items(r, d);
    jv_t *keys = jx_alloc(r->x, (d->n + 1) * sizeof *keys);
    for (size_t i = 0; i < d->n; i++)
        keys[i] = by_value ? d->e[i].v : jv_str(d->e[i].k, d->e[i].kn);
    return s_sorted(r, items.u.l, keys, cs, rev, pos);
}

// ---- globals and methods --------------------------------------------------------------------------

jv_t jbuiltin_global(jrun_t *r, const char *name) {
    if (!strcmp(name, "true") || !strcmp(name, "True"))
        return jv_bool(true);
    if (!strcmp(name, "false") || !strcmp(name, "False"))
        return jv_bool(false);
    if (!strcmp(name, "none") || !strcmp(name, "None"))
        return jv_none();
    for (int b = B_RANGE; b <= B_STRFTIME; b++)
        if (!strcmp(name, s_names[b]))
            return s_func(r, (sbuiltin_t)b, jv_undef());
    return jv_undef();
}

jv_t jmethod_get(jrun_t *r, jv_t v, const char *name, size_t n) {
    if (v.t == JV_STR && s_is(name, n, "length"))
        return jv_int((int64_t)jstr_utf16_len(v.u.s.p, v.u.s.n));
    if (v.t == JV_LIST && s_is(name, n, "length"))
        return jv_int((int64_t)v.u.l->n);
    int from = v.t == JV_STR ? B_UPPER : v.t == JV_DICT ? B_GET : -1, to = v.t == JV_STR ? B_REPLACE : B_DICTSORT;
    for (int b = from; from >= 0 && b <= to; b++)
        if (s_is(name, n, s_names[b]))
            return s_func(r, (sbuiltin_t)b, v);
    return jv_undef();
}

// strftime as @huggingface/jinja implements it: %Y %m %d %b %B %H %M %%, English month names;
// any other directive is kept as written.
static jv_t s_strftime(jrun_t *r, jv_t fmt, uint32_t pos) {
    static const char *months[] = {"January", "February", "March",     "April",   "May",      "June",
                                   "July",    "August",   "September", "October", "November", "December"};
    if (fmt.t != JV_STR)
        jx_fail(r->x, pos, "strftime_now() takes a format string");
    time_t t = (time_t)r->now_s;
    struct tm tm;
    if (!localtime_r(&t, &tm))
        jx_fail(r->x, pos, "strftime_now(): the clock is out of range");
    ls_buf_t b = {0};
    for (size_t i = 0; i < fmt.u.s.n; i++) {
        char c = i + 1 < fmt.u.s.n && fmt.u.s.p[i] == '%' ? fmt.u.s.p[i + 1] : 0;
        char tmp[32];
        int k = -1;
        switch (c) {
        case 'Y': k = snprintf(tmp, sizeof tmp, "%d", tm.tm_year + 1900); break;
        case 'm': k = snprintf(tmp, sizeof tmp, "%02d", tm.tm_mon + 1); break;
        case 'd': k = snprintf(tmp, sizeof tmp, "%02d", tm.tm_mday); break;
        case 'b': k = snprintf(tmp, sizeof tmp, "%.3s", months[tm.tm_mon]); break;
        case 'B': k = snprintf(tmp, sizeof tmp, "%s", months[tm.tm_mon]); break;
        case 'H': k = snprintf(tmp, sizeof tmp, "%02d", tm.tm_hour); break;
        case 'M': k = snprintf(tmp, sizeof tmp, "%02d", tm.tm_min); break;
        case '%': k = snprintf(tmp, sizeof tmp, "%%"); break;
        default: break;
        }
        if (k < 0) {
            jx_put(r->x, &b, fmt.u.s.p + i, 1);
        } else {
            jx_put(r->x, &b, tmp, (size_t)k);
            i++;
        }
    }
    return jx_buf_take(r->x, &b);
}

static jv_t s_namespace(jrun_t *r, jargs_t *a, uint32_t pos) {
    if (a->npos > 1)
        jx_fail(r->x, pos, "namespace expected at most 1 argument, got %zu", a->npos);
    jv_t ns = {.t = JV_NS, .u.d = jv_dict_new(r->x)};
    if (a->npos == 1) {
        jv_t src = a->pos[0];
        if (src.t == JV_DICT) {
            for (size_t i = 0; i < src.u.d->n; i++)
                jv_dict_set(r->x, ns.u.d, src.u.d->e[i].k, src.u.d->e[i].kn, src.u.d->e[i].v);
        } else if (src.t == JV_LIST) {
            for (size_t i = 0; i < src.u.l->n; i++) {
                jv_t pair = src.u.l->v[i];
                if (pair.t != JV_LIST || pair.u.l->n != 2)
                    jx_fail(r->x, pos, "namespace expected an object or an iterable of [key, value] pairs");
                if (pair.u.l->v[0].t != JV_STR)
                    jx_fail(r->x, pos, "namespace keys must be strings");
                jv_t k = pair.u.l->v[0];
                jv_dict_set(r->x, ns.u.d, k.u.s.p, k.u.s.n, pair.u.l->v[1]);
            }
        } else {
            jx_fail(r->x, pos, "'%s' object is not iterable", jv_type_name(src.t));
        }
    }
    for (size_t i = 0; i < a->kw->n; i++)
        jv_dict_set(r->x, ns.u.d, a->kw->e[i].k, a->kw->e[i].kn, a->kw->e[i].v);
    return ns;
}

static jv_t s_range(jrun_t *r, jargs_t *a, uint32_t pos) {
    int64_t v[3] = {0, 0, 1};
    if (a->npos == 0 || a->npos > 3)
        jx_fail(r->x, pos, "range() takes 1 to 3 integers");
    for (size_t i = 0; i < a->npos; i++) {
        if (a->pos[i].t != JV_INT)
            jx_fail(r->x, pos, "range() arguments must be integers, got %s", jv_type_name(a->pos[i].t));
        v[a->npos == 1 ? 1 : i] = a->pos[i].u.i;
    }
    if (v[2] == 0)
        jx_fail(r->x, pos, "range() step must not be zero");
    double count = v[2] > 0 ? ceil(((double)v[1] - (double)v[0]) / (double)v[2])
                            : ceil(((double)v[0] - (double)v[1]) / -(double)v[2]);
    if (count > S_MAX_RANGE)
        jx_fail(r->x, pos, "range() of more than %d items", S_MAX_RANGE);
    jv_t out = s_list(r, count > 0 ? (size_t)count : 0);
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2])
        jv_list_push(r->x, out.u.l, jv_int(i));
    return out;
}

jv_t jbuiltin_call(jrun_t *r, const jfunc_t *fn, jargs_t *a, uint32_t pos) {
    jv_t self = fn->self;
    switch ((sbuiltin_t)fn->builtin) {
    case B_RANGE:
        return s_range(r, a, pos);
    case B_NAMESPACE:
        return s_namespace(r, a, pos);
    case B_RAISE: {
        ls_buf_t b = {0};
        if (a->npos)
            jv_print_raw(r->x, &b, a->pos[0]);
        jx_fail(r->x, pos, "%.*s", (int)(b.n > 600 ? 600 : b.n), b.s ? b.s : "");
    }
    case B_STRFTIME:
        return s_strftime(r, a->npos ? a->pos[0] : jv_undef(), pos);
    case B_UPPER:
        return s_case(r, self, S_CASE_UPPER);
    case B_LOWER:
        return s_case(r, self, S_CASE_LOWER);
    case B_TITLE:
        return s_case(r, self, S_CASE_TITLE);
    case B_CAPITALIZE:
        return s_case(r, self, S_CASE_CAPITALIZE);
    // as @huggingface/jinja: the characters argument is ignored, all whitespace goes
    case B_STRIP:
        return s_trimmed(self, true, true);
    case B_LSTRIP:
        return s_trimmed(self, true, false);
    case B_RSTRIP:
        return s_trimmed(self, false, true);
    case B_STARTSWITH:
    case B_ENDSWITH:
        return jv_bool(s_affix(r, self, a, fn->builtin == B_STARTSWITH, pos));
    case B_SPLIT:
        return s_split(r, self, jargs_get(a, 0, "sep"), jargs_get(a, 1, "maxsplit"), pos);
    case B_REPLACE:
        return s_replace(r, self, a, pos);
    case B_GET: {
        if (a->npos == 0 || a->pos[0].t != JV_STR)
            jx_fail(r->x, pos, "Object key must be a string: got %s", jv_type_name(a->npos ? a->pos[0].t : JV_UNDEF));
        const jv_t *v = jv_dict_get(self.u.d, a->pos[0].u.s.p, a->pos[0].u.s.n);
        return v ? *v : a->npos > 1 ? a->pos[1] : jv_none();
    }
    case B_ITEMS:
        return s_items(r, self.u.d);
    case B_KEYS:
    case B_VALUES: {
        jv_t out = s_list(r, self.u.d->n);
        for (size_t i = 0; i < self.u.d->n; i++)
            jv_list_push(r->x, out.u.l,
                         fn->builtin == B_KEYS ? jv_str(self.u.d->e[i].k, self.u.d->e[i].kn) : self.u.d->e[i].v);
        return out;
    }
    case B_DICTSORT:
        return s_dictsort(r, self.u.d, a, pos);
    }
    jx_fail(r->x, pos, "unknown built-in function");
}

// ---- tests --------------------------------------------------------------------------------------

bool jtest_apply(jrun_t *r, const char *name, size_t n, jv_t v, const jv_t *arg, uint32_t pos) {
    jv_t b = arg ? *arg : jv_undef();
    if (s_is(name, n, "defined"))
        return v.t != JV_UNDEF;
    if (s_is(name, n, "undefined"))
        return v.t == JV_UNDEF;
    if (s_is(name, n, "none"))
        return v.t == JV_NONE;
    if (s_is(name, n, "boolean"))
        return v.t == JV_BOOL;
    if (s_is(name, n, "true"))
        return v.t == JV_BOOL && v.u.b;
    if (s_is(name, n, "false"))
        return v.t == JV_BOOL && !v.u.b;
    if (s_is(name, n, "string"))
        return v.t == JV_STR;
    if (s_is(name, n, "number"))
        return v.t == JV_INT || v.t == JV_FLOAT;
    if (s_is(name, n, "integer"))
        return v.t == JV_INT;
    if (s_is(name, n, "float"))
        return v.t == JV_FLOAT;
    if (s_is(name, n, "iterable"))
        return v.t == JV_LIST || v.t == JV_STR;
    if (s_is(name, n, "mapping"))
        return v.t == JV_DICT;
    if (s_is(name, n, "sequence"))
        return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR;
    if (s_is(name, n, "callable"))
        return v.t == JV_FUNC;
    if (s_is(name, n, "lower") || s_is(name, n, "upper")) {
        if (v.t != JV_STR)
            return false;
        jv_t c = s_case(r, v, s_is(name, n, "lower") ? S_CASE_LOWER : S_CASE_UPPER);
        return jv_strict_eq(c, v);
    }
    if (s_is(name, n, "odd") || s_is(name, n, "even")) {
        if (v.t != JV_INT)
            jx_fail(r->x, pos, "cannot %.*s on %s", (int)n, name, jv_type_name(v.t));
        return (v.u.i % 2 != 0) == s_is(name, n, "odd");
    }
    if (s_is(name, n, "divisibleby")) {
        if (v.t != JV_INT || b.t != JV_INT || b.u.i == 0)
            jx_fail(r->x, pos, "divisibleby takes two integers, the divisor not 0");
        return v.u.i % b.u.i == 0;
    }
    if (s_is(name, n, "equalto") || s_is(name, n, "eq") || s_is(name, n, "==") || s_is(name, n, "sameas"))
        return jv_strict_eq(v, b);
    if (s_is(name, n, "ne") || s_is(name, n, "!="))
        return !jv_strict_eq(v, b);
    if (s_is(name, n, "in")) {
        if (b.t == JV_LIST) {
            for (size_t i = 0; i < b.u.l->n; i++)
                if (jv_strict_eq(b.u.l->v[i], v))
                    return true;
            return false;
        }
        if (b.t == JV_STR && v.t == JV_STR)
            return v.u.s.n == 0 || s_find(b.u.s.p, b.u.s.n, v.u.s.p, v.u.s.n);
        if (b.t == JV_DICT && v.t == JV_STR)
            return jv_dict_get(b.u.d, v.u.s.p, v.u.s.n) != NULL;
        jx_fail(r->x, pos, "the `in` test needs a list, string or mapping, got %s", jv_type_name(b.t));
    }
    static const char *cmp[] = {"lt", "<", "le", "<=", "gt", ">", "ge", ">="};
    for (int k = 0; k < 8; k++) {
        if (!s_is(name, n, cmp[k]))
            continue;
        int c = s_compare(r, v, b, true, pos);
        return k < 2 ? c < 0 : k < 4 ? c <= 0 : k < 6 ? c > 0 : c >= 0;
    }
    jx_fail(r->x, pos, "Unknown test: %.*s", (int)n, name);
}

// ---- filters ------------------------------------------------------------------------------------

static jv_t s_filter(jrun_t *r, jv_t v, const char *name, size_t n, jargs_t *a, bool called, uint32_t pos);

static jv_t s_tojson(jrun_t *r, jv_t v, jargs_t *a, uint32_t pos) {
    jjson_opts_t o = {.undefined_as_null = true};
    jv_t *indent = jargs_get(a, SIZE_MAX, "indent"), *sep = jargs_get(a, SIZE_MAX, "separators");
    if (indent && indent->t != JV_INT && indent->t != JV_NONE)
        jx_fail(r->x, pos, "If set, indent must be a number");
    if (indent && indent->t == JV_INT) {
        if (indent->u.i < 0 || indent->u.i > 64)
            jx_fail(r->x, pos, "indent must be between 0 and 64");
        o.indent = (int)indent->u.i;
    }
    o.ensure_ascii = s_flag(r, jargs_get(a, SIZE_MAX, "ensure_ascii"), false, "If set, ensure_ascii", pos);
    o.sort_keys = s_flag(r, jargs_get(a, SIZE_MAX, "sort_keys"), false, "If set, sort_keys", pos);
    if (sep && sep->t != JV_NONE) {
        if (sep->t != JV_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR || sep->u.l->v[1].t != JV_STR)
            jx_fail(r->x, pos, "separators must be a tuple of two strings");
        o.item_sep = jx_strdup(r->x, sep->u.l->v[0].u.s.p, sep->u.l->v[0].u.s.n);
        o.key_sep = jx_strdup(r->x, sep->u.l->v[1].u.s.p, sep->u.l->v[1].u.s.n);
    }
    ls_buf_t b = {0};
    jv_to_json(r->x, &b, v, &o, 0);
    return jx_buf_take(r->x, &b);
}

// JavaScript's parseInt(s, 10) / parseFloat(s): the longest numeric prefix after whitespace.
static bool s_parse_number(jv_t s, bool integer, double *out) {
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    jstr_trim(&p, &n, true, false);
    char buf[400];
    size_t k = 0;
    if (i < n && (p[i] == '+' || p[i] == '-'))
        buf[k++] = p[i++];
    if (!integer && n - i >= 8 && memcmp(p + i, "Infinity", 8) == 0) {
        *out = k && buf[0] == '-' ? -INFINITY : INFINITY;
        return true;
    }
    size_t digits = 0;
    while (i < n && k < sizeof buf - 8 && p[i] >= '0' && p[i] <= '9')
        buf[k++] = p[i++], digits++;
    if (!integer) {
        if (i < n && p[i] == '.') {
            buf[k++] = p[i++];
            while (i < n && k < sizeof buf - 8 && p[i] >= '0' && p[i] <= '9')
                buf[k++] = p[i++], digits++;
        }
        if (digits && i < n && (p[i] == 'e' || p[i] == 'E')) {
            size_t j = i + 1, at = k;
            char e[8] = "e";
            size_t ek = 1;
            if (j < n && (p[j] == '+' || p[j] == '-'))
                e[ek++] = p[j++];
            if (j < n && p[j] >= '0' && p[j] <= '9') {
                memcpy(buf + at, e, ek);
                k += ek;
                while (j < n && k < sizeof buf - 1 && p[j] >= '0' && p[j] <= '9')
                    buf[k++] = p[j++];
            }
        }
    }
    buf[k] = 0;
    if (!digits)
        return false;
    *out = integer ? trunc(strtod(buf, NULL)) : strtod(buf, NULL);
    return true;
}

static jv_t s_indent(jrun_t *r, jv_t s, jargs_t *a, uint32_t pos) {
    jv_t *w = jargs_get(a, 0, "width"), *first = jargs_get(a, 1, "first"), *blank = jargs_get(a, 2, "blank");
    if (w && w->t != JV_INT)
        jx_fail(r->x, pos, "width must be a number");
    int64_t width = w ? w->u.i : 4;
    if (width < 0 || width > 256)
        jx_fail(r->x, pos, "width must be between 0 and 256");
    bool ind_first = first && jv_truthy(*first), ind_blank = blank && jv_truthy(*blank);
    ls_buf_t b = {0};
    const char *p = s.u.s.p, *end = p + s.u.s.n;
    for (size_t line = 0;; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (!((!ind_first && line == 0) || (!ind_blank && len == 0)))
            for (int64_t k = 0; k < width; k++)
                jx_put(r->x, &b, " ", 1);
        jx_put(r->x, &b, p, len);
        if (!nl)
            break;
        jx_put(r->x, &b, "\n", 1);
        p = nl + 1;
    }
    return jx_buf_take(r->x, &b);
}

static jv_t s_join(jrun_t *r, jv_t v, jargs_t *a, uint32_t pos) {
    jv_t *sep = jargs_get(a, 0, "separator");
    if (sep && sep->t != JV_STR)
        jx_fail(r->x, pos, "separator must be a string");
    ls_buf_t b = {0};
    if (v.t == JV_STR) {
        for (size_t i = 0; i < v.u.s.n;) {
            size_t from = i;
            jstr_next(v.u.s.p, v.u.s.n, &i);
            if (from && sep)
                jx_put(r->x, &b, sep->u.s.p, sep->u.s.n);
            jx_put(r->x, &b, v.u.s.p + from, i - from);
        }
    } else {
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && sep)
                jx_put(r->x, &b, sep->u.s.p, sep->u.s.n);
            jv_t x = v.u.l->v[i];
            if (x.t != JV_UNDEF && x.t != JV_NONE)  // Array#join writes them as ""
                jv_print_raw(r->x, &b, x);
        }
    }
    return jx_buf_take(r->x, &b);
}

// selectattr / rejectattr / select / reject: the items whose attribute (or themselves) pass
// the named test (or are truthy).
static jv_t s_select(jrun_t *r, jv_t v, jargs_t *a, bool by_attr, bool keep, const char *fname, uint32_t pos) {
    size_t at = 0;
    jv_t attr = jv_undef();
    if (by_attr) {
        if (a->npos == 0 || a->pos[0].t != JV_STR)
            jx_fail(r->x, pos, "`%s` needs an attribute name", fname);
        attr = a->pos[at++];
    }
    jv_t *test = at < a->npos ? &a->pos[at] : NULL, *arg = at + 1 < a->npos ? &a->pos[at + 1] : NULL;
    if (test && test->t != JV_STR)
        jx_fail(r->x, pos, "the test of `%s` must be a string", fname);
    jv_t out = s_list(r, 0);
    for (size_t i = 0; i < v.u.l->n; i++) {
        jv_t item = v.u.l->v[i], x = item;
        if (by_attr) {
            if (item.t != JV_DICT && item.t != JV_NS)
                jx_fail(r->x, pos, "`%s` can only be applied to array of objects", fname);
            const jv_t *e = jv_dict_get(item.u.d, attr.u.s.p, attr.u.s.n);
            x = e ? *e : jv_undef();
        }
        bool ok;
        if (by_attr && x.t == JV_UNDEF)
            ok = false;  // a missing attribute fails every test
        else if (test)
            ok = jtest_apply(r, test->u.s.p, test->u.s.n, x, arg, pos);
        else
            ok = jv_truthy(x);
        if (ok == keep)
            jv_list_push(r->x, out.u.l, item);
    }
    return out;
}

static jv_t s_map(jrun_t *r, jv_t v, jargs_t *a, uint32_t pos) {
    jv_t *attr = jargs_get(a, SIZE_MAX, "attribute"), *dflt = jargs_get(a, SIZE_MAX, "default");
    jv_t out = s_list(r, v.u.l->n);
    if (!attr) {
        // Jinja2's map('filter', args...): each item through the named filter
        if (a->npos == 0 || a->pos[0].t != JV_STR)
            jx_fail(r->x, pos, "`map` needs attribute= or a filter name");
        jargs_t rest = {.pos = a->pos + 1, .npos = a->npos - 1, .kw = a->kw};
        for (size_t i = 0; i < v.u.l->n; i++)
            jv_list_push(r->x, out.u.l,
                         s_filter(r, v.u.l->v[i], a->pos[0].u.s.p, a->pos[0].u.s.n, &rest, rest.npos > 0, pos));
        return out;
    }
    if (attr->t != JV_STR)
        jx_fail(r->x, pos, "attribute must be a string");
    for (size_t i = 0; i < v.u.l->n; i++) {
        jv_t item = v.u.l->v[i];
        if (item.t != JV_DICT && item.t != JV_NS)
            jx_fail(r->x, pos, "items in map must be an object");
        jv_t x = s_attr_path(item, attr->u.s.p, attr->u.s.n);
        jv_list_push(r->x, out.u.l, x.t == JV_UNDEF && dflt ? *dflt : x);
    }
    return out;
}

static jv_t s_list_filter(jrun_t *r, jv_t v, const char *name, size_t n, jargs_t *a, uint32_t pos, bool *done) {
    const jlist_t *l = v.u.l;
    *done = true;
    if (s_is(name, n, "list"))
        return v;
    if (s_is(name, n, "first"))
        return l->n ? l->v[0] : jv_undef();
    if (s_is(name, n, "last"))
        return l->n ? l->v[l->n - 1] : jv_undef();
    if (s_is(name, n, "length") || s_is(name, n, "count"))
        return jv_int((int64_t)l->n);
    if (s_is(name, n, "reverse")) {
        jv_t out = s_list(r, l->n);
        for (size_t i = l->n; i > 0; i--)
            jv_list_push(r->x, out.u.l, l->v[i - 1]);
        return out;
    }
    if (s_is(name, n, "sort")) {
        bool rev = s_flag(r, jargs_get(a, 0, "reverse"), false, "reverse", pos);
        bool cs = s_flag(r, jargs_get(a, 1, "case_sensitive"), false, "case_sensitive", pos);
        jv_t *attr = jargs_get(a, 2, "attribute");
        if (attr && attr->t != JV_STR && attr->t != JV_INT && attr->t != JV_NONE)
            jx_fail(r->x, pos, "attribute must be a string, integer, or null");
        char ibuf[24];
        const char *path = NULL;
        size_t plen = 0;
        if (attr && attr->t == JV_STR) {
            path = attr->u.s.p;
            plen = attr->u.s.n;
        } else if (attr && attr->t == JV_INT) {
            plen = (size_t)snprintf(ibuf, sizeof ibuf, "%lld", (long long)attr->u.i);
            path = ibuf;
        }
        jv_t *keys = jx_alloc(r->x, (l->n + 1) * sizeof *keys);
        for (size_t i = 0; i < l->n; i++)
            keys[i] = path ? s_attr_path(l->v[i], path, plen) : l->v[i];
        return s_sorted(r, l, keys, cs, rev, pos);
    }
    if (s_is(name, n, "join"))
        return s_join(r, v, a, pos);
    if (s_is(name, n, "string")) {
        ls_buf_t b = {0};
        jv_print(r->x, &b, v);
        return jx_buf_take(r->x, &b);
    }
    if (s_is(name, n, "unique")) {
        jv_t out = s_list(r, l->n);
        for (size_t i = 0; i < l->n; i++) {
            jrun_charge(r, out.u.l->n + 1, pos);
            bool seen = false;
            for (size_t k = 0; k < out.u.l->n && !seen; k++)
                seen = jv_strict_eq(out.u.l->v[k], l->v[i]);
            if (!seen)
                jv_list_push(r->x, out.u.l, l->v[i]);
        }
        return out;
    }
    if (s_is(name, n, "selectattr") || s_is(name, n, "rejectattr"))
        return s_select(r, v, a, true, name[0] == 's', name[0] == 's' ? "selectattr" : "rejectattr", pos);
    if (s_is(name, n, "select") || s_is(name, n, "reject"))
        return s_select(r, v, a, false, name[0] == 's', name[0] == 's' ? "select" : "reject", pos);
    if (s_is(name, n, "map"))
        return s_map(r, v, a, pos);
    *done = false;
    return v;
}

static jv_t s_str_filter(jrun_t *r, jv_t v, const char *name, size_t n, jargs_t *a, bool called, uint32_t pos,
                         bool *done) {
    *done = true;
    if (s_is(name, n, "length") || s_is(name, n, "count"))
        return jv_int((int64_t)jstr_utf16_len(v.u.s.p, v.u.s.n));
    if (s_is(name, n, "upper"))
        return s_case(r, v, S_CASE_UPPER);
    if (s_is(name, n, "lower"))
        return s_case(r, v, S_CASE_LOWER);
    if (s_is(name, n, "title"))
        return s_case(r, v, S_CASE_TITLE);
    if (s_is(name, n, "capitalize"))
        return s_case(r, v, S_CASE_CAPITALIZE);
    if (s_is(name, n, "trim"))
        return s_trimmed(v, true, true);
    if (s_is(name, n, "indent"))
        return s_indent(r, v, a, pos);
    if (s_is(name, n, "join"))
        return s_join(r, v, a, pos);
    if (s_is(name, n, "string"))
        return v;
    if (s_is(name, n, "replace"))
        return s_replace(r, v, a, pos);
    if (s_is(name, n, "list")) {
        jv_t out = s_list(r, v.u.s.n);
        for (size_t i = 0; i < v.u.s.n;) {
            size_t from = i;
            jstr_next(v.u.s.p, v.u.s.n, &i);
            jv_list_push(r->x, out.u.l, s_substr(r, v.u.s.p + from, i - from));
        }
        return out;
    }
    if (s_is(name, n, "int") || s_is(name, n, "float")) {
        bool integer = name[0] == 'i';
        double d;
        if (s_parse_number(v, integer, &d))
            return integer ? (fabs(d) < 9e18 ? jv_int((int64_t)d) : jv_float(d)) : jv_float(d);
        jv_t *dflt = called ? jargs_get(a, 0, "default") : NULL;
        return dflt ? *dflt : integer ? jv_int(0) : jv_float(0);
    }
    *done = false;
    return v;
}

static jv_t s_filter(jrun_t *r, jv_t v, const char *name, size_t n, jargs_t *a, bool called, uint32_t pos) {
    bool done = false;
    jv_t out;
    // a filter's work is its items, or its bytes scanned
    jrun_charge(r, 1 + (v.t == JV_LIST ? v.u.l->n : v.t == JV_STR ? v.u.s.n / 64 : 0), pos);
    if (s_is(name, n, "safe"))
        return v;
    if (s_is(name, n, "tojson"))
        return s_tojson(r, v, a, pos);
    if (s_is(name, n, "default") || s_is(name, n, "d")) {
        jv_t *dflt = jargs_get(a, 0, "default_value");
        bool boolean = s_flag(r, jargs_get(a, 1, "boolean"), false, "`default` filter flag", pos);
        if (v.t == JV_UNDEF || (boolean && !jv_truthy(v)))
            return dflt ? *dflt : jv_str("", 0);
        return v;
    }
    switch (v.t) {
    case JV_LIST:
        out = s_list_filter(r, v, name, n, a, pos, &done);
        break;
    case JV_STR:
        out = s_str_filter(r, v, name, n, a, called, pos, &done);
        break;
    case JV_INT:
    case JV_FLOAT:
    case JV_BOOL:
        done = true;
        if (s_is(name, n, "abs") && v.t != JV_BOOL)
            out = v.t == JV_INT ? (v.u.i == INT64_MIN ? jv_float(9.223372036854775808e18) : jv_int(v.u.i < 0 ? -v.u.i : v.u.i))
                                : jv_float(fabs(v.u.f));
        else if (s_is(name, n, "int"))
            // as @huggingface/jinja: |int floors a float, |int(...) keeps it
            out = v.t == JV_BOOL ? jv_int(v.u.b) : v.t == JV_INT || called ? v
                  : fabs(v.u.f) < 9e18 ? jv_int((int64_t)floor(v.u.f)) : jv_float(floor(v.u.f));
        else if (s_is(name, n, "float"))
            out = v.t == JV_BOOL ? jv_float(v.u.b) : called ? v : jv_float(v.t == JV_INT ? (double)v.u.i : v.u.f);
        else if (s_is(name, n, "bool") && v.t == JV_BOOL)
            out = v;
        else if (s_is(name, n, "string")) {
            ls_buf_t b = {0};
            jv_print(r->x, &b, v);
            out = jx_buf_take(r->x, &b);
        } else
            done = false;
        break;
    case JV_DICT:
        done = true;
        if (s_is(name, n, "items"))
            out = s_items(r, v.u.d);
        else if (s_is(name, n, "length") || s_is(name, n, "count"))
            out = jv_int((int64_t)v.u.d->n);
        else if (s_is(name, n, "dictsort"))
            out = s_dictsort(r, v.u.d, a, pos);
        else if (s_is(name, n, "list") || s_is(name, n, "keys") || s_is(name, n, "values")) {
            out = s_list(r, v.u.d->n);
            for (size_t i = 0; i < v.u.d->n; i++)
                jv_list_push(r->x, out.u.l, name[0] == 'v' ? v.u.d->e[i].v : jv_str(v.u.d->e[i].k, v.u.d->e[i].kn));
        } else if (s_is(name, n, "string")) {
            ls_buf_t b = {0};
            jv_print(r->x, &b, v);
            out = jx_buf_take(r->x, &b);
        } else
            done = false;
        break;
    default:
        break;
    }
    if (!done)
        jx_fail(r->x, pos, "Cannot apply filter \"%.*s\" to type: %s", (int)n, name, jv_type_name(v.t));
    return out;
}

jv_t jfilter_apply(jrun_t *r, jv_t v, const jnode_t *filter, jscope_t *sc) {
    jargs_t a = {.pos = NULL, .npos = 0, .kw = jv_dict_new(r->x)};
    const jnode_t *name = filter;
    bool called = filter->kind == N_CALL;
    if (called) {
        name = filter->a;
        if (name->kind != N_NAME)
            jx_fail(r->x, filter->pos, "Unknown filter");
        jargs_eval(r, &filter->list, sc, &a);
    }
    return s_filter(r, v, name->s, name->n, &a, called, filter->pos);
}
