// fake_tokenizer.c — see fake_tokenizer.h for what it answers.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "fake_tokenizer.h"

typedef struct gen {
    zframe_t *identity;
    uint64_t rid;
    char *out[8];               // per completion
    size_t pos[8];
    bool ended[8];
    uint32_t n;
    bool stream, logprobs, hang, silent;
    uint32_t top, max_new, timeout_ms, prompt_tokens;
    int64_t start_ms;
    struct gen *next;
} gen_t;

static pthread_mutex_t s_last_lock = PTHREAD_MUTEX_INITIALIZER;
static char *s_last_buf;
static size_t s_last_len;

int fake_tokenizer_last_request(ls_msg_t *out) {
    pthread_mutex_lock(&s_last_lock);
    int rc = s_last_buf ? ls_msg_decode(s_last_buf, s_last_len, out, NULL) : -1;
    pthread_mutex_unlock(&s_last_lock);
    return rc;
}

static void s_send(zsock_t *router, zframe_t *identity, ls_msg_t *m) {
    char *buf;
    size_t len;
    if (ls_msg_encode(m, &buf, &len) == 0) {
        zframe_t *id = zframe_dup(identity);
        zframe_send(&id, router, ZFRAME_MORE);
        zsock_send(router, "b", buf, len);
        free(buf);
    }
    ls_msg_clear(m);
}

// The next piece of completion i (all of the rest when not streaming, or ending).
static void s_emit(zsock_t *router, gen_t *g, uint32_t i, uint32_t finish) {
    size_t len = strlen(g->out[i]);
    size_t from = g->pos[i];
    size_t to = finish == LS_FINISH_REASON_ABORT ? from : (g->stream && len - from > 4 ? from + 4 : len);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.rid = g->rid;
    ls_msg_text_out_t *t = &m.u.text_out;
    t->index = i;
    t->text = ls_msg_textdup(g->out[i] + from, to - from);
    size_t n = to - from;
    if (n) {
        t->token_ids.v = malloc(n * sizeof(int32_t));
        t->token_ids.n = n;
        if (g->logprobs) {
            t->logprobs.v = malloc(n * sizeof(float));
            t->logprobs.n = n;
        }
        if (g->top) {
            t->top_ids.v = malloc(n * g->top * sizeof(int32_t));
            t->top_logprobs.v = malloc(n * g->top * sizeof(float));
            t->top_ids.n = t->top_logprobs.n = n * g->top;
        }
        for (size_t k = 0; k < n; k++) {
            t->token_ids.v[k] = (unsigned char)g->out[i][from + k];
            if (g->logprobs)
                t->logprobs.v[k] = -0.01f * (float)(from + k);
            for (uint32_t j = 0; j < g->top; j++) {
                t->top_ids.v[k * g->top + j] = t->token_ids.v[k] + 1 + (int32_t)j;
                t->top_logprobs.v[k * g->top + j] = -1.0f - (float)j;
            }
        }
    }
    g->pos[i] = to;
    t->prompt_tokens = g->prompt_tokens;
    t->completion_tokens = (uint32_t)to;
    if (!finish && to == len)
        finish = g->max_new && len == g->max_new ? LS_FINISH_REASON_LENGTH : LS_FINISH_REASON_STOP;
    t->finish = finish;
    if (finish)
        g->ended[i] = true;
    s_send(router, g->identity, &m);
}

static void s_refuse(zsock_t *router, zframe_t *identity, uint64_t rid, uint32_t index, uint32_t code,
                     const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TEXT_OUT);
    m.rid = rid;
    m.u.text_out.index = index;
    m.u.text_out.finish = LS_FINISH_REASON_ERROR;
    m.u.text_out.error_code = code;
    m.u.text_out.error = ls_msg_strdup(why);
    s_send(router, identity, &m);
}

