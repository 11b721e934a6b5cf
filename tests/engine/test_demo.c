// The demo model and its adapters (examples/demo), through the engine on the CPU backend.
//
// Every held-out prompt of examples/demo/eval.json, for the base model and each of the four
// adapters, is decoded greedily in ONE mixed batch (base and every adapter side by side, raw
// and chat variants), and each output must equal, token for token, the rule-computed answer
// (eval.json's output_ids, which decode to `expected`: " red 1 road leaf 5" for reverse, and so
// on). The adapters do visibly different things to the same prompt, so this only passes when
// each request gets its own adapter. A second run with the adapters sharing fewer slots than
// there are adapters (two batches) checks the slot pool's reuse gives the same answers.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine_checks.h"

static void s_demo(int slots) {
    char err[1024];
    ls_backend_t *be = ls_backend_cpu_new(1);
    ec_demo_t r;
    if (ec_demo(be, LS_QUANT_NONE, LS_DEMO_DIR, slots, &r, err, sizeof err) < 0)
        fail_msg("%s", err);
    ls_backend_destroy(&be);
    print_message("demo, %d slots: %d requests, %d mismatches, %llu slot evictions\n", slots, r.requests,
                  r.mismatches, (unsigned long long)r.pool.slot_evictions);
    // every held-out prompt (raw and chat) of the five models; with two slots, base + two
    // adapters for each of 32 prompt variants
    assert_int_equal(r.requests, slots >= 4 ? 5 * 16 * 2 : 3 * 32);
    assert_int_equal(r.mismatches, 0);
    if (slots < 4)
        assert_true(r.pool.slot_evictions > 0);  // the point of that run: slots changed hands
}

// One batch: base + all four adapters in four slots, 160 requests decoded together.
static void test_demo_one_batch(void **unused) { s_demo(4); }

// Two slots for four adapters: batches of base + two adapters in turn, so slots are reused.
static void test_demo_slot_reuse(void **unused) { s_demo(2); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_one_batch),
        cmocka_unit_test(test_demo_slot_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
