// registry — the single source of truth for adapters (SGLang's LoRARegistry): name → LoRARef
// {id, name, path, pinned}, in-flight counters, LRU order; validated loads and draining
// unloads dispatched through the scheduler; on-demand loads from --lora-dirs; a journal so a
// restart restores the adapter set. See docs/adapters.md.
//
// Accepts on its ROUTER, from clients (the tokenizer, the SDK):
//   AcquireAdapter {name}             → AdapterAcquired (same rid; NOT_FOUND for unknown names)
//   ReleaseAdapter {adapter_id, name}   no answer
//   LoadAdapter {name, path, pinned}  → AdapterLoaded, once the scheduler confirmed (or TIMEOUT)
//   LoadAdapter {name, from_tensors, config_json, pinned} + one frame (adapter_model.safetensors)
//                                     → the same, once the registry's copy (tensors.c) is loaded
//   UnloadAdapter {name}              → AdapterUnloaded, once drained and confirmed (or TIMEOUT)
//   ListAdapters                      → AdapterList (with the scheduler's residency view)
// Accepts on its DEALER to the scheduler: AdapterLoaded, AdapterUnloaded, Error — the answers
// to what it sent there (the rid names the registry's load or unload) — and AdapterList (the
// residency a listing asked for).
// Emits to the scheduler: LoadAdapter {name, path, pinned, adapter_id, slot -1} and
// UnloadAdapter {name, adapter_id}, each with a rid of the registry's own.
// Accepts on its control DEALER: PeerStatus (a scheduler that went down: every adapter is queued
// for its restart; a tokenizer that went down: its holds are dropped).
// Emits to the launcher: Ready once every startup adapter (journal, --lora-paths) is answered;
// plus the runtime's Heartbeat, Metrics and Error.
//
// The decisions are in core.c (pure, unit-tested); this file wires them to the sockets, the
// job thread (check.c: disk reads never block the loop; tensors.c: copies of adapters sent as
// tensors are written there too), timers and the journal.
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core.h"
#include "journal.h"
#include "lora_spec.h"
#include "tensors.h"
#include "ls_actor.h"
#include "ls_confine.h"
#include "ls_limits.h"

typedef struct {
    // flags
    char *model_path, *state_dir;
    char *scheduler;  // --scheduler: the peer adapters are loaded through
    int max_lora_rank, max_loras_per_batch, load_timeout_ms, unload_timeout_ms, max_lora_tensor_mb;
    int extra_vocab_size;
    ls_strlist_t target_modules, lora_paths, lora_dirs, lora_roots;
    // state
    ls_actor_t *actor;
    ls_model_config_t model;
    check_root_t *roots, *dirs;
    check_env_t env;  // read by the job thread; never changed after on_start
    reg_t *reg;
    journal_t *journal;
    bool started, ready_due;
    uint64_t journal_errors;
    zlistx_t *unloaded;  // names the journal says a client unloaded (and nobody loaded since)
    char *tensors_root;  // STATE/tensors, resolved: where copies of adapters sent as tensors go
    uint64_t tensors_loads;
    // The adapter of the LoadAdapter being handled, for its check job to write (reg_load asks
    // for the check synchronously); NULL outside s_load_tensors.
    zframe_t *pending_weights;
    char *pending_config;
} registry_t;

static registry_t s_r;

// A client waiting for an answer: where it came from and its rid.
typedef struct {
    ls_route_t *route;
    uint64_t rid;
} waiter_t;

// A check on the job thread: inputs copied in, the verdict handed back.
typedef struct {
    const check_env_t *env;
    uint64_t op;
    check_mode_t mode;
    char *name, *path;
    zframe_t *weights;  // CHECK_TENSORS: written with config to path before the check
    char *config;
    check_result_t res;
} check_job_t;

static const struct {
    const char *name;
    size_t off;
} s_counters[] = {
    {"adapter_loads_total", offsetof(reg_stats_t, loads)},
    {"adapter_load_failures_total", offsetof(reg_stats_t, load_failures)},
    {"adapter_unloads_total", offsetof(reg_stats_t, unloads)},
    {"adapter_acquires_total", offsetof(reg_stats_t, acquires)},
    {"adapter_acquire_misses_total", offsetof(reg_stats_t, acquire_misses)},
    {"adapter_demand_loads_total", offsetof(reg_stats_t, demand_loads)},
    {"adapter_releases_unknown_total", offsetof(reg_stats_t, releases_unknown)},
    {"adapter_answers_unknown_total", offsetof(reg_stats_t, answers_unknown)},
};

