// The tokenizer's latency histograms (actors/tokenizer/latency.c) and the adapter-series cap they
// keep (common/ls_series.c), without sockets or clocks.
//   series   — the base and "other" have fixed series; adapters take theirs until the cap, then
//              the least recently used gives its up (the caller folds it); a drop frees one; a
//              name "other" counts as other; a cap of 0 puts every adapter under other
//   buckets  — a value on a bound falls in that bucket, one above every bound in the last; times
//              observations at once; the exported shape is the schema's (one count per bound and
//              one more, bounds ascending), vLLM's bounds
//   fold     — over the cap and on forget, the adapter's counts and sum move to "other": every
//              family's total over the series never goes down; nothing exported for a series
//              with no observation
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "latency.h"
#include "ls_series.h"

static void test_series(void **state) {
    ls_series_t *s = ls_series_new(2);
    assert_non_null(s);
    assert_int_equal(ls_series_slots(s), 4);
    int fold;
    assert_int_equal(ls_series_take(s, "", &fold), LS_SERIES_BASE);
    assert_int_equal(ls_series_take(s, NULL, &fold), LS_SERIES_BASE);
    assert_int_equal(ls_series_take(s, "other", &fold), LS_SERIES_OTHER);
    assert_int_equal(fold, -1);
    int a = ls_series_take(s, "a", &fold);
    assert_int_equal(fold, -1);
    int b = ls_series_take(s, "b", &fold);
    assert_int_equal(fold, -1);
    assert_true(a >= 2 && b >= 2 && a != b);
    assert_int_equal(ls_series_take(s, "a", &fold), a);  // a is now the most recent
    int c = ls_series_take(s, "c", &fold);
    assert_int_equal(fold, b);  // b, the least recently used, gives its series to c
    assert_int_equal(c, b);
    assert_string_equal(ls_series_name(s, c), "c");
    assert_string_equal(ls_series_name(s, LS_SERIES_BASE), "");
    assert_string_equal(ls_series_name(s, LS_SERIES_OTHER), "other");
    assert_int_equal(ls_series_drop(s, "a"), a);
    assert_null(ls_series_name(s, a));
    assert_int_equal(ls_series_drop(s, "a"), -1);
    assert_int_equal(ls_series_drop(s, ""), -1);  // the base never leaves
    assert_int_equal(ls_series_take(s, "d", &fold), a);  // the freed one, nothing to fold
    assert_int_equal(fold, -1);
    assert_null(ls_series_name(s, 9));
    ls_series_destroy(&s);
    ls_series_destroy(&s);
    assert_null(s);

    s = ls_series_new(0);
    assert_int_equal(ls_series_take(s, "a", &fold), LS_SERIES_OTHER);
    assert_int_equal(fold, -1);
    ls_series_destroy(&s);
    assert_null(ls_series_new(-1));
}

// The exported histogram of family name for adapter, or NULL.
static const ls_msg_histogram_t *s_find(const ls_msg_metrics_t *m, const char *name, const char *adapter) {
    for (size_t i = 0; i < m->histograms.n; i++)
        if (!strcmp(m->histograms.v[i].name, name) && !strcmp(m->histograms.v[i].adapter, adapter))
            return &m->histograms.v[i];
    return NULL;
}

static uint64_t s_total(const ls_msg_histogram_t *h) {
    uint64_t n = 0;
    for (size_t i = 0; h && i < h->counts.n; i++)
        n += h->counts.v[i];
    return n;
}

static void s_export(const latency_t *l, ls_msg_t *m) {
    ls_msg_init(m, LS_MSG_METRICS);
    assert_int_equal(latency_export(l, &m->u.metrics), 0);
}

static void test_buckets(void **state) {
    latency_t *l = latency_new(4);
    assert_non_null(l);
    latency_observe(l, "", LATENCY_TTFT, 1000, 1);        // on the first bound (1 ms)
    latency_observe(l, "", LATENCY_TTFT, 1001, 2);        // just above: the second bucket, twice
    latency_observe(l, "", LATENCY_TTFT, 9000000000, 1);  // above every bound
    latency_observe(l, "", LATENCY_TTFT, 5, 0);           // no observation
    ls_msg_t m;
    s_export(l, &m);
    assert_int_equal(m.u.metrics.histograms.n, 3);  // the base's three families, nothing else
    const ls_msg_histogram_t *h = s_find(&m.u.metrics, "time_to_first_token_seconds", "");
    assert_non_null(h);
    assert_int_equal(h->counts.n, h->le_us.n + 1);
    for (size_t i = 1; i < h->le_us.n; i++)
        assert_true(h->le_us.v[i] > h->le_us.v[i - 1]);
    assert_int_equal(h->le_us.n, 22);  // vLLM's TTFT buckets: 1 ms to 2560 s
    assert_int_equal(h->le_us.v[0], 1000);
    assert_int_equal(h->le_us.v[21], 2560000000ull);
    assert_int_equal(h->counts.v[0], 1);
    assert_int_equal(h->counts.v[1], 2);
    assert_int_equal(h->counts.v[22], 1);
    assert_int_equal(s_total(h), 4);
    assert_int_equal(h->sum_us, 1000 + 2 * 1001 + 9000000000ull);
    assert_non_null(h->help);
    const ls_msg_histogram_t *itl = s_find(&m.u.metrics, "inter_token_latency_seconds", "");
    assert_int_equal(itl->le_us.n, 19);
    assert_int_equal(s_total(itl), 0);
    assert_int_equal(s_find(&m.u.metrics, "e2e_request_latency_seconds", "")->le_us.n, 21);
    ls_msg_clear(&m);
    latency_destroy(&l);
    latency_destroy(&l);
}

static void test_fold(void **state) {
    latency_t *l = latency_new(1);
    latency_observe(l, "a", LATENCY_E2E, 400000, 3);
    latency_observe(l, "a", LATENCY_TTFT, 2000, 3);
    latency_observe(l, "b", LATENCY_E2E, 100000, 1);  // over the cap: a folds into other
    ls_msg_t m;
    s_export(l, &m);
    assert_null(s_find(&m.u.metrics, "e2e_request_latency_seconds", "a"));
    const ls_msg_histogram_t *o = s_find(&m.u.metrics, "e2e_request_latency_seconds", "other");
    assert_int_equal(s_total(o), 3);
    assert_int_equal(o->sum_us, 1200000);
    assert_int_equal(s_total(s_find(&m.u.metrics, "time_to_first_token_seconds", "other")), 3);
    assert_int_equal(s_total(s_find(&m.u.metrics, "e2e_request_latency_seconds", "b")), 1);
    assert_null(s_find(&m.u.metrics, "e2e_request_latency_seconds", ""));  // the base: nothing yet
    ls_msg_clear(&m);
    latency_forget(l, "b");
    latency_forget(l, "never");
    s_export(l, &m);
    assert_null(s_find(&m.u.metrics, "e2e_request_latency_seconds", "b"));
    assert_int_equal(s_total(s_find(&m.u.metrics, "e2e_request_latency_seconds", "other")), 4);
    ls_msg_clear(&m);
    latency_destroy(&l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_series),
        cmocka_unit_test(test_buckets),
        cmocka_unit_test(test_fold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
