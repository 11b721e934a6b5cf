// core — refs, in-flight counters, LRU and the load/unload state machine (see core.h).
#include "core.h"

#include <czmq.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_hash.h"
#include "ls_limits.h"
#include "ls_log.h"

typedef struct op op_t;

typedef struct {
    char *id, *name, *path;
    bool pinned;
    uint32_t state;  // LS_ADAPTER_STATE_*
    uint32_t rank;
    float alpha;
    unsigned targets;
    uint32_t token_rows;  // trainable tokens' rows (check_result_t)
    ls_added_vocab_t added;  // its tokenizer's tokens past vocab_size (check_result_t)
    uint32_t in_flight;
    uint64_t last_used_ms;
    op_t *op;           // the load or unload in progress, NULL when READY
    void *order, *lru;  // handles in the load-order and LRU lists
} ref_t;

typedef enum { W_LOAD, W_UNLOAD, W_ACQUIRE } wkind_t;

typedef struct {
    void *w;
    wkind_t kind;
} waiter_t;

typedef enum { OP_LOAD, OP_UNLOAD, OP_CLEANUP } op_kind_t;
typedef enum { PH_CHECKING, PH_DRAINING, PH_DISPATCHED } op_phase_t;

// One load or unload in progress; its id is the rid of what goes to the scheduler.
struct op {
    uint64_t id;
    op_kind_t kind;
    reg_origin_t origin;
    op_phase_t phase;
    bool timed_out;           // its waiters heard TIMEOUT; it only waits for the late answer
    bool startup;             // counts toward Ready until it ends
    ref_t *ref;               // NULL once a load timed out, and for a cleanup
    char *name, *adapter_id;  // what was asked, for late answers and logs
    waiter_t *w;
    size_t nw, cap;
    void *timer;
    op_t *next;
};

struct reg {
    reg_config_t cfg;
    reg_host_t host;
    zhashx_t *by_name, *by_id;  // ref_t *, not owned by the maps
    zlistx_t *order;            // refs in load order (owns nothing)
    zlistx_t *lru;              // refs, least recently acquired first
    op_t *ops;
    uint64_t next_op;
    uint64_t load_counter;  // one per load begun: an input of the id hash
    int pinned;
    unsigned startup_pending;
    bool sealed, ready_sent, shutting_down;
    reg_stats_t stats;
};

static char *s_strdup(const char *s) {
    char *d = ls_msg_strdup(s ? s : "");
    if (!d) {
        // Out of memory in a registry of a few thousand short strings: nothing sane remains.
        ls_error(0, "registry out of memory");
        abort();
    }
    return d;
}

// ---------------------------------------------------------------------------------------------
// ids

void reg_id_derive(const char *name, const char *path, uint64_t counter, uint64_t now_ns, char *out) {
    uint64_t h[2] = {LS_HASH_FNV_BASIS, 0x84222325cbf29ce4ull};
    unsigned char b[16];
    for (int k = 0; k < 2; k++) {
        // NUL terminators separate the fields so ("ab","c") and ("a","bc") differ.
        h[k] = ls_hash_fnv1a(h[k], name ? name : "", strlen(name ? name : "") + 1);
        h[k] = ls_hash_fnv1a(h[k], path ? path : "", strlen(path ? path : "") + 1);
        h[k] = ls_hash_fnv1a(h[k], &counter, sizeof counter);
        h[k] = ls_hash_mix64(ls_hash_fnv1a(h[k], &now_ns, sizeof now_ns));
        for (int i = 0; i < 8; i++)
            b[k * 8 + i] = (unsigned char)(h[k] >> (8 * i));
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);  // version 4 layout
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
    static const char hex[] = "0123456789abcdef";
    char *o = out;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            *o++ = '-';
        *o++ = hex[b[i] >> 4];
        *o++ = hex[b[i] & 15];
    }
    *o = 0;
}

// ---------------------------------------------------------------------------------------------
// refs

static ref_t *s_ref_new(reg_t *self, const char *name, const char *path, bool pinned, const char *id) {
    ref_t *r = calloc(1, sizeof *r);
    if (!r) {
        ls_error(0, "registry out of memory");
        abort();
    }
    r->name = s_strdup(name);
    r->path = s_strdup(path);
    r->id = s_strdup(id);
    r->pinned = pinned;
    r->state = LS_ADAPTER_STATE_LOADING;
    zhashx_insert(self->by_name, r->name, r);
    zhashx_insert(self->by_id, r->id, r);
    r->order = zlistx_add_end(self->order, r);
    r->lru = zlistx_add_end(self->lru, r);
    self->pinned += pinned;
    return r;
}

