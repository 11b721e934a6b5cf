// admin — the gateway's calls besides generation (gateway_impl.h): GET /v1/models and the
// adapter loads and unloads (from a path or from tensors, vLLM's and SGLang's), /health and
// /health/live with the launcher's PeerStatus and the heartbeats, /tokenize and /detokenize,
// and /metrics: the gateway's own counts and the GetMetrics answers of every other actor.
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gateway_impl.h"
#include "prom.h"

#define S_STARTING "the graph is starting: not every actor is ready"  // /health's 503 until told more
#define S_HEALTH_MS 1000      // the tokenizer answers a ping this fast, or /health says 503
#define S_METRICS_MS 1000     // actors that have not answered GetMetrics by then are left out
#define S_LIST_MS 10000       // ListAdapters
#define S_ADAPTER_MS 300000   // the net for a load or unload answer lost upstream (503 outcome_unknown)

static void s_metrics_answer(gw_call_t *c);

// ---------------------------------------------------------------------------------------------
// metrics of the gateway itself

// Series i's counts into "other"'s: its model gave the series up (ls_series.h).
static void s_model_fold(int i) {
    gw_model_stat_t *o = &gw_state.models[LS_SERIES_OTHER];
    o->requests += gw_state.models[i].requests;
    o->prompt_tokens += gw_state.models[i].prompt_tokens;
    o->completion_tokens += gw_state.models[i].completion_tokens;
    memset(&gw_state.models[i], 0, sizeof gw_state.models[i]);
}

// The counts of a model (the base's name, or an adapter's) that was answered: only then does it
// get a series, so a name nobody serves (404) never makes one.
gw_model_stat_t *gw_model_stat(const char *name) {
    int fold, i = ls_series_take(gw_state.series, strcmp(name, gw_state.base) ? name : "", &fold);
    if (fold >= 0)
        s_model_fold(fold);
    return &gw_state.models[i];
}
// ---------------------------------------------------------------------------------------------
// models, adapters, health

// A load or unload that went upstream and whose answer will not come here (why): the registry
// goes on with it, so saying it failed could be false.
void gw_respond_outcome_unknown(gw_call_t *c, const char *why) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s; the %s of adapter %s may still complete: GET /v1/models tells whether it did", why,
             c->kind == GW_CALL_LOAD ? "load" : "unload", c->label);
    gw_respond_error(c->req, 503, msg, "lora_name", "outcome_unknown");
}

static void s_admin_timeout_cb(ls_actor_t *a, ls_timer_t *timer, void *arg) {
    gw_call_t *c = arg;
    c->timer = NULL;
    ls_actor_timer_stop(a, timer);
    if (c->kind == GW_CALL_METRICS) {
        s_metrics_answer(c);  // with the actors that answered
        return;
    }
    if (c->req && (c->kind == GW_CALL_LOAD || c->kind == GW_CALL_UNLOAD)) {
        gw_respond_outcome_unknown(c, "no answer from the graph in time");
        c->req = NULL;
    } else if (c->req) {
        const char *why =
            c->kind == GW_CALL_HEALTH ? "the tokenizer does not answer" : "no answer from the graph in time";
        gw_respond_error(c->req, c->kind == GW_CALL_HEALTH ? 503 : 504, why, NULL, "timeout");
        c->req = NULL;
    }
    gw_call_free(c);
}

// Send one admin message (and its bulk frames, or NULL) to the tokenizer for call c; -1
// (answered 503) when it cannot go.
static int s_admin_send(gw_call_t *c, ls_msg_t *m, zmsg_t **bulk_p, int timeout_ms) {
    m->rid = gw_call_rid(c);
    c->nopen = 1;
    if (c->timer)  // a call's second message (a tokenize after its model check) starts afresh
        ls_actor_timer_stop(gw_state.self, c->timer);
    c->timer = ls_actor_timer_start(gw_state.self, timeout_ms, 0, s_admin_timeout_cb, c);
    if (ls_actor_send_peer(gw_state.self, GW_TOKENIZER, m, bulk_p) < 0) {
        gw_respond_error(c->req, 503, "the tokenizer is unavailable", NULL, "unavailable");
        c->req = NULL;
        gw_call_free(c);
        return -1;
    }
    return 0;
}

static gw_call_t *s_admin_answer(ls_in_t *in, gw_call_kind_t kind) {
    gw_call_t *c = gw_call_of(in);
    return c && c->kind == kind ? c : NULL;
}

