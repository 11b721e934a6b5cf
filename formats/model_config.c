// config.json parsing and the per-architecture tensor list. See model_config.h.
#include "model_config.h"

#include "ls_err.h"
#include "ls_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// Caps that keep every product of dimensions well inside int and int64 arithmetic; real models
// are orders of magnitude below them.
#define S_MAX_DIM (1 << 20)
#define S_MAX_LAYERS 4096
#define S_MAX_VOCAB (1 << 24)

static const char *const s_arch_names[] = {
    [LS_ARCH_LLAMA] = "LlamaForCausalLM",
    [LS_ARCH_QWEN2] = "Qwen2ForCausalLM",
    [LS_ARCH_QWEN3] = "Qwen3ForCausalLM",
    [LS_ARCH_MISTRAL] = "MistralForCausalLM",
};

static const char *const s_target_names[LS_TARGET_ALL] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    "embed_tokens", "lm_head",
};

const char *ls_arch_name(ls_arch_t arch)
{
    return s_arch_names[arch];
}

const char *ls_target_name(ls_target_t t)
{
    return s_target_names[t];
}

const char *ls_target_parent(ls_target_t t)
{
    return t <= LS_TARGET_O ? "self_attn" : "mlp";
}

int ls_target_from_name(const char *name)
{
    for (int t = 0; t < LS_TARGET_ALL; t++)
        if (strcmp(name, s_target_names[t]) == 0)
            return t;
    return -1;
}

void ls_model_config_target_dims(const ls_model_config_t *cfg, ls_target_t t, int *in_dim,
                                 int *out_dim)
{
    int q = cfg->num_attention_heads * cfg->head_dim;
    int kv = cfg->num_key_value_heads * cfg->head_dim;
    switch (t) {
    case LS_TARGET_Q: *in_dim = cfg->hidden_size; *out_dim = q; break;
    case LS_TARGET_K:
    case LS_TARGET_V: *in_dim = cfg->hidden_size; *out_dim = kv; break;
    case LS_TARGET_O: *in_dim = q; *out_dim = cfg->hidden_size; break;
    case LS_TARGET_GATE:
    case LS_TARGET_UP: *in_dim = cfg->hidden_size; *out_dim = cfg->intermediate_size; break;
    case LS_TARGET_DOWN: *in_dim = cfg->intermediate_size; *out_dim = cfg->hidden_size; break;
    case LS_TARGET_EMBED: *in_dim = cfg->vocab_size; *out_dim = cfg->hidden_size; break;
    case LS_TARGET_LM_HEAD:
    case LS_TARGET_ALL: *in_dim = cfg->hidden_size; *out_dim = cfg->vocab_size; break;
    }
}

int ls_model_config_shard(const ls_model_config_t *cfg, int rank, int size, ls_tp_shard_t *shard,
                          char *err, size_t errlen)
{
    int nh = cfg->num_attention_heads, nkv = cfg->num_key_value_heads, I = cfg->intermediate_size;
    int V = cfg->vocab_size;
    if (size < 1 || rank < 0 || rank >= size) {
        ls_err_set(err, errlen, "tensor parallelism: rank %d is outside a group of %d", rank, size);
        return -1;
    }
    if (nh % size || I % size || (nkv % size && size % nkv) || V < size) {
        ls_err_set(err, errlen,
                   "tensor parallelism: %s does not split over %d ranks: num_attention_heads (%d) "
                   "and intermediate_size (%d) must be multiples of it, num_key_value_heads (%d) a "
                   "multiple or a divisor of it", ls_arch_name(cfg->arch), size, nh, I, nkv);
        return -1;
    }
    int q_per = nh / size;
    *shard = (ls_tp_shard_t){
        .rank = rank,
        .size = size,
        .q_head0 = rank * q_per,
        .n_q_heads = q_per,
        // replicated: the KV head of the rank's first query head (its group holds them all)
        .kv_head0 = nkv >= size ? rank * (nkv / size) : rank * q_per / (nh / nkv),
        .n_kv_heads = nkv >= size ? nkv / size : 1,
        .inter0 = rank * (I / size),
        .inter = I / size,
        .vocab0 = (int)((int64_t)V * rank / size),
        .vocab = (int)((int64_t)V * (rank + 1) / size - (int64_t)V * rank / size),
        .vocab_max = (V + size - 1) / size,
    };
    return 0;
}

