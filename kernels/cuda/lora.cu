/*  kernels/cuda/lora.cu — segmented LoRA shrink and expand (SGMV) on the GPU.
    CPU reference: kernels/cpu/lora.c; the contract is in kernels/ops.h.

    Work is described by tiles (ops_cuda.h): up to LS_CU_LORA_TILE consecutive positions of
    one segment, built on the host once per step and only for slots of rank > 0, so base
    rows cost no block at all and padding rows are never addressed. The shape in mind is
    decode: one token per request and many distinct adapters, where the A and B reads
    dominate and every byte of them is read exactly once per tile. Rows at or past a slot's
    rank are neither read nor written.

    Adapters lie in pages (docs/memory.md) and come through the page table (ls_lora_pages_t):
    A as rows, B as chunks of 8 rank columns, an (out_total, 8) array each, so a lane's
    16-byte load of B is one chunk of one output row. A block resolves the pointers it needs
    — its rank rows (shrink), its lanes' chunks (expand) — once, into registers (shared
    memory in the tensor-core expand), before ls_dep_wait: the table's load is the one
    dependent load the pages add, in the prologue that programmatic launch overlaps with the
    kernel before; the inner loops are those of a dense slot with a row or chunk base. The
    tuned kernels take whole rows and chunks (one piece); rows and chunks in pieces (pages
    smaller than a row) go to v1 of each op.

    Which kernel runs is decided here, by the shape and the pools, and nowhere else:

    shrink (ls_cu_lora_shrink, and the decode op's first half)
      tc   bf16 A, rank <= 64, 16-byte rows, sm_80+: mma.sync over a tile's own rank rows, K
           split over blocks (the decode op: parts summed by the expand) or clusters
           (k_lora_shrink_tc);
      v3   the decode op's one-position tiles (LS_CU_LORA_ONE) on 16-bit A: a thread owns 8
           elements of K and 8 rank rows' loads at once, few instructions per byte
           (k_lora_shrink3);
      v2   other pools with 16-byte rows: 8 warps, K split over ks warps so that small grids
           still fill the GPU, 4 chunks of 16-byte loads in flight per lane, partial sums
           meeting in shared memory in a fixed order (k_lora_shrink2);
      v1   rows not 16-byte aligned, or in pieces: one element per lane (k_lora_shrink).
    expand (ls_cu_lora_expand, ls_cu_lora_expand_long, the decode op's second half)
      v4   the decode op's multi-position tiles, bf16 B: mma.sync over each tile's own rank,
           blocks per (tile, slice, run of columns), so a mix of ranks in wide slots costs each
           tile its own work (k_lora_expand4);
      v3   one-position tiles: a block per (tile, slice, run of columns), the lane's tmp values
           in registers (k_lora_expand3);
      v2   other tiles with r_max in {8, 16, 32, 64}: L lanes share an output column (L*8
           covering the launch's largest rank, s_expand_lanes), E2_UT columns per lane group
           in flight (8 for one-position tiles), shuffle reduction; sums the shrink's K parts
           as it stages tmp (k_lora_expand2);
      tc   long segments (a prefill, many requests of one adapter: tiles of LS_CU_LORA_LONG
           positions) and ls_cu_lora_expand's accumulating multi-position tiles, bf16 B
           (k_lora_expand_tc);
      v1   everything else (chunks in pieces included): one output column per thread, B rows
           streamed (k_lora_expand; with NT = LS_CU_LORA_LONG for long segments).
    The v2/v3/v4/tc kernels launch with programmatic dependent launch on sm_90 (ls_dep_wait)
    unless the caller says LS_CU_LORA_NO_PDL. The ones the decode op runs on 16-bit pools keep
    nothing in local memory (ls_cu_lora_local_bytes, checked by test_gpu_ops): a stack frame
    there is a memory round trip in every block, and one in shrink v3 (16-bit elements picked
    by indexing the registers as an array) cost the decode step 10% (H200).

    The versions that lost (a one-kernel fused op, v2 with 8 loads in flight everywhere, the
    first kernels' 16-byte path, ...) live in the dev bench, kernels/cuda/dev/ (dev_shrink.cu,
    dev_expand.cu, dev_fused.cu), with their measurements in its README.md.

    Known limits: the shrink of a long segment re-reads A once per 8-token tile (from L2).
*/
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include <algorithm>

#include <cooperative_groups.h>

#include "common.cuh"

namespace cg = cooperative_groups;

enum { SH_WARPS = 4, SH_RPW = 4, SH_JB = SH_WARPS * SH_RPW, EX_THREADS = 256 };
#define TT LS_CU_LORA_TILE

struct s_slice_offs_t {
    int off[4];
};

// x, the shrinks' input: fp32 activations, or their 16-bit copy in A's dtype (the one the
// projection's matmul reads: engine/model.c), which the kernels widen as they load it. TX is
// the type that x_dt names among those two: float or TA.
template <typename T> constexpr ls_cu_dtype_t s_dt_of();
template <> constexpr ls_cu_dtype_t s_dt_of<float>() { return LS_CU_F32; }
template <> constexpr ls_cu_dtype_t s_dt_of<__nv_bfloat16>() { return LS_CU_BF16; }
template <> constexpr ls_cu_dtype_t s_dt_of<__half>() { return LS_CU_F16; }
#define S_WITH_TX(x_dt, TA, TX, ...)                                                          \
    if ((x_dt) == LS_CU_F32) {                                                                \
        typedef float TX;                                                                     \
        __VA_ARGS__;                                                                          \
    } else if ((x_dt) == s_dt_of<TA>()) {                                                     \
        typedef TA TX;                                                                        \
        __VA_ARGS__;                                                                          \
    } else                                                                                    \
        return cudaErrorInvalidValue

// The launchers' slice offsets (n_slices + 1 of them, host memory) as a kernel parameter.
static s_slice_offs_t s_slice_offs(const int32_t *slice_offsets, int n_slices) {
    assert(n_slices >= 1 && n_slices <= 3 && slice_offsets[0] == 0);
    s_slice_offs_t so = {{0, 0, 0, 0}};
    for (int k = 0; k <= n_slices; k++) {
        so.off[k] = slice_offsets[k];
        assert(k == 0 || so.off[k] >= so.off[k - 1]);
    }
    return so;
}

__device__ __forceinline__ int s_row(const int32_t *perm, int p) {
    return perm ? perm[p] : p;
}


// The tile's x rows, x (T, in): xr[tt] for tt < TT, the last one repeated past tile.n (so
// every pointer is a valid row)
template <typename TX>
__device__ __forceinline__ void s_tile_xrows(const TX *(&xr)[TT], const TX *x,
                                             const int32_t *perm, const ls_cu_lora_tile_t &tile,
                                             int in) {
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        xr[tt] = x + (size_t)s_row(perm, tile.p0 + min(tt, tile.n - 1)) * in;
}

