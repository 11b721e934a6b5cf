// grammar_schema — a JSON schema, or "any JSON object", as a regex (the Outlines approach); see
// grammar.h and docs/structured-output.md for the subset.
//
// Whitespace policy: none, except one optional space after ':' and after ',' (the two places
// models trained on json.dumps output put one). Numbers are bounded so that every output parses
// as a 64-bit integer or a finite double: integers up to 18 digits, fractions up to 16, exponents
// up to 2 digits. Strings are JSON strings of well-formed UTF-8 whose \u escapes are never
// surrogates (a lone one would not parse). Objects list their properties in schema order, the
// required ones always, the others optionally; additionalProperties is taken as false when
// properties are given (OpenAI's strict mode requires exactly that).
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

#define S_WS "[ ]?"
#define S_STRING_CHAR "([^\"\\\\\\x00-\\x1f]|\\\\[\"\\\\/bfnrt]|\\\\u([0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))"
#define S_STRING "\"" S_STRING_CHAR "*\""
#define S_INT_PART "-?(0|[1-9][0-9]{0,17})"
#define S_INTEGER S_INT_PART
#define S_NUMBER S_INT_PART "(\\.[0-9]{1,16})?([eE][+-]?[0-9]{1,2})?"
#define S_BOOLEAN "(true|false)"
#define S_NULL "null"

typedef struct {
    const json_t *root;
    ls_buf_t out;
    char path[256];
    char *err;
    size_t errlen;
    int failed;
} s_ctx_t;

