// sched_adapters — the scheduler core's adapters (sched_impl.h): the commands that load and
// unload them on the workers, the CPU tier's room (LRU eviction of idle adapters, loads that
// wait for room in arrival order), the loads and unloads clients ask for, and the listings.
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_limits.h"
#include "ls_log.h"
#include "sched_impl.h"

// ---------------------------------------------------------------------------------------------
// adapter commands to the workers

static op_t *s_op_new(sched_t *s, op_kind_t kind, const lora_adapter_t *ad, void *reply, uint64_t asker_rid) {
    op_t *op = sched_alloc(NULL, sizeof *op);
    memset(op, 0, sizeof *op);
    op->kind = kind;
    op->adapter_id = sched_strdup(ad->id);
    op->name = sched_strdup(ad->name);
    op->reply = reply;
    op->asker_rid = asker_rid;
    op_t **p = &s->ops;
    while (*p)
        p = &(*p)->next;
    *p = op;
    return op;
}

void sched_op_free(sched_t *s, op_t *op) {
    for (op_t **p = &s->ops; *p; p = &(*p)->next)
        if (*p == op) {
            *p = op->next;
            break;
        }
    sched_reply_release(s, &op->reply);
    free(op->adapter_id);
    free(op->name);
    free(op->reason);
    free(op);
}

static void s_send_load(sched_t *s, op_t *op, lora_adapter_t *ad, uint64_t now) {
    op->rid = ++s->next_op_rid;
    op->deadline = now + s->cfg.load_timeout_ns;
    op->sent_at = now;
    op->queued_at = 0;
    ad->queued = false;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = op->rid;
    m.u.load_adapter.name = sched_strdup(ad->name);
    m.u.load_adapter.path = sched_strdup(ad->path);
    m.u.load_adapter.adapter_id = sched_strdup(ad->id);
    m.u.load_adapter.pinned = ad->pinned;
    m.u.load_adapter.slot = -1;  // the CPU tier; slots are filled by PrefetchAdapter (sched_slot_fill)
    sched_emit(s, SCHED_TO_WORKERS, 0, NULL, &m);
    ls_msg_clear(&m);
}

static void s_send_unload(sched_t *s, sched_dest_kind_t kind, int rank, uint64_t rid, const lora_adapter_t *ad) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
    m.rid = rid;
    m.u.unload_adapter.name = sched_strdup(ad->name);
    m.u.unload_adapter.adapter_id = sched_strdup(ad->id);
    sched_emit(s, kind, rank, NULL, &m);
    ls_msg_clear(&m);
}

void sched_answer_loaded(sched_t *s, void *reply, uint64_t rid, const char *name, const char *id, bool ok,
                         uint32_t lora_rank, uint32_t pages, uint32_t code, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
    m.rid = rid;
    m.u.adapter_loaded.ok = ok;
    m.u.adapter_loaded.name = sched_strdup(name);
    m.u.adapter_loaded.adapter_id = sched_strdup(id);
    m.u.adapter_loaded.rank = lora_rank;
    m.u.adapter_loaded.pages = pages;
    m.u.adapter_loaded.code = ok ? 0 : code;
    m.u.adapter_loaded.reason = ok ? NULL : sched_strdup(reason);
    sched_emit(s, SCHED_TO_REPLY, 0, reply, &m);
    ls_msg_clear(&m);
}

void sched_answer_unloaded(sched_t *s, void *reply, uint64_t rid, const char *name, const char *id, bool ok,
                              uint32_t code, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
    m.rid = rid;
    m.u.adapter_unloaded.ok = ok;
    m.u.adapter_unloaded.name = sched_strdup(name);
    m.u.adapter_unloaded.adapter_id = sched_strdup(id);
    m.u.adapter_unloaded.code = ok ? 0 : code;
    m.u.adapter_unloaded.reason = ok ? NULL : sched_strdup(reason);
    sched_emit(s, SCHED_TO_REPLY, 0, reply, &m);
    ls_msg_clear(&m);
}

