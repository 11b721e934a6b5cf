// The runtime's main room, ls_actor.c: actors in threads of one process, talking over ipc.
//   exchange   — two actors trade 200 messages through a peer DEALER and a ROUTER
//   fairness   — a flooded socket does not starve a second one (capped drain)
//   slow_handlers — a timer due while slow messages queue runs after one or two of them
//   shutdown   — Shutdown makes the actor answer every in-flight request, then exit 0
//   malformed  — garbage, unknown types, newer versions, unhandled types: Error, still alive
//   trace      — every message in and out is recorded and reads back; a torn tail is reported
//   timers     — timers fire, repeat, and are recorded
//   ready      — an actor can defer Ready until it is really ready
//   peer status — PeerStatus and Shutdown count only from the launcher when there is one; a
//                peer reported down loses what was queued for it, and what is sent after
//                reaches its restart
//   bulk       — frames after the body: a handler that takes them and one that leaves them,
//                each freed once (a message with an extra frame was a use-after-free)
//   metrics info — the on_metrics hook runs before each Metrics answer; text facts
//                (ls_actor_info) travel in it, set again rather than added again
//   wakeup     — a ping that arrives while the actor relays a burst from one socket to another
//                is answered with no timer to wake the loop (it once slept on it for good)
// The other rooms have their own programs: test_job, test_stream, test_replay_engine.
#include <pthread.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "rt_support.h"
#include "test_util.h"

// ---------------------------------------------------------------------------------------------
// exchange

#define EXCHANGE_N 200

typedef struct {
    int received, mismatched;
} exchange_t;

