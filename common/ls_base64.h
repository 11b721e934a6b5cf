// ls_base64 — strict base64 decoding (RFC 4648, standard alphabet), for bytes that clients
// send inside JSON (an adapter's safetensors in a load from tensors).
//
// Strict, so one text decodes one way: the length is a multiple of 4, '=' only as the last one
// or two characters, no whitespace or line breaks, no URL-safe alphabet, and the bits past the
// last byte are zero (the canonical form every encoder writes).
#ifndef LS_BASE64_H
#define LS_BASE64_H

#include <stddef.h>
#include <stdint.h>

// The bytes that n characters of base64 decode to, at most.
size_t ls_base64_decoded_max(size_t n);

// The characters that n bytes encode to (with padding).
size_t ls_base64_encoded_len(size_t n);

// Decode in[0..n) into out (room for ls_base64_decoded_max(n)). 0 with *len set, or -1 with
// *bad_at the offset of the first character that makes the text invalid (n for a length that
// is not a multiple of 4).
int ls_base64_decode(const char *in, size_t n, uint8_t *out, size_t *len, size_t *bad_at);

#endif
