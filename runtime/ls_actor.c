// ls_actor — see ls_actor.h. Messages handled here for every actor (a dispatch table may
// override them): Heartbeat (answered on the ROUTER: ping → pong), Shutdown, GetMetrics.
// Emitted: Ready and periodic Heartbeat to the control endpoint, Error for bad input, Metrics.
#define _GNU_SOURCE  // accept4
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

static void s_replay_socket(ls_actor_t *self, ls_sock_t *sock);
static int s_replay_out(ls_actor_t *self, ls_sock_t *sock, zmsg_t *zm, size_t *bytes);
static void s_replay_stream_out(ls_actor_t *self, ls_trace_kind_t kind, uint32_t id, const void *data, size_t len);
static int s_replay_listen(ls_actor_t *self);
static void s_replay_diverge(ls_actor_t *self, const char *why, const char *replayed);

uint64_t ls_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// counters

static s_counter_t *s_counter_slot(ls_actor_t *self, const char *name) {
    for (int i = 0; i < self->ncounters; i++)
        if (!strcmp(self->counters[i].name, name))
            return &self->counters[i];
    if (self->ncounters == LS_MAX_COUNTERS) {
        ls_error(0, "counter table full, dropping counter %s", name);
        return NULL;
    }
    s_counter_t *c = &self->counters[self->ncounters++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->value = 0;
    c->gauge = false;
    return c;
}

uint64_t *ls_actor_counter(ls_actor_t *self, const char *name) {
    s_counter_t *c = s_counter_slot(self, name);
    return c ? &c->value : NULL;
}

uint64_t *ls_actor_gauge(ls_actor_t *self, const char *name) {
    s_counter_t *c = s_counter_slot(self, name);
    if (!c)
        return NULL;
    c->gauge = true;
    return &c->value;
}

void ls_actor_count(ls_actor_t *self, const char *name, uint64_t n) {
    uint64_t *c = ls_actor_counter(self, name);
    if (c)
        *c += n;
}

void ls_actor_measure(ls_actor_t *self, const char *name, uint64_t n) {
    for (int i = 0; i < self->nmeasured; i++)
        if (!strcmp(self->measured[i].name, name)) {
            self->measured[i].value += n;
            return;
        }
    if (self->nmeasured == LS_MAX_COUNTERS)
        return;
    s_counter_t *c = &self->measured[self->nmeasured++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->value = n;
}

uint64_t ls_actor_counter_get(ls_actor_t *self, const char *name) {
    uint64_t *c = ls_actor_counter(self, name);
    return c ? *c : 0;
}

// ---------------------------------------------------------------------------------------------
// trace

static void s_trace_zmsg(ls_actor_t *self, ls_trace_dir_t dir, ls_sock_t *sock, zmsg_t *zm) {
    if (!self->trace)
        return;
    ls_frame_ref_t frames[LS_TRACE_MAX_FRAMES];
    uint32_t n = 0;
    for (zframe_t *f = zmsg_first(zm); f && n < LS_TRACE_MAX_FRAMES; f = zmsg_next(zm))
        frames[n++] = (ls_frame_ref_t){zframe_data(f), zframe_size(f)};
    if (ls_trace_write(self->trace, LS_TRACE_MSG, dir, sock->index, 0, self->now_ns, frames, n) < 0)
        ls_actor_count(self, "trace_write_errors", 1);
}

static void s_trace_event(ls_actor_t *self, ls_trace_kind_t kind, uint32_t aux, const ls_frame_ref_t *frames,
                          uint32_t nframes) {
    if (self->trace && ls_trace_write(self->trace, kind, LS_TRACE_IN, 0, aux, self->now_ns, frames, nframes) < 0)
        ls_actor_count(self, "trace_write_errors", 1);
}

static void s_trace_socket(ls_actor_t *self, ls_sock_t *sock, const char *endpoint) {
    if (!self->trace)
        return;
    const char *name = sock->is_router ? "router" : sock->peer;
    const char *type = sock->is_router ? "ROUTER" : "DEALER";
    ls_frame_ref_t frames[3] = {{name, strlen(name)}, {type, strlen(type)}, {endpoint, strlen(endpoint)}};
    ls_trace_write(self->trace, LS_TRACE_SOCKET, LS_TRACE_IN, sock->index, sock->index, ls_mono_ns(),
                   frames, 3);
}

// ---------------------------------------------------------------------------------------------
// sockets

static void s_sock_drain(ls_sock_t *sock);

static void s_mark_more(ls_sock_t *sock) {
    sock->more = 1;
    ev_idle_start(sock->actor->loop, &sock->actor->idle);
}

static void s_io_cb(struct ev_loop *loop, ev_io *w, int revents) { s_sock_drain(w->data); }

static void s_check_cb(struct ev_loop *loop, ev_check *w, int revents) {
    ls_actor_t *self = w->data;
    int any = 0;
    for (int i = 0; i < self->nsocks && !self->stopping; i++)
        if (self->socks[i]->more) {
            self->socks[i]->more = 0;
            s_sock_drain(self->socks[i]);
            any |= self->socks[i]->more;
        }
    if (!any)
        ev_idle_stop(loop, &self->idle);
}

static void s_idle_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    // Nothing to do: an active idle watcher only makes the loop poll without blocking, so the
    // check watcher runs again next turn.
}

static zsock_t *s_zsock_open(ls_actor_t *self, int is_router, const char *peer, const char *endpoint);

static ls_sock_t *s_sock_new(ls_actor_t *self, int is_router, const char *peer, const char *endpoint) {
    if (self->nsocks >= LS_MAX_PEERS + 2) {
        ls_error(0, "too many sockets");
        return NULL;
    }
    if (self->replay) {
        // No ZeroMQ socket: the trace plays its part. The same code opens the same sockets in
        // the same order, which the recorded socket records confirm.
        ls_sock_t *sock = calloc(1, sizeof *sock);
        sock->actor = self;
        sock->is_router = is_router;
        sock->peer = peer ? strdup(peer) : NULL;
        sock->index = (uint16_t)self->nsocks;
        self->socks[self->nsocks++] = sock;
        s_replay_socket(self, sock);
        return sock;
    }
    zsock_t *zs = s_zsock_open(self, is_router, peer, endpoint);
    if (!zs)
        return NULL;
    ls_sock_t *sock = calloc(1, sizeof *sock);
    sock->actor = self;
    sock->zs = zs;
    sock->is_router = is_router;
    sock->peer = peer ? strdup(peer) : NULL;
    sock->index = (uint16_t)self->nsocks;
    self->socks[self->nsocks++] = sock;
    ev_io_init(&sock->io, s_io_cb, zsock_fd(zs), EV_READ);
    sock->io.data = sock;
    ev_io_start(self->loop, &sock->io);
    s_trace_socket(self, sock, endpoint);
    // Messages may already be queued before the first edge; look once.
    s_mark_more(sock);
    return sock;
}

// tcp: CURVE, the server's side on a ROUTER, the client's (of `peer`) on a DEALER. -1 when the
// keys are missing: an actor never talks tcp unauthenticated when it was given keys.
static int s_zsock_secure(ls_actor_t *self, zsock_t *zs, int is_router, const char *peer, const char *endpoint) {
    if (!ls_curve_wanted(endpoint))
        return 0;
    if (!self->curve) {
        ls_warn(0, "%s: tcp without --curve-dir: anyone who reaches the port can talk to this actor", endpoint);
        return 0;
    }
    if (is_router) {
        ls_curve_server(self->curve, zs);
        return 0;
    }
    char err[512];
    // The control socket's server is the launcher (its key is named so).
    const char *server = peer && strcmp(peer, "control") ? peer : "launcher";
    if (ls_curve_client(self->curve, zs, server, err, sizeof err) < 0) {
        ls_error(0, "cannot connect to %s: %s", endpoint, err);
        return -1;
    }
    return 0;
}

// A ZeroMQ socket with the runtime's options, bound (ROUTER) or connected (DEALER).
static zsock_t *s_zsock_open(ls_actor_t *self, int is_router, const char *peer, const char *endpoint) {
    zsock_t *zs = zsock_new(is_router ? ZMQ_ROUTER : ZMQ_DEALER);
    if (!zs)
        return NULL;
    if (s_zsock_secure(self, zs, is_router, peer, endpoint) < 0) {
        zsock_destroy(&zs);
        return NULL;
    }
    // Never block the loop on a send: a full queue or an absent peer is an error we report.
    zsock_set_sndtimeo(zs, 0);
    // Give in-flight replies a moment to leave when the actor closes.
    zsock_set_linger(zs, 2000);
    zsock_set_rcvhwm(zs, 100000);
    zsock_set_sndhwm(zs, 100000);
    // One frame may carry adapter weights; anything larger is refused by ZeroMQ itself.
    zsock_set_maxmsgsize(zs, (int64_t)1 << 30);
    int rc;
    if (is_router) {
        // Answering a client that left must fail loudly, not vanish silently.
        zsock_set_router_mandatory(zs, 1);
        // A restarted peer with the same identity takes over its route.
        zsock_set_router_handover(zs, 1);
        rc = zsock_bind(zs, "%s", endpoint);
    } else {
        zsock_set_identity(zs, self->name);
        rc = zsock_connect(zs, "%s", endpoint);
    }
    if (rc < 0) {
        ls_error(0, "cannot %s %s: %s", is_router ? "bind" : "connect to", endpoint, zmq_strerror(zmq_errno()));
        zsock_destroy(&zs);
        return NULL;
    }
    return zs;
}

static void s_sock_destroy(ls_actor_t *self, ls_sock_t **sock_p) {
    ls_sock_t *sock = *sock_p;
    if (!sock)
        return;
    if (sock->zs)
        ev_io_stop(self->loop, &sock->io);
    zsock_destroy(&sock->zs);
    free(sock->peer);
    free(sock);
    *sock_p = NULL;
}

ls_sock_t *ls_actor_peer(ls_actor_t *self, const char *peer) {
    for (int i = 0; i < self->nsocks; i++)
        if (self->socks[i]->peer && !strcmp(self->socks[i]->peer, peer))
            return self->socks[i];
    for (int i = 0; i < self->npeers; i++)
        if (!strcmp(self->peer_names[i], peer))
            return s_sock_new(self, 0, peer, self->peer_endpoints[i]);
    ls_error(0, "no endpoint for peer %s (launcher passes them with --peer name=endpoint)", peer);
    return NULL;
}

ls_sock_t *ls_actor_router(ls_actor_t *self) { return self->router; }

int ls_actor_has_peer(const ls_actor_t *self, const char *peer) {
    for (int i = 0; i < self->npeers; i++)
        if (!strcmp(self->peer_names[i], peer))
            return 1;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// sending

int ls_actor_send(ls_actor_t *self, ls_sock_t *sock, zframe_t *identity, const ls_msg_t *msg,
                  zmsg_t **bulk_p) {
    zmsg_t *bulk = bulk_p ? *bulk_p : NULL;
    if (bulk_p)
        *bulk_p = NULL;
    char *body = NULL;
    size_t len = 0;
    if (!sock || ls_msg_encode(msg, &body, &len) < 0) {
        ls_error(msg->rid, "cannot send %s: %s", ls_msg_type_name(msg->type) ? ls_msg_type_name(msg->type) : "?",
                 sock ? "encoding failed" : "no socket");
        ls_actor_count(self, "send_failures", 1);
        zmsg_destroy(&bulk);
        free(body);
        return -1;
    }
    zmsg_t *zm = zmsg_new();
    assert(!sock->is_router || identity);  // a ROUTER send needs the peer's identity
    if (sock->is_router)
        zmsg_append(zm, &(zframe_t *){zframe_dup(identity)});
    zmsg_addmem(zm, body, len);
    free(body);
    for (zframe_t *f = bulk ? zmsg_pop(bulk) : NULL; f; f = zmsg_pop(bulk))
        zmsg_append(zm, &f);
    zmsg_destroy(&bulk);
    size_t bytes = zmsg_content_size(zm);
    int rc;
    if (self->replay) {
        rc = s_replay_out(self, sock, zm, &bytes);
        zmsg_destroy(&zm);
    } else {
        s_trace_zmsg(self, LS_TRACE_OUT, sock, zm);
        rc = zmsg_send(&zm, sock->zs);
        int why = zmq_errno();
        zmsg_destroy(&zm);
        // Replay must fail the same send: the actor may act on it (answer with an error).
        if (rc < 0)
            s_trace_event(self, LS_TRACE_SEND_FAILED, (uint32_t)why, NULL, 0);
        // A send can swallow the ZMQ_FD edge for messages that arrived meanwhile: look again.
        s_mark_more(sock);
    }
    if (rc < 0) {
        ls_warn(msg->rid, "send of %s to %s failed: %s", ls_msg_type_name(msg->type),
                sock->is_router ? "a client" : sock->peer, zmq_strerror(zmq_errno()));
        ls_actor_count(self, "send_failures", 1);
        return -1;
    }
    ls_actor_count(self, "msgs_out", 1);
    ls_actor_count(self, "bytes_out", bytes);
    return 0;
}

int ls_actor_send_peer(ls_actor_t *self, const char *peer, const ls_msg_t *msg, zmsg_t **bulk_p) {
    return ls_actor_send(self, ls_actor_peer(self, peer), NULL, msg, bulk_p);
}

int ls_actor_send_control(ls_actor_t *self, const ls_msg_t *msg) {
    if (!self->control)
        return 0;
    return ls_actor_send(self, self->control, NULL, msg, NULL);
}

int ls_actor_reply(ls_actor_t *self, const ls_in_t *in, const ls_msg_t *msg) {
    return ls_actor_send(self, in->sock, in->identity, msg, NULL);
}

static int s_send_error(ls_actor_t *self, ls_sock_t *sock, zframe_t *identity, uint64_t rid,
                        uint32_t code, uint32_t ref_type, const char *fmt, va_list ap) {
    char text[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    ls_msg_t err;
    ls_msg_init(&err, LS_MSG_ERROR);
    err.rid = rid;
    err.u.error.code = code;
    err.u.error.ref_type = ref_type;
    err.u.error.message = ls_msg_strdup(text);
    int rc = ls_actor_send(self, sock, identity, &err, NULL);
    ls_msg_clear(&err);
    return rc;
}

static int s_send_errorf(ls_actor_t *self, ls_sock_t *sock, zframe_t *identity, uint64_t rid, uint32_t code,
                         uint32_t ref_type, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int s_send_errorf(ls_actor_t *self, ls_sock_t *sock, zframe_t *identity, uint64_t rid, uint32_t code,
                         uint32_t ref_type, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = s_send_error(self, sock, identity, rid, code, ref_type, fmt, ap);
    va_end(ap);
    return rc;
}

int ls_actor_reply_error(ls_actor_t *self, const ls_in_t *in, uint32_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = s_send_error(self, in->sock, in->identity, in->msg ? in->msg->rid : 0, code,
                         in->msg ? in->msg->type : 0, fmt, ap);
    va_end(ap);
    return rc;
}

ls_route_t *ls_route_new(const ls_in_t *in) {
    ls_route_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->sock = in->sock;
    self->identity = in->identity ? zframe_dup(in->identity) : NULL;
    return self;
}

void ls_route_destroy(ls_route_t **self_p) {
    if (!self_p || !*self_p)
        return;
    zframe_destroy(&(*self_p)->identity);
    free(*self_p);
    *self_p = NULL;
}

int ls_actor_send_route(ls_actor_t *self, const ls_route_t *route, const ls_msg_t *msg, zmsg_t **bulk_p) {
    return ls_actor_send(self, route->sock, route->identity, msg, bulk_p);
}

int ls_actor_route_error(ls_actor_t *self, const ls_route_t *route, uint64_t rid, uint32_t code,
                         uint32_t ref_type, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = s_send_error(self, route->sock, route->identity, rid, code, ref_type, fmt, ap);
    va_end(ap);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// built-in handlers

static void s_send_heartbeat(ls_actor_t *self, ls_sock_t *sock, zframe_t *identity, uint64_t rid) {
    ls_msg_t hb;
    ls_msg_init(&hb, LS_MSG_HEARTBEAT);
    hb.rid = rid;
    hb.u.heartbeat.actor = ls_msg_strdup(self->name);
    hb.u.heartbeat.seq = ++self->heartbeat_seq;
    hb.u.heartbeat.uptime_ms = (self->now_ns - self->start_ns) / 1000000;
    ls_actor_send(self, sock, identity, &hb, NULL);
    ls_msg_clear(&hb);
}

static int s_on_heartbeat(ls_actor_t *self, ls_in_t *in) {
    // A Heartbeat on the ROUTER is a ping: answer it. One on a DEALER is the answer to ours.
    if (in->sock->is_router)
        s_send_heartbeat(self, in->sock, in->identity, in->msg->rid);
    return 0;
}

static int s_on_get_metrics(ls_actor_t *self, ls_in_t *in) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_METRICS);
    m.rid = in->msg->rid;
    m.u.metrics.actor = ls_msg_strdup(self->name);
    m.u.metrics.names.v = calloc((size_t)self->ncounters + 1, sizeof(char *));
    m.u.metrics.values.v = calloc((size_t)self->ncounters + 1, sizeof(uint64_t));
    for (int i = 0; i < self->ncounters; i++) {
        m.u.metrics.names.v[i] = ls_msg_strdup(self->counters[i].name);
        m.u.metrics.values.v[i] = self->counters[i].value;
    }
    m.u.metrics.names.n = m.u.metrics.values.n = (size_t)self->ncounters;
    m.u.metrics.gauges.v = calloc((size_t)self->ncounters + 1, sizeof(char *));
    for (int i = 0; i < self->ncounters; i++)
        if (self->counters[i].gauge)
            m.u.metrics.gauges.v[m.u.metrics.gauges.n++] = ls_msg_strdup(self->counters[i].name);
    m.u.metrics.measured_names.v = calloc((size_t)self->nmeasured + 1, sizeof(char *));
    m.u.metrics.measured_values.v = calloc((size_t)self->nmeasured + 1, sizeof(uint64_t));
    for (int i = 0; i < self->nmeasured; i++) {
        m.u.metrics.measured_names.v[i] = ls_msg_strdup(self->measured[i].name);
        m.u.metrics.measured_values.v[i] = self->measured[i].value;
    }
    m.u.metrics.measured_names.n = m.u.metrics.measured_values.n = (size_t)self->nmeasured;
    int rc = ls_actor_reply(self, in, &m);
    ls_msg_clear(&m);
    return rc;
}

void ls_actor_shutdown(ls_actor_t *self, const char *reason) {
    if (self->stopping)
        return;
    ls_info(0, "shutting down: %s", reason);
    // on_shutdown answers in-flight work while the sockets still work; only then stop.
    if (self->def->on_shutdown)
        self->def->on_shutdown(self, self->def->state);
    self->stopping = 1;
    ev_break(self->loop, EVBREAK_ALL);
}

static int s_on_shutdown(ls_actor_t *self, ls_in_t *in) {
    // A supervised actor is stopped by its launcher only: a client (even one with the graph's
    // client key) that sends Shutdown is refused. An actor run alone stops for anyone who can
    // reach it, as its only way to be told.
    if (self->control && in->sock != self->control) {
        ls_actor_count(self, "msgs_refused", 1);
        ls_warn(0, "Shutdown from %s refused: only the launcher stops this actor", in->from);
        ls_actor_reply_error(self, in, LS_ERROR_CODE_BAD_REQUEST, "only the launcher stops %s", self->name);
        return -1;
    }
    char reason[300];
    snprintf(reason, sizeof reason, "Shutdown from %s%s%s", in->from,
             in->msg->u.shutdown.reason ? ": " : "", in->msg->u.shutdown.reason ? in->msg->u.shutdown.reason : "");
    ls_actor_shutdown(self, reason);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// supervision

// A peer went down: what is queued for it was meant for the dead process, and the restarted
// one must not take it (a step plan for a KV cache it does not have, a load it will be sent
// again). The DEALER is reopened empty, in place (the trace keeps its index); what is sent from
// now on waits for the restarted peer.
static void s_peer_reset(ls_actor_t *self, const char *peer) {
    for (int i = 0; i < self->nsocks; i++) {
        ls_sock_t *sock = self->socks[i];
        if (!sock->zs || !sock->peer || strcmp(sock->peer, peer) != 0 || sock == self->control)
            continue;
        for (int k = 0; k < self->npeers; k++)
            if (!strcmp(self->peer_names[k], peer)) {
                zsock_t *zs = s_zsock_open(self, 0, peer, self->peer_endpoints[k]);
                if (!zs)
                    return;  // logged; the old socket stays
                ev_io_stop(self->loop, &sock->io);
                zsock_set_linger(sock->zs, 0);
                zsock_destroy(&sock->zs);
                sock->zs = zs;
                ev_io_init(&sock->io, s_io_cb, zsock_fd(zs), EV_READ);
                ev_io_start(self->loop, &sock->io);
                s_mark_more(sock);
                ls_info(0, "%s went down: messages queued for it dropped", peer);
            }
        return;
    }
}

// PeerStatus makes actors fail requests and reset state, so only the launcher may send it:
// from anyone else (a client on the ROUTER, a peer) it is dropped, counted and logged. One
// that says a peer is down empties the queue to that peer first.
static int s_peer_status_ok(ls_actor_t *self, const ls_in_t *in) {
    if (in->sock != self->control) {
        ls_actor_count(self, "msgs_refused", 1);
        ls_warn(0, "PeerStatus from %s dropped: only the launcher's control socket may send it", in->from);
        return 0;
    }
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    if (!ps->up && ps->actor)
        s_peer_reset(self, ps->actor);
    return 1;
}

int ls_actor_supervised(const ls_actor_t *self) { return self->control != NULL; }

// ---------------------------------------------------------------------------------------------
// inbound path

static void s_format_identity(zframe_t *id, char *out, size_t cap) {
    const unsigned char *d = zframe_data(id);
    size_t n = zframe_size(id);
    int printable = n > 0;
    for (size_t i = 0; i < n; i++)
        printable &= d[i] >= 0x21 && d[i] < 0x7f;
    if (printable) {
        snprintf(out, cap, "%.*s", (int)n, d);
        return;
    }
    size_t o = (size_t)snprintf(out, cap, "0x");
    for (size_t i = 0; i < n && o + 3 < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%02x", d[i]);
}

static ls_handler_fn s_lookup(const ls_dispatch_t *table, uint16_t type) {
    for (; table && table->fn; table++)
        if (table->type == type)
            return table->fn;
    return NULL;
}

static uint32_t s_error_code(ls_msgerr_code_t code) {
    switch (code) {
    case LS_MSGERR_UNKNOWN_TYPE: return LS_ERROR_CODE_UNKNOWN_TYPE;
    case LS_MSGERR_TOO_LARGE: return LS_ERROR_CODE_TOO_LARGE;
    default: return LS_ERROR_CODE_MALFORMED;
    }
}

// One inbound message at time `now_ns` (the clock, or the recorded time in replay). Takes the
// frames (*zm_p = NULL): those after the body become in.bulk, which a handler may take
// (in->bulk = NULL, ls_in_t's rule); what is left of them is destroyed here, once.
static void s_handle(ls_sock_t *sock, zmsg_t **zm_p, uint64_t now_ns) {
    zmsg_t *zm = *zm_p;
    *zm_p = NULL;
    ls_actor_t *self = sock->actor;
    self->now_ns = now_ns;
    s_trace_zmsg(self, LS_TRACE_IN, sock, zm);
    ls_actor_count(self, "msgs_in", 1);
    ls_actor_count(self, "bytes_in", zmsg_content_size(zm));

    ls_in_t in = {.sock = sock, .now_ns = self->now_ns};
    char from[80];
    if (sock->is_router) {
        in.identity = zmsg_pop(zm);
        s_format_identity(in.identity, from, sizeof from);
    } else
        snprintf(from, sizeof from, "%s", sock->peer);
    in.from = from;
    zframe_t *body = zmsg_pop(zm);
    if (zmsg_size(zm))
        in.bulk = zm;  // owned by in.bulk from here
    else
        zmsg_destroy(&zm);

    ls_msg_t msg;
    ls_msgerr_t err = {0};
    if (!body || ls_msg_decode(zframe_data(body), zframe_size(body), &msg, &err) < 0) {
        const char *why = body ? err.text : "message has no body frame";
        ls_actor_count(self, err.code == LS_MSGERR_UNKNOWN_TYPE ? "msgs_unknown" : "msgs_malformed", 1);
        ls_warn(0, "dropped bad message from %s: %s", from, why);
        // Answer so a client learns why; the error is well-formed, so no error ping-pong.
        s_send_errorf(self, sock, in.identity, 0, body ? s_error_code(err.code) : LS_ERROR_CODE_MALFORMED, 0,
                      "%s", why);
        goto done;
    }
    in.msg = &msg;
    if (msg.type == LS_MSG_PEER_STATUS && !s_peer_status_ok(self, &in))
        goto cleared;
    ls_handler_fn fn = s_lookup(self->def->dispatch, msg.type);
    if (fn) {
        // Where each actor's time goes (the serving benchmark prints it): a measurement,
        // reported apart from the counters replay compares.
        uint64_t t0 = ls_mono_ns();
        if (fn(self, &in, self->def->state) < 0)
            ls_actor_count(self, "handler_errors", 1);
        ls_actor_measure(self, "busy_us_total", (ls_mono_ns() - t0) / 1000);
    } else if (msg.type == LS_MSG_HEARTBEAT)
        s_on_heartbeat(self, &in);
    else if (msg.type == LS_MSG_SHUTDOWN)
        s_on_shutdown(self, &in);
    else if (msg.type == LS_MSG_GET_METRICS)
        s_on_get_metrics(self, &in);
    else if (msg.type == LS_MSG_PEER_STATUS)
        ;  // news of the graph this actor has no use for
    else {
        ls_actor_count(self, "msgs_unhandled", 1);
        ls_warn(msg.rid, "%s does not handle %s (from %s)", self->name, ls_msg_type_name(msg.type), from);
        // Never answer an Error with an Error: two actors would bounce them forever.
        if (msg.type != LS_MSG_ERROR)
            ls_actor_reply_error(self, &in, LS_ERROR_CODE_UNKNOWN_TYPE, "%s does not handle %s", self->name,
                                 ls_msg_type_name(msg.type));
    }
cleared:
    ls_msg_clear(&msg);
done:
    zmsg_destroy(&in.bulk);
    zframe_destroy(&body);
    zframe_destroy(&in.identity);
}

static void s_sock_drain(ls_sock_t *sock) {
    ls_actor_t *self = sock->actor;
    for (int n = 0; n < LS_DRAIN_CAP; n++) {
        if (self->stopping || !(zsock_events(sock->zs) & ZMQ_POLLIN))
            return;
        zmsg_t *zm = zmsg_recv(sock->zs);
        if (!zm)
            return;
        s_handle(sock, &zm, ls_mono_ns());
    }
    // Cap reached: let the other sockets and timers have this turn; continue on the next.
    s_mark_more(sock);
}

// ---------------------------------------------------------------------------------------------
// timers

static void s_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    ls_timer_t *t = w->data;
    ls_actor_t *self = t->actor;
    if (self->stopping)
        return;
    self->now_ns = ls_mono_ns();
    s_trace_event(self, LS_TRACE_TIMER, t->id, NULL, 0);
    t->fn(self, t, t->arg);
}

ls_timer_t *ls_actor_timer_start(ls_actor_t *self, double after_ms, double repeat_ms, ls_timer_fn fn,
                                 void *arg) {
    ls_timer_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->actor = self;
    t->id = ++self->next_timer_id;
    t->fn = fn;
    t->arg = arg;
    ev_timer_init(&t->ev, s_timer_cb, after_ms / 1000.0, repeat_ms / 1000.0);
    t->ev.data = t;
    // In replay a timer fires where the trace says it fired, never by the clock.
    if (!self->replay)
        ev_timer_start(self->loop, &t->ev);
    t->next = self->timers;
    self->timers = t;
    return t;
}

void ls_actor_timer_again(ls_actor_t *self, ls_timer_t *timer, double after_ms) {
    ev_timer_stop(self->loop, &timer->ev);
    ev_timer_set(&timer->ev, after_ms / 1000.0, timer->ev.repeat);
    if (!self->replay)
        ev_timer_start(self->loop, &timer->ev);
}

void ls_actor_timer_stop(ls_actor_t *self, ls_timer_t *timer) {
    for (ls_timer_t **p = &self->timers; *p; p = &(*p)->next)
        if (*p == timer) {
            *p = timer->next;
            ev_timer_stop(self->loop, &timer->ev);
            free(timer);
            return;
        }
}

static void s_heartbeat_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    if (self->control)
        s_send_heartbeat(self, self->control, NULL, 0);
}

// ---------------------------------------------------------------------------------------------
// raw streams (ls_actor_stream_listen)

#define S_STREAM_READ_CHUNK 65536
#define S_STREAM_LINGER_S 2.0  // how long a closed stream drains the client's input

static void s_trace_stream(ls_actor_t *self, ls_trace_kind_t kind, ls_trace_dir_t dir, uint32_t id,
                           const void *data, size_t len, int has_frame) {
    ls_frame_ref_t f = {data, len};
    if (self->trace && ls_trace_write(self->trace, kind, dir, 0, id, self->now_ns, &f, has_frame ? 1 : 0) < 0)
        ls_actor_count(self, "trace_write_errors", 1);
}

static ls_stream_t *s_stream_new(ls_actor_t *self, uint32_t id, int fd) {
    ls_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->actor = self;
    s->id = id;
    s->fd = fd;
    s->next = self->streams;
    if (self->streams)
        self->streams->prev = s;
    self->streams = s;
    return s;
}

// Stop the stream's watchers and close its socket; the struct stays.
static void s_stream_shut(ls_stream_t *s) {
    ls_actor_t *self = s->actor;
    if (s->fd >= 0) {
        ev_io_stop(self->loop, &s->rio);
        ev_io_stop(self->loop, &s->wio);
        ev_timer_stop(self->loop, &s->tm);
        close(s->fd);
        s->fd = -1;
    }
}

static void s_stream_free(ls_stream_t *s) {
    ls_actor_t *self = s->actor;
    s_stream_shut(s);
    free(s->out);
    if (s->prev)
        s->prev->next = s->next;
    else
        self->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

static ls_stream_t *s_stream_find(ls_actor_t *self, uint32_t id) {
    for (ls_stream_t *s = self->streams; s; s = s->next)
        if (s->id == id && !s->closing)
            return s;
    return NULL;
}

// The client is gone: a recorded event, the actor told, the stream freed.
static void s_stream_lost(ls_stream_t *s, const char *why) {
    ls_actor_t *self = s->actor;
    self->now_ns = ls_mono_ns();
    s_trace_stream(self, LS_TRACE_STREAM_CLOSE, LS_TRACE_IN, s->id, why, strlen(why), 1);
    if (self->stopping) {
        // The actor is not told while it stops, so it may still hold the stream (its
        // on_destroy walks its connections): keep the struct, writes dropped, for
        // ls_actor_destroy to free.
        s->failed = 1;
        s_stream_shut(s);
        return;
    }
    self->stream_def.on_close(self, s, why, self->stream_arg);
    s_stream_free(s);
}

// A write failed or overflowed: stop the socket's watchers and report it on the next turn.
static void s_stream_fail(ls_stream_t *s, const char *why) {
    ls_actor_t *self = s->actor;
    s->failed = 1;
    snprintf(s->why, sizeof s->why, "%s", why);
    ev_io_stop(self->loop, &s->rio);
    ev_io_stop(self->loop, &s->wio);
    ev_timer_stop(self->loop, &s->tm);
    ev_timer_set(&s->tm, 0, 0);
    ev_timer_start(self->loop, &s->tm);
}

// Send what the kernel takes now; the rest waits for the socket to be writable, under the stall
// limit, which restarts at every progress.
static void s_stream_flush(ls_stream_t *s) {
    ls_actor_t *self = s->actor;
    int progress = 0;
    while (s->out_off < s->out_n) {
        ssize_t n = send(s->fd, s->out + s->out_off, s->out_n - s->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            s->out_off += (size_t)n;
            progress = 1;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            ev_io_start(self->loop, &s->wio);
            if (progress || !ev_is_active(&s->tm)) {
                ev_timer_stop(self->loop, &s->tm);
                ev_timer_set(&s->tm, self->stream_def.stall_ms / 1000.0, 0);
                ev_timer_start(self->loop, &s->tm);
            }
            return;
        }
        char why[128];
        snprintf(why, sizeof why, "writing to the client failed: %s", n < 0 ? strerror(errno) : "no progress");
        s_stream_fail(s, why);
        return;
    }
    ev_io_stop(self->loop, &s->wio);
    ev_timer_stop(self->loop, &s->tm);
    s->out_n = s->out_off = 0;
    if (s->closing && !s->wr_shut) {
        shutdown(s->fd, SHUT_WR);
        s->wr_shut = 1;
        ev_timer_set(&s->tm, S_STREAM_LINGER_S, 0);
        ev_timer_start(self->loop, &s->tm);
    }
}

static void s_stream_read_cb(struct ev_loop *loop, ev_io *w, int revents) {
    ls_stream_t *s = w->data;
    ls_actor_t *self = s->actor;
    char buf[S_STREAM_READ_CHUNK];
    for (;;) {
        ssize_t n = recv(s->fd, buf, sizeof buf, 0);
        if (n > 0) {
            if (s->closing)
                continue;  // draining before close: the actor is done with this stream
            self->now_ns = ls_mono_ns();
            s_trace_stream(self, LS_TRACE_STREAM_DATA, LS_TRACE_IN, s->id, buf, (size_t)n, 1);
            self->stream_def.on_data(self, s, buf, (size_t)n, self->stream_arg);
            // The actor may have closed, paused or failed it; a closed one is freed only later.
            if (s->closing || s->paused || s->failed || self->stopping)
                return;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (s->closing)
            s_stream_free(s);  // the client closed its side too: the linger is over
        else
            s_stream_lost(s, n == 0 ? "the client closed the connection" : strerror(errno));
        return;
    }
}

static void s_stream_write_cb(struct ev_loop *loop, ev_io *w, int revents) { s_stream_flush(w->data); }

static void s_stream_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    ls_stream_t *s = w->data;
    if (s->closing)
        s_stream_free(s);  // lingered enough, or the last answer is not read
    else
        s_stream_lost(s, s->failed ? s->why : "the client stopped reading its answer");
}

static void s_accept_cb(struct ev_loop *loop, ev_io *w, int revents) {
    ls_actor_t *self = w->data;
    while (!self->stopping) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(self->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                ls_warn(0, "cannot accept connections: %s; pausing 100 ms", strerror(errno));
                ev_io_stop(loop, &self->accept_io);
                ev_timer_set(&self->accept_pause, 0.1, 0);
                ev_timer_start(loop, &self->accept_pause);
            }
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // streamed pieces leave at once
        ls_stream_t *s = s_stream_new(self, self->next_stream_id + 1, fd);
        if (!s) {
            close(fd);
            continue;
        }
        self->next_stream_id++;
        ev_io_init(&s->rio, s_stream_read_cb, fd, EV_READ);
        ev_io_init(&s->wio, s_stream_write_cb, fd, EV_WRITE);
        ev_timer_init(&s->tm, s_stream_timer_cb, 0, 0);
        s->rio.data = s->wio.data = s->tm.data = s;
        ev_io_start(loop, &s->rio);
        char addr[INET6_ADDRSTRLEN + 8] = "?";
        char host[INET6_ADDRSTRLEN] = "?";
        int cport = 0;
        if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
            cport = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else if (ss.ss_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
            cport = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
        snprintf(addr, sizeof addr, "%s:%d", host, cport);
        self->now_ns = ls_mono_ns();
        s_trace_stream(self, LS_TRACE_STREAM_OPEN, LS_TRACE_IN, s->id, addr, strlen(addr), 1);
        self->stream_def.on_open(self, s, self->stream_arg);
    }
}

static void s_accept_pause_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    ls_actor_t *self = w->data;
    ev_io_start(loop, &self->accept_io);
}

int ls_actor_stream_listen(ls_actor_t *self, const char *host, int port, const ls_stream_def_t *def, void *arg) {
    if (self->listening) {
        ls_error(0, "an actor listens on one address only");
        return -1;
    }
    self->stream_def = *def;
    self->stream_arg = arg;
    self->listen_fd = -1;
    char asked[300];
    snprintf(asked, sizeof asked, "%s:%d", host, port);
    if (self->replay) {
        self->listening = 1;
        return s_replay_listen(self);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) {
        ls_error(0, "cannot listen on %s: %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        ls_error(0, "cannot listen on %s: %s", asked, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    int bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    self->listening = 1;
    self->listen_fd = fd;
    ev_io_init(&self->accept_io, s_accept_cb, fd, EV_READ);
    ev_timer_init(&self->accept_pause, s_accept_pause_cb, 0, 0);
    self->accept_io.data = self->accept_pause.data = self;
    ev_io_start(self->loop, &self->accept_io);
    // The port is the kernel's choice with port 0; a replay reports the same one.
    s_trace_stream(self, LS_TRACE_STREAM_LISTEN, LS_TRACE_IN, (uint32_t)bound, asked, strlen(asked), 1);
    return bound;
}

void ls_stream_write(ls_stream_t *s, const void *data, size_t len) {
    ls_actor_t *self = s->actor;
    assert(!s->closing);  // the actor let go of it
    if (self->replay) {
        s_replay_stream_out(self, LS_TRACE_STREAM_DATA, s->id, data, len);
        return;
    }
    s_trace_stream(self, LS_TRACE_STREAM_DATA, LS_TRACE_OUT, s->id, data, len, 1);
    if (s->failed || !len)
        return;
    if (s->out_n - s->out_off + len > self->stream_def.max_unsent) {
        char why[96];
        snprintf(why, sizeof why, "the client leaves more than %zu bytes unread", self->stream_def.max_unsent);
        s_stream_fail(s, why);
        return;
    }
    if (s->out_n + len > s->out_cap) {
        // Compact first: what was sent is never needed again (nothing to move while out is
        // still unallocated).
        if (s->out_off) {
            memmove(s->out, s->out + s->out_off, s->out_n - s->out_off);
            s->out_n -= s->out_off;
            s->out_off = 0;
        }
        size_t cap = s->out_cap ? s->out_cap : 4096;
        while (cap < s->out_n + len)
            cap *= 2;
        char *out = realloc(s->out, cap);
        if (!out) {
            s_stream_fail(s, "out of memory");
            return;
        }
        s->out = out;
        s->out_cap = cap;
    }
    memcpy(s->out + s->out_n, data, len);
    s->out_n += len;
    s_stream_flush(s);
}

void ls_stream_close(ls_stream_t *s) {
    ls_actor_t *self = s->actor;
    assert(!s->closing);
    if (self->replay) {
        s_replay_stream_out(self, LS_TRACE_STREAM_CLOSE, s->id, NULL, 0);
        s_stream_free(s);
        return;
    }
    s_trace_stream(self, LS_TRACE_STREAM_CLOSE, LS_TRACE_OUT, s->id, NULL, 0, 0);
    s->closing = 1;
    s->data = NULL;
    if (s->failed)
        return;  // its timer frees it
    s->paused = 0;
    ev_io_start(self->loop, &s->rio);
    s_stream_flush(s);
}

void ls_stream_pause(ls_stream_t *s, int paused) {
    s->paused = paused;
    if (s->fd < 0 || s->failed || s->closing)
        return;
    if (paused)
        ev_io_stop(s->actor->loop, &s->rio);
    else
        ev_io_start(s->actor->loop, &s->rio);
}

void ls_stream_set_data(ls_stream_t *s, void *data) { s->data = data; }
void *ls_stream_data(const ls_stream_t *s) { return s->data; }
uint32_t ls_stream_id(const ls_stream_t *s) { return s->id; }

// ---------------------------------------------------------------------------------------------
// jobs

static void *s_job_thread(void *arg) {
    ls_actor_t *self = arg;
    pthread_mutex_lock(&self->job_lock);
    for (;;) {
        s_job_t *job = self->jobs;
        while (job && job->finished)
            job = job->next;
        if (!job) {
            if (self->job_quit)
                break;
            pthread_cond_wait(&self->job_cond, &self->job_lock);
            continue;
        }
        pthread_mutex_unlock(&self->job_lock);
        job->work(job->arg);
        pthread_mutex_lock(&self->job_lock);
        job->finished = 1;
        ev_async_send(self->loop, &self->job_async);
    }
    pthread_mutex_unlock(&self->job_lock);
    return NULL;
}

static void s_job_async_cb(struct ev_loop *loop, ev_async *w, int revents) {
    ls_actor_t *self = w->data;
    for (;;) {
        pthread_mutex_lock(&self->job_lock);
        s_job_t *job = self->jobs;
        // Completions run strictly in submission order, so a replay sees the same order.
        if (!job || !job->finished) {
            pthread_mutex_unlock(&self->job_lock);
            return;
        }
        self->jobs = job->next;
        if (!self->jobs)
            self->jobs_tail = NULL;
        pthread_mutex_unlock(&self->job_lock);
        self->now_ns = ls_mono_ns();
        ls_frame_ref_t result = {job->result, job->result_size};
        s_trace_event(self, LS_TRACE_JOB, job->id, &result, job->result ? 1 : 0);
        if (!self->stopping)
            job->done(self, job->arg);
        free(job);
    }
}

int ls_actor_job(ls_actor_t *self, ls_job_work_fn work, ls_job_done_fn done, void *arg) {
    return ls_actor_job_result(self, work, done, arg, NULL, 0);
}

int ls_actor_job_result(ls_actor_t *self, ls_job_work_fn work, ls_job_done_fn done, void *arg, void *result,
                        size_t result_size) {
    s_job_t *job = calloc(1, sizeof *job);
    if (!job)
        return -1;
    // Replay runs a job where the trace completes it, on the loop: no thread.
    if (!self->job_thread_started && !self->replay) {
        if (pthread_create(&self->job_thread, NULL, s_job_thread, self) != 0) {
            free(job);
            return -1;
        }
        self->job_thread_started = 1;
    }
    job->id = ++self->next_job_id;
    job->work = work;
    job->done = done;
    job->arg = arg;
    job->result = result;
    job->result_size = result_size;
    pthread_mutex_lock(&self->job_lock);
    if (self->jobs_tail)
        self->jobs_tail->next = job;
    else
        self->jobs = job;
    self->jobs_tail = job;
    pthread_cond_signal(&self->job_cond);
    pthread_mutex_unlock(&self->job_lock);
    return 0;
}

// Waits for the job in progress, then drops what was never completed on the loop: the
// actor is going away, and a `done` must not run on a half-destroyed actor.
static void s_jobs_stop(ls_actor_t *self) {
    if (self->job_thread_started) {
        pthread_mutex_lock(&self->job_lock);
        self->job_quit = 1;
        // Unstarted jobs are skipped: mark them finished so the thread exits.
        for (s_job_t *j = self->jobs; j; j = j->next)
            j->finished = 1;
        pthread_cond_signal(&self->job_cond);
        pthread_mutex_unlock(&self->job_lock);
        pthread_join(self->job_thread, NULL);
    }
    while (self->jobs) {
        s_job_t *j = self->jobs;
        self->jobs = j->next;
        free(j);
    }
    ev_async_stop(self->loop, &self->job_async);
    pthread_mutex_destroy(&self->job_lock);
    pthread_cond_destroy(&self->job_cond);
}

// ---------------------------------------------------------------------------------------------
// replay (docs/debugging.md): the recorded run is read whole, then consumed in order. Inbound
// records are dispatched with their recorded time; every record the actor's own behaviour
// produces (sockets opened, messages sent, inputs taken) must be the next one in the trace.

__attribute__((noinline)) void ls_replay_break(void) {
    // gdb's breakpoint for loraserve-replay --gdb; the asm keeps the call from being folded away.
    __asm__ volatile("");
}

// A debugger is attached (TracerPid in /proc/self/status is not 0).
static int s_traced(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int pid = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "TracerPid: %d", &pid) == 1)
            break;
    if (f)
        fclose(f);
    return pid != 0;
}

static const char *s_sock_label(const ls_actor_t *self, uint16_t index) {
    if (index >= self->nsocks)
        return "?";
    return self->socks[index]->is_router ? "router" : self->socks[index]->peer;
}

// One message as `out #1 worker-0 [to id]  StepPlan v1 ...`, from its frames.
static void s_describe_msg(const ls_actor_t *self, int is_router, uint16_t sock, ls_trace_dir_t dir,
                           const ls_frame_ref_t *frames, uint32_t n, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "%s #%u %s", dir == LS_TRACE_IN ? "in" : "out", sock,
                                s_sock_label(self, sock));
    uint32_t body = is_router ? 1 : 0;
    if (is_router && n > 0 && o < cap)
        o += (size_t)snprintf(out + o, cap - o, " %s %.*s", dir == LS_TRACE_IN ? "from" : "to",
                              (int)frames[0].len, (const char *)frames[0].data);
    ls_msg_t m;
    ls_msgerr_t err;
    if (o >= cap)
        return;
    if (body < n && ls_msg_decode(frames[body].data, frames[body].len, &m, &err) == 0) {
        o += (size_t)snprintf(out + o, cap - o, "  ");
        if (o < cap)
            ls_msg_format(&m, out + o, cap - o);
        ls_msg_clear(&m);
    } else
        snprintf(out + o, cap - o, "  <undecodable: %s>", body < n ? err.text : "no body frame");
}

static void s_describe_rec(const ls_actor_t *self, const s_rec_t *rec, char *out, size_t cap) {
    static const char *kinds[] = {"?",   "meta",  "socket",      "msg",           "timer",       "signal",      "job",
                                  "input", "send-failed", "stream-listen", "stream-open", "stream-data", "stream-close"};
    const char *kind = rec->kind <= LS_TRACE_STREAM_CLOSE ? kinds[rec->kind] : "?";
    if (rec->kind == LS_TRACE_STREAM_DATA || rec->kind == LS_TRACE_STREAM_CLOSE || rec->kind == LS_TRACE_STREAM_OPEN) {
        const char *dir = rec->kind == LS_TRACE_STREAM_OPEN ? "" : rec->dir == LS_TRACE_IN ? " in" : " out";
        size_t len = rec->nframes ? rec->frames[0].len : 0;
        snprintf(out, cap, "%s%s #%u (%zu bytes) \"%.*s\"", kind, dir, rec->aux, len, (int)(len < 4000 ? len : 4000),
                 rec->nframes ? (const char *)rec->frames[0].data : "");
    } else if (rec->kind == LS_TRACE_MSG) {
        int is_router = rec->sock < self->nsocks && self->socks[rec->sock]->is_router;
        s_describe_msg(self, is_router, rec->sock, rec->dir, rec->frames, rec->nframes, out, cap);
    } else if ((rec->kind == LS_TRACE_SOCKET || rec->kind == LS_TRACE_INPUT) && rec->nframes)
        snprintf(out, cap, "%s %.*s", kind, (int)rec->frames[0].len, (const char *)rec->frames[0].data);
    else
        snprintf(out, cap, "%s %u", kind, rec->aux);
}

// Where two messages' JSON differ, as paths with both values (`items[1].token_ids[0]: 7 / 8`),
// at most `room` of them: the one-line printer cuts long arrays, which may hide the difference.
static void s_json_diff(const cJSON *a, const cJSON *b, const char *path, char *out, size_t cap, int *room) {
    if (*room <= 0)
        return;
    if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
        for (const cJSON *x = a->child; x; x = x->next) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", x->string);
            s_json_diff(x, cJSON_GetObjectItemCaseSensitive(b, x->string), sub, out, cap, room);
        }
        return;
    }
    if (cJSON_IsArray(a) && cJSON_IsArray(b) && cJSON_GetArraySize(a) == cJSON_GetArraySize(b)) {
        int i = 0;
        for (const cJSON *x = a->child, *y = b->child; x && y; x = x->next, y = y->next, i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
            s_json_diff(x, y, sub, out, cap, room);
        }
        return;
    }
    if (a && b && cJSON_Compare(a, b, 1))
        return;
    char *x = a ? cJSON_PrintUnformatted(a) : NULL, *y = b ? cJSON_PrintUnformatted(b) : NULL;
    size_t o = strlen(out);
    snprintf(out + o, cap - o, "\n  differs:  %s: recorded %.200s, replayed %.200s", path, x ? x : "(absent)",
             y ? y : "(absent)");
    free(x);
    free(y);
    (*room)--;
}