static void s_ref_remove(reg_t *self, ref_t *r) {
    zhashx_delete(self->by_name, r->name);
    zhashx_delete(self->by_id, r->id);
    zlistx_delete(self->order, r->order);
    zlistx_delete(self->lru, r->lru);
    self->pinned -= r->pinned;
    self->stats.in_flight -= r->in_flight;
    free(r->id);
    free(r->name);
    free(r->path);
    ls_added_vocab_free(&r->added);
    free(r);
}

// ---------------------------------------------------------------------------------------------
// ops

static op_t *s_op_new(reg_t *self, op_kind_t kind, reg_origin_t origin, ref_t *ref, const char *name,
                      const char *adapter_id) {
    op_t *op = calloc(1, sizeof *op);
    if (!op) {
        ls_error(0, "registry out of memory");
        abort();
    }
    op->id = ++self->next_op;
    op->kind = kind;
    op->origin = origin;
    op->ref = ref;
    op->name = s_strdup(name);
    op->adapter_id = s_strdup(adapter_id);
    op->next = self->ops;
    self->ops = op;
    if (ref)
        ref->op = op;
    return op;
}

static op_t *s_op_find(const reg_t *self, uint64_t id) {
    for (op_t *op = self->ops; op; op = op->next)
        if (op->id == id)
            return op;
    return NULL;
}

static void s_op_wait(op_t *op, void *w, wkind_t kind) {
    if (!w)
        return;
    if (op->nw == op->cap) {
        op->cap = op->cap ? op->cap * 2 : 4;
        op->w = realloc(op->w, op->cap * sizeof *op->w);
        if (!op->w) {
            ls_error(0, "registry out of memory");
            abort();
        }
    }
    op->w[op->nw++] = (waiter_t){w, kind};
}

static void s_cancel(reg_t *self, op_t *op) {
    if (op->timer)
        self->host.cancel(self->host.host, op->timer);
    op->timer = NULL;
}

static void s_startup_check(reg_t *self) {
    if (self->sealed && self->startup_pending == 0 && !self->ready_sent) {
        self->ready_sent = true;
        self->host.ready(self->host.host);
    }
}

// A startup load has its outcome (Ready does not wait on a late answer after a timeout).
static void s_startup_done(reg_t *self, op_t *op) {
    if (!op->startup)
        return;
    op->startup = false;
    self->startup_pending--;
    s_startup_check(self);
}

// The op is over: unlink and free it (its waiters have been answered).
static void s_op_end(reg_t *self, op_t *op) {
    s_cancel(self, op);
    for (op_t **p = &self->ops; *p; p = &(*p)->next)
        if (*p == op) {
            *p = op->next;
            break;
        }
    if (op->ref)
        op->ref->op = NULL;
    s_startup_done(self, op);
    free(op->w);
    free(op->name);
    free(op->adapter_id);
    free(op);
}

// ---------------------------------------------------------------------------------------------
// answers

static void s_answer_loaded(reg_t *self, void *w, bool ok, const char *name, const char *id, uint32_t rank,
                            uint32_t code, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
    ls_msg_adapter_loaded_t *a = &m.u.adapter_loaded;
    a->ok = ok;
    a->name = ls_msg_strdup(name);
    a->adapter_id = ok ? ls_msg_strdup(id) : NULL;
    a->rank = rank;
    a->code = ok ? 0 : code;
    a->reason = ok ? NULL : ls_msg_strdup(reason);
    self->host.answer(self->host.host, w, &m);
    ls_msg_clear(&m);
}

static void s_answer_unloaded(reg_t *self, void *w, bool ok, const char *name, const char *id, uint32_t code,
                              const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
    ls_msg_adapter_unloaded_t *a = &m.u.adapter_unloaded;
    a->ok = ok;
    a->name = ls_msg_strdup(name);
    a->adapter_id = ls_msg_strdup(id);
    a->code = ok ? 0 : code;
    a->reason = ok ? NULL : ls_msg_strdup(reason);
    self->host.answer(self->host.host, w, &m);
    ls_msg_clear(&m);
}

static void s_answer_acquired(reg_t *self, void *w, const ref_t *r, const char *name, uint32_t code,
                              const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_ACQUIRED);
    ls_msg_adapter_acquired_t *a = &m.u.adapter_acquired;
    a->ok = code == 0;
    a->name = ls_msg_strdup(name);
    if (r) {
        a->adapter_id = ls_msg_strdup(r->id);
        a->rank = r->rank;
        a->token_rows = r->token_rows;
        a->added_tokens.v = r->added.n ? calloc((size_t)r->added.n, sizeof *a->added_tokens.v) : NULL;
        for (int i = 0; a->added_tokens.v && i < r->added.n; i++) {
            const ls_added_token_t *t = &r->added.tokens[i];
            a->added_tokens.v[a->added_tokens.n++] = (ls_msg_added_token_t){
                .id = t->id, .content = ls_msg_strdup(t->content), .special = t->special,
                .single_word = t->single_word, .lstrip = t->lstrip, .rstrip = t->rstrip,
                .normalized = t->normalized};
        }
    }
    a->code = code;
    a->reason = code ? ls_msg_strdup(reason) : NULL;
    if (code == LS_ERROR_CODE_NOT_FOUND)
        self->stats.acquire_misses++;
    self->host.answer(self->host.host, w, &m);
    ls_msg_clear(&m);
}

