// loraserve-launch — spawns and supervises the actor graph (run through launch/loraserve).
//
// It is an actor itself ("launcher"): it binds the control endpoint that every actor connects
// to. Accepts: Ready (an actor finished init), Heartbeat (liveness). Emits: Shutdown (to each
// actor when the graph stops), PeerStatus (to every Ready actor when one goes down or is Ready
// again). It writes RUN_DIR/graph.json once every actor is Ready (again after each restart).
//
// Supervision, one-for-one as an OTP supervisor: once the graph is up, an actor that dies, or
// that sends no Heartbeat for --hang-timeout-ms (it is then killed), is restarted alone, after
// a back-off that doubles with each failure in a row; the others hear PeerStatus and answer or
// re-send what depended on it. More than --max-restarts restarts within --restart-window
// seconds stops the whole graph with that reason, as does a death before the graph was first
// up (a broken configuration restarts no better). It stops the graph — Shutdown, then SIGTERM,
// then SIGKILL — on Ctrl-C/SIGTERM and on a Ready timeout (naming the actors that did not come
// up) too.
//
// Several hosts (--nnodes M, one launcher per host, all given the same graph flags): each
// launcher starts and supervises the actors placed on its node (s_plan), exactly as above.
// Node 0's launcher holds the graph's readiness: node K's launcher ("launcher-K") connects to
// node 0's control endpoint (--dist-init-addr) as its own control, reports each of its actors
// Ready or down (ActorStatus) and heartbeats; node 0 sends PeerStatus to its actors and to
// launcher-K, which forwards it to node K's. A node silent for --hang-timeout-ms, or whose
// launcher starts anew, has its actors down until they report Ready again. Node 0 answers each
// of node K's heartbeats; node K finding node 0 silent as long, or started anew, stops its
// actors and exits 1, for the host's supervisor to start it again.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ev.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ls_actor.h"
#include "ls_limits.h"
#include "ls_curve.h"

#define S_MAX_ACTORS 72
#define S_IPC_PATH_MAX 107  // sun_path in sockaddr_un, less the NUL

typedef struct {
    char name[32];
    char binary[32];  // loraserve-<binary>
    char endpoint[256];
    char log_path[PATH_MAX];
    int rank;
    int group;  // --dp-size > 1: the data-parallel group of a scheduler or worker; else -1
    int node;   // the node (--node-rank) that runs it
    pid_t pid;  // this node's actors only: a remote actor is never signalled from here
    pid_t remote_pid;  // node 0: a remote actor's pid on its node, for graph.json
    int ready;
    int exited;
    uint64_t last_heartbeat_ns;
    ev_child child;
    // supervision
    int restarts;          // times restarted
    int streak;            // failures in a row (the back-off's exponent); 0 once it stays up
    int hung;              // killed for its silence: its death says so
    int collateral;        // killed because its tensor-parallel group lost a rank: no budget
    uint64_t spawned_ns;   // the loop time of its (re)start
    uint64_t ready_ns;     // the loop time of its last Ready
    uint64_t down_ns;      // when it was found dead, for the recovery time in the log
    ls_timer_t *restart;   // the back-off's timer, while waiting to restart
} s_actor_t;

#define S_BACKOFF_MIN_MS 250   // first restart of an actor that was up
#define S_BACKOFF_MAX_MS 8000  // the back-off doubles per failure in a row up to this
#define S_MAX_BUDGET 1024
#define S_MAX_NODES 16

typedef struct {
    char addr[128];             // --node-addrs: where this node's actors bind
    char launcher[32];          // "launcher" on node 0, "launcher-K" on node K
    int alive;                  // node 0: heard from its launcher within --hang-timeout-ms
    uint32_t pid;               // node 0: its launcher's pid (from its Ready): a new one is a restart
    uint64_t last_heartbeat_ns;
} s_node_t;

typedef struct {
    // flags
    char *run_dir, *transport, *tcp_host, *record_trace, *bin_dir, *log_level;
    int tp_size, dp_size, tcp_base_port, ready_timeout_s, shutdown_timeout_s, heartbeat_ms;
    int hang_timeout_ms, max_restarts, restart_window_s;
    int nnodes, node_rank, make_keys;
    char *dist_init_addr, *curve_dir_flag;
    ls_strlist_t node_addrs;
    // state
    ls_actor_t *self;
    char control[256];
    char curve_dir[PATH_MAX];  // tcp: the CURVE keys (RUN_DIR/keys), else empty
    int nactors;
    int nwant;       // actors whose Ready this launcher counts: node 0 all, node K its own
    int nready;
    int up;          // every actor was Ready
    int exit_status; // the launcher's own exit status
    int stopping;
    uint64_t restart_ns[S_MAX_BUDGET];  // loop times of the restarts within the window, a ring
    int nrestart_times, restart_head;
    uint64_t start_ns;      // the loop time at start: node 0's uptime in its heartbeats
    uint64_t pings;         // node 0: heartbeats sent to the other nodes' launchers
    uint64_t upstream_ns;   // node K: when node 0's launcher was last heard from (0: never yet)
    uint64_t upstream_up_ms;  // node K: node 0's launcher's uptime in its last heartbeat
} s_launcher_t;

static s_launcher_t s_l;
static s_node_t s_nodes[S_MAX_NODES];

static int s_local(const void *actor);
static void s_send_to(const char *identity, const ls_msg_t *m);
static void s_forward_status(const ls_msg_t *m);