static int s_exchange_start(ls_actor_t *a, void *state) {
    for (uint64_t i = 0; i < EXCHANGE_N; i++) {
        ls_msg_t m;
        rt_random_request(&m, i);
        int rc = ls_actor_send_peer(a, "echo", &m, NULL);
        ls_msg_clear(&m);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int s_exchange_reply(ls_actor_t *a, ls_in_t *in, void *state) {
    exchange_t *x = state;
    ls_msg_t want;
    rt_random_request(&want, in->msg->rid - 1);
    x->mismatched += !ls_msg_equal(&want, in->msg) || strcmp(in->from, "echo") != 0;
    ls_msg_clear(&want);
    if (++x->received == EXCHANGE_N) {
        ls_msg_t stop;
        ls_msg_init(&stop, LS_MSG_SHUTDOWN);
        ls_actor_send_peer(a, "echo", &stop, NULL);
        ls_actor_shutdown(a, "all replies in");
    }
    return 0;
}

static void test_exchange(void **unused) {
    char ep[128], peer[160];
    rt_endpoint(ep, sizeof ep, "echo");
    snprintf(peer, sizeof peer, "echo=%s", ep);
    char *pv[] = {peer};
    ls_strlist_t peers = {pv, 1};

    static const ls_dispatch_t echo_table[] = {{LS_MSG_GENERATE_REQ, rt_echo}, {0, NULL}};
    ls_actor_def_t echo_def = {.name = "echo", .dispatch = echo_table};
    ls_actor_opts_t echo_opts = {.name = "echo", .bind = ep};

    exchange_t x = {0};
    static const ls_dispatch_t client_table[] = {{LS_MSG_GENERATE_REQ, s_exchange_reply}, {0, NULL}};
    ls_actor_def_t client_def = {.name = "client", .dispatch = client_table, .state = &x, .on_start = s_exchange_start};
    ls_actor_opts_t client_opts = {.name = "client", .peers = &peers};

    rt_runner_t echo, client;
    rt_start(&echo, ls_actor_new(&echo_def, &echo_opts));
    rt_start(&client, ls_actor_new(&client_def, &client_opts));
    rt_join(&client);
    rt_join(&echo);
    assert_int_equal(x.received, EXCHANGE_N);
    assert_int_equal(x.mismatched, 0);
}

// ---------------------------------------------------------------------------------------------
// fairness

#define FLOOD_N 5000

typedef struct {
    int flood, flood_before_marker, marker;
} fair_t;

static void s_fair_maybe_done(ls_actor_t *a, fair_t *f) {
    if (f->marker && f->flood == FLOOD_N)
        ls_actor_shutdown(a, "flood drained");
}

static int s_fair_flood(ls_actor_t *a, ls_in_t *in, void *state) {
    fair_t *f = state;
    f->flood++;
    s_fair_maybe_done(a, f);
    return 0;
}

static int s_fair_marker(ls_actor_t *a, ls_in_t *in, void *state) {
    fair_t *f = state;
    f->marker = 1;
    f->flood_before_marker = f->flood;
    s_fair_maybe_done(a, f);
    return 0;
}

static void test_fairness(void **unused) {
    char ep[128], tep[128], peer[160];
    rt_endpoint(ep, sizeof ep, "fair");
    rt_endpoint(tep, sizeof tep, "tester");
    snprintf(peer, sizeof peer, "tester=%s", tep);
    char *pv[] = {peer};
    ls_strlist_t peers = {pv, 1};
    fair_t f = {0};
    static const ls_dispatch_t table[] = {{LS_MSG_ABORT, s_fair_flood}, {LS_MSG_PREFETCH_ADAPTER, s_fair_marker}, {0, NULL}};
    ls_actor_def_t def = {.name = "fair", .dispatch = table, .state = &f};
    ls_actor_opts_t opts = {.name = "fair", .bind = ep, .peers = &peers};

    zsock_t *tester = zsock_new_router(tep);
    assert_non_null(tester);
    zsock_set_router_mandatory(tester, 1);
    ls_actor_t *a = ls_actor_new(&def, &opts);
    assert_non_null(a);
    assert_non_null(ls_actor_peer(a, "tester"));  // second socket: a DEALER to the tester

    // Queue everything before the actor's loop runs: the flood on its ROUTER, then one marker
    // on its DEALER. A fair drain handles the marker long before the flood is through.
    zsock_t *flooder = rt_client(ep);
    ls_msg_t m;
    ls_msg_fill_random(&m, LS_MSG_ABORT, 7);
    for (int i = 0; i < FLOOD_N; i++)
        rt_client_send(flooder, &m);
    ls_msg_clear(&m);
    ls_msg_fill_random(&m, LS_MSG_PREFETCH_ADAPTER, 8);
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(&m, &buf, &len), 0);
    ls_msg_clear(&m);
    int sent = -1;
    for (int tries = 0; tries < 500 && sent < 0; tries++) {
        sent = zsock_send(tester, "sb", "fair", buf, len);  // fails until the DEALER's handshake is done
        if (sent < 0)
            usleep(10000);
    }
    free(buf);
    assert_int_equal(sent, 0);
    usleep(300000);

    rt_runner_t r;
    rt_start(&r, a);
    rt_join(&r);
    assert_int_equal(f.flood, FLOOD_N);
    assert_true(f.marker);
    // The marker waits for at most one capped turn of the flood (and one more if the ROUTER
    // happened to be drained first in that turn).
    assert_true(f.flood_before_marker <= 2 * LS_DRAIN_CAP);
    zsock_destroy(&flooder);
    zsock_destroy(&tester);
}

// ---------------------------------------------------------------------------------------------
// slow handlers: a drain yields after LS_DRAIN_BUDGET_NS, so a timer due meanwhile runs between
// two slow messages, not after the whole queue (a worker's next plan is always waiting)

#define SLOW_N 40
#define SLOW_MS 5

typedef struct {
    int handled, handled_before_timer, timer_fired;
} slow_t;

static void s_slow_maybe_done(ls_actor_t *a, slow_t *s) {
    if (s->timer_fired && s->handled == SLOW_N)
        ls_actor_shutdown(a, "slow queue drained");
}

static int s_slow_msg(ls_actor_t *a, ls_in_t *in, void *state) {
    slow_t *s = state;
    usleep(SLOW_MS * 1000);
    s->handled++;
    s_slow_maybe_done(a, s);
    return 0;
}

static void s_slow_timer(ls_actor_t *a, ls_timer_t *t, void *arg) {
    slow_t *s = arg;
    s->timer_fired = 1;
    s->handled_before_timer = s->handled;
    s_slow_maybe_done(a, s);
}

static slow_t s_slow;

static int s_slow_start(ls_actor_t *a, void *state) {
    ls_actor_timer_start(a, 1, 0, s_slow_timer, state);
    return 0;
}

static void test_slow_handlers(void **unused) {
    char ep[128];
    rt_endpoint(ep, sizeof ep, "slow");
    static const ls_dispatch_t table[] = {{LS_MSG_ABORT, s_slow_msg}, {0, NULL}};
    ls_actor_def_t def = {.name = "slow", .dispatch = table, .state = &s_slow, .on_start = s_slow_start};
    ls_actor_opts_t opts = {.name = "slow", .bind = ep};
    ls_actor_t *a = ls_actor_new(&def, &opts);
    assert_non_null(a);
    zsock_t *client = rt_client(ep);
    ls_msg_t m;
    ls_msg_fill_random(&m, LS_MSG_ABORT, 9);
    for (int i = 0; i < SLOW_N; i++)
        rt_client_send(client, &m);
    ls_msg_clear(&m);
    usleep(200000);  // all queued before the loop's first turn
    rt_runner_t r;
    rt_start(&r, a);
    rt_join(&r);
    assert_int_equal(s_slow.handled, SLOW_N);
    assert_true(s_slow.timer_fired);
    // Without the time budget the timer would wait for a whole capped drain (all 40, 200 ms).
    assert_true(s_slow.handled_before_timer <= 2);
    zsock_destroy(&client);
}

// ---------------------------------------------------------------------------------------------
// shutdown answers in-flight work

typedef struct {
    ls_route_t *routes[8];
    uint64_t rids[8];
    int n;
} holder_t;

static int s_hold(ls_actor_t *a, ls_in_t *in, void *state) {
    holder_t *h = state;
    if (h->n == 8)
        return ls_actor_reply_error(a, in, LS_ERROR_CODE_UNAVAILABLE, "holder is full");
    h->routes[h->n] = ls_route_new(in);
    h->rids[h->n++] = in->msg->rid;
    return 0;
}

static void s_hold_shutdown(ls_actor_t *a, void *state) {
    holder_t *h = state;
    for (int i = 0; i < h->n; i++) {
        ls_actor_route_error(a, h->routes[i], h->rids[i], LS_ERROR_CODE_SHUTTING_DOWN, LS_MSG_GENERATE_REQ,
                             "holder is shutting down");
        ls_route_destroy(&h->routes[i]);
    }
    h->n = 0;
}

static void test_shutdown_answers_inflight(void **unused) {
    char ep[128];
    rt_endpoint(ep, sizeof ep, "holder");
    holder_t h = {0};
    static const ls_dispatch_t table[] = {{LS_MSG_GENERATE_REQ, s_hold}, {0, NULL}};
    ls_actor_def_t def = {.name = "holder", .dispatch = table, .state = &h, .on_shutdown = s_hold_shutdown};
    ls_actor_opts_t opts = {.name = "holder", .bind = ep};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));

    zsock_t *c = rt_client(ep);
    for (uint64_t i = 0; i < 3; i++) {
        ls_msg_t m;
        rt_random_request(&m, i);
        rt_client_send(c, &m);
        ls_msg_clear(&m);
    }
    rt_client_shutdown(c);
    for (uint64_t i = 0; i < 3; i++) {
        ls_msg_t m;
        rt_client_recv(c, &m);
        assert_int_equal(m.type, LS_MSG_ERROR);
        assert_int_equal(m.u.error.code, LS_ERROR_CODE_SHUTTING_DOWN);
        assert_int_equal(m.rid, i + 1);
        ls_msg_clear(&m);
    }
    rt_join(&r);
    zsock_destroy(&c);
}

