/*  kernels/cuda/gemv.cu — the decode GEMM of a few tokens on 16-bit weights (the CUDA
    backend's matmul up to LS_CU_GEMV_MAX_T tokens; cuBLAS past that). CPU reference:
    kernels/cpu/matmul.c ls_matmul_forward on the same bf16/f16 values.

    At a few tokens a GEMM is a stream of its weights, and what costs beyond their bytes is
    the stream's ramp and tail — and, between GEMMs, the small kernels during which memory
    idles. cuBLAS's kernels neither wait nor trigger programmatically, so each of them
    starts only when the kernel before it has ended (and o's and down's add a split-K
    reduction kernel). These are launched with programmatic dependent launch: their blocks
    become resident while the kernel before them (an RMSNorm, attention, SiLU·mul) still
    runs, and before they wait for it they ask for their first weights (the weights are
    written by no kernel of a step), so HBM works through the gap.

    Three forms, by the tokens (s_gemv_t):
    - one token: a warp owns a row and all of K (k_gemv);
    - two tokens: the CUDA cores' split form (k_gemv_split: a block's four warps on a row
      pair, a quarter of K each);
    - 3 to 16 tokens: the tensor cores (k_gemv_mma, below): 16 rows a block, its four warps a
      quarter of K each, the weights read 512 bytes of a row an instruction and turned into
      mma fragments through shared memory.
    The CUDA-core forms: lane l reads the 16-byte chunks l, l + 32, ... of its rows past L1
    (each weight byte is read once) and the same chunks of the tokens' x (a few KB, read by
    every warp: L1 and L2 hits), widens both to fp32 (x in fp32 is first rounded to the
    weights' dtype, as ls_cu_convert rounds it, so the products are the ones cuBLAS would
    take after that pass), sums the exact products in fp32, and a butterfly over the lanes
    gives each (row, token) the warp's sum — in the split form the four warps' sums then meet
    in shared memory, added in warp order — and lane r·NT + t writes y = sum (+ y when
    accumulating) (+ bias), the matmul op's order. One launch: no reduction kernel, no
    conversion pass. Past two tokens the CUDA cores' issue rate, not memory, bounds them (at
    eight the split form's four GEMMs alone 207 against cuBLAS's 169 µs, H100), hence the
    tensor cores there.

    A block loops over its row groups (block b takes groups b, b + grid, ...): the grid
    covers every group at once unless the caller asks it to leave SMs to the kernels beside
    it (sms, as cuBLAS's SM count target).

    Measured (kernels/cuda/dev/dev_gemv.cu and README.md there, H100): a chain of 32 layers of
    Llama-3-8B's four projections after gap kernels as long as a batch-1 step's small
    kernels, µs a layer (the weights' floor 144.8): cuBLAS 181-186 at 1-16 tokens; k_gemv
    164.4 at one token; k_gemv_mma 163.8 at four (the split CUDA-core form 173.5), 165.7 at
    eight (cuBLAS 183.1), 177.5 at sixteen (cuBLAS 185.1). Past 16 tokens every block reads all
    of x (T · K · 2 bytes for 16 rows), more than the weights' bytes from 32 tokens on, and
    cuBLAS keeps them.
*/
#include <assert.h>

#include "common.cuh"
#include "gemv_mma.cuh"

enum { GV_WARPS = 4 };

// two 16-bit values of the weights' dtype in a word, widened
__device__ __forceinline__ float2 s_w2(unsigned v, __nv_bfloat16) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}
__device__ __forceinline__ float2 s_w2(unsigned v, __half) {
    __half2 h = *reinterpret_cast<__half2 *>(&v);
    return __half22float2(h);
}

// 8 elements of x at p as the weights' dtype TW would hold them, widened: 16-bit x as they
// are, fp32 x rounded to TW first
template <typename TW> __device__ __forceinline__ void s_x8(const TW *p, float (&o)[8]) {
    ls_load8(p, o);
}
template <typename TW> __device__ __forceinline__ void s_x8(const float *p, float (&o)[8]) {
    ls_load8(p, o);
#pragma unroll
    for (int k = 0; k < 8; k++)
        o[k] = ls_to_f(ls_from_f<TW>(o[k]));
}