// The request now holds r: count it, move r to the LRU's recent end, answer with its id.
static void s_hold(reg_t *self, uint64_t now_ns, ref_t *r, void *w) {
    r->in_flight++;
    r->last_used_ms = now_ns / 1000000;
    zlistx_move_end(self->lru, r->lru);
    self->stats.in_flight++;
    self->stats.acquires++;
    s_answer_acquired(self, w, r, r->name, 0, NULL);
}

// Answer every waiter of op with the same failure. An acquire waiting on a load that failed
// asked for an adapter that does not exist: NOT_FOUND, unless the cause is transient.
static void s_fail_waiters(reg_t *self, op_t *op, uint32_t code, const char *reason) {
    uint32_t acquire_code = code == LS_ERROR_CODE_BAD_REQUEST ? LS_ERROR_CODE_NOT_FOUND : code;
    const char *id = op->ref ? op->ref->id : op->adapter_id;
    for (size_t i = 0; i < op->nw; i++) {
        waiter_t *w = &op->w[i];
        if (w->kind == W_LOAD)
            s_answer_loaded(self, w->w, false, op->name, id, 0, code, reason);
        else if (w->kind == W_UNLOAD)
            s_answer_unloaded(self, w->w, false, op->name, id, code, reason);
        else
            s_answer_acquired(self, w->w, NULL, op->name, acquire_code, reason);
    }
    op->nw = 0;
}

// ---------------------------------------------------------------------------------------------
// journal records

