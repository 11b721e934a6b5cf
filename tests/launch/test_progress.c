// The launcher's console lines for load progress (launch/progress.c), without sockets: what a
// LoadProgress sequence prints, to a pipe and to a terminal.
//   pipe      — the first line, one per tenth, the last at 100%, numbers monotone; a line after
//               PROGRESS_PIPE_S even within a tenth; a start (total 0) shows nothing
//   tty       — lines updated in place (\r, erase), a newline once done, when another
//               actor's line comes between and before a log line (progress_break)
//   malformed — done past total, bytes of an unknown total: -1, nothing shown, the load goes on;
//               control characters in `what` shown as '?', a long one cut; a load whose bytes
//               go back starts over (a restarted worker)
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "progress.h"

#define MS 1000000ull

typedef struct {
    char *text;
    size_t len;
    FILE *f;
    progress_t *p;
} console_t;

static void s_open(console_t *c, bool tty) {
    c->f = open_memstream(&c->text, &c->len);
    assert_non_null(c->f);
    c->p = progress_new(c->f, tty);
    assert_non_null(c->p);
}

static void s_close(console_t *c) {
    progress_destroy(&c->p);
    assert_null(c->p);
    fclose(c->f);
}

static int s_lines(const char *text) {
    int n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

static void test_pipe(void **state) {
    console_t c;
    s_open(&c, false);
    const uint64_t total = 2000000000;  // 2 GB
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 0, 0, 1 * MS), 0);
    fflush(c.f);
    assert_int_equal(c.len, 0);
    for (int pct = 1; pct <= 100; pct++)
        assert_int_equal(progress_note(c.p, "worker-0", "weights", total / 100 * pct, total, (1 + 10 * pct) * MS), 0);
    s_close(&c);
    // 1% first, then 10%, 20% … 100%: eleven lines, numbers going up, the rate shown.
    assert_int_equal(s_lines(c.text), 11);
    assert_non_null(strstr(c.text, "worker-0: loading weights 0.0/2.0 GB (1%), 2.0 GB/s\n"));
    assert_non_null(strstr(c.text, "worker-0: loading weights 2.0/2.0 GB (100%), 2.0 GB/s\n"));
    int last = -1;
    for (const char *at = c.text; (at = strchr(at, '(')); at++) {
        int pct = atoi(at + 1);
        assert_true(pct > last);
        last = pct;
    }
    assert_int_equal(last, 100);
    free(c.text);

    // Slow: a line every PROGRESS_PIPE_S seconds within one tenth.
    s_open(&c, false);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 1, 100, 1 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 2, 100, 2 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 3, 100, (PROGRESS_PIPE_S * 1000 + 10) * MS), 0);
    s_close(&c);
    assert_int_equal(s_lines(c.text), 2);
    assert_non_null(strstr(c.text, "(3%)"));
    free(c.text);
}

static void test_tty(void **state) {
    console_t c;
    s_open(&c, true);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 0, 0, 1 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 10, 100, 2 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 11, 100, 3 * MS), 0);  // too soon: not shown
    assert_int_equal(progress_note(c.p, "worker-1", "weights", 50, 100, 400 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 60, 100, 800 * MS), 0);
    progress_break(c.p);  // a log line comes
    progress_break(c.p);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 100, 100, 801 * MS), 0);
    s_close(&c);
    assert_string_equal(c.text, "\r\033[Kworker-0: loading weights 0.0/0.1 kB (10%), 10 kB/s"
                                "\n\r\033[Kworker-1: loading weights 0.1/0.1 kB (50%)"
                                "\n\r\033[Kworker-0: loading weights 0.1/0.1 kB (60%), 0 kB/s"
                                "\n\r\033[Kworker-0: loading weights 0.1/0.1 kB (100%), 0 kB/s\n");
    free(c.text);
}

static void test_malformed(void **state) {
    console_t c;
    s_open(&c, false);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 5, 4, 1 * MS), -1);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", 5, 0, 1 * MS), -1);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", UINT64_MAX, UINT64_MAX, 2 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", "weights", UINT64_MAX - 1, UINT64_MAX, 3 * MS), 0);  // back: anew
    char what[200];
    memset(what, 'a', sizeof what - 1);
    what[sizeof what - 1] = 0;
    memcpy(what, "adapter \x1b[2J\n", 13);
    assert_int_equal(progress_note(c.p, "worker-0", what, 7, 7, 4 * MS), 0);
    assert_int_equal(progress_note(c.p, "worker-0", NULL, 7, 7, 5 * MS), 0);
    s_close(&c);
    assert_null(strchr(c.text, '\x1b'));
    assert_int_equal(s_lines(c.text), 4);
    char cut[160];
    snprintf(cut, sizeof cut, "worker-0: loading adapter ?[2J?%.*s 0.0/0.0 kB (100%%)\n", 64 - 13, what + 13);
    assert_non_null(strstr(c.text, cut));
    free(c.text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipe),
        cmocka_unit_test(test_tty),
        cmocka_unit_test(test_malformed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
