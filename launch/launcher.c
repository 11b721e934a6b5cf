// loraserve-launch — spawns and supervises the actor graph (run through launch/loraserve).
//
// It is an actor itself ("launcher"): it binds the control endpoint that every actor connects
// to. Accepts: Ready (an actor finished init), Heartbeat (liveness), LoadProgress (a worker's
// loads, shown on the console: progress.h). Emits: Shutdown (to each
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
// launcher starts and supervises the actors placed on its node (plan_build), exactly as above;
// a tensor-parallel group split over nodes restarts together, each launcher stopping its own
// ranks when it hears that another node's rank is down (nodes.c).
// Node 0's launcher holds the graph's readiness: node K's launcher ("launcher-K") connects to
// node 0's control endpoint (--dist-init-addr) as its own control, reports each of its actors
// Ready or down (ActorStatus) and heartbeats; node 0 sends PeerStatus to its actors and to
// launcher-K, which forwards it to node K's. A node silent for --hang-timeout-ms, or whose
// launcher starts anew, has its actors down until they report Ready again. Node 0 answers each
// of node K's heartbeats; node K finding node 0 silent as long, or started anew, stops its
// actors and exits 1, for the host's supervisor to start it again.
//
// This file holds the flags (the launcher's own, those it hands on, and --help), the run
// directory, starting and stopping the graph, its readiness and the supervision of this node's
// actors. plan.c plans the graph (names, endpoints, placement, argv, graph.json, CURVE keys);
// nodes.c carries the links between the nodes' launchers and the PeerStatus the actors hear.
// launcher_impl.h is what the three share.
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

#include "launcher_impl.h"
#include "lora_spec.h"
#include "ls_actor.h"
#include "progress.h"

#define S_BACKOFF_MIN_MS 250   // first restart of an actor that was up
#define S_BACKOFF_MAX_MS 8000  // the back-off doubles per failure in a row up to this

launcher_t launcher_state;
launcher_node_t launcher_nodes[LAUNCHER_MAX_NODES];
launcher_actor_t launcher_actors[LAUNCHER_MAX_ACTORS];

