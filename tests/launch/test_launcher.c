// Launcher tests: the real graph, started through launch/loraserve as a user would.
//   graph      — every actor Ready, graph.json right, each actor survives malformed input and
//                answers a ping, the scheduler and a worker refuse a LoadAdapter sent to them
//                directly for a path outside the roots, Ctrl-C (SIGINT) stops everything with exit 0, no process left;
//                the console showed each worker's weights loading (percent and bytes going up, to
//                100%) and each demo adapter loaded; a LoadProgress out of range from a stranger
//                on the control socket changes nothing
//   death      — with no restart budget, killing one actor brings the graph down with a
//                message naming it
//   restart    — supervision: a killed scheduler and a stopped (hung) worker are restarted, the
//                graph converges (the adapters are back at the new scheduler and in the
//                workers), the back-off doubles for an actor that dies again, and the restart
//                budget, once spent, stops the graph with that reason
//   readiness  — /health is 503 while an actor is down (a restart that never gets Ready, killed
//                after --ready-timeout), /health/live 200 all along, neither needing the API
//                key, which reaches the gateway in a 0600 file, not on its command line
//   timeout    — an actor that never gets Ready is named, and the graph is stopped; /health is
//                503 meanwhile
//   tcp        — the same graph over tcp:// endpoints, every one CURVE: a client without the
//                graph's keys is not answered (not even Shutdown), one with the client key is;
//                keys 0600 in a 0700 directory, never on a command line; a non-loopback
//                --tcp-host is warned about
//   trace      — --record-trace writes a trace per actor that loraserve-trace reads
//   help       — --help shows each flag it hands on with the type and default of the actor
//                that takes it (the actor's flag table is the one place a default is written)
//   their_flags — vLLM's and SGLang's flags: every --lora-paths form (name=path:pinned, a plain
//                path, SGLang's JSON) and --lora-modules' JSON load their demo adapter, which
//                then serves a completion; --max-loras 3 reaches the actors (max_lora="3" in
//                /metrics); --enable-lora and --lora-backend are accepted
//   bad_flags  — a malformed --lora-paths JSON, a name given twice, an alias that disagrees
//                with its target and a tensor-parallel group that does not split evenly over
//                --nnodes each stop the launch before anything starts (exit 2); a
//                non-number or a negative --threads stops the actor that takes it at once, and so
//                the launch (exit 1); each with a message naming the value
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_msg.h"
#include "test_util.h"

#include "ls_msg.h"
#include <czmq.h>

static char s_dir[64];

typedef struct {
    pid_t pid;
    char run_dir[256];
    char out_path[300];
    cJSON *graph;
} launch_t;

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Start launch/loraserve with extra args; its output goes to a file we read later.
static void s_launch(launch_t *l, const char *tag, const char *bin_dir, const char *extra[]) {
    snprintf(l->run_dir, sizeof l->run_dir, "%s/%s", s_dir, tag);
    snprintf(l->out_path, sizeof l->out_path, "%s/%s.out", s_dir, tag);
    l->graph = NULL;
    l->pid = fork();
    assert_true(l->pid >= 0);
    if (l->pid == 0) {
        tu_child_dies_with_parent();
        int fd = open(l->out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("LORASERVE_BIN", bin_dir, 1);
        // --port 0: tests run in parallel, each graph's gateway takes any free port
        const char *argv[32] = {LS_LAUNCH_SCRIPT, "--run-dir", l->run_dir, "--actor-heartbeat-ms", "200", "--port", "0"};
        int n = 7;
        for (int i = 0; extra && extra[i]; i++)
            argv[n++] = extra[i];
        execv(argv[0], (char **)argv);
        _exit(127);
    }
}

// Wait for graph.json; NULL if the launcher exited first or time ran out.
static cJSON *s_wait_graph(launch_t *l, double seconds) {
    char path[300];
    snprintf(path, sizeof path, "%s/graph.json", l->run_dir);
    for (double t0 = s_now(); s_now() - t0 < seconds; usleep(50000)) {
        char *text = tu_read_file(path, NULL);
        if (text) {
            l->graph = cJSON_Parse(text);
            free(text);
            return l->graph;
        }
        if (waitpid(l->pid, NULL, WNOHANG) == l->pid)
            return NULL;
    }
    return NULL;
}

// Wait for the launcher to exit; returns its exit status, or -1 on timeout.
static int s_wait_exit(launch_t *l, double seconds) {
    for (double t0 = s_now(); s_now() - t0 < seconds; usleep(50000)) {
        int status;
        if (waitpid(l->pid, &status, WNOHANG) == l->pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    kill(l->pid, SIGKILL);
    waitpid(l->pid, NULL, 0);
    return -1;
}

// A process is gone when it does not exist or is a zombie nobody will reap soon.
static int s_alive(pid_t pid) {
    char path[64], state = '?';
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (fscanf(f, "%*d %*s %c", &state) != 1)
        state = '?';
    fclose(f);
    return state != 'Z';
}

static int s_mode(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int)(st.st_mode & 0777) : -1;
}

static void s_assert_all_gone(cJSON *graph) {
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(graph, "actors")) {
        pid_t pid = (pid_t)cJSON_GetObjectItem(a, "pid")->valueint;
        int alive = 1;
        for (int i = 0; i < 100 && (alive = s_alive(pid)); i++)
            usleep(50000);
        if (alive)
            fail_msg("%s (pid %d) outlived the launcher", cJSON_GetObjectItem(a, "name")->valuestring, (int)pid);
    }
}

static cJSON *s_actor(cJSON *graph, const char *name) {
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(graph, "actors")) if (!strcmp(cJSON_GetObjectItem(a, "name")->valuestring, name)) return a;
    return NULL;
}

static const char *s_router(cJSON *actor) {
    return cJSON_GetObjectItem(cJSON_GetObjectItem(actor, "endpoints"), "router")->valuestring;
}