void ls_tp_target_window(const ls_model_config_t *cfg, const ls_tp_shard_t *s, ls_target_t t,
                         int *out0, int *n_out, int *in0, int *n_in)
{
    int in = 0, out = 0, hd = cfg->head_dim;
    ls_model_config_target_dims(cfg, t, &in, &out);
    *out0 = *in0 = 0;
    *n_out = out;
    *n_in = in;
    switch (t) {
    case LS_TARGET_Q: *out0 = s->q_head0 * hd; *n_out = s->n_q_heads * hd; break;
    case LS_TARGET_K:
    case LS_TARGET_V: *out0 = s->kv_head0 * hd; *n_out = s->n_kv_heads * hd; break;
    case LS_TARGET_O: *in0 = s->q_head0 * hd; *n_in = s->n_q_heads * hd; break;
    case LS_TARGET_GATE:
    case LS_TARGET_UP: *out0 = s->inter0; *n_out = s->inter; break;
    case LS_TARGET_DOWN: *in0 = s->inter0; *n_in = s->inter; break;
    case LS_TARGET_LM_HEAD: *out0 = s->vocab0; *n_out = s->vocab; break;
    case LS_TARGET_EMBED:
    case LS_TARGET_ALL: break;
    }
}

// --- parsing ---------------------------------------------------------------------------------

// A present, non-null key. JSON null is treated as absent because HF writes null for unset
// optional fields (sliding_window, rope_scaling, head_dim ...).
static const cJSON *s_item(const cJSON *o, const char *key)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNull(j) ? NULL : j;
}

static int s_int(const char *what, const cJSON *j, const char *key, long lo, long hi, int *out,
                 char *err, size_t errlen)
{
    double d = j->valuedouble;
    if (!cJSON_IsNumber(j) || d != floor(d) || d < (double)lo || d > (double)hi) {
        ls_err_set(err, errlen, "%s: \"%s\" must be an integer in [%ld, %ld]", what, key, lo, hi);
        return -1;
    }
    *out = (int)d;
    return 0;
}

// Reads an optional integer key; def when absent.
static int s_opt_int(const char *what, const cJSON *o, const char *key, long lo, long hi, int def,
                     int *out, char *err, size_t errlen)
{
    const cJSON *j = s_item(o, key);
    if (!j) {
        *out = def;
        return 0;
    }
    return s_int(what, j, key, lo, hi, out, err, errlen);
}

static int s_req_int(const char *what, const cJSON *o, const char *key, long lo, long hi,
                     int *out, char *err, size_t errlen)
{
    const cJSON *j = s_item(o, key);
    if (!j) {
        ls_err_set(err, errlen, "%s: \"%s\" is missing", what, key);
        return -1;
    }
    return s_int(what, j, key, lo, hi, out, err, errlen);
}

// Positive finite number; def when absent (def < 0: required).
static int s_num(const char *what, const cJSON *o, const char *key, double def, double *out,
                 char *err, size_t errlen)
{
    const cJSON *j = s_item(o, key);
    if (!j) {
        if (def < 0) {
            ls_err_set(err, errlen, "%s: \"%s\" is missing", what, key);
            return -1;
        }
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble <= 0) {
        ls_err_set(err, errlen, "%s: \"%s\" must be a positive number", what, key);
        return -1;
    }
    *out = j->valuedouble;
    return 0;
}

static int s_bool(const char *what, const cJSON *o, const char *key, bool def, bool *out,
                  char *err, size_t errlen)
{
    const cJSON *j = s_item(o, key);
    if (!j) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(j)) {
        ls_err_set(err, errlen, "%s: \"%s\" must be true or false", what, key);
        return -1;
    }
    *out = cJSON_IsTrue(j);
    return 0;
}