// Copy the core's counters into the actor's after every event.
static void s_publish(registry_t *r) {
    const reg_stats_t *st = reg_stats(r->reg);
    for (size_t i = 0; i < sizeof s_counters / sizeof *s_counters; i++) {
        ls_actor_counter_set(r->actor, s_counters[i].name, *(const uint64_t *)((const char *)st + s_counters[i].off));
    }
    ls_actor_gauge_set(r->actor, "adapters_in_flight", st->in_flight);
    ls_actor_counter_set(r->actor, "journal_errors_total", r->journal_errors);
}

static waiter_t *s_waiter_new(const ls_in_t *in) {
    waiter_t *w = calloc(1, sizeof *w);
    if (w)
        w->route = ls_route_new(in);
    if (!w || !w->route) {
        ls_error(in->msg->rid, "registry out of memory");
        abort();
    }
    w->rid = in->msg->rid;
    return w;
}

// ---------------------------------------------------------------------------------------------
// the core's host

static void s_check_work(void *arg) {
    check_job_t *j = arg;
    if (j->mode == CHECK_TENSORS &&
        tensors_write(j->path, j->config, strlen(j->config), zframe_data(j->weights), zframe_size(j->weights),
                      j->res.reason, sizeof j->res.reason) < 0) {
        // A full disk may clear; anything else here is the registry's own fault.
        j->res.code = errno == ENOSPC || errno == EDQUOT ? LS_ERROR_CODE_UNAVAILABLE : LS_ERROR_CODE_INTERNAL;
        return;
    }
    check_adapter(j->env, j->mode, j->name, j->path, &j->res);
}

static void s_check_done(ls_actor_t *a, void *arg) {
    check_job_t *j = arg;
    reg_load_checked(s_r.reg, ls_actor_now_ns(a), j->op, &j->res);
    ls_added_vocab_free(&j->res.added);
    free(j->name);
    free(j->path);
    zframe_destroy(&j->weights);
    free(j->config);
    free(j);
    s_publish(&s_r);
}

// The job thread could not take the check (it could not be started): run it on the loop from
// a timer, so the core still hears back as a separate event.
static void s_check_inline(ls_actor_t *a, ls_timer_t *t, void *arg) {
    ls_actor_timer_stop(a, t);
    s_check_work(arg);
    s_check_done(a, arg);
}

static void s_host_check(void *host, uint64_t op, check_mode_t mode, const char *name, const char *path) {
    registry_t *r = host;
    check_job_t *j = calloc(1, sizeof *j);
    if (!j || !(j->name = strdup(name ? name : "")) || !(j->path = strdup(path ? path : ""))) {
        ls_error(0, "registry out of memory");
        abort();
    }
    j->env = &r->env;
    j->op = op;
    j->mode = mode;
    if (mode == CHECK_TENSORS) {
        j->weights = r->pending_weights;
        j->config = r->pending_config;
        r->pending_weights = NULL;
        r->pending_config = NULL;
    }
    // The verdict is all the loop uses of what the check read from disk: recorded, it lets a
    // replay skip the disk.
    if (ls_actor_job_result(r->actor, s_check_work, s_check_done, j, &j->res, sizeof j->res) < 0) {
        ls_warn(0, "no job thread for checking %s; checking it on the loop", name);
        ls_actor_timer_start(r->actor, 0, 0, s_check_inline, j);
    }
}

static int s_host_send(void *host, const ls_msg_t *msg) {
    registry_t *r = host;
    if (!ls_actor_has_peer(r->actor, r->scheduler)) {
        ls_error(msg->rid, "no scheduler peer (--peer %s=ENDPOINT): adapters cannot be loaded or unloaded", r->scheduler);
        return -1;
    }
    return ls_actor_send_peer(r->actor, r->scheduler, msg, NULL);
}

