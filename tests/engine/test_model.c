// The model engine's self-consistency on random tiny models (CPU backend): chunked prefill
// over a cached prefix == one full prefill; prefill + decode == full forwards of the longer
// sequences; a mixed batch (base + adapters, prefill chunks and decodes) gives each request
// what it gets alone; LoRA through the slot pool == the dense model W + scaling·B·A merged
// in double; plus loading (sharded, progress), sampling and the step's error messages.
//
// Tolerances. Every comparison is between two fp32 computations of the same math that
// differ only in the grouping of rows into sgemm calls (batching, chunking) or, for the
// merged model, in the order of the LoRA sum; measured differences are printed. The bound
// is 1e-5 absolute on logits of magnitude ~2-9 for the batching/chunking identities
// (measured <= 5e-6: OpenBLAS sgemm blocks the rows differently for different row counts,
// so a row's sums may round differently) and 2e-4 for merged-vs-LoRA (measured <= 2e-6:
// the merged weight rounds W + s·BA once to fp32, the LoRA path rounds x·Aᵀ and the
// expand separately; the bound leaves room for larger models and other BLAS builds).
#include "random_model.h"

#include <float.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "backend.h"
#include "lora_pool.h"
#include "model.h"
#include "slot_plan.h"

#define TOL_BATCH 1e-5
#define TOL_MERGED 2e-4
#define BS 4   // KV block size: small, so that sequences span several blocks
#define NB 256 // KV blocks per cache

static char err[1024];


static const rm_spec_t SPECS[] = {
    {.arch = LS_ARCH_LLAMA, .hidden = 32, .inter = 48, .layers = 2, .heads = 4, .kv_heads = 2,
     .vocab = 64, .dtype = LS_DTYPE_BF16, .seed = 11},
    {.arch = LS_ARCH_QWEN2, .hidden = 32, .inter = 40, .layers = 2, .heads = 4, .kv_heads = 1,
     .vocab = 72, .tied = true, .dtype = LS_DTYPE_F32, .seed = 12},
    {.arch = LS_ARCH_QWEN3, .hidden = 32, .inter = 48, .layers = 2, .heads = 4, .kv_heads = 2,
     .head_dim = 16, .vocab = 64, .dtype = LS_DTYPE_BF16, .sharded = true, .seed = 13},
    {.arch = LS_ARCH_MISTRAL, .hidden = 32, .inter = 48, .layers = 2, .heads = 4,
     .kv_heads = 2, .vocab = 56, .dtype = LS_DTYPE_F16, .seed = 14},
};
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

typedef struct {
    char *dir;
    ls_backend_t *be;
    ls_model_t *m;
    ls_kv_cache_t *arena; // the pages of new_pool's pool
} ctx_t;

// The model of sp in c->dir/sub, with adapters merge[0 .. n_merge) merged at weights w
// (rm_write_model_mix).
static ls_model_t *load_spec_mix(ctx_t *c, const char *sub, const rm_spec_t *sp,
                                 const ls_adapter_t *const *merge, const float *w, int n_merge) {
    char d[1024];
    fx_path(d, sizeof d, c->dir, sub);
    mkdir(d, 0700);
    assert_int_equal(rm_write_model_mix(d, sp, merge, w, n_merge), 0);
    ls_model_t *m = ls_model_load(d, c->be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    if (!m)
        fail_msg("load %s: %s", d, err);
    return m;
}

static ls_model_t *load_spec(ctx_t *c, const char *sub, const rm_spec_t *sp,
                             const ls_adapter_t *merge) {
    const float one = 1.0f;
    return load_spec_mix(c, sub, sp, &merge, &one, merge ? 1 : 0);
}

static int setup(void **state) {
    ctx_t *c = calloc(1, sizeof *c);
    c->dir = fx_tmpdir();
    c->be = ls_backend_cpu_new(1);
    *state = c;
    return 0;
}

static int teardown(void **state) {
    ctx_t *c = *state;
    ls_kv_cache_destroy(&c->arena);
    ls_model_destroy(&c->m);
    ls_backend_destroy(&c->be);
    fx_rmdir(&c->dir);
    free(c);
    return 0;
}

static int32_t token_at(unsigned seed, int i, int vocab) {
    return (int32_t)((seed * 2654435761u + (unsigned)i * 40503u) % (unsigned)vocab);
}

// Blocks [first, first+n) in reverse order: the table, not contiguity, must matter.
static void table_of(int32_t *table, int first, int n) {
    for (int i = 0; i < n; i++)
        table[i] = first + n - 1 - i;
}

static ls_model_seq_t seq_of(const int32_t *tok, int n, int start, const int32_t *table,
                             int slot, bool logits) {
    return (ls_model_seq_t){tok, n, start, table, (start + n + BS - 1) / BS, slot, logits, NULL, 0};
}

// Runs one step and downloads its logits into out (rows, *width), width
// ls_model_logits_width: vocab_size and the pool's added columns (lora_tokens.h).
static int step_wide(ls_model_t *m, ls_kv_cache_t *kv, ls_lora_pool_t *pool,
                     const ls_model_seq_t *seqs, int n, float *out, int *width) {
    int rows = ls_model_forward(m, kv, pool, seqs, n, err, sizeof err);
    if (rows < 0)
        fail_msg("forward: %s", err);
    assert_int_equal(ls_model_logits_wide(m, out), 0);
    *width = ls_model_logits_width(m);
    return rows;
}

// Whether columns [from, W) of a logits row are all -inf (the added columns of a sequence
// whose adapter has none of them).
static bool cols_neg_inf(const float *row, int from, int W) {
    for (int v = from; v < W; v++)
        if (!(isinf(row[v]) && row[v] < 0))
            return false;
    return true;
}

// Runs one step and downloads its logits into out (rows, vocab_size): with a pool of token
// rows, the added columns past the vocabulary are checked to be -inf (no adapter of these
// steps adds vocabulary) and left out.
static void step(ls_model_t *m, ls_kv_cache_t *kv, ls_lora_pool_t *pool,
                 const ls_model_seq_t *seqs, int n, float *out) {
    static float wide[160 * 96]; // rows x width: test_wide_decode_equals_alone's 130 rows
    int W, V = ls_model_config(m)->vocab_size;
    int rows = ls_model_forward(m, kv, pool, seqs, n, err, sizeof err);
    if (rows < 0)
        fail_msg("forward: %s", err);
    assert_true((size_t)rows * (size_t)ls_model_logits_width(m) <= sizeof wide / sizeof *wide);
    assert_int_equal(ls_model_logits_wide(m, wide), 0);
    W = ls_model_logits_width(m);
    for (int r = 0; r < rows; r++) {
        assert_true(cols_neg_inf(wide + (size_t)r * W, V, W));
        memcpy(out + (size_t)r * V, wide + (size_t)r * W, (size_t)V * sizeof *out);
    }
}

static double max_abs_diff(const float *a, const float *b, size_t n, double *max_mag) {
    double d = 0, mag = 0;
    if (max_mag)
        *max_mag = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        d = fmax(d, fabs((double)a[i] - b[i]));
        mag = fmax(mag, fabs((double)b[i]));
    }
    if (max_mag)
        *max_mag = mag;
    return d;
}

// --- loading ---------------------------------------------------------------------------

typedef struct {
    int calls;
    size_t last_done, total;
    int monotone;
} progress_t;

static void on_progress(void *arg, const char *what, size_t done, size_t total) {
    progress_t *p = arg;
    p->monotone &= done >= p->last_done && done <= total && what && *what;
    p->calls++;
    p->last_done = done;
    p->total = total;
}

