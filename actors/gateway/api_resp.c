// api_resp — the answer half of api.h: what one completion produced so far (gw_choice_t), and
// the answers built from it (OpenAI completions and chat, whole or as SSE chunks, SGLang's
// /generate, logprobs), plus the /tokenize and /detokenize answers.
//
// Logprobs name tokens by their text, TextOut.token_texts / top_texts: each token decoded alone
// by the detokenizer, so a token that is part of a UTF-8 character reads U+FFFD (vLLM's form, not
// OpenAI's "bytes:\xNN"); chat's `bytes` are that text's UTF-8 bytes, as vLLM gives them. Without
// texts (an older detokenizer, out of memory) a token is "token_id:<id>" (vLLM's
// --return-tokens-as-token-ids form). Known limit: a completions top_logprobs key ends at a NUL
// byte of the token's text (object keys are C strings here).
//
// Answers are built with cJSON; generated text and stop strings (TextOut's `text` fields) go in
// as raw JSON literals written from their bytes and length (s_text_literal), so a NUL stays \u0000.
// The /tokenize answers are built with jansson, as their requests are parsed.
#include "api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <jansson.h>

// ---------------------------------------------------------------------------------------------
// /tokenize and /detokenize

char *gw_tokenize_answer(const ls_msg_tokenize_resp_t *r, bool detokenize, bool token_strs) {
    json_t *o = json_object();
    int bad = !o;
    if (detokenize)
        bad |= json_object_set_new(o, "prompt", json_stringn(r->text.s ? r->text.s : "", r->text.len));
    else {
        json_t *ids = json_array(), *strs = token_strs ? json_array() : json_null();
        for (size_t i = 0; i < r->token_ids.n; i++)
            bad |= json_array_append_new(ids, json_integer(r->token_ids.v[i]));
        for (size_t i = 0; token_strs && i < r->token_strs.n; i++)
            bad |= json_array_append_new(strs, json_stringn(r->token_strs.v[i].s ? r->token_strs.v[i].s : "",
                                                           r->token_strs.v[i].len));
        bad |= json_object_set_new(o, "count", json_integer((json_int_t)r->token_ids.n)) |
               json_object_set_new(o, "max_model_len", json_integer(r->max_model_len)) |
               json_object_set_new(o, "tokens", ids) | json_object_set_new(o, "token_strs", strs);
    }
    char *s = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

// ---------------------------------------------------------------------------------------------
// answers

// Appends n elements of `size` bytes from v to the array (*items, *count): one function for
// the id and the logprob arrays, whose element types differ only in size.
static int s_append(void **items, size_t *count, const void *v, size_t n, size_t size) {
    if (!n)
        return 0;
    char *p = realloc(*items, (*count + n) * size);
    if (!p)
        return -1;
    memcpy(p + *count * size, v, n * size);
    *items = p;
    *count += n;
    return 0;
}
#define S_APPEND(arr, src) s_append((void **)&(arr)->v, &(arr)->n, (src).v, (src).n, sizeof *(arr)->v)

static void s_texts_free(ls_texts_t *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->v[i].s);
    free(t->v);
    memset(t, 0, sizeof *t);
}

// Appends copies of src's texts (the TextOut keeps its own). 0, or -1 out of memory.
static int s_texts_add(ls_texts_t *dst, const ls_texts_t *src) {
    if (!src->n)
        return 0;
    ls_text_t *v = realloc(dst->v, (dst->n + src->n) * sizeof *v);
    if (!v)
        return -1;
    dst->v = v;
    for (size_t i = 0; i < src->n; i++) {
        if (!(v[dst->n] = ls_msg_textdup(src->v[i].s ? src->v[i].s : "", src->v[i].len)).s)
            return -1;
        dst->n++;
    }
    return 0;
}

