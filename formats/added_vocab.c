// added_vocab: see added_vocab.h.
#include "added_vocab.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ls_err.h"
#include "ls_file.h"

void ls_added_vocab_free(ls_added_vocab_t *v)
{
    if (!v)
        return;
    for (int i = 0; v->tokens && i < v->n; i++)
        free(v->tokens[i].content);
    free(v->tokens);
    v->tokens = NULL;
    v->n = 0;
}

// Well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF) without NUL.
static bool s_utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (c == 0 || k == 0 || i + k > n)
            return false;
        uint32_t cp = k == 1 ? c : c & (0x7Fu >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3Fu);
        }
        static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k;
    }
    return true;
}

static bool s_flag(const cJSON *o, const char *key, bool def)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : def;
}

// Appends one token (content of len bytes, id) to v after checking it; file names the source.
static int s_add(ls_added_vocab_t *v, const char *file, const char *content, int32_t id,
                 bool special, bool single_word, bool lstrip, bool rstrip, bool normalized,
                 char *err, size_t errlen)
{
    size_t len = strlen(content);
    if (len == 0 || len > LS_ADDED_TOKEN_MAX_BYTES || !s_utf8_ok((const unsigned char *)content, len)) {
        ls_err_set(err, errlen, "%s: added token %d is empty, longer than %d bytes or not valid "
                   "UTF-8", file, (int)id, LS_ADDED_TOKEN_MAX_BYTES);
        return -1;
    }
    if (v->n >= LS_ADDED_VOCAB_MAX) {
        ls_err_set(err, errlen, "%s: more than %d added tokens", file, LS_ADDED_VOCAB_MAX);
        return -1;
    }
    if (!(v->n & (v->n - 1))) {  // grows at powers of two
        ls_added_token_t *t = realloc(v->tokens, (size_t)(v->n ? 2 * v->n : 1) * sizeof *t);
        if (!t) {
            ls_err_set(err, errlen, "%s: out of memory", file);
            return -1;
        }
        v->tokens = t;
    }
    char *c = strdup(content);
    if (!c) {
        ls_err_set(err, errlen, "%s: out of memory", file);
        return -1;
    }
    v->tokens[v->n++] = (ls_added_token_t){id, c, special, single_word, lstrip, rstrip, normalized};
    return 0;
}

// An id at or past vocab_size from a JSON number; -1 for one below it (the base's own); -2
// for anything that is not a non-negative integer id.
static int64_t s_id(const cJSON *j, int32_t vocab_size)
{
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble) || j->valuedouble < 0 ||
        j->valuedouble != floor(j->valuedouble) || j->valuedouble > INT32_MAX)
        return -2;
    return j->valuedouble < vocab_size ? -1 : (int64_t)j->valuedouble;
}

// dir/name parsed into *root (NULL when not JSON) and its path into file: 1, or 0 when the
// file does not exist, -1 + err when it cannot be read.
static int s_parse(const char *dir, const char *name, ls_file_kind_t kind, cJSON **root,
                   char file[4096], char *err, size_t errlen)
{
    size_t len;
    char *text = ls_file_read(dir, name, kind, &len, err, errlen);
    if (!text)
        return errno == ENOENT ? 0 : -1;
    snprintf(file, 4096, "%s/%s", dir, name);
    *root = cJSON_ParseWithLength(text, len);
    free(text);
    return 1;
}

// tokenizer.json's added_tokens past vocab_size. 1 when the file exists, 0 when not, -1.
static int s_read_tokenizer(const char *dir, int32_t vocab_size, ls_added_vocab_t *v, char *err,
                            size_t errlen)
{
    char file[4096];
    cJSON *root = NULL;
    int rc = s_parse(dir, "tokenizer.json", LS_FILE_TOKENIZER, &root, file, err, errlen);
    if (rc <= 0)
        return rc;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(root) || (added && !cJSON_IsArray(added) && !cJSON_IsNull(added))) {
        ls_err_set(err, errlen, "%s: not a JSON object with an \"added_tokens\" list", file);
        rc = -1;
    }
    const cJSON *it, *list = rc > 0 ? added : NULL;
    cJSON_ArrayForEach(it, list) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        int64_t id = s_id(cJSON_GetObjectItemCaseSensitive(it, "id"), vocab_size);
        if (!cJSON_IsString(c) || id == -2) {
            ls_err_set(err, errlen, "%s: an added_tokens entry without a string \"content\" and "
                       "a non-negative integer \"id\"", file);
            rc = -1;
            break;
        }
        if (id >= 0 &&
            s_add(v, file, c->valuestring, (int32_t)id, s_flag(it, "special", false),
                  s_flag(it, "single_word", false), s_flag(it, "lstrip", false),
                  s_flag(it, "rstrip", false),
                  s_flag(it, "normalized", !s_flag(it, "special", false)), err, errlen) != 0) {
            rc = -1;
            break;
        }
    }
    cJSON_Delete(root);
    return rc;
}

