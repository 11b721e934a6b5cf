// fake_graph — see fake_graph.h.
#include "fake_graph.h"

#include <pthread.h>
#include <string.h>

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static char *s_last;  // the last GenerateReq, encoded
static size_t s_last_len;
static int s_aborts, s_muted;

int fake_graph_last_request(ls_msg_t *out) {
    pthread_mutex_lock(&s_lock);
    int rc = s_last ? ls_msg_decode(s_last, s_last_len, out, NULL) : -1;
    pthread_mutex_unlock(&s_lock);
    return rc;
}

int fake_graph_aborts(void) {
    pthread_mutex_lock(&s_lock);
    int n = s_aborts;
    pthread_mutex_unlock(&s_lock);
    return n;
}

void fake_graph_mute(int mute) {
    pthread_mutex_lock(&s_lock);
    s_muted = mute;
    pthread_mutex_unlock(&s_lock);
}

static void s_send(zsock_t *router, zframe_t *identity, ls_msg_t *m) {
    char *buf;
    size_t len;
    if (ls_msg_encode(m, &buf, &len) == 0) {
        zframe_send(&(zframe_t *){zframe_dup(identity)}, router, ZFRAME_MORE);
        zsock_send(router, "b", buf, len);
        free(buf);
    }
    ls_msg_clear(m);
}

// The fake vocabulary: token id N reads "tN" (TextOut.token_texts, top_texts).
static ls_text_t s_tok_text(int32_t id) {
    char b[32];
    return ls_msg_textdup(b, (size_t)snprintf(b, sizeof b, "t%d", (int)id));
}

// With texts false the tokens come without their texts, as from a detokenizer that could not
// decode them: the gateway names them by id.
static void s_text(zsock_t *router, zframe_t *id, uint64_t rid, uint32_t index, const char *text, int ntok,
                   int first_tok, uint32_t k, uint32_t finish, uint32_t prompt, uint32_t done, bool texts) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.rid = rid;
    ls_msg_text_out_t *t = &m.u.text_out;
    t->text = ls_msg_textdup(text, strlen(text));
    t->index = index;
    t->finish = finish;
    t->prompt_tokens = prompt;
    t->completion_tokens = done;
    if (ntok) {
        t->token_ids.v = calloc((size_t)ntok, sizeof(int32_t));
        t->logprobs.v = calloc((size_t)ntok, sizeof(float));
        t->token_ids.n = t->logprobs.n = (size_t)ntok;
        if (k) {
            t->top_ids.v = calloc((size_t)ntok * k, sizeof(int32_t));
            t->top_logprobs.v = calloc((size_t)ntok * k, sizeof(float));
            t->top_ids.n = t->top_logprobs.n = (size_t)ntok * k;
        }
        for (int i = 0; i < ntok; i++) {
            t->token_ids.v[i] = 100 + first_tok + i;
            t->logprobs.v[i] = -0.5f * (float)(first_tok + i + 1);
            for (uint32_t j = 0; j < k; j++) {
                t->top_ids.v[i * k + j] = 100 + first_tok + i + (int)j;
                t->top_logprobs.v[i * k + j] = t->logprobs.v[i] - (float)j;
            }
        }
        if (texts) {
            t->token_texts.v = calloc(t->token_ids.n, sizeof(ls_text_t));
            t->top_texts.v = t->top_ids.n ? calloc(t->top_ids.n, sizeof(ls_text_t)) : NULL;
            for (size_t i = 0; i < t->token_ids.n; i++)
                t->token_texts.v[t->token_texts.n++] = s_tok_text(t->token_ids.v[i]);
            for (size_t i = 0; i < t->top_ids.n; i++)
                t->top_texts.v[t->top_texts.n++] = s_tok_text(t->top_ids.v[i]);
        }
    }
    s_send(router, id, &m);
}

static void s_refuse(zsock_t *router, zframe_t *id, uint64_t rid, uint32_t code) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.rid = rid;
    m.u.text_out.finish = LS_FINISH_REASON_ERROR;
    m.u.text_out.error_code = code;
    m.u.text_out.last = true;
    m.u.text_out.error = ls_msg_strdup(code == LS_ERROR_CODE_NOT_FOUND ? "no adapter named missing" : "refused");
    s_send(router, id, &m);
}