int gw_choice_add(gw_choice_t *c, const ls_msg_text_out_t *t) {
    // Texts name tokens only while every piece had one per id.
    if (t->token_texts.n != t->token_ids.n || t->top_texts.n != t->top_ids.n)
        c->texts_partial = true;
    if (!c->texts_partial && (s_texts_add(&c->texts, &t->token_texts) < 0 || s_texts_add(&c->top_texts, &t->top_texts) < 0))
        return -1;
    if ((t->text.len && gw_buf_add(&c->text, t->text.s, t->text.len) < 0) ||
        S_APPEND(&c->ids, t->token_ids) < 0 || S_APPEND(&c->lps, t->logprobs) < 0 ||
        S_APPEND(&c->top_ids, t->top_ids) < 0 || S_APPEND(&c->top_lps, t->top_logprobs) < 0)
        return -1;
    c->finish = t->finish;
    if (t->matched_stop.s) {
        free(c->matched_stop.s);
        if (!(c->matched_stop = ls_msg_textdup(t->matched_stop.s, t->matched_stop.len)).s)
            return -1;
    }
    c->prompt_tokens = t->prompt_tokens;
    c->completion_tokens = t->completion_tokens;
    c->cached_tokens = t->cached_tokens;
    return 0;
}

void gw_choice_clear(gw_choice_t *c) {
    gw_buf_free(&c->text);
    free(c->ids.v);
    free(c->lps.v);
    free(c->top_ids.v);
    free(c->top_lps.v);
    s_texts_free(&c->texts);
    s_texts_free(&c->top_texts);
    free(c->matched_stop.s);
    memset(c, 0, sizeof *c);
}

// Generated text may hold NUL bytes, which cJSON's strings end at: it is written as a JSON
// string literal of its own (NUL as \u0000), put in as raw JSON. Other bytes are escaped as cJSON
// escapes them (quotes, backslashes, control characters) or copied as they are.
// The JSON string literal of len bytes of s (malloc'ed), or NULL out of memory.
static char *s_text_literal(const char *s, size_t len) {
    char *lit = malloc(6 * len + 3), *p = lit;
    if (!lit)
        return NULL;
    *p++ = '"';
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                        : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (esc)
            p += sprintf(p, "%s", esc);
        else if (c < 0x20)
            p += sprintf(p, "\\u%04x", c);
        else
            *p++ = (char)c;
    }
    *p++ = '"';
    *p = 0;
    return lit;
}

static void s_add_text(cJSON *o, const char *key, const char *s, size_t len) {
    char *lit = s_text_literal(s, len);
    if (!lit) {
        cJSON_AddNullToObject(o, key);
        return;
    }
    cJSON_AddRawToObject(o, key, lit);
    free(lit);
}

// A JSON string item of len bytes of s (NUL bytes kept), for arrays.
static cJSON *s_text_item(const char *s, size_t len) {
    char *lit = s_text_literal(s, len);
    cJSON *item = lit ? cJSON_CreateRaw(lit) : cJSON_CreateNull();
    free(lit);
    return item;
}

static void s_add_buf(cJSON *o, const char *key, const gw_buf_t *b) { s_add_text(o, key, b->d, b->d ? b->n : 0); }

static const char *s_finish_name(uint32_t finish) {
    switch (finish) {
    case LS_FINISH_REASON_STOP: return "stop";
    case LS_FINISH_REASON_LENGTH: return "length";
    case LS_FINISH_REASON_ABORT: return "abort";
    case LS_FINISH_REASON_ERROR: return "error";
    default: return NULL;
    }
}

static void s_add_finish(cJSON *o, uint32_t finish) {
    const char *f = s_finish_name(finish);
    if (f)
        cJSON_AddStringToObject(o, "finish_reason", f);
    else
        cJSON_AddNullToObject(o, "finish_reason");
}

// One token's name: its text when the detokenizer gave one, else "token_id:<id>".
typedef struct {
    const char *s;
    size_t len;
    char id[32];
} s_name_t;

