// text_utf8: the UTF-8 and byte-buffer helpers the tokenizer, the detokenizer and the chat
// templates share. Decoding follows the Unicode "maximal subpart" rule that Rust's
// String::from_utf8_lossy uses, so invalid bytes become U+FFFD exactly where HF's decode puts them.
#ifndef LS_TEXT_UTF8_H
#define LS_TEXT_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// A growable byte string, always NUL-terminated once anything was appended.
typedef struct {
    char *s;
    size_t n;
    size_t cap;
} ls_buf_t;

int ls_buf_reserve(ls_buf_t *b, size_t extra);
int ls_buf_append(ls_buf_t *b, const void *p, size_t n);
int ls_buf_append_cp(ls_buf_t *b, uint32_t cp);
void ls_buf_free(ls_buf_t *b);

// Length of the valid UTF-8 sequence starting at s (at most n bytes): 1-4, or 0 when the bytes
// are invalid (*bad then gets how many of them form one maximal invalid subpart, >= 1) or -1
// when they are a valid but incomplete start (more bytes could complete it).
int ls_utf8_seq(const unsigned char *s, size_t n, size_t *bad);
// Code point of the valid sequence at s whose length is k (from ls_utf8_seq).
uint32_t ls_utf8_cp(const unsigned char *s, int k);
// Whether all n bytes are valid UTF-8.
bool ls_utf8_valid(const char *s, size_t n);
// Appends n bytes to out, invalid subparts replaced by U+FFFD. When hold is true an
// incomplete sequence at the end is not consumed; returns how many bytes were consumed, or
// (size_t)-1 on out of memory.
size_t ls_utf8_lossy(ls_buf_t *out, const char *s, size_t n, bool hold);
// Encodes cp into out (4 bytes of room); returns its length.
int ls_utf8_put(char *out, uint32_t cp);
// Unicode White_Space, as Rust's char::is_whitespace.
bool ls_utf8_is_space(uint32_t cp);

#endif
