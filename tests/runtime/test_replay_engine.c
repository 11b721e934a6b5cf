// The replay engine, runtime/ls_replay.c, on a test actor of this file that has one of each
// kind of recorded event: an input read at start (ls_actor_input), a listener and a client's
// stream, messages on its ROUTER, a repeating timer, a job whose result is recorded
// (ls_actor_job_result) and a plain job. tests/replay replays the real actors end to end; this
// checks the engine's own promises event kind by event kind, without the actors' binaries.
//   replay_matches — the live run recorded, then replayed in process: the actor sees the same
//                    events in the same order with the same times (ls_actor_now_ns), the
//                    recorded input though the file changed, the recorded port, the recorded
//                    job result without running that work, a plain job's work run again
//   runs           — a trace holding two runs: --replay-run 1 and 2 each replay their own, 0
//                    the last; a run the file lacks, or a trace of another actor, is refused
//   diverges       — the actor replayed as itself matches (exit 0); made to answer a message,
//                    write a stream, start its timer or take its input otherwise, it stops at
//                    that record with exit 3 and says why (run as a child: divergence exits)
//   stop_in_job    — a job's `done` stops the actor while the next job has finished: the
//                    replay of that run matches (the finished job was once recorded after the
//                    stop, and its replay failed: "the recording goes on")
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "rt_support.h"
#include "test_util.h"

// ---------------------------------------------------------------------------------------------
// the recorded actor

// How the actor departs from its recording, for `diverges` (the child's argument).
typedef enum { SAME, OTHER_ANSWER, OTHER_WRITE, NO_TIMER, OTHER_INPUT } departure_t;

typedef struct {
    char text[32];
} weights_t;  // what the result job reads: plain bytes

typedef struct {
    departure_t mode;
    char dir[64];  // where the journal and weights files are (live only)
    char log[32][96];
    int nlog;
    int ticks, jobs, msgs, closed;
    int port;
    weights_t result;
    int plain;
} rec_t;

static int s_result_work_runs, s_plain_work_runs;

