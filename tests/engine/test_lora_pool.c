// The LoRA pool's rules: adapters loaded into the slots and pages they are assigned (hits,
// loads, evictions counted), moved and evicted only when told, a slot emptied when its pages
// are given to another slot or claimed as KV, removal from both tiers, the host tier's byte
// capacity (rank-proportional images, refused when full, pages given back), images built on
// another thread, refusals on add and assign, and the exact page layout read back through the
// page tables (zero rows of rank_pattern modules and untouched targets, per-module scalings
// folded into B, uniform ones kept per slot), also for rows and chunks larger than a page
// (pieces) and images spanning many pages; pages in proportion to rank and targets.
// And the slot plan (slot_plan.h) the engine tests and benchmarks use in place of a scheduler:
// a batch's rows mapped to slots, its victims reaching the pool, its refusals. The victim
// policies themselves (LRU, FIFO, pinned and in-batch slots kept) are the scheduler's, tested
// in tests/scheduler (slot_victims).
#include "random_model.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "backend.h"
#include "lora_pool.h"
#include "slot_plan.h"

static char err[1024];


#define ALL7 "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]"

// The adapters every test can load: name, adapter_config.json, how ranks follow from it.
static const struct {
    const char *name, *config;
    unsigned mask;
    int r;
} ADS[] = {
    {"r4", "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": " ALL7 "}",
     0x7f, 4},
    {"q8", "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 4, \"target_modules\": [\"q_proj\"]}",
     1u << LS_TARGET_Q, 8},
    {"r16", "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 16, \"target_modules\": " ALL7 "}",
     0x7f, 16},
    // v_proj rank 8, the rest 2; gate_proj alpha 6, the rest 4: scalings 2, 0.5 and 3
    {"pattern", "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": " ALL7
     ", \"rank_pattern\": {\"v_proj\": 8}, \"alpha_pattern\": {\"gate_proj\": 6}}", 0x7f, 2},
    // q rank 2, the embedding rank 4 (scaling 1), lm_head rank 3 (scaling 4/3): folded
    {"global", "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": "
     "[\"q_proj\", \"embed_tokens\", \"lm_head\"], \"rank_pattern\": {\"embed_tokens\": 4, "
     "\"lm_head\": 3}}", 1u << LS_TARGET_Q, 2},
};
// the first N_LAYER_ADS target the layers only
enum { AD_R4, AD_Q8, AD_R16, AD_PATTERN, N_LAYER_ADS, AD_GLOBAL = N_LAYER_ADS, N_ADS };

typedef struct {
    char *dir;
    ls_backend_t *be;
    ls_model_config_t cfg;
    ls_lora_pool_t *pool;
    ls_buffer_t *arena;  // the pool's pages
    size_t page_n;       // elements of a page (0: the toy model's KV page, 2 KiB)
    int extra_vocab;     // extra_vocab_size of the pools new_pool makes
} ctx_t;

static int setup(void **state) {
    ctx_t *c = calloc(1, sizeof *c);
    c->dir = fx_tmpdir();
    c->be = ls_backend_cpu_new(1);
    const char *j = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 16, "
                    "\"intermediate_size\": 24, \"num_attention_heads\": 4, "
                    "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 32}";
    assert_int_equal(ls_model_config_parse(j, strlen(j), "config.json", &c->cfg, err, sizeof err), 0);
    for (int a = 0; a < N_ADS; a++) {
        char d[1024];
        int ranks[2 * LS_TARGET_COUNT];
        rm_ranks_uniform(ranks, 2, ADS[a].mask, ADS[a].r);
        if (a == AD_PATTERN)
            ranks[LS_TARGET_V] = ranks[LS_TARGET_COUNT + LS_TARGET_V] = 8;
        fx_path(d, sizeof d, c->dir, ADS[a].name);
        assert_int_equal(rm_write_adapter_globals(d, &c->cfg, ADS[a].config, ranks,
                                                  a == AD_GLOBAL ? 4 : 0, a == AD_GLOBAL ? 3 : 0,
                                                  LS_DTYPE_F32, (unsigned)a + 1), 0);
    }
    *state = c;
    return 0;
}

static int teardown(void **state) {
    ctx_t *c = *state;
    ls_lora_pool_destroy(&c->pool);
    ls_lora_pool_destroy(&c->pool); // idempotent
    if (c->arena)
        c->be->buffer_free(c->be, c->arena);
    ls_backend_destroy(&c->be);
    fx_rmdir(&c->dir);
    free(c);
    return 0;
}

static ls_adapter_t *load(ctx_t *c, int a) {
    char d[1024];
    ls_adapter_t *ad = ls_adapter_load(fx_path(d, sizeof d, c->dir, ADS[a].name), &c->cfg, 16,
                                       err, sizeof err);
    if (!ad)
        fail_msg("%s: %s", ADS[a].name, err);
    return ad;
}

