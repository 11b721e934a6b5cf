/*  engine/model.h — a Llama-family base model on a backend: loading, paged KV cache, and
    the batched forward step with multi-LoRA.

    Loading. ls_model_load reads an HF directory (config.json + model.safetensors, or
    model.safetensors.index.json and its shards), checks every tensor the architecture needs
    (ls_model_config_check_weights) and uploads them in bf16/f16/f32 as stored (the backend
    picks its storage; CPU: f32). q/k/v are stacked into one qkv weight (q_out + 2·kv_out,
    hidden) and gate/up into one gate_up weight (2·inter, hidden), biases alike, so one
    matmul serves each and the multi-slice LoRA expand adds straight into the stacked
    output. Tied embeddings use the embedding table as lm_head.

    FP8 (quant LS_QUANT_FP8, or an FP8 checkpoint: model_config.h): the seven projections
    are held as E4M3 codes with one fp32 scale per output row (kernels/ops.h), quantized
    at load from whole rows (a tensor-parallel rank keeps its window of codes and each row's
    scale), or read as stored with their per-row or per-tensor scales (block scales are
    requantized per row); the forward runs them through matmul_fp8 (W8A8: activations
    quantized per token). Everything else keeps its dtype. docs/engine.md says more.

    Architectures: Llama (rope_theta, llama3/linear rope_scaling), Qwen2 (qkv bias), Qwen3
    (per-head q/k RMSNorm before RoPE, explicit head_dim), Mistral. GQA throughout.
    Mistral's sliding_window is not implemented as a windowed attention: when it is set
    below max_position_embeddings, a step whose context would exceed the window is refused
    with an error (within the window, full causal attention is exact).

    The forward step. One call runs a batch of sequences; each brings the token ids it runs
    now (a prefill chunk on top of start_pos cached tokens, or one decode token), its block
    table, its LoRA slot (ls_lora_pool_assign's; LS_LORA_SLOT_BASE for the base model)
    and whether it wants the logits of its last token. Tokens are packed sequence after
    sequence in the order given; for LoRA they are grouped by slot with a permutation
    (ls_lora_batch_t.permutation), one segment per distinct adapter slot in slot order and
    each sequence's rows staying one consecutive run, so a segmented kernel reads each
    adapter's weights once however the batch interleaves adapters; base-model tokens are in
    no segment, and a step without adapters runs no LoRA op at all. A sequence may instead
    mix several adapters (ls_model_seq_t.mix, docs/lora-mixing.md): its i-th component is a
    segment of the step's LoRA pass i, whose segments carry their weight beside the slot, so
    the deltas add up pass after pass without merging any weights; a step without mixes has
    one pass.

    Workspace. Activations live in backend buffers owned by the model that grow to the
    largest step seen (doubling) and are reused; one model runs one step at a time.

    Tensor parallelism. Loaded with a communicator (comm.h) of size N, the model is rank r's
    shard (Megatron, ls_model_config_shard): its attention heads of q/k/v (KV heads split,
    or replicated when fewer than N), its slice of gate/up, the matching input columns of o
    and down, its vocabulary rows of the embedding and lm_head; only the slices are read
    from the mapped checkpoint. Every rank runs every step: the embedding and the o and
    down outputs (LoRA included) are partial sums, all-reduced in place (two all-reduces a
    layer and one for the embedding); each rank computes the
    logits of its vocabulary slice and rank 0 gathers the rows, so only rank 0 has logits
    to read, ban or sample. The LoRA pool must be sharded the same way (lora_pool.h). A
    step first makes every rank agree that it can run it (ls_model_agree), so a rank that
    fails alone fails the step everywhere instead of leaving its peers at a collective, and
    ends with every rank agreeing that its ops ran (a GPU backend reports a failed launch only
    when it synchronizes), before rank 0's logits are read.
*/
#ifndef LS_MODEL_H
#define LS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "comm.h"
#include "lora_pool.h"
#include "ls_limits.h"
#include "model_config.h"

typedef struct ls_model ls_model_t;
typedef struct ls_kv_cache ls_kv_cache_t;