// Whether one more adapter of `need` bytes fits the CPU tier beside the resident ones and the
// loads in flight (each reserving its size, or the largest adapter's while unknown).
static bool s_cpu_fits(const sched_t *s, uint64_t need) {
    if (s->max_loaded && (uint32_t)lora_cpu_count(s->lora) >= s->max_loaded)
        return false;
    if (!s->cpu_bytes)
        return true;
    uint64_t used, reserved;
    lora_cpu_bytes(s->lora, s->lora_max_bytes, &used, &reserved);
    return used + reserved + need <= s->cpu_bytes;
}

// Make room in the workers' CPU tier for one more adapter of `need` bytes (0: unknown, the
// largest): evict least recently used idle ones. -1 when every resident adapter is pinned or
// in use (the caller waits and tries again).
static int s_cpu_make_room(sched_t *s, uint64_t need) {
    if (!need)
        need = s->lora_max_bytes;
    while (!s_cpu_fits(s, need)) {
        lora_adapter_t *victim = lora_cpu_victim(s->lora);
        if (!victim)
            return -1;
        ls_info(0, "CPU tier full: evicting adapter %s (%s)", victim->name, victim->id);
        op_t *op = s_op_new(s, OP_EVICT, victim, NULL, 0);
        op->rid = ++s->next_op_rid;
        op->deadline = s->now + s->cfg.load_timeout_ns;
        s_send_unload(s, SCHED_TO_WORKERS, 0, op->rid, victim);
        victim->resident = false;
        sched_slot_vacate(s, victim);
        s->stats.adapter_cpu_evictions++;
    }
    return 0;
}

// A request needs ad in the CPU tier and it was evicted (or the workers restarted): reload it
// from its path. Does nothing while a load is in flight or the tier has no room yet (retried
// at the next plan).
void sched_adapter_ensure_resident(sched_t *s, lora_adapter_t *ad, uint64_t now) {
    if (ad->resident || ad->loading || s_cpu_make_room(s, ad->bytes) < 0)
        return;
    ls_info(0, "reloading adapter %s into the CPU tier", ad->name);
    ad->loading = true;
    s_send_load(s, s_op_new(s, OP_RELOAD, ad, NULL, 0), ad, now);
}

static const op_t *s_first_queued_load(const sched_t *s) {
    const op_t *op = s->ops;
    while (op && !(op->kind == OP_LOAD && op->queued_at))
        op = op->next;
    return op;
}

// First loads that wait for room (every resident adapter pinned or in use when they came), in
// arrival order: each goes once the tier has room, none overtakes an earlier one.
void sched_loads_send_queued(sched_t *s) {
    for (op_t *op = s->ops; op; op = op->next) {
        if (op->kind != OP_LOAD || !op->queued_at)
            continue;
        lora_adapter_t *ad = lora_find(s->lora, op->adapter_id);
        if (!ad || s_cpu_make_room(s, 0) < 0)
            return;
        ls_info(op->asker_rid, "adapter %s: room in the CPU tier after %.1f ms, loading", ad->name,
                (double)(s->now - op->queued_at) / 1e6);
        s_send_load(s, op, ad, s->now);
    }
}

