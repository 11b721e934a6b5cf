/*  engine/fp8_gemm.h — the CUDA backend's FP8 GEMM (matmul_fp8 of backend.h): cuBLASLt's, and
    at decode sizes two of our own (below).

    y (T, out) = (xq · wqᵀ)[t][o] · x_scale[t] · w_scale[o]: E4M3 inputs on Hopper's FP8
    tensor cores, fp32 accumulation and output. Row-major y = x·wᵀ is column-major
    yᵀ (out, T) = op(A)·B with A = w read as (in, out) and transposed, B = xq as (in, T):
    the "TN" layout cuBLASLt's FP8 GEMMs require, with in (the leading dimension of both) a
    multiple of 16.

    The scales are applied by the GEMM itself where cuBLASLt has a kernel for per-row A and
    per-column B scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS >= 12.9 on
    sm_90: the scales of A's M rows and B's N columns are w_scale and x_scale); where it has
    none for a shape (the heuristic finds no algorithm), the GEMM runs unscaled and
    ls_cu_fp8_scale applies them after — the same values up to the rounding order of the
    two multiplications, at the cost of one pass over y. Which one ran is reported, and
    tests force the second to check it too.

    Algorithms are looked up once per (T, in, out, SM target) and kept in a small table.

    At decode sizes the GEMM is our own instead (kernels/cuda/fp8.cu), a stream of the
    weights with the scales and bias in the same launch, where cuBLASLt's FP8 kernels read
    the weights far below copy bandwidth and need the pass after them:
    - up to LS_FP8_TC_T tokens ls_cu_fp8_gemm_tc, on the FP8 tensor cores (mma.sync E4M3),
      where the device runs it (sm_89+, and the library built for it: sm_90a; the sm_80
      build has no mma) — up to 8 on an H200 (ls_fp8_gemm_set_tc_tokens, below);
    - else up to LS_FP8_SMALL_T tokens ls_cu_fp8_gemm_small, on CUDA cores (sm_80);
    - else cuBLASLt. The CUDA cores' issue rate bounds small past a few tokens, and each
      16-row block of tc reads all of the tokens' codes: as many bytes as its weights at 16.
    kernels/cuda/dev/dev_fp8 measures the crossovers (README.md there, "FP8 decode GEMM").
    All three take xq and w 16-byte aligned; unaligned ones go to cuBLASLt.
*/
#ifndef LS_FP8_GEMM_H
#define LS_FP8_GEMM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// The most tokens the tensor-core GEMM of our own takes (see above): dev_fp8 on an H100, a
// Llama-3-8B layer's four projections take 82.1 / 83.4 / 84.6 / 86.1 / 99.4 µs at 1 / 2 / 4 /
// 8 / 16 tokens against cuBLASLt's (+ scale pass) 103.9 / 103.1 / 101.5 / 104.2 / 103.6 and
// small's 92.3 / 90.8 at 1 / 2; at 32 and 64 cuBLASLt wins (108.0 / 117.3 against 178.5 /
// 332.2).
#define LS_FP8_TC_T 16
// The most tokens the CUDA-core GEMM of our own takes where tc does not run (see above):
// dev_fp8's crossover on an H100, where a layer's four projections take 96 µs against
// cuBLASLt's 104 at 1 and 2 tokens, the same at 4, and 185 against 105 at 8.
#define LS_FP8_SMALL_T 2

// Which GEMM a run took.
typedef enum {
    LS_FP8_PATH_AFTER = 0, // cuBLASLt unscaled, then ls_cu_fp8_scale
    LS_FP8_PATH_OUTER = 1, // cuBLASLt with its outer-vector scales
    LS_FP8_PATH_SMALL = 2, // ls_cu_fp8_gemm_small (T <= LS_FP8_SMALL_T)
    LS_FP8_PATH_TC = 3,    // ls_cu_fp8_gemm_tc (T <= LS_FP8_TC_T, sm_89+)
} ls_fp8_path_t;

typedef struct ls_fp8_gemm ls_fp8_gemm_t;

// NULL + err when cuBLASLt cannot be set up.
ls_fp8_gemm_t *ls_fp8_gemm_new(char *err, size_t errlen);
void ls_fp8_gemm_destroy(ls_fp8_gemm_t **self_p);

// Enqueues y = (xq · wqᵀ) · x_scale[t] · w_scale[o] (+ bias, or NULL) on stream. y (T, out)
// fp32; xq (T, in) and w (out, in) E4M3; x_scale (T), w_scale (out) fp32; bias (out) of
// bias_dt (an ls_cu_dtype_t). sms: the SM count the GEMM targets (0: all). workspace: bytes
// cuBLASLt may use, queued work on stream only. Returns 0, or -1 when cuBLASLt fails.
int ls_fp8_gemm_run(ls_fp8_gemm_t *self, float *y, const void *xq, const float *x_scale,
                    const void *w, const float *w_scale, const void *bias, int bias_dt, int T,
                    int in, int out, int sms, void *workspace, size_t workspace_bytes,
                    cudaStream_t stream);

// The GEMM the last run took.
ls_fp8_path_t ls_fp8_gemm_path(const ls_fp8_gemm_t *self);
// Tests and the dev bench: outer 0 makes every later cuBLASLt run take the unscaled GEMM +
// ls_cu_fp8_scale (1, the default: the GEMM's own scales where cuBLASLt has them); small 0
// never takes ls_cu_fp8_gemm_small, tc 0 never ls_cu_fp8_gemm_tc (1, the defaults: each
// where it runs, as above). small 1, tc 0 is the sm_80 choice; 0, 0 sends every T to
// cuBLASLt.
void ls_fp8_gemm_allow(ls_fp8_gemm_t *self, int outer, int small, int tc);
// The most tokens ls_cu_fp8_gemm_tc takes, at most LS_FP8_TC_T (the default): the CUDA
// backend gives it as many as its 16-bit GEMV (ls_cu_gemv_tokens(); both run gemv_mma.cuh's
// tiles of 8 tokens, whose second loses to cuBLAS(Lt) on an H200: dev_fp8 there, a layer's
// four projections alone at 16 tokens 87.4 against cuBLASLt's 83.8 us; the FP8 step,
// bench_decode_cuda --fp8 --gemv-tokens 16 against 8, two rounds, batch 12 x 128 3.785 /
// 3.772 -> 3.624 / 3.617 ms, batch 16 3.921 / 3.898 -> 3.635 / 3.693, with 8 adapters 4.67-4.81
// -> 3.79-3.94).
void ls_fp8_gemm_set_tc_tokens(ls_fp8_gemm_t *self, int n);

#ifdef __cplusplus
}
#endif

#endif
