// api_req — the request half of api.h: request bodies (OpenAI completions and chat, SGLang's
// /generate, vLLM's /tokenize and /detokenize, adapter admin bodies with tensors) into messages.
//
// Requests are parsed with jansson, which keeps each string's length: a prompt, stop string or
// chat content with a NUL ("a\u0000b") reaches the tokenizer whole, as HF tokenizers see it.
#include "api.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <jansson.h>

#include "grammar.h"
#include "ls_base64.h"
#include "ls_limits.h"
#include "text_utf8.h"

#define S_MAX_PROMPTS 1024    // prompts in one request
#define S_MAX_STOPS 32
#define S_MAX_TOP_LOGPROBS 20

typedef struct {
    char *err;
    size_t errlen;
    const char **param;
    gw_gen_t *g;
} s_ctx_t;

static int s_fail(s_ctx_t *x, const char *param, const char *fmt, const char *what) {
    snprintf(x->err, x->errlen, fmt, what);
    *x->param = param;
    return -1;
}

// Field readers: 0 when absent or null, 1 when read, -1 (error set) for a wrong type or range.
static int s_num(s_ctx_t *x, const json_t *o, const char *name, double lo, double hi, double *out) {
    const json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return s_fail(x, name, "'%s' must be a number", name);
    if (json_number_value(v) < lo || json_number_value(v) > hi) {
        snprintf(x->err, x->errlen, "'%s' must be between %g and %g", name, lo, hi);
        *x->param = name;
        return -1;
    }
    *out = json_number_value(v);
    return 1;
}

static int s_int(s_ctx_t *x, const json_t *o, const char *name, double lo, double hi, int64_t *out) {
    double d;
    int rc = s_num(x, o, name, lo, hi, &d);
    if (rc == 1 && d != floor(d))
        return s_fail(x, name, "'%s' must be an integer", name);
    if (rc == 1)
        *out = (int64_t)d;
    return rc;
}

static int s_bool(s_ctx_t *x, const json_t *o, const char *name, bool *out) {
    const json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return s_fail(x, name, "'%s' must be a boolean", name);
    *out = json_is_true(v);
    return 1;
}

// A JSON string that names something (a model, an adapter, a role): text may hold a NUL,
// a name may not (it would be cut at it, and name something else).
static bool s_is_name(const json_t *v) { return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v); }

static int s_str(s_ctx_t *x, const json_t *o, const char *name, const char **out) {
    const json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return 0;
    if (!s_is_name(v))
        return s_fail(x, name, "'%s' must be a string (without NUL characters)", name);
    *out = json_string_value(v);
    return 1;
}

// An array of ints (token ids): 1 when it is one, 0 when v is not an array of numbers.
static int s_ids(const json_t *v, ls_i32s_t *out) {
    if (!json_is_array(v))
        return 0;
    int n = (int)json_array_size(v);
    const json_t *e;
    size_t i;
    json_array_foreach(v, i, e) if (!json_is_number(e) || json_number_value(e) != floor(json_number_value(e)) ||
                                    json_number_value(e) < 0 || json_number_value(e) > INT32_MAX) return 0;
    out->v = n ? malloc((size_t)n * sizeof *out->v) : NULL;
    out->n = 0;
    json_array_foreach(v, i, e) out->v[out->n++] = (int32_t)json_number_value(e);
    return 1;
}

int gw_tensors_parse(const cJSON *root, size_t max_bytes, char **config, uint8_t **weights, size_t *weights_len,
                     char *err, size_t errlen, const char **param, const char **code) {
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "lora_tensors");
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "lora_config");
    const cJSON *path = cJSON_GetObjectItemCaseSensitive(root, "lora_path");
    *code = NULL;
    if (!cfg)
        cfg = cJSON_GetObjectItemCaseSensitive(root, "config_dict");
    // SGLang's serialized_tensors are pickled torch tensors: unpickling runs code, so they are
    // never read. The same weights come as the adapter's safetensors.
    if (cJSON_GetObjectItemCaseSensitive(root, "serialized_tensors")) {
        *param = "serialized_tensors";
        snprintf(err, errlen, "'serialized_tensors' (pickled tensors) is not accepted; send the adapter's "
                              "adapter_model.safetensors in base64 as 'lora_tensors', with 'lora_config'");
        return -1;
    }
    if (!tensors || cJSON_IsNull(tensors)) {
        if (cfg && !cJSON_IsNull(cfg)) {
            *param = "lora_tensors";
            snprintf(err, errlen, "'lora_config' comes with 'lora_tensors' (a load from tensors), not alone");
            return -1;
        }
        return 0;
    }
    *param = "lora_tensors";
    if (path && !cJSON_IsNull(path)) {
        snprintf(err, errlen, "give 'lora_path' or 'lora_tensors', not both");
        return -1;
    }
    if (!cJSON_IsString(tensors) || !*tensors->valuestring) {
        snprintf(err, errlen, "'lora_tensors' must be adapter_model.safetensors in base64 (a non-empty string)");
        return -1;
    }
    size_t n = strlen(tensors->valuestring), bad;
    // The exact size is known once decoded; an encoding this long is over the limit whatever
    // its padding, and is refused before any memory is taken for it.
    if (ls_base64_decoded_max(n) > max_bytes + 2) {
        snprintf(err, errlen, "'lora_tensors' is too large: about %zu bytes of safetensors, more than the %zu MiB limit "
                              "(--max-lora-tensor-mb)", ls_base64_decoded_max(n), max_bytes >> 20);
        *code = "too_large";
        return -1;
    }
    uint8_t *w = malloc(ls_base64_decoded_max(n) + 1);
    if (!w) {
        snprintf(err, errlen, "out of memory for 'lora_tensors'");
        return -1;
    }
    if (ls_base64_decode(tensors->valuestring, n, w, weights_len, &bad) < 0) {
        free(w);
        snprintf(err, errlen, "'lora_tensors' is not valid base64 (standard alphabet, padded, no whitespace): %s at "
                              "character %zu", bad == n ? "its length is not a multiple of 4" : "bad character", bad);
        return -1;
    }
    if (*weights_len > max_bytes) {
        free(w);
        snprintf(err, errlen, "'lora_tensors' is too large: %zu bytes of safetensors, more than the %zu MiB limit "
                              "(--max-lora-tensor-mb)", *weights_len, max_bytes >> 20);
        *code = "too_large";
        return -1;
    }
    if (!cJSON_IsObject(cfg)) {
        free(w);
        *param = "lora_config";
        snprintf(err, errlen, "'lora_config' must be the adapter_config.json object");
        return -1;
    }
    if (!(*config = cJSON_PrintUnformatted(cfg))) {
        free(w);
        snprintf(err, errlen, "out of memory for 'lora_config'");
        return -1;
    }
    *weights = w;
    return 1;
}

