// safetensors reader/writer: dtype conversions, single and sharded loading, and every
// malformed-file case (each must fail with a message naming the file and the tensor).
#include "fixtures.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "safetensors.h"

static char errbuf[1024];


// --- conversions -----------------------------------------------------------------------------

static void test_bf16_known(void **state)
{
    (void)state;
    assert_true(ls_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(ls_bf16_to_f32(0xc000) == -2.0f);
    assert_true(ls_bf16_to_f32(0x3fc0) == 1.5f);
    assert_true(ls_bf16_to_f32(0x0000) == 0.0f);
    assert_true(signbit(ls_bf16_to_f32(0x8000)));
    assert_true(isinf(ls_bf16_to_f32(0x7f80)) && ls_bf16_to_f32(0x7f80) > 0);
    assert_true(isinf(ls_bf16_to_f32(0xff80)) && ls_bf16_to_f32(0xff80) < 0);
    assert_true(isnan(ls_bf16_to_f32(0x7fc0)));
    // Rounding to nearest even on the dropped 16 bits.
    assert_int_equal(ls_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);         // tie -> even
    assert_int_equal(ls_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);     // tie -> even (up)
    assert_int_equal(ls_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-12f), 0x3f81);
    assert_true(isnan(ls_bf16_to_f32(ls_bf16_from_f32(NAN))));
    assert_int_equal(ls_bf16_from_f32(INFINITY), 0x7f80);
    // Every non-NaN bf16 survives a round trip through f32.
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ls_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(ls_bf16_from_f32(f), h);
    }
}