// added_tokens.json's entries past vocab_size. 1 when the file exists, 0 when not, -1.
static int s_read_added_json(const char *dir, int32_t vocab_size, ls_added_vocab_t *v, char *err,
                             size_t errlen)
{
    char file[4096];
    cJSON *root = NULL;
    int rc = s_parse(dir, "added_tokens.json", LS_FILE_JSON, &root, file, err, errlen);
    if (rc <= 0)
        return rc;
    if (!cJSON_IsObject(root)) {
        ls_err_set(err, errlen, "%s: not a JSON object of token -> id", file);
        rc = -1;
    }
    const cJSON *it, *list = rc > 0 ? root : NULL;
    cJSON_ArrayForEach(it, list) {
        int64_t id = s_id(it, vocab_size);
        if (id == -2) {
            ls_err_set(err, errlen, "%s: token \"%.64s\" maps to no non-negative integer id",
                       file, it->string);
            rc = -1;
            break;
        }
        // transformers' add_tokens of a plain string: normalized, not special
        if (id >= 0 && s_add(v, file, it->string, (int32_t)id, false, false, false, false, true,
                             err, errlen) != 0) {
            rc = -1;
            break;
        }
    }
    cJSON_Delete(root);
    return rc;
}

static int s_cmp_id(const void *a, const void *b)
{
    int32_t x = ((const ls_added_token_t *)a)->id, y = ((const ls_added_token_t *)b)->id;
    return (x > y) - (x < y);
}

static int s_cmp_content(const void *a, const void *b)
{
    return strcmp((*(const ls_added_token_t *const *)a)->content,
                  (*(const ls_added_token_t *const *)b)->content);
}

// Sorted by id: vocab_size, vocab_size + 1, ... and no content twice.
static int s_check(const char *dir, const char *file, int32_t vocab_size, ls_added_vocab_t *v,
                   char *err, size_t errlen)
{
    if (v->n == 0) // nothing added (and no array to sort)
        return 0;
    qsort(v->tokens, (size_t)v->n, sizeof *v->tokens, s_cmp_id);
    for (int i = 0; i < v->n; i++)
        if (v->tokens[i].id != (int64_t)vocab_size + i) {
            ls_err_set(err, errlen, "%s/%s: added token \"%.64s\" has id %d where %lld is due: "
                       "added ids must run from the base vocab_size %d without a gap or a repeat",
                       dir, file, v->tokens[i].content, (int)v->tokens[i].id,
                       (long long)vocab_size + i, (int)vocab_size);
            return -1;
        }
    const ls_added_token_t **by = malloc(((size_t)v->n + 1) * sizeof *by);
    if (!by) {
        ls_err_set(err, errlen, "%s/%s: out of memory", dir, file);
        return -1;
    }
    for (int i = 0; i < v->n; i++)
        by[i] = &v->tokens[i];
    qsort(by, (size_t)v->n, sizeof *by, s_cmp_content);
    int rc = 0;
    for (int i = 1; i < v->n && rc == 0; i++)
        if (strcmp(by[i]->content, by[i - 1]->content) == 0) {
            ls_err_set(err, errlen, "%s/%s: added token \"%.64s\" is given two ids", dir, file,
                       by[i]->content);
            rc = -1;
        }
    free(by);
    return rc;
}

int ls_added_vocab_read(const char *dir, int32_t vocab_size, ls_added_vocab_t *out, char *err,
                        size_t errlen)
{
    memset(out, 0, sizeof *out);
    ls_added_vocab_t json = {0};
    int has_tok = s_read_tokenizer(dir, vocab_size, out, err, errlen);
    int has_json = has_tok < 0 ? -1 : s_read_added_json(dir, vocab_size, &json, err, errlen);
    if (has_json < 0)
        goto fail;
    const char *file = has_tok ? "tokenizer.json" : "added_tokens.json";
    if (!has_tok) {
        *out = json;
        json = (ls_added_vocab_t){0};
    }
    if (s_check(dir, file, vocab_size, out, err, errlen) != 0)
        goto fail;
    if (has_tok && has_json) {  // both: the same tokens (tokenizer.json's flags kept)
        if (s_check(dir, "added_tokens.json", vocab_size, &json, err, errlen) != 0)
            goto fail;
        bool same = json.n == out->n;
        for (int i = 0; same && i < out->n; i++)
            same = strcmp(json.tokens[i].content, out->tokens[i].content) == 0;
        if (!same) {
            ls_err_set(err, errlen, "%s: tokenizer.json and added_tokens.json add different "
                       "tokens past the base vocab_size %d", dir, (int)vocab_size);
            goto fail;
        }
    }
    ls_added_vocab_free(&json);
    return 0;
fail:
    ls_added_vocab_free(&json);
    ls_added_vocab_free(out);
    return -1;
}
