/*  bench/bench_serve_engine.c — the serving workload on the engine alone: the scheduler's core
    and the worker's step in one process, no actors, no sockets, no HTTP.

    loraserve-bench measures the whole graph over HTTP; this driver measures what the same
    workload costs without the graph around it, so the two side by side say what the actors,
    their hops, detokenization and HTTP add. Same requests: the workload is made by
    bench/serve/workload.c from the same flags and seed (prompt ids, output lengths,
    adapters), issued closed-loop at --max-concurrency like loraserve-bench with
    --request-rate inf. Same policy: the scheduler's core (actors/scheduler/sched.c) plans
    every step, with prefill chunks, the token budget and the LoRA constraint, and the worker's
    step (actors/worker/step.c) runs each plan on the engine exactly as the worker process does.
    Adapters named by the workload are loaded before the clock starts (PEFT directories
    DIR/PREFIX-k), so cold loads are not part of this figure.

    Prints a table and, with --output-file, one JSON line with loraserve-bench's keys
    (completed, duration, output_throughput, …) plus where the time went: the forward and
    sampling (step_s), the scheduler (sched_s) and the driver's own bookkeeping (other_s).
*/
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#ifdef LS_HAVE_CUDA
#include "backend_cuda.h"
#include "kernel_trace.h"
#endif
#include "history.h"
#include "lora_pool.h"
#include "ls_actor.h"
#include "ls_flags.h"
#include "ls_limits.h"
#include "ls_msg.h"
#include "model.h"
#include "peft.h"
#include "sched.h"
#include "step.h"
#include "workload.h"

typedef struct {
    // flags
    char *model_path, *load_format, *backend, *dist, *adapter_dir, *prefix, *output_file, *trace;
    int device, num_prompts, concurrency, input_len, output_len, warmup, num_adapters;
    int kv_cache_mb, block_size, slots, max_rank, cpu_lora_mb, max_batched, chunk, max_running;
    double range_ratio;
    int seed;
    // engine
    ls_backend_t *be;
    ls_model_t *model;
    ls_kv_cache_t *kv;
    ls_lora_pool_t *pool;
    ls_history_t *history;
    wstep_engine_t eng;
    sched_t *sched;
    // messages the core emitted, handled after it returns (it must not be re-entered)
    ls_msg_t *q;
    size_t nq, capq;
    // requests
    bs_workload_t *wl;
    char **adapter_ids;  // per workload adapter: its id ("" until loaded)
    size_t next, done, failed, inflight, total;
    uint64_t *first_ns, *start_ns, *end_ns;
    uint32_t *out_tokens;
    uint64_t out_sum, in_sum;
    uint64_t step_ns, sched_ns, steps;
    uint64_t prefill_ns, prefill_steps, prefill_tokens;  // steps with prompt tokens in them
    int no_graphs;
    int side_sms; // SMs every GEMM leaves to the LoRA beside it; -1: the backend's rule
} s_drv_t;

static s_drv_t s_d;

static void s_emit(void *arg, const sched_dest_t *dest, const ls_msg_t *msg) {
    // A deep copy through the codec: the core clears its message when emit returns.
    char *buf;
    size_t len;
    if (ls_msg_encode(msg, &buf, &len) != 0) {
        fprintf(stderr, "cannot encode a %s\n", ls_msg_type_name(msg->type));
        exit(1);
    }
    if (s_d.nq == s_d.capq) {
        s_d.capq = s_d.capq ? 2 * s_d.capq : 64;
        s_d.q = realloc(s_d.q, s_d.capq * sizeof *s_d.q);
    }
    if (ls_msg_decode(buf, len, &s_d.q[s_d.nq], NULL) != 0) {
        fprintf(stderr, "cannot decode a %s\n", ls_msg_type_name(msg->type));
        exit(1);
    }
    s_d.nq++;
    free(buf);
}

