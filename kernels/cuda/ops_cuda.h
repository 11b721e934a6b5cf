/*  kernels/cuda/ops_cuda.h — launchers of the CUDA kernels, callable from C.

    Every launcher computes what the kernel of the same name in kernels/ops.h computes (the
    contract, tie-breaks and untouched outputs included) and enqueues it on `stream`; none
    of them synchronizes. Pointers are device pointers. Activations (x, y, out, tmp,
    residual, q, logits) are fp32. Weight-like arguments (tables, matmul weights and bias,
    norm weights, inv_freq, LoRA pools) and the KV caches are stored as any of the three
    dtypes below, passed beside the pointer; values are widened to fp32 on load and all
    arithmetic is fp32 (reductions of the norms and of the sampling softmax in double, as
    the CPU references do them).

    Launchers return the cudaError_t of the launch (cudaGetLastError), 0 on success.
    Shape errors are programmer errors and assert on the host.

    Per-step metadata (token ids, positions, slot mapping, block tables, LoRA tiles) is read
    from device arrays the backend filled once in step_begin; the launchers take those
    device pointers and the host-side counts that size their grids.
*/
#ifndef LS_OPS_CUDA_H
#define LS_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "lora_batch.h"

#ifdef __cplusplus
extern "C" {
#endif

// Storage dtypes; the values are those of ls_dtype_t (formats/safetensors.h).
typedef enum {
    LS_CU_F32 = 0,
    LS_CU_F16 = 1,
    LS_CU_BF16 = 2,
    LS_CU_F8E4M3 = 3, // FP8 weights and activations (ls_cu_fp8_*); ls_cu_convert widens it
} ls_cu_dtype_t;

size_t ls_cu_dtype_size(ls_cu_dtype_t dt);

// ---------------------------------------------------------------------------------------
// Elementwise and row ops

// dst (n) = src (n), converting dtypes (round to nearest even when narrowing); an F8E4M3
// src converts to F32 only
cudaError_t ls_cu_convert(void *dst, ls_cu_dtype_t dst_dt, const void *src,
                          ls_cu_dtype_t src_dt, size_t n, cudaStream_t stream);

// dst (rows, dst_stride) from the packed src (rows, chunks, w) with zero padding, as
// ls_pad_copy (kernels/ops.h); esize 2 or 4, elements moved as they are
cudaError_t ls_cu_pad_copy(void *dst, const void *src, size_t esize, size_t w, size_t chunks,
                           size_t rows, size_t dst_chunk, size_t dst_stride, cudaStream_t stream);

// out (T, C) = table (vocab, C) [ids (T) - vocab0]; ids outside [vocab0, vocab0 + vocab)
// give zero rows (another tensor-parallel rank's vocabulary)
cudaError_t ls_cu_embedding(float *out, const void *table, ls_cu_dtype_t table_dt,
                            const int32_t *ids, int T, int C, int vocab0, int vocab,
                            cudaStream_t stream);

// y (n) += x (n)
cudaError_t ls_cu_add(float *y, const float *x, size_t n, cudaStream_t stream);

// FP8 (W8A8, kernels/ops.h): q (rows, cols) E4M3 and scale (rows) from x (rows, cols) as
// ls_fp8_quantize_rows makes them (the same bits). cols a multiple of 4, rows 16-byte
// aligned (the FP8 GEMM's inputs are: cols a multiple of 16)
cudaError_t ls_cu_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int rows, int cols,
                                    cudaStream_t stream);
// y (T, out) = y · x_scale[t] · w_scale[o] (+ bias, or NULL), rounded as
// ls_matmul_fp8_forward rounds them: the scales of an FP8 GEMM that summed without them
cudaError_t ls_cu_fp8_scale(float *y, const float *x_scale, const float *w_scale,
                            const void *bias, ls_cu_dtype_t bias_dt, int T, int out,
                            cudaStream_t stream);