// host: the host tier's bytes (0: the default). The arena: each slot's share for the
// largest adapter (slot_plan.h), plus 2 pages below them.
static void new_pool(ctx_t *c, int slots, size_t host, int r_max, unsigned mask) {
    ls_lora_pool_config_t pc = {.max_loras_per_batch = slots, .max_lora_rank = r_max, .host_bytes = host,
                                .target_mask = mask, .extra_vocab_size = c->extra_vocab};
    size_t page_n = c->page_n ? c->page_n : 512;
    int per = ls_lora_pool_max_pages(&c->cfg, &pc, page_n * sizeof(float), LS_DTYPE_F32, err, sizeof err);
    if (per < 1)
        fail_msg("pool: %s", err);
    if (c->arena)
        c->be->buffer_free(c->be, c->arena);
    ls_page_arena_t a = {c->be->buffer_new(c->be, LS_DTYPE_F32, ((size_t)per * slots + 2) * page_n), page_n,
                         per * slots + 2};
    c->arena = a.buf;
    for (size_t i = 0; i < a.buf->n; i++)  // what no adapter lies on reads NaN
        ((float *)a.buf->data)[i] = NAN;
    c->pool = ls_lora_pool_new(c->be, &c->cfg, &pc, &a, err, sizeof err);
    if (!c->pool)
        fail_msg("pool: %s", err);
}

// assign onto the slot's share of the arena (slot_plan.h)
static int assign(ctx_t *c, const char *id, int slot) {
    return slot_plan_assign(c->pool, id, slot, err, sizeof err);
}

static int pages_of(ctx_t *c, const char *id) {
    int rank, pages;
    size_t bytes;
    assert_int_equal(ls_lora_pool_image_info(c->pool, id, &rank, &bytes, &pages), 0);
    return pages;
}

// Adds adapter file a under id; returns add's result (0 / -1 with err).
static int add(ctx_t *c, const char *id, int a) {
    ls_adapter_t *ad = load(c, a);
    int rc = ls_lora_pool_add_adapter(c->pool, id, &ad, err, sizeof err);
    assert_true(rc == 0 ? ad == NULL : ad != NULL); // ownership moves only on success
    ls_adapter_destroy(&ad);
    return rc;
}

// Each adapter in the slot it is assigned; assigning it there again is a hit, not a load.
static void test_assign_fills_slots(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 16, 0);
    assert_int_equal(ls_lora_pool_n_slots(c->pool), 3);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(add(c, "b", AD_Q8), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), -1);  // in the host tier only
    assert_int_equal(assign(c, "a", 1), 0);
    assert_int_equal(assign(c, "b", 2), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 1);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), 2);
    const int32_t *ranks = ls_lora_pool_slot_ranks(c->pool);
    const float *sc = ls_lora_pool_slot_scalings(c->pool);
    assert_int_equal(ranks[LS_LORA_SLOT_BASE], 0);
    assert_int_equal(ranks[1], 4);
    assert_int_equal(ranks[2], 8);
    assert_float_equal(sc[1], 2.0f, 0);  // 8 / 4
    assert_float_equal(sc[2], 0.5f, 0);  // 4 / 8
    assert_int_equal(assign(c, "b", 2), 0);
    ls_lora_pool_stats_t st = ls_lora_pool_stats(c->pool);
    assert_int_equal(st.cold_loads, 2);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.slot_evictions, 0);
    // the groups of the layers' targets exist by default (q8 only uses the qkv one), the
    // vocabulary-sized ones only when named
    for (int g = 0; g < LS_LORA_GROUP_COUNT; g++)
        assert_true(ls_lora_pool_has_group(c->pool, g) == (g < LS_LORA_GROUP_EMBED));
}

// remove drops an adapter from both tiers; unknown ids are refused.
static void test_remove(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 16, 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(ls_lora_pool_remove(c->pool, "nope", err, sizeof err), -1);
    assert_contains(err, "\"nope\" is not loaded");
    assert_int_equal(assign(c, "a", 2), 0);
    assert_int_equal(ls_lora_pool_remove(c->pool, "a", err, sizeof err), 0);
    assert_false(ls_lora_pool_contains(c->pool, "a"));
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), -1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 0);
    int32_t pages[1] = {0};
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, pages, 1, err, sizeof err), -1);
    assert_contains(err, "\"a\" is not loaded");
}

// on a list of ids terminated by a "." sentinel (NULL entries are base requests)
static int plan_map(slot_plan_t *p, int32_t *slots, const char *const *ids) {
    int n = 0;
    while (!ids[n] || strcmp(ids[n], ".") != 0)
        n++;
    return slot_plan_map(p, ids, n, slots, err, sizeof err);
}
#define MAP(p, slots, ...) plan_map((p), (slots), (const char *const[]){__VA_ARGS__, "."})

