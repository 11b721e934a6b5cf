/*  bench/bench_cpu.c — CPU backend prefill and decode tokens/s, base model vs multi-LoRA.

    A random Llama (written to a temporary directory with tests/engine/random_model.h) and
    n_adapters random adapters of rank 16 on all seven targets. Two workloads, each run
    twice — every sequence on the base model, then the sequences spread round-robin over
    the adapters (one mixed batch) — and printed side by side with the ratio:

    - prefill: a batch of 4 sequences of 256 new tokens each (one step, 1024 tokens);
    - decode: 32 sequences with 128 cached tokens, 16 decode steps of one token each.

    Each number is the best of --reps runs (a fresh KV cache per run). Not a ctest.

    Usage: bench_cpu [--threads N] [--reps N] [--adapters N] [--layers N] [--hidden N]
*/
#include "random_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "lora_pool.h"
#include "model.h"
#include "slot_plan.h"
#include "bench_util.h"

#define RANK 16
#define BS 16

typedef struct {
    int threads, reps, n_adapters, layers, hidden;
} s_opts_t;

typedef struct {
    ls_model_t *m;
    ls_lora_pool_t *pool;
    int32_t *slots; // (n_seqs) per sequence: base, or an adapter round-robin
    int vocab;
} s_bench_t;

// Runs n_seqs sequences: a prefill of `prompt` tokens, then `decode` steps. Returns the
// seconds of the prefill step and of the decode steps through *t_prefill, *t_decode.
static void s_run(const s_bench_t *b, int n_seqs, int prompt, int decode, bool lora,
                  double *t_prefill, double *t_decode) {
    char err[512];
    int per_seq = (prompt + decode + BS - 1) / BS;
    ls_kv_cache_t *kv = ls_kv_cache_new(b->m, n_seqs * per_seq, BS, err, sizeof err);
    if (!kv)
        bench_die("bench_cpu", "KV cache", err);
    int32_t *tok = malloc((size_t)n_seqs * (prompt + decode) * sizeof *tok);
    int32_t *tables = malloc((size_t)n_seqs * per_seq * sizeof *tables);
    ls_model_seq_t *seqs = malloc((size_t)n_seqs * sizeof *seqs);
    for (int i = 0; i < n_seqs * (prompt + decode); i++)
        tok[i] = (int32_t)((unsigned)i * 2654435761u % (unsigned)b->vocab);
    for (int i = 0; i < n_seqs * per_seq; i++)
        tables[i] = i;
    for (int s = 0; s < n_seqs; s++)
        seqs[s] = (ls_model_seq_t){tok + (size_t)s * (prompt + decode), prompt, 0,
                                   tables + (size_t)s * per_seq, per_seq,
                                   lora ? b->slots[s] : LS_LORA_SLOT_BASE, true, NULL, 0};
    double t0 = bench_now();
    if (ls_model_forward(b->m, kv, b->pool, seqs, n_seqs, err, sizeof err) < 0)
        bench_die("bench_cpu", "prefill", err);
    double t1 = bench_now();
    for (int d = 0; d < decode; d++) {
        for (int s = 0; s < n_seqs; s++) {
            seqs[s].token_ids += seqs[s].n_tokens;
            seqs[s].start_pos += seqs[s].n_tokens;
            seqs[s].n_tokens = 1;
        }
        if (ls_model_forward(b->m, kv, b->pool, seqs, n_seqs, err, sizeof err) < 0)
            bench_die("bench_cpu", "decode", err);
    }
    *t_prefill = t1 - t0;
    *t_decode = bench_now() - t1;
    ls_kv_cache_destroy(&kv);
    free(tok);
    free(tables);
    free(seqs);
}

// Best-of-reps tokens/s of a workload, base and LoRA.
static void s_report(const s_bench_t *b, const s_opts_t *o, const char *name, int n_seqs,
                     int prompt, int decode) {
    double best[2] = {0, 0};
    for (int lora = 0; lora < 2; lora++)
        for (int r = 0; r < o->reps; r++) {
            double tp, td;
            s_run(b, n_seqs, prompt, decode, lora, &tp, &td);
            double tps = decode ? (double)n_seqs * decode / td : (double)n_seqs * prompt / tp;
            best[lora] = tps > best[lora] ? tps : best[lora];
        }
    printf("%-8s %4d seqs x %4d tokens  base %9.1f tok/s   %d adapters %9.1f tok/s   "
           "ratio %.3f\n", name, n_seqs, decode ? decode : prompt, best[0], o->n_adapters,
           best[1], best[1] / best[0]);
}

