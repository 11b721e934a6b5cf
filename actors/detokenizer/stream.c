// stream — see stream.h. Per request: the ls_detok (UTF-8 hold-back, SentencePiece spaces,
// byte-fallback runs, stop-string hold-back) and the stop strings, kept to name the one that
// matched. State lives from the request's first TokenOut to its end here: the scheduler's
// finish, a stop string, or a token the vocabulary does not have.
//
// A request of an adapter with added vocabulary (docs/adapters.md) brings the adapter's added
// tokens with its first TokenOut (TokenizedReq.added_tokens, relayed by the scheduler): they
// travel with the request, so they are there before its first token whatever else happens to
// the adapter meanwhile, and nothing here waits on the registry. Its ls_detok decodes them as
// the base decodes its own added tokens (skip_special_tokens, streaming, stop strings alike).
#include "stream.h"

#include <czmq.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_log.h"

typedef struct {
    uint64_t rid;
    ls_detok_t *detok;
    ls_tok_added_t *added;  // its adapter's added tokens, NULL: none
    ls_texts_t stops;  // copies of sampling.stop, for TextOut.matched_stop
    unsigned flags;    // LS_DETOK_SKIP_SPECIAL with sampling.skip_special_tokens
} req_t;

struct dstream {
    ls_tokenizer_t *tok;
    dstream_host_t host;
    zhashx_t *reqs;  // rid key → req_t
    dstream_stats_t stats;
    char *buf;  // the TextOut's text, reused
    size_t len, cap;
};

static void s_rid_key(uint64_t rid, char key[24]) { snprintf(key, 24, "%" PRIu64, rid); }

static void s_req_free(void **item) {
    req_t *r = *item;
    if (!r)
        return;
    ls_detok_destroy(&r->detok);
    ls_tok_added_destroy(&r->added);  // after the detok that reads it
    for (size_t i = 0; i < r->stops.n; i++)
        free(r->stops.v[i].s);
    free(r->stops.v);
    free(r);
    *item = NULL;
}

dstream_t *dstream_new(ls_tokenizer_t *tok, const dstream_host_t *host) {
    dstream_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->tok = tok;
    self->host = *host;
    self->reqs = zhashx_new();
    if (!self->reqs) {
        free(self);
        return NULL;
    }
    zhashx_set_destructor(self->reqs, s_req_free);
    return self;
}

void dstream_destroy(dstream_t **self_p) {
    dstream_t *self = *self_p;
    if (!self)
        return;
    zhashx_destroy(&self->reqs);
    free(self->buf);
    free(self);
    *self_p = NULL;
}

const dstream_stats_t *dstream_stats(const dstream_t *self) { return &self->stats; }

static int s_append(dstream_t *self, const char *s, size_t n) {
    if (self->len + n + 1 > self->cap) {
        size_t cap = self->cap ? self->cap : 256;
        while (cap < self->len + n + 1)
            cap *= 2;
        char *b = realloc(self->buf, cap);
        if (!b)
            return -1;
        self->buf = b;
        self->cap = cap;
    }
    memcpy(self->buf + self->len, s, n);
    self->len += n;
    self->buf[self->len] = 0;
    return 0;
}