// rope_scaling (or the newer rope_parameters, which also carries rope_theta). key names the
// object in messages.
static int s_rope(const char *what, const cJSON *rs, const char *key, ls_model_config_t *cfg,
                  char *err, size_t errlen)
{
    if (!cJSON_IsObject(rs)) {
        ls_err_set(err, errlen, "%s: \"%s\" must be an object or null", what, key);
        return -1;
    }
    const cJSON *ty = s_item(rs, "rope_type");
    if (!ty)
        ty = s_item(rs, "type");
    if (ty && !cJSON_IsString(ty)) {
        ls_err_set(err, errlen, "%s: \"%s\".rope_type must be a string", what, key);
        return -1;
    }
    const char *type = ty ? ty->valuestring : "default";
    // Sub-keys are reported as `config.json: "rope_scaling": "factor" is missing`.
    char sub[512];
    snprintf(sub, sizeof sub, "%s: \"%s\"", what, key);
    if (strcmp(type, "default") == 0) {
        cfg->rope_scaling.type = LS_ROPE_SCALING_NONE;
    } else if (strcmp(type, "linear") == 0) {
        cfg->rope_scaling.type = LS_ROPE_SCALING_LINEAR;
        if (s_num(sub, rs, "factor", -1, &cfg->rope_scaling.factor, err, errlen) != 0)
            return -1;
    } else if (strcmp(type, "llama3") == 0) {
        cfg->rope_scaling.type = LS_ROPE_SCALING_LLAMA3;
        if (s_num(sub, rs, "factor", -1, &cfg->rope_scaling.factor, err, errlen) != 0 ||
            s_num(sub, rs, "low_freq_factor", -1, &cfg->rope_scaling.low_freq_factor, err,
                  errlen) != 0 ||
            s_num(sub, rs, "high_freq_factor", -1, &cfg->rope_scaling.high_freq_factor, err,
                  errlen) != 0 ||
            s_req_int(sub, rs, "original_max_position_embeddings", 1, S_MAX_DIM * 64L,
                      &cfg->rope_scaling.original_max_position_embeddings, err, errlen) != 0)
            return -1;
        // The llama3 formula interpolates between the two; equal factors divide by zero.
        if (cfg->rope_scaling.high_freq_factor <= cfg->rope_scaling.low_freq_factor) {
            ls_err_set(err, errlen, "%s: \"high_freq_factor\" must be above \"low_freq_factor\"", sub);
            return -1;
        }
    } else {
        ls_err_set(err, errlen,
              "%s: \"%s\" type \"%s\" is not supported (supported: llama3, linear, default)",
              what, key, type);
        return -1;
    }
    return 0;
}

static int s_dtype(const char *what, const cJSON *root, ls_dtype_t *out, char *err,
                   size_t errlen)
{
    const char *key = "torch_dtype";
    const cJSON *j = s_item(root, key);
    if (!j) {
        key = "dtype";
        j = s_item(root, key);
    }
    *out = LS_DTYPE_F32;
    if (!j)
        return 0;
    if (cJSON_IsString(j)) {
        if (strcmp(j->valuestring, "bfloat16") == 0) {
            *out = LS_DTYPE_BF16;
            return 0;
        }
        if (strcmp(j->valuestring, "float16") == 0) {
            *out = LS_DTYPE_F16;
            return 0;
        }
        if (strcmp(j->valuestring, "float32") == 0)
            return 0;
    }
    ls_err_set(err, errlen, "%s: \"%s\" must be \"bfloat16\", \"float16\" or \"float32\"", what, key);
    return -1;
}

