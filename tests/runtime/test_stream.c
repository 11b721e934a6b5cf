// The raw byte streams, runtime/ls_stream.c: an actor in a thread listens on 127.0.0.1 (port 0)
// and speaks a line protocol of the test's own; the test is its TCP clients. The runtime frames
// nothing (bytes in, bytes out), so what is checked is that bytes pass whole and in order
// however the kernel cuts them, and what ls_actor.h promises about clients and closes.
//   listen         — the bound port is returned; a second listener is refused
//   lines          — lines sent a byte at a time, and one of 1 MiB, reach the actor whole;
//                    4 MiB written in pieces reach the client whole (partial writes)
//   clients        — eight clients at once, interleaved: each has its own id and gets only
//                    its own answers
//   lost           — a client that closes mid-line, and one that resets, are reported once
//                    through on_close with the reason; the half line is never a line; the
//                    actor serves the next client
//   unread_limit   — a write past max_unsent drops the client with a reason naming the limit,
//                    reported on a later turn, never from inside ls_stream_write
//   stall          — a client that reads none of its pending output for stall_ms is dropped
//   close          — ls_stream_close: the client reads the last answer, then an orderly EOF
//                    (no reset) though it is still sending; no callback follows the close
//   pause          — input sent while the stream is paused reaches the actor only after it
//                    resumes
//   shutdown       — clients still connected when the actor stops are closed, and the actor
//                    is not told
//   trace          — listen, opens, reads, writes, the client's close and the actor's are
//                    recorded with the connection's id and the bytes
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "rt_support.h"
#include "test_util.h"

// ---------------------------------------------------------------------------------------------
// the line server: every line is answered "<id>:<length>:<hash>", except the commands
//   big N      N bytes of a pattern, written in 64 KiB pieces, then "\n"
//   flood N    N bytes in one write
//   pause MS   answers "paused", stops reading, resumes after MS
//   bye        answers "bye", then closes
//   stat       "<opens> <closes> <lines> <last close reason>"
//   quit       stops the actor

#define MAX_CONNS 32

typedef struct {
    char *line;
    size_t n, cap;
    int is_stat;  // asked "stat": the test's look inside, left out of the counts
} conn_t;

typedef struct {
    int opens, closes, lines;
    char why[256];            // the last on_close reason (stat connections left out)
    int closed_in_write;      // on_close ran inside ls_stream_write
    int in_write;
    int data_after_close;     // on_data for a stream the actor had closed
    char events[16][48];      // "pause", "resume", "line <text>": their order
    int nevents;
    ls_stream_t *open[MAX_CONNS];  // for on_destroy: the connections the actor still holds
} server_t;

static uint32_t s_hash(const char *p, size_t n) {
    uint32_t h = 2166136261u;  // FNV-1a
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 16777619u;
    return h;
}

static char s_pattern(size_t i) { return (char)('a' + i % 26); }

static void s_event(server_t *sv, const char *fmt, const char *arg) {
    if (sv->nevents < 16)
        snprintf(sv->events[sv->nevents++], sizeof sv->events[0], fmt, arg);
}

static void s_write(server_t *sv, ls_stream_t *s, const void *data, size_t len) {
    sv->in_write = 1;
    ls_stream_write(s, data, len);
    sv->in_write = 0;
}

