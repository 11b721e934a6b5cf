/*  bench/bench_base_cuda.c — the base path against the hardware's limit, on the CUDA backend
    at Llama-3-8B shapes: decode at every batch size and cached context, prefill alone and
    chunked beside decodes, and decode with 8 distinct adapters; each point against its floor.

    Model: ls_model_load_dummy of the Llama-3-8B config (llama3_8b.h: hidden 4096, 32 layers,
    32 heads, 8 KV heads, MLP 14336, vocab 128256, bf16, random weights), bf16 KV cache in
    16-token blocks (zeroed at creation: attention reads the positions all the same). A step is
    ls_model_forward + greedy ls_model_sample on the GPU, which waits for the step, as the worker
    runs it (bench_step); its time is the host's clock around both.

    Points:
    - decode: batch B x cached context C, one token per sequence a step, median of STEPS steps
      after WARM, started so that the median step has C cached positions; a point whose KV cache does not fit the free GPU memory is skipped, saying so.
    - decode with adapters: the same KV cache right after the base point, sequence s on adapter
      s % 8 (rank 16 on all seven targets, bf16 slots: min(B, 8) distinct adapters);
      "decode ratio" = base step / this step.
    - prefill: a prompt of P tokens as one step (positions 0..P-1, the last token's logits
      sampled), median of PREFILL_RUNS after one warm-up.
    - chunked: the prompt in chunks of LS_DEFAULT_CHUNKED_PREFILL_SIZE (the scheduler's
      default), each step carrying CHUNK_DECODES decodes at about CHUNK_CTX cached tokens first
      and the chunk after them, as the scheduler plans a step (decodes, then prompt chunks);
      timed against the same chunks alone and the decodes alone. Medians of CHUNK_REPS runs of
      the whole prompt after one warm-up.

    Floors: the bytes a step must move — the weights once (all but the embedding table, of
    which only the step's rows), the KV cache read (every sequence's cached positions), the KV
    written (its new positions), the logit rows (fp32, written and read by the sampler);
    activations are left out — over the copy bandwidth; or its flops — 2 per weight and token
    through the linear layers (lm_head for logit rows only) and 4 x heads x head_dim per
    (query, key) pair and layer in attention (QK^T and PV, causal) — over the bf16 tensor-core
    rate, whichever is higher ("bound"). Both rates are measured at the start of the run
    (bench_copy_bw, bench_gemm_tflops). With adapters the floor adds the slot bytes of the
    batch's distinct adapters. A chunked point's floor is the sum of its steps' floors.

    Output: a progress line per point, then a table per section; --output-file F gets one
    JSON object a line as each point ends (keys: impl, card, section, batch, ctx, prompt, adapters,
    step_ms, tok_s, bytes, flops, floor_ms, bound, x_floor, bw_gbs, tflops; decode_ratio with
    adapters; steps, decode_ms, chunk_ms, apart for chunked; skipped instead of the times), which
    bench/peer_torch.py --join reads beside the PyTorch peer's.

    FP8 (--fp8): only the decode step of the bf16 model against the same model with FP8
    projections (ls_model_load_dummy with LS_QUANT_FP8: E4M3 weights with per-channel scales,
    activations quantized per token; embeddings, lm_head and the KV cache stay bf16), side by
    side in one run: batch 1, 8, 32, 64 at FP8_CTX_SHORT and FP8_CTX cached positions, base and
    with 8 adapters (bf16 LoRA on top of either), the fp8/bf16 step ratio of each (target:
    <= 0.6 at these batches) beside the ratio of the two steps' floors, and which FP8 GEMM each
    batch took (engine/fp8_gemm.h).

    Usage: bench_base_cuda [--quick] [--fp8] [--steps N] [--max-seconds S] [--output-file F]
                           [--decode-ctx C] [--decode-batch B] [--prefill P] [--side-sms N]
                           [--trace CSV] [--settle S] [--no-block]
    --quick: batch 1, 64, 256 x context 128, 4K, prompts of 2K, 10 steps. --decode-ctx C: only
    the decode points at context C, every batch. --decode-batch B: only the decode points of
    batch B (1..MAX_BATCH), every context or C's. --prefill P: only the prompt of P tokens alone.
    --trace CSV: every kernel's start, end and stream (CUPTI, kernel_trace.h), labelled by point
    ("prefill 8192", "decode 64x128", "decode 64x128 adapters"), for a step's breakdown by
    kernel. --side-sms N: every GEMM leaves N SMs to the LoRA beside it (ls_backend_cuda_set_side; -1, the default: the backend's rule by the step's
    tokens; -2: no side stream, each LoRA after its GEMM) — the sweep behind that rule.
    --settle S: the GPU idles S seconds before each point (default 0). A point's first steps
    right after a large point's KV cache is freed run slower than the same point alone (H200:
    batch 1 x 4K 4.917 ms after batch 256 x 1K's 34 GB, 4.436 with --settle 3, 4.465 alone; its
    adapter steps, right after, 4.591), at the same clocks and temperatures;
    docs/benchmarks.md ("The base path"). --no-block: batch-1 steps run the ops one by one
    instead of the decode block as one kernel (ls_backend_cuda_set_block), for the comparison.
    Points left when --max-seconds (default 300) have passed are skipped, saying so. Not a
    ctest; needs a GPU.
*/
#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "backend_cuda.h"
#include "bench_engine.h"
#include "bench_util.h"
#include "kernel_trace.h"
#include "llama3_8b.h"
#include "ops_cuda.h"
#include "lora_pool.h"
#include "ls_limits.h"
#include "model.h"
#include "slot_plan.h"

