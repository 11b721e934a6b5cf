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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "backend.h"
#include "lora_pool.h"
#include "model.h"
#include "peft.h"

#define S_MAX_NEW 40
#define S_BLOCK 16

typedef struct {
    const char *adapter;  // NULL: base model
    int32_t prompt[256];
    int n_prompt;
    int32_t expected[S_MAX_NEW];
    int n_expected;
    // decoding state
    int32_t out[S_MAX_NEW];
    int n_out;
    int done;
    int32_t blocks[(256 + S_MAX_NEW) / S_BLOCK + 2];
    int n_blocks;
} req_t;

static char *s_read(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    buf[fread(buf, 1, (size_t)n, f)] = 0;
    fclose(f);
    return buf;
}

static int s_ids(cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        assert_true(n < cap);
        out[n++] = (int32_t)x->valueint;
    }
    return n;
}

// Reads every (model, variant, prompt) of eval.json into reqs; returns how many.
static int s_load_eval(req_t *reqs, int cap, cJSON **root_out) {
    char *text = s_read(LS_DEMO_DIR "/eval.json");
    if (!text)
        fail_msg("cannot read %s/eval.json", LS_DEMO_DIR);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    int n = 0;
    cJSON *model;
    cJSON_ArrayForEach(model, cJSON_GetObjectItem(root, "results")) {
        cJSON *adapter = cJSON_GetObjectItem(model, "adapter");
        cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(model, "prompts")) {
            const char *variants[] = {"raw", "chat"};
            for (int v = 0; v < 2; v++) {
                cJSON *var = cJSON_GetObjectItem(p, variants[v]);
                assert_non_null(var);
                assert_true(n < cap);
                req_t *r = &reqs[n++];
                memset(r, 0, sizeof *r);
                r->adapter = cJSON_IsString(adapter) ? adapter->valuestring : NULL;
                r->n_prompt = s_ids(cJSON_GetObjectItem(var, "prompt_ids"), r->prompt, 256);
                // Torch's greedy ids: eval.json only keeps prompts where they decode to the
                // rule's expected text (accuracy 1.0 is asserted below), ending in a stop token.
                r->n_expected = s_ids(cJSON_GetObjectItem(var, "output_ids"), r->expected, S_MAX_NEW);
                assert_true(cJSON_IsTrue(cJSON_GetObjectItem(var, "ok")));
            }
        }
        assert_true(cJSON_GetObjectItem(model, "accuracy")->valuedouble == 1.0);
    }
    *root_out = root;
    return n;
}

static int s_is_stop(int32_t id) { return id == 1 || id == 3; }  // eval.json stop_token_ids