static void s_token_name(s_name_t *out, int32_t id, const ls_text_t *text) {
    if (text && text->s) {
        out->s = text->s;
        out->len = text->len;
        return;
    }
    out->len = (size_t)snprintf(out->id, sizeof out->id, "token_id:%d", (int)id);
    out->s = out->id;
}

// Chat's `bytes`: the UTF-8 bytes of the token's text; null when the token is named by id.
static cJSON *s_token_bytes(const ls_text_t *text) {
    if (!text || !text->s)
        return cJSON_CreateNull();
    cJSON *b = cJSON_CreateArray();
    for (size_t i = 0; i < text->len; i++)
        cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)text->s[i]));
    return b;
}

// The tokens of one answer or piece: ids[n], their logprobs, the top k alternatives of each
// (flattened [n][k]) and everyone's texts (NULL: named by id).
typedef struct {
    size_t n, k;
    const int32_t *ids;
    const float *lps;  // NULL: 0
    const int32_t *top_ids;  // NULL: no alternatives
    const float *top_lps;
    const ls_text_t *texts, *top_texts;
} s_lp_view_t;

// OpenAI logprobs of a view: completions' or chat's shape.
static cJSON *s_openai_logprobs(const gw_gen_t *g, const s_lp_view_t *v) {
    size_t k = v->k;
    s_name_t name;
    cJSON *lp = cJSON_CreateObject();
    if (g->api == GW_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (size_t i = 0; i < v->n; i++) {
            cJSON *e = cJSON_CreateObject();
            const ls_text_t *text = v->texts ? &v->texts[i] : NULL;
            s_token_name(&name, v->ids[i], text);
            s_add_text(e, "token", name.s, name.len);
            cJSON_AddNumberToObject(e, "logprob", v->lps ? v->lps[i] : 0);
            cJSON_AddItemToObject(e, "bytes", s_token_bytes(text));
            cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
            for (size_t j = 0; v->top_ids && j < k; j++) {
                cJSON *t = cJSON_CreateObject();
                const ls_text_t *tt = v->top_texts ? &v->top_texts[i * k + j] : NULL;
                s_token_name(&name, v->top_ids[i * k + j], tt);
                s_add_text(t, "token", name.s, name.len);
                cJSON_AddNumberToObject(t, "logprob", v->top_lps[i * k + j]);
                cJSON_AddItemToObject(t, "bytes", s_token_bytes(tt));
                cJSON_AddItemToArray(tops, t);
            }
            cJSON_AddItemToArray(content, e);
        }
        cJSON_AddNullToObject(lp, "refusal");
        return lp;
    }
    cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
    cJSON *token_lps = cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON *tops = k ? cJSON_AddArrayToObject(lp, "top_logprobs") : NULL;
    if (!k)
        cJSON_AddNullToObject(lp, "top_logprobs");
    for (size_t i = 0; i < v->n; i++) {
        s_token_name(&name, v->ids[i], v->texts ? &v->texts[i] : NULL);
        cJSON_AddItemToArray(tokens, s_text_item(name.s, name.len));
        cJSON_AddItemToArray(token_lps, cJSON_CreateNumber(v->lps ? v->lps[i] : 0));
        if (tops) {
            cJSON *t = cJSON_CreateObject();
            for (size_t j = 0; v->top_ids && j < k; j++) {
                s_token_name(&name, v->top_ids[i * k + j], v->top_texts ? &v->top_texts[i * k + j] : NULL);
                // cJSON escapes keys; one ends at a NUL byte of the text (the header's known limit).
                cJSON_AddNumberToObject(t, name.s, v->top_lps[i * k + j]);
            }
            cJSON_AddItemToArray(tops, t);
        }
    }
    return lp;
}

