// engine_checks — see engine_checks.h.
#include "engine_checks.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model.h"
#include "peft.h"
#include "safetensors.h"
#include "slot_plan.h"
#include "test_util.h"

#define MAX_ROWS 16
#define MAX_LEN 64
#define BS 4

static cJSON *s_read_json(const char *path, char *err, size_t errlen) {
    size_t len;
    char *text = tu_read_file(path, &len);
    cJSON *root = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    if (!root)
        snprintf(err, errlen, "%s: missing or not JSON (tests/fixtures is made by tools/make_fixtures.py, "
                              "examples/demo by tools/train_demo.py)", path);
    return root;
}

// An F32 tensor of reference.safetensors, read by hand: the file also holds int32 tensors
// (prompt and greedy ids), which the engine's loader refuses by design. Returns numel
// floats (malloc'd) and its shape, or NULL.
static float *s_ref_f32(const char *path, const char *name, int64_t shape[2]) {
    size_t len;
    char *file = tu_read_file(path, &len);
    if (!file || len < 8) {
        free(file);
        return NULL;
    }
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | (unsigned char)file[i];
    cJSON *h = hl <= len - 8 ? cJSON_ParseWithLength(file + 8, (size_t)hl) : NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    float *out = NULL;
    if (cJSON_IsString(dt) && strcmp(dt->valuestring, "F32") == 0 && cJSON_GetArraySize(sh) == 2 &&
        cJSON_GetArraySize(off) == 2) {
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
    const char *adapter;  // NULL: base; points into the parsed JSON
} row_t;

// The loaded fixture: model, cache, pool with every adapter, the rows' slots.
typedef struct {
    ls_model_t *m;
    ls_kv_cache_t *kv;
    ls_lora_pool_t *pool;
    int32_t slots[MAX_ROWS];
    int32_t tables[MAX_ROWS + MAX_LEN][MAX_LEN / BS];
} fixture_t;

static void s_fixture_free(fixture_t *f) {
    ls_lora_pool_destroy(&f->pool);
    ls_kv_cache_destroy(&f->kv);
    ls_model_destroy(&f->m);
}

static int s_fixture_load(fixture_t *f, ls_backend_t *be, ls_quant_t quant, const char *root, const cJSON *ref,
                          const row_t *rows,
                          int R, char *err, size_t errlen) {
    char path[2048];
    const cJSON *jads = cJSON_GetObjectItemCaseSensitive(ref, "adapters");
    int max_rank = (int)cJSON_GetObjectItemCaseSensitive(ref, "max_lora_rank")->valuedouble;
    int n_ads = cJSON_GetArraySize(jads);
    snprintf(path, sizeof path, "%s/model", root);
    if (!(f->m = ls_model_load(path, be, NULL, quant, NULL, NULL, err, errlen)))
        return -1;
    const ls_model_config_t *cfg = ls_model_config(f->m);
    // every target, the embedding and lm_head too (their groups run only for the adapters
    // that target them), and rows for the adapters' trainable tokens
    ls_lora_pool_config_t pc = {.max_loras_per_batch = n_ads, .max_lora_rank = max_rank,
                                .target_mask = (1u << LS_TARGET_ALL) - 1, .extra_vocab_size = 16};
    // one pool of pages, as the worker's: the rows' KV at the bottom, the adapters at the top
    int bpr = MAX_LEN / BS, ad_pages = slot_plan_pages(f->m, BS, &pc, err, errlen);
    if (ad_pages < 0 || !(f->kv = ls_kv_cache_new(f->m, (MAX_ROWS + MAX_LEN) * bpr + ad_pages, BS, err, errlen)))
        return -1;
    ls_page_arena_t arena = ls_kv_cache_arena(f->kv);
    if (!(f->pool = ls_lora_pool_new(be, cfg, &pc, &arena, err, errlen)))
        return -1;
    for (const cJSON *a = jads->child; a; a = a->next) {
        snprintf(path, sizeof path, "%s/adapters/%s", root, a->string);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, max_rank, err, errlen);
        int rc = ad ? ls_lora_pool_add_adapter(f->pool, a->string, &ad, err, errlen) : -1;
        ls_adapter_destroy(&ad);
        if (rc < 0)
            return -1;
    }
    const char *ids[MAX_ROWS];
    for (int i = 0; i < R; i++)
        ids[i] = rows[i].adapter;
    if (slot_plan_map_once(f->pool, ids, R, f->slots, err, errlen) != 0)
        return -1;
    for (int i = 0; i < MAX_ROWS + MAX_LEN; i++)
        for (int b = 0; b < bpr; b++)
            f->tables[i][b] = i * bpr + b;
    return 0;
}

static int s_forward_logits(fixture_t *f, const ls_model_seq_t *seqs, int n, float *logits, char *err,
                            size_t errlen) {
    if (ls_model_forward(f->m, f->kv, f->pool, seqs, n, err, errlen) != n)
        return -1;
    if (ls_model_logits(f->m, logits) != 0) {
        snprintf(err, errlen, "logits download failed");
        return -1;
    }
    return 0;
}

static double s_max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t k = 0; k < n; k++)
        d = fmax(d, fabs((double)a[k] - b[k]));
    return d;
}

// The fixture's directory (root) and its reference.json, parsed (path: where it is); NULL +
// err when it is missing or not JSON.
static cJSON *s_ref_open(const char *fixtures_dir, const char *arch, char *root, size_t root_cap, char *path,
                         size_t path_cap, char *err, size_t errlen) {
    snprintf(root, root_cap, "%s/%s", fixtures_dir, arch);
    snprintf(path, path_cap, "%s/reference.json", root);
    return s_read_json(path, err, errlen);
}

