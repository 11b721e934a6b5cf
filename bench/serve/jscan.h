// Finding values in JSON text without building a tree. A /generate stream repeats every
// output id so far in each event, so a parser that allocates a node per number costs the
// client O(n²) allocations per request; these functions walk the bytes once and allocate
// nothing. They locate values; they do not validate a document (cJSON does that where the
// whole value is needed).
#ifndef BS_JSCAN_H
#define BS_JSCAN_H

#include <stddef.h>

typedef struct {
    const char *p;  // the value's first byte ('{', '"', a digit, …)
    size_t n;       // its length
} bs_span_t;

// The value of member key in the object obj. 0 found, -1 absent, not an object, or truncated.
int bs_json_member(bs_span_t obj, const char *key, bs_span_t *out);
// Element i of the array arr. 0 found, -1 otherwise.
int bs_json_element(bs_span_t arr, size_t i, bs_span_t *out);
// The whole document (leading and trailing blanks trimmed); -1 when empty.
int bs_json_root(const char *text, size_t n, bs_span_t *out);

int bs_json_is_null(bs_span_t v);
// An integer value; -1 when v is not one.
int bs_json_int(bs_span_t v, long long *out);
// A string value unescaped into a new NUL-terminated buffer (free it); NULL if v is not a string.
char *bs_json_string_dup(bs_span_t v);

#endif