static void test_load_progress_and_shards(void **state) {
    ctx_t *c = *state;
    // the same weights single-file and sharded give bit-identical logits
    rm_spec_t sp = SPECS[0];
    char d1[1024], d2[1024];
    fx_path(d1, sizeof d1, c->dir, "single");
    fx_path(d2, sizeof d2, c->dir, "sharded");
    mkdir(d1, 0700);
    mkdir(d2, 0700);
    assert_int_equal(rm_write_model(d1, &sp, NULL), 0);
    sp.sharded = true;
    assert_int_equal(rm_write_model(d2, &sp, NULL), 0);
    progress_t p = {.monotone = 1};
    ls_model_t *a = ls_model_load(d1, c->be, NULL, LS_QUANT_NONE, on_progress, &p, err, sizeof err);
    ls_model_t *b = ls_model_load(d2, c->be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    assert_non_null(a);
    assert_non_null(b);
    assert_true(p.monotone);
    assert_true(p.calls >= (int)ls_model_config_weight_count(ls_model_config(a)));
    assert_int_equal(p.last_done, p.total);
    assert_int_equal(p.total, ls_model_weight_bytes(a));
    ls_kv_cache_t *kv = ls_kv_cache_new(a, NB, BS, err, sizeof err);
    int32_t tok[9], table[4];
    for (int i = 0; i < 9; i++)
        tok[i] = token_at(3, i, sp.vocab);
    table_of(table, 0, 3);
    ls_model_seq_t s = seq_of(tok, 9, 0, table, 0, true);
    float la[64], lb[64];
    step(a, kv, NULL, &s, 1, la);
    step(b, kv, NULL, &s, 1, lb);
    assert_memory_equal(la, lb, sizeof la);
    ls_kv_cache_destroy(&kv);
    ls_model_destroy(&a);
    ls_model_destroy(&b);

    // a missing tensor is named
    char path[4096];
    remove(fx_path(path, sizeof path, d2, "model-00002-of-00002.safetensors"));
    assert_null(ls_model_load(d2, c->be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err));
    print_message("missing shard: %s\n", err);
    assert_contains(err, "model-00002-of-00002.safetensors");
}

// --- chunked prefill, decode ------------------------------------------------------------

// Per architecture: a 21-token prompt in one step vs in chunks 8 + 8 + 5 on top of the
// cache; then 6 decode steps vs full forwards of each longer prefix, all in one batch.
static void test_chunked_prefill_and_decode(void **state) {
    ctx_t *c = *state;
    enum { P = 21, N = 6 };
    for (size_t k = 0; k < N_SPECS; k++) {
        const rm_spec_t *sp = &SPECS[k];
        char sub[32];
        snprintf(sub, sizeof sub, "arch%zu", k);
        ls_model_t *m = load_spec(c, sub, sp, NULL);
        ls_kv_cache_t *kv = ls_kv_cache_new(m, NB, BS, err, sizeof err);
        int V = sp->vocab;
        int32_t tok[P + N], t_full[16], t_chunk[16];
        for (int i = 0; i < P + N; i++)
            tok[i] = token_at((unsigned)k + 5, i, V);
        float full[72], chunk[72], dec[72];
        table_of(t_full, 0, 16);
        table_of(t_chunk, 16, 16);
        ls_model_seq_t s = seq_of(tok, P, 0, t_full, 0, true);
        step(m, kv, NULL, &s, 1, full);
        int chunks[] = {8, 8, 5}, at = 0;
        for (int i = 0; i < 3; i++) {
            s = seq_of(tok + at, chunks[i], at, t_chunk, 0, i == 2);
            int rows = ls_model_forward(m, kv, NULL, &s, 1, err, sizeof err);
            assert_int_equal(rows, i == 2);
            at += chunks[i];
        }
        assert_int_equal(ls_model_logits(m, chunk), 0);
        double mag, d_chunk = max_abs_diff(chunk, full, (size_t)V, &mag);

        // decode N tokens on the chunked cache; reference: N sequences, the prefixes of
        // length P+1 .. P+N, in one batch on fresh blocks
        float ref[N * 72];
        int32_t tables[N][16];
        ls_model_seq_t batch[N];
        for (int i = 0; i < N; i++) {
            table_of(tables[i], 32 + 16 * i, 16);
            batch[i] = seq_of(tok, P + i + 1, 0, tables[i], 0, true);
        }
        step(m, kv, NULL, batch, N, ref);
        double d_dec = 0;
        for (int i = 0; i < N; i++) {
            s = seq_of(tok + P + i, 1, P + i, t_chunk, 0, true);
            step(m, kv, NULL, &s, 1, dec);
            d_dec = fmax(d_dec, max_abs_diff(dec, ref + (size_t)i * V, (size_t)V, NULL));
        }
        print_message("%-18s max|logit| %.2f  chunked-vs-full %.2e  decode-vs-full %.2e\n",
                      ls_arch_name(sp->arch), mag, d_chunk, d_dec);
        assert_true(mag > 0.5); // the logits are not degenerate
        assert_true(d_chunk <= TOL_BATCH);
        assert_true(d_dec <= TOL_BATCH);
        ls_kv_cache_destroy(&kv);
        ls_model_destroy(&m);
    }
}

// --- LoRA -------------------------------------------------------------------------------

// Four adapters of the Llama spec: uniform all-seven rank 8; rank/alpha patterns
// (per-module scalings, folded into B); rslora on a regex subset; q, v, the embedding and
// lm_head with their own ranks and scalings (folded).
#define N_AD 4
static const char *AD_CFG[N_AD] = {
    "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": "
    "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]}",
    "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
    "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"], "
    "\"rank_pattern\": {\"v_proj\": 12, \"layers.1.mlp.down_proj\": 2}, "
    "\"alpha_pattern\": {\"o_proj\": 3, \"gate_proj\": 40}}",
    "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 8, \"use_rslora\": true, "
    "\"target_modules\": \".*\\\\.layers\\\\.[01]\\\\.(self_attn\\\\.(q_proj|v_proj)|mlp\\\\.down_proj)\"}",
    "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
    "[\"q_proj\", \"v_proj\", \"embed_tokens\", \"lm_head\"], \"rank_pattern\": {\"embed_tokens\": 6}, "
    "\"alpha_pattern\": {\"lm_head\": 2}}",
};
// The embedding's and lm_head's ranks of adapter a (0: not targeted).
static const int AD_EMBED_RANK[N_AD] = {0, 0, 0, 6}, AD_HEAD_RANK[N_AD] = {0, 0, 0, 4};

static void ad_ranks(int a, int L, int *ranks) {
    if (a == 0)
        rm_ranks_uniform(ranks, L, 0x7f, 8);
    if (a == 1) {
        rm_ranks_uniform(ranks, L, 0x7f, 4);
        for (int l = 0; l < L; l++)
            ranks[l * LS_TARGET_COUNT + LS_TARGET_V] = 12;
        ranks[1 * LS_TARGET_COUNT + LS_TARGET_DOWN] = 2;
    }
    if (a == 2)
        rm_ranks_uniform(ranks, L, 1u << LS_TARGET_Q | 1u << LS_TARGET_V | 1u << LS_TARGET_DOWN,
                         16);
    if (a == 3)
        rm_ranks_uniform(ranks, L, 1u << LS_TARGET_Q | 1u << LS_TARGET_V, 4);
}

// Adapter a of AD_CFG written with weights of seed and loaded.
static ls_adapter_t *write_and_load_seeded(ctx_t *c, const ls_model_config_t *cfg, int a,
                                           ls_dtype_t dtype, unsigned seed) {
    char d[1024], name[32];
    int ranks[64 * LS_TARGET_COUNT];
    snprintf(name, sizeof name, "adapter%d_%u", a, seed);
    fx_path(d, sizeof d, c->dir, name);
    ad_ranks(a, cfg->num_hidden_layers, ranks);
    assert_int_equal(rm_write_adapter_globals(d, cfg, AD_CFG[a], ranks, AD_EMBED_RANK[a],
                                              AD_HEAD_RANK[a], dtype, seed), 0);
    ls_adapter_t *ad = ls_adapter_load(d, cfg, 16, err, sizeof err);
    if (!ad)
        fail_msg("adapter %d: %s", a, err);
    return ad;
}

static ls_adapter_t *write_and_load_adapter(ctx_t *c, const ls_model_config_t *cfg, int a,
                                            ls_dtype_t dtype) {
    return write_and_load_seeded(c, cfg, a, dtype, 100u + (unsigned)a);
}