static void s_host_answer(void *host, void *waiter, ls_msg_t *msg) {
    registry_t *r = host;
    waiter_t *w = waiter;
    if (msg) {
        msg->rid = w->rid;
        ls_actor_send_route(r->actor, w->route, msg, NULL);
    }
    ls_route_destroy(&w->route);
    free(w);
}

static void s_on_timeout(ls_actor_t *a, ls_timer_t *t, void *arg) {
    reg_timeout(s_r.reg, ls_actor_now_ns(a), (uint64_t)(uintptr_t)arg);
    s_publish(&s_r);
}

static void *s_host_arm(void *host, uint64_t op, uint32_t ms) {
    registry_t *r = host;
    return ls_actor_timer_start(r->actor, ms, 0, s_on_timeout, (void *)(uintptr_t)op);
}

static void s_host_cancel(void *host, void *timer) {
    registry_t *r = host;
    ls_actor_timer_stop(r->actor, timer);
}

static int s_host_journal(void *host, const ls_msg_t *record) {
    registry_t *r = host;
    if (r->journal && journal_append(r->journal, record) < 0) {
        r->journal_errors++;
        return -1;
    }
    return 0;
}

// Only the registry's own copies are removed, and never in a replay (it writes nothing).
static void s_host_forget(void *host, const char *path) {
    registry_t *r = host;
    if (r->tensors_root && !ls_actor_replaying(r->actor) && tensors_owns(r->tensors_root, path)) {
        ls_info(0, "removing %s, the copy of an adapter sent as tensors", path);
        tensors_remove(path);
    }
}

static void s_host_ready(void *host) {
    registry_t *r = host;
    ls_info(0, "every startup adapter has been answered");
    r->ready_due = true;
    if (r->started)
        ls_actor_ready(r->actor);
}

// ---------------------------------------------------------------------------------------------
// handlers

static int s_on_acquire(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    reg_acquire(r->reg, in->now_ns, in->msg->u.acquire_adapter.name, s_waiter_new(in));
    s_publish(r);
    return 0;
}

static int s_on_release(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    reg_release(r->reg, in->msg->u.release_adapter.adapter_id, in->msg->u.release_adapter.name);
    s_publish(r);
    return 0;
}

static void s_load_refuse(ls_actor_t *a, ls_in_t *in, uint32_t code, const char *reason) {
    ls_info(in->msg->rid, "load of %s from tensors refused: %s", in->msg->u.load_adapter.name, reason);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
    m.rid = in->msg->rid;
    m.u.adapter_loaded.name = ls_msg_strdup(in->msg->u.load_adapter.name);
    m.u.adapter_loaded.code = code;
    m.u.adapter_loaded.reason = ls_msg_strdup(reason);
    ls_actor_reply(a, in, &m);
    ls_msg_clear(&m);
    ls_actor_count(a, "adapter_load_failures_total", 1);
}

// A load from tensors: the message's adapter becomes the registry's copy under STATE/tensors
// (written by the check job), then loads like any adapter with a path (tensors.h).
static void s_load_tensors(registry_t *r, ls_actor_t *a, ls_in_t *in) {
    const ls_msg_load_adapter_t *la = &in->msg->u.load_adapter;
    char why[256];
    zframe_t *weights = in->bulk && zmsg_size(in->bulk) == 1 ? zmsg_first(in->bulk) : NULL;
    uint64_t limit = (uint64_t)r->max_lora_tensor_mb << 20;
    if (!r->tensors_root)
        s_load_refuse(a, in, LS_ERROR_CODE_UNAVAILABLE,
                      "loading adapters from tensors needs the registry's --state-dir, where it keeps them as files");
    else if (la->path && *la->path)
        s_load_refuse(a, in, LS_ERROR_CODE_BAD_REQUEST, "a load gives a path or tensors, not both");
    else if (!la->config_json || !*la->config_json)
        s_load_refuse(a, in, LS_ERROR_CODE_BAD_REQUEST, "a load from tensors needs config_json (adapter_config.json)");
    else if (!weights || zframe_size(weights) == 0)
        s_load_refuse(a, in, LS_ERROR_CODE_BAD_REQUEST,
                      "a load from tensors needs exactly one frame after the message: adapter_model.safetensors");
    else if (zframe_size(weights) > limit) {
        snprintf(why, sizeof why, "adapter_model.safetensors of %zu bytes is larger than %d MiB (--max-lora-tensor-mb)",
                 zframe_size(weights), r->max_lora_tensor_mb);
        s_load_refuse(a, in, LS_ERROR_CODE_TOO_LARGE, why);
    } else {
        char dir[PATH_MAX];
        tensors_path(r->tensors_root, la->name ? la->name : "", in->now_ns, r->tensors_loads++, dir, sizeof dir);
        r->pending_weights = zmsg_pop(in->bulk);
        r->pending_config = strdup(la->config_json);
        if (!r->pending_config) {
            ls_error(0, "registry out of memory");
            abort();
        }
        reg_load(r->reg, in->now_ns, REG_FROM_TENSORS, la->name, dir, la->pinned, NULL, s_waiter_new(in));
        zframe_destroy(&r->pending_weights);  // refused before its check: nothing was written
        free(r->pending_config);
        r->pending_config = NULL;
    }
}