// Flags the launcher hands on, unchanged, to the actors that take them (SGLang names). Unset
// ones are not passed: each actor's own default applies (the same default wherever a flag is
// shared, e.g. --max-loras-per-batch). Their types are the actors' too: a value not of its type
// (--max-loras-per-batch abc) stops the actor at once, before Ready, and with it the launch,
// the actor's message on the console (s_print_log_tail).
launcher_pass_t launcher_pass[] = {
    {"model-path", 0, K_WORKER | K_REGISTRY | K_TOKENIZER | K_DETOKENIZER | K_GATEWAY, "HF model directory (launch/loraserve defaults to examples/demo)", NULL, {0}, 0},
    {"load-format", 0, K_WORKER, "auto (the checkpoint) or dummy (random weights of config.json's shapes)", NULL, {0}, 0},
    {"quantization", 0, K_WORKER, "none (the checkpoint as stored) or fp8 (E4M3 projections, made at load)", NULL, {0}, 0},
    {"backend", 0, K_WORKER, "compute backend of the workers: cpu or cuda", NULL, {0}, 0},
    {"threads", 0, K_WORKER, "BLAS threads of each CPU-backend worker (default 1; 0: one a core)", NULL, {0}, 0},
    {"max-loras-per-batch", 0, K_WORKER | K_REGISTRY,
     "adapter slots: distinct adapters in one step", NULL, {0}, 0},
    {"max-lora-rank", 0, K_WORKER | K_REGISTRY, "largest adapter rank served", NULL, {0}, 0},
    {"lora-extra-vocab-size", 0, K_WORKER | K_REGISTRY,
     "rows of the embedding and lm_head a slot holds for an adapter's trainable tokens (0: such adapters refused)", NULL, {0}, 0},
    {"max-loaded-loras", 0, K_WORKER, "most adapters in each worker's CPU tier; 0: as many as its bytes allow", NULL, {0}, 0},
    {"max-cpu-lora-mb", 0, K_WORKER, "host memory for adapters per worker, in MB; 0: 64 adapters of --max-lora-rank, at most 1/4 of RAM", NULL, {0}, 0},
    {"lora-target-modules", 1, K_WORKER | K_REGISTRY, "modules adapters may target (none given or all: the seven of a layer; embed_tokens, lm_head when named)", NULL, {0}, 0},
    {"kv-cache-mb", 0, K_WORKER, "GPU pool per worker: the KV cache and the adapters in slots share its pages", NULL, {0}, 0},
    {"kv-blocks", 0, K_WORKER, "GPU pool pages per worker, a KV block each (overrides --kv-cache-mb)", NULL, {0}, 0},
    {"block-size", 0, K_WORKER | K_DISPATCHER, "tokens per KV block", NULL, {0}, 0},
    // The scheduler and the workers take these three as well: each checks an adapter's path
    // itself rather than trust whoever sent the load.
    {"lora-paths", 1, K_REGISTRY | K_SCHEDULER | K_WORKER,
     "adapters loaded at start: name=path, name=path:pinned, a path (named by its basename) or JSON "
     "{\"lora_name\": N, \"lora_path\": P, \"pinned\": B}", NULL, {0}, 0},
    {"lora-dirs", 1, K_REGISTRY | K_SCHEDULER | K_WORKER, "directories whose DIR/name adapters load on their first request", NULL, {0}, 0},
    {"lora-roots", 1, K_REGISTRY | K_SCHEDULER | K_WORKER, "where client-given adapter paths may point", NULL, {0}, 0},
    {"lora-eviction-policy", 0, K_SCHEDULER, "adapter slot victim: lru or fifo", NULL, {0}, 0},
    {"max-num-batched-tokens", 0, K_SCHEDULER | K_WORKER,
     "token budget of one step; workers refuse bigger plans",
     NULL, {0}, 0},
    {"max-running-requests", 0, K_SCHEDULER | K_WORKER,
     "requests decoded at once; workers refuse bigger plans",
     NULL, {0}, 0},
    {"chunked-prefill-size", 0, K_SCHEDULER, "prompt tokens of one request per step", NULL, {0}, 0},
    {"max-skip-steps", 0, K_SCHEDULER, "steps a request may be passed over for residency", NULL, {0}, 0},
    {"default-max-new-tokens", 0, K_SCHEDULER, "max_new_tokens when a request gives none", NULL, {0}, 0},
    {"step-timeout-ms", 0, K_SCHEDULER, "a step not answered by then fails its requests", NULL, {0}, 0},
    {"disable-overlap-schedule", PASS_SWITCH, K_SCHEDULER,
     "one step in flight: the worker waits a round trip for each plan (overlap is on by default, one worker a group)", NULL, {0}, 0},
    {"max-waiting-requests", 0, K_SCHEDULER, "requests waiting to run, all tenants; more are answered 429", NULL, {0}, 0},
    {"max-tenant-waiting", 0, K_SCHEDULER, "requests waiting to run for one adapter or the base model; more: 429", NULL, {0}, 0},
    {"max-queued-tokens", 0, K_SCHEDULER, "prompt tokens of the waiting requests together; more: 429", NULL, {0}, 0},
    {"port", 0, K_GATEWAY, "HTTP port of the gateway; 0: any free port, in logs/gateway.log", NULL, {0}, 0},
    {"host", 0, K_GATEWAY, "address the gateway listens on", NULL, {0}, 0},
    {"api-key", 0, K_GATEWAY, "require Authorization: Bearer KEY on every HTTP endpoint but /health (visible in ps: "
                              "prefer --api-key-file or LORASERVE_API_KEY)", NULL, {0}, 0},
    {"api-key-file", 0, K_GATEWAY, "the API key is this file's first line", NULL, {0}, 0},
    {"served-model-name", 0, K_GATEWAY, "the base model's name in the APIs", NULL, {0}, 0},
    {"chat-template", 0, K_TOKENIZER, "a Jinja chat template file used instead of the model's", NULL, {0}, 0},
    {"max-client-requests", 0, K_TOKENIZER, "requests one client (the gateway, an SDK client) may have open at the tokenizer; more: 429", NULL, {0}, 0},
    {"max-connections", 0, K_GATEWAY, "open HTTP connections; more are answered 503", NULL, {0}, 0},
    {"max-header-bytes", 0, K_GATEWAY, "HTTP request line and headers; more is answered 431", NULL, {0}, 0},
    {"max-body-bytes", 0, K_GATEWAY, "HTTP request body; more is answered 413", NULL, {0}, 0},
    {"idle-timeout-ms", 0, K_GATEWAY, "a silent HTTP connection is closed", NULL, {0}, 0},
    {"request-timeout-ms", 0, K_GATEWAY, "an HTTP request must arrive whole within this, else 408", NULL, {0}, 0},
    {"max-request-completions", 0, K_GATEWAY, "completions one request may ask for (prompts x n); more: 400", NULL, {0}, 0},
    {"max-tenant-completions", 0, K_GATEWAY, "HTTP completions in flight for one adapter or the base model; more: 429", NULL, {0}, 0},
    {"max-lora-tensor-mb", 0, K_GATEWAY | K_REGISTRY, "largest adapter_model.safetensors a load from tensors may send, in MiB", NULL, {0}, 0},
    {"metrics-max-adapters", 0, K_TOKENIZER | K_GATEWAY, "adapters with /metrics series of their own; the least recently used beyond it count as \"other\"", NULL, {0}, 0},
};
#define S_NPASS (sizeof launcher_pass / sizeof *launcher_pass)
const size_t launcher_npass = S_NPASS;

// vLLM's and SGLang's names for flags above: each alias sets its target, the one flag that owns
// the setting (a list alias adds to its target's values; a value alias given with a different
// target value stops the launch).
static struct {
    const char *alias, *target, *help;
    char *value;
    ls_strlist_t values;
} s_alias[] = {
    {"max-loras", "max-loras-per-batch", "vLLM's name for --max-loras-per-batch (LoRAs in one batch)", NULL, {0}},
    {"max-cpu-loras", "max-loaded-loras", "vLLM's name for --max-loaded-loras (LoRAs held in CPU memory)", NULL, {0}},
    {"lora-modules", "lora-paths",
     "vLLM's name for --lora-paths: name=path or JSON {\"name\": N, \"path\": P, \"base_model_name\": M} (M is not used: "
     "one base model is served)", NULL, {0}},
};
#define S_NALIAS (sizeof s_alias / sizeof *s_alias)
// Accepted for vLLM's and SGLang's command lines, with no effect (their --help says why).
static int s_enable_lora;
static progress_t *s_progress;  // the loads shown on the console
static char *s_lora_backend;

static void s_child_cb(struct ev_loop *loop, ev_child *w, int revents);

static int s_spawn(launcher_actor_t *a) {
    char **argv = plan_argv(a);
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
    ev_child_start(ls_actor_loop(launcher_state.self), &a->child);
    ls_info(0, "started %s (pid %d), log %s", a->name, (int)pid, a->log_path);
    return 0;
}

static int s_running(void) {
    int n = 0;
    for (int i = 0; i < launcher_state.nactors; i++)
        n += launcher_actors[i].pid > 0 && !launcher_actors[i].exited;
    return n;
}

