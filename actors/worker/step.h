// step — one StepPlan run on a worker's engine, apart from the actor so that a driver
// without sockets (bench/bench_serve_engine.c: the scheduler's core and the engine in one
// process) runs plans exactly as the worker does.
//
// For each item: its adapter in the slot the plan names (put there by PrefetchAdapter), its tokens at
// its position in its block table, its prompt and outputs recorded for the sampling penalties;
// one ls_model_forward for the whole plan; then, on rank 0, sampling row by row in plan order
// (stop tokens banned before min_new_tokens, grammar masks on constrained rows, whose automata
// then take the sampled tokens: constrain.h). StepPlan.released drops finished requests'
// history first.
#ifndef LS_WORKER_STEP_H
#define LS_WORKER_STEP_H

#include <stddef.h>

#include "constrain.h"
#include "history.h"
#include "ls_msg.h"
#include "model.h"

// Where a step's time went on this host's clock, added up over steps: the forward's call (on
// the GPU it only queues the work), the grammar masks built for constrained rows, and the
// sampling call (on the GPU it waits for the forward first). Measurements, never decisions.
typedef struct {
    uint64_t forward_ns, masks_ns, sample_ns;
} wstep_times_t;

typedef struct {
    wstep_times_t *times; // NULL: not measured
    ls_model_t *model;
    ls_kv_cache_t *kv;
    ls_lora_pool_t *pool;
    ls_history_t *history;
    wcon_t *constrain;    // structured output's states and masks (rank 0); NULL: constrained requests fail
    int rank;             // tensor-parallel rank: only rank 0 samples
    const char *backend;  // for messages
    uint32_t max_items, max_tokens;  // the most requests and tokens one plan may carry (0: no limit)
} wstep_engine_t;

// The GPU pool of `pages` pages (docs/memory.md): the KV cache, a page one block of
// block_size tokens of every layer, and the adapter pool of pc over the same pages. Which
// page holds what is the scheduler's to say: KV blocks through block tables, adapters
// through PrefetchAdapter. -1 + err on failure (nothing left made).
int wstep_memory_new(ls_model_t *model, int pages, int block_size, const ls_lora_pool_config_t *pc,
                     ls_kv_cache_t **kv, ls_lora_pool_t **pool, char *err, size_t errlen);
// PrefetchAdapter: its adapter (in the CPU tier) into its slot on its pages, the copy
// started. -1 + err when the message names no adapter or no slot of this pool, or as
// ls_lora_pool_assign.
int wstep_prefetch(const wstep_engine_t *e, const ls_msg_prefetch_adapter_t *p, char *err, size_t errlen);

// Whether plan fits what this worker was configured for: its items and tokens, each item's
// context, block table and sampling arrays against the model and the KV cache. -1 + err when it
// does not; wstep_run checks it first, before any tensor-parallel collective, so every rank of
// a group refuses the same plan alike.
int wstep_check(const wstep_engine_t *e, const ls_msg_step_plan_t *plan, char *err, size_t errlen);

// Runs plan; result becomes a StepResult (step set, one output per sampled item on rank 0, in
// plan order; rid and elapsed_us are the caller's) and *n_sampled its rows. -1 + err when the
// step could not run (the caller answers with wstep_fail).
int wstep_run(const wstep_engine_t *e, const ls_msg_step_plan_t *plan, ls_msg_t *result, int *n_sampled, char *err,
              size_t errlen);
// Makes result the answer to a plan that failed: every sampled item finishes ERROR.
void wstep_fail(const ls_msg_step_plan_t *plan, ls_msg_t *result);

// Makes m the WorkerInfo of this engine: its KV cache, context, vocabulary, EOS ids (n_eos of
// eos), adapter slots and CPU tier; max_loaded 0: no count limit on the tier.
void wstep_worker_info(const wstep_engine_t *e, int tp_size, const int32_t *eos, int n_eos, int max_loaded,
                       const char *model, ls_msg_t *m);

#endif
