/*  kernels/cuda/dev/dev_gemv.cu — the decode GEMM of a few tokens (kernels/cuda/gemv.cu,
    production up to LS_CU_GEMV_MAX_T tokens) against cuBLAS, and its versions.

    At batch 1 a decode layer is four GEMMs streaming 436 MB of weights with small kernels
    of ours between them (attention, RMSNorm, RoPE, SiLU·mul) during which HBM idles.
    cuBLAS's kernels neither wait nor trigger programmatically, so each starts only once the
    kernel before it has ended, and its ramp and tail (and o's and down's split-K reduction
    kernel) come on top of its bytes. Ours (gemv.cu's header has the kernel) is launched
    with programmatic dependent launch and asks L2 for its rows' first bytes before it waits.

    Versions: `gemv` (production: 1 row a warp over all of K at one token, the split CUDA-core
    form at two, the tensor-core form at 3-16, LS_CU_GEMV_PF asked before the wait as after
    the small kernels the gaps stand for; cuBLAS past 16 tokens); `gemv_nopf` (one token's form
    and the split CUDA-core form at 2-8 tokens, a block's four warps a quarter of K each, no
    prefetch); `cc_r2`, `cc_r1` (2 or 1 rows a warp over all of K, the form before
    the split, at every T up to 8, with the prefetch); `mma_frag`, `mma_ring` (the
    tensor-core form's versions, measured, not kept: the weights straight into fragments;
    through a cp.async ring);
    `tc_r1`, `tc_r2`, `tc_r1_f32x` (tried and lost, below: a tensor-core form at every T up to
    64 with 1 or 2 row tiles a block, and on an fp32 x as o's); `mix` (each GEMM on the form
    that wins it alone at 2-8 tokens on an H100; measured, not kept); `gemv_glu`, `gemv_glu2`
    (tried and lost: gate_up with SiLU·mul in its epilogue, below, timed in the chain only);
    `wg_m1`, `wg_m2`, `wg_m2k2`, `wg_m1k4`, `tma_m2`, `tma_m2k2`, `tma_m1k4` (measured, not
    kept: warpgroup MMA fed by cp.async or TMA, stream-K, m tiles and 64-k blocks a unit as
    named, below). After the chain: a gap of 0-18 µs before o
    (how much of the gap each version's start hides).

    Checked against a CPU reference (fp32 sums of the bf16 products, NMSE), then timed two
    ways: the GEMM alone (back to back, weight sets rotating past L2), and a chain of 32
    layers of the four projections, each after a "gap" kernel of ours that spins one block
    for the time the small kernels take before it at batch 1 (H100 step timeline: o after
    attention + conversion + RoPE/KV store ~9 µs, gate_up and qkv after an RMSNorm ~3.5,
    down after SiLU·mul ~2), as one CUDA graph; µs a layer.

    Usage: dev_gemv. Exit 1 if a version fails its check.
*/
#include <cstring>

#include "../gemv.cu"
#include "../wgmma.cuh"


#include "dev_blas.cuh"
#include "dev_common.cuh"
#include "dev_streamk.cuh"
#include "dev_tma.cuh"

enum { LAYERS = 32, N_G = 4 };
static const struct {
    const char *name;
    int in, out;
    double gap_us; // the small kernels before it at batch 1
} s_g[N_G] = {{"o", 4096, 4096, 9}, {"gate_up", 4096, 28672, 3.5}, {"down", 14336, 4096, 2},
              {"qkv", 4096, 6144, 3.5}};