void gw_models_start(gw_req_t *req) {
    gw_call_t *c = gw_call_new(GW_CALL_MODELS, req);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LIST_ADAPTERS);
    if (c)
        s_admin_send(c, &m, NULL, S_LIST_MS);
    else
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
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

static void s_tokenize_listed(gw_call_t *c, const ls_msg_adapter_infos_t *list);

int gw_on_adapter_list(ls_actor_t *a, ls_in_t *in, void *state) {
    gw_call_t *c = gw_call_of(in);
    if (c && c->kind == GW_CALL_TOKENIZE) {
        s_tokenize_listed(c, &in->msg->u.adapter_list.adapters);  // c may be gone after
        return 0;
    }
    if (!c || c->kind != GW_CALL_MODELS)
        return 0;
    long now = gw_unix_time();
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON_AddItemToArray(data,
                         s_model_entry(gw_state.base, gw_state.model_path ? gw_state.model_path : gw_state.base, NULL, now));
    const ls_msg_adapter_infos_t *list = &in->msg->u.adapter_list.adapters;
    for (size_t i = 0; i < list->n; i++) {
        const ls_msg_adapter_info_t *info = &list->v[i];
        if (!s_servable(info))
            continue;
        cJSON *e = s_model_entry(info->name, info->path ? info->path : info->name, gw_state.base, now);
        cJSON_AddNumberToObject(e, "lora_rank", info->rank);
        cJSON_AddBoolToObject(e, "pinned", info->pinned);
        cJSON_AddItemToArray(data, e);
    }
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    gw_respond_json(c->req, 200, body);
    free(body);
    c->req = NULL;
    gw_call_free(c);
    return 0;
}

