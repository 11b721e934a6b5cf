/*  tests/gpu/test_gpu_model.c — the whole model on the CUDA backend, through ls_model_load.

    The checks of 1. and 2. are tests/engine/engine_checks.c, shared with the CPU tests; this
    program runs them on the CUDA backend with bf16-aware bounds.
    1. HF parity (tests/engine/test_parity.c on the GPU): for each fixture architecture
       (tests/fixtures/<arch>), the mixed batch's last-position logits, every prompt
       position of rows 0 and 1, and the greedy continuations of the mixed batch by decode
       steps over the paged cache (ls_model_sample at temperature 0), against the HF +
       PEFT references (fp32 math on the stored weights).
    2. The demo model (tests/engine/test_demo.c on the GPU): every held-out prompt of
       examples/demo/eval.json for the base model and the four adapters, decoded greedily in
       one mixed batch, must equal the expected outputs token for token; then again with two
       slots for four adapters (slot reuse).
    3. The dummy loader: a small config with random weights on the GPU and on the CPU
       backend, one mixed prefill + decode step, logits compared; in bf16 and in FP8
       (--quantization fp8: the FP8 GEMMs as production picks them, our own (tc on sm_89+)
       at the decode step, and cuBLASLt's alone with the scales applied after it,
       ls_backend_cuda_set_fp8_paths).
    6. FP8 (tests/engine/test_fp8.c on the GPU): the fixtures and the demo loaded with
       LS_QUANT_FP8, against the HF references and eval.json, with test_fp8.c's bounds
       (FP8 moves logits; the GPU computes the CPU's FP8 math up to summation order); and
       2b's mixes over the FP8 projections.
    4. Asynchronous slot loads (lora_pool.h): with references taken after waiting for each
       load, the logits must be bit-identical when (a) a step reads a slot whose load was
       only started, (b) a load is started into the slot that the step queued before it
       reads (the step must see the old adapter, the next one the new), (c) a load into
       another slot runs alongside a queued step (PrefetchAdapter).
    2b. Mixes of adapters (tests/engine/test_mix.c on the GPU): ec_mix, with the bf16 bound.
    2c. Added vocabulary (tests/engine/test_parity.c's llama row on the GPU): ec_added, the
       adapter whose tokenizer adds tokens past the vocabulary against PEFT on its resized
       model, with the llama fixture's bound.
    5. Step graphs (backend_cuda.cu): the same prefill and decode steps with graphs off and
       on must give bit-identical logits, through captures, replays, a change of batch
       shape and back (a cached graph found again) and rows changing adapters; and the
       side queue (each decode LoRA beside its GEMM, ls_backend_cuda_set_side) with graphs
       off and on must give the logits of LoRA after each GEMM, bit for bit. The decode
       block as one op (backend.h decode_block): batch-1 decode steps on the base model take
       it in every layer, the same logits with graphs bit for bit and within the bf16 bound
       of the ops one by one; steps on an adapter or of two rows do not take it.

    Tolerance. The reference is fp32 math. The CUDA backend keeps activations in fp32 but
    (backend_cuda.h) rounds them once to the weight dtype at each bf16/f16 matmul, and the
    KV cache is stored in the model's weight dtype (ls_model_kv_dtype): bf16 has an 8-bit
    significand (relative rounding 2^-9 = 2e-3), f16 11 bits (2.4e-4). Logits of these
    fixtures reach ~3.7, and the roundings of ~10 matmul inputs per layer add up with random
    signs, so the bounds are:
      f32 checkpoints (qwen2):   5e-5  (TF32 off: summation order only, as on the CPU)
      f16 (mistral):             1e-2
      bf16 (llama, qwen3, demo): 5e-2
    and greedy tokens are compared up to the first step whose reference top-2 gap is below
    twice the bound (a tie within the tolerance may legitimately go either way). The
    measured max |Δ| is printed for every check, and the summary line gives it per arch.

    Usage: test_gpu_model [--cpu] [--device N] [--fp8]   (--cpu runs the same checks on the
    CPU backend, with the CPU bound 5e-5 for every dtype: a desk check of the test itself;
    --fp8 runs only the FP8 checks, 3 in FP8 and 6)
    Exit status 0 when every check passed. Not a ctest: tests/gpu/run.sh runs it.
*/
#include "random_model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend.h"
#include "engine_checks.h"
#include "slot_plan.h"
#ifdef LS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend_cuda.h"
#endif
#include "lora_pool.h"
#include "model.h"
#include "peft.h"

#ifndef LS_FIXTURES_DIR
#error "LS_FIXTURES_DIR must name tests/fixtures"
#endif
#ifndef LS_DEMO_DIR
#error "LS_DEMO_DIR must name examples/demo"
#endif


static int g_cpu, g_device, g_checks, g_failed;

// The data directories: the environment's LS_FIXTURES_DIR / LS_DEMO_DIR (the device machine
// runs a copy of the tree elsewhere), else the paths compiled in.
static const char *s_fixtures(void) {
    const char *e = getenv("LS_FIXTURES_DIR");
    return e && *e ? e : LS_FIXTURES_DIR;
}
static const char *s_demo_dir(void) {
    const char *e = getenv("LS_DEMO_DIR");
    return e && *e ? e : LS_DEMO_DIR;
}
static char err[1024];