// The adapter's added tokens of a first TokenOut over the tokenizer (ids from the first one's,
// in order): 0 with *out NULL when there are none, -1 + err when they cannot be taken.
static int s_added_new(ls_tokenizer_t *tok, const ls_msg_added_tokens_t *l, ls_tok_added_t **out, char *err,
                       size_t errlen) {
    *out = NULL;
    if (!l->n)
        return 0;
    ls_tok_added_spec_t *specs = calloc(l->n, sizeof *specs);
    if (!specs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t i = 0;
    for (; i < l->n && l->v[i].content && (int64_t)l->v[i].id == (int64_t)l->v[0].id + (int64_t)i; i++)
        specs[i] = (ls_tok_added_spec_t){l->v[i].content, strlen(l->v[i].content), l->v[i].special,
                                         l->v[i].single_word, l->v[i].lstrip, l->v[i].rstrip, l->v[i].normalized};
    if (i < l->n)
        snprintf(err, errlen, "added token %zu has no content or is out of order", i);
    else
        *out = ls_tok_added_new(tok, l->v[0].id, specs, l->n, err, errlen);
    free(specs);
    return *out ? 0 : -1;
}

static req_t *s_req_new(dstream_t *self, uint64_t rid, const ls_msg_token_out_t *t, char *err, size_t errlen) {
    const ls_msg_sampling_params_t *sp = &t->sampling;
    snprintf(err, errlen, "out of memory");
    req_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->rid = rid;
    if (s_added_new(self->tok, &t->added_tokens, &r->added, err, errlen) < 0) {
        free(r);
        return NULL;
    }
    size_t n = sp->stop.n;
    const char **texts = n ? calloc(n, sizeof *texts) : NULL;
    size_t *lens = n ? calloc(n, sizeof *lens) : NULL;
    if (n && (!texts || !lens || !(r->stops.v = calloc(n, sizeof *r->stops.v)))) {
        free(texts);
        free(lens);
        ls_tok_added_destroy(&r->added);
        free(r);
        return NULL;
    }
    // Stop strings are text: a NUL inside one is part of it.
    for (size_t i = 0; i < n; i++)
        if ((r->stops.v[r->stops.n] = ls_msg_textdup(sp->stop.v[i].s ? sp->stop.v[i].s : "", sp->stop.v[i].len)).s) {
            texts[i] = r->stops.v[i].s;
            lens[i] = r->stops.v[i].len;
            r->stops.n++;
        }
    r->flags = sp->skip_special_tokens ? LS_DETOK_SKIP_SPECIAL : 0;
    r->detok = r->stops.n == n ? ls_detok_new_added(self->tok, r->added, r->flags, texts, lens, n) : NULL;
    free(texts);
    free(lens);
    if (!r->detok) {
        void *item = r;
        s_req_free(&item);
        return NULL;
    }
    return r;
}

// Copies the first `n` elements of src into dst (n clamped to src's length).
static void s_i32s(ls_i32s_t *dst, const ls_i32s_t *src, size_t n) {
    n = n < src->n ? n : src->n;
    if (n && (dst->v = malloc(n * sizeof *dst->v))) {
        memcpy(dst->v, src->v, n * sizeof *dst->v);
        dst->n = n;
    }
}

static void s_f32s(ls_f32s_t *dst, const ls_f32s_t *src, size_t n) {
    n = n < src->n ? n : src->n;
    if (n && (dst->v = malloc(n * sizeof *dst->v))) {
        memcpy(dst->v, src->v, n * sizeof *dst->v);
        dst->n = n;
    }
}

// Fills dst with the texts of ids[0, n), each decoded alone with flags, for the logprobs: the
// gateway names tokens by these. The sampled tokens are decoded as the text shows them (a
// skipped special token is "", so they concatenate to the text, as vLLM's); alternatives with
// special tokens named, so that each reads as itself. An id outside the vocabulary gets "" (as
// a sampled token it has already failed the request). On out of memory dst stays shorter
// than n and the gateway falls back to naming tokens by id.
static void s_token_texts(const ls_tokenizer_t *tok, const ls_tok_added_t *added, unsigned flags, ls_texts_t *dst,
                          const int32_t *ids, size_t n) {
    if (!n || !(dst->v = calloc(n, sizeof *dst->v)))
        return;
    char err[64];
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        char *s = ls_tokenizer_decode_added(tok, added, &ids[i], 1, flags, &len, err, sizeof err);
        ls_text_t t = ls_msg_textdup(s ? s : "", s ? len : 0);
        free(s);
        if (!t.s)
            return;
        dst->v[dst->n++] = t;
    }
}

static void s_abort(dstream_t *self, uint64_t rid, uint32_t finish, const char *why) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = rid;
    m.u.abort.finish = finish;
    m.u.abort.reason = ls_msg_strdup(why);
    self->host.send(self->host.host, "scheduler", &m);
    ls_msg_clear(&m);
}

