// loraserve-bench's pure parts, without a server:
//   workload   — a seed fixes the sequence; the adapter stream leaves prompts and arrivals alone;
//                Zipf and uniform frequencies against the analytic distribution; range-ratio
//                bounds and token range; Poisson gaps' mean and spread; single and base
//   dataset    — text, ids, named and null adapters, cycling; every malformed line named by its
//                number
//   sse        — both APIs' streams fed whole, byte by byte and in random splits (LF and CRLF)
//                give the same events; comments, an unterminated last event, the size limit
//   chunks     — what an event says: counts, text, finish, usage, errors, [DONE]
//   jscan      — values found past nested strings and brackets, ints, unescaped strings
//   stats      — percentiles and std against numpy's values and a sorted reference
//   prom       — Prometheus text: labels with escapes, special values, junk skipped
//   report     — the keys and numbers bs_report_fill derives from made-up results
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "jscan.h"
#include "prom.h"
#include "report.h"
#include "sse.h"
#include "stats.h"
#include "workload.h"

static char s_dir[128];

static bs_workload_cfg_t s_cfg(size_t n) {
    return (bs_workload_cfg_t){.num_prompts = n, .input_len = 32, .output_len = 16, .range_ratio = 0.5,
                               .vocab_size = 32000, .dist = {BS_DIST_UNIFORM, 0}, .request_rate = 10, .seed = 7};
}

static const char *s_names[] = {"a", "b", "c", "d", "e", "f", "g", "h"};

static bs_workload_t *s_new(const bs_workload_cfg_t *cfg, size_t nnames) {
    char err[256] = "";
    bs_workload_t *w = bs_workload_new(cfg, s_names, nnames, err, sizeof err);
    if (!w)
        fail_msg("bs_workload_new: %s", err);
    return w;
}

static int s_same_req(const bs_req_t *x, const bs_req_t *y) {
    return x->nids == y->nids && !memcmp(x->ids, y->ids, x->nids * sizeof *x->ids) && x->output_len == y->output_len &&
           x->adapter == y->adapter && x->arrival_s == y->arrival_s;
}

static void test_workload_seeded(void **state) {
    bs_workload_cfg_t cfg = s_cfg(300);
    bs_workload_t *w1 = s_new(&cfg, 8), *w2 = s_new(&cfg, 8);
    assert_int_equal(bs_workload_size(w1), 300);
    for (size_t i = 0; i < 300; i++)
        assert_true(s_same_req(bs_workload_req(w1, i), bs_workload_req(w2, i)));
    cfg.seed = 8;
    bs_workload_t *w3 = s_new(&cfg, 8);
    size_t differ = 0;
    for (size_t i = 0; i < 300; i++)
        differ += !s_same_req(bs_workload_req(w1, i), bs_workload_req(w3, i));
    assert_true(differ > 290);
    // Another adapter distribution: the same prompts, lengths and arrivals.
    cfg.seed = 7;
    cfg.dist = (bs_dist_t){BS_DIST_ZIPF, 1.2};
    bs_workload_t *w4 = s_new(&cfg, 8);
    size_t adapters_differ = 0;
    for (size_t i = 0; i < 300; i++) {
        const bs_req_t *x = bs_workload_req(w1, i), *y = bs_workload_req(w4, i);
        assert_int_equal(x->nids, y->nids);
        assert_memory_equal(x->ids, y->ids, x->nids * sizeof *x->ids);
        assert_int_equal(x->output_len, y->output_len);
        assert_true(x->arrival_s == y->arrival_s);
        adapters_differ += x->adapter != y->adapter;
    }
    assert_true(adapters_differ > 100);
    bs_workload_destroy(&w1);
    bs_workload_destroy(&w2);
    bs_workload_destroy(&w3);
    bs_workload_destroy(&w4);
    assert_null(w1);
}

