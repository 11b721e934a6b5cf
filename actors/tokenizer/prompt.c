// prompt — see prompt.h.
#include "prompt.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "chat_template.h"
#include "grammar_cache.h"
#include "model_config.h"

#define S_MAX_EOS 16

struct tmodel {
    ls_tokenizer_t *tok;
    ls_chat_template_t *chat;  // NULL: chat requests are refused with chat_why
    char chat_why[512];
    uint32_t context;
    int32_t vocab_size;  // config.json's: where an adapter's added ids start
    int32_t eos[S_MAX_EOS];
    size_t n_eos;
    // structured output: every request's grammar is compiled here first, so a bad one is a 400
    // before any work; distinct sources stay compiled (the workers compile them again, once)
    ls_grammar_cache_t *grammars;
};

enum { S_GRAMMARS_KEPT = 32 };

tmodel_t *tmodel_load(const char *dir, const char *chat_template_file, char *err, size_t errlen) {
    tmodel_t *m = calloc(1, sizeof *m);
    if (!m) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ls_model_config_t cfg;
    if (!(m->tok = ls_tokenizer_load(path, err, errlen)) || ls_model_config_load(dir, &cfg, err, errlen) < 0) {
        tmodel_destroy(&m);
        return NULL;
    }
    if (cfg.max_position_embeddings <= 0) {
        snprintf(err, errlen, "%s/config.json: max_position_embeddings is missing or not positive", dir);
        tmodel_destroy(&m);
        return NULL;
    }
    m->context = (uint32_t)cfg.max_position_embeddings;
    m->vocab_size = cfg.vocab_size;
    m->n_eos = (size_t)ls_model_eos_ids(dir, &cfg, m->eos, S_MAX_EOS);
    m->chat = ls_chat_template_load(dir, chat_template_file, m->chat_why, sizeof m->chat_why);
    if (!m->chat && chat_template_file) {
        snprintf(err, errlen, "%s", m->chat_why);
        tmodel_destroy(&m);
    }
    return m;
}

void tmodel_destroy(tmodel_t **self_p) {
    tmodel_t *m = *self_p;
    if (!m)
        return;
    ls_tokenizer_destroy(&m->tok);
    ls_chat_template_destroy(&m->chat);
    ls_grammar_cache_destroy(&m->grammars);
    free(m);
    *self_p = NULL;
}

uint32_t tmodel_context(const tmodel_t *self) { return self->context; }
ls_tokenizer_t *tmodel_tokenizer(const tmodel_t *self) { return self->tok; }
uint32_t tmodel_n(const ls_msg_generate_req_t *g) { return g->sampling.n ? g->sampling.n : 1; }

ls_tok_added_t *tmodel_added_new(tmodel_t *self, const ls_msg_added_tokens_t *toks, char *err, size_t errlen) {
    ls_tok_added_spec_t *specs = calloc(toks->n + 1, sizeof *specs);
    if (!specs) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    ls_tok_added_t *a = NULL;
    size_t i = 0;
    for (; i < toks->n; i++) {
        const ls_msg_added_token_t *t = &toks->v[i];
        if ((int64_t)t->id != (int64_t)self->vocab_size + (int64_t)i || !t->content)
            break;
        specs[i] = (ls_tok_added_spec_t){t->content, strlen(t->content), t->special, t->single_word, t->lstrip,
                                         t->rstrip, t->normalized};
    }
    if (i < toks->n)
        snprintf(err, errlen, "added token %zu has id %d where %lld is due (vocab_size %d and up, in order)", i,
                 (int)toks->v[i].id, (long long)self->vocab_size + (long long)i, (int)self->vocab_size);
    else
        a = ls_tok_added_new(self->tok, self->vocab_size, specs, toks->n, err, errlen);
    free(specs);
    return a;
}

// Renders a chat (messages, tools, chat_template_kwargs: JSON texts; tools and kwargs may be
// NULL) into a malloc'ed prompt; NULL + err.
static char *s_render_chat(tmodel_t *m, const char *messages, const char *tools, const char *kwargs,
                           bool add_generation_prompt, int64_t now_s, size_t *len, char *err, size_t errlen) {
    if (!m->chat) {
        snprintf(err, errlen, "this model's chat template cannot be used: %s", m->chat_why);
        return NULL;
    }
    ls_chat_args_t a = ls_chat_args(messages, tools, kwargs, add_generation_prompt, now_s);
    return ls_chat_template_render(m->chat, &a, len, err, errlen);
}