// ---------------------------------------------------------------------------------------------
// malformed input never kills an actor

static void s_expect_error(zsock_t *c, uint32_t code) {
    ls_msg_t m;
    rt_client_recv(c, &m);
    assert_int_equal(m.type, LS_MSG_ERROR);
    assert_int_equal(m.u.error.code, code);
    assert_non_null(m.u.error.message);
    assert_true(strlen(m.u.error.message) > 0);
    ls_msg_clear(&m);
}

static void test_malformed(void **unused) {
    char ep[128];
    rt_endpoint(ep, sizeof ep, "robust");
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "robust", .dispatch = table};
    ls_actor_opts_t opts = {.name = "robust", .bind = ep};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    zsock_t *c = rt_client(ep);

    // Random bytes: each is answered (malformed, or by luck an unknown type), none is fatal.
    unsigned seed = 42;
    for (int i = 0; i < 300; i++) {
        unsigned char junk[64];
        size_t n = (size_t)(rand_r(&seed) % 64);
        for (size_t k = 0; k < n; k++)
            junk[k] = (unsigned char)rand_r(&seed);
        rt_client_send_raw(c, junk, n);
        ls_msg_t m;
        rt_client_recv(c, &m);
        assert_int_equal(m.type, LS_MSG_ERROR);
        assert_true(m.u.error.code == LS_ERROR_CODE_MALFORMED || m.u.error.code == LS_ERROR_CODE_UNKNOWN_TYPE);
        ls_msg_clear(&m);
    }
    // msgpack [1, 9999, 0, 5, {}]: well formed, unknown type.
    const unsigned char unknown[] = {0x95, 0x01, 0xcd, 0x27, 0x0f, 0x00, 0x05, 0x80};
    rt_client_send_raw(c, unknown, sizeof unknown);
    s_expect_error(c, LS_ERROR_CODE_UNKNOWN_TYPE);
    // msgpack [99, 1, 0, 5, {}]: a schema version from the future.
    const unsigned char future[] = {0x95, 0x63, 0x01, 0x00, 0x05, 0x80};
    rt_client_send_raw(c, future, sizeof future);
    s_expect_error(c, LS_ERROR_CODE_MALFORMED);
    // A well-formed message this actor has no handler for.
    ls_msg_t m;
    rt_random_request(&m, 0);
    rt_client_send(c, &m);
    ls_msg_clear(&m);
    s_expect_error(c, LS_ERROR_CODE_UNKNOWN_TYPE);

    // Still alive: a Heartbeat ping gets a pong carrying the actor's name and the ping's rid.
    ls_msg_init(&m, LS_MSG_HEARTBEAT);
    m.rid = 77;
    rt_client_send(c, &m);
    ls_msg_clear(&m);
    rt_client_recv(c, &m);
    assert_int_equal(m.type, LS_MSG_HEARTBEAT);
    assert_int_equal(m.rid, 77);
    assert_string_equal(m.u.heartbeat.actor, "robust");
    ls_msg_clear(&m);

    // And it counted what it dropped.
    ls_msg_init(&m, LS_MSG_GET_METRICS);
    rt_client_send(c, &m);
    ls_msg_clear(&m);
    rt_client_recv(c, &m);
    assert_int_equal(m.type, LS_MSG_METRICS);
    uint64_t bad = 0, unhandled = 0;
    for (size_t i = 0; i < m.u.metrics.names.n; i++) {
        if (!strcmp(m.u.metrics.names.v[i], "msgs_malformed") || !strcmp(m.u.metrics.names.v[i], "msgs_unknown"))
            bad += m.u.metrics.values.v[i];
        if (!strcmp(m.u.metrics.names.v[i], "msgs_unhandled"))
            unhandled = m.u.metrics.values.v[i];
    }
    assert_int_equal(bad, 300 + 2);
    assert_int_equal(unhandled, 1);
    ls_msg_clear(&m);

    rt_client_shutdown(c);
    rt_join(&r);
    zsock_destroy(&c);
}