int ec_parity(ls_backend_t *be, ls_quant_t quant, const char *fixtures_dir, const char *arch, double gap_min,
              ec_parity_t *out, char *err, size_t errlen) {
    char root[1024], path[2048];
    memset(out, 0, sizeof *out);
    cJSON *ref = s_ref_open(fixtures_dir, arch, root, sizeof root, path, sizeof path, err, errlen);
    if (!ref)
        return -1;
    const cJSON *jrows = cJSON_GetObjectItemCaseSensitive(ref, "rows");
    int R = cJSON_GetArraySize(jrows);
    row_t *rows = calloc((size_t)(R > 0 ? R : 1), sizeof *rows);
    fixture_t *f = calloc(1, sizeof *f);
    float *logits = NULL, *want = NULL;
    int rc = -1;
    if (R < 1 || R > MAX_ROWS) {
        snprintf(err, errlen, "%s: %d rows (1..%d expected)", path, R, MAX_ROWS);
        goto done;
    }
    for (int i = 0; i < R; i++) {
        const cJSON *jr = cJSON_GetArrayItem(jrows, i);
        const cJSON *ja = cJSON_GetObjectItemCaseSensitive(jr, "adapter");
        rows[i].adapter = cJSON_IsString(ja) ? ja->valuestring : NULL;
        rows[i].n_prompt = tu_json_ids(cJSON_GetObjectItemCaseSensitive(jr, "prompt_ids"), rows[i].prompt, MAX_LEN);
        rows[i].n_new = tu_json_ids(cJSON_GetObjectItemCaseSensitive(jr, "greedy_ids"), rows[i].greedy, MAX_LEN);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(jr, "top2_gaps");
        if (cJSON_GetArraySize(g) != rows[i].n_new || rows[i].n_new != rows[0].n_new ||
            rows[i].n_prompt + rows[i].n_new > MAX_LEN) {
            snprintf(err, errlen, "%s: row %d is malformed", path, i);
            goto done;
        }
        for (int t = 0; t < rows[i].n_new; t++)
            rows[i].gaps[t] = cJSON_GetArrayItem(g, t)->valuedouble;
    }
    if (s_fixture_load(f, be, quant, root, ref, rows, R, err, errlen) < 0)
        goto done;
    int V = ls_model_config(f->m)->vocab_size, bpr = MAX_LEN / BS;
    out->rows = R;
    out->vocab = V;
    logits = malloc((size_t)MAX_LEN * V * sizeof *logits);
    ls_model_seq_t seqs[MAX_LEN];

    // 1. the mixed batch, last positions
    for (int i = 0; i < R; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, f->tables[i], bpr, f->slots[i], true, NULL, 0};
    if (s_forward_logits(f, seqs, R, logits, err, errlen) < 0)
        goto done;
    int64_t shape[2];
    snprintf(path, sizeof path, "%s/reference.safetensors", root);
    if (!(want = s_ref_f32(path, "last_logits", shape)) || shape[0] != R || shape[1] != V) {
        snprintf(err, errlen, "%s: no F32 last_logits of shape (%d, %d)", path, R, V);
        goto done;
    }
    double sum2 = 0;
    for (size_t k = 0; k < (size_t)R * V; k++) {
        double d = fabs((double)logits[k] - want[k]);
        out->last_max = fmax(out->last_max, d);
        out->last_mag = fmax(out->last_mag, fabs((double)want[k]));
        sum2 += d * d;
    }
    out->last_rms = sqrt(sum2 / ((double)R * V));
    out->all_max = out->last_max;
    free(want);
    want = NULL;

    // 2. every prompt position of rows 0 and 1, as one batch of prefixes each
    for (int r = 0; r < 2 && r < R; r++) {
        char name[32];
        snprintf(name, sizeof name, "all_logits_row%d", r);
        int L = rows[r].n_prompt;
        if (!(want = s_ref_f32(path, name, shape)) || shape[0] != L || shape[1] != V) {
            snprintf(err, errlen, "%s: no F32 %s of shape (%d, %d)", path, name, L, V);
            goto done;
        }
        for (int p = 0; p < L; p++)
            seqs[p] = (ls_model_seq_t){rows[r].prompt, p + 1, 0, f->tables[MAX_ROWS + p], bpr, f->slots[r], true, NULL, 0};
        if (s_forward_logits(f, seqs, L, logits, err, errlen) < 0)
            goto done;
        out->all_max = fmax(out->all_max, s_max_diff(logits, want, (size_t)L * V));
        free(want);
        want = NULL;
    }

    // 3. greedy continuations of the mixed batch by decode steps over the paged cache
    ls_sampling_params_t params[MAX_ROWS];
    for (int i = 0; i < R; i++)
        params[i] = (ls_sampling_params_t){.top_p = 1, .repetition_penalty = 1};
    ls_sampling_batch_t sb = {.n_rows = R, .params = params};
    int32_t got[MAX_ROWS][MAX_LEN], next[MAX_ROWS];
    for (int i = 0; i < R; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, f->tables[i], bpr, f->slots[i], true, NULL, 0};
    if (ls_model_forward(f->m, f->kv, f->pool, seqs, R, err, errlen) != R)
        goto done;
    int n_new = rows[0].n_new;
    for (int t = 0; t < n_new; t++) {
        if (ls_model_sample(f->m, &sb, next, NULL, NULL, NULL) != 0) {
            snprintf(err, errlen, "sampling failed");
            goto done;
        }
        for (int i = 0; i < R; i++) {
            got[i][t] = next[i];
            seqs[i] = (ls_model_seq_t){&got[i][t], 1, rows[i].n_prompt + t, f->tables[i], bpr, f->slots[i], true, NULL, 0};
        }
        if (t + 1 < n_new && ls_model_forward(f->m, f->kv, f->pool, seqs, R, err, errlen) != R)
            goto done;
    }
    out->min_gap_compared = INFINITY;
    for (int i = 0; i < R; i++) {
        int upto = 0;
        while (upto < rows[i].n_new && rows[i].gaps[upto] >= gap_min)
            out->min_gap_compared = fmin(out->min_gap_compared, rows[i].gaps[upto++]);
        int same = 0;
        while (same < upto && got[i][same] == rows[i].greedy[same])
            same++;
        if (same < upto) {
            out->greedy_mismatched_rows++;
            fprintf(stderr, "%s row %d: greedy token %d is %d, reference %d (reference gap %.3e)\n", arch, i,
                    same, got[i][same], rows[i].greedy[same], rows[i].gaps[same]);
        }
        out->greedy_compared += upto;
        out->greedy_agreed += same;
        out->greedy_total += rows[i].n_new;
    }
    rc = 0;
done:
    free(want);
    free(logits);
    s_fixture_free(f);
    free(f);
    free(rows);
    cJSON_Delete(ref);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// added vocabulary

int ec_added(ls_backend_t *be, ls_quant_t quant, const char *fixtures_dir, const char *arch, double gap_min,
             ec_added_t *out, char *err, size_t errlen) {
    char root[1024], path[2048];
    memset(out, 0, sizeof *out);
    cJSON *ref = s_ref_open(fixtures_dir, arch, root, sizeof root, path, sizeof path, err, errlen), *aj = NULL;
    row_t *rows = calloc(2, sizeof *rows);  // the base (reference.json's row 0), the adapter's
    float *want = NULL, *base_want = NULL, *logits = NULL;
    ls_model_t *m = NULL;
    ls_kv_cache_t *kv = NULL;
    ls_lora_pool_t *pool = NULL;
    ls_adapter_t *ad = NULL;
    int rc = -1;
    if (!ref || !rows)
        goto done;
    snprintf(path, sizeof path, "%s/added.json", root);
    if (!(aj = s_read_json(path, err, errlen))) {
        snprintf(err, errlen, "%s: missing: PEFT's reference for the added-vocabulary adapter "
                 "(tools/make_fixtures.py --added writes it)", path);
        goto done;
    }
    const cJSON *jname = cJSON_GetObjectItemCaseSensitive(aj, "adapter");
    const cJSON *jr0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ref, "rows"), 0);
    const cJSON *src[2] = {jr0, aj};
    for (int i = 0; i < 2; i++) {
        rows[i].n_prompt = tu_json_ids(cJSON_GetObjectItemCaseSensitive(src[i], "prompt_ids"), rows[i].prompt, MAX_LEN);
        rows[i].n_new = tu_json_ids(cJSON_GetObjectItemCaseSensitive(src[i], "greedy_ids"), rows[i].greedy, MAX_LEN);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(src[i], "top2_gaps");
        for (int k = 0; k < rows[i].n_new && k < cJSON_GetArraySize(g); k++)
            rows[i].gaps[k] = cJSON_GetArrayItem(g, k)->valuedouble;
        if (rows[i].n_prompt < 1 || rows[i].n_new < 1 || rows[i].n_prompt + rows[i].n_new > MAX_LEN ||
            cJSON_GetArraySize(g) != rows[i].n_new || (i && !cJSON_IsString(jname))) {
            snprintf(err, errlen, "%s: %s has no prompt, greedy ids and gaps of the expected lengths%s", root,
                     i ? "added.json" : "reference.json row 0", i ? " or no adapter name" : "");
            goto done;
        }
    }
    rows[1].adapter = jname->valuestring;
    snprintf(path, sizeof path, "%s/model", root);
    if (!(m = ls_model_load(path, be, NULL, quant, NULL, NULL, err, errlen)))
        goto done;
    const ls_model_config_t *cfg = ls_model_config(m);
    int V = cfg->vocab_size, bpr = MAX_LEN / BS;
    int64_t shape[2], bshape[2];
    snprintf(path, sizeof path, "%s/added.safetensors", root);
    if (!(want = s_ref_f32(path, "last_logits", shape)) || shape[0] != 1 || shape[1] <= V || shape[1] > 2 * V) {
        snprintf(err, errlen, "%s: no F32 last_logits of shape (1, vocab_size %d + its added tokens) "
                 "(tools/make_fixtures.py --added)", path, V);
        goto done;
    }
    out->width = (int)shape[1];
    snprintf(path, sizeof path, "%s/reference.safetensors", root);
    if (!(base_want = s_ref_f32(path, "last_logits", bshape)) || bshape[1] != V) {
        snprintf(err, errlen, "%s: no F32 last_logits of width %d", path, V);
        goto done;
    }
    for (int k = 0; k < rows[1].n_prompt; k++)
        out->added_in_prompt += rows[1].prompt[k] >= V;
    for (int k = 0; k < rows[1].n_new; k++)
        out->greedy_added += rows[1].greedy[k] >= V;
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 16,
                                .target_mask = (1u << LS_TARGET_ALL) - 1, .extra_vocab_size = 8};
    int ad_pages = slot_plan_pages(m, BS, &pc, err, errlen);
    if (ad_pages < 0 || !(kv = ls_kv_cache_new(m, 2 * bpr + ad_pages, BS, err, errlen)))
        goto done;
    ls_page_arena_t arena = ls_kv_cache_arena(kv);
    if (!(pool = ls_lora_pool_new(be, cfg, &pc, &arena, err, errlen)))
        goto done;
    snprintf(path, sizeof path, "%s/adapters/%s", root, rows[1].adapter);
    const char *ids[2] = {NULL, rows[1].adapter};
    int32_t slots[2], tables[2][MAX_LEN / BS];
    if (!(ad = ls_adapter_load(path, cfg, pc.max_lora_rank, err, errlen)) ||
        ls_lora_pool_add_adapter(pool, rows[1].adapter, &ad, err, errlen) != 0 ||
        slot_plan_map_once(pool, ids, 2, slots, err, errlen) != 0 || ls_lora_pool_wait(pool) != 0)
        goto done;
    for (int i = 0; i < 2; i++)
        for (int b = 0; b < bpr; b++)
            tables[i][b] = i * bpr + b;
    ls_model_seq_t seqs[2];
    for (int i = 0; i < 2; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, tables[i], bpr, slots[i], true, NULL, 0};
    if (ls_model_forward(m, kv, pool, seqs, 2, err, errlen) != 2)
        goto done;
    int W = out->logits_width = ls_model_logits_width(m);
    if (W < out->width || !(logits = malloc(2 * (size_t)W * sizeof *logits)) || ls_model_logits_wide(m, logits) != 0) {
        snprintf(err, errlen, "the logits (width %d) do not hold the adapter's %d columns, or cannot be read", W,
                 out->width);
        goto done;
    }
    out->last_max = s_max_diff(logits + W, want, (size_t)out->width);
    for (int k = 0; k < out->width; k++)
        out->last_mag = fmax(out->last_mag, fabs(want[k]));
    out->base_max = s_max_diff(logits, base_want, (size_t)V);
    out->past_neg_inf = 1;
    for (int i = 0; i < 2; i++)
        for (int k = i ? out->width : V; k < W; k++)
            out->past_neg_inf &= isinf(logits[(size_t)i * W + k]) && logits[(size_t)i * W + k] < 0;
    // greedy: decode steps of both rows, sampled over the whole width
    ls_sampling_params_t params[2] = {{.top_p = 1, .repetition_penalty = 1}, {.top_p = 1, .repetition_penalty = 1}};
    ls_sampling_batch_t sb = {.n_rows = 2, .params = params};
    int32_t got[2][MAX_LEN], next[2];
    int n_new = rows[1].n_new < rows[0].n_new ? rows[1].n_new : rows[0].n_new;
    for (int t = 0; t < n_new; t++) {
        if (ls_model_sample(m, &sb, next, NULL, NULL, NULL) != 0) {
            snprintf(err, errlen, "sampling failed");
            goto done;
        }
        for (int i = 0; i < 2; i++) {
            got[i][t] = next[i];
            seqs[i] = (ls_model_seq_t){&got[i][t], 1, rows[i].n_prompt + t, tables[i], bpr, slots[i], true, NULL, 0};
        }
        if (t + 1 < n_new && ls_model_forward(m, kv, pool, seqs, 2, err, errlen) != 2)
            goto done;
    }
    for (int i = 0; i < 2; i++) {
        int upto = 0, same = 0;
        while (upto < n_new && rows[i].gaps[upto] >= gap_min)
            upto++;
        while (same < upto && got[i][same] == rows[i].greedy[same])
            same++;
        if (same < upto) {
            out->greedy_mismatched++;
            fprintf(stderr, "%s added-vocabulary batch row %d: greedy token %d is %d, reference %d (gap %.3e)\n",
                    arch, i, same, got[i][same], rows[i].greedy[same], rows[i].gaps[same]);
        }
        out->greedy_compared += upto;
        out->greedy_total += n_new;
    }
    rc = 0;
