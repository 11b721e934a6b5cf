// config.json parsing for every supported architecture, rope scaling, eos lists, bad values,
// target dimensions, and the checkpoint tensor check.
#include "fixtures.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "model_config.h"

static char errbuf[1024];


static int parse(const char *json, ls_model_config_t *cfg)
{
    errbuf[0] = '\0';
    return ls_model_config_parse(json, strlen(json), "config.json", cfg, errbuf, sizeof errbuf);
}

static const char *LLAMA31 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
    "\"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009], "
    "\"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 14336, "
    "\"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\", "
    "\"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, "
    "\"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, "
    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, "
    "\"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, "
    "\"torch_dtype\": \"bfloat16\", \"vocab_size\": 128256}";

static void test_llama31(void **state)
{
    (void)state;
    ls_model_config_t c;
    assert_int_equal(parse(LLAMA31, &c), 0);
    assert_int_equal(c.arch, LS_ARCH_LLAMA);
    assert_string_equal(ls_arch_name(c.arch), "LlamaForCausalLM");
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.intermediate_size, 14336);
    assert_int_equal(c.num_hidden_layers, 32);
    assert_int_equal(c.num_attention_heads, 32);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.rope_scaling.type, LS_ROPE_SCALING_LLAMA3);
    assert_true(c.rope_scaling.factor == 8.0);
    assert_true(c.rope_scaling.low_freq_factor == 1.0);
    assert_true(c.rope_scaling.high_freq_factor == 4.0);
    assert_int_equal(c.rope_scaling.original_max_position_embeddings, 8192);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.n_eos_token_ids, 3);
    assert_int_equal(c.eos_token_ids[0], 128001);
    assert_int_equal(c.eos_token_ids[2], 128009);
    assert_int_equal(c.torch_dtype, LS_DTYPE_BF16);
    assert_false(c.attn_qkv_bias);
    assert_false(c.attn_o_bias);
    assert_false(c.mlp_bias);
    assert_false(c.qk_norm);
    assert_int_equal(c.sliding_window, 0);
    int in, out;
    ls_model_config_target_dims(&c, LS_TARGET_Q, &in, &out);
    assert_true(in == 4096 && out == 4096);
    ls_model_config_target_dims(&c, LS_TARGET_K, &in, &out);
    assert_true(in == 4096 && out == 1024);
    ls_model_config_target_dims(&c, LS_TARGET_V, &in, &out);
    assert_true(in == 4096 && out == 1024);
    ls_model_config_target_dims(&c, LS_TARGET_O, &in, &out);
    assert_true(in == 4096 && out == 4096);
    ls_model_config_target_dims(&c, LS_TARGET_GATE, &in, &out);
    assert_true(in == 4096 && out == 14336);
    ls_model_config_target_dims(&c, LS_TARGET_UP, &in, &out);
    assert_true(in == 4096 && out == 14336);
    ls_model_config_target_dims(&c, LS_TARGET_DOWN, &in, &out);
    assert_true(in == 14336 && out == 4096);
    // 3 globals + 32 layers x 9 tensors.
    assert_int_equal(ls_model_config_weight_count(&c), 3 + 32 * 9);
}

static void test_qwen2(void **state)
{
    (void)state;
    ls_model_config_t c;
    assert_int_equal(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], \"bos_token_id\": 151643, "
                           "\"eos_token_id\": 151645, \"hidden_size\": 896, "
                           "\"intermediate_size\": 4864, \"max_position_embeddings\": 32768, "
                           "\"max_window_layers\": 21, \"num_attention_heads\": 14, "
                           "\"num_hidden_layers\": 24, \"num_key_value_heads\": 2, "
                           "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, "
                           "\"sliding_window\": 131072, \"tie_word_embeddings\": true, "
                           "\"torch_dtype\": \"bfloat16\", \"use_sliding_window\": false, "
                           "\"vocab_size\": 151936, \"rope_scaling\": null}",
                           &c), 0);
    assert_int_equal(c.arch, LS_ARCH_QWEN2);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.attn_qkv_bias);
    assert_false(c.attn_o_bias);
    assert_true(c.tie_word_embeddings);
    assert_int_equal(c.n_eos_token_ids, 1);
    assert_int_equal(c.eos_token_ids[0], 151645);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.rope_scaling.type, LS_ROPE_SCALING_NONE);
    // Tied: no lm_head; q/k/v biases per layer.
    assert_int_equal(ls_model_config_weight_count(&c), 2 + 24 * 12);
    bool saw_bias = false, saw_head = false;
    for (size_t i = 0; i < ls_model_config_weight_count(&c); i++) {
        ls_weight_spec_t s;
        assert_int_equal(ls_model_config_weight_spec(&c, i, &s), 0);
        saw_head |= strcmp(s.name, "lm_head.weight") == 0;
        if (strcmp(s.name, "model.layers.23.self_attn.k_proj.bias") == 0) {
            saw_bias = true;
            assert_int_equal(s.ndim, 1);
            assert_int_equal(s.shape[0], 128);
            assert_int_equal(s.role, LS_W_K_BIAS);
            assert_int_equal(s.layer, 23);
        }
    }
    assert_true(saw_bias);
    assert_false(saw_head);
    ls_weight_spec_t s;
    assert_int_equal(ls_model_config_weight_spec(&c, ls_model_config_weight_count(&c), &s), -1);
}

