// PEFT adapter loading: list and regex target_modules, rank/alpha patterns with PEFT's
// first-match rule, rslora scaling, exclusions, and every rejection rule with its message.
#include "fixtures.h"

#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "added_vocab.h"
#include "peft.h"

#define NL 3
static char errbuf[1024];
static ls_model_config_t cfg;


// Tiny Llama: hidden 16, 4 heads of 4, 2 kv heads -> q/o 16, k/v 8; intermediate 24.
static int setup(void **state)
{
    (void)state;
    const char *j = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 16, "
                    "\"intermediate_size\": 24, \"num_attention_heads\": 4, "
                    "\"num_key_value_heads\": 2, \"num_hidden_layers\": 3, \"vocab_size\": 32}";
    return ls_model_config_parse(j, strlen(j), "config.json", &cfg, errbuf, sizeof errbuf);
}

// The adapter a test writes: ranks[l][t] > 0 gives A (r, in) and B (out, r) for that module.
typedef struct {
    int ranks[NL][LS_TARGET_COUNT];
    ls_dtype_t dtype;
    const char *infix;  // "" or ".default"
    const char *extra_name;  // one more tensor (f32, shape extra_shape or [2, 2]) or NULL
    int64_t extra_shape[2];
} adapter_t;

static size_t numel_of(int l, int t, int which, const adapter_t *a)
{
    int in, out;
    ls_model_config_target_dims(&cfg, (ls_target_t)t, &in, &out);
    return (size_t)a->ranks[l][t] * (size_t)(which ? out : in);
}

static float value_of(int l, int t, int which, size_t i)
{
    return fx_value((unsigned)(l * 100 + t * 10 + which + 1), i);
}

static void write_adapter(const char *dir, const char *config, const adapter_t *a)
{
    fx_write_str(dir, "adapter_config.json", config);
    ls_st_write_tensor_t t[NL * LS_TARGET_COUNT * 2 + 1];
    static char names[NL * LS_TARGET_COUNT * 2][128];
    void *bufs[NL * LS_TARGET_COUNT * 2];
    size_t n = 0;
    for (int l = 0; l < NL; l++) {
        for (int tg = 0; tg < LS_TARGET_COUNT; tg++) {
            if (a->ranks[l][tg] == 0)
                continue;
            int in, out;
            ls_model_config_target_dims(&cfg, (ls_target_t)tg, &in, &out);
            for (int which = 0; which < 2; which++) {
                size_t ne = numel_of(l, tg, which, a);
                snprintf(names[n], sizeof names[n],
                         "base_model.model.model.layers.%d.%s.%s.lora_%c%s.weight", l,
                         ls_target_parent((ls_target_t)tg), ls_target_name((ls_target_t)tg),
                         which ? 'B' : 'A', a->infix ? a->infix : "");
                void *buf = malloc(ne * 4 + 4);
                for (size_t i = 0; i < ne; i++) {
                    float v = value_of(l, tg, which, i);
                    if (a->dtype == LS_DTYPE_F32)
                        ((float *)buf)[i] = v;
                    else if (a->dtype == LS_DTYPE_BF16)
                        ((uint16_t *)buf)[i] = ls_bf16_from_f32(v);
                    else
                        ((uint16_t *)buf)[i] = ls_f16_from_f32(v);
                }
                bufs[n] = buf;
                t[n] = (ls_st_write_tensor_t){.name = names[n], .dtype = a->dtype, .ndim = 2,
                                              .data = buf};
                t[n].shape[0] = which ? out : a->ranks[l][tg];
                t[n].shape[1] = which ? a->ranks[l][tg] : in;
                n++;
            }
        }
    }
    static const float ones[64] = {[0 ... 63] = 1.0f};
    size_t nt = n;
    if (a->extra_name) {
        t[nt] = (ls_st_write_tensor_t){.name = a->extra_name, .dtype = LS_DTYPE_F32, .ndim = 2,
                                       .shape = {2, 2}, .data = ones};
        if (a->extra_shape[0]) {
            t[nt].shape[0] = a->extra_shape[0];
            t[nt].shape[1] = a->extra_shape[1];
        }
        nt++;
    }
    char p[4096];
    assert_int_equal(ls_st_write(fx_path(p, sizeof p, dir, "adapter_model.safetensors"), t, nt,
                                 errbuf, sizeof errbuf), 0);
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
}

static void set_targets(adapter_t *a, unsigned mask, int rank)
{
    for (int l = 0; l < NL; l++)
        for (int t = 0; t < LS_TARGET_COUNT; t++)
            a->ranks[l][t] = (mask >> t & 1) ? rank : 0;
}

static ls_adapter_t *load_ok(const char *dir, int max_rank)
{
    ls_adapter_t *ad = ls_adapter_load(dir, &cfg, max_rank, errbuf, sizeof errbuf);
    if (!ad)
        fail_msg("load failed: %s", errbuf);
    return ad;
}

// Checks that every module holds what write_adapter wrote (exactly for f32, after the dtype's
// rounding otherwise) with the expected rank.
static void check_weights(const ls_adapter_t *ad, const adapter_t *a)
{
    size_t bytes = 0;
    for (int l = 0; l < NL; l++) {
        for (int t = 0; t < LS_TARGET_COUNT; t++) {
            const ls_lora_weights_t *w = ls_adapter_layer_target(ad, l, (ls_target_t)t);
            assert_int_equal(w->rank, a->ranks[l][t]);
            if (a->ranks[l][t] == 0) {
                assert_null(w->A);
                assert_null(w->B);
                continue;
            }
            for (int which = 0; which < 2; which++) {
                const float *m = which ? w->B : w->A;
                size_t ne = numel_of(l, t, which, a);
                bytes += ne * 4;
                for (size_t i = 0; i < ne; i++) {
                    float v = value_of(l, t, which, i);
                    if (a->dtype == LS_DTYPE_BF16)
                        v = ls_bf16_to_f32(ls_bf16_from_f32(v));
                    else if (a->dtype == LS_DTYPE_F16)
                        v = ls_f16_to_f32(ls_f16_from_f32(v));
                    assert_true(m[i] == v);
                }
            }
        }
    }
    assert_int_equal(ls_adapter_bytes(ad), bytes);
}

#define QV ((1u << LS_TARGET_Q) | (1u << LS_TARGET_V))
#define ALL 0x7fu