done:
    ls_adapter_destroy(&ad);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&m);
    free(logits);
    free(want);
    free(base_want);
    free(rows);
    cJSON_Delete(aj);
    cJSON_Delete(ref);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// mix

#define M_ROWS 5
#define M_STEPS 8

// Writes into dir the PEFT adapter that PEFT's add_weighted_adapter(combination_type="cat")
// builds from ads[0..n) at weights w: per module, A = concat(w_i·scaling_i·A_i) and
// B = concat(B_i) along the rank, scaling 1 (alpha = r per module, through rank_pattern and
// alpha_pattern keyed by the full module name). 0 or -1 + err.
static int s_write_cat(const char *dir, const ls_model_config_t *cfg, ls_adapter_t *const *ads,
                       const float *w, int n, char *err, size_t errlen) {
    int L = cfg->num_hidden_layers, nt = 0;
    ls_st_write_tensor_t *t = calloc((size_t)L * LS_TARGET_COUNT * 2, sizeof *t);
    char (*names)[160] = calloc((size_t)L * LS_TARGET_COUNT * 2, 160);
    size_t jcap = (size_t)L * LS_TARGET_COUNT * 200 + 1024, jn = 0;
    char *pat = malloc(jcap);
    unsigned mask = 0;
    int rc = t && names && pat ? 0 : -1;
    pat[0] = '\0';
    for (int l = 0; rc == 0 && l < L; l++)
        for (int tg = 0; tg < LS_TARGET_COUNT; tg++) {
            int r = 0, in, out;
            ls_model_config_target_dims(cfg, (ls_target_t)tg, &in, &out);
            for (int i = 0; i < n; i++)
                r += ls_adapter_layer_target(ads[i], l, (ls_target_t)tg)->rank;
            if (r == 0)
                continue;
            float *a = malloc((size_t)r * in * sizeof *a), *b = malloc((size_t)out * r * sizeof *b);
            int at = 0;
            for (int i = 0; i < n; i++) {
                const ls_lora_weights_t *lw = ls_adapter_layer_target(ads[i], l, (ls_target_t)tg);
                if (!lw->rank)
                    continue;  // this adapter leaves the target alone: no A or B
                float f = w[i] * lw->scaling;
                for (size_t k = 0; k < (size_t)lw->rank * in; k++)
                    a[(size_t)at * in + k] = f * lw->A[k];
                for (int o = 0; o < out; o++)
                    memcpy(b + (size_t)o * r + at, lw->B + (size_t)o * lw->rank, (size_t)lw->rank * sizeof *b);
                at += lw->rank;
            }
            for (int which = 0; which < 2; which++) {
                snprintf(names[nt], 160, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         ls_target_parent((ls_target_t)tg), ls_target_name((ls_target_t)tg), which ? 'B' : 'A');
                t[nt] = (ls_st_write_tensor_t){names[nt], LS_DTYPE_F32, 2, {which ? out : r, which ? r : in},
                                               which ? b : a};
                nt++;
            }
            jn += (size_t)snprintf(pat + jn, jcap - jn, "%s\"model.layers.%d.%s.%s\": %d", jn ? ", " : "", l,
                                   ls_target_parent((ls_target_t)tg), ls_target_name((ls_target_t)tg), r);
            mask |= 1u << tg;
        }
    char path[4096], targets[256] = "";
    for (int tg = 0; tg < LS_TARGET_COUNT; tg++)
        if (mask >> tg & 1)
            snprintf(targets + strlen(targets), sizeof targets - strlen(targets), "%s\"%s\"", *targets ? ", " : "",
                     ls_target_name((ls_target_t)tg));
    size_t clen = 2 * jn + 1024;
    char *config = rc == 0 ? malloc(clen) : NULL;
    if (config) {
        snprintf(config, clen,
                 "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": 1, \"lora_alpha\": 1, "
                 "\"target_modules\": [%s], \"rank_pattern\": {%s}, \"alpha_pattern\": {%s}}",
                 targets, pat, pat);
        mkdir(dir, 0700);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        FILE *fp = fopen(path, "w");
        rc = fp && fputs(config, fp) >= 0 ? 0 : -1;
        if (fp && fclose(fp) != 0)
            rc = -1;
        if (rc != 0)
            snprintf(err, errlen, "%s: cannot write", path);
    } else {
        rc = -1;
        snprintf(err, errlen, "out of memory");
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (rc == 0)
        rc = ls_st_write(path, t, (size_t)nt, err, errlen);
    for (int i = 0; i < nt; i++)
        if (i % 2 == 0) {
            free((void *)t[i].data);
            free((void *)t[i + 1].data);
        }
    free(config);
    free(pat);
    free(names);
    free(t);
    return rc;
}

// Greedy id of a logit row.
static int32_t s_argmax(const float *row, int V) {
    int32_t best = 0;
    for (int v = 1; v < V; v++)
        if (row[v] > row[best])
            best = v;
    return best;
}

int ec_mix(ls_backend_t *be, ls_quant_t quant, const char *fixtures_dir, const char *arch, double gap_min, ec_mix_t *out,
           char *err, size_t errlen) {
    static const char *names[2] = {"all_r8", "attn_r4_bf16"};
    // the mixed batch: a mix, the base model, a one-component mix (= adapter a), adapter b and
    // a second mix of the two in the other order; the reference batch has the "cat" adapters
    // in the mixes' places
    static const float w1[2] = {0.7f, 0.3f}, w2[2] = {0.25f, 0.5f};
    char root[1024], path[2048], tmp[1024] = "";
    memset(out, 0, sizeof *out);
    cJSON *ref = s_ref_open(fixtures_dir, arch, root, sizeof root, path, sizeof path, err, errlen);
    if (!ref)
        return -1;
    const cJSON *jrows = cJSON_GetObjectItemCaseSensitive(ref, "rows");
    int32_t prompt[M_ROWS][MAX_LEN], n_prompt[M_ROWS];
    ls_model_t *m = NULL;
    ls_kv_cache_t *kv = NULL, *arena_kv = NULL;
    ls_lora_pool_t *pool = NULL;
    ls_adapter_t *ads[2] = {NULL, NULL};
    float *logits[2] = {NULL, NULL}, *peft = NULL;
    cJSON *peft_json = NULL;
    int rc = -1;
    for (int i = 0; i < M_ROWS; i++) {
        const cJSON *jr = cJSON_GetArrayItem(jrows, i);
        n_prompt[i] = tu_json_ids(cJSON_GetObjectItemCaseSensitive(jr, "prompt_ids"), prompt[i], MAX_LEN);
        if (n_prompt[i] < 1 || n_prompt[i] + M_STEPS > MAX_LEN) {
            snprintf(err, errlen, "%s: row %d is missing or too long", path, i);
            goto done;
        }
    }
    snprintf(path, sizeof path, "%s/model", root);
    if (!(m = ls_model_load(path, be, NULL, quant, NULL, NULL, err, errlen)))
        goto done;
    const ls_model_config_t *cfg = ls_model_config(m);
    int V = cfg->vocab_size, bpr = MAX_LEN / BS;
    // PEFT's mixes: rows 0 and 4 below, in this order (tools/make_fixtures.py MIXES)
    int64_t pshape[2];
    snprintf(path, sizeof path, "%s/mix.safetensors", root);
    if (!(peft = s_ref_f32(path, "last_logits", pshape)) || pshape[0] != 2 || pshape[1] != V) {
        snprintf(err, errlen, "%s: no F32 last_logits of shape (2, %d) (tools/make_fixtures.py --mix)", path, V);
        goto done;
    }
    snprintf(path, sizeof path, "%s/mix.json", root);
    char *pj = tu_read_file(path, NULL);
    peft_json = pj ? cJSON_Parse(pj) : NULL;
    free(pj);
    const cJSON *pmixes = cJSON_GetObjectItemCaseSensitive(peft_json, "mixes");
    if (cJSON_GetArraySize(pmixes) != 2) {
        snprintf(err, errlen, "%s: no two mixes", path);
        goto done;
    }
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 4, .max_lora_rank = 16};
    if (!(arena_kv = slot_plan_arena_new(m, BS, &pc, err, errlen)))
        goto done;
    ls_page_arena_t arena = ls_kv_cache_arena(arena_kv);
    if (!(pool = ls_lora_pool_new(be, cfg, &pc, &arena, err, errlen)))
        goto done;
    // adapters a and b in slots 1 and 2, the "cat" forms of the two mixes in 3 and 4
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/adapters/%s", root, names[i]);
        if (!(ads[i] = ls_adapter_load(path, cfg, pc.max_lora_rank, err, errlen)))
            goto done;
    }
    if (tu_tmpdir(tmp, sizeof tmp, "ec_mix") != 0) {
        snprintf(err, errlen, "no temporary directory");
        goto done;
    }
    const float *cat_w[2] = {w1, w2};
    for (int c = 0; c < 2; c++) {
        char dir[1100], id[8];
        snprintf(dir, sizeof dir, "%s/cat%d", tmp, c);
        snprintf(id, sizeof id, "cat%d", c);
        ls_adapter_t *cat = NULL;
        if (s_write_cat(dir, cfg, ads, cat_w[c], 2, err, errlen) != 0 ||
            !(cat = ls_adapter_load(dir, cfg, pc.max_lora_rank, err, errlen)) ||
            ls_lora_pool_add_adapter(pool, id, &cat, err, errlen) != 0 ||
            slot_plan_assign(pool, id, 3 + c, err, errlen) != 0) {
            ls_adapter_destroy(&cat);
            goto done;
        }
    }
    for (int i = 0; i < 2; i++)
        if (ls_lora_pool_add_adapter(pool, names[i], &ads[i], err, errlen) != 0 ||
            slot_plan_assign(pool, names[i], 1 + i, err, errlen) != 0)
            goto done;
    if (ls_lora_pool_wait(pool) != 0 || !(kv = ls_kv_cache_new(m, 2 * M_ROWS * bpr, BS, err, errlen)))
        goto done;
    int32_t tables[2][M_ROWS][MAX_LEN / BS];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < M_ROWS; i++)
            for (int k = 0; k < bpr; k++)
                tables[b][i][k] = (b * M_ROWS + i) * bpr + k;
    const ls_model_lora_part_t mix1[2] = {{1, w1[0]}, {2, w1[1]}}, mix2[2] = {{2, w2[1]}, {1, w2[0]}},
                               one[1] = {{1, 1.0f}};
    // per batch and row: slot, mix (NULL: the slot alone), components
    const int slot_of[2][M_ROWS] = {{0, 0, 0, 2, 0}, {3, 0, 1, 2, 4}};
    const ls_model_lora_part_t *mix_of[M_ROWS] = {mix1, NULL, one, NULL, mix2};
    const int n_mix_of[M_ROWS] = {2, 0, 1, 0, 2};
    out->rows = M_ROWS;
    for (int b = 0; b < 2; b++)
        if (!(logits[b] = malloc((size_t)M_ROWS * V * sizeof(float)))) {
            snprintf(err, errlen, "out of memory");
            goto done;
        }

    // prefill, then M_STEPS greedy decode steps of each batch, the two compared at every step
    int32_t tok[2][M_ROWS][M_STEPS + 1];
    out->single_identical = 1;
    for (int step = 0; step <= M_STEPS; step++) {
        for (int b = 0; b < 2; b++) {
            ls_model_seq_t seqs[M_ROWS];
            for (int i = 0; i < M_ROWS; i++) {
                bool pre = step == 0;
                seqs[i] = (ls_model_seq_t){pre ? prompt[i] : &tok[b][i][step - 1], pre ? n_prompt[i] : 1,
                                           pre ? 0 : n_prompt[i] + step - 1, tables[b][i], bpr, slot_of[b][i], true,
                                           b == 0 ? mix_of[i] : NULL, b == 0 ? n_mix_of[i] : 0};
            }
            if (ls_model_forward(m, kv, pool, seqs, M_ROWS, err, errlen) != M_ROWS ||
                ls_model_logits(m, logits[b]) != 0) {
                if (!*err)
                    snprintf(err, errlen, "logits download failed");
                goto done;
            }
            for (int i = 0; i < M_ROWS; i++)
                tok[b][i][step] = s_argmax(logits[b] + (size_t)i * V, V);
            if (b == 0 && step == 0)
                for (int k = 0; k < 2; k++) {
                    const float *x = logits[0] + (size_t)(k ? 4 : 0) * V, *y = peft + (size_t)k * V;
                    out->peft_max = fmax(out->peft_max, s_max_diff(x, y, (size_t)V));
                    for (int v = 0; v < V; v++)
                        out->peft_mag = fmax(out->peft_mag, fabs((double)y[v]));
                }
        }
        bool same_tokens = true;
        for (int i = 0; i < M_ROWS; i++) {
            const float *x = logits[0] + (size_t)i * V, *y = logits[1] + (size_t)i * V;
            if (n_mix_of[i] == 2) {
                out->mix_max = fmax(out->mix_max, s_max_diff(x, y, (size_t)V));
                for (int v = 0; v < V; v++)
                    out->mix_mag = fmax(out->mix_mag, fabs((double)y[v]));
            } else if (memcmp(x, y, (size_t)V * sizeof *x) != 0) {
                out->single_identical = 0;
                out->single_max = fmax(out->single_max, s_max_diff(x, y, (size_t)V));
            }
            same_tokens = same_tokens && tok[0][i][step] == tok[1][i][step];
        }
        if (!same_tokens)
            break;  // the batches' inputs part from here on
        out->steps_compared++;
    }

    // PEFT's greedy tokens, up to the first near tie of the reference (either token is right there)
    for (int k = 0; k < 2; k++) {
        const cJSON *pm = cJSON_GetArrayItem(pmixes, k);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(pm, "greedy_ids");
        const cJSON *gaps = cJSON_GetObjectItemCaseSensitive(pm, "top2_gaps");
        for (int t = 0; t < out->steps_compared && t < cJSON_GetArraySize(ids) && t < cJSON_GetArraySize(gaps); t++) {
            if (cJSON_GetArrayItem(gaps, t)->valuedouble < gap_min)
                break;
            out->peft_greedy_compared++;
            if (tok[0][k ? 4 : 0][t] != cJSON_GetArrayItem(ids, t)->valueint) {
                out->peft_greedy_mismatched++;
                break;  // the inputs part from here on
            }
        }
    }

    // bad mixes are refused as a malformed step
    const ls_model_lora_part_t bad[4][2] = {{{1, 0.0f}, {2, 1.0f}}, {{1, -0.5f}, {2, 1.0f}},
                                            {{1, NAN}, {2, 1.0f}}, {{1, 1.0f}, {7, 1.0f}}};
    for (int k = 0; k < 5; k++) {
        ls_model_seq_t s = {prompt[0], n_prompt[0], 0, tables[0][0], bpr, 0, true, k < 4 ? bad[k] : mix1,
                            k < 4 ? 2 : LS_LORA_MIX_MAX + 1};
        char why[256] = "";
        if (ls_model_forward(m, kv, pool, &s, 1, why, sizeof why) < 0 && *why)
            out->refused++;
    }
    rc = 0;
