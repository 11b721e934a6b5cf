// gateway — the HTTP front end: OpenAI completions and chat completions, SGLang's /generate,
// models and adapter admin (vLLM and SGLang names), /health and Prometheus /metrics, served by
// http.c on this actor's loop and translated by api_req.c and api_resp.c into the client protocol
// (docs/client-protocol.md) spoken to the tokenizer. Holds no model state.
//
// Accepts: TextOut (the answers to its GenerateReqs), AdapterList, AdapterLoaded,
// AdapterUnloaded, TokenizeResp, Heartbeat (a ping to it, or the tokenizer's answer to its health ping),
// Metrics (answers to its GetMetrics), Error (a request refused upstream), PeerStatus (the
// launcher: readiness, and a tokenizer that went down), plus the lifecycle messages. Emits:
// GenerateReq, Abort (a client left, or the gateway stops), ListAdapters, LoadAdapter,
// UnloadAdapter, TokenizeReq, Heartbeat to the tokenizer; GetMetrics to every peer. Serves the
// playground page (playground.html, built into the binary) at GET /.
//
// Its rooms, which share gateway_impl.h: this file holds the flags, start-up and shutdown, the
// calls (what a request is while upstream works on it), the route table and the dispatch;
// gen.c the generation calls (GenerateReq out, TextOut in, the SSE stream, aborts); admin.c
// models and adapter admin, /health, /tokenize and /detokenize, /metrics and the answers to
// its GetMetrics.
#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "gateway_impl.h"
#include "ls_base64.h"
#include "ls_file.h"
#include "ls_limits.h"

#define S_RETRY_AFTER_S "1"   // a 429's or 503's Retry-After: queues here drain in steps of tens of ms
// The playground page's headers: it may run its own inline script and style and talk to this
// origin, nothing else (no external asset, no framing, no form posts elsewhere); the browser
// must not sniff another type into it.
#define S_PAGE_HEADERS                                                                                     \
    "Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " \
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n"  \
    "X-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n"      \
    "Cache-Control: no-cache\r\n"

// playground.html's bytes, built in by embed.cmake.
extern const unsigned char gw_playground_page[];
extern const size_t gw_playground_page_len;

gw_state_t gw_state;

// OpenAI's `created` is Unix time, which the event clock is not: the wall clock read once at
// start-up (a recorded input) plus the event time since, so a replay computes the same.
long gw_unix_time(void) {
    return gw_state.unix_start + (long)((ls_actor_now_ns(gw_state.self) - gw_state.mono_start) / 1000000000u);
}

// The same with the milliseconds since (the stamp of vllm:lora_requests_info, by which the
// endpoint picker orders answers, some less than a second apart).
double gw_unix_now(void) {
    return (double)gw_state.unix_start +
           (double)((ls_actor_now_ns(gw_state.self) - gw_state.mono_start) / 1000000u) / 1e3;
}

// SGLang's GET /get_model_info from the model's config.json (empty when unreadable): the
// path, and what a client needs to make valid token ids and lengths without a tokenizer.
static void s_model_info_build(const char *config, size_t n) {
    cJSON *cfg = cJSON_ParseWithLength(config, n), *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", gw_state.model_path ? gw_state.model_path : "");
    cJSON_AddStringToObject(o, "tokenizer_path", gw_state.model_path ? gw_state.model_path : "");
    cJSON_AddBoolToObject(o, "is_generation", 1);
    const char *keys[][2] = {{"vocab_size", "vocab_size"}, {"max_position_embeddings", "max_context"}};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i][0]);
        if (cJSON_IsNumber(v))
            cJSON_AddNumberToObject(o, keys[i][1], v->valuedouble);
    }
    gw_state.model_info = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(cfg);
}

// config.json's bytes as a frame (empty when there is none, or it is not a file ls_file
// opens: a link out of the model directory, a FIFO, a device, a huge file).
static void s_add_model_config(zmsg_t *in) {
    size_t n = 0;
    char err[512];
    char *text = gw_state.model_path
                     ? ls_file_read(gw_state.model_path, "config.json", LS_FILE_JSON, &n, err, sizeof err)
                     : NULL;
    if (gw_state.model_path && !text && errno != ENOENT)
        ls_warn(0, "model info without config.json: %s", err);
    zmsg_addmem(in, text, text ? n : 0);
    free(text);
}