// The first difference between the replayed actor and its recording: print both sides with
// their position, stop at ls_replay_break (a debugger sees the stack that diverged), exit 3.
static void s_replay_diverge(ls_actor_t *self, const char *why, const char *replayed) {
    s_replay_t *r = self->replay;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    char recorded[8192] = "(the recording ends here)";
    if (rec)
        s_describe_rec(self, rec, recorded, sizeof recorded);
    fprintf(stderr,
            "replay: %s DIVERGES from %s at record %llu, after inbound message %llu, t=+%.3f ms: %s\n"
            "  recorded: %s\n"
            "  replayed: %s\n",
            self->name, r->path, (unsigned long long)(rec ? rec->number : r->recs[r->n - 1].number + 1),
            (unsigned long long)r->inbound, (double)(self->now_ns - self->start_ns) / 1e6, why, recorded,
            replayed ? replayed : "(nothing)");
    fflush(stderr);
    ls_replay_break();
    exit(LS_REPLAY_DIVERGED);
}

static void s_replay_socket(ls_actor_t *self, ls_sock_t *sock) {
    s_replay_t *r = self->replay;
    const char *name = sock->is_router ? "router" : sock->peer;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    if (!rec || rec->kind != LS_TRACE_SOCKET || rec->aux != sock->index || rec->nframes < 1 ||
        rec->frames[0].len != strlen(name) || memcmp(rec->frames[0].data, name, rec->frames[0].len)) {
        char replayed[128];
        snprintf(replayed, sizeof replayed, "socket %s (#%u)", name, sock->index);
        s_replay_diverge(self, "the actor opened a socket the recording did not", replayed);
    }
    r->pos++;
}

