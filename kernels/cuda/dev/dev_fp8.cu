/*  kernels/cuda/dev/dev_fp8.cu — the FP8 (W8A8) projection at decode: y = (xq · wᵀ) ·
    x_scale[t] · w_scale[o], E4M3 codes in, fp32 out. Every version validated against the CPU
    reference (ls_matmul_fp8_forward), then timed (dev_common.cuh's method) on Llama-3-8B's
    four projections at T = 1 .. 64 tokens.

    Bytes counted: the weights, in x out (x and y are < 1% of them up to T = 64). Each shape
    rotates over enough weight sets to exceed L2 (>= 256 MB), so the weights come from
    memory as in a decode step.

    Versions:
      lt      engine/fp8_gemm.cu on cuBLASLt alone (ls_fp8_gemm_allow(outer 1, small 0,
              tc 0)): the FP8 GEMM, then ls_cu_fp8_scale where it applies no scales itself
              (production past LS_FP8_TC_T tokens);
      small   ls_cu_fp8_gemm_small, a warp per 4 rows on CUDA cores, scales and bias in its
              epilogue (production up to LS_FP8_SMALL_T where tc does not run: sm_80);
      r2, r8  the same kernel with 2 and 8 rows a warp (8: at most 4 tokens a pass);
      tc      ls_cu_fp8_gemm_tc: mma.sync m16n8k32 E4M3 tensor cores on gemv_mma.cuh's
              stream (16 rows a block, K split over its 4 warps, the weights read 512 bytes of
              a row an instruction and turned into fragments through shared memory, the first
              segment loaded before the programmatic wait), up to 16 tokens a pass
              (production up to LS_FP8_TC_T on sm_89+);
      frag    tried, not kept: the same mmas with the weights read straight into fragments
              (lane (g, c) 16 bytes of rows g and g + 8: 64 bytes of each of 8 rows an
              instruction), 8 warps a block splitting K by 64-code chunks, up to 64 tokens
              a pass, everything after the wait (in % 64 == 0);
      wgMK    tried, not kept (README.md): warpgroup MMA m64nNk32 E4M3 (sm_90a), a CTA an
              SM, stream-K over units of a row tile of M m64 tiles x K 128-code blocks, the
              weights and the tokens' codes through a cp.async ring the warpgroup issues
              (wg12, wg14, wg22);
      wsMK    the same warp-specialized: a producer warp issues the ring by TMA (ws12, ws14,
              ws22).

    Then a layer's four projections summed per T, the fastest version at each T, and the
    largest T up to which small and tc win over lt at every T: the values LS_FP8_SMALL_T and
    LS_FP8_TC_T (engine/fp8_gemm.h) should take.

    Usage: dev_fp8. Exit 1 if a version fails its check.
*/
#include "../fp8.cu"
#include "../wgmma.cuh"

#include "dev_common.cuh"
#include "dev_streamk.cuh"
#include "dev_tma.cuh"

#include "fp8_gemm.h"

extern "C" {
#include "ops.h"
#include "safetensors.h" // ls_e4m3_to_f32
}

enum { TMAX = 64, N_T = 7, N_V = 12, N_SHAPES = 4, V_TC = 4, V_FRAG = 11 };
static const int s_ts[N_T] = {1, 2, 4, 8, 16, 32, 64};
static const char *s_names[N_V] = {"lt", "small", "r2", "r8", "tc", "wg12", "wg14", "wg22", "ws12", "ws14", "ws22", "frag"};
static const int s_kb[N_V] = {0, 0, 0, 0, 0, 2, 4, 2, 2, 4, 2, 0}; // the wg forms' units: in % (128 KB) == 0
static const struct {
    const char *name;
    int in, out;
} s_shapes[N_SHAPES] = {{"qkv", 4096, 6144}, {"o", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}};

// One problem: the weights' sets (codes and row scales), x's codes and scales (TMAX rows), y
struct s_prob_t {
    int in, out, sets;
    uint8_t *w, *xq; // sets x (out, in); (TMAX, in)
    float *ws, *xs, *y;
    std::vector<float> want; // (TMAX, out): the CPU reference on set 0
};

// The kernel with R rows a warp, as many tokens a pass as fit (at most 8, R · NT <= 32)
template <int R>
static cudaError_t s_rows(float *y, const uint8_t *xq, const float *xs, const uint8_t *w, const float *ws, int T,
                          int in, int out, cudaStream_t st) {
    constexpr int NT = 32 / R < S_SMALL_NT ? 32 / R : S_SMALL_NT;
    int rows = S_SMALL_WARPS * R;
    dim3 grid((unsigned)((out + rows - 1) / rows), (unsigned)((T + NT - 1) / NT));
    k_fp8_gemm_small<NT, R, float>
        <<<grid, S_SMALL_WARPS * 32, 0, st>>>(y, xq, xs, w, ws, (const float *)NULL, T, in, out);
    return cudaGetLastError();
}