// y (T, out) = (xq · wᵀ)[t][o] · x_scale[t] · w_scale[o] (+ bias, or NULL) in one launch,
// rounded as ls_matmul_fp8_forward rounds them (products exact, fp32 sums in another order):
// the decode-shaped FP8 GEMM on CUDA cores, for a few tokens (engine/fp8_gemm.h
// LS_FP8_SMALL_T, where the tensor cores' ls_cu_fp8_gemm_tc cannot run). xq (T, in) and
// w (out, in) E4M3 codes, 16-byte aligned, in % 16 == 0.
cudaError_t ls_cu_fp8_gemm_small(float *y, const uint8_t *xq, const float *x_scale,
                                 const uint8_t *w, const float *w_scale, const void *bias,
                                 ls_cu_dtype_t bias_dt, int T, int in, int out,
                                 cudaStream_t stream);
// The same on the FP8 tensor cores (mma.sync m16n8k32 E4M3, sm_89+; engine/fp8_gemm.h
// LS_FP8_TC_T): the products exact, sums of 64 on the tensor cores (~14 bits) added in fp32.
// in % 16 == 0, xq and w 16-byte aligned, any T and out; w written by no kernel it may
// overlap (its first weights are loaded before its programmatic wait, as the GEMV's). Only
// where ls_cu_fp8_gemm_tc_ok: 1 when the kernel loaded for the current device was compiled
// with the mma (sm_89+), else 0.
cudaError_t ls_cu_fp8_gemm_tc(float *y, const uint8_t *xq, const float *x_scale,
                              const uint8_t *w, const float *w_scale, const void *bias,
                              ls_cu_dtype_t bias_dt, int T, int in, int out,
                              cudaStream_t stream);
int ls_cu_fp8_gemm_tc_ok(void);

// The decode GEMM of a few tokens on 16-bit weights (gemv.cu), in one launch with
// programmatic dependent launch: y (T, out) = (accumulate ? y : 0) + x (T, in) · w (out,
// in)ᵀ (+ bias (out), or NULL), as the matmul op and ls_matmul_forward order them; x bf16 or
// f16 as w, or fp32 rounded to w's dtype first (as ls_cu_convert rounds). Only where
// ls_cu_gemv_ok: T 1..LS_CU_GEMV_MAX_T (past it cuBLAS: past 16 tokens each block of the
// tensor-core form reads all of x, as many bytes as its weights; gemv.cu), w BF16 or F16, x
// F32 or w's dtype, in % 8 == 0, x and w 16-byte aligned; w written by no kernel this one
// may overlap (its blocks read their first weights before they wait: model weights).
// sms > 0: its blocks at once no more than sms SMs hold (room for the side stream's LoRA
// kernels, as cuBLAS's SM count target); 0: all. pf: bytes of the weights the CUDA-core
// forms' blocks (1 and 2 tokens) ask of L2 before they wait for the kernel before them —
// LS_CU_GEMV_PF after the small kernels (about what HBM moves while they run; the sweep:
// kernels/cuda/dev/README.md, "The decode GEMM of a few tokens"), LS_CU_GEMV_PF_ATTN after
// attention, whose reads of the KV cache a larger prefetch holds up (README, the same
// section). The tensor-core form (3 tokens and up) loads the first 256 k of its rows before
// the wait instead, whatever pf (faster in the step after attention too: README, "The
// tensor-core GEMV").
#define LS_CU_GEMV_MAX_T 16
#define LS_CU_GEMV_PF (8L << 20)
#define LS_CU_GEMV_PF_ATTN (2L << 20)
int ls_cu_gemv_ok(int T, int in, const void *x, ls_cu_dtype_t x_dt, const void *w,
                  ls_cu_dtype_t w_dt);
// The most tokens the CUDA backend gives the GEMV on this device (8 or LS_CU_GEMV_MAX_T, by
// the memory bytes an SM must take a clock; gemv.cu says why); ls_cu_gemv runs any T
// ls_cu_gemv_ok allows on any device (the tests check every form).
int ls_cu_gemv_tokens(void);
cudaError_t ls_cu_gemv(float *y, const void *x, ls_cu_dtype_t x_dt, const void *w,
                       ls_cu_dtype_t w_dt, const void *bias, ls_cu_dtype_t bias_dt, int T, int in,
                       int out, int accumulate, int sms, long pf, cudaStream_t stream);