// Load and unload bodies, vLLM's and SGLang's alike: {"lora_name", "lora_path", "pinned"}, or
// for a load from tensors {"lora_name", "lora_config", "lora_tensors", "pinned"} (gw_tensors_parse).
void gw_adapter_start(gw_req_t *req, gw_call_kind_t kind, int sglang) {
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
    else if (kind == GW_CALL_LOAD &&
             (tensors = gw_tensors_parse(root, (size_t)gw_state.max_lora_tensor_mb << 20, &config, &weights,
                                         &weights_len, err, sizeof err, &param, &code)) < 0)
        bad = err;
    else if (kind == GW_CALL_LOAD && !tensors && (!cJSON_IsString(path) || !*path->valuestring))
        bad = "'lora_path' must be a non-empty string (or load from tensors: 'lora_config' and 'lora_tensors')",
        param = "lora_path";
    else if (pinned && !cJSON_IsBool(pinned) && !cJSON_IsNull(pinned))
        bad = "'pinned' must be a boolean", param = "pinned";
    if (bad) {
        cJSON_Delete(root);
        free(config);
        free(weights);
        gw_respond_error(req, 400, bad, param, code);
        return;
    }
    gw_req_set_tag(req, name->valuestring);
    gw_call_t *c = gw_call_new(kind, req);
    if (!c) {
        cJSON_Delete(root);
        free(config);
        free(weights);
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    c->sglang = sglang;
    snprintf(c->label, sizeof c->label, "%s", name->valuestring);
    ls_msg_t m;
    zmsg_t *bulk = NULL;
    if (kind == GW_CALL_LOAD) {
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

static void s_adapter_done(gw_call_t *c, bool ok, uint32_t code, const char *reason) {
    const char *verb = c->kind == GW_CALL_LOAD ? "added" : "removed";
    int status = ok ? 200 : gw_status_of(code);
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
        gw_respond_json(c->req, status, body);
        free(body);
    } else if (ok)
        gw_req_respond(c->req, 200, "text/plain; charset=utf-8", NULL, msg, strlen(msg));  // vLLM answers text
    else {
        char lc[32];
        gw_lower(lc, sizeof lc, ls_error_code_name(code));
        gw_respond_error(c->req, status, msg, "lora_name", lc[0] ? lc : NULL);
    }
    c->req = NULL;
    gw_call_free(c);
}

int gw_on_adapter_loaded(ls_actor_t *a, ls_in_t *in, void *state) {
    gw_call_t *c = s_admin_answer(in, GW_CALL_LOAD);
    const ls_msg_adapter_loaded_t *r = &in->msg->u.adapter_loaded;
    if (c)
        s_adapter_done(c, r->ok, r->code, r->reason);
    return 0;
}

int gw_on_adapter_unloaded(ls_actor_t *a, ls_in_t *in, void *state) {
    gw_call_t *c = s_admin_answer(in, GW_CALL_UNLOAD);
    const ls_msg_adapter_unloaded_t *r = &in->msg->u.adapter_unloaded;
    int i = r->ok && c ? ls_series_drop(gw_state.series, c->label) : -1;
    if (i >= 0)
        s_model_fold(i);  // an adapter gone keeps no series (ls_series.h)
    if (c)
        s_adapter_done(c, r->ok, r->code, r->reason);
    return 0;
}

// GET /health is readiness: 503 until the launcher says every actor is Ready (the workers only
// are once the model is loaded) and again while one is down; then the tokenizer must answer a
// ping. Without a launcher (an actor run by hand) the ping alone decides.
void gw_health_start(gw_req_t *req) {
    if (ls_actor_supervised(gw_state.self) && !gw_state.graph_ready) {
        char *body = gw_error_json(503, gw_state.graph_why[0] ? gw_state.graph_why : S_STARTING, NULL, "not_ready");
        gw_req_respond(req, 503, "application/json", "Retry-After: 1\r\n", body, strlen(body));
        free(body);
        return;
    }
    gw_call_t *c = gw_call_new(GW_CALL_HEALTH, req);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_HEARTBEAT);
    m.u.heartbeat.actor = ls_msg_strdup(ls_actor_name(gw_state.self));
    if (c)
        s_admin_send(c, &m, NULL, S_HEALTH_MS);
    else
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
    ls_msg_clear(&m);
}

// GET /health/live is liveness: this process and its loop run (no other actor is asked).
void gw_live_start(gw_req_t *req) { gw_respond_json(req, 200, "{\"status\":\"alive\"}"); }

// The launcher's news of the graph: readiness follows it, and when the tokenizer went down
// every request waiting on it is answered now (it will not be by the restarted one).
int gw_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    gw_state.graph_ready = ps->graph_ready;
    if (!ps->up)
        snprintf(gw_state.graph_why, sizeof gw_state.graph_why, "%s is down and being restarted",
                 ps->actor ? ps->actor : "an actor");
    else if (!ps->graph_ready)
        snprintf(gw_state.graph_why, sizeof gw_state.graph_why, S_STARTING);
    if (ps->up || !ps->actor || strcmp(ps->actor, GW_TOKENIZER) != 0)
        return 0;
    const char *why = "the tokenizer went down and is being restarted; retry the request";
    for (gw_call_t *c = gw_state.calls, *next; c; c = next) {
        next = c->next;
        if (c->kind == GW_CALL_METRICS)
            continue;  // asks every actor; its timer answers with those that replied
        if (c->kind == GW_CALL_GEN && c->req)
            gw_gen_fail(c, 503, why, NULL, "unavailable");
        else {
            if (c->req)
                gw_respond_error(c->req, 503, why, NULL, "unavailable");
            c->req = NULL;
            gw_call_free(c);
        }
    }
    return 0;
}

