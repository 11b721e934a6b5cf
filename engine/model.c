/*  engine/model.c — see model.h.

    Weights are kept per "place": the globals (embedding, final norm, lm_head) and, per
    layer, one buffer per stacked weight. s_place says where every checkpoint tensor goes
    (which buffer, at which element offset); the buffer sizes are the sums of what goes into
    them, so the stacking order lives in one switch.

    The residual stream follows HF in fp32: x holds the residual, each sub-layer's output y
    is added into it by the fused rmsnorm (residual += y; h = rmsnorm(residual)) that also
    produces the next sub-layer's input.

    Tensor parallelism (model.h): the sizes below (q_dim, kv_dim, I, heads) are the rank's
    own, so s_place stacks the rank's slices exactly as it stacks whole tensors, and s_window
    says which slice of each checkpoint tensor a rank reads. Every rank keeps the whole
    residual stream; the row-parallel outputs (o, down) and the embedding are partial sums
    until the all-reduce that follows them.
*/
#include "model.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"
#include "ls_par.h"

// Where checkpoint tensors go: the global places, then the places of every layer.
typedef enum {
    S_EMBED = 0,
    S_FINAL_NORM,
    S_LM_HEAD,
    S_GLOBAL_COUNT,
} s_global_t;

typedef enum {
    S_ATTN_NORM = 0,
    S_QKV,        // (q_dim + 2*kv_dim, hidden)
    S_QKV_BIAS,   // (q_dim + 2*kv_dim)
    S_Q_NORM,     // (head_dim)
    S_K_NORM,     // (head_dim)
    S_O,          // (hidden, q_dim)
    S_O_BIAS,     // (hidden)
    S_MLP_NORM,   // (hidden)
    S_GATE_UP,    // (2*inter, hidden)
    S_GATE_UP_BIAS,
    S_DOWN,       // (hidden, inter)
    S_DOWN_BIAS,
    // FP8: the per-row scales of the four projections, (rows of the weight) each
    S_QKV_SCALE,
    S_O_SCALE,
    S_GATE_UP_SCALE,
    S_DOWN_SCALE,
    S_LAYER_COUNT,
} s_layer_place_t;

// Activation workspace, rows of the step (T) or logit rows (R).
typedef enum {
    S_WS_X = 0,   // (T, hidden) residual stream
    S_WS_H,       // (T, hidden) normed input of a sub-layer
    S_WS_Y,       // (T, hidden) output of a sub-layer
    S_WS_QKV,     // (T, qkv_dim)
    S_WS_ATTN,    // (T, q_dim)
    S_WS_GATE_UP, // (T, 2*inter)
    S_WS_ACT,     // (T, inter)
    S_WS_LORA,    // (T, LS_LORA_MAX_SLICES*r_max); decode: LS_LORA_FUSED_PARTS of those
    S_WS_DELTA,   // (T, max(qkv_dim, 2*inter, hidden)) a LoRA delta made beside its GEMM
    S_WS_LP,      // (T, max(hidden, inter)) in the weights' dtype: the next matmul's input
    S_WS_XQ,      // (T, max(hidden, q_dim, inter)) E4M3: an FP8 matmul's quantized input
    S_WS_XS,      // (T) its per-token scales
    S_WS_LAST,    // (R, hidden)
    S_WS_LOGITS,  // (R, W) the whole rows (rank 0): vocab, then the added columns
    S_WS_HEAD,    // (R, vocab) lm_head's rows before the added columns (rank 0, W > vocab)
    S_WS_PART,    // (R, vocab_pad) the rank's vocabulary slice of them (tensor parallel)
    S_WS_FLAG,    // (1) step agreement across the ranks
    S_WS_COUNT,
} s_ws_t;

struct ls_model {
    ls_backend_t *be;
    ls_model_config_t cfg;
    ls_comm_t *comm;                     // NULL: one rank holds everything
    ls_tp_shard_t shard;
    int *vocab_off;                      // (size+1) each rank's first vocabulary row
    // the rank's sizes: heads, intermediate, projection widths; H and V are whole
    int H, I, V, n_heads, n_kv_heads, q_dim, kv_dim, qkv_dim;
    int vocab_pad;                       // rows of the rank's embedding and lm_head buffers
    ls_buffer_t *global[S_GLOBAL_COUNT]; // lm_head NULL when tied
    ls_buffer_t **layer;                 // (num_hidden_layers, S_LAYER_COUNT), NULL: absent
    ls_buffer_t *inv_freq;               // (head_dim/2)
    size_t weight_bytes;
    ls_dtype_t weight_dtype;             // of the stacked projections (qkv) as stored; FP8:
                                         // torch_dtype (the KV cache's, the adapters')
    bool fp8;                            // the projections are E4M3 + scales (S_*_SCALE)
    ls_buffer_t *ws[S_WS_COUNT];
    int32_t *meta;                       // host arena for the step metadata
    size_t meta_cap;                     // int32 elements
    float *meta_w;                       // and for its LoRA segments' weights
    size_t meta_w_cap;                   // float elements
    int n_rows;                          // logit rows of the last step
    int W;                               // and their width: V, or V + the pool's added
                                         // columns (lora_tokens.h)
    // of the step being issued, set once by s_forward_prepare (the ops may be issued more
    // than once a step: step graphs)
    bool lora_decode; // it has LoRA and is decode-shaped (s_lora_decode_shaped)
    bool lora_beside; // and its LoRA goes beside the base GEMMs (s_proj)
    // the batch (ls_step_t.lora) that pass k of group g's ops runs over, -1: no work
    // (s_group_batches)
    int lora_batch[LS_LORA_MIX_MAX][LS_LORA_GROUP_COUNT];
};

// The pool of pages (docs/memory.md): page p holds block p of every layer's K and V, in the
// order K_0, V_0, K_1, V_1, ...; layer l's K is the blocks at 2l * block_n, block_stride apart.
struct ls_kv_cache {
    ls_backend_t *be;
    int n_layers, num_blocks, block_size;
    ls_dtype_t dtype;
    size_t block_n;        // elements of one layer's K (or V) block: block_size * kv_dim
    ls_buffer_t *pages;    // (num_blocks, n_layers, 2, block_size, n_kv_heads, head_dim)
};

// The buffer and element offset of a checkpoint tensor of the given role. Stacked parts
// follow one another in the order q, k, v and gate, up, as the LoRA slices expect.
static ls_buffer_t **s_place(ls_model_t *self, ls_weight_role_t role, int layer,
                             size_t *off) {
    size_t H = (size_t)self->H, q = (size_t)self->q_dim, kv = (size_t)self->kv_dim,
           I = (size_t)self->I;
    ls_buffer_t **lw = layer >= 0 ? self->layer + (size_t)layer * S_LAYER_COUNT : NULL;
    *off = 0;
    switch (role) {
    case LS_W_EMBED: return &self->global[S_EMBED];
    case LS_W_FINAL_NORM: return &self->global[S_FINAL_NORM];
    case LS_W_LM_HEAD: return &self->global[S_LM_HEAD];
    case LS_W_ATTN_NORM: return &lw[S_ATTN_NORM];
    case LS_W_Q: return &lw[S_QKV];
    case LS_W_K: *off = q * H; return &lw[S_QKV];
    case LS_W_V: *off = (q + kv) * H; return &lw[S_QKV];
    case LS_W_Q_BIAS: return &lw[S_QKV_BIAS];
    case LS_W_K_BIAS: *off = q; return &lw[S_QKV_BIAS];
    case LS_W_V_BIAS: *off = q + kv; return &lw[S_QKV_BIAS];
    case LS_W_O: return &lw[S_O];
    case LS_W_O_BIAS: return &lw[S_O_BIAS];
    case LS_W_Q_NORM: return &lw[S_Q_NORM];
    case LS_W_K_NORM: return &lw[S_K_NORM];
    case LS_W_MLP_NORM: return &lw[S_MLP_NORM];
    case LS_W_GATE: return &lw[S_GATE_UP];
    case LS_W_UP: *off = I * H; return &lw[S_GATE_UP];
    case LS_W_DOWN: return &lw[S_DOWN];
    case LS_W_GATE_BIAS: return &lw[S_GATE_UP_BIAS];
    case LS_W_UP_BIAS: *off = I; return &lw[S_GATE_UP_BIAS];
    case LS_W_DOWN_BIAS: return &lw[S_DOWN_BIAS];
    case LS_W_ROLE_COUNT: break;
    }
    assert(!"unknown weight role");
    return NULL;
}

// Upload in chunks of this many bytes: bounded staging memory, and progress that moves.
#define S_CHUNK_BYTES ((size_t)16 << 20)

typedef struct {
    ls_model_progress_fn *fn;
    void *arg;
    size_t done, total;
    void *stage; // S_CHUNK_BYTES, for tensors whose data is not aligned to their dtype
} s_progress_t;

// The part of a checkpoint tensor a rank holds: rows [r0, r0 + nr) and columns
// [c0, c0 + nc) of the tensor seen as (rows, ld); a 1-D tensor is one row.
typedef struct {
    size_t r0, nr, c0, nc, ld;
} s_window_t;

static size_t s_window_numel(const s_window_t *w) {
    return w->nr * w->nc;
}

// The window of spec for the model's shard (model_config.h): projections as
// ls_tp_target_window says, their biases along their output, the vocabulary rows of the
// embedding and lm_head; row-parallel biases (o, down) on rank 0 only, so that the
// all-reduce adds them once; norms whole.
static s_window_t s_window(const ls_model_t *self, const ls_weight_spec_t *spec) {
    const ls_tp_shard_t *s = &self->shard;
    size_t rows = spec->ndim > 1 ? (size_t)spec->shape[0] : 1;
    size_t ld = (size_t)spec->shape[spec->ndim > 1 ? 1 : 0];
    s_window_t w = {0, rows, 0, ld, ld};
    static const ls_target_t targets[LS_W_ROLE_COUNT] = {
        [LS_W_Q] = LS_TARGET_Q,        [LS_W_K] = LS_TARGET_K,
        [LS_W_V] = LS_TARGET_V,        [LS_W_O] = LS_TARGET_O,
        [LS_W_GATE] = LS_TARGET_GATE,  [LS_W_UP] = LS_TARGET_UP,
        [LS_W_DOWN] = LS_TARGET_DOWN,  [LS_W_Q_BIAS] = LS_TARGET_Q,
        [LS_W_K_BIAS] = LS_TARGET_K,   [LS_W_V_BIAS] = LS_TARGET_V,
        [LS_W_GATE_BIAS] = LS_TARGET_GATE, [LS_W_UP_BIAS] = LS_TARGET_UP,
    };
    int out0, n_out, in0, n_in;
    switch (spec->role) {
    case LS_W_EMBED:
    case LS_W_LM_HEAD:
        w.r0 = (size_t)s->vocab0;
        w.nr = (size_t)s->vocab;
        break;
    case LS_W_Q: case LS_W_K: case LS_W_V: case LS_W_O:
    case LS_W_GATE: case LS_W_UP: case LS_W_DOWN:
        ls_tp_target_window(&self->cfg, s, targets[spec->role], &out0, &n_out, &in0, &n_in);
        w = (s_window_t){(size_t)out0, (size_t)n_out, (size_t)in0, (size_t)n_in, ld};
        break;
    case LS_W_Q_BIAS: case LS_W_K_BIAS: case LS_W_V_BIAS:
    case LS_W_GATE_BIAS: case LS_W_UP_BIAS:
        ls_tp_target_window(&self->cfg, s, targets[spec->role], &out0, &n_out, &in0, &n_in);
        w.c0 = (size_t)out0;
        w.nc = (size_t)n_out;
        break;
    case LS_W_O_BIAS:
    case LS_W_DOWN_BIAS:
        w.nr = s->rank == 0;
        break;
    default:
        break;
    }
    return w;
}

