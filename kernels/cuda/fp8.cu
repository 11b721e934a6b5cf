/*  kernels/cuda/fp8.cu — the FP8 (W8A8) kernels around the FP8 GEMM (kernels/ops.h
    ls_fp8_quantize_rows, ls_matmul_fp8_forward): per-token quantization of the GEMM's input,
    and the scales applied after a GEMM that summed without them.

    Every kernel here is launched with ls_cu_launch_dep (common.cuh) and calls ls_dep_enter()
    before it reads anything the kernel before it writes, as the elementwise ones (the
    tensor-core GEMM loads its first weights before: no kernel of a step writes them).

    Bits: common.cuh's ls_fp8_row_scale and ls_fp8_code, the CPU reference's steps. Where
    the op before the GEMM is an RMSNorm or SiLU·mul, that kernel writes the codes itself
    (elementwise.cu) and this pass does not run.

    And the decode-shaped FP8 GEMMs of our own: at a few tokens the GEMM is a stream of the
    weights, which cuBLASLt's FP8 kernels read far below copy bandwidth, and its scales and
    bias go into the same launch. ls_cu_fp8_gemm_tc on the FP8 tensor cores (sm_89+),
    ls_cu_fp8_gemm_small on CUDA cores (any SM, any in % 16 == 0): engine/fp8_gemm.h says
    which runs where.
*/
#include <assert.h>

#include "common.cuh"
#include "gemv_mma.cuh"

enum { S_QUANT_THREADS = 256 };

// One block per row, four values a thread per step (cols % 4 == 0, rows 16-byte aligned):
// the row's amax, then its codes. Decode rows are a few thousand values: the row stays in
// L1 between the two passes. Where a block can hold the row in registers,
// k_fp8_quantize_rows_reg (below) runs instead.
// q is (rows, cols), scale is (rows), x is (rows, cols)
__global__ void k_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int cols) {
    ls_dep_enter();
    __shared__ float part[32];
    const float4 *xr = (const float4 *)(x + (size_t)blockIdx.x * cols);
    uchar4 *qr = (uchar4 *)(q + (size_t)blockIdx.x * cols);
    int n4 = cols / 4;
    float amax = 0.0f;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = xr[i];
        amax = fmaxf(fmaxf(amax, fmaxf(fabsf(v.x), fabsf(v.y))), fmaxf(fabsf(v.z), fabsf(v.w)));
    }
    float s = ls_fp8_row_scale(ls_block_max(amax, part));
    if (threadIdx.x == 0)
        scale[blockIdx.x] = s;
    for (int i = threadIdx.x; i < n4; i += blockDim.x) {
        float4 v = xr[i];
        qr[i] = make_uchar4(ls_fp8_code(v.x, s), ls_fp8_code(v.y, s), ls_fp8_code(v.z, s),
                            ls_fp8_code(v.w, s));
    }
}

// k_fp8_quantize_rows with the row held in registers, EPT values a thread (cols = blockDim.x ·
// EPT): one load a value, all of a thread's in flight at once, the codes from the registers
// (ls_fp8_row_codes). o's input at decode: a block a row, latency-bound.
template <int EPT>
__global__ void __launch_bounds__(1024)
    k_fp8_quantize_rows_reg(uint8_t *q, float *scale, const float *x, int cols) {
    ls_dep_enter();
    __shared__ float part[32];
    size_t row = blockIdx.x;
    float v[EPT], amax = 0.0f;
#pragma unroll
    for (int k = 0; k < EPT / 4; k++) {
        float4 a = *(const float4 *)(x + row * cols + (k * blockDim.x + threadIdx.x) * 4);
        v[4 * k] = a.x, v[4 * k + 1] = a.y, v[4 * k + 2] = a.z, v[4 * k + 3] = a.w;
        amax = fmaxf(fmaxf(amax, fmaxf(fabsf(a.x), fabsf(a.y))), fmaxf(fabsf(a.z), fabsf(a.w)));
    }
    ls_fp8_row_codes(q + row * cols, scale + row, v, amax, part);
}

cudaError_t ls_cu_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int rows, int cols,
                                    cudaStream_t stream) {
    assert(cols > 0 && cols % 4 == 0 && rows >= 0);
    if (rows == 0)
        return cudaSuccess;
    int ept = ls_cu_row_ept(cols);
    if (ept) {
        LS_CU_EPT_DISPATCH(ept, E,
                           ls_cu_launch_dep(k_fp8_quantize_rows_reg<E>, dim3(rows),
                                            dim3(cols / E), 0, stream, q, scale, x, cols));
    } else {
        ls_cu_launch_dep(k_fp8_quantize_rows, dim3(rows), dim3(S_QUANT_THREADS), 0, stream, q,
                         scale, x, cols);
    }
    LS_CU_CHECK_LAUNCH();
}

