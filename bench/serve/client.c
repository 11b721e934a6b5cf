// The load generator's HTTP engine. One loop: start every request whose arrival time has come
// (while the concurrency cap allows), wait in epoll for sockets, the next arrival or libcurl's
// timer, let libcurl move the bytes of the sockets that are ready (its socket interface: a
// wake-up costs the ready sockets, not every stream, as curl_multi_perform would), parse what
// arrived at once with the time it arrived, collect finished transfers. Transfers and their
// easy handles are pooled, and the multi handle keeps connections alive, so a run of thousands
// of requests opens about as many connections as requests ever ran at once.
#include "client.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "grow.h"

#define S_MAX_EVENT (64u << 20)   // one SSE event; a cumulative /generate event of 1M ids fits
#define S_MAX_BODY (256u << 20)   // one non-streamed answer or error body
#define S_TICK_MS 100             // progress and idle wake-up period
#define S_EVENTS 256              // epoll events taken per wake-up
#define S_PROBE_TIMEOUT_MS 60000  // the GETs around the run (/metrics waits on every actor)

static int s_buf_str(bs_buf_t *b, const char *s) { return bs_buf_add(b, s, strlen(s)); }

static int s_buf_uint(bs_buf_t *b, unsigned long long v) {
    char tmp[24];
    int i = sizeof tmp;
    do
        tmp[--i] = (char)('0' + v % 10);
    while (v /= 10);
    return bs_buf_add(b, tmp + i, sizeof tmp - (size_t)i);
}

// A JSON string literal with its escapes.
static int s_buf_json_str(bs_buf_t *b, const char *s) {
    int rc = bs_buf_add(b, "\"", 1);
    for (const char *p = s; *p && !rc; p++) {
        unsigned char ch = (unsigned char)*p;
        char esc[8];
        if (ch == '"' || ch == '\\')
            esc[0] = '\\', esc[1] = (char)ch, rc = bs_buf_add(b, esc, 2);
        else if (ch < 0x20)
            rc = bs_buf_add(b, esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", ch));
        else
            rc = bs_buf_add(b, p, 1);
    }
    return rc ? rc : bs_buf_add(b, "\"", 1);
}

static uint64_t s_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void bs_result_clear(bs_result_t *r) {
    free(r->itl_ms);
    free(r->err_msg);
    free(r->output_ids);
    free(r->text);
    *r = (bs_result_t){0};
}

typedef struct {
    bs_client_t *c;
    CURL *easy;
    bs_sse_t *sse;
    char errbuf[CURL_ERROR_SIZE];
    bs_buf_t body, resp, last_event, text;
    bs_result_t *res;
    uint64_t send_ns, now_ns, first_ns, last_chunk_ns, last_data_ns;
    long long tokens;  // generate: completion tokens seen so far
    long status;
    int done, finished;
    size_t itl_cap;
} s_xfer_t;

struct bs_client_t {
    bs_client_cfg_t cfg;
    char *url;  // the generation endpoint
    struct curl_slist *headers, *get_headers;
    CURLM *multi;
    int ep;                 // epoll set of the multi handle's sockets
    uint64_t curl_due_ns;   // when libcurl wants its timeout action (0: never)
    CURL *probe;
    s_xfer_t **pool;
    size_t npool, cappool;
    uint64_t t0;
};

static void s_fail(bs_result_t *r, const char *kind, const char *msg) {
    if (r->err_kind[0])
        return;  // the first error says what went wrong
    snprintf(r->err_kind, sizeof r->err_kind, "%s", kind);
    free(r->err_msg);
    r->err_msg = strdup(msg && *msg ? msg : kind);
}

static void s_xfer_destroy(s_xfer_t **px) {
    s_xfer_t *x = *px;
    if (!x)
        return;
    if (x->easy)
        curl_easy_cleanup(x->easy);
    bs_sse_destroy(&x->sse);
    free(x->body.d);
    free(x->resp.d);
    free(x->last_event.d);
    free(x->text.d);
    free(x);
    *px = NULL;
}

// A token-bearing event at x->now_ns: the first token's time, or one inter-token gap.
static void s_xfer_tokens(s_xfer_t *x) {
    bs_result_t *r = x->res;
    if (!x->first_ns)
        x->first_ns = x->now_ns;
    else {
        if (bs_grow(&r->itl_ms, &x->itl_cap, r->nitl + 1, sizeof *r->itl_ms) < 0) {
            s_fail(r, "transport", "out of memory");
            return;
        }
        r->itl_ms[r->nitl++] = (double)(x->now_ns - x->last_chunk_ns) / 1e6;
    }
    x->last_chunk_ns = x->now_ns;
    r->chunks++;
}

static void s_xfer_counts(s_xfer_t *x, const bs_chunk_t *ch) {
    if (ch->completion_tokens >= 0)
        x->res->output_tokens = ch->completion_tokens;
    if (ch->prompt_tokens >= 0)
        x->res->prompt_tokens = ch->prompt_tokens;
}

static void s_error_message(s_xfer_t *x, const bs_chunk_t *ch, const char *kind) {
    char *msg = bs_json_string_dup(ch->message);
    s_fail(x->res, kind, msg ? msg : "the server sent an error");
    free(msg);
}

static int s_on_event(void *arg, const char *data, size_t n) {
    s_xfer_t *x = arg;
    bs_chunk_t ch;
    bs_api_t api = x->c->cfg.api;
    if (bs_chunk_parse(api, data, n, &ch) < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "an event that is not a %s chunk: %.100s", api == BS_API_GENERATE ? "/generate" : "completion",
                 data);
        s_fail(x->res, "stream_error", msg);
        return 1;
    }
    if (ch.done) {
        x->done = 1;
        return 0;
    }
    if (ch.error) {
        s_error_message(x, &ch, "stream_error");
        return 0;  // the server ends the stream itself ([DONE])
    }
    s_xfer_counts(x, &ch);
    x->finished |= ch.finished;
    if (api == BS_API_GENERATE) {
        if (ch.completion_tokens > x->tokens) {
            x->tokens = ch.completion_tokens;
            s_xfer_tokens(x);
        }
        // Cumulative: the last event holds the whole answer.
        if (x->c->cfg.save_outputs) {
            x->last_event.n = 0;
            if (bs_buf_add(&x->last_event, data, n) < 0)
                return 1;
        }
    } else if (bs_chunk_has_text(&ch)) {
        s_xfer_tokens(x);
        if (x->c->cfg.save_outputs) {
            char *piece = bs_json_string_dup(ch.text);
            int rc = piece ? s_buf_str(&x->text, piece) : -1;
            free(piece);
            if (rc < 0)
                return 1;
        }
    }
    return 0;
}