// The logprobs of a choice, or of one TextOut's piece; JSON null when not asked for. Texts are
// used only when there is one per id.
static cJSON *s_logprobs_of(const gw_gen_t *g, const ls_i32s_t *ids, const ls_f32s_t *lps, const ls_i32s_t *top_ids,
                            const ls_f32s_t *top_lps, const ls_texts_t *texts, const ls_texts_t *top_texts) {
    if (!g->logprobs)
        return cJSON_CreateNull();
    s_lp_view_t v = {.n = ids->n, .k = (size_t)g->top_logprobs, .ids = ids->v};
    v.lps = lps->n >= v.n ? lps->v : NULL;
    v.top_ids = v.k && top_ids->n >= v.n * v.k ? top_ids->v : NULL;
    v.top_lps = v.top_ids ? top_lps->v : NULL;
    v.texts = texts->n == v.n ? texts->v : NULL;
    v.top_texts = v.top_ids && top_texts->n == top_ids->n ? top_texts->v : NULL;
    return s_openai_logprobs(g, &v);
}

static cJSON *s_usage(const gw_gen_t *g, const gw_choice_t *ch) {
    uint64_t prompt = 0, completion = 0, cached = 0;
    for (size_t p = 0; p < g->nreqs; p++) {
        prompt += ch[p * (size_t)g->n].prompt_tokens;
        cached += ch[p * (size_t)g->n].cached_tokens;
        for (int i = 0; i < g->n; i++)
            completion += ch[p * (size_t)g->n + (size_t)i].completion_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens", (double)cached);
    return u;
}

static cJSON *s_openai_head(const gw_gen_t *g, const char *id, long created, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", g->api == GW_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                           : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", g->model);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

// SGLang's answer for one completion: cumulative text, ids and meta_info.
static cJSON *s_generate_item(const gw_gen_t *g, const char *id, size_t index, const gw_choice_t *c) {
    cJSON *o = cJSON_CreateObject();
    s_add_buf(o, "text", &c->text);
    cJSON_AddItemToObject(o, "output_ids", cJSON_CreateIntArray(c->ids.v ? (const int *)c->ids.v : (const int[]){0},
                                                                (int)c->ids.n));
    cJSON *m = cJSON_AddObjectToObject(o, "meta_info");
    char mid[80];
    snprintf(mid, sizeof mid, "%s-%zu", id, index);
    cJSON_AddStringToObject(m, "id", mid);
    cJSON_AddNumberToObject(m, "prompt_tokens", c->prompt_tokens);
    cJSON_AddNumberToObject(m, "completion_tokens", c->completion_tokens);
    cJSON_AddNumberToObject(m, "cached_tokens", c->cached_tokens);
    const char *f = s_finish_name(c->finish);
    if (f) {
        cJSON *fr = cJSON_AddObjectToObject(m, "finish_reason");
        cJSON_AddStringToObject(fr, "type", f);
        if (c->finish == LS_FINISH_REASON_LENGTH)
            cJSON_AddNumberToObject(fr, "length", c->completion_tokens);
        else if (c->finish == LS_FINISH_REASON_STOP && c->matched_stop.s)
            s_add_text(fr, "matched", c->matched_stop.s, c->matched_stop.len);
        else if (c->finish == LS_FINISH_REASON_STOP)
            cJSON_AddNullToObject(fr, "matched");
    } else
        cJSON_AddNullToObject(m, "finish_reason");
    if (g->logprobs) {
        // [logprob, token_id, token_text]; the text is null (ids only, as for OpenAI's answers).
        size_t k = (size_t)g->top_logprobs;
        cJSON *lps = cJSON_AddArrayToObject(m, "output_token_logprobs");
        cJSON *tops = k ? cJSON_AddArrayToObject(m, "output_top_logprobs") : NULL;
        for (size_t i = 0; i < c->ids.n; i++) {
            cJSON *e = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateNumber(i < c->lps.n ? c->lps.v[i] : 0));
            cJSON_AddItemToArray(e, cJSON_CreateNumber(c->ids.v[i]));
            cJSON_AddItemToArray(e, cJSON_CreateNull());
            cJSON_AddItemToArray(lps, e);
            if (!tops)
                continue;
            cJSON *row = cJSON_CreateArray();
            for (size_t j = 0; j < k && (i + 1) * k <= c->top_ids.n; j++) {
                cJSON *t = cJSON_CreateArray();
                cJSON_AddItemToArray(t, cJSON_CreateNumber(c->top_lps.v[i * k + j]));
                cJSON_AddItemToArray(t, cJSON_CreateNumber(c->top_ids.v[i * k + j]));
                cJSON_AddItemToArray(t, cJSON_CreateNull());
                cJSON_AddItemToArray(row, t);
            }
            cJSON_AddItemToArray(tops, row);
        }
    }
    return o;
}