// y is (T, out), x_scale (T), w_scale (out), bias (out) or NULL. A thread per output
// channel (blockIdx.x) over rows (blockIdx.y, grid-stride): the channel's scale and bias are
// read once, and no element index is divided back into its row and column.
template <typename TB>
__global__ void k_fp8_scale(float *y, const float *x_scale, const float *w_scale,
                            const TB *bias, int T, int out) {
    ls_dep_enter();
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out)
        return;
    float ws = w_scale[o], b = bias ? ls_to_f(bias[o]) : 0.0f;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        size_t k = (size_t)t * out + o;
        float v = __fmul_rn(__fmul_rn(y[k], x_scale[t]), ws);
        y[k] = bias ? __fadd_rn(v, b) : v;
    }
}

cudaError_t ls_cu_fp8_scale(float *y, const float *x_scale, const float *w_scale,
                            const void *bias, ls_cu_dtype_t bias_dt, int T, int out,
                            cudaStream_t stream) {
    if (T == 0 || out == 0)
        return cudaSuccess;
    if (!bias)
        bias_dt = LS_CU_F32;
    dim3 grid((unsigned)(out + 255) / 256, (unsigned)(T < 65535 ? T : 65535));
    LS_CU_DISPATCH(bias_dt, TB,
                   ls_cu_launch_dep(k_fp8_scale<TB>, grid, dim3(256), 0, stream, y, x_scale,
                                    w_scale, (const TB *)bias, T, out));
    LS_CU_CHECK_LAUNCH();
}

// --- the decode-shaped FP8 GEMM -----------------------------------------------------------
//
// A warp owns S_SMALL_ROWS output rows and sums them over all of K for NT tokens: lane l
// reads the rows' 16-byte chunks l, l + 32, ... (16 codes each, past L1: each weight byte is
// read once) and the tokens' chunks at the same k (x is a few KB, read by every warp: L1 and
// L2 hits), widens the codes to fp32 (cvt e4m3x2 -> f16x2 -> 2 x f32, exact) and sums the
// products (exact, as E4M3 values have 4 significant bits) in fp32; then a butterfly over
// the lanes, and the epilogue rounds as ls_matmul_fp8_forward does: (acc · x_scale[t]) ·
// w_scale[o] (+ bias). A warp's NT · S_SMALL_ROWS sums land one a lane.
//
// Per weight byte a lane spends 1.5 instructions widening it, NT FMAs, and 1.5 · NT /
// S_SMALL_ROWS widening x: past NT = 4 the SM's issue rate, not memory, bounds it, which is
// where the tensor cores take over (LS_FP8_SMALL_T, engine/fp8_gemm.h). Out >= 4096
// gives >= 1024 warps, enough bytes in flight on 132 SMs without splitting K.
enum { S_SMALL_ROWS = 4, S_SMALL_WARPS = 4, S_SMALL_NT = 8 };

// the low two E4M3 codes of v as floats
__device__ __forceinline__ float2 s_e4m3x2(unsigned v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return __half22float2(__half2(h));
}

__device__ __forceinline__ unsigned s_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// y[t][o] from the unscaled sum v, rounded as ls_matmul_fp8_forward rounds it: (v ·
// x_scale[t]) · w_scale[o] (+ bias[o])
template <typename TB>
__device__ __forceinline__ void s_gemm_store(float *y, float v, const float *x_scale,
                                             const float *w_scale, const TB *bias, int t, int o,
                                             int out) {
    float s = __fmul_rn(__fmul_rn(v, x_scale[t]), w_scale[o]);
    y[(size_t)t * out + o] = bias ? __fadd_rn(s, ls_to_f(bias[o])) : s;
}

