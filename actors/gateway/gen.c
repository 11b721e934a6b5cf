// gen — the gateway's generation calls (gateway_impl.h): a request's GenerateReqs out to the
// tokenizer (one per prompt, each with its n completions), their TextOut back, answered whole
// or as an SSE stream, and the Aborts for what still runs upstream when a call ends early.
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "gateway_impl.h"

static void s_send_abort(uint64_t rid, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = rid;
    m.u.abort.reason = ls_msg_strdup(why);
    m.u.abort.finish = LS_FINISH_REASON_ABORT;
    ls_actor_send_peer(gw_state.self, GW_TOKENIZER, &m, NULL);
    ls_msg_clear(&m);
}

// Stop every prompt still running upstream (its KV and adapter are released there).
void gw_abort_open(gw_call_t *c, const char *why) {
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
void gw_gen_fail(gw_call_t *c, int status, const char *message, const char *param, const char *code) {
    gw_abort_open(c, "the request failed");
    if (c->streaming) {
        char *body = gw_error_json(status, message, param, code);
        s_sse(c->req, body);
        free(body);
        s_sse(c->req, "[DONE]");
        gw_req_stream_end(c->req);
    } else
        gw_respond_error(c->req, status, message, param, code);
    c->req = NULL;
    gw_call_free(c);
}

static void s_gen_done(gw_call_t *c) {
    gw_model_stat_t *m = gw_model_stat(c->label);
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
            gw_respond_json(c->req, 200, body);
        else
            gw_respond_error(c->req, 500, "out of memory", NULL, NULL);
        free(body);
    }
    c->req = NULL;
    gw_call_free(c);
}

int gw_on_text_out(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_text_out_t *t = &in->msg->u.text_out;
    gw_call_t *c = gw_call_of(in);
    if (!c || c->kind != GW_CALL_GEN) {
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
        int status = gw_status_of(t->error_code);
        char code[32];
        gw_lower(code, sizeof code, ls_error_code_name(t->error_code));
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
        gw_gen_fail(c, status, t->error && *t->error ? t->error : "the request failed", param, code);
        return 0;
    }
    size_t ci = p * (size_t)c->gen.n + t->index;
    gw_choice_t *ch = &c->choices[ci];
    if (gw_choice_add(ch, t) < 0) {
        gw_gen_fail(c, 500, "out of memory", NULL, NULL);
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

void gw_gen_start(gw_req_t *req, gw_api_t api) {
    size_t len;
    const char *body = gw_req_body(req, &len);
    gw_call_t *c = gw_call_new(GW_CALL_GEN, req);
    if (!c) {
        gw_respond_error(req, 500, "out of memory", NULL, NULL);
        return;
    }
    char err[256];
    const char *param;
    if (gw_gen_parse(&c->gen, api, body, len, gw_state.base, err, sizeof err, &param) < 0) {
        const char *code = c->gen.err_code;  // a static string: it outlives c
        gw_call_free(c);
        gw_respond_error(req, 400, err, param, code);
        return;
    }
    // The request's fan-out and its tenant's share, before anything goes upstream.
    size_t total = c->gen.nreqs * (size_t)c->gen.n;
    const char *adapter = c->gen.reqs[0].u.generate_req.adapter;
    snprintf(c->label, sizeof c->label, "%s", adapter && *adapter ? adapter : gw_state.base);
    gw_req_set_tag(req, c->label);
    if (total > (size_t)gw_state.max_request_completions) {
        char msg[300];
        snprintf(msg, sizeof msg,
                 "the request asks for %zu completions (%zu prompts, n = %d); at most %d are served per request "
                 "(--max-request-completions)",
                 total, c->gen.nreqs, c->gen.n, gw_state.max_request_completions);
        ls_warn(0, "refused a request for %s: %s", c->label, msg);
        const char *field = c->gen.n > 1 ? "n" : api == GW_GENERATE ? "text" : "prompt";
        gw_call_free(c);
        gw_respond_error(req, 400, msg, field, "too_many_completions");
        return;
    }
    size_t held = gw_tenant_add(c->label, 0);
    if (held + total > (size_t)gw_state.max_tenant_completions) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "model %s has %zu completions in flight; %zu more exceed its share of %d (--max-tenant-completions): "
                 "retry later",
                 c->label, held, total, gw_state.max_tenant_completions);
        ls_warn(0, "refused a request: %s", msg);
        ls_actor_count(gw_state.self, "tenant_refusals", 1);
        gw_call_free(c);
        gw_respond_error(req, 429, msg, NULL, "overloaded");
        return;
    }
    c->tenant_held = total;
    gw_tenant_add(c->label, (ptrdiff_t)total);
    c->choices = calloc(total, sizeof *c->choices);
    c->prompt_open = calloc(c->gen.nreqs, sizeof *c->prompt_open);
    c->sent = calloc(total, 1);
    if (!c->choices || !c->prompt_open || !c->sent) {
        gw_gen_fail(c, 500, "out of memory", NULL, NULL);
        return;
    }
    c->nopen = total;
    c->created = gw_unix_time();
    snprintf(c->id, sizeof c->id, "%s-%s%llx", api == GW_CHAT ? "chatcmpl" : "cmpl", gw_state.id_prefix,
             (unsigned long long)gw_state.next_rid);
    for (size_t p = 0; p < c->gen.nreqs; p++) {
        ls_msg_t *m = &c->gen.reqs[p];
        m->rid = gw_call_rid(c);
        m->u.generate_req.client_id = ls_msg_strdup(ls_actor_name(gw_state.self));
        c->prompt_open[p] = c->gen.n;
        if (ls_actor_send_peer(gw_state.self, GW_TOKENIZER, m, NULL) < 0) {
            c->prompt_open[p] = 0;
            gw_gen_fail(c, 503, "the tokenizer is unavailable", NULL, "unavailable");
            return;
        }
    }
}
