/*  tests/kernels/test_rope.c — the inverse frequency tables (default, linear, llama3)
    against values worked out by hand from transformers' formulas, and the rotation against
    a double-precision rotate_half reference.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ops.h"
#include "test_util.h"

// |got - want| <= 1e-6 relative: one fp32 rounding of a double result
static void s_assert_rel(float got, double want) {
    assert_true(fabs(got - want) <= 1e-6 * fabs(want));
}

static void test_inv_freq_default_and_linear(void **state) {
    enum { D = 128 };
    float inv[D / 2];
    ls_rope_config_t cfg = {.type = LS_ROPE_DEFAULT, .theta = 10000.0};
    ls_rope_inv_freq_init(inv, D, &cfg);
    for (int i = 0; i < D / 2; i++)
        s_assert_rel(inv[i], pow(10000.0, -2.0 * i / D));
    s_assert_rel(inv[1], 0.8659643233600653); // 10000^(-2/128)

    cfg = (ls_rope_config_t){.type = LS_ROPE_LINEAR, .theta = 10000.0, .factor = 4.0};
    ls_rope_inv_freq_init(inv, D, &cfg);
    for (int i = 0; i < D / 2; i++)
        s_assert_rel(inv[i], pow(10000.0, -2.0 * i / D) / 4.0);
}

// Llama 3.1 8B: theta 500000, factor 8, low 1, high 4, original 8192, head_dim 128.
// Wavelengths 2π/inv: i = 0, 20 are below 8192/4 = 2048 (kept), i = 30 (2948) is in the
// blended band, i = 40, 50, 63 are above 8192 (divided by 8). Expected values were worked
// out from the formula independently of this code.
static void test_inv_freq_llama3(void **state) {
    enum { D = 128 };
    float inv[D / 2];
    ls_rope_config_t cfg = {.type = LS_ROPE_LLAMA3, .theta = 500000.0, .factor = 8.0,
                            .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                            .original_max_position = 8192.0};
    ls_rope_inv_freq_init(inv, D, &cfg);
    const struct {
        int i;
        double v;
    } want[] = {{0, 1.0},
                {20, 0.016560440080994446},
                {30, 0.0013718935677611381}, // smooth = (8192/2948.30 - 1)/3 = 0.5928
                {40, 3.428102195952591e-05},
                {50, 4.411534674558404e-06},
                {63, 3.068925988914511e-07}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        s_assert_rel(inv[want[k].i], want[k].v);
    // the blend is continuous in the wavelength, so the table never increases with i
    for (int i = 1; i < D / 2; i++)
        assert_true(inv[i] < inv[i - 1]);
}

// Rotates q inside a stacked (T, STRIDE) qkv buffer; columns past the heads stay as they
// were. The reference forms the angle as the same fp32 product (the HF convention the
// kernel promises), then rotates in double.
static void test_rope_forward(void **state) {
    enum { T = 9, H = 3, D = 64, STRIDE = H * D + 32 };
    t_rng_t r = {7};
    float x[T * STRIDE], x0[T * STRIDE], inv[D / 2];
    double ref[H * D];
    int32_t pos[T] = {0, 1, 2, 17, 255, 1000, 4095, 8191, 131071};
    ls_rope_config_t cfg = {.type = LS_ROPE_DEFAULT, .theta = 1000000.0};
    ls_rope_inv_freq_init(inv, D, &cfg);
    t_fill(&r, x0, T * STRIDE, -1, 1);
    memcpy(x, x0, sizeof x);
    ls_rope_forward(x, NULL, pos, inv, T, H, D, STRIDE);
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++)
            for (int i = 0; i < D / 2; i++) {
                double angle = (float)pos[t] * inv[i];
                double a = x0[t * STRIDE + h * D + i], b = x0[t * STRIDE + h * D + i + D / 2];
                ref[h * D + i] = a * cos(angle) - b * sin(angle);
                ref[h * D + i + D / 2] = b * cos(angle) + a * sin(angle);
            }
        assert_true(t_max_abs(x + t * STRIDE, ref, H * D) <= 1e-5);
        assert_memory_equal(x + t * STRIDE + H * D, x0 + t * STRIDE + H * D,
                            (STRIDE - H * D) * sizeof(float));
    }
    // position 0 is the identity
    assert_memory_equal(x, x0, H * D * sizeof(float));
}

// x2 folded in (a LoRA delta, engine/model.c): bit for bit the rotation of x + x2 added
// first, columns past the heads untouched
static void test_rope_x2(void **state) {
    enum { T = 6, H = 2, D = 32, STRIDE = H * D + 8 };
    t_rng_t r = {8};
    float x[T * STRIDE], x2[T * STRIDE], want[T * STRIDE], inv[D / 2];
    int32_t pos[T] = {0, 3, 40, 511, 9000, 100000};
    ls_rope_config_t cfg = {.type = LS_ROPE_DEFAULT, .theta = 10000.0};
    ls_rope_inv_freq_init(inv, D, &cfg);
    t_fill(&r, x, T * STRIDE, -1, 1);
    t_fill(&r, x2, T * STRIDE, -0.5f, 0.5f);
    memcpy(want, x, sizeof x);
    for (int t = 0; t < T; t++) // the heads' columns only: the rest stays x
        ls_add_forward(want + t * STRIDE, x2 + t * STRIDE, H * D);
    ls_rope_forward(want, NULL, pos, inv, T, H, D, STRIDE);
    ls_rope_forward(x, x2, pos, inv, T, H, D, STRIDE);
    assert_memory_equal(x, want, sizeof x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inv_freq_default_and_linear),
        cmocka_unit_test(test_inv_freq_llama3),
        cmocka_unit_test(test_rope_forward),
        cmocka_unit_test(test_rope_x2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
