// The latency histograms per adapter at /metrics (docs/operations.md, "Metrics"): the real graph
// (launch/loraserve on the demo model, on the CPU, --metrics-max-adapters 2), requests through
// the gateway, the page parsed as a Prometheus client parses it (tests/common/test_prom.h).
//   per_adapter — requests for the base model (one streamed), reverse and upper, and one for an
//                 adapter nobody loaded (404): in each family (loraserve_ and vllm:, TTFT,
//                 inter-token and end-to-end) the histograms are well-formed (buckets monotone,
//                 +Inf equal to _count, _sum > 0), _count is the requests made per adapter (the
//                 inter-token one: the tokens after each first), the base labelled by its served
//                 name; no series names the 404'd adapter, none is "other" yet
//   cap         — a third adapter (sort) over the cap of 2: the least recently used (reverse)
//                 folds into "other", its counts kept there, and the gateway's per-model
//                 counters follow the same policy; an unloaded adapter (upper) folds too
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "test_prom.h"
#include "test_util.h"

#define PROMPT "input: 5 leaf road 1 red\\noutput:"
#define BASE "demo"  // the served name of examples/demo: its directory's

static const char *const s_families[] = {"time_to_first_token_seconds", "inter_token_latency_seconds",
                                         "e2e_request_latency_seconds"};
static tu_http_graph_t s_g;
static tp_page_t *s_page;

// A completion of 8 tokens for model; the HTTP status.
static int s_generate(const char *model, int stream) {
    char body[256];
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"" PROMPT "\",\"max_tokens\":8,\"ignore_eos\":true,\"temperature\":0,"
             "\"stream\":%s}",
             model, stream ? "true" : "false");
    return tu_http_post(s_g.port, s_g.dir, "/v1/completions", body);
}

static void s_scrape(void) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", s_g.port);
    char *text = tu_curl(s_g.dir, (const char *[]){url, NULL});
    assert_non_null(text);
    tp_parse(s_page, text);
    free(text);
    tp_check_histograms(s_page);
}

// Whether any sample has label `label` = value.
static bool s_labelled(const char *label, const char *value) {
    for (int i = 0; i < tp_count(s_page); i++) {
        const char *v = tp_label_or_null(tp_sample(s_page, i), label);
        if (v && !strcmp(v, value))
            return true;
    }
    return false;
}

static double s_counter(const char *name, const char *model) {
    for (int i = 0; i < tp_count(s_page); i++) {
        const tp_sample_t *s = tp_sample(s_page, i);
        const char *v = tp_label_or_null(s, "model");
        if (!strcmp(s->name, name) && v && !strcmp(v, model))
            return s->value;
    }
    return -1;
}

// Each family, in both forms, counts `requests` completions of 8 tokens for series `value` (or
// has no such series with requests 0).
static void s_expect(const char *value, int requests) {
    for (int f = 0; f < 3; f++)
        for (int form = 0; form < 2; form++) {
            char family[96];
            snprintf(family, sizeof family, "%s%s", form ? "vllm:" : "loraserve_", s_families[f]);
            const char *label = form ? "model_name" : "adapter";
            assert_string_equal(tp_type(s_page, family), "histogram");
            double count = 0, sum = 0;
            bool found = tp_histogram(s_page, family, label, value, &count, &sum);
            int want = f == 1 ? requests * 7 : requests;  // 8 tokens: 7 gaps after the first
            if (found != (requests > 0) || (int)count != want)
                fail_msg("%s{%s=\"%s\"}: %s, _count %g, %d expected", family, label, value,
                         found ? "found" : "absent", count, want);
        }
    double answered = s_counter("loraserve_gateway_requests_total", value);
    if ((int)answered != (requests ? requests : -1))
        fail_msg("loraserve_gateway_requests_total{model=\"%s\"} is %g, %d expected", value, answered, requests);
}

static int s_setup(void **state) {
    s_page = tp_page_new();
    const char *args[] = {"--metrics-max-adapters", "2", NULL};
    assert_int_equal(tu_http_graph_up(&s_g, LS_LAUNCH_SCRIPT, LS_BIN_DIR, "latency", args), 0);
    return 0;
}

static int s_teardown(void **state) {
    assert_int_equal(tu_http_graph_down(&s_g), 0);
    tp_page_destroy(&s_page);
    return 0;
}

static void test_per_adapter(void **state) {
    assert_int_equal(s_generate(BASE, 0), 200);
    assert_int_equal(s_generate(BASE, 1), 200);
    for (int i = 0; i < 3; i++)
        assert_int_equal(s_generate("reverse", i == 1), 200);
    assert_int_equal(s_generate("upper", 0), 200);
    assert_int_equal(s_generate("nope", 0), 404);
    s_scrape();
    s_expect(BASE, 2);
    s_expect("reverse", 3);
    s_expect("upper", 1);
    s_expect("other", 0);
    assert_false(s_labelled("adapter", "nope"));
    assert_false(s_labelled("model_name", "nope"));
    assert_false(s_labelled("model", "nope"));
}

static void test_cap(void **state) {
    // reverse was used before upper: it gives its series up to sort.
    assert_int_equal(s_generate("sort", 0), 200);
    s_scrape();
    s_expect(BASE, 2);
    s_expect("reverse", 0);
    s_expect("other", 3);
    s_expect("upper", 1);
    s_expect("sort", 1);
    // An adapter unloaded keeps no series: upper's counts go to "other" too.
    assert_int_equal(tu_http_post(s_g.port, s_g.dir, "/v1/unload_lora_adapter", "{\"lora_name\":\"upper\"}"), 200);
    s_scrape();
    s_expect("upper", 0);
    s_expect("other", 4);
    s_expect("sort", 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_adapter),
        cmocka_unit_test(test_cap),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