static int s_fail(s_ctx_t *x, const char *fmt, ...) {
    if (x->failed)
        return -1;
    x->failed = 1;
    int n = snprintf(x->err, x->errlen, "json_schema at %s: ", x->path[0] ? x->path : "/");
    if (n >= 0 && (size_t)n < x->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->err + n, x->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// A recursive schema unrolls until the depth bound, and arrays and optional properties copy
// their parts: the regex is bounded in bytes, so such a schema is refused before it costs much.
enum { S_MAX_REGEX = 4 * 1024 * 1024 };

static int s_put(s_ctx_t *x, const char *s) {
    if (x->out.n > S_MAX_REGEX)
        return s_fail(x, "the schema expands past 4 MB of regex (recursive or too large)");
    if (ls_buf_append(&x->out, s, strlen(s)) < 0)
        return s_fail(x, "out of memory");
    return 0;
}

// The regex written since offset at, taken out of x (malloc'd; NULL + the error on out of memory),
// for parts that are repeated or rearranged.
static char *s_cut(s_ctx_t *x, size_t at) {
    char *part = strndup(x->out.s + at, x->out.n - at);
    if (!part)
        s_fail(x, "out of memory");
    x->out.n = at;
    return part;
}

static int s_value(s_ctx_t *x, const json_t *schema, int depth);

// Any JSON value nested at most depth deep (0: scalars only).
static int s_any(s_ctx_t *x, int depth) {
    if (s_put(x, "(" S_STRING "|" S_NUMBER "|" S_BOOLEAN "|" S_NULL) < 0)
        return -1;
    if (depth > 0) {
        // an object of any members, then an array of any items, one level down
        if (s_put(x, "|\\{(" S_STRING ":" S_WS) < 0 || s_any(x, depth - 1) < 0 ||
            s_put(x, "(," S_WS S_STRING ":" S_WS) < 0 || s_any(x, depth - 1) < 0 || s_put(x, ")*)?\\}") < 0)
            return -1;
        if (s_put(x, "|\\[(") < 0 || s_any(x, depth - 1) < 0 || s_put(x, "(," S_WS) < 0 || s_any(x, depth - 1) < 0 ||
            s_put(x, ")*)?\\]") < 0)
            return -1;
    }
    return s_put(x, ")");
}

// A JSON value exactly as jansson writes it compactly, as a regex.
static int s_literal(s_ctx_t *x, const json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    char *e = s ? ls_grammar_regex_escape(s, strlen(s)) : NULL;
    int rc = e ? s_put(x, e) : s_fail(x, "out of memory");
    free(s);
    free(e);
    return rc;
}

// Pushes /key onto the path for the error messages; returns the old length to restore.
static size_t s_path_push(s_ctx_t *x, const char *key) {
    size_t n = strlen(x->path);
    snprintf(x->path + n, sizeof x->path - n, "/%s", key);
    return n;
}

static int s_path_pop(s_ctx_t *x, size_t n, int rc) {
    x->path[n] = 0;
    return rc;
}

static int s_count(s_ctx_t *x, const json_t *schema, const char *key, long long *v) {
    const json_t *k = json_object_get(schema, key);
    if (!k)
        return 0;
    // a client's parser may have read it as a real (JSON has one number type): 3.0 is 3
    double d = json_number_value(k);
    if (!json_is_number(k) || d < 0 || d != (double)(long long)d)
        return s_fail(x, "'%s' must be a non-negative integer", key);
    *v = (long long)d;
    return 1;
}

static int s_string(s_ctx_t *x, const json_t *schema) {
    long long lo = 0, hi = -1;
    if (s_count(x, schema, "minLength", &lo) < 0 || s_count(x, schema, "maxLength", &hi) < 0)
        return -1;
    const json_t *fmt = json_object_get(schema, "format");
    if (fmt) {
        static const char *const formats[][2] = {
            {"date", "\"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])\""},
            {"time", "\"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?\""},
            {"date-time", "\"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
                          "(\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])\""},
            {"uuid", "\"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\""},
        };
        for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
            if (json_is_string(fmt) && !strcmp(json_string_value(fmt), formats[i][0]))
                return s_put(x, formats[i][1]);
        return s_fail(x, "'format' %s is not supported (date, time, date-time, uuid are)",
                      json_is_string(fmt) ? json_string_value(fmt) : "(not a string)");
    }
    if (hi >= 0 && hi < lo)
        return s_fail(x, "maxLength is below minLength");
    if (lo > 1000 || hi > 1000)
        return s_fail(x, "string lengths above 1000 are not supported");
    if (lo == 0 && hi < 0)
        return s_put(x, S_STRING);
    char q[64];
    if (hi < 0)
        snprintf(q, sizeof q, "{%lld,}\"", lo);
    else
        snprintf(q, sizeof q, "{%lld,%lld}\"", lo, hi);
    return s_put(x, "\"" S_STRING_CHAR) < 0 ? -1 : s_put(x, q);
}

static int s_array(s_ctx_t *x, const json_t *schema, int depth) {
    long long lo = 0, hi = -1;
    if (s_count(x, schema, "minItems", &lo) < 0 || s_count(x, schema, "maxItems", &hi) < 0)
        return -1;
    if (hi >= 0 && hi < lo)
        return s_fail(x, "maxItems is below minItems");
    if (lo > 100 || hi > 100)
        return s_fail(x, "item counts above 100 are not supported");
    if (json_object_get(schema, "prefixItems"))
        return s_fail(x, "'prefixItems' is not supported");
    if (hi == 0)
        return s_put(x, "\\[\\]");
    const json_t *items = json_object_get(schema, "items");
    // the item's regex, once, then copied for the repetition
    size_t at = x->out.n, p = s_path_push(x, "items");
    int rc = items ? s_value(x, items, depth - 1) : s_any(x, depth - 1 < LS_GRAMMAR_JSON_DEPTH - 1 ? depth - 1 : LS_GRAMMAR_JSON_DEPTH - 1);
    s_path_pop(x, p, rc);
    if (rc < 0)
        return -1;
    char *item = s_cut(x, at);
    if (!item)
        return -1;
    // lo == 0: [(item(,item){0,hi-1})?]; else [item(,item){lo-1,hi-1}]
    char q[64];
    if (hi < 0)
        snprintf(q, sizeof q, "){%lld,}", lo > 0 ? lo - 1 : 0);
    else
        snprintf(q, sizeof q, "){%lld,%lld}", lo > 0 ? lo - 1 : 0, hi - 1);
    rc = s_put(x, lo == 0 ? "\\[((" : "\\[(");
    if (rc == 0)
        rc = s_put(x, item);
    if (rc == 0)
        rc = s_put(x, ")(," S_WS "(");
    if (rc == 0)
        rc = s_put(x, item);
    if (rc == 0)
        rc = s_put(x, ")");
    if (rc == 0)
        rc = s_put(x, q);
    if (rc == 0)
        rc = s_put(x, lo == 0 ? ")?\\]" : "\\]");
    free(item);
    return rc;
}

// One property "name": value, into x.
static int s_property(s_ctx_t *x, const char *name, const json_t *schema, int depth) {
    json_t *k = json_string(name);
    size_t p = s_path_push(x, name);
    int rc = k ? s_literal(x, k) : s_fail(x, "out of memory");
    json_decref(k);
    if (rc == 0)
        rc = s_put(x, ":" S_WS);
    if (rc == 0)
        rc = s_value(x, schema, depth - 1);
    return s_path_pop(x, p, rc);
}

static int s_object(s_ctx_t *x, const json_t *schema, int depth) {
    const json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required");
    const json_t *extra = json_object_get(schema, "additionalProperties");
    if (props && !json_is_object(props))
        return s_fail(x, "'properties' must be an object");
    if (req && !json_is_array(req))
        return s_fail(x, "'required' must be a list");
    if (!props || !json_object_size(props)) {
        if (json_is_false(extra) || (req && json_array_size(req)))
            return req && json_array_size(req) ? s_fail(x, "'required' names properties the schema does not define")
                                               : s_put(x, "\\{\\}");
        // a map: any keys, each value of additionalProperties' schema (or any value)
        size_t at = x->out.n;
        int rc = json_is_object(extra) ? s_value(x, extra, depth - 1)
                                        : s_any(x, depth - 1 < LS_GRAMMAR_JSON_DEPTH - 1 ? depth - 1 : LS_GRAMMAR_JSON_DEPTH - 1);
        if (rc < 0)
            return -1;
        char *v = s_cut(x, at);
        if (!v)
            return -1;
        rc = s_put(x, "\\{(" S_STRING ":" S_WS "(");
        if (rc == 0)
            rc = s_put(x, v);
        if (rc == 0)
            rc = s_put(x, ")(," S_WS S_STRING ":" S_WS "(");
        if (rc == 0)
            rc = s_put(x, v);
        if (rc == 0)
            rc = s_put(x, "))*)?\\}");
        free(v);
        return rc;
    }
    size_t n = json_object_size(props);
    if (n > 64)
        return s_fail(x, "more than 64 properties are not supported");
    const char *names[64];
    int required[64] = {0};
    char *regex[64] = {0};
    size_t i = 0;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v) names[i++] = key;
    const json_t *r;
    size_t ri;
    json_array_foreach(req, ri, r) {
        if (!json_is_string(r))
            return s_fail(x, "'required' must list names");
        size_t j = 0;
        while (j < n && strcmp(names[j], json_string_value(r)))
            j++;
        if (j == n)
            return s_fail(x, "'required' names '%s', which is not in 'properties'", json_string_value(r));
        required[j] = 1;
    }
    int rc = 0;
    for (i = 0; i < n && rc == 0; i++) {
        size_t at = x->out.n;
        size_t p = s_path_push(x, "properties");
        rc = s_path_pop(x, p, s_property(x, names[i], json_object_get(props, names[i]), depth));
        if (rc == 0 && !(regex[i] = s_cut(x, at)))
            rc = -1;
    }
    // Alternatives by the first property present (every one before it optional), each followed
    // by the later ones, each of those ",prop" and optional unless required.
    if (rc == 0)
        rc = s_put(x, "\\{(");
    int first = 1, all_optional = 1;
    for (i = 0; i < n && rc == 0; i++) {
        rc = s_put(x, first ? "" : "|");
        first = 0;
        if (rc == 0)
            rc = s_put(x, regex[i]);
        for (size_t j = i + 1; j < n && rc == 0; j++) {
            rc = s_put(x, "(," S_WS);
            if (rc == 0)
                rc = s_put(x, regex[j]);
            if (rc == 0)
                rc = s_put(x, required[j] ? ")" : ")?");
        }
        if (required[i]) {
            all_optional = 0;
            break;
        }
    }
    if (rc == 0)
        rc = s_put(x, all_optional ? ")?\\}" : ")\\}");
    for (i = 0; i < n; i++)
        free(regex[i]);
    return rc;
}

// A local $ref ("#", "#/$defs/Name", "#/definitions/Name", any JSON pointer into the document).
static const json_t *s_ref(s_ctx_t *x, const char *ref) {
    if (ref[0] != '#') {
        s_fail(x, "'$ref' %s is not local (only refs into this schema, starting with '#')", ref);
        return NULL;
    }
    const json_t *at = x->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        p++;
        char key[256];
        size_t k = 0;
        while (*p && *p != '/' && k + 1 < sizeof key) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                key[k++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else
                key[k++] = *p++;
        }
        key[k] = 0;
        at = json_is_array(at) ? json_array_get(at, (size_t)strtoul(key, NULL, 10)) : json_object_get(at, key);
    }
    if (!at || *p)
        s_fail(x, "'$ref' %s points at nothing", ref);
    return at;
}

