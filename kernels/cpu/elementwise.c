/*  kernels/cpu/elementwise.c — the small row-wise ops of a decoder layer: embedding
    gather, residual add, SiLU·mul of the stacked gate_up output, and the gather of the
    rows that need logits; plus the bf16/f16 -> f32 weight conversions used at upload and the
    padded scatter of LoRA slot loads.
*/
#include <assert.h>
#include <math.h>
#include <string.h>

#include "ops.h"

// dst is (n), src is (n) bf16 bit patterns: bf16 is the top half of an fp32
void ls_convert_bf16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
}

// dst is (n), src is (n) IEEE binary16 bit patterns; done by hand (no _Float16) so that
// subnormals, infinities and NaNs convert the same on every compiler
void ls_convert_f16_to_f32(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t sign = (uint32_t)(src[i] >> 15) << 31;
        uint32_t exp = (src[i] >> 10) & 0x1f;
        uint32_t man = src[i] & 0x3ff;
        uint32_t bits;
        if (exp == 0x1f) // inf / nan
            bits = sign | 0x7f800000u | (man << 13);
        else if (exp != 0) // normal: rebias 15 -> 127
            bits = sign | ((exp + 112) << 23) | (man << 13);
        else if (man == 0)
            bits = sign;
        else { // subnormal half: a normal float after shifting the mantissa up
            int e = -1;
            do {
                man <<= 1;
                e++;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
        }
        memcpy(&dst[i], &bits, sizeof bits);
    }
}

// out is (T, C), table is (vocab, C), ids is (T)
void ls_embedding_forward(float *out, const float *table, const int32_t *ids,
                          int T, int C, int vocab0, int vocab) {
    for (int t = 0; t < T; t++) {
        int64_t row = (int64_t)ids[t] - vocab0;
        if (row >= 0 && row < vocab)
            memcpy(out + (size_t)t * C, table + (size_t)row * C, (size_t)C * sizeof(float));
        else
            memset(out + (size_t)t * C, 0, (size_t)C * sizeof(float));
    }
}

// y is (n), x is (n)
void ls_add_forward(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

// out is (T, inter), gate_up is (T, 2*inter)
void ls_silu_mul_forward(float *out, const float *gate_up, const float *delta, int T,
                         int inter) {
    for (int t = 0; t < T; t++) {
        const float *g = gate_up + (size_t)t * 2 * inter;
        const float *u = g + inter;
        const float *d = delta ? delta + (size_t)t * 2 * inter : NULL;
        float *o = out + (size_t)t * inter;
        for (int i = 0; i < inter; i++) {
            float gi = d ? g[i] + d[i] : g[i], ui = d ? u[i] + d[inter + i] : u[i];
            o[i] = gi / (1.0f + expf(-gi)) * ui;
        }
    }
}

// out is (n_rows, C), x is (T, C), rows is (n_rows)
void ls_rows_gather(float *out, const float *x, const int32_t *rows, int n_rows, int C) {
    for (int r = 0; r < n_rows; r++) {
        assert(rows[r] >= 0);
        memcpy(out + (size_t)r * C, x + (size_t)rows[r] * C, (size_t)C * sizeof(float));
    }
}

// dst is (rows, dst_stride), src is (rows, chunks, w); see ops.h
void ls_pad_copy(void *dst, const void *src, size_t esize, size_t w, size_t chunks, size_t rows,
                 size_t dst_chunk, size_t dst_stride) {
    assert(w <= dst_chunk && chunks * dst_chunk <= dst_stride);
    char *d = dst;
    const char *s = src;
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < chunks; j++) {
            char *o = d + (i * dst_stride + j * dst_chunk) * esize;
            if (w)
                memcpy(o, s + ((i * chunks + j) * w) * esize, w * esize);
            memset(o + w * esize, 0, (dst_chunk - w) * esize);
        }
}