// The request of workload index i: a greedy request with its own rid (i + 1).
static void s_submit(size_t i, uint64_t now) {
    const bs_req_t *rq = bs_workload_req(s_d.wl, i);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = i + 1;
    ls_msg_tokenized_req_t *t = &m.u.tokenized_req;
    t->input_ids.v = malloc(rq->nids * sizeof(int32_t));
    for (size_t k = 0; k < rq->nids; k++)
        t->input_ids.v[k] = (int32_t)rq->ids[k];
    t->input_ids.n = rq->nids;
    if (rq->adapter >= 0)
        t->adapter_id = ls_msg_strdup(s_d.adapter_ids[rq->adapter]);
    t->sampling.max_new_tokens = (uint32_t)rq->output_len;
    t->sampling.ignore_eos = true;
    s_d.start_ns[i] = now;
    uint64_t t0 = ls_mono_ns();
    sched_on_request(s_d.sched, now, &m, (void *)(uintptr_t)(i + 1));
    s_d.sched_ns += ls_mono_ns() - t0;
    ls_msg_clear(&m);
    s_d.inflight++;
}

static void s_finish(size_t i, uint64_t now, bool ok) {
    s_d.end_ns[i] = now;
    s_d.inflight--;
    s_d.done++;
    s_d.failed += !ok;
}

// Handles what the core emitted; runs plans on the engine.
static void s_drain(void) {
    for (size_t k = 0; k < s_d.nq; k++) {
        // handling one may emit more, which moves the queue: work on a copy of the struct
        ls_msg_t cur = s_d.q[k], *m = &cur;
        uint64_t now = ls_mono_ns();
        char err[1024];
        if (m->type == LS_MSG_STEP_PLAN) {
            ls_msg_t res;
            int n_rows;
#ifdef LS_HAVE_CUDA
            if (s_d.trace) {  // the kernels of steps with prompt tokens apart from decode-only ones
                bool pf = false;
                for (size_t j = 0; j < m->u.step_plan.items.n; j++)
                    pf |= m->u.step_plan.items.v[j].is_prefill;
                kt_mark(pf ? "prefill" : "decode");
            }
#endif
            if (wstep_run(&s_d.eng, &m->u.step_plan, &res, &n_rows, err, sizeof err) < 0) {
                fprintf(stderr, "step %" PRIu64 " failed: %s\n", m->u.step_plan.step, err);
                wstep_fail(&m->u.step_plan, &res);
            }
            res.rid = m->rid;
            uint64_t t1 = ls_mono_ns();
            s_d.step_ns += t1 - now;
            s_d.steps++;
            uint64_t prompt = 0;
            for (size_t j = 0; j < m->u.step_plan.items.n; j++)
                if (m->u.step_plan.items.v[j].is_prefill)
                    prompt += m->u.step_plan.items.v[j].token_ids.n;
            if (prompt) {
                s_d.prefill_ns += t1 - now;
                s_d.prefill_steps++;
                s_d.prefill_tokens += prompt;
            }
            sched_on_step_result(s_d.sched, t1, &res);
            s_d.sched_ns += ls_mono_ns() - t1;
            ls_msg_clear(&res);
        } else if (m->type == LS_MSG_TOKEN_OUT) {
            size_t i = (size_t)m->rid - 1;
            const ls_msg_token_out_t *o = &m->u.token_out;
            if (i < s_d.total) {
                if (!s_d.first_ns[i] && o->token_ids.n)
                    s_d.first_ns[i] = now;
                s_d.out_tokens[i] += (uint32_t)o->token_ids.n;
                if (o->finish != LS_FINISH_REASON_NONE)
                    s_finish(i, now, o->finish == LS_FINISH_REASON_LENGTH || o->finish == LS_FINISH_REASON_STOP);
            }
        } else if (m->type == LS_MSG_ERROR) {
            size_t i = (size_t)m->rid - 1;
            fprintf(stderr, "request %zu refused: %s\n", i, m->u.error.message ? m->u.error.message : "");
            if (i < s_d.total)
                s_finish(i, now, false);
        } else if (m->type == LS_MSG_PREFETCH_ADAPTER) {
            if (wstep_prefetch(&s_d.eng, &m->u.prefetch_adapter, err, sizeof err) < 0)
                fprintf(stderr, "prefetch: %s\n", err);
        } else if (m->type == LS_MSG_UNLOAD_ADAPTER) {
            // every adapter fits the tier by construction (checked at start): nothing is evicted
            fprintf(stderr, "unexpected eviction of %s\n", m->u.unload_adapter.adapter_id);
        }
        ls_msg_clear(m);
    }
    s_d.nq = 0;
}

