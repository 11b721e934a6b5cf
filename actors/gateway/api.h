// api — the gateway's translation between HTTP bodies and messages: OpenAI completions and chat
// completions and SGLang's /generate requests become GenerateReq messages (one per prompt), and
// the TextOut answers become OpenAI or SGLang JSON, whole or as SSE chunks. Pure functions over
// JSON text and messages; the actor (main.c) does the I/O. Requests are parsed in api_req.c,
// answers built in api_resp.c.
#ifndef GW_API_H
#define GW_API_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "http.h"
#include "ls_msg.h"

// The API a body belongs to (GW_TOKENIZE: vLLM's /tokenize, parsed by gw_tokenize_parse).
typedef enum { GW_COMPLETIONS, GW_CHAT, GW_GENERATE, GW_TOKENIZE } gw_api_t;

// A parsed generation request.
typedef struct {
    gw_api_t api;
    char *model;        // the model name answers carry (OpenAI), as the client gave it
    int stream;
    int include_usage;  // stream_options.include_usage: a last chunk with usage
    int logprobs;       // answer with logprobs
    int top_logprobs;   // alternatives per token in them
    int n;              // completions per prompt
    int list;           // /generate: the answer is a list (list input or n > 1)
    ls_msg_t *reqs;     // one GenerateReq per prompt, rid unset
    size_t nreqs;
    const char *err_code;  // after a failed parse: OpenAI's error code (a static string), or NULL
    const char *grammar_param;  // the field a structured-output grammar came from (a static
                                // string), named by a 400 when the tokenizer refuses it; or NULL
} gw_gen_t;

// Parse a request body. Returns 0, or -1 with err (and *param naming the offending field, or
// NULL; g->err_code) for a 400 answer. base_model: the name that means "no adapter".
int gw_gen_parse(gw_gen_t *g, gw_api_t api, const char *body, size_t len, const char *base_model, char *err,
                 size_t errlen, const char **param);
void gw_gen_clear(gw_gen_t *g);

// The adapter a model name asks for: "" for the base model (its name, empty, or NULL), the part
// after "base:" for "base:adapter", otherwise the name itself.
const char *gw_adapter_of(const char *model, const char *base_model);

// vLLM's /tokenize body ({"model", "prompt"} or {"model", "messages", "add_generation_prompt",
// "tools", "chat_template_kwargs"}, with "add_special_tokens", "return_token_strs"), or with
// detokenize its /detokenize body ({"model", "tokens"}), into a TokenizeReq (*out, initialised
// here) and the model named (*model, malloc'd: base_model when absent). 0, or -1 with err,
// *param (the field, or NULL) and *code (OpenAI's error code, a static string, or NULL) for a 400.
int gw_tokenize_parse(ls_msg_t *out, bool detokenize, const char *body, size_t len, const char *base_model,
                      char **model, char *err, size_t errlen, const char **param, const char **code);
// The answer to it: {"count", "max_model_len", "tokens", "token_strs"} (token_strs null unless
// asked for), or {"prompt"} for a detokenize. NULL when out of memory or the text is not UTF-8.
char *gw_tokenize_answer(const ls_msg_tokenize_resp_t *r, bool detokenize, bool token_strs);
// A load from tensors in an adapter admin body (root): lora_config (SGLang's name: config_dict),
// the adapter_config.json object, and lora_tensors, the adapter_model.safetensors bytes in
// strict base64 (common/ls_base64.h), at most max_bytes of them. 0 when the body has no
// lora_tensors (a load from lora_path); 1 with *config (its JSON text) and *weights, both the
// caller's to free; -1 with err, *param and *code (an OpenAI error code, or NULL) for a 400.
int gw_tensors_parse(const cJSON *root, size_t max_bytes, char **config, uint8_t **weights, size_t *weights_len,
                     char *err, size_t errlen, const char **param, const char **code);

// What one completion produced so far.
typedef struct {
    gw_buf_t text;
    ls_i32s_t ids;
    ls_f32s_t lps;
    ls_i32s_t top_ids;
    ls_f32s_t top_lps;
    ls_texts_t texts, top_texts;  // the tokens' texts (TextOut.token_texts, top_texts); names by id when short
    bool texts_partial;           // a piece came without texts: the arrays no longer line up with ids
    uint32_t finish;  // FinishReason; NONE while it runs
    ls_text_t matched_stop;  // s NULL: none
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
} gw_choice_t;

// Add a TextOut's piece and counts. -1 when out of memory.
int gw_choice_add(gw_choice_t *c, const ls_msg_text_out_t *t);
void gw_choice_clear(gw_choice_t *c);

// The whole answer, when every choice has finished (choices[p * n + i]: prompt p, completion i).
char *gw_answer_json(const gw_gen_t *g, const char *id, long created, const gw_choice_t *choices);
// One SSE chunk's JSON for TextOut t of choice `index`; c is that choice with t added (SGLang's
// chunks are cumulative). first: the choice's first chunk (chat: the assistant role).
char *gw_answer_chunk(const gw_gen_t *g, const char *id, long created, size_t index, const ls_msg_text_out_t *t,
                      const gw_choice_t *c, int first);
// The last chunk of an OpenAI stream with stream_options.include_usage.
char *gw_answer_usage_chunk(const gw_gen_t *g, const char *id, long created, const gw_choice_t *choices);

#endif
