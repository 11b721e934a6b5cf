/*  kernels/cuda/lora.cu — segmented LoRA shrink and expand (SGMV) on the GPU.
    CPU reference: kernels/cpu/lora.c; the contract is in kernels/ops.h.

    Work is described by tiles (ops_cuda.h): up to LS_CU_LORA_TILE consecutive positions of
    one segment, built on the host once per step and only for slots of rank > 0, so base
    rows cost no block at all and padding rows are never addressed. The shape in mind is
    decode: one token per request and many distinct adapters, where the A and B reads
    dominate and every byte of them is read exactly once per tile.

    shrink: grid (tile, slice, rank/16). A block of 4 warps owns 16 consecutive rank rows
      j of A_k; each warp 4 of them. A warp streams its rows of A (16-byte loads, 8
      elements per lane) against the tile's x rows, accumulates in fp32 registers, and
      reduces by shuffles. Blocks and warps whose rows lie at or past the slot's rank return
      at once: no work, and no write, for j >= rank.
    expand: grid (tile, out_total/256). The tile's tmp rows (columns j < rank only, so the
      untouched garbage beyond the rank is never read) go to shared memory; each thread owns
      one output column o, finds its slice, streams B[slot, o, 0..rank) and adds
      scaling * dot into y for every row of the tile.

    Known limits (next session): a long prefill segment re-reads A and B once per 4-token
    tile (from L2); a tensor-core path for long segments, and sizing shrink's split of `in`
    for decode occupancy, are the speed work.
*/
#include <assert.h>
#include <stdint.h>

#include "common.cuh"

enum { SH_WARPS = 4, SH_RPW = 4, SH_JB = SH_WARPS * SH_RPW, EX_THREADS = 256 };
#define TT LS_CU_LORA_TILE

struct s_slice_offs_t {
    int off[4];
};

__device__ __forceinline__ int s_row(const int32_t *perm, int p) {
    return perm ? perm[p] : p;
}

// tmp is (T, n_slices*r_max), x is (T, in), a_pool is (n_slots, n_slices*r_max, in)
template <typename TA, bool VEC>
__global__ void __launch_bounds__(SH_WARPS * 32)
k_lora_shrink(float *tmp, const float *x, const TA *a_pool, const ls_cu_lora_tile_t *tiles,
              const int32_t *perm, int in, int n_slices, int r_max) {
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int k = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int jw = blockIdx.z * SH_JB + warp * SH_RPW; // this warp's first rank row
    if (jw >= tile.rank)
        return;
    int ld = n_slices * r_max;
    const TA *a = a_pool + ((size_t)tile.slot * ld + (size_t)k * r_max + jw) * in;
    int nq = min(SH_RPW, tile.rank - jw);
    const float *xr[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        xr[tt] = x + (size_t)s_row(perm, tile.p0 + min(tt, tile.n - 1)) * in;

    float acc[SH_RPW][TT];
#pragma unroll
    for (int q = 0; q < SH_RPW; q++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            acc[q][tt] = 0.0f;

    if (VEC) {
        for (int i = lane * 8; i < in; i += 32 * 8) {
            float xv[TT][8];
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt < tile.n)
                    ls_load8(xr[tt] + i, xv[tt]);
#pragma unroll
            for (int q = 0; q < SH_RPW; q++) {
                if (q < nq) {
                    float av[8];
                    ls_load8(a + (size_t)q * in + i, av);
#pragma unroll
                    for (int tt = 0; tt < TT; tt++)
                        if (tt < tile.n)
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                acc[q][tt] += av[e] * xv[tt][e];
                }
            }
        }
    } else {
        for (int i = lane; i < in; i += 32) {
            float xv[TT];
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                xv[tt] = tt < tile.n ? xr[tt][i] : 0.0f;
#pragma unroll
            for (int q = 0; q < SH_RPW; q++)
                if (q < nq) {
                    float av = ls_to_f(a[(size_t)q * in + i]);
#pragma unroll
                    for (int tt = 0; tt < TT; tt++)
                        acc[q][tt] += av * xv[tt];
                }
        }
    }
#pragma unroll
    for (int q = 0; q < SH_RPW; q++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            float s = ls_warp_sum(acc[q][tt]);
            if (lane == q * TT + tt && q < nq && tt < tile.n)
                tmp[(size_t)s_row(perm, tile.p0 + tt) * ld + (size_t)k * r_max + jw + q] = s;
        }
}

cudaError_t ls_cu_lora_shrink(float *tmp, const float *x, const void *a_pool,
                              ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, int max_rank, const int32_t *perm, int in,
                              int n_slices, int r_max, cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && max_rank <= r_max && in > 0);
    if (n_tiles == 0 || max_rank == 0)
        return cudaSuccess;
    dim3 grid(n_tiles, n_slices, (max_rank + SH_JB - 1) / SH_JB);
    // 16-byte loads need every row start aligned: x rows (in floats), A rows (in elements)
    int vec = in % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)a_pool % 16 == 0;
    LS_CU_DISPATCH(a_dt, TA,
        if (vec) k_lora_shrink<TA, true><<<grid, SH_WARPS * 32, 0, stream>>>(
            tmp, x, (const TA *)a_pool, tiles, perm, in, n_slices, r_max);
        else k_lora_shrink<TA, false><<<grid, SH_WARPS * 32, 0, stream>>>(
            tmp, x, (const TA *)a_pool, tiles, perm, in, n_slices, r_max));
    LS_CU_CHECK_LAUNCH();
}

