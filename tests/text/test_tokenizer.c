// The tokenizer against HF tokenizers on real vocabularies (Qwen3, Llama-3, Llama-2 and five
// variants of them that exercise the other normalizers, pre-tokenizers, decoders and added-token
// options): exact ids for every corpus line, HF's decode of those ids and of random id
// sequences, round trips, streaming decode equal to the full decode, stop strings, and refusal
// of malformed or unsupported files.
#include "text_refs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <utf8proc.h>

#include <cmocka.h>

#include "test_util.h"

static const char *VOCABS[] = {"qwen3",
                               "llama3",
                               "llama2",
                               "llama2-metaspace-first",
                               "llama2-metaspace-always-split",
                               "llama3-gpt2-bytelevel",
                               "llama3-split-behaviors",
                               "qwen3-nfkc-lower-added"};

static char errbuf[1024];


static ls_tokenizer_t *load(const char *name) {
    ls_tokenizer_t *t = refs_load(name, errbuf, sizeof errbuf);
    if (!t)
        fail_msg("%s: %s (tools/install-test-deps.sh installs the reference tokenizers)", name, errbuf);
    return t;
}

static bool valid_utf8(const char *s, size_t n) {
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

// Feeds ids one by one; the concatenated pieces must be `want` (wn bytes), each piece valid UTF-8.
static void check_stream(const ls_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                         const char *want, size_t wn, const char *what) {
    ls_detok_t *d = ls_detok_new(t, flags, NULL, NULL, 0);
    assert_non_null(d);
    char *all = calloc(1, wn * 2 + 64);
    size_t cap = wn * 2 + 63, len = 0;
    const char *p;
    size_t k;
    for (size_t i = 0; i <= n; i++) {
        if (i < n)
            assert_int_equal(ls_detok_push(d, ids[i], &p, &k), 0);
        else
            assert_int_equal(ls_detok_finish(d, &p, &k), 0);
        if (!valid_utf8(p, k))
            fail_msg("%s: piece %zu is not valid UTF-8", what, i);
        if (len + k > cap)
            fail_msg("%s: streamed text is longer than the full decode", what);
        memcpy(all + len, p, k);
        len += k;
    }
    if (len != wn || memcmp(all, want, len) != 0)
        fail_msg("%s: streamed \"%.*s\" != decoded \"%s\"", what, (int)len, all, want);
    free(all);
    ls_detok_destroy(&d);
    ls_detok_destroy(&d);  // idempotent
}

static void json_ids(const json_t *a, ls_token_ids_t *v) {
    v->n = 0;
    const json_t *it;
    size_t i;
    json_array_foreach(a, i, it) {
        if (v->n == v->cap) {
            v->cap = v->cap ? v->cap * 2 : 64;
            v->ids = realloc(v->ids, v->cap * sizeof *v->ids);
        }
        v->ids[v->n++] = (int32_t)json_integer_value(it);
    }
}

static void check_decode(const ls_tokenizer_t *t, const ls_token_ids_t *ids, const json_t *ref, const char *what) {
    static const struct {
        const char *key;
        unsigned flags;
    } modes[] = {{"text", 0}, {"text_skip", LS_DETOK_SKIP_SPECIAL}};
    for (int m = 0; m < 2; m++) {
        size_t wn, len;
        const char *want = refs_str(ref, modes[m].key, &wn);
        char *got = ls_tokenizer_decode(t, ids->ids, ids->n, modes[m].flags, &len, errbuf, sizeof errbuf);
        if (!got)
            fail_msg("%s: decode failed: %s", what, errbuf);
        if (len != wn || memcmp(got, want, len) != 0)
            fail_msg("%s (%s): decoded \"%s\", HF \"%s\"", what, modes[m].key, got, want);
        free(got);
        check_stream(t, ids->ids, ids->n, modes[m].flags, want, wn, what);
    }
}

// Whether decode(encode(x)) == x is expected: byte-level vocabularies are lossless except for
// Qwen3's NFC (x comes back normalized); Llama-2 prepends "▁" to the text after an added token
// (<s>, </s>, <unk> in the text), which the decoder does not strip, and decodes a literal "▁"
// in the text as a space. x is n bytes (NUL bytes included); the result's length goes to *rn.
static char *expected_roundtrip(const char *vocab, const char *x, size_t n, size_t *rn) {
    *rn = n;
    if (strcmp(vocab, "qwen3") == 0) {
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)x, (utf8proc_ssize_t)n, &nfc,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        *rn = k > 0 ? (size_t)k : 0;
        return k >= 0 ? (char *)nfc : NULL;
    }
    if (strcmp(vocab, "llama2") == 0 &&
        (strstr(x, "<s>") || strstr(x, "</s>") || strstr(x, "<unk>") || strstr(x, "\xE2\x96\x81")))
        return NULL;
    if (strcmp(vocab, "llama3") == 0 || strcmp(vocab, "llama2") == 0) {
        char *copy = malloc(n + 1);
        memcpy(copy, x, n + 1);
        return copy;
    }
    return NULL;  // the variants change text on purpose (lowercase, removed delimiters ...)
}