// Uploads window w of tensor t into dst chunk by chunk, reading the mapped file in place:
// whole rows are one contiguous run; a column window (row-parallel weights) is packed row
// by row into the staging block first. safetensors does not align tensor data, so a
// misaligned run also goes through the staging block.
static int s_upload_tensor(ls_backend_t *be, ls_view_t dst, const ls_st_tensor_t *t,
                           const s_window_t *w, s_progress_t *p) {
    size_t esz = ls_dtype_size(t->dtype), per_chunk = S_CHUNK_BYTES / esz;
    const char *base = (const char *)t->data + (w->r0 * w->ld + w->c0) * esz;
    if (w->nc == w->ld) { // whole rows: one run of nr * ld elements
        bool aligned = (uintptr_t)base % esz == 0;
        size_t numel = s_window_numel(w);
        for (size_t i = 0; i < numel; i += per_chunk) {
            size_t n = numel - i < per_chunk ? numel - i : per_chunk;
            const char *src = base + i * esz;
            if (!aligned)
                src = memcpy(p->stage, src, n * esz);
            if (be->buffer_upload(be, ls_view(dst.buf, dst.off + i), src, t->dtype, n) != 0)
                return -1;
            p->done += n * esz;
            if (p->fn)
                p->fn(p->arg, t->name, p->done, p->total);
        }
        return 0;
    }
    size_t rows_per = per_chunk / w->nc ? per_chunk / w->nc : 1;
    assert(w->nc <= per_chunk);
    for (size_t r = 0; r < w->nr; r += rows_per) {
        size_t m = w->nr - r < rows_per ? w->nr - r : rows_per;
        for (size_t i = 0; i < m; i++)
            memcpy((char *)p->stage + i * w->nc * esz, base + (r + i) * w->ld * esz, w->nc * esz);
        if (be->buffer_upload(be, ls_view(dst.buf, dst.off + r * w->nc), p->stage, t->dtype,
                              m * w->nc) != 0)
            return -1;
        p->done += m * w->nc * esz;
        if (p->fn)
            p->fn(p->arg, t->name, p->done, p->total);
    }
    return 0;
}

// Elements spec adds to its place: its window, except that the vocabulary tables take
// vocab_pad rows whatever the rank's share (zero past it), so every rank's logits slice
// has the same stride for the gather.
static size_t s_place_numel(const ls_model_t *self, const ls_weight_spec_t *spec,
                            const s_window_t *w) {
    if (spec->role == LS_W_EMBED || spec->role == LS_W_LM_HEAD)
        return (size_t)self->vocab_pad * w->nc;
    return s_window_numel(w);
}

// Zeroes the padding rows of the vocabulary tables (a rank whose share is below vocab_pad).
static void s_zero_vocab_pad(ls_model_t *self) {
    size_t used = (size_t)self->shard.vocab * self->H, all = (size_t)self->vocab_pad * self->H;
    for (int g = S_EMBED; g <= S_LM_HEAD; g += S_LM_HEAD - S_EMBED)
        if (self->global[g] && all > used)
            self->be->buffer_zero(self->be, ls_view(self->global[g], used), all - used);
}

static void s_rope_config(const ls_model_config_t *cfg, ls_rope_config_t *rc) {
    static const ls_rope_type_t types[] = {
        [LS_ROPE_SCALING_NONE] = LS_ROPE_DEFAULT,
        [LS_ROPE_SCALING_LINEAR] = LS_ROPE_LINEAR,
        [LS_ROPE_SCALING_LLAMA3] = LS_ROPE_LLAMA3,
    };
    *rc = (ls_rope_config_t){
        .type = types[cfg->rope_scaling.type],
        .theta = cfg->rope_theta,
        .factor = cfg->rope_scaling.factor,
        .low_freq_factor = cfg->rope_scaling.low_freq_factor,
        .high_freq_factor = cfg->rope_scaling.high_freq_factor,
        .original_max_position = cfg->rope_scaling.original_max_position_embeddings,
    };
}

// --- FP8 -----------------------------------------------------------------------------------

// The projections an FP8 model holds as E4M3 with per-row scales (kernels/ops.h).
static bool s_role_fp8(ls_weight_role_t role) {
    switch (role) {
    case LS_W_Q: case LS_W_K: case LS_W_V: case LS_W_O:
    case LS_W_GATE: case LS_W_UP: case LS_W_DOWN:
        return true;
    default:
        return false;
    }
}

// The scale place of the projection place `place` of layer `layer`.
static ls_buffer_t **s_scale_place(ls_model_t *self, ls_buffer_t **place, int layer) {
    ls_buffer_t **lw = self->layer + (size_t)layer * S_LAYER_COUNT;
    switch (place - lw) {
    case S_QKV: return &lw[S_QKV_SCALE];
    case S_O: return &lw[S_O_SCALE];
    case S_GATE_UP: return &lw[S_GATE_UP_SCALE];
    case S_DOWN: return &lw[S_DOWN_SCALE];
    }
    assert(!"not a projection place");
    return NULL;
}

// The FP8 GEMM reads rows of 16-byte multiples (cuBLASLt's FP8 alignment), so every
// projection's input width and output height on this rank must be a multiple of 16.
static int s_fp8_check(const ls_model_t *self, const char *what, char *err, size_t errlen) {
    const int dims[] = {self->H, self->q_dim, self->kv_dim, self->I};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] % 16) {
            ls_err_set(err, errlen, "%s: FP8 weights need hidden_size, the attention widths "
                       "and intermediate_size (a tensor-parallel rank's share of them) to be "
                       "multiples of 16; here they are %d, %d, %d and %d", what, self->H,
                       self->q_dim, self->kv_dim, self->I);
            return -1;
        }
    return 0;
}

// Where a projection's values come from: an E4M3 tensor and its scales (one, one per row,
// or one per block of the checkpoint's weight_block_size), or a bf16/f16/f32 tensor that is
// quantized here, row by row (scales NULL).
typedef enum { S_PER_TENSOR, S_PER_ROW, S_PER_BLOCK } s_scale_kind_t;

typedef struct {
    const ls_st_tensor_t *t;
    float *scales;        // NULL: quantize at load
    s_scale_kind_t kind;
    size_t bn, bk, nbk;   // S_PER_BLOCK: block rows and columns, blocks per row
} s_fp8_src_t;

// Finds and checks spec's scales when t is E4M3. -1 + err for an E4M3 tensor without a
// quantization_config, without scales, or with scales of the wrong shape or values.
static int s_fp8_src(const ls_model_t *self, const ls_st_t *st, const ls_weight_spec_t *spec,
                     const ls_st_tensor_t *t, s_fp8_src_t *src, char *err, size_t errlen) {
    *src = (s_fp8_src_t){.t = t};
    if (t->dtype != LS_DTYPE_F8E4M3)
        return 0;
    if (self->cfg.quant != LS_QUANT_FP8) {
        ls_err_set(err, errlen, "%s: tensor \"%s\" is F8_E4M3 but config.json has no FP8 "
                   "\"quantization_config\"", t->file, t->name);
        return -1;
    }
    char name[sizeof spec->name + 16];
    snprintf(name, sizeof name, "%s_scale", spec->name);
    const ls_st_tensor_t *sc = ls_st_find(st, name);
    if (!sc) {
        snprintf(name, sizeof name, "%s_scale_inv", spec->name);
        sc = ls_st_find(st, name);
    }
    if (!sc) {
        ls_err_set(err, errlen, "%s: tensor \"%s\" is F8_E4M3 but neither \"%s_scale\" nor "
                   "\"%s_scale_inv\" is in the checkpoint", t->file, t->name, spec->name,
                   spec->name);
        return -1;
    }
    size_t rows = (size_t)spec->shape[0], cols = (size_t)spec->shape[1];
    const int *blk = self->cfg.quant_block;
    src->bn = (size_t)blk[0];
    src->bk = (size_t)blk[1];
    src->nbk = blk[1] ? (cols + src->bk - 1) / src->bk : 0;
    bool row_shape = (sc->ndim == 1 && (size_t)sc->shape[0] == rows) ||
                     (sc->ndim == 2 && (size_t)sc->shape[0] == rows && sc->shape[1] == 1);
    if (sc->numel == 1)
        src->kind = S_PER_TENSOR;
    else if (row_shape)
        src->kind = S_PER_ROW;
    else if (blk[0] && sc->ndim == 2 && (size_t)sc->shape[0] == (rows + src->bn - 1) / src->bn &&
             (size_t)sc->shape[1] == src->nbk)
        src->kind = S_PER_BLOCK;
    else {
        ls_err_set(err, errlen, "%s: tensor \"%s\": %zu scales fit neither one per tensor, nor "
                   "one per row (%zu)%s", sc->file, sc->name, sc->numel, rows,
                   blk[0] ? ", nor one per block of weight_block_size" : "");
        return -1;
    }
    if (!(src->scales = malloc(sc->numel * sizeof(float)))) {
        ls_err_set(err, errlen, "%s: out of memory", sc->file);
        return -1;
    }
    bool ok = ls_st_tensor_to_f32(sc, src->scales) == 0;
    for (size_t i = 0; ok && i < sc->numel; i++)
        ok = src->scales[i] >= 0.0f;
    if (!ok) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": a scale is negative, NaN or infinite",
                   sc->file, sc->name);
        free(src->scales);
        src->scales = NULL;
        return -1;
    }
    return 0;
}

// Row r of the tensor (cols values) in fp32: as stored, or E4M3 times its block's scale.
// -1 when a value is not finite.
static int s_fp8_row_f32(const s_fp8_src_t *src, size_t r, size_t cols, float *row) {
    const ls_st_tensor_t *t = src->t;
    const uint8_t *b = (const uint8_t *)t->data + r * cols * ls_dtype_size(t->dtype);
    for (size_t c = 0; c < cols; c++) {
        uint16_t h;
        switch (t->dtype) {
        case LS_DTYPE_F32: memcpy(&row[c], b + 4 * c, 4); break;
        case LS_DTYPE_BF16: memcpy(&h, b + 2 * c, 2); row[c] = ls_bf16_to_f32(h); break;
        case LS_DTYPE_F16: memcpy(&h, b + 2 * c, 2); row[c] = ls_f16_to_f32(h); break;
        case LS_DTYPE_F8E4M3:
            row[c] = ls_e4m3_to_f32(b[c]) * src->scales[(r / src->bn) * src->nbk + c / src->bk];
            break;
        }
        if (!isfinite(row[c]))
            return -1;
    }
    return 0;
}

// One chunk of rows of an FP8 upload, shared by the threads of ls_par_for.
typedef struct {
    const s_fp8_src_t *src;
    const s_window_t *w;
    size_t r;           // first row of the chunk, in the window
    uint8_t *codes;     // (rows of the chunk, w->nc)
    float *scales;      // (w->nr) the window's row scales
    int failed;         // 1: a value not finite, 2: out of memory (any thread; atomic)
} s_fp8_chunk_t;

// Row i of the chunk: codes and scale of the window's columns. Quantized rows are
// quantized whole, so a tensor-parallel rank's columns of a row-parallel weight keep the
// row's one scale and every rank holds exactly the single-GPU model's values.
static void s_fp8_chunk_row(void *arg, size_t i) {
    s_fp8_chunk_t *ch = arg;
    const s_fp8_src_t *src = ch->src;
    const s_window_t *w = ch->w;
    size_t wr = ch->r + i, r = w->r0 + wr;
    uint8_t *dst = ch->codes + i * w->nc;
    if (src->scales && src->kind != S_PER_BLOCK) { // as stored
        memcpy(dst, (const uint8_t *)src->t->data + r * w->ld + w->c0, w->nc);
        ch->scales[wr] = src->scales[src->kind == S_PER_TENSOR ? 0 : r];
        return;
    }
    float *row = malloc(w->ld * (sizeof(float) + 1));
    if (!row) {
        __atomic_store_n(&ch->failed, 2, __ATOMIC_RELAXED);
        return;
    }
    uint8_t *q = (uint8_t *)(row + w->ld);
    if (s_fp8_row_f32(src, r, w->ld, row) != 0)
        __atomic_store_n(&ch->failed, 1, __ATOMIC_RELAXED);
    else {
        ls_fp8_quantize_rows(q, &ch->scales[wr], row, 1, (int)w->ld);
        memcpy(dst, q + w->c0, w->nc);
    }
    free(row);
}

// Uploads window w of a projection into codes (E4M3) and its row scales into scales, in
// chunks of rows through the staging block.
static int s_upload_fp8(ls_backend_t *be, ls_view_t codes, ls_view_t scales,
                        const s_fp8_src_t *src, const s_window_t *w, s_progress_t *p, char *err,
                        size_t errlen) {
    const ls_st_tensor_t *t = src->t;
    size_t rows_per = S_CHUNK_BYTES / w->nc, esz = ls_dtype_size(t->dtype);
    s_fp8_chunk_t ch = {src, w, 0, p->stage, malloc(w->nr * sizeof(float)), 0};
    if (!ch.scales) {
        ls_err_set(err, errlen, "%s: out of memory", t->file);
        return -1;
    }
    int rc = 0;
    for (size_t r = 0; r < w->nr && rc == 0; r += rows_per) {
        size_t m = w->nr - r < rows_per ? w->nr - r : rows_per;
        ch.r = r;
        ls_par_for(m, 0, s_fp8_chunk_row, &ch);
        if (ch.failed) {
            ls_err_set(err, errlen, ch.failed == 1 ? "%s: tensor \"%s\": a value is NaN or "
                       "infinite" : "%s: tensor \"%s\": out of memory", t->file, t->name);
            rc = -1;
        } else if (be->buffer_upload(be, ls_view(codes.buf, codes.off + r * w->nc), ch.codes,
                                     LS_DTYPE_F8E4M3, m * w->nc) != 0) {
            rc = -2;
        }
        p->done += m * w->nc * esz;
        if (p->fn)
            p->fn(p->arg, t->name, p->done, p->total);
    }
    if (rc == 0 && be->buffer_upload(be, scales, ch.scales, LS_DTYPE_F32, w->nr) != 0)
        rc = -2;
    if (rc == -2)
        ls_err_set(err, errlen, "%s: tensor \"%s\": upload to the %s backend failed", t->file,
                   t->name, be->name);
    free(ch.scales);
    return rc < 0 ? -1 : 0;
}

