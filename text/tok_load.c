#define _GNU_SOURCE  // qsort_r
// tok_load: reads a tokenizer.json into an ls_tokenizer_t, refusing what it does not support.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"
#include "ls_file.h"
#include "tok_internal.h"

#define NO_TOKEN UINT32_MAX

// GPT-2's split, which ByteLevel applies itself when use_regex is true.
static const char *s_gpt2_regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

uint64_t tok_hash(const char *s, size_t n) {
    // FNV-1a: tokens are short, so a simple byte loop is as fast as anything here.
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int32_t tok_vocab_get(const ls_tokenizer_t *t, const char *s, size_t n) {
    const tok_strmap_t *m = &t->vocab;
    size_t i = (size_t)tok_hash(s, n) & m->mask;
    for (;;) {
        uint32_t v = m->slots[i];
        if (!v)
            return -1;
        int32_t id = (int32_t)(v - 1);
        if (m->key_len[id] == n && memcmp(t->arena.s + m->key_off[id], s, n) == 0)
            return id;
        i = (i + 1) & m->mask;
    }
}

int32_t tok_char_id(const ls_tokenizer_t *t, const char *s, size_t n) {
    if (n <= 2) {
        const unsigned char *p = (const unsigned char *)s;
        return t->small_cp_ids[ls_utf8_cp(p, (int)n)];
    }
    return tok_vocab_get(t, s, n);
}

// ---- helpers --------------------------------------------------------------------------

static size_t s_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

static const char *s_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool s_bool(const cJSON *o, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

// Whether v is a number holding a whole number in 0..max, checked in range before any
// conversion (a double past an integer type's range converts to nothing defined)
static bool s_whole(const cJSON *v, double max) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= max &&
           v->valuedouble == (double)(int64_t)v->valuedouble;
}

// The type of a component, or "" when it has none.
static const char *s_type(const cJSON *o) {
    const char *ty = s_str(o, "type");
    return ty ? ty : "";
}

uint32_t tok_byte_to_cp(unsigned b) {
    // GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
    // are moved to U+0100.. in byte order, so every byte is a visible character.
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256 + b;
    if (b <= 160)
        return b + 162;
    return 323;
}

static int s_cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp >= 256 && cp <= 288)
        return (int)(cp - 256);
    if (cp >= 289 && cp <= 322)
        return (int)(cp - 162);
    if (cp == 323)
        return 173;
    return -1;
}

static pcre2_code *s_regex(ls_tokenizer_t *t, const char *pat, size_t len, bool literal,
                           const char *where, char *err, size_t errlen) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        ls_err_set(err, errlen, "%s: %s pattern \"%s\" does not compile: %s (offset %zu)", t->what,
                   where, pat, (const char *)msg, (size_t)eo);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is absent
    return re;
}

// A pattern object {"String": s} or {"Regex": r}.
static pcre2_code *s_pattern(ls_tokenizer_t *t, const cJSON *p, const char *where, char *err,
                             size_t errlen) {
    const char *lit = s_str(p, "String"), *rx = s_str(p, "Regex");
    if (!lit && !rx) {
        ls_err_set(err, errlen, "%s: %s has no \"pattern\" with \"String\" or \"Regex\"", t->what,
                   where);
        return NULL;
    }
    return lit ? s_regex(t, lit, strlen(lit), true, where, err, errlen)
               : s_regex(t, rx, strlen(rx), false, where, err, errlen);
}

// Calls each member of a Sequence (under key), or the component itself when it is not one.
typedef int (*s_component_fn)(ls_tokenizer_t *t, const cJSON *c, char *err, size_t errlen);

static int s_each(ls_tokenizer_t *t, const cJSON *c, const char *key, s_component_fn fn, char *err,
                  size_t errlen) {
    if (strcmp(s_type(c), "Sequence") != 0)
        return fn(t, c, err, errlen);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!cJSON_IsArray(list)) {
        ls_err_set(err, errlen, "%s: Sequence without a \"%s\" list", t->what, key);
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        if (s_each(t, it, key, fn, err, errlen) < 0)
            return -1;
    }
    return 0;
}

static void *s_grow(void *p, size_t n, size_t size) {
    return realloc(p, (n + 1) * size);
}

// ---- model ----------------------------------------------------------------------------

static int s_set_token(ls_tokenizer_t *t, int32_t id, const char *s, size_t len) {
    if (t->arena.n + len + 1 > UINT32_MAX)
        return -1;
    t->id_off[id] = (uint32_t)t->arena.n;
    t->id_len[id] = (uint32_t)len;
    return ls_buf_append(&t->arena, s, len + 1);  // keep the NUL so id_to_token is a C string
}