static size_t s_on_data(char *p, size_t size, size_t nmemb, void *arg) {
    s_xfer_t *x = arg;
    size_t n = size * nmemb;
    x->now_ns = x->last_data_ns = s_now_ns();
    if (!x->status)
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status == 200 && x->c->cfg.stream) {
        if (bs_sse_feed(x->sse, p, n, s_on_event, x) < 0) {
            s_fail(x->res, "stream_error", "the stream broke off: an event over the size limit, or out of memory");
            return 0;  // stops the transfer
        }
        return n;
    }
    if (x->resp.n + n > S_MAX_BODY || bs_buf_add(&x->resp, p, n) < 0) {
        s_fail(x->res, "bad_response", "the answer is over the size limit");
        return 0;
    }
    return n;
}

// The generated ids and text of a /generate answer (the last event, or the whole body).
static void s_save_generate(bs_result_t *r, const char *json, size_t n) {
    cJSON *o = cJSON_ParseWithLength(json, n);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "output_ids");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
    int nids = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
    if (nids > 0 && (r->output_ids = malloc((size_t)nids * sizeof *r->output_ids))) {
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) r->output_ids[r->noutput_ids++] = (uint32_t)id->valuedouble;
    }
    if (cJSON_IsString(text))
        r->text = strdup(text->valuestring);
    cJSON_Delete(o);
}