// Flags the launcher hands on, unchanged, to the actors that take them (SGLang names). Unset
// ones are not passed: each actor's own default applies (the same default wherever a flag is
// shared, e.g. --max-loras-per-batch).
enum { K_REGISTRY = 1, K_WORKER = 2, K_SCHEDULER = 4, K_DETOKENIZER = 8, K_TOKENIZER = 16, K_GATEWAY = 32, K_DISPATCHER = 64 };
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
    {"backend", 0, K_WORKER, "compute backend of the workers: cpu or cuda", NULL, {0}},
    {"max-loras-per-batch", 0, K_WORKER | K_REGISTRY,
     "adapter slots: distinct adapters in one step", NULL, {0}},
    {"max-lora-rank", 0, K_WORKER | K_REGISTRY, "largest adapter rank served", NULL, {0}},
    {"max-loaded-loras", 0, K_WORKER, "most adapters in each worker's CPU tier; 0: as many as its bytes allow", NULL, {0}},
    {"max-cpu-lora-mb", 0, K_WORKER, "host memory for adapters per worker, in MB; 0: 64 adapters of --max-lora-rank, at most 1/4 of RAM", NULL, {0}},
    {"lora-target-modules", 1, K_WORKER | K_REGISTRY, "modules adapters may target (none given: all seven)", NULL, {0}},
    {"kv-cache-mb", 0, K_WORKER, "KV cache size per worker", NULL, {0}},
    {"kv-blocks", 0, K_WORKER, "KV cache blocks per worker (overrides --kv-cache-mb)", NULL, {0}},
    {"block-size", 0, K_WORKER | K_DISPATCHER, "tokens per KV block", NULL, {0}},
    // The scheduler and the workers take these three as well: each checks an adapter's path
    // itself rather than trust whoever sent the load.
    {"lora-paths", 1, K_REGISTRY | K_SCHEDULER | K_WORKER, "adapters loaded at start: name=path or name=path:pinned", NULL, {0}},
    {"lora-dirs", 1, K_REGISTRY | K_SCHEDULER | K_WORKER, "directories whose DIR/name adapters load on their first request", NULL, {0}},
    {"lora-roots", 1, K_REGISTRY | K_SCHEDULER | K_WORKER, "where client-given adapter paths may point", NULL, {0}},
    {"lora-eviction-policy", 0, K_SCHEDULER, "adapter slot victim: lru or fifo", NULL, {0}},
    {"max-num-batched-tokens", 0, K_SCHEDULER | K_WORKER,
     "token budget of one step; workers refuse bigger plans",
     NULL, {0}},
    {"max-running-requests", 0, K_SCHEDULER | K_WORKER,
     "requests decoded at once; workers refuse bigger plans",
     NULL, {0}},
    {"chunked-prefill-size", 0, K_SCHEDULER, "prompt tokens of one request per step", NULL, {0}},
    {"max-skip-steps", 0, K_SCHEDULER, "steps a request may be passed over for residency", NULL, {0}},
    {"default-max-new-tokens", 0, K_SCHEDULER, "max_new_tokens when a request gives none", NULL, {0}},
    {"step-timeout-ms", 0, K_SCHEDULER, "a step not answered by then fails its requests", NULL, {0}},
    {"max-waiting-requests", 0, K_SCHEDULER, "requests waiting to run, all tenants; more are answered 429", NULL, {0}},
    {"max-tenant-waiting", 0, K_SCHEDULER, "requests waiting to run for one adapter or the base model; more: 429", NULL, {0}},
    {"max-queued-tokens", 0, K_SCHEDULER, "prompt tokens of the waiting requests together; more: 429", NULL, {0}},
    {"port", 0, K_GATEWAY, "HTTP port of the gateway; 0: any free port, in logs/gateway.log", NULL, {0}},
    {"host", 0, K_GATEWAY, "address the gateway listens on", NULL, {0}},
    {"api-key", 0, K_GATEWAY, "require Authorization: Bearer KEY on every HTTP endpoint but /health (visible in ps: "
                              "prefer --api-key-file or LORASERVE_API_KEY)", NULL, {0}},
    {"api-key-file", 0, K_GATEWAY, "the API key is this file's first line", NULL, {0}},
    {"served-model-name", 0, K_GATEWAY, "the base model's name in the APIs", NULL, {0}},
    {"max-client-requests", 0, K_TOKENIZER, "requests one client (the gateway, an SDK client) may have open at the tokenizer; more: 429", NULL, {0}},
    {"max-connections", 0, K_GATEWAY, "open HTTP connections; more are answered 503", NULL, {0}},
    {"max-header-bytes", 0, K_GATEWAY, "HTTP request line and headers; more is answered 431", NULL, {0}},
    {"max-body-bytes", 0, K_GATEWAY, "HTTP request body; more is answered 413", NULL, {0}},
    {"idle-timeout-ms", 0, K_GATEWAY, "a silent HTTP connection is closed", NULL, {0}},
    {"request-timeout-ms", 0, K_GATEWAY, "an HTTP request must arrive whole within this, else 408", NULL, {0}},
    {"max-request-completions", 0, K_GATEWAY, "completions one request may ask for (prompts x n); more: 400", NULL, {0}},
    {"max-tenant-completions", 0, K_GATEWAY, "HTTP completions in flight for one adapter or the base model; more: 429", NULL, {0}},
};
#define S_NPASS (sizeof s_pass / sizeof *s_pass)

static unsigned s_kind_bit(const char *binary) {
    static const char *kinds[] = {"registry", "worker", "scheduler", "detokenizer", "tokenizer", "gateway", "dispatcher"};
    for (unsigned i = 0; i < 7; i++)
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

// An endpoint of the plan: with tcp, on its node's address at the base port plus the actor's
// index in the plan, the same on every node.
static int s_endpoint(char *out, size_t cap, const char *name, int node, int index) {
    if (!strcmp(s_l.transport, "tcp")) {
        snprintf(out, cap, "tcp://%s:%d", s_nodes[node].addr, s_l.tcp_base_port + index);
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

// The graph: the front actors once; per data-parallel group a scheduler and its --tp-size
// workers. With --dp-size 1 the group's actors are "scheduler" and "worker-R", as always; with
// N > 1 they are "scheduler-G" and "worker-G-R", and a dispatcher fronts the groups.
// Placement over --nnodes M (every node computes the same): the front on node 0, group G with
// its scheduler and tensor-parallel workers on node G % M (round-robin: the groups spread
// evenly, node 0 takes the extra ones).
static int s_plan(void) {
    const char *order[] = {"registry", "worker", "scheduler", "dispatcher", "detokenizer", "tokenizer", "gateway"};
    int dp = s_l.dp_size, total = 4 + dp * (1 + s_l.tp_size) + (dp > 1);
    // Every actor has every other as a peer.
    if (s_l.tp_size < 1 || dp < 1 || total > S_MAX_ACTORS || total - 1 > LS_MAX_PEERS) {
        ls_error(0, "--tp-size and --dp-size must be at least 1, and the graph at most %d actors (it would have %d)",
                 LS_MAX_PEERS + 1, total);
        return -1;
    }
    if (s_l.nnodes > dp) {
        ls_error(0, "--nnodes %d with --dp-size %d leaves node(s) %d..%d with nothing to run: a node runs whole "
                    "data-parallel groups (give --dp-size at least --nnodes)", s_l.nnodes, dp, dp, s_l.nnodes - 1);
        return -1;
    }
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
        bool grouped = !strcmp(order[k], "worker") || !strcmp(order[k], "scheduler");
        if (!strcmp(order[k], "dispatcher") && dp == 1)
            continue;
        int copies = !strcmp(order[k], "worker") ? dp * s_l.tp_size : grouped ? dp : 1;
        for (int i = 0; i < copies; i++) {
            s_actor_t *a = &s_actors[s_l.nactors];
            snprintf(a->binary, sizeof a->binary, "%s", order[k]);
            int r = strcmp(order[k], "worker") ? 0 : i % s_l.tp_size, g = strcmp(order[k], "worker") ? i : i / s_l.tp_size;
            // Workers always carry their rank, and with groups everything grouped its group;
            // other actors are unique.
            char name[sizeof a->name];
            if (grouped && dp > 1 && !strcmp(order[k], "worker"))
                snprintf(name, sizeof name, "%s-%d-%d", order[k], g, r);
            else if (!strcmp(order[k], "worker"))
                snprintf(name, sizeof name, "%s-%d", order[k], r);
            else if (grouped && dp > 1)
                snprintf(name, sizeof name, "%s-%d", order[k], g);
            else
                snprintf(name, sizeof name, "%s", order[k]);
            memcpy(a->name, name, sizeof name);
            a->rank = r;
            a->group = grouped && dp > 1 ? g : -1;
            a->node = grouped ? g % s_l.nnodes : 0;
            if (s_endpoint(a->endpoint, sizeof a->endpoint, name, a->node, s_l.nactors + 1) < 0)
                return -1;
            snprintf(a->log_path, sizeof a->log_path, "%s/logs/%s.log", s_l.run_dir, name);
            s_l.nactors++;
            s_l.nwant += s_l.node_rank == 0 || a->node == s_l.node_rank;
        }
    }
    // Each node's launcher binds its own control endpoint at the base port of its address.
    return s_endpoint(s_l.control, sizeof s_l.control, "control", s_l.node_rank, 0);
}

static int s_local(const void *actor) { return ((const s_actor_t *)actor)->node == s_l.node_rank; }

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
    if (s_l.node_rank > 0)
        PUSH("--control-key=%s", s_nodes[s_l.node_rank].launcher);
    PUSH("--rank=%d", a->rank);
    PUSH("--log-level=%s", s_l.log_level);
    PUSH("--heartbeat-ms=%d", s_l.heartbeat_ms);
    if (s_l.record_trace)
        PUSH("--record-trace=%s", s_l.record_trace);
    if (s_l.curve_dir[0])  // the directory only: no key is ever on a command line
        PUSH("--curve-dir=%s", s_l.curve_dir);
    unsigned kind = s_kind_bit(a->binary);
    if (kind & (K_WORKER | K_SCHEDULER))
        PUSH("--tp-size=%d", s_l.tp_size);
    // Data-parallel groups: each actor names its own group's peers; the front names the
    // dispatcher as its scheduler; each group's GPUs follow the previous group's.
    if (s_l.dp_size > 1) {
        if (kind & (K_TOKENIZER | K_REGISTRY | K_DETOKENIZER))
            PUSH("--scheduler=dispatcher");
        if (kind & K_SCHEDULER) {
            PUSH("--worker-prefix=worker-%d-", a->group);
            PUSH("--report-ends=true");
        }
        if (kind & K_WORKER) {
            PUSH("--scheduler=scheduler-%d", a->group);
            // The groups of a node number its GPUs from 0.
            PUSH("--device=%d", a->group / s_l.nnodes * s_l.tp_size + a->rank);
        }
        if (kind & K_DISPATCHER)
            PUSH("--dp-size=%d", s_l.dp_size);
    }
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
            s_send_to(a->name, &m);
        }
    }
    // Node 0 stops the whole graph: every node's launcher stops its own actors.
    for (int k = 1; k < s_l.nnodes; k++)
        if (s_nodes[k].alive)
            s_send_to(s_nodes[k].launcher, &m);
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

