/*  engine/backend.h — the compute backend interface (ggml-backend style).

    The model forward is written once against this table of function pointers; the CPU
    backend (engine/backend_cpu.c, on the references of kernels/ops.h) and the CUDA backend
    fill it in. The semantics of every op are those of the kernel of the same name in
    kernels/ops.h; this header only says how data is addressed.

    Data lives in opaque backend buffers. Ops address them through views (buffer + element
    offset) and take shapes as ints, so the forward can carve the weights of a whole layer
    or a stacked qkv activation out of one buffer without pointer arithmetic on device
    memory.

    Per-step metadata. Everything the scheduler decides for a step — token ids, positions,
    KV slots, sequence ranges, block tables, rows needing logits, and the LoRA batch
    description — is handed over ONCE with step_begin. A device backend copies it to the
    device there (one host-to-device transfer per step, into fixed device arrays so that a
    captured CUDA graph can replay with new contents) and every op of the step reads that
    copy; the caller may reuse its host arrays as soon as step_begin returns. The ops marked
    "step" below read it; their token count is the step's n_tokens.

    Ordering: ops run in call order on one stream (but see side_begin below). Uploads are
    complete when they return (a device backend may stage them); downloads, sample and
    synchronize wait for all queued work. The one exception is buffer_upload_async (LoRA
    slot loads): a copy on a second stream, ordered after the ops queued before it and
    running alongside those queued after it, tracked by an event that later ops wait on
    (event_wait) only where they read what it wrote; so a slot load overlaps the running
    step. Ops report no errors (shape errors are programmer errors and assert); device
    faults surface as -1 from synchronize, download or sample.
*/
#ifndef LS_BACKEND_H
#define LS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lora_batch.h"
#include "ls_limits.h" // LS_LORA_MIX_MAX
#include "ops.h"
#include "safetensors.h" // ls_dtype_t: the engine's one list of weight dtypes

// A backend buffer. Fields are read-only outside the backend that made it.
typedef struct {
    ls_dtype_t dtype;   // as requested
    size_t n;           // elements
    void *data;         // backend storage (host memory on CPU, device memory on CUDA)
    ls_dtype_t storage; // element type of data, the backend's choice (CPU: always f32,
                        // an F8E4M3 buffer holding the E4M3 values widened)
} ls_buffer_t;

// A piece of host memory: the source of an upload made of several.
typedef struct {
    const void *p;
    size_t bytes;
} ls_host_span_t;

// Completion of asynchronous uploads, made by the backend (opaque).
typedef struct ls_event ls_event_t;

// A place in a buffer: offsets count elements, never bytes, so they hold whatever the
// backend's storage type.
typedef struct {
    ls_buffer_t *buf;
    size_t off;
} ls_view_t;

static inline ls_view_t ls_view(ls_buffer_t *buf, size_t off) {
    return (ls_view_t){buf, off};
}
#define LS_VIEW_NONE ((ls_view_t){NULL, 0})

// One LoRA matrix of every slot, as the LoRA ops take it: its entries of the pool's page table
// (ls_lora_pages_t, kernels/lora_batch.h), slot 0's first entry at tab. Tables hold device
// pointers in buffers of LS_DTYPE_F32 elements, two to an entry (no backend has 64-bit
// integer buffers; the bits travel as they are): entry e is at element 2e.
typedef struct {
    ls_view_t tab;
    size_t stride;    // entries per slot
    int np, piece;
    ls_dtype_t dtype; // the elements' (the pages' storage dtype)
} ls_lora_mat_t;

// Most slices a stacked LoRA target has (qkv).
#define LS_LORA_MAX_SLICES 3
// (T, n_slices*r_max) arrays in lora_fused's scratch
#define LS_LORA_FUSED_PARTS 8
// The most LoRA batches of a step (ls_step_t.lora): each pass, and per pass one narrowed
// batch for each group of the per-layer four and the embedding at most
#define LS_LORA_BATCH_MAX (6 * LS_LORA_MIX_MAX)

