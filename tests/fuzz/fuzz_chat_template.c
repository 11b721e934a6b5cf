/*  fuzz_chat_template.c — libFuzzer target for chat templates (text/chat_template.c and the
    Jinja engine under it, text/jinja*).

    The first byte picks what the rest is, by its value modulo 3:
      0  a tokenizer_config.json, parsed; one that is accepted renders a fixed conversation;
      1  a template's source, rendered on a fixed conversation with tools;
      2  a request for one of the real templates of tools/tokenizer-refs/templates (byte 1
         picks it): the rest is a JSON object {"messages", "tools", "chat_template_kwargs"},
         or a messages array.
    Nothing may crash or hang (the engine bounds depth, steps, memory and output); a refusal
    needs a reason; a rendering must be as long as it says.
*/
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fuzz_common.h"
#include "chat_template.h"

#define S_MAX_TEMPLATES 32

static ls_chat_template_t *s_templates[S_MAX_TEMPLATES];
static int s_n_templates;

static const char s_messages[] =
    "[{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\\u0000there\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\","
    "\"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"abcdefghi\", \"content\": \"42\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>x</think>ok\"}, {\"role\": \"user\", \"content\": \"\"}]";
static const char s_tools[] = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}]";

static void s_load_templates(void) {
    DIR *dir = opendir(LS_REFS_DIR "/templates");
    struct dirent *e;
    char path[4096], err[512];
    while (dir && (e = readdir(dir)) && s_n_templates < S_MAX_TEMPLATES) {
        if (!strstr(e->d_name, ".json"))
            continue;
        snprintf(path, sizeof path, "%s/templates/%s", LS_REFS_DIR, e->d_name);
        ls_chat_template_t *ct = ls_chat_template_load(path, NULL, err, sizeof err);
        if (ct)
            s_templates[s_n_templates++] = ct;
    }
    if (dir)
        closedir(dir);
    if (!s_n_templates)
        s_die("no template under " LS_REFS_DIR "/templates");
}

static void s_render(const ls_chat_template_t *ct, ls_chat_args_t *a) {
    char err[512] = "";
    for (int gen = 0; gen < 2; gen++) {
        size_t len;
        a->add_generation_prompt = gen;
        char *out = ls_chat_template_render(ct, a, &len, err, sizeof err);
        if (!out && !err[0])
            s_die("refused a conversation without a reason");
        if (out && out[len] != 0)
            s_die("rendering is not NUL-terminated at its length");
        free(out);
    }
}

static char *s_field(const json_t *req, const char *name) {
    const json_t *v = json_object_get(req, name);
    return v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!s_n_templates)
        s_load_templates();
    if (size < 2)
        return 0;
    ls_chat_args_t a = {.messages = s_messages, .messages_len = sizeof s_messages - 1, .now_s = 1700000000};
    char err[512] = "";
    if (data[0] % 3 < 2) {
        static const char cfg[] = "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";
        ls_chat_template_t *ct =
            data[0] % 3 == 0
                ? ls_chat_template_parse((const char *)data + 1, size - 1, NULL, 0, "fuzz", err, sizeof err)
                : ls_chat_template_parse(cfg, sizeof cfg - 1, (const char *)data + 1, size - 1, "fuzz", err, sizeof err);
        if (!ct) {
            if (!err[0])
                s_die("refused a template without a reason");
            return 0;
        }
        s_render(ct, &a);
        a.tools = s_tools;
        a.tools_len = sizeof s_tools - 1;
        s_render(ct, &a);
        ls_chat_template_destroy(&ct);
        return 0;
    }
    const ls_chat_template_t *ct = s_templates[data[1] % s_n_templates];
    json_t *req = json_loadb((const char *)data + 2, size - 2, JSON_ALLOW_NUL, NULL);
    char *messages = json_is_object(req) ? s_field(req, "messages") : NULL;
    char *tools = json_is_object(req) ? s_field(req, "tools") : NULL;
    char *kwargs = json_is_object(req) ? s_field(req, "chat_template_kwargs") : NULL;
    a.messages = messages ? messages : (const char *)data + 2;
    a.messages_len = messages ? strlen(messages) : size - 2;
    a.tools = tools;
    a.tools_len = tools ? strlen(tools) : 0;
    a.kwargs = kwargs;
    a.kwargs_len = kwargs ? strlen(kwargs) : 0;
    s_render(ct, &a);
    free(messages);
    free(tools);
    free(kwargs);
    json_decref(req);
    return 0;
}