static void test_list_targets(void **state)
{
    (void)state;
    static const ls_dtype_t dtypes[3] = {LS_DTYPE_F32, LS_DTYPE_BF16, LS_DTYPE_F16};
    for (int d = 0; d < 3; d++) {
        char *dir = fx_tmpdir();
        adapter_t a = {.dtype = dtypes[d], .infix = d == 2 ? ".default" : ""};
        set_targets(&a, QV, 4);
        write_adapter(dir, "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": 4, "
                           "\"lora_alpha\": 8, \"target_modules\": [\"v_proj\", \"q_proj\"], "
                           "\"bias\": \"none\", \"use_dora\": false, \"modules_to_save\": null, "
                           "\"layers_to_transform\": null, \"fan_in_fan_out\": false, "
                           "\"use_rslora\": false, \"rank_pattern\": {}, \"alpha_pattern\": {}}",
                      &a);
        ls_adapter_t *ad = load_ok(dir, 16);
        check_weights(ad, &a);
        const ls_lora_weights_t *w = ls_adapter_layer_target(ad, 2, LS_TARGET_V);
        assert_true(w->scaling == 2.0f);
        ls_adapter_info_t info = ls_adapter_info(ad);
        assert_int_equal(info.max_rank, 4);
        assert_int_equal(info.target_mask, QV);
        assert_int_equal(info.num_modules, 2 * NL);
        ls_adapter_destroy(&ad);
        assert_null(ad);
        ls_adapter_destroy(&ad);
        // The config-only path agrees.
        memset(&info, 0, sizeof info);
        assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, &info, errbuf, sizeof errbuf), 0);
        assert_int_equal(info.max_rank, 4);
        assert_int_equal(info.target_mask, QV);
        fx_rmdir(&dir);
    }
}

static void test_full_names_and_defaults(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    adapter_t a = {.dtype = LS_DTYPE_F32};
    a.ranks[1][LS_TARGET_O] = 8;   // list entry given as a full module name
    a.ranks[0][LS_TARGET_UP] = 8;  // and as a dotted suffix
    a.ranks[1][LS_TARGET_UP] = 8;
    a.ranks[2][LS_TARGET_UP] = 8;
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"target_modules\": "
                       "[\"model.layers.1.self_attn.o_proj\", \"mlp.up_proj\"]}",
                  &a);
    ls_adapter_t *ad = load_ok(dir, 8);  // r and lora_alpha default to 8 as in PEFT
    check_weights(ad, &a);
    assert_true(ls_adapter_layer_target(ad, 1, LS_TARGET_O)->scaling == 1.0f);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);
}

static void test_regex_targets(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    adapter_t a = {.dtype = LS_DTYPE_F32};
    for (int l = 0; l < 2; l++)
        a.ranks[l][LS_TARGET_Q] = a.ranks[l][LS_TARGET_K] = 2;
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, "
                       "\"target_modules\": \".*\\\\.layers\\\\.[01]\\\\.self_attn\\\\.(q|k)_proj\"}",
                  &a);
    ls_adapter_t *ad = load_ok(dir, 16);
    check_weights(ad, &a);
    ls_adapter_destroy(&ad);

    // \d, (?:...), lazy quantifiers and {m,n} translate; the match is on the whole name.
    memset(a.ranks, 0, sizeof a.ranks);
    for (int l = 0; l < NL; l++)
        a.ranks[l][LS_TARGET_GATE] = a.ranks[l][LS_TARGET_UP] = 2;
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, "
                       "\"target_modules\": \"model\\\\.layers\\\\.\\\\d{1,2}\\\\.m.*?\\\\.(?:gate|up)_proj\"}",
                  &a);
    ad = load_ok(dir, 16);
    check_weights(ad, &a);
    ls_adapter_destroy(&ad);

    // A regex that is only a suffix does not match: PEFT uses re.fullmatch.
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 2, \"target_modules\": \"q_proj\"}", &a);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "selects no module");

    // Character classes with escapes inside brackets.
    memset(a.ranks, 0, sizeof a.ranks);
    a.ranks[2][LS_TARGET_DOWN] = 2;
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 2, "
                       "\"target_modules\": \"[a-z.]+[\\\\d]\\\\.mlp[.]down_proj\"}",
                  &a);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));  // layers 0,1 too
    assert_contains(errbuf, "lora_A weight is missing");
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 2, "
                       "\"target_modules\": \"[a-z.]+[2-9]\\\\.mlp[.]down_proj\"}",
                  &a);
    ad = load_ok(dir, 16);
    check_weights(ad, &a);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);
}

static void test_patterns_and_rslora(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    adapter_t a = {.dtype = LS_DTYPE_BF16};
    set_targets(&a, ALL, 4);
    a.ranks[0][LS_TARGET_Q] = a.ranks[1][LS_TARGET_Q] = a.ranks[2][LS_TARGET_Q] = 2;
    a.ranks[1][LS_TARGET_V] = 8;
    a.ranks[2][LS_TARGET_DOWN] = 0;  // excluded below
    // "q_proj" comes first, so it wins over the more specific layer-0 key (PEFT's first match);
    // "^k_proj" is anchored at the start of the full name and never matches.
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
                       "\"use_rslora\": true, \"target_modules\": \"all-linear\", "
                       "\"exclude_modules\": [\"layers.2.mlp.down_proj\"], "
                       "\"rank_pattern\": {\"q_proj\": 2, \"layers.0.self_attn.q_proj\": 6, "
                       "\"model.layers.1.self_attn.v_proj\": 8, \"^k_proj\": 16}, "
                       "\"alpha_pattern\": {\"layers\\\\.[12]\\\\.mlp\\\\.gate_proj\": 32, "
                       "\"o_proj\": 2.5}}",
                  &a);
    ls_adapter_t *ad = load_ok(dir, 8);
    check_weights(ad, &a);
    const float eps = 1e-6f;
    assert_float_equal(ls_adapter_layer_target(ad, 0, LS_TARGET_Q)->scaling, 8 / sqrtf(2), eps);
    assert_float_equal(ls_adapter_layer_target(ad, 1, LS_TARGET_V)->scaling, 8 / sqrtf(8), eps);
    assert_float_equal(ls_adapter_layer_target(ad, 0, LS_TARGET_V)->scaling, 4.0f, eps);
    assert_float_equal(ls_adapter_layer_target(ad, 2, LS_TARGET_K)->scaling, 4.0f, eps);
    assert_float_equal(ls_adapter_layer_target(ad, 0, LS_TARGET_GATE)->scaling, 4.0f, eps);
    assert_float_equal(ls_adapter_layer_target(ad, 1, LS_TARGET_GATE)->scaling, 16.0f, eps);
    assert_float_equal(ls_adapter_layer_target(ad, 2, LS_TARGET_GATE)->scaling, 16.0f, eps);
    assert_float_equal(ls_adapter_layer_target(ad, 1, LS_TARGET_O)->scaling, 1.25f, eps);
    ls_adapter_info_t info = ls_adapter_info(ad);
    assert_int_equal(info.max_rank, 8);
    assert_int_equal(info.target_mask, ALL);
    assert_int_equal(info.num_modules, NL * 7 - 1);
    ls_adapter_destroy(&ad);

    // Without rslora: alpha / r.
    set_targets(&a, 1u << LS_TARGET_Q, 4);
    write_adapter(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 16, "
                       "\"target_modules\": [\"q_proj\"], \"alpha_pattern\": {\"layers.1.self_attn.q_proj\": 2}}",
                  &a);
    ad = load_ok(dir, 8);
    assert_float_equal(ls_adapter_layer_target(ad, 0, LS_TARGET_Q)->scaling, 4.0f, eps);
    assert_float_equal(ls_adapter_layer_target(ad, 1, LS_TARGET_Q)->scaling, 0.5f, eps);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);
}