// ---------------------------------------------------------------------------------------------
// metrics: on_metrics runs before each answer; text facts travel in Metrics.info_*

static void s_info_hook(ls_actor_t *a, ls_msg_metrics_t *m, void *state) {
    int *asked = state;
    char text[32];
    snprintf(text, sizeof text, "asked %d", ++*asked);
    ls_actor_info(a, "asked", text);
    ls_actor_info(a, "fixed", "a,b");
}

// The value of info `name` in a Metrics answer; NULL when absent.
static const char *s_info_of(const ls_msg_t *m, const char *name) {
    assert_int_equal(m->u.metrics.info_names.n, m->u.metrics.info_values.n);
    for (size_t i = 0; i < m->u.metrics.info_names.n; i++)
        if (!strcmp(m->u.metrics.info_names.v[i], name))
            return m->u.metrics.info_values.v[i];
    return NULL;
}

static void test_metrics_info(void **unused) {
    char ep[128];
    rt_endpoint(ep, sizeof ep, "facts");
    static const ls_dispatch_t table[] = {{0, NULL}};
    int asked = 0;
    ls_actor_def_t def = {.name = "facts", .dispatch = table, .state = &asked, .on_metrics = s_info_hook};
    ls_actor_opts_t opts = {.name = "facts", .bind = ep};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    zsock_t *c = rt_client(ep);
    for (int k = 1; k <= 2; k++) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_GET_METRICS);
        m.rid = (uint64_t)k;
        rt_client_send(c, &m);
        ls_msg_clear(&m);
        rt_client_recv(c, &m);
        assert_int_equal(m.type, LS_MSG_METRICS);
        assert_int_equal(m.rid, (uint64_t)k);
        char want[32];
        snprintf(want, sizeof want, "asked %d", k);
        assert_string_equal(s_info_of(&m, "asked"), want);  // set by the hook for this answer
        assert_string_equal(s_info_of(&m, "fixed"), "a,b");
        assert_int_equal(m.u.metrics.info_names.n, 2);      // set again, not added again
        ls_msg_clear(&m);
    }
    rt_client_shutdown(c);
    rt_join(&r);
    zsock_destroy(&c);
}

// ---------------------------------------------------------------------------------------------
// bulk frames: ls_in_t's rule (the handler may take in->bulk; the runtime frees what is left)

// Takes the bulk frames and frees them, as a relay that forwards them does; answers with their
// number in `rank`.
static int s_bulk_take(ls_actor_t *a, ls_in_t *in, void *state) {
    zmsg_t *bulk = in->bulk;
    in->bulk = NULL;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LOADED);
    m.rid = in->msg->rid;
    m.u.adapter_loaded.rank = bulk ? (uint32_t)zmsg_size(bulk) : 0;
    zmsg_destroy(&bulk);
    int rc = ls_actor_reply(a, in, &m);
    ls_msg_clear(&m);
    return rc;
}

