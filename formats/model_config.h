// model_config: the HF config.json of a base model, validated, plus what follows from it: the
// (in, out) dimensions of every LoRA target and the list of tensors a checkpoint must hold.
//
// Supported: LlamaForCausalLM (incl. Llama-3.1 "llama3" rope_scaling), Qwen2ForCausalLM (qkv
// bias), Qwen3ForCausalLM (q/k RMSNorm), MistralForCausalLM (sliding_window recorded).
// Known limits: hidden_act must be "silu"; rope_scaling types other than llama3/linear/default,
// and Qwen's use_sliding_window, are refused rather than run wrong.
#ifndef LS_MODEL_CONFIG_H
#define LS_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

typedef enum {
    LS_ARCH_LLAMA = 0,
    LS_ARCH_QWEN2,
    LS_ARCH_QWEN3,
    LS_ARCH_MISTRAL,
} ls_arch_t;

typedef enum {
    LS_ROPE_SCALING_NONE = 0,
    LS_ROPE_SCALING_LINEAR,  // positions divided by factor
    LS_ROPE_SCALING_LLAMA3,  // Llama-3.1 frequency-dependent scaling
} ls_rope_scaling_type_t;

// The LoRA targets: the seven of every decoder layer, in the order the slot pool stacks them
// (q,k,v -> qkv; gate,up), then the two of the whole model (one module each), which adapters
// may target only where lora_target_modules names them (their slots are vocabulary-sized).
typedef enum {
    LS_TARGET_Q = 0,
    LS_TARGET_K,
    LS_TARGET_V,
    LS_TARGET_O,
    LS_TARGET_GATE,
    LS_TARGET_UP,
    LS_TARGET_DOWN,
    LS_TARGET_COUNT,                    // the per-layer targets
    LS_TARGET_EMBED = LS_TARGET_COUNT,  // model.embed_tokens, an Embedding (vocab -> hidden)
    LS_TARGET_LM_HEAD,                  // lm_head (hidden -> vocab)
    LS_TARGET_ALL,                      // every target
} ls_target_t;

#define LS_MAX_EOS_TOKENS 8

// How the checkpoint's seven projections are stored (config.json "quantization_config").
typedef enum {
    LS_QUANT_NONE = 0, // as torch_dtype says
    LS_QUANT_FP8,      // E4M3 weights with scales beside them (model.h: the FP8 format)
} ls_quant_t;

typedef struct {
    ls_arch_t arch;
    int hidden_size;
    int intermediate_size;
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;  // defaults to num_attention_heads
    int head_dim;             // defaults to hidden_size / num_attention_heads
    int vocab_size;
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;  // defaults to 10000
    struct {
        ls_rope_scaling_type_t type;
        double factor;
        double low_freq_factor;                // llama3 only
        double high_freq_factor;               // llama3 only
        int original_max_position_embeddings;  // llama3 only
    } rope_scaling;
    bool tie_word_embeddings;  // defaults to false
    int bos_token_id;          // -1 when absent
    int eos_token_ids[LS_MAX_EOS_TOKENS];
    int n_eos_token_ids;
    ls_dtype_t torch_dtype;  // "torch_dtype" or newer "dtype"; float32 when absent, as in HF
    bool attn_qkv_bias;      // q/k/v_proj have a bias (Qwen2 always; Llama/Qwen3 attention_bias)
    bool attn_o_bias;        // o_proj has a bias (Llama/Qwen3 attention_bias)
    bool mlp_bias;           // gate/up/down_proj have a bias (Llama mlp_bias)
    bool qk_norm;            // per-head RMSNorm on q and k before RoPE (Qwen3)
    int sliding_window;      // Mistral attention window in tokens; 0 = full attention
    // "quantization_config": quant_method "compressed-tensors" (float weights of 8 bits,
    // strategy "channel" or "tensor") or "fp8" (fmt e4m3; weight_block_size optional).
    // Each projection W then comes as F8_E4M3 with W's name + "_scale" (compressed-tensors,
    // fp8 per tensor) or "_scale_inv" (fp8 blocks) beside it; input scales are ignored (the
    // engine quantizes activations per token). Anything else is refused.
    ls_quant_t quant;
    int quant_block[2]; // fp8 weight_block_size (rows, cols); 0, 0: per channel or tensor
} ls_model_config_t;

// Reads path (a model directory or a config.json file). Returns 0, or -1 with one sentence
// naming the file and the key in err.
int ls_model_config_load(const char *path, ls_model_config_t *cfg, char *err, size_t errlen);
// Parses config text of len bytes; what names the source in error messages.
int ls_model_config_parse(const char *json, size_t len, const char *what, ls_model_config_t *cfg,
                          char *err, size_t errlen);

// The model's end-of-sequence ids: config.json's (in cfg) plus generation_config.json's in dir
// (a number or a list; instruct models list several there), without repeats, into out (cap).
// Returns how many; a missing or unreadable generation_config.json adds nothing.
int ls_model_eos_ids(const char *dir, const ls_model_config_t *cfg, int32_t *out, int cap);

