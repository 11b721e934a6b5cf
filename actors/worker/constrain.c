// constrain — see constrain.h.
#include "constrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_cache.h"
#include "tokenizer.h"

enum {
    S_GRAMMARS_KEPT = 64,
    S_MASK_CACHE_BYTES = 256 << 20,  // masks of 128k tokens are 16 KB: 16k states
};

typedef struct {
    uint64_t rid;
    ls_grammar_t *g;
    int state;
} s_req_t;

struct wcon {
    char *model_dir;
    int32_t vocab, V;  // ids a grammar may allow; the masks' width (logits rows)
    int words;
    ls_tokenizer_t *tok;
    ls_token_masker_t *masker;
    ls_grammar_cache_t *grammars;
    s_req_t *reqs;  // few (the running requests): a linear scan
    size_t n_reqs, cap_reqs;
    int32_t *mask_index;
    uint32_t *masks;
    int cap_rows;
};

wcon_t *wcon_new(const char *model_dir, int32_t vocab, int32_t V) {
    wcon_t *c = calloc(1, sizeof *c);
    if (!c || !(c->model_dir = strdup(model_dir ? model_dir : "."))) {
        free(c);
        return NULL;
    }
    c->vocab = vocab < V ? vocab : V;
    c->V = V;
    c->words = (V + 31) / 32;
    return c;
}

void wcon_destroy(wcon_t **self_p) {
    wcon_t *c = *self_p;
    if (!c)
        return;
    for (size_t i = 0; i < c->n_reqs; i++)
        ls_grammar_cache_release(c->grammars, c->reqs[i].g);
    ls_grammar_cache_destroy(&c->grammars);  // before the masker it detaches grammars from
    ls_token_masker_destroy(&c->masker);
    ls_tokenizer_destroy(&c->tok);
    free(c->reqs);
    free(c->mask_index);
    free(c->masks);
    free(c->model_dir);
    free(c);
    *self_p = NULL;
}