// A string member equal to one of the (NULL-terminated) allowed values; absent: ok when
// optional. The error names the key, its parent and what is supported.
static int s_str_in(const char *what, const char *parent, const cJSON *o, const char *key,
                    bool optional, const char *const *allowed, char *err, size_t errlen)
{
    const cJSON *j = s_item(o, key);
    if (!j && optional)
        return 0;
    for (int i = 0; j && cJSON_IsString(j) && allowed[i]; i++)
        if (strcmp(j->valuestring, allowed[i]) == 0)
            return 0;
    char list[128] = "";
    for (int i = 0; allowed[i]; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s\"%s\"", i ? ", " : "",
                 allowed[i]);
    ls_err_set(err, errlen, "%s: \"%s.%s\" %s%s is not supported (supported: %s)", what,
               parent, key, j && cJSON_IsString(j) ? "= " : "",
               !j ? "(missing)" : cJSON_IsString(j) ? j->valuestring : "(not a string)", list);
    return -1;
}

// compressed-tensors: every config group's weights must be 8-bit floats per channel or
// per tensor (what the FP8 format holds); activation settings are the engine's own.
static int s_quant_ct(const char *what, const cJSON *q, char *err, size_t errlen)
{
    static const char *const formats[] = {"float-quantized", "naive-quantized", NULL};
    static const char *const types[] = {"float", NULL};
    static const char *const strategies[] = {"channel", "tensor", NULL};
    if (s_str_in(what, "quantization_config", q, "format", true, formats, err, errlen))
        return -1;
    const cJSON *groups = s_item(q, "config_groups"), *g;
    if (!cJSON_IsObject(groups) || !groups->child) {
        ls_err_set(err, errlen, "%s: \"quantization_config.config_groups\" must be a non-empty "
                   "object", what);
        return -1;
    }
    cJSON_ArrayForEach(g, groups) {
        const cJSON *w = s_item(g, "weights");
        int bits = 0;
        if (!cJSON_IsObject(w)) {
            ls_err_set(err, errlen, "%s: config group \"%s\" has no \"weights\" object", what,
                       g->string);
            return -1;
        }
        if (s_req_int(what, w, "num_bits", 1, 64, &bits, err, errlen))
            return -1;
        if (bits != 8) {
            ls_err_set(err, errlen, "%s: config group \"%s\": %d-bit weights are not supported "
                       "(only 8-bit float, FP8 E4M3)", what, g->string, bits);
            return -1;
        }
        if (s_str_in(what, g->string, w, "type", false, types, err, errlen) ||
            s_str_in(what, g->string, w, "strategy", false, strategies, err, errlen))
            return -1;
    }
    return 0;
}

static int s_quant(const char *what, const cJSON *root, ls_model_config_t *cfg, char *err,
                   size_t errlen)
{
    static const char *const methods[] = {"compressed-tensors", "fp8", NULL};
    static const char *const fmts[] = {"e4m3", NULL};
    const cJSON *q = s_item(root, "quantization_config");
    if (!q)
        return 0;
    if (!cJSON_IsObject(q)) {
        ls_err_set(err, errlen, "%s: \"quantization_config\" must be an object", what);
        return -1;
    }
    if (s_str_in(what, "quantization_config", q, "quant_method", false, methods, err, errlen))
        return -1;
    cfg->quant = LS_QUANT_FP8;
    if (strcmp(s_item(q, "quant_method")->valuestring, "compressed-tensors") == 0)
        return s_quant_ct(what, q, err, errlen);
    if (s_str_in(what, "quantization_config", q, "fmt", true, fmts, err, errlen))
        return -1;
    const cJSON *b = s_item(q, "weight_block_size");
    if (!b)
        return 0;
    if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2 ||
        s_int(what, cJSON_GetArrayItem(b, 0), "weight_block_size", 1, S_MAX_DIM,
              &cfg->quant_block[0], err, errlen) ||
        s_int(what, cJSON_GetArrayItem(b, 1), "weight_block_size", 1, S_MAX_DIM,
              &cfg->quant_block[1], err, errlen)) {
        ls_err_set(err, errlen, "%s: \"quantization_config.weight_block_size\" must be two "
                   "positive integers", what);
        return -1;
    }
    return 0;
}

