/*  engine/backend_cuda.cu — the CUDA backend: the ls_backend_t table over the kernels of
    kernels/cuda (ops_cuda.h) and cuBLAS. Storage, precision and the metadata path are
    described in backend_cuda.h. The matmul of up to ls_cu_gemv_tokens() tokens (16, or 8
    on a device whose SMs must each take more memory bytes a clock: an H200) on 16-bit
    weights is our GEMV (kernels/cuda/gemv.cu), which starts while the kernel before it ends;
    past that, and for fp32 weights, cuBLAS.

    Errors: launch and copy errors are kept (the first one, "sticky") and reported as -1 by
    synchronize, buffer_download and sample, as backend.h promises; ops themselves return
    nothing. Scratch arrays grow on demand; growing one synchronizes the stream first,
    since queued work may still read the old block.

    Asynchronous uploads (the adapter pool's loads: an adapter's pages, then its slot's page
    table) go on a second stream, `upload`: each one first waits on an event recorded on the
    compute stream at the call (so it never overwrites a page or table that queued work
    still reads or writes), then copies the packed image from pinned memory into a staging
    area and pads it into its place there (ls_cu_pad_copy: a page's contents go as they are),
    then records the caller's event. event_wait puts that event in front of
    the compute stream's next ops once; an event the compute stream already waited on is
    not waited on again (one compute stream: its later work is ordered anyway).

    Step graphs (graph_begin / graph_end, backend.h): a decode step (one token per sequence)
    is first run as a probe pass that launches nothing and records every op's resolved
    arguments — device pointers, shapes, dtypes, scalars, the host slice offsets — after the
    step's own shape and metadata layout. Those words are everything a launch depends on, so
    a cached graph recorded from an equal list replays the step exactly (its kernels read the
    metadata from the fixed device block step_begin just refilled). On a miss the ops are
    issued again under stream capture, the graph is instantiated, kept (a small LRU cache)
    and launched. Scratch is grown in the probe pass, so the captured pass never allocates
    or synchronizes; cuBLAS gets its workspace at creation for the same reason.

    Side queue (side_begin / side_end / side_wait, backend.h): a third stream, `side`, forked
    from the compute stream by an event and joined back by another, so a decode step's LoRA
    kernels (short, latency-bound) run while the base GEMM beside them streams its weights
    over the SMs it leaves free. The ops swap `stream` (where ops go) between `main` and
    `side`; under capture the fork/join events pull `side` into the graph as a parallel
    branch. Only LoRA ops and buffer_zero may go to the side (cuBLAS stays on main). `main`
    has the device's highest stream priority and `side` its lowest (graphs keep them: node
    priorities are captured from the streams and used), so as SMs free up the GEMM's blocks
    are placed first. And while side work is open, cuBLAS is told to leave SMs to it
    (cublasSetSmCountTarget; s_gemm_sms: by default none up to 8 tokens but 8 of 132 beside
    o's and down's cuBLAS GEMMs; up to 128 half the device, gate_up's GEMM 16 of 132 up to 32
    tokens and 48 past that; past 128 tokens the MLP's GEMMs 16 of 132 and q,k,v's and o's
    33): the decode GEMMs are bandwidth-bound and lose little on fewer SMs, while
    the LoRA kernels, latency-bound, need SMs to themselves to overlap at all —
    measured on an H200 (Llama-3-8B, batch 64, 8 adapters): step 10.46 ms serial, 10.45
    beside with no SMs left, 9.82 with 40, 9.32 with 64, 9.42 with 88. Side kernels launch without PDL (see
    s_lora_flags). A different SM target may pick a different GEMM kernel, so a step with
    LoRA beside could differ from the serial one by fp32 summation order (bit-identical
    with 0; test_gpu_model checks both).

    Known limits: buffer_upload synchronizes the stream (so the caller may reuse its source
    at once); one device per process (ls_backend_cuda_new sets the current device).
*/
#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ls_err.h"
#include "ls_limits.h"
#include "backend_cuda.h"
#include "fp8_gemm.h"
#include "ops_cuda.h"

static_assert((int)LS_DTYPE_F32 == (int)LS_CU_F32 && (int)LS_DTYPE_F16 == (int)LS_CU_F16 &&
                  (int)LS_DTYPE_BF16 == (int)LS_CU_BF16 &&
                  (int)LS_DTYPE_F8E4M3 == (int)LS_CU_F8E4M3,
              "ls_dtype_t and ls_cu_dtype_t must agree");

typedef struct {
    void *p;
    size_t cap; // bytes
} s_dev_t;

// A step graph and the probe record it was captured from.
typedef struct {
    uint64_t *sig;
    size_t n;
    cudaGraphExec_t exec; // NULL: free entry
    uint64_t used;        // LRU clock
} s_graph_t;

// One LoRA batch of the step (ls_step_t.lora[k]) as the kernels read it, in the device block.
typedef struct {
    int n_tiles, max_rank, n_zero_rows;
    int lora_one; // every tile holds one position (LS_CU_LORA_ONE)
    const ls_cu_lora_tile_t *tiles;
    // the expand's tiles apart from the decode op's: those of segments of at most
    // LS_CU_LORA_TILE positions (as tiles), then the long segments' in LS_CU_LORA_LONG
    const ls_cu_lora_tile_t *exp_tiles;
    int n_exp_short, n_exp_long;
    const int32_t *zero_rows; // (n_zero_rows) the rows no tile covers
    const int32_t *perm;
    // lm_head's LoRA when the batch is pass k (ls_step_t.logit_slots): a tile per logit row
    // that has one, p0 the row, n 1, scale the row's logit_scales entry
    const ls_cu_lora_tile_t *row_tiles;
    int n_row_tiles;
} s_pass_t;

// the sequences a prefill kernel takes in a step: (sequence, first token, tokens) each, on
// the device (d) and in the pinned block (h, read by attention); max_q their most tokens
typedef struct {
    int n, max_q;
    const int32_t *d, *h;
} s_pf_list_t;

enum { S_GRAPHS = 16 };                         // decode batch sizes in use at once
enum { S_PLAIN, S_PROBE, S_CAPTURE };           // what the ops do with their launches
enum { S_BLAS_WS = 32 << 20 };                  // cuBLAS's own default on sm_90

typedef struct {
    int device;
    cudaStream_t stream;   // where ops go: main, or side between side_begin and side_end
    cudaStream_t main;     // the compute stream
    cudaStream_t side;     // side_begin .. side_end
    cudaEvent_t forked, joined;
    int on_side;
    int side_open;          // side ops queued and not yet waited for
    int n_sm;               // SMs of the device
    int side_leave;         // SMs every GEMM leaves to open side work; < 0: s_gemm_sms's rule
    int gemv_t;             // the most tokens a matmul gives the GEMV (ls_cu_gemv_tokens())
    int blas_sms;           // cuBLAS's SM count target now (0: all)
    bool after_attn;        // attention ran since the last matmul, which is the next: o's, on
                            // its output (a flag, not its pointer: the LP copy that attention
                            // writes is every other matmul's input as well)
    cudaStream_t upload;   // buffer_upload_async
    s_dev_t up_stage;      // the images of buffer_upload_async, padded from here on the device
    cudaEvent_t queued;    // compute work queued before an async upload
    cublasHandle_t blas;
    ls_fp8_gemm_t *fp8;     // matmul_fp8's GEMMs (ours, cuBLASLt)
    cudaError_t sticky; // first error seen; cudaSuccess while all is well
    int blas_failed;

    s_dev_t stage; // upload / download conversions
    s_dev_t xconv; // matmul activations narrowed to the weight dtype

    // step metadata: one pinned block, one device block, one copy per step
    char *h_meta;
    size_t h_meta_cap;
    s_dev_t d_meta;
    cudaEvent_t meta_done;
    int meta_pending;
    int T, n_seqs, max_blocks, n_logit_rows;
    const int32_t *token_ids, *positions, *slot_mapping, *tok_seq, *block_tables,
        *logit_rows;
    // ls_cu_attention_prefill_pick's lists for each prefill kernel (by ls_cu_prefill_kernel_t:
    // the step does not say the head_dim, so attention takes the list of the kernel
    // ls_cu_attention_prefill_which names for its own)
    s_pf_list_t pf[2];
    const int32_t *token_rows, *head_tiles; // trainable tokens (ls_step_t), NULL: none
    int n_head_tiles;
    int n_batches, n_passes; // LoRA batches and passes of the step (0: no LoRA)
    s_pass_t pass[LS_LORA_BATCH_MAX]; // per batch

    // sampling
    char *h_smp;
    size_t h_smp_cap;
    s_dev_t d_smp, lp, mark, smp_part, smp_select;

    // step graphs
    void *blas_ws;
    int graphs_on, graph_mode, sig_oom;
    uint64_t *sig; // the probe pass's record
    size_t sig_n, sig_cap;
    s_graph_t graphs[S_GRAPHS];
    s_graph_t *capturing; // the entry the capture fills
    uint64_t graph_clock;
    long n_captured, n_replayed;
    long n_lora_silu; // lora_silu_mul launches (ls_backend_cuda_lora_silu_count)
    unsigned long long *block_sync; // decode_block's grid barrier (ls_cu_block_t's sync)
    long n_blocks;        // decode_block launches (ls_backend_cuda_block_count)
    int block_off;        // ls_backend_cuda_set_block(0)
} s_cuda_t;

static s_cuda_t *s_ctx(ls_backend_t *self) {
    return (s_cuda_t *)self->ctx;
}

static void s_note(s_cuda_t *c, cudaError_t e) {
    if (e != cudaSuccess && c->sticky == cudaSuccess)
        c->sticky = e;
}

static void s_note_blas(s_cuda_t *c, cublasStatus_t st) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        c->blas_failed = 1;
        s_note(c, cudaErrorUnknown);
    }
}

static size_t s_align(size_t n) {
    return (n + 255) & ~(size_t)255;
}

// Makes d hold at least bytes; 1 if it was (re)allocated, 0 if it already did, -1 on
// failure.
static int s_dev_reserve(s_cuda_t *c, s_dev_t *d, size_t bytes) {
    if (bytes <= d->cap && d->p)
        return 0;
    s_note(c, cudaStreamSynchronize(c->stream)); // queued work may read the old block
    cudaFree(d->p);
    d->p = NULL;
    d->cap = 0;
    size_t cap = s_align(bytes + bytes / 4 + 1);
    if (cudaMalloc(&d->p, cap) != cudaSuccess) {
        cudaGetLastError(); // an allocation failure is not sticky
        d->p = NULL;
        return -1;
    }
    d->cap = cap;
    return 1;
}

static int s_host_reserve(char **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap && *p)
        return 0;
    cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    size_t n = s_align(bytes + bytes / 4 + 1);
    if (cudaMallocHost((void **)p, n) != cudaSuccess) {
        cudaGetLastError();
        *p = NULL;
        return -1;
    }
    *cap = n;
    return 0;
}

static size_t s_esize(ls_dtype_t dt) {
    return ls_dtype_size(dt);
}