static ls_backend_t *s_backend(void) {
    if (g_cpu)
        return ls_backend_cpu_new(1);
#ifdef LS_HAVE_CUDA
    ls_backend_t *be = ls_backend_cuda_new(g_device, err, sizeof err);
    if (!be) {
        fprintf(stderr, "test_gpu_model: %s\n", err);
        exit(2);
    }
    return be;
#else
    fprintf(stderr, "test_gpu_model: built without CUDA; use --cpu\n");
    exit(2);
#endif
}

static void s_check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    g_checks++;
    g_failed += !ok;
    fflush(stdout);
}

static void s_die(const char *what, const char *e) {
    printf("FAIL %s: %s\n", what, e);
    exit(1);
}

static double s_tol(ls_dtype_t dt) {
    if (g_cpu || dt == LS_DTYPE_F32)
        return 5e-5;
    return dt == LS_DTYPE_F16 ? 1e-2 : 5e-2;
}

// --- 1. HF parity and 2. the demo: tests/engine/engine_checks.c on this backend ------------

static void s_parity(const char *arch, double *worst_out) {
    ls_backend_t *be = s_backend();
    // the tolerance follows the checkpoint's dtype: read it from a load on this backend
    ec_parity_t r;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/model", s_fixtures(), arch);
    ls_model_config_t cfg;
    if (ls_model_config_load(path, &cfg, err, sizeof err) < 0)
        s_die(path, err);
    double tol = s_tol(cfg.torch_dtype), gap_min = 2 * tol > 1e-3 ? 2 * tol : 1e-3;
    if (ec_parity(be, LS_QUANT_NONE, s_fixtures(), arch, gap_min, &r, err, sizeof err) < 0)
        s_die(arch, err);
    s_check(r.last_max <= tol, "%s (%s weights): mixed batch of %d rows, last logits: max|Δ| %.3e, rms %.2e, logits "
            "up to %.2f (bound %.0e)", arch, ls_dtype_name(cfg.torch_dtype), r.rows, r.last_max, r.last_rms,
            r.last_mag, tol);
    s_check(r.all_max <= tol, "%s rows 0-1: all prompt positions: max|Δ| %.3e (bound %.0e)", arch, r.all_max, tol);
    s_check(r.greedy_mismatched_rows == 0, "%s: greedy tokens identical on all %d compared steps of %d (compared "
            "up to the first reference top-2 gap < %.0e)", arch, r.greedy_compared, r.greedy_total, gap_min);
    *worst_out = r.all_max;
    ls_backend_destroy(&be);
}