// ---- tried, not kept: the tensor-core GEMM with its weights straight into fragments ----
//
// A block owns 16 output rows and NTL tiles of 8 tokens (grid y: further groups of 8 · NTL),
// its FR_WARPS warps split K by 64-code chunks. Lane (g = lane / 4, c = lane % 4) reads 16
// codes of rows g and g + 8 and of token g (+ 8j) at k = 16c .. 16c + 15 of a chunk, which
// are its fragments as they are (tc's permutation of k). What tc changed (README.md "FP8
// decode GEMM"): 64 bytes of each of 8 rows an instruction, which HBM streams slower than
// 512 bytes of a row, and no load before the programmatic wait.
enum { FR_WARPS = 8 };

template <int NTL, typename TB>
__global__ void __launch_bounds__(FR_WARPS * 32)
    k_fp8_frag(float *y, const uint8_t *xq, const float *x_scale, const uint8_t *w, const float *w_scale,
               const TB *bias, int T, int in, int out) {
    __shared__ float red[FR_WARPS][NTL * 4][32];
    ls_dep_enter();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    int o0 = blockIdx.x * 16, t0 = blockIdx.y * 8 * NTL;
    const uint4 *w0 = reinterpret_cast<const uint4 *>(w + (size_t)min(o0 + g, out - 1) * in + 16 * c);
    const uint4 *w8 = reinterpret_cast<const uint4 *>(w + (size_t)min(o0 + g + 8, out - 1) * in + 16 * c);
    const uint4 *xr[NTL];
#pragma unroll
    for (int j = 0; j < NTL; j++)
        xr[j] = reinterpret_cast<const uint4 *>(xq + (size_t)min(t0 + 8 * j + g, T - 1) * in + 16 * c);
    float acc[NTL][4] = {};
    const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int n64 = in / 64;
#pragma unroll 2
    for (int ch = warp; ch < n64; ch += FR_WARPS) {
        uint4 a = ls_ld_stream(w0 + 4 * ch), b = ls_ld_stream(w8 + 4 * ch);
        const uint32_t a0[4] = {a.x, b.x, a.y, b.y}, a1[4] = {a.z, b.z, a.w, b.w};
#pragma unroll
        for (int j = 0; j < NTL; j++) {
            uint4 xv = __ldg(xr[j] + 4 * ch);
            float d[4];
            s_mma_e4m3(d, a0, xv.x, xv.y, zero);
            s_mma_e4m3(d, a1, xv.z, xv.w, d);
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[j][e] += d[e];
        }
    }
    ls_gm_reduce<NTL, FR_WARPS>(red, acc, o0, warp, lane, [&](float v, int o, int t) {
        if (o < out && t0 + t < T)
            s_gemm_store(y, v, x_scale, w_scale, bias, t0 + t, o, out);
    });
}

template <int NTL>
static cudaError_t s_frag_ntl(float *y, const uint8_t *xq, const float *xs, const uint8_t *w, const float *ws, int T,
                              int in, int out, cudaStream_t st) {
    dim3 grid((unsigned)((out + 15) / 16), (unsigned)((T + 8 * NTL - 1) / (8 * NTL)));
    return ls_cu_launch_dep(k_fp8_frag<NTL, float>, grid, dim3(FR_WARPS * 32), 0, st, y, xq, xs, w, ws,
                            (const float *)NULL, T, in, out);
}
// the fewest tiles of 8 tokens a pass that cover T (passes of 64 past 64)
static cudaError_t s_frag(float *y, const uint8_t *xq, const float *xs, const uint8_t *w, const float *ws, int T,
                          int in, int out, cudaStream_t st) {
    int ntl = (T + 7) / 8;
    return ntl == 1   ? s_frag_ntl<1>(y, xq, xs, w, ws, T, in, out, st)
           : ntl == 2 ? s_frag_ntl<2>(y, xq, xs, w, ws, T, in, out, st)
           : ntl <= 4 ? s_frag_ntl<4>(y, xq, xs, w, ws, T, in, out, st)
                      : s_frag_ntl<8>(y, xq, xs, w, ws, T, in, out, st);
}

static ls_fp8_gemm_t *s_lt;
static void *s_ws;
static int *s_cnt; // the wg forms' counters, a row tile each
enum { S_WS = 32 << 20, S_TILES = 4096 };

