// loraserve-launch — spawns and supervises the actor graph (run through launch/loraserve).
//
// It is an actor itself ("launcher"): it binds the control endpoint that every actor connects
// to. Accepts: Ready (an actor finished init), Heartbeat (liveness). Emits: Shutdown (to each
// actor when the graph stops). It writes RUN_DIR/graph.json once every actor is Ready, and stops
// the whole graph — Shutdown, then SIGTERM, then SIGKILL — on Ctrl-C/SIGTERM, on a Ready
// timeout (naming the actors that did not come up), or when any actor dies (naming it and how).
#define _GNU_SOURCE
#include <errno.h>
#include <ev.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ls_actor.h"

#define S_MAX_ACTORS 72
#define S_IPC_PATH_MAX 107  // sun_path in sockaddr_un, less the NUL

typedef struct {
    char name[32];
    char binary[32];  // loraserve-<binary>
    char endpoint[256];
    char log_path[PATH_MAX];
    int rank;
    pid_t pid;
    int ready;
    int exited;
    uint64_t last_heartbeat_ns;
    int silent_warned;
    ev_child child;
} s_actor_t;

typedef struct {
    // flags
    char *run_dir, *transport, *tcp_host, *record_trace, *bin_dir, *log_level;
    int tp_size, tcp_base_port, ready_timeout_s, shutdown_timeout_s, heartbeat_ms;
    // state
    ls_actor_t *self;
    char control[256];
    int nactors;
    int nready;
    int up;          // every actor was Ready
    int exit_status; // the launcher's own exit status
    int stopping;
} s_launcher_t;

static s_launcher_t s_l;

// Flags the launcher hands on, unchanged, to the actors that take them (SGLang names). Unset
// ones are not passed: each actor's own default applies (the same default wherever a flag is
// shared, e.g. --max-loras-per-batch).
enum { K_REGISTRY = 1, K_WORKER = 2, K_SCHEDULER = 4, K_DETOKENIZER = 8, K_TOKENIZER = 16, K_GATEWAY = 32 };
typedef struct {
    const char *name;
    int list;
    unsigned kinds;
    const char *help;
    char *value;          // set with a value
    ls_strlist_t values;  // list flags
} s_pass_t;

