// dispatch — see dispatch.h and docs/scheduling.md, "Data-parallel groups".
#include "dispatch.h"

#include <czmq.h>

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_hash.h"
#include "ls_log.h"

// Fan-out rids (the dispatcher's own, one per command sent to the groups) carry this bit, so
// an answer is told from a request's Error by its rid alone; the tokenizer's request rids
// count up from 1 and never reach it.
#define S_OP_RID_BIT (1ull << 62)
// Prefix affinity: the first S_PREFIX_BLOCKS whole blocks of a prompt are hashed, each length
// on its own, into a direct-mapped table of S_PREFIX_SLOTS entries (a new prefix overwrites
// an old one in its slot: bounded memory, and an old prefix's KV is the likeliest evicted).
#define S_PREFIX_BLOCKS 8
#define S_PREFIX_SLOTS 4096

typedef struct {
    uint64_t rid;
    int group;
    void *reply;
    char *adapter_id;  // NULL: the base model
} req_t;

// Where an adapter's requests went: the groups with its requests not ended, and the last one.
typedef struct {
    uint32_t outstanding[DISP_MAX_GROUPS];
    int last_group;
} aff_t;

typedef enum { S_OP_LOAD, S_OP_UNLOAD, S_OP_LIST, S_OP_RELOAD } op_kind_t;

typedef struct op {
    uint64_t rid;       // the dispatcher's, S_OP_RID_BIT set
    uint64_t asker_rid; // the asker's rid, on the one answer
    op_kind_t kind;
    void *reply;
    uint32_t pending;   // groups not answered yet
    uint32_t ok;        // groups that answered ok
    int group;          // S_OP_RELOAD: the restarted group
    uint32_t code;      // the first failure's code and reason
    char *reason;
    uint32_t rank;
    uint64_t bytes;
    ls_msg_t cmd;       // the command as the asker sent it (load, unload)
    ls_msg_t list;      // S_OP_LIST: the merged AdapterList
    struct op *next;
} op_t;

typedef struct {
    bool sched_up;     // its scheduler is up (assumed at start: the launcher starts every actor)
    int workers_down;  // its workers the launcher said are down and not yet back
    int reloads;       // adapters being loaded again into it after its scheduler restarted
} group_t;

struct disp {
    disp_config_t cfg;
    disp_io_t io;
    group_t groups[DISP_MAX_GROUPS];
    zhashx_t *reqs;  // rid (hex) -> req_t
    zhashx_t *affs;  // adapter id -> aff_t
    struct {
        uint64_t key;
        int group;  // -1: empty
    } prefix[S_PREFIX_SLOTS];
    ls_msg_t *adapters;  // the LoadAdapters every group is to hold, in load order
    size_t nadapters;
    op_t *ops;  // fan-outs in flight, oldest first
    uint64_t next_op;
    disp_stats_t st;
};

uint64_t disp_imbalance_bound(uint64_t total) {
    uint64_t b = total / 8;
    return b > 4 ? b : 4;
}

static void s_free_req(void **item) {
    req_t *r = *item;
    if (r) {
        free(r->adapter_id);
        free(r);
    }
    *item = NULL;
}

static void s_free_block(void **item) {
    free(*item);
    *item = NULL;
}

disp_t *disp_new(const disp_config_t *cfg, const disp_io_t *io) {
    if (cfg->groups < 1 || cfg->groups > DISP_MAX_GROUPS || cfg->block_size < 1 || !io->emit)
        return NULL;
    disp_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->cfg = *cfg;
    self->io = *io;
    self->reqs = zhashx_new();
    self->affs = zhashx_new();
    if (!self->reqs || !self->affs) {
        disp_destroy(&self);
        return NULL;
    }
    zhashx_set_destructor(self->reqs, s_free_req);
    zhashx_set_destructor(self->affs, s_free_block);
    for (int g = 0; g < cfg->groups; g++)
        self->groups[g].sched_up = true;
    for (int i = 0; i < S_PREFIX_SLOTS; i++)
        self->prefix[i].group = -1;
    return self;
}

static void s_op_free(op_t *op) {
    ls_msg_clear(&op->cmd);
    ls_msg_clear(&op->list);
    free(op->reason);
    free(op);
}