// A load, an unload, or (dropped) a restored adapter that no longer loads leaving the journal,
// which unlike a client's unload does not keep a --lora-paths adapter unloaded. 0, or -1 when
// the record could not be written (the disk is full, say).
static int s_journal(reg_t *self, const ref_t *r, bool load, bool dropped) {
    ls_msg_t m;
    ls_msg_init(&m, load ? LS_MSG_LOAD_ADAPTER : LS_MSG_UNLOAD_ADAPTER);
    if (load) {
        m.u.load_adapter.name = s_strdup(r->name);
        m.u.load_adapter.path = s_strdup(r->path);
        m.u.load_adapter.pinned = r->pinned;
        m.u.load_adapter.adapter_id = s_strdup(r->id);
    } else {
        m.u.unload_adapter.dropped = dropped;
        m.u.unload_adapter.name = s_strdup(r->name);
        m.u.unload_adapter.adapter_id = s_strdup(r->id);
    }
    int rc = self->host.journal(self->host.host, &m);
    ls_msg_clear(&m);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// loads

static void s_log_refusal(reg_origin_t origin, const char *what, const char *reason) {
    if (origin == REG_FROM_STARTUP || origin == REG_FROM_JOURNAL)
        ls_error(0, "startup adapter %s not loaded: %s", what, reason);
    else if (origin == REG_FROM_RESTORE)
        ls_error(0, "adapter %s could not be loaded into the restarted scheduler, and is dropped: %s", what, reason);
    else
        ls_info(0, "%s refused: %s", what, reason);
}

// A load failed (refused by a check, by the scheduler, or unreachable): answer everyone,
// forget the ref. The op itself is the caller's to end.
static void s_load_fail(reg_t *self, op_t *op, uint32_t code, const char *reason) {
    if (op->origin == REG_FROM_DEMAND && code == LS_ERROR_CODE_NOT_FOUND)
        ls_info(0, "on-demand load of %s: %s", op->name, reason);
    else {
        self->stats.load_failures++;
        s_log_refusal(op->origin, op->name, reason);
    }
    s_fail_waiters(self, op, code, reason);
    // The journal holds what is registered: a restored adapter that can no longer load (its
    // directory is gone or invalid) leaves it, or it could never be unloaded; the error above
    // names its path for whoever wants it back. A transient failure (workers down, timeout,
    // shutdown) keeps it for the next start.
    bool permanent = code == LS_ERROR_CODE_BAD_REQUEST || code == LS_ERROR_CODE_NOT_FOUND;
    bool journaled = op->origin == REG_FROM_JOURNAL || op->origin == REG_FROM_RESTORE;
    if (op->ref && journaled && permanent)
        s_journal(self, op->ref, false, true);
    if (op->ref && (!journaled || permanent))
        self->host.forget(self->host.host, op->ref->path);
    if (op->ref) {
        op->ref->op = NULL;
        s_ref_remove(self, op->ref);
        op->ref = NULL;
    }
}

static int s_send(reg_t *self, ls_msg_t *m, uint64_t rid) {
    m->rid = rid;
    int rc = self->host.send(self->host.host, m);
    ls_msg_clear(m);
    return rc;
}

static void s_dispatch_load(reg_t *self, op_t *op) {
    ref_t *r = op->ref;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    ls_msg_load_adapter_t *la = &m.u.load_adapter;
    la->name = s_strdup(r->name);
    la->path = s_strdup(r->path);
    la->pinned = r->pinned;
    la->adapter_id = s_strdup(r->id);
    la->slot = -1;  // the CPU tier; the scheduler decides about GPU slots
    op->phase = PH_DISPATCHED;
    if (s_send(self, &m, op->id) < 0) {
        s_load_fail(self, op, LS_ERROR_CODE_UNAVAILABLE, "the registry cannot reach the scheduler");
        s_op_end(self, op);
    }
}

// Why a load cannot even begin, in why (and the code), or 0.
static uint32_t s_load_refusal(const reg_t *self, reg_origin_t origin, const char *name, const char *path,
                               bool pinned, char *why, size_t cap) {
    const ref_t *taken = name ? zhashx_lookup(self->by_name, name) : NULL;
    if (self->shutting_down)
        return snprintf(why, cap, "the registry is shutting down"), LS_ERROR_CODE_SHUTTING_DOWN;
    if (check_name(name, why, cap) < 0)
        return LS_ERROR_CODE_BAD_REQUEST;
    if (origin != REG_FROM_DEMAND && (!path || !*path))
        return snprintf(why, cap, "LoadAdapter for %s has no path", name), LS_ERROR_CODE_BAD_REQUEST;
    if (taken && taken->state == LS_ADAPTER_STATE_UNLOADING)
        return snprintf(why, cap, "adapter %s is being unloaded; load it again once that has finished", name),
               LS_ERROR_CODE_UNAVAILABLE;
    if (taken)
        return snprintf(why, cap, "adapter %s is already %s (id %s); unload it first or choose another name", name,
                        taken->state == LS_ADAPTER_STATE_LOADING ? "being loaded" : "loaded", taken->id),
               LS_ERROR_CODE_BAD_REQUEST;
    if (pinned && self->pinned >= ls_pinned_max(self->cfg.max_loras_per_batch))
        return snprintf(why, cap,
                        "cannot pin %s: %d adapters are pinned and at most %d (--max-loras-per-batch %d minus one) "
                        "may be, so unpinned adapters and the base model always have a slot",
                        name, self->pinned, ls_pinned_max(self->cfg.max_loras_per_batch), self->cfg.max_loras_per_batch),
               LS_ERROR_CODE_BAD_REQUEST;
    return 0;
}

void reg_load(reg_t *self, uint64_t now_ns, reg_origin_t origin, const char *name, const char *path, bool pinned,
              const char *id, void *waiter) {
    char why[CHECK_REASON_MAX];
    uint32_t code = s_load_refusal(self, origin, name, path, pinned, why, sizeof why);
    if (code) {
        self->stats.load_failures++;
        s_log_refusal(origin, name ? name : "(no name)", why);
        if (waiter && origin == REG_FROM_DEMAND)
            s_answer_acquired(self, waiter, NULL, name, code, why);
        else if (waiter)
            s_answer_loaded(self, waiter, false, name, NULL, 0, code, why);
        return;
    }
    char derived[40];
    if (id && zhashx_lookup(self->by_id, id)) {
        ls_warn(0, "journal id %s of %s is already in use; %s gets a new one", id, name, name);
        id = NULL;
    }
    while (!id) {
        reg_id_derive(name, path, self->load_counter++, now_ns, derived);
        id = zhashx_lookup(self->by_id, derived) ? NULL : derived;
    }
    ref_t *r = s_ref_new(self, name, path, pinned, id);
    op_t *op = s_op_new(self, OP_LOAD, origin, r, name, id);
    op->phase = PH_CHECKING;
    op->startup = origin == REG_FROM_STARTUP || origin == REG_FROM_JOURNAL;
    self->startup_pending += op->startup;
    s_op_wait(op, waiter, origin == REG_FROM_DEMAND ? W_ACQUIRE : W_LOAD);
    op->timer = self->host.arm(self->host.host, op->id, self->cfg.load_timeout_ms);
    ls_info(0, "loading %s from %s (id %s%s)", name, origin == REG_FROM_DEMAND ? "--lora-dirs" : path, id,
            pinned ? ", pinned" : "");
    check_mode_t mode = origin == REG_FROM_CLIENT    ? CHECK_CONFINED
                        : origin == REG_FROM_DEMAND  ? CHECK_DEMAND
                        : origin == REG_FROM_TENSORS ? CHECK_TENSORS
                                                     : CHECK_TRUSTED;
    self->host.check(self->host.host, op->id, mode, name, path);
}

void reg_load_checked(reg_t *self, uint64_t now_ns, uint64_t opid, check_result_t *res) {
    op_t *op = s_op_find(self, opid);
    if (!op || op->kind != OP_LOAD || op->phase != PH_CHECKING)
        return;
    if (op->timed_out || !op->ref) {  // answered TIMEOUT while on disk; nothing was dispatched
        // The check may have written the host's copy after the timeout forgot the path.
        if (!res->code)
            self->host.forget(self->host.host, res->path);
        s_op_end(self, op);
        return;
    }
    if (res->code || self->shutting_down) {
        s_load_fail(self, op, res->code ? res->code : LS_ERROR_CODE_SHUTTING_DOWN,
                    res->code ? res->reason : "the registry is shutting down");
        s_op_end(self, op);
        return;
    }
    ref_t *r = op->ref;
    free(r->path);
    r->path = s_strdup(res->path);
    r->rank = res->rank;
    r->alpha = res->alpha;
    r->targets = res->targets;
    r->token_rows = res->token_rows;
    ls_added_vocab_free(&r->added);  // a ref loaded again (a restored journal entry)
    r->added = res->added;
    res->added = (ls_added_vocab_t){0};
    for (ref_t *other = zlistx_first(self->order); other; other = zlistx_next(self->order))
        if (other != r && !strcmp(other->path, r->path))
            ls_warn(0, "%s is already loaded as %s; loading another copy as %s", r->path, other->name, r->name);
    s_dispatch_load(self, op);
}

// ---------------------------------------------------------------------------------------------
// unloads

static void s_dispatch_unload(reg_t *self, op_t *op) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
    m.u.unload_adapter.name = s_strdup(op->name);
    m.u.unload_adapter.adapter_id = s_strdup(op->adapter_id);
    op->phase = PH_DISPATCHED;
    if (s_send(self, &m, op->id) < 0) {
        if (op->kind == OP_CLEANUP) {
            ls_error(0, "cannot reach the scheduler to undo the late load of %s (id %s): it may stay on the workers",
                     op->name, op->adapter_id);
        } else {
            op->ref->state = LS_ADAPTER_STATE_READY;
            s_fail_waiters(self, op, LS_ERROR_CODE_UNAVAILABLE,
                           "the registry cannot reach the scheduler; the adapter stays loaded");
        }
        s_op_end(self, op);
    }
}

