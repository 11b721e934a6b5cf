// test_prom — the Prometheus text format as a client parses it (contract in test_prom.h).
#include "test_prom.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define MAX_SAMPLES 8192
#define MAX_FAMILIES 1024

typedef struct {
    char name[128];
    char type[32];  // "" until a TYPE line
    bool has_samples, closed;
} family_t;

struct tp_page {
    tp_sample_t *s;
    int n;
    family_t f[MAX_FAMILIES];
    int nf;
};

tp_page_t *tp_page_new(void) {
    tp_page_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->s = calloc(MAX_SAMPLES, sizeof *p->s);
    assert_non_null(p->s);
    return p;
}

void tp_page_destroy(tp_page_t **p) {
    if (!p || !*p)
        return;
    free((*p)->s);
    free(*p);
    *p = NULL;
}

int tp_count(const tp_page_t *p) {
    return p->n;
}

const tp_sample_t *tp_sample(const tp_page_t *p, int i) {
    return &p->s[i];
}

static family_t *s_family(tp_page_t *p, const char *name, bool add) {
    for (int i = 0; i < p->nf; i++)
        if (!strcmp(p->f[i].name, name))
            return &p->f[i];
    if (!add)
        return NULL;
    assert_true(p->nf < MAX_FAMILIES);
    family_t *f = &p->f[p->nf++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

// The histogram or summary family whose _bucket, _sum or _count `sample` is, else NULL; *suffix
// is where the suffix starts.
static family_t *s_family_of_suffixed(tp_page_t *p, const char *sample, const char **suffix) {
    static const char *suffixes[] = {"_bucket", "_sum", "_count"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(sample), m = strlen(suffixes[k]);
        if (n > m && !strcmp(sample + n - m, suffixes[k])) {
            char base[128];
            snprintf(base, sizeof base, "%.*s", (int)(n - m), sample);
            family_t *f = s_family(p, base, false);
            if (f && (!strcmp(f->type, "histogram") || !strcmp(f->type, "summary"))) {
                if (suffix)
                    *suffix = sample + n - m;
                return f;
            }
        }
    }
    return NULL;
}

// The family a sample belongs to: a histogram's or summary's _bucket, _sum, _count are its own.
static family_t *s_family_of(tp_page_t *p, const char *sample) {
    family_t *f = s_family_of_suffixed(p, sample, NULL);
    return f ? f : s_family(p, sample, true);
}

static bool s_name_char(char c, bool first, bool colon) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

// A metric or label name at *at, into out; fails the test when there is none.
static void s_parse_name(const char **at, char *out, size_t cap, bool colon, const char *line) {
    size_t n = 0;
    while (s_name_char((*at)[n], n == 0, colon) && n + 1 < cap) {
        out[n] = (*at)[n];
        n++;
    }
    out[n] = 0;
    if (!n)
        fail_msg("no name at '%s' in: %s", *at, line);
    *at += n;
}

static void s_parse_sample(tp_page_t *p, const char *line) {
    assert_true(p->n < MAX_SAMPLES);
    tp_sample_t *s = &p->s[p->n++];
    memset(s, 0, sizeof *s);
    const char *at = line;
    s_parse_name(&at, s->name, sizeof s->name, true, line);
    if (*at == '{') {
        at++;
        while (*at != '}') {
            if (s->nlabels == TP_MAX_LABELS)
                fail_msg("too many labels: %s", line);
            char *name = s->label[s->nlabels][0], *value = s->label[s->nlabels][1];
            s_parse_name(&at, name, sizeof s->label[0][0], false, line);
            for (int i = 0; i < s->nlabels; i++)
                if (!strcmp(s->label[i][0], name))
                    fail_msg("label %s twice: %s", name, line);
            if (at[0] != '=' || at[1] != '"')
                fail_msg("no =\" after label %s: %s", name, line);
            at += 2;
            size_t n = 0;
            for (; *at != '"'; at++) {
                char c = *at;
                if (!c)
                    fail_msg("unterminated label value: %s", line);
                if (c == '\\') {
                    at++;
                    if (*at == 'n')
                        c = '\n';
                    else if (*at == '\\' || *at == '"')
                        c = *at;
                    else
                        fail_msg("bad escape \\%c: %s", *at, line);
                }
                assert_true(n + 1 < sizeof s->label[0][1]);
                value[n++] = c;
            }
            value[n] = 0;
            at++;
            s->nlabels++;
            if (*at == ',')
                at++;
            else if (*at != '}')
                fail_msg("no , or } after a label: %s", line);
        }
        at++;
    }
    if (*at != ' ')
        fail_msg("no value: %s", line);
    char *end;
    s->value = strtod(at + 1, &end);
    if (end == at + 1 || (*end && *end != ' '))
        fail_msg("bad value: %s", line);
    family_t *f = s_family_of(p, s->name);
    if (f->closed)
        fail_msg("family %s split: its samples are not together (at %s)", f->name, line);
    // Every other family that had samples is over.
    for (int i = 0; i < p->nf; i++)
        if (&p->f[i] != f && p->f[i].has_samples)
            p->f[i].closed = true;
    f->has_samples = true;
}

void tp_parse(tp_page_t *p, const char *text) {
    memset(p->f, 0, sizeof p->f);
    p->nf = p->n = 0;
    char *copy = strdup(text), *save;
    assert_non_null(copy);
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            char name[128], type[32];
            if (sscanf(line, "# TYPE %127s %31s", name, type) == 2) {
                family_t *f = s_family(p, name, true);
                if (f->type[0])
                    fail_msg("a second TYPE line for %s", name);
                if (f->has_samples)
                    fail_msg("TYPE line for %s after its samples", name);
                if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram") &&
                    strcmp(type, "summary") && strcmp(type, "untyped"))
                    fail_msg("unknown type %s of %s", type, name);
                snprintf(f->type, sizeof f->type, "%s", type);
            }
            continue;
        }
        s_parse_sample(p, line);
    }
    free(copy);
}