static s_pass_t s_pass[] = {
    {"model-path", 0, K_WORKER | K_REGISTRY | K_TOKENIZER | K_DETOKENIZER | K_GATEWAY, "HF model directory (launch/loraserve defaults to examples/demo)", NULL, {0}},
    {"load-format", 0, K_WORKER, "auto (the checkpoint) or dummy (random weights of config.json's shapes)", NULL, {0}},
    {"backend", 0, K_WORKER, "compute backend of the workers: cpu or cuda (default cpu)", NULL, {0}},
    {"max-loras-per-batch", 0, K_WORKER | K_REGISTRY, "adapter slots: distinct adapters in one step (default 8)", NULL, {0}},
    {"max-lora-rank", 0, K_WORKER | K_REGISTRY, "largest adapter rank served (default 64)", NULL, {0}},
    {"max-loaded-loras", 0, K_WORKER, "most adapters in each worker's CPU tier (default 0: as many as its bytes allow)", NULL, {0}},
    {"max-cpu-lora-mb", 0, K_WORKER, "host memory for adapters per worker, in MB (default: 64 adapters of --max-lora-rank, at most 1/4 of RAM)", NULL, {0}},
    {"lora-target-modules", 1, K_WORKER | K_REGISTRY, "modules adapters may target (default: all seven)", NULL, {0}},
    {"kv-cache-mb", 0, K_WORKER, "KV cache size per worker (default 256)", NULL, {0}},
    {"kv-blocks", 0, K_WORKER, "KV cache blocks per worker (overrides --kv-cache-mb)", NULL, {0}},
    {"block-size", 0, K_WORKER, "tokens per KV block (default 16)", NULL, {0}},
    {"lora-paths", 1, K_REGISTRY, "adapters loaded at start: name=path or name=path:pinned", NULL, {0}},
    {"lora-dirs", 1, K_REGISTRY, "directories whose DIR/name adapters load on their first request", NULL, {0}},
    {"lora-roots", 1, K_REGISTRY, "where client-given adapter paths may point (default: the --lora-dirs)", NULL, {0}},
    {"lora-eviction-policy", 0, K_WORKER | K_SCHEDULER, "adapter slot victim: lru or fifo (default lru)", NULL, {0}},
    {"max-num-batched-tokens", 0, K_SCHEDULER | K_WORKER, "token budget of one step; workers refuse bigger plans (default 2048)", NULL, {0}},
    {"max-running-requests", 0, K_SCHEDULER | K_WORKER, "requests decoded at once; workers refuse bigger plans (default 256)", NULL, {0}},
    {"chunked-prefill-size", 0, K_SCHEDULER, "prompt tokens of one request per step (default 512)", NULL, {0}},
    {"max-skip-steps", 0, K_SCHEDULER, "steps a request may be passed over for residency (default 8)", NULL, {0}},
    {"default-max-new-tokens", 0, K_SCHEDULER, "max_new_tokens when a request gives none (default 128)", NULL, {0}},
    {"step-timeout-ms", 0, K_SCHEDULER, "a step not answered by then fails its requests (default 30000)", NULL, {0}},
    {"max-waiting-requests", 0, K_SCHEDULER, "requests waiting to run, all tenants; more are answered 429 (default 4096)", NULL, {0}},
    {"max-tenant-waiting", 0, K_SCHEDULER, "requests waiting to run for one adapter or the base model; more: 429 (default 1024)", NULL, {0}},
    {"max-queued-tokens", 0, K_SCHEDULER, "prompt tokens of the waiting requests together; more: 429 (default 4194304)", NULL, {0}},
    {"port", 0, K_GATEWAY, "HTTP port of the gateway (default 30000; 0: any free port, in logs/gateway.log)", NULL, {0}},
    {"host", 0, K_GATEWAY, "address the gateway listens on (default 127.0.0.1)", NULL, {0}},
    {"api-key", 0, K_GATEWAY, "require Authorization: Bearer KEY on every HTTP endpoint but /health", NULL, {0}},
    {"served-model-name", 0, K_GATEWAY, "the base model's name in the APIs (default: --model-path's basename)", NULL, {0}},
    {"max-connections", 0, K_GATEWAY, "open HTTP connections; more are answered 503 (default 1024)", NULL, {0}},
    {"max-header-bytes", 0, K_GATEWAY, "HTTP request line and headers; more is answered 431 (default 32768)", NULL, {0}},
    {"max-body-bytes", 0, K_GATEWAY, "HTTP request body; more is answered 413 (default 16 MiB)", NULL, {0}},
    {"idle-timeout-ms", 0, K_GATEWAY, "a silent HTTP connection is closed (default 60000)", NULL, {0}},
    {"request-timeout-ms", 0, K_GATEWAY, "an HTTP request must arrive whole within this, else 408 (default 30000)", NULL, {0}},
    {"max-request-completions", 0, K_GATEWAY, "completions one request may ask for (prompts x n); more: 400 (default 256)", NULL, {0}},
    {"max-tenant-completions", 0, K_GATEWAY, "HTTP completions in flight for one adapter or the base model; more: 429 (default 1024)", NULL, {0}},
};
#define S_NPASS (sizeof s_pass / sizeof *s_pass)

static unsigned s_kind_bit(const char *binary) {
    static const char *kinds[] = {"registry", "worker", "scheduler", "detokenizer", "tokenizer", "gateway"};
    for (unsigned i = 0; i < 6; i++)
        if (!strcmp(binary, kinds[i]))
            return 1u << i;
    return 0;
}
static s_actor_t s_actors[S_MAX_ACTORS];

static s_actor_t *s_find(const char *name) {
    for (int i = 0; i < s_l.nactors; i++)
        if (!strcmp(s_actors[i].name, name))
            return &s_actors[i];
    return NULL;
}