static int s_tokens(const char *what, const cJSON *root, ls_model_config_t *cfg, char *err,
                    size_t errlen)
{
    if (s_opt_int(what, root, "bos_token_id", 0, S_MAX_VOCAB, -1, &cfg->bos_token_id, err,
                  errlen) != 0)
        return -1;
    const cJSON *eos = s_item(root, "eos_token_id");
    cfg->n_eos_token_ids = 0;
    if (!eos)
        return 0;
    if (cJSON_IsNumber(eos)) {
        if (s_int(what, eos, "eos_token_id", 0, S_MAX_VOCAB, &cfg->eos_token_ids[0], err,
                  errlen) != 0)
            return -1;
        cfg->n_eos_token_ids = 1;
        return 0;
    }
    if (!cJSON_IsArray(eos) || cJSON_GetArraySize(eos) > LS_MAX_EOS_TOKENS) {
        ls_err_set(err, errlen, "%s: \"eos_token_id\" must be an integer or a list of at most %d",
              what, LS_MAX_EOS_TOKENS);
        return -1;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, eos) {
        if (s_int(what, e, "eos_token_id", 0, S_MAX_VOCAB,
                  &cfg->eos_token_ids[cfg->n_eos_token_ids], err, errlen) != 0)
            return -1;
        cfg->n_eos_token_ids++;
    }
    return 0;
}

