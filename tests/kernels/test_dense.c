/*  tests/kernels/test_dense.c — matmul, embedding, rmsnorm (plain, fused residual, per
    head), silu_mul, add, rows_gather and the weight conversions, against double-precision
    references on random inputs. Bound: NMSE <= 1e-10 (see test_util.h).
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ops.h"
#include "test_util.h"

#define NMSE_MAX 1e-10

// y (T, out) = x (T, in) · w (out, in)ᵀ + bias (out) [+ y0 (T, out)], in double
static void s_matmul_ref(double *y, const float *x, const float *w, const float *bias,
                         const float *y0, int T, int in, int out) {
    for (int t = 0; t < T; t++)
        for (int o = 0; o < out; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int i = 0; i < in; i++)
                acc += (double)x[t * in + i] * w[o * in + i];
            y[t * out + o] = acc + (y0 ? y0[t * out + o] : 0.0);
        }
}

static void test_matmul(void **state) {
    int shapes[][3] = {{1, 64, 32}, {7, 384, 200}, {33, 96, 511}};
    t_rng_t r = {1};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int T = shapes[k][0], in = shapes[k][1], out = shapes[k][2];
        float *x = t_alloc(sizeof(float) * T * in), *w = t_alloc(sizeof(float) * out * in);
        float *b = t_alloc(sizeof(float) * out), *y = t_alloc(sizeof(float) * T * out);
        float *y0 = t_alloc(sizeof(float) * T * out);
        double *ref = t_alloc(sizeof(double) * T * out);
        t_fill(&r, x, (size_t)T * in, -1, 1);
        t_fill(&r, w, (size_t)out * in, -1, 1);
        t_fill(&r, b, (size_t)out, -1, 1);
        t_fill(&r, y0, (size_t)T * out, -1, 1);
        for (int variant = 0; variant < 4; variant++) {
            int use_bias = variant & 1, accumulate = variant >> 1;
            memcpy(y, y0, sizeof(float) * T * out);
            ls_matmul_forward(y, x, w, use_bias ? b : NULL, T, in, out, accumulate);
            s_matmul_ref(ref, x, w, use_bias ? b : NULL, accumulate ? y0 : NULL, T, in, out);
            assert_true(t_nmse(y, ref, (size_t)T * out) <= NMSE_MAX);
        }
        free(x), free(w), free(b), free(y), free(y0), free(ref);
    }
}

static void test_embedding_and_gather(void **state) {
    enum { V = 50, C = 24, T = 9 };
    t_rng_t r = {2};
    float table[V * C], out[T * C], picked[3 * C];
    int32_t ids[T], rows[3] = {8, 0, 4};
    t_fill(&r, table, V * C, -1, 1);
    for (int t = 0; t < T; t++)
        ids[t] = t_rng_int(&r, V);
    ls_embedding_forward(out, table, ids, T, C, 0, V);
    for (int t = 0; t < T; t++)
        assert_memory_equal(out + t * C, table + ids[t] * C, C * sizeof(float));
    // a tensor-parallel rank's range [20, 35): its rows, zeros for the other ids
    float part[T * C], zero[C];
    memset(zero, 0, sizeof zero);
    ls_embedding_forward(part, table + 20 * C, ids, T, C, 20, 15);
    for (int t = 0; t < T; t++)
        assert_memory_equal(part + t * C, ids[t] >= 20 && ids[t] < 35 ? table + ids[t] * C : zero,
                            C * sizeof(float));
    ls_rows_gather(picked, out, rows, 3, C);
    for (int i = 0; i < 3; i++)
        assert_memory_equal(picked + i * C, table + ids[rows[i]] * C, C * sizeof(float));
}

// out (C) = x (C) / sqrt(mean(x²) + eps) * w (C), in double
static void s_rmsnorm_ref(double *out, const double *x, const float *w, int C, double eps) {
    double ss = 0.0;
    for (int i = 0; i < C; i++)
        ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / C + eps);
    for (int i = 0; i < C; i++)
        out[i] = x[i] * inv * w[i];
}

static void test_rmsnorm(void **state) {
    enum { T = 11, C = 4096 };
    const float eps = 1e-6f;
    t_rng_t r = {3};
    float *x = t_alloc(sizeof(float) * T * C), *res = t_alloc(sizeof(float) * T * C);
    float *res0 = t_alloc(sizeof(float) * T * C), *out = t_alloc(sizeof(float) * T * C);
    float w[C];
    double *ref = t_alloc(sizeof(double) * T * C), *sum = t_alloc(sizeof(double) * C);
    t_fill(&r, x, (size_t)T * C, -3, 3);
    t_fill(&r, res0, (size_t)T * C, -3, 3);
    t_fill(&r, w, C, 0.5f, 1.5f);

    ls_rmsnorm_forward(out, NULL, x, NULL, w, T, C, eps); // plain
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < C; i++)
            sum[i] = x[t * C + i];
        s_rmsnorm_ref(ref + t * C, sum, w, C, eps);
    }
    assert_true(t_nmse(out, ref, (size_t)T * C) <= NMSE_MAX);

    memcpy(res, res0, sizeof(float) * T * C); // fused: residual += x, out = norm(residual)
    ls_rmsnorm_forward(out, res, x, NULL, w, T, C, eps);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < C; i++) {
            sum[i] = (double)x[t * C + i] + res0[t * C + i];
            assert_true(res[t * C + i] == x[t * C + i] + res0[t * C + i]);
        }
        s_rmsnorm_ref(ref + t * C, sum, w, C, eps);
    }
    assert_true(t_nmse(out, ref, (size_t)T * C) <= NMSE_MAX);

    memcpy(out, x, sizeof(float) * T * C); // in place: out aliases x
    ls_rmsnorm_forward(out, NULL, out, NULL, w, T, C, eps);
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < C; i++)
            sum[i] = x[t * C + i];
        s_rmsnorm_ref(ref + t * C, sum, w, C, eps);
    }
    assert_true(t_nmse(out, ref, (size_t)T * C) <= NMSE_MAX);

    // x2 folded in: bit for bit the same as x2 added into x first, with and without the
    // residual, and in place (out aliases x)
    float *x2 = t_alloc(sizeof(float) * T * C), *xs = t_alloc(sizeof(float) * T * C);
    float *res2 = t_alloc(sizeof(float) * T * C), *want = t_alloc(sizeof(float) * T * C);
    t_fill(&r, x2, (size_t)T * C, -0.5f, 0.5f);
    memcpy(xs, x, sizeof(float) * T * C);
    ls_add_forward(xs, x2, (size_t)T * C);
    memcpy(res, res0, sizeof(float) * T * C);
    memcpy(res2, res0, sizeof(float) * T * C);
    ls_rmsnorm_forward(want, res, xs, NULL, w, T, C, eps);
    ls_rmsnorm_forward(out, res2, x, x2, w, T, C, eps);
    assert_memory_equal(out, want, sizeof(float) * T * C);
    assert_memory_equal(res2, res, sizeof(float) * T * C);
    ls_rmsnorm_forward(want, NULL, xs, NULL, w, T, C, eps);
    memcpy(out, x, sizeof(float) * T * C);
    ls_rmsnorm_forward(out, NULL, out, x2, w, T, C, eps);
    assert_memory_equal(out, want, sizeof(float) * T * C);
    free(x2), free(xs), free(res2), free(want);
    free(x), free(res), free(res0), free(out), free(ref), free(sum);
}

// Qwen3 q/k norm inside a stacked qkv row: only the first n_heads*head_dim columns of each
// row change, and each head is normalized on its own.
static void test_rmsnorm_heads(void **state) {
    enum { T = 5, H = 4, D = 64, STRIDE = H * D + 2 * 2 * D };
    const float eps = 1e-6f;
    t_rng_t r = {4};
    float x[T * STRIDE], x0[T * STRIDE], w[D];
    double ref[D], head[D];
    t_fill(&r, x0, T * STRIDE, -2, 2);
    t_fill(&r, w, D, 0.5f, 1.5f);
    memcpy(x, x0, sizeof x);
    ls_rmsnorm_heads_forward(x, w, T, H, D, STRIDE, eps);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            for (int d = 0; d < D; d++)
                head[d] = x0[t * STRIDE + h * D + d];
            s_rmsnorm_ref(ref, head, w, D, eps);
            assert_true(t_nmse(x + t * STRIDE + h * D, ref, D) <= NMSE_MAX);
        }
        assert_memory_equal(x + t * STRIDE + H * D, x0 + t * STRIDE + H * D,
                            (STRIDE - H * D) * sizeof(float));
    }
}

static void test_silu_mul_add(void **state) {
    enum { T = 6, INTER = 300 };
    t_rng_t r = {5};
    float gu[T * 2 * INTER], out[T * INTER], y[T * INTER], y0[T * INTER];
    double ref[T * INTER];
    t_fill(&r, gu, T * 2 * INTER, -8, 8);
    ls_silu_mul_forward(out, gu, NULL, T, INTER);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < INTER; i++) {
            double g = gu[t * 2 * INTER + i], u = gu[t * 2 * INTER + INTER + i];
            ref[t * INTER + i] = g / (1.0 + exp(-g)) * u;
        }
    assert_true(t_nmse(out, ref, T * INTER) <= NMSE_MAX);

    t_fill(&r, y0, T * INTER, -1, 1);
    memcpy(y, y0, sizeof y);
    ls_add_forward(y, out, T * INTER);
    for (int i = 0; i < T * INTER; i++)
        assert_true(y[i] == y0[i] + out[i]);

    // a delta folded in: bit for bit silu_mul of gate_up + delta
    float delta[T * 2 * INTER], gu2[T * 2 * INTER], want[T * INTER];
    t_fill(&r, delta, T * 2 * INTER, -1, 1);
    memcpy(gu2, gu, sizeof gu);
    ls_add_forward(gu2, delta, T * 2 * INTER);
    ls_silu_mul_forward(want, gu2, NULL, T, INTER);
    ls_silu_mul_forward(out, gu, delta, T, INTER);
    assert_memory_equal(out, want, sizeof out);
}

// Hand-picked bit patterns: normals, the largest half, subnormals, signed zero, inf, nan.
static void test_convert(void **state) {
    const uint16_t h[] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x03ff, 0x8000, 0x7c00, 0x3555};
    const float hf[] = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 1023 * 0x1p-24f, -0.0f, INFINITY,
                        0.333251953125f};
    float out[8];
    ls_convert_f16_to_f32(out, h, 8);
    for (int i = 0; i < 8; i++)
        assert_memory_equal(&out[i], &hf[i], sizeof(float));
    const uint16_t nan16 = 0x7e00;
    ls_convert_f16_to_f32(out, &nan16, 1);
    assert_true(isnan(out[0]));

    const uint16_t b[] = {0x3f80, 0xc0a0, 0x0001, 0x7f80};
    const float bf[] = {1.0f, -5.0f, 0x1p-133f, INFINITY};
    ls_convert_bf16_to_f32(out, b, 4);
    for (int i = 0; i < 4; i++)
        assert_memory_equal(&out[i], &bf[i], sizeof(float));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),        cmocka_unit_test(test_embedding_and_gather),
        cmocka_unit_test(test_rmsnorm),       cmocka_unit_test(test_rmsnorm_heads),
        cmocka_unit_test(test_silu_mul_add),  cmocka_unit_test(test_convert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