// Every rank answered (or the command timed out): act on the outcome.
void sched_op_complete(sched_t *s, op_t *op) {
    uint32_t all = (1u << s->cfg.tp_size) - 1;
    bool ok = op->ok == all;
    lora_adapter_t *ad = lora_find(s->lora, op->adapter_id);
    const char *reason = op->reason ? op->reason : "a worker failed";
    switch (op->kind) {
    case OP_LOAD:
    case OP_RELOAD:
        if (!ad)
            break;
        // ad->loading stays set until the end: failing its requests below must not let an
        // asked-for unload free ad under us.
        if (ok) {
            ad->resident = ad->confirmed = true;
            ad->rank = op->lora_rank;
            ad->bytes = op->bytes;
            ad->pages_need = op->pages;
            s->stats.adapter_cpu_loads++;
            s->stats.adapter_cpu_load_us += (s->now - op->sent_at) / 1000;
            ls_info(0, "adapter %s (%s) loaded on every worker", ad->name, ad->id);
        } else {
            // Roll back the ranks that did load it, so the tiers agree.
            for (int r = 0; r < s->cfg.tp_size; r++)
                if (op->ok & (1u << r))
                    s_send_unload(s, SCHED_TO_WORKER, r, ++s->next_op_rid, ad);
            ls_warn(op->asker_rid, "adapter %s failed to load: %s", ad->name, reason);
        }
        if (op->kind == OP_LOAD)
            sched_answer_loaded(s, op->reply, op->asker_rid, ad->name, ad->id, ok, ad->rank, ad->pages_need,
                                op->code ? op->code : LS_ERROR_CODE_INTERNAL, reason);
        if (!ok && op->kind == OP_RELOAD) {
            // Its waiting requests cannot run: fail them rather than retry a load that fails.
            char why[600];
            snprintf(why, sizeof why, "adapter %s could not be reloaded: %s", ad->name, reason);
            for (req_t *r = s->waiting.head, *next; r; r = next) {
                next = r->next;
                if (sched_req_uses(r, ad))
                    sched_req_finish(s, r, NULL, LS_FINISH_REASON_ERROR, why);
            }
        }
        ad->loading = false;
        if (!ok && !ad->confirmed) {
            // A first load that failed leaves nothing behind (no request can name it yet).
            assert(ad->refs == 0 && ad->slot < 0);
            lora_remove(s->lora, &ad);
        } else
            sched_adapter_unload_maybe(s, ad);
        break;
    case OP_UNLOAD:
        sched_answer_unloaded(s, op->reply, op->asker_rid, op->name, op->adapter_id, ok,
                          op->code ? op->code : LS_ERROR_CODE_INTERNAL, reason);
        if (ad) {
            kv_drop_key(s->kv, ad->id);
            sched_slot_vacate(s, ad);
            lora_remove(s->lora, &ad);
        }
        break;
    case OP_EVICT:
        if (!ok)
            ls_warn(0, "evicting adapter %s from the CPU tier failed on a worker: %s", op->name, reason);
        break;
    }
    sched_op_free(s, op);
}

// Start an asked-for unload once nothing uses the adapter.
void sched_adapter_unload_maybe(sched_t *s, lora_adapter_t *ad) {
    if (!ad->unloading || ad->refs > 0 || ad->loading)
        return;
    op_t *op = s->ops;
    while (op && !(op->kind == OP_UNLOAD && op->deadline == 0 && strcmp(op->adapter_id, ad->id) == 0))
        op = op->next;
    assert(op);  // unloading is set only together with its op
    if (!ad->resident) {
        op->ok = op->answered = (1u << s->cfg.tp_size) - 1;
        sched_op_complete(s, op);
        return;
    }
    op->rid = ++s->next_op_rid;
    op->deadline = s->now + s->cfg.load_timeout_ns;
    s_send_unload(s, SCHED_TO_WORKERS, 0, op->rid, ad);
    ad->resident = false;
    sched_slot_vacate(s, ad);
}

// A worker loaded an adapter after its command was over (timed out, or the workers were
// declared down): unless the adapter is resident or loading again, that rank holds bytes the
// CPU tier's accounting does not count, so it is told to drop them.
static void s_late_load(sched_t *s, int rank, uint64_t rid, const char *adapter_id) {
    const lora_adapter_t *ad = adapter_id ? lora_find(s->lora, adapter_id) : NULL;
    if (!adapter_id || (ad && (ad->resident || ad->loading)))
        return;
    ls_warn(rid, "worker %d loaded adapter %s after its load was over; unloading it there", rank, adapter_id);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
    m.rid = ++s->next_op_rid;
    m.u.unload_adapter.adapter_id = sched_strdup(adapter_id);
    m.u.unload_adapter.name = sched_strdup(ad ? ad->name : adapter_id);
    sched_emit(s, SCHED_TO_WORKER, rank, NULL, &m);
    ls_msg_clear(&m);
}