// A whole (non-streamed) answer.
static void s_xfer_body(s_xfer_t *x) {
    bs_chunk_t ch;
    bs_result_t *r = x->res;
    if (bs_chunk_parse(x->c->cfg.api, x->resp.d ? x->resp.d : "", x->resp.n, &ch) < 0 || ch.done) {
        char msg[160];
        snprintf(msg, sizeof msg, "an answer that is not JSON of the API's shape: %.100s", x->resp.d ? x->resp.d : "");
        s_fail(r, "bad_response", msg);
        return;
    }
    if (ch.error) {
        s_error_message(x, &ch, "stream_error");
        return;
    }
    s_xfer_counts(x, &ch);
    x->first_ns = x->last_chunk_ns = x->last_data_ns;
    r->chunks = 1;
    if (!x->c->cfg.save_outputs)
        return;
    if (x->c->cfg.api == BS_API_GENERATE)
        s_save_generate(r, x->resp.d, x->resp.n);
    else
        r->text = bs_json_string_dup(ch.text);
}

static void s_xfer_done(bs_client_t *c, s_xfer_t *x, CURLcode rc) {
    bs_result_t *r = x->res;
    uint64_t end = x->last_data_ns ? x->last_data_ns : s_now_ns();
    if (!x->status)
        curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
    if (rc != CURLE_OK) {
        const char *kind = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ? "connect"
                           : rc == CURLE_OPERATION_TIMEDOUT                                ? "timeout"
                                                                                           : "transport";
        s_fail(r, kind, x->errbuf[0] ? x->errbuf : curl_easy_strerror(rc));
    } else if (x->status != 200) {
        char kind[24], *msg = NULL;
        bs_chunk_t ch;
        snprintf(kind, sizeof kind, "http_%ld", x->status);
        if (x->resp.n && !bs_chunk_parse(c->cfg.api, x->resp.d, x->resp.n, &ch) && ch.error)
            msg = bs_json_string_dup(ch.message);
        if (!msg) {
            char raw[160];
            snprintf(raw, sizeof raw, "HTTP %ld: %.120s", x->status, x->resp.d ? x->resp.d : "");
            msg = strdup(raw);
        }
        s_fail(r, kind, msg);
        free(msg);
    } else if (c->cfg.stream) {
        x->now_ns = end;
        if (bs_sse_finish(x->sse, s_on_event, x) < 0)
            s_fail(r, "stream_error", "the stream's last event could not be read");
        if (!x->done && !x->finished)
            s_fail(r, "stream_error", "the stream ended before the answer did (no finish_reason, no [DONE])");
        if (c->cfg.save_outputs && c->cfg.api == BS_API_GENERATE && x->last_event.n)
            s_save_generate(r, x->last_event.d, x->last_event.n);
        else if (c->cfg.save_outputs && x->text.d)
            r->text = strdup(x->text.d);
    } else
        s_xfer_body(x);
    r->e2e_ms = (double)(end - x->send_ns) / 1e6;
    r->ttft_ms = x->first_ns ? (double)(x->first_ns - x->send_ns) / 1e6 : -1;
    if (!r->err_kind[0] && r->output_tokens < 0)
        r->output_tokens = (long long)r->chunks;  // the server gave no count: one token per chunk
    if (!r->err_kind[0] && r->ttft_ms < 0 && r->output_tokens > 0)
        s_fail(r, "stream_error", "tokens were counted but none was streamed");
    r->ok = !r->err_kind[0];
}

