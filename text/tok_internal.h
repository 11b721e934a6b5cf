// tok_internal: the tokenizer's structure, shared by its loader (tok_load.c), the encoder
// (tok_encode.c) and the decoder (detok.c). Not part of the library's interface.
#ifndef LS_TOK_INTERNAL_H
#define LS_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text_utf8.h"
#include "tokenizer.h"

// The model vocab: string -> id by open addressing (slots hold id + 1, 0 = empty), keys in the
// tokenizer's string arena at key_off[id]. Kept apart from id_off because an added token may
// give an id another text for decoding while BPE still sees the model's string.
typedef struct {
    uint32_t *slots;
    size_t mask;
    uint32_t *key_off, *key_len;  // by id; key_off UINT32_MAX when the id is not in the model
} tok_strmap_t;

// (left id, right id) -> (rank, merged id), open addressing on a 64-bit key.
typedef struct {
    uint64_t *keys;  // (left << 32 | right); UINT64_MAX = empty
    uint64_t *vals;  // (rank << 32 | merged id)
    size_t mask;
} tok_mergemap_t;

typedef enum {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWERCASE,
    NORM_STRIP,
    NORM_PREPEND,
    NORM_REPLACE,
} tok_norm_kind_t;

typedef struct {
    tok_norm_kind_t kind;
    bool left, right;  // Strip
    char *content;     // Prepend's text, Replace's replacement
    size_t content_len;
    pcre2_code *re;    // Replace's pattern (literal strings are compiled as PCRE2_LITERAL)
} tok_norm_t;

typedef enum { PT_SPLIT, PT_BYTE_LEVEL, PT_METASPACE } tok_pt_kind_t;

typedef enum {
    SPLIT_REMOVED,
    SPLIT_ISOLATED,
    SPLIT_MERGED_PREVIOUS,
    SPLIT_MERGED_NEXT,
    SPLIT_CONTIGUOUS,
} tok_split_behavior_t;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } tok_prepend_t;

typedef struct {
    tok_pt_kind_t kind;
    pcre2_code *re;  // Split's pattern; ByteLevel's GPT-2 regex when use_regex
    tok_split_behavior_t behavior;
    bool invert;
    bool add_prefix_space;  // ByteLevel
    char repl[4];           // Metaspace replacement character, UTF-8
    int repl_len;
    tok_prepend_t prepend;  // Metaspace
    bool split;             // Metaspace: split on the replacement character
} tok_pt_t;

typedef struct {
    int32_t id;
    uint32_t off, len;              // content in the string arena
    uint32_t match_off, match_len;  // what is matched: the content, normalized when normalized
    bool single_word, lstrip, rstrip, normalized, special;
} tok_added_t;

// Added tokens grouped for matching: indices into added[], bucketed by first byte and, within a
// bucket, longest first, so the first that matches at a position is the leftmost-longest.
typedef struct {
    uint32_t *order;
    uint32_t start[257];
} tok_added_set_t;

// Builds set over added[0 .. n) (contents in arena), the normalized ones or the others. -1 out
// of memory.
int tok_added_set_build(tok_added_set_t *set, const tok_added_t *added, size_t n, const char *arena,
                        bool normalized);

// An adapter's added tokens over a base tokenizer (ls_tok_added_new): ids first, first + 1, ...
// matched beside the base's own, decoded by the base's decoder.
struct ls_tok_added {
    int32_t first;
    size_t n;
    tok_added_t *added;       // (n) contents (off, len) and matched forms in arena
    ls_buf_t arena;
    tok_added_set_t raw, norm;
    ls_buf_t dec_arena;       // each one's decoded text (not the first token's form)
    uint32_t *dec_off, *dec_len;
};

typedef enum { DEC_BYTE_LEVEL, DEC_PIECES } tok_dec_mode_t;

// Per-token string stages of a DEC_PIECES decoder, applied in file order.
typedef struct {
    bool metaspace;  // Metaspace: replacement -> ' ', dropped in the first token
    char *pattern, *content;
    size_t pattern_len, content_len;
} tok_dec_step_t;

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len;  // in the cache's key arena
    uint32_t ids_off, ids_n;    // in the cache's id arena
} tok_cache_entry_t;

