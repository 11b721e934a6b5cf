// scheduler — continuous batching over one group of workers (docs/scheduling.md).
//
// Accepts: TokenizedReq, Abort (tokenizer, detokenizer, or a test client, on the ROUTER);
//          LoadAdapter, UnloadAdapter (registry, tokenizer or a test client); ListAdapters
//          (the registry, for residency: answered with AdapterList);
//          WorkerInfo, StepResult, AdapterLoaded, AdapterUnloaded (from its workers: worker-0 …
//          worker-N-1, or P0 … P(N-1) with --worker-prefix P);
//          TpComm (from worker-0: the tensor-parallel group's communicator, relayed to every
//          worker of the group, worker-0 included);
//          PeerStatus (the launcher: a worker, the tokenizer or the detokenizer went down);
//          and the lifecycle messages every actor handles (Heartbeat, Shutdown, GetMetrics).
// Emits:   StepPlan, LoadAdapter, UnloadAdapter, PrefetchAdapter (to every worker);
//          TokenOut (to the detokenizer, or with --output route back on the request's route);
//          AdapterLoaded, AdapterUnloaded, Error (to whoever asked); with --report-ends,
//          RequestEnded to a request's sender once the request is done (the dispatcher counts
//          its groups' load with it); Ready, Heartbeat, Metrics.
//
// Every decision is the core's (sched.c, which has no sockets, so its tests need none); this
// file wires the sockets, flags, a wake-up timer and the counters to it.
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ls_actor.h"
#include "ls_confine.h"
#include "ls_limits.h"
#include "sched.h"

typedef struct {
    int tp_size, max_batched, max_running, chunk, max_skip, default_max_new, step_timeout_ms, load_timeout_ms;
    int max_waiting, max_tenant_waiting, max_queued_tokens;
    char *output, *eviction;
    char *worker_prefix;  // its workers are <prefix>0 … <prefix>(tp-1)
    int report_ends;      // RequestEnded to each request's sender when it is done
    int no_overlap;       // one step in flight
    int output_route;  // TokenOut back on the request's route instead of to the detokenizer
    ls_strlist_t lora_roots, lora_dirs, lora_paths;
    char *lora_tensors_dir;
    ls_confine_t *confine;  // where adapter paths may point: checked here too, not only at the registry
    ls_actor_t *actor;
    sched_t *core;
    ls_timer_t *wake;
} app_t;

static app_t s_app;

static ls_flag_t s_flags[] = {
    LS_FLAG_INT("tp-size", &s_app.tp_size, "1", "workers in the group: worker-0 … worker-(N-1)"),
    LS_FLAG_STR("worker-prefix", &s_app.worker_prefix, "worker-",
                "its workers' names less the rank (worker-G- for data-parallel group G)"),
    LS_FLAG_BOOL("report-ends", &s_app.report_ends,
                 "tell each request's sender when the request is done (RequestEnded; the dispatcher needs it)"),
    LS_FLAG_STR("output", &s_app.output, "detokenizer",
                "where TokenOut goes: detokenizer (the peer) or route (back to the request's sender)"),
    LS_FLAG_INT("max-num-batched-tokens", &s_app.max_batched, LS_LIMITS_STR(LS_DEFAULT_MAX_NUM_BATCHED_TOKENS),
                "token budget of one step"),
    LS_FLAG_INT("max-running-requests", &s_app.max_running, LS_LIMITS_STR(LS_DEFAULT_MAX_RUNNING_REQUESTS),
                "requests decoded at once"),
    LS_FLAG_INT("chunked-prefill-size", &s_app.chunk, LS_LIMITS_STR(LS_DEFAULT_CHUNKED_PREFILL_SIZE), "prompt tokens of one request in one step"),
    LS_FLAG_INT("max-skip-steps", &s_app.max_skip, LS_LIMITS_STR(LS_DEFAULT_MAX_SKIP_STEPS),
                "aging bound: steps a waiting request may be passed over before it goes first"),
    LS_FLAG_INT("default-max-new-tokens", &s_app.default_max_new, LS_LIMITS_STR(LS_DEFAULT_MAX_NEW_TOKENS), "max_new_tokens when a request gives none"),
    LS_FLAG_STR("lora-eviction-policy", &s_app.eviction, "lru", "GPU slot victim: lru or fifo"),
    LS_FLAG_BOOL("disable-overlap-schedule", &s_app.no_overlap,
                 "send each plan only once the step before it has answered (SGLang's flag); by default the next plan "
                 "goes out while a step runs, with one worker in the group"),
    LS_FLAG_INT("step-timeout-ms", &s_app.step_timeout_ms, "30000",
                "no StepResult this long after a plan: the workers are declared down"),
    LS_FLAG_INT("load-timeout-ms", &s_app.load_timeout_ms, "120000",
                "no answer to an adapter load/unload this long: it failed"),
    LS_FLAG_LIST("lora-roots", &s_app.lora_roots, "adapter paths must resolve under one of these (as the registry's)"),
    LS_LORA_TENSORS_DIR_FLAG(&s_app.lora_tensors_dir),
    LS_FLAG_LIST("lora-dirs", &s_app.lora_dirs, "... or under one of these"),
    LS_FLAG_LIST("lora-paths", &s_app.lora_paths, "... or be one of these adapters (name=path[:pinned], a path, or JSON: see docs/adapters.md)"),
    LS_FLAG_INT("max-waiting-requests", &s_app.max_waiting, "4096",
                "requests waiting to run, all tenants together; more are refused at once (HTTP 429)"),
    LS_FLAG_INT("max-tenant-waiting", &s_app.max_tenant_waiting, "1024",
                "requests waiting to run for one tenant (an adapter, or the base model); more: 429"),
    LS_FLAG_INT("max-queued-tokens", &s_app.max_queued_tokens, "4194304",
                "prompt tokens of the waiting requests together; more: 429 (a longer prompt: 413)"),
    LS_FLAG_END,
};

