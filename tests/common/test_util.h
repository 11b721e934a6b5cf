// test_util — small helpers every test folder needs (files, temporary directories, JSON id
// arrays, a substring assertion), kept once here.
#ifndef LS_TEST_UTIL_H
#define LS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

// The whole file, NUL-terminated (malloc'd); NULL when it cannot be read. len may be NULL.
char *tu_read_file(const char *path, size_t *len);
// Creates /tmp/ls-<tag>-XXXXXX into out (cap bytes). 0, or -1 when it cannot.
int tu_tmpdir(char *out, size_t cap, const char *tag);
// Removes dir and everything in it. 0, or -1 (said on stderr).
int tu_rmrf(const char *dir);
// In a child the test forked: die with the test (SIGTERM when it exits), so a failed
// assertion that skips the test's own cleanup leaves no actor behind.
void tu_child_dies_with_parent(void);
// The integers of a JSON array into out (at most cap); returns how many.
int tu_json_ids(const cJSON *arr, int32_t *out, int cap);

#endif

// With cmocka (outside the include guard, so a file that included this before cmocka.h gets it
// by including this again after): fail unless hay contains needle, showing both.
#if defined(cmocka_unit_test) && !defined(assert_contains)
#include <string.h>
#define assert_contains(hay, needle)                                                    \
    do {                                                                                \
        const char *h_ = (hay);                                                         \
        if (!h_ || !strstr(h_, (needle)))                                               \
            fail_msg("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", (needle));     \
    } while (0)
#endif