static int s_arch(const char *what, const cJSON *root, ls_arch_t *out, char *err, size_t errlen)
{
    const cJSON *a = s_item(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    if (!cJSON_IsString(a0)) {
        ls_err_set(err, errlen, "%s: \"architectures\" is missing or not a list of names", what);
        return -1;
    }
    for (int i = 0; i < (int)(sizeof s_arch_names / sizeof *s_arch_names); i++) {
        if (strcmp(a0->valuestring, s_arch_names[i]) == 0) {
            *out = (ls_arch_t)i;
            return 0;
        }
    }
    ls_err_set(err, errlen,
          "%s: architecture \"%s\" is not supported (supported: LlamaForCausalLM, "
          "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM)",
          what, a0->valuestring);
    return -1;
}

static int s_parse(const char *what, const cJSON *root, ls_model_config_t *cfg, char *err,
                   size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    if (!cJSON_IsObject(root)) {
        ls_err_set(err, errlen, "%s: not a JSON object", what);
        return -1;
    }
    if (s_arch(what, root, &cfg->arch, err, errlen) != 0)
        return -1;
    bool qwen = cfg->arch == LS_ARCH_QWEN2 || cfg->arch == LS_ARCH_QWEN3;
    int def_max_pos = cfg->arch == LS_ARCH_LLAMA ? 2048 : qwen ? 32768 : 131072;
    if (s_req_int(what, root, "hidden_size", 1, S_MAX_DIM, &cfg->hidden_size, err, errlen) ||
        s_req_int(what, root, "intermediate_size", 1, S_MAX_DIM, &cfg->intermediate_size, err,
                  errlen) ||
        s_req_int(what, root, "num_hidden_layers", 1, S_MAX_LAYERS, &cfg->num_hidden_layers, err,
                  errlen) ||
        s_req_int(what, root, "num_attention_heads", 1, S_MAX_DIM, &cfg->num_attention_heads,
                  err, errlen) ||
        s_opt_int(what, root, "num_key_value_heads", 1, S_MAX_DIM, cfg->num_attention_heads,
                  &cfg->num_key_value_heads, err, errlen) ||
        s_req_int(what, root, "vocab_size", 1, S_MAX_VOCAB, &cfg->vocab_size, err, errlen) ||
        s_opt_int(what, root, "max_position_embeddings", 1, INT32_MAX, def_max_pos,
                  &cfg->max_position_embeddings, err, errlen) ||
        s_num(what, root, "rms_norm_eps", 1e-6, &cfg->rms_norm_eps, err, errlen) ||
        s_num(what, root, "rope_theta", 10000.0, &cfg->rope_theta, err, errlen) ||
        s_bool(what, root, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err,
               errlen) ||
        s_dtype(what, root, &cfg->torch_dtype, err, errlen) ||
        s_tokens(what, root, cfg, err, errlen) || s_quant(what, root, cfg, err, errlen))
        return -1;

    if (!s_item(root, "head_dim") && cfg->hidden_size % cfg->num_attention_heads != 0) {
        ls_err_set(err, errlen,
              "%s: \"num_attention_heads\" %d does not divide \"hidden_size\" %d (and no "
              "\"head_dim\" is given)",
              what, cfg->num_attention_heads, cfg->hidden_size);
        return -1;
    }
    if (s_opt_int(what, root, "head_dim", 1, S_MAX_DIM,
                  cfg->hidden_size / cfg->num_attention_heads, &cfg->head_dim, err, errlen))
        return -1;
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        ls_err_set(err, errlen, "%s: \"num_key_value_heads\" %d does not divide "
              "\"num_attention_heads\" %d",
              what, cfg->num_key_value_heads, cfg->num_attention_heads);
        return -1;
    }
    if ((long)cfg->num_attention_heads * cfg->head_dim > S_MAX_DIM) {
        ls_err_set(err, errlen, "%s: \"num_attention_heads\" x \"head_dim\" is above %d", what,
              S_MAX_DIM);
        return -1;
    }
    const cJSON *act = s_item(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        ls_err_set(err, errlen, "%s: \"hidden_act\" must be \"silu\"", what);
        return -1;
    }

    // transformers >= 5 folds rope_theta and the scaling into "rope_parameters".
    const cJSON *rp = s_item(root, "rope_parameters");
    const cJSON *rs = s_item(root, "rope_scaling");
    if (rp) {
        if (s_rope(what, rp, "rope_parameters", cfg, err, errlen) ||
            s_num(what, rp, "rope_theta", cfg->rope_theta, &cfg->rope_theta, err, errlen))
            return -1;
    } else if (rs && s_rope(what, rs, "rope_scaling", cfg, err, errlen) != 0) {
        return -1;
    }

    bool attention_bias = false;
    switch (cfg->arch) {
    case LS_ARCH_LLAMA:
        if (s_bool(what, root, "attention_bias", false, &attention_bias, err, errlen) ||
            s_bool(what, root, "mlp_bias", false, &cfg->mlp_bias, err, errlen))
            return -1;
        cfg->attn_qkv_bias = cfg->attn_o_bias = attention_bias;
        break;
    case LS_ARCH_QWEN3:
        if (s_bool(what, root, "attention_bias", false, &attention_bias, err, errlen))
            return -1;
        cfg->attn_qkv_bias = cfg->attn_o_bias = attention_bias;
        cfg->qk_norm = true;
        break;
    case LS_ARCH_QWEN2:
        cfg->attn_qkv_bias = true;  // hard-wired in Qwen2Attention, not a config field
        break;
    case LS_ARCH_MISTRAL:
        if (s_opt_int(what, root, "sliding_window", 1, INT32_MAX, 0, &cfg->sliding_window, err,
                      errlen))
            return -1;
        break;
    }
    if (qwen) {
        bool sw = false;
        if (s_bool(what, root, "use_sliding_window", false, &sw, err, errlen))
            return -1;
        if (sw) {
            ls_err_set(err, errlen, "%s: \"use_sliding_window\": true is not supported", what);
            return -1;
        }
    }
    return 0;
}

int ls_model_config_parse(const char *json, size_t len, const char *what, ls_model_config_t *cfg,
                          char *err, size_t errlen)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        ls_err_set(err, errlen, "%s: not valid JSON", what);
        return -1;
    }
    int rc = s_parse(what, root, cfg, err, errlen);
    cJSON_Delete(root);
    return rc;
}

int ls_model_config_load(const char *path, ls_model_config_t *cfg, char *err, size_t errlen)
{
    struct stat sb;
    bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    size_t n;
    char *buf = dir ? ls_file_read(path, "config.json", LS_FILE_JSON, &n, err, errlen)
                    : ls_file_read_path(path, LS_FILE_JSON, &n, err, errlen);
    if (!buf)
        return -1;
    char file[4096];
    snprintf(file, sizeof file, dir ? "%s/config.json" : "%s", path);
    int rc = ls_model_config_parse(buf, n, file, cfg, err, errlen);
    free(buf);
    return rc;
}