static int s_endpoint(char *out, size_t cap, const char *name, int index) {
    if (!strcmp(s_l.transport, "tcp")) {
        snprintf(out, cap, "tcp://%s:%d", s_l.tcp_host, s_l.tcp_base_port + index);
        return 0;
    }
    int n = snprintf(out, cap, "ipc://%s/sock/%s.sock", s_l.run_dir, name);
    if (n - 6 > S_IPC_PATH_MAX) {
        ls_error(0, "--run-dir %s is too long for ipc socket paths (%d > %d characters); use a shorter "
                    "directory or --transport tcp", s_l.run_dir, n - 6, S_IPC_PATH_MAX);
        return -1;
    }
    return 0;
}

static int s_plan(void) {
    const char *order[] = {"registry", "worker", "scheduler", "detokenizer", "tokenizer", "gateway"};
    if (s_l.tp_size < 1 || s_l.tp_size > S_MAX_ACTORS - 6) {
        ls_error(0, "--tp-size must be between 1 and %d", S_MAX_ACTORS - 6);
        return -1;
    }
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
        int copies = strcmp(order[k], "worker") ? 1 : s_l.tp_size;
        for (int r = 0; r < copies; r++) {
            s_actor_t *a = &s_actors[s_l.nactors];
            snprintf(a->binary, sizeof a->binary, "%s", order[k]);
            // Workers always carry their rank; other actors are unique.
            char name[sizeof a->name];
            if (!strcmp(order[k], "worker"))
                snprintf(name, sizeof name, "%s-%d", order[k], r);
            else
                snprintf(name, sizeof name, "%s", order[k]);
            memcpy(a->name, name, sizeof name);
            a->rank = r;
            if (s_endpoint(a->endpoint, sizeof a->endpoint, name, s_l.nactors + 1) < 0)
                return -1;
            snprintf(a->log_path, sizeof a->log_path, "%s/logs/%s.log", s_l.run_dir, name);
            s_l.nactors++;
        }
    }
    return s_endpoint(s_l.control, sizeof s_l.control, "control", 0);
}

static void s_child_cb(struct ev_loop *loop, ev_child *w, int revents);

// Build argv for one actor: its identity, sockets, every other actor as a peer.
static char **s_argv(const s_actor_t *a) {
    int max = 16 + 2 * s_l.nactors + 2 * (int)S_NPASS, n = 0;
    for (size_t i = 0; i < S_NPASS; i++)
        max += (int)s_pass[i].values.n;
    char **argv = calloc((size_t)max, sizeof *argv);
#define PUSH(...) (asprintf(&argv[n], __VA_ARGS__) < 0 ? (void)(argv[n] = NULL) : (void)n++)
    PUSH("%s/loraserve-%s", s_l.bin_dir, a->binary);
    PUSH("--name=%s", a->name);
    PUSH("--bind=%s", a->endpoint);
    PUSH("--control=%s", s_l.control);
    PUSH("--rank=%d", a->rank);
    PUSH("--log-level=%s", s_l.log_level);
    PUSH("--heartbeat-ms=%d", s_l.heartbeat_ms);
    if (s_l.record_trace)
        PUSH("--record-trace=%s", s_l.record_trace);
    unsigned kind = s_kind_bit(a->binary);
    if (kind & (K_WORKER | K_SCHEDULER))
        PUSH("--tp-size=%d", s_l.tp_size);
    if (kind & K_REGISTRY)  // its journal survives restarts of the graph in the same run dir
        PUSH("--state-dir=%s/state", s_l.run_dir);
    for (size_t i = 0; i < S_NPASS; i++) {
        if (!(s_pass[i].kinds & kind))
            continue;
        if (s_pass[i].value)
            PUSH("--%s=%s", s_pass[i].name, s_pass[i].value);
        for (size_t k = 0; k < s_pass[i].values.n; k++)
            PUSH("--%s=%s", s_pass[i].name, s_pass[i].values.v[k]);
    }
    for (int i = 0; i < s_l.nactors; i++)
        if (&s_actors[i] != a)
            PUSH("--peer=%s=%s", s_actors[i].name, s_actors[i].endpoint);
#undef PUSH
    return argv;
}