// Reap what has exited, without blocking; libev's own child watcher may have reaped some.
static void s_reap(void) {
    for (int i = 0; i < launcher_state.nactors; i++) {
        launcher_actor_t *a = &launcher_actors[i];
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
    for (int i = 0; i < launcher_state.nactors; i++)
        if (launcher_actors[i].pid > 0 && !launcher_actors[i].exited)
            kill(launcher_actors[i].pid, sig);
}

// Stop the graph: the Shutdown protocol first (each actor answers its in-flight work), then
// SIGTERM, then SIGKILL, so nothing is left behind whatever state an actor is in. Runs inside
// the runtime's shutdown, while the control socket still works.
static void s_on_shutdown(ls_actor_t *self, void *state) {
    launcher_state.stopping = 1;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    m.u.shutdown.reason = ls_msg_strdup("the launcher is stopping the graph");
    for (int i = 0; i < launcher_state.nactors; i++) {
        launcher_actor_t *a = &launcher_actors[i];
        if (a->pid > 0 && !a->exited && a->ready) {
            nodes_send_to(a->name, &m);
        }
    }
    // Node 0 stops the whole graph: every node's launcher stops its own actors.
    for (int k = 1; k < launcher_state.nnodes; k++)
        if (launcher_nodes[k].alive)
            nodes_send_to(launcher_nodes[k].launcher, &m);
    ls_msg_clear(&m);
    // Actors that never said Ready have no control route yet: they get SIGTERM at once.
    for (int i = 0; i < launcher_state.nactors; i++)
        if (launcher_actors[i].pid > 0 && !launcher_actors[i].exited && !launcher_actors[i].ready)
            kill(launcher_actors[i].pid, SIGTERM);
    s_wait_all(launcher_state.shutdown_timeout_s / 2.0);
    if (s_running()) {
        ls_warn(0, "%d actor(s) still running after Shutdown; sending SIGTERM", s_running());
        s_signal_all(SIGTERM);
        s_wait_all(launcher_state.shutdown_timeout_s / 2.0);
    }
    if (s_running()) {
        for (int i = 0; i < launcher_state.nactors; i++)
            if (launcher_actors[i].pid > 0 && !launcher_actors[i].exited)
                ls_error(0, "%s (pid %d) did not stop; killing it", launcher_actors[i].name, (int)launcher_actors[i].pid);
        s_signal_all(SIGKILL);
        s_wait_all(5);
    }
    if (!strcmp(launcher_state.transport, "ipc"))
        for (int i = 0; i < launcher_state.nactors; i++)
            unlink(launcher_actors[i].endpoint + strlen("ipc://"));
    ls_info(0, "graph stopped");
}

void launcher_stop(int status, const char *why) {
    if (launcher_state.stopping)
        return;
    if (status > launcher_state.exit_status)
        launcher_state.exit_status = status;
    ls_actor_shutdown(launcher_state.self, why);
}

// Show the end of a dead actor's log so the cause is on the console, not only in the file.
static void s_print_log_tail(const launcher_actor_t *a, int lines) {
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

static void s_actor_down(launcher_actor_t *a, const char *how);

static void s_child_cb(struct ev_loop *loop, ev_child *w, int revents) {
    launcher_actor_t *a = w->data;
    ev_child_stop(loop, w);
    a->exited = 1;
    if (launcher_state.stopping)
        return;
    char how[160];
    if (a->hung)
        snprintf(how, sizeof how, "hung (no heartbeat for %d ms) and was killed", launcher_state.hang_timeout_ms);
    else if (a->collateral)
        snprintf(how, sizeof how, "was stopped with its tensor-parallel group");
    else if (WIFSIGNALED(w->rstatus))
        snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(w->rstatus), strsignal(WTERMSIG(w->rstatus)));
    else
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(w->rstatus));
    if (!a->collateral)
        s_print_log_tail(a, 5);
    if (!launcher_state.up) {
        // Before the graph was ever up, a death is a configuration problem a restart repeats.
        ls_error(0, "actor %s (pid %d) %s before the graph was up; stopping the graph", a->name, (int)a->pid, how);
        char why[256];
        snprintf(why, sizeof why, "actor %s %s", a->name, how);
        launcher_stop(1, why);
        return;
    }
    s_actor_down(a, how);
}

static const char *s_pass_value(const char *name) {
    for (size_t i = 0; i < S_NPASS; i++)
        if (!strcmp(launcher_pass[i].name, name))
            return launcher_pass[i].value;
    return NULL;
}

static launcher_pass_t *s_pass_find(const char *name) {
    for (size_t i = 0; i < S_NPASS; i++)
        if (!strcmp(launcher_pass[i].name, name))
            return &launcher_pass[i];
    return NULL;
}

// Each alias onto its target. -1 (said) when an alias and its target disagree.
static int s_apply_aliases(void) {
    for (size_t i = 0; i < S_NALIAS; i++) {
        launcher_pass_t *t = s_pass_find(s_alias[i].target);
        if (t->form == PASS_LIST) {
            for (size_t k = 0; k < s_alias[i].values.n; k++) {
                char **v = realloc(t->values.v, (t->values.n + 1) * sizeof *v);
                if (!v)
                    return -1;
                t->values.v = v;
                t->values.v[t->values.n++] = s_alias[i].values.v[k];
            }
            free(s_alias[i].values.v);
            s_alias[i].values = (ls_strlist_t){0};
        } else if (s_alias[i].value) {
            if (t->value && strcmp(t->value, s_alias[i].value)) {
                ls_error(0, "--%s %s and --%s %s disagree (--%s is vLLM's name for --%s): give one", s_alias[i].alias,
                         s_alias[i].value, t->name, t->value, s_alias[i].alias, t->name);
                return -1;
            }
            free(t->value);
            t->value = s_alias[i].value;
            s_alias[i].value = NULL;
        }
    }
    return 0;
}