static void s_writef(server_t *sv, ls_stream_t *s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void s_writef(server_t *sv, ls_stream_t *s, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s_write(sv, s, buf, (size_t)n);
}

static void s_forget(server_t *sv, ls_stream_t *s) {
    for (int i = 0; i < MAX_CONNS; i++)
        if (sv->open[i] == s)
            sv->open[i] = NULL;
    conn_t *c = ls_stream_data(s);
    if (c)
        free(c->line);
    free(c);
}

static void s_on_open(ls_actor_t *a, ls_stream_t *s, void *arg) {
    server_t *sv = arg;
    sv->opens++;
    ls_stream_set_data(s, calloc(1, sizeof(conn_t)));
    for (int i = 0; i < MAX_CONNS; i++)
        if (!sv->open[i]) {
            sv->open[i] = s;
            break;
        }
}

typedef struct {
    server_t *sv;
    ls_stream_t *stream;
} resume_t;

static void s_resume(ls_actor_t *a, ls_timer_t *t, void *arg) {
    resume_t *r = arg;
    s_event(r->sv, "resume", NULL);
    ls_stream_pause(r->stream, 0);
    ls_actor_timer_stop(a, t);
    free(r);
}

// One whole line (without its '\n'). Returns 1 when the stream is closed and must not be used.
static int s_line(ls_actor_t *a, server_t *sv, ls_stream_t *s, const char *line, size_t n) {
    unsigned long num;
    char text[32];
    snprintf(text, sizeof text, "%.*s", (int)(n < 20 ? n : 20), line);
    if (sscanf(text, "big %lu", &num) == 1) {
        char piece[65536];
        for (size_t off = 0; off < num; off += sizeof piece) {
            size_t k = num - off < sizeof piece ? num - off : sizeof piece;
            for (size_t i = 0; i < k; i++)
                piece[i] = s_pattern(off + i);
            s_write(sv, s, piece, k);
        }
        s_write(sv, s, "\n", 1);
    } else if (sscanf(text, "flood %lu", &num) == 1) {
        char *buf = malloc(num);
        memset(buf, 'f', num);
        s_write(sv, s, buf, num);
        free(buf);
    } else if (sscanf(text, "pause %lu", &num) == 1) {
        s_writef(sv, s, "paused\n");
        ls_stream_pause(s, 1);
        s_event(sv, "pause", NULL);
        resume_t *r = malloc(sizeof *r);
        *r = (resume_t){sv, s};
        ls_actor_timer_start(a, (double)num, 0, s_resume, r);
    } else if (n == 3 && !memcmp(line, "bye", 3)) {
        s_writef(sv, s, "bye\n");
        s_forget(sv, s);
        ls_stream_close(s);
        return 1;
    } else if (n == 4 && !memcmp(line, "stat", 4)) {
        ((conn_t *)ls_stream_data(s))->is_stat = 1;
        s_writef(sv, s, "%d %d %d %s\n", sv->opens, sv->closes, sv->lines, sv->why);
    } else if (n == 4 && !memcmp(line, "quit", 4)) {
        ls_actor_shutdown(a, "quit");
        return 1;
    } else {
        sv->lines++;
        if (n < 16)
            s_event(sv, "line %s", text);
        s_writef(sv, s, "%u:%zu:%08x\n", ls_stream_id(s), n, s_hash(line, n));
    }
    return 0;
}

static void s_on_data(ls_actor_t *a, ls_stream_t *s, const char *data, size_t len, void *arg) {
    server_t *sv = arg;
    conn_t *c = ls_stream_data(s);
    if (!c) {
        sv->data_after_close++;
        return;
    }
    for (size_t i = 0; i < len; i++) {
        if (data[i] != '\n') {
            if (c->n == c->cap) {
                c->cap = c->cap ? 2 * c->cap : 256;
                c->line = realloc(c->line, c->cap);
            }
            c->line[c->n++] = data[i];
            continue;
        }
        size_t n = c->n;
        c->n = 0;
        if (s_line(a, sv, s, c->line ? c->line : "", n))
            return;
    }
}

static void s_on_close(ls_actor_t *a, ls_stream_t *s, const char *why, void *arg) {
    server_t *sv = arg;
    conn_t *c = ls_stream_data(s);
    if (c && c->is_stat) {
        s_forget(sv, s);
        return;
    }
    sv->closes++;
    sv->closed_in_write |= sv->in_write;
    snprintf(sv->why, sizeof sv->why, "%s", why);
    s_forget(sv, s);
}

static void s_on_destroy(ls_actor_t *a, void *state) {
    server_t *sv = state;
    for (int i = 0; i < MAX_CONNS; i++)
        if (sv->open[i]) {
            conn_t *c = ls_stream_data(sv->open[i]);
            free(c->line);
            free(c);
            sv->open[i] = NULL;
        }
}

typedef struct {
    rt_runner_t runner;
    server_t sv;
    int port;
} server_run_t;

// Starts a line server named `name` with these limits; returns its port.
static int s_server_start(server_run_t *run, const char *name, size_t max_unsent, int stall_ms, const char *trace_dir) {
    static const ls_dispatch_t table[] = {{0, NULL}};
    static ls_actor_def_t def = {.dispatch = table, .on_destroy = s_on_destroy};
    def.name = name;
    memset(&run->sv, 0, sizeof run->sv);
    def.state = &run->sv;
    ls_actor_opts_t opts = {.name = name, .trace_dir = trace_dir};
    ls_actor_t *a = ls_actor_new(&def, &opts);
    assert_non_null(a);
    ls_stream_def_t sdef = {.on_open = s_on_open, .on_data = s_on_data, .on_close = s_on_close,
                            .max_unsent = max_unsent, .stall_ms = stall_ms};
    run->port = ls_actor_stream_listen(a, "127.0.0.1", 0, &sdef, &run->sv);
    assert_true(run->port > 0);
    rt_start(&run->runner, a);
    return run->port;
}

static void s_server_quit(server_run_t *run) {
    int fd = rt_tcp_connect(run->port);
    rt_tcp_send(fd, "quit\n", 5);
    rt_join(&run->runner);
    close(fd);
}

// The server's "stat" line, asked on a connection of its own (an open, but never a close).
static void s_stat(int port, int *opens, int *closes, int *lines, char *why, size_t cap) {
    int fd = rt_tcp_connect(port);
    rt_tcp_send(fd, "stat\n", 5);
    char line[512];
    rt_tcp_recv_line(fd, line, sizeof line);
    close(fd);
    int off = 0;
    assert_int_equal(sscanf(line, "%d %d %d %n", opens, closes, lines, &off), 3);
    snprintf(why, cap, "%s", line + off);
}

// Asks for stat until the server has counted `closes` closes; why becomes the last one's
// reason. Generous (20 s): a loss is seen on a later turn of the loop.
static void s_wait_closes(int port, int closes, char *why, size_t cap) {
    int opens, n = -1, lines;
    for (int tries = 0; tries < 2000; tries++, usleep(10000)) {
        s_stat(port, &opens, &n, &lines, why, cap);
        if (n >= closes) {
            assert_int_equal(n, closes);  // reported once
            return;
        }
    }
    fail_msg("the server counted %d closes, not %d", n, closes);
}

static void s_expect_answer(int fd, const char *line, size_t n, uint32_t *id) {
    char got[128], want[128];
    rt_tcp_recv_line(fd, got, sizeof got);
    unsigned gid;
    assert_int_equal(sscanf(got, "%u:", &gid), 1);
    snprintf(want, sizeof want, "%u:%zu:%08x", gid, n, s_hash(line, n));
    assert_string_equal(got, want);
    if (id)
        *id = gid;
}

// ---------------------------------------------------------------------------------------------
// listen

static void s_never(ls_actor_t *a, ls_stream_t *s, void *arg) { fail_msg("no client connects here"); }

static void test_listen(void **unused) {
    static const ls_dispatch_t table[] = {{0, NULL}};
    ls_actor_def_t def = {.name = "listener", .dispatch = table};
    ls_actor_opts_t opts = {.name = "listener"};
    ls_actor_t *a = ls_actor_new(&def, &opts);
    assert_non_null(a);
    ls_stream_def_t sdef = {.on_open = s_never, .max_unsent = 1024, .stall_ms = 1000};
    int port = ls_actor_stream_listen(a, "127.0.0.1", 0, &sdef, NULL);
    assert_true(port > 0 && port < 65536);
    // One listener per actor.
    assert_int_equal(ls_actor_stream_listen(a, "127.0.0.1", 0, &sdef, NULL), -1);
    ls_actor_destroy(&a);
    // A port another socket holds is refused with -1, not a crash.
    a = ls_actor_new(&def, &opts);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    assert_int_equal(ls_actor_stream_listen(a, "127.0.0.1", ntohs(sa.sin_port), &sdef, NULL), -1);
    close(fd);
    ls_actor_destroy(&a);
}

// ---------------------------------------------------------------------------------------------
// lines: bytes whole and in order, however they are cut

static void test_lines(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "lines", 64 << 20, 10000, NULL);
    int fd = rt_tcp_connect(port);

    // A byte a segment (TCP_NODELAY): the actor sees the line only once it is whole.
    const char *slow = "one byte at a time";
    for (size_t i = 0; i < strlen(slow); i++)
        rt_tcp_send(fd, slow + i, 1);
    rt_tcp_send(fd, "\n", 1);
    uint32_t id;
    s_expect_answer(fd, slow, strlen(slow), &id);
    assert_int_equal(id, 1);  // the first connection

    // Several lines in one segment.
    rt_tcp_send(fd, "a\nbb\nccc\n", 9);
    s_expect_answer(fd, "a", 1, NULL);
    s_expect_answer(fd, "bb", 2, NULL);
    s_expect_answer(fd, "ccc", 3, NULL);

    // 1 MiB in one line: the runtime reads it in pieces.
    size_t big = 1 << 20;
    char *line = malloc(big + 1);
    for (size_t i = 0; i < big; i++)
        line[i] = s_pattern(i * 7);
    line[big] = '\n';
    rt_tcp_send(fd, line, big + 1);
    s_expect_answer(fd, line, big, NULL);
    free(line);

    // 4 MiB out, written in 64 KiB pieces faster than the client reads: partial writes and
    // the queue's compaction, then every byte in order.
    size_t out = 4 << 20;
    rt_tcp_send(fd, "big 4194304\n", 12);
    char *got = malloc(out + 1);
    rt_tcp_recv(fd, got, out + 1);
    for (size_t i = 0; i < out; i++)
        if (got[i] != s_pattern(i))
            fail_msg("byte %zu of the big answer is %c, not %c", i, got[i], s_pattern(i));
    assert_int_equal(got[out], '\n');
    free(got);
    close(fd);

    s_server_quit(&run);
    assert_int_equal(run.sv.lines, 5);
    assert_int_equal(run.sv.closed_in_write, 0);
}

