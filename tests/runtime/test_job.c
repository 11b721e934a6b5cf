// The job thread, runtime/ls_job.c: actors in threads of one process, submitting jobs.
//   jobs           — background work completes on the loop in submission order (earlier jobs
//                    take longer), recorded
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rt_support.h"

// ---------------------------------------------------------------------------------------------
// jobs: work on the background thread, completions on the loop in submission order

typedef struct {
    int index;
    int sleep_ms;
    pthread_t worked_on;
    int *order;
    int *n_done;
    pthread_t loop_thread;
    int on_loop;
} job_t;

static void s_job_work(void *arg) {
    job_t *j = arg;
    usleep((useconds_t)j->sleep_ms * 1000);
    j->worked_on = pthread_self();
}

static void s_job_done(ls_actor_t *a, void *arg) {
    job_t *j = arg;
    j->on_loop = pthread_equal(pthread_self(), j->loop_thread);
    j->order[(*j->n_done)++] = j->index;
    if (*j->n_done == 5)
        ls_actor_shutdown(a, "jobs done");
}

static job_t s_jobs[5];
static int s_job_order[5], s_jobs_done;

static int s_jobs_start(ls_actor_t *a, void *state) {
    for (int i = 0; i < 5; i++) {
        // Earlier jobs take longer: completion order must still be submission order.
        s_jobs[i] = (job_t){.index = i, .sleep_ms = 50 - 10 * i, .order = s_job_order, .n_done = &s_jobs_done,
                            .loop_thread = pthread_self()};
        if (ls_actor_job(a, s_job_work, s_job_done, &s_jobs[i]) < 0)
            return -1;
    }
    return 0;
}

static void test_jobs(void **unused) {
    char tdir[128];
    rt_trace_dir(tdir, sizeof tdir);
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "jobber", .dispatch = table, .on_start = s_jobs_start};
    ls_actor_opts_t opts = {.name = "jobber", .trace_dir = tdir};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    rt_join(&r);
    assert_int_equal(s_jobs_done, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(s_job_order[i], i);
        assert_true(s_jobs[i].on_loop);
        assert_false(pthread_equal(s_jobs[i].worked_on, s_jobs[i].loop_thread));
    }
    char err[512];
    ls_trace_reader_t *rd = rt_trace_open("jobber");
    static ls_trace_record_t rec;
    uint32_t next = 1;
    while (ls_trace_read(rd, &rec, err, sizeof err) == 1)
        if (rec.kind == LS_TRACE_JOB)
            assert_int_equal(rec.aux, next++);
    ls_trace_reader_destroy(&rd);
    assert_int_equal(next, 6);
}

int main(void) {
    if (rt_init("runtime-job", 100) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rt_fini();
    return failed;
}
