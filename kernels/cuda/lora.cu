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

    The launchers run the v2 kernels wherever 16-byte loads apply (in % 8 == 0 and aligned
    pools for shrink; r_max in {8, 16, 32, 64} for expand) and the kernels above (v1)
    otherwise:
    shrink v2: 8 warps; K split over ks warps (ks from the grid size, so that small grids
      still fill the GPU), each warp 2 rank rows and 4 chunks of 16-byte loads in flight per
      lane, partial sums meeting in shared memory in a fixed order (deterministic);
    expand v2: r_max/8 lanes share an output column (one 512-byte run per warp load), 4
      columns per lane group in flight, shuffle reduction;
    both launched with programmatic dependent launch on sm_90 (see s_dep_wait).
    fused (sm_90, impl 4 only): shrink and expand of a tile in one kernel, a thread-block
      cluster per tile, tmp kept in the cluster's shared memory (k_lora_fused). Correct, but
      measured 2.2x slower than shrink v2 + expand v2 on the whole decode step (NOTES.md,
      session 3), so ls_cu_lora_fused runs the two v2 kernels by default.
    Measurements, predictions and what is left: kernels/cuda/NOTES.md (session 2).

    Known limits: a long prefill segment re-reads A and B once per 4-token tile (from L2):
    a tensor-core / cuBLAS path for long segments is still to do.
*/
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include <cooperative_groups.h>

#include "common.cuh"

enum { SH_WARPS = 4, SH_RPW = 4, SH_JB = SH_WARPS * SH_RPW, EX_THREADS = 256 };
#define TT LS_CU_LORA_TILE

struct s_slice_offs_t {
    int off[4];
};

__device__ __forceinline__ int s_row(const int32_t *perm, int p) {
    return perm ? perm[p] : p;
}