static int s_on_load(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    const ls_msg_load_adapter_t *la = &in->msg->u.load_adapter;
    if (la->from_tensors)
        s_load_tensors(r, a, in);
    else
        reg_load(r->reg, in->now_ns, REG_FROM_CLIENT, la->name, la->path, la->pinned, NULL, s_waiter_new(in));
    s_publish(r);
    return 0;
}

static int s_on_unload(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    reg_unload(r->reg, in->now_ns, in->msg->u.unload_adapter.name, s_waiter_new(in));
    s_publish(r);
    return 0;
}

// ListAdapters: the registry's view, plus where each adapter is resident, which only the
// scheduler knows. A listing waits for the scheduler's AdapterList at most
// S_RESIDENCY_WAIT_MS; after that it answers with residency_known false.
#define S_RESIDENCY_WAIT_MS 1000
// Listing rids have the top bit set: they never collide with the core's load/unload ops.
#define S_LIST_RID_BIT (1ull << 63)

typedef struct s_listing {
    uint64_t rid;  // the registry's rid at the scheduler
    waiter_t *who;
    ls_timer_t *timer;
    struct s_listing *next;
} s_listing_t;

static s_listing_t *s_listings;
static uint64_t s_next_listing;

// Answers a waiting listing; residency (an AdapterList from the scheduler) may be NULL.
static void s_listing_answer(registry_t *r, s_listing_t *l, const ls_msg_t *residency) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
    m.rid = l->who->rid;
    reg_list(r->reg, &m);
    for (size_t i = 0; residency && i < m.u.adapter_list.adapters.n; i++) {
        ls_msg_adapter_info_t *ai = &m.u.adapter_list.adapters.v[i];
        const ls_msg_adapter_infos_t *sched = &residency->u.adapter_list.adapters;
        for (size_t k = 0; k < sched->n; k++)
            if (ai->adapter_id && sched->v[k].adapter_id && !strcmp(ai->adapter_id, sched->v[k].adapter_id)) {
                ai->residency_known = true;
                ai->cpu_resident = sched->v[k].cpu_resident;
                ai->in_gpu_slot = sched->v[k].in_gpu_slot;
                ai->gpu_slot = sched->v[k].gpu_slot;
            }
    }
    ls_actor_send_route(r->actor, l->who->route, &m, NULL);
    ls_msg_clear(&m);
    for (s_listing_t **p = &s_listings; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    ls_actor_timer_stop(r->actor, l->timer);
    ls_route_destroy(&l->who->route);
    free(l->who);
    free(l);
}

static void s_listing_timeout(ls_actor_t *a, ls_timer_t *t, void *arg) {
    ls_warn(0, "the scheduler did not say where adapters are resident; listing without it");
    s_listing_answer(&s_r, arg, NULL);
}

static int s_on_list(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    s_listing_t *l = calloc(1, sizeof *l);
    l->rid = S_LIST_RID_BIT | ++s_next_listing;
    l->who = s_waiter_new(in);
    l->timer = ls_actor_timer_start(a, S_RESIDENCY_WAIT_MS, 0, s_listing_timeout, l);
    l->next = s_listings;
    s_listings = l;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LIST_ADAPTERS);
    m.rid = l->rid;
    if (ls_actor_send_peer(a, r->scheduler, &m, NULL) < 0)
        s_listing_answer(r, l, NULL);
    return 0;
}

