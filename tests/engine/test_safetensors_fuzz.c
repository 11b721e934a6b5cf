// Randomized corruption of a valid safetensors file: flipped bytes, rewritten digits,
// truncations and bogus header lengths. The reader must never crash or read out of bounds
// (tools/test-sanitize.sh runs it under ASan for the latter); when it accepts a file, every tensor it
// exposes must lie inside the file and convert cleanly.
#include "fixtures.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "safetensors.h"

#define ITERATIONS 4000

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
    // xorshift64*: deterministic, so a failure reproduces.
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

static void mutate(unsigned char *buf, size_t *len, size_t hdr_end)
{
    switch (rnd() % 6) {
    case 0:  // flip a few bits anywhere
    case 1:
        for (int k = 1 + (int)(rnd() % 4); k > 0; k--)
            buf[rnd() % *len] ^= (unsigned char)(1u << (rnd() % 8));
        break;
    case 2:  // random bytes in the header
        for (int k = 1 + (int)(rnd() % 4); k > 0; k--)
            buf[8 + rnd() % (hdr_end - 8)] = (unsigned char)rnd();
        break;
    case 3:  // rewrite a digit of the header: shapes and offsets stay syntactically valid
        for (int tries = 0; tries < 64; tries++) {
            size_t i = 8 + rnd() % (hdr_end - 8);
            if (buf[i] >= '0' && buf[i] <= '9') {
                buf[i] = (unsigned char)('0' + rnd() % 10);
                break;
            }
        }
        break;
    case 4:  // truncate
        *len = rnd() % *len;
        break;
    case 5: {  // bogus header length
        uint64_t v = rnd() % 4 == 0 ? ((uint64_t)rnd() << 32 | rnd()) : rnd() % (hdr_end + 64);
        for (int i = 0; i < 8; i++)
            buf[i] = (unsigned char)(v >> (8 * i));
        break;
    }
    }
}

static void test_corruption_loop(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    char p[4096], q[4096];
    static float a[4 * 6];
    static uint16_t b[5], c[3 * 2 * 2];
    for (size_t i = 0; i < 24; i++)
        a[i] = fx_value(1, i);
    for (size_t i = 0; i < 5; i++)
        b[i] = ls_f16_from_f32(fx_value(2, i));
    for (size_t i = 0; i < 12; i++)
        c[i] = ls_bf16_from_f32(fx_value(3, i));
    ls_st_write_tensor_t t[3] = {
        {.name = "model.layers.0.self_attn.q_proj.weight", .dtype = LS_DTYPE_F32, .ndim = 2,
         .shape = {4, 6}, .data = a},
        {.name = "b", .dtype = LS_DTYPE_F16, .ndim = 1, .shape = {5}, .data = b},
        {.name = "c", .dtype = LS_DTYPE_BF16, .ndim = 3, .shape = {3, 2, 2}, .data = c},
    };
    char err[512];
    assert_int_equal(ls_st_write(fx_path(p, sizeof p, dir, "ok.safetensors"), t, 3, err,
                                 sizeof err), 0);
    size_t len;
    unsigned char *orig = (unsigned char *)tu_read_file(p, &len);
    assert_non_null(orig);
    size_t hdr_end = 8;
    for (int i = 0; i < 8; i++)
        hdr_end += (size_t)orig[i] << (8 * i);
    unsigned char *buf = malloc(len);
    float *f = malloc(64 * 1024 * sizeof(float));
    int accepted = 0;
    fx_path(q, sizeof q, dir, "fuzz.safetensors");
    for (int it = 0; it < ITERATIONS; it++) {
        memcpy(buf, orig, len);
        size_t n = len;
        for (int m = 1 + (int)(rnd() % 2); m > 0 && n > 8; m--)
            mutate(buf, &n, hdr_end < n ? hdr_end : n);
        assert_int_equal(fx_write(dir, "fuzz.safetensors", buf, n), 0);
        err[0] = '\0';
        ls_st_t *st = ls_st_open(q, err, sizeof err);
        if (!st) {
            // Every refusal explains itself and names the file.
            assert_true(strstr(err, "fuzz.safetensors") != NULL);
            continue;
        }
        accepted++;
        for (size_t i = 0; i < ls_st_count(st); i++) {
            const ls_st_tensor_t *x = ls_st_at(st, i);
            assert_true(x->nbytes == x->numel * ls_dtype_size(x->dtype));
            if (x->numel <= 64 * 1024)
                ls_st_tensor_to_f32(x, f);  // touches every byte; ASan flags any overrun
        }
        ls_st_destroy(&st);
    }
    print_message("corruption loop: %d of %d mutated files accepted\n", accepted, ITERATIONS);
    assert_true(accepted < ITERATIONS);
    free(f);
    free(buf);
    free(orig);
    fx_rmdir(&dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corruption_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
