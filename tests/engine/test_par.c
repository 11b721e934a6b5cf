// ls_par_for: every index runs exactly once whatever the thread count (1, the default, more
// threads than items, more than the cap), and the loop returns only when all have run.
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

#include "ls_par.h"

typedef struct {
    atomic_int *hits;
} s_count_t;

static void s_hit(void *arg, size_t i) {
    s_count_t *c = arg;
    atomic_fetch_add(&c->hits[i], 1);
}

static void test_each_index_once(void **unused) {
    const size_t sizes[] = {0, 1, 3, 1000};
    const int threads[] = {1, 0, 5, 64};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (size_t t = 0; t < sizeof threads / sizeof *threads; t++) {
            s_count_t c = {calloc(sizes[s] + 1, sizeof(atomic_int))};
            ls_par_for(sizes[s], threads[t], s_hit, &c);
            for (size_t i = 0; i < sizes[s]; i++)
                assert_int_equal(atomic_load(&c.hits[i]), 1);
            free(c.hits);
        }
    assert_true(ls_par_threads() >= 1 && ls_par_threads() <= 8);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_each_index_once)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
