// Chat templates against @huggingface/jinja renderings of real templates
// (tools/tokenizer-refs/expected/chat.jsonl, made by gen.js): every template in templates/ on
// every conversation (system, multi-turn, tool calls and results, unicode, NUL, empty content,
// content parts, chat_template_kwargs), with and without add_generation_prompt, byte for byte;
// where Jinja raises, the same error. Then where templates come from (a string, a named list,
// chat_template.jinja, an explicit file) and how bad arguments are refused.
#include "text_refs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_util.h"

#include "chat_template.h"

// gen.js's clock: 2025-02-03 09:05 UTC, read by strftime_now in UTC.
#define S_NOW 1738573500

static char errbuf[1024];

static char *s_dump(const json_t *v) {
    return v && !json_is_null(v) ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
}

// Renders messages (with tools and kwargs: JSON texts or NULL); NULL + errbuf.
static char *s_render_at(const ls_chat_template_t *ct, const char *messages, const char *tools, const char *kwargs,
                         bool gen, size_t *len) {
    ls_chat_args_t a = ls_chat_args(messages, tools, kwargs, gen, S_NOW);
    return ls_chat_template_render(ct, &a, len, errbuf, sizeof errbuf);
}

static char *s_render(const ls_chat_template_t *ct, const char *messages, const char *tools, const char *kwargs) {
    return s_render_at(ct, messages, tools, kwargs, true, NULL);
}

static void test_renderings(void **state) {
    (void)state;
    setenv("TZ", "UTC", 1);
    tzset();
    size_t n;
    json_t **cases = refs_jsonl("expected/chat.jsonl", &n);
    assert_non_null(cases);
    size_t matched = 0, refused = 0, templates = 0;
    const char *last = "";
    for (size_t i = 0; i < n; i++) {
        const json_t *c = cases[i];
        size_t len;
        const char *file = refs_str(c, "template", &len), *conv = refs_str(c, "conversation", &len);
        const json_t *text = json_object_get(c, "text");
        char path[4096];
        snprintf(path, sizeof path, "%s/templates/%s", LS_REFS_DIR, file);
        templates += strcmp(last, file) != 0;
        last = file;
        ls_chat_template_t *ct = ls_chat_template_load(path, NULL, errbuf, sizeof errbuf);
        if (!ct)
            fail_msg("%s: %s", file, errbuf);
        char *messages = s_dump(json_object_get(c, "messages")), *tools = s_dump(json_object_get(c, "tools")),
             *kwargs = s_dump(json_object_get(c, "kwargs"));
        bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
        size_t got_len = 0;
        char *got = s_render_at(ct, messages, tools, kwargs, gen, &got_len);
        if (json_is_string(text)) {
            if (!got)
                fail_msg("%s / %s: refused: %s", file, conv, errbuf);
            if (got_len != json_string_length(text) || memcmp(got, json_string_value(text), got_len) != 0)
                fail_msg("%s / %s (gen=%d): rendering differs from @huggingface/jinja\n got: %.*s\nwant: %s", file,
                         conv, gen, (int)got_len, got, json_string_value(text));
            matched++;
        } else {
            const char *want = refs_str(c, "error", &len);
            if (got)
                fail_msg("%s / %s: rendered, but @huggingface/jinja raised: %s", file, conv, want);
            // the engine's sentence, then where in the template
            if (!strstr(errbuf, want))
                fail_msg("%s / %s: error \"%s\", @huggingface/jinja's \"%s\"", file, conv, errbuf, want);
            assert_int_equal(strncmp(errbuf, "chat template: ", 15), 0);
            refused++;
        }
        free(got);
        free(messages);
        free(tools);
        free(kwargs);
        ls_chat_template_destroy(&ct);
        ls_chat_template_destroy(&ct);  // idempotent
    }
    print_message("%zu renderings of %zu templates equal @huggingface/jinja's byte for byte, %zu refused alike\n",
                  matched, templates, refused);
    assert_true(templates >= 17 && matched >= 500 && refused >= 20);
    refs_jsonl_free(cases);
}

static ls_chat_template_t *s_parse(const char *json) {
    return ls_chat_template_parse(json, strlen(json), NULL, 0, "tokenizer_config.json", errbuf, sizeof errbuf);
}

static const char *s_hi = "[{\"role\": \"user\", \"content\": \"hi\"}]";

// A string, a named list (tool_use chosen when tools are given), the special tokens.
static void test_sources(void **state) {
    (void)state;
    ls_chat_template_t *ct = s_parse("{\"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|"
                                     "{{ additional_special_tokens | join(',') }}|{{ messages[0].content }}\","
                                     "\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
                                     "\"unk_token\": null, \"additional_special_tokens\": [\"<a>\", {\"content\": \"<b>\"}]}");
    assert_non_null(ct);
    assert_string_equal(ls_chat_template_bos(ct), "<s>");
    assert_string_equal(ls_chat_template_eos(ct), "</s>");
    char *out = s_render(ct, s_hi, NULL, NULL);
    assert_string_equal(out, "<s>|</s>||<a>,<b>|hi");
    free(out);
    ls_chat_template_destroy(&ct);

    ct = s_parse("{\"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ tools }}\"},"
                 "{\"name\": \"rag\", \"template\": \"R\"}, {\"name\": \"tool_use\", \"template\": \"T{{ tools[0].n }}\"}]}");
    assert_non_null(ct);
    out = s_render(ct, s_hi, NULL, NULL);
    assert_string_equal(out, "D");  // tools is none, which prints nothing
    free(out);
    out = s_render(ct, s_hi, "[{\"n\": 7}]", NULL);
    assert_string_equal(out, "T7");
    free(out);
    ls_chat_template_destroy(&ct);

    assert_null(s_parse("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}"));
    assert_contains(errbuf, "no template named \"default\"");
    assert_null(s_parse("{\"chat_template\": [{\"name\": \"default\"}]}"));
    assert_contains(errbuf, "chat_template[0]");
    assert_null(s_parse("{\"bos_token\": \"<s>\"}"));
    assert_contains(errbuf, "no chat_template");
    assert_null(s_parse("[1]"));
    assert_contains(errbuf, "not a JSON object");
    assert_null(s_parse("{\"chat_template\": \"line one\\n{% if %}\"}"));
    assert_contains(errbuf, "tokenizer_config.json: the chat template: ");
    assert_contains(errbuf, "(line 2, column 7)");
    assert_null(s_parse("{\"chat_template\": [{\"name\": \"default\", \"template\": \"{{ x\"}]}"));
    assert_contains(errbuf, "chat template \"default\"");
}

