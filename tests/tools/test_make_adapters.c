// loraserve-make-adapters, run as a user runs it (the built binary), checked with the engine.
//
//   - layout: adapters for the demo model and two fixture models (Qwen3: head_dim other than
//     hidden/heads; Llama: GQA, full and short target names mixed) load with ls_adapter_load
//     and ls_adapter_config_read against the model's config, with each adapter's rank from the
//     rank list, its targets, alpha and scaling (rslora too), the dtype asked for (the model's
//     by default) and PEFT's tensor names and shapes; A's spread is 1/sqrt(in); B is nonzero;
//     adapters.jsonl lists exactly what was written.
//   - determinism: the same seed gives byte-identical files with 1 and 4 jobs and when written
//     alone with --start; another seed gives other bytes; bf16 and f16 files hold exactly the
//     f32 file's values rounded to nearest even (the engine's conversions).
//   - effect: two generated adapters (default flags) change the demo model's logits and its
//     greedy answers, and differ from each other.
//   - bad input: exit status 2 or 1 with a sentence naming the problem; an interrupted run's
//     leftovers are cleaned and --overwrite replaces.
//   - messages: the progress line and summary; --help lists every flag with its default.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model.h"
#include "peft.h"
#include "safetensors.h"
#include "slot_plan.h"
#include "test_util.h"

#define ALL_TARGETS ((1u << LS_TARGET_COUNT) - 1)
#define QKVO_TARGETS 0xfu

