// peft: PEFT LoRA adapter directories (adapter_config.json + adapter_model.safetensors),
// validated against a base model and loaded into host memory as fp32 (the CPU tier).
//
// Matching follows PEFT 0.21 exactly, against the base model's module names
// ("model.layers.3.self_attn.q_proj"):
//   - target_modules / exclude_modules as a list: a module is selected when its name equals an
//     entry or ends with "." + entry; as a string: the regex must match the whole name
//     (re.fullmatch); "all-linear" selects every linear layer but lm_head.
//   - rank_pattern / alpha_pattern: the first key, in file order, for which the module name
//     matches the regex `(.*\.)?(KEY)$` from its start (PEFT's get_pattern_key) gives the
//     value; otherwise r / lora_alpha.
//   - scaling = alpha / r, or alpha / sqrt(r) with use_rslora, per module after the patterns.
// Regexes are Python syntax translated to POSIX ERE: groups, (?:...), alternation, classes,
// \d \w \s, quantifiers (lazy ones behave the same for a whole-name match). Lookarounds,
// backreferences and inline flags are refused with a clear message.
//
// Refused, each with a sentence naming the file and the key or tensor: pickled .bin weights,
// peft_type other than LORA, task_type other than CAUSAL_LM, bias other than "none", use_dora,
// lora_bias, fan_in_fan_out, non-empty modules_to_save, layers_to_transform,
// layer_replication, target_parameters, alora_invocation_tokens, trained embed_tokens or
// lm_head weights (the whole matrix, except a resized one's added rows, below), modules that are not one of
// q/k/v/o/gate/up/down_proj, embed_tokens or lm_head (e.g. "fc1"), ranks above max_lora_rank,
// shapes that do not fit the base or the configured rank, unpaired A/B, and NaN/Inf values.
//
// LoRA on the embedding ("embed_tokens" in target_modules: PEFT's lora_embedding_A (r, vocab)
// and lora_embedding_B (hidden, r), delta[t] = scaling · B · A[:, t]) and on lm_head (lora_A
// (r, hidden), lora_B (vocab, r)) is read like the per-layer targets. PEFT targets modules by
// name, so with tied embeddings each applies to its own module only: the input embedding, or
// the output projection. The copies of the base weights PEFT saves beside them
// ("….base_layer.weight", save_embedding_layers) are checked for shape and not read.
//
// Trainable tokens (trainable_token_indices, PEFT's TrainableTokensLayer beside LoRA): the
// adapter brings its own rows of the embedding (and of lm_head) for a few token ids, which
// replace the base model's rows of those ids. The config is a list of ids (the input
// embedding) or an object from module name to ids, the names "embed_tokens" and "lm_head"
// (or "model.embed_tokens"); ids distinct and below vocab_size. The rows are the tensors
// "….embed_tokens.token_adapter.trainable_tokens_delta" and "lm_head.token_adapter.
// trainable_tokens_delta", (n_ids, hidden) in the order of the ids: despite the name, PEFT
// keeps the rows themselves (initialised from the base rows, written with index_copy), not
// differences. With tied embeddings PEFT ties lm_head to the embedding's rows (the same ids
// and rows, not saved again) unless the object names lm_head itself; untied, lm_head keeps
// its base rows unless named. Refused: LoRA and trainable tokens on one module (embed_tokens,
// or lm_head, tied lm_head included): PEFT wraps the LoRA layer in its trainable-tokens layer,
// whose forward accepts only a plain Embedding or Linear ("TrainableTokensLayer wraps an
// unknown layer type"), so no such adapter runs in PEFT.
//
// Added vocabulary (docs/adapters.md): tokens the adapter's tokenizer adds past vocab_size
// (added_vocab.h) get rows of the embedding and of lm_head among the token rows, with ids
// vocab_size and up. A row comes from trainable_token_indices when it lists the id (PEFT after
// resize_token_embeddings), else from new_embeddings.safetensors (vLLM's legacy form:
// input_embeddings, output_embeddings, (n_added, hidden)), else from the resized matrix PEFT
// saves with save_embedding_layers ("….embed_tokens[.token_adapter.base_layer].weight",
// "lm_head[…].weight", (vocab_size + n_added, hidden): its added rows are read, its base rows
// are the base model's since PEFT freezes them). Tied embeddings: lm_head's rows are the
// embedding's. An added id without a row of either module is refused, as are LoRA on the
// embedding or lm_head beside added vocabulary and a resize padded past the added tokens.
#ifndef LS_PEFT_H
#define LS_PEFT_H