// the CUDA-core form with R rows a warp (SPLIT: a block, its warps a quarter of K each), or the tensor-core form with RW row tiles a block,
// for T's tokens, pf bytes a row asked of L2 before the wait; cudaErrorNotSupported where
// the form has no pass for T (the CUDA cores up to 8 tokens)
template <int R, bool SPLIT>
static cudaError_t s_cc(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out, int pf,
                        cudaStream_t st) {
    typedef __nv_bfloat16 B;
    int rows = SPLIT ? R : GV_WARPS * R; // a block's
    dim3 grid((unsigned)((out + rows - 1) / rows)), block(GV_WARPS * 32);
    const void *nb = NULL;
#define S_CC_K(NT) (SPLIT ? k_gemv_split<NT, R, B, B> : k_gemv<NT, R, B, B>)
    switch (T) {
    case 1: return ls_cu_launch_dep(S_CC_K(1), grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    case 2: return ls_cu_launch_dep(S_CC_K(2), grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    case 3:
    case 4: return ls_cu_launch_dep(S_CC_K(4), grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    case 5: case 6: case 7:
    case 8: return ls_cu_launch_dep(S_CC_K(8), grid, block, 0, st, y, x, w, nb, LS_CU_F32, T, in, out, 0, pf);
    default: return cudaErrorNotSupported;
    }
#undef S_CC_K
}
// ---- tried and lost: a tensor-core form for 1..64 tokens ----
//
// mma.sync m16n8k16 with 16 weight rows as a and 8 tokens as b, the weights straight from
// memory into a fragments: a sum over K does not care in which order K is walked, so lane
// (g, q) takes 16 bytes — 8 consecutive k — of rows g and g + 8 and of token g's x, and one
// mma takes their first two pairs as the k pairs 2q and 2q + 8 that the fragment layout
// names, a second mma the last two; rows and tokens see the same permutation. No lane needs
// another's bytes, so each lane's weights go through its own slots of its warp's cp.async
// ring (TC_NST steps deep), no ldmatrix, no barrier. A block is TC_WARPS warps on RW row
// tiles (16 RW rows), splitting K (warp w takes the 64-k chunks w, w + TC_WARPS, ...); the
// warps' sums meet in shared memory (the ring's) in warp order. Each warp reads the tokens'
// x for its chunks from L1/L2 — and that is where it loses past 8 tokens: every block reads
// all of x, T · K · 2 bytes, so at 64 tokens x moves twice the weights' bytes from L2.
enum { TC_WARPS = 8, TC_NST = 4 };
template <int RW> __host__ __device__ constexpr int tc_smem() { return TC_WARPS * TC_NST * RW * 4 * 32 * 16; }

// y (T, out) = x (T, in) · w (out, in)ᵀ, T <= 8 NT, in % 64 == 0; block b the row group b
template <int NT, int RW, typename TX>
__global__ void __launch_bounds__(TC_WARPS * 32)
    k_gemv_tc(float *y, const TX *x, const __nv_bfloat16 *w, int T, int in, int out, int pf) {
    typedef __nv_bfloat16 B;
    extern __shared__ uint4 sm_tc[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3, rows = 16 * RW;
    ls_prefetch_rows(w, in, out, (int)blockIdx.x * rows, rows, pf, threadIdx.x, TC_WARPS * 32);
    ls_dep_enter();
    uint4 *ring = sm_tc + (size_t)warp * TC_NST * RW * 4 * 32 + lane;
    float(*red)[RW][NT][4][32] = reinterpret_cast<float(*)[RW][NT][4][32]>(sm_tc);
    const TX *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        xr[j] = x + (size_t)min(8 * j + g, T - 1) * in + 8 * q;
    const B *wr[RW][2];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            wr[r][h] = w + (size_t)min((int)blockIdx.x * rows + 16 * r + 8 * h + g, out - 1) * in + 8 * q;
    int nw = (in / 64 - warp + TC_WARPS - 1) / TC_WARPS;
    float c[RW][NT][4] = {};
    auto issue = [&](int i, int) {
        if (i < nw) {
            uint4 *st = ring + (size_t)(i % TC_NST) * RW * 4 * 32;
#pragma unroll
            for (int r = 0; r < RW; r++)
#pragma unroll
                for (int k = 0; k < 4; k++)
                    ls_cp16(st + (r * 4 + k) * 32, wr[r][k >> 1] + 64 * (warp + i * TC_WARPS) + 32 * (k & 1), 16);
        }
        ls_cp_commit();
    };
    ls_ring_run<TC_NST>(nw, [](int) { return 0; }, issue, [&](int i) {
        int k0 = 64 * (warp + i * TC_WARPS);
        const uint4 *st = ring + (size_t)(i % TC_NST) * RW * 4 * 32;
#pragma unroll
        for (int s = 0; s < 2; s++) {
            uint4 xb[NT];
#pragma unroll
            for (int j = 0; j < NT; j++)
                xb[j] = s_gm_x<B>(xr[j] + k0 + 32 * s, true); // gemv.cu's
#pragma unroll
            for (int r = 0; r < RW; r++) {
                uint4 wa = st[(r * 4 + s) * 32], wb = st[(r * 4 + 2 + s) * 32];
                uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y}, a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    ls_mma16816<B>(c[r][j], a0, xb[j].x, xb[j].y);
                    ls_mma16816<B>(c[r][j], a1, xb[j].z, xb[j].w);
                }
            }
        }
    });
    __syncthreads(); // every warp is done with its ring: the sums take it
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                red[warp][r][j][e][lane] = c[r][j][e];
    __syncthreads();
    for (int i = threadIdx.x; i < RW * NT * 4 * 32; i += TC_WARPS * 32) {
        int l = i & 31, e = (i >> 5) & 3, j = (i >> 7) % NT, r = (i >> 7) / NT;
        float v = red[0][r][j][e][l];
#pragma unroll
        for (int k = 1; k < TC_WARPS; k++)
            v += red[k][r][j][e][l];
        int o = blockIdx.x * rows + 16 * r + (l >> 2) + (e >> 1) * 8, t = 8 * j + 2 * (l & 3) + (e & 1);
        if (o < out && t < T)
            y[(size_t)t * out + o] = v;
    }
}

template <int NT, int RW, typename TX>
static cudaError_t s_tc_nt(float *y, const TX *x, const __nv_bfloat16 *w, int T, int in, int out, int pf,
                           cudaStream_t st) {
    constexpr auto k = k_gemv_tc<NT, RW, TX>;
    cudaError_t e = dev_smem_attr<k>(tc_smem<RW>());
    if (e != cudaSuccess)
        return e;
    return ls_cu_launch_dep(k, dim3((unsigned)((out + 16 * RW - 1) / (16 * RW))),
                            dim3(TC_WARPS * 32), (size_t)tc_smem<RW>(), st, y, x, w, T, in, out, pf);
}
// the tensor-core form with RW row tiles a block for T's tokens (in % 64 == 0)
template <int RW, typename TX>
static cudaError_t s_tc(float *y, const TX *x, const __nv_bfloat16 *w, int T, int in, int out, int pf,
                        cudaStream_t st) {
    return T <= 8    ? s_tc_nt<1, RW>(y, x, w, T, in, out, pf, st)
           : T <= 16 ? s_tc_nt<2, RW>(y, x, w, T, in, out, pf, st)
           : T <= 32 ? s_tc_nt<4, RW>(y, x, w, T, in, out, pf, st)
                     : s_tc_nt<8, RW>(y, x, w, T, in, out, pf, st);
}

// ---- warpgroup MMA, stream-K (sm_90a): measured, not kept ----
//
// Hopper's wgmma with the weights as A (MT m64 MMAs a warpgroup: BM = 64 MT rows a tile) and
// the tokens as B (n = NT, the tokens padded to 8, 16, 32 or 64), both K-major from shared
// memory in the 128-byte swizzle (wgmma.cuh), fed by a ring of S stages (up to 8 in ~200 KB)
// of (BM weight rows + NT token rows) x 64 KB k: cp.async, a warp's lanes on a row's
// consecutive 16-byte chunks, or (TMA) a tensor-map box a 64-k block issued by one thread on
// an mbarrier a stage. A unit (row tile, chunk of 64 KB k) is KB column blocks of 64 k, so a
// row's bytes come KB · 128 at a time. A CTA of one warpgroup an SM: each stage's x tile is
// read once for BM rows (x moves NT / BM of the weights' bytes from L2, where the mma.sync
// form above moved 2x at 64 tokens). Work is split stream-K (dev_streamk.cuh): every CTA the
// same bytes, no partial wave; a CTA's pipeline runs across its tiles, a tile split between
// CTAs summed by its last one in CTA order (deterministic for a given grid). With `early`, the
// weights of the first S - 1 stages are requested before the programmatic wait (they are
// written by no kernel); the x tiles after it.
enum { WG_THREADS = 128 };
template <int MT, int NT, int KB> __host__ __device__ constexpr unsigned wg_stage_bytes() {
    return (unsigned)(64 * MT + NT) * 128 * KB;
}
// stages: up to 8, in about 200 KB
template <int MT, int NT, int KB> __host__ __device__ constexpr int wg_stages() {
    return 200 * 1024 / wg_stage_bytes<MT, NT, KB>() < 8 ? 200 * 1024 / wg_stage_bytes<MT, NT, KB>() : 8;
}
template <int MT, int NT, int KB> __host__ __device__ constexpr size_t wg_smem() {
    return (size_t)wg_stages<MT, NT, KB>() * wg_stage_bytes<MT, NT, KB>() + 1024;
}

template <int MT, int NT, int KB, bool TMA>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_gemm_wg(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out, float *ws,
              int *cnt, int early, const __grid_constant__ CUtensorMap wmap,
              const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int S = wg_stages<MT, NT, KB>(), BM = 64 * MT, NR = NT / 2, BK = 64 * KB;
    static_assert(S >= 3, "stages");
    constexpr unsigned SB = wg_stage_bytes<MT, NT, KB>(), XO = BM * 128 * KB; // x after the weights'
    extern __shared__ uint4 s_wg[];
    __shared__ int s_last;
    __shared__ alignas(8) uint64_t s_full[S]; // TMA: a barrier a stage
    const int tid = threadIdx.x;
    const dev_sk_t sp = dev_sk_split(in / BK, (out + BM - 1) / BM);
    const int KC = sp.KC, u0 = sp.u0, u1 = sp.u1;
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(s_wg), base = (sm0 + 1023u) & ~1023u;
    const unsigned full0 = (unsigned)__cvta_generic_to_shared(s_full);
    if (TMA && tid == 0) {
        for (int i = 0; i < S; i++)
            dev_mb_init(full0 + 8 * i, 1);
        dev_mb_fence_init();
    }
    if (TMA)
        __syncthreads();
    // unit u's weight rows, and its x rows, into stage slot (nothing past the CTA's last unit)
    auto issue_w = [&](int u, int slot) {
        if (u >= u1)
            return;
        const int t = u / KC, kc = u - t * KC;
        const unsigned dst = base + slot * SB;
        if constexpr (TMA) {
            if (tid == 0) {
                dev_mb_expect(full0 + 8 * slot, SB);
#pragma unroll
                for (int cb = 0; cb < KB; cb++)
                    dev_tma_2d(dst + cb * BM * 128, &wmap, kc * BK + 64 * cb, t * BM, full0 + 8 * slot);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BM * 8 * KB / WG_THREADS; i++) {
                int f = tid + i * WG_THREADS, r = f / (8 * KB), cc = f % (8 * KB), cb = cc >> 3, ch = cc & 7;
                int row = min(t * BM + r, out - 1);
                ls_cp16(dst + cb * BM * 128 + r * 128 + ((ch ^ (r & 7)) << 4),
                        w + (size_t)row * in + kc * BK + cc * 8, 16);
            }
        }
    };
    auto issue_x = [&](int u, int slot) {
        if (u >= u1)
            return;
        const int kc = u % KC;
        const unsigned dst = base + slot * SB + XO;
        if constexpr (TMA) {
            if (tid == 0)
#pragma unroll
                for (int cb = 0; cb < KB; cb++)
                    dev_tma_2d(dst + cb * NT * 128, &xmap, kc * BK + 64 * cb, 0, full0 + 8 * slot);
        } else {
#pragma unroll
            for (int i = 0; i < (NT * 8 * KB + WG_THREADS - 1) / WG_THREADS; i++) {
                int f = tid + i * WG_THREADS, r = f / (8 * KB), cc = f % (8 * KB), cb = cc >> 3, ch = cc & 7;
                if (f < NT * 8 * KB)
                    ls_cp16(dst + cb * NT * 128 + r * 128 + ((ch ^ (r & 7)) << 4),
                            x + (size_t)min(r, T - 1) * in + kc * BK + cc * 8, 16);
            }
        }
    };
    if (!early)
        ls_dep_enter();
    for (int s = 0; s < S - 1; s++)
        issue_w(u0 + s, s);
    ls_cp_commit();
    if (early)
        ls_dep_enter();
    for (int s = 0; s < S - 1; s++) {
        issue_x(u0 + s, s);
        ls_cp_commit();
    }
    float d[MT][NR];
    dev_sk_zero(d);
    auto store = [&](int o, int tt, float v) {
        if (o < out && tt < T)
            y[(size_t)tt * out + o] = v;
    };
    const int n = u1 - u0;
    int seg0 = u0, slot = 0, next = S - 1; // next: the slot of unit j + S - 1
    for (int j = 0; j < n; j++) {
        if constexpr (TMA)
            dev_mb_wait(full0 + 8 * slot, (unsigned)(j / S) & 1);
        else {
            ls_cp_wait<S - 2>();
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        }
        __syncthreads();
        issue_w(u0 + j + S - 1, next);
        issue_x(u0 + j + S - 1, next);
        ls_cp_commit();
        const unsigned wst = base + (unsigned)slot * SB, xst = wst + XO;
        ls_wg_fence();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            const unsigned off = (ks & 3) * 32;
            uint64_t db = ls_wg_desc(xst + (ks >> 2) * NT * 128 + off, 16, 1024);
#pragma unroll
            for (int m = 0; m < MT; m++)
                ls_wg_ss<NT>(d[m], ls_wg_desc(wst + (ks >> 2) * BM * 128 + m * 64 * 128 + off, 16, 1024), db, 1);
        }
        ls_wg_commit();
        ls_wg_wait0();
#pragma unroll
        for (int m = 0; m < MT; m++)
            ls_wg_keep(d[m]);
        slot = slot + 1 == S ? 0 : slot + 1;
        next = next + 1 == S ? 0 : next + 1;
        const int u = u0 + j;
        if (u % KC == KC - 1 || j == n - 1) {
            dev_sk_flush(d, sp, u / KC, seg0, u + 1, ws, cnt, s_last, store);
            seg0 = u + 1;
            dev_sk_zero(d);
        }
    }
    ls_cp_wait<0>();
#endif
}

static float *s_wg_ws; // the stream-K pieces: 2 a CTA
static int *s_wg_cnt;  // a counter a row tile, zero between launches
static int s_sms;
static int s_wg_early = 1; // 0: the first stages' weights requested only after the wait

template <int MT, int NT, int KB, bool TMA>
static cudaError_t s_wg_nt(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out,
                           cudaStream_t st) {
    constexpr auto k = k_gemm_wg<MT, NT, KB, TMA>;
    cudaError_t e = dev_smem_attr<k>(wg_smem<MT, NT, KB>());
    if (e != cudaSuccess)
        return e;
    CUtensorMap wm = {}, xm = {};
    if (TMA) {
        e = dev_tmap(&wm, w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, in, out, 64 * MT);
        if (e == cudaSuccess)
            e = dev_tmap(&xm, x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, in, T, NT);
        if (e != cudaSuccess)
            return e;
    }
    if (in % (64 * KB))
        return cudaErrorNotSupported;
    long U = (long)((out + 64 * MT - 1) / (64 * MT)) * (in / (64 * KB));
    int G = (int)std::min<long>(s_sms, U);
    return ls_cu_launch_dep(k, dim3((unsigned)G), dim3(WG_THREADS), wg_smem<MT, NT, KB>(), st, y, x, w, T, in, out,
                            s_wg_ws, s_wg_cnt, s_wg_early, wm, xm);
}
// the warpgroup form with MT m64 tiles a row tile and units of KB 64-k blocks, T <= 64 tokens
// (in % (64 KB) == 0)
template <int MT, int KB, bool TMA>
static cudaError_t s_wg(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out,
                        cudaStream_t st) {
    return T <= 8    ? s_wg_nt<MT, 8, KB, TMA>(y, x, w, T, in, out, st)
           : T <= 16 ? s_wg_nt<MT, 16, KB, TMA>(y, x, w, T, in, out, st)
           : T <= 32 ? s_wg_nt<MT, 32, KB, TMA>(y, x, w, T, in, out, st)
                     : s_wg_nt<MT, 64, KB, TMA>(y, x, w, T, in, out, st);
}

// ---- tried and lost: SiLU·mul in gate_up's epilogue (kernels/cuda/dev/README.md) ----
//
// At one or two tokens, gate_up's GEMV could write act = silu(gate) · up (and the bf16 copy the
// down projection reads) itself, so that no SiLU·mul kernel sits between gate_up and down: a
// block's four warps take gate rows o0, o0 + 1 and up rows inter + o0, inter + o0 + 1, one row
// a warp as production's GEMV at one token, write their sums to gu as it does, and after a
// barrier 2·NT threads of the block make act from them (the sums come back from L1/L2). Only
// where no adapter's delta is to be added to gate_up first. The chain runs it in place of
// gate_up and drops the gap before down.
template <int NT, typename TW, typename TX>
__global__ void __launch_bounds__(GV_WARPS * 32)
    k_gemv_glu(float *act, TW *lp, float *gu, const TX *x, const TW *w, int T, int in, int inter, int pf) {
    static_assert(GV_WARPS == 4, "two gate rows and their two up rows a block");
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, out = 2 * inter;
    int side = warp < 2 ? 0 : inter; // gate rows, or up rows
    ls_prefetch_rows(w, in, out, side + blockIdx.x * 2 + (warp & 1), 1, pf, lane, 32);
    ls_dep_enter();
    const TX *xr[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        xr[t] = x + (size_t)min(t, T - 1) * in;
    for (int o0 = blockIdx.x * 2; o0 < inter; o0 += gridDim.x * 2) {
        s_gemv_rows<NT, 1>(gu, xr, w, NULL, LS_CU_F32, T, in, out, 0, side + o0 + (warp & 1), lane);
        __syncthreads(); // the block's four sums of each token in gu
        int r = threadIdx.x / NT, t = threadIdx.x % NT, o = o0 + r;
        if (r < 2 && t < T) {
            float v = ls_silu_mul(gu[(size_t)t * out + o], gu[(size_t)t * out + inter + o]);
            act[(size_t)t * inter + o] = v;
            lp[(size_t)t * inter + o] = ls_from_f<TW>(v);
        }
    }
}

// act (T, inter), lp (T, inter) bf16, gu (T, 2 inter) scratch; inter even, T 1..2
static cudaError_t s_glu(float *act, __nv_bfloat16 *lp, float *gu, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                         int T, int in, int inter, cudaStream_t st) {
    typedef __nv_bfloat16 B;
    long pf = ls_prefetch_row_bytes(LS_CU_GEMV_PF, in, 2, 2 * inter);
    dim3 grid((unsigned)(inter / 2)), block(GV_WARPS * 32);
    if (inter % 2 || T < 1 || T > 2)
        return cudaErrorNotSupported;
    return T == 1 ? ls_cu_launch_dep(k_gemv_glu<1, B, B>, grid, block, 0, st, act, lp, gu, x, w, T, in, inter, (int)pf)
                  : ls_cu_launch_dep(k_gemv_glu<2, B, B>, grid, block, 0, st, act, lp, gu, x, w, T, in, inter, (int)pf);
}

// The same without the block's barrier (gemv_glu2): each warp leaves its sums in shared
// memory and counts itself in; the second warp of a (gate, up) pair makes act from both, so a
// warp that finishes first leaves at once and the sums never go through L1/L2. One pair of
// outputs a block, a grid of inter / 2.
template <int NT, typename TW, typename TX>
__global__ void __launch_bounds__(GV_WARPS * 32)
    k_gemv_glu2(float *act, TW *lp, const TX *x, const TW *w, int T, int in, int inter, int pf) {
    static_assert(GV_WARPS == 4, "two gate rows and their two up rows a block");
    __shared__ float sums[2][2][NT]; // [pair][gate, up][token]
    __shared__ int arrived[2];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, out = 2 * inter;
    int pair = warp & 1, side = warp >> 1, o = blockIdx.x * 2 + pair;
    ls_prefetch_rows(w, in, out, side * inter + o, 1, pf, lane, 32);
    if (threadIdx.x < 2)
        arrived[threadIdx.x] = 0;
    __syncthreads();
    ls_dep_enter();
    const TX *xr[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        xr[t] = x + (size_t)min(t, T - 1) * in;
    float v[1][NT];
    s_gemv_sums<NT, 1>(v, xr, w, in, out, side * inter + o, 0, in / 8, lane);
    int first = 0;
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < NT; t++)
            sums[pair][side][t] = v[0][t];
        __threadfence_block();
        first = atomicAdd(&arrived[pair], 1) == 0;
        __threadfence_block();
    }
    if (__shfl_sync(0xffffffffu, first, 0) || o >= inter)
        return;
    if (lane < NT && lane < T) {
        float mine = v[0][0], other = sums[pair][side ^ 1][lane];
#pragma unroll
        for (int t = 1; t < NT; t++)
            mine = lane == t ? v[0][t] : mine;
        float a = side ? ls_silu_mul(other, mine) : ls_silu_mul(mine, other);
        act[(size_t)lane * inter + o] = a;
        lp[(size_t)lane * inter + o] = ls_from_f<TW>(a);
    }
}

static cudaError_t s_glu2(float *act, __nv_bfloat16 *lp, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T,
                          int in, int inter, cudaStream_t st) {
    typedef __nv_bfloat16 B;
    long pf = ls_prefetch_row_bytes(LS_CU_GEMV_PF, in, 2, 2 * inter);
    dim3 grid((unsigned)((inter + 1) / 2)), block(GV_WARPS * 32);
    if (T < 1 || T > 2)
        return cudaErrorNotSupported;
    return T == 1 ? ls_cu_launch_dep(k_gemv_glu2<1, B, B>, grid, block, 0, st, act, lp, x, w, T, in, inter, (int)pf)
                  : ls_cu_launch_dep(k_gemv_glu2<2, B, B>, grid, block, 0, st, act, lp, x, w, T, in, inter, (int)pf);
}

// ---- the tensor-core form's versions (production: gemv.cu k_gemv_mma), measured, not kept ----
//
// mma_frag: the weights straight into a fragments (lane (g, q) 16 bytes of rows g and g + 8,
// 4 lanes a row: 64 bytes of each of 8 rows an instruction), KS warps splitting K, U 32-k
// steps loaded before their mmas. mma_ring: production's layout through shared memory, but
// by cp.async into a warp's ring of D stages (the first D - 1 issued before the wait), the
// fragments read back as production's.
template <int NN, int KS, int U, typename TW, typename TX>
__global__ void __launch_bounds__(KS * 32)
    k_mma_frag(float *y, const TX *x, const TW *w, int T, int in, int out, int pf) {
    __shared__ float part[KS][NN * 4][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    int n32 = in / 32, per = n32 / KS, s0 = warp * per, s1 = warp == KS - 1 ? n32 : s0 + per;
    ls_prefetch_rows(w + (size_t)s0 * 32, in, out, blockIdx.x * 16, 16, pf / KS / 128 * 128, lane, 32);
    ls_dep_enter();
    const TX *xr[NN];
    for (int j = 0; j < NN; j++)
        xr[j] = x + (size_t)min(8 * j + g, T - 1) * in + 8 * q;
    int o0 = blockIdx.x * 16;
    const uint4 *wr[2];
    for (int h = 0; h < 2; h++)
        wr[h] = reinterpret_cast<const uint4 *>(w + (size_t)min(o0 + 8 * h + g, out - 1) * in + 8 * q);
    float c[NN][4] = {};
    for (int s = s0; s < s1; s += U) {
        uint4 wv[U][2], xv[U][NN];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                wv[u][h] = s + u < s1 ? ls_ld_stream(wr[h] + (size_t)(s + u) * 4) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NN; j++)
                xv[u][j] = s_gm_x<TW>(xr[j] + (size_t)(s + u) * 32, s + u < s1);
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t a0[4] = {wv[u][0].x, wv[u][1].x, wv[u][0].y, wv[u][1].y},
                     a1[4] = {wv[u][0].z, wv[u][1].z, wv[u][0].w, wv[u][1].w};
#pragma unroll
            for (int j = 0; j < NN; j++) {
                ls_mma16816<TW>(c[j], a0, xv[u][j].x, xv[u][j].y);
                ls_mma16816<TW>(c[j], a1, xv[u][j].z, xv[u][j].w);
            }
        }
    }
    ls_gm_reduce<NN, KS>(part, c, o0, warp, lane, [&](float v, int o, int t) {
        if (o < out && t < T)
            y[(size_t)t * out + o] = v;
    });
}

