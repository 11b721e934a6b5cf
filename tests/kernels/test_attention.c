/*  tests/kernels/test_attention.c — paged KV store + causal paged attention against full
    causal attention computed directly in double from unpaged K/V.

    Every case runs two steps like the engine does: step 1 stores each sequence's cached
    prefix through kv_store, step 2 stores the new chunk and attends with the queries of
    the chunk only. Block tables are random permutations of the physical blocks (never
    contiguous), the caches are pages as the worker's pool holds them (a block of K, then of
    V, then of another layer, page after page: docs/memory.md), q/k/v sit inside one stacked
    qkv buffer (row stride > head columns), and the pages start filled with NaN, so reading
    any slot the step does not own poisons the output. Bounds: NMSE <= 1e-10 and max-abs <=
    1e-5 (values are O(1)).
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ops.h"
#include "test_util.h"

#define MAX_SEQS 16

typedef struct {
    int n_seqs, n_heads, n_kv_heads, head_dim, block_size;
    int prefix[MAX_SEQS]; // tokens already cached before the step
    int chunk[MAX_SEQS];  // query tokens of the step (1 = decode)
} s_case_t;

// The engine-shaped state of one case: full per-sequence Q/K/V, the paged caches and the
// block tables.
typedef struct {
    const s_case_t *c;
    int qkv_stride, kv_dim, max_blocks, num_blocks;
    size_t block_stride;
    float *q[MAX_SEQS], *k[MAX_SEQS], *v[MAX_SEQS]; // (len, heads or kv_heads, head_dim)
    float *pages;                                   // (num_blocks, 3, block_size, kv_dim)
    float *k_cache, *v_cache;                       // in pages: K and V of page p
    int32_t *block_tables;                          // (n_seqs, max_blocks)
} s_world_t;

static int s_slot(const s_world_t *w, int s, int j) {
    int bs = w->c->block_size;
    return w->block_tables[s * w->max_blocks + j / bs] * bs + j % bs;
}

static void s_world_init(s_world_t *w, const s_case_t *c, t_rng_t *r) {
    int bs = c->block_size, total_blocks = 0;
    memset(w, 0, sizeof *w);
    w->c = c;
    w->kv_dim = c->n_kv_heads * c->head_dim;
    w->qkv_stride = c->n_heads * c->head_dim + 2 * w->kv_dim;
    for (int s = 0; s < c->n_seqs; s++) {
        int len = c->prefix[s] + c->chunk[s], nb = (len + bs - 1) / bs;
        if (nb > w->max_blocks)
            w->max_blocks = nb;
        total_blocks += nb;
        w->q[s] = t_alloc(sizeof(float) * len * c->n_heads * c->head_dim);
        w->k[s] = t_alloc(sizeof(float) * len * w->kv_dim);
        w->v[s] = t_alloc(sizeof(float) * len * w->kv_dim);
        t_fill(r, w->q[s], (size_t)len * c->n_heads * c->head_dim, -1, 1);
        t_fill(r, w->k[s], (size_t)len * w->kv_dim, -1, 1);
        t_fill(r, w->v[s], (size_t)len * w->kv_dim, -1, 1);
    }
    // more physical blocks than needed, handed out in shuffled order
    w->num_blocks = total_blocks + 3;
    int32_t *phys = t_alloc(sizeof(int32_t) * w->num_blocks);
    for (int b = 0; b < w->num_blocks; b++)
        phys[b] = b;
    t_shuffle(r, phys, w->num_blocks);
    w->block_tables = t_alloc(sizeof(int32_t) * c->n_seqs * w->max_blocks);
    for (int s = 0, next = 0; s < c->n_seqs; s++)
        for (int b = 0; b < w->max_blocks; b++)
            w->block_tables[s * w->max_blocks + b] =
                b * bs < c->prefix[s] + c->chunk[s] ? phys[next++] : -1;
    free(phys);
    size_t block_n = (size_t)bs * w->kv_dim, n = (size_t)w->num_blocks * 3 * block_n;
    w->block_stride = 3 * block_n;
    w->pages = t_alloc(sizeof(float) * n);
    w->k_cache = w->pages;
    w->v_cache = w->pages + block_n;
    for (size_t i = 0; i < n; i++)
        w->pages[i] = NAN;
}

static void s_world_free(s_world_t *w) {
    for (int s = 0; s < w->c->n_seqs; s++)
        free(w->q[s]), free(w->k[s]), free(w->v[s]);
    free(w->pages), free(w->block_tables);
}

// Packs tokens [from_s, to_s) of every sequence into a stacked qkv buffer (T, qkv_stride)
// with their positions and slots, as the engine's step input; returns T.
static int s_pack(const s_world_t *w, int chunk_step, float *qkv, int32_t *pos,
                  int32_t *slots, int32_t *q_indptr, int32_t *ctx_lens) {
    const s_case_t *c = w->c;
    int T = 0, qd = c->n_heads * c->head_dim;
    q_indptr[0] = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        int from = chunk_step ? c->prefix[s] : 0;
        int to = chunk_step ? c->prefix[s] + c->chunk[s] : c->prefix[s];
        for (int j = from; j < to; j++, T++) {
            float *row = qkv + (size_t)T * w->qkv_stride;
            memcpy(row, w->q[s] + (size_t)j * qd, sizeof(float) * qd);
            memcpy(row + qd, w->k[s] + (size_t)j * w->kv_dim, sizeof(float) * w->kv_dim);
            memcpy(row + qd + w->kv_dim, w->v[s] + (size_t)j * w->kv_dim,
                   sizeof(float) * w->kv_dim);
            pos[T] = j;
            slots[T] = s_slot(w, s, j);
        }
        q_indptr[s + 1] = T;
        ctx_lens[s] = to;
    }
    return T;
}

// out (n_heads*head_dim) for query j of sequence s: softmax over keys 0..j, in double
static void s_attention_ref(double *out, const s_world_t *w, int s, int j) {
    const s_case_t *c = w->c;
    int D = c->head_dim, group = c->n_heads / c->n_kv_heads;
    double *p = t_alloc(sizeof(double) * (j + 1));
    for (int h = 0; h < c->n_heads; h++) {
        const float *qh = w->q[s] + ((size_t)j * c->n_heads + h) * D;
        int kvh = h / group;
        double max = -INFINITY, sum = 0.0;
        for (int i = 0; i <= j; i++) {
            const float *ki = w->k[s] + (size_t)i * w->kv_dim + kvh * D;
            double dot = 0.0;
            for (int d = 0; d < D; d++)
                dot += (double)qh[d] * ki[d];
            p[i] = dot / sqrt((double)D);
            if (p[i] > max)
                max = p[i];
        }
        for (int i = 0; i <= j; i++)
            sum += p[i] = exp(p[i] - max);
        for (int d = 0; d < D; d++) {
            double acc = 0.0;
            for (int i = 0; i <= j; i++)
                acc += p[i] / sum * w->v[s][(size_t)i * w->kv_dim + kvh * D + d];
            out[h * D + d] = acc;
        }
    }
    free(p);
}

static void s_run_case(const s_case_t *c, uint64_t seed) {
    t_rng_t r = {seed};
    s_world_t w;
    s_world_init(&w, c, &r);
    int max_T = 0, max_ctx = 0, qd = c->n_heads * c->head_dim;
    for (int s = 0; s < c->n_seqs; s++) {
        max_T += c->prefix[s] + c->chunk[s];
        if (c->prefix[s] + c->chunk[s] > max_ctx)
            max_ctx = c->prefix[s] + c->chunk[s];
    }
    float *qkv = t_alloc(sizeof(float) * max_T * w.qkv_stride);
    float *out = t_alloc(sizeof(float) * max_T * qd);
    double *ref = t_alloc(sizeof(double) * max_T * qd);
    int32_t *pos = t_alloc(sizeof(int32_t) * max_T), *slots = t_alloc(sizeof(int32_t) * max_T);
    int32_t q_indptr[MAX_SEQS + 1], ctx_lens[MAX_SEQS];

    // step 1: the cached prefixes
    int T = s_pack(&w, 0, qkv, pos, slots, q_indptr, ctx_lens);
    ls_kv_cache_store(w.k_cache, w.v_cache, qkv + qd, qkv + qd + w.kv_dim, NULL, slots, T,
                      c->n_kv_heads, c->head_dim, w.qkv_stride, c->block_size, w.block_stride);
    // step 2: the chunk (or decode token) of every sequence
    T = s_pack(&w, 1, qkv, pos, slots, q_indptr, ctx_lens);
    ls_kv_cache_store(w.k_cache, w.v_cache, qkv + qd, qkv + qd + w.kv_dim, NULL, slots, T,
                      c->n_kv_heads, c->head_dim, w.qkv_stride, c->block_size, w.block_stride);
    ls_attn_meta_t meta = {.n_seqs = c->n_seqs, .n_tokens = T, .max_blocks = w.max_blocks,
                           .max_ctx_len = max_ctx, .q_indptr = q_indptr,
                           .ctx_lens = ctx_lens, .positions = pos, .slot_mapping = slots,
                           .block_tables = w.block_tables};
    ls_attention_forward(out, qkv, w.k_cache, w.v_cache, &meta, c->n_heads, c->n_kv_heads,
                         c->head_dim, c->block_size, w.qkv_stride, w.block_stride);
    // the third block of every page (another layer's) is untouched
    for (int b = 0; b < w.num_blocks; b++)
        for (size_t i = 0; i < (size_t)c->block_size * w.kv_dim; i++)
            assert_true(isnan(w.pages[b * w.block_stride + 2 * (size_t)c->block_size * w.kv_dim + i]));
    for (int s = 0; s < c->n_seqs; s++)
        for (int t = q_indptr[s]; t < q_indptr[s + 1]; t++)
            s_attention_ref(ref + (size_t)t * qd, &w, s, pos[t]);
    double nmse = t_nmse(out, ref, (size_t)T * qd), max_abs = t_max_abs(out, ref, (size_t)T * qd);
    print_message("    T=%d nmse=%.2e max_abs=%.2e\n", T, nmse, max_abs);
    assert_true(nmse <= 1e-10);
    assert_true(max_abs <= 1e-5);
    free(qkv), free(out), free(ref), free(pos), free(slots);
    s_world_free(&w);
}

// one sequence, nothing cached: plain causal prefill (MHA)
static void test_prefill(void **state) {
    s_case_t c = {.n_seqs = 1, .n_heads = 4, .n_kv_heads = 4, .head_dim = 64,
                  .block_size = 16, .prefix = {0}, .chunk = {77}};
    s_run_case(&c, 11);
}

// chunked prefill on top of cached prefixes of several sequences, GQA 8:2, prefixes that
// end mid-block and on a block boundary
static void test_chunk_on_prefix(void **state) {
    s_case_t c = {.n_seqs = 3, .n_heads = 8, .n_kv_heads = 2, .head_dim = 64,
                  .block_size = 16, .prefix = {40, 32, 5}, .chunk = {24, 9, 60}};
    s_run_case(&c, 12);
}

// decode: one query per sequence over contexts of very different lengths, GQA 4:1 with
// head_dim 128 and tiny blocks (many table entries per sequence)
static void test_decode(void **state) {
    s_case_t c = {.n_seqs = 9, .n_heads = 4, .n_kv_heads = 1, .head_dim = 128,
                  .block_size = 4, .prefix = {1, 3, 4, 5, 31, 64, 100, 250, 7},
                  .chunk = {1, 1, 1, 1, 1, 1, 1, 1, 1}};
    s_run_case(&c, 13);
}

// a mixed batch: decodes and prefill chunks (fresh and on a prefix) in one call
static void test_mixed_batch(void **state) {
    s_case_t c = {.n_seqs = 4, .n_heads = 6, .n_kv_heads = 3, .head_dim = 32,
                  .block_size = 8, .prefix = {20, 0, 13, 8}, .chunk = {1, 30, 1, 17}};
    s_run_case(&c, 14);
}

// negative slots (padding) write nothing; the others land at their slots
static void test_kv_store_padding(void **state) {
    enum { T = 4, KV = 2, D = 8, SLOTS = 6, STRIDE = KV * D + 3 };
    t_rng_t r = {15};
    float k[T * STRIDE], v[T * STRIDE], kc[SLOTS * KV * D], vc[SLOTS * KV * D];
    int32_t slots[T] = {5, -1, 0, -1};
    t_fill(&r, k, T * STRIDE, -1, 1);
    t_fill(&r, v, T * STRIDE, -1, 1);
    for (int i = 0; i < SLOTS * KV * D; i++)
        kc[i] = vc[i] = NAN;
    ls_kv_cache_store(kc, vc, k, v, NULL, slots, T, KV, D, STRIDE, SLOTS, (size_t)SLOTS * KV * D);
    for (int s = 0; s < SLOTS; s++) {
        int t = s == 5 ? 0 : s == 0 ? 2 : -1;
        for (int i = 0; i < KV * D; i++) {
            if (t < 0)
                assert_true(isnan(kc[s * KV * D + i]) && isnan(vc[s * KV * D + i]));
            else
                assert_true(kc[s * KV * D + i] == k[t * STRIDE + i] &&
                            vc[s * KV * D + i] == v[t * STRIDE + i]);
        }
    }
}

// v2 folded in (a LoRA delta, engine/model.c): the cache gets the bits of v + v2 added
// first; k and v themselves are left as they were
static void test_kv_store_v2(void **state) {
    enum { T = 5, KV = 2, D = 16, SLOTS = 8, STRIDE = 2 * KV * D + 5 };
    t_rng_t r = {16};
    float k[T * STRIDE], v[T * STRIDE], v2[T * STRIDE], vs[T * STRIDE], v0[T * STRIDE];
    float kc[SLOTS * KV * D], vc[SLOTS * KV * D], kc2[SLOTS * KV * D], vc2[SLOTS * KV * D];
    int32_t slots[T] = {3, 0, -1, 7, 5};
    t_fill(&r, k, T * STRIDE, -1, 1);
    t_fill(&r, v, T * STRIDE, -1, 1);
    t_fill(&r, v2, T * STRIDE, -0.5f, 0.5f);
    memcpy(v0, v, sizeof v);
    memcpy(vs, v, sizeof v);
    ls_add_forward(vs, v2, T * STRIDE);
    for (int i = 0; i < SLOTS * KV * D; i++)
        kc[i] = vc[i] = kc2[i] = vc2[i] = 0.0f;
    ls_kv_cache_store(kc, vc, k, vs, NULL, slots, T, KV, D, STRIDE, 1, (size_t)KV * D);
    ls_kv_cache_store(kc2, vc2, k, v, v2, slots, T, KV, D, STRIDE, 1, (size_t)KV * D);
    assert_memory_equal(kc2, kc, sizeof kc);
    assert_memory_equal(vc2, vc, sizeof vc);
    assert_memory_equal(v, v0, sizeof v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill),     cmocka_unit_test(test_chunk_on_prefix),
        cmocka_unit_test(test_decode),      cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_kv_store_padding), cmocka_unit_test(test_kv_store_v2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
