// Chat templates against @huggingface/jinja renderings of the real templates
// (tools/tokenizer-refs/expected/chat.jsonl): byte-for-byte output for every family and
// conversation, the same refusals where Jinja raises, and refusal of unknown templates.
#include "text_refs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "chat_template.h"

static char errbuf[1024];


static void test_renderings(void **state) {
    (void)state;
    size_t n;
    json_t **cases = refs_jsonl("expected/chat.jsonl", &n);
    assert_non_null(cases);
    size_t matched = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *c = cases[i];
        size_t len;
        const char *file = refs_str(c, "template", &len);
        const char *conv = refs_str(c, "conversation", &len);
        const json_t *text = json_object_get(c, "text");
        bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
        char path[4096];
        snprintf(path, sizeof path, "%s/templates/%s", LS_REFS_DIR, file);
        ls_chat_template_t *ct = ls_chat_template_load(path, errbuf, sizeof errbuf);
        if (!ct)
            fail_msg("%s: %s", file, errbuf);
        const json_t *msgs = json_object_get(c, "messages"), *m;
        ls_chat_message_t mv[16];
        size_t k;
        json_array_foreach(msgs, k, m) {
            mv[k].role = refs_str(m, "role", &len);
            mv[k].content = refs_str(m, "content", &mv[k].content_len);
        }
        size_t got_len;
        char *got = ls_chat_template_render(ct, mv, k, gen, &got_len, errbuf, sizeof errbuf);
        if (json_is_string(text)) {
            if (!got)
                fail_msg("%s / %s: refused (%s), Jinja renders it", file, conv, errbuf);
            if (got_len != json_string_length(text) || memcmp(got, json_string_value(text), got_len) != 0)
                fail_msg("%s / %s (gen %d):\n got  %s\n want %s", file, conv, gen, got, json_string_value(text));
            matched++;
        } else {
            const char *why = refs_str(c, "error", &len);
            if (got)
                fail_msg("%s / %s: rendered, but Jinja raises \"%s\"", file, conv, why);
            assert_string_equal(errbuf, why);
            refused++;
        }
        free(got);
        ls_chat_template_destroy(&ct);
        ls_chat_template_destroy(&ct);  // idempotent
    }
    printf("[ chat templates ] %zu renderings byte-identical to Jinja, %zu refused as Jinja raises\n",
           matched, refused);
    refs_jsonl_free(cases);
}

static ls_chat_template_t *parse(const char *json) {
    errbuf[0] = '\0';
    return ls_chat_template_parse(json, strlen(json), "tokenizer_config.json", errbuf, sizeof errbuf);
}

static void test_detection(void **state) {
    (void)state;
    static const struct {
        const char *file;
        ls_chat_family_t family;
        const char *bos, *eos;
    } want[] = {{"llama3-instruct.json", LS_CHAT_LLAMA3, "<|begin_of_text|>", "<|eot_id|>"},
                {"qwen3.json", LS_CHAT_CHATML, "", "<|im_end|>"},
                {"llama2-chat.json", LS_CHAT_LLAMA2, "<s>", "</s>"},
                {"mistral-v0.1.json", LS_CHAT_MISTRAL, "<s>", "</s>"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/templates/%s", LS_REFS_DIR, want[i].file);
        ls_chat_template_t *ct = ls_chat_template_load(path, errbuf, sizeof errbuf);
        assert_non_null(ct);
        assert_int_equal(ls_chat_template_family(ct), want[i].family);
        assert_string_equal(ls_chat_template_bos(ct), want[i].bos);
        assert_string_equal(ls_chat_template_eos(ct), want[i].eos);
        ls_chat_template_destroy(&ct);
    }
    assert_string_equal(ls_chat_family_name(LS_CHAT_CHATML), "chatml");
}

static void test_refusals(void **state) {
    (void)state;
    // Zephyr: a template of no known family.
    assert_null(parse("{\"chat_template\": \"{% for message in messages %}{% if message['role'] == 'user' %}"
                      "{{ '<|user|>\\n' + message['content'] + eos_token }}{% endif %}{% endfor %}\"}"));
    assert_contains(errbuf, "tokenizer_config.json: chat template not recognized");
    assert_null(parse("{\"chat_template\": \"{{- bos_token }}{%- set date_string = '26 Jul 2024' %}"
                      "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{{- 'Cutting Knowledge Date: "
                      "December 2023\\n' }}\"}"));
    assert_contains(errbuf, "Llama-3.1+");
    assert_null(parse("{\"chat_template\": \"{{ '[INST]' + messages[0]['content'] + '[/INST]' }}\"}"));
    assert_contains(errbuf, "not a known Llama-2 or Mistral variant");
    assert_null(parse("{\"bos_token\": \"<s>\"}"));
    assert_contains(errbuf, "no chat_template");
    assert_null(parse("{\"chat_template\": [{\"name\": \"default\", \"template\": \"x\"}]}"));
    assert_contains(errbuf, "named template lists");
    assert_null(parse("not json"));
    assert_contains(errbuf, "not a JSON object");
    errbuf[0] = '\0';
    assert_null(ls_chat_template_load("/nonexistent/dir", errbuf, sizeof errbuf));
    assert_contains(errbuf, "cannot open");
    // Roles the renderers do not know are refused, not dropped.
    ls_chat_template_t *ct = parse("{\"chat_template\": \"{% for message in messages %}{{'<|im_start|>' + "
                                   "message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}{% endfor %}\"}");
    assert_non_null(ct);
    ls_chat_message_t tool[] = {{"user", "hi", 0}, {"tool", "{}", 0}};
    assert_null(ls_chat_template_render(ct, tool, 2, true, NULL, errbuf, sizeof errbuf));
    assert_contains(errbuf, "role \"tool\" is not supported");
    ls_chat_template_destroy(&ct);
    ls_chat_template_destroy(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_renderings),
        cmocka_unit_test(test_detection),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("text_chat_template", tests, NULL, NULL);
}
