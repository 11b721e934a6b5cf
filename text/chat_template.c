// chat_template — see chat_template.h.
#include "chat_template.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "jinja.h"
#include "ls_err.h"
#include "ls_file.h"

#define S_MAX_NAMED 16  // templates in a named list

// The special tokens transformers passes to the template (its special_tokens_map).
static const char *s_special[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                  "pad_token", "cls_token", "mask_token", "additional_special_tokens"};

struct ls_chat_template {
    ls_jinja_t *dflt;      // "default", or the one template
    ls_jinja_t *tool_use;  // used when tools are given; NULL: none
    json_t *tokens;        // the special tokens, as template variables
    char *bos, *eos;
};

// A token of tokenizer_config.json: a string, an AddedToken object ({"content": ...}), null;
// a list of them for additional_special_tokens.
static json_t *s_token(const json_t *v) {
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (json_is_string(v))
        return json_stringn(json_string_value(v), json_string_length(v));
    if (!json_is_array(v))
        return NULL;
    json_t *list = json_array();
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
        json_t *t = s_token(e);
        if (t && !json_is_array(t))
            json_array_append_new(list, t);
        else
            json_decref(t);
    }
    return list;
}

static ls_jinja_t *s_compile(const char *src, size_t len, const char *what, const char *name, char *err,
                             size_t errlen) {
    char why[512];
    ls_jinja_t *t = ls_jinja_parse(src, len, why, sizeof why);
    if (!t)
        ls_err_set(err, errlen, "%s: %s%s%s: %s", what, name ? "chat template \"" : "the chat template",
                   name ? name : "", name ? "\"" : "", why);
    return t;
}

ls_chat_template_t *ls_chat_template_parse(const char *config, size_t len, const char *template_src,
                                           size_t template_len, const char *what, char *err, size_t errlen) {
    json_error_t je;
    json_t *cfg = json_loadb(config, len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(cfg)) {
        ls_err_set(err, errlen, "%s: not a JSON object (%s)", what, cfg ? "another JSON value" : je.text);
        json_decref(cfg);
        return NULL;
    }
    ls_chat_template_t *ct = calloc(1, sizeof *ct);
    if (!ct || !(ct->tokens = json_object())) {
        ls_err_set(err, errlen, "out of memory");
        json_decref(cfg);
        free(ct);
        return NULL;
    }
    for (size_t i = 0; i < sizeof s_special / sizeof *s_special; i++) {
        json_t *t = s_token(json_object_get(cfg, s_special[i]));
        if (t)
            json_object_set_new(ct->tokens, s_special[i], t);
    }
    const json_t *bos = json_object_get(ct->tokens, "bos_token"), *eos = json_object_get(ct->tokens, "eos_token");
    ct->bos = strdup(json_is_string(bos) ? json_string_value(bos) : "");
    ct->eos = strdup(json_is_string(eos) ? json_string_value(eos) : "");
    const json_t *tpl = json_object_get(cfg, "chat_template");
    if (template_src) {
        ct->dflt = s_compile(template_src, template_len, what, NULL, err, errlen);
    } else if (json_is_string(tpl)) {
        ct->dflt = s_compile(json_string_value(tpl), json_string_length(tpl), what, NULL, err, errlen);
    } else if (json_is_array(tpl) && json_array_size(tpl) <= S_MAX_NAMED) {
        size_t i;
        const json_t *e;
        bool ok = true;
        json_array_foreach(tpl, i, e) {
            const json_t *name = json_object_get(e, "name"), *src = json_object_get(e, "template");
            if (!json_is_string(name) || !json_is_string(src)) {
                ls_err_set(err, errlen, "%s: chat_template[%zu] is not {\"name\": ..., \"template\": ...}", what, i);
                ok = false;
                break;
            }
            ls_jinja_t **slot = !strcmp(json_string_value(name), "default")    ? &ct->dflt
                                : !strcmp(json_string_value(name), "tool_use") ? &ct->tool_use
                                                                              : NULL;
            // other names are chosen by name in transformers; no request here names one
            if (slot && !*slot &&
                !(*slot = s_compile(json_string_value(src), json_string_length(src), what, json_string_value(name),
                                    err, errlen))) {
                ok = false;
                break;
            }
        }
        if (ok && !ct->dflt)
            ls_err_set(err, errlen, "%s: chat_template lists no template named \"default\"", what);
    } else {
        ls_err_set(err, errlen, "%s: no chat_template (a string or a list of named templates)", what);
    }
    json_decref(cfg);
    if (!ct->dflt || !ct->bos || !ct->eos) {
        if (ct->dflt)
            ls_err_set(err, errlen, "out of memory");
        ls_chat_template_destroy(&ct);
        return NULL;
    }
    return ct;
}