// ---- tried, not kept: the decode-shaped FP8 GEMM on warpgroup MMA (sm_90a; README.md) ----
//
// One warpgroup a CTA, a CTA an SM. The weights are wgmma's A (MT m64 tiles: a row tile of
// BM = 64 · MT rows), the tokens its B (NT columns, T padded up), both E4M3 and K-major
// from shared memory in the 128-byte swizzle (wgmma.cuh), through a ring of S stages, each
// a unit: BM weight rows and the NT token rows over BK = 128 · KB codes. So x moves NT / BM
// of the weights' bytes from L2, where tc's warps re-read it per 16 rows.
//
// Work is split stream-K over the units (dev_streamk.cuh): every CTA moves the same bytes,
// a tile split between CTAs summed by its last one in CTA order. The weights of the first
// stages are asked for before the programmatic wait (no kernel writes them), the tokens'
// rows after it.
//
// Each unit's MMAs start from zero and the unit's sums are added into fp32 registers: the
// tensor cores' own FP8 sums keep fewer bits than fp32 (the promotion tc makes every 64
// codes, here every 128 · KB). The epilogue rounds as ls_matmul_fp8_forward: (acc ·
// x_scale[t]) · w_scale[o] (+ bias).
//
// Two forms: `wg` (k_fp8_gemm_wg), the warpgroup issuing every copy itself by cp.async, then
// waiting for its MMAs before the next unit's copies; `ws` (k_fp8_gemm_ws), warp-specialized:
// a fifth warp issues the stages by TMA (a box a 128-code block, rows past out and tokens
// past T read as zeros), full and empty mbarriers a stage, and the warpgroup keeps one
// unit's MMAs in flight while it retires the one before.
enum { WG_THREADS = 128, WS_THREADS = WG_THREADS + 32, WG_RING = 200 * 1024 };
// A form's ring: stages of BM weight rows and NT token rows (the tokens' at XO) over BK
// codes, SB bytes a stage, S of them (up to 8 in WG_RING), SMEM bytes of shared memory with
// the 1,024 that let the ring start on a 1,024-byte boundary (the swizzle's atoms)
template <int MT, int NT, int KB> struct s_wg_ring {
    static constexpr int BM = 64 * MT, NR = NT / 2, BK = 128 * KB;
    static constexpr unsigned SB = (unsigned)(BM + NT) * BK, XO = BM * BK;
    static constexpr int S = WG_RING / SB < 8 ? (int)(WG_RING / SB) : 8;
    static constexpr size_t SMEM = (size_t)S * SB + 1024;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) // wgmma.cuh's helpers: the device pass of the sm_90a build
template <int N> __device__ __forceinline__ void s_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// wgmma for unit sums d from the stage at wst (weights) and xst (tokens)
template <int MT, int NT, int KB>
__device__ __forceinline__ void s_wg_mma(float (&d)[MT][NT / 2], unsigned wst, unsigned xst) {
    ls_wg_fence();
#pragma unroll
    for (int ks = 0; ks < KB * 4; ks++) {
        const unsigned off = (ks & 3) * 32, blk = ks >> 2;
        uint64_t db = ls_wg_desc(xst + blk * NT * 128 + off, 16, 1024);
#pragma unroll
        for (int m = 0; m < MT; m++)
            ls_wg_ss<NT, true>(d[m], ls_wg_desc(wst + blk * 64 * MT * 128 + m * 64 * 128 + off, 16, 1024), db,
                               ks > 0);
    }
    ls_wg_commit();
}
// e += d once d's MMAs are waited for
template <int MT, int NR> __device__ __forceinline__ void s_wg_add(float (&e)[MT][NR], float (&d)[MT][NR]) {
#pragma unroll
    for (int m = 0; m < MT; m++) {
        ls_wg_keep(d[m]);
#pragma unroll
        for (int i = 0; i < NR; i++)
            e[m][i] += d[m][i];
    }
}
#endif

// the epilogue's store (dev_sk_flush): scales and bias as tc's, on the rows and tokens that exist
template <typename TB>
__device__ __forceinline__ auto s_wg_store(float *y, const float *x_scale, const float *w_scale, const TB *bias, int T,
                                           int out) {
    return [=](int o, int tt, float v) {
        if (o < out && tt < T)
            s_gemm_store(y, v, x_scale, w_scale, bias, tt, o, out);
    };
}

