// grammar — structured output: a regular expression, a JSON schema or "any JSON object"
// compiled to a DFA over bytes, and the token masks that keep a sampler inside it
// (docs/structured-output.md).
//
// A grammar is a DFA whose states are ints: ls_grammar_start's state, ls_grammar_step per byte,
// -1 once the input can no longer become a match. Every state the DFA keeps can still reach an
// accepting state (dead ends are pruned to -1), so "walks without dying" means "is still the
// prefix of some match". Matching is whole-input (the regex is implicitly anchored).
//
// Regex subset (bytes in, UTF-8 aware): literals (UTF-8 characters as their bytes), escapes
// \d \D \w \W \s \S (ASCII classes) \n \r \t \f \v \xHH \uHHHH and escaped punctuation, `.` (one
// UTF-8 character other than \n), classes [a-z0-9_] and [^...] (a negated class matches every
// non-ASCII character; non-ASCII characters in a class are taken one by one, not in ranges),
// groups ( ) and (?: ), alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy `?` after one is
// accepted and means nothing for a whole match), `^` at the start and `$` at the end. Refused,
// with a sentence: backreferences, lookaround, other anchors, named groups, flags.
//
// Hostile inputs are bounded: the source length, the NFA size (counted repetitions are
// expanded), the DFA states and the work of the construction, each a clear error.
#ifndef LS_GRAMMAR_H
#define LS_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    LS_GRAMMAR_MAX_SOURCE = 64 * 1024,  // bytes of a regex or schema
    LS_GRAMMAR_MAX_NFA = 200000,        // NFA states after expanding counted repetitions
    LS_GRAMMAR_MAX_STATES = 50000,      // DFA states
    LS_GRAMMAR_JSON_DEPTH = 4,          // nesting of objects/arrays in json_object mode; free-form
                                        // values in a schema nest one less
    LS_GRAMMAR_SCHEMA_DEPTH = 16,       // nesting of a schema's subschemas ($ref included)
};

// What a grammar source is; the values are those of GrammarKind (messages/schema.msg).
typedef enum {
    LS_GRAMMAR_SRC_NONE = 0,
    LS_GRAMMAR_SRC_REGEX = 1,        // source: the regex
    LS_GRAMMAR_SRC_JSON_SCHEMA = 2,  // source: a JSON schema (JSON text)
    LS_GRAMMAR_SRC_JSON_OBJECT = 3,  // source ignored: any JSON object (OpenAI's json_object)
} ls_grammar_src_t;

typedef struct ls_grammar ls_grammar_t;

// The regex a JSON schema stands for (malloc'd, NUL-terminated), Outlines style: objects with
// their properties in schema order, no whitespace but one optional space after ':' and ','.
// NULL + err naming the keyword and its place in the schema ("at /properties/age: ...").
char *ls_grammar_schema_regex(const char *schema, size_t len, char *err, size_t errlen);
// Any JSON object nested at most LS_GRAMMAR_JSON_DEPTH deep, same whitespace policy (malloc'd).
char *ls_grammar_json_object_regex(void);
// s (n bytes) as a regex matching exactly it (malloc'd): vLLM's guided_choice is the
// alternation of these.
char *ls_grammar_regex_escape(const char *s, size_t n);

// Compiles a regex. NULL + err (a sentence naming the problem and its offset) when it is
// outside the subset or over a bound.
ls_grammar_t *ls_grammar_compile(const char *regex, size_t len, char *err, size_t errlen);
// Compiles a source of kind (the regex of a schema, of json_object, or the regex itself).
ls_grammar_t *ls_grammar_compile_kind(ls_grammar_src_t kind, const char *src, size_t len, char *err,
                                      size_t errlen);
void ls_grammar_destroy(ls_grammar_t **self_p);

int ls_grammar_start(const ls_grammar_t *self);
int ls_grammar_n_states(const ls_grammar_t *self);
// The state after byte b, or -1.
int ls_grammar_step(const ls_grammar_t *self, int state, uint8_t b);
// The state after n bytes, or -1 (state -1 stays -1).
int ls_grammar_walk(const ls_grammar_t *self, int state, const void *bytes, size_t n);
bool ls_grammar_accepting(const ls_grammar_t *self, int state);
// Accepting, and no byte leads on: only the end of the output may follow.
bool ls_grammar_final(const ls_grammar_t *self, int state);
bool ls_grammar_matches(const ls_grammar_t *self, const void *bytes, size_t n);

// ---- token masks --------------------------------------------------------------------------
// A vocabulary as bytes (each token's bytes as they appear mid-text; special tokens have none)
// in a trie, and per (grammar, state) the bitmask of tokens whose bytes walk the DFA without
// dying: (V + 31) / 32 words, bit v % 32 of word v / 32. End-of-sequence ids are not in it (they
// have no bytes): the caller allows them where ls_grammar_accepting. Masks are computed on first
// use by one walk of the trie beside the DFA and kept in an LRU bounded by bytes.
typedef struct ls_token_masker ls_token_masker_t;

// tokens[v] (lens[v] bytes; len 0: never allowed) for v < V; copied. cache_bytes bounds the
// masks kept. NULL on out of memory.
ls_token_masker_t *ls_token_masker_new(int32_t V, const char *const *tokens, const uint32_t *lens,
                                       size_t cache_bytes);
void ls_token_masker_destroy(ls_token_masker_t **self_p);
int ls_token_masker_words(const ls_token_masker_t *self);
// The mask of state of g: valid until the next call on self, or NULL on out of memory. The
// cache keeps masks of g until ls_token_masker_detach(self, g), which must come before g is
// destroyed.
const uint32_t *ls_token_masker_mask(ls_token_masker_t *self, ls_grammar_t *g, int state);
// Detaches g from the cache (its masks are dropped); call before ls_grammar_destroy.
void ls_token_masker_detach(ls_token_masker_t *self, ls_grammar_t *g);
// The bytes the cache holds, and how many masks were computed / served from the cache.
size_t ls_token_masker_bytes(const ls_token_masker_t *self);
uint64_t ls_token_masker_misses(const ls_token_masker_t *self);
uint64_t ls_token_masker_hits(const ls_token_masker_t *self);

#endif
