/*  engine/comm.c — see comm.h: the generic calls and the shared-memory implementation.

    Why shared memory and not ZeroMQ: the ranks of a group run on one host (one process per
    device), the data are whole activations (T·hidden floats, twice per layer), and a step
    waits on every collective; a shared segment moves them with one copy in and one read out
    and synchronises with one futex, where a socket would copy each part through the kernel
    to every peer. The cost is that the group must share a host, which it does.

    The segment: a header page (barrier counters, the ranks' pids) and per rank a staging
    area of two halves of S_HALF floats. A collective moves its data in chunks of at most
    S_HALF floats; for each chunk every rank downloads its part into its current half,
    meets the others at the barrier, reads what it needs from everyone's current half, and
    flips to the other half. One barrier per chunk suffices: a rank writes a half again two
    chunks later, after a barrier that every rank reaches only once done reading it.

    The barrier: arrived counts the ranks in; the last one in resets it and bumps gen, the
    futex word the others sleep on. Waiters spin briefly (a decode step's collectives are
    microseconds apart), then sleep in slices of S_POLL_MS, checking between slices that
    the group is not broken and that every peer process is still alive.
*/
#define _GNU_SOURCE
#include "comm_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "ls_err.h"

#define S_MAX_RANKS 64
#define S_HDR_BYTES 4096
#define S_HALF ((size_t)1 << 19) // floats per half of a rank's staging area (2 MB)
#define S_SPINS 4000             // busy polls (then yields) before a waiter sleeps
#define S_POLL_MS 50

typedef struct {
    _Atomic uint32_t arrived;            // ranks at the barrier of this generation
    _Atomic uint32_t gen;                // barrier generation: the futex word
    _Atomic uint32_t broken;             // 0, or 1 + the rank that gave up on the group
    _Atomic int32_t pid[S_MAX_RANKS];    // each rank's process, from its join
} s_hdr_t;

_Static_assert(sizeof(s_hdr_t) <= S_HDR_BYTES, "the header must fit its page");

typedef struct {
    ls_comm_t base;
    void *map;
    size_t map_len;
    s_hdr_t *hdr;
    float *stage;   // (size, 2, S_HALF) in the segment
    float *acc;     // (S_HALF) this rank's sum
    int timeout_ms;
    unsigned phase; // the current half, the same on every rank
} s_shm_t;

const char *ls_comm_kind_name(ls_comm_kind_t kind) {
    return kind == LS_COMM_SHM ? "shm" : kind == LS_COMM_NCCL ? "nccl" : NULL;
}

ls_comm_kind_t ls_comm_kind_from_name(const char *name) {
    if (name && strcmp(name, "shm") == 0)
        return LS_COMM_SHM;
    if (name && strcmp(name, "nccl") == 0)
        return LS_COMM_NCCL;
    return 0;
}

static uint64_t s_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static size_t s_seg_bytes(int size) {
    return S_HDR_BYTES + (size_t)size * 2 * S_HALF * sizeof(float);
}

static float *s_stage(s_shm_t *c, int rank) {
    return c->stage + ((size_t)rank * 2 + c->phase) * S_HALF;
}

