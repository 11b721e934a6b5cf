#include "prom.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

struct bs_prom_t {
    char **series;
    double *values;
    size_t n, cap_series, cap_values;
    char **gauges; // metric names a "# TYPE NAME gauge" line declared
    size_t n_gauges, cap_gauges;
};

static int s_name_char(int c, int first) { return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c)); }

size_t bs_prom_name_len(const char *s) {
    size_t i = 0;
    while (s[i] && s_name_char((unsigned char)s[i], i == 0))
        i++;
    return i;
}

static int s_add(bs_prom_t *p, const char *series, size_t n, double v) {
    if (bs_grow(&p->series, &p->cap_series, p->n + 1, sizeof *p->series) < 0 ||
        bs_grow(&p->values, &p->cap_values, p->n + 1, sizeof *p->values) < 0 ||
        !(p->series[p->n] = strndup(series, n)))
        return -1;
    p->values[p->n++] = v;
    return 0;
}

// "# TYPE NAME gauge": NAME noted as a gauge. 0, or -1 out of memory.
static int s_type_line(bs_prom_t *p, const char *s, const char *e) {
    static const char tag[] = "# TYPE ";
    size_t tl = sizeof tag - 1;
    if ((size_t)(e - s) <= tl || memcmp(s, tag, tl))
        return 0;
    const char *name = s + tl, *q = name;
    while (q < e && s_name_char((unsigned char)*q, q == name))
        q++;
    const char *t = q;
    while (t < e && (*t == ' ' || *t == '\t'))
        t++;
    if (q == name || t == q || (size_t)(e - t) < 5 || memcmp(t, "gauge", 5) || (e - t > 5 && t[5] != ' ' && t[5] != '\t'))
        return 0;
    if (bs_grow(&p->gauges, &p->cap_gauges, p->n_gauges + 1, sizeof *p->gauges) < 0 ||
        !(p->gauges[p->n_gauges] = strndup(name, (size_t)(q - name))))
        return -1;
    p->n_gauges++;
    return 0;
}

// One line (without its end): 0 when it is a sample (added) or not one (skipped), -1 out of memory.
static int s_line(bs_prom_t *p, const char *s, const char *e) {
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    if (s < e && *s == '#')
        return s_type_line(p, s, e);
    if (s == e)
        return 0;
    const char *q = s;
    while (q < e && s_name_char((unsigned char)*q, q == s))
        q++;
    if (q == s)
        return 0;
    if (q < e && *q == '{') {  // labels: quoted values may hold '}' and escapes
        int quoted = 0;
        for (q++; q < e && (quoted || *q != '}'); q++) {
            if (quoted && *q == '\\')
                q++;
            else if (*q == '"')
                quoted = !quoted;
        }
        if (q >= e)
            return 0;
        q++;
    }
    const char *v = q;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    if (v == q || v == e)
        return 0;
    char num[64], *end;
    size_t len = (size_t)(e - v) < sizeof num - 1 ? (size_t)(e - v) : sizeof num - 1;
    memcpy(num, v, len);
    num[len] = 0;
    double value = strtod(num, &end);
    if (end == num || (*end && *end != ' ' && *end != '\t'))
        return 0;
    return s_add(p, s, (size_t)(q - s), value);
}

bs_prom_t *bs_prom_parse(const char *text, size_t n) {
    bs_prom_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    const char *s = text, *e = text + n;
    while (s < e) {
        const char *nl = memchr(s, '\n', (size_t)(e - s));
        const char *le = nl ? nl : e;
        if (le > s && le[-1] == '\r')
            le--;
        if (s_line(p, s, le) < 0) {
            bs_prom_destroy(&p);
            return NULL;
        }
        s = nl ? nl + 1 : e;
    }
    return p;
}

void bs_prom_destroy(bs_prom_t **pp) {
    bs_prom_t *p = *pp;
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++)
        free(p->series[i]);
    for (size_t i = 0; i < p->n_gauges; i++)
        free(p->gauges[i]);
    free(p->series);
    free(p->values);
    free(p->gauges);
    free(p);
    *pp = NULL;
}

size_t bs_prom_size(const bs_prom_t *p) { return p->n; }
const char *bs_prom_series(const bs_prom_t *p, size_t i) { return p->series[i]; }
double bs_prom_value(const bs_prom_t *p, size_t i) { return p->values[i]; }

bool bs_prom_is_gauge(const bs_prom_t *p, const char *series) {
    size_t len = bs_prom_name_len(series);
    for (size_t i = 0; i < p->n_gauges; i++)
        if (strlen(p->gauges[i]) == len && !memcmp(p->gauges[i], series, len))
            return true;
    return false;
}

int bs_prom_get(const bs_prom_t *p, const char *series, double *value) {
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->series[i], series)) {
            *value = p->values[i];
            return 0;
        }
    return -1;
}
