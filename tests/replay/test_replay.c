// Trace replay end to end: a real session of the registry, the scheduler and the worker on the
// demo model (CPU backend), recorded with --record-trace and driven by this test as their
// client; then every actor replayed from its trace (docs/debugging.md).
//   replay_all        — concurrent requests over the base model and four adapters (one loaded
//                       by a client, one on demand), sampling with a seed, an abort, a request
//                       refused for bad input, an unknown adapter, a listing (a timer fires),
//                       an unload, metrics: every actor replays with zero divergences
//   replay_graph      — the whole graph started by launch/loraserve --record-trace --port 0,
//                       driven over HTTP: concurrent completions over the base model and
//                       adapters (one streamed, one sampled with n=2), a stream the client
//                       leaves (an abort), a body that is not JSON and an unknown model
//                       (refused), an unload and a load through the admin endpoints; after
//                       SIGINT every actor — gateway, tokenizer, detokenizer, registry,
//                       scheduler, worker-0 — replays with zero divergences
//   altered_input     — one inbound TokenizedReq changed in a copy of the scheduler's trace
//                       (CRC recomputed): the replay diverges exactly at the first StepPlan
//                       that carries the request, and exits 3
//   until_pauses      — --until N stops the replayed actor (SIGSTOP, for a debugger); SIGCONT
//                       lets it finish the replay
//   truncated_trace   — a torn last record: loraserve-trace reads up to the tear with a
//                       warning (exit 0), and the replay runs up to it
//   trace_filters     — loraserve-trace --rid / --type / --json select what they say
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_msg.h"
#include "test_util.h"
#include <czmq.h>

#include "ls_msg.h"
#include "ls_trace.h"

#define ADAPTERS LS_DEMO_DIR "/adapters"

static char s_dir[64], s_trace[96];
static pid_t s_pids[3];  // worker-0, scheduler, registry
static zsock_t *s_sched, *s_reg;
static uint64_t s_rid = 100;

// ---------------------------------------------------------------------------------------------
// helpers

static pid_t s_spawn(const char *log, char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        tu_child_dies_with_parent();
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

// Runs argv to completion, its output into `log`; returns the exit status (-1: killed).
static int s_run(const char *log, char *const argv[]) {
    int status;
    pid_t pid = s_spawn(log, argv);
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char *s_slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 20];
    buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
    fclose(f);
    return buf;
}

static void s_send(zsock_t *sock, const ls_msg_t *m) { assert_int_equal(tm_send(sock, m), 0); }

static int s_recv(zsock_t *sock, ls_msg_t *m) {
    if (tm_recv(sock, m) < 0)
        fail_msg("no answer (logs in %s)", s_dir);
    return m->type;
}

static zsock_t *s_client(const char *name) {
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/%s.sock", s_dir, name);
    zsock_t *s = zsock_new(ZMQ_DEALER);
    zsock_set_identity(s, "client");
    assert_int_equal(zsock_connect(s, "%s", ep), 0);
    zsock_set_rcvtimeo(s, 20000);
    return s;
}

static uint64_t s_sched_metric(const char *name) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GET_METRICS);
    m.rid = ++s_rid;
    s_send(s_sched, &m);
    ls_msg_clear(&m);
    while (s_recv(s_sched, &m) != LS_MSG_METRICS)
        ls_msg_clear(&m);
    uint64_t v = 0;
    for (size_t i = 0; i < m.u.metrics.names.n; i++)
        if (!strcmp(m.u.metrics.names.v[i], name))
            v = m.u.metrics.values.v[i];
    ls_msg_clear(&m);
    return v;
}