void disp_destroy(disp_t **self_p) {
    disp_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy(&self->reqs);  // handles are released by disp_shutdown, not here
    zhashx_destroy(&self->affs);
    for (size_t i = 0; i < self->nadapters; i++)
        ls_msg_clear(&self->adapters[i]);
    free(self->adapters);
    while (self->ops) {
        op_t *next = self->ops->next;
        s_op_free(self->ops);
        self->ops = next;
    }
    free(self);
    *self_p = NULL;
}

bool disp_group_live(const disp_t *self, int g) {
    const group_t *gr = &self->groups[g];
    return gr->sched_up && gr->workers_down == 0 && gr->reloads == 0;
}

static void s_publish_dead(disp_t *self) {
    self->st.groups_dead = 0;
    for (int g = 0; g < self->cfg.groups; g++)
        self->st.groups_dead += !disp_group_live(self, g);
}

const disp_stats_t *disp_stats(const disp_t *self) { return &self->st; }

static void s_emit(disp_t *self, disp_dest_kind_t kind, int group, void *reply, const ls_msg_t *msg) {
    self->io.emit(self->io.arg, &(disp_dest_t){.kind = kind, .group = group, .reply = reply}, msg);
}

static void s_release(disp_t *self, void *reply) {
    if (reply && self->io.release)
        self->io.release(self->io.arg, reply);
}

static void s_key(uint64_t rid, char key[24]) { snprintf(key, 24, "%" PRIx64, rid); }

static void s_error(disp_t *self, void *reply, uint64_t rid, uint32_t code, uint32_t ref_type, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ERROR);
    m.rid = rid;
    m.u.error.code = code;
    m.u.error.ref_type = ref_type;
    m.u.error.message = ls_msg_strdup(why);
    s_emit(self, DISP_TO_REPLY, -1, reply, &m);
    ls_msg_clear(&m);
}

// ---------------------------------------------------------------------------------------------
// requests

// The prefix keys of a prompt: one per whole block up to S_PREFIX_BLOCKS, each covering the
// adapter and every token before its block's end (KV depends on every earlier token, and
// KV is never shared between adapters). Returns how many.
static int s_prefix_keys(const disp_t *self, const char *adapter_id, const ls_i32s_t *ids, uint64_t *keys) {
    uint64_t h = ls_hash_fnv1a(LS_HASH_FNV_BASIS, adapter_id ? adapter_id : "", adapter_id ? strlen(adapter_id) + 1 : 1);
    size_t bs = (size_t)self->cfg.block_size;
    int n = 0;
    for (size_t end = bs; end <= ids->n && n < S_PREFIX_BLOCKS; end += bs) {
        h = ls_hash_fnv1a(h, ids->v + end - bs, bs * sizeof *ids->v);
        keys[n++] = h;
    }
    return n;
}

// The group for a new request (docs/scheduling.md): adapter affinity, prefix affinity, then
// load, never an affinity group at or past the bound over the least-loaded live group.
// Returns -1 when no group is live.
static int s_choose(disp_t *self, const aff_t *aff, const uint64_t *keys, int nkeys, disp_choice_t *by) {
    int least = -1;
    uint64_t total = 0;
    for (int g = 0; g < self->cfg.groups; g++) {
        total += self->st.load[g];
        if (!disp_group_live(self, g))
            continue;
        // Ties go to the group dispatched fewest: new adapters spread over idle groups.
        if (least < 0 || self->st.load[g] < self->st.load[least] ||
            (self->st.load[g] == self->st.load[least] && self->st.dispatched[g] < self->st.dispatched[least]))
            least = g;
    }
    if (least < 0)
        return -1;
    uint64_t limit = self->st.load[least] + disp_imbalance_bound(total);
    bool overridden = false;
    if (aff) {
        int best = -1;
        for (int g = 0; g < self->cfg.groups; g++)
            if (disp_group_live(self, g) && aff->outstanding[g] && (best < 0 || aff->outstanding[g] > aff->outstanding[best]))
                best = g;
        if (best < 0 && aff->last_group >= 0 && disp_group_live(self, aff->last_group))
            best = aff->last_group;
        if (best >= 0 && self->st.load[best] < limit) {
            *by = DISP_BY_ADAPTER;
            return best;
        }
        overridden = best >= 0;
    }
    for (int k = nkeys - 1; k >= 0; k--) {
        const int g = self->prefix[keys[k] % S_PREFIX_SLOTS].group;
        if (g < 0 || self->prefix[keys[k] % S_PREFIX_SLOTS].key != keys[k] || !disp_group_live(self, g))
            continue;
        if (self->st.load[g] < limit) {
            self->st.bound_overrides += overridden;
            *by = DISP_BY_PREFIX;
            return g;
        }
        overridden = true;
        break;
    }
    self->st.bound_overrides += overridden;
    *by = DISP_BY_LOAD;
    return least;
}

