/*  fuzz_actor.c — libFuzzer target for one actor's own handlers with its real state: built once
    per actor (LS_FUZZ_ACTOR names it), with that actor's folder linked in and its main renamed
    ls_fuzz_actor_main. The actor runs in a thread of this process as the launcher starts it
    (its flags, the demo model, the CPU backend, a journal in a scratch directory), so every
    message goes through its runtime and its own dispatch table to the handlers and cores it
    serves with. The target plays every other party of the graph:

    - senders: one DEALER per identity (client, gateway, tokenizer, registry, scheduler,
      detokenizer, worker-0, worker-1) to the actor's ROUTER, as peers and clients send;
    - peers: one ROUTER per --peer of the actor, so what it sends to its peers arrives here and
      answers go back on its DEALERs, as replies from those peers do;
    - the launcher: the control ROUTER (Ready; PeerStatus is taken from there only);
    - HTTP clients of the gateway.

    The input is a list of records [op][len][len bytes]. op & 7 says what to do, (op >> 3) & 7
    which sender or peer, op & 0x40 that frames follow the message (the payload after the first
    "\xff\xfe", split at each further one: bulk data):
      0, 6, 7  a message made from the payload (its first byte picks the type among every type
               of messages/schema.msg, the rest gives every field's value: ls_msg_fill) from a
               sender;
      1        such a message from a peer, on its DEALER;
      2        such a message from the launcher, on the control socket;
      3        raw frames (the payload split at "\xff\xfe") from a sender: garbage, or a message
               the corpus spells out;
      4        such a message as the answer to the last message the actor sent that peer (its rid
               copied), once the actor has handled everything before;
      5        (gateway) the payload as the bytes of one HTTP client.
    No Shutdown is sent: the actor keeps its state across inputs, as a long-lived one does.
    After each input every sender pings the actor (Heartbeat): it must answer within 30 s, and
    everything it sends anywhere must decode; an actor that stops on its own fails the run.

    The corpus (tests/fuzz/corpus/actor_<name>/) is written by this target:
    LS_FUZZ_WRITE_SEEDS=DIR fuzz_actor_<name> writes the seeds into DIR and exits. Paths in the
    seeds (adapter directories) are relative to the source tree's root, where ctest runs it.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "fuzz_frames.h"
#include "ls_actor.h"

int ls_fuzz_actor_main(int argc, char **argv);

#define S_PING_RID 0x70696e6700000000ull
#define S_MAX_RECORDS 32
#define S_MAX_HTTP 4
#define S_SENDERS 8
#define S_BULK 0x40 // op: frames follow the message
#define S_RAW 0x80  // op: the payload is the frames themselves

//  Every actor gets every other as a --peer; the target is all of them. The dispatcher's graph
//  (--dp-size 2) has its groups' schedulers, scheduler-0 and scheduler-1, where the others have
//  one scheduler and its worker.
#define S_DISPATCHER (!strcmp(LS_FUZZ_ACTOR, "dispatcher"))
static const char *const s_senders_one[S_SENDERS] = {"client",    "gateway",     "tokenizer", "registry",
                                                     "scheduler", "detokenizer", "worker-0",  "worker-1"};
static const char *const s_senders_dp[S_SENDERS] = {"client",      "gateway",     "tokenizer",   "registry",
                                                    "scheduler-0", "detokenizer", "scheduler-1", "worker-0-0"};
#define s_senders (S_DISPATCHER ? s_senders_dp : s_senders_one)
static const char *const s_all_one[] = {"gateway", "tokenizer", "registry", "scheduler", "detokenizer", "worker-0"};
static const char *const s_all_dp[] = {"gateway",     "tokenizer",  "registry",   "detokenizer",
                                       "dispatcher",  "scheduler-0", "scheduler-1"};
#define S_ALL_MAX 7
#define s_all (S_DISPATCHER ? s_all_dp : s_all_one)
#define S_ALL (S_DISPATCHER ? sizeof s_all_dp / sizeof *s_all_dp : sizeof s_all_one / sizeof *s_all_one)

typedef struct {
    const char *name;
    zsock_t *router;
    uint64_t last_rid; // of the last message the actor sent here
    bool fresh;        // ... not answered by a record yet
} s_peer_t;

static struct {
    char ep[256]; // the actor's ROUTER
    zsock_t *dealers[S_SENDERS];
    bool pinged[S_SENDERS]; // sent to since the last sync
    s_peer_t peers[S_ALL_MAX];
    size_t npeers;
    zsock_t *control;
    int http_port;
    int http[S_MAX_HTTP];
    size_t nhttp;
    uint16_t types[256]; // every message type of the schema
    size_t ntypes;
    uint64_t ping;
    atomic_int stopped;
} s;

//  Appends one argument, printf-style.
static void __attribute__((format(printf, 3, 4))) s_arg(char **argv, int *n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (*n >= 63 || vasprintf(&argv[*n], fmt, ap) < 0)
        s_die("cannot build the command line");
    va_end(ap);
    argv[++*n] = NULL;
}

//  A free TCP port for the gateway (it must be known here to connect).
static int s_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &alen) != 0)
        s_die("no free port");
    close(fd);
    return ntohs(a.sin_port);
}

//  The command line the launcher would give this actor (launch/loraserve), scaled down; argv
//  holds 64.
static void s_argv(char **argv) {
    const char *name = LS_FUZZ_ACTOR, *dir = s_scratch_dir(), *demo = LS_DEMO_DIR;
    int n = 0;
    s_arg(argv, &n, "loraserve-%s", name);
    s_arg(argv, &n, "--name=%s", name);
    s_arg(argv, &n, "--bind=%s", s.ep);
    s_arg(argv, &n, "--control=ipc://%s/control.sock", dir);
    s_arg(argv, &n, "--heartbeat-ms=0");
    //  LS_FUZZ_LOG_LEVEL=debug shows what the actor makes of an input (errors only by default).
    s_arg(argv, &n, "--log-level=%s", getenv("LS_FUZZ_LOG_LEVEL") ? getenv("LS_FUZZ_LOG_LEVEL") : "error");
    for (size_t i = 0; i < S_ALL; i++)
        if (strcmp(s_all[i], name))
            s_arg(argv, &n, "--peer=%s=ipc://%s/peer-%s.sock", s_all[i], dir, s_all[i]);
    if (strcmp(name, "scheduler") && strcmp(name, "dispatcher"))
        s_arg(argv, &n, "--model-path=%s", demo);
    if (!strcmp(name, "worker") || !strcmp(name, "registry") || !strcmp(name, "scheduler"))
        s_arg(argv, &n, "--lora-roots=%s/adapters", demo);
    //  Timeouts short enough for the fuzzer to meet them too.
    static const char *const worker[] = {"--backend=cpu",
                                         "--threads=1",
                                         "--kv-blocks=64",
                                         "--max-lora-rank=16",
                                         "--max-loras-per-batch=4",
                                         "--max-loaded-loras=3",
                                         "--max-running-requests=16",
                                         "--max-num-batched-tokens=256",
                                         NULL};
    static const char *const registry[] = {"--max-lora-rank=16", "--max-loras-per-batch=4",
                                           "--load-timeout-ms=2000", "--unload-timeout-ms=2000", NULL};
    static const char *const scheduler[] = {"--load-timeout-ms=2000",       "--step-timeout-ms=2000",
                                            "--max-num-batched-tokens=256", "--chunked-prefill-size=64",
                                            "--max-waiting-requests=64",    NULL};
    static const char *const gateway[] = {"--request-timeout-ms=2000", NULL};
    const char *const *own = !strcmp(name, "worker")      ? worker
                             : !strcmp(name, "registry")  ? registry
                             : !strcmp(name, "scheduler") ? scheduler
                             : !strcmp(name, "gateway")   ? gateway
                                                          : NULL;
    for (; own && *own; own++)
        s_arg(argv, &n, "%s", *own);
    if (!strcmp(name, "registry")) {
        s_arg(argv, &n, "--lora-dirs=%s/adapters", demo);
        s_arg(argv, &n, "--state-dir=%s", dir);
    }
    if (!strcmp(name, "gateway"))
        s_arg(argv, &n, "--port=%d", s.http_port = s_free_port());
}

static void *s_run(void *arg) {
    char **argv = arg;
    int argc = 0;
    while (argv[argc])
        argc++;
    ls_fuzz_actor_main(argc, argv);
    atomic_store(&s.stopped, 1);
    return NULL;
}

//  Checks one message the actor sent: its body must decode. Returns its rid, type in *type.
static uint64_t s_check(zmsg_t *zm, bool routed, int *type) {
    zframe_t *body = zmsg_first(zm);
    if (routed)
        body = zmsg_next(zm);
    ls_msg_t m;
    ls_msgerr_t err;
    if (!body || ls_msg_decode(zframe_data(body), zframe_size(body), &m, &err) != 0) {
        fprintf(stderr, "fuzz_actor: %s sent %s\n", LS_FUZZ_ACTOR, body ? err.text : "no body");
        s_die("the actor sent a message that does not decode");
    }
    uint64_t rid = m.rid;
    *type = m.type;
    ls_msg_clear(&m);
    return rid;
}

//  Takes everything waiting on every socket; 1 when a ping (rid) came back.
static int s_drain(uint64_t ping) {
    int pong = 0, type;
    for (size_t i = 0; i < S_SENDERS; i++)
        while (s.dealers[i] && (zsock_events(s.dealers[i]) & ZMQ_POLLIN)) {
            zmsg_t *zm = zmsg_recv(s.dealers[i]);
            if (zm && s_check(zm, false, &type) == ping && type == LS_MSG_HEARTBEAT)
                pong++;
            zmsg_destroy(&zm);
        }
    for (size_t i = 0; i < s.npeers; i++)
        while (zsock_events(s.peers[i].router) & ZMQ_POLLIN) {
            zmsg_t *zm = zmsg_recv(s.peers[i].router);
            if (zm) {
                s.peers[i].last_rid = s_check(zm, true, &type);
                s.peers[i].fresh = true;
            }
            zmsg_destroy(&zm);
        }
    while (zsock_events(s.control) & ZMQ_POLLIN) {
        zmsg_t *zm = zmsg_recv(s.control);
        if (zm)
            s_check(zm, true, &type);
        zmsg_destroy(&zm);
    }
    return pong;
}

//  Waits for whatever the actor has to say, up to ms; stops early when one of the sockets is
//  readable (the caller drains).
static void s_wait(int ms) {
    zmq_pollitem_t items[S_SENDERS + S_ALL_MAX + 1 + S_MAX_HTTP];
    int n = 0;
    for (size_t i = 0; i < S_SENDERS; i++)
        if (s.dealers[i])
            items[n++] = (zmq_pollitem_t){zsock_resolve(s.dealers[i]), 0, ZMQ_POLLIN, 0};
    for (size_t i = 0; i < s.npeers; i++)
        items[n++] = (zmq_pollitem_t){zsock_resolve(s.peers[i].router), 0, ZMQ_POLLIN, 0};
    items[n++] = (zmq_pollitem_t){zsock_resolve(s.control), 0, ZMQ_POLLIN, 0};
    for (size_t i = 0; i < s.nhttp; i++)
        items[n++] = (zmq_pollitem_t){NULL, s.http[i], ZMQ_POLLIN, 0};
    zmq_poll(items, n, ms);
}

//  Every sender used since the last sync pings; returns once every ping is answered (the actor
//  has handled everything those senders sent before), or fails the run after 30 s.
static void s_sync(void) {
    int want = 0;
    uint64_t ping = S_PING_RID + ++s.ping;
    for (size_t i = 0; i < S_SENDERS; i++)
        if (s.pinged[i]) {
            ls_msg_t m;
            ls_msg_init(&m, LS_MSG_HEARTBEAT);
            m.rid = ping;
            char *buf;
            size_t len;
            if (ls_msg_encode(&m, &buf, &len) != 0 || zsock_send(s.dealers[i], "b", buf, len) != 0)
                s_die("cannot ping");
            free(buf);
            s.pinged[i] = false;
            want++;
        }
    for (int64_t end = zclock_mono() + 30000; want > 0;) {
        if (atomic_load(&s.stopped))
            s_die("the actor stopped");
        if (zclock_mono() > end)
            s_die("the actor did not answer its pings within 30 s");
        s_wait(100);
        want -= s_drain(ping);
    }
}

static zsock_t *s_dealer(size_t i) {
    if (!s.dealers[i]) {
        s.dealers[i] = zsock_new(ZMQ_DEALER);
        if (!s.dealers[i])
            s_die("no socket");
        zsock_set_identity(s.dealers[i], s_senders[i]);
        if (zsock_connect(s.dealers[i], "%s", s.ep) != 0)
            s_die("cannot connect to the actor");
    }
    s.pinged[i] = true;
    return s.dealers[i];
}

static pthread_t s_thread;

//  At exit: the actor stops as the launcher stops it (Shutdown on the control socket), so that
//  its shutdown runs on the state the fuzzer left, and its sockets close before czmq's.
static void s_stop(void) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    m.u.shutdown.reason = ls_msg_strdup("fuzz: done");
    char *buf;
    size_t len;
    if (!atomic_load(&s.stopped) && ls_msg_encode(&m, &buf, &len) == 0) {
        zsock_send(s.control, "sb", LS_FUZZ_ACTOR, buf, len);
        free(buf);
        for (int64_t end = zclock_mono() + 30000; !atomic_load(&s.stopped) && zclock_mono() < end;)
            s_wait(50), s_drain(0);
        if (atomic_load(&s.stopped))
            pthread_join(s_thread, NULL);
    }
    ls_msg_clear(&m);
    for (size_t i = 0; i < S_SENDERS; i++)
        zsock_destroy(&s.dealers[i]);
    for (size_t i = 0; i < s.npeers; i++)
        zsock_destroy(&s.peers[i].router);
    zsock_destroy(&s.control);
}

static void s_start(void) {
    const char *dir = s_scratch_dir();
    snprintf(s.ep, sizeof s.ep, "ipc://%s/%s.sock", dir, LS_FUZZ_ACTOR);
    for (int t = 1; t < 256; t++)
        if (ls_msg_type_name(t))
            s.types[s.ntypes++] = (uint16_t)t;
    s.control = zsock_new_router(NULL);
    if (!s.control || zsock_bind(s.control, "ipc://%s/control.sock", dir) != 0)
        s_die("cannot bind the control socket");
    for (size_t i = 0; i < S_ALL; i++)
        if (strcmp(s_all[i], LS_FUZZ_ACTOR)) {
            s_peer_t *p = &s.peers[s.npeers++];
            p->name = s_all[i];
            p->router = zsock_new_router(NULL);
            if (!p->router || zsock_bind(p->router, "ipc://%s/peer-%s.sock", dir, p->name) != 0)
                s_die("cannot bind a peer socket");
        }
    static char *argv[64];
    s_argv(argv);
    if (pthread_create(&s_thread, NULL, s_run, argv) != 0)
        s_die("cannot start the actor");
    //  Ready comes on the control socket once the actor serves (the worker: its model loaded).
    for (int64_t end = zclock_mono() + 120000;;) {
        if (atomic_load(&s.stopped))
            s_die("the actor did not start");
        if (zclock_mono() > end)
            s_die("the actor was not Ready within 120 s");
        zmq_pollitem_t item = {zsock_resolve(s.control), 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 100) < 1)
            continue;
        zmsg_t *zm = zmsg_recv(s.control);
        int type = 0;
        if (zm)
            s_check(zm, true, &type);
        zmsg_destroy(&zm);
        if (type == LS_MSG_READY)
            break;
    }
    atexit(s_stop);
}

//  The fuzzer's bytes as ls_msg_fill's bits: one byte a value (0 .. 254), or 0xff and the
//  next eight bytes for any 64-bit value; zeros once they run out.
typedef struct {
    const uint8_t *p, *end;
} s_bits_t;

static uint64_t s_bits_next(void *arg) {
    s_bits_t *b = arg;
    if (b->p >= b->end)
        return 0;
    uint8_t first = *b->p++;
    if (first != 0xff)
        return first;
    uint64_t v = 0;
    for (int i = 0; i < 8 && b->p < b->end; i++)
        v |= (uint64_t)*b->p++ << (8 * i);
    return v;
}

//  The frames a record sends: its payload split at each "\xff\xfe" (raw), or the message it
//  makes (ls_msg_fill) followed by bulk frames; rid, when given, replaces the message's.
//  NULL for a Shutdown, which would end the actor rather than test it.
static zmsg_t *s_make(const uint8_t *p, size_t len, uint8_t op, const uint64_t *rid) {
    const uint8_t *end = p + len;
    zmsg_t *zm = zmsg_new();
    ls_msg_t m;
    if (op & S_RAW) {
        fuzz_frames_add(zm, p, end);
        zframe_t *body = zmsg_first(zm);
        if (ls_msg_decode(zframe_data(body), zframe_size(body), &m, NULL) != 0)
            return zm; // garbage goes as it is
        if (m.type != LS_MSG_SHUTDOWN && !rid) {
            ls_msg_clear(&m);
            return zm; // and a message as it is spelled (unknown fields and all)
        }
    } else {
        const uint8_t *sep = op & S_BULK ? memmem(p, len, "\xff\xfe", 2) : NULL;
        s_bits_t bits = {p + (len > 0), sep ? sep : end};
        ls_msg_fill(&m, s.types[(len ? p[0] : 0) % s.ntypes], s_bits_next, &bits);
        zmsg_addmem(zm, NULL, 0);
        if (sep)
            fuzz_frames_add(zm, sep + 2, end);
    }
    if (rid)
        m.rid = *rid;
    char *buf;
    size_t blen;
    int rc = m.type == LS_MSG_SHUTDOWN ? -1 : ls_msg_encode(&m, &buf, &blen);
    ls_msg_clear(&m);
    if (rc != 0) {
        zmsg_destroy(&zm);
        return NULL;
    }
    zframe_reset(zmsg_first(zm), buf, blen);
    free(buf);
    return zm;
}

//  Sends zm from a ROUTER of this target to the actor's DEALER there (its identity: its name).
static void s_send_routed(zsock_t *router, zmsg_t **zm_p) {
    if (!*zm_p)
        return;
    zmsg_pushstr(*zm_p, LS_FUZZ_ACTOR);
    zmsg_send(zm_p, router); // dropped when the actor has no DEALER here yet
    zmsg_destroy(zm_p);
}

static void s_send_dealer(size_t who, zmsg_t **zm_p) {
    if (*zm_p)
        zmsg_send(zm_p, s_dealer(who));
    zmsg_destroy(zm_p);
}

//  The rid of the peer's last message, once the actor has handled everything before (a
//  background job, such as the registry's validation of an adapter, may take a moment more).
static uint64_t s_answering(s_peer_t *peer) {
    s_sync();
    s_drain(0);
    for (int i = 0; i < 5 && !peer->fresh; i++) {
        s_wait(10);
        s_drain(0);
    }
    peer->fresh = false;
    return peer->last_rid;
}

//  One HTTP client's bytes to the gateway; waits until it answers or asks the tokenizer.
static void s_http(const uint8_t *p, size_t len) {
    if (!s.http_port || s.nhttp == S_MAX_HTTP)
        return;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)s.http_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        s_die("cannot connect to the gateway");
    fcntl(fd, F_SETFL, O_NONBLOCK);
    s.http[s.nhttp++] = fd;
    if (len && write(fd, p, len) < 0)
        return;
    s_wait(200);
}

static void s_http_close(void) {
    char buf[4096];
    for (size_t i = 0; i < s.nhttp; i++) {
        while (read(s.http[i], buf, sizeof buf) > 0)
            ;
        close(s.http[i]);
    }
    s.nhttp = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!s.control)
        s_start();
    const uint8_t *p = data, *end = data + size;
    for (int r = 0; r < S_MAX_RECORDS && end - p >= 2; r++) {
        uint8_t op = p[0];
        size_t len = p[1] < end - p - 2 ? p[1] : (size_t)(end - p - 2);
        const uint8_t *payload = p + 2;
        p += 2 + len;
        size_t who = (op >> 3) & 7;
        s_peer_t *peer = &s.peers[who % s.npeers];
        zmsg_t *zm = NULL;
        uint64_t rid;
        switch (op & 7) {
        case 1:
            zm = s_make(payload, len, op, NULL);
            s_send_routed(peer->router, &zm);
            break;
        case 2:
            zm = s_make(payload, len, op, NULL);
            s_send_routed(s.control, &zm);
            break;
        case 3:
            zm = s_make(payload, len, op | S_RAW, NULL);
            s_send_dealer(who, &zm);
            break;
        case 4:
            rid = s_answering(peer);
            zm = s_make(payload, len, op, &rid);
            s_send_routed(peer->router, &zm);
            break;
        case 5:
            s_http(payload, len);
            s_drain(0);
            break;
        case 6:
            rid = s_answering(peer);
            zm = len ? s_make(payload + 1, len - 1, op, &rid) : NULL;
            s_send_dealer(len ? payload[0] % S_SENDERS : 0, &zm);
            break;
        default: zm = s_make(payload, len, op, NULL); s_send_dealer(who, &zm);
        }
    }
    s_dealer(0); // at least one ping, so that a lone record is handled too
    s_sync();
    s_http_close();
    if (atomic_load(&s.stopped))
        s_die("the actor stopped");
    return 0;
}

//  --------------------------------------------------------------------------
//  The seeds: for each actor, a few conversations its peers have with it.

typedef struct {
    uint8_t buf[8192];
    size_t len;
} s_seed_t;

static size_t s_sender(const char *name) {
    for (size_t i = 0; i < S_SENDERS; i++)
        if (!strcmp(s_senders[i], name))
            return i;
    s_die("no such sender");
}

//  The index of a peer of this actor (the order s_start binds them in).
static size_t s_peer(const char *name) {
    for (size_t i = 0, n = 0; i < S_ALL; i++)
        if (strcmp(s_all[i], LS_FUZZ_ACTOR)) {
            if (!strcmp(s_all[i], name))
                return n;
            n++;
        }
    s_die("no such peer");
}

static void s_seed_add(s_seed_t *sd, uint8_t op, const void *prefix, size_t plen, const void *data,
                       size_t len) {
    if (plen + len > 255 || sd->len + 2 + plen + len > sizeof sd->buf)
        s_die("a seed record is too long");
    sd->buf[sd->len++] = op;
    sd->buf[sd->len++] = (uint8_t)(plen + len);
    if (plen)
        memcpy(sd->buf + sd->len, prefix, plen);
    memcpy(sd->buf + sd->len + plen, data, len);
    sd->len += plen + len;
}

//  One message, spelled out (a raw record); cleared. kind 0: from sender `who`; 4: the answer
//  to peer `who`'s last message; 6: the same from sender `from`.
static void s_seed_msg(s_seed_t *sd, int kind, size_t who, const char *from, ls_msg_t *m) {
    char *buf;
    size_t len;
    if (ls_msg_encode(m, &buf, &len) != 0)
        s_die("a seed message does not encode");
    uint8_t sender = from ? (uint8_t)s_sender(from) : 0;
    s_seed_add(sd, (uint8_t)(kind | who << 3 | S_RAW), &sender, from ? 1 : 0, buf, len);
    free(buf);
    ls_msg_clear(m);
}

static void s_from(s_seed_t *sd, const char *sender, ls_msg_t *m) {
    s_seed_msg(sd, 0, s_sender(sender), NULL, m);
}

//  A message from sender with one bulk frame after it (a raw record: the frames split at
//  "\xff\xfe"); cleared.
static void s_from_bulk(s_seed_t *sd, const char *sender, ls_msg_t *m, const void *bulk, size_t n) {
    char *buf;
    size_t len;
    uint8_t rec[255];
    if (ls_msg_encode(m, &buf, &len) != 0 || len + 2 + n > sizeof rec)
        s_die("a seed message does not encode, or is too long");
    memcpy(rec, buf, len);
    memcpy(rec + len, "\xff\xfe", 2);
    memcpy(rec + len + 2, bulk, n);
    s_seed_add(sd, (uint8_t)(0 | s_sender(sender) << 3 | S_RAW), NULL, 0, rec, len + 2 + n);
    free(buf);
    ls_msg_clear(m);
}
static void s_reply(s_seed_t *sd, const char *peer, ls_msg_t *m) {
    s_seed_msg(sd, 4, s_peer(peer), NULL, m);
}
static void s_answer(s_seed_t *sd, const char *peer, const char *sender, ls_msg_t *m) {
    s_seed_msg(sd, 6, s_peer(peer), sender, m);
}

static void s_http_seed(s_seed_t *sd, const char *method, const char *path, const char *body) {
    char req[256];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: fuzz\r\nContent-Length: %zu\r\n\r\n%s", method,
                     path, body ? strlen(body) : 0, body ? body : "");
    s_seed_add(sd, 5, NULL, 0, req, (size_t)n);
}

static void s_ids(ls_i32s_t *ids, size_t n, int32_t first) {
    ids->v = calloc(n, sizeof *ids->v);
    ids->n = n;
    for (size_t i = 0; i < n; i++)
        ids->v[i] = first + (int32_t)i;
}

static ls_msg_t s_msg(ls_msg_type_t type, uint64_t rid) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    return m;
}

static ls_msg_t s_text_out(const char *text, ls_finish_reason_t finish, bool last) {
    ls_msg_t m = s_msg(LS_MSG_TEXT_OUT, 0);
    m.u.text_out.text = ls_msg_textdup(text, strlen(text));
    m.u.text_out.finish = finish;
    m.u.text_out.last = last;
    m.u.text_out.completion_tokens = 1;
    return m;
}

static ls_msg_t s_load(const char *name, const char *id, const char *adapter) {
    ls_msg_t m = s_msg(LS_MSG_LOAD_ADAPTER, 3);
    m.u.load_adapter.name = ls_msg_strdup(name);
    m.u.load_adapter.adapter_id = ls_msg_strdup(id);
    if (adapter) {
        char path[128];
        snprintf(path, sizeof path, "examples/demo/adapters/%s", adapter);
        m.u.load_adapter.path = ls_msg_strdup(path);
    }
    return m;
}

static ls_msg_t s_loaded(bool ok, const char *name, const char *id) {
    ls_msg_t m = s_msg(LS_MSG_ADAPTER_LOADED, 0);
    m.u.adapter_loaded.ok = ok;
    m.u.adapter_loaded.name = ls_msg_strdup(name);
    m.u.adapter_loaded.adapter_id = ls_msg_strdup(id);
    m.u.adapter_loaded.rank = 8;
    m.u.adapter_loaded.bytes = 1 << 20;
    if (!ok) {
        m.u.adapter_loaded.code = LS_ERROR_CODE_UNAVAILABLE;
        m.u.adapter_loaded.reason = ls_msg_strdup("fuzz: refused");
    }
    return m;
}

static ls_msg_t s_unloaded(const char *name) {
    ls_msg_t m = s_msg(LS_MSG_ADAPTER_UNLOADED, 0);
    m.u.adapter_unloaded.ok = true;
    m.u.adapter_unloaded.name = ls_msg_strdup(name);
    return m;
}

static ls_msg_t s_named(ls_msg_type_t type, uint64_t rid, const char *name) {
    ls_msg_t m = s_msg(type, rid);
    if (type == LS_MSG_ACQUIRE_ADAPTER)
        m.u.acquire_adapter.name = ls_msg_strdup(name);
    else if (type == LS_MSG_RELEASE_ADAPTER)
        m.u.release_adapter.name = ls_msg_strdup(name);
    else if (type == LS_MSG_UNLOAD_ADAPTER)
        m.u.unload_adapter.name = ls_msg_strdup(name);
    return m;
}

static ls_msg_t s_generate(uint64_t rid, const char *text, const char *adapter, bool stream, uint32_t n) {
    ls_msg_t m = s_msg(LS_MSG_GENERATE_REQ, rid);
    m.u.generate_req.text = ls_msg_textdup(text, strlen(text));
    m.u.generate_req.adapter = ls_msg_strdup(adapter);
    m.u.generate_req.stream = stream;
    m.u.generate_req.sampling.max_new_tokens = 4;
    m.u.generate_req.sampling.n = n;
    return m;
}

static ls_msg_t s_token_out(uint64_t rid, bool first, int32_t from, size_t n, ls_finish_reason_t finish) {
    ls_msg_t m = s_msg(LS_MSG_TOKEN_OUT, rid);
    s_ids(&m.u.token_out.token_ids, n, from);
    m.u.token_out.first = first;
    m.u.token_out.finish = finish;
    if (first) {
        m.u.token_out.sampling.stop.v = calloc(1, sizeof(ls_text_t));
        m.u.token_out.sampling.stop.v[0] = ls_msg_textdup("lo", 2);
        m.u.token_out.sampling.stop.n = 1;
    }
    return m;
}

static ls_msg_t s_step_plan(uint64_t step, uint64_t rid, const char *adapter, int32_t slot, size_t tokens,
                            uint32_t position) {
    ls_msg_t m = s_msg(LS_MSG_STEP_PLAN, 0);
    m.u.step_plan.step = step;
    ls_msg_step_item_t *it = calloc(1, sizeof *it);
    it->rid = rid;
    it->adapter_slot = slot;
    it->adapter_id = ls_msg_strdup(adapter);
    s_ids(&it->token_ids, tokens, 10);
    it->position = position;
    it->block_table.v = calloc(1, sizeof(uint32_t));
    it->block_table.n = 1;
    it->is_prefill = position == 0;
    it->sample = true;
    m.u.step_plan.items.v = it;
    m.u.step_plan.items.n = 1;
    return m;
}

static void s_seeds_detokenizer(s_seed_t *sd, int i) {
    ls_msg_t m;
    if (i == 0) {
        s_from(sd, "scheduler", (m = s_token_out(7, true, 50, 10, LS_FINISH_REASON_NONE), &m));
        s_from(sd, "scheduler", (m = s_token_out(7, false, 60, 3, LS_FINISH_REASON_LENGTH), &m));
    } else if (i == 1) {
        s_from(sd, "scheduler", (m = s_token_out(8, true, 0, 4, LS_FINISH_REASON_NONE), &m));
        s_from(sd, "scheduler", (m = s_token_out(8, false, 99999, 1, LS_FINISH_REASON_NONE), &m));
        s_from(sd, "scheduler", (m = s_token_out(9, false, 70, 2, LS_FINISH_REASON_STOP), &m));
    }
}

static void s_seeds_tokenizer(s_seed_t *sd, int i) {
    ls_msg_t m;
    if (i == 0) {
        s_from(sd, "gateway", (m = s_generate(1, "hello world", NULL, false, 1), &m));
        s_answer(sd, "scheduler", "detokenizer", (m = s_text_out("abc", LS_FINISH_REASON_LENGTH, false), &m));
    } else if (i == 1) {
        s_from(sd, "client", (m = s_generate(2, "a b c", "reverse", true, 2), &m));
        m = s_msg(LS_MSG_ADAPTER_ACQUIRED, 0);
        m.u.adapter_acquired.ok = true;
        m.u.adapter_acquired.name = ls_msg_strdup("reverse");
        m.u.adapter_acquired.adapter_id = ls_msg_strdup("id-reverse");
        m.u.adapter_acquired.rank = 8;
        s_reply(sd, "registry", &m);
        s_answer(sd, "scheduler", "detokenizer", (m = s_text_out("x", LS_FINISH_REASON_NONE, false), &m));
        s_from(sd, "client", (m = s_msg(LS_MSG_ABORT, 2), &m));
    } else if (i == 2) {
        s_from(sd, "client", (m = s_load("n1", NULL, "upper"), &m));
        s_reply(sd, "registry", (m = s_loaded(true, "n1", "id-n1"), &m));
        s_from(sd, "client", (m = s_msg(LS_MSG_LIST_ADAPTERS, 4), &m));
        s_reply(sd, "registry", (m = s_msg(LS_MSG_ADAPTER_LIST, 0), &m));
        m = s_generate(5, "", NULL, false, 1);
        m.u.generate_req.chat = true;
        m.u.generate_req.messages = ls_msg_strdup("[{\"role\":\"user\",\"content\":\"hi\"}]");
        s_from(sd, "client", &m);
    } else if (i == 3) {
        //  a TokenizeReq's adapter granted without an id but with added tokens (the id was a
        //  hash key: a NULL one failed czmq's assertion)
        m = s_msg(LS_MSG_TOKENIZE_REQ, 6);
        m.u.tokenize_req.text = ls_msg_textdup("hi", 2);
        m.u.tokenize_req.adapter = ls_msg_strdup("reverse");
        s_from(sd, "client", &m);
        m = s_msg(LS_MSG_ADAPTER_ACQUIRED, 0);
        m.u.adapter_acquired.ok = true;
        m.u.adapter_acquired.name = ls_msg_strdup("reverse");
        m.u.adapter_acquired.added_tokens.v = calloc(1, sizeof(ls_msg_added_token_t));
        m.u.adapter_acquired.added_tokens.v[0].id = 824; // the demo model's vocabulary size
        m.u.adapter_acquired.added_tokens.v[0].content = ls_msg_strdup("<x>");
        m.u.adapter_acquired.added_tokens.n = 1;
        s_reply(sd, "registry", &m);
    }
}

static void s_seeds_registry(s_seed_t *sd, int i) {
    ls_msg_t m;
    if (i == 0) {
        s_from(sd, "tokenizer", (m = s_load("r1", NULL, "reverse"), &m));
        s_reply(sd, "scheduler", (m = s_loaded(true, "r1", NULL), &m));
        s_from(sd, "tokenizer", (m = s_named(LS_MSG_ACQUIRE_ADAPTER, 5, "r1"), &m));
        s_from(sd, "tokenizer", (m = s_msg(LS_MSG_LIST_ADAPTERS, 6), &m));
        s_reply(sd, "scheduler", (m = s_msg(LS_MSG_ADAPTER_LIST, 0), &m));
        s_from(sd, "tokenizer", (m = s_named(LS_MSG_UNLOAD_ADAPTER, 7, "r1"), &m));
        s_reply(sd, "scheduler", (m = s_unloaded("r1"), &m));
    } else if (i == 1) {
        s_from(sd, "tokenizer", (m = s_named(LS_MSG_ACQUIRE_ADAPTER, 8, "upper"), &m));
        s_reply(sd, "scheduler", (m = s_loaded(true, "upper", NULL), &m));
        s_from(sd, "tokenizer", (m = s_named(LS_MSG_RELEASE_ADAPTER, 0, "upper"), &m));
        m = s_load("x", NULL, NULL);
        m.u.load_adapter.path = ls_msg_strdup("/etc");
        s_from(sd, "tokenizer", &m);
    } else if (i == 2) {
        s_from(sd, "tokenizer", (m = s_load("r2", NULL, "sort"), &m));
        s_reply(sd, "scheduler", (m = s_loaded(false, "r2", NULL), &m));
        s_from(sd, "tokenizer", (m = s_load("r3", NULL, "digits"), &m));
        //  A load from tensors: a valid config and a safetensors whose header promises more
        //  than the file holds; the registry writes its copy, the scheduler refuses it, the
        //  copy goes; then its unload.
        m = s_load("t1", NULL, NULL);
        m.u.load_adapter.from_tensors = true;
        m.u.load_adapter.config_json =
            ls_msg_strdup("{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\"]}");
        static const char st[] = "\x40\0\0\0\0\0\0\0{\"a\":{\"dtype\":\"F32\",\"shape\":[9],\"data_offsets\":[0,36]}}";
        s_from_bulk(sd, "tokenizer", &m, st, sizeof st - 1);
        s_reply(sd, "scheduler", (m = s_loaded(false, "t1", NULL), &m));
        s_from(sd, "tokenizer", (m = s_named(LS_MSG_UNLOAD_ADAPTER, 9, "t1"), &m));
    }
}

static void s_seeds_scheduler(s_seed_t *sd, int i) {
    if (i > 1)
        return;
    ls_msg_t m = s_msg(LS_MSG_WORKER_INFO, 0);
    ls_msg_worker_info_t *w = &m.u.worker_info;
    *w = (ls_msg_worker_info_t){.tp_size = 1,
                                .kv_blocks = 64,
                                .block_size = 16,
                                .max_context = 256,
                                .vocab_size = 512,
                                .max_loras_per_batch = 4,
                                .max_lora_rank = 16,
                                .cpu_lora_bytes = 1 << 24,
                                .lora_max_bytes = 1 << 20};
    s_ids(&w->eos_token_ids, 1, 1);
    s_from(sd, "worker-0", &m);
    if (i == 1) {
        s_from(sd, "registry", (m = s_load("a", "id-a", "reverse"), &m));
        s_answer(sd, "worker-0", "worker-0", (m = s_loaded(true, "a", "id-a"), &m));
    }
    m = s_msg(LS_MSG_TOKENIZED_REQ, 5);
    s_ids(&m.u.tokenized_req.input_ids, 20, 5);
    m.u.tokenized_req.adapter_id = ls_msg_strdup(i == 1 ? "id-a" : NULL);
    m.u.tokenized_req.sampling.max_new_tokens = 3;
    s_ids(&m.u.tokenized_req.stop_token_ids, 1, 1);
    s_from(sd, "tokenizer", &m);
    m = s_msg(LS_MSG_STEP_RESULT, 0);
    m.u.step_result.step = 1;
    m.u.step_result.items.v = calloc(1, sizeof(ls_msg_step_output_t));
    m.u.step_result.items.v[0].rid = 5;
    m.u.step_result.items.v[0].token_id = 9;
    m.u.step_result.items.n = 1;
    s_answer(sd, "worker-0", "worker-0", &m);
    if (i == 1) {
        s_from(sd, "tokenizer", (m = s_msg(LS_MSG_ABORT, 5), &m));
        s_from(sd, "registry", (m = s_msg(LS_MSG_LIST_ADAPTERS, 6), &m));
        m = s_named(LS_MSG_UNLOAD_ADAPTER, 7, "a");
        m.u.unload_adapter.adapter_id = ls_msg_strdup("id-a");
        s_from(sd, "registry", &m);
        s_answer(sd, "worker-0", "worker-0", (m = s_unloaded("a"), &m));
    }
}

// PrefetchAdapter: adapter id into slot on n pages from first.
static ls_msg_t s_prefetch(const char *id, int32_t slot, uint32_t first, uint32_t n) {
    ls_msg_t m = s_msg(LS_MSG_PREFETCH_ADAPTER, 0);
    m.u.prefetch_adapter.adapter_id = ls_msg_strdup(id);
    m.u.prefetch_adapter.slot = slot;
    m.u.prefetch_adapter.pages.v = malloc(n * sizeof(uint32_t));
    for (uint32_t k = 0; k < n; k++)
        m.u.prefetch_adapter.pages.v[k] = first + k;
    m.u.prefetch_adapter.pages.n = n;
    return m;
}

static void s_seeds_worker(s_seed_t *sd, int i) {
    if (i == 2) {
        //  A request id 0 in a plan and in its releases: once lost in the history, leaking.
        ls_msg_t m = s_step_plan(1, 0, NULL, -1, 3, 0);
        m.u.step_plan.released.v = calloc(2, sizeof(uint64_t));
        m.u.step_plan.released.n = 2;
        s_from(sd, "scheduler", &m);
        return;
    }
    const char *id = i == 1 ? "id-r" : NULL;
    int32_t slot = i == 1 ? 1 : -1;
    ls_msg_t m = s_load("r", "id-r", "reverse");
    m.u.load_adapter.slot = -1;  // the CPU tier: slots are PrefetchAdapter's
    s_from(sd, "scheduler", &m);
    if (i == 1)  // into slot 1 on the top 24 of the 64 pages (it takes 10)
        s_from(sd, "scheduler", (m = s_prefetch("id-r", 1, 40, 24), &m));
    s_from(sd, "scheduler", (m = s_step_plan(1, 9, id, slot, 5, 0), &m));
    s_from(sd, "scheduler", (m = s_step_plan(2, 9, id, slot, 1, 5), &m));
    m = s_msg(LS_MSG_STEP_PLAN, 0);
    m.u.step_plan.step = 3;
    m.u.step_plan.released.v = calloc(1, sizeof(uint64_t));
    m.u.step_plan.released.v[0] = 9;
    m.u.step_plan.released.n = 1;
    s_from(sd, "scheduler", &m);
    if (i == 1) {
        s_from(sd, "scheduler", (m = s_prefetch("id-r", 2, 20, 20), &m));
        m = s_named(LS_MSG_UNLOAD_ADAPTER, 4, "r");
        m.u.unload_adapter.adapter_id = ls_msg_strdup("id-r");
        s_from(sd, "scheduler", &m);
    }
}

static void s_seeds_gateway(s_seed_t *sd, int i) {
    ls_msg_t m;
    if (i == 0) {
        s_http_seed(sd, "POST", "/v1/completions", "{\"model\":\"demo\",\"prompt\":\"hi\",\"max_tokens\":3}");
        s_reply(sd, "tokenizer", (m = s_text_out("hello", LS_FINISH_REASON_LENGTH, true), &m));
    } else if (i == 1) {
        s_http_seed(
            sd, "POST", "/v1/chat/completions",
            "{\"model\":\"demo\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
        s_reply(sd, "tokenizer", (m = s_text_out("a", LS_FINISH_REASON_NONE, false), &m));
        m = s_text_out("b", LS_FINISH_REASON_STOP, true);
        m.u.text_out.matched_stop = ls_msg_textdup("b", 1);
        s_reply(sd, "tokenizer", &m);
    } else if (i == 2) {
        s_http_seed(sd, "POST", "/v1/load_lora_adapter", "{\"lora_name\":\"x\",\"lora_path\":\"y\"}");
        s_reply(sd, "tokenizer", (m = s_loaded(true, "x", "id-x"), &m));
        s_http_seed(sd, "GET", "/v1/models", NULL);
        s_reply(sd, "tokenizer", (m = s_msg(LS_MSG_ADAPTER_LIST, 0), &m));
        s_http_seed(sd, "GET", "/metrics", NULL);
        s_http_seed(sd, "POST", "/generate", "{\"text\":[\"a\",\"b\"],\"sampling_params\":{\"n\":2}}");
        //  A load from tensors: a config object and a tiny safetensors in base64.
        s_http_seed(sd, "POST", "/load_lora_adapter_from_tensors",
                    "{\"lora_name\":\"t\",\"config_dict\":{\"r\":8},\"lora_tensors\":\"AgAAAAAAAAB7fQ==\"}");
        s_reply(sd, "tokenizer", (m = s_loaded(false, "t", NULL), &m));
    }
}

static void s_seeds_dispatcher(s_seed_t *sd, int i) {
    ls_msg_t m;
    if (i == 0) {
        //  two requests of one adapter (one group), one ends, an abort of the other
        for (uint64_t rid = 5; rid <= 6; rid++) {
            m = s_msg(LS_MSG_TOKENIZED_REQ, rid);
            s_ids(&m.u.tokenized_req.input_ids, 40, 5);
            m.u.tokenized_req.adapter_id = ls_msg_strdup("id-a");
            m.u.tokenized_req.sampling.max_new_tokens = 3;
            s_from(sd, "tokenizer", &m);
        }
        s_reply(sd, "scheduler-0", (m = s_msg(LS_MSG_REQUEST_ENDED, 0), &m));
        s_from(sd, "detokenizer", (m = s_msg(LS_MSG_ABORT, 6), &m));
    } else if (i == 1) {
        //  a load fanned out: one group agrees, the other refuses; then a listing
        s_from(sd, "registry", (m = s_load("a", "id-a", "reverse"), &m));
        s_reply(sd, "scheduler-0", (m = s_loaded(true, "a", "id-a"), &m));
        s_reply(sd, "scheduler-1", (m = s_loaded(false, "a", "id-a"), &m));
        s_from(sd, "registry", (m = s_msg(LS_MSG_LIST_ADAPTERS, 7), &m));
        s_reply(sd, "scheduler-0", (m = s_msg(LS_MSG_ADAPTER_LIST, 0), &m));
        s_reply(sd, "scheduler-1", (m = s_msg(LS_MSG_ADAPTER_LIST, 0), &m));
    } else if (i == 2) {
        //  a request refused by its group, relayed; an unload fanned out
        m = s_msg(LS_MSG_TOKENIZED_REQ, 8);
        s_ids(&m.u.tokenized_req.input_ids, 3, 1);
        s_from(sd, "tokenizer", &m);
        m = s_msg(LS_MSG_ERROR, 0);
        m.u.error.code = LS_ERROR_CODE_OVERLOADED;
        m.u.error.message = ls_msg_strdup("fuzz: busy");
        m.u.error.ref_type = LS_MSG_TOKENIZED_REQ;
        s_reply(sd, "scheduler-0", &m);
        m = s_named(LS_MSG_UNLOAD_ADAPTER, 9, "a");
        m.u.unload_adapter.adapter_id = ls_msg_strdup("id-a");
        s_from(sd, "registry", &m);
        s_reply(sd, "scheduler-0", (m = s_unloaded("a"), &m));
        s_reply(sd, "scheduler-1", (m = s_unloaded("a"), &m));
    }
}

static void s_seed_write(const char *dir, const char *name, const void *data, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        s_die("cannot write a seed");
}

//  LS_FUZZ_WRITE_SEEDS=DIR: write this actor's seeds to DIR and exit.
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dir = getenv("LS_FUZZ_WRITE_SEEDS");
    if (!dir)
        return 0;
    const char *name = LS_FUZZ_ACTOR;
    void (*make)(s_seed_t *, int) = !strcmp(name, "detokenizer") ? s_seeds_detokenizer
                                    : !strcmp(name, "tokenizer") ? s_seeds_tokenizer
                                    : !strcmp(name, "registry")  ? s_seeds_registry
                                    : !strcmp(name, "scheduler") ? s_seeds_scheduler
                                    : !strcmp(name, "worker")    ? s_seeds_worker
                                    : S_DISPATCHER               ? s_seeds_dispatcher
                                                                 : s_seeds_gateway;
    static s_seed_t sd;
    for (int i = 0; i < 4; i++) {
        sd.len = 0;
        make(&sd, i);
        char seed[16];
        snprintf(seed, sizeof seed, "seed-%d", i);
        if (sd.len)
            s_seed_write(dir, seed, sd.buf, sd.len);
    }
    //  Garbage too: frames that are no message, then a message of the fuzzer's bits alone.
    static const uint8_t junk[] = {3, 6, 0x93, 0x01, 0xff, 0xfe, 0x00, 0x7f, 0, 12, 7,
                                   0, 0, 1,    5,    3,    2,    1,    0,    0, 9,  9};
    s_seed_write(dir, "junk", junk, sizeof junk);
    exit(0);
}
