/*  fuzz_chat_template.c — libFuzzer target for chat templates (text/chat_template.c).

    The first byte picks what the rest is. Even: a tokenizer_config.json, parsed; one that is
    accepted renders a fixed conversation. Odd: a conversation for one of the real templates
    of tools/tokenizer-refs/templates (byte 1 picks it): parts split at 0xff bytes, each a role
    (its first byte) and a content of any bytes, NULs included. Refusals need a reason; a
    rendering must be as long as it says.
*/
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "chat_template.h"

#define S_MAX_TEMPLATES 16
#define S_MAX_MESSAGES 16

static ls_chat_template_t *s_templates[S_MAX_TEMPLATES];
static int s_n_templates;

static void s_load_templates(void) {
    DIR *dir = opendir(LS_REFS_DIR "/templates");
    struct dirent *e;
    char path[4096], err[512];
    while (dir && (e = readdir(dir)) && s_n_templates < S_MAX_TEMPLATES) {
        if (!strstr(e->d_name, ".json"))
            continue;
        snprintf(path, sizeof path, "%s/templates/%s", LS_REFS_DIR, e->d_name);
        ls_chat_template_t *ct = ls_chat_template_load(path, err, sizeof err);
        if (ct)
            s_templates[s_n_templates++] = ct;
    }
    if (dir)
        closedir(dir);
    if (!s_n_templates)
        s_die("no template under " LS_REFS_DIR "/templates");
}

static void s_render(const ls_chat_template_t *ct, const ls_chat_message_t *msgs, size_t n) {
    char err[512] = "";
    for (int gen = 0; gen < 2; gen++) {
        size_t len;
        char *out = ls_chat_template_render(ct, msgs, n, gen, &len, err, sizeof err);
        if (!out && !err[0])
            s_die("refused a conversation without a reason");
        if (out && out[len] != 0)
            s_die("rendering is not NUL-terminated at its length");
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!s_n_templates)
        s_load_templates();
    if (size < 2)
        return 0;
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    if (data[0] % 2 == 0) {
        char err[512] = "";
        ls_chat_template_t *ct =
            ls_chat_template_parse((const char *)data + 1, size - 1, "fuzz", err, sizeof err);
        if (!ct) {
            if (!err[0])
                s_die("refused a config without a reason");
            return 0;
        }
        ls_chat_message_t msgs[] = {{"system", "be brief", 0},
                                    {"user", "hi\0there", 8},
                                    {"assistant", "<think>x</think>ok", 0},
                                    {"user", "", 0}};
        s_render(ct, msgs, 4);
        ls_chat_template_destroy(&ct);
        return 0;
    }
    const ls_chat_template_t *ct = s_templates[data[1] % s_n_templates];
    ls_chat_message_t msgs[S_MAX_MESSAGES];
    size_t n = 0;
    const uint8_t *p = data + 2, *end = data + size;
    while (p < end && n < S_MAX_MESSAGES) {
        const uint8_t *stop = memchr(p, 0xff, (size_t)(end - p));
        if (!stop)
            stop = end;
        msgs[n].role = roles[p < stop ? *p % 4 : 1];
        msgs[n].content = p < stop ? (const char *)p + 1 : "";
        msgs[n].content_len = p < stop ? (size_t)(stop - p - 1) : 0;
        //  content_len 0 means strlen: give an empty content a pointer to an empty string
        if (!msgs[n].content_len)
            msgs[n].content = "";
        n++;
        p = stop + 1;
    }
    s_render(ct, msgs, n);
    return 0;
}