// Bounded word cache: cleared when full, since most text reuses a small working set of words.
typedef struct {
    tok_cache_entry_t *entries;  // open addressing; key_len == UINT32_MAX = empty
    size_t mask, used;
    ls_buf_t keys;
    int32_t *ids;
    size_t ids_n, ids_cap;
} tok_cache_t;

typedef struct {
    int32_t id;  // symbol's token
    int32_t prev, next;
    uint32_t len;  // bytes covered; 0 once merged into its left neighbour
} tok_sym_t;

typedef struct {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} tok_merge_t;

struct ls_tokenizer {
    char what[256];   // source name for messages
    ls_buf_t arena;   // every token string, NUL-separated
    int32_t n_ids;    // highest id + 1
    size_t n_model;   // max(highest model vocab id + 1, vocab entries): where added ids start
    size_t n_vocab_entries;
    uint32_t *id_off; // id -> its token (the added token's text first); UINT32_MAX when none
    uint32_t *id_len;
    uint8_t *id_special;   // added token marked special
    tok_strmap_t vocab;    // the model's vocab only (what BPE sees)
    tok_mergemap_t merges;
    int32_t unk_id;        // -1 without unk_token
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_ids[256];  // "<0xHH>" ids for byte_fallback, -1 when absent
    int32_t *small_cp_ids;  // code point < 0x800 -> model id (-1 absent), the common fast path

    tok_added_t *added;
    size_t n_added;
    tok_added_set_t added_raw, added_norm;  // matched before / after normalization

    tok_norm_t *norms;
    size_t n_norms;
    tok_pt_t *pts;
    size_t n_pts;
    pcre2_match_data *md;

    int32_t *prefix_ids, *suffix_ids;
    size_t n_prefix, n_suffix;

    tok_dec_mode_t dec_mode;
    tok_dec_step_t *dec_steps;
    size_t n_dec_steps;
    bool dec_byte_fallback;
    uint32_t dec_strip_cp;  // Strip after Fuse: this character ...
    int dec_strip_start;    // ... removed up to this many times from the start of the text
    bool dec_metaspace_first;
    ls_buf_t dec_arena;     // id -> decoded text (bytes for ByteLevel)
    uint32_t *dec_off, *dec_len;
    int16_t *dec_byte;      // DEC_PIECES: the byte a "<0xHH>" token stands for, else -1

    int dec_phase;          // loading only: how far through the decoder Sequence
    tok_cache_t cache;
    tok_sym_t *syms;
    size_t syms_cap;
    tok_merge_t *heap;  // 3 * syms_cap entries
    ls_buf_t norm_bufs[2];  // the normalizer's working strings, used in turn
    ls_buf_t *pt_bufs;      // two working strings per pre-tokenizer step (pieces in flight)
};

uint64_t tok_hash(const char *s, size_t n);
int32_t tok_vocab_get(const ls_tokenizer_t *t, const char *s, size_t n);
// The model id of one character (UTF-8, n bytes), through the small table when it applies.
int32_t tok_char_id(const ls_tokenizer_t *t, const char *s, size_t n);
// Runs the normalizer over n bytes of valid UTF-8; *out is s itself without a normalizer, else
// a scratch buffer of t valid until the next call.
int tok_normalize(ls_tokenizer_t *t, const char *s, size_t n, const char **out, size_t *outn);
// GPT-2's bytes_to_unicode: the character byte b stands for in a byte-level vocabulary.
uint32_t tok_byte_to_cp(unsigned b);
// Writes the decoder's text for id into out; first selects Metaspace's first-token form.
int tok_dec_token_text(const ls_tokenizer_t *t, int32_t id, bool first, ls_buf_t *out);
// The same for a token spelled s (n bytes).
int tok_dec_text(const ls_tokenizer_t *t, const char *s, size_t n, bool first, ls_buf_t *out);

#endif