// Writes a q_proj rank-4 adapter with config, expects config_read (when check_read) and load to
// fail with every fragment in the message.
static void expect_reject(const char *config, const adapter_t *a, bool check_read, int n, ...)
{
    char *dir = fx_tmpdir();
    adapter_t def = {.dtype = LS_DTYPE_F32};
    if (!a) {
        set_targets(&def, 1u << LS_TARGET_Q, 4);
        a = &def;
    }
    write_adapter(dir, config, a);
    for (int pass = check_read ? 0 : 1; pass < 2; pass++) {
        errbuf[0] = '\0';
        if (pass == 0) {
            if (ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf) == 0)
                fail_msg("config_read accepted %s", config);
        } else {
            ls_adapter_t *ad = ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf);
            if (ad)
                fail_msg("load accepted %s", config);
        }
        va_list ap;
        va_start(ap, n);
        for (int i = 0; i < n; i++) {
            const char *frag = va_arg(ap, const char *);
            if (!strstr(errbuf, frag))
                fail_msg("%s (pass %d, extra tensor %s): \"%s\" does not contain \"%s\"",
                         config, pass, a->extra_name ? a->extra_name : "none", errbuf, frag);
        }
        va_end(ap);
    }
    fx_rmdir(&dir);
}

#define CFG(extra) "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]" extra "}"

static void test_config_rejections(void **state)
{
    (void)state;
    expect_reject("{\"peft_type\": \"PREFIX_TUNING\", \"r\": 4}", NULL, true, 3,
                  "adapter_config.json", "peft_type", "only LORA");
    expect_reject("{\"r\": 4}", NULL, true, 2, "peft_type", "missing");
    expect_reject(CFG(", \"task_type\": \"SEQ_CLS\""), NULL, true, 2, "task_type", "CAUSAL_LM");
    expect_reject(CFG(", \"bias\": \"all\""), NULL, true, 3, "\"bias\"", "\"all\"", "none");
    expect_reject(CFG(", \"use_dora\": true"), NULL, true, 2, "use_dora", "DoRA");
    expect_reject(CFG(", \"lora_bias\": true"), NULL, true, 1, "lora_bias");
    expect_reject(CFG(", \"fan_in_fan_out\": true"), NULL, true, 2, "fan_in_fan_out",
                  "not supported");
    expect_reject(CFG(", \"modules_to_save\": [\"lm_head\"]"), NULL, true, 2, "modules_to_save",
                  "not supported");
    expect_reject(CFG(", \"layers_to_transform\": [0, 1]"), NULL, true, 2,
                  "layers_to_transform", "not supported");
    expect_reject(CFG(", \"layer_replication\": [[0, 2], [1, 3]]"), NULL, true, 2,
                  "layer_replication", "not supported");
    expect_reject(CFG(", \"target_parameters\": [\"experts.gate_up_proj\"]"), NULL, true, 1,
                  "target_parameters");
    expect_reject(CFG(", \"alora_invocation_tokens\": [1, 2]"), NULL, true, 1,
                  "alora_invocation_tokens");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\", \"fc1\"]}",
                  NULL, true, 3, "target_modules", "\"fc1\" matches no module", "q_proj");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\", \"norm\"]}",
                  NULL, true, 3, "\"model.norm\"", "not a supported LoRA target", "embed_tokens, lm_head");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\", \"input_layernorm\"]}",
                  NULL, true, 2, "input_layernorm", "not a supported LoRA target");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \".*(q_proj|rotary_emb)\"}",
                  NULL, true, 2, "\"model.rotary_emb\"", "not a supported LoRA target");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"^(?!.*vision).*q_proj\"}",
                  NULL, true, 3, "target_modules", "regex", "not supported");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \".*q_proj(\"}",
                  NULL, true, 2, "target_modules", "invalid");
    // Patterns that would make regcomp's tree grow exponentially (found by fuzz_adapter_config).
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"m++++++++++++++++++++q\"}",
                  NULL, true, 2, "target_modules", "multiple repeat");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"((q{100}){100}){100}\"}",
                  NULL, true, 2, "target_modules", "product is above 1024");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"(((((((((q)+)+)+)+)+)+)+)+)+\"}",
                  NULL, true, 2, "target_modules", "nested more than 8 deep");
    expect_reject(CFG(", \"rank_pattern\": {\"q**\": 2}"), NULL, true, 2, "rank_pattern", "multiple repeat");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"foo.*\"}", NULL,
                  true, 1, "selects no module");
    expect_reject(CFG(", \"rank_pattern\": {\"q_proj\": 0}"), NULL, true, 2, "rank_pattern",
                  "positive integer");
    expect_reject(CFG(", \"rank_pattern\": {\"(?<=x)q\": 2}"), NULL, true, 2, "rank_pattern",
                  "not supported");
    expect_reject(CFG(", \"alpha_pattern\": {\"q_proj\": \"big\"}"), NULL, true, 1,
                  "alpha_pattern");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 0, \"target_modules\": [\"q_proj\"]}", NULL,
                  true, 2, "\"r\"", "positive integer");
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": \"x\", \"target_modules\": [\"q_proj\"]}",
                  NULL, true, 1, "lora_alpha");
    // Rank above max_lora_rank (16), directly and through rank_pattern.
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 32, \"target_modules\": [\"q_proj\"]}", NULL,
                  true, 4, "model.layers.0.self_attn.q_proj", "rank 32", "max_lora_rank 16",
                  "adapter_config.json");
    expect_reject(CFG(", \"rank_pattern\": {\"layers.2.self_attn.q_proj\": 64}"), NULL, true, 2,
                  "model.layers.2.self_attn.q_proj", "rank 64");
    expect_reject("not json", NULL, true, 2, "adapter_config.json", "not a valid JSON");
}

// The embedding and lm_head as PEFT writes them: lora_embedding_A (r, vocab) and
// lora_embedding_B (hidden, r) without ".weight", lm_head's lora_A/B, the base-layer copies
// save_embedding_layers adds (shape-checked, not read), rank/alpha patterns by module name;
// "all-linear" selects neither; bad shapes, a resized vocabulary, a missing half, the Linear
// names on the embedding and trained weights are refused.
typedef struct {
    const char *name;
    int64_t shape[2];
} glob_tensor_t;

static int nan_tensor = -1;  // write_globals makes the first value of this tensor NaN

static void write_globals(const char *dir, const char *config, const glob_tensor_t *g, int n)
{
    fx_write_str(dir, "adapter_config.json", config);
    ls_st_write_tensor_t t[12];
    float *bufs[12];
    assert_true(n <= 12);
    for (int i = 0; i < n; i++) {
        size_t ne = (size_t)(g[i].shape[0] * g[i].shape[1]);
        bufs[i] = malloc(ne * sizeof(float) + 1);
        for (size_t k = 0; k < ne; k++)
            bufs[i][k] = k == 0 && i == nan_tensor ? NAN : fx_value(700u + (unsigned)i, k);
        t[i] = (ls_st_write_tensor_t){.name = g[i].name, .dtype = LS_DTYPE_F32, .ndim = 2,
                                      .shape = {g[i].shape[0], g[i].shape[1]}, .data = bufs[i]};
    }
    char p[4096];
    assert_int_equal(ls_st_write(fx_path(p, sizeof p, dir, "adapter_model.safetensors"), t,
                                 (size_t)n, errbuf, sizeof errbuf), 0);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
}

