// tok_added: an adapter's added tokens over a base tokenizer (tokenizer.h). Each token is
// kept as the base keeps its own added tokens (tok_added_t: the content, and the normalized
// form a normalized one is matched by, made with the base's normalizer), in an arena of its
// own, with the decoder's text of each made once by the base's decoder stages.
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"
#include "tok_internal.h"

void ls_tok_added_destroy(ls_tok_added_t **ap) {
    if (!ap || !*ap)
        return;
    ls_tok_added_t *a = *ap;
    free(a->added);
    ls_buf_free(&a->arena);
    free(a->raw.order);
    free(a->norm.order);
    ls_buf_free(&a->dec_arena);
    free(a->dec_off);
    free(a->dec_len);
    free(a);
    *ap = NULL;
}

// Appends n bytes and a NUL to the arena; their offset in *off. -1 out of memory or past the
// 32-bit offsets.
static int s_put(ls_buf_t *b, const char *s, size_t n, uint32_t *off) {
    *off = (uint32_t)b->n;
    return ls_buf_append(b, s, n) < 0 || ls_buf_append(b, "", 1) < 0 || b->n > UINT32_MAX ? -1 : 0;
}

ls_tok_added_t *ls_tok_added_new(ls_tokenizer_t *t, int32_t first, const ls_tok_added_spec_t *toks,
                                 size_t n, char *err, size_t errlen) {
    if (first < t->n_ids || (int64_t)first + (int64_t)n > INT32_MAX) {
        ls_err_set(err, errlen, "%s: added ids from %d overlap the tokenizer's own (%d ids)", t->what,
                   (int)first, (int)t->n_ids);
        return NULL;
    }
    ls_buf_t one = {0};
    ls_tok_added_t *a = calloc(1, sizeof *a);
    if (!a || !(a->added = calloc(n + 1, sizeof *a->added)) ||
        !(a->dec_off = calloc(n + 1, sizeof *a->dec_off)) ||
        !(a->dec_len = calloc(n + 1, sizeof *a->dec_len)))
        goto oom;
    a->first = first;
    a->n = n;
    for (size_t i = 0; i < n; i++) {
        const ls_tok_added_spec_t *s = &toks[i];
        if (s->len == 0 || !ls_utf8_valid(s->content, s->len) || memchr(s->content, 0, s->len)) {
            ls_err_set(err, errlen, "%s: added token %d is empty or not valid UTF-8", t->what,
                       (int)(first + (int32_t)i));
            goto fail;
        }
        char *c = strndup(s->content, s->len);
        int32_t have = c ? ls_tokenizer_token_to_id(t, c) : -1;
        free(c);
        if (!c)
            goto oom;
        if (have >= 0) {
            ls_err_set(err, errlen, "%s: added token %d (\"%.64s\") is the tokenizer's own token %d",
                       t->what, (int)(first + (int32_t)i), s->content, (int)have);
            goto fail;
        }
        for (size_t j = 0; j < i; j++)
            if (a->added[j].len == s->len && memcmp(a->arena.s + a->added[j].off, s->content, s->len) == 0) {
                ls_err_set(err, errlen, "%s: added token \"%.64s\" is given twice", t->what, s->content);
                goto fail;
            }
        tok_added_t *x = &a->added[i];
        *x = (tok_added_t){.id = first + (int32_t)i, .len = (uint32_t)s->len,
                           .single_word = s->single_word, .lstrip = s->lstrip, .rstrip = s->rstrip,
                           .normalized = s->normalized, .special = s->special};
        if (s_put(&a->arena, s->content, s->len, &x->off) < 0)
            goto oom;
        x->match_off = x->off;
        x->match_len = x->len;
        if (x->normalized && t->n_norms > 0) {  // matched by its normalized form, as the base's
            const char *ns;
            size_t nn;
            if (tok_normalize(t, s->content, s->len, &ns, &nn) < 0 ||
                s_put(&a->arena, ns, nn, &x->match_off) < 0)
                goto oom;
            x->match_len = (uint32_t)nn;
        }
        if (tok_dec_text(t, s->content, s->len, false, &one) < 0 ||
            s_put(&a->dec_arena, one.s, one.n, &a->dec_off[i]) < 0)
            goto oom;
        a->dec_len[i] = (uint32_t)one.n;
    }
    ls_buf_free(&one);
    if (tok_added_set_build(&a->raw, a->added, n, a->arena.s ? a->arena.s : "", false) < 0 ||
        tok_added_set_build(&a->norm, a->added, n, a->arena.s ? a->arena.s : "", true) < 0)
        goto oom;
    return a;
oom:
    ls_err_set(err, errlen, "%s: out of memory for added tokens", t->what);
fail:
    ls_buf_free(&one);
    ls_tok_added_destroy(&a);
    return NULL;
}

int32_t ls_tok_added_first(const ls_tok_added_t *a) {
    return a->first;
}

size_t ls_tok_added_count(const ls_tok_added_t *a) {
    return a->n;
}

const char *ls_tok_added_token(const ls_tok_added_t *a, int32_t id, bool *special) {
    if (!a || id < a->first || (int64_t)id - a->first >= (int64_t)a->n)
        return NULL;
    const tok_added_t *x = &a->added[id - a->first];
    if (special)
        *special = x->special;
    return a->arena.s + x->off;
}
