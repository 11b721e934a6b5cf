// FP8 weights (W8A8, kernels/ops.h; the kernels' own tests are tests/kernels/test_fp8.c)
// on the CPU backend: the fixture models loaded with --quantization fp8 against the HF
// references (what FP8 costs, measured), mixes of adapters over FP8 projections, FP8
// checkpoints (compressed-tensors, fp8 per tensor and in blocks, written here from the bf16
// llama fixture) against quantization at load, and bad FP8 files.
//
// A compressed-tensors checkpoint with per-channel fp32 scales made by the same quantizer
// holds exactly the codes and scales that quantization at load makes, so the two models'
// logits must be identical, bit for bit. Per-tensor and block scales quantize differently
// (and blocks are requantized per channel at load, model.h), so those are held to the FP8
// bound against quantization at load.
//
// Tolerances. FP8 moves logits, it does not reproduce them: weights and activations keep 3
// mantissa bits (relative error up to 2^-4 a value). Measured on the CPU backend:
// - the fixtures (random weights, logits about ±3): last-position logits max |Δ| 0.23-0.50,
//   rms 0.046-0.089 against HF fp32 on the stored weights (an independent float64 Python
//   forward with the same quantization gives the same 0.496 on llama, so this is FP8's own
//   error, not the engine's); greedy decoding agrees with the reference on 197 of 407
//   compared steps before each row's first divergence (the random fixtures are full of near
//   ties: reference top-2 gaps of 1e-3 to 1e-1, which an rms move of 0.07 flips). Bounds:
//   max |Δ| 0.75, rms 0.15, agreement 35% — above what was measured, and far below what a
//   wrong scale or a misplaced row does (the logits' whole scale, agreement near zero).
// - the demo model (trained, clear margins): 160 of 160 held-out requests decode to exactly
//   the bf16 model's answers. Bound: 95%.
#include "random_model.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_util.h"

#include "backend.h"
#include "engine_checks.h"
#include "model.h"
#include "safetensors.h"

#ifndef LS_FIXTURES_DIR
#error "LS_FIXTURES_DIR must name tests/fixtures"
#endif

#define GAP_MIN 1e-3
#define TOL_FP8_MAX 0.75
#define TOL_FP8_RMS 0.15
#define MIN_AGREE 0.35
#define MIN_DEMO 0.95
#define TOL_MIX 5e-5

static char err[1024];

// --- fixture models ---------------------------------------------------------------------------

static void test_parity_fp8(void **state) {
    const char *archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    int compared = 0, agreed = 0;
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        ls_backend_t *be = ls_backend_cpu_new(1);
        ec_parity_t r;
        if (ec_parity(be, LS_QUANT_FP8, LS_FIXTURES_DIR, archs[a], GAP_MIN, &r, err, sizeof err) < 0)
            fail_msg("%s: %s", archs[a], err);
        ls_backend_destroy(&be);
        print_message("%s fp8 vs HF fp32 on the stored weights: last logits max|Δ| %.3f rms %.3f (logits "
                      "up to %.2f), all prompt positions of rows 0-1 max|Δ| %.3f; greedy: %d of %d compared "
                      "steps agree before a row's first divergence (%d of %d rows diverge)\n",
                      archs[a], r.last_max, r.last_rms, r.last_mag, r.all_max, r.greedy_agreed,
                      r.greedy_compared, r.greedy_mismatched_rows, r.rows);
        assert_true(r.last_max <= TOL_FP8_MAX);
        assert_true(r.all_max <= TOL_FP8_MAX);
        assert_true(r.last_rms <= TOL_FP8_RMS);
        compared += r.greedy_compared;
        agreed += r.greedy_agreed;
    }
    print_message("fp8 greedy agreement over the four fixtures: %d of %d steps (%.1f%%, bound %.0f%%)\n",
                  agreed, compared, 100.0 * agreed / compared, 100 * MIN_AGREE);
    assert_true(agreed >= MIN_AGREE * compared);
}