// One token's decode block from o's projection to the next layer's q,k,v in one persistent
// kernel (block.cu): y = W_o a (+ b_o); x1 = x + y; h = rmsnorm(x1) · g2; act = silu(gate) · up
// of W_gu h (+ b_gu) (gate rows first, bf16); y = W_d act (+ b_d); then with a next layer
// (w_qkv): x = x1 + y; h = rmsnorm(x) · g1; qkv = W_qkv h (+ b_qkv); without one: x = x1 (y
// for the final RMSNorm to add). h and act rounded to bf16 as rmsnorm's and silu_mul's 16-bit
// outputs are; the same results as those ops and ls_cu_gemv up to fp32 summation order.
// Weights, norms and a (q_dim) bf16; biases (or NULL) in b_dt; x, x1, y (H), qkv fp32; act
// (inter) bf16 scratch; sync: the kernel's grid barrier, a word of zero at first that every
// launch on it adds to (one word per stream of launches). Widths multiples of 8,
// pointers 16-byte aligned. Weights are written by no kernel it may overlap
// (it reads o's first rows before its programmatic wait). Only where ls_cu_decode_block_ok.
typedef struct {
    const void *a, *w_o, *b_o, *g2, *w_gu, *b_gu, *w_d, *b_d, *g1, *w_qkv, *b_qkv;
    ls_cu_dtype_t b_dt;
    float *x, *x1, *y, *qkv;
    void *act;
    unsigned long long *sync;
    int H, q_dim, inter, qkv_dim;
    float eps;
} ls_cu_block_t;
int ls_cu_decode_block_ok(const ls_cu_block_t *b);
cudaError_t ls_cu_decode_block(const ls_cu_block_t *b, cudaStream_t stream);

// y (T, out) += bias (out)
cudaError_t ls_cu_bias_add(float *y, const void *bias, ls_cu_dtype_t bias_dt, int T,
                           int out, cudaStream_t stream);

// out (T, inter) = silu(g[:, :inter]) * g[:, inter:], g = gate_up (+ delta, or NULL); lp
// (T, inter, lp_dt), or NULL: out rounded to lp_dt as ls_cu_convert rounds, or for
// LS_CU_F8E4M3 out's rows quantized as ls_cu_fp8_quantize_rows quantizes them (codes in lp,
// scales in lp_scale (T); else lp_scale unused). out NULL: lp (16-bit) alone is written
cudaError_t ls_cu_silu_mul(float *out, void *lp, ls_cu_dtype_t lp_dt, float *lp_scale,
                           const float *gate_up, const float *delta, int T, int inter,
                           cudaStream_t stream);

// out (n_rows, C) = x (T, C) [rows (n_rows)]
cudaError_t ls_cu_rows_gather(float *out, const float *x, const int32_t *rows, int n_rows,
                              int C, cudaStream_t stream);

// out (T, C) = rmsnorm(v (+ residual)) * w (C), v = x (+ x2, or NULL); residual (T, C)
// updated, or NULL; out may alias x; lp (T, C, lp_dt) and lp_scale, or NULL, and out NULL:
// as ls_cu_silu_mul's. w is written by no kernel it may overlap (read before its
// programmatic wait: model weights)
cudaError_t ls_cu_rmsnorm(float *out, void *lp, ls_cu_dtype_t lp_dt, float *lp_scale,
                          float *residual, const float *x, const float *x2, const void *w,
                          ls_cu_dtype_t w_dt, int T, int C, float eps, cudaStream_t stream);

// in place on x (T, row_stride) holding (n_heads, head_dim); w (head_dim)
cudaError_t ls_cu_rmsnorm_heads(float *x, const void *w, ls_cu_dtype_t w_dt, int T,
                                int n_heads, int head_dim, int row_stride, float eps,
                                cudaStream_t stream);

// ---------------------------------------------------------------------------------------
// Paged KV cache and attention (caches stored as cache_dt)

// The caches are blocks of (block_size, n_kv_heads*head_dim) elements, block_stride elements
// apart (ls_kv_cache_store, kernels/ops.h).