// AcquireAdapter: 1 and the id when held, 0 and the code when refused.
static int s_acquire(const char *name, char *id, size_t cap, uint32_t *code) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ACQUIRE_ADAPTER);
    m.rid = ++s_rid;
    m.u.acquire_adapter.name = ls_msg_strdup(name);
    s_send(s_reg, &m);
    ls_msg_clear(&m);
    assert_int_equal(s_recv(s_reg, &m), LS_MSG_ADAPTER_ACQUIRED);
    int ok = m.u.adapter_acquired.ok;
    if (ok)
        snprintf(id, cap, "%s", m.u.adapter_acquired.adapter_id);
    if (code)
        *code = m.u.adapter_acquired.code;
    ls_msg_clear(&m);
    return ok;
}

static void s_release(const char *name, const char *id) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_RELEASE_ADAPTER);
    m.rid = ++s_rid;
    m.u.release_adapter.name = ls_msg_strdup(name);
    m.u.release_adapter.adapter_id = ls_msg_strdup(id);
    s_send(s_reg, &m);
    ls_msg_clear(&m);
}

static void s_submit(uint64_t rid, const char *adapter_id, int32_t first, int n, uint32_t max_new, float temp) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = rid;
    ls_msg_tokenized_req_t *t = &m.u.tokenized_req;
    t->input_ids.v = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++)
        t->input_ids.v[i] = first + (i * 7) % 40;
    t->input_ids.n = (size_t)n;
    if (adapter_id) {
        t->adapter_id = ls_msg_strdup(adapter_id);
        t->adapter_name = ls_msg_strdup(adapter_id);
    }
    t->sampling.max_new_tokens = max_new;
    t->sampling.ignore_eos = true;
    t->sampling.temperature = temp;
    t->sampling.seed = 1234;
    t->sampling.has_seed = temp > 0;
    t->sampling.logprobs = temp > 0;
    s_send(s_sched, &m);
    ls_msg_clear(&m);
}

// ---------------------------------------------------------------------------------------------
// the recorded session (group setup): worker-0 + scheduler + registry

