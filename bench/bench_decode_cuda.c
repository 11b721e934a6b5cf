/*  bench/bench_decode_cuda.c — decode throughput of the whole engine on the CUDA backend at
    Llama-3-8B shapes: the base model alone, 8 distinct adapters, 32 distinct adapters.

    Model: ls_model_load_dummy of the Llama-3-8B config (hidden 4096, 32 layers, 32 heads,
    8 KV heads, MLP 14336, vocab 128256, bf16; random weights, no files). KV cache in bf16
    (ls_model_kv_dtype). Batch: 64 sequences, each with CTX cached positions (the cache is
    zeroed at creation: attention reads the positions all the same), decode steps of one
    token per sequence, each step = ls_model_forward + ls_model_sample (greedy, on the GPU),
    which waits for the step, as the worker does. Adapters: rank 16 on all seven targets
    (PEFT files written once to a temporary directory: 8 random adapters, each loaded under
    4 ids for 32 distinct slots), sequence s on adapter s % n_adapters.

    Decode steps run as CUDA step graphs (backend_cuda.cu, the default), with each LoRA
    beside its base GEMM on the backend's side queue (the default); 8 and 32 adapters are
    also timed with the LoRA after each GEMM on one stream, and base, 8 and 32 with graphs
    off, for the differences.

    Printed: tokens/s and step time of each, the "decode ratio" (tokens/s over base), and
    for 32 adapters the bandwidth floor = base step + adapter bytes / copy bandwidth, with
    the adapter bytes as the slot pool stores them (the model's dtype, bf16).

    Adapter loads (lora_pool.h: pinned slot images, copies on the upload stream): the pinned
    host-to-device bandwidth (1 GiB cudaMemcpyAsync from cudaMallocHost memory, best of 5),
    one slot load alone (ls_lora_pool_assign + ls_lora_pool_wait, median of 8) as GB/s and as
    a fraction of that bandwidth, and the 8-adapter decode step with a load into a slot the
    step does not read started right before each step (PrefetchAdapter): step time against
    the step alone, and the time until both the step and the load are done. The copy bandwidth is measured in the same run (2 GiB D2D memcpy,
    read + write). Median step time of STEPS steps after WARM warm-up steps.

    --trace CSV writes every kernel's start, end and stream (CUPTI, kernel_trace.h), labelled
    with the workload, for timelines (read by tests/gpu/timeline.py).

    --batch N decodes N sequences a step (1..64, default 64); the adapters' slots are
    planned for 64 all the same (the slot-load rows use id 31's). --temperature T and
    --top-p P sample every row so (default greedy), each step a new seeded draw.

    --fp8 holds the projections as FP8 (ls_model_load_dummy with LS_QUANT_FP8: E4M3 weights,
    per-channel scales; docs/engine.md "FP8 weights"), the adapters bf16 on top: the same
    workloads and timelines on the FP8 model.
    --gemv-tokens N gives the GEMV (and the FP8 tensor-core GEMM) up to N tokens instead of
    the device's ls_cu_gemv_tokens() (0: cuBLAS and cuBLASLt always): the A/B of that rule.

    Usage: bench_decode_cuda [--steps N] [--ctx N] [--batch N] [--temperature T] [--top-p P]
                             [--fp8] [--gemv-tokens N] [--trace CSV]   Not a ctest; needs a GPU.
*/
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "backend_cuda.h"
#include "lora_pool.h"
#include "model.h"
#include "slot_plan.h"
#include "bench_engine.h"
#include "bench_util.h"
#include "kernel_trace.h"
#include "ops_cuda.h"

#define N_SEQS 64 // the most sequences a step holds (--batch)
#define RANK 16
#define BS 16
#define WARM 3
#define N_FILES 8

typedef struct {
    ls_model_t *m;
    ls_lora_pool_t *pool;
    bench_batch_t *batch; // (N_SEQS) the decode rows
    int n;                // --batch: sequences a step decodes (1..N_SEQS)
    float temperature;    // --temperature (0: greedy) and --top-p of every row's sampling
    float top_p;
    int steps, ctx, vocab;
    double first; // out: seconds of the last s_decode's first step (a new step shape)
    int trace;    // --trace: kernel timeline (kernel_trace.h)
} s_bench_t;

