/*  kernels/cuda/elementwise.cu — the row-wise ops of a decoder layer on the GPU: dtype
    conversion, embedding gather, residual add, bias add, SiLU·mul, logit-row gather,
    RMSNorm (whole rows, fused residual; per head), RoPE and the paged KV cache store.
    CPU references: kernels/cpu/elementwise.c, rmsnorm.c, rope.c, attention.c.

    Every kernel here is launched with ls_cu_launch_dep (common.cuh) and calls ls_dep_enter()
    before it reads anything a kernel before it writes (only the RMSNorm's weights and RoPE's
    inverse frequencies, the model's, are read before it): at a small batch these kernels
    are microseconds long, and each one's launch hides under the tail of the kernel before
    it where that one is ours too (the GEMV of a few tokens, attention, these); cuBLAS's
    GEMMs do not trigger early.

    All of these are memory-bound one-pass kernels: grid-stride loops over elements, or one
    block per token row where a row reduction is needed. The norms sum squares in double as
    the reference does, so results differ from it only by the order of that sum.
*/
#include <assert.h>

#include "common.cuh"

size_t ls_cu_dtype_size(ls_cu_dtype_t dt) {
    return dt == LS_CU_F32 ? 4 : dt == LS_CU_F8E4M3 ? 1 : 2;
}

// ---------------------------------------------------------------------------------------

template <typename TD, typename TS>
__global__ void k_convert(TD *dst, const TS *src, size_t n) {
    ls_dep_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = ls_from_f<TD>(ls_to_f(src[i]));
}

cudaError_t ls_cu_convert(void *dst, ls_cu_dtype_t dst_dt, const void *src,
                          ls_cu_dtype_t src_dt, size_t n, cudaStream_t stream) {
    if (n == 0)
        return cudaSuccess;
    if (src_dt == LS_CU_F8E4M3) {
        if (dst_dt != LS_CU_F32)
            return cudaErrorInvalidValue;
        ls_cu_launch_dep(k_convert<float, __nv_fp8_e4m3>, dim3(ls_cu_blocks(n, 256)), dim3(256), 0,
                         stream, (float *)dst, (const __nv_fp8_e4m3 *)src, n);
        LS_CU_CHECK_LAUNCH();
    }
    LS_CU_DISPATCH(
        dst_dt, TD,
        LS_CU_DISPATCH(src_dt, TS,
                       ls_cu_launch_dep(k_convert<TD, TS>, dim3(ls_cu_blocks(n, 256)), dim3(256), 0,
                                        stream, (TD *)dst, (const TS *)src, n)));
    LS_CU_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------

// dst is (rows, dst_stride), src is (rows, chunks, w); one thread per destination element,
// grid-stride. A slot load moves a few hundred MB at most once per cold adapter, on the
// upload stream beside the step: plain coalesced element copies are far from the bottleneck
// (the host-to-device copy before it is).
template <typename T>
__global__ void k_pad_copy(T *dst, const T *src, size_t w, size_t chunks, size_t rows,
                           size_t dst_chunk, size_t dst_stride) {
    ls_dep_enter();
    size_t n = rows * chunks * dst_chunk;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        size_t c = k % dst_chunk, ij = k / dst_chunk, j = ij % chunks, i = ij / chunks;
        dst[i * dst_stride + j * dst_chunk + c] = c < w ? src[ij * w + c] : T(0);
    }
}