// y (T, out); xq (T, in) and w (out, in) E4M3 codes, 16-byte aligned, in % (128 · KB) == 0,
// T <= NT; ws: 2 pieces a CTA (2 · G · MT · NT / 2 · 128 floats), cnt: a zero counter a row
// tile. Rows past out and tokens past T read the last one and write nothing.
template <int MT, int NT, int KB, typename TB>
__global__ void __launch_bounds__(WG_THREADS, 1)
    k_fp8_gemm_wg(float *y, const uint8_t *xq, const float *x_scale, const uint8_t *w,
                  const float *w_scale, const TB *bias, int T, int in, int out, float *ws,
                  int *cnt) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using R = s_wg_ring<MT, NT, KB>;
    static_assert(R::S >= 3, "stages");
    extern __shared__ uint4 s_ring[];
    __shared__ int s_last;
    const int tid = threadIdx.x;
    const dev_sk_t sp = dev_sk_split(in / R::BK, (out + R::BM - 1) / R::BM);
    const auto store = s_wg_store(y, x_scale, w_scale, bias, T, out);
    const unsigned base = ((unsigned)__cvta_generic_to_shared(s_ring) + 1023u) & ~1023u;
    // rows of a unit into a stage: 16-byte chunk cc of row r (of KB blocks of 128 codes) at
    // block cc / 8 of the stage's tile, swizzled within its row
    auto copy = [&](unsigned dst, int rows, const uint8_t *src, int r0, int last, int k0) {
        for (int f = tid; f < rows * 8 * KB; f += WG_THREADS) {
            int r = f / (8 * KB), cc = f % (8 * KB), ch = cc & 7;
            ls_cp16(dst + (cc >> 3) * rows * 128 + r * 128 + ((ch ^ (r & 7)) << 4),
                    src + (size_t)min(r0 + r, last) * in + k0 + cc * 16, 16);
        }
    };
    auto issue_w = [&](int u, int slot) {
        if (u < sp.u1) {
            int t = u / sp.KC;
            copy(base + slot * R::SB, R::BM, w, t * R::BM, out - 1, (u - t * sp.KC) * R::BK);
        }
    };
    auto issue_x = [&](int u, int slot) {
        if (u < sp.u1)
            copy(base + slot * R::SB + R::XO, NT, xq, 0, T - 1, (u % sp.KC) * R::BK);
    };
    for (int s = 0; s < R::S - 1; s++)
        issue_w(sp.u0 + s, s);
    ls_cp_commit();
    ls_dep_enter();
    for (int s = 0; s < R::S - 1; s++) {
        issue_x(sp.u0 + s, s);
        ls_cp_commit();
    }
    float d[MT][R::NR], e[MT][R::NR]; // the unit's sums (tensor cores), the piece's (fp32)
    dev_sk_zero(d), dev_sk_zero(e);
    const int n = sp.u1 - sp.u0;
    int seg0 = sp.u0, slot = 0, next = R::S - 1; // next: the slot of unit j + S - 1
    for (int j = 0; j < n; j++) {
        ls_cp_wait<R::S - 2>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        issue_w(sp.u0 + j + R::S - 1, next);
        issue_x(sp.u0 + j + R::S - 1, next);
        ls_cp_commit();
        s_wg_mma<MT, NT, KB>(d, base + (unsigned)slot * R::SB, base + (unsigned)slot * R::SB + R::XO);
        ls_wg_wait0();
        s_wg_add(e, d);
        slot = slot + 1 == R::S ? 0 : slot + 1;
        next = next + 1 == R::S ? 0 : next + 1;
        const int u = sp.u0 + j;
        if (u % sp.KC == sp.KC - 1 || j == n - 1) {
            dev_sk_flush(e, sp, u / sp.KC, seg0, u + 1, ws, cnt, s_last, store);
            seg0 = u + 1;
            dev_sk_zero(e);
        }
    }
    ls_cp_wait<0>();
#endif
}

