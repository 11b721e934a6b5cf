// ls_par — a parallel loop for the few bulk jobs off the actors' loops that are worth several
// cores: reading an adapter's tensors and building its slot image (a cold adapter load is on
// the request's path: tens of MB converted element by element).
#ifndef LS_PAR_H
#define LS_PAR_H

#include <stddef.h>

// Runs fn(arg, i) for every i in [0, n) on up to `threads` threads, the caller's included,
// and returns when all are done; items are handed out in order from a shared counter, so
// fn must not depend on which thread runs it. threads <= 0: ls_par_threads(). If a thread
// cannot be started, the others (at least the caller) do its share.
void ls_par_for(size_t n, int threads, void (*fn)(void *arg, size_t i), void *arg);
// The default: the online CPUs, at most 8 (a load shares the host with a running server).
int ls_par_threads(void);

#endif
