// JSON value location by skipping: strings are skipped by their escapes, containers by
// counting brackets outside strings.
#include "jscan.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

static const char *s_ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

// Past the string that opens at p (*p == '"'); NULL when it does not close.
static const char *s_skip_string(const char *p, const char *e) {
    for (p++; p < e; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

// Past the value that starts at p; NULL when it is truncated or empty.
static const char *s_skip_value(const char *p, const char *e) {
    if (p >= e)
        return NULL;
    if (*p == '"')
        return s_skip_string(p, e);
    if (*p == '{' || *p == '[') {
        size_t depth = 0;
        while (p < e) {
            char c = *p;
            if (c == '"') {
                if (!(p = s_skip_string(p, e)))
                    return NULL;
                continue;
            }
            if (c == '{' || c == '[')
                depth++;
            else if ((c == '}' || c == ']') && --depth == 0)
                return p + 1;
            p++;
        }
        return NULL;
    }
    const char *start = p;
    while (p < e && !strchr(",}] \t\r\n", *p))
        p++;
    return p > start ? p : NULL;
}

// After an item of an object or array that ends at p: the next item (past its ','); NULL at
// the container's end or on anything else.
static const char *s_next(const char *p, const char *e) {
    p = s_ws(p, e);
    return p < e && *p == ',' ? s_ws(p + 1, e) : NULL;
}

int bs_json_root(const char *text, size_t n, bs_span_t *out) {
    const char *e = text + n, *p = s_ws(text, e);
    while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' || e[-1] == '\n'))
        e--;
    if (p == e)
        return -1;
    *out = (bs_span_t){p, (size_t)(e - p)};
    return 0;
}

int bs_json_member(bs_span_t obj, const char *key, bs_span_t *out) {
    const char *p = obj.p, *e = obj.p + obj.n;
    size_t klen = strlen(key);
    if (p >= e || *p != '{')
        return -1;
    for (p = s_ws(p + 1, e); p < e && *p == '"';) {
        const char *kend = s_skip_string(p, e);
        if (!kend)
            return -1;
        // Keys compare as raw bytes: the keys looked up here have no escapes.
        int match = (size_t)(kend - p) == klen + 2 && !memcmp(p + 1, key, klen);
        p = s_ws(kend, e);
        if (p >= e || *p != ':')
            return -1;
        const char *v = s_ws(p + 1, e), *vend = s_skip_value(v, e);
        if (!vend)
            return -1;
        if (match) {
            *out = (bs_span_t){v, (size_t)(vend - v)};
            return 0;
        }
        if (!(p = s_next(vend, e)))
            return -1;
    }
    return -1;
}

int bs_json_element(bs_span_t arr, size_t i, bs_span_t *out) {
    const char *p = arr.p, *e = arr.p + arr.n;
    if (p >= e || *p != '[')
        return -1;
    for (p = s_ws(p + 1, e); p < e && *p != ']';) {
        const char *vend = s_skip_value(p, e);
        if (!vend)
            return -1;
        if (!i--) {
            *out = (bs_span_t){p, (size_t)(vend - p)};
            return 0;
        }
        if (!(p = s_next(vend, e)))
            return -1;
    }
    return -1;
}

int bs_json_is_null(bs_span_t v) { return v.n == 4 && !memcmp(v.p, "null", 4); }

int bs_json_int(bs_span_t v, long long *out) {
    size_t i = v.n && v.p[0] == '-';
    if (i == v.n || v.n > 19)
        return -1;
    long long x = 0;
    for (; i < v.n; i++) {
        if (v.p[i] < '0' || v.p[i] > '9')
            return -1;
        x = x * 10 + (v.p[i] - '0');
    }
    *out = v.p[0] == '-' ? -x : x;
    return 0;
}

char *bs_json_string_dup(bs_span_t v) {
    if (v.n < 2 || v.p[0] != '"')
        return NULL;
    cJSON *s = cJSON_ParseWithLength(v.p, v.n);
    char *out = cJSON_IsString(s) ? strdup(s->valuestring) : NULL;
    cJSON_Delete(s);
    return out;
}