// Every target enabled: the embedding and lm_head too; rows for trainable tokens; the
// adapters' pages apart from the tests' KV caches (slot_plan.h), in c->arena.
static ls_lora_pool_t *new_pool(ctx_t *c, const ls_model_config_t *cfg, int slots) {
    ls_lora_pool_config_t pc = {.max_loras_per_batch = slots, .max_lora_rank = 16,
                                .target_mask = (1u << LS_TARGET_ALL) - 1,
                                .extra_vocab_size = 8};
    ls_kv_cache_destroy(&c->arena);
    if (!(c->arena = slot_plan_arena_new(c->m, BS, &pc, err, sizeof err)))
        fail_msg("arena: %s", err);
    ls_page_arena_t a = ls_kv_cache_arena(c->arena);
    ls_lora_pool_t *p = ls_lora_pool_new(c->be, cfg, &pc, &a, err, sizeof err);
    if (!p)
        fail_msg("pool: %s", err);
    return p;
}

// The merged-weights tests' base: the Llama spec in fp32 (*sp) as c->m in c->dir/sub, and a
// pool of slots for it.
static ls_lora_pool_t *merged_base(ctx_t *c, const char *sub, rm_spec_t *sp, int slots) {
    *sp = SPECS[0];
    sp->dtype = LS_DTYPE_F32;
    c->m = load_spec(c, sub, sp, NULL);
    return new_pool(c, ls_model_config(c->m), slots);
}

// One mixed step with base + the three adapters == each request on the base model with
// that adapter merged into the weights (in double).
static void test_lora_equals_merged(void **state) {
    ctx_t *c = *state;
    rm_spec_t sp;
    ls_lora_pool_t *pool = merged_base(c, "lora_base", &sp, N_AD);
    const ls_model_config_t *cfg = ls_model_config(c->m);
    ls_adapter_t *ads[N_AD];
    const char *ids[N_AD + 1] = {NULL, "a0", "a1", "a2", "a3"};
    for (int a = 0; a < N_AD; a++) {
        ads[a] = write_and_load_adapter(c, cfg, a, a == 1 ? LS_DTYPE_BF16 : LS_DTYPE_F32);
        ls_adapter_t *own = write_and_load_adapter(c, cfg, a, a == 1 ? LS_DTYPE_BF16
                                                                      : LS_DTYPE_F32);
        assert_int_equal(ls_lora_pool_add_adapter(pool, ids[a + 1], &own, err, sizeof err), 0);
        assert_null(own);
    }
    int32_t slots[N_AD + 1];
    assert_int_equal(slot_plan_map_once(pool, ids, N_AD + 1, slots, err, sizeof err), 0);
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    enum { P = 13 };
    int V = sp.vocab;
    int32_t tok[N_AD + 1][P], tables[N_AD + 1][8];
    ls_model_seq_t seqs[N_AD + 1];
    for (int i = 0; i <= N_AD; i++) {
        for (int j = 0; j < P; j++)
            tok[i][j] = token_at(40u + (unsigned)i, j, V);
        table_of(tables[i], 8 * i, 8);
        seqs[i] = seq_of(tok[i], P, 0, tables[i], slots[i], true);
    }
    float got[(N_AD + 1) * 64], want[64];
    step(c->m, kv, pool, seqs, N_AD + 1, got);
    double worst = 0;
    for (int i = 0; i <= N_AD; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "merged%d", i);
        ls_model_t *ref = load_spec(c, sub, &sp, i ? ads[i - 1] : NULL);
        ls_model_seq_t s = seqs[i];
        s.lora_slot = LS_LORA_SLOT_BASE;
        step(ref, kv, NULL, &s, 1, want);
        double mag, d = max_abs_diff(got + (size_t)i * V, want, (size_t)V, &mag);
        double moved = i ? max_abs_diff(got + (size_t)i * V, got, (size_t)V, NULL) : 0;
        print_message("row %d (%s): LoRA vs merged max|d| %.2e (max|logit| %.2f, adapter "
                      "moves the logits by up to %.2f)\n", i, ids[i] ? ids[i] : "base", d,
                      mag, moved);
        assert_true(!i || moved > 0.05); // the adapter does something measurable
        worst = fmax(worst, d);
        ls_model_destroy(&ref);
    }
    assert_true(worst <= TOL_MERGED);
    for (int a = 0; a < N_AD; a++)
        ls_adapter_destroy(&ads[a]);
    ls_kv_cache_destroy(&kv);
    ls_lora_pool_destroy(&pool);
}

// A row's dense reference: the base model with ads[0 .. n) merged at weights w (n 0: the base).
typedef struct {
    int n;
    const ls_adapter_t *ads[3];
    float w[3];
} merged_t;

// One prefill step (pre) and one decode step (dec) of n rows on c->m through the pool, each
// row against the model sp with merged[i] merged into its weights (rm_write_model_mix, in
// c->dir/<tag>_merged<i>) running the row alone: its vocabulary's logits (the added ids of an
// adapter with added vocabulary among them) equal, the columns past it -inf. Prints each row;
// returns the largest difference and, in *moved, the smallest change a row with adapters
// makes to its logits.
static double steps_vs_merged(ctx_t *c, ls_lora_pool_t *pool, const rm_spec_t *sp,
                              const char *tag, const ls_model_seq_t *pre,
                              const ls_model_seq_t *dec, const merged_t *merged, int n,
                              double *moved) {
    enum { MAXN = 8, MAXW = 96 };
    assert_true(n <= MAXN);
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    float got[2][MAXN * MAXW], want[2][MAXW];
    int W, Wr;
    step_wide(c->m, kv, pool, pre, n, got[0], &W);
    assert_true(W <= MAXW);
    step_wide(c->m, kv, pool, dec, n, got[1], &W);
    double worst = 0;
    *moved = INFINITY;
    for (int i = 0; i < n; i++) {
        char sub[64];
        snprintf(sub, sizeof sub, "%s_merged%d", tag, i);
        ls_model_t *ref = load_spec_mix(c, sub, sp, merged[i].ads, merged[i].w, merged[i].n);
        ls_model_seq_t s[2] = {pre[i], dec[i]};
        for (int k = 0; k < 2; k++) {
            s[k].lora_slot = LS_LORA_SLOT_BASE;
            s[k].mix = NULL;
            s[k].n_mix = 0;
            step_wide(ref, kv, NULL, &s[k], 1, want[k], &Wr);
            assert_true(Wr <= W);
        }
        for (int k = 0; k < 2; k++) {
            const float *row = got[k] + (size_t)i * W;
            double mag, d = max_abs_diff(row, want[k], (size_t)Wr, &mag);
            double mv = merged[i].n ? max_abs_diff(row, got[k], (size_t)sp->vocab, NULL) : 0;
            print_message("%s row %d (%d adapter%s) %s: vs merged (vocabulary %d) max|d| %.2e "
                          "(max|logit| %.2f, its adapters move the logits by up to %.2f)\n", tag,
                          i, merged[i].n, merged[i].n == 1 ? "" : "s", k ? "decode" : "prefill",
                          Wr, d, mag, mv);
            assert_true(cols_neg_inf(row, Wr, W));
            worst = fmax(worst, d);
            if (merged[i].n)
                *moved = fmin(*moved, mv);
        }
        ls_model_destroy(&ref);
    }
    ls_kv_cache_destroy(&kv);
    return worst;
}

