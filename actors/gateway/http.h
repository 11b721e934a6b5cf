// http — the gateway's HTTP/1.1 server: connections are the runtime's recorded streams
// (ls_actor_stream_listen), requests parsed by libhttp-parser. Keep-alive, pipelining (one request at a time per connection: the
// parser pauses after a request and resumes once its answer is queued, so answers leave in
// order), chunked responses for SSE, and the limits a public port needs: header and body size
// (431, 413), the time to receive a request and idle connections (408), connection count (503).
//
// The application sees complete requests (`request`), answers each exactly once with
// gw_req_respond or gw_req_stream_begin/write/end, and is told when the client left before the
// answer ended (`gone`; the request is freed when that returns). Functions the application calls
// never call `request` or `gone` back: a failed write is handled on the next loop turn.
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "ls_actor.h"

// A growing byte buffer, always NUL-terminated (d is NULL while empty).
typedef struct {
    char *d;
    size_t n, cap;
} gw_buf_t;

int gw_buf_add(gw_buf_t *b, const void *data, size_t len);
int gw_buf_printf(gw_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gw_buf_free(gw_buf_t *b);

typedef struct gw_http gw_http_t;
typedef struct gw_req gw_req_t;

typedef struct {
    int max_connections;
    int max_header_bytes;   // request line and headers
    int max_body_bytes;     // after chunked decoding (unless body_limit says otherwise)
    int idle_timeout_ms;    // no bytes from a client between or inside requests
    int request_timeout_ms; // from a request's first byte to its last
} gw_http_limits_t;

typedef struct {
    void (*request)(gw_req_t *req, void *arg);  // a complete request: answer it, now or later
    void (*gone)(gw_req_t *req, void *arg);     // its client left before the answer ended
    void (*answered)(int status, void *arg);    // every answer's status (499: the client left)
    // The body limit of one request, from its method and path (known before its body); NULL:
    // max_body_bytes for every request.
    size_t (*body_limit)(const char *method, const char *path, void *arg);
    void *arg;
} gw_http_cbs_t;

// Listen on host:port (port 0: any free port). NULL on failure (logged).
gw_http_t *gw_http_new(ls_actor_t *actor, const char *host, int port, const gw_http_limits_t *limits,
                       const gw_http_cbs_t *cbs);
// Forget every connection (requests still held are reported `gone`); the actor's end closes
// the sockets.
void gw_http_destroy(gw_http_t **self_p);
int gw_http_port(const gw_http_t *self);
int gw_http_connections(const gw_http_t *self);

const char *gw_req_method(const gw_req_t *req);
const char *gw_req_path(const gw_req_t *req);  // without the query string
// A header's value (name case-insensitive); NULL when absent.
const char *gw_req_header(const gw_req_t *req, const char *name);
const char *gw_req_body(const gw_req_t *req, size_t *len);
// What the request log line names as the model.
void gw_req_set_tag(gw_req_t *req, const char *tag);
void gw_req_set_data(gw_req_t *req, void *data);
void *gw_req_data(const gw_req_t *req);

// Answer whole; ends the request (req is freed). extra_headers: complete "Name: value\r\n"
// lines, or NULL.
void gw_req_respond(gw_req_t *req, int status, const char *content_type, const char *extra_headers,
                    const char *body, size_t len);
// Answer as a stream (chunked on HTTP/1.1); write pieces, then end (req is freed).
void gw_req_stream_begin(gw_req_t *req, int status, const char *content_type);
void gw_req_stream_write(gw_req_t *req, const char *data, size_t len);
void gw_req_stream_end(gw_req_t *req);

// OpenAI's error body: {"error":{"message","type","param","code"}}, type from the status.
// param and code may be NULL (JSON null). The caller frees the string.
char *gw_error_json(int status, const char *message, const char *param, const char *code);

#endif