// Sampling parameters, by OpenAI's names (sglang = 0) or SGLang's sampling_params (sglang = 1).
static int s_sampling(s_ctx_t *x, const json_t *o, int sglang, gw_api_t api, ls_msg_sampling_params_t *sp, int *n) {
    double d;
    int64_t i;
    int rc;
    sp->temperature = 1.0f;  // both APIs' default
    sp->skip_special_tokens = true;
    if (api == GW_COMPLETIONS)
        sp->max_new_tokens = 16;  // OpenAI's default for completions
    const char *max_names[] = {"max_new_tokens", "max_tokens", "max_completion_tokens"};
    for (int k = sglang ? 0 : 1; k < (sglang ? 1 : 3); k++) {
        if ((rc = s_int(x, o, max_names[k], 1, 1 << 30, &i)) < 0)
            return -1;
        if (rc)
            sp->max_new_tokens = (uint32_t)i;
    }
    if ((rc = s_num(x, o, "temperature", 0, 100, &d)) < 0)
        return -1;
    if (rc)
        sp->temperature = (float)d;
    if ((rc = s_num(x, o, "top_p", 0, 1, &d)) < 0)
        return -1;
    if (rc) {
        if (d == 0)
            return s_fail(x, "top_p", "'%s' must be above 0", "top_p");
        sp->top_p = (float)d;
    }
    if ((rc = s_int(x, o, "top_k", -1, 1 << 30, &i)) < 0)
        return -1;
    if (rc)
        sp->top_k = (int32_t)i;
    if ((rc = s_num(x, o, "min_p", 0, 1, &d)) < 0)
        return -1;
    if (rc)
        sp->min_p = (float)d;
    if ((rc = s_num(x, o, "presence_penalty", -2, 2, &d)) < 0)
        return -1;
    if (rc)
        sp->presence_penalty = (float)d;
    if ((rc = s_num(x, o, "frequency_penalty", -2, 2, &d)) < 0)
        return -1;
    if (rc)
        sp->frequency_penalty = (float)d;
    if ((rc = s_num(x, o, "repetition_penalty", 0, 100, &d)) < 0)
        return -1;
    if (rc) {
        if (d == 0)
            return s_fail(x, "repetition_penalty", "'%s' must be above 0", "repetition_penalty");
        sp->repetition_penalty = (float)d;
    }
    const char *seed_names[] = {"seed", "sampling_seed"};
    for (int k = 0; k < 2; k++) {
        if ((rc = s_int(x, o, seed_names[k], -9007199254740991.0, 9007199254740991.0, &i)) < 0)
            return -1;
        if (rc) {
            sp->seed = (uint64_t)i;
            sp->has_seed = true;
        }
    }
    if ((rc = s_int(x, o, sglang ? "min_new_tokens" : "min_tokens", 0, 1 << 30, &i)) < 0)
        return -1;
    if (rc)
        sp->min_new_tokens = (uint32_t)i;
    if (s_bool(x, o, "ignore_eos", &sp->ignore_eos) < 0 || s_bool(x, o, "skip_special_tokens", &sp->skip_special_tokens) < 0)
        return -1;
    if ((rc = s_int(x, o, "n", 1, LS_MSG_MAX_N, &i)) < 0)
        return -1;
    *n = rc ? (int)i : 1;
    const json_t *stop = json_object_get(o, "stop");
    if (json_is_string(stop)) {
        sp->stop.v = malloc(sizeof *sp->stop.v);
        sp->stop.v[0] = ls_msg_textdup(json_string_value(stop), json_string_length(stop));
        sp->stop.n = 1;
    } else if (json_is_array(stop)) {
        int k = (int)json_array_size(stop);
        if (k > S_MAX_STOPS)
            return s_fail(x, "stop", "'%s' holds at most 32 strings", "stop");
        const json_t *e;
        size_t i;
        json_array_foreach(stop, i, e) if (!json_is_string(e)) return s_fail(x, "stop", "'%s' must be a string or a list of strings", "stop");
        sp->stop.v = k ? calloc((size_t)k, sizeof *sp->stop.v) : NULL;
        json_array_foreach(stop, i, e) sp->stop.v[sp->stop.n++] = ls_msg_textdup(json_string_value(e), json_string_length(e));
    } else if (stop && !json_is_null(stop))
        return s_fail(x, "stop", "'%s' must be a string or a list of strings", "stop");
    const json_t *stop_ids = json_object_get(o, "stop_token_ids");
    if (stop_ids && !json_is_null(stop_ids) && !s_ids(stop_ids, &sp->stop_token_ids))
        return s_fail(x, "stop_token_ids", "'%s' must be a list of token ids", "stop_token_ids");
    return 0;
}

