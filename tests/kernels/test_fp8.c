// FP8 (W8A8, kernels/ops.h): the E4M3 conversions (formats/safetensors.h) against a
// brute-force nearest-code search, the row quantizer, and the FP8 matmul reference against
// double-precision sums.
//
// Tolerances. Conversions and quantized rows are exact: codes are compared bit for bit. The
// matmul: products of E4M3 values are exact in fp32, so the reference (double) and the
// kernel (sgemm in fp32, then the two scales) differ by fp32 summation and the rounding of
// the scales: bound 1e-5 relative to Σ|terms| (measured values are printed).
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ops.h"
#include "safetensors.h"
#include "test_util.h"

#define TOL_MATMUL 1e-5

// --- E4M3 ------------------------------------------------------------------------------------

// The nearest finite code to f by search over all of them, ties to the even code (mantissa
// LSB 0), |f| >= 448 saturating: what ls_e4m3_from_f32 must give, found independently.
static uint8_t s_nearest(float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    double a = fabs((double)f);
    if (a >= 448.0)
        return sign | 0x7e;
    int best = 0;
    double bd = INFINITY;
    for (int q = 0; q < 0x7f; q++) {
        double d = fabs(a - ls_e4m3_to_f32((uint8_t)q));
        if (d < bd || (d == bd && (q & 1) == 0)) {
            bd = d;
            best = q;
        }
    }
    return sign | (uint8_t)best;
}

