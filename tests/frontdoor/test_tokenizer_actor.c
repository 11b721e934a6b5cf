// The tokenizer actor as a process, over ipc: the test is its launcher (a control ROUTER: Ready,
// PeerStatus, Shutdown), its registry (a ROUTER that takes what is relayed and answers as the
// test tells it, or goes down) and its client (a DEALER).
//   relay_lost — a load or unload relayed to a registry that goes down before it answers is
//                answered OUTCOME_UNKNOWN, not a failure (the registry may have written it to
//                its journal, which its restart restores); a listing is UNAVAILABLE; once the
//                registry is back, relays are answered by it; a tokenizer that stops with a
//                load relayed answers OUTCOME_UNKNOWN too.
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <czmq.h>

#include "ls_msg.h"
#include "test_msg.h"
#include "test_util.h"

static char D[64];
static zsock_t *s_control, *s_registry, *s_client;
static pid_t s_pid;

// From the launcher's or the registry's ROUTER to the tokenizer (its identity: its name).
static void s_routed_send(zsock_t *router, ls_msg_t *m) {
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(m, &buf, &len), 0);
    ls_msg_clear(m);
    zmsg_t *zm = zmsg_new();
    zmsg_addstr(zm, "tokenizer");
    zmsg_addmem(zm, buf, len);
    free(buf);
    assert_int_equal(zmsg_send(&zm, router), 0);
}

// The next message the tokenizer sent to a ROUTER of the test; it must be of this type.
static void s_routed_recv(zsock_t *router, ls_msg_t *m, int type) {
    zmsg_t *zm = zmsg_recv(router);
    if (!zm)
        fail_msg("nothing from the tokenizer (expected %s)", ls_msg_type_name(type));
    zframe_t *id = zmsg_pop(zm), *body = zmsg_pop(zm);
    assert_int_equal(ls_msg_decode(zframe_data(body), zframe_size(body), m, NULL), 0);
    zframe_destroy(&id);
    zframe_destroy(&body);
    zmsg_destroy(&zm);
    if ((int)m->type != type)
        fail_msg("got %s, expected %s", ls_msg_type_name(m->type), ls_msg_type_name(type));
}

static void s_peer_status(bool up) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_PEER_STATUS);
    m.u.peer_status.actor = ls_msg_strdup("registry");
    m.u.peer_status.up = up;
    m.u.peer_status.reason = ls_msg_strdup(up ? "restarted" : "killed by the test");
    s_routed_send(s_control, &m);
}

// A client's LoadAdapter (name), UnloadAdapter (name) or ListAdapters, relayed to the registry;
// returns the rid the registry got it under.
static uint64_t s_relay(int type, uint64_t rid, const char *name) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    if (type == LS_MSG_LOAD_ADAPTER) {
        m.u.load_adapter.name = ls_msg_strdup(name);
        m.u.load_adapter.path = ls_msg_strdup("/adapters/x");
    } else if (type == LS_MSG_UNLOAD_ADAPTER)
        m.u.unload_adapter.name = ls_msg_strdup(name);
    assert_int_equal(tm_send(s_client, &m), 0);
    ls_msg_clear(&m);
    s_routed_recv(s_registry, &m, type);
    uint64_t relayed = m.rid;
    ls_msg_clear(&m);
    return relayed;
}

// The client's answers, n of them in any order: each rid's type and (for an Error) code.
static void s_answers(int n, const uint64_t *rids, const int *types, const uint32_t *codes) {
    for (int k = 0; k < n; k++) {
        ls_msg_t m;
        assert_int_equal(tm_recv(s_client, &m), 0);
        int i = 0;
        while (i < n && rids[i] != m.rid)
            i++;
        if (i == n)
            fail_msg("an answer for rid %llu", (unsigned long long)m.rid);
        assert_int_equal(m.type, types[i]);
        if (m.type == LS_MSG_ERROR) {
            assert_int_equal(m.u.error.code, codes[i]);
            if (codes[i] == LS_ERROR_CODE_OUTCOME_UNKNOWN)
                assert_non_null(strstr(m.u.error.message, "list the adapters"));
        }
        ls_msg_clear(&m);
    }
}

