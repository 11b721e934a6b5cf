// ls_actor_impl — the runtime's inside, shared by its rooms: ls_actor.c (the loop, sockets,
// sending, the built-in handlers, supervision, the inbound path, timers, lifecycle),
// ls_stream.c (raw byte streams), ls_job.c (the job thread) and ls_replay.c (replay of a
// recorded run). Not for actors: they use ls_actor.h.
#ifndef LS_ACTOR_IMPL_H
#define LS_ACTOR_IMPL_H

#include "ls_actor.h"
#include "ls_curve.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <arpa/inet.h>
#include <errno.h>
#include <ev.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "ls_trace.h"

struct ls_sock {
    ls_actor_t *actor;
    zsock_t *zs;
    uint16_t index;  // socket number in the trace
    int is_router;
    char *peer;      // DEALER: the peer's name ("control" for the launcher)
    int more;        // messages may be waiting: drain again on the next loop turn
    ev_io io;
};

struct ls_route {
    ls_sock_t *sock;
    zframe_t *identity;
};

struct ls_timer {
    ls_actor_t *actor;
    uint32_t id;
    ev_timer ev;
    ls_timer_fn fn;
    void *arg;
    ls_timer_t *next;
};

// One client connection of the listener. Live it has a socket; in replay (fd -1) it is only the
// id the trace's records name.
struct ls_stream {
    ls_actor_t *actor;
    uint32_t id;
    int fd;
    ev_io rio, wio;
    // One timer, by phase: output waits (the stall limit), a failed write (reported on the
    // next turn, never from inside the actor's call), or closing (the linger).
    ev_timer tm;
    char *out;
    size_t out_n, out_off, out_cap;
    int paused, closing, failed, wr_shut;
    char why[128];
    void *data;
    ls_stream_t *prev, *next;
};

typedef struct {
    char name[48];
    uint64_t value;
    bool gauge;  // a level (ls_actor_gauge), not a count
} s_counter_t;

typedef struct {
    char name[48];
    char *value;  // malloc'd
} s_info_t;

typedef struct s_job {
    uint32_t id;
    ls_job_work_fn work;
    ls_job_done_fn done;
    void *arg;
    void *result;  // ls_actor_job_result: recorded with the completion, restored in replay
    size_t result_size;
    int finished;  // set by the thread under the lock
    struct s_job *next;
} s_job_t;

// One record of the run being replayed, with its own copy of the frames.
typedef struct {
    ls_trace_kind_t kind;
    ls_trace_dir_t dir;
    uint16_t sock;
    uint32_t aux;
    uint64_t t_ns;
    uint32_t nframes;
    ls_frame_ref_t *frames;
    uint64_t number;  // record number in the file, from 0, as loraserve-trace numbers them
} s_rec_t;

// Replay mode (--replay): the trace stands in for the sockets, the clock and the job thread.
typedef struct {
    char *path;
    s_rec_t *recs;  // the replayed run, from its meta record to the next run's
    size_t n;
    size_t pos;        // next record to consume
    uint64_t inbound;  // inbound messages dispatched so far
    uint64_t until;    // pause after this many (0: never)
    int torn;          // the file ends in a torn record: the recording was cut short
    int unrecorded;    // outputs sent after the recording ended (a cut recording)
} s_replay_t;

struct ls_actor {
    const ls_actor_def_t *def;
    char *name;
    char *bind;
    char *control_key;  // the control server's key name (ls_actor_opts_t.control_key)
    int rank;
    int process;
    struct ev_loop *loop;
    ls_sock_t *router;
    ls_sock_t *control;
    ls_curve_t *curve;  // tcp endpoints: CURVE keys and the authenticator
    ls_sock_t *socks[LS_MAX_PEERS + 2];  // every socket, by trace index
    int nsocks;
    char *peer_names[LS_MAX_PEERS];
    char *peer_endpoints[LS_MAX_PEERS];
    int npeers;
    ls_trace_writer_t *trace;
    ev_check check;   // drains sockets flagged `more` once per loop turn
    ev_idle idle;     // keeps the loop from blocking while any socket is flagged
    ev_signal sigint, sigterm;
    ls_timer_t *timers;
    uint32_t next_timer_id;
    ls_timer_t *heartbeat;
    uint64_t heartbeat_seq;
    uint64_t start_ns;
    uint64_t now_ns;
    int stopping;
    int ready_sent;
    // Jobs: one thread runs them in order; the loop completes them in the same order.
    pthread_t job_thread;
    int job_thread_started;
    int jobs_stopped; // actor_jobs_stop ran (before on_destroy, then again at destroy)
    pthread_mutex_t job_lock;
    pthread_cond_t job_cond;
    s_job_t *jobs, *jobs_tail;  // submitted, not yet completed on the loop
    uint32_t next_job_id;
    int job_quit;
    ev_async job_async;
    s_counter_t counters[LS_MAX_COUNTERS];
    int ncounters;
    s_counter_t measured[LS_MAX_COUNTERS];  // read from the clock: reported apart, not replayed
    int nmeasured;
    s_info_t info[LS_MAX_INFO];  // text facts (ls_actor_info)
    int ninfo;
    int pid;             // reported in Ready: getpid(), or the recorded one in replay
    s_replay_t *replay;  // NULL unless replaying
    // Raw streams: one listener (listen_fd -1 in replay) and its connections, open or closing.
    int listening, listen_fd;
    ev_io accept_io;
    ev_timer accept_pause;  // out of file descriptors: accepting waits a moment
    ls_stream_def_t stream_def;
    void *stream_arg;
    ls_stream_t *streams;
    uint32_t next_stream_id;
};

// across the rooms
void actor_trace_event(ls_actor_t *self, ls_trace_kind_t kind, uint32_t aux, const ls_frame_ref_t *frames, uint32_t nframes);
void actor_handle(ls_sock_t *sock, zmsg_t **zm_p, uint64_t now_ns);
void actor_job_async_cb(struct ev_loop *loop, ev_async *w, int revents);
void actor_jobs_stop(ls_actor_t *self);
int actor_replay_begin(ls_actor_t *self);
void actor_replay_destroy(s_replay_t **self_p);
void actor_replay_diverge(ls_actor_t *self, const char *why, const char *replayed);
int actor_replay_listen(ls_actor_t *self);
s_replay_t *actor_replay_load(const char *path, int run, uint64_t until);
int actor_replay_out(ls_actor_t *self, ls_sock_t *sock, zmsg_t *zm, size_t *bytes);
void actor_replay_run(ls_actor_t *self);
void actor_replay_socket(ls_actor_t *self, ls_sock_t *sock);
void actor_replay_stream_out(ls_actor_t *self, ls_trace_kind_t kind, uint32_t id, const void *data, size_t len);
void actor_stream_free(ls_stream_t *s);
ls_stream_t *actor_stream_find(ls_actor_t *self, uint32_t id);
ls_stream_t *actor_stream_new(ls_actor_t *self, uint32_t id, int fd);

#endif
