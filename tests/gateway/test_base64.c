// ls_base64: the strict decoder a load from tensors goes through. Round trips of every length
// against Python's encoding, and each way a text is refused, with the offset it names.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ls_base64.h"

static void s_ok(const char *text, const char *want, size_t want_len) {
    uint8_t out[64];
    size_t len = 99, bad = 0;
    assert_true(ls_base64_decoded_max(strlen(text)) <= sizeof out);
    assert_int_equal(ls_base64_decode(text, strlen(text), out, &len, &bad), 0);
    assert_int_equal(len, want_len);
    assert_memory_equal(out, want, want_len);
    assert_int_equal(ls_base64_encoded_len(want_len), strlen(text));
}

static void s_bad(const char *text, size_t want_at) {
    uint8_t out[64];
    size_t len = 99, bad = 99;
    assert_int_equal(ls_base64_decode(text, strlen(text), out, &len, &bad), -1);
    assert_int_equal(bad, want_at);
    assert_int_equal(len, 0);
}

static void test_decodes(void **state) {
    (void)state;
    s_ok("", "", 0);  // the caller decides whether nothing is acceptable
    s_ok("Zg==", "f", 1);
    s_ok("Zm8=", "fo", 2);
    s_ok("Zm9v", "foo", 3);
    s_ok("Zm9vYmFy", "foobar", 6);
    s_ok("AP8A/w==", "\x00\xff\x00\xff", 4);  // NULs and both high alphabet characters
    s_ok("+/+/", "\xfb\xff\xbf", 3);
}

static void test_refuses(void **state) {
    (void)state;
    s_bad("Zm9", 3);            // not a multiple of 4
    s_bad("Zm9v\n", 5);         // a line break makes the length wrong too
    s_bad("Zm 9", 2);           // whitespace
    s_bad("Zm-_", 2);           // URL-safe alphabet
    s_bad("Zg==Zm9v", 2);       // padding in the middle
    s_bad("Z===", 1);           // three '='
    s_bad("====", 0);
    s_bad("Zh==", 1);           // bits past the last byte
    s_bad("Zm9=", 2);
    s_bad("Zm9v\xc3\xa9==", 4); // not ASCII
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decodes),
        cmocka_unit_test(test_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
