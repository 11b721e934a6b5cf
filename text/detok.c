// detok: ids -> text, whole or one id at a time. The full decode is the incremental one fed
// every id and finished, so the two cannot disagree; what makes the incremental form exact is
// that each decoder stage is rewritten as a left-to-right pass that holds back only what a
// later token could still change:
//   ByteLevel     an unfinished UTF-8 sequence (Rust's from_utf8_lossy decides the rest);
//   ByteFallback  the whole run of "<0xHH>" tokens, since HF turns an invalid run into one
//                 U+FFFD per byte, valid characters in it included;
//   Strip         nothing: it only removes leading characters of the fused text, so the pass
//                 drops them as they come until the first other character;
//   Metaspace     nothing: "first token" is known when that token arrives.
// Stop strings come after the decoder, on text: the longest tail that is a prefix of some stop
// string waits for the next piece.
#define _GNU_SOURCE  // memmem
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"
#include "tok_internal.h"

struct ls_detok {
    const ls_tokenizer_t *t;
    const ls_tok_added_t *a;  // an adapter's added tokens, or NULL
    unsigned flags;
    size_t n_fed;       // tokens the decoder has seen (specials skipped are not seen)
    int strip_left;     // Strip: leading characters still to drop
    ls_buf_t pending;   // ByteLevel: unfinished UTF-8 bytes; pieces: the byte-fallback run
    ls_buf_t text;      // decoded, not yet through the stop-string filter
    ls_buf_t out;       // the piece handed back
    ls_buf_t tmp;
    char **stops;
    size_t *stop_len;
    size_t n_stops;
    bool stopped;
    int stop_index;
};

static void s_init(ls_detok_t *d, const ls_tokenizer_t *t, const ls_tok_added_t *a,
                   unsigned flags) {
    memset(d, 0, sizeof *d);
    d->t = t;
    d->a = a;
    d->flags = flags;
    d->strip_left = t->dec_strip_start;
    d->stop_index = -1;
}

static void s_release(ls_detok_t *d) {
    ls_buf_free(&d->pending);
    ls_buf_free(&d->text);
    ls_buf_free(&d->out);
    ls_buf_free(&d->tmp);
    for (size_t i = 0; i < d->n_stops; i++)
        free(d->stops[i]);
    free(d->stops);
    free(d->stop_len);
}

// Appends decoded text, dropping what the Strip stage removes from the start.
static int s_put(ls_detok_t *d, const char *s, size_t n) {
    const ls_tokenizer_t *t = d->t;
    while (d->strip_left > 0 && n > 0) {
        size_t bad;
        int k = ls_utf8_seq((const unsigned char *)s, n, &bad);
        if (k <= 0 || ls_utf8_cp((const unsigned char *)s, k) != t->dec_strip_cp) {
            d->strip_left = 0;
            break;
        }
        s += k;
        n -= (size_t)k;
        d->strip_left--;
    }
    return ls_buf_append(&d->text, s, n);
}

// Ends a byte-fallback run: its text if it is valid UTF-8, else U+FFFD per byte (HF).
static int s_end_run(ls_detok_t *d) {
    if (d->pending.n == 0)
        return 0;
    int rc = 0;
    if (ls_utf8_valid(d->pending.s, d->pending.n))
        rc = s_put(d, d->pending.s, d->pending.n);
    else
        for (size_t i = 0; i < d->pending.n && rc == 0; i++)
            rc = s_put(d, "\xEF\xBF\xBD", 3);
    d->pending.n = 0;
    return rc;
}

// Whether id is a token of t, or of a.
static bool s_known(const ls_tokenizer_t *t, const ls_tok_added_t *a, int32_t id) {
    return (id >= 0 && id < t->n_ids && t->id_off[id] != UINT32_MAX) ||
           ls_tok_added_token(a, id, NULL) != NULL;
}