// tmp is (T, n_slices*r_max), x is (T, in), a: rows of in elements. The fallback for rows
// not 16-byte aligned or in pieces: one element per lane and load, a piece at a time.
template <typename TA, typename TX>
__global__ void __launch_bounds__(SH_WARPS * 32)
k_lora_shrink(float *tmp, const TX *x, ls_lora_pages_t a, const ls_cu_lora_tile_t *tiles,
              const int32_t *perm, int in, int n_slices, int r_max) {
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int k = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int jw = blockIdx.z * SH_JB + warp * SH_RPW; // this warp's first rank row
    if (jw >= tile.rank)
        return;
    int ld = n_slices * r_max, row0 = k * r_max + jw;
    int nq = min(SH_RPW, tile.rank - jw);
    const TX *xr[TT];
    s_tile_xrows(xr, x, perm, tile, in);

    float acc[SH_RPW][TT];
#pragma unroll
    for (int q = 0; q < SH_RPW; q++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            acc[q][tt] = 0.0f;

    for (int pc = 0; pc < a.np; pc++) {
        int e0 = pc * a.piece, e1 = min(in, e0 + a.piece);
        const TA *ap[SH_RPW]; // the piece of each row
#pragma unroll
        for (int q = 0; q < SH_RPW; q++)
            ap[q] = q < nq ? ls_lora_entry<TA>(a, tile.slot, (size_t)(row0 + q) * a.np + pc) : nullptr;
        for (int i = e0 + lane; i < e1; i += 32) {
            float xv[TT];
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                xv[tt] = tt < tile.n ? ls_to_f(xr[tt][i]) : 0.0f;
#pragma unroll
            for (int q = 0; q < SH_RPW; q++)
                if (q < nq) {
                    float av = ls_to_f(ap[q][i - e0]);
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

// Programmatic dependent launch (ls_dep_wait, common.cuh): the v2/v3 kernels are launched
// so that they may start while the kernel before them drains. Until ls_dep_wait() they only
// read what no kernel of the step writes (the adapter pools, the tiles with their scales:
// uploaded and synchronized before the step) and write nothing.
__device__ __forceinline__ void s_prefetch_l2(const void *p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

template <typename TA, int NT, int U, typename TX>
__device__ __forceinline__ void s_shrink2_rows(float (&acc)[S2_R][LS_CU_LORA_TILE],
                                               const TA *const (&ar)[S2_R], int in, int nq, int ntok,
                                               const TX *const (&xr)[LS_CU_LORA_TILE],
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
                    ls_load8(ar[q] + i, av[u][q]);
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

// acc = the tile's partial sums of nq (<= S2_R) rows of A (ar) against its x rows xr,
// over every ks-th 256-element chunk of `in` from kp: one-token tiles (decode) U chunks
// deep, longer ones 1 deep over their TT tokens; zeros for nq <= 0.
template <typename TA, int U, typename TX>
__device__ __forceinline__ void s_shrink2_tile(float (&acc)[S2_R][LS_CU_LORA_TILE], const TA *const (&ar)[S2_R],
                                               int in, int nq, const ls_cu_lora_tile_t &tile,
                                               const TX *const (&xr)[LS_CU_LORA_TILE],
                                               int kp, int ks, int lane) {
#pragma unroll
    for (int q = 0; q < S2_R; q++)
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            acc[q][tt] = 0.0f;
    if (nq <= 0)
        return;
    if (tile.n == 1)
        s_shrink2_rows<TA, 1, U>(acc, ar, in, nq, 1, xr, kp, ks, lane);
    else
        s_shrink2_rows<TA, TT, 1>(acc, ar, in, nq, tile.n, xr, kp, ks, lane);
}

template <typename TA, int U, typename TX>
__global__ void __launch_bounds__(S2_WARPS * 32)
k_lora_shrink2(float *tmp, const TX *x, ls_lora_pages_t a, const ls_cu_lora_tile_t *tiles,
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
    const TA *ar[S2_R]; // this warp's rows (whole: one piece)
#pragma unroll
    for (int q = 0; q < S2_R; q++)
        ar[q] = q < nq ? ls_lora_entry<TA>(a, tile.slot, (size_t)k * r_max + jw + q) : nullptr;
    const TX *xr[TT];
    s_tile_xrows(xr, x, perm, tile, in);
    // before the previous kernel is done: pull this warp's A rows towards L2
#pragma unroll
    for (int q = 0; q < S2_R; q++)
        for (int c = kp; q < nq && c < (in + 255) >> 8; c += ks) {
            int i = (c << 8) + lane * 8;
            if (i < in)
                s_prefetch_l2(ar[q] + i);
        }
    ls_dep_launch();
    ls_dep_wait();
    float acc[S2_R][TT];
    s_shrink2_tile<TA, U>(acc, ar, in, nq, tile, xr, kp, ks, lane);
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

// -- tensor-core shrink (bf16 A) --------------------------------------------------------
// The FMA shrinks above re-read the tile's fp32 x rows for every pair of rank rows they
// own: four times the bytes of A at decode, from L2, which is what bounds them (~4 GB/s of
// A per SM beside a GEMM: kernels/cuda/dev/README.md, the green-context table). Here a warp
// owns every rank row of the tile (m tiles of 16 rows) for a stretch of K, and mma.sync
// m16n8k16 (rows = rank rows of A, columns = the tile's tokens, N 8 >= LS_CU_LORA_TILE)
// reuses each x element over all of them: x is read once per block, A once, and a lane keeps 16-byte loads of A in flight.
// fp32 x goes in as three bf16 parts (hi + mid + lo = x to fp32's 24 bits; bf16 A times a
// bf16 part is exact in the fp32 accumulator), so the result is fp32 arithmetic in another
// summation order, as the FMA kernels; a bf16 x is its own single part.
// Fragment layout (PTX m16n8k16, g = lane/4, c = lane%4): A regs hold (row g | g+8, k 2c,
// 2c+1 | 2c+8, 2c+9), B regs (k 2c, 2c+1 | 2c+8, 2c+9; token g), D (row g | g+8, token 2c,
// 2c+1). The order of k inside a 16-wide step is free as long as A and x agree, so lane c
// loads memory elements 8c .. 8c+7 of a 32-wide half chunk and feeds elements 0-3 to one
// k step and 4-7 to the next: one 16-byte load of A per row per half, no shuffles.
// Block: TC_WARPS warps over a (tile, slice, part of K); warp w takes every (warps over
// all parts)-th 64-wide chunk of `in`. The warps' sums meet in shared memory in warp
// order; the parts' sums in fixed order too (deterministic), two ways:
// - parts in memory (ls_cu_lora_apply, the decode op): kb blocks per (tile, slice) write
//   their sums to kb arrays of scratch, and expand v2 adds them up as it stages tmp.
//   Enough parts for one round of loads per warp: each dependent memory round trip costs
//   microseconds beside a GEMM that keeps HBM busy, so the shrink is one round trip deep.
// - a cluster of kb blocks (sm_90, ls_cu_lora_shrink), block 0 summing over distributed
//   shared memory in cluster-rank order. Beside a GEMM, clusters wait to be co-scheduled:
//   the decode op avoids them (beside the GEMMs they measured no gain; kernels/cuda/dev/README.md).
enum { TC_WARPS = 8, TC_CH = 64 };
// chunks a warp keeps in flight for NMT m tiles: 2 while A's registers allow (NMT <= 2)
__host__ __device__ constexpr int s_tc_u(int nmt) {
    return nmt <= 2 ? 2 : 1;
}

__device__ __forceinline__ uint32_t s_bf16x2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

// x (two fp32 values, lower k first) as three bf16x2 parts whose sum is x: hi, mid, lo
__device__ __forceinline__ void s_split3(float a, float b, uint32_t (&p)[3]) {
#pragma unroll
    for (int i = 0; i < 3; i++) {
        p[i] = s_bf16x2(a, b);
        __nv_bfloat162 h = *reinterpret_cast<__nv_bfloat162 *>(&p[i]);
        float2 f = __bfloat1622float2(h);
        a -= f.x, b -= f.y; // exact: the residual of a rounding to nearest
    }
}

__device__ __forceinline__ void s_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                           uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d[m] += rows m*16 .. m*16+15 (below `rank`) of A (slot's rows row0 + j of a) times the
// lane's x row over this warp's 64-wide chunks of `in` (c_first, then every stride-th), U
// chunks in flight: the lane's row pointers first, then the A loads, then (once, before the
// first x load) ls_dep_wait, then x. xr is token g's row (xok: g is one of the tile's tokens,
// else zeros go in).
template <int NMT, int U, typename TX>
__device__ __forceinline__ void s_tc_accum(float (&d)[NMT][4], const ls_lora_pages_t &a, int slot, int row0,
                                           int rank, const TX *xr, bool xok, int in, int c_first,
                                           int stride, int lane) {
    // bf16 parts of an x element: three for fp32 (exact), one for a bf16 x (itself)
    constexpr int NP = sizeof(TX) == 4 ? 3 : 1;
    int g = lane >> 2, c = lane & 3, n_chunks = (in + TC_CH - 1) / TC_CH;
    const __nv_bfloat16 *ar[NMT][2]; // rows m*16 + q*8 + g (whole: one piece)
#pragma unroll
    for (int m = 0; m < NMT; m++)
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int j = m * 16 + q * 8 + g;
            ar[m][q] = j < rank ? ls_lora_entry<__nv_bfloat16>(a, slot, (size_t)row0 + j) : nullptr;
        }
    bool waited = false;
    for (int c0 = c_first; c0 < n_chunks; c0 += U * stride) {
        // A first: no kernel of the step writes it, so it may load before ls_dep_wait
        uint4 av[U][2][NMT][2]; // (chunk, half, m tile, row g | g+8)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = (c0 + u * stride) * TC_CH + h * 32 + c * 8;
                bool ok = c0 + u * stride < n_chunks && i < in;
#pragma unroll
                for (int m = 0; m < NMT; m++)
#pragma unroll
                    for (int q = 0; q < 2; q++) {
                        int j = m * 16 + q * 8 + g;
                        av[u][h][m][q] = ok && j < rank ? __ldg(reinterpret_cast<const uint4 *>(ar[m][q] + i))
                                                        : make_uint4(0, 0, 0, 0);
                    }
            }
        if (!waited) {
            ls_dep_wait();
            waited = true;
        }
        float xv[U][2][8]; // (chunk, half, elements 0-7)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = (c0 + u * stride) * TC_CH + h * 32 + c * 8;
                if (xok && c0 + u * stride < n_chunks && i < in)
                    ls_load8(xr + i, xv[u][h]);
                else
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        xv[u][h][e] = 0.0f;
            }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int e = 0; e < 2; e++) { // k step: elements 4e .. 4e+3 of the half
                    const float *xe = xv[u][h] + 4 * e;
                    uint32_t b0[3], b1[3];
                    s_split3(xe[0], xe[1], b0);
                    s_split3(xe[2], xe[3], b1);
#pragma unroll
                    for (int m = 0; m < NMT; m++) {
                        const uint4 &r0 = av[u][h][m][0], &r8 = av[u][h][m][1];
                        uint32_t a0 = e ? r0.z : r0.x, a1 = e ? r8.z : r8.x;
                        uint32_t a2 = e ? r0.w : r0.y, a3 = e ? r8.w : r8.y;
#pragma unroll
                        for (int p = 0; p < NP; p++)
                            s_mma_bf16(d[m], a0, a1, a2, a3, b0[p], b1[p]);
                    }
                }
    }
    if (!waited)
        ls_dep_wait(); // a warp without chunks must still not write before its predecessor
}

// The block's partial sums, d of every warp (D: row g | g+8, token 2c, 2c+1), summed over
// the warps in warp order into red[t], t = row*TT + tt < NMT*16*TT (more entries than the
// block has threads: each thread sums every blockDim-th). red is (TC_WARPS, NMT*16*TT).
template <int NMT>
__device__ __forceinline__ void s_tc_block_sum(const float (&d)[NMT][4], float *red, int warp, int lane) {
    constexpr int NR = NMT * 16 * TT, PER = (NR + TC_WARPS * 32 - 1) / (TC_WARPS * 32);
    int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int m = 0; m < NMT; m++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = m * 16 + g + (e >> 1) * 8, tt = 2 * c + (e & 1);
            if (tt < TT)
                red[warp * NR + row * TT + tt] = d[m][e];
        }
    __syncthreads();
    float v[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int t = threadIdx.x + i * TC_WARPS * 32;
        v[i] = 0.0f;
        if (t < NR)
            for (int w = 0; w < TC_WARPS; w++)
                v[i] += red[w * NR + t];
    }
    __syncthreads(); // every warp's partials read before the sums overwrite them
#pragma unroll
    for (int i = 0; i < PER; i++) {
        int t = threadIdx.x + i * TC_WARPS * 32;
        if (t < NR)
            red[t] = v[i];
    }
    __syncthreads();
}

// tmp is (T, n_slices*r_max), x is (T, in), a: rows of in elements (whole);
// NMT m tiles of 16 rank rows (max rank <= 16*NMT)
template <int NMT, typename TX>
__global__ void __launch_bounds__(TC_WARPS * 32)
k_lora_shrink_tc(float *tmp, const TX *x, ls_lora_pages_t a,
                 const ls_cu_lora_tile_t *tiles, const int32_t *perm, int in, int n_slices,
                 int r_max, int kb, size_t part_stride) {
    __shared__ float red[TC_WARPS * NMT * 16 * TT];
    // this block's part of K: blockIdx.z when the parts go to memory, else its cluster rank
    int cr = part_stride ? (int)blockIdx.z : 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!part_stride && kb > 1)
        cr = (int)cg::this_cluster().block_rank();
#endif
    ls_cu_lora_tile_t tile = tiles[part_stride ? blockIdx.x : blockIdx.x / kb];
    int k = blockIdx.y, ld = n_slices * r_max, row0 = k * r_max;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const TX *xr = x + (size_t)s_row(perm, tile.p0 + min(g, tile.n - 1)) * in;
    ls_dep_launch();
    float d[NMT][4] = {};
    int c_first = cr * TC_WARPS + warp, stride = TC_WARPS * kb;
    // m tiles by the tile's own rank, not the launch's largest: a rank-8 tile beside a
    // rank-64 one would keep one chunk in flight and run four m tiles' mma (block-uniform)
    if (NMT > 1 && tile.rank <= 16) {
        float d1[1][4] = {};
        s_tc_accum<1, s_tc_u(1)>(d1, a, tile.slot, row0, tile.rank, xr, g < tile.n, in, c_first, stride, lane);
#pragma unroll
        for (int e = 0; e < 4; e++)
            d[0][e] = d1[0][e];
    } else if (NMT > 2 && tile.rank <= 32) {
        float d2[2][4] = {};
        s_tc_accum<2, s_tc_u(2)>(d2, a, tile.slot, row0, tile.rank, xr, g < tile.n, in, c_first, stride, lane);
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                d[m][e] = d2[m][e];
    } else
        s_tc_accum<NMT, s_tc_u(NMT)>(d, a, tile.slot, row0, tile.rank, xr, g < tile.n, in, c_first, stride,
                                     lane);
    s_tc_block_sum<NMT>(d, red, warp, lane);
    constexpr int NR = NMT * 16 * TT;
    if (part_stride) { // every part writes all its entries, zero or not
        for (int t = threadIdx.x; t < NR; t += blockDim.x) {
            int row = t / TT, tt = t % TT;
            if (row < tile.rank && tt < tile.n)
                tmp[cr * part_stride + (size_t)s_row(perm, tile.p0 + tt) * ld + (size_t)k * r_max + row] = red[t];
        }
        return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (kb > 1) { // block 0 sums the cluster's blocks in rank order
        cg::cluster_group cl = cg::this_cluster();
        cl.sync();
        if (cr == 0)
            for (int t = threadIdx.x; t < NR; t += blockDim.x) {
                int row = t / TT, tt = t % TT;
                float v = 0.0f;
                for (int p = 0; p < kb; p++)
                    v += cl.map_shared_rank(red, p)[t];
                if (row < tile.rank && tt < tile.n)
                    tmp[(size_t)s_row(perm, tile.p0 + tt) * ld + (size_t)k * r_max + row] = v;
            }
        cl.sync(); // no block leaves (freeing its sums) while block 0 still reads them
        return;
    }
#endif
    for (int t = threadIdx.x; t < NR; t += blockDim.x) {
        int row = t / TT, tt = t % TT;
        if (row < tile.rank && tt < tile.n)
            tmp[(size_t)s_row(perm, tile.p0 + tt) * ld + (size_t)k * r_max + row] = red[t];
    }
}

// Whether the v3 kernels (shrink v3 where A is 16-bit, expand v3) run: one-position tiles
static bool s_v3(unsigned flags) {
    return (flags & LS_CU_LORA_ONE) != 0;
}

// A launch configuration and the attributes it points to (so it is filled in place, not
// returned): a launch that may overlap the previous kernel's tail (sm_90+, see
// ls_dep_wait) unless flags say LS_CU_LORA_NO_PDL, in thread-block clusters of
// `cluster` blocks along x when > 1 (sm_90).
struct s_launch_t {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
};
static void s_launch_init(s_launch_t &l, dim3 grid, int threads, size_t smem, cudaStream_t stream,
                          unsigned flags, int cluster = 1) {
    l.cfg = {};
    l.cfg.gridDim = grid;
    l.cfg.blockDim = dim3(threads);
    l.cfg.dynamicSmemBytes = smem;
    l.cfg.stream = stream;
    l.cfg.attrs = l.attr;
    l.cfg.numAttrs = ls_cu_launch_attrs(l.attr, !(flags & LS_CU_LORA_NO_PDL), cluster);
}

// Launches k_lora_shrink_tc<NMT>: clusters of kb blocks (sm_90) along x, one block per
// (tile, slice, cluster rank); programmatic dependent launch as the v2 kernels.
template <int NMT, typename TX>
static cudaError_t s_shrink_tc_launch(int kb, size_t part_stride, int n_tiles, float *tmp,
                                      const TX *x, ls_lora_pages_t a,
                                      const ls_cu_lora_tile_t *tiles, const int32_t *perm,
                                      int in, int n_slices, int r_max, unsigned flags,
                                      cudaStream_t stream) {
    s_launch_t l;
    if (part_stride)
        s_launch_init(l, dim3(n_tiles, n_slices, kb), TC_WARPS * 32, 0, stream, flags);
    else
        s_launch_init(l, dim3(n_tiles * kb, n_slices), TC_WARPS * 32, 0, stream, flags, kb);
    return cudaLaunchKernelEx(&l.cfg, k_lora_shrink_tc<NMT, TX>, tmp, x, a, tiles, perm, in, n_slices,
                              r_max, kb, part_stride);
}

// The K parts of the tensor-core shrink into parts (part_stride > 0): one round of chunks per
// warp, but no more blocks than ~2 per SM need: with many tiles (64 distinct adapters) fewer,
// longer blocks were measured faster (whole step 3.04 ms against 3.19 uncapped, H200), with
// few (8 distinct) the cap never binds
static int s_shrink_tc_parts(int n_tiles, int max_rank, int in, int n_slices) {
    int u = s_tc_u((max_rank + 15) / 16), n_chunks = (in + TC_CH - 1) / TC_CH;
    int tb = n_tiles * n_slices, cap = (2 * ls_cu_props()->sms + tb - 1) / tb;
    int kb = std::min((n_chunks + TC_WARPS * u - 1) / (TC_WARPS * u), (int)LS_CU_LORA_PARTS);
    return std::max(1, std::min(kb, cap));
}

// The tensor-core shrink for this call: m tiles from the largest rank (<= 64), chunks in
// flight from the m tiles (registers), and how K is split. With part_stride (> 0): over
// kb <= LS_CU_LORA_PARTS blocks, one round of chunks per warp where 8 parts and ~2 blocks
// per SM allow, whose sums go to tmp + part * part_stride (the caller sums them; *parts =
// kb). Else over
// clusters of kb blocks (sm_90), kb doubled up to 8 while the blocks fall short of the
// SMs and every warp keeps at least U chunks, and tmp gets the sums.
static cudaError_t s_shrink_tc(float *tmp, size_t part_stride, int *parts, const void *x,
                               ls_cu_dtype_t x_dt, ls_lora_pages_t a,
                               const ls_cu_lora_tile_t *tiles, int n_tiles,
                               int max_rank, const int32_t *perm, int in, int n_slices,
                               int r_max, unsigned flags, cudaStream_t stream) {
    int nmt = (max_rank + 15) / 16, u = s_tc_u(nmt);
    int n_chunks = (in + TC_CH - 1) / TC_CH, kb = 1;
    if (part_stride)
        kb = s_shrink_tc_parts(n_tiles, max_rank, in, n_slices);
    else
        while (ls_cu_props()->cc >= 9 && kb < 8 &&
               (long)n_tiles * n_slices * kb < ls_cu_props()->sms &&
               n_chunks >= 2 * TC_WARPS * kb * u)
            kb *= 2;
    if (parts)
        *parts = kb;
#define S_TC(M)                                                                               \
    S_WITH_TX(x_dt, __nv_bfloat16, TX,                                                        \
              return s_shrink_tc_launch<M>(kb, part_stride, n_tiles, tmp, (const TX *)x, a,   \
                                           tiles, perm, in, n_slices, r_max, flags, stream))
    switch (nmt) {
    case 1: S_TC(1);
    case 2: S_TC(2);
    case 3: S_TC(3);
    default: S_TC(4);
    }
#undef S_TC
}

// Whether the tensor-core shrink runs (bf16 A in whole rows, x fp32 or bf16, 16-byte loads,
// rank <= 64, sm_80+)
static bool s_shrink_tc_fits(const void *x, ls_cu_dtype_t x_dt, const ls_lora_pages_t &a,
                             ls_cu_dtype_t a_dt, int in, int max_rank) {
    return a_dt == LS_CU_BF16 && (x_dt == LS_CU_F32 || x_dt == LS_CU_BF16) && a.np == 1 &&
           in % 8 == 0 && (uintptr_t)x % 16 == 0 && max_rank <= 64 && ls_cu_props()->cc >= 8;
}

// Launches shrink v2 with U chunks of loads in flight per lane (S2_U; the dev bench's
// variants take others). K splits across the warps of a block (fewer rows per block, more
// blocks) until the grid has >= 2 blocks per SM or every warp owns 2 rows of 1/8 of `in`.
template <int U>
static cudaError_t s_shrink2(float *tmp, const void *x, ls_cu_dtype_t x_dt, ls_lora_pages_t a,
                             ls_cu_dtype_t a_dt,
                             const ls_cu_lora_tile_t *tiles, int n_tiles, int max_rank,
                             const int32_t *perm, int in, int n_slices, int r_max, unsigned flags,
                             cudaStream_t stream) {
    int ks = 1, jb = S2_WARPS * S2_R;
    while (ks < 8 &&
           (long)n_tiles * n_slices * ((max_rank + jb - 1) / jb) < 2L * ls_cu_props()->sms) {
        ks *= 2;
        jb = S2_WARPS / ks * S2_R;
    }
    dim3 g2(n_tiles, n_slices, (max_rank + jb - 1) / jb);
    s_launch_t l;
    s_launch_init(l, g2, S2_WARPS * 32, 0, stream, flags);
    LS_CU_DISPATCH(a_dt, TA,
        S_WITH_TX(x_dt, TA, TX,
                  return cudaLaunchKernelEx(&l.cfg, k_lora_shrink2<TA, U, TX>, tmp, (const TX *)x,
                                            a, tiles, perm, in, n_slices, r_max, ks)));
    return cudaErrorInvalidValue;
}

cudaError_t ls_cu_lora_shrink(float *tmp, const void *x, ls_cu_dtype_t x_dt, ls_lora_pages_t a,
                              ls_cu_dtype_t a_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, int max_rank, const int32_t *perm, int in,
                              int n_slices, int r_max, unsigned flags, cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && max_rank <= r_max && in > 0 && a.np >= 1);
    if (n_tiles == 0 || max_rank == 0)
        return cudaSuccess;
    if (s_shrink_tc_fits(x, x_dt, a, a_dt, in, max_rank))
        return s_shrink_tc(tmp, 0, NULL, x, x_dt, a, tiles, n_tiles, max_rank, perm, in,
                           n_slices, r_max, flags, stream);
    // 16-byte loads need every row start aligned: x rows (in elements: 8 is 16 bytes of
    // 16-bit x, 32 of fp32), A rows (in elements; pages start them 16-byte aligned) whole
    if (in % 8 == 0 && (uintptr_t)x % 16 == 0 && a.np == 1)
        return s_shrink2<S2_U>(tmp, x, x_dt, a, a_dt, tiles, n_tiles, max_rank, perm, in,
                               n_slices, r_max, flags, stream);
    dim3 grid(n_tiles, n_slices, (max_rank + SH_JB - 1) / SH_JB);
    LS_CU_DISPATCH(a_dt, TA,
        S_WITH_TX(x_dt, TA, TX,
                  k_lora_shrink<TA, TX><<<grid, SH_WARPS * 32, 0, stream>>>(
                      tmp, (const TX *)x, a, tiles, perm, in, n_slices, r_max)));
    LS_CU_CHECK_LAUNCH();
}

// y is (T, out_total), tmp is (T, n_slices*r_max), b: chunks of out_total rows (any pieces);
// tiles of up to NT positions (LS_CU_LORA_TILE, or LS_CU_LORA_LONG for long segments).
// A thread's y reads are all issued before its sums and its writes come last: read, add and
// write row by row, each row was a dependent round trip (the row index, then y) that the
// compiler could not overlap with the previous row's write (y may alias perm), 35 us a
// launch at decode for 32 rows (H200)
template <typename TB, int NT = TT>
__global__ void __launch_bounds__(EX_THREADS)
k_lora_expand(float *__restrict__ y, const float *__restrict__ tmp, ls_lora_pages_t b,
              const ls_cu_lora_tile_t *__restrict__ tiles, const int32_t *__restrict__ perm,
              s_slice_offs_t so, int n_slices, int r_max) {
    extern __shared__ float st[]; // (NT, n_slices*r_max)
    __shared__ int rows[NT];
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int ld = n_slices * r_max, out_total = so.off[n_slices], r = tile.rank;
    if (threadIdx.x < NT)
        rows[threadIdx.x] = s_row(perm, tile.p0 + min((int)threadIdx.x, tile.n - 1));
    __syncthreads();
    int o = blockIdx.y * blockDim.x + threadIdx.x;
    bool live = o < out_total;
    float yv[NT];
#pragma unroll
    for (int tt = 0; tt < NT; tt++)
        yv[tt] = live && tt < tile.n ? y[(size_t)rows[tt] * out_total + o] : 0.0f;
    for (int idx = threadIdx.x; idx < tile.n * ld; idx += blockDim.x) {
        int tt = idx / ld, c = idx % ld;
        // only columns j < rank are read: the rest of tmp may hold anything, even NaN
        st[idx] = c % r_max < r ? tmp[(size_t)rows[tt] * ld + c] : 0.0f;
    }
    __syncthreads();
    if (!live)
        return;
    int k = 0;
    while (k + 1 < n_slices && o >= so.off[k + 1])
        k++;
    // row o of every chunk: its piece's entry and the row within it
    size_t piece = (size_t)(o / b.piece), at = (size_t)(o % b.piece) * 8;
    const float *sk = st + k * r_max;
    float acc[NT];
#pragma unroll
    for (int tt = 0; tt < NT; tt++)
        acc[tt] = 0.0f;
    for (int j = 0; j < r; j += 8) {
        const TB *bc = ls_lora_entry<TB>(b, tile.slot, (size_t)(j / 8) * b.np + piece) + at;
        float bv[8];
        ls_load8(bc, bv);
#pragma unroll
        for (int e = 0; e < 8; e++) // elements at or past the rank may hold anything (NaN)
            bv[e] = j + e < r ? bv[e] : 0.0f;
#pragma unroll
        for (int tt = 0; tt < NT; tt++)
            if (tt < tile.n)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[tt] += bv[e] * (j + e < r ? sk[tt * ld + j + e] : 0.0f);
    }
    float s = tile.scale;
#pragma unroll
    for (int tt = 0; tt < NT; tt++)
        if (tt < tile.n) // scaling on the product
            y[(size_t)rows[tt] * out_total + o] = __fadd_rn(yv[tt], __fmul_rn(s, acc[tt]));
}

// -- expand (v2) -------------------------------------------------------------------------
// L lanes share one output column, each loading 16 bytes of its B row (s_expand_lanes: enough
// for the launch's largest rank), U columns per lane group in flight; the L partial
// dots meet by shuffles. Elements j >= the slot's rank are loaded (inside the pool) but
// never used, so whatever they hold (NaN poison too) cannot leak into y.
// E2_UT: columns per lane group in flight for multi-position tiles, whose y values (TT per
// column) take the registers: at 4 with tiles of 8 the kernels spilled
enum { E2_WARPS = 8, E2_UT = 2 };

// The v2 expand's column work, shared by k_lora_expand2 and k_lora_fused. L lanes share one
// output column (lane `sub` holds its B elements j = sub*8 .. j+7: chunk sub), U columns per
// lane group. Loads, for column o[u] = base + (u*warps + warp)*(32/L) + og below `end`, its
// slice kk[u] and its 8 B values (zero at or past the slot's rank r, or past `end`). bch is
// the lane's chunk of the slot's B, (out_total, 8), or NULL at or past the rank.
// 8 elements of T as loaded (16-byte loads), converted to float only where used: a load
// issued early stays in flight until then, in half the registers for 16-bit types
template <typename T> struct s_raw8 {
    uint4 v[sizeof(T) / 2];
};
template <typename T> __device__ __forceinline__ void s_raw_load(s_raw8<T> &r, const T *p) {
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 2); i++)
        r.v[i] = __ldg(reinterpret_cast<const uint4 *>(p) + i);
}
// element e (a constant once unrolled) of the 8: for 16-bit types by shifts and masks on its
// 32-bit word, not by indexing the registers as an array of halves (which put shrink v3's
// bf16 rows in a local-memory stack frame)
__device__ __forceinline__ uint32_t s_raw_word(const uint4 &v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}
__device__ __forceinline__ float s_raw_get(const s_raw8<__nv_bfloat16> &r, int e) {
    uint32_t w = s_raw_word(r.v[0], e >> 1);
    return __uint_as_float(e & 1 ? w & 0xffff0000u : w << 16);
}
__device__ __forceinline__ float s_raw_get(const s_raw8<__half> &r, int e) {
    uint32_t w = s_raw_word(r.v[0], e >> 1);
    return __half2float(__ushort_as_half((unsigned short)(e & 1 ? w >> 16 : w & 0xffffu)));
}
__device__ __forceinline__ float s_raw_get(const s_raw8<float> &r, int e) {
    return __uint_as_float(s_raw_word(r.v[e >> 2], e & 3));
}

template <typename TB, int L, int U>
__device__ __forceinline__ void s_expand_load(s_raw8<TB> (&bv)[U], int (&o)[U], int (&kk)[U], const TB *bch,
                                              s_slice_offs_t so, int n_slices, int base, int warps, int warp,
                                              int og, int end) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        o[u] = base + (u * warps + warp) * (32 / L) + og;
        int k = 0;
        while (k + 1 < n_slices && o[u] >= so.off[k + 1])
            k++;
        kk[u] = k;
        // elements j..j+7 >= rank are loaded (inside the chunk) but never used
        if (o[u] < end && bch)
            s_raw_load(bv[u], bch + (size_t)o[u] * 8);
        else
            bv[u] = s_raw8<TB>{};
    }
}