static int s_vocab_insert(ls_tokenizer_t *t, int32_t id) {
    tok_strmap_t *m = &t->vocab;
    m->key_off[id] = t->id_off[id];
    m->key_len[id] = t->id_len[id];
    if (tok_vocab_get(t, t->arena.s + m->key_off[id], m->key_len[id]) >= 0)
        return -1;
    size_t i = (size_t)tok_hash(t->arena.s + m->key_off[id], m->key_len[id]) & m->mask;
    while (m->slots[i])
        i = (i + 1) & m->mask;
    m->slots[i] = (uint32_t)id + 1;
    return 0;
}

static void s_merge_put(tok_mergemap_t *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 17) & m->mask;
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key)
        i = (i + 1) & m->mask;
    // A repeated pair keeps its last rank, as HF's HashMap collect does.
    m->keys[i] = key;
    m->vals[i] = ((uint64_t)rank << 32) | (uint32_t)id;
}

static int s_load_merges(ls_tokenizer_t *t, const cJSON *merges, char *err, size_t errlen) {
    size_t n = (size_t)cJSON_GetArraySize(merges);
    tok_mergemap_t *m = &t->merges;
    m->mask = s_pow2_at_least(n * 2 + 1) - 1;
    m->keys = malloc((m->mask + 1) * sizeof *m->keys);
    m->vals = malloc((m->mask + 1) * sizeof *m->vals);
    if (!m->keys || !m->vals) {
        ls_err_set(err, errlen, "%s: out of memory for %zu merges", t->what, n);
        return -1;
    }
    memset(m->keys, 0xFF, (m->mask + 1) * sizeof *m->keys);
    ls_buf_t joined = {0};
    uint32_t rank = 0;
    const cJSON *it;
    int rc = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a = NULL, *b = NULL;
        size_t alen = 0, blen = 0;
        if (cJSON_IsString(it)) {
            const char *sp = strchr(it->valuestring, ' ');
            if (sp) {
                a = it->valuestring;
                alen = (size_t)(sp - a);
                b = sp + 1;
                blen = strlen(b);
            }
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 &&
                   cJSON_IsString(it->child) && cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            alen = strlen(a);
            b = it->child->next->valuestring;
            blen = strlen(b);
        }
        if (!a) {
            ls_err_set(err, errlen, "%s: merge %u is neither \"a b\" nor [a, b]", t->what, rank);
            rc = -1;
            break;
        }
        int32_t ia = tok_vocab_get(t, a, alen), ib = tok_vocab_get(t, b, blen);
        joined.n = 0;
        if (ls_buf_append(&joined, a, alen) < 0 || ls_buf_append(&joined, b, blen) < 0) {
            ls_err_set(err, errlen, "%s: out of memory", t->what);
            rc = -1;
            break;
        }
        int32_t ij = tok_vocab_get(t, joined.s, joined.n);
        if (ia < 0 || ib < 0 || ij < 0) {
            ls_err_set(err, errlen, "%s: merge %u (\"%.*s\" + \"%.*s\"): \"%s\" is not in the vocabulary",
                       t->what, rank, (int)alen, a, (int)blen, b,
                       ia < 0 ? "left part" : ib < 0 ? "right part" : "merged token");
            rc = -1;
            break;
        }
        s_merge_put(m, ia, ib, rank++, ij);
    }
    ls_buf_free(&joined);
    return rc;
}