// Called while loading: what is being uploaded (a tensor name), bytes uploaded so far and
// in all (of the checkpoint as stored).
typedef void ls_model_progress_fn(void *arg, const char *what, size_t done, size_t total);

// Loads the model in dir onto be (which must outlive it): all of it with comm NULL, else
// the shard of comm's rank (comm, joined on be, must outlive the model too). progress may
// be NULL. NULL + err (naming the file and tensor) on any failure, or when the model does
// not split over comm's ranks.
ls_model_t *ls_model_load(const char *dir, ls_backend_t *be, ls_comm_t *comm, ls_quant_t quant,
                          ls_model_progress_fn *progress, void *arg, char *err, size_t errlen);
// A model of the given config with random weights and no checkpoint, for benchmarks at
// real shapes (--load-format dummy). config: a model directory, a config.json path, or the
// JSON text itself (starting with '{'). Weights are stored in the config's torch_dtype;
// values are deterministic in seed and scaled as tests/engine/random_model.h scales its
// random models (projections U(-1,1)·1.7/sqrt(in), norms 1 ± 0.1, embeddings U(-1,1)),
// drawn from one 16 MB pattern per value class at pseudo-random offsets (cheap to make:
// an 8B model uploads at the backend's host-to-device speed). comm as ls_model_load.
// NULL + err on failure.
ls_model_t *ls_model_load_dummy(const char *config, ls_backend_t *be, ls_comm_t *comm,
                                ls_quant_t quant, uint64_t seed, ls_model_progress_fn *progress,
                                void *arg, char *err, size_t errlen);
// Frees the weights and workspace; idempotent, clears the pointer.
void ls_model_destroy(ls_model_t **self_p);

const ls_model_config_t *ls_model_config(const ls_model_t *self);
// The backend the model runs on.
ls_backend_t *ls_model_backend(const ls_model_t *self);
// Bytes of the weights as read: the checkpoint's as stored (the dummy weights': as made).
size_t ls_model_weight_bytes(const ls_model_t *self);
// Whether the projections are FP8 (an FP8 checkpoint, or LS_QUANT_FP8 at load).
bool ls_model_fp8(const ls_model_t *self);

// The KV cache: num_blocks pages, page p holding block p of every layer's K and V
// (docs/memory.md: (num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim)), zeroed, on
// the model's backend. The scheduler allocates blocks; the engine only follows block
// tables. NULL + err on bad sizes or allocation failure. ls_kv_cache_new stores them in
// ls_model_kv_dtype (the dtype of the checkpoint's projections: bf16 for a bf16 model, as
// HF keeps its cache; the CPU backend stores every buffer as f32 whatever is asked);
// ls_kv_cache_new_dtype takes the dtype (f32, f16 or bf16).
ls_kv_cache_t *ls_kv_cache_new(const ls_model_t *model, int num_blocks, int block_size,
                               char *err, size_t errlen);
ls_kv_cache_t *ls_kv_cache_new_dtype(const ls_model_t *model, int num_blocks, int block_size,
                                     ls_dtype_t dtype, char *err, size_t errlen);
ls_dtype_t ls_model_kv_dtype(const ls_model_t *model);
// Bytes of one block of a cache of dtype on the model's backend (K and V, every layer, as
// the backend stores them), for sizing a cache from a memory budget.
size_t ls_kv_cache_block_bytes(const ls_model_t *model, int block_size, ls_dtype_t dtype);
ls_dtype_t ls_kv_cache_dtype(const ls_kv_cache_t *self);
// The cache's pages as the arena a LoRA pool places adapters in (lora_pool.h): one pool of
// pages for KV and adapters, the scheduler deciding which page holds what.
ls_page_arena_t ls_kv_cache_arena(const ls_kv_cache_t *self);
void ls_kv_cache_destroy(ls_kv_cache_t **self_p);
int ls_kv_cache_num_blocks(const ls_kv_cache_t *self);
int ls_kv_cache_block_size(const ls_kv_cache_t *self);

// One component of a mix of adapters (docs/lora-mixing.md).
typedef struct {
    int slot;     // ls_lora_pool_assign's slot (LS_LORA_SLOT_BASE: no delta)
    float weight; // > 0 and finite: the slot's scaling is multiplied by it
} ls_model_lora_part_t;