// y[row, o[u]] = yv[u][row] + s * Σ_{j<r} st[row, kk[u]*r_max + j] * B[o[u], j] for the
// tile's rows: each lane sums its 8 elements, the L lanes meet by shuffles, lane sub 0
// writes. st is (TT, ld) in shared memory; columns at or past `end` are skipped. ACC
// false: y = 0 + that instead, the same bits as adding into a zeroed y (yv unused).
// yv[u][tt] = y[row tt, o[u]] where s_expand_store will write it (lane sub 0, o[u] < end,
// tt < tile.n), for ACC: loaded as early as y may be read, so that the read is not a round
// trip of its own after the sums
template <int U, int NT = TT>
__device__ __forceinline__ void s_expand_yload(float (&yv)[U][NT], const float *y, const int (&o)[U], int sub,
                                               int end, const ls_cu_lora_tile_t &tile, const int32_t *perm,
                                               int out_total) {
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int tt = 0; tt < NT; tt++)
            yv[u][tt] = sub == 0 && o[u] < end && tt < tile.n
                            ? y[(size_t)s_row(perm, tile.p0 + tt) * out_total + o[u]]
                            : 0.0f;
}

// y's value out: what it held + v (ACC), or the delta v alone (the DELTA workspace beside the
// GEMM: 0 + v, the same bits as adding into a zeroed y), stored with L2's evict_last policy
// (sm_80+): the GEMM's weights stream through L2 meanwhile, and the op after the GEMM should
// read the delta from L2 rather than from memory
template <bool ACC> __device__ __forceinline__ void s_y_put(float *p, float held, float v) {
    if constexpr (ACC)
        *p = __fadd_rn(held, v);
    else
        asm volatile("{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;\n"
                     "st.global.L2::cache_hint.f32 [%0], %1, pol;\n}\n" ::"l"(p),
                     "f"(__fadd_rn(0.0f, v))
                     : "memory");
}

