// A harness around the scheduler core for tests: it records every emitted message (decoded,
// and as encoded bytes for the determinism test), plays a group of fake workers that answer
// adapter commands and step plans with deterministic tokens, and tracks each request's output.
// The fake workers keep a model of their GPU pool (docs/memory.md) as a real one behaves:
// PrefetchAdapter puts an adapter in a slot on its pages (taking them from whatever adapter
// lay there), a KV write into an adapter's page takes it from its slot, and a step whose item
// names a slot that does not hold its adapter, or reads KV an adapter has overwritten since,
// is counted as the real worker's failure would be.
#ifndef LS_TEST_SCHED_HARNESS_H
#define LS_TEST_SCHED_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv.h"
#include "lora.h"
#include "ls_msg.h"
#include "sched.h"

#define H_MAX_RID 512
#define H_MAX_PAGES 4096
#define H_MAX_SLOTS 16

typedef struct {
    sched_dest_t dest;
    ls_msg_t msg;
} h_out_t;

typedef struct {
    int tokens;          // tokens received in TokenOuts
    int firsts;          // TokenOuts with first set
    uint32_t finish;     // last finish seen
    bool done;           // a final TokenOut came
    uint32_t completion_tokens, cached_tokens;
    int errors;          // Error messages with this rid
    uint32_t error_code;
    int32_t last_token;
    bool bad_sequence;   // a token was not the one the fake worker made for that position
    int added_first;     // added tokens its first TokenOut carried
} h_req_t;

typedef struct {
    sched_t *s;
    sched_config_t cfg;
    uint64_t now;
    h_out_t *out;
    size_t n_out, cap_out, pumped;
    char *bytes;  // every emitted message, encoded, with its destination
    size_t n_bytes;
    int releases;
    h_req_t req[H_MAX_RID];
    // fake workers
    bool auto_steps;        // answer StepPlans
    int fail_load_rank;     // this rank answers LoadAdapter with failure (-1: none)
    int32_t eos_token;      // the fake worker samples it at eos_at generated tokens (0: never)
    uint32_t eos_at;
    uint64_t step_ns;       // each answered step advances the clock this much
    uint64_t cpu_bytes, lora_max_bytes;   // the CPU tier h_info reports (0: no byte limit)
    uint64_t (*bytes_of)(const char *id);  // CPU-tier bytes a fake worker reports per adapter (NULL: 0)
    uint32_t (*pages_of)(const char *id);  // GPU pool pages a fake worker reports per adapter (NULL: 0)
    // What the fake workers check in the plans they run: each request's next position (its
    // chunks continue one another unless one starts it over), the last token they sampled for
    // it (a follows item runs it), and plans sent and not yet answered.
    uint32_t wpos[H_MAX_RID];
    bool wsampled[H_MAX_RID];
    int bad_items;  // items that break those rules
    int follows;    // follows items run
    int outstanding, max_outstanding;
    size_t void_before;  // plans emitted before the last WorkerInfo went to workers that are gone
    // The fake workers' GPU pool (the one h_info reported): per page the slot whose adapter
    // lies on it (-1: none) and whether an adapter was put there since its KV was written;
    // per slot its adapter's id ("" empty); adapter commands applied up to wseen.
    uint32_t wpages, wblock;
    int wslot_of[H_MAX_PAGES];
    bool woverwritten[H_MAX_PAGES];
    char wslot[H_MAX_SLOTS][64];
    size_t wseen;
    uint64_t wvoid_step;  // plans up to this step went to workers that are gone: no effect here
    int bad_slots;      // items whose slot did not hold their adapter when their step ran
    int lost_kv;        // items that read KV an adapter's pages overwrote
    int bad_prefetches; // PrefetchAdapters a worker refuses: too few pages, outside the pool, named twice
    int prefetches;     // PrefetchAdapters applied
} h_t;

// Token the fake worker samples for a request that has `generated` tokens so far.
static inline int32_t h_token(const h_t *h, uint64_t rid, uint32_t generated) {
    if (h->eos_token && generated == h->eos_at)
        return h->eos_token;
    return (int32_t)(1000 + rid * 10 + generated % 10);
}

sched_config_t h_config(void);
h_t *h_new(const sched_config_t *cfg);
void h_free(h_t *h);
// WorkerInfo from `rank`, with EOS id 2: a worker that starts (or restarts) knows no request,
// and the plans sent before it are never answered.
void h_info(h_t *h, uint32_t rank, uint32_t kv_blocks, uint32_t block_size, uint32_t max_context, uint32_t slots,
            uint32_t max_loaded);
// TokenizedReq: prompt of n tokens (token i = base + i), adapter id or NULL, max_new (0: default).
// The vocabulary the fake workers report: prompts use ids base .. base+n-1 below it.
#define H_VOCAB 32000
void h_request(h_t *h, uint64_t rid, uint32_t n, int32_t base, const char *adapter, uint32_t max_new);
// The same with n_added added tokens (TokenizedReq.added_tokens: ids H_VOCAB and up).
void h_request_added(h_t *h, uint64_t rid, uint32_t n, int32_t base, const char *adapter, uint32_t max_new,
                     uint32_t n_added);
void h_abort(h_t *h, uint64_t rid);
void h_load(h_t *h, uint64_t rid, const char *id, bool pinned);
void h_unload(h_t *h, uint64_t rid, const char *id);
// Answer what the fake workers have been sent, until nothing new is emitted (or max_steps plans
// were answered; 0: no limit). Returns the number of plans answered.
int h_pump(h_t *h, int max_steps);
// Answer one StepPlan as the fake workers would (rank 0's StepResult).
void h_answer_plan(h_t *h, const ls_msg_t *plan);
// The last emitted message of `type` (NULL if none), searching from index `from`.
const ls_msg_t *h_last(const h_t *h, int type, size_t from);
size_t h_count(const h_t *h, int type, size_t from);

#endif
