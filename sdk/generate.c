// generate.c — generation: the request's GenerateReq, the stream (one request's answers in
// order), and the blocking and callback forms built on it, which add the pieces up into an
// ls_result_t.
//
// Every form goes through ls_stream_next, so there is one place that decides what a final
// TextOut means: a completion ends with its final piece (finish != NONE); the request ends
// when all n have; its outcome is the first failed completion's code.
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sdk_internal.h"

// How long after request.timeout_ms the client still waits for the server's own final answer
// (the server enforces the timeout and frees the request) before giving up on its own.
#define LS_TIMEOUT_GRACE_MS 1000

struct _ls_stream_t {
    ls_client_t *client;
    ls_call_t *call;
    uint64_t rid;
    uint32_t n;                 // completions expected
    uint8_t *ended;             // [n]: that completion's final piece came
    uint32_t n_ended;
    uint32_t timeout_ms;        // the request's
    int64_t deadline_ns;        // when to stop waiting for the server; 0 = never
    bool over;                  // the end was returned: nothing more comes
    int rc;                     // LS_OK, or the first failed completion's code
    char why[512];              // its message
    ls_msg_t msg;               // the current piece's message, kept until the next call
};

// ---------------------------------------------------------------------------------------------
// the request

static int s_copy_i32s(ls_i32s_t *dst, const int32_t *src, size_t n) {
    if (!n)
        return 0;
    if (!src || !(dst->v = malloc(n * sizeof *src)))
        return -1;
    memcpy(dst->v, src, n * sizeof *src);
    dst->n = n;
    return 0;
}

// The chat as OpenAI's messages JSON array; NULL when a message lacks a role or content.
static char *s_messages_json(const ls_chat_message_t *messages, size_t n) {
    cJSON *arr = cJSON_CreateArray();
    bool ok = arr != NULL;
    for (size_t i = 0; ok && i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        ok = o && messages[i].role && messages[i].content && cJSON_AddItemToArray(arr, o) &&
             cJSON_AddStringToObject(o, "role", messages[i].role) &&
             cJSON_AddStringToObject(o, "content", messages[i].content);
    }
    char *json = ok ? cJSON_PrintUnformatted(arr) : NULL;
    cJSON_Delete(arr);
    return json;
}

static int s_request_encode(const ls_request_t *r, uint64_t rid, bool stream, ls_msg_t *m) {
    int prompts = (r->prompt != NULL) + (r->n_input_ids > 0) + (r->n_messages > 0);
    if (prompts != 1)
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "give exactly one of prompt, input_ids and messages (got %d)",
                           prompts);
    if ((r->n_stop && !r->stop) || (r->n_input_ids && !r->input_ids) || (r->n_messages && !r->messages) ||
        (r->n_mix && (!r->mix_adapters || !r->mix_weights)))
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "a count is set but its array is NULL");
    if (r->n_mix && r->adapter && *r->adapter)
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "give an adapter or a mix of adapters, not both");
    ls_msg_init(m, LS_MSG_GENERATE_REQ);
    m->rid = rid;
    ls_msg_generate_req_t *g = &m->u.generate_req;
    ls_msg_sampling_params_t *s = &g->sampling;
    bool ok = true;
    if (r->prompt)
        ok = (g->text = ls_msg_textdup(r->prompt, r->prompt_len ? r->prompt_len : strlen(r->prompt))).s != NULL;
    if (r->n_messages) {
        g->chat = true;
        ok = (g->messages = s_messages_json(r->messages, r->n_messages)) != NULL;
        if (!ok) {
            ls_msg_clear(m);
            return ls_sdk_fail(LS_ERR_BAD_REQUEST, "every chat message needs a role and a content");
        }
    }
    ok = ok && s_copy_i32s(&g->input_ids, r->input_ids, r->n_input_ids) == 0;
    if (r->adapter && *r->adapter)
        ok = ok && (g->adapter = ls_msg_strdup(r->adapter)) != NULL;
    if (ok && r->n_mix) {
        ok = (g->mix.v = calloc(r->n_mix, sizeof *g->mix.v)) != NULL;
        for (; ok && g->mix.n < r->n_mix; g->mix.n++) {
            const char *name = r->mix_adapters[g->mix.n];
            g->mix.v[g->mix.n].weight = r->mix_weights[g->mix.n];
            ok = (g->mix.v[g->mix.n].name = ls_msg_strdup(name ? name : "")) != NULL;
        }
        char why[256];
        if (ok && ls_msg_mix_check(&g->mix, false, why, sizeof why) < 0) {
            ls_msg_clear(m);
            return ls_sdk_fail(LS_ERR_BAD_REQUEST, "%s", why);
        }
    }
    s->max_new_tokens = r->max_tokens;
    s->min_new_tokens = r->min_tokens;
    s->temperature = r->temperature;
    s->top_p = r->top_p;
    s->top_k = r->top_k;
    s->min_p = r->min_p;
    s->repetition_penalty = r->repetition_penalty;
    s->frequency_penalty = r->frequency_penalty;
    s->presence_penalty = r->presence_penalty;
    s->has_seed = r->has_seed;
    s->seed = r->seed;
    ok = ok && s_copy_i32s(&s->stop_token_ids, r->stop_token_ids, r->n_stop_token_ids) == 0;
    if (ok && r->n_stop) {
        ok = (s->stop.v = calloc(r->n_stop, sizeof *s->stop.v)) != NULL;
        for (size_t i = 0; ok && i < r->n_stop; i++, s->stop.n++)
            ok = r->stop[i] && (s->stop.v[i] = ls_msg_textdup(r->stop[i], strlen(r->stop[i]))).s != NULL;
    }
    s->ignore_eos = r->ignore_eos;
    // Users want the words, not the end-of-text marker: skipping is the default (as in
    // SGLang and OpenAI), so the zero-initialised request gets it.
    s->skip_special_tokens = !r->keep_special_tokens;
    s->logprobs = r->logprobs;
    s->top_logprobs = r->top_logprobs;
    s->n = r->n;
    g->stream = stream;
    // Always ask for the ids: results carry them, and they cost a few bytes per token.
    g->return_token_ids = true;
    g->timeout_ms = r->timeout_ms;
    if (!ok) {
        ls_msg_clear(m);
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "out of memory or a NULL stop string");
    }
    return LS_OK;
}

