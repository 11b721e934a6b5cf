/*  kernels/cuda/fp8.cu — the FP8 (W8A8) kernels around the FP8 GEMM (kernels/ops.h
    ls_fp8_quantize_rows, ls_matmul_fp8_forward): per-token quantization of the GEMM's input,
    and the scales applied after a GEMM that summed without them.

    Bits: common.cuh's ls_fp8_row_scale and ls_fp8_code, the CPU reference's steps. Where
    the op before the GEMM is an RMSNorm or SiLU·mul, that kernel writes the codes itself
    (elementwise.cu) and this pass does not run.
*/
#include <assert.h>

#include "common.cuh"

enum { S_QUANT_THREADS = 256 };

// One block per row, four values a thread per step (cols % 4 == 0, rows 16-byte aligned):
// the row's amax, then its codes. Decode rows are a few thousand values: the row stays in
// L1 between the two passes.
// q is (rows, cols), scale is (rows), x is (rows, cols)
__global__ void k_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int cols) {
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

cudaError_t ls_cu_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int rows, int cols,
                                    cudaStream_t stream) {
    assert(cols > 0 && cols % 4 == 0 && rows >= 0);
    if (rows == 0)
        return cudaSuccess;
    k_fp8_quantize_rows<<<rows, S_QUANT_THREADS, 0, stream>>>(q, scale, x, cols);
    LS_CU_CHECK_LAUNCH();
}

// y is (T, out), x_scale (T), w_scale (out), bias (out) or NULL. A thread per output
// channel (blockIdx.x) over rows (blockIdx.y, grid-stride): the channel's scale and bias are
// read once, and no element index is divided back into its row and column.
template <typename TB>
__global__ void k_fp8_scale(float *y, const float *x_scale, const float *w_scale,
                            const TB *bias, int T, int out) {
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
        k_fp8_scale<TB><<<grid, 256, 0, stream>>>(y, x_scale, w_scale, (const TB *)bias, T,
                                                  out));
    LS_CU_CHECK_LAUNCH();
}