#define EMB "base_model.model.model.embed_tokens."
#define HEAD "base_model.model.lm_head."
#define GCFG "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": " \
             "[\"embed_tokens\", \"lm_head\"], \"rank_pattern\": {\"embed_tokens\": 2}, " \
             "\"alpha_pattern\": {\"lm_head\": 2}}"

static void test_embed_and_lm_head(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    glob_tensor_t g[] = {
        {EMB "lora_embedding_A", {2, 32}},   {EMB "lora_embedding_B", {16, 2}},
        {HEAD "lora_A.weight", {4, 16}},     {HEAD "lora_B.weight", {32, 4}},
        {EMB "base_layer.weight", {32, 16}}, {HEAD "base_layer.weight", {32, 16}},
    };
    write_globals(dir, GCFG, g, 6);
    ls_adapter_t *ad = load_ok(dir, 16);
    ls_adapter_info_t info = ls_adapter_info(ad);
    assert_int_equal(info.target_mask, 1u << LS_TARGET_EMBED | 1u << LS_TARGET_LM_HEAD);
    assert_int_equal(info.num_modules, 2);
    assert_int_equal(info.max_rank, 4);
    const ls_lora_weights_t *e = ls_adapter_global_target(ad, LS_TARGET_EMBED);
    const ls_lora_weights_t *h = ls_adapter_global_target(ad, LS_TARGET_LM_HEAD);
    assert_int_equal(e->rank, 2);
    assert_float_equal(e->scaling, 4.0f, 0);  // 8 / 2
    assert_int_equal(h->rank, 4);
    assert_float_equal(h->scaling, 0.5f, 0);  // 2 / 4
    assert_true(e->A[31] == fx_value(700u, 31) && e->B[31] == fx_value(701u, 31));
    assert_true(h->A[63] == fx_value(702u, 63) && h->B[127] == fx_value(703u, 127));
    assert_int_equal(ls_adapter_bytes(ad), (2 * 32 + 16 * 2 + 4 * 16 + 32 * 4) * 4);
    assert_int_equal(ls_adapter_layer_target(ad, 0, LS_TARGET_Q)->rank, 0);
    ls_adapter_destroy(&ad);
    // an adapter-name infix, as for the layers' targets
    glob_tensor_t infix[] = {{EMB "lora_embedding_A.default", {2, 32}},
                             {EMB "lora_embedding_B.default", {16, 2}},
                             {HEAD "lora_A.default.weight", {4, 16}},
                             {HEAD "lora_B.default.weight", {32, 4}}};
    write_globals(dir, GCFG, infix, 4);
    ad = load_ok(dir, 16);
    ls_adapter_destroy(&ad);
    // all-linear: the layers' projections, neither the embedding nor lm_head
    fx_write_str(dir, "adapter_config.json",
                 "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": \"all-linear\"}");
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, &info, errbuf, sizeof errbuf), 0);
    assert_int_equal(info.target_mask, 0x7fu);

    glob_tensor_t bad[6];
    memcpy(bad, g, sizeof bad);
    bad[0].shape[1] = 33;  // the embedding's A over a vocabulary of 33
    write_globals(dir, GCFG, bad, 6);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    print_message("refused: %s\n", errbuf);
    assert_contains(errbuf, "lora_embedding_A");
    assert_contains(errbuf, "embed_tokens dims 32 -> 16");
    memcpy(bad, g, sizeof bad);
    bad[5].shape[0] = 40;  // a resized vocabulary: added tokens
    write_globals(dir, GCFG, bad, 6);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    print_message("refused: %s\n", errbuf);
    assert_contains(errbuf, "lm_head.base_layer.weight");
    assert_contains(errbuf, "resized vocabulary");
    write_globals(dir, GCFG, g + 1, 3);  // no lora_embedding_A
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "\"model.embed_tokens\" is selected by target_modules but its "
                            "lora_embedding_A weight is missing");
    glob_tensor_t linear[] = {{EMB "lora_A.weight", {2, 32}}};
    write_globals(dir, GCFG, linear, 1);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "not supported; LoRA on them (lora_embedding_A/B, lora_A/B)");
    glob_tensor_t trained[] = {{EMB "weight", {32, 16}}};
    write_globals(dir, GCFG, trained, 1);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "trained embed_tokens/lm_head weights");
    fx_rmdir(&dir);
}

// Trainable tokens (trainable_token_indices): the list form (the embedding) and the object
// form (embed_tokens, lm_head), lm_head tied to the embedding's rows on a tied model, the
// adapter-name infix, an empty list; and every refusal of the config and the tensors.
#define TQ "base_model.model.model.layers.0.self_attn.q_proj.lora_"
#define TCFG(tok) "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"], " \
                  "\"trainable_token_indices\": " tok "}"
#define TOK_E EMB "token_adapter.trainable_tokens_delta"
#define TOK_H HEAD "token_adapter.trainable_tokens_delta"

// Every layer's q_proj at rank 4 (tensors 0 .. 5), then the tensors g.
static void write_tokens(const char *dir, const char *config, const glob_tensor_t *g, int n)
{
    glob_tensor_t all[12];
    int k = 0;
    static char names[NL][2][96];
    for (int l = 0; l < NL; l++)
        for (int which = 0; which < 2; which++) {
            snprintf(names[l][which], sizeof names[l][which],
                     "base_model.model.model.layers.%d.self_attn.q_proj.lora_%c.weight", l,
                     which ? 'B' : 'A');
            all[k++] = (glob_tensor_t){names[l][which], {which ? 16 : 4, which ? 4 : 16}};
        }
    assert_true(k + n <= 12);
    for (int i = 0; i < n; i++)
        all[k + i] = g[i];
    write_globals(dir, config, all, k + n);
}

static void expect_tokens_reject(const ls_model_config_t *c, const char *config,
                                 const glob_tensor_t *g, int n, bool check_read, const char *frag1,
                                 const char *frag2)
{
    char *dir = fx_tmpdir();
    write_tokens(dir, config, g, n);
    for (int pass = check_read ? 0 : 1; pass < 2; pass++) {
        errbuf[0] = '\0';
        if (pass == 0)
            assert_int_equal(ls_adapter_config_read(dir, c, 16, NULL, errbuf, sizeof errbuf), -1);
        else
            assert_null(ls_adapter_load(dir, c, 16, errbuf, sizeof errbuf));
        if (!strstr(errbuf, frag1) || (frag2 && !strstr(errbuf, frag2)))
            fail_msg("%s (pass %d): \"%s\" lacks \"%s\" or \"%s\"", config, pass, errbuf, frag1,
                     frag2 ? frag2 : "");
    }
    fx_rmdir(&dir);
}