// ---------------------------------------------------------------------------------------------
// the stream

static int s_stream_open(ls_client_t *client, const ls_request_t *request, bool stream, ls_stream_t **stream_p) {
    *stream_p = NULL;
    if (!client || !request)
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "no client or no request");
    ls_stream_t *self = calloc(1, sizeof *self);
    uint32_t n = request->n ? request->n : 1;
    if (!self || !(self->ended = calloc(n, 1))) {
        free(self);
        return ls_sdk_fail(LS_ERR_NO_MEMORY, "out of memory");
    }
    self->client = client;
    self->n = n;
    self->rid = request->id ? request->id : ls_client_request_id(client);
    self->timeout_ms = request->timeout_ms;
    if (request->timeout_ms)
        self->deadline_ns = ls_sdk_now_ns() + ((int64_t)request->timeout_ms + LS_TIMEOUT_GRACE_MS) * 1000000;
    ls_msg_t m;
    int rc = s_request_encode(request, self->rid, stream, &m);
    if (rc == LS_OK) {
        rc = ls_call_start(client, &m, &self->call);
        ls_msg_clear(&m);
    }
    if (rc < 0) {
        free(self->ended);
        free(self);
        return rc;
    }
    *stream_p = self;
    return LS_OK;
}

int ls_stream_open(ls_client_t *client, const ls_request_t *request, ls_stream_t **stream) {
    return s_stream_open(client, request, true, stream);
}

// The code a final TextOut stands for. The server reports its own timeout as ERROR with
// error_code TIMEOUT; an ABORT is someone's abort (ours, or the server's on shutdown).
static int s_final_code(const ls_msg_text_out_t *t) {
    if (t->finish == LS_FINISH_REASON_ERROR)
        return t->error_code ? ls_sdk_err_from_server(t->error_code) : LS_ERR_INTERNAL;
    return t->finish == LS_FINISH_REASON_ABORT ? LS_ERR_ABORTED : LS_OK;
}

// End the stream with rc (the outcome) and message why.
static int s_stream_over(ls_stream_t *self, int rc, const char *why) {
    self->over = true;
    if (self->rc == LS_OK && rc < 0) {
        self->rc = rc;
        snprintf(self->why, sizeof self->why, "%s", why);
    }
    return self->rc < 0 ? ls_sdk_fail(self->rc, "%s", self->why) : 0;
}

