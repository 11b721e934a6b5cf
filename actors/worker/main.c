// worker — one per device: holds the base model, the KV cache and the adapter memory (CPU tier
// and slots), and runs the scheduler's step plans on its backend.
//
// Accepts:
//   StepPlan         run one forward step; rank 0 answers StepResult
//   LoadAdapter      read a PEFT adapter from disk (on the job thread) into the CPU tier, and
//                    into a slot when `slot` >= 0; answered by AdapterLoaded
//   UnloadAdapter    drop an adapter from both tiers; answered by AdapterUnloaded
//   PrefetchAdapter  copy an adapter from the CPU tier into a slot now, ahead of its step
//   TpComm           (--tp-size > 1) the group's communicator: join it, then load the shard
//   PeerStatus       (the launcher) the scheduler went down: drop every adapter and request;
//                    it is Ready again: WorkerInfo to it
//   + the lifecycle messages every actor handles
// Emits: WorkerInfo (to the scheduler once the model is loaded), TpComm (rank 0, to the
//   scheduler, which hands it to every rank), StepResult, AdapterLoaded, AdapterUnloaded,
//   Error; LoadProgress (to the launcher, for its console: the weights, each adapter).
//
// Tensor parallelism (docs/engine.md): with --tp-size N every rank holds its shard of the
// model and of every adapter slot and runs every step; the ranks meet at the collectives of
// the forward (comm.h: shared memory between CPU workers, NCCL between CUDA ones). Start-up:
// rank 0 makes the communicator id and sends it in a TpComm; each rank joins on receiving
// it, loads its shard, sends WorkerInfo and only then is Ready. Only rank 0 samples and
// answers StepResult.
//
// Slots are the scheduler's decision: StepItem.adapter_slot s (-1 for the base model) is the
// engine pool's slot s + 1 (engine slot 0 is the base-model sentinel). Pinning is too: the
// scheduler never names a pinned adapter's slot for another, so LoadAdapter.pinned is not
// used here. Per-request state is the token history sampling penalties need (prompt and
// output ids); the scheduler frees it through StepPlan.released.
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "comm.h"
#ifdef LS_HAVE_CUDA
#include "backend_cuda.h"
#endif
#ifdef LS_HAVE_NCCL
#include "comm_nccl.h"
#endif
#include "constrain.h"
#include "history.h"
#include "ls_actor.h"
#include "ls_limits.h"
#include "ls_confine.h"
#include "step.h"
#include "lora_pool.h"
#include "model.h"
#include "peft.h"

typedef struct {
    // flags
    char *model_path;
    char *load_format;  // auto (the checkpoint) or dummy (random weights of its config.json)
    char *quantization; // --quantization: none or fp8
    ls_quant_t quant;
    char *backend_name;
    char *scheduler;  // --scheduler: its group's scheduler (scheduler-G with --dp-size > 1)
    ls_strlist_t target_modules;
    ls_strlist_t lora_roots, lora_dirs, lora_paths;
    char *lora_tensors_dir;
    ls_confine_t *confine;  // where adapter paths may point: checked here, whatever the scheduler says
    int kv_blocks, kv_cache_mb, block_size;
    int max_loras_per_batch, max_lora_rank, max_loaded_loras, max_cpu_lora_mb;
    int extra_vocab_size;  // --lora-extra-vocab-size: trainable token rows a slot holds
    int threads, tp_size, tp_timeout_ms;
    int max_running, max_batched;  // the scheduler's step bounds: a bigger plan is refused
    int device;  // --device; -1: the worker's rank
    int rank;  // from the runtime's --rank
    unsigned target_mask;
    // engine
    ls_backend_t *be;
    ls_comm_t *comm;  // tensor parallel: the group, once joined
    ls_timer_t *join_timer;
    ls_model_t *model;
    ls_kv_cache_t *kv;
    ls_lora_pool_t *pool;
    ls_history_t *history;
    wcon_t *constrain;  // structured output (rank 0 samples)
    int32_t eos_ids[LS_MAX_EOS_TOKENS * 2];
    int n_eos;
    uint32_t scheduler_epoch;  // counts the scheduler's deaths: a load begun before one is void
    wstep_times_t times;       // where the steps' time went (step.h), reported by s_report_step
} worker_t;

static worker_t s_w;

// ---------------------------------------------------------------------------------------------
// start-up

// The launcher's console shows what loads (LoadProgress; a worker run by hand has no launcher
// and sends nothing).
static void s_progress_send(ls_actor_t *a, const char *what, uint64_t done, uint64_t total) {
    if (!ls_actor_supervised(a))
        return;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_PROGRESS);
    m.u.load_progress.actor = ls_msg_strdup(ls_actor_name(a));
    m.u.load_progress.what = ls_msg_strdup(what);
    m.u.load_progress.done_bytes = done;
    m.u.load_progress.total_bytes = total;
    ls_actor_send_control(a, &m);
    ls_msg_clear(&m);
}