// The scheduler's AdapterList: the residency a waiting listing asked for.
static int s_on_residency(ls_actor_t *a, ls_in_t *in, void *state) {
    if (in->identity || strcmp(in->from, ((registry_t *)state)->scheduler) != 0)
        return 0;
    for (s_listing_t *l = s_listings; l; l = l->next)
        if (l->rid == in->msg->rid) {
            s_listing_answer(state, l, in->msg);
            return 0;
        }
    return 0;  // answered already (timed out)
}

// AdapterLoaded, AdapterUnloaded and Error count only from the scheduler: a client cannot
// confirm a load.
static int s_on_answer(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    if (in->identity || strcmp(in->from, r->scheduler) != 0) {
        ls_warn(in->msg->rid, "%s from %s ignored: only the scheduler's answers count", ls_msg_type_name(in->msg->type),
                in->from);
        return 0;
    }
    reg_answered(r->reg, in->now_ns, in->msg);
    s_publish(r);
    return 0;
}

// The launcher's news of the graph: a scheduler that went down will be told every adapter
// again when it is back; a tokenizer that went down took its requests' holds with it.
static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    registry_t *r = state;
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    if (!ps->actor || ps->up)
        return 0;
    if (!strcmp(ps->actor, r->scheduler))
        reg_scheduler_lost(r->reg, in->now_ns);
    else if (!strcmp(ps->actor, "tokenizer"))
        reg_holders_lost(r->reg);
    s_publish(r);
    return 0;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_ACQUIRE_ADAPTER, s_on_acquire},  {LS_MSG_RELEASE_ADAPTER, s_on_release},
    {LS_MSG_LOAD_ADAPTER, s_on_load},        {LS_MSG_UNLOAD_ADAPTER, s_on_unload},
    {LS_MSG_LIST_ADAPTERS, s_on_list},       {LS_MSG_ADAPTER_LIST, s_on_residency},
    {LS_MSG_ADAPTER_LOADED, s_on_answer},
    {LS_MSG_ADAPTER_UNLOADED, s_on_answer},  {LS_MSG_ERROR, s_on_answer},
    {0, NULL},
};

// ---------------------------------------------------------------------------------------------
// start-up

// Resolve configured directories; -1 (logged) when one does not exist.
static int s_resolve(const ls_strlist_t *list, const char *flag, check_root_t **out) {
    *out = calloc(list->n ? list->n : 1, sizeof **out);
    if (!*out)
        return -1;
    for (size_t i = 0; i < list->n; i++) {
        (*out)[i].given = list->v[i];
        char *real = realpath(list->v[i], NULL);
        if (!real) {
            ls_error(0, "%s %s: %s", flag, list->v[i], strerror(errno));
            return -1;
        }
        (*out)[i].real = real;
    }
    return 0;
}

static int s_targets(const ls_strlist_t *list, unsigned *mask) {
    *mask = list->n ? 0 : (1u << LS_TARGET_COUNT) - 1;
    for (size_t i = 0; i < list->n; i++) {
        int t = ls_target_from_name(list->v[i]);
        if (!strcmp(list->v[i], "all"))
            *mask = (1u << LS_TARGET_COUNT) - 1;
        else if (t >= 0)
            *mask |= 1u << t;
        else {
            ls_error(0, "--lora-target-modules: unknown module %s (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                        "down_proj, embed_tokens, lm_head or all)",
                     list->v[i]);
            return -1;
        }
    }
    return 0;
}

// A --lora-paths value (lora_spec's forms): trusted operator input, skipped when the journal
// restored the name (the journal knows the adapter's id, and a later load/unload may have
// changed it). s_start has checked every value's form.
static void s_startup_path(registry_t *r, const char *entry) {
    lora_spec_t spec;
    char err[1024];
    if (lora_spec_parse(entry, &spec, err, sizeof err) < 0)
        return;
    if (reg_has(r->reg, spec.name))
        ls_info(0, "--lora-paths %s: restored from the journal, which wins; unload and load it to change it", spec.name);
    else if (zlistx_find(r->unloaded, spec.name))
        ls_warn(0, "--lora-paths %s: not loaded, because a client unloaded it (the journal remembers); load it "
                   "through the API to serve it again",
                spec.name);
    else
        reg_load(r->reg, ls_actor_now_ns(r->actor), REG_FROM_STARTUP, spec.name, spec.path, spec.pinned, NULL, NULL);
    lora_spec_clear(&spec);
}