// Mixes of adapters with the embedding's and lm_head's LoRA (docs/lora-mixing.md): the
// passes apply to those targets as to the others, so each row of a mixed step (prefill, then
// a decode step) == the base model with its mix merged into the weights, Σ_i w_i·s_i·B_i·A_i
// (in double). e1 and e2 target the embedding, lm_head, q and v; a0 the seven of a layer. The
// mixes put the embedding and lm_head in pass 0 only, pass 1 only, both, and three passes.
static void test_mix_embed_head_equals_merged(void **state) {
    ctx_t *c = *state;
    enum { N = 3, ROWS = 6, P = 11 };
    rm_spec_t sp;
    ls_lora_pool_t *pool = merged_base(c, "mix_base", &sp, N);
    const ls_model_config_t *cfg = ls_model_config(c->m);
    const char *names[N] = {"e1", "e2", "a0"};
    const int kind[N] = {3, 3, 0};
    const unsigned seed[N] = {103, 203, 100};
    ls_adapter_t *ads[N];
    for (int a = 0; a < N; a++) {
        ads[a] = write_and_load_seeded(c, cfg, kind[a], LS_DTYPE_F32, seed[a]);
        ls_adapter_t *own = write_and_load_seeded(c, cfg, kind[a], LS_DTYPE_F32, seed[a]);
        assert_int_equal(ls_lora_pool_add_adapter(pool, names[a], &own, err, sizeof err), 0);
    }
    int32_t slot[N];
    assert_int_equal(slot_plan_map_once(pool, names, N, slot, err, sizeof err), 0);
    // per row: components (adapter index, weight); 0 of them: the base model
    static const struct {
        int n, ad[3];
        float w[3];
    } rows[ROWS] = {
        {0, {0}, {0}},                            // base
        {1, {0}, {1.0f}},                         // e1 alone, as a one-component mix
        {2, {0, 2}, {0.6f, 0.3f}},                // embedding, lm_head in pass 0
        {2, {2, 0}, {0.5f, 1.5f}},                // in pass 1
        {2, {0, 1}, {0.7f, 0.4f}},                // in both
        {3, {1, 2, 0}, {1.0f, 0.25f, 0.5f}},      // three passes
    };
    ls_model_lora_part_t parts[ROWS][3];
    merged_t merged[ROWS];
    int V = sp.vocab;
    int32_t tok[ROWS][P + 1], tables[ROWS][8];
    ls_model_seq_t pre[ROWS], dec[ROWS];
    for (int i = 0; i < ROWS; i++) {
        merged[i].n = rows[i].n;
        for (int k = 0; k < rows[i].n; k++) {
            parts[i][k] = (ls_model_lora_part_t){slot[rows[i].ad[k]], rows[i].w[k]};
            merged[i].ads[k] = ads[rows[i].ad[k]];
            merged[i].w[k] = rows[i].w[k];
        }
        for (int j = 0; j <= P; j++)
            tok[i][j] = token_at(120u + (unsigned)i, j, V);
        table_of(tables[i], 8 * i, 8);
        pre[i] = seq_of(tok[i], P, 0, tables[i], LS_LORA_SLOT_BASE, true);
        dec[i] = seq_of(tok[i] + P, 1, P, tables[i], LS_LORA_SLOT_BASE, true);
        pre[i].mix = dec[i].mix = rows[i].n ? parts[i] : NULL;
        pre[i].n_mix = dec[i].n_mix = rows[i].n;
    }
    double moved, worst = steps_vs_merged(c, pool, &sp, "mix", pre, dec, merged, ROWS, &moved);
    assert_true(worst <= TOL_MERGED);
    assert_true(moved > 0.05);  // every mix does something measurable
    for (int a = 0; a < N; a++)
        ls_adapter_destroy(&ads[a]);
    ls_lora_pool_destroy(&pool);
}

// --- trainable tokens -------------------------------------------------------------------

// The token ids the trainable-token adapters below list, and the prompt positions that hold
// them (and the decode token), so that their embedding rows are read.
static const int32_t TT_IDS[] = {3, 17, 40, 9};
enum { TT_P = 11 };

static void tt_prompt(int32_t *tok, unsigned seed, int V) {
    for (int j = 0; j <= TT_P; j++)
        tok[j] = token_at(seed, j, V);
    tok[1] = TT_IDS[0];
    tok[4] = TT_IDS[1];
    tok[6] = TT_IDS[2];
    tok[8] = TT_IDS[3];
    tok[TT_P] = TT_IDS[0];  // the decode step's token
}

// A q,v adapter with trainable tokens (config's trainable_token_indices, tok_rows the rows
// of its embedding and lm_head tensors), written with seed and loaded.
static ls_adapter_t *tt_adapter(ctx_t *c, const ls_model_config_t *cfg, const char *name,
                                const char *tokens, const int tok_rows[2], unsigned seed) {
    char d[1024], config[512];
    int ranks[64 * LS_TARGET_COUNT];
    snprintf(config, sizeof config, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
             "\"target_modules\": [\"q_proj\", \"v_proj\"], \"trainable_token_indices\": %s}",
             tokens);
    rm_ranks_uniform(ranks, cfg->num_hidden_layers, 1u << LS_TARGET_Q | 1u << LS_TARGET_V, 4);
    fx_path(d, sizeof d, c->dir, name);
    assert_int_equal(rm_write_adapter_tokens(d, cfg, config, ranks, 0, 0, tok_rows, LS_DTYPE_F32,
                                             seed), 0);
    ls_adapter_t *ad = ls_adapter_load(d, cfg, 16, err, sizeof err);
    if (!ad)
        fail_msg("adapter %s: %s", name, err);
    return ad;
}

// Requests on ads[i] (NULL: the base model), each its own prompt holding TT_IDS, in one
// prefill step and one decode step through the pool (which holds every adapter under
// names[i]) == each alone on the model sp with its adapter merged (trainable tokens replace
// their rows). Returns the smallest change an adapter makes to its row, after asserting the
// bound.
static double tt_rows_vs_merged(ctx_t *c, ls_lora_pool_t *pool, const rm_spec_t *sp,
                                const char *tag, const char *const *names,
                                ls_adapter_t *const *ads, int n) {
    enum { MAXN = 6 };
    assert_true(n <= MAXN);
    int32_t slot[MAXN], tok[MAXN][TT_P + 1], tables[MAXN][8];
    assert_int_equal(slot_plan_map_once(pool, names, n, slot, err, sizeof err), 0);
    ls_model_seq_t pre[MAXN], dec[MAXN];
    merged_t merged[MAXN];
    for (int i = 0; i < n; i++) {
        tt_prompt(tok[i], 300u + (unsigned)i, sp->vocab);
        table_of(tables[i], 8 * i, 8);
        pre[i] = seq_of(tok[i], TT_P, 0, tables[i], slot[i], true);
        dec[i] = seq_of(tok[i] + TT_P, 1, TT_P, tables[i], slot[i], true);
        merged[i] = (merged_t){ads[i] ? 1 : 0, {ads[i]}, {1.0f}};
    }
    double moved, worst = steps_vs_merged(c, pool, sp, tag, pre, dec, merged, n, &moved);
    assert_true(worst <= TOL_MERGED);
    return moved;
}

// Trainable tokens (PEFT's trainable_token_indices): an adapter's own rows of the embedding
// and lm_head replace the base model's for its requests only, beside the other adapters and
// the base in one step (prefill and decode), each row == the base with its adapter merged.
// Untied (Llama): t1 has its own rows of both, t2 the embedding's only (lm_head keeps its
// base rows), a3 LoRA on the embedding and lm_head. Tied (Qwen2): t1's embedding rows are
// lm_head's too. A mix with an adapter that has trainable tokens is refused.
static void test_trainable_tokens_equal_merged(void **state) {
    ctx_t *c = *state;
    rm_spec_t sp;
    ls_lora_pool_t *pool = merged_base(c, "tt_base", &sp, 3);
    const ls_model_config_t *cfg = ls_model_config(c->m);
    const int both[2] = {3, 4}, embed_only[2] = {2, 0};
    ls_adapter_t *ads[4] = {
        NULL,
        tt_adapter(c, cfg, "t1", "{\"embed_tokens\": [3, 17, 40], \"lm_head\": [5, 17, 63, 22]}",
                   both, 401),
        tt_adapter(c, cfg, "t2", "[9, 3]", embed_only, 402),
        write_and_load_adapter(c, cfg, 3, LS_DTYPE_F32),
    };
    const char *names[4] = {NULL, "t1", "t2", "a3"};
    for (int a = 1; a < 4; a++) {
        ls_adapter_t *own = a < 3 ? tt_adapter(c, cfg, names[a], a == 1
                                                   ? "{\"embed_tokens\": [3, 17, 40], \"lm_head\": [5, 17, 63, 22]}"
                                                   : "[9, 3]", a == 1 ? both : embed_only, 400 + a)
                                  : write_and_load_adapter(c, cfg, 3, LS_DTYPE_F32);
        assert_int_equal(ls_lora_pool_add_adapter(pool, names[a], &own, err, sizeof err), 0);
    }
    assert_true(tt_rows_vs_merged(c, pool, &sp, "untied", names, ads, 4) > 0.05);

    // a mix naming t1 is refused, and the step with it
    int32_t tok[TT_P + 1], table[8];
    tt_prompt(tok, 7, sp.vocab);
    table_of(table, 0, 8);
    int t1 = ls_lora_pool_slot_of(pool, "t1"), a3 = ls_lora_pool_slot_of(pool, "a3");
    ls_model_lora_part_t parts[2] = {{a3, 0.5f}, {t1, 0.5f}};
    ls_model_seq_t mix = seq_of(tok, TT_P, 0, table, LS_LORA_SLOT_BASE, true);
    mix.mix = parts;
    mix.n_mix = 2;
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    assert_int_equal(ls_model_forward(c->m, kv, pool, &mix, 1, err, sizeof err), -1);
    assert_contains(err, "has trainable tokens, which do not mix");
    ls_kv_cache_destroy(&kv);
    for (int a = 1; a < 4; a++)
        ls_adapter_destroy(&ads[a]);
    ls_lora_pool_destroy(&pool);
    ls_model_destroy(&c->m);

    // tied: the list form's rows are the embedding's and lm_head's
    sp = SPECS[1];
    c->m = load_spec(c, "tt_tied", &sp, NULL);
    cfg = ls_model_config(c->m);
    pool = new_pool(c, cfg, 2);
    const int tied_rows[2] = {3, 0};
    ads[1] = tt_adapter(c, cfg, "q1", "[3, 17, 40]", tied_rows, 501);
    ads[2] = write_and_load_adapter(c, cfg, 0, LS_DTYPE_F32);
    const char *tied_names[3] = {NULL, "q1", "a0"};
    ls_adapter_t *own = tt_adapter(c, cfg, "q1", "[3, 17, 40]", tied_rows, 501);
    assert_int_equal(ls_adapter_token_rows(own, LS_TARGET_LM_HEAD)->n, 3);
    assert_int_equal(ls_lora_pool_add_adapter(pool, "q1", &own, err, sizeof err), 0);
    own = write_and_load_adapter(c, cfg, 0, LS_DTYPE_F32);
    assert_int_equal(ls_lora_pool_add_adapter(pool, "a0", &own, err, sizeof err), 0);
    assert_true(tt_rows_vs_merged(c, pool, &sp, "tied", tied_names, ads, 3) > 0.05);
    ls_adapter_destroy(&ads[1]);
    ls_adapter_destroy(&ads[2]);
    ls_lora_pool_destroy(&pool);
}