static void s_generate(zsock_t *router, zframe_t *id, const ls_msg_t *req, uint64_t *hang_rid) {
    const ls_msg_generate_req_t *g = &req->u.generate_req;
    const char *adapter = g->adapter && *g->adapter ? g->adapter : "base";
    if (!strcmp(adapter, "missing"))
        return s_refuse(router, id, req->rid, LS_ERROR_CODE_NOT_FOUND);
    if (g->text.s && !strcmp(g->text.s, "long"))
        return s_refuse(router, id, req->rid, LS_ERROR_CODE_TOO_LARGE);
    if (g->text.s && !strcmp(g->text.s, "busy"))
        return s_refuse(router, id, req->rid, LS_ERROR_CODE_UNAVAILABLE);
    if (g->text.s && !strcmp(g->text.s, "full"))
        return s_refuse(router, id, req->rid, LS_ERROR_CODE_OVERLOADED);
    uint32_t prompt = g->chat ? 7 : g->text.s ? (uint32_t)g->text.len : (uint32_t)g->input_ids.n;
    uint32_t k = g->sampling.top_logprobs;
    if (g->text.s && !strcmp(g->text.s, "rid0")) {
        // Answers to nothing, with rid 0, of every type the gateway takes; then the real one.
        static const int types[] = {LS_MSG_TEXT_OUT, LS_MSG_ADAPTER_LIST, LS_MSG_ADAPTER_LOADED,
                                    LS_MSG_ADAPTER_UNLOADED, LS_MSG_METRICS, LS_MSG_ERROR, LS_MSG_HEARTBEAT};
        for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
            ls_msg_t m;
            ls_msg_init(&m, (ls_msg_type_t)types[i]);
            s_send(router, id, &m);
        }
    }
    if ((g->text.s && !strcmp(g->text.s, "nul")) || (g->messages && strstr(g->messages, "\"nul\""))) {
        // Generated text and a matched stop string holding NUL bytes, in one final TextOut.
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_TEXT_OUT);
        m.rid = req->rid;
        m.u.text_out.text = ls_msg_textdup("a\0b", 3);
        m.u.text_out.finish = LS_FINISH_REASON_STOP;
        m.u.text_out.matched_stop = ls_msg_textdup("\0x", 2);
        m.u.text_out.prompt_tokens = prompt;
        m.u.text_out.completion_tokens = 3;
        s_send(router, id, &m);
        return;
    }
    if (g->text.s && !strcmp(g->text.s, "hang")) {
        s_text(router, id, req->rid, 0, " hi", 1, 0, k, LS_FINISH_REASON_NONE, prompt, 1, true);
        *hang_rid = req->rid;
        return;
    }
    char first[160];
    snprintf(first, sizeof first, " %s%s", g->chat ? "chat:" : "", adapter);
    const char *pieces[2] = {first, " ok"};
    uint32_t max = g->sampling.max_new_tokens ? g->sampling.max_new_tokens : 128;
    int ntok = max < 2 ? (int)max : 2;
    uint32_t finish = ntok < 2 ? LS_FINISH_REASON_LENGTH : LS_FINISH_REASON_STOP;
    uint32_t n = g->sampling.n ? g->sampling.n : 1;
    bool texts = !(g->text.s && !strcmp(g->text.s, "bc"));  // prompt "bc": tokens without texts
    for (uint32_t i = 0; i < n; i++) {
        if (g->stream) {
            for (int p = 0; p < ntok; p++)
                s_text(router, id, req->rid, i, pieces[p], 1, p, k, LS_FINISH_REASON_NONE, prompt, (uint32_t)p + 1,
                       texts);
            s_text(router, id, req->rid, i, "", 0, 0, 0, finish, prompt, (uint32_t)ntok, texts);
        } else {
            char all[200];
            snprintf(all, sizeof all, "%s%s", ntok > 0 ? pieces[0] : "", ntok > 1 ? pieces[1] : "");
            s_text(router, id, req->rid, i, all, ntok, 0, k, finish, prompt, (uint32_t)ntok, texts);
        }
    }
}

// One histogram of the fake tokenizer's: bounds 1 ms and 10 ms, counts per bucket as given.
static void s_histogram(ls_msg_histogram_t *h, const char *name, const char *adapter, uint64_t c0, uint64_t c1,
                        uint64_t c2, size_t ncounts) {
    h->name = ls_msg_strdup(name);
    h->adapter = ls_msg_strdup(adapter);
    h->help = ls_msg_strdup("latency \\ of \"tests\"\nsecond line");
    h->le_us.v = calloc(2, sizeof(uint64_t));
    h->le_us.v[0] = 1000;
    h->le_us.v[1] = 10000;
    h->le_us.n = 2;
    h->counts.v = calloc(3, sizeof(uint64_t));
    h->counts.v[0] = c0;
    h->counts.v[1] = c1;
    h->counts.v[2] = c2;
    h->counts.n = ncounts;
    h->sum_us = 1500 * c0 + 5000 * c1 + 20000 * c2;
}