static void test_vocab(void **state) {
    const char *vocab = *state;
    ls_tokenizer_t *t = load(vocab);
    char name[256];
    size_t nc, ne, nd;
    json_t **corpus = refs_jsonl("corpus.jsonl", &nc);
    snprintf(name, sizeof name, "expected/%s.jsonl", vocab);
    json_t **exp = refs_jsonl(name, &ne);
    snprintf(name, sizeof name, "expected/%s-decode.jsonl", vocab);
    json_t **dec = refs_jsonl(name, &nd);
    assert_non_null(corpus);
    assert_non_null(exp);
    assert_non_null(dec);
    assert_int_equal(nc, ne);
    ls_token_ids_t got = {0}, want = {0};
    size_t exact = 0, roundtrips = 0, lossy = 0;
    for (size_t i = 0; i < nc; i++) {
        size_t xn;
        const char *x = refs_str(corpus[i], NULL, &xn);  // NUL bytes included
        got.n = 0;
        if (ls_tokenizer_encode(t, x, xn, 0, &got, errbuf, sizeof errbuf) < 0)
            fail_msg("%s line %zu: %s", vocab, i + 1, errbuf);
        json_ids(json_object_get(exp[i], "ids"), &want);
        if (got.n != want.n || memcmp(got.ids, want.ids, got.n * sizeof *got.ids) != 0) {
            for (size_t k = 0; k < got.n || k < want.n; k++)
                fprintf(stderr, "  %zu: got %d want %d\n", k, k < got.n ? got.ids[k] : -1,
                        k < want.n ? want.ids[k] : -1);
            fail_msg("%s line %zu: ids differ from HF for %s", vocab, i + 1, json_dumps(corpus[i], JSON_ENCODE_ANY));
        }
        exact++;
        snprintf(name, sizeof name, "%s line %zu", vocab, i + 1);
        check_decode(t, &want, exp[i], name);
        size_t rn, tn;
        char *rt = expected_roundtrip(vocab, x, xn, &rn);
        const char *text = refs_str(exp[i], "text", &tn);
        if (rt) {
            if (tn != rn || memcmp(text, rt, rn) != 0)
                fail_msg("%s: decode(encode(x)) = \"%s\", want \"%s\"", name, text, rt);
            roundtrips++;
        } else {
            lossy += tn != xn || memcmp(text, x, xn) != 0;
        }
        free(rt);
    }
    for (size_t i = 0; i < nd; i++) {
        json_ids(json_object_get(dec[i], "ids"), &want);
        snprintf(name, sizeof name, "%s random sequence %zu", vocab, i + 1);
        check_decode(t, &want, dec[i], name);
    }
    printf("[ %-30s ] %zu/%zu lines exact, %zu round trips checked (%zu lines decode to other text "
           "by design), %zu random decodes\n",
           vocab, exact, nc, roundtrips, lossy, nd);
    ls_token_ids_free(&got);
    ls_token_ids_free(&want);
    refs_jsonl_free(corpus);
    refs_jsonl_free(exp);
    refs_jsonl_free(dec);
    ls_tokenizer_destroy(&t);
    ls_tokenizer_destroy(&t);  // idempotent
    assert_null(t);
}