static void *s_ptr(ls_view_t v) {
    assert(v.buf && v.off <= v.buf->n);
    return (char *)v.buf->data + v.off * s_esize(v.buf->dtype);
}

// A view's pointer, or NULL for NONE
static void *s_ptr_or_null(ls_view_t v) {
    return v.buf ? s_ptr(v) : NULL;
}

static ls_cu_dtype_t s_dt(ls_view_t v) {
    return (ls_cu_dtype_t)v.buf->dtype;
}

// activations are fp32 buffers
static float *s_f32(ls_view_t v) {
    assert(v.buf && v.buf->dtype == LS_DTYPE_F32);
    return (float *)s_ptr(v);
}

// -- lifetime -----------------------------------------------------------------------------

static void s_free(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    cudaStreamSynchronize(c->main);
    s_dev_t *devs[] = {&c->up_stage, &c->stage, &c->xconv,    &c->d_meta,    &c->d_smp,
                       &c->lp,       &c->mark,  &c->smp_part, &c->smp_select};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++)
        cudaFree(devs[i]->p);
    cudaFreeHost(c->h_meta);
    cudaFreeHost(c->h_smp);
    for (int i = 0; i < S_GRAPHS; i++) {
        if (c->graphs[i].exec)
            cudaGraphExecDestroy(c->graphs[i].exec);
        free(c->graphs[i].sig);
    }
    free(c->sig);
    cudaFree(c->block_sync);
    if (c->meta_done)
        cudaEventDestroy(c->meta_done);
    if (c->blas)
        cublasDestroy(c->blas);
    ls_fp8_gemm_destroy(&c->fp8);
    cudaFree(c->blas_ws);
    if (c->upload) {
        cudaStreamSynchronize(c->upload);
        cudaStreamDestroy(c->upload);
    }
    if (c->queued)
        cudaEventDestroy(c->queued);
    if (c->side) {
        cudaStreamSynchronize(c->side);
        cudaStreamDestroy(c->side);
    }
    if (c->forked)
        cudaEventDestroy(c->forked);
    if (c->joined)
        cudaEventDestroy(c->joined);
    if (c->main)
        cudaStreamDestroy(c->main);
    free(c);
    free(self);
}

// -- buffers --------------------------------------------------------------------------------

static ls_buffer_t *s_buffer_new(ls_backend_t *self, ls_dtype_t dtype, size_t n) {
    ls_buffer_t *buf = (ls_buffer_t *)malloc(sizeof *buf);
    void *data = NULL;
    if (!buf)
        return NULL;
    if (cudaMalloc(&data, (n ? n : 1) * s_esize(dtype)) != cudaSuccess) {
        cudaGetLastError();
        free(buf);
        return NULL;
    }
    buf->dtype = dtype;
    buf->n = n;
    buf->data = data;
    buf->storage = dtype;
    return buf;
}

static void s_buffer_free(ls_backend_t *self, ls_buffer_t *buf) {
    s_cuda_t *c = s_ctx(self);
    if (!buf)
        return;
    s_note(c, cudaStreamSynchronize(c->stream));
    s_note(c, cudaStreamSynchronize(c->upload)); // an async upload may still write into it
    cudaFree(buf->data);
    free(buf);
}

enum { S_CHUNK = 1 << 24 }; // elements per staged conversion

static int s_buffer_upload(ls_backend_t *self, ls_view_t dst, const void *src,
                           ls_dtype_t src_dtype, size_t n) {
    s_cuda_t *c = s_ctx(self);
    assert(dst.buf && dst.off + n <= dst.buf->n);
    if (n == 0)
        return 0;
    char *d = (char *)s_ptr(dst);
    size_t ds = s_esize(dst.buf->dtype), ss = s_esize(src_dtype);
    if (src_dtype == dst.buf->dtype) {
        s_note(c, cudaMemcpyAsync(d, src, n * ds, cudaMemcpyHostToDevice, c->stream));
    } else {
        if (s_dev_reserve(c, &c->stage, (size_t)S_CHUNK * 4) < 0)
            return -1;
        for (size_t i = 0; i < n; i += S_CHUNK) {
            size_t m = n - i < (size_t)S_CHUNK ? n - i : (size_t)S_CHUNK;
            s_note(c, cudaMemcpyAsync(c->stage.p, (const char *)src + i * ss, m * ss,
                                      cudaMemcpyHostToDevice, c->stream));
            s_note(c, ls_cu_convert(d + i * ds, (ls_cu_dtype_t)dst.buf->dtype, c->stage.p,
                                    (ls_cu_dtype_t)src_dtype, m, c->stream));
        }
    }
    // complete on return: the caller may reuse src, pinned or not
    s_note(c, cudaStreamSynchronize(c->stream));
    return c->sticky == cudaSuccess ? 0 : -1;
}

static int s_buffer_download(ls_backend_t *self, float *dst, ls_view_t src, size_t n) {
    s_cuda_t *c = s_ctx(self);
    assert(src.buf && src.off + n <= src.buf->n);
    if (n > 0) {
        const char *s = (const char *)s_ptr(src);
        if (src.buf->dtype == LS_DTYPE_F32) {
            s_note(c, cudaMemcpyAsync(dst, s, n * 4, cudaMemcpyDeviceToHost, c->stream));
        } else {
            if (s_dev_reserve(c, &c->stage, (size_t)S_CHUNK * 4) < 0)
                return -1;
            size_t es = s_esize(src.buf->dtype);
            for (size_t i = 0; i < n; i += S_CHUNK) {
                size_t m = n - i < (size_t)S_CHUNK ? n - i : (size_t)S_CHUNK;
                s_note(c, ls_cu_convert(c->stage.p, LS_CU_F32, s + i * es, s_dt(src), m,
                                        c->stream));
                s_note(c, cudaMemcpyAsync(dst + i, c->stage.p, m * 4, cudaMemcpyDeviceToHost,
                                          c->stream));
                s_note(c, cudaStreamSynchronize(c->stream)); // stage is reused
            }
        }
    }
    s_note(c, cudaStreamSynchronize(c->stream));
    return c->sticky == cudaSuccess ? 0 : -1;
}

static int s_synchronize(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    s_note(c, cudaStreamSynchronize(c->stream));
    return c->sticky == cudaSuccess ? 0 : -1;
}

// -- asynchronous uploads -------------------------------------------------------------------

struct ls_event {
    cudaEvent_t e;
    int pending; // recorded since the compute stream last waited on it
};

static void *s_host_alloc(ls_backend_t *self, size_t bytes) {
    void *p = NULL;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError(); // an allocation failure is not sticky
        return NULL;
    }
    return p;
}

static void s_host_free(ls_backend_t *self, void *p) {
    cudaFreeHost(p);
}

static ls_event_t *s_event_new(ls_backend_t *self) {
    ls_event_t *ev = (ls_event_t *)calloc(1, sizeof *ev);
    if (ev && cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError();
        free(ev);
        return NULL;
    }
    return ev;
}

static void s_event_free(ls_backend_t *self, ls_event_t *ev) {
    if (!ev)
        return;
    cudaEventSynchronize(ev->e);
    cudaEventDestroy(ev->e);
    free(ev);
}

static int s_buffer_upload_async(ls_backend_t *self, ls_view_t dst, size_t dst_stride,
                                 size_t dst_chunk, const ls_host_span_t *src, int nspan, size_t w,
                                 size_t chunks, size_t rows, ls_event_t *ev) {
    s_cuda_t *c = s_ctx(self);
    assert(dst.buf && (rows == 0 || dst.off + (rows - 1) * dst_stride + chunks * dst_chunk <= dst.buf->n));
    size_t es = s_esize(dst.buf->dtype), bytes = rows * chunks * w * es;
    cudaError_t e;
    assert(!c->on_side);
    // Growing the staging area frees the old one, which the upload stream may still read:
    // cudaFree waits for the device, and this happens only for an image larger than any before.
    if (bytes > c->up_stage.cap &&
        (s_note(c, cudaStreamSynchronize(c->upload)), s_dev_reserve(c, &c->up_stage, bytes) < 0))
        return -1;
    if ((e = cudaEventRecord(c->queued, c->stream)) != cudaSuccess ||
        (e = cudaStreamWaitEvent(c->upload, c->queued, 0)) != cudaSuccess) {
        s_note(c, e);
        return -1;
    }
    size_t at = 0;
    for (int i = 0; i < nspan && at < bytes; i++) {
        size_t n = src[i].bytes < bytes - at ? src[i].bytes : bytes - at;
        if ((e = cudaMemcpyAsync((char *)c->up_stage.p + at, src[i].p, n, cudaMemcpyHostToDevice,
                                 c->upload)) != cudaSuccess) {
            s_note(c, e);
            return -1;
        }
        at += n;
    }
    assert(at == bytes);
    if ((e = ls_cu_pad_copy(s_ptr(dst), c->up_stage.p, es, w, chunks, rows, dst_chunk, dst_stride,
                            c->upload)) != cudaSuccess ||
        (ev && (e = cudaEventRecord(ev->e, c->upload)) != cudaSuccess)) {
        s_note(c, e);
        return -1;
    }
    if (ev)
        ev->pending = 1;
    return 0;
}

static void s_event_wait(ls_backend_t *self, ls_event_t *ev) {
    s_cuda_t *c = s_ctx(self);
    if (!ev->pending)
        return;
    s_note(c, cudaStreamWaitEvent(c->stream, ev->e, 0));
    ev->pending = 0;
}

static int s_event_sync(ls_backend_t *self, ls_event_t *ev) {
    s_cuda_t *c = s_ctx(self);
    s_note(c, cudaEventSynchronize(ev->e));
    return c->sticky == cudaSuccess ? 0 : -1;
}

// -- step metadata ----------------------------------------------------------------------------

// Lays arrays out in the metadata block, 16-byte aligned.
typedef struct {
    size_t off;
} s_layout_t;

static size_t s_place(s_layout_t *l, size_t bytes) {
    size_t at = l->off;
    l->off = (l->off + bytes + 15) & ~(size_t)15;
    return at;
}

// A LoRA pass's place in the metadata block and its counts, before the block is filled.
typedef struct {
    size_t o_tiles, o_exp, o_perm, o_zero, o_row_tiles;
    int n_tiles, max_rank, n_pos, max_len, n_short, n_long, n_row_tiles;
} s_pass_plan_t;