const char *ls_arch_name(ls_arch_t arch);  // "LlamaForCausalLM", ...

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens",
// "lm_head".
const char *ls_target_name(ls_target_t t);
// The HF module that holds a per-layer target: "self_attn" (q,k,v,o) or "mlp" (gate,up,down).
const char *ls_target_parent(ls_target_t t);
// Inverse of ls_target_name; -1 for any other name.
int ls_target_from_name(const char *name);

// The target's linear layer maps in_dim -> out_dim; its HF weight is (out_dim, in_dim), a LoRA
// A is (r, in_dim) and B is (out_dim, r). The embedding maps vocab -> hidden: PEFT's
// lora_embedding_A is (r, vocab) and lora_embedding_B (hidden, r), the same shapes.
void ls_model_config_target_dims(const ls_model_config_t *cfg, ls_target_t t, int *in_dim,
                                 int *out_dim);

// Tensor parallelism (Megatron): what rank `rank` of a group of `size` holds. q/k/v and
// gate/up are column-parallel (a rank holds its heads, its slice of the intermediate dim),
// o and down row-parallel (the matching input columns; an all-reduce sums the partial
// outputs), embedding and lm_head split on the vocabulary. KV heads are split when there
// are at least as many as ranks, else each is replicated on size/num_key_value_heads ranks:
// a rank's query heads then all read the one KV head it holds.
typedef struct {
    int rank, size;
    int q_head0, n_q_heads;    // attention heads [q_head0, q_head0 + n_q_heads)
    int kv_head0, n_kv_heads;  // KV heads [kv_head0, kv_head0 + n_kv_heads)
    int inter0, inter;         // intermediate columns [inter0, inter0 + inter)
    int vocab0, vocab;         // vocabulary rows [vocab0, vocab0 + vocab): V*rank/size ..
    int vocab_max;             // ceil(V/size): the most rows any rank holds
} ls_tp_shard_t;

// The shard of rank of size (size 1: everything). -1 + err when the model does not split
// that way: heads or intermediate_size not divisible by size, or KV heads neither a multiple
// nor a divisor of size.
int ls_model_config_shard(const ls_model_config_t *cfg, int rank, int size, ls_tp_shard_t *shard,
                          char *err, size_t errlen);
// The window of target t's (out, in) weight the shard holds: rows [*out0, *out0 + *n_out),
// columns [*in0, *in0 + *n_in). Column-parallel targets keep every column, row-parallel
// ones every row: the same window slices a LoRA B (rows) and A (columns). lm_head keeps the
// rank's vocabulary rows (its logits slice); the embedding is whole on every rank (its LoRA
// delta is added after the embedding's all-reduce).
void ls_tp_target_window(const ls_model_config_t *cfg, const ls_tp_shard_t *shard, ls_target_t t,
                         int *out0, int *n_out, int *in0, int *n_in);

// Every tensor of a checkpoint, by role.
typedef enum {
    LS_W_EMBED = 0,  // model.embed_tokens.weight      (vocab, hidden)
    LS_W_FINAL_NORM, // model.norm.weight              (hidden)
    LS_W_LM_HEAD,    // lm_head.weight                 (vocab, hidden), absent when tied
    LS_W_ATTN_NORM,  // layers.i.input_layernorm.weight (hidden)
    LS_W_Q,          // layers.i.self_attn.q_proj.weight (heads*head_dim, hidden)
    LS_W_K,          // (kv_heads*head_dim, hidden)
    LS_W_V,          // (kv_heads*head_dim, hidden)
    LS_W_O,          // (hidden, heads*head_dim)
    LS_W_Q_BIAS,     // (heads*head_dim)
    LS_W_K_BIAS,     // (kv_heads*head_dim)
    LS_W_V_BIAS,     // (kv_heads*head_dim)
    LS_W_O_BIAS,     // (hidden)
    LS_W_Q_NORM,     // layers.i.self_attn.q_norm.weight (head_dim)
    LS_W_K_NORM,     // (head_dim)
    LS_W_MLP_NORM,   // layers.i.post_attention_layernorm.weight (hidden)
    LS_W_GATE,       // layers.i.mlp.gate_proj.weight (intermediate, hidden)
    LS_W_UP,         // (intermediate, hidden)
    LS_W_DOWN,       // (hidden, intermediate)
    LS_W_GATE_BIAS,  // (intermediate)
    LS_W_UP_BIAS,    // (intermediate)
    LS_W_DOWN_BIAS,  // (hidden)
    LS_W_ROLE_COUNT,
} ls_weight_role_t;

typedef struct {
    ls_weight_role_t role;
    int layer;  // -1 for the global tensors
    char name[96];
    int ndim;
    int64_t shape[2];
} ls_weight_spec_t;

// Number of tensors the architecture needs (globals first, then layer by layer).
size_t ls_model_config_weight_count(const ls_model_config_t *cfg);
// Fills spec for the i-th needed tensor; -1 when i is past the end.
int ls_model_config_weight_spec(const ls_model_config_t *cfg, size_t i, ls_weight_spec_t *spec);

// Checks that st holds every needed tensor with the right shape (extra tensors are ignored).
// Errors name the tensor: `model.safetensors: tensor "model.layers.3.mlp.up_proj.weight": ...`.
int ls_model_config_check_weights(const ls_model_config_t *cfg, const ls_st_t *st, char *err,
                                  size_t errlen);

#endif
