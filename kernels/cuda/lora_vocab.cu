/*  kernels/cuda/lora_vocab.cu — the LoRA ops whose one side is the vocabulary: the embedding's
    shrink (a gather of A's columns at the token ids) and lm_head's LoRA on the logit rows.
    CPU references: ls_lora_embed_shrink and ls_lora_rows (kernels/cpu/lora.c, ops.h).

    Both are small next to the step: the gather reads rank values per token (strided by the
    vocabulary in A's (r_max, vocab) layout: one sector each), and lm_head's LoRA reads each
    logit row's slot B (vocab, r_max) once per row. The expand after the gather is the
    ordinary one (lora.cu). Both run once per LoRA pass of the step (a mix's i-th component
    in pass i) and read their rows' slots and factors from the pass's tiles, as lora.cu's
    kernels do: a tile's scale is the slot's scaling times the component's weight.

    Known limit: lm_head's expand reads B once per logit row, not once per slot, so a decode
    step of many requests on one lm_head adapter re-reads its B (vocab·r_max elements) per
    request, from L2 where it fits.
*/
#include <assert.h>
#include <stdint.h>

#include "common.cuh"

enum { GATHER_THREADS = 128, ROWS_THREADS = 256 };

// tmp[row, j] = A[slot, j, ids[row]] for the tile's rows, j < rank; a block per tile
template <typename TA>
__global__ void k_lora_embed_shrink(float *tmp, const TA *__restrict__ a,
                                    const ls_cu_lora_tile_t *__restrict__ tiles,
                                    const int32_t *__restrict__ perm,
                                    const int32_t *__restrict__ ids, int vocab, int r_max) {
    ls_cu_lora_tile_t t = tiles[blockIdx.x];
    for (int i = threadIdx.x; i < t.n * t.rank; i += blockDim.x) {
        int q = i / t.rank, j = i % t.rank, p = t.p0 + q, row = perm ? perm[p] : p;
        tmp[(size_t)row * r_max + j] = ls_to_f(a[((size_t)t.slot * r_max + j) * vocab + ids[row]]);
    }
}

cudaError_t ls_cu_lora_embed_shrink(float *tmp, const int32_t *ids, const void *a_pool,
                                    ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                                    int n_tiles, const int32_t *perm, int vocab, int r_max,
                                    cudaStream_t stream) {
    assert(vocab > 0 && r_max > 0);
    if (n_tiles == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(a_dt, TA,
        k_lora_embed_shrink<TA><<<n_tiles, GATHER_THREADS, 0, stream>>>(
            tmp, (const TA *)a_pool, tiles, perm, ids, vocab, r_max));
    LS_CU_CHECK_LAUNCH();
}

// tmp[i, j] = Σ_k A[w, j, k] · x[i, k] for j < rank of tile t (row i = t.p0, w = t.slot): a
// block per tile, a warp per j
template <typename TA>
__global__ void k_lora_rows_shrink(float *tmp, const float *__restrict__ x,
                                   const TA *__restrict__ a,
                                   const ls_cu_lora_tile_t *__restrict__ tiles, int in,
                                   int r_max) {
    ls_cu_lora_tile_t t = tiles[blockIdx.x];
    int i = t.p0, w = t.slot, r = t.rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const float *xi = x + (size_t)i * in;
    for (int j = warp; j < r; j += nw) {
        const TA *aj = a + ((size_t)w * r_max + j) * in;
        float s = 0.0f;
        for (int k = lane; k < in; k += 32)
            s += ls_to_f(aj[k]) * xi[k];
        s = ls_warp_sum(s);
        if (lane == 0)
            tmp[(size_t)i * r_max + j] = s;
    }
}

// y[i, o] += t.scale · Σ_{j<rank} B[w, o, j] · tmp[i, j] for tile t (blockIdx.y): blocks of
// ROWS_THREADS columns of its row, the row's tmp in shared memory
template <typename TB>
__global__ void k_lora_rows_expand(float *y, const float *__restrict__ tmp,
                                   const TB *__restrict__ b,
                                   const ls_cu_lora_tile_t *__restrict__ tiles, int out,
                                   int r_max) {
    extern __shared__ float sh[];  // (rank)
    ls_cu_lora_tile_t t = tiles[blockIdx.y];
    int i = t.p0, w = t.slot, r = t.rank;
    for (int j = threadIdx.x; j < r; j += blockDim.x)
        sh[j] = tmp[(size_t)i * r_max + j];
    __syncthreads();
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out)
        return;
    const TB *bo = b + ((size_t)w * out + o) * r_max;
    float s = 0.0f;
    for (int j = 0; j < r; j++)
        s += ls_to_f(bo[j]) * sh[j];
    y[(size_t)i * out + o] += t.scale * s;
}

cudaError_t ls_cu_lora_rows(float *y, float *tmp, const float *x, const void *a_pool,
                            ls_cu_dtype_t a_dt, const void *b_pool, ls_cu_dtype_t b_dt,
                            const ls_cu_lora_tile_t *tiles, int n_tiles, int in, int out,
                            int r_max, cudaStream_t stream) {
    assert(in > 0 && out > 0 && r_max > 0);
    if (n_tiles == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(a_dt, TA,
        k_lora_rows_shrink<TA><<<n_tiles, ROWS_THREADS, 0, stream>>>(tmp, x, (const TA *)a_pool,
                                                                     tiles, in, r_max));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    dim3 grid((out + ROWS_THREADS - 1) / ROWS_THREADS, n_tiles);
    size_t smem = (size_t)r_max * sizeof(float);
    LS_CU_DISPATCH(b_dt, TB,
        k_lora_rows_expand<TB><<<grid, ROWS_THREADS, smem, stream>>>(
            y, tmp, (const TB *)b_pool, tiles, out, r_max));
    LS_CU_CHECK_LAUNCH();
}