const char *tp_type(const tp_page_t *p, const char *family) {
    for (int i = 0; i < p->nf; i++)
        if (!strcmp(p->f[i].name, family))
            return p->f[i].type;
    return NULL;
}

const char *tp_label_or_null(const tp_sample_t *s, const char *name) {
    for (int i = 0; i < s->nlabels; i++)
        if (!strcmp(s->label[i][0], name))
            return s->label[i][1];
    return NULL;
}

const char *tp_label(const tp_sample_t *s, const char *name) {
    const char *v = tp_label_or_null(s, name);
    if (!v)
        fail_msg("%s has no label %s", s->name, name);
    return v;
}

const tp_sample_t *tp_only(const tp_page_t *p, const char *name) {
    const char *type = tp_type(p, name);
    if (!type)
        fail_msg("no family %s", name);
    if (strcmp(type, "gauge"))
        fail_msg("%s is typed '%s', not gauge", name, type);
    const tp_sample_t *one = NULL;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].name, name)) {
            if (one)
                fail_msg("%s has more than one series", name);
            one = &p->s[i];
        }
    if (!one)
        fail_msg("%s has no sample", name);
    return one;
}

// Whether a and b carry the same labels, le aside.
static bool s_same_series(const tp_sample_t *a, const tp_sample_t *b) {
    int na = 0, nb = 0;
    for (int i = 0; i < a->nlabels; i++) {
        if (!strcmp(a->label[i][0], "le"))
            continue;
        na++;
        const char *v = tp_label_or_null(b, a->label[i][0]);
        if (!v || strcmp(v, a->label[i][1]))
            return false;
    }
    for (int i = 0; i < b->nlabels; i++)
        nb += strcmp(b->label[i][0], "le") != 0;
    return na == nb;
}

// The series of histogram family f whose first line is at `first`: its buckets, _sum, _count.
static void s_check_series(const tp_page_t *p, family_t *f, int first) {
    double le = -INFINITY, count = -1, inf = -1, sum = NAN, last = 0;
    for (int i = first; i < p->n; i++) {
        const tp_sample_t *s = &p->s[i];
        const char *suffix;
        if (s_family_of_suffixed((tp_page_t *)p, s->name, &suffix) != f || !s_same_series(s, &p->s[first]))
            continue;
        if (!strcmp(suffix, "_bucket")) {
            const char *l = tp_label(s, "le");
            double b = !strcmp(l, "+Inf") ? INFINITY : strtod(l, NULL);
            if (!(b > le))
                fail_msg("%s: bucket le=%s after le=%g", s->name, l, le);
            if (s->value < last)
                fail_msg("%s{le=%s}: count %g below the bucket before's %g", s->name, l, s->value, last);
            le = b;
            last = s->value;
            if (isinf(b))
                inf = s->value;
        } else if (!strcmp(suffix, "_sum"))
            sum = s->value;
        else
            count = s->value;
    }
    if (inf < 0 || count < 0 || isnan(sum))
        fail_msg("histogram %s: a series without its +Inf bucket, _count or _sum", f->name);
    if (inf != count)
        fail_msg("histogram %s: +Inf bucket %g, _count %g", f->name, inf, count);
    if (sum < 0 || (count > 0 && !(sum > 0)))
        fail_msg("histogram %s: _sum %g with _count %g", f->name, sum, count);
}

void tp_check_histograms(const tp_page_t *p) {
    for (int i = 0; i < p->n; i++) {
        const char *suffix;
        family_t *f = s_family_of_suffixed((tp_page_t *)p, p->s[i].name, &suffix);
        if (!f || strcmp(f->type, "histogram"))
            continue;
        bool seen = false;  // the series was checked from an earlier line
        for (int j = 0; j < i && !seen; j++)
            seen = s_family_of_suffixed((tp_page_t *)p, p->s[j].name, &suffix) == f && s_same_series(&p->s[j], &p->s[i]);
        if (!seen)
            s_check_series(p, f, i);
    }
}

bool tp_histogram(const tp_page_t *p, const char *family, const char *label, const char *value, double *count,
                  double *sum) {
    char cname[160], sname[160];
    snprintf(cname, sizeof cname, "%s_count", family);
    snprintf(sname, sizeof sname, "%s_sum", family);
    bool found = false;
    for (int i = 0; i < p->n; i++) {
        const char *v = tp_label_or_null(&p->s[i], label);
        if (!v || strcmp(v, value))
            continue;
        if (!strcmp(p->s[i].name, cname)) {
            *count = p->s[i].value;
            found = true;
        } else if (!strcmp(p->s[i].name, sname))
            *sum = p->s[i].value;
    }
    return found;
}
