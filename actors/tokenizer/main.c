// tokenizer — the front door for clients (gateway, SDK): validates and tokenizes GenerateReq
// (text, input_ids, or chat messages through the model's chat template), acquires the adapter
// from the registry, sends one TokenizedReq per completion to the scheduler, and routes every
// TextOut back to the client that asked (by its ZeroMQ identity), with the client's rid and the
// completion's index. The request logic without sockets is in prompt.c; see docs/frontdoor.md.
//
// Accepts on its ROUTER, from clients:
//   GenerateReq             → TextOut pieces (stream) or one TextOut per completion; the last
//                             has `last`. Refusals: one TextOut {finish ERROR, error_code, last}.
//   Abort                   → Abort to the scheduler for each of the request's completions
//   TokenizeReq             → TokenizeResp (vLLM's /tokenize and /detokenize), or Error BAD_REQUEST;
//                             naming an adapter, after acquiring it (its added tokens)
//   LoadAdapter, UnloadAdapter, ListAdapters → relayed to the registry; its answer relayed back
// Accepts on its ROUTER, from the detokenizer: TextOut (rid = a completion's rid here).
// Accepts on its control DEALER: PeerStatus (an actor went down: answer what waited on it).
// Accepts on its DEALERs: AdapterAcquired, AdapterLoaded, AdapterUnloaded, AdapterList, Error
//   (registry); Error (scheduler: a TokenizedReq it refused).
// Emits: AcquireAdapter, ReleaseAdapter (registry; one release for every acquire that
//   succeeded, whatever the ending); TokenizedReq, Abort (scheduler); TextOut and the relayed
//   answers (clients). Its Metrics carry the latency histograms per adapter (latency.h).
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ls_actor.h"
#include "latency.h"
#include "ls_limits.h"
#include "prompt.h"

typedef struct greq greq_t;

// An adapter's added tokens (docs/adapters.md, "Added vocabulary"), kept per adapter id while
// some request holds the adapter: the tokenizer's table, and the list as the registry gave it
// (copied into each TokenizedReq for the detokenizer).
typedef struct {
    ls_tok_added_t *tab;
    ls_msg_added_tokens_t list;
    uint32_t refs;
} added_t;

// A TokenizeReq naming an adapter, while the adapter is acquired.
typedef struct {
    ls_route_t *route;
    uint64_t client_rid;
    ls_msg_t req;  // the TokenizeReq, moved out of the inbound message
} tpend_t;

// One completion: one request at the scheduler.
typedef struct {
    uint64_t rid;  // this actor's, sent to the scheduler
    uint32_t index;
    greq_t *g;
    bool running;  // at the scheduler: no final TextOut or Error for it yet
    bool done;     // its final TextOut went to the client, or never will
    tcollect_t collect;  // not streaming: the text so far
    uint32_t tokens;     // generated so far, as its last TextOut said
    uint64_t last_ns;    // when its last token came (0: none yet)
} comp_t;

// One GenerateReq.
struct greq {
    greq_t *prev, *next;  // every live group
    uint64_t id;           // the AcquireAdapter's rid
    uint64_t client_rid;
    ls_route_t *route;
    char *key;      // in s_tok.clients while the client may still hear from it
    char *client;   // the client's identity (hex), counted in s_tok.open_by_client until closed
    ls_msg_t req;   // the GenerateReq, moved out of the inbound message
    ls_token_ids_t ids;
    char *adapter_id;  // held from the registry (NULL: the base model, or not held)
    added_t *added;    // its added tokens, held while adapter_id is (NULL: none)
    uint32_t n_held;   // a mix: its first n_held components are held (ids in req's mix)
    bool acquiring;    // AcquireAdapter sent, no answer yet
    bool closed;       // the client had its last TextOut, or is gone
    uint32_t n, open;  // completions, and those not done
    uint32_t running;  // completions still at the scheduler
    comp_t *comps;     // n, once dispatched
    ls_timer_t *timer;
    uint64_t deadline_ms;  // this actor's clock; 0: none
    uint64_t arrival_ns;   // this actor's clock when the request came
};

// A LoadAdapter, UnloadAdapter or ListAdapters relayed to the registry.
typedef struct {
    ls_route_t *route;
    uint64_t client_rid;
    uint16_t type;  // what was relayed: a load or unload changes state, a listing does not
} relay_t;

typedef struct {
    char *model_path;
    char *scheduler;  // the peer requests go to: "scheduler", or "dispatcher" with --dp-size > 1
    ls_actor_t *actor;
    tmodel_t *model;
    uint64_t next_id;
    zhashx_t *comps;     // rid → comp_t
    zhashx_t *acquires;  // group id → greq_t, while acquiring
    zhashx_t *tpend;     // acquire rid → tpend_t: a TokenizeReq's adapter, while acquiring
    zhashx_t *added;     // adapter id → added_t, while a request holds an adapter with some
    zhashx_t *clients;   // client key → greq_t, until closed
    zhashx_t *relays;    // rid → relay_t
    zhashx_t *open_by_client;  // client identity (hex) → its requests not closed (uintptr_t)
    int max_client_requests;   // --max-client-requests: more are refused OVERLOADED
    int metrics_max_adapters;  // --metrics-max-adapters: adapters with latency series of their own
    latency_t *latency;
    const char *chat_template; // --chat-template: a Jinja file replacing the model's template
    int64_t unix_start;        // the wall clock at start (recorded), for strftime_now
    uint64_t mono_start;
    greq_t *groups;
    bool scheduler_down;  // the launcher said so, and not yet that it is back
} tok_t;

static tok_t s_tok;

static void s_key(uint64_t id, char key[24]) { snprintf(key, 24, "%" PRIu64, id); }

// The client's identity (hex), and with `rid` its key: identity + ":" + rid, what a client's
// Abort names.
static char *s_client_id(const ls_in_t *in, bool rid) {
    size_t n = in->identity ? zframe_size(in->identity) : 0;
    const uint8_t *d = in->identity ? zframe_data(in->identity) : NULL;
    char *key = malloc(2 * n + 24);
    if (!key)
        return NULL;
    key[0] = 0;
    for (size_t i = 0; i < n; i++)
        snprintf(key + 2 * i, 3, "%02x", d[i]);
    if (rid)
        snprintf(key + 2 * n, 24, ":%" PRIu64, in->msg->rid);
    return key;
}

