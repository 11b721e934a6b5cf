// chat_template: a model's own chat template (Jinja, rendered by text/jinja.h) and the context
// Hugging Face's apply_chat_template gives it.
//
// Where the template comes from, as transformers reads it: `chat_template.jinja` beside
// tokenizer_config.json when there is one, else tokenizer_config.json's `chat_template` — a
// string, or a list of {"name", "template"} of which "default" is used, or "tool_use" when the
// request gives tools and the list has one. An explicit template file (--chat-template)
// replaces both.
//
// What a render sees: messages (the request's JSON array, passed through: roles, content as a
// string or a list of parts, tool_calls, tool_call_id, name, reasoning_content, ...), tools
// (the request's JSON array, or none), documents (none), add_generation_prompt, bos_token,
// eos_token and the other special tokens of tokenizer_config.json (unk, pad, sep, cls, mask,
// additional_special_tokens), and any extra variables the request names
// (chat_template_kwargs, e.g. enable_thinking). A content that is a list of text parts only is
// joined into one string (with "\n", as vLLM does for templates that print content as a string)
// so that string-only templates accept it; a list with other parts is refused.
#ifndef LS_CHAT_TEMPLATE_H
#define LS_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct ls_chat_template ls_chat_template_t;

// Reads tokenizer_config.json (path is the file, or the model directory holding it) and the
// template (template_file when not NULL, else chat_template.jinja beside the config, else the
// config's chat_template). NULL + err when a file is unreadable, there is no template, or the
// template does not parse (the error names the file, line and column).
ls_chat_template_t *ls_chat_template_load(const char *path, const char *template_file, char *err, size_t errlen);
// The same from memory: config is tokenizer_config.json's text (what names it in errors);
// template, when not NULL, replaces the config's chat_template.
ls_chat_template_t *ls_chat_template_parse(const char *config, size_t len, const char *template_src,
                                           size_t template_len, const char *what, char *err, size_t errlen);
void ls_chat_template_destroy(ls_chat_template_t **ct);

// bos_token / eos_token of tokenizer_config.json (strings or AddedToken objects); "" when unset.
const char *ls_chat_template_bos(const ls_chat_template_t *ct);
const char *ls_chat_template_eos(const ls_chat_template_t *ct);

typedef struct {
    const char *messages;  // a JSON array of message objects (required)
    size_t messages_len;
    const char *tools;     // a JSON array of tool definitions; NULL: none
    size_t tools_len;
    const char *kwargs;    // a JSON object of extra template variables; NULL: none
    size_t kwargs_len;
    bool add_generation_prompt;
    int64_t now_s;         // the clock strftime_now reads (seconds since the epoch)
} ls_chat_args_t;

// The arguments of NUL-terminated JSON texts (tools and kwargs may be NULL).
static inline ls_chat_args_t ls_chat_args(const char *messages, const char *tools, const char *kwargs,
                                          bool add_generation_prompt, int64_t now_s) {
    return (ls_chat_args_t){.messages = messages,
                            .messages_len = strlen(messages),
                            .tools = tools,
                            .tools_len = tools ? strlen(tools) : 0,
                            .kwargs = kwargs,
                            .kwargs_len = kwargs ? strlen(kwargs) : 0,
                            .add_generation_prompt = add_generation_prompt,
                            .now_s = now_s};
}

// Renders into a malloc'ed NUL-terminated prompt (its length, NUL bytes included, in *len when
// len is not NULL). The prompt holds the special-token strings (BOS included), so encode it
// with special-token matching and without LS_TOKENIZE_ADD_SPECIAL. NULL + err for malformed
// arguments or a template error (raise_exception, a type error, an undefined call): err then
// starts with "chat template: ".
char *ls_chat_template_render(const ls_chat_template_t *ct, const ls_chat_args_t *args, size_t *len, char *err,
                              size_t errlen);

#endif