typedef struct {
    ls_actor_t *actor;
    size_t tenth, percent;  // the last logged and sent; (size_t)-1 before the first
} s_weights_seen_t;

static void s_progress(void *arg, const char *what, size_t done, size_t total) {
    // A log line per tenth of the weights, so a long load shows it is moving; the launcher's
    // console a message per whole percent: by bytes, not the clock, so few enough for any
    // model and the same in a replay.
    s_weights_seen_t *seen = arg;
    size_t percent = total ? done * 100 / total : 100;
    if (percent / 10 != seen->tenth || done == total) {
        seen->tenth = percent / 10;
        ls_info(0, "loading weights: %zu%% (%.1f of %.1f MB, %s)", percent, (double)done / 1e6, (double)total / 1e6,
                what);
    }
    if (percent != seen->percent) {
        seen->percent = percent;
        s_progress_send(seen->actor, "weights", done, total);
    }
}

static int s_target_mask(unsigned *mask) {
    *mask = 0;
    for (size_t i = 0; i < s_w.target_modules.n; i++) {
        const char *name = s_w.target_modules.v[i];
        if (!strcmp(name, "all")) {
            *mask = 0;
            return 0;
        }
        int t = ls_target_from_name(name);
        if (t < 0) {
            ls_error(0, "--lora-target-modules: unknown module \"%s\" (q_proj, k_proj, v_proj, o_proj, "
                        "gate_proj, up_proj, down_proj, embed_tokens, lm_head or all)", name);
            return -1;
        }
        *mask |= 1u << t;
    }
    return 0;
}

static wstep_engine_t s_engine(void) {
    return (wstep_engine_t){.times = &s_w.times, .model = s_w.model, .kv = s_w.kv, .pool = s_w.pool, .history = s_w.history,
                            .constrain = s_w.constrain, .rank = s_w.rank, .backend = s_w.be->name, .max_items = (uint32_t)s_w.max_running,
                            .max_tokens = (uint32_t)s_w.max_batched};
}

static void s_send_info(ls_actor_t *a) {
    ls_msg_t m;
    wstep_engine_t e = s_engine();
    wstep_worker_info(&e, s_w.tp_size, s_w.eos_ids, s_w.n_eos, s_w.max_loaded_loras, s_w.model_path, &m);
    ls_actor_send_peer(a, s_w.scheduler, &m, NULL);
    ls_msg_clear(&m);
}