// Streams the ids of text (tn bytes) through a detokenizer with stop strings (lens[i] bytes
// each); returns the concatenated text, its length in *out_len.
static char *stream_with_stops_n(const ls_tokenizer_t *t, const char *text, size_t tn, const char *const *stops,
                                 const size_t *lens, size_t ns, bool *stopped, int *index, size_t *out_len) {
    ls_token_ids_t v = {0};
    assert_int_equal(ls_tokenizer_encode((ls_tokenizer_t *)t, text, tn, 0, &v, errbuf, sizeof errbuf), 0);
    ls_detok_t *d = ls_detok_new(t, 0, stops, lens, ns);
    assert_non_null(d);
    char *out = calloc(1, tn + 64);
    size_t len = 0, k;
    const char *p;
    for (size_t i = 0; i <= v.n; i++) {
        if (i < v.n)
            assert_int_equal(ls_detok_push(d, v.ids[i], &p, &k), 0);
        else
            assert_int_equal(ls_detok_finish(d, &p, &k), 0);
        assert_true(valid_utf8(p, k));
        memcpy(out + len, p, k);
        len += k;
        // Nothing streamed may be (the start of) a stop string that later completes.
        for (size_t s = 0; s < ns && !ls_detok_stopped(d); s++)
            assert_null(memmem(out, len, stops[s], lens[s]));
    }
    *stopped = ls_detok_stopped(d);
    *index = ls_detok_stop_index(d);
    *out_len = len;
    ls_detok_destroy(&d);
    ls_token_ids_free(&v);
    return out;
}

// The same on C strings.
static char *stream_with_stops(const ls_tokenizer_t *t, const char *text, const char *const *stops, size_t ns,
                               bool *stopped, int *index) {
    size_t lens[8], len;
    assert_true(ns <= 8);
    for (size_t i = 0; i < ns; i++)
        lens[i] = strlen(stops[i]);
    return stream_with_stops_n(t, text, strlen(text), stops, lens, ns, stopped, index, &len);
}

static void test_stop_strings(void **state) {
    (void)state;
    for (int vi = 0; vi < 3; vi++) {
        ls_tokenizer_t *t = load(VOCABS[vi]);
        bool stopped;
        int idx;
        char *out;
        // Spanning several tokens: the text before it is emitted, the stop string is not.
        const char *s1[] = {"d, this is"};
        out = stream_with_stops(t, "Hello world, this is the end", s1, 1, &stopped, &idx);
        assert_string_equal(out, "Hello worl");
        assert_true(stopped);
        assert_int_equal(idx, 0);
        free(out);
        // A partial match that turns out not to be a stop: everything comes out in the end.
        const char *s2[] = {"world peace", "xyz"};
        out = stream_with_stops(t, "Hello world, this is the end", s2, 2, &stopped, &idx);
        assert_string_equal(out, "Hello world, this is the end");
        assert_false(stopped);
        assert_int_equal(idx, -1);
        free(out);
        // At the very start.
        const char *s3[] = {"Hello"};
        out = stream_with_stops(t, "Hello world", s3, 1, &stopped, &idx);
        assert_string_equal(out, "");
        assert_true(stopped);
        free(out);
        // The earliest of several wins; multi-byte stop strings inside byte-fallback runs.
        const char *s4[] = {"界", "好，"};
        out = stream_with_stops(t, "你好，世界！🤷‍♂️", s4, 2, &stopped, &idx);
        assert_string_equal(out, "你");
        assert_int_equal(idx, 1);
        free(out);
        // A prefix of the stop string held at the end is released by finish.
        const char *s5[] = {"end of story"};
        out = stream_with_stops(t, "the end of", s5, 1, &stopped, &idx);
        assert_string_equal(out, "the end of");
        assert_false(stopped);
        free(out);
        ls_tokenizer_destroy(&t);
    }
}