static int s_frames_equal(const ls_frame_ref_t *a, const ls_frame_ref_t *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

// Bodies equal as bytes, or decoded except for `measured` fields (schema.msg).
static int s_bodies_equal(const ls_frame_ref_t *a, const ls_frame_ref_t *b) {
    if (s_frames_equal(a, b))
        return 1;
    ls_msg_t x, y;
    if (ls_msg_decode(a->data, a->len, &x, NULL) < 0)
        return 0;
    if (ls_msg_decode(b->data, b->len, &y, NULL) < 0) {
        ls_msg_clear(&x);
        return 0;
    }
    int same = ls_msg_equal_unmeasured(&x, &y);
    ls_msg_clear(&x);
    ls_msg_clear(&y);
    return same;
}

// A message the replayed actor sends: it must be the next recorded record. 0, or -1 when the
// recorded send failed (the actor sees the same failure). *bytes becomes the recorded size:
// a `measured` field's encoding may differ in length, and bytes_out (which GetMetrics
// reports) must count what the recording sent.
static int s_replay_out(ls_actor_t *self, ls_sock_t *sock, zmsg_t *zm, size_t *bytes) {
    s_replay_t *r = self->replay;
    ls_frame_ref_t frames[LS_TRACE_MAX_FRAMES];
    uint32_t n = 0;
    for (zframe_t *f = zmsg_first(zm); f && n < LS_TRACE_MAX_FRAMES; f = zmsg_next(zm))
        frames[n++] = (ls_frame_ref_t){zframe_data(f), zframe_size(f)};
    if (r->pos >= r->n && (r->torn || !self->stopping)) {
        // The recording was cut (the file torn, or the actor killed mid-event): what the actor
        // goes on to send was never recorded, so there is nothing to compare.
        r->unrecorded++;
        return 0;
    }
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    const char *why = NULL;
    if (!rec || rec->kind != LS_TRACE_MSG || rec->dir != LS_TRACE_OUT)
        why = "the actor sent a message where the recording has none";
    else if (rec->sock != sock->index)
        why = "the actor sent on another socket";
    else if (rec->nframes != n)
        why = "the messages have different numbers of frames";
    else {
        uint32_t body = sock->is_router ? 1 : 0;
        for (uint32_t i = 0; i < n && !why; i++)
            if (i == body ? !s_bodies_equal(&rec->frames[i], &frames[i]) : !s_frames_equal(&rec->frames[i], &frames[i]))
                why = i == body ? "the messages differ" : i < body ? "the messages go to different peers"
                                                                  : "the messages' bulk frames differ";
    }
    if (why) {
        char replayed[16384];
        s_describe_msg(self, sock->is_router, sock->index, LS_TRACE_OUT, frames, n, replayed, 8192);
        uint32_t body = sock->is_router ? 1 : 0;
        ls_msg_t x, y;
        if (rec && rec->kind == LS_TRACE_MSG && body < n && body < rec->nframes &&
            ls_msg_decode(rec->frames[body].data, rec->frames[body].len, &x, NULL) == 0) {
            if (ls_msg_decode(frames[body].data, frames[body].len, &y, NULL) == 0) {
                cJSON *jx = ls_msg_to_json(&x), *jy = ls_msg_to_json(&y);
                int room = 4;
                s_json_diff(jx, jy, "", replayed, sizeof replayed, &room);
                cJSON_Delete(jx);
                cJSON_Delete(jy);
                ls_msg_clear(&y);
            }
            ls_msg_clear(&x);
        }
        s_replay_diverge(self, why, replayed);
    }
    *bytes = 0;
    for (uint32_t i = 0; i < rec->nframes; i++)
        *bytes += rec->frames[i].len;
    r->pos++;
    if (r->pos < r->n && r->recs[r->pos].kind == LS_TRACE_SEND_FAILED) {
        errno = (int)r->recs[r->pos].aux;
        r->pos++;
        return -1;
    }
    return 0;
}

// A write or close of a stream: it must be the next recorded record.
static void s_replay_stream_out(ls_actor_t *self, ls_trace_kind_t kind, uint32_t id, const void *data, size_t len) {
    s_replay_t *r = self->replay;
    if (r->pos >= r->n && (r->torn || !self->stopping)) {
        r->unrecorded++;  // a cut recording, as for messages
        return;
    }
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    const char *why = NULL;
    if (!rec || (rec->kind != LS_TRACE_STREAM_DATA && rec->kind != LS_TRACE_STREAM_CLOSE) || rec->dir != LS_TRACE_OUT)
        why = kind == LS_TRACE_STREAM_DATA ? "the actor wrote to a stream where the recording did not"
                                           : "the actor closed a stream where the recording did not";
    else if (rec->aux != id)
        why = "the actor used another connection";
    else if (rec->kind != kind)
        why = kind == LS_TRACE_STREAM_DATA ? "the actor wrote where the recording closed" : "the actor closed where the recording wrote";
    else if (kind == LS_TRACE_STREAM_DATA && !s_frames_equal(&rec->frames[0], &(ls_frame_ref_t){data, len}))
        why = "the bytes written differ";
    if (why) {
        char replayed[8192];
        if (kind == LS_TRACE_STREAM_DATA)
            snprintf(replayed, sizeof replayed, "stream-data out #%u (%zu bytes) \"%.*s\"", id, len,
                     (int)(len < 4000 ? len : 4000), (const char *)data);
        else
            snprintf(replayed, sizeof replayed, "stream-close out #%u", id);
        s_replay_diverge(self, why, replayed);
    }
    r->pos++;
}

static int s_replay_listen(ls_actor_t *self) {
    s_replay_t *r = self->replay;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    if (!rec || rec->kind != LS_TRACE_STREAM_LISTEN)
        s_replay_diverge(self, "the actor listens where the recording did not", "stream-listen");
    r->pos++;
    return (int)rec->aux;
}

// A recorded stream event from outside: a connection opened, bytes read, the client gone.
static void s_replay_stream_in(ls_actor_t *self, const s_rec_t *rec) {
    char why[160];
    if (!self->listening) {
        snprintf(why, sizeof why, "connection %u has an event, but the actor listens nowhere", rec->aux);
        s_replay_diverge(self, why, NULL);
    }
    ls_stream_t *s = rec->kind == LS_TRACE_STREAM_OPEN ? NULL : s_stream_find(self, rec->aux);
    if (rec->kind != LS_TRACE_STREAM_OPEN && !s) {
        snprintf(why, sizeof why, "connection %u has an event, but the actor closed it", rec->aux);
        s_replay_diverge(self, why, NULL);
    }
    self->replay->pos++;
    self->now_ns = rec->t_ns;
    const ls_stream_def_t *def = &self->stream_def;
    if (rec->kind == LS_TRACE_STREAM_OPEN) {
        s = s_stream_new(self, rec->aux, -1);
        self->next_stream_id = rec->aux;
        def->on_open(self, s, self->stream_arg);
    } else if (rec->kind == LS_TRACE_STREAM_DATA) {
        def->on_data(self, s, rec->nframes ? rec->frames[0].data : "", rec->nframes ? rec->frames[0].len : 0,
                     self->stream_arg);
    } else {
        char text[256];
        snprintf(text, sizeof text, "%.*s", rec->nframes ? (int)rec->frames[0].len : 0,
                 rec->nframes ? (const char *)rec->frames[0].data : "");
        def->on_close(self, s, text, self->stream_arg);
        s_stream_free(s);
    }
}

int ls_actor_replaying(const ls_actor_t *self) { return self->replay != NULL; }

int ls_actor_input(ls_actor_t *self, const char *key, zmsg_t **frames_p) {
    if (self->trace) {
        ls_frame_ref_t frames[LS_TRACE_MAX_FRAMES];
        uint32_t n = 0;
        frames[n++] = (ls_frame_ref_t){key, strlen(key)};
        for (zframe_t *f = zmsg_first(*frames_p); f && n < LS_TRACE_MAX_FRAMES; f = zmsg_next(*frames_p))
            frames[n++] = (ls_frame_ref_t){zframe_data(f), zframe_size(f)};
        if (ls_trace_write(self->trace, LS_TRACE_INPUT, LS_TRACE_IN, 0, 0, self->now_ns, frames, n) < 0)
            ls_actor_count(self, "trace_write_errors", 1);
    }
    if (!self->replay)
        return 0;
    s_replay_t *r = self->replay;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    if (!rec || rec->kind != LS_TRACE_INPUT || rec->nframes < 1 || rec->frames[0].len != strlen(key) ||
        memcmp(rec->frames[0].data, key, rec->frames[0].len)) {
        char replayed[160];
        snprintf(replayed, sizeof replayed, "input %s", key);
        s_replay_diverge(self, "the actor took an input the recording does not have here", replayed);
    }
    zmsg_destroy(frames_p);
    *frames_p = zmsg_new();
    for (uint32_t i = 1; i < rec->nframes; i++)
        zmsg_addmem(*frames_p, rec->frames[i].data, rec->frames[i].len);
    r->pos++;
    return 0;
}

static void s_replay_destroy(s_replay_t **self_p) {
    s_replay_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->n; i++) {
        for (uint32_t k = 0; k < self->recs[i].nframes; k++)
            free((void *)self->recs[i].frames[k].data);
        free(self->recs[i].frames);
    }
    free(self->recs);
    free(self->path);
    free(self);
    *self_p = NULL;
}