// Counters for GetMetrics, copied from the core's stats after every event; G: a gauge (a
// level that moves both ways), C: a count.
static const struct {
    const char *name;
    size_t offset;
    bool gauge;
} s_counters[] = {
#define C(name, field) {name, offsetof(sched_stats_t, field), false}
#define G(name, field) {name, offsetof(sched_stats_t, field), true}
    G("queue_length", waiting),
    G("running_requests", running),
    G("kv_blocks_used", kv_blocks_used),
    G("kv_blocks_total", kv_blocks_total),
    G("kv_blocks_cached", kv_blocks_cached),
    G("kv_blocks_adapters", kv_blocks_adapters),
    G("adapter_request_refs", adapter_refs),
    G("adapter_cpu_resident", adapter_cpu_resident),
    G("adapter_gpu_resident", adapter_gpu_resident),
    G("adapter_cpu_bytes_used", adapter_cpu_bytes_used),
    G("adapter_cpu_bytes_total", adapter_cpu_bytes_total),
    G("adapter_loads_waiting", adapter_loads_waiting),
    G("kv_block_size", kv_block_size),
    G("lora_slots", lora_slots),
    C("steps", steps),
    C("step_roundtrip_us_total", step_roundtrip_us),
    C("step_worker_us_total", step_worker_us),
    C("tokens_generated", tokens_generated),
    C("prefix_hit_tokens", prefix_hit_tokens),
    C("adapter_residency_hits", adapter_residency_hits),
    C("adapter_cold_loads", adapter_cold_loads),
    C("adapter_prefetches", adapter_prefetches),
    C("adapter_cpu_loads", adapter_cpu_loads),
    C("adapter_cpu_load_us_total", adapter_cpu_load_us),
    C("adapter_cpu_evictions", adapter_cpu_evictions),
    C("adapter_page_evictions", adapter_page_evictions),
    C("preemptions", preemptions),
    G("max_skipped_steps", max_skipped),
    C("requests_finished", requests_finished),
    C("requests_aborted", requests_aborted),
    C("requests_failed", requests_failed),
    C("requests_refused", requests_refused),
    C("requests_overloaded", requests_overloaded),
    C("step_timeouts", step_timeouts),
#undef C
#undef G
};

static void s_worker_name(int rank, char *out, size_t cap) { snprintf(out, cap, "%s%d", s_app.worker_prefix, rank); }

// A reply handle given to the core: the route back to the asker and, for a request, its rid,
// which RequestEnded names when the core releases the handle (the request is done).
typedef struct {
    ls_route_t *route;
    uint64_t rid;
    bool request;
} reply_t;

static reply_t *s_reply_new(const ls_in_t *in, bool request) {
    reply_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;  // the core answers nobody
    r->route = ls_route_new(in);
    r->rid = in->msg->rid;
    r->request = request;
    return r;
}

