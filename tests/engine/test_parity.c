// Golden parity against HF transformers + PEFT (llm.c test_gpt2 style): for each fixture
// architecture under tests/fixtures/<arch>/ (written by tools/make_fixtures.py), load the
// model and adapters, run the reference's mixed batch (base + several adapters, one
// forward) and compare:
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
// tools/make_fixtures.py (logits up to ~3): max |Δ| 1.6e-6 .. 2.4e-6 on the mixed batches'
// last positions, <= 5.2e-6 over all prompt positions. TOL_LOGITS = 5e-5, ten times that,
// leaves room for other BLAS builds and thread counts while still catching any real error
// (a wrong scaling, slice or rope frequency moves logits by 1e-2 or more: the adapters
// move them by ~0.5-4).
#include <cjson/cJSON.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "backend.h"
#include "lora_pool.h"
#include "model.h"

#ifndef LS_FIXTURES_DIR
#error "LS_FIXTURES_DIR must name tests/fixtures"
#endif

#define TOL_LOGITS 5e-5
#define GAP_MIN 1e-3
#define MAX_ROWS 16
#define MAX_LEN 64
#define BS 4

static char err[1024];

static char *read_text(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf)
        buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

// An F32 tensor of reference.safetensors, read by hand: the file also holds int32 tensors
// (prompt and greedy ids), which the engine's loader refuses by design. Returns numel
// floats (malloc'd) and its shape, or NULL.
static float *read_ref_f32(const char *path, const char *name, int64_t shape[2]) {
    size_t len;
    char *file = read_text(path, &len);
    if (!file || len < 8)
        return free(file), NULL;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | (unsigned char)file[i];
    cJSON *h = hl <= len - 8 ? cJSON_ParseWithLength(file + 8, (size_t)hl) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    float *out = NULL;
    if (cJSON_IsString(dt) && strcmp(dt->valuestring, "F32") == 0 &&
        cJSON_GetArraySize(sh) == 2 && cJSON_GetArraySize(off) == 2) {
        shape[0] = (int64_t)cJSON_GetArrayItem(sh, 0)->valuedouble;
        shape[1] = (int64_t)cJSON_GetArrayItem(sh, 1)->valuedouble;
        size_t b = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        size_t e = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        size_t n = (size_t)(shape[0] * shape[1]);
        if (e - b == n * sizeof(float) && 8 + hl + e <= len && (out = malloc(e - b)))
            memcpy(out, file + 8 + hl + b, e - b);
    }
    cJSON_Delete(h);
    free(file);
    return out;
}

// One row of reference.json.
typedef struct {
    int n_prompt, n_new;
    int32_t prompt[MAX_LEN], greedy[MAX_LEN];
    double gaps[MAX_LEN];
    const char *adapter; // NULL: base; points into the parsed JSON
} row_t;

static int int_array(const cJSON *a, int32_t *out, int max) {
    int n = cJSON_GetArraySize(a);
    assert_true(n > 0 && n <= max);
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    return n;
}