// m as one frame on s (tm_send), then cleared: the sends here build a message only to send it.
static int s_send(zsock_t *s, ls_msg_t *m) {
    int rc = tm_send(s, m);
    ls_msg_clear(m);
    return rc;
}

// Send garbage, expect an Error; then a Heartbeat ping, expect the actor's pong.
static void s_poke(const char *endpoint, const char *name) {
    zsock_t *s = zsock_new_dealer(endpoint);
    assert_non_null(s);
    zsock_set_rcvtimeo(s, 5000);
    const char junk[] = "\xc1\xff this is not msgpack";
    assert_int_equal(zsock_send(s, "b", junk, sizeof junk), 0);
    ls_msg_t m;
    if (tm_recv(s, &m) != 0)
        fail_msg("%s did not answer a malformed message", name);
    assert_int_equal(m.type, LS_MSG_ERROR);
    assert_int_equal(m.u.error.code, LS_ERROR_CODE_MALFORMED);
    ls_msg_clear(&m);

    ls_msg_init(&m, LS_MSG_HEARTBEAT);
    m.rid = 9;
    assert_int_equal(s_send(s, &m), 0);
    if (tm_recv(s, &m) != 0)
        fail_msg("%s did not answer a ping after malformed input", name);
    assert_int_equal(m.type, LS_MSG_HEARTBEAT);
    assert_int_equal(m.rid, 9);
    assert_string_equal(m.u.heartbeat.actor, name);
    ls_msg_clear(&m);
    zsock_destroy(&s);
}

// The registry's adapter list into *m (an AdapterList); 0, or -1 with no answer in 5 s.
static int s_list_adapters(const char *registry, uint64_t rid, ls_msg_t *m) {
    zsock_t *s = zsock_new_dealer(registry);
    zsock_set_rcvtimeo(s, 5000);
    ls_msg_init(m, LS_MSG_LIST_ADAPTERS);
    m->rid = rid;
    assert_int_equal(s_send(s, m), 0);
    int rc = tm_recv(s, m);
    zsock_destroy(&s);
    if (rc == 0 && m->type != LS_MSG_ADAPTER_LIST) {
        ls_msg_clear(m);
        rc = -1;
    }
    return rc < 0 ? -1 : 0;
}

// The launcher script's default: the demo model and its four adapters, loaded through the
// registry, the scheduler and both workers before the graph counts as up. 0 when the
// registry lists all four READY and, by the scheduler's residency, in the workers' CPU tier.
static int s_demo_adapters_placed(const char *registry) {
    ls_msg_t m;
    if (s_list_adapters(registry, 6, &m) < 0)
        return -1;
    int placed = 0;
    for (size_t k = 0; k < m.u.adapter_list.adapters.n; k++) {
        const ls_msg_adapter_info_t *ai = &m.u.adapter_list.adapters.v[k];
        placed += ai->state == LS_ADAPTER_STATE_READY && ai->residency_known && ai->cpu_resident;
    }
    ls_msg_clear(&m);
    return placed == 4 ? 0 : -1;
}

static void s_check_demo_adapters(const char *registry) {
    ls_msg_t m;
    assert_int_equal(s_list_adapters(registry, 5, &m), 0);
    const char *want[] = {"reverse", "upper", "sort", "digits"};
    assert_int_equal(m.u.adapter_list.adapters.n, 4);
    for (int i = 0; i < 4; i++) {
        int found = 0;
        for (size_t k = 0; k < m.u.adapter_list.adapters.n; k++) {
            ls_msg_adapter_info_t *ai = &m.u.adapter_list.adapters.v[k];
            if (!strcmp(ai->name, want[i])) {
                found = 1;
                assert_int_equal(ai->state, LS_ADAPTER_STATE_READY);
                assert_true(ai->rank == 8 || ai->rank == 16);
                // where it lives, from the scheduler: in both workers' CPU tier, no slot yet
                assert_true(ai->residency_known);
                assert_true(ai->cpu_resident);
                assert_false(ai->in_gpu_slot);
            }
        }
        assert_true(found);
    }
    ls_msg_clear(&m);
}

// A LoadAdapter sent straight to an actor (as anyone who reaches its socket could) for an
// adapter copied outside the roots: the actor itself refuses it.
static void s_load_outside(const char *endpoint, const char *name) {
    char dir[200], cmd[600];
    snprintf(dir, sizeof dir, "%s/outside-%s", s_dir, name);
    snprintf(cmd, sizeof cmd, "cp -r %s/adapters/reverse %s", LS_DEMO_DIR, dir);
    assert_int_equal(system(cmd), 0);
    zsock_t *s = zsock_new_dealer(endpoint);
    zsock_set_rcvtimeo(s, 10000);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = 77;
    m.u.load_adapter.name = ls_msg_strdup("intruder");
    m.u.load_adapter.adapter_id = ls_msg_strdup("00000000-0000-4000-8000-000000000077");
    m.u.load_adapter.path = ls_msg_strdup(dir);
    m.u.load_adapter.slot = -1;
    assert_int_equal(s_send(s, &m), 0);
    if (tm_recv(s, &m) != 0)
        fail_msg("%s did not answer a LoadAdapter", name);
    assert_int_equal(m.type, LS_MSG_ADAPTER_LOADED);
    assert_int_equal(m.rid, 77);
    assert_false(m.u.adapter_loaded.ok);
    assert_int_equal(m.u.adapter_loaded.code, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m.u.adapter_loaded.reason, "outside --lora-roots");
    ls_msg_clear(&m);
    zsock_destroy(&s);
}

