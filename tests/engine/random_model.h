// Random tiny HF models and PEFT adapters, written with ls_st_write, for the engine's
// self-consistency tests and bench/. Header-only (static functions) like fixtures.h.
//
// Values are deterministic functions of (seed, tensor index, element index), scaled so
// that activations stay O(1) through the layers and logits come out O(1-10): projection
// weights ~ U(-1, 1)·1.7/sqrt(in) (unit variance per output), norms 1 ± 0.1, biases
// ± 0.05, embeddings ~ U(-1, 1).
#ifndef LS_TESTS_ENGINE_RANDOM_MODEL_H
#define LS_TESTS_ENGINE_RANDOM_MODEL_H

#include "fixtures.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>

#include "ls_limits.h"
#include "model_config.h"
#include "peft.h"
#include "safetensors.h"

typedef struct {
    ls_arch_t arch;
    int hidden, inter, layers, heads, kv_heads, head_dim, vocab;  // head_dim 0: hidden/heads
    bool tied;
    int sliding_window;  // Mistral only; 0: none
    ls_dtype_t dtype;
    bool sharded;        // two shards and model.safetensors.index.json
    unsigned seed;
} rm_spec_t;

static inline const ls_target_t *rm_role_target(ls_weight_role_t role)
{
    static const ls_target_t t[] = {LS_TARGET_Q, LS_TARGET_K, LS_TARGET_V, LS_TARGET_O,
                                    LS_TARGET_GATE, LS_TARGET_UP, LS_TARGET_DOWN};
    switch (role) {
    case LS_W_Q: return &t[0];
    case LS_W_K: return &t[1];
    case LS_W_V: return &t[2];
    case LS_W_O: return &t[3];
    case LS_W_GATE: return &t[4];
    case LS_W_UP: return &t[5];
    case LS_W_DOWN: return &t[6];
    default: return NULL;
    }
}

static inline float rm_weight_value(const ls_weight_spec_t *ws, unsigned seed, size_t k, size_t i)
{
    float v = fx_value(seed * 7919u + (unsigned)k * 31u + 1u, i);
    switch (ws->role) {
    case LS_W_ATTN_NORM: case LS_W_MLP_NORM: case LS_W_FINAL_NORM:
    case LS_W_Q_NORM: case LS_W_K_NORM:
        return 1.0f + 0.1f * v;
    case LS_W_Q_BIAS: case LS_W_K_BIAS: case LS_W_V_BIAS: case LS_W_O_BIAS:
    case LS_W_GATE_BIAS: case LS_W_UP_BIAS: case LS_W_DOWN_BIAS:
        return 0.05f * v;
    case LS_W_EMBED:
        return v;
    default:  // (out, in) projections and lm_head
        return v * 1.7f / sqrtf((float)ws->shape[1]);
    }
}

// Replaces the rows tr->ids of f (a (vocab, hidden) table) with tr->rows: an adapter's
// trainable tokens merged into the embedding or lm_head (PEFT's index_copy).
static inline void rm_merge_token_rows(float *f, const ls_token_rows_t *tr, size_t hidden)
{
    for (int k = 0; k < tr->n; k++)
        memcpy(f + (size_t)tr->ids[k] * hidden, tr->rows + (size_t)k * hidden, hidden * sizeof *f);
}