// Loads the model (the rank's shard when s_w.comm is set), the KV cache and the adapter
// pool, and tells the scheduler what the worker holds. -1 after logging why.
static int s_load_engine(ls_actor_t *a) {
    char err[1024];
    ls_info(0, "loading %s on %s%s", s_w.model_path, s_w.be->name, s_w.comm ? " (tensor-parallel shard)" : "");
    s_progress_send(a, "weights", 0, 0);
    s_weights_seen_t seen = {a, (size_t)-1, (size_t)-1};
    // dummy: the shapes of config.json with random weights and no checkpoint, for benchmarks at
    // real sizes; the seed is fixed so every rank of a group builds the same model.
    int dummy = !strcmp(s_w.load_format, "dummy");
    if (!(s_w.model = dummy ? ls_model_load_dummy(s_w.model_path, s_w.be, s_w.comm, s_w.quant, 0, s_progress, &seen, err, sizeof err)
                            : ls_model_load(s_w.model_path, s_w.be, s_w.comm, s_w.quant, s_progress, &seen, err, sizeof err))) {
        ls_error(0, "cannot load the model: %s", err);
        return -1;
    }
    const ls_model_config_t *cfg = ls_model_config(s_w.model);
    s_w.n_eos = ls_model_eos_ids(s_w.model_path, cfg, s_w.eos_ids, (int)(sizeof s_w.eos_ids / sizeof *s_w.eos_ids));
    int pages = s_w.kv_blocks;
    if (pages <= 0) {
        // A page is a KV block: both K and V, every layer, as the backend stores the cache
        // (f32 on the CPU backend, the model's weight dtype on the GPU), for the rank's KV
        // heads. The adapters in GPU slots take pages of the same pool (docs/memory.md).
        size_t per_block = ls_kv_cache_block_bytes(s_w.model, s_w.block_size, ls_model_kv_dtype(s_w.model));
        size_t fit = ((size_t)s_w.kv_cache_mb << 20) / per_block;
        if (fit > LS_MAX_KV_BLOCKS)
            ls_info(0, "--kv-cache-mb %d holds %zu pages: taking the %u a scheduler holds", s_w.kv_cache_mb, fit,
                    LS_MAX_KV_BLOCKS);
        pages = (int)(fit < LS_MAX_KV_BLOCKS ? fit : LS_MAX_KV_BLOCKS);
    }
    ls_lora_pool_config_t pc = {.max_loras_per_batch = s_w.max_loras_per_batch,
                                .max_lora_rank = s_w.max_lora_rank,
                                .host_bytes = (size_t)s_w.max_cpu_lora_mb << 20,
                                .target_mask = s_w.target_mask,
                                .tp_rank = s_w.rank,
                                .tp_size = s_w.tp_size,
                                .extra_vocab_size = s_w.extra_vocab_size};
    if (wstep_memory_new(s_w.model, pages, s_w.block_size, &pc, &s_w.kv, &s_w.pool, err, sizeof err) != 0) {
        ls_error(0, "cannot allocate the GPU pool (KV cache and adapters): %s", err);
        return -1;
    }
    s_w.history = ls_history_new();
    s_w.constrain = wcon_new(s_w.model_path, cfg->vocab_size, cfg->vocab_size + s_w.extra_vocab_size);
    ls_info(0, "model ready: %s, %d layers, hidden %d, vocab %d, projections in %s; GPU pool of %d pages, each a KV block of %d "
               "tokens (%s) or adapter weights; %d adapter slots of rank up to %d; CPU tier %.1f MB (an adapter of rank %d "
               "on every target: %.1f MB, %d pages); rank %d of %d",
            ls_arch_name(cfg->arch), cfg->num_hidden_layers, cfg->hidden_size, cfg->vocab_size,
            ls_model_fp8(s_w.model) ? "FP8 (E4M3, per-channel scales)" : ls_dtype_name(ls_model_kv_dtype(s_w.model)), pages,
            s_w.block_size, ls_dtype_name(ls_kv_cache_dtype(s_w.kv)), s_w.max_loras_per_batch, s_w.max_lora_rank,
            (double)ls_lora_pool_stats(s_w.pool).host_total / 1e6, s_w.max_lora_rank,
            (double)ls_lora_pool_image_max_bytes(s_w.pool) / 1e6, ls_lora_pool_image_max_pages(s_w.pool), s_w.rank,
            s_w.tp_size);
    s_send_info(a);
    return 0;
}

// The communicator kind of the worker's backend: NCCL between GPUs, shared memory otherwise.
static ls_comm_kind_t s_comm_kind(void) {
    return strcmp(s_w.be->name, "cuda") == 0 ? LS_COMM_NCCL : LS_COMM_SHM;
}

static void s_join_timeout(ls_actor_t *a, ls_timer_t *t, void *arg) {
    s_w.join_timer = NULL;
    ls_error(0, "rank %d of the tensor-parallel group of %d: no TpComm from the scheduler after %d ms (did worker-0 "
                "or the scheduler fail to start? see their logs); giving up",
             s_w.rank, s_w.tp_size, s_w.tp_timeout_ms);
    ls_actor_shutdown(a, "tensor-parallel group not formed");
}

// Rank 0 of a group: the communicator id, to the scheduler, which hands it to every rank.
static int s_send_comm_id(ls_actor_t *a) {
    char err[512];
    ls_comm_id_t id;
    int rc = -1;
    if (s_comm_kind() == LS_COMM_SHM)
        rc = ls_comm_shm_id(s_w.tp_size, &id, err, sizeof err);
#ifdef LS_HAVE_NCCL
    else
        rc = ls_comm_nccl_id(s_w.tp_size, &id, err, sizeof err);
#else
    else
        snprintf(err, sizeof err, "this worker was built without NCCL, which --backend cuda needs for --tp-size > 1");
#endif
    if (rc < 0) {
        ls_error(0, "cannot create the tensor-parallel group: %s", err);
        return -1;
    }
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TP_COMM);
    m.u.tp_comm.kind = ls_msg_strdup(ls_comm_kind_name(id.kind));
    m.u.tp_comm.id.data = malloc(id.len);
    memcpy(m.u.tp_comm.id.data, id.bytes, id.len);
    m.u.tp_comm.id.len = id.len;
    m.u.tp_comm.tp_size = (uint32_t)s_w.tp_size;
    rc = ls_actor_send_peer(a, s_w.scheduler, &m, NULL);
    ls_msg_clear(&m);
    return rc;
}