static double s_h2d_bw(void) {
    size_t n = (size_t)1 << 30;
    void *h, *d;
    if (cudaMallocHost(&h, n) != cudaSuccess || cudaMalloc(&d, n) != cudaSuccess)
        bench_die("bench_decode_cuda", "pinned bandwidth", "allocation failed");
    memset(h, 1, n);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = bench_now();
        cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, st);
        cudaStreamSynchronize(st);
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    cudaStreamDestroy(st);
    cudaFreeHost(h);
    cudaFree(d);
    return (double)n / best / 1e9;
}

// A load into slot up_slot before each step, alternating between the two ids of up_ids
// (each a full slot load: the adapter moves in); up_slot 0: none.
typedef struct {
    int slot;
    const char *ids[2];
    double done; // out: median seconds until both the step and the load are done
} s_upload_t;

// Median seconds per decode step with the sequences on the given slots. The steps sit in an
// NVTX range named `what`, so a profiler (tests/gpu/profile.sh) splits kernel time by workload.
static double s_decode(s_bench_t *b, const int32_t *slots, s_upload_t *up, const char *what) {
    nvtxRangePushA(what);
    if (b->trace)
        kt_mark(what);
    char err[512];
    int per_seq = (b->ctx + WARM + b->steps + BS) / BS;
    ls_kv_cache_t *kv = ls_kv_cache_new(b->m, b->n * per_seq, BS, err, sizeof err);
    if (!kv)
        bench_die("bench_decode_cuda", "KV cache", err);
    bench_batch_decode(b->batch, b->n, b->ctx, 0, per_seq, slots, b->vocab);
    int n = WARM + b->steps;
    double *t = malloc(sizeof(double) * (size_t)n), *t_done = malloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) {
        double t0 = bench_now();
        if (up && slot_plan_assign(b->pool, up->ids[i % 2], up->slot, err, sizeof err) != 0)
            bench_die("bench_decode_cuda", "load during a step", err);
        bench_step(b->m, kv, b->pool, b->batch);
        t[i] = bench_now() - t0;
        if (ls_lora_pool_wait(b->pool) != 0)
            bench_die("bench_decode_cuda", "load", "failed");
        t_done[i] = bench_now() - t0;
        for (int s = 0; s < b->n; s++)
            b->batch->seqs[s].start_pos++;
    }
    b->first = t[0];
    double med = bench_median(t + WARM, b->steps);
    if (up)
        up->done = bench_median(t_done + WARM, b->steps);
    free(t);
    free(t_done);
    ls_kv_cache_destroy(&kv);
    if (b->trace)
        kt_mark("");
    nvtxRangePop();
    return med;
}