static void s_demo(int n_slots) {
    ls_backend_t *be = s_backend();
    ec_demo_t r;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ec_demo(be, LS_QUANT_NONE, s_demo_dir(), n_slots, &r, err, sizeof err) < 0)
        s_die("demo", err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s_check(r.mismatches == 0 && (n_slots >= 4 || r.pool.slot_evictions > 0),
            "demo, %s: %d requests (base + 4 adapters), greedy outputs equal to eval.json: %d mismatches, %llu slot "
            "evictions; %.2f s", n_slots >= 4 ? "one mixed batch" : "2 slots for 4 adapters (slot reuse)",
            r.requests, r.mismatches, (unsigned long long)r.pool.slot_evictions,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    ls_backend_destroy(&be);
}

// Mixes of two adapters (docs/lora-mixing.md) against the "cat" adapters PEFT's
// add_weighted_adapter builds (tests/engine/test_mix.c on this backend). The cat adapter's
// A = w·s·A_i is rounded to the pool's bf16 as a whole, the mix rounds A_i and scales the
// product, so the two differ by bf16 rounding of the LoRA delta: the bf16 bound. The rows
// beside the mixes run the same kernels on the same data in both batches.
static void s_mix(void) {
    ls_backend_t *be = s_backend();
    ec_mix_t r;
    double tol = s_tol(LS_DTYPE_BF16);
    if (ec_mix(be, LS_QUANT_NONE, s_fixtures(), "llama", 2 * tol, &r, err, sizeof err) < 0)  // gap: as the parity check's
        s_die("mix", err);
    s_check(r.peft_max <= tol && r.peft_mag > 1.0 && r.peft_greedy_mismatched == 0,
            "mix llama against PEFT's add_weighted_adapter(cat): last-position logits max|Δ| %.3e (bound %.0e); "
            "greedy tokens %d compared, %d mismatched", r.peft_max, tol, r.peft_greedy_compared, r.peft_greedy_mismatched);
    s_check(r.steps_compared == 9 && r.mix_max <= tol && r.mix_mag > 1.0,
            "mix llama: %d rows, %d of 9 steps compared (prefill + decode): mixed rows against the cat adapters "
            "max|Δ| %.3e, logits up to %.2f (bound %.0e)", r.rows, r.steps_compared, r.mix_max, r.mix_mag, tol);
    s_check(r.single_max <= tol, "mix llama: rows beside the mixes %s (max|Δ| %.3e, bound %.0e)",
            r.single_identical ? "bit-identical" : "differ", r.single_max, tol);
    s_check(r.refused == 5, "mix llama: %d of 5 malformed mixes refused", r.refused);
    ls_backend_destroy(&be);
}

// Added vocabulary (docs/adapters.md) against PEFT on its resized model (tests/engine/
// engine_checks.c ec_added on this backend): the llama fixture's adapter whose tokenizer adds
// tokens past the vocabulary, beside the base row, its added ids' rows and logits on the GPU.
static void s_added(void) {
    ls_backend_t *be = s_backend();
    char path[1024];
    snprintf(path, sizeof path, "%s/llama/model", s_fixtures());
    ls_model_config_t cfg;
    if (ls_model_config_load(path, &cfg, err, sizeof err) < 0)
        s_die(path, err);
    double tol = s_tol(cfg.torch_dtype), gap_min = 2 * tol > 1e-3 ? 2 * tol : 1e-3;
    ec_added_t r;
    if (ec_added(be, LS_QUANT_NONE, s_fixtures(), "llama", gap_min, &r, err, sizeof err) < 0)
        s_die("added vocabulary", err);
    s_check(r.added_in_prompt > 0 && r.last_max <= tol && r.base_max <= tol && r.past_neg_inf,
            "added vocabulary llama: %d of the prompt's ids added; last logits over %d columns max|Δ| %.3e "
            "(logits up to %.2f), base row beside it %.3e (bound %.0e); the %d columns past them -inf: %s",
            r.added_in_prompt, r.width, r.last_max, r.last_mag, r.base_max, tol, r.logits_width - r.width,
            r.past_neg_inf ? "yes" : "no");
    s_check(r.greedy_mismatched == 0 && r.greedy_compared > 0,
            "added vocabulary llama: greedy tokens identical on %d compared steps of %d (%d reference tokens "
            "are added ids; compared up to the first top-2 gap < %.0e)", r.greedy_compared, r.greedy_total,
            r.greedy_added, gap_min);
    ls_backend_destroy(&be);
}

// --- 3. dummy loader ---------------------------------------------------------------------------

// test_fp8.c's bounds: logits max |Δ| and rms against the references, greedy agreement
// over the four fixtures, demo answers unchanged
#define FP8_MAX 0.75
#define FP8_RMS 0.15
#define FP8_AGREE 0.35
#define FP8_DEMO 0.95
#define FP8_FLIP 0.1  // FP8 on two backends, or beside a bf16 difference: of the logits' size

// quant LS_QUANT_FP8: FP8 on both backends; the GPU runs it twice, with the GEMM's own
// scales (where cuBLASLt has them) and with them applied after (allow_outer 0)
static void s_dummy(ls_quant_t quant) {
    const char *cfg_json =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
        "\"hidden_size\": 256, \"intermediate_size\": 704, \"num_hidden_layers\": 3, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 1000, "
        "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000, "
        "\"torch_dtype\": \"bfloat16\", \"hidden_act\": \"silu\"}";
    int fp8 = quant == LS_QUANT_FP8, nb = fp8 ? 3 : 2;
    ls_backend_t *be[3] = {ls_backend_cpu_new(1), s_backend(), fp8 ? s_backend() : NULL};
    float *lg[3];
    int V = 1000;
    const char *how[3] = {"", "", ""}; // the FP8 decode step's GEMM
#ifdef LS_HAVE_CUDA
    if (fp8 && !g_cpu)
        ls_backend_cuda_set_fp8_paths(be[2], 0, 0, 0);
#endif
    for (int b = 0; b < nb; b++) {
        ls_model_t *m = ls_model_load_dummy(cfg_json, be[b], NULL, quant, 7, NULL, NULL, err, sizeof err);
        if (!m)
            s_die("dummy model", err);
        ls_kv_cache_t *kv = ls_kv_cache_new(m, 64, 16, err, sizeof err);
        if (!kv)
            s_die("kv", err);
        int32_t toks[3][40], tables[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}};
        for (int s = 0; s < 3; s++)
            for (int i = 0; i < 40; i++)
                toks[s][i] = (s * 97 + i * 31) % V;
        ls_model_seq_t seqs[3];
        for (int s = 0; s < 3; s++)
            seqs[s] = (ls_model_seq_t){toks[s], 20 + 5 * s, 0, tables[s], 4, 0, true, NULL, 0};
        if (ls_model_forward(m, kv, NULL, seqs, 3, err, sizeof err) != 3)
            s_die("dummy forward", err);
        for (int s = 0; s < 3; s++) { // one decode step on top
            seqs[s].token_ids += seqs[s].n_tokens;
            seqs[s].start_pos = seqs[s].n_tokens;
            seqs[s].n_tokens = 1;
        }
        if (ls_model_forward(m, kv, NULL, seqs, 3, err, sizeof err) != 3)
            s_die("dummy forward", err);
        lg[b] = malloc(sizeof(float) * 3 * V);
        if (ls_model_logits(m, lg[b]) != 0)
            s_die("dummy logits", "download failed");
#ifdef LS_HAVE_CUDA
        if (fp8 && b > 0 && !g_cpu)
            how[b] = ls_backend_cuda_fp8_path(be[b]) == LS_FP8_PATH_TC      ? ", fp8, tc decode GEMM"
                     : ls_backend_cuda_fp8_path(be[b]) == LS_FP8_PATH_SMALL ? ", fp8, small decode GEMM"
                     : ls_backend_cuda_fp8_path(be[b]) == LS_FP8_PATH_OUTER ? ", fp8, GEMM's own scales"
                                                                            : ", fp8, scales after the GEMM";
#endif
        ls_kv_cache_destroy(&kv);
        ls_model_destroy(&m);
    }
    // FP8: the backends quantize activations that differ by their GEMMs' summation (Hopper's
    // FP8 tensor cores add with ~14 bits, test_gpu_ops matmul_fp8), so a value near a rounding
    // midpoint of E4M3 lands on either side (a step of 2^-3 relative) here and there, and 32
    // layers carry those flips on: FP8_FLIP of the logits' size (measured on an H100: 0.21 on
    // logits up to 4). A wrong scale or layout moves logits by their own size.
    for (int b = 1; b < nb; b++) {
        double d = 0, mag = 0;
        int finite = 1;
        for (int i = 0; i < 3 * V; i++) {
            finite &= isfinite(lg[0][i]) && isfinite(lg[b][i]);
            d = fmax(d, fabs((double)lg[0][i] - lg[b][i]));
            mag = fmax(mag, fabs((double)lg[0][i]));
        }
        s_check(finite && d <= (fp8 && !g_cpu ? FP8_FLIP * mag : s_tol(LS_DTYPE_BF16) * fmax(1.0, mag / 4)),
                "dummy loader (bf16 config JSON%s): %s vs cpu backend, prefill + decode logits: "
                "max|Δ| %.3e over logits up to %.2f", !fp8 ? "" : g_cpu ? ", fp8" : how[b], be[b]->name, d,
                mag);
    }
    for (int b = 0; b < nb; b++) {
        free(lg[b]);
        ls_backend_destroy(&be[b]);
    }
}