static int s_load_model(ls_tokenizer_t *t, const cJSON *model, const cJSON *added, char *err,
                        size_t errlen) {
    const char *type = s_str(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    // Files from before "type" existed are BPE when they have merges.
    if (type ? strcmp(type, "BPE") != 0 : !merges) {
        ls_err_set(err, errlen, "%s: model type \"%s\" is not supported (only BPE)", t->what,
                   type ? type : "(none)");
        return -1;
    }
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        ls_err_set(err, errlen, "%s: BPE model needs a \"vocab\" object and a \"merges\" list", t->what);
        return -1;
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0.0) {
        ls_err_set(err, errlen, "%s: BPE dropout is not supported (encode would be random)", t->what);
        return -1;
    }
    const char *pfx = s_str(model, "continuing_subword_prefix"), *sfx = s_str(model, "end_of_word_suffix");
    if ((pfx && *pfx) || (sfx && *sfx)) {
        ls_err_set(err, errlen, "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported",
                   t->what);
        return -1;
    }
    t->byte_fallback = s_bool(model, "byte_fallback", false);
    t->fuse_unk = s_bool(model, "fuse_unk", false);
    t->ignore_merges = s_bool(model, "ignore_merges", false);

    // Ids first, so the tables can be sized. Added tokens get their ids from HF's rule (see
    // s_load_added), which never goes past max(highest vocab id + 1, vocab entries) + their count.
    int64_t max_id = -1;
    size_t n_vocab = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        if (!s_whole(it, INT32_MAX / 2)) {
            ls_err_set(err, errlen, "%s: vocab entry \"%s\" has no valid id", t->what, it->string);
            return -1;
        }
        if ((int64_t)it->valuedouble > max_id)
            max_id = (int64_t)it->valuedouble;
        n_vocab++;
    }
    cJSON_ArrayForEach(it, added) {
        if (!s_str(it, "content")) {
            ls_err_set(err, errlen, "%s: added_tokens entry without a \"content\"", t->what);
            return -1;
        }
    }
    if (max_id < 0) {
        ls_err_set(err, errlen, "%s: the vocabulary is empty", t->what);
        return -1;
    }
    // Ids past every vocab entry would make the id tables huge; real files are dense.
    if (max_id > (int64_t)n_vocab * 4 + 1024) {
        ls_err_set(err, errlen, "%s: ids are too sparse (highest %lld for %zu entries)", t->what,
                   (long long)max_id, n_vocab);
        return -1;
    }
    t->n_model = (size_t)max_id + 1 > n_vocab ? (size_t)max_id + 1 : n_vocab;
    t->n_ids = (int32_t)(t->n_model + (size_t)cJSON_GetArraySize(added));
    size_t n = (size_t)t->n_ids;
    t->id_off = malloc(n * sizeof *t->id_off);
    t->id_len = calloc(n, sizeof *t->id_len);
    t->id_special = calloc(n, 1);
    t->vocab.mask = s_pow2_at_least(n_vocab * 2 + 1) - 1;
    t->vocab.slots = calloc(t->vocab.mask + 1, sizeof *t->vocab.slots);
    t->vocab.key_off = malloc(n * sizeof *t->vocab.key_off);
    t->vocab.key_len = calloc(n, sizeof *t->vocab.key_len);
    t->small_cp_ids = malloc(0x800 * sizeof *t->small_cp_ids);
    if (!t->id_off || !t->id_len || !t->id_special || !t->vocab.slots || !t->vocab.key_off ||
        !t->vocab.key_len || !t->small_cp_ids) {
        ls_err_set(err, errlen, "%s: out of memory for %zu ids", t->what, n);
        return -1;
    }
    memset(t->id_off, 0xFF, n * sizeof *t->id_off);
    memset(t->vocab.key_off, 0xFF, n * sizeof *t->vocab.key_off);
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = (int32_t)it->valuedouble;
        if (t->id_off[id] != NO_TOKEN) {
            ls_err_set(err, errlen, "%s: id %d is given to two vocab entries", t->what, id);
            return -1;
        }
        t->n_vocab_entries++;
        if (s_set_token(t, id, it->string, strlen(it->string)) < 0 || s_vocab_insert(t, id) < 0) {
            ls_err_set(err, errlen, "%s: vocab entry \"%s\" is repeated", t->what, it->string);
            return -1;
        }
    }
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char u[4];
        t->small_cp_ids[cp] = tok_vocab_get(t, u, (size_t)ls_utf8_put(u, cp));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = tok_vocab_get(t, name, 6);
    }
    const char *unk = s_str(model, "unk_token");
    t->unk_id = -1;
    if (unk && (t->unk_id = tok_vocab_get(t, unk, strlen(unk))) < 0) {
        ls_err_set(err, errlen, "%s: unk_token \"%s\" is not in the vocabulary", t->what, unk);
        return -1;
    }
    return s_load_merges(t, merges, err, errlen);
}

// ---- added tokens -----------------------------------------------------------------------

typedef struct {
    const tok_added_t *added;
    const char *arena;
} s_added_ctx_t;

static int s_added_cmp(const void *a, const void *b, void *ctx) {
    const s_added_ctx_t *c = ctx;
    const tok_added_t *x = &c->added[*(const uint32_t *)a];
    const tok_added_t *y = &c->added[*(const uint32_t *)b];
    unsigned char fx = (unsigned char)c->arena[x->match_off], fy = (unsigned char)c->arena[y->match_off];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->match_len != y->match_len)
        return x->match_len > y->match_len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int tok_added_set_build(tok_added_set_t *set, const tok_added_t *added, size_t n, const char *arena,
                        bool normalized) {
    set->order = malloc((n + 1) * sizeof *set->order);
    if (!set->order)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (added[i].normalized == normalized && added[i].match_len > 0)
            set->order[k++] = (uint32_t)i;
    s_added_ctx_t ctx = {added, arena};
    qsort_r(set->order, k, sizeof *set->order, s_added_cmp, &ctx);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < k && b < 256 && (unsigned char)arena[added[set->order[j]].match_off] < b)
            j++;
        set->start[b] = (uint32_t)(b == 256 ? k : j);
    }
    return 0;
}

