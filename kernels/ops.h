/*  kernels/ops.h — the model engine's kernels: CPU reference implementations.

    These functions are the semantic contract of every backend. The CUDA kernels under
    kernels/cuda must compute the same thing (to within the tolerances that
    tests/kernels states) and are checked against these on random inputs. Where a
    choice could go either way (what a kernel leaves untouched, tie-breaking, the order of
    sampling filters, which logprobs are returned) it is written down here.

    Conventions, for every function below:
    - activations are fp32, row-major; shapes are written (rows, cols);
    - a "row stride" is the distance in floats between consecutive token rows, so that q, k
      and v can be addressed inside one stacked qkv buffer (T, q_dim + 2*kv_dim);
    - int32 metadata (positions, slot mappings, block tables, ...) lives on the host in the
      CPU reference; a device backend keeps a device copy per step;
    - asserts only catch programmer errors (bad shapes, out-of-range indices).
*/
#ifndef LS_OPS_H
#define LS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "lora_batch.h"

// ---------------------------------------------------------------------------------------
// Weight conversion (used at upload time by backends that compute in fp32)

// dst is (n), src is (n) raw bf16 / IEEE half bit patterns
void ls_convert_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void ls_convert_f16_to_f32(float *dst, const uint16_t *src, size_t n);

// Scatters a packed image into padded blocks (LoRA slot loads: an adapter of rank r into a
// slot of r_max, its host image holding only the r rows or columns it has). For row i < rows,
// chunk j < chunks and c < dst_chunk:
//   dst[i*dst_stride + j*dst_chunk + c] = c < w ? src[(i*chunks + j)*w + c] : 0
// Elements are esize bytes (2 or 4) moved as they are, never converted. w may be 0 (zero
// fill; src unused), w <= dst_chunk, chunks*dst_chunk <= dst_stride.
// dst is (rows, dst_stride), src is (rows, chunks, w)
void ls_pad_copy(void *dst, const void *src, size_t esize, size_t w, size_t chunks, size_t rows,
                 size_t dst_chunk, size_t dst_stride);

// ---------------------------------------------------------------------------------------
// Dense ops

// y = x · Wᵀ (+ bias), or y += x · Wᵀ (+ bias) when accumulate != 0. OpenBLAS sgemm.
// y is (T, out), x is (T, in), w is (out, in) as stored by HF, bias is (out) or NULL
void ls_matmul_forward(float *y, const float *x, const float *w, const float *bias,
                       int T, int in, int out, int accumulate);

// FP8 (W8A8). A matrix is held row by row as E4M3 codes q (formats/safetensors.h) and one
// fp32 scale s per row, value = e4m3(q)·s. Quantizing a row: s = amax|row| / 448 (IEEE
// division; 1 for an all-zero row), q = e4m3(x / s) to nearest even, saturating at ±448 —
// the largest magnitude of the row lands on 448 exactly. Weights are quantized per output
// channel (a row of (out, in)), activations per token (a row of (T, in)), so every product
// of the GEMM is exact in fp32 and only the scales and the summation round.
// q is (rows, cols), scale is (rows), x is (rows, cols)
void ls_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int rows, int cols);
// The same with the codes stored as their E4M3 values in fp32 (as the CPU backend holds an
// F8E4M3 buffer). xq is (rows, cols), scale is (rows), x is (rows, cols)
void ls_fp8_quantize_rows_f32(float *xq, float *scale, const float *x, int rows, int cols);

// y = (xq · wqᵀ)[t][o] · x_scale[t] · w_scale[o] (+ bias), x's rows quantized as above
// first, the products summed in fp32 (OpenBLAS sgemm on the exact E4M3 values).
// y is (T, out), x is (T, in); w is (out, in) E4M3 values widened to fp32 (as the CPU
// backend stores an F8E4M3 buffer), w_scale is (out), bias is (out) or NULL; xq (T, in)
// and x_scale (T) are the caller's scratch and hold x's quantized rows afterwards (as
// E4M3 values in fp32); x NULL: they hold them already (ls_fp8_quantize_rows_f32 of x,
// made by the op that produced x)
void ls_matmul_fp8_forward(float *y, float *xq, float *x_scale, const float *x,
                           const float *w, const float *w_scale, const float *bias, int T,
                           int in, int out);

