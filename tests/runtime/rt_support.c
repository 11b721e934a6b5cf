// rt_support — see rt_support.h.
#include "rt_support.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_msg.h"
#include "test_util.h"

static char s_dir[64];

int rt_init(const char *tag, unsigned alarm_s) {
    if (tu_tmpdir(s_dir, sizeof s_dir, tag) < 0)
        return -1;
    ls_log_init("test", LS_LOG_WARN);
    alarm(alarm_s);
    return 0;
}

void rt_fini(void) { tu_rmrf(s_dir); }

const char *rt_dir(void) { return s_dir; }

void rt_endpoint(char *out, size_t cap, const char *name) { snprintf(out, cap, "ipc://%s/%s.sock", s_dir, name); }

void rt_trace_dir(char *out, size_t cap) { snprintf(out, cap, "%s/trace", s_dir); }

void rt_trace_path(char *out, size_t cap, const char *actor) { snprintf(out, cap, "%s/trace/%s.trace", s_dir, actor); }

ls_trace_reader_t *rt_trace_open(const char *actor) {
    char path[256], err[512];
    rt_trace_path(path, sizeof path, actor);
    ls_trace_reader_t *rd = ls_trace_reader_new(path, err, sizeof err);
    if (!rd)
        fail_msg("%s: %s", path, err);
    return rd;
}

static void *s_run(void *arg) {
    rt_runner_t *r = arg;
    r->rc = ls_actor_run(r->actor);
    return NULL;
}

void rt_start(rt_runner_t *r, ls_actor_t *a) {
    assert_non_null(a);
    r->actor = a;
    r->rc = -2;
    assert_int_equal(pthread_create(&r->thread, NULL, s_run, r), 0);
}

void rt_join(rt_runner_t *r) {
    pthread_join(r->thread, NULL);
    assert_int_equal(r->rc, 0);
    ls_actor_destroy(&r->actor);
}

zsock_t *rt_client(const char *endpoint) {
    zsock_t *s = zsock_new_dealer(endpoint);
    assert_non_null(s);
    zsock_set_rcvtimeo(s, 10000);
    return s;
}

void rt_client_send(zsock_t *s, const ls_msg_t *m) { assert_int_equal(tm_send(s, m), 0); }

void rt_client_send_raw(zsock_t *s, const void *data, size_t len) { assert_int_equal(zsock_send(s, "b", data, len), 0); }

void rt_client_recv(zsock_t *s, ls_msg_t *m) { assert_int_equal(tm_recv(s, m), 0); }

void rt_client_shutdown(zsock_t *s) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    m.u.shutdown.reason = ls_msg_strdup("test over");
    rt_client_send(s, &m);
    ls_msg_clear(&m);
}

void rt_random_request(ls_msg_t *m, uint64_t i) {
    ls_msg_fill_random(m, LS_MSG_GENERATE_REQ, 1000 + i);
    m->rid = i + 1;
    m->group = 0;
}

int rt_echo(ls_actor_t *a, ls_in_t *in, void *state) { return ls_actor_reply(a, in, in->msg); }
