// http — see http.h.
//
// A connection is in one of three states. READ: bytes are parsed as they come; a request's
// first byte starts its clock (request timeout), and any silence counts against the idle
// timeout. BUSY: a complete request is with the application; the parser is paused, so a
// pipelined next request waits in the input buffer, and reading goes on only to notice a client
// that leaves (EOF or reset means the answer has no one to go to). CLOSING: the last answer is
// flushed, then the write side is shut and the input drained for a moment before close, so the
// client reads that answer instead of a reset.
#define _GNU_SOURCE
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <http_parser.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ls_log.h"

#define S_MAX_HEADERS 100
#define S_READ_CHUNK 65536
#define S_OUT_CAP (64u << 20)  // answer bytes a client may leave unread before it is dropped
#define S_LINGER_S 2.0         // how long a closing connection drains input
#define S_REJECT_EXTRA 256     // connections answered 503 at once beyond max_connections

int gw_buf_add(gw_buf_t *b, const void *data, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1)
            cap *= 2;
        char *d = realloc(b->d, cap);
        if (!d)
            return -1;
        b->d = d;
        b->cap = cap;
    }
    if (len)
        memcpy(b->d + b->n, data, len);
    b->n += len;
    b->d[b->n] = 0;
    return 0;
}

int gw_buf_printf(gw_buf_t *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -1;
    if ((size_t)n < sizeof small)
        return gw_buf_add(b, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = gw_buf_add(b, big, (size_t)n);
    free(big);
    return rc;
}

void gw_buf_free(gw_buf_t *b) {
    free(b->d);
    memset(b, 0, sizeof *b);
}

typedef struct s_conn s_conn_t;

struct gw_req {
    s_conn_t *conn;
    const char *method;
    gw_buf_t url;
    gw_buf_t names[S_MAX_HEADERS], values[S_MAX_HEADERS];
    int nheaders;
    int in_value;  // the parser's last header callback was a value
    gw_buf_t body;
    int http_minor;
    int keep_alive;
    double start;  // ev_now of its first byte
    int streaming; // stream answer begun
    int status;
    char tag[256];
    void *data;
};

typedef enum { S_READ, S_BUSY, S_CLOSING } s_state_t;

struct s_conn {
    gw_http_t *srv;
    int fd;
    s_state_t state;
    ev_io rio, wio;
    ev_timer timer;
    ev_idle later;  // work deferred to the next loop turn: resume parsing, or drop a dead connection
    http_parser parser;
    gw_buf_t in;
    size_t in_off;  // parsed up to here
    gw_buf_t out;
    size_t out_off; // written up to here
    gw_req_t *req;  // being received (READ) or answered (BUSY)
    double last_io;
    int dead;       // the socket failed: drop on the next turn
    int too_large;  // the body limit stopped the parser
    int too_many;   // the header count limit stopped the parser
    int rejected;   // over max_connections: answered 503 only
    int wr_shut;
    s_conn_t *prev, *next;
};

struct gw_http {
    struct ev_loop *loop;
    int fd, port;
    ev_io accept_io;
    ev_timer accept_pause;  // out of file descriptors: accepting waits a moment
    gw_http_limits_t lim;
    gw_http_cbs_t cbs;
    http_parser_settings settings;
    s_conn_t *conns;
    int nconns, nrejected;
};

// ---------------------------------------------------------------------------------------------
// errors

static const char *s_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

char *gw_error_json(int status, const char *message, const char *param, const char *code) {
    const char *type = status == 401   ? "authentication_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status < 500  ? "invalid_request_error"
                       : status == 503 ? "service_unavailable"
                                       : "server_error";
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

// ---------------------------------------------------------------------------------------------
// connections

static void s_req_free(gw_req_t *req) {
    if (!req)
        return;
    gw_buf_free(&req->url);
    for (int i = 0; i < S_MAX_HEADERS; i++) {
        gw_buf_free(&req->names[i]);
        gw_buf_free(&req->values[i]);
    }
    gw_buf_free(&req->body);
    free(req);
}

static void s_conn_arm(s_conn_t *c);

static void s_log_answer(gw_req_t *req, int status) {
    gw_http_t *srv = req->conn->srv;
    double ms = (ev_now(srv->loop) - req->start) * 1000.0;
    ls_info(0, "%s %s %d %.1f ms%s%s", req->method ? req->method : "-", req->url.d ? req->url.d : "-", status, ms,
            req->tag[0] ? " model=" : "", req->tag);
    if (srv->cbs.answered)
        srv->cbs.answered(status, srv->cbs.arg);
}

static void s_conn_destroy(s_conn_t *c) {
    gw_http_t *srv = c->srv;
    if (c->req) {
        // The application still holds the request: the answer has no one to go to.
        if (c->state == S_BUSY) {
            s_log_answer(c->req, 499);
            if (srv->cbs.gone)
                srv->cbs.gone(c->req, srv->cbs.arg);
        }
        s_req_free(c->req);
    }
    ev_io_stop(srv->loop, &c->rio);
    ev_io_stop(srv->loop, &c->wio);
    ev_timer_stop(srv->loop, &c->timer);
    ev_idle_stop(srv->loop, &c->later);
    close(c->fd);
    gw_buf_free(&c->in);
    gw_buf_free(&c->out);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->rejected)
        srv->nrejected--;
    else
        srv->nconns--;
    free(c);
}

static void s_conn_later(s_conn_t *c) { ev_idle_start(c->srv->loop, &c->later); }

// Write what can be written now; the rest waits for the socket to be writable.
static void s_conn_flush(s_conn_t *c) {
    while (c->out_off < c->out.n) {
        ssize_t n = send(c->fd, c->out.d + c->out_off, c->out.n - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            c->last_io = ev_now(c->srv->loop);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (errno == EINTR)
                continue;
            ev_io_start(c->srv->loop, &c->wio);
            s_conn_arm(c);
            return;
        }
        c->dead = 1;
        s_conn_later(c);
        return;
    }
    ev_io_stop(c->srv->loop, &c->wio);
    c->out.n = c->out_off = 0;
    if (c->state == S_CLOSING && !c->wr_shut) {
        shutdown(c->fd, SHUT_WR);
        c->wr_shut = 1;
    }
    s_conn_arm(c);
}

static void s_conn_write(s_conn_t *c, const void *data, size_t len) {
    if (c->dead)
        return;
    if (c->out.n - c->out_off + len > S_OUT_CAP || gw_buf_add(&c->out, data, len) < 0) {
        ls_warn(0, "an HTTP client leaves more than %u MB of answers unread; dropping it", S_OUT_CAP >> 20);
        c->dead = 1;
        s_conn_later(c);
        return;
    }
    s_conn_flush(c);
}

// Closing: no more requests are read from this connection; once the answer is out it is shut.
static void s_conn_close_after(s_conn_t *c) {
    c->state = S_CLOSING;
    ev_io_start(c->srv->loop, &c->rio);
    s_conn_flush(c);
}

// An answer from the server itself (parse errors, limits, timeouts), after which the
// connection closes: a request stream that went wrong cannot be resynchronised.
static void s_conn_fail(s_conn_t *c, int status, const char *message) {
    if (!c->req) {
        c->req = calloc(1, sizeof *c->req);
        if (!c->req) {
            c->dead = 1;
            s_conn_later(c);
            return;
        }
        c->req->conn = c;
        c->req->start = ev_now(c->srv->loop);
    }
    char *body = gw_error_json(status, message, NULL, NULL);
    gw_buf_t head = {0};
    gw_buf_printf(&head,
                  "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                  "Connection: close\r\n\r\n%s",
                  status, s_reason(status), body ? strlen(body) : 0, body ? body : "");
    free(body);
    s_log_answer(c->req, status);
    s_req_free(c->req);
    c->req = NULL;
    c->state = S_CLOSING;
    s_conn_write(c, head.d, head.n);
    gw_buf_free(&head);
    s_conn_close_after(c);
}

static void s_dispatch(s_conn_t *c) {
    gw_req_t *req = c->req;
    c->state = S_BUSY;
    s_conn_arm(c);
    c->srv->cbs.request(req, c->srv->cbs.arg);  // last: it may answer, and so free req, at once
}

// Parse buffered input while the connection takes requests.
static void s_conn_parse(s_conn_t *c) {
    if (c->state != S_READ || c->dead || c->in_off == c->in.n)
        return;
    size_t avail = c->in.n - c->in_off;
    size_t used = http_parser_execute(&c->parser, &c->srv->settings, c->in.d + c->in_off, avail);
    c->in_off += used;
    if (c->in_off == c->in.n)
        c->in.n = c->in_off = 0;
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (e == HPE_PAUSED) {
        s_dispatch(c);
        return;
    }
    if (e == HPE_OK) {
        s_conn_arm(c);
        return;
    }
    char why[160];
    snprintf(why, sizeof why, "malformed HTTP request: %s", http_errno_description(e));
    if (c->too_large) {
        snprintf(why, sizeof why, "request body larger than %d bytes", c->srv->lim.max_body_bytes);
        s_conn_fail(c, 413, why);
    } else if (e == HPE_HEADER_OVERFLOW || c->too_many) {
        snprintf(why, sizeof why, "request line and headers larger than %d bytes (or more than %d headers)",
                 c->srv->lim.max_header_bytes, S_MAX_HEADERS);
        s_conn_fail(c, 431, why);
    } else
        s_conn_fail(c, 400, why);
}

// Input may wait unparsed (a pipelined request behind a busy one) up to this much.
static size_t s_in_cap(const gw_http_t *srv) {
    return (size_t)srv->lim.max_header_bytes + (size_t)srv->lim.max_body_bytes + S_READ_CHUNK;
}

static void s_read_cb(struct ev_loop *loop, ev_io *w, int revents) {
    s_conn_t *c = w->data;
    char buf[S_READ_CHUNK];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            c->last_io = ev_now(loop);
            if (c->state == S_CLOSING)
                continue;  // draining before close
            if (gw_buf_add(&c->in, buf, (size_t)n) < 0) {
                s_conn_destroy(c);
                return;
            }
            if (c->in.n - c->in_off >= s_in_cap(c->srv)) {
                ev_io_stop(loop, &c->rio);  // resumes when the parser takes the input
                break;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        // EOF or reset: the client is gone (a half-sent request is dropped; an answer being
        // produced is abandoned, and the application told).
        s_conn_destroy(c);
        return;
    }
    s_conn_parse(c);
}

static void s_write_cb(struct ev_loop *loop, ev_io *w, int revents) {
    s_conn_t *c = w->data;
    s_conn_flush(c);
    if (c->dead)
        s_conn_destroy(c);
}

static void s_later_cb(struct ev_loop *loop, ev_idle *w, int revents) {
    s_conn_t *c = w->data;
    ev_idle_stop(loop, w);
    if (c->dead) {
        s_conn_destroy(c);
        return;
    }
    if (c->state == S_READ) {
        if (!ev_is_active(&c->rio))
            ev_io_start(loop, &c->rio);
        s_conn_parse(c);
    }
}

static void s_timer_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    s_conn_t *c = w->data;
    if (c->state == S_CLOSING || (c->state == S_READ && !c->req) || c->state == S_BUSY) {
        // Closing done lingering, a keep-alive connection idle, or an answer nobody reads.
        s_conn_destroy(c);
        return;
    }
    s_conn_fail(c, 408, "the request did not arrive in time");
}

