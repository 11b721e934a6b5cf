/*  kernels/cuda/dev/dev_fused.cu — the decode LoRA op as one kernel against production's two:
    y += scaling · (x · Aᵀ) · Bᵀ per tile, validated against the CPU reference (ls_lora_fused),
    then timed (dev_common.cuh's method) on Llama-3-8B's four groups at decode (dev_lora.cuh's
    problems).

    Versions:
      apply  ls_cu_lora_apply, production: the K-split shrink (v3 or tensor cores) leaving
             parts, then the expand summing them (v3 or v4);
      fused  k_lora_fused below: shrink and expand of a tile in one thread-block cluster, the
             intermediate in shared memory, never in HBM (sm_90). Correct, and measured 2.2x
             slower than production's pair on the whole decode step (README.md): the cluster
             waits to be co-scheduled and each block re-reads x for its rows.

    Usage: dev_fused [GROUP]   (qkv, o, gate_up, down; all by default). Exit 1 if a version
    fails its check.
*/
#include "../lora.cu"

#include "dev_lora.cuh"

#include <cstring>

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
// (A) nor used (B); rank-0 slots have no tile. Adapters through the page table, as
// production's.
// FU_LD: the largest n_slices*r_max, 3 slices of r_max <= 64 (r_max/8 lanes, at most 8)
enum { FU_WARPS = 8, FU_U = 4, FU_LD = 3 * 64 };

template <typename T, int L>
__global__ void __launch_bounds__(FU_WARPS * 32)
k_lora_fused(float *y, const float *x, ls_lora_pages_t a, ls_lora_pages_t b,
             const ls_cu_lora_tile_t *tiles, const int32_t *perm, s_slice_offs_t so, int in, int n_slices, int r_max) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __shared__ float part[TT * FU_LD]; // this block's partial tmp, (TT, ld)
    __shared__ __align__(16) float st[TT * FU_LD]; // the tile's full tmp, (TT, ld)
    cg::cluster_group cl = cg::this_cluster();
    int cn = (int)cl.num_blocks(), cr = (int)cl.block_rank();
    ls_cu_lora_tile_t tile = tiles[blockIdx.x / cn];
    int ld = n_slices * r_max, out_total = so.off[n_slices], r = tile.rank;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int ppk = (r + 1) / 2, n_pairs = n_slices * ppk; // row pairs per slice, in all
    int n_chunks = (in + 255) >> 8;
    int per = (out_total + cn - 1) / cn;
    int o_lo = min(cr * per, out_total), o_hi = min(o_lo + per, out_total);

    // before the previous kernel is done: pull this block's A rows and B rows towards L2
    for (int pr = warp; pr < n_pairs; pr += FU_WARPS) {
        int k = pr / ppk, j = pr % ppk * 2;
        for (int q = 0; q < min(2, r - j); q++) {
            const T *ar = ls_lora_entry<T>(a, tile.slot, (size_t)k * r_max + j + q);
            for (int c = cr; c < n_chunks; c += cn) {
                int i = (c << 8) + lane * 8;
                if (i < in)
                    s_prefetch_l2(ar + i);
            }
        }
    }
    // rows o_lo..o_hi of each chunk below the rank are contiguous
    size_t nb = (size_t)(o_hi - o_lo) * 8 * sizeof(T);
    for (int c = 0; 8 * c < r; c++) {
        const char *b0 = (const char *)(ls_lora_entry<T>(b, tile.slot, c) + (size_t)o_lo * 8);
        for (size_t off = (size_t)threadIdx.x * 128; off < nb; off += FU_WARPS * 32 * 128)
            s_prefetch_l2(b0 + off);
    }
    ls_dep_launch();
    ls_dep_wait();

    const float *xr[TT];
    s_tile_xrows(xr, x, perm, tile, in);
    for (int pr = warp; pr < n_pairs; pr += FU_WARPS) { // warp-uniform
        int k = pr / ppk, j = pr % ppk * 2, nq = min(2, r - j);
        const T *ar[S2_R];
#pragma unroll
        for (int q = 0; q < S2_R; q++)
            ar[q] = q < nq ? ls_lora_entry<T>(a, tile.slot, (size_t)k * r_max + j + q) : nullptr;
        float acc[S2_R][TT];
        s_shrink2_tile<T, S2_U>(acc, ar, in, nq, tile, xr, cr, cn, lane);
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
    const T *bch = j < r ? ls_lora_entry<T>(b, tile.slot, sub) : nullptr;
    float s = tile.scale;
    for (int ob = o_lo; ob < o_hi; ob += OB) {
        s_raw8<T> bv[FU_U];
        int o[FU_U], kk[FU_U];
        s_expand_load<T, L, FU_U>(bv, o, kk, bch, so, n_slices, ob, FU_WARPS, warp, og, o_hi);
        float yv[FU_U][TT];
        s_expand_yload<FU_U>(yv, y, o, sub, o_hi, tile, perm, out_total);
        s_expand_store<T, L, FU_U>(y, yv, bv, o, kk, st, ld, r_max, r, j, sub, o_hi, tile, perm, out_total, s);
    }
#endif
}

