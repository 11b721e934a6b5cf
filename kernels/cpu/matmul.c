/*  kernels/cpu/matmul.c — dense linear layer, y = x · Wᵀ (+ bias), on OpenBLAS; and its
    FP8 form (ops.h): rows quantized to E4M3 with a scale each, the exact products summed
    by the same sgemm, the scales applied after.

    W keeps the HF layout (out, in), so the product is sgemm(NoTrans, Trans); no transposed
    copy of the weights is ever made. The bias is added after the product so the result
    does not depend on whether accumulate is set.
*/
#include <assert.h>
#include <cblas.h>
#include <math.h>

#include "ops.h"
#include "safetensors.h" // the E4M3 scalar conversions

// y is (T, out), bias is (out) or NULL
static void s_bias_add(float *y, const float *bias, int T, int out) {
    if (!bias)
        return;
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * out;
        for (int o = 0; o < out; o++)
            yt[o] += bias[o];
    }
}

// y is (T, out), x is (T, in), w is (out, in), bias is (out) or NULL
void ls_matmul_forward(float *y, const float *x, const float *w, const float *bias,
                       int T, int in, int out, int accumulate) {
    assert(y && x && w && T >= 0 && in > 0 && out > 0);
    if (T == 0)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in, w, in,
                accumulate ? 1.0f : 0.0f, y, out);
    s_bias_add(y, bias, T, out);
}

// The scale of row x (cols): amax / 448, 1 when the row is all zero (its codes are 0 then
// whatever the scale).
static float s_fp8_scale(const float *x, int cols) {
    float amax = 0.0f;
    for (int c = 0; c < cols; c++)
        amax = fmaxf(amax, fabsf(x[c]));
    return amax > 0.0f ? amax / 448.0f : 1.0f;
}

// The two forms of ls_fp8_quantize_rows: codes into q, or (q NULL) their values into wide.
// q or wide is (rows, cols), scale is (rows), x is (rows, cols)
static void s_fp8_quantize(uint8_t *q, float *wide, float *scale, const float *x, int rows,
                           int cols) {
    assert((q || wide) && scale && x && rows >= 0 && cols > 0);
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float s = scale[r] = s_fp8_scale(xr, cols);
        for (int c = 0; c < cols; c++) {
            uint8_t code = ls_e4m3_from_f32(xr[c] / s);
            if (q)
                q[(size_t)r * cols + c] = code;
            else
                wide[(size_t)r * cols + c] = ls_e4m3_to_f32(code);
        }
    }
}

void ls_fp8_quantize_rows(uint8_t *q, float *scale, const float *x, int rows, int cols) {
    s_fp8_quantize(q, NULL, scale, x, rows, cols);
}

void ls_fp8_quantize_rows_f32(float *xq, float *scale, const float *x, int rows, int cols) {
    s_fp8_quantize(NULL, xq, scale, x, rows, cols);
}

// y is (T, out), xq is (T, in), x_scale is (T), x is (T, in) or NULL, w is (out, in),
// w_scale is (out), bias is (out) or NULL
void ls_matmul_fp8_forward(float *y, float *xq, float *x_scale, const float *x,
                           const float *w, const float *w_scale, const float *bias, int T,
                           int in, int out) {
    assert(y && xq && x_scale && w && w_scale && T >= 0 && in > 0 && out > 0);
    if (T == 0)
        return;
    if (x)
        ls_fp8_quantize_rows_f32(xq, x_scale, x, T, in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, xq, in, w, in,
                0.0f, y, out);
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * out;
        for (int o = 0; o < out; o++)
            yt[o] = yt[o] * x_scale[t] * w_scale[o];
    }
    s_bias_add(y, bias, T, out);
}