static void s_piece_fill(ls_piece_t *p, const ls_msg_text_out_t *t, int code, const char *why) {
    uint32_t n_top = t->token_ids.n ? (uint32_t)(t->top_ids.n / t->token_ids.n) : 0;
    *p = (ls_piece_t){.index = t->index,
                      .text = t->text.s ? t->text.s : "",
                      .text_len = t->text.len,
                      .token_ids = t->token_ids.v,
                      .n_tokens = t->token_ids.n,
                      .logprobs = t->logprobs.n ? t->logprobs.v : NULL,
                      .top_ids = n_top ? t->top_ids.v : NULL,
                      .top_logprobs = n_top ? t->top_logprobs.v : NULL,
                      .n_top = n_top,
                      .finish = (ls_finish_t)t->finish,
                      .matched_stop = t->matched_stop.s,
                      .matched_stop_len = t->matched_stop.len,
                      .prompt_tokens = t->prompt_tokens,
                      .completion_tokens = t->completion_tokens,
                      .cached_tokens = t->cached_tokens,
                      .error = code,
                      .error_message = code ? why : NULL};
}

int ls_stream_next(ls_stream_t *self, ls_piece_t *piece) {
    while (true) {
        ls_msg_clear(&self->msg);
        if (self->over)
            return 0;
        if (self->n_ended == self->n)
            return s_stream_over(self, LS_OK, "");
        int rc = ls_call_wait(self->call, self->deadline_ns, &self->msg);
        if (rc == LS_ERR_TIMEOUT) {
            // The server did not end it in time (or is gone): stop it there, give up here.
            ls_client_abort_rid(self->client, self->rid);
            char why[128];
            snprintf(why, sizeof why, "no complete answer within %u ms", self->timeout_ms);
            return s_stream_over(self, rc, why);
        }
        if (rc < 0)
            return s_stream_over(self, rc, ls_last_error());
        if (self->msg.type == LS_MSG_ERROR) {
            // A refusal outside the protocol's TextOut (an actor that does not serve
            // GenerateReq answers so): it ends every completion.
            const ls_msg_error_t *e = &self->msg.u.error;
            return s_stream_over(self, ls_sdk_err_from_server(e->code), e->message ? e->message : "refused");
        }
        if (self->msg.type != LS_MSG_TEXT_OUT)
            continue;
        const ls_msg_text_out_t *t = &self->msg.u.text_out;
        if (t->index >= self->n || self->ended[t->index])
            continue;  // not one of ours, or after its end: the protocol has none of these
        int code = LS_OK;
        const char *why = t->error ? t->error : ls_strerror(LS_ERR_ABORTED);
        if (t->finish != LS_FINISH_REASON_NONE) {
            self->ended[t->index] = 1;
            self->n_ended++;
            code = s_final_code(t);
            if (code < 0 && self->rc == LS_OK) {
                self->rc = code;
                snprintf(self->why, sizeof self->why, "%s", why);
            }
        }
        s_piece_fill(piece, t, code, why);
        return 1;
    }
}

uint64_t ls_stream_id(ls_stream_t *self) {
    return self->rid;
}

int ls_stream_abort(ls_stream_t *self) {
    if (self->over || self->n_ended == self->n)
        return LS_OK;  // already ended: nothing to stop
    return ls_client_abort_rid(self->client, self->rid);
}

void ls_stream_destroy(ls_stream_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_stream_t *self = *self_p;
    // Leaving early must not leave the request running on the server.
    if (!self->over && self->n_ended < self->n)
        ls_client_abort_rid(self->client, self->rid);
    ls_call_end(&self->call);
    ls_msg_clear(&self->msg);
    free(self->ended);
    free(self);
    *self_p = NULL;
}

// ---------------------------------------------------------------------------------------------
// results

static char *s_strdup(const char *s) {
    return s ? strdup(s) : NULL;
}

static int s_append(void **dst, size_t have, const void *src, size_t n, size_t size) {
    if (!n)
        return 0;
    void *v = realloc(*dst, (have + n) * size);
    if (!v)
        return -1;
    memcpy((char *)v + have * size, src, n * size);
    *dst = v;
    return 0;
}