// Adapter frequencies over M draws against p_k: every adapter within 5 standard errors, and
// Pearson's chi-square within 6 standard deviations of its mean (N - 1 degrees of freedom).
static void s_check_freqs(bs_dist_t dist, size_t nadapters, const double *p) {
    enum { M = 200000 };
    bs_workload_cfg_t cfg = s_cfg(M);
    cfg.input_len = cfg.output_len = 1;
    cfg.dist = dist;
    const char **names = malloc(nadapters * sizeof *names);
    char (*buf)[16] = malloc(nadapters * sizeof *buf);
    for (size_t k = 0; k < nadapters; k++) {
        snprintf(buf[k], sizeof buf[k], "lora-%zu", k);
        names[k] = buf[k];
    }
    char err[256];
    bs_workload_t *w = bs_workload_new(&cfg, names, nadapters, err, sizeof err);
    assert_non_null(w);
    size_t *count = calloc(nadapters, sizeof *count);
    for (size_t i = 0; i < M; i++) {
        int a = bs_workload_req(w, i)->adapter;
        assert_true(a >= 0 && (size_t)a < nadapters);
        count[a]++;
    }
    double chi2 = 0, df = (double)nadapters - 1;
    for (size_t k = 0; k < nadapters; k++) {
        double f = (double)count[k] / M, se = sqrt(p[k] * (1 - p[k]) / M);
        if (fabs(f - p[k]) > 5 * se + 1e-12)
            fail_msg("adapter %zu: frequency %.5f, expected %.5f (5 se = %.5f)", k, f, p[k], 5 * se);
        chi2 += (count[k] - M * p[k]) * (count[k] - M * p[k]) / (M * p[k]);
    }
    if (chi2 > df + 6 * sqrt(2 * df))
        fail_msg("chi-square %.1f over %zu adapters (bound %.1f)", chi2, nadapters, df + 6 * sqrt(2 * df));
    free(count);
    free(names);
    free(buf);
    bs_workload_destroy(&w);
}

static void test_workload_zipf(void **state) {
    enum { N = 200 };
    double p[N], h = 0;
    for (int k = 0; k < N; k++)
        h += 1.0 / (k + 1);
    for (int k = 0; k < N; k++)
        p[k] = 1.0 / (k + 1) / h;
    s_check_freqs((bs_dist_t){BS_DIST_ZIPF, 1.0}, N, p);
    h = 0;
    for (int k = 0; k < 10; k++)
        h += pow(k + 1, -2.0);
    for (int k = 0; k < 10; k++)
        p[k] = pow(k + 1, -2.0) / h;
    s_check_freqs((bs_dist_t){BS_DIST_ZIPF, 2.0}, 10, p);
    for (int k = 0; k < 50; k++)
        p[k] = 1.0 / 50;
    s_check_freqs((bs_dist_t){BS_DIST_UNIFORM, 0}, 50, p);
}

static void test_workload_single_base(void **state) {
    bs_workload_cfg_t cfg = s_cfg(100);
    cfg.dist = (bs_dist_t){BS_DIST_SINGLE, 0};
    bs_workload_t *w = s_new(&cfg, 8);
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(bs_workload_req(w, i)->adapter, 0);
    assert_string_equal(bs_workload_adapter_name(w, 0), "a");
    bs_workload_destroy(&w);
    cfg.dist = (bs_dist_t){BS_DIST_BASE, 0};
    w = s_new(&cfg, 0);  // the base model needs no names
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(bs_workload_req(w, i)->adapter, -1);
    assert_null(bs_workload_adapter_name(w, -1));
    bs_workload_destroy(&w);
    char err[256] = "";
    cfg.dist = (bs_dist_t){BS_DIST_UNIFORM, 0};
    assert_null(bs_workload_new(&cfg, NULL, 0, err, sizeof err));
    assert_contains(err, "no adapters");
}

static void test_workload_lengths(void **state) {
    bs_workload_cfg_t cfg = s_cfg(5000);
    cfg.input_len = 100;
    cfg.output_len = 40;
    cfg.range_ratio = 0.5;
    cfg.vocab_size = 824;
    bs_workload_t *w = s_new(&cfg, 8);
    uint32_t lo, hi;
    bs_workload_token_range(824, &lo, &hi);
    assert_int_equal(lo, 103);
    assert_int_equal(hi, 721);
    int seen_in[101] = {0}, seen_out[41] = {0};
    uint32_t min_id = UINT32_MAX, max_id = 0;
    for (size_t i = 0; i < 5000; i++) {
        const bs_req_t *r = bs_workload_req(w, i);
        assert_true(r->nids >= 50 && r->nids <= 100);
        assert_true(r->output_len >= 20 && r->output_len <= 40);
        seen_in[r->nids] = seen_out[r->output_len] = 1;
        for (size_t k = 0; k < r->nids; k++) {
            min_id = r->ids[k] < min_id ? r->ids[k] : min_id;
            max_id = r->ids[k] > max_id ? r->ids[k] : max_id;
        }
    }
    // Both ends of each range are reached: [len * ratio, len], inclusive.
    assert_true(seen_in[50] && seen_in[100] && seen_out[20] && seen_out[40]);
    assert_int_equal(min_id, lo);
    assert_int_equal(max_id, hi - 1);
    bs_workload_destroy(&w);
    // Ratio 1: exactly the lengths; a large vocabulary keeps 1000 ids off each end.
    cfg.range_ratio = 1;
    w = s_new(&cfg, 8);
    for (size_t i = 0; i < 5000; i++)
        assert_true(bs_workload_req(w, i)->nids == 100 && bs_workload_req(w, i)->output_len == 40);
    bs_workload_destroy(&w);
    bs_workload_token_range(128256, &lo, &hi);
    assert_true(lo == 1000 && hi == 127256);
}