// One sequence of a step.
typedef struct {
    const int32_t *token_ids;    // (n_tokens) the tokens to run now
    int n_tokens;                // >= 1: a prefill chunk, or 1 for a decode step
    int start_pos;               // tokens of this sequence already in the KV cache
    const int32_t *block_table;  // (n_blocks) physical blocks covering start_pos + n_tokens
    int n_blocks;
    int lora_slot;               // ls_lora_pool_assign's slot, or LS_LORA_SLOT_BASE
    bool want_logits;            // logits of the last token (a logit row of this step)
    // a mix of adapters instead of lora_slot (NULL: lora_slot alone): n_mix components
    // (1 .. LS_LORA_MIX_MAX), whose deltas, each times its weight, add up
    const ls_model_lora_part_t *mix;
    int n_mix;
} ls_model_seq_t;

// Runs one step of n_seqs sequences (seqs is (n_seqs)): writes their k/v into kv at their
// positions and computes the logits of the sequences that want them, in seqs order, on
// the backend. pool may be NULL when every slot is LS_LORA_SLOT_BASE; with a pool whose arena
// is kv's pages, the pages the step writes KV into are claimed first (ls_lora_pool_claim: an
// adapter still on one of them leaves its slot). Returns the number
// of logit rows, or -1 + err for a malformed step (token id out of the vocabulary, a block
// table too short or naming a block outside the cache, a slot outside the pool, a context
// past a sliding window) or a backend failure; tensor parallel, also when another rank
// failed the step or a collective failed (a rank died: see comm.h). Every rank returns the
// same number of rows; only rank 0 holds the logits.
int ls_model_forward(ls_model_t *self, ls_kv_cache_t *kv, ls_lora_pool_t *pool,
                     const ls_model_seq_t *seqs, int n_seqs, char *err, size_t errlen);

// Tensor parallel: whether every rank of the group can run the step at hand and its backend
// has not failed (it synchronizes first); 0 when all can, -1 + err (naming the failure when
// ok, untouched otherwise) when one cannot. Every rank joins the collective whatever its own
// state. ls_model_forward does this itself after its own checks and after its ops; a rank
// that fails the step before reaching it (an adapter it cannot place) calls this with ok
// false instead, so its peers fail the step too rather than wait for it at a collective.
// Without a comm: ok.
int ls_model_agree(ls_model_t *self, bool ok, char *err, size_t errlen);

// Copies the last step's logits of the model's vocabulary to out (n_rows, vocab_size), n_rows
// as it returned; ls_model_logits_wide with the added columns too (n_rows,
// ls_model_logits_width). -1 on a rank other than 0 of a tensor-parallel group (which has
// only its slice), or out of memory.
int ls_model_logits(ls_model_t *self, float *out);
int ls_model_logits_wide(ls_model_t *self, float *out);
// The width of the last step's logits rows (every forward sets it): vocab_size, plus
// --lora-extra-vocab-size columns when the pool holds token rows (engine/lora_tokens.h):
// column vocab_size + k is the added id vocab_size + k of the adapter of the row's sequence
// when it has one, -inf otherwise. Sampling, bans and masks index rows of this width.
int ls_model_logits_width(const ls_model_t *self);

// Sets the logits of ids (n) in the last step's logit row `row` to -inf, so sampling can never
// pick them (EOS and stop ids before min_new_tokens). Ids outside the vocabulary are ignored.
// Works on every backend through a buffer upload. -1 for a bad row, a backend failure or a
// rank other than 0.
int ls_model_ban_tokens(ls_model_t *self, int row, const int32_t *ids, int n);

// Samples the last step's logit rows on the backend (ls_sampling_sample semantics);
// batch->n_rows must equal the step's logit rows. Outputs as backend->sample; -1 on a rank
// other than 0.
int ls_model_sample(ls_model_t *self, const ls_sampling_batch_t *batch, int32_t *tokens,
                    float *logprobs, int32_t *top_ids, float *top_logprobs);

#endif
