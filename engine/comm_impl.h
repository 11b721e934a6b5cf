/*  engine/comm_impl.h — the inside of ls_comm_t, shared by its implementations (comm.c:
    shm; comm_nccl.cu: NCCL). Not for callers: they use comm.h.
*/
#ifndef LS_COMM_IMPL_H
#define LS_COMM_IMPL_H

#include "comm.h"

struct ls_comm {
    int rank, size;
    ls_backend_t *be;
    int (*all_reduce)(ls_comm_t *self, ls_view_t x, size_t n, char *err, size_t errlen);
    int (*gather_cols)(ls_comm_t *self, ls_view_t out, ls_view_t part, int rows, int ld,
                       const int *col_off, char *err, size_t errlen);
    void (*free)(ls_comm_t *self);
};

#endif