static int s_spawn(s_actor_t *a) {
    char **argv = s_argv(a);
    if (access(argv[0], X_OK) < 0) {
        ls_error(0, "cannot run %s: %s (is the project built? see --bin-dir)", argv[0], strerror(errno));
        for (char **p = argv; *p; p++)
            free(*p);
        free(argv);
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        // If the launcher dies without stopping us (SIGKILL), the kernel sends SIGTERM, so no
        // actor outlives it.
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        FILE *log = fopen(a->log_path, "a");
        if (log) {
            dup2(fileno(log), STDOUT_FILENO);
            dup2(fileno(log), STDERR_FILENO);
        }
        signal(SIGPIPE, SIG_DFL);
        // Tensor-parallel workers: NCCL's NVLink multicast (NVLS) stays off, as the lent
        // multi-GPU hosts need (it wants a fabric set-up they do not have).
        if (!strcmp(a->binary, "worker"))
            setenv("NCCL_NVLS_ENABLE", "0", 1);
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    for (char **p = argv; *p; p++)
        free(*p);
    free(argv);
    if (pid < 0) {
        ls_error(0, "fork for %s failed: %s", a->name, strerror(errno));
        return -1;
    }
    a->pid = pid;
    ev_child_init(&a->child, s_child_cb, pid, 0);
    a->child.data = a;
    ev_child_start(ls_actor_loop(s_l.self), &a->child);
    ls_info(0, "started %s (pid %d), log %s", a->name, (int)pid, a->log_path);
    return 0;
}

static int s_running(void) {
    int n = 0;
    for (int i = 0; i < s_l.nactors; i++)
        n += s_actors[i].pid > 0 && !s_actors[i].exited;
    return n;
}

// Reap what has exited, without blocking; libev's own child watcher may have reaped some.
static void s_reap(void) {
    for (int i = 0; i < s_l.nactors; i++) {
        s_actor_t *a = &s_actors[i];
        if (a->pid > 0 && !a->exited) {
            int status;
            pid_t r = waitpid(a->pid, &status, WNOHANG);
            if (r == a->pid || (r < 0 && errno == ECHILD))
                a->exited = 1;
        }
    }
}

static void s_wait_all(double seconds) {
    for (int i = 0; i < (int)(seconds * 20) && s_running(); i++) {
        usleep(50000);
        s_reap();
    }
}

static void s_signal_all(int sig) {
    for (int i = 0; i < s_l.nactors; i++)
        if (s_actors[i].pid > 0 && !s_actors[i].exited)
            kill(s_actors[i].pid, sig);
}

// Stop the graph: the Shutdown protocol first (each actor answers its in-flight work), then
// SIGTERM, then SIGKILL, so nothing is left behind whatever state an actor is in. Runs inside
// the runtime's shutdown, while the control socket still works.
static void s_on_shutdown(ls_actor_t *self, void *state) {
    s_l.stopping = 1;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    m.u.shutdown.reason = ls_msg_strdup("the launcher is stopping the graph");
    for (int i = 0; i < s_l.nactors; i++) {
        s_actor_t *a = &s_actors[i];
        if (a->pid > 0 && !a->exited && a->ready) {
            zframe_t *id = zframe_new(a->name, strlen(a->name));
            ls_actor_send(self, ls_actor_router(self), id, &m, NULL);
            zframe_destroy(&id);
        }
    }
    ls_msg_clear(&m);
    // Actors that never said Ready have no control route yet: they get SIGTERM at once.
    for (int i = 0; i < s_l.nactors; i++)
        if (s_actors[i].pid > 0 && !s_actors[i].exited && !s_actors[i].ready)
            kill(s_actors[i].pid, SIGTERM);
    s_wait_all(s_l.shutdown_timeout_s / 2.0);
    if (s_running()) {
        ls_warn(0, "%d actor(s) still running after Shutdown; sending SIGTERM", s_running());
        s_signal_all(SIGTERM);
        s_wait_all(s_l.shutdown_timeout_s / 2.0);
    }
    if (s_running()) {
        for (int i = 0; i < s_l.nactors; i++)
            if (s_actors[i].pid > 0 && !s_actors[i].exited)
                ls_error(0, "%s (pid %d) did not stop; killing it", s_actors[i].name, (int)s_actors[i].pid);
        s_signal_all(SIGKILL);
        s_wait_all(5);
    }
    if (!strcmp(s_l.transport, "ipc"))
        for (int i = 0; i < s_l.nactors; i++)
            unlink(s_actors[i].endpoint + strlen("ipc://"));
    ls_info(0, "graph stopped");
}

static void s_stop(int status, const char *why) {
    if (s_l.stopping)
        return;
    if (status > s_l.exit_status)
        s_l.exit_status = status;
    ls_actor_shutdown(s_l.self, why);
}

// Show the end of a dead actor's log so the cause is on the console, not only in the file.
static void s_print_log_tail(const s_actor_t *a, int lines) {
    FILE *f = fopen(a->log_path, "r");
    if (!f)
        return;
    char ring[8][512];
    int n = 0;
    while (fgets(ring[n % 8], sizeof ring[0], f))
        n++;
    fclose(f);
    int from = n > lines ? n - lines : 0;
    if (n)
        fprintf(stderr, "--- last lines of %s ---\n", a->log_path);
    for (int i = from; i < n; i++)
        fputs(ring[i % 8], stderr);
}

static void s_child_cb(struct ev_loop *loop, ev_child *w, int revents) {
    s_actor_t *a = w->data;
    ev_child_stop(loop, w);
    a->exited = 1;
    if (s_l.stopping)
        return;
    char how[128];
    if (WIFSIGNALED(w->rstatus))
        snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(w->rstatus), strsignal(WTERMSIG(w->rstatus)));
    else
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(w->rstatus));
    ls_error(0, "actor %s (pid %d) %s%s; stopping the graph", a->name, (int)a->pid, how,
             a->ready ? "" : " before it was ready");
    s_print_log_tail(a, 5);
    char why[256];
    snprintf(why, sizeof why, "actor %s %s", a->name, how);
    s_stop(1, why);
}