static void test_arch(const char *arch) {
    char root[1024], path[2048];
    snprintf(root, sizeof root, "%s/%s", LS_FIXTURES_DIR, arch);
    struct stat st;
    if (stat(root, &st) != 0)
        fail_msg("fixtures missing: %s (run tools/make_fixtures.py on a machine with torch, "
                 "transformers and peft, then commit tests/fixtures)", root);
    size_t len;
    snprintf(path, sizeof path, "%s/reference.json", root);
    char *text = read_text(path, &len);
    cJSON *ref = text ? cJSON_ParseWithLength(text, len) : NULL;
    if (!ref)
        fail_msg("fixtures missing or unreadable: %s", path);
    const cJSON *jrows = cJSON_GetObjectItemCaseSensitive(ref, "rows");
    const cJSON *jads = cJSON_GetObjectItemCaseSensitive(ref, "adapters");
    int max_rank = (int)cJSON_GetObjectItemCaseSensitive(ref, "max_lora_rank")->valuedouble;
    int R = cJSON_GetArraySize(jrows), n_ads = cJSON_GetArraySize(jads);
    assert_true(R > 0 && R <= MAX_ROWS && n_ads > 0);
    row_t *rows = calloc((size_t)R, sizeof *rows);
    for (int i = 0; i < R; i++) {
        const cJSON *jr = cJSON_GetArrayItem(jrows, i);
        const cJSON *ja = cJSON_GetObjectItemCaseSensitive(jr, "adapter");
        rows[i].adapter = cJSON_IsString(ja) ? ja->valuestring : NULL;
        rows[i].n_prompt = int_array(cJSON_GetObjectItemCaseSensitive(jr, "prompt_ids"),
                                     rows[i].prompt, MAX_LEN);
        rows[i].n_new = int_array(cJSON_GetObjectItemCaseSensitive(jr, "greedy_ids"),
                                  rows[i].greedy, MAX_LEN);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(jr, "top2_gaps");
        assert_int_equal(cJSON_GetArraySize(g), rows[i].n_new);
        for (int t = 0; t < rows[i].n_new; t++)
            rows[i].gaps[t] = cJSON_GetArrayItem(g, t)->valuedouble;
        assert_true(rows[i].n_prompt + rows[i].n_new <= MAX_LEN && rows[i].n_new == rows[0].n_new);
    }

    ls_backend_t *be = ls_backend_cpu_new(1);
    snprintf(path, sizeof path, "%s/model", root);
    ls_model_t *m = ls_model_load(path, be, NULL, NULL, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    const ls_model_config_t *cfg = ls_model_config(m);
    int V = cfg->vocab_size;
    ls_lora_pool_config_t pc = {n_ads, max_rank, n_ads, 0, LS_LORA_EVICT_LRU};
    ls_lora_pool_t *pool = ls_lora_pool_new(be, cfg, &pc, err, sizeof err);
    assert_non_null(pool);
    for (const cJSON *a = jads->child; a; a = a->next) {
        snprintf(path, sizeof path, "%s/adapters/%s", root, a->string);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, max_rank, err, sizeof err);
        if (!ad || ls_lora_pool_add(pool, a->string, &ad, false, NULL, 0, err, sizeof err))
            fail_msg("adapter %s: %s", a->string, err);
    }
    const char *ids[MAX_ROWS];
    int32_t slots[MAX_ROWS];
    for (int i = 0; i < R; i++)
        ids[i] = rows[i].adapter;
    if (ls_lora_pool_prepare(pool, ids, R, slots, err, sizeof err) != 0)
        fail_msg("%s", err);

    // 1. the mixed batch, last positions
    int blocks_per_row = MAX_LEN / BS;
    ls_kv_cache_t *kv = ls_kv_cache_new(m, (MAX_ROWS + MAX_LEN) * blocks_per_row, BS, err,
                                        sizeof err);
    int32_t tables[MAX_ROWS + MAX_LEN][MAX_LEN / BS];
    for (int i = 0; i < MAX_ROWS + MAX_LEN; i++)
        for (int b = 0; b < blocks_per_row; b++)
            tables[i][b] = i * blocks_per_row + b;
    ls_model_seq_t seqs[MAX_LEN];
    for (int i = 0; i < R; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, tables[i],
                                   blocks_per_row, slots[i], true};
    float *logits = malloc((size_t)MAX_LEN * V * sizeof *logits);
    assert_int_equal(ls_model_forward(m, kv, pool, seqs, R, err, sizeof err), R);
    assert_int_equal(ls_model_logits(m, logits), 0);
    int64_t shape[2];
    snprintf(path, sizeof path, "%s/reference.safetensors", root);
    float *want = read_ref_f32(path, "last_logits", shape);
    if (!want)
        fail_msg("%s: no F32 tensor \"last_logits\"", path);
    assert_true(shape[0] == R && shape[1] == V);
    double worst = 0, mag = 0;
    for (int i = 0; i < R; i++) {
        double d = 0;
        for (int v = 0; v < V; v++) {
            d = fmax(d, fabs((double)logits[i * V + v] - want[i * V + v]));
            mag = fmax(mag, fabs((double)want[i * V + v]));
        }
        print_message("%s row %d (%s): max|Δ last logits| %.3e\n", arch, i,
                      ids[i] ? ids[i] : "base", d);
        worst = fmax(worst, d);
    }
    free(want);
    print_message("%s: mixed batch of %d rows: max|Δ| %.3e over logits up to %.2f "
                  "(bound %.0e)\n", arch, R, worst, mag, TOL_LOGITS);
    assert_true(worst <= TOL_LOGITS);

    // 2. every prompt position of rows 0 and 1, as one batch of prefixes each
    for (int r = 0; r < 2 && r < R; r++) {
        char name[32];
        snprintf(name, sizeof name, "all_logits_row%d", r);
        want = read_ref_f32(path, name, shape);
        if (!want)
            fail_msg("%s: no F32 tensor \"%s\"", path, name);
        int L = rows[r].n_prompt;
        assert_true(shape[0] == L && shape[1] == V);
        for (int p = 0; p < L; p++)
            seqs[p] = (ls_model_seq_t){rows[r].prompt, p + 1, 0, tables[MAX_ROWS + p],
                                       blocks_per_row, slots[r], true};
        assert_int_equal(ls_model_forward(m, kv, pool, seqs, L, err, sizeof err), L);
        assert_int_equal(ls_model_logits(m, logits), 0);
        double d = 0;
        for (size_t k = 0; k < (size_t)L * V; k++)
            d = fmax(d, fabs((double)logits[k] - want[k]));
        print_message("%s row %d (%s): all %d positions max|Δ| %.3e\n", arch, r,
                      ids[r] ? ids[r] : "base", L, d);
        assert_true(d <= TOL_LOGITS);
        free(want);
    }

    // 3. greedy continuations of the mixed batch by decode steps; the prompt is in the
    // cache from step 1
    ls_sampling_params_t params[MAX_ROWS];
    for (int i = 0; i < R; i++)
        params[i] = (ls_sampling_params_t){.top_p = 1, .repetition_penalty = 1};
    ls_sampling_batch_t sb = {.n_rows = R, .params = params};
    int32_t got[MAX_ROWS][MAX_LEN], next[MAX_ROWS];
    for (int i = 0; i < R; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, tables[i],
                                   blocks_per_row, slots[i], true};
    assert_int_equal(ls_model_forward(m, kv, pool, seqs, R, err, sizeof err), R);
    int n_new = rows[0].n_new, compared = 0, total = 0;
    for (int t = 0; t < n_new; t++) {
        assert_int_equal(ls_model_sample(m, &sb, next, NULL, NULL, NULL), 0);
        for (int i = 0; i < R; i++) {
            got[i][t] = next[i];
            seqs[i] = (ls_model_seq_t){&got[i][t], 1, rows[i].n_prompt + t, tables[i],
                                       blocks_per_row, slots[i], true};
        }
        if (t + 1 < n_new)
            assert_int_equal(ls_model_forward(m, kv, pool, seqs, R, err, sizeof err), R);
    }
    for (int i = 0; i < R; i++) {
        double min_gap = INFINITY;
        int upto = 0;
        while (upto < rows[i].n_new && rows[i].gaps[upto] >= GAP_MIN)
            min_gap = fmin(min_gap, rows[i].gaps[upto++]);
        int same = 0;
        while (same < upto && got[i][same] == rows[i].greedy[same])
            same++;
        print_message("%s row %d: greedy tokens equal for %d of %d steps compared (of %d; "
                      "smallest reference top-2 gap over them %.2e)\n", arch, i, same, upto,
                      rows[i].n_new, min_gap);
        if (same < upto)
            fail_msg("%s row %d: greedy token %d is %d, reference %d (reference gap %.3e)",
                     arch, i, same, got[i][same], rows[i].greedy[same], rows[i].gaps[same]);
        compared += upto;
        total += rows[i].n_new;
    }
    print_message("%s: greedy tokens identical on all %d compared steps of %d\n", arch,
                  compared, total);
    free(logits);
    free(rows);
    cJSON_Delete(ref);
    free(text);
    ls_kv_cache_destroy(&kv);
    ls_lora_pool_destroy(&pool);
    ls_model_destroy(&m);
    ls_backend_destroy(&be);
}

static void test_llama(void **state) {
    (void)state;
    test_arch("llama");
}

static void test_qwen2(void **state) {
    (void)state;
    test_arch("qwen2");
}

static void test_qwen3(void **state) {
    (void)state;
    test_arch("qwen3");
}

static void test_mistral(void **state) {
    (void)state;
    test_arch("mistral");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_mistral),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