// One forward step, as the scheduler laid it out (see ls_attn_meta_t for the layout).
typedef struct {
    int n_tokens;                 // T
    const int32_t *token_ids;     // (T) embedding input
    ls_attn_meta_t attn;          // attn.n_tokens == n_tokens
    // LoRA batches: lora[0 .. n_lora_batches) (NULL, 0: no adapter in this step, LoRA ops
    // must not run). The first n_lora_passes are the passes: pass 0 covers every row with an
    // adapter; a row of a mix of k adapters is in passes 0 .. k-1, its i-th component in pass
    // i (a batch covers a row at most once, as the LoRA ops add into y without atomics). The
    // batches after them are passes narrowed to one target group (engine/model.c: a pass's
    // segments with the ranks of ls_lora_pool_group_ranks, so that adapters without the
    // group's targets do no work there). The LoRA ops name the batch they run, lora_rows the
    // pass.
    const ls_lora_batch_t *lora;
    int n_lora_batches;
    int n_lora_passes;
    int n_logit_rows;
    const int32_t *logit_rows;    // (n_logit_rows) token rows whose logits are wanted
    // lm_head's LoRA on the logit rows, pass by pass as the other targets' (a mix's i-th
    // component in pass i): entry k * n_logit_rows + i is the slot whose lm_head LoRA pass k
    // adds to logit row i (slot 0, rank 0: none in that pass) and its factor, scalings[slot]
    // times the component's weight, one fp32 product as a segment's in lora_expand. Read by
    // lora_rows; both NULL when no logit row of the step has lm_head LoRA.
    const int32_t *logit_slots;   // (n_lora_passes, n_logit_rows)
    const float *logit_scales;    // (n_lora_passes, n_logit_rows)
    // The adapters' own rows of the embedding and lm_head (trainable tokens,
    // engine/lora_tokens.h), read by token_rows and token_logits. token_rows (T): the row of
    // the slots' embedding rows that replaces token t's embedding, -1 for none; NULL when no
    // token of the step has one. head_tiles (n_head_tiles, 3): a logit row, the first of its
    // adapter's lm_head rows and their count, whose logits are recomputed from those rows.
    const int32_t *token_rows;    // (T)
    int n_head_tiles;
    const int32_t *head_tiles;    // (n_head_tiles, 3)
} ls_step_t;

// One token's decode block from o's projection to the next layer's q,k,v (decode_block):
// the matmuls, RMSNorms and silu_mul it stands for, in the order the model runs them.
typedef struct {
    ls_view_t a;                   // (q_dim) attention's output, in the weights' 16-bit dtype
    ls_view_t w_o, b_o;            // o's weights (H, q_dim) and bias (or NONE)
    ls_view_t g2;                  // the MLP's RMSNorm weights (H)
    ls_view_t w_gu, b_gu;          // gate_up (2 inter, H): gate's rows, then up's
    ls_view_t w_d, b_d;            // down (H, inter)
    ls_view_t g1, w_qkv, b_qkv;    // the next layer's RMSNorm and q,k,v (qkv_dim, H); w_qkv
                                   // NONE: the last layer
    ls_view_t x;                   // (H) the residual, updated
    ls_view_t y;                   // (H) down's output (the last layer: the final RMSNorm adds it)
    ls_view_t qkv;                 // (qkv_dim) the next layer's q,k,v
    ls_view_t x1, act;             // scratch: (H) fp32, (inter) in the weights' dtype
    int H, q_dim, inter, qkv_dim;
    float eps;
} ls_decode_block_t;

typedef struct ls_backend ls_backend_t;

struct ls_backend {
    const char *name;
    void *ctx; // backend state

    void (*free)(ls_backend_t *self);