static int s_alternatives(s_ctx_t *x, const json_t *list, const char *kw, int depth) {
    if (!json_is_array(list) || !json_array_size(list))
        return s_fail(x, "'%s' must be a non-empty list", kw);
    int rc = s_put(x, "(");
    const json_t *e;
    size_t i;
    json_array_foreach(list, i, e) {
        if (rc == 0 && i)
            rc = s_put(x, "|");
        char idx[32];
        snprintf(idx, sizeof idx, "%s/%zu", kw, i);
        size_t p = s_path_push(x, idx);
        if (rc == 0)
            rc = s_path_pop(x, p, s_value(x, e, depth));
    }
    return rc < 0 ? -1 : s_put(x, ")");
}

// One schema type by name.
static int s_typed(s_ctx_t *x, const json_t *schema, const char *type, int depth) {
    if (!strcmp(type, "string"))
        return s_string(x, schema);
    if (!strcmp(type, "integer"))
        return s_put(x, S_INTEGER);
    if (!strcmp(type, "number"))
        return s_put(x, S_NUMBER);
    if (!strcmp(type, "boolean"))
        return s_put(x, S_BOOLEAN);
    if (!strcmp(type, "null"))
        return s_put(x, S_NULL);
    if (!strcmp(type, "array"))
        return depth > 0 ? s_array(x, schema, depth) : s_fail(x, "nested deeper than %d", LS_GRAMMAR_SCHEMA_DEPTH);
    if (!strcmp(type, "object"))
        return depth > 0 ? s_object(x, schema, depth) : s_fail(x, "nested deeper than %d", LS_GRAMMAR_SCHEMA_DEPTH);
    return s_fail(x, "unknown type '%s'", type);
}