// The tile's x rows, x (T, in): xr[tt] for tt < TT, the last one repeated past tile.n (so
// every pointer is a valid row)
__device__ __forceinline__ void s_tile_xrows(const float *(&xr)[TT], const float *x,
                                             const int32_t *perm, const ls_cu_lora_tile_t &tile,
                                             int in) {
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        xr[tt] = x + (size_t)s_row(perm, tile.p0 + min(tt, tile.n - 1)) * in;
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
    s_tile_xrows(xr, x, perm, tile, in);

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

// -- decode-shaped shrink (v2) ----------------------------------------------------------
// Block of 8 warps = S2_RG row groups x ks K-parts (ks in {1, 2, 4, 8}, RG = 8/ks); a warp
// owns S2_R rows of its row group and every ks-th 256-element chunk of `in`, keeps U chunks
// of loads in flight (16 bytes per lane each, all issued before the first use), reduces by
// shuffles, and the ks partial sums meet in shared memory in a fixed order (deterministic).
// One-token tiles (decode) take the U-deep path; longer tiles a 1-deep path over TT tokens.
enum { S2_WARPS = 8, S2_R = 2, S2_U = 4 };

// Programmatic dependent launch (Hopper): the v2 kernels are launched so that they may
// start while the kernel before them drains. Until s_dep_wait() they only read what no
// kernel of the step writes (the adapter pools, the tiles, the scalings: uploaded and
// synchronized before the step) and write nothing; s_dep_wait() waits for the previous
// kernel to complete with its memory visible. Without the launch attribute (or before
// sm_90) both are no-ops.
__device__ __forceinline__ void s_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void s_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void s_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <typename TA, int NT, int U>
__device__ __forceinline__ void s_shrink2_rows(float (&acc)[S2_R][LS_CU_LORA_TILE],
                                               const TA *a, int in, int nq, int ntok,
                                               const float *const (&xr)[LS_CU_LORA_TILE],
                                               int kp, int ks, int lane) {
    int n_chunks = (in + 255) >> 8;
    for (int c0 = kp; c0 < n_chunks; c0 += ks * U) {
        float av[U][S2_R][8], xv[U][NT][8];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = ((c0 + u * ks) << 8) + lane * 8;
            bool ok = c0 + u * ks < n_chunks && i < in;
#pragma unroll
            for (int q = 0; q < S2_R; q++) {
                if (ok && q < nq)
                    ls_load8(a + (size_t)q * in + i, av[u][q]);
                else
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        av[u][q][e] = 0.0f;
            }
#pragma unroll
            for (int tt = 0; tt < NT; tt++) {
                if (ok && tt < ntok)
                    ls_load8(xr[tt] + i, xv[u][tt]);
                else
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        xv[u][tt][e] = 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int q = 0; q < S2_R; q++)
#pragma unroll
                for (int tt = 0; tt < NT; tt++)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[q][tt] += av[u][q][e] * xv[u][tt][e];
    }
}

// acc = the tile's partial sums of nq (<= S2_R) rows of A from a against its x rows xr,
// over every ks-th 256-element chunk of `in` from kp: one-token tiles (decode) U chunks
// deep, longer ones 1 deep over their TT tokens; zeros for nq <= 0.
template <typename TA, int U>
__device__ __forceinline__ void s_shrink2_tile(float (&acc)[S2_R][LS_CU_LORA_TILE], const TA *a,
                                               int in, int nq, const ls_cu_lora_tile_t &tile,
                                               const float *const (&xr)[LS_CU_LORA_TILE],
                                               int kp, int ks, int lane) {
#pragma unroll
    for (int q = 0; q < S2_R; q++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            acc[q][tt] = 0.0f;
    if (nq <= 0)
        return;
    if (tile.n == 1)
        s_shrink2_rows<TA, 1, U>(acc, a, in, nq, 1, xr, kp, ks, lane);
    else
        s_shrink2_rows<TA, TT, 1>(acc, a, in, nq, tile.n, xr, kp, ks, lane);
}

template <typename TA, int U>
__global__ void __launch_bounds__(S2_WARPS * 32)
k_lora_shrink2(float *tmp, const float *x, const TA *a_pool, const ls_cu_lora_tile_t *tiles,
               const int32_t *perm, int in, int n_slices, int r_max, int ks) {
    __shared__ float red[S2_WARPS][S2_R][TT];
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int k = blockIdx.y, rg_n = S2_WARPS / ks, jb = rg_n * S2_R;
    int j0 = blockIdx.z * jb;
    if (j0 >= tile.rank)
        return; // block-uniform
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int rg = warp % rg_n, kp = warp / rg_n;
    int jw = j0 + rg * S2_R, nq = min(S2_R, tile.rank - jw);
    int ld = n_slices * r_max;
    const TA *a = a_pool + ((size_t)tile.slot * ld + (size_t)k * r_max + jw) * in;
    const float *xr[TT];
    s_tile_xrows(xr, x, perm, tile, in);
    // before the previous kernel is done: pull this warp's A rows towards L2
    for (int q = 0; q < nq; q++)
        for (int c = kp; c < (in + 255) >> 8; c += ks) {
            int i = (c << 8) + lane * 8;
            if (i < in)
                s_prefetch_l2(a + (size_t)q * in + i);
        }
    s_dep_launch();
    s_dep_wait();
    float acc[S2_R][TT];
    s_shrink2_tile<TA, U>(acc, a, in, nq, tile, xr, kp, ks, lane);
#pragma unroll
    for (int q = 0; q < S2_R; q++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            float v = ls_warp_sum(acc[q][tt]);
            if (lane == 0)
                red[warp][q][tt] = v;
        }
    __syncthreads();
    // thread (row r of the block, token tt) sums the ks parts in order
    int t = threadIdx.x;
    if (t < jb * TT) {
        int r = t / TT, tt = t % TT, g = r / S2_R, q = r % S2_R;
        int j = j0 + r;
        if (j < tile.rank && tt < tile.n) {
            float v = 0.0f;
            for (int p = 0; p < ks; p++)
                v += red[p * rg_n + g][q][tt];
            tmp[(size_t)s_row(perm, tile.p0 + tt) * ld + (size_t)k * r_max + j] = v;
        }
    }
}

// Which implementation the launchers use: 0 = the best for the shape (v2 where it applies),
// 1 = the session-1 kernels (v1), 2 = v2 without programmatic dependent launch, 3 = v2
// with 8 loads in flight per lane instead of 4 (shrink and expand), 4 = as 0 with
// ls_cu_lora_fused on the cluster kernel (k_lora_fused) instead of shrink + expand. For the
// benchmarks; not thread-safe, set once.
static int s_impl = 0;
extern "C" void ls_cu_lora_set_impl(int impl) {
    s_impl = impl;
}

// SMs and compute capability of the current device, read once (one device per process).
static int s_sms = 0, s_cc = 0;
static void s_props() {
    if (!s_sms) {
        const char *e = getenv("LS_CU_LORA_IMPL"); // tests run the variants through this
        if (e && *e)
            s_impl = atoi(e);
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&s_sms, cudaDevAttrMultiProcessorCount, dev);
        cudaDeviceGetAttribute(&s_cc, cudaDevAttrComputeCapabilityMajor, dev);
        if (s_sms <= 0)
            s_sms = 1;
    }
}
static int s_sm_count() {
    s_props();
    return s_sms;
}
extern "C" int ls_cu_lora_impl(void) {
    s_props(); // the environment's choice is read there
    return s_impl;
}

// A launch that may overlap the previous kernel's tail (sm_90+; see s_dep_wait), unless
// flags say LS_CU_LORA_NO_PDL.
static cudaLaunchConfig_t s_pdl_config(dim3 grid, int threads, size_t smem,
                                       cudaStream_t stream, unsigned flags) {
    static cudaLaunchAttribute attr[1];
    s_props();
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = s_cc >= 9 && s_impl != 2 && !(flags & LS_CU_LORA_NO_PDL) ? 1 : 0;
    return cfg;
}

cudaError_t ls_cu_lora_shrink(float *tmp, const float *x, const void *a_pool,
                              ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, int max_rank, const int32_t *perm, int in,
                              int n_slices, int r_max, unsigned flags, cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && max_rank <= r_max && in > 0);
    if (n_tiles == 0 || max_rank == 0)
        return cudaSuccess;
    s_props();
    // 16-byte loads need every row start aligned: x rows (in floats), A rows (in elements)
    int vec = in % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)a_pool % 16 == 0;
    if (vec && s_impl != 1) {
        // split K across the warps of a block (fewer rows per block, more blocks) until
        // the grid has >= 2 blocks per SM or every warp owns 2 rows of 1/8 of `in`
        int ks = 1, jb = S2_WARPS * S2_R;
        while (ks < 8 &&
               (long)n_tiles * n_slices * ((max_rank + jb - 1) / jb) < 2L * s_sm_count()) {
            ks *= 2;
            jb = S2_WARPS / ks * S2_R;
        }
        dim3 g2(n_tiles, n_slices, (max_rank + jb - 1) / jb);
        cudaLaunchConfig_t cfg = s_pdl_config(g2, S2_WARPS * 32, 0, stream, flags);
        LS_CU_DISPATCH(a_dt, TA,
            return s_impl == 3
                ? cudaLaunchKernelEx(&cfg, k_lora_shrink2<TA, 8>, tmp, x, (const TA *)a_pool,
                                     tiles, perm, in, n_slices, r_max, ks)
                : cudaLaunchKernelEx(&cfg, k_lora_shrink2<TA, S2_U>, tmp, x,
                                     (const TA *)a_pool, tiles, perm, in, n_slices, r_max,
                                     ks));
    }
    dim3 grid(n_tiles, n_slices, (max_rank + SH_JB - 1) / SH_JB);
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

