// tokenizer: HF tokenizer.json (BPE models) in C — encode text to ids, decode ids to text, and
// decode incrementally for streaming with stop strings.
//
// Supported, each as the HF `tokenizers` library does it (checked against its Rust code through
// the @anush008/tokenizers binding; see docs/tokenizer.md):
//   model       BPE, merges as "a b" strings or [a, b] pairs; byte_fallback, fuse_unk,
//               ignore_merges, unk_token. Merges by rank with a heap over a linked list of
//               symbols; a word cache in front.
//   added       added_tokens (single_word, lstrip, rstrip, normalized, special), matched
//               leftmost-longest before any splitting; normalized ones after the normalizer.
//   normalizer  NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Strip, Prepend, Replace (string or
//               regex), Sequence.
//   pre-tok     Split (regex or string; Removed, Isolated, MergedWithPrevious, MergedWithNext,
//               Contiguous; invert), ByteLevel (add_prefix_space, use_regex), Metaspace
//               (prepend_scheme always/first/never or legacy add_prefix_space; split), Sequence.
//               Regexes run on PCRE2 in UTF mode with Unicode properties (JIT when available).
//   decoder     ByteLevel alone; or a Sequence of Replace (string) / Metaspace, then
//               ByteFallback, Fuse, Strip (leading only, after Fuse) in that order.
//   post-proc   TemplateProcessing, ByteLevel, Sequence: the ids it puts before and after a
//               single sequence are exposed; encode adds them only when asked.
// Anything else (WordPiece/Unigram/WordLevel models, another pre-tokenizer or decoder, BPE
// dropout, subword prefixes/suffixes) is refused at load with a sentence naming it.
//
// Known limits: the Unicode tables are utf8proc's and PCRE2's, which may trail Rust's for
// characters assigned very recently.
// A tokenizer is not thread-safe (the word cache and regex scratch live in it): use one per
// thread. It must outlive every ls_detok_t made from it.
#ifndef LS_TOKENIZER_H
#define LS_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ls_tokenizer ls_tokenizer_t;

// A growable array of token ids. Zero-initialize; encode appends; ls_token_ids_free releases.
typedef struct {
    int32_t *ids;
    size_t n;
    size_t cap;
} ls_token_ids_t;

void ls_token_ids_free(ls_token_ids_t *v);

// Loads a tokenizer.json. NULL + one sentence naming the file and the cause in err.
ls_tokenizer_t *ls_tokenizer_load(const char *path, char *err, size_t errlen);
// Same from text of len bytes; what names the source in error messages.
ls_tokenizer_t *ls_tokenizer_parse(const char *json, size_t len, const char *what, char *err,
                                   size_t errlen);
void ls_tokenizer_destroy(ls_tokenizer_t **t);

enum {
    // Add the post-processor's tokens (e.g. Llama's BOS) around the sequence.
    LS_TOKENIZE_ADD_SPECIAL = 1u << 0,
    // Match no added special tokens in the text (their strings are tokenized as plain text),
    // for untrusted user text that must not inject control tokens.
    LS_TOKENIZE_NO_SPECIAL_MATCH = 1u << 1,
};

// Encodes len bytes of UTF-8 text, appending the ids to out. Added-token strings in the text
// are matched (unless LS_TOKENIZE_NO_SPECIAL_MATCH); no BOS/EOS unless LS_TOKENIZE_ADD_SPECIAL.
// Returns 0, or -1 + err for invalid UTF-8 or out of memory (out then holds what it had).
int ls_tokenizer_encode(ls_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                        ls_token_ids_t *out, char *err, size_t errlen);

enum {
    LS_DETOK_SKIP_SPECIAL = 1u << 0,  // drop added tokens marked special, as HF skip_special_tokens
};

// Decodes n ids with the file's decoder into a malloc'ed NUL-terminated string (its length in
// *len when len is not NULL). NULL + err for an id outside the vocabulary.
char *ls_tokenizer_decode(const ls_tokenizer_t *t, const int32_t *ids, size_t n, unsigned flags,
                          size_t *len, char *err, size_t errlen);

// Vocabulary: model vocab and added tokens together.
int32_t ls_tokenizer_vocab_size(const ls_tokenizer_t *t);  // highest id + 1
int32_t ls_tokenizer_token_to_id(const ls_tokenizer_t *t, const char *token);  // -1 when absent
const char *ls_tokenizer_id_to_token(const ls_tokenizer_t *t, int32_t id);     // NULL when absent
bool ls_tokenizer_is_special(const ls_tokenizer_t *t, int32_t id);
// The bytes token id stands for in the middle of a decoded text (ByteLevel bytes, a byte
// fallback's byte, a piece with its Metaspace replaced), for grammars that walk tokens as bytes
// (grammar.h). *len 0 (and NULL) for a special token or an id outside the vocabulary: no text.
// Known limit: a decoder that strips the first character of the output (SentencePiece's leading
// space) removes it from the first token's text only, which these bytes do not show.
const char *ls_tokenizer_token_bytes(const ls_tokenizer_t *t, int32_t id, size_t *len);
// The post-processor's ids before (BOS) and after (EOS) a single sequence; n may be 0.
const int32_t *ls_tokenizer_prefix_ids(const ls_tokenizer_t *t, size_t *n);
const int32_t *ls_tokenizer_suffix_ids(const ls_tokenizer_t *t, size_t *n);