static void test_trainable_tokens(void **state)
{
    (void)state;
    ls_model_config_t tied = cfg;
    tied.tie_word_embeddings = true;
    char *dir = fx_tmpdir();
    // the list form: the embedding's rows, in the order of the ids
    glob_tensor_t e3[] = {{TOK_E, {3, 16}}};
    write_tokens(dir, TCFG("[5, 7, 3]"), e3, 1);
    ls_adapter_info_t info;
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, &info, errbuf, sizeof errbuf), 0);
    assert_int_equal(info.token_rows, 3);
    assert_int_equal(info.target_mask, 1u << LS_TARGET_Q);
    ls_adapter_t *ad = load_ok(dir, 16);
    const ls_token_rows_t *te = ls_adapter_token_rows(ad, LS_TARGET_EMBED);
    const ls_token_rows_t *th = ls_adapter_token_rows(ad, LS_TARGET_LM_HEAD);
    assert_int_equal(te->n, 3);
    assert_int_equal(te->ids[0], 5);
    assert_int_equal(te->ids[1], 7);
    assert_int_equal(te->ids[2], 3);
    assert_true(te->rows[0] == fx_value(706u, 0) && te->rows[47] == fx_value(706u, 47));
    assert_int_equal(th->n, 0);  // untied: lm_head keeps its base rows
    assert_int_equal(ls_adapter_bytes(ad), (size_t)(3 * (4 * 16 + 16 * 4) + 3 * 16) * 4);
    ls_adapter_destroy(&ad);
    // tied: lm_head takes the embedding's rows
    ad = ls_adapter_load(dir, &tied, 16, errbuf, sizeof errbuf);
    assert_non_null(ad);
    te = ls_adapter_token_rows(ad, LS_TARGET_EMBED);
    th = ls_adapter_token_rows(ad, LS_TARGET_LM_HEAD);
    assert_int_equal(th->n, 3);
    assert_true(th->ids == te->ids && th->rows == te->rows);
    ls_adapter_destroy(&ad);
    // the object form, each module its own rows (tied too), with the adapter-name infix
    glob_tensor_t eh[] = {{TOK_E ".default", {2, 16}}, {TOK_H ".default", {1, 16}}};
    write_tokens(dir, TCFG("{\"model.embed_tokens\": [1, 2], \"lm_head\": [31]}"), eh, 2);
    for (int k = 0; k < 2; k++) {
        ad = ls_adapter_load(dir, k ? &tied : &cfg, 16, errbuf, sizeof errbuf);
        if (!ad)
            fail_msg("load: %s", errbuf);
        info = ls_adapter_info(ad);
        te = ls_adapter_token_rows(ad, LS_TARGET_EMBED);
        th = ls_adapter_token_rows(ad, LS_TARGET_LM_HEAD);
        assert_int_equal(info.token_rows, 2);
        assert_int_equal(te->n, 2);
        assert_int_equal(th->n, 1);
        assert_int_equal(th->ids[0], 31);
        assert_true(th->rows[15] == fx_value(707u, 15));
        ls_adapter_destroy(&ad);
    }
    // an empty list replaces nothing; PEFT saves a (0, hidden) tensor for it
    glob_tensor_t e0[] = {{TOK_E, {0, 16}}};
    write_tokens(dir, TCFG("[]"), e0, 1);
    ad = load_ok(dir, 16);
    assert_int_equal(ls_adapter_info(ad).token_rows, 0);
    assert_int_equal(ls_adapter_token_rows(ad, LS_TARGET_EMBED)->n, 0);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);

    // the config
    expect_tokens_reject(&cfg, TCFG("[5, 32]"), e3, 1, true, "token id 32, at or past the base "
                         "vocab_size 32", "added vocabulary");
    expect_tokens_reject(&cfg, TCFG("[5, -1]"), e3, 1, true, "non-negative integer", NULL);
    expect_tokens_reject(&cfg, TCFG("[5, 1.5]"), e3, 1, true, "non-negative integer", NULL);
    expect_tokens_reject(&cfg, TCFG("[\"5\"]"), e3, 1, true, "non-negative integer", NULL);
    expect_tokens_reject(&cfg, TCFG("[3, 4, 3]"), e3, 1, true, "lists token id 3 twice", NULL);
    expect_tokens_reject(&cfg, TCFG("{\"fc1\": [1]}"), e3, 1, true, "key \"fc1\" names neither "
                         "embedding", NULL);
    expect_tokens_reject(&cfg, TCFG("{\"embed_tokens\": [1], \"model.embed_tokens\": [2]}"), e3,
                         1, true, "names a module another key names too", NULL);
    expect_tokens_reject(&cfg, TCFG("{\"embed_tokens\": 5}"), e3, 1, true,
                         "entry embed_tokens must be a list", NULL);
    expect_tokens_reject(&cfg, TCFG("\"embed_tokens\""), e3, 1, true, "must be a list of token "
                         "ids or an object", NULL);
    // LoRA and trainable tokens on one module: PEFT cannot run it
    expect_tokens_reject(&cfg, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": "
                         "[\"q_proj\", \"embed_tokens\"], \"trainable_token_indices\": [1]}",
                         e3, 1, true, "LoRA on embed_tokens", "PEFT cannot run");
    expect_tokens_reject(&tied, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": "
                         "[\"q_proj\", \"lm_head\"], \"trainable_token_indices\": [1]}",
                         e3, 1, true, "(lm_head's, tied to the embedding's) and LoRA on lm_head",
                         NULL);
    dir = fx_tmpdir();  // untied, lm_head's LoRA and the embedding's tokens are two modules
    glob_tensor_t hl[] = {{TOK_E, {1, 16}}, {HEAD "lora_A.weight", {4, 16}},
                          {HEAD "lora_B.weight", {32, 4}}};
    write_tokens(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\", "
                 "\"lm_head\"], \"trainable_token_indices\": [1]}", hl, 3);
    ad = load_ok(dir, 16);
    assert_int_equal(ls_adapter_token_rows(ad, LS_TARGET_EMBED)->n, 1);
    assert_int_equal(ls_adapter_global_target(ad, LS_TARGET_LM_HEAD)->rank, 4);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);

    // the tensors
    expect_tokens_reject(&cfg, TCFG("[5, 7, 3]"), NULL, 0, false, "lists 3 token ids for "
                         "embed_tokens but tensor", "is missing");
    glob_tensor_t e2[] = {{TOK_E, {2, 16}}};
    expect_tokens_reject(&cfg, TCFG("[5, 7, 3]"), e2, 1, false, TOK_E, "3 token ids in "
                         "trainable_token_indices, hidden_size 16");
    glob_tensor_t e3h[] = {{TOK_E, {3, 16}}, {TOK_H, {3, 16}}};
    expect_tokens_reject(&tied, TCFG("[5, 7, 3]"), e3h, 2, false, TOK_H, "lists no tokens for "
                         "this module");
    glob_tensor_t twice[] = {{TOK_E, {3, 16}}, {TOK_E ".default", {3, 16}}};
    expect_tokens_reject(&cfg, TCFG("[5, 7, 3]"), twice, 2, false, "given twice", NULL);
    nan_tensor = 6;  // after write_tokens' six q_proj tensors
    expect_tokens_reject(&cfg, TCFG("[5, 7, 3]"), e3, 1, false, TOK_E, "NaN or infinite");
    nan_tensor = -1;
}

