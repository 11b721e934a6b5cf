// Structured output's automata (text/grammar.h): regexes against POSIX regexec, schemas by
// the JSON their DFAs generate (parsed by jansson and checked by a small validator here),
// token masks against brute force, and the bounds on hostile sources.
#include <jansson.h>
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "grammar.h"
#include "tokenizer.h"

static uint64_t s_rng = 0x9e3779b97f4a7c15ull;

static uint32_t s_rand(void) {
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t)(s_rng >> 11);
}

static ls_grammar_t *s_compile(const char *re) {
    char err[256] = "";
    ls_grammar_t *g = ls_grammar_compile(re, strlen(re), err, sizeof err);
    if (!g)
        fprintf(stderr, "compile %s: %s\n", re, err);
    assert_non_null(g);
    return g;
}

// Shortest distance (in bytes) from each state to an accepting one, for walks that must end.
static int *s_dist(const ls_grammar_t *g) {
    int n = ls_grammar_n_states(g);
    int *d = malloc((size_t)n * sizeof *d);
    for (int i = 0; i < n; i++)
        d[i] = ls_grammar_accepting(g, i) ? 0 : 1 << 29;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < n; i++)
            for (int b = 0; b < 256; b++) {
                int t = ls_grammar_step(g, i, (uint8_t)b);
                if (t >= 0 && d[t] + 1 < d[i]) {
                    d[i] = d[t] + 1;
                    changed = 1;
                }
            }
    }
    return d;
}

// A random string of g's language into out (cap bytes); returns its length. Past `soft`
// bytes the walk heads for the nearest accepting state.
static size_t s_generate(const ls_grammar_t *g, const int *dist, char *out, size_t cap, size_t soft) {
    int s = ls_grammar_start(g);
    size_t n = 0;
    for (;;) {
        if (ls_grammar_accepting(g, s) && (ls_grammar_final(g, s) || s_rand() % 8 == 0 || n >= soft))
            return n;
        int cand[256], k = 0;
        for (int b = 0; b < 256; b++) {
            int t = ls_grammar_step(g, s, (uint8_t)b);
            if (t >= 0 && (n < soft || dist[t] < dist[s]))
                cand[k++] = b;
        }
        assert_true(k > 0);
        assert_true(n + 1 < cap);
        int b = cand[s_rand() % (unsigned)k];
        out[n++] = (char)b;
        s = ls_grammar_step(g, s, (uint8_t)b);
    }
}

// ---- regex vs POSIX -------------------------------------------------------------------------

static void test_regex_vs_posix(void **state) {
    (void)state;
    // ERE-compatible patterns of the subset (no \d \w \s, which ERE lacks)
    static const char *const pats[] = {
        "a",        "ab|cd",        "(ab)*c",        "a+b?c*",        "[a-c]+x",    "[^ab]*",
        "(a|b)*abb", "a{2,3}b{0,2}", "(ab|a)(bc|c)", "x(y|z){3}",     "[abc]{1,}d", "(a*b*)*c",
        "a.b",       "\\.\\*[.]",   "(a|)b",         "((a|b)c){0,2}", "[-a]+",      "a(b(c(d)?)?)?",
    };
    const char alpha[] = "abcdxyz.*-";
    for (size_t p = 0; p < sizeof pats / sizeof *pats; p++) {
        ls_grammar_t *g = s_compile(pats[p]);
        char anchored[128];
        snprintf(anchored, sizeof anchored, "^(%s)$", pats[p]);
        regex_t re;
        assert_int_equal(regcomp(&re, anchored, REG_EXTENDED | REG_NOSUB), 0);
        int *dist = s_dist(g);
        int agree = 0, pos = 0;
        for (int i = 0; i < 3000; i++) {
            char s[32];
            size_t n;
            if (i % 2) {
                n = s_rand() % 9;
                for (size_t j = 0; j < n; j++)
                    s[j] = alpha[s_rand() % (sizeof alpha - 1)];
            } else
                n = s_generate(g, dist, s, sizeof s, 12);
            s[n] = 0;
            int ascii = 1;
            for (size_t j = 0; j < n; j++)
                ascii &= (unsigned char)s[j] < 0x80 && s[j];
            if (!ascii)
                continue;  // POSIX in the C locale counts bytes, not characters; a C string ends at NUL
            int want = regexec(&re, s, 0, NULL, 0) == 0;
            int got = ls_grammar_matches(g, s, n);
            if (want != got)
                fprintf(stderr, "pattern %s on '%s': posix %d, ours %d\n", pats[p], s, want, got);
            assert_int_equal(want, got);
            agree++;
            pos += got;
        }
        assert_true(pos > 100);  // the generated half matches
        free(dist);
        regfree(&re);
        ls_grammar_destroy(&g);
    }
}