static void test_qwen3(void **state)
{
    (void)state;
    ls_model_config_t c;
    assert_int_equal(parse("{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, "
                           "\"head_dim\": 128, \"hidden_size\": 1024, \"intermediate_size\": 3072, "
                           "\"num_attention_heads\": 16, \"num_hidden_layers\": 28, "
                           "\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06, "
                           "\"rope_theta\": 1000000, \"tie_word_embeddings\": true, "
                           "\"eos_token_id\": 151645, \"vocab_size\": 151936, "
                           "\"torch_dtype\": \"bfloat16\", \"sliding_window\": null, "
                           "\"use_sliding_window\": false}",
                           &c), 0);
    assert_int_equal(c.arch, LS_ARCH_QWEN3);
    assert_int_equal(c.head_dim, 128);
    assert_true(c.qk_norm);
    assert_false(c.attn_qkv_bias);
    assert_int_equal(c.max_position_embeddings, 32768);  // HF default
    assert_int_equal(c.bos_token_id, -1);
    int in, out;
    ls_model_config_target_dims(&c, LS_TARGET_Q, &in, &out);
    assert_true(in == 1024 && out == 2048);  // heads * head_dim, not hidden
    ls_model_config_target_dims(&c, LS_TARGET_O, &in, &out);
    assert_true(in == 2048 && out == 1024);
    ls_model_config_target_dims(&c, LS_TARGET_K, &in, &out);
    assert_true(in == 1024 && out == 1024);
    bool saw = false;
    for (size_t i = 0; i < ls_model_config_weight_count(&c); i++) {
        ls_weight_spec_t s;
        ls_model_config_weight_spec(&c, i, &s);
        if (strcmp(s.name, "model.layers.0.self_attn.q_norm.weight") == 0) {
            saw = true;
            assert_int_equal(s.shape[0], 128);
        }
    }
    assert_true(saw);
}

static void test_mistral_and_variants(void **state)
{
    (void)state;
    ls_model_config_t c;
    const char *m = "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 4096, "
                    "\"intermediate_size\": 14336, \"num_attention_heads\": 32, "
                    "\"num_hidden_layers\": 32, \"num_key_value_heads\": 8, "
                    "\"sliding_window\": 4096, \"vocab_size\": 32000, \"bos_token_id\": 1, "
                    "\"eos_token_id\": 2, \"torch_dtype\": \"float16\"}";
    assert_int_equal(parse(m, &c), 0);
    assert_int_equal(c.arch, LS_ARCH_MISTRAL);
    assert_int_equal(c.sliding_window, 4096);
    assert_int_equal(c.torch_dtype, LS_DTYPE_F16);
    assert_true(c.rope_theta == 10000.0);  // default
    assert_true(c.rms_norm_eps == 1e-6);   // default
    assert_int_equal(parse("{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 2, \"sliding_window\": null, "
                           "\"vocab_size\": 100, \"head_dim\": 32}",
                           &c), 0);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.num_key_value_heads, 4);  // defaults to heads
    assert_int_equal(c.head_dim, 32);            // explicit (Mistral-Nemo style)
    assert_int_equal(c.torch_dtype, LS_DTYPE_F32);
    assert_int_equal(c.n_eos_token_ids, 0);

    // Linear scaling; and Llama with attention/mlp bias adds o and mlp biases.
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 100, "
                           "\"attention_bias\": true, \"mlp_bias\": true, "
                           "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}",
                           &c), 0);
    assert_int_equal(c.rope_scaling.type, LS_ROPE_SCALING_LINEAR);
    assert_true(c.rope_scaling.factor == 2.0);
    assert_true(c.attn_qkv_bias && c.attn_o_bias && c.mlp_bias);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(ls_model_config_weight_count(&c), 3 + 1 * (9 + 4 + 3));

    // transformers >= 5 writes rope_parameters with rope_theta inside.
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 100, \"dtype\": \"bfloat16\", "
                           "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, "
                           "\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                           "\"original_max_position_embeddings\": 8192}}",
                           &c), 0);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.rope_scaling.type, LS_ROPE_SCALING_LLAMA3);
    assert_true(c.rope_scaling.factor == 32.0);
    assert_int_equal(c.torch_dtype, LS_DTYPE_BF16);
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 1, \"vocab_size\": 100, "
                           "\"rope_scaling\": {\"rope_type\": \"default\"}}",
                           &c), 0);
    assert_int_equal(c.rope_scaling.type, LS_ROPE_SCALING_NONE);
}