// Launches k_lora_fused<T, L> in clusters of cn blocks per tile (with PDL on, as the v2
// kernels). 16-block clusters are non-portable: allowed once per instantiation, and used
// only if the occupancy query says at least one such cluster fits; else 8.
template <typename T, int L>
static cudaError_t s_fused_launch(int cn, int n_tiles, float *y, const float *x,
                                  ls_lora_pages_t a, ls_lora_pages_t b,
                                  const ls_cu_lora_tile_t *tiles, const int32_t *perm,
                                  s_slice_offs_t so, int in,
                                  int n_slices, int r_max, unsigned flags, cudaStream_t stream) {
    static int ok16 = -1;
    s_launch_t l;
    if (ok16 < 0) {
        int n = 0;
        s_launch_init(l, dim3(16), FU_WARPS * 32, 0, stream, flags, 16);
        ok16 = cudaFuncSetAttribute(k_lora_fused<T, L>,
                                    cudaFuncAttributeNonPortableClusterSizeAllowed,
                                    1) == cudaSuccess &&
               cudaOccupancyMaxActiveClusters(&n, k_lora_fused<T, L>, &l.cfg) == cudaSuccess &&
               n > 0;
        cudaGetLastError(); // a refusal above only means 8-block clusters
    }
    if (cn > 8 && !ok16)
        cn = 8;
    s_launch_init(l, dim3(n_tiles * cn), FU_WARPS * 32, 0, stream, flags, cn);
    return cudaLaunchKernelEx(&l.cfg, k_lora_fused<T, L>, y, x, a, b, tiles, perm, so, in, n_slices, r_max);
}


// The one-kernel op over p's tiles of set i (y += the delta): 8-block clusters give >= 2
// blocks per SM from ~33 tiles on (132 SMs); below, 16
static cudaError_t s_fused(const dev_lora_t &p, long i, cudaStream_t st) {
    s_slice_offs_t so = s_slice_offs(p.offs, p.g.n_slices);
    int cn = (long)p.n_tiles * 8 < 2L * ls_cu_props()->sms ? 16 : 8;
#define S_FU(LL)                                                                                   \
    return s_fused_launch<__nv_bfloat16, LL>(cn, p.n_tiles, p.y, p.x, p.pa, p.pb, p.tiles[i % DEV_SETS], NULL,\
                                             so, p.g.in, p.g.n_slices, p.r_max, p.flags, st)
    switch (p.r_max / 8) {
    case 1: S_FU(1);
    case 2: S_FU(2);
    case 4: S_FU(4);
    default: S_FU(8);
    }
#undef S_FU
}

static cudaError_t s_run(const dev_lora_t &p, int v, long i, cudaStream_t st) {
    if (v == 1)
        return s_fused(p, i, st);
    return ls_cu_lora_apply(p.y, p.tmp, p.part_stride, p.x, LS_CU_F32, p.pa, LS_CU_BF16, p.pb, LS_CU_BF16, p.tiles[i % DEV_SETS],
                            p.n_tiles, p.r, NULL, p.offs, p.g.in, p.g.n_slices, p.r_max,
                            p.flags | LS_CU_LORA_ACC, st);
}

int main(int argc, char **argv) {
    cudaStream_t st;
    if (ls_cu_props()->cc < 9) {
        printf("dev_fused: the one-kernel op needs sm_90 thread-block clusters\n");
        return 0;
    }
    double bw = dev_begin("dev_fused", "T=64, rank 16, bf16 pools", &st);
    static const char *names[2] = {"apply", "fused"};
    dev_lora_each(argc, argv, 3000, [&](const dev_lora_t &p, const char *name) {
        std::vector<float> want_tmp, want_y;
        dev_lora_reference(p, want_tmp, want_y);
        // no tmp traffic for the one kernel; production's parts are counted nowhere either
        double bytes = dev_shrink_bytes(p) + dev_expand_bytes(p) - 2.0 * dev_tmp_bytes(p);
        for (int v = 0; v < 2; v++) {
            dev_check(name, names[v], dev_lora_delta_nmse(p, want_y, [&] { return s_run(p, v, 0, st); }), 1e-10);
            double us = dev_time_us(st, 50, [&](long i) { return s_run(p, v, i, st); });
            dev_lora_row(names[v], us, bytes, bw, "");
        }
    });
    return dev_end();
}