static void test_workload_poisson(void **state) {
    enum { N = 20000 };
    bs_workload_cfg_t cfg = s_cfg(N);
    cfg.input_len = cfg.output_len = 1;
    cfg.request_rate = 20;
    bs_workload_t *w = s_new(&cfg, 8);
    assert_true(bs_workload_req(w, 0)->arrival_s == 0);
    double sum = 0, sq = 0;
    for (size_t i = 1; i < N; i++) {
        double gap = bs_workload_req(w, i)->arrival_s - bs_workload_req(w, i - 1)->arrival_s;
        assert_true(gap >= 0);
        sum += gap;
        sq += gap * gap;
    }
    double mean = sum / (N - 1), sd = sqrt(sq / (N - 1) - mean * mean);
    // Exponential gaps: mean 1/rate (standard error 0.7% here), standard deviation equal to it.
    assert_true(fabs(mean - 0.05) < 0.05 * 0.03);
    assert_true(fabs(sd / mean - 1) < 0.05);
    bs_workload_destroy(&w);
    cfg.request_rate = INFINITY;
    w = s_new(&cfg, 8);
    for (size_t i = 0; i < N; i++)
        assert_true(bs_workload_req(w, i)->arrival_s == 0);
    bs_workload_destroy(&w);
}

static void test_dist_parse(void **state) {
    bs_dist_t d;
    assert_int_equal(bs_dist_parse("zipf:1.5", &d), 0);
    assert_true(d.kind == BS_DIST_ZIPF && d.alpha == 1.5);
    assert_int_equal(bs_dist_parse("uniform", &d), 0);
    assert_int_equal(d.kind, BS_DIST_UNIFORM);
    assert_int_equal(bs_dist_parse("single", &d), 0);
    assert_int_equal(bs_dist_parse("base", &d), 0);
    assert_int_equal(d.kind, BS_DIST_BASE);
    const char *bad[] = {"zipf", "zipf:", "zipf:0", "zipf:-1", "zipf:1x", "zipf:nan", "Uniform", "", "lru"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(bs_dist_parse(bad[i], &d), -1);
}

static const char *s_write(const char *name, const char *text) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", s_dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_dataset(void **state) {
    const char *path = s_write("ok.jsonl", "{\"prompt\": \"input: cup 8\\noutput:\", \"output_len\": 5, \"adapter\": \"reverse\"}\n"
                                           "\n"
                                           "{\"input_ids\": [5, 6, 7], \"adapter\": null}\r\n"
                                           "{\"input_ids\": [9], \"output_len\": 2}\n");
    bs_workload_cfg_t cfg = s_cfg(0);
    cfg.dataset = path;
    cfg.dist = (bs_dist_t){BS_DIST_SINGLE, 0};
    bs_workload_t *w = s_new(&cfg, 1);  // names: "a"
    assert_int_equal(bs_workload_size(w), 3);
    const bs_req_t *r = bs_workload_req(w, 0);
    assert_string_equal(r->text, "input: cup 8\noutput:");
    assert_null(r->ids);
    assert_int_equal(r->output_len, 5);
    assert_string_equal(bs_workload_adapter_name(w, r->adapter), "reverse");  // added after the names
    assert_int_equal(r->adapter, 1);
    r = bs_workload_req(w, 1);
    assert_int_equal(r->nids, 3);
    assert_int_equal(r->ids[2], 7);
    assert_int_equal(r->output_len, 16);  // the default --output-len
    assert_int_equal(r->adapter, -1);     // null: the base model
    assert_int_equal(bs_workload_req(w, 2)->adapter, 0);  // none named: the distribution's
    bs_workload_destroy(&w);
    // More requests than lines: the file again, in order.
    cfg.num_prompts = 7;
    w = s_new(&cfg, 1);
    assert_int_equal(bs_workload_size(w), 7);
    assert_string_equal(bs_workload_req(w, 6)->text, "input: cup 8\noutput:");
    assert_int_equal(bs_workload_req(w, 5)->ids[0], 9);
    bs_workload_destroy(&w);
}

