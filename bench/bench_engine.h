/*  bench/bench_engine.h — what the benchmarks of the engine on the CUDA backend share: the
    card's measured limits (copy bandwidth, bf16 tensor-core rate), the engine set up at
    Llama-3-8B shapes with random adapters, and a batch of sequences stepped through
    ls_model_forward + ls_model_sample as the worker steps them.

    Every function names the calling program in its errors and exits 1 on a failure
    (bench_die): a benchmark that cannot set up has nothing to report.
*/
#ifndef LS_BENCH_ENGINE_H
#define LS_BENCH_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "lora_pool.h"
#include "model.h"

// Copy bandwidth of the current device in GB/s: bytes read + written by a 2 GiB
// device-to-device copy over its time, best of 8.
double bench_copy_bw(const char *prog);

// bf16 tensor-core rate of the current device in TFLOP/s: 2·n³ flops of a cuBLAS GEMM
// (bf16 inputs and output, fp32 accumulation, random values: zeros draw less power and clock
// higher) over its time, best of 6 rounds of 5 back to back after 2 warm-up rounds.
double bench_gemm_tflops(const char *prog, int n);

// A batch of sequences for one ls_model_forward, and the sampling of its logit rows (greedy,
// or as `sample` says: every row alike). Decode rows are made by bench_batch_decode; a caller
// adds other rows (prompt chunks) by filling seqs[n] and counting them in n.
typedef struct {
    int n, cap;                   // sequences in the batch; room for
    ls_model_seq_t *seqs;         // (cap)
    int32_t *tok;                 // (cap) a decode row's token, the last step's sample
    int32_t **tables;             // (cap) block tables of the decode rows
    ls_sampling_params_t *params; // (cap) each step's, from sample
    ls_sampling_params_t sample;  // every row's sampling (bench_batch_new: greedy)
    const char *prog;             // for errors
} bench_batch_t;

// Room for cap sequences. NULL never: exits when out of memory.
bench_batch_t *bench_batch_new(int cap, const char *prog);
void bench_batch_destroy(bench_batch_t **self_p);

// Makes the batch n decode rows (n <= cap): row s has ctx cached positions, one token, and the
// n_blocks blocks first_block + s·n_blocks .. + n_blocks - 1 of the cache, on slots[s]
// (slots NULL: every row on the base model); tokens spread over the vocabulary.
void bench_batch_decode(bench_batch_t *b, int n, int ctx, int first_block, int n_blocks,
                        const int32_t *slots, int vocab);

// One step of the batch as the worker runs it: ls_model_forward, then greedy
// ls_model_sample of its logit rows (which waits for the step) into the decode rows' tokens,
// each checked to be in the vocabulary. Returns the seconds forward and sample took.
double bench_step(ls_model_t *m, ls_kv_cache_t *kv, ls_lora_pool_t *pool, bench_batch_t *b);

// The engine as the benchmarks run it: the CUDA backend on device 0, the dummy Llama-3-8B
// (llama3_8b.h) on it, an adapter pool whose pages (the KV cache's, of 16-token blocks) are
// its own, apart from the benchmark's KV cache (slot_plan.h), and random PEFT adapters in the
// pool's CPU tier.
typedef struct {
    ls_backend_t *be;
    ls_model_t *m;
    ls_kv_cache_t *arena;      // the pool's pages
    ls_lora_pool_t *pool;
    char *dir;                 // the adapters' files, a temporary directory
    size_t adapter_elems;      // elements of one adapter
    double load_s, adapters_s; // seconds to load the model; to write and add the adapters
} bench_engine_t;

// Opens e: the dummy Llama-3-8B with its projections as quant says (LS_QUANT_NONE: bf16;
// LS_QUANT_FP8), a pool of `slots` slots of rank `rank`, and n_files random adapters of that
// rank on all seven targets (bf16, seeds 1..) written to e->dir and added as n_ids ids,
// ids[a] = "id<a>" from file a % n_files.
void bench_engine_open(bench_engine_t *e, const char *prog, ls_quant_t quant, int slots,
                       int rank, int n_files, int n_ids, char (*ids)[16]);
// Frees what bench_engine_open made and removes its directory.
void bench_engine_close(bench_engine_t *e);

#endif