static void s_emit(void *arg, const sched_dest_t *d, const ls_msg_t *msg) {
    app_t *app = arg;
    char name[64];
    switch (d->kind) {
    case SCHED_TO_WORKERS:
        for (int r = 0; r < app->tp_size; r++) {
            s_worker_name(r, name, sizeof name);
            ls_actor_send_peer(app->actor, name, msg, NULL);
        }
        return;
    case SCHED_TO_WORKER:
        s_worker_name(d->rank, name, sizeof name);
        ls_actor_send_peer(app->actor, name, msg, NULL);
        return;
    case SCHED_TO_OUTPUT:
        if (!app->output_route) {
            ls_actor_send_peer(app->actor, "detokenizer", msg, NULL);
            return;
        }
        break;  // back on the request's route, like an answer
    case SCHED_TO_REPLY:
        break;
    }
    if (d->reply)
        ls_actor_send_route(app->actor, ((reply_t *)d->reply)->route, msg, NULL);
    else
        ls_debug(msg->rid, "%s has nobody to go to", ls_msg_type_name(msg->type));
}

static void s_release(void *arg, void *reply) {
    app_t *app = arg;
    reply_t *r = reply;
    if (r->request && app->report_ends) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_REQUEST_ENDED);
        m.rid = r->rid;
        ls_actor_send_route(app->actor, r->route, &m, NULL);
        ls_msg_clear(&m);
    }
    ls_route_destroy(&r->route);
    free(r);
}

static void s_on_wake(ls_actor_t *a, ls_timer_t *t, void *arg);

// After every event: publish the counters, arm the timer for the core's next deadline.
static void s_sync(app_t *app) {
    const sched_stats_t *st = sched_stats(app->core);
    for (size_t i = 0; i < sizeof s_counters / sizeof s_counters[0]; i++) {
        uint64_t v = *(const uint64_t *)((const char *)st + s_counters[i].offset);
        (s_counters[i].gauge ? ls_actor_gauge_set : ls_actor_counter_set)(app->actor, s_counters[i].name, v);
    }
    uint64_t when = sched_next_wake(app->core), now = ls_actor_now_ns(app->actor);
    if (!when) {
        if (app->wake)
            ls_actor_timer_stop(app->actor, app->wake);
        app->wake = NULL;
        return;
    }
    double after_ms = when > now ? (double)(when - now) / 1e6 : 0;
    if (app->wake)
        ls_actor_timer_again(app->actor, app->wake, after_ms);
    else
        app->wake = ls_actor_timer_start(app->actor, after_ms, 0, s_on_wake, app);
}

// The adapters of the running and of the waiting requests, for the gateway's
// vllm:lora_requests_info (docs/api.md): built when asked, since they take a walk of the
// queues. Each list names at most the slot count (and SCHED_MAX_LISTED): no more adapters can
// run at once, and the waiting ones listed are those first in line. The buffer holds that
// many names of the registry's longest (128 bytes) with their commas.
static void s_on_metrics(ls_actor_t *a, ls_msg_metrics_t *m, void *state) {
    app_t *app = state;
    static char list[SCHED_MAX_LISTED * 129];
    if (!app->core)
        return;
    int max = (int)sched_stats(app->core)->lora_slots;
    sched_adapter_names(app->core, true, max, list, sizeof list);
    ls_actor_info(a, "running_lora_adapters", list);
    sched_adapter_names(app->core, false, max, list, sizeof list);
    ls_actor_info(a, "waiting_lora_adapters", list);
}

static void s_on_wake(ls_actor_t *a, ls_timer_t *t, void *arg) {
    app_t *app = arg;
    sched_on_tick(app->core, ls_actor_now_ns(a));
    s_sync(app);
}

// A worker's rank from its name (<prefix>N, N < --tp-size); -1 for anyone else.
static int s_rank_of_name(const char *name) {
    size_t k = strlen(s_app.worker_prefix);
    int rank, n = -1;
    if (strncmp(name, s_app.worker_prefix, k) != 0)
        return -1;
    if (sscanf(name + k, "%d%n", &rank, &n) == 1 && n == (int)strlen(name + k) && rank >= 0 && rank < s_app.tp_size)
        return rank;
    return -1;
}

static int s_rank_of(const ls_in_t *in) { return s_rank_of_name(in->from); }

static int s_on_request(ls_actor_t *a, ls_in_t *in, void *state) {
    sched_on_request(((app_t *)state)->core, in->now_ns, in->msg, s_reply_new(in, true));
    s_sync(state);
    return 0;
}

static int s_on_abort(ls_actor_t *a, ls_in_t *in, void *state) {
    sched_on_abort(((app_t *)state)->core, in->now_ns, in->msg);
    s_sync(state);
    return 0;
}