static int s_load_added(ls_tokenizer_t *t, const cJSON *added, char *err, size_t errlen) {
    size_t n = (size_t)cJSON_GetArraySize(added);
    t->added = calloc(n + 1, sizeof *t->added);
    if (!t->added) {
        ls_err_set(err, errlen, "%s: out of memory", t->what);
        return -1;
    }
    // HF (AddedVocabulary::add_tokens) ignores the file's ids: a token whose content is already
    // added or in the model vocab takes that id, an empty or repeated one is dropped, any other
    // takes max(vocab entries - 1, highest added id) + 1. For real files this is the same id.
    int32_t next = (int32_t)t->n_vocab_entries;
    int32_t max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const char *content = s_str(it, "content");
        size_t len = strlen(content);
        bool repeated = len == 0;
        for (size_t i = 0; i < t->n_added && !repeated; i++)
            repeated = t->added[i].len == len && memcmp(t->arena.s + t->added[i].off, content, len) == 0;
        if (repeated)
            continue;
        tok_added_t *a = &t->added[t->n_added++];
        a->id = tok_vocab_get(t, content, len);
        if (a->id < 0)
            a->id = next++;
        if (a->id > max_id)
            max_id = a->id;
        if (max_id >= next)
            next = max_id + 1;
        a->single_word = s_bool(it, "single_word", false);
        a->lstrip = s_bool(it, "lstrip", false);
        a->rstrip = s_bool(it, "rstrip", false);
        a->special = s_bool(it, "special", false);
        // HF's default: special tokens are matched on the raw text, others after normalization.
        a->normalized = s_bool(it, "normalized", !a->special);
        // The id decodes as this text (HF looks added tokens up first); the model vocab keeps
        // its own key for the id.
        if (s_set_token(t, a->id, content, strlen(content)) < 0) {
            ls_err_set(err, errlen, "%s: out of memory", t->what);
            return -1;
        }
        a->off = a->match_off = t->id_off[a->id];
        a->len = a->match_len = t->id_len[a->id];
        t->id_special[a->id] = a->special;
    }
    for (int32_t id = t->n_ids - 1; id >= 0 && t->id_off[id] == NO_TOKEN && id >= (int32_t)t->n_model; id--)
        t->n_ids = id;  // the tables were sized for the worst case
    return 0;
}

// The matching tables, once the normalizer is known: HF matches a normalized added token by
// its normalized content (so Prepend("▁") turns "hi" into "▁hi").
static int s_added_match_tables(ls_tokenizer_t *t, char *err, size_t errlen) {
    for (size_t i = 0; i < t->n_added; i++) {
        tok_added_t *a = &t->added[i];
        const char *ns;
        size_t nn;
        if (!a->normalized || t->n_norms == 0)
            continue;
        if (!ls_utf8_valid(t->arena.s + a->off, a->len) ||
            tok_normalize(t, t->arena.s + a->off, a->len, &ns, &nn) < 0) {
            ls_err_set(err, errlen, "%s: added token %d cannot be normalized", t->what, a->id);
            return -1;
        }
        a->match_off = (uint32_t)t->arena.n;
        a->match_len = (uint32_t)nn;
        if (ls_buf_append(&t->arena, ns, nn + 1) < 0 || t->arena.n > UINT32_MAX)
            goto oom;
    }
    if (tok_added_set_build(&t->added_raw, t->added, t->n_added, t->arena.s, false) < 0 ||
        tok_added_set_build(&t->added_norm, t->added, t->n_added, t->arena.s, true) < 0)
        goto oom;
    return 0;
oom:
    ls_err_set(err, errlen, "%s: out of memory", t->what);
    return -1;
}

// ---- normalizer -------------------------------------------------------------------------

static tok_norm_t *s_new_norm(ls_tokenizer_t *t, tok_norm_kind_t kind) {
    tok_norm_t *n = s_grow(t->norms, t->n_norms, sizeof *t->norms);
    if (!n)
        return NULL;
    t->norms = n;
    n = &t->norms[t->n_norms++];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    return n;
}

static int s_norm_one(ls_tokenizer_t *t, const cJSON *c, char *err, size_t errlen) {
    static const struct {
        const char *name;
        tok_norm_kind_t kind;
    } kinds[] = {{"NFC", NORM_NFC},         {"NFD", NORM_NFD},       {"NFKC", NORM_NFKC},
                 {"NFKD", NORM_NFKD},       {"Lowercase", NORM_LOWERCASE}, {"Strip", NORM_STRIP},
                 {"Prepend", NORM_PREPEND}, {"Replace", NORM_REPLACE}};
    const char *type = s_type(c);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (strcmp(type, kinds[i].name) != 0)
            continue;
        tok_norm_t *n = s_new_norm(t, kinds[i].kind);
        if (!n) {
            ls_err_set(err, errlen, "%s: out of memory", t->what);
            return -1;
        }
        n->left = s_bool(c, "strip_left", false);
        n->right = s_bool(c, "strip_right", false);
        const char *content = s_str(c, n->kind == NORM_PREPEND ? "prepend" : "content");
        if (n->kind == NORM_PREPEND || n->kind == NORM_REPLACE) {
            if (!content || !(n->content = strdup(content))) {
                ls_err_set(err, errlen, "%s: normalizer %s without its text", t->what, type);
                return -1;
            }
            n->content_len = strlen(content);
        }
        if (n->kind == NORM_REPLACE &&
            !(n->re = s_pattern(t, cJSON_GetObjectItemCaseSensitive(c, "pattern"), "normalizer Replace",
                                err, errlen)))
            return -1;
        return 0;
    }
    ls_err_set(err, errlen, "%s: normalizer \"%s\" is not supported", t->what, type);
    return -1;
}