// Structured output (docs/structured-output.md): at most one of OpenAI's response_format,
// SGLang's json_schema (a JSON string, or an object) and regex, vLLM's guided_json,
// guided_regex and guided_choice. The source goes to the tokenizer as it is (a schema as compact
// JSON, choices as the regex of their alternation); the tokenizer compiles it, so a schema
// outside the subset is its 400, named after the field by grammar_param.
static int s_grammar(s_ctx_t *x, const json_t *o, gw_api_t api, ls_msg_sampling_params_t *sp) {
    static const char *const fields[] = {"response_format", "guided_json", "guided_regex", "guided_choice",
                                         "json_schema", "regex"};
    const char *field = NULL;
    const json_t *v = NULL;
    for (size_t k = api == GW_GENERATE ? 4 : 0; k < sizeof fields / sizeof *fields; k++) {
        const json_t *f = json_object_get(o, fields[k]);
        if (!f || json_is_null(f))
            continue;
        if (!strcmp(fields[k], "response_format")) {  // {"type": "text"} asks for nothing
            const json_t *type = json_object_get(f, "type");
            if (!json_is_object(f) || !json_is_string(type))
                return s_fail(x, "response_format", "'%s' must be an object with a string 'type'", "response_format");
            if (!strcmp(json_string_value(type), "text"))
                continue;
        }
        if (field) {
            snprintf(x->err, x->errlen, "'%s' cannot be given with '%s': one structured output at a time", fields[k],
                     field);
            *x->param = fields[k];
            return -1;
        }
        field = fields[k];
        v = f;
    }
    if (!field)
        return 0;
    x->g->grammar_param = field;
    char *text = NULL;
    if (!strcmp(field, "response_format")) {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (!strcmp(type, "json_object")) {
            sp->grammar_kind = LS_GRAMMAR_KIND_JSON_OBJECT;
            return 0;
        }
        const json_t *js = json_object_get(v, "json_schema"), *schema = json_object_get(js, "schema");
        if (strcmp(type, "json_schema")) {
            x->g->err_code = "unsupported_parameter";
            return s_fail(x, field, "'%s' is not supported with this type: text, json_object and json_schema are", field);
        }
        if (!json_is_object(js) || !json_is_object(schema))
            return s_fail(x, field, "'%s' of type json_schema needs json_schema.schema, an object", field);
        sp->grammar_kind = LS_GRAMMAR_KIND_JSON_SCHEMA;
        text = json_dumps(schema, JSON_COMPACT);
    } else if (!strcmp(field, "guided_json") || !strcmp(field, "json_schema")) {
        sp->grammar_kind = LS_GRAMMAR_KIND_JSON_SCHEMA;
        if (json_is_string(v))
            text = strndup(json_string_value(v), json_string_length(v));
        else if (json_is_object(v))
            text = json_dumps(v, JSON_COMPACT);
        else
            return s_fail(x, field, "'%s' must be a JSON schema (an object, or a string holding one)", field);
    } else if (!strcmp(field, "guided_choice")) {
        if (!json_is_array(v) || !json_array_size(v))
            return s_fail(x, field, "'%s' must be a non-empty list of strings", field);
        ls_buf_t re = {0};
        const json_t *e;
        size_t i;
        json_array_foreach(v, i, e) {
            if (!json_is_string(e)) {
                ls_buf_free(&re);
                return s_fail(x, field, "'%s' must be a non-empty list of strings", field);
            }
            char *lit = ls_grammar_regex_escape(json_string_value(e), json_string_length(e));
            if (!lit || (i && ls_buf_append(&re, "|", 1) < 0) || ls_buf_append(&re, lit, strlen(lit)) < 0) {
                free(lit);
                ls_buf_free(&re);
                return s_fail(x, NULL, "%s", "out of memory");
            }
            free(lit);
        }
        sp->grammar_kind = LS_GRAMMAR_KIND_REGEX;
        text = re.s;
    } else {
        if (!json_is_string(v))
            return s_fail(x, field, "'%s' must be a string", field);
        sp->grammar_kind = LS_GRAMMAR_KIND_REGEX;
        text = strndup(json_string_value(v), json_string_length(v));
    }
    if (!text)
        return s_fail(x, NULL, "%s", "out of memory");
    sp->grammar = ls_msg_textdup(text, strlen(text));
    free(text);
    return sp->grammar.s ? 0 : s_fail(x, NULL, "%s", "out of memory");
}