// y is (T, out_total), tmp is (T, n_slices*r_max), b_pool is (n_slots, out_total, r_max)
template <typename TB, bool VEC>
__global__ void __launch_bounds__(EX_THREADS)
k_lora_expand(float *y, const float *tmp, const TB *b_pool, const ls_cu_lora_tile_t *tiles,
              const int32_t *perm, const float *scalings, s_slice_offs_t so, int n_slices,
              int r_max) {
    extern __shared__ float st[]; // (TT, n_slices*r_max)
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int ld = n_slices * r_max, out_total = so.off[n_slices], r = tile.rank;
    for (int idx = threadIdx.x; idx < tile.n * ld; idx += blockDim.x) {
        int tt = idx / ld, c = idx % ld;
        // only columns j < rank are read: the rest of tmp may hold anything, even NaN
        st[idx] = c % r_max < r ? tmp[(size_t)s_row(perm, tile.p0 + tt) * ld + c] : 0.0f;
    }
    __syncthreads();
    int o = blockIdx.y * blockDim.x + threadIdx.x;
    if (o >= out_total)
        return;
    int k = 0;
    while (k + 1 < n_slices && o >= so.off[k + 1])
        k++;
    const TB *b = b_pool + ((size_t)tile.slot * out_total + o) * r_max;
    const float *sk = st + k * r_max;
    float acc[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        acc[tt] = 0.0f;
    int j = 0;
    if (VEC) {
        for (; j + 8 <= r; j += 8) {
            float bv[8];
            ls_load8(b + j, bv);
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt < tile.n)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[tt] += bv[e] * sk[tt * ld + j + e];
        }
    }
    for (; j < r; j++) {
        float bv = ls_to_f(b[j]);
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            if (tt < tile.n)
                acc[tt] += bv * sk[tt * ld + j];
    }
    float s = scalings[tile.slot];
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        if (tt < tile.n) {
            float *yo = y + (size_t)s_row(perm, tile.p0 + tt) * out_total + o;
            *yo = __fadd_rn(*yo, __fmul_rn(s, acc[tt])); // scaling on the product
        }
}

cudaError_t ls_cu_lora_expand(float *y, const float *tmp, const void *b_pool,
                              ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, const int32_t *perm, const float *scalings,
                              const int32_t *slice_offsets, int n_slices, int r_max,
                              cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && r_max > 0);
    s_slice_offs_t so = {{0, 0, 0, 0}};
    for (int k = 0; k <= n_slices; k++) {
        so.off[k] = slice_offsets[k];
        assert(k == 0 || so.off[k] >= so.off[k - 1]);
    }
    assert(so.off[0] == 0);
    int out_total = so.off[n_slices];
    if (n_tiles == 0 || out_total == 0)
        return cudaSuccess;
    dim3 grid(n_tiles, (out_total + EX_THREADS - 1) / EX_THREADS);
    size_t smem = (size_t)TT * n_slices * r_max * sizeof(float);
    int vec = r_max % 8 == 0 && (uintptr_t)b_pool % 16 == 0;
    LS_CU_DISPATCH(b_dt, TB,
        if (vec) k_lora_expand<TB, true><<<grid, EX_THREADS, smem, stream>>>(
            y, tmp, (const TB *)b_pool, tiles, perm, scalings, so, n_slices, r_max);
        else k_lora_expand<TB, false><<<grid, EX_THREADS, smem, stream>>>(
            y, tmp, (const TB *)b_pool, tiles, perm, scalings, so, n_slices, r_max));
    LS_CU_CHECK_LAUNCH();
}