static int s_start(ls_actor_t *a, void *state) {
    s_w.rank = ls_actor_rank(a);
    if (!s_w.model_path) {
        ls_error(0, "--model-path is required");
        return -1;
    }
    if (s_w.tp_size < 1 || s_w.rank < 0 || s_w.rank >= s_w.tp_size || s_w.tp_timeout_ms < 1 || s_w.max_running < 1 ||
        s_w.max_batched < 1 || s_w.extra_vocab_size < 0) {
        ls_error(0, "--rank %d must be within --tp-size %d; --tp-timeout-ms, --max-running-requests and "
                    "--max-num-batched-tokens positive; --lora-extra-vocab-size at least 0", s_w.rank, s_w.tp_size);
        return -1;
    }
    if (s_w.threads < 0) {
        ls_error(0, "--threads %d: the CPU backend's BLAS threads must be at least 0 (0: one a core)", s_w.threads);
        return -1;
    }
    // What a scheduler takes (WorkerInfo): a worker beyond it would never be served.
    if (s_w.kv_blocks > (int)LS_MAX_KV_BLOCKS || s_w.block_size > (int)LS_MAX_BLOCK_SIZE ||
        s_w.max_loras_per_batch > (int)LS_MAX_LORAS_PER_BATCH) {
        ls_error(0, "--kv-blocks %d, --block-size %d, --max-loras-per-batch %d: at most %u, %u and %u", s_w.kv_blocks,
                 s_w.block_size, s_w.max_loras_per_batch, LS_MAX_KV_BLOCKS, LS_MAX_BLOCK_SIZE, LS_MAX_LORAS_PER_BATCH);
        return -1;
    }
    if (strcmp(s_w.load_format, "auto") != 0 && strcmp(s_w.load_format, "dummy") != 0) {
        ls_error(0, "--load-format %s: auto or dummy", s_w.load_format);
        return -1;
    }
    if (strcmp(s_w.quantization, "none") != 0 && strcmp(s_w.quantization, "fp8") != 0) {
        ls_error(0, "--quantization %s: none (the checkpoint as stored; an FP8 checkpoint runs in FP8) or fp8",
                 s_w.quantization);
        return -1;
    }
    s_w.quant = strcmp(s_w.quantization, "fp8") == 0 ? LS_QUANT_FP8 : LS_QUANT_NONE;
    bool cuda = strcmp(s_w.backend_name, "cuda") == 0;
    if (!cuda && strcmp(s_w.backend_name, "cpu") != 0) {
        ls_error(0, "--backend %s: unknown backend (cpu or cuda)", s_w.backend_name);
        return -1;
    }
#ifndef LS_HAVE_CUDA
    if (cuda) {
        ls_error(0, "--backend cuda: this worker was built without CUDA (no nvcc at build time); use --backend cpu");
        return -1;
    }
#endif
    if (s_target_mask(&s_w.target_mask) < 0)
        return -1;
    if (!(s_w.confine = ls_confine_new(&s_w.lora_roots, &s_w.lora_dirs, &s_w.lora_paths, s_w.lora_tensors_dir))) {
        ls_error(0, "worker: cannot set up the adapter paths (out of memory or a malformed --lora-paths, above)");
        return -1;
    }
    if (cuda) {
#ifdef LS_HAVE_CUDA
        int device = s_w.device >= 0 ? s_w.device : s_w.rank;
        char err[1024];
        if (!(s_w.be = ls_backend_cuda_new(device, err, sizeof err))) {
            ls_error(0, "--backend cuda: cannot use GPU %d: %s", device, err);
            return -1;
        }
        ls_info(0, "cuda backend on GPU %d", device);
#endif
    } else if (!(s_w.be = ls_backend_cpu_new(s_w.threads))) {
        ls_error(0, "cannot create the %s backend", s_w.backend_name);
        return -1;
    }
    if (s_w.tp_size == 1)
        return s_load_engine(a);
    // Tensor parallel: the shard loads once the group is joined (s_on_tp_comm); Ready then.
    if (s_w.rank == 0 && s_send_comm_id(a) < 0)
        return -1;
    s_w.join_timer = ls_actor_timer_start(a, s_w.tp_timeout_ms, 0, s_join_timeout, NULL);
    return LS_READY_LATER;
}