cudaError_t ls_cu_pad_copy(void *dst, const void *src, size_t esize, size_t w, size_t chunks,
                           size_t rows, size_t dst_chunk, size_t dst_stride, cudaStream_t stream) {
    assert((esize == 2 || esize == 4) && w <= dst_chunk && chunks * dst_chunk <= dst_stride);
    size_t n = rows * chunks * dst_chunk;
    if (n == 0)
        return cudaSuccess;
    if (esize == 2)
        ls_cu_launch_dep(k_pad_copy<uint16_t>, dim3(ls_cu_blocks(n, 256)), dim3(256), 0, stream,
                         (uint16_t *)dst, (const uint16_t *)src, w, chunks, rows, dst_chunk,
                         dst_stride);
    else
        ls_cu_launch_dep(k_pad_copy<uint32_t>, dim3(ls_cu_blocks(n, 256)), dim3(256), 0, stream,
                         (uint32_t *)dst, (const uint32_t *)src, w, chunks, rows, dst_chunk,
                         dst_stride);
    LS_CU_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------

// out is (T, C), table is (vocab, C), ids is (T); one block per token
template <typename TW>
__global__ void k_embedding(float *out, const TW *table, const int32_t *ids, int C,
                            int vocab0, int vocab) {
    ls_dep_enter();
    int t = blockIdx.x;
    long long id = (long long)ids[t] - vocab0;
    float *o = out + (size_t)t * C;
    if (id < 0 || id >= vocab) { // another rank's vocabulary range
        for (int i = threadIdx.x; i < C; i += blockDim.x)
            o[i] = 0.0f;
        return;
    }
    const TW *row = table + (size_t)id * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        o[i] = ls_to_f(row[i]);
}

cudaError_t ls_cu_embedding(float *out, const void *table, ls_cu_dtype_t table_dt,
                            const int32_t *ids, int T, int C, int vocab0, int vocab,
                            cudaStream_t stream) {
    if (T == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(table_dt, TW,
                   ls_cu_launch_dep(k_embedding<TW>, dim3(T), dim3(256), 0, stream, out,
                                    (const TW *)table, ids, C, vocab0, vocab));
    LS_CU_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------

__global__ void k_add(float *y, const float *x, size_t n) {
    ls_dep_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], x[i]);
}

cudaError_t ls_cu_add(float *y, const float *x, size_t n, cudaStream_t stream) {
    if (n == 0)
        return cudaSuccess;
    ls_cu_launch_dep(k_add, dim3(ls_cu_blocks(n, 256)), dim3(256), 0, stream, y, x, n);
    LS_CU_CHECK_LAUNCH();
}

template <typename TB>
__global__ void k_bias_add(float *y, const TB *bias, int T, int out) {
    ls_dep_enter();
    size_t n = (size_t)T * out;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], ls_to_f(bias[i % out]));
}

cudaError_t ls_cu_bias_add(float *y, const void *bias, ls_cu_dtype_t bias_dt, int T,
                           int out, cudaStream_t stream) {
    size_t n = (size_t)T * out;
    if (n == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(bias_dt, TB,
                   ls_cu_launch_dep(k_bias_add<TB>, dim3(ls_cu_blocks(n, 256)), dim3(256), 0,
                                    stream, y, (const TB *)bias, T, out));
    LS_CU_CHECK_LAUNCH();
}

// out and lp (or NULL: TL is then float and unused) are (T, inter), gate_up and delta (or
// NULL) are (T, 2*inter); out NULL: only lp is written
template <typename TL>
__global__ void k_silu_mul(float *out, TL *lp, const float *gate_up, const float *delta, int T,
                           int inter) {
    ls_dep_enter();
    size_t n = (size_t)T * inter;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / inter, c = i % inter;
        size_t gi = t * 2 * inter + c, ui = gi + inter;
        float g = gate_up[gi], u = gate_up[ui];
        if (delta) {
            g = __fadd_rn(g, delta[gi]);
            u = __fadd_rn(u, delta[ui]);
        }
        float o = ls_silu_mul(g, u);
        if (out)
            out[i] = o;
        if (lp)
            lp[i] = ls_from_f<TL>(o);
    }
}

// k_silu_mul four columns a thread, in float4s, the row and column found once per four: the
// scalar kernel spends much of its time on a 64-bit division and remainder an element. The
// Llama-3-8B decode step at batch 64 7.77 -> 7.70 ms on an H100 (bench_decode_cuda, side by
// side). Same sums and roundings, element by element. F: the math (ls_silu_mul_put4's).
template <typename TL, typename F = ls_silu_mul_f>
__global__ void k_silu_mul4(float *out, TL *lp, const float *gate_up, const float *delta, int T, int inter) {
    ls_dep_enter();
    size_t q = (size_t)inter / 4, n4 = (size_t)T * q;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n4; j += (size_t)gridDim.x * blockDim.x) {
        size_t t = j / q, c = (j - t * q) * 4, gi = t * 2 * inter + c, i = t * inter + c;
        float4 g = *(const float4 *)(gate_up + gi), u = *(const float4 *)(gate_up + gi + inter);
        if (delta) {
            float4 dg = *(const float4 *)(delta + gi), du = *(const float4 *)(delta + gi + inter);
            g = ls_add4(g, dg);
            u = ls_add4(u, du);
        }
        ls_silu_mul_put4<TL, F>(out, lp, i, g, u);
    }
}