// What start-up takes from outside its messages, through the trace: the wall clock, the
// prefix that makes answer ids unique across runs (it mixes in the pid), the model's config.json.
static void s_start_inputs(ls_actor_t *a) {
    zmsg_t *in = zmsg_new();
    if (!ls_actor_replaying(a)) {
        uint64_t now = (uint64_t)time(NULL);
        char prefix[12];
        snprintf(prefix, sizeof prefix, "%08x", (unsigned)(getpid() ^ (unsigned)now));
        zmsg_addmem(in, &now, sizeof now);
        zmsg_addstr(in, prefix);
        s_add_model_config(in);
    }
    ls_actor_input(a, "gateway.start", &in);
    zframe_t *clock = zmsg_first(in), *prefix = zmsg_next(in), *config = zmsg_next(in);
    s_model_info_build(config ? (const char *)zframe_data(config) : "", config ? zframe_size(config) : 0);
    uint64_t now = 0;
    if (clock && zframe_size(clock) == sizeof now)
        memcpy(&now, zframe_data(clock), sizeof now);
    gw_state.unix_start = (long)now;
    gw_state.mono_start = ls_actor_now_ns(a);
    snprintf(gw_state.id_prefix, sizeof gw_state.id_prefix, "%.*s", prefix ? (int)zframe_size(prefix) : 0,
             prefix ? (const char *)zframe_data(prefix) : "");
    zmsg_destroy(&in);
}

// ---------------------------------------------------------------------------------------------
// calls