// --- added vocabulary -------------------------------------------------------------------

// An adapter with added vocabulary (docs/adapters.md) on a base of vocab_size V: q,v LoRA and
// tokens V, V+1, ... (added_tokens.json). form 0, as PEFT writes it after
// resize_token_embeddings: trainable tokens naming the three new ids, and base ids besides
// (3 in the embedding, 17 in lm_head); form 1, vLLM's new_embeddings.safetensors with two.
static ls_adapter_t *av_adapter(ctx_t *c, const ls_model_config_t *cfg, const char *name,
                                int form, unsigned seed) {
    char d[1024], config[512], json[256];
    int V = cfg->vocab_size;
    if (form == 0) {
        snprintf(config, sizeof config, "{\"embed_tokens\": [3, %d, %d, %d], \"lm_head\": [%d, "
                 "%d, 17, %d]}", V, V + 1, V + 2, V + 2, V, V + 1);
        const int rows[2] = {4, 4};
        char full[768];
        int ranks[64 * LS_TARGET_COUNT];
        snprintf(full, sizeof full, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, "
                 "\"target_modules\": [\"q_proj\", \"v_proj\"], \"trainable_token_indices\": "
                 "%s}", config);
        rm_ranks_uniform(ranks, cfg->num_hidden_layers, 1u << LS_TARGET_Q | 1u << LS_TARGET_V, 4);
        assert_int_equal(rm_write_adapter_tokens(fx_path(d, sizeof d, c->dir, name), cfg, full,
                                                 ranks, 0, 0, rows, LS_DTYPE_F32, seed), 0);
        snprintf(json, sizeof json, "{\"<v0>\": %d, \"<v1>\": %d, \"<v2>\": %d}", V, V + 1, V + 2);
    } else {
        int ranks[64 * LS_TARGET_COUNT];
        rm_ranks_uniform(ranks, cfg->num_hidden_layers, 1u << LS_TARGET_Q | 1u << LS_TARGET_V, 4);
        fx_path(d, sizeof d, c->dir, name);
        mkdir(d, 0700);
        assert_int_equal(rm_write_adapter(d, cfg, "{\"peft_type\": \"LORA\", \"r\": 4, "
                                          "\"lora_alpha\": 8, \"target_modules\": [\"q_proj\", "
                                          "\"v_proj\"]}", ranks, LS_DTYPE_F32, seed), 0);
        size_t H = (size_t)cfg->hidden_size;
        float *rows = malloc(2 * 2 * H * sizeof *rows);
        for (size_t i = 0; i < 4 * H; i++)
            rows[i] = fx_value(seed * 7u + 1u, i);
        ls_st_write_tensor_t t[2] = {
            {"input_embeddings", LS_DTYPE_F32, 2, {2, (int64_t)H}, rows},
            {"output_embeddings", LS_DTYPE_F32, 2, {2, (int64_t)H}, rows + 2 * H},
        };
        char path[4096];
        assert_int_equal(ls_st_write(fx_path(path, sizeof path, d, "new_embeddings.safetensors"),
                                     t, 2, err, sizeof err), 0);
        free(rows);
        snprintf(json, sizeof json, "{\"<w0>\": %d, \"<w1>\": %d}", V, V + 1);
    }
    fx_path(d, sizeof d, c->dir, name);
    assert_int_equal(fx_write_str(d, "added_tokens.json", json), 0);
    ls_adapter_t *ad = ls_adapter_load(d, cfg, 16, err, sizeof err);
    if (!ad)
        fail_msg("adapter %s: %s", name, err);
    assert_int_equal(ls_adapter_info(ad).added_tokens, form ? 2 : 3);
    return ad;
}