// RoPE then the store, in one pass: x (T, row_stride) holds n_heads q heads, n_kv_heads k
// heads and n_kv_heads v heads side by side; q and k rotate in place at positions (T)
// (inv_freq (head_dim/2)), then caches [slot_mapping (T)] = k (rotated), v; slot < 0 stores
// nothing. x2 (T, row_stride), or NULL, is added first (as if x were x + x2; v itself is
// left as it is, the v cache gets v + v2). head_dim <= 512. inv_freq is written by no kernel
// it may overlap (read before its programmatic wait: the model's)
cudaError_t ls_cu_rope_kv_store(float *x, const float *x2, void *k_cache, void *v_cache,
                                ls_cu_dtype_t cache_dt, const int32_t *positions,
                                const int32_t *slot_mapping, const void *inv_freq,
                                ls_cu_dtype_t inv_dt, int T, int n_heads, int n_kv_heads,
                                int head_dim, int row_stride, int block_size,
                                size_t block_stride, cudaStream_t stream);

// out (T, n_heads*head_dim) in out_dt: LS_CU_F32, or LS_CU_BF16 / LS_CU_F16, the fp32 values
// rounded as ls_cu_convert rounds them (the input of a 16-bit matmul, with no conversion pass
// between); q (T, row_stride); tok_seq (T) is the sequence of each token (derived from
// q_indptr on the host), positions (T), block_tables (n_seqs, max_blocks). head_dim <= 256.
cudaError_t ls_cu_attention(void *out, ls_cu_dtype_t out_dt, const float *q, const void *k_cache,
                            const void *v_cache, ls_cu_dtype_t cache_dt,
                            const int32_t *tok_seq, const int32_t *positions,
                            const int32_t *block_tables, int max_blocks, int T, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, int row_stride,
                            size_t block_stride, cudaStream_t stream);

// The warps per CTA and CTAs per cluster of the last v2/tc launch of ls_cu_attention (0, 0
// after a v1 launch): for tests of the plan. Not thread-safe.
void ls_cu_attention_last_plan(int *warps, int *cluster);

// Prefill attention: the same causal attention for whole sequences of a step with many query
// tokens, on query tiles (FlashAttention-2's plan on the tensor cores; attention.cu: warpgroup
// MMA on sm_90 for head_dim 128, mma.sync otherwise). seqs
// (n_seqs, 3) holds (sequence, first token row, tokens) of each sequence it takes, rows
// packed as ls_attn_meta_t packs them; the caches as ls_cu_attention's (blocks block_stride
// elements apart, a multiple of 8); it writes those rows of out (in out_dt, as
// ls_cu_attention's) and no other; max_q is the
// most tokens of any of them. Not fp32-exact as ls_cu_attention is: q and the softmax
// weights are rounded to bf16 for the products (relative 2^-8 each), sums stay fp32. Only
// where ls_cu_attention_prefill_ok: 1 for bf16 caches, head_dim 64 or 128, groups
// (n_heads / n_kv_heads) up to 128, rows and pointers aligned for 16-byte loads (sm_80+).
int ls_cu_attention_prefill_ok(const void *out, const float *q, const void *k_cache,
                               const void *v_cache, ls_cu_dtype_t cache_dt, int n_heads,
                               int n_kv_heads, int head_dim, int row_stride);
cudaError_t ls_cu_attention_prefill(void *out, ls_cu_dtype_t out_dt, const float *q,
                                    const void *k_cache,
                                    const void *v_cache, ls_cu_dtype_t cache_dt,
                                    const int32_t *seqs, int n_seqs, int max_q,
                                    const int32_t *positions, const int32_t *block_tables,
                                    int max_blocks, int n_heads, int n_kv_heads, int head_dim,
                                    int block_size, int row_stride, size_t block_stride,
                                    cudaStream_t stream);
// The prefill kernels ls_cu_attention_prefill chooses between, for tests and the dev bench
// (which run each on one device): MMA (mma.sync, sm_80+, any head_dim the op takes) and
// WGMMA (warpgroup MMA, the sm_90a build on a compute capability 9.0 device, head_dim 128),
// which ls_cu_attention_prefill runs wherever it can. Same contract and bound; WGMMA returns
// cudaErrorNotSupported where it cannot run.
typedef enum { LS_CU_PREFILL_MMA, LS_CU_PREFILL_WGMMA } ls_cu_prefill_kernel_t;
// The kernel ls_cu_attention_prefill runs for head_dim on this device: WGMMA where it can run,
// MMA elsewhere (the one owner of that choice: the dispatch, the pick's constants and the
// tests follow it).
ls_cu_prefill_kernel_t ls_cu_attention_prefill_which(int head_dim);
cudaError_t ls_cu_attention_prefill_kernel(void *out, ls_cu_dtype_t out_dt, const float *q,
                                           const void *k_cache,
                                           const void *v_cache, ls_cu_dtype_t cache_dt,
                                           const int32_t *seqs, int n_seqs, int max_q,
                                           const int32_t *positions,
                                           const int32_t *block_tables, int max_blocks,
                                           int n_heads, int n_kv_heads, int head_dim,
                                           int block_size, int row_stride, size_t block_stride,
                                           ls_cu_prefill_kernel_t which, cudaStream_t stream);
