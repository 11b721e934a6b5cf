/*  bench/bench_tp_cuda.c — decode throughput at tensor-parallel sizes 1 and 2 on the CUDA
    backend with the NCCL communicator, at Llama-3-8B shapes (llama3_8b.h, dummy weights).

    Each rank is a thread driving its own GPU (rank r on GPU r), as a worker process would:
    its backend, its shard of the model (ls_model_load_dummy with the group's comm), its
    shard of the LoRA slots and its KV cache. Batch: 64 sequences with CTX cached positions,
    decode steps of one token each; a step = ls_model_forward on every rank (two NCCL
    all-reduces a layer, one for the embedding, the logits gather to rank 0) + greedy
    ls_model_sample on rank 0 (the others synchronize their stream), timed on rank 0.
    Workloads: the base model, and 8 distinct adapters (rank 16, all seven targets; one PEFT
    file loaded under 8 ids), sequence s on adapter s % 8. Median of STEPS steps after WARM.

    Usage: bench_tp_cuda [--steps N] [--ctx N]   Not a ctest; needs 2 GPUs (~17 GB each at
    TP=2, ~26 GB on GPU 0 at TP=1). Keep NCCL_NVLS_ENABLE=0 (the communicator sets it).
*/
#include "random_model.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "backend_cuda.h"
#include "comm_nccl.h"
#include "llama3_8b.h"
#include "lora_pool.h"
#include "model.h"
#include "slot_plan.h"
#include "bench_util.h"

#define N_SEQS 64
#define RANK 16
#define N_ADAPTERS 8
#define BS 16
#define WARM 3
#define MAX_TP 2

typedef struct {
    int size, steps, ctx;
    const char *adapter_dir;
    ls_comm_id_t id;
    double load_s, step_s[2]; // [base, adapters], rank 0's median
    char err[MAX_TP][512];
    int failed;
} s_group_t;

typedef struct {
    s_group_t *g;
    int r;
} s_rank_arg_t;

// Median seconds per step (rank 0's clock) of the batch on slots; -1 on failure.
static double s_decode(s_group_t *g, int r, ls_backend_t *be, ls_model_t *m, ls_kv_cache_t *kv,
                       ls_lora_pool_t *pool, const int32_t *slots, int per_seq) {
    static __thread int32_t tables[N_SEQS][64];
    int32_t tok[N_SEQS];
    ls_model_seq_t seqs[N_SEQS];
    ls_sampling_params_t params[N_SEQS];
    int V = ls_model_config(m)->vocab_size;
    for (int s = 0; s < N_SEQS; s++) {
        for (int i = 0; i < per_seq; i++)
            tables[s][i] = s * per_seq + i;
        tok[s] = (int32_t)((unsigned)(s + 1) * 2654435761u % (unsigned)V);
        seqs[s] = (ls_model_seq_t){&tok[s], 1, g->ctx, tables[s], per_seq, slots[s], true, NULL, 0};
        params[s] = (ls_sampling_params_t){.top_p = 1, .repetition_penalty = 1};
    }
    ls_sampling_batch_t sb = {.n_rows = N_SEQS, .params = params};
    int n = WARM + g->steps;
    double t[256];
    for (int i = 0; i < n; i++) {
        double t0 = bench_now();
        if (ls_model_forward(m, kv, pool, seqs, N_SEQS, g->err[r], sizeof g->err[r]) != N_SEQS)
            return -1;
        // rank 0 samples (which waits for the step); the others only wait, as their worker
        // does when it has nothing to sample
        if ((r == 0 ? ls_model_sample(m, &sb, tok, NULL, NULL, NULL) : be->synchronize(be)) != 0) {
            snprintf(g->err[r], sizeof g->err[r], "sample/synchronize failed");
            return -1;
        }
        t[i] = bench_now() - t0;
        for (int s = 0; s < N_SEQS; s++)
            seqs[s].start_pos++;
    }
    return bench_median(t + WARM, g->steps);
}