// NT >= tile.n: the tokens the code is unrolled for (a one-token tile must not issue the
// instructions of four: at 64 distinct adapters the expand was issue-bound, ncu)
template <typename TB, int L, int U, bool ACC = true, int NT = TT>
__device__ __forceinline__ void s_expand_store(float *y, const float (&yv)[U][NT], const s_raw8<TB> (&bv)[U],
                                               const int (&o)[U], const int (&kk)[U], const float *st, int ld,
                                               int r_max, int r, int j, int sub, int end,
                                               const ls_cu_lora_tile_t &tile, const int32_t *perm,
                                               int out_total, float s) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        float b[8];
#pragma unroll
        for (int e = 0; e < 8; e++) // elements at or past the rank may hold anything (NaN)
            b[e] = j + e < r ? s_raw_get(bv[u], e) : 0.0f;
        float acc[NT];
#pragma unroll
        for (int tt = 0; tt < NT; tt++) {
            acc[tt] = 0.0f;
            if (tt < tile.n) {
                // st columns j .. j+7: 32-byte aligned (j = 8*sub, ld and r_max multiples of 8)
                const float4 *sk = reinterpret_cast<const float4 *>(st + tt * ld + kk[u] * r_max + j);
                float4 lo = sk[0], hi = sk[1];
                float sv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (j + e < r)
                        acc[tt] += b[e] * sv[e];
            }
        }
#pragma unroll
        for (int tt = 0; tt < NT; tt++) {
#pragma unroll
            for (int off = L / 2; off > 0; off >>= 1)
                acc[tt] += __shfl_xor_sync(0xffffffffu, acc[tt], off);
            if (sub == 0 && o[u] < end && tt < tile.n) {
                s_y_put<ACC>(y + (size_t)s_row(perm, tile.p0 + tt) * out_total + o[u], yv[u][tt],
                             __fmul_rn(s, acc[tt]));
            }
        }
    }
}

// expand v2 after the wait, unrolled for NT tokens: y loads (ACC) in flight with the staging
// of tmp (the sum of its n_parts partial arrays, part_stride apart, in order), then the sums
template <typename TB, int L, int U, bool ACC, int NT>
__device__ __forceinline__ void s_expand2_finish(float *y, const float *tmp, int n_parts, size_t part_stride,
                                                 float *st, const s_raw8<TB> (&bv)[U], const int (&o)[U],
                                                 const int (&kk)[U], int ld, int r_max, int r, int j, int sub,
                                                 int out_total, const ls_cu_lora_tile_t &tile,
                                                 const int32_t *perm, float s) {
    float yv[U][NT];
    if (ACC)
        s_expand_yload<U, NT>(yv, y, o, sub, out_total, tile, perm, out_total);
    for (int idx = threadIdx.x; idx < tile.n * ld; idx += blockDim.x) {
        int tt = idx / ld, c = idx % ld;
        const float *t = tmp + (size_t)s_row(perm, tile.p0 + tt) * ld + c;
        float v = 0.0f;
        if (c % r_max < r)
            for (int p = 0; p < n_parts; p++)
                v += t[p * part_stride];
        st[idx] = v;
    }
    __syncthreads();
    s_expand_store<TB, L, U, ACC, NT>(y, yv, bv, o, kk, st, ld, r_max, r, j, sub, out_total, tile, perm,
                                      out_total, s);
}

// NTMAX: the most positions a tile holds (1: LS_CU_LORA_ONE, else LS_CU_LORA_TILE)
template <typename TB, int L, int E2_U, bool ACC, int NTMAX>
__global__ void __launch_bounds__(E2_WARPS * 32, 3)
k_lora_expand2(float *y, const float *tmp, ls_lora_pages_t b, const ls_cu_lora_tile_t *tiles,
               const int32_t *perm, s_slice_offs_t so, int n_slices,
               int r_max, int n_parts, size_t part_stride) {
    extern __shared__ float4 st4[]; // (TT, n_slices*r_max) floats
    float *st = reinterpret_cast<float *>(st4);
    constexpr int OPW = 32 / L, OB = E2_WARPS * OPW * E2_U;
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int ld = n_slices * r_max, out_total = so.off[n_slices], r = tile.rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int sub = lane % L, og = lane / L, j = sub * 8;
    s_raw8<TB> bv[E2_U];
    int o[E2_U], kk[E2_U];
    const TB *bch = j < r ? ls_lora_entry<TB>(b, tile.slot, sub) : nullptr; // whole chunks
    s_expand_load<TB, L, E2_U>(bv, o, kk, bch, so, n_slices, blockIdx.y * OB, E2_WARPS, warp, og, out_total);
    float s = tile.scale;
    // B is in flight; now wait for shrink's tmp
    ls_dep_launch();
    ls_dep_wait();
    // block-uniform; with NTMAX 1 the branches below are dead code, never compiled
    if (NTMAX == 1 || tile.n == 1)
        s_expand2_finish<TB, L, E2_U, ACC, 1>(y, tmp, n_parts, part_stride, st, bv, o, kk, ld, r_max, r, j,
                                              sub, out_total, tile, perm, s);
    else if (tile.n == 2)
        s_expand2_finish<TB, L, E2_U, ACC, 2>(y, tmp, n_parts, part_stride, st, bv, o, kk, ld, r_max, r, j,
                                              sub, out_total, tile, perm, s);
    else
        s_expand2_finish<TB, L, E2_U, ACC, TT>(y, tmp, n_parts, part_stride, st, bv, o, kk, ld, r_max, r, j,
                                               sub, out_total, tile, perm, s);
}

// -- expand v3: one-position tiles, lean per byte -------------------------------------------
// ncu on gate_up's decode op (64 distinct adapters, caches flushed): expand v2 took 38-40 us
// for 69 MB at ~1.8 TB/s, issuing ~140 warp instructions per 16-byte load of B — the slice
// search, rank masks and tmp reads done per column, and a one-shot block's setup spread over
// 8 loads a lane — while a read-only kernel moves the same bytes at ~4.4 TB/s
// (bench_lora_cuda's read ceiling). Here a block owns one (tile, slice) and a contiguous run
// of that slice's columns and loops over it; a lane's 8 values of tmp (the parts summed
// once) stay in registers, so per 16 bytes of B a lane does the load, 8 conversions, 8 FMAs
// and log2(L) shuffle steps, and lane sub 0 the y update. Each pass's B and y loads are
// issued together at the end of the pass before (the first pass's B before the wait);
// occupancy hides the rest, as in the read kernel. Blocks go to the slices in proportion to
// their columns (s_e3_blocks_t).
enum { E3_THREADS = 256, E3_U = 8, E3_MINB = 2 };

struct s_e3_blocks_t {
    int first[4]; // first block (within a tile) of each slice, first[n_slices] = per tile
};

// Block blockIdx.x of a grid split by s_e3_blocks_t: its tile t, slice k and columns
// [c0, c1) of that slice (runs of a multiple of `align` columns, the last one shorter)
__device__ __forceinline__ void s_e3_block(const s_e3_blocks_t &sb, const s_slice_offs_t &so, int n_slices,
                                           int align, int &t, int &k, int &c0, int &c1) {
    int per_tile = sb.first[n_slices], bl;
    t = blockIdx.x / per_tile, bl = blockIdx.x - t * per_tile, k = 0;
    while (k + 1 < n_slices && bl >= sb.first[k + 1])
        k++;
    int nbk = sb.first[k + 1] - sb.first[k], part = bl - sb.first[k];
    int ncol = so.off[k + 1] - so.off[k], per = ((ncol + nbk - 1) / nbk + align - 1) / align * align;
    c0 = so.off[k] + part * per, c1 = min(so.off[k + 1], c0 + per);
}

// Blocks of an expand grid per tile: over the slices in proportion to their columns, each
// at least one full pass of `pass` columns where the slice has that many, together about
// `target` blocks over the n_tiles tiles
static s_e3_blocks_t s_e3_split(const s_slice_offs_t &so, int n_slices, int n_tiles, long target, long pass) {
    // a slice's share of the target, rounded down (rounding up overshot a whole number of
    // waves in expand v3: gate_up 640 blocks on 264 slots, 2.4 waves, 30.0 us against 27.4
    // with 512), at most one per full pass of columns, at least one
    long out_total = so.off[n_slices];
    s_e3_blocks_t sb = {{0, 0, 0, 0}};
    for (int k = 0; k < n_slices; k++) {
        long ncol = so.off[k + 1] - so.off[k];
        long nb = std::min(ncol * target / ((long)n_tiles * out_total), ncol / pass);
        sb.first[k + 1] = sb.first[k] + (ncol > 0 ? (int)std::max(1L, nb) : 0);
    }
    return sb;
}