static void test_f16_known(void **state)
{
    (void)state;
    assert_true(ls_f16_to_f32(0x3c00) == 1.0f);
    assert_true(ls_f16_to_f32(0xc000) == -2.0f);
    assert_true(ls_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(ls_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(ls_f16_to_f32(0x0400) == 0x1p-14f);      // smallest normal
    assert_true(ls_f16_to_f32(0x0001) == 0x1p-24f);      // smallest subnormal
    assert_true(ls_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(signbit(ls_f16_to_f32(0x8000)));
    assert_true(isinf(ls_f16_to_f32(0x7c00)) && ls_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(ls_f16_to_f32(0xfc00)) && ls_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(ls_f16_to_f32(0x7e00)));
    assert_int_equal(ls_f16_from_f32(65519.0f), 0x7bff);
    assert_int_equal(ls_f16_from_f32(65520.0f), 0x7c00);  // rounds to inf
    assert_int_equal(ls_f16_from_f32(1e10f), 0x7c00);
    assert_int_equal(ls_f16_from_f32(0x1p-25f), 0x0000);  // tie -> even (0)
    assert_int_equal(ls_f16_from_f32(0x1.8p-25f), 0x0001);
    assert_int_equal(ls_f16_from_f32(3 * 0x1p-25f), 0x0002);  // 1.5 ulp tie -> even (2)
    assert_int_equal(ls_f16_from_f32(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(ls_f16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(ls_f16_from_f32(-0.0f), 0x8000);
    assert_true(isnan(ls_f16_to_f32(ls_f16_from_f32(NAN))));
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = ls_f16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(ls_f16_from_f32(f), h);
    }
}

// --- valid files -----------------------------------------------------------------------------

// Writes three tensors (f32 2x3, f16 4, bf16 2x2) with known values to path.
static void write_sample(const char *path)
{
    static float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};
    static const float want16[4] = {0.5f, -1.0f, 65504.0f, 0x1p-24f};
    static const float wantbf[4] = {1.0f, -2.0f, 1.5f, 256.0f};
    static uint16_t f16[4], bf16[4];
    for (int i = 0; i < 4; i++) {
        f16[i] = ls_f16_from_f32(want16[i]);
        bf16[i] = ls_bf16_from_f32(wantbf[i]);
    }
    ls_st_write_tensor_t t[3] = {
        {.name = "w.f32", .dtype = LS_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "a.f16", .dtype = LS_DTYPE_F16, .ndim = 1, .shape = {4}, .data = f16},
        {.name = "m.bf16", .dtype = LS_DTYPE_BF16, .ndim = 2, .shape = {2, 2}, .data = bf16},
    };
    assert_int_equal(ls_st_write(path, t, 3, errbuf, sizeof errbuf), 0);
}

static void check_sample(const ls_st_t *st)
{
    assert_int_equal(ls_st_count(st), 3);
    // Sorted by name.
    assert_string_equal(ls_st_at(st, 0)->name, "a.f16");
    assert_string_equal(ls_st_at(st, 1)->name, "m.bf16");
    assert_string_equal(ls_st_at(st, 2)->name, "w.f32");
    assert_null(ls_st_at(st, 3));
    assert_null(ls_st_find(st, "nope"));
    float out[6];
    const ls_st_tensor_t *t = ls_st_find(st, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->dtype, LS_DTYPE_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_int_equal(t->nbytes, 24);
    assert_int_equal(ls_st_tensor_to_f32(t, out), 0);
    assert_true(out[0] == 1.0f && out[1] == -2.5f && out[2] == 3.25f && out[4] == 1e-3f &&
                out[5] == -7.0f);
    t = ls_st_find(st, "a.f16");
    assert_int_equal(t->dtype, LS_DTYPE_F16);
    assert_int_equal(ls_st_tensor_to_f32(t, out), 0);
    assert_true(out[0] == 0.5f && out[1] == -1.0f && out[2] == 65504.0f && out[3] == 0x1p-24f);
    t = ls_st_find(st, "m.bf16");
    assert_int_equal(t->dtype, LS_DTYPE_BF16);
    assert_int_equal(ls_st_tensor_to_f32(t, out), 0);
    assert_true(out[0] == 1.0f && out[1] == -2.0f && out[2] == 1.5f && out[3] == 256.0f);
}

static void test_single_file_and_dir(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    char p[4096];
    write_sample(fx_path(p, sizeof p, dir, "model.safetensors"));
    ls_st_t *st = ls_st_open(p, errbuf, sizeof errbuf);
    assert_non_null(st);
    check_sample(st);
    assert_string_equal(ls_st_find(st, "w.f32")->file, p);
    ls_st_destroy(&st);
    assert_null(st);
    ls_st_destroy(&st);  // idempotent
    st = ls_st_open(dir, errbuf, sizeof errbuf);
    assert_non_null(st);
    check_sample(st);
    assert_string_equal(ls_st_path(st), dir);
    ls_st_destroy(&st);
    fx_rmdir(&dir);
}

static void test_scalar_empty_and_nonfinite(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    char p[4096];
    float one = 42.0f;
    uint16_t bad[3] = {ls_bf16_from_f32(1.0f), 0x7fc0, 0x7f80};  // 1, NaN, inf
    ls_st_write_tensor_t t[3] = {
        {.name = "scalar", .dtype = LS_DTYPE_F32, .ndim = 0, .data = &one},
        {.name = "empty", .dtype = LS_DTYPE_F16, .ndim = 2, .shape = {0, 5}, .data = NULL},
        {.name = "bad", .dtype = LS_DTYPE_BF16, .ndim = 1, .shape = {3}, .data = bad},
    };
    assert_int_equal(ls_st_write(fx_path(p, sizeof p, dir, "x.safetensors"), t, 3, errbuf,
                                 sizeof errbuf), 0);
    ls_st_t *st = ls_st_open(p, errbuf, sizeof errbuf);
    assert_non_null(st);
    float out[3];
    const ls_st_tensor_t *s = ls_st_find(st, "scalar");
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    assert_int_equal(ls_st_tensor_to_f32(s, out), 0);
    assert_true(out[0] == 42.0f);
    assert_int_equal(ls_st_find(st, "empty")->numel, 0);
    assert_int_equal(ls_st_find(st, "empty")->nbytes, 0);
    assert_int_equal(ls_st_tensor_to_f32(ls_st_find(st, "bad"), out), -1);
    assert_true(out[0] == 1.0f && isnan(out[1]) && isinf(out[2]));
    // The shape helper names the file and tensor.
    const int64_t want[2] = {3, 1};
    assert_int_equal(ls_st_tensor_check_shape(ls_st_find(st, "bad"), 2, want, errbuf,
                                              sizeof errbuf), -1);
    assert_contains(errbuf, "x.safetensors");
    assert_contains(errbuf, "\"bad\"");
    assert_contains(errbuf, "[3]");
    assert_contains(errbuf, "[3, 1]");
    const int64_t ok[1] = {3};
    assert_int_equal(ls_st_tensor_check_shape(ls_st_find(st, "bad"), 1, ok, errbuf,
                                              sizeof errbuf), 0);
    ls_st_destroy(&st);
    fx_rmdir(&dir);
}

static void write_shard(const char *dir, const char *name, const char *const *tensors, int n)
{
    char p[4096];
    ls_st_write_tensor_t t[4];
    static float v[4][3];
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 3; j++)
            v[i][j] = fx_value((unsigned)(i + 1), (size_t)j);
        t[i] = (ls_st_write_tensor_t){
            .name = tensors[i], .dtype = LS_DTYPE_F32, .ndim = 1, .shape = {3}, .data = v[i]};
    }
    assert_int_equal(ls_st_write(fx_path(p, sizeof p, dir, name), t, (size_t)n, errbuf,
                                 sizeof errbuf), 0);
}

static void test_sharded(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    write_shard(dir, "model-00001-of-00002.safetensors", (const char *[]){"a", "b"}, 2);
    write_shard(dir, "model-00002-of-00002.safetensors", (const char *[]){"c"}, 1);
    fx_write_str(dir, "model.safetensors.index.json",
                 "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {"
                 "\"a\": \"model-00001-of-00002.safetensors\","
                 "\"c\": \"model-00002-of-00002.safetensors\","
                 "\"b\": \"model-00001-of-00002.safetensors\"}}");
    ls_st_t *st = ls_st_open(dir, errbuf, sizeof errbuf);
    if (!st)
        fail_msg("%s", errbuf);
    assert_int_equal(ls_st_count(st), 3);
    assert_contains(ls_st_find(st, "a")->file, "model-00001-of-00002.safetensors");
    assert_contains(ls_st_find(st, "c")->file, "model-00002-of-00002.safetensors");
    float out[3];
    assert_int_equal(ls_st_tensor_to_f32(ls_st_find(st, "c"), out), 0);
    assert_true(out[2] == fx_value(1, 2));
    ls_st_destroy(&st);
    fx_rmdir(&dir);
}

// --- malformed files -------------------------------------------------------------------------

// Writes an 8-byte length (hdrlen, or strlen(header) when hdrlen is UINT64_MAX), the header
// text and datalen zero bytes.
static void write_raw(const char *dir, const char *name, uint64_t hdrlen, const char *header,
                      size_t datalen)
{
    size_t hl = strlen(header);
    if (hdrlen == UINT64_MAX)
        hdrlen = hl;
    size_t n = 8 + hl + datalen;
    unsigned char *buf = calloc(1, n);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hdrlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    assert_int_equal(fx_write(dir, name, buf, n), 0);
    free(buf);
}

// Opens dir/name expecting failure; the message must contain every given fragment.
static void expect_fail(const char *dir, const char *name, int nfrag, ...)
{
    char p[4096];
    errbuf[0] = '\0';
    ls_st_t *st = ls_st_open(name ? fx_path(p, sizeof p, dir, name) : dir, errbuf, sizeof errbuf);
    if (st)
        fail_msg("opening %s succeeded", name ? name : dir);
    va_list ap;
    va_start(ap, nfrag);
    for (int i = 0; i < nfrag; i++)
        assert_contains(errbuf, va_arg(ap, const char *));
    va_end(ap);
}

static void test_malformed_headers(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    fx_write(dir, "short.safetensors", "\x01\x02\x03", 3);
    expect_fail(dir, "short.safetensors", 2, "short.safetensors", "too short");

    write_raw(dir, "long.safetensors", 1000, "{}", 0);
    expect_fail(dir, "long.safetensors", 3, "long.safetensors", "header length 1000",
                "exceeds the file");

    write_raw(dir, "notjson.safetensors", UINT64_MAX, "{\"a\": [1, 2", 0);
    expect_fail(dir, "notjson.safetensors", 2, "notjson.safetensors", "not valid JSON");

    write_raw(dir, "array.safetensors", UINT64_MAX, "[1, 2, 3]", 0);
    expect_fail(dir, "array.safetensors", 2, "array.safetensors", "not a JSON object");

    write_raw(dir, "trail.safetensors", UINT64_MAX, "{}   x", 0);
    expect_fail(dir, "trail.safetensors", 2, "trail.safetensors", "trailing");

    write_raw(dir, "meta.safetensors", UINT64_MAX, "{\"__metadata__\": 3}", 0);
    expect_fail(dir, "meta.safetensors", 2, "meta.safetensors", "__metadata__");

    // Header length above the 100 MB cap in a (sparse) file big enough to hold it.
    char p[4096];
    write_raw(dir, "huge.safetensors", 101u * 1000 * 1000, "{}", 0);
    assert_int_equal(truncate(fx_path(p, sizeof p, dir, "huge.safetensors"), 102 * 1000 * 1000),
                     0);
    expect_fail(dir, "huge.safetensors", 2, "huge.safetensors", "100 MB");

    // Padding with spaces and __metadata__ are fine; an empty checkpoint is valid.
    write_raw(dir, "pad.safetensors", UINT64_MAX,
              "{\"__metadata__\": {\"format\": \"pt\"}}      ", 0);
    ls_st_t *st = ls_st_open(fx_path(p, sizeof p, dir, "pad.safetensors"), errbuf, sizeof errbuf);
    assert_non_null(st);
    assert_int_equal(ls_st_count(st), 0);
    ls_st_destroy(&st);
    fx_rmdir(&dir);
}

static void test_malformed_tensors(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    const char *T = "model.layers.0.mlp.up_proj.weight";
    char h[512];

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": "
             "[12, 900]}}", T);
    write_raw(dir, "range.safetensors", UINT64_MAX, h, 800);
    expect_fail(dir, "range.safetensors", 4, "range.safetensors", T, "[12, 900)",
                "data section (800 bytes)");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": "
             "[8, 4]}}", T);
    write_raw(dir, "rev.safetensors", UINT64_MAX, h, 16);
    expect_fail(dir, "rev.safetensors", 2, "rev.safetensors", T);

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": "
             "[0, 16]}}", T);
    write_raw(dir, "size.safetensors", UINT64_MAX, h, 16);
    expect_fail(dir, "size.safetensors", 4, "size.safetensors", T, "hold 16 bytes",
                "needs 12");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": "
             "[0, 16]}}", T);
    write_raw(dir, "dtype.safetensors", UINT64_MAX, h, 16);
    expect_fail(dir, "dtype.safetensors", 3, "dtype.safetensors", T, "\"I64\" is not supported");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, "
             "4294967296], \"data_offsets\": [0, 0]}}", T);
    write_raw(dir, "overflow.safetensors", UINT64_MAX, h, 0);
    expect_fail(dir, "overflow.safetensors", 3, "overflow.safetensors", T, "overflows");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
             "\"data_offsets\": [0, 0]}}", T);
    write_raw(dir, "overflow2.safetensors", UINT64_MAX, h, 0);
    expect_fail(dir, "overflow2.safetensors", 3, "overflow2.safetensors", T, "overflows");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [-1, 2], \"data_offsets\": "
             "[0, 0]}}", T);
    write_raw(dir, "neg.safetensors", UINT64_MAX, h, 0);
    expect_fail(dir, "neg.safetensors", 3, "neg.safetensors", T, "non-negative integer");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": "
             "[0, 0]}}", T);
    write_raw(dir, "frac.safetensors", UINT64_MAX, h, 0);
    expect_fail(dir, "frac.safetensors", 2, "frac.safetensors", T);

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
             "\"data_offsets\": [0, 4]}}", T);
    write_raw(dir, "dims.safetensors", UINT64_MAX, h, 4);
    expect_fail(dir, "dims.safetensors", 3, "dims.safetensors", T, "9 dimensions");

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [1]}}", T);
    write_raw(dir, "nooff.safetensors", UINT64_MAX, h, 4);
    expect_fail(dir, "nooff.safetensors", 3, "nooff.safetensors", T, "data_offsets");

    snprintf(h, sizeof h, "{\"%s\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", T);
    write_raw(dir, "nodtype.safetensors", UINT64_MAX, h, 4);
    expect_fail(dir, "nodtype.safetensors", 3, "nodtype.safetensors", T, "dtype");

    snprintf(h, sizeof h, "{\"%s\": 7}", T);
    write_raw(dir, "entry.safetensors", UINT64_MAX, h, 0);
    expect_fail(dir, "entry.safetensors", 2, "entry.safetensors", T);

    snprintf(h, sizeof h, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": "
             "[0, 4]}, \"%s\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
             T, T);
    write_raw(dir, "dup.safetensors", UINT64_MAX, h, 8);
    expect_fail(dir, "dup.safetensors", 3, "dup.safetensors", T, "twice");

    expect_fail(dir, "absent.safetensors", 2, "absent.safetensors", "cannot open");
    fx_rmdir(&dir);
}