// A warp's share of R rows from o0: its sums over chunks [c0, c1) of 8 elements of K for the
// NT tokens, in every lane (rows past out read the last one)
template <int NT, int R, typename TW, typename TX>
__device__ __forceinline__ void s_gemv_sums(float (&v)[R][NT], const TX *const (&xr)[NT],
                                            const TW *w, int in, int out, int o0, int c0, int c1,
                                            int lane) {
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = reinterpret_cast<const uint4 *>(w + (size_t)min(o0 + r, out - 1) * in);
    float acc[R][NT] = {};
#pragma unroll 4
    for (int c = c0 + lane; c < c1; c += 32) {
        uint4 wv[R];
        float xv[NT][8];
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[r] = ls_ld_stream(wr[r] + c);
#pragma unroll
        for (int t = 0; t < NT; t++)
            s_x8<TW>(xr[t] + 8 * c, xv[t]);
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                unsigned word = k == 0 ? wv[r].x : k == 1 ? wv[r].y : k == 2 ? wv[r].z : wv[r].w;
                float2 wf = s_w2(word, TW());
#pragma unroll
                for (int t = 0; t < NT; t++)
                    acc[r][t] = fmaf(wf.y, xv[t][2 * k + 1], fmaf(wf.x, xv[t][2 * k], acc[r][t]));
            }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            v[r][t] = ls_warp_sum(acc[r][t]);
}

// y[t][o] = v (+ y[t][o] when accumulating) (+ bias[o]), the matmul op's order
__device__ __forceinline__ void s_gemv_put(float *y, float v, int t, int o, int out,
                                           int accumulate, const void *bias,
                                           ls_cu_dtype_t bias_dt) {
    float *yp = y + (size_t)t * out + o;
    if (accumulate)
        v = __fadd_rn(*yp, v);
    if (bias)
        v = __fadd_rn(v, ls_bias_at(bias, bias_dt, o));
    *yp = v;
}

// The R rows from o0 of a warp over all of K (k_gemv): their sums, written by lanes r·NT + t
template <int NT, int R, typename TW, typename TX>
__device__ __forceinline__ void s_gemv_rows(float *y, const TX *const (&xr)[NT], const TW *w,
                                            const void *bias, ls_cu_dtype_t bias_dt, int T,
                                            int in, int out, int accumulate, int o0, int lane) {
    float sums[R][NT];
    s_gemv_sums<NT, R>(sums, xr, w, in, out, o0, 0, in / 8, lane);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == r * NT + t && o0 + r < out && t < T)
                s_gemv_put(y, sums[r][t], t, o0 + r, out, accumulate, bias, bias_dt);
}

