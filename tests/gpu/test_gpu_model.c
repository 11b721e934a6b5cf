/*  tests/gpu/test_gpu_model.c — the whole model on the CUDA backend, through ls_model_load.

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
       backend, one mixed prefill + decode step, logits compared.

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

    Usage: test_gpu_model [--cpu] [--device N]   (--cpu runs the same checks on the CPU
    backend, with the CPU bound 5e-5 for every dtype: a desk check of the test itself)
    Exit status 0 when every check passed. Not a ctest: tests/gpu/run.sh runs it.
*/
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
#ifdef LS_HAVE_CUDA
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

#define MAX_ROWS 16
#define MAX_LEN 64
#define BS 4

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

static char *s_read(const char *path, size_t *len) {
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
    if (len)
        *len = (size_t)n;
    return buf;
}

// An F32 tensor of reference.safetensors (test_parity.c's reader).
static float *s_ref_f32(const char *path, const char *name, int64_t shape[2]) {
    size_t len;
    char *file = s_read(path, &len);
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

typedef struct {
    int n_prompt, n_new;
    int32_t prompt[MAX_LEN], greedy[MAX_LEN];
    double gaps[MAX_LEN];
    const char *adapter;
} row_t;

static int s_ints(const cJSON *a, int32_t *out, int max) {
    int n = cJSON_GetArraySize(a);
    if (n <= 0 || n > max)
        s_die("reference.json", "bad id array");
    for (int i = 0; i < n; i++)
        out[i] = (int32_t)cJSON_GetArrayItem(a, i)->valuedouble;
    return n;
}

// --- 1. HF parity ---------------------------------------------------------------------------

static void s_parity(const char *arch, double *worst_out) {
    char root[1024], path[2048];
    snprintf(root, sizeof root, "%s/%s", s_fixtures(), arch);
    snprintf(path, sizeof path, "%s/reference.json", root);
    size_t len;
    char *text = s_read(path, &len);
    cJSON *ref = text ? cJSON_ParseWithLength(text, len) : NULL;
    if (!ref)
        s_die(path, "missing or unreadable");
    const cJSON *jrows = cJSON_GetObjectItemCaseSensitive(ref, "rows");
    const cJSON *jads = cJSON_GetObjectItemCaseSensitive(ref, "adapters");
    int max_rank = (int)cJSON_GetObjectItemCaseSensitive(ref, "max_lora_rank")->valuedouble;
    int R = cJSON_GetArraySize(jrows), n_ads = cJSON_GetArraySize(jads);
    row_t *rows = calloc((size_t)R, sizeof *rows);
    for (int i = 0; i < R; i++) {
        const cJSON *jr = cJSON_GetArrayItem(jrows, i);
        const cJSON *ja = cJSON_GetObjectItemCaseSensitive(jr, "adapter");
        rows[i].adapter = cJSON_IsString(ja) ? ja->valuestring : NULL;
        rows[i].n_prompt = s_ints(cJSON_GetObjectItemCaseSensitive(jr, "prompt_ids"),
                                  rows[i].prompt, MAX_LEN);
        rows[i].n_new = s_ints(cJSON_GetObjectItemCaseSensitive(jr, "greedy_ids"),
                               rows[i].greedy, MAX_LEN);
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(jr, "top2_gaps");
        for (int t = 0; t < rows[i].n_new; t++)
            rows[i].gaps[t] = cJSON_GetArrayItem(g, t)->valuedouble;
    }
    ls_backend_t *be = s_backend();
    snprintf(path, sizeof path, "%s/model", root);
    ls_model_t *m = ls_model_load(path, be, NULL, NULL, err, sizeof err);
    if (!m)
        s_die(path, err);
    const ls_model_config_t *cfg = ls_model_config(m);
    ls_dtype_t wdt = ls_model_kv_dtype(m);
    double tol = s_tol(wdt), gap_min = 2 * tol > 1e-3 ? 2 * tol : 1e-3;
    int V = cfg->vocab_size;
    ls_lora_pool_config_t pc = {n_ads, max_rank, n_ads, 0, LS_LORA_EVICT_LRU};
    ls_lora_pool_t *pool = ls_lora_pool_new(be, cfg, &pc, err, sizeof err);
    if (!pool)
        s_die("pool", err);
    for (const cJSON *a = jads->child; a; a = a->next) {
        snprintf(path, sizeof path, "%s/adapters/%s", root, a->string);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, max_rank, err, sizeof err);
        if (!ad || ls_lora_pool_add(pool, a->string, &ad, false, NULL, 0, err, sizeof err))
            s_die(path, err);
    }
    const char *ids[MAX_ROWS];
    int32_t slots[MAX_ROWS];
    for (int i = 0; i < R; i++)
        ids[i] = rows[i].adapter;
    if (ls_lora_pool_prepare(pool, ids, R, slots, err, sizeof err) != 0)
        s_die("prepare", err);
    int bpr = MAX_LEN / BS;
    ls_kv_cache_t *kv = ls_kv_cache_new(m, (MAX_ROWS + MAX_LEN) * bpr, BS, err, sizeof err);
    if (!kv)
        s_die("kv", err);
    static int32_t tables[MAX_ROWS + MAX_LEN][MAX_LEN / BS];
    for (int i = 0; i < MAX_ROWS + MAX_LEN; i++)
        for (int b = 0; b < bpr; b++)
            tables[i][b] = i * bpr + b;
    ls_model_seq_t seqs[MAX_LEN];
    for (int i = 0; i < R; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, tables[i], bpr,
                                   slots[i], true};
    float *logits = malloc((size_t)MAX_LEN * V * sizeof *logits);
    if (ls_model_forward(m, kv, pool, seqs, R, err, sizeof err) != R)
        s_die("forward", err);
    if (ls_model_logits(m, logits) != 0)
        s_die("logits", "download failed");
    int64_t shape[2];
    snprintf(path, sizeof path, "%s/reference.safetensors", root);
    float *want = s_ref_f32(path, "last_logits", shape);
    if (!want || shape[0] != R || shape[1] != V)
        s_die(path, "no last_logits of the right shape");
    double worst = 0, mag = 0, sum2 = 0;
    for (int i = 0; i < R * V; i++) {
        double d = fabs((double)logits[i] - want[i]);
        worst = fmax(worst, d);
        sum2 += d * d;
        mag = fmax(mag, fabs((double)want[i]));
    }
    free(want);
    s_check(worst <= tol, "%s (%s weights, %s KV): mixed batch of %d rows, last logits: "
            "max|Δ| %.3e, rms %.2e, logits up to %.2f (bound %.0e)", arch,
            ls_dtype_name(wdt), ls_dtype_name(ls_kv_cache_dtype(kv)), R, worst,
            sqrt(sum2 / (R * V)), mag, tol);
    double w_all = worst;
    for (int r = 0; r < 2 && r < R; r++) {
        char name[32];
        snprintf(name, sizeof name, "all_logits_row%d", r);
        want = s_ref_f32(path, name, shape);
        int L = rows[r].n_prompt;
        if (!want || shape[0] != L || shape[1] != V)
            s_die(path, name);
        for (int p = 0; p < L; p++)
            seqs[p] = (ls_model_seq_t){rows[r].prompt, p + 1, 0, tables[MAX_ROWS + p], bpr,
                                       slots[r], true};
        if (ls_model_forward(m, kv, pool, seqs, L, err, sizeof err) != L)
            s_die("forward", err);
        if (ls_model_logits(m, logits) != 0)
            s_die("logits", "download failed");
        double d = 0;
        for (size_t k = 0; k < (size_t)L * V; k++)
            d = fmax(d, fabs((double)logits[k] - want[k]));
        s_check(d <= tol, "%s row %d (%s): all %d prompt positions: max|Δ| %.3e (bound %.0e)",
                arch, r, ids[r] ? ids[r] : "base", L, d, tol);
        w_all = fmax(w_all, d);
        free(want);
    }
    // greedy continuations of the mixed batch by decode steps
    ls_sampling_params_t params[MAX_ROWS];
    for (int i = 0; i < R; i++)
        params[i] = (ls_sampling_params_t){.top_p = 1, .repetition_penalty = 1};
    ls_sampling_batch_t sb = {.n_rows = R, .params = params};
    int32_t got[MAX_ROWS][MAX_LEN], next[MAX_ROWS];
    for (int i = 0; i < R; i++)
        seqs[i] = (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, tables[i], bpr,
                                   slots[i], true};
    if (ls_model_forward(m, kv, pool, seqs, R, err, sizeof err) != R)
        s_die("forward", err);
    int n_new = rows[0].n_new, compared = 0, total = 0, bad = 0;
    for (int t = 0; t < n_new; t++) {
        if (ls_model_sample(m, &sb, next, NULL, NULL, NULL) != 0)
            s_die("sample", "failed");
        for (int i = 0; i < R; i++) {
            got[i][t] = next[i];
            seqs[i] = (ls_model_seq_t){&got[i][t], 1, rows[i].n_prompt + t, tables[i], bpr,
                                       slots[i], true};
        }
        if (t + 1 < n_new && ls_model_forward(m, kv, pool, seqs, R, err, sizeof err) != R)
            s_die("forward", err);
    }
    for (int i = 0; i < R; i++) {
        int upto = 0;
        while (upto < rows[i].n_new && rows[i].gaps[upto] >= gap_min)
            upto++;
        int same = 0;
        while (same < upto && got[i][same] == rows[i].greedy[same])
            same++;
        if (same < upto) {
            bad++;
            printf("     %s row %d: greedy token %d is %d, reference %d (reference gap %.3e)\n",
                   arch, i, same, got[i][same], rows[i].greedy[same], rows[i].gaps[same]);
        }
        compared += upto;
        total += rows[i].n_new;
    }
    s_check(bad == 0, "%s: greedy tokens identical on all %d compared steps of %d (compared "
            "up to the first reference top-2 gap < %.0e)", arch, compared, total, gap_min);
    *worst_out = w_all;
    free(logits);
    free(rows);
    cJSON_Delete(ref);
    free(text);
    ls_kv_cache_destroy(&kv);
    ls_lora_pool_destroy(&pool);
    ls_model_destroy(&m);
    ls_backend_destroy(&be);
}