// Every startup adapter well formed and named once, checked before anything starts (with the
// parser the registry, the scheduler and the workers use).
static int s_check_lora_paths(void) {
    const ls_strlist_t *l = &s_pass_find("lora-paths")->values;
    lora_spec_t *specs = calloc(l->n + 1, sizeof *specs);
    int rc = specs ? 0 : -1;
    for (size_t i = 0; specs && i < l->n && rc == 0; i++) {
        char err[1024];
        if (lora_spec_parse(l->v[i], &specs[i], err, sizeof err) < 0) {
            ls_error(0, "--lora-paths: %s", err);
            rc = -1;
        }
        for (size_t j = 0; j < i && rc == 0; j++)
            if (!strcmp(specs[j].name, specs[i].name)) {
                ls_error(0, "--lora-paths: the name %s is given twice (\"%s\" and \"%s\")", specs[i].name, l->v[j], l->v[i]);
                rc = -1;
            }
    }
    for (size_t i = 0; specs && i < l->n; i++)
        lora_spec_clear(&specs[i]);
    free(specs);
    return rc;
}

// --port 0 is resolved here, once, to a free port: a restarted gateway must listen where the
// clients already connect.
static int s_fix_port(void) {
    launcher_pass_t *port = NULL;
    for (size_t i = 0; i < S_NPASS; i++)
        if (!strcmp(launcher_pass[i].name, "port"))
            port = &launcher_pass[i];
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

// An --api-key given to the launcher goes to the gateway in a file (RUN_DIR/keys/api-key,
// 0600), so that at least the gateway's command line does not show it.
static int s_hide_api_key(void) {
    launcher_pass_t *key = NULL, *file = NULL;
    for (size_t i = 0; i < S_NPASS; i++) {
        if (!strcmp(launcher_pass[i].name, "api-key"))
            key = &launcher_pass[i];
        if (!strcmp(launcher_pass[i].name, "api-key-file"))
            file = &launcher_pass[i];
    }
    if (!key->value)
        return 0;
    ls_warn(0, "--api-key on the command line is visible in ps; use --api-key-file or LORASERVE_API_KEY");
    if (file->value) {
        ls_error(0, "give --api-key or --api-key-file, not both");
        return -1;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/keys/api-key", launcher_state.run_dir);
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
    launcher_actor_t *tok = plan_find("tokenizer");
    // The gateway's own defaults when the flags were not given (--port 0 was resolved at start).
    const char *host = s_pass_value("host") ? s_pass_value("host") : "127.0.0.1";
    const char *port = s_pass_value("port") ? s_pass_value("port") : "30000";
    fprintf(stderr,
            "\nloraserve is up: %d actors ready.\n"
            "  HTTP (OpenAI and SGLang APIs): http://%s:%s/v1   (try: curl http://%s:%s/v1/models)\n"
            "  clients (C SDK) connect to the tokenizer: %s\n"
            "  graph: %s/graph.json   logs: %s/logs/\n"
            "  Ctrl-C stops the graph.\n\n",
            launcher_state.nactors, host, port, host, port, tok ? tok->endpoint : "?", launcher_state.run_dir, launcher_state.run_dir);
}

// Every actor this launcher counts is Ready: node 0's graph is whole; node K's share is up.
void launcher_whole(void) {
    if (launcher_state.nready != launcher_state.nwant)
        return;
    if (plan_write_graph() < 0) {
        launcher_stop(1, "cannot write graph.json");
        return;
    }
    if (launcher_state.up)
        ls_info(0, "the graph is whole again");
    else if (launcher_state.node_rank > 0)
        fprintf(stderr, "\nloraserve node %d is up: its %d actors ready; the graph is Ready once node 0 (%s) has "
                        "every node's.\n  graph: %s/graph.json   logs: %s/logs/\n\n",
                launcher_state.node_rank, launcher_state.nwant, launcher_nodes[0].addr, launcher_state.run_dir, launcher_state.run_dir);
    else
        s_print_banner();
    launcher_state.up = 1;
}

static int s_on_ready(ls_actor_t *self, ls_in_t *in, void *state) {
    const char *name = in->msg->u.ready.actor ? in->msg->u.ready.actor : "";
    int k = launcher_state.node_rank == 0 ? nodes_of(in->from) : -1;
    if (k > 0 && !strcmp(name, in->from)) {
        // Node K's launcher (re)started: whatever its earlier one ran is gone.
        if (launcher_nodes[k].pid && launcher_nodes[k].pid != in->msg->u.ready.pid) {
            launcher_nodes[k].alive = 0;
            nodes_down(k, "has a new launcher", in->now_ns);
        }
        launcher_nodes[k].pid = in->msg->u.ready.pid;
        nodes_heard(k, in->now_ns);
        return 0;
    }
    launcher_actor_t *a = plan_find(name);
    if (!a || !plan_local(a) || strcmp(in->from, name) != 0 || a->exited ||
        (in->msg->u.ready.pid && (pid_t)in->msg->u.ready.pid != a->pid)) {
        ls_warn(0, "Ready from unknown actor \"%s\" (identity %s, pid %u) ignored", name, in->from, in->msg->u.ready.pid);
        return 0;
    }
    if (a->ready)
        return 0;
    a->ready = 1;
    a->ready_ns = a->last_heartbeat_ns = in->now_ns;
    launcher_state.nready++;
    if (a->restarts)
        ls_info(0, "%s is ready again after restart %d, %.2f s after it went down (%d/%d)", a->name, a->restarts,
                (double)(in->now_ns - a->down_ns) / 1e9, launcher_state.nready, launcher_state.nwant);
    else
        ls_info(0, "%s is ready (%d/%d)", a->name, launcher_state.nready, launcher_state.nwant);
    launcher_whole();
    nodes_announce(a, 1, NULL);
    return 0;
}

static int s_on_heartbeat(ls_actor_t *self, ls_in_t *in, void *state) {
    launcher_actor_t *a = plan_find(in->from);
    if (a && plan_local(a)) {
        a->last_heartbeat_ns = in->now_ns;
        return 0;
    }
    int k = launcher_state.node_rank == 0 ? nodes_of(in->from) : -1;
    if (k > 0) {
        nodes_heard(k, in->now_ns);
        nodes_ping(k, ++launcher_state.pings, in->now_ns);
    } else if (launcher_state.node_rank > 0 && !strcmp(in->from, "control")) {
        nodes_upstream_heard(in->msg, in->now_ns);
        // seq 0: node 0 asks for this node's actors: each Ready one again (it ignores what it
        // knows).
        for (int i = 0; i < launcher_state.nactors && !in->msg->u.heartbeat.seq && !launcher_state.stopping; i++)
            if (plan_local(&launcher_actors[i]) && launcher_actors[i].ready)
                nodes_report(&launcher_actors[i], 1, NULL);
    }
    return 0;
}

static void s_ready_timeout_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    if (launcher_state.up)
        return;
    char missing[1024] = "";
    for (int i = 0; i < launcher_state.nactors; i++)
        if (!launcher_actors[i].ready && (launcher_state.node_rank == 0 || plan_local(&launcher_actors[i]))) {
            const launcher_actor_t *a = &launcher_actors[i];
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, "%s%.31s", len ? ", " : "", a->name);
            if (plan_local(a))
                ls_error(0, "%s is not ready; its log: %s", a->name, a->log_path);
            else
                ls_error(0, "%s on node %d (%s) is not ready%s; its log there: %s", a->name, a->node,
                         launcher_nodes[a->node].addr, launcher_nodes[a->node].pid ? "" : ": that node's launcher never connected",
                         a->log_path);
        }
    ls_error(0, "not ready after %d s: %s", launcher_state.ready_timeout_s, missing);
    launcher_stop(1, "actors did not become ready in time");
}