// Keywords taken, and those that only annotate. Anything else constrains in a way this subset
// cannot promise, so it is refused rather than ignored.
static const char *const s_known[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "format",
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "strict", "name",
    "readOnly", "writeOnly", "deprecated", "discriminator",
};

static int s_value(s_ctx_t *x, const json_t *schema, int depth) {
    if (json_is_true(schema))
        return s_any(x, depth < LS_GRAMMAR_JSON_DEPTH - 1 ? depth : LS_GRAMMAR_JSON_DEPTH - 1);
    if (!json_is_object(schema))
        return s_fail(x, "a schema must be an object or true");
    if (depth < 0)
        return s_fail(x, "nested deeper than %d", LS_GRAMMAR_SCHEMA_DEPTH);
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)schema, key, v) {
        size_t i = 0;
        while (i < sizeof s_known / sizeof *s_known && strcmp(s_known[i], key))
            i++;
        if (i == sizeof s_known / sizeof *s_known)
            return s_fail(x, "'%s' is not supported", key);
    }
    const json_t *ref = json_object_get(schema, "$ref");
    if (ref) {
        if (!json_is_string(ref))
            return s_fail(x, "'$ref' must be a string");
        const json_t *to = s_ref(x, json_string_value(ref));
        return to ? s_value(x, to, depth - 1) : -1;
    }
    const json_t *c = json_object_get(schema, "const");
    if (c)
        return s_literal(x, c);
    const json_t *en = json_object_get(schema, "enum");
    if (en) {
        if (!json_is_array(en) || !json_array_size(en))
            return s_fail(x, "'enum' must be a non-empty list");
        int rc = s_put(x, "(");
        const json_t *e;
        size_t i;
        json_array_foreach(en, i, e) {
            if (rc == 0 && i)
                rc = s_put(x, "|");
            if (rc == 0)
                rc = s_literal(x, e);
        }
        return rc < 0 ? -1 : s_put(x, ")");
    }
    const json_t *alt = json_object_get(schema, "anyOf");
    if (alt)
        return s_alternatives(x, alt, "anyOf", depth);
    // oneOf as anyOf: the alternatives of typical schemas do not overlap, and checking that they
    // never do is not regular
    if ((alt = json_object_get(schema, "oneOf")))
        return s_alternatives(x, alt, "oneOf", depth);
    if ((alt = json_object_get(schema, "allOf"))) {
        if (!json_is_array(alt) || json_array_size(alt) != 1)
            return s_fail(x, "'allOf' is supported with one schema only");
        return s_value(x, json_array_get(alt, 0), depth);
    }
    const json_t *type = json_object_get(schema, "type");
    if (json_is_string(type))
        return s_typed(x, schema, json_string_value(type), depth);
    if (json_is_array(type) && json_array_size(type)) {
        int rc = s_put(x, "(");
        const json_t *e;
        size_t i;
        json_array_foreach(type, i, e) {
            if (!json_is_string(e))
                return s_fail(x, "'type' must be a name or a list of names");
            if (rc == 0 && i)
                rc = s_put(x, "|");
            if (rc == 0)
                rc = s_typed(x, schema, json_string_value(e), depth);
        }
        return rc < 0 ? -1 : s_put(x, ")");
    }
    if (type)
        return s_fail(x, "'type' must be a name or a list of names");
    if (json_object_get(schema, "properties"))
        return s_object(x, schema, depth);
    return s_any(x, depth < LS_GRAMMAR_JSON_DEPTH - 1 ? depth : LS_GRAMMAR_JSON_DEPTH - 1);
}