// Set the one timer for the connection's state (see the top of the file).
static void s_conn_arm(s_conn_t *c) {
    gw_http_t *srv = c->srv;
    double now = ev_now(srv->loop), idle = srv->lim.idle_timeout_ms / 1000.0, deadline = 0;
    if (c->state == S_READ) {
        deadline = c->last_io + idle;
        if (c->req) {
            double whole = c->req->start + srv->lim.request_timeout_ms / 1000.0;
            if (whole < deadline)
                deadline = whole;
        }
    } else if (c->state == S_BUSY) {
        if (c->out_off < c->out.n)
            deadline = c->last_io + idle;  // a client that stops reading its answer
    } else
        deadline = c->last_io + (idle < S_LINGER_S ? idle : S_LINGER_S);
    ev_timer_stop(srv->loop, &c->timer);
    if (deadline > 0) {
        ev_timer_set(&c->timer, deadline > now ? deadline - now : 0, 0);
        ev_timer_start(srv->loop, &c->timer);
    }
}

// ---------------------------------------------------------------------------------------------
// parser callbacks

static int s_on_begin(http_parser *p) {
    s_conn_t *c = p->data;
    c->req = calloc(1, sizeof *c->req);
    if (!c->req)
        return -1;
    c->req->conn = c;
    c->req->start = ev_now(c->srv->loop);
    s_conn_arm(c);
    return 0;
}