void reg_unload(reg_t *self, uint64_t now_ns, const char *name, void *waiter) {
    ref_t *r = name ? zhashx_lookup(self->by_name, name) : NULL;
    char why[CHECK_REASON_MAX] = "";
    uint32_t code = LS_ERROR_CODE_UNAVAILABLE;
    if (self->shutting_down)
        code = LS_ERROR_CODE_SHUTTING_DOWN, snprintf(why, sizeof why, "the registry is shutting down");
    else if (!r)
        code = LS_ERROR_CODE_NOT_FOUND,
        snprintf(why, sizeof why, "adapter %s is not loaded", name ? name : "(no name)");
    else if (r->state == LS_ADAPTER_STATE_LOADING)
        snprintf(why, sizeof why, "adapter %s is still loading; unload it once it is loaded", name);
    else if (r->state == LS_ADAPTER_STATE_UNLOADING && r->op->timed_out)
        snprintf(why, sizeof why, "an unload of %s is waiting on the scheduler's answer", name);
    if (*why) {
        ls_info(0, "unload of %s refused: %s", name ? name : "(no name)", why);
        s_answer_unloaded(self, waiter, false, name, r ? r->id : NULL, code, why);
        return;
    }
    if (r->state == LS_ADAPTER_STATE_UNLOADING) {  // a second unload shares the first one's outcome
        s_op_wait(r->op, waiter, W_UNLOAD);
        return;
    }
    r->state = LS_ADAPTER_STATE_UNLOADING;
    op_t *op = s_op_new(self, OP_UNLOAD, REG_FROM_CLIENT, r, r->name, r->id);
    s_op_wait(op, waiter, W_UNLOAD);
    op->timer = self->host.arm(self->host.host, op->id, self->cfg.unload_timeout_ms);
    ls_info(0, "unloading %s (id %s): %u requests hold it", r->name, r->id, r->in_flight);
    if (r->in_flight == 0)
        s_dispatch_unload(self, op);
    else
        op->phase = PH_DRAINING;
}

// ---------------------------------------------------------------------------------------------
// acquire / release