// The request's body: SGLang's /generate with input_ids (or text) and lora_path, or OpenAI's
// completions with the prompt as token ids and the adapter as the model.
static int s_body(bs_client_t *c, bs_buf_t *b, const bs_req_t *req, const char *adapter) {
    const bs_client_cfg_t *cfg = &c->cfg;
    int gen = cfg->api == BS_API_GENERATE, rc = 0;
    b->n = 0;
    if (req->text) {
        rc |= s_buf_str(b, gen ? "{\"text\":" : "{\"prompt\":");
        rc |= s_buf_json_str(b, req->text);
    } else {
        rc |= s_buf_str(b, gen ? "{\"input_ids\":[" : "{\"prompt\":[");
        for (size_t i = 0; i < req->nids && !rc; i++) {
            if (i)
                rc |= bs_buf_add(b, ",", 1);
            rc |= s_buf_uint(b, req->ids[i]);
        }
        rc |= bs_buf_add(b, "]", 1);
    }
    int constrained = req->constrained && (cfg->json_schema || cfg->regex);
    const char *ignore_eos = cfg->ignore_eos && !constrained ? "true" : "false";
    if (gen) {
        rc |= s_buf_str(b, ",\"sampling_params\":{\"max_new_tokens\":");
        rc |= s_buf_uint(b, (unsigned)req->output_len);
        rc |= s_buf_str(b, ",\"temperature\":0,\"ignore_eos\":");
        rc |= s_buf_str(b, ignore_eos);
        // SGLang's fields: json_schema as a JSON string, regex
        if (constrained) {
            rc |= s_buf_str(b, cfg->json_schema ? ",\"json_schema\":" : ",\"regex\":");
            rc |= s_buf_json_str(b, cfg->json_schema ? cfg->json_schema : cfg->regex);
        }
        rc |= s_buf_str(b, "},\"lora_path\":");
        rc |= adapter ? s_buf_json_str(b, adapter) : s_buf_str(b, "null");
        rc |= s_buf_str(b, cfg->stream ? ",\"stream\":true}" : ",\"stream\":false}");
    } else {
        rc |= s_buf_str(b, ",\"model\":");
        rc |= s_buf_json_str(b, adapter ? adapter : cfg->model ? cfg->model : "");
        rc |= s_buf_str(b, ",\"max_tokens\":");
        rc |= s_buf_uint(b, (unsigned)req->output_len);
        rc |= s_buf_str(b, ",\"temperature\":0,\"ignore_eos\":");
        rc |= s_buf_str(b, ignore_eos);
        // OpenAI's response_format for a schema, vLLM's guided_regex for a regex
        if (constrained && cfg->json_schema) {
            rc |= s_buf_str(b, ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"bench\",\"schema\":");
            rc |= s_buf_str(b, cfg->json_schema);
            rc |= s_buf_str(b, "}}");
        } else if (constrained) {
            rc |= s_buf_str(b, ",\"guided_regex\":");
            rc |= s_buf_json_str(b, cfg->regex);
        }
        rc |= s_buf_str(b, cfg->stream ? ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
                                       : ",\"stream\":false}");
    }
    return rc ? -1 : 0;
}

static s_xfer_t *s_xfer_get(bs_client_t *c) {
    if (c->npool)
        return c->pool[--c->npool];
    s_xfer_t *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->c = c;
    x->easy = curl_easy_init();
    x->sse = bs_sse_new(S_MAX_EVENT);
    if (!x->easy || !x->sse) {
        s_xfer_destroy(&x);
        return NULL;
    }
    curl_easy_setopt(x->easy, CURLOPT_URL, c->url);
    curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(x->easy, CURLOPT_WRITEFUNCTION, s_on_data);
    curl_easy_setopt(x->easy, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->easy, CURLOPT_PRIVATE, x);
    curl_easy_setopt(x->easy, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(x->easy, CURLOPT_NOSIGNAL, 1L);
    if (c->cfg.timeout_s > 0)
        curl_easy_setopt(x->easy, CURLOPT_TIMEOUT_MS, (long)(c->cfg.timeout_s * 1000));
    return x;
}

static int s_xfer_put(bs_client_t *c, s_xfer_t *x) {
    if (bs_grow(&c->pool, &c->cappool, c->npool + 1, sizeof *c->pool) < 0) {
        s_xfer_destroy(&x);
        return -1;
    }
    c->pool[c->npool++] = x;
    return 0;
}

static int s_xfer_start(bs_client_t *c, const bs_workload_t *w, size_t idx, int base_only, bs_result_t *r) {
    const bs_req_t *req = bs_workload_req(w, idx);
    const char *adapter = base_only ? NULL : bs_workload_adapter_name(w, req->adapter);
    s_xfer_t *x = s_xfer_get(c);
    if (!x || s_body(c, &x->body, req, adapter) < 0) {
        if (x)
            s_xfer_put(c, x);
        return -1;
    }
    *r = (bs_result_t){.prompt_tokens = -1, .output_tokens = -1};
    x->res = r;
    x->resp.n = x->last_event.n = x->text.n = 0;
    if (x->text.d)
        x->text.d[0] = 0;
    x->first_ns = x->last_chunk_ns = x->last_data_ns = 0;
    x->tokens = 0;
    x->status = 0;
    x->done = x->finished = 0;
    x->itl_cap = 0;
    x->errbuf[0] = 0;
    bs_sse_reset(x->sse);
    curl_easy_setopt(x->easy, CURLOPT_POSTFIELDS, x->body.d);
    curl_easy_setopt(x->easy, CURLOPT_POSTFIELDSIZE, (long)x->body.n);
    x->send_ns = s_now_ns();
    r->send_ms = (double)(x->send_ns - c->t0) / 1e6;
    if (curl_multi_add_handle(c->multi, x->easy) != CURLM_OK) {
        s_xfer_put(c, x);
        return -1;
    }
    return 0;
}

// libcurl says which sockets to watch for what; the epoll set follows.
static int s_on_socket(CURL *easy, curl_socket_t fd, int what, void *arg, void *known) {
    bs_client_t *c = arg;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(c->ep, EPOLL_CTL_DEL, fd, NULL);
        curl_multi_assign(c->multi, fd, NULL);
        return 0;
    }
    struct epoll_event ev = {.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u),
                             .data.fd = fd};
    if (known)
        return epoll_ctl(c->ep, EPOLL_CTL_MOD, fd, &ev) ? -1 : 0;
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, fd, &ev) && (errno != EEXIST || epoll_ctl(c->ep, EPOLL_CTL_MOD, fd, &ev)))
        return -1;
    curl_multi_assign(c->multi, fd, c);  // any non-NULL pointer marks the socket as added
    return 0;
}

