// chat_template — see chat_template.h. Each family's renderer follows its Jinja template
// statement by statement; the comments quote the part they stand for.
#define _GNU_SOURCE  // memmem
#include "chat_template.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ls_err.h"
#include "ls_file.h"
#include "text_utf8.h"

struct ls_chat_template {
    ls_chat_family_t family;
    char *bos, *eos;
    char *default_system;     // CHATML: system prompt used when the conversation has none
    bool qwen3_think;         // CHATML: Qwen3's reasoning handling
    bool always_gen_prompt;   // LLAMA3: the template appends the assistant header unconditionally
    bool eos_space;           // MISTRAL v0.1: " " after each eos_token
};

const char *ls_chat_family_name(ls_chat_family_t f) {
    switch (f) {
    case LS_CHAT_LLAMA3:
        return "llama3";
    case LS_CHAT_CHATML:
        return "chatml";
    case LS_CHAT_LLAMA2:
        return "llama2";
    case LS_CHAT_MISTRAL:
        return "mistral";
    }
    return "?";
}

// ---- loading ----------------------------------------------------------------------------

// bos_token/eos_token: a string, an AddedToken object ({"content": ...}), or null.
static char *s_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    return strdup(cJSON_IsString(v) ? v->valuestring : "");
}

// A default system prompt written into a ChatML template as one string literal:
// '<|im_start|>system\nTEXT<|im_end|>\n' with no expression inside. NULL when there is none.
static char *s_default_system(const char *tpl) {
    static const char *heads[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
    for (int h = 0; h < 2; h++) {
        for (const char *p = strstr(tpl, heads[h]); p; p = strstr(p + 1, heads[h])) {
            const char *a = p + strlen(heads[h]), *z = strstr(a, "<|im_end|>");
            if (!z || z == a || memchr(a, '\'', (size_t)(z - a)) || memchr(a, '"', (size_t)(z - a)) ||
                memchr(a, '{', (size_t)(z - a)) || memchr(a, '+', (size_t)(z - a)))
                continue;
            ls_buf_t b = {0};
            for (const char *q = a; q < z; q++) {
                // Jinja string-literal escapes that can appear in a prompt.
                char c = *q;
                if (c == '\\' && q + 1 < z) {
                    c = *++q;
                    c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
                }
                if (ls_buf_append(&b, &c, 1) < 0) {
                    ls_buf_free(&b);
                    return NULL;
                }
            }
            return b.s;
        }
    }
    return NULL;
}

static int s_detect(ls_chat_template_t *ct, const char *what, const char *tpl, char *err, size_t errlen) {
    if (strstr(tpl, "<|start_header_id|>")) {
        if (strstr(tpl, "Cutting Knowledge Date") || strstr(tpl, "tools_in_user_message") ||
            strstr(tpl, "date_string")) {
            ls_err_set(err, errlen,
                       "%s: Llama-3.1+ chat template (tools and a dated system block) is not supported", what);
            return -1;
        }
        ct->family = LS_CHAT_LLAMA3;
        ct->always_gen_prompt = !strstr(tpl, "add_generation_prompt");
        return 0;
    }
    if (strstr(tpl, "<|im_start|>")) {
        ct->family = LS_CHAT_CHATML;
        ct->qwen3_think = strstr(tpl, "reasoning_content") != NULL;
        ct->default_system = ct->qwen3_think ? NULL : s_default_system(tpl);
        return 0;
    }
    if (strstr(tpl, "[INST]")) {
        if (strstr(tpl, "<<SYS>>") && strstr(tpl, "' [/INST]'") && strstr(tpl, "content.strip()")) {
            ct->family = LS_CHAT_LLAMA2;
            return 0;
        }
        if (!strstr(tpl, "<<SYS>>") && strstr(tpl, "'[INST] ' + message['content'] + ' [/INST]'")) {
            ct->family = LS_CHAT_MISTRAL;
            ct->eos_space = strstr(tpl, "eos_token + ' '") != NULL;
            return 0;
        }
        ls_err_set(err, errlen, "%s: this [INST] chat template is not a known Llama-2 or Mistral variant", what);
        return -1;
    }
    ls_err_set(err, errlen,
               "%s: chat template not recognized (known: Llama-3 <|start_header_id|>, ChatML <|im_start|>, "
               "Llama-2/Mistral [INST])",
               what);
    return -1;
}

ls_chat_template_t *ls_chat_template_parse(const char *json, size_t len, const char *what, char *err,
                                           size_t errlen) {
    cJSON *cfg = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(cfg)) {
        ls_err_set(err, errlen, "%s: not a JSON object", what);
        cJSON_Delete(cfg);
        return NULL;
    }
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    ls_chat_template_t *ct = NULL;
    if (!cJSON_IsString(tpl)) {
        ls_err_set(err, errlen, "%s: no chat_template string%s", what,
                   cJSON_IsArray(tpl) ? " (named template lists are not supported)" : "");
    } else if (!(ct = calloc(1, sizeof *ct)) || !(ct->bos = s_token(cfg, "bos_token")) ||
               !(ct->eos = s_token(cfg, "eos_token"))) {
        ls_err_set(err, errlen, "%s: out of memory", what);
        ls_chat_template_destroy(&ct);
    } else if (s_detect(ct, what, tpl->valuestring, err, errlen) < 0) {
        ls_chat_template_destroy(&ct);
    }
    cJSON_Delete(cfg);
    return ct;
}