// out[t] = table[ids[t] - vocab0] for ids in [vocab0, vocab0 + vocab), 0 for the others:
// a tensor-parallel rank holds the rows of its vocabulary range only, and the all-reduce
// of the ranks' outputs assembles the lookup (vocab0 = 0 and the whole vocabulary: plain).
// out is (T, C), table is (vocab, C), ids is (T)
void ls_embedding_forward(float *out, const float *table, const int32_t *ids,
                          int T, int C, int vocab0, int vocab);

// HF Llama RMSNorm in fp32: out = x * rsqrt(mean(x²) + eps) * w.
// With residual != NULL it is the fused pre-norm form used between sub-layers:
// residual += x first, then out = rmsnorm(residual) (vLLM fused_add_rms_norm).
// x2 != NULL is added into x before anything else, exactly as if x had been x + x2 (a
// LoRA delta computed beside the projection that wrote x). out may alias x (not residual).
// out is (T, C), residual is (T, C) or NULL, x is (T, C), x2 is (T, C) or NULL, w is (C)
void ls_rmsnorm_forward(float *out, float *residual, const float *x, const float *x2,
                        const float *w, int T, int C, float eps);

// Per-head RMSNorm in place (Qwen3 q_norm / k_norm): every head_dim-long head vector of
// every token row is normalized on its own, with one weight vector shared by all heads.
// x is (T, row_stride) holding (n_heads, head_dim) at the start of each row, w is (head_dim)
void ls_rmsnorm_heads_forward(float *x, const float *w, int T, int n_heads, int head_dim,
                              int row_stride, float eps);

// y += x
// y is (n), x is (n)
void ls_add_forward(float *y, const float *x, size_t n);

// out = silu(gate) * up, with gate and up side by side in the output of the stacked
// gate_up projection (gate first, as PEFT/sgl-jax stack them).
// delta != NULL is added into gate_up first, exactly as if gate_up had been gate_up + delta.
// out is (T, inter), gate_up is (T, 2*inter), delta is (T, 2*inter) or NULL
void ls_silu_mul_forward(float *out, const float *gate_up, const float *delta, int T,
                         int inter);

// out[r] = x[rows[r]]: picks the token rows whose logits are needed (the last token of
// each sequence that finishes its prefill, every decode token).
// out is (n_rows, C), x is (T, C), rows is (n_rows)
void ls_rows_gather(float *out, const float *x, const int32_t *rows, int n_rows, int C);

// ---------------------------------------------------------------------------------------
// RoPE

typedef enum {
    LS_ROPE_DEFAULT = 0, // inv_freq[i] = theta^(-2i/d)
    LS_ROPE_LINEAR,      // inv_freq / factor
    LS_ROPE_LLAMA3,      // transformers _compute_llama3_parameters
} ls_rope_type_t;

typedef struct {
    ls_rope_type_t type;
    double theta;                  // rope_theta
    double factor;                 // linear and llama3
    double low_freq_factor;        // llama3
    double high_freq_factor;       // llama3
    double original_max_position;  // llama3: original_max_position_embeddings
} ls_rope_config_t;

// Fills the inverse frequency table exactly as transformers' rope init functions do, but
// evaluated in double and rounded once to fp32 (transformers evaluates the pow in fp32, so
// entries may differ from it by 1 ulp).
// inv_freq is (head_dim/2)
void ls_rope_inv_freq_init(float *inv_freq, int head_dim, const ls_rope_config_t *cfg);

// Rotates every head of every token row in place, HF rotate_half convention: element i
// pairs with element i + d/2 (not interleaved), angle = positions[t] * inv_freq[i] formed
// as an fp32 product (as HF does) and then cos/sin of it:
//   x'[i]       = x[i] * cos - x[i+d/2] * sin
//   x'[i + d/2] = x[i+d/2] * cos + x[i] * sin
// x is (T, row_stride) holding (n_heads, head_dim) at the start of each row,
// positions is (T), inv_freq is (head_dim/2); x2 (T, row_stride), or NULL, is added into x
// first, as if x were x + x2 (a LoRA delta folded in: engine/model.c)
void ls_rope_forward(float *x, const float *x2, const int32_t *positions,
                     const float *inv_freq, int T, int n_heads, int head_dim,
                     int row_stride);

// ---------------------------------------------------------------------------------------
// Paged KV cache and attention