// Every --lora-paths value well formed, and no name given twice: else the registry does not
// start (a launch never goes on without an adapter the operator named).
static int s_check_startup_paths(const ls_strlist_t *paths) {
    int rc = 0;
    for (size_t i = 0; i < paths->n && rc == 0; i++) {
        lora_spec_t spec, other;
        char err[1024];
        if (lora_spec_parse(paths->v[i], &spec, err, sizeof err) < 0) {
            ls_error(0, "--lora-paths: %s", err);
            return -1;
        }
        for (size_t j = 0; j < i && rc == 0; j++)
            if (lora_spec_parse(paths->v[j], &other, err, sizeof err) == 0) {
                if (!strcmp(other.name, spec.name)) {
                    ls_error(0, "--lora-paths: the name %s is given twice (\"%s\" and \"%s\")", spec.name, paths->v[j],
                             paths->v[i]);
                    rc = -1;
                }
                lora_spec_clear(&other);
            }
        lora_spec_clear(&spec);
    }
    return rc;
}

// STATE/tensors, resolved as the paths of checked adapters are (the state directory exists
// once the journal is open; a replay, which opens none, takes the path as given).
static void s_tensors_root(registry_t *r) {
    char *state = realpath(r->state_dir, NULL);
    if (asprintf(&r->tensors_root, "%s/" LS_CONFINE_TENSORS_DIR, state ? state : r->state_dir) < 0) {
        ls_error(0, "registry out of memory");
        abort();
    }
    free(state);
}

// The adapters the journal restores, as the actor's recorded input "registry.journal" (one
// encoded LoadAdapter per frame, then an UnloadAdapter per name unloaded since its last load).
// A replay takes them from the trace and opens no journal, so it writes nothing to the state
// directory.
static int s_journal_restore(registry_t *r, ls_actor_t *a) {
    zmsg_t *frames = zmsg_new();
    if (!ls_actor_replaying(a)) {
        ls_msg_t *live;
        size_t n;
        char err[512];
        if (!(r->journal = journal_open(r->state_dir, &live, &n, err, sizeof err))) {
            ls_error(0, "--state-dir: %s", err);
            zmsg_destroy(&frames);
            return -1;
        }
        s_tensors_root(r);
        // Copies of adapters sent as tensors that no record names are a crash's leftovers
        // (tensors.h); gone before the journal's adapters load.
        const char **keep = calloc(n ? n : 1, sizeof *keep);
        if (!keep) {
            ls_error(0, "registry out of memory");
            abort();
        }
        for (size_t i = 0; i < n; i++)
            keep[i] = live[i].u.load_adapter.path;
        tensors_sweep(r->tensors_root, keep, n);
        free(keep);
        for (size_t i = 0; i < n; i++) {
            char *buf;
            size_t len;
            if (ls_msg_encode(&live[i], &buf, &len) == 0) {
                zmsg_addmem(frames, buf, len);
                free(buf);
            }
            ls_msg_clear(&live[i]);
        }
        free(live);
        for (size_t i = 0; journal_unloaded(r->journal, i); i++) {
            ls_msg_t m;
            ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
            m.u.unload_adapter.name = (char *)journal_unloaded(r->journal, i);
            char *buf;
            size_t len;
            if (ls_msg_encode(&m, &buf, &len) == 0) {
                zmsg_addmem(frames, buf, len);
                free(buf);
            }
        }
    }
    if (!r->tensors_root)
        s_tensors_root(r);
    ls_actor_input(a, "registry.journal", &frames);
    for (zframe_t *f = zmsg_first(frames); f; f = zmsg_next(frames)) {
        ls_msg_t m;
        if (ls_msg_decode(zframe_data(f), zframe_size(f), &m, NULL) < 0)
            continue;
        const ls_msg_load_adapter_t *la = &m.u.load_adapter;
        if (m.type == LS_MSG_LOAD_ADAPTER)
            reg_load(r->reg, ls_actor_now_ns(a), REG_FROM_JOURNAL, la->name, la->path, la->pinned, la->adapter_id, NULL);
        else if (m.type == LS_MSG_UNLOAD_ADAPTER && m.u.unload_adapter.name)
            zlistx_add_end(r->unloaded, m.u.unload_adapter.name);
        ls_msg_clear(&m);
    }
    zmsg_destroy(&frames);
    return 0;
}

