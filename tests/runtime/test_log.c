// ls_log: one logfmt line an event, quoted, filtered by level, and written whole (a reader of
// the log file never sees half a line, processes appending to one file never interleave).
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ls_log.h"

// path: a new empty file of this test's
static void s_tmp(char *path, size_t len) {
    snprintf(path, len, "/tmp/ls-test-log-XXXXXX"); // mkstemp's template
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

// fd 2 to a fresh file (O_APPEND, as the launcher opens actors' logs); returns the saved fd 2
static int s_capture(const char *path) {
    int saved = dup(2);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    assert_true(saved >= 0 && fd >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    close(fd);
    return saved;
}

static void s_restore(int saved) {
    assert_int_equal(dup2(saved, 2), 2);
    close(saved);
}

static char *s_read(const char *path) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static void test_line(void **unused) {
    (void)unused;
    char path[32];
    s_tmp(path, sizeof path);
    int saved = s_capture(path);
    ls_log_init("tester", LS_LOG_INFO);
    ls_debug(0, "not at info");
    ls_info(7, "a \"q\" b\\c\nd\x01" "e");
    ls_warn(0, "second");
    s_restore(saved);
    const char *text = s_read(path);
    unlink(path);
    char want[128];
    snprintf(want, sizeof want, " level=info actor=tester pid=%d rid=7 msg=", (int)getpid());
    const char *a = strstr(text, want);
    assert_non_null(a);
    assert_true(strncmp(text, "ts=", 3) == 0 && a - text == (ptrdiff_t)strlen("ts=2026-01-01T00:00:00.000Z"));
    static const char quoted[] = "\"a \\\"q\\\" b\\\\c\\nd\\x01e\"\n";
    assert_true(strncmp(a + strlen(want), quoted, strlen(quoted)) == 0);
    const char *second = strchr(a, '\n') + 1;
    assert_non_null(strstr(second, " level=warn actor=tester "));
    assert_non_null(strstr(second, " msg=\"second\"\n"));
    assert_null(strstr(text, "not at info"));
    int lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, 2);
}

// Children logging at once into one O_APPEND file: every line arrives whole. With a line
// written in pieces (the header, the quoted text, the newline) the pieces of different
// processes interleave.
static void test_whole_lines(void **unused) {
    (void)unused;
    enum { KIDS = 4, LINES = 400 };
    char path[32];
    s_tmp(path, sizeof path);
    int saved = s_capture(path);
    pid_t kids[KIDS];
    for (int k = 0; k < KIDS; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            ls_log_init("kid", LS_LOG_INFO);
            for (int i = 0; i < LINES; i++)
                ls_info((uint64_t)i + 1, "kid %d line %d \"quoted\" %s", k, i,
                        "................................................................");
            _exit(0);
        }
    }
    for (int k = 0; k < KIDS; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    s_restore(saved);
    char *text = s_read(path);
    unlink(path);
    int lines = 0, seen[KIDS] = {0};
    for (char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
        *nl = 0;
        int k, i;
        const char *m = strstr(line, " msg=\"kid ");
        if (strncmp(line, "ts=", 3) != 0 || !m || sscanf(m, " msg=\"kid %d line %d", &k, &i) != 2 ||
            k < 0 || k >= KIDS || strcmp(nl - 2, ".\"") != 0 || strstr(line + 3, "ts="))
            fail_msg("line %d is not whole: %.200s", lines, line);
        seen[k]++;
        lines++;
    }
    assert_int_equal(lines, KIDS * LINES);
    for (int k = 0; k < KIDS; k++)
        assert_int_equal(seen[k], LINES);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line),
        cmocka_unit_test(test_whole_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