// --- places ----------------------------------------------------------------------------------

// The index of a place: its distance from global[] or layer[].
static size_t s_place_index(const ls_model_t *self, ls_buffer_t **place, int layer) {
    return layer < 0 ? (size_t)(place - self->global)
                     : S_GLOBAL_COUNT + (size_t)(place - self->layer);
}

// Allocates every place, sized by what goes into it, in the dtype of what goes into it:
// the tensors' as stored (st), or dt for every tensor (no checkpoint: the dummy weights);
// FP8 projections in E4M3 with F32 scales. *total: the bytes the weights take as read. -1
// + err (naming what) for a tensor of a dtype it may not have, or out of memory.
static int s_places_new(ls_model_t *self, const ls_st_t *st, ls_dtype_t dt, const char *what,
                        size_t *total, char *err, size_t errlen) {
    ls_backend_t *be = self->be;
    size_t n_places = S_GLOBAL_COUNT + (size_t)self->cfg.num_hidden_layers * S_LAYER_COUNT;
    size_t *sizes = calloc(n_places, sizeof *sizes);
    ls_dtype_t *dtypes = calloc(n_places, sizeof *dtypes);
    int rc = sizes && dtypes ? 0 : -1;
    if (rc)
        ls_err_set(err, errlen, "%s: out of memory", what);
    *total = 0;
    ls_weight_spec_t spec;
    for (size_t i = 0; rc == 0 && ls_model_config_weight_spec(&self->cfg, i, &spec) == 0; i++) {
        size_t off;
        ls_buffer_t **place = s_place(self, spec.role, spec.layer, &off);
        size_t idx = s_place_index(self, place, spec.layer);
        const ls_st_tensor_t *t = st ? ls_st_find(st, spec.name) : NULL;
        ls_dtype_t tdt = t ? t->dtype : dt;
        bool fp8 = self->fp8 && s_role_fp8(spec.role);
        if (tdt == LS_DTYPE_F8E4M3 && !s_role_fp8(spec.role)) {
            ls_err_set(err, errlen, "%s: tensor \"%s\" is F8_E4M3; only the seven projections "
                       "may be", t->file, t->name);
            rc = -1;
            break;
        }
        s_window_t w = s_window(self, &spec);
        sizes[idx] += s_place_numel(self, &spec, &w);
        // as stored, so a device backend can keep bf16 as bf16
        dtypes[idx] = fp8 ? LS_DTYPE_F8E4M3 : tdt;
        if (fp8) {
            size_t sidx = s_place_index(self, s_scale_place(self, place, spec.layer), spec.layer);
            sizes[sidx] += w.nr;
            dtypes[sidx] = LS_DTYPE_F32;
        }
        if (spec.role == LS_W_Q && spec.layer == 0)
            self->weight_dtype = self->fp8 ? self->cfg.torch_dtype : tdt;
        *total += s_window_numel(&w) * ls_dtype_size(st || !fp8 ? tdt : LS_DTYPE_F8E4M3);
    }
    for (size_t idx = 0; idx < n_places && rc == 0; idx++) {
        if (!sizes[idx])
            continue;
        ls_buffer_t **place = idx < S_GLOBAL_COUNT ? &self->global[idx]
                                                   : &self->layer[idx - S_GLOBAL_COUNT];
        *place = be->buffer_new(be, dtypes[idx], sizes[idx]);
        if (!*place) {
            ls_err_set(err, errlen, "%s: out of %s backend memory for %zu weights", what,
                       be->name, sizes[idx]);
            rc = -1;
        }
    }
    free(sizes);
    free(dtypes);
    if (rc == 0)
        s_zero_vocab_pad(self);
    return rc;
}

// Allocates the places and uploads the checkpoint's tensors into them.
static int s_load_weights(ls_model_t *self, const ls_st_t *st, s_progress_t *p, char *err,
                          size_t errlen) {
    ls_backend_t *be = self->be;
    if (s_places_new(self, st, LS_DTYPE_F32, ls_st_path(st), &p->total, err, errlen) != 0)
        return -1;
    ls_weight_spec_t spec;
    int rc = 0;
    for (size_t i = 0; rc == 0 && ls_model_config_weight_spec(&self->cfg, i, &spec) == 0; i++) {
        size_t off;
        ls_buffer_t **place = s_place(self, spec.role, spec.layer, &off);
        const ls_st_tensor_t *t = ls_st_find(st, spec.name);
        s_window_t w = s_window(self, &spec);
        if (!s_window_numel(&w))
            continue;
        if (self->fp8 && s_role_fp8(spec.role)) {
            s_fp8_src_t src;
            ls_buffer_t *scales = *s_scale_place(self, place, spec.layer);
            rc = s_fp8_src(self, st, &spec, t, &src, err, errlen);
            if (rc == 0)
                rc = s_upload_fp8(be, ls_view(*place, off), ls_view(scales, off / w.nc), &src,
                                  &w, p, err, errlen);
            free(src.scales);
        } else if (t->dtype == LS_DTYPE_F8E4M3) {
            ls_err_set(err, errlen, "%s: tensor \"%s\" is F8_E4M3 but the model is not loaded "
                       "as FP8 (config.json has no FP8 \"quantization_config\")", t->file,
                       t->name);
            rc = -1;
        } else if (s_upload_tensor(be, ls_view(*place, off), t, &w, p) != 0) {
            ls_err_set(err, errlen, "%s: tensor \"%s\": upload to the %s backend failed",
                       t->file, t->name, be->name);
            rc = -1;
        }
    }
    self->weight_bytes = p->total;
    return rc;
}

// The rank's shard and the sizes that follow from it, the layer table.
static int s_model_init(ls_model_t *self, const char *what, ls_quant_t quant, char *err,
                        size_t errlen) {
    const ls_model_config_t *c = &self->cfg;
    int rank = self->comm ? ls_comm_rank(self->comm) : 0;
    int size = self->comm ? ls_comm_size(self->comm) : 1;
    ls_tp_shard_t *s = &self->shard;
    if (ls_model_config_shard(c, rank, size, s, err, errlen) != 0)
        return -1;
    self->H = c->hidden_size;
    self->I = s->inter;
    self->V = c->vocab_size;
    self->W = self->V;
    self->n_heads = s->n_q_heads;
    self->n_kv_heads = s->n_kv_heads;
    self->q_dim = s->n_q_heads * c->head_dim;
    self->kv_dim = s->n_kv_heads * c->head_dim;
    self->qkv_dim = self->q_dim + 2 * self->kv_dim;
    self->vocab_pad = s->vocab_max;
    self->weight_dtype = c->torch_dtype;
    // an FP8 checkpoint runs as stored; --quantization fp8 quantizes any other at load
    self->fp8 = quant == LS_QUANT_FP8 || c->quant == LS_QUANT_FP8;
    if (self->fp8 && s_fp8_check(self, what, err, errlen) != 0)
        return -1;
    self->layer = calloc((size_t)c->num_hidden_layers * S_LAYER_COUNT, sizeof *self->layer);
    self->vocab_off = calloc((size_t)size + 1, sizeof *self->vocab_off);
    if (self->comm) // the step agreement (ls_model_agree) must not depend on an allocation
        self->ws[S_WS_FLAG] = self->be->buffer_new(self->be, LS_DTYPE_F32, 1);
    if (!self->layer || !self->vocab_off || (self->comm && !self->ws[S_WS_FLAG])) {
        ls_err_set(err, errlen, "%s: out of memory", what);
        return -1;
    }
    for (int r = 0; r <= size; r++)
        self->vocab_off[r] = (int)((int64_t)self->V * r / size);
    return 0;
}

// The RoPE inverse frequencies, once the weights are in.
static int s_model_rope(ls_model_t *self, const char *what, char *err, size_t errlen) {
    ls_backend_t *be = self->be;
    const ls_model_config_t *c = &self->cfg;
    float *inv = malloc((size_t)c->head_dim / 2 * sizeof *inv);
    self->inv_freq = inv ? be->buffer_new(be, LS_DTYPE_F32, (size_t)c->head_dim / 2) : NULL;
    if (self->inv_freq) {
        ls_rope_config_t rc;
        s_rope_config(c, &rc);
        ls_rope_inv_freq_init(inv, c->head_dim, &rc);
    }
    int up = self->inv_freq ? be->buffer_upload(be, ls_view(self->inv_freq, 0), inv,
                                                LS_DTYPE_F32, (size_t)c->head_dim / 2)
                            : -1;
    free(inv);
    if (up != 0) {
        ls_err_set(err, errlen, "%s: could not set up the RoPE table on the %s backend", what,
                   be->name);
        return -1;
    }
    return 0;
}

ls_model_t *ls_model_load(const char *dir, ls_backend_t *be, ls_comm_t *comm, ls_quant_t quant,
                          ls_model_progress_fn *progress, void *arg, char *err, size_t errlen) {
    ls_model_t *self = calloc(1, sizeof *self);
    ls_st_t *st = NULL;
    s_progress_t p = {progress, arg, 0, 0, malloc(S_CHUNK_BYTES)};
    if (!self || !p.stage) {
        ls_err_set(err, errlen, "%s: out of memory", dir);
        goto fail;
    }
    self->be = be;
    self->comm = comm;
    if (ls_model_config_load(dir, &self->cfg, err, errlen) != 0)
        goto fail;
    if (s_model_init(self, dir, quant, err, errlen) != 0)
        goto fail;
    st = ls_st_open(dir, err, errlen);
    if (!st || ls_model_config_check_weights(&self->cfg, st, err, errlen) != 0)
        goto fail;
    if (s_load_weights(self, st, &p, err, errlen) != 0)
        goto fail;
    if (s_model_rope(self, dir, err, errlen) != 0)
        goto fail;
    ls_st_destroy(&st);
    free(p.stage);
    return self;
fail:
    ls_st_destroy(&st);
    free(p.stage);
    ls_model_destroy(&self);
    return NULL;
}

// --- dummy weights ---------------------------------------------------------------------------

// Elements per upload of the dummy loader, and the spread of its pattern offsets.
#define S_DUMMY_CHUNK ((size_t)8 << 20)
#define S_DUMMY_SPREAD ((size_t)1 << 16)

// One value class of the dummy weights: v*mul + add for v ~ U(-1, 1), stored in dtype,
// S_DUMMY_CHUNK + S_DUMMY_SPREAD of them. E4M3 pools hold the values quantized with the
// one scale s_dummy_scale gives every row of their class.
typedef struct {
    float mul, add;
    ls_dtype_t dtype;
    void *data;
} s_dummy_pool_t;

static uint64_t s_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// The row scale of an E4M3 dummy class: its largest magnitude lands on 448, as
// ls_fp8_quantize_rows would put it.
static float s_dummy_scale(float mul, float add) {
    return (fabsf(mul) + fabsf(add)) / 448.0f;
}

static const void *s_dummy_values(s_dummy_pool_t *pools, int *n_pools, float mul, float add,
                                  ls_dtype_t dt, uint64_t seed) {
    for (int i = 0; i < *n_pools; i++)
        if (pools[i].mul == mul && pools[i].add == add && pools[i].dtype == dt)
            return pools[i].data;
    if (*n_pools == 16)
        return NULL;
    size_t n = S_DUMMY_CHUNK + S_DUMMY_SPREAD, es = ls_dtype_size(dt);
    char *d = malloc(n * es);
    if (!d)
        return NULL;
    uint64_t x = seed * 0x2545f4914f6cdd1dull + (uint64_t)*n_pools;
    for (size_t i = 0; i < n; i++) {
        float v = (float)((double)(s_splitmix(&x) >> 11) * 0x1.0p-52 - 1.0) * mul + add;
        if (dt == LS_DTYPE_F32)
            memcpy(d + i * 4, &v, 4);
        else if (dt == LS_DTYPE_F8E4M3)
            d[i] = (char)ls_e4m3_from_f32(v / s_dummy_scale(mul, add));
        else {
            uint16_t h = dt == LS_DTYPE_BF16 ? ls_bf16_from_f32(v) : ls_f16_from_f32(v);
            memcpy(d + i * 2, &h, 2);
        }
    }
    pools[*n_pools] = (s_dummy_pool_t){mul, add, dt, d};
    (*n_pools)++;
    return d;
}

