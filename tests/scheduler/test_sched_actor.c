// The scheduler actor's wiring, over ipc: the real loraserve-scheduler process, a fake worker
// (a thread with raw czmq sockets answering StepPlans with deterministic tokens) and a test
// client speaking messages directly (--output route), as the tokenizer later will.
//   end_to_end    — a request queued before WorkerInfo, served after it; an adapter load;
//                   an Abort mid-decode; metrics; a clean Shutdown
//   step_timeout  — the worker stops answering: the request fails, new ones are refused, and
//                   serving resumes when the worker reports again
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_msg.h"
#include "test_util.h"
#include <czmq.h>

#include "ls_log.h"
#include "ls_msg.h"

static char s_dir[64];
static char s_sched_ep[128], s_worker_ep[128];

static void s_send(zsock_t *s, const ls_msg_t *m) { assert_int_equal(tm_send(s, m), 0); }

// Next message on a DEALER; 0 on timeout.
static int s_recv(zsock_t *s, ls_msg_t *m) { return tm_recv(s, m) == 0; }

// ---------------------------------------------------------------------------------------------
// the fake worker

typedef struct {
    pthread_t thread;
    atomic_int answer;  // answer StepPlans
    atomic_int stop;
    atomic_int report;  // send a WorkerInfo now
    atomic_int plans;
    int delay_ms;  // per step
} worker_t;

static int32_t s_token(uint64_t rid, uint32_t generated) { return (int32_t)(1000 + rid * 10 + generated % 10); }

static void s_worker_info(zsock_t *out) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_WORKER_INFO);
    m.u.worker_info.tp_size = 1;
    m.u.worker_info.kv_blocks = 256;
    m.u.worker_info.block_size = 16;
    m.u.worker_info.max_context = 4096;
    m.u.worker_info.vocab_size = 32000;
    m.u.worker_info.max_loras_per_batch = 2;
    m.u.worker_info.max_loaded_loras = 4;
    m.u.worker_info.max_lora_rank = 64;
    m.u.worker_info.eos_token_ids.v = calloc(1, sizeof(int32_t));
    m.u.worker_info.eos_token_ids.v[0] = 2;
    m.u.worker_info.eos_token_ids.n = 1;
    s_send(out, &m);
    ls_msg_clear(&m);
}

static void s_worker_answer(worker_t *w, zsock_t *out, const ls_msg_t *in) {
    ls_msg_t m;
    switch (in->type) {
    case LS_MSG_STEP_PLAN: {
        atomic_fetch_add(&w->plans, 1);
        if (!atomic_load(&w->answer))
            return;
        if (w->delay_ms)
            usleep((useconds_t)w->delay_ms * 1000);
        const ls_msg_step_items_t *items = &in->u.step_plan.items;
        ls_msg_init(&m, LS_MSG_STEP_RESULT);
        m.u.step_result.step = in->u.step_plan.step;
        m.u.step_result.items.v = calloc(items->n ? items->n : 1, sizeof(ls_msg_step_output_t));
        for (size_t i = 0; i < items->n; i++)
            if (items->v[i].sample) {
                ls_msg_step_output_t *o = &m.u.step_result.items.v[m.u.step_result.items.n++];
                o->rid = items->v[i].rid;
                o->token_id = s_token(o->rid, items->v[i].generated);
            }
        break;
    }
    case LS_MSG_LOAD_ADAPTER:
        ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
        m.u.adapter_loaded.ok = true;
        m.u.adapter_loaded.rank = 8;
        m.u.adapter_loaded.adapter_id = ls_msg_strdup(in->u.load_adapter.adapter_id);
        break;
    case LS_MSG_UNLOAD_ADAPTER:
        ls_msg_init(&m, LS_MSG_ADAPTER_UNLOADED);
        m.u.adapter_unloaded.ok = true;
        break;
    default:
        return;  // PrefetchAdapter: nothing to answer
    }
    m.rid = in->rid;
    s_send(out, &m);
    ls_msg_clear(&m);
}

static void *s_worker_run(void *arg) {
    worker_t *w = arg;
    // Plans come on a ROUTER (the scheduler's DEALER connects to it); answers go out on a DEALER
    // named worker-0, as an ls_actor worker's peer socket would.
    zsock_t *in = zsock_new_router(s_worker_ep);
    zsock_t *out = zsock_new(ZMQ_DEALER);
    zsock_set_identity(out, "worker-0");
    zsock_connect(out, "%s", s_sched_ep);
    zpoller_t *poller = zpoller_new(in, NULL);
    while (!atomic_load(&w->stop)) {
        if (atomic_exchange(&w->report, 0))
            s_worker_info(out);
        if (!zpoller_wait(poller, 20))
            continue;
        zmsg_t *zm = zmsg_recv(in);
        zframe_t *id = zmsg_pop(zm), *body = zmsg_pop(zm);
        ls_msg_t m;
        if (body && ls_msg_decode(zframe_data(body), zframe_size(body), &m, NULL) == 0) {
            s_worker_answer(w, out, &m);
            ls_msg_clear(&m);
        }
        zframe_destroy(&id);
        zframe_destroy(&body);
        zmsg_destroy(&zm);
    }
    zpoller_destroy(&poller);
    zsock_destroy(&in);
    zsock_destroy(&out);
    return NULL;
}