static void test_regex_classes_utf8(void **state) {
    (void)state;
    ls_grammar_t *g = s_compile("^\\d{3}-\\w+\\s[^x]\\u00e9.$");
    assert_true(ls_grammar_matches(g, "123-ab_9 y\xc3\xa9z", 13));
    assert_true(ls_grammar_matches(g, "123-a \xe2\x82\xac\xc3\xa9\xf0\x9f\x98\x80", 15));  // € é 😀
    assert_false(ls_grammar_matches(g, "123-a x\xc3\xa9z", 10));
    assert_false(ls_grammar_matches(g, "123-a y\xc3\xa9\n", 10));
    assert_false(ls_grammar_matches(g, "123-a y\xc3\xa9\xc3", 10));       // half a character
    assert_false(ls_grammar_matches(g, "123-a y\xc3\xa9\xed\xa0\x80", 12));  // a surrogate
    // final: accepting with nowhere to go
    int s = ls_grammar_walk(g, 0, "12", 2);
    assert_true(s >= 0 && !ls_grammar_accepting(g, s) && !ls_grammar_final(g, s));
    ls_grammar_destroy(&g);
    g = s_compile("(yes|no)");
    s = ls_grammar_walk(g, 0, "yes", 3);
    assert_true(ls_grammar_final(g, s));
    assert_int_equal(ls_grammar_walk(g, 0, "yep", 3), -1);
    ls_grammar_destroy(&g);
    char *e = ls_grammar_regex_escape("a.b*(c)", 7);
    g = s_compile(e);
    assert_true(ls_grammar_matches(g, "a.b*(c)", 7));
    assert_false(ls_grammar_matches(g, "axb*(c)", 7));
    free(e);
    ls_grammar_destroy(&g);
}

static void test_regex_refused(void **state) {
    (void)state;
    static const char *const bad[] = {
        "(a",       "a)",   "[ab",      "a{3,2}",   "a{1001}", "(?=a)", "\\1",     "a^b",         "*a",
        "[z-a]",    "\\",   "[^\\u00e9]", "[\\u00e0-\\u00ff]", "(a|b)*a(a|b){17}", "((a{1000}){1000}){1000}",
        "(((((){1000}){1000}){1000}){1000}){1000}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        clock_t t0 = clock();
        ls_grammar_t *g = ls_grammar_compile(bad[i], strlen(bad[i]), err, sizeof err);
        double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
        if (g)
            fprintf(stderr, "accepted: %s\n", bad[i]);
        assert_null(g);
        assert_true(strncmp(err, "regex: ", 7) == 0);
        assert_true(secs < 5.0);  // bounded, never a hang
    }
    char *huge = malloc(LS_GRAMMAR_MAX_SOURCE + 2);
    memset(huge, 'a', LS_GRAMMAR_MAX_SOURCE + 1);
    char err[256];
    assert_null(ls_grammar_compile(huge, LS_GRAMMAR_MAX_SOURCE + 1, err, sizeof err));
    free(huge);
}