// Loads every adapter the workload names into the CPU tier, through the core (LoadAdapter
// answered by this process) so that its tables know them.
static int s_load_adapters(void) {
    size_t n = bs_workload_adapter_count(s_d.wl);
    s_d.adapter_ids = calloc(n + 1, sizeof *s_d.adapter_ids);
    const ls_model_config_t *cfg = ls_model_config(s_d.model);
    for (size_t a = 0; a < n; a++) {
        const char *name = bs_workload_adapter_name(s_d.wl, (int)a);
        char path[4096], err[1024];
        snprintf(path, sizeof path, "%s/%s", s_d.adapter_dir ? s_d.adapter_dir : ".", name);
        s_d.adapter_ids[a] = strdup(name);
        ls_adapter_t *ad = ls_adapter_load(path, cfg, s_d.max_rank, err, sizeof err);
        if (!ad || ls_lora_pool_add_adapter(s_d.pool, name, &ad, err, sizeof err) < 0) {
            fprintf(stderr, "adapter %s: %s\n", path, err);
            ls_adapter_destroy(&ad);
            return -1;
        }
        int rank, pages;
        size_t bytes;
        ls_lora_pool_image_info(s_d.pool, name, &rank, &bytes, &pages);
        // The core learns it as the registry would tell it; the answer is this process's.
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
        m.rid = 1000000 + a;
        m.u.load_adapter.name = ls_msg_strdup(name);
        m.u.load_adapter.adapter_id = ls_msg_strdup(name);
        m.u.load_adapter.path = ls_msg_strdup(path);
        m.u.load_adapter.slot = -1;
        sched_on_load_adapter(s_d.sched, ls_mono_ns(), &m, NULL);
        ls_msg_clear(&m);
        for (size_t k = 0; k < s_d.nq; k++) {
            ls_msg_t *q = &s_d.q[k];
            if (q->type == LS_MSG_LOAD_ADAPTER) {
                ls_msg_t ans;
                ls_msg_init(&ans, LS_MSG_ADAPTER_LOADED);
                ans.rid = q->rid;
                ans.u.adapter_loaded.ok = 1;
                ans.u.adapter_loaded.adapter_id = ls_msg_strdup(name);
                ans.u.adapter_loaded.rank = (uint32_t)rank;
                ans.u.adapter_loaded.bytes = bytes;
                ans.u.adapter_loaded.pages = (uint32_t)pages;
                sched_on_adapter_answer(s_d.sched, ls_mono_ns(), 0, &ans);
                ls_msg_clear(&ans);
            }
            if (q->type == LS_MSG_UNLOAD_ADAPTER) {
                fprintf(stderr, "the CPU tier (--max-cpu-lora-mb %d) cannot hold the workload's %zu adapters\n",
                        s_d.cpu_lora_mb, n);
                return -1;
            }
            ls_msg_clear(q);
        }
        s_d.nq = 0;
    }
    return 0;
}