// ---------------------------------------------------------------------------------------------
// supervision

// The restart budget (OTP's intensity and period): at most --max-restarts within the window.
// Returns 0 and spends one, or -1 when it is spent.
static int s_budget_take(uint64_t now) {
    uint64_t window = (uint64_t)launcher_state.restart_window_s * 1000000000ull;
    while (launcher_state.nrestart_times > 0) {
        int oldest = (launcher_state.restart_head - launcher_state.nrestart_times + LAUNCHER_MAX_BUDGET) % LAUNCHER_MAX_BUDGET;
        if (now - launcher_state.restart_ns[oldest] < window)
            break;
        launcher_state.nrestart_times--;
    }
    if (launcher_state.nrestart_times >= launcher_state.max_restarts)
        return -1;
    launcher_state.restart_ns[launcher_state.restart_head] = now;
    launcher_state.restart_head = (launcher_state.restart_head + 1) % LAUNCHER_MAX_BUDGET;
    launcher_state.nrestart_times++;
    return 0;
}

static void s_restart_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    launcher_actor_t *a = arg;
    a->restart = NULL;
    if (launcher_state.stopping)
        return;
    a->exited = a->ready = a->hung = a->collateral = 0;
    a->restarts++;
    if (s_spawn(a) < 0) {
        launcher_stop(1, "an actor could not be restarted");
        return;
    }
    a->spawned_ns = ls_actor_now_ns(self);
}

// A dead actor of a graph that was up: tell the others, then restart it after the back-off,
// unless the budget is spent.
static void s_actor_down(launcher_actor_t *a, const char *how) {
    uint64_t now = ls_actor_now_ns(launcher_state.self);
    if (a->ready) {
        a->ready = 0;
        launcher_state.nready--;
    }
    a->down_ns = now;
    // Up for a whole window since its last start: this failure starts a new streak.
    if (a->ready_ns && now - a->ready_ns >= (uint64_t)launcher_state.restart_window_s * 1000000000ull)
        a->streak = 0;
    if (!a->collateral && s_budget_take(now) < 0) {
        char why[320];
        snprintf(why, sizeof why, "restart budget spent (%d restarts within %d s); last: actor %s %s", launcher_state.max_restarts,
                 launcher_state.restart_window_s, a->name, how);
        ls_error(0, "%s; stopping the graph", why);
        launcher_stop(1, why);
        return;
    }
    int delay_ms = S_BACKOFF_MIN_MS << (a->streak < 5 ? a->streak : 5);
    if (delay_ms > S_BACKOFF_MAX_MS)
        delay_ms = S_BACKOFF_MAX_MS;
    a->streak++;
    ls_error(0, "actor %s (pid %d) %s; restarting it in %d ms (restart %d; %d of %d within %d s)", a->name, (int)a->pid,
             how, delay_ms, a->restarts + 1, launcher_state.nrestart_times, launcher_state.max_restarts, launcher_state.restart_window_s);
    char reason[200];
    snprintf(reason, sizeof reason, "%s %s", a->name, how);
    nodes_announce(a, 0, reason);
    a->restart = ls_actor_timer_start(launcher_state.self, delay_ms, 0, s_restart_cb, a);
    if (!a->collateral)
        launcher_group_stop(a);
}

// The ranks of a tensor-parallel group meet at every collective: the others would wait on the
// lost one, so the group restarts together (its own group only, with --dp-size). This stops
// this node's ranks; a group across nodes loses the others when their launchers hear of the
// loss (nodes.c). Ranks stopped so are collateral: their deaths stop nothing more.
void launcher_group_stop(const launcher_actor_t *lost) {
    if (strcmp(lost->binary, "worker") || launcher_state.tp_size < 2)
        return;
    for (int i = 0; i < launcher_state.nactors; i++) {
        launcher_actor_t *w = &launcher_actors[i];
        if (w != lost && !strcmp(w->binary, "worker") && w->group == lost->group && plan_local(w) && !w->exited &&
            w->pid > 0 && !w->collateral) {
            w->collateral = 1;
            ls_info(0, "stopping %s (pid %d): %s of its tensor-parallel group is down", w->name, (int)w->pid, lost->name);
            kill(w->pid, SIGKILL);
        }
    }
}

