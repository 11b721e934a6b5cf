// The HTTP side of the benchmark: libcurl's multi interface on one thread, one easy handle per
// request in flight, connections kept alive and reused, every stream's events timed at arrival
// (CLOCK_MONOTONIC) as they are parsed.
#ifndef BS_CLIENT_H
#define BS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "sse.h"
#include "workload.h"

typedef struct {
    const char *base_url;  // scheme://host:port, no trailing slash
    const char *api_key;   // Authorization: Bearer KEY when set
    bs_api_t api;          // /generate with input_ids, or /v1/completions
    int stream;
    int ignore_eos;
    double timeout_s;      // a request not over by then fails as "timeout"
    int save_outputs;      // keep each answer's ids and text
    const char *model;     // openai: the `model` of requests for the base model
    // structured output of the requests marked constrained: a JSON schema (compact JSON text)
    // or a regex, at most one; such requests may stop at EOS (the grammar ends them)
    const char *json_schema;
    const char *regex;
} bs_client_cfg_t;

// One request's outcome. Times are milliseconds; send_ms counts from the run's start.
typedef struct {
    int ok;
    double send_ms, ttft_ms, e2e_ms;  // ttft_ms is e2e_ms when not streamed, -1 when no token came
    double *itl_ms;                   // gaps between chunks that carried tokens, after the first
    size_t nitl;
    size_t chunks;                    // events that carried tokens
    long long prompt_tokens, output_tokens;  // as the server counted them (-1: it did not say)
    char err_kind[24];                // "" when ok; http_NNN, connect, timeout, stream_error, bad_response, transport
    char *err_msg;
    // with save_outputs
    uint32_t *output_ids;             // generate only
    size_t noutput_ids;
    char *text;
} bs_result_t;

void bs_result_clear(bs_result_t *r);

typedef struct bs_client_t bs_client_t;

bs_client_t *bs_client_new(const bs_client_cfg_t *cfg);
void bs_client_destroy(bs_client_t **pc);
// The base model's name, once the server has told it (cfg->model); the client keeps the pointer.
void bs_client_set_model(bs_client_t *c, const char *model);

// GET base_url + path, blocking. The HTTP status (body and its length in *body/*n, to free),
// or -1 when no answer came, the reason in err.
int bs_client_get(bs_client_t *c, const char *path, char **body, size_t *n, char *err, size_t errcap);

// Called at most every 100 ms while a run goes, and once at its end.
typedef void (*bs_progress_fn)(void *arg, size_t done, size_t failed, double elapsed_s);

typedef struct {
    const size_t *order;     // the workload's requests to send, in this order (NULL: all, in order)
    size_t n;                // how many (with order NULL: the workload's size)
    int paced;               // send each at its arrival time (else as fast as the cap allows)
    size_t max_concurrency;  // requests in flight at most (0: no cap)
    int base_only;           // every request to the base model, whatever adapter it names
    bs_progress_fn progress;
    void *arg;
} bs_run_t;

// Sends the requests and waits for every answer; out[i] is order[i]'s outcome. *duration_s is
// from the first send to the last byte received. -1 only when the client itself fails (out of
// memory, libcurl); failed requests are results.
int bs_client_run(bs_client_t *c, const bs_workload_t *w, const bs_run_t *run, bs_result_t *out, double *duration_s,
                  size_t *max_inflight);

#endif