// Every corpus line, with a stop string cut from its own text: the stream must end exactly
// before the first occurrence of it.
static void test_stop_strings_corpus(void **state) {
    (void)state;
    ls_tokenizer_t *t = load("llama3");
    size_t nc;
    json_t **corpus = refs_jsonl("corpus.jsonl", &nc);
    unsigned seed = 1;
    size_t n_stopped = 0;
    for (size_t i = 0; i < nc; i++) {
        size_t n;
        const char *x = refs_str(corpus[i], NULL, &n);  // NUL bytes included, in stops too
        if (n < 4)
            continue;
        seed = seed * 1103515245u + 12345u;
        size_t a = (seed >> 8) % (n - 2), len = 1 + (seed >> 20) % 6;
        while (a > 0 && ((unsigned char)x[a] & 0xC0) == 0x80)
            a--;
        size_t b = a + len < n ? a + len : n;
        while (b < n && ((unsigned char)x[b] & 0xC0) == 0x80)
            b++;
        const char *stops[] = {x + a};
        size_t lens[] = {b - a}, out_len;
        bool stopped;
        int idx;
        char *out = stream_with_stops_n(t, x, n, stops, lens, 1, &stopped, &idx, &out_len);
        const char *first = memmem(x, n, x + a, b - a);
        assert_true(stopped);
        if (out_len != (size_t)(first - x) || memcmp(out, x, out_len) != 0)
            fail_msg("line %zu stop \"%.*s\": streamed \"%s\"", i + 1, (int)(b - a), x + a, out);
        n_stopped++;
        free(out);
    }
    printf("[ stop strings ] %zu corpus lines stopped exactly at their stop string\n", n_stopped);
    refs_jsonl_free(corpus);
    ls_tokenizer_destroy(&t);
}