done:
    for (int i = 0; i < 2; i++) {
        ls_adapter_destroy(&ads[i]);
        free(logits[i]);
    }
    free(peft);
    cJSON_Delete(peft_json);
    ls_kv_cache_destroy(&kv);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&arena_kv);
    ls_model_destroy(&m);
    if (*tmp)
        tu_rmrf(tmp);
    cJSON_Delete(ref);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// demo

#define D_MAX_NEW 40
#define D_BLOCK 16
#define D_MAX_REQS 512

typedef struct {
    const char *adapter;  // eval.json's name: "adapters/reverse"; NULL for the base model
    int32_t prompt[256];
    int n_prompt;
    int32_t expected[D_MAX_NEW], out[D_MAX_NEW];
    int n_expected, n_out, done;
    int32_t blocks[(256 + D_MAX_NEW) / D_BLOCK + 2];
    int n_blocks;
} req_t;

static int s_is_stop(int32_t id) { return id == 1 || id == 3; }  // eval.json stop_token_ids

// Every (model, prompt, variant) of eval.json into reqs: reqs[model][k], 32 per model.
static int s_demo_requests(cJSON *root, req_t *reqs, char *err, size_t errlen) {
    int n = 0;
    cJSON *model;
    cJSON_ArrayForEach(model, cJSON_GetObjectItem(root, "results")) {
        cJSON *adapter = cJSON_GetObjectItem(model, "adapter"), *p;
        if (cJSON_GetObjectItem(model, "accuracy")->valuedouble != 1.0) {
            snprintf(err, errlen, "eval.json: %s is not at 100%% in torch", model->string);
            return -1;
        }
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(model, "prompts")) {
            const char *variants[] = {"raw", "chat"};
            for (int v = 0; v < 2 && n < D_MAX_REQS; v++) {
                cJSON *var = cJSON_GetObjectItem(p, variants[v]);
                req_t *r = &reqs[n++];
                memset(r, 0, sizeof *r);
                r->adapter = cJSON_IsString(adapter) ? adapter->valuestring : NULL;
                r->n_prompt = tu_json_ids(cJSON_GetObjectItem(var, "prompt_ids"), r->prompt, 256);
                // torch's greedy ids, which decode to the rule's answer (`ok` says so)
                r->n_expected = tu_json_ids(cJSON_GetObjectItem(var, "output_ids"), r->expected, D_MAX_NEW);
                if (!cJSON_IsTrue(cJSON_GetObjectItem(var, "ok"))) {
                    snprintf(err, errlen, "eval.json: a %s prompt is not answered right in torch", model->string);
                    return -1;
                }
            }
        }
    }
    return n;
}

