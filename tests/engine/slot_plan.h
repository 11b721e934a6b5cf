// slot_plan — a batch's adapters placed in engine slots by the scheduler's own slot policy,
// for the engine tests and benchmarks, which run the engine without a scheduler.
//
// The scheduler alone decides which slot an adapter takes and which adapter leaves
// (actors/scheduler/lora.h); the engine's pool loads what it is told (engine/lora_pool.h).
// A plan keeps a scheduler slot table (lora_t) beside one pool and, for each batch, does what
// the scheduler and the worker do between them: lora_slot_pick / lora_slot_assign /
// lora_slot_touch choose, ls_lora_pool_assign loads. Scheduler slot s is engine slot s + 1
// (engine slot 0 is the base-model sentinel), as in the worker. Nothing is pinned here.
//
// Pages: the scheduler gives an adapter pages of the KV cache's pool (docs/memory.md); here
// each slot has a fixed share of the pool's arena, room for the largest adapter, the shares
// at the top of the arena (slot 1 the last), and an adapter takes the first pages of its
// slot's share. The arena is the test's KV cache with slot_plan_pages more pages than the
// test's own blocks (which it takes from the bottom), or one of its own (slot_plan_arena_new).
#ifndef LS_TESTS_ENGINE_SLOT_PLAN_H
#define LS_TESTS_ENGINE_SLOT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "lora.h"
#include "lora_pool.h"
#include "model.h"

typedef struct slot_plan slot_plan_t;

// The pages the slots' shares take in pages of model's KV cache of block_size tokens: room
// for the largest adapter of pc in each slot. -1 + err on bad settings.
int slot_plan_pages(const ls_model_t *model, int block_size, const ls_lora_pool_config_t *pc, char *err,
                    size_t errlen);
// An arena for the adapters of a pool of pc's slots apart from the KV cache: a KV cache of
// slot_plan_pages pages. Give ls_kv_cache_arena of it to ls_lora_pool_new; destroy it after
// the pool. NULL + err on failure.
ls_kv_cache_t *slot_plan_arena_new(const ls_model_t *model, int block_size, const ls_lora_pool_config_t *pc,
                                   char *err, size_t errlen);
// Assigns adapter id to slot (1 .. n_slots-1) on the first pages of the slot's share of the
// pool's arena, as ls_lora_pool_assign (-1 + err also when the arena has no room for the share).
int slot_plan_assign(ls_lora_pool_t *pool, const char *id, int slot, char *err, size_t errlen);

// A plan for pool's slots (ls_lora_pool_n_slots - 1 of them), victims by policy; NULL when out
// of memory. The pool must outlive the plan.
slot_plan_t *slot_plan_new(ls_lora_pool_t *pool, lora_evict_t policy);
// Idempotent; clears the pointer.
void slot_plan_destroy(slot_plan_t **self_p);

// Maps each of the batch's n adapter ids (NULL or "" = base model; repeats allowed) to an
// engine slot, written to slots (n): LS_LORA_SLOT_BASE for base rows. An adapter without a
// slot gets an empty one, else the policy's victim among slots whose adapter is not in the
// batch; every adapter of the batch is then assigned in the pool (a hit where it already is)
// and stamped with this batch, one tick of the LRU clock per call. Refused without changing
// any slot: an id not in the pool's CPU tier, more distinct adapters than slots. -1 + err also
// when the pool refuses an assign or cannot start an upload.
int slot_plan_map(slot_plan_t *self, const char *const *ids, int n, int32_t *slots, char *err, size_t errlen);
// slot_plan_map on a fresh plan, then the plan dropped: for a caller that places one batch
// and keeps its slots (what stays in the pool is what the batch needs).
int slot_plan_map_once(ls_lora_pool_t *pool, const char *const *ids, int n, int32_t *slots, char *err,
                       size_t errlen);

#endif