// Leaves them to the runtime.
static int s_bulk_leave(ls_actor_t *a, ls_in_t *in, void *state) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
    m.rid = in->msg->rid;
    int rc = ls_actor_reply(a, in, &m);
    ls_msg_clear(&m);
    return rc;
}

static void s_send_with_frames(zsock_t *c, int type, uint64_t rid, int frames) {
    ls_msg_t m;
    ls_msg_init(&m, (ls_msg_type_t)type);
    m.rid = rid;
    char *body;
    size_t len;
    assert_int_equal(ls_msg_encode(&m, &body, &len), 0);
    ls_msg_clear(&m);
    zmsg_t *zm = zmsg_new();
    zmsg_addmem(zm, body, len);
    free(body);
    for (int i = 0; i < frames; i++)
        zmsg_addstr(zm, "extra frame");
    assert_int_equal(zmsg_send(&zm, c), 0);
}

static void test_bulk(void **unused) {
    char ep[128];
    rt_endpoint(ep, sizeof ep, "bulk");
    static const ls_dispatch_t table[] = {{LS_MSG_LOAD_ADAPTER, s_bulk_take},
                                          {LS_MSG_LIST_ADAPTERS, s_bulk_leave},
                                          {0, NULL}};
    ls_actor_def_t def = {.name = "bulk", .dispatch = table};
    ls_actor_opts_t opts = {.name = "bulk", .bind = ep};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    zsock_t *c = rt_client(ep);
    for (uint64_t i = 1; i <= 100; i++) {
        int take = i % 2;
        s_send_with_frames(c, take ? LS_MSG_LOAD_ADAPTER : LS_MSG_LIST_ADAPTERS, i, (int)(i % 3));
        ls_msg_t m;
        rt_client_recv(c, &m);
        assert_int_equal(m.rid, i);
        assert_int_equal(m.type, take ? LS_MSG_ADAPTER_LOADED : LS_MSG_ADAPTER_LIST);
        if (take)
            assert_int_equal(m.u.adapter_loaded.rank, i % 3);
        ls_msg_clear(&m);
    }
    rt_client_shutdown(c);
    rt_join(&r);
    zsock_destroy(&c);
}

// ---------------------------------------------------------------------------------------------
// trace recording

static void test_trace(void **unused) {
    char ep[128], tdir[128];
    rt_endpoint(ep, sizeof ep, "traced");
    rt_trace_dir(tdir, sizeof tdir);
    static const ls_dispatch_t table[] = {{LS_MSG_GENERATE_REQ, rt_echo}, {0, NULL}};
    ls_actor_def_t def = {.name = "traced", .dispatch = table};
    ls_actor_opts_t opts = {.name = "traced", .bind = ep, .trace_dir = tdir};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    zsock_t *c = rt_client(ep);
    for (uint64_t i = 0; i < 5; i++) {
        ls_msg_t m;
        rt_random_request(&m, i);
        rt_client_send(c, &m);
        ls_msg_clear(&m);
        rt_client_recv(c, &m);
        ls_msg_clear(&m);
    }
    rt_client_shutdown(c);
    rt_join(&r);
    zsock_destroy(&c);

    char path[256], err[512];
    rt_trace_path(path, sizeof path, "traced");
    ls_trace_reader_t *rd = rt_trace_open("traced");
    static ls_trace_record_t rec;
    int n = 0, ins = 0, outs = 0, shutdowns = 0, sockets = 0;
    uint64_t last_t = 0;
    while (ls_trace_read(rd, &rec, err, sizeof err) == 1) {
        if (n++ == 0) {
            assert_int_equal(rec.kind, LS_TRACE_META);
            assert_non_null(strstr((const char *)rec.frames[0].data, "\"actor\":\"traced\""));
        }
        sockets += rec.kind == LS_TRACE_SOCKET;
        if (rec.kind != LS_TRACE_MSG)
            continue;
        assert_true(rec.t_ns >= last_t);
        last_t = rec.t_ns;
        assert_int_equal(rec.nframes, 2);  // ROUTER: identity, body
        ls_msg_t m;
        ls_msgerr_t e;
        assert_int_equal(ls_msg_decode(rec.frames[1].data, rec.frames[1].len, &m, &e), 0);
        if (m.type == LS_MSG_SHUTDOWN)
            shutdowns++;
        else {
            ls_msg_t want;
            rt_random_request(&want, m.rid - 1);
            assert_true(ls_msg_equal(&want, &m));
            ls_msg_clear(&want);
            ins += rec.dir == LS_TRACE_IN;
            outs += rec.dir == LS_TRACE_OUT;
        }
        ls_msg_clear(&m);
    }
    ls_trace_reader_destroy(&rd);
    assert_int_equal(sockets, 1);
    assert_int_equal(ins, 5);
    assert_int_equal(outs, 5);
    assert_int_equal(shutdowns, 1);

    // Tear the last record: everything before it still reads, then a clear "torn" error.
    FILE *f = fopen(path, "r+");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    assert_int_equal(truncate(path, size - 7), 0);
    rd = ls_trace_reader_new(path, err, sizeof err);
    int m = 0, rc;
    while ((rc = ls_trace_read(rd, &rec, err, sizeof err)) == 1)
        m++;
    assert_int_equal(rc, -1);
    assert_int_equal(m, n - 1);
    assert_non_null(strstr(err, "torn"));
    ls_trace_reader_destroy(&rd);
}