// -- expand (v2) -------------------------------------------------------------------------
// L = r_max/8 lanes share one output column, each loading 16 bytes of its B row (so a warp
// load is one contiguous 512-byte run), U columns per lane group in flight; the L partial
// dots meet by shuffles. Elements j >= the slot's rank are loaded (inside the pool) but
// never used, so whatever they hold (NaN poison too) cannot leak into y.
enum { E2_WARPS = 8 };

// The v2 expand's column work, shared by k_lora_expand2 and k_lora_fused. L lanes share one
// output column (lane `sub` holds its B elements j = sub*8 .. j+7), U columns per lane group.
// Loads, for column o[u] = base + (u*warps + warp)*(32/L) + og below `end`, its slice kk[u] and
// its 8 B values (zero at or past the slot's rank r, or past `end`). b_slot is the slot's B,
// (out_total, r_max).
template <typename TB, int L, int U>
__device__ __forceinline__ void s_expand_load(float (&bv)[U][8], int (&o)[U], int (&kk)[U], const TB *b_slot,
                                              s_slice_offs_t so, int n_slices, int r_max, int r, int base,
                                              int warps, int warp, int og, int j, int end) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        o[u] = base + (u * warps + warp) * (32 / L) + og;
        int k = 0;
        while (k + 1 < n_slices && o[u] >= so.off[k + 1])
            k++;
        kk[u] = k;
        // elements j..j+7 >= rank are loaded (inside the pool) but never used
        if (o[u] < end && j < r)
            ls_load8(b_slot + (size_t)o[u] * r_max + j, bv[u]);
        else
