// sched — the scheduler's decision core, with no sockets: requests, the waiting and running
// queues, the KV block manager and prefix cache (kv.h), the adapter and slot tables (lora.h),
// and the step policy (docs/scheduling.md).
//
// Inputs are events, each with its time (the actor's recorded event time); outputs are
// messages handed to io.emit with a destination. Decisions depend only on the events and their
// times — no clock reads, no randomness, no hash-order iteration — so the same event sequence
// emits the same messages, byte for byte (replay, and the determinism test).
//
// Reply handles: the actor passes an opaque handle with each request and each adapter command
// (its route back to the asker). The core owns it from then on, hands it back in every
// destination that answers that asker, and calls io.release exactly once when it is done.
#ifndef LS_SCHED_H
#define LS_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "lora.h"
#include "ls_msg.h"

typedef enum {
    SCHED_TO_WORKERS,  // every rank of the group, in rank order
    SCHED_TO_WORKER,   // one rank (rollback of a partly failed load)
    SCHED_TO_OUTPUT,   // a request's TokenOut: the detokenizer, or the request's route (reply)
    SCHED_TO_REPLY,    // an answer to whoever sent the request or adapter command (reply)
} sched_dest_kind_t;

typedef struct {
    sched_dest_kind_t kind;
    int rank;     // SCHED_TO_WORKER
    void *reply;  // SCHED_TO_OUTPUT, SCHED_TO_REPLY; may be NULL (nobody to answer)
} sched_dest_t;

typedef struct {
    void (*emit)(void *arg, const sched_dest_t *dest, const ls_msg_t *msg);
    void (*release)(void *arg, void *reply);  // may be NULL
    void *arg;
} sched_io_t;

typedef struct {
    int tp_size;                 // worker ranks in the group (at most 32)
    int max_num_batched_tokens;  // token budget of one step
    int max_running_requests;
    int chunked_prefill_size;    // prompt tokens of one request in one step
    int max_skip_steps;          // aging bound: steps a waiting request may be passed over
    int default_max_new_tokens;
    lora_evict_t eviction;       // GPU slot victim policy
    uint64_t step_timeout_ns;    // no StepResult this long after a plan: the workers are gone
    uint64_t load_timeout_ns;    // no answer to an adapter load/unload this long: it failed
    // Admission (docs/scheduling.md): more is refused at once with OVERLOADED.
    uint32_t max_waiting_requests;  // waiting requests of all tenants (and those held until the workers are ready)
    uint32_t max_tenant_waiting;    // waiting requests of one tenant (an adapter, or the base model)
    uint64_t max_queued_tokens;     // tokens of the waiting requests; a prompt longer than this is TOO_LARGE
    // Overlap scheduling (docs/scheduling.md): the next plan goes out while a step runs, its
    // decodes running the tokens the step samples (StepItem.follows). One worker only: the
    // ranks of a tensor-parallel group other than 0 do not know the sampled tokens.
    bool overlap;
} sched_config_t;

// Gauges (set after every event) and counters (only grow).
typedef struct {
    // Pages of the workers' GPU pool (docs/memory.md): kv_blocks_total all of them,
    // kv_blocks_used those requests' KV holds, kv_blocks_adapters those the adapters in slots
    // hold (idle ones give theirs up when KV needs them)
    uint64_t waiting, running, kv_blocks_used, kv_blocks_total, kv_blocks_cached, kv_blocks_adapters, adapter_refs;
    uint64_t adapter_cpu_resident, adapter_cpu_bytes_used, adapter_cpu_bytes_total, adapter_loads_waiting;
    uint64_t adapter_gpu_resident;  // adapters in GPU slots (on their pages)
    uint64_t steps, tokens_generated, prefix_hit_tokens, adapter_residency_hits, adapter_cold_loads,
        adapter_prefetches, adapter_cpu_loads, adapter_cpu_evictions, preemptions, requests_finished,
        requests_aborted, requests_failed, requests_refused, step_timeouts;
    uint64_t adapter_page_evictions;  // idle adapters out of their slots to give their pages to KV or another adapter
    uint64_t requests_overloaded;  // refused by an admission bound (also in requests_refused)
    uint64_t adapter_cpu_load_us;  // summed: LoadAdapter sent to every worker answered (disk -> CPU tier)
    uint64_t step_roundtrip_us;    // summed: plan sent -> result in (event times)
    uint64_t step_worker_us;       // summed: the workers' reported step time (StepResult.elapsed_us)
    uint64_t max_skipped;  // most steps a request was passed over before admission (aging bound)
    uint64_t kv_block_size;  // tokens per KV block (0 until the workers report)
    uint64_t lora_slots;     // GPU adapter slots: the most distinct adapters in one step
} sched_stats_t;

typedef struct sched sched_t;

sched_t *sched_new(const sched_config_t *cfg, const sched_io_t *io);
void sched_destroy(sched_t **self_p);

// Events. `now` is the event time in ns (monotonic). Messages are read; where a function
// keeps parts of one (a request's prompt and sampling, a command queued before the workers
// are ready), it moves them out and leaves msg valid for ls_msg_clear.
void sched_on_request(sched_t *self, uint64_t now, ls_msg_t *msg, void *reply);        // TokenizedReq
void sched_on_abort(sched_t *self, uint64_t now, ls_msg_t *msg);                        // Abort
void sched_on_load_adapter(sched_t *self, uint64_t now, ls_msg_t *msg, void *reply);   // LoadAdapter
// Fills an AdapterList: every adapter the scheduler knows, with its residency (ListAdapters).
void sched_list_adapters(const sched_t *self, ls_msg_t *list);
void sched_on_unload_adapter(sched_t *self, uint64_t now, ls_msg_t *msg, void *reply); // UnloadAdapter
void sched_on_worker_info(sched_t *self, uint64_t now, const ls_msg_t *msg);            // WorkerInfo
void sched_on_step_result(sched_t *self, uint64_t now, const ls_msg_t *msg);            // StepResult
// AdapterLoaded / AdapterUnloaded from worker `rank`.
void sched_on_adapter_answer(sched_t *self, uint64_t now, int rank, const ls_msg_t *msg);
// Supervision (the launcher's PeerStatus). A worker went down: the step in flight is lost, the
// running requests are recomputed once every worker has sent WorkerInfo again; new work waits
// meanwhile. The tokenizer or the detokenizer went down: nobody can take the requests' output
// any more (the tokenizer answers their clients), so every request is aborted.
void sched_on_worker_down(sched_t *self, uint64_t now, const char *why);
void sched_abort_all(sched_t *self, uint64_t now, const char *why);
// Time passed: deadlines, the step timeout, adapter command timeouts.
void sched_on_tick(sched_t *self, uint64_t now);
// The actor is stopping: answer every request and command now.
void sched_shutdown(sched_t *self, uint64_t now);

// When the core next needs sched_on_tick (ns, same clock as now); 0 when it needs none.
uint64_t sched_next_wake(const sched_t *self);
const sched_stats_t *sched_stats(const sched_t *self);
#define SCHED_MAX_LISTED 64
// The names of the adapters of the running (running true) or waiting requests, each once, in
// queue order, joined by ',' into out (cap bytes, always terminated): at most `max` names (and
// SCHED_MAX_LISTED), and
// only whole names that fit. A name with a ',' in it is left out, since a comma-separated list
// cannot hold it. Returns the number of names written. It walks the queue: for /metrics, not
// for every event.
int sched_adapter_names(const sched_t *self, bool running, int max, char *out, size_t cap);

#endif