// A Heartbeat on the ROUTER is a ping to this actor (answered, as the runtime would); one on a
// DEALER is the tokenizer's answer to a health ping.
int gw_on_heartbeat(ls_actor_t *a, ls_in_t *in, void *state) {
    if (in->identity) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_HEARTBEAT);
        m.rid = in->msg->rid;
        m.u.heartbeat.actor = ls_msg_strdup(ls_actor_name(a));
        int rc = ls_actor_reply(a, in, &m);
        ls_msg_clear(&m);
        return rc;
    }
    gw_call_t *c = s_admin_answer(in, GW_CALL_HEALTH);
    if (c) {
        gw_respond_json(c->req, 200, "{\"status\":\"ok\"}");
        c->req = NULL;
        gw_call_free(c);
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// /tokenize, /detokenize (vLLM's)

// The field a refusal of the tokenizer names: what it was given to read.
static const char *s_tokenize_param(const gw_call_t *c) {
    const ls_msg_tokenize_req_t *q = &c->tokenize.u.tokenize_req;
    return q->detokenize ? "tokens" : q->chat ? "messages" : "prompt";
}

// An adapter's name goes with the request, so that its added tokens (docs/adapters.md) take
// part; an unknown name is a 404 as vLLM answers it: a name other than the base's is looked up
// first.
void gw_tokenize_start(gw_req_t *req, bool detokenize) {
    size_t len;
    const char *body = gw_req_body(req, &len);
    char err[256], *model;
    const char *param, *code;
    ls_msg_t m;
    if (gw_tokenize_parse(&m, detokenize, body, len, gw_state.base, &model, err, sizeof err, &param, &code) < 0) {
        gw_respond_error(req, 400, err, param, code);
        return;
    }
    gw_req_set_tag(req, model);
    gw_call_t *c = gw_call_new(GW_CALL_TOKENIZE, req);
    if (!c) {
        free(model);
        ls_msg_clear(&m);
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    snprintf(c->label, sizeof c->label, "%s", gw_adapter_of(model, gw_state.base));
    free(model);
    c->tokenize = m;
    if (c->label[0] && !(c->tokenize.u.tokenize_req.adapter = ls_msg_strdup(c->label))) {
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
        c->req = NULL;
        gw_call_free(c);
        return;
    }
    if (!c->label[0]) {
        s_admin_send(c, &c->tokenize, NULL, S_LIST_MS);
        return;
    }
    ls_msg_t list;
    ls_msg_init(&list, LS_MSG_LIST_ADAPTERS);
    s_admin_send(c, &list, NULL, S_LIST_MS);
    ls_msg_clear(&list);
}

static void s_tokenize_listed(gw_call_t *c, const ls_msg_adapter_infos_t *list) {
    for (size_t i = 0; i < list->n; i++)
        if (s_servable(&list->v[i]) && !strcmp(list->v[i].name, c->label)) {
            s_admin_send(c, &c->tokenize, NULL, S_LIST_MS);
            return;
        }
    char msg[400];
    snprintf(msg, sizeof msg, "The model `%s` does not exist.", c->label);
    gw_respond_error(c->req, 404, msg, "model", "model_not_found");
    c->req = NULL;
    gw_call_free(c);
}

int gw_on_tokenize_resp(ls_actor_t *a, ls_in_t *in, void *state) {
    gw_call_t *c = s_admin_answer(in, GW_CALL_TOKENIZE);
    if (!c)
        return 0;
    const ls_msg_tokenize_req_t *q = &c->tokenize.u.tokenize_req;
    char *body = gw_tokenize_answer(&in->msg->u.tokenize_resp, q->detokenize, q->return_token_strs);
    if (body)
        gw_respond_json(c->req, 200, body);
    else
        gw_respond_error(c->req, 500, "the answer cannot be written as JSON (out of memory, or text not UTF-8)", NULL,
                         NULL);
    free(body);
    c->req = NULL;
    gw_call_free(c);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// /metrics

void gw_metrics_start(gw_req_t *req) {
    gw_call_t *c = gw_call_new(GW_CALL_METRICS, req);
    if (!c) {
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    // Every actor the launcher named as a peer, by its name: with --dp-size the groups'
    // scheduler-G and worker-G-R answer each for itself (per-group series).
    int n = ls_actor_peer_count(gw_state.self);
    c->metrics = calloc((size_t)n + 1, sizeof *c->metrics);
    for (int i = 0; i < n; i++) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_GET_METRICS);
        m.rid = gw_call_rid(c);
        if (ls_actor_send_peer(gw_state.self, ls_actor_peer_name(gw_state.self, i), &m, NULL) == 0)
            c->nopen++;
        ls_msg_clear(&m);
    }
    c->timer = ls_actor_timer_start(gw_state.self, S_METRICS_MS, 0, s_admin_timeout_cb, c);
    if (!c->nopen)
        s_metrics_answer(c);
}

static void s_metrics_answer(gw_call_t *c) {
    gw_buf_t b = {0};
    gw_buf_printf(&b, "# HELP loraserve_gateway_http_responses_total HTTP answers by status code\n"
                      "# TYPE loraserve_gateway_http_responses_total counter\n");
    for (int s = 100; s < 600; s++)
        if (gw_state.status_counts[s])
            gw_buf_printf(&b, "loraserve_gateway_http_responses_total{code=\"%d\"} %llu\n", s,
                          (unsigned long long)gw_state.status_counts[s]);
    const char *per_model[][3] = {
        {"loraserve_gateway_requests_total", "generation requests answered, by model (base or adapter)", "r"},
        {"loraserve_gateway_prompt_tokens_total", "prompt tokens of finished requests by model", "p"},
        {"loraserve_gateway_generation_tokens_total", "generated tokens of finished requests by model", "g"},
    };
    for (int k = 0; k < 3; k++) {
        gw_buf_printf(&b, "# HELP %s %s\n# TYPE %s counter\n", per_model[k][0], per_model[k][1], per_model[k][0]);
        for (int i = 0; i < ls_series_slots(gw_state.series); i++) {
            const gw_model_stat_t *m = &gw_state.models[i];
            const char *name = ls_series_name(gw_state.series, i);
            if (!name || !m->requests)
                continue;
            uint64_t v = k == 0 ? m->requests : k == 1 ? m->prompt_tokens : m->completion_tokens;
            gw_buf_printf(&b, "%s{model=\"", per_model[k][0]);
            gw_prom_label(&b, *name ? name : gw_state.base);
            gw_buf_printf(&b, "\"} %llu\n", (unsigned long long)v);
        }
    }
    gw_buf_printf(&b,
                  "# HELP loraserve_gateway_http_connections open HTTP connections\n# TYPE loraserve_gateway_http_connections gauge\n"
                  "loraserve_gateway_http_connections %d\n"
                  "# HELP loraserve_gateway_requests_running generation requests in flight\n"
                  "# TYPE loraserve_gateway_requests_running gauge\nloraserve_gateway_requests_running %d\n",
                  gw_state.http ? gw_http_connections(gw_state.http) : 0, gw_state.ncalls_gen);
    // Every other actor's counters as it reported them, then the inference gateway's series.
    gw_prom_actors(&b, c->metrics, c->nmetrics);
    gw_prom_histograms(&b, c->metrics, c->nmetrics, gw_state.base);
    gw_prom_epp(&b, c->metrics, c->nmetrics, gw_unix_now());
    if (c->req)
        gw_req_respond(c->req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.d, b.n);
    c->req = NULL;
    gw_buf_free(&b);
    gw_call_free(c);
}

int gw_on_metrics(ls_actor_t *a, ls_in_t *in, void *state) {
    gw_call_t *c = s_admin_answer(in, GW_CALL_METRICS);
    if (!c)
        return 0;
    zhashx_delete(gw_state.by_rid, (void *)(uintptr_t)in->msg->rid);  // one answer per actor
    memcpy(&c->metrics[c->nmetrics++], in->msg, sizeof *in->msg);
    ls_msg_init(in->msg, LS_MSG_METRICS);  // moved out
    if (!--c->nopen)
        s_metrics_answer(c);
    return 0;
}

// An upstream refusal of one of our messages (e.g. a tokenizer that does not serve it).
int gw_on_error(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_error_t *e = &in->msg->u.error;
    gw_call_t *c = gw_call_of(in);
    ls_warn(in->msg->rid, "Error from %s: %s: %s", in->from, ls_error_code_name(e->code) ? ls_error_code_name(e->code) : "?",
            e->message ? e->message : "");
    if (!c)
        return 0;
    char msg[512], code[32];
    if (e->code == LS_ERROR_CODE_OUTCOME_UNKNOWN)  // not a refusal: it may have taken effect
        snprintf(msg, sizeof msg, "%s", e->message ? e->message : "the outcome is unknown");
    else
        snprintf(msg, sizeof msg, "%s refused the request: %s", in->from, e->message ? e->message : "no reason given");
    gw_lower(code, sizeof code, ls_error_code_name(e->code));
    int status = gw_status_of(e->code);
    if (c->kind == GW_CALL_GEN) {
        size_t p = 0;
        while (p < c->nrids && c->rids[p] != in->msg->rid)
            p++;
        if (p < c->nrids)
            c->prompt_open[p] = 0;  // nothing runs upstream for it
        gw_gen_fail(c, status, msg, NULL, code[0] ? code : NULL);
    } else if (c->kind == GW_CALL_METRICS) {
        zhashx_delete(gw_state.by_rid, (void *)(uintptr_t)in->msg->rid);
        if (!--c->nopen)
            s_metrics_answer(c);
    } else {
        const char *param = c->kind == GW_CALL_TOKENIZE && status == 400 ? s_tokenize_param(c) : NULL;
        if (c->req)
            gw_respond_error(c->req, c->kind == GW_CALL_HEALTH ? 503 : status, msg, param, code[0] ? code : NULL);
        c->req = NULL;
        gw_call_free(c);
    }
    return 0;
}
