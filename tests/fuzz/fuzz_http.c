/*  fuzz_http.c — libFuzzer target for the gateway's HTTP request path: raw bytes from one
    client through the HTTP server (actors/gateway/http.c, on fake_actor.c instead of sockets),
    each complete request routed as the gateway routes a generation request: its body through
    gw_gen_parse by path, answered whole, as a stream, or held until the client leaves.

    The first byte sets the chunk size the bytes arrive in (so every split point of a request
    is tried) and how requests are answered; the rest is what the client sends. After the
    bytes, pending timers fire (idle and request timeouts), then the client leaves.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "fake_actor.h"
#include "http.h"
#include "ls_log.h"

static int s_mode; // how to answer: 0 whole, 1 stream, 2 hold
static gw_req_t *s_held;

static void s_request(gw_req_t *req, void *arg) {
    (void)arg;
    const char *path = gw_req_path(req), *method = gw_req_method(req);
    gw_req_header(req, "Content-Type");
    gw_req_set_tag(req, gw_req_header(req, "X-Model") ? gw_req_header(req, "X-Model") : "");
    static const struct {
        const char *path;
        gw_api_t api;
    } routes[] = {
        {"/v1/completions", GW_COMPLETIONS},
        {"/v1/chat/completions", GW_CHAT},
        {"/generate", GW_GENERATE},
    };
    int status = 404;
    char err[256] = "no such route";
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        if (strcmp(path, routes[i].path) || strcmp(method, "POST"))
            continue;
        size_t len;
        const char *body = gw_req_body(req, &len);
        gw_gen_t g;
        const char *param;
        status = gw_gen_parse(&g, routes[i].api, body ? body : "", len, "demo", err, sizeof err, &param)
                     ? 400
                     : 200;
        for (size_t k = 0; status == 200 && k < g.nreqs; k++) {
            char *buf;
            size_t n;
            if (ls_msg_encode(&g.reqs[k], &buf, &n) == 0)
                free(buf);
        }
        gw_gen_clear(&g);
    }
    if (s_mode == 2 && !s_held) {
        s_held = req;
        return;
    }
    char *json = gw_error_json(status, err, NULL, NULL);
    if (s_mode == 1) {
        gw_req_stream_begin(req, status, "text/event-stream");
        gw_req_stream_write(req, json, strlen(json));
        gw_req_stream_end(req);
    } else
        gw_req_respond(req, status, "application/json", NULL, json, strlen(json));
    free(json);
}

static void s_gone(gw_req_t *req, void *arg) {
    (void)arg;
    if (req == s_held)
        s_held = NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int initialized;
    if (!initialized) {
        ls_log_init("fuzz", LS_LOG_ERROR);
        initialized = 1;
    }
    if (size < 1)
        return 0;
    size_t chunk = 1 + data[0] % 64;
    s_mode = data[0] / 64 % 3;
    s_held = NULL;
    gw_http_limits_t lim = {.max_connections = 4,
                            .max_header_bytes = 2048,
                            .max_body_bytes = 4096,
                            .idle_timeout_ms = 1000,
                            .request_timeout_ms = 2000};
    gw_http_cbs_t cbs = {.request = s_request, .gone = s_gone};
    gw_http_t *srv = gw_http_new(NULL, "127.0.0.1", 0, &lim, &cbs);
    if (!srv)
        abort();
    ls_stream_t *s = fake_actor_open();
    int closed = 0;
    for (size_t at = 1; at < size && !closed; at += chunk) {
        size_t n = size - at < chunk ? size - at : chunk;
        closed = fake_actor_data(s, (const char *)data + at, n);
        //  a held request is answered once the rest of its chunk is in; pipelined input follows
        if (s_held && at + n >= size / 2) {
            gw_req_t *req = s_held;
            s_held = NULL;
            gw_req_respond(req, 200, "text/plain", NULL, "ok", 2);
        }
        while (fake_actor_run_timer(0))
            ;
    }
    for (int i = 0; i < 8 && fake_actor_run_timer(1e9); i++)
        ;
    fake_actor_gone(s);
    gw_http_destroy(&srv);
    return 0;
}