// A source that is absent (NULL, 0: a message's unset text field) is the empty one: the empty
// regex matches only "", the empty schema is not JSON.
static void test_absent_source(void **state) {
    (void)state;
    char err[256] = "";
    ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_REGEX, NULL, 0, err, sizeof err);
    assert_non_null(g);
    assert_true(ls_grammar_matches(g, "", 0));
    assert_false(ls_grammar_matches(g, "a", 1));
    ls_grammar_destroy(&g);
    assert_null(ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_SCHEMA, NULL, 0, err, sizeof err));
    assert_non_null(strstr(err, "not JSON"));
}

// ---- JSON schema ----------------------------------------------------------------------------

// Whether v validates against schema (the subset grammar.h supports), refs resolved in root.
static int s_valid(const json_t *root, const json_t *schema, const json_t *v) {
    if (json_is_true(schema))
        return 1;
    const json_t *ref = json_object_get(schema, "$ref");
    if (ref) {
        const char *p = json_string_value(ref);
        const json_t *at = root;
        char key[128];
        while (*p == '#' || *p == '/') {
            if (*p++ == '#')
                continue;
            size_t k = 0;
            while (*p && *p != '/')
                key[k++] = *p++;
            key[k] = 0;
            at = json_object_get(at, key);
        }
        return s_valid(root, at, v);
    }
    const json_t *c = json_object_get(schema, "const");
    if (c)
        return json_equal(c, v);
    const json_t *en = json_object_get(schema, "enum"), *e;
    size_t i;
    if (en) {
        json_array_foreach(en, i, e) if (json_equal(e, v)) return 1;
        return 0;
    }
    const json_t *any = json_object_get(schema, "anyOf");
    if (!any)
        any = json_object_get(schema, "oneOf");
    if (any) {
        json_array_foreach(any, i, e) if (s_valid(root, e, v)) return 1;
        return 0;
    }
    const json_t *type = json_object_get(schema, "type");
    if (json_is_array(type)) {
        json_array_foreach(type, i, e) {
            json_t *one = json_deep_copy(schema);
            json_object_set(one, "type", (json_t *)e);
            int ok = s_valid(root, one, v);
            json_decref(one);
            if (ok)
                return 1;
        }
        return 0;
    }
    const char *t = json_string_value(type);
    if (!t)
        return 1;
    if (!strcmp(t, "string")) {
        if (!json_is_string(v))
            return 0;
        // lengths in characters
        size_t nchar = 0, n = json_string_length(v);
        const unsigned char *s = (const unsigned char *)json_string_value(v);
        for (size_t k = 0; k < n; k++)
            nchar += (s[k] & 0xC0) != 0x80;
        const json_t *lo = json_object_get(schema, "minLength"), *hi = json_object_get(schema, "maxLength");
        return (!lo || (json_int_t)nchar >= json_integer_value(lo)) && (!hi || (json_int_t)nchar <= json_integer_value(hi));
    }
    if (!strcmp(t, "integer"))
        return json_is_integer(v);
    if (!strcmp(t, "number"))
        return json_is_number(v);
    if (!strcmp(t, "boolean"))
        return json_is_boolean(v);
    if (!strcmp(t, "null"))
        return json_is_null(v);
    if (!strcmp(t, "array")) {
        if (!json_is_array(v))
            return 0;
        const json_t *lo = json_object_get(schema, "minItems"), *hi = json_object_get(schema, "maxItems");
        if ((lo && (json_int_t)json_array_size(v) < json_integer_value(lo)) ||
            (hi && (json_int_t)json_array_size(v) > json_integer_value(hi)))
            return 0;
        const json_t *items = json_object_get(schema, "items");
        json_array_foreach(v, i, e) if (items && !s_valid(root, items, e)) return 0;
        return 1;
    }
    if (!strcmp(t, "object")) {
        if (!json_is_object(v))
            return 0;
        const json_t *props = json_object_get(schema, "properties"), *req = json_object_get(schema, "required");
        json_array_foreach(req, i, e) if (!json_object_get(v, json_string_value(e))) return 0;
        const char *k;
        json_object_foreach((json_t *)v, k, e) {
            const json_t *ps = props ? json_object_get(props, k) : NULL;
            if (props && !ps)
                return 0;  // strict: additionalProperties false
            if (ps && !s_valid(root, ps, e))
                return 0;
        }
        return 1;
    }
    return 0;
}