// Fields the server knows but does not implement. Each is refused with a 400 naming it unless
// its value asks for nothing (absent, null, or the no-op value below), so no client believes an
// output was constrained, biased or tool-shaped when it was not. Unknown fields are accepted, as
// vLLM and OpenAI accept them; the few harmless known ones are listed in docs/api.md.
typedef enum {
    S_NOOP_NONE,       // only absent or null asks for nothing
    S_NOOP_EMPTY,      // an empty object, list or string
    S_NOOP_FALSE,      // false
    S_NOOP_NONE_STR,   // the string "none" or an empty list (tool_choice, function_call)
} s_noop_t;

typedef struct {
    const char *name;
    s_noop_t noop;
    unsigned apis;  // bit per gw_api_t: where the field is refused
    const char *what;
} s_unsupported_t;

#define S_OAI ((1u << GW_COMPLETIONS) | (1u << GW_CHAT))
#define S_ALL (S_OAI | (1u << GW_GENERATE))
#define S_CHATS ((1u << GW_CHAT) | (1u << GW_TOKENIZE))  // the fields of a chat, also in /tokenize
static const s_unsupported_t s_unsupported[] = {
    // structured output takes regexes and JSON schemas (docs/structured-output.md), not grammars
    {"ebnf", S_NOOP_NONE, S_ALL, "EBNF grammars are not supported (regex and json_schema are)"},
    {"structural_tag", S_NOOP_NONE, S_ALL, "structural tags are not supported (regex and json_schema are)"},
    {"guided_grammar", S_NOOP_NONE, S_OAI, "grammars are not supported (guided_regex and guided_json are)"},
    {"structured_outputs", S_NOOP_NONE, S_OAI, "use response_format, guided_json, guided_regex or guided_choice"},
    {"logit_bias", S_NOOP_EMPTY, S_ALL, "logit bias is not implemented"},
    {"allowed_token_ids", S_NOOP_EMPTY, S_OAI, "restricting the vocabulary is not implemented"},
    {"bad_words", S_NOOP_EMPTY, S_OAI, "banned words are not implemented"},
    // tools reach the chat template; the model's tool calls come back as text, not parsed
    {"tool_choice", S_NOOP_NONE_STR, 1u << GW_CHAT, "tool calls are not parsed from the output"},
    {"functions", S_NOOP_EMPTY, 1u << GW_CHAT, "function calling is not implemented"},
    {"function_call", S_NOOP_NONE_STR, 1u << GW_CHAT, "function calling is not implemented"},
    {"suffix", S_NOOP_EMPTY, 1u << GW_COMPLETIONS, "insertion (suffix) is not implemented"},
    {"use_beam_search", S_NOOP_FALSE, S_OAI, "beam search is not implemented"},
    {"prompt_logprobs", S_NOOP_NONE, S_OAI, "prompt logprobs are not implemented"},
    {"include_stop_str_in_output", S_NOOP_FALSE, S_OAI, "the matched stop string is never part of the text"},
    {"truncate_prompt_tokens", S_NOOP_NONE, S_OAI, "prompt truncation is not implemented"},
    {"chat_template", S_NOOP_NONE, S_CHATS, "a per-request chat template is not implemented"},
    {"continue_final_message", S_NOOP_FALSE, S_CHATS, "continuing the final message is not implemented"},
    {"documents", S_NOOP_EMPTY, S_CHATS, "documents are not implemented"},
    {"audio", S_NOOP_NONE, 1u << GW_CHAT, "audio output is not implemented"},
    {"prediction", S_NOOP_NONE, 1u << GW_CHAT, "predicted outputs are not implemented"},
    {"custom_logit_processor", S_NOOP_NONE, S_ALL, "custom logit processors are not implemented"},
    {"image_data", S_NOOP_NONE, 1u << GW_GENERATE, "images are not implemented"},
    {"return_text_in_logprobs", S_NOOP_FALSE, 1u << GW_GENERATE, "logprobs name tokens by id"},
    {"logprob_start_len", S_NOOP_NONE, 1u << GW_GENERATE, "prompt logprobs are not implemented"},
    {"no_stop_trim", S_NOOP_FALSE, 1u << GW_GENERATE, "the matched stop string is never part of the text"},
};

static bool s_is_noop(const json_t *v, s_noop_t noop) {
    if (!v || json_is_null(v))
        return true;
    switch (noop) {
    case S_NOOP_EMPTY:
        return (json_is_object(v) && !json_object_size(v)) || (json_is_array(v) && !json_array_size(v)) ||
               (json_is_string(v) && !json_string_length(v));
    case S_NOOP_FALSE: return json_is_false(v);
    case S_NOOP_NONE_STR:
        return (json_is_string(v) && !strcmp(json_string_value(v), "none")) || (json_is_array(v) && !json_array_size(v));
    default: return false;
    }
}

// 0, or -1 with the first unsupported field of o that asks for something named in param.
static int s_refuse_unsupported(s_ctx_t *x, const json_t *o, gw_api_t api) {
    for (size_t k = 0; k < sizeof s_unsupported / sizeof *s_unsupported; k++) {
        const s_unsupported_t *u = &s_unsupported[k];
        if ((u->apis & (1u << api)) && !s_is_noop(json_object_get(o, u->name), u->noop)) {
            snprintf(x->err, x->errlen, "'%s' is not supported: %s", u->name, u->what);
            *x->param = u->name;
            x->g->err_code = "unsupported_parameter";  // OpenAI's code for a parameter not taken
            return -1;
        }
    }
    return 0;
}