void reg_acquire(reg_t *self, uint64_t now_ns, const char *name, void *waiter) {
    if (self->shutting_down) {
        s_answer_acquired(self, waiter, NULL, name, LS_ERROR_CODE_SHUTTING_DOWN, "the registry is shutting down");
        return;
    }
    if (!name || !*name) {  // the base model: nothing to hold
        s_answer_acquired(self, waiter, NULL, NULL, 0, NULL);
        return;
    }
    ref_t *r = zhashx_lookup(self->by_name, name);
    char why[CHECK_REASON_MAX];
    if (r && r->state == LS_ADAPTER_STATE_READY)
        s_hold(self, now_ns, r, waiter);
    else if (r && r->state == LS_ADAPTER_STATE_LOADING)
        s_op_wait(r->op, waiter, W_ACQUIRE);
    else if (r) {
        snprintf(why, sizeof why, "adapter %s is being unloaded and takes no new requests", name);
        s_answer_acquired(self, waiter, NULL, name, LS_ERROR_CODE_UNAVAILABLE, why);
    } else if (self->cfg.on_demand && check_name(name, why, sizeof why) == 0)
        reg_load(self, now_ns, REG_FROM_DEMAND, name, NULL, false, NULL, waiter);
    else {
        snprintf(why, sizeof why, "adapter %.128s is not loaded", name);
        s_answer_acquired(self, waiter, NULL, name, LS_ERROR_CODE_NOT_FOUND, why);
    }
}

void reg_release(reg_t *self, const char *id, const char *name) {
    ref_t *r = id ? zhashx_lookup(self->by_id, id) : NULL;
    if (!r || r->in_flight == 0) {
        self->stats.releases_unknown++;
        ls_warn(0, "release of adapter %s (id %s), which no request holds; ignored", name ? name : "?",
                id ? id : "none");
        return;
    }
    r->in_flight--;
    self->stats.in_flight--;
    if (r->state == LS_ADAPTER_STATE_UNLOADING && r->in_flight == 0 && r->op->phase == PH_DRAINING)
        s_dispatch_unload(self, r->op);
}

// ---------------------------------------------------------------------------------------------
// supervision (the launcher restarted a peer; docs/operations.md, "Supervision")

void reg_holders_lost(reg_t *self) {
    for (ref_t *r = zlistx_first(self->order); r; r = zlistx_next(self->order)) {
        if (!r->in_flight)
            continue;
        ls_warn(0, "the tokenizer went down: its %u holds of %s are gone", r->in_flight, r->name);
        self->stats.in_flight -= r->in_flight;
        r->in_flight = 0;
    }
    // Unloads that waited for those requests go ahead (dispatching may end ops: look again).
    for (bool again = true; again;) {
        again = false;
        for (op_t *op = self->ops; op; op = op->next)
            if (op->kind == OP_UNLOAD && op->phase == PH_DRAINING) {
                s_dispatch_unload(self, op);
                again = true;
                break;
            }
    }
}

void reg_scheduler_lost(reg_t *self, uint64_t now_ns) {
    for (bool again = true; again;) {  // completing an op may end others: look again each time
        again = false;
        for (op_t *op = self->ops; op; op = op->next)
            if (op->kind != OP_LOAD && (op->phase == PH_DISPATCHED || op->phase == PH_DRAINING)) {
                op->phase = PH_DISPATCHED;
                ls_msg_t m;
                ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
                m.rid = op->id;
                m.u.adapter_unloaded.ok = true;
                reg_answered(self, now_ns, &m);
                ls_msg_clear(&m);
                again = true;
                break;
            }
    }
    // The refs first (a failed send ends an op and removes its ref from the list).
    size_t n = zlistx_size(self->order), k = 0;
    ref_t **refs = calloc(n ? n : 1, sizeof *refs);
    if (!refs) {
        ls_error(0, "registry out of memory");
        abort();
    }
    for (ref_t *r = zlistx_first(self->order); r; r = zlistx_next(self->order))
        if (!r->op || r->op->phase == PH_DISPATCHED)  // one being checked is dispatched after
            refs[k++] = r;
    for (size_t i = 0; i < k; i++) {
        ref_t *r = refs[i];
        op_t *op = r->op;
        if (!op) {
            op = s_op_new(self, OP_LOAD, REG_FROM_RESTORE, r, r->name, r->id);
            r->state = LS_ADAPTER_STATE_LOADING;
            op->timer = self->host.arm(self->host.host, op->id, self->cfg.load_timeout_ms);
        }
        s_dispatch_load(self, op);
    }
    free(refs);
    ls_info(0, "the scheduler went down: %zu adapters are loaded again into its restart", k);
}

// ---------------------------------------------------------------------------------------------
// the scheduler's answers and timeouts

// A late "loaded" for a load already answered TIMEOUT: undo it on the workers.
static void s_cleanup(reg_t *self, const op_t *late) {
    ls_warn(0, "the scheduler loaded %s (id %s) after the load timed out; unloading it", late->name,
            late->adapter_id);
    op_t *op = s_op_new(self, OP_CLEANUP, late->origin, NULL, late->name, late->adapter_id);
    s_dispatch_unload(self, op);
}