// The slot plan: rows of one adapter share its slot, base rows get the sentinel, the
// scheduler's victim (LRU here) is what the pool evicts, and a batch it cannot place is
// refused before any slot changes.
static void test_plan(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 16, 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(add(c, "b", AD_Q8), 0);
    assert_int_equal(add(c, "c", AD_R4), 0);
    slot_plan_t *p = slot_plan_new(c->pool, LORA_EVICT_LRU);
    assert_non_null(p);
    int32_t s[5];
    assert_int_equal(MAP(p, s, "a", NULL, "a", "b", ""), 0);  // "" is the base model too
    assert_int_equal(s[1], LS_LORA_SLOT_BASE);
    assert_int_equal(s[4], LS_LORA_SLOT_BASE);
    assert_int_equal(s[0], s[2]);
    assert_true(s[0] > 0 && s[3] > 0 && s[0] != s[3]);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), s[0]);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), s[3]);
    int slot_a = s[0], slot_b = s[3];
    // a used last: c takes b's slot
    assert_int_equal(MAP(p, s, "a"), 0);
    assert_int_equal(MAP(p, s, "c", "a"), 0);
    assert_int_equal(s[0], slot_b);
    assert_int_equal(s[1], slot_a);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), -1);
    assert_int_equal(ls_lora_pool_stats(c->pool).slot_evictions, 1);
    // refused, nothing moved: three adapters for two slots, an id the pool does not hold
    assert_int_equal(MAP(p, s, "a", "b", NULL, "a", "c"), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "more distinct adapters than the 2 slots");
    assert_int_equal(MAP(p, s, "b", "nope"), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "adapter \"nope\" is not in the pool");
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), slot_a);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "c"), slot_b);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), -1);
    // an adapter removed and added again is loaded again where the plan puts it
    assert_int_equal(ls_lora_pool_remove(c->pool, "a", err, sizeof err), 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(MAP(p, s, "a"), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), s[0]);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[s[0]], 4);
    slot_plan_destroy(&p);
    slot_plan_destroy(&p);  // idempotent
}

// The host tier holds what its bytes allow: images take whole pages in proportion to their
// rank and targets, a full tier refuses (the pool never evicts by itself), removal gives the
// pages back. The toy model's images are one 64 KiB page each.
static void test_host_tier(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, (size_t)3 << 16, 16, 0);
    assert_int_equal(ls_lora_pool_image_max_bytes(c->pool), 1 << 16);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(add(c, "b", AD_R16), 0);
    assert_int_equal(add(c, "c", AD_Q8), 0);
    ls_lora_pool_stats_t st = ls_lora_pool_stats(c->pool);
    assert_int_equal(st.host_total, 3 << 16);
    assert_int_equal(st.host_used, 3 << 16);
    assert_int_equal(st.host_adapters, 3);
    assert_int_equal(add(c, "d", AD_R4), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "host tier is full");
    bool full = false;
    ls_adapter_t *d = load(c, AD_R4);
    assert_null(ls_lora_pool_image_new(c->pool, d, &full, err, sizeof err));
    assert_true(full);
    ls_adapter_destroy(&d);
    int rank, pages;
    size_t bytes;
    assert_int_equal(ls_lora_pool_image_info(c->pool, "b", &rank, &bytes, &pages), 0);
    assert_int_equal(rank, 16);
    assert_int_equal(bytes, 1 << 16);
    assert_true(pages >= 1);
    assert_int_equal(ls_lora_pool_image_info(c->pool, "d", &rank, &bytes, &pages), -1);
    assert_false(ls_lora_pool_contains(c->pool, "d"));
    assert_int_equal(assign(c, "b", 1), 0);
    assert_int_equal(ls_lora_pool_remove(c->pool, "b", err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_stats(c->pool).host_used, 2 << 16);
    assert_int_equal(add(c, "d", AD_R4), 0);
    assert_int_equal(ls_lora_pool_stats(c->pool).host_adapters, 3);
    // a tier that cannot hold one adapter of max_lora_rank is refused at creation
    ls_lora_pool_destroy(&c->pool);
    ls_lora_pool_config_t small = {.max_loras_per_batch = 2, .max_lora_rank = 8, .host_bytes = 1000};
    ls_page_arena_t a = {c->arena, 512, 4};
    assert_null(ls_lora_pool_new(c->be, &c->cfg, &small, &a, err, sizeof err));
    print_message("refused: %s\n", err);
    assert_contains(err, "cannot hold one adapter of rank 8");
}

static void check_slot(ctx_t *c, const ls_adapter_t *ad, int slot, bool folded);

// A model large enough for images of many pages: each image's bytes follow its rank and
// targets, and a slot loaded from an image that spans pages holds exactly the adapter.
typedef struct {
    ls_lora_pool_t *pool;
    ls_adapter_t *ad[N_LAYER_ADS];
    ls_lora_image_t *img[N_LAYER_ADS];
} s_build_t;

static void *s_build(void *arg) {
    s_build_t *b = arg;
    char e[256];
    for (int a = 0; a < N_LAYER_ADS; a++)
        b->img[a] = ls_lora_pool_image_new(b->pool, b->ad[a], NULL, e, sizeof e);
    return NULL;
}

