/*  engine/backend_cpu.c — the CPU backend: the ls_backend_t table over kernels/ops.h.

    Buffers are plain host arrays of f32 whatever dtype is asked for (weights are widened
    at upload), so a view is just data + off. step_begin deep-copies the step metadata into
    arrays the backend owns, mirroring the single per-step copy a device backend makes;
    those arrays grow and are reused from step to step. Everything runs synchronously, so
    synchronize has nothing to wait for.
*/
#include <assert.h>
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "ls_limits.h"

typedef struct {
    void *p;
    size_t cap; // bytes
} s_array_t;

// The arrays of one LoRA batch's copy.
enum { S_SEG_INDPTR, S_WEIGHT_INDICES, S_PERMUTATION, S_LORA_RANKS, S_SCALINGS,
       S_SEG_WEIGHTS, S_LORA_ARRAYS };

// The backend's copy of the current step. Each array member of step/lora points into one
// of the s_array_t below.
typedef struct {
    ls_step_t step;
    ls_lora_batch_t lora[LS_LORA_BATCH_MAX];
    s_array_t token_ids, positions, slot_mapping, q_indptr, ctx_lens, block_tables,
        logit_rows, logit_slots, logit_scales, token_rows, head_tiles;
    s_array_t lora_arrays[LS_LORA_BATCH_MAX][S_LORA_ARRAYS];
} s_cpu_t;

// Returns a copy of n bytes of src kept in a (grown as needed); NULL for NULL src or an
// empty array, which no op reads. On allocation failure returns NULL and sets *failed.
static void *s_array_copy(s_array_t *a, const void *src, size_t n, int *failed) {
    if (!src || n == 0)
        return NULL;
    if (n > a->cap) {
        void *p = realloc(a->p, n);
        if (!p) {
            *failed = 1;
            return NULL;
        }
        a->p = p;
        a->cap = n;
    }
    return memcpy(a->p, src, n);
}

static float *s_f32(ls_view_t v) {
    assert(v.buf);
    return (float *)v.buf->data + v.off;
}

// NULL for LS_VIEW_NONE
static float *s_f32_opt(ls_view_t v) {
    return v.buf ? s_f32(v) : NULL;
}

static s_cpu_t *s_cpu(ls_backend_t *self) {
    return self->ctx;
}

static void s_free(ls_backend_t *self) {
    s_cpu_t *c = s_cpu(self);
    s_array_t *arrays[] = {&c->token_ids,    &c->positions,   &c->slot_mapping,
                           &c->q_indptr,     &c->ctx_lens,    &c->block_tables,
                           &c->logit_rows,   &c->logit_slots, &c->logit_scales,
                           &c->token_rows,   &c->head_tiles};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]->p);
    for (int k = 0; k < LS_LORA_BATCH_MAX; k++)
        for (int i = 0; i < S_LORA_ARRAYS; i++)
            free(c->lora_arrays[k][i].p);
    free(c);
    free(self);
}

static ls_buffer_t *s_buffer_new(ls_backend_t *self, ls_dtype_t dtype, size_t n) {
    ls_buffer_t *buf = malloc(sizeof *buf);
    float *data = malloc((n ? n : 1) * sizeof(float));
    if (!buf || !data) {
        free(buf);
        free(data);
        return NULL;
    }
    *buf = (ls_buffer_t){dtype, n, data, LS_DTYPE_F32};
    return buf;
}

static void s_buffer_free(ls_backend_t *self, ls_buffer_t *buf) {
    if (!buf)
        return;
    free(buf->data);
    free(buf);
}

static int s_buffer_upload(ls_backend_t *self, ls_view_t dst, const void *src,
                           ls_dtype_t src_dtype, size_t n) {
    assert(dst.off + n <= dst.buf->n);
    float *d = s_f32(dst);
    switch (src_dtype) {
    case LS_DTYPE_F32:
        memcpy(d, src, n * sizeof(float));
        return 0;
    case LS_DTYPE_BF16:
        ls_convert_bf16_to_f32(d, src, n);
        return 0;
    case LS_DTYPE_F16:
        ls_convert_f16_to_f32(d, src, n);
        return 0;
    case LS_DTYPE_F8E4M3:
        for (size_t i = 0; i < n; i++)
            d[i] = ls_e4m3_to_f32(((const uint8_t *)src)[i]);
        return 0;
    }
    return -1;
}

static int s_buffer_download(ls_backend_t *self, float *dst, ls_view_t src, size_t n) {
    assert(src.off + n <= src.buf->n);
    memcpy(dst, s_f32(src), n * sizeof(float));
    return 0;
}