// ---- an adapter's added tokens ------------------------------------------------------------
// Tokens an adapter's tokenizer adds past the base model's vocabulary (docs/adapters.md,
// "Added vocabulary"), taken over a base tokenizer as if its tokenizer.json listed them among
// its added_tokens: matched leftmost-longest together with the base's own added tokens (their
// flags as for those), decoded by the base's decoder. Ids first, first + 1, ... (first: the
// model's vocab_size, at or past the tokenizer's highest id). Built once per adapter, read-only
// after: it may serve any number of requests of the tokenizer it was made from, which must
// outlive it.
typedef struct ls_tok_added ls_tok_added_t;

typedef struct {
    const char *content;  // UTF-8, len bytes
    size_t len;
    bool special, single_word, lstrip, rstrip, normalized;
} ls_tok_added_spec_t;

// NULL + err for an empty or invalid content, one the base tokenizer already has (as a token
// or an added token: HF would give it that id), one given twice, first below the tokenizer's
// vocabulary, or out of memory.
ls_tok_added_t *ls_tok_added_new(ls_tokenizer_t *t, int32_t first, const ls_tok_added_spec_t *toks,
                                 size_t n, char *err, size_t errlen);
void ls_tok_added_destroy(ls_tok_added_t **a);
// Its ids: [first, first + n).
int32_t ls_tok_added_first(const ls_tok_added_t *a);
size_t ls_tok_added_count(const ls_tok_added_t *a);
// The content of id (NULL: not one of a's), and whether it is special.
const char *ls_tok_added_token(const ls_tok_added_t *a, int32_t id, bool *special);

// ls_tokenizer_encode and ls_tokenizer_decode with a's tokens too (a NULL: the base alone).
int ls_tokenizer_encode_added(ls_tokenizer_t *t, const ls_tok_added_t *a, const char *text,
                              size_t len, unsigned flags, ls_token_ids_t *out, char *err,
                              size_t errlen);
char *ls_tokenizer_decode_added(const ls_tokenizer_t *t, const ls_tok_added_t *a,
                                const int32_t *ids, size_t n, unsigned flags, size_t *len,
                                char *err, size_t errlen);

// ---- incremental detokenization ----------------------------------------------------------
// One per request. Feed ids one at a time; each call gives the text that is now final: never
// half a UTF-8 character, byte-fallback runs held until they end, SentencePiece's leading
// space handled as in the full decode. The concatenation of every piece (pushes + finish) is
// exactly ls_tokenizer_decode of the same ids. With stop strings, text that could be the start
// of a stop string is held until resolved; when one matches, the text before it is the last
// piece and the detokenizer is stopped (later pushes return nothing).
typedef struct ls_detok ls_detok_t;

// stops: nstops strings of stop_lens[i] bytes each (NUL bytes included), or C strings when
// stop_lens is NULL; copied, empty ones ignored. NULL on out of memory.
ls_detok_t *ls_detok_new(const ls_tokenizer_t *t, unsigned flags, const char *const *stops,
                         const size_t *stop_lens, size_t nstops);
// The same, decoding a's ids too (a NULL: as ls_detok_new); a must outlive the detokenizer.
ls_detok_t *ls_detok_new_added(const ls_tokenizer_t *t, const ls_tok_added_t *a, unsigned flags,
                               const char *const *stops, const size_t *stop_lens, size_t nstops);
void ls_detok_destroy(ls_detok_t **d);
// Takes one id. *piece/*len: the newly final text (len may be 0); it stays valid until the
// next call on d. Returns 0, or -1 for an id outside the vocabulary (state unchanged) or out
// of memory (the request should then end with an error).
int ls_detok_push(ls_detok_t *d, int32_t id, const char **piece, size_t *len);
// The sequence ended: flushes what was held (an unfinished UTF-8 tail becomes U+FFFD as in the
// full decode; held text that is only a stop-string prefix is emitted). 0, or -1 out of memory.
int ls_detok_finish(ls_detok_t *d, const char **piece, size_t *len);
// True once a stop string matched; ls_detok_stop_index says which (-1 when none).
bool ls_detok_stopped(const ls_detok_t *d);
int ls_detok_stop_index(const ls_detok_t *d);

#endif