static int s_write_graph(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "run_dir", s_l.run_dir);
    cJSON_AddStringToObject(root, "transport", s_l.transport);
    cJSON_AddStringToObject(root, "control", s_l.control);
    cJSON_AddNumberToObject(root, "launcher_pid", getpid());
    cJSON *list = cJSON_AddArrayToObject(root, "actors");
    for (int i = 0; i < s_l.nactors; i++) {
        s_actor_t *a = &s_actors[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", a->name);
        cJSON_AddStringToObject(o, "kind", a->binary);
        cJSON_AddNumberToObject(o, "pid", a->pid);
        cJSON_AddNumberToObject(o, "rank", a->rank);
        cJSON *eps = cJSON_AddObjectToObject(o, "endpoints");
        cJSON_AddStringToObject(eps, "router", a->endpoint);
        cJSON_AddStringToObject(o, "log", a->log_path);
        cJSON_AddItemToArray(list, o);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/graph.json", s_l.run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    // Written whole then renamed, so a reader never sees half a file.
    FILE *f = fopen(tmp, "w");
    int rc = -1;
    if (f && fputs(text, f) >= 0 && fputc('\n', f) != EOF && fclose(f) == 0)
        rc = rename(tmp, path);
    else if (f)
        fclose(f);
    free(text);
    if (rc < 0)
        ls_error(0, "cannot write %s: %s", path, strerror(errno));
    return rc;
}

static const char *s_pass_value(const char *name) {
    for (size_t i = 0; i < S_NPASS; i++)
        if (!strcmp(s_pass[i].name, name))
            return s_pass[i].value;
    return NULL;
}

static void s_print_banner(void) {
    s_actor_t *tok = s_find("tokenizer");
    // The gateway's own defaults when the flags were not given; with --port 0 the port it took
    // is in its log ("listening on ...").
    const char *host = s_pass_value("host") ? s_pass_value("host") : "127.0.0.1";
    const char *port = s_pass_value("port") ? s_pass_value("port") : "30000";
    if (!strcmp(port, "0"))
        port = "PORT";
    fprintf(stderr,
            "\nloraserve is up: %d actors ready.\n"
            "  HTTP (OpenAI and SGLang APIs): http://%s:%s/v1   (try: curl http://%s:%s/v1/models)\n"
            "  clients (C SDK) connect to the tokenizer: %s\n"
            "  graph: %s/graph.json   logs: %s/logs/\n"
            "  Ctrl-C stops the graph.\n\n",
            s_l.nactors, host, port, host, port, tok ? tok->endpoint : "?", s_l.run_dir, s_l.run_dir);
}

static int s_on_ready(ls_actor_t *self, ls_in_t *in, void *state) {
    const char *name = in->msg->u.ready.actor ? in->msg->u.ready.actor : "";
    s_actor_t *a = s_find(name);
    if (!a || strcmp(in->from, name) != 0) {
        ls_warn(0, "Ready from unknown actor \"%s\" (identity %s) ignored", name, in->from);
        return 0;
    }
    if (!a->ready) {
        a->ready = 1;
        a->last_heartbeat_ns = in->now_ns;
        s_l.nready++;
        ls_info(0, "%s is ready (%d/%d)", a->name, s_l.nready, s_l.nactors);
    }
    if (s_l.nready == s_l.nactors && !s_l.up) {
        s_l.up = 1;
        if (s_write_graph() < 0) {
            s_stop(1, "cannot write graph.json");
            return 0;
        }
        s_print_banner();
    }
    return 0;
}

static int s_on_heartbeat(ls_actor_t *self, ls_in_t *in, void *state) {
    s_actor_t *a = s_find(in->from);
    if (a) {
        a->last_heartbeat_ns = in->now_ns;
        a->silent_warned = 0;
    }
    return 0;
}

static void s_ready_timeout_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    if (s_l.up)
        return;
    char missing[1024] = "";
    for (int i = 0; i < s_l.nactors; i++)
        if (!s_actors[i].ready) {
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, "%s%.31s", len ? ", " : "", s_actors[i].name);
            ls_error(0, "%s is not ready; its log: %s", s_actors[i].name, s_actors[i].log_path);
        }
    ls_error(0, "not ready after %d s: %s", s_l.ready_timeout_s, missing);
    s_stop(1, "actors did not become ready in time");
}