// The same, warp-specialized (see above): warps 0-3 the MMAs, warp 4 the TMA copies.
template <int MT, int NT, int KB, typename TB>
__global__ void __launch_bounds__(WS_THREADS, 1)
    k_fp8_gemm_ws(float *y, const float *x_scale, const float *w_scale, const TB *bias, int T, int in, int out,
                  float *ws, int *cnt, const __grid_constant__ CUtensorMap wmap,
                  const __grid_constant__ CUtensorMap xmap) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using R = s_wg_ring<MT, NT, KB>;
    static_assert(R::S >= 2, "stages");
    extern __shared__ uint4 s_ring[];
    __shared__ int s_last;
    __shared__ alignas(8) uint64_t s_full[R::S], s_empty[R::S]; // a stage landed; a stage read
    const int tid = threadIdx.x;
    const dev_sk_t sp = dev_sk_split(in / R::BK, (out + R::BM - 1) / R::BM);
    const auto store = s_wg_store(y, x_scale, w_scale, bias, T, out);
    const int n = sp.u1 - sp.u0;
    const unsigned base = ((unsigned)__cvta_generic_to_shared(s_ring) + 1023u) & ~1023u;
    const unsigned full0 = (unsigned)__cvta_generic_to_shared(s_full);
    const unsigned empty0 = (unsigned)__cvta_generic_to_shared(s_empty);
    if (tid == 0) {
        for (int i = 0; i < R::S; i++) {
            dev_mb_init(full0 + 8 * i, 1);
            dev_mb_init(empty0 + 8 * i, WG_THREADS / 32); // a warp's lane 0 each
        }
        dev_mb_fence_init();
    }
    __syncthreads();
    if (tid >= WG_THREADS) { // the producer: one thread issues every stage
        if (tid == WG_THREADS) {
            auto issue = [&](int j, bool wts, bool toks) {
                const int u = sp.u0 + j, t = u / sp.KC, k0 = (u - t * sp.KC) * R::BK, slot = j % R::S;
                const unsigned dst = base + slot * R::SB, mb = full0 + 8 * slot;
                if (wts) {
                    dev_mb_expect(mb, R::SB);
#pragma unroll
                    for (int cb = 0; cb < KB; cb++)
                        dev_tma_2d(dst + cb * R::BM * 128, &wmap, k0 + 128 * cb, t * R::BM, mb);
                }
                if (toks)
#pragma unroll
                    for (int cb = 0; cb < KB; cb++)
                        dev_tma_2d(dst + R::XO + cb * NT * 128, &xmap, k0 + 128 * cb, 0, mb);
            };
            const int first = n < R::S ? n : R::S;
            for (int j = 0; j < first; j++)
                issue(j, true, false);
            ls_dep_wait();
            for (int j = 0; j < first; j++)
                issue(j, false, true);
            for (int j = R::S; j < n; j++) {
                dev_mb_wait(empty0 + 8 * (j % R::S), (unsigned)(j / R::S - 1) & 1);
                issue(j, true, true);
            }
        }
        return;
    }
    ls_dep_enter();
    float d0[MT][R::NR], d1[MT][R::NR], e[MT][R::NR]; // two units' sums in flight, the piece's (fp32)
    dev_sk_zero(d0), dev_sk_zero(d1), dev_sk_zero(e);
    int seg0 = sp.u0;
    auto mma = [&](float(&d)[MT][R::NR], int j) {
        const int slot = j % R::S;
        dev_mb_wait(full0 + 8 * slot, (unsigned)(j / R::S) & 1);
        s_wg_mma<MT, NT, KB>(d, base + (unsigned)slot * R::SB, base + (unsigned)slot * R::SB + R::XO);
    };
    // unit j's MMAs waited for: its stage back to the producer, its sums into the piece's,
    // the tile out where the unit ends one (or the CTA's units)
    auto retire = [&](float(&d)[MT][R::NR], int j) {
        s_wg_add(e, d);
        if ((tid & 31) == 0)
            dev_mb_arrive(empty0 + 8 * (j % R::S));
        const int u = sp.u0 + j;
        if (u % sp.KC == sp.KC - 1 || j == n - 1) {
            dev_sk_flush(e, sp, u / sp.KC, seg0, u + 1, ws, cnt, s_last, store);
            seg0 = u + 1;
            dev_sk_zero(e);
        }
    };
    for (int j = 0; j < n; j++) {
        if (j & 1) {
            mma(d1, j);
            s_wg_wait<1>();
            retire(d0, j - 1);
        } else {
            mma(d0, j);
            if (j > 0) {
                s_wg_wait<1>();
                retire(d1, j - 1);
            }
        }
    }
    ls_wg_wait0();
    if ((n - 1) & 1)
        retire(d1, n - 1);
    else
        retire(d0, n - 1);
#endif
}

// Launches kernel K of ring R with `threads` a CTA: its shared memory limit raised, a CTA an
// SM of the target (sms, 0: all), at most a CTA a unit
template <auto K, typename R, typename... A>
static cudaError_t s_wg_launch(int threads, int in, int out, int sms, cudaStream_t stream, A... args) {
    cudaError_t e = dev_smem_attr<K>(R::SMEM);
    if (e != cudaSuccess)
        return e;
    long units = (long)((out + R::BM - 1) / R::BM) * (in / R::BK);
    int all = ls_cu_props()->sms, g = sms > 0 && sms < all ? sms : all;
    return ls_cu_launch_dep(K, dim3((unsigned)(units < g ? units : g)), dim3(threads), R::SMEM, stream, args...);
}