static void s_check_graph(cJSON *graph, int tp, const char *prefix) {
    assert_non_null(graph);
    const char *expect[] = {"registry", "scheduler", "detokenizer", "tokenizer", "gateway"};
    cJSON *actors = cJSON_GetObjectItem(graph, "actors");
    assert_int_equal(cJSON_GetArraySize(actors), 5 + tp);
    for (size_t i = 0; i < 5; i++)
        assert_non_null(s_actor(graph, expect[i]));
    for (int r = 0; r < tp; r++) {
        char name[32];
        snprintf(name, sizeof name, "worker-%d", r);
        cJSON *w = s_actor(graph, name);
        assert_non_null(w);
        assert_int_equal(cJSON_GetObjectItem(w, "rank")->valueint, r);
    }
    cJSON *a;
    cJSON_ArrayForEach(a, actors) {
        pid_t pid = (pid_t)cJSON_GetObjectItem(a, "pid")->valueint;
        assert_true(s_alive(pid));
        assert_int_equal(strncmp(s_router(a), prefix, strlen(prefix)), 0);
        struct stat st;
        assert_int_equal(stat(cJSON_GetObjectItem(a, "log")->valuestring, &st), 0);
    }
}

// The console's load lines of one worker (launch/progress.h, not a terminal): its weights from
// the first to 100%, bytes and percent never going back, then each demo adapter at 100%.
static void s_check_progress(const char *out, const char *worker) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, "\n%s: loading weights ", worker);
    int lines = 0, last_pct = -1;
    double last_done = -1, total0 = -1;
    for (const char *at = out; (at = strstr(at, prefix)); at++) {
        double done, total;
        int pct;
        char unit[8];
        if (sscanf(at + strlen(prefix), "%lf/%lf %7s (%d%%)", &done, &total, unit, &pct) != 4)
            fail_msg("not a progress line: %.80s", at + 1);
        assert_string_equal(unit, "MB");  // the demo's 6 MB
        if (total0 < 0)
            total0 = total;
        assert_true(total == total0 && done <= total && done >= last_done && pct > last_pct);
        last_done = done;
        last_pct = pct;
        lines++;
    }
    if (lines < 2 || last_pct != 100 || last_done != total0)
        fail_msg("%s: %d weights lines, the last at %d%%:\n%s", worker, lines, last_pct, out);
    for (const char *const *a = (const char *const[]){"reverse", "upper", "sort", "digits", NULL}; *a; a++) {
        char line[96];
        snprintf(line, sizeof line, "\n%s: loading adapter %s ", worker, *a);
        const char *at = strstr(out, line);
        if (!at || !strstr(at, "(100%)") || strchr(at + 1, '\n') < strstr(at, "(100%)"))
            fail_msg("no line for %s's adapter %s at 100%%:\n%s", worker, *a, out);
    }
}

// LoadProgress the launcher must drop: from an identity that is no actor, and out of range.
static void s_stranger_progress(const char *run_dir) {
    char endpoint[300];
    snprintf(endpoint, sizeof endpoint, "ipc://%s/sock/control.sock", run_dir);
    zsock_t *s = zsock_new(ZMQ_DEALER);
    assert_non_null(s);
    zsock_set_identity(s, "stranger");
    assert_int_equal(zsock_connect(s, "%s", endpoint), 0);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_PROGRESS);
    m.u.load_progress.what = ls_msg_strdup("weights\x1b[2J");
    m.u.load_progress.done_bytes = UINT64_MAX;
    m.u.load_progress.total_bytes = 1;
    assert_int_equal(s_send(s, &m), 0);
    ls_msg_clear(&m);
    zsock_destroy(&s);
}

static void test_graph(void **unused) {
    launch_t l;
    const char *extra[] = {"--tp-size", "2", NULL};
    s_launch(&l, "graph", LS_BIN_DIR, extra);
    cJSON *g = s_wait_graph(&l, 30);
    if (!g)
        fail_msg("graph never came up; launcher output:\n%s", tu_read_file(l.out_path, NULL));
    char prefix[300];
    snprintf(prefix, sizeof prefix, "ipc://%s/sock/", cJSON_GetObjectItem(g, "run_dir")->valuestring);
    s_check_graph(g, 2, prefix);
    char sock[300];
    snprintf(sock, sizeof sock, "%s/sock", cJSON_GetObjectItem(g, "run_dir")->valuestring);
    assert_int_equal(s_mode(sock), 0700);  // other users cannot reach the ipc sockets
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(g, "actors"))
        s_poke(s_router(a), cJSON_GetObjectItem(a, "name")->valuestring);
    s_check_demo_adapters(s_router(s_actor(g, "registry")));
    s_load_outside(s_router(s_actor(g, "scheduler")), "scheduler");
    // The scheduler refused it itself: nothing went on to the workers.
    char *log = tu_read_file(cJSON_GetObjectItem(s_actor(g, "scheduler"), "log")->valuestring, NULL);
    assert_contains(log, "LoadAdapter intruder refused: adapter path");
    free(log);
    s_load_outside(s_router(s_actor(g, "worker-1")), "worker-1");
    s_stranger_progress(cJSON_GetObjectItem(g, "run_dir")->valuestring);

    kill(l.pid, SIGINT);
    assert_int_equal(s_wait_exit(&l, 20), 0);
    s_assert_all_gone(g);
    char *out = tu_read_file(l.out_path, NULL);
    assert_non_null(strstr(out, "loraserve is up"));
    assert_non_null(strstr(out, "graph stopped"));
    s_check_progress(out, "worker-0");
    s_check_progress(out, "worker-1");
    assert_null(strchr(out, '\x1b'));
    free(out);
    cJSON_Delete(g);
}

