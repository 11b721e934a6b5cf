/*  engine/comm_nccl.cu — see comm_nccl.h.

    The communicator is non-blocking (ncclConfig_t.blocking = 0) so that its creation can be
    bounded in time; NCCL then may answer any call with ncclInProgress, meaning the call is
    still being enqueued on the host, and s_settle polls until it is (never waiting for the
    GPU work itself).
*/
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "ls_err.h"
#include "backend_cuda.h"
#include "comm_impl.h"
#include "comm_nccl.h"

#define S_SPIN_MS 20.0

static_assert(sizeof(ncclUniqueId) <= LS_COMM_ID_MAX, "an ncclUniqueId must fit ls_comm_id_t");

typedef struct {
    ls_comm_t base;
    ncclComm_t nc;
    cudaStream_t stream;
    int timeout_ms;
    void *stage;        // rank 0's gather staging (size, rows, ld) fp32, on the device
    size_t stage_bytes;
} s_nccl_t;

static double s_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Waits until the communicator has no call in progress (at most timeout_ms); what names the
// call for the error. Returns 0, or -1 + err.
static int s_settle(s_nccl_t *c, ncclResult_t r, const char *what, int timeout_ms, char *err,
                    size_t errlen) {
    double start = s_now_ms(), now = start;
    while (r == ncclInProgress) {
        if (now - start > timeout_ms) {
            ls_err_set(err, errlen, "NCCL %s on rank %d: not done after %d ms (a rank died or never "
                  "joined)", what, c->base.rank, timeout_ms);
            return -1;
        }
        // an enqueue settles in microseconds, and a step issues ~65 of them: poll without
        // sleeping at first; only a long wait (the join) sleeps between polls
        if (now - start > S_SPIN_MS)
            usleep(200);
        ncclCommGetAsyncError(c->nc, &r);
        now = s_now_ms();
    }
    if (r == ncclSuccess)
        ncclCommGetAsyncError(c->nc, &r); // an earlier collective may have failed since
    if (r != ncclSuccess) {
        ls_err_set(err, errlen, "NCCL %s on rank %d: %s (%s)", what, c->base.rank, ncclGetErrorString(r),
              ncclGetLastError(c->nc));
        return -1;
    }
    return 0;
}

static int s_nccl_all_reduce(ls_comm_t *base, ls_view_t x, size_t n, char *err, size_t errlen) {
    s_nccl_t *c = (s_nccl_t *)base;
    assert(x.buf->dtype == LS_DTYPE_F32);
    float *p = (float *)x.buf->data + x.off;
    return s_settle(c, ncclAllReduce(p, p, n, ncclFloat, ncclSum, c->nc, c->stream), "all-reduce",
                    c->timeout_ms, err, errlen);
}

static int s_nccl_gather_cols(ls_comm_t *base, ls_view_t out, ls_view_t part, int rows, int ld,
                              const int *col_off, char *err, size_t errlen) {
    s_nccl_t *c = (s_nccl_t *)base;
    int size = base->size;
    size_t slab = (size_t)rows * ld; // one rank's part
    const float *mine = (const float *)part.buf->data + part.off;
    if (base->rank == 0 && c->stage_bytes < slab * size * sizeof(float)) {
        // queued work may still read the old block
        cudaStreamSynchronize(c->stream);
        cudaFree(c->stage);
        c->stage_bytes = 0;
        if (cudaMalloc(&c->stage, slab * size * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            c->stage = NULL;
            ls_err_set(err, errlen, "gather: out of device memory for %zu floats", slab * size);
            return -1;
        }
        c->stage_bytes = slab * size * sizeof(float);
    }
    ncclResult_t r = ncclGroupStart();
    if (base->rank == 0) {
        for (int q = 1; q < size && r == ncclSuccess; q++)
            r = ncclRecv((float *)c->stage + slab * q, slab, ncclFloat, q, c->nc, c->stream);
    } else {
        r = ncclSend(mine, slab, ncclFloat, 0, c->nc, c->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    if (s_settle(c, r == ncclSuccess ? end : r, "gather", c->timeout_ms, err, errlen) != 0)
        return -1;
    if (base->rank != 0)
        return 0;
    int total = col_off[size];
    float *dst = (float *)out.buf->data + out.off;
    for (int q = 0; q < size; q++) {
        const float *src = q == 0 ? mine : (const float *)c->stage + slab * q;
        size_t cols = (size_t)(col_off[q + 1] - col_off[q]);
        cudaError_t e = cudaMemcpy2DAsync(dst + col_off[q], (size_t)total * sizeof(float), src,
                                          (size_t)ld * sizeof(float), cols * sizeof(float),
                                          (size_t)rows, cudaMemcpyDeviceToDevice, c->stream);
        if (e != cudaSuccess) {
            ls_err_set(err, errlen, "gather: %s", cudaGetErrorString(e));
            return -1;
        }
    }
    return 0;
}

static void s_nccl_free(ls_comm_t *base) {
    s_nccl_t *c = (s_nccl_t *)base;
    if (c->nc) {
        cudaStreamSynchronize(c->stream);
        ncclCommAbort(c->nc); // no collective is pending: abort is the teardown that cannot hang
    }
    cudaFree(c->stage);
    free(c);
}

extern "C" int ls_comm_nccl_id(int size, ls_comm_id_t *id, char *err, size_t errlen) {
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        ls_err_set(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return -1;
    }
    memset(id, 0, sizeof *id);
    id->kind = LS_COMM_NCCL;
    id->size = size;
    id->len = sizeof uid;
    memcpy(id->bytes, &uid, sizeof uid);
    return 0;
}

extern "C" ls_comm_t *ls_comm_nccl_join(const ls_comm_id_t *id, int rank, ls_backend_t *be,
                                        int timeout_ms, char *err, size_t errlen) {
    if (id->kind != LS_COMM_NCCL || id->len != sizeof(ncclUniqueId) || id->size < 1 || rank < 0 ||
        rank >= id->size || strcmp(be->name, "cuda") != 0) {
        ls_err_set(err, errlen, "NCCL group: bad id for rank %d of %d, or not a cuda backend", rank, id->size);
        return NULL;
    }
    // NVLink multicast (NVLS) stays off: it needs fabric setup the hosts do not all have.
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    s_nccl_t *c = (s_nccl_t *)calloc(1, sizeof *c);
    if (!c) {
        ls_err_set(err, errlen, "NCCL group: out of memory");
        return NULL;
    }
    c->base = ls_comm_t{rank, id->size, be, s_nccl_all_reduce, s_nccl_gather_cols, s_nccl_free};
    c->stream = (cudaStream_t)ls_backend_cuda_stream(be);
    c->timeout_ms = timeout_ms;
    ncclUniqueId uid;
    memcpy(&uid, id->bytes, sizeof uid);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    char why[512];
    ncclResult_t r = ncclCommInitRankConfig(&c->nc, id->size, uid, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        ls_err_set(err, errlen, "rank %d could not join the NCCL group of %d: %s", rank, id->size,
              ncclGetErrorString(r));
        c->nc = NULL;
        s_nccl_free(&c->base);
        return NULL;
    }
    if (s_settle(c, r, "join", timeout_ms, why, sizeof why) != 0) {
        ls_err_set(err, errlen, "rank %d could not join the NCCL group of %d: %s", rank, id->size, why);
        s_nccl_free(&c->base);
        return NULL;
    }
    return &c->base;
}