// --- the tensor list -------------------------------------------------------------------------

// The per-layer roles this config needs, in checkpoint order; returns how many.
static int s_layer_roles(const ls_model_config_t *cfg, ls_weight_role_t *roles)
{
    int n = 0;
    roles[n++] = LS_W_ATTN_NORM;
    roles[n++] = LS_W_Q;
    roles[n++] = LS_W_K;
    roles[n++] = LS_W_V;
    roles[n++] = LS_W_O;
    if (cfg->attn_qkv_bias) {
        roles[n++] = LS_W_Q_BIAS;
        roles[n++] = LS_W_K_BIAS;
        roles[n++] = LS_W_V_BIAS;
    }
    if (cfg->attn_o_bias)
        roles[n++] = LS_W_O_BIAS;
    if (cfg->qk_norm) {
        roles[n++] = LS_W_Q_NORM;
        roles[n++] = LS_W_K_NORM;
    }
    roles[n++] = LS_W_MLP_NORM;
    roles[n++] = LS_W_GATE;
    roles[n++] = LS_W_UP;
    roles[n++] = LS_W_DOWN;
    if (cfg->mlp_bias) {
        roles[n++] = LS_W_GATE_BIAS;
        roles[n++] = LS_W_UP_BIAS;
        roles[n++] = LS_W_DOWN_BIAS;
    }
    return n;
}

static int s_globals(const ls_model_config_t *cfg)
{
    return cfg->tie_word_embeddings ? 2 : 3;
}

size_t ls_model_config_weight_count(const ls_model_config_t *cfg)
{
    ls_weight_role_t roles[LS_W_ROLE_COUNT];
    return (size_t)s_globals(cfg) + (size_t)cfg->num_hidden_layers * (size_t)s_layer_roles(cfg, roles);
}

int ls_model_config_weight_spec(const ls_model_config_t *cfg, size_t i, ls_weight_spec_t *spec)
{
    ls_weight_role_t roles[LS_W_ROLE_COUNT];
    size_t nper = (size_t)s_layer_roles(cfg, roles);
    size_t ng = (size_t)s_globals(cfg);
    if (i >= ng + (size_t)cfg->num_hidden_layers * nper)
        return -1;
    static const ls_weight_role_t globals[] = {LS_W_EMBED, LS_W_FINAL_NORM, LS_W_LM_HEAD};
    memset(spec, 0, sizeof *spec);
    if (i < ng) {
        spec->role = globals[i];
        spec->layer = -1;
    } else {
        spec->role = roles[(i - ng) % nper];
        spec->layer = (int)((i - ng) / nper);
    }
    int64_t h = cfg->hidden_size, im = cfg->intermediate_size, hd = cfg->head_dim;
    int64_t q = cfg->num_attention_heads * hd, kv = cfg->num_key_value_heads * hd;
    const char *suffix = NULL;  // per-layer tensors: model.layers.{i}.<suffix>
    int64_t d0 = 0, d1 = 0;     // d1 == 0: a vector
    switch (spec->role) {
    case LS_W_EMBED: snprintf(spec->name, sizeof spec->name, "model.embed_tokens.weight");
        d0 = cfg->vocab_size; d1 = h; break;
    case LS_W_FINAL_NORM: snprintf(spec->name, sizeof spec->name, "model.norm.weight");
        d0 = h; break;
    case LS_W_LM_HEAD: snprintf(spec->name, sizeof spec->name, "lm_head.weight");
        d0 = cfg->vocab_size; d1 = h; break;
    case LS_W_ATTN_NORM: suffix = "input_layernorm.weight"; d0 = h; break;
    case LS_W_Q: suffix = "self_attn.q_proj.weight"; d0 = q; d1 = h; break;
    case LS_W_K: suffix = "self_attn.k_proj.weight"; d0 = kv; d1 = h; break;
    case LS_W_V: suffix = "self_attn.v_proj.weight"; d0 = kv; d1 = h; break;
    case LS_W_O: suffix = "self_attn.o_proj.weight"; d0 = h; d1 = q; break;
    case LS_W_Q_BIAS: suffix = "self_attn.q_proj.bias"; d0 = q; break;
    case LS_W_K_BIAS: suffix = "self_attn.k_proj.bias"; d0 = kv; break;
    case LS_W_V_BIAS: suffix = "self_attn.v_proj.bias"; d0 = kv; break;
    case LS_W_O_BIAS: suffix = "self_attn.o_proj.bias"; d0 = h; break;
    case LS_W_Q_NORM: suffix = "self_attn.q_norm.weight"; d0 = hd; break;
    case LS_W_K_NORM: suffix = "self_attn.k_norm.weight"; d0 = hd; break;
    case LS_W_MLP_NORM: suffix = "post_attention_layernorm.weight"; d0 = h; break;
    case LS_W_GATE: suffix = "mlp.gate_proj.weight"; d0 = im; d1 = h; break;
    case LS_W_UP: suffix = "mlp.up_proj.weight"; d0 = im; d1 = h; break;
    case LS_W_DOWN: suffix = "mlp.down_proj.weight"; d0 = h; d1 = im; break;
    case LS_W_GATE_BIAS: suffix = "mlp.gate_proj.bias"; d0 = im; break;
    case LS_W_UP_BIAS: suffix = "mlp.up_proj.bias"; d0 = im; break;
    case LS_W_DOWN_BIAS: suffix = "mlp.down_proj.bias"; d0 = h; break;
    case LS_W_ROLE_COUNT: break;
    }
    if (suffix)
        snprintf(spec->name, sizeof spec->name, "model.layers.%d.%s", spec->layer, suffix);
    spec->shape[0] = d0;
    spec->shape[1] = d1;
    spec->ndim = d1 ? 2 : 1;
    return 0;
}

