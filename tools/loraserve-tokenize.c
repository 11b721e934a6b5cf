// loraserve-tokenize: the tokenizer library from the command line, for debugging and tests.
//
//   loraserve-tokenize encode --tokenizer FILE [--jsonl] [--add-special-tokens]
//       stdin: UTF-8 text (all of it), or with --jsonl one JSON string per line.
//       stdout: the ids as a JSON array (one line per input line with --jsonl). Added-token
//       strings in the text are matched; BOS/EOS only with --add-special-tokens.
//   loraserve-tokenize decode --tokenizer FILE [--jsonl] [--skip-special-tokens]
//       stdin: a JSON array of ids, or with --jsonl one array per line.
//       stdout: the text (raw), or with --jsonl one JSON string per line.
//   loraserve-tokenize chat --tokenizer-config FILE [--chat-template FILE] [--add-generation-prompt]
//                           [--now SECONDS]
//       stdin: the messages, a JSON array; or an object {"messages", "tools",
//       "chat_template_kwargs"} for the other parts of a chat request.
//       stdout: the prompt the model's chat template renders (raw). FILE is tokenizer_config.json
//       or the model directory; --chat-template replaces its template; strftime_now reads
//       --now (seconds since the epoch; default: the clock).
// Exit status 0, 1 on a bad input line (reported on stderr with its line number; with --jsonl
// its output line is `null`, so lines stay aligned), 2 on usage.
// JSON strings are read with jansson, which keeps their length: "a\u0000b" is three bytes, as
// HF tokenizers see it (cJSON would end the string at the NUL).
#include <cjson/cJSON.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "tokenizer.h"

static int s_usage(void) {
    fprintf(stderr,
            "usage: loraserve-tokenize encode --tokenizer FILE [--jsonl] [--add-special-tokens]\n"
            "       loraserve-tokenize decode --tokenizer FILE [--jsonl] [--skip-special-tokens]\n"
            "       loraserve-tokenize chat --tokenizer-config FILE [--chat-template FILE] [--add-generation-prompt]\n"
            "                               [--now SECONDS] < messages.json\n");
    return 2;
}

static char *s_read_all(FILE *fp, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    size_t got;
    while (s && (got = fread(s + n, 1, cap - n - 1, fp)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *p = realloc(s, cap * 2);
            if (!p) {
                free(s);
                return NULL;
            }
            s = p;
            cap *= 2;
        }
    }
    if (s)
        s[n] = '\0';
    *len = n;
    return s;
}

static void s_print_ids(const ls_token_ids_t *v) {
    putchar('[');
    for (size_t i = 0; i < v->n; i++)
        printf(i ? ",%d" : "%d", v->ids[i]);
    fputs("]\n", stdout);
}

// JSON string with only what JSON requires escaped (UTF-8 passes through).
static void s_print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    fputs("\"\n", stdout);
}

static int s_encode(ls_tokenizer_t *t, const char *text, size_t len, unsigned flags, long line) {
    ls_token_ids_t v = {0};
    char err[512];
    int rc = ls_tokenizer_encode(t, text, len, flags, &v, err, sizeof err);
    if (rc == 0)
        s_print_ids(&v);
    else
        fprintf(stderr, "loraserve-tokenize: line %ld: %s\n", line, err);
    ls_token_ids_free(&v);
    return rc;
}

// Parses a JSON array of ids into v.
static int s_parse_ids(const char *json, size_t len, ls_token_ids_t *v) {
    cJSON *a = cJSON_ParseWithLength(json, len);
    int rc = cJSON_IsArray(a) ? 0 : -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (rc < 0 || !cJSON_IsNumber(it) || it->valuedouble != (double)(int32_t)it->valuedouble) {
            rc = -1;
            break;
        }
        if (v->n == v->cap) {
            size_t cap = v->cap ? v->cap * 2 : 64;
            int32_t *p = realloc(v->ids, cap * sizeof *p);
            if (!p) {
                rc = -1;
                break;
            }
            v->ids = p;
            v->cap = cap;
        }
        v->ids[v->n++] = (int32_t)it->valuedouble;
    }
    cJSON_Delete(a);
    return rc;
}

static int s_decode(const ls_tokenizer_t *t, const char *json, size_t len, unsigned flags, bool jsonl,
                    long line) {
    ls_token_ids_t v = {0};
    char err[512];
    if (s_parse_ids(json, len, &v) < 0) {
        fprintf(stderr, "loraserve-tokenize: line %ld: not a JSON array of ids\n", line);
        ls_token_ids_free(&v);
        return -1;
    }
    size_t n;
    char *text = ls_tokenizer_decode(t, v.ids, v.n, flags, &n, err, sizeof err);
    ls_token_ids_free(&v);
    if (!text) {
        fprintf(stderr, "loraserve-tokenize: line %ld: %s\n", line, err);
        return -1;
    }
    if (jsonl)
        s_print_json_string(text, n);
    else
        fwrite(text, 1, n, stdout);
    free(text);
    return 0;
}