static void test_images_across_pages(void **state) {
    ctx_t *c = *state;
    const char *j = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, "
                    "\"intermediate_size\": 512, \"num_attention_heads\": 4, "
                    "\"num_key_value_heads\": 2, \"num_hidden_layers\": 2, \"vocab_size\": 32}";
    assert_int_equal(ls_model_config_parse(j, strlen(j), "config.json", &c->cfg, err, sizeof err), 0);
    for (int a = 0; a < N_LAYER_ADS; a++) {
        int ranks[2 * LS_TARGET_COUNT];
        rm_ranks_uniform(ranks, 2, ADS[a].mask, ADS[a].r);
        if (a == AD_PATTERN)
            ranks[LS_TARGET_V] = ranks[LS_TARGET_COUNT + LS_TARGET_V] = 8;
        char d[1024];
        fx_path(d, sizeof d, c->dir, ADS[a].name);
        assert_int_equal(rm_write_adapter(d, &c->cfg, ADS[a].config, ranks, LS_DTYPE_F32,
                                          (unsigned)a + 7), 0);
    }
    new_pool(c, 4, (size_t)64 << 20, 16, 0);
    // per layer, A: (6r rows of 256 + r of 512) f32 = r x 8 KiB; B: 2048 output rows of 8
    // columns a chunk, r rounded up to 8: 64 KiB a chunk. So (r + rp) x 16 KiB for two layers:
    // r16 512 KiB, and host pages of 64 KiB (1/64 of that, at least 64 KiB)
    assert_int_equal(ls_lora_pool_image_max_bytes(c->pool), 512 << 10);
    // images built on another thread while this one uses the pool
    s_build_t b = {.pool = c->pool};
    for (int a = 0; a < N_LAYER_ADS; a++)
        b.ad[a] = load(c, a);
    assert_int_equal(add(c, "early", AD_R4), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_build, &b), 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(assign(c, "early", 1 + i % 4), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    // the stream's bytes, whole 64 KiB host pages of them
    static const size_t stream[N_LAYER_ADS] = {
        [AD_R4] = (4 + 8) << 14,  // 192 KiB
        // q only: its 8 rows of A (k and v take no page) and one chunk of qkv's 512 rows
        [AD_Q8] = 2 * (8 * 256 * 4 + 512 * 32),
        [AD_R16] = (16 + 16) << 14,
        // q, k, o, gate, up, down rank 2, v 8: 18 rows of 256 and 2 of 512, one chunk of 2048
        [AD_PATTERN] = 2 * ((18 * 256 + 2 * 512) * 4 + 2048 * 32),
    };
    for (int a = 0; a < N_LAYER_ADS; a++) {
        assert_non_null(b.img[a]);
        assert_int_equal(ls_lora_image_bytes(b.img[a]), (stream[a] + 0xffff) & ~(size_t)0xffff);
        // pages of 2 KiB, every unit 1 or 2 KiB (B in pieces of 64 rows): packed tight
        assert_int_equal(ls_lora_image_pages(b.img[a]), (int)((stream[a] + 2047) / 2048));
        assert_int_equal(ls_lora_pool_add(c->pool, ADS[a].name, &b.img[a], err, sizeof err), 0);
        assert_null(b.img[a]);
    }
    assert_int_equal(ls_lora_pool_stats(c->pool).host_used, (3 + 3 + 1 + 8 + 3) << 16);
    // every image through every slot, twice (a slot refilled by a smaller rank: its table anew)
    for (int round = 0; round < 2; round++)
        for (int a = 0; a < N_LAYER_ADS; a++) {
            int slot = 1 + (a + round) % 4;
            assert_int_equal(assign(c, ADS[a].name, slot), 0);
            check_slot(c, b.ad[a], slot, a == AD_PATTERN);
        }
    for (int a = 0; a < N_LAYER_ADS; a++)
        ls_adapter_destroy(&b.ad[a]);
}

static void test_add_refusals(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 8, 1u << LS_TARGET_Q | 1u << LS_TARGET_V);
    assert_true(ls_lora_pool_has_group(c->pool, LS_LORA_GROUP_QKV));
    assert_false(ls_lora_pool_has_group(c->pool, LS_LORA_GROUP_O));
    assert_false(ls_lora_pool_has_group(c->pool, LS_LORA_GROUP_GATE_UP));
    assert_int_equal(add(c, "q", AD_Q8), 0);
    assert_int_equal(add(c, "q", AD_Q8), -1);
    assert_contains(err, "already loaded");
    assert_int_equal(add(c, "big", AD_R16), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "rank 16, above max_lora_rank 8");
    assert_int_equal(add(c, "all", AD_R4), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "targets k_proj, o_proj, gate_proj, up_proj, down_proj, which "
                         "lora_target_modules does not enable");
    assert_int_equal(add(c, "", AD_R4), -1);
    assert_int_equal(ls_lora_pool_stats(c->pool).host_adapters, 1);
}

// The slot's table entries (n of them from entry `at` of its (layer, group) matrix): the
// CPU backend's tables hold host pointers, two F32 elements an entry.
static void s_entries(ctx_t *c, ls_lora_mat_t m, int slot, size_t n, const float **out) {
    float *bits = malloc(2 * n * sizeof *bits);
    assert_int_equal(c->be->buffer_download(c->be, bits, ls_view(m.tab.buf, m.tab.off + 2 * (size_t)slot * m.stride),
                                            2 * n), 0);
    memcpy(out, bits, n * sizeof *out);
    free(bits);
}