static void *s_rank(void *arg) {
    s_rank_arg_t *a = arg;
    s_group_t *g = a->g;
    int r = a->r;
    char *err = g->err[r], path[1024];
    size_t errlen = sizeof g->err[r];
    ls_backend_t *be = ls_backend_cuda_new(r, err, errlen);
    ls_comm_t *comm = NULL;
    ls_model_t *m = NULL;
    ls_lora_pool_t *pool = NULL;
    ls_kv_cache_t *kv = NULL, *arena_kv = NULL;
    double t0 = bench_now();
    if (!be || (g->size > 1 && !(comm = ls_comm_nccl_join(&g->id, r, be, 120000, err, errlen))) ||
        !(m = ls_model_load_dummy(LS_BENCH_LLAMA3_8B, be, comm, LS_QUANT_NONE, 1, NULL, NULL, err, errlen)))
        goto out;
    const ls_model_config_t *cfg = ls_model_config(m);
    ls_lora_pool_config_t pc = {.max_loras_per_batch = N_ADAPTERS, .max_lora_rank = RANK,
                                .tp_rank = r, .tp_size = g->size};
    if (!(arena_kv = slot_plan_arena_new(m, BS, &pc, err, errlen)))
        goto out;
    ls_page_arena_t arena = ls_kv_cache_arena(arena_kv);
    if (!(pool = ls_lora_pool_new(be, cfg, &pc, &arena, err, errlen)))
        goto out;
    const char *ids[N_SEQS];
    char names[N_ADAPTERS][16];
    for (int k = 0; k < N_ADAPTERS; k++) {
        snprintf(names[k], sizeof names[k], "id%d", k);
        snprintf(path, sizeof path, "%s/adapter", g->adapter_dir);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, RANK, err, errlen);
        if (!ad || ls_lora_pool_add_adapter(pool, names[k], &ad, err, errlen) != 0) {
            ls_adapter_destroy(&ad);
            goto out;
        }
    }
    int32_t base[N_SEQS], lora[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) {
        base[s] = LS_LORA_SLOT_BASE;
        ids[s] = names[s % N_ADAPTERS];
    }
    if (slot_plan_map_once(pool, ids, N_SEQS, lora, err, errlen) != 0)
        goto out;
    int per_seq = (g->ctx + WARM + g->steps + BS) / BS;
    if (per_seq > 64) {
        snprintf(err, errlen, "ctx + steps too long for the block tables");
        goto out;
    }
    if (!(kv = ls_kv_cache_new(m, N_SEQS * per_seq, BS, err, errlen)))
        goto out;
    if (r == 0)
        g->load_s = bench_now() - t0;
    for (int w = 0; w < 2; w++) {
        double t = s_decode(g, r, be, m, kv, pool, w ? lora : base, per_seq);
        if (t < 0)
            goto out;
        if (r == 0)
            g->step_s[w] = t;
    }
    err[0] = '\0';
out:
    if (err[0])
        g->failed = 1;
    ls_kv_cache_destroy(&kv);
    ls_lora_pool_destroy(&pool);
    ls_kv_cache_destroy(&arena_kv);
    ls_model_destroy(&m);
    ls_comm_destroy(&comm);
    ls_backend_destroy(&be);
    return NULL;
}

static int s_run(s_group_t *g) {
    char err[256];
    if (g->size > 1 && ls_comm_nccl_id(g->size, &g->id, err, sizeof err) != 0) {
        fprintf(stderr, "bench_tp_cuda: %s\n", err);
        return -1;
    }
    pthread_t t[MAX_TP];
    s_rank_arg_t args[MAX_TP];
    for (int r = 0; r < g->size; r++) {
        args[r] = (s_rank_arg_t){g, r};
        pthread_create(&t[r], NULL, s_rank, &args[r]);
    }
    for (int r = 0; r < g->size; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < g->size && g->failed; r++)
        if (g->err[r][0])
            fprintf(stderr, "bench_tp_cuda: TP=%d rank %d: %s\n", g->size, r, g->err[r]);
    return g->failed ? -1 : 0;
}

int main(int argc, char **argv) {
    int steps = 20, ctx = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx"))
            ctx = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_tp_cuda [--steps N] [--ctx N]\n");
            return 2;
        }
    }
    if (steps < 1 || steps > 200 || ctx < 1) {
        fprintf(stderr, "bench_tp_cuda: steps in 1..200, ctx >= 1\n");
        return 2;
    }
    int n_gpus = 0;
    cudaGetDeviceCount(&n_gpus);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    // one adapter file at 8B shapes, loaded under 8 ids
    char *dir = fx_tmpdir(), path[1024];
    ls_model_config_t cfg;
    char err[512];
    int *ranks = NULL;
    if (ls_model_config_parse(LS_BENCH_LLAMA3_8B, strlen(LS_BENCH_LLAMA3_8B), "llama3-8b", &cfg, err,
                              sizeof err) != 0 ||
        !(ranks = malloc((size_t)cfg.num_hidden_layers * LS_TARGET_COUNT * sizeof *ranks))) {
        fprintf(stderr, "bench_tp_cuda: config: %s\n", err);
        return 1;
    }
    rm_ranks_uniform(ranks, cfg.num_hidden_layers, 0x7f, RANK);
    if (rm_write_adapter(fx_path(path, sizeof path, dir, "adapter"), &cfg,
                         "{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 32, "
                         "\"target_modules\": \"all-linear\"}", ranks, LS_DTYPE_BF16, 1) != 0)
        return 1;
    printf("bench_tp_cuda: %d x %s; Llama-3-8B dummy (bf16), batch %d, %d cached tokens each, "
           "%d adapters of rank %d on all seven targets, median of %d steps\n",
           n_gpus, prop.name, N_SEQS, ctx, N_ADAPTERS, RANK, steps);
    printf("\n%-4s %-22s %9s %10s %8s %9s\n", "TP", "workload", "step ms", "tokens/s", "vs TP=1",
           "set-up s");
    double base1[2] = {0, 0};
    int rc = 0;
    for (int size = 1; size <= MAX_TP && size <= n_gpus; size++) {
        s_group_t g = {.size = size, .steps = steps, .ctx = ctx, .adapter_dir = dir};
        if (s_run(&g) != 0) {
            rc = 1;
            break;
        }
        for (int w = 0; w < 2; w++) {
            if (size == 1)
                base1[w] = g.step_s[w];
            printf("%-4d %-22s %9.3f %10.0f %8.2f %9.1f\n", size, w ? "8 distinct adapters" : "base model",
                   1e3 * g.step_s[w], N_SEQS / g.step_s[w], base1[w] / g.step_s[w], g.load_s);
        }
        fflush(stdout);
    }
    free(ranks);
    fx_rmdir(&dir);
    return rc;
}