// Read run `run` (1-based; 0: the last) of the trace file: its meta record and what follows
// up to the next meta record. NULL (logged) when the file or the run cannot be read.
static s_replay_t *s_replay_load(const char *path, int run, uint64_t until) {
    char err[512];
    ls_trace_reader_t *reader = ls_trace_reader_new(path, err, sizeof err);
    if (!reader) {
        ls_error(0, "replay: %s", err);
        return NULL;
    }
    s_replay_t *self = calloc(1, sizeof *self);
    self->path = strdup(path);
    self->until = until;
    static ls_trace_record_t rec;  // 64 KiB of frame refs: not on the stack
    size_t cap = 0;
    int runs = 0, rc;
    uint64_t number = 0;
    while ((rc = ls_trace_read(reader, &rec, err, sizeof err)) == 1) {
        if (rec.kind == LS_TRACE_META) {
            runs++;
            if (run == 0 || runs == run) {  // a later run replaces the one kept so far
                for (size_t i = 0; i < self->n; i++) {
                    for (uint32_t k = 0; k < self->recs[i].nframes; k++)
                        free((void *)self->recs[i].frames[k].data);
                    free(self->recs[i].frames);
                }
                self->n = 0;
            }
        }
        if (runs > 0 && (run == 0 || runs == run)) {
            if (self->n == cap) {
                cap = cap ? cap * 2 : 1024;
                self->recs = realloc(self->recs, cap * sizeof *self->recs);
            }
            s_rec_t *r = &self->recs[self->n++];
            *r = (s_rec_t){.kind = rec.kind, .dir = rec.dir, .sock = rec.sock, .aux = rec.aux, .t_ns = rec.t_ns,
                           .nframes = rec.nframes, .number = number};
            r->frames = calloc(rec.nframes + 1, sizeof *r->frames);
            for (uint32_t k = 0; k < rec.nframes; k++) {
                void *copy = malloc(rec.frames[k].len + 1);
                memcpy(copy, rec.frames[k].data, rec.frames[k].len);
                r->frames[k] = (ls_frame_ref_t){copy, rec.frames[k].len};
            }
        }
        number++;
    }
    ls_trace_reader_destroy(&reader);
    if (rc < 0) {
        ls_warn(0, "replay: %s; replaying up to there", err);
        self->torn = 1;
    }
    if (self->n == 0) {
        ls_error(0, "replay: %s has %d run(s), not run %d", path, runs, run);
        s_replay_destroy(&self);
    }
    return self;
}

