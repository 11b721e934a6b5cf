// latency — the tokenizer's latency histograms per adapter: time to first token, inter-token
// latency and end-to-end request latency, with vLLM's buckets, reported in Metrics.histograms
// and rendered by the gateway's /metrics (docs/operations.md, "Metrics").
//
// Why the tokenizer measures: it is the front door of every client (the gateway and SDK clients
// alike), and it sees every piece of every completion whether the client streams or not (the
// detokenizer always sends pieces; the tokenizer collects them for a non-streaming client), so
// the first token's time is known for every request. The gateway sees the first token of
// streamed requests only, and none of an SDK client's. What the tokenizer cannot see is the
// gateway's own HTTP time (parsing the body, writing the answer): well under a millisecond.
//
// Which adapters have series of their own is ls_series' policy (common/ls_series.h). No clock
// is read here: the caller passes durations from its event times.
#ifndef LS_TOK_LATENCY_H
#define LS_TOK_LATENCY_H

#include <stdint.h>

#include "ls_msg.h"

typedef enum {
    LATENCY_TTFT,  // the request's arrival to its completion's first token
    LATENCY_ITL,   // between a completion's tokens, one observation per token after the first
    LATENCY_E2E,   // the request's arrival to its completion's end (stopped or at its length)
    LATENCY_KINDS
} latency_kind_t;

typedef struct latency latency_t;

// max_adapters: adapters with series of their own (--metrics-max-adapters). NULL when out of
// memory.
latency_t *latency_new(int max_adapters);
void latency_destroy(latency_t **p);

// `times` observations of `us` microseconds each for adapter ("" or NULL: the base model).
void latency_observe(latency_t *l, const char *adapter, latency_kind_t kind, uint64_t us, uint32_t times);

// The adapter was unloaded: its series fold into "other".
void latency_forget(latency_t *l, const char *adapter);

// Every series with an observation, into m->histograms (empty before); -1 when out of memory,
// with what was made left in m for ls_msg_clear.
int latency_export(const latency_t *l, ls_msg_metrics_t *m);

#endif
