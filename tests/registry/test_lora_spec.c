// lora_spec: every form of a startup adapter (--lora-paths, --lora-modules) parses to its name,
// path and pin, and every malformed value is refused with a message that quotes it.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "lora_spec.h"

static void s_ok(const char *value, const char *name, const char *path, bool pinned) {
    lora_spec_t spec;
    char err[512] = "";
    if (lora_spec_parse(value, &spec, err, sizeof err) < 0)
        fail_msg("%s: %s", value, err);
    assert_string_equal(spec.name, name);
    assert_string_equal(spec.path, path);
    assert_int_equal(spec.pinned, pinned);
    lora_spec_clear(&spec);
    lora_spec_clear(&spec);  // idempotent
}

static void s_bad(const char *value, const char *why) {
    lora_spec_t spec;
    char err[512] = "";
    if (lora_spec_parse(value, &spec, err, sizeof err) == 0)
        fail_msg("%s: accepted as %s=%s", value, spec.name, spec.path);
    assert_null(spec.name);
    assert_non_null(strstr(err, value));
    if (!strstr(err, why))
        fail_msg("%s: \"%s\" does not say \"%s\"", value, err, why);
}

static void test_forms(void **unused) {
    s_ok("a=/x/y", "a", "/x/y", false);
    s_ok("a=/x/y:pinned", "a", "/x/y", true);
    s_ok("/x/reverse", "reverse", "/x/reverse", false);
    s_ok("/x/reverse/", "reverse", "/x/reverse/", false);
    s_ok("rel/upper:pinned", "upper", "rel/upper", true);
    s_ok("{\"lora_name\": \"s\", \"lora_path\": \"/x/sort\", \"pinned\": true}", "s", "/x/sort", true);
    s_ok("{\"lora_name\": \"s\", \"lora_path\": \"/x/sort\"}", "s", "/x/sort", false);
    s_ok("{\"name\": \"d\", \"path\": \"/x/digits\", \"base_model_name\": \"demo\"}", "d", "/x/digits", false);
}

static void test_malformed(void **unused) {
    s_bad("{\"lora_name\": \"x\"", "not a JSON object");
    s_bad("{\"lora_name\": \"x\"}", "needs a name");
    s_bad("{\"lora_name\": \"x\", \"lora_path\": 3}", "must be strings");
    s_bad("{\"lora_name\": \"x\", \"lora_path\": \"/p\", \"pinned\": \"yes\"}", "\"pinned\" must be");
    s_bad("{\"lora_name\": \"x\", \"lora_path\": \"/p\", \"rank\": 8}", "unknown key");
    s_bad("{\"lora_name\": \"x\", \"name\": \"y\", \"lora_path\": \"/p\"}", "not both");
    s_bad("=/x/y", "the name");
    s_bad("a=", "the path is empty");
    s_bad("a/b=/x", "the name");
    s_bad("/", "the name");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