// Element e of row i (A) or (row o, column j) of chunk i (B and the embedding's A), through the
// entries of a slot.
static float s_row_at(const float *const *t, ls_lora_mat_t m, int i, int e) {
    return t[(size_t)i * m.np + e / m.piece][e % m.piece];
}
static float s_chunk_at(const float *const *t, ls_lora_mat_t m, int o, int j) {
    return t[(size_t)(j / 8) * m.np + o / m.piece][(size_t)(o % m.piece) * 8 + j % 8];
}

// The slot's A rows and B chunks below its rank hold exactly the adapter, read through the
// page table: rows/columns past a module's rank and targets it does not touch zero,
// per-module scalings folded into B when they differ, B as stored when uniform.
static void check_slot(ctx_t *c, const ls_adapter_t *ad, int slot, bool folded) {
    int r_max = ls_lora_pool_r_max(c->pool), r = ls_lora_pool_slot_ranks(c->pool)[slot];
    static const ls_target_t tg[LS_LORA_GROUP_COUNT][LS_LORA_MAX_SLICES] = {
        {LS_TARGET_Q, LS_TARGET_K, LS_TARGET_V}, {LS_TARGET_O}, {LS_TARGET_GATE, LS_TARGET_UP},
        {LS_TARGET_DOWN}, {LS_TARGET_EMBED}, {LS_TARGET_LM_HEAD}};
    assert_true(r > 0 && slot < ls_lora_pool_n_slots(c->pool));
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
            if (!ls_lora_pool_has_group(c->pool, g) || (g >= LS_LORA_GROUP_EMBED && l > 0))
                continue;  // the global groups: one layer
            ls_lora_group_shape_t sh = ls_lora_pool_group_shape(c->pool, g);
            ls_lora_mat_t a, b;
            ls_lora_pool_mats(c->pool, l, g, &a, &b);
            bool embed = g == LS_LORA_GROUP_EMBED;
            size_t na = (size_t)(embed ? (r_max + 7) / 8 : sh.n_slices * r_max) * a.np;
            size_t nb = (size_t)((r_max + 7) / 8) * b.np;
            const float **ta = malloc(na * sizeof *ta), **tb = malloc(nb * sizeof *tb);
            s_entries(c, a, slot, na, ta);
            s_entries(c, b, slot, nb, tb);
            for (int k = 0; k < sh.n_slices; k++) {
                const ls_lora_weights_t *w = g >= LS_LORA_GROUP_EMBED
                                                 ? ls_adapter_global_target(ad, tg[g][k])
                                                 : ls_adapter_layer_target(ad, l, tg[g][k]);
                float fold = folded ? w->scaling : 1.0f;
                for (int j = 0; j < r; j++)
                    for (int i = 0; i < sh.in; i++) {
                        float want = j < w->rank ? w->A[(size_t)j * sh.in + i] : 0.0f;
                        float got = embed ? s_chunk_at(ta, a, i, j) : s_row_at(ta, a, k * r_max + j, i);
                        assert_float_equal(got, want, 0);
                    }
                for (int o = sh.slice_offsets[k]; o < sh.slice_offsets[k + 1]; o++)
                    for (int j = 0; j < r; j++) {
                        int ok = o - sh.slice_offsets[k];
                        float want = j < w->rank ? w->B[(size_t)ok * w->rank + j] * fold : 0.0f;
                        assert_float_equal(s_chunk_at(tb, b, o, j), want, 0);
                    }
            }
            free(ta);
            free(tb);
        }
}

static void test_slot_layout(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 16, 0);
    assert_int_equal(add(c, "pattern", AD_PATTERN), 0);
    assert_int_equal(add(c, "uniform", AD_R4), 0);
    int32_t s[2] = {1, 2};
    assert_int_equal(assign(c, "pattern", s[0]), 0);
    assert_int_equal(assign(c, "uniform", s[1]), 0);
    const int32_t *ranks = ls_lora_pool_slot_ranks(c->pool);
    const float *sc = ls_lora_pool_slot_scalings(c->pool);
    assert_int_equal(ranks[s[0]], 8); // the largest module rank (v_proj)
    assert_float_equal(sc[s[0]], 1.0f, 0);
    assert_int_equal(ranks[s[1]], 4);
    assert_float_equal(sc[s[1]], 2.0f, 0);
    ls_adapter_t *pattern = load(c, AD_PATTERN), *uniform = load(c, AD_R4);
    // the pattern adapter really has three different scalings
    assert_float_equal(ls_adapter_layer_target(pattern, 0, LS_TARGET_Q)->scaling, 2.0f, 0);
    assert_float_equal(ls_adapter_layer_target(pattern, 0, LS_TARGET_V)->scaling, 0.5f, 0);
    assert_float_equal(ls_adapter_layer_target(pattern, 0, LS_TARGET_GATE)->scaling, 3.0f, 0);
    check_slot(c, pattern, s[0], true);
    check_slot(c, uniform, s[1], false);
    ls_adapter_destroy(&pattern);
    ls_adapter_destroy(&uniform);
}

