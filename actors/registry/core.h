// core — the registry's state and decisions (SGLang's LoRARegistry), with no sockets, files,
// threads or clock: every input is a call with the event's time, every output goes through
// the host's callbacks (the actor in main.c; a recorder in the tests). Same calls, same
// outputs: that is what makes the actor replayable.
//
// A LoRARef {id, name, path, pinned} lives in one of three states:
//
//   LOADING ──(scheduler: loaded everywhere)──▶ READY ──(unload)──▶ UNLOADING ──(workers freed it)──▶ gone
//      │  checking on the job thread, then dispatched      ▲             │ waits for in_flight == 0,
//      └──(refused, failed, timed out)──▶ gone              └──(refused, │ then dispatches
//                                                             drain timeout)
//
// Acquires of a READY adapter hold it (in_flight++, LRU touch); of a LOADING one wait for the
// load and are answered with it (the same for an on-demand load: every acquire of the name
// waits on the one load, and a failure answers all of them); of an UNLOADING one are refused
// at once (UNAVAILABLE); of an unknown name: NOT_FOUND, or an on-demand load under --lora-dirs.
//
// Timeouts. A load that the scheduler does not confirm within load_timeout_ms is answered
// TIMEOUT and forgotten (the name is free again); should the scheduler's answer still come and
// say loaded, the registry unloads that id, so no half-loaded adapter remains. An unload still
// waiting for requests to end when unload_timeout_ms passes goes back to READY (nothing was
// sent to the workers; the caller may retry). An unload already sent to the scheduler is
// answered TIMEOUT but the adapter stays UNLOADING, taking no requests, until the scheduler
// says what happened (freed: gone; refused: READY) — putting it back to READY while workers
// may be freeing it would be exactly the half-unloaded adapter the timeout must not leave.
//
// Adapter ids are uuid-formatted (version 4 layout) but derived, not random: a hash of the
// name, the path, a per-registry load counter and the event time, so a replay of the same
// inputs gives the same ids. The journal keeps them across restarts.
#ifndef LS_REGISTRY_CORE_H
#define LS_REGISTRY_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "check.h"
#include "ls_msg.h"

typedef struct reg reg_t;

// Where a load comes from: what is checked, and who hears the outcome.
typedef enum {
    REG_FROM_CLIENT = 0,  // LoadAdapter from a client: path confined to the roots
    REG_FROM_STARTUP,     // --lora-paths: trusted; counts toward Ready
    REG_FROM_JOURNAL,     // the journal's live set: trusted, keeps its id; counts toward Ready
    REG_FROM_DEMAND,      // an acquire of an unregistered name found under --lora-dirs
    REG_FROM_RESTORE,     // a registered adapter loaded again into a restarted scheduler
    REG_FROM_TENSORS,     // LoadAdapter from a client with the adapter in it: path is the host's
                          // copy, written during the check (CHECK_TENSORS)
} reg_origin_t;

typedef struct {
    int max_loras_per_batch;  // at most this − 1 adapters may be pinned
    bool on_demand;           // --lora-dirs were given: unknown names are looked up there
    uint32_t load_timeout_ms;
    uint32_t unload_timeout_ms;
} reg_config_t;

// What the core asks of its host. Every callback runs synchronously inside a reg_* call and
// must not call back into the core.
typedef struct {
    void *host;
    // Run check_adapter(mode, name, path) off the loop; report with reg_load_checked(op).
    void (*check)(void *host, uint64_t op, check_mode_t mode, const char *name, const char *path);
    // Send a LoadAdapter / UnloadAdapter (rid = the op) to the scheduler. 0, or -1 when it cannot
    // be sent (the op then fails at once).
    int (*send)(void *host, const ls_msg_t *msg);
    // Answer a waiting client with msg (its rid is the host's to set from the waiter) and
    // forget the waiter. msg NULL: forget it unanswered (only from reg_destroy).
    void (*answer)(void *host, void *waiter, ls_msg_t *msg);
    // Call reg_timeout(op) once after ms; the handle goes to cancel.
    void *(*arm)(void *host, uint64_t op, uint32_t ms);
    void (*cancel)(void *host, void *timer);
    // Persist a LoadAdapter (now READY) or UnloadAdapter (now gone) record; -1 when it could
    // not be written (a load is then undone, not acknowledged).
    int (*journal)(void *host, const ls_msg_t *record);
    // Every startup load (journal, --lora-paths) has been answered.
    void (*ready)(void *host);
    // The adapter at path left the registry for good: unloaded, dropped from the journal, or a
    // load that failed (never journaled). The host removes the directory if it is its own copy
    // (REG_FROM_TENSORS); any other path it leaves alone. A restored adapter that failed
    // transiently stays in the journal, so it is not forgotten.
    void (*forget)(void *host, const char *path);
} reg_host_t;