static char *s_client_key(const ls_in_t *in) { return s_client_id(in, true); }

static uintptr_t s_client_open(const char *client) { return (uintptr_t)zhashx_lookup(s_tok.open_by_client, client); }

static void s_count(const char *name, uint64_t n) { ls_actor_count(s_tok.actor, name, n); }

static void s_count_refusal(uint32_t code) {
    const char *name = ls_error_code_name(code);
    char counter[64];
    snprintf(counter, sizeof counter, "refused_%s_total", name ? name : "other");
    for (char *p = counter; *p; p++)
        *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    s_count(counter, 1);
}

static void s_gauge(void) {
    uint64_t active = 0;
    for (greq_t *g = s_tok.groups; g; g = g->next)
        active += !g->closed;
    ls_actor_gauge_set(s_tok.actor, "requests_active", active);
}

static void s_oom(void) {
    ls_error(0, "tokenizer out of memory");
    abort();
}

static void s_added_list_free(ls_msg_added_tokens_t *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i].content);
    free(l->v);
    *l = (ls_msg_added_tokens_t){0};
}

// One more holder of adapter_id's added tokens (list, as AdapterAcquired gave them: moved here
// when the table is new). NULL + err when they cannot be taken over the tokenizer.
static added_t *s_added_hold(const char *adapter_id, ls_msg_added_tokens_t *list, char *err, size_t errlen) {
    added_t *x = zhashx_lookup(s_tok.added, adapter_id);
    if (!x) {
        if (!(x = calloc(1, sizeof *x)))
            s_oom();
        if (!(x->tab = tmodel_added_new(s_tok.model, list, err, errlen))) {
            free(x);
            return NULL;
        }
        x->list = *list;
        *list = (ls_msg_added_tokens_t){0};
        zhashx_insert(s_tok.added, adapter_id, x);
    }
    x->refs++;
    return x;
}

// A holder of adapter_id's added tokens is done; the last one drops them.
static void s_added_drop(const char *adapter_id) {
    added_t *x = zhashx_lookup(s_tok.added, adapter_id);
    if (!x || --x->refs)
        return;
    ls_tok_added_destroy(&x->tab);
    s_added_list_free(&x->list);
    zhashx_delete(s_tok.added, adapter_id);
    free(x);
}

// ---------------------------------------------------------------------------------------------
// groups

static void s_release_one(greq_t *g, char **adapter_id, char *name) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_RELEASE_ADAPTER);
    m.rid = g->id;
    m.u.release_adapter.adapter_id = *adapter_id;
    m.u.release_adapter.name = name;
    ls_actor_send_peer(s_tok.actor, "registry", &m, NULL);
    m.u.release_adapter.adapter_id = m.u.release_adapter.name = NULL;  // still g's
    ls_msg_clear(&m);
    free(*adapter_id);
    *adapter_id = NULL;
}

// Gives back what g holds: its adapter, or every component of its mix held so far.
static void s_release(greq_t *g) {
    ls_msg_generate_req_t *req = &g->req.u.generate_req;
    if (g->added) {
        s_added_drop(g->adapter_id);
        g->added = NULL;
    }
    if (g->adapter_id)
        s_release_one(g, &g->adapter_id, req->adapter);
    for (; g->n_held > 0; g->n_held--)
        s_release_one(g, &req->mix.v[g->n_held - 1].adapter_id, req->mix.v[g->n_held - 1].name);
}

// Nothing more goes to the client: forget its key, give the adapter back.
static void s_close(greq_t *g) {
    g->closed = true;
    if (g->client) {
        uintptr_t open = s_client_open(g->client) - 1;
        if (open)
            zhashx_update(s_tok.open_by_client, g->client, (void *)open);
        else
            zhashx_delete(s_tok.open_by_client, g->client);
        free(g->client);
        g->client = NULL;
    }
    if (g->key) {
        zhashx_delete(s_tok.clients, g->key);
        free(g->key);
        g->key = NULL;
    }
    s_release(g);
}

static void s_maybe_free(greq_t *g) {
    if (!g->closed || g->acquiring || g->running)
        return;
    if (g->timer)
        ls_actor_timer_stop(s_tok.actor, g->timer);
    if (g->key)
        zhashx_delete(s_tok.clients, g->key);
    free(g->key);
    free(g->client);
    free(g->adapter_id);
    for (uint32_t i = 0; g->comps && i < g->n; i++)
        tcollect_free(&g->comps[i].collect);
    free(g->comps);
    ls_msg_clear(&g->req);
    ls_token_ids_free(&g->ids);
    ls_route_destroy(&g->route);
    if (g->prev)
        g->prev->next = g->next;
    else
        s_tok.groups = g->next;
    if (g->next)
        g->next->prev = g->prev;
    free(g);
}

static void s_abort_comp(comp_t *c, uint32_t finish, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = c->rid;
    m.u.abort.finish = finish;
    m.u.abort.reason = ls_msg_strdup(why);
    ls_actor_send_peer(s_tok.actor, s_tok.scheduler, &m, NULL);
    ls_msg_clear(&m);
}

// A send to the client failed (ROUTER_MANDATORY: it disconnected; or its queue is full): stop
// everything it started.
static void s_client_gone(greq_t *g) {
    ls_warn(g->client_rid, "the client is gone: aborting its request");
    s_count("clients_gone_total", 1);
    for (uint32_t i = 0; g->comps && i < g->n; i++)
        if (!g->comps[i].done) {
            g->comps[i].done = true;
            if (g->comps[i].running)
                s_abort_comp(&g->comps[i], LS_FINISH_REASON_ABORT, "the client went away");
        }
    g->open = 0;
    s_close(g);
}

// The whole request ends at once (refused, or aborted or timed out before dispatch): its one
// TextOut, index 0, last.
static void s_end_whole(greq_t *g, uint32_t finish, uint32_t code, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.rid = g->client_rid;
    ls_msg_text_out_t *t = &m.u.text_out;
    t->text = ls_msg_textdup("", 0);
    t->finish = finish;
    t->error_code = code;
    t->error = ls_msg_strdup(why);
    t->last = true;
    if (code)
        s_count_refusal(code);
    s_close(g);
    ls_actor_send_route(s_tok.actor, g->route, &m, NULL);
    ls_msg_clear(&m);
}