// With embed_tokens and lm_head enabled: their groups (one layer each, vocabulary-sized)
// hold the adapter that targets them, zeros for one that does not, also after a slot changes
// hands; the slot's targets say which.
static void test_slot_layout_global(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 16, (1u << LS_TARGET_ALL) - 1);
    assert_true(ls_lora_pool_has_group(c->pool, LS_LORA_GROUP_EMBED));
    assert_true(ls_lora_pool_has_group(c->pool, LS_LORA_GROUP_LM_HEAD));
    ls_lora_group_shape_t e = ls_lora_pool_group_shape(c->pool, LS_LORA_GROUP_EMBED);
    ls_lora_group_shape_t h = ls_lora_pool_group_shape(c->pool, LS_LORA_GROUP_LM_HEAD);
    assert_int_equal(e.in, c->cfg.vocab_size);
    assert_int_equal(e.slice_offsets[1], c->cfg.hidden_size);
    assert_int_equal(h.in, c->cfg.hidden_size);
    assert_int_equal(h.slice_offsets[1], c->cfg.vocab_size);
    assert_int_equal(add(c, "global", AD_GLOBAL), 0);
    assert_int_equal(add(c, "uniform", AD_R4), 0);
    assert_int_equal(assign(c, "global", 1), 0);
    assert_int_equal(assign(c, "uniform", 2), 0);
    const unsigned *targets = ls_lora_pool_slot_targets(c->pool);
    assert_int_equal(targets[1], 1u << LS_TARGET_Q | 1u << LS_TARGET_EMBED | 1u << LS_TARGET_LM_HEAD);
    assert_int_equal(targets[2], 0x7fu);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[1], 4);  // the embedding's rank
    assert_float_equal(ls_lora_pool_slot_scalings(c->pool)[1], 1.0f, 0);  // folded
    ls_adapter_t *global = load(c, AD_GLOBAL), *uniform = load(c, AD_R4);
    assert_float_equal(ls_adapter_global_target(global, LS_TARGET_EMBED)->scaling, 1.0f, 0);
    assert_float_equal(ls_adapter_global_target(global, LS_TARGET_LM_HEAD)->scaling, 4.0f / 3, 1e-7);
    check_slot(c, global, 1, true);
    check_slot(c, uniform, 2, false);
    assert_int_equal(assign(c, "uniform", 1), 0);
    assert_int_equal(targets[1], 0x7fu);
    check_slot(c, uniform, 1, false);
    ls_adapter_destroy(&global);
    ls_adapter_destroy(&uniform);
}

// assign: the caller (the scheduler, through the worker) names the slot; the adapter lands
// there, moves when named into another slot, evicts what was there.
static void test_assign(void **state) {
    ctx_t *c = *state;
    new_pool(c, 3, 0, 16, 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(add(c, "b", AD_Q8), 0);
    assert_int_equal(assign(c, "a", 2), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 2);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 4);
    ls_adapter_t *ad = load(c, AD_R4);
    check_slot(c, ad, 2, false);
    ls_adapter_destroy(&ad);
    // moving a: its old slot is empty afterwards
    assert_int_equal(assign(c, "a", 1), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 0);
    // b takes a's slot: a is no longer resident
    assert_int_equal(assign(c, "b", 1), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), -1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[1], 8);
    ad = load(c, AD_Q8);
    check_slot(c, ad, 1, false);
    ls_adapter_destroy(&ad);
    assert_int_equal(ls_lora_pool_stats(c->pool).slot_evictions, 1);
    // bad ids and slots are refused
    int32_t pg[64];
    for (int i = 0; i < 64; i++)
        pg[i] = i;
    assert_int_equal(ls_lora_pool_assign(c->pool, "nope", 2, pg, 64, err, sizeof err), -1);
    assert_non_null(strstr(err, "not loaded"));
    int need = pages_of(c, "a");
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", LS_LORA_SLOT_BASE, pg, need, err, sizeof err), -1);
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 4, pg, need, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an adapter slot"));
    // and bad pages: too few, outside the arena, one named twice
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, pg, need - 1, err, sizeof err), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "pages, ");
    pg[need - 1] = ls_lora_pool_arena(c->pool).n_pages;
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, pg, need, err, sizeof err), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "outside the arena");
    pg[need - 1] = 0;
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, pg, need, err, sizeof err), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, "named twice");
    // nothing changed, and a good list still goes
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), 1);
    pg[need - 1] = need - 1;
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, pg, need, err, sizeof err), 0);
}