// Runs the tool with the NULL-terminated arguments; its stderr and stdout into err. Returns its exit status
// (-1 when it did not exit normally).
static int s_run(char *err, size_t cap, const char *arg, ...)
{
    const char *argv[64] = {LS_MAKE_ADAPTERS};
    int argc = 1;
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a && argc < 63; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execv(LS_MAKE_ADAPTERS, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t got;
    while ((got = read(fds[0], err + n, cap - 1 - n)) > 0)
        n += (size_t)got;
    err[n] = 0;
    close(fds[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Like s_run, failing the test unless the tool succeeds.
#define RUN_OK(...)                                                                                          \
    do {                                                                                                     \
        char err_[8192];                                                                                     \
        int rc_ = s_run(err_, sizeof err_, __VA_ARGS__, (const char *)NULL);                                 \
        if (rc_ != 0)                                                                                        \
            fail_msg("loraserve-make-adapters exited %d: %s", rc_, err_);                                    \
    } while (0)

static void s_config(const char *model, ls_model_config_t *cfg)
{
    char err[1024];
    if (ls_model_config_load(model, cfg, err, sizeof err) < 0)
        fail_msg("%s", err);
}

static size_t s_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (size_t)st.st_size : 0;
}

static bool s_exists(const char *dir, const char *name)
{
    char path[PATH_MAX + 64];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

// What an adapter must be.
typedef struct {
    int rank;
    unsigned mask;
    double alpha;
    bool rslora;
    ls_dtype_t dtype;
} want_t;

// Checks adapter dir against want, through the engine's loaders and the file itself.
static void s_check_adapter(const char *dir, const ls_model_config_t *cfg, const want_t *w)
{
    char err[1024], path[PATH_MAX];
    int L = cfg->num_hidden_layers, n_targets = __builtin_popcount(w->mask);
    ls_adapter_info_t info;
    if (ls_adapter_config_read(dir, cfg, 1024, &info, err, sizeof err) < 0)
        fail_msg("%s", err);
    assert_int_equal(info.max_rank, w->rank);
    assert_int_equal(info.target_mask, w->mask);
    assert_int_equal(info.num_modules, L * n_targets);

    ls_adapter_t *a = ls_adapter_load(dir, cfg, 1024, err, sizeof err);
    if (!a)
        fail_msg("%s", err);
    double scaling = w->alpha / (w->rslora ? sqrt(w->rank) : w->rank);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LS_TARGET_COUNT; t++) {
            const ls_lora_weights_t *lw = ls_adapter_layer_target(a, l, (ls_target_t)t);
            if (!(w->mask & (1u << t))) {
                assert_int_equal(lw->rank, 0);
                continue;
            }
            assert_int_equal(lw->rank, w->rank);
            assert_true(fabs(lw->scaling - scaling) <= 1e-6 * scaling);
        }
    ls_adapter_destroy(&a);

    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    ls_st_t *st = ls_st_open(path, err, sizeof err);
    if (!st)
        fail_msg("%s", err);
    assert_int_equal(ls_st_count(st), (size_t)(L * n_targets * 2));
    for (int l = 0; l < L; l++)
        for (int t = 0; t < LS_TARGET_COUNT; t++) {
            if (!(w->mask & (1u << t)))
                continue;
            int in, out;
            ls_model_config_target_dims(cfg, (ls_target_t)t, &in, &out);
            for (int is_b = 0; is_b < 2; is_b++) {
                char name[128];
                snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         ls_target_parent((ls_target_t)t), ls_target_name((ls_target_t)t), is_b ? 'B' : 'A');
                const ls_st_tensor_t *ts = ls_st_find(st, name);
                if (!ts)
                    fail_msg("%s: no tensor %s", path, name);
                assert_int_equal(ts->dtype, w->dtype);
                int64_t shape[2] = {is_b ? out : w->rank, is_b ? w->rank : in};
                if (ls_st_tensor_check_shape(ts, 2, shape, err, sizeof err) < 0)
                    fail_msg("%s", err);
                float *v = malloc(ts->numel * sizeof *v);
                assert_int_equal(ls_st_tensor_to_f32(ts, v), 0); // every value finite
                double sum2 = 0, amax = 0;
                for (size_t i = 0; i < ts->numel; i++) {
                    sum2 += (double)v[i] * v[i];
                    amax = fmax(amax, fabs(v[i]));
                }
                free(v);
                double rms = sqrt(sum2 / (double)ts->numel);
                assert_true(amax > 0); // B too: PEFT's zero B would be a no-op
                if (!is_b) {
                    // uniform with std 1/sqrt(in): bounded by sqrt(3/in) (plus rounding)
                    assert_true(amax <= sqrt(3.0 / in) * 1.01);
                    if (ts->numel >= 1000)
                        assert_true(fabs(rms * sqrt(in) - 1) < 0.1);
                }
            }
        }
    ls_st_destroy(&st);
}

// Checks OUT/adapters.jsonl: n lines, adapter k named prefix-(start+k) with wants[k].
static void s_check_jsonl(const char *out, const char *prefix, int start, int n, const want_t *wants)
{
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof path, "%s/adapters.jsonl", out);
    assert_non_null(realpath(out, real));
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    int k = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), k++) {
        assert_true(k < n);
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        char name[64], dir[PATH_MAX + 64], file[PATH_MAX + 128];
        snprintf(name, sizeof name, "%s-%d", prefix, start + k);
        snprintf(dir, sizeof dir, "%s/%s", real, name);
        assert_string_equal(cJSON_GetObjectItem(j, "name")->valuestring, name);
        assert_string_equal(cJSON_GetObjectItem(j, "path")->valuestring, dir);
        assert_int_equal(cJSON_GetObjectItem(j, "rank")->valueint, wants[k].rank);
        assert_true(cJSON_GetObjectItem(j, "lora_alpha")->valuedouble == wants[k].alpha);
        const cJSON *targets = cJSON_GetObjectItem(j, "targets");
        assert_int_equal(cJSON_GetArraySize(targets), __builtin_popcount(wants[k].mask));
        const cJSON *tn;
        cJSON_ArrayForEach(tn, targets)
        {
            int t = ls_target_from_name(tn->valuestring);
            assert_true(t >= 0 && (wants[k].mask & (1u << t)));
        }
        snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
        size_t bytes = s_file_size(file);
        snprintf(file, sizeof file, "%s/adapter_config.json", dir);
        bytes += s_file_size(file);
        assert_true(bytes > 0);
        assert_true(cJSON_GetObjectItem(j, "bytes")->valuedouble == (double)bytes);
        cJSON_Delete(j);
    }
    assert_int_equal(k, n);
    free(text);
}