static void s_loaded(reg_t *self, uint64_t now_ns, op_t *op, bool ok, uint32_t code, const char *reason) {
    if (op->timed_out) {
        if (ok)
            s_cleanup(self, op);
        else
            ls_info(0, "late answer for the timed-out load of %s: not loaded (%s)", op->name, reason);
        s_op_end(self, op);
        return;
    }
    if (!ok) {
        s_load_fail(self, op, code ? code : LS_ERROR_CODE_INTERNAL, reason && *reason ? reason : "load failed");
        s_op_end(self, op);
        return;
    }
    ref_t *r = op->ref;
    // A load is acknowledged only once it is in the journal (a restored one already is):
    // one the journal cannot take would vanish at the next restart, so it is undone instead.
    if (op->origin != REG_FROM_JOURNAL && op->origin != REG_FROM_RESTORE && s_journal(self, r, true, false) < 0) {
        s_load_fail(self, op, LS_ERROR_CODE_UNAVAILABLE,
                    "the registry could not record the load in its journal (is the disk full?); it is undone");
        s_cleanup(self, op);
        s_op_end(self, op);
        return;
    }
    r->state = LS_ADAPTER_STATE_READY;
    self->stats.loads++;
    self->stats.demand_loads += op->origin == REG_FROM_DEMAND;
    ls_info(0, "loaded %s (id %s, rank %u)", r->name, r->id, r->rank);
    for (size_t i = 0; i < op->nw; i++) {
        if (op->w[i].kind == W_LOAD)
            s_answer_loaded(self, op->w[i].w, true, r->name, r->id, r->rank, 0, NULL);
        else
            s_hold(self, now_ns, r, op->w[i].w);
    }
    op->nw = 0;
    s_op_end(self, op);
}

static void s_unloaded(reg_t *self, op_t *op, bool ok, uint32_t code, const char *reason) {
    if (op->kind == OP_CLEANUP) {
        if (ok)
            ls_info(0, "undid the late load of %s (id %s)", op->name, op->adapter_id);
        else
            ls_error(0, "could not undo the late load of %s (id %s): %s", op->name, op->adapter_id, reason);
        s_op_end(self, op);
        return;
    }
    ref_t *r = op->ref;
    if (!ok) {
        r->state = LS_ADAPTER_STATE_READY;
        ls_warn(0, "unload of %s refused by the scheduler: %s; it stays loaded", r->name, reason);
        s_fail_waiters(self, op, code ? code : LS_ERROR_CODE_INTERNAL, reason && *reason ? reason : "unload failed");
        s_op_end(self, op);
        return;
    }
    self->stats.unloads++;
    s_journal(self, r, false, false);
    self->host.forget(self->host.host, r->path);  // after the record: a crash between leaves a copy the next start sweeps
    ls_info(0, "unloaded %s (id %s)", r->name, r->id);
    for (size_t i = 0; i < op->nw; i++)
        s_answer_unloaded(self, op->w[i].w, true, r->name, r->id, 0, NULL);
    op->nw = 0;
    op->ref = NULL;
    r->op = NULL;
    s_ref_remove(self, r);
    s_op_end(self, op);
}

void reg_answered(reg_t *self, uint64_t now_ns, const ls_msg_t *msg) {
    op_t *op = s_op_find(self, msg->rid);
    bool is_load = op && op->kind == OP_LOAD;
    bool fits = op && op->phase == PH_DISPATCHED &&
                (msg->type == LS_MSG_ERROR || (msg->type == LS_MSG_ADAPTER_LOADED) == is_load);
    if (!fits) {
        self->stats.answers_unknown++;
        ls_warn(msg->rid, "%s from the scheduler answers no pending load or unload; ignored",
                ls_msg_type_name(msg->type));
        return;
    }
    s_cancel(self, op);
    bool ok;
    uint32_t code;
    const char *reason;
    if (msg->type == LS_MSG_ERROR)
        ok = false, code = msg->u.error.code, reason = msg->u.error.message;
    else if (is_load)
        ok = msg->u.adapter_loaded.ok, code = msg->u.adapter_loaded.code, reason = msg->u.adapter_loaded.reason;
    else
        ok = msg->u.adapter_unloaded.ok, code = msg->u.adapter_unloaded.code, reason = msg->u.adapter_unloaded.reason;
    if (is_load)
        s_loaded(self, now_ns, op, ok, code, reason ? reason : "");
    else
        s_unloaded(self, op, ok, code, reason ? reason : "");
}