// --- 6. FP8 ------------------------------------------------------------------------------------

static void s_fp8(void) {
    const char *archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    int compared = 0, agreed = 0;
    for (int a = 0; a < 4; a++) {
        ls_backend_t *be = s_backend();
        ec_parity_t r;
        if (ec_parity(be, LS_QUANT_FP8, s_fixtures(), archs[a], 1e-3, &r, err, sizeof err) < 0)
            s_die(archs[a], err);
        s_check(r.last_max <= FP8_MAX && r.all_max <= FP8_MAX && r.last_rms <= FP8_RMS,
                "%s fp8 vs HF fp32: last logits max|Δ| %.3f rms %.3f, rows 0-1 all positions max|Δ| %.3f "
                "(bounds %.2f, rms %.2f); greedy %d of %d compared steps agree", archs[a], r.last_max,
                r.last_rms, r.all_max, FP8_MAX, FP8_RMS, r.greedy_agreed, r.greedy_compared);
        compared += r.greedy_compared;
        agreed += r.greedy_agreed;
        ls_backend_destroy(&be);
    }
    s_check(agreed >= FP8_AGREE * compared, "fp8 greedy agreement over the fixtures: %d of %d steps (%.1f%%, "
            "bound %.0f%%)", agreed, compared, 100.0 * agreed / compared, 100 * FP8_AGREE);
    ls_backend_t *be = s_backend();
    ec_demo_t d;
    if (ec_demo(be, LS_QUANT_FP8, s_demo_dir(), 4, &d, err, sizeof err) < 0)
        s_die("demo fp8", err);
    s_check(d.requests - d.mismatches >= FP8_DEMO * d.requests, "demo fp8: %d of %d requests decode to the "
            "bf16 model's answers (bound %.0f%%)", d.requests - d.mismatches, d.requests, 100 * FP8_DEMO);
    ls_backend_destroy(&be);
    // mixes over FP8 projections (test_fp8.c's test_mix_fp8): the bf16 difference of s_mix,
    // which the next layers' activation quantization rounds the other way here and there, as
    // the dummy model's GPU-vs-CPU check: FP8_FLIP of the logits' size (measured on an H100:
    // 0.13 on logits up to 3.8)
    be = s_backend();
    ec_mix_t mx;
    if (ec_mix(be, LS_QUANT_FP8, s_fixtures(), "llama", 1e-3, &mx, err, sizeof err) < 0)  // PEFT's mixes: not compared
        s_die("mix fp8", err);
    double tol = FP8_FLIP * mx.mix_mag;
    s_check(mx.steps_compared == 9 && mx.mix_max <= tol && mx.mix_mag > 1.0 && mx.single_max <= tol &&
            mx.refused == 5, "mix llama fp8: %d of 9 steps compared: mixed rows against the cat adapters max|Δ| "
            "%.3e (logits up to %.2f), rows beside them max|Δ| %.3e (bound %.0e); %d of 5 malformed mixes refused",
            mx.steps_compared, mx.mix_max, mx.mix_mag, mx.single_max, tol, mx.refused);
    ls_backend_destroy(&be);
}

// --- 4. asynchronous slot loads ---------------------------------------------------------------

typedef struct {
    ls_model_t *m;
    ls_kv_cache_t *kv, *arena; // arena: the pool's pages, apart from kv (slot_plan.h)
    ls_lora_pool_t *pool;
    int32_t toks[3][24], tables[3][2];
    ls_model_seq_t seqs[3];
    int V;
} s_async_t;

// Queues a prefill of the three prompts, rows 0 and 2 on slot w, row 1 on the base model.
static void s_async_forward(s_async_t *a, int w) {
    for (int s = 0; s < 3; s++)
        a->seqs[s] = (ls_model_seq_t){a->toks[s], 24, 0, a->tables[s], 2,
                                      s == 1 ? LS_LORA_SLOT_BASE : w, true, NULL, 0};
    if (ls_model_forward(a->m, a->kv, a->pool, a->seqs, 3, err, sizeof err) != 3)
        s_die("async forward", err);
}