ls_chat_template_t *ls_chat_template_load(const char *path, const char *template_file, char *err, size_t errlen) {
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    char file[4096], dirname[4096];
    snprintf(file, sizeof file, "%s%s", path, dir ? "/tokenizer_config.json" : "");
    snprintf(dirname, sizeof dirname, "%s", dir ? path : ".");
    if (!dir) {
        const char *slash = strrchr(path, '/');
        if (slash)
            snprintf(dirname, sizeof dirname, "%.*s", (int)(slash - path ? slash - path : 1), path);
    }
    size_t len, tlen = 0;
    char *text = ls_file_read_path(file, LS_FILE_JSON, &len, err, errlen);
    if (!text)
        return NULL;
    char *tpl = NULL;
    const char *what = file;
    char tfile[4096 + 32];
    if (template_file) {
        tpl = ls_file_read_path(template_file, LS_FILE_JSON, &tlen, err, errlen);
        what = template_file;
        if (!tpl) {
            free(text);
            return NULL;
        }
    } else {
        // chat_template.jinja beside the config wins over the config's chat_template
        char why[512];
        tpl = ls_file_read(dirname, "chat_template.jinja", LS_FILE_JSON, &tlen, why, sizeof why);
        if (!tpl && errno != ENOENT) {
            ls_err_set(err, errlen, "%s", why);
            free(text);
            return NULL;
        }
        snprintf(tfile, sizeof tfile, "%s/chat_template.jinja", dirname);
        if (tpl)
            what = tfile;
    }
    ls_chat_template_t *ct = ls_chat_template_parse(text, len, tpl, tlen, what, err, errlen);
    free(text);
    free(tpl);
    return ct;
}

void ls_chat_template_destroy(ls_chat_template_t **ctp) {
    if (!ctp || !*ctp)
        return;
    ls_chat_template_t *ct = *ctp;
    ls_jinja_destroy(&ct->dflt);
    ls_jinja_destroy(&ct->tool_use);
    json_decref(ct->tokens);
    free(ct->bos);
    free(ct->eos);
    free(ct);
    *ctp = NULL;
}

const char *ls_chat_template_bos(const ls_chat_template_t *ct) { return ct->bos; }
const char *ls_chat_template_eos(const ls_chat_template_t *ct) { return ct->eos; }

// A content of text parts only becomes one string; other parts are refused. 0 / -1 + err.
static int s_flatten_content(json_t *msg, size_t k, char *err, size_t errlen) {
    json_t *c = json_object_get(msg, "content");
    if (!json_is_array(c))
        return 0;
    size_t i, n = 0;
    const json_t *part;
    json_array_foreach(c, i, part) {
        const json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            ls_err_set(err, errlen, "messages[%zu].content: only text parts ({\"type\": \"text\", \"text\": ...}) are "
                                    "supported", k);
            return -1;
        }
        n += json_string_length(text) + 1;
    }
    char *s = malloc(n + 1);
    if (!s) {
        ls_err_set(err, errlen, "out of memory");
        return -1;
    }
    size_t at = 0;
    json_array_foreach(c, i, part) {
        const json_t *text = json_object_get(part, "text");
        if (i)
            s[at++] = '\n';
        memcpy(s + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    int rc = json_object_set_new(msg, "content", json_stringn_nocheck(s, at));
    free(s);
    if (rc < 0)
        ls_err_set(err, errlen, "out of memory");
    return rc;
}

static json_t *s_load_arg(const char *s, size_t n, const char *name, bool array, char *err, size_t errlen) {
    json_error_t je;
    json_t *v = json_loadb(s, n, JSON_ALLOW_NUL | JSON_DECODE_ANY, &je);
    if (!v || (array ? !json_is_array(v) : !json_is_object(v))) {
        ls_err_set(err, errlen, "%s must be a JSON %s%s%s", name, array ? "array" : "object", v ? "" : ": ",
                   v ? "" : je.text);
        json_decref(v);
        return NULL;
    }
    return v;
}

char *ls_chat_template_render(const ls_chat_template_t *ct, const ls_chat_args_t *a, size_t *len, char *err,
                              size_t errlen) {
    json_t *ctx = NULL, *messages = NULL, *tools = NULL;
    char *out = NULL;
    if (!a->messages) {
        ls_err_set(err, errlen, "no messages");
        return NULL;
    }
    if (!(messages = s_load_arg(a->messages, a->messages_len, "messages", true, err, errlen)))
        goto done;
    if (a->kwargs ? !(ctx = s_load_arg(a->kwargs, a->kwargs_len, "chat_template_kwargs", false, err, errlen))
                  : !(ctx = json_object()))
        goto done;
    if (a->tools && !(tools = s_load_arg(a->tools, a->tools_len, "tools", true, err, errlen)))
        goto done;
    if (!json_array_size(messages)) {
        ls_err_set(err, errlen, "messages must be a non-empty JSON array");
        goto done;
    }
    size_t k;
    json_t *m;
    json_array_foreach(messages, k, m) {
        const json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role)) {
            ls_err_set(err, errlen, "messages[%zu] is not a JSON object with a string \"role\"", k);
            goto done;
        }
        if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content)) {
            ls_err_set(err, errlen, "messages[%zu].content must be a string, null or a list of parts", k);
            goto done;
        }
        if (s_flatten_content(m, k, err, errlen) < 0)
            goto done;
    }
    // the request's variables first: the ones apply_chat_template sets win over them
    json_object_update(ctx, ct->tokens);
    json_object_set(ctx, "messages", messages);
    json_object_set(ctx, "tools", tools ? tools : json_null());
    json_object_set_new(ctx, "documents", json_null());
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(a->add_generation_prompt));
    const ls_jinja_t *tpl = tools && json_array_size(tools) && ct->tool_use ? ct->tool_use : ct->dflt;
    char why[1024];
    if (!(out = ls_jinja_render(tpl, ctx, a->now_s, len, why, sizeof why)))
        ls_err_set(err, errlen, "chat template: %s", why);
done:
    json_decref(ctx);
    json_decref(messages);
    json_decref(tools);
    return out;
}
