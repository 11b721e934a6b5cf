/*  kernels/cpu/lora.c — segmented LoRA shrink and expand (SGMV references) on OpenBLAS,
    reading the adapters through the page table (ls_lora_pages_t).

    Every segment is cut into runs of rows that are consecutive in the activations (the
    whole segment without a permutation; with one, each stretch where permutation[p+1] ==
    permutation[p] + 1, which is a whole sequence in practice), and each run reads and
    writes the activations in place through leading dimensions: the shrink one sgemv per
    rank row and piece of A, the expand one sgemm per chunk of 8 rank columns and piece of
    B. So there are no gather copies, and BLAS touches exactly the columns j < rank that the
    contract in ops.h allows.
*/
#include <assert.h>
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "ops.h"

typedef struct {
    int row; // first activation row of the run
    int n;   // rows in the run
} s_run_t;

// Next run of consecutive rows in segment positions [*p, end); advances *p past it.
static s_run_t s_next_run(const ls_lora_batch_t *batch, int *p, int end) {
    const int32_t *perm = batch->permutation;
    s_run_t run = {perm ? perm[*p] : *p, 1};
    if (!perm)
        run.n = end - *p;
    else
        while (*p + run.n < end && perm[*p + run.n] == run.row + run.n)
            run.n++;
    *p += run.n;
    return run;
}

// Rank of segment s's slot; asserts the slot exists and the rank fits the pool.
static int s_seg_rank(const ls_lora_batch_t *batch, int s, int r_max) {
    int w = batch->weight_indices[s];
    assert(w >= 0 && w < batch->n_slots);
    int r = batch->lora_ranks[w];
    assert(r >= 0 && r <= r_max);
    return r;
}

// Piece q of row (or chunk) i of slot w
static const float *s_piece(const ls_lora_pages_t *p, int w, int i, int q) {
    const float *e = p->tab[(size_t)w * p->stride + (size_t)i * p->np + q];
    assert(e);
    return e;
}

// y (n, cols) += scale · t (n, nj; ld_t) · B_cᵀ over chunk c's rows [o0, o1), nj <= 8 of its
// columns, piece by piece: y's column o is chunk row o
static void s_chunk_gemm(float *y, int ld_y, const float *t, int ld_t, int n, int nj, float scale,
                         const ls_lora_pages_t *b, int w, int c, int o0, int o1) {
    for (int q = o0 / b->piece; o0 < o1; q++) {
        int end = (q + 1) * b->piece < o1 ? (q + 1) * b->piece : o1;
        const float *bp = s_piece(b, w, c, q) + (size_t)(o0 - q * b->piece) * 8;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, end - o0, nj, scale, t, ld_t, bp, 8,
                    1.0f, y + o0, ld_y);
        o0 = end;
    }
}

// tmp is (T, n_slices*r_max), x is (T, in)
void ls_lora_shrink(float *tmp, const float *x, ls_lora_pages_t a, const ls_lora_batch_t *batch,
                    int in, int n_slices, int r_max) {
    int ld_tmp = n_slices * r_max;
    for (int s = 0; s < batch->n_segs; s++) {
        int r = s_seg_rank(batch, s, r_max), w = batch->weight_indices[s];
        int p = batch->seg_indptr[s], end = batch->seg_indptr[s + 1];
        while (r > 0 && p < end) {
            s_run_t run = s_next_run(batch, &p, end);
            // tmp[run, k*r_max + j] = x[run] · A row (k*r_max + j), summed over its pieces
            for (int k = 0; k < n_slices; k++)
                for (int j = 0; j < r; j++)
                    for (int q = 0; q < a.np; q++) {
                        int e0 = q * a.piece, n = in - e0 < a.piece ? in - e0 : a.piece;
                        cblas_sgemv(CblasRowMajor, CblasNoTrans, run.n, n, 1.0f,
                                    x + (size_t)run.row * in + e0, in,
                                    s_piece(&a, w, k * r_max + j, q), 1, q ? 1.0f : 0.0f,
                                    tmp + (size_t)run.row * ld_tmp + (size_t)k * r_max + j, ld_tmp);
                    }
        }
    }
}