static int s_feed(ls_detok_t *d, int32_t id) {
    const ls_tokenizer_t *t = d->t;
    const ls_tok_added_t *a = d->a;
    bool ext = id >= t->n_ids;  // an adapter's added token (s_known): its own tables
    const tok_added_t *x = ext ? &a->added[id - a->first] : NULL;
    if ((d->flags & LS_DETOK_SKIP_SPECIAL) && (ext ? x->special : t->id_special[id]))
        return 0;
    const char *s = ext ? a->dec_arena.s + a->dec_off[id - a->first] : t->dec_arena.s + t->dec_off[id];
    size_t n = ext ? a->dec_len[id - a->first] : t->dec_len[id];
    bool first = d->n_fed++ == 0;
    if (t->dec_mode == DEC_BYTE_LEVEL) {
        if (ls_buf_append(&d->pending, s, n) < 0)
            return -1;
        size_t used = ls_utf8_lossy(&d->text, d->pending.s, d->pending.n, true);
        if (used == (size_t)-1)
            return -1;
        memmove(d->pending.s, d->pending.s + used, d->pending.n - used);
        d->pending.n -= used;
        return 0;
    }
    if (!ext && t->dec_byte[id] >= 0) {
        char b = (char)t->dec_byte[id];
        return ls_buf_append(&d->pending, &b, 1);
    }
    if (s_end_run(d) < 0)
        return -1;
    if (first && t->dec_metaspace_first) {
        if ((ext ? tok_dec_text(t, a->arena.s + x->off, x->len, true, &d->tmp)
                 : tok_dec_token_text(t, id, true, &d->tmp)) < 0)
            return -1;
        return s_put(d, d->tmp.s, d->tmp.n);
    }
    return s_put(d, s, n);
}

static int s_flush_decoder(ls_detok_t *d) {
    if (d->t->dec_mode == DEC_PIECES)
        return s_end_run(d);
    size_t used = ls_utf8_lossy(&d->text, d->pending.s ? d->pending.s : "", d->pending.n, false);
    d->pending.n = 0;
    return used == (size_t)-1 ? -1 : 0;
}

// Moves decoded text to out, up to a stop string (then stopped) or up to the tail that could
// still become one (unless final).
static int s_stop_filter(ls_detok_t *d, bool final) {
    ls_buf_t *x = &d->text;
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < d->n_stops; k++) {
        if (!d->stop_len[k])
            continue;  // an empty stop string never matches
        const char *p = memmem(x->s ? x->s : "", x->n, d->stops[k], d->stop_len[k]);
        if (p && (size_t)(p - x->s) < best) {
            best = (size_t)(p - x->s);
            d->stop_index = (int)k;
        }
    }
    if (best != SIZE_MAX) {
        d->stopped = true;
        int rc = ls_buf_append(&d->out, x->s, best);
        x->n = 0;
        return rc;
    }
    size_t hold = 0;
    for (size_t k = 0; !final && k < d->n_stops; k++) {
        if (!d->stop_len[k])
            continue;
        size_t max = d->stop_len[k] - 1 < x->n ? d->stop_len[k] - 1 : x->n;
        for (size_t h = max; h > hold; h--)
            if (memcmp(x->s + x->n - h, d->stops[k], h) == 0) {
                hold = h;
                break;
            }
    }
    if (ls_buf_append(&d->out, x->s, x->n - hold) < 0)
        return -1;
    if (hold)
        memmove(x->s, x->s + x->n - hold, hold);
    x->n = hold;
    return 0;
}

ls_detok_t *ls_detok_new(const ls_tokenizer_t *t, unsigned flags, const char *const *stops,
                         const size_t *stop_lens, size_t nstops) {
    return ls_detok_new_added(t, NULL, flags, stops, stop_lens, nstops);
}