// ---- pre-tokenizer ----------------------------------------------------------------------

static tok_pt_t *s_new_pt(ls_tokenizer_t *t, tok_pt_kind_t kind) {
    tok_pt_t *p = s_grow(t->pts, t->n_pts, sizeof *t->pts);
    if (!p)
        return NULL;
    t->pts = p;
    p = &t->pts[t->n_pts++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    return p;
}

// Metaspace's replacement and prepend scheme, shared by the pre-tokenizer and the decoder.
static int s_metaspace(ls_tokenizer_t *t, const cJSON *c, char repl[4], int *repl_len,
                       tok_prepend_t *prepend, char *err, size_t errlen) {
    const char *r = s_str(c, "replacement");
    size_t bad;
    if (!r || !*r || (*repl_len = ls_utf8_seq((const unsigned char *)r, strlen(r), &bad)) <= 0 ||
        r[*repl_len] != '\0') {
        ls_err_set(err, errlen, "%s: Metaspace needs a one-character \"replacement\"", t->what);
        return -1;
    }
    memcpy(repl, r, (size_t)*repl_len);
    const char *scheme = s_str(c, "prepend_scheme");
    if (!scheme)  // files from before prepend_scheme
        *prepend = s_bool(c, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    else if (strcmp(scheme, "always") == 0)
        *prepend = PREPEND_ALWAYS;
    else if (strcmp(scheme, "first") == 0)
        *prepend = PREPEND_FIRST;
    else if (strcmp(scheme, "never") == 0)
        *prepend = PREPEND_NEVER;
    else {
        ls_err_set(err, errlen, "%s: Metaspace prepend_scheme \"%s\" is not supported", t->what, scheme);
        return -1;
    }
    return 0;
}

static int s_pt_one(ls_tokenizer_t *t, const cJSON *c, char *err, size_t errlen) {
    const char *type = s_type(c);
    tok_pt_t *p;
    if (strcmp(type, "Split") == 0) {
        static const char *behaviors[] = {"Removed", "Isolated", "MergedWithPrevious",
                                          "MergedWithNext", "Contiguous"};
        const char *b = s_str(c, "behavior");
        int k = -1;
        for (int i = 0; b && i < 5; i++)
            if (strcmp(b, behaviors[i]) == 0)
                k = i;
        if (k < 0) {
            ls_err_set(err, errlen, "%s: Split behavior \"%s\" is not supported", t->what, b ? b : "(none)");
            return -1;
        }
        if (!(p = s_new_pt(t, PT_SPLIT)))
            goto oom;
        p->behavior = (tok_split_behavior_t)k;
        p->invert = s_bool(c, "invert", false);
        return (p->re = s_pattern(t, cJSON_GetObjectItemCaseSensitive(c, "pattern"), "pre_tokenizer Split",
                                  err, errlen))
                   ? 0
                   : -1;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        if (!(p = s_new_pt(t, PT_BYTE_LEVEL)))
            goto oom;
        p->add_prefix_space = s_bool(c, "add_prefix_space", true);
        if (s_bool(c, "use_regex", true) &&
            !(p->re = s_regex(t, s_gpt2_regex, strlen(s_gpt2_regex), false, "ByteLevel", err, errlen)))
            return -1;
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        if (!(p = s_new_pt(t, PT_METASPACE)))
            goto oom;
        p->split = s_bool(c, "split", true);
        return s_metaspace(t, c, p->repl, &p->repl_len, &p->prepend, err, errlen);
    }
    ls_err_set(err, errlen, "%s: pre_tokenizer \"%s\" is not supported", t->what, type);
    return -1;
oom:
    ls_err_set(err, errlen, "%s: out of memory", t->what);
    return -1;
}

// ---- post-processor ---------------------------------------------------------------------

static int s_ids_append(int32_t **v, size_t *n, int32_t id) {
    int32_t *p = s_grow(*v, *n, sizeof **v);
    if (!p)
        return -1;
    *v = p;
    p[(*n)++] = id;
    return 0;
}

static int s_post_one(ls_tokenizer_t *t, const cJSON *c, char *err, size_t errlen) {
    const char *type = s_type(c);
    if (strcmp(type, "ByteLevel") == 0)
        return 0;  // only adjusts offsets
    if (strcmp(type, "TemplateProcessing") != 0) {
        ls_err_set(err, errlen, "%s: post_processor \"%s\" is not supported", t->what, type);
        return -1;
    }
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(c, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(c, "special_tokens");
    bool after = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = s_str(sp, "id");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name ? name : ""), "ids");
        if (!name || !cJSON_IsArray(ids)) {
            ls_err_set(err, errlen, "%s: TemplateProcessing names special token \"%s\" it does not define",
                       t->what, name ? name : "(none)");
            return -1;
        }
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) {
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= t->n_ids) {
                ls_err_set(err, errlen, "%s: TemplateProcessing token \"%s\" has an id outside the vocabulary",
                           t->what, name);
                return -1;
            }
            if ((after ? s_ids_append(&t->suffix_ids, &t->n_suffix, (int32_t)id->valuedouble)
                       : s_ids_append(&t->prefix_ids, &t->n_prefix, (int32_t)id->valuedouble)) < 0) {
                ls_err_set(err, errlen, "%s: out of memory", t->what);
                return -1;
            }
        }
    }
    return 0;
}