void disp_on_request(disp_t *self, uint64_t now, ls_msg_t *msg, void *reply) {
    const ls_msg_tokenized_req_t *tr = &msg->u.tokenized_req;
    char key[24];
    s_key(msg->rid, key);
    if (zhashx_lookup(self->reqs, key)) {
        s_error(self, reply, msg->rid, LS_ERROR_CODE_BAD_REQUEST, LS_MSG_TOKENIZED_REQ, "request id in use");
        s_release(self, reply);
        return;
    }
    const char *adapter = tr->adapter_id && *tr->adapter_id ? tr->adapter_id : NULL;
    aff_t *aff = adapter ? zhashx_lookup(self->affs, adapter) : NULL;
    uint64_t keys[S_PREFIX_BLOCKS];
    int nkeys = s_prefix_keys(self, adapter, &tr->input_ids, keys);
    disp_choice_t by;
    int g = s_choose(self, aff, keys, nkeys, &by);
    if (g < 0) {
        self->st.requests_failed++;
        s_error(self, reply, msg->rid, LS_ERROR_CODE_UNAVAILABLE, LS_MSG_TOKENIZED_REQ,
                "no data-parallel group is up; retry the request");
        s_release(self, reply);
        return;
    }
    req_t *r = calloc(1, sizeof *r);
    if (adapter && !aff) {
        aff = calloc(1, sizeof *aff);
        if (aff)
            zhashx_insert(self->affs, adapter, aff);
    }
    if (!r || (adapter && !(aff && (r->adapter_id = strdup(adapter))))) {
        free(r);
        s_error(self, reply, msg->rid, LS_ERROR_CODE_INTERNAL, LS_MSG_TOKENIZED_REQ, "the dispatcher is out of memory");
        s_release(self, reply);
        return;
    }
    r->rid = msg->rid;
    r->group = g;
    r->reply = reply;
    zhashx_insert(self->reqs, key, r);
    if (aff) {
        aff->outstanding[g]++;
        aff->last_group = g;
    }
    for (int k = 0; k < nkeys; k++) {
        self->prefix[keys[k] % S_PREFIX_SLOTS].key = keys[k];
        self->prefix[keys[k] % S_PREFIX_SLOTS].group = g;
    }
    self->st.load[g]++;
    self->st.dispatched[g]++;
    self->st.by[by]++;
    s_emit(self, DISP_TO_GROUP, g, NULL, msg);
}

// The group is done with the request: its load drops, its handle goes.
static void s_req_end(disp_t *self, req_t *r) {
    self->st.load[r->group]--;
    aff_t *aff = r->adapter_id ? zhashx_lookup(self->affs, r->adapter_id) : NULL;
    if (aff && aff->outstanding[r->group])
        aff->outstanding[r->group]--;
    s_release(self, r->reply);
    char key[24];
    s_key(r->rid, key);
    zhashx_delete(self->reqs, key);
}

void disp_on_abort(disp_t *self, uint64_t now, const ls_msg_t *msg) {
    char key[24];
    s_key(msg->rid, key);
    req_t *r = zhashx_lookup(self->reqs, key);
    if (r) {
        s_emit(self, DISP_TO_GROUP, r->group, NULL, msg);
        return;
    }
    // Not here (ended, or never seen): the group that may have it is unknown, so every one.
    for (int g = 0; g < self->cfg.groups; g++)
        if (self->groups[g].sched_up)
            s_emit(self, DISP_TO_GROUP, g, NULL, msg);
}