// k_silu_mul with the output's E4M3 codes q (T, inter) and row scales qs (T) beside out:
// the input of the FP8 down projection, made here instead of by a quantizing pass over out
// (which would read the row back in a launch of its own). One block per row, as the row's
// amax is needed before its first code; each thread reads back the out values it wrote.
// Where a block can hold the row in registers, k_silu_mul_fp8_reg (below) runs instead.
__global__ void k_silu_mul_fp8(float *out, uint8_t *q, float *qs, const float *gate_up,
                               const float *delta, int inter) {
    ls_dep_enter();
    __shared__ float part[32];
    size_t row = blockIdx.x;
    const float *gr = gate_up + row * 2 * inter, *dr = delta ? delta + row * 2 * inter : NULL;
    float *orow = out + row * inter;
    float amax = 0.0f;
    for (int c = threadIdx.x; c < inter; c += blockDim.x) {
        float g = gr[c], u = gr[c + inter];
        if (dr) {
            g = __fadd_rn(g, dr[c]);
            u = __fadd_rn(u, dr[c + inter]);
        }
        float o = ls_silu_mul(g, u);
        orow[c] = o;
        amax = fmaxf(amax, fabsf(o));
    }
    float s = ls_fp8_row_scale(ls_block_max(amax, part));
    if (threadIdx.x == 0)
        qs[row] = s;
    for (int c = threadIdx.x; c < inter; c += blockDim.x)
        q[row * inter + c] = ls_fp8_code(orow[c], s);
}

// k_silu_mul_fp8 with the row held in registers, EPT values a thread in float4s (inter =
// blockDim.x · EPT): gate_up and delta read once, all of a thread's loads in flight at once,
// the codes made from the registers (ls_fp8_row_codes). At decode's few rows a block a row is
// latency-bound, and k_silu_mul_fp8's loop waited out one round trip an element a thread (14
// at Llama-3-8B's 14,336): 11.3 µs from gate_up's end to its own in the batch-1 FP8 step's
// timeline (H100), where bf16's k_silu_mul4 takes 1.5. The same values, bit for bit.
template <int EPT>
__global__ void __launch_bounds__(1024) k_silu_mul_fp8_reg(float *out, uint8_t *q, float *qs,
                                                           const float *gate_up,
                                                           const float *delta, int inter) {
    ls_dep_enter();
    __shared__ float part[32];
    size_t row = blockIdx.x;
    const float *gr = gate_up + row * 2 * inter, *dr = delta ? delta + row * 2 * inter : NULL;
    float4 g[EPT / 4], u[EPT / 4];
#pragma unroll
    for (int k = 0; k < EPT / 4; k++) {
        int c = (k * blockDim.x + threadIdx.x) * 4;
        g[k] = *(const float4 *)(gr + c);
        u[k] = *(const float4 *)(gr + c + inter);
    }
    if (dr)
#pragma unroll
        for (int k = 0; k < EPT / 4; k++) {
            int c = (k * blockDim.x + threadIdx.x) * 4;
            float4 dg = *(const float4 *)(dr + c), du = *(const float4 *)(dr + c + inter);
            g[k] = ls_add4(g[k], dg);
            u[k] = ls_add4(u[k], du);
        }
    float v[EPT], amax = 0.0f;
#pragma unroll
    for (int k = 0; k < EPT / 4; k++) {
        float *o = v + 4 * k;
        o[0] = ls_silu_mul(g[k].x, u[k].x), o[1] = ls_silu_mul(g[k].y, u[k].y);
        o[2] = ls_silu_mul(g[k].z, u[k].z), o[3] = ls_silu_mul(g[k].w, u[k].w);
#pragma unroll
        for (int e = 0; e < 4; e++)
            amax = fmaxf(amax, fabsf(o[e]));
        *(float4 *)(out + row * inter + (k * blockDim.x + threadIdx.x) * 4) =
            make_float4(o[0], o[1], o[2], o[3]);
    }
    ls_fp8_row_codes(q + row * inter, qs + row, v, amax, part);
}

