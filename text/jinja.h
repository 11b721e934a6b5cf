// jinja: the Jinja dialect of Hugging Face chat templates, parsed once and rendered many times.
//
// The reference is @huggingface/jinja (the engine transformers.js and the HF Hub use), whose
// behaviour this follows where it differs from Python's Jinja2: templates are preprocessed with
// trim_blocks and lstrip_blocks (as transformers' apply_chat_template configures Jinja2); `none`
// and undefined values print nothing; booleans print `true`/`false`; `tojson` separates with
// ", " and ": "; `x.strip(chars)` ignores chars; `a < b` compares numbers only. See
// docs/chat-templates.md for the full list of what is covered and the known gaps.
//
// A template is untrusted input: parsing and rendering never assert on it and never crash; a
// render stops with an error at a recursion depth, an amount of work, of memory or of output
// (the limits below). Errors are one sentence, with "(line L, column C)" where it is known.
#ifndef LS_JINJA_H
#define LS_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct ls_jinja ls_jinja_t;

// Limits of one render.
#define LS_JINJA_MAX_DEPTH 500                  // nested evaluation (macros calling macros count)
#define LS_JINJA_MAX_STEPS 5000000              // statements and expressions evaluated
#define LS_JINJA_MAX_MEMORY (128u << 20)        // bytes one render allocates (none is freed early)
#define LS_JINJA_MAX_OUTPUT (16u << 20)         // bytes of any one rendered text

// Parses len bytes of template source (NUL bytes are an error). NULL + err.
ls_jinja_t *ls_jinja_parse(const char *src, size_t len, char *err, size_t errlen);
void ls_jinja_destroy(ls_jinja_t **t);

// Renders with the keys of vars (a JSON object; NULL: none) as global variables, beside the
// built-ins (namespace, range, raise_exception, strftime_now, true/false/none and their
// capitalized forms). now_s is the clock strftime_now reads (seconds since the epoch, shown in
// local time), so a render is a function of its arguments. Returns the malloc'ed text, NUL
// terminated (its length, NUL bytes inside included, in *len), or NULL + err.
char *ls_jinja_render(const ls_jinja_t *t, const json_t *vars, int64_t now_s, size_t *len, char *err,
                      size_t errlen);

#endif
