// plan — the graph as planned, the same on every node: each actor's name, kind, rank, group,
// node and endpoint (plan_build), the argv it is started with (plan_argv), RUN_DIR/graph.json
// (plan_write_graph) and the graph's CURVE keys (plan_make_keys). It stands apart from the
// launcher because it only computes from the flags: it starts, watches and sends nothing.
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "launcher_impl.h"
#include "ls_confine.h"
#include "ls_curve.h"
#include "ls_limits.h"

#define S_IPC_PATH_MAX 107  // sun_path in sockaddr_un, less the NUL

static unsigned s_kind_bit(const char *binary) {
    static const char *kinds[] = {"registry", "worker", "scheduler", "detokenizer", "tokenizer", "gateway", "dispatcher"};
    for (unsigned i = 0; i < 7; i++)
        if (!strcmp(binary, kinds[i]))
            return 1u << i;
    return 0;
}

launcher_actor_t *plan_find(const char *name) {
    for (int i = 0; i < launcher_state.nactors; i++)
        if (!strcmp(launcher_actors[i].name, name))
            return &launcher_actors[i];
    return NULL;
}

// An endpoint of the plan: with tcp, on its node's address at the base port plus the actor's
// index in the plan, the same on every node.
static int s_endpoint(char *out, size_t cap, const char *name, int node, int index) {
    if (!strcmp(launcher_state.transport, "tcp")) {
        snprintf(out, cap, "tcp://%s:%d", launcher_nodes[node].addr, launcher_state.tcp_base_port + index);
        return 0;
    }
    int n = snprintf(out, cap, "ipc://%s/sock/%s.sock", launcher_state.run_dir, name);
    if (n - 6 > S_IPC_PATH_MAX) {
        ls_error(0, "--run-dir %s is too long for ipc socket paths (%d > %d characters); use a shorter "
                    "directory or --transport tcp", launcher_state.run_dir, n - 6, S_IPC_PATH_MAX);
        return -1;
    }
    return 0;
}

// The graph: the front actors once; per data-parallel group a scheduler and its --tp-size
// workers. With --dp-size 1 the group's actors are "scheduler" and "worker-R", as always; with
// N > 1 they are "scheduler-G" and "worker-G-R", and a dispatcher fronts the groups.
// Placement over --nnodes M (every node computes the same): the front on node 0. With M at
// most the number of groups, group G with its scheduler and tensor-parallel workers on node
// G % M (round-robin: the groups spread evenly, node 0 takes the extra ones). With more nodes
// than groups, each group spans M / --dp-size nodes, its ranks split evenly in order over them
// (tensor parallelism across hosts, through NCCL's own bootstrap), its scheduler beside rank 0.
int plan_build(void) {
    const char *order[] = {"registry", "worker", "scheduler", "dispatcher", "detokenizer", "tokenizer", "gateway"};
    int dp = launcher_state.dp_size, total = 4 + dp * (1 + launcher_state.tp_size) + (dp > 1);
    // Every actor has every other as a peer.
    if (launcher_state.tp_size < 1 || dp < 1 || total > LAUNCHER_MAX_ACTORS || total - 1 > LS_MAX_PEERS) {
        ls_error(0, "--tp-size and --dp-size must be at least 1, and the graph at most %d actors (it would have %d)",
                 LS_MAX_PEERS + 1, total);
        return -1;
    }
    int tp = launcher_state.tp_size, spread = launcher_state.nnodes > dp ? launcher_state.nnodes / dp : 1;
    if (launcher_state.nnodes > dp && (launcher_state.nnodes % dp || tp % spread)) {
        ls_error(0, "--nnodes %d with --dp-size %d and --tp-size %d: a node runs whole data-parallel groups, or with "
                    "more nodes than groups each group's ranks split evenly over --nnodes / --dp-size nodes (give "
                    "--nnodes a multiple of --dp-size that divides the groups' ranks evenly)",
                 launcher_state.nnodes, dp, tp);
        return -1;
    }
    int per_node = tp / spread;  // a group's ranks on each of its nodes
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
        bool grouped = !strcmp(order[k], "worker") || !strcmp(order[k], "scheduler");
        if (!strcmp(order[k], "dispatcher") && dp == 1)
            continue;
        int copies = !strcmp(order[k], "worker") ? dp * launcher_state.tp_size : grouped ? dp : 1;
        for (int i = 0; i < copies; i++) {
            launcher_actor_t *a = &launcher_actors[launcher_state.nactors];
            snprintf(a->binary, sizeof a->binary, "%s", order[k]);
            int r = strcmp(order[k], "worker") ? 0 : i % launcher_state.tp_size, g = strcmp(order[k], "worker") ? i : i / launcher_state.tp_size;
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
            if (spread > 1) {
                a->node = grouped ? g * spread + r / per_node : 0;
                a->device = r % per_node;
            } else {
                a->node = grouped ? g % launcher_state.nnodes : 0;
                // The groups of a node number its GPUs from 0.
                a->device = g / launcher_state.nnodes * tp + r;
            }
            if (s_endpoint(a->endpoint, sizeof a->endpoint, name, a->node, launcher_state.nactors + 1) < 0)
                return -1;
            snprintf(a->log_path, sizeof a->log_path, "%s/logs/%s.log", launcher_state.run_dir, name);
            launcher_state.nactors++;
            launcher_state.nwant += launcher_state.node_rank == 0 || a->node == launcher_state.node_rank;
        }
    }
    // Each node's launcher binds its own control endpoint at the base port of its address.
    return s_endpoint(launcher_state.control, sizeof launcher_state.control, "control", launcher_state.node_rank, 0);
}

