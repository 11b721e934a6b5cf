// Golden parity against HF transformers + PEFT (llm.c test_gpt2 style), on the CPU backend:
// for each fixture architecture under tests/fixtures/<arch>/ (written by
// tools/make_fixtures.py), load the model and adapters, run the reference's mixed batch (base
// + several adapters, one forward) and compare (engine_checks.c, shared with the GPU test):
//   - last-position logits of every row with reference.safetensors "last_logits";
//   - logits at every prompt position of rows 0 and 1 ("all_logits_row0/1"), run as one
//     batch of the prompt's prefixes (each prefix's last token is one position);
//   - greedy continuations (decode steps of the whole mixed batch over the paged cache,
//     sampled with ls_model_sample at temperature 0) with "greedy_ids", step by step, up
//     to the first step where the reference's top-2 logit gap is below GAP_MIN: from
//     there on a 1e-4 difference may legitimately pick the other token.
//
// Tolerance. The reference is fp32 math (no TF32, eager attention) on exactly the stored
// weights, as is the CPU backend; what differs is summation order (GPU GEMM vs OpenBLAS,
// softmax, PEFT's lora_B(lora_A(x))·scaling vs our shrink/expand with the scaling applied
// in the expand or folded into B) and RoPE's inverse frequencies (ours evaluated in double
// and rounded once, torch's pow in fp32: up to 1 ulp apart). Measured with the fixtures of
// tools/make_fixtures.py (logits up to ~3; 14 in qwen2's row with trainable tokens): max |Δ|
// 1.7e-6 .. 3.4e-6 on the mixed batches' last positions (<= 9e-7 on the rows with trainable
// tokens), <= 5.2e-6 over all prompt positions. TOL_LOGITS = 5e-5, ten times that,
// leaves room for other BLAS builds and thread counts while still catching any real error
// (a wrong scaling, slice or rope frequency moves logits by 1e-2 or more: the adapters
// move them by ~0.5-4).
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

#define TOL_LOGITS 5e-5
#define GAP_MIN 1e-3

static void s_arch(const char *arch) {
    char err[1024];
    ls_backend_t *be = ls_backend_cpu_new(1);
    ec_parity_t r;
    if (ec_parity(be, LS_QUANT_NONE, LS_FIXTURES_DIR, arch, GAP_MIN, &r, err, sizeof err) < 0)
        fail_msg("%s: %s", arch, err);
    ls_backend_destroy(&be);
    print_message("%s: mixed batch of %d rows: last logits max|Δ| %.3e (rms %.2e, logits up to %.2f), all "
                  "prompt positions of rows 0-1 max|Δ| %.3e (bound %.0e); greedy identical on %d compared steps "
                  "of %d (smallest reference top-2 gap among them %.2e)\n",
                  arch, r.rows, r.last_max, r.last_rms, r.last_mag, r.all_max, TOL_LOGITS,
                  r.greedy_compared, r.greedy_total, r.min_gap_compared);
    assert_true(r.last_max <= TOL_LOGITS);
    assert_true(r.all_max <= TOL_LOGITS);
    assert_int_equal(r.greedy_mismatched_rows, 0);
    assert_true(r.greedy_compared > r.greedy_total / 2);  // the comparison is not vacuous
}

// Added vocabulary (ec_added): the llama fixture's adapter whose tokenizer adds tokens past the
// vocabulary, against PEFT on its resized model. Its reference (added.json, added.safetensors)
// comes from tools/make_fixtures.py --added; without it this test fails, naming the command.
static void test_llama_added_vocab(void **state) {
    char err[1024];
    ls_backend_t *be = ls_backend_cpu_new(1);
    ec_added_t r;
    if (ec_added(be, LS_QUANT_NONE, LS_FIXTURES_DIR, "llama", GAP_MIN, &r, err, sizeof err) < 0)
        fail_msg("llama added vocabulary: %s", err);
    ls_backend_destroy(&be);
    print_message("llama added vocabulary: %d of the prompt's ids and %d reference greedy tokens are added ids; "
                  "last logits over %d columns max|Δ| %.3e (logits up to %.2f), the %d past them -inf: %s; base row "
                  "beside it max|Δ| %.3e; greedy identical on %d compared steps of %d\n",
                  r.added_in_prompt, r.greedy_added, r.width, r.last_max, r.last_mag, r.logits_width - r.width,
                  r.past_neg_inf ? "yes" : "no", r.base_max, r.greedy_compared, r.greedy_total);
    assert_true(r.added_in_prompt > 0);
    assert_true(r.last_max <= TOL_LOGITS);
    assert_true(r.base_max <= TOL_LOGITS);
    assert_true(r.past_neg_inf);
    assert_int_equal(r.greedy_mismatched, 0);
    assert_true(r.greedy_compared > r.greedy_total / 2);
}

static void test_llama(void **state) { s_arch("llama"); }
static void test_qwen2(void **state) { s_arch("qwen2"); }
static void test_qwen3(void **state) { s_arch("qwen3"); }
static void test_mistral(void **state) { s_arch("mistral"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_llama_added_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