static int s_on_tp_comm(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_tp_comm_t *tc = &in->msg->u.tp_comm;
    char err[1024];
    if (s_w.comm || s_w.tp_size == 1) {
        ls_warn(0, "TpComm from %s ignored: %s", in->from, s_w.comm ? "already in the group" : "--tp-size is 1");
        return 0;
    }
    if (s_w.join_timer)
        ls_actor_timer_stop(a, s_w.join_timer);
    s_w.join_timer = NULL;
    ls_comm_id_t id = {.kind = ls_comm_kind_from_name(tc->kind), .size = (int)tc->tp_size, .len = tc->id.len};
    if (id.kind != s_comm_kind() || id.size != s_w.tp_size || id.len == 0 || id.len > LS_COMM_ID_MAX) {
        ls_error(0, "TpComm for a %s group of %u does not fit this worker (%s backend, --tp-size %d); giving up",
                 tc->kind ? tc->kind : "?", tc->tp_size, s_w.be->name, s_w.tp_size);
        ls_actor_shutdown(a, "bad tensor-parallel group");
        return 0;
    }
    memcpy(id.bytes, tc->id.data, id.len);
    ls_info(0, "joining the tensor-parallel group (%s, %d ranks) as rank %d", tc->kind, s_w.tp_size, s_w.rank);
    if (id.kind == LS_COMM_SHM)
        s_w.comm = ls_comm_shm_join(&id, s_w.rank, s_w.be, s_w.tp_timeout_ms, err, sizeof err);
#ifdef LS_HAVE_NCCL
    else
        s_w.comm = ls_comm_nccl_join(&id, s_w.rank, s_w.be, s_w.tp_timeout_ms, err, sizeof err);
#else
    else
        snprintf(err, sizeof err, "this worker was built without NCCL");
#endif
    if (!s_w.comm) {
        ls_error(0, "%s; giving up", err);
        ls_actor_shutdown(a, "could not join the tensor-parallel group");
        return 0;
    }
    if (s_load_engine(a) < 0) {
        ls_actor_shutdown(a, "could not load the model shard");
        return 0;
    }
    ls_actor_ready(a);
    return 0;
}

static void s_destroy(ls_actor_t *a, void *state) {
    ls_confine_destroy(&s_w.confine);
    ls_history_destroy(&s_w.history);
    wcon_destroy(&s_w.constrain);
    ls_lora_pool_destroy(&s_w.pool);
    ls_kv_cache_destroy(&s_w.kv);
    ls_model_destroy(&s_w.model);
    ls_comm_destroy(&s_w.comm);
    ls_backend_destroy(&s_w.be);
}

// ---------------------------------------------------------------------------------------------
// steps

// A step's share of the time split (measured: /metrics, replay does not compare them) and the
// grammar masks' cache, as counters.
static void s_report_step(ls_actor_t *a) {
    ls_actor_measure(a, "step_forward_us_total", s_w.times.forward_ns / 1000);
    ls_actor_measure(a, "step_masks_us_total", s_w.times.masks_ns / 1000);
    ls_actor_measure(a, "step_sample_us_total", s_w.times.sample_ns / 1000);
    s_w.times = (wstep_times_t){0};
    uint64_t hits = 0, misses = 0;
    if (s_w.constrain)
        wcon_mask_counts(s_w.constrain, &hits, &misses);
    ls_actor_counter_set(a, "grammar_mask_hits", hits);
    ls_actor_counter_set(a, "grammar_mask_misses", misses);
}

static int s_on_step_plan(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_step_plan_t *plan = &in->msg->u.step_plan;
    uint64_t t0 = ls_mono_ns();  // a measurement (elapsed_us), not a decision: the clock itself
    char err[1024];
    ls_msg_t m;
    int n_rows;
    wstep_engine_t e = s_engine();
    int rc = wstep_run(&e, plan, &m, &n_rows, err, sizeof err);
    if (rc < 0) {
        ls_error(0, "step %llu failed: %s", (unsigned long long)plan->step, err);
        ls_actor_count(a, "steps_failed", 1);
        wstep_fail(plan, &m);
    } else if (plan->items.n == 0) {
        ls_msg_clear(&m);
        return 0;
    } else {
        ls_actor_count(a, "steps", 1);
        ls_actor_count(a, "tokens_sampled", (uint64_t)n_rows);
    }
    s_report_step(a);
    // Tensor parallel: only rank 0 answers.
    if (s_w.rank == 0) {
        m.rid = in->msg->rid;
        // The loop's clock stands still inside a handler; elapsed time is measured here, and
        // it is a report, not an input to any decision.
        m.u.step_result.elapsed_us = (ls_mono_ns() - t0) / 1000;
        ls_actor_reply(a, in, &m);
    }
    ls_msg_clear(&m);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// adapters

// A load in flight: the job thread reads the files and builds the adapter's image in the
// pool's host tier (ls_lora_pool_image_new may run beside the loop); the loop adds it.
typedef struct {
    ls_route_t *route;
    uint64_t rid;
    char *name, *adapter_id, *path;
    ls_model_config_t cfg;
    int max_rank;
    ls_lora_pool_t *pool;
    ls_lora_image_t *image;  // set by the job
    bool full;               // the job found the CPU tier full
    uint64_t load_us;        // the job's wall time
    uint32_t epoch;          // s_w.scheduler_epoch when it began
    char err[1024];
} s_load_t;

static void s_load_work(void *arg) {
    s_load_t *l = arg;
    uint64_t t0 = ls_mono_ns();
    // On the job thread: the check reads the filesystem, and the confinement never changes.
    if (ls_confine_check(s_w.confine, l->path, l->err, sizeof l->err) < 0)
        return;
    ls_adapter_t *ad = ls_adapter_load(l->path, &l->cfg, l->max_rank, l->err, sizeof l->err);
    if (ad)
        l->image = ls_lora_pool_image_new(l->pool, ad, &l->full, l->err, sizeof l->err);
    ls_adapter_destroy(&ad);
    l->load_us = (ls_mono_ns() - t0) / 1000;
}

// rank, bytes and pages: the image's, when ok.
static void s_answer_loaded(ls_actor_t *a, s_load_t *l, int ok, uint32_t code, const char *reason, int rank,
                            size_t bytes, int pages) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
    m.rid = l->rid;
    m.u.adapter_loaded.ok = ok;
    m.u.adapter_loaded.name = ls_msg_strdup(l->name);
    m.u.adapter_loaded.adapter_id = ls_msg_strdup(l->adapter_id);
    m.u.adapter_loaded.code = code;
    m.u.adapter_loaded.reason = ls_msg_strdup(reason);
    m.u.adapter_loaded.rank = (uint32_t)rank;
    m.u.adapter_loaded.bytes = bytes;
    m.u.adapter_loaded.pages = (uint32_t)pages;
    m.u.adapter_loaded.load_us = l->load_us;
    ls_actor_send_route(a, l->route, &m, NULL);
    ls_msg_clear(&m);
}

