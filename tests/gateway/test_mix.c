// Mixes of adapters over HTTP (docs/lora-mixing.md): the real graph on the demo model on the CPU.
//   matches_engine — /generate with lora_path a mix of reverse 0.7 and upper 0.3 (greedy,
//                    ignore_eos) returns the ids the engine itself decodes for that mix (loaded
//                    here, beside the graph); /v1/completions with the mix as `model` returns
//                    the same text and echoes the mix as its model
//   neighbours     — one /generate list of base, reverse and the mix: the base and reverse
//                    rows give eval.json's answers, the mix row the mix's ids (the mix changes
//                    nothing beside it in the batch)
//   refused        — malformed mixes are 400s naming lora_path / model, an unknown adapter in a
//                    mix is the unknown-adapter answer naming it; the server keeps serving
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model.h"
#include "peft.h"
#include "test_util.h"

#define N_NEW 12
#define MIX "{\"adapters\":[{\"name\":\"reverse\",\"weight\":0.7},{\"name\":\"upper\",\"weight\":0.3}]}"

static tu_http_graph_t s_g;
static int32_t s_prompt[64], s_mix_ids[N_NEW];
static int s_n_prompt;
static char s_base_text[64], s_reverse_text[64];

// POSTs body to path: the HTTP status, and the answer's body parsed into *out (NULL when not JSON).
static int s_post(const char *path, const char *body, json_t **out) {
    int status;
    char *text = tu_http_post_body(&s_g, path, body, &status);
    assert_non_null(text);
    *out = json_loads(text, JSON_DECODE_ANY, NULL);
    free(text);
    return status;
}

// The prompt ids as a JSON list.
static void s_prompt_json(char *out, size_t cap) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < s_n_prompt; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", s_prompt[i]);
    snprintf(out + n, cap - n, "]");
}

// The engine's own greedy decode of the mix on the demo model (CPU backend), N_NEW tokens.
static void s_engine_mix(void) {
    char err[1024], path[1024];
    ls_backend_t *be = ls_backend_cpu_new(1);
    ls_model_t *m = ls_model_load(LS_DEMO_DIR, be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    const ls_model_config_t *cfg = ls_model_config(m);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 64};
    // the request's 8 blocks and the adapters' pages in one pool, as the worker's
    int per = ls_lora_pool_max_pages(cfg, &pc, ls_kv_cache_block_bytes(m, 16, LS_DTYPE_F32), LS_DTYPE_F32, err,
                                     sizeof err);
    ls_kv_cache_t *kv = per < 0 ? NULL : ls_kv_cache_new(m, 8 + 2 * per, 16, err, sizeof err);
    ls_page_arena_t arena = kv ? ls_kv_cache_arena(kv) : (ls_page_arena_t){0};
    ls_lora_pool_t *pool = kv ? ls_lora_pool_new(be, cfg, &pc, &arena, err, sizeof err) : NULL;
    if (!pool)
        fail_msg("%s", err);
    const char *names[2] = {"reverse", "upper"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/adapters/%s", LS_DEMO_DIR, names[i]);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, pc.max_lora_rank, err, sizeof err);
        int rank, need;
        size_t bytes;
        if (!ad || ls_lora_pool_add_adapter(pool, names[i], &ad, err, sizeof err) != 0 ||
            ls_lora_pool_image_info(pool, names[i], &rank, &bytes, &need) != 0)
            fail_msg("%s", err);
        int32_t *pages = malloc(sizeof *pages * (size_t)need);
        for (int p = 0; p < need; p++)
            pages[p] = 8 + i * per + p;  // adapter i's pages after the request's blocks
        if (ls_lora_pool_assign(pool, names[i], 1 + i, pages, need, err, sizeof err) != 0)
            fail_msg("%s", err);
        free(pages);
    }
    if (ls_lora_pool_wait(pool) != 0)
        fail_msg("%s", err);
    int32_t table[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const ls_model_lora_part_t mix[2] = {{1, 0.7f}, {2, 0.3f}};
    int V = cfg->vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    for (int t = 0; t < N_NEW; t++) {
        ls_model_seq_t q = {t ? &s_mix_ids[t - 1] : s_prompt, t ? 1 : s_n_prompt, t ? s_n_prompt + t - 1 : 0, table,
                            8, 0, true, mix, 2};
        if (ls_model_forward(m, kv, pool, &q, 1, err, sizeof err) != 1 || ls_model_logits(m, logits) != 0)
            fail_msg("engine: %s", err);
        int best = 0;
        for (int v = 1; v < V; v++)
            best = logits[v] > logits[best] ? v : best;
        s_mix_ids[t] = best;
    }
    free(logits);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&m);
    ls_backend_destroy(&be);
}