// The requests of group g in rid order (hash order is not deterministic); the caller frees.
static req_t **s_group_reqs(disp_t *self, int g, size_t *n) {
    req_t **v = calloc(zhashx_size(self->reqs) + 1, sizeof *v);
    *n = 0;
    if (!v)
        return NULL;
    for (req_t *r = zhashx_first(self->reqs); r; r = zhashx_next(self->reqs))
        if (g < 0 || r->group == g)
            v[(*n)++] = r;
    for (size_t i = 1; i < *n; i++)  // insertion sort: a group's requests are few
        for (size_t j = i; j > 0 && v[j - 1]->rid > v[j]->rid; j--) {
            req_t *t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v;
}

// ---------------------------------------------------------------------------------------------
// adapter commands: one to every live group, one answer

static op_t *s_op_new(disp_t *self, op_kind_t kind, void *reply, uint64_t asker_rid) {
    op_t *op = calloc(1, sizeof *op);
    if (!op)
        return NULL;
    op->rid = S_OP_RID_BIT | ++self->next_op;
    op->kind = kind;
    op->reply = reply;
    op->asker_rid = asker_rid;
    op->group = -1;
    ls_msg_init(&op->cmd, LS_MSG_LOAD_ADAPTER);
    ls_msg_init(&op->list, LS_MSG_ADAPTER_LIST);
    op_t **tail = &self->ops;
    while (*tail)
        tail = &(*tail)->next;
    *tail = op;
    return op;
}

static void s_op_unlink(disp_t *self, op_t *op) {
    for (op_t **p = &self->ops; *p; p = &(*p)->next)
        if (*p == op) {
            *p = op->next;
            return;
        }
}

// A command to one group that nobody waits for (a rollback): its answer is ignored.
static void s_send_untracked(disp_t *self, int g, const ls_msg_t *cmd, ls_msg_type_t type) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = S_OP_RID_BIT | ++self->next_op;
    if (type == LS_MSG_UNLOAD_ADAPTER) {
        m.u.unload_adapter.name = ls_msg_strdup(cmd->u.load_adapter.name);
        m.u.unload_adapter.adapter_id = ls_msg_strdup(cmd->u.load_adapter.adapter_id);
        s_emit(self, DISP_TO_GROUP, g, NULL, &m);
    } else {
        uint64_t rid = m.rid;
        ls_msg_clear(&m);
        if (ls_msg_copy(&m, cmd) == 0) {
            m.rid = rid;
            s_emit(self, DISP_TO_GROUP, g, NULL, &m);
        }
    }
    ls_msg_clear(&m);
}

static long s_adapter_find(const disp_t *self, const char *id) {
    for (size_t i = 0; id && i < self->nadapters; i++)
        if (self->adapters[i].u.load_adapter.adapter_id && !strcmp(self->adapters[i].u.load_adapter.adapter_id, id))
            return (long)i;
    return -1;
}

static void s_adapter_forget(disp_t *self, const char *id) {
    long i = s_adapter_find(self, id);
    if (i < 0)
        return;
    ls_msg_clear(&self->adapters[i]);
    memmove(&self->adapters[i], &self->adapters[i + 1], (self->nadapters - (size_t)i - 1) * sizeof *self->adapters);
    self->st.adapters = --self->nadapters;
}

static void s_adapter_keep(disp_t *self, const ls_msg_t *cmd) {
    s_adapter_forget(self, cmd->u.load_adapter.adapter_id);
    ls_msg_t *v = realloc(self->adapters, (self->nadapters + 1) * sizeof *v);
    if (!v || ls_msg_copy(&v[self->nadapters], cmd) < 0) {
        if (v)
            self->adapters = v;
        ls_error(cmd->rid, "out of memory: a restarted group will not have adapter %s", cmd->u.load_adapter.name);
        return;
    }
    self->adapters = v;
    self->st.adapters = ++self->nadapters;
}