static void s_record_session(void) {
    snprintf(s_dir, sizeof s_dir, "/tmp/ls-replay-XXXXXX");
    assert_non_null(mkdtemp(s_dir));
    snprintf(s_trace, sizeof s_trace, "%s/trace", s_dir);
    char sep[128], wep[128], rep[128], record[128], log[3][128];
    snprintf(sep, sizeof sep, "ipc://%s/scheduler.sock", s_dir);
    snprintf(wep, sizeof wep, "ipc://%s/worker-0.sock", s_dir);
    snprintf(rep, sizeof rep, "ipc://%s/registry.sock", s_dir);
    snprintf(record, sizeof record, "--record-trace=%s", s_trace);
    const char *names[3] = {"worker-0", "scheduler", "registry"};
    for (int i = 0; i < 3; i++)
        snprintf(log[i], sizeof log[i], "%s/%s.log", s_dir, names[i]);
    char b[3][160], p[3][160], state[128];
    snprintf(b[0], sizeof b[0], "--bind=%s", wep);
    snprintf(b[1], sizeof b[1], "--bind=%s", sep);
    snprintf(b[2], sizeof b[2], "--bind=%s", rep);
    snprintf(p[0], sizeof p[0], "--peer=scheduler=%s", sep);
    snprintf(p[1], sizeof p[1], "--peer=worker-0=%s", wep);
    snprintf(p[2], sizeof p[2], "--peer=scheduler=%s", sep);
    snprintf(state, sizeof state, "--state-dir=%s/state", s_dir);
    char *wargv[] = {LS_BIN_DIR "/loraserve-worker", "--name=worker-0", b[0], p[0], record,
                     "--model-path=" LS_DEMO_DIR, "--max-lora-rank=16", "--threads=1", "--max-loras-per-batch=3", NULL};
    char *sargv[] = {LS_BIN_DIR "/loraserve-scheduler", "--name=scheduler", b[1], p[1], record, "--output=route",
                     "--max-num-batched-tokens=64", "--chunked-prefill-size=24", NULL};
    char *rargv[] = {LS_BIN_DIR "/loraserve-registry", "--name=registry", b[2], p[2], record, state,
                     "--model-path=" LS_DEMO_DIR, "--max-lora-rank=16", "--max-loras-per-batch=3",
                     "--lora-dirs=" ADAPTERS, "--lora-paths=reverse=" ADAPTERS "/reverse",
                     "--lora-paths=upper=" ADAPTERS "/upper", NULL};
    s_pids[0] = s_spawn(log[0], wargv);
    s_pids[1] = s_spawn(log[1], sargv);
    s_sched = s_client("scheduler");
    // The registry's startup loads go through the scheduler, which takes none before the
    // worker's WorkerInfo.
    for (int i = 0; i < 200 && s_sched_metric("kv_blocks_total") == 0; i++)
        usleep(50000);
    assert_true(s_sched_metric("kv_blocks_total") > 0);
    s_pids[2] = s_spawn(log[2], rargv);
    s_reg = s_client("registry");

    char rev[64], up[64], sort[64], dig[64];
    uint32_t code;
    int held = 0;
    for (int i = 0; i < 100 && !(held = s_acquire("reverse", rev, sizeof rev, &code)); i++)
        usleep(50000);
    assert_true(held);
    assert_true(s_acquire("upper", up, sizeof up, NULL));
    // A client load, then an on-demand one (digits lies under --lora-dirs), then a refusal.
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = ++s_rid;
    m.u.load_adapter.name = ls_msg_strdup("sort");
    m.u.load_adapter.path = ls_msg_strdup(ADAPTERS "/sort");
    s_send(s_reg, &m);
    ls_msg_clear(&m);
    assert_int_equal(s_recv(s_reg, &m), LS_MSG_ADAPTER_LOADED);
    assert_true(m.u.adapter_loaded.ok);
    ls_msg_clear(&m);
    assert_true(s_acquire("sort", sort, sizeof sort, NULL));
    assert_true(s_acquire("digits", dig, sizeof dig, NULL));
    assert_false(s_acquire("nosuch", dig + 32, 1, &code));
    assert_int_equal(code, LS_ERROR_CODE_NOT_FOUND);

    // Concurrent requests over the base model and four adapters (3 slots: the LoRA constraint
    // holds some back), one sampled with a seed; a long one to abort; one whose prompt does
    // not fit the model's context (256), refused.
    const char *ids[] = {NULL, rev, up, sort, dig, NULL, rev};
    for (int i = 0; i < 7; i++)
        s_submit(1 + (uint64_t)i, ids[i], 4 + i, 10 + 3 * i, 6, i == 5 ? 0.8f : 0.0f);
    s_submit(8, up, 5, 30, 120, 0);
    s_submit(9, NULL, 3, 300, 4, 0);
    int finished = 0, aborted = 0, refused = 0;
    while (finished + refused < 9) {
        assert_int_equal(s_recv(s_sched, &m) == LS_MSG_TOKEN_OUT || m.type == LS_MSG_ERROR, 1);
        if (m.type == LS_MSG_ERROR)
            refused += m.rid == 9 && m.u.error.code == LS_ERROR_CODE_TOO_LARGE;
        else if (m.u.token_out.finish != LS_FINISH_REASON_NONE)
            finished++, aborted += m.u.token_out.finish == LS_FINISH_REASON_ABORT;
        else if (m.rid == 8 && m.u.token_out.first) {
            ls_msg_t ab;
            ls_msg_init(&ab, LS_MSG_ABORT);
            ab.rid = 8;
            ab.u.abort.reason = ls_msg_strdup("the client went away");
            ab.u.abort.finish = LS_FINISH_REASON_ABORT;
            s_send(s_sched, &ab);
            ls_msg_clear(&ab);
        }
        ls_msg_clear(&m);
    }
    assert_int_equal(aborted, 1);
    assert_int_equal(refused, 1);
    s_release("reverse", rev);
    s_release("upper", up);
    s_release("sort", sort);
    s_release("digits", dig);
    // An unload, once nothing holds the adapter.
    ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
    m.rid = ++s_rid;
    m.u.unload_adapter.name = ls_msg_strdup("upper");
    s_send(s_reg, &m);
    ls_msg_clear(&m);
    assert_int_equal(s_recv(s_reg, &m), LS_MSG_ADAPTER_UNLOADED);
    assert_true(m.u.adapter_unloaded.ok);
    ls_msg_clear(&m);
    // A listing: the registry asks the scheduler, and answers when it hears back or on a timer.
    ls_msg_init(&m, LS_MSG_LIST_ADAPTERS);
    m.rid = ++s_rid;
    s_send(s_reg, &m);
    ls_msg_clear(&m);
    assert_int_equal(s_recv(s_reg, &m), LS_MSG_ADAPTER_LIST);
    ls_msg_clear(&m);
    assert_int_equal(s_sched_metric("requests_finished"), 7);

    for (int i = 2; i >= 0; i--) {
        int status;
        kill(s_pids[i], SIGTERM);
        waitpid(s_pids[i], &status, 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    zsock_destroy(&s_sched);
    zsock_destroy(&s_reg);
}

static int group_setup(void **unused) {
    s_record_session();
    return 0;
}

static int group_teardown(void **unused) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

// loraserve-replay DIR --actor NAME [extra...]; output in s_dir/replay-NAME.log.
static int s_replay(const char *dir, const char *actor, const char *extra, char *log, size_t cap) {
    snprintf(log, cap, "%s/replay-%s.log", s_dir, actor);
    unlink(log);
    char *argv[] = {LS_BIN_DIR "/loraserve-replay", (char *)dir, "--actor", (char *)actor,
                    extra ? (char *)extra : NULL, NULL};
    return s_run(log, argv);
}

// ---------------------------------------------------------------------------------------------
// tests

static void replay_all(void **unused) {
    const char *actors[] = {"worker-0", "scheduler", "registry"};
    for (int i = 0; i < 3; i++) {
        char log[160];
        int rc = s_replay(s_trace, actors[i], NULL, log, sizeof log);
        if (rc != 0)
            fail_msg("replay of %s: exit %d\n%s", actors[i], rc, s_slurp(log));
        assert_non_null(strstr(s_slurp(log), "no divergence"));
    }
}

// ---------------------------------------------------------------------------------------------
// the whole graph through HTTP: launch/loraserve --record-trace, the gateway as the clients' door

// An HTTP/1.1 request on a fresh connection (Connection: close); returns the socket.
static int s_http_send(int port, const char *method, const char *path, const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     method, path, body ? strlen(body) : 0);
    assert_int_equal(write(fd, head, (size_t)n), n);
    if (body)
        assert_int_equal(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    return fd;
}

// Reads the answer to its end (the server closes); returns the status, the whole answer in out.
static int s_http_recv(int fd, char *out, size_t cap) {
    struct timeval tv = {20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < cap && (n = read(fd, out + got, cap - 1 - got)) > 0)
        got += (size_t)n;
    out[got] = 0;
    close(fd);
    int status = 0;
    sscanf(out, "HTTP/1.%*d %d", &status);
    return status;
}

static int s_http(int port, const char *method, const char *path, const char *body, char *out, size_t cap) {
    return s_http_recv(s_http_send(port, method, path, body), out, cap);
}

#define PROMPT "input: 5 leaf road 1 red\\noutput:"

static void replay_graph(void **unused) {
    char gdir[96], trace[128], log[128], launch_log[128];
    snprintf(gdir, sizeof gdir, "%s/graph", s_dir);
    snprintf(trace, sizeof trace, "--record-trace=%s/trace", gdir);
    snprintf(launch_log, sizeof launch_log, "%s/launch.log", s_dir);
    char run_dir[128];
    snprintf(run_dir, sizeof run_dir, "--run-dir=%s", gdir);
    setenv("LORASERVE_BIN", LS_BIN_DIR, 1);
    char *argv[] = {LS_LAUNCH, run_dir, trace, "--port=0", "--served-model-name=demo", NULL};
    pid_t launcher = s_spawn(launch_log, argv);
    char graph[128];
    snprintf(graph, sizeof graph, "%s/graph.json", gdir);
    snprintf(log, sizeof log, "%s/logs/gateway.log", gdir);
    struct stat st;
    for (int i = 0; i < 600 && stat(graph, &st) != 0; i++)
        usleep(100000);
    if (stat(graph, &st) != 0)
        fail_msg("the graph did not start:\n%s", s_slurp(launch_log));
    int port = tu_listen_port(s_slurp(log));
    assert_true(port > 0);
    static char out[1 << 16];

    // Concurrent completions over the base model and three adapters (one streamed, one chat).
    const char *models[] = {"demo", "reverse", "upper", "sort"};
    int fds[6];
    char body[512];
    for (int i = 0; i < 4; i++) {
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"" PROMPT "\",\"max_tokens\":24,\"temperature\":0}",
                 models[i]);
        fds[i] = s_http_send(port, "POST", "/v1/completions", body);
    }
    fds[4] = s_http_send(port, "POST", "/v1/completions",
                         "{\"model\":\"digits\",\"prompt\":\"" PROMPT "\",\"max_tokens\":24,\"temperature\":0,"
                         "\"stream\":true}");
    fds[5] = s_http_send(port, "POST", "/v1/completions",
                         "{\"model\":\"reverse\",\"prompt\":\"" PROMPT "\",\"max_tokens\":8,\"temperature\":0.8,"
                         "\"seed\":7,\"n\":2}");
    const char *want[] = {" 5 leaf road 1 red", " red 1 road leaf 5", " 5 LEAF ROAD 1 RED", " 1 5 leaf red road"};
    for (int i = 0; i < 6; i++) {
        int status = s_http_recv(fds[i], out, sizeof out);
        if (status != 200 || (i < 4 && !strstr(out, want[i])) || (i == 4 && !strstr(out, "data: [DONE]")))
            fail_msg("request %d: %d\n%s", i, status, out);
    }
    // A long stream the client leaves after its first piece: the gateway aborts it upstream.
    int fd = s_http_send(port, "POST", "/v1/completions",
                         "{\"model\":\"upper\",\"prompt\":\"" PROMPT "\",\"max_tokens\":200,\"temperature\":0,"
                         "\"stream\":true,\"ignore_eos\":true}");
    size_t got = 0;
    while (!strstr(out, "data: ") && got + 1 < sizeof out) {
        ssize_t n = read(fd, out + got, sizeof out - 1 - got);
        assert_true(n > 0);
        got += (size_t)n;
        out[got] = 0;
    }
    close(fd);
    // Refused: a body that is not JSON, an unknown model.
    assert_int_equal(s_http(port, "POST", "/v1/completions", "{bad", out, sizeof out), 400);
    assert_int_equal(s_http(port, "POST", "/v1/completions", "{\"model\":\"nosuch\",\"prompt\":\"x\"}", out, sizeof out),
                     404);
    // An unload and a load through the admin endpoints, then the new name serves.
    assert_int_equal(s_http(port, "POST", "/v1/unload_lora_adapter", "{\"lora_name\":\"sort\"}", out, sizeof out), 200);
    snprintf(body, sizeof body, "{\"lora_name\":\"sort2\",\"lora_path\":\"%s/sort\"}", ADAPTERS);
    assert_int_equal(s_http(port, "POST", "/v1/load_lora_adapter", body, out, sizeof out), 200);
    assert_int_equal(s_http(port, "POST", "/v1/completions",
                            "{\"model\":\"sort2\",\"prompt\":\"" PROMPT "\",\"max_tokens\":24,\"temperature\":0}", out,
                            sizeof out),
                     200);
    assert_non_null(strstr(out, want[3]));
    assert_int_equal(s_http(port, "GET", "/v1/models", NULL, out, sizeof out), 200);
    assert_int_equal(s_http(port, "GET", "/metrics", NULL, out, sizeof out), 200);
    assert_non_null(strstr(out, "loraserve_gateway_http_responses_total{code=\"499\"} 1"));  // the one that left

    int status;
    kill(launcher, SIGINT);
    assert_int_equal(waitpid(launcher, &status, 0), launcher);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    char dir[128];
    snprintf(dir, sizeof dir, "%s/trace", gdir);
    const char *actors[] = {"gateway", "tokenizer", "detokenizer", "registry", "scheduler", "worker-0"};
    for (int i = 0; i < 6; i++) {
        int rc = s_replay(dir, actors[i], NULL, log, sizeof log);
        const char *out = s_slurp(log), *report = strstr(out, "replay: ");
        if (rc != 0)
            fail_msg("replay of %s: exit %d\n%s", actors[i], rc, report ? report : out);
        assert_non_null(strstr(out, "no divergence"));
    }
    // The gateway's trace holds its HTTP traffic: connections, bytes both ways, closes.
    snprintf(log, sizeof log, "%s/trace-gateway.log", s_dir);
    char path[160];
    snprintf(path, sizeof path, "%s/gateway.trace", dir);
    char *print[] = {LS_BIN_DIR "/loraserve-trace", path, NULL};
    assert_int_equal(s_run(log, print), 0);
}

// Copies scheduler.trace into dir, with the first TokenizedReq of rid `rid` changed (its first
// prompt token). Returns the record number of the first StepPlan sent after it that carries
// the request: where the replay must diverge.
static uint64_t s_alter_copy(const char *dir, uint64_t rid) {
    char path[160], err[512];
    snprintf(path, sizeof path, "%s/scheduler.trace", s_trace);
    ls_trace_reader_t *r = ls_trace_reader_new(path, err, sizeof err);
    assert_non_null(r);
    ls_trace_writer_t *w = ls_trace_writer_new(dir, "scheduler", err, sizeof err);
    assert_non_null(w);
    static ls_trace_record_t rec;
    uint64_t number = 0, altered = 0, expect = 0;
    int router = -1;  // the scheduler's ROUTER socket index (bodies are frame 1 there)
    while (ls_trace_read(r, &rec, err, sizeof err) == 1) {
        if (rec.kind == LS_TRACE_SOCKET && rec.frames[1].len == 6 && !memcmp(rec.frames[1].data, "ROUTER", 6))
            router = (int)rec.aux;
        uint32_t body = rec.sock == router ? 1 : 0;
        ls_msg_t m;
        char *buf = NULL;
        if (rec.kind == LS_TRACE_MSG && body < rec.nframes &&
            ls_msg_decode(rec.frames[body].data, rec.frames[body].len, &m, NULL) == 0) {
            if (!altered && rec.dir == LS_TRACE_IN && m.type == LS_MSG_TOKENIZED_REQ && m.rid == rid) {
                m.u.tokenized_req.input_ids.v[0] += 1;
                size_t len;
                assert_int_equal(ls_msg_encode(&m, &buf, &len), 0);
                rec.frames[body] = (ls_frame_ref_t){buf, len};
                altered = number;
            } else if (altered && !expect && rec.dir == LS_TRACE_OUT && m.type == LS_MSG_STEP_PLAN)
                for (size_t i = 0; i < m.u.step_plan.items.n; i++)
                    if (m.u.step_plan.items.v[i].rid == rid)
                        expect = number;
            ls_msg_clear(&m);
        }
        assert_int_equal(ls_trace_write(w, rec.kind, rec.dir, rec.sock, rec.aux, rec.t_ns, rec.frames, rec.nframes), 0);
        free(buf);
        number++;
    }
    ls_trace_reader_destroy(&r);
    ls_trace_writer_destroy(&w);
    assert_true(altered > 0 && expect > altered);
    return expect;
}

static void altered_input(void **unused) {
    char dir[128], log[160], want[64];
    snprintf(dir, sizeof dir, "%s/altered", s_dir);
    uint64_t expect = s_alter_copy(dir, 4);
    int rc = s_replay(dir, "scheduler", NULL, log, sizeof log);
    const char *out = s_slurp(log);
    if (rc != 3)
        fail_msg("altered replay: exit %d, expected 3\n%s", rc, out);
    snprintf(want, sizeof want, "at record %llu,", (unsigned long long)expect);
    if (!strstr(out, want) || !strstr(out, "recorded: out") || !strstr(out, "replayed: out") ||
        !strstr(out, "StepPlan"))
        fail_msg("the divergence is not reported at record %llu with both StepPlans:\n%s", (unsigned long long)expect,
                 out);
}

static void until_pauses(void **unused) {
    char log[160];
    snprintf(log, sizeof log, "%s/replay-until.log", s_dir);
    char *argv[] = {LS_BIN_DIR "/loraserve-replay", s_trace, "--actor", "scheduler", "--until", "5", NULL};
    pid_t pid = s_spawn(log, argv);
    int status;
    assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
    assert_true(WIFSTOPPED(status));
    assert_non_null(strstr(s_slurp(log), "paused after 5 inbound messages"));
    kill(pid, SIGCONT);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void truncated_trace(void **unused) {
    char src[160], dir[128], dst[160], log[160];
    snprintf(src, sizeof src, "%s/worker-0.trace", s_trace);
    snprintf(dir, sizeof dir, "%s/torn", s_dir);
    mkdir(dir, 0755);
    snprintf(dst, sizeof dst, "%s/worker-0.trace", dir);
    struct stat st;
    assert_int_equal(stat(src, &st), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "head -c %lld %s > %s", (long long)st.st_size - 5, src, dst);
    assert_int_equal(system(cmd), 0);
    snprintf(log, sizeof log, "%s/trace-torn.log", s_dir);
    char *argv[] = {LS_BIN_DIR "/loraserve-trace", dst, NULL};
    assert_int_equal(s_run(log, argv), 0);
    const char *out = s_slurp(log);
    assert_non_null(strstr(out, "warning"));
    assert_non_null(strstr(out, "torn record"));
    assert_non_null(strstr(out, "StepPlan"));  // the records before the tear were printed
    int rc = s_replay(dir, "worker-0", NULL, log, sizeof log);
    if (rc != 0)
        fail_msg("replay of a torn trace: exit %d\n%s", rc, s_slurp(log));
}

static void trace_filters(void **unused) {
    char path[160], log[160];
    snprintf(path, sizeof path, "%s/scheduler.trace", s_trace);
    snprintf(log, sizeof log, "%s/trace-rid.log", s_dir);
    char *by_rid[] = {LS_BIN_DIR "/loraserve-trace", "--rid", "8", "--type", "TokenOut", path, NULL};
    assert_int_equal(s_run(log, by_rid), 0);
    char *out = s_slurp(log);
    int lines = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++)
        if (!strstr(line, "TokenOut") || !strstr(line, "rid=8"))
            fail_msg("--rid 8 --type TokenOut printed: %s", line);
    assert_true(lines >= 2);  // the first TokenOut and the aborted last one
    snprintf(log, sizeof log, "%s/trace-json.log", s_dir);
    char *json[] = {LS_BIN_DIR "/loraserve-trace", "--json", "--rid", "8", s_trace, NULL};
    assert_int_equal(s_run(log, json), 0);
    out = s_slurp(log);
    assert_non_null(strstr(out, "\"actor\":\"scheduler\""));
    assert_non_null(strstr(out, "\"type\":\"Abort\""));
    assert_non_null(strstr(out, "\"actor\":\"worker-0\""));  // StepPlans carry rid 8 in their items
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replay_all),     cmocka_unit_test(replay_graph), cmocka_unit_test(altered_input),
        cmocka_unit_test(until_pauses),
        cmocka_unit_test(truncated_trace), cmocka_unit_test(trace_filters),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
