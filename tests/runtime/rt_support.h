// rt_support — what the runtime's test programs (one a room: test_actor, test_job, test_stream,
// test_replay_engine) share: a scratch directory, ipc endpoints in it, an actor run in a thread
// of the test, a raw ZeroMQ client, a TCP client, and the traces the actors record. The
// helpers assert (cmocka): a failure fails the test that called them.
#ifndef LS_RT_SUPPORT_H
#define LS_RT_SUPPORT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <czmq.h>

#include "ls_actor.h"
#include "ls_trace.h"

// A program's start: /tmp/ls-<tag>-XXXXXX as the scratch directory, warnings only in the log,
// and an alarm after alarm_s seconds, so that a hang fails the program instead of stalling CI.
// 0, or -1 when the directory cannot be made.
int rt_init(const char *tag, unsigned alarm_s);
// A program's end: removes the scratch directory; returns `failed` (cmocka's count), the exit
// status.
int rt_fini(int failed);
const char *rt_dir(void);
// ipc://<dir>/<name>.sock
void rt_endpoint(char *out, size_t cap, const char *name);
// <dir>/trace: where the tests' actors record.
void rt_trace_dir(char *out, size_t cap);
// <dir>/trace/<actor>.trace
void rt_trace_path(char *out, size_t cap, const char *actor);
// A reader of that trace (asserted to open).
ls_trace_reader_t *rt_trace_open(const char *actor);

// An actor running ls_actor_run in its own thread.
typedef struct {
    ls_actor_t *actor;
    pthread_t thread;
    int rc;
} rt_runner_t;
void rt_start(rt_runner_t *r, ls_actor_t *a);  // a is asserted non-NULL
// Waits for the actor to stop, asserts ls_actor_run returned 0, destroys it.
void rt_join(rt_runner_t *r);

// A raw DEALER client, as the SDK or a foreign process has; receives time out after 10 s.
zsock_t *rt_client(const char *endpoint);
void rt_client_send(zsock_t *s, const ls_msg_t *m);
void rt_client_send_raw(zsock_t *s, const void *data, size_t len);
// A timeout here means the actor never answered.
void rt_client_recv(zsock_t *s, ls_msg_t *m);
void rt_client_shutdown(zsock_t *s);

// The i-th of a reproducible series of GenerateReq (rid i + 1).
void rt_random_request(ls_msg_t *m, uint64_t i);
// A handler that answers every message with itself.
int rt_echo(ls_actor_t *a, ls_in_t *in, void *state);

// A blocking TCP client of 127.0.0.1:port; its reads and writes time out after 10 s.
int rt_tcp_connect(int port);
// The same with a receive buffer of a few KiB, so that output it leaves unread backs up into
// the server soon.
int rt_tcp_connect_small(int port);
void rt_tcp_send(int fd, const void *data, size_t len);
// Exactly len bytes (asserted: the peer closing or a timeout first fails the test).
void rt_tcp_recv(int fd, void *buf, size_t len);
// One line, up to and without its '\n', into out (cap bytes, NUL-terminated).
void rt_tcp_recv_line(int fd, char *out, size_t cap);
// What recv returns once the peer is expected to be gone: 0 for an orderly close; -1 with
// errno for a reset or a timeout (EAGAIN: the peer is still there).
ssize_t rt_tcp_recv_end(int fd);

#endif
