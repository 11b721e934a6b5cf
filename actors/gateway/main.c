// gateway — the HTTP front end: OpenAI completions and chat completions, SGLang's /generate,
// models and adapter admin (vLLM and SGLang names), /health and Prometheus /metrics, served by
// http.c on this actor's loop and translated by api.c into the client protocol
// (docs/client-protocol.md) spoken to the tokenizer. Holds no model state.
//
// Accepts: TextOut (the answers to its GenerateReqs), AdapterList, AdapterLoaded,
// AdapterUnloaded, TokenizeResp, Heartbeat (a ping to it, or the tokenizer's answer to its health ping),
// Metrics (answers to its GetMetrics), Error (a request refused upstream), PeerStatus (the
// launcher: readiness, and a tokenizer that went down), plus the lifecycle messages. Emits:
// GenerateReq, Abort (a client left, or the gateway stops), ListAdapters, LoadAdapter,
// UnloadAdapter, TokenizeReq, Heartbeat to the tokenizer; GetMetrics to every peer. Serves the
// playground page (playground.html, built into the binary) at GET /.
#include <ctype.h>
#include <errno.h>
#include <sys/stat.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "api.h"
#include "ls_base64.h"
#include "ls_file.h"
#include "http.h"
#include "prom.h"
#include "ls_actor.h"
#include "ls_limits.h"
#include "ls_series.h"

#define S_TOKENIZER "tokenizer"
#define S_STARTING "the graph is starting: not every actor is ready"  // /health's 503 until told more
#define S_HEALTH_MS 1000      // the tokenizer answers a ping this fast, or /health says 503
#define S_METRICS_MS 1000     // actors that have not answered GetMetrics by then are left out
#define S_LIST_MS 10000       // ListAdapters
#define S_ADAPTER_MS 300000   // the net for a load or unload answer lost upstream (503 outcome_unknown)
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

typedef enum { S_GEN, S_MODELS, S_LOAD, S_UNLOAD, S_HEALTH, S_METRICS, S_TOKENIZE } s_kind_t;

typedef struct s_call {
    s_kind_t kind;
    gw_req_t *req;
    int sglang;       // adapter admin: answer in SGLang's shape
    uint64_t *rids;   // upstream request ids: one per GenerateReq, or one per actor asked for metrics
    size_t nrids;
    size_t nopen;     // answers still awaited (generation: completions not finished)
    ls_timer_t *timer;
    char label[256];  // the model, for the log line and the metrics; a generation's tenant
    size_t tenant_held;  // completions counted against the tenant's share while the call lives
    // generation
    gw_gen_t gen;
    gw_choice_t *choices;
    int *prompt_open;  // per prompt: completions not finished
    char *sent;        // per choice: its first chunk went out
    char id[48];
    long created;
    int streaming;
    uint64_t start_ns;
    // metrics
    ls_msg_t *metrics;
    size_t nmetrics;
    // tokenize: the TokenizeReq, sent once the model it names is known to exist
    ls_msg_t tokenize;
    struct s_call *prev, *next;
} s_call_t;

typedef struct {
    uint64_t requests, prompt_tokens, completion_tokens;
} s_model_stat_t;

typedef struct {
    // flags
    char *host, *api_key, *api_key_file, *served_model_name, *model_path;
    int port, max_connections, max_header_bytes, max_body_bytes, idle_timeout_ms, request_timeout_ms;
    int max_request_completions, max_tenant_completions, metrics_max_adapters, max_lora_tensor_mb;
    // state
    ls_actor_t *self;
    gw_http_t *http;
    char base[256];  // the base model's name
    uint64_t next_rid;
    zhashx_t *by_rid;  // upstream rid -> s_call_t
    zhashx_t *tenants; // tenant (model name) -> completions in flight, as a pointer-sized count
    s_call_t *calls;
    int ncalls_gen;
    // readiness (/health): the launcher's last word on the graph (PeerStatus)
    int graph_ready;
    char graph_why[200];
    char id_prefix[12];
    char *model_info;    // GET /get_model_info's answer, from config.json read at start-up
    long unix_start;     // Unix time at start-up (recorded), for OpenAI's `created`
    uint64_t mono_start; // the event clock then
    // metrics
    uint64_t status_counts[600];
    ls_series_t *series;     // which models have series of their own (ls_series.h)
    s_model_stat_t *models;  // per series
} s_gw_t;

static s_gw_t s_g;

static void s_metrics_answer(s_call_t *c);

// OpenAI's `created` is Unix time, which the event clock is not: the wall clock read once at
// start-up (a recorded input) plus the event time since, so a replay computes the same.
static long s_unix_time(void) {
    return s_g.unix_start + (long)((ls_actor_now_ns(s_g.self) - s_g.mono_start) / 1000000000u);
}

// The same with the milliseconds since (the stamp of vllm:lora_requests_info, by which the
// endpoint picker orders answers, some less than a second apart).
static double s_unix_now(void) {
    return (double)s_g.unix_start + (double)((ls_actor_now_ns(s_g.self) - s_g.mono_start) / 1000000u) / 1e3;
}

// SGLang's GET /get_model_info from the model's config.json (empty when unreadable): the
// path, and what a client needs to make valid token ids and lengths without a tokenizer.
static void s_model_info_build(const char *config, size_t n) {
    cJSON *cfg = cJSON_ParseWithLength(config, n), *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_path", s_g.model_path ? s_g.model_path : "");
    cJSON_AddStringToObject(o, "tokenizer_path", s_g.model_path ? s_g.model_path : "");
    cJSON_AddBoolToObject(o, "is_generation", 1);
    const char *keys[][2] = {{"vocab_size", "vocab_size"}, {"max_position_embeddings", "max_context"}};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i][0]);
        if (cJSON_IsNumber(v))
            cJSON_AddNumberToObject(o, keys[i][1], v->valuedouble);
    }
    s_g.model_info = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    cJSON_Delete(cfg);
}

// config.json's bytes as a frame (empty when there is none, or it is not a file ls_file
// opens: a link out of the model directory, a FIFO, a device, a huge file).
static void s_add_model_config(zmsg_t *in) {
    size_t n = 0;
    char err[512];
    char *text = s_g.model_path ? ls_file_read(s_g.model_path, "config.json", LS_FILE_JSON, &n, err, sizeof err)
                                : NULL;
    if (s_g.model_path && !text && errno != ENOENT)
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
    s_g.unix_start = (long)now;
    s_g.mono_start = ls_actor_now_ns(a);
    snprintf(s_g.id_prefix, sizeof s_g.id_prefix, "%.*s", prefix ? (int)zframe_size(prefix) : 0,
             prefix ? (const char *)zframe_data(prefix) : "");
    zmsg_destroy(&in);
}

// ---------------------------------------------------------------------------------------------
// calls

static size_t s_rid_hash(const void *key) { return (size_t)(uintptr_t)key * 0x9E3779B97F4A7C15ull; }
static int s_rid_cmp(const void *a, const void *b) { return a == b ? 0 : (uintptr_t)a < (uintptr_t)b ? -1 : 1; }