// Greedy-decodes every request of reqs[0..n) together, batch after batch of at most
// `per_batch` requests, with the adapters in pool. Returns the number of mismatches.
static int s_run(ls_model_t *model, ls_kv_cache_t *kv, ls_lora_pool_t *pool, req_t *reqs, int n, int per_batch) {
    int mismatches = 0;
    const ls_model_config_t *cfg = ls_model_config(model);
    char err[512];
    for (int start = 0; start < n; start += per_batch) {
        int m = n - start < per_batch ? n - start : per_batch;
        req_t *batch = reqs + start;
        // Blocks: each request gets its own, enough for prompt and answer.
        int next_block = 0;
        const char *ids[1024];
        int32_t slots[1024];
        for (int i = 0; i < m; i++) {
            batch[i].n_blocks = (batch[i].n_prompt + S_MAX_NEW + S_BLOCK - 1) / S_BLOCK;
            for (int b = 0; b < batch[i].n_blocks; b++)
                batch[i].blocks[b] = next_block++;
            batch[i].n_out = 0;
            batch[i].done = 0;
            ids[i] = batch[i].adapter;
        }
        assert_true(next_block <= ls_kv_cache_num_blocks(kv));
        if (ls_lora_pool_prepare(pool, ids, m, slots, err, sizeof err) < 0)
            fail_msg("prepare: %s", err);
        ls_model_seq_t *seqs = calloc((size_t)m, sizeof *seqs);
        float *logits = malloc(sizeof(float) * (size_t)m * cfg->vocab_size);
        int *row_of = malloc(sizeof(int) * (size_t)m);
        for (int step = 0;; step++) {
            int ns = 0;
            for (int i = 0; i < m; i++) {
                req_t *r = &batch[i];
                if (r->done)
                    continue;
                ls_model_seq_t *s = &seqs[ns];
                if (step == 0) {  // the whole prompt, then one token at a time
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
            int rows = ls_model_forward(model, kv, pool, seqs, ns, err, sizeof err);
            if (rows != ns)
                fail_msg("forward: %s", err);
            assert_int_equal(ls_model_logits(model, logits), 0);
            for (int k = 0; k < ns; k++) {
                req_t *r = &batch[row_of[k]];
                const float *l = logits + (size_t)k * cfg->vocab_size;
                int32_t best = 0;
                for (int v = 1; v < cfg->vocab_size; v++)
                    if (l[v] > l[best])
                        best = v;
                r->out[r->n_out++] = best;
                if (s_is_stop(best) || r->n_out == S_MAX_NEW)
                    r->done = 1;
            }
        }
        for (int i = 0; i < m; i++) {
            req_t *r = &batch[i];
            if (r->n_out != r->n_expected || memcmp(r->out, r->expected, sizeof(int32_t) * (size_t)r->n_out)) {
                mismatches++;
                print_message("mismatch: adapter %s, prompt of %d tokens: got %d tokens, expected %d\n",
                              r->adapter ? r->adapter : "(base)", r->n_prompt, r->n_out, r->n_expected);
            }
        }
        free(seqs);
        free(logits);
        free(row_of);
    }
    return mismatches;
}

static void s_add_adapters(ls_lora_pool_t *pool, const ls_model_config_t *cfg) {
    // eval.json names each adapter by its directory under examples/demo; that is its id here.
    const char *names[] = {"adapters/reverse", "adapters/upper", "adapters/sort", "adapters/digits"};
    char err[512], dir[512];
    for (int i = 0; i < 4; i++) {
        snprintf(dir, sizeof dir, "%s/%s", LS_DEMO_DIR, names[i]);
        ls_adapter_t *a = ls_adapter_load(dir, cfg, 16, err, sizeof err);
        if (!a)
            fail_msg("%s", err);
        if (ls_lora_pool_add(pool, names[i], &a, false, NULL, 0, err, sizeof err) < 0)
            fail_msg("%s", err);
    }
}

static void s_demo(int slots, int per_batch) {
    static req_t reqs[512];
    cJSON *root;
    int n = s_load_eval(reqs, 512, &root);
    assert_true(n >= 5 * 16 * 2);
    char err[512];
    ls_backend_t *be = ls_backend_cpu_new(1);
    ls_model_t *model = ls_model_load(LS_DEMO_DIR, be, NULL, NULL, err, sizeof err);
    if (!model)
        fail_msg("%s", err);
    ls_kv_cache_t *kv = ls_kv_cache_new(model, 1200, S_BLOCK, err, sizeof err);
    assert_non_null(kv);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = slots, .max_lora_rank = 16, .max_loaded_loras = 4};
    ls_lora_pool_t *pool = ls_lora_pool_new(be, ls_model_config(model), &pc, err, sizeof err);
    assert_non_null(pool);
    s_add_adapters(pool, ls_model_config(model));
    // Interleave the requests so adapters are mixed within every batch, not grouped.
    static req_t mixed[512];
    int per_model = n / 5, k = 0;
    for (int i = 0; i < per_model; i++)
        for (int m = 0; m < 5; m++)
            mixed[k++] = reqs[m * per_model + i];
    assert_int_equal(s_run(model, kv, pool, mixed, k, per_batch), 0);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&model);
    ls_backend_destroy(&be);
    cJSON_Delete(root);
}

// One batch: base + all four adapters in four slots, 160 requests decoded together.
static void test_demo_one_batch(void **unused) { s_demo(4, 512); }

// Two slots for four adapters: batches of five requests (base + four adapters would need four
// slots), so every batch of requests with their slots is prepared anew and slots are reused.
static void test_demo_slot_reuse(void **unused) {
    static req_t reqs[512];
    cJSON *root;
    int n = s_load_eval(reqs, 512, &root);
    char err[512];
    ls_backend_t *be = ls_backend_cpu_new(1);
    ls_model_t *model = ls_model_load(LS_DEMO_DIR, be, NULL, NULL, err, sizeof err);
    assert_non_null(model);
    ls_kv_cache_t *kv = ls_kv_cache_new(model, 1200, S_BLOCK, err, sizeof err);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 16, .max_loaded_loras = 4};
    ls_lora_pool_t *pool = ls_lora_pool_new(be, ls_model_config(model), &pc, err, sizeof err);
    assert_non_null(pool);
    s_add_adapters(pool, ls_model_config(model));
    // Pairs of adapters in turn (with base rows), so each batch needs slots others held.
    int per_model = n / 5, k = 0;
    static req_t order[512];
    const int pairs[][2] = {{1, 2}, {3, 4}, {1, 3}, {2, 4}};
    for (int p = 0; p < 4; p++)
        for (int i = p * 8; i < p * 8 + 8 && i < per_model; i++) {
            order[k++] = reqs[i];  // base
            order[k++] = reqs[pairs[p][0] * per_model + i];
            order[k++] = reqs[pairs[p][1] * per_model + i];
        }
    assert_int_equal(s_run(model, kv, pool, order, k, 24), 0);
    ls_lora_pool_stats_t st = ls_lora_pool_stats(pool);
    assert_true(st.slot_evictions > 0);  // the point of the test: slots changed hands
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&model);
    ls_backend_destroy(&be);
    cJSON_Delete(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_demo_one_batch),
        cmocka_unit_test(test_demo_slot_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