// An actor that stops sending Heartbeats is stuck (or its loop is blocked): say so once.
static void s_liveness_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    uint64_t now = ls_actor_now_ns(self), limit = (uint64_t)s_l.heartbeat_ms * 10 * 1000000ull;
    for (int i = 0; i < s_l.nactors; i++) {
        s_actor_t *a = &s_actors[i];
        if (a->ready && !a->exited && !a->silent_warned && now - a->last_heartbeat_ns > limit) {
            ls_warn(0, "no heartbeat from %s for %.1f s", a->name, (double)(now - a->last_heartbeat_ns) / 1e9);
            a->silent_warned = 1;
        }
    }
}

static int s_on_start(ls_actor_t *self, void *state) {
    s_l.self = self;
    for (int i = 0; i < s_l.nactors; i++)
        if (s_spawn(&s_actors[i]) < 0) {
            s_l.exit_status = 1;
            return -1;
        }
    ls_actor_timer_start(self, s_l.ready_timeout_s * 1000.0, 0, s_ready_timeout_cb, NULL);
    if (s_l.heartbeat_ms > 0)
        ls_actor_timer_start(self, s_l.heartbeat_ms, s_l.heartbeat_ms, s_liveness_cb, NULL);
    return 0;
}

static int s_make_dirs(void) {
    if (!s_l.run_dir) {
        char tmpl[] = "/tmp/loraserve-XXXXXX";
        if (!mkdtemp(tmpl)) {
            ls_error(0, "cannot create a run directory: %s", strerror(errno));
            return -1;
        }
        s_l.run_dir = strdup(tmpl);
    } else if (mkdir(s_l.run_dir, 0755) < 0 && errno != EEXIST) {
        ls_error(0, "cannot create --run-dir %s: %s", s_l.run_dir, strerror(errno));
        return -1;
    }
    char *real = realpath(s_l.run_dir, NULL);
    if (real) {
        free(s_l.run_dir);
        s_l.run_dir = real;
    }
    const char *subs[] = {"logs", "sock", "state"};
    for (size_t i = 0; i < 3; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", s_l.run_dir, subs[i]);
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            ls_error(0, "cannot create %s: %s", path, strerror(errno));
            return -1;
        }
    }
    // A stale graph.json from an earlier run must not look like this run being up.
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/graph.json", s_l.run_dir);
    unlink(path);
    return 0;
}