// ---------------------------------------------------------------------------------------------
// timers

static void s_tick(ls_actor_t *a, ls_timer_t *t, void *arg) {
    int *ticks = arg;
    if (++*ticks == 5)
        ls_actor_shutdown(a, "five ticks");
}

static int s_timer_start(ls_actor_t *a, void *state) {
    return ls_actor_timer_start(a, 5, 5, s_tick, state) ? 0 : -1;
}

static void test_timers(void **unused) {
    char tdir[128];
    rt_trace_dir(tdir, sizeof tdir);
    int ticks = 0;
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "ticker", .dispatch = table, .state = &ticks, .on_start = s_timer_start};
    ls_actor_opts_t opts = {.name = "ticker", .trace_dir = tdir};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    rt_join(&r);
    assert_int_equal(ticks, 5);

    char err[512];
    ls_trace_reader_t *rd = rt_trace_open("ticker");
    static ls_trace_record_t rec;
    int timers = 0;
    while (ls_trace_read(rd, &rec, err, sizeof err) == 1)
        if (rec.kind == LS_TRACE_TIMER) {
            assert_int_equal(rec.aux, 1);  // the first timer the actor created
            timers++;
        }
    ls_trace_reader_destroy(&rd);
    assert_int_equal(timers, 5);
}

// ---------------------------------------------------------------------------------------------
// deferred Ready: an actor whose readiness waits on something says Ready itself, later

static void s_ready_now(ls_actor_t *a, ls_timer_t *t, void *arg) { ls_actor_ready(a); }
static void s_stop_now(ls_actor_t *a, ls_timer_t *t, void *arg) { ls_actor_shutdown(a, "done"); }

static int s_later_start(ls_actor_t *a, void *state) {
    ls_actor_timer_start(a, 100, 0, s_ready_now, NULL);
    ls_actor_timer_start(a, 300, 0, s_stop_now, NULL);
    return LS_READY_LATER;
}

static void test_ready_later(void **unused) {
    char cep[128];
    rt_endpoint(cep, sizeof cep, "control");
    zsock_t *control = zsock_new_router(cep);
    assert_non_null(control);
    zsock_set_rcvtimeo(control, 5000);
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "late", .dispatch = table, .on_start = s_later_start};
    ls_actor_opts_t opts = {.name = "late", .control = cep};
    uint64_t t0 = ls_mono_ns();
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    zmsg_t *zm = zmsg_recv(control);
    assert_non_null(zm);
    uint64_t waited_ms = (ls_mono_ns() - t0) / 1000000;
    zframe_t *id = zmsg_pop(zm), *body = zmsg_pop(zm);
    ls_msg_t m;
    assert_int_equal(ls_msg_decode(zframe_data(body), zframe_size(body), &m, NULL), 0);
    assert_int_equal(m.type, LS_MSG_READY);  // the first thing the launcher hears
    assert_string_equal(m.u.ready.actor, "late");
    assert_true(waited_ms >= 90);            // not before the actor said so
    ls_msg_clear(&m);
    zframe_destroy(&id);
    zframe_destroy(&body);
    zmsg_destroy(&zm);
    rt_join(&r);
    zsock_destroy(&control);
}

// ---------------------------------------------------------------------------------------------
// supervision: PeerStatus only from the launcher; a peer that went down loses its queue

typedef struct {
    int statuses;  // PeerStatus messages the handler saw
} sup_t;

static int s_sup_status(ls_actor_t *a, ls_in_t *in, void *state) {
    __atomic_add_fetch(&((sup_t *)state)->statuses, 1, __ATOMIC_SEQ_CST);
    return 0;
}

// Whatever a client sends on the ROUTER goes on to the peer "victim".
static int s_sup_forward(ls_actor_t *a, ls_in_t *in, void *state) { return ls_actor_send_peer(a, "victim", in->msg, NULL); }