// --- 2. demo ---------------------------------------------------------------------------------

#define D_MAX_NEW 40
#define D_BLOCK 16

typedef struct {
    const char *adapter;
    int32_t prompt[256];
    int n_prompt;
    int32_t expected[D_MAX_NEW];
    int n_expected;
    int32_t out[D_MAX_NEW];
    int n_out, done;
    int32_t blocks[(256 + D_MAX_NEW) / D_BLOCK + 2];
    int n_blocks;
} req_t;

static int s_ids(cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        if (n >= cap)
            s_die("eval.json", "id list too long");
        out[n++] = (int32_t)x->valueint;
    }
    return n;
}

static int s_load_eval(req_t *reqs, int cap, cJSON **root_out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/eval.json", s_demo_dir());
    char *text = s_read(path, NULL);
    if (!text)
        s_die(path, "cannot read");
    cJSON *root = cJSON_Parse(text);
    free(text);
    int n = 0;
    cJSON *model;
    cJSON_ArrayForEach(model, cJSON_GetObjectItem(root, "results")) {
        cJSON *adapter = cJSON_GetObjectItem(model, "adapter");
        cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(model, "prompts")) {
            const char *variants[] = {"raw", "chat"};
            for (int v = 0; v < 2 && n < cap; v++) {
                cJSON *var = cJSON_GetObjectItem(p, variants[v]);
                req_t *r = &reqs[n++];
                memset(r, 0, sizeof *r);
                r->adapter = cJSON_IsString(adapter) ? adapter->valuestring : NULL;
                r->n_prompt = s_ids(cJSON_GetObjectItem(var, "prompt_ids"), r->prompt, 256);
                r->n_expected = s_ids(cJSON_GetObjectItem(var, "output_ids"), r->expected,
                                      D_MAX_NEW);
            }
        }
    }
    *root_out = root;
    return n;
}