    // -- buffers ---------------------------------------------------------------------
    // NULL on allocation failure. Contents start undefined.
    ls_buffer_t *(*buffer_new)(ls_backend_t *self, ls_dtype_t dtype, size_t n);
    void (*buffer_free)(ls_backend_t *self, ls_buffer_t *buf);
    // Copies n elements of src (in src_dtype) to dst, converting to the buffer's storage.
    int (*buffer_upload)(ls_backend_t *self, ls_view_t dst, const void *src,
                         ls_dtype_t src_dtype, size_t n);
    // Copies n elements of src to dst as fp32; waits for queued work.
    int (*buffer_download)(ls_backend_t *self, float *dst, ls_view_t src, size_t n);
    void (*buffer_zero)(ls_backend_t *self, ls_view_t dst, size_t n);
    int (*synchronize)(ls_backend_t *self);

    // -- asynchronous uploads (the LoRA slot pool) ------------------------------------
    // Host memory the device copies from at full speed (pinned on CUDA, malloc on CPU);
    // NULL on failure.
    void *(*host_alloc)(ls_backend_t *self, size_t bytes);
    void (*host_free)(ls_backend_t *self, void *p);
    // NULL on failure. An event never recorded counts as complete.
    ls_event_t *(*event_new)(ls_backend_t *self);
    void (*event_free)(ls_backend_t *self, ls_event_t *ev);
    // Copies a packed image into dst with zero padding, as ls_pad_copy (kernels/ops.h): for
    // row i < rows, chunk j < chunks, c < dst_chunk, dst[i*dst_stride + j*dst_chunk + c] =
    // c < w ? image[(i*chunks + j)*w + c] : 0. The image (rows*chunks*w elements of dst's
    // storage dtype) is given as nspan pieces of host_alloc memory, in order; w 0 zero-fills.
    // Then records ev (NULL: none). Ordered after every op queued before it (it never
    // overwrites what a queued op still reads); ops queued after it do not wait for it unless
    // they event_wait. The pieces must stay untouched until ev completes. A device backend
    // sends only the image over the bus and pads on the device, through a staging area it
    // grows when an image is larger than any before (a synchronous allocation, rare).
    // -1 when the copy could not be queued.
    int (*buffer_upload_async)(ls_backend_t *self, ls_view_t dst, size_t dst_stride,
                               size_t dst_chunk, const ls_host_span_t *src, int nspan, size_t w,
                               size_t chunks, size_t rows, ls_event_t *ev);
    // Ops queued from now on start after the uploads ev last recorded; the host goes on.
    void (*event_wait)(ls_backend_t *self, ls_event_t *ev);
    // The host waits for the uploads ev last recorded; -1 on a device fault.
    int (*event_sync)(ls_backend_t *self, ls_event_t *ev);

    // -- per-step metadata: copied once, read by the "step" ops below ----------------
    int (*step_begin)(ls_backend_t *self, const ls_step_t *step);