enum { GM_SEG = GM_CHUNKS * 8 }; // k a segment of 16-bit weights

template <int NN, int KS, int D, typename TW, typename TX>
__global__ void __launch_bounds__(KS * 32)
    k_mma_ring(float *y, const TX *x, const TW *w, int T, int in, int out) {
    extern __shared__ uint4 sm_ring[];
    __shared__ float part[KS][NN * 4][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    int nseg = in / GM_SEG, per = nseg / KS, s0 = warp * per, s1 = warp == KS - 1 ? nseg : s0 + per, n = s1 - s0;
    uint4(*ring)[16][32] = reinterpret_cast<uint4(*)[16][32]>(sm_ring + (size_t)warp * D * 16 * 32);
    const uint4 *wl = reinterpret_cast<const uint4 *>(w) + lane;
    int o0 = blockIdx.x * 16;
    auto issue = [&](int i) {
        if (i < n)
            for (int r = 0; r < 16; r++)
                ls_cp16(&ring[i % D][r][lane ^ ls_gm_swz(r)], wl + (size_t)min(o0 + r, out - 1) * (in / 8) + (size_t)(s0 + i) * 32, 16);
        ls_cp_commit();
    };
    for (int i = 0; i < D - 1; i++)
        issue(i);
    ls_dep_enter();
    const TX *xr[NN];
    for (int j = 0; j < NN; j++)
        xr[j] = x + (size_t)min(8 * j + g, T - 1) * in + 8 * q;
    float c[NN][4] = {};
    for (int i = 0; i < n; i++) {
        issue(i + D - 1);
        ls_cp_wait<D - 1>();
        __syncwarp();
        uint4(*st)[32] = ring[i % D];
#pragma unroll
        for (int k = 0; k < 8; k++) {
            int ch = (4 * k + q) ^ ls_gm_swz(g);
            uint4 wa = st[g][ch], wb = st[g + 8][ch];
            uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y}, a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
            for (int j = 0; j < NN; j++) {
                uint4 xv = s_gm_x<TW>(xr[j] + (size_t)(s0 + i) * GM_SEG + 32 * k, true);
                ls_mma16816<TW>(c[j], a0, xv.x, xv.y);
                ls_mma16816<TW>(c[j], a1, xv.z, xv.w);
            }
        }
        __syncwarp();
    }
    ls_gm_reduce<NN, KS>(part, c, o0, warp, lane, [&](float v, int o, int t) {
        if (o < out && t < T)
            y[(size_t)t * out + o] = v;
    });
}