// Counts pass lb's tiles (segments of rank-0 slots get none) and its logit rows' tiles
// (lslots: the pass's R entries of ls_step_t.logit_slots, NULL: none) and places its arrays.
static s_pass_plan_t s_pass_plan(const ls_lora_batch_t *lb, const int32_t *lslots, int R, int T,
                                 s_layout_t *l) {
    s_pass_plan_t pp = {};
    for (int i = 0; lslots && i < R; i++) {
        assert(lslots[i] >= 0 && lslots[i] < lb->n_slots);
        pp.n_row_tiles += lb->lora_ranks[lslots[i]] > 0;
    }
    pp.n_pos = lb->seg_indptr[lb->n_segs];
    for (int s = 0; s < lb->n_segs; s++) {
        int w = lb->weight_indices[s];
        assert(w >= 0 && w < lb->n_slots);
        int r = lb->lora_ranks[w], len = lb->seg_indptr[s + 1] - lb->seg_indptr[s];
        assert(r >= 0 && len >= 0);
        if (r == 0)
            continue;
        pp.n_tiles += (len + LS_CU_LORA_TILE - 1) / LS_CU_LORA_TILE;
        if (len <= LS_CU_LORA_TILE)
            pp.n_short += len > 0;
        else
            pp.n_long += (len + LS_CU_LORA_LONG - 1) / LS_CU_LORA_LONG;
        pp.max_rank = r > pp.max_rank ? r : pp.max_rank;
        pp.max_len = len > pp.max_len ? len : pp.max_len;
    }
    size_t i32 = sizeof(int32_t);
    pp.o_tiles = s_place(l, (size_t)pp.n_tiles * sizeof(ls_cu_lora_tile_t));
    pp.o_exp = s_place(l, (size_t)(pp.n_short + pp.n_long) * sizeof(ls_cu_lora_tile_t));
    pp.o_perm = s_place(l, lb->permutation ? (size_t)pp.n_pos * i32 : 0);
    pp.o_zero = s_place(l, (size_t)T * i32);
    pp.o_row_tiles = s_place(l, (size_t)pp.n_row_tiles * sizeof(ls_cu_lora_tile_t));
    return pp;
}

// Fills pass lb's arrays into the host block h (as planned; lslots and lscales: the pass's R
// entries of ls_step_t.logit_slots and logit_scales, NULL: none) and points *ps at the device
// block d's copy of them.
static void s_pass_fill(const ls_lora_batch_t *lb, const int32_t *lslots, const float *lscales,
                        int R, const s_pass_plan_t *pp, int T, char *h, char *d, s_pass_t *ps) {
    size_t i32 = sizeof(int32_t);
    ls_cu_lora_tile_t *tiles = (ls_cu_lora_tile_t *)(h + pp->o_tiles);
    int k = 0;
    for (int s = 0; s < lb->n_segs; s++) {
        int w = lb->weight_indices[s], r = lb->lora_ranks[w];
        if (r == 0)
            continue;
        float scale = lb->scalings[w] * (lb->seg_weights ? lb->seg_weights[s] : 1.0f);
        for (int p = lb->seg_indptr[s]; p < lb->seg_indptr[s + 1]; p += LS_CU_LORA_TILE) {
            int n = lb->seg_indptr[s + 1] - p;
            tiles[k++] = (ls_cu_lora_tile_t){p, n < LS_CU_LORA_TILE ? n : LS_CU_LORA_TILE, w, r,
                                             scale};
        }
    }
    assert(k == pp->n_tiles);
    ls_cu_lora_tile_t *et = (ls_cu_lora_tile_t *)(h + pp->o_exp);
    int ks = 0, kl = pp->n_short;
    for (int s = 0; s < lb->n_segs; s++) {
        int w = lb->weight_indices[s], r = lb->lora_ranks[w];
        int p0 = lb->seg_indptr[s], len = lb->seg_indptr[s + 1] - p0;
        if (r == 0 || len == 0)
            continue;
        float scale = lb->scalings[w] * (lb->seg_weights ? lb->seg_weights[s] : 1.0f);
        if (len <= LS_CU_LORA_TILE)
            et[ks++] = (ls_cu_lora_tile_t){p0, len, w, r, scale};
        else
            for (int p = p0; p < p0 + len; p += LS_CU_LORA_LONG) {
                int n = p0 + len - p;
                et[kl++] = (ls_cu_lora_tile_t){p, n < LS_CU_LORA_LONG ? n : LS_CU_LORA_LONG, w, r,
                                               scale};
            }
    }
    assert(ks == pp->n_short && kl == pp->n_short + pp->n_long);
    if (lb->permutation && pp->n_pos)
        memcpy(h + pp->o_perm, lb->permutation, (size_t)pp->n_pos * i32);
    // the rows no tile covers (no adapter, or a rank-0 one): a delta written rather than
    // added (lora_fused, accumulate 0) gets zeros there. The array is first the covered-row
    // marks, then compacted in place (entry n_zero <= t is written only after entry t was
    // read)
    int32_t *zr = (int32_t *)(h + pp->o_zero);
    int n_zero = 0;
    memset(zr, 0, (size_t)T * i32);
    for (int i = 0; i < pp->n_tiles; i++)
        for (int p = tiles[i].p0; p < tiles[i].p0 + tiles[i].n; p++)
            zr[lb->permutation ? lb->permutation[p] : p] = 1;
    for (int t = 0; t < T; t++)
        if (!zr[t])
            zr[n_zero++] = t;
    ls_cu_lora_tile_t *rt = (ls_cu_lora_tile_t *)(h + pp->o_row_tiles);
    int kr = 0;
    for (int i = 0; lslots && i < R; i++) {
        int w = lslots[i], r = lb->lora_ranks[w];
        if (r > 0)
            rt[kr++] = (ls_cu_lora_tile_t){i, 1, w, r, lscales[i]};
    }
    assert(kr == pp->n_row_tiles);
    *ps = (s_pass_t){pp->n_tiles, pp->max_rank, n_zero, pp->max_len <= 1,
                     (const ls_cu_lora_tile_t *)(d + pp->o_tiles),
                     (const ls_cu_lora_tile_t *)(d + pp->o_exp), pp->n_short, pp->n_long,
                     (const int32_t *)(d + pp->o_zero),
                     lb->permutation ? (const int32_t *)(d + pp->o_perm) : NULL,
                     (const ls_cu_lora_tile_t *)(d + pp->o_row_tiles), pp->n_row_tiles};
}

static int s_step_begin(ls_backend_t *self, const ls_step_t *step) {
    s_cuda_t *c = s_ctx(self);
    const ls_attn_meta_t *a = &step->attn;
    assert(a->n_tokens == step->n_tokens);
    assert(step->n_lora_passes >= 0 && step->n_lora_passes <= LS_LORA_MIX_MAX);
    assert(step->n_lora_batches >= step->n_lora_passes &&
           step->n_lora_batches <= LS_LORA_BATCH_MAX);
    assert((step->lora != NULL) == (step->n_lora_passes > 0));
    int T = step->n_tokens, S = a->n_seqs, P = step->n_lora_passes, B = step->n_lora_batches;
    size_t i32 = sizeof(int32_t);
    int n_cand = 0; // sequences the prefill kernel may take (room for its list)
    if (a->q_indptr)
        for (int s = 0; s < S; s++)
            n_cand += a->q_indptr[s + 1] - a->q_indptr[s] >= LS_CU_PREFILL_MIN_Q;

    s_layout_t l = {0};
    size_t o_ids = s_place(&l, (size_t)T * i32), o_pos = s_place(&l, (size_t)T * i32),
           o_slot = s_place(&l, (size_t)T * i32), o_seq = s_place(&l, (size_t)T * i32),
           o_tab = s_place(&l, (size_t)S * a->max_blocks * i32),
           o_rows = s_place(&l, (size_t)step->n_logit_rows * i32),
           o_pf = s_place(&l, 2 * (size_t)n_cand * 3 * i32),
           o_trows = s_place(&l, step->token_rows ? (size_t)T * i32 : 0),
           o_htiles = s_place(&l, 3 * (size_t)step->n_head_tiles * i32);
    s_pass_plan_t plan[LS_LORA_BATCH_MAX];
    const int32_t *lslots[LS_LORA_BATCH_MAX];
    const float *lscales[LS_LORA_BATCH_MAX];
    int R = step->n_logit_rows;
    assert((step->logit_slots != NULL) == (step->logit_scales != NULL));
    for (int k = 0; k < B; k++) {  // logit rows' tiles: the passes' (lora_rows)
        bool rows = k < P && step->logit_slots;
        lslots[k] = rows ? step->logit_slots + (size_t)k * R : NULL;
        lscales[k] = rows ? step->logit_scales + (size_t)k * R : NULL;
        plan[k] = s_pass_plan(&step->lora[k], lslots[k], R, T, &l);
    }
    size_t bytes = l.off ? l.off : 16;

    // the previous step's copy must be out of the pinned block before it is rewritten
    if (c->meta_pending) {
        s_note(c, cudaEventSynchronize(c->meta_done));
        c->meta_pending = 0;
    }
    if (s_host_reserve(&c->h_meta, &c->h_meta_cap, bytes) < 0 ||
        s_dev_reserve(c, &c->d_meta, bytes) < 0)
        return -1;
    char *h = c->h_meta, *d = (char *)c->d_meta.p;
    if (T) {
        if (step->token_ids)
            memcpy(h + o_ids, step->token_ids, (size_t)T * i32);
        if (a->positions)
            memcpy(h + o_pos, a->positions, (size_t)T * i32);
        if (a->slot_mapping)
            memcpy(h + o_slot, a->slot_mapping, (size_t)T * i32);
    }
    int32_t *seq = (int32_t *)(h + o_seq);
    for (int t = 0; t < T; t++)
        seq[t] = 0;
    int32_t *pf = (int32_t *)(h + o_pf);
    int n_pf[2] = {0, 0}, pf_max_q[2] = {0, 0};
    if (a->q_indptr) {
        assert(a->q_indptr[S] == T);
        for (int s = 0; s < S; s++)
            for (int t = a->q_indptr[s]; t < a->q_indptr[s + 1]; t++)
                seq[t] = s;
        assert(!n_cand || a->ctx_lens);
        for (int w = 0; n_cand && w < 2; w++) {
            int32_t *l_pf = pf + (size_t)w * n_cand * 3;
            n_pf[w] = ls_cu_attention_prefill_pick(a->q_indptr, a->ctx_lens, S,
                                                   (ls_cu_prefill_kernel_t)w, l_pf);
            for (int k = 0; k < n_pf[w]; k++)
                pf_max_q[w] = l_pf[3 * k + 2] > pf_max_q[w] ? l_pf[3 * k + 2] : pf_max_q[w];
        }
    }
    if (S && a->max_blocks && a->block_tables)
        memcpy(h + o_tab, a->block_tables, (size_t)S * a->max_blocks * i32);
    if (step->n_logit_rows)
        memcpy(h + o_rows, step->logit_rows, (size_t)step->n_logit_rows * i32);
    if (step->token_rows)
        memcpy(h + o_trows, step->token_rows, (size_t)T * i32);
    if (step->n_head_tiles)
        memcpy(h + o_htiles, step->head_tiles, 3 * (size_t)step->n_head_tiles * i32);
    for (int k = 0; k < B; k++)
        s_pass_fill(&step->lora[k], lslots[k], lscales[k], R, &plan[k], T, h, d, &c->pass[k]);
    s_note(c, cudaMemcpyAsync(c->d_meta.p, h, bytes, cudaMemcpyHostToDevice, c->stream));
    s_note(c, cudaEventRecord(c->meta_done, c->stream));
    c->meta_pending = 1;

    c->T = T;
    c->n_seqs = S;
    c->max_blocks = a->max_blocks;
    c->n_logit_rows = step->n_logit_rows;
    c->token_ids = (const int32_t *)(d + o_ids);
    c->positions = (const int32_t *)(d + o_pos);
    c->slot_mapping = (const int32_t *)(d + o_slot);
    c->tok_seq = (const int32_t *)(d + o_seq);
    c->block_tables = (const int32_t *)(d + o_tab);
    c->logit_rows = (const int32_t *)(d + o_rows);
    for (int w = 0; w < 2; w++) {
        size_t o = o_pf + (size_t)w * n_cand * 3 * i32;
        c->pf[w] = (s_pf_list_t){n_pf[w], pf_max_q[w], (const int32_t *)(d + o),
                                 (const int32_t *)(h + o)};
    }
    c->token_rows = step->token_rows ? (const int32_t *)(d + o_trows) : NULL;
    c->head_tiles = step->n_head_tiles ? (const int32_t *)(d + o_htiles) : NULL;
    c->n_head_tiles = step->n_head_tiles;
    c->n_batches = B;
    c->n_passes = P;
    return c->sticky == cudaSuccess ? 0 : -1;
}