// Writes n adapters for model with the extra flags and checks each one and adapters.jsonl.
// want gives mask, alpha (0: 2 × rank), rslora and dtype; ranks are the cycle of ranks.
static void s_layout_case(const char *model, const char *out, int n, const char *ranks_text, const int *ranks,
                          int nranks, const want_t *want, const char *targets, const char *extra1,
                          const char *extra2)
{
    ls_model_config_t cfg;
    s_config(model, &cfg);
    char num[16];
    snprintf(num, sizeof num, "%d", n);
    RUN_OK("--model-path", model, "--output", out, "--num-adapters", num, "--ranks", ranks_text, "--targets",
           targets, "--quiet", extra1, extra2);
    want_t wants[16];
    for (int k = 0; k < n; k++) {
        char dir[PATH_MAX + 16];  // out (< PATH_MAX) then "/lora-<k>"
        wants[k] = *want;
        wants[k].rank = ranks[k % nranks];
        if (want->alpha == 0)
            wants[k].alpha = 2.0 * wants[k].rank;
        snprintf(dir, sizeof dir, "%s/lora-%d", out, k);
        s_check_adapter(dir, &cfg, &wants[k]);
    }
    s_check_jsonl(out, "lora", 0, n, wants);
    char extra[32];
    snprintf(extra, sizeof extra, "lora-%d", n);
    assert_false(s_exists(out, extra));
}

static void test_layout_demo(void **unused)
{
    char tmp[256], out[PATH_MAX];
    assert_int_equal(tu_tmpdir(tmp, sizeof tmp, "mkad"), 0);
    // defaults: q,k,v,o, alpha 2r, the model's dtype (bf16)
    snprintf(out, sizeof out, "%s/qkvo", tmp);
    s_layout_case(LS_DEMO_DIR, out, 6, "4,8,16", (const int[]){4, 8, 16}, 3,
                  &(want_t){.mask = QKVO_TARGETS, .dtype = LS_DTYPE_BF16}, "q,k,v,o", NULL, NULL);
    // all seven, rslora with one alpha
    snprintf(out, sizeof out, "%s/all", tmp);
    s_layout_case(LS_DEMO_DIR, out, 4, "16,8", (const int[]){16, 8}, 2,
                  &(want_t){.mask = ALL_TARGETS, .alpha = 8, .rslora = true, .dtype = LS_DTYPE_BF16}, "all",
                  "--use-rslora", "--lora-alpha=8");
    // --alpha-ratio, f16, a short and a full name
    snprintf(out, sizeof out, "%s/ratio", tmp);
    s_layout_case(
        LS_DEMO_DIR, out, 2, "4", (const int[]){4}, 1,
        &(want_t){.mask = 1u << LS_TARGET_DOWN | 1u << LS_TARGET_V, .alpha = 2, .dtype = LS_DTYPE_F16},
        "down,v_proj", "--alpha-ratio=0.5", "--dtype=f16");
    tu_rmrf(tmp);
}

static void test_layout_fixtures(void **unused)
{
    char tmp[256], out[PATH_MAX];
    assert_int_equal(tu_tmpdir(tmp, sizeof tmp, "mkad"), 0);
    // Qwen3: head_dim 32 with hidden 64 and 4 heads (q_proj is 64 -> 128), bf16, sharded
    snprintf(out, sizeof out, "%s/qwen3", tmp);
    s_layout_case(LS_FIXTURES_DIR "/qwen3/model", out, 5, "2,4,8", (const int[]){2, 4, 8}, 3,
                  &(want_t){.mask = ALL_TARGETS, .dtype = LS_DTYPE_BF16}, "all", "--jobs=3", NULL);
    // Llama: GQA (k/v 64 -> 32), full and short names mixed, 3 layers, f32 asked for
    snprintf(out, sizeof out, "%s/llama", tmp);
    s_layout_case(LS_FIXTURES_DIR "/llama/model", out, 3, "8,4", (const int[]){8, 4}, 2,
                  &(want_t){.mask = 1u << LS_TARGET_Q | 1u << LS_TARGET_V | 1u << LS_TARGET_GATE,
                            .dtype = LS_DTYPE_F32},
                  "q_proj,v_proj,gate", "--dtype=f32", NULL);
    tu_rmrf(tmp);
}

static bool s_same_file(const char *a, const char *b)
{
    size_t la, lb;
    char *x = tu_read_file(a, &la), *y = tu_read_file(b, &lb);
    bool same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x);
    free(y);
    return same;
}

static bool s_same_adapter_file(const char *d1, const char *d2, const char *name, const char *file)
{
    char a[PATH_MAX + 64], b[PATH_MAX + 64];
    snprintf(a, sizeof a, "%s/%s/%s", d1, name, file);
    snprintf(b, sizeof b, "%s/%s/%s", d2, name, file);
    return s_same_file(a, b);
}