typedef struct {
    uint64_t loads;             // loads confirmed by the scheduler
    uint64_t load_failures;     // loads refused, failed or timed out
    uint64_t unloads;           // unloads confirmed by the scheduler
    uint64_t acquires;          // adapter acquires answered ok (the base model not counted)
    uint64_t acquire_misses;    // acquires answered NOT_FOUND
    uint64_t demand_loads;      // on-demand loads confirmed
    uint64_t releases_unknown;  // releases of an id not held
    uint64_t answers_unknown;   // scheduler answers to no pending request
    uint64_t in_flight;         // gauge: requests holding an adapter now
} reg_stats_t;

// NULL on out of memory.
reg_t *reg_new(const reg_config_t *cfg, const reg_host_t *host);
// Forgets pending waiters unanswered (call reg_shutdown first to answer them).
void reg_destroy(reg_t **self_p);

// LoadAdapter. id: the journal's id (REG_FROM_JOURNAL), else NULL to derive one. waiter: who
// gets the AdapterLoaded, NULL for startup loads (their outcome is logged).
void reg_load(reg_t *self, uint64_t now_ns, reg_origin_t origin, const char *name, const char *path, bool pinned,
              const char *id, void *waiter);
// The job's verdict on the load op.
void reg_load_checked(reg_t *self, uint64_t now_ns, uint64_t op, check_result_t *res);
// UnloadAdapter; waiter gets the AdapterUnloaded.
void reg_unload(reg_t *self, uint64_t now_ns, const char *name, void *waiter);
// AcquireAdapter; waiter gets the AdapterAcquired. An empty or NULL name is the base model.
void reg_acquire(reg_t *self, uint64_t now_ns, const char *name, void *waiter);
// ReleaseAdapter (no answer); an id not held is logged and counted.
void reg_release(reg_t *self, const char *id, const char *name);
// The scheduler's AdapterLoaded, AdapterUnloaded or Error for the op its rid names.
void reg_answered(reg_t *self, uint64_t now_ns, const ls_msg_t *msg);
// The op's timer fired.
void reg_timeout(reg_t *self, uint64_t now_ns, uint64_t op);
// Every startup load has been submitted: Ready once they are all answered (now, if none).
void reg_startup_seal(reg_t *self);
// Answer every waiting client SHUTTING_DOWN; refuse new work the same way from now on.
void reg_shutdown(reg_t *self);

// Supervision. The tokenizer went down: every hold it had is gone (its requests ended with it),
// so in-flight counts drop to zero and unloads waiting on them go ahead.
void reg_holders_lost(reg_t *self);
// The scheduler went down; its restart will know no adapter. Every registered adapter is
// loaded again at once (queued for the restart): it is LOADING until the restarted scheduler
// confirms it, so acquires wait for that instead of reaching a scheduler that does not know it
// yet; a load in flight keeps its op and waiter. Unloads are done: the workers drop every
// adapter when the scheduler goes down, and the requests an unload waited for end with it.
void reg_scheduler_lost(reg_t *self, uint64_t now_ns);

// Is a ref with this name registered (in any state)?
bool reg_has(const reg_t *self, const char *name);
// Fill an AdapterList (initialised by the caller) with every ref, in load order.
void reg_list(const reg_t *self, ls_msg_t *list);
// Name of the i-th adapter in LRU order (least recently acquired first); NULL past the end.
const char *reg_lru_at(const reg_t *self, size_t i);
const reg_stats_t *reg_stats(const reg_t *self);

// The id derivation: a version-4-layout uuid ("xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx") hashed
// from the inputs. out has room for 37 bytes.
void reg_id_derive(const char *name, const char *path, uint64_t counter, uint64_t now_ns, char *out);

#endif
