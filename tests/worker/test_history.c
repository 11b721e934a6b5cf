// The worker's per-request token history (actors/worker/history.c) alone.
//   rid_zero — request id 0 names no request: recording or dropping it changes nothing. Before,
//              an empty slot answered for it: a drop counted the live entries down (past zero),
//              and tokens recorded under it went into a slot still taken for empty, lost to the
//              table and never freed (a leak per plan, found by fuzz_actor_worker).
//   growth   — many requests grow the table; each keeps its own tokens, a drop forgets one.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "history.h"

static void test_rid_zero(void **unused) {
    ls_history_t *h = ls_history_new();
    assert_non_null(h);
    ls_history_drop(h, 0);
    const int32_t ids[] = {5, 6, 7};
    ls_history_add_prompt(h, 0, ids, 3);
    ls_history_add_output(h, 0, 9);
    assert_int_equal(ls_history_size(h), 0);
    // Rows for rid 0 (and for a rid never seen) have no tokens.
    uint64_t rids[] = {0, 77};
    ls_sampling_batch_t batch = {0};
    ls_history_batch(h, rids, 2, &batch);
    assert_int_equal(batch.prompt_indptr[2], 0);
    assert_int_equal(batch.output_indptr[2], 0);
    ls_history_batch_free(&batch);
    ls_history_destroy(&h);
}

static void test_growth(void **unused) {
    ls_history_t *h = ls_history_new();
    ls_history_drop(h, 0);
    enum { N = 300 };
    for (int32_t i = 0; i < N; i++) {
        ls_history_add_prompt(h, 1000 + (uint64_t)i, &i, 1);
        ls_history_add_output(h, 1000 + (uint64_t)i, -i);
    }
    assert_int_equal(ls_history_size(h), N);
    ls_history_drop(h, 1007);
    assert_int_equal(ls_history_size(h), N - 1);
    uint64_t rids[] = {1007, 1299};
    ls_sampling_batch_t batch = {0};
    ls_history_batch(h, rids, 2, &batch);
    assert_int_equal(batch.prompt_indptr[1], 0);  // 1007 was dropped
    assert_int_equal(batch.prompt_indptr[2], 1);
    assert_int_equal(batch.prompt_ids[0], 299);
    assert_int_equal(batch.output_ids[0], -299);
    ls_history_batch_free(&batch);
    ls_history_destroy(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_rid_zero), cmocka_unit_test(test_growth)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