static void test_death(void **unused) {
    launch_t l;
    const char *extra[] = {"--max-restarts", "0", NULL};
    s_launch(&l, "death", LS_BIN_DIR, extra);
    cJSON *g = s_wait_graph(&l, 30);
    assert_non_null(g);
    pid_t victim = (pid_t)cJSON_GetObjectItem(s_actor(g, "scheduler"), "pid")->valueint;
    kill(victim, SIGKILL);
    int status = s_wait_exit(&l, 20);
    assert_true(status > 0);
    s_assert_all_gone(g);
    char *out = tu_read_file(l.out_path, NULL);
    assert_non_null(strstr(out, "restart budget spent (0 restarts within 60 s); last: actor scheduler"));
    assert_non_null(strstr(out, "signal 9"));
    free(out);
    cJSON_Delete(g);
}

// Re-read graph.json until `name` has been restarted `restarts` times and the graph is whole
// again (the launcher rewrites it then); the actor's new pid, or -1.
static pid_t s_wait_restarted(launch_t *l, const char *name, int restarts, double seconds) {
    char path[300];
    snprintf(path, sizeof path, "%s/graph.json", l->run_dir);
    for (double t0 = s_now(); s_now() - t0 < seconds; usleep(50000)) {
        char *text = tu_read_file(path, NULL);
        cJSON *g = text ? cJSON_Parse(text) : NULL;
        free(text);
        cJSON *a = g ? s_actor(g, name) : NULL;
        pid_t pid = a && cJSON_GetObjectItem(a, "restarts")->valueint == restarts
                        ? (pid_t)cJSON_GetObjectItem(a, "pid")->valueint
                        : -1;
        cJSON_Delete(g);
        if (pid > 0)
            return pid;
    }
    return -1;
}

static pid_t s_pid_of(launch_t *l, const char *name) {
    return (pid_t)cJSON_GetObjectItem(s_actor(l->graph, name), "pid")->valueint;
}

static void test_restart(void **unused) {
    launch_t l;
    const char *extra[] = {"--max-restarts", "3", "--hang-timeout-ms", "1500", NULL};
    s_launch(&l, "restart", LS_BIN_DIR, extra);
    cJSON *g = s_wait_graph(&l, 30);
    if (!g)
        fail_msg("graph never came up; launcher output:\n%s", tu_read_file(l.out_path, NULL));
    const char *registry = s_router(s_actor(g, "registry"));

    // A dead scheduler is restarted alone; the registry sends it the adapters again, and it
    // places them in the worker (which dropped them when the scheduler went down).
    pid_t old = s_pid_of(&l, "scheduler"), worker = s_pid_of(&l, "worker-0");
    kill(old, SIGKILL);
    pid_t now = s_wait_restarted(&l, "scheduler", 1, 15);
    assert_true(now > 0 && now != old);
    assert_true(s_alive(worker));
    int placed = -1;
    for (double t0 = s_now(); s_now() - t0 < 10 && (placed = s_demo_adapters_placed(registry)) < 0;)
        usleep(100000);
    if (placed < 0)
        fail_msg("the adapters did not come back to the restarted scheduler:\n%s", tu_read_file(l.out_path, NULL));

    // A stopped worker sends no heartbeat: found hung within about the hang timeout, killed,
    // restarted, and the scheduler places the adapters in the new one.
    double t0 = s_now();
    kill(worker, SIGSTOP);
    pid_t w2 = s_wait_restarted(&l, "worker-0", 1, 20);
    assert_true(w2 > 0 && w2 != worker);
    double back = s_now() - t0;
    if (back > 6)
        fail_msg("a hung worker took %.1f s to be replaced (hang timeout 1.5 s)", back);
    for (t0 = s_now(); s_now() - t0 < 10 && (placed = s_demo_adapters_placed(registry)) < 0;)
        usleep(100000);
    assert_int_equal(placed, 0);
    s_poke(s_router(s_actor(g, "worker-0")), "worker-0");

    // The scheduler dies again at once: its back-off doubles (250 ms, then 500 ms). That third
    // restart is within the budget of 3; the fourth death stops the graph, saying why.
    char path[300];
    snprintf(path, sizeof path, "%s/graph.json", l.run_dir);
    kill(now, SIGKILL);
    assert_true(s_wait_restarted(&l, "scheduler", 2, 15) > 0);
    char *text = tu_read_file(path, NULL);
    cJSON *g2 = cJSON_Parse(text);
    free(text);
    kill((pid_t)cJSON_GetObjectItem(s_actor(g2, "tokenizer"), "pid")->valueint, SIGKILL);
    assert_int_equal(s_wait_exit(&l, 30), 1);
    s_assert_all_gone(g2);
    cJSON_Delete(g2);
    char *out = tu_read_file(l.out_path, NULL);
    assert_contains(out, "actor scheduler (pid");
    assert_contains(out, "restarting it in 250 ms (restart 1;");
    assert_contains(out, "restarting it in 500 ms (restart 2;");
    assert_contains(out, "no heartbeat from worker-0");
    assert_contains(out, "restart budget spent (3 restarts within 60 s); last: actor tokenizer");
    free(out);
    cJSON_Delete(g);
}

// Run a curl command whose output ends in "\n%{http_code}": the HTTP status (0 when nothing
// answered); the body in body (cap bytes) when given.
static int s_curl(const char *cmd, char *body, size_t cap) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char out[1 << 17];  // /metrics is larger than a page
    size_t n = fread(out, 1, sizeof out - 1, p);
    pclose(p);
    out[n] = 0;
    char *nl = strrchr(out, '\n');
    if (!nl)
        return 0;
    *nl = 0;
    if (body)
        snprintf(body, cap, "%s", out);
    return atoi(nl + 1);
}

// GET path on the gateway (s_curl).
static int s_http_get(int port, const char *path, char *body, size_t cap) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "curl -s -m 5 -w '\\n%%{http_code}' http://127.0.0.1:%d%s", port, path);
    return s_curl(cmd, body, cap);
}