static void s_load_free(s_load_t *l) {
    ls_lora_pool_image_destroy(s_w.pool, &l->image);
    ls_route_destroy(&l->route);
    free(l->name);
    free(l->adapter_id);
    free(l->path);
    free(l);
}

// An adapter's load for the launcher's console: its start (bytes 0, the size not known yet) and
// its end (bytes in the CPU tier).
static void s_adapter_progress(ls_actor_t *a, const s_load_t *l, size_t bytes) {
    char what[160];
    snprintf(what, sizeof what, "adapter %s", l->name);
    s_progress_send(a, what, bytes, bytes);
}

static void s_load_done(ls_actor_t *a, void *arg) {
    s_load_t *l = arg;
    char err[1024];
    if (l->epoch != s_w.scheduler_epoch) {
        // The scheduler that asked went down meanwhile; its restart knows nothing of this load
        // and will ask again for what it wants.
        ls_info(l->rid, "adapter %s read, but the scheduler that asked for it is gone: dropped", l->name);
        s_load_free(l);
        return;
    }
    if (!l->image) {
        ls_warn(l->rid, "adapter %s (%s) not loaded: %s", l->name, l->path, l->err);
        // a full tier is the scheduler's to fix (it makes room first); anything else is the adapter's fault
        s_answer_loaded(a, l, 0, l->full ? LS_ERROR_CODE_UNAVAILABLE : LS_ERROR_CODE_BAD_REQUEST, l->err, 0, 0, 0);
    } else {
        int rank = ls_lora_image_rank(l->image), pages = ls_lora_image_pages(l->image);
        size_t bytes = ls_lora_image_bytes(l->image);
        ls_lora_image_t *img = l->image;
        l->image = NULL;  // the pool's once added; the failure path below gives it back
        if (ls_lora_pool_add(s_w.pool, l->adapter_id, &img, err, sizeof err) < 0) {
            ls_warn(l->rid, "adapter %s not added: %s", l->name, err);
            l->image = img;
            s_answer_loaded(a, l, 0, LS_ERROR_CODE_UNAVAILABLE, err, 0, 0, 0);
        } else {
            ls_info(l->rid, "adapter %s loaded from %s: rank %d, %.1f MB in the CPU tier, %.1f ms", l->name, l->path,
                    rank, (double)bytes / 1e6, (double)l->load_us / 1e3);
            ls_actor_count(a, "adapters_loaded", 1);
            s_adapter_progress(a, l, bytes);
            s_answer_loaded(a, l, 1, 0, NULL, rank, bytes, pages);
        }
    }
    s_load_free(l);
}