// Added vocabulary (added_vocab.h): the tokenizer's tokens past vocab_size (32) with their
// flags, rows from trainable tokens, the resized matrix and new_embeddings.safetensors, the tie,
// and every refusal of the tokenizer files and the rows.
#define TOKJ(entries) "{\"model\": {}, \"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", " \
                      "\"special\": true}" entries "]}"
#define ADD2 ", {\"id\": 32, \"content\": \"<a>\"}, {\"id\": 33, \"content\": \"<b>\", " \
             "\"special\": true, \"lstrip\": true, \"normalized\": false}"

static void write_new_embeddings(const char *dir, int n_in, int n_out)
{
    float buf[2][3 * 16];
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 3 * 16; k++)
            buf[m][k] = fx_value(800u + (unsigned)m, (size_t)k);
    ls_st_write_tensor_t t[2];
    int n = 0;
    if (n_in)
        t[n++] = (ls_st_write_tensor_t){.name = "input_embeddings", .dtype = LS_DTYPE_F32,
                                        .ndim = 2, .shape = {n_in, 16}, .data = buf[0]};
    if (n_out)
        t[n++] = (ls_st_write_tensor_t){.name = "output_embeddings", .dtype = LS_DTYPE_F32,
                                        .ndim = 2, .shape = {n_out, 16}, .data = buf[1]};
    char p[4096];
    assert_int_equal(ls_st_write(fx_path(p, sizeof p, dir, "new_embeddings.safetensors"), t,
                                 (size_t)n, errbuf, sizeof errbuf), 0);
}

static void expect_added_reject(const ls_model_config_t *c, const char *tokj, const char *added_json,
                                const char *config, const glob_tensor_t *g, int n, int new_emb,
                                bool at_read, const char *frag)
{
    char *dir = fx_tmpdir();
    write_tokens(dir, config, g, n);
    if (tokj)
        fx_write_str(dir, "tokenizer.json", tokj);
    if (added_json)
        fx_write_str(dir, "added_tokens.json", added_json);
    if (new_emb)
        write_new_embeddings(dir, new_emb, new_emb);
    errbuf[0] = '\0';
    int rc = ls_adapter_config_read(dir, c, 16, NULL, errbuf, sizeof errbuf);
    if (!at_read) {
        if (rc != 0)
            fail_msg("config read: %s", errbuf);
        assert_null(ls_adapter_load(dir, c, 16, errbuf, sizeof errbuf));
    }
    if ((at_read && rc != -1) || !strstr(errbuf, frag))
        fail_msg("\"%s\" lacks \"%s\"", errbuf, frag);
    print_message("refused: %s\n", errbuf);
    fx_rmdir(&dir);
}