// The recorded start: the meta record's time is the actor's start time, its pid the pid that
// Ready reports.
static int s_replay_begin(ls_actor_t *self) {
    s_replay_t *r = self->replay;
    const s_rec_t *meta = &r->recs[0];
    cJSON *json = meta->nframes ? cJSON_ParseWithLength(meta->frames[0].data, meta->frames[0].len) : NULL;
    const cJSON *name = cJSON_GetObjectItem(json, "actor"), *pid = cJSON_GetObjectItem(json, "pid"),
                *version = cJSON_GetObjectItem(json, "schema_version");
    int ok = cJSON_IsString(name) && cJSON_IsNumber(pid) && cJSON_IsNumber(version);
    if (!ok)
        ls_error(0, "replay: %s: the run's meta record is not the runtime's", r->path);
    else if (strcmp(name->valuestring, self->name) != 0) {
        ls_error(0, "replay: %s is the trace of %s, not of %s (give --name %s)", r->path, name->valuestring,
                 self->name, name->valuestring);
        ok = 0;
    } else if (version->valueint != LS_SCHEMA_VERSION)
        ls_warn(0, "replay: recorded with message schema %d, replaying with %d", version->valueint, LS_SCHEMA_VERSION);
    if (ok) {
        self->pid = pid->valueint;
        self->start_ns = self->now_ns = meta->t_ns;
        r->pos = 1;
    }
    cJSON_Delete(json);
    return ok ? 0 : -1;
}