template <typename TB, int L, bool ACC>
__global__ void __launch_bounds__(E3_THREADS, E3_MINB)
k_lora_expand3(float *y, const float *tmp, ls_lora_pages_t b, const ls_cu_lora_tile_t *tiles,
               const int32_t *perm, const __grid_constant__ s_slice_offs_t so,
               const __grid_constant__ s_e3_blocks_t sb, int n_slices, int r_max, int n_parts,
               size_t part_stride) {
    constexpr int CPP = E3_THREADS / L; // columns a pass covers per unroll step
    int t, k, c0, c1;
    s_e3_block(sb, so, n_slices, 1, t, k, c0, c1);
    ls_cu_lora_tile_t tile = tiles[t];
    int out_total = so.off[n_slices], ld = n_slices * r_max, r = tile.rank;
    int tid = threadIdx.x, sub = tid % L, j = sub * 8;
    bool live = j < r; // lanes at or past the rank load nothing and add 0
    const TB *bs = live ? ls_lora_entry<TB>(b, tile.slot, sub) : nullptr; // the lane's chunk, whole
    int lc = tid / L; // the lane's column within a pass's unroll step
    s_raw8<TB> bv[E3_U];
    float yv[E3_U];
    // a pass from column pb (block-uniform, so every lane takes the same passes: the
    // shuffles need all 32): lane columns pb + lc + u * CPP below c1
    auto load_b = [&](int pb) {
#pragma unroll
        for (int u = 0; u < E3_U; u++)
            if (live && pb + lc + u * CPP < c1)
                s_raw_load(bv[u], bs + (size_t)(pb + lc + u * CPP) * 8);
    };
    const size_t row = (size_t)s_row(perm, tile.p0);
    float *yr = y + row * out_total + lc;
    auto load_y = [&](int pb) {
#pragma unroll
        for (int u = 0; u < E3_U; u++)
            yv[u] = ACC && sub == 0 && pb + lc + u * CPP < c1 ? yr[pb + u * CPP] : 0.0f;
    };
    load_b(c0);
    ls_dep_launch();
    ls_dep_wait();
    load_y(c0);
    float s = tile.scale, tv[8] = {};
    if (live) { // each part's 8 values as two 16-byte loads, 4 parts' in flight at once
        // (2 at a time, down's 7 parts took 4 round trips after the wait)
        const float4 *tr = reinterpret_cast<const float4 *>(tmp + row * ld + k * r_max + j);
        for (int p0 = 0; p0 < n_parts; p0 += 4) {
            float4 lo[4], hi[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                size_t o = (size_t)(p0 + q) * part_stride / 4;
                lo[q] = p0 + q < n_parts ? tr[o] : make_float4(0, 0, 0, 0);
                hi[q] = p0 + q < n_parts ? tr[o + 1] : make_float4(0, 0, 0, 0);
            }
#pragma unroll
            for (int q = 0; q < 4; q++) { // in part order: the same sums as one at a time
                tv[0] += lo[q].x, tv[1] += lo[q].y, tv[2] += lo[q].z, tv[3] += lo[q].w;
                tv[4] += hi[q].x, tv[5] += hi[q].y, tv[6] += hi[q].z, tv[7] += hi[q].w;
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++)
            tv[e] = j + e < r ? tv[e] : 0.0f;
    }
    // all 8 of the lane's elements below the rank: no masks (lane-uniform, outside the
    // unrolled loop so that the compiler keeps one branch, not one per column)
    bool full = j + 8 <= r;
    for (int pb = c0; pb < c1; pb += E3_U * CPP) {
        float acc[E3_U];
        if (full)
#pragma unroll
            for (int u = 0; u < E3_U; u++) {
                acc[u] = 0.0f;
                if (pb + lc + u * CPP < c1)
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[u] += s_raw_get(bv[u], e) * tv[e];
            }
        else
#pragma unroll
            for (int u = 0; u < E3_U; u++) {
                acc[u] = 0.0f;
                if (live && pb + lc + u * CPP < c1)
#pragma unroll
                    for (int e = 0; e < 8; e++) // elements at or past the rank may hold anything
                        if (j + e < r)
                            acc[u] += s_raw_get(bv[u], e) * tv[e];
            }
        float yo[E3_U];
#pragma unroll
        for (int u = 0; u < E3_U; u++)
            yo[u] = yv[u];
        int next = pb + E3_U * CPP;
        if (next < c1) { // the next pass's loads in flight during this one's stores
            load_b(next);
            load_y(next);
        }
#pragma unroll
        for (int u = 0; u < E3_U; u++) {
#pragma unroll
            for (int off = L / 2; off > 0; off >>= 1)
                acc[u] += __shfl_xor_sync(0xffffffffu, acc[u], off);
            if (sub == 0 && pb + lc + u * CPP < c1)
                s_y_put<ACC>(yr + pb + u * CPP, yo[u], __fmul_rn(s, acc[u]));
        }
    }
}

// Launches k_lora_expand3: per tile, blocks over the slices in proportion to their columns,
// each at least one full pass (E3_U * 256/L columns) where the slice has that many, and
// together at most about two blocks per resident slot
template <typename TB, int L, bool ACC>
static cudaError_t s_expand3(float *y, const float *tmp, int n_parts, size_t part_stride,
                             ls_lora_pages_t b, const ls_cu_lora_tile_t *tiles, int n_tiles,
                             const int32_t *perm, s_slice_offs_t so,
                             int n_slices, int r_max, unsigned flags, cudaStream_t stream) {
    long target = 2L * E3_MINB * ls_cu_props()->sms;
    s_e3_blocks_t sb = s_e3_split(so, n_slices, n_tiles, target, E3_U * (E3_THREADS / L));
    s_launch_t l;
    s_launch_init(l, dim3(n_tiles * sb.first[n_slices]), E3_THREADS, 0, stream, flags);
    return cudaLaunchKernelEx(&l.cfg, k_lora_expand3<TB, L, ACC>, y, tmp, b,
                              tiles, perm, so, sb, n_slices, r_max, n_parts,
                              part_stride);
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

// Whether expand v2 runs for these pools (else v1): whole chunks, tmp's slices 8-aligned
static bool s_expand2_fits(const ls_lora_pages_t &b, int r_max) {
    int L = r_max / 8;
    return r_max % 8 == 0 && b.np == 1 && (L == 1 || L == 2 || L == 4 || L == 8);
}

// Lanes sharing an output column in expand v2 / v3: enough 8-element loads to cover the
// largest rank of the launch, not the slot width r_max. Slots are padded to r_max (the
// server's --max-lora-rank, 64 for mixed ranks) while most adapters are smaller: lanes past
// every tile's rank would only idle, and a column needs r_max/8 of them (the kernels are
// issue-bound, kernels/cuda/dev/README.md), so an r16 adapter in r64 slots took 2.2x its r16-slot time (H200).
static int s_expand_lanes(int max_rank, int r_max) {
    int L = 1;
    while (8 * L < max_rank && 8 * L < r_max)
        L *= 2;
    return L;
}

// -- expand over multi-position tiles on tensor cores (bf16 B) ---------------------------
// The FMA expand above issues a shared-memory load and an FMA per (position, column, rank
// element): over a prefill it is bound by instruction issue (a 1,638-token q launch of rank 32
// took 75 us, its y traffic alone 11 us; H200). Here mma.sync m16n8k16 does the products: a
// warp owns 16 output columns (the mma's rows: B rows, read as A fragments with 16-byte loads)
// by the tile's LS_CU_LORA_LONG positions (n tiles of 8 tokens); K is the rank in 32-wide
// halves, lane c taking elements 8c .. 8c+7 of a half for both operands (the k order of
// k_lora_shrink_tc). tmp is fp32 and goes in as three bf16 parts (s_split3), B is bf16: the
// products are exact in the fp32 accumulator, so the sums are fp32 arithmetic in another
// order, as the FMA kernels'. Elements at or past the rank are zeroed after loading (the
// pools' tails and tmp's may hold anything, NaN too). The warp's y values load before its
// sums; warps leave as soon as their columns end (no block-wide synchronization).
enum { EL_WARPS = 4, EL_NQ = LS_CU_LORA_LONG / 8 };

// the first n (0..8) of the 8 bf16 elements v holds, the rest zero
__device__ __forceinline__ uint4 s_keep8(uint4 v, int n) {
    if (n >= 8)
        return v;
    uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = 2 * i + 1 < n ? w[i] : 2 * i < n ? w[i] & 0xffffu : 0u;
    return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ float4 s_keep4(float4 v, int n) {
    return make_float4(n > 0 ? v.x : 0.0f, n > 1 ? v.y : 0.0f, n > 2 ? v.z : 0.0f,
                       n > 3 ? v.w : 0.0f);
}

__global__ void __launch_bounds__(EL_WARPS * 32, 1)
k_lora_expand_tc(float *__restrict__ y, const float *__restrict__ tmp, ls_lora_pages_t b,
                 const ls_cu_lora_tile_t *__restrict__ tiles, const int32_t *__restrict__ perm,
                 s_slice_offs_t so, int n_slices, int r_max) {
    extern __shared__ const __nv_bfloat16 *s_chunk[]; // (the tile's chunks) of its slot, whole
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    int out_total = so.off[n_slices], ld = n_slices * r_max, r = tile.rank;
    for (int i = threadIdx.x; 8 * i < r; i += blockDim.x)
        s_chunk[i] = ls_lora_entry<__nv_bfloat16>(b, tile.slot, i);
    __syncthreads(); // the only one: warps leave as soon as their columns end
    int o0 = (blockIdx.y * EL_WARPS + warp) * 16; // slices and out_total are multiples of 16
    if (o0 >= out_total)
        return;
    int k = 0;
    while (k + 1 < n_slices && o0 >= so.off[k + 1])
        k++;
    // rows this lane writes: tokens 8q + 2c and 8q + 2c + 1 (-1: past the tile); their y first
    int wr[EL_NQ][2];
    float yv[EL_NQ][4];
#pragma unroll
    for (int q = 0; q < EL_NQ; q++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int tt = 8 * q + 2 * c + e;
            wr[q][e] = tt < tile.n ? s_row(perm, tile.p0 + tt) : -1;
        }
#pragma unroll
    for (int q = 0; q < EL_NQ; q++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = wr[q][e & 1];
            yv[q][e] = row >= 0 ? y[(size_t)row * out_total + o0 + g + (e >> 1) * 8] : 0.0f;
        }
    // the tmp row this lane feeds for n tile q: token 8q + g
    const float *tr[EL_NQ];
    bool tok[EL_NQ];
#pragma unroll
    for (int q = 0; q < EL_NQ; q++) {
        int tt = 8 * q + g;
        tok[q] = tt < tile.n;
        tr[q] = tmp + (size_t)s_row(perm, tile.p0 + min(tt, tile.n - 1)) * ld + (size_t)k * r_max;
    }
    float d[EL_NQ][4] = {};
    for (int h = 0; h * 32 < r; h++) {
        int j = h * 32 + c * 8, nv = min(max(r - j, 0), 8); // this lane's elements below r
        uint4 r0 = make_uint4(0, 0, 0, 0), r8 = r0;
        if (nv > 0) { // chunk j / 8, rows o0 + g and o0 + g + 8
            const __nv_bfloat16 *b0 = s_chunk[j / 8] + (size_t)(o0 + g) * 8;
            r0 = s_keep8(__ldg(reinterpret_cast<const uint4 *>(b0)), nv);
            r8 = s_keep8(__ldg(reinterpret_cast<const uint4 *>(b0 + 64)), nv);
        }
#pragma unroll
        for (int q = 0; q < EL_NQ; q++) {
            if (8 * q >= tile.n) // warp-uniform: n tiles past the tile's tokens do nothing
                continue;
            float4 xv[2];
#pragma unroll
            for (int e = 0; e < 2; e++)
                xv[e] = nv > 0 && tok[q] ? s_keep4(__ldg(reinterpret_cast<const float4 *>(tr[q] + j) + e), nv - 4 * e)
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int e = 0; e < 2; e++) { // k step: elements 4e .. 4e+3 of the lane's 8
                uint32_t p0[3], p1[3];
                s_split3(xv[e].x, xv[e].y, p0);
                s_split3(xv[e].z, xv[e].w, p1);
#pragma unroll
                for (int p = 0; p < 3; p++)
                    s_mma_bf16(d[q], e ? r0.z : r0.x, e ? r8.z : r8.x, e ? r0.w : r0.y, e ? r8.w : r8.y,
                               p0[p], p1[p]);
            }
        }
    }
    float s = tile.scale;
#pragma unroll
    for (int q = 0; q < EL_NQ; q++)
#pragma unroll
        for (int e = 0; e < 4; e++) { // D: column g | g+8, token 2c + (e & 1) of n tile q
            int row = wr[q][e & 1];
            if (row >= 0) // scaling on the product
                y[(size_t)row * out_total + o0 + g + (e >> 1) * 8] =
                    __fadd_rn(yv[q][e], __fmul_rn(s, d[q][e]));
        }
}

// Whether k_lora_expand_tc applies: bf16 B in whole chunks, 16-byte rows of tmp, slices of
// whole warps (16 columns), sm_80+
static bool s_expand_tc_fits(const float *tmp, const ls_lora_pages_t &b, ls_cu_dtype_t b_dt,
                             const s_slice_offs_t &so, int n_slices, int r_max) {
    bool ok = b_dt == LS_CU_BF16 && ls_cu_props()->cc >= 8 && r_max % 8 == 0 && b.np == 1 &&
              (uintptr_t)tmp % 16 == 0;
    for (int k = 1; k <= n_slices; k++)
        ok = ok && so.off[k] % 16 == 0;
    return ok;
}

// k_lora_expand_tc over the tiles (y += the deltas)
static cudaError_t s_expand_tc(float *y, const float *tmp, ls_lora_pages_t b,
                               const ls_cu_lora_tile_t *tiles, int n_tiles, const int32_t *perm,
                               s_slice_offs_t so, int n_slices, int r_max,
                               cudaStream_t stream) {
    dim3 g(n_tiles, (so.off[n_slices] + 16 * EL_WARPS - 1) / (16 * EL_WARPS));
    size_t smem = (size_t)(r_max + 7) / 8 * sizeof(void *);
    k_lora_expand_tc<<<g, EL_WARPS * 32, smem, stream>>>(y, tmp, b, tiles, perm, so, n_slices, r_max);
    LS_CU_CHECK_LAUNCH();
}

// -- expand v4: the decode op's multi-position tiles on tensor cores --------------------
// Serving traffic puts several requests on a popular adapter (tiles of several positions) and
// mixes ranks 8-64 in slots of rank 64. Expand v2 sizes its lanes by the launch's largest
// rank, so beside one rank-64 adapter a rank-8 tile issued eight times its instructions
// (lanes past its rank idle): Zipf(1) over 1,000 adapters, 128 requests, gate_up's expand
// took 196 us for 193 MB of the op (bench_lora_cuda --serve, H200). Here the mma does the
// products of k_lora_expand_tc, and every tile does its own rank's work: a warp owns 16
// output columns at a time (B rows as A fragments), K is the tile's rank in 32-wide halves
// (NH = 1 for rank <= 32, else 2; lanes past the rank load nothing), N the tile's <= 8
// tokens. The tile's tmp (the sum of the shrink's K parts, in part order) goes into B
// fragments once per block, as three bf16 parts (exact products, fp32 sums). A block takes
// one (tile, slice, run of columns) as expand v3's blocks do, its warps looping over the
// run's 16-column groups, U groups at a time (U * NH = 4), each group's B and y for the
// next pass requested as soon as its own are used, so both are in flight through the other
// groups' work. The same kernel adds or writes (ACC), so the decode op beside the GEMM and
// after it stay bit for bit one step.
enum { E4_WARPS = 4, E4_MINB = 4, E4_SLOTS = 4 };

// A lane's part of a tile in expand v4's fragments (lane = 4g + c): its elements below the
// tile's rank in each 32-wide half of K (0..8) and the B chunk (h * 4 + c) that holds them
template <int NH> struct s_e4_lane_t {
    int nv[NH];
    const __nv_bfloat16 *bc[NH];
};
template <int NH>
__device__ __forceinline__ void s_e4_lane(s_e4_lane_t<NH> &ln, const ls_lora_pages_t &b,
                                          const ls_cu_lora_tile_t &tile, int c) {
#pragma unroll
    for (int h = 0; h < NH; h++) {
        ln.nv[h] = min(max(tile.rank - (h * 32 + c * 8), 0), 8);
        ln.bc[h] = ln.nv[h] > 0 ? ls_lora_entry<__nv_bfloat16>(b, tile.slot, h * 4 + c) : nullptr;
    }
}

// B rows o + g and o + g + 8 (output columns) as the lane's A fragments; zeros where !ok
template <int NH>
__device__ __forceinline__ void s_e4_load_b(uint4 (&b0)[NH], uint4 (&b8)[NH], const s_e4_lane_t<NH> &ln,
                                            int o, int g, bool ok) {
#pragma unroll
    for (int h = 0; h < NH; h++) {
        const __nv_bfloat16 *p = ln.bc[h] + (size_t)(o + g) * 8;
        bool live = ok && ln.nv[h] > 0;
        b0[h] = live ? __ldg(reinterpret_cast<const uint4 *>(p)) : make_uint4(0, 0, 0, 0);
        b8[h] = live ? __ldg(reinterpret_cast<const uint4 *>(p + 64)) : make_uint4(0, 0, 0, 0);
    }
}

// Token g's tmp row tr (the shrink's n_parts parts summed in part order; live: g is one of
// the tile's tokens) as B fragments: tf[h][e][0 | 1][part] for elements 4e .. 4e+3 of half h
template <int NH>
__device__ __forceinline__ void s_e4_tmp(uint32_t (&tf)[NH][2][2][3], const float *tr, bool live,
                                         const s_e4_lane_t<NH> &ln, int c, int n_parts, size_t part_stride) {
#pragma unroll
    for (int h = 0; h < NH; h++) {
        float v[8] = {};
        if (live && ln.nv[h] > 0) {
            const float4 *t4 = reinterpret_cast<const float4 *>(tr + h * 32 + c * 8);
            for (int p = 0; p < n_parts; p++) { // in part order
                float4 lo = t4[(size_t)p * part_stride / 4], hi = t4[(size_t)p * part_stride / 4 + 1];
                v[0] += lo.x, v[1] += lo.y, v[2] += lo.z, v[3] += lo.w;
                v[4] += hi.x, v[5] += hi.y, v[6] += hi.z, v[7] += hi.w;
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++) // tmp past the rank may hold anything
            v[e] = e < ln.nv[h] ? v[e] : 0.0f;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            s_split3(v[4 * e], v[4 * e + 1], tf[h][e][0]);
            s_split3(v[4 * e + 2], v[4 * e + 3], tf[h][e][1]);
        }
    }
}

// d (D: column g | g + 8 (e >> 1), token 2c + (e & 1)) = the 16 columns' B rows (b0, b8) times
// the tile's tmp (tf), unscaled
template <int NH>
__device__ __forceinline__ void s_e4_mma(float (&d)[4], const uint4 (&b0)[NH], const uint4 (&b8)[NH],
                                         const s_e4_lane_t<NH> &ln, const uint32_t (&tf)[NH][2][2][3]) {
#pragma unroll
    for (int e = 0; e < 4; e++)
        d[e] = 0.0f;
#pragma unroll
    for (int h = 0; h < NH; h++) {
        uint4 q0 = s_keep8(b0[h], ln.nv[h]), q8 = s_keep8(b8[h], ln.nv[h]); // pools' tails: NaN too
#pragma unroll
        for (int e = 0; e < 2; e++)
#pragma unroll
            for (int p = 0; p < 3; p++)
                s_mma_bf16(d, e ? q0.z : q0.x, e ? q8.z : q8.x, e ? q0.w : q0.y, e ? q8.w : q8.y,
                           tf[h][e][0][p], tf[h][e][1][p]);
    }
}

// The rows a lane writes (D: tokens 2c, 2c + 1 of the tile), -1 past the tile
__device__ __forceinline__ void s_e4_rows(int (&wr)[2], const int32_t *perm, const ls_cu_lora_tile_t &tile,
                                          int c) {
#pragma unroll
    for (int e = 0; e < 2; e++)
        wr[e] = 2 * c + e < tile.n ? s_row(perm, tile.p0 + 2 * c + e) : -1;
}

template <int NH, bool ACC>
__device__ __forceinline__ void s_expand4_run(float *y, const float *tmp, int n_parts, size_t part_stride,
                                              const ls_lora_pages_t &b, const ls_cu_lora_tile_t &tile,
                                              const int32_t *perm, float s, int k, int c0, int c1,
                                              int out_total, int ld, int r_max) {
    constexpr int U = E4_SLOTS / NH, PASS = U * E4_WARPS * 16; // a pass: the warps' U groups
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    s_e4_lane_t<NH> ln;
    s_e4_lane(ln, b, tile, c);
    uint4 b0[U][NH], b8[U][NH]; // columns o + g, o + g + 8 of group u
    int gb = c0 + warp * 16;
#pragma unroll
    for (int u = 0; u < U; u++) { // B first: no kernel of the step writes it
        int o = gb + u * E4_WARPS * 16;
        s_e4_load_b(b0[u], b8[u], ln, o, g, o < c1);
    }
    ls_dep_launch();
    ls_dep_wait();
    int wr[2];
    s_e4_rows(wr, perm, tile, c);
    uint32_t tf[NH][2][2][3];
    s_e4_tmp(tf, tmp + (size_t)s_row(perm, tile.p0 + min(g, tile.n - 1)) * ld + (size_t)k * r_max, g < tile.n,
             ln, c, n_parts, part_stride);
    // y of group u (D: column g | g+8 (e >> 1), token 2c + (e & 1)), for the pass at gb
    float yv[U][4];
    auto load_y = [&](int gb, int u) {
        int o = gb + u * E4_WARPS * 16;
#pragma unroll
        for (int e = 0; e < 4; e++)
            yv[u][e] = ACC && o < c1 && wr[e & 1] >= 0
                           ? y[(size_t)wr[e & 1] * out_total + o + g + (e >> 1) * 8]
                           : 0.0f;
    };
#pragma unroll
    for (int u = 0; u < U; u++)
        load_y(gb, u);
    for (; gb < c1; gb += PASS) {
        // group by group: its products and y update, then its B and y for the next pass
        // in flight through the other groups' work
#pragma unroll
        for (int u = 0; u < U; u++) {
            int o = gb + u * E4_WARPS * 16;
            float d[4];
            s_e4_mma(d, b0[u], b8[u], ln, tf);
            if (gb + PASS < c1)
                s_e4_load_b(b0[u], b8[u], ln, o + PASS, g, o + PASS < c1);
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (o < c1 && wr[e & 1] >= 0) // scaling on the product
                    s_y_put<ACC>(y + (size_t)wr[e & 1] * out_total + o + g + (e >> 1) * 8, yv[u][e],
                                 __fmul_rn(s, d[e]));
            if (gb + PASS < c1)
                load_y(gb + PASS, u);
        }
    }
}

template <bool ACC>
__global__ void __launch_bounds__(E4_WARPS * 32, E4_MINB)
k_lora_expand4(float *y, const float *tmp, ls_lora_pages_t b, const ls_cu_lora_tile_t *tiles,
               const int32_t *perm, const __grid_constant__ s_slice_offs_t so,
               const __grid_constant__ s_e3_blocks_t sb, int n_slices, int r_max, int n_parts,
               size_t part_stride) {
    int t, k, c0, c1;
    s_e3_block(sb, so, n_slices, 16, t, k, c0, c1);
    ls_cu_lora_tile_t tile = tiles[t];
    int out_total = so.off[n_slices], ld = n_slices * r_max;
    float s = tile.scale;
    if (tile.rank <= 32) // block-uniform
        s_expand4_run<1, ACC>(y, tmp, n_parts, part_stride, b, tile, perm, s, k, c0, c1, out_total, ld, r_max);
    else
        s_expand4_run<2, ACC>(y, tmp, n_parts, part_stride, b, tile, perm, s, k, c0, c1, out_total, ld, r_max);
}

// Whether expand v4 runs: the decode op's multi-position tiles (not LS_CU_LORA_ONE), where
// the tensor-core expand applies and the rank fits two halves
static bool s_expand4_fits(const float *tmp, const ls_lora_pages_t &b, ls_cu_dtype_t b_dt, const s_slice_offs_t &so,
                           int n_slices, int r_max, int max_rank, unsigned flags) {
    return !(flags & LS_CU_LORA_ONE) && max_rank <= 64 && s_expand_tc_fits(tmp, b, b_dt, so, n_slices, r_max);
}

// Launches k_lora_expand4: blocks split as expand v3's, a full pass being E4_WARPS * U
// groups of 16 columns
template <bool ACC>
static cudaError_t s_expand4(float *y, const float *tmp, int n_parts, size_t part_stride, ls_lora_pages_t b,
                             const ls_cu_lora_tile_t *tiles, int n_tiles, const int32_t *perm,
                             s_slice_offs_t so, int n_slices, int r_max, unsigned flags,
                             cudaStream_t stream) {
    long target = 2L * E4_MINB * ls_cu_props()->sms;
    s_e3_blocks_t sb = s_e3_split(so, n_slices, n_tiles, target, E4_WARPS * 16 * E4_SLOTS);
    s_launch_t l;
    s_launch_init(l, dim3(n_tiles * sb.first[n_slices]), E4_WARPS * 32, 0, stream, flags);
    return cudaLaunchKernelEx(&l.cfg, k_lora_expand4<ACC>, y, tmp, b, tiles, perm, so, sb, n_slices, r_max,
                              n_parts, part_stride);
}

// -- SiLU·mul with gate_up's LoRA (ls_cu_lora_silu_mul) --------------------------------
// Beside the GEMM, gate_up's expand writes T x 2·inter fp32 deltas that SiLU·mul reads back
// (29 MB each way at 256 tokens on Llama-3-8B). Here SiLU·mul makes them itself, a block on
// one tile and a run of the gate's columns, in passes of PASS columns: the warps' mma
// (expand v4's fragments, s_e4_*) for a gate column group and its up group (inter further)
// with the same tmp fragments, each delta as expand v4 writes it (0 + scale·d) put in shared
// memory; then the block reads the pass's gate and up values a float4 at a time (requested
// before the mma), adds the deltas and writes SiLU·mul's output. The values are those of the
// delta beside the GEMM and SiLU·mul adding it, bit for bit. Writing each lane's mma
// fragment straight out instead (four scattered values, their own addresses and checks)
// issued ~130 thread instructions an output value (ncu: 1.4 IPC at 11 warps an SM) and took
// 24.8 us in a traced step for gate_up at 128 tokens over 8 adapters (H100), against 9.4 for
// SiLU·mul reading the delta: slower than the delta beside the GEMM at 64-256 tokens
// (kernels/cuda/dev/dev_silu_lora.cu keeps it as "frag"). The rows no tile covers
// (base-model requests) take the blocks past the tiles' and SiLU·mul alone (with + 0, as
// beside the zeroed delta). 4 blocks an SM: 128 registers, 24 bytes spilled (3 blocks at 150
// registers without spills measured the same within a call's noise, H100, 8 adapters at 256
// tokens).
enum { SL_WARPS = 4, SL_MINB = 4, SL_SLOTS = 2, SL_THREADS = SL_WARPS * 32 };
// a pass's widest row of deltas (PASS at NH = 1), padded so a fragment's 32 stores hit 32 banks
enum { SL_LD = SL_SLOTS * SL_WARPS * 16 + 4 };
typedef float s_sl_buf_t[2][8][SL_LD]; // gate's and up's deltas, token by column

template <int NH, typename TL>
__device__ __forceinline__ void s_silu_lora_run(float *out, TL *lp, const float *gate_up, const float *tmp,
                                                int n_parts, size_t part_stride, const ls_lora_pages_t &b,
                                                const ls_cu_lora_tile_t &tile, const int32_t *perm, int c0,
                                                int c1, int inter, int r_max, s_sl_buf_t *sd) {
    // a pass: the warps' U groups of 16 columns; then each thread Q float4s of its 8 x PASS
    constexpr int U = SL_SLOTS / NH, PASS = U * SL_WARPS * 16, F4 = PASS / 4, Q = 8 * F4 / SL_THREADS;
    static_assert(Q >= 1 && 8 * F4 == Q * SL_THREADS && PASS + 4 <= SL_LD, "a pass's float4s per thread");
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    float s = tile.scale;
    size_t ld = 2 * (size_t)inter;
    s_e4_lane_t<NH> ln;
    s_e4_lane(ln, b, tile, c);
    uint4 gb0[U][NH], gb8[U][NH], ub0[U][NH], ub8[U][NH]; // gate's and up's columns of group u
    auto load_b = [&](int o, int u) {
        s_e4_load_b(gb0[u], gb8[u], ln, o, g, o < c1);
        s_e4_load_b(ub0[u], ub8[u], ln, inter + o, g, o < c1);
    };
#pragma unroll
    for (int u = 0; u < U; u++) // B first: no kernel of the step writes it
        load_b(c0 + warp * 16 + u * SL_WARPS * 16, u);
    ls_dep_launch();
    ls_dep_wait();
    uint32_t tg[NH][2][2][3], tu[NH][2][2][3]; // token g's tmp: the gate's slice, the up's
    const float *tr = tmp + (size_t)s_row(perm, tile.p0 + min(g, tile.n - 1)) * 2 * r_max;
    s_e4_tmp(tg, tr, g < tile.n, ln, c, n_parts, part_stride);
    s_e4_tmp(tu, tr + r_max, g < tile.n, ln, c, n_parts, part_stride);
    int row[Q]; // the row of each of the thread's float4s (token f / F4 of the tile), -1 past it
#pragma unroll
    for (int q = 0; q < Q; q++) {
        int j = (threadIdx.x + q * SL_THREADS) / F4;
        row[q] = j < tile.n ? s_row(perm, tile.p0 + j) : -1;
    }
    int cl = (threadIdx.x % F4) * 4; // the same column for each q (SL_THREADS % F4 == 0)
    for (int p0 = c0, buf = 0; p0 < c1; p0 += PASS, buf ^= 1) { // block-uniform
        float4 gq[Q], uq[Q];
        bool live = p0 + cl < c1; // c1 - p0 is a multiple of 16
#pragma unroll
        for (int q = 0; q < Q; q++)
            if (live && row[q] >= 0) {
                const float *p = gate_up + (size_t)row[q] * ld + p0 + cl;
                gq[q] = *(const float4 *)p, uq[q] = *(const float4 *)(p + inter);
            }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int lo = warp * 16 + u * SL_WARPS * 16;
            float dg[4], du[4];
            s_e4_mma(dg, gb0[u], gb8[u], ln, tg);
            s_e4_mma(du, ub0[u], ub8[u], ln, tu);
            if (p0 + PASS < c1)
                load_b(p0 + PASS + lo, u);
#pragma unroll
            for (int e = 0; e < 4; e++) { // as the delta is written: 0 + scale·d
                int t = 2 * c + (e & 1), col = lo + g + (e >> 1) * 8;
                sd[buf][0][t][col] = __fadd_rn(0.0f, __fmul_rn(s, dg[e]));
                sd[buf][1][t][col] = __fadd_rn(0.0f, __fmul_rn(s, du[e]));
            }
        }
        __syncthreads(); // the pass's deltas; the other buffer's readers are a pass behind
#pragma unroll
        for (int q = 0; q < Q; q++)
            if (live && row[q] >= 0) {
                int j = (threadIdx.x + q * SL_THREADS) / F4;
                float4 dg = *(const float4 *)&sd[buf][0][j][cl], du = *(const float4 *)&sd[buf][1][j][cl];
                ls_silu_mul_put4(out, lp, (size_t)row[q] * inter + p0 + cl, ls_add4(gq[q], dg), ls_add4(uq[q], du));
            }
    }
}

template <typename TL>
__global__ void __launch_bounds__(SL_THREADS, SL_MINB)
k_lora_silu_mul(float *out, TL *lp, const float *gate_up, const float *tmp, ls_lora_pages_t b,
                const ls_cu_lora_tile_t *tiles, int n_tiles, const int32_t *perm,
                const int32_t *zero_rows, int n_zero_rows, const __grid_constant__ s_slice_offs_t so,
                const __grid_constant__ s_e3_blocks_t sb, int inter, int r_max, int n_parts, size_t part_stride) {
    __shared__ __align__(16) s_sl_buf_t sd[2];
    int tile_blocks = n_tiles * sb.first[1];
    if ((int)blockIdx.x >= tile_blocks) {
        // the rows without an adapter, float4 by float4 (inter % 16 == 0)
        ls_dep_launch();
        ls_dep_wait();
        size_t q = (size_t)inter / 4, n = (size_t)n_zero_rows * q;
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (size_t j = (blockIdx.x - tile_blocks) * (size_t)blockDim.x + threadIdx.x; j < n;
             j += (size_t)(gridDim.x - tile_blocks) * blockDim.x) {
            size_t r = (size_t)zero_rows[j / q], col = (j % q) * 4;
            const float *p = gate_up + r * 2 * inter + col;
            ls_silu_mul_put4(out, lp, r * inter + col, ls_add4(*(const float4 *)p, zero),
                      ls_add4(*(const float4 *)(p + inter), zero));
        }
        return;
    }
    int t, k, c0, c1;
    s_e3_block(sb, so, 1, 16, t, k, c0, c1);
    ls_cu_lora_tile_t tile = tiles[t];
    if (tile.rank <= 32) // block-uniform
        s_silu_lora_run<1>(out, lp, gate_up, tmp, n_parts, part_stride, b, tile, perm, c0, c1, inter, r_max, sd);
    else
        s_silu_lora_run<2>(out, lp, gate_up, tmp, n_parts, part_stride, b, tile, perm, c0, c1, inter, r_max, sd);
}

bool ls_cu_lora_silu_mul_fits(const void *x, ls_cu_dtype_t x_dt, ls_lora_pages_t a, ls_cu_dtype_t a_dt,
                              ls_lora_pages_t b, ls_cu_dtype_t b_dt, const float *tmp, int max_rank, int in,
                              int inter, int r_max, unsigned flags) {
    // what ls_cu_lora_apply runs as the tensor-core shrink into parts and expand v4
    int offs[3] = {0, inter, 2 * inter};
    s_slice_offs_t so = s_slice_offs(offs, 2);
    return !(flags & LS_CU_LORA_ONE) && inter % 16 == 0 && s_shrink_tc_fits(x, x_dt, a, a_dt, in, max_rank) &&
           s_expand2_fits(b, r_max) && s_expand4_fits(tmp, b, b_dt, so, 2, r_max, max_rank, flags);
}

cudaError_t ls_cu_lora_silu_shrink(float *tmp, size_t part_stride, const void *x, ls_cu_dtype_t x_dt,
                                   ls_lora_pages_t a, const ls_cu_lora_tile_t *tiles, int n_tiles,
                                   int max_rank, const int32_t *perm, int in, int r_max, unsigned flags,
                                   cudaStream_t stream) {
    assert(part_stride > 0 && max_rank <= r_max && in > 0);
    if (n_tiles == 0 || max_rank == 0)
        return cudaSuccess;
    return s_shrink_tc(tmp, part_stride, NULL, x, x_dt, a, tiles, n_tiles, max_rank, perm, in, 2, r_max, flags,
                       stream);
}

cudaError_t ls_cu_lora_silu_mul(float *out, void *lp, ls_cu_dtype_t lp_dt, const float *gate_up,
                                const float *tmp, size_t part_stride, ls_lora_pages_t b,
                                const ls_cu_lora_tile_t *tiles, int n_tiles, int max_rank,
                                const int32_t *perm, const int32_t *zero_rows, int n_zero_rows, int T,
                                int in, int inter, int r_max, cudaStream_t stream) {
    assert(inter % 16 == 0 && part_stride > 0);
    if (!out && !lp)
        return cudaErrorInvalidValue;
    if (T == 0 || inter == 0)
        return cudaSuccess;
    bool lora = n_tiles > 0 && max_rank > 0;
    int n_parts = lora ? s_shrink_tc_parts(n_tiles, max_rank, in, 2) : 1;
    int offs[2] = {0, inter};
    s_slice_offs_t so = s_slice_offs(offs, 1);
    // a wave of blocks over the tiles: a block makes its tile's fragments once and loops
    long target = (long)SL_MINB * ls_cu_props()->sms;
    s_e3_blocks_t sb = lora ? s_e3_split(so, 1, n_tiles, target, SL_WARPS * 16 * SL_SLOTS)
                            : s_e3_blocks_t{{0, 0, 0, 0}};
    long tile_blocks = lora ? (long)n_tiles * sb.first[1] : 0;
    long zero_blocks = n_zero_rows > 0 ? ls_cu_blocks((size_t)n_zero_rows * inter / 4, SL_THREADS) : 0;
    if (tile_blocks + zero_blocks == 0)
        return cudaSuccess;
    s_launch_t l;
    s_launch_init(l, dim3((unsigned)(tile_blocks + zero_blocks)), SL_WARPS * 32, 0, stream, 0);
    int nt = lora ? n_tiles : 0;
    cudaError_t e = cudaErrorInvalidValue;
    if (!lp)
        e = cudaLaunchKernelEx(&l.cfg, k_lora_silu_mul<float>, out, (float *)NULL, gate_up, tmp, b, tiles, nt,
                               perm, zero_rows, n_zero_rows, so, sb, inter, r_max, n_parts, part_stride);
    else
        LS_CU_DISPATCH(lp_dt, TL,
                       e = cudaLaunchKernelEx(&l.cfg, k_lora_silu_mul<TL>, out, (TL *)lp, gate_up, tmp, b, tiles,
                                              nt, perm, zero_rows, n_zero_rows, so, sb, inter, r_max, n_parts,
                                              part_stride));
    return e;
}

// ls_cu_lora_expand over tmp as the sum of n_parts arrays part_stride apart (> 1 part:
// s_expand2_fits must hold)
static cudaError_t s_expand(float *y, const float *tmp, int n_parts, size_t part_stride,
                            ls_lora_pages_t b, ls_cu_dtype_t b_dt,
                            const ls_cu_lora_tile_t *tiles, int n_tiles, int max_rank, const int32_t *perm,
                            const int32_t *slice_offsets, int n_slices,
                            int r_max, unsigned flags, cudaStream_t stream) {
    int accumulate = (flags & LS_CU_LORA_ACC) != 0;
    assert(n_slices >= 1 && n_slices <= 3 && r_max > 0 && b.np >= 1);
    s_slice_offs_t so = s_slice_offs(slice_offsets, n_slices);
    int out_total = so.off[n_slices];
    if (n_tiles == 0 || out_total == 0)
        return cudaSuccess;
    size_t smem = (size_t)TT * n_slices * r_max * sizeof(float);
    int L = s_expand_lanes(max_rank, r_max);
    assert(max_rank <= r_max && (n_parts == 1 || s_expand2_fits(b, r_max)));
    if (s_expand4_fits(tmp, b, b_dt, so, n_slices, r_max, max_rank, flags))
        return accumulate ? s_expand4<true>(y, tmp, n_parts, part_stride, b, tiles, n_tiles, perm, so, n_slices,
                                            r_max, flags, stream)
                          : s_expand4<false>(y, tmp, n_parts, part_stride, b, tiles, n_tiles, perm,
                                             so, n_slices, r_max, flags, stream);
    if (s_expand2_fits(b, r_max)) {
        bool one = (flags & LS_CU_LORA_ONE) != 0;
        if (s_v3(flags)) {
#define S_E3(LL)                                                                              \
    return accumulate ? s_expand3<TB, LL, true>(y, tmp, n_parts, part_stride, b, tiles,       \
                                                 n_tiles, perm, so, n_slices, r_max, \
                                                 flags, stream)                                \
                      : s_expand3<TB, LL, false>(y, tmp, n_parts, part_stride, b, tiles,      \
                                                  n_tiles, perm, so, n_slices,       \
                                                  r_max, flags, stream)
            LS_CU_DISPATCH(b_dt, TB,
                if (L == 1) S_E3(1); else if (L == 2) S_E3(2); else if (L == 4) S_E3(4);
                else S_E3(8));
#undef S_E3
        }
        // one-position tiles: 8 columns per lane group in flight (the registers that
        // longer tiles' sums need go to B), E2_UT elsewhere
        int u = one ? 8 : E2_UT, ob = E2_WARPS * (32 / L) * u;
        dim3 g2(n_tiles, (out_total + ob - 1) / ob);
        s_launch_t l;
        s_launch_init(l, g2, E2_WARPS * 32, smem, stream, flags);
#define S_E2U(LL, UU, NTM)                                                                    \
    return accumulate                                                                         \
               ? cudaLaunchKernelEx(&l.cfg, k_lora_expand2<TB, LL, UU, true, NTM>, y, tmp, b,   \
                                    tiles, perm, so, n_slices, r_max, n_parts, part_stride)  \
               : cudaLaunchKernelEx(&l.cfg, k_lora_expand2<TB, LL, UU, false, NTM>, y, tmp, b,  \
                                    tiles, perm, so, n_slices, r_max, n_parts, part_stride)
#define S_E2(LL)                                                                              \
    do {                                                                                      \
        if (one)                                                                              \
            S_E2U(LL, 8, 1);                                                                  \
        S_E2U(LL, E2_UT, TT);                                                                 \
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
        k_lora_expand<TB><<<grid, EX_THREADS, smem, stream>>>(y, tmp, b, tiles, perm, so, n_slices, r_max));
    LS_CU_CHECK_LAUNCH();
}

cudaError_t ls_cu_lora_expand_long(float *y, const float *tmp, ls_lora_pages_t b,
                                   ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles,
                                   int n_tiles, const int32_t *perm,
                                   const int32_t *slice_offsets, int n_slices, int r_max,
                                   cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && r_max > 0 && b.np >= 1);
    s_slice_offs_t so = s_slice_offs(slice_offsets, n_slices);
    int out_total = so.off[n_slices];
    if (n_tiles == 0 || out_total == 0)
        return cudaSuccess;
    if (s_expand_tc_fits(tmp, b, b_dt, so, n_slices, r_max))
        return s_expand_tc(y, tmp, b, tiles, n_tiles, perm, so, n_slices, r_max, stream);
    constexpr int NT = LS_CU_LORA_LONG;
    size_t smem = (size_t)NT * n_slices * r_max * sizeof(float);
    dim3 grid(n_tiles, (out_total + EX_THREADS - 1) / EX_THREADS);
    LS_CU_DISPATCH(b_dt, TB,
        k_lora_expand<TB, NT><<<grid, EX_THREADS, smem, stream>>>(y, tmp, b, tiles, perm, so, n_slices, r_max));
    LS_CU_CHECK_LAUNCH();
}

cudaError_t ls_cu_lora_expand(float *y, const float *tmp, ls_lora_pages_t b,
                              ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles,
                              int n_tiles, int max_rank, const int32_t *perm,
                              const int32_t *slice_offsets, int n_slices, int r_max,
                              unsigned flags, cudaStream_t stream) {
    // multi-position tiles added into y on tensor cores: v2 sizes its lanes by the launch's
    // largest rank, so beside rank 64 a rank-8 tile ran on an eighth of them (steps with
    // prompt tokens, Zipf over 1,000 adapters of mixed ranks: expands 18.2 -> 15.8 ms a step,
    // H200). The decode op (ls_cu_lora_apply) does not take it: summing the op's K parts it
    // measured slower there (100 against 61 us)
    s_slice_offs_t so = s_slice_offs(slice_offsets, n_slices);
    if (n_tiles > 0 && so.off[n_slices] > 0 && !(flags & LS_CU_LORA_ONE) && (flags & LS_CU_LORA_ACC) &&
        s_expand_tc_fits(tmp, b, b_dt, so, n_slices, r_max))
        return s_expand_tc(y, tmp, b, tiles, n_tiles, perm, so, n_slices, r_max, stream);
    return s_expand(y, tmp, 1, 0, b, b_dt, tiles, n_tiles, max_rank, perm, slice_offsets,
                    n_slices, r_max, flags, stream);
}

// -- shrink v3: one-position tiles, lean per byte -------------------------------------------
// ncu on gate_up's decode op (caches flushed): the tensor-core shrink moved its 18 MB at
// 1.5-1.7 TB/s, ~95 warp instructions per 16-byte load of A (its mma tiles are 8 tokens wide
// for one). Here a block of NT threads takes one (tile, slice, group of S3_RG rank rows, K
// part of NT * 8 elements); a thread owns 8 consecutive elements of K: its x in registers,
// its rows' 16-byte loads of A all in flight at once (issued before the wait), 8 FMAs each.
// The rows' sums meet in the warp by a halving butterfly (S3_RG + 1 shuffles for S3_RG
// rows, not 5 each) and across warps in shared memory in warp order (deterministic), and go
// to part p of tmp for the expand to sum. Rows at or past the rank are neither read nor
// written. Swept on an H200 (whole step): 4 rows a thread 11% slower, 16 no faster than the
// tensor-core shrink (128 registers); parts of 1024 0.5% slower. kp (= NT * 8) stays a
// kernel parameter: compiled in as a constant, the kernel came out slower (whole step 2625
// against 2153 us, H200, the same run's other rows unchanged).
// Where K fits in LS_CU_LORA_PARTS parts of S3_SMALL * 8 (in <= 8192: every input but the
// down projection's on Llama-3-8B) a block is S3_SMALL threads: beside the tensor-core GEMV
// (three blocks an SM at 141 registers leave 10,240) a block of 128 at 64 registers fits on
// every SM, one of 256 only where the GEMV holds fewer than three. Step with 4 adapters at
// batch 4, against blocks of 256 in one call (H100, bench_base_cuda --decode-ctx, two
// rounds): x 1K 6.195 / 6.211 -> 6.052 / 6.120 ms, x 128 5.999 / 5.884 -> 5.795 / 5.855; the
// base steps within their spread (kernels/cuda/dev/README.md, "LoRA shrink").
enum { S3_RG = 8, S3_THREADS = 256, S3_KP = S3_THREADS * 8, S3_SMALL = 128 };

template <typename TA, typename TX, int NT> // 64 registers at either NT
__global__ void __launch_bounds__(NT, 1024 / NT)
k_lora_shrink3(float *tmp, size_t part_stride, const TX *x, ls_lora_pages_t a,
               const ls_cu_lora_tile_t *tiles, const int32_t *perm, int in, int n_slices,
               int r_max, int kp) {
    __shared__ float red[NT / 32][S3_RG];
    __shared__ const TA *rows[S3_RG]; // the block's rows (whole: one piece)
    ls_cu_lora_tile_t tile = tiles[blockIdx.x];
    int k = blockIdx.y % n_slices, j0 = blockIdx.y / n_slices * S3_RG, p = blockIdx.z;
    int r = tile.rank;
    if (j0 >= r) // block-uniform
        return;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, e0 = p * kp + tid * 8;
    bool live = e0 < in;
    // the rows' table entries, once a block: in shared memory, not in every thread's registers
    // (eight pointers there took the kernel past its 64 registers, into local memory)
    if (tid < S3_RG && j0 + tid < r)
        rows[tid] = ls_lora_entry<TA>(a, tile.slot, (size_t)k * r_max + j0 + tid);
    __syncthreads();
    s_raw8<TA> av[S3_RG];
#pragma unroll
    for (int q = 0; q < S3_RG; q++)
        if (live && j0 + q < r)
            s_raw_load(av[q], rows[q] + e0);
    ls_dep_launch();
    ls_dep_wait();
    size_t row = (size_t)s_row(perm, tile.p0);
    float xv[8] = {};
    if (live)
        ls_load8(x + row * in + e0, xv);
    float acc[S3_RG];
#pragma unroll
    for (int q = 0; q < S3_RG; q++) {
        acc[q] = 0.0f;
        if (live && j0 + q < r)
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[q] += s_raw_get(av[q], e) * xv[e];
    }
    // halving butterfly: at offset h a lane keeps the half of its n values that its bit h
    // selects and adds its partner's copy of that half; then plain sums over the lanes
    // below h: the GL lanes of group R then hold row R's warp sum
    constexpr int LOG_RG = S3_RG == 16 ? 4 : S3_RG == 8 ? 3 : S3_RG == 4 ? 2 : 1;
    constexpr int GL = 32 >> LOG_RG; // lanes per row after the butterfly
#pragma unroll
    for (int n = S3_RG, h = 16; n > 1; n >>= 1, h >>= 1) {
        bool up = (lane & h) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            float send = up ? acc[i] : acc[i + n / 2], keep = up ? acc[i + n / 2] : acc[i];
            acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, h);
        }
    }