// y is (T, out_total), tmp is (T, n_slices*r_max), slice_offsets is (n_slices+1)
void ls_lora_expand(float *y, const float *tmp, ls_lora_pages_t b, const ls_lora_batch_t *batch,
                    const int32_t *slice_offsets, int n_slices, int r_max) {
    int ld_tmp = n_slices * r_max;
    int out_total = slice_offsets[n_slices];
    for (int s = 0; s < batch->n_segs; s++) {
        int r = s_seg_rank(batch, s, r_max), w = batch->weight_indices[s];
        float scale = batch->scalings[w] * (batch->seg_weights ? batch->seg_weights[s] : 1.0f);
        int p = batch->seg_indptr[s], end = batch->seg_indptr[s + 1];
        while (r > 0 && p < end) {
            s_run_t run = s_next_run(batch, &p, end);
            for (int k = 0; k < n_slices; k++) {
                assert(slice_offsets[k + 1] >= slice_offsets[k]);
                // y[run, slice k] += scale · tmp_k[run] · B_kᵀ, 8 rank columns (a chunk) at a time
                for (int c = 0; 8 * c < r; c++)
                    s_chunk_gemm(y + (size_t)run.row * out_total, out_total,
                                 tmp + (size_t)run.row * ld_tmp + (size_t)k * r_max + 8 * c, ld_tmp,
                                 run.n, r - 8 * c < 8 ? r - 8 * c : 8, scale, &b, w, c,
                                 slice_offsets[k], slice_offsets[k + 1]);
            }
        }
    }
}

// y (T, out_total), x (T, in), tmp (T, n_slices*r_max)
void ls_lora_fused(float *y, float *tmp, const float *x, ls_lora_pages_t a, ls_lora_pages_t b,
                   const ls_lora_batch_t *batch, const int32_t *slice_offsets, int in,
                   int n_slices, int r_max) {
    ls_lora_shrink(tmp, x, a, batch, in, n_slices, r_max);
    ls_lora_expand(y, tmp, b, batch, slice_offsets, n_slices, r_max);
}

// tmp (T, r_max), ids (T), a: chunks of vocab rows
void ls_lora_embed_shrink(float *tmp, const int32_t *ids, ls_lora_pages_t a,
                          const ls_lora_batch_t *batch, int vocab, int r_max) {
    for (int s = 0; s < batch->n_segs; s++) {
        int r = s_seg_rank(batch, s, r_max), w = batch->weight_indices[s];
        for (int p = batch->seg_indptr[s]; r && p < batch->seg_indptr[s + 1]; p++) {
            int row = batch->permutation ? batch->permutation[p] : p, id = ids[row];
            assert(id >= 0 && id < vocab);
            for (int j = 0; j < r; j++)
                tmp[(size_t)row * r_max + j] =
                    s_piece(&a, w, j / 8, id / a.piece)[(size_t)(id % a.piece) * 8 + j % 8];
        }
    }
}

// y (R, out), tmp (R, r_max), x (R, in), slots (R)
void ls_lora_rows(float *y, float *tmp, const float *x, ls_lora_pages_t a, ls_lora_pages_t b,
                  const int32_t *slots, const float *scales, const int32_t *ranks, int R, int in,
                  int out, int r_max) {
    for (int i = 0; i < R; i++) {
        int w = slots[i], r = ranks[w];
        assert(r >= 0 && r <= r_max);
        if (r == 0)
            continue;
        float *t = tmp + (size_t)i * r_max;
        const float *xi = x + (size_t)i * in;
        // t (r) = A_w (r, in) · x_i, row by row over the pieces; y_i (out) += scale · B_w · t
        for (int j = 0; j < r; j++) {
            t[j] = 0.0f;
            for (int q = 0; q < a.np; q++) {
                int e0 = q * a.piece, n = in - e0 < a.piece ? in - e0 : a.piece;
                t[j] += cblas_sdot(n, xi + e0, 1, s_piece(&a, w, j, q), 1);
            }
        }
        for (int c = 0; 8 * c < r; c++)
            s_chunk_gemm(y + (size_t)i * out, out, t + 8 * c, r_max, 1,
                         r - 8 * c < 8 ? r - 8 * c : 8, scales[i], &b, w, c, 0, out);
    }
}

void ls_token_rows_forward(float *out, const float *rows, const int32_t *idx, int T, int C) {
    for (int t = 0; t < T; t++)
        if (idx[t] >= 0)
            memcpy(out + (size_t)t * C, rows + (size_t)idx[t] * C, (size_t)C * sizeof(float));
}

void ls_token_logits_forward(float *logits, const float *x, const float *rows, const float *ids,
                             const int32_t *tiles, int n_tiles, int C, int V) {
    for (int j = 0; j < n_tiles; j++) {
        int i = tiles[3 * j], f = tiles[3 * j + 1], n = tiles[3 * j + 2];
        for (int k = f; k < f + n; k++) {
            int id = (int)ids[k];
            assert(id >= 0 && id < V);  // V: the row width, past the vocabulary when widened
            logits[(size_t)i * V + id] = cblas_sdot(C, rows + (size_t)k * C, 1, x + (size_t)i * C, 1);
        }
    }
}

void ls_logits_widen_forward(float *wide, const float *head, int R, int V, int W) {
    assert(V <= W);
    for (int r = 0; r < R; r++) {
        float *o = wide + (size_t)r * W;
        memcpy(o, head + (size_t)r * V, (size_t)V * sizeof(float));
        for (int c = V; c < W; c++)
            o[c] = -INFINITY;
    }
}
