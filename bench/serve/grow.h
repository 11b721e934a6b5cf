// Growing memory, the one way every file of the benchmark does it: arrays doubled from 64
// elements, and a byte buffer kept NUL-terminated.
#ifndef BS_GROW_H
#define BS_GROW_H

#include <stddef.h>

// Makes the array *pv (elements of size bytes, *cap of them) hold at least need elements.
// pv is the address of the array's pointer. 0, or -1 out of memory (the array unchanged).
int bs_grow(void *pv, size_t *cap, size_t need, size_t size);

typedef struct {
    char *d;
    size_t n, cap;
} bs_buf_t;

// Appends n bytes; the buffer stays NUL-terminated. 0, or -1 out of memory.
int bs_buf_add(bs_buf_t *b, const void *p, size_t n);

#endif