static void test_added_vocab(void **state)
{
    (void)state;
    ls_model_config_t tied = cfg;
    tied.tie_word_embeddings = true;
    char *dir = fx_tmpdir();
    // PEFT after resize_token_embeddings: trainable tokens naming new ids, and the resized
    // lm_head PEFT saves (untied); lm_head's id 33 is not listed, so its row is the matrix's
    glob_tensor_t g[] = {{TOK_E, {3, 16}}, {TOK_H, {1, 16}}, {HEAD "weight", {34, 16}}};
    write_tokens(dir, TCFG("{\"embed_tokens\": [5, 32, 33], \"lm_head\": [32]}"), g, 3);
    fx_write_str(dir, "tokenizer.json", TOKJ(ADD2));
    fx_write_str(dir, "added_tokens.json", "{\"<b>\": 33, \"<a>\": 32}");
    ls_added_vocab_t av;
    assert_int_equal(ls_added_vocab_read(dir, 32, &av, errbuf, sizeof errbuf), 0);
    assert_int_equal(av.n, 2);
    assert_int_equal(av.tokens[0].id, 32);
    assert_string_equal(av.tokens[0].content, "<a>");
    assert_true(!av.tokens[0].special && av.tokens[0].normalized && !av.tokens[0].lstrip);
    assert_true(av.tokens[1].special && av.tokens[1].lstrip && !av.tokens[1].normalized);
    ls_added_vocab_free(&av);
    ls_adapter_info_t info;
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, &info, errbuf, sizeof errbuf), 0);
    assert_int_equal(info.added_tokens, 2);
    assert_int_equal(info.token_rows, 3);
    ls_adapter_t *ad = load_ok(dir, 16);
    const ls_token_rows_t *te = ls_adapter_token_rows(ad, LS_TARGET_EMBED);
    const ls_token_rows_t *th = ls_adapter_token_rows(ad, LS_TARGET_LM_HEAD);
    assert_int_equal(te->n, 3);
    assert_int_equal(te->ids[1], 32);
    assert_true(te->rows[16] == fx_value(706u, 16) && te->rows[47] == fx_value(706u, 47));
    assert_int_equal(th->n, 2);
    assert_int_equal(th->ids[0], 32);
    assert_int_equal(th->ids[1], 33);
    assert_true(th->rows[0] == fx_value(707u, 0));                // lm_head's own delta
    assert_true(th->rows[16] == fx_value(708u, 33 * 16));         // the matrix's row 33
    assert_true(th->rows[31] == fx_value(708u, 33 * 16 + 15));
    assert_int_equal(ls_adapter_info(ad).token_rows, 3);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);

    // the list form on a tied model: lm_head shares the embedding's ids and rows; an added id
    // the list leaves out takes the resized embedding's row (PEFT's wrapped base layer)
    dir = fx_tmpdir();
    glob_tensor_t gt[] = {{TOK_E, {1, 16}}, {EMB "token_adapter.base_layer.weight", {34, 16}}};
    write_tokens(dir, TCFG("[33]"), gt, 2);
    fx_write_str(dir, "tokenizer.json", TOKJ(ADD2));
    ad = ls_adapter_load(dir, &tied, 16, errbuf, sizeof errbuf);
    if (!ad)
        fail_msg("load: %s", errbuf);
    te = ls_adapter_token_rows(ad, LS_TARGET_EMBED);
    th = ls_adapter_token_rows(ad, LS_TARGET_LM_HEAD);
    assert_int_equal(te->n, 2);
    assert_int_equal(te->ids[0], 33);
    assert_int_equal(te->ids[1], 32);
    assert_true(te->rows[16] == fx_value(707u, 32 * 16));
    assert_true(th->ids == te->ids && th->rows == te->rows && th->n == 2);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);

    // vLLM's new_embeddings.safetensors beside a plain LoRA adapter, untied
    dir = fx_tmpdir();
    write_tokens(dir, "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"]}",
                 NULL, 0);
    fx_write_str(dir, "added_tokens.json", "{\"<a>\": 32, \"<b>\": 33, \"<s>\": 1}");
    write_new_embeddings(dir, 2, 2);
    ad = load_ok(dir, 16);
    te = ls_adapter_token_rows(ad, LS_TARGET_EMBED);
    th = ls_adapter_token_rows(ad, LS_TARGET_LM_HEAD);
    assert_int_equal(te->n, 2);
    assert_int_equal(th->n, 2);
    assert_true(te->rows[17] == fx_value(800u, 17) && th->rows[31] == fx_value(801u, 31));
    assert_int_equal(ls_adapter_info(ad).token_rows, 2);
    ls_adapter_destroy(&ad);
    fx_rmdir(&dir);

    // the tokenizer files
    const char *plain = "{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"q_proj\"]}";
    expect_added_reject(&cfg, NULL, "{\"<a>\": 32, \"<b>\": 34}", plain, NULL, 0, 0, true,
                        "has id 34 where 33 is due");
    expect_added_reject(&cfg, NULL, "{\"<b>\": 33}", plain, NULL, 0, 0, true,
                        "has id 33 where 32 is due");
    expect_added_reject(&cfg, TOKJ(", {\"id\": 32, \"content\": \"<a>\"}, {\"id\": 33, "
                        "\"content\": \"<a>\"}"), NULL, plain, NULL, 0, 0, true,
                        "\"<a>\" is given two ids");
    expect_added_reject(&cfg, TOKJ(ADD2), "{\"<a>\": 32, \"<c>\": 33}", plain, NULL, 0, 0, true,
                        "add different tokens");
    expect_added_reject(&cfg, TOKJ(", {\"id\": 32, \"content\": \"\"}"), NULL, plain, NULL, 0, 0,
                        true, "added token 32 is empty");
    expect_added_reject(&cfg, TOKJ(", {\"id\": 32, \"content\": \"\xff\"}"), NULL, plain, NULL, 0,
                        0, true, "not valid UTF-8");
    expect_added_reject(&cfg, TOKJ(", {\"id\": 32.5, \"content\": \"<a>\"}"), NULL, plain, NULL, 0,
                        0, true, "non-negative integer \"id\"");
    expect_added_reject(&cfg, "[1]", NULL, plain, NULL, 0, 0, true, "not a JSON object");
    expect_added_reject(&cfg, NULL, "{\"<a>\": \"32\"}", plain, NULL, 0, 0, true,
                        "maps to no non-negative integer id");
    {  // a count past the sanity bound
        size_t cap = (size_t)(LS_ADDED_VOCAB_MAX + 1) * 24 + 16, at = 0;
        char *big = malloc(cap);
        at += (size_t)snprintf(big + at, cap - at, "{");
        for (int i = 0; i <= LS_ADDED_VOCAB_MAX; i++)
            at += (size_t)snprintf(big + at, cap - at, "%s\"t%d\": %d", i ? ", " : "", i, 32 + i);
        snprintf(big + at, cap - at, "}");
        expect_added_reject(&cfg, NULL, big, plain, NULL, 0, 0, true, "more than 65536 added");
        free(big);
    }
    // the config and the rows
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, TCFG("[34]"), g, 1, 0, true,
                        "not one of the 2 tokens the adapter's tokenizer adds");
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, "{\"peft_type\": \"LORA\", \"r\": 4, "
                        "\"target_modules\": [\"q_proj\", \"embed_tokens\"]}", NULL, 0, 2, true,
                        "LoRA on embed_tokens beside added vocabulary");
    expect_added_reject(&tied, TOKJ(ADD2), NULL, TCFG("{\"embed_tokens\": [32], \"lm_head\": [33]}"),
                        g, 2, 0, true, "tied embeddings beside added vocabulary");
    glob_tensor_t e1[] = {{TOK_E, {1, 16}}};
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, TCFG("[32]"), e1, 1, 0, false,
                        "added token 33 (\"<b>\") has no embedding row");
    glob_tensor_t e2[] = {{TOK_E, {2, 16}}};
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, TCFG("[32, 33]"), e2, 1, 0, false,
                        "added token 32 (\"<a>\") has no lm_head row");
    glob_tensor_t pad[] = {{TOK_E, {2, 16}}, {HEAD "weight", {40, 16}}};
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, TCFG("[32, 33]"), pad, 2, 0, false,
                        "a resize padded past them is not supported");
    glob_tensor_t two[] = {{HEAD "weight", {34, 16}}, {HEAD "token_adapter.base_layer.weight", {34, 16}}};
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, plain, two, 2, 0, false, "given twice");
    expect_added_reject(&tied, TOKJ(ADD2), NULL, plain, NULL, 0, 2, false,
                        "lm_head's rows of the added tokens are input_embeddings");
    expect_added_reject(&cfg, TOKJ(ADD2), NULL, plain, NULL, 0, 3, false,
                        "(2 added tokens, hidden_size 16)");
    nan_tensor = 8;  // the resized lm_head, after the six q_proj tensors and the delta
    glob_tensor_t nan[] = {{TOK_E, {2, 16}}, {HEAD "weight", {34, 16}}};
    char *d = fx_tmpdir();  // the matrix's first value is NaN, a base row that is not read
    write_tokens(d, TCFG("[32, 33]"), nan, 2);
    fx_write_str(d, "tokenizer.json", TOKJ(ADD2));
    ad = load_ok(d, 16);
    ls_adapter_destroy(&ad);
    fx_rmdir(&d);
    nan_tensor = -1;
}

static void test_file_rejections(void **state)
{
    (void)state;
    char p[4096];
    char *dir = fx_tmpdir();
    fx_write_str(dir, "adapter_config.json", CFG(""));
    fx_write_str(dir, "adapter_model.bin", "PK");
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "adapter_model.bin");
    assert_contains(errbuf, "pickled .bin adapters are not loaded; convert to safetensors");
    remove(fx_path(p, sizeof p, dir, "adapter_model.bin"));
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "adapter_model.safetensors");
    assert_contains(errbuf, "missing");
    fx_rmdir(&dir);
    assert_null(ls_adapter_load("/nonexistent/adapter", &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "/nonexistent/adapter/adapter_config.json");

    // Added vocabulary: ids inside the base vocab (32) are the base's own; one past it needs
    // rows, which an adapter of q_proj alone does not have (test_added_vocab has the rest).
    dir = fx_tmpdir();
    adapter_t a = {.dtype = LS_DTYPE_F32};
    set_targets(&a, 1u << LS_TARGET_Q, 4);
    write_adapter(dir, CFG(""), &a);
    fx_write_str(dir, "added_tokens.json", "{\"<|im_start|>\": 30, \"<|im_end|>\": 31}");
    ls_adapter_t *ad = load_ok(dir, 16);
    ls_adapter_destroy(&ad);
    fx_write_str(dir, "added_tokens.json", "{\"<|im_start|>\": 30, \"<new>\": 32}");
    ls_adapter_info_t info;
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, &info, errbuf, sizeof errbuf), 0);
    assert_int_equal(info.added_tokens, 1);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "added token 32 (\"<new>\") has no embedding row");
    remove(fx_path(p, sizeof p, dir, "added_tokens.json"));
    fx_write_str(dir, "new_embeddings.safetensors", "x");
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "new_embeddings.safetensors");
    assert_contains(errbuf, "adds tokens past the base vocab_size 32");
    fx_rmdir(&dir);
}

