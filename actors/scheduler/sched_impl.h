// sched_impl — what the scheduler core's rooms share: its state and the functions one room
// calls in another. sched.c holds the requests, the KV and the events; sched_plan.c the step
// plan; sched_adapters.c the adapters: their commands to the workers, the CPU tier, loads and
// unloads asked for, and the listings; sched_pages.c the GPU pool's pages between the KV
// cache and the adapters in slots. Only the core's own files include this.
#ifndef LS_SCHED_IMPL_H
#define LS_SCHED_IMPL_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#include "kv.h"
#include "ls_limits.h"
#include "sched.h"

#define SCHED_MAX_RANKS 32

typedef struct req req_t;
typedef struct {
    req_t *head, *tail;
    uint32_t n;
    uint64_t tokens;  // sum of the members' listed_tokens
} req_list_t;

struct req {
    uint64_t rid, seq;  // seq: arrival order, the FIFO key
    void *reply;
    req_t *prev, *next;
    req_list_t *list;  // &waiting or &running
    lora_adapter_t *ad;  // NULL: the base model; a mix's first component (its tenant)
    // the adapters it uses: ad alone, or a mix's components (docs/lora-mixing.md), ads[0] == ad.
    // Each is counted in refs and, while it runs, running (its slot locked)
    lora_adapter_t *ads[LS_LORA_MIX_MAX];
    float weights[LS_LORA_MIX_MAX];  // a mix's weights
    uint32_t n_ads;
    bool mixed;  // ads and weights are a mix (StepItem.mix), one adapter at another weight included
    char *mix_key;  // a mix's prefix-cache key: its components' ids and weights, in order
    ls_msg_sampling_params_t sampling;  // as asked; goes out with the first TokenOut
    ls_msg_added_tokens_t added;  // its adapter's added tokens (TokenizedReq): moved into the
                                  // first TokenOut, for the detokenizer
    int32_t *stop;  // token ids that end it: EOS and stop ids (none with ignore_eos)
    size_t n_stop;
    uint64_t seed;
    int32_t *tokens;  // the prompt, then every generated token
    uint32_t n_prompt, n_out, cap_tokens;
    uint32_t max_new, min_new;
    uint32_t *blocks;  // KV blocks of the sequence, in order
    uint32_t n_blocks, cap_blocks;
    uint32_t computed;     // tokens whose KV is in blocks
    // Steps in flight (overlap scheduling): the tokens they run for it and the tokens they
    // sample for it, not yet known here. The next plan starts where they end.
    uint32_t ahead, ahead_out;
    uint32_t n_published;  // leading blocks that are in the prefix tree (matched or inserted)
    kv_node_t *cache_node; // tree node of the last of them
    bool cache_done;       // a duplicate stopped publishing for this residency
    uint32_t cached_tokens;  // prefix-cache hit at its first admission
    bool admitted;   // has been in a plan: workers know its rid
    bool chunked;    // a chunk ran since its blocks were allocated (else the next is its first)
    bool sent_first; // its first TokenOut is out
    bool preempted;  // waiting again after preemption: first in line
    bool in_plan;    // part of the plan being built
    uint32_t skipped;  // steps it was passed over while waiting
    uint32_t turn;     // fair-share rank among the waiting, set for each admission order
    uint32_t listed_tokens;  // its sequence length when it joined its list (the list's sum)
    uint64_t deadline; // ns; 0: none
};

typedef enum { OP_LOAD, OP_RELOAD, OP_UNLOAD, OP_EVICT } op_kind_t;

// An adapter command to the workers, or (UNLOAD not yet sent) one waiting for its requests.
typedef struct op op_t;
struct op {
    op_t *next;
    op_kind_t kind;
    uint64_t rid;  // correlation id of the worker messages
    char *adapter_id, *name;
    void *reply;  // the asker (LOAD, UNLOAD from a client); NULL otherwise
    uint64_t asker_rid;
    uint32_t answered, ok;  // bit per rank
    uint32_t lora_rank;
    uint64_t bytes;     // loads: the most CPU-tier bytes a rank reported
    uint32_t pages;     // loads: the most GPU pool pages a rank reported
    uint64_t sent_at;   // loads: when the workers were told (for the load-time counters)
    uint64_t queued_at; // a load waiting for room in the CPU tier (not sent yet); 0: not queued
    uint32_t code;
    char *reason;       // first failure
    uint64_t deadline;  // 0: not sent yet
};