static size_t s_rid_hash(const void *key) { return (size_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull; }
static int s_rid_cmp(const void *a, const void *b) { return a == b ? 0 : (uintptr_t)a < (uintptr_t)b ? -1 : 1; }

gw_call_t *gw_call_new(gw_call_kind_t kind, gw_req_t *req) {
    gw_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = kind;
    c->req = req;
    c->start_ns = ls_actor_now_ns(gw_state.self);
    gw_req_set_data(req, c);
    if (kind == GW_CALL_GEN)
        gw_state.ncalls_gen++;
    c->next = gw_state.calls;
    if (gw_state.calls)
        gw_state.calls->prev = c;
    gw_state.calls = c;
    return c;
}

uint64_t gw_call_rid(gw_call_t *c) {
    uint64_t rid = gw_state.next_rid++;
    uint64_t *r = realloc(c->rids, (c->nrids + 1) * sizeof *r);
    if (!r)
        return 0;
    c->rids = r;
    c->rids[c->nrids++] = rid;
    zhashx_insert(gw_state.by_rid, (void *)(uintptr_t)rid, c);
    return rid;
}

// The completions in flight of a tenant; adding d (taken back: negative) to them.
size_t gw_tenant_add(const char *tenant, ptrdiff_t d) {
    size_t n = (size_t)(uintptr_t)zhashx_lookup(gw_state.tenants, tenant) + (size_t)d;
    if (n)
        zhashx_update(gw_state.tenants, tenant, (void *)(uintptr_t)n);
    else
        zhashx_delete(gw_state.tenants, tenant);
    return n;
}

// The call an answer from upstream belongs to, or NULL. Our rids start at 1: a 0 answers nothing
// of ours (and would be a NULL key, which zhashx asserts on), so it is logged and dropped.
gw_call_t *gw_call_of(const ls_in_t *in) {
    if (!in->msg->rid) {
        ls_warn(0, "%s with rid 0 from %s answers no request: dropped", ls_msg_type_name(in->msg->type), in->from);
        ls_actor_count(gw_state.self, "answers_rid0", 1);
        return NULL;
    }
    return zhashx_lookup(gw_state.by_rid, (void *)(uintptr_t)in->msg->rid);
}

void gw_call_free(gw_call_t *c) {
    if (c->tenant_held)
        gw_tenant_add(c->label, -(ptrdiff_t)c->tenant_held);
    for (size_t i = 0; i < c->nrids; i++)
        zhashx_delete(gw_state.by_rid, (void *)(uintptr_t)c->rids[i]);
    if (c->timer)
        ls_actor_timer_stop(gw_state.self, c->timer);
    if (c->req)
        gw_req_set_data(c->req, NULL);
    for (size_t i = 0; c->choices && i < c->gen.nreqs * (size_t)c->gen.n; i++)
        gw_choice_clear(&c->choices[i]);
    free(c->choices);
    free(c->prompt_open);
    free(c->sent);
    if (c->kind == GW_CALL_GEN)
        gw_state.ncalls_gen--;
    gw_gen_clear(&c->gen);
    for (size_t i = 0; i < c->nmetrics; i++)
        ls_msg_clear(&c->metrics[i]);
    ls_msg_clear(&c->tokenize);
    free(c->metrics);
    free(c->rids);
    if (c->prev)
        c->prev->next = c->next;
    else
        gw_state.calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

void gw_respond_json(gw_req_t *req, int status, const char *json) {
    gw_req_respond(req, status, "application/json", NULL, json, strlen(json));
}

void gw_respond_error(gw_req_t *req, int status, const char *message, const char *param, const char *code) {
    char *body = gw_error_json(status, message, param, code);
    const char *extra = status == 401                    ? "WWW-Authenticate: Bearer\r\n"
                        : status == 429 || status == 503 ? "Retry-After: " S_RETRY_AFTER_S "\r\n"
                                                         : NULL;
    gw_req_respond(req, status, "application/json", extra, body, strlen(body));
    free(body);
}

// The HTTP status for an ErrorCode from upstream.
int gw_status_of(uint32_t code) {
    switch (code) {
    case LS_ERROR_CODE_BAD_REQUEST:
    case LS_ERROR_CODE_MALFORMED: return 400;
    case LS_ERROR_CODE_NOT_FOUND: return 404;
    case LS_ERROR_CODE_TOO_LARGE: return 413;
    case LS_ERROR_CODE_OVERLOADED: return 429;   // a queue is full: this client, slow down
    case LS_ERROR_CODE_TIMEOUT: return 504;
    case LS_ERROR_CODE_UNAVAILABLE:              // the server cannot now (a peer down, no room)
    case LS_ERROR_CODE_UNKNOWN_TYPE:             // the graph does not serve this (yet)
    case LS_ERROR_CODE_SHUTTING_DOWN:
    case LS_ERROR_CODE_OUTCOME_UNKNOWN: return 503;  // a load or unload may have taken effect: not a 5xx "failed"
    default: return 500;
    }
}

void gw_lower(char *out, size_t cap, const char *s) {
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[i] = 0;
}


static void s_on_answered(int status, void *arg) {
    if (status >= 100 && status < 600)
        gw_state.status_counts[status]++;
}

// ---------------------------------------------------------------------------------------------
// HTTP

typedef struct {
    const char *method, *path;
    void (*fn)(gw_req_t *req);
    int tensors;  // takes an adapter's safetensors in its body (a load from tensors)
} s_route_t;

static void s_completions(gw_req_t *r) { gw_gen_start(r, GW_COMPLETIONS); }
static void s_chat(gw_req_t *r) { gw_gen_start(r, GW_CHAT); }
static void s_generate(gw_req_t *r) { gw_gen_start(r, GW_GENERATE); }
static void s_load_vllm(gw_req_t *r) { gw_adapter_start(r, GW_CALL_LOAD, 0); }
static void s_unload_vllm(gw_req_t *r) { gw_adapter_start(r, GW_CALL_UNLOAD, 0); }
static void s_load_sglang(gw_req_t *r) { gw_adapter_start(r, GW_CALL_LOAD, 1); }
static void s_unload_sglang(gw_req_t *r) { gw_adapter_start(r, GW_CALL_UNLOAD, 1); }
static void s_tokenize(gw_req_t *r) { gw_tokenize_start(r, false); }
static void s_detokenize(gw_req_t *r) { gw_tokenize_start(r, true); }
static void s_playground(gw_req_t *r) {
    gw_req_respond(r, 200, "text/html; charset=utf-8", S_PAGE_HEADERS, (const char *)gw_playground_page,
                   gw_playground_page_len);
}
static void s_model_info(gw_req_t *r) { gw_respond_json(r, 200, gw_state.model_info ? gw_state.model_info : "{}"); }

static const s_route_t s_routes[] = {
    {"GET", "/", s_playground, 0},
    {"POST", "/v1/completions", s_completions, 0},
    {"POST", "/v1/chat/completions", s_chat, 0},
    {"POST", "/generate", s_generate, 0},
    {"GET", "/v1/models", gw_models_start, 0},
    {"GET", "/get_model_info", s_model_info, 0},
    {"POST", "/tokenize", s_tokenize, 0},
    {"POST", "/detokenize", s_detokenize, 0},
    {"POST", "/v1/load_lora_adapter", s_load_vllm, 1},
    {"POST", "/v1/unload_lora_adapter", s_unload_vllm, 0},
    {"POST", "/load_lora_adapter", s_load_sglang, 1},
    {"POST", "/load_lora_adapter_from_tensors", s_load_sglang, 1},  // SGLang's name for loads from tensors
    {"POST", "/unload_lora_adapter", s_unload_sglang, 0},
    {"GET", "/health", gw_health_start, 0},
    {"GET", "/health/live", gw_live_start, 0},
    {"GET", "/metrics", gw_metrics_start, 0},
};

// Every body may hold --max-body-bytes; a load route's may hold an adapter's safetensors in
// base64 besides (--max-lora-tensor-mb), so the one limit on those is also where the body
// limit comes from.
static size_t s_body_limit(const char *method, const char *path, void *arg) {
    size_t limit = (size_t)gw_state.max_body_bytes;
    for (size_t i = 0; i < sizeof s_routes / sizeof *s_routes; i++)
        if (s_routes[i].tensors && !strcmp(s_routes[i].method, method) && !strcmp(s_routes[i].path, path))
            limit += ls_base64_encoded_len((size_t)gw_state.max_lora_tensor_mb << 20);
    return limit;
}

// Constant-time, so the key cannot be guessed byte by byte from answer times.
static int s_key_ok(const char *auth) {
    static const char prefix[] = "Bearer ";
    if (!auth || strncmp(auth, prefix, sizeof prefix - 1))
        return 0;
    const char *given = auth + sizeof prefix - 1;
    size_t n = strlen(gw_state.api_key), m = strlen(given);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)gw_state.api_key[i] ^ (unsigned char)(i < m ? given[i] : 0);
    return diff == 0;
}

static void s_on_request(gw_req_t *req, void *arg) {
    const char *path = gw_req_path(req), *method = gw_req_method(req);
    const s_route_t *route = NULL;
    int path_known = 0;
    for (size_t i = 0; i < sizeof s_routes / sizeof *s_routes; i++)
        if (!strcmp(s_routes[i].path, path)) {
            path_known = 1;
            if (!strcmp(s_routes[i].method, method))
                route = &s_routes[i];
        }
    // Probes carry no key. Nor can a browser's visit to the playground page: the page holds no
    // secret and asks for the key, which every call it makes then carries.
    int open_path = !strcmp(path, "/health") || !strcmp(path, "/health/live") || !strcmp(path, "/");
    if (gw_state.api_key && *gw_state.api_key && !open_path && !s_key_ok(gw_req_header(req, "Authorization"))) {
        gw_respond_error(req, 401, "Incorrect API key provided", NULL, "invalid_api_key");
        return;
    }
    if (route) {
        route->fn(req);
        return;
    }
    char msg[300];
    snprintf(msg, sizeof msg, path_known ? "%s is not allowed on %s" : "no endpoint %s %s", method, path);
    gw_respond_error(req, path_known ? 405 : 404, msg, NULL, NULL);
}

// The client left before its answer ended: stop what runs for it upstream.
static void s_on_gone(gw_req_t *req, void *arg) {
    gw_call_t *c = gw_req_data(req);
    if (!c)
        return;
    c->req = NULL;
    if (c->kind == GW_CALL_GEN) {
        ls_actor_count(gw_state.self, "clients_gone", 1);
        gw_abort_open(c, "the HTTP client disconnected");
    }
    gw_call_free(c);
}

// ---------------------------------------------------------------------------------------------
// lifecycle

// The API key from --api-key-file (its first line) or LORASERVE_API_KEY, which ps does not
// show, or --api-key, which it does. At most one of them. -1 (logged) on a bad setting.
static int s_api_key_resolve(void) {
    const char *env = getenv("LORASERVE_API_KEY");
    int given = (gw_state.api_key != NULL) + (gw_state.api_key_file != NULL) + (env && *env);
    if (given > 1) {
        ls_error(0, "give one of --api-key, --api-key-file and LORASERVE_API_KEY");
        return -1;
    }
    if (env && *env)
        gw_state.api_key = strdup(env);
    if (!gw_state.api_key_file)
        return 0;
    struct stat st;
    FILE *f = fopen(gw_state.api_key_file, "r");
    char line[4096] = "";
    if (!f || fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || !fgets(line, sizeof line, f)) {
        ls_error(0, "--api-key-file %s: cannot read a key from it", gw_state.api_key_file);
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    if (st.st_mode & 077)
        ls_warn(0, "--api-key-file %s is readable by other users (mode %03o); chmod 600 it", gw_state.api_key_file,
                st.st_mode & 0777);
    line[strcspn(line, "\r\n")] = 0;
    if (!*line) {
        ls_error(0, "--api-key-file %s: the first line is empty", gw_state.api_key_file);
        return -1;
    }
    gw_state.api_key = strdup(line);
    return gw_state.api_key ? 0 : -1;
}

static int s_on_start(ls_actor_t *a, void *state) {
    gw_state.self = a;
    if (s_api_key_resolve() < 0)
        return -1;
    gw_state.next_rid = 1;
    if (gw_state.metrics_max_adapters < 0) {
        ls_error(0, "--metrics-max-adapters must be 0 or more");
        return -1;
    }
    if (!(gw_state.series = ls_series_new(gw_state.metrics_max_adapters)) ||
        !(gw_state.models = calloc((size_t)ls_series_slots(gw_state.series), sizeof *gw_state.models))) {
        ls_error(0, "out of memory");
        return -1;
    }
    s_start_inputs(a);
    if (gw_state.served_model_name && *gw_state.served_model_name)
        snprintf(gw_state.base, sizeof gw_state.base, "%s", gw_state.served_model_name);
    else if (gw_state.model_path && *gw_state.model_path) {
        // The model directory's name, as vLLM and SGLang name a model served from a path.
        char path[sizeof gw_state.base];
        snprintf(path, sizeof path, "%s", gw_state.model_path);
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            path[--n] = 0;
        const char *slash = strrchr(path, '/');
        snprintf(gw_state.base, sizeof gw_state.base, "%s", slash ? slash + 1 : path);
    } else
        snprintf(gw_state.base, sizeof gw_state.base, "default");
    if (gw_state.max_connections < 1 || gw_state.max_header_bytes < 256 || gw_state.max_body_bytes < 1 ||
        gw_state.idle_timeout_ms < 1 || gw_state.request_timeout_ms < 1 || gw_state.port < 0 || gw_state.port > 65535 ||
        gw_state.max_request_completions < 1 || gw_state.max_tenant_completions < gw_state.max_request_completions || gw_state.max_lora_tensor_mb < 1 ||
        gw_state.max_lora_tensor_mb > LS_MAX_LORA_TENSOR_MB_CAP) {
        ls_error(0, "--port must be 0..65535; --max-connections, --max-body-bytes, --max-request-completions and the "
                    "timeouts above 0; --max-header-bytes at least 256; --max-tenant-completions at least "
                    "--max-request-completions; --max-lora-tensor-mb 1.." LS_LIMITS_STR(LS_MAX_LORA_TENSOR_MB_CAP));
        return -1;
    }
    if (!ls_actor_has_peer(a, GW_TOKENIZER)) {
        ls_error(0, "no --peer %s=ENDPOINT: the gateway has no one to send requests to", GW_TOKENIZER);
        return -1;
    }
    gw_state.by_rid = zhashx_new();
    zhashx_set_key_hasher(gw_state.by_rid, s_rid_hash);
    zhashx_set_key_comparator(gw_state.by_rid, s_rid_cmp);
    zhashx_set_key_duplicator(gw_state.by_rid, NULL);
    zhashx_set_key_destructor(gw_state.by_rid, NULL);
    gw_state.tenants = zhashx_new();  // string keys, copied; the counts are not pointers
    gw_http_limits_t lim = {gw_state.max_connections, gw_state.max_header_bytes, gw_state.max_body_bytes,
                            gw_state.idle_timeout_ms, gw_state.request_timeout_ms};
    gw_http_cbs_t cbs = {.request = s_on_request, .gone = s_on_gone, .answered = s_on_answered,
                         .body_limit = s_body_limit};
    gw_state.http = gw_http_new(a, gw_state.host, gw_state.port, &lim, &cbs);
    if (!gw_state.http)
        return -1;
    ls_info(0, "listening on http://%s:%d (model %s%s)", gw_state.host, gw_http_port(gw_state.http), gw_state.base,
            gw_state.api_key && *gw_state.api_key ? ", API key required" : "");
    return 0;
}

// Answer every open request and stop what runs upstream for it, while the sockets still work.
static void s_on_shutdown(ls_actor_t *a, void *state) {
    while (gw_state.calls) {
        gw_call_t *c = gw_state.calls;
        if (c->kind == GW_CALL_GEN && c->req)
            gw_gen_fail(c, 503, "the server is shutting down", NULL, "shutting_down");
        else {
            if (c->kind == GW_CALL_GEN)
                gw_abort_open(c, "the gateway is stopping");
            if (c->req && (c->kind == GW_CALL_LOAD || c->kind == GW_CALL_UNLOAD)) {
                gw_respond_outcome_unknown(c, "the gateway is stopping before the registry answered");
            } else if (c->req)
                gw_respond_error(c->req, 503, "the server is shutting down", NULL, "shutting_down");
            c->req = NULL;
            gw_call_free(c);
        }
    }
}

static void s_on_destroy(ls_actor_t *a, void *state) {
    gw_http_destroy(&gw_state.http);
    free(gw_state.model_info);
    gw_state.model_info = NULL;
    zhashx_destroy(&gw_state.by_rid);
    zhashx_destroy(&gw_state.tenants);
    ls_series_destroy(&gw_state.series);
    free(gw_state.models);
    gw_state.models = NULL;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, gw_on_peer_status},
    {LS_MSG_TEXT_OUT, gw_on_text_out},
    {LS_MSG_ADAPTER_LIST, gw_on_adapter_list},
    {LS_MSG_ADAPTER_LOADED, gw_on_adapter_loaded},
    {LS_MSG_ADAPTER_UNLOADED, gw_on_adapter_unloaded},
    {LS_MSG_HEARTBEAT, gw_on_heartbeat},
    {LS_MSG_TOKENIZE_RESP, gw_on_tokenize_resp},
    {LS_MSG_METRICS, gw_on_metrics},
    {LS_MSG_ERROR, gw_on_error},
    {0, NULL},
};

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_INT("port", &gw_state.port, "30000", "HTTP port (0: any free port, logged)"),
        LS_FLAG_STR("host", &gw_state.host, "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
        LS_FLAG_STR("api-key", &gw_state.api_key, NULL,
                    "require Authorization: Bearer KEY on every endpoint but /health and the page at / (visible in ps: prefer "
                    "--api-key-file or the LORASERVE_API_KEY environment variable)"),
        LS_FLAG_STR("api-key-file", &gw_state.api_key_file, NULL, "the API key is this file's first line"),
        LS_FLAG_STR("served-model-name", &gw_state.served_model_name, NULL, "the base model's name (default: --model-path's basename)"),
        LS_FLAG_STR("model-path", &gw_state.model_path, NULL, "the base model's directory (its name in the APIs)"),
        LS_FLAG_INT("max-connections", &gw_state.max_connections, "1024", "open HTTP connections; more are answered 503"),
        LS_FLAG_INT("max-header-bytes", &gw_state.max_header_bytes, "32768", "request line and headers; more is answered 431"),
        LS_FLAG_INT("max-body-bytes", &gw_state.max_body_bytes, "16777216", "request body; more is answered 413"),
        LS_FLAG_INT("idle-timeout-ms", &gw_state.idle_timeout_ms, "60000", "a silent connection is closed (408 mid-request)"),
        LS_FLAG_INT("request-timeout-ms", &gw_state.request_timeout_ms, "30000", "a request must arrive whole within this (408)"),
        LS_FLAG_INT("max-request-completions", &gw_state.max_request_completions, "256",
                    "completions one generation request may ask for (prompts x n); more is answered 400"),
        LS_FLAG_INT("max-tenant-completions", &gw_state.max_tenant_completions, "1024",
                    "completions in flight for one model (adapter or base); more is answered 429"),
        LS_METRICS_MAX_ADAPTERS_FLAG(&gw_state.metrics_max_adapters),
        LS_MAX_LORA_TENSOR_MB_FLAG(&gw_state.max_lora_tensor_mb),
        LS_FLAG_END,
    };
    const ls_actor_def_t def = {
        .name = "gateway",
        .about = "loraserve HTTP gateway: OpenAI and SGLang APIs, adapter admin, /health, /metrics",
        .dispatch = s_dispatch,
        .flags = flags,
        .on_start = s_on_start,
        .on_shutdown = s_on_shutdown,
        .on_destroy = s_on_destroy,
    };
    return ls_actor_main(argc, argv, &def);
}