// A JSON field of the request object as text for ls_chat_args_t; NULL when absent or null.
static char *s_field(const json_t *req, const char *name) {
    const json_t *v = json_object_get(req, name);
    return v && !json_is_null(v) ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
}

static int s_chat(int argc, char **argv) {
    const char *config = NULL, *tpl = NULL;
    ls_chat_args_t a = {.now_s = (int64_t)time(NULL)};
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer-config") == 0 && i + 1 < argc)
            config = argv[++i];
        else if (strcmp(argv[i], "--chat-template") == 0 && i + 1 < argc)
            tpl = argv[++i];
        else if (strcmp(argv[i], "--add-generation-prompt") == 0)
            a.add_generation_prompt = true;
        else if (strcmp(argv[i], "--now") == 0 && i + 1 < argc)
            a.now_s = strtoll(argv[++i], NULL, 10);
        else
            return s_usage();
    }
    if (!config)
        return s_usage();
    char err[1024];
    ls_chat_template_t *ct = ls_chat_template_load(config, tpl, err, sizeof err);
    if (!ct) {
        fprintf(stderr, "loraserve-tokenize: %s\n", err);
        return 1;
    }
    size_t len;
    char *in = s_read_all(stdin, &len), *messages = NULL, *tools = NULL, *kwargs = NULL, *out = NULL;
    json_t *req = in ? json_loadb(in, len, JSON_ALLOW_NUL, NULL) : NULL;
    if (json_is_object(req)) {
        messages = s_field(req, "messages");
        tools = s_field(req, "tools");
        kwargs = s_field(req, "chat_template_kwargs");
    }
    a.messages = messages ? messages : in;
    a.messages_len = messages ? strlen(messages) : len;
    a.tools = tools;
    a.tools_len = tools ? strlen(tools) : 0;
    a.kwargs = kwargs;
    a.kwargs_len = kwargs ? strlen(kwargs) : 0;
    size_t n = 0;
    if (in && (out = ls_chat_template_render(ct, &a, &n, err, sizeof err)))
        fwrite(out, 1, n, stdout);
    else
        fprintf(stderr, "loraserve-tokenize: %s\n", in ? err : "cannot read stdin");
    int status = out ? 0 : 1;
    free(out);
    free(messages);
    free(tools);
    free(kwargs);
    json_decref(req);
    free(in);
    ls_chat_template_destroy(&ct);
    return status;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return s_usage();
    if (strcmp(argv[1], "chat") == 0)
        return s_chat(argc, argv);
    bool encode = strcmp(argv[1], "encode") == 0;
    if (!encode && strcmp(argv[1], "decode") != 0)
        return s_usage();
    const char *path = NULL;
    bool jsonl = false;
    unsigned enc_flags = 0, dec_flags = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "--jsonl") == 0)
            jsonl = true;
        else if (encode && strcmp(argv[i], "--add-special-tokens") == 0)
            enc_flags |= LS_TOKENIZE_ADD_SPECIAL;
        else if (!encode && strcmp(argv[i], "--skip-special-tokens") == 0)
            dec_flags |= LS_DETOK_SKIP_SPECIAL;
        else
            return s_usage();
    }
    if (!path)
        return s_usage();
    char err[512];
    ls_tokenizer_t *t = ls_tokenizer_load(path, err, sizeof err);
    if (!t) {
        fprintf(stderr, "loraserve-tokenize: %s\n", err);
        return 1;
    }
    int status = 0;
    if (!jsonl) {
        size_t len;
        char *all = s_read_all(stdin, &len);
        if (!all || (encode ? s_encode(t, all, len, enc_flags, 1)
                            : s_decode(t, all, len, dec_flags, false, 1)) < 0)
            status = 1;
        free(all);
    } else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        long no = 0;
        while ((n = getline(&line, &cap, stdin)) > 0) {
            no++;
            int rc;
            if (!encode) {
                rc = s_decode(t, line, (size_t)n, dec_flags, true, no);
            } else {
                json_t *j = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
                if (!json_is_string(j)) {
                    fprintf(stderr, "loraserve-tokenize: line %ld: not a JSON string\n", no);
                    rc = -1;
                } else {
                    rc = s_encode(t, json_string_value(j), json_string_length(j), enc_flags, no);
                }
                json_decref(j);
            }
            if (rc < 0) {
                puts("null");
                status = 1;
            }
        }
        free(line);
    }
    ls_tokenizer_destroy(&t);
    return status;
}