static void s_buffer_zero(ls_backend_t *self, ls_view_t dst, size_t n) {
    assert(dst.off + n <= dst.buf->n);
    memset(s_f32(dst), 0, n * sizeof(float));
}

static int s_synchronize(ls_backend_t *self) {
    return 0;
}

// Asynchronous uploads run at once: every op runs when called, so there is nothing to wait
// for and nothing to overlap; the event is a token that is always complete.
struct ls_event {
    char unused;
};

static void *s_host_alloc(ls_backend_t *self, size_t bytes) {
    return malloc(bytes ? bytes : 1);
}

static void s_host_free(ls_backend_t *self, void *p) {
    free(p);
}

static ls_event_t *s_event_new(ls_backend_t *self) {
    return calloc(1, sizeof(ls_event_t));
}

static void s_event_free(ls_backend_t *self, ls_event_t *ev) {
    free(ev);
}

static int s_buffer_upload_async(ls_backend_t *self, ls_view_t dst, size_t dst_stride,
                                 size_t dst_chunk, const ls_host_span_t *src, int nspan, size_t w,
                                 size_t chunks, size_t rows, ls_event_t *ev) {
    assert(rows == 0 || dst.off + (rows - 1) * dst_stride + chunks * dst_chunk <= dst.buf->n);
    size_t bytes = rows * chunks * w * sizeof(float);
    const void *image = nspan > 0 ? src[0].p : NULL;
    void *joined = NULL;
    if (w && nspan > 1) {  // the reference reads one packed array
        if (!(joined = malloc(bytes)))
            return -1;
        size_t at = 0;
        for (int i = 0; i < nspan && at < bytes; i++) {
            size_t n = src[i].bytes < bytes - at ? src[i].bytes : bytes - at;
            memcpy((char *)joined + at, src[i].p, n);
            at += n;
        }
        image = joined;
    }
    ls_pad_copy(s_f32(dst), image, sizeof(float), w, chunks, rows, dst_chunk, dst_stride);
    free(joined);
    return 0;
}

static void s_event_wait(ls_backend_t *self, ls_event_t *ev) {
}

static int s_event_sync(ls_backend_t *self, ls_event_t *ev) {
    return 0;
}

static int s_step_begin(ls_backend_t *self, const ls_step_t *step) {
    s_cpu_t *c = s_cpu(self);
    const ls_attn_meta_t *a = &step->attn;
    assert(a->n_tokens == step->n_tokens);
    size_t T = (size_t)step->n_tokens, S = (size_t)a->n_seqs, i32 = sizeof(int32_t);
    int failed = 0;
    c->step = *step;
    ls_attn_meta_t *ca = &c->step.attn;
    c->step.token_ids = s_array_copy(&c->token_ids, step->token_ids, T * i32, &failed);
    ca->positions = s_array_copy(&c->positions, a->positions, T * i32, &failed);
    ca->slot_mapping = s_array_copy(&c->slot_mapping, a->slot_mapping, T * i32, &failed);
    ca->q_indptr = s_array_copy(&c->q_indptr, a->q_indptr, (S + 1) * i32, &failed);
    ca->ctx_lens = s_array_copy(&c->ctx_lens, a->ctx_lens, S * i32, &failed);
    ca->block_tables = s_array_copy(&c->block_tables, a->block_tables,
                                    S * (size_t)a->max_blocks * i32, &failed);
    c->step.logit_rows = s_array_copy(&c->logit_rows, step->logit_rows,
                                      (size_t)step->n_logit_rows * i32, &failed);
    assert(step->n_lora_passes >= 0 && step->n_lora_passes <= LS_LORA_MIX_MAX);
    assert(step->n_lora_batches >= step->n_lora_passes &&
           step->n_lora_batches <= LS_LORA_BATCH_MAX);
    assert((step->lora != NULL) == (step->n_lora_passes > 0));
    size_t PR = (size_t)step->n_lora_passes * step->n_logit_rows;
    c->step.logit_slots = s_array_copy(&c->logit_slots, step->logit_slots, PR * i32, &failed);
    c->step.logit_scales = s_array_copy(&c->logit_scales, step->logit_scales,
                                        PR * sizeof(float), &failed);
    c->step.token_rows = s_array_copy(&c->token_rows, step->token_rows, T * i32, &failed);
    c->step.head_tiles = s_array_copy(&c->head_tiles, step->head_tiles,
                                      3 * (size_t)step->n_head_tiles * i32, &failed);
    for (int k = 0; k < step->n_lora_batches; k++) {
        const ls_lora_batch_t *l = &step->lora[k];
        size_t G = (size_t)l->n_segs, W = (size_t)l->n_slots, f32 = sizeof(float);
        s_array_t *arr = c->lora_arrays[k];
        ls_lora_batch_t *cl = &c->lora[k];
        *cl = *l;
        cl->seg_indptr = s_array_copy(&arr[S_SEG_INDPTR], l->seg_indptr, (G + 1) * i32, &failed);
        cl->weight_indices = s_array_copy(&arr[S_WEIGHT_INDICES], l->weight_indices, G * i32,
                                          &failed);
        cl->permutation = s_array_copy(&arr[S_PERMUTATION], l->permutation,
                                       (size_t)l->seg_indptr[G] * i32, &failed);
        cl->lora_ranks = s_array_copy(&arr[S_LORA_RANKS], l->lora_ranks, W * i32, &failed);
        cl->scalings = s_array_copy(&arr[S_SCALINGS], l->scalings, W * f32, &failed);
        cl->seg_weights = s_array_copy(&arr[S_SEG_WEIGHTS], l->seg_weights, G * f32, &failed);
    }
    c->step.lora = step->n_lora_passes ? c->lora : NULL;
    return failed ? -1 : 0;
}