ls_model_t *ls_model_load_dummy(const char *config, ls_backend_t *be, ls_comm_t *comm,
                                ls_quant_t quant, uint64_t seed, ls_model_progress_fn *progress,
                                void *arg, char *err, size_t errlen) {
    ls_model_t *self = calloc(1, sizeof *self);
    const char *what = config && config[strspn(config, " \t\r\n")] == '{' ? "config JSON"
                                                                         : config;
    s_dummy_pool_t pools[16];
    int n_pools = 0;
    float *row_scales = NULL;
    if (!self || !config) {
        ls_err_set(err, errlen, "dummy model: %s", self ? "no config given" : "out of memory");
        goto fail;
    }
    self->be = be;
    self->comm = comm;
    if ((what == config ? ls_model_config_load(config, &self->cfg, err, errlen)
                        : ls_model_config_parse(config, strlen(config), what, &self->cfg, err,
                                                errlen)) != 0)
        goto fail;
    if (s_model_init(self, what, quant, err, errlen) != 0)
        goto fail;
    const ls_model_config_t *c = &self->cfg;
    size_t total;
    if (s_places_new(self, NULL, c->torch_dtype, what, &total, err, errlen) != 0)
        goto fail;
    size_t done = 0;
    uint64_t h = seed;
    ls_weight_spec_t spec;
    for (size_t i = 0; ls_model_config_weight_spec(c, i, &spec) == 0; i++) {
        size_t off;
        s_window_t w = s_window(self, &spec);
        size_t numel = s_window_numel(&w);
        ls_buffer_t **place = s_place(self, spec.role, spec.layer, &off);
        bool fp8 = self->fp8 && s_role_fp8(spec.role);
        ls_dtype_t dt = fp8 ? LS_DTYPE_F8E4M3 : c->torch_dtype;
        float mul, add = 0.0f; // as tests/engine/random_model.h scales its random models
        switch (spec.role) {
        case LS_W_ATTN_NORM: case LS_W_MLP_NORM: case LS_W_FINAL_NORM:
        case LS_W_Q_NORM: case LS_W_K_NORM:
            mul = 0.1f, add = 1.0f;
            break;
        case LS_W_Q_BIAS: case LS_W_K_BIAS: case LS_W_V_BIAS: case LS_W_O_BIAS:
        case LS_W_GATE_BIAS: case LS_W_UP_BIAS: case LS_W_DOWN_BIAS:
            mul = 0.05f;
            break;
        case LS_W_EMBED:
            mul = 1.0f;
            break;
        default:
            mul = 1.7f / sqrtf((float)spec.shape[1]);
        }
        const char *vals = s_dummy_values(pools, &n_pools, mul, add, dt, seed);
        if (!vals || (fp8 && !(row_scales = malloc(w.nr * sizeof *row_scales)))) {
            ls_err_set(err, errlen, "%s: out of memory", what);
            goto fail;
        }
        if (fp8) { // every row of the class has its one scale
            for (size_t r = 0; r < w.nr; r++)
                row_scales[r] = s_dummy_scale(mul, add);
            ls_buffer_t *sp = *s_scale_place(self, place, spec.layer);
            int up = be->buffer_upload(be, ls_view(sp, off / w.nc), row_scales, LS_DTYPE_F32,
                                       w.nr);
            free(row_scales);
            row_scales = NULL;
            if (up != 0) {
                ls_err_set(err, errlen, "%s: tensor \"%s\": upload to the %s backend failed",
                           what, spec.name, be->name);
                goto fail;
            }
        }
        for (size_t k = 0; k < numel; k += S_DUMMY_CHUNK) {
            size_t n = numel - k < S_DUMMY_CHUNK ? numel - k : S_DUMMY_CHUNK;
            size_t at = (size_t)(s_splitmix(&h) % S_DUMMY_SPREAD);
            if (be->buffer_upload(be, ls_view(*place, off + k), vals + at * ls_dtype_size(dt),
                                  dt, n) != 0) {
                ls_err_set(err, errlen, "%s: tensor \"%s\": upload to the %s backend failed",
                           what, spec.name, be->name);
                goto fail;
            }
            done += n * ls_dtype_size(dt);
            if (progress)
                progress(arg, spec.name, done, total);
        }
    }
    self->weight_bytes = total;
    if (s_model_rope(self, what, err, errlen) != 0)
        goto fail;
    for (int i = 0; i < n_pools; i++)
        free(pools[i].data);
    return self;
fail:
    for (int i = 0; i < n_pools; i++)
        free(pools[i].data);
    ls_model_destroy(&self);
    return NULL;
}

static void s_buffer_free(ls_backend_t *be, ls_buffer_t **buf) {
    if (*buf)
        be->buffer_free(be, *buf);
    *buf = NULL;
}

void ls_model_destroy(ls_model_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_model_t *self = *self_p;
    for (int i = 0; i < S_GLOBAL_COUNT; i++)
        s_buffer_free(self->be, &self->global[i]);
    for (size_t i = 0; self->layer && i < (size_t)self->cfg.num_hidden_layers * S_LAYER_COUNT;
         i++)
        s_buffer_free(self->be, &self->layer[i]);
    s_buffer_free(self->be, &self->inv_freq);
    for (int i = 0; i < S_WS_COUNT; i++)
        s_buffer_free(self->be, &self->ws[i]);
    free(self->layer);
    free(self->vocab_off);
    free(self->meta);
    free(self->meta_w);
    free(self);
    *self_p = NULL;
}

const ls_model_config_t *ls_model_config(const ls_model_t *self) {
    return &self->cfg;
}

ls_backend_t *ls_model_backend(const ls_model_t *self) {
    return self->be;
}

size_t ls_model_weight_bytes(const ls_model_t *self) {
    return self->weight_bytes;
}

bool ls_model_fp8(const ls_model_t *self) {
    return self->fp8;
}

// --- KV cache ------------------------------------------------------------------------------

ls_dtype_t ls_model_kv_dtype(const ls_model_t *model) {
    return model->weight_dtype;
}

// Bytes one element of dtype takes in a buffer of be: the CPU backend stores every
// buffer as f32 (backend.h), device backends store the dtype asked for.
static size_t s_storage_size(const ls_backend_t *be, ls_dtype_t dtype) {
    return strcmp(be->name, "cpu") == 0 ? sizeof(float) : ls_dtype_size(dtype);
}

size_t ls_kv_cache_block_bytes(const ls_model_t *model, int block_size, ls_dtype_t dtype) {
    return (size_t)2 * model->cfg.num_hidden_layers * (size_t)block_size * model->kv_dim *
           s_storage_size(model->be, dtype);
}

ls_kv_cache_t *ls_kv_cache_new(const ls_model_t *model, int num_blocks, int block_size,
                               char *err, size_t errlen) {
    return ls_kv_cache_new_dtype(model, num_blocks, block_size, ls_model_kv_dtype(model), err,
                                 errlen);
}

ls_kv_cache_t *ls_kv_cache_new_dtype(const ls_model_t *model, int num_blocks, int block_size,
                                     ls_dtype_t dtype, char *err, size_t errlen) {
    if (dtype != LS_DTYPE_F32 && dtype != LS_DTYPE_F16 && dtype != LS_DTYPE_BF16) {
        ls_err_set(err, errlen, "KV cache: dtype must be f32, f16 or bf16");
        return NULL;
    }
    if (num_blocks < 1 || block_size < 1) {
        ls_err_set(err, errlen, "KV cache: need num_blocks >= 1 and block_size >= 1 (got %d, %d)",
                   num_blocks, block_size);
        return NULL;
    }
    ls_kv_cache_t *self = calloc(1, sizeof *self);
    int L = model->cfg.num_hidden_layers;
    size_t block_n = (size_t)block_size * model->kv_dim;
    size_t n = (size_t)num_blocks * 2 * L * block_n;
    if (self)
        *self = (ls_kv_cache_t){model->be, L, num_blocks, block_size, dtype, block_n,
                                model->be->buffer_new(model->be, dtype, n)};
    bool ok = self && self->pages;
    if (ok) // zero, so that a stale read is at least finite and deterministic
        model->be->buffer_zero(model->be, ls_view(self->pages, 0), n);
    if (!ok) {
        ls_kv_cache_destroy(&self);
        ls_err_set(err, errlen, "KV cache: out of %s backend memory for %d blocks of %d tokens",
                   model->be->name, num_blocks, block_size);
    }
    return self;
}

void ls_kv_cache_destroy(ls_kv_cache_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_kv_cache_t *self = *self_p;
    s_buffer_free(self->be, &self->pages);
    free(self);
    *self_p = NULL;
}

int ls_kv_cache_num_blocks(const ls_kv_cache_t *self) {
    return self->num_blocks;
}

int ls_kv_cache_block_size(const ls_kv_cache_t *self) {
    return self->block_size;
}

ls_dtype_t ls_kv_cache_dtype(const ls_kv_cache_t *self) {
    return self->dtype;
}

ls_page_arena_t ls_kv_cache_arena(const ls_kv_cache_t *self) {
    return (ls_page_arena_t){self->pages, 2 * (size_t)self->n_layers * self->block_n, self->num_blocks};
}

// --- forward -------------------------------------------------------------------------------

// Grows workspace buffer i to at least n elements (doubling, so a growing batch reallocates
// O(log) times); contents are not kept.
static int s_ws_reserve(ls_model_t *self, s_ws_t i, size_t n) {
    ls_buffer_t *b = self->ws[i];
    if (b && b->n >= n)
        return 0;
    size_t want = b && 2 * b->n > n ? 2 * b->n : n;
    s_buffer_free(self->be, &self->ws[i]);
    ls_dtype_t dt = i == S_WS_LP ? self->weight_dtype : i == S_WS_XQ ? LS_DTYPE_F8E4M3
                                                                      : LS_DTYPE_F32;
    self->ws[i] = self->be->buffer_new(self->be, dt, want ? want : 1);
    return self->ws[i] ? 0 : -1;
}

// Checks one sequence of a step against the model, cache and pool.
static int s_seq_check(const ls_model_t *self, const ls_kv_cache_t *kv,
                       const ls_lora_pool_t *pool, const ls_model_seq_t *q, int s, char *err,
                       size_t errlen) {
    const ls_model_config_t *c = &self->cfg;
    int64_t ctx = (int64_t)q->start_pos + q->n_tokens;
    if (q->n_tokens < 1 || q->start_pos < 0 || !q->token_ids || ctx > INT32_MAX) {
        ls_err_set(err, errlen, "step: sequence %d: needs n_tokens >= 1 and start_pos >= 0 "
                   "(got %d, %d)", s, q->n_tokens, q->start_pos);
        return -1;
    }
    // an id past the vocabulary is one of the sequence's adapter's added ids, with its row
    const ls_lora_tokens_t *tk = pool ? ls_lora_pool_tokens(pool) : NULL;
    bool added = tk && !q->mix && q->lora_slot > LS_LORA_SLOT_BASE &&
                 q->lora_slot < ls_lora_pool_n_slots(pool);
    for (int i = 0; i < q->n_tokens; i++) {
        int32_t id = q->token_ids[i];
        if (id < 0 || (id >= c->vocab_size &&
                       !(added && ls_lora_tokens_embed_row(tk, q->lora_slot, id) >= 0))) {
            ls_err_set(err, errlen, "step: sequence %d: token id %d is outside the vocabulary "
                       "(%d) and not an added token of its adapter", s, id, c->vocab_size);
            return -1;
        }
    }
    if (c->sliding_window > 0 && c->sliding_window < c->max_position_embeddings &&
        ctx > c->sliding_window) {
        ls_err_set(err, errlen, "step: sequence %d: a context of %lld tokens exceeds %s's "
                   "sliding_window of %d; windowed attention is not implemented, so "
                   "contexts are limited to the window", s, (long long)ctx, ls_arch_name(c->arch),
                   c->sliding_window);
        return -1;
    }
    if ((int64_t)q->n_blocks * kv->block_size < ctx || !q->block_table) {
        ls_err_set(err, errlen, "step: sequence %d: %d blocks of %d tokens cannot hold a "
                   "context of %lld", s, q->n_blocks, kv->block_size, (long long)ctx);
        return -1;
    }
    for (int b = 0; b < q->n_blocks; b++)
        if (q->block_table[b] < 0 || q->block_table[b] >= kv->num_blocks) {
            ls_err_set(err, errlen, "step: sequence %d: block %d is outside the KV cache "
                       "(%d blocks)", s, q->block_table[b], kv->num_blocks);
            return -1;
        }
    int n_slots = pool ? ls_lora_pool_n_slots(pool) : 1;
    if (q->mix && (q->n_mix < 1 || q->n_mix > LS_LORA_MIX_MAX)) {
        ls_err_set(err, errlen, "step: sequence %d: a mix of %d adapters (1 .. %d)", s,
                   q->n_mix, LS_LORA_MIX_MAX);
        return -1;
    }
    int n = q->mix ? q->n_mix : 1;
    for (int i = 0; i < n; i++) {
        int slot = q->mix ? q->mix[i].slot : q->lora_slot;
        float weight = q->mix ? q->mix[i].weight : 1.0f;
        if (slot < 0 || slot >= n_slots) {
            ls_err_set(err, errlen, "step: sequence %d: LoRA slot %d is outside the pool (%d "
                       "slots%s)", s, slot, n_slots, pool ? "" : ", no pool given");
            return -1;
        }
        if (!(weight > 0.0f) || !isfinite(weight)) {
            ls_err_set(err, errlen, "step: sequence %d: mix weight %g is not a positive "
                       "number", s, (double)weight);
            return -1;
        }
        // rows that replace the base model's are no delta a weight could scale or add up
        const ls_lora_tokens_t *tok = pool ? ls_lora_pool_tokens(pool) : NULL;
        if (q->mix && tok && ls_lora_tokens_slot_has(tok, slot)) {
            ls_err_set(err, errlen, "step: sequence %d: the adapter in slot %d of its mix has "
                       "trainable tokens, which do not mix", s, slot);
            return -1;
        }
    }
    return 0;
}

