/*  tests/kernels/test_util.h — shared helpers of the kernel tests: a seeded generator for
    random inputs and the error measures the tolerances are stated in.

    NMSE = Σ (got - ref)² / Σ ref², against a reference computed in double. fp32 kernels
    over reductions of a few hundred terms land near 1e-13; the bounds used (1e-10 unless
    a test says otherwise) leave room for a different summation order (BLAS, GPU) while
    still catching any indexing mistake, which shows up as NMSE ~ 1.
*/
#ifndef LS_TEST_UTIL_H
#define LS_TEST_UTIL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint64_t s;
} t_rng_t;

static inline uint64_t t_rng_next(t_rng_t *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// uniform in [lo, hi)
static inline float t_rng_float(t_rng_t *r, float lo, float hi) {
    return lo + (hi - lo) * (float)((t_rng_next(r) >> 40) * 0x1p-24);
}

// uniform integer in [0, n)
static inline int t_rng_int(t_rng_t *r, int n) {
    return (int)(t_rng_next(r) % (uint64_t)n);
}

static inline void t_fill(t_rng_t *r, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++)
        x[i] = t_rng_float(r, lo, hi);
}

// Fisher-Yates shuffle of an int array
static inline void t_shuffle(t_rng_t *r, int32_t *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = t_rng_int(r, i + 1);
        int32_t tmp = a[i];
        a[i] = a[j];
        a[j] = tmp;
    }
}

static inline double t_nmse(const float *got, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

static inline double t_max_abs(const float *got, const double *ref, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(d))
            return INFINITY;
        if (d > m)
            m = d;
    }
    return m;
}

// malloc that the tests do not check one by one: an allocation failure aborts the test
static inline void *t_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        abort();
    return p;
}

#endif
