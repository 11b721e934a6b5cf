// nodes — who hears that an actor is up or down, and the links between the nodes' launchers
// (--nnodes > 1): PeerStatus to this node's actors and to the other nodes' launchers, node K's
// ActorStatus reports to node 0, node 0's heartbeats to node K and their answers, and a node
// (or node 0's launcher) lost. It stands apart from the launcher's own supervision, which
// restarts this node's actors and only announces them here.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher_impl.h"

void nodes_send_to(const char *identity, const ls_msg_t *m) {
    zframe_t *id = zframe_new(identity, strlen(identity));
    ls_actor_send(launcher_state.self, ls_actor_router(launcher_state.self), id, m, NULL);
    zframe_destroy(&id);
}

// PeerStatus to this node's Ready actors.
static void s_forward_status(const ls_msg_t *m) {
    for (int i = 0; i < launcher_state.nactors; i++) {
        launcher_actor_t *to = &launcher_actors[i];
        if (to->ready && !to->exited && plan_local(to))
            nodes_send_to(to->name, m);
    }
}

static void s_broadcast_status(const launcher_actor_t *a, int up, int collateral, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_PEER_STATUS);
    m.u.peer_status.actor = ls_msg_strdup(a->name);
    m.u.peer_status.up = up;
    m.u.peer_status.restarts = (uint32_t)a->restarts;
    m.u.peer_status.graph_ready = launcher_state.nready == launcher_state.nactors;
    m.u.peer_status.reason = ls_msg_strdup(reason);
    m.u.peer_status.collateral = collateral;
    s_forward_status(&m);
    // The other nodes' launchers hand it on to their actors.
    for (int k = 1; k < launcher_state.nnodes; k++)
        if (launcher_nodes[k].alive)
            nodes_send_to(launcher_nodes[k].launcher, &m);
    ls_msg_clear(&m);
}

// Node K: one of its actors is Ready or down, told to node 0's launcher, which tells the graph.
void nodes_report(const launcher_actor_t *a, int up, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ACTOR_STATUS);
    m.u.actor_status.actor = ls_msg_strdup(a->name);
    m.u.actor_status.up = up;
    m.u.actor_status.pid = (uint32_t)a->pid;
    m.u.actor_status.restarts = (uint32_t)a->restarts;
    m.u.actor_status.reason = ls_msg_strdup(reason);
    m.u.actor_status.collateral = a->collateral;
    ls_actor_send_control(launcher_state.self, &m);
    ls_msg_clear(&m);
}

// An actor of this node is Ready or down: node 0 tells every actor; node K tells node 0.
void nodes_announce(const launcher_actor_t *a, int up, const char *reason) {
    if (launcher_state.node_rank > 0)
        nodes_report(a, up, reason);
    else
        s_broadcast_status(a, up, !up && a->collateral, reason);
}