    // -- ops (shapes as in kernels/ops.h) ---------------------------------------------
    // step: out (T, C) = table (vocab, C) [token_ids - vocab0], zero rows for token ids
    // outside [vocab0, vocab0 + vocab) (a tensor-parallel rank's vocabulary range)
    void (*embedding)(ls_backend_t *self, ls_view_t out, ls_view_t table, int C, int vocab0,
                      int vocab);
    // y (T, out) (+)= x (T, in) · w (out, in)ᵀ + bias (out); bias may be LS_VIEW_NONE.
    // x is an fp32 buffer, or one of w's dtype: a copy an op wrote through its out_lp
    // (rmsnorm, silu_mul), which a device backend multiplies as is instead of rounding x
    // to w's dtype itself first
    void (*matmul)(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t w,
                   ls_view_t bias, int T, int in, int out, int accumulate);
    // y (T, out) = x (T, in) · w (out, in)ᵀ + bias in FP8 (W8A8, kernels/ops.h
    // ls_matmul_fp8_forward): x (fp32) is quantized row by row into xq (T, in; an F8E4M3
    // buffer) with x_scale (T, F32) its per-token scales — scratch the caller provides,
    // holding them afterwards; x LS_VIEW_NONE: xq and x_scale hold x's quantized rows
    // already (an rmsnorm's or silu_mul's out_lp and out_scale), so no quantizing pass
    // runs. w is an F8E4M3 buffer with w_scale (out, F32) its per-channel scales; bias may
    // be LS_VIEW_NONE. in must be a multiple of 16 (the FP8 tensor-core GEMM's alignment;
    // the loader checks it)
    void (*matmul_fp8)(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t xq,
                       ls_view_t x_scale, ls_view_t w, ls_view_t w_scale, ls_view_t bias, int T,
                       int in, int out);
    // out (T, C) = rmsnorm(x (+ residual)) * w (C); residual (T, C) updated, or NONE;
    // x2 (T, C), or NONE, is added into x first (as if x were x + x2). out_lp (T, C), or
    // NONE: out once more, in out_lp's dtype (rounded as buffer_upload would round it) —
    // the input of the matmul that follows, made here rather than by that matmul. An
    // F8E4M3 out_lp gets out's rows quantized per token as matmul_fp8 quantizes them
    // (ls_fp8_quantize_rows of exactly the fp32 values written to out), their scales going
    // to out_scale (T, F32); out_scale is NONE for any other out_lp. out may be NONE where
    // out_lp is given in a 16-bit dtype: only the copy is written (nothing reads out)
    void (*rmsnorm)(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t out_scale,
                    ls_view_t residual, ls_view_t x, ls_view_t x2, ls_view_t w, int T, int C,
                    float eps);
    // in place on x (T, row_stride) holding (n_heads, head_dim); w (head_dim)
    void (*rmsnorm_heads)(ls_backend_t *self, ls_view_t x, ls_view_t w, int T,
                          int n_heads, int head_dim, int row_stride, float eps);
    // out (T, inter) = silu(gate_up[:, :inter]) * gate_up[:, inter:]; delta (T, 2*inter),
    // or NONE, is added into gate_up first (as if gate_up were gate_up + delta); out_lp
    // (T, inter) and out_scale (T), or NONE: out once more in out_lp's dtype, and out NONE,
    // as rmsnorm's
    void (*silu_mul)(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t out_scale,
                     ls_view_t gate_up, ls_view_t delta, int T, int inter);
    // y (n) += x (n)
    void (*add)(ls_backend_t *self, ls_view_t y, ls_view_t x, size_t n);
    // step of one token, optional (NULL where a backend has none): the decode block b as
    // one op — y = o(a); x += y; h = rmsnorm(x) · g2; act = silu_mul(gate_up(h)); y =
    // down(act); with a next layer x += y; h = rmsnorm(x) · g1; qkv = q,k,v(h) — the rounding
    // of h and act to the weights' dtype as rmsnorm's and silu_mul's out_lp. Returns 1 when
    // it ran; 0 when it does not apply here (nothing done: the caller runs the ops)
    int (*decode_block)(ls_backend_t *self, const ls_decode_block_t *b);