// Every heartbeat period: a Ready actor silent past --hang-timeout-ms is hung (a stopped
// process, a blocked loop) and is killed, which restarts it; a restarted actor that is not Ready
// within --ready-timeout is killed the same way.
static void s_liveness_cb(ls_actor_t *self, ls_timer_t *t, void *arg) {
    uint64_t now = ls_actor_now_ns(self), hang = (uint64_t)launcher_state.hang_timeout_ms * 1000000ull;
    for (int i = 0; i < launcher_state.nactors; i++) {
        launcher_actor_t *a = &launcher_actors[i];
        if (a->exited || a->pid <= 0 || a->hung || launcher_state.stopping)
            continue;
        if (a->ready && now - a->last_heartbeat_ns > hang) {
            ls_error(0, "no heartbeat from %s (pid %d) for %.1f s: it is hung; killing it", a->name, (int)a->pid,
                     (double)(now - a->last_heartbeat_ns) / 1e9);
            a->hung = 1;
            kill(a->pid, SIGKILL);
        } else if (!a->ready && a->restarts && now - a->spawned_ns > (uint64_t)launcher_state.ready_timeout_s * 1000000000ull) {
            ls_error(0, "restarted %s (pid %d) is not ready after %d s; killing it", a->name, (int)a->pid,
                     launcher_state.ready_timeout_s);
            a->hung = 1;
            kill(a->pid, SIGKILL);
        }
    }
    // Node 0: a node whose launcher is silent as long is gone (stopped, crashed, cut off).
    for (int k = 1; k < launcher_state.nnodes && !launcher_state.stopping; k++)
        if (launcher_nodes[k].alive && now - launcher_nodes[k].last_heartbeat_ns > hang) {
            launcher_nodes[k].alive = 0;
            char why[96];
            snprintf(why, sizeof why, "is silent for %.1f s", (double)(now - launcher_nodes[k].last_heartbeat_ns) / 1e9);
            nodes_down(k, why, now);
        }
    // Node K: node 0's launcher silent as long (killed, its host down, cut off). Before its first
    // word this node waits for it, however long.
    if (launcher_state.node_rank > 0 && launcher_state.upstream_ns && !launcher_state.stopping && now - launcher_state.upstream_ns > hang) {
        char why[96];
        snprintf(why, sizeof why, "is silent for %.1f s", (double)(now - launcher_state.upstream_ns) / 1e9);
        nodes_upstream_lost(why);
    }
}

static int s_on_start(ls_actor_t *self, void *state) {
    launcher_state.self = self;
    launcher_state.start_ns = ls_actor_now_ns(self);
    if (!(s_progress = progress_new(stderr, isatty(STDERR_FILENO))))
        ls_warn(0, "out of memory: load progress not shown");
    ls_log_set_before(progress_break, s_progress);
    for (int i = 0; i < launcher_state.nactors; i++)
        if (plan_local(&launcher_actors[i]) && s_spawn(&launcher_actors[i]) < 0) {
            launcher_state.exit_status = 1;
            return -1;
        }
    ls_actor_timer_start(self, launcher_state.ready_timeout_s * 1000.0, 0, s_ready_timeout_cb, NULL);
    if (launcher_state.heartbeat_ms > 0 && launcher_state.hang_timeout_ms > 0)
        ls_actor_timer_start(self, launcher_state.heartbeat_ms, launcher_state.heartbeat_ms, s_liveness_cb, NULL);
    return 0;
}

