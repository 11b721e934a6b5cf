// ls_par — see ls_par.h.
#include "ls_par.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define S_MAX_THREADS 8

typedef struct {
    void (*fn)(void *arg, size_t i);
    void *arg;
    size_t n;
    atomic_size_t next;
} s_job_t;

static void *s_run(void *p) {
    s_job_t *j = p;
    for (size_t i; (i = atomic_fetch_add(&j->next, 1)) < j->n;)
        j->fn(j->arg, i);
    return NULL;
}

int ls_par_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > S_MAX_THREADS ? S_MAX_THREADS : (int)n;
}

void ls_par_for(size_t n, int threads, void (*fn)(void *arg, size_t i), void *arg) {
    s_job_t j = {.fn = fn, .arg = arg, .n = n};
    atomic_init(&j.next, 0);
    if (threads <= 0)
        threads = ls_par_threads();
    if ((size_t)threads > n)
        threads = (int)n;
    if (threads > S_MAX_THREADS)
        threads = S_MAX_THREADS;
    pthread_t th[S_MAX_THREADS];
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&th[started], NULL, s_run, &j) == 0)
            started++;
    s_run(&j);
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
}