cudaError_t ls_cu_silu_mul(float *out, void *lp, ls_cu_dtype_t lp_dt, float *lp_scale,
                           const float *gate_up, const float *delta, int T, int inter,
                           cudaStream_t stream) {
    size_t n = (size_t)T * inter;
    if (n == 0)
        return cudaSuccess;
    if (!out && (!lp || lp_dt == LS_CU_F8E4M3)) // the FP8 kernel reads out back
        return cudaErrorInvalidValue;
    if (lp && lp_dt == LS_CU_F8E4M3) {
        // the register kernel where a block holds the row and every row is 16-byte aligned
        int ept = ls_cu_row_ept(inter);
        if (ept && !(((uintptr_t)out | (uintptr_t)gate_up | (uintptr_t)delta) & 15) &&
            !((uintptr_t)lp & 3)) {
            LS_CU_EPT_DISPATCH(ept, E,
                               ls_cu_launch_dep(k_silu_mul_fp8_reg<E>, dim3(T), dim3(inter / E),
                                                0, stream, out, (uint8_t *)lp, lp_scale, gate_up,
                                                delta, inter));
        } else {
            ls_cu_launch_dep(k_silu_mul_fp8, dim3(T), dim3(inter >= 8192 ? 1024 : 256), 0, stream,
                             out, (uint8_t *)lp, lp_scale, gate_up, delta, inter);
        }
        LS_CU_CHECK_LAUNCH();
    }
    if (inter % 4 == 0 && !(((uintptr_t)out | (uintptr_t)gate_up | (uintptr_t)delta) & 15)) {
        unsigned blocks4 = ls_cu_blocks(n / 4, 256);
        if (!lp) {
            ls_cu_launch_dep(k_silu_mul4<float>, dim3(blocks4), dim3(256), 0, stream, out, NULL,
                             gate_up, delta, T, inter);
        } else {
            LS_CU_DISPATCH(lp_dt, TL,
                           ls_cu_launch_dep(k_silu_mul4<TL>, dim3(blocks4), dim3(256), 0, stream,
                                            out, (TL *)lp, gate_up, delta, T, inter));
        }
        LS_CU_CHECK_LAUNCH();
    }
    unsigned blocks = ls_cu_blocks(n, 256);
    if (!lp) {
        ls_cu_launch_dep(k_silu_mul<float>, dim3(blocks), dim3(256), 0, stream, out, NULL, gate_up,
                         delta, T, inter);
    } else {
        LS_CU_DISPATCH(lp_dt, TL,
                       ls_cu_launch_dep(k_silu_mul<TL>, dim3(blocks), dim3(256), 0, stream, out,
                                        (TL *)lp, gate_up, delta, T, inter));
    }
    LS_CU_CHECK_LAUNCH();
}

__global__ void k_rows_gather(float *out, const float *x, const int32_t *rows, int C) {
    ls_dep_enter();
    int r = blockIdx.x;
    const float *src = x + (size_t)rows[r] * C;
    float *dst = out + (size_t)r * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        dst[i] = src[i];
}