ls_chat_template_t *ls_chat_template_load(const char *path, char *err, size_t errlen) {
    struct stat st;
    bool dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    size_t len;
    char *text = dir ? ls_file_read(path, "tokenizer_config.json", LS_FILE_JSON, &len, err, errlen)
                     : ls_file_read_path(path, LS_FILE_JSON, &len, err, errlen);
    if (!text)
        return NULL;
    char file[4096];
    snprintf(file, sizeof file, dir ? "%s/tokenizer_config.json" : "%s", path);
    ls_chat_template_t *ct = ls_chat_template_parse(text, len, file, err, errlen);
    free(text);
    return ct;
}

void ls_chat_template_destroy(ls_chat_template_t **ctp) {
    if (!ctp || !*ctp)
        return;
    free((*ctp)->bos);
    free((*ctp)->eos);
    free((*ctp)->default_system);
    free(*ctp);
    *ctp = NULL;
}

ls_chat_family_t ls_chat_template_family(const ls_chat_template_t *ct) {
    return ct->family;
}

const char *ls_chat_template_bos(const ls_chat_template_t *ct) {
    return ct->bos;
}

const char *ls_chat_template_eos(const ls_chat_template_t *ct) {
    return ct->eos;
}

// ---- rendering helpers ------------------------------------------------------------------

typedef struct {
    const char *s;
    size_t n;
} s_str_t;

static s_str_t s_of(const char *s) {
    return (s_str_t){s, strlen(s)};
}

// A message's content with its length: it may hold NUL bytes (ls_chat_message_t).
static s_str_t s_content(const ls_chat_message_t *m) {
    return (s_str_t){m->content, m->content_len ? m->content_len : strlen(m->content)};
}