static int s_is_stop(int32_t id) { return id == 1 || id == 3; }

// Greedy-decodes reqs in batches of per_batch; returns the mismatches. *min_gap gets the
// smallest top-1/top-2 logit gap seen on any decided token (how close a flip came).
static int s_demo_run(ls_model_t *model, ls_kv_cache_t *kv, ls_lora_pool_t *pool, req_t *reqs,
                      int n, int per_batch, double *min_gap) {
    int mismatches = 0, V = ls_model_config(model)->vocab_size;
    for (int start = 0; start < n; start += per_batch) {
        int m = n - start < per_batch ? n - start : per_batch;
        req_t *batch = reqs + start;
        int next_block = 0;
        const char *ids[1024];
        int32_t slots[1024];
        for (int i = 0; i < m; i++) {
            batch[i].n_blocks = (batch[i].n_prompt + D_MAX_NEW + D_BLOCK - 1) / D_BLOCK;
            for (int b = 0; b < batch[i].n_blocks; b++)
                batch[i].blocks[b] = next_block++;
            batch[i].n_out = batch[i].done = 0;
            ids[i] = batch[i].adapter;
        }
        if (next_block > ls_kv_cache_num_blocks(kv))
            s_die("demo", "KV cache too small");
        if (ls_lora_pool_prepare(pool, ids, m, slots, err, sizeof err) < 0)
            s_die("prepare", err);
        ls_model_seq_t *seqs = calloc((size_t)m, sizeof *seqs);
        float *logits = malloc(sizeof(float) * (size_t)m * V);
        int *row_of = malloc(sizeof(int) * (size_t)m);
        for (int step = 0;; step++) {
            int ns = 0;
            for (int i = 0; i < m; i++) {
                req_t *r = &batch[i];
                if (r->done)
                    continue;
                ls_model_seq_t *s = &seqs[ns];
                if (step == 0) {
                    s->token_ids = r->prompt;
                    s->n_tokens = r->n_prompt;
                    s->start_pos = 0;
                } else {
                    s->token_ids = &r->out[r->n_out - 1];
                    s->n_tokens = 1;
                    s->start_pos = r->n_prompt + r->n_out - 1;
                }
                s->block_table = r->blocks;
                s->n_blocks = r->n_blocks;
                s->lora_slot = slots[i];
                s->want_logits = true;
                row_of[ns++] = i;
            }
            if (!ns)
                break;
            if (ls_model_forward(model, kv, pool, seqs, ns, err, sizeof err) != ns)
                s_die("forward", err);
            if (ls_model_logits(model, logits) != 0)
                s_die("logits", "download failed");
            for (int k = 0; k < ns; k++) {
                req_t *r = &batch[row_of[k]];
                const float *l = logits + (size_t)k * V;
                int32_t best = 0;
                for (int v = 1; v < V; v++)
                    if (l[v] > l[best])
                        best = v;
                double second = -INFINITY;
                for (int v = 0; v < V; v++)
                    if (v != best && l[v] > second)
                        second = l[v];
                *min_gap = fmin(*min_gap, l[best] - second);
                r->out[r->n_out++] = best;
                if (s_is_stop(best) || r->n_out == D_MAX_NEW)
                    r->done = 1;
            }
        }
        for (int i = 0; i < m; i++) {
            req_t *r = &batch[i];
            if (r->n_out != r->n_expected ||
                memcmp(r->out, r->expected, sizeof(int32_t) * (size_t)r->n_out)) {
                mismatches++;
                printf("     mismatch: adapter %s, prompt of %d tokens: got %d tokens, "
                       "expected %d\n", r->adapter ? r->adapter : "(base)", r->n_prompt,
                       r->n_out, r->n_expected);
            }
        }
        free(seqs);
        free(logits);
        free(row_of);
    }
    return mismatches;
}