static void s_actor_down(s_actor_t *a, const char *how);

static void s_child_cb(struct ev_loop *loop, ev_child *w, int revents) {
    s_actor_t *a = w->data;
    ev_child_stop(loop, w);
    a->exited = 1;
    if (s_l.stopping)
        return;
    char how[160];
    if (a->hung)
        snprintf(how, sizeof how, "hung (no heartbeat for %d ms) and was killed", s_l.hang_timeout_ms);
    else if (a->collateral)
        snprintf(how, sizeof how, "was stopped with its tensor-parallel group");
    else if (WIFSIGNALED(w->rstatus))
        snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(w->rstatus), strsignal(WTERMSIG(w->rstatus)));
    else
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(w->rstatus));
    if (!a->collateral)
        s_print_log_tail(a, 5);
    if (!s_l.up) {
        // Before the graph was ever up, a death is a configuration problem a restart repeats.
        ls_error(0, "actor %s (pid %d) %s before the graph was up; stopping the graph", a->name, (int)a->pid, how);
        char why[256];
        snprintf(why, sizeof why, "actor %s %s", a->name, how);
        s_stop(1, why);
        return;
    }
    s_actor_down(a, how);
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
        cJSON_AddNumberToObject(o, "pid", s_local(a) ? a->pid : a->remote_pid);
        cJSON_AddNumberToObject(o, "node", a->node);
        cJSON_AddNumberToObject(o, "rank", a->rank);
        if (a->group >= 0)
            cJSON_AddNumberToObject(o, "group", a->group);
        cJSON_AddNumberToObject(o, "restarts", a->restarts);
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

// --port 0 is resolved here, once, to a free port: a restarted gateway must listen where the
// clients already connect.
static int s_fix_port(void) {
    s_pass_t *port = NULL;
    for (size_t i = 0; i < S_NPASS; i++)
        if (!strcmp(s_pass[i].name, "port"))
            port = &s_pass[i];
    if (!port->value || strcmp(port->value, "0") != 0)
        return 0;
    const char *host = s_pass_value("host") ? s_pass_value("host") : "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    if (getaddrinfo(host, "0", &hints, &ai) != 0) {
        ls_error(0, "--host %s: cannot resolve it", host);
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), bound = -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (fd >= 0 && bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    if (bound <= 0) {
        ls_error(0, "--port 0: cannot find a free port on %s: %s", host, strerror(errno));
        return -1;
    }
    free(port->value);
    if (asprintf(&port->value, "%d", bound) < 0)
        return -1;
    return 0;
}

// tcp: a CURVE keypair for every actor, each node's launcher and clients (the SDK). Fresh ones
// in RUN_DIR/keys by default; with --curve-dir the ones there (made once by --make-keys and
// copied to every node: the nodes of one graph share them). A bind beyond loopback is said out
// loud.
static int s_make_keys(void) {
    if (strcmp(s_l.transport, "tcp") != 0)
        return 0;
    const char *host = s_nodes[s_l.node_rank].addr;
    if (strncmp(host, "127.", 4) && strcmp(host, "localhost") && strcmp(host, "::1") && !s_l.make_keys)
        ls_warn(0, "--tcp-host %s is not a loopback address: the actors' ports are open to the network (CURVE "
                   "keeps out peers without the graph's keys; firewall them all the same)", host);
    const char *names[S_MAX_ACTORS + S_MAX_NODES + 1];
    int n = 0;
    for (int i = 0; i < s_l.nactors; i++)
        names[n++] = s_actors[i].name;
    for (int k = 0; k < s_l.nnodes; k++)
        names[n++] = s_nodes[k].launcher;
    names[n++] = "client";
    char err[512];
    if (!s_l.curve_dir_flag || s_l.make_keys) {
        if (s_l.curve_dir_flag)
            snprintf(s_l.curve_dir, sizeof s_l.curve_dir, "%s", s_l.curve_dir_flag);
        else
            snprintf(s_l.curve_dir, sizeof s_l.curve_dir, "%s/keys", s_l.run_dir);
        if (ls_curve_make(s_l.curve_dir, names, n, err, sizeof err) < 0) {
            ls_error(0, "%s", err);
            return -1;
        }
        if (s_l.make_keys)
            fprintf(stderr, "made %d CURVE keypairs in %s; copy the directory (mode 0700) to every node and give "
                            "each launcher --curve-dir\n", n, s_l.curve_dir);
        return 0;
    }
    char *real = realpath(s_l.curve_dir_flag, NULL);
    snprintf(s_l.curve_dir, sizeof s_l.curve_dir, "%s", real ? real : s_l.curve_dir_flag);
    free(real);
    for (int i = 0; i < n; i++) {
        char sec[PATH_MAX + 64], pub[PATH_MAX + 64];
        snprintf(sec, sizeof sec, "%s/secret/%s.key", s_l.curve_dir, names[i]);
        snprintf(pub, sizeof pub, "%s/public/%s.pub", s_l.curve_dir, names[i]);
        if (access(sec, R_OK) < 0 || access(pub, R_OK) < 0) {
            ls_error(0, "--curve-dir %s has no key for %s: make the graph's keys with loraserve --make-keys "
                        "--curve-dir DIR and the same --dp-size, --tp-size and --nnodes", s_l.curve_dir, names[i]);
            return -1;
        }
    }
    return 0;
}