static int s_on_timer(CURLM *multi, long timeout_ms, void *arg) {
    bs_client_t *c = arg;
    c->curl_due_ns = timeout_ms < 0 ? 0 : s_now_ns() + (uint64_t)timeout_ms * 1000000u;
    return 0;
}

bs_client_t *bs_client_new(const bs_client_cfg_t *cfg) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return NULL;
    bs_client_t *c = calloc(1, sizeof *c);
    if (!c) {
        curl_global_cleanup();
        return NULL;
    }
    c->ep = -1;
    c->cfg = *cfg;
    const char *path = cfg->api == BS_API_GENERATE ? "/generate" : "/v1/completions";
    size_t n = strlen(cfg->base_url) + strlen(path) + 1;
    char auth[1024] = "";
    if (cfg->api_key && *cfg->api_key)
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", cfg->api_key);
    if ((c->url = malloc(n)))
        snprintf(c->url, n, "%s%s", cfg->base_url, path);
    // "Expect:" turns off curl's 100-continue wait on larger bodies: a round trip per request.
    c->headers = curl_slist_append(NULL, "Content-Type: application/json");
    c->headers = curl_slist_append(c->headers, "Expect:");
    if (auth[0]) {
        c->headers = curl_slist_append(c->headers, auth);
        c->get_headers = curl_slist_append(NULL, auth);
    }
    c->multi = curl_multi_init();
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    c->probe = curl_easy_init();
    if (!c->url || !c->headers || !c->multi || c->ep < 0 || !c->probe || (auth[0] && !c->get_headers)) {
        bs_client_destroy(&c);
        return NULL;
    }
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, s_on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, s_on_timer);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    return c;
}

void bs_client_set_model(bs_client_t *c, const char *model) { c->cfg.model = model; }

void bs_client_destroy(bs_client_t **pc) {
    bs_client_t *c = *pc;
    if (!c)
        return;
    for (size_t i = 0; i < c->npool; i++)
        s_xfer_destroy(&c->pool[i]);
    free(c->pool);
    if (c->multi)
        curl_multi_cleanup(c->multi);
    if (c->ep >= 0)
        close(c->ep);
    if (c->probe)
        curl_easy_cleanup(c->probe);
    curl_slist_free_all(c->headers);
    curl_slist_free_all(c->get_headers);
    free(c->url);
    free(c);
    curl_global_cleanup();
    *pc = NULL;
}

static size_t s_on_get(char *p, size_t size, size_t nmemb, void *arg) {
    return bs_buf_add(arg, p, size * nmemb) < 0 ? 0 : size * nmemb;
}