// y (T, out) (+)= x (T, in) · w (out, in)ᵀ (+ bias); in % 8 == 0, w's and x's rows 16-byte
// aligned. A block is GV_WARPS warps of R rows each, and takes the groups of GV_WARPS · R
// rows blockIdx.x, + gridDim.x, ... (a grid smaller than the groups leaves SMs' room to
// the LoRA kernels beside it). Rows past out and tokens past T read the last one (no
// branch in the loop) and write nothing. pf: bytes of each of its first rows asked of L2
// before the wait (a multiple of 128).
template <int NT, int R, typename TW, typename TX>
__global__ void __launch_bounds__(GV_WARPS * 32)
    k_gemv(float *y, const TX *x, const TW *w, const void *bias, ls_cu_dtype_t bias_dt, int T,
           int in, int out, int accumulate, int pf) {
    static_assert(NT * R <= 32, "a warp's sums land one a lane");
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    ls_prefetch_rows(w, in, out, (blockIdx.x * GV_WARPS + warp) * R, R, pf, lane, 32);
    ls_dep_enter();
    const TX *xr[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        xr[t] = x + (size_t)min(t, T - 1) * in;
    for (int o0 = (blockIdx.x * GV_WARPS + warp) * R; o0 < out; o0 += gridDim.x * GV_WARPS * R)
        s_gemv_rows<NT, R>(y, xr, w, bias, bias_dt, T, in, out, accumulate, o0, lane);
}

// k_gemv with a block's GV_WARPS warps on the same R rows, a quarter of K each (the last
// takes the rest): the four sums of each (row, token) meet in shared memory and warp 0's
// lanes r·NT + t add them in warp order and write y as k_gemv does. The block takes rows
// blockIdx.x · R, then gridDim.x · R further, ... Each warp asks L2 for its share of the
// pf bytes of each row (its lines dealt among the warps) at the start of its quarter.
template <int NT, int R, typename TW, typename TX>
__global__ void __launch_bounds__(GV_WARPS * 32)
    k_gemv_split(float *y, const TX *x, const TW *w, const void *bias, ls_cu_dtype_t bias_dt,
                 int T, int in, int out, int accumulate, int pf) {
    static_assert(NT * R <= 32, "the sums land one a lane");
    __shared__ float part[GV_WARPS][R * NT];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int n8 = in / 8, per = n8 / GV_WARPS, c0 = warp * per;
    int c1 = warp == GV_WARPS - 1 ? n8 : c0 + per;
    {
        int lines = pf >> 7, mine = lines / GV_WARPS + (warp < lines % GV_WARPS);
        int room = (c1 - c0) * 8 * (int)sizeof(TW) / 128; // not past its quarter
        ls_prefetch_rows(w + (size_t)c0 * 8, in, out, blockIdx.x * R, R,
                         (mine < room ? mine : room) * 128, lane, 32);
    }
    ls_dep_enter();
    const TX *xr[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        xr[t] = x + (size_t)min(t, T - 1) * in;
    for (int o0 = blockIdx.x * R; o0 < out; o0 += gridDim.x * R) { // alike for the block's warps
        float sums[R][NT];
        s_gemv_sums<NT, R>(sums, xr, w, in, out, o0, c0, c1, lane);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < NT; t++)
                    part[warp][r * NT + t] = sums[r][t];
        __syncthreads();
        int r = lane / NT, t = lane % NT, o = o0 + r;
        if (warp == 0 && lane < R * NT && o < out && t < T) {
            float v = part[0][lane];
#pragma unroll
            for (int k = 1; k < GV_WARPS; k++)
                v = __fadd_rn(v, part[k][lane]);
            s_gemv_put(y, v, t, o, out, accumulate, bias, bias_dt);
        }
        __syncthreads(); // part is the next rows'
    }
}

// ---- the tensor-core form (3 to 16 tokens) ----
//
// Past a few tokens the CUDA cores' FMAs bound the GEMV, so from three tokens on a block's
// tokens meet the weights on the tensor cores: mma.sync m16n8k16 with 16 weight rows as a and
// 8 tokens as b (NN such tiles for up to 8 · NN tokens), the weights streamed through shared
// memory as gemv_mma.cuh describes (a segment: 256 k of 16 rows).
static_assert(GV_WARPS == GM_WARPS, "one launch shape for every form");

// 16 bytes of x's row at p (8 elements) as TW pairs for a b fragment (fp32 rounded to TW as
// ls_cu_convert rounds), or zeros
template <typename TW> __device__ __forceinline__ uint4 s_gm_x(const TW *p, bool ok) {
    return ok ? __ldg(reinterpret_cast<const uint4 *>(p)) : make_uint4(0, 0, 0, 0);
}
template <typename TW> __device__ __forceinline__ uint4 s_gm_x(const float *p, bool ok) {
    if (!ok)
        return make_uint4(0, 0, 0, 0);
    float4 a = __ldg(reinterpret_cast<const float4 *>(p)),
           b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
    return make_uint4(ls_pack2<TW>(a.x, a.y), ls_pack2<TW>(a.z, a.w), ls_pack2<TW>(b.x, b.y),
                      ls_pack2<TW>(b.z, b.w));
}

// ls_gm_stream's op for 16-bit weights: x's rows (token 8j + g of the lane, past T the last),
// two m16n8k16 a chunk into fp32 c, and y written as the GEMV writes it
template <int NN, typename TW, typename TX> struct s_gm_op {
    float *y;
    const TX *xr[NN];
    const void *bias;
    ls_cu_dtype_t bias_dt;
    int T, out, accumulate;

    __device__ uint4 x(int j, int ci, bool ok) const { return s_gm_x<TW>(xr[j] + 8 * ci, ok); }
    __device__ void mma(float (&c)[4], const uint32_t (&a0)[4], const uint32_t (&a1)[4],
                        uint4 xv) const {
        ls_mma16816<TW>(c, a0, xv.x, xv.y);
        ls_mma16816<TW>(c, a1, xv.z, xv.w);
    }
    __device__ void put(float v, int o, int t) const {
        if (o < out && t < T)
            s_gemv_put(y, v, t, o, out, accumulate, bias, bias_dt);
    }
};

// y (T, out) (+)= x (T, in) · w (out, in)ᵀ (+ bias) for T <= 8 · NN; in % 8 == 0, rows
// 16-byte aligned. The block takes rows blockIdx.x · 16, then gridDim.x · 16 further, ...
template <int NN, typename TW, typename TX>
__global__ void __launch_bounds__(GM_WARPS * 32, 1)
    k_gemv_mma(float *y, const TX *x, const TW *w, const void *bias, ls_cu_dtype_t bias_dt,
               int T, int in, int out, int accumulate) {
    s_gm_op<NN, TW, TX> op{y, {}, bias, bias_dt, T, out, accumulate};
    int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int j = 0; j < NN; j++)
        op.xr[j] = x + (size_t)min(8 * j + g, T - 1) * in;
    ls_gm_stream<NN>(reinterpret_cast<const uint4 *>(w), in / 8, out, op);
}