// An unloaded name matters only while --lora-paths lists it: the others are forgotten, so the
// journal does not keep every name ever unloaded.
static void s_forget_unloaded(registry_t *r) {
    for (const char *name = zlistx_first(r->unloaded); name; name = zlistx_next(r->unloaded)) {
        bool listed = false;
        for (size_t i = 0; i < r->lora_paths.n && !listed; i++) {
            lora_spec_t spec;
            char err[1024];
            if (lora_spec_parse(r->lora_paths.v[i], &spec, err, sizeof err) == 0)
                listed = !strcmp(spec.name, name);
            lora_spec_clear(&spec);
        }
        if (!listed && r->journal)
            journal_forget(r->journal, name);
    }
}

static int s_start(ls_actor_t *a, void *state) {
    registry_t *r = state;
    r->actor = a;
    if (r->max_lora_rank < 1 || r->max_loras_per_batch < 1 || r->load_timeout_ms < 1 || r->unload_timeout_ms < 1 ||
        r->max_lora_tensor_mb < 1 || r->max_lora_tensor_mb > LS_MAX_LORA_TENSOR_MB_CAP || r->extra_vocab_size < 0) {
        ls_error(0, "--max-lora-rank, --max-loras-per-batch, --load-timeout-ms and --unload-timeout-ms must be "
                    "positive; --max-lora-tensor-mb 1.." LS_LIMITS_STR(LS_MAX_LORA_TENSOR_MB_CAP)
                    "; --lora-extra-vocab-size at least 0");
        return -1;
    }
    unsigned targets;
    if (s_check_startup_paths(&r->lora_paths) < 0 || s_targets(&r->target_modules, &targets) < 0 || s_resolve(&r->lora_dirs, "--lora-dirs", &r->dirs) < 0 ||
        s_resolve(r->lora_roots.n ? &r->lora_roots : &r->lora_dirs, "--lora-roots", &r->roots) < 0)
        return -1;
    char err[512];
    if (r->model_path && ls_model_config_load(r->model_path, &r->model, err, sizeof err) < 0) {
        ls_error(0, "--model-path: %s", err);
        return -1;
    }
    if (!r->model_path)
        ls_warn(0, "no --model-path: every adapter load is refused, since none can be validated");
    r->env = (check_env_t){.roots = r->roots,
                           .n_roots = r->lora_roots.n ? r->lora_roots.n : r->lora_dirs.n,
                           .dirs = r->dirs,
                           .n_dirs = r->lora_dirs.n,
                           .model = r->model_path ? &r->model : NULL,
                           .max_lora_rank = r->max_lora_rank,
                           .targets = targets,
                           .extra_vocab_size = r->extra_vocab_size};
    const reg_config_t cfg = {.max_loras_per_batch = r->max_loras_per_batch,
                              .on_demand = r->lora_dirs.n > 0,
                              .load_timeout_ms = (uint32_t)r->load_timeout_ms,
                              .unload_timeout_ms = (uint32_t)r->unload_timeout_ms};
    const reg_host_t host = {.host = r, .check = s_host_check, .send = s_host_send, .answer = s_host_answer,
                             .arm = s_host_arm, .cancel = s_host_cancel, .journal = s_host_journal,
                             .ready = s_host_ready, .forget = s_host_forget};
    if (!(r->reg = reg_new(&cfg, &host)) || !(r->unloaded = zlistx_new()))
        return -1;
    zlistx_set_duplicator(r->unloaded, (zlistx_duplicator_fn *)strdup);
    zlistx_set_destructor(r->unloaded, (zlistx_destructor_fn *)zstr_free);
    zlistx_set_comparator(r->unloaded, (zlistx_comparator_fn *)strcmp);
    if (r->state_dir) {
        if (s_journal_restore(r, a) < 0)
            return -1;
    } else
        ls_warn(0, "no --state-dir: adapter registrations will not survive a restart");
    for (size_t i = 0; i < r->lora_paths.n; i++)
        s_startup_path(r, r->lora_paths.v[i]);
    s_forget_unloaded(r);
    reg_startup_seal(r->reg);
    r->started = true;
    s_publish(r);
    return r->ready_due ? 0 : LS_READY_LATER;
}

