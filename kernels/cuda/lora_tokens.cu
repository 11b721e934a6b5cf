/*  kernels/cuda/lora_tokens.cu — the adapters' own rows of the embedding and lm_head (PEFT's
    trainable tokens, and added vocabulary): rows copied over the embedding's output where a
    token has one, the logits rows widened past the vocabulary with -inf, and the logits of an
    adapter's own lm_head rows recomputed on its logit rows (an added id's column among them).
    CPU references: ls_token_rows_forward, ls_logits_widen_forward and ls_token_logits_forward
    (kernels/cpu/lora.c, ops.h).

    Both are small next to the step: the copy moves hidden values per replaced token, and the
    recompute reads each logit row's listed lm_head rows once (a gather-GEMV over a few rows,
    not the vocabulary).
*/
#include <assert.h>
#include <math.h>
#include <stdint.h>

#include "common.cuh"

enum { COPY_THREADS = 256, LOGITS_THREADS = 256 };

// out[t] = rows[idx[t]] where idx[t] >= 0: a block per token row
template <typename TR>
__global__ void k_token_rows(float *out, const TR *__restrict__ rows,
                             const int32_t *__restrict__ idx, int C) {
    int r = idx[blockIdx.x];
    if (r < 0)
        return;
    const TR *src = rows + (size_t)r * C;
    float *dst = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dst[c] = ls_to_f(src[c]);
}

cudaError_t ls_cu_token_rows(float *out, const void *rows, ls_cu_dtype_t rows_dt,
                             const int32_t *idx, int T, int C, cudaStream_t stream) {
    assert(C > 0);
    if (T == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(rows_dt, TR,
        k_token_rows<TR><<<T, COPY_THREADS, 0, stream>>>(out, (const TR *)rows, idx, C));
    LS_CU_CHECK_LAUNCH();
}

// logits[i, ids[k]] = rows[k] · x[i] for k in [f, f + n) of tile (i, f, n): a block per
// tile, a warp per row k
template <typename TR>
__global__ void k_token_logits(float *logits, const float *__restrict__ x,
                               const TR *__restrict__ rows, const float *__restrict__ ids,
                               const int32_t *__restrict__ tiles, int C, int V) {
    const int32_t *t = tiles + 3 * (size_t)blockIdx.x;
    int i = t[0], f = t[1], n = t[2];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const float *xi = x + (size_t)i * C;
    for (int k = f + warp; k < f + n; k += nw) {
        const TR *rk = rows + (size_t)k * C;
        float s = 0.0f;
        for (int c = lane; c < C; c += 32)
            s += ls_to_f(rk[c]) * xi[c];
        s = ls_warp_sum(s);
        if (lane == 0)
            logits[(size_t)i * V + (int)ids[k]] = s;
    }
}

cudaError_t ls_cu_token_logits(float *logits, const float *x, const void *rows,
                               ls_cu_dtype_t rows_dt, const float *ids, const int32_t *tiles,
                               int n_tiles, int C, int V, cudaStream_t stream) {
    assert(C > 0 && V > 0);
    if (n_tiles == 0)
        return cudaSuccess;
    LS_CU_DISPATCH(rows_dt, TR,
        k_token_logits<TR><<<n_tiles, LOGITS_THREADS, 0, stream>>>(
            logits, x, (const TR *)rows, ids, tiles, C, V));
    LS_CU_CHECK_LAUNCH();
}

// wide[r, c] = head[r, c] for c < V, -inf past it: a row per blockIdx.y, its columns spread
// over blockIdx.x (memory-bound: a copy of the row)
__global__ void k_logits_widen(float *wide, const float *__restrict__ head, int V, int W) {
    size_t r = blockIdx.y;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < W; c += gridDim.x * blockDim.x)
        wide[r * W + c] = c < V ? head[r * V + c] : -INFINITY;
}

cudaError_t ls_cu_logits_widen(float *wide, const float *head, int R, int V, int W,
                               cudaStream_t stream) {
    assert(V > 0 && V <= W && R <= 65535);
    if (R == 0)
        return cudaSuccess;
    int chunks = (W + COPY_THREADS * 4 - 1) / (COPY_THREADS * 4);
    dim3 grid(chunks < 1 ? 1 : chunks, R);
    k_logits_widen<<<grid, COPY_THREADS, 0, stream>>>(wide, head, V, W);
    LS_CU_CHECK_LAUNCH();
}