static zmsg_t *s_recv_msg(zsock_t *s, ls_msg_t *m, int type) {
    zmsg_t *zm = zmsg_recv(s);
    assert_non_null(zm);
    zframe_t *body = zmsg_last(zm);
    assert_int_equal(ls_msg_decode(zframe_data(body), zframe_size(body), m, NULL), 0);
    assert_int_equal(m->type, type);
    return zm;
}

// As the launcher: msg to the actor `name` on the control ROUTER.
static void s_control_send(zsock_t *control, const char *name, const ls_msg_t *msg) {
    zmsg_t *zm = zmsg_new();
    zmsg_addstr(zm, name);
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(msg, &buf, &len), 0);
    zmsg_addmem(zm, buf, len);
    free(buf);
    assert_int_equal(zmsg_send(&zm, control), 0);
}

static void test_peer_status(void **unused) {
    char cep[128], bind[128], vep[128];
    rt_endpoint(cep, sizeof cep, "sup-control");
    rt_endpoint(bind, sizeof bind, "sup");
    rt_endpoint(vep, sizeof vep, "victim");
    zsock_t *control = zsock_new_router(cep);
    assert_non_null(control);
    zsock_set_rcvtimeo(control, 5000);
    static const ls_dispatch_t table[] = {{LS_MSG_PEER_STATUS, s_sup_status}, {LS_MSG_GENERATE_REQ, s_sup_forward}, {0, NULL}};
    sup_t st = {0};
    ls_actor_def_t def = {.name = "sup", .dispatch = table, .state = &st};
    char peer[200];
    snprintf(peer, sizeof peer, "victim=%s", vep);
    char *pv[] = {peer};
    ls_strlist_t peers = {.v = pv, .n = 1};
    ls_actor_opts_t opts = {.name = "sup", .bind = bind, .control = cep, .peers = &peers};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    ls_msg_t m;
    zmsg_destroy((zmsg_t *[]){s_recv_msg(control, &m, LS_MSG_READY)});
    ls_msg_clear(&m);

    // A client on the ROUTER cannot pass for the launcher: its PeerStatus is dropped.
    zsock_t *c = rt_client(bind);
    ls_msg_t ps;
    ls_msg_init(&ps, LS_MSG_PEER_STATUS);
    ps.u.peer_status.actor = ls_msg_strdup("victim");
    rt_client_send(c, &ps);
    ls_msg_t ping;
    ls_msg_init(&ping, LS_MSG_HEARTBEAT);
    ping.rid = 7;
    rt_client_send(c, &ping);
    rt_client_recv(c, &m);  // the pong: the PeerStatus before it was handled
    assert_int_equal(m.type, LS_MSG_HEARTBEAT);
    ls_msg_clear(&m);
    assert_int_equal(st.statuses, 0);

    // Three requests queue for the victim, which is not there; then the launcher says it went
    // down; a fourth goes after that. The restarted victim gets only the fourth.
    for (uint64_t rid = 1; rid <= 4; rid++) {
        if (rid == 4) {
            s_control_send(control, "sup", &ps);
            // The control socket is not ordered with the client's: wait until it was handled.
            for (int i = 0; i < 500 && !__atomic_load_n(&st.statuses, __ATOMIC_SEQ_CST); i++)
                usleep(10000);
        }
        ls_msg_t g;
        rt_random_request(&g, rid);
        g.rid = rid;
        rt_client_send(c, &g);
        ls_msg_clear(&g);
        rt_client_send(c, &ping);
        rt_client_recv(c, &m);
        ls_msg_clear(&m);
    }
    assert_int_equal(st.statuses, 1);
    zsock_t *victim = zsock_new_router(vep);
    assert_non_null(victim);
    zsock_set_rcvtimeo(victim, 5000);
    zmsg_t *zm = s_recv_msg(victim, &m, LS_MSG_GENERATE_REQ);
    assert_int_equal(m.rid, 4);
    ls_msg_clear(&m);
    zmsg_destroy(&zm);
    zsock_set_rcvtimeo(victim, 300);
    assert_null(zmsg_recv(victim));

    // A supervised actor takes Shutdown from its launcher only: a client's is refused.
    rt_client_shutdown(c);
    rt_client_recv(c, &m);
    assert_int_equal(m.type, LS_MSG_ERROR);
    assert_contains(m.u.error.message, "only the launcher stops sup");
    ls_msg_clear(&m);
    ls_msg_t stop;
    ls_msg_init(&stop, LS_MSG_SHUTDOWN);
    s_control_send(control, "sup", &stop);
    rt_join(&r);
    ls_msg_clear(&ps);
    ls_msg_clear(&ping);
    zsock_destroy(&c);
    zsock_destroy(&victim);
    zsock_destroy(&control);
}

// ---------------------------------------------------------------------------------------------
// wakeup

