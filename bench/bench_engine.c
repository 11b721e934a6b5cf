/*  bench/bench_engine.c — the pieces the CUDA engine benchmarks share (bench_engine.h). */
#include "random_model.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.h"
#include "bench_engine.h"

#include "slot_plan.h"
#include "bench_util.h"
#include "llama3_8b.h"

double bench_copy_bw(const char *prog) {
    size_t n = (size_t)2 << 30;
    void *a, *b;
    if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess)
        bench_die(prog, "copy bandwidth", "cudaMalloc failed");
    cudaMemset(a, 1, n);
    double best = 1e30;
    for (int i = 0; i < 8; i++) {
        cudaDeviceSynchronize();
        double t0 = bench_now();
        cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, 0);
        if (cudaDeviceSynchronize() != cudaSuccess)
            bench_die(prog, "copy bandwidth", "the copy failed");
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)n / best / 1e9;
}

double bench_gemm_tflops(const char *prog, int n) {
    size_t elems = (size_t)n * (size_t)n;
    // a, b, c are (n, n) bf16; a and b hold U(-1, 1) rounded to bf16 (the top 16 bits of f32)
    uint16_t *h = malloc(elems * sizeof *h);
    void *a = NULL, *b = NULL, *c = NULL;
    if (!h || cudaMalloc(&a, elems * 2) != cudaSuccess || cudaMalloc(&b, elems * 2) != cudaSuccess ||
        cudaMalloc(&c, elems * 2) != cudaSuccess)
        bench_die(prog, "tensor-core rate", "out of memory for the GEMM's matrices");
    uint32_t x = 12345;
    for (size_t i = 0; i < elems; i++) {
        x = x * 1664525u + 1013904223u;
        float f = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        h[i] = (uint16_t)(u >> 16);
    }
    cudaMemcpy(a, h, elems * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, h, elems * 2, cudaMemcpyHostToDevice);
    free(h);
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS)
        bench_die(prog, "tensor-core rate", "cublasCreate failed");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const float one = 1.0f, zero = 0.0f;
    double best = 1e30;
    for (int round = 0; round < 8; round++) {
        cudaEventRecord(e0, 0);
        for (int i = 0; i < 5; i++)
            if (cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                             CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
                bench_die(prog, "tensor-core rate", "cublasGemmEx failed");
        cudaEventRecord(e1, 0);
        if (cudaEventSynchronize(e1) != cudaSuccess)
            bench_die(prog, "tensor-core rate", "the GEMM failed");
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (round >= 2)
            best = ms < best ? ms : best;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cublasDestroy(blas);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 5 * 2.0 * (double)n * n * n / (best * 1e-3) / 1e12;
}

bench_batch_t *bench_batch_new(int cap, const char *prog) {
    bench_batch_t *b = calloc(1, sizeof *b);
    if (!b || !(b->seqs = calloc((size_t)cap, sizeof *b->seqs)) ||
        !(b->tok = calloc((size_t)cap, sizeof *b->tok)) ||
        !(b->tables = calloc((size_t)cap, sizeof *b->tables)) ||
        !(b->params = calloc((size_t)cap, sizeof *b->params)))
        bench_die(prog, "batch", "out of memory");
    b->cap = cap;
    b->prog = prog;
    b->sample = (ls_sampling_params_t){.top_p = 1, .repetition_penalty = 1};
    return b;
}

void bench_batch_destroy(bench_batch_t **self_p) {
    bench_batch_t *b = *self_p;
    if (!b)
        return;
    for (int s = 0; s < b->cap; s++)
        free(b->tables[s]);
    free(b->seqs);
    free(b->tok);
    free(b->tables);
    free(b->params);
    free(b);
    *self_p = NULL;
}

void bench_batch_decode(bench_batch_t *b, int n, int ctx, int first_block, int n_blocks,
                        const int32_t *slots, int vocab) {
    for (int s = 0; s < n; s++) {
        int32_t *t = realloc(b->tables[s], (size_t)n_blocks * sizeof *t);
        if (!t)
            bench_die(b->prog, "block table", "out of memory");
        b->tables[s] = t;
        for (int i = 0; i < n_blocks; i++)
            t[i] = first_block + s * n_blocks + i;
        b->tok[s] = (int32_t)((unsigned)(s + 1) * 2654435761u % (unsigned)vocab);
        b->seqs[s] = (ls_model_seq_t){&b->tok[s], 1, ctx, t, n_blocks,
                                      slots ? slots[s] : LS_LORA_SLOT_BASE, true, NULL, 0};
    }
    b->n = n;
}

double bench_step(ls_model_t *m, ls_kv_cache_t *kv, ls_lora_pool_t *pool, bench_batch_t *b) {
    const char *prog = b->prog;
    char err[512];
    int rows = 0;
    for (int s = 0; s < b->n; s++) {
        rows += b->seqs[s].want_logits;
        b->params[s] = b->sample;
        b->params[s].step = b->seqs[s].start_pos; // a new draw each step
    }
    double t0 = bench_now();
    if (ls_model_forward(m, kv, pool, b->seqs, b->n, err, sizeof err) != rows)
        bench_die(prog, "forward", err);
    // Rows come in batch order and a step's decode rows come first (as the scheduler plans
    // it), so each decode row's sample lands in its own token.
    ls_sampling_batch_t sb = {.n_rows = rows, .params = b->params};
    if (rows > 0 && ls_model_sample(m, &sb, b->tok, NULL, NULL, NULL) != 0)
        bench_die(prog, "sample", "failed");
    double t = bench_now() - t0;
    for (int r = 0; r < rows; r++)
        if (b->tok[r] < 0 || b->tok[r] >= ls_model_config(m)->vocab_size)
            bench_die(prog, "sample", "a token outside the vocabulary");
    return t;
}

// Writes n_files adapters into a fresh e->dir and adds n_ids ids of them to e->pool.
static void s_adapters_load(bench_engine_t *e, const char *prog, int rank, int n_files, int n_ids,
                            char (*ids)[16]) {
    const ls_model_config_t *cfg = ls_model_config(e->m);
    char err[512], path[1024], config[256], name[32];
    e->dir = fx_tmpdir();
    int *ranks = malloc((size_t)cfg->num_hidden_layers * LS_TARGET_COUNT * sizeof *ranks);
    if (!e->dir || !ranks)
        bench_die(prog, "adapters", "no temporary directory or out of memory");
    rm_ranks_uniform(ranks, cfg->num_hidden_layers, 0x7f, rank);
    snprintf(config, sizeof config, "{\"peft_type\": \"LORA\", \"r\": %d, \"lora_alpha\": %d, "
             "\"target_modules\": \"all-linear\"}", rank, 2 * rank);
    for (int f = 0; f < n_files; f++) {
        snprintf(name, sizeof name, "adapter%d", f);
        if (rm_write_adapter(fx_path(path, sizeof path, e->dir, name), cfg, config, ranks,
                             LS_DTYPE_BF16, (unsigned)f + 1) != 0)
            bench_die(prog, "writing an adapter", path);
    }
    free(ranks);
    for (int a = 0; a < n_ids; a++) {
        snprintf(name, sizeof name, "adapter%d", a % n_files);
        snprintf(ids[a], sizeof ids[a], "id%d", a);
        ls_adapter_t *ad = ls_adapter_load(fx_path(path, sizeof path, e->dir, name), cfg, rank,
                                           err, sizeof err);
        if (!ad)
            bench_die(prog, name, err);
        e->adapter_elems = ls_adapter_bytes(ad) / sizeof(float);
        if (ls_lora_pool_add_adapter(e->pool, ids[a], &ad, err, sizeof err) != 0)
            bench_die(prog, ids[a], err);
    }
}

void bench_engine_open(bench_engine_t *e, const char *prog, ls_quant_t quant, int slots,
                       int rank, int n_files, int n_ids, char (*ids)[16]) {
    char err[512];
    *e = (bench_engine_t){0};
    if (!(e->be = ls_backend_cuda_new(0, err, sizeof err)))
        bench_die(prog, "backend", err);
    double t0 = bench_now();
    if (!(e->m = ls_model_load_dummy(LS_BENCH_LLAMA3_8B, e->be, NULL, quant, 1, NULL, NULL, err, sizeof err)))
        bench_die(prog, "dummy model", err);
    e->load_s = bench_now() - t0;
    t0 = bench_now();
    ls_lora_pool_config_t pc = {.max_loras_per_batch = slots, .max_lora_rank = rank};
    if (!(e->arena = slot_plan_arena_new(e->m, 16, &pc, err, sizeof err)))
        bench_die(prog, "the pool's pages", err);
    ls_page_arena_t arena = ls_kv_cache_arena(e->arena);
    if (!(e->pool = ls_lora_pool_new(e->be, ls_model_config(e->m), &pc, &arena, err, sizeof err)))
        bench_die(prog, "pool", err);
    s_adapters_load(e, prog, rank, n_files, n_ids, ids);
    e->adapters_s = bench_now() - t0;
}

void bench_engine_close(bench_engine_t *e) {
    ls_lora_pool_destroy(&e->pool);
    ls_kv_cache_destroy(&e->arena);
    ls_model_destroy(&e->m);
    ls_backend_destroy(&e->be);
    fx_rmdir(&e->dir);
}