// -- step graphs ------------------------------------------------------------------------------

// Op tags of the probe record.
enum {
    S_OP_STEP = 1, S_OP_EMBEDDING, S_OP_MATMUL, S_OP_RMSNORM, S_OP_RMSNORM_HEADS,
    S_OP_SILU_MUL, S_OP_ADD, S_OP_ROPE_KV_STORE, S_OP_ATTENTION, S_OP_LORA_SHRINK,
    S_OP_LORA_EXPAND, S_OP_LORA_FUSED, S_OP_ROWS_GATHER, S_OP_ZERO, S_OP_SIDE_BEGIN,
    S_OP_SIDE_END, S_OP_SIDE_WAIT, S_OP_LORA_EMBED_SHRINK, S_OP_LORA_ROWS, S_OP_MATMUL_FP8,
    S_OP_TOKEN_ROWS, S_OP_TOKEN_LOGITS, S_OP_LOGITS_WIDEN, S_OP_LORA_SILU_SHRINK, S_OP_LORA_SILU_MUL,
    S_OP_DECODE_BLOCK
};

static uint64_t s_word(const void *p) {
    return (uint64_t)(uintptr_t)p;
}
static uint64_t s_word(int v) {
    return (uint64_t)(int64_t)v;
}
static uint64_t s_word(size_t v) {
    return (uint64_t)v;
}
static uint64_t s_word(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

// In a probe pass: appends the op's arguments to the record and returns true (the op then
// launches nothing); otherwise false.
template <typename... A> static bool s_rec(s_cuda_t *c, A... args) {
    if (c->graph_mode != S_PROBE)
        return false;
    const uint64_t w[] = {s_word(args)...};
    size_t n = sizeof w / sizeof w[0];
    if (c->sig_n + n > c->sig_cap) {
        size_t cap = 2 * (c->sig_n + n) + 1024;
        uint64_t *p = (uint64_t *)realloc(c->sig, cap * sizeof *p);
        if (!p) {
            c->sig_oom = 1; // graph_end then runs the step plainly
            return true;
        }
        c->sig = p;
        c->sig_cap = cap;
    }
    memcpy(c->sig + c->sig_n, w, sizeof w);
    c->sig_n += n;
    return true;
}

// The host slice offsets of a LoRA op, four words whatever n_slices (<= 3).
static void s_rec_slices(s_cuda_t *c, const int32_t *so, int n_slices) {
    s_rec(c, so[0], so[1], n_slices > 1 ? so[2] : 0, n_slices > 2 ? so[3] : 0);
}

static int s_graph_begin(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    assert(c->graph_mode == S_PLAIN);
    // decode steps only: prefill shapes rarely repeat, a capture would not pay off (and
    // attention's launches for them follow the host's sequence list, which no record holds)
    if (!c->graphs_on || c->T == 0 || c->T != c->n_seqs || c->pf[0].n || c->pf[1].n ||
        c->sticky != cudaSuccess)
        return 0;
    c->graph_mode = S_PROBE;
    c->sig_n = 0;
    c->sig_oom = 0;
    // the step's shape and where its metadata lies (the contents are the device block's);
    // the LoRA passes' counts size the kernels' grids, so a step with other passes (a mix
    // more or less) records a different list and gets a graph of its own
    s_rec(c, (int)S_OP_STEP, c->d_meta.p, c->T, c->n_seqs, c->max_blocks, c->n_logit_rows,
          c->token_ids, c->positions, c->slot_mapping, c->tok_seq, c->block_tables,
          c->logit_rows, c->n_batches, c->token_rows, c->head_tiles, c->n_head_tiles);
    for (int k = 0; k < c->n_batches; k++) {
        const s_pass_t *p = &c->pass[k];
        s_rec(c, p->n_tiles, p->max_rank, p->lora_one, p->tiles, p->perm, p->n_zero_rows,
              p->zero_rows, p->exp_tiles, p->n_exp_short, p->n_exp_long, p->row_tiles,
              p->n_row_tiles);
    }
    return 1;
}

static s_graph_t *s_graph_find(s_cuda_t *c) {
    for (int i = 0; i < S_GRAPHS; i++) {
        s_graph_t *g = &c->graphs[i];
        if (g->exec && g->n == c->sig_n && !memcmp(g->sig, c->sig, c->sig_n * sizeof *c->sig))
            return g;
    }
    return NULL;
}

// After a probe miss: frees the least recently used entry and gives it the record; NULL
// when the record cannot be kept.
static s_graph_t *s_graph_claim(s_cuda_t *c) {
    s_graph_t *v = &c->graphs[0];
    for (int i = 1; i < S_GRAPHS && v->exec; i++)
        if (!c->graphs[i].exec || c->graphs[i].used < v->used)
            v = &c->graphs[i];
    if (v->exec) {
        s_note(c, cudaStreamSynchronize(c->stream)); // a queued step may still run it
        cudaGraphExecDestroy(v->exec);
        v->exec = NULL;
    }
    free(v->sig);
    v->sig = (uint64_t *)malloc(c->sig_n * sizeof *v->sig);
    if (!v->sig)
        return NULL;
    memcpy(v->sig, c->sig, c->sig_n * sizeof *v->sig);
    v->n = c->sig_n;
    return v;
}

static int s_graph_end(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    assert(!c->on_side);
    if (c->graph_mode == S_PROBE) {
        c->graph_mode = S_PLAIN;
        s_graph_t *g = c->sig_oom ? NULL : s_graph_find(c);
        if (g) {
            g->used = ++c->graph_clock;
            s_note(c, cudaGraphLaunch(g->exec, c->stream));
            c->n_replayed++;
            return 0;
        }
        if (c->sig_oom || !(c->capturing = s_graph_claim(c)))
            return 1; // the ops again, launched
        if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
            cudaGetLastError();
            return 1;
        }
        c->graph_mode = S_CAPTURE;
        return 1; // the ops again, captured
    }
    if (c->graph_mode == S_CAPTURE) {
        c->graph_mode = S_PLAIN;
        cudaGraph_t graph = NULL;
        cudaGraphExec_t exec = NULL;
        cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
        if (e == cudaSuccess)
            e = cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
        if (graph)
            cudaGraphDestroy(graph);
        if (e != cudaSuccess) {
            // nothing of the captured pass ran: once more, launched, and no graphs from now
            cudaGetLastError();
            c->graphs_on = 0;
            return 1;
        }
        s_graph_t *g = c->capturing;
        g->exec = exec;
        g->used = ++c->graph_clock;
        s_note(c, cudaGraphLaunch(exec, c->stream));
        c->n_captured++;
    }
    return 0;
}

void ls_backend_cuda_set_graphs(ls_backend_t *be, int on) {
    s_ctx(be)->graphs_on = on != 0;
}

void ls_backend_cuda_graph_counts(ls_backend_t *be, long *captured, long *replayed) {
    *captured = s_ctx(be)->n_captured;
    *replayed = s_ctx(be)->n_replayed;
}

long ls_backend_cuda_lora_silu_count(ls_backend_t *be) {
    return s_ctx(be)->n_lora_silu;
}

void ls_backend_cuda_set_block(ls_backend_t *be, int on) {
    s_ctx(be)->block_off = !on;
}

long ls_backend_cuda_block_count(ls_backend_t *be) {
    return s_ctx(be)->n_blocks;
}

void ls_backend_cuda_set_fp8_paths(ls_backend_t *be, int outer, int small, int tc) {
    ls_fp8_gemm_allow(s_ctx(be)->fp8, outer, small, tc);
}

ls_fp8_path_t ls_backend_cuda_fp8_path(ls_backend_t *be) {
    return ls_fp8_gemm_path(s_ctx(be)->fp8);
}

// -- side queue -------------------------------------------------------------------------------

static void s_side_begin(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    assert(!c->on_side);
    c->on_side = 1;
    c->side_open = 1;
    if (s_rec(c, (int)S_OP_SIDE_BEGIN))
        return;
    s_note(c, cudaEventRecord(c->forked, c->main));
    s_note(c, cudaStreamWaitEvent(c->side, c->forked, 0));
    c->stream = c->side;
}

static void s_side_end(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    assert(c->on_side);
    c->on_side = 0;
    c->stream = c->main;
    s_rec(c, (int)S_OP_SIDE_END);
}

static void s_side_wait(ls_backend_t *self) {
    s_cuda_t *c = s_ctx(self);
    assert(!c->on_side);
    c->side_open = 0;
    if (s_rec(c, (int)S_OP_SIDE_WAIT))
        return;
    s_note(c, cudaEventRecord(c->joined, c->side));
    s_note(c, cudaStreamWaitEvent(c->main, c->joined, 0));
}

void ls_backend_cuda_set_side(ls_backend_t *be, int on, int leave_sms) {
    s_cuda_t *c = s_ctx(be);
    be->side_begin = on ? s_side_begin : NULL;
    be->side_end = on ? s_side_end : NULL;
    be->side_wait = on ? s_side_wait : NULL;
    c->side_leave = leave_sms < c->n_sm ? leave_sms : 0;
}

void ls_backend_cuda_set_gemv_tokens(ls_backend_t *be, int n) {
    s_cuda_t *c = s_ctx(be);
    c->gemv_t = n < 0 ? ls_cu_gemv_tokens() : n < LS_CU_GEMV_MAX_T ? n : LS_CU_GEMV_MAX_T;
    ls_fp8_gemm_set_tc_tokens(c->fp8, c->gemv_t);
}

// -- ops --------------------------------------------------------------------------------------

static void s_buffer_zero(ls_backend_t *self, ls_view_t dst, size_t n) {
    s_cuda_t *c = s_ctx(self);
    assert(dst.buf && dst.off + n <= dst.buf->n);
    if (n == 0 || s_rec(c, (int)S_OP_ZERO, s_ptr(dst), n * s_esize(dst.buf->dtype)))
        return;
    s_note(c, cudaMemsetAsync(s_ptr(dst), 0, n * s_esize(dst.buf->dtype), c->stream));
}