static gen_t *s_generate(zsock_t *router, zframe_t *identity, ls_msg_t *req) {
    ls_msg_generate_req_t *r = &req->u.generate_req;
    const char *prompt = r->text.s ? r->text.s : "";
    char why[128];
    if (r->adapter && !strcmp(r->adapter, "missing")) {
        snprintf(why, sizeof why, "unknown adapter '%s'", r->adapter);
        s_refuse(router, identity, req->rid, 0, LS_ERROR_CODE_NOT_FOUND, why);
        return NULL;
    }
    if (!strncmp(prompt, "refuse:", 7)) {
        snprintf(why, sizeof why, "refused with code %s", prompt + 7);
        s_refuse(router, identity, req->rid, 0, (uint32_t)atoi(prompt + 7), why);
        return NULL;
    }
    if (!strcmp(prompt, "error-msg")) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_ERROR);
        m.rid = req->rid;
        m.u.error.code = LS_ERROR_CODE_UNKNOWN_TYPE;
        m.u.error.message = ls_msg_strdup("tokenizer does not handle GenerateReq");
        s_send(router, identity, &m);
        return NULL;
    }
    char body[1024] = "";
    if (r->chat) {
        cJSON *arr = cJSON_Parse(r->messages ? r->messages : ""), *msg;
        cJSON_ArrayForEach(msg, arr) {
            size_t l = strlen(body);
            snprintf(body + l, sizeof body - l, "%s%s:%s", l ? "|" : "",
                     cJSON_GetStringValue(cJSON_GetObjectItem(msg, "role")),
                     cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content")));
        }
        cJSON_Delete(arr);
    } else
        snprintf(body, sizeof body, "%s", prompt);
    gen_t *g = calloc(1, sizeof *g);
    g->identity = zframe_dup(identity);
    g->rid = req->rid;
    g->n = r->sampling.n ? r->sampling.n : 1;
    if (g->n > 8)
        g->n = 8;
    g->stream = r->stream;
    g->logprobs = r->sampling.logprobs;
    g->top = r->sampling.top_logprobs;
    g->max_new = r->sampling.max_new_tokens;
    g->timeout_ms = r->timeout_ms;
    g->prompt_tokens = (uint32_t)strlen(prompt);
    g->hang = !strcmp(prompt, "hang");
    g->silent = !strcmp(prompt, "silent");
    g->start_ms = zclock_mono();
    for (uint32_t i = 0; i < g->n; i++) {
        char out[1200];
        int len = snprintf(out, sizeof out, "[%s] %s", r->adapter ? r->adapter : "base", body);
        if (g->n > 1)
            snprintf(out + len, sizeof out - (size_t)len, "#%u", i);
        if (g->max_new && strlen(out) > g->max_new)
            out[g->max_new] = 0;
        g->out[i] = strdup(out);
    }
    return g;
}

static void s_gen_free(gen_t *g) {
    for (uint32_t i = 0; i < g->n; i++)
        free(g->out[i]);
    zframe_destroy(&g->identity);
    free(g);
}

static void s_admin(zsock_t *router, zframe_t *identity, ls_msg_t *req, zlist_t *adapters) {
    ls_msg_t m;
    switch (req->type) {
    case LS_MSG_HEARTBEAT:
        ls_msg_init(&m, LS_MSG_HEARTBEAT);
        m.u.heartbeat.actor = ls_msg_strdup("fake-tokenizer");
        m.u.heartbeat.uptime_ms = 1234;
        break;
    case LS_MSG_LOAD_ADAPTER: {
        const char *name = req->u.load_adapter.name;
        if (!strcmp(name, "slow"))
            return;
        ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
        m.u.adapter_loaded.name = ls_msg_strdup(name);
        if (!strcmp(name, "bad")) {
            m.u.adapter_loaded.code = LS_ERROR_CODE_BAD_REQUEST;
            m.u.adapter_loaded.reason = ls_msg_strdup("rank 128 above max_lora_rank 64");
        } else {
            m.u.adapter_loaded.ok = true;
            m.u.adapter_loaded.rank = 8;
            zlist_append(adapters, strdup(name));
        }
        break;
    }
    case LS_MSG_UNLOAD_ADAPTER: {
        ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
        char *found = NULL;
        for (char *a = zlist_first(adapters); a && !found; a = zlist_next(adapters))
            if (!strcmp(a, req->u.unload_adapter.name))
                found = a;
        if (found) {
            zlist_remove(adapters, found);
            free(found);
            m.u.adapter_unloaded.ok = true;
        } else {
            m.u.adapter_unloaded.code = LS_ERROR_CODE_NOT_FOUND;
            m.u.adapter_unloaded.reason = ls_msg_strdup("no adapter by that name");
        }
        break;
    }
    case LS_MSG_LIST_ADAPTERS: {
        ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
        size_t n = zlist_size(adapters), i = 0;
        m.u.adapter_list.adapters.v = calloc(n + 1, sizeof(ls_msg_adapter_info_t));
        m.u.adapter_list.adapters.n = n;
        for (char *a = zlist_first(adapters); a; a = zlist_next(adapters), i++) {
            ls_msg_adapter_info_t *info = &m.u.adapter_list.adapters.v[i];
            info->name = ls_msg_strdup(a);
            char path[128];
            snprintf(path, sizeof path, "/adapters/%s", a);
            info->path = ls_msg_strdup(path);
            info->rank = 8;
            info->state = LS_ADAPTER_STATE_READY;
        }
        break;
    }
    default: return;
    }
    m.rid = req->rid;
    s_send(router, identity, &m);
}