// A LoadAdapter's path is checked here as at the registry: whoever reached this socket may
// have sent it. The verdict reads the filesystem, so it is a recorded input (replay takes it
// from the trace).
static int s_path_refused(app_t *app, const ls_in_t *in) {
    char err[768] = "";
    ls_confine_check(app->confine, in->msg->u.load_adapter.path, err, sizeof err);
    zmsg_t *verdict = zmsg_new();
    zmsg_addstr(verdict, err);
    ls_actor_input(app->actor, "scheduler.confine", &verdict);
    char *why = zmsg_popstr(verdict);
    zmsg_destroy(&verdict);
    int refused = why && *why;
    if (refused) {
        ls_warn(in->msg->rid, "LoadAdapter %s refused: %s", in->msg->u.load_adapter.name ? in->msg->u.load_adapter.name : "?",
                why);
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
        m.rid = in->msg->rid;
        m.u.adapter_loaded.name = ls_msg_strdup(in->msg->u.load_adapter.name);
        m.u.adapter_loaded.adapter_id = ls_msg_strdup(in->msg->u.load_adapter.adapter_id);
        m.u.adapter_loaded.code = LS_ERROR_CODE_BAD_REQUEST;
        m.u.adapter_loaded.reason = ls_msg_strdup(why);
        ls_actor_reply(app->actor, in, &m);
        ls_msg_clear(&m);
    }
    free(why);
    return refused;
}

static int s_on_load(ls_actor_t *a, ls_in_t *in, void *state) {
    if (!ls_confine_open(((app_t *)state)->confine) && s_path_refused(state, in))
        return 0;
    sched_on_load_adapter(((app_t *)state)->core, in->now_ns, in->msg, s_reply_new(in, false));
    s_sync(state);
    return 0;
}

static int s_on_unload(ls_actor_t *a, ls_in_t *in, void *state) {
    sched_on_unload_adapter(((app_t *)state)->core, in->now_ns, in->msg, s_reply_new(in, false));
    s_sync(state);
    return 0;
}

static int s_on_worker_info(ls_actor_t *a, ls_in_t *in, void *state) {
    sched_on_worker_info(((app_t *)state)->core, in->now_ns, in->msg);
    s_sync(state);
    return 0;
}

static int s_on_step_result(ls_actor_t *a, ls_in_t *in, void *state) {
    if (s_rank_of(in) != 0) {
        ls_warn(in->msg->rid, "StepResult from %s ignored: results come from %s0", in->from, s_app.worker_prefix);
        return 0;
    }
    sched_on_step_result(((app_t *)state)->core, in->now_ns, in->msg);
    s_sync(state);
    return 0;
}

static int s_on_adapter_answer(ls_actor_t *a, ls_in_t *in, void *state) {
    sched_on_adapter_answer(((app_t *)state)->core, in->now_ns, s_rank_of(in), in->msg);
    s_sync(state);
    return 0;
}

// The core has no part in forming the group: the id only passes through, to every rank.
static int s_on_tp_comm(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    if (s_rank_of(in) != 0) {
        ls_warn(0, "TpComm from %s ignored: the group's id comes from %s0", in->from, app->worker_prefix);
        return 0;
    }
    ls_info(0, "relaying the tensor-parallel group's %s id to %d workers",
            in->msg->u.tp_comm.kind ? in->msg->u.tp_comm.kind : "?", app->tp_size);
    s_emit(app, &(sched_dest_t){.kind = SCHED_TO_WORKERS}, in->msg);
    return 0;
}

static int s_on_list(ls_actor_t *a, ls_in_t *in, void *state) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
    m.rid = in->msg->rid;
    sched_list_adapters(((app_t *)state)->core, &m);
    int rc = ls_actor_reply(a, in, &m);
    ls_msg_clear(&m);
    return rc;
}

// The launcher's news of the graph (docs/operations.md, "Supervision"). A restarted worker
// sends WorkerInfo by itself; what matters here is who went down.
static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    if (ps->up || !ps->actor)
        return 0;
    char why[300];
    snprintf(why, sizeof why, "%s went down (%s)", ps->actor, ps->reason ? ps->reason : "");
    // Requests come from the tokenizer, or through the dispatcher with --dp-size > 1: either
    // gone, nobody reads their answers (the tokenizer answers the clients).
    if (s_rank_of_name(ps->actor) >= 0)
        sched_on_worker_down(app->core, in->now_ns, why);
    else if (!strcmp(ps->actor, "tokenizer") || !strcmp(ps->actor, "dispatcher") ||
             (!app->output_route && !strcmp(ps->actor, "detokenizer")))
        sched_abort_all(app->core, in->now_ns, why);
    s_sync(app);
    return 0;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_LIST_ADAPTERS, s_on_list},
    {LS_MSG_TOKENIZED_REQ, s_on_request},
    {LS_MSG_ABORT, s_on_abort},
    {LS_MSG_LOAD_ADAPTER, s_on_load},
    {LS_MSG_UNLOAD_ADAPTER, s_on_unload},
    {LS_MSG_WORKER_INFO, s_on_worker_info},
    {LS_MSG_STEP_RESULT, s_on_step_result},
    {LS_MSG_ADAPTER_LOADED, s_on_adapter_answer},
    {LS_MSG_ADAPTER_UNLOADED, s_on_adapter_answer},
    {LS_MSG_TP_COMM, s_on_tp_comm},
    {0, NULL},
};

