/*  engine/fp8_gemm.cu — see fp8_gemm.h. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include <cublasLt.h>

#include "fp8_gemm.h"
#include "ls_err.h"
#include "ops_cuda.h"

enum { S_ALGOS = 64 }; // shapes kept: 4 projections x the decode batch sizes in use

typedef struct {
    int T, in, out, sms, outer; // the key
    int found;                  // 0: cuBLASLt has no algorithm for it
    cublasLtMatmulAlgo_t algo;
} s_algo_t;

struct ls_fp8_gemm {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc[2]; // [0]: no scales; [1]: outer-vector scales on A and B
    cublasLtMatmulPreference_t pref;
    s_algo_t algos[S_ALGOS];
    int n_algos, next; // entries used; the one replaced next when all are
    int allow_outer, allow_small, allow_tc;
    int tc_t; // the most tokens tc takes (ls_fp8_gemm_set_tc_tokens)
    int tc_ok; // ls_cu_fp8_gemm_tc runs on this device (sm_89+ and built for it)
    ls_fp8_path_t last;
};

#define S_OK(call) ((call) == CUBLAS_STATUS_SUCCESS)

static int s_desc_new(cublasLtMatmulDesc_t *d, int outer) {
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    if (!S_OK(cublasLtMatmulDescCreate(d, CUBLAS_COMPUTE_32F, CUDA_R_32F))) {
        *d = NULL;
        return -1;
    }
    return S_OK(cublasLtMatmulDescSetAttribute(*d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
                   S_OK(cublasLtMatmulDescSetAttribute(*d, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                       sizeof tb)) &&
                   (!outer || (S_OK(cublasLtMatmulDescSetAttribute(
                                   *d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode)) &&
                               S_OK(cublasLtMatmulDescSetAttribute(
                                   *d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode))))
               ? 0
               : -1;
}

ls_fp8_gemm_t *ls_fp8_gemm_new(char *err, size_t errlen) {
    ls_fp8_gemm_t *self = (ls_fp8_gemm_t *)calloc(1, sizeof *self);
    if (!self) {
        ls_err_set(err, errlen, "cuda: out of host memory");
        return NULL;
    }
    self->allow_outer = self->allow_small = self->allow_tc = 1;
    self->tc_t = LS_FP8_TC_T;
    self->tc_ok = ls_cu_fp8_gemm_tc_ok();
    if (!S_OK(cublasLtCreate(&self->lt))) {
        self->lt = NULL;
        ls_fp8_gemm_destroy(&self);
        ls_err_set(err, errlen, "cuda: cublasLtCreate failed");
        return NULL;
    }
    if (s_desc_new(&self->desc[0], 0) != 0 || s_desc_new(&self->desc[1], 1) != 0 ||
        !S_OK(cublasLtMatmulPreferenceCreate(&self->pref))) {
        self->pref = NULL;
        ls_fp8_gemm_destroy(&self);
        ls_err_set(err, errlen, "cuda: cuBLASLt FP8 GEMM descriptors could not be made");
        return NULL;
    }
    return self;
}

void ls_fp8_gemm_destroy(ls_fp8_gemm_t **self_p) {
    ls_fp8_gemm_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    for (int i = 0; i < 2; i++)
        if (self->desc[i])
            cublasLtMatmulDescDestroy(self->desc[i]);
    if (self->pref)
        cublasLtMatmulPreferenceDestroy(self->pref);
    if (self->lt)
        cublasLtDestroy(self->lt);
    free(self);
    *self_p = NULL;
}

// The three layouts of a shape (column-major views of the row-major operands, fp8.h).
typedef struct {
    cublasLtMatrixLayout_t a, b, d;
} s_layouts_t;

static void s_layouts_free(s_layouts_t *l) {
    if (l->a)
        cublasLtMatrixLayoutDestroy(l->a);
    if (l->b)
        cublasLtMatrixLayoutDestroy(l->b);
    if (l->d)
        cublasLtMatrixLayoutDestroy(l->d);
}

static int s_layouts(s_layouts_t *l, int T, int in, int out) {
    *l = (s_layouts_t){NULL, NULL, NULL};
    if (S_OK(cublasLtMatrixLayoutCreate(&l->a, CUDA_R_8F_E4M3, in, out, in)) &&
        S_OK(cublasLtMatrixLayoutCreate(&l->b, CUDA_R_8F_E4M3, in, T, in)) &&
        S_OK(cublasLtMatrixLayoutCreate(&l->d, CUDA_R_32F, out, T, out)))
        return 0;
    s_layouts_free(l);
    return -1;
}

// The kept algorithm of a shape, looked up first if new. The descriptor's SM target must
// already be sms.
static const s_algo_t *s_algo(ls_fp8_gemm_t *self, const s_layouts_t *l, int T, int in,
                              int out, int sms, int outer, size_t workspace_bytes) {
    for (int i = 0; i < self->n_algos; i++) {
        s_algo_t *a = &self->algos[i];
        if (a->T == T && a->in == in && a->out == out && a->sms == sms && a->outer == outer)
            return a;
    }
    int at = self->n_algos < S_ALGOS ? self->n_algos++ : self->next++ % S_ALGOS;
    s_algo_t *a = &self->algos[at];
    *a = (s_algo_t){T, in, out, sms, outer, 0, {}};
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    uint64_t ws = workspace_bytes;
    if (S_OK(cublasLtMatmulPreferenceSetAttribute(self->pref,
                                                  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                  sizeof ws)) &&
        S_OK(cublasLtMatmulAlgoGetHeuristic(self->lt, self->desc[outer], l->a, l->b, l->d, l->d,
                                            self->pref, 1, &r, &n)) &&
        n > 0 && r.state == CUBLAS_STATUS_SUCCESS) {
        a->found = 1;
        a->algo = r.algo;
    }
    return a;
}

int ls_fp8_gemm_run(ls_fp8_gemm_t *self, float *y, const void *xq, const float *x_scale,
                    const void *w, const float *w_scale, const void *bias, int bias_dt, int T,
                    int in, int out, int sms, void *workspace, size_t workspace_bytes,
                    cudaStream_t stream) {
    assert(T > 0 && in > 0 && in % 16 == 0 && out > 0);
    int aligned = ((uintptr_t)xq | (uintptr_t)w) % 16 == 0;
    if (self->allow_tc && self->tc_ok && T <= self->tc_t && aligned) {
        if (ls_cu_fp8_gemm_tc(y, (const uint8_t *)xq, x_scale, (const uint8_t *)w, w_scale, bias,
                              (ls_cu_dtype_t)bias_dt, T, in, out, stream) != cudaSuccess)
            return -1;
        self->last = LS_FP8_PATH_TC;
        return 0;
    }
    if (self->allow_small && T <= LS_FP8_SMALL_T && aligned) {
        if (ls_cu_fp8_gemm_small(y, (const uint8_t *)xq, x_scale, (const uint8_t *)w, w_scale,
                                 bias, (ls_cu_dtype_t)bias_dt, T, in, out, stream) != cudaSuccess)
            return -1;
        self->last = LS_FP8_PATH_SMALL;
        return 0;
    }
    s_layouts_t l;
    if (s_layouts(&l, T, in, out) != 0)
        return -1;
    int32_t target = sms;
    const s_algo_t *a = NULL;
    int outer = self->allow_outer;
    for (; outer >= 0; outer--) { // the GEMM's own scales where it has them, else after it
        if (!S_OK(cublasLtMatmulDescSetAttribute(self->desc[outer],
                                                 CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target,
                                                 sizeof target)))
            break;
        a = s_algo(self, &l, T, in, out, sms, outer, workspace_bytes);
        if (a->found)
            break;
    }
    int rc = -1;
    if (outer >= 0 && a && a->found) {
        cublasLtMatmulDesc_t d = self->desc[outer];
        float alpha = 1.0f, beta = 0.0f;
        bool ok = !outer ||
                  (S_OK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                       &w_scale, sizeof w_scale)) &&
                   S_OK(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                       &x_scale, sizeof x_scale)));
        ok = ok && S_OK(cublasLtMatmul(self->lt, d, &alpha, w, l.a, xq, l.b, &beta, y, l.d, y,
                                       l.d, &a->algo, workspace, workspace_bytes, stream));
        if (ok && !outer)
            ok = ls_cu_fp8_scale(y, x_scale, w_scale, bias, (ls_cu_dtype_t)bias_dt, T, out,
                                 stream) == cudaSuccess;
        else if (ok && bias)
            ok = ls_cu_bias_add(y, bias, (ls_cu_dtype_t)bias_dt, T, out, stream) == cudaSuccess;
        if (ok) {
            self->last = outer ? LS_FP8_PATH_OUTER : LS_FP8_PATH_AFTER;
            rc = 0;
        }
    }
    s_layouts_free(&l);
    return rc;
}

ls_fp8_path_t ls_fp8_gemm_path(const ls_fp8_gemm_t *self) {
    return self->last;
}

void ls_fp8_gemm_set_tc_tokens(ls_fp8_gemm_t *self, int n) {
    self->tc_t = n < LS_FP8_TC_T ? n : LS_FP8_TC_T;
}

void ls_fp8_gemm_allow(ls_fp8_gemm_t *self, int outer, int small, int tc) {
    self->allow_outer = outer ? 1 : 0;
    self->allow_small = small ? 1 : 0;
    self->allow_tc = tc ? 1 : 0;
}