static int s_cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("model-path", &s_d.model_path, NULL, "HF model directory or config.json"),
        LS_FLAG_STR("load-format", &s_d.load_format, "auto", "auto or dummy (random weights of config.json's shapes)"),
        LS_FLAG_STR("backend", &s_d.backend, "cpu", "cpu or cuda"),
        LS_FLAG_INT("device", &s_d.device, "0", "GPU of the cuda backend"),
        LS_FLAG_INT("num-prompts", &s_d.num_prompts, "256", "requests measured"),
        LS_FLAG_INT("max-concurrency", &s_d.concurrency, "64", "requests in flight (closed loop)"),
        LS_FLAG_INT("input-len", &s_d.input_len, "128", "prompt tokens"),
        LS_FLAG_INT("output-len", &s_d.output_len, "128", "new tokens (ignore_eos)"),
        LS_FLAG_DOUBLE("range-ratio", &s_d.range_ratio, "1", "lengths uniform in [len*ratio, len]"),
        LS_FLAG_INT("seed", &s_d.seed, "0", "workload seed (loraserve-bench's)"),
        LS_FLAG_INT("warmup-requests", &s_d.warmup, "0", "requests run before the clock starts"),
        LS_FLAG_STR("adapter-dist", &s_d.dist, "base", "uniform, zipf:ALPHA, single or base"),
        LS_FLAG_INT("num-adapters", &s_d.num_adapters, "0", "adapters the distribution draws from"),
        LS_FLAG_STR("adapter-prefix", &s_d.prefix, "lora", "adapter names PREFIX-0 .. PREFIX-(N-1)"),
        LS_FLAG_STR("lora-dir", &s_d.adapter_dir, NULL, "directory holding the adapters"),
        LS_FLAG_INT("max-loras-per-batch", &s_d.slots, LS_LIMITS_STR(LS_DEFAULT_MAX_LORAS_PER_BATCH), "adapter slots"),
        LS_FLAG_INT("max-lora-rank", &s_d.max_rank, "64", "largest adapter rank"),
        LS_FLAG_INT("max-cpu-lora-mb", &s_d.cpu_lora_mb, "0", "CPU tier (0: the worker's default)"),
        LS_FLAG_INT("kv-cache-mb", &s_d.kv_cache_mb, "256", "GPU pool: the KV cache and the adapters in slots"),
        LS_FLAG_INT("block-size", &s_d.block_size, "16", "tokens per KV block"),
        LS_FLAG_INT("max-num-batched-tokens", &s_d.max_batched, LS_LIMITS_STR(LS_DEFAULT_MAX_NUM_BATCHED_TOKENS),
                    "token budget of one step"),
        LS_FLAG_INT("chunked-prefill-size", &s_d.chunk, LS_LIMITS_STR(LS_DEFAULT_CHUNKED_PREFILL_SIZE), "prompt tokens of one request per step"),
        LS_FLAG_INT("max-running-requests", &s_d.max_running, LS_LIMITS_STR(LS_DEFAULT_MAX_RUNNING_REQUESTS),
                    "requests decoded at once"),
        LS_FLAG_STR("output-file", &s_d.output_file, NULL, "append the results as one JSON line"),
        LS_FLAG_BOOL("no-graphs", &s_d.no_graphs, "run every step with plain launches (no CUDA graphs)"),
        LS_FLAG_INT("side-sms", &s_d.side_sms, "-1",
                    "SMs every GEMM leaves to the LoRA beside it (CUDA; -1: the backend's rule by the step's tokens)"),
        LS_FLAG_STR("trace", &s_d.trace, NULL, "CSV of every kernel of the measured steps (CUDA; kernel_trace.h)"),
        LS_FLAG_END,
    };
    ls_flag_t *tables[] = {flags, NULL};
    char err[1024];
    int rc = ls_flags_parse(tables, argc, argv, err, sizeof err);
    if (rc == 1)
        return 0;
    if (rc < 0 || !s_d.model_path || s_d.num_prompts < 1 || s_d.concurrency < 1 || s_d.side_sms < -1) {
        fprintf(stderr, "%s\n",
                rc < 0 ? err
                       : "--model-path, --num-prompts >= 1, --max-concurrency >= 1 and --side-sms >= -1 are needed");
        ls_flags_usage(tables, argv[0], "the serving workload on the engine alone");
        return 2;
    }
    bs_dist_t dist;
    if (bs_dist_parse(s_d.dist, &dist) < 0) {
        fprintf(stderr, "--adapter-dist %s: uniform, zipf:ALPHA, single or base\n", s_d.dist);
        return 2;
    }
    if (!strcmp(s_d.backend, "cuda")) {
#ifdef LS_HAVE_CUDA
        s_d.be = ls_backend_cuda_new(s_d.device, err, sizeof err);
#else
        snprintf(err, sizeof err, "this build has no CUDA backend");
#endif
    } else
        s_d.be = ls_backend_cpu_new(0);
    if (!s_d.be) {
        fprintf(stderr, "backend: %s\n", err);
        return 1;
    }
