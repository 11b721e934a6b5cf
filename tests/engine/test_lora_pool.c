// The LoRA slot pool's rules: adapters loaded into the slots they are assigned (hits, loads,
// evictions counted), moved and evicted only when told, removal from both tiers, the host
// tier's byte capacity (rank-proportional images, refused when full, pages
// given back), images built on another thread, refusals on add and assign, and the exact slot
// layout (zero padding of rank_pattern modules and of the rank up to r_max, per-module
// scalings folded into B, uniform ones kept per slot), also for images spanning many pages.
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

// host: the host tier's bytes (0: the default)
static void new_pool(ctx_t *c, int slots, size_t host, int r_max, unsigned mask) {
    ls_lora_pool_config_t pc = {.max_loras_per_batch = slots, .max_lora_rank = r_max, .host_bytes = host,
                                .target_mask = mask};
    c->pool = ls_lora_pool_new(c->be, &c->cfg, &pc, err, sizeof err);
    if (!c->pool)
        fail_msg("pool: %s", err);
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
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 1, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_assign(c->pool, "b", 2, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 1);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "b"), 2);
    const int32_t *ranks = ls_lora_pool_slot_ranks(c->pool);
    const float *sc = ls_lora_pool_slot_scalings(c->pool);
    assert_int_equal(ranks[LS_LORA_SLOT_BASE], 0);
    assert_int_equal(ranks[1], 4);
    assert_int_equal(ranks[2], 8);
    assert_float_equal(sc[1], 2.0f, 0);  // 8 / 4
    assert_float_equal(sc[2], 0.5f, 0);  // 4 / 8
    assert_int_equal(ls_lora_pool_assign(c->pool, "b", 2, err, sizeof err), 0);
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
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_remove(c->pool, "a", err, sizeof err), 0);
    assert_false(ls_lora_pool_contains(c->pool, "a"));
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), -1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 0);
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, err, sizeof err), -1);
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
    int rank;
    size_t bytes;
    assert_int_equal(ls_lora_pool_image_info(c->pool, "b", &rank, &bytes), 0);
    assert_int_equal(rank, 16);
    assert_int_equal(bytes, 1 << 16);
    assert_int_equal(ls_lora_pool_image_info(c->pool, "d", &rank, &bytes), -1);
    assert_false(ls_lora_pool_contains(c->pool, "d"));
    assert_int_equal(ls_lora_pool_assign(c->pool, "b", 1, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_remove(c->pool, "b", err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_stats(c->pool).host_used, 2 << 16);
    assert_int_equal(add(c, "d", AD_R4), 0);
    assert_int_equal(ls_lora_pool_stats(c->pool).host_adapters, 3);
    // a tier that cannot hold one adapter of max_lora_rank is refused at creation
    ls_lora_pool_destroy(&c->pool);
    ls_lora_pool_config_t small = {.max_loras_per_batch = 2, .max_lora_rank = 8, .host_bytes = 1000};
    assert_null(ls_lora_pool_new(c->be, &c->cfg, &small, err, sizeof err));
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
    // 8192 elements per unit of rank on all seven targets (2 layers), f32: r16 = 512 KiB,
    // so 64 KiB pages
    assert_int_equal(ls_lora_pool_image_max_bytes(c->pool), 512 << 10);
    // images built on another thread while this one uses the pool
    s_build_t b = {.pool = c->pool};
    for (int a = 0; a < N_LAYER_ADS; a++)
        b.ad[a] = load(c, a);
    assert_int_equal(add(c, "early", AD_R4), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_build, &b), 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(ls_lora_pool_assign(c->pool, "early", 1 + i % 4, err, sizeof err), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    static const size_t want[N_LAYER_ADS] = {
        [AD_R4] = 2 << 16,    // 4 x 32 KiB
        [AD_Q8] = 2 << 16,    // the qkv group at rank 8: (3*256 + 512) * 8 * 2 * 4 bytes = 80 KiB
        [AD_R16] = 8 << 16,   // 16 x 32 KiB
        [AD_PATTERN] = 4 << 16,  // rank 8 (v_proj's): 256 KiB
    };
    for (int a = 0; a < N_LAYER_ADS; a++) {
        assert_non_null(b.img[a]);
        assert_int_equal(ls_lora_image_bytes(b.img[a]), want[a]);
        assert_int_equal(ls_lora_pool_add(c->pool, ADS[a].name, &b.img[a], err, sizeof err), 0);
        assert_null(b.img[a]);
    }
    assert_int_equal(ls_lora_pool_stats(c->pool).host_used, (2 + 2 + 2 + 8 + 4) << 16);
    // every image through every slot, twice (a slot refilled by a smaller rank is padded anew)
    for (int round = 0; round < 2; round++)
        for (int a = 0; a < N_LAYER_ADS; a++) {
            int slot = 1 + (a + round) % 4;
            assert_int_equal(ls_lora_pool_assign(c->pool, ADS[a].name, slot, err, sizeof err), 0);
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

// The slot's A and B blocks hold exactly the adapter: rows/columns past a module's rank
// zero, per-module scalings folded into B when they differ, B as stored when uniform.
static void check_slot(ctx_t *c, const ls_adapter_t *ad, int slot, bool folded) {
    int r_max = ls_lora_pool_r_max(c->pool), n_slots = ls_lora_pool_n_slots(c->pool);
    static const ls_target_t tg[LS_LORA_GROUP_COUNT][LS_LORA_MAX_SLICES] = {
        {LS_TARGET_Q, LS_TARGET_K, LS_TARGET_V}, {LS_TARGET_O}, {LS_TARGET_GATE, LS_TARGET_UP},
        {LS_TARGET_DOWN}, {LS_TARGET_EMBED}, {LS_TARGET_LM_HEAD}};
    for (int l = 0; l < c->cfg.num_hidden_layers; l++)
        for (int g = 0; g < LS_LORA_GROUP_COUNT; g++) {
            if (!ls_lora_pool_has_group(c->pool, g) || (g >= LS_LORA_GROUP_EMBED && l > 0))
                continue;  // the global groups: one layer
            ls_lora_group_shape_t sh = ls_lora_pool_group_shape(c->pool, g);
            int out_total = sh.slice_offsets[sh.n_slices];
            size_t an = (size_t)sh.n_slices * r_max * sh.in, bn = (size_t)out_total * r_max;
            ls_view_t a, b;
            ls_lora_pool_group_views(c->pool, l, g, &a, &b);
            float *ga = malloc(an * sizeof *ga), *gb = malloc(bn * sizeof *gb);
            assert_int_equal(c->be->buffer_download(c->be, ga, ls_view(a.buf, a.off + slot * an),
                                                    an), 0);
            assert_int_equal(c->be->buffer_download(c->be, gb, ls_view(b.buf, b.off + slot * bn),
                                                    bn), 0);
            assert_true(slot < n_slots);
            for (int k = 0; k < sh.n_slices; k++) {
                const ls_lora_weights_t *w = g >= LS_LORA_GROUP_EMBED
                                                 ? ls_adapter_global_target(ad, tg[g][k])
                                                 : ls_adapter_layer_target(ad, l, tg[g][k]);
                float fold = folded ? w->scaling : 1.0f;
                for (int j = 0; j < r_max; j++)
                    for (int i = 0; i < sh.in; i++)
                        assert_float_equal(ga[((size_t)k * r_max + j) * sh.in + i],
                                           j < w->rank ? w->A[(size_t)j * sh.in + i] : 0.0f, 0);
                for (int o = sh.slice_offsets[k]; o < sh.slice_offsets[k + 1]; o++)
                    for (int j = 0; j < r_max; j++) {
                        int ok = o - sh.slice_offsets[k];
                        float want = j < w->rank ? w->B[(size_t)ok * w->rank + j] * fold : 0.0f;
                        assert_float_equal(gb[(size_t)o * r_max + j], want, 0);
                    }
            }
            free(ga);
            free(gb);
        }
}

static void test_slot_layout(void **state) {
    ctx_t *c = *state;
    new_pool(c, 2, 0, 16, 0);
    assert_int_equal(add(c, "pattern", AD_PATTERN), 0);
    assert_int_equal(add(c, "uniform", AD_R4), 0);
    int32_t s[2] = {1, 2};
    assert_int_equal(ls_lora_pool_assign(c->pool, "pattern", s[0], err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_assign(c->pool, "uniform", s[1], err, sizeof err), 0);
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
    assert_int_equal(ls_lora_pool_assign(c->pool, "global", 1, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_assign(c->pool, "uniform", 2, err, sizeof err), 0);
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
    assert_int_equal(ls_lora_pool_assign(c->pool, "uniform", 1, err, sizeof err), 0);
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
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 2);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 4);
    ls_adapter_t *ad = load(c, AD_R4);
    check_slot(c, ad, 2, false);
    ls_adapter_destroy(&ad);
    // moving a: its old slot is empty afterwards
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 1, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), 1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[2], 0);
    // b takes a's slot: a is no longer resident
    assert_int_equal(ls_lora_pool_assign(c->pool, "b", 1, err, sizeof err), 0);
    assert_int_equal(ls_lora_pool_slot_of(c->pool, "a"), -1);
    assert_int_equal(ls_lora_pool_slot_ranks(c->pool)[1], 8);
    ad = load(c, AD_Q8);
    check_slot(c, ad, 1, false);
    ls_adapter_destroy(&ad);
    assert_int_equal(ls_lora_pool_stats(c->pool).slot_evictions, 1);
    // bad ids and slots are refused
    assert_int_equal(ls_lora_pool_assign(c->pool, "nope", 2, err, sizeof err), -1);
    assert_non_null(strstr(err, "not loaded"));
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", LS_LORA_SLOT_BASE, err, sizeof err), -1);
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 4, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an adapter slot"));
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
        ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 16,
                                    .extra_vocab_size = extra};
        c->pool = ls_lora_pool_new(c->be, &c->cfg, &pc, err, sizeof err);
        assert_int_equal(ls_lora_pool_add_adapter(c->pool, "t", &ad, err, sizeof err), -1);
        print_message("refused: %s\n", err);
        assert_contains(err, "replaces 3 rows of the embedding or lm_head");
        assert_contains(err, extra ? "above the 2 a slot holds" : "above the 0 a slot holds");
        assert_contains(err, "--lora-extra-vocab-size");
        ls_lora_pool_destroy(&c->pool);
    }
    ls_lora_pool_config_t pc = {.max_loras_per_batch = 2, .max_lora_rank = 16,
                                .extra_vocab_size = 4};
    c->pool = ls_lora_pool_new(c->be, &c->cfg, &pc, err, sizeof err);
    ls_adapter_t *keep = ls_adapter_load(d, &c->cfg, 16, err, sizeof err);
    assert_int_equal(ls_lora_pool_add_adapter(c->pool, "t", &ad, err, sizeof err), 0);
    assert_int_equal(add(c, "a", AD_R4), 0);
    const ls_lora_tokens_t *tk = ls_lora_pool_tokens(c->pool);
    ls_view_t embed, head, head_ids;
    ls_lora_tokens_views(tk, &embed, &head, &head_ids);
    for (int slot = 1; slot <= 2; slot++) {
        assert_int_equal(ls_lora_pool_assign(c->pool, "t", slot, err, sizeof err), 0);
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
    assert_int_equal(ls_lora_pool_assign(c->pool, "a", 2, err, sizeof err), 0);
    assert_false(ls_lora_tokens_slot_has(tk, 2));
    assert_int_equal(ls_lora_pool_assign(c->pool, "t", 1, err, sizeof err), 0);
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
        cmocka_unit_test_setup_teardown(test_trainable_tokens, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