// y (T, out); xq (T, in) and w (out, in) E4M3 codes, rows 16-byte aligned (in % 16 == 0);
// x_scale (T), w_scale (out), bias (out) or NULL. Block: S_SMALL_WARPS warps of R rows each;
// grid (out rows / (warps · R), token groups of NT). Rows past out and tokens past T read
// the last one (no branch in the loop) and write nothing.
template <int NT, int R, typename TB>
__global__ void __launch_bounds__(S_SMALL_WARPS * 32)
    k_fp8_gemm_small(float *y, const uint8_t *xq, const float *x_scale, const uint8_t *w,
                     const float *w_scale, const TB *bias, int T, int in, int out) {
    ls_dep_enter();
    static_assert(NT * R <= 32, "a warp's sums land one a lane");
    int lane = threadIdx.x & 31;
    int o0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R, t0 = blockIdx.y * NT;
    if (o0 >= out)
        return;
    const uint4 *wr[R], *xr[NT];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = reinterpret_cast<const uint4 *>(w + (size_t)min(o0 + r, out - 1) * in);
#pragma unroll
    for (int t = 0; t < NT; t++)
        xr[t] = reinterpret_cast<const uint4 *>(xq + (size_t)min(t0 + t, T - 1) * in);
    float acc[R][NT] = {};
    int n16 = in / 16;
#pragma unroll 2
    for (int c = lane; c < n16; c += 32) {
        uint4 wv[R], xv[NT];
#pragma unroll
        for (int r = 0; r < R; r++)
            wv[r] = ls_ld_stream(wr[r] + c);
#pragma unroll
        for (int t = 0; t < NT; t++)
            xv[t] = __ldg(xr[t] + c);
#pragma unroll
        for (int p = 0; p < 8; p++) { // code pairs
            float2 xf[NT];
#pragma unroll
            for (int t = 0; t < NT; t++)
                xf[t] = s_e4m3x2(s_word(xv[t], p >> 1) >> (16 * (p & 1)));
#pragma unroll
            for (int r = 0; r < R; r++) {
                float2 wf = s_e4m3x2(s_word(wv[r], p >> 1) >> (16 * (p & 1)));
#pragma unroll
                for (int t = 0; t < NT; t++)
                    acc[r][t] = fmaf(wf.y, xf[t].y, fmaf(wf.x, xf[t].x, acc[r][t]));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float v = ls_warp_sum(acc[r][t]);
            int o = o0 + r, tt = t0 + t;
            if (lane == r * NT + t && o < out && tt < T)
                s_gemm_store(y, v, x_scale, w_scale, bias, tt, o, out);
        }
}

template <int NT, typename TB>
static cudaError_t s_gemm_small(float *y, const uint8_t *xq, const float *x_scale,
                                const uint8_t *w, const float *w_scale, const TB *bias, int T,
                                int in, int out, cudaStream_t stream) {
    int rows = S_SMALL_WARPS * S_SMALL_ROWS;
    dim3 grid((unsigned)((out + rows - 1) / rows), (unsigned)((T + NT - 1) / NT));
    return ls_cu_launch_dep(k_fp8_gemm_small<NT, S_SMALL_ROWS, TB>, grid,
                            dim3(S_SMALL_WARPS * 32), 0, stream, y, xq, x_scale, w, w_scale, bias,
                            T, in, out);
}

cudaError_t ls_cu_fp8_gemm_small(float *y, const uint8_t *xq, const float *x_scale,
                                 const uint8_t *w, const float *w_scale, const void *bias,
                                 ls_cu_dtype_t bias_dt, int T, int in, int out,
                                 cudaStream_t stream) {
    assert(T >= 0 && in > 0 && in % 16 == 0 && out > 0);
    assert(((uintptr_t)xq | (uintptr_t)w) % 16 == 0);
    if (T == 0)
        return cudaSuccess;
    if (!bias)
        bias_dt = LS_CU_F32;
    // the fewest tokens a pass that cover T (one group of 8 at a time past 8)
    LS_CU_DISPATCH(bias_dt, TB,
        const TB *b = (const TB *)bias;
        return T == 1   ? s_gemm_small<1>(y, xq, x_scale, w, w_scale, b, T, in, out, stream)
               : T == 2 ? s_gemm_small<2>(y, xq, x_scale, w, w_scale, b, T, in, out, stream)
               : T <= 4 ? s_gemm_small<4>(y, xq, x_scale, w, w_scale, b, T, in, out, stream)
                        : s_gemm_small<S_SMALL_NT>(y, xq, x_scale, w, w_scale, b, T, in, out,
                                                   stream));
    return cudaErrorInvalidValue;
}

// --- the decode-shaped FP8 GEMM on tensor cores (sm_89+) --------------------------------
//
// gemv_mma.cuh's weight stream with E4M3 codes: a block owns 16 output rows and 8 · NN tokens
// (grid y: further groups of 8 · NN), a segment is 512 codes of 16 rows, and each 64-code
// chunk is two mma.sync m16n8k32 E4M3. Each chunk's two mmas start from zero and go into fp32
// accumulators on the CUDA cores (the tensor cores' own FP8 sums keep ~14 bits, fewer than
// fp32: the DeepSeek-V3 promotion); the epilogue rounds as ls_matmul_fp8_forward does:
// (acc · x_scale[t]) · w_scale[o] (+ bias). Per weight byte a warp issues as many mmas as
// the 16-bit GEMV does, about flat in T, so it streams near copy bandwidth where small is
// issue-bound.

// d = a (16 x 32, row) · b (32 x 8, col) + c, E4M3 in, fp32 out. Only sm_89+ has the
// instruction: elsewhere the kernel is never launched (ls_cu_fp8_gemm_tc_ok), and traps if
// it were.
__device__ __forceinline__ void s_mma_e4m3(float (&d)[4], const uint32_t (&a)[4], unsigned b0,
                                           unsigned b1, const float (&c)[4]) {
#if __CUDA_ARCH__ >= 890
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]),
          "f"(c[2]), "f"(c[3]));