// The launch of kernel K on blocks of rows rows: sms > 0: the grid capped at what sms SMs
// hold at once, so that the blocks of the kernels beside it find room on the others as this
// one's drain
template <auto K, typename... A>
static cudaError_t s_gemv_launch(long rows, int out, int sms, cudaStream_t stream, A... args) {
    long blocks = (out + rows - 1) / rows;
    if (sms > 0) {
        static int per_sm_of[LS_CU_MAX_DEVICES]; // K's resident blocks an SM, per device
        int &per_sm = per_sm_of[ls_cu_device()];
        if (!per_sm &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, K, GV_WARPS * 32, 0) !=
                cudaSuccess)
            return cudaGetLastError();
        if (blocks > (long)sms * per_sm)
            blocks = (long)sms * per_sm;
    }
    return ls_cu_launch_dep(K, dim3((unsigned)blocks), dim3(GV_WARPS * 32), 0, stream, args...);
}

// SPLIT: k_gemv_split (R rows a block), else k_gemv (GV_WARPS · R rows a block)
template <int NT, int R, bool SPLIT, typename TW, typename TX>
static cudaError_t s_gemv(float *y, const TX *x, const TW *w, const void *bias,
                          ls_cu_dtype_t bias_dt, int T, int in, int out, int accumulate, int sms,
                          long pf_all, cudaStream_t stream) {
    constexpr auto kern = [] { // only the one that runs is instantiated
        if constexpr (SPLIT)
            return k_gemv_split<NT, R, TW, TX>;
        else
            return k_gemv<NT, R, TW, TX>;
    }();
    long pf = ls_prefetch_row_bytes(pf_all, in, sizeof(TW), out);
    return s_gemv_launch<kern>(SPLIT ? R : GV_WARPS * R, out, sms, stream, y, x, w, bias,
                               bias_dt, T, in, out, accumulate, (int)pf);
}

template <int NN, typename TW, typename TX>
static cudaError_t s_gemv_mma(float *y, const TX *x, const TW *w, const void *bias,
                              ls_cu_dtype_t bias_dt, int T, int in, int out, int accumulate,
                              int sms, cudaStream_t stream) {
    return s_gemv_launch<k_gemv_mma<NN, TW, TX>>(GM_ROWS, out, sms, stream, y, x, w, bias,
                                                 bias_dt, T, in, out, accumulate);
}