ls_detok_t *ls_detok_new_added(const ls_tokenizer_t *t, const ls_tok_added_t *a, unsigned flags,
                               const char *const *stops, const size_t *stop_lens, size_t nstops) {
    ls_detok_t *d = malloc(sizeof *d);
    if (!d)
        return NULL;
    s_init(d, t, a, flags);
    d->stops = calloc(nstops + 1, sizeof *d->stops);
    d->stop_len = calloc(nstops + 1, sizeof *d->stop_len);
    if (!d->stops || !d->stop_len)
        goto fail;
    // Every stop keeps its index (ls_detok_stop_index answers in the caller's numbering);
    // empty ones are kept too and never match.
    for (size_t i = 0; i < nstops; i++) {
        size_t n = !stops[i] ? 0 : stop_lens ? stop_lens[i] : strlen(stops[i]);
        if (!(d->stops[i] = malloc(n + 1)))
            goto fail;
        if (n)
            memcpy(d->stops[i], stops[i], n);
        d->stops[i][n] = 0;
        d->stop_len[i] = n;
        d->n_stops = i + 1;
    }
    if (ls_buf_append(&d->out, "", 0) < 0)
        goto fail;
    return d;
fail:
    ls_detok_destroy(&d);
    return NULL;
}

void ls_detok_destroy(ls_detok_t **dp) {
    if (!dp || !*dp)
        return;
    s_release(*dp);
    free(*dp);
    *dp = NULL;
}

int ls_detok_push(ls_detok_t *d, int32_t id, const char **piece, size_t *len) {
    d->out.n = 0;
    *piece = d->out.s;
    *len = 0;
    if (!s_known(d->t, d->a, id))
        return -1;
    if (d->stopped)
        return 0;
    int rc = s_feed(d, id) < 0 || s_stop_filter(d, false) < 0 ? -1 : 0;
    *piece = d->out.s;
    *len = d->out.n;
    return rc;
}

int ls_detok_finish(ls_detok_t *d, const char **piece, size_t *len) {
    d->out.n = 0;
    int rc = d->stopped || (s_flush_decoder(d) == 0 && s_stop_filter(d, true) == 0) ? 0 : -1;
    *piece = d->out.s;
    *len = d->out.n;
    return rc;
}

bool ls_detok_stopped(const ls_detok_t *d) {
    return d->stopped;
}

int ls_detok_stop_index(const ls_detok_t *d) {
    return d->stop_index;
}

char *ls_tokenizer_decode(const ls_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                          size_t *len, char *err, size_t errlen) {
    return ls_tokenizer_decode_added(t, NULL, ids, n, flags, len, err, errlen);
}

char *ls_tokenizer_decode_added(const ls_tokenizer_t *t, const ls_tok_added_t *a,
                                const int32_t *ids, size_t n, unsigned flags, size_t *len,
                                char *err, size_t errlen) {
    ls_detok_t d;
    s_init(&d, t, a, flags);
    for (size_t i = 0; i < n; i++) {
        if (!s_known(t, a, ids[i])) {
            ls_err_set(err, errlen, "%s: id %d (at %zu) is not in the vocabulary", t->what, ids[i], i);
            s_release(&d);
            return NULL;
        }
        if (s_feed(&d, ids[i]) < 0)
            goto oom;
    }
    if (s_flush_decoder(&d) < 0 || ls_buf_append(&d.text, "", 0) < 0)
        goto oom;
    char *s = d.text.s;
    if (len)
        *len = d.text.n;
    d.text.s = NULL;
    s_release(&d);
    return s;
oom:
    ls_err_set(err, errlen, "%s: out of memory while decoding", t->what);
    s_release(&d);
    return NULL;
}

// Every byte value once, for the one-byte texts of byte-fallback tokens.
static const unsigned char s_byte_values[256] = {
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
    27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76,
    77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100,
    101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120,
    121, 122, 123, 124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 138, 139, 140,
    141, 142, 143, 144, 145, 146, 147, 148, 149, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160,
    161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 173, 174, 175, 176, 177, 178, 179, 180,
    181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191, 192, 193, 194, 195, 196, 197, 198, 199, 200,
    201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220,
    221, 222, 223, 224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239, 240,
    241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255
};

const char *ls_tokenizer_token_bytes(const ls_tokenizer_t *t, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= ls_tokenizer_vocab_size(t) || t->id_special[id])
        return NULL;
    if (t->dec_mode == DEC_PIECES && t->dec_byte[id] >= 0) {
        *len = 1;
        return (const char *)&s_byte_values[t->dec_byte[id]];
    }
    *len = t->dec_len[id];
    return *len ? t->dec_arena.s + t->dec_off[id] : NULL;
}