static void s_worker_start(worker_t *w) {
    atomic_store(&w->answer, 1);
    atomic_store(&w->report, 1);
    assert_int_equal(pthread_create(&w->thread, NULL, s_worker_run, w), 0);
}

static void s_worker_stop(worker_t *w) {
    atomic_store(&w->stop, 1);
    pthread_join(w->thread, NULL);
}

// ---------------------------------------------------------------------------------------------
// the scheduler process and the client

static pid_t s_scheduler_start(void) {
    char peer[200];
    snprintf(peer, sizeof peer, "worker-0=%s", s_worker_ep);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tu_child_dies_with_parent();
        execl(LS_SCHEDULER_BIN, LS_SCHEDULER_BIN, "--bind", s_sched_ep, "--peer", peer, "--output", "route",
              "--step-timeout-ms", "400", "--heartbeat-ms", "0", "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void s_scheduler_stop(pid_t pid, zsock_t *client) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    s_send(client, &m);
    int status = -1;
    for (int i = 0; i < 500 && waitpid(pid, &status, WNOHANG) == 0; i++)
        usleep(10000);
    if (!WIFEXITED(status))
        kill(pid, SIGKILL), waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static zsock_t *s_client(void) {
    zsock_t *c = zsock_new_dealer(s_sched_ep);
    assert_non_null(c);
    zsock_set_rcvtimeo(c, 5000);
    return c;
}

static void s_request(zsock_t *c, uint64_t rid, const char *adapter, uint32_t max_new) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = rid;
    m.u.tokenized_req.input_ids.v = calloc(5, sizeof(int32_t));
    for (int i = 0; i < 5; i++)
        m.u.tokenized_req.input_ids.v[i] = 10 + i;
    m.u.tokenized_req.input_ids.n = 5;
    m.u.tokenized_req.adapter_id = ls_msg_strdup(adapter);
    m.u.tokenized_req.sampling.max_new_tokens = max_new;
    s_send(c, &m);
    ls_msg_clear(&m);
}

// Receive TokenOuts of rid until its final one; returns the tokens and the finish reason.
static int s_collect(zsock_t *c, uint64_t rid, uint32_t *finish, char *error, size_t cap) {
    int tokens = 0;
    for (;;) {
        ls_msg_t m;
        assert_true(s_recv(c, &m));  // a timeout here means the scheduler never answered
        assert_int_equal(m.type, LS_MSG_TOKEN_OUT);
        assert_int_equal(m.rid, rid);
        assert_int_equal(m.u.token_out.first, tokens == 0);
        for (size_t i = 0; i < m.u.token_out.token_ids.n; i++, tokens++)
            assert_int_equal(m.u.token_out.token_ids.v[i], s_token(rid, (uint32_t)tokens));
        *finish = m.u.token_out.finish;
        if (error)
            snprintf(error, cap, "%s", m.u.token_out.error ? m.u.token_out.error : "");
        ls_msg_clear(&m);
        if (*finish != LS_FINISH_REASON_NONE)
            return tokens;
    }
}

static uint64_t s_metric(zsock_t *c, const char *name) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GET_METRICS);
    s_send(c, &m);
    assert_true(s_recv(c, &m));
    assert_int_equal(m.type, LS_MSG_METRICS);
    uint64_t v = UINT64_MAX;
    for (size_t i = 0; i < m.u.metrics.names.n; i++)
        if (strcmp(m.u.metrics.names.v[i], name) == 0)
            v = m.u.metrics.values.v[i];
    ls_msg_clear(&m);
    assert_true(v != UINT64_MAX);
    return v;
}

// ---------------------------------------------------------------------------------------------

