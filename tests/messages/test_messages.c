/*  test_messages.c — the message codec: round trips of every type, the printer and
    JSON, and a decoder that survives anything (truncation, bad types, versions, random
    bytes, bit flips) by returning -1 with a reason.

    The tests walk every type id up to LS_MSG_TYPE_MAX, so a message added to the schema
    is covered without touching this file.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cJSON.h>
#include <msgpack.h>

#include "ls_msg.h"

//  Encode m, failing the test if that does not work.
static char *s_encode(const ls_msg_t *m, size_t *len) {
    char *buf = NULL;
    assert_int_equal(ls_msg_encode(m, &buf, len), 0);
    assert_non_null(buf);
    return buf;
}

//  Decode what should be refused: -1, a code, a reason, and m left cleared.
static void s_expect_refused(const void *buf, size_t len, ls_msgerr_code_t code, const char *reason) {
    ls_msg_t m;
    ls_msgerr_t err;
    if (ls_msg_decode(buf, len, &m, &err) != -1)
        fail_msg("decoded, expected %s", reason ? reason : "an error");
    assert_int_equal(err.code, code);
    assert_true(err.text[0]);
    if (reason && !strstr(err.text, reason))
        fail_msg("error '%s' lacks '%s'", err.text, reason);
    assert_int_equal(m.type, 0);
}

//  A hand-made body: [version, type, 0, 7, {n fields...}]; the caller packs the fields.
typedef struct {
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
} s_body_t;

static msgpack_packer *s_body_begin(s_body_t *body, uint64_t version, uint64_t type, uint32_t fields) {
    msgpack_sbuffer_init(&body->sbuf);
    msgpack_packer_init(&body->pk, &body->sbuf, msgpack_sbuffer_write);
    msgpack_pack_array(&body->pk, 5);
    msgpack_pack_uint64(&body->pk, version);
    msgpack_pack_uint64(&body->pk, type);
    msgpack_pack_uint32(&body->pk, 0);
    msgpack_pack_uint64(&body->pk, 7);
    msgpack_pack_map(&body->pk, fields);
    return &body->pk;
}

static void s_pack_cstr(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static void test_roundtrip_every_type(void **state) {
    int types = 0;
    for (int type = 1; type <= LS_MSG_TYPE_MAX; type++) {
        const char *name = ls_msg_type_name(type);
        if (!name)
            continue;
        types++;
        assert_int_equal(ls_msg_type_from_name(name), type);
        for (uint64_t seed = 0; seed < 200; seed++) {
            ls_msg_t m, back;
            ls_msgerr_t err;
            ls_msg_fill_random(&m, type, seed * 7919 + type);
            size_t len, len2;
            char *buf = s_encode(&m, &len);
            if (ls_msg_decode(buf, len, &back, &err))
                fail_msg("%s seed %llu: %s", name, (unsigned long long)seed, err.text);
            assert_true(ls_msg_equal(&m, &back));
            assert_int_equal(back.version, LS_SCHEMA_VERSION);
            char *buf2 = s_encode(&back, &len2);
            assert_int_equal(len, len2);
            assert_memory_equal(buf, buf2, len);

            char line[512];
            int full = ls_msg_format(&m, line, sizeof line);
            assert_true(full > 0 && strncmp(line, name, strlen(name)) == 0);
            cJSON *json = ls_msg_to_json(&m);
            assert_non_null(json);
            assert_string_equal(cJSON_GetObjectItem(json, "type")->valuestring, name);
            cJSON_Delete(json);

            free(buf);
            free(buf2);
            ls_msg_clear(&m);
            ls_msg_clear(&back);
        }
        //  an all-zero message is an empty map on the wire and stays all-zero
        ls_msg_t m, back;
        ls_msg_init(&m, type);
        size_t len;
        char *buf = s_encode(&m, &len);
        assert_int_equal(ls_msg_decode(buf, len, &back, NULL), 0);
        assert_true(ls_msg_equal(&m, &back));
        free(buf);
        ls_msg_clear(&back);
    }
    assert_true(types >= 23); // the catalogue as first written
}

static void test_equal_sees_differences(void **state) {
    ls_msg_t a, b;
    ls_msg_fill_random(&a, LS_MSG_STEP_PLAN, 1);
    ls_msg_fill_random(&b, LS_MSG_STEP_PLAN, 1);
    assert_true(ls_msg_equal(&a, &b));
    b.rid ^= 1;
    assert_false(ls_msg_equal(&a, &b));
    ls_msg_clear(&b);
    ls_msg_fill_random(&b, LS_MSG_STEP_PLAN, 2);
    assert_false(ls_msg_equal(&a, &b));
    ls_msg_clear(&a);
    ls_msg_clear(&b);
}

static void test_missing_unknown_and_nil_fields(void **state) {
    s_body_t body;
    msgpack_packer *pk = s_body_begin(&body, 1, LS_MSG_READY, 5);
    msgpack_pack_uint32(pk, 1); // actor
    s_pack_cstr(pk, "scheduler");
    msgpack_pack_uint32(pk, 99); // unknown: a newer schema's field, skipped
    msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, -1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_uint32(pk, 2);
    msgpack_pack_float(pk, 1.5f);
    msgpack_pack_uint32(pk, 4); // rank
    msgpack_pack_uint32(pk, 3);
    msgpack_pack_uint32(pk, 3); // endpoint: nil reads as absent
    msgpack_pack_nil(pk);
    msgpack_pack_uint32(pk, 1000);
    msgpack_pack_nil(pk);

    ls_msg_t m;
    ls_msgerr_t err;
    assert_int_equal(ls_msg_decode(body.sbuf.data, body.sbuf.size, &m, &err), 0);
    assert_int_equal(m.type, LS_MSG_READY);
    assert_int_equal(m.rid, 7);
    assert_string_equal(m.u.ready.actor, "scheduler");
    assert_int_equal(m.u.ready.rank, 3);
    assert_int_equal(m.u.ready.pid, 0);
    assert_null(m.u.ready.endpoint);
    ls_msg_clear(&m);
    ls_msg_clear(&m); // idempotent
    assert_int_equal(m.type, 0);
    msgpack_sbuffer_destroy(&body.sbuf);
}

static void test_version_and_type(void **state) {
    s_body_t body;
    s_body_begin(&body, LS_SCHEMA_VERSION + 1, LS_MSG_READY, 0);
    s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_VERSION, "schema version 2");
    msgpack_sbuffer_destroy(&body.sbuf);

    s_body_begin(&body, 0, LS_MSG_READY, 0);
    s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_MALFORMED, "0 is not a version");
    msgpack_sbuffer_destroy(&body.sbuf);

    s_body_begin(&body, 1, 60000, 0);
    s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_UNKNOWN_TYPE, "unknown message type 60000");
    msgpack_sbuffer_destroy(&body.sbuf);

    s_body_begin(&body, 1, 1ull << 40, 0);
    s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_UNKNOWN_TYPE, NULL);
    msgpack_sbuffer_destroy(&body.sbuf);

    assert_null(ls_msg_type_name(0));
    assert_null(ls_msg_type_name(LS_MSG_TYPE_MAX + 1));
    assert_null(ls_msg_type_name(-3));
    assert_int_equal(ls_msg_type_from_name("NoSuchMessage"), -1);
    assert_int_equal(ls_msg_type_from_name(NULL), -1);
    assert_string_equal(ls_msg_type_name(LS_MSG_GENERATE_REQ), "GenerateReq");
    assert_string_equal(ls_error_code_name(LS_ERROR_CODE_NOT_FOUND), "NOT_FOUND");
    assert_string_equal(ls_finish_reason_name(LS_FINISH_REASON_LENGTH), "LENGTH");
    assert_null(ls_finish_reason_name(1000));

    ls_msg_t m;
    ls_msg_init(&m, 0); // no such type: nothing to encode
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(&m, &buf, &len), -1);
}

//  Each case: a body for `type` with one field `id` whose value the packer writes,
//  and the reason the decoder must give.
typedef struct {
    int type;
    uint32_t id;
    void (*pack)(msgpack_packer *pk);
    const char *reason;
} s_bad_field_t;

static void s_pack_str_oops(msgpack_packer *pk) {
    s_pack_cstr(pk, "oops");
}
static void s_pack_big(msgpack_packer *pk) {
    msgpack_pack_uint64(pk, 1ull << 32);
}
static void s_pack_negative(msgpack_packer *pk) {
    msgpack_pack_int64(pk, -5);
}
static void s_pack_int_as_bool(msgpack_packer *pk) {
    msgpack_pack_uint32(pk, 1);
}
static void s_pack_nul_str(msgpack_packer *pk) {
    msgpack_pack_str(pk, 3);
    msgpack_pack_str_body(pk, "a\0b", 3);
}
static void s_pack_bin(msgpack_packer *pk) {
    msgpack_pack_bin(pk, 2);
    msgpack_pack_bin_body(pk, "ab", 2);
}
static void s_pack_ids_with_str(msgpack_packer *pk) {
    msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 1);
    s_pack_cstr(pk, "x");
}
static void s_pack_ids_too_big(msgpack_packer *pk) {
    msgpack_pack_array(pk, 1);
    msgpack_pack_int64(pk, (int64_t)INT32_MIN - 1);
}
static void s_pack_nested_bad(msgpack_packer *pk) // StepPlan.items[0].token_ids[1]
{
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_uint32(pk, 4);
    s_pack_ids_with_str(pk);
}
static void s_pack_record_not_map(msgpack_packer *pk) {
    msgpack_pack_array(pk, 0);
}

static void test_wrong_field_types(void **state) {
    static const s_bad_field_t cases[] = {
        {LS_MSG_GENERATE_REQ, 3, s_pack_str_oops,
         "malformed: field 3 (input_ids) of GenerateReq: expected array of int32, got str"},
        {LS_MSG_GENERATE_REQ, 3, s_pack_ids_with_str,
         "field 3 (input_ids) of GenerateReq: item 1: expected int32, got str"},
        {LS_MSG_GENERATE_REQ, 3, s_pack_ids_too_big, "item 0: -2147483649 is out of range for int32"},
        {LS_MSG_READY, 2, s_pack_big, "field 2 (pid) of Ready: 4294967296 is out of range for uint32"},
        {LS_MSG_HEARTBEAT, 2, s_pack_negative, "field 2 (seq) of Heartbeat: -5 is out of range"},
        {LS_MSG_GENERATE_REQ, 6, s_pack_int_as_bool,
         "field 6 (stream) of GenerateReq: expected bool, got uint"},
        {LS_MSG_READY, 1, s_pack_nul_str, "field 1 (actor) of Ready: string holds a NUL byte"},
        {LS_MSG_READY, 1, s_pack_bin, "expected str, got bin"},
        {LS_MSG_ERROR, 1, s_pack_str_oops, "field 1 (code) of Error: expected enum (uint), got str"},
        {LS_MSG_STEP_PLAN, 2, s_pack_nested_bad,
         "field 2 (items) of StepPlan: item 0: field 4 (token_ids) of StepItem: item 1: expected int32"},
        {LS_MSG_GENERATE_REQ, 5, s_pack_record_not_map,
         "field 5 (sampling) of GenerateReq: expected map (SamplingParams), got array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        s_body_t body;
        msgpack_packer *pk = s_body_begin(&body, 1, cases[i].type, 2);
        msgpack_pack_uint32(pk, 1000); // an unknown field first: skipping must not hide errors
        msgpack_pack_true(pk);
        msgpack_pack_uint32(pk, cases[i].id);
        cases[i].pack(pk);
        s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_MALFORMED, cases[i].reason);
        msgpack_sbuffer_destroy(&body.sbuf);
    }
}

static void test_bad_shapes(void **state) {
    //  a field given twice would leak or silently replace the first
    s_body_t body;
    msgpack_packer *pk = s_body_begin(&body, 1, LS_MSG_READY, 2);
    msgpack_pack_uint32(pk, 1);
    s_pack_cstr(pk, "a");
    msgpack_pack_uint32(pk, 1);
    s_pack_cstr(pk, "b");
    s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_MALFORMED,
                     "field 1 (actor) of Ready: given twice");
    msgpack_sbuffer_destroy(&body.sbuf);

    pk = s_body_begin(&body, 1, LS_MSG_READY, 1);
    s_pack_cstr(pk, "actor"); // keys are ids, not names
    s_pack_cstr(pk, "a");
    s_expect_refused(body.sbuf.data, body.sbuf.size, LS_MSGERR_MALFORMED,
                     "expected a field id as key, got str");
    msgpack_sbuffer_destroy(&body.sbuf);

    static const struct {
        const char *bytes;
        size_t len;
        const char *reason;
    } raw[] = {
        {"", 0, "malformed: truncated"},
        {"\xc1", 1, "reserved byte"},
        {"\x01", 1, "expected [version, type, group, rid, {fields}], got uint"},
        {"\x94\x01\x01\x00\x00", 5, "expected [version"},
        {"\x95\x01\x01\x00\x00\x01", 6, "Ready: expected a map of fields, got uint"},
        {"\x95\x01\x01\xa1x\x00\x80", 7, "Ready header: expected uint32, got str"},
        {"\x95\x01\x01\x00\x00\x80\x00", 7, "trailing bytes"},
        //  headers that promise billions of items in a few bytes: refused before any allocation
        {"\xdd\xff\xff\xff\xff", 5, "promises more items"},
        {"\x95\x01\x01\x00\x00\x81\x03\xdd\xff\xff\xff\xff", 12, "promises more items"},
        {"\xdf\xff\xff\xff\xff\x00", 6, "promises more items"},
        {"\x95\x01\x01\x00\x00\x81\x01\xdb\xff\xff\xff\xff", 12, "truncated"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++)
        s_expect_refused(raw[i].bytes, raw[i].len, LS_MSGERR_MALFORMED, raw[i].reason);

    //  nesting deeper than msgpack-c's parser stack: refused, not a crash
    char deep[200];
    memset(deep, 0x91, sizeof deep - 1);
    deep[sizeof deep - 1] = 0x01;
    s_expect_refused(deep, sizeof deep, LS_MSGERR_MALFORMED, NULL);
}

static void test_too_large(void **state) {
    size_t len = LS_MSG_MAX_BYTES + 1;
    char *big = calloc(1, len);
    assert_non_null(big);
    s_expect_refused(big, len, LS_MSGERR_TOO_LARGE, "too large");

    //  the encoder refuses what a peer would refuse
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GENERATE_REQ);
    memset(big, 'a', len - 1);
    m.u.generate_req.text = (ls_text_t){big, len - 1};
    char *buf;
    size_t out;
    assert_int_equal(ls_msg_encode(&m, &buf, &out), -1);
    ls_msg_clear(&m);
}

static void test_truncated_at_every_length(void **state) {
    for (int type = 1; type <= LS_MSG_TYPE_MAX; type++) {
        if (!ls_msg_type_name(type))
            continue;
        ls_msg_t m;
        ls_msg_fill_random(&m, type, 42 + type);
        size_t len;
        char *buf = s_encode(&m, &len);
        for (size_t cut = 0; cut < len; cut++) {
            //  a copy of exactly cut bytes, so ASan would see any read past the end
            char *part = malloc(cut ? cut : 1);
            memcpy(part, buf, cut);
            s_expect_refused(part, cut, LS_MSGERR_MALFORMED, "truncated");
            free(part);
        }
        free(buf);
        ls_msg_clear(&m);
    }
}

//  Any outcome is fine except a crash, a silent failure or an unstable success.
static void s_decode_anything(const uint8_t *buf, size_t len) {
    ls_msg_t m, back;
    ls_msgerr_t err;
    if (ls_msg_decode(buf, len, &m, &err) != 0) {
        assert_true(err.code != LS_MSGERR_NONE && err.text[0]);
        return;
    }
    size_t len2;
    char *buf2 = s_encode(&m, &len2);
    assert_int_equal(ls_msg_decode(buf2, len2, &back, &err), 0);
    assert_true(ls_msg_equal(&m, &back));
    char line[200];
    ls_msg_format(&m, line, sizeof line);
    cJSON_Delete(ls_msg_to_json(&m));
    free(buf2);
    ls_msg_clear(&m);
    ls_msg_clear(&back);
}

static void test_random_bytes(void **state) {
    uint64_t rng = 12345;
    uint8_t buf[300];
    for (int round = 0; round < 30000; round++) {
        size_t len = 0;
        //  a third start like a real header, so the body decoder is reached too
        if (round % 3 == 0) {
            buf[len++] = 0x95;
            buf[len++] = 0x01;
            buf[len++] = (uint8_t)(1 + round / 3 % LS_MSG_TYPE_MAX);
            buf[len++] = 0x00;
            buf[len++] = 0x00;
        }
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t extra = (rng >> 33) % (sizeof buf - len);
        for (size_t i = 0; i < extra; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            buf[len++] = (uint8_t)(rng >> 56);
        }
        s_decode_anything(buf, len);
    }
}

static void test_bit_flips(void **state) {
    for (int type = 1; type <= LS_MSG_TYPE_MAX; type++) {
        if (!ls_msg_type_name(type))
            continue;
        ls_msg_t m;
        ls_msg_fill_random(&m, type, 7 * type);
        size_t len;
        char *buf = s_encode(&m, &len);
        for (size_t bit = 0; bit < 8 * len && bit < 4096; bit++) {
            buf[bit / 8] ^= (char)(1 << bit % 8);
            s_decode_anything((uint8_t *)buf, len);
            buf[bit / 8] ^= (char)(1 << bit % 8);
        }
        free(buf);
        ls_msg_clear(&m);
    }
}

static void test_format(void **state) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GENERATE_REQ);
    m.rid = 7;
    m.u.generate_req.text = ls_msg_textdup("hi \"you\"\n", 9);
    int32_t ids[] = {1, 2, 3};
    m.u.generate_req.input_ids.v = malloc(sizeof ids);
    memcpy(m.u.generate_req.input_ids.v, ids, sizeof ids);
    m.u.generate_req.input_ids.n = 3;
    m.u.generate_req.sampling.temperature = 0.5f;
    m.u.generate_req.sampling.top_k = -1;
    char line[256];
    const char *expect = "GenerateReq v1 g0 rid=7 {text=\"hi \\\"you\\\"\\n\" input_ids=[1,2,3] "
                         "sampling={temperature=0.5 top_k=-1}}";
    assert_int_equal(ls_msg_format(&m, line, sizeof line), strlen(expect));
    assert_string_equal(line, expect);

    //  a short buffer gets a NUL-terminated prefix; the return says how long it would be
    char shortline[12];
    assert_int_equal(ls_msg_format(&m, shortline, sizeof shortline), strlen(expect));
    assert_string_equal(shortline, "GenerateReq");
    assert_int_equal(ls_msg_format(&m, NULL, 0), strlen(expect));
    ls_msg_clear(&m);

    //  long arrays and strings are cut, with a count of what was left out
    ls_msg_init(&m, LS_MSG_TOKEN_OUT);
    m.u.token_out.token_ids.v = calloc(20, sizeof(int32_t));
    m.u.token_out.token_ids.n = 20;
    m.u.token_out.finish = LS_FINISH_REASON_LENGTH;
    assert_true(ls_msg_format(&m, line, sizeof line) > 0);
    assert_string_equal(line, "TokenOut v1 g0 rid=0 {token_ids=[0,0,0,0,0,0,0,0,...+12] finish=LENGTH}");
    ls_msg_clear(&m);

    ls_msg_init(&m, LS_MSG_ERROR);
    m.u.error.code = 77; // from a newer schema: shown as a number
    m.u.error.message = calloc(101, 1);
    memset(m.u.error.message, 'x', 100);
    ls_msg_format(&m, line, sizeof line);
    assert_non_null(strstr(line, "code=77 message=\"xxxx"));
    assert_non_null(strstr(line, "xxx\"...+52}"));
    ls_msg_clear(&m);
}

//  text fields keep NUL bytes through encode and decode; str fields still refuse them
static void test_text_keeps_nul(void **state) {
    ls_msg_t m, back;
    ls_msg_init(&m, LS_MSG_GENERATE_REQ);
    m.u.generate_req.text = ls_msg_textdup("a\0b nul inside", 14);
    m.u.generate_req.sampling.stop.v = calloc(2, sizeof(ls_text_t));
    m.u.generate_req.sampling.stop.v[0] = ls_msg_textdup("\0", 1);
    m.u.generate_req.sampling.stop.v[1] = ls_msg_textdup("x\0", 2);
    m.u.generate_req.sampling.stop.n = 2;
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(&m, &buf, &len), 0);
    assert_int_equal(ls_msg_decode(buf, len, &back, NULL), 0);
    assert_true(ls_msg_equal(&m, &back));
    assert_int_equal(back.u.generate_req.text.len, 14);
    assert_memory_equal(back.u.generate_req.text.s, "a\0b nul inside", 15);
    assert_int_equal(back.u.generate_req.sampling.stop.v[1].len, 2);
    assert_memory_equal(back.u.generate_req.sampling.stop.v[1].s, "x\0", 3);
    //  the printer shows the NUL and what follows it
    char line[256];
    ls_msg_format(&back, line, sizeof line);
    if (!strstr(line, "text=\"a\\x00b nul inside\""))
        fail_msg("%s", line);
    //  a different byte after the NUL is a different message
    back.u.generate_req.text.s[2] = 'c';
    assert_false(ls_msg_equal(&m, &back));
    free(buf);
    ls_msg_clear(&m);
    ls_msg_clear(&back);
}

static void test_json(void **state) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ERROR);
    m.rid = (1ull << 60) + 1; // beyond a double's exact integers
    m.u.error.code = LS_ERROR_CODE_NOT_FOUND;
    m.u.error.message = ls_msg_strdup("no adapter \"x\"");
    cJSON *json = ls_msg_to_json(&m);
    assert_non_null(json);
    assert_string_equal(cJSON_GetObjectItem(json, "type")->valuestring, "Error");
    assert_string_equal(cJSON_GetObjectItem(json, "rid")->valuestring, "1152921504606846977");
    cJSON *body = cJSON_GetObjectItem(json, "body");
    assert_string_equal(cJSON_GetObjectItem(body, "code")->valuestring, "NOT_FOUND");
    assert_string_equal(cJSON_GetObjectItem(body, "message")->valuestring, "no adapter \"x\"");
    assert_int_equal(cJSON_GetObjectItem(body, "ref_type")->valueint, 0); // zero fields too
    cJSON_Delete(json);
    ls_msg_clear(&m);

    ls_msg_init(&m, LS_MSG_READY);
    json = ls_msg_to_json(&m);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(json, "body"), "endpoint")));
    cJSON_Delete(json);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_type),
        cmocka_unit_test(test_equal_sees_differences),
        cmocka_unit_test(test_missing_unknown_and_nil_fields),
        cmocka_unit_test(test_version_and_type),
        cmocka_unit_test(test_wrong_field_types),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_too_large),
        cmocka_unit_test(test_truncated_at_every_length),
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_bit_flips),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_text_keeps_nul),
        cmocka_unit_test(test_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