// A bin dir NAME under the test dir (its path into bin) of the real actors, but for a scheduler
// that is the shell script SCRIPT.
static void s_bin_with_scheduler(char *bin, size_t cap, const char *name, const char *script) {
    char path[300], target[300];
    snprintf(bin, cap, "%s/%s", s_dir, name);
    mkdir(bin, 0755);
    const char *real[] = {"launch", "gateway", "tokenizer", "registry", "worker", "detokenizer"};
    for (size_t i = 0; i < sizeof real / sizeof *real; i++) {
        snprintf(path, sizeof path, "%s/loraserve-%s", bin, real[i]);
        snprintf(target, sizeof target, "%s/loraserve-%s", LS_BIN_DIR, real[i]);
        assert_int_equal(symlink(target, path), 0);
    }
    snprintf(path, sizeof path, "%s/loraserve-scheduler", bin);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(script, f);
    fclose(f);
    chmod(path, 0755);
}

// A stand-in for an actor that never says Ready: `sleep` for a time no other process on the
// machine uses (this test's pid in the fraction), so that looking for leftovers finds only ours.
static void s_sleeper(char *out, size_t cap) {
    snprintf(out, cap, "sleep 300.%d", (int)getpid());
}

// True when a process of ours runs `sleeper` (the bracket keeps pgrep from matching the shell
// that runs it).
static bool s_sleeper_left(const char *sleeper) {
    char cmd[200];
    snprintf(cmd, sizeof cmd, "pgrep -f '[%c]%s' >/dev/null", sleeper[0], sleeper + 1);
    return system(cmd) == 0;
}

// Readiness and liveness: /health is 503 while the graph is not whole, /health/live 200 as long
// as the gateway runs. A restarted scheduler that never gets Ready keeps /health at 503 and is
// killed after --ready-timeout, which (the budget being 1) stops the graph.
static void test_readiness(void **unused) {
    char bin[200], path[300], mark[300], script[1024], sleeper[64];
    // The real scheduler the first time; a process that never says Ready after that.
    s_sleeper(sleeper, sizeof sleeper);
    snprintf(mark, sizeof mark, "%s/started-once", s_dir);
    snprintf(script, sizeof script,
             "#!/bin/sh\nif [ -e %s ]; then exec %s; fi\ntouch %s\nexec %s/loraserve-scheduler \"$@\"\n", mark,
             sleeper, mark, LS_BIN_DIR);
    s_bin_with_scheduler(bin, sizeof bin, "readybin", script);

    launch_t l;
    const char *extra[] = {"--ready-timeout", "3", "--max-restarts", "1", "--api-key", "key-not-for-ps", NULL};
    s_launch(&l, "readiness", bin, extra);
    cJSON *g = s_wait_graph(&l, 30);
    assert_non_null(g);
    // The launcher hands the API key to the gateway in a file of the run dir, not on its command line.
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)s_pid_of(&l, "gateway"));
    size_t n;
    char *cmd = tu_read_file(path, &n);
    assert_non_null(cmd);
    for (size_t i = 0; i < n; i++)
        cmd[i] = cmd[i] ? cmd[i] : ' ';
    assert_contains(cmd, "--api-key-file=");
    assert_null(strstr(cmd, "key-not-for-ps"));
    free(cmd);
    snprintf(path, sizeof path, "%s/keys/api-key", l.run_dir);
    assert_int_equal(s_mode(path), 0600);
    int port = tu_gateway_port(l.run_dir);
    assert_true(port > 0);
    char body[4096];
    assert_int_equal(s_http_get(port, "/health", body, sizeof body), 200);
    assert_int_equal(s_http_get(port, "/health/live", NULL, 0), 200);

    kill(s_pid_of(&l, "scheduler"), SIGKILL);
    int status = 0;
    for (double t0 = s_now(); s_now() - t0 < 3 && (status = s_http_get(port, "/health", body, sizeof body)) != 503;)
        usleep(50000);
    assert_int_equal(status, 503);
    assert_contains(body, "scheduler");
    assert_int_equal(s_http_get(port, "/health/live", NULL, 0), 200);
    assert_int_equal(s_http_get(port, "/health", NULL, 0), 503);  // still: the new one is not Ready

    assert_int_equal(s_wait_exit(&l, 30), 1);
    s_assert_all_gone(g);
    char *out = tu_read_file(l.out_path, NULL);
    assert_contains(out, "restarted scheduler");
    assert_contains(out, "is not ready after 3 s; killing it");
    assert_contains(out, "restart budget spent (1 restarts within 60 s)");
    free(out);
    cJSON_Delete(g);
    assert_false(s_sleeper_left(sleeper));
}

static void test_ready_timeout(void **unused) {
    // A bin dir where the scheduler is a process that never says Ready.
    char bin[200], sleeper[64], script[128];
    s_sleeper(sleeper, sizeof sleeper);
    snprintf(script, sizeof script, "#!/bin/sh\nexec %s\n", sleeper);
    s_bin_with_scheduler(bin, sizeof bin, "fakebin", script);

    launch_t l;
    const char *extra[] = {"--ready-timeout", "2", "--shutdown-timeout", "4", NULL};
    s_launch(&l, "timeout", bin, extra);
    // Meanwhile the gateway runs but the graph is not ready: /health says so, /health/live not.
    int port = 0;
    for (double t0 = s_now(); s_now() - t0 < 1.5 && !(port = tu_gateway_port(l.run_dir));)
        usleep(20000);
    assert_true(port > 0);
    char body[4096];
    assert_int_equal(s_http_get(port, "/health", body, sizeof body), 503);
    assert_contains(body, "not every actor is ready");
    assert_int_equal(s_http_get(port, "/health/live", NULL, 0), 200);
    int status = s_wait_exit(&l, 30);
    assert_true(status > 0);
    char *out = tu_read_file(l.out_path, NULL);
    // the scheduler is named (the registry may be too: its startup adapters go through it)
    assert_non_null(strstr(out, "not ready after 2 s: "));
    assert_non_null(strstr(out, "scheduler is not ready; its log: "));
    free(out);
    // Nothing may be left: not the fake scheduler, not the real actors.
    assert_false(s_sleeper_left(sleeper));
}