static s_call_t *s_call_new(s_kind_t kind, gw_req_t *req) {
    s_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->kind = kind;
    c->req = req;
    c->start_ns = ls_actor_now_ns(s_g.self);
    gw_req_set_data(req, c);
    if (kind == S_GEN)
        s_g.ncalls_gen++;
    c->next = s_g.calls;
    if (s_g.calls)
        s_g.calls->prev = c;
    s_g.calls = c;
    return c;
}

static uint64_t s_call_rid(s_call_t *c) {
    uint64_t rid = s_g.next_rid++;
    uint64_t *r = realloc(c->rids, (c->nrids + 1) * sizeof *r);
    if (!r)
        return 0;
    c->rids = r;
    c->rids[c->nrids++] = rid;
    zhashx_insert(s_g.by_rid, (void *)(uintptr_t)rid, c);
    return rid;
}

// The completions in flight of a tenant; adding d (taken back: negative) to them.
static size_t s_tenant_add(const char *tenant, ptrdiff_t d) {
    size_t n = (size_t)(uintptr_t)zhashx_lookup(s_g.tenants, tenant) + (size_t)d;
    if (n)
        zhashx_update(s_g.tenants, tenant, (void *)(uintptr_t)n);
    else
        zhashx_delete(s_g.tenants, tenant);
    return n;
}

// The call an answer from upstream belongs to, or NULL. Our rids start at 1: a 0 answers nothing
// of ours (and would be a NULL key, which zhashx asserts on), so it is logged and dropped.
static s_call_t *s_call_of(const ls_in_t *in) {
    if (!in->msg->rid) {
        ls_warn(0, "%s with rid 0 from %s answers no request: dropped", ls_msg_type_name(in->msg->type), in->from);
        ls_actor_count(s_g.self, "answers_rid0", 1);
        return NULL;
    }
    return zhashx_lookup(s_g.by_rid, (void *)(uintptr_t)in->msg->rid);
}