// the two for T <= 16 tokens (in % 256 == 0 for mma_ring), cudaErrorNotSupported past
static cudaError_t s_mma_frag(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out, int pf,
                              cudaStream_t st) {
    typedef __nv_bfloat16 B;
    dim3 grid((unsigned)((out + 15) / 16)), block(8 * 32);
    return T > 16  ? cudaErrorNotSupported
           : T > 8 ? ls_cu_launch_dep(k_mma_frag<2, 8, 4, B, B>, grid, block, 0, st, y, x, w, T, in, out, pf)
                   : ls_cu_launch_dep(k_mma_frag<1, 8, 4, B, B>, grid, block, 0, st, y, x, w, T, in, out, pf);
}
template <int NN> static cudaError_t s_mma_ring_nn(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out,
                                                   cudaStream_t st) {
    constexpr auto k = k_mma_ring<NN, 8, 2, __nv_bfloat16, __nv_bfloat16>;
    size_t smem = (size_t)8 * 2 * 16 * 512;
    cudaError_t e = dev_smem_attr<k>(smem);
    return e != cudaSuccess ? e
                            : ls_cu_launch_dep(k, dim3((unsigned)((out + 15) / 16)), dim3(8 * 32), smem, st, y, x, w, T, in, out);
}
static cudaError_t s_mma_ring(float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out, cudaStream_t st) {
    return T > 16 || in % GM_SEG ? cudaErrorNotSupported
           : T > 8               ? s_mma_ring_nn<2>(y, x, w, T, in, out, st)
                                 : s_mma_ring_nn<1>(y, x, w, T, in, out, st);
}
// the small kernels before a GEMM: one block spinning for ns, enrolled as ours are
__global__ void k_gap(long ns) {
    ls_dep_enter();
    long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    while (t - t0 < ns);
}

