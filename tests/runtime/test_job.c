// The job thread, runtime/ls_job.c: actors in threads of one process, submitting jobs.
//   jobs           — work runs on one background thread, in submission order; completions run
//                    on the loop in submission order (earlier jobs take longer), recorded
//   results        — ls_actor_job_result: what the work left in the result reaches `done`, and
//                    the completion's record carries exactly those bytes (a plain job's none)
//   done_after_stop — a `done` that stops the actor is the last: no other `done` runs after it
//   dropped_at_stop — the actor stops with one job working and two waiting: destroying it
//                    waits for the one in progress, never starts the others, and runs no `done`
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

// dropped_at_stop watches the stop begin from inside (ls_actor_impl.h: job_quit under job_lock),
// the only way to hold the job in progress until the runtime has given up the ones waiting.
#include "ls_actor_impl.h"

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
        // One background thread for all of them, not one each.
        assert_true(pthread_equal(s_jobs[i].worked_on, s_jobs[0].worked_on));
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

// ---------------------------------------------------------------------------------------------
// results: ls_actor_job_result's bytes reach `done` and the trace

typedef struct {
    uint32_t magic;
    char text[28];
} read_t;  // plain bytes, as ls_actor_job_result requires

typedef struct {
    read_t result;      // written by the work, on the job thread
    read_t seen;        // what `done` found there, on the loop
    int plain_value;    // the plain job's work leaves it in its arg
    int plain_seen;
    int dones;
} results_t;

static void s_read_work(void *arg) {
    results_t *st = arg;
    st->result.magic = 0xc0ffee;
    snprintf(st->result.text, sizeof st->result.text, "read from the outside");
}

static void s_read_done(ls_actor_t *a, void *arg) {
    results_t *st = arg;
    st->seen = st->result;
    if (++st->dones == 2)
        ls_actor_shutdown(a, "results in");
}

static void s_plain_work(void *arg) { ((results_t *)arg)->plain_value = 42; }

static void s_plain_done(ls_actor_t *a, void *arg) {
    results_t *st = arg;
    st->plain_seen = st->plain_value;
    if (++st->dones == 2)
        ls_actor_shutdown(a, "results in");
}

static int s_results_start(ls_actor_t *a, void *state) {
    results_t *st = state;
    if (ls_actor_job_result(a, s_read_work, s_read_done, st, &st->result, sizeof st->result) < 0)
        return -1;
    return ls_actor_job(a, s_plain_work, s_plain_done, st);
}

static void test_results(void **unused) {
    char tdir[128];
    rt_trace_dir(tdir, sizeof tdir);
    static results_t st;
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "resulter", .dispatch = table, .state = &st, .on_start = s_results_start};
    ls_actor_opts_t opts = {.name = "resulter", .trace_dir = tdir};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    rt_join(&r);
    assert_int_equal(st.dones, 2);
    assert_int_equal(st.seen.magic, 0xc0ffee);
    assert_string_equal(st.seen.text, "read from the outside");
    assert_int_equal(st.plain_seen, 42);

    char err[512];
    ls_trace_reader_t *rd = rt_trace_open("resulter");
    static ls_trace_record_t rec;
    int jobs = 0;
    while (ls_trace_read(rd, &rec, err, sizeof err) == 1) {
        if (rec.kind != LS_TRACE_JOB)
            continue;
        jobs++;
        if (rec.aux == 1) {
            // The result as the work left it: what replay puts back instead of running the work.
            assert_int_equal(rec.nframes, 1);
            assert_int_equal(rec.frames[0].len, sizeof(read_t));
            assert_memory_equal(rec.frames[0].data, &st.seen, sizeof(read_t));
        } else {
            assert_int_equal(rec.aux, 2);
            assert_int_equal(rec.nframes, 0);  // a plain job: its work runs again in replay
        }
    }
    ls_trace_reader_destroy(&rd);
    assert_int_equal(jobs, 2);
}

// ---------------------------------------------------------------------------------------------
// done_after_stop: the actor is stopping, so no further `done` runs

typedef struct {
    int dones[3];
} stop_t;

static void s_quick_work(void *arg) {}

