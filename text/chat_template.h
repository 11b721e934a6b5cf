// chat_template: builds a chat prompt the way the model's Jinja chat_template would, for the
// template families loraserve knows, detected from tokenizer_config.json. Not a Jinja engine:
// each family is rendered by C code that matches the real templates byte for byte on ordinary
// conversations (system / user / assistant messages with string content), checked against
// @huggingface/jinja renderings of the real templates (tools/tokenizer-refs/).
//
// Families and the variants recognized inside them:
//   LLAMA3   "<|start_header_id|>": bos_token first, "<|start_header_id|>ROLE<|end_header_id|>\n\n"
//            + trimmed content + "<|eot_id|>" per message; the assistant header at the end when
//            add_generation_prompt (or always, for templates that do not test it). Llama-3.1+
//            templates (tools, "Cutting Knowledge Date" system block) are refused.
//   CHATML   "<|im_start|>": "<|im_start|>ROLE\n" + content + "<|im_end|>\n"; Qwen2/2.5's default
//            system prompt when the template carries one and the conversation has no system
//            message; Qwen3's <think> handling (reasoning stripped from earlier assistant turns, an
//            empty think block on an assistant turn after the last user turn).
//   LLAMA2   "[INST]" with "<<SYS>>": the system prompt folded into the first user turn,
//            bos_token before each "[INST]", contents stripped, eos_token after each answer.
//   MISTRAL  "[INST]" without "<<SYS>>" (Mistral-7B-Instruct v0.1/v0.2): bos_token once,
//            "[INST] content [/INST]", answer + eos_token (+ " " in v0.1). No system role.
// Templates with roles out of turn raise in Jinja; here they are refused with the same message.
// Anything else (tool messages, other templates) is refused with a sentence naming it.
#ifndef LS_CHAT_TEMPLATE_H
#define LS_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    LS_CHAT_LLAMA3 = 0,
    LS_CHAT_CHATML,
    LS_CHAT_LLAMA2,
    LS_CHAT_MISTRAL,
} ls_chat_family_t;

typedef struct ls_chat_template ls_chat_template_t;

typedef struct {
    const char *role;  // "system", "user" or "assistant"
    const char *content;
    size_t content_len;  // bytes of content, NUL bytes included; 0: strlen(content)
} ls_chat_message_t;

// Reads tokenizer_config.json (a file, or a model directory holding one). NULL + err when the
// file is unreadable, has no chat_template, or the template is not one of the families above.
ls_chat_template_t *ls_chat_template_load(const char *path, char *err, size_t errlen);
ls_chat_template_t *ls_chat_template_parse(const char *json, size_t len, const char *what, char *err,
                                           size_t errlen);
void ls_chat_template_destroy(ls_chat_template_t **ct);

ls_chat_family_t ls_chat_template_family(const ls_chat_template_t *ct);
const char *ls_chat_family_name(ls_chat_family_t f);
// bos_token / eos_token of tokenizer_config.json (strings or AddedToken objects); "" when unset.
const char *ls_chat_template_bos(const ls_chat_template_t *ct);
const char *ls_chat_template_eos(const ls_chat_template_t *ct);

// Renders n messages into a malloc'ed NUL-terminated prompt (its length in *len when len is
// not NULL). The prompt holds the special-token strings (BOS included), so encode it with
// special-token matching and without LS_TOKENIZE_ADD_SPECIAL. NULL + err for a conversation the
// template would reject (roles out of turn, an unknown role).
char *ls_chat_template_render(const ls_chat_template_t *ct, const ls_chat_message_t *msgs, size_t n,
                              bool add_generation_prompt, size_t *len, char *err, size_t errlen);

#endif