static void s_async_logits(s_async_t *a, float *out) {
    if (ls_model_logits(a->m, out) != 0)
        s_die("async logits", "download failed");
}

static void s_assign(s_async_t *a, const char *id, int w) {
    if (slot_plan_assign(a->pool, id, w, err, sizeof err) != 0)
        s_die("async assign", err);
}

static double s_maxdiff(const float *x, const float *y, int n) {
    double d = 0;
    for (int i = 0; i < n; i++)
        d = fmax(d, fabs((double)x[i] - y[i]));
    return d;
}

// The model of sections 4 and 5 with adapters "x" and "y" in a two-slot pool (nothing
// loaded yet); *dir holds their files.
static void s_async_setup(s_async_t *a, ls_backend_t *be, char **dir) {
    const char *cfg_json =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
        "\"hidden_size\": 1024, \"intermediate_size\": 2816, \"num_hidden_layers\": 8, "
        "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"vocab_size\": 1000, "
        "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000, "
        "\"torch_dtype\": \"bfloat16\", \"hidden_act\": \"silu\"}";
    *a = (s_async_t){.V = 1000};
    if (!(a->m = ls_model_load_dummy(cfg_json, be, NULL, LS_QUANT_NONE, 11, NULL, NULL, err, sizeof err)))
        s_die("async model", err);
    const ls_model_config_t *cfg = ls_model_config(a->m);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 16};
    if (!(a->arena = slot_plan_arena_new(a->m, 16, &pc, err, sizeof err)))
        s_die("async pages", err);
    ls_page_arena_t arena = ls_kv_cache_arena(a->arena);
    if (!(a->pool = ls_lora_pool_new(be, cfg, &pc, &arena, err, sizeof err)) ||
        !(a->kv = ls_kv_cache_new(a->m, 6, 16, err, sizeof err)))
        s_die("async pool / kv", err);
    char path[1024];
    *dir = fx_tmpdir();
    int ranks[8 * LS_TARGET_COUNT];
    rm_ranks_uniform(ranks, 8, 0x7f, 16);
    const char *ids[2] = {"x", "y"};
    for (int i = 0; i < 2; i++) {
        if (rm_write_adapter(fx_path(path, sizeof path, *dir, ids[i]), cfg,
                             "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 32, "
                             "\"target_modules\": \"all-linear\"}", ranks, LS_DTYPE_BF16,
                             (unsigned)i + 1) != 0)
            s_die("async adapter", path);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, 16, err, sizeof err);
        if (!ad || ls_lora_pool_add_adapter(a->pool, ids[i], &ad, err, sizeof err) != 0)
            s_die("async adapter", err);
    }
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 24; i++)
            a->toks[s][i] = (s * 131 + i * 37 + 5) % a->V;
        a->tables[s][0] = 2 * s;
        a->tables[s][1] = 2 * s + 1;
    }
}

static void s_async_teardown(s_async_t *a, ls_backend_t **be, char **dir) {
    ls_kv_cache_destroy(&a->kv);
    ls_lora_pool_destroy(&a->pool);
    ls_kv_cache_destroy(&a->arena);
    ls_model_destroy(&a->m);
    ls_backend_destroy(be);
    fx_rmdir(dir);
}

// A step on slot `first` with the load of adapter `id` into `slot` started while that step
// is queued, then a step on slot `next`: max|Δ| of each step's logits (n) against ref1 and
// ref2, in d1 and d2. got holds n floats.
static void s_load_during_step(s_async_t *a, int first, const char *id, int slot, int next,
                               const float *ref1, const float *ref2, float *got, int n,
                               double *d1, double *d2) {
    s_async_forward(a, first);
    s_assign(a, id, slot);
    s_async_logits(a, got);
    *d1 = s_maxdiff(got, ref1, n);
    s_async_forward(a, next);
    s_async_logits(a, got);
    *d2 = s_maxdiff(got, ref2, n);
}

static void s_async(void) {
    ls_backend_t *be = s_backend();
    s_async_t a;
    char *dir;
    s_async_setup(&a, be, &dir);
    int n = 3 * a.V;
    float *ref_x = malloc(sizeof(float) * n), *ref_y = malloc(sizeof(float) * n),
          *got = malloc(sizeof(float) * n);
    // references: each load waited for before the step
    s_assign(&a, "x", 1);
    ls_lora_pool_wait(a.pool);
    s_async_forward(&a, 1);
    s_async_logits(&a, ref_x);
    s_assign(&a, "y", 1);
    ls_lora_pool_wait(a.pool);
    s_async_forward(&a, 1);
    s_async_logits(&a, ref_y);
    double xy = s_maxdiff(ref_x, ref_y, a.V); // row 0: adapter x against y

    // (a) the step right after the load's start reads it
    s_assign(&a, "x", 2);
    s_async_forward(&a, 2);
    s_async_logits(&a, got);
    double da = s_maxdiff(got, ref_x, n);
    s_check(xy > 1e-2 && da == 0,
            "async slot load read by the next step: max|Δ| %.3e vs the waited-for load (adapters x "
            "and y differ by %.2f)", da, xy);

    // (b) slot 1 (y) is read by the queued step while x is loaded into it
    double db, db2;
    s_load_during_step(&a, 1, "x", 1, 1, ref_y, ref_x, got, n, &db, &db2);
    s_check(db == 0 && db2 == 0,
            "load into the slot a queued step reads: that step max|Δ| %.3e vs the old adapter, "
            "the next one %.3e vs the new", db, db2);

    // (c) a prefetch into slot 2 runs alongside the queued step on slot 1
    double dc, dc2;
    s_load_during_step(&a, 1, "y", 2, 2, ref_x, ref_y, got, n, &dc, &dc2);
    s_check(dc == 0 && dc2 == 0,
            "prefetch into another slot during a step: the step max|Δ| %.3e, the next step on "
            "the prefetched slot %.3e", dc, dc2);
    free(ref_x);
    free(ref_y);
    free(got);
    s_async_teardown(&a, &be, &dir);
}