static void s_embedding(ls_backend_t *self, ls_view_t out, ls_view_t table, int C,
                        int vocab0, int vocab) {
    s_cuda_t *c = s_ctx(self);
    if (s_rec(c, (int)S_OP_EMBEDDING, s_f32(out), s_ptr(table), (int)s_dt(table), C, vocab0,
              vocab))
        return;
    s_note(c, ls_cu_embedding(s_f32(out), s_ptr(table), s_dt(table), c->token_ids, c->T, C,
                              vocab0, vocab, c->stream));
}

// Step tokens up to which a cuBLAS GEMM leaves no SMs to the LoRA beside it (but o's and
// down's 8 of 132), up to which gate_up's leaves 16, and up to which the others leave half
// (s_gemm_sms; our GEMV's rule comes first)
enum { S_SIDE_NONE_T = 8, S_SIDE_GU16_T = 32, S_SIDE_HALF_T = 128 };

// The SM count a GEMM of T tokens and w (out, in) targets (0: all). With side work open the
// GEMM leaves SMs to it (cuBLAS picks its kernel for the smaller count): set_side's count, or
// by the step's tokens and the GEMM's shape, as measured on an H100 (Llama-3-8B, 8 distinct
// rank-16 adapters on seven targets, 128 cached tokens; the sweeps are in
// kernels/cuda/dev/README.md "The SM split"). The shapes, unsharded: gate_up has over 64M
// weights (its LoRA delta grows with T); down contracts from the MLP's width (in > out); o
// and down contract into the residual stream (in >= out); q,k,v's and o's are the others.
// - beside our GEMV (up to gemv_t tokens) none: the LoRA kernels run in its tail (at
//   one token k_gemv's, and a count caps its grid: batch 1 lost 2% leaving 16; at 3-8 tokens
//   the tensor-core form's: batch 4 and 8 with 4 and 8 adapters 5.95-5.97 and 6.19-6.20 ms
//   leaving none against 6.01-6.02 and 6.24-6.28 leaving 8 at 128 cached tokens, a tie at
//   4K; 9-16 tokens not measured), except 8 of 132 beside the GEMV of two tokens, whose
//   blocks (gemv.cu k_gemv_split) end together, leaving no tail for them (batch 2 with 2
//   adapters 6.15-6.18 ms leaving none, 5.85-5.91 leaving 8, 5.96-5.98 16);
// - past the GEMV, up to S_SIDE_NONE_T tokens none (the LoRA kernels run in the GEMM's
//   tail: batch 1 and 8 1.5-2% faster than leaving half), except 8 of 132 beside o's and
//   down's GEMMs: there the LoRA's shrink, crawling beside a GEMM that holds every SM, ended
//   with it and the expand after it stood in the layer's path (batch 8 ~2% faster a step
//   with 8 adapters, when cuBLAS ran it);
// - up to S_SIDE_HALF_T half the device, and beside gate_up 16 of 132 up to S_SIDE_GU16_T
//   (batch 32 ~1% faster than with 48, four rounds: 7.000-7.106 ms against 7.118-7.194), 48
//   past it (on an H200 6.67-6.75 ms a step at batch 64 against 6.83-6.86 with half; an H100
//   at batch 64 and 128 with 16, 24 or 33 slower);
// - past S_SIDE_HALF_T 16 of 132 beside the MLP's GEMMs and 33 beside q,k,v's and o's, whose
//   LoRA otherwise ends ~10 and ~5 us after them (batch 256: 13.19-13.26 ms against
//   14.02-14.04 with half everywhere, then 1% faster with the 33).
static int s_gemm_sms(const s_cuda_t *c, int T, int in, int out) {
    int n = c->n_sm, leave = c->side_leave;
    if (leave < 0) {
        auto of132 = [n](int k) { return (n * k + 66) / 132; }; // k of 132 SMs, on this device
        bool gate_up = (size_t)in * out > ((size_t)64 << 20), down = in > out;
        if (T <= c->gemv_t) // the GEMV: k_gemv_split's blocks end together
            leave = T == 2 ? of132(8) : 0;
        else if (T <= S_SIDE_NONE_T) // cuBLAS's o, down
            leave = in >= out ? of132(8) : 0;
        else if (T > S_SIDE_HALF_T)
            leave = gate_up || down ? of132(16) : of132(33);
        else
            leave = !gate_up ? n / 2 : T <= S_SIDE_GU16_T ? of132(16) : of132(48);
    }
    return c->side_open && leave > 0 && leave < n ? n - leave : 0;
}