static void s_embedding(ls_backend_t *self, ls_view_t out, ls_view_t table, int C,
                        int vocab0, int vocab) {
    const ls_step_t *st = &s_cpu(self)->step;
    ls_embedding_forward(s_f32(out), s_f32(table), st->token_ids, st->n_tokens, C, vocab0,
                         vocab);
}

static void s_matmul(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t w,
                     ls_view_t bias, int T, int in, int out, int accumulate) {
    ls_matmul_forward(s_f32(y), s_f32(x), s_f32(w), s_f32_opt(bias), T, in, out,
                      accumulate);
}

static void s_matmul_fp8(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t xq,
                         ls_view_t x_scale, ls_view_t w, ls_view_t w_scale, ls_view_t bias,
                         int T, int in, int out) {
    ls_matmul_fp8_forward(s_f32(y), s_f32(xq), s_f32(x_scale), s_f32_opt(x), s_f32(w),
                          s_f32(w_scale), s_f32_opt(bias), T, in, out);
}

// out_lp: every buffer here stores f32, so the low-precision copy is an exact copy, and an
// F8E4M3 one out's rows quantized (their E4M3 values in fp32) with their scales in out_scale
static void s_copy_lp(ls_view_t out_lp, ls_view_t out_scale, ls_view_t out, int rows,
                      int cols) {
    if (!out_lp.buf)
        return;
    assert((out_lp.buf->dtype == LS_DTYPE_F8E4M3) == (out_scale.buf != NULL));
    if (out_scale.buf)
        ls_fp8_quantize_rows_f32(s_f32(out_lp), s_f32(out_scale), s_f32(out), rows, cols);
    else
        memcpy(s_f32(out_lp), s_f32(out), (size_t)rows * cols * sizeof(float));
}

static void s_rmsnorm(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t out_scale,
                      ls_view_t residual, ls_view_t x, ls_view_t x2, ls_view_t w, int T, int C,
                      float eps) {
    if (!out.buf) // the copy alone: an f32 buffer here, written as out would be
        out = out_lp, out_lp = LS_VIEW_NONE;
    ls_rmsnorm_forward(s_f32(out), s_f32_opt(residual), s_f32(x), s_f32_opt(x2), s_f32(w), T,
                       C, eps);
    s_copy_lp(out_lp, out_scale, out, T, C);
}

static void s_rmsnorm_heads(ls_backend_t *self, ls_view_t x, ls_view_t w, int T,
                            int n_heads, int head_dim, int row_stride, float eps) {
    ls_rmsnorm_heads_forward(s_f32(x), s_f32(w), T, n_heads, head_dim, row_stride, eps);
}

static void s_silu_mul(ls_backend_t *self, ls_view_t out, ls_view_t out_lp, ls_view_t out_scale,
                       ls_view_t gate_up, ls_view_t delta, int T, int inter) {
    if (!out.buf) // as s_rmsnorm's
        out = out_lp, out_lp = LS_VIEW_NONE;
    ls_silu_mul_forward(s_f32(out), s_f32(gate_up), s_f32_opt(delta), T, inter);
    s_copy_lp(out_lp, out_scale, out, T, inter);
}