// Added vocabulary: an adapter's added ids (V and up) take its own embedding rows and its
// own lm_head rows' logits in columns V .. of the widened logits rows, for its requests only.
// Base + an adapter without tokens + one with trainable tokens + two with added vocabulary
// (v1: PEFT's form, three ids; v2: new_embeddings, two of the same ids with other rows) in one
// prefill step and one decode step, prompts holding added ids: each row == its adapter merged
// into a model resized to its vocabulary, every column past that -inf. Then greedy sampling
// over the width with a repetition penalty on added ids; and the refusals: an added id in a
// sequence whose adapter has no such row, a mix naming an adapter with added vocabulary.
static void test_added_vocab_equals_merged(void **state) {
    ctx_t *c = *state;
    enum { N = 5 };
    rm_spec_t sp;
    ls_lora_pool_t *pool = merged_base(c, "av_base", &sp, 4);
    const ls_model_config_t *cfg = ls_model_config(c->m);
    int V = sp.vocab;
    const int embed_only[2] = {2, 0};
    ls_adapter_t *ads[N] = {NULL, tt_adapter(c, cfg, "t2", "[9, 3]", embed_only, 402),
                            write_and_load_adapter(c, cfg, 0, LS_DTYPE_F32),
                            av_adapter(c, cfg, "v1", 0, 601), av_adapter(c, cfg, "v2", 1, 602)};
    const char *names[N] = {NULL, "t2", "a0", "v1", "v2"};
    for (int a = 1; a < N; a++) {
        ls_adapter_t *own = a == 1   ? tt_adapter(c, cfg, "t2", "[9, 3]", embed_only, 402)
                            : a == 2 ? write_and_load_adapter(c, cfg, 0, LS_DTYPE_F32)
                                     : av_adapter(c, cfg, names[a], a - 3, 598u + (unsigned)a);
        assert_int_equal(ls_lora_pool_add_adapter(pool, names[a], &own, err, sizeof err), 0);
    }
    int32_t slot[N], tok[N][TT_P + 1], tables[N][8];
    assert_int_equal(slot_plan_map_once(pool, names, N, slot, err, sizeof err), 0);
    ls_model_seq_t pre[N], dec[N];
    merged_t merged[N];
    for (int i = 0; i < N; i++) {
        tt_prompt(tok[i], 700u + (unsigned)i, V);
        if (i == 3) {  // v1: its three added ids, and one to decode
            tok[i][2] = V;
            tok[i][5] = V + 2;
            tok[i][9] = V + 1;
            tok[i][TT_P] = V + 1;
        }
        if (i == 4) {  // v2: its two
            tok[i][3] = V + 1;
            tok[i][7] = V;
            tok[i][TT_P] = V;
        }
        table_of(tables[i], 8 * i, 8);
        pre[i] = seq_of(tok[i], TT_P, 0, tables[i], slot[i], true);
        dec[i] = seq_of(tok[i] + TT_P, 1, TT_P, tables[i], slot[i], true);
        merged[i] = (merged_t){ads[i] ? 1 : 0, {ads[i]}, {1.0f}};
    }
    double moved, worst = steps_vs_merged(c, pool, &sp, "added", pre, dec, merged, N, &moved);
    assert_true(worst <= TOL_MERGED);
    assert_true(moved > 0.05);

    // greedy over the whole width, a repetition penalty on the prompt's ids (added ones too)
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    static float l[N * 96];
    int W;
    step_wide(c->m, kv, pool, pre, N, l, &W);
    assert_int_equal(W, V + 8);
    ls_sampling_params_t params[N];
    int32_t indptr[N + 1] = {0}, prompt[N * TT_P], out[N];
    for (int i = 0; i < N; i++) {
        params[i] = (ls_sampling_params_t){.top_p = 1, .repetition_penalty = 1.5f};
        memcpy(prompt + i * TT_P, tok[i], TT_P * sizeof *prompt);
        indptr[i + 1] = (i + 1) * TT_P;
    }
    // masks (of the width) on v1's and v2's rows: v1 may take only its added ids, v2 its
    // second added id or base id 5; the others are free
    enum { WORDS = (64 + 8 + 31) / 32 };
    uint32_t masks[2][WORDS] = {{0}};
    const int32_t allow[2][3] = {{V, V + 1, V + 2}, {V + 1, 5, 5}};
    for (int m = 0; m < 2; m++)
        for (int k = 0; k < 3; k++)
            masks[m][allow[m][k] / 32] |= 1u << (allow[m][k] % 32);
    const int32_t mask_index[N] = {-1, -1, -1, 0, 1};
    ls_sampling_batch_t sb = {.n_rows = N, .params = params, .prompt_indptr = indptr,
                              .prompt_ids = prompt, .mask_index = mask_index,
                              .masks = &masks[0][0]};
    assert_int_equal(ls_model_sample(c->m, &sb, out, NULL, NULL, NULL), 0);
    for (int r = 0; r < N; r++) {
        float *row = l + (size_t)r * W;
        for (int v = 0; mask_index[r] >= 0 && v < W; v++)
            if (!(masks[mask_index[r]][v / 32] >> (v % 32) & 1))
                row[v] = -INFINITY;
        for (int v = 0; v < W; v++) {
            bool seen = false;
            for (int j = 0; j < TT_P && !seen; j++)
                seen = tok[r][j] == v;
            if (seen)
                row[v] = row[v] > 0 ? row[v] / 1.5f : row[v] * 1.5f;
        }
        int best = 0;
        for (int v = 1; v < W; v++)
            best = row[v] > row[best] ? v : best;
        print_message("row %d (%s): greedy %d (penalized argmax %d)\n", r,
                      names[r] ? names[r] : "base", out[r], best);
        assert_int_equal(out[r], best);
    }
    assert_true(out[3] >= V && out[3] < V + 3);  // an added id, sampled

    // refusals: added ids past what the sequence's adapter has
    const struct {
        int row;
        int32_t id;
    } bad[] = {{0, V}, {1, V + 1}, {2, V}, {4, V + 2}, {3, V + 3}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        int32_t t[TT_P];
        memcpy(t, tok[bad[k].row], sizeof t);
        t[4] = bad[k].id;
        ls_model_seq_t q = pre[bad[k].row];
        q.token_ids = t;
        assert_int_equal(ls_model_forward(c->m, kv, pool, &q, 1, err, sizeof err), -1);
        assert_contains(err, "not an added token of its adapter");
    }
    ls_model_lora_part_t parts[2] = {{slot[2], 0.5f}, {slot[3], 0.5f}};
    ls_model_seq_t mix = pre[2];
    mix.lora_slot = LS_LORA_SLOT_BASE;
    mix.mix = parts;
    mix.n_mix = 2;
    assert_int_equal(ls_model_forward(c->m, kv, pool, &mix, 1, err, sizeof err), -1);
    assert_contains(err, "which do not mix");
    ls_kv_cache_destroy(&kv);
    for (int a = 1; a < N; a++)
        ls_adapter_destroy(&ads[a]);
    ls_lora_pool_destroy(&pool);
}

// Requests of a mixed step: history tokens already cached, then the tokens of this step.
typedef struct {
    int adapter; // -1 base, else 0..N_AD-1
    int history, now;
} req_t;

// A pool of N_AD slots holding the N_AD test adapters (f32), under names[0 .. N_AD).
static ls_lora_pool_t *pool_of_adapters(ctx_t *c, const ls_model_config_t *cfg,
                                        const char *const *names) {
    ls_lora_pool_t *pool = new_pool(c, cfg, N_AD);
    for (int a = 0; a < N_AD; a++) {
        ls_adapter_t *ad = write_and_load_adapter(c, cfg, a, LS_DTYPE_F32);
        assert_int_equal(ls_lora_pool_add_adapter(pool, names[a], &ad, err, sizeof err), 0);
    }
    return pool;
}

// Every request in one mixed step == the same request alone, after identical histories.
static void test_mixed_batch_equals_alone(void **state) {
    ctx_t *c = *state;
    c->m = load_spec(c, "mixed", &SPECS[2], NULL); // Qwen3: q/k norm, head_dim != hidden/heads
    const ls_model_config_t *cfg = ls_model_config(c->m);
    static const char *const names[N_AD] = {"a0", "a1", "a2", "a3"};
    ls_lora_pool_t *pool = pool_of_adapters(c, cfg, names);
    static const req_t reqs[] = {
        {-1, 5, 7}, {0, 0, 9}, {1, 11, 1}, {-1, 3, 1}, {2, 6, 4}, {0, 8, 1}, {1, 0, 1},
        {3, 0, 6}, {3, 9, 1},  // the embedding's and lm_head's LoRA beside the others'
    };
    enum { R = sizeof reqs / sizeof reqs[0], MAXT = 20 };
    const char *ids[R];
    int32_t slots[R], tok[R][MAXT], tables[R][8];
    for (int i = 0; i < R; i++)
        ids[i] = reqs[i].adapter < 0 ? NULL : names[reqs[i].adapter];
    assert_int_equal(slot_plan_map_once(pool, ids, R, slots, err, sizeof err), 0);
    int V = SPECS[2].vocab;
    ls_kv_cache_t *kv[2];
    float got[R * 64], alone[64];
    for (int k = 0; k < 2; k++) {
        kv[k] = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
        for (int i = 0; i < R; i++) { // identical histories, each alone
            for (int j = 0; j < MAXT; j++)
                tok[i][j] = token_at(70u + (unsigned)i, j, V);
            table_of(tables[i], 8 * i, 8);
            if (reqs[i].history) {
                ls_model_seq_t s = seq_of(tok[i], reqs[i].history, 0, tables[i], slots[i],
                                          false);
                assert_int_equal(ls_model_forward(c->m, kv[k], pool, &s, 1, err, sizeof err),
                                 0);
            }
        }
    }
    ls_model_seq_t seqs[R];
    for (int i = 0; i < R; i++)
        seqs[i] = seq_of(tok[i] + reqs[i].history, reqs[i].now, reqs[i].history, tables[i],
                         slots[i], true);
    step(c->m, kv[0], pool, seqs, R, got);
    double worst = 0, moved = INFINITY;
    for (int i = 0; i < R; i++) {
        step(c->m, kv[1], pool, &seqs[i], 1, alone);
        double d = max_abs_diff(got + (size_t)i * V, alone, (size_t)V, NULL);
        worst = fmax(worst, d);
        // the same request on the base model differs: LoRA really reached this row
        if (reqs[i].adapter >= 0) {
            float base[64];
            ls_kv_cache_t *kb = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
            ls_model_seq_t h = seq_of(tok[i], reqs[i].history + reqs[i].now, 0, tables[i],
                                      LS_LORA_SLOT_BASE, true);
            step(c->m, kb, NULL, &h, 1, base);
            moved = fmin(moved, max_abs_diff(alone, base, (size_t)V, NULL));
            ls_kv_cache_destroy(&kb);
        }
    }
    int T = 0;
    for (int i = 0; i < R; i++)
        T += seqs[i].n_tokens;
    print_message("mixed step of %d requests (%d tokens) vs alone: max|d| %.2e; adapters "
                  "move their rows by >= %.2f\n", R, T, worst, moved);
    assert_true(worst <= TOL_BATCH);
    assert_true(moved > 0.05);
    ls_kv_cache_destroy(&kv[0]);
    ls_kv_cache_destroy(&kv[1]);
    ls_lora_pool_destroy(&pool);
}