// A chat rendered and encoded, appended to ids. The rendered prompt holds the template's special
// tokens (BOS included), as HF's apply_chat_template(tokenize=True) encodes it, so no more are
// added unless add_special asks (vLLM's /tokenize add_special_tokens). 0, or -1 + err.
static int s_chat_ids(tmodel_t *m, const ls_tok_added_t *added, const char *messages, const char *tools,
                      const char *kwargs, bool add_generation_prompt, bool add_special, int64_t now_s,
                      ls_token_ids_t *ids, char *err, size_t errlen) {
    size_t len;
    char *prompt = s_render_chat(m, messages, tools, kwargs, add_generation_prompt, now_s, &len, err, errlen);
    if (!prompt)
        return -1;
    int rc = ls_tokenizer_encode_added(m->tok, added, prompt, len, add_special ? LS_TOKENIZE_ADD_SPECIAL : 0, ids,
                                       err, errlen);
    free(prompt);
    return rc;
}

// Every id of ids inside the vocabulary, or one of the adapter's added tokens (added, NULL:
// none; open: any id past the vocabulary passes): 0, or -1 + err naming the first that is not
// (as the client's field `what` holds it).
static int s_ids_check(const tmodel_t *m, const ls_tok_added_t *added, bool open, const ls_i32s_t *ids,
                       const char *what, char *err, size_t errlen) {
    int32_t vocab = ls_tokenizer_vocab_size(m->tok);
    for (size_t i = 0; i < ids->n; i++)
        if (ids->v[i] < 0 || (ids->v[i] >= vocab && !open && !ls_tok_added_token(added, ids->v[i], NULL))) {
            if (added)
                snprintf(err, errlen, "%s[%zu] = %d is outside the vocabulary (0..%d) and the adapter's added "
                         "tokens (%d..%d)", what, i, ids->v[i], vocab - 1, (int)ls_tok_added_first(added),
                         (int)(ls_tok_added_first(added) + (int32_t)ls_tok_added_count(added) - 1));
            else
                snprintf(err, errlen, "%s[%zu] = %d is outside the vocabulary (0..%d)", what, i, ids->v[i], vocab - 1);
            return -1;
        }
    return 0;
}

