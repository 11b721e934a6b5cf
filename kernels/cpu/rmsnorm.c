/*  kernels/cpu/rmsnorm.c — HF Llama RMSNorm, whole rows and per attention head.

    The mean of squares is accumulated in double: the reference should not carry the
    summation error of a long fp32 sum (a GPU tree reduction in fp32 lands well inside
    the test tolerance of it). Everything else is fp32 as in HF.
*/
#include <assert.h>
#include <math.h>

#include "ops.h"

// out is (C), x is (C), w is (C); out may alias x
static void s_rmsnorm_row(float *out, const float *x, const float *w, int C, float eps) {
    double ss = 0.0;
    for (int i = 0; i < C; i++)
        ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / C) + eps);
    for (int i = 0; i < C; i++)
        out[i] = x[i] * inv * w[i];
}

// out is (T, C), residual is (T, C) or NULL, x is (T, C), x2 is (T, C) or NULL, w is (C)
void ls_rmsnorm_forward(float *out, float *residual, const float *x, const float *x2,
                        const float *w, int T, int C, float eps) {
    assert(out != residual);
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * C;
        float *ot = out + (size_t)t * C;
        if (residual) {
            float *rt = residual + (size_t)t * C;
            for (int i = 0; i < C; i++)
                rt[i] += x2 ? xt[i] + x2[(size_t)t * C + i] : xt[i];
            xt = rt;
        } else if (x2) {
            // x + x2 staged in out (which may alias x), normalized in place below
            for (int i = 0; i < C; i++)
                ot[i] = xt[i] + x2[(size_t)t * C + i];
            xt = ot;
        }
        s_rmsnorm_row(ot, xt, w, C, eps);
    }
}

// x is (T, row_stride) holding (n_heads, head_dim) per row, w is (head_dim)
void ls_rmsnorm_heads_forward(float *x, const float *w, int T, int n_heads, int head_dim,
                              int row_stride, float eps) {
    assert(row_stride >= n_heads * head_dim);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            float *xh = x + (size_t)t * row_stride + (size_t)h * head_dim;
            s_rmsnorm_row(xh, xh, w, head_dim, eps);
        }
}