// Greedy-decodes reqs[0..n) together; returns the number of mismatches, -1 on failure.
static int s_demo_batch(ls_model_t *model, ls_kv_cache_t *kv, ls_lora_pool_t *pool, slot_plan_t *plan, req_t *batch,
                        int m, char *err, size_t errlen) {
    int V = ls_model_config(model)->vocab_size, next_block = 0, rc = -1;
    const char *ids[D_MAX_REQS];
    int32_t slots[D_MAX_REQS];
    for (int i = 0; i < m; i++) {
        batch[i].n_blocks = (batch[i].n_prompt + D_MAX_NEW + D_BLOCK - 1) / D_BLOCK;
        for (int b = 0; b < batch[i].n_blocks; b++)
            batch[i].blocks[b] = next_block++;
        batch[i].n_out = batch[i].done = 0;
        ids[i] = batch[i].adapter;
    }
    // the adapters' shares lie at the top of the cache (slot_plan.h)
    if (next_block > ls_kv_cache_num_blocks(kv) - ls_lora_pool_image_max_pages(pool) * (ls_lora_pool_n_slots(pool) - 1)) {
        snprintf(err, errlen, "the demo batch needs %d KV blocks", next_block);
        return -1;
    }
    if (slot_plan_map(plan, ids, m, slots, err, errlen) < 0)
        return -1;
    ls_model_seq_t *seqs = calloc((size_t)m, sizeof *seqs);
    float *logits = malloc(sizeof(float) * (size_t)m * V);
    int *row_of = malloc(sizeof(int) * (size_t)m);
    for (int step = 0;; step++) {
        int ns = 0;
        for (int i = 0; i < m; i++) {
            req_t *r = &batch[i];
            if (r->done)
                continue;
            // the whole prompt first, then one token at a time
            seqs[ns] = step == 0 ? (ls_model_seq_t){r->prompt, r->n_prompt, 0, r->blocks, r->n_blocks, slots[i], true, NULL, 0}
                                 : (ls_model_seq_t){&r->out[r->n_out - 1], 1, r->n_prompt + r->n_out - 1, r->blocks,
                                                    r->n_blocks, slots[i], true, NULL, 0};
            row_of[ns++] = i;
        }
        if (!ns)
            break;
        if (ls_model_forward(model, kv, pool, seqs, ns, err, errlen) != ns || ls_model_logits(model, logits) != 0)
            goto done;
        for (int k = 0; k < ns; k++) {
            req_t *r = &batch[row_of[k]];
            const float *l = logits + (size_t)k * V;
            int32_t best = 0;
            for (int v = 1; v < V; v++)
                if (l[v] > l[best])
                    best = v;
            r->out[r->n_out++] = best;
            r->done = s_is_stop(best) || r->n_out == D_MAX_NEW;
        }
    }
    rc = 0;
    for (int i = 0; i < m; i++) {
        req_t *r = &batch[i];
        if (r->n_out != r->n_expected || memcmp(r->out, r->expected, sizeof(int32_t) * (size_t)r->n_out)) {
            rc++;
            fprintf(stderr, "demo mismatch: adapter %s, prompt of %d tokens: %d tokens, expected %d\n",
                    r->adapter ? r->adapter : "(base)", r->n_prompt, r->n_out, r->n_expected);
        }
    }
done:
    free(seqs);
    free(logits);
    free(row_of);
    return rc;
}