// --- 5. step graphs -----------------------------------------------------------------------------

#ifdef LS_HAVE_CUDA
enum { G_STEPS = 7 };

// The prefill of s_async_forward (adapter x in slot 1), then G_STEPS decode steps: three
// rows, except step 3 (rows 0 and 1 only, row 2 waits) with rows swapping adapters at
// steps 2 and 5. Logits of every decode step go to out (G_STEPS x 3 x V).
static void s_graph_run(s_async_t *a, float *out) {
    static const int n_rows[G_STEPS] = {3, 3, 3, 2, 3, 3, 3};
    static const int32_t slot[G_STEPS][3] = {{1, LS_LORA_SLOT_BASE, 2}, {1, LS_LORA_SLOT_BASE, 2},
                                             {2, 1, 1}, {2, 1, LS_LORA_SLOT_BASE}, {1, LS_LORA_SLOT_BASE, 2},
                                             {2, 2, LS_LORA_SLOT_BASE}, {1, LS_LORA_SLOT_BASE, 2}};
    ls_kv_cache_destroy(&a->kv);
    if (!(a->kv = ls_kv_cache_new(a->m, 6, 16, err, sizeof err)))
        s_die("graph kv", err);
    s_async_forward(a, 1);
    int pos[3] = {24, 24, 24};
    int32_t tok[3][G_STEPS];
    for (int i = 0; i < G_STEPS; i++) {
        ls_model_seq_t seqs[3];
        for (int s = 0; s < n_rows[i]; s++) {
            tok[s][i] = (s * 53 + i * 11 + 3) % a->V;
            seqs[s] = (ls_model_seq_t){&tok[s][i], 1, pos[s]++, a->tables[s], 2, slot[i][s],
                                       true, NULL, 0};
        }
        if (ls_model_forward(a->m, a->kv, a->pool, seqs, n_rows[i], err, sizeof err) !=
            n_rows[i])
            s_die("graph forward", err);
        memset(out + (size_t)i * 3 * a->V, 0, sizeof(float) * 3 * (size_t)a->V);
        s_async_logits(a, out + (size_t)i * 3 * a->V);
    }
}

static size_t s_ndiff(const float *x, const float *y, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++)
        d += memcmp(&x[i], &y[i], sizeof(float)) != 0;
    return d;
}

// The model of sections 4 and 5 on a new backend, x loaded in slot 1 and y in slot 2
static ls_backend_t *s_loaded(s_async_t *a, char **dir) {
    ls_backend_t *be = s_backend();
    s_async_setup(a, be, dir);
    s_assign(a, "x", 1);
    s_assign(a, "y", 2);
    ls_lora_pool_wait(a->pool);
    return be;
}