static void test_api(void **state) {
    (void)state;
    ls_tokenizer_t *t = load("llama2");
    size_t n;
    const int32_t *pre = ls_tokenizer_prefix_ids(t, &n);
    assert_int_equal(n, 1);
    assert_int_equal(pre[0], 1);
    ls_tokenizer_suffix_ids(t, &n);
    assert_int_equal(n, 0);
    ls_token_ids_t v = {0};
    assert_int_equal(ls_tokenizer_encode(t, "Hi", 2, LS_TOKENIZE_ADD_SPECIAL, &v, errbuf, sizeof errbuf), 0);
    assert_int_equal(v.ids[0], 1);
    assert_int_equal(ls_tokenizer_token_to_id(t, "<s>"), 1);
    assert_string_equal(ls_tokenizer_id_to_token(t, 2), "</s>");
    assert_true(ls_tokenizer_is_special(t, 2));
    assert_false(ls_tokenizer_is_special(t, 1000));
    assert_null(ls_tokenizer_id_to_token(t, 1 << 30));
    assert_int_equal(ls_tokenizer_vocab_size(t), 32000);
    // Invalid UTF-8 is refused, bad ids are refused by both decoders.
    v.n = 0;
    assert_int_equal(ls_tokenizer_encode(t, "a\xC3(", 3, 0, &v, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "not valid UTF-8");
    int32_t bad[] = {5, 99999};
    assert_null(ls_tokenizer_decode(t, bad, 2, 0, NULL, errbuf, sizeof errbuf));
    assert_contains(errbuf, "99999");
    ls_detok_t *d = ls_detok_new(t, 0, NULL, NULL, 0);
    const char *p;
    size_t k;
    assert_int_equal(ls_detok_push(d, -1, &p, &k), -1);
    ls_detok_destroy(&d);
    // Special-token matching can be turned off for untrusted text.
    v.n = 0;
    assert_int_equal(ls_tokenizer_encode(t, "<s>", 3, LS_TOKENIZE_NO_SPECIAL_MATCH, &v, errbuf, sizeof errbuf), 0);
    for (size_t i = 0; i < v.n; i++)
        assert_int_not_equal(v.ids[i], 1);
    ls_token_ids_free(&v);
    ls_tokenizer_destroy(&t);
}

// A tiny complete tokenizer.json, and broken versions of it.
static const char *TINY =
    "{\"version\":\"1.0\",\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"single_word\":false,"
    "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3,\"\xC4\xA0" "ab\":4},"
    "\"merges\":[\"a b\",[\"\xC4\xA0\",\"ab\"]]}}";

static void refuse(const char *json, const char *needle) {
    errbuf[0] = '\0';
    ls_tokenizer_t *t = ls_tokenizer_parse(json, strlen(json), "tokenizer.json", errbuf, sizeof errbuf);
    if (t)
        fail_msg("accepted: %s", json);
    assert_contains(errbuf, "tokenizer.json");
    assert_contains(errbuf, needle);
}

static char *with(const char *from, const char *to) {
    const char *at = strstr(TINY, from);
    assert_non_null(at);
    char *s = NULL;
    assert_true(asprintf(&s, "%.*s%s%s", (int)(at - TINY), TINY, to, at + strlen(from)) > 0);
    return s;
}

static void test_malformed(void **state) {
    (void)state;
    ls_tokenizer_t *t = ls_tokenizer_parse(TINY, strlen(TINY), "tiny", errbuf, sizeof errbuf);
    if (!t)
        fail_msg("%s", errbuf);
    ls_token_ids_t v = {0};
    assert_int_equal(ls_tokenizer_encode(t, "ab ab<s>", 8, 0, &v, errbuf, sizeof errbuf), 0);
    assert_int_equal(v.n, 3);
    assert_int_equal(v.ids[0], 2);
    assert_int_equal(v.ids[1], 4);
    assert_int_equal(v.ids[2], 5);
    ls_token_ids_free(&v);
    ls_tokenizer_destroy(&t);

    static const struct {
        const char *from, *to, *needle;
    } cases[] = {
        {"\"type\":\"BPE\"", "\"type\":\"WordPiece\"", "model type \"WordPiece\" is not supported"},
        {"\"type\":\"BPE\"", "\"type\":\"Unigram\"", "\"Unigram\""},
        {"\"a b\"", "\"a c\"", "merge 0"},
        {"\"a b\"", "\"ab\"", "neither \"a b\" nor [a, b]"},
        {"[\"\xC4\xA0\",\"ab\"]", "[\"\xC4\xA0\",\"b\"]", "merged token"},
        {"\"pre_tokenizer\":{\"type\":\"ByteLevel\"", "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"",
         "pre_tokenizer \"BertPreTokenizer\" is not supported"},
        {"\"normalizer\":null", "\"normalizer\":{\"type\":\"Precompiled\"}", "normalizer \"Precompiled\""},
        {"\"decoder\":{\"type\":\"ByteLevel\"}", "\"decoder\":{\"type\":\"WordPiece\"}", "decoder \"WordPiece\""},
        {"\"decoder\":{\"type\":\"ByteLevel\"}", "\"decoder\":null", "no \"decoder\""},
        {"\"decoder\":{\"type\":\"ByteLevel\"}",
         "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}",
         "at this place"},
        // Strip's start is a count: past int's range (which must not reach the conversion), negative
        // or fractional is refused, 1 after Fuse loads
        {"\"decoder\":{\"type\":\"ByteLevel\"}",
         "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1e34,\"stop\":0}]}",
         "a whole number"},
        {"\"decoder\":{\"type\":\"ByteLevel\"}",
         "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":-1,\"stop\":0}]}",
         "a whole number"},
        {"\"decoder\":{\"type\":\"ByteLevel\"}",
         "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1.5,\"stop\":0}]}",
         "a whole number"},
        {"\"decoder\":{\"type\":\"ByteLevel\"}",
         "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}",
         ""},
        {"\"post_processor\":null", "\"post_processor\":{\"type\":\"BertProcessing\"}", "post_processor \"BertProcessing\""},
        {"\"use_regex\":true}", "\"use_regex\":true},\"x\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}",
         ""},  // unknown top-level keys are ignored; this one must load (checked below)
        {"\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}",
         "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}",
         "does not compile"},
        {"\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}",
         "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}",
         "behavior \"Sideways\""},
        {"\"added_tokens\":[", "\"added_tokens\":\"oops\",\"x\":[", "not a list"},
        {"\"a\":0", "\"a\":\"zero\"", "vocab entry \"a\" has no valid id"},
        {"\"type\":\"BPE\",", "\"type\":\"BPE\",\"dropout\":0.1,", "dropout"},
        {"\"type\":\"BPE\",", "\"type\":\"BPE\",\"unk_token\":\"<unk>\",", "unk_token \"<unk>\""},
        {"\"type\":\"BPE\",", "\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\",", "continuing_subword_prefix"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *json = with(cases[i].from, cases[i].to);
        if (cases[i].needle[0]) {
            refuse(json, cases[i].needle);
        } else {
            t = ls_tokenizer_parse(json, strlen(json), "tokenizer.json", errbuf, sizeof errbuf);
            assert_non_null(t);
            ls_tokenizer_destroy(&t);
        }
        free(json);
    }
    refuse("not json at all", "not valid JSON");
    refuse("[1, 2]", "not a JSON object");
    refuse("{\"version\":\"1.0\"}", "no \"model\" object");
    refuse("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]},\"decoder\":{\"type\":\"ByteLevel\"}}",
           "vocabulary is empty");
    // Every truncation of a valid file: refused with a message, never a crash.
    size_t n = strlen(TINY);
    for (size_t cut = 0; cut < n; cut++) {
        errbuf[0] = '\0';
        t = ls_tokenizer_parse(TINY, cut, "tokenizer.json", errbuf, sizeof errbuf);
        assert_null(t);
        assert_true(errbuf[0] != '\0');
    }
    errbuf[0] = '\0';
    assert_null(ls_tokenizer_load("/nonexistent/tokenizer.json", errbuf, sizeof errbuf));
    assert_contains(errbuf, "/nonexistent/tokenizer.json: cannot open");
    ls_tokenizer_destroy(NULL);
}

// --- an adapter's added tokens ------------------------------------------------------------

// The tokenizer.json of a vocabulary (a package's file, or a variant's patched one) as cJSON.
static cJSON *vocab_json(const char *name) {
    size_t n;
    const char *base = name;
    cJSON *variants = NULL;
    const cJSON *found = NULL, *v;
    if (!refs_package(name)) {
        char path[4096];
        snprintf(path, sizeof path, "%s/variants.json", LS_REFS_DIR);
        char *text = tu_read_file(path, &n);
        variants = text ? cJSON_Parse(text) : NULL;
        free(text);
        cJSON_ArrayForEach(v, variants) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(v, "name");
            if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0)
                found = v;
        }
        assert_non_null(found);
        base = cJSON_GetObjectItemCaseSensitive(found, "base")->valuestring;
    }
    char *text = tu_read_file(refs_tokenizer_path(base), &n);
    assert_non_null(text);
    cJSON *json = cJSON_ParseWithLength(text, n);
    free(text);
    if (found)
        assert_int_equal(refs_apply_patch(json, cJSON_GetObjectItemCaseSensitive(found, "patch")), 0);
    cJSON_Delete(variants);
    return json;
}