static void s_add(ls_backend_t *self, ls_view_t y, ls_view_t x, size_t n) {
    ls_add_forward(s_f32(y), s_f32(x), n);
}

static void s_rope_kv_store(ls_backend_t *self, ls_view_t x, ls_view_t x2, ls_view_t inv_freq,
                            ls_view_t k_cache, ls_view_t v_cache, int n_heads, int n_kv_heads,
                            int head_dim, int row_stride, int block_size, size_t block_stride) {
    const ls_step_t *st = &s_cpu(self)->step;
    float *xp = s_f32(x), *dp = s_f32_opt(x2);
    size_t ko = (size_t)n_heads * head_dim, vo = ko + (size_t)n_kv_heads * head_dim;
    // q's heads and k's lie side by side in a row (and x2's), so one pass rotates both
    ls_rope_forward(xp, dp, st->attn.positions, s_f32(inv_freq), st->n_tokens,
                    n_heads + n_kv_heads, head_dim, row_stride);
    ls_kv_cache_store(s_f32(k_cache), s_f32(v_cache), xp + ko, xp + vo, dp ? dp + vo : NULL,
                      st->attn.slot_mapping, st->n_tokens, n_kv_heads, head_dim, row_stride,
                      block_size, block_stride);
}

static void s_attention(ls_backend_t *self, ls_view_t out, ls_view_t q, ls_view_t k_cache,
                        ls_view_t v_cache, int n_heads, int n_kv_heads, int head_dim,
                        int block_size, int row_stride, size_t block_stride) {
    ls_attention_forward(s_f32(out), s_f32(q), s_f32(k_cache), s_f32(v_cache),
                         &s_cpu(self)->step.attn, n_heads, n_kv_heads, head_dim,
                         block_size, row_stride, block_stride);
}

// The step's LoRA batch `batch`, which a LoRA op of n_slices slices runs over.
static const ls_lora_batch_t *s_batch(ls_backend_t *self, int batch, int n_slices) {
    const ls_step_t *st = &s_cpu(self)->step;
    assert(batch >= 0 && batch < st->n_lora_batches && n_slices <= LS_LORA_MAX_SLICES);
    return &st->lora[batch];
}

// A LoRA matrix as the references read it: the table's entries are host pointers here.
static ls_lora_pages_t s_pages(ls_lora_mat_t m) {
    return (ls_lora_pages_t){(const void *const *)(void *)s_f32(m.tab), m.stride, m.np, m.piece};
}

static void s_lora_shrink(ls_backend_t *self, ls_view_t tmp, ls_view_t x, ls_lora_mat_t a,
                          int in, int n_slices, int r_max, int batch) {
    ls_lora_shrink(s_f32(tmp), s_f32(x), s_pages(a), s_batch(self, batch, n_slices), in,
                   n_slices, r_max);
}

static void s_lora_expand(ls_backend_t *self, ls_view_t y, ls_view_t tmp, ls_lora_mat_t b,
                          const int32_t *slice_offsets, int n_slices, int r_max, int batch) {
    ls_lora_expand(s_f32(y), s_f32(tmp), s_pages(b), s_batch(self, batch, n_slices),
                   slice_offsets, n_slices, r_max);
}

static void s_lora_fused(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t tmp,
                         ls_lora_mat_t a, ls_lora_mat_t b, const int32_t *slice_offsets,
                         int in, int n_slices, int r_max, int accumulate, int batch) {
    const ls_lora_batch_t *l = s_batch(self, batch, n_slices);
    if (!accumulate)
        memset(s_f32(y), 0, sizeof(float) * (size_t)s_cpu(self)->step.n_tokens *
                                slice_offsets[n_slices]);
    ls_lora_fused(s_f32(y), s_f32(tmp), s_f32(x), s_pages(a), s_pages(b), l,
                  slice_offsets, in, n_slices, r_max);
}

static void s_lora_embed_shrink(ls_backend_t *self, ls_view_t tmp, ls_lora_mat_t a, int vocab,
                                int r_max, int batch) {
    ls_lora_embed_shrink(s_f32(tmp), s_cpu(self)->step.token_ids, s_pages(a),
                         s_batch(self, batch, 1), vocab, r_max);
}

