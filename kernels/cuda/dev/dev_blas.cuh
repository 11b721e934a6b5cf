/*  kernels/cuda/dev/dev_blas.cuh — the cuBLAS status check of the dev programs that call
    cuBLAS themselves (dev_prefetch.cu, dev_gemm.cu). */
#ifndef LS_DEV_BLAS_CUH
#define LS_DEV_BLAS_CUH

#include <cstdio>
#include <cstdlib>

#include <cublas_v2.h>

#define BL_CK(x)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cuBLAS %d\n", __FILE__, __LINE__, (int)s_);                    \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

#endif
