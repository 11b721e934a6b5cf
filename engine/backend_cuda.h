/*  engine/backend_cuda.h — the CUDA backend of engine/backend.h.

    Built only when CMake finds nvcc (target ls_engine_cuda, which defines LS_HAVE_CUDA for
    whoever links it). The op semantics are those of kernels/ops.h; tests/gpu checks every
    op against the CPU backend.

    Storage and precision:
    - a buffer stores its requested dtype: F32 as fp32, BF16 as bf16, F16 as fp16, F8E4M3 as
      E4M3 bytes (uploads convert from any source dtype on the device, rounding to nearest
      even; an F8E4M3 buffer takes E4M3 uploads only, and downloads widen it);
    - activations are fp32: every activation argument (x, y, out, tmp, residual, q, k, v,
      logits, gate_up) must be an F32 buffer (asserted), except a matmul's x, which may
      also be a copy in its weights' dtype (rmsnorm's and silu_mul's out_lp);
    - weights (matmul w and bias, embedding table, norm weights, inv_freq, LoRA A/B pools)
      may be any dtype; values are widened to fp32 when read, accumulation is fp32;
    - matmul: an F32 weight runs cublasSgemm with TF32 off (fp32 exact to summation
      order); a BF16 (F16) weight runs cublasGemmEx bf16 x bf16 (f16 x f16) -> fp32 with
      fp32 accumulation, the fp32 activations rounded once to bf16 (f16) on the way in, by
      the matmul or, for an out_lp input, by the op that made it (the same rounding: the
      same bits) — the only place where the CUDA backend rounds activations;
    - matmul_fp8: the fp32 activations quantized per token to E4M3 (the CPU reference's
      bits) by the op that made them (rmsnorm's, silu_mul's out_lp) or else by a pass of
      its own (ls_cu_fp8_quantize_rows), then an E4M3 x E4M3 -> fp32 GEMM on cuBLASLt
      with the per-token and per-channel scales (engine/fp8_gemm.h);
    - KV cache: the dtype of the cache buffers (BF16 recommended; F32 works too).

    Step metadata is packed into one pinned host block and copied to the device with one
    transfer per step_begin; the LoRA segment description is flattened there into tiles of
    work (kernels/cuda/ops_cuda.h). Everything runs in order on one non-blocking stream.
*/
#ifndef LS_BACKEND_CUDA_H
#define LS_BACKEND_CUDA_H

#include <stddef.h>

#include "fp8_gemm.h" // ls_fp8_path_t

#ifdef __cplusplus
extern "C" {
#endif

#include "backend.h" // C headers without linkage guards of their own

// The CUDA backend on GPU `device`. NULL on failure (no device, no memory, cuBLAS init),
// with one sentence in err.
ls_backend_t *ls_backend_cuda_new(int device, char *err, size_t errlen);
// The backend's one stream (a cudaStream_t), for work that must queue in order with its ops
// (the NCCL collectives of comm_nccl.h).
void *ls_backend_cuda_stream(ls_backend_t *be);
// Step graphs (backend_cuda.cu): on by default; off runs every step with plain launches
// (the tests' and benchmarks' comparison).
void ls_backend_cuda_set_graphs(ls_backend_t *be, int on);
// The side queue (backend.h side_begin..side_wait; a decode step's LoRA beside the base
// GEMM): on by default; off leaves the hooks NULL, so the model runs LoRA after each GEMM
// on the one stream (the tests' and benchmarks' comparison). leave_sms: SMs a GEMM leaves
// to the LoRA beside it (cuBLAS SM count target); < 0: the default rule, by the step's
// tokens (backend_cuda.cu s_gemm_sms); >= 0: that count for every GEMM (the benchmarks'
// sweeps); 0: the GEMMs as without side work (bit-identical steps).
void ls_backend_cuda_set_side(ls_backend_t *be, int on, int leave_sms);
// The most tokens a matmul on 16-bit weights gives the GEMV (kernels/cuda/ops_cuda.h
// ls_cu_gemv), and an FP8 matmul its tensor-core GEMM (engine/fp8_gemm.h, the same tiles; at
// most LS_FP8_TC_T): n < 0 the device's (ls_cu_gemv_tokens(), the default), else n up to
// LS_CU_GEMV_MAX_T (the tests' checks of every form on any device; 0: cuBLAS always). Set
// before a step graph is captured: a replay keeps the kernels of its capture.
void ls_backend_cuda_set_gemv_tokens(ls_backend_t *be, int n);
// Graphs captured and graph replays so far.
void ls_backend_cuda_graph_counts(ls_backend_t *be, long *captured, long *replayed);
// SiLU·mul ops with gate_up's LoRA (lora_silu_mul) launched so far: the tests' evidence that
// a step took that route.
long ls_backend_cuda_lora_silu_count(ls_backend_t *be);
// decode_block (kernels/cuda/block.cu) on (the default) or off (the model's ops one by one:
// the tests' and benchmarks' comparison), and its launches so far (graph replays not counted).
// Set before a step graph is captured: a replay keeps the kernels of its capture.
void ls_backend_cuda_set_block(ls_backend_t *be, int on);
long ls_backend_cuda_block_count(ls_backend_t *be);
// FP8 GEMMs (matmul_fp8, engine/fp8_gemm.h ls_fp8_gemm_allow): outer 0 makes cuBLASLt's
// apply the scales after an unscaled GEMM, small 0 and tc 0 keep the GEMMs of our own off
// (0, 0: every T to cuBLASLt; the tests' checks of each path); 1, 1, 1 is the default.
// ls_backend_cuda_fp8_path: the last one's.
void ls_backend_cuda_set_fp8_paths(ls_backend_t *be, int outer, int small, int tc);
ls_fp8_path_t ls_backend_cuda_fp8_path(ls_backend_t *be);

#ifdef __cplusplus
}
#endif

#endif
