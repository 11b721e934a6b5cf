// ls_actor — the runtime's main room (contract in ls_actor.h): the loop and its ZeroMQ sockets,
// sending, the inbound path (decode, dispatch, error answers), the built-in handlers, counters,
// supervision, timers and the lifecycle. The rooms beside it hold what has a life of its own
// on the same actor: ls_stream.c (raw TCP streams), ls_job.c (the job thread), ls_replay.c
// (the trace standing in for all of this); they share ls_actor_impl.h.
//
// Messages handled here for every actor (a dispatch table may override them): Heartbeat
// (answered on the ROUTER: ping → pong), Shutdown, GetMetrics. Emitted: Ready and periodic
// Heartbeat to the control endpoint, Error for bad input, Metrics.
#define _GNU_SOURCE  // as in every room: ls_actor_impl.h is read with one feature set
#include "ls_actor_impl.h"

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

void ls_actor_counter_set(ls_actor_t *self, const char *name, uint64_t value) {
    uint64_t *c = ls_actor_counter(self, name);
    if (c)
        *c = value;
}

void ls_actor_gauge_set(ls_actor_t *self, const char *name, uint64_t value) {
    uint64_t *g = ls_actor_gauge(self, name);
    if (g)
        *g = value;
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

int ls_actor_info(ls_actor_t *self, const char *name, const char *value) {
    s_info_t *f = NULL;
    for (int i = 0; i < self->ninfo && !f; i++)
        if (!strcmp(self->info[i].name, name))
            f = &self->info[i];
    if (!f) {
        if (self->ninfo == LS_MAX_INFO) {
            ls_error(0, "info table full, dropping %s", name);
            return -1;
        }
        f = &self->info[self->ninfo++];
        snprintf(f->name, sizeof f->name, "%s", name);
        f->value = NULL;
    }
    if (f->value && !strcmp(f->value, value))
        return 0;
    char *v = strdup(value);
    if (!v)
        return -1;
    free(f->value);
    f->value = v;
    return 0;
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

void actor_trace_event(ls_actor_t *self, ls_trace_kind_t kind, uint32_t aux, const ls_frame_ref_t *frames,
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
    for (int i = 0; i < self->nsocks && !self->stopping; i++)
        if (self->socks[i]->more) {
            self->socks[i]->more = 0;
            s_sock_drain(self->socks[i]);
        }
    // A handler run by a later socket's drain may have sent on an earlier one, marking it (a
    // send can swallow its ZMQ_FD edge): the loop must not block while any socket is marked.
    for (int i = 0; i < self->nsocks; i++)
        if (self->socks[i]->more)
            return;
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
        actor_replay_socket(self, sock);
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
    // The control socket's server is this node's launcher: "launcher", or with --nnodes the
    // launcher-K of node K.
    const char *server = peer && strcmp(peer, "control") ? peer : self->control_key ? self->control_key : "launcher";
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

int ls_actor_peer_count(const ls_actor_t *self) { return self->npeers; }

const char *ls_actor_peer_name(const ls_actor_t *self, int i) {
    return i >= 0 && i < self->npeers ? self->peer_names[i] : NULL;
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
        rc = actor_replay_out(self, sock, zm, &bytes);
        zmsg_destroy(&zm);
    } else {
        s_trace_zmsg(self, LS_TRACE_OUT, sock, zm);
        rc = zmsg_send(&zm, sock->zs);
        int why = zmq_errno();
        zmsg_destroy(&zm);
        // Replay must fail the same send: the actor may act on it (answer with an error).
        if (rc < 0)
            actor_trace_event(self, LS_TRACE_SEND_FAILED, (uint32_t)why, NULL, 0);
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
    if (self->def->on_metrics)
        self->def->on_metrics(self, &m.u.metrics, self->def->state);
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
    m.u.metrics.info_names.v = calloc((size_t)self->ninfo + 1, sizeof(char *));
    m.u.metrics.info_values.v = calloc((size_t)self->ninfo + 1, sizeof(char *));
    for (int i = 0; i < self->ninfo; i++) {
        m.u.metrics.info_names.v[i] = ls_msg_strdup(self->info[i].name);
        m.u.metrics.info_values.v[i] = ls_msg_strdup(self->info[i].value);
    }
    m.u.metrics.info_names.n = m.u.metrics.info_values.n = (size_t)self->ninfo;
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
void actor_handle(ls_sock_t *sock, zmsg_t **zm_p, uint64_t now_ns) {
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
    uint64_t t0 = ls_mono_ns(), now = t0;
    for (int n = 0; n < LS_DRAIN_CAP && now - t0 < LS_DRAIN_BUDGET_NS; n++) {
        if (self->stopping || !(zsock_events(sock->zs) & ZMQ_POLLIN))
            return;
        zmsg_t *zm = zmsg_recv(sock->zs);
        if (!zm)
            return;
        actor_handle(sock, &zm, now);
        now = ls_mono_ns();
    }
    // Cap or budget reached: let the other sockets, timers and jobs have this turn; continue
    // on the next.
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
    actor_trace_event(self, LS_TRACE_TIMER, t->id, NULL, 0);
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
// lifecycle

static void s_signal_cb(struct ev_loop *loop, ev_signal *w, int revents) {
    ls_actor_t *self = w->data;
    self->now_ns = ls_mono_ns();
    actor_trace_event(self, LS_TRACE_SIGNAL, (uint32_t)w->signum, NULL, 0);
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
    self->control_key = opts->control_key ? strdup(opts->control_key) : NULL;
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
    ev_async_init(&self->job_async, actor_job_async_cb);
    self->job_async.data = self;
    ev_async_start(self->loop, &self->job_async);
    // The counters every actor has, registered up front so GetMetrics always lists them.
    static const char *builtin[] = {"msgs_in", "msgs_out", "bytes_in", "bytes_out", "msgs_malformed",
                                    "msgs_unknown", "msgs_unhandled", "send_failures", "handler_errors"};
    for (size_t i = 0; i < sizeof builtin / sizeof *builtin; i++)
        ls_actor_counter(self, builtin[i]);

    if (opts->replay) {
        // A replay never records: the trace it would append to may be the one it reads.
        if (!(self->replay = actor_replay_load(opts->replay, opts->replay_run, opts->replay_until)) ||
            actor_replay_begin(self) < 0)
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
    actor_jobs_stop(self);
    // Connections still open end with the process; that is no decision of the actor's, so
    // nothing is recorded.
    while (self->streams)
        actor_stream_free(self->streams);
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
    for (int i = 0; i < self->ninfo; i++)
        free(self->info[i].value);
    ev_check_stop(self->loop, &self->check);
    ev_idle_stop(self->loop, &self->idle);
    if (self->process) {
        ev_signal_stop(self->loop, &self->sigint);
        ev_signal_stop(self->loop, &self->sigterm);
    } else
        ev_loop_destroy(self->loop);
    ls_trace_writer_destroy(&self->trace);
    actor_replay_destroy(&self->replay);
    free(self->name);
    free(self->bind);
    free(self->control_key);
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
        actor_replay_run(self);
    else
        ev_run(self->loop, 0);
    // a job's work may be using the state on_destroy frees (a worker's adapter image into its
    // pool): it ends first
    actor_jobs_stop(self);
    if (self->def->on_destroy)
        self->def->on_destroy(self, self->def->state);
    ls_info(0, "stopped");
    return 0;
}

int ls_actor_main(int argc, char **argv, const ls_actor_def_t *def) {
    char *name = NULL, *bind = NULL, *control = NULL, *trace_dir = NULL, *log_level = NULL, *replay = NULL;
    char *curve_dir = NULL, *control_key = NULL;
    int heartbeat_ms = 0, rank = 0, replay_run = 0, replay_until = 0;
    ls_strlist_t peers = {0};
    ls_flag_t common[] = {
        LS_FLAG_STR("name", &name, NULL, "actor name (log field, trace file, identity)"),
        LS_FLAG_STR("bind", &bind, NULL, "endpoint to bind this actor's ROUTER socket on"),
        LS_FLAG_STR("control", &control, NULL, "launcher's control endpoint (Ready, Heartbeat)"),
        LS_FLAG_STR("control-key", &control_key, NULL,
                    "tcp: the name of the control server's CURVE key (default: launcher)"),
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
    ls_actor_opts_t opts = {.name = name, .bind = bind, .control = control, .control_key = control_key,
                            .peers = &peers, .trace_dir = trace_dir, .curve_dir = curve_dir, .heartbeat_ms = heartbeat_ms, .rank = rank, .process = 1,
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