static void s_shutdown(ls_actor_t *a, void *state) {
    registry_t *r = state;
    if (r->reg)
        reg_shutdown(r->reg);
    while (s_listings)  // listings still waiting for the scheduler: answer with what is known
        s_listing_answer(r, s_listings, NULL);
}

static void s_free_resolved(check_root_t **roots, size_t n) {
    for (size_t i = 0; *roots && i < n; i++)
        free((char *)(*roots)[i].real);
    free(*roots);
    *roots = NULL;
}

static void s_destroy(ls_actor_t *a, void *state) {
    registry_t *r = state;
    reg_destroy(&r->reg);
    journal_destroy(&r->journal);
    zlistx_destroy(&r->unloaded);
    free(r->tensors_root);
    s_free_resolved(&r->dirs, r->lora_dirs.n);
    s_free_resolved(&r->roots, r->lora_roots.n ? r->lora_roots.n : r->lora_dirs.n);
}

int main(int argc, char **argv) {
    registry_t *r = &s_r;
    ls_flag_t flags[] = {
        LS_FLAG_STR("model-path", &r->model_path, NULL, "base model directory or config.json, to validate adapters"),
        LS_FLAG_INT("max-lora-rank", &r->max_lora_rank, "64", "largest adapter rank accepted"),
        LS_FLAG_INT("lora-extra-vocab-size", &r->extra_vocab_size, "0",
                    "most rows of the embedding or lm_head an adapter may replace (trainable tokens); 0: none"),
        LS_FLAG_INT("max-loras-per-batch", &r->max_loras_per_batch, LS_LIMITS_STR(LS_DEFAULT_MAX_LORAS_PER_BATCH),
                    "GPU adapter slots; at most this - 1 adapters may be pinned"),
        LS_FLAG_LIST("lora-target-modules", &r->target_modules,
                     "modules adapters may target (q_proj ... down_proj, embed_tokens, lm_head, or all: the seven of a layer, the default)"),
        LS_FLAG_LIST("lora-paths", &r->lora_paths, "startup adapters: name=path[:pinned], a path (named by its basename), or JSON {\"lora_name\", \"lora_path\", \"pinned\"}"),
        LS_FLAG_LIST("lora-dirs", &r->lora_dirs, "directories whose DIR/name adapters are loaded on first request"),
        LS_FLAG_LIST("lora-roots", &r->lora_roots,
                     "directories clients' LoadAdapter paths must lie under (default: the --lora-dirs; none: refused)"),
        LS_SCHEDULER_FLAG(&r->scheduler),
        LS_FLAG_STR("state-dir", &r->state_dir, NULL,
                    "directory of the journal (registry.journal) and of adapters loaded from tensors (tensors/)"),
        LS_MAX_LORA_TENSOR_MB_FLAG(&r->max_lora_tensor_mb),
        LS_FLAG_INT("load-timeout-ms", &r->load_timeout_ms, "300000",
                    "answer a load TIMEOUT after this long (a late load is undone)"),
        LS_FLAG_INT("unload-timeout-ms", &r->unload_timeout_ms, "300000",
                    "answer an unload TIMEOUT after this long, in-flight requests included"),
        LS_FLAG_END,
    };
    const ls_actor_def_t def = {.name = "registry",
                                .about = "loraserve adapter registry",
                                .dispatch = s_dispatch,
                                .flags = flags,
                                .state = r,
                                .on_start = s_start,
                                .on_shutdown = s_shutdown,
                                .on_destroy = s_destroy};
    return ls_actor_main(argc, argv, &def);
}