// The latency histograms' share of a TextOut of completion c: its first token, the tokens after
// it (a piece of k tokens is k observations of its gap / k; tokens that come with the first one
// came at no interval), its end when it stopped or reached its length. Only a completion that
// the scheduler took gets here, so its adapter exists: a name the registry refused never makes a
// series.
static void s_latency_note(comp_t *c, const ls_msg_text_out_t *t) {
    const greq_t *g = c->g;
    const ls_msg_generate_req_t *req = &g->req.u.generate_req;
    // a mix is measured as one more tenant, its components' names joined by '+'
    char mix[256] = "";
    for (size_t i = 0; i < req->mix.n; i++)
        snprintf(mix + strlen(mix), sizeof mix - strlen(mix), "%s%s", i ? "+" : "", req->mix.v[i].name);
    const char *adapter = req->mix.n ? mix : g->adapter_id ? req->adapter : NULL;
    uint64_t now = ls_actor_now_ns(s_tok.actor);
    if (t->completion_tokens > c->tokens) {
        uint32_t k = t->completion_tokens - c->tokens;
        if (!c->last_ns) {
            latency_observe(s_tok.latency, adapter, LATENCY_TTFT, (now - g->arrival_ns) / 1000, 1);
            latency_observe(s_tok.latency, adapter, LATENCY_ITL, 0, k - 1);
        } else
            latency_observe(s_tok.latency, adapter, LATENCY_ITL, (now - c->last_ns) / 1000 / k, k);
        c->tokens = t->completion_tokens;
        c->last_ns = now;
    }
    if (t->finish == LS_FINISH_REASON_STOP || t->finish == LS_FINISH_REASON_LENGTH)
        latency_observe(s_tok.latency, adapter, LATENCY_E2E, (now - g->arrival_ns) / 1000, 1);
}

// One TextOut of completion c (t: from the detokenizer, or made here), to the client: collected
// when not streaming, rid and index rewritten, the request's last marked. msg stays the caller's.
static void s_comp_output(comp_t *c, ls_msg_t *msg) {
    greq_t *g = c->g;
    ls_msg_text_out_t *t = &msg->u.text_out;
    bool final = t->finish != LS_FINISH_REASON_NONE;
    if (c->done || g->closed)
        return;
    s_latency_note(c, t);
    s_count("completion_tokens_total", t->token_ids.n);
    const ls_msg_generate_req_t *req = &g->req.u.generate_req;
    if (!req->stream) {
        if (tcollect_add(&c->collect, t) < 0)
            s_oom();
        if (!final)
            return;
        tcollect_take(&c->collect, t);
    } else if (!final && !t->text.len && !(req->return_token_ids && t->token_ids.n) && !t->logprobs.n) {
        return;  // an empty piece (text held back) the client has no use for
    }
    if (!req->return_token_ids) {
        free(t->token_ids.v);
        t->token_ids.v = NULL;
        t->token_ids.n = 0;
    }
    msg->rid = g->client_rid;
    t->index = c->index;
    if (final) {
        c->done = true;
        g->open--;
        if (t->finish == LS_FINISH_REASON_ERROR && t->error_code)
            s_count_refusal(t->error_code);
    }
    t->last = final && g->open == 0;
    if (t->last)
        s_close(g);  // released before the client hears, so what it asks next sees it released
    if (ls_actor_send_route(s_tok.actor, g->route, msg, NULL) < 0 && !g->closed)
        s_client_gone(g);
}

// Completion c ends here without the detokenizer (refused by the scheduler, timed out, shut
// down): a final TextOut made up for it.
static void s_comp_fail(comp_t *c, uint32_t finish, uint32_t code, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.u.text_out.text = ls_msg_textdup("", 0);
    m.u.text_out.finish = finish;
    m.u.text_out.error_code = code;
    m.u.text_out.error = ls_msg_strdup(why);
    s_comp_output(c, &m);
    ls_msg_clear(&m);
}

// The scheduler will send nothing more for c.
static void s_comp_ended(comp_t *c) {
    char key[24];
    s_key(c->rid, key);
    zhashx_delete(s_tok.comps, key);
    c->running = false;
    c->g->running--;
}

// Adapter held (or none needed): one TokenizedReq per completion. The scheduler gets the
// request's deadline with arrival_ms = now, so it counts only the time left; this actor's timer
// fires first, and a timeout is reported as TIMEOUT.
static void s_dispatch_group(greq_t *g) {
    const ls_msg_generate_req_t *req = &g->req.u.generate_req;
    // Nothing waits for a restarting scheduler: what reaches it first must be the registry's
    // adapters (queued when it went down), not a request naming one of them.
    if (s_tok.scheduler_down) {
        s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_UNAVAILABLE,
                    "the scheduler is restarting; retry the request");
        return;
    }
    if (!(g->comps = calloc(g->n, sizeof *g->comps)))
        s_oom();
    uint64_t now_ms = ls_actor_now_ns(s_tok.actor) / 1000000;
    for (uint32_t i = 0; i < g->n; i++) {
        comp_t *c = &g->comps[i];
        c->rid = ++s_tok.next_id;
        c->index = i;
        c->g = g;
    }
    for (uint32_t i = 0; i < g->n && !g->closed; i++) {
        comp_t *c = &g->comps[i];
        ls_msg_t m;
        if (tmodel_request(s_tok.model, req, &g->ids, i, g->adapter_id, g->added ? &g->added->list : NULL, now_ms,
                           g->deadline_ms, &m) < 0)
            s_oom();
        m.rid = c->rid;
        s_count("prompt_tokens_total", g->ids.n);
        int rc = ls_actor_send_peer(s_tok.actor, s_tok.scheduler, &m, NULL);
        ls_msg_clear(&m);
        if (rc < 0) {
            s_comp_fail(c, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_UNAVAILABLE, "the scheduler cannot be reached");
            continue;
        }
        char key[24];
        s_key(c->rid, key);
        zhashx_insert(s_tok.comps, key, c);
        c->running = true;
        g->running++;
    }
}

// ---------------------------------------------------------------------------------------------
// handlers: clients