// Add a piece to its completion in r.
static int s_result_add(ls_result_t *r, const ls_piece_t *p) {
    if (p->index >= r->n_completions) {
        ls_completion_t *v = realloc(r->completions, (p->index + 1) * sizeof *v);
        if (!v)
            return -1;
        memset(v + r->n_completions, 0, (p->index + 1 - r->n_completions) * sizeof *v);
        r->completions = v;
        r->n_completions = p->index + 1;
    }
    ls_completion_t *c = &r->completions[p->index];
    size_t top = (size_t)p->n_top;
    if (s_append((void **)&c->text, c->text_len, p->text, p->text_len + 1, 1) < 0 ||
        (p->logprobs && s_append((void **)&c->logprobs, c->n_tokens, p->logprobs, p->n_tokens, sizeof(float)) < 0) ||
        (top && (s_append((void **)&c->top_ids, c->n_tokens * top, p->top_ids, p->n_tokens * top, 4) < 0 ||
                 s_append((void **)&c->top_logprobs, c->n_tokens * top, p->top_logprobs, p->n_tokens * top, 4) < 0)) ||
        s_append((void **)&c->token_ids, c->n_tokens, p->token_ids, p->n_tokens, sizeof(int32_t)) < 0)
        return -1;
    c->text_len += p->text_len;
    c->n_tokens += p->n_tokens;
    if (top)
        c->n_top = p->n_top;
    c->finish = p->finish;
    c->completion_tokens = p->completion_tokens;
    if (p->matched_stop) {
        free(c->matched_stop);
        if (!(c->matched_stop = malloc(p->matched_stop_len + 1)))
            return -1;
        memcpy(c->matched_stop, p->matched_stop, p->matched_stop_len + 1);
        c->matched_stop_len = p->matched_stop_len;
    }
    if (p->error) {
        c->error = p->error;
        if (!(c->error_message = s_strdup(p->error_message)))
            return -1;
    }
    if (p->prompt_tokens)
        r->prompt_tokens = p->prompt_tokens;
    if (p->cached_tokens)
        r->cached_tokens = p->cached_tokens;
    r->completion_tokens = 0;
    for (size_t i = 0; i < r->n_completions; i++)
        r->completion_tokens += r->completions[i].completion_tokens;
    return 0;
}

void ls_result_destroy(ls_result_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_result_t *self = *self_p;
    for (size_t i = 0; i < self->n_completions; i++) {
        ls_completion_t *c = &self->completions[i];
        free(c->text);
        free(c->token_ids);
        free(c->logprobs);
        free(c->top_ids);
        free(c->top_logprobs);
        free(c->matched_stop);
        free(c->error_message);
    }
    free(self->completions);
    free(self);
    *self_p = NULL;
}

// ---------------------------------------------------------------------------------------------
// blocking and callback generation

static int s_generate(ls_client_t *client, const ls_request_t *request, bool stream, ls_piece_fn *fn, void *arg,
                      ls_result_t **result) {
    if (result)
        *result = NULL;
    ls_stream_t *s;
    int rc = s_stream_open(client, request, stream, &s);
    if (rc < 0)
        return rc;
    ls_result_t *r = result ? calloc(1, sizeof *r) : NULL;
    if (result && !r)
        rc = ls_sdk_fail(LS_ERR_NO_MEMORY, "out of memory");
    else if (r)
        r->id = s->rid;
    ls_piece_t piece;
    bool abort_asked = false;
    while (rc == LS_OK && (rc = ls_stream_next(s, &piece)) == 1) {
        rc = LS_OK;
        if (r && s_result_add(r, &piece) < 0)
            rc = ls_sdk_fail(LS_ERR_NO_MEMORY, "out of memory");
        // After asking to abort, keep reading to the final pieces but stop calling fn.
        else if (fn && !abort_asked && fn(&piece, arg) != 0) {
            abort_asked = true;
            ls_stream_abort(s);
        }
    }
    ls_stream_destroy(&s);
    if (result)
        *result = r;
    return rc;
}

int ls_client_generate(ls_client_t *self, const ls_request_t *request, ls_result_t **result) {
    return s_generate(self, request, false, NULL, NULL, result);
}

int ls_client_generate_stream(ls_client_t *self, const ls_request_t *request, ls_piece_fn *fn, void *arg,
                              ls_result_t **result) {
    return s_generate(self, request, true, fn, arg, result);
}

const char *ls_finish_name(ls_finish_t finish) {
    static const char *names[] = {"", "stop", "length", "abort", "error"};
    return (unsigned)finish <= LS_FINISH_ERROR ? names[finish] : "";
}