static int s_on_url(http_parser *p, const char *at, size_t len) {
    s_conn_t *c = p->data;
    return gw_buf_add(&c->req->url, at, len);
}

static int s_on_field(http_parser *p, const char *at, size_t len) {
    gw_req_t *r = ((s_conn_t *)p->data)->req;
    if (r->in_value || !r->nheaders) {
        if (r->nheaders == S_MAX_HEADERS) {
            ((s_conn_t *)p->data)->too_many = 1;  // answered 431, as too many header bytes are
            return -1;
        }
        r->nheaders++;
        r->in_value = 0;
    }
    return gw_buf_add(&r->names[r->nheaders - 1], at, len);
}

static int s_on_value(http_parser *p, const char *at, size_t len) {
    gw_req_t *r = ((s_conn_t *)p->data)->req;
    r->in_value = 1;
    return gw_buf_add(&r->values[r->nheaders - 1], at, len);
}

static int s_on_headers(http_parser *p) {
    s_conn_t *c = p->data;
    gw_req_t *r = c->req;
    if (p->content_length != ULLONG_MAX && p->content_length > (uint64_t)c->srv->lim.max_body_bytes) {
        c->too_large = 1;
        return -1;
    }
    // A client that asked before sending its body (curl does for large ones) is told to go on.
    const char *expect = gw_req_header(r, "Expect");
    if (expect && !strcasecmp(expect, "100-continue") && p->http_minor >= 1) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        s_conn_write(c, cont, sizeof cont - 1);
    }
    return 0;
}