// Every group answered (or died): the asker hears one answer.
static void s_op_finish(disp_t *self, op_t *op) {
    s_op_unlink(self, op);
    ls_msg_t m;
    const char *name = op->kind == S_OP_UNLOAD ? op->cmd.u.unload_adapter.name : op->cmd.u.load_adapter.name;
    const char *id = op->kind == S_OP_UNLOAD ? op->cmd.u.unload_adapter.adapter_id : op->cmd.u.load_adapter.adapter_id;
    bool failed = op->reason != NULL;
    switch (op->kind) {
    case S_OP_RELOAD:
        if (failed)
            ls_error(0, "adapter %s could not be loaded again into group %d: %s; its requests there will fail",
                     name ? name : "?", op->group, op->reason);
        if (self->groups[op->group].reloads > 0 && --self->groups[op->group].reloads == 0)
            ls_info(0, "group %d holds its adapters again: it takes requests", op->group);
        break;
    case S_OP_LOAD:
        // All or nothing, as the scheduler does across its workers: the groups that loaded it
        // unload it again, so no group serves an adapter the registry thinks is not loaded.
        for (int g = 0; failed && g < self->cfg.groups; g++)
            if (op->ok >> g & 1)
                s_send_untracked(self, g, &op->cmd, LS_MSG_UNLOAD_ADAPTER);
        if (!failed)
            s_adapter_keep(self, &op->cmd);
        ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
        m.rid = op->asker_rid;
        m.u.adapter_loaded.ok = !failed;
        m.u.adapter_loaded.name = ls_msg_strdup(name);
        m.u.adapter_loaded.adapter_id = ls_msg_strdup(id);
        m.u.adapter_loaded.rank = op->rank;
        m.u.adapter_loaded.bytes = op->bytes;
        m.u.adapter_loaded.code = failed ? op->code : 0;
        m.u.adapter_loaded.reason = failed ? ls_msg_strdup(op->reason) : NULL;
        s_emit(self, DISP_TO_REPLY, -1, op->reply, &m);
        ls_msg_clear(&m);
        break;
    case S_OP_UNLOAD: {
        // A refused unload leaves the adapter loaded (the registry keeps it): the groups that
        // did unload it load it again.
        long at = s_adapter_find(self, id);
        for (int g = 0; failed && at >= 0 && g < self->cfg.groups; g++)
            if (op->ok >> g & 1)
                s_send_untracked(self, g, &self->adapters[at], LS_MSG_LOAD_ADAPTER);
        if (!failed)
            s_adapter_forget(self, id);
        ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
        m.rid = op->asker_rid;
        m.u.adapter_unloaded.ok = !failed;
        m.u.adapter_unloaded.name = ls_msg_strdup(name);
        m.u.adapter_unloaded.adapter_id = ls_msg_strdup(id);
        m.u.adapter_unloaded.code = failed ? op->code : 0;
        m.u.adapter_unloaded.reason = failed ? ls_msg_strdup(op->reason) : NULL;
        s_emit(self, DISP_TO_REPLY, -1, op->reply, &m);
        ls_msg_clear(&m);
        break;
    }
    case S_OP_LIST:
        op->list.rid = op->asker_rid;
        s_emit(self, DISP_TO_REPLY, -1, op->reply, &op->list);
        break;
    }
    s_release(self, op->reply);
    s_op_free(op);
    s_publish_dead(self);
}

static void s_op_fail(op_t *op, uint32_t code, const char *reason) {
    if (op->reason)
        return;  // the first failure is the one told
    op->code = code ? code : LS_ERROR_CODE_INTERNAL;
    op->reason = strdup(reason && *reason ? reason : "failed");
}

// Residency from one group into the merged list: an adapter is resident where any group holds it.
static void s_list_merge(ls_msg_t *into, const ls_msg_t *from) {
    ls_msg_adapter_infos_t *dst = &into->u.adapter_list.adapters;
    const ls_msg_adapter_infos_t *src = &from->u.adapter_list.adapters;
    for (size_t i = 0; i < src->n; i++) {
        const ls_msg_adapter_info_t *s = &src->v[i];
        ls_msg_adapter_info_t *d = NULL;
        for (size_t k = 0; k < dst->n && !d; k++)
            if (s->adapter_id && dst->v[k].adapter_id && !strcmp(s->adapter_id, dst->v[k].adapter_id))
                d = &dst->v[k];
        if (!d) {
            ls_msg_adapter_info_t *v = realloc(dst->v, (dst->n + 1) * sizeof *v);
            if (!v)
                continue;
            dst->v = v;
            d = &v[dst->n++];
            memset(d, 0, sizeof *d);
            d->name = ls_msg_strdup(s->name);
            d->adapter_id = ls_msg_strdup(s->adapter_id);
        }
        d->cpu_resident |= s->cpu_resident;
        if (s->in_gpu_slot && !d->in_gpu_slot) {
            d->in_gpu_slot = true;
            d->gpu_slot = s->gpu_slot;
        }
    }
}

