// rt_support — see rt_support.h.
#include "rt_support.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
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

int rt_fini(int failed) {
    tu_rmrf(s_dir);
    return failed;
}

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

static int s_tcp_connect(int port, int rcvbuf) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    if (rcvbuf)  // before connect: the window is agreed in the handshake
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        fail_msg("connect to 127.0.0.1:%d: %s", port, strerror(errno));
    return fd;
}

int rt_tcp_connect(int port) { return s_tcp_connect(port, 0); }

int rt_tcp_connect_small(int port) { return s_tcp_connect(port, 4096); }

void rt_tcp_send(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("send: %s", n < 0 ? strerror(errno) : "no progress");
        p += n;
        len -= (size_t)n;
    }
}

void rt_tcp_recv(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_msg("recv: %s, %zu bytes short", n < 0 ? strerror(errno) : "the server closed", len);
        p += n;
        len -= (size_t)n;
    }
}

void rt_tcp_recv_line(int fd, char *out, size_t cap) {
    size_t n = 0;
    for (;;) {
        char c;
        rt_tcp_recv(fd, &c, 1);
        if (c == '\n')
            break;
        assert_true(n + 1 < cap);
        out[n++] = c;
    }
    out[n] = 0;
}

ssize_t rt_tcp_recv_end(int fd) {
    char c;
    ssize_t n;
    do
        n = recv(fd, &c, 1, 0);
    while (n < 0 && errno == EINTR);
    return n;
}