enum { V_BLAS, V_GEMV, V_NOPF, V_R2, V_R1, V_TC1, V_TC2, V_TCF, V_MIX, V_WG1, V_WG2, V_WG2K2, V_WG1K4, V_TMA2, V_TMA2K2, V_TMA1K4,
       V_MFRAG, V_MRING, N_V };
static const char *s_names[N_V] = {"cuBLAS", "gemv", "gemv_nopf", "cc_r2", "cc_r1", "tc_r1", "tc_r2", "tc_r1_f32x",
                                   "mix",    "wg_m1",     "wg_m2",      "wg_m2k2",   "wg_m1k4", "tma_m2",
                                   "tma_m2k2", "tma_m1k4", "mma_frag", "mma_ring"};
static const int s_ts[] = {1, 2, 4, 8, 16, 32, 64};
static cublasHandle_t s_h;
static long s_pf_total = LS_CU_GEMV_PF; // bytes asked of L2 a GEMM, over its rows
static float *s_x32;                    // x in fp32 (tc_r2_f32x: o's x, attention's output)

// the CUDA-core versions have passes up to 8 tokens, the tensor-core form's up to 16
static bool s_fits(int v, int T) {
    return v >= V_MFRAG ? T <= 16 : T <= 8 || (v != V_NOPF && v != V_R2 && v != V_R1);
}