// One forward step's attention layout. Tokens are packed sequence after sequence: the
// query tokens of sequence s are rows [q_indptr[s], q_indptr[s+1]). ctx_lens[s] counts the
// sequence's KV tokens including this step's new ones; KV index j of a sequence holds the
// token at position j, and lives in cache slot
//   block_tables[s * max_blocks + j / block_size] * block_size + j % block_size.
// A query token at position p attends to KV indices 0..p (causal), which covers a prefill
// chunk on top of a cached prefix and a decode step (one query per sequence) alike;
// normally positions of sequence s are ctx_lens[s] - q_len .. ctx_lens[s] - 1.
typedef struct {
    int n_seqs;
    int n_tokens;                // T = q_indptr[n_seqs]
    int max_blocks;              // row length of block_tables
    int max_ctx_len;             // max of ctx_lens: sizes device grids and splits
    const int32_t *q_indptr;     // (n_seqs+1)
    const int32_t *ctx_lens;     // (n_seqs)
    const int32_t *positions;    // (T) position of each token, < ctx_lens of its sequence
    const int32_t *slot_mapping; // (T) cache slot the token's k,v are written to; < 0: skip
    const int32_t *block_tables; // (n_seqs, max_blocks) physical block ids
} ls_attn_meta_t;

// A layer's cache is num_blocks blocks of (block_size, n_kv_heads, head_dim) elements,
// block_stride elements apart: block b at b * block_stride. In the worker's pool of pages a
// block is the layer's share of a page (docs/memory.md), so the stride is the page's size;
// block_size * kv_dim is a plain (num_blocks, block_size, n_kv_heads, head_dim) array.

// Writes this step's k and v rows into the paged caches at their slots (slot s: row
// s % block_size of block s / block_size). Tokens with a negative slot (padding) are skipped.
// k, v are (T, row_stride) holding (n_kv_heads, head_dim) at the start of each row,
// slot_mapping is (T); v2 (T, row_stride), or NULL: the cache gets v + v2 (v itself is
// left as it is)
void ls_kv_cache_store(float *k_cache, float *v_cache, const float *k, const float *v,
                       const float *v2, const int32_t *slot_mapping, int T, int n_kv_heads,
                       int head_dim, int row_stride, int block_size, size_t block_stride);

// Causal paged attention over the layout in meta, keys/values read from the caches only
// (kv_store must have run first). GQA: query head h uses kv head h / (n_heads/n_kv_heads).
// Scores are q·k / sqrt(head_dim); softmax in fp32 with the row max subtracted.
// out is (T, n_heads*head_dim), q is (T, row_stride) holding (n_heads, head_dim) per row,
// k_cache, v_cache as ls_kv_cache_store's
void ls_attention_forward(float *out, const float *q, const float *k_cache,
                          const float *v_cache, const ls_attn_meta_t *meta, int n_heads,
                          int n_kv_heads, int head_dim, int block_size, int row_stride,
                          size_t block_stride);

// ---------------------------------------------------------------------------------------
// LoRA: segmented shrink / expand (the SGMV references)
//
// The adapters of every pool slot, per layer and stacked target, through the page table
// (ls_lora_pages_t, kernels/lora_batch.h; docs/memory.md):
//   A (rows): slice k of the adapter in slot w is rows k*r_max .. k*r_max + rank[w] - 1, of
//     `in` elements each;
//   B (chunks): output row o of slice k is row off_k + o of the chunks, of which rank
//     columns 0 .. rank[w]-1 are used.
// n_slices is 3 for stacked qkv (outputs q_dim, kv_dim, kv_dim), 2 for gate_up
// (inter, inter), 1 for o and down. The LoRA intermediate tmp is (T, n_slices*r_max).
//
// What a device kernel must do identically:
// - touch only rows covered by a segment whose slot has rank r > 0;
// - in such a row, shrink writes tmp columns k*r_max + j for j < r only and leaves the
//   columns j >= r UNTOUCHED (they may hold garbage, even NaN); expand reads only j < r;
// - expand accumulates: y += scale_s * (tmp_k · B_kᵀ), scale_s = scaling[w] times the
//   segment's weight (seg_weights[s], 1 without them) computed as that one fp32 product and
//   applied to products (never folded into A or B), into y columns off_k .. off_{k+1}-1 only;
// - rows of rank-0 slots and uncovered rows of tmp and y are not read nor written;
// - the pages are read only where they hold a slot's rows j < rank (and the chunks covering
//   them): other table entries may point anywhere.