// The CUDA backend's split of a step between the two plans: the sequences of the step
// (q_indptr, ctx_lens of n_seqs, as ls_attn_meta_t holds them) that go to
// ls_cu_attention_prefill when it runs the prefill kernel which
// (ls_cu_attention_prefill_which); the rest go to ls_cu_attention. Writes their (sequence,
// first token row, tokens) to seqs in row order and returns how many; seqs has room for 3
// ints per sequence of at least LS_CU_PREFILL_MIN_Q tokens (it is the scratch of the choice
// too).
//
// A cost model fitted to dev_prefill (an H100, Llama-3-8B's heads; kernels/cuda/dev/
// README.md): ls_cu_attention costs about the same per causal (query, key) pair whatever the
// sequences (0.48-0.54 ns a pair a layer once past a few dozen queries in all); a prefill
// kernel, while its grid fits the GPU, costs the walk of its longest context over its keys,
// the shorter sequences beside it riding along. It takes the candidates (at least
// LS_CU_PREFILL_MIN_Q tokens) of contexts up to a limit C, C minimizing the pairs of the
// candidates above C plus the kernel's key cost in pairs x C (none where that is never below
// all the candidates' pairs). The key cost is the kernel's own: LS_CU_PREFILL_KEY_PAIRS_MMA
// (~0.045 us a key) and LS_CU_PREFILL_KEY_PAIRS_WGMMA (~0.034 us). So one chunk on a long
// prefix goes to it from ~100 queries on mma.sync and ~74 on wgmma (2,048 cached tokens;
// measured: the old kernel faster at 64, mma.sync at 128, wgmma at 80), a prompt alone from
// twice the key cost (192, 144: the causal triangle holds half the pairs), k chunks on like
// prefixes from ~1/k of the single chunk's queries each, and a short chunk on a context far
// longer than the others' stays with ls_cu_attention. Past one wave the prefill kernels do
// 6-12 times the old kernel's pairs a second (2K, 8K prompts), so what they take never runs
// slower there either.
int ls_cu_attention_prefill_pick(const int32_t *q_indptr, const int32_t *ctx_lens, int n_seqs,
                                 ls_cu_prefill_kernel_t which, int32_t *seqs);
// the fewest query tokens of a sequence the prefill kernel is given: below, its query tiles
// of 128 rows would be mostly empty (16 tokens x a group of 4 fill half), and decodes
// spread over clusters on the decode-shaped kernel
#define LS_CU_PREFILL_MIN_Q 16
// decode-shaped pairs that cost as much as one key of a prefill kernel's longest walk (H100),
// rounded up so that near-ties go to the fp32-exact kernel. mma.sync: 0.045 us / 0.48-0.54 ns
// = 84-94; wgmma: 0.032-0.035 us a key (68-74 us for 32-128 queries on 2,048 cached tokens) /
// 0.48-0.54 ns = 63-71 (the crossover measured between 64 and 80 queries on 2K and a prompt
// of 150 faster on it bound it to 64-75)
#define LS_CU_PREFILL_KEY_PAIRS_MMA 96
#define LS_CU_PREFILL_KEY_PAIRS_WGMMA 72

// ---------------------------------------------------------------------------------------
// LoRA (SGMV): the segment description is flattened on the host, once per step, into
// tiles of at most LS_CU_LORA_TILE consecutive segment positions of one segment whose slot
// has rank > 0. Segments of rank-0 slots get no tile, so they cost nothing at all.