static void s_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

// chat_template.jinja beside tokenizer_config.json wins over its chat_template; an explicit file
// wins over both.
static void test_files(void **state) {
    (void)state;
    char dir[4096], path[4200], cfg[4200];
    assert_int_equal(tu_tmpdir(dir, sizeof dir, "chat_template"), 0);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    s_write(cfg, "{\"chat_template\": \"config {{ messages[0].content }}\", \"eos_token\": \"E\"}");
    ls_chat_template_t *ct = ls_chat_template_load(dir, NULL, errbuf, sizeof errbuf);
    assert_non_null(ct);
    char *out = s_render(ct, s_hi, NULL, NULL);
    assert_string_equal(out, "config hi");
    free(out);
    ls_chat_template_destroy(&ct);

    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    s_write(path, "jinja file {{ messages[0].content }} {{ eos_token }}\n");
    for (int by_file = 0; by_file < 2; by_file++) {
        ct = ls_chat_template_load(by_file ? cfg : dir, NULL, errbuf, sizeof errbuf);
        assert_non_null(ct);
        out = s_render(ct, s_hi, NULL, NULL);
        assert_string_equal(out, "jinja file hi E");  // the file's last newline dropped, as Jinja does
        free(out);
        ls_chat_template_destroy(&ct);
    }

    char other[4200];
    snprintf(other, sizeof other, "%s/mine.jinja", dir);
    s_write(other, "mine");
    ct = ls_chat_template_load(dir, other, errbuf, sizeof errbuf);
    assert_non_null(ct);
    out = s_render(ct, s_hi, NULL, NULL);
    assert_string_equal(out, "mine");
    free(out);
    ls_chat_template_destroy(&ct);

    s_write(other, "{% for %}");
    assert_null(ls_chat_template_load(dir, other, errbuf, sizeof errbuf));
    assert_contains(errbuf, "mine.jinja");
    snprintf(other, sizeof other, "%s/absent.jinja", dir);
    assert_null(ls_chat_template_load(dir, other, errbuf, sizeof errbuf));
    assert_contains(errbuf, "absent.jinja");
    assert_null(ls_chat_template_load("/nonexistent/dir", NULL, errbuf, sizeof errbuf));
    unlink(path);
    unlink(cfg);
    snprintf(path, sizeof path, "%s/mine.jinja", dir);
    unlink(path);
    rmdir(dir);
}

static void test_arguments(void **state) {
    (void)state;
    ls_chat_template_t *ct = s_parse(
        "{\"chat_template\": \"{% for m in messages %}[{{ m.role }}:{{ m.content }}{{ m.tool_calls | length if m.tool_calls }}]"
        "{% endfor %}{{ enable_thinking }}{% if messages | length > 2 %}{{ raise_exception('too many: ' ~ messages | length) }}"
        "{% endif %}\"}");
    assert_non_null(ct);
    char *out = s_render(ct, "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", "
                             "\"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{}]}]",
                         NULL, "{\"enable_thinking\": false, \"messages\": \"overridden\"}");
    assert_string_equal(out, "[user:a\nb][assistant:1]false");
    free(out);
    static const struct {
        const char *messages, *tools, *kwargs, *says;
    } bad[] = {
        {"[{\"role\": \"a\"}, {\"role\": \"b\"}, {\"role\": \"c\"}]", NULL, NULL,
         "chat template: too many: 3 (line 1, column"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]", NULL, NULL, "only text parts"},
        {"{\"role\": \"user\"}", NULL, NULL, "messages must be a JSON array"},
        {"[1]", NULL, NULL, "messages[0] is not a JSON object"},
        {"[]", NULL, NULL, "non-empty"},
        {"[{\"content\": \"hi\"}]", NULL, NULL, "string \"role\""},
        {"[{\"role\": \"user\", \"content\": 5}]", NULL, NULL, "messages[0].content must be"},
        {"[{\"role\": \"user\", \"content\": \"hi\"}]", "{}", NULL, "tools must be a JSON array"},
        {"[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, "[]", "chat_template_kwargs must be a JSON object"},
        {"[{\"role\": \"user\", \"content\": \"x\"", NULL, NULL, "messages must be a JSON array"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_null(s_render(ct, bad[i].messages, bad[i].tools, bad[i].kwargs));
        assert_contains(errbuf, bad[i].says);
    }
    ls_chat_template_destroy(&ct);
    ls_chat_template_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_renderings),
        cmocka_unit_test(test_sources),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_arguments),
    };
    return cmocka_run_group_tests_name("text_chat_template", tests, NULL, NULL);
}
