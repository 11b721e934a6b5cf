#include "stats.h"

#include <math.h>
#include <stdlib.h>

static int s_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bs_stats_percentile(const double *sorted, size_t n, double p) {
    if (!n)
        return 0;
    double rank = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(rank);
    if (lo + 1 >= n)
        return sorted[n - 1];
    double frac = rank - (double)lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

void bs_stats_summarize(double *v, size_t n, bs_summary_t *out) {
    *out = (bs_summary_t){.n = n};
    if (!n)
        return;
    qsort(v, n, sizeof *v, s_cmp);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    out->mean = sum / (double)n;
    for (size_t i = 0; i < n; i++)
        sq += (v[i] - out->mean) * (v[i] - out->mean);
    out->std = sqrt(sq / (double)n);
    out->median = out->p50 = bs_stats_percentile(v, n, 50);
    out->p90 = bs_stats_percentile(v, n, 90);
    out->p95 = bs_stats_percentile(v, n, 95);
    out->p99 = bs_stats_percentile(v, n, 99);
    out->max = v[n - 1];
}
