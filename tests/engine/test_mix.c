// Mixing adapters per request (docs/lora-mixing.md) on the CPU backend, with the llama fixture
// of tests/fixtures and two of its adapters (ranks 8 and 4, different targets): ec_mix
// (engine_checks.c, shared with the GPU test) runs a batch of mixes beside the base model and
// single adapters against the same batch with, in the mixes' places, the "cat" adapters
// PEFT's add_weighted_adapter(combination_type="cat") would build — A = concat(w_i·s_i·A_i),
// B = concat(B_i), scaling 1 — loaded as ordinary adapters.
//
// Tolerance. The two compute the same sum in a different order and rounding: the mix scales
// the product B·(A·x) by the fp32 w·s, the cat adapter holds w·s·A rounded to fp32 and sums
// the two rank blocks in one GEMM. Both are fp32 throughout on the CPU: differences are a few
// ulps of the LoRA delta, measured max |Δ| ~1e-6 on logits up to ~4; TOL_LOGITS = 5e-5, as
// the fixture parity's, still catches a wrong weight (0.7 vs 0.3 of a delta moving logits
// by ~0.5-4 is off by ~0.1 or more). The other rows (base, a one-component mix of weight 1,
// a single adapter) must be bit-identical to the reference batch: a mix changes nothing
// beside it.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "engine_checks.h"

#ifndef LS_FIXTURES_DIR
#error "LS_FIXTURES_DIR must name tests/fixtures"
#endif

#define TOL_LOGITS 5e-5  // as test_parity's: fp32 math on both sides
#define GAP_MIN 1e-3     // as test_parity's: a closer top-2 may go either way within TOL_LOGITS

static void test_mix_llama(void **state) {
    char err[1024] = "";
    ls_backend_t *be = ls_backend_cpu_new(1);
    ec_mix_t r;
    if (ec_mix(be, LS_QUANT_NONE, LS_FIXTURES_DIR, "llama", GAP_MIN, &r, err, sizeof err) < 0)
        fail_msg("%s", err);
    ls_backend_destroy(&be);
    print_message("llama: %d rows, %d steps compared (prefill + decode): mixed rows max|Δ| %.3e against the "
                  "cat adapters (logits up to %.2f, bound %.0e); other rows identical: %s; malformed mixes "
                  "refused: %d of 5\n",
                  r.rows, r.steps_compared, r.mix_max, r.mix_mag, TOL_LOGITS, r.single_identical ? "yes" : "NO",
                  r.refused);
    assert_int_equal(r.steps_compared, 9);  // the prefill and every decode step
    assert_true(r.mix_max <= TOL_LOGITS);
    assert_true(r.mix_mag > 1.0);          // not vacuous: real logits were compared
    assert_true(r.single_identical);
    assert_int_equal(r.refused, 5);
    print_message("llama: against PEFT's add_weighted_adapter(cat): last-position logits max|Δ| %.3e (up to %.2f, "
                  "bound %.0e); greedy tokens %d compared, %d mismatched\n",
                  r.peft_max, r.peft_mag, TOL_LOGITS, r.peft_greedy_compared, r.peft_greedy_mismatched);
    assert_true(r.peft_max <= TOL_LOGITS);
    assert_true(r.peft_mag > 1.0);
    assert_int_equal(r.peft_greedy_compared, 18);  // both mixes, the prefill's token and 8 decodes
    assert_int_equal(r.peft_greedy_mismatched, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mix_llama),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