// A command that arrived before the workers were ready, replayed in order when they are.
typedef struct pending pending_t;
struct pending {
    pending_t *next;
    ls_msg_t msg;
    void *reply;
    uint64_t now;
};

typedef struct {
    uint32_t kv_blocks, block_size, max_context, slots, max_loaded, vocab;
    uint64_t cpu_bytes, lora_max_bytes;
} worker_caps_t;

typedef struct {
    uint64_t rid;
    uint32_t chunk;
    bool sample;
} planned_t;

// A plan sent and not yet answered. With overlap scheduling two are in flight: the workers
// find the next plan waiting when a step ends, instead of waiting a round trip for it.
#define SCHED_MAX_FLIGHT 2
typedef struct {
    uint64_t step;
    uint64_t sent_at;   // event time it went out; no result cfg.step_timeout_ns later: the workers are gone
    planned_t *v;       // its requests, in plan order
    size_t n, cap;
} flight_t;

struct sched {
    sched_config_t cfg;
    sched_io_t io;
    worker_caps_t caps[SCHED_MAX_RANKS];
    uint32_t have_caps;  // bit per rank
    int32_t *eos;
    size_t n_eos;
    bool ready;  // every rank reported: serving
    bool down;   // the workers failed (or the actor stops): refuse new work until they are back
    uint32_t max_context, max_loaded, vocab;  // max_loaded 0: no count limit on the CPU tier
    uint32_t base_refs, base_running;  // the base model's tenant: as lora_adapter_t's refs, running
    uint32_t n_pending;  // commands held until the workers report (bounded by max_waiting_requests)
    uint64_t cpu_bytes;       // the CPU tier's bytes on the smallest worker (0: not reported, no byte limit)
    uint64_t lora_max_bytes;  // the most one adapter takes there: reserved for a load of unknown size
    kv_t *kv;
    lora_t *lora;
    zhashx_t *reqs;  // "rid" -> req_t (lookup only)
    req_list_t waiting, running;
    uint64_t next_seq, clock;
    uint64_t step;  // number of the last plan
    uint64_t now;   // time of the event being handled
    flight_t flight[SCHED_MAX_FLIGHT];  // oldest first
    int n_flight;
    int max_flight;  // 2 with overlap scheduling, else 1
    uint64_t *released;
    size_t n_released, cap_released;
    // A step's outputs wait until the next plan is out: the workers start on it while the
    // outputs (a message per request) and their releases go to the detokenizer.
    bool deferring;
    struct {
        sched_dest_t dest;
        ls_msg_t msg;  // owned
    } *deferred;
    size_t n_deferred, cap_deferred;
    void **deferred_releases;
    size_t n_deferred_releases, cap_deferred_releases;
    op_t *ops;  // creation order
    uint64_t next_op_rid;
    pending_t *pending, *pending_tail;
    sched_stats_t stats;
};

static inline uint32_t sched_min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }
static inline uint32_t sched_seq_len(const req_t *r) { return r->n_prompt + r->n_out; }
// Where the next plan finds r: its length and computed tokens once the steps in flight are in.
static inline uint32_t sched_plan_len(const req_t *r) { return sched_seq_len(r) + r->ahead_out; }
static inline uint32_t sched_plan_computed(const req_t *r) { return r->computed + r->ahead; }
// The prefix cache's key of r: its adapter's id, its mix's key, "" for the base model.
static inline const char *sched_key(const req_t *r) { return r->mix_key ? r->mix_key : r->ad ? r->ad->id : ""; }
// Whether r uses ad (as its adapter or in its mix).
static inline bool sched_req_uses(const req_t *r, const lora_adapter_t *ad) {
    for (uint32_t i = 0; i < r->n_ads; i++)
        if (r->ads[i] == ad)
            return true;
    return false;
}