static void s_call_free(s_call_t *c) {
    if (c->tenant_held)
        s_tenant_add(c->label, -(ptrdiff_t)c->tenant_held);
    for (size_t i = 0; i < c->nrids; i++)
        zhashx_delete(s_g.by_rid, (void *)(uintptr_t)c->rids[i]);
    if (c->timer)
        ls_actor_timer_stop(s_g.self, c->timer);
    if (c->req)
        gw_req_set_data(c->req, NULL);
    for (size_t i = 0; c->choices && i < c->gen.nreqs * (size_t)c->gen.n; i++)
        gw_choice_clear(&c->choices[i]);
    free(c->choices);
    free(c->prompt_open);
    free(c->sent);
    if (c->kind == S_GEN)
        s_g.ncalls_gen--;
    gw_gen_clear(&c->gen);
    for (size_t i = 0; i < c->nmetrics; i++)
        ls_msg_clear(&c->metrics[i]);
    ls_msg_clear(&c->tokenize);
    free(c->metrics);
    free(c->rids);
    if (c->prev)
        c->prev->next = c->next;
    else
        s_g.calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static void s_respond_json(gw_req_t *req, int status, const char *json) {
    gw_req_respond(req, status, "application/json", NULL, json, strlen(json));
}

static void s_respond_error(gw_req_t *req, int status, const char *message, const char *param, const char *code) {
    char *body = gw_error_json(status, message, param, code);
    const char *extra = status == 401                    ? "WWW-Authenticate: Bearer\r\n"
                        : status == 429 || status == 503 ? "Retry-After: " S_RETRY_AFTER_S "\r\n"
                                                         : NULL;
    gw_req_respond(req, status, "application/json", extra, body, strlen(body));
    free(body);
}

// The HTTP status for an ErrorCode from upstream.
static int s_status_of(uint32_t code) {
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

static void s_lower(char *out, size_t cap, const char *s) {
    size_t i = 0;
    for (; s && s[i] && i + 1 < cap; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[i] = 0;
}

// ---------------------------------------------------------------------------------------------
// metrics of the gateway itself

// Series i's counts into "other"'s: its model gave the series up (ls_series.h).
static void s_model_fold(int i) {
    s_model_stat_t *o = &s_g.models[LS_SERIES_OTHER];
    o->requests += s_g.models[i].requests;
    o->prompt_tokens += s_g.models[i].prompt_tokens;
    o->completion_tokens += s_g.models[i].completion_tokens;
    memset(&s_g.models[i], 0, sizeof s_g.models[i]);
}

// The counts of a model (the base's name, or an adapter's) that was answered: only then does it
// get a series, so a name nobody serves (404) never makes one.
static s_model_stat_t *s_model_stat(const char *name) {
    int fold, i = ls_series_take(s_g.series, strcmp(name, s_g.base) ? name : "", &fold);
    if (fold >= 0)
        s_model_fold(fold);
    return &s_g.models[i];
}

static void s_on_answered(int status, void *arg) {
    if (status >= 100 && status < 600)
        s_g.status_counts[status]++;
}

// ---------------------------------------------------------------------------------------------
// generation

static void s_send_abort(uint64_t rid, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = rid;
    m.u.abort.reason = ls_msg_strdup(why);
    m.u.abort.finish = LS_FINISH_REASON_ABORT;
    ls_actor_send_peer(s_g.self, S_TOKENIZER, &m, NULL);
    ls_msg_clear(&m);
}

// Stop every prompt still running upstream (its KV and adapter are released there).
static void s_abort_open(s_call_t *c, const char *why) {
    for (size_t p = 0; p < c->nrids; p++)
        if (c->prompt_open && c->prompt_open[p] > 0) {
            s_send_abort(c->rids[p], why);
            c->prompt_open[p] = 0;
        }
}

static void s_sse(gw_req_t *req, const char *json) {
    gw_buf_t b = {0};
    gw_buf_printf(&b, "data: %s\n\n", json);
    gw_req_stream_write(req, b.d, b.n);
    gw_buf_free(&b);
}

// End a generation with an error: a status while nothing was sent, else an error event in the
// stream (OpenAI's clients raise it) and its end.
static void s_gen_fail(s_call_t *c, int status, const char *message, const char *param, const char *code) {
    s_abort_open(c, "the request failed");
    if (c->streaming) {
        char *body = gw_error_json(status, message, param, code);
        s_sse(c->req, body);
        free(body);
        s_sse(c->req, "[DONE]");
        gw_req_stream_end(c->req);
    } else
        s_respond_error(c->req, status, message, param, code);
    c->req = NULL;
    s_call_free(c);
}

static void s_gen_done(s_call_t *c) {
    s_model_stat_t *m = s_model_stat(c->label);
    m->requests++;
    for (size_t i = 0; i < c->gen.nreqs * (size_t)c->gen.n; i++) {
        m->completion_tokens += c->choices[i].completion_tokens;
        if (i % (size_t)c->gen.n == 0)
            m->prompt_tokens += c->choices[i].prompt_tokens;
    }
    if (c->streaming) {
        if (c->gen.include_usage) {
            char *u = gw_answer_usage_chunk(&c->gen, c->id, c->created, c->choices);
            s_sse(c->req, u);
            free(u);
        }
        s_sse(c->req, "[DONE]");
        gw_req_stream_end(c->req);
    } else {
        char *body = gw_answer_json(&c->gen, c->id, c->created, c->choices);
        if (body)
            s_respond_json(c->req, 200, body);
        else
            s_respond_error(c->req, 500, "out of memory", NULL, NULL);
        free(body);
    }
    c->req = NULL;
    s_call_free(c);
}

static int s_on_text_out(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_text_out_t *t = &in->msg->u.text_out;
    s_call_t *c = s_call_of(in);
    if (!c || c->kind != S_GEN) {
        ls_actor_count(a, "text_out_stray", 1);  // its client left, or a late piece after a failure
        return 0;
    }
    size_t p = 0;
    while (p < c->nrids && c->rids[p] != in->msg->rid)
        p++;
    if (t->index >= (uint32_t)c->gen.n || c->prompt_open[p] <= 0) {
        ls_warn(in->msg->rid, "TextOut for completion %u of a request with n=%d (or after its end) ignored", t->index,
                c->gen.n);
        return 0;
    }
    if (t->finish == LS_FINISH_REASON_ERROR) {
        int status = s_status_of(t->error_code);
        char code[32];
        s_lower(code, sizeof code, ls_error_code_name(t->error_code));
        const char *param = NULL;
        if (t->error_code == LS_ERROR_CODE_NOT_FOUND) {
            param = c->gen.api == GW_GENERATE ? "lora_path" : "model";
            snprintf(code, sizeof code, "model_not_found");
        } else if (t->error_code == LS_ERROR_CODE_TOO_LARGE) {
            // A prompt (with max_tokens) beyond the context: 400 as OpenAI and vLLM answer it, the
            // code clients check. A body too large stays 413 (http.c, and an Error message).
            status = 400;
            param = c->gen.api == GW_CHAT ? "messages" : c->gen.api == GW_GENERATE ? "text" : "prompt";
            snprintf(code, sizeof code, "context_length_exceeded");
        } else if (t->error_code == LS_ERROR_CODE_BAD_REQUEST && c->gen.grammar_param && t->error &&
                   (!strncmp(t->error, "regex", 5) || !strncmp(t->error, "json_schema", 11)))
            param = c->gen.grammar_param;  // the tokenizer refused the structured output's source
        c->prompt_open[p]--;  // this one is over upstream
        s_gen_fail(c, status, t->error && *t->error ? t->error : "the request failed", param, code);
        return 0;
    }
    size_t ci = p * (size_t)c->gen.n + t->index;
    gw_choice_t *ch = &c->choices[ci];
    if (gw_choice_add(ch, t) < 0) {
        s_gen_fail(c, 500, "out of memory", NULL, NULL);
        return 0;
    }
    if (c->gen.stream) {
        if (!c->streaming) {
            gw_req_stream_begin(c->req, 200, "text/event-stream");
            c->streaming = 1;
        }
        // A piece with neither text nor an ending says nothing (a token held back by the
        // detokenizer); a chat choice's first chunk still carries the assistant role.
        int first = !c->sent[ci];
        if (t->text.len || t->finish != LS_FINISH_REASON_NONE || (first && c->gen.api == GW_CHAT)) {
            char *chunk = gw_answer_chunk(&c->gen, c->id, c->created, t->index + p * (size_t)c->gen.n, t, ch, first);
            if (chunk)
                s_sse(c->req, chunk);
            free(chunk);
            c->sent[ci] = 1;
        }
    }
    if (t->finish != LS_FINISH_REASON_NONE) {
        c->prompt_open[p]--;
        if (!--c->nopen)
            s_gen_done(c);
    }
    return 0;
}

static void s_gen_start(gw_req_t *req, gw_api_t api) {
    size_t len;
    const char *body = gw_req_body(req, &len);
    s_call_t *c = s_call_new(S_GEN, req);
    if (!c) {
        s_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    char err[256];
    const char *param;
    if (gw_gen_parse(&c->gen, api, body, len, s_g.base, err, sizeof err, &param) < 0) {
        const char *code = c->gen.err_code;  // a static string: it outlives c
        s_call_free(c);
        s_respond_error(req, 400, err, param, code);
        return;
    }
    // The request's fan-out and its tenant's share, before anything goes upstream.
    size_t total = c->gen.nreqs * (size_t)c->gen.n;
    const char *adapter = c->gen.reqs[0].u.generate_req.adapter;
    snprintf(c->label, sizeof c->label, "%s", adapter && *adapter ? adapter : s_g.base);
    gw_req_set_tag(req, c->label);
    if (total > (size_t)s_g.max_request_completions) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "the request asks for %zu completions (%zu prompts, n = %d); at most %d are served per request "
                 "(--max-request-completions)",
                 total, c->gen.nreqs, c->gen.n, s_g.max_request_completions);
        ls_warn(0, "refused a request for %s: %s", c->label, msg);
        const char *field = c->gen.n > 1 ? "n" : api == GW_GENERATE ? "text" : "prompt";
        s_call_free(c);
        s_respond_error(req, 400, msg, field, "too_many_completions");
        return;
    }
    size_t held = s_tenant_add(c->label, 0);
    if (held + total > (size_t)s_g.max_tenant_completions) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "model %s has %zu completions in flight; %zu more exceed its share of %d (--max-tenant-completions): "
                 "retry later",
                 c->label, held, total, s_g.max_tenant_completions);
        ls_warn(0, "refused a request: %s", msg);
        ls_actor_count(s_g.self, "tenant_refusals", 1);
        s_call_free(c);
        s_respond_error(req, 429, msg, NULL, "overloaded");
        return;
    }
    c->tenant_held = total;
    s_tenant_add(c->label, (ptrdiff_t)total);
    c->choices = calloc(total, sizeof *c->choices);
    c->prompt_open = calloc(c->gen.nreqs, sizeof *c->prompt_open);
    c->sent = calloc(total, 1);
    if (!c->choices || !c->prompt_open || !c->sent) {
        s_gen_fail(c, 500, "out of memory", NULL, NULL);
        return;
    }
    c->nopen = total;
    c->created = s_unix_time();
    snprintf(c->id, sizeof c->id, "%s-%s%llx", api == GW_CHAT ? "chatcmpl" : "cmpl", s_g.id_prefix,
             (unsigned long long)s_g.next_rid);
    for (size_t p = 0; p < c->gen.nreqs; p++) {
        ls_msg_t *m = &c->gen.reqs[p];
        m->rid = s_call_rid(c);
        m->u.generate_req.client_id = ls_msg_strdup(ls_actor_name(s_g.self));
        c->prompt_open[p] = c->gen.n;
        if (ls_actor_send_peer(s_g.self, S_TOKENIZER, m, NULL) < 0) {
            c->prompt_open[p] = 0;
            s_gen_fail(c, 503, "the tokenizer is unavailable", NULL, "unavailable");
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// models, adapters, health

// A load or unload that went upstream and whose answer will not come here (why): the registry
// goes on with it, so saying it failed could be false.
static void s_respond_outcome_unknown(s_call_t *c, const char *why) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s; the %s of adapter %s may still complete: GET /v1/models tells whether it did", why,
             c->kind == S_LOAD ? "load" : "unload", c->label);
    s_respond_error(c->req, 503, msg, "lora_name", "outcome_unknown");
}

static void s_admin_timeout_cb(ls_actor_t *a, ls_timer_t *timer, void *arg) {
    s_call_t *c = arg;
    c->timer = NULL;
    ls_actor_timer_stop(a, timer);
    if (c->kind == S_METRICS) {
        s_metrics_answer(c);  // with the actors that answered
        return;
    }
    if (c->req && (c->kind == S_LOAD || c->kind == S_UNLOAD)) {
        s_respond_outcome_unknown(c, "no answer from the graph in time");
        c->req = NULL;
    } else if (c->req) {
        const char *why = c->kind == S_HEALTH ? "the tokenizer does not answer" : "no answer from the graph in time";
        s_respond_error(c->req, c->kind == S_HEALTH ? 503 : 504, why, NULL, "timeout");
        c->req = NULL;
    }
    s_call_free(c);
}

// Send one admin message (and its bulk frames, or NULL) to the tokenizer for call c; -1
// (answered 503) when it cannot go.
static int s_admin_send(s_call_t *c, ls_msg_t *m, zmsg_t **bulk_p, int timeout_ms) {
    m->rid = s_call_rid(c);
    c->nopen = 1;
    if (c->timer)  // a call's second message (a tokenize after its model check) starts afresh
        ls_actor_timer_stop(s_g.self, c->timer);
    c->timer = ls_actor_timer_start(s_g.self, timeout_ms, 0, s_admin_timeout_cb, c);
    if (ls_actor_send_peer(s_g.self, S_TOKENIZER, m, bulk_p) < 0) {
        s_respond_error(c->req, 503, "the tokenizer is unavailable", NULL, "unavailable");
        c->req = NULL;
        s_call_free(c);
        return -1;
    }
    return 0;
}

static s_call_t *s_admin_answer(ls_in_t *in, s_kind_t kind) {
    s_call_t *c = s_call_of(in);
    return c && c->kind == kind ? c : NULL;
}

static void s_models_start(gw_req_t *req) {
    s_call_t *c = s_call_new(S_MODELS, req);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LIST_ADAPTERS);
    if (c)
        s_admin_send(c, &m, NULL, S_LIST_MS);
    else
        s_respond_error(req, 500, "out of memory", NULL, NULL);
    ls_msg_clear(&m);
}