// The tokenizer's Metrics: kv_used_blocks 7, requests_active 8 (a gauge), and latency
// histograms as the tokenizer sends them, for the base model (adapter ""), reverse and a name
// that needs escaping, plus what the gateway must leave out: a series given twice, and one
// whose counts do not fit its bounds.
static void s_tok_metrics(zsock_t *router, zframe_t *id, uint64_t rid) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_METRICS);
    m.rid = rid;
    m.u.metrics.actor = ls_msg_strdup("tokenizer");
    m.u.metrics.names.v = calloc(2, sizeof(char *));
    m.u.metrics.names.v[0] = ls_msg_strdup("kv_used_blocks");
    m.u.metrics.names.v[1] = ls_msg_strdup("requests_active");
    m.u.metrics.values.v = calloc(2, sizeof(uint64_t));
    m.u.metrics.values.v[0] = 7;
    m.u.metrics.values.v[1] = 8;
    m.u.metrics.names.n = m.u.metrics.values.n = 2;
    m.u.metrics.gauges.v = calloc(1, sizeof(char *));
    m.u.metrics.gauges.v[m.u.metrics.gauges.n++] = ls_msg_strdup("requests_active");
    ls_msg_histograms_t *h = &m.u.metrics.histograms;
    h->v = calloc(5, sizeof *h->v);
    s_histogram(&h->v[h->n++], "time_to_first_token_seconds", "", 1, 2, 0, 3);
    s_histogram(&h->v[h->n++], "time_to_first_token_seconds", "reverse", 0, 1, 1, 3);
    s_histogram(&h->v[h->n++], "time_to_first_token_seconds", "q\"x", 1, 0, 0, 3);
    s_histogram(&h->v[h->n++], "time_to_first_token_seconds", "reverse", 9, 9, 9, 3);  // again: left out
    s_histogram(&h->v[h->n++], "e2e_request_latency_seconds", "reverse", 1, 1, 1, 2);  // malformed
    s_send(router, id, &m);
}

// The scheduler's Metrics: queue_length 3 and requests_active 4 (which the tokenizer reports too), plus
// what the endpoint picker's series come from, with adapter names that need escaping and more
// waiting adapters than the 3 slots.
static void s_sched_metrics(zsock_t *router, zframe_t *id, uint64_t rid) {
    static const char *names[] = {"queue_length", "requests_active", "running_requests", "kv_blocks_used",
                                  "kv_blocks_total", "kv_block_size", "lora_slots"};
    static const uint64_t values[] = {3, 4, 2, 1, 4, 16, 3};
    const size_t n = sizeof names / sizeof *names;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_METRICS);
    m.rid = rid;
    m.u.metrics.actor = ls_msg_strdup("scheduler");
    m.u.metrics.names.v = calloc(n, sizeof(char *));
    m.u.metrics.values.v = calloc(n, sizeof(uint64_t));
    m.u.metrics.gauges.v = calloc(n, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        m.u.metrics.names.v[i] = ls_msg_strdup(names[i]);
        m.u.metrics.values.v[i] = values[i];
        m.u.metrics.gauges.v[i] = ls_msg_strdup(names[i]);
    }
    m.u.metrics.names.n = m.u.metrics.values.n = m.u.metrics.gauges.n = n;
    m.u.metrics.info_names.v = calloc(2, sizeof(char *));
    m.u.metrics.info_values.v = calloc(2, sizeof(char *));
    m.u.metrics.info_names.v[0] = ls_msg_strdup("running_lora_adapters");
    m.u.metrics.info_values.v[0] = ls_msg_strdup("q\"x,b\\s,n\nl");
    m.u.metrics.info_names.v[1] = ls_msg_strdup("waiting_lora_adapters");
    m.u.metrics.info_values.v[1] = ls_msg_strdup("a,b,a,c,d");
    m.u.metrics.info_names.n = m.u.metrics.info_values.n = 2;
    s_send(router, id, &m);
}

static void s_adapter(ls_msg_adapter_info_t *a, const char *name, uint32_t state) {
    a->name = ls_msg_strdup(name);
    char path[64];
    snprintf(path, sizeof path, "/adapters/%s", name);
    a->path = ls_msg_strdup(path);
    a->rank = 8;
    a->state = state;
}