static void test_malformed_shards(void **state)
{
    (void)state;
    char *dir = fx_tmpdir();
    char p[4096];
    expect_fail(dir, NULL, 2, dir, "neither model.safetensors");

    write_shard(dir, "s1.safetensors", (const char *[]){"a", "b"}, 2);
    write_shard(dir, "s2.safetensors", (const char *[]){"b"}, 1);
    const char *idx = "model.safetensors.index.json";

    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"z\": \"gone.safetensors\"}}");
    expect_fail(dir, NULL, 4, idx, "\"z\"", "gone.safetensors", "cannot open");

    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": \"../s1.safetensors\"}}");
    expect_fail(dir, NULL, 3, idx, "\"a\"", "\"..\" components are not allowed");

    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": \"/etc/passwd\"}}");
    expect_fail(dir, NULL, 3, idx, "\"a\"", "not a relative file name");

    // A symlink inside the directory that points outside it.
    char *outside = fx_tmpdir();
    write_shard(outside, "evil.safetensors", (const char *[]){"a"}, 1);
    char target[4096];
    assert_int_equal(symlink(fx_path(target, sizeof target, outside, "evil.safetensors"),
                             fx_path(p, sizeof p, dir, "link.safetensors")), 0);
    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": \"link.safetensors\"}}");
    expect_fail(dir, NULL, 3, idx, "\"a\"", "is a symbolic link");
    fx_rmdir(&outside);

    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\"}}");
    expect_fail(dir, NULL, 4, "\"b\"", "s1.safetensors", "s2.safetensors", "also defined");

    write_shard(dir, "s3.safetensors", (const char *[]){"c"}, 1);
    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": \"s1.safetensors\", \"c\": \"s1.safetensors\", "
                           "\"x\": \"s3.safetensors\"}}");
    expect_fail(dir, NULL, 3, idx, "\"c\"", "not found in its shard");

    fx_write_str(dir, idx, "{\"weight_map\": [1]}");
    expect_fail(dir, NULL, 2, idx, "weight_map");

    fx_write_str(dir, idx, "{\"weight_map\": {\"a\": 5}}");
    expect_fail(dir, NULL, 3, idx, "\"a\"", "not a string");

    // A corrupt shard reports the shard's own file and tensor.
    char h[256];
    snprintf(h, sizeof h, "{\"q\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}");
    write_raw(dir, "bad.safetensors", UINT64_MAX, h, 8);
    fx_write_str(dir, idx, "{\"weight_map\": {\"q\": \"bad.safetensors\"}}");
    expect_fail(dir, NULL, 3, "bad.safetensors", "\"q\"", "exceed the data section");

    // Shards in a subdirectory are fine.
    mkdir(fx_path(p, sizeof p, dir, "sub"), 0755);
    write_shard(p, "in.safetensors", (const char *[]){"deep"}, 1);
    fx_write_str(dir, idx, "{\"weight_map\": {\"deep\": \"sub/in.safetensors\"}}");
    ls_st_t *st = ls_st_open(dir, errbuf, sizeof errbuf);
    if (!st)
        fail_msg("%s", errbuf);
    assert_non_null(ls_st_find(st, "deep"));
    ls_st_destroy(&st);
    fx_rmdir(&dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_known),
        cmocka_unit_test(test_f16_known),
        cmocka_unit_test(test_single_file_and_dir),
        cmocka_unit_test(test_scalar_empty_and_nonfinite),
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_malformed_tensors),
        cmocka_unit_test(test_malformed_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