static cJSON *s_model_entry(const char *id, const char *root, const char *parent, long created) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "model");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "owned_by", "loraserve");
    cJSON_AddStringToObject(o, "root", root);
    if (parent)
        cJSON_AddStringToObject(o, "parent", parent);
    else
        cJSON_AddNullToObject(o, "parent");
    return o;
}

// An adapter that requests may name: listed in /v1/models, tokenized by /tokenize.
static bool s_servable(const ls_msg_adapter_info_t *info) {
    return info->name && info->state != LS_ADAPTER_STATE_FAILED && info->state != LS_ADAPTER_STATE_UNLOADING;
}

static void s_tokenize_listed(s_call_t *c, const ls_msg_adapter_infos_t *list);

static int s_on_adapter_list(ls_actor_t *a, ls_in_t *in, void *state) {
    s_call_t *c = s_call_of(in);
    if (c && c->kind == S_TOKENIZE) {
        s_tokenize_listed(c, &in->msg->u.adapter_list.adapters);  // c may be gone after
        return 0;
    }
    if (!c || c->kind != S_MODELS)
        return 0;
    long now = s_unix_time();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data, s_model_entry(s_g.base, s_g.model_path ? s_g.model_path : s_g.base, NULL, now));
    const ls_msg_adapter_infos_t *list = &in->msg->u.adapter_list.adapters;
    for (size_t i = 0; i < list->n; i++) {
        const ls_msg_adapter_info_t *info = &list->v[i];
        if (!s_servable(info))
            continue;
        cJSON *e = s_model_entry(info->name, info->path ? info->path : info->name, s_g.base, now);
        cJSON_AddNumberToObject(e, "lora_rank", info->rank);
        cJSON_AddBoolToObject(e, "pinned", info->pinned);
        cJSON_AddItemToArray(data, e);
    }
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    s_respond_json(c->req, 200, body);
    free(body);
    c->req = NULL;
    s_call_free(c);
    return 0;
}

// Load and unload bodies, vLLM's and SGLang's alike: {"lora_name", "lora_path", "pinned"}, or
// for a load from tensors {"lora_name", "lora_config", "lora_tensors", "pinned"} (gw_tensors_parse).
static void s_adapter_start(gw_req_t *req, s_kind_t kind, int sglang) {
    size_t len;
    const char *body = gw_req_body(req, &len);
    cJSON *root = cJSON_ParseWithLength(body, len);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "lora_name");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(root, "lora_path");
    const cJSON *pinned = cJSON_GetObjectItemCaseSensitive(root, "pinned");
    const char *bad = NULL, *param = NULL, *code = NULL;
    char err[300];
    char *config = NULL;
    uint8_t *weights = NULL;
    size_t weights_len = 0;
    int tensors = 0;
    if (!root)
        bad = "the body is not valid JSON";
    else if (!cJSON_IsObject(root))
        bad = "the body must be a JSON object";
    else if (!cJSON_IsString(name) || !*name->valuestring)
        bad = "'lora_name' must be a non-empty string", param = "lora_name";
    else if (kind == S_LOAD && (tensors = gw_tensors_parse(root, (size_t)s_g.max_lora_tensor_mb << 20, &config, &weights,
                                                            &weights_len, err, sizeof err, &param, &code)) < 0)
        bad = err;
    else if (kind == S_LOAD && !tensors && (!cJSON_IsString(path) || !*path->valuestring))
        bad = "'lora_path' must be a non-empty string (or load from tensors: 'lora_config' and 'lora_tensors')",
        param = "lora_path";
    else if (pinned && !cJSON_IsBool(pinned) && !cJSON_IsNull(pinned))
        bad = "'pinned' must be a boolean", param = "pinned";
    if (bad) {
        cJSON_Delete(root);
        free(config);
        free(weights);
        s_respond_error(req, 400, bad, param, code);
        return;
    }
    gw_req_set_tag(req, name->valuestring);
    s_call_t *c = s_call_new(kind, req);
    if (!c) {
        cJSON_Delete(root);
        free(config);
        free(weights);
        s_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    c->sglang = sglang;
    snprintf(c->label, sizeof c->label, "%s", name->valuestring);
    ls_msg_t m;
    zmsg_t *bulk = NULL;
    if (kind == S_LOAD) {
        ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
        m.u.load_adapter.name = ls_msg_strdup(name->valuestring);
        m.u.load_adapter.pinned = cJSON_IsTrue(pinned);
        if (tensors) {  // the registry keeps the adapter as files (docs/adapters.md)
            m.u.load_adapter.from_tensors = true;
            m.u.load_adapter.config_json = ls_msg_strdup(config);
            bulk = zmsg_new();
            zmsg_addmem(bulk, weights, weights_len);
        } else
            m.u.load_adapter.path = ls_msg_strdup(path->valuestring);
    } else {
        ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
        m.u.unload_adapter.name = ls_msg_strdup(name->valuestring);
    }
    cJSON_Delete(root);
    free(config);
    free(weights);
    s_admin_send(c, &m, bulk ? &bulk : NULL, S_ADAPTER_MS);
    zmsg_destroy(&bulk);
    ls_msg_clear(&m);
}

