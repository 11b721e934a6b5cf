/*  kernels/cpu/sampling.c — per-row logit processing, logprobs and seeded sampling.

    The pipeline and every tie-break are specified in ops.h; this file follows it step by
    step. Scratch is one processed-logit row, one rank order and one mark/count row of the
    vocabulary size, allocated per call.

    Known limit: top-k and top-p rank the whole vocabulary with qsort (O(V log V) per row,
    ~10 ms for V = 128k); fine for a reference (the CUDA kernel finds the boundary by radix
    select: kernels/cuda/sampling.cu).
*/
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

// The splitmix64 finalizer: a bijective 64-bit mix with full avalanche.
static uint64_t s_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t ls_rng_u64(uint64_t seed, uint64_t step, uint64_t idx) {
    // nested mixes so that (seed, step, idx) triples do not alias one another the way a
    // plain sum of the three would
    return s_mix64(s_mix64(s_mix64(seed) ^ step) + 0x9e3779b97f4a7c15ull * (idx + 1));
}

float ls_rng_uniform(uint64_t seed, uint64_t step, uint64_t idx) {
    return ((float)(ls_rng_u64(seed, step, idx) >> 41) + 0.5f) * 0x1p-23f;
}

// qsort comparator state cannot be passed through qsort, so the rank order is sorted on
// (logit, id) pairs instead of ids.
typedef struct {
    float l;
    int32_t id;
} s_ranked_t;