#pragma unroll
            for (int e = 0; e < 8; e++)
                bv[u][e] = 0.0f;
    }
}

// y[row, o[u]] += s * Σ_{j<r} st[row, kk[u]*r_max + j] * B[o[u], j] for the tile's rows: each lane
// sums its 8 elements, the L lanes meet by shuffles, lane sub 0 writes. st is (TT, ld) in
// shared memory; columns at or past `end` are skipped. ACC false: y = 0 + that instead of
// y +=, the same bits as adding into a zeroed y, without reading y.
template <int L, int U, bool ACC = true>
__device__ __forceinline__ void s_expand_store(float *y, const float (&bv)[U][8], const int (&o)[U],
                                               const int (&kk)[U], const float *st, int ld, int r_max, int r,
                                               int j, int sub, int end, const ls_cu_lora_tile_t &tile,
                                               const int32_t *perm, int out_total, float s) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        float acc[TT];
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
            acc[tt] = 0.0f;
            if (tt < tile.n) {
                const float *sk = st + tt * ld + kk[u] * r_max + j;
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (j + e < r)
                        acc[tt] += bv[u][e] * sk[e];
            }
        }
#pragma unroll
        for (int tt = 0; tt < TT; tt++) {
#pragma unroll
            for (int off = L / 2; off > 0; off >>= 1)
                acc[tt] += __shfl_xor_sync(0xffffffffu, acc[tt], off);
            if (sub == 0 && o[u] < end && tt < tile.n) {
                float *yo = y + (size_t)s_row(perm, tile.p0 + tt) * out_total + o[u];
                *yo = __fadd_rn(ACC ? *yo : 0.0f, __fmul_rn(s, acc[tt]));
            }
        }
    }
}