// ---------------------------------------------------------------------------------------------
// clients: several at once, each answered on its own connection

#define CLIENTS 8

static void test_clients(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "clients", 1 << 20, 10000, NULL);
    int fds[CLIENTS];
    uint32_t ids[CLIENTS];
    for (int c = 0; c < CLIENTS; c++)
        fds[c] = rt_tcp_connect(port);
    // Round-robin: every client has a line in flight before any answer is read.
    for (int round = 0; round < 3; round++) {
        char line[64];
        for (int c = 0; c < CLIENTS; c++) {
            int n = snprintf(line, sizeof line, "client %d round %d\n", c, round);
            rt_tcp_send(fds[c], line, (size_t)n);
        }
        for (int c = 0; c < CLIENTS; c++) {
            int n = snprintf(line, sizeof line, "client %d round %d", c, round);
            uint32_t id;
            s_expect_answer(fds[c], line, (size_t)n, &id);
            if (round == 0)
                ids[c] = id;
            assert_int_equal(id, ids[c]);  // the same connection answers
        }
    }
    for (int c = 0; c < CLIENTS; c++) {
        assert_true(ids[c] >= 1 && ids[c] <= CLIENTS);
        for (int d = 0; d < c; d++)
            assert_true(ids[c] != ids[d]);
        close(fds[c]);
    }
    char why[256];
    s_wait_closes(port, CLIENTS, why, sizeof why);
    s_server_quit(&run);
    assert_int_equal(run.sv.lines, 3 * CLIENTS);
    assert_string_equal(run.sv.why, "the client closed the connection");
}