// The vocabulary's bytes into a masker, once.
static int s_load_vocab(wcon_t *c, char *err, size_t errlen) {
    if (c->masker)
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", c->model_dir);
    if (!c->tok && !(c->tok = ls_tokenizer_load(path, err, errlen)))
        return -1;
    const char **toks = calloc((size_t)c->V, sizeof *toks);
    uint32_t *lens = calloc((size_t)c->V, sizeof *lens);
    int32_t n = ls_tokenizer_vocab_size(c->tok);
    for (int32_t v = 0; toks && lens && v < n && v < c->vocab; v++) {
        size_t len;
        toks[v] = ls_tokenizer_token_bytes(c->tok, v, &len);
        lens[v] = (uint32_t)len;
    }
    if (toks && lens)
        c->masker = ls_token_masker_new(c->V, toks, lens, S_MASK_CACHE_BYTES);
    free(toks);
    free(lens);
    if (c->masker && !(c->grammars = ls_grammar_cache_new(S_GRAMMARS_KEPT, c->masker)))
        ls_token_masker_destroy(&c->masker);
    if (!c->masker) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static s_req_t *s_find(wcon_t *c, uint64_t rid) {
    for (size_t i = 0; i < c->n_reqs; i++)
        if (c->reqs[i].rid == rid)
            return &c->reqs[i];
    return NULL;
}

int wcon_begin(wcon_t *self, const ls_msg_step_item_t *it, char *err, size_t errlen) {
    const ls_msg_sampling_params_t *sp = &it->sampling;
    if (!sp->grammar_kind || s_find(self, it->rid))
        return 0;
    if (it->generated > 0 || (!sp->grammar.s && sp->grammar_kind != LS_GRAMMAR_KIND_JSON_OBJECT)) {
        snprintf(err, errlen, "rid %llu is constrained but its grammar never reached this worker",
                 (unsigned long long)it->rid);
        return -1;
    }
    if (s_load_vocab(self, err, errlen) < 0)
        return -1;
    if (self->n_reqs == self->cap_reqs) {
        size_t cap = self->cap_reqs ? 2 * self->cap_reqs : 16;
        s_req_t *r = realloc(self->reqs, cap * sizeof *r);
        if (!r) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        self->reqs = r;
        self->cap_reqs = cap;
    }
    ls_grammar_t *g = ls_grammar_cache_get(self->grammars, (ls_grammar_src_t)sp->grammar_kind, sp->grammar.s,
                                           sp->grammar.len, err, errlen);
    if (!g)
        return -1;
    self->reqs[self->n_reqs++] = (s_req_t){.rid = it->rid, .g = g, .state = ls_grammar_start(g)};
    return 0;
}

void wcon_drop(wcon_t *self, uint64_t rid) {
    s_req_t *r = s_find(self, rid);
    if (!r)
        return;
    ls_grammar_cache_release(self->grammars, r->g);
    *r = self->reqs[--self->n_reqs];
}

static void s_allow(uint32_t *m, int32_t V, const ls_i32s_t *ids) {
    for (size_t i = 0; i < ids->n; i++)
        if (ids->v[i] >= 0 && ids->v[i] < V)
            m[ids->v[i] >> 5] |= 1u << (ids->v[i] & 31);
}

int wcon_masks(wcon_t *self, const ls_msg_step_item_t *const *items, int n, const int32_t **mask_index,
               const uint32_t **masks, char *err, size_t errlen) {
    *mask_index = NULL;
    *masks = NULL;
    if (!self->n_reqs)
        return 0;
    if (n > self->cap_rows) {
        int32_t *mi = realloc(self->mask_index, (size_t)n * sizeof *mi);
        if (mi)
            self->mask_index = mi;
        uint32_t *mk = realloc(self->masks, (size_t)n * self->words * sizeof *mk);
        if (mk)
            self->masks = mk;
        if (!mi || !mk) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        self->cap_rows = n;
    }
    int n_masks = 0;
    for (int r = 0; r < n; r++) {
        s_req_t *q = s_find(self, items[r]->rid);
        self->mask_index[r] = -1;
        if (!q)
            continue;
        uint32_t *m = self->masks + (size_t)n_masks * self->words;
        if (ls_grammar_final(q->g, q->state))
            memset(m, 0, (size_t)self->words * sizeof *m);  // only the end may follow
        else {
            const uint32_t *cached = ls_token_masker_mask(self->masker, q->g, q->state);
            if (!cached) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            memcpy(m, cached, (size_t)self->words * sizeof *m);
        }
        // EOS (the request's stop set) where the output may end; and where no token fits at all
        // (a vocabulary missing some byte the grammar needs next) rather than an empty row
        int empty = 1;
        for (int w = 0; w < self->words && empty; w++)
            empty = !m[w];
        if (ls_grammar_accepting(q->g, q->state) || empty)
            s_allow(m, self->V, &items[r]->sampling.stop_token_ids);
        self->mask_index[r] = n_masks++;
    }
    if (n_masks) {
        *mask_index = self->mask_index;
        *masks = self->masks;
    }
    return 0;
}

int wcon_advance(wcon_t *self, const ls_msg_step_item_t *it, int32_t token) {
    s_req_t *q = s_find(self, it->rid);
    if (!q)
        return 0;
    for (size_t i = 0; i < it->sampling.stop_token_ids.n; i++)
        if (it->sampling.stop_token_ids.v[i] == token)
            return 0;  // the request ends here
    size_t len;
    const char *b = ls_tokenizer_token_bytes(self->tok, token, &len);
    int next = len ? ls_grammar_walk(q->g, q->state, b, len) : -1;
    if (next < 0)
        return -1;
    q->state = next;
    return 0;
}

void wcon_mask_counts(const wcon_t *self, uint64_t *hits, uint64_t *misses) {
    *hits = self->masker ? ls_token_masker_hits(self->masker) : 0;
    *misses = self->masker ? ls_token_masker_misses(self->masker) : 0;
}