static void s_demo(int n_slots, int reuse) {
    static req_t reqs[512], order[512];
    cJSON *root;
    int n = s_load_eval(reqs, 512, &root);
    ls_backend_t *be = s_backend();
    ls_model_t *model = ls_model_load(s_demo_dir(), be, NULL, NULL, err, sizeof err);
    if (!model)
        s_die(s_demo_dir(), err);
    ls_kv_cache_t *kv = ls_kv_cache_new(model, 1200, D_BLOCK, err, sizeof err);
    if (!kv)
        s_die("kv", err);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = n_slots, .max_lora_rank = 16,
                                .max_loaded_loras = 4};
    const ls_model_config_t *cfg = ls_model_config(model);
    ls_lora_pool_t *pool = ls_lora_pool_new(be, cfg, &pc, err, sizeof err);
    if (!pool)
        s_die("pool", err);
    const char *names[] = {"adapters/reverse", "adapters/upper", "adapters/sort",
                           "adapters/digits"};
    for (int i = 0; i < 4; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/%s", s_demo_dir(), names[i]);
        ls_adapter_t *a = ls_adapter_load(dir, cfg, 16, err, sizeof err);
        if (!a || ls_lora_pool_add(pool, names[i], &a, false, NULL, 0, err, sizeof err) < 0)
            s_die(dir, err);
    }
    int per_model = n / 5, k = 0, per_batch;
    if (!reuse) {
        for (int i = 0; i < per_model; i++)
            for (int m = 0; m < 5; m++)
                order[k++] = reqs[m * per_model + i];
        per_batch = 512;
    } else {
        const int pairs[][2] = {{1, 2}, {3, 4}, {1, 3}, {2, 4}};
        for (int p = 0; p < 4; p++)
            for (int i = p * 8; i < p * 8 + 8 && i < per_model; i++) {
                order[k++] = reqs[i];
                order[k++] = reqs[pairs[p][0] * per_model + i];
                order[k++] = reqs[pairs[p][1] * per_model + i];
            }
        per_batch = 24;
    }
    double gap = INFINITY;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int bad = s_demo_run(model, kv, pool, order, k, per_batch, &gap);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    s_check(bad == 0, "demo (%s weights, %s KV), %s: %d requests (base + 4 adapters), greedy "
            "outputs equal to eval.json: %d mismatches; smallest top-2 gap met %.3e; %.2f s",
            ls_dtype_name(ls_model_kv_dtype(model)), ls_dtype_name(ls_kv_cache_dtype(kv)),
            reuse ? "2 slots for 4 adapters (slot reuse)" : "one mixed batch", k, bad, gap,
            (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&model);
    ls_backend_destroy(&be);
    cJSON_Delete(root);
}