// --nnodes, --node-rank, --node-addrs, --dist-init-addr: each node's address and launcher.
static int s_nodes_setup(void) {
    int m = s_l.nnodes;
    if (m < 1 || m > S_MAX_NODES || s_l.node_rank < 0 || s_l.node_rank >= m) {
        ls_error(0, "--nnodes must be 1..%d and --node-rank 0..nnodes-1", S_MAX_NODES);
        return -1;
    }
    for (int k = 0; k < m; k++)
        snprintf(s_nodes[k].launcher, sizeof s_nodes[k].launcher, k ? "launcher-%d" : "launcher", k);
    if (m == 1) {
        snprintf(s_nodes[0].addr, sizeof s_nodes[0].addr, "%s", s_l.tcp_host ? s_l.tcp_host : "127.0.0.1");
        return 0;
    }
    if (strcmp(s_l.transport, "tcp")) {
        ls_error(0, "--nnodes %d needs --transport tcp: the links between hosts are tcp, CURVE-authenticated "
                    "(ipc sockets reach one host only)", m);
        return -1;
    }
    // "A B" or "A,B": split every value at its commas.
    int naddrs = 0;
    for (size_t i = 0; i < s_l.node_addrs.n; i++)
        for (char *save = NULL, *tok = strtok_r(s_l.node_addrs.v[i], ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (naddrs < S_MAX_NODES)
                snprintf(s_nodes[naddrs++].addr, sizeof s_nodes[0].addr, "%s", tok);
    if (naddrs != m) {
        ls_error(0, "--nnodes %d needs --node-addrs with %d addresses, node 0's first (the same list on every node; "
                    "node K's actors bind on its address)", m, m);
        return -1;
    }
    if (!s_l.curve_dir_flag) {
        ls_error(0, "--nnodes %d needs --curve-dir: the nodes share one set of CURVE keys (loraserve --make-keys)", m);
        return -1;
    }
    if (s_l.tcp_host && strcmp(s_l.tcp_host, s_nodes[s_l.node_rank].addr)) {
        ls_error(0, "--tcp-host %s is not node %d's address in --node-addrs (%s)", s_l.tcp_host, s_l.node_rank,
                 s_nodes[s_l.node_rank].addr);
        return -1;
    }
    // --dist-init-addr is node 0's launcher: its address and the base port every node uses.
    if (s_l.dist_init_addr) {
        const char *colon = strrchr(s_l.dist_init_addr, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (!colon || port <= 0 || port > 65535 || (size_t)(colon - s_l.dist_init_addr) != strlen(s_nodes[0].addr) ||
            strncmp(s_l.dist_init_addr, s_nodes[0].addr, (size_t)(colon - s_l.dist_init_addr))) {
            ls_error(0, "--dist-init-addr %s must be HOST:PORT with HOST node 0's address in --node-addrs (%s)",
                     s_l.dist_init_addr, s_nodes[0].addr);
            return -1;
        }
        s_l.tcp_base_port = port;
    }
    return 0;
}

// An --api-key given to the launcher goes to the gateway in a file (RUN_DIR/keys/api-key,
// 0600), so that at least the gateway's command line does not show it.
static int s_hide_api_key(void) {
    s_pass_t *key = NULL, *file = NULL;
    for (size_t i = 0; i < S_NPASS; i++) {
        if (!strcmp(s_pass[i].name, "api-key"))
            key = &s_pass[i];
        if (!strcmp(s_pass[i].name, "api-key-file"))
            file = &s_pass[i];
    }
    if (!key->value)
        return 0;
    ls_warn(0, "--api-key on the command line is visible in ps; use --api-key-file or LORASERVE_API_KEY");
    if (file->value) {
        ls_error(0, "give --api-key or --api-key-file, not both");
        return -1;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/keys/api-key", s_l.run_dir);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    size_t n = strlen(key->value);
    if (fd < 0 || write(fd, key->value, n) != (ssize_t)n || close(fd) < 0) {
        ls_error(0, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    free(key->value);
    key->value = NULL;
    file->value = strdup(path);
    return file->value ? 0 : -1;
}

static void s_print_banner(void) {
    s_actor_t *tok = s_find("tokenizer");
    // The gateway's own defaults when the flags were not given (--port 0 was resolved at start).
    const char *host = s_pass_value("host") ? s_pass_value("host") : "127.0.0.1";
    const char *port = s_pass_value("port") ? s_pass_value("port") : "30000";
    fprintf(stderr,
            "\nloraserve is up: %d actors ready.\n"
            "  HTTP (OpenAI and SGLang APIs): http://%s:%s/v1   (try: curl http://%s:%s/v1/models)\n"
            "  clients (C SDK) connect to the tokenizer: %s\n"
            "  graph: %s/graph.json   logs: %s/logs/\n"
            "  Ctrl-C stops the graph.\n\n",
            s_l.nactors, host, port, host, port, tok ? tok->endpoint : "?", s_l.run_dir, s_l.run_dir);
}

static void s_broadcast_status(const s_actor_t *a, int up, const char *reason);
static void s_report(const s_actor_t *a, int up, const char *reason);
static void s_announce(const s_actor_t *a, int up, const char *reason);

// Every actor this launcher counts is Ready: node 0's graph is whole; node K's share is up.
static void s_whole(void) {
    if (s_l.nready != s_l.nwant)
        return;
    if (s_write_graph() < 0) {
        s_stop(1, "cannot write graph.json");
        return;
    }
    if (s_l.up)
        ls_info(0, "the graph is whole again");
    else if (s_l.node_rank > 0)
        fprintf(stderr, "\nloraserve node %d is up: its %d actors ready; the graph is Ready once node 0 (%s) has "
                        "every node's.\n  graph: %s/graph.json   logs: %s/logs/\n\n",
                s_l.node_rank, s_l.nwant, s_nodes[0].addr, s_l.run_dir, s_l.run_dir);
    else
        s_print_banner();
    s_l.up = 1;
}

static int s_node_of(const char *launcher) {
    for (int k = 1; k < s_l.nnodes; k++)
        if (!strcmp(s_nodes[k].launcher, launcher))
            return k;
    return -1;
}

// Node 0: a remote actor is down (its node said so, went silent, or started anew).
static void s_remote_down(s_actor_t *a, const char *reason, uint64_t now) {
    if (!a->ready)
        return;
    a->ready = 0;
    a->down_ns = now;
    s_l.nready--;
    ls_error(0, "%s on node %d (%s) is down: %s", a->name, a->node, s_nodes[a->node].addr, reason);
    s_broadcast_status(a, 0, reason);
}

static void s_node_down(int k, const char *why, uint64_t now) {
    ls_error(0, "node %d (%s) %s: its actors are down until it reports them Ready again", k, s_nodes[k].addr, why);
    char reason[200];
    snprintf(reason, sizeof reason, "node %d (%s) %s", k, s_nodes[k].addr, why);
    for (int i = 0; i < s_l.nactors; i++)
        if (s_actors[i].node == k)
            s_remote_down(&s_actors[i], reason, now);
}

// Node 0's Heartbeat to node K's launcher: seq 0 asks for the state of its actors; seq > 0
// answers one of its heartbeats, so node K hears node 0's silence too. The uptime tells node K
// a new launcher from the one its actors joined.
static void s_ping(int k, uint64_t seq, uint64_t now) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_HEARTBEAT);
    m.u.heartbeat.actor = ls_msg_strdup("launcher");
    m.u.heartbeat.seq = seq;
    m.u.heartbeat.uptime_ms = (now - s_l.start_ns) / 1000000;
    s_send_to(s_nodes[k].launcher, &m);
    ls_msg_clear(&m);
}

// Node 0 heard from node K's launcher. The first word after silence asks it for the state of
// its actors, which it answers with an ActorStatus for each Ready one.
static void s_node_heard(int k, uint64_t now) {
    s_nodes[k].last_heartbeat_ns = now;
    if (s_nodes[k].alive)
        return;
    s_nodes[k].alive = 1;
    ls_info(0, "node %d (%s) is connected (its launcher: pid %u)", k, s_nodes[k].addr, s_nodes[k].pid);
    s_ping(k, 0, now);
}

// Node K: node 0's launcher is gone (silent, or a new one). This node's actors joined a graph
// that no longer exists, so they stop, and this launcher exits 1 for the host's supervisor
// (systemd, Kubernetes) to start it again; the new one starts its actors and waits for node 0,
// whose new graph counts them once they report Ready.
static void s_upstream_lost(const char *why) {
    char reason[256];
    snprintf(reason, sizeof reason, "node 0's launcher (%s) %s", s_nodes[0].addr, why);
    ls_error(0, "%s: stopping this node's actors and exiting 1 (a supervisor starts this launcher again, which "
                "then waits for node 0)", reason);
    s_stop(1, reason);
}

// Node K heard node 0's launcher: a Heartbeat (whose uptime going back means a new launcher)
// or PeerStatus.
static void s_upstream_heard(const ls_msg_t *m, uint64_t now) {
    if (m->type == LS_MSG_HEARTBEAT) {
        if (s_l.upstream_ns && m->u.heartbeat.uptime_ms < s_l.upstream_up_ms) {
            s_upstream_lost("started anew");
            return;
        }
        s_l.upstream_up_ms = m->u.heartbeat.uptime_ms;
    }
    s_l.upstream_ns = now;
}

static int s_on_ready(ls_actor_t *self, ls_in_t *in, void *state) {
    const char *name = in->msg->u.ready.actor ? in->msg->u.ready.actor : "";
    int k = s_l.node_rank == 0 ? s_node_of(in->from) : -1;
    if (k > 0 && !strcmp(name, in->from)) {
        // Node K's launcher (re)started: whatever its earlier one ran is gone.
        if (s_nodes[k].pid && s_nodes[k].pid != in->msg->u.ready.pid) {
            s_nodes[k].alive = 0;
            s_node_down(k, "has a new launcher", in->now_ns);
        }
        s_nodes[k].pid = in->msg->u.ready.pid;
        s_node_heard(k, in->now_ns);
        return 0;
    }
    s_actor_t *a = s_find(name);
    if (!a || !s_local(a) || strcmp(in->from, name) != 0 || a->exited ||
        (in->msg->u.ready.pid && (pid_t)in->msg->u.ready.pid != a->pid)) {
        ls_warn(0, "Ready from unknown actor \"%s\" (identity %s, pid %u) ignored", name, in->from, in->msg->u.ready.pid);
        return 0;
    }
    if (a->ready)
        return 0;
    a->ready = 1;
    a->ready_ns = a->last_heartbeat_ns = in->now_ns;
    s_l.nready++;
    if (a->restarts)
        ls_info(0, "%s is ready again after restart %d, %.2f s after it went down (%d/%d)", a->name, a->restarts,
                (double)(in->now_ns - a->down_ns) / 1e9, s_l.nready, s_l.nwant);
    else
        ls_info(0, "%s is ready (%d/%d)", a->name, s_l.nready, s_l.nwant);
    s_whole();
    s_announce(a, 1, NULL);
    return 0;
}

// Node 0: node K's launcher reports one of its actors.
static int s_on_actor_status(ls_actor_t *self, ls_in_t *in, void *state) {
    const ls_msg_actor_status_t *st = &in->msg->u.actor_status;
    int k = s_l.node_rank == 0 ? s_node_of(in->from) : -1;
    s_actor_t *a = st->actor ? s_find(st->actor) : NULL;
    if (k < 0 || !a || a->node != k) {
        ls_warn(0, "ActorStatus from %s about \"%s\" ignored: not an actor of that node", in->from,
                st->actor ? st->actor : "");
        return 0;
    }
    s_node_heard(k, in->now_ns);
    if (st->up && a->ready && (pid_t)st->pid != a->remote_pid)
        s_remote_down(a, "restarted on its node", in->now_ns);
    if (!st->up) {
        s_remote_down(a, st->reason ? st->reason : "down on its node", in->now_ns);
        return 0;
    }
    if (a->ready)
        return 0;
    a->ready = 1;
    a->remote_pid = (pid_t)st->pid;
    // Back after being down counts as a restart, whoever restarted it: a new launcher on its
    // node counts from 0, and the actors re-send what a restarted peer lost (restarts > 0).
    a->restarts = a->ready_ns ? a->restarts + 1 : (int)st->restarts;
    a->ready_ns = in->now_ns;
    s_l.nready++;
    ls_info(0, "%s on node %d (%s) is ready (%d/%d)", a->name, k, s_nodes[k].addr, s_l.nready, s_l.nwant);
    s_whole();
    s_broadcast_status(a, 1, NULL);
    return 0;
}

// Node K: PeerStatus from node 0 (the runtime takes it from the control socket only), for
// this node's actors.
static int s_on_peer_status(ls_actor_t *self, ls_in_t *in, void *state) {
    if (s_l.node_rank > 0) {
        s_upstream_heard(in->msg, in->now_ns);
        s_forward_status(in->msg);
    }
    return 0;
}

static int s_on_heartbeat(ls_actor_t *self, ls_in_t *in, void *state) {
    s_actor_t *a = s_find(in->from);
    if (a && s_local(a)) {
        a->last_heartbeat_ns = in->now_ns;
        return 0;
    }
    int k = s_l.node_rank == 0 ? s_node_of(in->from) : -1;
    if (k > 0) {
        s_node_heard(k, in->now_ns);
        s_ping(k, ++s_l.pings, in->now_ns);
    } else if (s_l.node_rank > 0 && !strcmp(in->from, "control")) {
        s_upstream_heard(in->msg, in->now_ns);
        // seq 0: node 0 asks for this node's actors: each Ready one again (it ignores what it
        // knows).
        for (int i = 0; i < s_l.nactors && !in->msg->u.heartbeat.seq && !s_l.stopping; i++)
            if (s_local(&s_actors[i]) && s_actors[i].ready)
                s_report(&s_actors[i], 1, NULL);
    }
    return 0;
}

static void s_ready_timeout_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    if (s_l.up)
        return;
    char missing[1024] = "";
    for (int i = 0; i < s_l.nactors; i++)
        if (!s_actors[i].ready && (s_l.node_rank == 0 || s_local(&s_actors[i]))) {
            const s_actor_t *a = &s_actors[i];
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, "%s%.31s", len ? ", " : "", a->name);
            if (s_local(a))
                ls_error(0, "%s is not ready; its log: %s", a->name, a->log_path);
            else
                ls_error(0, "%s on node %d (%s) is not ready%s; its log there: %s", a->name, a->node,
                         s_nodes[a->node].addr, s_nodes[a->node].pid ? "" : ": that node's launcher never connected",
                         a->log_path);
        }
    ls_error(0, "not ready after %d s: %s", s_l.ready_timeout_s, missing);
    s_stop(1, "actors did not become ready in time");
}

// ---------------------------------------------------------------------------------------------
// supervision

static void s_send_to(const char *identity, const ls_msg_t *m) {
    zframe_t *id = zframe_new(identity, strlen(identity));
    ls_actor_send(s_l.self, ls_actor_router(s_l.self), id, m, NULL);
    zframe_destroy(&id);
}

// PeerStatus to this node's Ready actors.
static void s_forward_status(const ls_msg_t *m) {
    for (int i = 0; i < s_l.nactors; i++) {
        s_actor_t *to = &s_actors[i];
        if (to->ready && !to->exited && s_local(to))
            s_send_to(to->name, m);
    }
}

static void s_broadcast_status(const s_actor_t *a, int up, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_PEER_STATUS);
    m.u.peer_status.actor = ls_msg_strdup(a->name);
    m.u.peer_status.up = up;
    m.u.peer_status.restarts = (uint32_t)a->restarts;
    m.u.peer_status.graph_ready = s_l.nready == s_l.nactors;
    m.u.peer_status.reason = ls_msg_strdup(reason);
    s_forward_status(&m);
    // The other nodes' launchers hand it on to their actors.
    for (int k = 1; k < s_l.nnodes; k++)
        if (s_nodes[k].alive)
            s_send_to(s_nodes[k].launcher, &m);
    ls_msg_clear(&m);
}

// Node K: one of its actors is Ready or down, told to node 0's launcher, which tells the graph.
static void s_report(const s_actor_t *a, int up, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ACTOR_STATUS);
    m.u.actor_status.actor = ls_msg_strdup(a->name);
    m.u.actor_status.up = up;
    m.u.actor_status.pid = (uint32_t)a->pid;
    m.u.actor_status.restarts = (uint32_t)a->restarts;
    m.u.actor_status.reason = ls_msg_strdup(reason);
    ls_actor_send_control(s_l.self, &m);
    ls_msg_clear(&m);
}

