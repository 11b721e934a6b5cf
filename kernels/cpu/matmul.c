/*  kernels/cpu/matmul.c — dense linear layer, y = x · Wᵀ (+ bias), on OpenBLAS.

    W keeps the HF layout (out, in), so the product is sgemm(NoTrans, Trans); no transposed
    copy of the weights is ever made. The bias is added after the product so the result
    does not depend on whether accumulate is set.
*/
#include <assert.h>
#include <cblas.h>

#include "ops.h"

// y is (T, out), x is (T, in), w is (out, in), bias is (out) or NULL
void ls_matmul_forward(float *y, const float *x, const float *w, const float *bias,
                       int T, int in, int out, int accumulate) {
    assert(y && x && w && T >= 0 && in > 0 && out > 0);
    if (T == 0)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in, w, in,
                accumulate ? 1.0f : 0.0f, y, out);
    if (!bias)
        return;
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * out;
        for (int o = 0; o < out; o++)
            yt[o] += bias[o];
    }
}