// A refusal before any state exists: the request's one TextOut.
static void s_refuse(ls_actor_t *a, const ls_in_t *in, uint32_t code, const char *why) {
    ls_info(in->msg->rid, "refused (%s): %s", ls_error_code_name(code), why);
    s_count_refusal(code);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.rid = in->msg->rid;
    m.u.text_out.text = ls_msg_textdup("", 0);
    m.u.text_out.finish = LS_FINISH_REASON_ERROR;
    m.u.text_out.error_code = code;
    m.u.text_out.error = ls_msg_strdup(why);
    m.u.text_out.last = true;
    ls_actor_reply(a, in, &m);
    ls_msg_clear(&m);
}

static void s_on_deadline(ls_actor_t *a, ls_timer_t *t, void *arg) {
    greq_t *g = arg;
    ls_actor_timer_stop(a, t);
    g->timer = NULL;
    if (g->closed)
        return;
    char why[96];
    snprintf(why, sizeof why, "timed out after %u ms (timeout_ms)", g->req.u.generate_req.timeout_ms);
    ls_info(g->client_rid, "%s", why);
    s_count("timeouts_total", 1);
    if (g->acquiring) {
        s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_TIMEOUT, why);
        s_gauge();
        return;
    }
    for (uint32_t i = 0; i < g->n && !g->closed; i++) {
        comp_t *c = &g->comps[i];
        if (c->done)
            continue;
        if (c->running)
            s_abort_comp(c, LS_FINISH_REASON_ABORT, why);
        s_comp_fail(c, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_TIMEOUT, why);
    }
    s_maybe_free(g);
    s_gauge();
}

// The wall clock a chat template's strftime_now reads: the recorded start plus the event time.
static int64_t s_unix_now(ls_actor_t *a) {
    return s_tok.unix_start + (int64_t)((ls_actor_now_ns(a) - s_tok.mono_start) / 1000000000u);
}

// Asks the registry for g's adapter, or for the next component of its mix (they are acquired
// one after the other, so a refusal leaves only those before it to give back).
static void s_acquire_next(greq_t *g) {
    const ls_msg_generate_req_t *req = &g->req.u.generate_req;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ACQUIRE_ADAPTER);
    m.rid = g->id;
    m.u.acquire_adapter.name = ls_msg_strdup(req->mix.n ? req->mix.v[g->n_held].name : req->adapter);
    int rc = ls_actor_send_peer(s_tok.actor, "registry", &m, NULL);
    ls_msg_clear(&m);
    if (rc < 0) {
        s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_UNAVAILABLE, "the adapter registry cannot be reached");
        return;
    }
    char gkey[24];
    s_key(g->id, gkey);
    zhashx_insert(s_tok.acquires, gkey, g);
    g->acquiring = true;
}

static int s_on_generate(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    const ls_msg_generate_req_t *req = &in->msg->u.generate_req;
    s_count("requests_total", 1);
    char *key = s_client_key(in);
    if (!key)
        s_oom();
    if (zhashx_lookup(s->clients, key)) {
        free(key);
        s_refuse(a, in, LS_ERROR_CODE_BAD_REQUEST, "request id already in use by a request of this client");
        return -1;
    }
    // Each client's share of this actor: its open requests are bounded, so one client's flood
    // is answered at once and costs the others nothing.
    char *client = s_client_id(in, false);
    if (!client)
        s_oom();
    uintptr_t open = s_client_open(client);
    if (open >= (uintptr_t)s->max_client_requests) {
        char why[128];
        snprintf(why, sizeof why, "client %s has %" PRIuPTR " requests open (--max-client-requests)", in->from, open);
        ls_warn(in->msg->rid, "%s", why);
        free(key);
        free(client);
        s_refuse(a, in, LS_ERROR_CODE_OVERLOADED, why);
        return -1;
    }
    char err[512];
    ls_token_ids_t ids = {0};
    // a request naming an adapter may give its added ids (input_ids past the vocabulary): they are
    // checked once the adapter's added tokens come with it (s_adapter_prompt)
    bool adapter = req->adapter && *req->adapter && !req->mix.n;
    uint32_t code = tmodel_prompt(s->model, req, NULL, adapter, s_unix_now(a), &ids, err, sizeof err);
    if (code) {
        free(key);
        free(client);
        ls_token_ids_free(&ids);
        s_refuse(a, in, code, err);
        return -1;
    }
    // a mix: its rules (docs/lora-mixing.md), and the adapter or the mix, not both
    if (req->mix.n && (ls_msg_mix_check(&req->mix, false, err, sizeof err) < 0 ||
                       (req->adapter && *req->adapter &&
                        snprintf(err, sizeof err, "give an adapter or a mix of adapters, not both") > 0))) {
        free(key);
        free(client);
        ls_token_ids_free(&ids);
        s_refuse(a, in, LS_ERROR_CODE_BAD_REQUEST, err);
        return -1;
    }
    greq_t *g = calloc(1, sizeof *g);
    if (!g || !(g->route = ls_route_new(in)))
        s_oom();
    g->id = ++s->next_id;
    g->client_rid = in->msg->rid;
    g->arrival_ns = in->now_ns;
    g->key = key;
    g->client = client;
    zhashx_update(s->open_by_client, client, (void *)(open + 1));
    memcpy(&g->req, in->msg, sizeof g->req);  // moved: the runtime's copy is emptied
    ls_msg_init(in->msg, LS_MSG_GENERATE_REQ);
    req = &g->req.u.generate_req;
    g->ids = ids;
    g->n = g->open = tmodel_n(req);
    if ((g->next = s->groups))
        g->next->prev = g;
    s->groups = g;
    zhashx_insert(s->clients, key, g);
    if (req->timeout_ms) {
        g->deadline_ms = in->now_ns / 1000000 + req->timeout_ms;
        g->timer = ls_actor_timer_start(a, req->timeout_ms, 0, s_on_deadline, g);
    }
    if ((req->adapter && *req->adapter) || req->mix.n)
        s_acquire_next(g);
    else
        s_dispatch_group(g);
    s_maybe_free(g);
    s_gauge();
    return 0;
}