#ifdef LS_HAVE_CUDA
    if (s_d.no_graphs && !strcmp(s_d.backend, "cuda"))
        ls_backend_cuda_set_graphs(s_d.be, 0);
    if (s_d.side_sms >= 0 && !strcmp(s_d.backend, "cuda"))
        ls_backend_cuda_set_side(s_d.be, 1, s_d.side_sms);
#endif
    s_d.model = !strcmp(s_d.load_format, "dummy")
                    ? ls_model_load_dummy(s_d.model_path, s_d.be, NULL, LS_QUANT_NONE, 0, NULL, NULL, err, sizeof err)
                    : ls_model_load(s_d.model_path, s_d.be, NULL, LS_QUANT_NONE, NULL, NULL, err, sizeof err);
    if (!s_d.model) {
        fprintf(stderr, "model: %s\n", err);
        return 1;
    }
    const ls_model_config_t *cfg = ls_model_config(s_d.model);
    size_t per_block = ls_kv_cache_block_bytes(s_d.model, s_d.block_size, ls_model_kv_dtype(s_d.model));
    ls_lora_pool_config_t pc = {.max_loras_per_batch = s_d.slots, .max_lora_rank = s_d.max_rank,
                                .host_bytes = (size_t)s_d.cpu_lora_mb << 20};
    if (wstep_memory_new(s_d.model, (int)(((size_t)s_d.kv_cache_mb << 20) / per_block), s_d.block_size, &pc, &s_d.kv,
                         &s_d.pool, err, sizeof err) != 0) {
        fprintf(stderr, "KV cache / adapter pool: %s\n", err);
        return 1;
    }
    s_d.history = ls_history_new();
    s_d.eng = (wstep_engine_t){.model = s_d.model, .kv = s_d.kv, .pool = s_d.pool, .history = s_d.history,
                               .backend = s_d.be->name};

    // the workload: warm-up requests first, then the measured ones, as loraserve-bench makes them
    size_t total = (size_t)s_d.num_prompts + (size_t)s_d.warmup;
    char **names = calloc((size_t)s_d.num_adapters + 1, sizeof *names);
    for (int a = 0; a < s_d.num_adapters; a++) {
        names[a] = malloc(strlen(s_d.prefix) + 24);
        sprintf(names[a], "%s-%d", s_d.prefix, a);
    }
    bs_workload_cfg_t wc = {.num_prompts = total, .input_len = s_d.input_len, .output_len = s_d.output_len,
                            .range_ratio = s_d.range_ratio, .vocab_size = (uint32_t)cfg->vocab_size, .dist = dist,
                            .request_rate = 0, .seed = (uint64_t)s_d.seed};
    s_d.wl = bs_workload_new(&wc, (const char *const *)names, (size_t)s_d.num_adapters, err, sizeof err);
    for (int a = 0; a < s_d.num_adapters; a++)  // the workload keeps copies
        free(names[a]);
    free(names);
    if (!s_d.wl) {
        fprintf(stderr, "workload: %s\n", err);
        return 2;
    }
    s_d.total = total;
    s_d.first_ns = calloc(total, sizeof *s_d.first_ns);
    s_d.start_ns = calloc(total, sizeof *s_d.start_ns);
    s_d.end_ns = calloc(total, sizeof *s_d.end_ns);
    s_d.out_tokens = calloc(total, sizeof *s_d.out_tokens);

    sched_config_t sc = {.tp_size = 1, .max_num_batched_tokens = s_d.max_batched,
                         .max_running_requests = s_d.max_running, .chunked_prefill_size = s_d.chunk,
                         .max_skip_steps = LS_DEFAULT_MAX_SKIP_STEPS, .default_max_new_tokens = LS_DEFAULT_MAX_NEW_TOKENS,
                         .eviction = LORA_EVICT_LRU,
                         .step_timeout_ns = 600000000000ull, .load_timeout_ns = 600000000000ull,
                         // the workload may be queued whole: no admission bound refuses any of it
                         .max_waiting_requests = UINT32_MAX, .max_tenant_waiting = UINT32_MAX,
                         .max_queued_tokens = UINT64_MAX};
    const sched_io_t io = {.emit = s_emit, .arg = NULL};
    if (!(s_d.sched = sched_new(&sc, &io))) {
        fprintf(stderr, "cannot create the scheduler core\n");
        return 1;
    }
    int32_t eos[LS_MAX_EOS_TOKENS * 2];
    int n_eos = ls_model_eos_ids(s_d.model_path, cfg, eos, (int)(sizeof eos / sizeof *eos));
    ls_msg_t info;
    wstep_worker_info(&s_d.eng, 1, eos, n_eos, 0, s_d.model_path, &info);
    sched_on_worker_info(s_d.sched, ls_mono_ns(), &info);
    ls_msg_clear(&info);
    s_drain();
    if (s_load_adapters() < 0)
        return 1;

    // closed loop: warm-up, then the measured requests
    uint64_t t_start = 0, step0 = 0, sched0 = 0, steps0 = 0, pf0 = 0, pfs0 = 0, pft0 = 0;
    while (s_d.done < total) {
        if (s_d.done == (size_t)s_d.warmup && !t_start) {
            if (s_d.warmup)  // the measured ones start from an idle engine, as in the graph
                while (s_d.inflight)
                    s_drain();
#ifdef LS_HAVE_CUDA
            if (s_d.trace && kt_start(s_d.trace) != 0)
                fprintf(stderr, "--trace: CUPTI is not available\n");
#endif
            t_start = ls_mono_ns();
            step0 = s_d.step_ns, sched0 = s_d.sched_ns, steps0 = s_d.steps;
            pf0 = s_d.prefill_ns, pfs0 = s_d.prefill_steps, pft0 = s_d.prefill_tokens;
        }
        size_t limit = s_d.done < (size_t)s_d.warmup ? (size_t)s_d.warmup : total;
        while (s_d.inflight < (size_t)s_d.concurrency && s_d.next < limit)
            s_submit(s_d.next++, ls_mono_ns());
        if (!s_d.nq) {
            uint64_t now = ls_mono_ns(), t0 = now;
            sched_on_tick(s_d.sched, now);
            s_d.sched_ns += ls_mono_ns() - t0;
            if (!s_d.nq) {
                fprintf(stderr, "stalled: %zu requests in flight and no step planned\n", s_d.inflight);
                return 1;
            }
        }
        s_drain();
    }
    uint64_t t_end = ls_mono_ns();