#pragma unroll
    for (int h = GL / 2; h > 0; h >>= 1)
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], h);
    if ((lane & (GL - 1)) == 0)
        red[warp][lane / GL] = acc[0];
    __syncthreads();
    if (tid < S3_RG && j0 + tid < r) {
        float s = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++)
            s += red[w][tid];
        tmp[p * part_stride + row * n_slices * r_max + (size_t)k * r_max + j0 + tid] = s;
    }
}

// Whether shrink v3 runs: the v3 kernels' case, 16-bit A, 16-byte rows, K in at most
// LS_CU_LORA_PARTS parts
static bool s_shrink3_fits(const void *x, ls_cu_dtype_t x_dt, const ls_lora_pages_t &a,
                           ls_cu_dtype_t a_dt, int in, size_t part_stride, unsigned flags) {
    return s_v3(flags) && part_stride && (a_dt == LS_CU_BF16 || a_dt == LS_CU_F16) &&
           (x_dt == LS_CU_F32 || x_dt == a_dt) && a.np == 1 && in % 8 == 0 &&
           in <= S3_KP * LS_CU_LORA_PARTS && (uintptr_t)x % 16 == 0;
}

// Launches k_lora_shrink3; *parts = the K parts left in tmp
static cudaError_t s_shrink3(float *tmp, size_t part_stride, int *parts, const void *x,
                             ls_cu_dtype_t x_dt, ls_lora_pages_t a, ls_cu_dtype_t a_dt,
                             const ls_cu_lora_tile_t *tiles, int n_tiles, int max_rank,
                             const int32_t *perm, int in, int n_slices, int r_max,
                             unsigned flags, cudaStream_t stream) {
    bool small = in <= S3_SMALL * 8 * LS_CU_LORA_PARTS;
    int nt = small ? (int)S3_SMALL : (int)S3_THREADS, kp = nt * 8;
    *parts = (in + kp - 1) / kp;
    s_launch_t l;
    s_launch_init(l, dim3(n_tiles, n_slices * ((max_rank + S3_RG - 1) / S3_RG), *parts),
                  nt, 0, stream, flags);
#define S_S3(TA_, NT_)                                                                        \
    S_WITH_TX(x_dt, TA_, TX,                                                                  \
              return cudaLaunchKernelEx(&l.cfg, k_lora_shrink3<TA_, TX, NT_>, tmp,            \
                                        part_stride, (const TX *)x, a, tiles, perm, in,       \
                                        n_slices, r_max, kp))
    if (a_dt == LS_CU_BF16) {
        if (small)
            S_S3(__nv_bfloat16, S3_SMALL);
        S_S3(__nv_bfloat16, S3_THREADS);
    }
    if (small)
        S_S3(__half, S3_SMALL);
    S_S3(__half, S3_THREADS);
#undef S_S3
}