// sched.c
void *sched_alloc(void *p, size_t n);  // realloc that stops the process when memory is out
char *sched_strdup(const char *s);     // NULL stays NULL
void *sched_memdup(const void *p, size_t n);  // NULL for n 0
// *v grows (doubling) to hold need elements of elem bytes
void sched_grow_array(void **v, size_t *cap, size_t need, size_t elem);
void sched_list_remove(req_t *r);
void sched_list_push_back(req_list_t *l, req_t *r);
// A request's tenant is its adapter, the base model one more (ad NULL): its running requests,
// and r joining (d = 1) or leaving (d = -1) the running list.
uint32_t sched_tenant_running(const sched_t *s, const lora_adapter_t *ad);
void sched_tenant_run(sched_t *s, const req_t *r, int d);
// r's KV blocks: all freed; room for need of them in its table; blocks for its first `tokens`
// tokens (-1 when none are free, or with may_preempt when r itself was preempted for them).
void sched_free_blocks(sched_t *s, req_t *r);
void sched_blocks_cap(req_t *r, uint32_t need);
int sched_reserve(sched_t *s, req_t *r, uint32_t tokens, bool may_preempt);

// sched_plan.c
// Plans and sends the next steps while the workers are ready and fewer than max_flight are in
// flight.
void sched_schedule(sched_t *s, uint64_t now);
void sched_emit(sched_t *s, sched_dest_kind_t kind, int rank, void *reply, const ls_msg_t *msg);
void sched_reply_release(sched_t *s, void **reply);
// r is over: its last TokenOut (o's token, if any, with finish or the error), then retired.
void sched_req_finish(sched_t *s, req_t *r, const ls_msg_step_output_t *o, uint32_t finish, const char *error);

// sched_adapters.c
void sched_adapter_load(sched_t *s, ls_msg_t *msg, void *reply);
void sched_adapter_unload(sched_t *s, ls_msg_t *msg, void *reply);
// A request needs ad in the CPU tier: reload it unless it is there, loading, or has no room yet.
void sched_adapter_ensure_resident(sched_t *s, lora_adapter_t *ad, uint64_t now);
// Start an asked-for unload once nothing uses the adapter.
void sched_adapter_unload_maybe(sched_t *s, lora_adapter_t *ad);
// Loads waiting for room in the CPU tier go, in arrival order, as room appears.
void sched_loads_send_queued(sched_t *s);
// A worker's answer to an adapter command (rank, the command's rid).
void sched_op_answer(sched_t *s, int rank, uint64_t rid, bool ok, uint32_t lora_rank, uint64_t bytes,
                     uint32_t pages, uint32_t code, const char *reason, const char *late_load_id);
// Every rank answered (or the command is over): act on the outcome, then free it.
void sched_op_complete(sched_t *s, op_t *op);
void sched_op_free(sched_t *s, op_t *op);
void sched_answer_loaded(sched_t *s, void *reply, uint64_t rid, const char *name, const char *id, bool ok,
                         uint32_t lora_rank, uint32_t pages, uint32_t code, const char *reason);
void sched_answer_unloaded(sched_t *s, void *reply, uint64_t rid, const char *name, const char *id, bool ok,
                           uint32_t code, const char *reason);

// sched_pages.c
// Pages the adapters in slots hold that a page wanted now may take: those of the unlocked
// slots whose adapter is not in keep (nkeep entries).
uint32_t sched_pages_evictable(const sched_t *s, lora_adapter_t *const *keep, int nkeep);
// Pages every adapter in a slot holds, and (*resident) how many adapters are in slots.
uint32_t sched_pages_adapters(const sched_t *s, uint32_t *resident);
// One page, a reference on it: a free or idle cached block, else an idle adapter (not in keep)
// leaves its slot, LRU/FIFO as the slot policy says. -1 when neither gives one.
int sched_page_take(sched_t *s, lora_adapter_t *const *keep, int nkeep, uint32_t *page);
// ad leaves its slot and gives its pages back (nothing when it has no slot).
void sched_slot_vacate(sched_t *s, lora_adapter_t *ad);
void sched_slots_vacate_all(sched_t *s);
// Puts ad (in the CPU tier, in no slot) into slot (lora_slot_pick's answer), its occupant
// leaving it, on pages_need pages (sched_page_take with keep), and tells the workers
// (PrefetchAdapter) before the plan that names the slot. ahead (a prefetch for requests next
// in line): only free pages and the occupant's, leaving one per running request. -1, nothing
// changed, when the pages are not there.
int sched_slot_fill(sched_t *s, lora_adapter_t *ad, int slot, lora_adapter_t *const *keep, int nkeep, bool ahead);

#endif