// Every value of the bf16 and f16 adapters in want_dir is the f32 adapter's (same seed and
// flags) rounded to nearest even: the dtype changes the rounding, never the stream.
static void s_check_rounding(const char *f32_dir, const char *want_dir, ls_dtype_t dtype)
{
    char err[1024], path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", f32_dir);
    ls_st_t *ref = ls_st_open(path, err, sizeof err);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", want_dir);
    ls_st_t *got = ls_st_open(path, err, sizeof err);
    if (!ref || !got)
        fail_msg("%s", err);
    assert_int_equal(ls_st_count(ref), ls_st_count(got));
    size_t checked = 0;
    for (size_t i = 0; i < ls_st_count(ref); i++) {
        const ls_st_tensor_t *r = ls_st_at(ref, i), *g = ls_st_find(got, r->name);
        assert_non_null(g);
        assert_int_equal(r->dtype, LS_DTYPE_F32);
        assert_int_equal(g->dtype, dtype);
        assert_int_equal(g->numel, r->numel);
        for (size_t k = 0; k < r->numel; k++, checked++) {
            float f;
            uint16_t h;
            memcpy(&f, (const char *)r->data + 4 * k, 4);
            memcpy(&h, (const char *)g->data + 2 * k, 2);
            uint16_t want = dtype == LS_DTYPE_BF16 ? ls_bf16_from_f32(f) : ls_f16_from_f32(f);
            if (h != want)
                fail_msg("%s[%zu]: %#06x, expected %#06x (from %g)", r->name, k, h, want, f);
        }
    }
    assert_true(checked > 100000);
    ls_st_destroy(&ref);
    ls_st_destroy(&got);
}

static void test_deterministic(void **unused)
{
    char tmp[256], d[6][512];
    assert_int_equal(tu_tmpdir(tmp, sizeof tmp, "mkad"), 0);
    for (int i = 0; i < 6; i++)
        snprintf(d[i], sizeof d[i], "%s/%d", tmp, i);
    const char *common[] = {"--model-path", LS_DEMO_DIR, "--ranks", "4,8", "--targets", "all", "--quiet"};
#define COMMON common[0], common[1], common[2], common[3], common[4], common[5], common[6]
    RUN_OK(COMMON, "--output", d[0], "--num-adapters", "4", "--seed", "7", "--jobs", "1");
    RUN_OK(COMMON, "--output", d[1], "--num-adapters", "4", "--seed", "7", "--jobs", "4");
    RUN_OK(COMMON, "--output", d[2], "--num-adapters", "4", "--seed", "8", "--jobs", "4");
    RUN_OK(COMMON, "--output", d[3], "--num-adapters", "2", "--seed", "7", "--start", "2");
    RUN_OK(COMMON, "--output", d[4], "--num-adapters", "2", "--seed", "7", "--dtype", "f32");
    RUN_OK(COMMON, "--output", d[5], "--num-adapters", "2", "--seed", "7", "--dtype", "f16");
#undef COMMON
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "lora-%d", k);
        assert_true(s_same_adapter_file(d[0], d[1], name, "adapter_model.safetensors"));
        assert_true(s_same_adapter_file(d[0], d[1], name, "adapter_config.json"));
        // another seed: other values, the same config
        assert_false(s_same_adapter_file(d[0], d[2], name, "adapter_model.safetensors"));
        assert_true(s_same_adapter_file(d[0], d[2], name, "adapter_config.json"));
        // adapter i is the same written alone (--start) as among others
        if (k >= 2)
            assert_true(s_same_adapter_file(d[0], d[3], name, "adapter_model.safetensors"));
        else
            assert_false(s_exists(d[3], name));
    }
    // adapters of one run differ from each other, even at the same rank
    char a[PATH_MAX], b[PATH_MAX];
    snprintf(a, sizeof a, "%s/lora-0/adapter_model.safetensors", d[0]);
    snprintf(b, sizeof b, "%s/lora-2/adapter_model.safetensors", d[0]);
    assert_false(s_same_file(a, b));
    // the demo's default dtype is bf16; f16 asked for
    snprintf(a, sizeof a, "%s/lora-1", d[4]);
    snprintf(b, sizeof b, "%s/lora-1", d[0]);
    s_check_rounding(a, b, LS_DTYPE_BF16);
    snprintf(b, sizeof b, "%s/lora-1", d[5]);
    s_check_rounding(a, b, LS_DTYPE_F16);
    tu_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// effect on the demo model

#define E_PROMPTS 16
#define E_NEW 12
#define E_BLOCK 16
#define E_ROWS 3 // base, lora-0, lora-1