static void s_matmul(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t w,
                     ls_view_t bias, int T, int in, int out, int accumulate) {
    s_cuda_t *c = s_ctx(self);
    assert(T >= 0 && in > 0 && out > 0);
    assert(!c->on_side); // cuBLAS is bound to the main stream
    bool after_attn = c->after_attn;
    c->after_attn = false;
    if (T == 0)
        return;
    float *yp = s_f32(y);
    float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    bool narrow = w.buf->dtype != LS_DTYPE_F32;
    // x already in w's dtype (an rmsnorm's or silu_mul's out_lp): multiplied as is
    bool ready = narrow && x.buf->dtype == w.buf->dtype;
    assert(ready || x.buf->dtype == LS_DTYPE_F32);
    const void *xp = s_ptr(x);
    size_t n = (size_t)T * in;
    // a few tokens on 16-bit weights: our GEMV (ops_cuda.h ls_cu_gemv), which takes x as it
    // is (an fp32 x rounded as it reads it) and adds the bias itself; right after attention
    // (o's, on its output) it asks L2 for less before it waits, as attention still reads
    ls_cu_dtype_t x_dt = ready ? s_dt(w) : LS_CU_F32;
    bool gemv = narrow && T <= c->gemv_t && ls_cu_gemv_ok(T, in, xp, x_dt, s_ptr(w), s_dt(w));
    bool conv = narrow && !ready && !gemv;
    // grown before the op is recorded (a graph holds the pointer) or captured (no allocation
    // or synchronization inside a capture)
    if (conv && s_dev_reserve(c, &c->xconv, n * 2) < 0) {
        s_note(c, cudaErrorMemoryAllocation);
        return;
    }
    int sms = s_gemm_sms(c, T, in, out);
    if (s_rec(c, (int)S_OP_MATMUL, yp, xp, s_ptr(w), (int)s_dt(w),
              s_ptr_or_null(bias), bias.buf ? (int)s_dt(bias) : -1, T, in, out,
              accumulate, conv ? c->xconv.p : NULL, sms))
        return;
    if (gemv) {
        long pf = after_attn ? LS_CU_GEMV_PF_ATTN : LS_CU_GEMV_PF;
        s_note(c, ls_cu_gemv(yp, xp, x_dt, s_ptr(w), s_dt(w), s_ptr_or_null(bias),
                             bias.buf ? s_dt(bias) : LS_CU_F32, T, in, out, accumulate, sms, pf,
                             c->stream));
        return;
    }
    if (sms != c->blas_sms) {
        s_note_blas(c, cublasSetSmCountTarget(c->blas, sms));
        c->blas_sms = sms;
    }
    // Row-major y (T, out) = x (T, in) · w (out, in)ᵀ, seen column-major by cuBLAS:
    // yᵀ (out, T) = wᵀ... i.e. C (m=out, n=T) = op(A) · B with A = w read as column-major
    // (in, out) and transposed, B = x read as column-major (in, T); ldc = out.
    if (!narrow) {
        s_note_blas(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha,
                                   (const float *)s_ptr(w), in, (const float *)xp, in, &beta,
                                   yp, out));
    } else {
        if (conv) {
            s_note(c, ls_cu_convert(c->xconv.p, s_dt(w), xp, LS_CU_F32, n, c->stream));
            xp = c->xconv.p;
        }
        cudaDataType_t dt = w.buf->dtype == LS_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        s_note_blas(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha,
                                    s_ptr(w), dt, in, xp, dt, in, &beta, yp, CUDA_R_32F, out,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (bias.buf)
        s_note(c, ls_cu_bias_add(yp, s_ptr(bias), s_dt(bias), T, out, c->stream));
}

// x quantized per token into xq / x_scale (ls_cu_fp8_quantize_rows; x NONE: the op before
// wrote them), then the FP8 GEMM (fp8_gemm.h) with its scales and bias.
static void s_matmul_fp8(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t xq,
                         ls_view_t x_scale, ls_view_t w, ls_view_t w_scale, ls_view_t bias, int T,
                         int in, int out) {
    s_cuda_t *c = s_ctx(self);
    assert(T >= 0 && in > 0 && in % 16 == 0 && out > 0);
    assert(!c->on_side); // cuBLASLt runs on the main stream, as cuBLAS
    c->after_attn = false;
    assert(xq.buf->dtype == LS_DTYPE_F8E4M3 && w.buf->dtype == LS_DTYPE_F8E4M3);
    assert(xq.off + (size_t)T * in <= xq.buf->n && x_scale.off + (size_t)T <= x_scale.buf->n);
    if (T == 0)
        return;
    int sms = s_gemm_sms(c, T, in, out);
    const void *bp = s_ptr_or_null(bias);
    int bdt = bias.buf ? (int)s_dt(bias) : -1;
    const float *xp = x.buf ? s_f32(x) : NULL;
    if (s_rec(c, (int)S_OP_MATMUL_FP8, s_f32(y), xp, s_ptr(xq), s_f32(x_scale), s_ptr(w),
              s_f32(w_scale), bp, bdt, T, in, out, sms))
        return;
    if (xp)
        s_note(c, ls_cu_fp8_quantize_rows((uint8_t *)s_ptr(xq), s_f32(x_scale), xp, T, in,
                                          c->stream));
    if (ls_fp8_gemm_run(c->fp8, s_f32(y), s_ptr(xq), s_f32(x_scale), s_ptr(w), s_f32(w_scale),
                        bp, bdt, T, in, out, sms, c->blas_ws, S_BLAS_WS, c->stream) != 0)
        s_note_blas(c, CUBLAS_STATUS_EXECUTION_FAILED);
}

// An out_lp view's pointer, dtype (-1: none) and, F8E4M3, its scales' pointer (backend.h
// rmsnorm's out_lp and out_scale).
static void *s_lp_args(ls_view_t out_lp, ls_view_t out_scale, int *dt, float **scale) {
    assert((out_lp.buf && out_lp.buf->dtype == LS_DTYPE_F8E4M3) == (out_scale.buf != NULL));
    *dt = out_lp.buf ? (int)s_dt(out_lp) : -1;
    *scale = out_scale.buf ? s_f32(out_scale) : NULL;
    return s_ptr_or_null(out_lp);
}

static void s_rmsnorm(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t out_scale,
                      ls_view_t residual, ls_view_t x, ls_view_t x2, ls_view_t w, int T, int C,
                      float eps) {
    s_cuda_t *c = s_ctx(self);
    float *res = residual.buf ? s_f32(residual) : NULL;
    const float *add = x2.buf ? s_f32(x2) : NULL;
    int lp_dt;
    float *lps;
    void *lp = s_lp_args(out_lp, out_scale, &lp_dt, &lps);
    float *o = out.buf ? s_f32(out) : NULL;
    assert(o || (lp && out_lp.buf->dtype != LS_DTYPE_F8E4M3));
    if (s_rec(c, (int)S_OP_RMSNORM, o, lp, lp_dt, lps, res, s_f32(x), add, s_ptr(w),
              (int)s_dt(w), T, C, eps))
        return;
    s_note(c, ls_cu_rmsnorm(o, lp, (ls_cu_dtype_t)lp_dt, lps, res, s_f32(x), add,
                            s_ptr(w), s_dt(w), T, C, eps, c->stream));
}

static void s_rmsnorm_heads(ls_backend_t *self, ls_view_t x, ls_view_t w, int T,
                            int n_heads, int head_dim, int row_stride, float eps) {
    s_cuda_t *c = s_ctx(self);
    if (s_rec(c, (int)S_OP_RMSNORM_HEADS, s_f32(x), s_ptr(w), (int)s_dt(w), T, n_heads,
              head_dim, row_stride, eps))
        return;
    s_note(c, ls_cu_rmsnorm_heads(s_f32(x), s_ptr(w), s_dt(w), T, n_heads, head_dim,
                                  row_stride, eps, c->stream));
}

static void s_silu_mul(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t out_scale,
                       ls_view_t gate_up, ls_view_t delta, int T, int inter) {
    s_cuda_t *c = s_ctx(self);
    const float *d = delta.buf ? s_f32(delta) : NULL;
    int lp_dt;
    float *lps;
    void *lp = s_lp_args(out_lp, out_scale, &lp_dt, &lps);
    float *o = out.buf ? s_f32(out) : NULL;
    assert(o || (lp && out_lp.buf->dtype != LS_DTYPE_F8E4M3));
    if (s_rec(c, (int)S_OP_SILU_MUL, o, lp, lp_dt, lps, s_f32(gate_up), d, T, inter))
        return;
    s_note(c, ls_cu_silu_mul(o, lp, (ls_cu_dtype_t)lp_dt, lps, s_f32(gate_up), d, T,
                             inter, c->stream));
}

// decode_block (backend.h): one persistent kernel (ls_cu_decode_block) where the step is one
// token and no side work is open (the kernel takes every SM), the weights, norms and
// attention's rows are bf16, the biases of one dtype, and the kernel fits the device; else 0
static int s_decode_block(ls_backend_t *self, const ls_decode_block_t *d) {
    s_cuda_t *c = s_ctx(self);
    if (c->T != 1 || c->on_side || c->side_open || !c->block_sync || c->block_off)
        return 0;
    bool next = d->w_qkv.buf != NULL;
    const ls_view_t bf[] = {d->a, d->w_o, d->g2, d->w_gu, d->w_d, d->act,
                            next ? d->g1 : d->g2, next ? d->w_qkv : d->w_o};
    for (size_t i = 0; i < sizeof bf / sizeof bf[0]; i++)
        if (bf[i].buf->dtype != LS_DTYPE_BF16)
            return 0;
    const ls_view_t biases[] = {d->b_o, d->b_gu, d->b_d, next ? d->b_qkv : LS_VIEW_NONE};
    ls_dtype_t b_dt = LS_DTYPE_F32;
    bool first = true;
    for (size_t i = 0; i < sizeof biases / sizeof biases[0]; i++) {
        if (!biases[i].buf)
            continue;
        if (!first && biases[i].buf->dtype != b_dt)
            return 0;
        b_dt = biases[i].buf->dtype, first = false;
    }
    ls_cu_block_t b = {s_ptr(d->a), s_ptr(d->w_o), s_ptr_or_null(d->b_o), s_ptr(d->g2),
                       s_ptr(d->w_gu), s_ptr_or_null(d->b_gu), s_ptr(d->w_d), s_ptr_or_null(d->b_d),
                       next ? s_ptr(d->g1) : NULL, next ? s_ptr(d->w_qkv) : NULL,
                       next ? s_ptr_or_null(d->b_qkv) : NULL, (ls_cu_dtype_t)b_dt, s_f32(d->x),
                       s_f32(d->x1), s_f32(d->y), next ? s_f32(d->qkv) : NULL, s_ptr(d->act),
                       c->block_sync, d->H, d->q_dim, d->inter, d->qkv_dim, d->eps};
    if (!ls_cu_decode_block_ok(&b))
        return 0;
    c->after_attn = false; // o's matmul is the block's
    if (s_rec(c, (int)S_OP_DECODE_BLOCK, b.a, b.w_o, b.b_o, b.g2, b.w_gu, b.b_gu, b.w_d, b.b_d, b.g1,
              b.w_qkv, b.b_qkv, (int)b.b_dt, (void *)b.x, (void *)b.x1, (void *)b.y, (void *)b.qkv,
              b.act, b.H, b.q_dim, b.inter, b.qkv_dim, b.eps))
        return 1;
    s_note(c, ls_cu_decode_block(&b, c->stream));
    c->n_blocks++;
    return 1;
}

static void s_add(ls_backend_t *self, ls_view_t y, ls_view_t x, size_t n) {
    s_cuda_t *c = s_ctx(self);
    if (s_rec(c, (int)S_OP_ADD, s_f32(y), s_f32(x), n))
        return;
    s_note(c, ls_cu_add(s_f32(y), s_f32(x), n, c->stream));
}

static void s_rope_kv_store(ls_backend_t *self, ls_view_t x, ls_view_t x2, ls_view_t inv_freq,
                            ls_view_t k_cache, ls_view_t v_cache, int n_heads, int n_kv_heads,
                            int head_dim, int row_stride, int block_size, size_t block_stride) {
    s_cuda_t *c = s_ctx(self);
    assert(k_cache.buf->dtype == v_cache.buf->dtype);
    const float *add = x2.buf ? s_f32(x2) : NULL;
    if (s_rec(c, (int)S_OP_ROPE_KV_STORE, s_f32(x), add, s_ptr(inv_freq), (int)s_dt(inv_freq),
              s_ptr(k_cache), s_ptr(v_cache), (int)s_dt(k_cache), n_heads, n_kv_heads, head_dim,
              row_stride, block_size, block_stride))
        return;
    s_note(c, ls_cu_rope_kv_store(s_f32(x), add, s_ptr(k_cache), s_ptr(v_cache), s_dt(k_cache),
                                  c->positions, c->slot_mapping, s_ptr(inv_freq), s_dt(inv_freq),
                                  c->T, n_heads, n_kv_heads, head_dim, row_stride, block_size,
                                  block_stride, c->stream));
}

static void s_attention(ls_backend_t *self, ls_view_t out, ls_view_t q, ls_view_t k_cache,
                        ls_view_t v_cache, int n_heads, int n_kv_heads, int head_dim,
                        int block_size, int row_stride, size_t block_stride) {
    s_cuda_t *c = s_ctx(self);
    assert(k_cache.buf->dtype == v_cache.buf->dtype);
    ls_cu_dtype_t odt = s_dt(out);
    assert(odt == LS_CU_F32 || odt == LS_CU_BF16 || odt == LS_CU_F16);
    char *o = (char *)s_ptr(out);
    c->after_attn = true;
    if (s_rec(c, (int)S_OP_ATTENTION, (void *)o, (int)odt, s_f32(q), s_ptr(k_cache),
              s_ptr(v_cache), (int)s_dt(k_cache), n_heads, n_kv_heads, head_dim, block_size,
              row_stride, block_stride))
        return;
    const float *qp = s_f32(q);
    const void *kc = s_ptr(k_cache), *vc = s_ptr(v_cache);
    ls_cu_dtype_t dt = s_dt(k_cache);
    const s_pf_list_t *pf = &c->pf[ls_cu_attention_prefill_which(head_dim)];
    if (!pf->n || !ls_cu_attention_prefill_ok(o, qp, kc, vc, dt, n_heads, n_kv_heads, head_dim,
                                              row_stride)) {
        s_note(c, ls_cu_attention(o, odt, qp, kc, vc, dt, c->tok_seq, c->positions,
                                  c->block_tables, c->max_blocks, c->T, n_heads, n_kv_heads,
                                  head_dim, block_size, row_stride, block_stride, c->stream));
        return;
    }
    // the runs of tokens between the prefill sequences (decodes, short chunks) on the
    // decode-shaped kernel, a launch per run on its rows; then the prefill sequences
    size_t od = (size_t)n_heads * head_dim * ls_cu_dtype_size(odt);
    for (int k = 0, t = 0; k <= pf->n; k++) {
        int end = k < pf->n ? pf->h[3 * k + 1] : c->T;
        if (end > t)
            s_note(c, ls_cu_attention(o + t * od, odt, qp + (size_t)t * row_stride, kc, vc, dt,
                                      c->tok_seq + t, c->positions + t, c->block_tables,
                                      c->max_blocks, end - t, n_heads, n_kv_heads, head_dim,
                                      block_size, row_stride, block_stride, c->stream));
        if (k < pf->n)
            t = end + pf->h[3 * k + 2];
    }
    s_note(c, ls_cu_attention_prefill(o, odt, qp, kc, vc, dt, pf->d, pf->n, pf->max_q,
                                      c->positions, c->block_tables, c->max_blocks, n_heads,
                                      n_kv_heads, head_dim, block_size, row_stride, block_stride,
                                      c->stream));
}

// The LoRA launchers' flags: beside a GEMM (the side queue) no programmatic dependent
// launch — an expand's blocks, started early and waiting on the shrink, would hold SMs the
// GEMM's blocks are waiting for (H200, 8 distinct adapters: 7.69 -> 7.49 ms a step).
static unsigned s_lora_flags(const s_cuda_t *c, const s_pass_t *p, int accumulate) {
    return (accumulate ? LS_CU_LORA_ACC : 0) | (c->on_side ? LS_CU_LORA_NO_PDL : 0) |
           (p->lora_one ? LS_CU_LORA_ONE : 0);
}

// Floats between the parts of a decode LoRA op's scratch (its K split over blocks,
// LS_CU_LORA_PARTS arrays): lora_fused's and gate_up's in SiLU·mul
static size_t s_part_stride(const s_cuda_t *c, int n_slices, int r_max) {
    return (size_t)c->T * n_slices * r_max;
}

// The step's LoRA batch `pass` (ls_step_t.lora), which a LoRA op of n_slices slices and r_max
// runs over.
static const s_pass_t *s_pass(const s_cuda_t *c, int pass, int n_slices, int r_max) {
    assert(pass >= 0 && pass < c->n_batches && n_slices >= 1 && n_slices <= LS_LORA_MAX_SLICES);
    assert(c->pass[pass].max_rank <= r_max);
    return &c->pass[pass];
}

// A LoRA matrix as the kernels take it: its table's device pointers
static ls_lora_pages_t s_pages(ls_lora_mat_t m) {
    return ls_lora_pages_t{(const void *const *)s_ptr(m.tab), m.stride, m.np, m.piece};
}

static void s_lora_shrink(ls_backend_t *self, ls_view_t tmp, ls_view_t x, ls_lora_mat_t a,
                          int in, int n_slices, int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, n_slices, r_max);
    if (s_rec(c, (int)S_OP_LORA_SHRINK, s_f32(tmp), s_ptr(x), (int)s_dt(x), s_ptr(a.tab), a.stride,
              a.np, a.piece, (int)a.dtype, in, n_slices, r_max, pass))
        return;
    s_note(c, ls_cu_lora_shrink(s_f32(tmp), s_ptr(x), s_dt(x), s_pages(a), (ls_cu_dtype_t)a.dtype, p->tiles,
                                p->n_tiles, p->max_rank, p->perm, in, n_slices, r_max,
                                s_lora_flags(c, p, 1), c->stream));
}