// The k-th component of q that does any work (a slot of rank > 0): its slot and weight;
// false when q has fewer. A sequence without a mix has its lora_slot at weight 1.
static bool s_seq_part(const ls_model_seq_t *q, const int32_t *ranks, int k, int *slot,
                       float *weight) {
    int n = q->mix ? q->n_mix : 1;
    for (int i = 0; i < n; i++) {
        int w = q->mix ? q->mix[i].slot : q->lora_slot;
        if (w == LS_LORA_SLOT_BASE || ranks[w] == 0 || k-- > 0)
            continue;
        *slot = w;
        *weight = q->mix ? q->mix[i].weight : 1.0f;
        return true;
    }
    return false;
}

// The LoRA batch of pass k of S sequences whose rows q_indptr gives: the k-th working
// component of each sequence (s_seq_part), one segment per distinct (slot, weight), slots in
// order and weights in order of first appearance, each segment's sequences in batch order,
// their rows one consecutive run. Sequences without a k-th component are left out. perm (T),
// seg_indptr (S+1), widx (S), seg_w (S) and mark (S) are the pass's storage.
static ls_lora_batch_t s_pass_build(const ls_lora_pool_t *pool, const ls_model_seq_t *seqs,
                                    int S, const int32_t *q_indptr, int k, int32_t *perm,
                                    int32_t *seg_indptr, int32_t *widx, float *seg_w,
                                    int32_t *mark) {
    int n_slots = ls_lora_pool_n_slots(pool);
    const int32_t *ranks = ls_lora_pool_slot_ranks(pool);
    int n_segs = 0, p = 0;
    seg_indptr[0] = 0;
    for (int s = 0; s < S; s++)
        mark[s] = 0;
    for (int w = 1; w < n_slots; w++)
        for (int first = 0; first < S; first++) {
            int slot;
            float weight;
            if (mark[first] || !s_seq_part(&seqs[first], ranks, k, &slot, &weight) ||
                slot != w)
                continue;
            // a new segment: every unplaced sequence of this slot and weight
            for (int s = first; s < S; s++) {
                int ws;
                float wt;
                if (mark[s] || !s_seq_part(&seqs[s], ranks, k, &ws, &wt) || ws != w ||
                    wt != weight)
                    continue;
                mark[s] = 1;
                for (int t = q_indptr[s]; t < q_indptr[s + 1]; t++)
                    perm[p++] = t;
            }
            widx[n_segs] = w;
            seg_w[n_segs] = weight;
            seg_indptr[++n_segs] = p;
        }
    return (ls_lora_batch_t){n_segs, n_slots, seg_indptr, widx, perm, ranks,
                             ls_lora_pool_slot_scalings(pool), seg_w};
}

// The step's trainable tokens (lora_tokens.h): each token row's own embedding row of its
// sequence's adapter in token_rows (T), -1 for none, and the logit rows of adapters with
// lm_head rows in head_tiles (*n_head of (logit row, first row, count)). Mixes have none
// (s_seq_check). Whether some token row has a row of its own.
static bool s_tokens_build(const ls_lora_pool_t *pool, const ls_model_seq_t *seqs, int S,
                           const int32_t *q_indptr, int32_t *token_rows, int32_t *head_tiles,
                           int *n_head) {
    const ls_lora_tokens_t *tk = pool ? ls_lora_pool_tokens(pool) : NULL;
    bool any = false;
    *n_head = 0;
    for (int s = 0, r = 0; tk && s < S; s++) {
        const ls_model_seq_t *q = &seqs[s];
        int w = q->mix ? LS_LORA_SLOT_BASE : q->lora_slot;
        bool has = w != LS_LORA_SLOT_BASE && ls_lora_tokens_slot_has(tk, w);
        for (int t = q_indptr[s]; t < q_indptr[s + 1]; t++) {
            token_rows[t] = has ? ls_lora_tokens_embed_row(tk, w, q->token_ids[t - q_indptr[s]])
                                : -1;
            any |= token_rows[t] >= 0;
        }
        int32_t first;
        int n = has && q->want_logits ? ls_lora_tokens_head_rows(tk, w, &first) : 0;
        if (n > 0) {
            int32_t *tile = head_tiles + 3 * (size_t)(*n_head)++;
            tile[0] = r;
            tile[1] = first;
            tile[2] = n;
        }
        r += q->want_logits;
    }
    return any;
}

// Which batch each group's ops run pass k over (self->lora_batch): the pass itself where every
// adapter of it targets the group, none where no adapter does, else the pass narrowed to the
// adapters that do — a copy of lora[k] with ranks (n_slots) those of
// ls_lora_pool_group_ranks, appended to lora (up to *n_batches). Adapters without a group's
// targets hold zeros in its slots: a q,k,v,o adapter under a pool of all seven targets would
// otherwise read and multiply gate_up's and down's zeros, twice its own bytes. Groups whose
// narrowed ranks are equal share one batch. lm_head has logit_slots instead.
_Static_assert(LS_LORA_BATCH_MAX >= LS_LORA_GROUP_COUNT * LS_LORA_MIX_MAX,
               "a pass and a narrowed batch of it for each group but lm_head");
static void s_group_batches(ls_model_t *self, const ls_lora_pool_t *pool, int P,
                            ls_lora_batch_t *lora, int *n_batches) {
    int B = P, n_slots = ls_lora_pool_n_slots(pool);
    for (int k = 0; k < P; k++)
        for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
            int *b = &self->lora_batch[k][g];
            *b = k;
            if (g == LS_LORA_GROUP_LM_HEAD || !ls_lora_pool_has_group(pool, g))
                continue;
            const int32_t *ranks = ls_lora_pool_group_ranks(pool, (ls_lora_group_t)g);
            const ls_lora_batch_t *l = &lora[k];
            bool all = true, none = true;
            for (int s = 0; s < l->n_segs; s++) {
                bool hit = ranks[l->weight_indices[s]] > 0;
                all &= hit;
                none &= !hit;
            }
            if (all)
                continue;
            *b = none ? -1 : B;
            for (int h = 0; h < g && *b == B; h++) {
                int e = self->lora_batch[k][h];
                if (e >= P && !memcmp(lora[e].lora_ranks, ranks, (size_t)n_slots * sizeof *ranks))
                    *b = e;
            }
            if (*b == B) {
                assert(B < LS_LORA_BATCH_MAX);
                lora[B] = *l;
                lora[B++].lora_ranks = ranks;
            }
        }
    *n_batches = B;
}

// Lays out the step in the host arena: ls_step_t, its attention metadata and, when some
// sequence uses an adapter, the LoRA passes, one per component of the longest mix
// (s_pass_build), and the groups' narrowed batches after them (lora: LS_LORA_BATCH_MAX of
// them; s_group_batches).
static int s_step_build(ls_model_t *self, const ls_kv_cache_t *kv, const ls_lora_pool_t *pool,
                        const ls_model_seq_t *seqs, int S, ls_step_t *step,
                        ls_lora_batch_t *lora) {
    int T = 0, R = 0, max_blocks = 0, max_ctx = 0, P = 0;
    const int32_t *ranks = pool ? ls_lora_pool_slot_ranks(pool) : NULL;
    for (int s = 0; s < S; s++) {
        T += seqs[s].n_tokens;
        R += seqs[s].want_logits;
        max_blocks = seqs[s].n_blocks > max_blocks ? seqs[s].n_blocks : max_blocks;
        int ctx = seqs[s].start_pos + seqs[s].n_tokens;
        max_ctx = ctx > max_ctx ? ctx : max_ctx;
        int slot;
        float weight;
        while (pool && s_seq_part(&seqs[s], ranks, P, &slot, &weight))
            P++;
    }
    // token_ids, positions, slot_mapping (T each); q_indptr (S+1), ctx_lens (S),
    // block_tables (S*max_blocks); logit_rows (R); marks (S); per pass: permutation (T),
    // seg_indptr (S+1), weight_indices (S); logit_slots (P*R); token_rows (T), head_tiles
    // (3*R). Floats: per pass, the segments' weights (S); logit_scales (P*R)
    size_t need = 3 * (size_t)T + 3 * (size_t)S + 1 + (size_t)S * max_blocks + (size_t)R +
                  (size_t)P * ((size_t)T + 2 * (size_t)S + 1) + (size_t)P * R + (size_t)T +
                  3 * (size_t)R;
    size_t need_w = (size_t)P * S + (size_t)P * R;
    if (need > self->meta_cap) {
        int32_t *m = realloc(self->meta, need * sizeof *m);
        if (!m)
            return -1;
        self->meta = m;
        self->meta_cap = need;
    }
    if (need_w > self->meta_w_cap) {
        float *m = realloc(self->meta_w, need_w * sizeof *m);
        if (!m)
            return -1;
        self->meta_w = m;
        self->meta_w_cap = need_w;
    }
    int32_t *tok = self->meta, *pos = tok + T, *slot_map = pos + T, *q_indptr = slot_map + T,
            *ctx_lens = q_indptr + S + 1, *tables = ctx_lens + S,
            *rows = tables + (size_t)S * max_blocks, *mark = rows + R, *passes = mark + S,
            *logit_slots = passes + (size_t)P * (T + 2 * (size_t)S + 1),
            *token_rows = logit_slots + (size_t)P * R, *head_tiles = token_rows + T;
    float *logit_scales = self->meta_w ? self->meta_w + (size_t)P * S : NULL;  // NULL: no sequence yet
    q_indptr[0] = 0;
    int r = 0;
    for (int s = 0; s < S; s++) {
        const ls_model_seq_t *q = &seqs[s];
        int t0 = q_indptr[s];
        q_indptr[s + 1] = t0 + q->n_tokens;
        ctx_lens[s] = q->start_pos + q->n_tokens;
        memcpy(tok + t0, q->token_ids, (size_t)q->n_tokens * sizeof *tok);
        for (int i = 0; i < q->n_tokens; i++) {
            int p = q->start_pos + i;
            pos[t0 + i] = p;
            slot_map[t0 + i] = q->block_table[p / kv->block_size] * kv->block_size +
                               p % kv->block_size;
        }
        int32_t *row = tables + (size_t)s * max_blocks;
        memcpy(row, q->block_table, (size_t)q->n_blocks * sizeof *row);
        // padding entries are never read (attention stops at the context length); 0 keeps
        // them valid block ids for a kernel that prefetches
        memset(row + q->n_blocks, 0, (size_t)(max_blocks - q->n_blocks) * sizeof *row);
        if (q->want_logits)
            rows[r++] = q_indptr[s + 1] - 1;
    }
    for (int k = 0; k < P; k++) {
        int32_t *perm = passes + (size_t)k * (T + 2 * (size_t)S + 1), *seg_indptr = perm + T;
        lora[k] = s_pass_build(pool, seqs, S, q_indptr, k, perm, seg_indptr,
                               seg_indptr + S + 1, self->meta_w + (size_t)k * S, mark);
    }
    // lm_head's LoRA, pass by pass as s_pass_build's: in pass k a logit row gets the slot and
    // scale of its sequence's k-th working component where that adapter targets lm_head,
    // slot 0 otherwise
    bool head_lora = false;
    const unsigned *targets = pool ? ls_lora_pool_slot_targets(pool) : NULL;
    const float *scalings = pool ? ls_lora_pool_slot_scalings(pool) : NULL;
    for (int k = 0; k < P; k++) {
        for (int s = 0, i = 0; s < S; s++) {
            if (!seqs[s].want_logits)
                continue;
            int slot;
            float weight;
            bool head = s_seq_part(&seqs[s], ranks, k, &slot, &weight) &&
                        (targets[slot] >> LS_TARGET_LM_HEAD & 1);
            logit_slots[(size_t)k * R + i] = head ? slot : LS_LORA_SLOT_BASE;
            logit_scales[(size_t)k * R + i] = head ? scalings[slot] * weight : 0.0f;
            head_lora |= head;
            i++;
        }
    }
    int B = 0;
    if (P)
        s_group_batches(self, pool, P, lora, &B);
    int n_head = 0;
    bool any_rows = s_tokens_build(pool, seqs, S, q_indptr, token_rows, head_tiles, &n_head);
    *step = (ls_step_t){
        .n_tokens = T,
        .token_ids = tok,
        .attn = {S, T, max_blocks, max_ctx, q_indptr, ctx_lens, pos, slot_map, tables},
        .lora = P ? lora : NULL,
        .n_lora_batches = B,
        .n_lora_passes = P,
        .n_logit_rows = R,
        .logit_rows = rows,
        .logit_slots = head_lora ? logit_slots : NULL,
        .logit_scales = head_lora ? logit_scales : NULL,
        .token_rows = any_rows ? token_rows : NULL,
        .n_head_tiles = n_head,
        .head_tiles = n_head ? head_tiles : NULL,
    };
    return 0;
}