// Step graphs and the side queue (the decode LoRA beside each GEMM) against the plainest
// run: one stream, launches one by one. Graphs must give the same logits bit for bit, and
// so must the side queue when the GEMMs leave it no SMs (same kernels, LoRA added the same
// way); with GEMMs leaving half the SMs (the default rule's count at 9 to 128 tokens: at
// these steps of 2 and 3 rows it leaves 8 of 132 beside the GEMV of two tokens and the
// cuBLAS GEMMs with in >= out) cuBLAS may pick other GEMM kernels: fp32
// summation order only, bound 1e-4 of the largest logit, and its graphs must equal its
// plain launches. (At 2 rows the matmuls are the GEMV's, ops_cuda.h ls_cu_gemv, whose grid
// the count caps; at 3 rows too where the device takes them (an H100, the tensor-core form),
// else cuBLAS's, with the count as its SM count target.)
static void s_graphs(void) {
    s_async_t a;
    char *dir;
    ls_backend_t *be = s_loaded(&a, &dir);
    size_t n = (size_t)G_STEPS * 3 * a.V;
    enum { PLAIN, GRAPH, SIDE0, SIDE0_GRAPH, SIDE, SIDE_GRAPH, RUNS };
    static const int run_graphs[RUNS] = {0, 1, 0, 1, 0, 1};
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, g_device);
    static const int run_side[RUNS] = {0, 0, 1, 1, 1, 1};
    const int run_leave[RUNS] = {0, 0, 0, 0, n_sm / 2, n_sm / 2};
    float *out[RUNS];
    long cap[RUNS], rep[RUNS];
    for (int r = 0; r < RUNS; r++) {
        out[r] = malloc(sizeof(float) * n);
        ls_backend_cuda_set_graphs(be, run_graphs[r]);
        ls_backend_cuda_set_side(be, run_side[r], run_leave[r]);
        s_graph_run(&a, out[r]);
        ls_backend_cuda_graph_counts(be, &cap[r], &rep[r]);
    }
    ls_backend_cuda_set_side(be, 1, -1);
    size_t dg = s_ndiff(out[PLAIN], out[GRAPH], n), ds = s_ndiff(out[PLAIN], out[SIDE0], n),
           dsg = s_ndiff(out[PLAIN], out[SIDE0_GRAPH], n),
           dss = s_ndiff(out[SIDE], out[SIDE_GRAPH], n);
    double mag = 0, d = s_maxdiff(out[PLAIN], out[SIDE], (int)n);
    for (size_t i = 0; i < n; i++)
        mag = fmax(mag, fabs(out[PLAIN][i]));
    // graphs: one per shape (3 rows, 2 rows; the adapter mix changes the tiles, so more);
    // replays: the steps whose shape was seen before
    s_check(dg == 0 && cap[PLAIN] == 0 && rep[PLAIN] == 0 && cap[GRAPH] >= 2 && rep[GRAPH] >= 2,
            "step graphs: %d decode steps, %zu of %zu logits differ from plain launches "
            "(bit for bit); %ld graphs captured, %ld replays", G_STEPS, dg, n, cap[GRAPH],
            rep[GRAPH]);
    s_check(ds == 0 && dsg == 0 && cap[SIDE0_GRAPH] - cap[SIDE0] >= 2,
            "side queue, GEMMs on every SM: %zu (plain launches) and %zu (graphs) of %zu "
            "logits differ from LoRA after each GEMM (bit for bit)", ds, dsg, n);
    long graphed = cap[SIDE_GRAPH] + rep[SIDE_GRAPH] - cap[SIDE] - rep[SIDE];
    s_check(dss == 0 && d <= 1e-4 * mag && graphed == G_STEPS,
            "side queue, GEMMs leaving SMs to the LoRA: graphs vs plain %zu of %zu logits "
            "differ (bit for bit); vs LoRA after each GEMM max|Δ| %.2e (bound 1e-4 x max "
            "|logit| %.2f); %ld of %d decode steps graphed", dss, n, d, mag, graphed, G_STEPS);
    for (int r = 0; r < RUNS; r++)
        free(out[r]);
    s_async_teardown(&a, &be, &dir);
}

// gate_up's LoRA inside SiLU·mul (engine/model.c s_silu_lora): a decode step of 256 rows (a
// decode-shaped step's most), 124 on each adapter and 8 on the base model, beside the GEMMs
// (GEMMs on every SM) must take that route in each of the 8 layers and give the logits of the
// LoRA after each GEMM (no side queue), bit for bit; so must the same step with graphs.
static void s_silu_route(void) {
    enum { R = 256 };
    s_async_t a;
    char *dir;
    ls_backend_t *be = s_loaded(&a, &dir);
    ls_kv_cache_destroy(&a.kv);
    if (!(a.kv = ls_kv_cache_new(a.m, R, 16, err, sizeof err)))
        s_die("silu route kv", err);
    static int32_t tok[R], table[R];
    ls_model_seq_t seqs[R];
    for (int s = 0; s < R; s++) {
        tok[s] = (s * 71 + 9) % a.V;
        table[s] = s;
        int32_t slot = s < 124 ? 1 : s < 248 ? 2 : LS_LORA_SLOT_BASE;
        seqs[s] = (ls_model_seq_t){&tok[s], 1, 0, &table[s], 1, slot, true, NULL, 0};
    }
    size_t n = (size_t)R * a.V;
    float *out[3];
    long count[3];
    static const int side[3] = {1, 0, 1}, graphs[3] = {0, 0, 1};
    for (int r = 0; r < 3; r++) {
        out[r] = malloc(sizeof(float) * n);
        ls_backend_cuda_set_graphs(be, graphs[r]);
        ls_backend_cuda_set_side(be, side[r], 0);
        long before = ls_backend_cuda_lora_silu_count(be);
        // twice with graphs: the capture, then the replay whose logits are compared
        for (int k = 0; k < 1 + graphs[r]; k++)
            if (ls_model_forward(a.m, a.kv, a.pool, seqs, R, err, sizeof err) != R)
                s_die("silu route forward", err);
        count[r] = ls_backend_cuda_lora_silu_count(be) - before;
        if (ls_model_logits(a.m, out[r]) != 0)
            s_die("silu route logits", "download failed");
    }
    ls_backend_cuda_set_graphs(be, 1);
    ls_backend_cuda_set_side(be, 1, -1);
    size_t d = s_ndiff(out[0], out[1], n), dg = s_ndiff(out[2], out[1], n);
    s_check(count[0] == 8 && count[1] == 0 && d == 0 && dg == 0,
            "gate_up's LoRA in SiLU·mul: a step of %d rows took it in %ld of 8 layers beside the GEMMs (%ld "
            "without the side queue, 0 expected); %zu (plain launches) and %zu (graphs) of %zu logits differ "
            "from LoRA after each GEMM (bit for bit)", R, count[0], count[1], d, dg, n);
    for (int r = 0; r < 3; r++)
        free(out[r]);
    s_async_teardown(&a, &be, &dir);
}

