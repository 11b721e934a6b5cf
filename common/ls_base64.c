// ls_base64 — strict base64 decoding (see ls_base64.h).
#include "ls_base64.h"

#include <stdbool.h>

size_t ls_base64_decoded_max(size_t n) { return n / 4 * 3; }

size_t ls_base64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

// The 6-bit value of c, or -1 outside the standard alphabet.
static int s_value(unsigned char c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

int ls_base64_decode(const char *in, size_t n, uint8_t *out, size_t *len, size_t *bad_at) {
    *len = 0;
    if (n % 4) {
        *bad_at = n;
        return -1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        bool last = i + 4 == n;
        // Padding only in the last quantum, as its last one or two characters.
        size_t pad = last && in[n - 1] == '=' ? (in[n - 2] == '=' ? 2 : 1) : 0;
        uint32_t q = 0;
        for (size_t k = 0; k < 4; k++) {
            int v = k >= 4 - pad ? 0 : s_value((unsigned char)in[i + k]);
            if (v < 0) {
                *bad_at = i + k;
                return -1;
            }
            q = q << 6 | (uint32_t)v;
        }
        // The bits that padding leaves past the last byte must be zero.
        if ((pad == 1 && (q & 0xff)) || (pad == 2 && (q & 0xffff))) {
            *bad_at = i + 3 - pad;
            return -1;
        }
        out[o++] = (uint8_t)(q >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(q >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)q;
    }
    *len = o;
    return 0;
}