#include <stddef.h>
#include <stdint.h>

#include "model_config.h"

typedef struct ls_adapter ls_adapter_t;

typedef struct {
    int rank;        // 0 when the adapter does not touch this (layer, target)
    float scaling;   // alpha / r, or alpha / sqrt(r) with use_rslora
    const float *A;  // A is (rank, in_dim), row-major; NULL when rank is 0
    const float *B;  // B is (out_dim, rank), row-major; NULL when rank is 0
} ls_lora_weights_t;

// An adapter's own rows of the embedding or of lm_head (trainable tokens, above).
typedef struct {
    int n;                // rows; 0 when the adapter replaces none
    const int32_t *ids;   // (n) vocabulary ids, distinct, as the config lists them
    const float *rows;    // (n, hidden_size): rows[k] replaces the base row of ids[k]
} ls_token_rows_t;

typedef struct {
    int max_rank;          // largest rank over the touched modules
    unsigned target_mask;  // bit (1u << t) set when some layer has target t
    int num_modules;       // number of modules touched ((layer, target) pairs, embedding, lm_head)
    float alpha;           // lora_alpha (PEFT's default 8 when absent), before alpha_pattern
    int token_rows;        // the most rows it replaces in the embedding or lm_head (trainable
                           // tokens, tied lm_head included) or adds (added vocabulary); 0: none
    int added_tokens;      // tokens its tokenizer adds past vocab_size (added_vocab.h): their
                           // ids vocab_size .. vocab_size + added_tokens - 1 are among the rows
} ls_adapter_info_t;

// Validates the adapter directory without reading weights: the config rules above, the
// presence of adapter_model.safetensors and the added-vocabulary files. info may be NULL.
// The registry calls this before dispatching a load. Returns 0 or -1 + err.
int ls_adapter_config_read(const char *dir, const ls_model_config_t *cfg, int max_lora_rank,
                           ls_adapter_info_t *info, char *err, size_t errlen);

// Validates and loads the adapter. NULL + err on any failure.
ls_adapter_t *ls_adapter_load(const char *dir, const ls_model_config_t *cfg, int max_lora_rank,
                              char *err, size_t errlen);
void ls_adapter_destroy(ls_adapter_t **a);

// Weights of one (layer, target); rank 0 and NULL A/B when untouched. layer must be in
// [0, num_hidden_layers) of the config the adapter was loaded against.
const ls_lora_weights_t *ls_adapter_layer_target(const ls_adapter_t *a, int layer,
                                                 ls_target_t t);
// Weights of a global target (LS_TARGET_EMBED: A (rank, vocab), B (hidden, rank);
// LS_TARGET_LM_HEAD: A (rank, hidden), B (vocab, rank)), as ls_adapter_layer_target.
const ls_lora_weights_t *ls_adapter_global_target(const ls_adapter_t *a, ls_target_t t);
// The adapter's own rows of the embedding (LS_TARGET_EMBED) or lm_head (LS_TARGET_LM_HEAD);
// n 0 when it has none there.
const ls_token_rows_t *ls_adapter_token_rows(const ls_adapter_t *a, ls_target_t t);
ls_adapter_info_t ls_adapter_info(const ls_adapter_t *a);
// Bytes of fp32 A and B held in host memory.
size_t ls_adapter_bytes(const ls_adapter_t *a);

#endif