#define PROG "bench_base_cuda"
#define BS 16
#define WARM 3
#define RANK 16
#define N_ADAPTERS 8
#define PREFILL_RUNS 5
#define CHUNK_DECODES 64
#define CHUNK_CTX 1024
#define CHUNK_REPS 3
#define GEMM_N 8192
#define MAX_BATCH 256
#define MAX_POINTS 128
#define FP8_CTX 1024
#define FP8_CTX_SHORT 128
// GPU memory a point leaves free beside its KV cache: the step's workspace (an 8K-token
// prefill's activations take ~2.5 GB, grown by doubling) and the allocator's slack
#define MARGIN_BYTES ((size_t)6 << 30)

// 2, 4 and 8: the backend's GEMV forms (ops_cuda.h ls_cu_gemv_tokens: the GEMV takes up to
// 16 tokens, 8 on an H200, two of them on the CUDA cores and more on the tensor cores; cuBLAS
// past)
static const int s_batches[] = {1, 2, 4, 8, 32, 64, 128, 256}, s_quick_batches[] = {1, 64, 256};
enum { N_BATCHES = sizeof s_batches / sizeof s_batches[0] };
static const int s_ctxs[] = {128, 1024, 4096, 16384}, s_quick_ctxs[] = {128, 4096};
static const int s_prompts[] = {512, 2048, 8192}, s_quick_prompts[] = {2048};

// What a step's floor is made of, per unit of work.
typedef struct {
    double bw, tflops;     // measured: copy GB/s, bf16 tensor-core TFLOP/s
    double weight_bytes;   // read once a step: every weight but the embedding table
    double proj_weights;   // how many of them are the layers' linear maps (FP8 under --fp8)
    double emb_row;        // bytes of one embedding row (a token's input)
    double kv_pos;         // bytes of one position's K and V over all layers, as stored
    double logit_row;      // bytes of one logit row: fp32, written, then read by the sampler
    double lin_flops;      // flops of one token through every layer's linear maps
    double head_flops;     // flops of one logit row (lm_head)
    double attn_flops;     // flops of one (query, key) pair over all layers
    double adapter_bytes;  // one adapter as its slot stores it
} s_cost_t;

typedef struct {
    double bytes, flops;
} s_work_t;

typedef struct {
    const char *section;  // "decode", "prefill", "chunked"
    int batch, ctx, prompt, adapters;
    char skipped[160];    // why the point was not run; "" when it was
    double step_s, tok_s, floor_s, x_floor;
    s_work_t w;           // per step (chunked: the mean of its steps)
    const char *bound;    // "bytes" or "flops" (chunked: of the step whose floor is largest)
    double decode_ratio;  // decode with adapters: base step / this step
    int steps;            // chunked: steps of the prompt
    double decode_s, chunk_s, apart; // chunked: decodes alone, a chunk alone (mean), mixed / (both apart)
} s_point_t;

typedef struct {
    ls_model_t *m;
    ls_lora_pool_t *pool;
    bench_batch_t *batch;    // (MAX_BATCH + 1) the step's rows
    int32_t slots[MAX_BATCH]; // sequence s's slot, on adapter s % N_ADAPTERS
    s_cost_t c;
    int steps, vocab;
    size_t block_bytes;      // one KV block
    double t_start, max_s, settle_s;
    s_point_t pts[MAX_POINTS];
    int n_pts;
    FILE *json;              // --output-file, a line written as each point ends
    const char *card;
} s_bench_t;

// Under --trace, the kernels launched from now on carry the label "SECTION B x C [adapters]"
// or "prefill P" / "chunked P" ("" after a point); without --trace kt_mark does nothing.
static void s_mark(const s_point_t *p) {
    char label[96] = "";
    if (p && p->prompt)
        snprintf(label, sizeof label, "%s %d", p->section, p->prompt);
    else if (p)
        snprintf(label, sizeof label, "%s %dx%d%s", p->section, p->batch, p->ctx,
                 p->adapters ? " adapters" : "");
    kt_mark(label);
}

static void s_work_seq(s_work_t *w, const s_cost_t *c, int start, int n, bool logits) {
    w->bytes += c->kv_pos * (start + n) + c->emb_row * n + (logits ? c->logit_row : 0);
    // token i of the n attends start + i + 1 keys
    w->flops += c->lin_flops * n + (logits ? c->head_flops : 0) +
                c->attn_flops * ((double)n * start + (double)n * (n + 1) / 2);
}