// The demo model (trained, examples/demo) and its four adapters, FP8 at load: eval.json's
// held-out prompts decoded greedily, every output against the rule's answer token for token.
static void test_demo_fp8(void **state) {
    ls_backend_t *be = ls_backend_cpu_new(1);
    ec_demo_t r;
    if (ec_demo(be, LS_QUANT_FP8, LS_DEMO_DIR, 4, &r, err, sizeof err) < 0)
        fail_msg("%s", err);
    ls_backend_destroy(&be);
    print_message("demo fp8: %d of %d requests decode to exactly the bf16 model's answer (bound %d)\n",
                  r.requests - r.mismatches, r.requests, (int)(MIN_DEMO * r.requests));
    assert_int_equal(r.requests, 5 * 16 * 2);
    assert_true(r.requests - r.mismatches >= MIN_DEMO * r.requests);
}

// Mixes of adapters over FP8 projections (test_mix.c with LS_QUANT_FP8): the LoRA passes
// read the same fp32 activations whatever the base GEMM, so a mix and its cat adapter differ
// by a few ulps of the LoRA delta as in fp32 — unless such an ulp flips a rounding of the next
// layer's per-token activation quantization, which these inputs never do: measured max |Δ|
// 1.0e-6, held to test_mix.c's fp32 bound. The rows beside the mixes stay bit-identical:
// quantization is per token, so a row's codes do not depend on its neighbours.
static void test_mix_fp8(void **state) {
    ls_backend_t *be = ls_backend_cpu_new(1);
    ec_mix_t r;
    if (ec_mix(be, LS_QUANT_FP8, LS_FIXTURES_DIR, "llama", 1e-3, &r, err, sizeof err) < 0)  // PEFT's mixes: not compared here
        fail_msg("%s", err);
    ls_backend_destroy(&be);
    print_message("mix fp8: %d steps compared: mixed rows max|Δ| %.3e against the cat adapters (logits up to "
                  "%.2f, bound %.0e); other rows identical: %s; malformed mixes refused: %d of 5\n",
                  r.steps_compared, r.mix_max, r.mix_mag, TOL_MIX, r.single_identical ? "yes" : "NO", r.refused);
    assert_int_equal(r.steps_compared, 9);
    assert_true(r.mix_max <= TOL_MIX);
    assert_true(r.mix_mag > 1.0);
    assert_true(r.single_identical);
    assert_int_equal(r.refused, 5);
}

// --- FP8 checkpoints ----------------------------------------------------------------------------

typedef enum { CK_ROW, CK_TENSOR, CK_BLOCK } ck_kind_t;

// How to write (or spoil) a checkpoint.
typedef struct {
    ck_kind_t kind;
    const char *qconfig;  // the quantization_config JSON; NULL: none
    bool drop_scale;      // layer 1's q_proj without its scale
    bool bad_shape;       // layer 0's o_proj scale of out + 1 values
    bool neg_scale;       // a negative scale in layer 0's down_proj
    bool f8_norm;         // layer 0's input_layernorm stored as F8_E4M3
} ck_opts_t;

#define CT_CHANNEL "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", " \
    "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, " \
    "\"type\": \"float\", \"strategy\": \"channel\", \"symmetric\": true}, \"input_activations\": " \
    "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"token\", \"dynamic\": true}}}, " \
    "\"ignore\": [\"lm_head\"]}"
#define FP8_TENSOR "{\"quant_method\": \"fp8\", \"activation_scheme\": \"dynamic\"}"
#define FP8_BLOCK "{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": \"dynamic\", " \
    "\"weight_block_size\": [16, 16]}"
#define BLK 16