cudaError_t ls_cu_rows_gather(float *out, const float *x, const int32_t *rows, int n_rows,
                              int C, cudaStream_t stream) {
    if (n_rows == 0)
        return cudaSuccess;
    ls_cu_launch_dep(k_rows_gather, dim3(n_rows), dim3(256), 0, stream, out, x, rows, C);
    LS_CU_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------
// RMSNorm

// out is (T, C), lp (T, C) or NULL (TL then float, unused), residual is (T, C) or NULL,
// x is (T, C), x2 is (T, C) or NULL, w is (C); q (T, C) and qs (T), or NULL: out's E4M3 codes
// and row scales (the FP8 GEMM's input), after a third pass over the row for its amax
// (each thread reads back the out values it wrote). One block per row. Each thread reads
// and writes the same elements in every pass, so out may alias x.
template <typename TW, typename TL>
__global__ void k_rmsnorm(float *out, TL *lp, uint8_t *q, float *qs, float *residual,
                          const float *x, const float *x2, const TW *w, int C, float eps) {
    ls_dep_enter();
    __shared__ double scratch[32];
    __shared__ float part[32];
    size_t row = blockIdx.x;
    const float *xr = x + row * C;
    const float *x2r = x2 ? x2 + row * C : nullptr;
    float *rr = residual ? residual + row * C : nullptr;
    float *orow = out ? out + row * C : nullptr;
    double ss = 0.0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = x2r ? __fadd_rn(xr[i], x2r[i]) : xr[i];
        if (rr) {
            v = __fadd_rn(rr[i], v);
            rr[i] = v;
        }
        ss += (double)v * v;
    }
    ss = ls_block_sum(ss, scratch);
    float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(ss / C), eps)));
    float amax = 0.0f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = rr ? rr[i] : x2r ? __fadd_rn(xr[i], x2r[i]) : xr[i];
        float o = __fmul_rn(__fmul_rn(v, inv), ls_to_f(w[i]));
        if (orow)
            orow[i] = o;
        amax = fmaxf(amax, fabsf(o));
        if (lp)
            lp[row * C + i] = ls_from_f<TL>(o);
    }
    if (!q)
        return;
    float s = ls_fp8_row_scale(ls_block_max(amax, part));
    if (threadIdx.x == 0)
        qs[row] = s;
    for (int i = threadIdx.x; i < C; i += blockDim.x)
        q[row * C + i] = ls_fp8_code(orow[i], s);
}

// k_rmsnorm with the row held in registers between the sum and the scaling, S_RMS_EPT elements
// a thread in float4s: x, x2 and the residual are read once, not twice. At decode's few rows
// the kernel is latency-bound (a block per row, fewer rows than SMs), so the second pass was
// much of it: the Llama-3-8B decode step at batch 64 (two norms a layer) 7.96 -> 7.78 ms on an
// H100 (bench_decode_cuda, side by side). For the same reason every load of a thread is
// issued before the first is used (the residual's stores come after them, so that the
// compiler need not order a later load behind them), and the norm's weights are read before
// the programmatic wait (no kernel of a step writes them): after the sum only arithmetic and
// stores are left. The sums and roundings are k_rmsnorm's, the double sum in another order. q
// and qs as k_rmsnorm's, the codes made from the registers (q 4-byte aligned).
#define S_RMS_EPT 8
template <typename TW, typename TL>
__global__ void __launch_bounds__(1024) k_rmsnorm_reg(float *out, TL *lp, uint8_t *q, float *qs,
                                                      float *residual, const float *x,
                                                      const float *x2, const TW *w, int C,
                                                      float eps) {
    __shared__ double scratch[32];
    __shared__ float part[32];
    size_t row = blockIdx.x;
    float wf[S_RMS_EPT];
#pragma unroll
    for (int k = 0; k < S_RMS_EPT / 4; k++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            wf[4 * k + e] = ls_to_f(w[(k * blockDim.x + threadIdx.x) * 4 + e]);
    ls_dep_enter();
    float4 a[S_RMS_EPT / 4], b[S_RMS_EPT / 4], r[S_RMS_EPT / 4];
#pragma unroll
    for (int k = 0; k < S_RMS_EPT / 4; k++) {
        size_t i = row * C + ((size_t)k * blockDim.x + threadIdx.x) * 4;
        a[k] = *(const float4 *)(x + i);
        if (x2)
            b[k] = *(const float4 *)(x2 + i);
        if (residual)
            r[k] = *(const float4 *)(residual + i);
    }
    float v[S_RMS_EPT];
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < S_RMS_EPT / 4; k++) {
        size_t i = row * C + ((size_t)k * blockDim.x + threadIdx.x) * 4;
        float4 t = a[k];
        if (x2)
            t = ls_add4(t, b[k]);
        if (residual) {
            t = ls_add4(r[k], t);
            *(float4 *)(residual + i) = t;
        }
        v[4 * k] = t.x, v[4 * k + 1] = t.y, v[4 * k + 2] = t.z, v[4 * k + 3] = t.w;
#pragma unroll
        for (int e = 0; e < 4; e++)
            ss += (double)v[4 * k + e] * v[4 * k + e];
    }
    ss = ls_block_sum(ss, scratch);
    float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(ss / C), eps)));
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < S_RMS_EPT / 4; k++) {
        int c = (k * blockDim.x + threadIdx.x) * 4;
        size_t i = row * C + c;
        float *o = v + 4 * k; // the row's values become the outputs in place
#pragma unroll
        for (int e = 0; e < 4; e++) {
            o[e] = __fmul_rn(__fmul_rn(o[e], inv), wf[4 * k + e]);
            amax = fmaxf(amax, fabsf(o[e]));
        }
        if (out)
            *(float4 *)(out + i) = make_float4(o[0], o[1], o[2], o[3]);
        if (lp)
#pragma unroll
            for (int e = 0; e < 4; e++)
                lp[i + e] = ls_from_f<TL>(o[e]);
    }
    if (q)
        ls_fp8_row_codes(q + row * C, qs + row, v, amax, part);
}

