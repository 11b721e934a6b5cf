// grammar_cache — see grammar_cache.h. A few dozen entries at most, so a linear scan by hash.
#include "grammar_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_hash.h"

typedef struct {
    uint64_t hash, last_use;
    ls_grammar_src_t kind;
    char *src;
    size_t len;
    ls_grammar_t *g;
    int refs;
} s_entry_t;

struct ls_grammar_cache {
    s_entry_t *e;
    int n, max;
    uint64_t clock;
    ls_token_masker_t *masker;
};

ls_grammar_cache_t *ls_grammar_cache_new(int max, ls_token_masker_t *masker) {
    ls_grammar_cache_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->max = max > 0 ? max : 1;
    c->masker = masker;
    return c;
}

static void s_drop(ls_grammar_cache_t *c, int i) {
    if (c->masker)
        ls_token_masker_detach(c->masker, c->e[i].g);
    ls_grammar_destroy(&c->e[i].g);
    free(c->e[i].src);
    c->e[i] = c->e[--c->n];
}

void ls_grammar_cache_destroy(ls_grammar_cache_t **self_p) {
    ls_grammar_cache_t *c = *self_p;
    if (!c)
        return;
    while (c->n)
        s_drop(c, c->n - 1);
    free(c->e);
    free(c);
    *self_p = NULL;
}

ls_grammar_t *ls_grammar_cache_get(ls_grammar_cache_t *self, ls_grammar_src_t kind, const char *src, size_t len,
                                   char *err, size_t errlen) {
    uint64_t h = ls_hash_fnv1a(ls_hash_fnv1a(LS_HASH_FNV_BASIS, &kind, sizeof kind), src ? src : "", len);
    for (int i = 0; i < self->n; i++) {
        s_entry_t *e = &self->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && (!len || !memcmp(e->src, src, len))) {
            e->refs++;
            e->last_use = ++self->clock;
            return e->g;
        }
    }
    ls_grammar_t *g = ls_grammar_compile_kind(kind, src, len, err, errlen);
    if (!g)
        return NULL;
    if (self->n >= self->max) {  // the least recently used free entry makes room, if any
        int victim = -1;
        for (int i = 0; i < self->n; i++)
            if (!self->e[i].refs && (victim < 0 || self->e[i].last_use < self->e[victim].last_use))
                victim = i;
        if (victim >= 0)
            s_drop(self, victim);
    }
    s_entry_t *grown = realloc(self->e, (size_t)(self->n + 1) * sizeof *grown);
    char *copy = malloc(len + 1);
    if (!grown || !copy) {
        if (grown)
            self->e = grown;
        free(copy);
        ls_grammar_destroy(&g);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->e = grown;
    if (len)
        memcpy(copy, src, len);
    copy[len] = 0;
    self->e[self->n++] = (s_entry_t){.hash = h, .last_use = ++self->clock, .kind = kind, .src = copy, .len = len,
                                     .g = g, .refs = 1};
    return g;
}

void ls_grammar_cache_release(ls_grammar_cache_t *self, ls_grammar_t *g) {
    for (int i = 0; i < self->n; i++)
        if (self->e[i].g == g) {
            self->e[i].refs--;
            break;
        }
    // over the bound (entries were held when a new one came): shed free ones now
    for (int i = self->n - 1; i >= 0 && self->n > self->max; i--)
        if (!self->e[i].refs)
            s_drop(self, i);
}