static void test_dataset_errors(void **state) {
    static const struct {
        const char *line, *why;
    } cases[] = {
        {"{\"prompt\": \"x\"", "not valid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{\"output_len\": 3}", "exactly one of"},
        {"{\"prompt\": \"x\", \"input_ids\": [1]}", "exactly one of"},
        {"{\"prompt\": 5}", "\"prompt\" must be"},
        {"{\"input_ids\": []}", "\"input_ids\" must be"},
        {"{\"input_ids\": [1, -2]}", "\"input_ids\"[1]"},
        {"{\"input_ids\": [1, 2.5]}", "\"input_ids\"[1]"},
        {"{\"input_ids\": [1], \"output_len\": 0}", "\"output_len\""},
        {"{\"input_ids\": [1], \"output_len\": \"8\"}", "\"output_len\""},
        {"{\"input_ids\": [1], \"adapter\": 3}", "\"adapter\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char text[512], want[128], err[512] = "";
        snprintf(text, sizeof text, "{\"input_ids\": [1]}\n\n%s\n{\"input_ids\": [2]}\n", cases[i].line);
        bs_workload_cfg_t cfg = s_cfg(0);
        cfg.dataset = s_write("bad.jsonl", text);
        snprintf(want, sizeof want, "bad.jsonl:3: ");  // blank lines count: it is the file's line 3
        assert_null(bs_workload_new(&cfg, s_names, 1, err, sizeof err));
        assert_contains(err, want);
        assert_contains(err, cases[i].why);
    }
    char err[512] = "";
    bs_workload_cfg_t cfg = s_cfg(0);
    cfg.dataset = s_write("empty.jsonl", "\n  \n");
    assert_null(bs_workload_new(&cfg, s_names, 1, err, sizeof err));
    assert_contains(err, "no requests");
    cfg.dataset = "/nonexistent/x.jsonl";
    assert_null(bs_workload_new(&cfg, s_names, 1, err, sizeof err));
    assert_contains(err, "/nonexistent/x.jsonl: No such file");
}

// ---------------------------------------------------------------------------------------------
// SSE

typedef struct {
    char events[64][1024];
    int n;
} s_events_t;

static int s_collect(void *arg, const char *data, size_t n) {
    s_events_t *e = arg;
    assert_true(e->n < 64 && n < 1024);
    memcpy(e->events[e->n], data, n);
    e->events[e->n++][n] = 0;
    return 0;
}

// Feeds text in pieces of the given sizes (cycled; 0 = whole) and collects the events.
static void s_feed(const char *text, const size_t *sizes, size_t nsizes, s_events_t *out) {
    bs_sse_t *s = bs_sse_new(4096);
    memset(out, 0, sizeof *out);
    size_t len = strlen(text), at = 0;
    for (size_t k = 0; at < len; k++) {
        size_t piece = nsizes ? sizes[k % nsizes] : len;
        if (piece > len - at)
            piece = len - at;
        assert_int_equal(bs_sse_feed(s, text + at, piece, s_collect, out), 0);
        at += piece;
    }
    assert_int_equal(bs_sse_finish(s, s_collect, out), 0);
    bs_sse_destroy(&s);
    assert_null(s);
}

static const char s_generate_stream[] =
    ": keep-alive\n\n"
    "data: {\"text\":\" cup\",\"output_ids\":[551],\"meta_info\":{\"id\":\"x\",\"prompt_tokens\":9,\"completion_tokens\":1,"
    "\"finish_reason\":null}}\n\n"
    "data: {\"text\":\" cup \\\"}eight\",\"output_ids\":[551,566],\"meta_info\":{\"prompt_tokens\":9,"
    "\"completion_tokens\":2,\"finish_reason\":null}}\n\n"
    "event: message\nid: 3\n"
    "data: {\"text\":\" cup eight shoe\",\"output_ids\":[551,566,529,1],\"meta_info\":{\"prompt_tokens\":9,"
    "\"completion_tokens\":4,\"finish_reason\":{\"type\":\"stop\",\"matched\":null}}}\n\n"
    "data: [DONE]\n\n";

static const char s_openai_stream[] =
    "data: {\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\" CAKE\",\"logprobs\":null,"
    "\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":null}],\"usage\":null}\n\n"
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\" \\u00e9\\n\",\"finish_reason\":\"length\"}],\"usage\":null}\n\n"
    "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":8,\"total_tokens\":15}}\n\n"
    "data: [DONE]\n\n";

// The same events whatever the split, and with CRLF or CR line ends.
static void s_check_splits(const char *stream, int nevents) {
    s_events_t whole, part;
    s_feed(stream, NULL, 0, &whole);
    assert_int_equal(whole.n, nevents);
    const size_t ones[] = {1}, odd[] = {3, 1, 7, 2, 13, 5, 64, 1};
    s_feed(stream, ones, 1, &part);
    assert_memory_equal(&whole, &part, sizeof whole);
    s_feed(stream, odd, 8, &part);
    assert_memory_equal(&whole, &part, sizeof whole);
    srand(11);
    for (int trial = 0; trial < 50; trial++) {
        size_t sizes[16];
        for (int k = 0; k < 16; k++)
            sizes[k] = 1 + (size_t)(rand() % 40);
        s_feed(stream, sizes, 16, &part);
        assert_memory_equal(&whole, &part, sizeof whole);
    }
    for (int crlf = 0; crlf < 2; crlf++) {
        char *alt = malloc(2 * strlen(stream) + 1), *q = alt;
        for (const char *p = stream; *p; p++) {
            if (*p == '\n' && !crlf)
                *q++ = '\r';
            else if (*p == '\n')
                *q++ = '\r', *q++ = '\n';
            else
                *q++ = *p;
        }
        *q = 0;
        s_feed(alt, ones, 1, &part);  // a "\r" ending one feed and "\n" starting the next: one line end
        assert_memory_equal(&whole, &part, sizeof whole);
        free(alt);
    }
}