template <typename TB, int L, int E2_U, bool ACC>
__global__ void __launch_bounds__(E2_WARPS * 32)
k_lora_expand2(float *y, const float *tmp, const TB *b_pool, const ls_cu_lora_tile_t *tiles,
               const int32_t *perm, const float *scalings, s_slice_offs_t so, int n_slices,
               int r_max) {
    extern __shared__ float st[]; // (TT, n_slices*r_max)
    constexpr int OPW = 32 / L, OB = E2_WARPS * OPW * E2_U;
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int ld = n_slices * r_max, out_total = so.off[n_slices], r = tile.rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int sub = lane % L, og = lane / L, j = sub * 8;
    float bv[E2_U][8];
    int o[E2_U], kk[E2_U];
    s_expand_load<TB, L, E2_U>(bv, o, kk, b_pool + (size_t)tile.slot * out_total * r_max, so, n_slices, r_max, r,
                               blockIdx.y * OB, E2_WARPS, warp, og, j, out_total);
    float s = scalings[tile.slot];
    // B is in flight; now wait for shrink's tmp and stage it
    s_dep_launch();
    s_dep_wait();
    for (int idx = threadIdx.x; idx < tile.n * ld; idx += blockDim.x) {
        int tt = idx / ld, c = idx % ld;
        st[idx] = c % r_max < r ? tmp[(size_t)s_row(perm, tile.p0 + tt) * ld + c] : 0.0f;
    }
    __syncthreads();
    s_expand_store<L, E2_U, ACC>(y, bv, o, kk, st, ld, r_max, r, j, sub, out_total, tile, perm, out_total, s);
}

// y (T, out_total) = 0 on the tiles' rows
__global__ void k_tile_rows_zero(float *y, const ls_cu_lora_tile_t *tiles, const int32_t *perm,
                                 int out_total) {
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    for (int tt = 0; tt < tile.n; tt++) {
        float *yr = y + (size_t)s_row(perm, tile.p0 + tt) * out_total;
        for (int o = blockIdx.y * blockDim.x + threadIdx.x; o < out_total; o += gridDim.y * blockDim.x)
            yr[o] = 0.0f;
    }
}

// For the paths without a storing kernel: the tiles' rows zeroed, then added into.
static cudaError_t s_tile_rows_zero(float *y, const ls_cu_lora_tile_t *tiles, int n_tiles,
                                    const int32_t *perm, int out_total, cudaStream_t stream) {
    if (n_tiles == 0 || out_total == 0)
        return cudaSuccess;
    k_tile_rows_zero<<<dim3(n_tiles, (out_total + 1023) / 1024), 256, 0, stream>>>(y, tiles, perm,
                                                                                  out_total);
    LS_CU_CHECK_LAUNCH();
}

__global__ void k_rows_zero(float *y, const int32_t *rows, int C) {
    float *yr = y + (size_t)rows[blockIdx.x] * C;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < C; i += gridDim.y * blockDim.x)
        yr[i] = 0.0f;
}

cudaError_t ls_cu_rows_zero(float *y, const int32_t *rows, int n_rows, int C,
                            cudaStream_t stream) {
    if (n_rows == 0 || C == 0)
        return cudaSuccess;
    k_rows_zero<<<dim3(n_rows, (C + 1023) / 1024), 256, 0, stream>>>(y, rows, C);
    LS_CU_CHECK_LAUNCH();
}