static cudaError_t s_run(int v, float *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int T, int in, int out,
                         cudaStream_t st) {
    // production: the GEMV where ls_cu_gemv_ok, else cuBLAS (as the CUDA backend's matmul,
    // but at every count the GEMV takes: the backend stops at ls_cu_gemv_tokens(), 8 on an
    // H200, where this table's 9-16 tokens say why)
    // mix: each GEMM's best alone at 2-8 tokens (H100): gate_up as production, qkv on the
    // tensor cores a row tile a block, o (on an fp32 x, as attention leaves it: no conversion
    // pass) and down two
    if (v == V_MIX && in == 4096 && out == 4096)
        return s_tc<2>(y, (const float *)s_x32, w, T, in, out, (int)ls_prefetch_row_bytes(s_pf_total, in, 2, out), st);
    if (v == V_MIX)
        v = (long)in * out > (64l << 20) ? V_GEMV : out > 4096 ? V_TC1 : V_TC2;
    if (v == V_GEMV && ls_cu_gemv_ok(T, in, x, LS_CU_BF16, w, LS_CU_BF16))
        return ls_cu_gemv(y, x, LS_CU_BF16, w, LS_CU_BF16, NULL, LS_CU_F32, T, in, out, 0, 0, s_pf_total, st);
    if (v == V_GEMV || v == V_BLAS) {
        float one = 1.0f, zero = 0.0f;
        BL_CK(cublasGemmEx(s_h, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &one, w, CUDA_R_16BF, in, x, CUDA_R_16BF,
                           in, &zero, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return cudaGetLastError();
    }
    // the CUDA cores without the prefetch (production's rows a warp), with R rows a warp, or
    // the tensor cores with RW row tiles a block (tc_r1_f32x: on an fp32 x, as o's), with
    // production's prefetch amount (s_pf_total: the sweep)
    switch (v) {
    case V_WG1: return s_wg<1, 1, false>(y, x, w, T, in, out, st);
    case V_WG2: return s_wg<2, 1, false>(y, x, w, T, in, out, st);
    case V_WG2K2: return s_wg<2, 2, false>(y, x, w, T, in, out, st);
    case V_WG1K4: return s_wg<1, 4, false>(y, x, w, T, in, out, st);
    case V_TMA2: return s_wg<2, 1, true>(y, x, w, T, in, out, st);
    case V_TMA2K2: return s_wg<2, 2, true>(y, x, w, T, in, out, st);
    case V_TMA1K4: return s_wg<1, 4, true>(y, x, w, T, in, out, st);
    case V_MRING: return s_mma_ring(y, x, w, T, in, out, st);
    default: break;
    }
    long pf = v == V_NOPF ? 0 : ls_prefetch_row_bytes(s_pf_total, in, 2, out);
    switch (v) {
    case V_NOPF: return T == 1 ? s_cc<1, false>(y, x, w, T, in, out, 0, st) : s_cc<2, true>(y, x, w, T, in, out, 0, st);
    case V_R2: return s_cc<2, false>(y, x, w, T, in, out, (int)pf, st);
    case V_R1: return s_cc<1, false>(y, x, w, T, in, out, (int)pf, st);
    case V_TC1: return s_tc<1>(y, x, w, T, in, out, (int)pf, st);
    case V_TC2: return s_tc<2>(y, x, w, T, in, out, (int)pf, st);
    case V_MFRAG: return s_mma_frag(y, x, w, T, in, out, (int)pf, st);
    default: return s_tc<1>(y, (const float *)s_x32, w, T, in, out, (int)pf, st);
    }
}

static float *s_act, *s_gu; // the GLU experiment's act and gate_up scratch
static __nv_bfloat16 *s_lp; // its act in bf16

// µs a layer of 32 layers of [gap, GEMM] x 4 in one graph (gaps: none when !gaps); glu 1 or 2:
// gate_up as k_gemv_glu or k_gemv_glu2 (SiLU·mul in its epilogue) and no gap before down
static double s_chain(int v, __nv_bfloat16 *(&w)[LAYERS][N_G], float *y, const __nv_bfloat16 *x, int T, bool gaps,
                      cudaStream_t st, int glu = 0) {
    double us = dev_graph_us(st, [&] {
        cudaError_t e = cudaSuccess;
        for (int l = 0; l < LAYERS && e == cudaSuccess; l++)
            for (int k = 0; k < N_G && e == cudaSuccess; k++) {
                if (gaps && !(glu && k == 2))
                    e = ls_cu_launch_dep(k_gap, dim3(1), dim3(32), 0, st, (long)(s_g[k].gap_us * 1e3));
                if (e == cudaSuccess)
                    e = glu == 1 && k == 1   ? s_glu(s_act, s_lp, s_gu, x, w[l][k], T, s_g[k].in, s_g[k].out / 2, st)
                        : glu == 2 && k == 1 ? s_glu2(s_act, s_lp, x, w[l][k], T, s_g[k].in, s_g[k].out / 2, st)
                                             : s_run(v, y, x, w[l][k], T, s_g[k].in, s_g[k].out, st);
            }
        return e;
    });
    if (us < 0) {
        fprintf(stderr, "dev_gemv: %s's chain at T=%d did not run\n", s_names[v], T);
        exit(2);
    }
    return us / LAYERS;
}

int main() {
    cudaStream_t st;
    double bw = dev_begin("dev_gemv", "Llama-3-8B's projections, bf16, T = 1..64", &st);
    BL_CK(cublasCreate(&s_h));
    BL_CK(cublasSetStream(s_h, st));
    void *ws;
    DEV_CK(cudaMalloc(&ws, 32 << 20));
    BL_CK(cublasSetWorkspace(s_h, ws, 32 << 20));
    DEV_CK(cudaDeviceGetAttribute(&s_sms, cudaDevAttrMultiProcessorCount, 0));
    DEV_CK(cudaMalloc(&s_wg_ws, (size_t)s_sms * 2 * 2 * 32 * WG_THREADS * 4)); // 2 pieces a CTA, MT <= 2
    DEV_CK(cudaMalloc(&s_wg_cnt, 28672 / 64 * sizeof(int)));
    DEV_CK(cudaMemset(s_wg_cnt, 0, 28672 / 64 * sizeof(int)));
    dev_rng_t rng = {11};
    std::vector<float> hx, hw;
    __nv_bfloat16 *x = dev_bf16_fill(rng, (size_t)64 * 14336, 1.0f, hx);
    DEV_CK(cudaMalloc(&s_x32, hx.size() * 4));
    DEV_CK(cudaMemcpy(s_x32, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice));
    float *y;
    DEV_CK(cudaMalloc(&y, (size_t)64 * 28672 * 4));
    DEV_CK(cudaMalloc(&s_act, (size_t)2 * 14336 * 4));
    DEV_CK(cudaMalloc(&s_gu, (size_t)2 * 28672 * 4));
    DEV_CK(cudaMalloc(&s_lp, (size_t)2 * 14336 * 2));

    // validation on a small shape with rows past the last warp's and every T
    {
        int in = 1024, out = 200;
        __nv_bfloat16 *w = dev_bf16_fill(rng, (size_t)in * out, 0.1f, hw);
        for (int T : {1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64})
            for (int v = 0; v < N_V; v++) {
                if (!s_fits(v, T))
                    continue;
                DEV_CK(cudaMemset(y, 0xff, (size_t)T * out * 4));
                DEV_CK(s_run(v, y, x, w, T, in, out, st));
                std::vector<float> got((size_t)T * out), want(got.size());
                DEV_CK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
                for (int t = 0; t < T; t++)
                    for (int o = 0; o < out; o++) {
                        double s = 0;
                        for (int k = 0; k < in; k++)
                            s += (double)hx[(size_t)t * in + k] * hw[(size_t)o * in + k];
                        want[(size_t)t * out + o] = (float)s;
                    }
                char what[32];
                snprintf(what, sizeof what, "1024x200 T=%d", T);
                dev_check(what, s_names[v], dev_nmse(got.data(), want.data(), got.size()), 1e-10);
            }
        // the GLU experiment: rows 0..99 gate, 100..199 up
        for (int T : {1, 2}) {
            int inter = out / 2;
            std::vector<float> got((size_t)T * inter), got2(got.size()), want(got.size());
            DEV_CK(cudaMemset(s_act, 0xff, (size_t)T * inter * 4));
            DEV_CK(s_glu(s_act, s_lp, s_gu, x, w, T, in, inter, st));
            DEV_CK(cudaMemcpy(got.data(), s_act, got.size() * 4, cudaMemcpyDeviceToHost));
            DEV_CK(cudaMemset(s_act, 0xff, (size_t)T * inter * 4));
            DEV_CK(s_glu2(s_act, s_lp, x, w, T, in, inter, st));
            DEV_CK(cudaMemcpy(got2.data(), s_act, got.size() * 4, cudaMemcpyDeviceToHost));
            for (int t = 0; t < T; t++)
                for (int o = 0; o < inter; o++) {
                    double g = 0, u = 0;
                    for (int k = 0; k < in; k++) {
                        g += (double)hx[(size_t)t * in + k] * hw[(size_t)o * in + k];
                        u += (double)hx[(size_t)t * in + k] * hw[(size_t)(inter + o) * in + k];
                    }
                    want[(size_t)t * inter + o] = (float)(g / (1 + exp(-g)) * u);
                }
            char what[32];
            snprintf(what, sizeof what, "1024x2x100 T=%d", T);
            dev_check(what, "gemv_glu", dev_nmse(got.data(), want.data(), got.size()), 1e-10);
            dev_check(what, "gemv_glu2", dev_nmse(got2.data(), want.data(), got.size()), 1e-10);
        }
        cudaFree(w);
    }

    // the weights: 32 layers' worth, so a chain reads them from memory
    static __nv_bfloat16 *w[LAYERS][N_G];
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < N_G; k++) {
            size_t n = (size_t)s_g[k].in * s_g[k].out;
            DEV_CK(cudaMalloc(&w[l][k], n * 2));
            DEV_CK(cudaMemset(w[l][k], 0x3c, n * 2)); // 0x3c3c: a finite bf16
        }
    printf("\nalone, µs (%% of copy bandwidth), 32 sets rotating\n%-8s %3s", "GEMM", "T");
    for (int v = 0; v < N_V; v++)
        printf(" | %9s %6s", s_names[v], "%copy");
    printf("\n");
    for (int k = 0; k < N_G; k++)
        for (int T : s_ts) {
            double bytes = (double)s_g[k].in * s_g[k].out * 2;
            printf("%-8s %3d", s_g[k].name, T);
            for (int v = 0; v < N_V; v++) {
                if (!s_fits(v, T)) {
                    printf(" | %9s %6s", "-", "");
                    continue;
                }
                double us = dev_time_us(st, 32, [&](long i) {
                    return s_run(v, y, x, w[i % LAYERS][k], T, s_g[k].in, s_g[k].out, st);
                });
                printf(" | %9.1f %5.1f%%", us, 100 * bytes / us / 1e3 / bw);
            }
            printf("\n");
        }
    printf("\n");
    // diagnostics: a gap of 0, 4.5, 9 or 18 µs, then o, 32 times in a graph (µs a pair): how
    // much of the gap each version's start hides
    for (int T : {1, 8}) {
        printf("gap + o at T=%d, µs a pair (gaps 0 / 4.5 / 9 / 18):", T);
        for (int v : {V_BLAS, V_GEMV, V_WG2, V_WG1K4, V_TMA1K4})
            for (int early : {1, 0}) {
                if (early == 0 && v < V_WG1)
                    continue;
                s_wg_early = early;
                printf("  %s%s", s_names[v], early ? "" : " (late)");
                for (long gap : {0l, 4500l, 9000l, 18000l}) {
                    double us = dev_graph_us(st, [&] {
                        cudaError_t e = cudaSuccess;
                        for (int l = 0; l < LAYERS && e == cudaSuccess; l++) {
                            e = ls_cu_launch_dep(k_gap, dim3(1), dim3(32), 0, st, gap);
                            if (e == cudaSuccess)
                                e = s_run(v, y, x, w[l][0], T, 4096, 4096, st);
                        }
                        return e;
                    });
                    printf("%s%.1f", gap ? " / " : " ", us / LAYERS);
                }
            }
        printf("\n");
    }
    s_wg_early = 1;
    printf("\n");
    double floor_us = 0;
    for (int k = 0; k < N_G; k++)
        floor_us += (double)s_g[k].in * s_g[k].out * 2 / bw / 1e3;
    printf("\nchain of 32 layers, µs a layer (the weights' floor %.1f; gaps %.1f + %.1f + %.1f + %.1f)\n", floor_us,
           s_g[0].gap_us, s_g[1].gap_us, s_g[2].gap_us, s_g[3].gap_us);
    for (int T : s_ts) {
        printf("T=%d:", T);
        for (int v = 0; v < N_V; v++)
            if (s_fits(v, T))
                printf("  %s %.1f alone, %.1f with gaps", s_names[v], s_chain(v, w, y, x, T, false, st),
                   s_chain(v, w, y, x, T, true, st));
        printf("\n");
    }
    printf("SiLU·mul in gate_up's epilogue (no gap before down), with gaps:");
    for (int T : {1, 2})
        printf("  T=%d gemv %.1f, gemv_glu %.1f, gemv_glu2 %.1f", T, s_chain(V_GEMV, w, y, x, T, true, st),
               s_chain(V_GEMV, w, y, x, T, true, st, 1), s_chain(V_GEMV, w, y, x, T, true, st, 2));
    printf("\n");
    printf("the prefetch, bytes a GEMM asks of L2 (gemv_r1, T=1, with gaps):");
    for (long mb : {2, 4, 8, 16, 32}) {
        s_pf_total = mb << 20;
        printf("  %ld MB %.1f", mb, s_chain(V_R1, w, y, x, 1, true, st));
    }
    printf("\n");
    return dev_end();
}
