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