// Bounds for adapters made with the default --b-scale (each target's LoRA output about half
// its input's rms, a quarter to a third of the demo's base outputs): on every prompt the
// last-position logits move by at least E_MIN_LOGIT_DELTA (max |Δ|; the demo's answers win
// by top-2 gaps of 1 to 13), and the greedy answers differ on at least half the prompts
// (measured: 1.5 to 2.2, and 12 to 14 of 16).
#define E_MIN_LOGIT_DELTA 1.0
#define E_MIN_DIFFERENT_ANSWERS (E_PROMPTS / 2)

typedef struct {
    int32_t prompt[256];
    int n_prompt;
    int32_t out[E_NEW];
} e_row_t;

// Greedy-decodes the rows (one per slot) together for E_NEW tokens; last_logits gets the
// prompt's last-position logits, (E_ROWS, V).
static void s_greedy(ls_model_t *m, ls_kv_cache_t *kv, ls_lora_pool_t *pool, const int32_t *slots,
                     e_row_t *rows, float *last_logits)
{
    int V = ls_model_config(m)->vocab_size;
    char err[1024];
    int32_t blocks[E_ROWS][(256 + E_NEW) / E_BLOCK + 1];
    int nb = (rows[0].n_prompt + E_NEW + E_BLOCK - 1) / E_BLOCK;
    for (int i = 0; i < E_ROWS; i++)
        for (int b = 0; b < nb; b++)
            blocks[i][b] = i * nb + b;
    float *logits = malloc(sizeof(float) * E_ROWS * (size_t)V);
    ls_model_seq_t seqs[E_ROWS];
    for (int t = 0; t < E_NEW; t++) {
        for (int i = 0; i < E_ROWS; i++)
            seqs[i] =
                t == 0 ? (ls_model_seq_t){rows[i].prompt, rows[i].n_prompt, 0, blocks[i], nb, slots[i], true, NULL, 0}
                       : (ls_model_seq_t){
                             &rows[i].out[t - 1], 1, rows[i].n_prompt + t - 1, blocks[i], nb, slots[i], true, NULL, 0};
        if (ls_model_forward(m, kv, pool, seqs, E_ROWS, err, sizeof err) != E_ROWS)
            fail_msg("%s", err);
        assert_int_equal(ls_model_logits(m, logits), 0);
        if (t == 0)
            memcpy(last_logits, logits, sizeof(float) * E_ROWS * (size_t)V);
        for (int i = 0; i < E_ROWS; i++) {
            const float *l = logits + (size_t)i * V;
            int32_t best = 0;
            for (int v = 1; v < V; v++)
                if (l[v] > l[best])
                    best = v;
            rows[i].out[t] = best;
        }
    }
    free(logits);
}

static double s_max_diff(const float *a, const float *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++)
        d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

