/*  fuzz_adapter_config.c — libFuzzer target for adapter_config.json (formats/peft.c): the input
    is the config of an adapter directory whose adapter_model.safetensors holds rank-4 q_proj
    and v_proj weights for a tiny Llama. Refused with a reason, or the adapter validates and
    then loads (or is refused with a reason: the weights need not fit what the config says).
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "peft.h"
#include "safetensors.h"

#define S_LAYERS 2
#define S_RANK 4

static ls_model_config_t s_cfg;

//  The tiny base model and the adapter's weights, once.
static void s_setup(void) {
    static const char cfg[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 16, \"intermediate_size\": 24, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": "
        "32}";
    char err[512], path[128];
    if (ls_model_config_parse(cfg, sizeof cfg - 1, "config.json", &s_cfg, err, sizeof err) != 0)
        s_die(err);
    static float values[64 * 16];
    for (size_t i = 0; i < sizeof values / sizeof *values; i++)
        values[i] = (float)i / 1000.0f;
    static char names[S_LAYERS * 4][96];
    ls_st_write_tensor_t t[S_LAYERS * 4];
    size_t n = 0;
    const ls_target_t targets[] = {LS_TARGET_Q, LS_TARGET_V};
    for (int l = 0; l < S_LAYERS; l++)
        for (int k = 0; k < 2; k++)
            for (int which = 0; which < 2; which++) {
                int in, out;
                ls_model_config_target_dims(&s_cfg, targets[k], &in, &out);
                snprintf(names[n], sizeof names[n], "base_model.model.model.layers.%d.%s.%s.lora_%c.weight",
                         l, ls_target_parent(targets[k]), ls_target_name(targets[k]), which ? 'B' : 'A');
                t[n] = (ls_st_write_tensor_t){.name = names[n],
                                              .dtype = LS_DTYPE_F32,
                                              .ndim = 2,
                                              .shape = {which ? out : S_RANK, which ? S_RANK : in},
                                              .data = values};
                n++;
            }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", s_scratch_dir());
    if (ls_st_write(path, t, n, err, sizeof err) != 0)
        s_die(err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!s_cfg.num_hidden_layers)
        s_setup();
    char path[128], err[512] = "";
    s_scratch_write("adapter_config.json", data, size, path, sizeof path);
    ls_adapter_info_t info;
    if (ls_adapter_config_read(s_scratch_dir(), &s_cfg, 64, &info, err, sizeof err) != 0) {
        if (!err[0])
            s_die("refused without a reason");
        return 0;
    }
    if (info.max_rank < 1 || info.max_rank > 64 || !info.target_mask)
        s_die("a valid config with no rank or no target");
    err[0] = 0;
    ls_adapter_t *a = ls_adapter_load(s_scratch_dir(), &s_cfg, 64, err, sizeof err);
    if (!a && !err[0])
        s_die("load refused without a reason");
    ls_adapter_destroy(&a);
    return 0;
}
