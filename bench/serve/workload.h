// The benchmark's requests — prompts, output lengths, adapters, arrival times — made before
// the run from the seed alone (or read from a JSONL dataset), so that a fixed --seed replays
// the same request sequence against any server.
#ifndef BS_WORKLOAD_H
#define BS_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

// Adapter popularity: which adapter each request names.
typedef enum {
    BS_DIST_UNIFORM,  // every adapter equally likely
    BS_DIST_ZIPF,     // adapter k (0-based) with probability ∝ 1 / (k + 1)^alpha
    BS_DIST_SINGLE,   // every request to the first adapter
    BS_DIST_BASE,     // every request to the base model
} bs_dist_kind_t;

typedef struct {
    bs_dist_kind_t kind;
    double alpha;  // zipf only
} bs_dist_t;

// "uniform", "zipf:ALPHA" (ALPHA > 0), "single" or "base"; -1 on anything else.
int bs_dist_parse(const char *s, bs_dist_t *out);

typedef struct {
    uint32_t *ids;      // prompt token ids (NULL when the dataset gave text)
    size_t nids;
    char *text;         // the dataset's prompt text (NULL with ids)
    int output_len;     // new tokens asked for
    int adapter;        // index into the workload's adapter names; -1: the base model
    double arrival_s;   // when the request arrives, seconds after the run's start
    int constrained;    // asks for the run's structured output (--json-schema, --regex)
} bs_req_t;

typedef struct {
    size_t num_prompts;    // requests; 0 with a dataset: one per line
    int input_len, output_len;
    double range_ratio;    // lengths uniform in [len * ratio, len] (SGLang's random dataset)
    uint32_t vocab_size;   // random prompts draw ids from bs_workload_token_range of this
    const char *dataset;   // JSONL file instead of random prompts (NULL: random)
    bs_dist_t dist;
    double request_rate;   // requests per second, Poisson arrivals; <= 0 or infinite: all at 0
    double constrained_ratio;  // the share of requests with structured output, drawn by the seed
    uint64_t seed;
} bs_workload_cfg_t;

typedef struct bs_workload_t bs_workload_t;

// Makes the requests. names are the adapters the distribution draws from (nnames of them);
// dataset lines may name others, which are added after them. NULL on failure with the reason
// in err (a dataset error names FILE:LINE).
bs_workload_t *bs_workload_new(const bs_workload_cfg_t *cfg, const char *const *names, size_t nnames, char *err,
                               size_t errcap);
void bs_workload_destroy(bs_workload_t **pw);

size_t bs_workload_size(const bs_workload_t *w);
const bs_req_t *bs_workload_req(const bs_workload_t *w, size_t i);
size_t bs_workload_adapter_count(const bs_workload_t *w);
const char *bs_workload_adapter_name(const bs_workload_t *w, int adapter);  // NULL for -1

// The ids random prompts draw from, [*lo, *hi): vocabularies keep their special tokens at one
// end or the other (Llama 3 and Qwen at the top, Llama 2, Mistral and the demo model at the
// bottom), so both ends are left out — min(1000, vocab / 8) ids at each.
void bs_workload_token_range(uint32_t vocab_size, uint32_t *lo, uint32_t *hi);

#endif