static void test_e4m3_codes(void **state) {
    assert_true(ls_e4m3_to_f32(0x38) == 1.0f);
    assert_true(ls_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(ls_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(ls_e4m3_to_f32(0x08) == 0x1p-6f);  // smallest normal
    assert_true(ls_e4m3_to_f32(0x01) == 0x1p-9f);  // smallest subnormal
    assert_true(ls_e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    assert_true(isnan(ls_e4m3_to_f32(0x7f)) && isnan(ls_e4m3_to_f32(0xff)));
    for (int q = 0; q < 256; q++) { // every code comes back as itself, NaNs and -0 too
        float f = ls_e4m3_to_f32((uint8_t)q);
        assert_int_equal(ls_e4m3_from_f32(f), q);
        if ((q & 0x7f) != 0x7f && q > 0 && (q & 0x7f) < 0x7e) // increasing within a sign
            assert_true(fabsf(ls_e4m3_to_f32((uint8_t)(q + 1))) > fabsf(f));
    }
}

static void test_e4m3_rounding(void **state) {
    // every midpoint between neighbouring codes goes to the even one, and just off it to
    // the nearer one
    for (int q = 0; q < 0x7e; q++) {
        float lo = ls_e4m3_to_f32((uint8_t)q), hi = ls_e4m3_to_f32((uint8_t)(q + 1));
        float mid = (lo + hi) / 2; // exact: fp32 has room for one more bit
        uint8_t even = (q & 1) ? (uint8_t)(q + 1) : (uint8_t)q;
        assert_int_equal(ls_e4m3_from_f32(mid), even);
        assert_int_equal(ls_e4m3_from_f32(-mid), 0x80 | even);
        assert_int_equal(ls_e4m3_from_f32(nextafterf(mid, 0)), q);
        assert_int_equal(ls_e4m3_from_f32(nextafterf(mid, 1000)), q + 1);
    }
    // saturation: 448's upper half-step (464 would round to 480, a NaN code) and beyond
    const float big[] = {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 1e6f, 3e38f, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(ls_e4m3_from_f32(big[i]), 0x7e);
        assert_int_equal(ls_e4m3_from_f32(-big[i]), 0xfe);
    }
    assert_int_equal(ls_e4m3_from_f32(NAN), 0x7f);
    assert_int_equal(ls_e4m3_from_f32(0x1p-11f), 0x00);  // below half the smallest subnormal
    assert_int_equal(ls_e4m3_from_f32(0x1p-10f), 0x00);  // half of it: ties to even (0)
    assert_int_equal(ls_e4m3_from_f32(3 * 0x1p-10f), 0x02); // 1.5 steps: even (2)
    // random magnitudes over the whole range against the search
    t_rng_t r = {42};
    for (int i = 0; i < 200000; i++) {
        float f = ldexpf(t_rng_float(&r, 1.0f, 2.0f), t_rng_int(&r, 34) - 24);
        if (t_rng_int(&r, 2))
            f = -f;
        uint8_t got = ls_e4m3_from_f32(f), want = s_nearest(f);
        if (got != want)
            fail_msg("e4m3(%a) = 0x%02x, nearest 0x%02x", (double)f, got, want);
    }
}

// Rows of varied scale (one all zero): the largest magnitude of each lands on ±448, every
// value within half a step of E4M3 after the scale, and the codes are the conversion's.
static void test_quantize_rows(void **state) {
    enum { R = 9, C = 80 };
    t_rng_t r = {7};
    float x[R * C], scale[R];
    uint8_t q[R * C];
    for (int i = 0; i < R; i++)
        t_fill(&r, x + i * C, C, -ldexpf(1.0f, 3 * i - 12), ldexpf(1.0f, 3 * i - 12));
    memset(x + 4 * C, 0, C * sizeof *x);
    ls_fp8_quantize_rows(q, scale, x, R, C);
    for (int i = 0; i < R; i++) {
        float amax = 0;
        for (int c = 0; c < C; c++)
            amax = fmaxf(amax, fabsf(x[i * C + c]));
        assert_true(scale[i] == (amax > 0 ? amax / 448.0f : 1.0f));
        for (int c = 0; c < C; c++) {
            float v = x[i * C + c];
            uint8_t code = q[i * C + c];
            assert_int_equal(code, ls_e4m3_from_f32(v / scale[i]));
            if (fabsf(v) == amax && amax > 0)
                assert_int_equal(code & 0x7f, 0x7e);
            double back = (double)ls_e4m3_to_f32(code) * scale[i];
            assert_true(fabs(back - v) <= fmax(0x1p-4 * fabs(v), 0x1p-10 * scale[i]));
        }
    }
}

// The FP8 matmul against Σ e4m3(xq)·e4m3(wq)·sx·sw in double, over shapes and magnitudes.
static void test_matmul_fp8(void **state) {
    const int shapes[][3] = {{1, 16, 8}, {3, 64, 40}, {17, 96, 33}, {64, 256, 48}};
    t_rng_t r = {3};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int T = shapes[k][0], in = shapes[k][1], out = shapes[k][2];
        float *x = t_alloc(sizeof(float) * T * in), *wf = t_alloc(sizeof(float) * out * in);
        float *w = t_alloc(sizeof(float) * out * in), *ws = t_alloc(sizeof(float) * out);
        float *bias = t_alloc(sizeof(float) * out), *y = t_alloc(sizeof(float) * T * out);
        float *xq = t_alloc(sizeof(float) * T * in), *xs = t_alloc(sizeof(float) * T);
        float *want_s = t_alloc(sizeof(float) * T);
        uint8_t *wq = t_alloc((size_t)out * in), *want_q = t_alloc((size_t)T * in);
        t_fill(&r, x, (size_t)T * in, -3, 3);
        x[0] = 40; // an outlier: its row's other values lose precision, as in real activations
        t_fill(&r, wf, (size_t)out * in, -0.2f, 0.2f);
        t_fill(&r, bias, out, -1, 1);
        ls_fp8_quantize_rows(wq, ws, wf, out, in);
        for (size_t i = 0; i < (size_t)out * in; i++)
            w[i] = ls_e4m3_to_f32(wq[i]);
        ls_matmul_fp8_forward(y, xq, xs, x, w, ws, k % 2 ? bias : NULL, T, in, out);
        ls_fp8_quantize_rows(want_q, want_s, x, T, in);
        double worst = 0;
        for (int t = 0; t < T; t++) {
            assert_true(xs[t] == want_s[t]);
            for (int c = 0; c < in; c++)
                assert_true(xq[t * in + c] == ls_e4m3_to_f32(want_q[t * in + c]));
            for (int o = 0; o < out; o++) {
                double sum = 0, mag = 0;
                for (int c = 0; c < in; c++) {
                    double term = (double)xq[t * in + c] * w[o * in + c];
                    sum += term;
                    mag += fabs(term);
                }
                double want = sum * xs[t] * ws[o] + (k % 2 ? bias[o] : 0);
                double rel = fabs(y[t * out + o] - want) / (mag * xs[t] * ws[o] + 1e-30);
                worst = fmax(worst, rel);
            }
        }
        print_message("matmul_fp8 T=%d in=%d out=%d: max |Δ| / Σ|terms| %.2e (bound %.0e)\n", T, in,
                      out, worst, TOL_MATMUL);
        assert_true(worst <= TOL_MATMUL);
        // x quantized ahead (by the op that made it: backend.h rmsnorm's out_lp) and handed
        // over as codes only: the same codes, scales and product
        float *xq2 = t_alloc(sizeof(float) * T * in), *xs2 = t_alloc(sizeof(float) * T);
        float *y2 = t_alloc(sizeof(float) * T * out);
        ls_fp8_quantize_rows_f32(xq2, xs2, x, T, in);
        assert_memory_equal(xq2, xq, sizeof(float) * T * in);
        assert_memory_equal(xs2, xs, sizeof(float) * T);
        ls_matmul_fp8_forward(y2, xq2, xs2, NULL, w, ws, k % 2 ? bias : NULL, T, in, out);
        assert_memory_equal(y2, y, sizeof(float) * T * out);
        free(x), free(wf), free(w), free(ws), free(bias), free(y), free(xq), free(xs);
        free(want_s), free(wq), free(want_q), free(xq2), free(xs2), free(y2);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e4m3_codes),
        cmocka_unit_test(test_e4m3_rounding),
        cmocka_unit_test(test_quantize_rows),
        cmocka_unit_test(test_matmul_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
