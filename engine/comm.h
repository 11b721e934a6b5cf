/*  engine/comm.h — the collectives of a tensor-parallel group (ls_comm_t).

    A group is tp_size ranks (worker processes, or threads in tests), each with its own
    backend. The model needs two collectives per step, both on fp32 backend buffers:
    - all_reduce: x (n) summed over the ranks in place, the same bits on every rank (each
      rank keeps its copy of the residual stream, so the copies must never drift apart);
    - gather_cols: each rank's part (rows, ld) holds its columns of a (rows, total) matrix
      (its vocabulary slice of the logits); rank 0 receives the whole matrix.

    Setting up. Rank 0 makes the group's id (ls_comm_shm_id, or ls_comm_nccl_id in
    backend_cuda.h); the id travels by message to every rank (the scheduler relays it) and
    each rank joins with it. Joining blocks until every rank has joined or timeout_ms passed.

    Two implementations:
    - shm (this file's, any backend): POSIX shared memory between the processes of one host.
      One segment per group, named from the id; each rank owns a staging area there, a
      barrier built on a futex synchronises them. Every rank sums the staged parts in rank
      order, so the sums agree bit for bit. Data goes through buffer_download/upload, so the
      CPU backend pays plain memcpys and a device backend works too (slowly).
    - nccl (backend_cuda.h): ncclAllReduce and ncclSend/Recv on the backend's stream.

    Failure. A collective that times out (a rank died, or stopped taking part) returns -1
    with err; the shm group then counts as broken and every later collective of every rank
    fails at once, so a dead rank costs its peers one timeout, not one per layer. The shm
    wait also notices a rank whose process is gone (its pid, recorded at join) without
    waiting for the timeout.
*/
#ifndef LS_COMM_H
#define LS_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct ls_comm ls_comm_t;

typedef enum {
    LS_COMM_SHM = 1,
    LS_COMM_NCCL = 2,
} ls_comm_kind_t;

#define LS_COMM_ID_MAX 128 // NCCL_UNIQUE_ID_BYTES

// What rank 0 hands to the others: the kind, the group size and the kind's own id.
typedef struct {
    ls_comm_kind_t kind;
    int size;
    size_t len;
    unsigned char bytes[LS_COMM_ID_MAX];
} ls_comm_id_t;

// "shm" or "nccl"; NULL for anything else.
const char *ls_comm_kind_name(ls_comm_kind_t kind);
// The kind named name, or 0.
ls_comm_kind_t ls_comm_kind_from_name(const char *name);

// A fresh shm id for a group of size ranks: a segment name unique to this process and
// moment. Nothing is created until the first rank joins.
int ls_comm_shm_id(int size, ls_comm_id_t *id, char *err, size_t errlen);
// Joins the shm group of id as rank; collectives then run on be's buffers. timeout_ms
// bounds the join and every later wait. NULL + err on failure (the segment is unlinked).
ls_comm_t *ls_comm_shm_join(const ls_comm_id_t *id, int rank, ls_backend_t *be, int timeout_ms,
                            char *err, size_t errlen);

// Leaves the group (peers still waiting fail at once) and frees; idempotent.
void ls_comm_destroy(ls_comm_t **self_p);

int ls_comm_rank(const ls_comm_t *self);
int ls_comm_size(const ls_comm_t *self);

// x (n) fp32 = the sum over the ranks of x, in place. -1 + err on a timeout or a backend
// failure.
int ls_comm_all_reduce(ls_comm_t *self, ls_view_t x, size_t n, char *err, size_t errlen);
// part (rows, ld) fp32 on every rank holds columns col_off[rank] .. col_off[rank+1] - 1
// (at most ld of them); rank 0's out (rows, col_off[size]) receives all of them. out is
// not touched on other ranks. -1 + err as all_reduce.
int ls_comm_gather_cols(ls_comm_t *self, ls_view_t out, ls_view_t part, int rows, int ld,
                        const int *col_off, char *err, size_t errlen);

#endif