// Two adapters made with the defaults (q,k,v,o; ranks 8 and 16; alpha 2r; bf16) against the
// base model on the demo's held-out prompts: the logits move, and the greedy answers change.
static void test_changes_demo_outputs(void **unused)
{
    char tmp[256], err[1024], path[PATH_MAX];
    assert_int_equal(tu_tmpdir(tmp, sizeof tmp, "mkad"), 0);
    RUN_OK("--model-path", LS_DEMO_DIR, "--output", tmp, "--num-adapters", "2", "--quiet");

    ls_backend_t *be = ls_backend_cpu_new(1);
    ls_model_t *m = ls_model_load(LS_DEMO_DIR, be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    const ls_model_config_t *cfg = ls_model_config(m);
    int V = cfg->vocab_size;
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 16};
    int ad_pages = slot_plan_pages(m, E_BLOCK, &pc, err, sizeof err);
    ls_kv_cache_t *kv = ad_pages < 0 ? NULL
                                     : ls_kv_cache_new(m, E_ROWS * ((256 + E_NEW) / E_BLOCK + 1) + ad_pages, E_BLOCK,
                                                       err, sizeof err);
    ls_page_arena_t arena = kv ? ls_kv_cache_arena(kv) : (ls_page_arena_t){0};
    ls_lora_pool_t *pool = kv ? ls_lora_pool_new(be, cfg, &pc, &arena, err, sizeof err) : NULL;
    if (!kv || !pool)
        fail_msg("%s", err);
    const char *names[] = {"lora-0", "lora-1"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", tmp, names[i]);
        ls_adapter_t *a = ls_adapter_load(path, cfg, 16, err, sizeof err);
        if (!a || ls_lora_pool_add_adapter(pool, names[i], &a, err, sizeof err) < 0)
            fail_msg("%s", err);
        ls_adapter_destroy(&a);
    }
    const char *ids[E_ROWS] = {NULL, "lora-0", "lora-1"};
    int32_t slots[E_ROWS];
    if (slot_plan_map_once(pool, ids, E_ROWS, slots, err, sizeof err) < 0)
        fail_msg("%s", err);

    snprintf(path, sizeof path, "%s/eval.json", LS_DEMO_DIR);
    char *text = tu_read_file(path, NULL);
    cJSON *eval = text ? cJSON_Parse(text) : NULL;
    free(text);
    assert_non_null(eval);
    const cJSON *prompts =
        cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(eval, "results"), "base"), "prompts");
    assert_int_equal(cJSON_GetArraySize(prompts), E_PROMPTS);
    float *last = malloc(sizeof(float) * E_ROWS * (size_t)V);
    double min_delta[3] = {INFINITY, INFINITY, INFINITY}; // base-0, base-1, 0-1
    int differ[3] = {0};
    const cJSON *p;
    cJSON_ArrayForEach(p, prompts)
    {
        e_row_t rows[E_ROWS];
        for (int i = 0; i < E_ROWS; i++)
            rows[i].n_prompt = tu_json_ids(cJSON_GetObjectItem(cJSON_GetObjectItem(p, "raw"), "prompt_ids"),
                                           rows[i].prompt, 256);
        s_greedy(m, kv, pool, slots, rows, last);
        const int pairs[3][2] = {{0, 1}, {0, 2}, {1, 2}};
        for (int k = 0; k < 3; k++) {
            const int a = pairs[k][0], b = pairs[k][1];
            min_delta[k] = fmin(min_delta[k], s_max_diff(last + (size_t)a * V, last + (size_t)b * V, V));
            differ[k] += memcmp(rows[a].out, rows[b].out, sizeof rows[a].out) != 0;
        }
    }
    print_message(
        "smallest max |Δlogit| base/lora-0 %.2f, base/lora-1 %.2f, lora-0/lora-1 %.2f; greedy answers "
        "differ on %d, %d, %d of %d prompts\n",
        min_delta[0], min_delta[1], min_delta[2], differ[0], differ[1], differ[2], E_PROMPTS);
    for (int k = 0; k < 3; k++) {
        assert_true(min_delta[k] >= E_MIN_LOGIT_DELTA);
        assert_true(differ[k] >= E_MIN_DIFFERENT_ANSWERS);
    }
    free(last);
    cJSON_Delete(eval);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&m);
    ls_backend_destroy(&be);
    tu_rmrf(tmp);
}

// ---------------------------------------------------------------------------------------------
// bad input

// Runs the tool expecting exit status rc and a message containing needle.
#define RUN_FAILS(rc, needle, ...)                                                                           \
    do {                                                                                                     \
        char err_[8192];                                                                                     \
        int got_ = s_run(err_, sizeof err_, __VA_ARGS__, (const char *)NULL);                                \
        if (got_ != (rc))                                                                                    \
            fail_msg("exit status %d, expected %d: %s", got_, (rc), err_);                                   \
        assert_contains(err_, needle);                                                                       \
        assert_contains(err_, "loraserve-make-adapters: ");                                                  \
    } while (0)