// Rank-proportional: no padding to max_lora_rank. On all seven targets of the toy model an
// adapter of rank 8 takes a quarter of the pages of one of rank 32 in slots of rank 64 (B
// columns rounded up to 8, A rows exactly the rank), and a q-only one a fraction of that.
static void test_rank_proportional(void **state) {
    ctx_t *c = *state;
    static const struct {
        const char *name, *config;
        unsigned mask;
        int r;
    } ads[] = {
        {"r8", "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 8, \"target_modules\": " ALL7 "}", 0x7f, 8},
        {"r32", "{\"peft_type\": \"LORA\", \"r\": 32, \"lora_alpha\": 8, \"target_modules\": " ALL7 "}", 0x7f, 32},
        {"q8", "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
         1u << LS_TARGET_Q, 8},
    };
    c->page_n = 64;  // 256-byte pages: A rows (16 or 24 floats) and chunk pieces of 8 rows
    new_pool(c, 3, 0, 64, 0);
    int pages[3];
    for (int a = 0; a < 3; a++) {
        char d[1024];
        int ranks[2 * LS_TARGET_COUNT];
        rm_ranks_uniform(ranks, 2, ads[a].mask, ads[a].r);
        fx_path(d, sizeof d, c->dir, ads[a].name);
        assert_int_equal(rm_write_adapter(d, &c->cfg, ads[a].config, ranks, LS_DTYPE_F32, 40u + (unsigned)a), 0);
        ls_adapter_t *ad = ls_adapter_load(d, &c->cfg, 64, err, sizeof err);
        assert_non_null(ad);
        assert_int_equal(ls_lora_pool_add_adapter(c->pool, ads[a].name, &ad, err, sizeof err), 0);
        pages[a] = pages_of(c, ads[a].name);
        assert_int_equal(assign(c, ads[a].name, 1 + a), 0);
        ad = ls_adapter_load(d, &c->cfg, 64, err, sizeof err);
        check_slot(c, ad, 1 + a, false);
        ls_adapter_destroy(&ad);
    }
    print_message("pages: r8 %d, r32 %d, q8 %d; rank 64 on every target %d\n", pages[0], pages[1], pages[2],
                  ls_lora_pool_image_max_pages(c->pool));
    assert_int_equal(pages[1], 4 * pages[0]);
    assert_int_equal(ls_lora_pool_image_max_pages(c->pool), 8 * pages[0]);
    assert_true(pages[2] * 4 < pages[0]);
}

// Pages smaller than a row: the rows of A and the chunks of B are cut in pieces, and the
// slot still reads exactly the adapter (the embedding's vocabulary chunks too).
static void test_pieces(void **state) {
    ctx_t *c = *state;
    c->page_n = 8;  // 32 bytes: A rows of 16 and 24 floats in 2 and 3 pieces, chunks a row a piece
    new_pool(c, 2, 0, 16, (1u << LS_TARGET_ALL) - 1);
    ls_lora_mat_t a, b;
    ls_lora_pool_mats(c->pool, 0, LS_LORA_GROUP_DOWN, &a, &b);
    assert_int_equal(a.np, 3);
    assert_int_equal(a.piece, 8);
    assert_int_equal(b.piece, 1);
    ls_lora_pool_mats(c->pool, 0, LS_LORA_GROUP_EMBED, &a, &b);
    assert_int_equal(a.np, 32);  // the vocabulary's rows
    assert_int_equal(add(c, "pattern", AD_PATTERN), 0);
    assert_int_equal(add(c, "global", AD_GLOBAL), 0);
    assert_int_equal(assign(c, "pattern", 1), 0);
    assert_int_equal(assign(c, "global", 2), 0);
    ls_adapter_t *pattern = load(c, AD_PATTERN), *global = load(c, AD_GLOBAL);
    check_slot(c, pattern, 1, true);
    check_slot(c, global, 2, true);
    ls_adapter_destroy(&pattern);
    ls_adapter_destroy(&global);
}

// The scheduler takes pages back by giving them to another adapter or to KV: the slot whose
// adapter lay there loses it (claim), the others keep theirs; an assign onto the pages of
// another slot's adapter empties that slot.
static void test_claim(void **state) {
    ctx_t *c = *state;
    new_pool(c, 3, 0, 16, 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    assert_int_equal(add(c, "b", AD_Q8), 0);
    assert_int_equal(assign(c, "a", 1), 0);
    assert_int_equal(assign(c, "b", 2), 0);
    int per = ls_lora_pool_image_max_pages(c->pool), top = ls_lora_pool_arena(c->pool).n_pages;
    // pages below the shares, and one of b's (slot 2's share starts at top - 2 * per)
    int32_t kv[3] = {0, 1, top - 2 * per};
    ls_lora_pool_claim(c->pool, kv, 2);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 1);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), 2);
    ls_lora_pool_claim(c->pool, kv + 2, 1);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), -1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 1);
    // b again, now in slot 3 on a's first page: a leaves slot 1
    int need = pages_of(c, "b");
    int32_t pg[64];
    for (int i = 0; i < need; i++)
        pg[i] = i ? i + 1 : top - per;
    assert_int_equal(ls_lora_pool_assign(c->pool, "b", 3, pg, need, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), -1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[1], 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), 3);
    ls_adapter_t *ad = load(c, AD_Q8);
    check_slot(c, ad, 3, false);
    ls_adapter_destroy(&ad);
    // the same adapter, slot and pages: a hit; an empty slot cleared stays empty
    assert_int_equal(ls_lora_pool_assign(c->pool, "b", 3, pg, need, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_stats(c->pool).hits, 1);
    ls_lora_pool_slot_clear(c->pool, 1);
    ls_lora_pool_slot_clear(c->pool, 3);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), -1);
    assert_true(ls_lora_pool_contains(c->pool, "b"));
}

