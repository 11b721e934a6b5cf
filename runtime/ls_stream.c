// ls_stream — the runtime's raw byte streams (ls_actor_stream_listen, ls_actor.h): one listener
// on the actor's loop and its connections, recorded for replay like messages. A room of its
// own because plain sockets have their own life beside the ZeroMQ ones: partial writes,
// backpressure (max_unsent, stall_ms), the linger of a close, and clients lost at any moment;
// only the gateway listens.
#define _GNU_SOURCE
#include "ls_actor_impl.h"

#define S_STREAM_READ_CHUNK 65536
#define S_STREAM_LINGER_S 2.0  // how long a closed stream drains the client's input

static void s_trace_stream(ls_actor_t *self, ls_trace_kind_t kind, ls_trace_dir_t dir, uint32_t id,
                           const void *data, size_t len, int has_frame) {
    ls_frame_ref_t f = {data, len};
    if (self->trace && ls_trace_write(self->trace, kind, dir, 0, id, self->now_ns, &f, has_frame ? 1 : 0) < 0)
        ls_actor_count(self, "trace_write_errors", 1);
}

ls_stream_t *actor_stream_new(ls_actor_t *self, uint32_t id, int fd) {
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

void actor_stream_free(ls_stream_t *s) {
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

ls_stream_t *actor_stream_find(ls_actor_t *self, uint32_t id) {
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
    actor_stream_free(s);
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
            actor_stream_free(s);  // the client closed its side too: the linger is over
        else
            s_stream_lost(s, n == 0 ? "the client closed the connection" : strerror(errno));
        return;
    }
}

static void s_stream_write_cb(struct ev_loop *loop, ev_io *w, int revents) { s_stream_flush(w->data); }

static void s_stream_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    ls_stream_t *s = w->data;
    if (s->closing)
        actor_stream_free(s);  // lingered enough, or the last answer is not read
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
        ls_stream_t *s = actor_stream_new(self, self->next_stream_id + 1, fd);
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
        return actor_replay_listen(self);
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
        actor_replay_stream_out(self, LS_TRACE_STREAM_DATA, s->id, data, len);
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
        actor_replay_stream_out(self, LS_TRACE_STREAM_CLOSE, s->id, NULL, 0);
        actor_stream_free(s);
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