static const char *const s_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":[\"string\",\"null\"]},"
    "\"c\":{\"enum\":[\"x\",\"y z\",1,null]}},\"required\":[]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
    "{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/pt\"},\"tags\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\",\"minLength\":1}}},\"required\":[\"p\",\"tags\"],\"$defs\":{\"pt\":"
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"const\":\"fixed\"}},"
    "\"required\":[\"x\",\"y\"],\"additionalProperties\":false}}}",
    "{\"anyOf\":[{\"type\":\"string\",\"format\":\"date\"},{\"type\":\"object\",\"properties\":{\"id\":"
    "{\"type\":\"string\",\"format\":\"uuid\"}},\"required\":[\"id\"]}]}",
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
    "{}",
};

static void test_schema_instances(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof s_schemas / sizeof *s_schemas; k++) {
        char err[256] = "";
        ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_SCHEMA, s_schemas[k], strlen(s_schemas[k]), err, sizeof err);
        if (!g)
            fprintf(stderr, "schema %zu: %s\n", k, err);
        assert_non_null(g);
        json_t *schema = json_loads(s_schemas[k], 0, NULL);
        int *dist = s_dist(g);
        for (int i = 0; i < 300; i++) {
            char buf[4096];
            size_t n = s_generate(g, dist, buf, sizeof buf, 200);
            json_error_t je;
            json_t *v = json_loadb(buf, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!v || !s_valid(schema, schema, v))
                fprintf(stderr, "schema %zu generated %.*s (%s)\n", k, (int)n, buf, v ? "invalid" : je.text);
            assert_non_null(v);
            assert_true(s_valid(schema, schema, v));
            json_decref(v);
        }
        free(dist);
        json_decref(schema);
        ls_grammar_destroy(&g);
    }
}

static void test_schema_matches(void **state) {
    (void)state;
    static const struct {
        int schema;
        const char *text;
        int ok;
    } cases[] = {
        {0, "{\"name\":\"bob\",\"age\":42}", 1},
        {0, "{\"name\": \"bob\", \"age\": -7, \"ok\": true}", 1},
        {0, "{\"age\":42,\"name\":\"bob\"}", 0},        // order is the schema's
        {0, "{\"name\":\"bob\"}", 0},                   // age required
        {0, "{\"name\":\"bob\",\"age\":4.5}", 0},       // integer
        {0, "{\"name\":\"123456789\",\"age\":1}", 0},   // maxLength 8
        {0, "{\"name\":\"bob\",\"age\":1,\"x\":1}", 0}, // no additional properties
        {0, "{ \"name\":\"bob\",\"age\":1}", 0},        // whitespace policy
        {1, "{}", 1},
        {1, "{\"c\":\"y z\"}", 1},
        {1, "{\"b\":null,\"c\":1}", 1},
        {1, "{\"c\":2}", 0},
        {1, "{\"a\":1e5,\"b\":\"\\u00e9\\n\"}", 1},
        {1, "{\"b\":\"\\ud800\"}", 0},  // a lone surrogate would not parse
        {2, "[]", 0},
        {2, "[1,2,3]", 1},
        {2, "[1,2,3,4]", 0},
        {4, "\"2024-02-30\"", 1},
        {4, "\"2024-13-01\"", 0},
        {4, "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\"}", 1},
        {5, "{\"k\": 1, \"j\": 2}", 1},
        {5, "{\"k\": \"1\"}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *s = s_schemas[cases[i].schema];
        char err[256];
        ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_SCHEMA, s, strlen(s), err, sizeof err);
        assert_non_null(g);
        if (ls_grammar_matches(g, cases[i].text, strlen(cases[i].text)) != cases[i].ok)
            fprintf(stderr, "case %zu: %s\n", i, cases[i].text);
        assert_int_equal(ls_grammar_matches(g, cases[i].text, strlen(cases[i].text)), cases[i].ok);
        ls_grammar_destroy(&g);
    }
}