void dstream_on_token_out(dstream_t *self, const ls_msg_t *msg) {
    const ls_msg_token_out_t *t = &msg->u.token_out;
    char key[24];
    s_rid_key(msg->rid, key);
    req_t *r = zhashx_lookup(self->reqs, key);
    if (!r && !t->first) {
        // Normal after a stop string ended the request here while the scheduler still sent.
        ls_debug(msg->rid, "TokenOut for a request with no state here: dropped");
        self->stats.dropped++;
        return;
    }
    ls_msg_t out;
    ls_msg_init(&out, LS_MSG_TEXT_OUT);
    out.rid = msg->rid;
    ls_msg_text_out_t *o = &out.u.text_out;
    if (!r) {
        self->stats.requests++;
        char err[320], why[400];
        if (!(r = s_req_new(self, msg->rid, t, err, sizeof err)) || zhashx_insert(self->reqs, key, r) < 0) {
            snprintf(why, sizeof why, "the detokenizer cannot take the request: %s", r ? "out of memory" : err);
            void *item = r;
            s_req_free(&item);
            ls_error(msg->rid, "%s", why);
            o->finish = LS_FINISH_REASON_ERROR;
            o->error_code = LS_ERROR_CODE_INTERNAL;
            o->error = ls_msg_strdup(why);
            if (t->finish == LS_FINISH_REASON_NONE)
                s_abort(self, msg->rid, LS_FINISH_REASON_ABORT, "the detokenizer failed");
            self->stats.failed++;
            self->host.send(self->host.host, "tokenizer", &out);
            ls_msg_clear(&out);
            return;
        }
    }
    self->len = 0;
    if (s_append(self, "", 0) < 0) {  // a text field even when nothing is decoded yet
        ls_error(msg->rid, "detokenizer out of memory");
        abort();
    }
    size_t used = 0;
    const char *fail = NULL, *piece;
    size_t plen;
    char why[160];
    for (; used < t->token_ids.n && !ls_detok_stopped(r->detok); used++) {
        if (ls_detok_push(r->detok, t->token_ids.v[used], &piece, &plen) < 0 || s_append(self, piece, plen) < 0) {
            snprintf(why, sizeof why, "token id %d is outside the tokenizer's vocabulary (or out of memory)",
                     t->token_ids.v[used]);
            fail = why;
            break;
        }
    }
    self->stats.tokens += used;
    bool stopped = !fail && ls_detok_stopped(r->detok);
    bool last = fail || stopped || t->finish != LS_FINISH_REASON_NONE;
    if (!fail && !stopped && t->finish != LS_FINISH_REASON_NONE &&
        (ls_detok_finish(r->detok, &piece, &plen) < 0 || s_append(self, piece, plen) < 0))
        fail = "out of memory flushing the text";
    o->text = ls_msg_textdup(self->buf, self->len);  // NUL bytes of the text included
    s_i32s(&o->token_ids, &t->token_ids, used);
    s_f32s(&o->logprobs, &t->logprobs, used);
    // top_ids is [len(token_ids)][k]: keep the rows of the tokens used.
    size_t k = t->token_ids.n ? t->top_ids.n / t->token_ids.n : 0;
    s_i32s(&o->top_ids, &t->top_ids, used * k);
    s_f32s(&o->top_logprobs, &t->top_logprobs, used * k);
    if (t->logprobs.n) {
        s_token_texts(self->tok, r->added, r->flags, &o->token_texts, o->token_ids.v, o->token_ids.n);
        s_token_texts(self->tok, r->added, 0, &o->top_texts, o->top_ids.v, o->top_ids.n);
    }
    o->prompt_tokens = t->prompt_tokens;
    o->completion_tokens = t->completion_tokens - (uint32_t)(t->token_ids.n - used);
    o->cached_tokens = t->cached_tokens;
    if (fail) {
        ls_error(msg->rid, "%s", fail);
        o->finish = LS_FINISH_REASON_ERROR;
        o->error_code = LS_ERROR_CODE_INTERNAL;
        o->error = ls_msg_strdup(fail);
        self->stats.failed++;
        if (t->finish == LS_FINISH_REASON_NONE)
            s_abort(self, msg->rid, LS_FINISH_REASON_ABORT, "the detokenizer failed");
    } else if (stopped) {
        int i = ls_detok_stop_index(r->detok);
        o->finish = LS_FINISH_REASON_STOP;
        const ls_text_t *stop = i >= 0 && (size_t)i < r->stops.n ? &r->stops.v[i] : NULL;
        o->matched_stop = ls_msg_textdup(stop ? stop->s : "", stop ? stop->len : 0);
        self->stats.stop_matches++;
        // The scheduler is still generating unless this TokenOut was its last.
        if (t->finish == LS_FINISH_REASON_NONE)
            s_abort(self, msg->rid, LS_FINISH_REASON_STOP, "stop string matched");
    } else {
        o->finish = t->finish;
        if (t->finish == LS_FINISH_REASON_ERROR) {
            // The scheduler's ERROR endings are a failed or lost worker, or a stop: transient.
            o->error_code = LS_ERROR_CODE_UNAVAILABLE;
            o->error = ls_msg_strdup(t->error && *t->error ? t->error : "the scheduler ended the request with an error");
        }
    }
    self->host.send(self->host.host, "tokenizer", &out);
    ls_msg_clear(&out);
    if (last)
        zhashx_delete(self->reqs, key);
    self->stats.active = zhashx_size(self->reqs);
}

void dstream_shutdown(dstream_t *self) {
    for (req_t *r = zhashx_first(self->reqs); r; r = zhashx_next(self->reqs)) {
        ls_msg_t out;
        ls_msg_init(&out, LS_MSG_TEXT_OUT);
        out.rid = r->rid;
        out.u.text_out.finish = LS_FINISH_REASON_ERROR;
        out.u.text_out.error_code = LS_ERROR_CODE_SHUTTING_DOWN;
        out.u.text_out.error = ls_msg_strdup("the detokenizer is shutting down");
        self->host.send(self->host.host, "tokenizer", &out);
        ls_msg_clear(&out);
    }
    zhashx_purge(self->reqs);
    self->stats.active = 0;
}

void dstream_drop_all(dstream_t *self) {
    zhashx_purge(self->reqs);
    self->stats.active = 0;
}