// The floor of one step of work w, and which bound it is.
static double s_floor(const s_cost_t *c, s_work_t w, const char **bound) {
    double tb = w.bytes / (c->bw * 1e9), tf = w.flops / (c->tflops * 1e12);
    *bound = tf > tb ? "flops" : "bytes";
    return tf > tb ? tf : tb;
}

static s_point_t *s_point(s_bench_t *b, const char *section, int batch, int ctx, int prompt) {
    if (b->n_pts == MAX_POINTS)
        bench_die(PROG, "points", "more than MAX_POINTS");
    s_point_t *p = &b->pts[b->n_pts++];
    *p = (s_point_t){.section = section, .batch = batch, .ctx = ctx, .prompt = prompt};
    return p;
}

// The point's JSON line, when --output-file was given; flushed, so a run cut short keeps
// the points it finished.
static void s_emit(const s_bench_t *b, const s_point_t *p) {
    FILE *f = b->json;
    if (!f)
        return;
    fprintf(f, "{\"impl\": \"loraserve\", \"card\": \"%s\", \"section\": \"%s\", \"batch\": %d, "
            "\"ctx\": %d, \"prompt\": %d, \"adapters\": %d", b->card, p->section, p->batch, p->ctx,
            p->prompt, p->adapters);
    if (p->skipped[0])
        fprintf(f, ", \"skipped\": \"%s\"", p->skipped);
    else
        fprintf(f, ", \"step_ms\": %.4f, \"tok_s\": %.1f, \"bytes\": %.0f, \"flops\": %.0f, "
                "\"floor_ms\": %.4f, \"bound\": \"%s\", \"x_floor\": %.4f, \"bw_gbs\": %.1f, "
                "\"tflops\": %.1f", 1e3 * p->step_s, p->tok_s, p->w.bytes, p->w.flops,
                1e3 * p->floor_s, p->bound, p->x_floor, b->c.bw, b->c.tflops);
    if (!p->skipped[0] && p->adapters)
        fprintf(f, ", \"decode_ratio\": %.4f", p->decode_ratio);
    if (!p->skipped[0] && p->steps)
        fprintf(f, ", \"steps\": %d, \"decode_ms\": %.4f, \"chunk_ms\": %.4f, \"apart\": %.4f",
                p->steps, 1e3 * p->decode_s, 1e3 * p->chunk_s, p->apart);
    fprintf(f, "}\n");
    if (fflush(f) != 0)
        bench_die(PROG, "--output-file", "write failed");
}