// --- 3. dummy loader ---------------------------------------------------------------------------

static void s_dummy(void) {
    const char *cfg_json =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
        "\"hidden_size\": 256, \"intermediate_size\": 704, \"num_hidden_layers\": 3, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 1000, "
        "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000, "
        "\"torch_dtype\": \"bfloat16\", \"hidden_act\": \"silu\"}";
    ls_backend_t *be[2] = {ls_backend_cpu_new(1), s_backend()};
    float *lg[2];
    int V = 1000;
    for (int b = 0; b < 2; b++) {
        ls_model_t *m = ls_model_load_dummy(cfg_json, be[b], 7, NULL, NULL, err, sizeof err);
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
            seqs[s] = (ls_model_seq_t){toks[s], 20 + 5 * s, 0, tables[s], 4, 0, true};
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
        ls_kv_cache_destroy(&kv);
        ls_model_destroy(&m);
    }
    double d = 0, mag = 0;
    int finite = 1;
    for (int i = 0; i < 3 * V; i++) {
        finite &= isfinite(lg[0][i]) && isfinite(lg[1][i]);
        d = fmax(d, fabs((double)lg[0][i] - lg[1][i]));
        mag = fmax(mag, fabs((double)lg[0][i]));
    }
    s_check(finite && d <= s_tol(LS_DTYPE_BF16) * fmax(1.0, mag / 4),
            "dummy loader (bf16 config JSON): %s vs cpu backend, prefill + decode logits: "
            "max|Δ| %.3e over logits up to %.2f", be[1]->name, d, mag);
    free(lg[0]);
    free(lg[1]);
    ls_backend_destroy(&be[0]);
    ls_backend_destroy(&be[1]);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cpu"))
            g_cpu = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            g_device = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: test_gpu_model [--cpu] [--device N]\n");
            return 2;
        }
    }
    const char *archs[] = {"llama", "qwen2", "qwen3", "mistral"};
    double worst[4];
    for (int a = 0; a < 4; a++)
        s_parity(archs[a], &worst[a]);
    s_demo(4, 0);
    s_demo(2, 1);
    s_dummy();
    printf("=== summary (%s): %d checks, %d failed; parity max|Δ| logits: llama %.2e, "
           "qwen2 %.2e, qwen3 %.2e, mistral %.2e\n", g_cpu ? "cpu backend" : "cuda backend",
           g_checks, g_failed, worst[0], worst[1], worst[2], worst[3]);
    return g_failed ? 1 : 0;
}