static void s_check_ids(const json_t *ids, const char *what) {
    assert_true(json_is_array(ids));
    assert_int_equal(json_array_size(ids), N_NEW);
    for (int i = 0; i < N_NEW; i++)
        if (json_integer_value(json_array_get(ids, (size_t)i)) != s_mix_ids[i])
            fail_msg("%s: token %d is %lld, the engine's mix gives %d", what, i,
                     (long long)json_integer_value(json_array_get(ids, (size_t)i)), s_mix_ids[i]);
}

static void test_matches_engine(void **state) {
    (void)state;
    char ids[512], body[2048];
    s_prompt_json(ids, sizeof ids);
    snprintf(body, sizeof body, "{\"input_ids\":%s,\"lora_path\":" MIX ",\"sampling_params\":{\"temperature\":0,"
             "\"max_new_tokens\":%d,\"ignore_eos\":true}}", ids, N_NEW);
    json_t *out;
    assert_int_equal(s_post("/generate", body, &out), 200);
    s_check_ids(json_object_get(out, "output_ids"), "/generate");
    const char *text = json_string_value(json_object_get(out, "text"));
    assert_non_null(text);
    char *want = strdup(text);
    json_decref(out);
    // the same through the OpenAI API, the mix as the model
    snprintf(body, sizeof body, "{\"model\":" MIX ",\"prompt\":%s,\"max_tokens\":%d,\"temperature\":0,"
             "\"ignore_eos\":true}", ids, N_NEW);
    assert_int_equal(s_post("/v1/completions", body, &out), 200);
    const json_t *c0 = json_array_get(json_object_get(out, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), want);
    const char *model = json_string_value(json_object_get(out, "model"));
    assert_non_null(model);
    assert_non_null(strstr(model, "\"reverse\""));
    json_decref(out);
    print_message("mix reverse 0.7 + upper 0.3: '%s' (base '%s', reverse '%s')\n", want, s_base_text,
                  s_reverse_text);
    free(want);
}

static void test_neighbours(void **state) {
    (void)state;
    char ids[512], body[4096];
    s_prompt_json(ids, sizeof ids);
    snprintf(body, sizeof body, "{\"input_ids\":[%s,%s,%s],\"lora_path\":[null,\"reverse\"," MIX "],"
             "\"sampling_params\":{\"temperature\":0,\"max_new_tokens\":%d,\"ignore_eos\":true}}", ids, ids, ids,
             N_NEW);
    json_t *out;
    assert_int_equal(s_post("/generate", body, &out), 200);
    assert_true(json_is_array(out) && json_array_size(out) == 3);
    const char *base = json_string_value(json_object_get(json_array_get(out, 0), "text"));
    const char *rev = json_string_value(json_object_get(json_array_get(out, 1), "text"));
    assert_non_null(base);
    assert_non_null(rev);
    // greedy past the answer (ignore_eos): the answers are where they start
    assert_memory_equal(base, s_base_text, strlen(s_base_text));
    assert_memory_equal(rev, s_reverse_text, strlen(s_reverse_text));
    s_check_ids(json_object_get(json_array_get(out, 2), "output_ids"), "/generate list, beside base and reverse");
    json_decref(out);
}