static void s_adapter_done(s_call_t *c, bool ok, uint32_t code, const char *reason) {
    const char *verb = c->kind == S_LOAD ? "added" : "removed";
    int status = ok ? 200 : s_status_of(code);
    char msg[512];
    if (ok)
        snprintf(msg, sizeof msg, "Success: LoRA adapter '%s' %s successfully.", c->label, verb);
    else
        snprintf(msg, sizeof msg, "%s", reason && *reason ? reason : "the adapter request failed");
    if (c->sglang) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "success", ok);
        cJSON_AddStringToObject(o, "error_message", ok ? "" : msg);
        char *body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        s_respond_json(c->req, status, body);
        free(body);
    } else if (ok)
        gw_req_respond(c->req, 200, "text/plain; charset=utf-8", NULL, msg, strlen(msg));  // vLLM answers text
    else {
        char lc[32];
        s_lower(lc, sizeof lc, ls_error_code_name(code));
        s_respond_error(c->req, status, msg, "lora_name", lc[0] ? lc : NULL);
    }
    c->req = NULL;
    s_call_free(c);
}

static int s_on_adapter_loaded(ls_actor_t *a, ls_in_t *in, void *state) {
    s_call_t *c = s_admin_answer(in, S_LOAD);
    const ls_msg_adapter_loaded_t *r = &in->msg->u.adapter_loaded;
    if (c)
        s_adapter_done(c, r->ok, r->code, r->reason);
    return 0;
}

static int s_on_adapter_unloaded(ls_actor_t *a, ls_in_t *in, void *state) {
    s_call_t *c = s_admin_answer(in, S_UNLOAD);
    const ls_msg_adapter_unloaded_t *r = &in->msg->u.adapter_unloaded;
    int i = r->ok && c ? ls_series_drop(s_g.series, c->label) : -1;
    if (i >= 0)
        s_model_fold(i);  // an adapter gone keeps no series (ls_series.h)
    if (c)
        s_adapter_done(c, r->ok, r->code, r->reason);
    return 0;
}

// GET /health is readiness: 503 until the launcher says every actor is Ready (the workers only
// are once the model is loaded) and again while one is down; then the tokenizer must answer a
// ping. Without a launcher (an actor run by hand) the ping alone decides.
static void s_health_start(gw_req_t *req) {
    if (ls_actor_supervised(s_g.self) && !s_g.graph_ready) {
        char *body = gw_error_json(503, s_g.graph_why[0] ? s_g.graph_why : S_STARTING, NULL, "not_ready");
        gw_req_respond(req, 503, "application/json", "Retry-After: 1\r\n", body, strlen(body));
        free(body);
        return;
    }
    s_call_t *c = s_call_new(S_HEALTH, req);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_HEARTBEAT);
    m.u.heartbeat.actor = ls_msg_strdup(ls_actor_name(s_g.self));
    if (c)
        s_admin_send(c, &m, NULL, S_HEALTH_MS);
    else
        s_respond_error(req, 500, "out of memory", NULL, NULL);
    ls_msg_clear(&m);
}

// GET /health/live is liveness: this process and its loop run (no other actor is asked).
static void s_live_start(gw_req_t *req) { s_respond_json(req, 200, "{\"status\":\"alive\"}"); }

// The launcher's news of the graph: readiness follows it, and when the tokenizer went down
// every request waiting on it is answered now (it will not be by the restarted one).
static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    s_g.graph_ready = ps->graph_ready;
    if (!ps->up)
        snprintf(s_g.graph_why, sizeof s_g.graph_why, "%s is down and being restarted", ps->actor ? ps->actor : "an actor");
    else if (!ps->graph_ready)
        snprintf(s_g.graph_why, sizeof s_g.graph_why, S_STARTING);
    if (ps->up || !ps->actor || strcmp(ps->actor, S_TOKENIZER) != 0)
        return 0;
    const char *why = "the tokenizer went down and is being restarted; retry the request";
    for (s_call_t *c = s_g.calls, *next; c; c = next) {
        next = c->next;
        if (c->kind == S_METRICS)
            continue;  // asks every actor; its timer answers with those that replied
        if (c->kind == S_GEN && c->req)
            s_gen_fail(c, 503, why, NULL, "unavailable");
        else {
            if (c->req)
                s_respond_error(c->req, 503, why, NULL, "unavailable");
            c->req = NULL;
            s_call_free(c);
        }
    }
    return 0;
}