static void s_op_answer(disp_t *self, op_t *op, int g, const ls_msg_t *msg) {
    if (!(op->pending >> g & 1))
        return;
    op->pending &= ~(1u << g);
    switch (msg->type) {
    case LS_MSG_ADAPTER_LOADED:
        if (msg->u.adapter_loaded.ok) {
            op->ok |= 1u << g;
            if (!op->rank) {
                op->rank = msg->u.adapter_loaded.rank;
                op->bytes = msg->u.adapter_loaded.bytes;
            }
        } else
            s_op_fail(op, msg->u.adapter_loaded.code, msg->u.adapter_loaded.reason);
        break;
    case LS_MSG_ADAPTER_UNLOADED:
        if (msg->u.adapter_unloaded.ok)
            op->ok |= 1u << g;
        else
            s_op_fail(op, msg->u.adapter_unloaded.code, msg->u.adapter_unloaded.reason);
        break;
    case LS_MSG_ADAPTER_LIST:
        s_list_merge(&op->list, msg);
        break;
    case LS_MSG_ERROR:
        s_op_fail(op, msg->u.error.code, msg->u.error.message);
        break;
    default:
        break;
    }
    if (!op->pending)
        s_op_finish(self, op);
}

void disp_on_adapter_command(disp_t *self, uint64_t now, ls_msg_t *msg, void *reply) {
    op_kind_t kind = msg->type == LS_MSG_LOAD_ADAPTER ? S_OP_LOAD : msg->type == LS_MSG_UNLOAD_ADAPTER ? S_OP_UNLOAD : S_OP_LIST;
    op_t *op = s_op_new(self, kind, reply, msg->rid);
    if (!op) {
        s_error(self, reply, msg->rid, LS_ERROR_CODE_INTERNAL, msg->type, "the dispatcher is out of memory");
        s_release(self, reply);
        return;
    }
    // Groups whose scheduler is up take the command, even with a worker down (the scheduler
    // holds it until its workers report); a group down gets the adapters when it is back.
    for (int g = 0; g < self->cfg.groups; g++)
        if (self->groups[g].sched_up)
            op->pending |= 1u << g;
    ls_msg_clear(&op->cmd);
    op->cmd = *msg;  // moved: kept for the answer, the rollback and the list of adapters
    ls_msg_init(msg, msg->type);
    op->cmd.rid = op->rid;
    // A restarted group gets its adapters again from what the dispatcher kept of each load; it
    // keeps no weights, so a load from tensors could not be repeated: refused, none loads it.
    if (kind == S_OP_LOAD && op->cmd.u.load_adapter.from_tensors) {
        op->pending = 0;
        s_op_fail(op, LS_ERROR_CODE_BAD_REQUEST,
                  "with data-parallel groups adapters load from a path only, not from tensors: the dispatcher "
                  "re-loads a restarted group from the path");
    }
    if (!op->pending && kind != S_OP_LIST)
        s_op_fail(op, LS_ERROR_CODE_UNAVAILABLE, "no data-parallel group is up");
    for (int g = 0; g < self->cfg.groups; g++)
        if (op->pending >> g & 1)
            s_emit(self, DISP_TO_GROUP, g, NULL, &op->cmd);
    if (!op->pending)
        s_op_finish(self, op);
}

// ---------------------------------------------------------------------------------------------
// the groups

void disp_on_group_message(disp_t *self, uint64_t now, int g, ls_msg_t *msg) {
    if (msg->rid & S_OP_RID_BIT) {
        for (op_t *op = self->ops; op; op = op->next)
            if (op->rid == msg->rid) {
                s_op_answer(self, op, g, msg);
                return;
            }
        return;  // a rollback's answer, or one for a fan-out a death finished
    }
    char key[24];
    s_key(msg->rid, key);
    req_t *r = zhashx_lookup(self->reqs, key);
    if (!r || r->group != g) {
        ls_debug(msg->rid, "%s from group %d for no request of its here: dropped", ls_msg_type_name(msg->type), g);
        return;
    }
    switch (msg->type) {
    case LS_MSG_REQUEST_ENDED:
        s_req_end(self, r);
        break;
    case LS_MSG_ERROR:      // a refusal (429, 413, 404 …): the sender's to read
    case LS_MSG_TOKEN_OUT:  // the scheduler's --output route
        s_emit(self, DISP_TO_REPLY, -1, r->reply, msg);
        break;
    default:
        ls_debug(msg->rid, "%s from group %d: not relayed", ls_msg_type_name(msg->type), g);
        break;
    }
}