// Whether a point may start: not past --max-seconds, and its KV cache (`blocks` blocks) fits
// the free memory with MARGIN_BYTES beside it; when it may, after --settle's pause.
// Otherwise p says why.
static bool s_may_run(s_bench_t *b, s_point_t *p, size_t blocks) {
    size_t free_b = 0, total_b = 0, need = blocks * b->block_bytes;
    if (bench_now() - b->t_start > b->max_s)
        snprintf(p->skipped, sizeof p->skipped, "past --max-seconds %.0f", b->max_s);
    else if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        bench_die(PROG, "cudaMemGetInfo", "failed");
    else if (need + MARGIN_BYTES > free_b)
        snprintf(p->skipped, sizeof p->skipped, "KV cache %.1f GB + %.0f GB margin > %.1f GB free",
                 need / 1e9, MARGIN_BYTES / 1e9, free_b / 1e9);
    if (!p->skipped[0] && b->settle_s > 0) { // --settle: the GPU idle before the point
        if (cudaDeviceSynchronize() != cudaSuccess)
            bench_die(PROG, "--settle", "cudaDeviceSynchronize failed");
        struct timespec ts = {(time_t)b->settle_s,
                              (long)((b->settle_s - (double)(time_t)b->settle_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (p->skipped[0]) {
        printf("[%6.1f s] %s batch %d ctx %d prompt %d: skipped (%s)\n", bench_now() - b->t_start,
               p->section, p->batch, p->ctx, p->prompt, p->skipped);
        fflush(stdout);
        s_emit(b, p);
    }
    return !p->skipped[0];
}

static ls_kv_cache_t *s_kv_new(s_bench_t *b, int blocks) {
    char err[512];
    ls_kv_cache_t *kv = ls_kv_cache_new(b->m, blocks, BS, err, sizeof err);
    if (!kv)
        bench_die(PROG, "KV cache", err);
    return kv;
}

// Median seconds of a decode step of `batch` sequences (each on per_seq blocks) on slots
// (NULL: the base model). Each step caches one more position, so the steps start where the
// median timed step has ctx cached positions (ctx >= WARM + steps / 2).
static double s_decode_run(s_bench_t *b, ls_kv_cache_t *kv, int batch, int ctx, int per_seq,
                           const int32_t *slots) {
    bench_batch_decode(b->batch, batch, ctx - WARM - b->steps / 2, 0, per_seq, slots, b->vocab);
    double t[WARM + 64];
    for (int i = 0; i < WARM + b->steps; i++) {
        t[i] = bench_step(b->m, kv, b->pool, b->batch);
        for (int s = 0; s < batch; s++)
            b->batch->seqs[s].start_pos++;
    }
    return bench_median(t + WARM, b->steps);
}

static void s_finish(s_bench_t *b, s_point_t *p, double step_s, double tokens) {
    p->step_s = step_s;
    p->tok_s = tokens / step_s;
    p->floor_s = s_floor(&b->c, p->w, &p->bound);
    p->x_floor = step_s / p->floor_s;
}

static void s_decode_point(s_bench_t *b, int batch, int ctx) {
    s_point_t *p = s_point(b, "decode", batch, ctx, 0);
    int per_seq = (ctx + b->steps + BS) / BS;
    if (!s_may_run(b, p, (size_t)batch * per_seq)) {
        s_point_t *q = s_point(b, "decode", batch, ctx, 0);
        *q = *p;
        q->adapters = batch < N_ADAPTERS ? batch : N_ADAPTERS;
        s_emit(b, q);
        return;
    }
    ls_kv_cache_t *kv = s_kv_new(b, batch * per_seq);
    p->w.bytes = b->c.weight_bytes;
    for (int s = 0; s < batch; s++)
        s_work_seq(&p->w, &b->c, ctx, 1, true);
    s_mark(p);
    s_finish(b, p, s_decode_run(b, kv, batch, ctx, per_seq, NULL), batch);

    s_point_t *q = s_point(b, "decode", batch, ctx, 0);
    q->adapters = batch < N_ADAPTERS ? batch : N_ADAPTERS;
    q->w = p->w;
    q->w.bytes += q->adapters * b->c.adapter_bytes;
    s_mark(q);
    s_finish(b, q, s_decode_run(b, kv, batch, ctx, per_seq, b->slots), batch);
    s_mark(NULL);
    q->decode_ratio = p->step_s / q->step_s;
    ls_kv_cache_destroy(&kv);
    s_emit(b, p);
    s_emit(b, q);
    printf("[%6.1f s] decode batch %d ctx %d: base %.3f ms (%.2fx floor), %d adapters %.3f ms "
           "(decode ratio %.3f)\n", bench_now() - b->t_start, batch, ctx, 1e3 * p->step_s,
           p->x_floor, q->adapters, 1e3 * q->step_s, q->decode_ratio);
    fflush(stdout);
}

// Prompt tokens spread over the vocabulary.
static int32_t *s_prompt_tokens(int n, int vocab) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    if (!t)
        bench_die(PROG, "prompt", "out of memory");
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)((unsigned)(i + 7) * 2246822519u % (unsigned)vocab);
    return t;
}

// The prompt's row of a step: its n tokens from start, on its block table (n_blocks, covering
// the whole prompt); the last chunk wants its logits.
static ls_model_seq_t s_prompt_row(const int32_t *tok, int start, int n, int prompt,
                                   const int32_t *table, int n_blocks) {
    return (ls_model_seq_t){tok + start, n, start, table, n_blocks, LS_LORA_SLOT_BASE,
                            start + n == prompt, NULL, 0};
}

static void s_prefill_point(s_bench_t *b, int prompt) {
    s_point_t *p = s_point(b, "prefill", 1, 0, prompt);
    int blocks = (prompt + BS - 1) / BS;
    if (!s_may_run(b, p, (size_t)blocks))
        return;
    ls_kv_cache_t *kv = s_kv_new(b, blocks);
    int32_t *tok = s_prompt_tokens(prompt, b->vocab), *table = malloc((size_t)blocks * sizeof *table);
    for (int i = 0; i < blocks; i++)
        table[i] = i;
    b->batch->seqs[0] = s_prompt_row(tok, 0, prompt, prompt, table, blocks);
    b->batch->n = 1;
    double t[1 + PREFILL_RUNS];
    s_mark(p);
    for (int i = 0; i < 1 + PREFILL_RUNS; i++)
        t[i] = bench_step(b->m, kv, b->pool, b->batch);
    s_mark(NULL);
    p->w.bytes = b->c.weight_bytes;
    s_work_seq(&p->w, &b->c, 0, prompt, true);
    s_finish(b, p, bench_median(t + 1, PREFILL_RUNS), prompt);
    printf("[%6.1f s] prefill %d tokens: %.3f ms, %.0f tokens/s, %.1f%% of the tensor-core rate "
           "(%.2fx floor)\n", bench_now() - b->t_start, prompt, 1e3 * p->step_s, p->tok_s,
           100.0 * p->w.flops / p->step_s / (b->c.tflops * 1e12), p->x_floor);
    fflush(stdout);
    s_emit(b, p);
    free(tok);
    free(table);
    ls_kv_cache_destroy(&kv);
}

// Seconds of the whole prompt in chunks, with n_dec decode rows (0: the chunks alone) before
// each chunk; the decodes restart from CHUNK_CTX cached positions.
static double s_chunked_run(s_bench_t *b, ls_kv_cache_t *kv, int n_dec, int per_seq,
                            const int32_t *tok, int prompt, const int32_t *table, int blocks) {
    int chunk = LS_DEFAULT_CHUNKED_PREFILL_SIZE;
    bench_batch_decode(b->batch, n_dec, CHUNK_CTX, 0, per_seq, NULL, b->vocab);
    double total = 0;
    for (int start = 0; start < prompt; start += chunk) {
        int n = prompt - start < chunk ? prompt - start : chunk;
        b->batch->seqs[n_dec] = s_prompt_row(tok, start, n, prompt, table, blocks);
        b->batch->n = n_dec + 1;
        total += bench_step(b->m, kv, b->pool, b->batch);
        for (int s = 0; s < n_dec; s++)
            b->batch->seqs[s].start_pos++;
    }
    return total;
}

// Median over CHUNK_REPS of s_chunked_run, after one warm-up.
static double s_chunked_median(s_bench_t *b, ls_kv_cache_t *kv, int n_dec, int per_seq,
                               const int32_t *tok, int prompt, const int32_t *table, int blocks) {
    double t[1 + CHUNK_REPS];
    for (int i = 0; i < 1 + CHUNK_REPS; i++)
        t[i] = s_chunked_run(b, kv, n_dec, per_seq, tok, prompt, table, blocks);
    return bench_median(t + 1, CHUNK_REPS);
}

static void s_chunked_point(s_bench_t *b, int prompt) {
    s_point_t *p = s_point(b, "chunked", CHUNK_DECODES, CHUNK_CTX, prompt);
    int chunk = LS_DEFAULT_CHUNKED_PREFILL_SIZE, n_chunks = (prompt + chunk - 1) / chunk;
    int per_seq = (CHUNK_CTX + WARM + b->steps + n_chunks + BS) / BS;
    int blocks = (prompt + BS - 1) / BS, first = CHUNK_DECODES * per_seq;
    if (!s_may_run(b, p, (size_t)first + blocks))
        return;
    ls_kv_cache_t *kv = s_kv_new(b, first + blocks);
    int32_t *tok = s_prompt_tokens(prompt, b->vocab), *table = malloc((size_t)blocks * sizeof *table);
    for (int i = 0; i < blocks; i++)
        table[i] = first + i;
    s_mark(p);
    p->decode_s = s_decode_run(b, kv, CHUNK_DECODES, CHUNK_CTX, per_seq, NULL);
    double apart = s_chunked_median(b, kv, 0, per_seq, tok, prompt, table, blocks);
    double mixed = s_chunked_median(b, kv, CHUNK_DECODES, per_seq, tok, prompt, table, blocks);
    s_mark(NULL);
    // the floor of each mixed step, summed; its work averaged over the steps
    double floor_sum = 0, floor_max = 0;
    for (int k = 0; k < n_chunks; k++) {
        s_work_t w = {b->c.weight_bytes, 0};
        for (int s = 0; s < CHUNK_DECODES; s++)
            s_work_seq(&w, &b->c, CHUNK_CTX + k, 1, true);
        int n = prompt - k * chunk < chunk ? prompt - k * chunk : chunk;
        s_work_seq(&w, &b->c, k * chunk, n, k == n_chunks - 1);
        const char *bound;
        double f = s_floor(&b->c, w, &bound);
        floor_sum += f;
        if (f > floor_max) {
            floor_max = f;
            p->bound = bound;
        }
        p->w.bytes += w.bytes / n_chunks;
        p->w.flops += w.flops / n_chunks;
    }
    p->steps = n_chunks;
    p->step_s = mixed / n_chunks;
    p->tok_s = (prompt + (double)CHUNK_DECODES * n_chunks) / mixed;
    p->floor_s = floor_sum / n_chunks;
    p->x_floor = mixed / floor_sum;
    p->chunk_s = apart / n_chunks;
    p->apart = mixed / (apart + n_chunks * p->decode_s);
    printf("[%6.1f s] chunked %d tokens beside %d decodes: %d steps of %.3f ms (decodes alone "
           "%.3f ms, a chunk alone %.3f ms), %.2fx floor\n", bench_now() - b->t_start, prompt,
           CHUNK_DECODES, n_chunks, 1e3 * p->step_s, 1e3 * p->decode_s, 1e3 * p->chunk_s, p->x_floor);
    fflush(stdout);
    s_emit(b, p);
    free(tok);
    free(table);
    ls_kv_cache_destroy(&kv);
}

static void s_cost_init(s_bench_t *b, double bw, double tflops) {
    const ls_model_config_t *cfg = ls_model_config(b->m);
    double H = cfg->hidden_size, I = cfg->intermediate_size, L = cfg->num_hidden_layers;
    double q = (double)cfg->num_attention_heads * cfg->head_dim;
    double kv = (double)cfg->num_key_value_heads * cfg->head_dim, V = cfg->vocab_size;
    double es = (double)ls_dtype_size(cfg->torch_dtype);
    double lin = H * (q + 2 * kv) + q * H + H * 2 * I + I * H; // one layer's linear weights
    s_cost_t *c = &b->c;
    c->bw = bw;
    c->tflops = tflops;
    // layers (linears and two norms), the final norm and lm_head (the embedding table itself
    // when tied: the same bytes)
    c->weight_bytes = es * (L * (lin + 2 * H) + H + V * H);
    c->proj_weights = L * lin;
    c->emb_row = es * H;
    c->kv_pos = (double)b->block_bytes / BS;
    c->logit_row = 2.0 * sizeof(float) * V;
    c->lin_flops = 2 * L * lin;
    c->head_flops = 2 * V * H;
    c->attn_flops = 4 * L * q;
}

static void s_print_tables(const s_bench_t *b) {
    const char *sections[] = {"decode", "decode", "prefill", "chunked"};
    for (int t = 0; t < 4; t++) {
        bool ad = t == 1, ch = t == 3;
        printf("\n== %s", sections[t]);
        if (ad)
            printf(", %d distinct adapters (rank %d, seven targets)", N_ADAPTERS, RANK);
        if (ch)
            printf(", %d-token chunks beside %d decodes at %d cached tokens",
                   LS_DEFAULT_CHUNKED_PREFILL_SIZE, CHUNK_DECODES, CHUNK_CTX);
        printf("\n");
        printf("%-6s %-6s %-6s %-4s %9s %10s %8s %9s %9s %-5s %7s", "batch", "ctx", "prompt", "ad",
               "step ms", "tokens/s", "GB", "TFLOP", "floor ms", "bound", "x floor");
        if (ad)
            printf(" %7s", "ratio");
        if (ch)
            printf(" %6s %9s %9s %6s", "steps", "dec ms", "chunk ms", "apart");
        printf("\n");
        for (int i = 0; i < b->n_pts; i++) {
            const s_point_t *p = &b->pts[i];
            if (strcmp(p->section, sections[t]) || (t <= 1 && (p->adapters > 0) != ad))
                continue;
            printf("%-6d %-6d %-6d %-4d ", p->batch, p->ctx, p->prompt, p->adapters);
            if (p->skipped[0]) {
                printf("skipped: %s\n", p->skipped);
                continue;
            }
            printf("%9.3f %10.0f %8.2f %9.3f %9.3f %-5s %7.3f", 1e3 * p->step_s, p->tok_s,
                   p->w.bytes / 1e9, p->w.flops / 1e12, 1e3 * p->floor_s, p->bound, p->x_floor);
            if (ad)
                printf(" %7.3f", p->decode_ratio);
            if (ch)
                printf(" %6d %9.3f %9.3f %6.3f", p->steps, 1e3 * p->decode_s, 1e3 * p->chunk_s,
                       p->apart);
            printf("\n");
        }
    }
    printf("\nGB and TFLOP per step (chunked: the mean step); floor = max(GB / copy bandwidth, "
           "TFLOP / tensor-core rate); x floor = step / floor; ratio = base step / adapter step; "
           "apart = chunked steps / (chunks alone + decodes alone)\n");
}

// The floor of a decode step of `batch` sequences at ctx cached positions whose weights
// are weight_bytes
static double s_decode_floor(const s_bench_t *b, double weight_bytes, int batch, int ctx) {
    s_work_t w = {weight_bytes, 0};
    const char *bound;
    for (int s = 0; s < batch; s++)
        s_work_seq(&w, &b->c, ctx, 1, true);
    return s_floor(&b->c, w, &bound);
}

// --fp8: decode steps of the bf16 model (b->m) and of the FP8 one side by side, at a short
// context (the weights are most of a step) and a longer one (the bf16 KV cache, the same in
// both, weighs in), with the ratio of the two floors beside the measured one.
static void s_fp8_compare(s_bench_t *b, ls_backend_t *be) {
    static const int batches[] = {1, 8, 32, 64}, ctxs[] = {FP8_CTX_SHORT, FP8_CTX};
    char err[512];
    double t0 = bench_now();
    ls_model_t *bf16 = b->m, *fp8 = ls_model_load_dummy(LS_BENCH_LLAMA3_8B, be, NULL, LS_QUANT_FP8, 1,
                                                        NULL, NULL, err, sizeof err);
    if (!fp8)
        bench_die(PROG, "FP8 model", err);
    // the FP8 model reads its projections as one byte a weight instead of the dtype's (the
    // scales, a float a row, are left out as activations are)
    double es = (double)ls_dtype_size(ls_model_config(bf16)->torch_dtype);
    double fp8_bytes = b->c.weight_bytes - (es - 1.0) * b->c.proj_weights;
    printf("[%6.1f s] FP8 Llama-3-8B dummy loaded in %.1f s (%.2f GB of weights against %.2f GB bf16); "
           "median of %d steps after %d\n", bench_now() - b->t_start, bench_now() - t0,
           ls_model_weight_bytes(fp8) / 1e9, ls_model_weight_bytes(bf16) / 1e9, b->steps, WARM);
    printf("\n%-6s %-6s %10s %10s %7s %7s   %12s %12s %7s  %s\n", "batch", "ctx", "bf16 ms", "fp8 ms", "ratio",
           "floors", "bf16+LoRA ms", "fp8+LoRA ms", "ratio", "fp8 GEMM");
    for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++)
        for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
            int batch = batches[i], ctx = ctxs[c], per_seq = (ctx + b->steps + BS) / BS;
            double t[2][2];
            for (int k = 0; k < 2; k++) {
                b->m = k ? fp8 : bf16;
                ls_kv_cache_t *kv = s_kv_new(b, batch * per_seq);
                t[k][0] = s_decode_run(b, kv, batch, ctx, per_seq, NULL);
                t[k][1] = s_decode_run(b, kv, batch, ctx, per_seq, b->slots);
                ls_kv_cache_destroy(&kv);
            }
            double floors = s_decode_floor(b, fp8_bytes, batch, ctx) /
                            s_decode_floor(b, b->c.weight_bytes, batch, ctx);
            // the GEMM the batch's steps took (set when its step graph was captured)
            ls_fp8_path_t path = ls_backend_cuda_fp8_path(be);
            printf("%-6d %-6d %10.3f %10.3f %7.3f %7.3f   %12.3f %12.3f %7.3f  %s\n", batch, ctx, 1e3 * t[0][0],
                   1e3 * t[1][0], t[1][0] / t[0][0], floors, 1e3 * t[0][1], 1e3 * t[1][1], t[1][1] / t[0][1],
                   path == LS_FP8_PATH_TC      ? "tc"
                   : path == LS_FP8_PATH_SMALL ? "small"
                   : path == LS_FP8_PATH_OUTER ? "outer"
                                               : "after");
            fflush(stdout);
        }
    printf("floors = the FP8 step's floor over the bf16 step's (weights, KV cache and logits over the copy "
           "bandwidth): the ratio an FP8 step reaches when both run at their floors\n");
    printf("FP8 GEMMs (engine/fp8_gemm.h): tc = ls_cu_fp8_gemm_tc, tensor cores, scales in its "
           "epilogue (up to LS_FP8_TC_T = %d tokens, sm_89+); small = ls_cu_fp8_gemm_small, CUDA "
           "cores (up to LS_FP8_SMALL_T = %d where tc does not run); outer = cuBLASLt applying "
           "the scales; after = cuBLASLt, then ls_cu_fp8_scale\n",
           LS_FP8_TC_T, LS_FP8_SMALL_T);
    b->m = bf16;
    ls_model_destroy(&fp8);
}

