/*  kernels/cpu/lora.c — segmented LoRA shrink and expand (SGMV references) on OpenBLAS.

    Every segment is cut into runs of rows that are consecutive in the activations (the
    whole segment without a permutation; with one, each stretch where permutation[p+1] ==
    permutation[p] + 1, which is a whole sequence in practice), and each run is one sgemm
    per slice reading and writing the activations in place through leading dimensions.
    So there is one code path, no gather copies, and sgemm touches exactly the columns
    j < rank that the contract in ops.h allows.
*/
#include <assert.h>
#include <cblas.h>
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

// tmp is (T, n_slices*r_max), x is (T, in), a_pool is (n_slots, n_slices*r_max, in)
void ls_lora_shrink(float *tmp, const float *x, const float *a_pool,
                    const ls_lora_batch_t *batch, int in, int n_slices, int r_max) {
    int ld_tmp = n_slices * r_max;
    for (int s = 0; s < batch->n_segs; s++) {
        int r = s_seg_rank(batch, s, r_max);
        if (r == 0)
            continue;
        const float *a = a_pool + (size_t)batch->weight_indices[s] * ld_tmp * in;
        int p = batch->seg_indptr[s], end = batch->seg_indptr[s + 1];
        while (p < end) {
            s_run_t run = s_next_run(batch, &p, end);
            for (int k = 0; k < n_slices; k++)
                // tmp[run, k*r_max .. +r) = x[run] · A_kᵀ, A_k is (r, in) in rows k*r_max..
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, run.n, r, in, 1.0f,
                            x + (size_t)run.row * in, in, a + (size_t)k * r_max * in, in,
                            0.0f, tmp + (size_t)run.row * ld_tmp + (size_t)k * r_max,
                            ld_tmp);
        }
    }
}

// y is (T, out_total), tmp is (T, n_slices*r_max), b_pool is (n_slots, out_total, r_max),
// slice_offsets is (n_slices+1)
void ls_lora_expand(float *y, const float *tmp, const float *b_pool,
                    const ls_lora_batch_t *batch, const int32_t *slice_offsets,
                    int n_slices, int r_max) {
    int ld_tmp = n_slices * r_max;
    int out_total = slice_offsets[n_slices];
    for (int s = 0; s < batch->n_segs; s++) {
        int r = s_seg_rank(batch, s, r_max);
        if (r == 0)
            continue;
        int w = batch->weight_indices[s];
        float scale = batch->scalings[w] * (batch->seg_weights ? batch->seg_weights[s] : 1.0f);
        const float *b = b_pool + (size_t)w * out_total * r_max;
        int p = batch->seg_indptr[s], end = batch->seg_indptr[s + 1];
        while (p < end) {
            s_run_t run = s_next_run(batch, &p, end);
            for (int k = 0; k < n_slices; k++) {
                int off = slice_offsets[k], out_k = slice_offsets[k + 1] - off;
                assert(out_k >= 0);
                // y[run, off..off+out_k) += scale · tmp_k[run] · B_kᵀ, B_k is (out_k, r)
                // with leading dimension r_max
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, run.n, out_k, r,
                            scale, tmp + (size_t)run.row * ld_tmp +
                            (size_t)k * r_max, ld_tmp, b + (size_t)off * r_max, r_max,
                            1.0f, y + (size_t)run.row * out_total + off, out_total);
            }
        }
    }
}

// y (T, out_total), x (T, in), tmp (T, n_slices*r_max)
void ls_lora_fused(float *y, float *tmp, const float *x, const float *a_pool,
                   const float *b_pool, const ls_lora_batch_t *batch,
                   const int32_t *slice_offsets, int in, int n_slices, int r_max) {
    ls_lora_shrink(tmp, x, a_pool, batch, in, n_slices, r_max);
    ls_lora_expand(y, tmp, b_pool, batch, slice_offsets, n_slices, r_max);
}

// tmp (T, r_max), ids (T), a_pool (n_slots, r_max, vocab)
void ls_lora_embed_shrink(float *tmp, const int32_t *ids, const float *a_pool,
                          const ls_lora_batch_t *batch, int vocab, int r_max) {
    for (int s = 0; s < batch->n_segs; s++) {
        int r = s_seg_rank(batch, s, r_max);
        const float *a = a_pool + (size_t)batch->weight_indices[s] * r_max * vocab;
        for (int p = batch->seg_indptr[s]; r && p < batch->seg_indptr[s + 1]; p++) {
            int row = batch->permutation ? batch->permutation[p] : p;
            assert(ids[row] >= 0 && ids[row] < vocab);
            for (int j = 0; j < r; j++)
                tmp[(size_t)row * r_max + j] = a[(size_t)j * vocab + ids[row]];
        }
    }
}

// y (R, out), tmp (R, r_max), x (R, in), slots (R)
void ls_lora_rows(float *y, float *tmp, const float *x, const float *a_pool,
                  const float *b_pool, const int32_t *slots, const float *scales,
                  const int32_t *ranks, int R, int in, int out, int r_max) {
    for (int i = 0; i < R; i++) {
        int w = slots[i], r = ranks[w];
        assert(r >= 0 && r <= r_max);
        if (r == 0)
            continue;
        float *t = tmp + (size_t)i * r_max;
        // t (r) = A_w (r, in) · x_i; y_i (out) += scale · B_w (out, r; ld r_max) · t
        cblas_sgemv(CblasRowMajor, CblasNoTrans, r, in, 1.0f, a_pool + (size_t)w * r_max * in,
                    in, x + (size_t)i * in, 1, 0.0f, t, 1);
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, r, scales[i],
                    b_pool + (size_t)w * out * r_max, r_max, t, 1, 1.0f, y + (size_t)i * out, 1);
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
            assert(id >= 0 && id < V);
            logits[(size_t)i * V + id] = cblas_sdot(C, rows + (size_t)k * C, 1, x + (size_t)i * C, 1);
        }
    }
}
