/*  tests/kernels/test_backend.c — the CPU backend table end to end.

    Two engine steps (a 6-token prefill; then a decode of that sequence batched with a
    4-token prefill of another, a delta folded into RoPE and the KV store) of the attention
    half of a decoder layer with a LoRA'd qkv projection run through ls_backend_cpu_new's
    table: bf16 weights widened at upload, stacked qkv views with row strides, paged caches,
    the LoRA pools through page tables (rows and chunks in pieces), step metadata handed
    over once. Every downloaded result is compared bit for bit with the same kernels called
    directly (rope_kv_store against ls_rope_forward over q, over k, then ls_kv_cache_store).
    The host metadata arrays are scribbled over right after step_begin, which proves the
    backend works from its own copy as the interface promises. (The kernels themselves
    are checked against double references in the other tests.)

    Also buffer_upload_async, the padded upload of LoRA slot loads: an image given in pieces,
    against the element formula of ls_pad_copy written out here.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "lora_pages.h"
#include "test_util.h"

enum {
    VOCAB = 40, C = 64, H = 4, KV = 2, D = 16, QD = H * D, KVD = KV * D,
    QKV = QD + 2 * KVD, BS = 4, NB = 8, MAXB = 2, R_MAX = 8, SLOTS = 3, MAX_T = 6,
    CACHE = NB * BS * KVD, A_N = SLOTS * 3 * R_MAX * C, B_N = SLOTS * QKV * R_MAX
};

static const int32_t s_tables[2 * MAXB] = {5, 2, 7, 1}; // never contiguous
static const int32_t s_ranks[SLOTS] = {0, 4, 8};
static const float s_scalings[SLOTS] = {0.0f, 2.0f, 0.5f};
static const int32_t s_slice_offsets[4] = {0, QD, QD + KVD, QKV};

// One step's metadata, owned: sequence s gets n_new[s] tokens after n_cached[s] cached
// ones, and its adapter slot is slot[s]; the last token of each sequence wants logits.
typedef struct {
    int32_t ids[MAX_T], pos[MAX_T], slots[MAX_T], q_indptr[3], ctx_lens[2],
        tables[2 * MAXB], logit_rows[2], seg_indptr[3], weight_indices[2], ranks[SLOTS];
    float scalings[SLOTS];
    ls_lora_batch_t lora;
    ls_step_t step;
} s_step_data_t;

static void s_step_init(s_step_data_t *d, const int *n_cached, const int *n_new,
                        const int *slot, int n_seqs, t_rng_t *r) {
    int T = 0;
    memcpy(d->tables, s_tables, sizeof d->tables);
    memcpy(d->ranks, s_ranks, sizeof d->ranks);
    memcpy(d->scalings, s_scalings, sizeof d->scalings);
    d->q_indptr[0] = d->seg_indptr[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int j = n_cached[s]; j < n_cached[s] + n_new[s]; j++, T++) {
            d->ids[T] = t_rng_int(r, VOCAB);
            d->pos[T] = j;
            d->slots[T] = s_tables[s * MAXB + j / BS] * BS + j % BS;
        }
        d->q_indptr[s + 1] = d->seg_indptr[s + 1] = T;
        d->ctx_lens[s] = n_cached[s] + n_new[s];
        d->logit_rows[s] = T - 1;
        d->weight_indices[s] = slot[s];
    }
    d->lora = (ls_lora_batch_t){n_seqs, SLOTS, d->seg_indptr, d->weight_indices, NULL,
                                d->ranks, d->scalings, NULL};
    d->step = (ls_step_t){.n_tokens = T, .token_ids = d->ids,
                          .attn = {.n_seqs = n_seqs, .n_tokens = T, .max_blocks = MAXB,
                                   .max_ctx_len = MAXB * BS, .q_indptr = d->q_indptr,
                                   .ctx_lens = d->ctx_lens, .positions = d->pos,
                                   .slot_mapping = d->slots, .block_tables = d->tables},
                          .lora = &d->lora, .n_lora_batches = 1, .n_lora_passes = 1,
                          .n_logit_rows = n_seqs,
                          .logit_rows = d->logit_rows};
}

typedef struct {
    float table[VOCAB * C], wqkv[QKV * C], norm_w[C], a_pool[A_N], b_pool[B_N],
        inv_freq[D / 2], delta[MAX_T * QKV];
    uint16_t table16[VOCAB * C], wqkv16[QKV * C];
    tp_pages_t pa, pb;           // the pools in pages (A rows in 3 pieces, B in 2)
    const void **ta, **tb;       // their tables on the host
} s_weights_t;

// Results of one step, whichever way they were computed.
typedef struct {
    float qkv[MAX_T * QKV], kc[CACHE], vc[CACHE], picked[2 * QD];
    int32_t tokens[2];
} s_out_t;

// The step with direct kernel calls; o->kc, o->vc carry the caches across steps. with_delta:
// a delta added into q, k and v on their way into RoPE and the store (a folded LoRA's).
static void s_step_direct(s_out_t *o, const s_weights_t *w, const ls_step_t *st,
                          int with_delta) {
    static float h[MAX_T * C], xn[MAX_T * C], tmp[MAX_T * 3 * R_MAX], att[MAX_T * QD];
    int T = st->n_tokens;
    ls_embedding_forward(h, w->table, st->token_ids, T, C, 0, VOCAB);
    ls_rmsnorm_forward(xn, NULL, h, NULL, w->norm_w, T, C, 1e-5f);
    ls_matmul_forward(o->qkv, xn, w->wqkv, NULL, T, C, QKV, 0);
    ls_lora_shrink(tmp, xn, tp_view(&w->pa, w->ta), st->lora, C, 3, R_MAX);
    ls_lora_expand(o->qkv, tmp, tp_view(&w->pb, w->tb), st->lora, s_slice_offsets, 3, R_MAX);
    const float *dl = with_delta ? w->delta : NULL;
    ls_rope_forward(o->qkv, dl, st->attn.positions, w->inv_freq, T, H, D, QKV);
    ls_rope_forward(o->qkv + QD, dl ? dl + QD : NULL, st->attn.positions, w->inv_freq, T, KV, D,
                    QKV);
    ls_kv_cache_store(o->kc, o->vc, o->qkv + QD, o->qkv + QD + KVD, dl ? dl + QD + KVD : NULL,
                      st->attn.slot_mapping, T, KV, D, QKV, BS, (size_t)BS * KVD);
    ls_attention_forward(att, o->qkv, o->kc, o->vc, &st->attn, H, KV, D, BS, QKV, (size_t)BS * KVD);
    ls_rows_gather(o->picked, att, st->logit_rows, st->n_logit_rows, QD);
    ls_sampling_params_t sp[2] = {{.temperature = 0.8f, .top_p = 1, .repetition_penalty = 1,
                                   .seed = 1},
                                  {.temperature = 0, .top_p = 1, .repetition_penalty = 1}};
    ls_sampling_batch_t sb = {.n_rows = st->n_logit_rows, .params = sp};
    assert_int_equal(ls_sampling_sample(o->tokens, NULL, NULL, NULL, o->picked, &sb, QD), 0);
}

// Buffers of the backend path: weights (bf16 requested), f32 params, pools, activations,
// caches.
typedef struct {
    ls_buffer_t *w, *wf, *act, *cache, *arena_a, *arena_b, *tab_a, *tab_b;
    ls_view_t table, wqkv, norm, inv, delta, h, xn, qkv, tmp, att, pick, kc, vc;
    ls_lora_mat_t a, b;
} s_bufs_t;

static void s_bufs_init(s_bufs_t *b, ls_backend_t *be, const s_weights_t *w) {
    b->w = be->buffer_new(be, LS_DTYPE_BF16, VOCAB * C + QKV * C);
    b->wf = be->buffer_new(be, LS_DTYPE_F32, C + D / 2 + MAX_T * QKV);
    b->act = be->buffer_new(be, LS_DTYPE_F32, MAX_T * (2 * C + QKV + 3 * R_MAX + QD) + 2 * QD);
    b->cache = be->buffer_new(be, LS_DTYPE_F32, 2 * CACHE);
    assert_true(b->w && b->wf && b->act && b->cache);
    b->table = ls_view(b->w, 0), b->wqkv = ls_view(b->w, VOCAB * C);
    b->norm = ls_view(b->wf, 0), b->inv = ls_view(b->wf, C), b->delta = ls_view(b->wf, C + D / 2);
    b->a = tp_backend(&w->pa, be, SLOTS, LS_DTYPE_F32, &b->arena_a, &b->tab_a);
    b->b = tp_backend(&w->pb, be, SLOTS, LS_DTYPE_F32, &b->arena_b, &b->tab_b);
    size_t off = 0;
    b->h = ls_view(b->act, off), off += MAX_T * C;
    b->xn = ls_view(b->act, off), off += MAX_T * C;
    b->qkv = ls_view(b->act, off), off += MAX_T * QKV;
    b->tmp = ls_view(b->act, off), off += MAX_T * 3 * R_MAX;
    b->att = ls_view(b->act, off), off += MAX_T * QD;
    b->pick = ls_view(b->act, off);
    b->kc = ls_view(b->cache, 0), b->vc = ls_view(b->cache, CACHE);
    assert_int_equal(be->buffer_upload(be, b->table, w->table16, LS_DTYPE_BF16, VOCAB * C), 0);
    assert_int_equal(be->buffer_upload(be, b->wqkv, w->wqkv16, LS_DTYPE_BF16, QKV * C), 0);
    assert_int_equal(be->buffer_upload(be, b->norm, w->norm_w, LS_DTYPE_F32, C), 0);
    assert_int_equal(be->buffer_upload(be, b->inv, w->inv_freq, LS_DTYPE_F32, D / 2), 0);
    assert_int_equal(be->buffer_upload(be, b->delta, w->delta, LS_DTYPE_F32, MAX_T * QKV), 0);
    be->buffer_zero(be, b->kc, 2 * CACHE);
}

static void s_bufs_free(s_bufs_t *b, ls_backend_t *be) {
    be->buffer_free(be, b->w), be->buffer_free(be, b->wf);
    be->buffer_free(be, b->act), be->buffer_free(be, b->cache);
    be->buffer_free(be, b->arena_a), be->buffer_free(be, b->arena_b);
    be->buffer_free(be, b->tab_a), be->buffer_free(be, b->tab_b);
}

// The step through the table. d is scribbled over once step_begin has returned.
static void s_step_backend(s_out_t *o, ls_backend_t *be, const s_bufs_t *b,
                           s_step_data_t *d, int with_delta) {
    int T = d->step.n_tokens, n_rows = d->step.n_logit_rows;
    assert_int_equal(be->step_begin(be, &d->step), 0);
    memset(d, 0x7f, sizeof *d);
    be->embedding(be, b->h, b->table, C, 0, VOCAB);
    be->rmsnorm(be, b->xn, LS_VIEW_NONE, LS_VIEW_NONE, LS_VIEW_NONE, b->h, LS_VIEW_NONE, b->norm,
                T, C, 1e-5f);
    be->matmul(be, b->qkv, b->xn, b->wqkv, LS_VIEW_NONE, T, C, QKV, 0);
    be->lora_shrink(be, b->tmp, b->xn, b->a, C, 3, R_MAX, 0);
    be->lora_expand(be, b->qkv, b->tmp, b->b, s_slice_offsets, 3, R_MAX, 0);
    be->rope_kv_store(be, b->qkv, with_delta ? b->delta : LS_VIEW_NONE, b->inv, b->kc, b->vc, H,
                      KV, D, QKV, BS, (size_t)BS * KVD);
    be->attention(be, b->att, b->qkv, b->kc, b->vc, H, KV, D, BS, QKV, (size_t)BS * KVD);
    be->rows_gather(be, b->pick, b->att, QD);
    assert_int_equal(be->synchronize(be), 0);
    ls_sampling_params_t sp[2] = {{.temperature = 0.8f, .top_p = 1, .repetition_penalty = 1,
                                   .seed = 1},
                                  {.temperature = 0, .top_p = 1, .repetition_penalty = 1}};
    ls_sampling_batch_t sb = {.n_rows = n_rows, .params = sp};
    assert_int_equal(be->sample(be, b->pick, QD, &sb, o->tokens, NULL, NULL, NULL), 0);
    assert_int_equal(be->buffer_download(be, o->qkv, b->qkv, (size_t)T * QKV), 0);
    assert_int_equal(be->buffer_download(be, o->kc, b->kc, CACHE), 0);
    assert_int_equal(be->buffer_download(be, o->vc, b->vc, CACHE), 0);
    assert_int_equal(be->buffer_download(be, o->picked, b->pick, (size_t)n_rows * QD), 0);
}

static void s_assert_same(const s_out_t *x, const s_out_t *y, int T, int n_rows) {
    assert_memory_equal(x->qkv, y->qkv, sizeof(float) * T * QKV);
    assert_memory_equal(x->kc, y->kc, sizeof x->kc);
    assert_memory_equal(x->vc, y->vc, sizeof x->vc);
    assert_memory_equal(x->picked, y->picked, sizeof(float) * n_rows * QD);
    assert_memory_equal(x->tokens, y->tokens, sizeof(int32_t) * n_rows);
}

static uint16_t s_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)(bits >> 16);
}

static void test_backend_two_steps(void **state) {
    static s_weights_t w;
    static s_out_t direct, via_be;
    t_rng_t r = {31};
    t_fill(&r, w.table, VOCAB * C, -1, 1);
    t_fill(&r, w.wqkv, QKV * C, -0.2f, 0.2f);
    t_fill(&r, w.norm_w, C, 0.5f, 1.5f);
    t_fill(&r, w.a_pool, A_N, -0.1f, 0.1f);
    t_fill(&r, w.b_pool, B_N, -0.1f, 0.1f);
    t_fill(&r, w.delta, MAX_T * QKV, -0.1f, 0.1f);
    for (int i = 0; i < VOCAB * C; i++)
        w.table16[i] = s_to_bf16(w.table[i]);
    for (int i = 0; i < QKV * C; i++)
        w.wqkv16[i] = s_to_bf16(w.wqkv[i]);
    // the direct path uses what the backend holds: the bf16 values widened
    ls_convert_bf16_to_f32(w.table, w.table16, VOCAB * C);
    ls_convert_bf16_to_f32(w.wqkv, w.wqkv16, QKV * C);
    ls_rope_config_t rope = {.type = LS_ROPE_DEFAULT, .theta = 10000.0};
    ls_rope_inv_freq_init(w.inv_freq, D, &rope);
    tp_rows(&w.pa, &r, w.a_pool, SLOTS, 3, R_MAX, C, 24, s_ranks);
    tp_chunks(&w.pb, &r, w.b_pool, SLOTS, QKV, R_MAX, QKV / 2 + 3, s_ranks);
    w.ta = t_alloc(sizeof(void *) * SLOTS * w.pa.stride);
    w.tb = t_alloc(sizeof(void *) * SLOTS * w.pb.stride);
    tp_table(&w.pa, SLOTS, w.pa.arena, sizeof(float), w.ta);
    tp_table(&w.pb, SLOTS, w.pb.arena, sizeof(float), w.tb);

    ls_backend_t *be = ls_backend_cpu_new(2);
    assert_non_null(be);
    assert_string_equal(be->name, "cpu");
    s_bufs_t bufs;
    s_bufs_init(&bufs, be, &w);

    // step 1: sequence 0 prefills 6 tokens on slot 2 (rank 8)
    // step 2: sequence 0 decodes at position 6 on slot 2, sequence 1 prefills 4 tokens on
    //         slot 1 (rank 4)
    const int cached[2][2] = {{0, 0}, {6, 0}}, fresh[2][2] = {{6, 0}, {1, 4}};
    const int slot[2] = {2, 1}, n_seqs[2] = {1, 2};
    for (int i = 0; i < 2; i++) {
        s_step_data_t d;
        t_rng_t step_rng = {40 + i};
        s_step_init(&d, cached[i], fresh[i], slot, n_seqs[i], &step_rng);
        int T = d.step.n_tokens;
        s_step_direct(&direct, &w, &d.step, i);
        s_step_backend(&via_be, be, &bufs, &d, i);
        s_assert_same(&direct, &via_be, T, n_seqs[i]);
    }
    s_bufs_free(&bufs, be);
    tp_free(&w.pa), tp_free(&w.pb);
    free(w.ta), free(w.tb);
    ls_backend_destroy(&be);
    assert_null(be);
    ls_backend_destroy(&be); // idempotent
}

static void test_upload_padded(void **state) {
    enum { ROWS = 3, CHUNKS = 4, W = 5, DCH = 7, STRIDE = 31, OFF = 2 };
    ls_backend_t *be = ls_backend_cpu_new(1);
    float img[ROWS * CHUNKS * W], got[ROWS * STRIDE];
    for (int i = 0; i < ROWS * CHUNKS * W; i++)
        img[i] = (float)(i + 1);
    ls_buffer_t *b = be->buffer_new(be, LS_DTYPE_F32, OFF + ROWS * STRIDE);
    for (int w = 0; w <= W; w += W) {
        for (int i = 0; i < OFF + ROWS * STRIDE; i++)  // poison
            ((float *)b->data)[i] = -1.0f;
        // three pieces cut mid-element-run
        ls_host_span_t spans[3] = {{img, 9 * 4}, {img + 9, 22 * 4}, {img + 31, (ROWS * CHUNKS * W - 31) * 4}};
        assert_int_equal(be->buffer_upload_async(be, ls_view(b, OFF), STRIDE, DCH, spans, w ? 3 : 0,
                                                 (size_t)w, CHUNKS, ROWS, NULL), 0);
        assert_int_equal(be->buffer_download(be, got, ls_view(b, OFF), ROWS * STRIDE), 0);
        assert_float_equal(((float *)b->data)[OFF - 1], -1.0f, 0);
        for (int i = 0; i < ROWS; i++)
            for (int k = 0; k < STRIDE; k++) {
                int j = k / DCH, c = k % DCH;
                float want = k >= CHUNKS * DCH ? -1.0f : c < w ? img[(i * CHUNKS + j) * W + c] : 0.0f;
                assert_float_equal(got[i * STRIDE + k], want, 0);
            }
    }
    be->buffer_free(be, b);
    ls_backend_destroy(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_two_steps),
        cmocka_unit_test(test_upload_padded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