static char *s_print(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

char *gw_answer_json(const gw_gen_t *g, const char *id, long created, const gw_choice_t *ch) {
    size_t total = g->nreqs * (size_t)g->n;
    if (g->api == GW_GENERATE) {
        if (!g->list)
            return s_print(s_generate_item(g, id, 0, &ch[0]));
        cJSON *arr = cJSON_CreateArray();
        for (size_t i = 0; i < total; i++)
            cJSON_AddItemToArray(arr, s_generate_item(g, id, i, &ch[i]));
        return s_print(arr);
    }
    cJSON *o = s_openai_head(g, id, created, 0);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (size_t i = 0; i < total; i++) {
        const gw_choice_t *c = &ch[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "index", (double)i);
        if (g->api == GW_CHAT) {
            cJSON *m = cJSON_AddObjectToObject(e, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            s_add_buf(m, "content", &c->text);
        } else
            s_add_buf(e, "text", &c->text);
        cJSON_AddItemToObject(e, "logprobs", s_logprobs_of(g, &c->ids, &c->lps, &c->top_ids, &c->top_lps,
                                                           c->texts_partial ? &(ls_texts_t){0} : &c->texts,
                                                           c->texts_partial ? &(ls_texts_t){0} : &c->top_texts));
        s_add_finish(e, c->finish);
        if (c->matched_stop.s)
            s_add_text(e, "stop_reason", c->matched_stop.s, c->matched_stop.len);
        cJSON_AddItemToArray(choices, e);
    }
    cJSON_AddItemToObject(o, "usage", s_usage(g, ch));
    return s_print(o);
}

char *gw_answer_chunk(const gw_gen_t *g, const char *id, long created, size_t index, const ls_msg_text_out_t *t,
                      const gw_choice_t *c, int first) {
    if (g->api == GW_GENERATE) {
        cJSON *o = s_generate_item(g, id, index, c);
        if (g->list)
            cJSON_AddNumberToObject(o, "index", (double)index);
        return s_print(o);
    }
    cJSON *o = s_openai_head(g, id, created, 1);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "index", (double)index);
    if (g->api == GW_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(e, "delta");
        if (first)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (t->text.len || first)
            s_add_text(d, "content", t->text.s, t->text.len);
    } else
        s_add_text(e, "text", t->text.s, t->text.len);
    cJSON_AddItemToObject(e, "logprobs", s_logprobs_of(g, &t->token_ids, &t->logprobs, &t->top_ids, &t->top_logprobs,
                                                       &t->token_texts, &t->top_texts));
    s_add_finish(e, t->finish);
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), e);
    if (g->include_usage)
        cJSON_AddNullToObject(o, "usage");  // OpenAI's chunks say null until the usage chunk
    return s_print(o);
}

char *gw_answer_usage_chunk(const gw_gen_t *g, const char *id, long created, const gw_choice_t *ch) {
    cJSON *o = s_openai_head(g, id, created, 1);
    cJSON_AddArrayToObject(o, "choices");
    cJSON_AddItemToObject(o, "usage", s_usage(g, ch));
    return s_print(o);
}
