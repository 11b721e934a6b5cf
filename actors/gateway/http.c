// http — see http.h.
//
// The sockets are the runtime's (ls_actor_stream_listen): this file sees a connection as
// recorded events — opened, bytes in, the client gone — and answers with writes and a close,
// so that a replay of the gateway takes exactly the same decisions. Its clock is the event
// time (ls_actor_now_ns) and its timeouts are actor timers, recorded when they fire.
//
// A connection is in one of two states. READ: bytes are parsed as they come; a request's first
// byte starts its clock (request timeout), and any silence counts against the idle timeout.
// BUSY: a complete request is with the application; the parser is paused, so a pipelined next
// request waits in the input buffer, and reading goes on only to notice a client that leaves
// (EOF or reset means the answer has no one to go to). A connection that ends is closed with
// ls_stream_close: the runtime flushes the last answer, shuts the write side and drains the
// input a moment, so the client reads that answer instead of a reset.
#include "http.h"

#include <limits.h>
#include <http_parser.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "ls_log.h"

#define S_MAX_HEADERS 100
#define S_READ_CHUNK 65536
#define S_OUT_CAP ((size_t)64 << 20)  // answer bytes a client may leave unread before it is dropped
#define S_REJECT_EXTRA 256  // connections answered 503 at once beyond max_connections

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
    size_t body_max;  // its limit (gw_http_cbs_t.body_limit)
    int http_minor;
    int keep_alive;
    uint64_t start_ns;  // event time of its first byte
    int streaming; // stream answer begun
    int status;
    char tag[256];
    void *data;
};

typedef enum { S_READ, S_BUSY } s_state_t;

struct s_conn {
    gw_http_t *srv;
    ls_stream_t *stream;
    s_state_t state;
    ls_timer_t *timer;  // the deadline of the state; NULL while there is none
    ls_timer_t *later;  // parses pipelined input on the next event (s_conn_later)
    http_parser parser;
    gw_buf_t in;
    size_t in_off;    // parsed up to here
    gw_req_t *req;    // being received (READ) or answered (BUSY)
    uint64_t last_io; // event time of the last bytes in, or of the last bytes queued out
    int too_large;    // the body limit stopped the parser (the request stays, for its limit)
    int too_many;     // the header count limit stopped the parser
    int rejected;     // over max_connections: answered 503 only
    s_conn_t *prev, *next;
};