cudaError_t ls_cu_rmsnorm(float *out, void *lp, ls_cu_dtype_t lp_dt, float *lp_scale,
                          float *residual, const float *x, const float *x2, const void *w,
                          ls_cu_dtype_t w_dt, int T, int C, float eps, cudaStream_t stream) {
    if (T == 0)
        return cudaSuccess;
    if (!out && (!lp || lp_dt == LS_CU_F8E4M3)) // k_rmsnorm's codes read out back
        return cudaErrorInvalidValue;
    // an E4M3 lp: the kernels' codes and scales (q, qs), TL unused
    uint8_t *q = lp && lp_dt == LS_CU_F8E4M3 ? (uint8_t *)lp : NULL;
    float *qs = q ? lp_scale : NULL;
    if (q)
        lp = NULL;
    // the register kernel: C a whole number of warps' float4 groups, every row 16-byte aligned
    int reg_threads = C / S_RMS_EPT;
    bool aligned = !(((uintptr_t)out | (uintptr_t)residual | (uintptr_t)x | (uintptr_t)x2) & 15) &&
                   !((uintptr_t)q & 3);
    if (C % (32 * S_RMS_EPT) == 0 && reg_threads <= 1024 && aligned) {
        if (!lp) {
            LS_CU_DISPATCH(w_dt, TW,
                           ls_cu_launch_dep(k_rmsnorm_reg<TW, float>, dim3(T), dim3(reg_threads), 0,
                                            stream, out, NULL, q, qs, residual, x, x2,
                                            (const TW *)w, C, eps));
        } else {
            LS_CU_DISPATCH(
                w_dt, TW,
                LS_CU_DISPATCH(lp_dt, TL,
                               ls_cu_launch_dep(k_rmsnorm_reg<TW, TL>, dim3(T), dim3(reg_threads),
                                                0, stream, out, (TL *)lp, NULL, NULL, residual, x,
                                                x2, (const TW *)w, C, eps)));
        }
        LS_CU_CHECK_LAUNCH();
    }
    int threads = C >= 4096 ? 1024 : C >= 1024 ? 512 : 256;
    if (!lp) {
        LS_CU_DISPATCH(w_dt, TW,
                       ls_cu_launch_dep(k_rmsnorm<TW, float>, dim3(T), dim3(threads), 0, stream,
                                        out, NULL, q, qs, residual, x, x2, (const TW *)w, C, eps));
    } else {
        LS_CU_DISPATCH(w_dt, TW,
                       LS_CU_DISPATCH(lp_dt, TL,
                                      ls_cu_launch_dep(k_rmsnorm<TW, TL>, dim3(T), dim3(threads), 0,
                                                       stream, out, (TL *)lp, NULL, NULL, residual,
                                                       x, x2, (const TW *)w, C, eps)));
    }
    LS_CU_CHECK_LAUNCH();
}