static int s_start(ls_actor_t *a, void *state) {
    app_t *app = state;
    app->actor = a;
    int bad_output = strcmp(app->output, "detokenizer") != 0 && strcmp(app->output, "route") != 0;
    int bad_policy = strcmp(app->eviction, "lru") != 0 && strcmp(app->eviction, "fifo") != 0;
    if (bad_output || bad_policy || app->tp_size < 1 || app->tp_size > 32 || app->max_batched < 1 ||
        app->max_running < 1 || app->chunk < 1 || app->max_skip < 0 || app->default_max_new < 1 ||
        app->step_timeout_ms < 1 || app->load_timeout_ms < 1 || app->max_waiting < 1 || app->max_tenant_waiting < 1 ||
        app->max_queued_tokens < 1) {
        ls_error(0, "bad flags: --output detokenizer|route, --lora-eviction-policy lru|fifo, --tp-size 1..32, "
                    "and positive sizes and timeouts");
        return -1;
    }
    app->output_route = strcmp(app->output, "route") == 0;
    for (int r = 0; r < app->tp_size; r++) {
        char name[32];
        s_worker_name(r, name, sizeof name);
        if (!ls_actor_has_peer(a, name))
            ls_warn(0, "no --peer %s=…: plans for it have nowhere to go", name);
    }
    if (!app->output_route && !ls_actor_has_peer(a, "detokenizer"))
        ls_warn(0, "no --peer detokenizer=…: with --output detokenizer tokens have nowhere to go");
    const sched_config_t cfg = {
        .tp_size = app->tp_size,
        .max_num_batched_tokens = app->max_batched,
        .max_running_requests = app->max_running,
        .chunked_prefill_size = app->chunk,
        .max_skip_steps = app->max_skip,
        .default_max_new_tokens = app->default_max_new,
        .eviction = strcmp(app->eviction, "fifo") == 0 ? LORA_EVICT_FIFO : LORA_EVICT_LRU,
        .step_timeout_ns = (uint64_t)app->step_timeout_ms * 1000000u,
        .load_timeout_ns = (uint64_t)app->load_timeout_ms * 1000000u,
        .max_waiting_requests = (uint32_t)app->max_waiting,
        .max_tenant_waiting = (uint32_t)app->max_tenant_waiting,
        .max_queued_tokens = (uint64_t)app->max_queued_tokens,
        .overlap = !app->no_overlap,
    };
    if (!(app->confine = ls_confine_new(&app->lora_roots, &app->lora_dirs, &app->lora_paths, app->lora_tensors_dir))) {
        ls_error(0, "scheduler: cannot set up the adapter paths (out of memory or a malformed --lora-paths, above)");
        return -1;
    }
    if (ls_confine_open(app->confine))
        ls_warn(0, "no --lora-roots, --lora-dirs or --lora-paths: adapter paths are not checked here");
    const sched_io_t io = {.emit = s_emit, .release = s_release, .arg = app};
    app->core = sched_new(&cfg, &io);
    if (!app->core) {
        ls_error(0, "cannot create the scheduler core");
        return -1;
    }
    s_sync(app);
    return 0;
}

static void s_shutdown(ls_actor_t *a, void *state) {
    app_t *app = state;
    if (app->core)
        sched_shutdown(app->core, ls_actor_now_ns(a));
}

static void s_destroy(ls_actor_t *a, void *state) {
    sched_destroy(&((app_t *)state)->core);
    ls_confine_destroy(&((app_t *)state)->confine);
}

int main(int argc, char **argv) {
    const ls_actor_def_t def = {
        .name = "scheduler",
        .about = "loraserve scheduler: continuous batching, KV blocks, prefix cache, LoRA slots",
        .dispatch = s_dispatch,
        .flags = s_flags,
        .state = &s_app,
        .on_start = s_start,
        .on_shutdown = s_shutdown,
        .on_destroy = s_destroy,
        .on_metrics = s_on_metrics,
    };
    return ls_actor_main(argc, argv, &def);
}
