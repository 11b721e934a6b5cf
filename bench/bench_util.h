// bench_util — what every benchmark program needs: a monotonic clock in seconds, the median
// of timings and a fatal error exit that names the program.
#ifndef LS_BENCH_UTIL_H
#define LS_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The median of t (n >= 1), which is sorted in place.
static inline double bench_median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

// Prints "prog: what: err" and exits 1: a benchmark that cannot set up has nothing to report.
static inline void bench_die(const char *prog, const char *what, const char *err) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, err);
    exit(1);
}

#endif