static void test_json_object(void **state) {
    (void)state;
    char err[256];
    clock_t t0 = clock();
    ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_OBJECT, NULL, 0, err, sizeof err);
    printf("json_object: %d DFA states, compiled in %.1f ms\n", g ? ls_grammar_n_states(g) : -1,
           1e3 * (double)(clock() - t0) / CLOCKS_PER_SEC);
    assert_non_null(g);
    assert_true(ls_grammar_matches(g, "{\"a\":[1,{\"b\":null}],\"c\":\"d\"}", 28));
    assert_false(ls_grammar_matches(g, "[1]", 3));
    assert_false(ls_grammar_matches(g, "{\"a\":[[[[[1]]]]]}", 17));  // deeper than the bound
    int *dist = s_dist(g);
    for (int i = 0; i < 300; i++) {
        char buf[4096];
        size_t n = s_generate(g, dist, buf, sizeof buf, 100);
        json_t *v = json_loadb(buf, n, JSON_ALLOW_NUL, NULL);
        assert_non_null(v);
        assert_true(json_is_object(v));
        json_decref(v);
    }
    free(dist);
    ls_grammar_destroy(&g);
}

static void test_schema_refused(void **state) {
    (void)state;
    static const struct {
        const char *schema, *says;
    } bad[] = {
        {"{\"type\":\"strin\"}", "at /: unknown type"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}",
         "at /properties/a: 'pattern' is not supported"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "'required' names 'b'"},
        {"{\"$ref\":\"#/$defs/nope\"}", "points at nothing"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"$ref\":\"#\"}}}", "nested deeper"},
        {"{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}", "nested deeper"},
        {"{\"type\":\"integer\",\"minimum\":3}", "'minimum' is not supported"},
        {"not json", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char err[256] = "";
        clock_t t0 = clock();
        ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_SCHEMA, bad[i].schema, strlen(bad[i].schema), err, sizeof err);
        if (g || !strstr(err, bad[i].says))
            fprintf(stderr, "schema %s: %s\n", bad[i].schema, g ? "accepted" : err);
        assert_null(g);
        assert_non_null(strstr(err, bad[i].says));
        assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 5.0);
    }
}

// ---- token masks ----------------------------------------------------------------------------

static void test_masks_vs_brute_force(void **state) {
    (void)state;
    enum { V = 300 };
    char *toks[V];
    uint32_t lens[V];
    const char alpha[] = "{}\":, ab1-.e";
    for (int v = 0; v < V; v++) {
        lens[v] = v < 4 ? 0 : 1 + s_rand() % 4;  // ids 0-3: specials, no bytes
        toks[v] = malloc(lens[v] + 1);
        for (uint32_t i = 0; i < lens[v]; i++)
            toks[v][i] = alpha[s_rand() % (sizeof alpha - 1)];
    }
    ls_token_masker_t *m = ls_token_masker_new(V, (const char *const *)toks, lens, 1 << 12);
    assert_non_null(m);
    const char *sch = s_schemas[1];
    char err[256];
    ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_SCHEMA, sch, strlen(sch), err, sizeof err);
    assert_non_null(g);
    for (int st = 0; st < ls_grammar_n_states(g); st++) {
        const uint32_t *mask = ls_token_masker_mask(m, g, st);
        assert_non_null(mask);
        for (int v = 0; v < V; v++) {
            int want = lens[v] && ls_grammar_walk(g, st, toks[v], lens[v]) >= 0;
            assert_int_equal(want, (int)((mask[v >> 5] >> (v & 31)) & 1));
        }
    }
    // a small cache evicts, and a mask served again equals the first
    assert_true(ls_token_masker_bytes(m) <= (1 << 12) + 256);
    const uint32_t *a = ls_token_masker_mask(m, g, 0);
    uint32_t copy[(V + 31) / 32];
    memcpy(copy, a, sizeof copy);
    for (int st = 1; st < ls_grammar_n_states(g); st++)
        ls_token_masker_mask(m, g, st);
    assert_memory_equal(ls_token_masker_mask(m, g, 0), copy, sizeof copy);
    assert_true(ls_token_masker_hits(m) + ls_token_masker_misses(m) > 0);
    ls_token_masker_detach(m, g);
    assert_int_equal(ls_token_masker_bytes(m), 0);
    ls_grammar_destroy(&g);
    ls_token_masker_destroy(&m);
    for (int v = 0; v < V; v++)
        free(toks[v]);
}