    // step: RoPE, then the KV store. x (T, row_stride) holds n_heads q heads, then n_kv_heads
    // k heads, then n_kv_heads v heads of head_dim; x2 (T, row_stride), or NONE, is added
    // into x first (as if x were x + x2). q's and k's heads rotate in place at the step's
    // positions (inv_freq (head_dim/2)); then caches [slot_mapping] = k (rotated), v (+ v2:
    // v itself is left as it is), slots < 0 storing nothing, the caches blocks of
    // (block_size, n_kv_heads*head_dim) block_stride elements apart: ls_rope_forward over
    // q's and k's heads, then ls_kv_cache_store (kernels/ops.h), in one op
    void (*rope_kv_store)(ls_backend_t *self, ls_view_t x, ls_view_t x2, ls_view_t inv_freq,
                          ls_view_t k_cache, ls_view_t v_cache, int n_heads, int n_kv_heads,
                          int head_dim, int row_stride, int block_size, size_t block_stride);
    // step: out (T, n_heads*head_dim) from q (T, row_stride) and the paged caches (as
    // rope_kv_store's); out F32, or the 16-bit dtype of the matmul that alone reads it (the
    // values rounded as buffer_upload rounds them), as rmsnorm's out_lp
    void (*attention)(ls_backend_t *self, ls_view_t out, ls_view_t q, ls_view_t k_cache,
                      ls_view_t v_cache, int n_heads, int n_kv_heads, int head_dim,
                      int block_size, int row_stride, size_t block_stride);
    // step: over the step's LoRA batch `batch` (< n_lora_batches), as the kernels over
    // lora[batch]. tmp (T, n_slices*r_max) from x (T, in) and a (rows of in elements);
    // x F32, or the 16-bit copy in a's dtype that the projection's matmul reads (rmsnorm's
    // out_lp, attention's 16-bit rows), here and in lora_fused
    void (*lora_shrink)(ls_backend_t *self, ls_view_t tmp, ls_view_t x, ls_lora_mat_t a,
                        int in, int n_slices, int r_max, int batch);
    // step, batch: y (T, out_total) += from tmp and b (chunks of out_total rows);
    // slice_offsets (n_slices+1) is host memory, small enough to pass by value to a kernel
    void (*lora_expand)(ls_backend_t *self, ls_view_t y, ls_view_t tmp, ls_lora_mat_t b,
                        const int32_t *slice_offsets, int n_slices, int r_max, int batch);
    // step, batch: lora_shrink then lora_expand in one op, for decode-shaped steps (few tokens
    // per segment): y (T, out_total) += as lora_expand of lora_shrink's tmp; accumulate 0:
    // every row of y is written, with what += into a zeroed y would give (rows without a
    // segment in the batch: 0) — a delta made without clearing y first. tmp
    // (LS_LORA_FUSED_PARTS, T, n_slices*r_max) is scratch the backend may use or leave
    // alone (a device backend splits the shrink over blocks that leave partial sums
    // there): its contents afterwards are unspecified.
    void (*lora_fused)(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t tmp,
                       ls_lora_mat_t a, ls_lora_mat_t b, const int32_t *slice_offsets,
                       int in, int n_slices, int r_max, int accumulate, int batch);
    // step, batch: gate_up's LoRA made by SiLU·mul rather than written as a delta, for
    // decode-shaped steps; NULL (all three) where the backend has no such op. lora_silu_fits:
    // whether it runs for these matrices and this batch (x, tmp and a as lora_fused's over
    // gate_up's two slices of inter columns); if so, lora_silu_shrink leaves lora_fused's
    // tmp and lora_silu_mul then writes silu_mul's out / out_lp (no scales: not FP8) of
    // gate_up (T, 2*inter) plus its LoRA — the bits of lora_fused writing the delta and
    // silu_mul adding it.
    bool (*lora_silu_fits)(ls_backend_t *self, ls_view_t x, ls_view_t tmp, ls_lora_mat_t a,
                           ls_lora_mat_t b, int in, int inter, int r_max, int batch);
    void (*lora_silu_shrink)(ls_backend_t *self, ls_view_t tmp, ls_view_t x, ls_lora_mat_t a,
                             int in, int r_max, int batch);
    void (*lora_silu_mul)(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t gate_up,
                          ls_view_t tmp, ls_lora_mat_t b, int in, int inter, int r_max, int batch);
    // step, batch: tmp (T, r_max) from a (chunks of vocab rows) at the step's token ids, as
    // ls_lora_embed_shrink over lora[batch] (the embedding's LoRA shrink: a gather;
    // lora_expand of the same batch follows)
    void (*lora_embed_shrink)(ls_backend_t *self, ls_view_t tmp, ls_lora_mat_t a, int vocab,
                              int r_max, int batch);
    // step, pass (< n_lora_passes): y (n_logit_rows, out) += the LoRA of each logit row's
    // slot in that pass on x (n_logit_rows, in), as ls_lora_rows with the pass's rows of
    // logit_slots and logit_scales; tmp (n_logit_rows, r_max) scratch, a (rows of in
    // elements), b (chunks of out rows)
    void (*lora_rows)(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t tmp,
                      ls_lora_mat_t a, ls_lora_mat_t b, int in, int out, int r_max, int pass);
    // step: out (n_logit_rows, C) = x (T, C) [logit_rows]
    void (*rows_gather)(ls_backend_t *self, ls_view_t out, ls_view_t x, int C);
    // step: x (T, C) rows t = rows (N, C) [token_rows[t]] where token_rows[t] >= 0, as
    // ls_token_rows_forward (the step has token_rows)
    void (*token_rows)(ls_backend_t *self, ls_view_t x, ls_view_t rows, int C);
    // step: logits (n_logit_rows, V) at the step's head_tiles recomputed from rows (N, C),
    // ids (N) and x (n_logit_rows, C), as ls_token_logits_forward
    void (*token_logits)(ls_backend_t *self, ls_view_t logits, ls_view_t x, ls_view_t rows,
                         ls_view_t ids, int C, int V);
    // step: wide (n_logit_rows, W) = head (n_logit_rows, V), then -inf in columns V .. W-1,
    // as ls_logits_widen_forward (the added vocabulary's columns, lora_tokens.h)
    void (*logits_widen)(ls_backend_t *self, ls_view_t wide, ls_view_t head, int V, int W);
    // logits (batch->n_rows, V) -> host outputs as ls_sampling_sample; waits for queued
    // work; the sampling batch is copied to the device here, once per call
    int (*sample)(ls_backend_t *self, ls_view_t logits, int V,
                  const ls_sampling_batch_t *batch, int32_t *tokens, float *logprobs,
                  int32_t *top_ids, float *top_logprobs);