// ---- decoder ----------------------------------------------------------------------------

// Decoder stages must come in this order (see tokenizer.h); each member moves the phase on.
enum { PHASE_TOKENS, PHASE_BYTE_FALLBACK, PHASE_FUSED, PHASE_STRIPPED, PHASE_BYTE_LEVEL };

static int s_dec_one(ls_tokenizer_t *t, const cJSON *c, char *err, size_t errlen) {
    const char *type = s_type(c);
    int phase = t->dec_phase;
    if (strcmp(type, "ByteLevel") == 0 && phase == PHASE_TOKENS && t->n_dec_steps == 0) {
        t->dec_mode = DEC_BYTE_LEVEL;
        t->dec_phase = PHASE_BYTE_LEVEL;
        return 0;
    }
    if ((strcmp(type, "Replace") == 0 || strcmp(type, "Metaspace") == 0) && phase == PHASE_TOKENS) {
        tok_dec_step_t *s = s_grow(t->dec_steps, t->n_dec_steps, sizeof *t->dec_steps);
        if (!s)
            goto oom;
        t->dec_steps = s;
        s = &t->dec_steps[t->n_dec_steps++];
        memset(s, 0, sizeof *s);
        if (type[0] == 'M') {
            char repl[4];
            int rl;
            tok_prepend_t prepend;
            if (s_metaspace(t, c, repl, &rl, &prepend, err, errlen) < 0)
                return -1;
            s->metaspace = true;
            s->pattern_len = (size_t)rl;
            if (!(s->pattern = strndup(repl, (size_t)rl)))
                goto oom;
            t->dec_metaspace_first = t->dec_metaspace_first || prepend != PREPEND_NEVER;
            return 0;
        }
        const char *pat = s_str(cJSON_GetObjectItemCaseSensitive(c, "pattern"), "String");
        const char *content = s_str(c, "content");
        if (!pat || !*pat || !content) {
            ls_err_set(err, errlen, "%s: decoder Replace is supported with a String pattern only", t->what);
            return -1;
        }
        s->pattern_len = strlen(pat);
        s->content_len = strlen(content);
        if (!(s->pattern = strdup(pat)) || !(s->content = strdup(content)))
            goto oom;
        return 0;
    }
    if (strcmp(type, "ByteFallback") == 0 && phase == PHASE_TOKENS) {
        t->dec_byte_fallback = true;
        t->dec_phase = PHASE_BYTE_FALLBACK;
        return 0;
    }
    if (strcmp(type, "Fuse") == 0 && phase <= PHASE_BYTE_FALLBACK) {
        t->dec_phase = PHASE_FUSED;
        return 0;
    }
    if (strcmp(type, "Strip") == 0 && phase == PHASE_FUSED) {
        const char *content = s_str(c, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(c, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(c, "stop");
        size_t bad;
        int k = content && *content ? ls_utf8_seq((const unsigned char *)content, strlen(content), &bad) : 0;
        if (k <= 0 || content[k] || !s_whole(start, INT32_MAX) ||
            (cJSON_IsNumber(stop) && stop->valuedouble != 0)) {
            ls_err_set(err, errlen,
                       "%s: decoder Strip is supported for one character at the start only, a whole number "
                       "0..%d of times", t->what, INT32_MAX);
            return -1;
        }
        t->dec_strip_cp = ls_utf8_cp((const unsigned char *)content, k);
        t->dec_strip_start = (int)start->valuedouble;
        t->dec_phase = PHASE_STRIPPED;
        return 0;
    }
    ls_err_set(err, errlen,
               "%s: decoder \"%s\" is not supported at this place (supported: ByteLevel alone, or "
               "Replace/Metaspace, ByteFallback, Fuse, Strip in that order)", t->what, type);
    return -1;
oom:
    ls_err_set(err, errlen, "%s: out of memory", t->what);
    return -1;
}

int tok_dec_token_text(const ls_tokenizer_t *t, int32_t id, bool first, ls_buf_t *out) {
    return tok_dec_text(t, t->arena.s + t->id_off[id], t->id_len[id], first, out);
}

int tok_dec_text(const ls_tokenizer_t *t, const char *s, size_t n, bool first, ls_buf_t *out) {
    out->n = 0;
    if (t->dec_mode == DEC_BYTE_LEVEL) {
        // A token with a character outside the byte alphabet (an added token) is its own text.
        for (size_t i = 0; i < n;) {
            size_t bad;
            int k = ls_utf8_seq((const unsigned char *)s + i, n - i, &bad);
            int b = k > 0 ? s_cp_to_byte(ls_utf8_cp((const unsigned char *)s + i, k)) : -1;
            if (b < 0) {
                out->n = 0;
                return ls_buf_append(out, s, n);
            }
            char c = (char)b;
            if (ls_buf_append(out, &c, 1) < 0)
                return -1;
            i += (size_t)k;
        }
        return ls_buf_append(out, "", 0);
    }
    if (ls_buf_append(out, s, n) < 0)
        return -1;
    ls_buf_t tmp = {0};
    for (size_t k = 0; k < t->n_dec_steps; k++) {
        const tok_dec_step_t *st = &t->dec_steps[k];
        const char *with = st->metaspace ? (first ? "" : " ") : st->content;
        size_t with_len = st->metaspace ? (first ? 0 : 1) : st->content_len;
        tmp.n = 0;
        if (ls_buf_append(&tmp, "", 0) < 0)
            goto oom;
        for (size_t i = 0; i < out->n;) {
            if (out->n - i >= st->pattern_len && memcmp(out->s + i, st->pattern, st->pattern_len) == 0) {
                if (ls_buf_append(&tmp, with, with_len) < 0)
                    goto oom;
                i += st->pattern_len;
            } else {
                if (ls_buf_append(&tmp, out->s + i, 1) < 0)
                    goto oom;
                i++;
            }
        }
        ls_buf_t swap = *out;
        *out = tmp;
        tmp = swap;
    }
    ls_buf_free(&tmp);
    return 0;
oom:
    ls_buf_free(&tmp);
    return -1;
}

static int s_dec_tables(ls_tokenizer_t *t, char *err, size_t errlen) {
    size_t n = (size_t)t->n_ids;
    t->dec_off = malloc(n * sizeof *t->dec_off);
    t->dec_len = calloc(n, sizeof *t->dec_len);
    t->dec_byte = malloc(n * sizeof *t->dec_byte);
    ls_buf_t one = {0};
    if (!t->dec_off || !t->dec_len || !t->dec_byte)
        goto oom;
    for (size_t id = 0; id < n; id++) {
        t->dec_byte[id] = -1;
        t->dec_off[id] = (uint32_t)t->dec_arena.n;
        if (t->id_off[id] == NO_TOKEN)
            continue;
        const char *s = t->arena.s + t->id_off[id];
        unsigned hi, lo;
        // HF's ByteFallback: exactly "<0xHH>" with two hex digits.
        if (t->dec_byte_fallback && t->id_len[id] == 6 && strncmp(s, "<0x", 3) == 0 && s[5] == '>' &&
            sscanf(s + 3, "%1x%1x", &hi, &lo) == 2)
            t->dec_byte[id] = (int16_t)(hi * 16 + lo);
        if (tok_dec_token_text(t, (int32_t)id, false, &one) < 0 ||
            ls_buf_append(&t->dec_arena, one.s, one.n) < 0 || t->dec_arena.n > UINT32_MAX)
            goto oom;
        t->dec_len[id] = (uint32_t)one.n;
    }
    ls_buf_free(&one);
    return 0;
oom:
    ls_buf_free(&one);
    ls_err_set(err, errlen, "%s: out of memory", t->what);
    return -1;
}

// ---- load -------------------------------------------------------------------------------

static int s_load(ls_tokenizer_t *t, const cJSON *root, char *err, size_t errlen) {
    if (!cJSON_IsObject(root)) {
        ls_err_set(err, errlen, "%s: not a JSON object", t->what);
        return -1;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) {
        ls_err_set(err, errlen, "%s: no \"model\" object", t->what);
        return -1;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (added && !cJSON_IsArray(added) && !cJSON_IsNull(added)) {
        ls_err_set(err, errlen, "%s: \"added_tokens\" is not a list", t->what);
        return -1;
    }
    if (s_load_model(t, model, added, err, errlen) < 0 || s_load_added(t, added, err, errlen) < 0)
        return -1;
    static const struct {
        const char *key, *list;
        s_component_fn fn;
    } parts[] = {{"normalizer", "normalizers", s_norm_one},
                 {"pre_tokenizer", "pretokenizers", s_pt_one},
                 {"post_processor", "processors", s_post_one}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, parts[i].key);
        if (c && !cJSON_IsNull(c) && s_each(t, c, parts[i].list, parts[i].fn, err, errlen) < 0)
            return -1;
    }
    t->pt_bufs = calloc(2 * t->n_pts + 1, sizeof *t->pt_bufs);
    t->md = pcre2_match_data_create(1, NULL);
    if (!t->md || !t->pt_bufs) {
        ls_err_set(err, errlen, "%s: out of memory", t->what);
        return -1;
    }
    if (s_added_match_tables(t, err, errlen) < 0)
        return -1;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!cJSON_IsObject(dec)) {
        ls_err_set(err, errlen, "%s: no \"decoder\" (decoding would join tokens with spaces; not supported)",
                   t->what);
        return -1;
    }
    t->dec_mode = DEC_PIECES;
    t->dec_phase = PHASE_TOKENS;
    return s_each(t, dec, "decoders", s_dec_one, err, errlen) < 0 ? -1 : s_dec_tables(t, err, errlen);
}

ls_tokenizer_t *ls_tokenizer_parse(const char *json, size_t len, const char *what, char *err,
                                   size_t errlen) {
    ls_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t) {
        ls_err_set(err, errlen, "%s: out of memory", what);
        return NULL;
    }
    snprintf(t->what, sizeof t->what, "%s", what);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        ls_err_set(err, errlen, "%s: not valid JSON (near byte %td)", what,
                   at && at >= json && at <= json + len ? at - json : (ptrdiff_t)0);
        ls_tokenizer_destroy(&t);
        return NULL;
    }
    int rc = s_load(t, root, err, errlen);
    cJSON_Delete(root);
    if (rc < 0)
        ls_tokenizer_destroy(&t);
    return t;
}