static int s_on_client_abort(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    char *key = s_client_key(in);
    if (!key)
        s_oom();
    greq_t *g = zhashx_lookup(s->clients, key);
    free(key);
    if (!g) {
        ls_debug(in->msg->rid, "Abort for a request that is not here (ended already?)");
        return 0;
    }
    const char *why = in->msg->u.abort.reason && *in->msg->u.abort.reason ? in->msg->u.abort.reason : "aborted by the client";
    s_count("aborts_total", 1);
    if (g->acquiring) {
        s_end_whole(g, LS_FINISH_REASON_ABORT, 0, why);
    } else {
        // Each completion's final TextOut (ABORT) comes back through the detokenizer.
        for (uint32_t i = 0; i < g->n; i++)
            if (g->comps[i].running && !g->comps[i].done)
                s_abort_comp(&g->comps[i], LS_FINISH_REASON_ABORT, why);
    }
    s_gauge();
    return 0;
}

// TokenizeReq: answered from the model's text side (no scheduler): at once for the base model;
// naming an adapter, once the registry gave it (its added tokens take part), which is then
// released.
static int s_on_tokenize(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    char err[512];
    s_count("tokenize_requests_total", 1);
    const char *adapter = in->msg->u.tokenize_req.adapter;
    if (adapter && *adapter) {
        tpend_t *p = calloc(1, sizeof *p);
        if (!p || !(p->route = ls_route_new(in)))
            s_oom();
        p->client_rid = in->msg->rid;
        memcpy(&p->req, in->msg, sizeof p->req);  // moved: the runtime's copy is emptied
        ls_msg_init(in->msg, LS_MSG_TOKENIZE_REQ);
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_ACQUIRE_ADAPTER);
        m.rid = ++s->next_id;
        m.u.acquire_adapter.name = ls_msg_strdup(adapter);
        int rc = ls_actor_send_peer(a, "registry", &m, NULL);
        ls_msg_clear(&m);
        char key[24];
        s_key(s->next_id, key);
        if (rc < 0) {
            ls_actor_route_error(a, p->route, p->client_rid, LS_ERROR_CODE_UNAVAILABLE, LS_MSG_TOKENIZE_REQ,
                                 "the adapter registry cannot be reached");
            ls_route_destroy(&p->route);
            ls_msg_clear(&p->req);
            free(p);
            s_count_refusal(LS_ERROR_CODE_UNAVAILABLE);
            return -1;
        }
        zhashx_insert(s->tpend, key, p);
        return 0;
    }
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZE_RESP);
    m.rid = in->msg->rid;
    uint32_t code = tmodel_tokenize(s->model, &in->msg->u.tokenize_req, NULL, s_unix_now(a), &m.u.tokenize_resp, err,
                                    sizeof err);
    int rc = code ? ls_actor_reply_error(a, in, code, "%s", err) : ls_actor_reply(a, in, &m);
    if (code)
        s_count_refusal(code);
    ls_msg_clear(&m);
    return code ? -1 : rc;
}

// The registry's answer for a TokenizeReq's adapter (key: the acquire's rid): the answer with
// its added tokens, or the refusal; the adapter goes back at once.
static void s_tokenize_acquired(ls_actor_t *a, tpend_t *p, uint64_t acquire_rid, ls_msg_adapter_acquired_t *aa) {
    char err[512];
    uint32_t code = 0;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZE_RESP);
    m.rid = p->client_rid;
    added_t *x = NULL;
    if (!aa->ok) {
        code = aa->code ? aa->code : LS_ERROR_CODE_UNAVAILABLE;
        snprintf(err, sizeof err, "%s", aa->reason && *aa->reason ? aa->reason : "the adapter could not be acquired");
    } else if (aa->added_tokens.n && !(x = s_added_hold(aa->adapter_id, &aa->added_tokens, err, sizeof err))) {
        code = LS_ERROR_CODE_BAD_REQUEST;
    } else {
        code = tmodel_tokenize(s_tok.model, &p->req.u.tokenize_req, x ? x->tab : NULL, s_unix_now(a),
                               &m.u.tokenize_resp, err, sizeof err);
    }
    if (code) {
        ls_actor_route_error(a, p->route, p->client_rid, code, LS_MSG_TOKENIZE_REQ, "%s", err);
        s_count_refusal(code);
    } else {
        ls_actor_send_route(a, p->route, &m, NULL);
    }
    if (x)
        s_added_drop(aa->adapter_id);
    if (aa->ok) {
        ls_msg_t r;
        ls_msg_init(&r, LS_MSG_RELEASE_ADAPTER);
        r.rid = acquire_rid;
        r.u.release_adapter.adapter_id = ls_msg_strdup(aa->adapter_id);
        r.u.release_adapter.name = ls_msg_strdup(p->req.u.tokenize_req.adapter);
        ls_actor_send_peer(a, "registry", &r, NULL);
        ls_msg_clear(&r);
    }
    ls_msg_clear(&m);
    ls_msg_clear(&p->req);
    ls_route_destroy(&p->route);
    free(p);
}

// A request of one adapter, now held: its added tokens held too when it has some, and its
// prompt built again with them when they can change it (or its input_ids go past the
// vocabulary, which only they allow). 0, or -1 after ending g with the refusal.
static int s_adapter_prompt(greq_t *g, ls_msg_adapter_acquired_t *aa) {
    int32_t vocab = ls_tokenizer_vocab_size(tmodel_tokenizer(s_tok.model));
    bool past = false;
    for (size_t i = 0; i < g->ids.n && !past; i++)
        past = g->ids.ids[i] >= vocab;
    if (!aa->added_tokens.n && !past)
        return 0;
    char err[512], why[640];
    if (aa->added_tokens.n && !(g->added = s_added_hold(g->adapter_id, &aa->added_tokens, err, sizeof err))) {
        snprintf(why, sizeof why, "adapter %.64s: %s", aa->name ? aa->name : "?", err);
        s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_BAD_REQUEST, why);
        return -1;
    }
    ls_token_ids_t ids = {0};
    uint32_t code = tmodel_prompt(s_tok.model, &g->req.u.generate_req, g->added ? g->added->tab : NULL, false,
                                  s_unix_now(s_tok.actor), &ids, err, sizeof err);
    if (code) {
        ls_token_ids_free(&ids);
        s_end_whole(g, LS_FINISH_REASON_ERROR, code, err);
        return -1;
    }
    ls_token_ids_free(&g->ids);
    g->ids = ids;
    return 0;
}