template <int MT, int NT, int KB, typename TB>
static cudaError_t s_gemm_wg(float *y, const uint8_t *xq, const float *x_scale, const uint8_t *w,
                             const float *w_scale, const TB *bias, int T, int in, int out,
                             int sms, float *ws, int *cnt, cudaStream_t stream) {
    return s_wg_launch<k_fp8_gemm_wg<MT, NT, KB, TB>, s_wg_ring<MT, NT, KB>>(
        WG_THREADS, in, out, sms, stream, y, xq, x_scale, w, w_scale, bias, T, in, out, ws, cnt);
}

template <int MT, int NT, int KB, typename TB>
static cudaError_t s_gemm_ws(float *y, const uint8_t *xq, const float *x_scale, const uint8_t *w,
                             const float *w_scale, const TB *bias, int T, int in, int out,
                             int sms, float *ws, int *cnt, cudaStream_t stream) {
    using R = s_wg_ring<MT, NT, KB>;
    CUtensorMap wm = {}, xm = {};
    cudaError_t e = dev_tmap(&wm, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, in, out, R::BM);
    if (e == cudaSuccess)
        e = dev_tmap(&xm, xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, in, T, NT);
    if (e != cudaSuccess)
        return e;
    return s_wg_launch<k_fp8_gemm_ws<MT, NT, KB, TB>, R>(WS_THREADS, in, out, sms, stream, y, x_scale, w_scale,
                                                        bias, T, in, out, ws, cnt, wm, xm);
}

// the tokens' columns a launch pads T to
static int s_wg_nt(int T) {
    return T <= 8 ? 8 : T <= 16 ? 16 : T <= 32 ? 32 : 64;
}

// the wg form (WS: the ws form) with MT m64 tiles a row tile and KB 128-code blocks a unit
template <int MT, int KB, bool WS>
static cudaError_t s_wg(float *y, const uint8_t *xq, const float *xs, const uint8_t *w, const float *ws, int T,
                        int in, int out, cudaStream_t st) {
    float *p = (float *)s_ws;
    auto run = [&](auto nt) {
        constexpr int NT = decltype(nt)::value;
        return WS ? s_gemm_ws<MT, NT, KB, float>(y, xq, xs, w, ws, NULL, T, in, out, 0, p, s_cnt, st)
                  : s_gemm_wg<MT, NT, KB, float>(y, xq, xs, w, ws, NULL, T, in, out, 0, p, s_cnt, st);
    };
    switch (s_wg_nt(T)) {
    case 8: return run(std::integral_constant<int, 8>());
    case 16: return run(std::integral_constant<int, 16>());
    case 32: return run(std::integral_constant<int, 32>());
    default: return run(std::integral_constant<int, 64>());
    }
}