cudaError_t ls_cu_lora_expand(float *y, const float *tmp, const void *b_pool,
                              ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, const int32_t *perm, const float *scalings,
                              const int32_t *slice_offsets, int n_slices, int r_max,
                              unsigned flags, cudaStream_t stream) {
    int accumulate = (flags & LS_CU_LORA_ACC) != 0;
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
    s_props();
    size_t smem = (size_t)TT * n_slices * r_max * sizeof(float);
    int vec = r_max % 8 == 0 && (uintptr_t)b_pool % 16 == 0;
    int L = r_max / 8;
    if (vec && s_impl != 1 && (L == 1 || L == 2 || L == 4 || L == 8)) {
        int u = s_impl == 3 ? 8 : 4, ob = E2_WARPS * (32 / L) * u;
        dim3 g2(n_tiles, (out_total + ob - 1) / ob);
        cudaLaunchConfig_t cfg = s_pdl_config(g2, E2_WARPS * 32, smem, stream, flags);
#define S_E2U(LL, UU)                                                                         \
    return accumulate ? cudaLaunchKernelEx(&cfg, k_lora_expand2<TB, LL, UU, true>, y, tmp,   \
                                           (const TB *)b_pool, tiles, perm, scalings, so,    \
                                           n_slices, r_max)                                  \
                      : cudaLaunchKernelEx(&cfg, k_lora_expand2<TB, LL, UU, false>, y, tmp,  \
                                           (const TB *)b_pool, tiles, perm, scalings, so,    \
                                           n_slices, r_max)
#define S_E2(LL)                                                                              \
    do {                                                                                      \
        if (u == 8)                                                                           \
            S_E2U(LL, 8);                                                                     \
        S_E2U(LL, 4);                                                                         \
    } while (0)
        LS_CU_DISPATCH(b_dt, TB,
            if (L == 1) S_E2(1); else if (L == 2) S_E2(2); else if (L == 4) S_E2(4);
            else S_E2(8));
#undef S_E2
#undef S_E2U
    }
    if (!accumulate) {
        cudaError_t e = s_tile_rows_zero(y, tiles, n_tiles, perm, out_total, stream);
        if (e != cudaSuccess)
            return e;
    }
    dim3 grid(n_tiles, (out_total + EX_THREADS - 1) / EX_THREADS);
    LS_CU_DISPATCH(b_dt, TB,
        if (vec) k_lora_expand<TB, true><<<grid, EX_THREADS, smem, stream>>>(
            y, tmp, (const TB *)b_pool, tiles, perm, scalings, so, n_slices, r_max);
        else k_lora_expand<TB, false><<<grid, EX_THREADS, smem, stream>>>(
            y, tmp, (const TB *)b_pool, tiles, perm, scalings, so, n_slices, r_max));
    LS_CU_CHECK_LAUNCH();
}

// -- fused decode shrink + expand (sm_90 thread-block clusters) --------------------------
// One cluster of cn blocks (8, or 16 when there are few tiles) per tile, one launch per
// (layer, group) instead of two. Phase 1: block c of the cluster takes every cn-th
// 256-element chunk of `in` against all n_slices*rank rows of A (warp w: row pairs w,
// w+8, .. through s_shrink2_rows), and leaves its partial tmp (n, n_slices*r_max) in its
// own shared memory. After cluster.sync every block sums the cn partials over distributed
// shared memory in cluster-rank order — the same order in every block, so each holds the
// same full tmp of the tile (deterministic) — and a second cluster.sync keeps every block
// alive until the others have read its partials. Phase 2: the block expands its 1/cn of
// the outputs as expand v2 does (r_max/8 lanes per column, FU_U columns per lane group in
// flight). tmp never leaves the cluster. Per-slot rank: rows j >= rank are neither read
// (A) nor used (B); rank-0 slots have no tile.
namespace cg = cooperative_groups;
// FU_LD: the largest n_slices*r_max, 3 slices of r_max <= 64 (r_max/8 lanes, at most 8)
enum { FU_WARPS = 8, FU_U = 4, FU_LD = 3 * 64 };

