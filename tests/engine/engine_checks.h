// engine_checks — whole-model checks shared by the CPU tests (tests/engine) and the GPU test
// (tests/gpu/test_gpu_model.c): the same code runs on any backend, and each caller asserts
// the results against its own bounds (fp32 on the CPU; bf16-rounded matmuls on the GPU).
//
//   ec_parity — a fixture model of tests/fixtures/<arch> against the HF transformers + PEFT
//               references: the mixed batch's last-position logits, every prompt position of
//               rows 0 and 1, and greedy continuations of the mixed batch by decode steps,
//               compared up to the first step whose reference top-2 gap is below gap_min (a
//               near tie may go either way within the tolerance).
//   ec_demo   — the demo model (examples/demo): every held-out prompt of eval.json for the
//               base model and the four adapters (raw and chat variants), decoded greedily in
//               mixed batches, against the answers of eval.json, token for token.
//   ec_mix    — mixes of two of a fixture's adapters (docs/lora-mixing.md) against the
//               "cat" adapter PEFT's add_weighted_adapter(combination_type="cat") builds
//               from them, written by the check and loaded as an ordinary adapter: a batch
//               [mix 0.7/0.3, base, a one-component mix of weight 1, adapter b, mix 0.25/0.5
//               in the other order] against the same batch with the cat adapters in the
//               mixes' places, prefill then greedy decode steps (the decode-shaped LoRA op),
//               logits compared at every step while the greedy tokens agree; then malformed
//               mixes, each of which the step must refuse. The two mixed rows also against
//               PEFT's own "cat" mixes (mix.safetensors, mix.json): their last prompt
//               position's logits, and their greedy tokens while the reference's top-2 gap is
//               at least gap_min.
// All load the model with quant (LS_QUANT_FP8: FP8 projections made at load, measured
// against the same references). All return -1 with err for a setup failure (missing files,
// a load that fails), 0 with the measurements otherwise.
#ifndef LS_TEST_ENGINE_CHECKS_H
#define LS_TEST_ENGINE_CHECKS_H

#include <stddef.h>

#include "backend.h"
#include "lora_pool.h"

typedef struct {
    int rows, vocab;
    double last_max;   // max |Δ| of the mixed batch's last-position logits
    double last_mag;   // largest |reference logit| there, for scale
    double last_rms;
    double all_max;    // max |Δ| over every prompt position of rows 0 and 1
    int greedy_compared, greedy_total, greedy_mismatched_rows;
    int greedy_agreed;        // of the compared steps, those before a row's first mismatch
    double min_gap_compared;  // smallest reference top-2 gap among the compared steps
} ec_parity_t;

int ec_parity(ls_backend_t *be, ls_quant_t quant, const char *fixtures_dir, const char *arch, double gap_min,
              ec_parity_t *out, char *err, size_t errlen);

typedef struct {
    int rows;
    int steps_compared;     // prefill + decode steps whose logits were compared (<= 9)
    double mix_max;         // max |Δ| of the mixed rows' logits against the cat adapters'
    double mix_mag;         // largest |logit| there, for scale
    int single_identical;   // the other rows' logits equal the reference batch's bit for bit
    double single_max;      // max |Δ| there (0 when identical)
    int refused;            // malformed mixes refused with a message (of 5)
    // against PEFT's add_weighted_adapter(combination_type="cat") (<arch>/mix.safetensors and
    // mix.json, tools/make_fixtures.py --mix): the two mixed rows' last prompt positions, and
    // their greedy tokens while the reference's top-2 gap is at least gap_min
    double peft_max, peft_mag;
    int peft_greedy_compared, peft_greedy_mismatched;
} ec_mix_t;

int ec_mix(ls_backend_t *be, ls_quant_t quant, const char *fixtures_dir, const char *arch, double gap_min, ec_mix_t *out,
           char *err, size_t errlen);

// Added vocabulary (docs/adapters.md) against PEFT (<arch>/added.json and added.safetensors,
// tools/make_fixtures.py --added): the adapter with added tokens, from its stored directory,
// beside the base model in one batch: its row's last prompt position over its vocabulary
// (vocab_size + its added tokens, the width PEFT's resized model has) and every column past
// it -inf; the base row against reference.json's row 0; both rows' greedy tokens (decode
// steps, sampled over the whole width) while the reference's top-2 gap is at least gap_min.
typedef struct {
    int width;              // the adapter's vocabulary
    int logits_width;       // the engine's logits rows
    int added_in_prompt;    // prompt ids at or past vocab_size
    double last_max, last_mag;  // its row against PEFT's, and the largest |logit| there
    int past_neg_inf;       // the columns past width are all -inf on both rows
    double base_max;        // the base row against reference.json's
    int greedy_compared, greedy_total, greedy_mismatched;
    int greedy_added;       // reference greedy tokens that are added ids
} ec_added_t;

int ec_added(ls_backend_t *be, ls_quant_t quant, const char *fixtures_dir, const char *arch, double gap_min,
             ec_added_t *out, char *err, size_t errlen);

typedef struct {
    int requests;    // decoded (base + four adapters × 16 prompts × raw and chat)
    int mismatches;  // outputs that differ from eval.json
    ls_lora_pool_stats_t pool;
} ec_demo_t;

// slots: the pool's max_loras_per_batch. With 4 (every adapter at once) all requests are
// decoded in one batch, adapters interleaved; with fewer, in batches of base + two adapters
// in turn, so slots change hands between batches.
int ec_demo(ls_backend_t *be, ls_quant_t quant, const char *demo_dir, int slots, ec_demo_t *out, char *err,
            size_t errlen);

#endif