// An actor of this node is Ready or down: node 0 tells every actor; node K tells node 0.
static void s_announce(const s_actor_t *a, int up, const char *reason) {
    if (s_l.node_rank > 0)
        s_report(a, up, reason);
    else
        s_broadcast_status(a, up, reason);
}

// The restart budget (OTP's intensity and period): at most --max-restarts within the window.
// Returns 0 and spends one, or -1 when it is spent.
static int s_budget_take(uint64_t now) {
    uint64_t window = (uint64_t)s_l.restart_window_s * 1000000000ull;
    while (s_l.nrestart_times > 0) {
        int oldest = (s_l.restart_head - s_l.nrestart_times + S_MAX_BUDGET) % S_MAX_BUDGET;
        if (now - s_l.restart_ns[oldest] < window)
            break;
        s_l.nrestart_times--;
    }
    if (s_l.nrestart_times >= s_l.max_restarts)
        return -1;
    s_l.restart_ns[s_l.restart_head] = now;
    s_l.restart_head = (s_l.restart_head + 1) % S_MAX_BUDGET;
    s_l.nrestart_times++;
    return 0;
}

static void s_restart_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    s_actor_t *a = arg;
    a->restart = NULL;
    if (s_l.stopping)
        return;
    a->exited = a->ready = a->hung = a->collateral = 0;
    a->restarts++;
    if (s_spawn(a) < 0) {
        s_stop(1, "an actor could not be restarted");
        return;
    }
    a->spawned_ns = ls_actor_now_ns(self);
}