// tmp[t, k*r_max + j] = Σ_i x[t, i] · A_w[k*r_max + j][i]   for j < rank[w]
// tmp is (T, n_slices*r_max), x is (T, in), a: rows of `in` elements
void ls_lora_shrink(float *tmp, const float *x, ls_lora_pages_t a, const ls_lora_batch_t *batch,
                    int in, int n_slices, int r_max);

// y[t, off_k + o] += scale_s · Σ_{j<rank[w]} tmp[t, k*r_max + j] · B_w[off_k + o][j]
// y is (T, out_total), tmp is (T, n_slices*r_max), b: chunks of out_total rows,
// slice_offsets is (n_slices+1): off_0 = 0 .. off_{n_slices} = out_total
void ls_lora_expand(float *y, const float *tmp, ls_lora_pages_t b, const ls_lora_batch_t *batch,
                    const int32_t *slice_offsets, int n_slices, int r_max);

// The fused decode op's reference: ls_lora_shrink into tmp, then ls_lora_expand from it
// (a device kernel may keep tmp on chip; afterwards tmp is unspecified for the caller).
// y (T, out_total), x (T, in), tmp (T, n_slices*r_max), a and b as above.
void ls_lora_fused(float *y, float *tmp, const float *x, ls_lora_pages_t a, ls_lora_pages_t b,
                   const ls_lora_batch_t *batch, const int32_t *slice_offsets, int in,
                   int n_slices, int r_max);

// LoRA on the embedding. Its A (PEFT's lora_embedding_A, (r, vocab)) is held as chunks of
// vocab rows — column t of A is row t of the chunks — so the shrink of token id t is a
// gather of that row; then the usual expand with one slice of hidden outputs
// (lora_embedding_B, (hidden, r)) adds the delta into the embedding's output. Rows as
// ls_lora_shrink's: only covered rows of rank > 0 are touched.
// tmp[t, j] = A_w[j][ids[t]]   for j < rank[w]
// tmp is (T, r_max), ids is (T) in [0, vocab), a: chunks of vocab rows
void ls_lora_embed_shrink(float *tmp, const int32_t *ids, ls_lora_pages_t a,
                          const ls_lora_batch_t *batch, int vocab, int r_max);

// LoRA on rows each with its own slot and factor (lm_head on the logit rows: few rows, a
// vocabulary-wide output): for each row i whose slot w = slots[i] has rank r = ranks[w] > 0,
// y[i, o] += scales[i] · Σ_{j<r} B_w[o][j] · tmp[i, j],  tmp[i, j] = Σ_k A_w[j][k] · x[i, k]
// (scales[i]: the slot's scaling times the row's weight, as scale_s above); rows of rank-0
// slots are not read nor written.
// y is (R, out), tmp is (R, r_max) scratch, x is (R, in), slots and scales are (R), a: rows
// of `in` elements, b: chunks of `out` rows, ranks is (n_slots)
void ls_lora_rows(float *y, float *tmp, const float *x, ls_lora_pages_t a, ls_lora_pages_t b,
                  const int32_t *slots, const float *scales, const int32_t *ranks, int R, int in,
                  int out, int r_max);

// Trainable tokens (an adapter's own rows of the embedding and lm_head, formats/peft.h): the
// rows replace the base model's for that adapter's tokens and logits.
// out[t] = rows[idx[t]] where idx[t] >= 0; rows with idx[t] < 0 are left as they are.
// out is (T, C), rows is (N, C), idx is (T) in [-1, N)
void ls_token_rows_forward(float *out, const float *rows, const int32_t *idx, int T, int C);
// For each tile (i, f, n) and k < n: logits[i, ids[f + k]] = rows[f + k] · x[i] (an fp32
// dot product, in any order): the logits of an adapter's own lm_head rows, recomputed on
// its logit rows; every other logit is left as it is.
// logits is (R, V), x is (R, C), rows is (N, C), ids is (N) (vocabulary ids, exact in fp32),
// tiles is (n_tiles, 3) with i < R and f + n <= N
void ls_token_logits_forward(float *logits, const float *x, const float *rows, const float *ids,
                             const int32_t *tiles, int n_tiles, int C, int V);
// Added vocabulary: the logits rows widened past the base vocabulary, every added column -inf
// until ls_token_logits_forward writes an adapter's own (ids V and up) on its rows.
// wide is (R, W), head is (R, V), V <= W
void ls_logits_widen_forward(float *wide, const float *head, int R, int V, int W);

