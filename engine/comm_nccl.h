/*  engine/comm_nccl.h — the NCCL communicator of comm.h, for the CUDA backend.

    Built with the CUDA backend when CMake finds NCCL (whoever links ls_engine_cuda then gets
    LS_HAVE_NCCL). all_reduce is ncclAllReduce (sum, fp32, in place) and gather_cols is an
    ncclSend/ncclRecv group into a (size, rows, ld) staging buffer on rank 0 followed by one
    2-D device copy per rank into the (rows, total) result, all on the backend's stream, so
    a collective queues behind the step's kernels and the host never waits for it.

    Joining uses a non-blocking communicator (ncclConfig_t.blocking = 0) polled until it is
    ready, so a rank that never comes costs its peers timeout_ms and a clear error rather
    than a hang; NCCL_NVLS_ENABLE is set to 0 unless the environment already says otherwise.
    After the join, a collective whose peer died is noticed by NCCL's own error reporting
    (ncclCommGetAsyncError, checked on every call) or by the scheduler's step timeout.
*/
#ifndef LS_COMM_NCCL_H
#define LS_COMM_NCCL_H

#ifdef __cplusplus
extern "C" {
#endif

#include "comm.h"

// Rank 0: a fresh ncclUniqueId for a group of size ranks. -1 + err when NCCL fails.
int ls_comm_nccl_id(int size, ls_comm_id_t *id, char *err, size_t errlen);
// Joins the NCCL group of id as rank on be (a CUDA backend, whose device and stream it
// uses). NULL + err when the join fails or times out.
ls_comm_t *ls_comm_nccl_join(const ls_comm_id_t *id, int rank, ls_backend_t *be, int timeout_ms,
                             char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