// One token: a warp a row over all of K (k_gemv, R = 1: the most warps; the LoRA kernels
// beside it run in its long tail). Two: a block's four warps on a row pair, a quarter of K
// each (k_gemv_split; the tensor-core form made batch 2's step 3% slower, H100). Three to
// sixteen: the tensor-core form (k_gemv_mma; on an H100 batch 8's step 10% faster than
// cuBLAS's, batch 4's 4% than k_gemv_split's; on an H200, against cuBLAS in one call, two
// rounds at 128 and 1K cached tokens, batch 4 4.737-4.900 -> 4.610-4.778 ms, batch 8
// 4.769-5.093 -> 4.746-5.003).
template <typename TW, typename TX>
static cudaError_t s_gemv_t(float *y, const TX *x, const TW *w, const void *bias,
                            ls_cu_dtype_t bias_dt, int T, int in, int out, int accumulate,
                            int sms, long pf, cudaStream_t stream) {
    static_assert(LS_CU_GEMV_MAX_T == 16, "a form for each token count");
    if (T == 1)
        return s_gemv<1, 1, false>(y, x, w, bias, bias_dt, T, in, out, accumulate, sms, pf,
                                   stream);
    if (T == 2)
        return s_gemv<2, 2, true>(y, x, w, bias, bias_dt, T, in, out, accumulate, sms, pf,
                                  stream);
    if (T <= GM_TOKENS)
        return s_gemv_mma<1>(y, x, w, bias, bias_dt, T, in, out, accumulate, sms, stream);
    return s_gemv_mma<2>(y, x, w, bias, bias_dt, T, in, out, accumulate, sms, stream);
}

// Past this many bytes of rated memory bandwidth an SM must take a clock (an H100 ~12.8, an
// H200 ~18.8) the tensor-core form's two tiles (9-16 tokens) lose to cuBLAS: on an H200
// (dev_gemv, Llama-3-8B's four projections) alone at 16 tokens 68.6 against 58.7 us for
// gate_up, 35.5 against 32.7 for down, and in the chain of 32 layers with the small kernels'
// gaps 153.8 against 136.3 us a layer, where at 8 tokens it ties (135.6 against 135.4) and
// the step at batch 4 and 8 is 1-3% faster than on cuBLAS. The H200's step on cuBLAS past 8
// tokens (bench_base_cuda --decode-batch, two rounds): batch 12 x 128 5.306 / 5.303 -> 4.977 /
// 4.919 ms, batch 16 x 128 5.473 / 5.492 -> 5.006 / 4.998, x 1K 5.885 / 5.840 -> 5.391 /
// 5.391. On an H100 the chain at 16 tokens is 177.5-177.9 against cuBLAS's 185.1-187.2. The
// rule is the one that once held the CUDA-core GEMV to two tokens on an H200
// (kernels/cuda/dev/README.md "The tensor-core GEMV").
#define S_GEMV_MMA2_MAX_BYTES_PER_CLOCK 15.0

int ls_cu_gemv_tokens(void) {
    double b = ls_cu_props()->mem_bytes_per_sm_clock; // 0: the device does not say
    return b > S_GEMV_MMA2_MAX_BYTES_PER_CLOCK ? GM_TOKENS : LS_CU_GEMV_MAX_T;
}

int ls_cu_gemv_ok(int T, int in, const void *x, ls_cu_dtype_t x_dt, const void *w,
                  ls_cu_dtype_t w_dt) {
    return T >= 1 && T <= LS_CU_GEMV_MAX_T && in % 8 == 0 &&
           (w_dt == LS_CU_BF16 || w_dt == LS_CU_F16) && (x_dt == LS_CU_F32 || x_dt == w_dt) &&
           ((uintptr_t)x | (uintptr_t)w) % 16 == 0;
}

cudaError_t ls_cu_gemv(float *y, const void *x, ls_cu_dtype_t x_dt, const void *w,
                       ls_cu_dtype_t w_dt, const void *bias, ls_cu_dtype_t bias_dt, int T, int in,
                       int out, int accumulate, int sms, long pf, cudaStream_t stream) {
    assert(ls_cu_gemv_ok(T, in, x, x_dt, w, w_dt) && out > 0 && sms >= 0 && pf >= 0);
    typedef __nv_bfloat16 B;
    if (w_dt == LS_CU_BF16)
        return x_dt == LS_CU_F32 ? s_gemv_t(y, (const float *)x, (const B *)w, bias, bias_dt, T,
                                            in, out, accumulate, sms, pf, stream)
                                 : s_gemv_t(y, (const B *)x, (const B *)w, bias, bias_dt, T, in,
                                            out, accumulate, sms, pf, stream);
    return x_dt == LS_CU_F32 ? s_gemv_t(y, (const float *)x, (const __half *)w, bias, bias_dt, T,
                                        in, out, accumulate, sms, pf, stream)
                             : s_gemv_t(y, (const __half *)x, (const __half *)w, bias, bias_dt,
                                        T, in, out, accumulate, sms, pf, stream);
}