// Decode-shaped LoRA step: at most 256 tokens, each sequence's one token or no segment
// longer than 16. There a group's LoRA costs launches, not bytes, and the backend's
// lora_fused may do shrink and expand as it sees fit (the CUDA backend: see
// ls_cu_lora_apply), beside the GEMM; long (prefill) segments keep shrink + expand. A decode
// step is decode-shaped however many of its requests share an adapter: one adapter under
// 128 requests, 10.1 -> 9.3 ms a step that way (H200, engine alone, Llama-3-8B).
static bool s_lora_decode_shaped(const ls_step_t *step) {
    if (step->n_tokens > 256)
        return false;
    if (step->attn.n_seqs == step->n_tokens)
        return true;
    for (int k = 0; k < step->n_lora_passes; k++) {
        const ls_lora_batch_t *l = &step->lora[k];
        for (int s = 0; s < l->n_segs; s++)
            if (l->seg_indptr[s + 1] - l->seg_indptr[s] > 16)
                return false;
    }
    return true;
}

static ls_view_t s_w(ls_buffer_t *buf) {
    return buf ? ls_view(buf, 0) : LS_VIEW_NONE;
}

// Whether rmsnorm and silu_mul also write their output in the weights' dtype (the LP
// workspace) for the matmul after them: so the activations are rounded by the op that
// makes them, not by a conversion pass of the matmul's own (fp32 weights: no rounding).
// FP8 models have them write the quantized rows instead (s_lp).
static bool s_lp_on(const ls_model_t *self) {
    return self->weight_dtype != LS_DTYPE_F32 && !self->fp8;
}

// The out_lp and out_scale views rmsnorm and silu_mul write for the matmul after them:
// the LP copy; or, FP8, the quantized rows and their scales in the XQ and XS workspaces,
// which that matmul_fp8 then reads as they are instead of quantizing x in a pass of its own
// (the o projection, after attention, still quantizes its input itself).
static void s_lp(const ls_model_t *self, ls_view_t *lp, ls_view_t *lp_scale) {
    *lp = s_lp_on(self) ? s_w(self->ws[S_WS_LP])
          : self->fp8   ? s_w(self->ws[S_WS_XQ])
                        : LS_VIEW_NONE;
    *lp_scale = self->fp8 ? s_w(self->ws[S_WS_XS]) : LS_VIEW_NONE;
}

// The input of a matmul over weights w: the LP copy (or the quantized rows) when it holds
// w's dtype, else x.
static ls_view_t s_mm_in(const ls_buffer_t *w, ls_view_t x, ls_view_t lp) {
    return lp.buf && w && w->dtype == lp.buf->dtype ? lp : x;
}

// Whether some adapter of the step targets group g (s_group_batches).
static bool s_group_work(const ls_model_t *self, const ls_step_t *step, ls_lora_group_t g) {
    for (int k = 0; k < step->n_lora_passes; k++)
        if (self->lora_batch[k][g] >= 0)
            return true;
    return false;
}

// Whether the LoRA reads x_mm, the matmul's input, rather than fp32 x: where x_mm is the
// 16-bit copy in the adapters' dtype (as PEFT's LoRA reads the bf16 activations), so the
// fp32 copy need not exist (s_f32_out). FP8 rows and fp32 x stay with fp32.
static bool s_lora_reads_mm(const ls_lora_pool_t *pool, ls_view_t x_mm) {
    ls_dtype_t dt = x_mm.buf ? x_mm.buf->dtype : LS_DTYPE_F32;
    return dt != LS_DTYPE_F32 && dt == ls_lora_pool_dtype(pool);
}

// out, the fp32 output of the op (rmsnorm, silu_mul, attention) before projection g over
// weights w, or LS_VIEW_NONE where nothing reads it: the matmul reads the LP copy (s_lp_on:
// 16-bit weights) and g's LoRA, if it has work in the step, reads that copy too. The op then
// writes the copy alone: a 2K-token prompt's silu_mul writes 117 MB a layer less, and
// attention's rows need no conversion pass before o's GEMM.
static ls_view_t s_f32_out(const ls_model_t *self, const ls_lora_pool_t *pool,
                           const ls_step_t *step, ls_lora_group_t g, const ls_buffer_t *w,
                           ls_view_t out, ls_view_t lp) {
    ls_view_t x_mm = s_mm_in(w, out, lp);
    bool lora = step->lora && ls_lora_pool_has_group(pool, g) && s_group_work(self, step, g);
    bool lora_f32 = lora && !s_lora_reads_mm(pool, x_mm);
    return !s_lp_on(self) || lora_f32 || x_mm.buf != lp.buf ? out : LS_VIEW_NONE;
}

// y (T, out_total of g) += LoRA of group g on x (T, in of g), when the step has adapters
// and the pool holds the group; accumulate 0: y = that delta (0 on rows without one). One
// pass after the other (a mix's components: backend.h), the later ones adding to y. x is
// the fp32 input, or x_mm, the matmul's, where s_lora_reads_mm.
static void s_lora(ls_model_t *self, const ls_lora_pool_t *pool, const ls_step_t *step,
                   int layer, ls_lora_group_t g, ls_view_t y, ls_view_t x, ls_view_t x_mm,
                   int accumulate) {
    if (!step->lora || !ls_lora_pool_has_group(pool, g))
        return;
    ls_backend_t *be = self->be;
    ls_lora_group_shape_t sh = ls_lora_pool_group_shape(pool, g);
    int r_max = ls_lora_pool_r_max(pool);
    ls_view_t tmp = ls_view(self->ws[S_WS_LORA], 0);
    ls_lora_mat_t a, b;
    ls_lora_pool_mats(pool, layer, g, &a, &b);
    if (s_lora_reads_mm(pool, x_mm))
        x = x_mm;
    for (int k = 0; k < step->n_lora_passes; k++) {
        int batch = self->lora_batch[k][g];
        if (batch < 0)
            continue;
        if (be->lora_fused && self->lora_decode)
            be->lora_fused(be, y, x, tmp, a, b, sh.slice_offsets, sh.in, sh.n_slices, r_max,
                           accumulate, batch);
        else {
            if (!accumulate)
                be->buffer_zero(be, y, (size_t)step->n_tokens * sh.slice_offsets[sh.n_slices]);
            be->lora_shrink(be, tmp, x, a, sh.in, sh.n_slices, r_max, batch);
            be->lora_expand(be, y, tmp, b, sh.slice_offsets, sh.n_slices, r_max, batch);
        }
        accumulate = 1;
    }
    assert(accumulate); // a delta (s_proj) is made only for a group with work (s_group_work)
}

// x (T, hidden) += the embedding's LoRA (after the embedding's all-reduce: every rank holds
// it whole), pass by pass as the other targets' (a mix's components weighted alike), in the
// passes where some segment's adapter targets the embedding: a gather of A's columns at the
// token ids, then the usual expand. Slots of adapters without it hold zeros there.
static void s_lora_embed(ls_model_t *self, const ls_lora_pool_t *pool, const ls_step_t *step,
                         ls_view_t x) {
    if (!step->lora || !ls_lora_pool_has_group(pool, LS_LORA_GROUP_EMBED))
        return;
    ls_backend_t *be = self->be;
    ls_lora_group_shape_t sh = ls_lora_pool_group_shape(pool, LS_LORA_GROUP_EMBED);
    int r_max = ls_lora_pool_r_max(pool);
    ls_view_t tmp = s_w(self->ws[S_WS_LORA]);
    ls_lora_mat_t a, b;
    ls_lora_pool_mats(pool, 0, LS_LORA_GROUP_EMBED, &a, &b);
    for (int k = 0; k < step->n_lora_passes; k++) {
        int batch = self->lora_batch[k][LS_LORA_GROUP_EMBED];
        if (batch < 0)
            continue;
        be->lora_embed_shrink(be, tmp, a, sh.in, r_max, batch);
        be->lora_expand(be, x, tmp, b, sh.slice_offsets, 1, r_max, batch);
    }
}

// The base GEMM of a projection: y (T, out) = x (T, in) · wᵀ + bias, reading x_mm (x
// itself, or its copy in w's dtype: s_mm_in); FP8 (w_scale given): x quantized per token,
// unless x_mm is already x's quantized rows (s_lp).
static void s_matmul(ls_model_t *self, ls_view_t y, ls_view_t x, ls_view_t x_mm, ls_view_t w,
                     ls_view_t w_scale, ls_view_t bias, int T, int in, int out) {
    ls_backend_t *be = self->be;
    if (w_scale.buf)
        be->matmul_fp8(be, y, x_mm.buf->dtype == LS_DTYPE_F8E4M3 ? LS_VIEW_NONE : x,
                       s_w(self->ws[S_WS_XQ]), s_w(self->ws[S_WS_XS]), w, w_scale, bias, T, in,
                       out);
    else
        be->matmul(be, y, x_mm, w, bias, T, in, out, 0);
}

// A projection with its LoRA: y (T, out) = x (T, in) · wᵀ + bias as s_matmul computes it
// (w_scale: LS_VIEW_NONE, or an FP8 weight's scales), plus the LoRA of group g on x (s_lora),
// which is either added into y (returns LS_VIEW_NONE) or left as a delta (T, out) for
// the caller to fold into the next op that reads y (rmsnorm's x2, silu_mul's delta) or to
// add. Beside the GEMM for decode-shaped steps on a backend with a side queue
// (lora_beside): the decode LoRA is a few short dependent kernels whose cost is latency,
// not bytes, so on the side queue it runs while the GEMM streams its weights; the delta
// is written (not added) into the DELTA workspace, 0 on rows without an adapter.
// y + (0 + δ) rounds as y + δ, and the folding ops add δ into y before anything else: the
// step is bit for bit that of the LoRA added in place.
static ls_view_t s_proj(ls_model_t *self, const ls_lora_pool_t *pool, const ls_step_t *step,
                        int layer, ls_lora_group_t g, ls_view_t y, ls_view_t x, ls_view_t x_mm,
                        ls_view_t w, ls_view_t w_scale, ls_view_t bias, int T, int in,
                        int out) {
    ls_backend_t *be = self->be;
    if (!self->lora_beside || !ls_lora_pool_has_group(pool, g) || !s_group_work(self, step, g)) {
        s_matmul(self, y, x, x_mm, w, w_scale, bias, T, in, out);
        s_lora(self, pool, step, layer, g, y, x, x_mm, 1);
        return LS_VIEW_NONE;
    }
    ls_view_t d = s_w(self->ws[S_WS_DELTA]);
    be->side_begin(be);
    s_lora(self, pool, step, layer, g, d, x, x_mm, 0);
    be->side_end(be);
    s_matmul(self, y, x, x_mm, w, w_scale, bias, T, in, out);
    be->side_wait(be);
    return d;
}