static void s_lora_expand(ls_backend_t *self, ls_view_t y, ls_view_t tmp, ls_lora_mat_t b,
                          const int32_t *slice_offsets, int n_slices, int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, n_slices, r_max);
    if (s_rec(c, (int)S_OP_LORA_EXPAND, s_f32(y), s_f32(tmp), s_ptr(b.tab), b.stride, b.np, b.piece,
              (int)b.dtype, n_slices, r_max, pass)) {
        s_rec_slices(c, slice_offsets, n_slices);
        return;
    }
    // short segments as the decode kernels take them; long ones (prefill) in long tiles, each
    // column's B row read once per LS_CU_LORA_LONG positions instead of per LS_CU_LORA_TILE
    s_note(c, ls_cu_lora_expand(s_f32(y), s_f32(tmp), s_pages(b), (ls_cu_dtype_t)b.dtype, p->exp_tiles,
                                p->n_exp_short, p->max_rank, p->perm, slice_offsets, n_slices,
                                r_max, s_lora_flags(c, p, 1), c->stream));
    s_note(c, ls_cu_lora_expand_long(s_f32(y), s_f32(tmp), s_pages(b), (ls_cu_dtype_t)b.dtype,
                                     p->exp_tiles + p->n_exp_short, p->n_exp_long, p->perm,
                                     slice_offsets, n_slices, r_max, c->stream));
}

static void s_lora_fused(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t tmp,
                         ls_lora_mat_t a, ls_lora_mat_t b, const int32_t *slice_offsets,
                         int in, int n_slices, int r_max, int accumulate, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, n_slices, r_max);
    if (s_rec(c, (int)S_OP_LORA_FUSED, s_f32(y), s_ptr(x), (int)s_dt(x), s_f32(tmp), s_ptr(a.tab), a.stride,
              a.np, a.piece, (int)a.dtype, s_ptr(b.tab), b.stride, b.np, b.piece, (int)b.dtype, in, n_slices, r_max,
              accumulate, pass)) {
        s_rec_slices(c, slice_offsets, n_slices);
        return;
    }
    // written, not added: the tiles' rows get the delta (the kernels store it), the rest 0
    if (!accumulate)
        s_note(c, ls_cu_rows_zero(s_f32(y), p->zero_rows, p->n_zero_rows,
                                  slice_offsets[n_slices], c->stream));
    static_assert(LS_LORA_FUSED_PARTS >= LS_CU_LORA_PARTS, "lora_fused's scratch");
    s_note(c, ls_cu_lora_apply(s_f32(y), s_f32(tmp), s_part_stride(c, n_slices, r_max),
                               s_ptr(x), s_dt(x), s_pages(a), (ls_cu_dtype_t)a.dtype, s_pages(b),
                               (ls_cu_dtype_t)b.dtype, p->tiles, p->n_tiles, p->max_rank, p->perm,
                               slice_offsets, in, n_slices, r_max,
                               s_lora_flags(c, p, accumulate), c->stream));
}

// gate_up's LoRA in SiLU·mul (ls_cu_lora_silu_mul): tmp's parts as lora_fused's over 2 slices
static bool s_lora_silu_fits(ls_backend_t *self, ls_view_t x, ls_view_t tmp, ls_lora_mat_t a,
                             ls_lora_mat_t b, int in, int inter, int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, 2, r_max);
    return ls_cu_lora_silu_mul_fits(s_ptr(x), s_dt(x), s_pages(a), (ls_cu_dtype_t)a.dtype, s_pages(b),
                                    (ls_cu_dtype_t)b.dtype, s_f32(tmp), p->max_rank, in, inter, r_max,
                                    s_lora_flags(c, p, 0));
}

static void s_lora_silu_shrink(ls_backend_t *self, ls_view_t tmp, ls_view_t x, ls_lora_mat_t a, int in,
                               int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, 2, r_max);
    if (s_rec(c, (int)S_OP_LORA_SILU_SHRINK, s_f32(tmp), s_ptr(x), (int)s_dt(x), s_ptr(a.tab), a.stride, a.np,
              a.piece, (int)a.dtype, in, r_max, pass))
        return;
    s_note(c, ls_cu_lora_silu_shrink(s_f32(tmp), s_part_stride(c, 2, r_max), s_ptr(x), s_dt(x), s_pages(a),
                                     p->tiles, p->n_tiles, p->max_rank, p->perm, in, r_max,
                                     s_lora_flags(c, p, 0), c->stream));
}

static void s_lora_silu_mul(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t gate_up,
                            ls_view_t tmp, ls_lora_mat_t b, int in, int inter, int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, 2, r_max);
    float *o = out.buf ? s_f32(out) : NULL;
    void *lp = s_ptr_or_null(out_lp);
    int lp_dt = lp ? (int)s_dt(out_lp) : (int)LS_CU_F32;
    if (s_rec(c, (int)S_OP_LORA_SILU_MUL, o, lp, lp_dt, s_f32(gate_up), s_f32(tmp), s_ptr(b.tab), b.stride,
              b.np, b.piece, (int)b.dtype, in, inter, r_max, pass))
        return;
    c->n_lora_silu++;
    s_note(c, ls_cu_lora_silu_mul(o, lp, (ls_cu_dtype_t)lp_dt, s_f32(gate_up), s_f32(tmp),
                                  s_part_stride(c, 2, r_max), s_pages(b), p->tiles, p->n_tiles, p->max_rank,
                                  p->perm, p->zero_rows, p->n_zero_rows, c->T, in, inter, r_max, c->stream));
}

static void s_lora_embed_shrink(ls_backend_t *self, ls_view_t tmp, ls_lora_mat_t a, int vocab,
                                int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    const s_pass_t *p = s_pass(c, pass, 1, r_max);
    if (s_rec(c, (int)S_OP_LORA_EMBED_SHRINK, s_f32(tmp), s_ptr(a.tab), a.stride, a.np, a.piece, (int)a.dtype,
              vocab, r_max, pass))
        return;
    s_note(c, ls_cu_lora_embed_shrink(s_f32(tmp), c->token_ids, s_pages(a), (ls_cu_dtype_t)a.dtype,
                                      p->tiles, p->n_tiles, p->perm, vocab, r_max, c->stream));
}

static void s_lora_rows(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t tmp,
                        ls_lora_mat_t a, ls_lora_mat_t b, int in, int out, int r_max, int pass) {
    s_cuda_t *c = s_ctx(self);
    assert(pass < c->n_passes);
    const s_pass_t *p = s_pass(c, pass, 1, r_max);
    if (s_rec(c, (int)S_OP_LORA_ROWS, s_f32(y), s_f32(x), s_f32(tmp), s_ptr(a.tab), a.stride, a.np, a.piece,
              (int)a.dtype, s_ptr(b.tab), b.stride, b.np, b.piece, (int)b.dtype, in, out, r_max, pass))
        return;
    s_note(c, ls_cu_lora_rows(s_f32(y), s_f32(tmp), s_f32(x), s_pages(a), (ls_cu_dtype_t)a.dtype, s_pages(b),
                              (ls_cu_dtype_t)b.dtype, p->row_tiles, p->n_row_tiles, in, out, r_max, c->stream));
}

static void s_rows_gather(ls_backend_t *self, ls_view_t out, ls_view_t x, int C) {
    s_cuda_t *c = s_ctx(self);
    if (s_rec(c, (int)S_OP_ROWS_GATHER, s_f32(out), s_f32(x), C))
        return;
    s_note(c, ls_cu_rows_gather(s_f32(out), s_f32(x), c->logit_rows, c->n_logit_rows, C,
                                c->stream));
}

static void s_token_rows(ls_backend_t *self, ls_view_t x, ls_view_t rows, int C) {
    s_cuda_t *c = s_ctx(self);
    assert(c->token_rows);
    if (s_rec(c, (int)S_OP_TOKEN_ROWS, s_f32(x), s_ptr(rows), (int)s_dt(rows), C))
        return;
    s_note(c, ls_cu_token_rows(s_f32(x), s_ptr(rows), s_dt(rows), c->token_rows, c->T, C,
                               c->stream));
}

static void s_token_logits(ls_backend_t *self, ls_view_t logits, ls_view_t x, ls_view_t rows,
                           ls_view_t ids, int C, int V) {
    s_cuda_t *c = s_ctx(self);
    assert(ids.buf->dtype == LS_DTYPE_F32);
    if (s_rec(c, (int)S_OP_TOKEN_LOGITS, s_f32(logits), s_f32(x), s_ptr(rows), (int)s_dt(rows),
              s_f32(ids), C, V))
        return;
    s_note(c, ls_cu_token_logits(s_f32(logits), s_f32(x), s_ptr(rows), s_dt(rows), s_f32(ids),
                                 c->head_tiles, c->n_head_tiles, C, V, c->stream));
}

static void s_logits_widen(ls_backend_t *self, ls_view_t wide, ls_view_t head, int V, int W) {
    s_cuda_t *c = s_ctx(self);
    if (s_rec(c, (int)S_OP_LOGITS_WIDEN, s_f32(wide), s_f32(head), V, W))
        return;
    s_note(c, ls_cu_logits_widen(s_f32(wide), s_f32(head), c->n_logit_rows, V, W, c->stream));
}

// -- sampling ---------------------------------------------------------------------------------