// ---------------------------------------------------------------------------------------------
// lost: a client gone mid-line, by close and by reset

// A client that sends a line and half of another, has the line answered, and goes: by an
// orderly close, or by a reset (SO_LINGER 0).
static void s_leave_mid_line(int port, int reset) {
    int fd = rt_tcp_connect(port);
    rt_tcp_send(fd, "whole\nhalf a li", 15);
    s_expect_answer(fd, "whole", 5, NULL);
    if (reset) {
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(fd);
}

static void test_lost(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "lost", 1 << 20, 10000, NULL);
    char why[256];
    s_leave_mid_line(port, 0);
    s_wait_closes(port, 1, why, sizeof why);
    assert_string_equal(why, "the client closed the connection");
    s_leave_mid_line(port, 1);  // the reason is then the socket's error
    s_wait_closes(port, 2, why, sizeof why);
    assert_contains(why, "reset");

    // Still serving.
    int fd = rt_tcp_connect(port);
    rt_tcp_send(fd, "after\n", 6);
    s_expect_answer(fd, "after", 5, NULL);
    close(fd);
    s_server_quit(&run);
    assert_int_equal(run.sv.lines, 3);  // the halves never became lines
    assert_int_equal(run.sv.data_after_close, 0);
}

// ---------------------------------------------------------------------------------------------
// unread_limit: max_unsent