static void test_bad_input(void **unused)
{
    char tmp[256], out[PATH_MAX], model[PATH_MAX], file[PATH_MAX + 16];
    assert_int_equal(tu_tmpdir(tmp, sizeof tmp, "mkad"), 0);
    snprintf(out, sizeof out, "%s/out", tmp);
    const char *M = "--model-path", *D = LS_DEMO_DIR, *O = "--output", *N = "--num-adapters";

    // usage: exit 2
    RUN_FAILS(2, "unknown target \"foo\"", M, D, O, out, N, "2", "--targets", "q,foo");
    RUN_FAILS(2, "--ranks", M, D, O, out, N, "2", "--ranks", "8,0");
    RUN_FAILS(2, "rank 1000", M, D, O, out, N, "2", "--ranks", "1000"); // above k_proj's 128
    RUN_FAILS(2, "--num-adapters", M, D, O, out, N, "0");
    RUN_FAILS(2, "--model-path and --output are required", O, out, N, "2");
    RUN_FAILS(2, "--dtype", M, D, O, out, N, "2", "--dtype", "int8");
    RUN_FAILS(2, "not both", M, D, O, out, N, "2", "--lora-alpha", "8", "--alpha-ratio", "1");
    RUN_FAILS(2, "--b-scale", M, D, O, out, N, "2", "--b-scale", "0");
    RUN_FAILS(2, "B's values", M, D, O, out, N, "2", "--b-scale", "1e40");  // would not stay finite
    RUN_FAILS(2, "--num-adapters is required", M, D, O, out);
    RUN_FAILS(2, "unknown flag --frobnicate", M, D, O, out, N, "2", "--frobnicate");
    assert_false(s_exists(tmp, "out")); // nothing written before the flags are right

    // the model: exit 1
    snprintf(model, sizeof model, "%s/no-model", tmp);
    RUN_FAILS(1, "config.json", M, model, O, out, N, "2");
    RUN_FAILS(1, "no-model", M, model, O, out, N, "2");
    snprintf(model, sizeof model, "%s/bad-model", tmp);
    assert_int_equal(mkdir(model, 0755), 0);
    snprintf(file, sizeof file, "%s/config.json", model);
    FILE *fp = fopen(file, "w");
    fputs("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"wide\"}", fp);
    fclose(fp);
    RUN_FAILS(1, "config.json", M, model, O, out, N, "2");

    // the output: a path under a regular file cannot be a directory
    snprintf(file, sizeof file, "%s/config.json/out", model);
    RUN_FAILS(1, "output directory", M, D, O, file, N, "2");

    // an existing adapter is not replaced without --overwrite; with it, it is
    RUN_OK(M, D, O, out, N, "2", "--quiet");
    RUN_FAILS(1, "lora-0 already exists", M, D, O, out, N, "3", "--quiet");
    RUN_FAILS(1, "--overwrite", M, D, O, out, N, "3", "--quiet");
    assert_false(s_exists(out, "lora-2")); // refused before writing anything
    // a crashed run's leftover is never an adapter, and is cleaned up
    snprintf(file, sizeof file, "%s/.lora-1.tmp", out);
    assert_int_equal(mkdir(file, 0755), 0);
    RUN_OK(M, D, O, out, N, "3", "--overwrite", "--seed", "5", "--quiet");
    assert_true(s_exists(out, "lora-2"));
    assert_false(s_exists(out, ".lora-1.tmp"));
    assert_false(s_exists(out, ".lora-0.old"));
    assert_false(s_exists(out, ".adapters.jsonl.tmp"));
    ls_model_config_t cfg;
    s_config(D, &cfg);
    snprintf(file, sizeof file, "%s/lora-1", out);
    s_check_adapter(file, &cfg,
                    &(want_t){.rank = 16, .mask = QKVO_TARGETS, .alpha = 32, .dtype = LS_DTYPE_BF16});
    tu_rmrf(tmp);
}

// The progress line and the summary on stderr; --help lists every flag with its default.
static void test_messages(void **unused)
{
    char tmp[256], err[8192];
    assert_int_equal(tu_tmpdir(tmp, sizeof tmp, "mkad"), 0);
    assert_int_equal(s_run(err, sizeof err, "--model-path", LS_DEMO_DIR, "--output", tmp, "--num-adapters",
                           "3", (const char *)NULL),
                     0);
    assert_contains(err, "\rloraserve-make-adapters: 3/3 adapters");
    assert_contains(err, "wrote 3 adapters");
    assert_contains(err, "MB/s");
    assert_int_equal(s_run(err, sizeof err, "--help", (const char *)NULL), 0);
    const char *listed[] = {"--model-path",
                            "--output",
                            "--num-adapters",
                            "--ranks TEXT",
                            "(default: 8,16,32,64)",
                            "(default: q,k,v,o)",
                            "--seed N",
                            "--lora-alpha",
                            "--alpha-ratio",
                            "2×r",
                            "--use-rslora",
                            "--dtype",
                            "torch_dtype",
                            "(default: lora)",
                            "--start",
                            "--jobs",
                            "--overwrite",
                            "--b-scale",
                            "--quiet"};
    for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++)
        assert_contains(err, listed[i]);
    tu_rmrf(tmp);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_demo),   cmocka_unit_test(test_layout_fixtures),
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_changes_demo_outputs),
        cmocka_unit_test(test_bad_input),     cmocka_unit_test(test_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