// A dead actor of a graph that was up: tell the others, then restart it after the back-off,
// unless the budget is spent.
static void s_actor_down(s_actor_t *a, const char *how) {
    uint64_t now = ls_actor_now_ns(s_l.self);
    if (a->ready) {
        a->ready = 0;
        s_l.nready--;
    }
    a->down_ns = now;
    // Up for a whole window since its last start: this failure starts a new streak.
    if (a->ready_ns && now - a->ready_ns >= (uint64_t)s_l.restart_window_s * 1000000000ull)
        a->streak = 0;
    if (!a->collateral && s_budget_take(now) < 0) {
        char why[320];
        snprintf(why, sizeof why, "restart budget spent (%d restarts within %d s); last: actor %s %s", s_l.max_restarts,
                 s_l.restart_window_s, a->name, how);
        ls_error(0, "%s; stopping the graph", why);
        s_stop(1, why);
        return;
    }
    int delay_ms = S_BACKOFF_MIN_MS << (a->streak < 5 ? a->streak : 5);
    if (delay_ms > S_BACKOFF_MAX_MS)
        delay_ms = S_BACKOFF_MAX_MS;
    a->streak++;
    ls_error(0, "actor %s (pid %d) %s; restarting it in %d ms (restart %d; %d of %d within %d s)", a->name, (int)a->pid,
             how, delay_ms, a->restarts + 1, s_l.nrestart_times, s_l.max_restarts, s_l.restart_window_s);
    char reason[200];
    snprintf(reason, sizeof reason, "%s %s", a->name, how);
    s_announce(a, 0, reason);
    a->restart = ls_actor_timer_start(s_l.self, delay_ms, 0, s_restart_cb, a);
    // The ranks of a tensor-parallel group meet at every collective: the others would wait on
    // the lost one, so the group restarts together (its own group only, with --dp-size).
    if (!strcmp(a->binary, "worker") && s_l.tp_size > 1)
        for (int i = 0; i < s_l.nactors; i++) {
            s_actor_t *w = &s_actors[i];
            if (w != a && !strcmp(w->binary, "worker") && w->group == a->group && !w->exited && w->pid > 0) {
                w->collateral = 1;
                kill(w->pid, SIGKILL);
            }
        }
}