// Python's str.isspace, which Jinja's trim and str.strip() use: Unicode White_Space plus the
// information separators U+001C..U+001F.
static bool s_py_space(uint32_t cp) {
    return ls_utf8_is_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

// Whether cp is one of the ASCII characters in chars (never NUL: strchr would match the end).
static bool s_in(const char *chars, uint32_t cp) {
    return cp > 0 && cp < 0x80 && strchr(chars, (int)cp);
}

// Strips Python whitespace (chars == NULL) or the given ASCII characters from the chosen ends.
static s_str_t s_strip(s_str_t x, const char *chars, bool left, bool right) {
    const unsigned char *p = (const unsigned char *)x.s;
    size_t a = 0, z = x.n, bad;
    while (left && a < z) {
        int k = ls_utf8_seq(p + a, z - a, &bad);
        uint32_t cp = k > 0 ? ls_utf8_cp(p + a, k) : 0xFFFD;
        if (!(chars ? s_in(chars, cp) : s_py_space(cp)))
            break;
        a += (size_t)(k > 0 ? k : 1);
    }
    while (right && z > a) {
        size_t b = z - 1;
        while (b > a && (p[b] & 0xC0) == 0x80)
            b--;
        int k = ls_utf8_seq(p + b, z - b, &bad);
        uint32_t cp = k > 0 ? ls_utf8_cp(p + b, k) : 0xFFFD;
        if (!(chars ? s_in(chars, cp) : s_py_space(cp)))
            break;
        z = b;
    }
    return (s_str_t){x.s + a, z - a};
}

static bool s_starts(s_str_t x, const char *pre) {
    size_t n = strlen(pre);
    return x.n >= n && memcmp(x.s, pre, n) == 0;
}

static bool s_ends(s_str_t x, const char *suf) {
    size_t n = strlen(suf);
    return x.n >= n && memcmp(x.s + x.n - n, suf, n) == 0;
}

// Appends the pieces, NULL-terminated.
static int s_cat(ls_buf_t *b, ...) {
    va_list ap;
    va_start(ap, b);
    int rc = 0;
    for (const s_str_t *x; rc == 0 && (x = va_arg(ap, const s_str_t *));)
        rc = ls_buf_append(b, x->s, x->n);
    va_end(ap);
    return rc;
}

#define CAT(b, ...) s_cat((b), __VA_ARGS__, (const s_str_t *)NULL)
#define LIT(s) (&(s_str_t){(s), sizeof(s) - 1})
#define STR(s) (&(s_str_t){(s), strlen(s)})

// ---- families ---------------------------------------------------------------------------

static int s_llama3(const ls_chat_template_t *ct, const ls_chat_message_t *m, size_t n, bool gen, ls_buf_t *b) {
    // {% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' +
    //    message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content =
    //    bos_token + content %}{% endif %}
    for (size_t i = 0; i < n; i++) {
        s_str_t role = s_of(m[i].role), content = s_strip(s_content(&m[i]), NULL, true, true);
        if ((i == 0 && CAT(b, STR(ct->bos)) < 0) ||
            CAT(b, LIT("<|start_header_id|>"), &role, LIT("<|end_header_id|>\n\n"), &content, LIT("<|eot_id|>")) < 0)
            return -1;
    }
    if (gen || ct->always_gen_prompt)
        return CAT(b, LIT("<|start_header_id|>assistant<|end_header_id|>\n\n"));
    return 0;
}

// Qwen3's assistant turn: reasoning split off "<think>...</think>" in the content, shown only
// for turns after the last user query.
static int s_qwen3_assistant(const ls_chat_message_t *msg, bool after_query, bool last, ls_buf_t *b) {
    s_str_t content = s_content(msg), reasoning = {"", 0};
    const char *end = content.s + content.n;
    const char *close = memmem(content.s, content.n, "</think>", 8);
    if (close) {
        // content.split('</think>')[-1].lstrip('\n')
        const char *lastc = close;
        for (const char *p = close; (p = memmem(p + 1, (size_t)(end - p - 1), "</think>", 8));)
            lastc = p;
        content = s_strip((s_str_t){lastc + 8, (size_t)(end - lastc - 8)}, "\n", true, false);
        // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        s_str_t head = s_strip((s_str_t){msg->content, (size_t)(close - msg->content)}, "\n", false, true);
        const char *open = NULL;
        for (const char *p = head.s; (p = memmem(p, head.n - (size_t)(p - head.s), "<think>", 7)); p++)
            open = p;
        if (open)
            head = (s_str_t){open + 7, head.n - (size_t)(open + 7 - head.s)};
        reasoning = s_strip(head, "\n", true, false);
    }
    if (after_query && (last || reasoning.n)) {
        s_str_t r = s_strip(reasoning, "\n", true, true), c = s_strip(content, "\n", true, false);
        return CAT(b, LIT("<|im_start|>assistant\n<think>\n"), &r, LIT("\n</think>\n\n"), &c, LIT("<|im_end|>\n"));
    }
    return CAT(b, LIT("<|im_start|>assistant\n"), &content, LIT("<|im_end|>\n"));
}

static int s_chatml(const ls_chat_template_t *ct, const ls_chat_message_t *m, size_t n, bool gen, ls_buf_t *b) {
    bool has_system = n > 0 && strcmp(m[0].role, "system") == 0;
    // Qwen3: the last user message that is not a wrapped tool response.
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; ct->qwen3_think && i-- > 0;) {
        s_str_t c = s_content(&m[i]);
        if (strcmp(m[i].role, "user") == 0 && !(s_starts(c, "<tool_response>") && s_ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        s_str_t role = s_of(m[i].role), content = s_content(&m[i]);
        // Qwen2/2.5: {% if loop.first and messages[0]['role'] != 'system' %} default system
        if (i == 0 && !has_system && ct->default_system &&
            CAT(b, LIT("<|im_start|>system\n"), STR(ct->default_system), LIT("<|im_end|>\n")) < 0)
            return -1;
        int rc = ct->qwen3_think && strcmp(m[i].role, "assistant") == 0
                     ? s_qwen3_assistant(&m[i], i > last_query, i == n - 1, b)
                     : CAT(b, LIT("<|im_start|>"), &role, LIT("\n"), &content, LIT("<|im_end|>\n"));
        if (rc < 0)
            return -1;
    }
    return gen ? CAT(b, LIT("<|im_start|>assistant\n")) : 0;
}

static const char *ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/...";

static int s_llama2(const ls_chat_template_t *ct, const ls_chat_message_t *m, size_t n, ls_buf_t *b,
                    char *err, size_t errlen) {
    // {% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %} ...
    const ls_chat_message_t *system = n > 0 && strcmp(m[0].role, "system") == 0 ? &m[0] : NULL;
    const ls_chat_message_t *loop = system ? m + 1 : m;
    size_t ln = system ? n - 1 : n;
    for (size_t i = 0; i < ln; i++) {
        bool user = strcmp(loop[i].role, "user") == 0;
        if (user != (i % 2 == 0)) {
            ls_err_set(err, errlen, "%s", ALTERNATE);
            return -1;
        }
        ls_buf_t content = {0};
        s_str_t sys = system ? s_content(system) : (s_str_t){"", 0}, own = s_content(&loop[i]);
        int rc = i == 0 && system ? CAT(&content, LIT("<<SYS>>\n"), &sys, LIT("\n<</SYS>>\n\n"), &own)
                                  : CAT(&content, &own);
        s_str_t c = s_strip((s_str_t){content.s ? content.s : "", content.n}, NULL, true, true);
        if (rc == 0 && user)
            rc = CAT(b, STR(ct->bos), LIT("[INST] "), &c, LIT(" [/INST]"));
        else if (rc == 0 && strcmp(loop[i].role, "assistant") == 0)
            rc = CAT(b, LIT(" "), &c, LIT(" "), STR(ct->eos));
        ls_buf_free(&content);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int s_mistral(const ls_chat_template_t *ct, const ls_chat_message_t *m, size_t n, ls_buf_t *b,
                     char *err, size_t errlen) {
    if (CAT(b, STR(ct->bos)) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        bool user = strcmp(m[i].role, "user") == 0;
        if (user != (i % 2 == 0)) {
            ls_err_set(err, errlen, "%s", ALTERNATE);
            return -1;
        }
        int rc;
        s_str_t content = s_content(&m[i]);
        if (user)
            rc = CAT(b, LIT("[INST] "), &content, LIT(" [/INST]"));
        else if (strcmp(m[i].role, "assistant") == 0)
            rc = CAT(b, &content, STR(ct->eos), ct->eos_space ? LIT(" ") : LIT(""));
        else {
            ls_err_set(err, errlen, "Only user and assistant roles are supported!");
            return -1;
        }
        if (rc < 0)
            return -1;
    }
    return 0;
}

char *ls_chat_template_render(const ls_chat_template_t *ct, const ls_chat_message_t *msgs, size_t n,
                              bool add_generation_prompt, size_t *len, char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))) {
            ls_err_set(err, errlen, "message %zu: role \"%s\" is not supported (system, user, assistant)", i,
                       r ? r : "(none)");
            return NULL;
        }
    }
    if (err && errlen)
        err[0] = '\0';
    ls_buf_t b = {0};
    int rc = ls_buf_append(&b, "", 0);
    if (rc == 0) {
        switch (ct->family) {
        case LS_CHAT_LLAMA3:
            rc = s_llama3(ct, msgs, n, add_generation_prompt, &b);
            break;
        case LS_CHAT_CHATML:
            rc = s_chatml(ct, msgs, n, add_generation_prompt, &b);
            break;
        case LS_CHAT_LLAMA2:
            rc = s_llama2(ct, msgs, n, &b, err, errlen);
            break;
        case LS_CHAT_MISTRAL:
            rc = s_mistral(ct, msgs, n, &b, err, errlen);
            break;
        }
    }
    if (rc < 0) {
        if (err && errlen && !err[0])
            ls_err_set(err, errlen, "out of memory");
        ls_buf_free(&b);
        return NULL;
    }
    if (len)
        *len = b.n;
    return b.s;
}