// A valid small Llama config with one key's JSON text replaced (or added) by kv.
static void expect_bad(const char *kv, const char *frag1, const char *frag2)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
             "\"intermediate_size\": 128, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
             "\"vocab_size\": 100, %s}", kv);
    ls_model_config_t c;
    if (parse(json, &c) == 0)
        fail_msg("accepted %s", kv);
    assert_contains(errbuf, "config.json");
    assert_contains(errbuf, frag1);
    if (frag2)
        assert_contains(errbuf, frag2);
}

static void test_bad_values(void **state)
{
    (void)state;
    ls_model_config_t c;
    assert_int_equal(parse("{\"architectures\": [\"GPT2LMHeadModel\"], \"hidden_size\": 64}", &c), -1);
    assert_contains(errbuf, "config.json");
    assert_contains(errbuf, "\"GPT2LMHeadModel\" is not supported");
    assert_int_equal(parse("{\"hidden_size\": 64}", &c), -1);
    assert_contains(errbuf, "architectures");
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"]", &c), -1);
    assert_contains(errbuf, "not valid JSON");
    assert_int_equal(parse("[1]", &c), -1);
    assert_contains(errbuf, "not a JSON object");
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
                           "\"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
                           "\"vocab_size\": 100}", &c), -1);
    assert_contains(errbuf, "\"intermediate_size\" is missing");
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 0, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 2, \"vocab_size\": 100}", &c), -1);
    assert_contains(errbuf, "\"hidden_size\" must be an integer in [1,");

    expect_bad("\"num_key_value_heads\": 0", "num_key_value_heads", "integer in [1,");
    expect_bad("\"num_key_value_heads\": 3", "num_key_value_heads", "does not divide");
    expect_bad("\"num_key_value_heads\": -2", "num_key_value_heads", "integer");
    expect_bad("\"rms_norm_eps\": -1", "rms_norm_eps", "positive");
    expect_bad("\"rope_theta\": \"big\"", "rope_theta", "positive");
    expect_bad("\"max_position_embeddings\": 1.5", "max_position_embeddings", "integer");
    expect_bad("\"tie_word_embeddings\": 1", "tie_word_embeddings", "true or false");
    expect_bad("\"hidden_act\": \"gelu\"", "hidden_act", "silu");
    expect_bad("\"torch_dtype\": \"int8\"", "torch_dtype", NULL);
    expect_bad("\"eos_token_id\": [1,2,3,4,5,6,7,8,9]", "eos_token_id", NULL);
    expect_bad("\"eos_token_id\": \"</s>\"", "eos_token_id", NULL);
    expect_bad("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "rope_scaling",
               "\"yarn\" is not supported");
    expect_bad("\"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0, "
               "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
               "\"rope_scaling\": \"factor\" is missing", NULL);
    expect_bad("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": "
               "4.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}",
               "high_freq_factor", NULL);
    expect_bad("\"rope_scaling\": {\"type\": \"linear\"}", "factor", "missing");
    expect_bad("\"rope_scaling\": 3", "rope_scaling", "object");

    // Heads must divide hidden when head_dim is implicit.
    assert_int_equal(parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 66, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 2, \"vocab_size\": 100}", &c), -1);
    assert_contains(errbuf, "does not divide \"hidden_size\"");
    assert_int_equal(parse("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64, "
                           "\"intermediate_size\": 128, \"num_attention_heads\": 4, "
                           "\"num_hidden_layers\": 2, \"vocab_size\": 100, "
                           "\"use_sliding_window\": true}", &c), -1);
    assert_contains(errbuf, "use_sliding_window");

    assert_int_equal(ls_model_config_load("/nonexistent/dir", &c, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "/nonexistent/dir");
}