// A decode step of 130 requests on four adapters and the base model (decode-shaped up to 256
// tokens: each projection's LoRA beside its GEMM, the delta folded into the next op) gives
// each row what the request alone gives.
static void test_wide_decode_equals_alone(void **state) {
    ctx_t *c = *state;
    c->m = load_spec(c, "wide", &SPECS[0], NULL);
    const ls_model_config_t *cfg = ls_model_config(c->m);
    static const char *const names[N_AD] = {"a0", "a1", "a2", "a3"};
    ls_lora_pool_t *pool = pool_of_adapters(c, cfg, names);
    enum { R = 130, H = 3 };
    static const char *ids[R];
    static int32_t slots[R], tok[R][H + 1], tables[R][1];
    static float got[R * 64];
    for (int i = 0; i < R; i++)
        ids[i] = i % 5 == 4 ? NULL : names[i % 5];
    assert_int_equal(slot_plan_map_once(pool, ids, R, slots, err, sizeof err), 0);
    int V = SPECS[0].vocab;
    assert_true(V <= 64);
    ls_kv_cache_t *kv[2];
    for (int k = 0; k < 2; k++) {
        kv[k] = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
        for (int i = 0; i < R; i++) { // histories of 1-3 tokens, each alone
            int h = 1 + i % H;
            for (int j = 0; j <= h; j++)
                tok[i][j] = token_at(300u + (unsigned)i, j, V);
            table_of(tables[i], i, 1);
            ls_model_seq_t s = seq_of(tok[i], h, 0, tables[i], slots[i], false);
            assert_int_equal(ls_model_forward(c->m, kv[k], pool, &s, 1, err, sizeof err), 0);
        }
    }
    static ls_model_seq_t seqs[R];
    for (int i = 0; i < R; i++)
        seqs[i] = seq_of(tok[i] + 1 + i % H, 1, 1 + i % H, tables[i], slots[i], true);
    step(c->m, kv[0], pool, seqs, R, got);
    double worst = 0;
    for (int i = 0; i < R; i++) {
        float alone[64];
        step(c->m, kv[1], pool, &seqs[i], 1, alone);
        worst = fmax(worst, max_abs_diff(got + (size_t)i * V, alone, (size_t)V, NULL));
    }
    print_message("decode step of %d requests vs alone: max|d| %.2e\n", R, worst);
    assert_true(worst <= TOL_BATCH);
    ls_kv_cache_destroy(&kv[0]);
    ls_kv_cache_destroy(&kv[1]);
    ls_lora_pool_destroy(&pool);
}

// One pool of pages for KV and adapters, as the worker has it (docs/memory.md): adapters at
// the top of the KV cache's pages, blocks of one token so that rows and chunks come in pieces
// (pages of 32 floats: rows of 40 in two), give the logits of adapters in a pool of their
// own; and a step that writes KV into an adapter's page takes it from its slot.
static void test_shared_pages(void **state) {
    ctx_t *c = *state;
    c->m = load_spec(c, "shared", &SPECS[1], NULL); // Qwen2: one KV head of 8, intermediate 40
    const ls_model_config_t *cfg = ls_model_config(c->m);
    const char *names[N_AD] = {"a0", "a1", "a2", "a3"};
    ls_lora_pool_config_t pc = {.max_loras_per_batch = N_AD, .max_lora_rank = 16,
                                .target_mask = (1u << LS_TARGET_ALL) - 1};
    enum { P = 9, BS1 = 1, R = N_AD + 1 };
    int per_slots = slot_plan_pages(c->m, BS1, &pc, err, sizeof err), NB1 = R * P;
    assert_true(per_slots > 0);
    ls_kv_cache_t *kv_shared = ls_kv_cache_new(c->m, NB1 + per_slots, BS1, err, sizeof err);
    ls_page_arena_t arena = ls_kv_cache_arena(kv_shared);
    ls_lora_pool_t *pools[2] = {new_pool(c, cfg, N_AD), ls_lora_pool_new(c->be, cfg, &pc, &arena, err, sizeof err)};
    assert_non_null(pools[1]);
    ls_lora_mat_t a, b;
    ls_lora_pool_mats(pools[1], 0, LS_LORA_GROUP_DOWN, &a, &b);
    assert_int_equal(a.np, 2);  // down's rows of 40 in pages of 32
    const char *ids[R] = {"a0", NULL, "a1", "a2", "a3"};
    int32_t slots[2][R];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < N_AD; i++) {
            ls_adapter_t *ad = write_and_load_adapter(c, cfg, i, LS_DTYPE_F32);
            assert_int_equal(ls_lora_pool_add_adapter(pools[k], names[i], &ad, err, sizeof err), 0);
        }
        assert_int_equal(slot_plan_map_once(pools[k], ids, R, slots[k], err, sizeof err), 0);
    }
    int V = SPECS[1].vocab;
    int32_t tok[R][P], tables[2][R][P];
    ls_kv_cache_t *kv_own = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    ls_kv_cache_t *kv[2] = {kv_own, kv_shared};
    float got[2][R * 80];
    for (int k = 0; k < 2; k++) {
        ls_model_seq_t seqs[R];
        for (int i = 0; i < R; i++) {
            for (int j = 0; j < P; j++)
                tok[i][j] = token_at(60u + (unsigned)i, j, V);
            int bs = k ? BS1 : BS, nb = (P + bs - 1) / bs;
            table_of(tables[k][i], nb * i, nb);  // the shared cache's KV: below the adapters
            seqs[i] = (ls_model_seq_t){tok[i], P, 0, tables[k][i], nb, slots[k][i], true, NULL, 0};
        }
        step(c->m, kv[k], pools[k], seqs, R, got[k]);
    }
    double mag, d = max_abs_diff(got[1], got[0], (size_t)R * V, &mag);
    print_message("adapters in the KV cache's pages (pieces) vs a pool of their own: max|d| %.2e of %.2f\n", d, mag);
    assert_true(d <= TOL_BATCH);
    // a base request whose last block is a page of a0's: a0 leaves its slot, a1 stays
    int a0 = ls_lora_pool_slot_of(pools[1], "a0");
    int32_t tab[P];
    table_of(tab, 0, P);
    tab[P - 1] = ls_lora_pool_arena(pools[1]).n_pages - a0 * ls_lora_pool_image_max_pages(pools[1]);
    ls_model_seq_t q = {tok[1], P, 0, tab, P, LS_LORA_SLOT_BASE, true, NULL, 0};
    step(c->m, kv_shared, pools[1], &q, 1, got[1]);
    assert_int_equal(ls_lora_pool_slot_of(pools[1], "a0"), -1);
    assert_int_equal(ls_lora_pool_slot_of(pools[1], "a1"), slots[1][2]);
    for (int k = 0; k < 2; k++)
        ls_lora_pool_destroy(&pools[k]);
    ls_kv_cache_destroy(&kv_own);
    ls_kv_cache_destroy(&kv_shared);
}

// The LoRA ops a step runs, by group (told apart by their slices and input width), counted
// through wrappers around the CPU backend's.
enum { G_QKV, G_O, G_GATE_UP, G_DOWN, G_EMBED, G_N };
static struct {
    ls_backend_t orig;
    int hidden, calls[G_N];
} s_ops;