void sched_op_answer(sched_t *s, int rank, uint64_t rid, bool ok, uint32_t lora_rank, uint64_t bytes,
                     uint32_t pages, uint32_t code, const char *reason, const char *late_load_id) {
    op_t *op = s->ops;
    while (op && !(op->rid == rid && op->deadline != 0))
        op = op->next;
    if (!op || rank < 0 || rank >= s->cfg.tp_size) {
        ls_debug(rid, "adapter answer from rank %d matches no command (a rollback's, or late)", rank);
        if (ok && late_load_id && rank >= 0 && rank < s->cfg.tp_size)
            s_late_load(s, rank, rid, late_load_id);
        return;
    }
    uint32_t bit = 1u << rank;
    if (op->answered & bit)
        return;
    op->answered |= bit;
    if (ok) {
        op->ok |= bit;
        op->lora_rank = lora_rank;
        op->bytes = bytes > op->bytes ? bytes : op->bytes;
        op->pages = pages > op->pages ? pages : op->pages;
    } else if (!op->reason) {
        op->code = code;
        char text[512];
        snprintf(text, sizeof text, "worker %d: %s", rank, reason ? reason : "failed");
        op->reason = sched_strdup(text);
    }
    if (op->answered == (1u << s->cfg.tp_size) - 1)
        sched_op_complete(s, op);
}


// ---------------------------------------------------------------------------------------------
// loads and unloads asked for

void sched_adapter_load(sched_t *s, ls_msg_t *msg, void *reply) {
    const ls_msg_load_adapter_t *la = &msg->u.load_adapter;
    const char *id = la->adapter_id && *la->adapter_id ? la->adapter_id : la->name;
    const char *name = la->name && *la->name ? la->name : id;
    lora_adapter_t *ad = id ? lora_find(s->lora, id) : NULL;
    int slots = lora_slots(s->lora);
    uint32_t code = LS_ERROR_CODE_BAD_REQUEST;
    char why[300] = "";
    if (!id || !*id)
        snprintf(why, sizeof why, "LoadAdapter names no adapter");
    else if (la->from_tensors)
        snprintf(why, sizeof why, "the scheduler loads adapters from a path only, not from tensors");
    else if (!la->path || !*la->path)
        snprintf(why, sizeof why, "LoadAdapter has no path");
    else if (slots == 0)
        code = LS_ERROR_CODE_UNAVAILABLE, snprintf(why, sizeof why, "the workers have no adapter slots");
    else if (ad && (ad->unloading || ad->loading))
        code = LS_ERROR_CODE_UNAVAILABLE,
        snprintf(why, sizeof why, "adapter %s is being %s", name, ad->unloading ? "unloaded" : "loaded");
    else if (!ad && la->pinned && lora_pinned_count(s->lora) >= ls_pinned_max(slots))
        snprintf(why, sizeof why, "at most %d of the %d slots may be pinned, so unpinned adapters still run",
                 ls_pinned_max(slots), slots);
    if (*why || (ad && ad->resident)) {
        if (*why)
            ls_warn(msg->rid, "LoadAdapter %s refused: %s", name ? name : "?", why);
        sched_answer_loaded(s, reply, msg->rid, name, id, !*why, ad ? ad->rank : 0, ad ? ad->pages_need : 0, code, why);
        sched_reply_release(s, &reply);
        return;
    }
    // A tier full of pinned or busy adapters frees up as requests end: the load waits for
    // room (bounded by the load timeout) rather than being refused; none overtakes another.
    bool room = !s_first_queued_load(s) && s_cpu_make_room(s, ad ? ad->bytes : 0) == 0;
    if (!ad && !(ad = lora_add(s->lora, id, name, la->path, la->pinned))) {
        ls_error(0, "scheduler out of memory adding an adapter");
        abort();
    }
    ad->loading = true;
    op_t *op = s_op_new(s, OP_LOAD, ad, reply, msg->rid);
    if (room) {
        s_send_load(s, op, ad, s->now);
        return;
    }
    op->queued_at = s->now;
    ad->queued = true;
    ls_info(msg->rid, "adapter %s waits for room in the CPU tier: every adapter there is pinned or in use", name);
}