static void test_unread_limit(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "limited", 65536, 10000, NULL);
    int fd = rt_tcp_connect(port);
    rt_tcp_send(fd, "flood 65537\n", 12);
    // The client is dropped: whatever the kernel had taken may arrive, then the end.
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
        ;
    assert_true(n == 0 || errno == ECONNRESET);
    close(fd);
    char why[256];
    s_wait_closes(port, 1, why, sizeof why);
    assert_string_equal(why, "the client leaves more than 65536 bytes unread");
    s_server_quit(&run);
    assert_int_equal(run.sv.closed_in_write, 0);  // reported on a later turn
}

// ---------------------------------------------------------------------------------------------
// stall: stall_ms

static void test_stall(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "stalled", 256 << 20, 300, NULL);
    int fd = rt_tcp_connect_small(port);
    // 64 MiB, more than the kernel's buffers on both sides hold, to a client that reads none.
    rt_tcp_send(fd, "flood 67108864\n", 15);
    char why[256];
    s_wait_closes(port, 1, why, sizeof why);
    assert_string_equal(why, "the client stopped reading its answer");
    close(fd);
    s_server_quit(&run);
    assert_int_equal(run.sv.closed_in_write, 0);
}

// ---------------------------------------------------------------------------------------------
// close: the last answer, then an orderly end

static void test_close(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "closer", 1 << 20, 10000, NULL);
    int fd = rt_tcp_connect(port);
    // "bye", and more input behind it that the actor never reads: closed with unread input a
    // socket resets, and the client would lose the answer.
    size_t junk = 256 << 10;
    char *buf = malloc(junk + 4);
    memcpy(buf, "bye\n", 4);
    memset(buf + 4, 'j', junk);
    rt_tcp_send(fd, buf, junk + 4);
    char line[64];
    rt_tcp_recv_line(fd, line, sizeof line);
    assert_string_equal(line, "bye");
    rt_tcp_send(fd, buf + 4, junk);  // still talking after the close
    free(buf);
    assert_int_equal(rt_tcp_recv_end(fd), 0);  // EOF, not a reset or a timeout
    close(fd);
    s_server_quit(&run);
    assert_int_equal(run.sv.closes, 0);  // no on_close after the actor's own close
    assert_int_equal(run.sv.data_after_close, 0);
    assert_int_equal(run.sv.lines, 0);
}

// ---------------------------------------------------------------------------------------------
// pause: input waits until the actor resumes

static void test_pause(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "pauser", 1 << 20, 10000, NULL);
    int fd = rt_tcp_connect(port);
    rt_tcp_send(fd, "pause 300\n", 10);
    char line[64];
    rt_tcp_recv_line(fd, line, sizeof line);
    assert_string_equal(line, "paused");
    rt_tcp_send(fd, "later\n", 6);  // sent while the stream is paused
    s_expect_answer(fd, "later", 5, NULL);
    close(fd);
    s_server_quit(&run);
    // The line sent right after "paused" is read only once the timer resumed the stream.
    assert_int_equal(run.sv.nevents, 3);
    assert_string_equal(run.sv.events[0], "pause");
    assert_string_equal(run.sv.events[1], "resume");
    assert_string_equal(run.sv.events[2], "line later");
}

// ---------------------------------------------------------------------------------------------
// shutdown: open connections end with the actor