static char *s_exe_dir(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return strdup(".");
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;
    return strdup(exe);
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_READY, s_on_ready},
    {LS_MSG_HEARTBEAT, s_on_heartbeat},
    {0, NULL},
};

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("run-dir", &s_l.run_dir, NULL, "sockets, logs and state go here (default: a new /tmp/loraserve-*)"),
        LS_FLAG_INT("tp-size", &s_l.tp_size, "1", "tensor-parallel size: one worker process per GPU"),
        LS_FLAG_STR("transport", &s_l.transport, "ipc", "ipc (one host, sockets in RUN_DIR/sock) or tcp"),
        LS_FLAG_STR("tcp-host", &s_l.tcp_host, "127.0.0.1", "address actors bind with --transport tcp"),
        LS_FLAG_INT("tcp-base-port", &s_l.tcp_base_port, "25500", "first port with --transport tcp (control; actors follow)"),
        LS_FLAG_STR("record-trace", &s_l.record_trace, NULL, "every actor records its messages to DIR/<actor>.trace"),
        LS_FLAG_INT("ready-timeout", &s_l.ready_timeout_s, "120", "seconds to wait for every actor to be Ready"),
        LS_FLAG_INT("shutdown-timeout", &s_l.shutdown_timeout_s, "10", "seconds actors get to stop before being killed"),
        LS_FLAG_INT("actor-heartbeat-ms", &s_l.heartbeat_ms, "1000", "actors' Heartbeat period"),
        LS_FLAG_STR("actor-log-level", &s_l.log_level, "info", "log level passed to every actor"),
        LS_FLAG_STR("bin-dir", &s_l.bin_dir, NULL, "where the loraserve-<actor> binaries are (default: beside this one)"),
        LS_FLAG_END,
    };
    ls_flag_t passed[S_NPASS + 1];
    for (size_t i = 0; i < S_NPASS; i++)
        passed[i] = s_pass[i].list ? (ls_flag_t)LS_FLAG_LIST(s_pass[i].name, &s_pass[i].values, s_pass[i].help)
                                   : (ls_flag_t)LS_FLAG_STR(s_pass[i].name, &s_pass[i].value, NULL, s_pass[i].help);
    passed[S_NPASS] = (ls_flag_t)LS_FLAG_END;
    const ls_actor_def_t def = {
        .name = "launcher",
        .about = "loraserve launcher: starts the actor graph, waits until it is ready, stops it on Ctrl-C.",
        .dispatch = s_dispatch,
        .on_start = s_on_start,
        .on_shutdown = s_on_shutdown,
    };
    // The launcher parses its own flags (not ls_actor_main): the run directory and every
    // endpoint must be planned before its control socket binds.
    ls_flag_t *tables[] = {flags, passed, NULL};
    char err[512];
    ls_log_init("launcher", LS_LOG_INFO);
    int rc = ls_flags_parse(tables, argc, argv, err, sizeof err);
    if (rc == 1) {
        ls_flags_usage(tables, "loraserve", def.about);
        return 0;
    }
    if (rc < 0) {
        ls_error(0, "%s", err);
        return 2;
    }
    if (strcmp(s_l.transport, "ipc") && strcmp(s_l.transport, "tcp")) {
        ls_error(0, "--transport must be ipc or tcp, not \"%s\"", s_l.transport);
        return 2;
    }
    if (!s_l.bin_dir)
        s_l.bin_dir = s_exe_dir();
    if (s_make_dirs() < 0 || s_plan() < 0)
        return 1;
    ls_info(0, "run dir %s, %d actors, transport %s", s_l.run_dir, s_l.nactors, s_l.transport);

    ls_actor_opts_t opts = {.name = "launcher", .bind = s_l.control, .heartbeat_ms = 0, .process = 1};
    zsys_handler_set(NULL);
    ls_actor_t *self = ls_actor_new(&def, &opts);
    if (!self)
        return 1;
    if (ls_actor_run(self) < 0)
        s_on_shutdown(self, NULL);  // a spawn failed: stop whatever did start
    ls_actor_destroy(&self);
    return s_l.exit_status;
}