static void s_log(ls_actor_t *a, rec_t *st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void s_log(ls_actor_t *a, rec_t *st, const char *fmt, ...) {
    if (st->nlog == 32)
        return;
    char text[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(st->log[st->nlog++], sizeof st->log[0], "%s @%llu", text, (unsigned long long)ls_actor_now_ns(a));
}

// Everything recorded has happened: stop, as the last event.
static void s_maybe_done(ls_actor_t *a, rec_t *st) {
    if (st->ticks == 3 && st->jobs == 2 && st->msgs == 2 && st->closed == 1)
        ls_actor_shutdown(a, "all events in");
}

static void s_tick(ls_actor_t *a, ls_timer_t *t, void *arg) {
    rec_t *st = arg;
    s_log(a, st, "tick %d", ++st->ticks);
    if (st->ticks == 3)
        ls_actor_timer_stop(a, t);
    s_maybe_done(a, st);
}

static void s_read_file(const char *dir, const char *name, char *out, size_t cap) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = tu_read_file(path, NULL);
    snprintf(out, cap, "%s", text ? text : "(unreadable)");
    free(text);
}

static void s_result_work(void *arg) {
    rec_t *st = arg;
    __atomic_add_fetch(&s_result_work_runs, 1, __ATOMIC_SEQ_CST);
    s_read_file(st->dir, "weights", st->result.text, sizeof st->result.text);
}

static void s_result_done(ls_actor_t *a, void *arg) {
    rec_t *st = arg;
    st->jobs++;
    s_log(a, st, "result %s", st->result.text);
    s_maybe_done(a, st);
}

static void s_plain_work(void *arg) {
    __atomic_add_fetch(&s_plain_work_runs, 1, __ATOMIC_SEQ_CST);
    ((rec_t *)arg)->plain = 7;
}

static void s_plain_done(ls_actor_t *a, void *arg) {
    rec_t *st = arg;
    st->jobs++;
    s_log(a, st, "plain %d", st->plain);
    s_maybe_done(a, st);
}

static int s_on_request(ls_actor_t *a, ls_in_t *in, void *state) {
    rec_t *st = state;
    st->msgs++;
    s_log(a, st, "msg %llu", (unsigned long long)in->msg->rid);
    int rc = st->mode == OTHER_ANSWER && in->msg->rid == 2
                 ? ls_actor_reply_error(a, in, LS_ERROR_CODE_UNAVAILABLE, "not this time")
                 : ls_actor_reply(a, in, in->msg);
    s_maybe_done(a, st);
    return rc;
}

static void s_on_open(ls_actor_t *a, ls_stream_t *s, void *arg) { s_log(a, arg, "open %u", ls_stream_id(s)); }

static void s_on_data(ls_actor_t *a, ls_stream_t *s, const char *data, size_t len, void *arg) {
    rec_t *st = arg;
    s_log(a, st, "data %u %.*s", ls_stream_id(s), (int)len, data);
    ls_stream_write(s, st->mode == OTHER_WRITE ? "ECHO " : "echo ", 5);
    ls_stream_write(s, data, len);
}

static void s_on_close(ls_actor_t *a, ls_stream_t *s, const char *why, void *arg) {
    rec_t *st = arg;
    st->closed++;
    s_log(a, st, "close %u %s", ls_stream_id(s), why);
    s_maybe_done(a, st);
}

static int s_on_start(ls_actor_t *a, void *state) {
    rec_t *st = state;
    // The journal is read live only; a replay is handed the recorded one.
    zmsg_t *journal = zmsg_new();
    if (!ls_actor_replaying(a)) {
        char text[32];
        s_read_file(st->dir, "journal", text, sizeof text);
        zmsg_addstr(journal, text);
    }
    ls_actor_input(a, st->mode == OTHER_INPUT ? "another" : "journal", &journal);
    char *text = zmsg_popstr(journal);
    s_log(a, st, "input %s", text ? text : "(none)");
    free(text);
    zmsg_destroy(&journal);

    ls_stream_def_t sdef = {.on_open = s_on_open, .on_data = s_on_data, .on_close = s_on_close,
                            .max_unsent = 1 << 20, .stall_ms = 10000};
    if ((st->port = ls_actor_stream_listen(a, "127.0.0.1", 0, &sdef, st)) < 0)
        return -1;
    s_log(a, st, "port %d", st->port);
    if (st->mode != NO_TIMER && !ls_actor_timer_start(a, 5, 5, s_tick, st))
        return -1;
    if (ls_actor_job_result(a, s_result_work, s_result_done, st, &st->result, sizeof st->result) < 0)
        return -1;
    return ls_actor_job(a, s_plain_work, s_plain_done, st);
}

static const ls_dispatch_t s_table[] = {{LS_MSG_GENERATE_REQ, s_on_request}, {0, NULL}};
static ls_actor_def_t s_def = {.name = "rec", .dispatch = s_table, .on_start = s_on_start};

// Replays run `run` of trace as actor `name`; NULL when ls_actor_new refuses it.
static ls_actor_t *s_replayer(rec_t *st, const char *name, const char *trace, int run) {
    memset(st->log, 0, sizeof st->log);
    st->nlog = st->ticks = st->jobs = st->msgs = st->closed = st->port = st->plain = 0;
    memset(&st->result, 0, sizeof st->result);
    s_def.state = st;
    ls_actor_opts_t opts = {.name = name, .bind = "ipc://@never-bound", .replay = trace, .replay_run = run};
    return ls_actor_new(&s_def, &opts);
}

// ---------------------------------------------------------------------------------------------
// recording

static void s_write_file(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", rt_dir(), name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static rec_t s_live[2];  // the two recorded runs, as the live actor saw them

// One live run, recorded: two requests from a client, one stream, the timer and the jobs.
static void s_record(rec_t *st, const char *journal, const char *endpoint_name) {
    s_write_file("journal", journal);
    s_write_file("weights", "weights v1");
    memset(st, 0, sizeof *st);
    snprintf(st->dir, sizeof st->dir, "%s", rt_dir());
    s_def.state = st;
    char ep[128], tdir[128];
    rt_endpoint(ep, sizeof ep, endpoint_name);
    rt_trace_dir(tdir, sizeof tdir);
    ls_actor_opts_t opts = {.name = "rec", .bind = ep, .trace_dir = tdir};
    rt_runner_t r;
    ls_actor_t *a = ls_actor_new(&s_def, &opts);
    rt_start(&r, a);

    zsock_t *c = rt_client(ep);
    for (uint64_t i = 0; i < 2; i++) {
        ls_msg_t m, back;
        rt_random_request(&m, i);
        rt_client_send(c, &m);
        rt_client_recv(c, &back);
        assert_true(ls_msg_equal(&m, &back));
        ls_msg_clear(&m);
        ls_msg_clear(&back);
    }
    // The port is known once on_start ran, which the answers above prove.
    int fd = rt_tcp_connect(__atomic_load_n(&st->port, __ATOMIC_SEQ_CST));
    rt_tcp_send(fd, "hello", 5);
    char got[11];
    rt_tcp_recv(fd, got, 10);
    got[10] = 0;
    assert_string_equal(got, "echo hello");
    close(fd);
    rt_join(&r);  // the actor stops itself once every event is in
    zsock_destroy(&c);
    assert_int_equal(st->ticks, 3);
    assert_int_equal(st->jobs, 2);
}

static void test_replay_matches(void **unused) {
    s_record(&s_live[0], "journal one", "rec1");
    char trace[256];
    rt_trace_path(trace, sizeof trace, "rec");

    // What the live actor read is gone: a replay that read it again would see this.
    s_write_file("journal", "journal changed");
    s_write_file("weights", "weights changed");
    int result_runs = s_result_work_runs, plain_runs = s_plain_work_runs;
    static rec_t st;
    ls_actor_t *a = s_replayer(&st, "rec", trace, 0);
    assert_non_null(a);
    assert_int_equal(ls_actor_run(a), 0);
    ls_actor_destroy(&a);

    assert_int_equal(st.nlog, s_live[0].nlog);
    for (int i = 0; i < st.nlog; i++)
        assert_string_equal(st.log[i], s_live[0].log[i]);
    assert_contains(st.log[0], "input journal one");
    assert_int_equal(st.port, s_live[0].port);
    assert_string_equal(st.result.text, "weights v1");
    assert_int_equal(s_result_work_runs, result_runs);  // the recorded result stands in
    assert_int_equal(s_plain_work_runs, plain_runs + 1);  // a plain job's work runs again
}

static void test_runs(void **unused) {
    // A second run appended to the same trace (the first is test_replay_matches').
    s_record(&s_live[1], "journal two", "rec2");
    char trace[256];
    rt_trace_path(trace, sizeof trace, "rec");
    static rec_t st;
    for (int run = 0; run <= 2; run++) {
        const rec_t *live = &s_live[run == 1 ? 0 : 1];
        ls_actor_t *a = s_replayer(&st, "rec", trace, run);
        assert_non_null(a);
        assert_int_equal(ls_actor_run(a), 0);
        ls_actor_destroy(&a);
        assert_int_equal(st.nlog, live->nlog);
        for (int i = 0; i < st.nlog; i++)
            assert_string_equal(st.log[i], live->log[i]);
    }
    assert_null(s_replayer(&st, "rec", trace, 3));    // the file has two runs
    assert_null(s_replayer(&st, "other", trace, 0));  // rec's trace, not other's
}

// ---------------------------------------------------------------------------------------------
// divergence, in a child: the first difference ends the process with LS_REPLAY_DIVERGED

static const char *s_modes[] = {"same", "other-answer", "other-write", "no-timer", "other-input"};

// The child: replays the trace's last run as rec in `mode`; exits 3 where it diverges.
static int s_child(const char *mode, const char *trace) {
    ls_log_init("rec", LS_LOG_WARN);
    static rec_t st;
    for (int m = 0; m < 5; m++)
        if (!strcmp(mode, s_modes[m]))
            st.mode = (departure_t)m;
    ls_actor_t *a = s_replayer(&st, "rec", trace, 0);
    if (!a)
        return 1;
    int rc = ls_actor_run(a);
    ls_actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}

// Runs this program with arguments a1 a2 (and a3 unless NULL) as a child, its output in
// rt_dir()/child-<tag>.log; returns its exit status, its output in *out.
static int s_run_child_args(const char *tag, const char *a1, const char *a2, const char *a3, char **out) {
    char exe[4096], log[256];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    assert_true(n > 0);
    exe[n] = 0;
    snprintf(log, sizeof log, "%s/child-%s.log", rt_dir(), tag);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_child_dies_with_parent();
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(exe, exe, a1, a2, a3, (char *)NULL);
        _exit(127);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    *out = tu_read_file(log, NULL);
    assert_non_null(*out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs this program as the replay child of rec's trace in `mode`.
static int s_run_child(const char *mode, char **out) {
    char trace[256];
    rt_trace_path(trace, sizeof trace, "rec");
    return s_run_child_args(mode, "--replay-child", mode, trace, out);
}

static void test_diverges(void **unused) {
    // The trace of test_runs: its last run.
    static const struct {
        const char *mode, *why;
    } cases[] = {
        {"other-answer", "the messages differ"},
        {"other-write", "the bytes written differ"},
        {"no-timer", "timer 1 fires in the recording, but the actor has no such timer"},
        {"other-input", "the actor took an input the recording does not have here"},
    };
    char *out;
    assert_int_equal(s_run_child("same", &out), 0);
    assert_contains(out, "replay: rec matches");
    free(out);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = s_run_child(cases[i].mode, &out);
        if (rc != LS_REPLAY_DIVERGED)
            fail_msg("%s: exit %d, not %d; it said:\n%s", cases[i].mode, rc, LS_REPLAY_DIVERGED, out);
        assert_contains(out, "replay: rec DIVERGES from");
        assert_contains(out, cases[i].why);
        assert_contains(out, "  recorded: ");
        assert_contains(out, "  replayed: ");
        free(out);
    }
}

// ---------------------------------------------------------------------------------------------
// stop_in_job: the actor "stopper" submits two jobs; the first one's `done` waits (live) until
// the second has finished, then stops the actor

static int s_second_finished;

static void s_nothing(void *arg) {}
static void s_second_work(void *arg) { __atomic_store_n(&s_second_finished, 1, __ATOMIC_SEQ_CST); }

static void s_first_done(ls_actor_t *a, void *arg) {
    for (int i = 0; i < 500 && !ls_actor_replaying(a) && !__atomic_load_n(&s_second_finished, __ATOMIC_SEQ_CST); i++)
        usleep(10000);
    usleep(50000);  // the job thread marks it finished after its work returns
    ls_actor_shutdown(a, "the first job said so");
}

static void s_second_done(ls_actor_t *a, void *arg) { fail_msg("the second job completed after the stop"); }

static int s_stopper_start(ls_actor_t *a, void *state) {
    if (ls_actor_job(a, s_nothing, s_first_done, NULL) < 0)
        return -1;
    return ls_actor_job(a, s_second_work, s_second_done, NULL);
}

static const ls_dispatch_t s_stopper_table[] = {{0, NULL}};
static ls_actor_def_t s_stopper_def = {.name = "stopper", .dispatch = s_stopper_table, .on_start = s_stopper_start};

// The child: replays the stopper's trace; 0 when it matches
static int s_stopper_child(const char *trace) {
    ls_log_init("stopper", LS_LOG_WARN);
    ls_actor_opts_t opts = {.name = "stopper", .bind = "ipc://@never-bound", .replay = trace};
    ls_actor_t *a = ls_actor_new(&s_stopper_def, &opts);
    if (!a)
        return 1;
    int rc = ls_actor_run(a);
    ls_actor_destroy(&a);
    return rc == 0 ? 0 : 1;
}

static void test_stop_in_job(void **unused) {
    char ep[128], tdir[128], trace[256];
    rt_endpoint(ep, sizeof ep, "stopper");
    rt_trace_dir(tdir, sizeof tdir);
    ls_actor_opts_t opts = {.name = "stopper", .bind = ep, .trace_dir = tdir};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&s_stopper_def, &opts));
    rt_join(&r);
    assert_int_equal(__atomic_load_n(&s_second_finished, __ATOMIC_SEQ_CST), 1);
    rt_trace_path(trace, sizeof trace, "stopper");
    char *out;
    int rc = s_run_child_args("stopper", "--replay-stopper", trace, NULL, &out);
    if (rc != 0)
        fail_msg("the replay exited %d; it said:\n%s", rc, out);
    assert_contains(out, "replay: stopper matches");
    free(out);
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--replay-child"))
        return s_child(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "--replay-stopper"))
        return s_stopper_child(argv[2]);
    if (rt_init("runtime-replay", 100) < 0)
        return 1;
    // In order: each test's trace is the next one's.
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_matches),
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_diverges),
        cmocka_unit_test(test_stop_in_job),
    };
    return rt_fini(cmocka_run_group_tests(tests, NULL, NULL));
}