void sched_adapter_unload(sched_t *s, ls_msg_t *msg, void *reply) {
    const ls_msg_unload_adapter_t *ua = &msg->u.unload_adapter;
    lora_adapter_t *ad = NULL;
    if (ua->adapter_id && *ua->adapter_id)
        ad = lora_find(s->lora, ua->adapter_id);
    else
        for (int i = 0; i < lora_count(s->lora) && ua->name && !ad; i++)
            if (strcmp(lora_at(s->lora, i)->name, ua->name) == 0)
                ad = lora_at(s->lora, i);
    const char *label = ua->name ? ua->name : ua->adapter_id ? ua->adapter_id : "?";
    uint32_t code = 0;
    const char *why = NULL;
    if (!ad)
        code = LS_ERROR_CODE_NOT_FOUND, why = "no such adapter is loaded";
    else if (!ad->confirmed)
        code = LS_ERROR_CODE_UNAVAILABLE, why = "its first load is still in flight";
    else if (ad->unloading)
        code = LS_ERROR_CODE_BAD_REQUEST, why = "it is already being unloaded";
    if (why) {
        ls_warn(msg->rid, "UnloadAdapter %s refused: %s", label, why);
        sched_answer_unloaded(s, reply, msg->rid, ad ? ad->name : ua->name, ad ? ad->id : ua->adapter_id, false, code, why);
        sched_reply_release(s, &reply);
        return;
    }
    // From now on requests naming it are refused; it goes once its last request ends.
    ad->unloading = true;
    s_op_new(s, OP_UNLOAD, ad, reply, msg->rid);
    sched_adapter_unload_maybe(s, ad);
}

// ---------------------------------------------------------------------------------------------
// listings

int sched_adapter_names(const sched_t *s, bool running, int max, char *out, size_t cap) {
    const lora_adapter_t *seen[SCHED_MAX_LISTED];  // the names written
    int n = 0;
    size_t len = 0;
    if (max > SCHED_MAX_LISTED)
        max = SCHED_MAX_LISTED;
    if (cap)
        out[0] = 0;
    for (const req_t *r = (running ? &s->running : &s->waiting)->head; r && n < max; r = r->next) {
        const lora_adapter_t *ad = r->ad;
        if (!ad || !ad->name || strchr(ad->name, ','))
            continue;
        bool dup = false;
        for (int i = 0; i < n && !dup; i++)
            dup = seen[i] == ad;
        size_t need = strlen(ad->name) + (n > 0);
        if (dup || len + need >= cap)
            continue;
        snprintf(out + len, cap - len, "%s%s", n > 0 ? "," : "", ad->name);
        len += need;
        seen[n++] = ad;
    }
    return n;
}

void sched_list_adapters(const sched_t *s, ls_msg_t *list) {
    int n = lora_count(s->lora);
    ls_msg_adapter_infos_t *out = &list->u.adapter_list.adapters;
    out->v = sched_alloc(NULL, (size_t)(n ? n : 1) * sizeof *out->v);
    memset(out->v, 0, (size_t)(n ? n : 1) * sizeof *out->v);
    for (int i = 0; i < n; i++) {
        const lora_adapter_t *ad = lora_at(s->lora, i);
        ls_msg_adapter_info_t *ai = &out->v[out->n++];
        ai->name = sched_strdup(ad->name);
        ai->adapter_id = sched_strdup(ad->id);
        ai->path = sched_strdup(ad->path);
        ai->pinned = ad->pinned;
        ai->rank = ad->rank;
        ai->residency_known = true;
        ai->cpu_resident = ad->resident;
        ai->in_gpu_slot = ad->slot >= 0;
        ai->gpu_slot = ad->slot;
    }
}