int bs_client_get(bs_client_t *c, const char *path, char **body, size_t *n, char *err, size_t errcap) {
    bs_buf_t b = {0};
    char url[2048], errbuf[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s%s", c->cfg.base_url, path);
    curl_easy_reset(c->probe);
    curl_easy_setopt(c->probe, CURLOPT_URL, url);
    curl_easy_setopt(c->probe, CURLOPT_HTTPHEADER, c->get_headers);
    curl_easy_setopt(c->probe, CURLOPT_WRITEFUNCTION, s_on_get);
    curl_easy_setopt(c->probe, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c->probe, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c->probe, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->probe, CURLOPT_TIMEOUT_MS, (long)S_PROBE_TIMEOUT_MS);
    CURLcode rc = curl_easy_perform(c->probe);
    if (rc != CURLE_OK) {
        snprintf(err, errcap, "%s", errbuf[0] ? errbuf : curl_easy_strerror(rc));
        free(b.d);
        return -1;
    }
    long status = 0;
    curl_easy_getinfo(c->probe, CURLINFO_RESPONSE_CODE, &status);
    if (!b.d && bs_buf_add(&b, "", 0) < 0) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    *body = b.d;
    *n = b.n;
    return (int)status;
}

// Moves finished transfers into their results; returns how many finished, *failed those failed.
static size_t s_collect(bs_client_t *c, size_t *failed) {
    size_t n = 0;
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        s_xfer_t *x;
        CURLcode rc = m->data.result;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        curl_multi_remove_handle(c->multi, x->easy);
        s_xfer_done(c, x, rc);
        *failed += !x->res->ok;
        x->res = NULL;
        s_xfer_put(c, x);
        n++;
    }
    return n;
}

int bs_client_run(bs_client_t *c, const bs_workload_t *w, const bs_run_t *run, bs_result_t *out, double *duration_s,
                  size_t *max_inflight) {
    size_t n = run->order ? run->n : bs_workload_size(w), next = 0, done = 0, failed = 0, inflight = 0;
    uint64_t last_tick = 0;
    c->t0 = s_now_ns();
    *max_inflight = 0;
    while (done < n) {
        uint64_t now = s_now_ns();
        double wait_ms = S_TICK_MS;
        while (next < n && (!run->max_concurrency || inflight < run->max_concurrency)) {
            size_t idx = run->order ? run->order[next] : next;
            if (run->paced) {
                uint64_t at = c->t0 + (uint64_t)(bs_workload_req(w, idx)->arrival_s * 1e9);
                if (at > now) {
                    wait_ms = (double)(at - now) / 1e6;
                    break;
                }
            }
            if (s_xfer_start(c, w, idx, run->base_only, &out[next]) < 0)
                return -1;
            next++;
            if (++inflight > *max_inflight)
                *max_inflight = inflight;
        }
        size_t fin = s_collect(c, &failed);
        done += fin;
        inflight -= fin;
        now = s_now_ns();
        if (run->progress && (now - last_tick >= S_TICK_MS * 1000000ull || done == n)) {
            run->progress(run->arg, done, failed, (double)(now - c->t0) / 1e9);
            last_tick = now;
        }
        if (done == n)
            break;
        if (fin && next < n && (!run->max_concurrency || inflight < run->max_concurrency))
            continue;  // slots freed: start what waits before sleeping
        if (c->curl_due_ns && c->curl_due_ns < now + (uint64_t)(wait_ms * 1e6))
            wait_ms = (double)(c->curl_due_ns > now ? c->curl_due_ns - now : 0) / 1e6;
        // Rounded up: a request goes out at most 1 ms after its arrival time (its send time is
        // measured, not assumed), where rounding down would spin the CPU.
        struct epoll_event ev[S_EVENTS];
        int nev = epoll_wait(c->ep, ev, S_EVENTS, (int)ceil(wait_ms));
        if (nev < 0 && errno != EINTR)
            return -1;
        int running;
        for (int i = 0; i < nev; i++) {
            int flags = (ev[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) | (ev[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                        (ev[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            if (curl_multi_socket_action(c->multi, ev[i].data.fd, flags, &running) != CURLM_OK)
                return -1;
        }
        if (c->curl_due_ns && c->curl_due_ns <= s_now_ns()) {
            c->curl_due_ns = 0;
            if (curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running) != CURLM_OK)
                return -1;
        }
    }
    // The run ends with the last byte of the last answer (the latest e2e end).
    uint64_t end = c->t0;
    for (size_t i = 0; i < n; i++) {
        uint64_t e = c->t0 + (uint64_t)((out[i].send_ms + out[i].e2e_ms) * 1e6);
        if (e > end)
            end = e;
    }
    *duration_s = (double)(end - c->t0) / 1e9;
    return 0;
}