static void s_lora_rows(ls_backend_t *self, ls_view_t y, ls_view_t x, ls_view_t tmp,
                        ls_lora_mat_t a, ls_lora_mat_t b, int in, int out, int r_max, int pass) {
    const ls_step_t *st = &s_cpu(self)->step;
    assert(pass < st->n_lora_passes);
    const ls_lora_batch_t *l = s_batch(self, pass, 1);
    assert(st->logit_slots && st->logit_scales);
    size_t at = (size_t)pass * st->n_logit_rows;
    ls_lora_rows(s_f32(y), s_f32(tmp), s_f32(x), s_pages(a), s_pages(b),
                 st->logit_slots + at, st->logit_scales + at, l->lora_ranks, st->n_logit_rows,
                 in, out, r_max);
}

// The side queue (backend.h): the CPU runs every op when it is called, which already puts
// side ops after what came before them and before what waits for them — so the hooks have
// nothing to do. They exist so that the CPU runs the forward the GPU runs (decode LoRA as
// a delta folded into the next op) and every CI run tests that path, TP included.
static void s_side_noop(ls_backend_t *self) {
    (void)self;
}

static void s_rows_gather(ls_backend_t *self, ls_view_t out, ls_view_t x, int C) {
    const ls_step_t *st = &s_cpu(self)->step;
    ls_rows_gather(s_f32(out), s_f32(x), st->logit_rows, st->n_logit_rows, C);
}

static void s_token_rows(ls_backend_t *self, ls_view_t x, ls_view_t rows, int C) {
    const ls_step_t *st = &s_cpu(self)->step;
    assert(st->token_rows);
    ls_token_rows_forward(s_f32(x), s_f32(rows), st->token_rows, st->n_tokens, C);
}

static void s_token_logits(ls_backend_t *self, ls_view_t logits, ls_view_t x, ls_view_t rows,
                           ls_view_t ids, int C, int V) {
    const ls_step_t *st = &s_cpu(self)->step;
    ls_token_logits_forward(s_f32(logits), s_f32(x), s_f32(rows), s_f32(ids), st->head_tiles,
                            st->n_head_tiles, C, V);
}

static void s_logits_widen(ls_backend_t *self, ls_view_t wide, ls_view_t head, int V, int W) {
    ls_logits_widen_forward(s_f32(wide), s_f32(head), s_cpu(self)->step.n_logit_rows, V, W);
}

static int s_sample(ls_backend_t *self, ls_view_t logits, int V,
                    const ls_sampling_batch_t *batch, int32_t *tokens, float *logprobs,
                    int32_t *top_ids, float *top_logprobs) {
    return ls_sampling_sample(tokens, logprobs, top_ids, top_logprobs, s_f32(logits), batch,
                              V);
}

ls_backend_t *ls_backend_cpu_new(int n_threads) {
    ls_backend_t *self = calloc(1, sizeof *self);
    s_cpu_t *c = calloc(1, sizeof *c);
    if (!self || !c) {
        free(self);
        free(c);
        return NULL;
    }
    if (n_threads > 0)
        openblas_set_num_threads(n_threads); // process-wide: OpenBLAS has one pool
    *self = (ls_backend_t){
        .name = "cpu",
        .ctx = c,
        .free = s_free,
        .buffer_new = s_buffer_new,
        .buffer_free = s_buffer_free,
        .buffer_upload = s_buffer_upload,
        .buffer_download = s_buffer_download,
        .buffer_zero = s_buffer_zero,
        .synchronize = s_synchronize,
        .host_alloc = s_host_alloc,
        .host_free = s_host_free,
        .event_new = s_event_new,
        .event_free = s_event_free,
        .buffer_upload_async = s_buffer_upload_async,
        .event_wait = s_event_wait,
        .event_sync = s_event_sync,
        .step_begin = s_step_begin,
        .embedding = s_embedding,
        .matmul = s_matmul,
        .matmul_fp8 = s_matmul_fp8,
        .rmsnorm = s_rmsnorm,
        .rmsnorm_heads = s_rmsnorm_heads,
        .silu_mul = s_silu_mul,
        .add = s_add,
        .rope_kv_store = s_rope_kv_store,
        .attention = s_attention,
        .lora_shrink = s_lora_shrink,
        .lora_expand = s_lora_expand,
        .lora_fused = s_lora_fused,
        .lora_embed_shrink = s_lora_embed_shrink,
        .lora_rows = s_lora_rows,
        .rows_gather = s_rows_gather,
        .token_rows = s_token_rows,
        .token_logits = s_token_logits,
        .logits_widen = s_logits_widen,
        .sample = s_sample,
        .side_begin = s_side_noop,
        .side_end = s_side_noop,
        .side_wait = s_side_noop,
    };
    return self;
}