template <typename T, int L>
__global__ void __launch_bounds__(FU_WARPS * 32)
k_lora_fused(float *y, const float *x, const T *a_pool, const T *b_pool,
             const ls_cu_lora_tile_t *tiles, const int32_t *perm, const float *scalings,
             s_slice_offs_t so, int in, int n_slices, int r_max) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float part[TT * FU_LD]; // this block's partial tmp, (TT, ld)
    __shared__ float st[TT * FU_LD];   // the tile's full tmp, (TT, ld)
    cg::cluster_group cl = cg::this_cluster();
    int cn = (int)cl.num_blocks(), cr = (int)cl.block_rank();
    ls_cu_lora_tile_t tile = tiles[blockIdx.x / cn];
    int ld = n_slices * r_max, out_total = so.off[n_slices], r = tile.rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int ppk = (r + 1) / 2, n_pairs = n_slices * ppk; // row pairs per slice, in all
    int n_chunks = (in + 255) >> 8;
    const T *a_slot = a_pool + (size_t)tile.slot * ld * in;
    const T *b_slot = b_pool + (size_t)tile.slot * out_total * r_max;
    int per = (out_total + cn - 1) / cn;
    int o_lo = min(cr * per, out_total), o_hi = min(o_lo + per, out_total);

    // before the previous kernel is done: pull this block's A rows and B rows towards L2
    for (int pr = warp; pr < n_pairs; pr += FU_WARPS) {
        int k = pr / ppk, j = pr % ppk * 2;
        for (int q = 0; q < min(2, r - j); q++)
            for (int c = cr; c < n_chunks; c += cn) {
                int i = (c << 8) + lane * 8;
                if (i < in)
                    s_prefetch_l2(a_slot + (size_t)(k * r_max + j + q) * in + i);
            }
    }
    // B rows o_lo..o_hi are contiguous, r_max wide; lines wholly past the rank are skipped
    size_t rowb = (size_t)r_max * sizeof(T), nb = (size_t)(o_hi - o_lo) * rowb;
    const char *b0 = (const char *)(b_slot + (size_t)o_lo * r_max);
    for (size_t off = (size_t)threadIdx.x * 128; off < nb; off += FU_WARPS * 32 * 128)
        if (rowb <= 128 || off % rowb < (size_t)r * sizeof(T))
            s_prefetch_l2(b0 + off);
    s_dep_launch();
    s_dep_wait();

    const float *xr[TT];
    s_tile_xrows(xr, x, perm, tile, in);
    for (int pr = warp; pr < n_pairs; pr += FU_WARPS) { // warp-uniform
        int k = pr / ppk, j = pr % ppk * 2, nq = min(2, r - j);
        const T *a = a_slot + (size_t)(k * r_max + j) * in;
        float acc[S2_R][TT];
        s_shrink2_tile<T, S2_U>(acc, a, in, nq, tile, xr, cr, cn, lane);
#pragma unroll
        for (int q = 0; q < S2_R; q++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++) {
                float v = ls_warp_sum(acc[q][tt]);
                if (lane == 0 && q < nq && tt < tile.n)
                    part[tt * ld + k * r_max + j + q] = v;
            }
    }
    cl.sync(); // every block's partials written
    // only columns j < rank of the tile's rows are summed: nothing else was written
    for (int idx = threadIdx.x; idx < tile.n * ld; idx += blockDim.x) {
        float v = 0.0f;
        if (idx % ld % r_max < r)
            for (int p = 0; p < cn; p++)
                v += cl.map_shared_rank(part, p)[idx];
        st[idx] = v;
    }
    cl.sync(); // no block leaves (freeing its partials) while another still reads them

    constexpr int OPW = 32 / L, OB = FU_WARPS * OPW * FU_U;
    int sub = lane % L, og = lane / L, j = sub * 8;
    float s = scalings[tile.slot];
    for (int ob = o_lo; ob < o_hi; ob += OB) {
        float bv[FU_U][8];
        int o[FU_U], kk[FU_U];
        s_expand_load<T, L, FU_U>(bv, o, kk, b_slot, so, n_slices, r_max, r, ob, FU_WARPS, warp, og, j, o_hi);
        s_expand_store<L, FU_U>(y, bv, o, kk, st, ld, r_max, r, j, sub, o_hi, tile, perm, out_total, s);
    }
#endif
}