// (8: the tensor-core kernels' mma is 8 tokens wide, so a popular adapter's tiles fill it and
// its A and B are read once per 8 of its requests)
#define LS_CU_LORA_TILE 8
// Positions of a long tile: the expand of a segment longer than LS_CU_LORA_TILE (a prefill,
// or many requests on one adapter outside decode-shaped steps) goes over tiles of this many,
// so that a column's B row is read once per LS_CU_LORA_LONG positions
#define LS_CU_LORA_LONG 32

// flags of the LoRA launchers
enum {
    LS_CU_LORA_ACC = 1,    // expand adds into y (else y = the delta on the tiles' rows)
    LS_CU_LORA_NO_PDL = 2, // plain launches: no block starts before its predecessor ends.
                           // For kernels beside a GEMM (the side queue), whose early
                           // blocks, waiting, would hold SMs the GEMM needs.
    LS_CU_LORA_ONE = 4,    // every tile holds one position (decode over distinct adapters):
                           // the expand is built for that and keeps twice the B in flight
};

typedef struct {
    int32_t p0;   // first segment position of the tile
    int32_t n;    // positions in the tile, 1..LS_CU_LORA_TILE
    int32_t slot; // pool slot
    int32_t rank; // lora_ranks[slot], > 0
    float scale;  // the expand's factor: scalings[slot] times the segment's weight
                  // (ls_lora_batch_t.seg_weights), as the CPU reference computes it
} ls_cu_lora_tile_t;

// The adapters come through the page table (ls_lora_pages_t, kernels/lora_batch.h; device
// pointers in device memory): A as rows (row k*r_max + j: rank row j of slice k, `in`
// elements), B as chunks (chunk c: rank columns 8c .. 8c+7 of every output row). The tuned
// kernels take whole rows and chunks (np == 1) and resolve a tile's pointers once per block,
// before the programmatic-launch wait; pieces (np > 1) run the fallback kernels.

// tmp (T, n_slices*r_max) columns k*r_max + j, j < rank, of the tiles' rows;
// x (T, in) in x_dt: LS_CU_F32, or a_dt (a 16-bit copy of the activations, widened exactly
// as it is read); a: rows of in elements; perm (positions) or NULL;
// max_rank: the largest rank among the tiles (sizes the grid)
cudaError_t ls_cu_lora_shrink(float *tmp, const void *x, ls_cu_dtype_t x_dt, ls_lora_pages_t a,
                              ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, int max_rank, const int32_t *perm, int in,
                              int n_slices, int r_max, unsigned flags, cudaStream_t stream);

// y (T, out_total) += tile.scale * tmp_k · B_kᵀ on the tiles' rows (flags without
// LS_CU_LORA_ACC: =, with the bits of += into zeros; other rows untouched either way);
// b: chunks of out_total rows; slice_offsets (n_slices+1) host memory; max_rank: the
// tiles' largest rank (<= r_max)
cudaError_t ls_cu_lora_expand(float *y, const float *tmp, ls_lora_pages_t b,
                              ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, int max_rank, const int32_t *perm,
                              const int32_t *slice_offsets, int n_slices, int r_max,
                              unsigned flags, cudaStream_t stream);

// ls_cu_lora_expand (with LS_CU_LORA_ACC) over long tiles: tiles of up to LS_CU_LORA_LONG
// positions of one segment, a block per (tile, 256 columns), the tile's tmp rows in shared
// memory and each thread's B row read once for all of them
cudaError_t ls_cu_lora_expand_long(float *y, const float *tmp, ls_lora_pages_t b,
                                   ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles,
                                   int n_tiles, const int32_t *perm,
                                   const int32_t *slice_offsets, int n_slices, int r_max,
                                   cudaStream_t stream);

// y (T, C) rows[i] = 0 for i < n_rows (the rows no LoRA tile covers, when a delta is
// written rather than added)
cudaError_t ls_cu_rows_zero(float *y, const int32_t *rows, int n_rows, int C,
                            cudaStream_t stream);