ls_tokenizer_t *ls_tokenizer_load(const char *path, char *err, size_t errlen) {
    size_t len;
    char *text = ls_file_read_path(path, LS_FILE_TOKENIZER, &len, err, errlen);
    if (!text)
        return NULL;
    ls_tokenizer_t *t = ls_tokenizer_parse(text, len, path, err, errlen);
    free(text);
    return t;
}

void ls_tokenizer_destroy(ls_tokenizer_t **tp) {
    if (!tp || !*tp)
        return;
    ls_tokenizer_t *t = *tp;
    ls_buf_free(&t->arena);
    free(t->id_off);
    free(t->id_len);
    free(t->id_special);
    free(t->vocab.slots);
    free(t->vocab.key_off);
    free(t->vocab.key_len);
    free(t->merges.keys);
    free(t->merges.vals);
    free(t->small_cp_ids);
    free(t->added);
    free(t->added_raw.order);
    free(t->added_norm.order);
    for (size_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].content);
        pcre2_code_free(t->norms[i].re);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pts; i++)
        pcre2_code_free(t->pts[i].re);
    free(t->pts);
    pcre2_match_data_free(t->md);
    free(t->prefix_ids);
    free(t->suffix_ids);
    for (size_t i = 0; i < t->n_dec_steps; i++) {
        free(t->dec_steps[i].pattern);
        free(t->dec_steps[i].content);
    }
    free(t->dec_steps);
    ls_buf_free(&t->dec_arena);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec_byte);
    free(t->cache.entries);
    ls_buf_free(&t->cache.keys);
    free(t->cache.ids);
    free(t->syms);
    free(t->heap);
    for (int i = 0; i < 2; i++)
        ls_buf_free(&t->norm_bufs[i]);
    for (size_t i = 0; t->pt_bufs && i < 2 * t->n_pts; i++)
        ls_buf_free(&t->pt_bufs[i]);
    free(t->pt_bufs);
    free(t);
    *tp = NULL;
}

int32_t ls_tokenizer_vocab_size(const ls_tokenizer_t *t) {
    return t->n_ids;
}

int32_t ls_tokenizer_token_to_id(const ls_tokenizer_t *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->arena.s + t->added[i].off, token, n) == 0)
            return t->added[i].id;
    return tok_vocab_get(t, token, n);
}

const char *ls_tokenizer_id_to_token(const ls_tokenizer_t *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || t->id_off[id] == NO_TOKEN)
        return NULL;
    return t->arena.s + t->id_off[id];
}

bool ls_tokenizer_is_special(const ls_tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->id_special[id];
}

const int32_t *ls_tokenizer_prefix_ids(const ls_tokenizer_t *t, size_t *n) {
    *n = t->n_prefix;
    return t->prefix_ids;
}

const int32_t *ls_tokenizer_suffix_ids(const ls_tokenizer_t *t, size_t *n) {
    *n = t->n_suffix;
    return t->suffix_ids;
}

void ls_token_ids_free(ls_token_ids_t *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}