char *ls_grammar_schema_regex(const char *schema, size_t len, char *err, size_t errlen) {
    if (!schema) // no source (a message's unset text field): the empty one, which is not JSON
        schema = "";
    if (len > LS_GRAMMAR_MAX_SOURCE) {
        snprintf(err, errlen, "json_schema: longer than %d bytes", LS_GRAMMAR_MAX_SOURCE);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!root) {
        snprintf(err, errlen, "json_schema: not JSON (%s at line %d)", je.text, je.line);
        return NULL;
    }
    s_ctx_t x = {.root = root, .err = err, .errlen = errlen};
    int rc = s_value(&x, root, LS_GRAMMAR_SCHEMA_DEPTH);
    json_decref(root);
    if (rc < 0) {
        ls_buf_free(&x.out);
        return NULL;
    }
    return x.out.s;
}

char *ls_grammar_json_object_regex(void) {
    char err[64];
    s_ctx_t x = {.err = err, .errlen = sizeof err};
    if (s_put(&x, "\\{(" S_STRING ":" S_WS) < 0 || s_any(&x, LS_GRAMMAR_JSON_DEPTH - 1) < 0 ||
        s_put(&x, "(," S_WS S_STRING ":" S_WS) < 0 || s_any(&x, LS_GRAMMAR_JSON_DEPTH - 1) < 0 ||
        s_put(&x, ")*)?\\}") < 0) {
        ls_buf_free(&x.out);
        return NULL;
    }
    return x.out.s;
}

ls_grammar_t *ls_grammar_compile_kind(ls_grammar_src_t kind, const char *src, size_t len, char *err,
                                      size_t errlen) {
    char *re = NULL;
    switch (kind) {
    case LS_GRAMMAR_SRC_REGEX: return ls_grammar_compile(src, len, err, errlen);
    case LS_GRAMMAR_SRC_JSON_SCHEMA: re = ls_grammar_schema_regex(src, len, err, errlen); break;
    case LS_GRAMMAR_SRC_JSON_OBJECT:
        if (!(re = ls_grammar_json_object_regex()))
            snprintf(err, errlen, "out of memory");
        break;
    default: snprintf(err, errlen, "unknown grammar kind %d", (int)kind); return NULL;
    }
    if (!re)
        return NULL;
    // the expansion of a valid schema may be longer than a regex source may be: the NFA and DFA
    // bounds still hold it
    ls_grammar_t *g = ls_grammar_compile_unbounded(re, strlen(re), err, errlen);
    free(re);
    return g;
}
