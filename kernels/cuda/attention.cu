/*  kernels/cuda/attention.cu — causal paged attention over the KV cache (prefill chunks
    on a cached prefix and decode alike). CPU reference: kernels/cpu/attention.c.

    One block per (query token, kv head): the block serves all the query heads of that kv
    head's GQA group (up to 8 per pass), so each K/V row it reads from the paged cache is
    used group times. Its 4 warps take keys j = warp, warp+4, ...; within a warp the lanes
    split head_dim (lane holds elements lane + 32e), a score is a warp-shuffle sum, and
    every warp keeps an online (running-max) softmax per head, exactly the update the
    reference makes. The 4 partial states are merged through shared memory at the end.

    Known limits (correct, not yet fast): a prefill token re-reads its whole prefix (no
    query tiling, K/V come from L2 rather than shared memory), and a long decode context is
    walked by one block (no split-KV); both are next session's work.
*/
#include <assert.h>
#include <math.h>

#include "common.cuh"

enum { ATT_WARPS = 4, ATT_GC = 8 }; // warps per block, query heads per pass

// out is (T, n_heads*head_dim), q is (T, row_stride),
// k_cache, v_cache are (slots, n_kv_heads*head_dim); E = elements per lane (head_dim <= 32E)
template <typename TC, int E>
__global__ void __launch_bounds__(ATT_WARPS * 32)
k_attention(float *out, const float *q, const TC *k_cache, const TC *v_cache,
            const int32_t *tok_seq, const int32_t *positions, const int32_t *block_tables,
            int max_blocks, int n_heads, int n_kv_heads, int head_dim, int block_size,
            int row_stride, float scale) {
    extern __shared__ float smem[]; // (ATT_WARPS, ATT_GC, head_dim + 2): acc, max, sum
    int t = blockIdx.x, kvh = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int group = n_heads / n_kv_heads;
    int n_keys = positions[t] + 1; // causal: KV indices 0..p
    const int32_t *table = block_tables + (size_t)tok_seq[t] * max_blocks;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    size_t kv_off = (size_t)kvh * head_dim;
    int hs = head_dim + 2;

    for (int g0 = 0; g0 < group; g0 += ATT_GC) {
        int gn = min(ATT_GC, group - g0);
        float qr[ATT_GC][E], acc[ATT_GC][E], m[ATT_GC], l[ATT_GC];
#pragma unroll
        for (int g = 0; g < ATT_GC; g++) {
            const float *qh = q + (size_t)t * row_stride + (size_t)(kvh * group + g0 + g) * head_dim;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = lane + 32 * e;
                qr[g][e] = (g < gn && d < head_dim) ? qh[d] : 0.0f;
                acc[g][e] = 0.0f;
            }
            m[g] = -INFINITY;
            l[g] = 0.0f;
        }
        for (int j = warp; j < n_keys; j += ATT_WARPS) {
            size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
            const TC *kr = k_cache + slot * kv_dim + kv_off;
            const TC *vr = v_cache + slot * kv_dim + kv_off;
            float kv[E], vv[E];
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = lane + 32 * e;
                kv[e] = d < head_dim ? ls_to_f(kr[d]) : 0.0f;
                vv[e] = d < head_dim ? ls_to_f(vr[d]) : 0.0f;
            }
#pragma unroll
            for (int g = 0; g < ATT_GC; g++) {
                if (g >= gn)
                    break;
                float part = 0.0f;
#pragma unroll
                for (int e = 0; e < E; e++)
                    part += qr[g][e] * kv[e];
                float score = ls_warp_sum(part) * scale;
                if (score > m[g]) { // rescale what was summed under the old max
                    float c = expf(m[g] - score);
                    l[g] *= c;
#pragma unroll
                    for (int e = 0; e < E; e++)
                        acc[g][e] *= c;
                    m[g] = score;
                }
                float p = expf(score - m[g]);
                l[g] += p;
#pragma unroll
                for (int e = 0; e < E; e++)
                    acc[g][e] += p * vv[e];
            }
        }
#pragma unroll
        for (int g = 0; g < ATT_GC; g++) {
            if (g >= gn)
                break;
            float *s = smem + (size_t)(warp * ATT_GC + g) * hs;
#pragma unroll
            for (int e = 0; e < E; e++) {
                int d = lane + 32 * e;
                if (d < head_dim)
                    s[d] = acc[g][e];
            }
            if (lane == 0) {
                s[head_dim] = m[g];
                s[head_dim + 1] = l[g];
            }
        }
        __syncthreads();
        // merge the warps' partial softmax states; a warp that saw no key has max -inf
        // and contributes exp(-inf) = 0
        for (int idx = threadIdx.x; idx < gn * head_dim; idx += blockDim.x) {
            int g = idx / head_dim, d = idx % head_dim;
            float M = -INFINITY;
            for (int w = 0; w < ATT_WARPS; w++)
                M = fmaxf(M, smem[(size_t)(w * ATT_GC + g) * hs + head_dim]);
            float L = 0.0f, O = 0.0f;
            for (int w = 0; w < ATT_WARPS; w++) {
                const float *s = smem + (size_t)(w * ATT_GC + g) * hs;
                float c = s[head_dim] == -INFINITY ? 0.0f : expf(s[head_dim] - M);
                L += s[head_dim + 1] * c;
                O += s[d] * c;
            }
            out[(size_t)t * n_heads * head_dim + (size_t)(kvh * group + g0 + g) * head_dim + d] =
                O / L;
        }
        __syncthreads();
    }
}

template <typename TC, int E>
static cudaError_t s_launch(float *out, const float *q, const void *k_cache,
                            const void *v_cache, const int32_t *tok_seq,
                            const int32_t *positions, const int32_t *block_tables,
                            int max_blocks, int T, int n_heads, int n_kv_heads, int head_dim,
                            int block_size, int row_stride, cudaStream_t stream) {
    dim3 grid(T, n_kv_heads);
    size_t smem = (size_t)ATT_WARPS * ATT_GC * (head_dim + 2) * sizeof(float);
    float scale = 1.0f / sqrtf((float)head_dim); // as the reference forms it
    k_attention<TC, E><<<grid, ATT_WARPS * 32, smem, stream>>>(
        out, q, (const TC *)k_cache, (const TC *)v_cache, tok_seq, positions, block_tables,
        max_blocks, n_heads, n_kv_heads, head_dim, block_size, row_stride, scale);
    return cudaGetLastError();
}

cudaError_t ls_cu_attention(float *out, const float *q, const void *k_cache,
                            const void *v_cache, ls_cu_dtype_t cache_dt,
                            const int32_t *tok_seq, const int32_t *positions,
                            const int32_t *block_tables, int max_blocks, int T, int n_heads,
                            int n_kv_heads, int head_dim, int block_size, int row_stride,
                            cudaStream_t stream) {
    assert(n_kv_heads > 0 && n_heads % n_kv_heads == 0 && row_stride >= n_heads * head_dim);
    assert(head_dim > 0 && head_dim <= 256);
    if (T == 0)
        return cudaSuccess;
#define LS_ATT_E(E)                                                                           \
    LS_CU_DISPATCH(cache_dt, TC,                                                              \
        return s_launch<TC, E>(out, q, k_cache, v_cache, tok_seq, positions, block_tables,   \
                               max_blocks, T, n_heads, n_kv_heads, head_dim, block_size,      \
                               row_stride, stream))
    if (head_dim <= 64) {
        LS_ATT_E(2);
    } else if (head_dim <= 128) {
        LS_ATT_E(4);
    } else {
        LS_ATT_E(8);
    }
#undef LS_ATT_E
    return cudaErrorInvalidValue;
}