static cudaError_t s_run(const s_prob_t &p, int v, int T, long i, cudaStream_t st) {
    int set = (int)(i % p.sets);
    const uint8_t *w = p.w + (size_t)set * p.out * p.in;
    const float *ws = p.ws + (size_t)set * p.out;
    switch (v) {
    case 0:
        return ls_fp8_gemm_run(s_lt, p.y, p.xq, p.xs, w, ws, NULL, -1, T, p.in, p.out, 0, s_ws, S_WS, st) == 0
                   ? cudaSuccess
                   : cudaErrorUnknown;
    case 1: return ls_cu_fp8_gemm_small(p.y, p.xq, p.xs, w, ws, NULL, LS_CU_F32, T, p.in, p.out, st);
    case 2: return s_rows<2>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 3: return s_rows<8>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case V_TC: return ls_cu_fp8_gemm_tc(p.y, p.xq, p.xs, w, ws, NULL, LS_CU_F32, T, p.in, p.out, st);
    case 5: return s_wg<1, 2, false>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 6: return s_wg<1, 4, false>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 7: return s_wg<2, 2, false>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 8: return s_wg<1, 2, true>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 9: return s_wg<1, 4, true>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    case 10: return s_wg<2, 2, true>(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    default: return s_frag(p.y, p.xq, p.xs, w, ws, T, p.in, p.out, st);
    }
}

// E4M3 codes of uniform values in [-a, a), rows x cols, quantized per row as production does
static void s_codes(dev_rng_t &r, int rows, int cols, float a, std::vector<uint8_t> &q, std::vector<float> &s) {
    std::vector<float> v((size_t)rows * cols);
    for (auto &e : v)
        e = r.uniform(-a, a);
    q.resize(v.size());
    s.resize(rows);
    ls_fp8_quantize_rows(q.data(), s.data(), v.data(), rows, cols);
}

static s_prob_t s_prob_new(dev_rng_t &r, int in, int out, size_t min_bytes) {
    s_prob_t p;
    p.in = in, p.out = out;
    size_t wb = (size_t)in * out;
    p.sets = (int)std::max<size_t>(1, (min_bytes + wb - 1) / wb);
    DEV_CK(cudaMalloc(&p.w, wb * p.sets));
    DEV_CK(cudaMalloc(&p.ws, (size_t)out * p.sets * 4));
    DEV_CK(cudaMalloc(&p.xq, (size_t)TMAX * in));
    DEV_CK(cudaMalloc(&p.xs, TMAX * 4));
    DEV_CK(cudaMalloc(&p.y, (size_t)TMAX * out * 4));
    std::vector<uint8_t> q, xq;
    std::vector<float> s, xs;
    std::vector<float> w0, x0;
    s_codes(r, TMAX, in, 1.0f, xq, xs);
    DEV_CK(cudaMemcpy(p.xq, xq.data(), xq.size(), cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(p.xs, xs.data(), TMAX * 4, cudaMemcpyHostToDevice));
    s_codes(r, out, in, 0.1f, q, s);
    DEV_CK(cudaMemcpy(p.w, q.data(), wb, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(p.ws, s.data(), (size_t)out * 4, cudaMemcpyHostToDevice));
    // the other sets are set 0's bytes at other addresses: enough for L2, and no host
    // quantization of another 256 MB
    for (int k = 1; k < p.sets; k++) {
        DEV_CK(cudaMemcpy(p.w + k * wb, p.w, wb, cudaMemcpyDeviceToDevice));
        DEV_CK(cudaMemcpy(p.ws + (size_t)k * out, p.ws, (size_t)out * 4, cudaMemcpyDeviceToDevice));
    }
    // the reference: set 0 against all TMAX rows (the first T rows at each T)
    w0.resize(wb), x0.resize(xq.size());
    for (size_t e = 0; e < wb; e++)
        w0[e] = ls_e4m3_to_f32(q[e]);
    for (size_t e = 0; e < xq.size(); e++)
        x0[e] = ls_e4m3_to_f32(xq[e]);
    p.want.resize((size_t)TMAX * out);
    ls_matmul_fp8_forward(p.want.data(), x0.data(), xs.data(), NULL, w0.data(), s.data(), NULL, TMAX, in, out);
    return p;
}

static void s_prob_free(s_prob_t &p) {
    cudaFree(p.w), cudaFree(p.ws), cudaFree(p.xq), cudaFree(p.xs), cudaFree(p.y);
}

// The versions from v0 on, on set 0 at T tokens, against the reference's first T rows
static void s_validate(const s_prob_t &p, const char *name, int T, int v0, cudaStream_t st) {
    std::vector<float> got((size_t)T * p.out);
    for (int v = v0; v < N_V; v++) {
        if ((s_kb[v] && p.in % (128 * s_kb[v])) || (v == V_FRAG && p.in % 64))
            continue;
        DEV_CK(cudaMemset(p.y, 0xff, (size_t)TMAX * p.out * 4)); // NaN: a row not written fails
        DEV_CK(s_run(p, v, T, 0, st));
        DEV_CK(cudaMemcpy(got.data(), p.y, got.size() * 4, cudaMemcpyDeviceToHost));
        char what[64];
        snprintf(what, sizeof what, "%s T=%d", name, T);
        // lt: Hopper's FP8 tensor cores sum with ~14 bits (test_gpu_ops matmul_fp8); the
        // CUDA-core versions sum the same exact products in fp32, in another order; tc sums
        // 64 products on the tensor cores, the rest in fp32 (its NMSE tells how many bits
        // the tensor cores keep); the wg forms sum 128 KB products there
        dev_check(what, s_names[v], dev_nmse(got.data(), p.want.data(), got.size()),
                  v == 0 || v >= V_TC ? 1e-6 : 1e-10);
    }
}

int main() {
    cudaStream_t st;
    double bw = dev_begin("dev_fp8", "E4M3 x E4M3 -> fp32, per-token and per-row scales", &st);
    char err[256];
    if (!(s_lt = ls_fp8_gemm_new(err, sizeof err))) {
        fprintf(stderr, "dev_fp8: %s\n", err);
        return 2;
    }
    ls_fp8_gemm_allow(s_lt, 1, 0, 0);
    DEV_CK(cudaMalloc(&s_ws, S_WS));
    DEV_CK(cudaMalloc(&s_cnt, S_TILES * sizeof(int)));
    DEV_CK(cudaMemset(s_cnt, 0, S_TILES * sizeof(int)));
    dev_rng_t rng = {7};

    // the tails first: rows past out (out % 16 != 0, and a warp's last rows), token passes
    // with lanes past T; not lt, whose y rows cuBLASLt wants 16-byte aligned
    {
        s_prob_t p = s_prob_new(rng, 192, 37, 0);
        for (int T : {1, 3, 5, 7, 9, 13, 37, 64})
            s_validate(p, "192x37", T, 1, st);
        s_prob_free(p);
        // tc's partial segments: rows of 1,040 codes (65 chunks of 16: three segments, the
        // last of one chunk, all the last warp's) and of 208 (shorter than a 64-code mma pair)
        for (int in : {1040, 208}) {
            s_prob_t r = s_prob_new(rng, in, 53, 0);
            for (int T : {1, 6, 11, 16, 21})
                s_validate(r, in == 208 ? "208x53" : "1040x53", T, 1, st);
            s_prob_free(r);
        }
        // the wg forms': a row tile past out, tiles split over more CTAs than units a tile, one unit
        s_prob_t q = s_prob_new(rng, 2048, 200, 0);
        for (int T : {1, 9, 17, 33, 64})
            s_validate(q, "2048x200", T, 1, st);
        s_prob_free(q);
        s_prob_t o = s_prob_new(rng, 512, 8000, 0);
        for (int T : {3, 40})
            s_validate(o, "512x8000", T, 1, st);
        s_prob_free(o);
    }

    double layer[N_T][N_V] = {};
    for (int k = 0; k < N_SHAPES; k++) {
        int in = s_shapes[k].in, out = s_shapes[k].out;
        s_prob_t p = s_prob_new(rng, in, out, (size_t)256 << 20);
        double bytes = (double)in * out;
        printf("\n%s (in %d, out %d): %.1f MB of weights, %d sets\n", s_shapes[k].name, in, out, bytes / 1e6, p.sets);
        for (int T : s_ts)
            s_validate(p, s_shapes[k].name, T, 0, st);
        printf("%-4s", "T");
        for (int v = 0; v < N_V; v++)
            printf(" | %7s %6s %6s", s_names[v], "GB/s", "%copy");
        printf(" | lt/small\n");
        for (int j = 0; j < N_T; j++) {
            int T = s_ts[j];
            double us[N_V];
            for (int v = 0; v < N_V; v++) {
                us[v] = dev_time_us(st, 50, [&](long i) { return s_run(p, v, T, i, st); });
                layer[j][v] += us[v];
            }
            printf("%-4d", T);
            for (int v = 0; v < N_V; v++)
                printf(" | %7.1f %6.0f %5.1f%%", us[v], bytes / us[v] / 1e3, 100.0 * bytes / us[v] / 1e3 / bw);
            printf(" | %6.2f\n", us[0] / us[1]);
        }
        s_prob_free(p);
    }

    // a layer's four projections: where small and tc stop winning over lt
    printf("\nA layer's four projections (us):\n%-4s", "T");
    for (int v = 0; v < N_V; v++)
        printf(" %8s", s_names[v]);
    printf("  lt/small  lt/tc  fastest\n");
    int upto[N_V] = {};
    bool wins[N_V];
    for (int v = 0; v < N_V; v++)
        wins[v] = true;
    for (int j = 0; j < N_T; j++) {
        printf("%-4d", s_ts[j]);
        for (int v = 0; v < N_V; v++)
            printf(" %8.1f", layer[j][v]);
        int best = 0;
        for (int v = 1; v < N_V; v++)
            best = layer[j][v] < layer[j][best] ? v : best;
        printf("  %8.2f %6.2f  %s\n", layer[j][0] / layer[j][1], layer[j][0] / layer[j][V_TC], s_names[best]);
        for (int v = 1; v < N_V; v++) {
            wins[v] = wins[v] && layer[j][v] < layer[j][0];
            if (wins[v])
                upto[v] = s_ts[j];
        }
    }
    printf("small wins at every T up to %d (LS_FP8_SMALL_T is %d), tc up to %d (LS_FP8_TC_T is %d); between "
           "measured Ts, a crossover lies between that T and the next\n",
           upto[1], LS_FP8_SMALL_T, upto[V_TC], LS_FP8_TC_T);
    ls_fp8_gemm_destroy(&s_lt);
    cudaFree(s_ws);
    cudaFree(s_cnt);
    return dev_end();
}