// A DEALER that speaks CURVE with the graph's client key, to `server`'s public key.
static zsock_t *s_curve_dealer(const char *run_dir, const char *endpoint, const char *server) {
    char path[400];
    snprintf(path, sizeof path, "%s/keys/secret/client.key", run_dir);
    zcert_t *mine = zcert_load(path);
    snprintf(path, sizeof path, "%s/keys/public/%s.pub", run_dir, server);
    zcert_t *theirs = zcert_load(path);
    assert_non_null(mine);
    assert_non_null(theirs);
    zsock_t *s = zsock_new(ZMQ_DEALER);
    zcert_apply(mine, s);
    zsock_set_curve_serverkey(s, zcert_public_txt(theirs));
    assert_int_equal(zsock_connect(s, "%s", endpoint), 0);
    zcert_destroy(&mine);
    zcert_destroy(&theirs);
    return s;
}

static void s_send_msg(zsock_t *s, int type, uint64_t rid) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    if (type == LS_MSG_SHUTDOWN)
        m.u.shutdown.reason = ls_msg_strdup("an intruder");
    zsock_set_sndtimeo(s, 1000);
    s_send(s, &m); // an unauthenticated peer's send may go nowhere: what it causes is checked
}

// Over tcp every socket is CURVE: a plain client (no keys) cannot ask the tokenizer, the
// registry or the launcher anything, nor stop them; a client with the graph's client key can.
// The keys are the owner's alone, and no key is on any command line.
static void s_check_curve(launch_t *l, cJSON *g) {
    char path[400];
    snprintf(path, sizeof path, "%s/keys", l->run_dir);
    assert_int_equal(s_mode(path), 0700);
    snprintf(path, sizeof path, "%s/keys/secret/tokenizer.key", l->run_dir);
    assert_int_equal(s_mode(path), 0600);
    snprintf(path, sizeof path, "%s/keys/secret/client.key", l->run_dir);
    zcert_t *client = zcert_load(path);
    assert_non_null(client);
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(g, "actors")) {
        snprintf(path, sizeof path, "/proc/%d/cmdline", cJSON_GetObjectItem(a, "pid")->valueint);
        size_t n;
        char *cmd = tu_read_file(path, &n);
        assert_non_null(cmd);
        for (size_t i = 0; i < n; i++)
            cmd[i] = cmd[i] ? cmd[i] : ' ';
        assert_contains(cmd, "--curve-dir=");
        assert_null(strstr(cmd, zcert_secret_txt(client)));
        free(cmd);
    }
    zcert_destroy(&client);

    const char *targets[] = {s_router(s_actor(g, "tokenizer")), s_router(s_actor(g, "registry")),
                             cJSON_GetObjectItem(g, "control")->valuestring};
    for (int t = 0; t < 3; t++) {
        zsock_t *plain = zsock_new_dealer(targets[t]);
        assert_non_null(plain);
        zsock_set_rcvtimeo(plain, 1000);
        s_send_msg(plain, LS_MSG_GET_METRICS, 1);
        s_send_msg(plain, LS_MSG_HEARTBEAT, 2);
        s_send_msg(plain, LS_MSG_SHUTDOWN, 3);
        zframe_t *f = zframe_recv(plain); // any frame at all, decodable or not, is an answer
        if (f)
            fail_msg("%s answered a client without keys", targets[t]);
        zsock_destroy(&plain);
    }
    // Still up: the launcher and every actor.
    assert_int_equal(waitpid(l->pid, NULL, WNOHANG), 0);
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(g, "actors")) assert_true(s_alive(cJSON_GetObjectItem(a, "pid")->valueint));
    zsock_t *keyed = s_curve_dealer(l->run_dir, targets[0], "tokenizer");
    zsock_set_rcvtimeo(keyed, 5000);
    s_send_msg(keyed, LS_MSG_HEARTBEAT, 9);
    ls_msg_t m;
    if (tm_recv(keyed, &m) != 0)
        fail_msg("the tokenizer did not answer a client with the graph's key");
    assert_int_equal(m.type, LS_MSG_HEARTBEAT);
    assert_int_equal(m.rid, 9);
    ls_msg_clear(&m);
    // Even with the client key, Shutdown is the launcher's alone: refused, the actor stays.
    s_send_msg(keyed, LS_MSG_SHUTDOWN, 10);
    assert_int_equal(tm_recv(keyed, &m), 0);
    assert_int_equal(m.type, LS_MSG_ERROR);
    ls_msg_clear(&m);
    usleep(200000);
    assert_true(s_alive(cJSON_GetObjectItem(s_actor(g, "tokenizer"), "pid")->valueint));
    zsock_destroy(&keyed);
}

static void test_tcp(void **unused) {
    // Ports from this test's pid so parallel runs on one machine do not collide, below Linux's
    // ephemeral range (32768+), where other tests' connections would take them at random, and
    // in 20000..25999, apart from the multi-node graph tests' (26000..31999).
    char base[16];
    snprintf(base, sizeof base, "%d", 20000 + (int)(getpid() % 600) * 10);
    launch_t l;
    const char *extra[] = {"--transport", "tcp", "--tcp-base-port", base, NULL};
    s_launch(&l, "tcp", LS_BIN_DIR, extra);
    cJSON *g = s_wait_graph(&l, 30);
    if (!g)
        fail_msg("tcp graph never came up:\n%s", tu_read_file(l.out_path, NULL));
    s_check_graph(g, 1, "tcp://127.0.0.1:");
    s_check_curve(&l, g);
    // The SDK given the run directory finds the client key there, and generates over CURVE.
    char cmd[600];
    snprintf(cmd, sizeof cmd, "%s/loraserve-cli --run-dir %s --timeout-ms 10000 generate --adapter reverse --max-tokens 3 "
             "hello >/dev/null", LS_BIN_DIR, l.run_dir);
    assert_int_equal(system(cmd), 0);
    kill(l.pid, SIGTERM);
    assert_int_equal(s_wait_exit(&l, 20), 0);
    s_assert_all_gone(g);
    cJSON_Delete(g);

    // A bind beyond loopback is said out loud (this one, a documentation address, then fails).
    const char *wide[] = {"--transport", "tcp", "--tcp-base-port", base, "--tcp-host", "192.0.2.1", NULL};
    s_launch(&l, "tcp-wide", LS_BIN_DIR, wide);
    assert_true(s_wait_exit(&l, 20) > 0);
    char *out = tu_read_file(l.out_path, NULL);
    assert_contains(out, "--tcp-host 192.0.2.1 is not a loopback address");
    free(out);
}