static int s_make_dirs(void) {
    if (!launcher_state.run_dir) {
        char tmpl[] = "/tmp/loraserve-XXXXXX";
        if (!mkdtemp(tmpl)) {
            ls_error(0, "cannot create a run directory: %s", strerror(errno));
            return -1;
        }
        launcher_state.run_dir = strdup(tmpl);
    } else if (mkdir(launcher_state.run_dir, 0755) < 0 && errno != EEXIST) {
        ls_error(0, "cannot create --run-dir %s: %s", launcher_state.run_dir, strerror(errno));
        return -1;
    }
    char *real = realpath(launcher_state.run_dir, NULL);
    if (real) {
        free(launcher_state.run_dir);
        launcher_state.run_dir = real;
    }
    // Sockets, journals and keys are this user's alone: another local user can neither
    // connect to an ipc socket nor read a key or the journal.
    const char *subs[] = {"logs", "sock", "state", "keys"};
    const mode_t modes[] = {0755, 0700, 0700, 0700};
    for (size_t i = 0; i < 4; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", launcher_state.run_dir, subs[i]);
        if ((mkdir(path, modes[i]) < 0 && errno != EEXIST) || chmod(path, modes[i]) < 0) {
            ls_error(0, "cannot create %s (mode %03o): %s", path, modes[i], strerror(errno));
            return -1;
        }
    }
    // A stale graph.json from an earlier run must not look like this run being up.
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/graph.json", launcher_state.run_dir);
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
// written once. Fills shown[i] (kind, def) for launcher_pass[i], def in defs[i].
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
            snprintf(key, sizeof key, "\n  --%s ", launcher_pass[i].name);
            char *line = (launcher_pass[i].kinds >> k & 1) && help[k] ? strstr(help[k], key) : NULL;
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

// An actor's load (the worker's weights and adapters) on the console (progress.h). Adapters only
// until the graph is up: after that, loads are the registry's everyday work, in the logs.
static int s_on_load_progress(ls_actor_t *self, ls_in_t *in, void *state) {
    const ls_msg_load_progress_t *lp = &in->msg->u.load_progress;
    launcher_actor_t *a = plan_find(in->from);
    if (!a || !plan_local(a) || !s_progress)
        return 0;  // not one of this node's actors: its word is not shown
    if (launcher_state.up && (!lp->what || strncmp(lp->what, "weights", 8)))
        return 0;
    if (progress_note(s_progress, a->name, lp->what, lp->done_bytes, lp->total_bytes, in->now_ns) < 0)
        ls_warn(0, "LoadProgress from %s out of range (%llu of %llu bytes) ignored", a->name,
                (unsigned long long)lp->done_bytes, (unsigned long long)lp->total_bytes);
    return 0;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_READY, s_on_ready},
    {LS_MSG_LOAD_PROGRESS, s_on_load_progress},
    {LS_MSG_HEARTBEAT, s_on_heartbeat},
    {LS_MSG_ACTOR_STATUS, nodes_on_actor_status},
    {LS_MSG_PEER_STATUS, nodes_on_peer_status},
    {0, NULL},
};

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("run-dir", &launcher_state.run_dir, NULL, "sockets, logs and state go here (default: a new /tmp/loraserve-*)"),
        LS_FLAG_INT("tp-size", &launcher_state.tp_size, "1", "tensor-parallel size: one worker process per GPU"),
        LS_FLAG_INT("dp-size", &launcher_state.dp_size, "1",
                    "data-parallel groups, each a scheduler and --tp-size workers (GPUs G*tp … G*tp+tp-1), "
                    "behind one dispatcher that routes by adapter, prefix and load"),
        LS_FLAG_STR("transport", &launcher_state.transport, "ipc", "ipc (one host, sockets in RUN_DIR/sock) or tcp"),
        LS_FLAG_STR("tcp-host", &launcher_state.tcp_host, NULL, "address actors bind with --transport tcp (default: 127.0.0.1; "
                                                     "with --nnodes, this node's in --node-addrs)"),
        LS_FLAG_INT("tcp-base-port", &launcher_state.tcp_base_port, "25500", "first port with --transport tcp (control; actors follow)"),
        LS_FLAG_INT("nnodes", &launcher_state.nnodes, "1",
                    "hosts the graph spans, one launcher each with the same graph flags (needs --transport tcp, "
                    "--node-addrs, --curve-dir): the front and groups G % nnodes == 0 on node 0, group G on node "
                    "G % nnodes; with more nodes than --dp-size, each group's --tp-size ranks split evenly over "
                    "nnodes / dp-size nodes"),
        LS_FLAG_INT("node-rank", &launcher_state.node_rank, "0", "this host's node, 0..nnodes-1"),
        LS_FLAG_LIST("node-addrs", &launcher_state.node_addrs,
                     "every node's address (A B ... or A,B,...), node 0's first, the same on every node: node K's actors bind there"),
        LS_FLAG_STR("dist-init-addr", &launcher_state.dist_init_addr, NULL,
                    "node 0's launcher, HOST:PORT (default: the first --node-addrs at --tcp-base-port): the other "
                    "nodes report to it; PORT is every node's base port"),
        LS_FLAG_STR("curve-dir", &launcher_state.curve_dir_flag, NULL,
                    "tcp: the graph's CURVE keys, made by --make-keys (default: fresh ones in RUN_DIR/keys)"),
        LS_FLAG_BOOL("make-keys", &launcher_state.make_keys,
                     "write the graph's CURVE keys into --curve-dir (for these --dp-size, --tp-size, --nnodes) and exit"),
        LS_FLAG_STR("record-trace", &launcher_state.record_trace, NULL, "every actor records its messages to DIR/<actor>.trace"),
        LS_FLAG_INT("ready-timeout", &launcher_state.ready_timeout_s, "120", "seconds to wait for every actor to be Ready"),
        LS_FLAG_INT("shutdown-timeout", &launcher_state.shutdown_timeout_s, "10", "seconds actors get to stop before being killed"),
        LS_FLAG_INT("actor-heartbeat-ms", &launcher_state.heartbeat_ms, "500", "actors' Heartbeat period"),
        LS_FLAG_INT("hang-timeout-ms", &launcher_state.hang_timeout_ms, "3000",
                    "a Ready actor with no Heartbeat this long is hung: killed and restarted (0: never)"),
        LS_FLAG_INT("max-restarts", &launcher_state.max_restarts, "5",
                    "restarts allowed within --restart-window; one more stops the graph (0: any death stops it)"),
        LS_FLAG_INT("restart-window", &launcher_state.restart_window_s, "60", "seconds over which --max-restarts counts"),
        LS_FLAG_STR("actor-log-level", &launcher_state.log_level, "info", "log level passed to every actor"),
        LS_FLAG_STR("bin-dir", &launcher_state.bin_dir, NULL, "where the loraserve-<actor> binaries are (default: beside this one)"),
        LS_FLAG_END,
    };
    ls_flag_t passed[S_NPASS + 1];
    for (size_t i = 0; i < S_NPASS; i++)
        passed[i] = launcher_pass[i].form == PASS_LIST
                        ? (ls_flag_t)LS_FLAG_LIST(launcher_pass[i].name, &launcher_pass[i].values, launcher_pass[i].help)
                    : launcher_pass[i].form == PASS_SWITCH
                        ? (ls_flag_t)LS_FLAG_BOOL(launcher_pass[i].name, &launcher_pass[i].on, launcher_pass[i].help)
                        : (ls_flag_t)LS_FLAG_STR(launcher_pass[i].name, &launcher_pass[i].value, NULL, launcher_pass[i].help);
    passed[S_NPASS] = (ls_flag_t)LS_FLAG_END;
    ls_flag_t aliased[S_NALIAS + 3];
    for (size_t i = 0; i < S_NALIAS; i++)
        aliased[i] = s_pass_find(s_alias[i].target)->form == PASS_LIST ? (ls_flag_t)LS_FLAG_LIST(s_alias[i].alias, &s_alias[i].values, s_alias[i].help)
                                                         : (ls_flag_t)LS_FLAG_STR(s_alias[i].alias, &s_alias[i].value, NULL, s_alias[i].help);
    aliased[S_NALIAS] = (ls_flag_t)LS_FLAG_BOOL("enable-lora", &s_enable_lora, "accepted for vLLM's command lines; no effect: LoRA is always on");
    aliased[S_NALIAS + 1] = (ls_flag_t)LS_FLAG_STR("lora-backend", &s_lora_backend, NULL,
                                                   "accepted for SGLang's command lines (triton, csgmv, ...); no effect: "
                                                   "loraserve's own kernels are its only LoRA backend");
    aliased[S_NALIAS + 2] = (ls_flag_t)LS_FLAG_END;
    const ls_actor_def_t def = {
        .name = "launcher",
        .about = "loraserve launcher: starts the actor graph, waits until it is ready, stops it on Ctrl-C.",
        .dispatch = s_dispatch,
        .on_start = s_on_start,
        .on_shutdown = s_on_shutdown,
    };
    // The launcher parses its own flags (not ls_actor_main): the run directory and every
    // endpoint must be planned before its control socket binds.
    ls_flag_t *tables[] = {flags, passed, aliased, NULL};
    char err[512];
    ls_log_init("launcher", LS_LOG_INFO);
    int rc = ls_flags_parse(tables, argc, argv, err, sizeof err);
    if (rc == 1) {
        ls_flag_t shown[S_NPASS + 1];
        memcpy(shown, passed, sizeof shown);
        char *help[S_KINDS], defs[S_NPASS][160];
        char *dir = launcher_state.bin_dir ? strdup(launcher_state.bin_dir) : s_exe_dir();
        s_pass_usage(dir, shown, help, defs);
        // An alias shows its target's type.
        for (size_t i = 0; i < S_NALIAS; i++)
            aliased[i].kind = shown[s_pass_find(s_alias[i].target) - launcher_pass].kind;
        ls_flag_t *usage[] = {flags, shown, aliased, NULL};
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
    if (strcmp(launcher_state.transport, "ipc") && strcmp(launcher_state.transport, "tcp")) {
        ls_error(0, "--transport must be ipc or tcp, not \"%s\"", launcher_state.transport);
        return 2;
    }
    if (launcher_state.max_restarts < 0 || launcher_state.max_restarts > LAUNCHER_MAX_BUDGET || launcher_state.restart_window_s < 1 || launcher_state.hang_timeout_ms < 0 ||
        (launcher_state.hang_timeout_ms > 0 && launcher_state.hang_timeout_ms < 2 * launcher_state.heartbeat_ms)) {
        ls_error(0, "--max-restarts must be 0..%d, --restart-window at least 1, and --hang-timeout-ms 0 or at least "
                    "two --actor-heartbeat-ms periods", LAUNCHER_MAX_BUDGET);
        return 2;
    }
    if (!launcher_state.bin_dir)
        launcher_state.bin_dir = s_exe_dir();
    if (s_apply_aliases() < 0 || s_check_lora_paths() < 0)
        return 2;
    if (launcher_state.make_keys) {
        // The plan names the keys; nothing is started.
        if (!launcher_state.curve_dir_flag || strcmp(launcher_state.transport, "tcp")) {
            ls_error(0, "--make-keys needs --curve-dir DIR and --transport tcp");
            return 2;
        }
        return nodes_setup() < 0 || plan_build() < 0 || plan_make_keys() < 0;
    }
    if (nodes_setup() < 0)
        return 2;
    if (s_make_dirs() < 0)
        return 1;
    if (plan_build() < 0)  // a graph that cannot be placed: refused, nothing started
        return 2;
    if (s_fix_port() < 0 || plan_make_keys() < 0 || s_hide_api_key() < 0)
        return 1;
    if (launcher_state.nnodes > 1)
        ls_log_init(launcher_nodes[launcher_state.node_rank].launcher, LS_LOG_INFO);
    int nlocal = 0;
    for (int i = 0; i < launcher_state.nactors; i++)
        nlocal += plan_local(&launcher_actors[i]);
    ls_info(0, "run dir %s, %d actors (%d on this node, %d of %d), transport %s", launcher_state.run_dir, launcher_state.nactors, nlocal,
            launcher_state.node_rank, launcher_state.nnodes, launcher_state.transport);

    // Node K's launcher is launcher-K, and node 0's launcher its control: Ready, Heartbeat and
    // ActorStatus go there; PeerStatus and Shutdown come from there.
    char upstream[300];
    snprintf(upstream, sizeof upstream, "tcp://%s:%d", launcher_nodes[0].addr, launcher_state.tcp_base_port);
    int remote = launcher_state.node_rank > 0;
    ls_actor_opts_t opts = {.name = launcher_nodes[launcher_state.node_rank].launcher, .bind = launcher_state.control,
                            .control = remote ? upstream : NULL, .heartbeat_ms = remote ? launcher_state.heartbeat_ms : 0,
                            .process = 1, .curve_dir = launcher_state.curve_dir[0] ? launcher_state.curve_dir : NULL};
    zsys_handler_set(NULL);
    ls_actor_t *self = ls_actor_new(&def, &opts);
    if (!self)
        return 1;
    if (ls_actor_run(self) < 0)
        s_on_shutdown(self, NULL);  // a spawn failed: stop whatever did start
    ls_actor_destroy(&self);
    ls_log_set_before(NULL, NULL);
    progress_destroy(&s_progress);
    return launcher_state.exit_status;
}