// A mix of adapters (docs/lora-mixing.md), the object v given as `field` (model, lora_path):
// {"adapters": [{"name": N, "weight": W}, ...], "combination": "cat"}, into q->mix (the rules:
// ls_msg_mix_check), or into q->adapter when it is one adapter at weight 1 (that adapter
// alone). 0, or -1 after s_fail.
static int s_mix(s_ctx_t *x, const json_t *v, const char *field, const char *base_model,
                 ls_msg_generate_req_t *q) {
    const char *key;
    const json_t *e, *ads = json_object_get(v, "adapters"), *comb = json_object_get(v, "combination");
    json_object_foreach((json_t *)v, key, e) if (strcmp(key, "adapters") && strcmp(key, "combination")) {
        snprintf(x->err, x->errlen, "'%s' as a mix takes 'adapters' and 'combination' only, not '%.64s'", field,
                 key);
        *x->param = field;
        return -1;
    }
    if (comb && !json_is_null(comb) && !(json_is_string(comb) && !strcmp(json_string_value(comb), "cat"))) {
        if (json_is_string(comb) && !strcmp(json_string_value(comb), "linear"))
            return s_fail(x, field, "'%s': the combination \"linear\" (PEFT's sqrt-weighted sums of A and of B, "
                          "with cross terms between the adapters) would need merged weights; only \"cat\" (the "
                          "weighted sum of the adapters' deltas) is served", field);
        return s_fail(x, field, "'%s': 'combination' must be \"cat\"", field);
    }
    size_t n = json_is_array(ads) ? json_array_size(ads) : 0;
    if (n > LS_LORA_MIX_MAX)
        n = LS_LORA_MIX_MAX + 1;  // ls_msg_mix_check names the bound
    q->mix.v = calloc(n ? n : 1, sizeof *q->mix.v);
    if (!q->mix.v)
        return s_fail(x, NULL, "%s", "out of memory");
    for (size_t i = 0; i < n; i++) {
        e = json_array_get(ads, i);
        const json_t *name = json_object_get(e, "name"), *w = json_object_get(e, "weight");
        const char *k2;
        const json_t *e2;
        bool other = false;
        if (json_is_object(e))
            json_object_foreach((json_t *)e, k2, e2) other |= strcmp(k2, "name") && strcmp(k2, "weight");
        if (!json_is_object(e) || other || !s_is_name(name) || !json_is_number(w))
            return s_fail(x, field, "'%s': each adapter of a mix is {\"name\": a string, \"weight\": a number}",
                          field);
        const char *ad = gw_adapter_of(json_string_value(name), base_model);
        if (!*ad)
            return s_fail(x, field, "'%s': the base model is not an adapter to mix", field);
        q->mix.v[q->mix.n++] = (ls_msg_mix_part_t){.name = ls_msg_strdup(ad), .weight = (float)json_number_value(w)};
    }
    char why[256];
    if (ls_msg_mix_check(&q->mix, false, why, sizeof why) < 0) {
        snprintf(x->err, x->errlen, "'%s': %s", field, why);
        *x->param = field;
        return -1;
    }
    if (n == 1 && q->mix.v[0].weight == 1.0f) {  // one adapter at weight 1: that adapter alone
        free(q->adapter);
        q->adapter = q->mix.v[0].name;
        free(q->mix.v);
        q->mix = (ls_msg_mix_parts_t){0};
    }
    return 0;
}

const char *gw_adapter_of(const char *model, const char *base_model) {
    if (!model || !*model || !strcmp(model, base_model))
        return "";
    size_t b = strlen(base_model);
    if (!strncmp(model, base_model, b) && model[b] == ':')
        return model + b + 1;
    return model;
}

// The list doubles when its count reaches a power of two: a request of a thousand prompts
// (refused or not) copies it a few times, not once a prompt.
static ls_msg_t *s_add_req(gw_gen_t *g) {
    size_t n = g->nreqs;
    if (!(n & (n - 1))) {
        ls_msg_t *r = realloc(g->reqs, (n ? 2 * n : 1) * sizeof *r);
        if (!r)
            return NULL;
        g->reqs = r;
    }
    ls_msg_init(&g->reqs[n], LS_MSG_GENERATE_REQ);
    return &g->reqs[g->nreqs++];
}

// Chat messages as the tokenizer takes them: the request's objects whole (roles, contents,
// tool calls, ...), for the chat template to read. jansson writes a NUL in a string as \u0000.
static char *s_chat_messages(s_ctx_t *x, const json_t *msgs) {
    if (!json_is_array(msgs) || !json_array_size(msgs)) {
        s_fail(x, "messages", "'%s' must be a non-empty list of messages", "messages");
        return NULL;
    }
    const json_t *m;
    size_t i;
    json_array_foreach(msgs, i, m) {
        const json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !s_is_name(json_object_get(m, "role"))) {
            s_fail(x, "messages", "each of '%s' must be an object with a string 'role'", "messages");
            return NULL;
        }
        if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content)) {
            s_fail(x, "messages", "a message's content in '%s' must be a string or a list of parts", "messages");
            return NULL;
        }
    }
    return json_dumps(msgs, JSON_COMPACT);
}