static void test_sse_splits(void **state) {
    s_check_splits(s_generate_stream, 4);
    s_check_splits(s_openai_stream, 5);
    // Multi-line data joins with '\n'; a field without a space after the colon; an event whose
    // blank line never came is delivered at the end.
    s_events_t e;
    s_feed("data:a\ndata: b\n\ndata: last", NULL, 0, &e);
    assert_int_equal(e.n, 2);
    assert_string_equal(e.events[0], "a\nb");
    assert_string_equal(e.events[1], "last");
    // One event over the limit is an error, not unbounded memory.
    bs_sse_t *s = bs_sse_new(16);
    assert_int_equal(bs_sse_feed(s, "data: 0123456789abcdefXYZ\n\n", 27, s_collect, &e), -1);
    bs_sse_destroy(&s);
}

static void test_chunks(void **state) {
    s_events_t e;
    bs_chunk_t c;
    s_feed(s_generate_stream, NULL, 0, &e);
    assert_int_equal(bs_chunk_parse(BS_API_GENERATE, e.events[0], strlen(e.events[0]), &c), 0);
    assert_true(c.completion_tokens == 1 && c.prompt_tokens == 9 && !c.finished && !c.done && !c.error);
    assert_int_equal(bs_chunk_parse(BS_API_GENERATE, e.events[1], strlen(e.events[1]), &c), 0);
    assert_true(c.completion_tokens == 2 && !c.finished);
    char *text = bs_json_string_dup(c.text);
    assert_string_equal(text, " cup \"}eight");
    free(text);
    assert_int_equal(bs_chunk_parse(BS_API_GENERATE, e.events[2], strlen(e.events[2]), &c), 0);
    assert_true(c.completion_tokens == 4 && c.finished);
    assert_int_equal(bs_chunk_parse(BS_API_GENERATE, e.events[3], strlen(e.events[3]), &c), 0);
    assert_true(c.done);

    s_feed(s_openai_stream, NULL, 0, &e);
    assert_int_equal(bs_chunk_parse(BS_API_OPENAI, e.events[0], strlen(e.events[0]), &c), 0);
    assert_true(bs_chunk_has_text(&c) && !c.finished && c.completion_tokens == -1);
    assert_int_equal(bs_chunk_parse(BS_API_OPENAI, e.events[1], strlen(e.events[1]), &c), 0);
    assert_false(bs_chunk_has_text(&c));  // an empty piece carries no token
    assert_int_equal(bs_chunk_parse(BS_API_OPENAI, e.events[2], strlen(e.events[2]), &c), 0);
    assert_true(bs_chunk_has_text(&c) && c.finished);
    text = bs_json_string_dup(c.text);
    assert_string_equal(text, " \xc3\xa9\n");
    free(text);
    assert_int_equal(bs_chunk_parse(BS_API_OPENAI, e.events[3], strlen(e.events[3]), &c), 0);
    assert_true(c.completion_tokens == 8 && c.prompt_tokens == 7 && !bs_chunk_has_text(&c));

    const char *err = "{\"error\":{\"message\":\"adapter \\\"x\\\" is not loaded\",\"type\":\"not_found_error\"}}";
    assert_int_equal(bs_chunk_parse(BS_API_OPENAI, err, strlen(err), &c), 0);
    assert_true(c.error);
    text = bs_json_string_dup(c.message);
    assert_string_equal(text, "adapter \"x\" is not loaded");
    free(text);
    const char *bad[] = {"", "not json", "[1]", "{\"text\":\"x\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(bs_chunk_parse(BS_API_GENERATE, bad[i], strlen(bad[i]), &c), -1);
    assert_int_equal(bs_chunk_parse(BS_API_OPENAI, "{\"id\":1}", 8, &c), -1);  // no choices
}

static void test_jscan(void **state) {
    const char *doc = " {\"a\": \"x\\\\\\\"}]\", \"b\" : [1, {\"c\": [\"]\"]}, -3] , \"n\":null, \"k\": 12345678901}\n";
    bs_span_t root, v, e;
    assert_int_equal(bs_json_root(doc, strlen(doc), &root), 0);
    assert_int_equal(bs_json_member(root, "b", &v), 0);
    assert_int_equal(bs_json_element(v, 2, &e), 0);
    long long x;
    assert_int_equal(bs_json_int(e, &x), 0);
    assert_int_equal(x, -3);
    assert_int_equal(bs_json_element(v, 3, &e), -1);
    assert_int_equal(bs_json_element(v, 1, &e), 0);
    assert_int_equal(bs_json_member(e, "c", &e), 0);
    assert_int_equal(e.n, 5);  // ["]"]
    assert_int_equal(bs_json_member(root, "n", &v), 0);
    assert_true(bs_json_is_null(v));
    assert_int_equal(bs_json_member(root, "k", &v), 0);
    assert_int_equal(bs_json_int(v, &x), 0);
    assert_true(x == 12345678901ll);
    assert_int_equal(bs_json_member(root, "a", &v), 0);
    char *s = bs_json_string_dup(v);
    assert_string_equal(s, "x\\\"}]");
    free(s);
    assert_int_equal(bs_json_member(root, "c", &v), -1);  // only the top level is searched
    assert_int_equal(bs_json_int((bs_span_t){"1.5", 3}, &x), -1);
    assert_null(bs_json_string_dup((bs_span_t){"12", 2}));
    const char *cut = "{\"a\": [1, 2";
    assert_int_equal(bs_json_member((bs_span_t){cut, strlen(cut)}, "a", &v), -1);
}

// ---------------------------------------------------------------------------------------------
// stats, Prometheus, the report

static double s_ref_percentile(const double *v, size_t n, double p) {
    double *s = malloc(n * sizeof *s);
    memcpy(s, v, n * sizeof *s);
    for (size_t i = 1; i < n; i++)  // insertion sort: a reference independent of qsort
        for (size_t j = i; j > 0 && s[j - 1] > s[j]; j--) {
            double t = s[j];
            s[j] = s[j - 1], s[j - 1] = t;
        }
    double rank = p / 100 * (double)(n - 1), lo = floor(rank), r = s[(size_t)lo];
    if ((size_t)lo + 1 < n)
        r += (s[(size_t)lo + 1] - s[(size_t)lo]) * (rank - lo);
    free(s);
    return r;
}

static void test_stats(void **state) {
    double v[10] = {7, 3, 10, 1, 9, 2, 8, 5, 6, 4};
    bs_summary_t s;
    bs_stats_summarize(v, 10, &s);
    // numpy: mean 5.5, median 5.5, std 2.8722813, percentile 90 -> 9.1, 95 -> 9.55, 99 -> 9.91
    assert_true(fabs(s.mean - 5.5) < 1e-12 && fabs(s.median - 5.5) < 1e-12 && s.p50 == s.median);
    assert_true(fabs(s.std - 2.8722813232690143) < 1e-12);
    assert_true(fabs(s.p90 - 9.1) < 1e-12 && fabs(s.p95 - 9.55) < 1e-12 && fabs(s.p99 - 9.91) < 1e-12);
    assert_true(s.max == 10 && s.n == 10);
    for (size_t i = 0; i < 10; i++)
        assert_true(v[i] == (double)(i + 1));  // sorted in place
    double one = 42;
    bs_stats_summarize(&one, 1, &s);
    assert_true(s.p99 == 42 && s.std == 0 && s.median == 42);
    bs_stats_summarize(NULL, 0, &s);
    assert_true(s.n == 0 && s.mean == 0 && s.p99 == 0);
    srand(3);
    enum { N = 1001 };
    double *r = malloc(N * sizeof *r), *copy = malloc(N * sizeof *copy);
    for (size_t i = 0; i < N; i++)
        r[i] = copy[i] = (double)rand() / RAND_MAX * 100;
    bs_stats_summarize(r, N, &s);
    const double ps[] = {50, 90, 95, 99};
    const double got[] = {s.p50, s.p90, s.p95, s.p99};
    for (size_t i = 0; i < 4; i++) {
        assert_true(fabs(got[i] - s_ref_percentile(copy, N, ps[i])) < 1e-9);
        assert_true(fabs(bs_stats_percentile(r, N, ps[i]) - got[i]) < 1e-12);
    }
    free(r);
    free(copy);
}

static const char s_metrics[] =
    "# HELP loraserve_adapter_cold_loads loads\n# TYPE loraserve_adapter_cold_loads counter\n"
    "loraserve_adapter_cold_loads{actor=\"scheduler\"} 4\r\n"
    "# TYPE loraserve_adapter_cpu_bytes_used gauge\n"
    "#TYPE not_a_type_line gauge\n"
    "# TYPE loraserve_adapter_cpu_loads gaugeish\n"
    "loraserve_adapter_cpu_loads{actor=\"scheduler\"} 2\n"
    "loraserve_adapter_demand_loads_total{actor=\"registry\"} 1 1712345678000\n"
    "loraserve_gateway_requests_total{model=\"a \\\"q}\\\" b\"} 7\n"
    "loraserve_gateway_ttft_seconds_bucket{le=\"+Inf\"} 3\n"
    "loraserve_gateway_ttft_seconds_sum 0.25\n"
    "weird_value NaN\n"
    "big +Inf\n"
    "   \n"
    "{no_name} 1\n"
    "no_value{a=\"b\"}\n"
    "bad_value 12abc\n"
    "unclosed{a=\"b} 5\n";

static void test_prom(void **state) {
    bs_prom_t *p = bs_prom_parse(s_metrics, strlen(s_metrics));
    assert_non_null(p);
    assert_int_equal(bs_prom_size(p), 8);
    double v;
    assert_int_equal(bs_prom_get(p, "loraserve_adapter_cold_loads{actor=\"scheduler\"}", &v), 0);
    assert_true(v == 4);
    assert_int_equal(bs_prom_get(p, "loraserve_adapter_demand_loads_total{actor=\"registry\"}", &v), 0);
    assert_true(v == 1);  // the timestamp is not the value
    assert_int_equal(bs_prom_get(p, "loraserve_gateway_requests_total{model=\"a \\\"q}\\\" b\"}", &v), 0);
    assert_true(v == 7);
    assert_int_equal(bs_prom_get(p, "loraserve_gateway_ttft_seconds_sum", &v), 0);
    assert_true(v == 0.25);
    assert_int_equal(bs_prom_get(p, "weird_value", &v), 0);
    assert_true(isnan(v));
    assert_int_equal(bs_prom_get(p, "big", &v), 0);
    assert_true(isinf(v));
    assert_int_equal(bs_prom_get(p, "bad_value", &v), -1);
    assert_int_equal(bs_prom_get(p, "loraserve_adapter_cold_loads", &v), -1);  // labels are part of the series
    assert_int_equal(bs_prom_name_len("loraserve_adapter_cold_loads{actor=\"x\"}"), strlen("loraserve_adapter_cold_loads"));
    // gauges by their TYPE line, whatever the labels; a counter's, a misspelt type or a
    // malformed line declare none
    assert_true(bs_prom_is_gauge(p, "loraserve_adapter_cpu_bytes_used{actor=\"scheduler\"}"));
    assert_true(bs_prom_is_gauge(p, "loraserve_adapter_cpu_bytes_used"));
    assert_false(bs_prom_is_gauge(p, "loraserve_adapter_cpu_bytes"));
    assert_false(bs_prom_is_gauge(p, "loraserve_adapter_cold_loads{actor=\"scheduler\"}"));
    assert_false(bs_prom_is_gauge(p, "loraserve_adapter_cpu_loads{actor=\"scheduler\"}"));
    assert_false(bs_prom_is_gauge(p, "not_a_type_line"));
    bs_prom_destroy(&p);
    assert_null(p);
}

static void test_report(void **state) {
    bs_workload_cfg_t cfg = s_cfg(4);
    cfg.input_len = 10;
    cfg.range_ratio = 1;
    bs_workload_t *w = s_new(&cfg, 2);
    double itl0[] = {10, 20}, itl1[] = {30};
    bs_result_t res[4] = {
        {.ok = 1, .ttft_ms = 100, .e2e_ms = 130, .itl_ms = itl0, .nitl = 2, .chunks = 3, .prompt_tokens = 12, .output_tokens = 4},
        {.ok = 1, .ttft_ms = 300, .e2e_ms = 330, .itl_ms = itl1, .nitl = 1, .chunks = 2, .prompt_tokens = -1, .output_tokens = 2},
        {.ok = 0, .err_kind = "http_404", .err_msg = "adapter nope is not loaded", .ttft_ms = -1, .e2e_ms = 3},
        {.ok = 0, .err_kind = "http_404", .err_msg = "again", .ttft_ms = -1, .e2e_ms = 4},
    };
    const char before_text[] = "# TYPE loraserve_adapter_cpu_bytes_used gauge\n"
                               "loraserve_adapter_cpu_bytes_used{actor=\"scheduler\"} 500\n"
                               "loraserve_adapter_cold_loads{actor=\"scheduler\"} 4\n"
                               "loraserve_adapter_cold_loads{actor=\"scheduler-1\"} 1\n"
                               "loraserve_gateway_requests_total 9\n";
    // a gauge that fell during the run is reported at its end value, not as a negative change
    const char after_text[] = "# TYPE loraserve_adapter_cpu_bytes_used gauge\n"
                              "loraserve_adapter_cpu_bytes_used{actor=\"scheduler\"} 300\n"
                              "loraserve_adapter_cold_loads{actor=\"scheduler\"} 10\n"
                              "loraserve_adapter_cold_loads{actor=\"scheduler-1\"} 3\n"
                              "loraserve_adapter_cold_load_seconds_count{actor=\"worker-0\"} 5\n"
                              "loraserve_gateway_requests_total 19\n";
    bs_prom_t *before = bs_prom_parse(before_text, strlen(before_text));
    bs_prom_t *after = bs_prom_parse(after_text, strlen(after_text));
    bs_run_data_t d = {w, res, 4, 2.0, 200, 50, before, after, 0.004, 3};
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(bs_report_fill(o, &d), 0);
    const struct {
        const char *key;
        double want;
    } nums[] = {
        {"completed", 2},          {"failed", 2},
        {"total_input_tokens", 22}, {"total_output_tokens", 6},  // 12 counted + 10 sent (no count)
        {"request_throughput", 1}, {"output_throughput", 3},
        {"input_throughput", 11},  {"total_throughput", 14},
        {"mean_ttft_ms", 200},     {"median_ttft_ms", 200},
        {"max_ttft_ms", 300},      {"mean_itl_ms", 20},
        {"p50_itl_ms", 20},        {"max_itl_ms", 30},
        {"mean_tpot_ms", 20},      // (130-100)/3 = 10 and (330-300)/1 = 30
        {"mean_e2e_latency_ms", 230}, {"concurrency", 0.23},
        {"slo_attainment", 0.25},  // one of four: ttft 100 <= 200 and tpot 10 <= 50
        {"adapter_cold_loads", 8}, {"adapter_cold_load_seconds_count", 5},
        {"adapter_cpu_bytes_used", 300},
        {"total_chunks", 5},       {"max_inflight", 3},
        {"bench_cpu_us_per_request", 1000}, {"bench_cpu_us_per_chunk", 800},
    };
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, nums[i].key);
        if (!cJSON_IsNumber(v) || fabs(v->valuedouble - nums[i].want) > 1e-9 * (1 + fabs(nums[i].want)))
            fail_msg("%s: %g, want %g", nums[i].key, cJSON_IsNumber(v) ? v->valuedouble : NAN, nums[i].want);
    }
    const char *stats[] = {"mean", "median", "std", "p50", "p90", "p95", "p99", "max"};
    const char *metrics[] = {"ttft", "tpot", "itl", "e2e_latency"};
    for (size_t m = 0; m < 4; m++)
        for (size_t k = 0; k < 8; k++) {
            char key[64];
            snprintf(key, sizeof key, "%s_%s_ms", stats[k], metrics[m]);
            assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, key)));
        }
    const cJSON *errors = cJSON_GetObjectItemCaseSensitive(o, "errors");
    assert_int_equal(cJSON_GetArraySize(errors), 1);
    assert_true(cJSON_GetObjectItemCaseSensitive(errors, "http_404")->valuedouble == 2);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error_samples"), "http_404")
                            ->valuestring,
                        "adapter nope is not loaded");
    const cJSON *am = cJSON_GetObjectItemCaseSensitive(o, "adapter_metrics");
    assert_int_equal(cJSON_GetArraySize(am), 4);  // the gateway's series are not adapter counters
    assert_true(cJSON_GetObjectItemCaseSensitive(am, "loraserve_adapter_cold_loads{actor=\"scheduler-1\"}")->valuedouble == 2);
    // The table comes from the same object.
    char *table = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&table, &len);
    bs_report_print(f, o);
    fclose(f);
    assert_contains(table, "Successful requests:                     2");
    assert_contains(table, "http_404                                 2  e.g. adapter nope is not loaded");
    assert_contains(table, "SLO attainment:                          25.00%");
    free(table);
    cJSON_Delete(o);
    // Without /metrics: adapter_metrics is null and no SLO was asked for.
    d.before = NULL;
    d.slo_ttft_ms = d.slo_tpot_ms = 0;
    o = cJSON_CreateObject();
    assert_int_equal(bs_report_fill(o, &d), 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "adapter_metrics")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "slo_attainment")));
    assert_null(cJSON_GetObjectItemCaseSensitive(o, "adapter_cold_loads"));
    cJSON_Delete(o);
    bs_prom_destroy(&before);
    bs_prom_destroy(&after);
    bs_workload_destroy(&w);
}

static int s_setup(void **state) { return tu_tmpdir(s_dir, sizeof s_dir, "bench"); }
static int s_teardown(void **state) { return tu_rmrf(s_dir); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_workload_seeded), cmocka_unit_test(test_workload_zipf),
        cmocka_unit_test(test_workload_single_base), cmocka_unit_test(test_workload_lengths),
        cmocka_unit_test(test_workload_poisson), cmocka_unit_test(test_dist_parse),
        cmocka_unit_test(test_dataset),         cmocka_unit_test(test_dataset_errors),
        cmocka_unit_test(test_sse_splits),      cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_jscan),           cmocka_unit_test(test_stats),
        cmocka_unit_test(test_prom),            cmocka_unit_test(test_report),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