// Launches k_lora_fused<T, L> in clusters of cn blocks per tile (with PDL on, as the v2
// kernels). 16-block clusters are non-portable: allowed once per instantiation, and used
// only if the occupancy query says at least one such cluster fits; else 8.
template <typename T, int L>
static cudaError_t s_fused_launch(int cn, int n_tiles, float *y, const float *x,
                                  const void *a_pool, const void *b_pool,
                                  const ls_cu_lora_tile_t *tiles, const int32_t *perm,
                                  const float *scalings, s_slice_offs_t so, int in,
                                  int n_slices, int r_max, unsigned flags, cudaStream_t stream) {
    static int ok16 = -1;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = !(flags & LS_CU_LORA_NO_PDL);
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(FU_WARPS * 32);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 2;
    if (ok16 < 0) {
        int n = 0;
        attr[0].val.clusterDim.x = 16, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(16);
        ok16 = cudaFuncSetAttribute(k_lora_fused<T, L>,
                                    cudaFuncAttributeNonPortableClusterSizeAllowed,
                                    1) == cudaSuccess &&
               cudaOccupancyMaxActiveClusters(&n, k_lora_fused<T, L>, &cfg) == cudaSuccess &&
               n > 0;
        cudaGetLastError(); // a refusal above only means 8-block clusters
    }
    if (cn > 8 && !ok16)
        cn = 8;
    attr[0].val.clusterDim.x = cn, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(n_tiles * cn);
    return cudaLaunchKernelEx(&cfg, k_lora_fused<T, L>, y, x, (const T *)a_pool,
                              (const T *)b_pool, tiles, perm, scalings, so, in, n_slices,
                              r_max);
}

cudaError_t ls_cu_lora_fused(float *y, float *tmp, const float *x, const void *a_pool,
                             ls_cu_dtype_t a_dt, const void *b_pool, ls_cu_dtype_t b_dt,
                             const ls_cu_lora_tile_t *tiles, int n_tiles, int max_rank,
                             const int32_t *perm, const float *scalings,
                             const int32_t *slice_offsets, int in, int n_slices, int r_max,
                             unsigned flags, cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && max_rank <= r_max && in > 0);
    int accumulate = (flags & LS_CU_LORA_ACC) != 0;
    s_props();
    int L = r_max / 8;
    int fits = s_cc >= 9 && s_impl == 4 && a_dt == b_dt && in % 8 == 0 &&
               r_max % 8 == 0 && (L == 1 || L == 2 || L == 4 || L == 8) &&
               (uintptr_t)x % 16 == 0 && (uintptr_t)a_pool % 16 == 0 &&
               (uintptr_t)b_pool % 16 == 0;
    if (!fits) {
        cudaError_t e = ls_cu_lora_shrink(tmp, x, a_pool, a_dt, tiles, n_tiles, max_rank, perm,
                                          in, n_slices, r_max, flags, stream);
        return e != cudaSuccess ? e
                                : ls_cu_lora_expand(y, tmp, b_pool, b_dt, tiles, n_tiles, perm,
                                                    scalings, slice_offsets, n_slices, r_max,
                                                    flags, stream);
    }
    s_slice_offs_t so = {{0, 0, 0, 0}};
    for (int k = 0; k <= n_slices; k++)
        so.off[k] = slice_offsets[k];
    if (n_tiles == 0 || max_rank == 0 || so.off[n_slices] == 0)
        return cudaSuccess;
    if (!accumulate) {
        cudaError_t e = s_tile_rows_zero(y, tiles, n_tiles, perm, so.off[n_slices], stream);
        if (e != cudaSuccess)
            return e;
    }
    // 8-block clusters give >= 2 blocks per SM from ~33 tiles on (132 SMs); below, 16
    int cn = (long)n_tiles * 8 < 2L * s_sm_count() ? 16 : 8;
#define S_FU(LL)                                                                              \
    return s_fused_launch<TA, LL>(cn, n_tiles, y, x, a_pool, b_pool, tiles, perm, scalings,  \
                                  so, in, n_slices, r_max, flags, stream)
    LS_CU_DISPATCH(a_dt, TA,
        if (L == 1) S_FU(1); else if (L == 2) S_FU(2); else if (L == 4) S_FU(4);
        else S_FU(8));
#undef S_FU
    LS_CU_CHECK_LAUNCH();
}