static int s_on_load_adapter(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_load_adapter_t *req = &in->msg->u.load_adapter;
    s_load_t *l = calloc(1, sizeof *l);
    l->route = ls_route_new(in);
    l->rid = in->msg->rid;
    l->name = ls_msg_strdup(req->name ? req->name : "");
    l->adapter_id = ls_msg_strdup(req->adapter_id ? req->adapter_id : "");
    l->path = ls_msg_strdup(req->path ? req->path : "");
    l->cfg = *ls_model_config(s_w.model);
    l->max_rank = s_w.max_lora_rank;
    l->pool = s_w.pool;
    l->epoch = s_w.scheduler_epoch;
    const char *why = NULL;
    if (!*l->adapter_id)
        why = "LoadAdapter without adapter_id (the registry assigns one)";
    else if (req->from_tensors)
        why = "loading adapters from tensors is not supported by this worker yet";
    else if (!*l->path)
        why = "LoadAdapter without a path";
    else if (req->slot >= 0)
        why = "LoadAdapter loads into the CPU tier only (slot -1): PrefetchAdapter fills GPU slots, on the pages it names";
    if (why) {
        s_answer_loaded(a, l, 0, LS_ERROR_CODE_BAD_REQUEST, why, 0, 0, 0);
        s_load_free(l);
        return -1;
    }
    // Loads are idempotent: a scheduler that lost track (its restart, a retried rollback) asks
    // again for what this worker holds.
    int rank, pages;
    size_t bytes;
    if (ls_lora_pool_image_info(s_w.pool, l->adapter_id, &rank, &bytes, &pages) == 0) {
        s_answer_loaded(a, l, 1, 0, NULL, rank, bytes, pages);
        s_load_free(l);
        return 0;
    }
    // Disk reads and validation off the loop: steps keep running meanwhile.
    s_adapter_progress(a, l, 0);
    if (ls_actor_job(a, s_load_work, s_load_done, l) < 0) {
        s_answer_loaded(a, l, 0, LS_ERROR_CODE_INTERNAL, "cannot start the load job", 0, 0, 0);
        s_load_free(l);
        return -1;
    }
    return 0;
}

static int s_on_unload_adapter(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_unload_adapter_t *req = &in->msg->u.unload_adapter;
    char err[512];
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
    m.rid = in->msg->rid;
    m.u.adapter_unloaded.name = ls_msg_strdup(req->name);
    m.u.adapter_unloaded.adapter_id = ls_msg_strdup(req->adapter_id);
    if (req->adapter_id && ls_lora_pool_remove(s_w.pool, req->adapter_id, err, sizeof err) == 0) {
        m.u.adapter_unloaded.ok = 1;
        ls_info(in->msg->rid, "adapter %s unloaded", req->name ? req->name : req->adapter_id);
    } else {
        m.u.adapter_unloaded.code = LS_ERROR_CODE_NOT_FOUND;
        m.u.adapter_unloaded.reason = ls_msg_strdup(req->adapter_id ? err : "UnloadAdapter without adapter_id");
    }
    int rc = ls_actor_reply(a, in, &m);
    ls_msg_clear(&m);
    return rc;
}

static int s_on_prefetch_adapter(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_prefetch_adapter_t *req = &in->msg->u.prefetch_adapter;
    char err[512];
    // On the CPU backend the copy is synchronous; a step naming this slot later finds it done.
    wstep_engine_t e = s_engine();
    if (wstep_prefetch(&e, req, err, sizeof err) < 0) {
        ls_warn(in->msg->rid, "prefetch of %s into slot %d failed: %s", req->adapter_id ? req->adapter_id : "?",
                req->slot, err);
        return -1;
    }
    ls_actor_count(a, "prefetches", 1);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// supervision

// The launcher's news of the graph. The scheduler went down: the adapters it placed and the
// requests it ran are forgotten (a restarted scheduler knows none of them and places the
// registry's adapters again). It is Ready again: it learns what this worker holds (WorkerInfo).
static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    if (!ps->actor || strcmp(ps->actor, s_w.scheduler) != 0 || !s_w.pool)
        return 0;
    if (!ps->up) {
        ls_warn(0, "the scheduler went down: dropping every adapter and request");
        s_w.scheduler_epoch++;  // and the loads still on the job thread
        ls_lora_pool_clear(s_w.pool);
        ls_history_destroy(&s_w.history);
        s_w.history = ls_history_new();
        wcon_destroy(&s_w.constrain);
        s_w.constrain = wcon_new(s_w.model_path, ls_model_config(s_w.model)->vocab_size,
                                 ls_model_config(s_w.model)->vocab_size + s_w.extra_vocab_size);
    } else if (ps->restarts > 0)
        s_send_info(a);
    return 0;
}