// Both at once for decode-shaped steps: y (T, out_total) += tile.scale * (x · A_kᵀ) · B_kᵀ
// on the tiles' rows (without LS_CU_LORA_ACC: =, as ls_cu_lora_expand), x, A and B as above.
// tmp is scratch of LS_CU_LORA_PARTS arrays (T, n_slices*r_max), part_stride (= T *
// n_slices*r_max) floats apart, or of one array with part_stride 0. Where shrink v3
// (one-position tiles, LS_CU_LORA_ONE, 16-bit A) or the tensor-core shrink applies and
// part_stride > 0, K is split over blocks that leave their partial sums in the parts and
// the expand sums them (no cluster to co-schedule beside a GEMM);
// else shrink into tmp then expand, as the two launchers above.
#define LS_CU_LORA_PARTS 8
cudaError_t ls_cu_lora_apply(float *y, float *tmp, size_t part_stride, const void *x,
                             ls_cu_dtype_t x_dt, ls_lora_pages_t a, ls_cu_dtype_t a_dt,
                             ls_lora_pages_t b,
                             ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles, int n_tiles,
                             int max_rank, const int32_t *perm,
                             const int32_t *slice_offsets, int in, int n_slices, int r_max,
                             unsigned flags, cudaStream_t stream);

// gate_up's LoRA folded into SiLU·mul, for decode-shaped steps with several positions a tile
// (the delta is never written: lora.cu, "SiLU·mul with gate_up's LoRA"). Whether it runs
// for these arguments (those of ls_cu_lora_apply over gate_up's two slices of inter columns,
// tmp its scratch): where that op would run the tensor-core shrink into parts and expand v4.
bool ls_cu_lora_silu_mul_fits(const void *x, ls_cu_dtype_t x_dt, ls_lora_pages_t a, ls_cu_dtype_t a_dt,
                              ls_lora_pages_t b, ls_cu_dtype_t b_dt, const float *tmp, int max_rank, int in,
                              int inter, int r_max, unsigned flags);
// The shrink: tmp's parts (part_stride = T * 2 * r_max floats apart), as ls_cu_lora_apply's.
cudaError_t ls_cu_lora_silu_shrink(float *tmp, size_t part_stride, const void *x, ls_cu_dtype_t x_dt,
                                   ls_lora_pages_t a, const ls_cu_lora_tile_t *tiles, int n_tiles,
                                   int max_rank, const int32_t *perm, int in, int r_max, unsigned flags,
                                   cudaStream_t stream);
// out / lp (T, inter) = ls_cu_silu_mul of gate_up (T, 2 * inter) plus its LoRA from the
// shrink's tmp and B (bf16 chunks of 2 * inter rows), bit for bit ls_cu_lora_apply writing the
// delta and ls_cu_silu_mul adding it: the tiles' rows, and zero_rows (n_zero_rows, the rows no
// tile covers) without LoRA. lp: F32, F16 or BF16 (not FP8); out or lp may be NULL, not both.
// in: gate_up's input width (the shrink's parts follow from it).
cudaError_t ls_cu_lora_silu_mul(float *out, void *lp, ls_cu_dtype_t lp_dt, const float *gate_up,
                                const float *tmp, size_t part_stride, ls_lora_pages_t b,
                                const ls_cu_lora_tile_t *tiles, int n_tiles, int max_rank,
                                const int32_t *perm, const int32_t *zero_rows, int n_zero_rows, int T,
                                int in, int inter, int r_max, cudaStream_t stream);

// The embedding's LoRA shrink (lora_vocab.cu): tmp (T, r_max) [row, j] = A_w[j][ids[row]]
// for the tiles' rows, j < rank; ids (T) token ids in [0, vocab); a: chunks of vocab rows
// (the embedding's A held transposed: ls_lora_embed_shrink); perm as ls_cu_lora_shrink's.
// ls_cu_lora_expand follows with one slice.
cudaError_t ls_cu_lora_embed_shrink(float *tmp, const int32_t *ids, ls_lora_pages_t a,
                                    ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                                    int n_tiles, const int32_t *perm, int vocab, int r_max,
                                    cudaStream_t stream);

// LoRA on rows each with its own slot and factor (lm_head on the logit rows), as
// ls_lora_rows: y (R, out) [i] += t.scale · B_w · (A_w · x[i]) for each tile t (a row i =
// t.p0 of slot w = t.slot, rank t.rank; t.n is 1), rows without a tile untouched; tmp (R,
// r_max) scratch; x (R, in); a: rows of in elements; b: chunks of out rows; tiles (n_tiles)
// device memory, at most one a row
cudaError_t ls_cu_lora_rows(float *y, float *tmp, const float *x, ls_lora_pages_t a,
                            ls_cu_dtype_t a_dt, ls_lora_pages_t b, ls_cu_dtype_t b_dt,
                            const ls_cu_lora_tile_t *tiles, int n_tiles, int in, int out,
                            int r_max, cudaStream_t stream);