void reg_timeout(reg_t *self, uint64_t now_ns, uint64_t opid) {
    op_t *op = s_op_find(self, opid);
    if (!op)
        return;
    s_cancel(self, op);
    char why[CHECK_REASON_MAX];
    if (op->kind == OP_LOAD) {
        snprintf(why, sizeof why,
                 "adapter %s was not loaded within %u ms (--load-timeout-ms); nothing stays loaded: should the "
                 "workers still load it, the registry unloads it",
                 op->name, self->cfg.load_timeout_ms);
        s_load_fail(self, op, LS_ERROR_CODE_TIMEOUT, why);
        op->timed_out = true;
        s_startup_done(self, op);
    } else if (op->phase == PH_DRAINING) {
        ref_t *r = op->ref;
        snprintf(why, sizeof why,
                 "%u requests still hold adapter %s after %u ms (--unload-timeout-ms); it stays loaded, retry the "
                 "unload later",
                 r->in_flight, r->name, self->cfg.unload_timeout_ms);
        ls_warn(0, "%s", why);
        r->state = LS_ADAPTER_STATE_READY;
        s_fail_waiters(self, op, LS_ERROR_CODE_TIMEOUT, why);
        s_op_end(self, op);
    } else if (op->kind == OP_UNLOAD) {
        // The workers may still free it, and the journal then records the unload: a TIMEOUT
        // would be contradicted, so the caller hears that the outcome is unknown.
        snprintf(why, sizeof why,
                 "the workers did not confirm unloading %s within %u ms (--unload-timeout-ms); it takes no new "
                 "requests until they answer, and may still be unloaded: list the adapters to know",
                 op->name, self->cfg.unload_timeout_ms);
        ls_warn(0, "%s", why);
        s_fail_waiters(self, op, LS_ERROR_CODE_OUTCOME_UNKNOWN, why);
        op->timed_out = true;
    }
}

// ---------------------------------------------------------------------------------------------
// lifecycle and views

reg_t *reg_new(const reg_config_t *cfg, const reg_host_t *host) {
    reg_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->cfg = *cfg;
    self->host = *host;
    self->by_name = zhashx_new();
    self->by_id = zhashx_new();
    self->order = zlistx_new();
    self->lru = zlistx_new();
    if (!self->by_name || !self->by_id || !self->order || !self->lru)
        reg_destroy(&self);
    return self;
}

void reg_destroy(reg_t **self_p) {
    reg_t *self = *self_p;
    if (!self)
        return;
    while (self->ops) {
        op_t *op = self->ops;
        for (size_t i = 0; i < op->nw; i++)
            self->host.answer(self->host.host, op->w[i].w, NULL);
        op->nw = 0;
        op->startup = false;
        s_op_end(self, op);
    }
    while (self->order && zlistx_size(self->order))
        s_ref_remove(self, zlistx_first(self->order));
    zhashx_destroy(&self->by_name);
    zhashx_destroy(&self->by_id);
    zlistx_destroy(&self->order);
    zlistx_destroy(&self->lru);
    free(self);
    *self_p = NULL;
}

void reg_startup_seal(reg_t *self) {
    self->sealed = true;
    s_startup_check(self);
}

void reg_shutdown(reg_t *self) {
    self->shutting_down = true;
    for (op_t *op = self->ops; op; op = op->next)
        s_fail_waiters(self, op, LS_ERROR_CODE_SHUTTING_DOWN, "the registry is shutting down");
}

bool reg_has(const reg_t *self, const char *name) { return name && zhashx_lookup(self->by_name, name); }

void reg_list(const reg_t *self, ls_msg_t *list) {
    size_t n = zlistx_size(self->order), i = 0;
    ls_msg_adapter_infos_t *out = &list->u.adapter_list.adapters;
    out->v = n ? calloc(n, sizeof *out->v) : NULL;
    if (n && !out->v) {
        ls_error(0, "registry out of memory");
        abort();
    }
    out->n = n;
    for (ref_t *r = zlistx_first(self->order); r; r = zlistx_next(self->order)) {
        ls_msg_adapter_info_t *a = &out->v[i++];
        a->name = s_strdup(r->name);
        a->adapter_id = s_strdup(r->id);
        a->path = s_strdup(r->path);
        a->pinned = r->pinned;
        a->rank = r->rank;
        a->alpha = r->alpha;
        a->in_flight = r->in_flight;
        a->state = r->state;
        a->last_used_ms = r->last_used_ms;
        size_t nt = (size_t)__builtin_popcount(r->targets), k = 0;
        a->target_modules.v = nt ? calloc(nt, sizeof(char *)) : NULL;
        a->target_modules.n = a->target_modules.v ? nt : 0;
        for (int t = 0; t < LS_TARGET_ALL && a->target_modules.v; t++)
            if (r->targets >> t & 1)
                a->target_modules.v[k++] = s_strdup(ls_target_name((ls_target_t)t));
    }
}

const char *reg_lru_at(const reg_t *self, size_t i) {
    for (ref_t *r = zlistx_first(self->lru); r; r = zlistx_next(self->lru))
        if (i-- == 0)
            return r->name;
    return NULL;
}

const reg_stats_t *reg_stats(const reg_t *self) { return &self->stats; }