static int s_ranked_cmp(const void *a, const void *b) {
    const s_ranked_t *x = a, *y = b;
    if (x->l != y->l)
        return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

// Repetition penalty on the tokens of ids (n) not marked yet in mark (V), marking them:
// once per distinct token, as HF's gather/scatter does it.
static void s_repetition_apply(float *l, int32_t *mark, const int32_t *ids, int n, float rp,
                               int V) {
    for (int i = 0; i < n; i++) {
        int v = ids[i];
        assert(v >= 0 && v < V);
        if (mark[v])
            continue;
        mark[v] = 1;
        l[v] = l[v] > 0 ? l[v] / rp : l[v] * rp;
    }
}

static void s_unmark(int32_t *mark, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        mark[ids[i]] = 0;
}

// Step 1 of ops.h on one row. l is (V) in/out; mark is (V) zeroed scratch, left zeroed
static void s_apply_penalties(float *l, int32_t *mark, const ls_sampling_params_t *sp,
                              const int32_t *prompt, int n_prompt, const int32_t *output,
                              int n_output, int V) {
    if (sp->repetition_penalty != 1.0f) {
        s_repetition_apply(l, mark, prompt, n_prompt, sp->repetition_penalty, V);
        s_repetition_apply(l, mark, output, n_output, sp->repetition_penalty, V);
        s_unmark(mark, prompt, n_prompt);
        s_unmark(mark, output, n_output);
    }
    if (sp->frequency_penalty != 0.0f || sp->presence_penalty != 0.0f) {
        for (int i = 0; i < n_output; i++) { // mark counts occurrences here
            assert(output[i] >= 0 && output[i] < V);
            mark[output[i]]++;
        }
        for (int i = 0; i < n_output; i++) {
            int v = output[i];
            if (!mark[v])
                continue; // already applied at an earlier occurrence
            l[v] -= sp->frequency_penalty * mark[v] + sp->presence_penalty;
            mark[v] = 0;
        }
    }
}

// Fills (ids, lps) with the n best of lp (V) by (lp desc, id asc): insertion into a short
// sorted list, O(V n) with n a handful.
static void s_top_n(int32_t *ids, float *lps, const float *lp, int n, int V) {
    int have = 0;
    for (int v = 0; v < V; v++) {
        if (have == n && !(lp[v] > lps[n - 1]))
            continue; // ties keep the earlier, lower id
        int i = have < n ? have++ : n - 1;
        while (i > 0 && lp[v] > lps[i - 1]) {
            ids[i] = ids[i - 1];
            lps[i] = lps[i - 1];
            i--;
        }
        ids[i] = v;
        lps[i] = lp[v];
    }
}

// Step 5 of ops.h: returns how many of the first tokens in rank order (sorted in place
// into rank) survive top-k and top-p; 0 when neither is active (rank left unsorted).
static int s_truncate(s_ranked_t *rank, const float *l, const ls_sampling_params_t *sp,
                      int V) {
    int use_k = sp->top_k > 0 && sp->top_k < V, use_p = sp->top_p < 1.0f;
    if (!use_k && !use_p)
        return 0;
    for (int v = 0; v < V; v++)
        rank[v] = (s_ranked_t){l[v], v};
    qsort(rank, (size_t)V, sizeof *rank, s_ranked_cmp);
    int keep = use_k ? sp->top_k : V;
    if (use_p) {
        double total = 0.0, cum = 0.0;
        for (int i = 0; i < keep; i++)
            total += exp((double)rank[i].l - rank[0].l);
        int i = 0;
        while (i < keep && cum < sp->top_p * total)
            cum += exp((double)rank[i++].l - rank[0].l);
        keep = i > 0 ? i : 1; // top_p <= 0 still keeps the top token
    }
    return keep;
}

// tokens is (n_rows), logprobs is (n_rows) or NULL, top_ids and top_logprobs are
// (n_rows, max_top_n) or NULL, logits is (n_rows, V)
int ls_sampling_sample(int32_t *tokens, float *logprobs, int32_t *top_ids,
                       float *top_logprobs, const float *logits,
                       const ls_sampling_batch_t *batch, int V) {
    float *l = malloc((size_t)V * sizeof *l);
    int32_t *mark = calloc((size_t)V, sizeof *mark);
    s_ranked_t *rank = malloc((size_t)V * sizeof *rank);
    if (!l || !mark || !rank) {
        free(rank);
        free(mark);
        free(l);
        return -1;
    }

    for (int row = 0; row < batch->n_rows; row++) {
        const ls_sampling_params_t *sp = &batch->params[row];
        const int32_t *pi = batch->prompt_indptr, *oi = batch->output_indptr;
        memcpy(l, logits + (size_t)row * V, (size_t)V * sizeof *l);
        if (batch->mask_index && batch->mask_index[row] >= 0) {  // step 0
            const uint32_t *m = batch->masks + (size_t)batch->mask_index[row] * (size_t)((V + 31) / 32);
            for (int v = 0; v < V; v++)
                if (!((m[v >> 5] >> (v & 31)) & 1))
                    l[v] = -INFINITY;
        }
        s_apply_penalties(l, mark, sp, pi ? batch->prompt_ids + pi[row] : NULL,
                          pi ? pi[row + 1] - pi[row] : 0,
                          oi ? batch->output_ids + oi[row] : NULL,
                          oi ? oi[row + 1] - oi[row] : 0, V);
        int greedy = sp->temperature <= 0.0f;
        float max = -INFINITY;
        int argmax = 0;
        for (int v = 0; v < V; v++) {
            if (!greedy)
                l[v] /= sp->temperature;
            if (l[v] > max) {
                max = l[v];
                argmax = v;
            }
        }

        // step 3: log_softmax of the processed row, kept in l from here on
        double sum = 0.0;
        for (int v = 0; v < V; v++)
            sum += exp((double)l[v] - max);
        float lse = max + (float)log(sum);
        for (int v = 0; v < V; v++)
            l[v] -= lse;
        if (top_ids && sp->n_logprobs > 0) {
            assert(sp->n_logprobs <= batch->max_top_n);
            s_top_n(top_ids + (size_t)row * batch->max_top_n,
                    top_logprobs + (size_t)row * batch->max_top_n, l, sp->n_logprobs, V);
        }

        int chosen = argmax;
        if (!greedy) {
            // ranking and race run on the logprobs, as ops.h specifies
            int keep = s_truncate(rank, l, sp, V);
            float min_l = sp->min_p > 0.0f ? l[argmax] + logf(sp->min_p) : -INFINITY;
            float best = -INFINITY;
            for (int i = 0; i < (keep ? keep : V); i++) {
                int v = keep ? rank[i].id : i;
                if (l[v] < min_l || l[v] == -INFINITY)
                    continue;
                float e = -logf(ls_rng_uniform(sp->seed, sp->step, (uint64_t)v));
                float key = l[v] - logf(e);
                if (key > best || (key == best && v < chosen)) {
                    best = key;
                    chosen = v;
                }
            }
        }
        tokens[row] = chosen;
        if (logprobs)
            logprobs[row] = l[chosen];
    }
    free(rank);
    free(mark);
    free(l);
    return 0;
}