static ls_timer_t *s_timer_find(ls_actor_t *self, uint32_t id) {
    for (ls_timer_t *t = self->timers; t; t = t->next)
        if (t->id == id)
            return t;
    return NULL;
}

// Drive the actor from the trace: the replay's counterpart of ev_run.
static void s_replay_run(ls_actor_t *self) {
    s_replay_t *r = self->replay;
    char why[160];
    while (r->pos < r->n && !self->stopping) {
        const s_rec_t *rec = &r->recs[r->pos];
        if (rec->kind == LS_TRACE_META)
            break;  // the next run
        if (rec->kind == LS_TRACE_MSG && rec->dir == LS_TRACE_IN) {
            if (r->until && r->inbound == r->until) {
                fprintf(stderr,
                        "replay: %s paused after %llu inbound messages, before record %llu (t=+%.3f ms); pid %d\n",
                        self->name, (unsigned long long)r->inbound, (unsigned long long)rec->number,
                        (double)(rec->t_ns - self->start_ns) / 1e6, (int)getpid());
                // Without a debugger, wait for one: gdb -p PID, then `continue` goes on.
                if (!s_traced()) {
                    fprintf(stderr, "replay: waiting for a debugger: gdb -p %d (SIGCONT resumes)\n", (int)getpid());
                    raise(SIGSTOP);
                }
                ls_replay_break();
            }
            if (rec->sock >= self->nsocks) {
                snprintf(why, sizeof why, "a message arrives on socket #%u, which the actor never opened", rec->sock);
                s_replay_diverge(self, why, NULL);
            }
            r->pos++;
            r->inbound++;
            zmsg_t *zm = zmsg_new();
            for (uint32_t i = 0; i < rec->nframes; i++)
                zmsg_addmem(zm, rec->frames[i].data, rec->frames[i].len);
            s_handle(self->socks[rec->sock], &zm, rec->t_ns);
        } else if (rec->kind == LS_TRACE_TIMER) {
            ls_timer_t *t = s_timer_find(self, rec->aux);
            if (!t) {
                snprintf(why, sizeof why, "timer %u fires in the recording, but the actor has no such timer",
                         rec->aux);
                s_replay_diverge(self, why, NULL);
            }
            r->pos++;
            self->now_ns = rec->t_ns;
            t->fn(self, t, t->arg);
        } else if (rec->kind == LS_TRACE_JOB) {
            s_job_t *job = self->jobs;
            if (!job || job->id != rec->aux) {
                snprintf(why, sizeof why, "job %u completes in the recording; the actor's next job is %s%u", rec->aux,
                         job ? "" : "none, ", job ? job->id : 0);
                s_replay_diverge(self, why, NULL);
            }
            if (job->result && (rec->nframes != 1 || rec->frames[0].len != job->result_size)) {
                snprintf(why, sizeof why, "job %u's recorded result is not %zu bytes (another build?)", job->id,
                         job->result_size);
                s_replay_diverge(self, why, NULL);
            }
            r->pos++;
            self->jobs = job->next;
            if (!self->jobs)
                self->jobs_tail = NULL;
            // A recorded result stands for what the work read; other work (an adapter's weights,
            // which are model files) runs again, here, where the recording completed it.
            if (job->result)
                memcpy(job->result, rec->frames[0].data, job->result_size);
            else
                job->work(job->arg);
            self->now_ns = rec->t_ns;
            if (!self->stopping)
                job->done(self, job->arg);
            free(job);
        } else if ((rec->kind == LS_TRACE_STREAM_OPEN || rec->kind == LS_TRACE_STREAM_DATA ||
                    rec->kind == LS_TRACE_STREAM_CLOSE) &&
                   rec->dir == LS_TRACE_IN) {
            s_replay_stream_in(self, rec);
        } else if (rec->kind == LS_TRACE_SIGNAL) {
            r->pos++;
            self->now_ns = rec->t_ns;
            ls_actor_shutdown(self, rec->aux == SIGINT ? "SIGINT" : "SIGTERM");
        } else
            s_replay_diverge(self, rec->kind == LS_TRACE_MSG || rec->kind == LS_TRACE_STREAM_DATA
                                       ? "the recording sent this, the actor did not"
                                                             : "the recording has this here, the actor did not do it",
                             NULL);
    }
    if (r->pos < r->n && r->recs[r->pos].kind != LS_TRACE_META)
        s_replay_diverge(self, "the actor stopped; the recording goes on", NULL);
    if (r->unrecorded)
        ls_warn(0, "replay: %d message(s) sent after the recording ends (it was cut short); not compared",
                r->unrecorded);
    fprintf(stderr, "replay: %s matches %s: %llu inbound messages, %zu records, no divergence\n", self->name,
            r->path, (unsigned long long)r->inbound, r->pos);
}