// The most local memory per thread (bytes) of the kernels ls_cu_lora_apply runs on 16-bit
// pools by default: the tensor-core shrink, shrink v3, expand v2 (4 columns per lane group)
// and expand v3 for every lane split and both accumulate modes; -1 if the attributes
// cannot be read
template <int N> static void s_local_take(const void *const (&fs)[N], size_t &most, bool &ok) {
    for (const void *f : fs) {
        cudaFuncAttributes a;
        ok = ok && cudaFuncGetAttributes(&a, f) == cudaSuccess;
        most = ok ? std::max(most, a.localSizeBytes) : most;
    }
}
template <typename TB, int L> static void s_local_expand(size_t &most, bool &ok) {
    const void *const fs[] = {(const void *)k_lora_expand3<TB, L, true>, (const void *)k_lora_expand3<TB, L, false>,
                              (const void *)k_lora_expand2<TB, L, E2_UT, true, TT>,
                              (const void *)k_lora_expand2<TB, L, E2_UT, false, TT>};
    s_local_take(fs, most, ok);
}
template <typename TB> static void s_local_expands(size_t &most, bool &ok) {
    s_local_expand<TB, 1>(most, ok);
    s_local_expand<TB, 2>(most, ok);
    s_local_expand<TB, 4>(most, ok);
    s_local_expand<TB, 8>(most, ok);
}
template <int NT> static void s_local_shrink3(size_t &most, bool &ok) {
    const void *const fs[] = {(const void *)k_lora_shrink3<__nv_bfloat16, float, NT>,
                              (const void *)k_lora_shrink3<__half, float, NT>,
                              (const void *)k_lora_shrink3<__nv_bfloat16, __nv_bfloat16, NT>,
                              (const void *)k_lora_shrink3<__half, __half, NT>};
    s_local_take(fs, most, ok);
}
extern "C" long ls_cu_lora_local_bytes(void) {
    size_t most = 0;
    bool ok = true;
    s_local_shrink3<S3_THREADS>(most, ok);
    s_local_shrink3<S3_SMALL>(most, ok);
    const void *const fs[] = {(const void *)k_lora_shrink_tc<1, float>, (const void *)k_lora_shrink_tc<2, float>,
                              (const void *)k_lora_shrink_tc<3, float>, (const void *)k_lora_shrink_tc<4, float>,
                              (const void *)k_lora_shrink_tc<1, __nv_bfloat16>,
                              (const void *)k_lora_shrink_tc<2, __nv_bfloat16>,
                              (const void *)k_lora_shrink_tc<3, __nv_bfloat16>,
                              (const void *)k_lora_shrink_tc<4, __nv_bfloat16>,
                              (const void *)k_lora_expand_tc, (const void *)k_lora_expand4<true>,
                              (const void *)k_lora_expand4<false>};
    s_local_take(fs, most, ok);
    s_local_expands<__nv_bfloat16>(most, ok);
    s_local_expands<__half>(most, ok);
    return ok ? (long)most : -1;
}

