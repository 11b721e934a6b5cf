#define _GNU_SOURCE  // memmem
// tok_encode: text -> ids. Added tokens are split out first, the rest is normalized,
// pre-tokenized into words (depth first, so no piece lists are built) and each word goes
// through BPE, behind a word cache. Every step follows HF tokenizers; see tokenizer.h.
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "ls_err.h"
#include "tok_internal.h"

#define CACHE_SLOTS 16384         // entries (a power of two); cleared when half full
#define CACHE_MAX_KEY 256         // longer words are not cached (HF does the same)
#define CACHE_MAX_BYTES (4 << 20) // key bytes before a clear

static int s_ids_push(ls_token_ids_t *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p)
            return -1;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

static size_t s_char_len(const char *s) {
    unsigned char c = (unsigned char)*s;
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

// ---- matching: a regex, or a literal (Metaspace's replacement character) -----------------

typedef struct {
    const pcre2_code *re;
    const char *lit;
    size_t lit_len;
} s_matcher_t;

// Finds the next match at or after from: 1 with [*ms, *me), 0 when none, -1 on a regex error.
static int s_next_match(ls_tokenizer_t *t, const s_matcher_t *m, const char *s, size_t n, size_t from,
                        size_t *ms, size_t *me) {
    if (!m->re) {
        const char *p = memmem(s + from, n - from, m->lit, m->lit_len);
        if (!p)
            return 0;
        *ms = (size_t)(p - s);
        *me = *ms + m->lit_len;
        return 1;
    }
    // The input is valid UTF-8 (checked once in encode), so PCRE2 need not check it again.
    int rc = pcre2_match(m->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, t->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

// Calls fn for each segment of s: matches and the text between them, in order, covering s.
// Empty matches are skipped (HF drops empty pieces), the search moving on by one character.
typedef int (*s_segment_fn)(ls_tokenizer_t *t, void *ctx, size_t off, size_t len, bool is_match);

static int s_segments(ls_tokenizer_t *t, const s_matcher_t *m, const char *s, size_t n, s_segment_fn fn,
                      void *ctx) {
    size_t prev = 0, from = 0, ms, me;
    while (from <= n) {
        int rc = s_next_match(t, m, s, n, from, &ms, &me);
        if (rc < 0)
            return -1;
        if (rc == 0)
            break;
        if (me == ms) {
            if (ms >= n)
                break;
            from = ms + s_char_len(s + ms);
            continue;
        }
        if (ms > prev && fn(t, ctx, prev, ms - prev, false) < 0)
            return -1;
        if (fn(t, ctx, ms, me - ms, true) < 0)
            return -1;
        prev = from = me;
    }
    if (prev < n && fn(t, ctx, prev, n - prev, false) < 0)
        return -1;
    return 0;
}

// ---- BPE --------------------------------------------------------------------------------

static bool s_merge_less(const tok_merge_t *a, const tok_merge_t *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void s_heap_push(tok_merge_t *h, size_t *n, tok_merge_t m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_merge_less(&m, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static tok_merge_t s_heap_pop(tok_merge_t *h, size_t *n) {
    tok_merge_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && s_merge_less(&h[c + 1], &h[c]))
            c++;
        if (!s_merge_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

static bool s_merge_get(const ls_tokenizer_t *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    const tok_mergemap_t *m = &t->merges;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & m->mask;
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == key) {
            *rank = (uint32_t)(m->vals[i] >> 32);
            *id = (int32_t)(uint32_t)m->vals[i];
            return true;
        }
        i = (i + 1) & m->mask;
    }
    return false;
}

static int s_sym_add(ls_tokenizer_t *t, size_t *n, int32_t id, uint32_t len) {
    if (*n == t->syms_cap) {
        size_t cap = t->syms_cap ? t->syms_cap * 2 : 256;
        tok_sym_t *p = realloc(t->syms, cap * sizeof *p);
        tok_merge_t *h = realloc(t->heap, cap * 3 * sizeof *h);
        if (p)
            t->syms = p;
        if (h)
            t->heap = h;
        if (!p || !h)
            return -1;
        t->syms_cap = cap;
    }
    t->syms[*n] = (tok_sym_t){id, (int32_t)*n - 1, -1, len};
    if (*n > 0)
        t->syms[*n - 1].next = (int32_t)*n;
    (*n)++;
    return 0;
}

// HF's Word::merge_all: repeatedly merge the pair of lowest rank (then leftmost), with stale
// heap entries detected by re-checking the pair. The heap takes the initial pairs plus at most
// two per merge done, so three times the symbol count bounds it.
static void s_merge_all(ls_tokenizer_t *t, size_t n) {
    tok_sym_t *sy = t->syms;
    size_t hn = 0;
    uint32_t rank;
    int32_t id;
    for (size_t i = 0; i + 1 < n; i++)
        if (s_merge_get(t, sy[i].id, sy[i + 1].id, &rank, &id))
            s_heap_push(t->heap, &hn, (tok_merge_t){rank, (uint32_t)i, id});
    while (hn) {
        tok_merge_t top = s_heap_pop(t->heap, &hn);
        tok_sym_t *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        tok_sym_t *right = &sy[cur->next];
        if (!s_merge_get(t, cur->id, right->id, &rank, &id) || id != top.new_id)
            continue;
        cur->id = top.new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0)
            sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && s_merge_get(t, sy[cur->prev].id, cur->id, &rank, &id))
            s_heap_push(t->heap, &hn, (tok_merge_t){rank, (uint32_t)cur->prev, id});
        if (cur->next >= 0 && s_merge_get(t, cur->id, sy[cur->next].id, &rank, &id))
            s_heap_push(t->heap, &hn, (tok_merge_t){rank, top.pos, id});
    }
}

static tok_cache_entry_t *s_cache_find(tok_cache_t *c, const char *w, size_t n, uint64_t h) {
    size_t i = (size_t)h & c->mask;
    for (;;) {
        tok_cache_entry_t *e = &c->entries[i];
        if (e->key_len == UINT32_MAX ||
            (e->hash == h && e->key_len == n && memcmp(c->keys.s + e->key_off, w, n) == 0))
            return e;
        i = (i + 1) & c->mask;
    }
}

static void s_cache_clear(tok_cache_t *c) {
    for (size_t i = 0; i <= c->mask; i++)
        c->entries[i].key_len = UINT32_MAX;
    c->used = 0;
    c->keys.n = 0;
    c->ids_n = 0;
}

static void s_cache_put(tok_cache_t *c, const char *w, size_t n, uint64_t h, const int32_t *ids,
                        size_t k) {
    if (!c->entries) {
        c->entries = malloc(CACHE_SLOTS * sizeof *c->entries);
        if (!c->entries)
            return;  // the cache is an optimization: without memory, words are just not cached
        c->mask = CACHE_SLOTS - 1;
        s_cache_clear(c);
    }
    if (c->used * 2 >= CACHE_SLOTS || c->keys.n + n > CACHE_MAX_BYTES)
        s_cache_clear(c);
    if (c->ids_n + k > c->ids_cap) {
        size_t cap = c->ids_cap ? c->ids_cap : 4096;
        while (cap < c->ids_n + k)
            cap *= 2;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p)
            return;
        c->ids = p;
        c->ids_cap = cap;
    }
    size_t key_off = c->keys.n;
    if (ls_buf_append(&c->keys, w, n) < 0)
        return;
    tok_cache_entry_t *e = s_cache_find(c, w, n, h);
    *e = (tok_cache_entry_t){h, (uint32_t)key_off, (uint32_t)n, (uint32_t)c->ids_n, (uint32_t)k};
    memcpy(c->ids + c->ids_n, ids, k * sizeof *ids);
    c->ids_n += k;
    c->used++;
}

// One pre-tokenized word (n bytes, n > 0) -> ids appended to out.
static int s_bpe_word(ls_tokenizer_t *t, const char *w, size_t n, ls_token_ids_t *out) {
    if (t->ignore_merges) {
        int32_t id = tok_vocab_get(t, w, n);
        if (id >= 0)
            return s_ids_push(out, id);
    }
    uint64_t h = tok_hash(w, n);
    if (n <= CACHE_MAX_KEY && t->cache.entries) {
        tok_cache_entry_t *e = s_cache_find(&t->cache, w, n, h);
        if (e->key_len != UINT32_MAX) {
            for (uint32_t i = 0; i < e->ids_n; i++)
                if (s_ids_push(out, t->cache.ids[e->ids_off + i]) < 0)
                    return -1;
            return 0;
        }
    }
    size_t ns = 0;
    int32_t unk_len = -1;  // bytes of a pending (possibly fused) unknown run
    for (size_t i = 0; i < n;) {
        size_t k = s_char_len(w + i);
        int32_t id = tok_char_id(t, w + i, k);
        bool bytes_ok = id < 0 && t->byte_fallback;
        for (size_t j = 0; bytes_ok && j < k; j++)
            bytes_ok = t->byte_ids[(unsigned char)w[i + j]] >= 0;
        if (id >= 0 || bytes_ok) {
            if (unk_len >= 0 && s_sym_add(t, &ns, t->unk_id, (uint32_t)unk_len) < 0)
                return -1;
            unk_len = -1;
            if (id >= 0 && s_sym_add(t, &ns, id, (uint32_t)k) < 0)
                return -1;
            for (size_t j = 0; bytes_ok && j < k; j++)
                if (s_sym_add(t, &ns, t->byte_ids[(unsigned char)w[i + j]], 1) < 0)
                    return -1;
        } else if (t->unk_id >= 0) {
            if (unk_len >= 0 && !t->fuse_unk) {
                if (s_sym_add(t, &ns, t->unk_id, (uint32_t)unk_len) < 0)
                    return -1;
                unk_len = -1;
            }
            unk_len = (unk_len < 0 ? 0 : unk_len) + (int32_t)k;
        }
        // Without unk_token an unknown character is dropped, as HF does.
        i += k;
    }
    if (unk_len >= 0 && s_sym_add(t, &ns, t->unk_id, (uint32_t)unk_len) < 0)
        return -1;
    s_merge_all(t, ns);
    size_t first = out->n;
    for (size_t i = 0; i < ns; i++)
        if (t->syms[i].len && s_ids_push(out, t->syms[i].id) < 0)
            return -1;
    if (n <= CACHE_MAX_KEY)
        s_cache_put(&t->cache, w, n, h, out->ids + first, out->n - first);
    return 0;
}

// ---- pre-tokenization (depth first over the steps) --------------------------------------

// A piece in flight: text, and whether it starts at offset 0 of the original text (what
// Metaspace's prepend_scheme "first" asks).
static int s_pretok(ls_tokenizer_t *t, size_t step, const char *s, size_t n, bool first,
                    ls_token_ids_t *out);

typedef struct {
    size_t step;
    const char *s;
    bool first;
    tok_split_behavior_t behavior;
    bool invert;
    ls_token_ids_t *out;
    size_t pend_off, pend_len;  // a piece held back for MergedWith* / Contiguous
    bool pend, pend_match;
} s_split_ctx_t;

static int s_emit(ls_tokenizer_t *t, s_split_ctx_t *c, size_t off, size_t len) {
    return s_pretok(t, c->step + 1, c->s + off, len, c->first && off == 0, c->out);
}

static int s_flush(ls_tokenizer_t *t, s_split_ctx_t *c) {
    if (!c->pend)
        return 0;
    c->pend = false;
    return s_emit(t, c, c->pend_off, c->pend_len);
}

static int s_hold(s_split_ctx_t *c, size_t off, size_t len, bool is_match) {
    c->pend = true;
    c->pend_off = off;
    c->pend_len = len;
    c->pend_match = is_match;
    return 0;
}

// HF's SplitDelimiterBehavior applied to one segment in order.
static int s_split_segment(ls_tokenizer_t *t, void *ctx, size_t off, size_t len, bool is_match) {
    s_split_ctx_t *c = ctx;
    is_match ^= c->invert;
    switch (c->behavior) {
    case SPLIT_ISOLATED:
        return s_emit(t, c, off, len);
    case SPLIT_REMOVED:
        return is_match ? 0 : s_emit(t, c, off, len);
    case SPLIT_CONTIGUOUS:
        if (c->pend && c->pend_match == is_match) {
            c->pend_len += len;
            return 0;
        }
        break;
    case SPLIT_MERGED_PREVIOUS:
        if (is_match && c->pend && !c->pend_match) {
            c->pend_len += len;
            c->pend_match = true;
            return 0;
        }
        break;
    case SPLIT_MERGED_NEXT:
        if (!is_match && c->pend && c->pend_match) {
            c->pend_len += len;
            return s_flush(t, c);
        }
        break;
    }
    return s_flush(t, c) < 0 ? -1 : s_hold(c, off, len, is_match);
}

static int s_split(ls_tokenizer_t *t, size_t step, const s_matcher_t *m, tok_split_behavior_t behavior,
                   bool invert, const char *s, size_t n, bool first, ls_token_ids_t *out) {
    s_split_ctx_t c = {.step = step, .s = s, .first = first, .behavior = behavior, .invert = invert, .out = out};
    if (s_segments(t, m, s, n, s_split_segment, &c) < 0)
        return -1;
    return s_flush(t, &c);
}

// ByteLevel's isolated regex pieces, each mapped to the byte alphabet before going on.
static int s_byte_level_piece(ls_tokenizer_t *t, void *ctx, size_t off, size_t len, bool is_match) {
    s_split_ctx_t *c = ctx;
    ls_buf_t *b = &t->pt_bufs[2 * c->step + 1];
    b->n = 0;
    if (ls_buf_reserve(b, 2 * len) < 0)
        return -1;
    for (size_t i = 0; i < len; i++)
        b->n += (size_t)ls_utf8_put(b->s + b->n, tok_byte_to_cp((unsigned char)c->s[off + i]));
    return s_pretok(t, c->step + 1, b->s, b->n, c->first && off == 0, c->out);
}

static int s_pretok(ls_tokenizer_t *t, size_t step, const char *s, size_t n, bool first,
                    ls_token_ids_t *out) {
    if (n == 0)
        return 0;
    if (step == t->n_pts)
        return s_bpe_word(t, s, n, out);
    const tok_pt_t *p = &t->pts[step];
    ls_buf_t *b = &t->pt_bufs[2 * step];
    switch (p->kind) {
    case PT_SPLIT: {
        s_matcher_t m = {.re = p->re};
        return s_split(t, step, &m, p->behavior, p->invert, s, n, first, out);
    }
    case PT_BYTE_LEVEL: {
        if (p->add_prefix_space && s[0] != ' ') {
            b->n = 0;
            if (ls_buf_append(b, " ", 1) < 0 || ls_buf_append(b, s, n) < 0)
                return -1;
            s = b->s;
            n = b->n;
        }
        s_split_ctx_t c = {.step = step, .s = s, .first = first, .out = out};
        if (!p->re)
            return s_byte_level_piece(t, &c, 0, n, false);
        s_matcher_t m = {.re = p->re};
        return s_segments(t, &m, s, n, s_byte_level_piece, &c);
    }
    case PT_METASPACE: {
        b->n = 0;
        bool starts = (size_t)p->repl_len <= n && memcmp(s, p->repl, (size_t)p->repl_len) == 0;
        bool prepend = !starts && s[0] != ' ' &&
                       (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && first));
        if (prepend && ls_buf_append(b, p->repl, (size_t)p->repl_len) < 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (ls_buf_append(b, s[i] == ' ' ? p->repl : s + i, s[i] == ' ' ? (size_t)p->repl_len : 1) < 0)
                return -1;
        if (!p->split)
            return s_pretok(t, step + 1, b->s, b->n, first, out);
        s_matcher_t m = {.lit = p->repl, .lit_len = (size_t)p->repl_len};
        return s_split(t, step, &m, SPLIT_MERGED_NEXT, false, b->s, b->n, first, out);
    }
    }
    return -1;
}

// ---- normalization ----------------------------------------------------------------------

static bool s_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

typedef struct {
    ls_buf_t *dst;
    const char *src;
    const tok_norm_t *norm;
} s_replace_ctx_t;

static int s_replace_segment(ls_tokenizer_t *t, void *ctx, size_t off, size_t len, bool is_match) {
    s_replace_ctx_t *c = ctx;
    return is_match ? ls_buf_append(c->dst, c->norm->content, c->norm->content_len)
                    : ls_buf_append(c->dst, c->src + off, len);
}

// One normalizer step from src into dst.
static int s_norm_step(ls_tokenizer_t *t, const tok_norm_t *nm, const char *s, size_t n, ls_buf_t *dst) {
    dst->n = 0;
    if (ls_buf_append(dst, "", 0) < 0)
        return -1;
    switch (nm->kind) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD: {
        if (s_ascii(s, n))  // ASCII is already in every normal form
            return ls_buf_append(dst, s, n);
        static const utf8proc_option_t opts[] = {
            [NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
            [NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
            [NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
            [NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
        };
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &res, opts[nm->kind]);
        int rc = k < 0 ? -1 : ls_buf_append(dst, res, (size_t)k);
        free(res);
        return rc;
    }
    case NORM_LOWERCASE:
        for (size_t i = 0; i < n;) {
            size_t k = s_char_len(s + i);
            uint32_t cp = ls_utf8_cp((const unsigned char *)s + i, (int)k);
            // Rust's char::to_lowercase; U+0130 is the one character whose lowercase is two
            // (SpecialCasing), which utf8proc's simple mapping lacks.
            int rc = cp == 0x130 ? ls_buf_append(dst, "i\xCC\x87", 3)
                                 : ls_buf_append_cp(dst, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
            if (rc < 0)
                return -1;
            i += k;
        }
        return 0;
    case NORM_STRIP: {
        size_t a = 0, z = n;
        while (nm->left && a < z) {
            size_t k = s_char_len(s + a);
            if (!ls_utf8_is_space(ls_utf8_cp((const unsigned char *)s + a, (int)k)))
                break;
            a += k;
        }
        while (nm->right && z > a) {
            size_t b = z - 1;
            while (b > a && ((unsigned char)s[b] & 0xC0) == 0x80)
                b--;
            if (!ls_utf8_is_space(ls_utf8_cp((const unsigned char *)s + b, (int)(z - b))))
                break;
            z = b;
        }
        return ls_buf_append(dst, s + a, z - a);
    }
    case NORM_PREPEND:
        if (n && ls_buf_append(dst, nm->content, nm->content_len) < 0)
            return -1;
        return ls_buf_append(dst, s, n);
    case NORM_REPLACE: {
        s_matcher_t m = {.re = nm->re};
        s_replace_ctx_t c = {dst, s, nm};
        return s_segments(t, &m, s, n, s_replace_segment, &c);
    }
    }
    return -1;
}

int tok_normalize(ls_tokenizer_t *t, const char *s, size_t n, const char **out, size_t *outn) {
    for (size_t i = 0; i < t->n_norms; i++) {
        ls_buf_t *dst = &t->norm_bufs[i & 1];
        if (s_norm_step(t, &t->norms[i], s, n, dst) < 0)
            return -1;
        s = dst->s;
        n = dst->n;
    }
    *out = s;
    *outn = n;
    return 0;
}

// ---- added tokens -----------------------------------------------------------------------

static bool s_is_word_cp(uint32_t cp) {
    // Unicode \w as Rust's regex has it: letters, marks, decimal digits, connector punctuation.
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return cp == 0x200C || cp == 0x200D;
    }
}

static size_t s_prev_char(const char *s, size_t at) {
    size_t b = at - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
        b--;
    return b;
}

static uint32_t s_cp_at(const char *s, size_t at) {
    return ls_utf8_cp((const unsigned char *)s + at, (int)s_char_len(s + at));
}

typedef struct {
    const tok_added_t *tok;
    size_t start, stop;  // the span it takes, after lstrip/rstrip
} s_added_match_t;

// The added tokens matched at one stage (raw or normalized): the base's, and an adapter's
// (ls_tok_added_t), as one set.
typedef struct {
    const tok_added_t *added;
    const char *arena;
    const tok_added_set_t *set;
} s_added_src_t;

typedef struct {
    int n;
    s_added_src_t src[2];
} s_added_sets_t;

static s_added_sets_t s_sets(const ls_tokenizer_t *t, const ls_tok_added_t *a, bool normalized) {
    s_added_sets_t x = {1, {{t->added, t->arena.s, normalized ? &t->added_norm : &t->added_raw}}};
    if (a && a->n)
        x.src[x.n++] = (s_added_src_t){a->added, a->arena.s, normalized ? &a->norm : &a->raw};
    return x;
}

// HF's AddedVocabulary::find_matches, one match at a time: the leftmost-longest match at or
// after *from over every source (one trie in HF; contents never repeat across the sources,
// ls_tok_added_new), a single_word token not standing alone passed over as aho-corasick's
// iterator moves past it, with lstrip/rstrip widening it over whitespace but not before
// gap_start (the end of the previous match). Returns false when there is none.
static bool s_added_next(const s_added_sets_t *sets, bool no_special, const char *s, size_t n,
                         size_t *from, size_t gap_start, s_added_match_t *m) {
    for (size_t i = *from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        const tok_added_t *hit = NULL;
        for (int k = 0; k < sets->n; k++) {  // each source's longest first: the first that fits
            const tok_added_set_t *set = sets->src[k].set;
            for (uint32_t j = set->start[b]; j < set->start[b + 1]; j++) {
                const tok_added_t *a = &sets->src[k].added[set->order[j]];
                if (a->match_len <= n - i && !(no_special && a->special) &&
                    (!hit || a->match_len > hit->match_len) &&
                    memcmp(s + i, sets->src[k].arena + a->match_off, a->match_len) == 0) {
                    hit = a;
                    break;
                }
            }
        }
        if (!hit)
            continue;
        size_t start = i, stop = i + hit->match_len;
        if (hit->single_word && ((start > 0 && s_is_word_cp(s_cp_at(s, s_prev_char(s, start)))) ||
                                 (stop < n && s_is_word_cp(s_cp_at(s, stop))))) {
            i = stop - 1;  // the loop's i++ resumes at stop
            continue;
        }
        if (hit->lstrip)
            while (start > gap_start && ls_utf8_is_space(s_cp_at(s, s_prev_char(s, start))))
                start = s_prev_char(s, start);
        if (hit->rstrip)
            while (stop < n && ls_utf8_is_space(s_cp_at(s, stop)))
                stop += s_char_len(s + stop);
        *from = stop;
        *m = (s_added_match_t){hit, start, stop};
        return true;
    }
    *from = n;
    return false;
}

// After normalization: split on the normalized added tokens, pre-tokenize the rest.
static int s_encode_normalized(ls_tokenizer_t *t, const ls_tok_added_t *a, const char *s, size_t n,
                               bool first, bool no_special, ls_token_ids_t *out) {
    size_t from = 0, gap = 0;
    s_added_match_t m;
    s_added_sets_t sets = s_sets(t, a, true);
    while (s_added_next(&sets, no_special, s, n, &from, gap, &m)) {
        if (s_pretok(t, 0, s + gap, m.start - gap, first && gap == 0, out) < 0 ||
            s_ids_push(out, m.tok->id) < 0)
            return -1;
        gap = m.stop;
    }
    return s_pretok(t, 0, s + gap, n - gap, first && gap == 0, out);
}

static int s_encode_segment(ls_tokenizer_t *t, const ls_tok_added_t *a, const char *s, size_t n,
                            bool first, bool no_special, ls_token_ids_t *out) {
    if (n == 0)
        return 0;
    const char *ns;
    size_t nn;
    if (tok_normalize(t, s, n, &ns, &nn) < 0)
        return -1;
    return s_encode_normalized(t, a, ns, nn, first, no_special, out);
}

int ls_tokenizer_encode(ls_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                        ls_token_ids_t *out, char *err, size_t errlen) {
    return ls_tokenizer_encode_added(t, NULL, text, len, flags, out, err, errlen);
}

int ls_tokenizer_encode_added(ls_tokenizer_t *t, const ls_tok_added_t *a, const char *text,
                              size_t len, unsigned flags, ls_token_ids_t *out, char *err,
                              size_t errlen) {
    if (!ls_utf8_valid(text, len)) {
        ls_err_set(err, errlen, "%s: the text is not valid UTF-8", t->what);
        return -1;
    }
    bool no_special = flags & LS_TOKENIZE_NO_SPECIAL_MATCH;
    bool add = flags & LS_TOKENIZE_ADD_SPECIAL;
    for (size_t i = 0; add && i < t->n_prefix; i++)
        if (s_ids_push(out, t->prefix_ids[i]) < 0)
            goto oom;
    size_t from = 0, gap = 0;
    s_added_match_t m;
    s_added_sets_t sets = s_sets(t, a, false);
    while (s_added_next(&sets, no_special, text, len, &from, gap, &m)) {
        if (s_encode_segment(t, a, text + gap, m.start - gap, gap == 0, no_special, out) < 0 ||
            s_ids_push(out, m.tok->id) < 0)
            goto fail;
        gap = m.stop;
    }
    if (s_encode_segment(t, a, text + gap, len - gap, gap == 0, no_special, out) < 0)
        goto fail;
    for (size_t i = 0; add && i < t->n_suffix; i++)
        if (s_ids_push(out, t->suffix_ids[i]) < 0)
            goto oom;
    return 0;
fail:
    ls_err_set(err, errlen, "%s: out of memory or a regex error while encoding", t->what);
    return -1;
oom:
    ls_err_set(err, errlen, "%s: out of memory", t->what);
    return -1;
}