// ---------------------------------------------------------------------------------------------
// lifecycle

static void s_signal_cb(struct ev_loop *loop, ev_signal *w, int revents) {
    ls_actor_t *self = w->data;
    self->now_ns = ls_mono_ns();
    s_trace_event(self, LS_TRACE_SIGNAL, (uint32_t)w->signum, NULL, 0);
    ls_actor_shutdown(self, w->signum == SIGINT ? "SIGINT" : "SIGTERM");
}

static int s_parse_peers(ls_actor_t *self, const ls_strlist_t *peers) {
    for (size_t i = 0; peers && i < peers->n; i++) {
        const char *eq = strchr(peers->v[i], '=');
        if (!eq || eq == peers->v[i] || !eq[1] || self->npeers == LS_MAX_PEERS) {
            ls_error(0, "bad --peer \"%s\": expected name=endpoint", peers->v[i]);
            return -1;
        }
        self->peer_names[self->npeers] = strndup(peers->v[i], (size_t)(eq - peers->v[i]));
        self->peer_endpoints[self->npeers] = strdup(eq + 1);
        self->npeers++;
    }
    return 0;
}

ls_actor_t *ls_actor_new(const ls_actor_def_t *def, const ls_actor_opts_t *opts) {
    ls_actor_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->def = def;
    self->name = strdup(opts->name ? opts->name : def->name);
    self->bind = opts->bind ? strdup(opts->bind) : NULL;
    self->rank = opts->rank;
    self->process = opts->process;
    self->pid = (int)getpid();
    self->start_ns = self->now_ns = ls_mono_ns();
    self->loop = opts->process ? ev_default_loop(0) : ev_loop_new(EVFLAG_AUTO);
    ev_check_init(&self->check, s_check_cb);
    self->check.data = self;
    ev_check_start(self->loop, &self->check);
    ev_idle_init(&self->idle, s_idle_cb);
    self->idle.data = self;
    pthread_mutex_init(&self->job_lock, NULL);
    pthread_cond_init(&self->job_cond, NULL);
    ev_async_init(&self->job_async, s_job_async_cb);
    self->job_async.data = self;
    ev_async_start(self->loop, &self->job_async);
    // The counters every actor has, registered up front so GetMetrics always lists them.
    static const char *builtin[] = {"msgs_in", "msgs_out", "bytes_in", "bytes_out", "msgs_malformed",
                                    "msgs_unknown", "msgs_unhandled", "send_failures", "handler_errors"};
    for (size_t i = 0; i < sizeof builtin / sizeof *builtin; i++)
        ls_actor_counter(self, builtin[i]);

    if (opts->replay) {
        // A replay never records: the trace it would append to may be the one it reads.
        if (!(self->replay = s_replay_load(opts->replay, opts->replay_run, opts->replay_until)) ||
            s_replay_begin(self) < 0)
            goto fail;
    } else if (opts->trace_dir) {
        char err[512];
        if (!(self->trace = ls_trace_writer_new(opts->trace_dir, self->name, err, sizeof err))) {
            ls_error(0, "%s", err);
            goto fail;
        }
        // What loraserve-replay needs to start the same actor again: its binary and flags.
        cJSON *meta = cJSON_CreateObject();
        cJSON_AddStringToObject(meta, "actor", self->name);
        cJSON_AddNumberToObject(meta, "pid", self->pid);
        cJSON_AddNumberToObject(meta, "schema_version", LS_SCHEMA_VERSION);
        cJSON_AddNumberToObject(meta, "format", 2);
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        cJSON_AddStringToObject(meta, "exe", n > 0 ? (exe[n] = 0, exe) : "");
        cJSON *argv = cJSON_AddArrayToObject(meta, "argv");
        for (int i = 0; i < opts->argc; i++)
            cJSON_AddItemToArray(argv, cJSON_CreateString(opts->argv[i]));
        char *text = cJSON_PrintUnformatted(meta);
        ls_frame_ref_t f = {text, strlen(text)};
        ls_trace_write(self->trace, LS_TRACE_META, LS_TRACE_IN, 0, 0, self->now_ns, &f, 1);
        free(text);
        cJSON_Delete(meta);
    }
    if (s_parse_peers(self, opts->peers) < 0)
        goto fail;
    if (opts->curve_dir && !self->replay) {
        char err[512];
        if (!(self->curve = ls_curve_new(opts->curve_dir, self->name, err, sizeof err))) {
            ls_error(0, "--curve-dir: %s", err);
            goto fail;
        }
    }
    if (opts->bind && !(self->router = s_sock_new(self, 1, NULL, opts->bind)))
        goto fail;
    if (opts->control && !(self->control = s_sock_new(self, 0, "control", opts->control)))
        goto fail;
    if (opts->heartbeat_ms > 0 && opts->control)
        self->heartbeat = ls_actor_timer_start(self, opts->heartbeat_ms, opts->heartbeat_ms, s_heartbeat_cb, NULL);
    // A replay takes its signals from the trace; a real one simply ends it.
    if (opts->process && !self->replay) {
        signal(SIGPIPE, SIG_IGN);
        // A file size limit (RLIMIT_FSIZE, a quota) fails the write with EFBIG, which the
        // writer handles, instead of killing the actor.
        signal(SIGXFSZ, SIG_IGN);
        ev_signal_init(&self->sigint, s_signal_cb, SIGINT);
        ev_signal_init(&self->sigterm, s_signal_cb, SIGTERM);
        self->sigint.data = self->sigterm.data = self;
        ev_signal_start(self->loop, &self->sigint);
        ev_signal_start(self->loop, &self->sigterm);
    }
    return self;
fail:
    ls_actor_destroy(&self);
    return NULL;
}