// Added tokens of every kind: plain, special with lstrip, single_word, rstrip, one that holds a
// base token's text, one a prefix of another (longest wins), raw (not normalized) and
// normalized, with upper case that a Lowercase normalizer changes.
static const ls_tok_added_spec_t ADDED[] = {
    {"<|tool_call|>", 13, false, false, false, false, true},
    {"<sep>", 5, true, false, true, false, false},
    {"Zyx\xce\xb1", 5, false, true, false, false, true},
    {"[[mark]]", 8, false, false, false, true, false},
    {" hello world", 12, false, false, false, false, true},
    {"[[mark]]!", 9, true, false, false, false, false},
};
#define N_ADDED (sizeof ADDED / sizeof ADDED[0])

static const char *ADDED_TEXTS[] = {
    "plain text without any of them",
    "call <|tool_call|>{\"x\": 1}<sep>done",
    "a   <sep>  b<sep>c",
    "Zyx\xce\xb1 alone, and inZyx\xce\xb1side, zyx\xce\xb1 lower, ZYX\xce\xb1 upper",
    "[[mark]]   then [[mark]]! and [[mark]]!!",
    "say hello world twice: hello world, hello  world",
    "<|tool_call|><|tool_call|><sep><sep>",
    "\xe4\xbd\xa0\xe5\xa5\xbd<sep>\xe4\xb8\x96\xe7\x95\x8c <|tool_call|>",
    "",
};