#define WAKE_ROUNDS 200
#define WAKE_BURST 626 // the last drain of the burst has 50 (LS_DRAIN_CAP 64)

typedef struct {
    zframe_t *client;  // identity of the client on the ROUTER
} wake_t;

// On the ROUTER: a client's request, fanned out to the backend. On the DEALER: the backend's
// answers, each relayed to the client on the ROUTER (a send on an earlier socket while a
// later one is drained).
static int s_wake_relay(ls_actor_t *a, ls_in_t *in, void *state) {
    wake_t *w = state;
    if (in->sock == ls_actor_router(a)) {
        zframe_destroy(&w->client);
        w->client = zframe_dup(in->identity);
        for (uint64_t i = 0; i < WAKE_BURST; i++) {
            ls_msg_t m;
            rt_random_request(&m, i);
            int rc = ls_actor_send_peer(a, "backend", &m, NULL);
            ls_msg_clear(&m);
            if (rc < 0)
                return -1;
        }
        return 0;
    }
    return ls_actor_send(a, ls_actor_router(a), w->client, in->msg, NULL);
}

// With no timer to wake it, an actor must still answer a ping that arrives while it relays a
// burst from one socket to another: the loop may not block while a socket is marked for more.
static void test_wakeup(void **unused) {
    char ep[128], bep[128], peer[160];
    rt_endpoint(ep, sizeof ep, "relay");
    rt_endpoint(bep, sizeof bep, "backend");
    snprintf(peer, sizeof peer, "backend=%s", bep);
    char *pv[] = {peer};
    ls_strlist_t peers = {pv, 1};
    zsock_t *backend = zsock_new(ZMQ_ROUTER);
    assert_non_null(backend);
    // Every answer of a burst must leave: a ROUTER drops silently at its high-water mark.
    zsock_set_sndhwm(backend, 100000);
    zsock_set_router_mandatory(backend, 1);
    assert_int_equal(zsock_bind(backend, "%s", bep), 0);
    zsock_set_rcvtimeo(backend, 10000);
    static const ls_dispatch_t table[] = {{LS_MSG_GENERATE_REQ, s_wake_relay}, {0, NULL}};
    wake_t w = {0};
    ls_actor_def_t def = {.name = "relay", .dispatch = table, .state = &w};
    ls_actor_opts_t opts = {.name = "relay", .bind = ep, .peers = &peers};
    rt_runner_t r;
    rt_start(&r, ls_actor_new(&def, &opts));
    zsock_t *c = rt_client(ep);
    zsock_set_rcvtimeo(c, 5000);
    ls_msg_t go, ping, m;
    rt_random_request(&go, 0);
    ls_msg_init(&ping, LS_MSG_HEARTBEAT);
    for (int round = 0; round < WAKE_ROUNDS; round++) {
        rt_client_send(c, &go);
        zmsg_t *burst[WAKE_BURST];
        for (int i = 0; i < WAKE_BURST; i++)
            assert_non_null(burst[i] = zmsg_recv(backend));
        for (int i = 0; i < WAKE_BURST; i++)
            assert_int_equal(zmsg_send(&burst[i], backend), 0);
        ping.rid = 1000 + (uint64_t)round;
        int relayed = 0, pongs = 0;
        bool pinged = false;
        while (relayed < WAKE_BURST || !pongs) {
            // The ping goes while the relay is in its last drain of the backend's answers.
            if (relayed == WAKE_BURST - 40 && !pinged) {
                rt_client_send(c, &ping);
                pinged = true;
            }
            rt_client_recv(c, &m);  // a timeout: the actor slept on a message it had
            relayed += m.type == LS_MSG_GENERATE_REQ;
            pongs += m.type == LS_MSG_HEARTBEAT && m.rid == ping.rid;
            ls_msg_clear(&m);
        }
    }
    rt_client_shutdown(c);
    rt_join(&r);
    zframe_destroy(&w.client);
    ls_msg_clear(&go);
    ls_msg_clear(&ping);
    zsock_destroy(&c);
    zsock_destroy(&backend);
}

int main(void) {
    if (rt_init("runtime-actor", 100) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exchange),
        cmocka_unit_test(test_fairness),
        cmocka_unit_test(test_slow_handlers),
        cmocka_unit_test(test_shutdown_answers_inflight),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_trace),
        cmocka_unit_test(test_timers),
        cmocka_unit_test(test_ready_later),
        cmocka_unit_test(test_peer_status),
        cmocka_unit_test(test_bulk),
        cmocka_unit_test(test_metrics_info),
        cmocka_unit_test(test_wakeup),
    };
    return rt_fini(cmocka_run_group_tests(tests, NULL, NULL));
}