// An optional JSON field handed to the chat template as text: 0 (absent or null: *out NULL),
// or -1 when it is not of its kind (an array, or an object).
static int s_chat_json(s_ctx_t *x, const json_t *root, const char *name, bool array, char **out) {
    const json_t *v = json_object_get(root, name);
    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (array ? !json_is_array(v) : !json_is_object(v))
        return s_fail(x, name, array ? "'%s' must be a list" : "'%s' must be an object", name);
    if (!(*out = json_dumps(v, JSON_COMPACT)))
        return s_fail(x, NULL, "%s", "out of memory");
    return 0;
}

static int s_parse_openai(s_ctx_t *x, gw_gen_t *g, const json_t *root, const char *base_model) {
    const char *model = NULL;
    // a mix of adapters (an object): the answers carry it as JSON text
    const json_t *mix = json_object_get(root, "model");
    if (!json_is_object(mix) && s_str(x, root, "model", &model) < 0)
        return -1;
    g->model = json_is_object(mix) ? json_dumps(mix, JSON_COMPACT | JSON_SORT_KEYS)
                                   : strdup(model && *model ? model : base_model);
    if (s_refuse_unsupported(x, root, g->api) < 0)
        return -1;
    bool stream = false, logprobs = false, echo = false;
    if (s_bool(x, root, "stream", &stream) < 0 || s_bool(x, root, "echo", &echo) < 0)
        return -1;
    if (echo)
        return s_fail(x, "echo", "'%s' is not supported", "echo");
    g->stream = stream;
    const json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        bool usage = false;
        if (!json_is_object(so))
            return s_fail(x, "stream_options", "'%s' must be an object", "stream_options");
        if (s_bool(x, so, "include_usage", &usage) < 0)
            return -1;
        g->include_usage = usage;
    }
    int64_t i = 0;  // read only where s_int returned 1 and set it; the optimizer cannot see that
    int rc;
    if (g->api == GW_CHAT) {
        if (s_bool(x, root, "logprobs", &logprobs) < 0)
            return -1;
        if ((rc = s_int(x, root, "top_logprobs", 0, S_MAX_TOP_LOGPROBS, &i)) < 0)
            return -1;
        g->logprobs = logprobs;
        g->top_logprobs = rc ? (int)i : 0;
    } else {
        if ((rc = s_int(x, root, "logprobs", 0, S_MAX_TOP_LOGPROBS, &i)) < 0)
            return -1;
        g->logprobs = rc;
        g->top_logprobs = rc ? (int)i : 0;
    }
    ls_msg_sampling_params_t sp = {0};
    int rc2 = s_sampling(x, root, 0, g->api, &sp, &g->n);
    if (rc2 == 0)
        rc2 = s_grammar(x, root, g->api, &sp);
    // best_of > n asks to pick the best of several: only 1 and n (which picks nothing) are served.
    int64_t best_of = 1;
    if (rc2 == 0 && (rc2 = s_int(x, root, "best_of", 1, LS_MSG_MAX_N, &best_of)) > 0 && best_of != 1 && best_of != g->n) {
        g->err_code = "unsupported_parameter";
        rc2 = s_fail(x, "best_of", "'%s' is not supported: only 1 or equal to n", "best_of");
    } else if (rc2 > 0)
        rc2 = 0;
    ls_msg_t tmpl;  // the fields every prompt's GenerateReq shares
    ls_msg_init(&tmpl, LS_MSG_GENERATE_REQ);
    tmpl.u.generate_req.sampling = sp;
    if (rc2 < 0) {
        ls_msg_clear(&tmpl);
        return -1;
    }
    ls_msg_generate_req_t *t = &tmpl.u.generate_req;
    t->sampling.n = (uint32_t)g->n;
    t->sampling.logprobs = g->logprobs;
    t->sampling.top_logprobs = (uint32_t)g->top_logprobs;
    t->return_token_ids = g->logprobs;
    t->stream = g->stream;
    if (json_is_object(mix)) {
        if (s_mix(x, mix, "model", base_model, t) < 0) {
            ls_msg_clear(&tmpl);
            return -1;
        }
    } else
        t->adapter = ls_msg_strdup(gw_adapter_of(g->model, base_model));
    // Each prompt gets its own copy of the shared fields (a message owns its strings).
    char *enc;
    size_t enc_len;
    if (ls_msg_encode(&tmpl, &enc, &enc_len) < 0) {
        ls_msg_clear(&tmpl);
        return s_fail(x, NULL, "%s", "request too large");
    }
    ls_msg_clear(&tmpl);
    int ok = 0;
    if (g->api == GW_CHAT) {
        char *msgs = s_chat_messages(x, json_object_get(root, "messages")), *tools = NULL, *kwargs = NULL;
        ls_msg_t *r = msgs && s_chat_json(x, root, "tools", true, &tools) == 0 &&
                              s_chat_json(x, root, "chat_template_kwargs", false, &kwargs) == 0
                          ? s_add_req(g)
                          : NULL;
        if (r && ls_msg_decode(enc, enc_len, r, NULL) == 0) {
            r->u.generate_req.chat = true;
            r->u.generate_req.messages = msgs;
            r->u.generate_req.tools = tools;
            r->u.generate_req.chat_template_kwargs = kwargs;
            ok = 1;
        } else {
            free(msgs);
            free(tools);
            free(kwargs);
        }
        free(enc);
        return ok ? 0 : -1;
    }
    const json_t *prompt = json_object_get(root, "prompt");
    const json_t *items[S_MAX_PROMPTS];
    int nitems = 0;
    ls_i32s_t ids = {0};
    if (json_is_string(prompt) || (json_is_array(prompt) && (int)json_array_size(prompt) && s_ids(prompt, &ids)))
        items[nitems++] = prompt;  // one text, or one token id list
    else if (json_is_array(prompt) && (int)json_array_size(prompt) && (int)json_array_size(prompt) <= S_MAX_PROMPTS) {
        const json_t *e;
        size_t i;
        json_array_foreach(prompt, i, e) items[nitems++] = e;
    }
    free(ids.v);
    if (!nitems) {
        free(enc);
        return s_fail(x, "prompt", "'%s' must be a string, a list of strings, a list of token ids or a list of those",
                      "prompt");
    }
    for (int k = 0; k < nitems; k++) {
        ls_msg_t *r = s_add_req(g);
        if (!r || ls_msg_decode(enc, enc_len, r, NULL) < 0) {
            free(enc);
            return s_fail(x, NULL, "%s", "out of memory");
        }
        if (json_is_string(items[k]))
            r->u.generate_req.text = ls_msg_textdup(json_string_value(items[k]), json_string_length(items[k]));
        else if (!s_ids(items[k], &r->u.generate_req.input_ids) || !r->u.generate_req.input_ids.n) {
            free(enc);
            return s_fail(x, "prompt", "'%s' must be a string, a list of strings, a list of token ids or a list of those",
                          "prompt");
        }
    }
    free(enc);
    return 0;
}