// LoadAdapter, UnloadAdapter, ListAdapters: to the registry under a rid of ours, bulk frames
// (from_tensors weights) included.
static int s_on_relay(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    relay_t *r = calloc(1, sizeof *r);
    if (!r || !(r->route = ls_route_new(in)))
        s_oom();
    r->client_rid = in->msg->rid;
    r->type = in->msg->type;
    in->msg->rid = ++s->next_id;
    zmsg_t *bulk = in->bulk;
    in->bulk = NULL;
    if (ls_actor_send_peer(a, "registry", in->msg, &bulk) < 0) {
        in->msg->rid = r->client_rid;
        ls_route_destroy(&r->route);
        free(r);
        ls_actor_reply_error(a, in, LS_ERROR_CODE_UNAVAILABLE, "the adapter registry cannot be reached");
        return -1;
    }
    char key[24];
    s_key(in->msg->rid, key);
    zhashx_insert(s->relays, key, r);
    s_count("relays_total", 1);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// handlers: the graph

static int s_on_text_out(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    if (!in->identity || strcmp(in->from, "detokenizer") != 0) {
        ls_warn(in->msg->rid, "TextOut from %s ignored: only the detokenizer's count", in->from);
        return 0;
    }
    char key[24];
    s_key(in->msg->rid, key);
    comp_t *c = zhashx_lookup(s->comps, key);
    if (!c) {
        ls_debug(in->msg->rid, "TextOut for a completion that is not here (ended already?)");
        return 0;
    }
    greq_t *g = c->g;
    if (in->msg->u.text_out.finish != LS_FINISH_REASON_NONE)
        s_comp_ended(c);
    s_comp_output(c, in->msg);
    s_maybe_free(g);
    s_gauge();
    return 0;
}

static int s_on_acquired(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    char key[24];
    s_key(in->msg->rid, key);
    greq_t *g = zhashx_lookup(s->acquires, key);
    ls_msg_adapter_acquired_t *aa = &in->msg->u.adapter_acquired;
    // a grant that names no adapter id is held under the empty one: the holds key on it
    if (!aa->adapter_id && !(aa->adapter_id = ls_msg_strdup("")))
        s_oom();
    tpend_t *p = g ? NULL : zhashx_lookup(s->tpend, key);
    if (p) {
        zhashx_delete(s->tpend, key);
        s_tokenize_acquired(a, p, in->msg->rid, aa);
        return 0;
    }
    if (!g) {
        ls_warn(in->msg->rid, "AdapterAcquired for no request of ours");
        return 0;
    }
    zhashx_delete(s->acquires, key);
    g->acquiring = false;
    ls_msg_mix_parts_t *mix = &g->req.u.generate_req.mix;
    char **held = mix->n ? &mix->v[g->n_held].adapter_id : &g->adapter_id;
    if (aa->ok) {
        if (!(*held = strdup(aa->adapter_id)))
            s_oom();
        g->n_held += mix->n > 0;
    }
    if (g->closed)
        s_release(g);  // ended while waiting: the holds go straight back
    else if (!aa->ok)
        s_end_whole(g, LS_FINISH_REASON_ERROR, aa->code ? aa->code : LS_ERROR_CODE_UNAVAILABLE,
                    aa->reason && *aa->reason ? aa->reason : "the adapter could not be acquired");
    else if (mix->n && aa->token_rows) {
        // its rows replace the base model's rather than add to them: no weight scales them
        char why[256];
        snprintf(why, sizeof why, "adapter %.64s of the mix replaces or adds %u rows of the embedding "
                 "or lm_head (trainable tokens, added vocabulary), which do not mix; use it alone",
                 aa->name ? aa->name : "?", aa->token_rows);
        s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_BAD_REQUEST, why);
    } else if (g->n_held < mix->n)
        s_acquire_next(g);
    else if (mix->n || s_adapter_prompt(g, aa) == 0)
        s_dispatch_group(g);
    s_maybe_free(g);
    s_gauge();
    return 0;
}

// AdapterLoaded, AdapterUnloaded, AdapterList: the registry's answer to a relay.
static int s_on_relayed_answer(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    char key[24];
    s_key(in->msg->rid, key);
    relay_t *r = zhashx_lookup(s->relays, key);
    if (in->identity || strcmp(in->from, "registry") != 0 || !r) {
        ls_warn(in->msg->rid, "%s from %s answers nothing of ours: ignored", ls_msg_type_name(in->msg->type), in->from);
        return 0;
    }
    zhashx_delete(s->relays, key);
    if (in->msg->type == LS_MSG_ADAPTER_UNLOADED && in->msg->u.adapter_unloaded.ok)
        latency_forget(s->latency, in->msg->u.adapter_unloaded.name);
    in->msg->rid = r->client_rid;
    zmsg_t *bulk = in->bulk;
    in->bulk = NULL;
    ls_actor_send_route(a, r->route, in->msg, &bulk);
    ls_route_destroy(&r->route);
    free(r);
    return 0;
}

// Error from the registry (a relay or an acquire it could not take) or from the scheduler (a
// TokenizedReq it refused; an Abort that came too late is not an error worth telling).
static int s_on_error(ls_actor_t *a, ls_in_t *in, void *state) {
    tok_t *s = state;
    const ls_msg_error_t *e = &in->msg->u.error;
    const char *why = e->message && *e->message ? e->message : "refused";
    char key[24];
    s_key(in->msg->rid, key);
    if (!in->identity && !strcmp(in->from, "registry")) {
        if (zhashx_lookup(s->relays, key))
            return s_on_relayed_answer(a, in, state);
        if (zhashx_lookup(s->acquires, key) || zhashx_lookup(s->tpend, key)) {
            ls_msg_t m;
            ls_msg_init(&m, LS_MSG_ADAPTER_ACQUIRED);
            m.rid = in->msg->rid;
            m.u.adapter_acquired.code = e->code;
            m.u.adapter_acquired.reason = ls_msg_strdup(why);
            ls_in_t fake = *in;
            fake.msg = &m;
            s_on_acquired(a, &fake, state);
            ls_msg_clear(&m);
        }
        return 0;
    }
    comp_t *c = !in->identity && !strcmp(in->from, s_tok.scheduler) && e->ref_type != LS_MSG_ABORT
                    ? zhashx_lookup(s->comps, key)
                    : NULL;
    if (!c) {
        ls_debug(in->msg->rid, "Error from %s (%s): %s", in->from, ls_error_code_name(e->code), why);
        return 0;
    }
    greq_t *g = c->g;
    ls_info(g->client_rid, "the scheduler refused completion %u: %s", c->index, why);
    s_comp_ended(c);
    s_comp_fail(c, LS_FINISH_REASON_ERROR, e->code ? e->code : LS_ERROR_CODE_INTERNAL, why);
    s_maybe_free(g);
    s_gauge();
    return 0;
}

