/*  kernels/cuda/lora_vocab.cu — the LoRA ops whose one side is the vocabulary: the embedding's
    shrink (a gather of A's columns at the token ids) and lm_head's LoRA on the logit rows.
    CPU references: ls_lora_embed_shrink and ls_lora_rows (kernels/cpu/lora.c, ops.h).

    Both are small next to the step: the gather reads rank values per token (the embedding's
    A held as chunks of vocabulary rows: one 16-byte chunk per 8 ranks), and lm_head's LoRA
    reads each logit row's slot B (vocab rows of its chunks) once per row. Both read the
    pages through the table entry by entry, any pieces: vocabulary-sized chunks are larger
    than a page on many models (docs/memory.md). The expand after the gather is the
    ordinary one (lora.cu). Both run once per LoRA pass of the step (a mix's i-th component
    in pass i) and read their rows' slots and factors from the pass's tiles, as lora.cu's
    kernels do: a tile's scale is the slot's scaling times the component's weight.

    Known limit: lm_head's expand reads B once per logit row, not once per slot, so a decode
    step of many requests on one lm_head adapter re-reads its B (vocab·rank elements) per
    request, from L2 where it fits.
*/
#include <assert.h>
#include <stdint.h>

#include "common.cuh"

enum { GATHER_THREADS = 128, ROWS_THREADS = 256 };

// Element (row o, rank column j) of slot w's chunks
template <typename T>
__device__ __forceinline__ float s_chunk_at(const ls_lora_pages_t &p, int w, int o, int j) {
    return ls_to_f(ls_lora_entry<T>(p, w, (size_t)(j / 8) * p.np + o / p.piece)[(size_t)(o % p.piece) * 8 + j % 8]);
}

// tmp[row, j] = A_slot[j][ids[row]] for the tile's rows, j < rank; a block per tile
template <typename TA>
__global__ void k_lora_embed_shrink(float *tmp, ls_lora_pages_t a, const ls_cu_lora_tile_t *__restrict__ tiles,
                                    const int32_t *__restrict__ perm, const int32_t *__restrict__ ids,
                                    int vocab, int r_max) {
    ls_cu_lora_tile_t t = tiles[blockIdx.x];
    for (int i = threadIdx.x; i < t.n * t.rank; i += blockDim.x) {
        int q = i / t.rank, j = i % t.rank, p = t.p0 + q, row = perm ? perm[p] : p;
        tmp[(size_t)row * r_max + j] = s_chunk_at<TA>(a, t.slot, ids[row], j);
    }
}

cudaError_t ls_cu_lora_embed_shrink(float *tmp, const int32_t *ids, ls_lora_pages_t a,
                                    ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                                    int n_tiles, const int32_t *perm, int vocab, int r_max,
                                    cudaStream_t stream) {
    assert(vocab > 0 && r_max > 0);
    if (n_tiles == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(a_dt, TA,
        k_lora_embed_shrink<TA><<<n_tiles, GATHER_THREADS, 0, stream>>>(tmp, a, tiles, perm, ids, vocab, r_max));
    LS_CU_CHECK_LAUNCH();
}

// tmp[i, j] = Σ_k A_w[j][k] · x[i, k] for j < rank of tile t (row i = t.p0, w = t.slot): a
// block per tile, a warp per j, a piece of its row at a time
template <typename TA>
__global__ void k_lora_rows_shrink(float *tmp, const float *__restrict__ x, ls_lora_pages_t a,
                                   const ls_cu_lora_tile_t *__restrict__ tiles, int in,
                                   int r_max) {
    ls_cu_lora_tile_t t = tiles[blockIdx.x];
    int i = t.p0, w = t.slot, r = t.rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const float *xi = x + (size_t)i * in;
    for (int j = warp; j < r; j += nw) {
        float s = 0.0f;
        for (int q = 0; q < a.np; q++) {
            const TA *aj = ls_lora_entry<TA>(a, w, (size_t)j * a.np + q);
            for (int k = q * a.piece + lane; k < min(in, (q + 1) * a.piece); k += 32)
                s += ls_to_f(aj[k - q * a.piece]) * xi[k];
        }
        s = ls_warp_sum(s);
        if (lane == 0)
            tmp[(size_t)i * r_max + j] = s;
    }
}

// y[i, o] += t.scale · Σ_{j<rank} B_w[o][j] · tmp[i, j] for tile t (blockIdx.y): blocks of
// ROWS_THREADS columns of its row, the row's tmp in shared memory
template <typename TB>
__global__ void k_lora_rows_expand(float *y, const float *__restrict__ tmp, ls_lora_pages_t b,
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
    float s = 0.0f;
    for (int j = 0; j < r; j++)
        s += s_chunk_at<TB>(b, w, o, j) * sh[j];
    y[(size_t)i * out + o] += t.scale * s;
}

cudaError_t ls_cu_lora_rows(float *y, float *tmp, const float *x, ls_lora_pages_t a,
                            ls_cu_dtype_t a_dt, ls_lora_pages_t b, ls_cu_dtype_t b_dt,
                            const ls_cu_lora_tile_t *tiles, int n_tiles, int in, int out,
                            int r_max, cudaStream_t stream) {
    assert(in > 0 && out > 0 && r_max > 0);
    if (n_tiles == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(a_dt, TA,
        k_lora_rows_shrink<TA><<<n_tiles, ROWS_THREADS, 0, stream>>>(tmp, x, a, tiles, in, r_max));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return e;
    dim3 grid((out + ROWS_THREADS - 1) / ROWS_THREADS, n_tiles);
    size_t smem = (size_t)r_max * sizeof(float);
    LS_CU_DISPATCH(b_dt, TB,
        k_lora_rows_expand<TB><<<grid, ROWS_THREADS, smem, stream>>>(y, tmp, b, tiles, out, r_max));
    LS_CU_CHECK_LAUNCH();
}