// Every heartbeat period: a Ready actor silent past --hang-timeout-ms is hung (a stopped
// process, a blocked loop) and is killed, which restarts it; a restarted actor that is not Ready
// within --ready-timeout is killed the same way.
static void s_liveness_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    uint64_t now = ls_actor_now_ns(self), hang = (uint64_t)s_l.hang_timeout_ms * 1000000ull;
    for (int i = 0; i < s_l.nactors; i++) {
        s_actor_t *a = &s_actors[i];
        if (a->exited || a->pid <= 0 || a->hung || s_l.stopping)
            continue;
        if (a->ready && now - a->last_heartbeat_ns > hang) {
            ls_error(0, "no heartbeat from %s (pid %d) for %.1f s: it is hung; killing it", a->name, (int)a->pid,
                     (double)(now - a->last_heartbeat_ns) / 1e9);
            a->hung = 1;
            kill(a->pid, SIGKILL);
        } else if (!a->ready && a->restarts && now - a->spawned_ns > (uint64_t)s_l.ready_timeout_s * 1000000000ull) {
            ls_error(0, "restarted %s (pid %d) is not ready after %d s; killing it", a->name, (int)a->pid,
                     s_l.ready_timeout_s);
            a->hung = 1;
            kill(a->pid, SIGKILL);
        }
    }
    // Node 0: a node whose launcher is silent as long is gone (stopped, crashed, cut off).
    for (int k = 1; k < s_l.nnodes && !s_l.stopping; k++)
        if (s_nodes[k].alive && now - s_nodes[k].last_heartbeat_ns > hang) {
            s_nodes[k].alive = 0;
            char why[96];
            snprintf(why, sizeof why, "is silent for %.1f s", (double)(now - s_nodes[k].last_heartbeat_ns) / 1e9);
            s_node_down(k, why, now);
        }
    // Node K: node 0's launcher silent as long (killed, its host down, cut off). Before its first
    // word this node waits for it, however long.
    if (s_l.node_rank > 0 && s_l.upstream_ns && !s_l.stopping && now - s_l.upstream_ns > hang) {
        char why[96];
        snprintf(why, sizeof why, "is silent for %.1f s", (double)(now - s_l.upstream_ns) / 1e9);
        s_upstream_lost(why);
    }
}