// --nnodes, --node-rank, --node-addrs, --dist-init-addr: each node's address and launcher.
int nodes_setup(void) {
    int m = launcher_state.nnodes;
    if (m < 1 || m > LAUNCHER_MAX_NODES || launcher_state.node_rank < 0 || launcher_state.node_rank >= m) {
        ls_error(0, "--nnodes must be 1..%d and --node-rank 0..nnodes-1", LAUNCHER_MAX_NODES);
        return -1;
    }
    for (int k = 0; k < m; k++)
        snprintf(launcher_nodes[k].launcher, sizeof launcher_nodes[k].launcher, k ? "launcher-%d" : "launcher", k);
    if (m == 1) {
        snprintf(launcher_nodes[0].addr, sizeof launcher_nodes[0].addr, "%s", launcher_state.tcp_host ? launcher_state.tcp_host : "127.0.0.1");
        return 0;
    }
    if (strcmp(launcher_state.transport, "tcp")) {
        ls_error(0, "--nnodes %d needs --transport tcp: the links between hosts are tcp, CURVE-authenticated "
                    "(ipc sockets reach one host only)", m);
        return -1;
    }
    // "A B" or "A,B": split every value at its commas.
    int naddrs = 0;
    for (size_t i = 0; i < launcher_state.node_addrs.n; i++)
        for (char *save = NULL, *tok = strtok_r(launcher_state.node_addrs.v[i], ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (naddrs < LAUNCHER_MAX_NODES)
                snprintf(launcher_nodes[naddrs++].addr, sizeof launcher_nodes[0].addr, "%s", tok);
    if (naddrs != m) {
        ls_error(0, "--nnodes %d needs --node-addrs with %d addresses, node 0's first (the same list on every node; "
                    "node K's actors bind on its address)", m, m);
        return -1;
    }
    if (!launcher_state.curve_dir_flag) {
        ls_error(0, "--nnodes %d needs --curve-dir: the nodes share one set of CURVE keys (loraserve --make-keys)", m);
        return -1;
    }
    if (launcher_state.tcp_host && strcmp(launcher_state.tcp_host, launcher_nodes[launcher_state.node_rank].addr)) {
        ls_error(0, "--tcp-host %s is not node %d's address in --node-addrs (%s)", launcher_state.tcp_host, launcher_state.node_rank,
                 launcher_nodes[launcher_state.node_rank].addr);
        return -1;
    }
    // --dist-init-addr is node 0's launcher: its address and the base port every node uses.
    if (launcher_state.dist_init_addr) {
        const char *colon = strrchr(launcher_state.dist_init_addr, ':');
        int port = colon ? atoi(colon + 1) : 0;
        if (!colon || port <= 0 || port > 65535 || (size_t)(colon - launcher_state.dist_init_addr) != strlen(launcher_nodes[0].addr) ||
            strncmp(launcher_state.dist_init_addr, launcher_nodes[0].addr, (size_t)(colon - launcher_state.dist_init_addr))) {
            ls_error(0, "--dist-init-addr %s must be HOST:PORT with HOST node 0's address in --node-addrs (%s)",
                     launcher_state.dist_init_addr, launcher_nodes[0].addr);
            return -1;
        }
        launcher_state.tcp_base_port = port;
    }
    return 0;
}

int nodes_of(const char *launcher) {
    for (int k = 1; k < launcher_state.nnodes; k++)
        if (!strcmp(launcher_nodes[k].launcher, launcher))
            return k;
    return -1;
}

// Node 0: a remote actor is down (its node said so, went silent, or started anew). A worker's
// tensor-parallel ranks here stop with it unless it was itself stopped for its group.
static void s_remote_down(launcher_actor_t *a, const char *reason, int collateral, uint64_t now) {
    if (!collateral)
        launcher_group_stop(a);
    if (!a->ready)
        return;
    a->ready = 0;
    a->down_ns = now;
    launcher_state.nready--;
    ls_error(0, "%s on node %d (%s) is down: %s", a->name, a->node, launcher_nodes[a->node].addr, reason);
    s_broadcast_status(a, 0, collateral, reason);
}

void nodes_down(int k, const char *why, uint64_t now) {
    ls_error(0, "node %d (%s) %s: its actors are down until it reports them Ready again", k, launcher_nodes[k].addr, why);
    char reason[200];
    snprintf(reason, sizeof reason, "node %d (%s) %s", k, launcher_nodes[k].addr, why);
    for (int i = 0; i < launcher_state.nactors; i++)
        if (launcher_actors[i].node == k)
            s_remote_down(&launcher_actors[i], reason, 0, now);
}

// Node 0's Heartbeat to node K's launcher: seq 0 asks for the state of its actors; seq > 0
// answers one of its heartbeats, so node K hears node 0's silence too. The uptime tells node K
// a new launcher from the one its actors joined.
void nodes_ping(int k, uint64_t seq, uint64_t now) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_HEARTBEAT);
    m.u.heartbeat.actor = ls_msg_strdup("launcher");
    m.u.heartbeat.seq = seq;
    m.u.heartbeat.uptime_ms = (now - launcher_state.start_ns) / 1000000;
    nodes_send_to(launcher_nodes[k].launcher, &m);
    ls_msg_clear(&m);
}