// x is (T, row_stride) holding (n_heads, head_dim) per row; one warp per (token, head)
template <typename TW>
__global__ void k_rmsnorm_heads(float *x, const TW *w, int T, int n_heads, int head_dim,
                                int row_stride, float eps) {
    ls_dep_enter();
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (warp >= T * n_heads)
        return;
    int t = warp / n_heads, h = warp % n_heads;
    float *xh = x + (size_t)t * row_stride + (size_t)h * head_dim;
    double ss = 0.0;
    for (int i = lane; i < head_dim; i += 32)
        ss += (double)xh[i] * xh[i];
    ss = ls_warp_sum(ss);
    float inv = __fdiv_rn(1.0f, sqrtf(__fadd_rn((float)(ss / head_dim), eps)));
    for (int i = lane; i < head_dim; i += 32)
        xh[i] = __fmul_rn(__fmul_rn(xh[i], inv), ls_to_f(w[i]));
}

cudaError_t ls_cu_rmsnorm_heads(float *x, const void *w, ls_cu_dtype_t w_dt, int T,
                                int n_heads, int head_dim, int row_stride, float eps,
                                cudaStream_t stream) {
    assert(row_stride >= n_heads * head_dim);
    size_t warps = (size_t)T * n_heads;
    if (warps == 0)
        return cudaSuccess;
    unsigned blocks = (unsigned)((warps * 32 + 127) / 128);
    LS_CU_DISPATCH(w_dt, TW,
                   ls_cu_launch_dep(k_rmsnorm_heads<TW>, dim3(blocks), dim3(128), 0, stream, x,
                                    (const TW *)w, T, n_heads, head_dim, row_stride, eps));
    LS_CU_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------
// RoPE (HF rotate_half convention) and the paged KV cache store in one pass

// A block per (token, S_ROPE_HEADS "heads" of the row's q, k, v heads side by side): q and k
// heads rotate in place, k's rotated values and v (+ v2) go to the caches. Each pair's angle
// depends on the token and the pair's index, not the head, so a block takes each (sin, cos)
// once from shared memory instead of once per head (sincosf takes its slow path for the
// large angles of long positions); several blocks per token keep a batch-1 step off one SM.
// One kernel instead of a RoPE kernel then a store kernel: the store's launch, its gap and
// its second read of k go (a decode step runs it once per layer).
// At decode a block's work is a few dependent round trips (the position, then the angles; the
// row's values, then their stores), so the kernel asks for everything it reads at once: the
// inverse frequencies before its programmatic wait (no kernel of a step writes them), the
// position, slot and every value of the thread's (S_ROPE_PER at most) right after it, then
// the angles, then the rotations and stores.
enum {
    S_ROPE_HEADS = 8,
    S_ROPE_MAX_HALF = 256,
    S_ROPE_THREADS = 256,
    S_ROPE_PER = S_ROPE_HEADS * S_ROPE_MAX_HALF / S_ROPE_THREADS,
};
static_assert(S_ROPE_MAX_HALF <= S_ROPE_THREADS, "a thread's one inverse frequency");

template <typename TI, typename TC>
__global__ void __launch_bounds__(S_ROPE_THREADS)
    k_rope_kv_store(float *x, const float *x2, TC *k_cache, TC *v_cache,
                    const int32_t *positions, const int32_t *slot_mapping, const TI *inv_freq,
                    int n_heads, int n_kv_heads, int head_dim, int row_stride, int block_size,
                    size_t block_stride) {
    __shared__ float sn[S_ROPE_MAX_HALF], cs[S_ROPE_MAX_HALF];
    int t = blockIdx.x, half = head_dim / 2, h0 = blockIdx.y * S_ROPE_HEADS;
    float freq = threadIdx.x < half ? ls_to_f(inv_freq[threadIdx.x]) : 0.0f;
    ls_dep_enter();
    int n_rot = n_heads + n_kv_heads; // q's heads and k's: those rotated
    int n = min(S_ROPE_HEADS, n_rot + n_kv_heads - h0) * half;
    float pos = (float)positions[t];
    int slot = slot_mapping[t];
    float *xt = x + (size_t)t * row_stride;
    const float *dt = x2 ? x2 + (size_t)t * row_stride : NULL;
    float a[S_ROPE_PER], b[S_ROPE_PER], da[S_ROPE_PER], db[S_ROPE_PER];
#pragma unroll
    for (int j = 0; j < S_ROPE_PER; j++) {
        int k = threadIdx.x + j * S_ROPE_THREADS;
        if (k < n) {
            size_t e = (size_t)(h0 + k / half) * head_dim + k % half; // in the row
            a[j] = xt[e], b[j] = xt[e + half];
            if (dt)
                da[j] = dt[e], db[j] = dt[e + half];
        }
    }
    if (h0 < n_rot) { // uniform over the block: only v's heads need no angles
        if (threadIdx.x < half) {
            float angle = __fmul_rn(pos, freq); // fp32 product, as HF
            sincosf(angle, &sn[threadIdx.x], &cs[threadIdx.x]);
        }
        __syncthreads();
    }
    size_t at = slot < 0 ? 0
                         : (size_t)(slot / block_size) * block_stride +
                               (size_t)(slot % block_size) * n_kv_heads * head_dim;
#pragma unroll
    for (int j = 0; j < S_ROPE_PER; j++) {
        int k = threadIdx.x + j * S_ROPE_THREADS;
        if (k >= n)
            break;
        int h = h0 + k / half, i = k % half;
        float *xh = xt + (size_t)h * head_dim;
        float av = a[j], bv = b[j];
        if (dt) { // the CPU reference's add, unfused
            av = __fadd_rn(av, da[j]);
            bv = __fadd_rn(bv, db[j]);
        }
        if (h >= n_rot) { // v: stored (+ v2), x itself left as it is
            if (slot >= 0) {
                TC *vc = v_cache + at + (size_t)(h - n_rot) * head_dim;
                vc[i] = ls_from_f<TC>(av);
                vc[i + half] = ls_from_f<TC>(bv);
            }
            continue;
        }
        float s = sn[i], c = cs[i];
        float ra = __fsub_rn(__fmul_rn(av, c), __fmul_rn(bv, s));
        float rb = __fadd_rn(__fmul_rn(bv, c), __fmul_rn(av, s));
        xh[i] = ra;
        xh[i + half] = rb;
        if (h >= n_heads && slot >= 0) { // k: stored rotated
            TC *kc = k_cache + at + (size_t)(h - n_heads) * head_dim;
            kc[i] = ls_from_f<TC>(ra);
            kc[i + half] = ls_from_f<TC>(rb);
        }
    }
}

cudaError_t ls_cu_rope_kv_store(float *x, const float *x2, void *k_cache, void *v_cache,
                                ls_cu_dtype_t cache_dt, const int32_t *positions,
                                const int32_t *slot_mapping, const void *inv_freq,
                                ls_cu_dtype_t inv_dt, int T, int n_heads, int n_kv_heads,
                                int head_dim, int row_stride, int block_size,
                                size_t block_stride, cudaStream_t stream) {
    int n_all = n_heads + 2 * n_kv_heads;
    assert(head_dim % 2 == 0 && head_dim / 2 <= S_ROPE_MAX_HALF && row_stride >= n_all * head_dim);
    assert(block_size > 0 && block_stride >= (size_t)block_size * n_kv_heads * head_dim);
    if (T == 0 || n_all == 0)
        return cudaSuccess;
    dim3 grid((unsigned)T, (unsigned)((n_all + S_ROPE_HEADS - 1) / S_ROPE_HEADS));
    LS_CU_DISPATCH(
        inv_dt, TI,
        LS_CU_DISPATCH(cache_dt, TC,
                       ls_cu_launch_dep(k_rope_kv_store<TI, TC>, grid, dim3(S_ROPE_THREADS), 0,
                                        stream,
                                        x, x2, (TC *)k_cache, (TC *)v_cache, positions,
                                        slot_mapping, (const TI *)inv_freq, n_heads, n_kv_heads,
                                        head_dim, row_stride, block_size, block_stride)));
    LS_CU_CHECK_LAUNCH();
}