// Feeds ids one at a time through a detokenizer of (t, a) and returns the concatenated text.
static char *stream_all(const ls_tokenizer_t *t, const ls_tok_added_t *a, const int32_t *ids,
                        size_t n, unsigned flags, size_t *len) {
    ls_detok_t *d = ls_detok_new_added(t, a, flags, NULL, NULL, 0);
    assert_non_null(d);
    size_t cap = 64, at = 0;
    char *all = malloc(cap);
    const char *p;
    size_t k;
    for (size_t i = 0; i <= n; i++) {
        assert_int_equal(i < n ? ls_detok_push(d, ids[i], &p, &k) : ls_detok_finish(d, &p, &k), 0);
        while (at + k + 1 > cap)
            all = realloc(all, cap *= 2);
        memcpy(all + at, p, k);
        at += k;
    }
    all[at] = 0;
    *len = at;
    ls_detok_destroy(&d);
    return all;
}

// An adapter's added tokens over a base tokenizer (ls_tok_added_new) == the same tokens
// listed in the tokenizer.json's added_tokens (which the tests above hold to HF): the ids of
// the corpus and of texts full of them, with special matching and without; the decode, with
// and without skip_special_tokens, whole and streamed; and the refusals.
static void test_added_vocab(void **state) {
    const char *vocab = *state;
    cJSON *json = vocab_json(vocab);
    char *text = cJSON_PrintUnformatted(json);
    ls_tokenizer_t *base = ls_tokenizer_parse(text, strlen(text), vocab, errbuf, sizeof errbuf);
    free(text);
    assert_non_null(base);
    int32_t first = ls_tokenizer_vocab_size(base);
    cJSON *added = cJSON_GetObjectItemCaseSensitive(json, "added_tokens");
    for (size_t i = 0; i < N_ADDED; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "id", first + (double)i);
        cJSON_AddStringToObject(e, "content", ADDED[i].content);
        cJSON_AddBoolToObject(e, "single_word", ADDED[i].single_word);
        cJSON_AddBoolToObject(e, "lstrip", ADDED[i].lstrip);
        cJSON_AddBoolToObject(e, "rstrip", ADDED[i].rstrip);
        cJSON_AddBoolToObject(e, "normalized", ADDED[i].normalized);
        cJSON_AddBoolToObject(e, "special", ADDED[i].special);
        cJSON_AddItemToArray(added, e);
    }
    text = cJSON_PrintUnformatted(json);
    ls_tokenizer_t *ref = ls_tokenizer_parse(text, strlen(text), vocab, errbuf, sizeof errbuf);
    free(text);
    cJSON_Delete(json);
    assert_non_null(ref);
    ls_tok_added_t *a = ls_tok_added_new(base, first, ADDED, N_ADDED, errbuf, sizeof errbuf);
    if (!a)
        fail_msg("%s: %s", vocab, errbuf);
    assert_int_equal(ls_tok_added_first(a), first);
    assert_int_equal(ls_tok_added_count(a), N_ADDED);
    bool special = false;
    assert_string_equal(ls_tok_added_token(a, first + 1, &special), "<sep>");
    assert_true(special);
    assert_null(ls_tok_added_token(a, first + (int32_t)N_ADDED, NULL));
    assert_null(ls_tok_added_token(a, first - 1, NULL));

    size_t nc;
    json_t **corpus = refs_jsonl("corpus.jsonl", &nc);
    assert_non_null(corpus);
    ls_token_ids_t got = {0}, want = {0};
    size_t n_texts = nc + sizeof ADDED_TEXTS / sizeof *ADDED_TEXTS, hits = 0;
    for (size_t i = 0; i < n_texts; i++) {
        size_t xn;
        const char *x = i < nc ? refs_str(corpus[i], NULL, &xn) : ADDED_TEXTS[i - nc];
        if (i >= nc)
            xn = strlen(x);
        for (unsigned flags = 0; flags <= LS_TOKENIZE_NO_SPECIAL_MATCH; flags += LS_TOKENIZE_NO_SPECIAL_MATCH) {
            got.n = want.n = 0;
            assert_int_equal(ls_tokenizer_encode_added(base, a, x, xn, flags, &got, errbuf, sizeof errbuf), 0);
            assert_int_equal(ls_tokenizer_encode(ref, x, xn, flags, &want, errbuf, sizeof errbuf), 0);
            if (got.n != want.n || memcmp(got.ids, want.ids, got.n * sizeof *got.ids) != 0)
                fail_msg("%s: \"%.80s\" (flags %u): ids differ from the tokenizer that lists them",
                         vocab, x, flags);
            for (size_t k = 0; k < got.n; k++)
                hits += got.ids[k] >= first;
            for (unsigned df = 0; df <= LS_DETOK_SKIP_SPECIAL; df++) {
                size_t gl, wl, sl;
                char *g = ls_tokenizer_decode_added(base, a, got.ids, got.n, df, &gl, errbuf, sizeof errbuf);
                char *w = ls_tokenizer_decode(ref, want.ids, want.n, df, &wl, errbuf, sizeof errbuf);
                char *st = stream_all(base, a, got.ids, got.n, df, &sl);
                assert_true(g && w);
                if (gl != wl || memcmp(g, w, gl) != 0 || sl != gl || memcmp(st, g, gl) != 0)
                    fail_msg("%s: \"%.80s\": decode (skip %u) \"%s\", stream \"%s\", want \"%s\"",
                             vocab, x, df, g, st, w);
                free(g), free(w), free(st);
            }
        }
    }
    print_message("%s: %zu texts, %zu added ids in their ids, as the tokenizer listing them\n",
                  vocab, n_texts, hits);
    assert_true(hits >= 10);
    // an id past them, or between the tokenizer's and the first: not in the vocabulary
    int32_t bad = first + (int32_t)N_ADDED;
    assert_null(ls_tokenizer_decode_added(base, a, &bad, 1, 0, NULL, errbuf, sizeof errbuf));
    ls_detok_t *d = ls_detok_new_added(base, a, 0, NULL, NULL, 0);
    const char *p;
    size_t k;
    assert_int_equal(ls_detok_push(d, bad, &p, &k), -1);
    ls_detok_destroy(&d);
    ls_tok_added_destroy(&a);
    // refusals: a base token's text, twice, empty, invalid UTF-8, ids over the tokenizer's
    const char *own = ls_tokenizer_id_to_token(base, 100);
    ls_tok_added_spec_t bad_specs[][2] = {
        {{own, strlen(own), false, false, false, false, true}, {0}},
        {{"<a>", 3, false, false, false, false, true}, {"<a>", 3, true, false, false, false, false}},
        {{"", 0, false, false, false, false, true}, {0}},
        {{"\xff", 1, false, false, false, false, true}, {0}},
    };
    const char *why[] = {"is the tokenizer's own token 100", "is given twice", "is empty", "not valid UTF-8"};
    for (size_t i = 0; i < sizeof why / sizeof *why; i++) {
        assert_null(ls_tok_added_new(base, first, bad_specs[i], i == 1 ? 2 : 1, errbuf, sizeof errbuf));
        assert_contains(errbuf, why[i]);
    }
    assert_null(ls_tok_added_new(base, first - 1, ADDED, 1, errbuf, sizeof errbuf));
    assert_contains(errbuf, "overlap the tokenizer's own");
    ls_token_ids_free(&got);
    ls_token_ids_free(&want);
    refs_jsonl_free(corpus);
    ls_tokenizer_destroy(&base);
    ls_tokenizer_destroy(&ref);
}

int main(void) {
    static const char *ADDED_VOCABS[] = {"llama3", "llama2", "qwen3-nfkc-lower-added",
                                         "llama2-metaspace-first"};
    struct CMUnitTest tests[sizeof VOCABS / sizeof VOCABS[0] + 5 + 4];
    size_t n = 0;
    for (size_t i = 0; i < sizeof VOCABS / sizeof VOCABS[0]; i++) {
        tests[n] = (struct CMUnitTest)cmocka_unit_test_prestate(test_vocab, (void *)VOCABS[i]);
        tests[n++].name = VOCABS[i];
    }
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_stop_strings);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_stop_strings_corpus);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_api);
    tests[n++] = (struct CMUnitTest)cmocka_unit_test(test_malformed);
    for (size_t i = 0; i < sizeof ADDED_VOCABS / sizeof *ADDED_VOCABS; i++) {
        tests[n] = (struct CMUnitTest)cmocka_unit_test_prestate(test_added_vocab, (void *)ADDED_VOCABS[i]);
        tests[n++].name = ADDED_VOCABS[i];
    }
    return _cmocka_run_group_tests("text_tokenizer", tests, n, NULL, NULL);
}