// Node 0 heard from node K's launcher. The first word after silence asks it for the state of
// its actors, which it answers with an ActorStatus for each Ready one.
void nodes_heard(int k, uint64_t now) {
    launcher_nodes[k].last_heartbeat_ns = now;
    if (launcher_nodes[k].alive)
        return;
    launcher_nodes[k].alive = 1;
    ls_info(0, "node %d (%s) is connected (its launcher: pid %u)", k, launcher_nodes[k].addr, launcher_nodes[k].pid);
    nodes_ping(k, 0, now);
}

// Node K: node 0's launcher is gone (silent, or a new one). This node's actors joined a graph
// that no longer exists, so they stop, and this launcher exits 1 for the host's supervisor
// (systemd, Kubernetes) to start it again; the new one starts its actors and waits for node 0,
// whose new graph counts them once they report Ready.
void nodes_upstream_lost(const char *why) {
    char reason[256];
    snprintf(reason, sizeof reason, "node 0's launcher (%s) %s", launcher_nodes[0].addr, why);
    ls_error(0, "%s: stopping this node's actors and exiting 1 (a supervisor starts this launcher again, which "
                "then waits for node 0)", reason);
    launcher_stop(1, reason);
}

// Node K heard node 0's launcher: a Heartbeat (whose uptime going back means a new launcher)
// or PeerStatus.
void nodes_upstream_heard(const ls_msg_t *m, uint64_t now) {
    if (m->type == LS_MSG_HEARTBEAT) {
        if (launcher_state.upstream_ns && m->u.heartbeat.uptime_ms < launcher_state.upstream_up_ms) {
            nodes_upstream_lost("started anew");
            return;
        }
        launcher_state.upstream_up_ms = m->u.heartbeat.uptime_ms;
    }
    launcher_state.upstream_ns = now;
}

// Node 0: node K's launcher reports one of its actors.
int nodes_on_actor_status(ls_actor_t *self, ls_in_t *in, void *state) {
    const ls_msg_actor_status_t *st = &in->msg->u.actor_status;
    int k = launcher_state.node_rank == 0 ? nodes_of(in->from) : -1;
    launcher_actor_t *a = st->actor ? plan_find(st->actor) : NULL;
    if (k < 0 || !a || a->node != k) {
        ls_warn(0, "ActorStatus from %s about \"%s\" ignored: not an actor of that node", in->from,
                st->actor ? st->actor : "");
        return 0;
    }
    nodes_heard(k, in->now_ns);
    if (st->up && a->ready && (pid_t)st->pid != a->remote_pid)
        s_remote_down(a, "restarted on its node", 0, in->now_ns);
    if (!st->up) {
        s_remote_down(a, st->reason ? st->reason : "down on its node", st->collateral, in->now_ns);
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
    launcher_state.nready++;
    ls_info(0, "%s on node %d (%s) is ready (%d/%d)", a->name, k, launcher_nodes[k].addr, launcher_state.nready, launcher_state.nwant);
    launcher_whole();
    s_broadcast_status(a, 1, 0, NULL);
    return 0;
}

// Node K: PeerStatus from node 0 (the runtime takes it from the control socket only), for
// this node's actors; a worker of another node lost stops this node's ranks of its group.
int nodes_on_peer_status(ls_actor_t *self, ls_in_t *in, void *state) {
    const ls_msg_peer_status_t *st = &in->msg->u.peer_status;
    if (launcher_state.node_rank > 0) {
        nodes_upstream_heard(in->msg, in->now_ns);
        launcher_actor_t *a = st->actor ? plan_find(st->actor) : NULL;
        if (a && !st->up && !st->collateral && !plan_local(a))
            launcher_group_stop(a);
        s_forward_status(in->msg);
    }
    return 0;
}