static void test_trace(void **unused) {
    char tdir[200];
    snprintf(tdir, sizeof tdir, "%s/traces", s_dir);
    launch_t l;
    const char *extra[] = {"--record-trace", tdir, NULL};
    s_launch(&l, "trace", LS_BIN_DIR, extra);
    cJSON *g = s_wait_graph(&l, 30);
    assert_non_null(g);
    s_poke(s_router(s_actor(g, "registry")), "registry");
    kill(l.pid, SIGINT);
    assert_int_equal(s_wait_exit(&l, 20), 0);
    cJSON_Delete(g);

    char cmd[1024], outp[300];
    snprintf(outp, sizeof outp, "%s/trace.txt", s_dir);
    snprintf(cmd, sizeof cmd, "%s/loraserve-trace %s/registry.trace > %s", LS_BIN_DIR, tdir, outp);
    assert_int_equal(system(cmd), 0);
    char *text = tu_read_file(outp, NULL);
    assert_non_null(text);
    // What the registry saw and said: the junk (undecodable), our ping, its answers, Ready to
    // the launcher, and the launcher's Shutdown.
    assert_non_null(strstr(text, "undecodable"));
    assert_non_null(strstr(text, "Error"));
    assert_non_null(strstr(text, "Heartbeat"));
    assert_non_null(strstr(text, "Ready"));
    assert_non_null(strstr(text, "Shutdown"));
    free(text);
    snprintf(cmd, sizeof cmd, "%s/loraserve-trace --json %s/worker-0.trace | grep -c '\"kind\":\"msg\"' >/dev/null", LS_BIN_DIR, tdir);
    assert_int_equal(system(cmd), 0);
}

// The line of flag --name in cmd's output ("--name TYPE   help (default: X)"), or "".
static void s_help_line(const char *cmd, const char *name, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024], key[96];
    snprintf(key, sizeof key, "  --%s ", name);
    out[0] = 0;
    while (fgets(line, sizeof line, p))
        if (!strncmp(line, key, strlen(key)))
            snprintf(out, cap, "%s", line);
    pclose(p);
}

// "TYPE" and "(default: X)" of a help line, as "TYPE|X" ("|" without a default).
static void s_type_default(const char *line, char *out, size_t cap) {
    const char *type = line + strspn(line, " ");
    type += strcspn(type, " ") + 1;
    const char *def = strstr(line, "(default: ");
    snprintf(out, cap, "%.*s|%.*s", (int)strcspn(type, " "), type, def ? (int)strcspn(def + 10, ")\n") : 0,
             def ? def + 10 : "");
}

static void test_help(void **unused) {
    static const struct {
        const char *flag, *actor;
    } cases[] = {{"max-running-requests", "scheduler"}, {"chunked-prefill-size", "scheduler"},
                 {"lora-eviction-policy", "scheduler"}, {"max-loras-per-batch", "worker"},
                 {"kv-cache-mb", "worker"},             {"port", "gateway"},
                 {"max-body-bytes", "gateway"},         {"max-client-requests", "tokenizer"}};
    char cmd[600], launcher[1024], actor[1024], lt[160], at[160];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(cmd, sizeof cmd, "%s/loraserve-launch --help", LS_BIN_DIR);
        s_help_line(cmd, cases[i].flag, launcher, sizeof launcher);
        snprintf(cmd, sizeof cmd, "%s/loraserve-%s --help", LS_BIN_DIR, cases[i].actor);
        s_help_line(cmd, cases[i].flag, actor, sizeof actor);
        if (!launcher[0] || !actor[0])
            fail_msg("--%s: launcher line \"%s\", %s line \"%s\"", cases[i].flag, launcher, cases[i].actor, actor);
        s_type_default(launcher, lt, sizeof lt);
        s_type_default(actor, at, sizeof at);
        if (strcmp(lt, at) || !strchr(at, '|')[1])
            fail_msg("--%s: the launcher shows %s, the %s declares %s", cases[i].flag, lt, cases[i].actor, at);
    }
}

// POST a JSON body to the gateway (s_curl).
static int s_http_post(int port, const char *path, const char *json, char *body, size_t cap) {
    char file[300], cmd[700];
    snprintf(file, sizeof file, "%s/post.json", s_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "curl -s -m 10 -H 'Content-Type: application/json' --data-binary @%s -w '\\n%%{http_code}' "
             "http://127.0.0.1:%d%s",
             file, port, path);
    return s_curl(cmd, body, cap);
}