uint32_t tmodel_prompt(tmodel_t *self, const ls_msg_generate_req_t *g, const ls_tok_added_t *added,
                       bool ids_open, int64_t now_s, ls_token_ids_t *ids, char *err, size_t errlen) {
    const bool text = g->text.s != NULL, input = g->input_ids.n > 0, messages = g->messages != NULL;
    if (g->sampling.n > LS_MSG_MAX_N) {
        snprintf(err, errlen, "n = %u: at most %d completions per request", g->sampling.n, LS_MSG_MAX_N);
        return LS_ERROR_CODE_BAD_REQUEST;
    }
    if (g->sampling.grammar_kind) {
        if (!self->grammars && !(self->grammars = ls_grammar_cache_new(S_GRAMMARS_KEPT, NULL))) {
            snprintf(err, errlen, "out of memory");
            return LS_ERROR_CODE_INTERNAL;
        }
        ls_grammar_t *gr = ls_grammar_cache_get(self->grammars, (ls_grammar_src_t)g->sampling.grammar_kind,
                                                g->sampling.grammar.s, g->sampling.grammar.len, err, errlen);
        if (!gr)
            return LS_ERROR_CODE_BAD_REQUEST;
        ls_grammar_cache_release(self->grammars, gr);
    }
    if (g->chat ? text || input || !messages : messages || text == input) {
        snprintf(err, errlen, "%s", g->chat ? "a chat request gives messages, and neither text nor input_ids"
                                  : messages ? "messages need chat set"
                                  : text    ? "give text or input_ids, not both"
                                            : "no prompt: give text, input_ids, or chat messages");
        return LS_ERROR_CODE_BAD_REQUEST;
    }
    if (g->chat) {
        if (s_chat_ids(self, added, g->messages, g->tools, g->chat_template_kwargs, true, false, now_s, ids, err,
                       errlen) < 0)
            return LS_ERROR_CODE_BAD_REQUEST;
    } else if (text) {
        // Completions add the post-processor's BOS, as HF's add_special_tokens=True.
        if (ls_tokenizer_encode_added(self->tok, added, g->text.s, g->text.len, LS_TOKENIZE_ADD_SPECIAL, ids, err,
                                      errlen) < 0)
            return LS_ERROR_CODE_BAD_REQUEST;
    } else {
        if (s_ids_check(self, added, ids_open, &g->input_ids, "input_ids", err, errlen) < 0)
            return LS_ERROR_CODE_BAD_REQUEST;
        ls_token_ids_t *v = ids;
        for (size_t i = 0; i < g->input_ids.n; i++) {
            if (v->n == v->cap) {
                size_t cap = v->cap ? 2 * v->cap : g->input_ids.n;
                int32_t *p = realloc(v->ids, cap * sizeof *p);
                if (!p) {
                    snprintf(err, errlen, "out of memory");
                    return LS_ERROR_CODE_INTERNAL;
                }
                v->ids = p;
                v->cap = cap;
            }
            v->ids[v->n++] = g->input_ids.v[i];
        }
    }
    if (ids->n == 0) {
        snprintf(err, errlen, "the prompt is empty");
        return LS_ERROR_CODE_BAD_REQUEST;
    }
    // At least one token must be generated within the context; an explicit max_new_tokens must
    // fit whole (the scheduler never cuts it).
    uint64_t need = ids->n + (g->sampling.max_new_tokens ? g->sampling.max_new_tokens : 1);
    // The message follows OpenAI's, which clients and people recognize; its numbers are ours.
    if (need > self->context) {
        const char *where = g->chat ? "messages" : "prompt";
        if (g->sampling.max_new_tokens)
            snprintf(err, errlen,
                     "This model's maximum context length is %u tokens. However, you requested %" PRIu64
                     " tokens (%zu in the %s, %u in the completion). Please reduce the length of the %s or completion.",
                     self->context, need, ids->n, where, g->sampling.max_new_tokens, where);
        else
            snprintf(err, errlen,
                     "This model's maximum context length is %u tokens. However, your %s has %zu tokens, which leaves "
                     "no room for the completion. Please reduce the length of the %s.",
                     self->context, where, ids->n, where);
        return LS_ERROR_CODE_TOO_LARGE;
    }
    return 0;
}

uint32_t tmodel_tokenize(tmodel_t *self, const ls_msg_tokenize_req_t *q, const ls_tok_added_t *added, int64_t now_s,
                        ls_msg_tokenize_resp_t *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->max_model_len = self->context;
    if (q->detokenize) {
        size_t len = 0;
        if (s_ids_check(self, added, false, &q->input_ids, "tokens", err, errlen) < 0)
            return LS_ERROR_CODE_BAD_REQUEST;
        // Special tokens kept: vLLM's /detokenize is HF's decode with its defaults.
        char *text = ls_tokenizer_decode_added(self->tok, added, q->input_ids.v, q->input_ids.n, 0, &len, err, errlen);
        if (!text)
            return LS_ERROR_CODE_BAD_REQUEST;
        out->text = (ls_text_t){text, len};
        return 0;
    }
    if (q->chat != (q->messages != NULL)) {
        snprintf(err, errlen, "%s", q->chat ? "a chat to tokenize needs messages" : "messages need chat set");
        return LS_ERROR_CODE_BAD_REQUEST;
    }
    ls_token_ids_t ids = {0};
    int rc = q->chat ? s_chat_ids(self, added, q->messages, q->tools, q->chat_template_kwargs,
                                  q->add_generation_prompt, q->add_special_tokens, now_s, &ids, err, errlen)
                     : ls_tokenizer_encode_added(self->tok, added, q->text.s ? q->text.s : "", q->text.len,
                                                 q->add_special_tokens ? LS_TOKENIZE_ADD_SPECIAL : 0, &ids, err, errlen);
    if (rc < 0) {
        ls_token_ids_free(&ids);
        return LS_ERROR_CODE_BAD_REQUEST;
    }
    // The ids move into the answer; a token's text is the vocabulary's (HF's convert_ids_to_tokens).
    out->token_ids = (ls_i32s_t){ids.ids, ids.n};
    if (q->return_token_strs && ids.n) {
        if (!(out->token_strs.v = calloc(ids.n, sizeof *out->token_strs.v)))
            goto oom;
        for (; out->token_strs.n < ids.n; out->token_strs.n++) {
            int32_t id = ids.ids[out->token_strs.n];
            const char *t = id < ls_tokenizer_vocab_size(self->tok) ? ls_tokenizer_id_to_token(self->tok, id)
                                                                     : ls_tok_added_token(added, id, NULL);
            if (!(out->token_strs.v[out->token_strs.n] = ls_msg_textdup(t ? t : "", t ? strlen(t) : 0)).s)
                goto oom;
        }
    }
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
    return LS_ERROR_CODE_INTERNAL;
}