static int s_on_start(ls_actor_t *self, void *state) {
    s_l.self = self;
    s_l.start_ns = ls_actor_now_ns(self);
    for (int i = 0; i < s_l.nactors; i++)
        if (s_local(&s_actors[i]) && s_spawn(&s_actors[i]) < 0) {
            s_l.exit_status = 1;
            return -1;
        }
    ls_actor_timer_start(self, s_l.ready_timeout_s * 1000.0, 0, s_ready_timeout_cb, NULL);
    if (s_l.heartbeat_ms > 0 && s_l.hang_timeout_ms > 0)
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
    // Sockets, journals and keys are this user's alone: another local user can neither
    // connect to an ipc socket nor read a key or the journal.
    const char *subs[] = {"logs", "sock", "state", "keys"};
    const mode_t modes[] = {0755, 0700, 0700, 0700};
    for (size_t i = 0; i < 4; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", s_l.run_dir, subs[i]);
        if ((mkdir(path, modes[i]) < 0 && errno != EEXIST) || chmod(path, modes[i]) < 0) {
            ls_error(0, "cannot create %s (mode %03o): %s", path, modes[i], strerror(errno));
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

// The launcher hands these flags on as text; their type and default belong to the actor that
// takes them (its flag table, shown by its --help). --help asks the actors, so each default is
// written once. Fills shown[i] (kind, def) for s_pass[i], def in defs[i].
enum { S_KINDS = 7 };
static void s_pass_usage(const char *bin_dir, ls_flag_t *shown, char *help[S_KINDS], char (*defs)[160]) {
    static const char *kinds[S_KINDS] = {"registry", "worker", "scheduler", "detokenizer", "tokenizer", "gateway", "dispatcher"};
    for (int k = 0; k < S_KINDS; k++) {
        char cmd[PATH_MAX + 64];
        snprintf(cmd, sizeof cmd, "'%s/loraserve-%s' --help 2>/dev/null", bin_dir, kinds[k]);
        FILE *p = popen(cmd, "r");
        size_t n = 0, cap = 1 << 16;
        help[k] = calloc(cap, 1);
        while (p && help[k] && n + 1 < cap) {
            size_t got = fread(help[k] + n, 1, cap - 1 - n, p);
            if (!got)
                break;
            n += got;
        }
        if (p)
            pclose(p);
    }
    static const struct {
        const char *type;
        ls_flag_kind_t kind;
    } types[] = {{"N ", LS_FLAG_KIND_INT}, {"X ", LS_FLAG_KIND_DOUBLE}, {"TEXT ", LS_FLAG_KIND_STR},
                 {"VALUE... ", LS_FLAG_KIND_LIST}, {" ", LS_FLAG_KIND_BOOL}};
    for (size_t i = 0; i < S_NPASS; i++)
        for (int k = 0; k < S_KINDS; k++) {
            char key[80];
            snprintf(key, sizeof key, "\n  --%s ", s_pass[i].name);
            char *line = (s_pass[i].kinds >> k & 1) && help[k] ? strstr(help[k], key) : NULL;
            if (!line)
                continue;
            line += strlen(key);
            char one[1024];
            snprintf(one, sizeof one, "%.*s", (int)strcspn(line, "\n"), line);
            line = one;
            for (size_t t = 0; t < sizeof types / sizeof *types; t++)
                if (!strncmp(line, types[t].type, strlen(types[t].type))) {
                    shown[i].kind = types[t].kind;
                    break;
                }
            char *def = strstr(line, " (default: ");
            size_t len = def ? strlen(def) : 0;
            if (def && def[len - 1] == ')') {
                snprintf(defs[i], sizeof defs[i], "%.*s", (int)(len - 1 - strlen(" (default: ")),
                         def + strlen(" (default: "));
                shown[i].def = defs[i];
            }
            break;
        }
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_READY, s_on_ready},
    {LS_MSG_HEARTBEAT, s_on_heartbeat},
    {LS_MSG_ACTOR_STATUS, s_on_actor_status},
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {0, NULL},
};

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("run-dir", &s_l.run_dir, NULL, "sockets, logs and state go here (default: a new /tmp/loraserve-*)"),
        LS_FLAG_INT("tp-size", &s_l.tp_size, "1", "tensor-parallel size: one worker process per GPU"),
        LS_FLAG_INT("dp-size", &s_l.dp_size, "1",
                    "data-parallel groups, each a scheduler and --tp-size workers (GPUs G*tp … G*tp+tp-1), "
                    "behind one dispatcher that routes by adapter, prefix and load"),
        LS_FLAG_STR("transport", &s_l.transport, "ipc", "ipc (one host, sockets in RUN_DIR/sock) or tcp"),
        LS_FLAG_STR("tcp-host", &s_l.tcp_host, NULL, "address actors bind with --transport tcp (default: 127.0.0.1; "
                                                     "with --nnodes, this node's in --node-addrs)"),
        LS_FLAG_INT("tcp-base-port", &s_l.tcp_base_port, "25500", "first port with --transport tcp (control; actors follow)"),
        LS_FLAG_INT("nnodes", &s_l.nnodes, "1",
                    "hosts the graph spans, one launcher each with the same graph flags (needs --transport tcp, "
                    "--node-addrs, --curve-dir): the front and groups G % nnodes == 0 on node 0, group G on node "
                    "G % nnodes"),
        LS_FLAG_INT("node-rank", &s_l.node_rank, "0", "this host's node, 0..nnodes-1"),
        LS_FLAG_LIST("node-addrs", &s_l.node_addrs,
                     "every node's address (A B ... or A,B,...), node 0's first, the same on every node: node K's actors bind there"),
        LS_FLAG_STR("dist-init-addr", &s_l.dist_init_addr, NULL,
                    "node 0's launcher, HOST:PORT (default: the first --node-addrs at --tcp-base-port): the other "
                    "nodes report to it; PORT is every node's base port"),
        LS_FLAG_STR("curve-dir", &s_l.curve_dir_flag, NULL,
                    "tcp: the graph's CURVE keys, made by --make-keys (default: fresh ones in RUN_DIR/keys)"),
        LS_FLAG_BOOL("make-keys", &s_l.make_keys,
                     "write the graph's CURVE keys into --curve-dir (for these --dp-size, --tp-size, --nnodes) and exit"),
        LS_FLAG_STR("record-trace", &s_l.record_trace, NULL, "every actor records its messages to DIR/<actor>.trace"),
        LS_FLAG_INT("ready-timeout", &s_l.ready_timeout_s, "120", "seconds to wait for every actor to be Ready"),
        LS_FLAG_INT("shutdown-timeout", &s_l.shutdown_timeout_s, "10", "seconds actors get to stop before being killed"),
        LS_FLAG_INT("actor-heartbeat-ms", &s_l.heartbeat_ms, "500", "actors' Heartbeat period"),
        LS_FLAG_INT("hang-timeout-ms", &s_l.hang_timeout_ms, "3000",
                    "a Ready actor with no Heartbeat this long is hung: killed and restarted (0: never)"),
        LS_FLAG_INT("max-restarts", &s_l.max_restarts, "5",
                    "restarts allowed within --restart-window; one more stops the graph (0: any death stops it)"),
        LS_FLAG_INT("restart-window", &s_l.restart_window_s, "60", "seconds over which --max-restarts counts"),
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
        ls_flag_t shown[S_NPASS + 1];
        memcpy(shown, passed, sizeof shown);
        char *help[S_KINDS], defs[S_NPASS][160];
        char *dir = s_l.bin_dir ? strdup(s_l.bin_dir) : s_exe_dir();
        s_pass_usage(dir, shown, help, defs);
        ls_flag_t *usage[] = {flags, shown, NULL};
        ls_flags_usage(usage, "loraserve", def.about);
        for (int k = 0; k < S_KINDS; k++)
            free(help[k]);
        free(dir);
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
    if (s_l.max_restarts < 0 || s_l.max_restarts > S_MAX_BUDGET || s_l.restart_window_s < 1 || s_l.hang_timeout_ms < 0 ||
        (s_l.hang_timeout_ms > 0 && s_l.hang_timeout_ms < 2 * s_l.heartbeat_ms)) {
        ls_error(0, "--max-restarts must be 0..%d, --restart-window at least 1, and --hang-timeout-ms 0 or at least "
                    "two --actor-heartbeat-ms periods", S_MAX_BUDGET);
        return 2;
    }
    if (!s_l.bin_dir)
        s_l.bin_dir = s_exe_dir();
    if (s_l.make_keys) {
        // The plan names the keys; nothing is started.
        if (!s_l.curve_dir_flag || strcmp(s_l.transport, "tcp")) {
            ls_error(0, "--make-keys needs --curve-dir DIR and --transport tcp");
            return 2;
        }
        return s_nodes_setup() < 0 || s_plan() < 0 || s_make_keys() < 0;
    }
    if (s_nodes_setup() < 0)
        return 2;
    if (s_make_dirs() < 0 || s_plan() < 0 || s_fix_port() < 0 || s_make_keys() < 0 || s_hide_api_key() < 0)
        return 1;
    if (s_l.nnodes > 1)
        ls_log_init(s_nodes[s_l.node_rank].launcher, LS_LOG_INFO);
    int nlocal = 0;
    for (int i = 0; i < s_l.nactors; i++)
        nlocal += s_local(&s_actors[i]);
    ls_info(0, "run dir %s, %d actors (%d on this node, %d of %d), transport %s", s_l.run_dir, s_l.nactors, nlocal,
            s_l.node_rank, s_l.nnodes, s_l.transport);

    // Node K's launcher is launcher-K, and node 0's launcher its control: Ready, Heartbeat and
    // ActorStatus go there; PeerStatus and Shutdown come from there.
    char upstream[300];
    snprintf(upstream, sizeof upstream, "tcp://%s:%d", s_nodes[0].addr, s_l.tcp_base_port);
    int remote = s_l.node_rank > 0;
    ls_actor_opts_t opts = {.name = s_nodes[s_l.node_rank].launcher, .bind = s_l.control,
                            .control = remote ? upstream : NULL, .heartbeat_ms = remote ? s_l.heartbeat_ms : 0,
                            .process = 1, .curve_dir = s_l.curve_dir[0] ? s_l.curve_dir : NULL};
    zsys_handler_set(NULL);
    ls_actor_t *self = ls_actor_new(&def, &opts);
    if (!self)
        return 1;
    if (ls_actor_run(self) < 0)
        s_on_shutdown(self, NULL);  // a spawn failed: stop whatever did start
    ls_actor_destroy(&self);
    return s_l.exit_status;
}
