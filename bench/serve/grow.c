#include "grow.h"

#include <stdlib.h>
#include <string.h>

int bs_grow(void *pv, size_t *cap, size_t need, size_t size) {
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *v = realloc(*(void **)pv, c * size);
    if (!v)
        return -1;
    *(void **)pv = v;
    *cap = c;
    return 0;
}

int bs_buf_add(bs_buf_t *b, const void *p, size_t n) {
    if (bs_grow(&b->d, &b->cap, b->n + n + 1, 1) < 0)
        return -1;
    memcpy(b->d + b->n, p, n);
    b->n += n;
    b->d[b->n] = 0;
    return 0;
}