void ls_actor_destroy(ls_actor_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_actor_t *self = *self_p;
    s_jobs_stop(self);
    // Connections still open end with the process; that is no decision of the actor's, so
    // nothing is recorded.
    while (self->streams)
        s_stream_free(self->streams);
    if (self->listening && self->listen_fd >= 0) {
        ev_io_stop(self->loop, &self->accept_io);
        ev_timer_stop(self->loop, &self->accept_pause);
        close(self->listen_fd);
    }
    while (self->timers)
        ls_actor_timer_stop(self, self->timers);
    for (int i = 0; i < self->nsocks; i++)
        s_sock_destroy(self, &self->socks[i]);
    ls_curve_destroy(&self->curve);  // after the sockets: the authenticator serves them to the end
    for (int i = 0; i < self->npeers; i++) {
        free(self->peer_names[i]);
        free(self->peer_endpoints[i]);
    }
    ev_check_stop(self->loop, &self->check);
    ev_idle_stop(self->loop, &self->idle);
    if (self->process) {
        ev_signal_stop(self->loop, &self->sigint);
        ev_signal_stop(self->loop, &self->sigterm);
    } else
        ev_loop_destroy(self->loop);
    ls_trace_writer_destroy(&self->trace);
    s_replay_destroy(&self->replay);
    free(self->name);
    free(self->bind);
    free(self);
    *self_p = NULL;
}

const char *ls_actor_name(const ls_actor_t *self) { return self->name; }
int ls_actor_rank(const ls_actor_t *self) { return self->rank; }
uint64_t ls_actor_now_ns(const ls_actor_t *self) { return self->now_ns; }
struct ev_loop *ls_actor_loop(ls_actor_t *self) { return self->loop; }

void ls_actor_ready(ls_actor_t *self) {
    if (self->ready_sent)
        return;
    self->ready_sent = 1;
    ls_msg_t ready;
    ls_msg_init(&ready, LS_MSG_READY);
    ready.u.ready.actor = ls_msg_strdup(self->name);
    ready.u.ready.pid = (uint32_t)self->pid;
    ready.u.ready.endpoint = ls_msg_strdup(self->bind ? self->bind : "");
    ready.u.ready.rank = (uint32_t)self->rank;
    ls_actor_send_control(self, &ready);
    ls_msg_clear(&ready);
    ls_info(0, "ready%s%s", self->bind ? " on " : "", self->bind ? self->bind : "");
}

int ls_actor_run(ls_actor_t *self) {
    int rc = self->def->on_start ? self->def->on_start(self, self->def->state) : 0;
    if (rc < 0) {
        ls_error(0, "%s failed to start", self->name);
        return -1;
    }
    if (rc != LS_READY_LATER)
        ls_actor_ready(self);
    if (self->replay)
        s_replay_run(self);
    else
        ev_run(self->loop, 0);
    if (self->def->on_destroy)
        self->def->on_destroy(self, self->def->state);
    ls_info(0, "stopped");
    return 0;
}

int ls_actor_main(int argc, char **argv, const ls_actor_def_t *def) {
    char *name = NULL, *bind = NULL, *control = NULL, *trace_dir = NULL, *log_level = NULL, *replay = NULL;
    char *curve_dir = NULL;
    int heartbeat_ms = 0, rank = 0, replay_run = 0, replay_until = 0;
    ls_strlist_t peers = {0};
    ls_flag_t common[] = {
        LS_FLAG_STR("name", &name, NULL, "actor name (log field, trace file, identity)"),
        LS_FLAG_STR("bind", &bind, NULL, "endpoint to bind this actor's ROUTER socket on"),
        LS_FLAG_STR("control", &control, NULL, "launcher's control endpoint (Ready, Heartbeat)"),
        LS_FLAG_LIST("peer", &peers, "name=endpoint of an actor this one sends to (repeatable)"),
        LS_FLAG_STR("curve-dir", &curve_dir, NULL,
                    "CURVE keys for tcp endpoints: DIR/secret/<name>.key, peers' DIR/public/<peer>.pub"),
        LS_FLAG_STR("record-trace", &trace_dir, NULL, "append every message to DIR/<name>.trace"),
        LS_FLAG_STR("log-level", &log_level, "info", "debug, info, warn or error"),
        LS_FLAG_INT("heartbeat-ms", &heartbeat_ms, "1000", "Heartbeat period to the launcher (0: off)"),
        LS_FLAG_INT("rank", &rank, "0", "this actor's rank in its group (workers)"),
        LS_FLAG_STR("replay", &replay, NULL,
                    "replay this trace file instead of serving: no sockets; exit 3 at the first divergence"),
        LS_FLAG_INT("replay-run", &replay_run, "0", "which run of the trace file to replay, from 1 (0: the last)"),
        LS_FLAG_INT("replay-until", &replay_until, "0",
                    "pause for a debugger after this many inbound messages (ls_replay_break)"),
        LS_FLAG_END,
    };
    ls_flag_t *tables[] = {common, def->flags, NULL};
    char err[512];
    int rc = ls_flags_parse(tables, argc, argv, err, sizeof err);
    if (rc == 1) {
        ls_flags_usage(tables, argv[0], def->about);
        ls_flags_free(tables);
        return 0;
    }
    ls_log_level_t level = LS_LOG_INFO;
    if (rc == 0 && ls_log_level_parse(log_level, &level) < 0) {
        snprintf(err, sizeof err, "--log-level must be debug, info, warn or error, not \"%s\"", log_level);
        rc = -1;
    }
    ls_log_init(name ? name : def->name, level);
    if (rc < 0) {
        ls_error(0, "%s", err);
        ls_flags_free(tables);
        return 2;
    }
    ls_actor_opts_t opts = {.name = name, .bind = bind, .control = control, .peers = &peers,
                            .trace_dir = trace_dir, .curve_dir = curve_dir, .heartbeat_ms = heartbeat_ms, .rank = rank, .process = 1,
                            .argc = argc, .argv = (const char *const *)argv, .replay = replay,
                            .replay_run = replay_run, .replay_until = (uint64_t)(replay_until > 0 ? replay_until : 0)};
    // czmq installs its own SIGINT handler by default; the loop handles signals instead.
    zsys_handler_set(NULL);
    ls_actor_t *actor = ls_actor_new(def, &opts);
    int status = 1;
    if (actor) {
        status = ls_actor_run(actor) == 0 ? 0 : 1;
        ls_actor_destroy(&actor);
    }
    ls_flags_free(tables);
    return status;
}