static int s_i32s_set(ls_i32s_t *dst, const int32_t *v, size_t n) {
    dst->v = NULL;
    dst->n = 0;
    if (!n)
        return 0;
    if (!(dst->v = malloc(n * sizeof *v)))
        return -1;
    memcpy(dst->v, v, n * sizeof *v);
    dst->n = n;
    return 0;
}

int tmodel_request(const tmodel_t *self, const ls_msg_generate_req_t *g, const ls_token_ids_t *ids, uint32_t index,
                   const char *adapter_id, const ls_msg_added_tokens_t *added, uint64_t arrival_ms,
                   uint64_t deadline_ms, ls_msg_t *out) {
    ls_msg_init(out, LS_MSG_TOKENIZED_REQ);
    ls_msg_tokenized_req_t *t = &out->u.tokenized_req;
    t->sampling = g->sampling;  // scalars; the arrays are copied below
    ls_msg_sampling_params_t *sp = &t->sampling;
    sp->stop.v = NULL;
    sp->stop.n = 0;
    sp->grammar = (ls_text_t){0};
    sp->n = 1;
    if (sp->has_seed)
        sp->seed = g->sampling.seed + index;
    int rc = s_i32s_set(&t->input_ids, ids->ids, ids->n) |
             s_i32s_set(&sp->stop_token_ids, g->sampling.stop_token_ids.v, g->sampling.stop_token_ids.n);
    if (g->sampling.stop.n && (sp->stop.v = calloc(g->sampling.stop.n, sizeof *sp->stop.v)))
        for (; sp->stop.n < g->sampling.stop.n; sp->stop.n++)
            if (!(sp->stop.v[sp->stop.n] = ls_msg_textdup(g->sampling.stop.v[sp->stop.n].s ? g->sampling.stop.v[sp->stop.n].s : "",
                                                          g->sampling.stop.v[sp->stop.n].len)).s)
                break;
    rc |= sp->stop.n == g->sampling.stop.n ? 0 : -1;
    if (g->sampling.grammar.s && !(sp->grammar = ls_msg_textdup(g->sampling.grammar.s, g->sampling.grammar.len)).s)
        rc = -1;
    // The complete stop set: the request's ids, then the model's EOS ids unless ignore_eos.
    size_t n_stop = g->sampling.stop_token_ids.n + (sp->ignore_eos ? 0 : self->n_eos);
    if (n_stop && (t->stop_token_ids.v = malloc(n_stop * sizeof(int32_t)))) {
        if (g->sampling.stop_token_ids.n)  // the request's ids may be none (v NULL)
            memcpy(t->stop_token_ids.v, g->sampling.stop_token_ids.v, g->sampling.stop_token_ids.n * sizeof(int32_t));
        if (!sp->ignore_eos)
            memcpy(t->stop_token_ids.v + g->sampling.stop_token_ids.n, self->eos, self->n_eos * sizeof(int32_t));
        t->stop_token_ids.n = n_stop;
    }
    rc |= t->stop_token_ids.n == n_stop ? 0 : -1;
    if (adapter_id && *adapter_id) {
        t->adapter_id = ls_msg_strdup(adapter_id);
        t->adapter_name = ls_msg_strdup(g->adapter);
        rc |= t->adapter_id && t->adapter_name ? 0 : -1;
    }
    if (g->mix.n && (t->mix.v = calloc(g->mix.n, sizeof *t->mix.v)))
        for (; t->mix.n < g->mix.n; t->mix.n++) {
            const ls_msg_mix_part_t *p = &g->mix.v[t->mix.n];
            t->mix.v[t->mix.n] = (ls_msg_mix_part_t){.name = ls_msg_strdup(p->name), .weight = p->weight,
                                                     .adapter_id = ls_msg_strdup(p->adapter_id)};
        }
    rc |= t->mix.n == g->mix.n ? 0 : -1;
    if (added && added->n && (t->added_tokens.v = calloc(added->n, sizeof *t->added_tokens.v)))
        for (; t->added_tokens.n < added->n; t->added_tokens.n++) {
            ls_msg_added_token_t *d = &t->added_tokens.v[t->added_tokens.n];
            *d = added->v[t->added_tokens.n];
            if (!(d->content = ls_msg_strdup(d->content)))
                break;
        }
    rc |= !added || t->added_tokens.n == added->n ? 0 : -1;
    t->arrival_ms = arrival_ms;
    t->deadline_ms = deadline_ms;
    if (rc) {
        ls_msg_clear(out);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// collecting a non-streamed completion

static int s_grow(void **v, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *p = realloc(*v, c * elem);
    if (!p)
        return -1;
    *v = p;
    *cap = c;
    return 0;
}

#define S_APPEND(dst, cap, src)                                                                          \
    (s_grow((void **)&(dst).v, &(cap), (dst).n + (src).n, sizeof *(dst).v) < 0                            \
         ? -1                                                                                             \
         : ((src).n ? memcpy((dst).v + (dst).n, (src).v, (src).n * sizeof *(dst).v) : NULL, (dst).n += (src).n, 0))

static void s_texts_free(ls_texts_t *t) {
    for (size_t i = 0; i < t->n; i++)
        free(t->v[i].s);
    free(t->v);
    memset(t, 0, sizeof *t);
}

// Appends copies of src's texts: the piece keeps its own.
static int s_texts_add(ls_texts_t *dst, size_t *cap, const ls_texts_t *src) {
    if (s_grow((void **)&dst->v, cap, dst->n + src->n, sizeof *dst->v) < 0)
        return -1;
    for (size_t i = 0; i < src->n; i++) {
        if (!(dst->v[dst->n] = ls_msg_textdup(src->v[i].s ? src->v[i].s : "", src->v[i].len)).s)
            return -1;
        dst->n++;
    }
    return 0;
}

int tcollect_add(tcollect_t *c, const ls_msg_text_out_t *piece) {
    size_t n = piece->text.len;  // NUL bytes of the text included
    if (s_grow((void **)&c->text, &c->cap, c->len + n + 1, 1) < 0)
        return -1;
    if (n)
        memcpy(c->text + c->len, piece->text.s, n);
    c->len += n;
    c->text[c->len] = 0;
    if (S_APPEND(c->ids, c->ids_cap, piece->token_ids) < 0 || S_APPEND(c->logprobs, c->lp_cap, piece->logprobs) < 0 ||
        S_APPEND(c->top_ids, c->tid_cap, piece->top_ids) < 0 ||
        S_APPEND(c->top_logprobs, c->tlp_cap, piece->top_logprobs) < 0)
        return -1;
    // Texts name tokens only when every piece had one per id: the arrays stay aligned.
    if (piece->token_texts.n != piece->token_ids.n || piece->top_texts.n != piece->top_ids.n)
        c->texts_partial = true;
    if (!c->texts_partial && (s_texts_add(&c->token_texts, &c->tt_cap, &piece->token_texts) < 0 ||
                              s_texts_add(&c->top_texts, &c->tpt_cap, &piece->top_texts) < 0))
        return -1;
    return 0;
}

void tcollect_take(tcollect_t *c, ls_msg_text_out_t *final) {
    free(final->text.s);
    free(final->token_ids.v);
    free(final->logprobs.v);
    free(final->top_ids.v);
    free(final->top_logprobs.v);
    s_texts_free(&final->token_texts);
    s_texts_free(&final->top_texts);
    if (c->texts_partial) {
        s_texts_free(&c->token_texts);
        s_texts_free(&c->top_texts);
    }
    final->token_texts = c->token_texts;
    final->top_texts = c->top_texts;
    final->text = c->text ? (ls_text_t){c->text, c->len} : ls_msg_textdup("", 0);
    final->token_ids = c->ids;
    final->logprobs = c->logprobs;
    final->top_ids = c->top_ids;
    final->top_logprobs = c->top_logprobs;
    memset(c, 0, sizeof *c);
}

void tcollect_free(tcollect_t *c) {
    free(c->text);
    free(c->ids.v);
    free(c->logprobs.v);
    free(c->top_ids.v);
    free(c->top_logprobs.v);
    s_texts_free(&c->token_texts);
    s_texts_free(&c->top_texts);
    memset(c, 0, sizeof *c);
}
