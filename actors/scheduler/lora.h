// lora — the scheduler's adapter table and its GPU slot table.
//
// The scheduler decides where adapters live; the workers do what it says. This table is the
// one place slots and their victims are chosen: a worker's pool loads an adapter into the slot
// it is told and chooses nothing, pinning included (engine/lora_pool.h). It needs no sockets
// (library ls_sched_lora), so the engine tests and benchmarks, which run no scheduler, place
// their batches with it too (tests/engine/slot_plan.h). Two tiers:
//   CPU tier  every worker holds adapters in host memory (LoadAdapter with slot -1), as many as
//             its bytes allow (each adapter's bytes follow its rank and targets), at most
//             max_loaded_loras when that is set; `resident` says an adapter is there on every
//             worker.
//   GPU slots slots 0..S-1 (S = max_loras_per_batch): handles, the most distinct adapters one
//             step runs. An adapter in a slot also holds pages of the GPU pool (`pages`, which
//             the scheduler takes from its block allocator, docs/memory.md): a worker fills a
//             slot from its CPU tier onto those pages when PrefetchAdapter says so, and a
//             StepItem names the slot its adapter is in.
// A slot is locked while any running request uses its adapter (it is in the current batch) and
// forever when its adapter is pinned; only unlocked slots are victims, chosen LRU (least
// recently used in a step) or FIFO (filled longest ago), for a slot or for pages alike. Every
// choice breaks ties by the lowest slot index and every clock here is a counter the caller
// advances, so replay picks the same.
#ifndef LS_SCHED_LORA_H
#define LS_SCHED_LORA_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { LORA_EVICT_LRU, LORA_EVICT_FIFO } lora_evict_t;

// One adapter; owned by the table, valid until lora_remove.
typedef struct {
    char *id, *name, *path;
    bool pinned;
    bool confirmed;  // a load succeeded on every worker once: requests may name it
    bool resident;   // in every worker's CPU tier
    bool loading;    // a LoadAdapter to the workers is in flight, or queued
    bool queued;     // with loading: the load waits for room in the CPU tier (not sent yet)
    bool unloading;  // UnloadAdapter asked for it: no new requests
    bool restore;    // resident when a worker restarted: loaded again once the group is back
    uint32_t rank;   // LoRA rank the workers reported
    uint64_t bytes;  // CPU-tier bytes it takes on a worker (the largest rank's); 0 until first loaded
    uint32_t pages_need;  // GPU pool pages it takes on a worker (the largest rank's); 0 until first loaded
    int slot;        // GPU slot, or -1
    // With a slot: the pool pages it lies on (pages_need of them), each one reference in the
    // scheduler's block allocator. The scheduler gives them back before the slot is emptied.
    uint32_t *pages;
    uint32_t n_pages;
    uint32_t refs;     // waiting + running requests that use it
    uint32_t running;  // running requests that use it: its slot is locked
    uint64_t used_at;  // CPU-tier LRU clock: last time a request took it
    uint32_t turn_seen;  // the scheduler's scratch while it orders the waiting requests
} lora_adapter_t;

typedef struct lora lora_t;

lora_t *lora_new(int slots, lora_evict_t policy);
void lora_destroy(lora_t **self_p);

int lora_slots(const lora_t *self);
// Empty every slot and resize the table (the workers (re)started with this many slots).
int lora_slots_reset(lora_t *self, int slots);
// The adapter with this id, or NULL.
lora_adapter_t *lora_find(const lora_t *self, const char *id);
// Adapters in insertion order (deterministic iteration): i in 0..lora_count-1.
int lora_count(const lora_t *self);
lora_adapter_t *lora_at(const lora_t *self, int i);
// A new adapter, not resident, no slot. NULL when out of memory.
lora_adapter_t *lora_add(lora_t *self, const char *id, const char *name, const char *path, bool pinned);
// Forget an adapter; frees its slot (its pages already given back).
void lora_remove(lora_t *self, lora_adapter_t **ad_p);

// Adapters counted against the CPU tier: resident, or loading (a queued load is not yet).
int lora_cpu_count(const lora_t *self);
// CPU-tier bytes of resident adapters (*used) and of loads in flight (*reserved; a load of an
// adapter whose size is not known yet reserves `unknown`).
void lora_cpu_bytes(const lora_t *self, uint64_t unknown, uint64_t *used, uint64_t *reserved);
// The CPU-tier victim: least recently used resident adapter that no request uses, not pinned
// and not loading; NULL when none.
lora_adapter_t *lora_cpu_victim(const lora_t *self);
int lora_pinned_count(const lora_t *self);

// The slot an adapter would get now: an empty one, else the policy's victim among unlocked
// slots whose adapter is not in `keep` (nkeep entries; adapters promised to the coming step),
// never one of taken[0 .. ntaken) (slots promised, not yet assigned: a mix's other components;
// entries -1 are none). -1 when every slot is locked, kept or taken.
int lora_slot_pick(const lora_t *self, lora_adapter_t *const *keep, int nkeep, const int *taken, int ntaken);
// The policy's victim among the occupied unlocked slots whose adapter is not in keep (nkeep
// entries): the next adapter to give its slot and pages up. -1 when none.
int lora_slot_victim(const lora_t *self, lora_adapter_t *const *keep, int nkeep);
// Put ad into slot (evicting whoever was there). `now` is the caller's step clock.
void lora_slot_assign(lora_t *self, lora_adapter_t *ad, int slot, uint64_t now);
// ad's slot took part in the step numbered now (the LRU clock).
void lora_slot_touch(lora_t *self, const lora_adapter_t *ad, uint64_t now);
// Empty ad's slot.
void lora_slot_clear(lora_t *self, lora_adapter_t *ad);
// The adapter in a slot, or NULL.
lora_adapter_t *lora_slot_adapter(const lora_t *self, int slot);

#endif