static void s_admin(zsock_t *router, zframe_t *id, const ls_msg_t *req) {
    ls_msg_t m;
    switch (req->type) {
    case LS_MSG_HEARTBEAT:
        pthread_mutex_lock(&s_lock);
        int muted = s_muted;
        pthread_mutex_unlock(&s_lock);
        if (muted)
            return;
        ls_msg_init(&m, LS_MSG_HEARTBEAT);
        m.u.heartbeat.actor = ls_msg_strdup("tokenizer");
        break;
    case LS_MSG_LIST_ADAPTERS:
        ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
        m.u.adapter_list.adapters.v = calloc(3, sizeof(ls_msg_adapter_info_t));
        m.u.adapter_list.adapters.n = 3;
        s_adapter(&m.u.adapter_list.adapters.v[0], "reverse", LS_ADAPTER_STATE_READY);
        s_adapter(&m.u.adapter_list.adapters.v[1], "upper", LS_ADAPTER_STATE_READY);
        s_adapter(&m.u.adapter_list.adapters.v[2], "gone", LS_ADAPTER_STATE_UNLOADING);
        break;
    case LS_MSG_LOAD_ADAPTER: {
        if (!strcmp(req->u.load_adapter.name, "hang"))
            return;  // still loading
        if (!strcmp(req->u.load_adapter.name, "lost")) {
            // The tokenizer's answer when the registry went down with the load.
            ls_msg_init(&m, LS_MSG_ERROR);
            m.u.error.code = LS_ERROR_CODE_OUTCOME_UNKNOWN;
            m.u.error.ref_type = LS_MSG_LOAD_ADAPTER;
            m.u.error.message = ls_msg_strdup("no answer from the registry for this load; list the adapters to know");
            break;
        }
        int bad = !strcmp(req->u.load_adapter.name, "bad");
        ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
        m.u.adapter_loaded.ok = !bad;
        m.u.adapter_loaded.name = ls_msg_strdup(req->u.load_adapter.name);
        if (bad) {
            m.u.adapter_loaded.code = LS_ERROR_CODE_BAD_REQUEST;
            m.u.adapter_loaded.reason = ls_msg_strdup("rank 128 above max_lora_rank 64");
        }
        break;
    }
    case LS_MSG_UNLOAD_ADAPTER: {
        int nope = !strcmp(req->u.unload_adapter.name, "nope");
        ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
        m.u.adapter_unloaded.ok = !nope;
        if (nope) {
            m.u.adapter_unloaded.code = LS_ERROR_CODE_NOT_FOUND;
            m.u.adapter_unloaded.reason = ls_msg_strdup("no adapter named nope");
        }
        break;
    }
    default:
        return;
    }
    m.rid = req->rid;
    s_send(router, id, &m);
}

typedef struct {
    char *tok_ep, *sched_ep;
} s_args_t;

static void s_actor(zsock_t *pipe, void *arg) {
    s_args_t *args = arg;
    zsock_t *tok = zsock_new_router(args->tok_ep), *sched = zsock_new_router(args->sched_ep);
    zsock_signal(pipe, tok && sched ? 0 : 1);
    zpoller_t *poller = zpoller_new(pipe, tok, sched, NULL);
    uint64_t hang_rid = 0;
    zframe_t *hang_id = NULL;
    while (tok && sched) {
        zsock_t *which = zpoller_wait(poller, -1);
        if (!which || which == pipe)
            break;
        zframe_t *id = zframe_recv(which), *body = zframe_recv(which);
        ls_msg_t req;
        if (id && body && ls_msg_decode(zframe_data(body), zframe_size(body), &req, NULL) == 0) {
            if (which == sched) {
                if (req.type == LS_MSG_GET_METRICS)
                    s_sched_metrics(sched, id, req.rid);
            } else if (req.type == LS_MSG_GENERATE_REQ) {
                pthread_mutex_lock(&s_lock);
                free(s_last);
                ls_msg_encode(&req, &s_last, &s_last_len);
                pthread_mutex_unlock(&s_lock);
                uint64_t before = hang_rid;
                s_generate(tok, id, &req, &hang_rid);
                if (hang_rid != before) {
                    zframe_destroy(&hang_id);
                    hang_id = zframe_dup(id);
                }
            } else if (req.type == LS_MSG_ABORT) {
                pthread_mutex_lock(&s_lock);
                s_aborts++;
                pthread_mutex_unlock(&s_lock);
                if (req.rid == hang_rid && hang_id) {
                    s_text(tok, hang_id, hang_rid, 0, "", 0, 0, 0, LS_FINISH_REASON_ABORT, 4, 1, true);
                    hang_rid = 0;
                }
            } else if (req.type == LS_MSG_GET_METRICS)
                s_tok_metrics(tok, id, req.rid);
            else
                s_admin(tok, id, &req);
            ls_msg_clear(&req);
        }
        zframe_destroy(&id);
        zframe_destroy(&body);
    }
    zframe_destroy(&hang_id);
    zpoller_destroy(&poller);
    zsock_destroy(&tok);
    zsock_destroy(&sched);
    free(args->tok_ep);
    free(args->sched_ep);
    free(args);
}

zactor_t *fake_graph_new(const char *tokenizer, const char *scheduler) {
    s_args_t *args = calloc(1, sizeof *args);
    args->tok_ep = strdup(tokenizer);
    args->sched_ep = strdup(scheduler);
    return zactor_new(s_actor, args);
}
