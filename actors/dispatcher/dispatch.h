// dispatch — the dispatcher's decision core, with no sockets: which data-parallel group serves
// each request, the requests each group has not ended, the adapter commands fanned out to every
// group and their one answer, and the groups' life (docs/scheduling.md, "Data-parallel groups").
//
// Inputs are events (messages with their time); outputs are messages handed to io.emit with a
// destination. No clock reads, no randomness, no hash-order iteration: the same events emit
// the same messages (replay).
//
// Reply handles: the actor passes an opaque handle (its route back to the sender) with each
// request and each adapter command. The core owns it from then on, hands it back in every
// destination that answers that sender, and calls io.release exactly once when it is done.
#ifndef LS_DISPATCH_H
#define LS_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "ls_msg.h"

#define DISP_MAX_GROUPS 32

typedef enum {
    DISP_TO_GROUP,   // the group's scheduler (group)
    DISP_TO_REPLY,   // whoever sent the request or the adapter command (reply)
    DISP_TO_OUTPUT,  // a request's final TokenOut: the detokenizer, or the request's route (reply)
} disp_dest_kind_t;

typedef struct {
    disp_dest_kind_t kind;
    int group;    // DISP_TO_GROUP
    void *reply;  // DISP_TO_REPLY, DISP_TO_OUTPUT; may be NULL (nobody to answer)
} disp_dest_t;

typedef struct {
    void (*emit)(void *arg, const disp_dest_t *dest, const ls_msg_t *msg);
    void (*release)(void *arg, void *reply);  // may be NULL
    void *arg;
} disp_io_t;

typedef struct {
    int groups;      // data-parallel groups, 1 .. DISP_MAX_GROUPS
    int block_size;  // tokens per KV block: prefix affinity hashes whole blocks
} disp_config_t;

// How a group was chosen (counters).
typedef enum { DISP_BY_ADAPTER, DISP_BY_PREFIX, DISP_BY_LOAD, DISP_BY_COUNT } disp_choice_t;

typedef struct {
    uint64_t load[DISP_MAX_GROUPS];        // gauge: requests sent to the group and not ended
    uint64_t dispatched[DISP_MAX_GROUPS];  // requests sent to the group
    uint64_t by[DISP_BY_COUNT];            // requests placed by adapter, prefix, load
    uint64_t bound_overrides;              // an affinity group passed over for the imbalance bound
    uint64_t groups_dead;                  // gauge: groups taking no requests now
    uint64_t group_deaths;                 // scheduler-G went down
    uint64_t requests_failed;              // answered with an error by the dispatcher (dead group, none live)
    uint64_t adapters;                     // gauge: adapters every group is to hold (re-loaded on a restart)
    uint64_t reloads;                      // LoadAdapter sent to a restarted group
} disp_stats_t;

typedef struct disp disp_t;

disp_t *disp_new(const disp_config_t *cfg, const disp_io_t *io);
void disp_destroy(disp_t **self_p);

// The bounded imbalance, stated once: a request goes to its affinity group only while that
// group's load is below the least-loaded live group's plus this bound, where total is the
// load of every group together. So no group takes a request while it is more than the bound
// ahead of an idler one.
uint64_t disp_imbalance_bound(uint64_t total);

// Events. msg is the core's to move from; reply is a handle for io (may be NULL).
void disp_on_request(disp_t *self, uint64_t now, ls_msg_t *msg, void *reply);        // TokenizedReq
void disp_on_abort(disp_t *self, uint64_t now, const ls_msg_t *msg);                  // Abort
void disp_on_adapter_command(disp_t *self, uint64_t now, ls_msg_t *msg, void *reply); // Load/UnloadAdapter, ListAdapters
// A message from group's scheduler: an answer to a fan-out, a request's Error or TokenOut
// (relayed to its sender), or RequestEnded.
void disp_on_group_message(disp_t *self, uint64_t now, int group, ls_msg_t *msg);
// The launcher's news: group's scheduler (worker < 0) or one of its workers went down or came
// back; restarts > 0 on a scheduler that came back means it lost its adapters.
void disp_on_group_status(disp_t *self, uint64_t now, int group, int worker, bool up, uint32_t restarts,
                          const char *why);
// Stopping: every request still here and every fan-out is answered.
void disp_shutdown(disp_t *self, uint64_t now);

// Whether group takes new requests now.
bool disp_group_live(const disp_t *self, int group);
const disp_stats_t *disp_stats(const disp_t *self);

#endif
