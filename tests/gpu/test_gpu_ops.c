/*  tests/gpu/test_gpu_ops.c — every op of the CUDA backend against the CPU backend.

    ggml test-backend-ops style: for each op, fresh random inputs are uploaded to both
    backends (weights as bf16/f16 bit patterns, so both hold exactly the same numbers), the
    op runs through each backend's table, and the results are downloaded and compared:
    NMSE = Σ(gpu - cpu)² / Σ cpu² and the largest absolute difference, against bounds
    stated per op below. Outputs are poisoned with NaN beforehand: an element the contract
    says is untouched must still be NaN on both sides, any other NaN fails. Results of LoRA
    expand are compared as deltas (y_after - y_before), so a wrong LoRA term cannot hide
    under the base output. The LoRA ops read their adapters through page tables
    (tests/kernels/lora_pages.h): rows and chunks in shuffled places between NaN, whole (the
    tuned kernels) and cut in pieces (the fallbacks), entries past a slot's rank NULL.

    Tolerances (why):
    - fp32 arithmetic on identical inputs (norms, RoPE (rope_kv_store's x), attention, LoRA,
      F32 matmul without TF32): NMSE <= 1e-10; only summation order and 1-ulp math
      functions differ;
    - prefill attention (the rows of sequences the prefill kernel takes; both prefill
      kernels, mma.sync and, on sm_90, wgmma): q and the softmax weights rounded to bf16:
      for q in [-qr, qr], NMSE <= 2e-5 (1 + qr²/9) and max |Δ| <= 0.0156 (1 + qr), derived
      at test_attention;
    - copies and gathers (embedding, rows_gather, rope_kv_store's caches — k as the GPU
      rotated it, v as the CPU added it, rounded to the cache's dtype —, add, uploads): exact;
    - BF16 (F16) matmul: the GPU rounds the fp32 activations to bf16 (f16) for cuBLAS (or,
      up to LS_CU_GEMV_MAX_T tokens, as its GEMV reads them), a relative error up to 2^-8
      (2^-11) per product: NMSE <= 5e-5 (1e-5); decode_block, whose RMSNorm and SiLU·mul
      outputs both backends round to bf16 from fp32 sums in different orders, the same;
    - FP8 matmul: the quantized activations and their scales are the CPU's bit for bit
      (exact); the products of E4M3 values are exact, so y differs by summation order and
      the order the two scales are applied in: NMSE <= 1e-10, as fp32;
    - sampling: greedy tokens identical; seeded tokens identical except near-ties of the
      race keys (|key_a - key_b| <= 1e-4) and top-p boundaries that the device's fixed-point
      masses put on the other side of a token (the mass ranked before it within
      (V + 2) * 2^-46 + 1e-12 * total of the target: s_top_p_flip), each counted and bounded
      (<= 1%; no flip at all on rows whose masses are exact in both); logprobs within 1e-5
      absolute; top-n ids identical, values within 1e-5; the select's stress rows twice on
      the device, the same tokens and logprobs bit for bit.

    Needs a GPU: not registered with ctest; tests/gpu/run.sh builds and runs it on the
    device machine. Exit status 0 only if every row of the summary table passes.
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda.h"
#include "lora_pages.h"
#include "ops_cuda.h"
#include "safetensors.h"
#include "test_util.h"

static ls_backend_t *s_cpu, *s_gpu;

// -- results --------------------------------------------------------------------------------

typedef struct {
    char name[160];  // the longest names the checks build (lora pass names)
    size_t n;
    double nmse, tol, maxabs, tol_abs;
    long untouched_bad, nan_bad;
    char note[160];
    int pass;
} s_res_t;

static s_res_t s_res[1024];
static int s_n_res;

static s_res_t *s_add_res(const char *name) {
    if (s_n_res == (int)(sizeof s_res / sizeof s_res[0])) {
        fprintf(stderr, "too many results\n");
        exit(2);
    }
    s_res_t *r = &s_res[s_n_res++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    return r;
}

static void s_print_res(const s_res_t *r) {
    printf("%-58s %8zu %10.3g %8.0e %10.3g %8.0e %5ld %5ld %s %s\n", r->name, r->n, r->nmse,
           r->tol, r->maxabs, r->tol_abs, r->untouched_bad, r->nan_bad,
           r->pass ? "PASS" : "FAIL", r->note);
    fflush(stdout);
}

// got vs ref (n): where ref is NaN the element was poisoned and left untouched by the
// reference, so got must be NaN too; elsewhere NaN/inf in got is a failure.
static s_res_t *s_check(const char *name, const float *got, const float *ref, size_t n,
                        double tol, double tol_abs) {
    s_res_t *r = s_add_res(name);
    double num = 0, den = 0, maxabs = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(ref[i])) {
            if (!isnan(got[i]))
                r->untouched_bad++;
            continue;
        }
        if (!isfinite(got[i]) && got[i] != ref[i]) {
            r->nan_bad++;
            continue;
        }
        if (!isfinite(ref[i]))
            continue; // equal infinities
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > maxabs)
            maxabs = fabs(d);
    }
    r->n = n;
    r->nmse = den > 0 ? num / den : num;
    r->tol = tol;
    r->maxabs = maxabs;
    r->tol_abs = tol_abs;
    r->pass = r->nmse <= tol && maxabs <= tol_abs && !r->untouched_bad && !r->nan_bad;
    s_print_res(r);
    return r;
}

// A yes/no check: ok passes.
static void s_check_true(const char *name, int ok) {
    s_res_t *r = s_add_res(name);
    r->pass = ok != 0;
    s_print_res(r);
}

// -- paired buffers -----------------------------------------------------------------------

typedef struct {
    ls_buffer_t *c, *g;
    ls_dtype_t dt;
    size_t n;
} s_pb_t;

static s_pb_t s_pb_new(ls_dtype_t dt, size_t n) {
    s_pb_t b = {s_cpu->buffer_new(s_cpu, dt, n), s_gpu->buffer_new(s_gpu, dt, n), dt, n};
    if (!b.c || !b.g) {
        fprintf(stderr, "buffer_new failed (%zu elements)\n", n);
        exit(2);
    }
    return b;
}

static void s_pb_free(s_pb_t *b) {
    s_cpu->buffer_free(s_cpu, b->c);
    s_gpu->buffer_free(s_gpu, b->g);
}

static ls_view_t s_vc(s_pb_t *b, size_t off) {
    return ls_view(b->c, off);
}
static ls_view_t s_vg(s_pb_t *b, size_t off) {
    return ls_view(b->g, off);
}

static float s_round(ls_dtype_t dt, float v) {
    if (dt == LS_DTYPE_BF16)
        return ls_bf16_to_f32(ls_bf16_from_f32(v));
    if (dt == LS_DTYPE_F16)
        return ls_f16_to_f32(ls_f16_from_f32(v));
    return v;
}

// rounds x (n) in place to what a dt buffer holds
static void s_round_all(ls_dtype_t dt, float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        x[i] = s_round(dt, x[i]);
}

// Uploads src (n fp32 values) to both at off; into a bf16/f16 buffer the values go as that
// dtype's bit patterns (rounded on the host), so that both backends hold the same numbers.
static void s_pb_set(s_pb_t *b, size_t off, const float *src, size_t n) {
    int rc;
    if (b->dt == LS_DTYPE_F32) {
        rc = s_cpu->buffer_upload(s_cpu, ls_view(b->c, off), src, LS_DTYPE_F32, n) |
             s_gpu->buffer_upload(s_gpu, ls_view(b->g, off), src, LS_DTYPE_F32, n);
    } else {
        uint16_t *h = t_alloc(n * 2);
        for (size_t i = 0; i < n; i++)
            h[i] = b->dt == LS_DTYPE_BF16 ? ls_bf16_from_f32(src[i]) : ls_f16_from_f32(src[i]);
        rc = s_cpu->buffer_upload(s_cpu, ls_view(b->c, off), h, b->dt, n) |
             s_gpu->buffer_upload(s_gpu, ls_view(b->g, off), h, b->dt, n);
        free(h);
    }
    if (rc) {
        fprintf(stderr, "upload failed\n");
        exit(2);
    }
}

static void s_pb_get(s_pb_t *b, size_t off, size_t n, float *c, float *g) {
    if (s_cpu->buffer_download(s_cpu, c, ls_view(b->c, off), n) ||
        s_gpu->buffer_download(s_gpu, g, ls_view(b->g, off), n)) {
        fprintf(stderr, "download failed (device fault?)\n");
        exit(2);
    }
}

static float *s_fill_new(t_rng_t *r, size_t n, float lo, float hi) {
    float *x = t_alloc(n * sizeof *x);
    t_fill(r, x, n, lo, hi);
    return x;
}

static float *s_nan_new(size_t n) {
    float *x = t_alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
    return x;
}

// -- step metadata ------------------------------------------------------------------------

enum { MAXT = 4096, MAXS = 64, MAXTAB = 64 * 64, MAXSEG = 64, MAXSLOT = 64 };

typedef struct {
    int T, S, max_blocks, max_ctx, n_logit, has_lora, n_segs, n_slots, has_perm;
    int32_t ids[MAXT], pos[MAXT], slot[MAXT], q_indptr[MAXS + 1], ctx[MAXS], tables[MAXTAB],
        logit_rows[MAXT], logit_slots[2 * MAXT], seg_indptr[MAXSEG + 1], wi[MAXSEG],
        perm[MAXT], ranks[MAXSLOT];
    int has_logit_slots;
    float scal[MAXSLOT], logit_scales[2 * MAXT];
    // a second LoRA pass (a mix's second components), and per-segment weights of both
    int n_passes, n_segs2, has_segw;
    int32_t seg_indptr2[MAXSEG + 1], wi2[MAXSEG], perm2[MAXT];
    float segw[MAXSEG], segw2[MAXSEG];
    // trainable tokens: the rows replacing tokens' embeddings, the logit rows' head tiles
    int has_token_rows, n_head_tiles;
    int32_t token_rows[MAXT], head_tiles[3 * MAXT];
    ls_lora_batch_t lora[2];
    ls_step_t step;
} s_stepd_t;

// One sequence of T tokens at positions 0..T-1 unless the test sets more.
static void s_step_simple(s_stepd_t *d, int T) {
    memset(d, 0, sizeof *d);
    d->T = T;
    d->S = 1;
    d->q_indptr[1] = T;
    d->ctx[0] = T;
    d->max_ctx = T;
    for (int t = 0; t < T; t++) {
        d->pos[t] = t;
        d->slot[t] = -1;
    }
}

static void s_step_begin(s_stepd_t *d) {
    d->lora[0] = (ls_lora_batch_t){d->n_segs, d->n_slots, d->seg_indptr, d->wi,
                                   d->has_perm ? d->perm : NULL, d->ranks, d->scal,
                                   d->has_segw ? d->segw : NULL};
    d->lora[1] = (ls_lora_batch_t){d->n_segs2, d->n_slots, d->seg_indptr2, d->wi2, d->perm2,
                                   d->ranks, d->scal, d->segw2};
    d->step = (ls_step_t){.n_tokens = d->T,
                          .token_ids = d->ids,
                          .attn = {.n_seqs = d->S,
                                   .n_tokens = d->T,
                                   .max_blocks = d->max_blocks,
                                   .max_ctx_len = d->max_ctx,
                                   .q_indptr = d->q_indptr,
                                   .ctx_lens = d->ctx,
                                   .positions = d->pos,
                                   .slot_mapping = d->slot,
                                   .block_tables = d->tables},
                          .lora = d->has_lora ? d->lora : NULL,
                          .n_lora_batches = d->has_lora ? (d->n_passes > 1 ? 2 : 1) : 0,
                          .n_lora_passes = d->has_lora ? (d->n_passes > 1 ? 2 : 1) : 0,
                          .n_logit_rows = d->n_logit,
                          .logit_rows = d->logit_rows,
                          .logit_slots = d->has_logit_slots ? d->logit_slots : NULL,
                          .logit_scales = d->has_logit_slots ? d->logit_scales : NULL,
                          .token_rows = d->has_token_rows ? d->token_rows : NULL,
                          .n_head_tiles = d->n_head_tiles,
                          .head_tiles = d->n_head_tiles ? d->head_tiles : NULL};
    if (s_cpu->step_begin(s_cpu, &d->step) || s_gpu->step_begin(s_gpu, &d->step)) {
        fprintf(stderr, "step_begin failed\n");
        exit(2);
    }
}

static const char *s_dtn(ls_dtype_t dt) {
    return ls_dtype_name(dt);
}

// -- buffers: conversions on upload and download -----------------------------------------

// The decode LoRA kernels keep nothing in local memory: a stack frame there (ptxas spills,
// or registers indexed as an array) is a memory round trip in every block, and one such
// frame in shrink v3 cost the decode step 10% on an H200 (kernels/cuda/dev/README.md)
static void test_lora_local_memory(void) {
    s_res_t *r = s_add_res("lora decode kernels: local memory per thread");
    long bytes = ls_cu_lora_local_bytes();
    r->pass = bytes == 0;
    snprintf(r->note, sizeof r->note, "%ld bytes (must be 0; -1: attributes unreadable)", bytes);
    s_print_res(r);
}

static void test_buffers(t_rng_t *r) {
    size_t n = 100003;
    float *x = s_fill_new(r, n, -3, 3), *ref = t_alloc(n * 4), *got = t_alloc(n * 4);
    x[0] = 1.0f + 0x1p-8f; // a bf16 tie: rounds to even
    x[1] = 70000.0f;       // f16 overflow -> inf
    ls_dtype_t dts[3] = {LS_DTYPE_F32, LS_DTYPE_BF16, LS_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        // upload fp32 source into a dt buffer: the GPU narrows on the device
        ls_buffer_t *b = s_gpu->buffer_new(s_gpu, dts[i], n);
        if (s_gpu->buffer_upload(s_gpu, ls_view(b, 0), x, LS_DTYPE_F32, n) ||
            s_gpu->buffer_download(s_gpu, got, ls_view(b, 0), n))
            exit(2);
        for (size_t k = 0; k < n; k++)
            ref[k] = s_round(dts[i], x[k]);
        char name[96];
        snprintf(name, sizeof name, "upload f32 -> %s buffer, download", s_dtn(dts[i]));
        s_check(name, got, ref, n, 0, 0);
        // bf16 source into an f32 buffer: widened exactly
        if (dts[i] == LS_DTYPE_BF16) {
            uint16_t *h = t_alloc(n * 2);
            for (size_t k = 0; k < n; k++)
                h[k] = ls_bf16_from_f32(x[k]);
            ls_buffer_t *f = s_gpu->buffer_new(s_gpu, LS_DTYPE_F32, n);
            s_gpu->buffer_zero(s_gpu, ls_view(f, 0), n);
            if (s_gpu->buffer_upload(s_gpu, ls_view(f, 7), h, LS_DTYPE_BF16, n - 7) ||
                s_gpu->buffer_download(s_gpu, got, ls_view(f, 0), n))
                exit(2);
            for (size_t k = 0; k < n; k++)
                ref[k] = k < 7 ? 0.0f : ls_bf16_to_f32(h[k - 7]);
            s_check("upload bf16 -> f32 buffer at offset, zero", got, ref, n, 0, 0);
            s_gpu->buffer_free(s_gpu, f);
            free(h);
        }
        s_gpu->buffer_free(s_gpu, b);
    }
    free(x), free(ref), free(got);
}

// buffer_upload_async (LoRA slot loads): a packed image in host_alloc pieces of random sizes
// padded into a poisoned (rows, dst_stride) region by the device, against ls_pad_copy on
// the host; elements past chunks*dst_chunk of each row must stay poisoned. dt: the buffer's
// storage (bf16 or f32); w 0: zero fill. Exact.
static void test_upload_padded(t_rng_t *r, ls_dtype_t dt, size_t w, size_t chunks, size_t rows,
                               size_t dst_chunk, size_t dst_stride, int nspan) {
    size_t es = ls_dtype_size(dt), n_img = rows * chunks * w, n_dst = rows * dst_stride, off = 5;
    float *vals = s_fill_new(r, n_img ? n_img : 1, -2, 2), *got = t_alloc(n_dst * 4),
          *ref = s_nan_new(n_dst), *poison = s_nan_new(n_dst + off);
    char *img = t_alloc(n_img * es + 1), *padded = t_alloc(n_dst * es);
    for (size_t i = 0; i < n_img; i++)
        if (es == 2)
            ((uint16_t *)img)[i] = ls_bf16_from_f32(vals[i]);
        else
            ((float *)img)[i] = vals[i];
    // the reference: pad on the host, widen the written part of every row
    ls_pad_copy(padded, img, es, w, chunks, rows, dst_chunk, dst_stride);
    for (size_t i = 0; i < rows; i++)
        for (size_t k = 0; k < chunks * dst_chunk; k++) {
            size_t at = i * dst_stride + k;
            ref[at] = es == 2 ? ls_bf16_to_f32(((uint16_t *)padded)[at]) : ((float *)padded)[at];
        }
    // the image in nspan pieces of pinned memory, cut at random places
    ls_host_span_t spans[16];
    size_t bytes = n_img * es, at = 0;
    for (int k = 0; k < nspan; k++) {
        size_t left = bytes - at, take = k == nspan - 1 ? left : (size_t)t_rng_int(r, (int)(left / 2 + 1));
        void *p = s_gpu->host_alloc(s_gpu, take);
        memcpy(p, img + at, take);
        spans[k] = (ls_host_span_t){p, take};
        at += take;
    }
    ls_buffer_t *b = s_gpu->buffer_new(s_gpu, dt, n_dst + off);
    ls_event_t *ev = s_gpu->event_new(s_gpu);
    if (!b || !ev || s_gpu->buffer_upload(s_gpu, ls_view(b, 0), poison, LS_DTYPE_F32, n_dst + off) ||
        s_gpu->buffer_upload_async(s_gpu, ls_view(b, off), dst_stride, dst_chunk, spans,
                                   w ? nspan : 0, w, chunks, rows, ev) ||
        s_gpu->event_sync(s_gpu, ev) || s_gpu->buffer_download(s_gpu, got, ls_view(b, off), n_dst))
        exit(2);
    char name[96];
    snprintf(name, sizeof name, "upload_async padded %s w%zu x%zu x%zu -> %zu/%zu, %d pieces",
             s_dtn(dt), w, chunks, rows, dst_chunk, dst_stride, nspan);
    s_check(name, got, ref, n_dst, 0, 0);
    for (int k = 0; k < nspan; k++)
        s_gpu->host_free(s_gpu, (void *)spans[k].p);
    s_gpu->event_free(s_gpu, ev);
    s_gpu->buffer_free(s_gpu, b);
    free(vals), free(got), free(ref), free(poison), free(img), free(padded);
}

// -- dense ops ----------------------------------------------------------------------------

static void test_matmul(t_rng_t *r, int T, int in, int out, ls_dtype_t wdt, int bias,
                        ls_dtype_t bdt, int acc) {
    s_pb_t w = s_pb_new(wdt, (size_t)out * in), x = s_pb_new(LS_DTYPE_F32, (size_t)T * in),
           y = s_pb_new(LS_DTYPE_F32, (size_t)T * out), b = s_pb_new(bdt, out);
    float *hw = s_fill_new(r, (size_t)out * in, -0.1f, 0.1f);
    float *hx = s_fill_new(r, (size_t)T * in, -1, 1);
    float *hy = acc ? s_fill_new(r, (size_t)T * out, -1, 1) : s_nan_new((size_t)T * out);
    float *hb = s_fill_new(r, out, -0.5f, 0.5f);
    s_pb_set(&w, 0, hw, (size_t)out * in);
    s_pb_set(&x, 0, hx, (size_t)T * in);
    s_pb_set(&y, 0, hy, (size_t)T * out);
    s_pb_set(&b, 0, hb, out);
    s_cpu->matmul(s_cpu, s_vc(&y, 0), s_vc(&x, 0), s_vc(&w, 0),
                  bias ? s_vc(&b, 0) : LS_VIEW_NONE, T, in, out, acc);
    s_gpu->matmul(s_gpu, s_vg(&y, 0), s_vg(&x, 0), s_vg(&w, 0),
                  bias ? s_vg(&b, 0) : LS_VIEW_NONE, T, in, out, acc);
    float *c = t_alloc((size_t)T * out * 4), *g = t_alloc((size_t)T * out * 4);
    s_pb_get(&y, 0, (size_t)T * out, c, g);
    char name[96];
    snprintf(name, sizeof name, "matmul w=%s T=%d %dx%d%s%s%s", s_dtn(wdt), T, in, out,
             bias ? " +bias:" : "", bias ? s_dtn(bdt) : "", acc ? " accumulate" : "");
    double tol = wdt == LS_DTYPE_F32 ? 1e-10 : wdt == LS_DTYPE_BF16 ? 5e-5 : 1e-5;
    double tol_abs = wdt == LS_DTYPE_F32 ? 1e-4 : wdt == LS_DTYPE_BF16 ? 5e-2 : 1e-2;
    s_check(name, g, c, (size_t)T * out, tol, tol_abs);
    if (wdt != LS_DTYPE_F32 && !acc) {
        // x handed over already in w's dtype (an rmsnorm's out_lp): the GPU multiplies it
        // as is, which must give the very bits of its matmul rounding the fp32 x itself.
        // (GPU only: s_pb_set hands the CPU the rounded values too, and the CPU's out_lp is
        // an exact f32 copy, checked by s_check_lp.)
        s_pb_t xl = s_pb_new(wdt, (size_t)T * in), y2 = s_pb_new(LS_DTYPE_F32, (size_t)T * out);
        s_pb_set(&xl, 0, hx, (size_t)T * in);
        s_pb_set(&y2, 0, hy, (size_t)T * out);
        s_gpu->matmul(s_gpu, s_vg(&y2, 0), s_vg(&xl, 0), s_vg(&w, 0),
                      bias ? s_vg(&b, 0) : LS_VIEW_NONE, T, in, out, 0);
        float *c2 = t_alloc((size_t)T * out * 4), *g2 = t_alloc((size_t)T * out * 4);
        s_pb_get(&y2, 0, (size_t)T * out, c2, g2);
        size_t n = (size_t)T * out, dg = 0;
        for (size_t i = 0; i < n; i++)
            dg += memcmp(&g[i], &g2[i], sizeof(float)) != 0;
        snprintf(name, sizeof name, "matmul w=%s T=%d, x in %s on the GPU: %zu of %zu differ",
                 s_dtn(wdt), T, s_dtn(wdt), dg, n);
        s_check_true(name, dg == 0);
        s_pb_free(&xl), s_pb_free(&y2);
        free(c2), free(g2);
    }
    s_pb_free(&w), s_pb_free(&x), s_pb_free(&y), s_pb_free(&b);
    free(hw), free(hx), free(hy), free(hb), free(c), free(g);
}

// FP8 (W8A8): the same E4M3 weights and scales on both, x quantized per token by each
// backend (compared bit for bit), then y. allow_outer 0: cuBLASLt's GEMM applies no scales
// (the pass after it does); allow_small 0: never ls_cu_fp8_gemm_small; allow_tc 0: never
// ls_cu_fp8_gemm_tc (both 0: cuBLASLt at every T); the row name says which path ran.
static void test_matmul_fp8(t_rng_t *r, int T, int in, int out, int bias, ls_dtype_t bdt,
                            int allow_outer, int allow_small, int allow_tc) {
    size_t nw = (size_t)out * in, nx = (size_t)T * in, ny = (size_t)T * out;
    s_pb_t w = s_pb_new(LS_DTYPE_F8E4M3, nw), ws = s_pb_new(LS_DTYPE_F32, out),
           x = s_pb_new(LS_DTYPE_F32, nx), xq = s_pb_new(LS_DTYPE_F8E4M3, nx),
           xs = s_pb_new(LS_DTYPE_F32, T), y = s_pb_new(LS_DTYPE_F32, ny),
           b = s_pb_new(bdt, out);
    float *hw = s_fill_new(r, nw, -0.1f, 0.1f), *hws = t_alloc(out * sizeof(float));
    float *hx = s_fill_new(r, nx, -1, 1), *hb = s_fill_new(r, out, -0.5f, 0.5f);
    hx[nx / 2] = 30; // an outlier in one row, as activations have
    uint8_t *codes = t_alloc(nw);
    ls_fp8_quantize_rows(codes, hws, hw, out, (int)in);
    if (s_cpu->buffer_upload(s_cpu, s_vc(&w, 0), codes, LS_DTYPE_F8E4M3, nw) ||
        s_gpu->buffer_upload(s_gpu, s_vg(&w, 0), codes, LS_DTYPE_F8E4M3, nw)) {
        fprintf(stderr, "upload failed\n");
        exit(2);
    }
    s_pb_set(&ws, 0, hws, out);
    s_pb_set(&x, 0, hx, nx);
    s_pb_set(&b, 0, hb, out);
    float *nan = s_nan_new(ny);
    s_pb_set(&y, 0, nan, ny);
    ls_backend_cuda_set_fp8_paths(s_gpu, allow_outer, allow_small, allow_tc);
    ls_view_t bc = bias ? s_vc(&b, 0) : LS_VIEW_NONE, bg = bias ? s_vg(&b, 0) : LS_VIEW_NONE;
    s_cpu->matmul_fp8(s_cpu, s_vc(&y, 0), s_vc(&x, 0), s_vc(&xq, 0), s_vc(&xs, 0), s_vc(&w, 0),
                      s_vc(&ws, 0), bc, T, in, out);
    s_gpu->matmul_fp8(s_gpu, s_vg(&y, 0), s_vg(&x, 0), s_vg(&xq, 0), s_vg(&xs, 0), s_vg(&w, 0),
                      s_vg(&ws, 0), bg, T, in, out);
    float *c = t_alloc(nx * 4), *g = t_alloc(nx * 4);
    char name[96];
    s_pb_get(&xq, 0, nx, c, g);
    snprintf(name, sizeof name, "matmul_fp8 T=%d in=%d: quantized x", T, in);
    s_check(name, g, c, nx, 0, 0);
    s_pb_get(&xs, 0, T, c, g);
    snprintf(name, sizeof name, "matmul_fp8 T=%d in=%d: x scales", T, in);
    s_check(name, g, c, T, 0, 0);
    free(c), free(g);
    c = t_alloc(ny * 4), g = t_alloc(ny * 4);
    s_pb_get(&y, 0, ny, c, g);
    ls_fp8_path_t path = ls_backend_cuda_fp8_path(s_gpu);
    snprintf(name, sizeof name, "matmul_fp8 T=%d %dx%d%s%s, %s", T, in, out,
             bias ? " +bias:" : "", bias ? s_dtn(bdt) : "",
             path == LS_FP8_PATH_TC      ? "tc GEMM"
             : path == LS_FP8_PATH_SMALL ? "small GEMM"
             : path == LS_FP8_PATH_OUTER ? "cuBLASLt, GEMM scales"
                                         : "cuBLASLt, scales after");
    // The products of E4M3 codes are exact, but Hopper's FP8 tensor cores add them with fewer
    // bits than fp32 (about 14: DeepSeek-V3's report measures it on H800s), where the CPU
    // reference sums in fp32: measured on an H100, NMSE 1e-8 to 3e-8 and the largest error
    // 0.05% to 0.34% of the row's largest |y|, whichever path applies the scales. Our own
    // GEMM sums the same exact products in fp32, in another order (32 lanes' partial sums):
    // even a sequential fp32 sum of 14,336 products of rms 0.033 errs ~1e-5 on |y| ~ 4 (NMSE
    // ~1e-11, the largest of 16k values ~5e-5), so bounds 1e-10 and 1e-3 hold with room and
    // still catch a sum kept with fewer bits, as the tensor cores' (NMSE 1e-8). A wrong
    // scale, code or layout is off by the size of y itself. Our tensor-core GEMM (tc) adds
    // each 64 products on the tensor cores (the same ~14-bit sums, fewer of them) and those
    // sums in fp32: cuBLASLt's bounds, 1e-6 and 1e-2.
    if (path == LS_FP8_PATH_SMALL)
        s_check(name, g, c, ny, 1e-10, 1e-3);
    else
        s_check(name, g, c, ny, 1e-6, 1e-2);
    // x handed over quantized (an rmsnorm's or silu_mul's out_lp and out_scale): no
    // quantizing pass, the same codes, the same GEMM, the same bits
    float *g2 = t_alloc(ny * 4);
    s_pb_t y2 = s_pb_new(LS_DTYPE_F32, ny);
    s_pb_set(&y2, 0, nan, ny);
    s_gpu->matmul_fp8(s_gpu, s_vg(&y2, 0), LS_VIEW_NONE, s_vg(&xq, 0), s_vg(&xs, 0),
                      s_vg(&w, 0), s_vg(&ws, 0), bg, T, in, out);
    s_pb_get(&y2, 0, ny, c, g2);
    size_t dg = 0;
    for (size_t i = 0; i < ny; i++)
        dg += memcmp(&g[i], &g2[i], sizeof(float)) != 0;
    snprintf(name, sizeof name, "matmul_fp8 T=%d %dx%d, x quantized before: %zu of %zu differ", T,
             in, out, dg, ny);
    s_check_true(name, dg == 0);
    ls_backend_cuda_set_fp8_paths(s_gpu, 1, 1, 1);
    free(g2);
    s_pb_free(&y2);
    s_pb_free(&w), s_pb_free(&ws), s_pb_free(&x), s_pb_free(&xq), s_pb_free(&xs);
    s_pb_free(&y), s_pb_free(&b);
    free(hw), free(hws), free(hx), free(hb), free(codes), free(nan), free(c), free(g);
}

static void test_embedding_gather(t_rng_t *r) {
    int vocab = 1000, C = 520, T = 17;
    s_pb_t tab = s_pb_new(LS_DTYPE_BF16, (size_t)vocab * C),
           out = s_pb_new(LS_DTYPE_F32, (size_t)T * C), pick = s_pb_new(LS_DTYPE_F32, 6 * C);
    float *ht = s_fill_new(r, (size_t)vocab * C, -1, 1), *poison = s_nan_new((size_t)T * C);
    s_pb_set(&tab, 0, ht, (size_t)vocab * C);
    s_pb_set(&out, 0, poison, (size_t)T * C);
    s_pb_set(&pick, 0, poison, 6 * C);
    static s_stepd_t d;
    s_step_simple(&d, T);
    for (int t = 0; t < T; t++)
        d.ids[t] = t_rng_int(r, vocab);
    d.ids[0] = vocab - 1;
    d.n_logit = 5;
    int32_t rows[5] = {16, 0, 3, 3, 9};
    memcpy(d.logit_rows, rows, sizeof rows);
    s_step_begin(&d);
    // the range of a tensor-parallel rank: rows [250, vocab), zero rows for smaller ids
    s_cpu->embedding(s_cpu, s_vc(&out, 0), s_vc(&tab, 0), C, 250, vocab - 250);
    s_gpu->embedding(s_gpu, s_vg(&out, 0), s_vg(&tab, 0), C, 250, vocab - 250);
    s_cpu->rows_gather(s_cpu, s_vc(&pick, C), s_vc(&out, 0), C); // leaves row 0 poisoned
    s_gpu->rows_gather(s_gpu, s_vg(&pick, C), s_vg(&out, 0), C);
    float *c = t_alloc((size_t)T * C * 4), *g = t_alloc((size_t)T * C * 4);
    s_pb_get(&out, 0, (size_t)T * C, c, g);
    s_check("embedding bf16 table rows 250..999 of 1000x520 T=17", g, c, (size_t)T * C, 0, 0);
    s_pb_get(&pick, 0, 6 * C, c, g);
    s_check("rows_gather 5 of 17 rows (dup, at offset)", g, c, 6 * C, 0, 0);
    s_pb_free(&tab), s_pb_free(&out), s_pb_free(&pick);
    free(ht), free(poison), free(c), free(g);
}

// lp (T x C of the pair a, b): the GPU's copy must be exactly its fp32 output rounded to
// bf16 (the rounding ls_cu_convert does before a matmul), the CPU's exactly its output
// (CPU buffers store f32); bf16 only, the dtype of the models served
static void s_check_lp(const char *what, s_pb_t *out, s_pb_t *lp, size_t n) {
    float *c = t_alloc(n * 4), *g = t_alloc(n * 4), *lc = t_alloc(n * 4), *lg = t_alloc(n * 4);
    s_pb_get(out, 0, n, c, g);
    s_pb_get(lp, 0, n, lc, lg);
    size_t bad_g = 0, bad_c = 0;
    for (size_t i = 0; i < n; i++) {
        bad_g += lg[i] != ls_bf16_to_f32(ls_bf16_from_f32(g[i]));
        bad_c += lc[i] != c[i];
    }
    char name[96];
    snprintf(name, sizeof name, "%s out_lp (bf16): %zu / %zu differ from out rounded", what,
             bad_g + bad_c, n);
    s_check_true(name, bad_g == 0 && bad_c == 0);
    free(c), free(g), free(lc), free(lg);
}

// An F8E4M3 lp with its scales (T rows of C of the pairs): each backend's codes and scales
// must be exactly ls_fp8_quantize_rows of that backend's own fp32 output (the values the
// CPU reference would quantize in matmul_fp8). The two outputs differ by ulps (the norm's
// sum order), so the codes of the two backends may differ by one step where a value lies
// on a rounding boundary: that count is printed, not asserted.
static void s_check_lp_fp8(const char *what, s_pb_t *out, s_pb_t *lp, s_pb_t *lps, int T,
                           int C) {
    size_t n = (size_t)T * C;
    float *c = t_alloc(n * 4), *g = t_alloc(n * 4), *lc = t_alloc(n * 4), *lg = t_alloc(n * 4);
    float *sc = t_alloc(T * 4), *sg = t_alloc(T * 4), *want_s = t_alloc(T * 4);
    uint8_t *want = t_alloc(n);
    s_pb_get(out, 0, n, c, g);
    s_pb_get(lp, 0, n, lc, lg);
    s_pb_get(lps, 0, T, sc, sg);
    size_t bad = 0, apart = 0;
    for (int k = 0; k < 2; k++) {
        const float *o = k ? g : c, *l = k ? lg : lc, *sl = k ? sg : sc;
        ls_fp8_quantize_rows(want, want_s, o, T, C);
        for (int t = 0; t < T; t++)
            bad += memcmp(&sl[t], &want_s[t], sizeof(float)) != 0;
        for (size_t i = 0; i < n; i++)
            bad += l[i] != ls_e4m3_to_f32(want[i]);
    }
    for (size_t i = 0; i < n; i++)
        apart += lc[i] * sc[i / C] != lg[i] * sg[i / C];
    char name[128];
    snprintf(name, sizeof name,
             "%s out_lp (fp8) T=%d C=%d: %zu codes/scales differ from out quantized (%zu values "
             "apart CPU/GPU)", what, T, C, bad, apart);
    s_check_true(name, bad == 0);
    free(c), free(g), free(lc), free(lg), free(sc), free(sg), free(want_s), free(want);
}

// add2: a second addend x2 folded into x (a LoRA delta left beside its projection); with
// it, an out_lp copy is asked for too, in bf16 or (fp8) as E4M3 codes with row scales
static void test_rmsnorm(t_rng_t *r, int T, int C, ls_dtype_t wdt, int residual, int alias,
                         int add2, int fp8) {
    size_t n = (size_t)T * C;
    s_pb_t x = s_pb_new(LS_DTYPE_F32, n), res = s_pb_new(LS_DTYPE_F32, n),
           out = s_pb_new(LS_DTYPE_F32, n), w = s_pb_new(wdt, C), x2 = s_pb_new(LS_DTYPE_F32, n),
           lp = s_pb_new(fp8 ? LS_DTYPE_F8E4M3 : LS_DTYPE_BF16, n),
           lps = s_pb_new(LS_DTYPE_F32, T);
    float *hx = s_fill_new(r, n, -2, 2), *hr = s_fill_new(r, n, -2, 2),
          *hw = s_fill_new(r, C, 0.5f, 1.5f), *poison = s_nan_new(n),
          *h2 = s_fill_new(r, n, -0.5f, 0.5f);
    s_pb_set(&x, 0, hx, n);
    s_pb_set(&res, 0, hr, n);
    s_pb_set(&out, 0, poison, n);
    s_pb_set(&w, 0, hw, C);
    s_pb_set(&x2, 0, h2, n);
    s_pb_t *o = alias ? &x : &out;
    int q = add2 && fp8;
    s_cpu->rmsnorm(s_cpu, s_vc(o, 0), add2 ? s_vc(&lp, 0) : LS_VIEW_NONE,
                   q ? s_vc(&lps, 0) : LS_VIEW_NONE, residual ? s_vc(&res, 0) : LS_VIEW_NONE,
                   s_vc(&x, 0), add2 ? s_vc(&x2, 0) : LS_VIEW_NONE, s_vc(&w, 0), T, C, 1e-5f);
    s_gpu->rmsnorm(s_gpu, s_vg(o, 0), add2 ? s_vg(&lp, 0) : LS_VIEW_NONE,
                   q ? s_vg(&lps, 0) : LS_VIEW_NONE, residual ? s_vg(&res, 0) : LS_VIEW_NONE,
                   s_vg(&x, 0), add2 ? s_vg(&x2, 0) : LS_VIEW_NONE, s_vg(&w, 0), T, C, 1e-5f);
    float *c = t_alloc(n * 4), *g = t_alloc(n * 4);
    char name[96];
    s_pb_get(o, 0, n, c, g);
    snprintf(name, sizeof name, "rmsnorm w=%s T=%d C=%d%s%s%s%s", s_dtn(wdt), T, C,
             residual ? " +residual" : "", add2 ? " +x2" : "", alias ? " out=x" : "",
             q ? " +fp8" : "");
    s_check(name, g, c, n, 1e-10, 1e-4);
    if (residual) {
        s_pb_get(&res, 0, n, c, g);
        snprintf(name, sizeof name, "rmsnorm T=%d C=%d: residual += x%s", T, C,
                 add2 ? " + x2" : "");
        s_check(name, g, c, n, 0, 0);
    }
    if (q)
        s_check_lp_fp8("rmsnorm", o, &lp, &lps, T, C);
    else if (add2)
        s_check_lp("rmsnorm", o, &lp, n);
    s_pb_free(&x), s_pb_free(&res), s_pb_free(&out), s_pb_free(&w), s_pb_free(&x2),
        s_pb_free(&lp), s_pb_free(&lps);
    free(hx), free(hr), free(hw), free(poison), free(h2), free(c), free(g);
}

static void test_rmsnorm_heads(t_rng_t *r) {
    int T = 11, H = 8, D = 128, stride = H * D + 2 * 2 * D;
    size_t n = (size_t)T * stride;
    s_pb_t x = s_pb_new(LS_DTYPE_F32, n), w = s_pb_new(LS_DTYPE_BF16, D);
    float *hx = s_fill_new(r, n, -2, 2), *hw = s_fill_new(r, D, 0.5f, 1.5f);
    s_pb_set(&x, 0, hx, n);
    s_pb_set(&w, 0, hw, D);
    // the k heads of a stacked qkv row: offset H*D, 2 heads
    s_cpu->rmsnorm_heads(s_cpu, s_vc(&x, (size_t)H * D), s_vc(&w, 0), T, 2, D, stride, 1e-6f);
    s_gpu->rmsnorm_heads(s_gpu, s_vg(&x, (size_t)H * D), s_vg(&w, 0), T, 2, D, stride, 1e-6f);
    s_cpu->rmsnorm_heads(s_cpu, s_vc(&x, 0), s_vc(&w, 0), T, H, D, stride, 1e-6f);
    s_gpu->rmsnorm_heads(s_gpu, s_vg(&x, 0), s_vg(&w, 0), T, H, D, stride, 1e-6f);
    float *c = t_alloc(n * 4), *g = t_alloc(n * 4);
    s_pb_get(&x, 0, n, c, g);
    s_check("rmsnorm_heads q (8x128) and k (2x128) in stacked rows", g, c, n, 1e-10, 1e-4);
    s_pb_free(&x), s_pb_free(&w);
    free(hx), free(hw), free(c), free(g);
}

// RoPE and the KV store in one op, H query heads and KV key heads (their sum and KV's a
// multiple of the kernel's 8-head blocks or not) in rows with a pad column or two (NaN, must
// stay so), T tokens at positions up to 131072, the last and about a quarter of the others
// on slot -1 (stored nowhere) where T > 1, the caches in pages as the pool holds them (a
// block of K, of V and of another layer's K per page), cdt the caches' dtype, a delta added
// first or none. x (q and k rotated in place, v as it was): rope's bound, the CPU's sin and
// cos against sincosf. The caches exactly: the v rows are the CPU's v (+ delta) rounded to
// cdt as the host rounds, the k rows the GPU's own rotated k (its x, checked just before)
// rounded so, every other element as uploaded — a store at a wrong slot, head or page, an
// unrounded or twice-rounded value fails.
static void test_rope_kv_store(t_rng_t *r, ls_rope_type_t type, int T, int H, int KV, int D,
                               ls_dtype_t cdt, int with_delta) {
    int bs = 16, kvd = KV * D, width = (H + 2 * KV) * D, stride = width + 1 + T % 2;
    int num_blocks = (T + bs - 1) / bs + 2;
    size_t n = (size_t)T * stride, bn = (size_t)bs * kvd, bstride = 3 * bn,
           nc = (size_t)num_blocks * bstride;
    ls_rope_config_t cfg = {type, 500000.0, 8.0, 1.0, 4.0, 8192.0};
    float inv[256];
    ls_rope_inv_freq_init(inv, D, &cfg);
    s_pb_t x = s_pb_new(LS_DTYPE_F32, n), fi = s_pb_new(LS_DTYPE_F32, D / 2),
           dx = s_pb_new(LS_DTYPE_F32, n), kvb = s_pb_new(cdt, nc);
    float *hx = s_fill_new(r, n, -1, 1), *hd = s_fill_new(r, n, -0.1f, 0.1f),
          *hk = s_fill_new(r, nc, -1, 1);
    for (int t = 0; t < T; t++)
        for (int i = width; i < stride; i++)
            hx[(size_t)t * stride + i] = NAN;
    s_pb_set(&x, 0, hx, n);
    s_pb_set(&dx, 0, hd, n);
    s_pb_set(&fi, 0, inv, D / 2);
    s_pb_set(&kvb, 0, hk, nc);
    static s_stepd_t d;
    s_step_simple(&d, T);
    int32_t *perm = t_alloc((size_t)num_blocks * bs * 4);
    for (int i = 0; i < num_blocks * bs; i++)
        perm[i] = i;
    t_shuffle(r, perm, num_blocks * bs); // distinct slots in no order
    for (int t = 0; t < T; t++) {
        d.pos[t] = t < 4 ? t : t_rng_int(r, 131072);
        d.slot[t] = T > 1 && (t == T - 1 || t_rng_int(r, 4) == 0) ? -1 : perm[t];
    }
    s_step_begin(&d);
    ls_view_t dc = with_delta ? s_vc(&dx, 0) : LS_VIEW_NONE,
              dg = with_delta ? s_vg(&dx, 0) : LS_VIEW_NONE;
    s_cpu->rope_kv_store(s_cpu, s_vc(&x, 0), dc, s_vc(&fi, 0), s_vc(&kvb, 0), s_vc(&kvb, bn), H,
                         KV, D, stride, bs, bstride);
    s_gpu->rope_kv_store(s_gpu, s_vg(&x, 0), dg, s_vg(&fi, 0), s_vg(&kvb, 0), s_vg(&kvb, bn), H,
                         KV, D, stride, bs, bstride);
    float *cx = t_alloc(n * 4), *gx = t_alloc(n * 4), *c = t_alloc(nc * 4), *g = t_alloc(nc * 4);
    s_pb_get(&x, 0, n, cx, gx);
    char name[160];
    snprintf(name, sizeof name, "rope_kv_store %s T=%d %d+%d+%d heads of %d%s: x",
             type == LS_ROPE_LLAMA3 ? "llama3" : "default", T, H, KV, KV, D,
             with_delta ? " + delta" : "");
    s_check(name, gx, cx, n, 1e-10, 1e-4);
    s_pb_get(&kvb, 0, nc, c, g);
    for (int t = 0; t < T; t++) {
        if (d.slot[t] < 0)
            continue;
        size_t at = (size_t)(d.slot[t] / bs) * bstride + (size_t)(d.slot[t] % bs) * kvd;
        memcpy(c + at, gx + (size_t)t * stride + (size_t)H * D, (size_t)kvd * 4);
    }
    s_round_all(cdt, c, nc);
    snprintf(name, sizeof name, "rope_kv_store T=%d %d+%d+%d heads of %d cache=%s%s: pages",
             T, H, KV, KV, D, s_dtn(cdt), with_delta ? " + delta" : "");
    s_check(name, g, c, nc, 0, 0);
    s_pb_free(&x), s_pb_free(&fi), s_pb_free(&dx), s_pb_free(&kvb);
    free(hx), free(hd), free(hk), free(perm), free(cx), free(gx), free(c), free(g);
}

// inter: a multiple of 4 (the float4 kernel) or not (the scalar one)
static void test_silu_add(t_rng_t *r, int inter) {
    int T = 7;
    size_t n = (size_t)T * inter;
    char name[96];
    s_pb_t gu = s_pb_new(LS_DTYPE_F32, 2 * n), out = s_pb_new(LS_DTYPE_F32, n + 5);
    float *hg = s_fill_new(r, 2 * n, -6, 6), *poison = s_nan_new(n + 5);
    s_pb_set(&gu, 0, hg, 2 * n);
    s_pb_set(&out, 0, poison, n + 5);
    s_cpu->silu_mul(s_cpu, s_vc(&out, 0), LS_VIEW_NONE, LS_VIEW_NONE, s_vc(&gu, 0), LS_VIEW_NONE,
                    T, inter);
    s_gpu->silu_mul(s_gpu, s_vg(&out, 0), LS_VIEW_NONE, LS_VIEW_NONE, s_vg(&gu, 0), LS_VIEW_NONE,
                    T, inter);
    float *c = t_alloc((2 * n + 5) * 4), *g = t_alloc((2 * n + 5) * 4);
    s_pb_get(&out, 0, n + 5, c, g);
    snprintf(name, sizeof name, "silu_mul T=7 inter=%d (+5 untouched)", inter);
    s_check(name, g, c, n + 5, 1e-10, 1e-5);
    // a LoRA delta folded into gate_up
    s_pb_t dl = s_pb_new(LS_DTYPE_F32, 2 * n);
    float *hd = s_fill_new(r, 2 * n, -1, 1);
    s_pb_set(&dl, 0, hd, 2 * n);
    s_pb_set(&out, 0, poison, n + 5);
    s_pb_t lp = s_pb_new(LS_DTYPE_BF16, n);
    s_cpu->silu_mul(s_cpu, s_vc(&out, 0), s_vc(&lp, 0), LS_VIEW_NONE, s_vc(&gu, 0), s_vc(&dl, 0),
                    T, inter);
    s_gpu->silu_mul(s_gpu, s_vg(&out, 0), s_vg(&lp, 0), LS_VIEW_NONE, s_vg(&gu, 0), s_vg(&dl, 0),
                    T, inter);
    s_pb_get(&out, 0, n + 5, c, g);
    snprintf(name, sizeof name, "silu_mul T=7 inter=%d +delta (+5 untouched)", inter);
    s_check(name, g, c, n + 5, 1e-10, 1e-5);
    s_check_lp("silu_mul", &out, &lp, n);
    // the FP8 down projection's input: codes and row scales beside out (one block a row)
    s_pb_t lq = s_pb_new(LS_DTYPE_F8E4M3, n), lqs = s_pb_new(LS_DTYPE_F32, T);
    s_pb_set(&out, 0, poison, n + 5);
    s_cpu->silu_mul(s_cpu, s_vc(&out, 0), s_vc(&lq, 0), s_vc(&lqs, 0), s_vc(&gu, 0),
                    s_vc(&dl, 0), T, inter);
    s_gpu->silu_mul(s_gpu, s_vg(&out, 0), s_vg(&lq, 0), s_vg(&lqs, 0), s_vg(&gu, 0),
                    s_vg(&dl, 0), T, inter);
    s_pb_get(&out, 0, n + 5, c, g);
    snprintf(name, sizeof name, "silu_mul T=7 inter=%d +delta +fp8 (+5 untouched)", inter);
    s_check(name, g, c, n + 5, 1e-10, 1e-5);
    s_check_lp_fp8("silu_mul", &out, &lq, &lqs, T, inter);
    s_pb_free(&dl), s_pb_free(&lp), s_pb_free(&lq), s_pb_free(&lqs);
    free(hd);
    float *hx = s_fill_new(r, n, -1, 1); // identical inputs: silu's outputs differ by ulps
    s_pb_set(&out, 0, hx, n);
    free(hx);
    s_cpu->add(s_cpu, s_vc(&gu, 3), s_vc(&out, 0), n);
    s_gpu->add(s_gpu, s_vg(&gu, 3), s_vg(&out, 0), n);
    s_pb_get(&gu, 0, 2 * n, c, g);
    snprintf(name, sizeof name, "add n=%zu at offset", n);
    s_check(name, g, c, 2 * n, 0, 0);
    s_pb_free(&gu), s_pb_free(&out);
    free(hg), free(poison), free(c), free(g);
}

// decode_block (kernels/cuda/block.cu) on the GPU against the ops it stands for on the CPU,
// one token: o; x += y and the RMSNorm; gate_up; SiLU·mul; down; and with a next layer x += y,
// the RMSNorm and q,k,v. Both round h and act to bf16 (the GPU's from fp32 sums in another
// order, so a rounding may flip): the bound is the BF16 matmul's. The GPU must take the op
// (returns 1) and count a launch; with the block turned off it declines.
static void test_decode_block(t_rng_t *r, int H, int q_dim, int inter, int qkv_dim, int next,
                              int bias) {
    s_stepd_t d;
    s_step_simple(&d, 1);
    s_step_begin(&d);
    const ls_dtype_t B16 = LS_DTYPE_BF16, F32 = LS_DTYPE_F32;
    size_t I2 = 2 * (size_t)inter;
    s_pb_t a = s_pb_new(B16, q_dim), wo = s_pb_new(B16, (size_t)H * q_dim), g2 = s_pb_new(B16, H),
           wgu = s_pb_new(B16, I2 * H), wd = s_pb_new(B16, (size_t)H * inter), g1 = s_pb_new(B16, H),
           wq = s_pb_new(B16, (size_t)qkv_dim * H), bo = s_pb_new(B16, H), bgu = s_pb_new(B16, I2),
           bd = s_pb_new(B16, H), bq = s_pb_new(B16, qkv_dim), x = s_pb_new(F32, H),
           y = s_pb_new(F32, H), qkv = s_pb_new(F32, qkv_dim), x1 = s_pb_new(F32, H),
           hl = s_pb_new(B16, H), gu = s_pb_new(F32, I2), act = s_pb_new(B16, inter);
    struct {
        s_pb_t *b;
        size_t n;
        float lo, hi;
    } fills[] = {{&a, q_dim, -1, 1},
                 {&wo, (size_t)H * q_dim, -1.5f / sqrtf(q_dim), 1.5f / sqrtf(q_dim)},
                 {&g2, H, 0.5f, 1.5f},
                 {&wgu, I2 * H, -1.5f / sqrtf(H), 1.5f / sqrtf(H)},
                 {&wd, (size_t)H * inter, -1.5f / sqrtf(inter), 1.5f / sqrtf(inter)},
                 {&g1, H, 0.5f, 1.5f},
                 {&wq, (size_t)qkv_dim * H, -1.5f / sqrtf(H), 1.5f / sqrtf(H)},
                 {&bo, H, -0.5f, 0.5f},
                 {&bgu, I2, -0.5f, 0.5f},
                 {&bd, H, -0.5f, 0.5f},
                 {&bq, qkv_dim, -0.5f, 0.5f},
                 {&x, H, -1, 1}};
    for (size_t i = 0; i < sizeof fills / sizeof fills[0]; i++) {
        float *h = s_fill_new(r, fills[i].n, fills[i].lo, fills[i].hi);
        s_pb_set(fills[i].b, 0, h, fills[i].n);
        free(h);
    }
    float *poison = s_nan_new(I2 > (size_t)qkv_dim ? I2 : (size_t)qkv_dim);
    s_pb_set(&y, 0, poison, H);
    s_pb_set(&qkv, 0, poison, qkv_dim);
#define V(pb) s_vc(&(pb), 0)
    ls_view_t nb = LS_VIEW_NONE;
    s_cpu->matmul(s_cpu, V(y), V(a), V(wo), bias ? V(bo) : nb, 1, q_dim, H, 0);
    s_cpu->rmsnorm(s_cpu, nb, V(hl), nb, V(x), V(y), nb, V(g2), 1, H, 1e-5f);
    s_cpu->matmul(s_cpu, V(gu), V(hl), V(wgu), bias ? V(bgu) : nb, 1, H, (int)I2, 0);
    s_cpu->silu_mul(s_cpu, nb, V(act), nb, V(gu), nb, 1, inter);
    s_cpu->matmul(s_cpu, V(y), V(act), V(wd), bias ? V(bd) : nb, 1, inter, H, 0);
    if (next) {
        s_cpu->rmsnorm(s_cpu, nb, V(hl), nb, V(x), V(y), nb, V(g1), 1, H, 1e-5f);
        s_cpu->matmul(s_cpu, V(qkv), V(hl), V(wq), bias ? V(bq) : nb, 1, H, qkv_dim, 0);
    }
#undef V
#define V(pb) s_vg(&(pb), 0)
    ls_decode_block_t b = {.a = V(a), .w_o = V(wo), .b_o = bias ? V(bo) : LS_VIEW_NONE,
                           .g2 = V(g2), .w_gu = V(wgu), .b_gu = bias ? V(bgu) : LS_VIEW_NONE,
                           .w_d = V(wd), .b_d = bias ? V(bd) : LS_VIEW_NONE,
                           .g1 = next ? V(g1) : LS_VIEW_NONE, .w_qkv = next ? V(wq) : LS_VIEW_NONE,
                           .b_qkv = next && bias ? V(bq) : LS_VIEW_NONE, .x = V(x), .y = V(y),
                           .qkv = V(qkv), .x1 = V(x1), .act = V(act), .H = H, .q_dim = q_dim,
                           .inter = inter, .qkv_dim = qkv_dim, .eps = 1e-5f};
#undef V
    char name[128];
    ls_backend_cuda_set_block(s_gpu, 0);
    snprintf(name, sizeof name, "decode_block H=%d: declined when turned off", H);
    s_check_true(name, s_gpu->decode_block(s_gpu, &b) == 0);
    ls_backend_cuda_set_block(s_gpu, 1);
    long before = ls_backend_cuda_block_count(s_gpu);
    int ran = s_gpu->decode_block(s_gpu, &b);
    snprintf(name, sizeof name, "decode_block H=%d q=%d inter=%d qkv=%d%s%s: ran", H, q_dim, inter,
             qkv_dim, next ? " next" : "", bias ? " bias" : "");
    s_check_true(name, ran == 1 && ls_backend_cuda_block_count(s_gpu) == before + 1);
    float *c = t_alloc((I2 + qkv_dim + H) * 4), *g = t_alloc((I2 + qkv_dim + H) * 4);
    const struct {
        s_pb_t *b;
        int n;
        const char *what;
    } outs[] = {{&x, H, "x"}, {&y, H, "y (down)"}, {&qkv, next ? qkv_dim : 0, "qkv"}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) {
        if (!outs[i].n)
            continue;
        s_pb_get(outs[i].b, 0, outs[i].n, c, g);
        snprintf(name, sizeof name, "decode_block H=%d q=%d inter=%d qkv=%d%s%s: %s", H, q_dim,
                 inter, qkv_dim, next ? " next" : "", bias ? " bias" : "", outs[i].what);
        s_check(name, g, c, outs[i].n, 5e-5, 5e-2);
    }
    s_pb_t *all[] = {&a, &wo, &g2, &wgu, &wd, &g1, &wq, &bo, &bgu, &bd, &bq, &x, &y, &qkv, &x1, &hl,
                     &gu, &act};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        s_pb_free(all[i]);
    free(poison), free(c), free(g);
}

// -- KV cache and attention ---------------------------------------------------------------

// Whether the warpgroup prefill kernel must run here for head_dim D: a compute capability 9.0
// device (the build holds sm_90a code) and D 128.
static int s_wgmma_here(int D) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) {
        fprintf(stderr, "compute capability: query failed\n");
        exit(2);
    }
    return D == 128 && major == 9 && minor == 0;
}

// S sequences with n_cached[s] cached and n_new[s] new tokens; pad adds one padding token
// (slot -1) as a sequence of its own; q uniform in [-qr, qr], k and v in [-1, 1].
//
// The backend gives the sequences ls_cu_attention_prefill_pick picks for the kernel that runs
// (ls_cu_attention_prefill_which) to the prefill kernel where ls_cu_attention_prefill_ok,
// every other token to the decode-shaped kernels; the rows of each are checked on their own,
// against their own bounds (a row of the wrong kernel fails the decode-shaped bound by orders
// of magnitude where the prefill kernel wrote it; the other way, the prefill rows must be
// above that bound, as rows the decode-shaped kernels wrote are not), and each of the two
// prefill kernels runs on the picked sequences alone (s_prefill_kernels):
// - decode-shaped (fp32-exact products, fp32 sums in another order): NMSE <= 1e-10, max |Δ|
//   <= 1e-4;
// - prefill: q and p rounded to bf16, relative error up to u = 2^-8 each (rms ~0.4u = 1.6e-3
//   over a spread of mantissas). The output is a convex combination of V rows (weights from
//   the rounded p), so out - ref ≈ Σ_j w_j (δ_j + Δs_j) (v_j - ref), with δ_j p's rounding and
//   Δs_j the score's error from q's (rms 0.4u · |q·k| / sqrt(D), ~ 0.4u · qr / 3 here). Its
//   mean square against ref's is E[δ² + Δs²] ≈ (0.4u)² (1 + qr² / 9) ≈ 2.5e-6 (1 + qr² / 9):
//   NMSE <= 2e-5 (1 + qr² / 9), 8 times that. Per element, |out - ref| <= max|δ + Δs| ·
//   max|v_j - ref| with max|v_j - ref| <= 2; the largest of the test's ~10^6 products keep
//   max|δ + Δs| under 2u (1 + qr): max |Δ| <= 4u (1 + qr) = 0.0156 (1 + qr). A wrong mask, key
//   or page moves rows by O(|out|) and fails either bound by orders of magnitude.
// Each prefill kernel on the sequences the pick took (pick, n_pick over d's step), run
// explicitly: ls_cu_attention_prefill runs one of them per device (the warpgroup one on an
// sm_90 card for head_dim 128), so the mma.sync one, production on sm_80 .. sm_89, is tested
// here too. Each writes those rows (against ref, the CPU's output, at test_attention's
// bound) and no other (the rest stay NaN). The warpgroup kernel must run exactly on a
// compute capability 9.0 device with head_dim 128 (s_wgmma_here), and say
// cudaErrorNotSupported elsewhere; ls_cu_attention_prefill_which must name it exactly there.
static void s_prefill_kernels(const char *what, const s_stepd_t *d, const int32_t *pick, int n_pick,
                              const float *ref, float *d_out, const float *d_q, const void *d_kc,
                              const void *d_vc, int H, int KV, int D, int bs, int stride,
                              size_t bstride, float qr) {
    size_t row = (size_t)H * D, no = (size_t)d->T * row;
    float *want = s_nan_new(no), *got = t_alloc(no * 4), *poison = s_nan_new(no);
    int max_q = 0;
    for (int k = 0; k < n_pick; k++) {
        memcpy(want + pick[3 * k + 1] * row, ref + pick[3 * k + 1] * row,
               pick[3 * k + 2] * row * 4);
        max_q = pick[3 * k + 2] > max_q ? pick[3 * k + 2] : max_q;
    }
    int32_t *d_pick, *d_pos, *d_tab;
    size_t ntab = (size_t)d->S * d->max_blocks;
    if (cudaMalloc((void **)&d_pick, (size_t)n_pick * 12) ||
        cudaMalloc((void **)&d_pos, (size_t)d->T * 4) || cudaMalloc((void **)&d_tab, ntab * 4) ||
        cudaMemcpy(d_pick, pick, (size_t)n_pick * 12, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_pos, d->pos, (size_t)d->T * 4, cudaMemcpyHostToDevice) ||
        cudaMemcpy(d_tab, d->tables, ntab * 4, cudaMemcpyHostToDevice)) {
        fprintf(stderr, "prefill kernels: device set-up failed\n");
        exit(2);
    }
    static const struct {
        ls_cu_prefill_kernel_t which;
        const char *name;
    } kernels[] = {{LS_CU_PREFILL_MMA, "mma.sync"}, {LS_CU_PREFILL_WGMMA, "wgmma"}};
    for (int i = 0; i < 2; i++) {
        int runs = kernels[i].which == LS_CU_PREFILL_MMA || s_wgmma_here(D);
        char name[160];
        if (cudaMemcpy(d_out, poison, no * 4, cudaMemcpyHostToDevice)) {
            fprintf(stderr, "prefill kernels: upload failed\n");
            exit(2);
        }
        cudaError_t e = ls_cu_attention_prefill_kernel(d_out, LS_CU_F32, d_q, d_kc, d_vc, LS_CU_BF16, d_pick,
                                                       n_pick, max_q, d_pos, d_tab, d->max_blocks,
                                                       H, KV, D, bs, stride, bstride,
                                                       kernels[i].which, 0);
        if (!runs) {
            snprintf(name, sizeof name, "%s: prefill kernel %s not run here", what,
                     kernels[i].name);
            s_check_true(name, e == cudaErrorNotSupported);
            continue;
        }
        if (e || cudaDeviceSynchronize() ||
            cudaMemcpy(got, d_out, no * 4, cudaMemcpyDeviceToHost)) {
            fprintf(stderr, "prefill kernel %s failed: %s\n", kernels[i].name,
                    cudaGetErrorString(e ? e : cudaGetLastError()));
            exit(2);
        }
        snprintf(name, sizeof name, "attention %s H=%d KV=%d D=%d bs=%d prefill %s", what, H, KV, D,
                 bs, kernels[i].name);
        s_check(name, got, want, no, 2e-5 * (1 + qr * qr / 9), 0.0156 * (1 + qr));
    }
    char name[160];
    snprintf(name, sizeof name, "%s: ls_cu_attention_prefill_which(%d) is the kernel that runs",
             what, D);
    s_check_true(name, ls_cu_attention_prefill_which(D) ==
                           (s_wgmma_here(D) ? LS_CU_PREFILL_WGMMA : LS_CU_PREFILL_MMA));
    cudaFree(d_pick), cudaFree(d_pos), cudaFree(d_tab);
    free(want), free(got), free(poison);
}

static int test_attention(t_rng_t *r, const char *what, int S, const int *n_cached,
                          const int *n_new, int H, int KV, int D, int bs, ls_dtype_t cdt,
                          int pad, float qr) {
    static s_stepd_t d;
    memset(&d, 0, sizeof d);
    int max_ctx = 1;
    for (int s = 0; s < S; s++)
        max_ctx = n_cached[s] + n_new[s] > max_ctx ? n_cached[s] + n_new[s] : max_ctx;
    int max_blocks = (max_ctx + bs - 1) / bs, n_seq = S + (pad ? 1 : 0);
    int num_blocks = n_seq * max_blocks + 3;
    int32_t *perm = t_alloc(num_blocks * 4);
    for (int i = 0; i < num_blocks; i++)
        perm[i] = i;
    t_shuffle(r, perm, num_blocks); // block tables are never contiguous
    int T = 0;
    for (int s = 0; s < n_seq; s++)
        T += s < S ? n_new[s] : 1;
    if (n_seq * max_blocks > MAXTAB || n_seq > MAXS || T > MAXT) {
        fprintf(stderr, "attention test too large\n");
        exit(2);
    }
    T = 0;
    for (int s = 0; s < n_seq; s++) {
        for (int b = 0; b < max_blocks; b++)
            d.tables[s * max_blocks + b] = perm[s * max_blocks + b];
        int nc = s < S ? n_cached[s] : 0, nn = s < S ? n_new[s] : 1;
        for (int j = nc; j < nc + nn; j++, T++) {
            d.pos[T] = j;
            d.slot[T] = s < S ? d.tables[s * max_blocks + j / bs] * bs + j % bs : -1;
        }
        d.q_indptr[s + 1] = T;
        d.ctx[s] = nc + nn;
    }
    d.T = T;
    d.S = n_seq;
    d.max_blocks = max_blocks;
    d.max_ctx = max_ctx;
    s_step_begin(&d);

    int stride = (H + 2 * KV) * D, kvd = KV * D;
    // the caches as the pool of pages holds them (docs/memory.md): a block of K, of V and of
    // another layer's K per page, so a kernel that took the blocks as contiguous reads the
    // wrong rows and one that wrote there changes the other layer's
    size_t bn = (size_t)bs * kvd, bstride = 3 * bn;
    size_t nq = (size_t)T * stride, nc = (size_t)num_blocks * bstride, no = (size_t)T * H * D;
    s_pb_t qkv = s_pb_new(LS_DTYPE_F32, nq), kvb = s_pb_new(cdt, nc), out = s_pb_new(LS_DTYPE_F32, no);
    float *hq = s_fill_new(r, nq, -qr, qr), *hk = s_fill_new(r, nc, -1, 1), *poison = s_nan_new(no);
    if (cdt != LS_DTYPE_F32) // k, v values the cache dtype holds exactly: the store is a copy
        for (int t = 0; t < T; t++)
            s_round_all(cdt, hq + (size_t)t * stride + (size_t)H * D, 2 * kvd);
    s_pb_set(&qkv, 0, hq, nq);
    s_pb_set(&kvb, 0, hk, nc);
    s_pb_set(&out, 0, poison, no);
    size_t vo = (size_t)H * D + kvd;
    // with an f32 cache, v gets a delta added on the way in (the folded LoRA of
    // engine/model.c; zero over q and k); narrower caches round v + delta where the CPU
    // backend's f32 cache does not, so there the store stays a copy. The caches fill through
    // rope_kv_store with inv_freq 0: angle 0 at every position, a rotation by the identity
    // (a·1 - b·0 = a exactly), so q and k stay the values above (rope_kv_store's own rows
    // check the rotation)
    s_pb_t dv = s_pb_new(LS_DTYPE_F32, nq), fi = s_pb_new(LS_DTYPE_F32, D / 2);
    float *hdv = s_fill_new(r, nq, -0.1f, 0.1f), *zero = t_alloc((size_t)D / 2 * 4);
    for (int t = 0; t < T; t++)
        memset(hdv + (size_t)t * stride, 0, vo * 4);
    memset(zero, 0, (size_t)D / 2 * 4);
    s_pb_set(&dv, 0, hdv, nq);
    s_pb_set(&fi, 0, zero, D / 2);
    int with_dv = cdt == LS_DTYPE_F32;
    s_cpu->rope_kv_store(s_cpu, s_vc(&qkv, 0), with_dv ? s_vc(&dv, 0) : LS_VIEW_NONE,
                         s_vc(&fi, 0), s_vc(&kvb, 0), s_vc(&kvb, bn), H, KV, D, stride, bs,
                         bstride);
    s_gpu->rope_kv_store(s_gpu, s_vg(&qkv, 0), with_dv ? s_vg(&dv, 0) : LS_VIEW_NONE,
                         s_vg(&fi, 0), s_vg(&kvb, 0), s_vg(&kvb, bn), H, KV, D, stride, bs,
                         bstride);
    s_cpu->attention(s_cpu, s_vc(&out, 0), s_vc(&qkv, 0), s_vc(&kvb, 0), s_vc(&kvb, bn), H, KV,
                     D, bs, stride, bstride);
    s_gpu->attention(s_gpu, s_vg(&out, 0), s_vg(&qkv, 0), s_vg(&kvb, 0), s_vg(&kvb, bn), H, KV,
                     D, bs, stride, bstride);
    float *c = t_alloc(nc * 4), *g = t_alloc(nc * 4);
    char name[96];
    s_pb_get(&kvb, 0, nc, c, g);
    snprintf(name, sizeof name, "rope_kv_store %s cache=%s: k, v%s in pages", what, s_dtn(cdt),
             with_dv ? " + delta" : "");
    s_check(name, g, c, nc, 0, 0);
    float *co = t_alloc(no * 4), *go = t_alloc(no * 4);
    s_pb_get(&out, 0, no, co, go);
    // the same call writing 16-bit rows, as for the o projection's matmul (engine/model.c):
    // exactly the fp32 rows rounded, every row written (NaN before)
    for (int k = 0; k < 2; k++) {
        ls_dtype_t ldt = k ? LS_DTYPE_F16 : LS_DTYPE_BF16;
        s_pb_t lo = s_pb_new(ldt, no);
        s_pb_set(&lo, 0, poison, no);
        s_gpu->attention(s_gpu, s_vg(&lo, 0), s_vg(&qkv, 0), s_vg(&kvb, 0), s_vg(&kvb, bn), H,
                         KV, D, bs, stride, bstride);
        float *want = t_alloc(no * 4), *lc = t_alloc(no * 4), *lg = t_alloc(no * 4);
        memcpy(want, go, no * 4);
        s_round_all(ldt, want, no);
        s_pb_get(&lo, 0, no, lc, lg);
        snprintf(name, sizeof name, "attention %s H=%d KV=%d D=%d %s: %s rows are the f32 rows "
                 "rounded", what, H, KV, D, s_dtn(cdt), s_dtn(ldt));
        s_check(name, lg, want, no, 0, 0);
        s_pb_free(&lo);
        free(want), free(lc), free(lg);
    }
    // the rows of each kernel, gathered apart (pc, pg: prefill; co, go keep the rest)
    void *gk = kvb.g->data, *gv = (char *)kvb.g->data + bn * ls_dtype_size(cdt);
    int pf_ok = ls_cu_attention_prefill_ok(out.g->data, qkv.g->data, gk, gv, (ls_cu_dtype_t)cdt,
                                           H, KV, D, stride);
    size_t row = (size_t)H * D, nd = 0, np = 0;
    float *pc = t_alloc(no * 4), *pg = t_alloc(no * 4);
    int32_t pick[3 * MAXS];
    char taken[MAXS] = {0};
    int n_pick = pf_ok ? ls_cu_attention_prefill_pick(d.q_indptr, d.ctx, n_seq,
                                                      ls_cu_attention_prefill_which(D), pick)
                       : 0;
    for (int k = 0; k < n_pick; k++)
        taken[pick[3 * k]] = 1;
    if (n_pick)
        s_prefill_kernels(what, &d, pick, n_pick, co, out.g->data, qkv.g->data, gk, gv, H, KV,
                          D, bs, stride, bstride, qr);
    for (int s = 0; s < n_seq; s++) {
        int prefill = taken[s];
        for (int t = d.q_indptr[s]; t < d.q_indptr[s + 1]; t++) {
            float *dc = prefill ? pc + np : co + nd, *dg = prefill ? pg + np : go + nd;
            memmove(dc, co + t * row, row * 4);
            memmove(dg, go + t * row, row * 4);
            *(prefill ? &np : &nd) += row;
        }
    }
    if (nd) {
        snprintf(name, sizeof name, "attention %s H=%d KV=%d D=%d bs=%d %s", what, H, KV, D,
                 bs, s_dtn(cdt));
        s_check(name, go, co, nd, 1e-10, 1e-4);
    }
    if (np) {
        snprintf(name, sizeof name, "attention %s H=%d KV=%d D=%d bs=%d %s prefill rows", what,
                 H, KV, D, bs, s_dtn(cdt));
        double nmse =
            s_check(name, pg, pc, np, 2e-5 * (1 + qr * qr / 9), 0.0156 * (1 + qr))->nmse;
        snprintf(name, sizeof name, "attention %s H=%d KV=%d D=%d: prefill rows not fp32-exact",
                 what, H, KV, D);
        s_check_true(name, nmse > 1e-10);
    }
    s_pb_free(&qkv), s_pb_free(&kvb), s_pb_free(&out), s_pb_free(&dv), s_pb_free(&fi);
    free(perm), free(hq), free(hk), free(hdv), free(zero), free(poison), free(c), free(g);
    free(co), free(go), free(pc), free(pg);
    return n_pick;
}

// Prefill attention beside the decode-shaped kernels in one call: S sequences of H / KV
// heads, D, pages of bs, in random order — decodes on up to max_ctx cached tokens, short
// chunks (fewer than LS_CU_PREFILL_MIN_Q new tokens), and chunks of LS_CU_PREFILL_MIN_Q ..
// max_new new tokens on a cached prefix of up to max_ctx (some with none), of which the pick
// gives the prefill kernel a prompt of LS_CU_PREFILL_MIN_Q tokens, max_new on max_ctx and
// the others it finds cheaper there (max_new >= 150 here; checked).
static void test_attention_prefill(t_rng_t *r, int S, int max_new, int max_ctx, int H, int KV,
                                   int D, int bs, float qr) {
    int nc[MAXS], nn[MAXS];
    for (int s = 0; s < S; s++) {
        int kind = s < 3 ? s : t_rng_int(r, 3); // one of each kind at least
        nc[s] = t_rng_int(r, max_ctx + 1);
        if (kind == 0)
            nn[s] = 1;
        else if (kind == 1)
            nn[s] = 2 + t_rng_int(r, LS_CU_PREFILL_MIN_Q - 2);
        else
            nn[s] = LS_CU_PREFILL_MIN_Q + t_rng_int(r, max_new - LS_CU_PREFILL_MIN_Q + 1);
    }
    nc[t_rng_int(r, S)] = 0;
    // the longest context, of max_new tokens: its pairs alone make the prefill kernel the
    // cheaper, so the pick takes it and every candidate of a shorter context — a prompt of
    // LS_CU_PREFILL_MIN_Q tokens among them
    nc[2] = 0, nn[2] = LS_CU_PREFILL_MIN_Q;
    nc[3] = max_ctx, nn[3] = max_new;
    for (int s = S - 1; s > 0; s--) { // in no order
        int j = t_rng_int(r, s + 1), a = nc[s], b = nn[s];
        nc[s] = nc[j], nn[s] = nn[j], nc[j] = a, nn[j] = b;
    }
    char what[64], name[160];
    snprintf(what, sizeof what, "prefill mix x%d qr=%g", S, qr);
    int n = test_attention(r, what, S, nc, nn, H, KV, D, bs, LS_DTYPE_BF16, 1, qr);
    snprintf(name, sizeof name, "%s: %d sequences to the prefill kernel", what, n);
    s_check_true(name, n > 0);
}

// ls_cu_attention_prefill_pick (host code) with each kernel's constants, on the shapes
// dev_prefill measured on an H100 — one chunk on 2,048 cached tokens: the decode-shaped
// kernel faster at 64 queries, mma.sync at 128, wgmma at 80; a prompt of 150 a near-tie on
// mma.sync (left to the fp32-exact kernel), 1.5 x faster on wgmma — and the cases its cost
// model is for: prompts alone (from 192 tokens on mma.sync, 144 on wgmma), chunks on like
// prefixes together (each from ~1/k of one chunk's queries), a short chunk on a far longer
// context left out. want: the sequences taken, bit k for ls_cu_prefill_kernel_t k (1:
// mma.sync, 2: wgmma, 3: both).
static void test_prefill_pick(void) {
    static const struct {
        const char *name;
        int S, nc[9], nn[9], want[9];
    } cases[] = {
        {"64 on 2048", 1, {2048}, {64}, {0}},
        {"73 on 2048", 1, {2048}, {73}, {0}},
        {"74 on 2048", 1, {2048}, {74}, {2}},
        {"80 on 2048", 1, {2048}, {80}, {2}},
        {"98 on 2048", 1, {2048}, {98}, {2}},
        {"99 on 2048", 1, {2048}, {99}, {3}},
        {"128 on 2048", 1, {2048}, {128}, {3}},
        {"prompt of 143", 1, {0}, {143}, {0}},
        {"prompt of 150", 1, {0}, {150}, {2}},
        {"prompt of 191", 1, {0}, {191}, {2}},
        {"prompt of 192", 1, {0}, {192}, {3}},
        {"prompt of 512", 1, {0}, {512}, {3}},
        {"8 x 16 on 2048 + decode", 9, {2048, 2048, 2048, 2048, 700, 2048, 2048, 2048, 2048},
         {16, 16, 16, 16, 1, 16, 16, 16, 16}, {3, 3, 3, 3, 0, 3, 3, 3, 3}},
        {"8 x 15 on 2048", 8, {2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048},
         {15, 15, 15, 15, 15, 15, 15, 15}, {0}},
        {"4 x 16 on 2048", 4, {2048, 2048, 2048, 2048}, {16, 16, 16, 16}, {0}},
        {"5 x 16 on 2048", 5, {2048, 2048, 2048, 2048, 2048}, {16, 16, 16, 16, 16},
         {2, 2, 2, 2, 2}},
        {"2 x 32 on 2048", 2, {2048, 2048}, {32, 32}, {0, 0}},
        {"2 x 40 on 2048", 2, {2048, 2048}, {40, 40}, {2, 2}},
        {"4 x 32 on 2048", 4, {2048, 2048, 2048, 2048}, {32, 32, 32, 32}, {3, 3, 3, 3}},
        {"16 on 8192 + 200 on 4096", 2, {8192, 4096}, {16, 200}, {0, 3}},
    };
    static const char *kernel[2] = {"mma.sync", "wgmma"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int w = 0; w < 2; w++) {
            int32_t qi[10] = {0}, ctx[9], pick[27];
            for (int s = 0; s < cases[i].S; s++)
                qi[s + 1] = qi[s] + cases[i].nn[s], ctx[s] = cases[i].nc[s] + cases[i].nn[s];
            int n = ls_cu_attention_prefill_pick(qi, ctx, cases[i].S, (ls_cu_prefill_kernel_t)w,
                                                 pick),
                ok = 1, k = 0;
            for (int s = 0; s < cases[i].S; s++) // in row order, each with its rows
                if (cases[i].want[s] >> w & 1)
                    ok &= k < n && pick[3 * k] == s && pick[3 * k + 1] == qi[s] &&
                          pick[3 * k + 2] == cases[i].nn[s],
                        k++;
            char name[112];
            snprintf(name, sizeof name, "prefill pick %s %s: %d sequences to the prefill kernel",
                     kernel[w], cases[i].name, n);
            s_check_true(name, ok && k == n);
        }
}

// -- LoRA ---------------------------------------------------------------------------------

typedef struct {
    const char *name;
    int T;          // activation rows
    int n_segs;
    int sizes[40];
    int slots[40];
    int perm;       // rows shuffled (uncovered rows included in the shuffle)
} s_layout_t;

static const s_layout_t s_layouts[] = {
    {"one adapter", 37, 1, {37}, {3}, 0},
    {"all distinct (decode)", 32, 32,
     {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
     {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
      17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32},
     0},
    {"skewed", 60, 8, {40, 9, 4, 3, 1, 1, 1, 1}, {5, 1, 2, 3, 4, 6, 7, 8}, 0},
    {"base rows + uncovered", 24, 6, {5, 3, 1, 4, 2, 6}, {0, 2, 0, 9, 0, 17}, 0},
    {"permutation + base + uncovered", 30, 5, {12, 7, 1, 1, 5}, {4, 0, 2, 11, 31}, 1},
    // ranks 8 and 16 only (slots 1, 2 mod 4): in slots of r_max 64 the expand's lanes follow
    // the largest rank, not the slot width
    {"distinct, small ranks", 16, 16, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
     {1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22, 25, 26, 29, 30}, 0},
    // the serving shape: a Zipf-like count of requests per adapter, ranks 8-64 mixed in
    // slots of r_max 64, rows shuffled (tiles of every length, each its own rank's work)
    {"serving mix", 52, 12, {17, 9, 6, 4, 3, 3, 2, 2, 1, 1, 1, 1}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 1},
};

enum { SLOTS = 33 };

// The step's second LoRA pass, as a mix of two adapters makes it (docs/lora-mixing.md): the
// rows of every other segment of pass 0 again, each under another slot, and random weights
// on the segments of both passes.
static void s_mix_pass(t_rng_t *r, s_stepd_t *d, const int32_t *rows) {
    d->n_passes = 2;
    d->has_segw = 1;
    d->n_segs2 = 0;
    d->seg_indptr2[0] = 0;
    int p2 = 0;
    for (int s = 0; s < d->n_segs; s++) {
        d->segw[s] = t_rng_float(r, 0.05f, 1.5f);
        if (s % 2)
            continue;
        for (int p = d->seg_indptr[s]; p < d->seg_indptr[s + 1]; p++)
            d->perm2[p2++] = rows[p];
        d->wi2[d->n_segs2] = d->wi[s] % 32 + 1;
        d->segw2[d->n_segs2] = t_rng_float(r, 0.05f, 1.5f);
        d->seg_indptr2[++d->n_segs2] = p2;
    }
}

// The LoRA batch of layout lay in d (not yet begun): SLOTS slots of ranks 8..64 (at most
// r_max; slot 0 rank 0), random scalings; mix: a second pass and per-segment weights
// (s_mix_pass); rows (lay->T) the segment positions' rows; touched (lay->T) marks the rows
// a rank > 0 segment of either pass covers. Returns the step's passes.
static int s_lora_step(t_rng_t *r, const s_layout_t *lay, int r_max, int mix, s_stepd_t *d,
                       int32_t *rows, int32_t *touched) {
    s_step_simple(d, lay->T);
    d->has_lora = 1;
    d->n_segs = lay->n_segs;
    d->n_slots = SLOTS;
    static const int rank_list[4] = {8, 16, 32, 64};
    d->ranks[0] = 0;
    d->scal[0] = 0.0f;
    for (int s = 1; s < SLOTS; s++) {
        int rk = rank_list[(s - 1) % 4];
        d->ranks[s] = rk < r_max ? rk : r_max;
        d->scal[s] = t_rng_float(r, 0.25f, 2.0f);
    }
    int covered = 0;
    for (int s = 0; s < lay->n_segs; s++) {
        d->seg_indptr[s] = covered;
        covered += lay->sizes[s];
        d->wi[s] = lay->slots[s];
    }
    d->seg_indptr[lay->n_segs] = covered;
    for (int t = 0; t < lay->T; t++)
        rows[t] = t;
    if (lay->perm) {
        t_shuffle(r, rows, lay->T);
        memcpy(d->perm, rows, sizeof(int32_t) * covered);
        d->has_perm = 1;
    }
    if (mix)
        s_mix_pass(r, d, rows);
    memset(touched, 0, sizeof(int32_t) * lay->T);
    for (int s = 0; s < lay->n_segs; s++)
        if (d->ranks[lay->slots[s]] > 0)
            for (int p = d->seg_indptr[s]; p < d->seg_indptr[s + 1]; p++)
                touched[rows[p]] = 1;
    for (int s = 0; mix && s < d->n_segs2; s++) // second-pass slots all have rank > 0
        for (int p = d->seg_indptr2[s]; p < d->seg_indptr2[s + 1]; p++)
            touched[d->perm2[p]] = 1;
    return mix ? 2 : 1;
}

// A pool (SLOTS, n_slices*r_max, in) or (SLOTS, out, r_max) of U(-0.1, 0.1), NaN past each
// slot's rank: reading one would show. b: the B layout (rank along the rows' last axis).
static float *s_lora_pool_new(t_rng_t *r, const s_stepd_t *d, int b, int n_slices, int r_max,
                              int width) {
    size_t n = (size_t)SLOTS * n_slices * r_max * width;
    float *h = s_fill_new(r, n, -0.1f, 0.1f);
    for (int s = 0; s < SLOTS; s++)
        for (size_t e = 0; e < (size_t)n_slices * r_max * width; e++) {
            int j = b ? (int)(e % (size_t)r_max) : (int)(e / (size_t)width % (size_t)r_max);
            if (j >= d->ranks[s])
                h[(size_t)s * n_slices * r_max * width + e] = NAN;
        }
    return h;
}

// A LoRA matrix in pages on both backends (lora_pages.h): the same values (rounded to pdt
// first, so both hold the same numbers), each table pointing into its backend's arena.
typedef struct {
    tp_pages_t p;
    ls_buffer_t *arena[2], *tab[2];
    ls_lora_mat_t m[2]; // CPU, GPU
} s_pm_t;

static void s_pm_upload(s_pm_t *pm, int n_slots, ls_dtype_t pdt) {
    s_round_all(pdt, pm->p.arena, pm->p.n);
    pm->m[0] = tp_backend(&pm->p, s_cpu, n_slots, pdt, &pm->arena[0], &pm->tab[0]);
    pm->m[1] = tp_backend(&pm->p, s_gpu, n_slots, pdt, &pm->arena[1], &pm->tab[1]);
}

// A of the dense pool h (n_slots, n_slices*r_max, len) as rows of len, the rows below each
// slot's rank (ranks (n_slots)), in pieces of `piece` elements (0: whole)
static s_pm_t s_pm_rows(t_rng_t *r, const float *h, int n_slots, const int32_t *ranks, int n_slices, int r_max,
                        int len, int piece, ls_dtype_t pdt) {
    s_pm_t pm;
    tp_rows(&pm.p, r, h, n_slots, n_slices, r_max, len, piece ? piece : len, ranks);
    s_pm_upload(&pm, n_slots, pdt);
    return pm;
}

// B of the dense pool h (n_slots, out, r_max) as chunks of out rows, in pieces of `piece`
// rows (0: whole); transposed (the embedding's A, h (n_slots, r_max, out)): element (o, j)
// at h[(w*r_max + j)*out + o]
static s_pm_t s_pm_chunks(t_rng_t *r, const float *h, int n_slots, const int32_t *ranks, int out, int r_max,
                          int piece, int transposed, ls_dtype_t pdt) {
    s_pm_t pm;
    size_t slot = (size_t)out * r_max;
    tp_chunks_strided(&pm.p, r, h, n_slots, out, r_max, piece ? piece : out, ranks, slot,
                      transposed ? 1 : (size_t)r_max, transposed ? (size_t)out : 1);
    s_pm_upload(&pm, n_slots, pdt);
    return pm;
}

static void s_pm_free(s_pm_t *pm) {
    ls_backend_t *const be[2] = {s_cpu, s_gpu};
    for (int i = 0; i < 2; i++)
        be[i]->buffer_free(be[i], pm->arena[i]), be[i]->buffer_free(be[i], pm->tab[i]);
    tp_free(&pm->p);
}

// A LoRA op's buffers on both backends: x (nx in xdt; none when 0), tmp (nt, its first nt_set
// elements from tmp0), y (ny, from y0).
typedef struct {
    s_pb_t x, tmp, y;
} s_lora_bufs_t;

static s_lora_bufs_t s_lora_bufs_new(const float *hx, size_t nx, ls_dtype_t xdt, const float *tmp0, size_t nt,
                                     size_t nt_set, const float *y0, size_t ny) {
    s_lora_bufs_t u = {{0}, s_pb_new(LS_DTYPE_F32, nt), s_pb_new(LS_DTYPE_F32, ny)};
    if (nx) {
        u.x = s_pb_new(xdt, nx);
        s_pb_set(&u.x, 0, hx, nx);
    }
    s_pb_set(&u.tmp, 0, tmp0, nt_set);
    s_pb_set(&u.y, 0, y0, ny);
    return u;
}

static void s_lora_bufs_free(s_lora_bufs_t *u) {
    s_pb_free(&u->tmp), s_pb_free(&u->y);
    if (u->x.c)
        s_pb_free(&u->x);
}

// lora_fused on both backends from y = y0 and tmp = tmp0 (host arrays of y's and tmp's size),
// over every pass of the step, the later ones adding (as engine/model.c runs a mix)
static void s_fused_both(s_pb_t *y, const float *y0, s_pb_t *x, s_pb_t *tmp, const float *tmp0,
                         const s_pm_t *a, const s_pm_t *b, const int32_t *off, int in, int n_slices,
                         int r_max, int accumulate, int n_passes) {
    s_pb_set(tmp, 0, tmp0, tmp->n);
    s_pb_set(y, 0, y0, y->n);
    for (int k = 0; k < n_passes; k++, accumulate = 1) {
        s_cpu->lora_fused(s_cpu, s_vc(y, 0), s_vc(x, 0), s_vc(tmp, 0), a->m[0], b->m[0],
                          off, in, n_slices, r_max, accumulate, k);
        s_gpu->lora_fused(s_gpu, s_vg(y, 0), s_vg(x, 0), s_vg(tmp, 0), a->m[1], b->m[1],
                          off, in, n_slices, r_max, accumulate, k);
    }
}

// c and g (n) become what the op added to y0 (NaN stays NaN: an untouched poisoned element)
static void s_deltas(float *c, float *g, const float *y0, size_t n) {
    for (size_t i = 0; i < n; i++) {
        c[i] = isnan(c[i]) ? NAN : (float)((double)c[i] - y0[i]);
        g[i] = isnan(g[i]) ? NAN : (float)((double)g[i] - y0[i]);
    }
}

// gate_up's LoRA inside SiLU·mul (lora_silu_fits / _shrink / _mul) over layout lay's one pass,
// gate and up of inter columns each: it must run where the GPU has multi-position tiles on a
// bf16 pool, and there give out and its bf16 copy (out_f32 0: the copy alone) bit for bit as
// the GPU's lora_fused writing the delta and silu_mul adding it, and the CPU's within the
// LoRA ops' tolerance; every element written (out poisoned with NaN first), rows without an adapter
// included.
static void s_silu_lora_check(t_rng_t *r, const s_layout_t *lay, s_pb_t *x, s_pb_t *tmp, const float *tpois,
                              const s_pm_t *a, const s_pm_t *b, const int32_t *off, int in, int inter,
                              int r_max, ls_dtype_t pdt, int out_f32) {
    int T = lay->T, one = 1;
    for (int s = 0; s < lay->n_segs; s++)
        one = one && lay->sizes[s] <= 1;
    char name[200];
    bool fits = s_gpu->lora_silu_fits(s_gpu, s_vg(x, 0), s_vg(tmp, 0), a->m[1], b->m[1], in, inter, r_max, 0);
    snprintf(name, sizeof name, "lora silu_mul %s r_max=%d %s: runs %d, expected %d", lay->name, r_max,
             s_dtn(pdt), fits, pdt == LS_DTYPE_BF16 && !one);
    s_check_true(name, fits == (pdt == LS_DTYPE_BF16 && !one));
    if (!fits)
        return;
    size_t n = (size_t)T * inter, ng = 2 * n;
    float *hg = s_fill_new(r, ng, -3, 3), *poison = s_nan_new(ng);
    s_pb_t gu = s_pb_new(LS_DTYPE_F32, ng), dl = s_pb_new(LS_DTYPE_F32, ng);
    s_pb_t out = s_pb_new(LS_DTYPE_F32, n), lp = s_pb_new(LS_DTYPE_BF16, n);
    s_pb_t out2 = s_pb_new(LS_DTYPE_F32, n), lp2 = s_pb_new(LS_DTYPE_BF16, n);
    s_pb_set(&gu, 0, hg, ng);
    // the two ops: the delta written (both backends), then silu_mul adding it (into out / lp
    // on the CPU, out2 / lp2 on the GPU)
    s_fused_both(&dl, poison, x, tmp, tpois, a, b, off, in, 2, r_max, 0, 1);
    s_pb_set(&out, 0, poison, n), s_pb_set(&out2, 0, poison, n);
    ls_view_t og = out_f32 ? s_vg(&out2, 0) : LS_VIEW_NONE;
    s_cpu->silu_mul(s_cpu, s_vc(&out, 0), s_vc(&lp, 0), LS_VIEW_NONE, s_vc(&gu, 0), s_vc(&dl, 0), T, inter);
    s_gpu->silu_mul(s_gpu, og, s_vg(&lp2, 0), LS_VIEW_NONE, s_vg(&gu, 0), s_vg(&dl, 0), T, inter);
    // the fused op on the GPU into out / lp, from poisoned tmp
    s_pb_set(tmp, 0, tpois, tmp->n);
    s_gpu->lora_silu_shrink(s_gpu, s_vg(tmp, 0), s_vg(x, 0), a->m[1], in, r_max, 0);
    s_gpu->lora_silu_mul(s_gpu, out_f32 ? s_vg(&out, 0) : LS_VIEW_NONE, s_vg(&lp, 0), s_vg(&gu, 0),
                         s_vg(tmp, 0), b->m[1], in, inter, r_max, 0);
    float *c = t_alloc(n * 4), *g = t_alloc(n * 4), *c2 = t_alloc(n * 4), *g2 = t_alloc(n * 4);
    size_t diff = 0;
    if (out_f32) {
        s_pb_get(&out, 0, n, c, g);
        snprintf(name, sizeof name, "lora silu_mul %s r_max=%d inter=%d: out against the CPU's", lay->name,
                 r_max, inter);
        // the delta's own tolerance (the LoRA ops' 1e-4: the shrink sums in its part order,
        // the CPU in row order), through SiLU·mul: 4.0e-5 at gate_up's shape, rank 64 (H100)
        s_check(name, g, c, n, 1e-10, 1e-4);
        s_pb_get(&out2, 0, n, c2, g2);
        for (size_t i = 0; i < n; i++)
            diff += memcmp(&g[i], &g2[i], sizeof(float)) != 0;
    }
    s_pb_get(&lp, 0, n, c, g);
    s_pb_get(&lp2, 0, n, c2, g2);
    size_t nan_lp = 0;
    for (size_t i = 0; i < n; i++) {
        diff += memcmp(&g[i], &g2[i], sizeof(float)) != 0;
        nan_lp += isnan(g[i]);
    }
    snprintf(name, sizeof name, "lora silu_mul %s r_max=%d inter=%d%s: %zu of %zu values differ from the delta "
             "+ silu_mul's (bit for bit), %zu NaN", lay->name, r_max, inter, out_f32 ? "" : " (bf16 copy alone)",
             diff, n * (out_f32 ? 2 : 1), nan_lp);
    s_check_true(name, diff == 0 && nan_lp == 0);
    s_pb_free(&gu), s_pb_free(&dl), s_pb_free(&out), s_pb_free(&lp), s_pb_free(&out2), s_pb_free(&lp2);
    free(hg), free(poison), free(c), free(g), free(c2), free(g2);
}

// The LoRA ops over layout lay, on both backends; mix: with a second pass (s_mix_pass) and
// per-segment weights, every op run over both passes as engine/model.c runs a step with mixes;
// pieces: A's rows in 3 pieces, B's chunks in pieces of a fifth of their rows (the fallback
// kernels), else whole (the tuned ones); x16: x in the pool's 16-bit dtype, as the engine
// gives the LoRA the matmul's input (the CPU backend holds the same values in f32).
static void test_lora(t_rng_t *r, const s_layout_t *lay, int n_slices, const int *sizes,
                      int in, int r_max, ls_dtype_t pdt, int mix, int pieces, int x16) {
    static s_stepd_t d;
    int32_t rows[MAXT], touched[MAXT];
    int P = s_lora_step(r, lay, r_max, mix, &d, rows, touched);
    s_step_begin(&d);

    int ld = n_slices * r_max, off[4] = {0};
    for (int k = 0; k < n_slices; k++)
        off[k + 1] = off[k] + sizes[k];
    int out_total = off[n_slices], T = lay->T;
    float *ha = s_lora_pool_new(r, &d, 0, n_slices, r_max, in);
    float *hb = s_lora_pool_new(r, &d, 1, 1, r_max, out_total);
    // rows that rank>0 segments cover get random y; the others are poison that must stay
    size_t nx = (size_t)T * in, nt = (size_t)T * ld, ny = (size_t)T * out_total;
    // tmp: lora_fused's scratch is LS_LORA_FUSED_PARTS arrays; shrink uses the first
    size_t ntf = nt * LS_LORA_FUSED_PARTS;
    float *hx = s_fill_new(r, nx, -1, 1), *tpois = s_nan_new(ntf), *hy = s_nan_new(ny);
    for (int t = 0; t < T; t++)
        if (touched[t])
            t_fill(r, hy + (size_t)t * out_total, out_total, -1, 1);
    s_lora_bufs_t u = s_lora_bufs_new(hx, nx, x16 ? pdt : LS_DTYPE_F32, tpois, ntf, nt, hy, ny);
    s_pb_t x = u.x, tmp = u.tmp, y = u.y;
    s_pm_t a = s_pm_rows(r, ha, SLOTS, d.ranks, n_slices, r_max, in, pieces ? (in / 3 + 7) / 8 * 8 : 0, pdt);
    s_pm_t b = s_pm_chunks(r, hb, SLOTS, d.ranks, out_total, r_max, pieces ? out_total / 5 + 1 : 0, 0, pdt);
    // shrink then expand, pass after pass (tmp compared after the last pass's shrink: what
    // it wrote over the first's, the first's elsewhere)
    float *c = t_alloc((nt > ny ? nt : ny) * 4), *g = t_alloc((nt > ny ? nt : ny) * 4);
    char name[160];
    const char *mixed = mix ? " + mix pass, weights" : "", *cut = pieces ? " in pieces" : "";
    const char *xd = x16 ? " x16" : "";
    for (int k = 0; k < P; k++) {
        s_cpu->lora_shrink(s_cpu, s_vc(&tmp, 0), s_vc(&x, 0), a.m[0], in, n_slices, r_max, k);
        s_gpu->lora_shrink(s_gpu, s_vg(&tmp, 0), s_vg(&x, 0), a.m[1], in, n_slices, r_max, k);
        if (k == P - 1) {
            s_pb_get(&tmp, 0, nt, c, g);
            snprintf(name, sizeof name, "lora shrink %s%s%s%s, %d slice%s in=%d r_max=%d %s",
                     lay->name, mixed, cut, xd, n_slices, n_slices > 1 ? "s" : "", in, r_max, s_dtn(pdt));
            s_check(name, g, c, nt, 1e-10, 1e-4);
        }
        s_cpu->lora_expand(s_cpu, s_vc(&y, 0), s_vc(&tmp, 0), b.m[0], off, n_slices, r_max, k);
        s_gpu->lora_expand(s_gpu, s_vg(&y, 0), s_vg(&tmp, 0), b.m[1], off, n_slices, r_max, k);
    }
    s_pb_get(&y, 0, ny, c, g);
    s_deltas(c, g, hy, ny); // compare the LoRA deltas
    snprintf(name, sizeof name, "lora expand %s%s%s%s, out=%d", lay->name, mixed, cut, xd, out_total);
    s_check(name, g, c, ny, 1e-10, 1e-4);
    // the fused op from the same poisoned start: y deltas equal, untouched rows still NaN
    // (tmp is the op's scratch: unspecified afterwards, not compared)
    s_fused_both(&y, hy, &x, &tmp, tpois, &a, &b, off, in, n_slices, r_max, 1, P);
    s_pb_get(&y, 0, ny, c, g);
    s_deltas(c, g, hy, ny);
    snprintf(name, sizeof name, "lora fused %s%s%s%s, %d slice%s in=%d r_max=%d %s", lay->name,
             mixed, cut, xd, n_slices, n_slices > 1 ? "s" : "", in, r_max, s_dtn(pdt));
    s_check(name, g, c, ny, 1e-10, 1e-4);
    // written, not added (accumulate 0), over y all NaN: every element must be written —
    // the delta on covered rows, 0 on the others — and the GPU must match the CPU's
    // zero-then-add; NaN anywhere (the check counts it) means an element left unwritten
    float *ynan = s_nan_new(ny);
    s_fused_both(&y, ynan, &x, &tmp, tpois, &a, &b, off, in, n_slices, r_max, 0, P);
    s_pb_get(&y, 0, ny, c, g);
    size_t unwritten = 0, nonzero_untouched = 0;
    for (size_t i = 0; i < ny; i++) {
        unwritten += isnan(g[i]) || isnan(c[i]);
        nonzero_untouched += !touched[i / out_total] && (g[i] != 0.0f || c[i] != 0.0f);
    }
    snprintf(name, sizeof name, "lora fused written %s%s%s, %d slice%s r_max=%d %s", lay->name,
             mixed, cut, n_slices, n_slices > 1 ? "s" : "", r_max, s_dtn(pdt));
    s_check(name, g, c, ny, 1e-10, 1e-4);
    snprintf(name, sizeof name, "lora fused written %s%s%s: %zu unwritten, %zu non-zero rows "
             "without an adapter", lay->name, mixed, cut, unwritten, nonzero_untouched);
    s_check_true(name, unwritten == 0 && nonzero_untouched == 0);
    free(ynan);
    if (n_slices == 2 && sizes[0] == sizes[1] && !mix && !pieces)
        for (int f = 0; f < 2; f++)
            s_silu_lora_check(r, lay, &x, &tmp, tpois, &a, &b, off, in, sizes[0], r_max, pdt, f);
    s_lora_bufs_free(&u);
    s_pm_free(&a), s_pm_free(&b);
    free(ha), free(hb), free(hx), free(tpois), free(hy), free(c), free(g);
}

// The embedding's LoRA: the gather shrink at the step's token ids (exact: a copy of A's
// elements), then the usual expand with one slice of H outputs, from poisoned tmp and y;
// mix: over both passes of s_mix_pass, the tiles' scales carrying the segments' weights.
static void test_lora_embed(t_rng_t *r, const s_layout_t *lay, int vocab, int H, int r_max,
                            ls_dtype_t pdt, int mix, int pieces) {
    static s_stepd_t d;
    int32_t rows[MAXT], touched[MAXT];
    int P = s_lora_step(r, lay, r_max, mix, &d, rows, touched);
    for (int t = 0; t < lay->T; t++)
        d.ids[t] = t_rng_int(r, vocab);
    d.ids[0] = vocab - 1;  // the last column
    s_step_begin(&d);
    int T = lay->T, off[2] = {0, H};
    size_t nt = (size_t)T * r_max, ny = (size_t)T * H;
    float *ha = s_lora_pool_new(r, &d, 0, 1, r_max, vocab), *hb = s_lora_pool_new(r, &d, 1, 1, r_max, H);
    float *tpois = s_nan_new(nt), *hy = s_nan_new(ny);
    for (int t = 0; t < T; t++)
        if (touched[t])
            t_fill(r, hy + (size_t)t * H, H, -1, 1);
    s_lora_bufs_t u = s_lora_bufs_new(NULL, 0, LS_DTYPE_F32, tpois, nt, nt, hy, ny);
    s_pb_t tmp = u.tmp, y = u.y;
    // A (r_max, vocab) per slot, held as chunks of vocab rows
    s_pm_t a = s_pm_chunks(r, ha, SLOTS, d.ranks, vocab, r_max, pieces ? vocab / 7 + 1 : 0, 1, pdt);
    s_pm_t b = s_pm_chunks(r, hb, SLOTS, d.ranks, H, r_max, pieces ? H / 5 + 1 : 0, 0, pdt);
    float *c = t_alloc((nt > ny ? nt : ny) * 4), *g = t_alloc((nt > ny ? nt : ny) * 4);
    char name[160];
    const char *mixed = mix ? " + mix pass, weights" : "", *cut = pieces ? " in pieces" : "";
    for (int k = 0; k < P; k++) {
        s_cpu->lora_embed_shrink(s_cpu, s_vc(&tmp, 0), a.m[0], vocab, r_max, k);
        s_gpu->lora_embed_shrink(s_gpu, s_vg(&tmp, 0), a.m[1], vocab, r_max, k);
        if (k == P - 1) { // as test_lora: the last pass's rows over the first's
            s_pb_get(&tmp, 0, nt, c, g);
            snprintf(name, sizeof name, "lora embed shrink %s%s%s, vocab=%d r_max=%d %s",
                     lay->name, mixed, cut, vocab, r_max, s_dtn(pdt));
            s_check(name, g, c, nt, 0, 0);
        }
        s_cpu->lora_expand(s_cpu, s_vc(&y, 0), s_vc(&tmp, 0), b.m[0], off, 1, r_max, k);
        s_gpu->lora_expand(s_gpu, s_vg(&y, 0), s_vg(&tmp, 0), b.m[1], off, 1, r_max, k);
    }
    s_pb_get(&y, 0, ny, c, g);
    s_deltas(c, g, hy, ny);
    snprintf(name, sizeof name, "lora embed expand %s%s%s, hidden=%d", lay->name, mixed, cut, H);
    s_check(name, g, c, ny, 1e-10, 1e-4);
    s_lora_bufs_free(&u);
    s_pm_free(&a), s_pm_free(&b);
    free(ha), free(hb), free(tpois), free(hy), free(c), free(g);
}

// lm_head's LoRA on R logit rows, each with its own slot (slot 0, rank 0, on some: those
// rows stay poisoned) and factor, y (R, out) vocabulary-wide; mix: a second pass whose rows
// get other slots (slot 0 on some) and every factor a weight besides the slot's scaling.
static void test_lora_rows(t_rng_t *r, int R, int in, int out, int r_max, ls_dtype_t pdt,
                           int mix, int pieces) {
    static s_stepd_t d;
    static const s_layout_t one = {"rows", 1, 1, {1}, {1}, 0};
    int32_t rows[MAXT], touched[MAXT];
    int P = s_lora_step(r, &one, r_max, mix, &d, rows, touched);
    int used = 5;  // slots 0..4: ranks 0, 8, 16, 32, 64 (capped at r_max)
    for (int k = 0; k < P; k++)
        for (int i = 0; i < R; i++) {
            int w = k == 0 && i < used ? i : t_rng_int(r, used);
            d.logit_slots[k * R + i] = w;
            d.logit_scales[k * R + i] = d.scal[w] * (mix ? t_rng_float(r, 0.05f, 1.5f) : 1.0f);
        }
    d.n_logit = R;
    d.has_logit_slots = 1;
    s_step_begin(&d);
    size_t nx = (size_t)R * in, nt = (size_t)R * r_max, ny = (size_t)R * out;
    float *ha = s_lora_pool_new(r, &d, 0, 1, r_max, in), *hb = s_lora_pool_new(r, &d, 1, 1, r_max, out);
    float *hx = s_fill_new(r, nx, -1, 1), *tpois = s_nan_new(nt), *hy = s_nan_new(ny);
    for (int i = 0; i < R; i++) {
        int any = 0;
        for (int k = 0; k < P; k++)
            any = any || d.ranks[d.logit_slots[k * R + i]];
        if (any)
            t_fill(r, hy + (size_t)i * out, out, -1, 1);
    }
    s_lora_bufs_t u = s_lora_bufs_new(hx, nx, LS_DTYPE_F32, tpois, nt, nt, hy, ny);
    s_pb_t x = u.x, tmp = u.tmp, y = u.y;
    s_pm_t a = s_pm_rows(r, ha, SLOTS, d.ranks, 1, r_max, in, pieces ? (in / 3 + 7) / 8 * 8 : 0, pdt);
    s_pm_t b = s_pm_chunks(r, hb, SLOTS, d.ranks, out, r_max, pieces ? out / 9 + 1 : 0, 0, pdt);
    for (int k = 0; k < P; k++) {
        s_cpu->lora_rows(s_cpu, s_vc(&y, 0), s_vc(&x, 0), s_vc(&tmp, 0), a.m[0], b.m[0], in, out, r_max, k);
        s_gpu->lora_rows(s_gpu, s_vg(&y, 0), s_vg(&x, 0), s_vg(&tmp, 0), a.m[1], b.m[1], in, out, r_max, k);
    }
    float *c = t_alloc(ny * 4), *g = t_alloc(ny * 4);
    s_pb_get(&y, 0, ny, c, g);
    s_deltas(c, g, hy, ny);
    char name[160];
    snprintf(name, sizeof name, "lora rows (lm_head)%s%s R=%d in=%d out=%d r_max=%d %s",
             mix ? " + mix pass, weights" : "", pieces ? " in pieces" : "", R, in, out, r_max, s_dtn(pdt));
    s_check(name, g, c, ny, 1e-10, 1e-4);
    s_lora_bufs_free(&u);
    s_pm_free(&a), s_pm_free(&b);
    free(ha), free(hb), free(hx), free(tpois), free(hy), free(c), free(g);
}

// Trainable tokens: T token rows of x (T, C), about half replaced by rows (N, C) of dtype dt
// picked at random (the others must stay as they were), as ls_token_rows_forward.
static void test_token_rows(t_rng_t *r, int T, int C, int N, ls_dtype_t dt) {
    static s_stepd_t d;
    s_step_simple(&d, T);
    for (int t = 0; t < T; t++)
        d.token_rows[t] = t_rng_int(r, 2) ? t_rng_int(r, N) : -1;
    d.token_rows[0] = N - 1;  // the last row
    d.has_token_rows = 1;
    s_step_begin(&d);
    size_t nr = (size_t)N * C, nx = (size_t)T * C;
    float *hr = s_fill_new(r, nr, -1, 1), *hx = s_fill_new(r, nx, -1, 1);
    s_pb_t rows = s_pb_new(dt, nr), x = s_pb_new(LS_DTYPE_F32, nx);
    s_pb_set(&rows, 0, hr, nr);
    s_pb_set(&x, 0, hx, nx);
    s_cpu->token_rows(s_cpu, s_vc(&x, 0), s_vc(&rows, 0), C);
    s_gpu->token_rows(s_gpu, s_vg(&x, 0), s_vg(&rows, 0), C);
    float *c = t_alloc(nx * 4), *g = t_alloc(nx * 4);
    s_pb_get(&x, 0, nx, c, g);
    char name[128];
    snprintf(name, sizeof name, "token rows (trainable tokens) T=%d C=%d N=%d %s", T, C, N,
             s_dtn(dt));
    s_check(name, g, c, nx, 0, 0);  // copies, widened exactly
    s_pb_free(&rows), s_pb_free(&x);
    free(hr), free(hx), free(c), free(g);
}

// Trainable tokens on lm_head: R logit rows of logits (R, V), most with a tile of up to 40 of
// the N rows (N, C) of dtype dt (ids distinct, so no two writes meet), recomputed from x (R,
// C); every other logit must stay as it was. As ls_token_logits_forward.
static void test_token_logits(t_rng_t *r, int R, int C, int V, int N, ls_dtype_t dt) {
    static s_stepd_t d;
    s_step_simple(&d, R);
    d.n_logit = R;
    for (int i = 0; i < R; i++) {
        if (i && !t_rng_int(r, 4))
            continue;  // a row without an adapter's rows
        int n = 1 + t_rng_int(r, N < 40 ? N : 40), f = t_rng_int(r, N - n + 1);
        int32_t *tile = d.head_tiles + 3 * d.n_head_tiles++;
        tile[0] = i, tile[1] = f, tile[2] = n;
    }
    s_step_begin(&d);
    size_t nr = (size_t)N * C, nx = (size_t)R * C, nl = (size_t)R * V;
    float *hr = s_fill_new(r, nr, -1, 1), *hx = s_fill_new(r, nx, -1, 1);
    float *hl = s_fill_new(r, nl, -3, 3), *hid = t_alloc((size_t)N * sizeof *hid);
    for (int k = 0; k < N; k++) {  // distinct ids: k spread over the vocabulary, the last one
        hid[k] = (float)((int64_t)k * V / N + t_rng_int(r, V / N));
        if (k == N - 1)
            hid[k] = (float)(V - 1);
    }
    s_pb_t rows = s_pb_new(dt, nr), x = s_pb_new(LS_DTYPE_F32, nx),
           logits = s_pb_new(LS_DTYPE_F32, nl), ids = s_pb_new(LS_DTYPE_F32, (size_t)N);
    s_pb_set(&rows, 0, hr, nr);
    s_pb_set(&x, 0, hx, nx);
    s_pb_set(&logits, 0, hl, nl);
    s_pb_set(&ids, 0, hid, (size_t)N);
    s_cpu->token_logits(s_cpu, s_vc(&logits, 0), s_vc(&x, 0), s_vc(&rows, 0), s_vc(&ids, 0), C, V);
    s_gpu->token_logits(s_gpu, s_vg(&logits, 0), s_vg(&x, 0), s_vg(&rows, 0), s_vg(&ids, 0), C, V);
    float *c = t_alloc(nl * 4), *g = t_alloc(nl * 4);
    s_pb_get(&logits, 0, nl, c, g);
    char name[128];
    snprintf(name, sizeof name, "token logits (trainable tokens) R=%d C=%d V=%d N=%d %s", R, C,
             V, N, s_dtn(dt));
    // fp32 dot products of C terms summed in another order: |Δ| ~ C·2^-24·|x|·|row|
    s_check(name, g, c, nl, 1e-10, 1e-3);
    s_pb_free(&rows), s_pb_free(&x), s_pb_free(&logits), s_pb_free(&ids);
    free(hr), free(hx), free(hl), free(hid), free(c), free(g);
}

// Added vocabulary: R logit rows of lm_head's (R, V) widened to (R, W), columns past V -inf
// (as ls_logits_widen_forward), then an adapter's own rows' logits written over them, each
// tile naming some added ids (V .. W-1) and some base ids: the widened rows' every -inf must
// be where the reference has one, and the rest as it computes it.
static void test_logits_widen(t_rng_t *r, int R, int C, int V, int E, ls_dtype_t dt) {
    static s_stepd_t d;
    int W = V + E, N = E + 4;
    s_step_simple(&d, R);
    d.n_logit = R;
    for (int i = 0; i < R; i++) {
        if (!t_rng_int(r, 3))
            continue;  // a row of the base or another adapter: every added column -inf
        int n = 1 + t_rng_int(r, N), f = t_rng_int(r, N - n + 1);
        int32_t *tile = d.head_tiles + 3 * d.n_head_tiles++;
        tile[0] = i, tile[1] = f, tile[2] = n;
    }
    s_step_begin(&d);
    size_t nh = (size_t)R * V, nw = (size_t)R * W, nr = (size_t)N * C, nx = (size_t)R * C;
    float *hh = s_fill_new(r, nh, -3, 3), *hr = s_fill_new(r, nr, -1, 1);
    float *hx = s_fill_new(r, nx, -1, 1), *hid = t_alloc((size_t)N * sizeof *hid);
    for (int k = 0; k < N; k++)  // the E added ids, then four base ids
        hid[k] = (float)(k < E ? V + k : t_rng_int(r, V));
    s_pb_t head = s_pb_new(LS_DTYPE_F32, nh), wide = s_pb_new(LS_DTYPE_F32, nw),
           rows = s_pb_new(dt, nr), x = s_pb_new(LS_DTYPE_F32, nx),
           ids = s_pb_new(LS_DTYPE_F32, (size_t)N);
    s_pb_set(&head, 0, hh, nh);
    s_pb_set(&rows, 0, hr, nr);
    s_pb_set(&x, 0, hx, nx);
    s_pb_set(&ids, 0, hid, (size_t)N);
    s_cpu->logits_widen(s_cpu, s_vc(&wide, 0), s_vc(&head, 0), V, W);
    s_gpu->logits_widen(s_gpu, s_vg(&wide, 0), s_vg(&head, 0), V, W);
    float *c = t_alloc(nw * 4), *g = t_alloc(nw * 4);
    s_pb_get(&wide, 0, nw, c, g);
    char name[160];
    snprintf(name, sizeof name, "logits widen (added vocabulary) R=%d V=%d W=%d", R, V, W);
    s_check(name, g, c, nw, 0, 0);  // copies and -inf, exactly
    size_t inf_bad = 0;
    for (size_t i = 0; i < nw; i++)
        inf_bad += isinf(c[i]) != isinf(g[i]);
    snprintf(name, sizeof name, "logits widen R=%d V=%d W=%d: -inf exactly past V", R, V, W);
    s_check_true(name, inf_bad == 0);
    s_cpu->token_logits(s_cpu, s_vc(&wide, 0), s_vc(&x, 0), s_vc(&rows, 0), s_vc(&ids, 0), C, W);
    s_gpu->token_logits(s_gpu, s_vg(&wide, 0), s_vg(&x, 0), s_vg(&rows, 0), s_vg(&ids, 0), C, W);
    s_pb_get(&wide, 0, nw, c, g);
    inf_bad = 0;
    for (size_t i = 0; i < nw; i++)
        inf_bad += isinf(c[i]) != isinf(g[i]);
    snprintf(name, sizeof name, "token logits of added ids R=%d C=%d V=%d W=%d %s", R, C, V, W,
             s_dtn(dt));
    s_check(name, g, c, nw, 1e-10, 1e-3);  // as test_token_logits
    snprintf(name, sizeof name, "token logits of added ids R=%d W=%d: -inf where the reference's",
             R, W);
    s_check_true(name, inf_bad == 0);
    s_pb_free(&head), s_pb_free(&wide), s_pb_free(&rows), s_pb_free(&x), s_pb_free(&ids);
    free(hh), free(hr), free(hx), free(hid), free(c), free(g);
}

// -- sampling -------------------------------------------------------------------------------

// The processed logprob row of ops.h steps 1-3, as kernels/cpu/sampling.c forms it (to
// measure how close a disagreement is to a tie).
static void s_lp_row(float *l, const float *logits, const uint32_t *mask,
                     const ls_sampling_params_t *sp, const int32_t *prompt, int np,
                     const int32_t *output, int no, int V) {
    memcpy(l, logits, (size_t)V * 4);
    for (int v = 0; mask && v < V; v++)
        if (!((mask[v >> 5] >> (v & 31)) & 1))
            l[v] = -INFINITY;
    int32_t *mark = calloc((size_t)V, 4);
    if (sp->repetition_penalty != 1.0f) {
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? output : prompt;
            for (int i = 0; i < (pass ? no : np); i++) {
                int v = ids[i];
                if (mark[v])
                    continue;
                mark[v] = 1;
                l[v] = l[v] > 0 ? l[v] / sp->repetition_penalty : l[v] * sp->repetition_penalty;
            }
        }
        memset(mark, 0, (size_t)V * 4);
    }
    if (sp->frequency_penalty != 0.0f || sp->presence_penalty != 0.0f) {
        for (int i = 0; i < no; i++)
            mark[output[i]]++;
        for (int i = 0; i < no; i++) {
            int v = output[i];
            if (!mark[v])
                continue;
            l[v] -= sp->frequency_penalty * mark[v] + sp->presence_penalty;
            mark[v] = 0;
        }
    }
    free(mark);
    float max = -INFINITY;
    for (int v = 0; v < V; v++) {
        if (sp->temperature > 0.0f)
            l[v] /= sp->temperature;
        if (l[v] > max)
            max = l[v];
    }
    double sum = 0;
    for (int v = 0; v < V; v++)
        sum += exp((double)l[v] - max);
    float lse = max + (float)log(sum);
    for (int v = 0; v < V; v++)
        l[v] -= lse;
}

static float s_key(const float *lp, const ls_sampling_params_t *sp, int v) {
    float e = -logf(ls_rng_uniform(sp->seed, sp->step, (uint64_t)v));
    return lp[v] - logf(e);
}

// Rank order (logprob desc, id asc), as the reference's qsort comparator has it
static const float *s_rank_lp;
static int s_rank_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    if (s_rank_lp[x] != s_rank_lp[y])
        return s_rank_lp[x] > s_rank_lp[y] ? -1 : 1;
    return (x > y) - (x < y);
}

// Whether a seeded mismatch (the reference's token cpu against the device's gpu, their race
// keys no near-tie) is the top-p boundary on the other side of a token: the device sums the
// masses exp(lp - lp_max) in fixed point (units of 2^-b, b = min(46, 63 - ceil(log2 V)):
// kernels/cuda/sampling.cu), the reference in double, so where the mass ranked before a
// token lies within (V + 2) * 2^-b + 1e-12 * total of the target, the two may end the prefix
// on either side of it — the device dropping the reference's token, or keeping one the
// reference dropped. lp is the row's logprobs.
static int s_top_p_flip(const float *lp, const ls_sampling_params_t *sp, int V, int cpu,
                        int gpu) {
    if (!(sp->top_p < 1.0f))
        return 0;
    int lg = 0, keep_k = sp->top_k > 0 && sp->top_k < V ? sp->top_k : V, flip = 0;
    while ((1 << lg) < V)
        lg++;
    int *rank = malloc((size_t)V * sizeof *rank);
    for (int v = 0; v < V; v++)
        rank[v] = v;
    s_rank_lp = lp;
    qsort(rank, (size_t)V, sizeof *rank, s_rank_cmp);
    double l0 = lp[rank[0]], total = 0.0, cum = 0.0;
    for (int i = 0; i < keep_k; i++)
        total += exp((double)lp[rank[i]] - l0);
    double target = sp->top_p * total;
    double tol = (V + 2) * ldexp(1.0, -(63 - lg < 46 ? 63 - lg : 46)) + 1e-12 * total;
    for (int i = 0; i < keep_k; i++) {
        int v = rank[i];
        if (v == cpu && cum >= target - tol) // the device's prefix may end before it
            flip = 1;
        if (v == gpu && cum >= target && cum < target + tol) // the device's may reach it
            flip = 1;
        cum += exp((double)lp[v] - l0);
    }
    free(rank);
    return flip;
}

// A row of test_sampling's stress set (kind row % 10): logits quantized to 7 values (whole
// groups of tokens tied at a truncation boundary), raw -inf logits, top_p near 0 and 1, top_k
// 1, 2 and V - 1, top-k with top-p, a flat distribution (a deep top-p boundary). *exact: every
// finite logit the same, so each mass is exactly the top token's in the device's fixed point
// and the reference's double sums alike: no boundary may flip.
static void s_stress_row(t_rng_t *r, float *l, ls_sampling_params_t *p, int row, int V,
                         int *exact) {
    int kind = row % 10, sel = (row / 10) % 4;
    int quant = (kind >= 2 && kind <= 4) || kind == 7 || kind == 8;
    for (int v = 0; v < V; v++)
        l[v] = quant ? 1.5f * (float)(t_rng_int(r, 7) - 3)
                     : 4.0f * (t_rng_float(r, -1, 1) + t_rng_float(r, -1, 1) +
                               t_rng_float(r, -1, 1));
    *exact = kind <= 1;
    if (kind <= 1 || kind == 7) // a third (0, 1) or 40% (7) of the tokens -inf
        for (int v = 1; v < V; v++)
            l[v] = t_rng_int(r, 10) < (kind == 7 ? 4 : 3) ? -INFINITY : kind == 7 ? l[v] : 0.5f;
    if (kind <= 1)
        l[0] = 0.5f;
    static const float p0[4] = {0.3f, 0.5f, 0.999f, 1e-7f};
    static const float p2[4] = {0.1f, 0.5f, 0.9f, 0.97f};
    static const float p5[4] = {1e-7f, 1e-30f, 0.99999994f, 0.9999f};
    const int k1[4] = {1, 7, V / 3, V - 1}, k3[4] = {1, 2, 100, V - 1};
    switch (kind) {
    case 0: p->top_p = p0[sel]; break;
    case 1: p->top_k = k1[sel], p->top_p = sel % 2 ? 0.5f : 0.9f; break;
    case 2: p->top_p = p2[sel]; break;
    case 3: p->top_k = k3[sel]; break;
    case 4: p->top_k = 1000, p->top_p = 0.8f, p->min_p = sel % 2 ? 0.05f : 0.0f; break;
    case 5: p->top_p = p5[sel]; break;
    case 6: p->top_k = sel % 2 ? V - 1 : V, p->top_p = 0.999f; break;
    case 7: p->top_k = 50, p->top_p = 0.9f; break;
    case 8: p->temperature = 0.0f; break; // greedy over ties for the max: the lower id
    case 9: p->temperature = 2.0f, p->top_p = 0.95f; break;
    }
}

// stress 0: random rows of every kind of parameter (penalties, masks, top-n lists); stress 1:
// the truncation's select (s_stress_row), run twice on the device (the same tokens bit for
// bit: its sums are integers).
static void test_sampling(t_rng_t *r, int n_rows, int V, int n_steps, int stress) {
    enum { TOPN = 6 };
    size_t n = (size_t)n_rows * V;
    float *logits = t_alloc(n * 4);
    if (!stress)
        for (size_t i = 0; i < n; i++)
            logits[i] = 4.0f * (t_rng_float(r, -1, 1) + t_rng_float(r, -1, 1) + t_rng_float(r, -1, 1));
    ls_sampling_params_t *sp = calloc((size_t)n_rows, sizeof *sp);
    int32_t *pi = t_alloc((n_rows + 1) * 4), *oi = t_alloc((n_rows + 1) * 4);
    int32_t *pids = t_alloc((size_t)n_rows * 40 * 4), *oids = t_alloc((size_t)n_rows * 30 * 4);
    int *exact = calloc((size_t)n_rows, sizeof *exact);
    pi[0] = oi[0] = 0;
    for (int row = 0; row < n_rows; row++) {
        ls_sampling_params_t *p = &sp[row];
        int kind = row % 8;
        p->temperature = kind == 0 ? 0.0f : t_rng_float(r, 0.5f, 1.5f);
        p->top_k = 0;
        p->top_p = 1.0f;
        p->min_p = 0.0f;
        p->repetition_penalty = 1.0f;
        p->seed = t_rng_next(r);
        p->step = (uint64_t)t_rng_int(r, 1000);
        p->n_logprobs = row % 3 == 0 ? TOPN : row % 3 == 1 ? 2 : 0;
        float *lr = logits + (size_t)row * V;
        if (stress) {
            p->temperature = t_rng_float(r, 0.5f, 1.5f);
            s_stress_row(r, lr, p, row, V, &exact[row]);
            pi[row + 1] = oi[row + 1] = 0;
            continue;
        }
        static const int ks[4] = {1, 5, 50, 1000};
        static const float ps[4] = {0.5f, 0.9f, 0.95f, 0.0f};
        if (kind == 2)
            p->top_k = ks[(row / 8) % 4];
        if (kind == 3)
            p->top_p = ps[(row / 8) % 4];
        if (kind == 4)
            p->min_p = (row / 8) % 2 ? 0.05f : 0.2f;
        if (kind == 5)
            p->top_k = 40, p->top_p = 0.9f, p->min_p = 0.05f;
        if (kind == 6 || (row / 8) % 3 == 1) { // penalties, also on greedy rows
            p->repetition_penalty = 1.3f;
            p->frequency_penalty = 0.5f;
            p->presence_penalty = 0.3f;
        }
        if (kind == 7)
            p->top_p = 0.8f, p->temperature = 0.3f;
        // prompt and output ids among the likely tokens (0..63 are boosted), duplicates
        int np = t_rng_int(r, 40), no = t_rng_int(r, 30);
        for (int i = 0; i < np; i++)
            pids[pi[row] + i] = t_rng_int(r, 64);
        for (int i = 0; i < no; i++)
            oids[oi[row] + i] = t_rng_int(r, 64);
        pi[row + 1] = pi[row] + np;
        oi[row + 1] = oi[row] + no;
        for (int v = 0; v < 64; v++)
            lr[v] += 6.0f;
        if (row == 0) { // an exact tie for the max: the lower id wins
            lr[7] = lr[3] = 40.0f;
        }
    }
    // grammar masks on every fourth row (ops.h step 0): about a third of the tokens allowed,
    // the boosted ones included at random, so masked greedy and seeded rows both differ from
    // their unmasked picks
    int words = (V + 31) / 32, n_masks = 0;
    int32_t *mask_index = t_alloc(n_rows * 4);
    uint32_t *masks = t_alloc((size_t)n_rows * words * 4);
    for (int row = 0; row < n_rows; row++) {
        mask_index[row] = row % 4 == 1 && !stress ? n_masks++ : -1;
        if (mask_index[row] < 0)
            continue;
        uint32_t *m = masks + (size_t)mask_index[row] * words;
        for (int w = 0; w < words; w++)
            m[w] = (uint32_t)t_rng_next(r) & (uint32_t)t_rng_next(r);
        if (V % 32)
            m[words - 1] &= (1u << (V % 32)) - 1;
        m[0] |= 1u << 9;  // never empty
    }
    ls_sampling_batch_t batch = {n_rows, TOPN, sp, pi, pids, oi, oids, mask_index, masks};
    s_pb_t lg = s_pb_new(LS_DTYPE_F32, n + 3);
    s_pb_set(&lg, 3, logits, n);

    int32_t *tc = t_alloc(n_rows * 4), *tg = t_alloc(n_rows * 4), *tg2 = t_alloc(n_rows * 4);
    float *lc = t_alloc(n_rows * 4), *lgp = t_alloc(n_rows * 4), *lgp2 = t_alloc(n_rows * 4);
    int32_t *ic = t_alloc(n_rows * TOPN * 4), *ig = t_alloc(n_rows * TOPN * 4);
    float *vc = t_alloc(n_rows * TOPN * 4), *vg = t_alloc(n_rows * TOPN * 4);
    float *lp = t_alloc((size_t)V * 4);
    int greedy_n = 0, greedy_same = 0, seeded_n = 0, seeded_same = 0, near_ties = 0, bad = 0,
        flips = 0, exact_flips = 0, top_bad = 0, untouched_bad = 0, repeat_bad = 0;
    double lp_max = 0, top_max = 0, worst_gap = 0;
    for (int st = 0; st < n_steps; st++) {
        for (int row = 0; row < n_rows; row++)
            sp[row].step += 1; // a new draw each step, same logits
        for (int i = 0; i < n_rows * TOPN; i++)
            ic[i] = ig[i] = -7, vc[i] = vg[i] = NAN;
        if (ls_sampling_sample(tc, lc, ic, vc, logits, &batch, V) ||
            s_gpu->sample(s_gpu, ls_view(lg.g, 3), V, &batch, tg, lgp, ig, vg) ||
            (stress && s_gpu->sample(s_gpu, ls_view(lg.g, 3), V, &batch, tg2, lgp2, NULL, NULL))) {
            fprintf(stderr, "sample failed\n");
            exit(2);
        }
        for (int row = 0; stress && row < n_rows; row++)
            repeat_bad += tg2[row] != tg[row] || memcmp(&lgp2[row], &lgp[row], 4) != 0;
        for (int row = 0; row < n_rows; row++) {
            const ls_sampling_params_t *p = &sp[row];
            const uint32_t *m = mask_index[row] >= 0 ? masks + (size_t)mask_index[row] * words : NULL;
            int greedy = p->temperature <= 0.0f;
            greedy_n += greedy, seeded_n += !greedy;
            if (m && (!((m[tg[row] >> 5] >> (tg[row] & 31)) & 1) ||
                      !((m[tc[row] >> 5] >> (tc[row] & 31)) & 1))) {
                bad++;
                printf("  row %d picked a masked token: cpu %d gpu %d\n", row, tc[row], tg[row]);
            }
            if (tc[row] == tg[row]) {
                greedy_same += greedy, seeded_same += !greedy;
                double d = fabs((double)lc[row] - lgp[row]);
                lp_max = d > lp_max ? d : lp_max;
            } else if (greedy) {
                bad++;
                printf("  greedy mismatch row %d: cpu %d gpu %d\n", row, tc[row], tg[row]);
            } else {
                s_lp_row(lp, logits + (size_t)row * V, m, p, pids + pi[row], pi[row + 1] - pi[row],
                         oids + oi[row], oi[row + 1] - oi[row], V);
                float ka = s_key(lp, p, tc[row]), kb = s_key(lp, p, tg[row]);
                double gap = fabs((double)ka - kb);
                int tie = gap <= 1e-4 * fmax(1.0, fabs(ka));
                int flip = !tie && s_top_p_flip(lp, p, V, tc[row], tg[row]);
                if (!flip)
                    worst_gap = gap > worst_gap ? gap : worst_gap;
                near_ties += tie;
                flips += flip;
                exact_flips += flip && exact[row];
                bad += !tie && !flip;
                printf("  seeded mismatch row %d step %llu: cpu %d (lp %.7g key %.7g) gpu %d "
                       "(lp %.7g key %.7g) %s\n",
                       row, (unsigned long long)p->step, tc[row], lp[tc[row]], ka, tg[row],
                       lp[tg[row]], kb, tie ? "near-tie" : flip ? "top-p boundary" : "NOT A TIE");
            }
            for (int k = 0; k < TOPN; k++) {
                int i = row * TOPN + k;
                if (k >= p->n_logprobs) {
                    untouched_bad += ig[i] != -7 || !isnan(vg[i]);
                    continue;
                }
                if (ic[i] != ig[i]) {
                    top_bad++;
                    continue;
                }
                double dv = fabs((double)vc[i] - vg[i]);
                top_max = dv > top_max ? dv : top_max;
            }
        }
    }
    const char *what = stress ? "sample select" : "sample";
    char name[96];
    s_res_t *res;
    snprintf(name, sizeof name, "%s V=%d greedy tokens (%d rows x %d steps)", what, V, n_rows,
             n_steps);
    res = s_add_res(name);
    res->n = (size_t)greedy_n;
    res->pass = greedy_same == greedy_n;
    snprintf(res->note, sizeof res->note, "identical %d/%d", greedy_same, greedy_n);
    s_print_res(res);
    snprintf(name, sizeof name, "%s V=%d seeded tokens", what, V);
    res = s_add_res(name);
    res->n = (size_t)seeded_n;
    res->maxabs = worst_gap;
    res->tol_abs = 1e-4;
    res->pass = bad == 0 && near_ties * 100 <= seeded_n && flips * 100 <= seeded_n &&
                exact_flips == 0;
    snprintf(res->note, sizeof res->note,
             "identical %d/%d, near-ties %d, top-p flips %d (exact rows %d), other %d",
             seeded_same, seeded_n, near_ties, flips, exact_flips, bad);
    s_print_res(res);
    snprintf(name, sizeof name, "%s V=%d chosen logprobs", what, V);
    res = s_add_res(name);
    res->n = (size_t)(greedy_same + seeded_same);
    res->maxabs = lp_max;
    res->tol_abs = 1e-5;
    res->pass = lp_max <= 1e-5;
    s_print_res(res);
    snprintf(name, sizeof name, "%s V=%d top-%d logprobs (ids, values, untouched)", what, V, TOPN);
    res = s_add_res(name);
    res->n = (size_t)n_rows * n_steps * TOPN;
    res->maxabs = top_max;
    res->tol_abs = 1e-5;
    res->untouched_bad = untouched_bad;
    res->nan_bad = top_bad;
    res->pass = top_max <= 1e-5 && !top_bad && !untouched_bad;
    snprintf(res->note, sizeof res->note, "id mismatches %d", top_bad);
    s_print_res(res);
    if (stress) {
        snprintf(name, sizeof name, "%s V=%d tokens and logprobs of a second run identical",
                 what, V);
        s_check_true(name, repeat_bad == 0);
    }
    s_pb_free(&lg);
    free(logits), free(mask_index), free(masks), free(sp), free(pi), free(oi), free(pids), free(oids), free(tc), free(tg),
        free(tg2), free(lc), free(lgp), free(lgp2), free(ic), free(ig), free(vc), free(vg), free(lp), free(exact);
}


// -- two engine steps through the tables ---------------------------------------------------

// The attention half of a decoder layer with a LoRA'd qkv projection, two steps (a 6-token
// prefill; then that sequence's decode batched with a 5-token prefill of another sequence
// on the base model), as tests/kernels/test_backend.c runs it on the CPU: step metadata
// handed over once and the host arrays scribbled over right after step_begin, caches
// carried across steps, stacked qkv views. F32 projection weights, so that the whole
// chain stays fp32 and the bound is the fp32 one.
static void test_two_steps(t_rng_t *r) {
    enum { VOCAB = 50, C = 256, H = 4, KV = 2, D = 64, QD = H * D, KVD = KV * D,
           QKV = QD + 2 * KVD, BS = 4, NB = 16, MAXB = 4, R_MAX = 16, SLOTS = 3, MAX_T = 6,
           CACHE = NB * BS * KVD };
    static const int32_t tables[2 * MAXB] = {9, 2, 14, 5, 11, 0, 7, 3};
    static const int32_t off[4] = {0, QD, QD + KVD, QKV};
    s_pb_t tab = s_pb_new(LS_DTYPE_BF16, VOCAB * C), wq = s_pb_new(LS_DTYPE_F32, QKV * C),
           nw = s_pb_new(LS_DTYPE_BF16, C), inv = s_pb_new(LS_DTYPE_F32, D / 2),
           act = s_pb_new(LS_DTYPE_F32, MAX_T * (2 * C + QKV + 3 * R_MAX + QD) + 2 * QD),
           kc = s_pb_new(LS_DTYPE_F32, CACHE), vc = s_pb_new(LS_DTYPE_F32, CACHE);
    float *h = s_fill_new(r, QKV * C, -0.2f, 0.2f);
    s_pb_set(&wq, 0, h, QKV * C);
    t_fill(r, h, VOCAB * C, -1, 1);
    s_pb_set(&tab, 0, h, VOCAB * C);
    t_fill(r, h, C, 0.5f, 1.5f);
    s_pb_set(&nw, 0, h, C);
    static const int32_t ranks[SLOTS] = {0, 8, 16};
    float *ha = s_fill_new(r, SLOTS * 3 * R_MAX * C, -0.1f, 0.1f), *hb = s_fill_new(r, SLOTS * QKV * R_MAX, -0.1f, 0.1f);
    s_pm_t a = s_pm_rows(r, ha, SLOTS, ranks, 3, R_MAX, C, 0, LS_DTYPE_BF16);
    s_pm_t b = s_pm_chunks(r, hb, SLOTS, ranks, QKV, R_MAX, 0, 0, LS_DTYPE_BF16);
    free(ha), free(hb);
    ls_rope_config_t cfg = {LS_ROPE_DEFAULT, 10000.0, 1, 1, 1, 1};
    ls_rope_inv_freq_init(h, D, &cfg);
    s_pb_set(&inv, 0, h, D / 2);
    // F32 caches: the CPU backend stores every buffer as f32, so a BF16 cache would differ
    // from the GPU's by bf16 rounding of k and v (the bf16 cache path is checked exactly
    // above, on values bf16 holds)
    s_cpu->buffer_zero(s_cpu, ls_view(kc.c, 0), CACHE), s_gpu->buffer_zero(s_gpu, ls_view(kc.g, 0), CACHE);
    s_cpu->buffer_zero(s_cpu, ls_view(vc.c, 0), CACHE), s_gpu->buffer_zero(s_gpu, ls_view(vc.g, 0), CACHE);
    size_t o_h = 0, o_xn = MAX_T * C, o_qkv = 2 * MAX_T * C, o_tmp = o_qkv + MAX_T * QKV,
           o_att = o_tmp + MAX_T * 3 * R_MAX, o_pick = o_att + MAX_T * QD;
    static s_stepd_t d;
    for (int stp = 0; stp < 2; stp++) {
        memset(&d, 0, sizeof d);
        int n_cached[2] = {stp ? 6 : 0, 0}, n_new[2] = {stp ? 1 : 6, 5},
            slot[2] = {stp ? 2 : 1, 0}, S = stp ? 2 : 1, T = 0;
        memcpy(d.tables, tables, sizeof tables);
        for (int s = 0; s < S; s++) {
            for (int j = n_cached[s]; j < n_cached[s] + n_new[s]; j++, T++) {
                d.ids[T] = t_rng_int(r, VOCAB);
                d.pos[T] = j;
                d.slot[T] = tables[s * MAXB + j / BS] * BS + j % BS;
            }
            d.q_indptr[s + 1] = d.seg_indptr[s + 1] = T;
            d.ctx[s] = n_cached[s] + n_new[s];
            d.logit_rows[s] = T - 1;
            d.wi[s] = slot[s];
        }
        d.T = T, d.S = S, d.max_blocks = MAXB, d.max_ctx = MAXB * BS, d.n_logit = S;
        d.has_lora = 1, d.n_segs = S, d.n_slots = SLOTS;
        d.ranks[0] = 0, d.ranks[1] = 8, d.ranks[2] = 16;
        d.scal[0] = 0, d.scal[1] = 2.0f, d.scal[2] = 0.5f;
        s_step_begin(&d);
        memset(&d, 0x7f, sizeof d); // the backends work from their own copies
        ls_backend_t *be[2] = {s_cpu, s_gpu};
        for (int i = 0; i < 2; i++) {
            ls_backend_t *B = be[i];
            ls_buffer_t *A = i ? act.g : act.c;
#define V_(pb) ls_view(i ? (pb).g : (pb).c, 0)
            B->embedding(B, ls_view(A, o_h), V_(tab), C, 0, VOCAB);
            B->rmsnorm(B, ls_view(A, o_xn), LS_VIEW_NONE, LS_VIEW_NONE, LS_VIEW_NONE,
                       ls_view(A, o_h), LS_VIEW_NONE, V_(nw), T, C, 1e-5f);
            B->matmul(B, ls_view(A, o_qkv), ls_view(A, o_xn), V_(wq), LS_VIEW_NONE, T, C, QKV, 0);
            B->lora_shrink(B, ls_view(A, o_tmp), ls_view(A, o_xn), a.m[i], C, 3, R_MAX, 0);
            B->lora_expand(B, ls_view(A, o_qkv), ls_view(A, o_tmp), b.m[i], off, 3, R_MAX, 0);
            B->rope_kv_store(B, ls_view(A, o_qkv), LS_VIEW_NONE, V_(inv), V_(kc), V_(vc), H, KV, D,
                             QKV, BS, (size_t)BS * KVD);
            B->attention(B, ls_view(A, o_att), ls_view(A, o_qkv), V_(kc), V_(vc), H, KV, D, BS,
                         QKV, (size_t)BS * KVD);
            B->rows_gather(B, ls_view(A, o_pick), ls_view(A, o_att), QD);
#undef V_
            if (B->synchronize(B)) {
                fprintf(stderr, "two steps: device fault\n");
                exit(2);
            }
        }
        float *c = t_alloc(CACHE * 4), *g = t_alloc(CACHE * 4);
        char name[96];
        s_pb_get(&act, o_qkv, (size_t)T * QKV, c, g);
        snprintf(name, sizeof name, "two steps: step %d qkv (matmul+lora+rope), T=%d", stp + 1, T);
        s_check(name, g, c, (size_t)T * QKV, 1e-10, 1e-4);
        s_pb_get(&kc, 0, CACHE, c, g);
        snprintf(name, sizeof name, "two steps: step %d k cache", stp + 1);
        s_check(name, g, c, CACHE, 1e-10, 1e-4);
        s_pb_get(&act, o_pick, (size_t)S * QD, c, g);
        snprintf(name, sizeof name, "two steps: step %d attention, picked rows", stp + 1);
        s_check(name, g, c, (size_t)S * QD, 1e-10, 1e-4);
        free(c), free(g);
    }
    s_pb_free(&tab), s_pb_free(&wq), s_pb_free(&nw), s_pb_free(&inv), s_pm_free(&a);
    s_pm_free(&b), s_pb_free(&act), s_pb_free(&kc), s_pb_free(&vc);
    free(h);
}


int main(int argc, char **argv) {
    char err[256] = "";
    int device = argc > 1 ? atoi(argv[1]) : 0;
    s_cpu = ls_backend_cpu_new(0);
    s_gpu = ls_backend_cuda_new(device, err, sizeof err);
    if (!s_cpu || !s_gpu) {
        fprintf(stderr, "backend init failed: %s\n", err);
        return 2;
    }
    t_rng_t r = {20261122};
    printf("%-58s %8s %10s %8s %10s %8s %5s %5s\n", "test", "n", "nmse", "tol", "maxabs",
           "tol_abs", "untch", "nan");

    test_buffers(&r);
    test_lora_local_memory();
    // LoRA slot loads: A of qkv (3 slices of rank 8 into 16 of 512), B (1536 rows, rank 8 of
    // 64), an untouched group (zero fill), an f32 pool, and a larger image after a smaller
    // one (the staging area grows)
    test_upload_padded(&r, LS_DTYPE_BF16, 8 * 512, 3, 4, 16 * 512, 5 * 3 * 16 * 512, 7);
    test_upload_padded(&r, LS_DTYPE_BF16, 8, 1536, 4, 64, 3 * 1536 * 64, 3);
    test_upload_padded(&r, LS_DTYPE_BF16, 0, 1536, 4, 64, 2 * 1536 * 64, 1);
    test_upload_padded(&r, LS_DTYPE_F32, 3, 100, 6, 12, 1300, 5);
    test_upload_padded(&r, LS_DTYPE_BF16, 64 * 4096, 2, 32, 64 * 4096, 3 * 2 * 64 * 4096, 16);

    // cuBLAS's shapes, then the GEMV of up to LS_CU_GEMV_MAX_T tokens (dev_gemv checks every
    // count): each of its forms (one token; the tensor-core form's one and two tiles of 8
    // tokens, tokens past T in a tile), rows past its last block's, long rows, K past its last
    // whole segment of 256 (520, 1032) and shorter than a segment a warp, f16, bias and
    // accumulate; in % 8 != 0 goes to cuBLAS
    static const struct {
        int T, in, out;
        ls_dtype_t wdt;
        int bias;
        ls_dtype_t bdt;
        int acc;
    } mms[] = {
        {1, 512, 768, LS_DTYPE_BF16, 0, LS_DTYPE_BF16, 0},
        {37, 512, 384, LS_DTYPE_BF16, 1, LS_DTYPE_BF16, 0},
        {64, 1024, 256, LS_DTYPE_BF16, 1, LS_DTYPE_F32, 1},
        {3, 4096, 1000, LS_DTYPE_BF16, 0, LS_DTYPE_BF16, 1},
        {5, 256, 320, LS_DTYPE_F32, 1, LS_DTYPE_F32, 1},
        {33, 300, 130, LS_DTYPE_F32, 0, LS_DTYPE_F32, 0},
        {9, 256, 128, LS_DTYPE_F16, 1, LS_DTYPE_F16, 0},
        {2, 1024, 37, LS_DTYPE_BF16, 1, LS_DTYPE_F32, 1},
        {4, 4096, 2048, LS_DTYPE_BF16, 1, LS_DTYPE_BF16, 0},
        {4, 768, 96, LS_DTYPE_F16, 1, LS_DTYPE_F16, 1},
        {3, 512, 37, LS_DTYPE_BF16, 1, LS_DTYPE_BF16, 1},
        {2, 768, 96, LS_DTYPE_F16, 1, LS_DTYPE_F16, 1},
        {2, 14336, 512, LS_DTYPE_BF16, 0, LS_DTYPE_BF16, 0},
        {1, 14336, 4096, LS_DTYPE_BF16, 0, LS_DTYPE_BF16, 0},
        {1, 300, 130, LS_DTYPE_BF16, 0, LS_DTYPE_BF16, 0},
        {5, 4096, 1000, LS_DTYPE_BF16, 1, LS_DTYPE_BF16, 1},
        {8, 520, 37, LS_DTYPE_BF16, 1, LS_DTYPE_F32, 1},
        {6, 2048, 96, LS_DTYPE_F16, 0, LS_DTYPE_F16, 1},
        {12, 1032, 200, LS_DTYPE_F16, 1, LS_DTYPE_F16, 0},
        {16, 14336, 512, LS_DTYPE_BF16, 0, LS_DTYPE_BF16, 0},
        {11, 4096, 6144, LS_DTYPE_BF16, 1, LS_DTYPE_F32, 1},
    };
    // every form of the GEMV and of the FP8 tensor-core GEMM on any device (the backend gives
    // them up to ls_cu_gemv_tokens() tokens: 8 on an H200, whose 9-16 then go to cuBLAS(Lt)
    // as past 16 everywhere); the device's own choice at 12 tokens after them
    ls_backend_cuda_set_gemv_tokens(s_gpu, LS_CU_GEMV_MAX_T);
    for (size_t i = 0; i < sizeof mms / sizeof mms[0]; i++)
        test_matmul(&r, mms[i].T, mms[i].in, mms[i].out, mms[i].wdt, mms[i].bias, mms[i].bdt,
                    mms[i].acc);
    // FP8: Llama-3-8B's decode shapes (qkv, o, gate_up, down) at batch 1, 8, 64, a prefill
    // chunk, odd widths and biases; every path where production takes it (tc at T <=
    // LS_FP8_TC_T on sm_89+), then without tc (small at T <=
    // LS_FP8_SMALL_T, as on sm_80), then cuBLASLt alone, both ways of its applying the scales
    for (int allow = 3; allow >= 0; allow--) {
        int outer = allow > 0, small = allow >= 2, tc = allow == 3;
        test_matmul_fp8(&r, 1, 4096, 6144, 0, LS_DTYPE_BF16, outer, small, tc);
        test_matmul_fp8(&r, 8, 4096, 4096, 1, LS_DTYPE_BF16, outer, small, tc);
        test_matmul_fp8(&r, 64, 4096, 28672, 0, LS_DTYPE_BF16, outer, small, tc);
        test_matmul_fp8(&r, 64, 14336, 4096, 1, LS_DTYPE_F32, outer, small, tc);
        test_matmul_fp8(&r, 300, 1024, 1000, 0, LS_DTYPE_BF16, outer, small, tc);
        test_matmul_fp8(&r, 5, 80, 48, 1, LS_DTYPE_F16, outer, small, tc);
    }
    // the tensor-core GEMM where production takes it (T <= LS_FP8_TC_T): one and two tiles of
    // 8 tokens, tokens past T in a tile (1, 2, 5), Llama-3-8B's four shapes with biases, and
    // rows past out (out % 16 != 0: 200, 37), rows shorter than a warp's share of segments
    // (512 codes: the last warp takes them all) and K past the last whole segment and
    // 64-code mma pair (1,040 = two segments and a 16-code chunk; 208; 96); its passes of 16
    // tokens past 16 are dev_fp8's to check. On a device without it (sm_80) these run small or
    // cuBLASLt (the name says).
    test_matmul_fp8(&r, 1, 4096, 6144, 1, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 2, 4096, 4096, 1, LS_DTYPE_F16, 1, 1, 1);
    test_matmul_fp8(&r, 5, 4096, 28672, 1, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 8, 14336, 4096, 1, LS_DTYPE_F32, 1, 1, 1);
    test_matmul_fp8(&r, 16, 4096, 6144, 1, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 16, 14336, 4096, 0, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 1, 512, 37, 1, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 5, 512, 200, 1, LS_DTYPE_F16, 1, 1, 1);
    test_matmul_fp8(&r, 16, 512, 200, 1, LS_DTYPE_F32, 1, 1, 1);
    // the CUDA-core GEMM where production takes it without tc (T <= LS_FP8_SMALL_T: 1 and 2
    // tokens a pass), with rows past out (out % 4 != 0) and biases; its wider token groups (4
    // and 8 a pass, several passes) are dev_fp8's to check; past the threshold cuBLASLt, at
    // widths whose rows of y stay 16-byte aligned (the models' are multiples of 16)
    test_matmul_fp8(&r, 2, 4096, 4096, 0, LS_DTYPE_BF16, 1, 1, 0);
    test_matmul_fp8(&r, 1, 96, 37, 0, LS_DTYPE_BF16, 1, 1, 0);
    test_matmul_fp8(&r, 2, 96, 37, 1, LS_DTYPE_F16, 1, 1, 0);
    test_matmul_fp8(&r, 2, 512, 200, 1, LS_DTYPE_F16, 1, 1, 0);
    test_matmul_fp8(&r, 3, 1024, 1000, 1, LS_DTYPE_BF16, 1, 1, 0);
    test_matmul_fp8(&r, 4, 14336, 4096, 1, LS_DTYPE_F32, 1, 1, 0);
    test_matmul_fp8(&r, 7, 1040, 53, 1, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 13, 208, 100, 0, LS_DTYPE_BF16, 1, 1, 1);
    test_matmul_fp8(&r, 2, 96, 37, 1, LS_DTYPE_BF16, 1, 1, 1);
    // the quantizing pass at 8 values a thread (the shapes above: 4, 16, and the loop kernel
    // at 80, 96, 208, 1,040)
    test_matmul_fp8(&r, 3, 6144, 256, 0, LS_DTYPE_BF16, 1, 1, 1);
    ls_backend_cuda_set_gemv_tokens(s_gpu, -1);
    {
        int gt = ls_cu_gemv_tokens();
        char name[64];
        snprintf(name, sizeof name, "the GEMV's tokens on this device: %d (8 or 16)", gt);
        s_check_true(name, gt == 8 || gt == LS_CU_GEMV_MAX_T);
    }
    // decode_block: Llama-3-8B's widths (to the next layer and the last), the llama fixture's
    // (hidden 64, intermediate 160: rows shorter than a unit), widths that leave a short
    // last unit and a q width apart from the hidden one, biases on every projection
    test_decode_block(&r, 4096, 4096, 14336, 6144, 1, 0);
    test_decode_block(&r, 4096, 4096, 14336, 6144, 0, 0);
    test_decode_block(&r, 64, 64, 160, 128, 1, 1);
    test_decode_block(&r, 64, 64, 160, 128, 0, 0);
    test_decode_block(&r, 1544, 1032, 3080, 2056, 1, 1);
    test_matmul(&r, 12, 4096, 1024, LS_DTYPE_BF16, 1, LS_DTYPE_BF16, 0);
    test_matmul_fp8(&r, 12, 4096, 1024, 1, LS_DTYPE_BF16, 1, 1, 1);

    test_embedding_gather(&r);
    test_rmsnorm(&r, 13, 4096, LS_DTYPE_BF16, 1, 0, 0, 0);
    test_rmsnorm(&r, 13, 4096, LS_DTYPE_F32, 0, 1, 0, 0);
    test_rmsnorm(&r, 5, 1000, LS_DTYPE_BF16, 1, 1, 0, 0);
    test_rmsnorm(&r, 13, 4096, LS_DTYPE_BF16, 1, 0, 1, 0);
    test_rmsnorm(&r, 5, 1000, LS_DTYPE_F32, 0, 1, 1, 0);
    // the register kernel at other widths (2,048: 256 threads; 5,120: 640), and 4,096 with its
    // rows 16-byte aligned (the cases above) or not (an odd row count does not unalign them)
    test_rmsnorm(&r, 7, 2048, LS_DTYPE_BF16, 1, 1, 1, 0);
    test_rmsnorm(&r, 64, 5120, LS_DTYPE_BF16, 1, 0, 1, 0);
    // FP8 models' norms: the codes of the qkv / gate_up input beside out, from the register
    // kernel (4,096, 5,120) and the two-pass one (1,000, out = x)
    test_rmsnorm(&r, 13, 4096, LS_DTYPE_BF16, 1, 0, 1, 1);
    test_rmsnorm(&r, 64, 5120, LS_DTYPE_BF16, 1, 0, 1, 1);
    test_rmsnorm(&r, 5, 1000, LS_DTYPE_F32, 0, 1, 1, 1);
    test_rmsnorm_heads(&r);
    // 8-head blocks: q's alone, k's and v's (12 heads), q, k and v in one block and v's
    // alone in the next (18), v's alone in a whole block (48: Llama-3-8B at batch 1), one
    // partial block (7); GQA groups 1, 4, 5, 7; head_dim 64, 128, 256
    test_rope_kv_store(&r, LS_ROPE_LLAMA3, 1, 32, 8, 128, LS_DTYPE_BF16, 1);
    test_rope_kv_store(&r, LS_ROPE_DEFAULT, 19, 8, 2, 128, LS_DTYPE_F32, 0);
    test_rope_kv_store(&r, LS_ROPE_LLAMA3, 7, 12, 3, 64, LS_DTYPE_F16, 1);
    test_rope_kv_store(&r, LS_ROPE_DEFAULT, 5, 32, 8, 256, LS_DTYPE_BF16, 0);
    test_rope_kv_store(&r, LS_ROPE_DEFAULT, 33, 14, 2, 64, LS_DTYPE_BF16, 1);
    test_rope_kv_store(&r, LS_ROPE_LLAMA3, 64, 28, 4, 128, LS_DTYPE_F32, 1);
    test_rope_kv_store(&r, LS_ROPE_DEFAULT, 3, 4, 4, 256, LS_DTYPE_F16, 0);
    test_rope_kv_store(&r, LS_ROPE_LLAMA3, 2, 5, 1, 128, LS_DTYPE_BF16, 1);
    test_silu_add(&r, 1000);
    test_silu_add(&r, 1002);
    // the FP8 register kernel at 16, 8 and 4 values a thread (Llama-3-8B's 14,336: 896
    // threads a row; 768; 640), the loop kernel where no layout fits (1,000, 1,002)
    test_silu_add(&r, 14336);
    test_silu_add(&r, 6144);
    test_silu_add(&r, 2560);

    {
        int nc[3] = {0, 21, 40}, nn[3] = {17, 5, 9};
        test_attention(&r, "prefill on cached prefix+pad", 3, nc, nn, 8, 2, 128, 16,
                       LS_DTYPE_BF16, 1, 1);
        test_attention(&r, "prefill on cached prefix+pad", 3, nc, nn, 8, 2, 128, 16,
                       LS_DTYPE_F32, 1, 1);
    }
    {
        int nc[24], nn[24];
        for (int s = 0; s < 24; s++)
            nc[s] = t_rng_int(&r, 300), nn[s] = 1;
        nc[0] = 0;
        test_attention(&r, "decode x24", 24, nc, nn, 32, 8, 128, 16, LS_DTYPE_BF16, 0, 1);
        test_attention(&r, "decode x24 group16", 24, nc, nn, 16, 1, 64, 16, LS_DTYPE_F32, 0, 1);
        test_attention(&r, "decode x24 group7", 24, nc, nn, 14, 2, 80, 32, LS_DTYPE_F32, 0, 1);
        test_attention(&r, "decode x24", 24, nc, nn, 8, 4, 256, 16, LS_DTYPE_BF16, 0, 1);
        // bf16 rows of 72 B: not 16-byte chunks, so the v1 kernel (fallback) runs
        test_attention(&r, "decode x24 (v1 path)", 24, nc, nn, 8, 2, 36, 16, LS_DTYPE_BF16, 0, 1);
        // tensor-core kernel: half the head slots empty (group 2), pages of 24 (no shift);
        // two passes of 4 heads (group 8); multi-head (group 1)
        test_attention(&r, "decode x24 group2", 24, nc, nn, 8, 4, 64, 24, LS_DTYPE_BF16, 0, 1);
        test_attention(&r, "decode x24 group8", 24, nc, nn, 16, 2, 128, 32, LS_DTYPE_BF16, 0, 1);
        test_attention(&r, "decode x24 group1", 24, nc, nn, 4, 4, 64, 16, LS_DTYPE_BF16, 0, 1);
    }
    {
        // long contexts: the keys of a (token, kv head) split over a thread-block cluster —
        // 8 CTAs for one sequence, up to 5 for three (24 items: no more CTAs than SMs), one
        // of which has a single key, so that most CTAs of its cluster see none
        int nc1[1] = {3100}, nn1[1] = {1}, nc3[3] = {2999, 0, 1533}, nn3[3] = {1, 1, 1};
        test_attention(&r, "decode long x1", 1, nc1, nn1, 32, 8, 128, 16, LS_DTYPE_BF16, 0, 1);
        test_attention(&r, "decode long x3", 3, nc3, nn3, 32, 8, 128, 16, LS_DTYPE_BF16, 0, 1);
        // batch 4 of Llama-3-8B's heads on ~1K keys: 32 items in clusters (sm_90), of at most
        // SMs / 32 CTAs each
        int nc4[4] = {1000, 1030, 700, 1023}, nn4[4] = {1, 1, 1, 1}, w, cs, sms, major;
        test_attention(&r, "decode x4 on 1K", 4, nc4, nn4, 32, 8, 128, 16, LS_DTYPE_BF16, 0, 1);
        ls_cu_attention_last_plan(&w, &cs);
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) ==
                cudaSuccess &&
            major >= 9)
            s_check_true("attention decode x4 on 1K: clusters, no more CTAs than SMs",
                         cs >= 2 && 4 * 8 * cs <= sms);
        // the FFMA kernel (v2) on the same split: bf16 rows of 512 B
        test_attention(&r, "decode long x1", 1, nc1, nn1, 8, 4, 256, 16, LS_DTYPE_BF16, 0, 1);
        // a prefill chunk on a long prefix, group 7 in two passes (4 + 3 heads), f32 cache
        int ncp[1] = {2000}, nnp[1] = {5};
        test_attention(&r, "prefill 5 on 2000 cached", 1, ncp, nnp, 14, 2, 80, 16,
                       LS_DTYPE_F32, 0, 1);
    }
    {
        int nc[2] = {100, 3}, nn[2] = {130, 60}; // long chunk, every warp busy
        test_attention(&r, "prefill chunk 130+60", 2, nc, nn, 16, 4, 128, 16, LS_DTYPE_BF16, 0, 1);
    }
    {
        test_prefill_pick();
        // the prefill kernel beside decodes and short chunks in one call: GQA groups 4, 1, 8,
        // 4 with peaked softmax (q in [-3, 3]), head_dim 128 and 64, pages of 16, 32 and 24
        // (no shift), Llama-3-8B's heads; and a prompt of 2,000 tokens beside two decodes
        test_attention_prefill(&r, 8, 600, 800, 8, 2, 128, 16, 1);
        test_attention_prefill(&r, 8, 400, 600, 4, 4, 64, 32, 1);
        test_attention_prefill(&r, 6, 300, 500, 16, 2, 128, 32, 1);
        test_attention_prefill(&r, 8, 400, 600, 8, 2, 64, 16, 3);
        test_attention_prefill(&r, 6, 200, 300, 8, 2, 128, 24, 1);
        test_attention_prefill(&r, 5, 150, 300, 32, 8, 128, 16, 1);
        // the split the pick makes: 16-token chunks on like prefixes and a fresh 17-token
        // prompt go with a 200-token chunk to the prefill kernel, a 16-token chunk on a
        // context three times longer and a decode stay decode-shaped (their rows at 1e-10)
        int ncs[7] = {1000, 3000, 0, 1000, 500, 1000, 1000}, nns[7] = {16, 16, 17, 200, 1, 16, 16};
        s_check_true("prefill pick split: 5 sequences to the prefill kernel",
                     test_attention(&r, "prefill pick split", 7, ncs, nns, 8, 2, 128, 16,
                                    LS_DTYPE_BF16, 0, 1) == 5);
        int nc[3] = {40, 0, 700}, nn[3] = {1, 2000, 1};
        test_attention(&r, "prompt of 2000", 3, nc, nn, 4, 1, 128, 16, LS_DTYPE_BF16, 0, 1);
        // the backend splits by the constants of the kernel that runs: a prompt of 150 is
        // the warpgroup kernel's (head_dim 128 on a compute capability 9.0 device), the
        // decode-shaped kernel's on mma.sync (head_dim 64, other devices)
        int nc150[1] = {0}, nn150[1] = {150};
        for (int D = 64; D <= 128; D += 64) {
            char what[64], name[128];
            snprintf(what, sizeof what, "prompt of 150 D=%d", D);
            int n = test_attention(&r, what, 1, nc150, nn150, 8, 2, D, 16, LS_DTYPE_BF16, 0, 1);
            snprintf(name, sizeof name, "%s: %d sequences to the prefill kernel", what, n);
            s_check_true(name, n == s_wgmma_here(D));
        }
    }

    static const int sz3[3] = {512, 128, 128}, sz2[2] = {384, 384}, sz1[1] = {520},
                     szodd[3] = {300, 0, 77};
    int n_layouts = (int)(sizeof s_layouts / sizeof s_layouts[0]);
    for (int l = 0; l < n_layouts; l++) {
        test_lora(&r, &s_layouts[l], 3, sz3, 512, 64, LS_DTYPE_BF16, 0, 0, 0);
        test_lora(&r, &s_layouts[l], 2, sz2, 512, 64, LS_DTYPE_BF16, 0, 0, 0);
        test_lora(&r, &s_layouts[l], 1, sz1, 512, 64, LS_DTYPE_BF16, 0, 0, 0);
    }
    test_lora(&r, &s_layouts[2], 3, sz3, 512, 64, LS_DTYPE_F32, 0, 0, 0);
    test_lora(&r, &s_layouts[4], 2, sz2, 512, 64, LS_DTYPE_F32, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 3, sz3, 512, 16, LS_DTYPE_BF16, 0, 0, 0);
    // the tensor-core shrink's other m-tile counts: r_max 32 over 2 slices, 8 over 3
    test_lora(&r, &s_layouts[2], 2, sz2, 512, 32, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[0], 3, sz3, 512, 8, LS_DTYPE_BF16, 0, 0, 0);
    // Llama-3-8B's qkv and o shapes on few tiles: the tensor-core shrink splits K over
    // clusters of 4 (in 4096, 10 tiles x 3 slices) and 8 (in 8192, 8 tiles x 1 slice)
    static const int szq[3] = {4096, 1024, 1024}, szo[1] = {4096};
    test_lora(&r, &s_layouts[0], 3, szq, 4096, 16, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[4], 1, szo, 8192, 16, LS_DTYPE_BF16, 0, 0, 0);
    // decode over distinct adapters (one-position tiles, LS_CU_LORA_ONE) at Llama-3-8B's
    // gate_up and qkv shapes, where the decode op splits K into parts and the one-token
    // expand covers long outputs; and that layout's f32 and f16 pools (other kernels)
    static const int szgu[2] = {14336, 14336};
    test_lora(&r, &s_layouts[1], 2, szgu, 4096, 16, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 3, szq, 4096, 64, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 1, szo, 14336, 16, LS_DTYPE_BF16, 0, 0, 0); // down: K in 7 parts
    // shrink v3's two block sizes at their boundary: in 8192 is K in 8 parts of 1024 (blocks
    // of 128 threads), 8200 in 5 parts of 2048 (blocks of 256)
    test_lora(&r, &s_layouts[1], 1, szo, 8192, 16, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 1, szo, 8200, 16, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 2, sz2, 512, 32, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 2, sz2, 512, 64, LS_DTYPE_F32, 0, 0, 0);
    test_lora(&r, &s_layouts[1], 1, sz1, 512, 8, LS_DTYPE_F16, 0, 0, 0);
    test_lora(&r, &s_layouts[4], 3, szodd, 100, 12, LS_DTYPE_BF16, 0, 0, 0);  // scalar paths
    test_lora(&r, &s_layouts[3], 1, sz1, 1000, 12, LS_DTYPE_F16, 0, 0, 0);
    // x in the pool's 16-bit dtype (the engine's LoRA input where the matmul reads that
    // copy): every layout through the tensor-core shrink and the decode op, Llama-3-8B's
    // qkv and down shapes (clusters, K in parts), f16 pools (v2 and v3), pieces (v1)
    static const struct {
        int layout, n_slices;
        const int *sizes;
        int in, r_max;
        ls_dtype_t pdt;
    } x16[] = {{0, 3, szq, 4096, 16, LS_DTYPE_BF16}, {1, 3, szq, 4096, 64, LS_DTYPE_BF16},
               {1, 1, szo, 14336, 16, LS_DTYPE_BF16}, {1, 1, sz1, 512, 8, LS_DTYPE_F16},
               {2, 2, sz2, 512, 32, LS_DTYPE_F16}, {4, 3, szodd, 100, 12, LS_DTYPE_BF16}};
    for (int l = 0; l < n_layouts; l++)
        test_lora(&r, &s_layouts[l], 3, sz3, 512, 64, LS_DTYPE_BF16, 0, 0, 1);
    for (size_t i = 0; i < sizeof x16 / sizeof x16[0]; i++)
        test_lora(&r, &s_layouts[x16[i].layout], x16[i].n_slices, x16[i].sizes, x16[i].in,
                  x16[i].r_max, x16[i].pdt, 0, 0, 1);
    // small ranks in wide slots (the server's mixed-rank setting; the loop above has the
    // multi-position tiles of layout 3 so): decode, one-position tiles, at Llama-3-8B's qkv
    // and gate_up
    test_lora(&r, &s_layouts[5], 3, szq, 4096, 64, LS_DTYPE_BF16, 0, 0, 0);
    test_lora(&r, &s_layouts[5], 2, szgu, 4096, 64, LS_DTYPE_BF16, 0, 0, 0);
    // gate_up's shape on the serving mix (tiles of every length, ranks 8-64): SiLU·mul making
    // its delta (s_silu_lora_check) over many blocks a tile
    test_lora(&r, &s_layouts[6], 2, szgu, 4096, 64, LS_DTYPE_BF16, 0, 0, 0);
    // mixes of adapters: a second pass over some of the rows and weights on every segment
    // (the tiles' scales), each layout's ops over both passes; and the decode shapes
    for (int l = 0; l < n_layouts; l++)
        test_lora(&r, &s_layouts[l], 3, sz3, 512, 64, LS_DTYPE_BF16, 1, 0, 0);
    test_lora(&r, &s_layouts[1], 3, szq, 4096, 16, LS_DTYPE_BF16, 1, 0, 0);
    test_lora(&r, &s_layouts[5], 2, szgu, 4096, 64, LS_DTYPE_BF16, 1, 0, 0);
    test_lora(&r, &s_layouts[3], 1, sz1, 1000, 12, LS_DTYPE_F16, 1, 0, 0);
    // the embedding's LoRA (a gather, then the expand) and lm_head's on the logit rows, alone
    // and in mixes (a second pass, the tiles' scales with the weights)
    test_lora_embed(&r, &s_layouts[0], 1000, 512, 16, LS_DTYPE_BF16, 0, 0);
    test_lora_embed(&r, &s_layouts[4], 5003, 4096, 64, LS_DTYPE_BF16, 0, 0);
    test_lora_embed(&r, &s_layouts[6], 1000, 256, 64, LS_DTYPE_F32, 0, 0);
    test_lora_embed(&r, &s_layouts[1], 777, 100, 12, LS_DTYPE_F16, 0, 0);
    test_lora_embed(&r, &s_layouts[4], 5003, 4096, 64, LS_DTYPE_BF16, 1, 0);
    test_lora_embed(&r, &s_layouts[6], 1000, 256, 64, LS_DTYPE_F32, 1, 0);
    test_lora_embed(&r, &s_layouts[1], 777, 100, 12, LS_DTYPE_F16, 1, 0);
    test_lora_rows(&r, 9, 4096, 32000, 16, LS_DTYPE_BF16, 0, 0);
    test_lora_rows(&r, 64, 4096, 128256, 16, LS_DTYPE_BF16, 0, 0);
    test_lora_rows(&r, 3, 100, 1001, 12, LS_DTYPE_F32, 0, 0);
    test_lora_rows(&r, 6, 512, 3000, 64, LS_DTYPE_F16, 0, 0);
    test_lora_rows(&r, 9, 4096, 32000, 16, LS_DTYPE_BF16, 1, 0);
    test_lora_rows(&r, 6, 512, 3000, 64, LS_DTYPE_F16, 1, 0);
    // pages smaller than a row (docs/memory.md): A's rows and B's chunks in pieces, which the
    // fallback kernels take, in every layout, decode shapes, mixes and the vocabulary ops
    for (int l = 0; l < n_layouts; l++)
        test_lora(&r, &s_layouts[l], 3, sz3, 512, 64, LS_DTYPE_BF16, l % 2, 1, 0);
    test_lora(&r, &s_layouts[1], 1, szo, 14336, 16, LS_DTYPE_BF16, 0, 1, 0);
    test_lora(&r, &s_layouts[2], 2, sz2, 512, 64, LS_DTYPE_F32, 0, 1, 0);
    test_lora(&r, &s_layouts[3], 1, sz1, 1000, 12, LS_DTYPE_F16, 1, 1, 0);
    test_lora(&r, &s_layouts[1], 3, sz3, 512, 64, LS_DTYPE_BF16, 0, 1, 1);  // x16 in pieces
    test_lora_embed(&r, &s_layouts[4], 5003, 4096, 64, LS_DTYPE_BF16, 1, 1);
    test_lora_embed(&r, &s_layouts[1], 777, 100, 12, LS_DTYPE_F16, 0, 1);
    test_lora_rows(&r, 64, 4096, 128256, 16, LS_DTYPE_BF16, 0, 1);
    test_lora_rows(&r, 3, 100, 1001, 12, LS_DTYPE_F32, 1, 1);
    // trainable tokens: the embedding rows copied over the embedding's output, lm_head's
    // logits of the listed ids recomputed on the logit rows
    test_token_rows(&r, 300, 4096, 64, LS_DTYPE_BF16);
    test_token_rows(&r, 7, 100, 3, LS_DTYPE_F32);
    test_token_rows(&r, 64, 512, 256, LS_DTYPE_F16);
    test_token_logits(&r, 64, 4096, 128256, 256, LS_DTYPE_BF16);
    test_token_logits(&r, 5, 100, 1001, 7, LS_DTYPE_F32);
    test_token_logits(&r, 33, 512, 32000, 64, LS_DTYPE_F16);
    // added vocabulary: the logits rows widened past the vocabulary, added ids' logits in them
    test_logits_widen(&r, 64, 4096, 128256, 256, LS_DTYPE_BF16);
    test_logits_widen(&r, 5, 100, 1001, 3, LS_DTYPE_F32);
    test_logits_widen(&r, 33, 512, 32000, 64, LS_DTYPE_F16);

    test_two_steps(&r);
    // rows cut into 9, 33 and 62 chunks (ls_cu_sample_chunks on 132 SMs), and into one
    test_sampling(&r, 64, 32000, 8, 0);
    test_sampling(&r, 16, 128256, 2, 0);
    test_sampling(&r, 3, 128256, 4, 0);
    test_sampling(&r, 8, 1000, 4, 0);
    // the truncation's select: 14 chunks of a V that is no multiple of them, 53 chunks, one
    test_sampling(&r, 40, 50021, 3, 1);
    test_sampling(&r, 10, 128256, 2, 1);
    test_sampling(&r, 20, 3001, 4, 1);

    // the table again, last, for whoever reads only the tail
    int fails = 0;
    printf("\n=== summary: CUDA backend vs CPU backend ===\n");
    printf("%-58s %8s %10s %8s %10s %8s %5s %5s\n", "test", "n", "nmse", "tol", "maxabs",
           "tol_abs", "untch", "nan");
    for (int i = 0; i < s_n_res; i++) {
        s_print_res(&s_res[i]);
        fails += !s_res[i].pass;
    }
    printf("%d tests, %d failed\n", s_n_res, fails);
    int sync = s_gpu->synchronize(s_gpu);
    ls_backend_destroy(&s_gpu);
    ls_backend_destroy(&s_cpu);
    return fails || sync ? 1 : 0;
}
