// Flag parsing: forms, defaults, lists, errors.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ls_flags.h"

typedef struct {
    int n, on;
    double x;
    char *s;
    ls_strlist_t list;
} cfg_t;

static int s_parse(cfg_t *c, int argc, char **argv, char *err, size_t errlen) {
    ls_flag_t flags[] = {
        LS_FLAG_INT("num", &c->n, "7", "a number"),
        LS_FLAG_BOOL("on", &c->on, "a switch"),
        LS_FLAG_DOUBLE("x", &c->x, "0.5", "a real"),
        LS_FLAG_STR("s", &c->s, "dflt", "a string"),
        LS_FLAG_LIST("list", &c->list, "values"),
        LS_FLAG_END,
    };
    ls_flag_t *tables[] = {flags, NULL};
    return ls_flags_parse(tables, argc, argv, err, errlen);
}

static void test_defaults(void **unused) {
    cfg_t c = {0};
    char err[256];
    char *argv[] = {"prog"};
    assert_int_equal(s_parse(&c, 1, argv, err, sizeof err), 0);
    assert_int_equal(c.n, 7);
    assert_int_equal(c.on, 0);
    assert_true(c.x == 0.5);
    assert_string_equal(c.s, "dflt");
    assert_int_equal(c.list.n, 0);
}

static void test_forms(void **unused) {
    cfg_t c = {0};
    char err[256];
    char *argv[] = {"prog", "--num", "12", "--on", "--x=2.5", "--s=hello", "--list", "a=1", "b=2", "--list=c=3"};
    assert_int_equal(s_parse(&c, 10, argv, err, sizeof err), 0);
    assert_int_equal(c.n, 12);
    assert_int_equal(c.on, 1);
    assert_true(c.x == 2.5);
    assert_string_equal(c.s, "hello");
    assert_int_equal(c.list.n, 3);
    assert_string_equal(c.list.v[0], "a=1");
    assert_string_equal(c.list.v[2], "c=3");
}

static void test_errors(void **unused) {
    char err[256];
    struct {
        int argc;
        char *argv[4];
        const char *needle;
    } cases[] = {
        {2, {"prog", "--nope"}, "unknown flag --nope"},
        {3, {"prog", "--num", "abc"}, "expects an integer"},
        {2, {"prog", "--num"}, "needs a value"},
        {2, {"prog", "stray"}, "unexpected argument"},
        {2, {"prog", "--list"}, "at least one value"},
        {2, {"prog", "--on=maybe"}, "true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cfg_t c = {0};
        assert_int_equal(s_parse(&c, cases[i].argc, cases[i].argv, err, sizeof err), -1);
        assert_non_null(strstr(err, cases[i].needle));
    }
    cfg_t c = {0};
    char *help[] = {"prog", "--help"};
    assert_int_equal(s_parse(&c, 2, help, err, sizeof err), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
