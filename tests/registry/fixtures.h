// Registry test fixtures: a private temporary directory, a tiny base model config.json and
// PEFT adapter directories (adapter_config.json + a tiny adapter_model.safetensors) written at
// run time. Header-only so each test stays one source file.
#ifndef LS_TESTS_REGISTRY_FIXTURES_H
#define LS_TESTS_REGISTRY_FIXTURES_H

#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"
#include "test_util.h"

static inline int fx_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static inline void fx_rmdir(const char *dir) { nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS); }

// Short on purpose: ipc:// socket paths live here too (about 107 characters at most).
static inline void fx_tmpdir(char *out, size_t cap) {
    snprintf(out, cap, "/tmp/ls-reg-XXXXXX");
    if (!mkdtemp(out)) {
        perror("mkdtemp");
        abort();  // no directory, no test
    }
}

static inline void fx_write(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

static inline void fx_mkdir(const char *path) {
    if (mkdir(path, 0755) < 0 && errno != EEXIST) {
        perror(path);
        abort();
    }
}

// Tiny Llama: hidden 16, 4 heads of 4, 2 kv heads, 2 layers, vocabulary 32.
#define FX_MODEL_JSON                                                                                    \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 16, \"intermediate_size\": 24, "    \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 32}"

// DIR/config.json of the tiny model; DIR is created.
static inline void fx_model(const char *dir) {
    char p[512];
    fx_mkdir(dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    fx_write(p, FX_MODEL_JSON);
}

// The adapter_config.json of a rank-r LoRA on the given JSON list of targets, plus `extra`
// (more keys, with a leading comma) — e.g. ", \"use_dora\": true".
static inline const char *fx_config(char *out, size_t cap, int r, const char *targets, const char *extra) {
    snprintf(out, cap,
             "{\"peft_type\": \"LORA\", \"task_type\": \"CAUSAL_LM\", \"r\": %d, \"lora_alpha\": %d, "
             "\"target_modules\": %s, \"bias\": \"none\"%s}",
             r, 2 * r, targets, extra ? extra : "");
    return out;
}

// DIR (created) as a PEFT adapter directory with that config and a one-tensor weights file:
// the registry's checks never read weights, the workers do.
static inline void fx_adapter(const char *dir, const char *config) {
    char p[512];
    fx_mkdir(dir);
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    fx_write(p, config);
    static const float a[4 * 16];
    ls_st_write_tensor_t t = {.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                              .dtype = LS_DTYPE_F32, .ndim = 2, .shape = {4, 16}, .data = a};
    char err[256];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    if (ls_st_write(p, &t, 1, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
}

// A good rank-4 adapter on q_proj and v_proj at DIR.
static inline void fx_adapter_ok(const char *dir) {
    char cfg[512];
    fx_adapter(dir, fx_config(cfg, sizeof cfg, 4, "[\"q_proj\", \"v_proj\"]", NULL));
}

#endif