static int s_on_body(http_parser *p, const char *at, size_t len) {
    s_conn_t *c = p->data;
    if (c->req->body.n + len > (size_t)c->srv->lim.max_body_bytes) {
        c->too_large = 1;
        return -1;
    }
    return gw_buf_add(&c->req->body, at, len);
}

static int s_on_complete(http_parser *p) {
    s_conn_t *c = p->data;
    gw_req_t *r = c->req;
    r->method = http_method_str((enum http_method)p->method);
    r->http_minor = p->http_major == 1 ? p->http_minor : 1;
    r->keep_alive = http_should_keep_alive(p);
    if (!r->url.d)
        gw_buf_add(&r->url, "", 0);
    http_parser_pause(p, 1);  // the next request waits until this one is answered
    return 0;
}

// ---------------------------------------------------------------------------------------------
// accepting

static void s_accept_cb(struct ev_loop *loop, ev_io *w, int revents) {
    gw_http_t *srv = w->data;
    for (;;) {
        int fd = accept4(srv->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                ls_warn(0, "cannot accept HTTP connections: %s; pausing 100 ms", strerror(errno));
                ev_io_stop(loop, &srv->accept_io);
                ev_timer_set(&srv->accept_pause, 0.1, 0);
                ev_timer_start(loop, &srv->accept_pause);
            }
            return;
        }
        int full = srv->nconns >= srv->lim.max_connections;
        if (full && srv->nrejected >= S_REJECT_EXTRA) {
            close(fd);  // far over the limit: not even an answer
            continue;
        }
        s_conn_t *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // SSE pieces leave at once
        c->srv = srv;
        c->fd = fd;
        c->last_io = ev_now(loop);
        http_parser_init(&c->parser, HTTP_REQUEST);
        c->parser.data = c;
        ev_io_init(&c->rio, s_read_cb, fd, EV_READ);
        ev_io_init(&c->wio, s_write_cb, fd, EV_WRITE);
        ev_timer_init(&c->timer, s_timer_cb, 0, 0);
        ev_idle_init(&c->later, s_later_cb);
        c->rio.data = c->wio.data = c->timer.data = c->later.data = c;
        c->next = srv->conns;
        if (srv->conns)
            srv->conns->prev = c;
        srv->conns = c;
        if (full) {
            c->rejected = 1;
            srv->nrejected++;
            char why[96];
            snprintf(why, sizeof why, "too many connections (at most %d)", srv->lim.max_connections);
            s_conn_fail(c, 503, why);
            continue;
        }
        srv->nconns++;
        ev_io_start(loop, &c->rio);
        s_conn_arm(c);
    }
}

static void s_accept_pause_cb(struct ev_loop *loop, ev_timer *w, int revents) {
    gw_http_t *srv = w->data;
    ev_io_start(loop, &srv->accept_io);
}