static int s_parse_generate(s_ctx_t *x, gw_gen_t *g, const json_t *root, const char *base_model) {
    g->model = strdup(base_model);
    if (s_refuse_unsupported(x, root, GW_GENERATE) < 0)
        return -1;
    bool stream = false, logprob = false;
    if (s_bool(x, root, "stream", &stream) < 0 || s_bool(x, root, "return_logprob", &logprob) < 0)
        return -1;
    int64_t top = 0;
    if (s_int(x, root, "top_logprobs_num", 0, S_MAX_TOP_LOGPROBS, &top) < 0)
        return -1;
    g->stream = stream;
    g->logprobs = logprob;
    g->top_logprobs = logprob ? (int)top : 0;
    const json_t *text = json_object_get(root, "text");
    const json_t *input_ids = json_object_get(root, "input_ids");
    const json_t *lora = json_object_get(root, "lora_path");
    const json_t *params = json_object_get(root, "sampling_params");
    const json_t *input = input_ids && !json_is_null(input_ids) ? input_ids : text;
    const char *what = input && input == input_ids ? "input_ids" : "text";
    int n_in = 0, list = 0;
    ls_i32s_t probe = {0};
    if (input == text && json_is_string(text))
        n_in = 1;
    else if (input == input_ids && s_ids(input_ids, &probe) && probe.n)
        n_in = 1;
    else if (json_is_array(input) && (int)json_array_size(input) && (int)json_array_size(input) <= S_MAX_PROMPTS) {
        n_in = (int)json_array_size(input);
        list = 1;
    }
    free(probe.v);
    if (!n_in)
        return s_fail(x, what, "'%s' must be given: a string or list of strings (text), a list of token ids or a list of "
                               "those (input_ids)", what);
    if (json_is_array(lora) && (!list || (int)json_array_size(lora) != n_in))
        return s_fail(x, "lora_path", "'%s' as a list must have one entry per input", "lora_path");
    if (json_is_array(params) && (!list || (int)json_array_size(params) != n_in))
        return s_fail(x, "sampling_params", "'%s' as a list must have one entry per input", "sampling_params");
    for (int k = 0; k < n_in; k++) {
        const json_t *in = list ? json_array_get(input, k) : input;
        const json_t *lp = json_is_array(lora) ? json_array_get(lora, k) : lora;
        const json_t *pp = json_is_array(params) ? json_array_get(params, k) : params;
        ls_msg_t *r = s_add_req(g);
        if (!r)
            return s_fail(x, NULL, "%s", "out of memory");
        ls_msg_generate_req_t *q = &r->u.generate_req;
        if (input == text) {
            if (!json_is_string(in))
                return s_fail(x, "text", "'%s' must be a string or a list of strings", "text");
            q->text = ls_msg_textdup(json_string_value(in), json_string_length(in));
        } else if (!s_ids(in, &q->input_ids) || !q->input_ids.n)
            return s_fail(x, "input_ids", "'%s' must be a list of token ids or a list of those", "input_ids");
        if (json_is_object(lp)) {
            if (s_mix(x, lp, "lora_path", base_model, q) < 0)
                return -1;
        } else if (lp && !json_is_null(lp) && !s_is_name(lp))
            return s_fail(x, "lora_path", "'%s' must be an adapter name, a mix of adapters, null, or a list of "
                          "those", "lora_path");
        else
            q->adapter = ls_msg_strdup(json_is_string(lp) ? gw_adapter_of(json_string_value(lp), base_model) : "");
        if (pp && !json_is_null(pp) && !json_is_object(pp))
            return s_fail(x, "sampling_params", "'%s' must be an object or a list of objects", "sampling_params");
        if (json_is_object(pp) && s_refuse_unsupported(x, pp, GW_GENERATE) < 0)
            return -1;
        int n = 1;
        json_t *empty = json_object();
        int rc = s_sampling(x, pp && json_is_object(pp) ? pp : empty, 1, GW_GENERATE, &q->sampling, &n);
        json_decref(empty);
        if (rc < 0 || s_grammar(x, pp && json_is_object(pp) ? pp : root, GW_GENERATE, &q->sampling) < 0)
            return -1;
        if (k && n != g->n)
            return s_fail(x, "sampling_params", "'%s' must ask for the same n for every input", "sampling_params");
        g->n = n;
        q->sampling.n = (uint32_t)n;
        q->sampling.logprobs = g->logprobs;
        q->sampling.top_logprobs = (uint32_t)g->top_logprobs;
        q->stream = g->stream;
        q->return_token_ids = true;
    }
    g->list = list || g->n > 1;
    return 0;
}