static void test_shutdown(void **unused) {
    server_run_t run;
    int port = s_server_start(&run, "stopper", 1 << 20, 10000, NULL);
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = rt_tcp_connect(port);
        rt_tcp_send(fds[i], "hello\n", 6);
        s_expect_answer(fds[i], "hello", 5, NULL);
    }
    s_server_quit(&run);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(rt_tcp_recv_end(fds[i]), 0);
        close(fds[i]);
    }
    assert_int_equal(run.sv.closes, 0);  // not told: the actor was stopping
}

// ---------------------------------------------------------------------------------------------
// trace

static void test_trace(void **unused) {
    char tdir[128];
    rt_trace_dir(tdir, sizeof tdir);
    server_run_t run;
    int port = s_server_start(&run, "recorded", 1 << 20, 10000, tdir);
    int fd = rt_tcp_connect(port);
    rt_tcp_send(fd, "hi\n", 3);
    s_expect_answer(fd, "hi", 2, NULL);
    rt_tcp_send(fd, "bye\n", 4);
    char line[64];
    rt_tcp_recv_line(fd, line, sizeof line);
    assert_int_equal(rt_tcp_recv_end(fd), 0);
    close(fd);
    fd = rt_tcp_connect(port);  // connection 2 closes on the client's side
    close(fd);
    char why[256];
    s_wait_closes(port, 1, why, sizeof why);
    s_server_quit(&run);

    char err[512], listen_text[64], answer[64];
    snprintf(listen_text, sizeof listen_text, "127.0.0.1:0");
    snprintf(answer, sizeof answer, "1:2:%08x\n", s_hash("hi", 2));
    ls_trace_reader_t *rd = rt_trace_open("recorded");
    static ls_trace_record_t rec;
    char in1[64] = "", out1[64] = "";
    int listens = 0, opens = 0, close_out1 = 0, close_in2 = 0;
    while (ls_trace_read(rd, &rec, err, sizeof err) == 1) {
        const char *d = rec.nframes ? (const char *)rec.frames[0].data : "";
        size_t n = rec.nframes ? rec.frames[0].len : 0;
        if (rec.kind == LS_TRACE_STREAM_LISTEN) {
            listens++;
            assert_int_equal(rec.aux, port);  // replay reports the same port
            assert_int_equal(n, strlen(listen_text));
            assert_memory_equal(d, listen_text, n);
        } else if (rec.kind == LS_TRACE_STREAM_OPEN) {
            assert_int_equal(rec.aux, ++opens);
            assert_true(n > 10 && !memcmp(d, "127.0.0.1:", 10));  // the client's address
        } else if (rec.kind == LS_TRACE_STREAM_DATA && rec.aux == 1) {
            char *to = rec.dir == LS_TRACE_IN ? in1 : out1;
            assert_true(strlen(to) + n < sizeof in1);
            strncat(to, d, n);
        } else if (rec.kind == LS_TRACE_STREAM_CLOSE && rec.aux == 1) {
            assert_int_equal(rec.dir, LS_TRACE_OUT);  // the actor closed it
            close_out1++;
        } else if (rec.kind == LS_TRACE_STREAM_CLOSE && rec.aux == 2) {
            assert_int_equal(rec.dir, LS_TRACE_IN);  // the client did
            assert_int_equal(n, strlen("the client closed the connection"));
            close_in2++;
        }
    }
    ls_trace_reader_destroy(&rd);
    assert_int_equal(listens, 1);
    assert_true(opens >= 3);  // two clients, then the stat asks and the quit
    assert_string_equal(in1, "hi\nbye\n");
    char want_out[128];
    snprintf(want_out, sizeof want_out, "%sbye\n", answer);
    assert_string_equal(out1, want_out);
    assert_int_equal(close_out1, 1);
    assert_int_equal(close_in2, 1);
}

int main(void) {
    if (rt_init("runtime-stream", 100) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_listen),    cmocka_unit_test(test_lines), cmocka_unit_test(test_clients),
        cmocka_unit_test(test_lost),      cmocka_unit_test(test_unread_limit), cmocka_unit_test(test_stall),
        cmocka_unit_test(test_close),     cmocka_unit_test(test_pause), cmocka_unit_test(test_shutdown),
        cmocka_unit_test(test_trace),
    };
    return rt_fini(cmocka_run_group_tests(tests, NULL, NULL));
}