// Writes config.json and the weights into dir (which exists). With n_merge > 0 the seven
// target weights become W + Σ_i w_i·scaling_i·B_i·A_i of adapters merge[i] at weights w[i]
// (a mix's dense form, docs/lora-mixing.md), and the embedding and lm_head likewise, computed
// in double and rounded once (the dense reference of a LoRA forward); use dtype F32 and an
// untied model then. An adapter's trainable tokens replace their rows of the embedding and
// lm_head (one adapter, at weight 1; tied, the one table takes the embedding's, which must
// then be lm_head's too); its added ids (added vocabulary, at or past sp->vocab) make the
// model's vocabulary that much larger, the base rows unchanged below sp->vocab (the resized
// model a PEFT adapter with added tokens runs on). 0 or -1.
static inline int rm_write_model_mix(const char *dir, const rm_spec_t *sp,
                                     const ls_adapter_t *const *merge, const float *w,
                                     int n_merge)
{
    static const char *arch[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                 "MistralForCausalLM"};
    char extra[512] = "", json[2048];
    if (sp->arch == LS_ARCH_LLAMA)  // llama3 scaling with a short original context, so that
                                    // it changes some frequencies of the tiny head_dim
        snprintf(extra, sizeof extra, ", \"rope_scaling\": {\"rope_type\": \"llama3\", "
                 "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                 "\"original_max_position_embeddings\": 64}");
    if (sp->arch == LS_ARCH_MISTRAL && sp->sliding_window)
        snprintf(extra, sizeof extra, ", \"sliding_window\": %d", sp->sliding_window);
    int hd = sp->head_dim ? sp->head_dim : sp->hidden / sp->heads, vocab = sp->vocab;
    for (int m = 0; m < n_merge; m++)
        for (int g = 0; g < 2; g++) {
            const ls_token_rows_t *tr = ls_adapter_token_rows(merge[m], g ? LS_TARGET_LM_HEAD
                                                                          : LS_TARGET_EMBED);
            for (int k = 0; k < tr->n; k++)
                vocab = tr->ids[k] >= vocab ? tr->ids[k] + 1 : vocab;
        }
    snprintf(json, sizeof json,
             "{\"architectures\": [\"%s\"], \"hidden_size\": %d, \"intermediate_size\": %d, "
             "\"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
             "\"num_key_value_heads\": %d, \"head_dim\": %d, \"vocab_size\": %d, "
             "\"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-5, "
             "\"rope_theta\": 10000.0, \"tie_word_embeddings\": %s, \"hidden_act\": \"silu\", "
             "\"torch_dtype\": \"%s\"%s}",
             arch[sp->arch], sp->hidden, sp->inter, sp->layers, sp->heads, sp->kv_heads, hd,
             vocab, sp->tied ? "true" : "false",
             sp->dtype == LS_DTYPE_BF16 ? "bfloat16" : sp->dtype == LS_DTYPE_F16 ? "float16"
                                                                               : "float32",
             extra);
    if (fx_write_str(dir, "config.json", json) != 0)
        return -1;
    ls_model_config_t cfg;
    char err[256];
    if (ls_model_config_load(dir, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "rm_write_model: %s\n", err);
        return -1;
    }
    size_t n = ls_model_config_weight_count(&cfg);
    ls_st_write_tensor_t *t = calloc(n, sizeof *t);
    ls_weight_spec_t *ws = calloc(n, sizeof *ws);
    void **data = calloc(n, sizeof *data);
    int rc = t && ws && data ? 0 : -1;
    for (size_t k = 0; rc == 0 && k < n; k++) {
        ls_model_config_weight_spec(&cfg, k, &ws[k]);
        size_t numel = (size_t)ws[k].shape[0] * (ws[k].ndim == 2 ? (size_t)ws[k].shape[1] : 1);
        float *f = malloc(numel * sizeof *f);
        data[k] = f;
        if (!f) {
            rc = -1;
            break;
        }
        for (size_t i = 0; i < numel; i++)
            f[i] = rm_weight_value(&ws[k], sp->seed, k, i);
        const ls_target_t *tg = rm_role_target(ws[k].role);
        bool global = ws[k].role == LS_W_EMBED || ws[k].role == LS_W_LM_HEAD;
        const ls_lora_weights_t *lw[LS_LORA_MIX_MAX] = {NULL};
        bool any = false;
        assert(n_merge <= LS_LORA_MIX_MAX);
        for (int m = 0; m < n_merge && (tg || global); m++) {
            lw[m] = global ? ls_adapter_global_target(merge[m], ws[k].role == LS_W_EMBED
                                                                    ? LS_TARGET_EMBED
                                                                    : LS_TARGET_LM_HEAD)
                           : ls_adapter_layer_target(merge[m], ws[k].layer, *tg);
            any = any || lw[m]->rank;
        }
        // both globals are (vocab, hidden): lm_head's W + s·B·A as a projection's, the
        // embedding's table + s·(B·A)ᵀ (an untied model: tied, the one table would get both)
        size_t out = (size_t)ws[k].shape[0], in = ws[k].ndim == 2 ? (size_t)ws[k].shape[1] : 1;
        for (size_t o = 0; any && o < out; o++)
            for (size_t i = 0; i < in; i++) {
                double acc = f[o * in + i];
                for (int m = 0; m < n_merge; m++) {
                    double d = 0;
                    for (int j = 0; j < lw[m]->rank; j++)
                        d += ws[k].role == LS_W_EMBED
                                 ? (double)lw[m]->B[i * lw[m]->rank + j] * lw[m]->A[(size_t)j * out + o]
                                 : (double)lw[m]->B[o * lw[m]->rank + j] * lw[m]->A[(size_t)j * in + i];
                    acc += (double)w[m] * lw[m]->scaling * d;
                }
                f[o * in + i] = (float)acc;
            }
        for (int m = 0; m < n_merge && global; m++) {
            bool head = ws[k].role == LS_W_LM_HEAD;
            const ls_token_rows_t *tr = ls_adapter_token_rows(merge[m], head ? LS_TARGET_LM_HEAD
                                                                             : LS_TARGET_EMBED);
            assert(tr->n == 0 || (n_merge == 1 && w[0] == 1.0f));
            assert(!sp->tied || head ||
                   ls_adapter_token_rows(merge[m], LS_TARGET_LM_HEAD)->rows == tr->rows);
            rm_merge_token_rows(f, tr, in);
        }
        if (sp->dtype != LS_DTYPE_F32) {  // narrow in place: 2-byte values fit the floats
            uint16_t *h = (uint16_t *)f;
            for (size_t i = 0; i < numel; i++)
                h[i] = sp->dtype == LS_DTYPE_BF16 ? ls_bf16_from_f32(f[i]) : ls_f16_from_f32(f[i]);
        }
        t[k] = (ls_st_write_tensor_t){ws[k].name, sp->dtype, ws[k].ndim,
                                      {ws[k].shape[0], ws[k].shape[1]}, f};
    }
    char path[4096];
    if (rc == 0 && !sp->sharded) {
        rc = ls_st_write(fx_path(path, sizeof path, dir, "model.safetensors"), t, n, err,
                         sizeof err);
    } else if (rc == 0) {
        // globals and even layers in shard 1, odd layers in shard 2
        ls_st_write_tensor_t *sh[2] = {calloc(n, sizeof *t), calloc(n, sizeof *t)};
        size_t cnt[2] = {0, 0};
        size_t jl = 64 + n * 128;
        char *index = malloc(jl);
        size_t off = (size_t)snprintf(index, jl, "{\"metadata\": {}, \"weight_map\": {");
        for (size_t k = 0; k < n; k++) {
            int s = ws[k].layer >= 0 && ws[k].layer % 2;
            sh[s][cnt[s]++] = t[k];
            off += (size_t)snprintf(index + off, jl - off, "%s\"%s\": \"model-%05d-of-00002.safetensors\"",
                                    k ? ", " : "", ws[k].name, s + 1);
        }
        snprintf(index + off, jl - off, "}}");
        for (int s = 0; s < 2 && rc == 0; s++) {
            char name[64];
            snprintf(name, sizeof name, "model-%05d-of-00002.safetensors", s + 1);
            rc = ls_st_write(fx_path(path, sizeof path, dir, name), sh[s], cnt[s], err, sizeof err);
        }
        if (rc == 0)
            rc = fx_write_str(dir, "model.safetensors.index.json", index);
        free(sh[0]);
        free(sh[1]);
        free(index);
    }
    if (rc != 0)
        fprintf(stderr, "rm_write_model: %s\n", err);
    for (size_t k = 0; data && k < n; k++)
        free(data[k]);
    free(data);
    free(ws);
    free(t);
    return rc;
}