int main(int argc, char **argv) {
    s_bench_t b = {.n = N_SEQS, .steps = 20, .ctx = 128, .top_p = 1.0f};
    ls_quant_t quant = LS_QUANT_NONE;
    int gemv_t = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fp8"))
            quant = LS_QUANT_FP8;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            b.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            b.ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            b.n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gemv-tokens") && i + 1 < argc)
            gemv_t = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc)
            b.temperature = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--top-p") && i + 1 < argc)
            b.top_p = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            if (kt_start(argv[++i]) != 0)
                bench_die("bench_decode_cuda", "--trace", "CUPTI tracing could not start");
            b.trace = 1;
        } else {
            fprintf(stderr, "usage: bench_decode_cuda [--steps N] [--ctx N] [--batch N] [--temperature T] [--top-p P] [--fp8] "
                            "[--gemv-tokens N] [--trace CSV]\n");
            return 2;
        }
    }
    if (b.steps < 1 || b.ctx < 1 || b.n < 1 || b.n > N_SEQS || b.temperature < 0 ||
        !(b.top_p > 0 && b.top_p <= 1) || gemv_t < -1 || gemv_t > LS_CU_GEMV_MAX_T) {
        fprintf(stderr, "bench_decode_cuda: steps and ctx must be >= 1, batch 1..%d, temperature >= 0, "
                "top-p in (0, 1], gemv-tokens 0..%d\n", N_SEQS, LS_CU_GEMV_MAX_T);
        return 2;
    }
    char err[512], ids[32][16];
    bench_engine_t e;
    bench_engine_open(&e, "bench_decode_cuda", quant, 32, RANK, N_FILES, 32, ids);
    ls_backend_t *be = e.be;
    if (gemv_t >= 0)
        ls_backend_cuda_set_gemv_tokens(be, gemv_t);
    b.m = e.m;
    b.pool = e.pool;
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    double bw = bench_copy_bw("bench_decode_cuda"), h2d = s_h2d_bw();
    b.vocab = ls_model_config(b.m)->vocab_size;
    b.batch = bench_batch_new(N_SEQS, "bench_decode_cuda");
    b.batch->sample.temperature = b.temperature;
    b.batch->sample.top_p = b.top_p;
    b.batch->sample.seed = 1;
    printf("bench_decode_cuda: %s; copy bandwidth %.0f GB/s; Llama-3-8B dummy (%.2f GB of %s "
           "weights, loaded in %.1f s), pinned host-to-device %.1f GB/s, KV %s, batch %d, %d cached tokens each, LoRA rank %d "
           "on all seven targets, sampling %s (temperature %.2f, top-p %.2f), median of %d steps; "
           "the GEMV up to %d tokens a step\n", prop.name, bw,
           (double)ls_model_weight_bytes(b.m) / 1e9, quant == LS_QUANT_FP8 ? "FP8 projections, bf16 other" : "bf16",
           e.load_s, h2d,
           ls_dtype_name(ls_model_kv_dtype(b.m)), b.n, b.ctx, RANK, b.temperature > 0 ? "seeded" : "greedy",
           b.temperature, b.top_p, b.steps, gemv_t >= 0 ? gemv_t : ls_cu_gemv_tokens());
    size_t adapter_elems = e.adapter_elems;
    // The slot pool stores adapters in the model's dtype (engine/lora_pool.h): the bytes a
    // decode step reads per adapter.
    size_t slot_elem = ls_dtype_size(ls_model_config(b.m)->torch_dtype);
    printf("adapters: %d distinct files, 32 ids, %.1f MB each in the slot pool (%s); set up in %.1f s\n", N_FILES,
           adapter_elems * (double)slot_elem / 1e6, ls_dtype_name(ls_model_config(b.m)->torch_dtype), e.adapters_s);
    fflush(stdout);

    int32_t base[N_SEQS], s8[N_SEQS], s32[N_SEQS];
    const char *seq_ids[N_SEQS];
    for (int s = 0; s < N_SEQS; s++) {
        base[s] = LS_LORA_SLOT_BASE;
        seq_ids[s] = ids[s % 8];
    }
    // one plan for both batches, so the 32-adapter one keeps ids 0..7 where the 8-adapter one put them
    slot_plan_t *plan = slot_plan_new(b.pool, LORA_EVICT_LRU);
    if (!plan || slot_plan_map(plan, seq_ids, N_SEQS, s8, err, sizeof err) != 0)
        bench_die("bench_decode_cuda", "slots for 8", plan ? err : "out of memory");
    double t_base = s_decode(&b, base, NULL, "base");
    double t8 = s_decode(&b, s8, NULL, "8 distinct");
    for (int s = 0; s < N_SEQS; s++)
        seq_ids[s] = ids[s % 32];
    if (slot_plan_map(plan, seq_ids, N_SEQS, s32, err, sizeof err) != 0)
        bench_die("bench_decode_cuda", "slots for 32", err);
    slot_plan_destroy(&plan);
    double t32 = s_decode(&b, s32, NULL, "32 distinct");
    double t_base2 = s_decode(&b, base, NULL, "base again"); // again, for the spread
    double first_g = b.first; // each s_decode has a new KV cache: a new graph
    long n_cap, n_rep;
    ls_backend_cuda_graph_counts(be, &n_cap, &n_rep);
    ls_backend_cuda_set_graphs(be, 0);
    // the decode LoRA after each GEMM on the one stream, instead of beside it
    ls_backend_cuda_set_side(be, 0, 0);
    double q8 = s_decode(&b, s8, NULL, "8 distinct, no side queue"),
           q32 = s_decode(&b, s32, NULL, "32 distinct, no side queue");
    ls_backend_cuda_set_side(be, 1, -1);
    double p_base = s_decode(&b, base, NULL, "base, no graphs"), first_p = b.first;
    double p8 = s_decode(&b, s8, NULL, "8 distinct, no graphs"),
           p32 = s_decode(&b, s32, NULL, "32 distinct, no graphs");
    ls_backend_cuda_set_graphs(be, 1);

    // slot loads: ids 30 and 31 take turns in id31's slot, which the 8-adapter step (ids
    // 0..7, their slots unchanged by the 32-adapter batch) does not read
    s_upload_t up = {ls_lora_pool_slot_of(b.pool, ids[31]), {ids[30], ids[31]}, 0};
    double slot_bytes = adapter_elems * (double)slot_elem, tl[8];
    for (int i = 0; i < 8; i++) {
        double t1 = bench_now();
        if (slot_plan_assign(b.pool, up.ids[i % 2], up.slot, err, sizeof err) != 0 ||
            ls_lora_pool_wait(b.pool) != 0)
            bench_die("bench_decode_cuda", "slot load", err);
        tl[i] = bench_now() - t1;
    }
    double t_load = bench_median(tl, 8), t8_up = s_decode(&b, s8, &up, "8 distinct, slot load");

    double floor32 = t_base + 32.0 * adapter_elems * (double)slot_elem / (bw * 1e9);
    printf("\n%-34s %9s %10s %8s\n", "workload", "step ms", "tokens/s", "ratio");
    printf("%-34s %9.3f %10.0f %8.3f\n", "base model", 1e3 * t_base, b.n / t_base, 1.0);
    printf("%-34s %9.3f %10.0f %8.3f\n", "base model (again)", 1e3 * t_base2,
           b.n / t_base2, t_base / t_base2);
    printf("%-34s %9.3f %10.0f %8.3f\n", "8 distinct adapters", 1e3 * t8, b.n / t8,
           t_base / t8);
    printf("%-34s %9.3f %10.0f %8.3f\n", "32 distinct adapters", 1e3 * t32, b.n / t32,
           t_base / t32);
    printf("%-34s %9.3f %10.0f %8.3f\n", "8 distinct, LoRA after each GEMM", 1e3 * q8,
           b.n / q8, t_base / q8);
    printf("%-34s %9.3f %10.0f %8.3f\n", "32 distinct, LoRA after each GEMM", 1e3 * q32,
           b.n / q32, t_base / q32);
    printf("%-34s %9.3f %10.0f %8.3f\n", "base model, no graphs", 1e3 * p_base,
           b.n / p_base, 1.0);
    printf("%-34s %9.3f %10.0f %8.3f\n", "8 distinct adapters, no graphs", 1e3 * p8,
           b.n / p8, p_base / p8);
    printf("%-34s %9.3f %10.0f %8.3f\n", "32 distinct adapters, no graphs", 1e3 * p32,
           b.n / p32, p_base / p32);
    printf("step graphs: %ld captured, %ld replays (base, 8, 32, base); graphs speed up the "
           "step %.2fx (base), %.2fx (8), %.2fx (32)\n", n_cap, n_rep, p_base / t_base,
           p8 / t8, p32 / t32);
    printf("first step of a new shape (base, fresh KV cache): %.3f ms with graphs (probe, "
           "capture, instantiate, run), %.3f ms without\n", 1e3 * first_g, 1e3 * first_p);
    printf("\ndecode ratio, 8 distinct adapters: %.3f (target >= 0.92)\n", t_base / t8);
    printf("decode ratio, 32 distinct adapters: %.3f; bandwidth floor %.3f ms (base %.3f ms + "
           "%.2f GB of adapter slots / %.0f GB/s): step is %.3fx the floor (target <= 1.10)\n", t_base / t32,
           1e3 * floor32, 1e3 * t_base, 32.0 * adapter_elems * (double)slot_elem / 1e9, bw, t32 / floor32);
    printf("\nadapter slot load (rank %d, seven targets, %s): %.1f MB in %.3f ms = %.1f GB/s, "
           "%.0f%% of pinned host-to-device %.1f GB/s (target >= 80%%)\n", RANK,
           ls_dtype_name(ls_model_config(b.m)->torch_dtype), slot_bytes / 1e6, 1e3 * t_load,
           slot_bytes / t_load / 1e9, 100.0 * slot_bytes / t_load / 1e9 / h2d, h2d);
    printf("load overlapping a decode step (8 distinct adapters, load into a slot the step "
           "does not read): step %.3f ms alone, %.3f ms with the load (%+.1f%%); step and load "
           "done after %.3f ms (serial would be %.3f ms)\n", 1e3 * t8, 1e3 * t8_up,
           100.0 * (t8_up / t8 - 1), 1e3 * up.done, 1e3 * (t8 + t_load));
    if (b.trace)
        kt_stop();
    bench_batch_destroy(&b.batch);
    bench_engine_close(&e);
    return 0;
}