static void test_their_flags(void **unused) {
    char plain[300], pinned[300], sglang[400], vllm[400];
    snprintf(plain, sizeof plain, "%s/adapters/reverse", LS_DEMO_DIR);
    snprintf(pinned, sizeof pinned, "upper=%s/adapters/upper:pinned", LS_DEMO_DIR);
    snprintf(sglang, sizeof sglang, "{\"lora_name\": \"sorter\", \"lora_path\": \"%s/adapters/sort\", \"pinned\": false}",
             LS_DEMO_DIR);
    snprintf(vllm, sizeof vllm, "{\"name\": \"dig\", \"path\": \"%s/adapters/digits\", \"base_model_name\": \"demo\"}",
             LS_DEMO_DIR);
    const char *extra[] = {"--model-path", LS_DEMO_DIR, "--max-lora-rank", "16", "--lora-roots", LS_DEMO_DIR "/adapters",
                           "--lora-paths", plain, pinned, sglang, "--lora-modules", vllm, "--max-loras", "3",
                           "--max-cpu-loras", "6", "--enable-lora", "--lora-backend", "triton",
                           "--disable-overlap-schedule", NULL};
    launch_t l;
    s_launch(&l, "their", LS_BIN_DIR, extra);
    cJSON *g = s_wait_graph(&l, 30);
    if (!g)
        fail_msg("graph never came up; launcher output:\n%s", tu_read_file(l.out_path, NULL));
    int port = tu_gateway_port(l.run_dir);
    assert_true(port > 0);
    char body[8192];
    assert_int_equal(s_http_get(port, "/v1/models", body, sizeof body), 200);
    cJSON *models = cJSON_Parse(body), *m;
    assert_non_null(models);
    const char *want[] = {"reverse", "upper", "sorter", "dig"};
    for (int i = 0; i < 4; i++) {
        int found = 0;
        cJSON_ArrayForEach(m, cJSON_GetObjectItem(models, "data")) if (!strcmp(cJSON_GetObjectItem(m, "id")->valuestring, want[i])) {
            found = 1;
            assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItem(m, "pinned")), i == 1);
        }
        if (!found)
            fail_msg("adapter %s not served: /v1/models is %s", want[i], body);
        char req[200];
        snprintf(req, sizeof req, "{\"model\": \"%s\", \"prompt\": \"abc\", \"max_tokens\": 3}", want[i]);
        if (s_http_post(port, "/v1/completions", req, body, sizeof body) != 200)
            fail_msg("completion with %s: %s", want[i], body);
    }
    cJSON_Delete(models);
    // A switch reaches the actors that take it, as a bare flag, and no other.
    const char *kinds[] = {"scheduler", "worker-0"};
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/cmdline", cJSON_GetObjectItem(s_actor(g, kinds[i]), "pid")->valueint);
        size_t len = 0;
        char *cmd = tu_read_file(path, &len);
        assert_non_null(cmd);
        bool has = false;
        for (size_t k = 0; k < len; k += strlen(cmd + k) + 1)
            has |= !strcmp(cmd + k, "--disable-overlap-schedule");
        assert_int_equal(has, i == 0);
        free(cmd);
    }
    static char metrics[1 << 17];
    assert_int_equal(s_http_get(port, "/metrics", metrics, sizeof metrics), 200);
    assert_contains(metrics, "vllm:lora_requests_info{max_lora=\"3\"");
    kill(l.pid, SIGINT);
    assert_int_equal(s_wait_exit(&l, 20), 0);
    s_assert_all_gone(g);
    cJSON_Delete(g);
}

static void test_bad_flags(void **unused) {
    static const struct {
        const char *flags[10], *said;
        int status;  // 2: the launcher refused it before starting anything; 1: an actor did, at once
    } cases[] = {
        {{"--lora-paths", "{\"lora_name\": \"x\"", NULL}, "lora_name\\\": \\\"x\\\"\\\": not a JSON object", 2},
        {{"--lora-modules", "{\"name\": \"x\", \"path\": \"/p\", \"rank\": 8}", NULL}, "unknown key", 2},
        {{"--lora-paths", "reverse=/elsewhere", NULL}, "the name reverse is given twice", 2},
        {{"--max-loras-per-batch", "abc", NULL}, "--max-loras-per-batch expects an integer, got \\\"abc\\\"", 1},
        {{"--threads", "-1", NULL}, "--threads -1: the CPU backend's BLAS threads must be at least 0", 1},
        {{"--max-loras", "3", "--max-loras-per-batch", "4"}, "--max-loras 3 and --max-loras-per-batch 4 disagree", 2},
        // a tensor-parallel group split unevenly over the nodes
        {{"--transport", "tcp", "--nnodes", "2", "--node-addrs", "127.0.0.1,127.0.0.2", "--curve-dir", "/nonexistent",
          "--tp-size", "3"},
         "--nnodes 2 with --dp-size 1 and --tp-size 3", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *extra[12] = {0};
        memcpy(extra, cases[i].flags, sizeof cases[i].flags);
        char tag[32];
        snprintf(tag, sizeof tag, "bad%zu", i);
        launch_t l;
        s_launch(&l, tag, LS_BIN_DIR, extra);
        int status = s_wait_exit(&l, 30);
        char *out = tu_read_file(l.out_path, NULL);
        if (status != cases[i].status || !strstr(out, cases[i].said))
            fail_msg("%s %s: exit %d, want %d and \"%s\"; output:\n%s", cases[i].flags[0], cases[i].flags[1], status,
                     cases[i].status, cases[i].said, out);
        if (cases[i].status == 1)
            assert_contains(out, "before the graph was up; stopping the graph");
        else {
            char path[400];  // nothing was started: no actor log
            snprintf(path, sizeof path, "%s/logs/registry.log", l.run_dir);
            assert_int_not_equal(access(path, F_OK), 0);
        }
        free(out);
    }
}

int main(void) {
    if (tu_tmpdir(s_dir, sizeof s_dir, "launch") < 0)
        return 1;
    alarm(220);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph),
        cmocka_unit_test(test_death),
        cmocka_unit_test(test_restart),
        cmocka_unit_test(test_readiness),
        cmocka_unit_test(test_ready_timeout),
        cmocka_unit_test(test_tcp),
        cmocka_unit_test(test_trace),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_their_flags),
        cmocka_unit_test(test_bad_flags),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(s_dir);
    return failed;
}