static void test_tensor_rejections(void **state)
{
    (void)state;
    adapter_t a = {.dtype = LS_DTYPE_F32};
    set_targets(&a, 1u << LS_TARGET_Q, 4);
    const char *A0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

    a.extra_name = "base_model.model.model.embed_tokens.lora_embedding_A";
    expect_reject(CFG(""), &a, false, 3, "adapter_model.safetensors", a.extra_name, "does not select");
    a.extra_name = "base_model.model.lm_head.weight";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "embed_tokens/lm_head");
    a.extra_name = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "lists no tokens for this module");
    a.extra_name = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_original";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "a trainable tokens tensor other than");
    a.extra_name = "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "DoRA");
    a.extra_name = "base_model.model.model.layers.0.mlp.fc1.lora_A.weight";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "not a LoRA A/B weight");
    a.extra_name = "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "not a LoRA A/B weight");
    a.extra_name = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight";
    expect_reject(CFG(""), &a, false, 2, a.extra_name, "does not select");
    a.extra_name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight";
    a.extra_shape[0] = 4;
    a.extra_shape[1] = 16;
    expect_reject(CFG(""), &a, false, 2, "self_attn.q_proj.lora_A", "given twice");
    a.extra_name = NULL;

    // The adapter's rank differs from the config's: the message names the tensor and both.
    set_targets(&a, 1u << LS_TARGET_Q, 3);
    expect_reject(CFG(""), &a, false, 4, A0, "[3, 16]", "[4, 16]", "rank 4");
    // Shapes that do not fit the base: a k_proj adapter written for q_proj dims.
    set_targets(&a, 1u << LS_TARGET_Q, 4);
    expect_reject("{\"peft_type\": \"LORA\", \"r\": 4, \"target_modules\": [\"k_proj\"]}", &a,
                  false, 2, A0, "does not select");

    // Unpaired A/B, NaN and Inf, each naming the module or tensor.
    char *dir = fx_tmpdir();
    char p[4096];
    write_adapter(dir, CFG(""), &a);
    ls_st_t *st = ls_st_open(fx_path(p, sizeof p, dir, "adapter_model.safetensors"), errbuf,
                             sizeof errbuf);
    size_t n = ls_st_count(st);
    ls_st_write_tensor_t *t = calloc(n, sizeof *t);
    float *data[16];
    for (size_t i = 0; i < n; i++) {
        const ls_st_tensor_t *x = ls_st_at(st, i);
        data[i] = malloc(x->nbytes);
        ls_st_tensor_to_f32(x, data[i]);
        t[i] = (ls_st_write_tensor_t){.name = strdup(x->name), .dtype = LS_DTYPE_F32,
                                      .ndim = x->ndim, .data = data[i]};
        memcpy(t[i].shape, x->shape, sizeof x->shape);
    }
    ls_st_destroy(&st);
    char B1[128];
    snprintf(B1, sizeof B1, "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight");
    size_t ib = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, B1) == 0)
            ib = i;
    ls_st_write_tensor_t saved = t[ib];
    t[ib] = t[n - 1];
    assert_int_equal(ls_st_write(p, t, n - 1, errbuf, sizeof errbuf), 0);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "model.layers.1.self_attn.q_proj");
    assert_contains(errbuf, "lora_B weight is missing");
    t[n - 1] = t[ib];
    t[ib] = saved;
    data[ib][5] = NAN;
    assert_int_equal(ls_st_write(p, t, n, errbuf, sizeof errbuf), 0);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, B1);
    assert_contains(errbuf, "NaN or infinite");
    data[ib][5] = INFINITY;
    assert_int_equal(ls_st_write(p, t, n, errbuf, sizeof errbuf), 0);
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "NaN or infinite");
    data[ib][5] = 0.5f;
    assert_int_equal(ls_st_write(p, t, n, errbuf, sizeof errbuf), 0);
    ls_adapter_t *ad = load_ok(dir, 16);
    assert_true(ls_adapter_layer_target(ad, 1, LS_TARGET_Q)->B[5] == 0.5f);
    ls_adapter_destroy(&ad);
    for (size_t i = 0; i < n; i++) {
        free((char *)t[i].name);
        free(data[i]);
    }
    free(t);
    fx_rmdir(&dir);
}

// The files of an adapter directory, not only the directory, are confined (ls_file.h): links
// out of it, FIFOs and huge files are refused, by the registry's check and by the loader, and
// at once (main's alarm turns a blocked open into a failure).
static void test_hostile_files(void **state)
{
    (void)state;
    char p[4096], q[4096];
    adapter_t a = {.dtype = LS_DTYPE_F32};
    set_targets(&a, 1u << LS_TARGET_Q, 4);
    char *outside = fx_tmpdir();
    write_adapter(outside, CFG(""), &a);
    // Both files are links to a valid adapter outside the directory.
    char *dir = fx_tmpdir();
    for (int i = 0; i < 2; i++) {
        const char *name = i ? "adapter_model.safetensors" : "adapter_config.json";
        assert_int_equal(symlink(fx_path(q, sizeof q, outside, name), fx_path(p, sizeof p, dir, name)), 0);
    }
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "adapter_config.json: \"adapter_config.json\" is a symbolic link");
    // Only the weights are a link: the registry's check refuses it before a worker opens it.
    unlink(fx_path(p, sizeof p, dir, "adapter_config.json"));
    fx_write_str(dir, "adapter_config.json", CFG(""));
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "adapter_model.safetensors\" is a symbolic link");
    assert_null(ls_adapter_load(dir, &cfg, 16, errbuf, sizeof errbuf));
    assert_contains(errbuf, "is a symbolic link");
    // A link to /etc/shadow reveals nothing about it.
    unlink(fx_path(p, sizeof p, dir, "adapter_config.json"));
    assert_int_equal(symlink("/etc/shadow", p), 0);
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "is a symbolic link");
    unlink(p);
    // A FIFO named adapter_config.json: refused without waiting for a writer.
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "adapter_config.json: is a FIFO; only regular files are read");
    unlink(p);
    // A huge (sparse) config is refused by its size, before a byte is read.
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)1 << 40), 0);
    close(fd);
    assert_int_equal(ls_adapter_config_read(dir, &cfg, 16, NULL, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "larger than the 16777216-byte limit");
    fx_rmdir(&dir);
    fx_rmdir(&outside);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_targets),
        cmocka_unit_test(test_full_names_and_defaults),
        cmocka_unit_test(test_regex_targets),
        cmocka_unit_test(test_patterns_and_rslora),
        cmocka_unit_test(test_config_rejections),
        cmocka_unit_test(test_embed_and_lm_head),
        cmocka_unit_test(test_trainable_tokens),
        cmocka_unit_test(test_added_vocab),
        cmocka_unit_test(test_file_rejections),
        cmocka_unit_test(test_tensor_rejections),
        cmocka_unit_test(test_hostile_files),
    };
    alarm(60);  // a blocked open is a failure, not a stuck CI job
    return cmocka_run_group_tests(tests, setup, NULL);
}