static int s_setup(void **unused) {
    if (tu_tmpdir(D, sizeof D, "tok-actor") < 0)
        return -1;
    s_control = zsock_new_router(NULL);
    s_registry = zsock_new_router(NULL);
    if (!s_control || !s_registry || zsock_bind(s_control, "ipc://%s/control.sock", D) != 0 ||
        zsock_bind(s_registry, "ipc://%s/registry.sock", D) != 0)
        return -1;
    // The tokenizer drops its DEALER to a registry that went down and opens a new one, with
    // the same identity, once it is back: the new one takes the route over (as actors' ROUTERs do).
    zsock_set_router_handover(s_registry, 1);
    zsock_set_rcvtimeo(s_control, 30000);
    zsock_set_rcvtimeo(s_registry, 10000);
    char bind[128], control[128], registry[160], scheduler[160];
    snprintf(bind, sizeof bind, "ipc://%s/tokenizer.sock", D);
    snprintf(control, sizeof control, "ipc://%s/control.sock", D);
    snprintf(registry, sizeof registry, "registry=ipc://%s/registry.sock", D);
    snprintf(scheduler, sizeof scheduler, "scheduler=ipc://%s/scheduler.sock", D);
    s_pid = fork();
    if (s_pid == 0) {
        tu_child_dies_with_parent();
        execl(LS_TOKENIZER_BIN, LS_TOKENIZER_BIN, "--name", "tokenizer", "--bind", bind, "--control", control,
              "--peer", registry, "--peer", scheduler, "--model-path", LS_DEMO_DIR, "--heartbeat-ms", "0",
              "--log-level", "error", (char *)NULL);
        _exit(127);
    }
    ls_msg_t m;
    s_routed_recv(s_control, &m, LS_MSG_READY);
    ls_msg_clear(&m);
    s_client = zsock_new_dealer(bind);
    if (!s_client)
        return -1;
    zsock_set_rcvtimeo(s_client, 10000);
    return 0;
}

static int s_teardown(void **unused) {
    zsock_destroy(&s_client);
    zsock_destroy(&s_control);
    zsock_destroy(&s_registry);
    if (s_pid > 0) {
        kill(s_pid, SIGKILL);
        waitpid(s_pid, NULL, 0);
    }
    return tu_rmrf(D);
}

static void test_relay_lost(void **unused) {
    // The registry has the load, the unload and the listing; it goes down before answering.
    s_relay(LS_MSG_LOAD_ADAPTER, 1, "x");
    s_relay(LS_MSG_UNLOAD_ADAPTER, 2, "y");
    s_relay(LS_MSG_LIST_ADAPTERS, 3, NULL);
    s_peer_status(false);
    s_answers(3, (uint64_t[]){1, 2, 3}, (int[]){LS_MSG_ERROR, LS_MSG_ERROR, LS_MSG_ERROR},
              (uint32_t[]){LS_ERROR_CODE_OUTCOME_UNKNOWN, LS_ERROR_CODE_OUTCOME_UNKNOWN, LS_ERROR_CODE_UNAVAILABLE});

    // Back: the registry's own answer reaches the client.
    s_peer_status(true);
    uint64_t relayed = s_relay(LS_MSG_LOAD_ADAPTER, 4, "x");
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
    m.rid = relayed;
    m.u.adapter_loaded.ok = true;
    m.u.adapter_loaded.name = ls_msg_strdup("x");
    s_routed_send(s_registry, &m);
    s_answers(1, (uint64_t[]){4}, (int[]){LS_MSG_ADAPTER_LOADED}, (uint32_t[]){0});

    // The tokenizer stops with a load relayed: the registry goes on with it.
    s_relay(LS_MSG_LOAD_ADAPTER, 5, "z");
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    m.u.shutdown.reason = ls_msg_strdup("test over");
    s_routed_send(s_control, &m);
    s_answers(1, (uint64_t[]){5}, (int[]){LS_MSG_ERROR}, (uint32_t[]){LS_ERROR_CODE_OUTCOME_UNKNOWN});
    int status;
    assert_int_equal(waitpid(s_pid, &status, 0), s_pid);
    s_pid = 0;
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
    alarm(120);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_relay_lost)};
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