static void s_futex_wake(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

// Marks the group broken by this rank (unless it already is) and wakes every waiter.
static void s_break(s_shm_t *c) {
    uint32_t none = 0;
    atomic_compare_exchange_strong(&c->hdr->broken, &none, (uint32_t)c->base.rank + 1);
    s_futex_wake(&c->hdr->gen);
}

static int s_broken_err(s_shm_t *c, char *err, size_t errlen) {
    uint32_t b = atomic_load(&c->hdr->broken);
    ls_err_set(err, errlen, "tensor-parallel group (shm): rank %u gave up on the group or left "
               "it; no collective can run any more", b - 1);
    return -1;
}

// A peer whose process is gone, or -1.
static int s_dead_peer(s_shm_t *c) {
    pid_t me = getpid();
    for (int r = 0; r < c->base.size; r++) {
        pid_t p = atomic_load(&c->hdr->pid[r]);
        if (p > 0 && p != me && kill(p, 0) < 0 && errno == ESRCH)
            return r;
    }
    return -1;
}

static int s_barrier(s_shm_t *c, int timeout_ms, char *err, size_t errlen) {
    s_hdr_t *h = c->hdr;
    uint32_t gen = atomic_load(&h->gen);
    if (atomic_load(&h->broken))
        return s_broken_err(c, err, errlen);
    if (atomic_fetch_add(&h->arrived, 1) == (uint32_t)c->base.size - 1) {
        atomic_store(&h->arrived, 0);
        atomic_fetch_add(&h->gen, 1);
        s_futex_wake(&h->gen);
        return 0;
    }
    for (int i = 0; i < S_SPINS && atomic_load(&h->gen) == gen; i++)
        if (i > S_SPINS / 2)
            sched_yield(); // a rank of a busy host (or a test's threads) needs the core
    uint64_t deadline = s_now_ms() + (uint64_t)timeout_ms;
    while (atomic_load(&h->gen) == gen) {
        if (atomic_load(&h->broken))
            return s_broken_err(c, err, errlen);
        int dead = s_dead_peer(c);
        uint64_t now = s_now_ms();
        if (dead >= 0 || now >= deadline) {
            s_break(c);
            if (dead >= 0)
                ls_err_set(err, errlen, "tensor-parallel group (shm): rank %d (pid %d) is gone; "
                           "the group is broken", dead, (int)atomic_load(&h->pid[dead]));
            else
                ls_err_set(err, errlen, "tensor-parallel group (shm): rank %d waited %d ms for "
                           "the other ranks (one died, never came, or stopped taking part); the "
                           "group is broken", c->base.rank, timeout_ms);
            return -1;
        }
        uint64_t left = deadline - now < S_POLL_MS ? deadline - now : S_POLL_MS;
        struct timespec ts = {(time_t)(left / 1000), (long)(left % 1000) * 1000000L};
        syscall(SYS_futex, (uint32_t *)&h->gen, FUTEX_WAIT, gen, &ts, NULL, 0);
    }
    return 0;
}

static int s_shm_all_reduce(ls_comm_t *base, ls_view_t x, size_t n, char *err, size_t errlen) {
    s_shm_t *c = (s_shm_t *)base;
    ls_backend_t *be = base->be;
    for (size_t off = 0; off < n; off += S_HALF) {
        size_t m = n - off < S_HALF ? n - off : S_HALF;
        if (be->buffer_download(be, s_stage(c, base->rank), ls_view(x.buf, x.off + off), m) != 0) {
            s_break(c);
            ls_err_set(err, errlen, "all-reduce: download from the %s backend failed", be->name);
            return -1;
        }
        if (s_barrier(c, c->timeout_ms, err, errlen) != 0)
            return -1;
        // rank order on every rank: the sums agree bit for bit
        memcpy(c->acc, s_stage(c, 0), m * sizeof(float));
        for (int r = 1; r < base->size; r++) {
            const float *p = s_stage(c, r);
            for (size_t i = 0; i < m; i++)
                c->acc[i] += p[i];
        }
        c->phase ^= 1;
        if (be->buffer_upload(be, ls_view(x.buf, x.off + off), c->acc, LS_DTYPE_F32, m) != 0) {
            s_break(c);
            ls_err_set(err, errlen, "all-reduce: upload to the %s backend failed", be->name);
            return -1;
        }
    }
    return 0;
}

static int s_shm_gather_cols(ls_comm_t *base, ls_view_t out, ls_view_t part, int rows, int ld,
                             const int *col_off, char *err, size_t errlen) {
    s_shm_t *c = (s_shm_t *)base;
    ls_backend_t *be = base->be;
    if (ld < 1 || (size_t)ld > S_HALF) {
        ls_err_set(err, errlen, "gather: rows of %d floats do not fit the %zu-float staging area",
                   ld, S_HALF);
        return -1;
    }
    int per = (int)(S_HALF / (size_t)ld), total = col_off[base->size];
    for (int row0 = 0; row0 < rows; row0 += per) {
        int m = rows - row0 < per ? rows - row0 : per;
        if (be->buffer_download(be, s_stage(c, base->rank),
                                ls_view(part.buf, part.off + (size_t)row0 * ld),
                                (size_t)m * ld) != 0) {
            s_break(c);
            ls_err_set(err, errlen, "gather: download from the %s backend failed", be->name);
            return -1;
        }
        if (s_barrier(c, c->timeout_ms, err, errlen) != 0)
            return -1;
        for (int i = 0; base->rank == 0 && i < m; i++)
            for (int r = 0; r < base->size; r++) {
                size_t at = out.off + (size_t)(row0 + i) * total + (size_t)col_off[r];
                if (be->buffer_upload(be, ls_view(out.buf, at), s_stage(c, r) + (size_t)i * ld,
                                      LS_DTYPE_F32, (size_t)(col_off[r + 1] - col_off[r])) != 0) {
                    s_break(c);
                    ls_err_set(err, errlen, "gather: upload to the %s backend failed", be->name);
                    return -1;
                }
            }
        c->phase ^= 1;
    }
    return 0;
}

static void s_shm_free(ls_comm_t *base) {
    s_shm_t *c = (s_shm_t *)base;
    if (c->hdr)
        s_break(c); // peers still waiting on this rank fail now instead of at their timeout
    if (c->map)
        munmap(c->map, c->map_len);
    free(c->acc);
    free(c);
}

int ls_comm_shm_id(int size, ls_comm_id_t *id, char *err, size_t errlen) {
    if (size < 1 || size > S_MAX_RANKS) {
        ls_err_set(err, errlen, "shm group: size %d outside 1..%d", size, S_MAX_RANKS);
        return -1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    *id = (ls_comm_id_t){.kind = LS_COMM_SHM, .size = size};
    int n = snprintf((char *)id->bytes, sizeof id->bytes, "/loraserve-tp-%d-%lld%09ld", (int)getpid(),
                     (long long)ts.tv_sec, ts.tv_nsec);
    id->len = (size_t)n + 1;
    return 0;
}

ls_comm_t *ls_comm_shm_join(const ls_comm_id_t *id, int rank, ls_backend_t *be, int timeout_ms,
                            char *err, size_t errlen) {
    char name[LS_COMM_ID_MAX + 1];
    size_t len = id->len < LS_COMM_ID_MAX ? id->len : LS_COMM_ID_MAX;
    memcpy(name, id->bytes, len);
    name[len] = '\0';
    if (id->kind != LS_COMM_SHM || id->size < 1 || id->size > S_MAX_RANKS || rank < 0 ||
        rank >= id->size || name[0] != '/' || strchr(name + 1, '/') || timeout_ms < 1) {
        ls_err_set(err, errlen, "shm group: bad id \"%s\" for rank %d of %d", name, rank, id->size);
        return NULL;
    }
    s_shm_t *c = calloc(1, sizeof *c);
    if (!c || !(c->acc = malloc(S_HALF * sizeof(float)))) {
        free(c);
        ls_err_set(err, errlen, "shm group: out of memory");
        return NULL;
    }
    c->base = (ls_comm_t){rank, id->size, be, s_shm_all_reduce, s_shm_gather_cols, s_shm_free};
    c->timeout_ms = timeout_ms;
    c->map_len = s_seg_bytes(id->size);
    // Every rank creates-or-opens and sizes it: no rank has to come first.
    int fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->map_len) != 0 ||
        (c->map = mmap(NULL, c->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
        ls_err_set(err, errlen, "shm group: segment %s (%zu bytes): %s", name, c->map_len,
                   strerror(errno));
        c->map = NULL;
        if (fd >= 0)
            close(fd);
        shm_unlink(name);
        s_shm_free(&c->base);
        return NULL;
    }
    close(fd);
    c->hdr = c->map;
    c->stage = (float *)((char *)c->map + S_HDR_BYTES);
    atomic_store(&c->hdr->pid[rank], (int32_t)getpid());
    char why[512];
    int rc = s_barrier(c, timeout_ms, why, sizeof why);
    // Everyone has it mapped (or the join failed): the name is no longer needed, and
    // unlinking now leaves nothing behind in /dev/shm whatever happens to the processes.
    shm_unlink(name);
    if (rc != 0) {
        ls_err_set(err, errlen, "rank %d could not join the tensor-parallel group of %d: %s", rank,
                   id->size, why);
        s_shm_free(&c->base);
        return NULL;
    }
    return &c->base;
}

void ls_comm_destroy(ls_comm_t **self_p) {
    if (self_p && *self_p) {
        (*self_p)->free(*self_p);
        *self_p = NULL;
    }
}

int ls_comm_rank(const ls_comm_t *self) {
    return self->rank;
}

int ls_comm_size(const ls_comm_t *self) {
    return self->size;
}

int ls_comm_all_reduce(ls_comm_t *self, ls_view_t x, size_t n, char *err, size_t errlen) {
    return n ? self->all_reduce(self, x, n, err, errlen) : 0;
}

int ls_comm_gather_cols(ls_comm_t *self, ls_view_t out, ls_view_t part, int rows, int ld,
                        const int *col_off, char *err, size_t errlen) {
    return rows > 0 ? self->gather_cols(self, out, part, rows, ld, col_off, err, errlen) : 0;
}