int main(int argc, char **argv) {
    s_opts_t o = {.threads = 0, .reps = 3, .n_adapters = 4, .layers = 4, .hidden = 512};
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--threads")) o.threads = v;
        else if (!strcmp(argv[i], "--reps")) o.reps = v;
        else if (!strcmp(argv[i], "--adapters")) o.n_adapters = v;
        else if (!strcmp(argv[i], "--layers")) o.layers = v;
        else if (!strcmp(argv[i], "--hidden")) o.hidden = v;
        else {
            fprintf(stderr, "usage: bench_cpu [--threads N] [--reps N] [--adapters N] "
                            "[--layers N] [--hidden N]\n");
            return 2;
        }
    }
    if (o.reps < 1 || o.n_adapters < 1 || o.layers < 1 || o.hidden < 64 || o.hidden % 64) {
        fprintf(stderr, "bench_cpu: need reps, adapters, layers >= 1 and hidden a multiple "
                        "of 64\n");
        return 2;
    }
    char *dir = fx_tmpdir(), err[512], path[1024];
    rm_spec_t sp = {.arch = LS_ARCH_LLAMA, .hidden = o.hidden, .inter = o.hidden * 11 / 4,
                    .layers = o.layers, .heads = o.hidden / 64, .kv_heads = o.hidden / 128 > 0
                    ? o.hidden / 128 : 1, .vocab = 8192, .dtype = LS_DTYPE_BF16, .seed = 1};
    if (rm_write_model(dir, &sp, NULL) != 0)
        bench_die("bench_cpu", "writing the model", dir);
    ls_backend_t *be = ls_backend_cpu_new(o.threads);
    s_bench_t b = {.m = ls_model_load(dir, be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err), .vocab = sp.vocab};
    if (!b.m)
        bench_die("bench_cpu", "model", err);
    const ls_model_config_t *cfg = ls_model_config(b.m);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = o.n_adapters, .max_lora_rank = RANK};
    ls_kv_cache_t *arena_kv = slot_plan_arena_new(b.m, 16, &pc, err, sizeof err);
    ls_page_arena_t arena = arena_kv ? ls_kv_cache_arena(arena_kv) : (ls_page_arena_t){0};
    b.pool = arena_kv ? ls_lora_pool_new(be, cfg, &pc, &arena, err, sizeof err) : NULL;
    if (!b.pool)
        bench_die("bench_cpu", "pool", err);
    int *ranks = malloc((size_t)o.layers * LS_TARGET_COUNT * sizeof *ranks);
    rm_ranks_uniform(ranks, o.layers, 0x7f, RANK);
    char **ids = calloc((size_t)o.n_adapters, sizeof *ids);
    for (int a = 0; a < o.n_adapters; a++) {
        char name[32];
        snprintf(name, sizeof name, "adapter%d", a);
        fx_path(path, sizeof path, dir, name);
        if (rm_write_adapter(path, cfg, "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 32, "
                             "\"target_modules\": \"all-linear\"}", ranks, LS_DTYPE_BF16,
                             (unsigned)a + 1) != 0)
            bench_die("bench_cpu", "writing an adapter", path);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, RANK, err, sizeof err);
        if (!ad || ls_lora_pool_add_adapter(b.pool, name, &ad, err, sizeof err) != 0)
            bench_die("bench_cpu", name, err);
        ids[a] = strdup(name);
    }
    enum { MAX_SEQS = 32 };
    const char *seq_ids[MAX_SEQS];
    int32_t slots[MAX_SEQS];
    for (int s = 0; s < MAX_SEQS; s++)
        seq_ids[s] = ids[s % o.n_adapters];
    if (slot_plan_map_once(b.pool, seq_ids, MAX_SEQS, slots, err, sizeof err) != 0)
        bench_die("bench_cpu", "slots", err);
    b.slots = slots;

    char threads[32] = "OpenBLAS default";
    if (o.threads > 0)
        snprintf(threads, sizeof threads, "%d", o.threads);
    printf("bench_cpu: Llama hidden %d, intermediate %d, %d layers, %d heads (%d kv), vocab "
           "%d, bf16 weights as f32; LoRA rank %d on all seven targets; BLAS threads: %s; "
           "best of %d\n", sp.hidden, sp.inter, sp.layers, sp.heads, sp.kv_heads, sp.vocab,
           RANK, threads, o.reps);
    s_report(&b, &o, "prefill", 4, 256, 0);
    s_report(&b, &o, "decode", MAX_SEQS, 128, 16);

    for (int a = 0; a < o.n_adapters; a++)
        free(ids[a]);
    free(ids);
    free(ranks);
    ls_lora_pool_destroy(&b.pool);
    ls_kv_cache_destroy(&arena_kv);
    ls_model_destroy(&b.m);
    ls_backend_destroy(&be);
    fx_rmdir(&dir);
    return 0;
}