#ifdef LS_HAVE_CUDA
    if (s_d.trace)
        kt_stop();
#endif
    double dur = (double)(t_end - t_start) / 1e9;
    size_t n = (size_t)s_d.num_prompts, w0 = (size_t)s_d.warmup;
    uint64_t in_tok = 0, out_tok = 0, asked = 0;
    uint64_t *ttft = calloc(n, sizeof *ttft), *e2e = calloc(n, sizeof *e2e);
    double tpot_sum = 0, ttft_sum = 0;
    for (size_t i = 0; i < n; i++) {
        in_tok += bs_workload_req(s_d.wl, w0 + i)->nids;
        asked += (uint64_t)bs_workload_req(s_d.wl, w0 + i)->output_len;
        out_tok += s_d.out_tokens[w0 + i];
        ttft[i] = s_d.first_ns[w0 + i] - s_d.start_ns[w0 + i];
        e2e[i] = s_d.end_ns[w0 + i] - s_d.start_ns[w0 + i];
        ttft_sum += (double)ttft[i];
        if (s_d.out_tokens[w0 + i] > 1)
            tpot_sum += (double)(e2e[i] - ttft[i]) / (s_d.out_tokens[w0 + i] - 1);
    }
    qsort(ttft, n, sizeof *ttft, s_cmp_u64);
    qsort(e2e, n, sizeof *e2e, s_cmp_u64);
    double step_s = (double)(s_d.step_ns - step0) / 1e9, sched_s = (double)(s_d.sched_ns - sched0) / 1e9;
    uint64_t steps = s_d.steps - steps0, pf_steps = s_d.prefill_steps - pfs0, pf_tokens = s_d.prefill_tokens - pft0;
    double pf_s = (double)(s_d.prefill_ns - pf0) / 1e9;
    long captured = 0, replayed = 0;
#ifdef LS_HAVE_CUDA
    if (!strcmp(s_d.backend, "cuda"))
        ls_backend_cuda_graph_counts(s_d.be, &captured, &replayed);