    // -- step graphs (NULL on a backend without them: the CPU) ------------------------
    // Called after step_begin, before the step's ops. 0: issue the ops once, as usual.
    // 1: the backend takes the step whole — issue the ops, call graph_end, and issue them
    // again (the same calls with the same arguments) for as long as graph_end returns 1.
    // Passes may only record the ops, capture them or run them; the step runs exactly once
    // and gives the same results as without graphs. Nothing else may go to the backend
    // between graph_begin and the graph_end that returns 0.
    int (*graph_begin)(ls_backend_t *self);
    int (*graph_end)(ls_backend_t *self);

    // -- a side queue beside the main one (NULL on a backend without it; the CPU has it,
    // with nothing to do: it runs every op in call order) ---------------------------------
    // For short latency-bound work (a decode step's LoRA) that would otherwise wait on, and
    // be waited on by, the bandwidth-bound op beside it (the base GEMM). side_begin: ops
    // issued from now on go to the side queue, after everything queued so far. side_end:
    // ops go to the main queue again and do not wait for the side ops. side_wait: later
    // main ops wait for every side op queued so far. Only buffer_zero and the lora_* ops
    // may be issued between side_begin and side_end; every side_begin is closed by
    // side_end and then side_wait before anything else waits on the backend (sample,
    // download, synchronize, graph_end, uploads).
    void (*side_begin)(ls_backend_t *self);
    void (*side_end)(ls_backend_t *self);
    void (*side_wait)(ls_backend_t *self);
};

// The CPU backend: kernels/ops.h references; n_threads sizes the OpenBLAS pool (<= 0:
// OpenBLAS's default), the other ops are single-threaded. Stores every buffer as f32.
// NULL on allocation failure.
ls_backend_t *ls_backend_cpu_new(int n_threads);

// Frees the backend and clears the pointer; idempotent.
static inline void ls_backend_destroy(ls_backend_t **self_p) {
    if (self_p && *self_p) {
        (*self_p)->free(*self_p);
        *self_p = NULL;
    }
}

#endif