// gate_up's LoRA made by SiLU·mul (backend.h lora_silu_fits) where its delta would cost
// more than the adapters' B: beside the GEMM the delta is T x 2·inter fp32 values written
// and read back (29 MB each way at 256 tokens on Llama-3-8B, most of what batch 128 and 256
// lose with 8 adapters: docs/benchmarks.md), while SiLU·mul making it reads B once a tile of
// up to 8 positions, but after the GEMM, where the expand reads it beside the GEMM. Past
// S_SILU_LORA_DELTA_T tokens (8 adapters, H100, the decode ratio: 192 tokens 0.90 -> 0.91 at
// 128 cached, 0.93 -> 0.94 at 1K; 256 tokens 0.91 -> 0.93 and 0.94 -> 0.95; 128 tokens even,
// 64 a loss, 0.98 -> 0.96) and with S_SILU_LORA_SEG_T tokens a segment on average (fewer: B's
// bytes approach the delta's); one pass (a mix's passes add deltas), no FP8 output.
enum { S_SILU_LORA_DELTA_T = 128, S_SILU_LORA_SEG_T = 8 };

// Where that route applies: gate_up (T, 2·inter) = x · wᵀ (+ bias) as s_matmul computes it,
// its shrink beside the GEMM as s_proj's, and out / out_lp = SiLU·mul of gate_up plus its
// LoRA; returns true. Else runs nothing and returns false (s_proj, then silu_mul).
static bool s_silu_lora(ls_model_t *self, const ls_lora_pool_t *pool, const ls_step_t *step, int layer,
                        ls_view_t out, ls_view_t out_lp, ls_view_t lp_scale, ls_view_t gate_up, ls_view_t x,
                        ls_view_t x_mm, ls_view_t w, ls_view_t w_scale, ls_view_t bias, int T, int in, int inter) {
    ls_backend_t *be = self->be;
    ls_lora_group_t g = LS_LORA_GROUP_GATE_UP;
    if (!self->lora_beside || !be->lora_silu_fits || lp_scale.buf || T <= S_SILU_LORA_DELTA_T ||
        step->n_lora_passes != 1 || !ls_lora_pool_has_group(pool, g) || self->lora_batch[0][g] < 0)
        return false;
    int batch = self->lora_batch[0][g], r_max = ls_lora_pool_r_max(pool);
    if ((long)step->lora[batch].n_segs * S_SILU_LORA_SEG_T > T)
        return false;
    ls_lora_mat_t a, b;
    ls_lora_pool_mats(pool, layer, g, &a, &b);
    ls_view_t tmp = ls_view(self->ws[S_WS_LORA], 0), xl = s_lora_reads_mm(pool, x_mm) ? x_mm : x;
    if (!be->lora_silu_fits(be, xl, tmp, a, b, in, inter, r_max, batch))
        return false;
    be->side_begin(be);
    be->lora_silu_shrink(be, tmp, xl, a, in, r_max, batch);
    be->side_end(be);
    s_matmul(self, gate_up, x, x_mm, w, w_scale, bias, T, in, 2 * inter);
    be->side_wait(be);
    be->lora_silu_mul(be, out, out_lp, gate_up, tmp, b, in, inter, r_max, batch);
    return true;
}

// y (n) += d when d is a delta s_proj left (else nothing); returns LS_VIEW_NONE.
static ls_view_t s_settle(ls_model_t *self, ls_view_t y, ls_view_t d, size_t n) {
    if (d.buf)
        self->be->add(self->be, y, d, n);
    return LS_VIEW_NONE;
}

// Checks and lays out the step, sizes the workspace and hands the metadata to the backend.
// Returns T, or -1 + err; nothing has run on the backend's data yet.
static int s_forward_prepare(ls_model_t *self, ls_kv_cache_t *kv, ls_lora_pool_t *pool,
                             const ls_model_seq_t *seqs, int n_seqs, ls_step_t *step,
                             ls_lora_batch_t *lora, char *err, size_t errlen) {
    if (n_seqs < 1) {
        ls_err_set(err, errlen, "step: no sequences");
        return -1;
    }
    size_t T = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (s_seq_check(self, kv, pool, &seqs[s], s, err, errlen) != 0)
            return -1;
        T += (size_t)seqs[s].n_tokens;
    }
    // The pages the step writes KV into are KV from now on: an adapter the pool still has on
    // one lost them to the scheduler (docs/memory.md), and the step waits for its last load.
    bool shared = pool && ls_lora_pool_arena(pool).buf == kv->pages;
    for (int s = 0; shared && s < n_seqs; s++) {
        const ls_model_seq_t *q = &seqs[s];
        int first = q->start_pos / kv->block_size, last = (q->start_pos + q->n_tokens - 1) / kv->block_size;
        ls_lora_pool_claim(pool, q->block_table + first, last - first + 1);
    }
    if (T > INT32_MAX / 4) {
        ls_err_set(err, errlen, "step: %zu tokens is too many for one step", T);
        return -1;
    }
    if (s_step_build(self, kv, pool, seqs, n_seqs, step, lora) != 0) {
        ls_err_set(err, errlen, "step: out of memory for the metadata of %zu tokens", T);
        return -1;
    }
    self->lora_decode = step->lora && s_lora_decode_shaped(step);
    self->lora_beside = self->lora_decode && self->be->side_begin;
    size_t R = (size_t)step->n_logit_rows;
    const ls_lora_tokens_t *tk = pool ? ls_lora_pool_tokens(pool) : NULL;
    self->W = self->V + (tk ? ls_lora_tokens_capacity(tk) : 0);
    size_t lora_cols = pool ? (size_t)LS_LORA_MAX_SLICES * ls_lora_pool_r_max(pool) : 1;
    if (self->lora_decode)
        lora_cols *= LS_LORA_FUSED_PARTS; // lora_fused's scratch (backend.h)
    size_t delta_cols = (size_t)self->qkv_dim;
    delta_cols = delta_cols > (size_t)2 * self->I ? delta_cols : (size_t)2 * self->I;
    delta_cols = delta_cols > (size_t)self->H ? delta_cols : (size_t)self->H;
    bool lead = self->shard.rank == 0, tp = self->comm != NULL;
    size_t xq_cols = (size_t)self->H; // the widest input of a projection (and of its LP copy)
    xq_cols = xq_cols > (size_t)self->q_dim ? xq_cols : (size_t)self->q_dim;
    xq_cols = xq_cols > (size_t)self->I ? xq_cols : (size_t)self->I;
    const size_t need[S_WS_COUNT] = {
        [S_WS_X] = T * self->H,          [S_WS_H] = T * self->H,
        [S_WS_Y] = T * self->H,          [S_WS_QKV] = T * self->qkv_dim,
        [S_WS_ATTN] = T * self->q_dim,   [S_WS_GATE_UP] = T * 2 * self->I,
        [S_WS_ACT] = T * self->I,        [S_WS_LORA] = T * lora_cols,
        [S_WS_DELTA] = self->lora_beside ? T * delta_cols : 0,
        [S_WS_LP] = s_lp_on(self) ? T * xq_cols : 0,
        [S_WS_XQ] = self->fp8 ? T * xq_cols : 0,
        [S_WS_XS] = self->fp8 ? T : 0,
        [S_WS_LAST] = R * self->H,       [S_WS_LOGITS] = lead ? R * (size_t)self->W : 0,
        [S_WS_HEAD] = lead && self->W > self->V ? R * self->V : 0,
        [S_WS_PART] = tp ? R * self->vocab_pad : 0,
    };
    for (int i = 0; i < S_WS_COUNT; i++)
        if (s_ws_reserve(self, i, need[i]) != 0) {
            ls_err_set(err, errlen, "step: out of %s backend memory for %zu tokens",
                       self->be->name, T);
            return -1;
        }
    if (self->be->step_begin(self->be, step) != 0) {
        ls_err_set(err, errlen, "step: the %s backend could not take the step metadata",
                   self->be->name);
        return -1;
    }
    // a slot load may still be running: the step's ops start after those it reads
    if (pool)
        ls_lora_pool_step_wait(pool, step->lora, step->n_lora_passes);
    return (int)T;
}

int ls_model_agree(ls_model_t *self, bool ok, char *err, size_t errlen) {
    if (!self->comm)
        return ok ? 0 : -1;
    ls_backend_t *be = self->be;
    char why[512] = "";
    // a backend that failed since it last synchronized (a GPU backend reports a failed launch
    // only then, and its copies fail from then on) fails this rank's part too
    bool sound = be->synchronize(be) == 0;
    float failed = ok && sound ? 0.0f : 1.0f;
    ls_view_t flag = s_w(self->ws[S_WS_FLAG]); // allocated with the model
    // the all-reduce is joined whatever the copies say: the other ranks wait in it, and a
    // failed backend still copies
    int up = be->buffer_upload(be, flag, &failed, LS_DTYPE_F32, 1);
    int red = ls_comm_all_reduce(self->comm, flag, 1, why, sizeof why);
    if (!sound) {
        if (ok)
            ls_err_set(err, errlen, "step: the %s backend failed", be->name);
        return -1;
    }
    if (red != 0 || up != 0 || be->buffer_download(be, &failed, flag, 1) != 0) {
        ls_err_set(err, errlen, "step: the ranks could not agree on running it: %s",
                   *why ? why : "backend failure");
        return -1;
    }
    if (failed > 0.0f) {
        if (ok)
            ls_err_set(err, errlen, "step: %d of the %d tensor-parallel ranks could not run it "
                       "(their logs say why)", (int)failed, self->shard.size);
        return -1;
    }
    return 0;
}

// After a row-parallel sub-layer (o, down) or the embedding: the partial sums of the ranks
// become the whole. -1 + err on a failed collective.
static int s_reduce(ls_model_t *self, ls_view_t y, size_t n, char *err, size_t errlen) {
    char why[512];
    if (!self->comm || ls_comm_all_reduce(self->comm, y, n, why, sizeof why) == 0)
        return 0;
    ls_err_set(err, errlen, "step: %s", why);
    return -1;
}

// Whether the step's layers may go to the backend's decode_block (backend.h) from o's
// projection to the next layer's q,k,v: one token, no tensor parallelism (o's and down's
// all-reduces sit inside that span), 16-bit weights read through their LP copies (not FP8),
// and no adapter of the step on those projections (their LoRA runs beside or after each
// matmul). The backend may still decline a block (backend_cuda.cu s_decode_block).
static bool s_block_on(const ls_model_t *self, const ls_lora_pool_t *pool, const ls_step_t *step,
                       int T) {
    if (!self->be->decode_block || T != 1 || self->comm || !s_lp_on(self))
        return false;
    static const ls_lora_group_t groups[] = {LS_LORA_GROUP_QKV, LS_LORA_GROUP_O,
                                             LS_LORA_GROUP_GATE_UP, LS_LORA_GROUP_DOWN};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (step->lora && ls_lora_pool_has_group(pool, groups[i]) &&
            s_group_work(self, step, groups[i]))
            return false;
    return true;
}