// A Heartbeat on the ROUTER is a ping to this actor (answered, as the runtime would); one on a
// DEALER is the tokenizer's answer to a health ping.
static int s_on_heartbeat(ls_actor_t *a, ls_in_t *in, void *state) {
    if (in->identity) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_HEARTBEAT);
        m.rid = in->msg->rid;
        m.u.heartbeat.actor = ls_msg_strdup(ls_actor_name(a));
        int rc = ls_actor_reply(a, in, &m);
        ls_msg_clear(&m);
        return rc;
    }
    s_call_t *c = s_admin_answer(in, S_HEALTH);
    if (c) {
        s_respond_json(c->req, 200, "{\"status\":\"ok\"}");
        c->req = NULL;
        s_call_free(c);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// /tokenize, /detokenize (vLLM's)

// The field a refusal of the tokenizer names: what it was given to read.
static const char *s_tokenize_param(const s_call_t *c) {
    const ls_msg_tokenize_req_t *q = &c->tokenize.u.tokenize_req;
    return q->detokenize ? "tokens" : q->chat ? "messages" : "prompt";
}

// The tokenizer is the base model's for every model name (adapters add no vocabulary), but an
// unknown name is a 404 as vLLM answers it: a name other than the base's is looked up first.
static void s_tokenize_start(gw_req_t *req, bool detokenize) {
    size_t len;
    const char *body = gw_req_body(req, &len);
    char err[256], *model;
    const char *param, *code;
    ls_msg_t m;
    if (gw_tokenize_parse(&m, detokenize, body, len, s_g.base, &model, err, sizeof err, &param, &code) < 0) {
        s_respond_error(req, 400, err, param, code);
        return;
    }
    gw_req_set_tag(req, model);
    s_call_t *c = s_call_new(S_TOKENIZE, req);
    if (!c) {
        free(model);
        ls_msg_clear(&m);
        s_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    snprintf(c->label, sizeof c->label, "%s", gw_adapter_of(model, s_g.base));
    free(model);
    c->tokenize = m;
    if (!c->label[0]) {
        s_admin_send(c, &c->tokenize, NULL, S_LIST_MS);
        return;
    }
    ls_msg_t list;
    ls_msg_init(&list, LS_MSG_LIST_ADAPTERS);
    s_admin_send(c, &list, NULL, S_LIST_MS);
    ls_msg_clear(&list);
}

static void s_tokenize_listed(s_call_t *c, const ls_msg_adapter_infos_t *list) {
    for (size_t i = 0; i < list->n; i++)
        if (s_servable(&list->v[i]) && !strcmp(list->v[i].name, c->label)) {
            s_admin_send(c, &c->tokenize, NULL, S_LIST_MS);
            return;
        }
    char msg[400];
    snprintf(msg, sizeof msg, "The model `%s` does not exist.", c->label);
    s_respond_error(c->req, 404, msg, "model", "model_not_found");
    c->req = NULL;
    s_call_free(c);
}

static int s_on_tokenize_resp(ls_actor_t *a, ls_in_t *in, void *state) {
    s_call_t *c = s_admin_answer(in, S_TOKENIZE);
    if (!c)
        return 0;
    const ls_msg_tokenize_req_t *q = &c->tokenize.u.tokenize_req;
    char *body = gw_tokenize_answer(&in->msg->u.tokenize_resp, q->detokenize, q->return_token_strs);
    if (body)
        s_respond_json(c->req, 200, body);
    else
        s_respond_error(c->req, 500, "the answer cannot be written as JSON (out of memory, or text not UTF-8)", NULL,
                        NULL);
    free(body);
    c->req = NULL;
    s_call_free(c);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// /metrics

static void s_metrics_start(gw_req_t *req) {
    s_call_t *c = s_call_new(S_METRICS, req);
    if (!c) {
        s_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    // Every actor the launcher named as a peer, by its name: with --dp-size the groups'
    // scheduler-G and worker-G-R answer each for itself (per-group series).
    int n = ls_actor_peer_count(s_g.self);
    c->metrics = calloc((size_t)n + 1, sizeof *c->metrics);
    for (int i = 0; i < n; i++) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_GET_METRICS);
        m.rid = s_call_rid(c);
        if (ls_actor_send_peer(s_g.self, ls_actor_peer_name(s_g.self, i), &m, NULL) == 0)
            c->nopen++;
        ls_msg_clear(&m);
    }
    c->timer = ls_actor_timer_start(s_g.self, S_METRICS_MS, 0, s_admin_timeout_cb, c);
    if (!c->nopen)
        s_metrics_answer(c);
}

static void s_metrics_answer(s_call_t *c) {
    gw_buf_t b = {0};
    gw_buf_printf(&b, "# HELP loraserve_gateway_http_responses_total HTTP answers by status code\n"
                      "# TYPE loraserve_gateway_http_responses_total counter\n");
    for (int s = 100; s < 600; s++)
        if (s_g.status_counts[s])
            gw_buf_printf(&b, "loraserve_gateway_http_responses_total{code=\"%d\"} %llu\n", s,
                          (unsigned long long)s_g.status_counts[s]);
    const char *per_model[][3] = {
        {"loraserve_gateway_requests_total", "generation requests answered, by model (base or adapter)", "r"},
        {"loraserve_gateway_prompt_tokens_total", "prompt tokens of finished requests by model", "p"},
        {"loraserve_gateway_generation_tokens_total", "generated tokens of finished requests by model", "g"},
    };
    for (int k = 0; k < 3; k++) {
        gw_buf_printf(&b, "# HELP %s %s\n# TYPE %s counter\n", per_model[k][0], per_model[k][1], per_model[k][0]);
        for (int i = 0; i < ls_series_slots(s_g.series); i++) {
            const s_model_stat_t *m = &s_g.models[i];
            const char *name = ls_series_name(s_g.series, i);
            if (!name || !m->requests)
                continue;
            uint64_t v = k == 0 ? m->requests : k == 1 ? m->prompt_tokens : m->completion_tokens;
            gw_buf_printf(&b, "%s{model=\"", per_model[k][0]);
            gw_prom_label(&b, *name ? name : s_g.base);
            gw_buf_printf(&b, "\"} %llu\n", (unsigned long long)v);
        }
    }
    gw_buf_printf(&b,
                  "# HELP loraserve_gateway_http_connections open HTTP connections\n# TYPE loraserve_gateway_http_connections gauge\n"
                  "loraserve_gateway_http_connections %d\n"
                  "# HELP loraserve_gateway_requests_running generation requests in flight\n"
                  "# TYPE loraserve_gateway_requests_running gauge\nloraserve_gateway_requests_running %d\n",
                  s_g.http ? gw_http_connections(s_g.http) : 0, s_g.ncalls_gen);
    // Every other actor's counters as it reported them, then the inference gateway's series.
    gw_prom_actors(&b, c->metrics, c->nmetrics);
    gw_prom_histograms(&b, c->metrics, c->nmetrics, s_g.base);
    gw_prom_epp(&b, c->metrics, c->nmetrics, s_unix_now());
    if (c->req)
        gw_req_respond(c->req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.d, b.n);
    c->req = NULL;
    gw_buf_free(&b);
    s_call_free(c);
}

static int s_on_metrics(ls_actor_t *a, ls_in_t *in, void *state) {
    s_call_t *c = s_admin_answer(in, S_METRICS);
    if (!c)
        return 0;
    zhashx_delete(s_g.by_rid, (void *)(uintptr_t)in->msg->rid);  // one answer per actor
    memcpy(&c->metrics[c->nmetrics++], in->msg, sizeof *in->msg);
    ls_msg_init(in->msg, LS_MSG_METRICS);  // moved out
    if (!--c->nopen)
        s_metrics_answer(c);
    return 0;
}

// An upstream refusal of one of our messages (e.g. a tokenizer that does not serve it).
static int s_on_error(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_error_t *e = &in->msg->u.error;
    s_call_t *c = s_call_of(in);
    ls_warn(in->msg->rid, "Error from %s: %s: %s", in->from, ls_error_code_name(e->code) ? ls_error_code_name(e->code) : "?",
            e->message ? e->message : "");
    if (!c)
        return 0;
    char msg[512], code[32];
    if (e->code == LS_ERROR_CODE_OUTCOME_UNKNOWN)  // not a refusal: it may have taken effect
        snprintf(msg, sizeof msg, "%s", e->message ? e->message : "the outcome is unknown");
    else
        snprintf(msg, sizeof msg, "%s refused the request: %s", in->from, e->message ? e->message : "no reason given");
    s_lower(code, sizeof code, ls_error_code_name(e->code));
    int status = s_status_of(e->code);
    if (c->kind == S_GEN) {
        size_t p = 0;
        while (p < c->nrids && c->rids[p] != in->msg->rid)
            p++;
        if (p < c->nrids)
            c->prompt_open[p] = 0;  // nothing runs upstream for it
        s_gen_fail(c, status, msg, NULL, code[0] ? code : NULL);
    } else if (c->kind == S_METRICS) {
        zhashx_delete(s_g.by_rid, (void *)(uintptr_t)in->msg->rid);
        if (!--c->nopen)
            s_metrics_answer(c);
    } else {
        const char *param = c->kind == S_TOKENIZE && status == 400 ? s_tokenize_param(c) : NULL;
        if (c->req)
            s_respond_error(c->req, c->kind == S_HEALTH ? 503 : status, msg, param, code[0] ? code : NULL);
        c->req = NULL;
        s_call_free(c);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// HTTP

typedef struct {
    const char *method, *path;
    void (*fn)(gw_req_t *req);
    int tensors;  // takes an adapter's safetensors in its body (a load from tensors)
} s_route_t;

static void s_completions(gw_req_t *r) { s_gen_start(r, GW_COMPLETIONS); }
static void s_chat(gw_req_t *r) { s_gen_start(r, GW_CHAT); }
static void s_generate(gw_req_t *r) { s_gen_start(r, GW_GENERATE); }
static void s_load_vllm(gw_req_t *r) { s_adapter_start(r, S_LOAD, 0); }
static void s_unload_vllm(gw_req_t *r) { s_adapter_start(r, S_UNLOAD, 0); }
static void s_load_sglang(gw_req_t *r) { s_adapter_start(r, S_LOAD, 1); }
static void s_unload_sglang(gw_req_t *r) { s_adapter_start(r, S_UNLOAD, 1); }
static void s_tokenize(gw_req_t *r) { s_tokenize_start(r, false); }
static void s_detokenize(gw_req_t *r) { s_tokenize_start(r, true); }
static void s_playground(gw_req_t *r) {
    gw_req_respond(r, 200, "text/html; charset=utf-8", S_PAGE_HEADERS, (const char *)gw_playground_page,
                   gw_playground_page_len);
}
static void s_model_info(gw_req_t *r) { s_respond_json(r, 200, s_g.model_info ? s_g.model_info : "{}"); }

static const s_route_t s_routes[] = {
    {"GET", "/", s_playground, 0},
    {"POST", "/v1/completions", s_completions, 0},
    {"POST", "/v1/chat/completions", s_chat, 0},
    {"POST", "/generate", s_generate, 0},
    {"GET", "/v1/models", s_models_start, 0},
    {"GET", "/get_model_info", s_model_info, 0},
    {"POST", "/tokenize", s_tokenize, 0},
    {"POST", "/detokenize", s_detokenize, 0},
    {"POST", "/v1/load_lora_adapter", s_load_vllm, 1},
    {"POST", "/v1/unload_lora_adapter", s_unload_vllm, 0},
    {"POST", "/load_lora_adapter", s_load_sglang, 1},
    {"POST", "/load_lora_adapter_from_tensors", s_load_sglang, 1},  // SGLang's name for loads from tensors
    {"POST", "/unload_lora_adapter", s_unload_sglang, 0},
    {"GET", "/health", s_health_start, 0},
    {"GET", "/health/live", s_live_start, 0},
    {"GET", "/metrics", s_metrics_start, 0},
};

// Every body may hold --max-body-bytes; a load route's may hold an adapter's safetensors in
// base64 besides (--max-lora-tensor-mb), so the one limit on those is also where the body
// limit comes from.
static size_t s_body_limit(const char *method, const char *path, void *arg) {
    size_t limit = (size_t)s_g.max_body_bytes;
    for (size_t i = 0; i < sizeof s_routes / sizeof *s_routes; i++)
        if (s_routes[i].tensors && !strcmp(s_routes[i].method, method) && !strcmp(s_routes[i].path, path))
            limit += ls_base64_encoded_len((size_t)s_g.max_lora_tensor_mb << 20);
    return limit;
}

// Constant-time, so the key cannot be guessed byte by byte from answer times.
static int s_key_ok(const char *auth) {
    static const char prefix[] = "Bearer ";
    if (!auth || strncmp(auth, prefix, sizeof prefix - 1))
        return 0;
    const char *given = auth + sizeof prefix - 1;
    size_t n = strlen(s_g.api_key), m = strlen(given);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)s_g.api_key[i] ^ (unsigned char)(i < m ? given[i] : 0);
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
    if (s_g.api_key && *s_g.api_key && !open_path && !s_key_ok(gw_req_header(req, "Authorization"))) {
        s_respond_error(req, 401, "Incorrect API key provided", NULL, "invalid_api_key");
        return;
    }
    if (route) {
        route->fn(req);
        return;
    }
    char msg[300];
    snprintf(msg, sizeof msg, path_known ? "%s is not allowed on %s" : "no endpoint %s %s", method, path);
    s_respond_error(req, path_known ? 405 : 404, msg, NULL, NULL);
}

// The client left before its answer ended: stop what runs for it upstream.
static void s_on_gone(gw_req_t *req, void *arg) {
    s_call_t *c = gw_req_data(req);
    if (!c)
        return;
    c->req = NULL;
    if (c->kind == S_GEN) {
        ls_actor_count(s_g.self, "clients_gone", 1);
        s_abort_open(c, "the HTTP client disconnected");
    }
    s_call_free(c);
}

// ---------------------------------------------------------------------------------------------
// lifecycle

// The API key from --api-key-file (its first line) or LORASERVE_API_KEY, which ps does not
// show, or --api-key, which it does. At most one of them. -1 (logged) on a bad setting.
static int s_api_key_resolve(void) {
    const char *env = getenv("LORASERVE_API_KEY");
    int given = (s_g.api_key != NULL) + (s_g.api_key_file != NULL) + (env && *env);
    if (given > 1) {
        ls_error(0, "give one of --api-key, --api-key-file and LORASERVE_API_KEY");
        return -1;
    }
    if (env && *env)
        s_g.api_key = strdup(env);
    if (!s_g.api_key_file)
        return 0;
    struct stat st;
    FILE *f = fopen(s_g.api_key_file, "r");
    char line[4096] = "";
    if (!f || fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || !fgets(line, sizeof line, f)) {
        ls_error(0, "--api-key-file %s: cannot read a key from it", s_g.api_key_file);
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    if (st.st_mode & 077)
        ls_warn(0, "--api-key-file %s is readable by other users (mode %03o); chmod 600 it", s_g.api_key_file,
                st.st_mode & 0777);
    line[strcspn(line, "\r\n")] = 0;
    if (!*line) {
        ls_error(0, "--api-key-file %s: the first line is empty", s_g.api_key_file);
        return -1;
    }
    s_g.api_key = strdup(line);
    return s_g.api_key ? 0 : -1;
}

static int s_on_start(ls_actor_t *a, void *state) {
    s_g.self = a;
    if (s_api_key_resolve() < 0)
        return -1;
    s_g.next_rid = 1;
    if (s_g.metrics_max_adapters < 0) {
        ls_error(0, "--metrics-max-adapters must be 0 or more");
        return -1;
    }
    if (!(s_g.series = ls_series_new(s_g.metrics_max_adapters)) ||
        !(s_g.models = calloc((size_t)ls_series_slots(s_g.series), sizeof *s_g.models))) {
        ls_error(0, "out of memory");
        return -1;
    }
    s_start_inputs(a);
    if (s_g.served_model_name && *s_g.served_model_name)
        snprintf(s_g.base, sizeof s_g.base, "%s", s_g.served_model_name);
    else if (s_g.model_path && *s_g.model_path) {
        // The model directory's name, as vLLM and SGLang name a model served from a path.
        char path[sizeof s_g.base];
        snprintf(path, sizeof path, "%s", s_g.model_path);
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            path[--n] = 0;
        const char *slash = strrchr(path, '/');
        snprintf(s_g.base, sizeof s_g.base, "%s", slash ? slash + 1 : path);
    } else
        snprintf(s_g.base, sizeof s_g.base, "default");
    if (s_g.max_connections < 1 || s_g.max_header_bytes < 256 || s_g.max_body_bytes < 1 || s_g.idle_timeout_ms < 1 ||
        s_g.request_timeout_ms < 1 || s_g.port < 0 || s_g.port > 65535 || s_g.max_request_completions < 1 ||
        s_g.max_tenant_completions < s_g.max_request_completions || s_g.max_lora_tensor_mb < 1 ||
        s_g.max_lora_tensor_mb > LS_MAX_LORA_TENSOR_MB_CAP) {
        ls_error(0, "--port must be 0..65535; --max-connections, --max-body-bytes, --max-request-completions and the "
                    "timeouts above 0; --max-header-bytes at least 256; --max-tenant-completions at least "
                    "--max-request-completions; --max-lora-tensor-mb 1.." LS_LIMITS_STR(LS_MAX_LORA_TENSOR_MB_CAP));
        return -1;
    }
    if (!ls_actor_has_peer(a, S_TOKENIZER)) {
        ls_error(0, "no --peer %s=ENDPOINT: the gateway has no one to send requests to", S_TOKENIZER);
        return -1;
    }
    s_g.by_rid = zhashx_new();
    zhashx_set_key_hasher(s_g.by_rid, s_rid_hash);
    zhashx_set_key_comparator(s_g.by_rid, s_rid_cmp);
    zhashx_set_key_duplicator(s_g.by_rid, NULL);
    zhashx_set_key_destructor(s_g.by_rid, NULL);
    s_g.tenants = zhashx_new();  // string keys, copied; the counts are not pointers
    gw_http_limits_t lim = {s_g.max_connections, s_g.max_header_bytes, s_g.max_body_bytes, s_g.idle_timeout_ms,
                            s_g.request_timeout_ms};
    gw_http_cbs_t cbs = {.request = s_on_request, .gone = s_on_gone, .answered = s_on_answered,
                         .body_limit = s_body_limit};
    s_g.http = gw_http_new(a, s_g.host, s_g.port, &lim, &cbs);
    if (!s_g.http)
        return -1;
    ls_info(0, "listening on http://%s:%d (model %s%s)", s_g.host, gw_http_port(s_g.http), s_g.base,
            s_g.api_key && *s_g.api_key ? ", API key required" : "");
    return 0;
}

// Answer every open request and stop what runs upstream for it, while the sockets still work.
static void s_on_shutdown(ls_actor_t *a, void *state) {
    while (s_g.calls) {
        s_call_t *c = s_g.calls;
        if (c->kind == S_GEN && c->req)
            s_gen_fail(c, 503, "the server is shutting down", NULL, "shutting_down");
        else {
            if (c->kind == S_GEN)
                s_abort_open(c, "the gateway is stopping");
            if (c->req && (c->kind == S_LOAD || c->kind == S_UNLOAD)) {
                s_respond_outcome_unknown(c, "the gateway is stopping before the registry answered");
            } else if (c->req)
                s_respond_error(c->req, 503, "the server is shutting down", NULL, "shutting_down");
            c->req = NULL;
            s_call_free(c);
        }
    }
}

static void s_on_destroy(ls_actor_t *a, void *state) {
    gw_http_destroy(&s_g.http);
    free(s_g.model_info);
    s_g.model_info = NULL;
    zhashx_destroy(&s_g.by_rid);
    zhashx_destroy(&s_g.tenants);
    ls_series_destroy(&s_g.series);
    free(s_g.models);
    s_g.models = NULL;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_TEXT_OUT, s_on_text_out},
    {LS_MSG_ADAPTER_LIST, s_on_adapter_list},
    {LS_MSG_ADAPTER_LOADED, s_on_adapter_loaded},
    {LS_MSG_ADAPTER_UNLOADED, s_on_adapter_unloaded},
    {LS_MSG_HEARTBEAT, s_on_heartbeat},
    {LS_MSG_TOKENIZE_RESP, s_on_tokenize_resp},
    {LS_MSG_METRICS, s_on_metrics},
    {LS_MSG_ERROR, s_on_error},
    {0, NULL},
};

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_INT("port", &s_g.port, "30000", "HTTP port (0: any free port, logged)"),
        LS_FLAG_STR("host", &s_g.host, "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
        LS_FLAG_STR("api-key", &s_g.api_key, NULL,
                    "require Authorization: Bearer KEY on every endpoint but /health and the page at / (visible in ps: prefer "
                    "--api-key-file or the LORASERVE_API_KEY environment variable)"),
        LS_FLAG_STR("api-key-file", &s_g.api_key_file, NULL, "the API key is this file's first line"),
        LS_FLAG_STR("served-model-name", &s_g.served_model_name, NULL, "the base model's name (default: --model-path's basename)"),
        LS_FLAG_STR("model-path", &s_g.model_path, NULL, "the base model's directory (its name in the APIs)"),
        LS_FLAG_INT("max-connections", &s_g.max_connections, "1024", "open HTTP connections; more are answered 503"),
        LS_FLAG_INT("max-header-bytes", &s_g.max_header_bytes, "32768", "request line and headers; more is answered 431"),
        LS_FLAG_INT("max-body-bytes", &s_g.max_body_bytes, "16777216", "request body; more is answered 413"),
        LS_FLAG_INT("idle-timeout-ms", &s_g.idle_timeout_ms, "60000", "a silent connection is closed (408 mid-request)"),
        LS_FLAG_INT("request-timeout-ms", &s_g.request_timeout_ms, "30000", "a request must arrive whole within this (408)"),
        LS_FLAG_INT("max-request-completions", &s_g.max_request_completions, "256",
                    "completions one generation request may ask for (prompts x n); more is answered 400"),
        LS_FLAG_INT("max-tenant-completions", &s_g.max_tenant_completions, "1024",
                    "completions in flight for one model (adapter or base); more is answered 429"),
        LS_METRICS_MAX_ADAPTERS_FLAG(&s_g.metrics_max_adapters),
        LS_MAX_LORA_TENSOR_MB_FLAG(&s_g.max_lora_tensor_mb),
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