static void s_actor(zsock_t *pipe, void *arg) {
    zsock_t *router = zsock_new(ZMQ_ROUTER);
    if (!router || zsock_bind(router, "%s", (const char *)arg) < 0) {
        zsock_destroy(&router);
        zsock_signal(pipe, 1);
        return;
    }
    zsock_set_linger(router, 0);
    zsock_signal(pipe, 0);
    zlist_t *adapters = zlist_new();
    zlist_append(adapters, strdup("reverse"));
    gen_t *gens = NULL;
    zpoller_t *poller = zpoller_new(pipe, router, NULL);
    while (true) {
        void *which = zpoller_wait(poller, gens ? 1 : -1);
        if (which == pipe || zpoller_terminated(poller))
            break;
        if (which == router) {
            zmsg_t *zm = zmsg_recv(router);
            zframe_t *identity = zmsg_pop(zm);
            zframe_t *body = zmsg_pop(zm);
            ls_msg_t req;
            if (body && ls_msg_decode(zframe_data(body), zframe_size(body), &req, NULL) == 0) {
                if (req.type == LS_MSG_GENERATE_REQ) {
                    pthread_mutex_lock(&s_last_lock);
                    free(s_last_buf);
                    s_last_len = zframe_size(body);
                    s_last_buf = malloc(s_last_len);
                    memcpy(s_last_buf, zframe_data(body), s_last_len);
                    pthread_mutex_unlock(&s_last_lock);
                    gen_t *g = s_generate(router, identity, &req);
                    if (g) {
                        g->next = gens;
                        gens = g;
                    }
                } else if (req.type == LS_MSG_ABORT) {
                    for (gen_t *g = gens; g; g = g->next)
                        if (g->rid == req.rid && zframe_eq(g->identity, identity) && !g->silent)
                            for (uint32_t i = 0; i < g->n; i++)
                                if (!g->ended[i])
                                    s_emit(router, g, i, LS_FINISH_REASON_ABORT);
                } else
                    s_admin(router, identity, &req, adapters);
                ls_msg_clear(&req);
            }
            zframe_destroy(&body);
            zframe_destroy(&identity);
            zmsg_destroy(&zm);
        }
        // One piece per active request per turn, then drop the ended ones.
        int64_t now = zclock_mono();
        for (gen_t *g = gens; g; g = g->next) {
            // A timeout ends each completion as the tokenizer does: ERROR with code TIMEOUT.
            bool timed_out = g->timeout_ms && now - g->start_ms >= g->timeout_ms && !g->silent;
            for (uint32_t i = 0; i < g->n; i++) {
                if (!g->ended[i] && timed_out) {
                    s_refuse(router, g->identity, g->rid, i, LS_ERROR_CODE_TIMEOUT, "timed out (timeout_ms)");
                    g->ended[i] = true;
                } else if (!g->ended[i] && !g->hang && !g->silent)
                    s_emit(router, g, i, LS_FINISH_REASON_NONE);
            }
        }
        for (gen_t **p = &gens; *p;) {
            gen_t *g = *p;
            bool all = true;
            for (uint32_t i = 0; i < g->n; i++)
                all = all && g->ended[i];
            if (all && !g->silent) {
                *p = g->next;
                s_gen_free(g);
            } else
                p = &g->next;
        }
    }
    while (gens) {
        gen_t *g = gens;
        gens = g->next;
        s_gen_free(g);
    }
    for (char *a = zlist_first(adapters); a; a = zlist_next(adapters))
        free(a);
    zlist_destroy(&adapters);
    zpoller_destroy(&poller);
    zsock_destroy(&router);
}

zactor_t *fake_tokenizer_new(const char *endpoint) {
    return zactor_new(s_actor, (void *)endpoint);
}
