/*  kernels/cpu/attention.c — paged KV cache writes and causal paged attention.

    One function serves prefill (a chunk of queries, possibly on top of a cached prefix)
    and decode (one query per sequence): every query token walks the KV indices 0..p of
    its own sequence through the block table, so nothing depends on how the step was
    batched. One pass per query head with an online (running-max) softmax, as a
    flash/paged GPU kernel does it. Single-threaded; this is the reference.
*/
#include <assert.h>
#include <math.h>
#include <string.h>

#include "ops.h"

// k_cache, v_cache are blocks of (block_size, n_kv_heads*head_dim), block_stride apart;
// k, v are (T, row_stride), slot_mapping is (T)
void ls_kv_cache_store(float *k_cache, float *v_cache, const float *k, const float *v,
                       const float *v2, const int32_t *slot_mapping, int T, int n_kv_heads,
                       int head_dim, int row_stride, int block_size, size_t block_stride) {
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    assert(row_stride >= (int)kv_dim && block_size > 0 && block_stride >= block_size * kv_dim);
    for (int t = 0; t < T; t++) {
        if (slot_mapping[t] < 0)
            continue;
        size_t slot = (size_t)slot_mapping[t];
        size_t at = slot / (size_t)block_size * block_stride + slot % (size_t)block_size * kv_dim;
        memcpy(k_cache + at, k + (size_t)t * row_stride, kv_dim * sizeof(float));
        const float *vt = v + (size_t)t * row_stride;
        if (!v2) {
            memcpy(v_cache + at, vt, kv_dim * sizeof(float));
            continue;
        }
        const float *dt = v2 + (size_t)t * row_stride;
        for (size_t i = 0; i < kv_dim; i++)
            v_cache[at + i] = vt[i] + dt[i];
    }
}

// out is (T, n_heads*head_dim), q is (T, row_stride), k_cache, v_cache as above
void ls_attention_forward(float *out, const float *q, const float *k_cache,
                          const float *v_cache, const ls_attn_meta_t *meta, int n_heads,
                          int n_kv_heads, int head_dim, int block_size, int row_stride,
                          size_t block_stride) {
    assert(n_heads % n_kv_heads == 0 && row_stride >= n_heads * head_dim);
    assert(meta->q_indptr[meta->n_seqs] == meta->n_tokens);
    int group = n_heads / n_kv_heads;
    size_t kv_dim = (size_t)n_kv_heads * head_dim;
    float scale = 1.0f / sqrtf((float)head_dim);

    for (int s = 0; s < meta->n_seqs; s++) {
        assert(meta->ctx_lens[s] <= meta->max_ctx_len &&
               meta->ctx_lens[s] <= meta->max_blocks * block_size);
        const int32_t *table = meta->block_tables + (size_t)s * meta->max_blocks;
        for (int t = meta->q_indptr[s]; t < meta->q_indptr[s + 1]; t++) {
            int n_keys = meta->positions[t] + 1; // causal: KV indices 0..p
            assert(n_keys >= 1 && n_keys <= meta->ctx_lens[s]);
            for (int h = 0; h < n_heads; h++) {
                const float *qh = q + (size_t)t * row_stride + (size_t)h * head_dim;
                size_t kv_off = (size_t)(h / group) * head_dim;
                // the output row is the accumulator: online softmax, so that the running
                // max is subtracted without a scratch row of scores
                float *acc = out + (size_t)t * n_heads * head_dim + (size_t)h * head_dim;
                float max = -INFINITY, sum = 0.0f;
                memset(acc, 0, (size_t)head_dim * sizeof(float));
                for (int j = 0; j < n_keys; j++) {
                    size_t row = (size_t)table[j / block_size] * block_stride +
                                 (size_t)(j % block_size) * kv_dim + kv_off;
                    const float *kj = k_cache + row, *vj = v_cache + row;
                    float score = 0.0f;
                    for (int d = 0; d < head_dim; d++)
                        score += qh[d] * kj[d];
                    score *= scale;
                    if (score > max) { // rescale what was summed under the old max
                        float c = expf(max - score);
                        sum *= c;
                        for (int d = 0; d < head_dim; d++)
                            acc[d] *= c;
                        max = score;
                    }
                    float p = expf(score - max);
                    sum += p;
                    for (int d = 0; d < head_dim; d++)
                        acc[d] += p * vj[d];
                }
                for (int d = 0; d < head_dim; d++)
                    acc[d] /= sum;
            }
        }
    }
}
