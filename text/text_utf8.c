// text_utf8 — see text_utf8.h.
#include "text_utf8.h"

#include <stdlib.h>
#include <string.h>

int ls_buf_reserve(ls_buf_t *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1)
        cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s)
        return -1;
    b->s = s;
    b->cap = cap;
    return 0;
}

int ls_buf_append(ls_buf_t *b, const void *p, size_t n) {
    if (ls_buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
    return 0;
}

int ls_buf_append_cp(ls_buf_t *b, uint32_t cp) {
    char tmp[4];
    return ls_buf_append(b, tmp, (size_t)ls_utf8_put(tmp, cp));
}

void ls_buf_free(ls_buf_t *b) {
    free(b->s);
    b->s = NULL;
    b->n = b->cap = 0;
}

int ls_utf8_seq(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;  // the range allowed for the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;  // overlong
        else if (c == 0xED)
            hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;  // overlong
        else if (c == 0xF4)
            hi = 0x8F;  // above U+10FFFF
    } else {
        *bad = 1;
        return 0;
    }
    for (int i = 1; i <= need; i++) {
        if ((size_t)i >= n)
            return -1;
        unsigned char l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (s[i] < l || s[i] > h) {
            *bad = (size_t)i;
            return 0;
        }
    }
    return need + 1;
}

uint32_t ls_utf8_cp(const unsigned char *s, int k) {
    switch (k) {
    case 1:
        return s[0];
    case 2:
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3:
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default:
        return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

bool ls_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, bad;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int k = ls_utf8_seq(p + i, n - i, &bad);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

size_t ls_utf8_lossy(ls_buf_t *out, const char *s, size_t n, bool hold) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, run = 0;  // [run, i) is valid text not yet copied
    while (i < n) {
        size_t bad = 0;
        int k = p[i] < 0x80 ? 1 : ls_utf8_seq(p + i, n - i, &bad);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (k < 0 && hold)
            break;
        if (ls_buf_append(out, s + run, i - run) < 0 || ls_buf_append(out, "\xEF\xBF\xBD", 3) < 0)
            return (size_t)-1;
        i += k < 0 ? n - i : bad;  // an incomplete tail is one maximal subpart
        run = i;
    }
    if (ls_buf_append(out, s + run, i - run) < 0)
        return (size_t)-1;
    return i;
}

int ls_utf8_put(char *out, uint32_t cp) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool ls_utf8_is_space(uint32_t cp) {
    // The White_Space property list (PropList.txt), which is small and stable.
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}