static void count_op(int in, int n_slices) {
    s_ops.calls[n_slices == 3   ? G_QKV
                : n_slices == 2 ? G_GATE_UP
                : in == s_ops.hidden ? G_O
                                     : G_DOWN]++;
}
static void counting_shrink(ls_backend_t *be, ls_view_t tmp, ls_view_t x, ls_lora_mat_t a, int in,
                            int n_slices, int r_max, int batch) {
    count_op(in, n_slices);
    s_ops.orig.lora_shrink(be, tmp, x, a, in, n_slices, r_max, batch);
}
static void counting_fused(ls_backend_t *be, ls_view_t y, ls_view_t x, ls_view_t tmp,
                           ls_lora_mat_t a, ls_lora_mat_t b, const int32_t *so, int in, int n_slices,
                           int r_max, int accumulate, int batch) {
    count_op(in, n_slices);
    s_ops.orig.lora_fused(be, y, x, tmp, a, b, so, in, n_slices, r_max, accumulate, batch);
}
static void counting_embed(ls_backend_t *be, ls_view_t tmp, ls_lora_mat_t a, int vocab, int r_max,
                           int batch) {
    s_ops.calls[G_EMBED]++;
    s_ops.orig.lora_embed_shrink(be, tmp, a, vocab, r_max, batch);
}

// A group's LoRA runs only for the adapters that target it: a q,v adapter under a pool of all
// targets runs no o, gate_up or down LoRA (its slots there hold zeros), prefill and decode;
// beside an adapter of all seven, every group runs. Results: test_mixed_batch_equals_alone.
static void test_lora_skips_untargeted_groups(void **state) {
    ctx_t *c = *state;
    c->m = load_spec(c, "groups", &SPECS[0], NULL);
    const ls_model_config_t *cfg = ls_model_config(c->m);
    ls_lora_pool_t *pool = new_pool(c, cfg, 2);
    const char *ids[2] = {"qv", "all"};
    for (int i = 0; i < 2; i++) {
        ls_adapter_t *ad = write_and_load_adapter(c, cfg, i == 0 ? 3 : 0, LS_DTYPE_F32);
        assert_int_equal(ls_lora_pool_add_adapter(pool, ids[i], &ad, err, sizeof err), 0);
    }
    int32_t slots[2];
    assert_int_equal(slot_plan_map_once(pool, ids, 2, slots, err, sizeof err), 0);
    s_ops.orig = *c->be;
    s_ops.hidden = cfg->hidden_size;
    c->be->lora_shrink = counting_shrink;
    c->be->lora_fused = counting_fused;
    c->be->lora_embed_shrink = counting_embed;
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    int L = cfg->num_hidden_layers, V = SPECS[0].vocab;
    int32_t tok[2][8], tables[2][8];
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 8; j++)
            tok[i][j] = token_at(90u + (unsigned)i, j, V);
        table_of(tables[i], 8 * i, 8);
    }
    float out[2 * 64];
    static const struct {
        int first, n, start, len; // requests first .. first+n-1, tokens [start, start+len)
        int want[G_N];
    } cases[] = {
        {0, 1, 0, 5, {1, 0, 0, 0, 1}}, // the q,v adapter's prefill
        {0, 1, 5, 1, {1, 0, 0, 0, 1}}, // its decode (the fused op)
        {1, 1, 0, 5, {1, 1, 1, 1, 0}}, // the adapter of all seven
        {0, 2, 6, 1, {1, 1, 1, 1, 1}}, // both: narrowed batches for o, gate_up, down, embed
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ls_model_seq_t seqs[2];
        for (int i = 0; i < cases[k].n; i++) {
            int r = cases[k].first + i;
            seqs[i] = seq_of(tok[r] + cases[k].start, cases[k].len, cases[k].start, tables[r],
                             slots[r], true);
        }
        if (k == 3) { // request 1 catches up to position 6 first
            ls_model_seq_t s = seq_of(tok[1] + 5, 1, 5, tables[1], slots[1], true);
            step(c->m, kv, pool, &s, 1, out);
        }
        memset(s_ops.calls, 0, sizeof s_ops.calls);
        step(c->m, kv, pool, seqs, cases[k].n, out);
        for (int g = 0; g < G_N; g++) {
            int want = cases[k].want[g] * (g == G_EMBED ? 1 : L);
            if (s_ops.calls[g] != want)
                fail_msg("case %zu, group %d: %d LoRA ops, want %d", k, g, s_ops.calls[g], want);
        }
    }
    *c->be = s_ops.orig;
    ls_kv_cache_destroy(&kv);
    ls_lora_pool_destroy(&pool);
}

// --- sampling and errors ----------------------------------------------------------------

static void test_sample_greedy(void **state) {
    ctx_t *c = *state;
    c->m = load_spec(c, "sample", &SPECS[1], NULL);
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, NB, BS, err, sizeof err);
    int V = SPECS[1].vocab;
    int32_t tok[3][5], tables[3][2];
    ls_model_seq_t seqs[3];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 5; j++)
            tok[i][j] = token_at(90u + (unsigned)i, j, V);
        table_of(tables[i], 2 * i, 2);
        seqs[i] = seq_of(tok[i], 5, 0, tables[i], 0, i != 1); // the middle one wants none
    }
    float logits[2 * 72];
    step(c->m, kv, NULL, seqs, 3, logits);
    ls_sampling_params_t params[2] = {{.top_p = 1, .repetition_penalty = 1},
                                      {.top_p = 1, .repetition_penalty = 1}};
    ls_sampling_batch_t sb = {.n_rows = 2, .params = params};
    int32_t out[2];
    assert_int_equal(ls_model_sample(c->m, &sb, out, NULL, NULL, NULL), 0);
    for (int r = 0; r < 2; r++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            best = logits[r * V + v] > logits[r * V + best] ? v : best;
        assert_int_equal(out[r], best);
    }
    ls_kv_cache_destroy(&kv);
}

static void expect_step_error(ls_model_t *m, ls_kv_cache_t *kv, ls_lora_pool_t *pool,
                              ls_model_seq_t s, const char *needle) {
    assert_int_equal(ls_model_forward(m, kv, pool, &s, 1, err, sizeof err), -1);
    print_message("refused: %s\n", err);
    assert_contains(err, needle);
}

static void test_step_errors(void **state) {
    ctx_t *c = *state;
    rm_spec_t sp = SPECS[3];
    sp.sliding_window = 16;
    c->m = load_spec(c, "errors", &sp, NULL);
    ls_kv_cache_t *kv = ls_kv_cache_new(c->m, 8, BS, err, sizeof err);
    int32_t tok[20] = {0}, table[5] = {0, 1, 2, 3, 4}, bad_table[2] = {0, 8};
    ls_model_seq_t ok = seq_of(tok, 16, 0, table, 0, true), s;
    assert_int_equal(ls_model_forward(c->m, kv, NULL, &ok, 1, err, sizeof err), 1);

    s = seq_of(tok, 1, 16, table, 0, true); // context 17 > sliding_window 16
    expect_step_error(c->m, kv, NULL, s, "sliding_window of 16");
    tok[3] = sp.vocab;
    s = seq_of(tok, 4, 0, table, 0, true);
    expect_step_error(c->m, kv, NULL, s, "outside the vocabulary");
    tok[3] = 0;
    s = seq_of(tok, 9, 0, table, 0, true);
    s.n_blocks = 2;
    expect_step_error(c->m, kv, NULL, s, "cannot hold a context of 9");
    s = seq_of(tok, 6, 0, bad_table, 0, true);
    expect_step_error(c->m, kv, NULL, s, "block 8 is outside the KV cache");
    s = seq_of(tok, 2, 0, table, 1, true);
    expect_step_error(c->m, kv, NULL, s, "no pool given");
    s = seq_of(tok, 0, 0, table, 0, true);
    expect_step_error(c->m, kv, NULL, s, "n_tokens >= 1");
    assert_int_equal(ls_model_forward(c->m, kv, NULL, &ok, 0, err, sizeof err), -1);
    assert_null(ls_kv_cache_new(c->m, 0, BS, err, sizeof err));
    ls_kv_cache_destroy(&kv);
    ls_kv_cache_destroy(&kv); // idempotent
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_load_progress_and_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunked_prefill_and_decode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lora_equals_merged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_batch_equals_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wide_decode_equals_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lora_skips_untargeted_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mix_embed_head_equals_merged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trainable_tokens_equal_merged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_added_vocab_equals_merged, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sample_greedy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_step_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