// The ops of one step, whose metadata step_begin took: embedding to logits. 0, or -1 + err
// on a failed collective.
static int s_forward_ops(ls_model_t *self, ls_kv_cache_t *kv, const ls_lora_pool_t *pool,
                         const ls_step_t *step, int T, char *err, size_t errlen) {
    const ls_model_config_t *c = &self->cfg;
    size_t R = (size_t)step->n_logit_rows, TH = (size_t)T * self->H;
    ls_backend_t *be = self->be;
    int n = T, H = self->H, I = self->I, hd = c->head_dim;
    int nh = self->n_heads, nkv = self->n_kv_heads;
    float eps = (float)c->rms_norm_eps;
    ls_view_t x = s_w(self->ws[S_WS_X]), h = s_w(self->ws[S_WS_H]), y = s_w(self->ws[S_WS_Y]),
              qkv = s_w(self->ws[S_WS_QKV]), attn = s_w(self->ws[S_WS_ATTN]),
              gate_up = s_w(self->ws[S_WS_GATE_UP]), act = s_w(self->ws[S_WS_ACT]);
    ls_view_t k = ls_view(qkv.buf, (size_t)self->q_dim);
    ls_view_t inv_freq = s_w(self->inv_freq);
    ls_view_t delta = LS_VIEW_NONE; // a LoRA delta s_proj left for the next op to fold in
    ls_view_t lp, lps;
    s_lp(self, &lp, &lps);

    be->embedding(be, x, s_w(self->global[S_EMBED]), H, self->shard.vocab0, self->shard.vocab);
    if (s_reduce(self, x, TH, err, errlen) != 0)
        return -1;
    // the adapters' own rows (trainable tokens)
    ls_view_t tok_embed = LS_VIEW_NONE, tok_head = LS_VIEW_NONE, tok_ids = LS_VIEW_NONE;
    if (step->token_rows || step->n_head_tiles)
        ls_lora_tokens_views(ls_lora_pool_tokens(pool), &tok_embed, &tok_head, &tok_ids);
    if (step->token_rows)  // whole rows replaced, after the all-reduce: alike on every rank
        be->token_rows(be, x, tok_embed, H);
    s_lora_embed(self, pool, step, x);
    // qkv_ready: the decode block before made this layer's q,k,v (and added y into x)
    bool block = s_block_on(self, pool, step, n), qkv_ready = false;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        ls_buffer_t **w = self->layer + (size_t)l * S_LAYER_COUNT;
        if (!qkv_ready) {
            // x += y (+ its LoRA delta: the previous layer's MLP output); h = rmsnorm(x)
            be->rmsnorm(be, s_f32_out(self, pool, step, LS_LORA_GROUP_QKV, w[S_QKV], h, lp), lp,
                        lps, l ? x : LS_VIEW_NONE, l ? y : x, delta, s_w(w[S_ATTN_NORM]), n, H,
                        eps);
            delta = s_proj(self, pool, step, l, LS_LORA_GROUP_QKV, qkv, h,
                           s_mm_in(w[S_QKV], h, lp), s_w(w[S_QKV]), s_w(w[S_QKV_SCALE]),
                           s_w(w[S_QKV_BIAS]), n, H, self->qkv_dim);
        }
        qkv_ready = false;
        // norms, RoPE, the KV store and attention all read qkv: the delta goes in first —
        // added by RoPE and the KV store (q, k, v), which read it first, unless the head norms
        // read it before them (attention reads q and the caches, never qkv's v)
        if (c->qk_norm) {
            delta = s_settle(self, qkv, delta, (size_t)n * self->qkv_dim);
            be->rmsnorm_heads(be, qkv, s_w(w[S_Q_NORM]), n, nh, hd, self->qkv_dim, eps);
            be->rmsnorm_heads(be, k, s_w(w[S_K_NORM]), n, nkv, hd, self->qkv_dim, eps);
        }
        ls_view_t kc = ls_view(kv->pages, 2 * (size_t)l * kv->block_n),
                  vc = ls_view(kv->pages, (2 * (size_t)l + 1) * kv->block_n);
        size_t stride = 2 * (size_t)kv->n_layers * kv->block_n;
        be->rope_kv_store(be, qkv, delta, inv_freq, kc, vc, nh, nkv, hd, self->qkv_dim,
                          kv->block_size, stride);
        delta = LS_VIEW_NONE;
        // attention writes fp32 where o's LoRA or matmul reads that, else the LP copy alone
        ls_view_t ao = s_f32_out(self, pool, step, LS_LORA_GROUP_O, w[S_O], attn, lp);
        ao = ao.buf ? ao : lp;
        be->attention(be, ao, qkv, kc, vc, nh, nkv, hd, kv->block_size, self->qkv_dim, stride);
        if (block) { // o to the next layer's q,k,v as one op, where the backend takes it
            ls_buffer_t **wn = l + 1 < c->num_hidden_layers ? w + S_LAYER_COUNT : NULL;
            ls_decode_block_t b = {
                .a = ao, .w_o = s_w(w[S_O]), .b_o = s_w(w[S_O_BIAS]), .g2 = s_w(w[S_MLP_NORM]),
                .w_gu = s_w(w[S_GATE_UP]), .b_gu = s_w(w[S_GATE_UP_BIAS]), .w_d = s_w(w[S_DOWN]),
                .b_d = s_w(w[S_DOWN_BIAS]), .g1 = wn ? s_w(wn[S_ATTN_NORM]) : LS_VIEW_NONE,
                .w_qkv = wn ? s_w(wn[S_QKV]) : LS_VIEW_NONE,
                .b_qkv = wn ? s_w(wn[S_QKV_BIAS]) : LS_VIEW_NONE, .x = x, .y = y, .qkv = qkv,
                .x1 = gate_up, .act = lp, .H = H, .q_dim = self->q_dim, .inter = I,
                .qkv_dim = self->qkv_dim, .eps = eps};
            if (be->decode_block(be, &b)) {
                qkv_ready = wn != NULL;
                continue;
            }
        }
        // row-parallel: this rank's heads' share of o, its LoRA share too, then the sum
        delta = s_proj(self, pool, step, l, LS_LORA_GROUP_O, y, ao, ao, s_w(w[S_O]),
                       s_w(w[S_O_SCALE]), s_w(w[S_O_BIAS]), n, self->q_dim, H);
        // tensor parallel: the delta is a partial sum like y, reduced with it
        if (self->comm)
            delta = s_settle(self, y, delta, TH);
        if (s_reduce(self, y, TH, err, errlen) != 0)
            return -1;
        // x += y (+ delta: attention output); h = rmsnorm(x)
        be->rmsnorm(be, s_f32_out(self, pool, step, LS_LORA_GROUP_GATE_UP, w[S_GATE_UP], h, lp),
                    lp, lps, x, y, delta, s_w(w[S_MLP_NORM]), n, H, eps);
        ls_view_t gu_mm = s_mm_in(w[S_GATE_UP], h, lp),
                  act_out = s_f32_out(self, pool, step, LS_LORA_GROUP_DOWN, w[S_DOWN], act, lp);
        if (!s_silu_lora(self, pool, step, l, act_out, lp, lps, gate_up, h, gu_mm, s_w(w[S_GATE_UP]),
                         s_w(w[S_GATE_UP_SCALE]), s_w(w[S_GATE_UP_BIAS]), n, H, I)) {
            delta = s_proj(self, pool, step, l, LS_LORA_GROUP_GATE_UP, gate_up, h, gu_mm,
                           s_w(w[S_GATE_UP]), s_w(w[S_GATE_UP_SCALE]), s_w(w[S_GATE_UP_BIAS]), n, H,
                           2 * I);
            be->silu_mul(be, act_out, lp, lps, gate_up, delta, n, I);
        }
        // the down delta goes into the next rmsnorm (the next layer's or the final one)
        delta = s_proj(self, pool, step, l, LS_LORA_GROUP_DOWN, y, act,
                       s_mm_in(w[S_DOWN], act, lp), s_w(w[S_DOWN]), s_w(w[S_DOWN_SCALE]),
                       s_w(w[S_DOWN_BIAS]), n, I, H);
        if (self->comm)
            delta = s_settle(self, y, delta, TH);
        if (s_reduce(self, y, TH, err, errlen) != 0)
            return -1;
    }
    be->rmsnorm(be, h, LS_VIEW_NONE, LS_VIEW_NONE, x, y, delta,
                s_w(self->global[S_FINAL_NORM]), n, H, eps);
    if (R > 0) {
        ls_buffer_t *head = self->global[S_LM_HEAD] ? self->global[S_LM_HEAD]
                                                    : self->global[S_EMBED];
        // tensor parallel: each rank its vocabulary slice, rank 0 gathers the rows; with added
        // columns, lm_head's rows go to S_WS_HEAD and are widened into S_WS_LOGITS after
        bool wide = self->W > self->V;
        ls_view_t out = s_w(self->ws[self->comm ? S_WS_PART : wide ? S_WS_HEAD : S_WS_LOGITS]);
        be->rows_gather(be, s_w(self->ws[S_WS_LAST]), h, H);
        be->matmul(be, out, s_w(self->ws[S_WS_LAST]), s_w(head), LS_VIEW_NONE, (int)R, H,
                   self->vocab_pad, 0);
        if (step->logit_slots) {  // lm_head's LoRA on the logit rows of adapters with it
            ls_lora_mat_t a, b;
            ls_lora_pool_mats(pool, 0, LS_LORA_GROUP_LM_HEAD, &a, &b);
            for (int k = 0; k < step->n_lora_passes; k++)
                be->lora_rows(be, out, s_w(self->ws[S_WS_LAST]), s_w(self->ws[S_WS_LORA]), a,
                              b, H, self->vocab_pad, ls_lora_pool_r_max(pool), k);
        }
        char why[512];
        if (self->comm &&
            ls_comm_gather_cols(self->comm, s_w(self->ws[wide ? S_WS_HEAD : S_WS_LOGITS]), out,
                                (int)R, self->vocab_pad, self->vocab_off, why, sizeof why) != 0) {
            ls_err_set(err, errlen, "step: %s", why);
            return -1;
        }
        // the added columns: -inf (no sequence but an added token's adapter's may pick one)
        if (wide && self->shard.rank == 0)
            be->logits_widen(be, s_w(self->ws[S_WS_LOGITS]), s_w(self->ws[S_WS_HEAD]), self->V,
                             self->W);
        // the logits of the adapters' own lm_head rows, on the whole rows (rank 0 holds them):
        // an added id's column among them
        if (step->n_head_tiles && self->shard.rank == 0)
            be->token_logits(be, s_w(self->ws[S_WS_LOGITS]), s_w(self->ws[S_WS_LAST]), tok_head,
                             tok_ids, H, self->W);
    }
    return 0;
}

int ls_model_forward(ls_model_t *self, ls_kv_cache_t *kv, ls_lora_pool_t *pool,
                     const ls_model_seq_t *seqs, int n_seqs, char *err, size_t errlen) {
    assert(kv->be == self->be && kv->n_layers == self->cfg.num_hidden_layers);
    self->n_rows = 0;
    ls_step_t step;
    ls_lora_batch_t lora[LS_LORA_BATCH_MAX];
    int T = s_forward_prepare(self, kv, pool, seqs, n_seqs, &step, lora, err, errlen);
    // Every rank checks the same plan, but a rank may still fail alone (memory): all of
    // them learn it here, before any collective that the failed one would never join.
    if (self->comm && ls_model_agree(self, T >= 0, T >= 0 ? err : NULL, errlen) != 0)
        return -1;
    if (T < 0)
        return -1;
    ls_backend_t *be = self->be;
    // A backend with step graphs may take a decode step whole (backend.h): the ops are then
    // issued more than once (recorded, captured), always the same calls. Not under tensor
    // parallelism: its collectives run between the ops, outside the backend.
    int again = !self->comm && be->graph_begin ? be->graph_begin(be) : 0;
    do {
        if (s_forward_ops(self, kv, pool, &step, T, err, errlen) != 0)
            return -1;
    } while (again && (again = be->graph_end(be)));
    // Tensor parallel: a GPU backend reports a failed launch only when it synchronizes, and
    // only rank 0's logits are read, so every rank says whether its ops ran (the agreement
    // synchronizes) before any row is sampled: rank 0 waits for the step there anyway, the
    // others would learn it at the next step's agreement, one step of wrong logits late.
    if (self->comm && ls_model_agree(self, true, err, errlen) != 0)
        return -1;
    self->n_rows = step.n_logit_rows;
    return step.n_logit_rows;
}

int ls_model_logits_wide(ls_model_t *self, float *out) {
    if (self->shard.rank != 0)
        return -1;
    if (self->n_rows == 0)
        return 0;
    return self->be->buffer_download(self->be, out, s_w(self->ws[S_WS_LOGITS]),
                                     (size_t)self->n_rows * self->W);
}

int ls_model_logits(ls_model_t *self, float *out) {
    if (self->W == self->V)
        return ls_model_logits_wide(self, out);
    float *wide = malloc((size_t)self->n_rows * self->W * sizeof *wide + 1);
    int rc = wide ? ls_model_logits_wide(self, wide) : -1;
    for (int r = 0; rc == 0 && r < self->n_rows; r++)  // rows past the vocabulary, left out
        memcpy(out + (size_t)r * self->V, wide + (size_t)r * self->W, (size_t)self->V * sizeof *out);
    free(wide);
    return rc;
}

int ls_model_logits_width(const ls_model_t *self) {
    return self->W;
}

int ls_model_ban_tokens(ls_model_t *self, int row, const int32_t *ids, int n) {
    static const float neg_inf = -INFINITY;
    if (self->shard.rank != 0 || row < 0 || row >= self->n_rows)
        return -1;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= self->W)
            continue;  // an id the model cannot produce needs no ban
        ls_view_t at = s_w(self->ws[S_WS_LOGITS]);
        at.off += (size_t)row * self->W + (size_t)ids[i];
        if (self->be->buffer_upload(self->be, at, &neg_inf, LS_DTYPE_F32, 1) < 0)
            return -1;
    }
    return 0;
}

int ls_model_sample(ls_model_t *self, const ls_sampling_batch_t *batch, int32_t *tokens,
                    float *logprobs, int32_t *top_ids, float *top_logprobs) {
    assert(batch->n_rows == self->n_rows);
    if (self->shard.rank != 0)
        return -1;
    if (self->n_rows == 0)
        return 0;
    return self->be->sample(self->be, s_w(self->ws[S_WS_LOGITS]), self->W, batch, tokens,
                            logprobs, top_ids, top_logprobs);
}