// Trainable tokens (lora_tokens.cu), as ls_token_rows_forward: out (T, C) [t] = rows (N, C)
// [idx[t]] where idx[t] >= 0; idx (T) device memory.
cudaError_t ls_cu_token_rows(float *out, const void *rows, ls_cu_dtype_t rows_dt,
                             const int32_t *idx, int T, int C, cudaStream_t stream);
// As ls_token_logits_forward: logits (R, V) [i, ids[k]] = rows (N, C) [k] · x (R, C) [i] for
// k in [f, f + n) of each tile (i, f, n); ids (N) and tiles (n_tiles, 3) device memory.
cudaError_t ls_cu_token_logits(float *logits, const float *x, const void *rows,
                               ls_cu_dtype_t rows_dt, const float *ids, const int32_t *tiles,
                               int n_tiles, int C, int V, cudaStream_t stream);
// As ls_logits_widen_forward: wide (R, W) = head (R, V), columns V .. W-1 -inf.
cudaError_t ls_cu_logits_widen(float *wide, const float *head, int R, int V, int W,
                               cudaStream_t stream);

// The most local memory per thread (bytes) among the kernels the decode LoRA op runs on
// 16-bit pools by default (for tests: it must be 0), -1 if it cannot be read.
long ls_cu_lora_local_bytes(void);

// ---------------------------------------------------------------------------------------
// Sampling: ls_sampling_sample on the device. All arrays are device memory.

// The per-row parameters as the device reads them (a copy of ls_sampling_params_t plus
// the host-computed logf(min_p), so that min-p compares against the very value the CPU
// reference forms).
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float frequency_penalty;
    float presence_penalty;
    float log_min_p; // logf(min_p) if min_p > 0
    uint64_t seed;
    uint64_t step;
    int n_logprobs;
} ls_cu_sample_params_t;

// A chunk's share of a row's sampling pass (sampling.cu): its largest logit and the first
// id of it, and its sum of exp(logit - that max); in the draw, its best race key and id.
typedef struct {
    float max;
    int id;
    double sum;
} ls_cu_sample_part_t;

enum { LS_CU_SAMPLE_MAX_CHUNKS = 64 };

typedef struct {
    // inputs
    int n_rows, V, max_top_n;
    const float *logits;                      // (n_rows, V)
    const ls_cu_sample_params_t *params;      // (n_rows)
    const int32_t *prompt_indptr, *prompt_ids; // NULL: no prompt
    const int32_t *output_indptr, *output_ids; // NULL: no output
    const int32_t *mask_index;                 // (n_rows) -1: no mask; NULL: no masks
    const uint32_t *masks;                     // (n_masks, (V + 31) / 32) allowed-token bits
    // scratch, (n_rows, V) each; mark must be all zero and is left all zero
    float *lp;
    int32_t *mark;
    ls_cu_sample_part_t *part; // (n_rows, ls_cu_sample_chunks(n_rows, V))
    void *select;              // ls_cu_sample_select_bytes(n_rows, V) when n_sampled > 0
    // what the rows ask for (the launches follow): rows with temperature > 0, of them rows
    // with top-k or top-p, and of those rows with both
    int n_sampled, n_truncated, n_top_k_and_p;
    // outputs
    int32_t *tokens;   // (n_rows)
    float *logprobs;   // (n_rows)
    int32_t *top_ids;  // (n_rows, max_top_n) or NULL
    float *top_lps;    // (n_rows, max_top_n) or NULL
} ls_cu_sample_args_t;

// Bytes of the scratch the draw and the truncation's select take for n_rows rows of V
// (histograms and counts: about 22 KB a row, plus 1 KB a row's chunk).
size_t ls_cu_sample_select_bytes(int n_rows, int V);
// Chunks ls_cu_sample cuts each of n_rows rows of V into (<= LS_CU_SAMPLE_MAX_CHUNKS), on the
// current device: the parts it needs.
int ls_cu_sample_chunks(int n_rows, int V);
cudaError_t ls_cu_sample(const ls_cu_sample_args_t *a, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