static void test_end_to_end(void **unused) {
    pid_t pid = s_scheduler_start();
    zsock_t *c = s_client();
    // Queued until the worker reports.
    s_request(c, 1, NULL, 4);
    usleep(100000);
    worker_t w = {.delay_ms = 5};
    s_worker_start(&w);
    uint32_t finish;
    assert_int_equal(s_collect(c, 1, &finish, NULL, 0), 4);
    assert_int_equal(finish, LS_FINISH_REASON_LENGTH);

    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = 50;
    m.u.load_adapter.name = ls_msg_strdup("A");
    m.u.load_adapter.adapter_id = ls_msg_strdup("A");
    m.u.load_adapter.path = ls_msg_strdup("/adapters/a");
    s_send(c, &m);
    ls_msg_clear(&m);
    assert_true(s_recv(c, &m));
    assert_int_equal(m.type, LS_MSG_ADAPTER_LOADED);
    assert_int_equal(m.rid, 50);
    assert_true(m.u.adapter_loaded.ok);
    assert_int_equal(m.u.adapter_loaded.rank, 8);
    ls_msg_clear(&m);

    // A long request on the adapter, aborted after its first token.
    s_request(c, 2, "A", 1000);
    assert_true(s_recv(c, &m));
    assert_int_equal(m.type, LS_MSG_TOKEN_OUT);
    assert_true(m.u.token_out.first);
    ls_msg_clear(&m);
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = 2;
    m.u.abort.finish = LS_FINISH_REASON_ABORT;
    s_send(c, &m);
    ls_msg_clear(&m);
    for (;;) {
        assert_true(s_recv(c, &m));
        assert_int_equal(m.type, LS_MSG_TOKEN_OUT);
        finish = m.u.token_out.finish;
        ls_msg_clear(&m);
        if (finish != LS_FINISH_REASON_NONE)
            break;
    }
    assert_int_equal(finish, LS_FINISH_REASON_ABORT);
    // An unknown adapter is refused on the request's route.
    s_request(c, 3, "nope", 4);
    assert_true(s_recv(c, &m));
    assert_int_equal(m.type, LS_MSG_ERROR);
    assert_int_equal(m.rid, 3);
    assert_int_equal(m.u.error.code, LS_ERROR_CODE_NOT_FOUND);
    ls_msg_clear(&m);
    assert_int_equal(s_metric(c, "requests_aborted"), 1);
    assert_int_equal(s_metric(c, "running_requests"), 0);
    assert_int_equal(s_metric(c, "kv_blocks_used"), 0);
    assert_int_equal(s_metric(c, "kv_blocks_total"), 256);
    assert_true(s_metric(c, "tokens_generated") >= 5);
    s_scheduler_stop(pid, c);
    s_worker_stop(&w);
    zsock_destroy(&c);
}

static void test_step_timeout(void **unused) {
    pid_t pid = s_scheduler_start();
    zsock_t *c = s_client();
    worker_t w = {0};
    s_worker_start(&w);
    s_request(c, 1, NULL, 3);
    uint32_t finish;
    assert_int_equal(s_collect(c, 1, &finish, NULL, 0), 3);
    // The worker goes silent mid-request: the step times out and the request fails.
    atomic_store(&w.answer, 0);
    s_request(c, 2, NULL, 3);
    char error[200];
    assert_int_equal(s_collect(c, 2, &finish, error, sizeof error), 0);
    assert_int_equal(finish, LS_FINISH_REASON_ERROR);
    assert_non_null(strstr(error, "no result for step"));
    // Down: refused at once, not queued forever.
    s_request(c, 3, NULL, 3);
    ls_msg_t m;
    assert_true(s_recv(c, &m));
    assert_int_equal(m.type, LS_MSG_ERROR);
    assert_int_equal(m.u.error.code, LS_ERROR_CODE_UNAVAILABLE);
    ls_msg_clear(&m);
    assert_int_equal(s_metric(c, "step_timeouts"), 1);
    // The worker comes back and reports: serving again.
    atomic_store(&w.answer, 1);
    atomic_store(&w.report, 1);
    usleep(100000);
    s_request(c, 4, NULL, 3);
    assert_int_equal(s_collect(c, 4, &finish, NULL, 0), 3);
    assert_int_equal(finish, LS_FINISH_REASON_LENGTH);
    s_scheduler_stop(pid, c);
    s_worker_stop(&w);
    zsock_destroy(&c);
}

int main(void) {
    if (tu_tmpdir(s_dir, sizeof s_dir, "sched") < 0)
        return 1;
    snprintf(s_sched_ep, sizeof s_sched_ep, "ipc://%s/scheduler.sock", s_dir);
    snprintf(s_worker_ep, sizeof s_worker_ep, "ipc://%s/worker-0.sock", s_dir);
    ls_log_init("test", LS_LOG_WARN);
    alarm(100);  // a hang is a failure, not a stuck CI job
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_end_to_end),
        cmocka_unit_test(test_step_timeout),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(s_dir);
    return failed;
}