// Trainable tokens (lora_tokens.h): refused without rows for them or beyond extra_vocab_size;
// a slot holds its adapter's rows (the embedding's looked up by id, lm_head's with their ids)
// from its load until it is evicted, emptied by a move, or its adapter removed.
static void test_trainable_tokens(void **state) {
    ctx_t *c = *state;
    char d[1024];
    int ranks[2 * LS_TARGET_COUNT];
    const int tok_rows[2] = {3, 2};
    rm_ranks_uniform(ranks, 2, 1u << LS_TARGET_Q, 4);
    fx_path(d, sizeof d, c->dir, "tok");
    assert_int_equal(rm_write_adapter_tokens(d, &c->cfg, "{\"peft_type\": \"LORA\", \"r\": 4, "
                                             "\"target_modules\": [\"q_proj\"], \"trainable_token_"
                                             "indices\": {\"embed_tokens\": [17, 2, 30], \"lm_head\": "
                                             "[8, 31]}}", ranks, 0, 0, tok_rows, LS_DTYPE_F32, 9), 0);
    ls_adapter_t *ad = ls_adapter_load(d, &c->cfg, 16, err, sizeof err);
    assert_non_null(ad);
    for (int extra = 0; extra <= 2; extra += 2) {  // none held, then 2 a slot
        c->extra_vocab = extra;
        new_pool(c, 2, 0, 16, 0);
        assert_int_equal(ls_lora_pool_add_adapter(c->pool, "t", &ad, err, sizeof err), -1);
        print_message("refused: %s\n", err);
        assert_contains(err, "replaces 3 rows of the embedding or lm_head");
        assert_contains(err, extra ? "above the 2 a slot holds" : "above the 0 a slot holds");
        assert_contains(err, "--lora-extra-vocab-size");
        ls_lora_pool_destroy(&c->pool);
    }
    c->extra_vocab = 4;
    new_pool(c, 2, 0, 16, 0);
    ls_adapter_t *keep = ls_adapter_load(d, &c->cfg, 16, err, sizeof err);
    assert_int_equal(ls_lora_pool_add_adapter(c->pool, "t", &ad, err, sizeof err), 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    const ls_lora_tokens_t *tk = ls_lora_pool_tokens(c->pool);
    ls_view_t embed, head, head_ids;
    ls_lora_tokens_views(tk, &embed, &head, &head_ids);
    for (int slot = 1; slot <= 2; slot++) {
        assert_int_equal(assign(c, "t", slot), 0);
        assert_true(ls_lora_tokens_slot_has(tk, slot) && !ls_lora_tokens_slot_has(tk, 3 - slot));
        const ls_token_rows_t *te = ls_adapter_token_rows(keep, LS_TARGET_EMBED);
        const ls_token_rows_t *th = ls_adapter_token_rows(keep, LS_TARGET_LM_HEAD);
        float got[16], ids[2];
        for (int k = 0; k < te->n; k++) {  // the embedding's rows, found by id
            int32_t row = ls_lora_tokens_embed_row(tk, slot, te->ids[k]);
            assert_int_equal(row, slot * 4 + k);
            assert_int_equal(c->be->buffer_download(c->be, got, ls_view(embed.buf, (size_t)row * 16), 16), 0);
            assert_memory_equal(got, te->rows + k * 16, sizeof got);
        }
        assert_int_equal(ls_lora_tokens_embed_row(tk, slot, 8), -1);  // lm_head's only
        int32_t first;
        assert_int_equal(ls_lora_tokens_head_rows(tk, slot, &first), 2);
        assert_int_equal(first, slot * 4);
        assert_int_equal(c->be->buffer_download(c->be, ids, ls_view(head_ids.buf, (size_t)first), 2), 0);
        assert_true(ids[0] == 8.0f && ids[1] == 31.0f);
        assert_int_equal(c->be->buffer_download(c->be, got, ls_view(head.buf, (size_t)(first + 1) * 16), 16), 0);
        assert_memory_equal(got, th->rows + 16, sizeof got);
    }
    // evicted by a: slot 2 holds none; t back in slot 1, then removed
    assert_int_equal(assign(c, "a", 2), 0);
    assert_false(ls_lora_tokens_slot_has(tk, 2));
    assert_int_equal(assign(c, "t", 1), 0);
    assert_true(ls_lora_tokens_slot_has(tk, 1));
    assert_int_equal(ls_lora_pool_remove(c->pool, "t", err, sizeof err), 0);
    assert_false(ls_lora_tokens_slot_has(tk, 1));
    ls_adapter_destroy(&keep);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_assign_fills_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_tier, setup, teardown),
        cmocka_unit_test_setup_teardown(test_images_across_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slot_layout_global, setup, teardown),
        cmocka_unit_test_setup_teardown(test_assign, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rank_proportional, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pieces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trainable_tokens, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