gw_http_t *gw_http_new(struct ev_loop *loop, const char *host, int port, const gw_http_limits_t *limits,
                       const gw_http_cbs_t *cbs) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &ai);
    if (rc) {
        ls_error(0, "--host %s: %s", host, gai_strerror(rc));
        return NULL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        ls_error(0, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return NULL;
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    gw_http_t *self = calloc(1, sizeof *self);
    self->loop = loop;
    self->fd = fd;
    self->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
    self->lim = *limits;
    self->cbs = *cbs;
    // The parser's header limit is process-wide; this process has one server.
    http_parser_set_max_header_size((uint32_t)limits->max_header_bytes);
    self->settings.on_message_begin = s_on_begin;
    self->settings.on_url = s_on_url;
    self->settings.on_header_field = s_on_field;
    self->settings.on_header_value = s_on_value;
    self->settings.on_headers_complete = s_on_headers;
    self->settings.on_body = s_on_body;
    self->settings.on_message_complete = s_on_complete;
    ev_io_init(&self->accept_io, s_accept_cb, fd, EV_READ);
    ev_timer_init(&self->accept_pause, s_accept_pause_cb, 0, 0);
    self->accept_io.data = self->accept_pause.data = self;
    ev_io_start(loop, &self->accept_io);
    return self;
}

void gw_http_destroy(gw_http_t **self_p) {
    if (!self_p || !*self_p)
        return;
    gw_http_t *self = *self_p;
    while (self->conns)
        s_conn_destroy(self->conns);
    ev_io_stop(self->loop, &self->accept_io);
    ev_timer_stop(self->loop, &self->accept_pause);
    close(self->fd);
    free(self);
    *self_p = NULL;
}

int gw_http_port(const gw_http_t *self) { return self->port; }
int gw_http_connections(const gw_http_t *self) { return self->nconns; }

// ---------------------------------------------------------------------------------------------
// requests

const char *gw_req_method(const gw_req_t *req) { return req->method; }

const char *gw_req_path(const gw_req_t *req) {
    char *q = strchr(req->url.d, '?');
    if (q)
        *q = 0;  // the query string is not used by any endpoint
    return req->url.d;
}

const char *gw_req_header(const gw_req_t *req, const char *name) {
    for (int i = 0; i < req->nheaders; i++)
        if (req->names[i].d && !strcasecmp(req->names[i].d, name))
            return req->values[i].d ? req->values[i].d : "";
    return NULL;
}

const char *gw_req_body(const gw_req_t *req, size_t *len) {
    *len = req->body.n;
    return req->body.d ? req->body.d : "";
}

void gw_req_set_tag(gw_req_t *req, const char *tag) { snprintf(req->tag, sizeof req->tag, "%s", tag); }
void gw_req_set_data(gw_req_t *req, void *data) { req->data = data; }
void *gw_req_data(const gw_req_t *req) { return req->data; }

static void s_head(gw_req_t *req, int status, const char *content_type, const char *extra, long long length) {
    s_conn_t *c = req->conn;
    int keep = req->keep_alive && !(length < 0 && req->http_minor == 0);
    gw_buf_t h = {0};
    gw_buf_printf(&h, "HTTP/1.%d %d %s\r\nContent-Type: %s\r\n", req->http_minor, status, s_reason(status),
                  content_type);
    if (length >= 0)
        gw_buf_printf(&h, "Content-Length: %lld\r\n", length);
    else
        gw_buf_printf(&h, "Cache-Control: no-cache\r\n%s", req->http_minor ? "Transfer-Encoding: chunked\r\n" : "");
    gw_buf_printf(&h, "Connection: %s\r\n%s\r\n", keep ? "keep-alive" : "close", extra ? extra : "");
    s_conn_write(c, h.d, h.n);
    gw_buf_free(&h);
    req->keep_alive = keep;
    req->status = status;
}

// The answer is queued: free the request and take the next one (on the next loop turn, so the
// application is never re-entered from its own call).
static void s_req_end(gw_req_t *req) {
    s_conn_t *c = req->conn;
    s_log_answer(req, req->status);
    int keep = req->keep_alive;
    s_req_free(req);
    c->req = NULL;
    if (!keep) {
        s_conn_close_after(c);
        return;
    }
    c->state = S_READ;
    c->last_io = ev_now(c->srv->loop);
    http_parser_pause(&c->parser, 0);
    s_conn_arm(c);
    s_conn_later(c);
}

void gw_req_respond(gw_req_t *req, int status, const char *content_type, const char *extra_headers,
                    const char *body, size_t len) {
    s_head(req, status, content_type, extra_headers, (long long)len);
    s_conn_write(req->conn, body, len);
    s_req_end(req);
}

void gw_req_stream_begin(gw_req_t *req, int status, const char *content_type) {
    req->streaming = 1;
    s_head(req, status, content_type, NULL, -1);
}

void gw_req_stream_write(gw_req_t *req, const char *data, size_t len) {
    if (!len)
        return;  // an empty chunk would end the stream
    if (req->http_minor) {
        char size[24];
        int n = snprintf(size, sizeof size, "%zx\r\n", len);
        s_conn_write(req->conn, size, (size_t)n);
        s_conn_write(req->conn, data, len);
        s_conn_write(req->conn, "\r\n", 2);
    } else
        s_conn_write(req->conn, data, len);
}

void gw_req_stream_end(gw_req_t *req) {
    if (req->http_minor)
        s_conn_write(req->conn, "0\r\n\r\n", 5);
    s_req_end(req);
}