// ---------------------------------------------------------------------------------------------

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_STEP_PLAN, s_on_step_plan},
    {LS_MSG_LOAD_ADAPTER, s_on_load_adapter},
    {LS_MSG_UNLOAD_ADAPTER, s_on_unload_adapter},
    {LS_MSG_PREFETCH_ADAPTER, s_on_prefetch_adapter},
    {LS_MSG_TP_COMM, s_on_tp_comm},
    {0, NULL},
};

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("model-path", &s_w.model_path, NULL, "HF model directory (config.json + safetensors)"),
        LS_FLAG_STR("load-format", &s_w.load_format, "auto",
                    "auto (the checkpoint) or dummy (random weights of config.json's shapes, no checkpoint)"),
        LS_FLAG_STR("quantization", &s_w.quantization, "none",
                    "none (the checkpoint as stored; an FP8 checkpoint runs in FP8) or fp8 (the projections "
                    "quantized to E4M3 at load)"),
        LS_FLAG_STR("backend", &s_w.backend_name, "cpu", "compute backend: cpu or cuda (builds with nvcc)"),
        LS_FLAG_INT("device", &s_w.device, "-1", "GPU of the cuda backend (-1: the worker's rank)"),
        LS_FLAG_INT("kv-cache-mb", &s_w.kv_cache_mb, "256",
                    "GPU pool size when --kv-blocks is not given: the KV cache and the adapters in GPU slots share "
                    "its pages (docs/memory.md)"),
        LS_FLAG_INT("kv-blocks", &s_w.kv_blocks, "0", "GPU pool pages, each a KV block or adapter weights (0: from --kv-cache-mb)"),
        LS_FLAG_INT("block-size", &s_w.block_size, "16", "tokens per KV block"),
        LS_FLAG_INT("max-loras-per-batch", &s_w.max_loras_per_batch, LS_LIMITS_STR(LS_DEFAULT_MAX_LORAS_PER_BATCH),
                    "adapter slots (distinct adapters in a step): handles; adapters' weights take pool pages by their rank"),
        LS_FLAG_INT("max-lora-rank", &s_w.max_lora_rank, "64", "largest adapter rank"),
        LS_FLAG_INT("lora-extra-vocab-size", &s_w.extra_vocab_size, "0",
                    "rows of the embedding and of lm_head a slot holds for its adapter's trainable tokens; 0: none"),
        LS_FLAG_INT("max-loaded-loras", &s_w.max_loaded_loras, "0",
                    "most adapters the CPU tier holds (0: as many as --max-cpu-lora-mb allows)"),
        LS_FLAG_INT("max-cpu-lora-mb", &s_w.max_cpu_lora_mb, "0",
                    "host memory for adapters (the CPU tier), in MB; adapters take it in proportion to their rank "
                    "and targets (0: room for 64 adapters of --max-lora-rank on every target, at most a quarter "
                    "of the machine's memory)"),
        LS_FLAG_LIST("lora-target-modules", &s_w.target_modules, "modules adapters may target (default, all: the seven of a layer; embed_tokens, lm_head when named)"),
        LS_FLAG_LIST("lora-roots", &s_w.lora_roots, "adapter paths must resolve under one of these (as the registry's)"),
        LS_LORA_TENSORS_DIR_FLAG(&s_w.lora_tensors_dir),
        LS_FLAG_LIST("lora-dirs", &s_w.lora_dirs, "... or under one of these"),
        LS_FLAG_LIST("lora-paths", &s_w.lora_paths, "... or be one of these adapters (name=path[:pinned], a path, or JSON: see docs/adapters.md)"),
        LS_FLAG_INT("threads", &s_w.threads, "1",
                    "CPU backend BLAS threads (0: OpenBLAS's default, one a core; docs/operations.md)"),
        LS_FLAG_INT("tp-size", &s_w.tp_size, "1", "workers in this tensor-parallel group"),
        LS_SCHEDULER_FLAG(&s_w.scheduler),
        LS_FLAG_INT("max-running-requests", &s_w.max_running, LS_LIMITS_STR(LS_DEFAULT_MAX_RUNNING_REQUESTS),
                    "requests one step may carry, as the scheduler's flag; a bigger StepPlan is refused"),
        LS_FLAG_INT("max-num-batched-tokens", &s_w.max_batched, LS_LIMITS_STR(LS_DEFAULT_MAX_NUM_BATCHED_TOKENS),
                    "tokens one step may carry, as the scheduler's flag; a bigger StepPlan is refused"),
        LS_FLAG_INT("tp-timeout-ms", &s_w.tp_timeout_ms, "60000",
                    "tensor parallel: longest wait for the group to form, and for the other ranks at a collective"),
        LS_FLAG_END,
    };
    const ls_actor_def_t def = {
        .name = "worker",
        .about = "loraserve worker: runs step plans on one device",
        .dispatch = s_dispatch,
        .flags = flags,
        .on_start = s_start,
        .on_destroy = s_destroy,
    };
    return ls_actor_main(argc, argv, &def);
}