// ---------------------------------------------------------------------------------------------
// supervision: the launcher says an actor went down (docs/operations.md, "Supervision")

// The scheduler or the detokenizer went down: the outputs of every completion at the scheduler
// are lost (a restarted detokenizer has no stream for them; the scheduler aborts them itself,
// and a restarted one knows none of them). Each is answered now with an error.
static void s_fail_running(const char *why) {
    for (greq_t *g = s_tok.groups, *next; g; g = next) {
        next = g->next;
        for (uint32_t i = 0; g->comps && i < g->n; i++) {
            comp_t *c = &g->comps[i];
            if (!c->running)
                continue;
            s_comp_ended(c);
            s_comp_fail(c, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_UNAVAILABLE, why);
        }
        s_maybe_free(g);
    }
}

// A relayed request whose answer will not come through here (why). A listing is refused with
// code; a load or unload went on to the registry and may take effect all the same (a registry
// that went down may have written it to its journal, which its restart restores; a registry
// still up completes it), so saying it failed could be false: its outcome is unknown.
static void s_relay_lost(relay_t *r, uint32_t code, const char *why) {
    if (r->type == LS_MSG_LIST_ADAPTERS)
        ls_actor_route_error(s_tok.actor, r->route, r->client_rid, code, r->type, "%s", why);
    else
        ls_actor_route_error(s_tok.actor, r->route, r->client_rid, LS_ERROR_CODE_OUTCOME_UNKNOWN, r->type,
                             "no answer from the registry for this %s (%s); it may take effect all the same: list the "
                             "adapters to know",
                             r->type == LS_MSG_LOAD_ADAPTER ? "load" : "unload", why);
    ls_route_destroy(&r->route);
    free(r);
}

// TokenizeReqs waiting on their adapter's acquire: answered with code (why), now.
static void s_fail_tokenizes(uint32_t code, const char *why) {
    for (tpend_t *p = zhashx_first(s_tok.tpend); p; p = zhashx_next(s_tok.tpend)) {
        ls_actor_route_error(s_tok.actor, p->route, p->client_rid, code, LS_MSG_TOKENIZE_REQ, "%s", why);
        ls_msg_clear(&p->req);
        ls_route_destroy(&p->route);
        free(p);
    }
    zhashx_purge(s_tok.tpend);
}

// The registry went down: acquires and relays waiting on it will never be answered.
static void s_fail_registry_waits(const char *why) {
    for (greq_t *g = zhashx_first(s_tok.acquires); g; g = zhashx_next(s_tok.acquires)) {
        g->acquiring = false;
        if (!g->closed)
            s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_UNAVAILABLE, why);
    }
    zhashx_purge(s_tok.acquires);
    s_fail_tokenizes(LS_ERROR_CODE_UNAVAILABLE, why);
    for (relay_t *r = zhashx_first(s_tok.relays); r; r = zhashx_next(s_tok.relays))
        s_relay_lost(r, LS_ERROR_CODE_UNAVAILABLE, why);
    zhashx_purge(s_tok.relays);
    for (greq_t *g = s_tok.groups, *next; g; g = next) {
        next = g->next;
        s_maybe_free(g);
    }
}

// A client actor (the gateway) went down: its requests have nobody to answer; stop them.
static void s_drop_client(const char *name) {
    char prefix[2 * 64 + 2];
    size_t n = strlen(name);
    if (n > 64)
        return;
    for (size_t i = 0; i < n; i++)
        snprintf(prefix + 2 * i, 3, "%02x", (unsigned char)name[i]);
    snprintf(prefix + 2 * n, 2, ":");
    for (greq_t *g = s_tok.groups, *next; g; g = next) {
        next = g->next;
        if (!g->closed && g->key && !strncmp(g->key, prefix, 2 * n + 1))
            s_client_gone(g);
        s_maybe_free(g);
    }
}

static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    if (ps->actor && !strcmp(ps->actor, s_tok.scheduler))
        s_tok.scheduler_down = !ps->up;
    if (ps->up || !ps->actor)
        return 0;
    char why[300];
    snprintf(why, sizeof why, "the %s went down (%s); retry the request", ps->actor, ps->reason ? ps->reason : "");
    ls_warn(0, "%s is down: answering what waited on it", ps->actor);
    if (!strcmp(ps->actor, s_tok.scheduler) || !strcmp(ps->actor, "detokenizer"))
        s_fail_running(why);
    else if (!strcmp(ps->actor, "registry"))
        s_fail_registry_waits(why);
    else
        s_drop_client(ps->actor);
    s_gauge();
    return 0;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_GENERATE_REQ, s_on_generate},
    {LS_MSG_ABORT, s_on_client_abort},
    {LS_MSG_TOKENIZE_REQ, s_on_tokenize},
    {LS_MSG_LOAD_ADAPTER, s_on_relay},
    {LS_MSG_UNLOAD_ADAPTER, s_on_relay},
    {LS_MSG_LIST_ADAPTERS, s_on_relay},
    {LS_MSG_TEXT_OUT, s_on_text_out},
    {LS_MSG_ADAPTER_ACQUIRED, s_on_acquired},
    {LS_MSG_ADAPTER_LOADED, s_on_relayed_answer},
    {LS_MSG_ADAPTER_UNLOADED, s_on_relayed_answer},
    {LS_MSG_ADAPTER_LIST, s_on_relayed_answer},
    {LS_MSG_ERROR, s_on_error},
    {0, NULL},
};

// ---------------------------------------------------------------------------------------------
// start-up and shutdown