static void test_load_and_check_weights(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    fx_write_str(dir, "config.json",
                 "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 16, "
                 "\"intermediate_size\": 24, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
                 "\"num_key_value_heads\": 2, \"vocab_size\": 32, \"tie_word_embeddings\": false}");
    ls_model_config_t c;
    if (ls_model_config_load(dir, &c, errbuf, sizeof errbuf) != 0)
        fail_msg("%s", errbuf);
    size_t n = ls_model_config_weight_count(&c);
    ls_weight_spec_t *specs = calloc(n, sizeof *specs);
    ls_st_write_tensor_t *t = calloc(n, sizeof *t);
    static uint16_t zeros[32 * 24];
    for (size_t i = 0; i < n; i++) {
        ls_model_config_weight_spec(&c, i, &specs[i]);
        t[i] = (ls_st_write_tensor_t){.name = specs[i].name, .dtype = LS_DTYPE_BF16,
                                      .ndim = specs[i].ndim, .data = zeros};
        t[i].shape[0] = specs[i].shape[0];
        t[i].shape[1] = specs[i].shape[1];
    }
    char p[4096];
    fx_path(p, sizeof p, dir, "model.safetensors");
    assert_int_equal(ls_st_write(p, t, n, errbuf, sizeof errbuf), 0);
    ls_st_t *st = ls_st_open(dir, errbuf, sizeof errbuf);
    assert_non_null(st);
    if (ls_model_config_check_weights(&c, st, errbuf, sizeof errbuf) != 0)
        fail_msg("%s", errbuf);
    ls_st_destroy(&st);

    // Drop one tensor: the error names it.
    size_t drop = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, "model.layers.1.self_attn.v_proj.bias") == 0)
            drop = i;
    t[drop] = t[n - 1];
    assert_int_equal(ls_st_write(p, t, n - 1, errbuf, sizeof errbuf), 0);
    st = ls_st_open(dir, errbuf, sizeof errbuf);
    assert_int_equal(ls_model_config_check_weights(&c, st, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "\"model.layers.1.self_attn.v_proj.bias\" is missing");
    assert_contains(errbuf, dir);
    ls_st_destroy(&st);

    // Wrong shape: the error names the tensor and both shapes.
    for (size_t i = 0; i < n; i++)
        ls_model_config_weight_spec(&c, i, &specs[i]);
    for (size_t i = 0; i < n; i++) {
        t[i].name = specs[i].name;
        t[i].ndim = specs[i].ndim;
        t[i].shape[0] = specs[i].shape[0];
        t[i].shape[1] = specs[i].shape[1];
        if (strcmp(specs[i].name, "model.layers.0.mlp.down_proj.weight") == 0)
            t[i].shape[1] = 16;
    }
    assert_int_equal(ls_st_write(p, t, n, errbuf, sizeof errbuf), 0);
    st = ls_st_open(dir, errbuf, sizeof errbuf);
    assert_int_equal(ls_model_config_check_weights(&c, st, errbuf, sizeof errbuf), -1);
    assert_contains(errbuf, "model.safetensors");
    assert_contains(errbuf, "\"model.layers.0.mlp.down_proj.weight\"");
    assert_contains(errbuf, "[16, 16]");
    assert_contains(errbuf, "[16, 24]");
    ls_st_destroy(&st);
    free(specs);
    free(t);
    fx_rmdir(&dir);
}

static void test_target_names(void **state)
{
    (void)state;
    for (int t = 0; t < LS_TARGET_COUNT; t++)
        assert_int_equal(ls_target_from_name(ls_target_name((ls_target_t)t)), t);
    assert_int_equal(ls_target_from_name("fc1"), -1);
    assert_string_equal(ls_target_parent(LS_TARGET_O), "self_attn");
    assert_string_equal(ls_target_parent(LS_TARGET_GATE), "mlp");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_mistral_and_variants),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_load_and_check_weights),
        cmocka_unit_test(test_target_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