static bool s_is_proj(const char *name) {
    static const char *const ends[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                                       "o_proj.weight", "gate_proj.weight", "up_proj.weight",
                                       "down_proj.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        if (n >= strlen(ends[i]) && !strcmp(name + n - strlen(ends[i]), ends[i]))
            return true;
    return false;
}

// The llama fixture as an FP8 checkpoint in dst: config.json with o->qconfig, every
// projection in E4M3 with its scales as o->kind says, the rest as stored.
static void s_write_ck(const char *dst, const ck_opts_t *o) {
    char path[1024];
    snprintf(path, sizeof path, "%s/llama/model", LS_FIXTURES_DIR);
    ls_st_t *st = ls_st_open(path, err, sizeof err);
    assert_non_null(st);
    size_t n = ls_st_count(st), nw = 0;
    ls_st_write_tensor_t *w = calloc(2 * n, sizeof *w);
    void **owned = calloc(4 * n, sizeof *owned);
    char (*names)[128] = calloc(2 * n, sizeof *names);
    size_t n_owned = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_st_tensor_t *t = ls_st_at(st, i);
        ls_st_write_tensor_t *wt = &w[nw++];
        *wt = (ls_st_write_tensor_t){t->name, t->dtype, t->ndim, {0}, t->data};
        memcpy(wt->shape, t->shape, sizeof t->shape);
        bool norm0 = o->f8_norm && !strcmp(t->name, "model.layers.0.input_layernorm.weight");
        if (!s_is_proj(t->name) && !norm0)
            continue;
        int rows = (int)t->shape[0], cols = t->ndim > 1 ? (int)t->shape[1] : 1;
        float *f = malloc(t->numel * sizeof *f), *sc = NULL;
        uint8_t *q = malloc(t->numel);
        ls_st_tensor_to_f32(t, f);
        wt->dtype = LS_DTYPE_F8E4M3;
        wt->data = q;
        owned[n_owned++] = f;
        owned[n_owned++] = q;
        if (norm0) { // an F8 norm: codes only, the loader must refuse it before any scale
            for (size_t k = 0; k < t->numel; k++)
                q[k] = ls_e4m3_from_f32(f[k]);
            continue;
        }
        ls_st_write_tensor_t *ws = &w[nw++];
        snprintf(names[i], sizeof names[i], "%s_scale%s", t->name, o->kind == CK_BLOCK ? "_inv" : "");
        *ws = (ls_st_write_tensor_t){names[i], LS_DTYPE_F32, 2, {rows, 1}, NULL};
        if (o->kind == CK_ROW) {
            sc = malloc((size_t)rows * sizeof *sc);
            ls_fp8_quantize_rows(q, sc, f, rows, cols);
        } else if (o->kind == CK_TENSOR) {
            float amax = 0;
            for (size_t k = 0; k < t->numel; k++)
                amax = fmaxf(amax, fabsf(f[k]));
            sc = malloc(sizeof *sc);
            sc[0] = amax / 448.0f;
            for (size_t k = 0; k < t->numel; k++)
                q[k] = ls_e4m3_from_f32(f[k] / sc[0]);
            *ws = (ls_st_write_tensor_t){names[i], LS_DTYPE_F32, 1, {1}, NULL};
        } else {
            int br = (rows + BLK - 1) / BLK, bc = (cols + BLK - 1) / BLK;
            sc = calloc((size_t)br * bc, sizeof *sc);
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++) {
                    float *s = &sc[(r / BLK) * bc + c / BLK];
                    *s = fmaxf(*s, fabsf(f[(size_t)r * cols + c]) / 448.0f);
                }
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++)
                    q[(size_t)r * cols + c] =
                        ls_e4m3_from_f32(f[(size_t)r * cols + c] / sc[(r / BLK) * bc + c / BLK]);
            *ws = (ls_st_write_tensor_t){names[i], LS_DTYPE_F32, 2, {br, bc}, NULL};
        }
        ws->data = sc;
        owned[n_owned++] = sc;
        if (o->bad_shape && strstr(t->name, "layers.0.self_attn.o_proj")) {
            float *big = calloc((size_t)rows + 1, sizeof *big);
            memcpy(big, sc, (size_t)rows * sizeof *sc);
            big[rows] = 1;
            *ws = (ls_st_write_tensor_t){names[i], LS_DTYPE_F32, 2, {rows + 1, 1}, big};
            owned[n_owned++] = big;
        }
        if (o->neg_scale && strstr(t->name, "layers.0.mlp.down_proj"))
            sc[0] = -sc[0];
        if (o->drop_scale && strstr(t->name, "layers.1.self_attn.q_proj"))
            nw--;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dst);
    assert_int_equal(ls_st_write(path, w, nw, err, sizeof err), 0);
    // config.json: the fixture's, with the quantization_config
    snprintf(path, sizeof path, "%s/llama/model/config.json", LS_FIXTURES_DIR);
    FILE *fp = fopen(path, "rb");
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, fp);
    fclose(fp);
    text[len] = 0;
    cJSON *cfg = cJSON_Parse(text);
    if (o->qconfig)
        cJSON_AddItemToObject(cfg, "quantization_config", cJSON_Parse(o->qconfig));
    char *out = cJSON_Print(cfg);
    assert_int_equal(fx_write_str(dst, "config.json", out), 0);
    free(out);
    cJSON_Delete(cfg);
    for (size_t i = 0; i < n_owned; i++)
        free(owned[i]);
    free(owned);
    free(names);
    free(w);
    ls_st_destroy(&st);
}