struct gw_http {
    ls_actor_t *actor;
    int port;
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
static void s_conn_parse(s_conn_t *c);

static void s_log_answer(gw_req_t *req, int status) {
    gw_http_t *srv = req->conn->srv;
    double ms = (double)(ls_actor_now_ns(srv->actor) - req->start_ns) / 1e6;
    ls_info(0, "%s %s %d %.1f ms%s%s", req->method ? req->method : "-", req->url.d ? req->url.d : "-", status, ms,
            req->tag[0] ? " model=" : "", req->tag);
    if (srv->cbs.answered)
        srv->cbs.answered(status, srv->cbs.arg);
}

// Forget the connection; its stream is closed by the caller, or gone already.
static void s_conn_free(s_conn_t *c) {
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
    if (c->timer)
        ls_actor_timer_stop(srv->actor, c->timer);
    if (c->later)
        ls_actor_timer_stop(srv->actor, c->later);
    ls_stream_set_data(c->stream, NULL);
    gw_buf_free(&c->in);
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

// No more requests from this connection: the runtime sends what is queued, then closes it.
static void s_conn_close(s_conn_t *c) {
    ls_stream_t *s = c->stream;
    s_conn_free(c);  // first: it unlinks the stream, which the close may free at once (replay)
    ls_stream_close(s);
}

static void s_later_cb(ls_actor_t *a, ls_timer_t *t, void *arg) {
    s_conn_t *c = arg;
    if (c->state == S_READ)
        s_conn_parse(c);
}

// Parse the buffered input on the next event: never from inside the application's own call.
static void s_conn_later(s_conn_t *c) {
    if (c->later)
        ls_actor_timer_again(c->srv->actor, c->later, 0);
    else
        c->later = ls_actor_timer_start(c->srv->actor, 0, 0, s_later_cb, c);
}

static void s_conn_write(s_conn_t *c, const void *data, size_t len) {
    c->last_io = ls_actor_now_ns(c->srv->actor);
    ls_stream_write(c->stream, data, len);
}

// An answer from the server itself (parse errors, limits, timeouts), after which the
// connection closes: a request stream that went wrong cannot be resynchronised.
static void s_conn_fail(s_conn_t *c, int status, const char *message) {
    if (!c->req) {
        c->req = calloc(1, sizeof *c->req);
        if (!c->req) {
            s_conn_close(c);
            return;
        }
        c->req->conn = c;
        c->req->start_ns = ls_actor_now_ns(c->srv->actor);
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
    s_conn_write(c, head.d, head.n);
    gw_buf_free(&head);
    s_conn_close(c);
}

static void s_dispatch(s_conn_t *c) {
    gw_req_t *req = c->req;
    c->state = S_BUSY;
    s_conn_arm(c);
    c->srv->cbs.request(req, c->srv->cbs.arg);  // last: it may answer, and so free req, at once
}

// Parse buffered input while the connection takes requests.
static void s_conn_parse(s_conn_t *c) {
    if (c->state != S_READ || c->in_off == c->in.n)
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
        snprintf(why, sizeof why, "request body larger than %zu bytes", c->req->body_max);
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

static void s_on_data(ls_actor_t *a, ls_stream_t *s, const char *data, size_t len, void *arg) {
    s_conn_t *c = ls_stream_data(s);
    if (!c)
        return;
    c->last_io = ls_actor_now_ns(a);
    if (gw_buf_add(&c->in, data, len) < 0) {
        s_conn_close(c);
        return;
    }
    // Reading goes on while a request is answered, to notice a client that leaves; what it
    // sends meanwhile waits, up to a limit, then in the kernel until the answer is out.
    if (c->in.n - c->in_off >= s_in_cap(c->srv))
        ls_stream_pause(s, 1);
    s_conn_parse(c);
}

// EOF or reset: the client is gone (a half-sent request is dropped; an answer being produced
// is abandoned, and the application told).
static void s_on_close(ls_actor_t *a, ls_stream_t *s, const char *why, void *arg) {
    s_conn_t *c = ls_stream_data(s);
    if (c)
        s_conn_free(c);
}

static void s_timer_cb(ls_actor_t *a, ls_timer_t *t, void *arg) {
    s_conn_t *c = arg;
    if (c->state == S_READ && !c->req)
        s_conn_close(c);  // a keep-alive connection idle
    else
        s_conn_fail(c, 408, "the request did not arrive in time");
}

// Set the one timer for the connection's state (see the top of the file). An answer nobody
// reads is the runtime's to drop (ls_stream_def_t.stall_ms).
static void s_conn_arm(s_conn_t *c) {
    gw_http_t *srv = c->srv;
    uint64_t now = ls_actor_now_ns(srv->actor), deadline = 0;
    if (c->state == S_READ) {
        deadline = c->last_io + (uint64_t)srv->lim.idle_timeout_ms * 1000000u;
        if (c->req) {
            uint64_t whole = c->req->start_ns + (uint64_t)srv->lim.request_timeout_ms * 1000000u;
            if (whole < deadline)
                deadline = whole;
        }
    }
    if (!deadline) {
        if (c->timer)
            ls_actor_timer_stop(srv->actor, c->timer);
        c->timer = NULL;
        return;
    }
    double ms = deadline > now ? (double)(deadline - now) / 1e6 : 0;
    if (c->timer)
        ls_actor_timer_again(srv->actor, c->timer, ms);
    else
        c->timer = ls_actor_timer_start(srv->actor, ms, 0, s_timer_cb, c);
}

// ---------------------------------------------------------------------------------------------
// parser callbacks

static int s_on_begin(http_parser *p) {
    s_conn_t *c = p->data;
    c->req = calloc(1, sizeof *c->req);
    if (!c->req)
        return -1;
    c->req->conn = c;
    c->req->start_ns = ls_actor_now_ns(c->srv->actor);
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
    if (!r->url.d)
        gw_buf_add(&r->url, "", 0);
    r->body_max = (size_t)c->srv->lim.max_body_bytes;
    if (c->srv->cbs.body_limit)
        r->body_max = c->srv->cbs.body_limit(http_method_str((enum http_method)p->method), gw_req_path(r),
                                             c->srv->cbs.arg);
    if (p->content_length != ULLONG_MAX && p->content_length > (uint64_t)r->body_max) {
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
    if (c->req->body.n + len > c->req->body_max) {
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

static void s_on_open(ls_actor_t *a, ls_stream_t *s, void *arg) {
    gw_http_t *srv = arg;
    int full = srv->nconns >= srv->lim.max_connections;
    s_conn_t *c = full && srv->nrejected >= S_REJECT_EXTRA ? NULL : calloc(1, sizeof *c);
    if (!c) {
        ls_stream_close(s);  // far over the limit (or out of memory): not even an answer
        return;
    }
    c->srv = srv;
    c->stream = s;
    c->last_io = ls_actor_now_ns(a);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = c;
    ls_stream_set_data(s, c);
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
        return;
    }
    srv->nconns++;
    s_conn_arm(c);
}

gw_http_t *gw_http_new(ls_actor_t *actor, const char *host, int port, const gw_http_limits_t *limits,
                       const gw_http_cbs_t *cbs) {
    gw_http_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->actor = actor;
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
    const ls_stream_def_t def = {.on_open = s_on_open,
                                 .on_data = s_on_data,
                                 .on_close = s_on_close,
                                 .max_unsent = S_OUT_CAP,
                                 .stall_ms = limits->idle_timeout_ms};
    if ((self->port = ls_actor_stream_listen(actor, host, port, &def, self)) < 0) {
        free(self);
        return NULL;
    }
    return self;
}

// The connections' streams end with the actor; the application hears of requests it still holds.
void gw_http_destroy(gw_http_t **self_p) {
    if (!self_p || !*self_p)
        return;
    gw_http_t *self = *self_p;
    while (self->conns)
        s_conn_free(self->conns);
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
        s_conn_close(c);
        return;
    }
    c->state = S_READ;
    c->last_io = ls_actor_now_ns(c->srv->actor);
    http_parser_pause(&c->parser, 0);
    ls_stream_pause(c->stream, 0);
    s_conn_arm(c);
    if (c->in_off < c->in.n)
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
