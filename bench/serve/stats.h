// Summary statistics of latency samples, computed as numpy computes SGLang's bench_serving
// numbers: population standard deviation, percentiles by linear interpolation between ranks.
#ifndef BS_STATS_H
#define BS_STATS_H

#include <stddef.h>

typedef struct {
    size_t n;
    double mean, median, std, p50, p90, p95, p99, max;  // all 0 when n is 0
} bs_summary_t;

// The p-th percentile (0..100) of n sorted values (numpy's default "linear" method).
double bs_stats_percentile(const double *sorted, size_t n, double p);
// Sorts v in place and summarizes it.
void bs_stats_summarize(double *v, size_t n, bs_summary_t *out);

#endif