// ---------------------------------------------------------------------------------------
// Sampling
//
// Per row, in this order:
// 0. grammar mask (structured output, text/grammar.h): on a row with a mask, the logits of the
//    tokens whose bit is clear are -inf from here on, so penalties, temperature, the logprobs
//    (normalized over the allowed tokens only, as vLLM's and SGLang's masks before the sampler
//    do), greedy and the draw all see the allowed tokens only;
// 1. penalties on a copy of the raw logits:
//    repetition (HF): for each DISTINCT token in prompt ∪ output, l > 0 ? l / rp : l * rp;
//    frequency and presence (OpenAI): l -= freq * count + pres * (count > 0), count =
//    occurrences in the output tokens only;
// 2. temperature: l /= T (T == 0 means greedy, and l is left as is for the logprobs);
// 3. logprobs: log_softmax(l) over the whole vocabulary, i.e. of the PROCESSED logits
//    (after penalties and temperature, before top-k/top-p/min-p truncation) — SGLang's
//    default, not vLLM's raw-logit one. The chosen token's logprob and the top-n list come
//    from it; top-n is ordered by logprob descending, ties by lower id;
// 4. greedy: argmax(l), ties to the lower id;
// 5. otherwise truncation, on the logprob row of step 3 (so a device that ranks the
//    temperature-scaled logits instead may differ only where the subtraction of the
//    log-sum-exp rounds two values together), tokens ranked by (value desc, id asc):
//    top-k keeps the first k (k <= 0 or k >= V: off); top-p keeps the shortest prefix of
//    the top-k survivors whose renormalized probability mass (summed in double, best
//    first) reaches top_p (the token that crosses it included; top_p >= 1: off; a device
//    that sums otherwise may end the prefix on the other side of a token only where the
//    mass before it lies within that sum's rounding of top_p); min-p keeps tokens with
//    p >= min_p * p_max, i.e. lp >= lp_max + log(min_p) (min_p <= 0: off). The top token
//    always survives.
// 6. draw: exponential race (vLLM's random_sample, = Gumbel-max): the chosen token is the
//    survivor maximizing lp - log(E), E = -log(u), u = ls_rng_uniform(seed, step, id),
//    ties to the lower id.
//    One independent uniform per (seed, step, token id) makes the draw reproducible on any
//    device without a prefix sum; a device may disagree only on near-ties of the keys.

typedef struct {
    float temperature;        // 0: greedy
    int top_k;                // <= 0: off
    float top_p;              // >= 1: off
    float min_p;              // <= 0: off
    float repetition_penalty; // 1: off
    float frequency_penalty;  // 0: off
    float presence_penalty;   // 0: off
    uint64_t seed;            // per request
    uint64_t step;            // per request draw counter: tokens generated so far
    int n_logprobs;           // top-n list length, 0..max_top_n of the batch
} ls_sampling_params_t;

typedef struct {
    int n_rows;
    int max_top_n;                      // row length of the top-n outputs
    const ls_sampling_params_t *params; // (n_rows)
    const int32_t *prompt_indptr;       // (n_rows+1) into prompt_ids; NULL: no prompt
    const int32_t *prompt_ids;
    const int32_t *output_indptr;       // (n_rows+1) into output_ids; NULL: no output
    const int32_t *output_ids;
    const int32_t *mask_index;          // (n_rows) row r's mask in masks, -1 none; NULL: no masks
    const uint32_t *masks;              // (n_masks, (V + 31) / 32): bit v % 32 of word v / 32
                                        // set = token v allowed; a mask allows at least one token
} ls_sampling_batch_t;

// tokens is (n_rows), logprobs is (n_rows) or NULL, top_ids and top_logprobs are
// (n_rows, max_top_n) or NULL (entries past a row's n_logprobs are left untouched),
// logits is (n_rows, V), unchanged. Returns -1 if its scratch cannot be allocated.
int ls_sampling_sample(int32_t *tokens, float *logprobs, int32_t *top_ids,
                       float *top_logprobs, const float *logits,
                       const ls_sampling_batch_t *batch, int V);

// The counter-based generator behind the draws: a splitmix64-style hash of
// (seed, step, idx), so any device can produce draw idx of step step on its own.
uint64_t ls_rng_u64(uint64_t seed, uint64_t step, uint64_t idx);
// u in (0, 1): (top 23 bits of ls_rng_u64 + 0.5) * 2^-23, exact in fp32, never 0 or 1
float ls_rng_uniform(uint64_t seed, uint64_t step, uint64_t idx);

#endif