int gw_gen_parse(gw_gen_t *g, gw_api_t api, const char *body, size_t len, const char *base_model, char *err,
                 size_t errlen, const char **param) {
    memset(g, 0, sizeof *g);
    g->api = api;
    g->n = 1;
    *param = NULL;
    s_ctx_t x = {err, errlen, param, g};
    // Numbers as doubles, as JavaScript and cJSON read them (a seed of 2^64 is a range error,
    // not a parse error); strings keep their NUL bytes.
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &jerr);
    if (!root) {
        snprintf(err, errlen, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                 jerr.column);
        return -1;
    }
    int rc;
    if (!json_is_object(root))
        rc = s_fail(&x, NULL, "%s", "the body must be a JSON object");
    else
        rc = api == GW_GENERATE ? s_parse_generate(&x, g, root, base_model) : s_parse_openai(&x, g, root, base_model);
    json_decref(root);
    return rc;
}

void gw_gen_clear(gw_gen_t *g) {
    for (size_t i = 0; i < g->nreqs; i++)
        ls_msg_clear(&g->reqs[i]);
    free(g->reqs);
    free(g->model);
    memset(g, 0, sizeof *g);
}

// ---------------------------------------------------------------------------------------------
// /tokenize and /detokenize

static int s_parse_tokenize(s_ctx_t *x, const json_t *root, bool detokenize, ls_msg_tokenize_req_t *q) {
    if (detokenize) {
        q->detokenize = true;
        if (!s_ids(json_object_get(root, "tokens"), &q->input_ids))
            return s_fail(x, "tokens", "'%s' must be a list of token ids", "tokens");
        return 0;
    }
    if (s_refuse_unsupported(x, root, GW_TOKENIZE) < 0)
        return -1;
    const json_t *prompt = json_object_get(root, "prompt"), *msgs = json_object_get(root, "messages");
    q->chat = msgs && !json_is_null(msgs);
    if (q->chat == (prompt && !json_is_null(prompt)))
        return s_fail(x, q->chat ? "prompt" : "messages", "give exactly one of 'prompt' and '%s'", "messages");
    bool add_special = !q->chat, add_gen = true, strs = false;  // vLLM's defaults
    if (s_bool(x, root, "add_special_tokens", &add_special) < 0 || s_bool(x, root, "add_generation_prompt", &add_gen) < 0 ||
        s_bool(x, root, "return_token_strs", &strs) < 0)
        return -1;
    q->add_special_tokens = add_special;
    q->add_generation_prompt = add_gen;
    q->return_token_strs = strs;
    if (!q->chat) {
        if (!json_is_string(prompt))
            return s_fail(x, "prompt", "'%s' must be a string", "prompt");
        q->text = ls_msg_textdup(json_string_value(prompt), json_string_length(prompt));
        return 0;
    }
    if (!(q->messages = s_chat_messages(x, msgs)) || s_chat_json(x, root, "tools", true, &q->tools) < 0 ||
        s_chat_json(x, root, "chat_template_kwargs", false, &q->chat_template_kwargs) < 0)
        return -1;
    return 0;
}

int gw_tokenize_parse(ls_msg_t *out, bool detokenize, const char *body, size_t len, const char *base_model,
                      char **model, char *err, size_t errlen, const char **param, const char **code) {
    gw_gen_t g = {.api = GW_TOKENIZE};  // takes the error code of a refused field
    s_ctx_t x = {err, errlen, param, &g};
    ls_msg_init(out, LS_MSG_TOKENIZE_REQ);
    *model = NULL;
    *param = *code = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &jerr);
    if (!root) {
        snprintf(err, errlen, "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
        return -1;
    }
    const char *name = NULL;
    int rc = !json_is_object(root)                 ? s_fail(&x, NULL, "%s", "the body must be a JSON object")
             : s_str(&x, root, "model", &name) < 0 ? -1
                                                   : s_parse_tokenize(&x, root, detokenize, &out->u.tokenize_req);
    if (rc == 0 && !(*model = strdup(name && *name ? name : base_model)))
        rc = s_fail(&x, NULL, "%s", "out of memory");
    json_decref(root);
    *code = g.err_code;
    if (rc < 0)
        ls_msg_clear(out);
    return rc;
}