// Group g's scheduler is gone with every request it had: each is answered here (a final
// TokenOut ERROR on the output path, as the scheduler answers a lost worker), and the
// fan-outs stop waiting for it.
static void s_group_lost(disp_t *self, uint64_t now, int g, const char *why) {
    size_t n;
    req_t **v = s_group_reqs(self, g, &n);
    char text[300];
    snprintf(text, sizeof text, "data-parallel group %d failed (%s); retry the request", g, why ? why : "");
    for (size_t i = 0; v && i < n; i++) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_TOKEN_OUT);
        m.rid = v[i]->rid;
        m.u.token_out.first = true;  // the detokenizer may never have seen it
        m.u.token_out.finish = LS_FINISH_REASON_ERROR;
        m.u.token_out.error = ls_msg_strdup(text);
        s_emit(self, DISP_TO_OUTPUT, -1, v[i]->reply, &m);
        ls_msg_clear(&m);
        self->st.requests_failed++;
        s_req_end(self, v[i]);
    }
    free(v);
    self->groups[g].reloads = 0;
    for (op_t *op = self->ops, *next; op; op = next) {
        next = op->next;
        if (op->kind == S_OP_RELOAD && op->group == g) {
            s_op_unlink(self, op);
            s_release(self, op->reply);
            s_op_free(op);
        } else if (op->pending >> g & 1) {
            op->pending &= ~(1u << g);
            if (!op->pending)
                s_op_finish(self, op);
        }
    }
}

// Group g's scheduler is back after a restart with no adapters: each adapter is loaded again
// before the group takes a request.
static void s_group_reload(disp_t *self, int g) {
    for (size_t i = 0; i < self->nadapters; i++) {
        op_t *op = s_op_new(self, S_OP_RELOAD, NULL, 0);
        if (!op || ls_msg_copy(&op->cmd, &self->adapters[i]) < 0) {
            ls_error(0, "out of memory reloading group %d", g);
            continue;
        }
        op->group = g;
        op->pending = 1u << g;
        op->cmd.rid = op->rid;
        self->groups[g].reloads++;
        self->st.reloads++;
        s_emit(self, DISP_TO_GROUP, g, NULL, &op->cmd);
    }
    if (self->groups[g].reloads)
        ls_info(0, "group %d restarted: loading its %d adapters again before it takes requests", g, self->groups[g].reloads);
}

void disp_on_group_status(disp_t *self, uint64_t now, int g, int worker, bool up, uint32_t restarts,
                          const char *why) {
    if (g < 0 || g >= self->cfg.groups)
        return;
    group_t *gr = &self->groups[g];
    if (worker >= 0) {
        // The scheduler answers its own requests when a worker fails; the group only takes no
        // new ones until the worker is back.
        gr->workers_down += up ? (gr->workers_down > 0 ? -1 : 0) : 1;
    } else if (!up) {
        if (gr->sched_up)
            self->st.group_deaths++;
        gr->sched_up = false;
        s_group_lost(self, now, g, why);
    } else {
        gr->sched_up = true;
        if (restarts > 0)
            s_group_reload(self, g);
    }
    s_publish_dead(self);
}

void disp_shutdown(disp_t *self, uint64_t now) {
    // The schedulers stop too and answer their own requests; here only the handles go.
    size_t n;
    req_t **v = s_group_reqs(self, -1, &n);
    for (size_t i = 0; v && i < n; i++)
        s_req_end(self, v[i]);
    free(v);
    while (self->ops) {
        op_t *op = self->ops;
        op->pending = 0;
        s_op_fail(op, LS_ERROR_CODE_SHUTTING_DOWN, "the dispatcher is stopping");
        s_op_finish(self, op);
    }
}
