// bench_util — what every benchmark program needs: a monotonic clock in seconds and a fatal
// error exit that names the program.
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

// Prints "prog: what: err" and exits 1: a benchmark that cannot set up has nothing to report.
static inline void bench_die(const char *prog, const char *what, const char *err) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, err);
    exit(1);
}

#endif