int ec_demo(ls_backend_t *be, ls_quant_t quant, const char *demo_dir, int n_slots, ec_demo_t *out, char *err,
            size_t errlen) {
    static req_t reqs[D_MAX_REQS], order[D_MAX_REQS];
    memset(out, 0, sizeof *out);
    char path[1024];
    snprintf(path, sizeof path, "%s/eval.json", demo_dir);
    cJSON *root = s_read_json(path, err, errlen);
    if (!root)
        return -1;
    ls_model_t *model = NULL;
    ls_kv_cache_t *kv = NULL;
    ls_lora_pool_t *pool = NULL;
    slot_plan_t *plan = NULL;
    int rc = -1, n = s_demo_requests(root, reqs, err, errlen);
    if (n < 5 * 32)
        goto done;
    ls_lora_pool_config_t pc = {.max_loras_per_batch = n_slots, .max_lora_rank = 16};
    if (!(model = ls_model_load(demo_dir, be, NULL, quant, NULL, NULL, err, errlen)))
        goto done;
    // one pool of pages for KV and adapters, as the worker's
    int ad_pages = slot_plan_pages(model, D_BLOCK, &pc, err, errlen);
    if (ad_pages < 0 || !(kv = ls_kv_cache_new(model, 1200 + ad_pages, D_BLOCK, err, errlen)))
        goto done;
    ls_page_arena_t arena = ls_kv_cache_arena(kv);
    if (!(pool = ls_lora_pool_new(be, ls_model_config(model), &pc, &arena, err, errlen)))
        goto done;
    if (!(plan = slot_plan_new(pool, LORA_EVICT_LRU))) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    // eval.json names each adapter by its directory under examples/demo: that is its id here
    const char *names[] = {"adapters/reverse", "adapters/upper", "adapters/sort", "adapters/digits"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", demo_dir, names[i]);
        ls_adapter_t *a = ls_adapter_load(path, ls_model_config(model), 16, err, errlen);
        int added = a ? ls_lora_pool_add_adapter(pool, names[i], &a, err, errlen) : -1;
        ls_adapter_destroy(&a);
        if (added < 0)
            goto done;
    }
    int per_model = n / 5, k = 0, per_batch;
    if (n_slots >= 4) {
        // interleaved, so adapters mix within the batch: base, reverse, upper, sort, digits, …
        for (int i = 0; i < per_model; i++)
            for (int m = 0; m < 5; m++)
                order[k++] = reqs[m * per_model + i];
        per_batch = k;
    } else {
        // base + two adapters per batch, the pairs in turn, so slots change hands
        const int pairs[][2] = {{1, 2}, {3, 4}, {1, 3}, {2, 4}};
        for (int p = 0; p < 4; p++)
            for (int i = p * 8; i < p * 8 + 8 && i < per_model; i++) {
                order[k++] = reqs[i];
                order[k++] = reqs[pairs[p][0] * per_model + i];
                order[k++] = reqs[pairs[p][1] * per_model + i];
            }
        per_batch = 24;
    }
    for (int start = 0; start < k; start += per_batch) {
        int m = k - start < per_batch ? k - start : per_batch;
        int bad = s_demo_batch(model, kv, pool, plan, order + start, m, err, errlen);
        if (bad < 0)
            goto done;
        out->mismatches += bad;
    }
    out->requests = k;
    out->pool = ls_lora_pool_stats(pool);
    rc = 0;
done:
    slot_plan_destroy(&plan);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&model);
    cJSON_Delete(root);
    return rc;
}
