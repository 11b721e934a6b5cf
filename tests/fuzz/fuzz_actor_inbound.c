/*  fuzz_actor_inbound.c — libFuzzer target for what every actor runs on an inbound message:
    the runtime's frame handling, decode and dispatch (runtime/ls_actor.c), and the error
    answers, on a real actor in a thread of this process (its ROUTER on an ipc endpoint in a
    scratch directory). Its dispatch table has the handler shapes the actors use: one answers
    at once, one keeps the message and its bulk frames (moving them out), one answers later
    from a kept route, one fails after answering; Shutdown is taken by the table, so an input
    cannot stop the actor.

    The input is split into frames at each "\xff\xfe"; they are sent as one message from a
    DEALER, followed by a Heartbeat ping. The actor must answer the ping within 30 s (it is
    alive and not stuck), and every answer before it must decode.
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "fuzz_frames.h"
#include "ls_actor.h"

#define S_PING_RID 0x70696e67u

static zsock_t *s_client;
static ls_route_t *s_route; // answered by the next message that arrives

static int s_answer(ls_actor_t *a, ls_in_t *in, void *state) {
    (void)state;
    return ls_actor_reply(a, in, in->msg);
}

static int s_keep(ls_actor_t *a, ls_in_t *in, void *state) {
    (void)a, (void)state;
    ls_msg_t kept;
    memcpy(&kept, in->msg, sizeof kept);
    ls_msg_init(in->msg, kept.type);
    zmsg_t *bulk = in->bulk;
    in->bulk = NULL;
    ls_msg_clear(&kept);
    zmsg_destroy(&bulk);
    return 0;
}

static int s_later(ls_actor_t *a, ls_in_t *in, void *state) {
    (void)state;
    if (s_route) {
        ls_actor_route_error(a, s_route, in->msg->rid, LS_ERROR_CODE_UNAVAILABLE, 0, "answered later");
        ls_route_destroy(&s_route);
    }
    s_route = ls_route_new(in);
    return 0;
}

static int s_fail(ls_actor_t *a, ls_in_t *in, void *state) {
    (void)state;
    ls_actor_reply_error(a, in, LS_ERROR_CODE_BAD_REQUEST, "refused: %s", ls_msg_type_name(in->msg->type));
    return -1;
}

static int s_ignore(ls_actor_t *a, ls_in_t *in, void *state) {
    (void)a, (void)in, (void)state;
    return 0;
}

static const ls_dispatch_t s_table[] = {{LS_MSG_GENERATE_REQ, s_answer},
                                        {LS_MSG_TOKENIZED_REQ, s_keep},
                                        {LS_MSG_LOAD_ADAPTER, s_keep},
                                        {LS_MSG_STEP_PLAN, s_later},
                                        {LS_MSG_ABORT, s_fail},
                                        {LS_MSG_SHUTDOWN, s_ignore},
                                        {0, NULL}};

static void *s_run(void *arg) {
    ls_actor_run(arg);
    return NULL;
}

static void s_stop(void) {
    zsock_destroy(&s_client);
}

static void s_start(void) {
    static char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/actor.sock", s_scratch_dir());
    static const ls_actor_def_t def = {.name = "fuzz", .dispatch = s_table};
    static ls_actor_opts_t opts = {.name = "fuzz"};
    opts.bind = ep;
    ls_log_init("fuzz", LS_LOG_ERROR);
    ls_actor_t *a = ls_actor_new(&def, &opts);
    pthread_t thread;
    if (!a || pthread_create(&thread, NULL, s_run, a) != 0)
        s_die("cannot start the actor");
    s_client = zsock_new_dealer(ep);
    if (!s_client)
        s_die("cannot connect to the actor");
    //  A receive returns after a second at most, so that the wait for the ping's answer
    //  (LLVMFuzzerTestOneInput) keeps its own deadline.
    zsock_set_rcvtimeo(s_client, 1000);
    atexit(s_stop);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!s_client)
        s_start();
    zmsg_t *zm = zmsg_new();
    fuzz_frames_add(zm, data, data + size);
    if (zmsg_send(&zm, s_client) != 0)
        s_die("cannot send");
    ls_msg_t ping;
    ls_msg_init(&ping, LS_MSG_HEARTBEAT);
    ping.rid = S_PING_RID;
    char *buf;
    size_t len;
    if (ls_msg_encode(&ping, &buf, &len) != 0 || zsock_send(s_client, "b", buf, len) != 0)
        s_die("cannot ping");
    free(buf);
    //  Generous: under a loaded CI machine (sanitized graph tests beside it) answers can lag.
    for (int64_t end = zclock_mono() + 30000;;) {
        zmsg_t *answer = zmsg_recv(s_client);
        if (!answer) {
            //  a second without an answer, or a signal (libFuzzer's timer, every half -timeout,
            //  interrupts the receive: EINTR), which is no answer from the actor
            if (zclock_mono() < end)
                continue;
            s_die("the actor did not answer its ping within 30 s");
        }
        zframe_t *body = zmsg_first(answer);
        ls_msg_t m;
        if (!body || ls_msg_decode(zframe_data(body), zframe_size(body), &m, NULL) != 0)
            s_die("the actor sent a message that does not decode");
        int done = m.type == LS_MSG_HEARTBEAT && m.rid == S_PING_RID;
        ls_msg_clear(&m);
        zmsg_destroy(&answer);
        if (done)
            return 0;
    }
}