#endif
    printf("engine alone: %s on %s, %zu requests (%zu failed), concurrency %d, %d+%d tokens, adapters %s over %d\n",
           cfg->arch == LS_ARCH_LLAMA ? "Llama" : "model", s_d.be->name, n, s_d.failed, s_d.concurrency, s_d.input_len,
           s_d.output_len, s_d.dist, s_d.num_adapters);
    printf("  duration %.3f s; output %.1f tok/s, total %.1f tok/s, %.2f req/s\n", dur, out_tok / dur,
           (in_tok + out_tok) / dur, n / dur);
    printf("  steps %" PRIu64 " (%.3f ms each); time in steps %.1f%%, scheduler %.1f%%, driver %.1f%%\n", steps,
           steps ? step_s * 1e3 / steps : 0, 100 * step_s / dur, 100 * sched_s / dur,
           100 * (dur - step_s - sched_s) / dur);
    printf("  steps with prompt tokens: %" PRIu64 " (%.3f ms each, %.0f prompt tokens each); decode-only steps %.3f ms "
           "each; step graphs captured %ld, replayed %ld\n",
           pf_steps, pf_steps ? pf_s * 1e3 / pf_steps : 0, pf_steps ? (double)pf_tokens / pf_steps : 0,
           steps > pf_steps ? (step_s - pf_s) * 1e3 / (steps - pf_steps) : 0, captured, replayed);
    printf("  TTFT mean/p50/p99 %.1f/%.1f/%.1f ms; TPOT mean %.2f ms; E2E p50/p99 %.1f/%.1f ms\n",
           ttft_sum / n / 1e6, (double)ttft[n / 2] / 1e6, (double)ttft[(n * 99) / 100] / 1e6, tpot_sum / n / 1e6,
           (double)e2e[n / 2] / 1e6, (double)e2e[(n * 99) / 100] / 1e6);
    if (s_d.output_file) {
        FILE *f = fopen(s_d.output_file, "a");
        if (!f) {
            fprintf(stderr, "--output-file %s: cannot open\n", s_d.output_file);
            free(ttft), free(e2e);
            return 1;
        }
        fprintf(f,
                "{\"backend\": \"engine\", \"device\": \"%s\", \"completed\": %zu, \"failed\": %zu, "
                "\"max_concurrency\": %d, \"adapter_dist\": \"%s\", \"num_adapters\": %d, \"duration\": %.6f, "
                "\"total_input_tokens\": %" PRIu64 ", \"total_output_tokens\": %" PRIu64 ", \"requested_output_tokens\": %" PRIu64 ", "
                "\"request_throughput\": %.4f, \"input_throughput\": %.3f, \"output_throughput\": %.3f, "
                "\"total_throughput\": %.3f, \"mean_ttft_ms\": %.3f, \"median_ttft_ms\": %.3f, \"p99_ttft_ms\": %.3f, \"mean_tpot_ms\": %.4f, "
                "\"p99_e2e_latency_ms\": %.3f, \"steps\": %" PRIu64 ", \"step_s\": %.6f, \"sched_s\": %.6f, "
                "\"other_s\": %.6f, \"prefill_steps\": %" PRIu64 ", \"prefill_s\": %.6f, \"prefill_tokens\": %" PRIu64 ", "
                "\"graphs_captured\": %ld, \"graphs_replayed\": %ld}\n",
                s_d.be->name, n - s_d.failed, s_d.failed, s_d.concurrency, s_d.dist, s_d.num_adapters, dur, in_tok,
                out_tok, asked, n / dur, in_tok / dur, out_tok / dur, (in_tok + out_tok) / dur, ttft_sum / n / 1e6,
                (double)ttft[n / 2] / 1e6, (double)ttft[(n * 99) / 100] / 1e6, tpot_sum / n / 1e6, (double)e2e[(n * 99) / 100] / 1e6, steps,
                step_s, sched_s, dur - step_s - sched_s, pf_steps, pf_s, pf_tokens, captured, replayed);
        fclose(f);
    }
    free(ttft), free(e2e);
    return s_d.failed ? 1 : 0;
}