// rm_write_model_mix with one adapter at weight 1 (merge NULL: none).
static inline int rm_write_model(const char *dir, const rm_spec_t *sp, const ls_adapter_t *merge)
{
    const float one = 1.0f;
    return rm_write_model_mix(dir, sp, &merge, &one, merge ? 1 : 0);
}

// Element i of an adapter tensor (which: 0 = A, 1 = B) of module key (l*100 + t*10 for a
// per-layer target, 9000 + t for a global one): A ~ U(-1, 1)/sqrt(in) (the embedding's A, which
// is gathered rather than multiplied, U(-1, 1)), B ~ U(-1, 1)·0.3, so LoRA moves the logits
// visibly without swamping the base.
static inline float rm_adapter_value(unsigned seed, int key, int which, size_t i, int t, int in)
{
    float v = fx_value(seed * 104729u + (unsigned)(key + which), i);
    return which ? 0.3f * v : t == LS_TARGET_EMBED ? v : v / sqrtf((float)in);
}

// Writes a PEFT adapter into dir: config is the whole adapter_config.json text, ranks[l*7+t]
// the rank PEFT will derive from it for each (layer, target) (0: not targeted), embed_rank
// and head_rank those of embed_tokens (lora_embedding_A/B) and lm_head (0: not targeted);
// tok_rows[0] and [1] the rows of the trainable tokens tensors of the embedding and lm_head
// (as many as the config lists ids for each; 0: no tensor), ~ U(-1, 1) like embeddings.
static inline int rm_write_adapter_tokens(const char *dir, const ls_model_config_t *cfg,
                                          const char *config, const int *ranks, int embed_rank,
                                          int head_rank, const int tok_rows[2], ls_dtype_t dtype,
                                          unsigned seed)
{
    mkdir(dir, 0700);
    if (fx_write_str(dir, "adapter_config.json", config) != 0)
        return -1;
    int L = cfg->num_hidden_layers, n = 0;
    size_t cap = ((size_t)L * LS_TARGET_COUNT + 2) * 2 + 2;
    ls_st_write_tensor_t *t = calloc(cap, sizeof *t);
    char (*names)[128] = calloc(cap, 128);
    for (int l = 0; l <= L; l++)
        for (int tg = 0; tg < LS_TARGET_ALL; tg++) {
            bool global = tg >= LS_TARGET_COUNT;
            if (global != (l == L))
                continue;  // the layers' targets, then (l == L) the global ones
            int r = !global ? ranks[l * LS_TARGET_COUNT + tg] : tg == LS_TARGET_EMBED ? embed_rank
                                                                                       : head_rank;
            if (!r)
                continue;
            int in, out, key = global ? 9000 + tg : l * 100 + tg * 10;
            ls_model_config_target_dims(cfg, (ls_target_t)tg, &in, &out);
            for (int which = 0; which < 2; which++) {
                size_t numel = (size_t)r * (size_t)(which ? out : in);
                float *f = malloc(numel * sizeof *f);
                for (size_t i = 0; i < numel; i++)
                    f[i] = rm_adapter_value(seed, key, which, i, tg, in);
                if (dtype != LS_DTYPE_F32) {
                    uint16_t *h = (uint16_t *)f;
                    for (size_t i = 0; i < numel; i++)
                        h[i] = dtype == LS_DTYPE_BF16 ? ls_bf16_from_f32(f[i]) : ls_f16_from_f32(f[i]);
                }
                if (tg == LS_TARGET_EMBED)
                    snprintf(names[n], 128, "base_model.model.model.embed_tokens.lora_embedding_%c",
                             which ? 'B' : 'A');
                else if (global)
                    snprintf(names[n], 128, "base_model.model.lm_head.lora_%c.weight", which ? 'B' : 'A');
                else
                    snprintf(names[n], 128, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight",
                             l, ls_target_parent((ls_target_t)tg), ls_target_name((ls_target_t)tg),
                             which ? 'B' : 'A');
                t[n] = (ls_st_write_tensor_t){names[n], dtype, 2,
                                              {which ? out : r, which ? r : in}, f};
                n++;
            }
        }
    for (int m = 0; m < 2; m++) {
        if (!tok_rows[m])
            continue;
        size_t numel = (size_t)tok_rows[m] * (size_t)cfg->hidden_size;
        float *f = malloc(numel * sizeof *f);
        for (size_t i = 0; i < numel; i++)
            f[i] = fx_value(seed * 104729u + 9100u + (unsigned)m, i);
        if (dtype != LS_DTYPE_F32)  // in place: 2-byte values fit the floats
            ls_f32_narrow(f, dtype, f, numel);
        snprintf(names[n], 128, "base_model.model.%s.token_adapter.trainable_tokens_delta",
                 m ? "lm_head" : "model.embed_tokens");
        t[n] = (ls_st_write_tensor_t){names[n], dtype, 2, {tok_rows[m], cfg->hidden_size}, f};
        n++;
    }
    char path[4096], err[256];
    int rc = ls_st_write(fx_path(path, sizeof path, dir, "adapter_model.safetensors"), t,
                         (size_t)n, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "rm_write_adapter: %s\n", err);
    for (int i = 0; i < n; i++)
        free((void *)t[i].data);
    free(t);
    free(names);
    return rc;
}

// rm_write_adapter_tokens without trainable tokens.
static inline int rm_write_adapter_globals(const char *dir, const ls_model_config_t *cfg,
                                           const char *config, const int *ranks, int embed_rank,
                                           int head_rank, ls_dtype_t dtype, unsigned seed)
{
    const int none[2] = {0, 0};
    return rm_write_adapter_tokens(dir, cfg, config, ranks, embed_rank, head_rank, none, dtype,
                                   seed);
}

// rm_write_adapter_globals for the per-layer targets only.
static inline int rm_write_adapter(const char *dir, const ls_model_config_t *cfg,
                                   const char *config, const int *ranks, ls_dtype_t dtype,
                                   unsigned seed)
{
    return rm_write_adapter_globals(dir, cfg, config, ranks, 0, 0, dtype, seed);
}

// Uniform ranks: rank r on every layer for the targets in mask.
static inline void rm_ranks_uniform(int *ranks, int layers, unsigned mask, int r)
{
    for (int l = 0; l < layers; l++)
        for (int t = 0; t < LS_TARGET_COUNT; t++)
            ranks[l * LS_TARGET_COUNT + t] = (mask >> t) & 1 ? r : 0;
}

#endif