static int s_start(ls_actor_t *a, void *state) {
    tok_t *s = state;
    s->actor = a;
    if (!s->model_path) {
        ls_error(0, "--model-path is required: the model directory (tokenizer.json, tokenizer_config.json, config.json)");
        return -1;
    }
    if (s->max_client_requests < 1) {
        ls_error(0, "--max-client-requests must be at least 1");
        return -1;
    }
    char err[1024];
    if (!(s->model = tmodel_load(s->model_path, s->chat_template, err, sizeof err))) {
        ls_error(0, "%s: %s", s->chat_template && strstr(err, s->chat_template) ? "--chat-template" : "--model-path",
                 err);
        return -1;
    }
    if (s->metrics_max_adapters < 0) {
        ls_error(0, "--metrics-max-adapters must be 0 or more");
        return -1;
    }
    if (!(s->latency = latency_new(s->metrics_max_adapters)))
        s_oom();
    // The wall clock goes through the trace, so a replayed chat template dates its prompt alike.
    zmsg_t *in = zmsg_new();
    if (!ls_actor_replaying(a)) {
        int64_t now = (int64_t)time(NULL);
        zmsg_addmem(in, &now, sizeof now);
    }
    ls_actor_input(a, "tokenizer.clock", &in);
    zframe_t *clock = zmsg_first(in);
    if (clock && zframe_size(clock) == sizeof s->unix_start)
        memcpy(&s->unix_start, zframe_data(clock), sizeof s->unix_start);
    s->mono_start = ls_actor_now_ns(a);
    zmsg_destroy(&in);
    s->comps = zhashx_new();
    s->acquires = zhashx_new();
    s->tpend = zhashx_new();
    s->added = zhashx_new();
    s->clients = zhashx_new();
    s->relays = zhashx_new();
    s->open_by_client = zhashx_new();
    if (!s->comps || !s->acquires || !s->tpend || !s->added || !s->clients || !s->relays || !s->open_by_client)
        s_oom();
    for (const char *const *p = (const char *const[]){"registry", s->scheduler, NULL}; *p; p++)
        if (!ls_actor_has_peer(a, *p))
            ls_warn(0, "no --peer %s=…: requests that need it will be refused", *p);
    s_gauge();
    ls_info(0, "model %s: context %u tokens", s->model_path, tmodel_context(s->model));
    return 0;
}

// Every request still open is answered now (the scheduler is told to stop its completions);
// relays waiting on the registry hear SHUTTING_DOWN.
static void s_shutdown(ls_actor_t *a, void *state) {
    tok_t *s = state;
    for (greq_t *g = s->groups, *next; g; g = next) {
        next = g->next;
        if (g->closed)
            continue;
        if (g->acquiring) {
            s_end_whole(g, LS_FINISH_REASON_ERROR, LS_ERROR_CODE_SHUTTING_DOWN, "the tokenizer is shutting down");
            continue;
        }
        for (uint32_t i = 0; i < g->n && !g->closed; i++) {
            if (g->comps[i].done)
                continue;
            if (g->comps[i].running)
                s_abort_comp(&g->comps[i], LS_FINISH_REASON_ABORT, "the tokenizer is shutting down");
            s_comp_fail(&g->comps[i], LS_FINISH_REASON_ERROR, LS_ERROR_CODE_SHUTTING_DOWN,
                        "the tokenizer is shutting down");
        }
    }
    for (relay_t *r = zhashx_first(s->relays); r; r = zhashx_next(s->relays))
        s_relay_lost(r, LS_ERROR_CODE_SHUTTING_DOWN, "the tokenizer is shutting down");
    zhashx_purge(s->relays);
    s_fail_tokenizes(LS_ERROR_CODE_SHUTTING_DOWN, "the tokenizer is shutting down");
}

static void s_destroy(ls_actor_t *a, void *state) {
    tok_t *s = state;
    while (s->groups) {
        greq_t *g = s->groups;
        g->closed = true;
        g->acquiring = false;
        g->running = 0;
        s_maybe_free(g);
    }
    zhashx_destroy(&s->comps);
    zhashx_destroy(&s->acquires);
    for (tpend_t *p = zhashx_first(s->tpend); p; p = zhashx_next(s->tpend)) {  // s_shutdown answered them
        ls_msg_clear(&p->req);
        ls_route_destroy(&p->route);
        free(p);
    }
    zhashx_destroy(&s->tpend);
    for (added_t *x = zhashx_first(s->added); x; x = zhashx_next(s->added)) {  // groups freed unreleased
        ls_tok_added_destroy(&x->tab);
        s_added_list_free(&x->list);
        free(x);
    }
    zhashx_destroy(&s->added);
    zhashx_destroy(&s->clients);
    zhashx_destroy(&s->relays);
    zhashx_destroy(&s->open_by_client);
    tmodel_destroy(&s->model);
    latency_destroy(&s->latency);
}

static void s_metrics(ls_actor_t *a, ls_msg_metrics_t *m, void *state) {
    tok_t *s = state;
    if (s->latency && latency_export(s->latency, m) < 0)
        ls_warn(0, "out of memory: latency histograms left out of this Metrics");
}

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("model-path", &s_tok.model_path, NULL,
                    "model directory: tokenizer.json, tokenizer_config.json (chat template), config.json"),
        LS_FLAG_INT("max-client-requests", &s_tok.max_client_requests, "4096",
                    "requests one client (the gateway, an SDK client) may have open; more are refused OVERLOADED"),
        LS_FLAG_STR("chat-template", &s_tok.chat_template, NULL,
                    "a Jinja chat template file used instead of the model's (chat_template.jinja, "
                    "tokenizer_config.json's chat_template)"),
        LS_SCHEDULER_FLAG(&s_tok.scheduler),
        LS_METRICS_MAX_ADAPTERS_FLAG(&s_tok.metrics_max_adapters),
        LS_FLAG_END,
    };
    const ls_actor_def_t def = {.name = "tokenizer",
                                .about = "loraserve tokenizer: the front door for clients",
                                .dispatch = s_dispatch,
                                .flags = flags,
                                .state = &s_tok,
                                .on_start = s_start,
                                .on_shutdown = s_shutdown,
                                .on_destroy = s_destroy,
                                .on_metrics = s_metrics};
    return ls_actor_main(argc, argv, &def);
}