// The decode op: shrink then expand. Where the K-split shrink applies (shrink v3 for
// one-position tiles, else the tensor-core shrink) its parts go to tmp, part_stride apart, and
// the expand sums them as it stages tmp; elsewhere a plain shrink and expand. A one-kernel
// version (shrink and expand of a tile in one thread-block cluster, tmp on chip) measured 2.2x
// slower on the whole decode step: kernels/cuda/dev/README.md.
cudaError_t ls_cu_lora_apply(float *y, float *tmp, size_t part_stride, const void *x,
                             ls_cu_dtype_t x_dt, ls_lora_pages_t a, ls_cu_dtype_t a_dt,
                             ls_lora_pages_t b,
                             ls_cu_dtype_t b_dt, const ls_cu_lora_tile_t *tiles, int n_tiles,
                             int max_rank, const int32_t *perm,
                             const int32_t *slice_offsets, int in, int n_slices, int r_max,
                             unsigned flags, cudaStream_t stream) {
    assert(n_slices >= 1 && n_slices <= 3 && max_rank <= r_max && in > 0);
    bool s3 = s_shrink3_fits(x, x_dt, a, a_dt, in, part_stride, flags);
    if (part_stride && (s3 || s_shrink_tc_fits(x, x_dt, a, a_dt, in, max_rank)) &&
        s_expand2_fits(b, r_max)) {
        if (n_tiles == 0 || max_rank == 0)
            return cudaSuccess;
        int parts = 1;
        cudaError_t e = s3 ? s_shrink3(tmp, part_stride, &parts, x, x_dt, a, a_dt, tiles,
                                       n_tiles, max_rank, perm, in, n_slices, r_max, flags,
                                       stream)
                           : s_shrink_tc(tmp, part_stride, &parts, x, x_dt, a, tiles, n_tiles,
                                         max_rank, perm, in, n_slices, r_max, flags, stream);
        return e != cudaSuccess ? e
                                : s_expand(y, tmp, parts, part_stride, b, b_dt, tiles,
                                           n_tiles, max_rank, perm, slice_offsets, n_slices,
                                           r_max, flags, stream);
    }
    cudaError_t e = ls_cu_lora_shrink(tmp, x, x_dt, a, a_dt, tiles, n_tiles, max_rank, perm,
                                      in, n_slices, r_max, flags, stream);
    // s_expand, not ls_cu_lora_expand: the decode op runs the same expand whether it
    // adds or writes (see ls_cu_lora_expand)
    return e != cudaSuccess ? e
                            : s_expand(y, tmp, 1, 0, b, b_dt, tiles, n_tiles, max_rank, perm,
                                       slice_offsets, n_slices, r_max, flags, stream);
}