int plan_local(const void *actor) { return ((const launcher_actor_t *)actor)->node == launcher_state.node_rank; }

// Build argv for one actor: its identity, sockets, every other actor as a peer.
char **plan_argv(const launcher_actor_t *a) {
    int max = 16 + 2 * launcher_state.nactors + 2 * (int)launcher_npass, n = 0;
    for (size_t i = 0; i < launcher_npass; i++)
        max += (int)launcher_pass[i].values.n;
    char **argv = calloc((size_t)max, sizeof *argv);
#define PUSH(...) (asprintf(&argv[n], __VA_ARGS__) < 0 ? (void)(argv[n] = NULL) : (void)n++)
    PUSH("%s/loraserve-%s", launcher_state.bin_dir, a->binary);
    PUSH("--name=%s", a->name);
    PUSH("--bind=%s", a->endpoint);
    PUSH("--control=%s", launcher_state.control);
    if (launcher_state.node_rank > 0)
        PUSH("--control-key=%s", launcher_nodes[launcher_state.node_rank].launcher);
    PUSH("--rank=%d", a->rank);
    PUSH("--log-level=%s", launcher_state.log_level);
    PUSH("--heartbeat-ms=%d", launcher_state.heartbeat_ms);
    if (launcher_state.record_trace)
        PUSH("--record-trace=%s", launcher_state.record_trace);
    if (launcher_state.curve_dir[0])  // the directory only: no key is ever on a command line
        PUSH("--curve-dir=%s", launcher_state.curve_dir);
    unsigned kind = s_kind_bit(a->binary);
    if (kind & (K_WORKER | K_SCHEDULER))
        PUSH("--tp-size=%d", launcher_state.tp_size);
    // Data-parallel groups: each actor names its own group's peers; the front names the
    // dispatcher as its scheduler; each group's GPUs follow the previous group's.
    if (launcher_state.dp_size > 1) {
        if (kind & (K_TOKENIZER | K_REGISTRY | K_DETOKENIZER))
            PUSH("--scheduler=dispatcher");
        if (kind & K_SCHEDULER) {
            PUSH("--worker-prefix=worker-%d-", a->group);
            PUSH("--report-ends=true");
        }
        if (kind & K_WORKER)
            PUSH("--scheduler=scheduler-%d", a->group);
        if (kind & K_DISPATCHER)
            PUSH("--dp-size=%d", launcher_state.dp_size);
    }
    if (kind & K_WORKER)
        PUSH("--device=%d", a->device);
    if (kind & K_REGISTRY)  // its journal survives restarts of the graph in the same run dir
        PUSH("--state-dir=%s/state", launcher_state.run_dir);
    if (kind & (K_SCHEDULER | K_WORKER))  // the registry's copies of adapters sent as tensors
        PUSH("--lora-tensors-dir=%s/state/" LS_CONFINE_TENSORS_DIR, launcher_state.run_dir);
    for (size_t i = 0; i < launcher_npass; i++) {
        if (!(launcher_pass[i].kinds & kind))
            continue;
        if (launcher_pass[i].value)
            PUSH("--%s=%s", launcher_pass[i].name, launcher_pass[i].value);
        if (launcher_pass[i].on)
            PUSH("--%s", launcher_pass[i].name);
        for (size_t k = 0; k < launcher_pass[i].values.n; k++)
            PUSH("--%s=%s", launcher_pass[i].name, launcher_pass[i].values.v[k]);
    }
    for (int i = 0; i < launcher_state.nactors; i++)
        if (&launcher_actors[i] != a)
            PUSH("--peer=%s=%s", launcher_actors[i].name, launcher_actors[i].endpoint);
#undef PUSH
    return argv;
}