// The mask cost on the demo vocabulary and on a 128k-entry synthetic one, printed (not timed).
static void test_mask_cost(void **state) {
    (void)state;
    char err[256];
    ls_tokenizer_t *t = ls_tokenizer_load(LS_DEMO_DIR "/tokenizer.json", err, sizeof err);
    assert_non_null(t);
    int32_t V = ls_tokenizer_vocab_size(t);
    const char **toks = calloc((size_t)V, sizeof *toks);
    uint32_t *lens = calloc((size_t)V, sizeof *lens);
    for (int32_t v = 0; v < V; v++) {
        size_t n;
        toks[v] = ls_tokenizer_token_bytes(t, v, &n);
        lens[v] = (uint32_t)n;
    }
    assert_int_equal(lens[0], 0);  // <|begin_of_text|> is special
    assert_true(lens[ls_tokenizer_token_to_id(t, "{")] == 1);
    ls_grammar_t *g = ls_grammar_compile_kind(LS_GRAMMAR_SRC_JSON_OBJECT, NULL, 0, err, sizeof err);
    assert_non_null(g);
    for (int big = 0; big < 2; big++) {
        int32_t n = V;
        char **syn = NULL;
        ls_token_masker_t *m;
        if (big) {  // 128k tokens of 1-8 printable bytes, as a large BPE vocabulary spreads them
            n = 128 * 1024;
            syn = malloc((size_t)n * sizeof *syn);
            uint32_t *sl = malloc((size_t)n * sizeof *sl);
            for (int32_t v = 0; v < n; v++) {
                sl[v] = 1 + s_rand() % 8;
                syn[v] = malloc(sl[v]);
                for (uint32_t i = 0; i < sl[v]; i++)
                    syn[v][i] = (char)(' ' + s_rand() % 95);
            }
            m = ls_token_masker_new(n, (const char *const *)syn, sl, 256u << 20);
            free(sl);
        } else
            m = ls_token_masker_new(V, toks, lens, 256u << 20);
        assert_non_null(m);
        // batch 64: the states of 64 random walks, masks computed (cold) then served (warm)
        int *dist = s_dist(g), states[64];
        for (int r = 0; r < 64; r++) {
            char buf[4096];
            size_t len = s_generate(g, dist, buf, sizeof buf, 60);
            states[r] = ls_grammar_walk(g, 0, buf, len / 2);
        }
        for (int warm = 0; warm < 2; warm++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            for (int r = 0; r < 64; r++)
                assert_non_null(ls_token_masker_mask(m, g, states[r]));
            clock_gettime(CLOCK_MONOTONIC, &t1);
            printf("mask cost, V=%d, batch 64, %s: %.3f ms per step\n", big ? n : V, warm ? "cached" : "cold",
                   (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
        }
        free(dist);
        ls_token_masker_detach(m, g);
        ls_token_masker_destroy(&m);
        for (int32_t v = 0; syn && v < n; v++)
            free(syn[v]);
        free(syn);
    }
    ls_grammar_destroy(&g);
    free(toks);
    free(lens);
    ls_tokenizer_destroy(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_vs_posix),      cmocka_unit_test(test_regex_classes_utf8),
        cmocka_unit_test(test_regex_refused),       cmocka_unit_test(test_schema_instances),
        cmocka_unit_test(test_schema_matches),      cmocka_unit_test(test_json_object),
        cmocka_unit_test(test_schema_refused),      cmocka_unit_test(test_masks_vs_brute_force),
        cmocka_unit_test(test_mask_cost),           cmocka_unit_test(test_absent_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