int ls_model_config_check_weights(const ls_model_config_t *cfg, const ls_st_t *st, char *err,
                                  size_t errlen)
{
    size_t n = ls_model_config_weight_count(cfg);
    for (size_t i = 0; i < n; i++) {
        ls_weight_spec_t spec;
        ls_model_config_weight_spec(cfg, i, &spec);
        const ls_st_tensor_t *t = ls_st_find(st, spec.name);
        if (!t) {
            ls_err_set(err, errlen, "%s: tensor \"%s\" is missing (needed by %s)", ls_st_path(st),
                  spec.name, ls_arch_name(cfg->arch));
            return -1;
        }
        if (ls_st_tensor_check_shape(t, spec.ndim, spec.shape, err, errlen) != 0)
            return -1;
    }
    return 0;
}

static int s_eos_add(int32_t *out, int n, int cap, int id) {
    for (int i = 0; i < n; i++)
        if (out[i] == id)
            return n;
    if (id >= 0 && n < cap)
        out[n++] = id;
    return n;
}

int ls_model_eos_ids(const char *dir, const ls_model_config_t *cfg, int32_t *out, int cap) {
    int n = 0;
    for (int i = 0; i < cfg->n_eos_token_ids; i++)
        n = s_eos_add(out, n, cap, cfg->eos_token_ids[i]);
    // Optional: a missing or unreadable file leaves the config's ids.
    size_t len;
    char *buf = ls_file_read(dir, "generation_config.json", LS_FILE_JSON, &len, NULL, 0);
    if (!buf)
        return n;
    cJSON *root = cJSON_ParseWithLength(buf, len), *eos = cJSON_GetObjectItem(root, "eos_token_id"), *item;
    if (cJSON_IsNumber(eos))
        n = s_eos_add(out, n, cap, eos->valueint);
    else if (cJSON_IsArray(eos))
        cJSON_ArrayForEach(item, eos) if (cJSON_IsNumber(item)) n = s_eos_add(out, n, cap, item->valueint);
    cJSON_Delete(root);
    free(buf);
    return n;
}