int main(int argc, char **argv) {
    static s_bench_t b = {.steps = 20, .max_s = 300};
    bool fp8 = false;
    const char *out = NULL;
    bool quick = false, block = true;
    int side = -1, only_ctx = 0, only_batch = 0, only_prompt = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = true;
        else if (!strcmp(argv[i], "--side-sms") && i + 1 < argc)
            side = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-block"))
            block = false;
        else if (!strcmp(argv[i], "--decode-ctx") && i + 1 < argc)
            only_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode-batch") && i + 1 < argc)
            only_batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc)
            only_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            if (kt_start(argv[++i]) != 0)
                bench_die(PROG, "--trace", "CUPTI tracing could not start");
        } else if (!strcmp(argv[i], "--fp8"))
            fp8 = true;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            b.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-seconds") && i + 1 < argc)
            b.max_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--settle") && i + 1 < argc)
            b.settle_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--output-file") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "usage: " PROG " [--quick] [--fp8] [--steps N] [--max-seconds S] [--output-file F] "
                            "[--decode-ctx C] [--decode-batch B] [--prefill P] [--side-sms N] [--trace CSV] "
                            "[--settle S] [--no-block]\n");
            return 2;
        }
    }
    if (quick && b.steps == 20)
        b.steps = 10;
    if (b.steps < 1 || b.steps > 64 || b.max_s <= 0 || only_ctx < 0 || only_prompt < 0 || side < -2 ||
        only_batch < 0 || only_batch > MAX_BATCH || !(b.settle_s >= 0 && b.settle_s <= 600)) {
        fprintf(stderr, PROG ": --steps must be 1..64, --max-seconds > 0, --decode-ctx and --prefill "
                        ">= 1, --decode-batch 1..%d, --side-sms >= -2 and --settle 0..600\n", MAX_BATCH);
        return 2;
    }
    if (out && !(b.json = fopen(out, "w")))
        bench_die(PROG, "--output-file", out);
    b.t_start = bench_now();
    char err[512], ids[N_ADAPTERS][16];
    printf("[%6.1f s] " PROG ": loading the dummy Llama-3-8B, writing %d adapters\n",
           bench_now() - b.t_start, N_ADAPTERS);
    fflush(stdout);
    bench_engine_t e;
    bench_engine_open(&e, PROG, LS_QUANT_NONE, N_ADAPTERS, RANK, N_ADAPTERS, N_ADAPTERS, ids);
    b.m = e.m;
    b.pool = e.pool;
    if (side != -1)
        ls_backend_cuda_set_side(e.be, side != -2, side);
    ls_backend_cuda_set_block(e.be, block);
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    b.card = prop.name;
    double bw = bench_copy_bw(PROG), tflops = bench_gemm_tflops(PROG, GEMM_N);
    printf("[%6.1f s] %s: copy bandwidth %.0f GB/s, bf16 tensor-core rate %.0f TFLOP/s "
           "(cuBLAS GEMM %d^3); the GEMV up to %d tokens a step\n", bench_now() - b.t_start, prop.name,
           bw, tflops, GEMM_N, ls_cu_gemv_tokens());
    fflush(stdout);
    const ls_model_config_t *cfg = ls_model_config(b.m);
    b.vocab = cfg->vocab_size;
    b.block_bytes = ls_kv_cache_block_bytes(b.m, BS, ls_model_kv_dtype(b.m));
    b.batch = bench_batch_new(MAX_BATCH + 1, PROG);
    const char *seq_ids[MAX_BATCH];
    for (int s = 0; s < MAX_BATCH; s++)
        seq_ids[s] = ids[s % N_ADAPTERS];
    if (slot_plan_map_once(b.pool, seq_ids, MAX_BATCH, b.slots, err, sizeof err) != 0)
        bench_die(PROG, "adapter slots", err);
    s_cost_init(&b, bw, tflops);
    // the slot pool stores adapters in the model's dtype (engine/lora_pool.h)
    b.c.adapter_bytes = (double)e.adapter_elems * ls_dtype_size(cfg->torch_dtype);
    printf("[%6.1f s] Llama-3-8B dummy (loaded in %.1f s): %.2f GB of weights stored, %.2f GB read "
           "a step (all but the embedding table); KV %s, %.0f KB a position; %d adapters of %.1f MB "
           "(set up in %.1f s); median of %d steps after %d\n", bench_now() - b.t_start, e.load_s,
           ls_model_weight_bytes(b.m) / 1e9,
           b.c.weight_bytes / 1e9, ls_dtype_name(ls_model_kv_dtype(b.m)), b.c.kv_pos / 1e3,
           N_ADAPTERS, b.c.adapter_bytes / 1e6, e.adapters_s, b.steps, WARM);
    fflush(stdout);

    if (fp8) {
        s_fp8_compare(&b, e.be);
        printf("[%6.1f s] done\n", bench_now() - b.t_start);
        kt_stop(); // nothing without --trace
        bench_batch_destroy(&b.batch);
        bench_engine_close(&e);
        return 0;
    }
    const int *batches = quick ? s_quick_batches : s_batches, *ctxs = quick ? s_quick_ctxs : s_ctxs;
    const int *prompts = quick ? s_quick_prompts : s_prompts;
    int n_b = quick ? 3 : N_BATCHES, n_c = quick ? 2 : 4, n_p = quick ? 1 : 3;
    if (only_ctx) // every batch at that context, nothing else
        batches = s_batches, n_b = N_BATCHES, ctxs = &only_ctx, n_c = 1, n_p = 0;
    if (only_batch) // that batch alone, at each context (or the one of --decode-ctx)
        batches = &only_batch, n_b = 1, n_p = 0;
    if (only_prompt) // that prompt alone, nothing else
        n_b = n_c = 0, prompts = &only_prompt, n_p = 1;
    // the few bounded points first, the decode grid (the longest part) last, so --max-seconds
    // cuts its largest points; the workspace a prefill grows stays (model.h) and counts as used
    // memory in the decode points' check
    for (int i = 0; i < n_p; i++)
        s_prefill_point(&b, prompts[i]);
    for (int i = 0; i < n_p && !only_prompt; i++)
        s_chunked_point(&b, prompts[i]);
    for (int c = 0; c < n_c; c++)
        for (int i = 0; i < n_b; i++)
            s_decode_point(&b, batches[i], ctxs[c]);

    printf("\n%s: copy bandwidth %.0f GB/s, bf16 tensor-core rate %.0f TFLOP/s\n", prop.name, bw, tflops);
    s_print_tables(&b);
    if (b.json && fclose(b.json) != 0)
        bench_die(PROG, "--output-file", "write failed");
    printf("[%6.1f s] done\n", bench_now() - b.t_start);
    kt_stop(); // nothing without --trace
    bench_batch_destroy(&b.batch);
    bench_engine_close(&e);
    return 0;
}
