// added_vocab: the tokens an adapter's tokenizer adds past the base model's vocabulary
// (docs/adapters.md, "Added vocabulary"), read from the adapter directory as HF saves a
// tokenizer beside it:
//   - tokenizer.json: its "added_tokens" entries with an id at or past the base vocab_size,
//     with their flags (special, single_word, lstrip, rstrip, normalized);
//   - added_tokens.json: {content: id}; the ids at or past vocab_size. Alone, its tokens take
//     the flags transformers' add_tokens gives a plain string (normalized, not special).
// Both present: they must name the same tokens with the same ids. Entries below vocab_size are
// the base tokenizer's own (Qwen saves its special tokens there) and are not added vocabulary.
//
// The added ids must be vocab_size, vocab_size + 1, ... without a gap (a gap is an id no
// row of the resized embedding could be told from), each content non-empty valid UTF-8 of at
// most LS_ADDED_TOKEN_MAX_BYTES without NUL, distinct; at most LS_ADDED_VOCAB_MAX tokens.
// Anything else is refused with a sentence naming the file and the token.
#ifndef LS_ADDED_VOCAB_H
#define LS_ADDED_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    LS_ADDED_VOCAB_MAX = 1 << 16,    // a sanity bound; --lora-extra-vocab-size is the real one
    LS_ADDED_TOKEN_MAX_BYTES = 1024,
};

typedef struct {
    int32_t id;
    char *content;  // NUL-terminated (no NUL inside)
    bool special, single_word, lstrip, rstrip, normalized;
} ls_added_token_t;

typedef struct {
    int n;
    ls_added_token_t *tokens;  // (n) ids vocab_size .. vocab_size + n - 1, in order
} ls_added_vocab_t;

// Reads dir's added vocabulary into *out (n 0, tokens NULL: none). 0, or -1 + err.
int ls_added_vocab_read(const char *dir, int32_t vocab_size, ls_added_vocab_t *out, char *err,
                        size_t errlen);
// Frees what ls_added_vocab_read filled; idempotent.
void ls_added_vocab_free(ls_added_vocab_t *v);

#endif