// The decode block as one op (backend.h decode_block, kernels/cuda/block.cu): batch-1 decode
// steps on the base model take it in each of the 8 layers; with step graphs the logits are
// the same bit for bit; the ops one by one (the block turned off) give them within the bf16
// bound (h and act rounded to bf16 from fp32 sums in another order); a step on an adapter,
// and a step of two rows, do not take it.
static void s_block_route(void) {
    enum { STEPS = 3 };
    s_async_t a;
    char *dir;
    ls_backend_t *be = s_loaded(&a, &dir);
    int L = ls_model_config(a.m)->num_hidden_layers;
    int32_t tok[STEPS] = {17, 401, 923}, table[2][1] = {{0}, {1}};
    size_t n = (size_t)STEPS * a.V;
    float *out[3];
    long count[3];
    static const int on[3] = {1, 1, 0}, graphs[3] = {0, 1, 0};
    for (int r = 0; r < 3; r++) {
        out[r] = malloc(sizeof(float) * n);
        ls_backend_cuda_set_block(be, on[r]);
        ls_backend_cuda_set_graphs(be, graphs[r]);
        long before = ls_backend_cuda_block_count(be);
        for (int s = 0; s < STEPS; s++) {
            ls_model_seq_t seq = {&tok[s], 1, s, table[0], 1, LS_LORA_SLOT_BASE, true, NULL, 0};
            if (ls_model_forward(a.m, a.kv, a.pool, &seq, 1, err, sizeof err) != 1)
                s_die("block route forward", err);
            if (ls_model_logits(a.m, out[r] + (size_t)s * a.V) != 0)
                s_die("block route logits", "download failed");
        }
        count[r] = ls_backend_cuda_block_count(be) - before;
    }
    ls_backend_cuda_set_block(be, 1);
    ls_backend_cuda_set_graphs(be, 0);
    long before = ls_backend_cuda_block_count(be);
    ls_model_seq_t lora = {&tok[0], 1, 0, table[0], 1, 1, true, NULL, 0};
    ls_model_seq_t two[2] = {{&tok[0], 1, 0, table[0], 1, LS_LORA_SLOT_BASE, true, NULL, 0},
                             {&tok[1], 1, 0, table[1], 1, LS_LORA_SLOT_BASE, true, NULL, 0}};
    if (ls_model_forward(a.m, a.kv, a.pool, &lora, 1, err, sizeof err) != 1 ||
        ls_model_forward(a.m, a.kv, a.pool, two, 2, err, sizeof err) != 2)
        s_die("block route: adapter / two rows", err);
    long others = ls_backend_cuda_block_count(be) - before;
    ls_backend_cuda_set_graphs(be, 1);
    size_t dg = s_ndiff(out[0], out[1], n);
    double d = s_maxdiff(out[0], out[2], (int)n), mag = 0;
    for (size_t i = 0; i < n; i++)
        mag = fmax(mag, fabs(out[2][i]));
    double tol = s_tol(LS_DTYPE_BF16) * fmax(1.0, mag / 4);
    s_check(count[0] == (long)STEPS * L && count[1] >= L && count[2] == 0 && others == 0 && dg == 0 &&
                d <= tol,
            "decode block: %d batch-1 steps took it %ld times (%d expected), with graphs %ld (>= %d), "
            "turned off %ld; an adapter step and a two-row step %ld (0 expected); graphs: %zu of %zu "
            "logits differ (bit for bit); against the ops one by one max|Δ| %.2e over logits up to "
            "%.2f (bound %.1e)", STEPS, count[0], STEPS * L, count[1], L, count[2], others, dg, n, d,
            mag, tol);
    for (int r = 0; r < 3; r++)
        free(out[r]);
    s_async_teardown(&a, &be, &dir);
}
#endif

int main(int argc, char **argv) {
    int only_fp8 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu"))
            g_cpu = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            g_device = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--fp8"))
            only_fp8 = 1;
        else {
            fprintf(stderr, "usage: test_gpu_model [--cpu] [--device N] [--fp8]\n");
            return 2;
        }
    }
    if (only_fp8) {
        s_dummy(LS_QUANT_FP8);
        s_fp8();
        printf("=== summary (%s, fp8 only): %d checks, %d failed\n", g_cpu ? "cpu backend" : "cuda backend",
               g_checks, g_failed);
        return g_failed ? 1 : 0;
    }
    const char *archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    double worst[4];
    for (int a = 0; a < 4; a++)
        s_parity(archs[a], &worst[a]);
    s_demo(4);
    s_demo(2);
    s_mix();
    s_added();
    s_dummy(LS_QUANT_NONE);
    s_dummy(LS_QUANT_FP8);
    s_async();
#ifdef LS_HAVE_CUDA
    if (!g_cpu) {
        s_graphs();
        s_silu_route();
        s_block_route();
    }
#endif
    s_fp8();
    printf("=== summary (%s): %d checks, %d failed; parity max|Δ| logits: llama %.2e, "
           "qwen2 %.2e, qwen3 %.2e, mistral %.2e\n", g_cpu ? "cpu backend" : "cuda backend",
           g_checks, g_failed, worst[0], worst[1], worst[2], worst[3]);
    return g_failed ? 1 : 0;
}
