// The run's results: the metrics SGLang's bench_serving reports (same JSON keys) plus the
// multi-LoRA ones — failures by kind, SLO attainment, the server's adapter counters moved
// during the run, and what the benchmark client itself cost. One JSON object is the source;
// the table is printed from it.
#ifndef BS_REPORT_H
#define BS_REPORT_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "client.h"
#include "prom.h"
#include "workload.h"

typedef struct {
    const bs_workload_t *w;
    const bs_result_t *res;  // one per request of the workload, in its order
    size_t n;
    double duration_s;
    double slo_ttft_ms, slo_tpot_ms;  // <= 0: no such SLO
    const bs_prom_t *before, *after;  // /metrics around the run; NULL when not readable
    double cpu_s;                     // the client's CPU time (user + system) during the run
    size_t max_inflight;
} bs_run_data_t;

// Adds the results' keys to report (which holds the configuration) and returns 0, -1 out of memory.
int bs_report_fill(cJSON *report, const bs_run_data_t *d);
void bs_report_print(FILE *f, const cJSON *report);
// Appends the report to path as one JSON line (SGLang's --output-file convention).
int bs_report_append(const char *path, const cJSON *report, char *err, size_t errcap);
// One JSON line per request: its input, adapter, answer, timings and error.
int bs_report_save_outputs(const char *path, const bs_run_data_t *d, char *err, size_t errcap);

#endif