int plan_write_graph(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "run_dir", launcher_state.run_dir);
    cJSON_AddStringToObject(root, "transport", launcher_state.transport);
    cJSON_AddStringToObject(root, "control", launcher_state.control);
    cJSON_AddNumberToObject(root, "launcher_pid", getpid());
    cJSON *list = cJSON_AddArrayToObject(root, "actors");
    for (int i = 0; i < launcher_state.nactors; i++) {
        launcher_actor_t *a = &launcher_actors[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", a->name);
        cJSON_AddStringToObject(o, "kind", a->binary);
        cJSON_AddNumberToObject(o, "pid", plan_local(a) ? a->pid : a->remote_pid);
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
    snprintf(path, sizeof path, "%s/graph.json", launcher_state.run_dir);
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

// tcp: a CURVE keypair for every actor, each node's launcher and clients (the SDK). Fresh ones
// in RUN_DIR/keys by default; with --curve-dir the ones there (made once by --make-keys and
// copied to every node: the nodes of one graph share them). A bind beyond loopback is said out
// loud.
int plan_make_keys(void) {
    if (strcmp(launcher_state.transport, "tcp") != 0)
        return 0;
    const char *host = launcher_nodes[launcher_state.node_rank].addr;
    if (strncmp(host, "127.", 4) && strcmp(host, "localhost") && strcmp(host, "::1") && !launcher_state.make_keys)
        ls_warn(0, "--tcp-host %s is not a loopback address: the actors' ports are open to the network (CURVE "
                   "keeps out peers without the graph's keys; firewall them all the same)", host);
    const char *names[LAUNCHER_MAX_ACTORS + LAUNCHER_MAX_NODES + 1];
    int n = 0;
    for (int i = 0; i < launcher_state.nactors; i++)
        names[n++] = launcher_actors[i].name;
    for (int k = 0; k < launcher_state.nnodes; k++)
        names[n++] = launcher_nodes[k].launcher;
    names[n++] = "client";
    char err[512];
    if (!launcher_state.curve_dir_flag || launcher_state.make_keys) {
        if (launcher_state.curve_dir_flag)
            snprintf(launcher_state.curve_dir, sizeof launcher_state.curve_dir, "%s", launcher_state.curve_dir_flag);
        else
            snprintf(launcher_state.curve_dir, sizeof launcher_state.curve_dir, "%s/keys", launcher_state.run_dir);
        if (ls_curve_make(launcher_state.curve_dir, names, n, err, sizeof err) < 0) {
            ls_error(0, "%s", err);
            return -1;
        }
        if (launcher_state.make_keys)
            fprintf(stderr, "made %d CURVE keypairs in %s; copy the directory (mode 0700) to every node and give "
                            "each launcher --curve-dir\n", n, launcher_state.curve_dir);
        return 0;
    }
    char *real = realpath(launcher_state.curve_dir_flag, NULL);
    snprintf(launcher_state.curve_dir, sizeof launcher_state.curve_dir, "%s", real ? real : launcher_state.curve_dir_flag);
    free(real);
    for (int i = 0; i < n; i++) {
        char sec[PATH_MAX + 64], pub[PATH_MAX + 64];
        snprintf(sec, sizeof sec, "%s/secret/%s.key", launcher_state.curve_dir, names[i]);
        snprintf(pub, sizeof pub, "%s/public/%s.pub", launcher_state.curve_dir, names[i]);
        if (access(sec, R_OK) < 0 || access(pub, R_OK) < 0) {
            ls_error(0, "--curve-dir %s has no key for %s: make the graph's keys with loraserve --make-keys "
                        "--curve-dir DIR and the same --dp-size, --tp-size and --nnodes", launcher_state.curve_dir, names[i]);
            return -1;
        }
    }
    return 0;
}