// Last-position logits (3 rows) of a batch of three prompts through a fresh cache.
static float *s_logits(ls_model_t *m) {
    enum { L = 12, NB = 4, BSZ = 4 };
    int V = ls_model_config(m)->vocab_size;
    ls_kv_cache_t *kv = ls_kv_cache_new(m, 3 * NB, BSZ, err, sizeof err);
    assert_non_null(kv);
    int32_t tok[3][L], tables[3][NB];
    ls_model_seq_t seqs[3];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < L; i++)
            tok[s][i] = (int32_t)((s * 131 + i * 17 + 5) % V);
        for (int b = 0; b < NB; b++)
            tables[s][b] = s * NB + b;
        seqs[s] = (ls_model_seq_t){tok[s], L - 2 * s, 0, tables[s], NB, LS_LORA_SLOT_BASE, true, NULL, 0};
    }
    if (ls_model_forward(m, kv, NULL, seqs, 3, err, sizeof err) != 3)
        fail_msg("forward: %s", err);
    float *out = malloc(sizeof(float) * 3 * V);
    assert_int_equal(ls_model_logits(m, out), 0);
    ls_kv_cache_destroy(&kv);
    return out;
}

// Loads dir (quantization as stored), or fails with err.
static ls_model_t *s_load(ls_backend_t *be, const char *dir) {
    ls_model_t *m = ls_model_load(dir, be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    if (!m)
        fail_msg("load %s: %s", dir, err);
    return m;
}

static void test_checkpoints(void **state) {
    char fixture[1024];
    snprintf(fixture, sizeof fixture, "%s/llama/model", LS_FIXTURES_DIR);
    ls_backend_t *be = ls_backend_cpu_new(1);
    ls_model_t *ref = ls_model_load(fixture, be, NULL, LS_QUANT_FP8, NULL, NULL, err, sizeof err);
    if (!ref)
        fail_msg("%s", err);
    assert_true(ls_model_fp8(ref));
    int V = ls_model_config(ref)->vocab_size;
    float *want = s_logits(ref);
    const struct {
        const char *what;
        ck_opts_t o;
        double tol;
    } cases[] = {
        {"compressed-tensors, per channel", {.kind = CK_ROW, .qconfig = CT_CHANNEL}, 0},
        {"fp8, per tensor", {.kind = CK_TENSOR, .qconfig = FP8_TENSOR}, TOL_FP8_MAX},
        {"fp8, 16x16 blocks", {.kind = CK_BLOCK, .qconfig = FP8_BLOCK}, TOL_FP8_MAX},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = fx_tmpdir();
        s_write_ck(dir, &cases[i].o);
        ls_model_t *m = s_load(be, dir);
        assert_true(ls_model_fp8(m));
        float *got = s_logits(m);
        double d = 0;
        for (int k = 0; k < 3 * V; k++)
            d = fmax(d, fabs((double)got[k] - want[k]));
        print_message("%s checkpoint vs quantization at load: logits max|Δ| %.3g (bound %.3g)\n",
                      cases[i].what, d, cases[i].tol);
        assert_true(d <= cases[i].tol);
        free(got);
        ls_model_destroy(&m);
        fx_rmdir(&dir);
    }
    free(want);
    ls_model_destroy(&ref);
    ls_backend_destroy(&be);
}

// Refused with an error naming the problem.
static void s_refused(const ck_opts_t *o, const char *needle) {
    char *dir = fx_tmpdir();
    s_write_ck(dir, o);
    ls_backend_t *be = ls_backend_cpu_new(1);
    ls_model_t *m = ls_model_load(dir, be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    if (m)
        fail_msg("loaded, expected an error with \"%s\"", needle);
    print_message("refused: %s\n", err);
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not say \"%s\"", err, needle);
    ls_backend_destroy(&be);
    fx_rmdir(&dir);
}

static void test_bad_files(void **state) {
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = NULL}, "quantization_config");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = CT_CHANNEL, .drop_scale = true}, "q_proj.weight_scale");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = CT_CHANNEL, .bad_shape = true}, "fit neither");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = CT_CHANNEL, .neg_scale = true}, "negative");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = CT_CHANNEL, .f8_norm = true}, "only the seven projections");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = "{\"quant_method\": \"awq\"}"}, "quant_method");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = "{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\"}"}, "fmt");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = "{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}"},
              "weight_block_size");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = "{\"quant_method\": \"compressed-tensors\", \"config_groups\": "
                                   "{\"g\": {\"weights\": {\"num_bits\": 4, \"type\": \"int\", "
                                   "\"strategy\": \"group\"}}}}"}, "4-bit");
    s_refused(&(ck_opts_t){.kind = CK_ROW, .qconfig = "{\"quant_method\": \"compressed-tensors\", \"config_groups\": "
                                   "{\"g\": {\"weights\": {\"num_bits\": 8, \"type\": \"float\", "
                                   "\"strategy\": \"block\"}}}}"}, "strategy");
    // per-channel scales given to a model whose config says blocks of 16: still per row
    // (the shape decides), but 16x16 block scales with no weight_block_size fit nothing
    s_refused(&(ck_opts_t){.kind = CK_BLOCK, .qconfig = CT_CHANNEL}, "fit neither");
    // --quantization fp8 on widths that are not multiples of 16 (intermediate 40)
    char *dir = fx_tmpdir();
    rm_spec_t sp = {.arch = LS_ARCH_LLAMA, .hidden = 32, .inter = 40, .layers = 1, .heads = 4,
                    .kv_heads = 2, .vocab = 64, .dtype = LS_DTYPE_BF16, .seed = 5};
    assert_int_equal(rm_write_model(dir, &sp, NULL), 0);
    ls_backend_t *be = ls_backend_cpu_new(1);
    assert_null(ls_model_load(dir, be, NULL, LS_QUANT_FP8, NULL, NULL, err, sizeof err));
    print_message("refused: %s\n", err);
    assert_non_null(strstr(err, "multiples of 16"));
    ls_backend_destroy(&be);
    fx_rmdir(&dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parity_fp8),
        cmocka_unit_test(test_demo_fp8),
        cmocka_unit_test(test_mix_fp8),
        cmocka_unit_test(test_checkpoints),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