#else
    (void)a, (void)b0, (void)b1, (void)c;
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    __trap();
#endif
}

// ls_gm_stream's op for E4M3 codes: the tokens' code rows (token t0 + 8j + g of the lane,
// past T the last), a chunk's two mmas summed from zero and added in fp32, and y written
// with the scales
template <int NN, typename TB> struct s_fp8_op {
    float *y;
    const uint8_t *xr[NN];
    const float *x_scale, *w_scale;
    const TB *bias;
    int T, out, t0;

    __device__ uint4 x(int j, int ci, bool ok) const {
        return ok ? __ldg(reinterpret_cast<const uint4 *>(xr[j]) + ci) : make_uint4(0, 0, 0, 0);
    }
    __device__ void mma(float (&c)[4], const uint32_t (&a0)[4], const uint32_t (&a1)[4],
                        uint4 xv) const {
        const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float d[4];
        s_mma_e4m3(d, a0, xv.x, xv.y, zero);
        s_mma_e4m3(d, a1, xv.z, xv.w, d);
#pragma unroll
        for (int e = 0; e < 4; e++)
            c[e] += d[e];
    }
    __device__ void put(float v, int o, int t) const {
        if (o < out && t0 + t < T)
            s_gemm_store(y, v, x_scale, w_scale, bias, t0 + t, o, out);
    }
};

// y (T, out); xq (T, in) and w (out, in) E4M3 codes, rows 16-byte aligned (in % 16 == 0);
// x_scale (T), w_scale (out), bias (out) or NULL. Grid (out rows / 16, token groups of
// 8 · NN).
template <int NN, typename TB>
__global__ void __launch_bounds__(GM_WARPS * 32, 1)
    k_fp8_gemm_tc(float *y, const uint8_t *xq, const float *x_scale, const uint8_t *w,
                  const float *w_scale, const TB *bias, int T, int in, int out) {
    int t0 = blockIdx.y * 8 * NN, g = (threadIdx.x & 31) >> 2;
    s_fp8_op<NN, TB> op{y, {}, x_scale, w_scale, bias, T, out, t0};
#pragma unroll
    for (int j = 0; j < NN; j++)
        op.xr[j] = xq + (size_t)min(t0 + 8 * j + g, T - 1) * in;
    ls_gm_stream<NN>(reinterpret_cast<const uint4 *>(w), in / 16, out, op);
}

template <int NN, typename TB>
static cudaError_t s_gemm_tc(float *y, const uint8_t *xq, const float *x_scale,
                             const uint8_t *w, const float *w_scale, const TB *bias, int T,
                             int in, int out, cudaStream_t stream) {
    dim3 grid((unsigned)((out + GM_ROWS - 1) / GM_ROWS), (unsigned)((T + 8 * NN - 1) / (8 * NN)));
    return ls_cu_launch_dep(k_fp8_gemm_tc<NN, TB>, grid, dim3(GM_WARPS * 32), 0, stream, y, xq,
                            x_scale, w, w_scale, bias, T, in, out);
}

int ls_cu_fp8_gemm_tc_ok(void) {
    // the kernel as loaded for this device: its PTX target is the __CUDA_ARCH__ it was
    // compiled at (an sm_89 card runs the sm_80 build, without the mma)
    cudaFuncAttributes a;
    if (cudaFuncGetAttributes(&a, k_fp8_gemm_tc<1, float>) != cudaSuccess) {
        cudaGetLastError(); // not the next launch's error
        return 0;
    }
    return a.ptxVersion >= 89;
}

cudaError_t ls_cu_fp8_gemm_tc(float *y, const uint8_t *xq, const float *x_scale,
                              const uint8_t *w, const float *w_scale, const void *bias,
                              ls_cu_dtype_t bias_dt, int T, int in, int out,
                              cudaStream_t stream) {
    assert(T >= 0 && in > 0 && in % 16 == 0 && out > 0);
    assert(((uintptr_t)xq | (uintptr_t)w) % 16 == 0);
    if (T == 0)
        return cudaSuccess;
    if (!bias)
        bias_dt = LS_CU_F32;
    // one tile of 8 tokens up to 8, else passes of two (each pass streams the weights again)
    LS_CU_DISPATCH(bias_dt, TB,
        const TB *b = (const TB *)bias;
        return T <= GM_TOKENS ? s_gemm_tc<1>(y, xq, x_scale, w, w_scale, b, T, in, out, stream)
                              : s_gemm_tc<2>(y, xq, x_scale, w, w_scale, b, T, in, out, stream));
    return cudaErrorInvalidValue;
}