static int s_sample(ls_backend_t *self, ls_view_t logits, int V,
                    const ls_sampling_batch_t *batch, int32_t *tokens, float *logprobs,
                    int32_t *top_ids, float *top_logprobs) {
    s_cuda_t *c = s_ctx(self);
    int n = batch->n_rows, max_top = top_ids ? batch->max_top_n : 0;
    if (n == 0)
        return c->sticky == cudaSuccess ? 0 : -1;
    assert(V > 0 && (size_t)n * V < 0x7fffffff);
    assert(logits.off + (size_t)n * V <= logits.buf->n);
    const int32_t *pi = batch->prompt_indptr, *oi = batch->output_indptr;
    size_t n_prompt = pi ? (size_t)pi[n] : 0, n_output = oi ? (size_t)oi[n] : 0;
    size_t i32 = sizeof(int32_t);
    // grammar masks: the rows' indices and the masks they name (at most one per row), staged
    // with the rest of the inputs in the pinned buffer and copied in the same transfer
    size_t words = (size_t)(V + 31) / 32, n_masks = 0;
    for (int r = 0; batch->mask_index && r < n; r++)
        if (batch->mask_index[r] >= 0 && (size_t)batch->mask_index[r] + 1 > n_masks)
            n_masks = (size_t)batch->mask_index[r] + 1;

    int n_sampled = 0, n_truncated = 0, n_top_k_and_p = 0;
    for (int r = 0; r < n; r++) {
        const ls_sampling_params_t *sp = &batch->params[r];
        assert(sp->n_logprobs >= 0 && (!top_ids || sp->n_logprobs <= batch->max_top_n));
        int use_k = sp->top_k > 0 && sp->top_k < V, use_p = sp->top_p < 1.0f;
        if (sp->temperature > 0.0f) {
            n_sampled++;
            n_truncated += use_k || use_p;
            n_top_k_and_p += use_k && use_p;
        }
    }

    // inputs, packed: params, indptrs, ids, masks; then the outputs' device block
    s_layout_t l = {0};
    size_t o_par = s_place(&l, (size_t)n * sizeof(ls_cu_sample_params_t)),
           o_pi = s_place(&l, pi ? (size_t)(n + 1) * i32 : 0),
           o_pids = s_place(&l, n_prompt * i32),
           o_oi = s_place(&l, oi ? (size_t)(n + 1) * i32 : 0),
           o_oids = s_place(&l, n_output * i32),
           o_mi = s_place(&l, n_masks ? (size_t)n * i32 : 0), o_mk = s_place(&l, n_masks * words * 4),
           in_bytes = l.off,
           o_tok = s_place(&l, (size_t)n * i32), o_lp = s_place(&l, (size_t)n * 4),
           o_tid = s_place(&l, (size_t)n * max_top * i32),
           o_tlp = s_place(&l, (size_t)n * max_top * 4);
    size_t bytes = l.off;
    if (s_host_reserve(&c->h_smp, &c->h_smp_cap, bytes) < 0 ||
        s_dev_reserve(c, &c->d_smp, bytes) < 0)
        return -1;
    char *h = c->h_smp;
    ls_cu_sample_params_t *par = (ls_cu_sample_params_t *)(h + o_par);
    for (int r = 0; r < n; r++) {
        const ls_sampling_params_t *sp = &batch->params[r];
        ls_cu_sample_params_t *p = &par[r];
        p->temperature = sp->temperature;
        p->top_k = sp->top_k;
        p->top_p = sp->top_p;
        p->min_p = sp->min_p;
        p->repetition_penalty = sp->repetition_penalty;
        p->frequency_penalty = sp->frequency_penalty;
        p->presence_penalty = sp->presence_penalty;
        p->log_min_p = sp->min_p > 0.0f ? logf(sp->min_p) : 0.0f; // the reference's logf
        p->seed = sp->seed;
        p->step = sp->step;
        p->n_logprobs = top_ids ? sp->n_logprobs : 0;
    }
    if (pi) {
        memcpy(h + o_pi, pi, (size_t)(n + 1) * i32);
        if (n_prompt)
            memcpy(h + o_pids, batch->prompt_ids, n_prompt * i32);
    }
    if (oi) {
        memcpy(h + o_oi, oi, (size_t)(n + 1) * i32);
        if (n_output)
            memcpy(h + o_oids, batch->output_ids, n_output * i32);
    }

    if (n_masks) {
        memcpy(h + o_mi, batch->mask_index, (size_t)n * i32);
        memcpy(h + o_mk, batch->masks, n_masks * words * 4);
    }

    // scratch
    size_t rv = (size_t)n * V;
    int grew_mark = s_dev_reserve(c, &c->mark, rv * i32);
    if (s_dev_reserve(c, &c->lp, rv * 4) < 0 || grew_mark < 0 ||
        s_dev_reserve(c, &c->smp_part, (size_t)n * ls_cu_sample_chunks(n, V) *
                                           sizeof(ls_cu_sample_part_t)) < 0)
        return -1;
    if (grew_mark > 0) // kept zeroed by the kernel from here on
        s_note(c, cudaMemsetAsync(c->mark.p, 0, c->mark.cap, c->stream));
    if (n_sampled && s_dev_reserve(c, &c->smp_select, ls_cu_sample_select_bytes(n, V)) < 0)
        return -1;

    char *d = (char *)c->d_smp.p;
    s_note(c, cudaMemcpyAsync(d, h, in_bytes ? in_bytes : 1, cudaMemcpyHostToDevice,
                              c->stream));
    ls_cu_sample_args_t args;
    memset(&args, 0, sizeof args);
    args.n_rows = n;
    args.V = V;
    args.max_top_n = max_top;
    args.logits = s_f32(logits);
    args.params = (const ls_cu_sample_params_t *)(d + o_par);
    args.prompt_indptr = pi ? (const int32_t *)(d + o_pi) : NULL;
    args.prompt_ids = (const int32_t *)(d + o_pids);
    args.output_indptr = oi ? (const int32_t *)(d + o_oi) : NULL;
    args.output_ids = (const int32_t *)(d + o_oids);
    args.mask_index = n_masks ? (const int32_t *)(d + o_mi) : NULL;
    args.masks = n_masks ? (const uint32_t *)(d + o_mk) : NULL;
    args.lp = (float *)c->lp.p;
    args.mark = (int32_t *)c->mark.p;
    args.part = (ls_cu_sample_part_t *)c->smp_part.p;
    args.select = n_sampled ? c->smp_select.p : NULL;
    args.n_sampled = n_sampled;
    args.n_truncated = n_truncated;
    args.n_top_k_and_p = n_top_k_and_p;
    args.tokens = (int32_t *)(d + o_tok);
    args.logprobs = (float *)(d + o_lp);
    args.top_ids = max_top ? (int32_t *)(d + o_tid) : NULL;
    args.top_lps = max_top ? (float *)(d + o_tlp) : NULL;
    s_note(c, ls_cu_sample(&args, c->stream));
    s_note(c, cudaMemcpyAsync(h + o_tok, d + o_tok, bytes - o_tok, cudaMemcpyDeviceToHost,
                              c->stream));
    s_note(c, cudaStreamSynchronize(c->stream));
    if (c->sticky != cudaSuccess)
        return -1;
    memcpy(tokens, h + o_tok, (size_t)n * i32);
    if (logprobs)
        memcpy(logprobs, h + o_lp, (size_t)n * 4);
    if (max_top)
        for (int r = 0; r < n; r++) { // entries past a row's n_logprobs stay untouched
            size_t at = (size_t)r * max_top, m = (size_t)batch->params[r].n_logprobs;
            memcpy(top_ids + at, h + o_tid + at * i32, m * i32);
            memcpy(top_logprobs + at, h + o_tlp + at * 4, m * 4);
        }
    return 0;
}

// -- construction -----------------------------------------------------------------------------

void *ls_backend_cuda_stream(ls_backend_t *be) {
    return s_ctx(be)->main;
}

ls_backend_t *ls_backend_cuda_new(int device, char *err, size_t errlen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device < 0 || device >= count) {
        ls_err_set(err, errlen, "cuda: no device %d (%d found%s%s)", device,
              e == cudaSuccess ? count : 0, e == cudaSuccess ? "" : ": ",
              e == cudaSuccess ? "" : cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    ls_backend_t *self = (ls_backend_t *)calloc(1, sizeof *self);
    s_cuda_t *c = (s_cuda_t *)calloc(1, sizeof *c);
    if (!self || !c) {
        free(self);
        free(c);
        ls_err_set(err, errlen, "cuda: out of host memory");
        return NULL;
    }
    self->name = "cuda";
    self->ctx = c;
    self->free = s_free;
    c->device = device;
    int least, greatest;
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaDeviceGetStreamPriorityRange(&least, &greatest)) != cudaSuccess ||
        (e = cudaStreamCreateWithPriority(&c->main, cudaStreamNonBlocking, greatest)) != cudaSuccess ||
        (e = cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, least)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->forked, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->joined, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->upload, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->queued, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming)) != cudaSuccess) {
        ls_err_set(err, errlen, "cuda: device %d: %s", device, cudaGetErrorString(e));
        s_free(self);
        return NULL;
    }
    c->stream = c->main;
    cublasStatus_t st = cublasCreate(&c->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        c->blas = NULL;
        ls_err_set(err, errlen, "cuda: cublasCreate failed (status %d)", (int)st);
        s_free(self);
        return NULL;
    }
    // TF32 stays off: the F32-weight path is a true fp32 GEMM. The workspace is ours, set
    // once: cuBLAS would otherwise allocate one at its first call, which may be a capture.
    if (cudaMalloc(&c->blas_ws, S_BLAS_WS) != cudaSuccess ||
        cublasSetStream(c->blas, c->stream) != CUBLAS_STATUS_SUCCESS ||
        // after cublasSetStream, which resets the workspace to cuBLAS's own pool
        cublasSetWorkspace(c->blas, c->blas_ws, S_BLAS_WS) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
        ls_err_set(err, errlen, "cuda: cuBLAS setup failed");
        s_free(self);
        return NULL;
    }
    if (!(c->fp8 = ls_fp8_gemm_new(err, errlen))) {
        s_free(self);
        return NULL;
    }
    self->buffer_new = s_buffer_new;
    self->buffer_free = s_buffer_free;
    self->buffer_upload = s_buffer_upload;
    self->buffer_download = s_buffer_download;
    self->buffer_zero = s_buffer_zero;
    self->synchronize = s_synchronize;
    self->host_alloc = s_host_alloc;
    self->host_free = s_host_free;
    self->event_new = s_event_new;
    self->event_free = s_event_free;
    self->buffer_upload_async = s_buffer_upload_async;
    self->event_wait = s_event_wait;
    self->event_sync = s_event_sync;
    self->step_begin = s_step_begin;
    self->embedding = s_embedding;
    self->matmul = s_matmul;
    self->matmul_fp8 = s_matmul_fp8;
    self->rmsnorm = s_rmsnorm;
    self->rmsnorm_heads = s_rmsnorm_heads;
    self->silu_mul = s_silu_mul;
    self->add = s_add;
    self->decode_block = s_decode_block;
    self->rope_kv_store = s_rope_kv_store;
    self->attention = s_attention;
    self->lora_shrink = s_lora_shrink;
    self->lora_expand = s_lora_expand;
    self->lora_fused = s_lora_fused;
    self->lora_silu_fits = s_lora_silu_fits;
    self->lora_silu_shrink = s_lora_silu_shrink;
    self->lora_silu_mul = s_lora_silu_mul;
    self->lora_embed_shrink = s_lora_embed_shrink;
    self->lora_rows = s_lora_rows;
    self->rows_gather = s_rows_gather;
    self->token_rows = s_token_rows;
    self->token_logits = s_token_logits;
    self->logits_widen = s_logits_widen;
    self->sample = s_sample;
    self->graph_begin = s_graph_begin;
    self->graph_end = s_graph_end;
    cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device);
    // decode_block's barrier word; without it the op declines and the ops run one by one
    if (cudaMalloc(&c->block_sync, sizeof *c->block_sync) != cudaSuccess ||
        cudaMemset(c->block_sync, 0, sizeof *c->block_sync) != cudaSuccess) {
        cudaFree(c->block_sync);
        c->block_sync = NULL;
        cudaGetLastError();
    }
    ls_backend_cuda_set_side(self, 1, -1);
    ls_backend_cuda_set_gemv_tokens(self, -1);
    c->graphs_on = 1;
    return self;
}