static void s_stop_done(ls_actor_t *a, void *arg) {
    int *done = arg;
    (*done)++;
    ls_actor_shutdown(a, "first job done");
}

static int s_stop_start(ls_actor_t *a, void *state) {
    stop_t *st = state;
    for (int i = 0; i < 3; i++)
        if (ls_actor_job(a, s_quick_work, s_stop_done, &st->dones[i]) < 0)
            return -1;
    return 0;
}

static void test_done_after_stop(void **unused) {
    static stop_t st;
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "quitter", .dispatch = table, .state = &st, .on_start = s_stop_start};
    ls_actor_opts_t opts = {.name = "quitter"};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    rt_join(&r);
    // Whether the later jobs had finished their work when the first `done` stopped the actor
    // or not, their `done` never runs: the actor is going away.
    assert_int_equal(st.dones[0], 1);
    assert_int_equal(st.dones[1], 0);
    assert_int_equal(st.dones[2], 0);
}

// ---------------------------------------------------------------------------------------------
// dropped_at_stop: destroying the actor waits for the job in progress and drops the rest

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int started, open, finished;  // the held job: working, let go, returned
    int others_ran;               // work of the jobs behind it
    int dones;
} gate_t;

static gate_t s_gate = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void s_held_work(void *arg) {
    gate_t *g = arg;
    pthread_mutex_lock(&g->lock);
    g->started = 1;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->lock);
    g->finished = 1;
    pthread_mutex_unlock(&g->lock);
}

static void s_other_work(void *arg) { __atomic_add_fetch(&((gate_t *)arg)->others_ran, 1, __ATOMIC_SEQ_CST); }

static void s_gate_done(ls_actor_t *a, void *arg) { __atomic_add_fetch(&((gate_t *)arg)->dones, 1, __ATOMIC_SEQ_CST); }

static int s_gate_start(ls_actor_t *a, void *state) {
    if (ls_actor_job(a, s_held_work, s_gate_done, state) < 0)
        return -1;
    for (int i = 0; i < 2; i++)
        if (ls_actor_job(a, s_other_work, s_gate_done, state) < 0)
            return -1;
    return 0;
}

// Opens the gate once ls_actor_destroy has told the job thread to quit: by then the waiting
// jobs are given up, so a job thread that went on to them would be the runtime's fault.
static void *s_opener(void *arg) {
    ls_actor_t *a = arg;
    for (int quit = 0; !quit; usleep(1000)) {
        pthread_mutex_lock(&a->job_lock);
        quit = a->job_quit;
        pthread_mutex_unlock(&a->job_lock);
    }
    pthread_mutex_lock(&s_gate.lock);
    s_gate.open = 1;
    pthread_cond_broadcast(&s_gate.cond);
    pthread_mutex_unlock(&s_gate.lock);
    return NULL;
}

static void test_dropped_at_stop(void **unused) {
    char ep[128];
    rt_endpoint(ep, sizeof ep, "gated");
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "gated", .dispatch = table, .state = &s_gate, .on_start = s_gate_start};
    ls_actor_opts_t opts = {.name = "gated", .bind = ep};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    pthread_mutex_lock(&s_gate.lock);
    while (!s_gate.started)
        pthread_cond_wait(&s_gate.cond, &s_gate.lock);
    pthread_mutex_unlock(&s_gate.lock);

    // The first job is working; stop the actor under it.
    zsock_t *c = rt_client(ep);
    rt_client_shutdown(c);
    pthread_t opener;
    assert_int_equal(pthread_create(&opener, NULL, s_opener, r.actor), 0);
    rt_join(&r);  // ls_actor_destroy returns only after the held job's work did
    pthread_join(opener, NULL);
    zsock_destroy(&c);
    assert_int_equal(s_gate.finished, 1);
    assert_int_equal(s_gate.others_ran, 0);
    assert_int_equal(s_gate.dones, 0);
}

int main(void) {
    if (rt_init("runtime-job", 100) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jobs),
        cmocka_unit_test(test_results),
        cmocka_unit_test(test_done_after_stop),
        cmocka_unit_test(test_dropped_at_stop),
    };
    return rt_fini(cmocka_run_group_tests(tests, NULL, NULL));
}