static void test_refused(void **state) {
    (void)state;
    static const struct {
        const char *lora, *want;
    } bad[] = {
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":0},{\"name\":\"upper\",\"weight\":1}]}", "weight"},
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":-0.5},{\"name\":\"upper\",\"weight\":1}]}", "weight"},
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":\"x\"}]}", "a number}"},
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":1e999}]}", NULL},  // not JSON jansson takes
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":0.5},{\"name\":\"reverse\",\"weight\":0.5}]}", "twice"},
        {"{\"adapters\":[]}", "1 to 8"},
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":0.1},{\"name\":\"upper\",\"weight\":0.1},"
         "{\"name\":\"a\",\"weight\":0.1},{\"name\":\"b\",\"weight\":0.1},{\"name\":\"c\",\"weight\":0.1},"
         "{\"name\":\"d\",\"weight\":0.1},{\"name\":\"e\",\"weight\":0.1},{\"name\":\"f\",\"weight\":0.1},"
         "{\"name\":\"g\",\"weight\":0.1}]}", "1 to 8"},
        {"{\"adapters\":[{\"name\":\"reverse\",\"weight\":0.5},{\"name\":\"upper\",\"weight\":0.5}],"
         "\"combination\":\"linear\"}", "linear"},
        {"{\"adapters\":[{\"name\":\"demo\",\"weight\":0.5},{\"name\":\"upper\",\"weight\":0.5}]}", "base model"},
        {"{\"adapter\":[]}", "'adapters' and 'combination' only"},
    };
    char body[2048];
    json_t *out;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{\"text\":\"input: 5 leaf\\noutput:\",\"lora_path\":%s}", bad[i].lora);
        int status = s_post("/generate", body, &out);
        assert_int_equal(status, 400);
        char *dump = json_dumps(out, JSON_COMPACT);
        if (bad[i].want && (!dump || !strstr(dump, bad[i].want)))
            fail_msg("mix %zu: the answer %s does not say '%s'", i, dump ? dump : "(none)", bad[i].want);
        free(dump);
        json_decref(out);
    }
    // the mix as an OpenAI model: 400 naming model
    snprintf(body, sizeof body, "{\"model\":{\"adapters\":[]},\"prompt\":\"a\",\"max_tokens\":1}");
    assert_int_equal(s_post("/v1/completions", body, &out), 400);
    char *dump = json_dumps(out, JSON_COMPACT);
    assert_non_null(strstr(dump, "\"param\":\"model\""));
    free(dump);
    json_decref(out);
    // an unknown adapter in a mix: the unknown-adapter answer, naming it
    snprintf(body, sizeof body, "{\"text\":\"a\",\"lora_path\":{\"adapters\":[{\"name\":\"reverse\",\"weight\":0.5},"
             "{\"name\":\"nosuch\",\"weight\":0.5}]}}");
    int status = s_post("/generate", body, &out);
    dump = json_dumps(out, JSON_COMPACT);
    assert_true(status == 404 || status == 400);
    assert_non_null(strstr(dump, "nosuch"));
    free(dump);
    json_decref(out);
    // still serving: a plain request, and the mix again
    assert_int_equal(s_post("/generate", "{\"text\":\"input: 5 leaf road 1 red\\noutput:\",\"lora_path\":\"reverse\","
                                         "\"sampling_params\":{\"temperature\":0,\"max_new_tokens\":8}}", &out), 200);
    json_decref(out);
    test_matches_engine(state);
}

static int s_setup(void **state) {
    (void)state;
    json_error_t je;
    char path[512];
    snprintf(path, sizeof path, "%s/eval.json", LS_DEMO_DIR);
    json_t *ev = json_load_file(path, 0, &je);
    assert_non_null(ev);
    const json_t *res = json_object_get(ev, "results");
    const json_t *rv = json_array_get(json_object_get(json_object_get(res, "reverse"), "prompts"), 0);
    const json_t *bs = json_array_get(json_object_get(json_object_get(res, "base"), "prompts"), 0);
    const json_t *pids = json_object_get(json_object_get(rv, "raw"), "prompt_ids");
    s_n_prompt = (int)json_array_size(pids);
    assert_true(s_n_prompt > 0 && s_n_prompt <= 64);
    for (int i = 0; i < s_n_prompt; i++)
        s_prompt[i] = (int32_t)json_integer_value(json_array_get(pids, (size_t)i));
    // the same prompt in both (eval.json's first prompt is shared)
    assert_string_equal(json_string_value(json_object_get(rv, "prompt")), json_string_value(json_object_get(bs, "prompt")));
    snprintf(s_reverse_text, sizeof s_reverse_text, "%s", json_string_value(json_object_get(rv, "expected")));
    snprintf(s_base_text, sizeof s_base_text, "%s", json_string_value(json_object_get(bs, "expected")));
    json_decref(ev);
    s_engine_mix();
    assert_int_equal(tu_http_graph_up(&s_g, LS_LAUNCH_SCRIPT, LS_BIN_DIR, "mix", NULL), 0);
    return 0;
}

static int s_teardown(void **state) {
    (void)state;
    assert_int_equal(tu_http_graph_down(&s_g), 0);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_engine),
        cmocka_unit_test(test_neighbours),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
