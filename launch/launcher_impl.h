// launcher_impl — what the launcher's rooms share: its state (the flags, this node's view of
// the graph, the restart budget), the planned actors and nodes, the flags handed on to the
// actors, and the functions one room calls in another. launcher.c holds the flags, the start
// and stop of the graph and the supervision; plan.c the plan, argv and graph.json; nodes.c the
// links between the nodes' launchers. Only these files include this.
#ifndef LS_LAUNCHER_IMPL_H
#define LS_LAUNCHER_IMPL_H

#include <ev.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "ls_actor.h"

#define LAUNCHER_MAX_ACTORS 72

typedef struct {
    char name[32];
    char binary[32];  // loraserve-<binary>
    char endpoint[256];
    char log_path[PATH_MAX];
    int rank;
    int group;  // --dp-size > 1: the data-parallel group of a scheduler or worker; else -1
    int node;   // the node (--node-rank) that runs it
    int device; // a worker's GPU on its node
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
} launcher_actor_t;

#define LAUNCHER_MAX_BUDGET 1024
#define LAUNCHER_MAX_NODES 16

typedef struct {
    char addr[128];             // --node-addrs: where this node's actors bind
    char launcher[32];          // "launcher" on node 0, "launcher-K" on node K
    int alive;                  // node 0: heard from its launcher within --hang-timeout-ms
    uint32_t pid;               // node 0: its launcher's pid (from its Ready): a new one is a restart
    uint64_t last_heartbeat_ns;
} launcher_node_t;

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
    uint64_t restart_ns[LAUNCHER_MAX_BUDGET];  // loop times of the restarts within the window, a ring
    int nrestart_times, restart_head;
    uint64_t start_ns;      // the loop time at start: node 0's uptime in its heartbeats
    uint64_t pings;         // node 0: heartbeats sent to the other nodes' launchers
    uint64_t upstream_ns;   // node K: when node 0's launcher was last heard from (0: never yet)
    uint64_t upstream_up_ms;  // node K: node 0's launcher's uptime in its last heartbeat
} launcher_t;

// A flag handed on to the actors (the table is in launcher.c); kinds: the K_ bits of those that
// take it.
enum { K_REGISTRY = 1, K_WORKER = 2, K_SCHEDULER = 4, K_DETOKENIZER = 8, K_TOKENIZER = 16, K_GATEWAY = 32, K_DISPATCHER = 64 };
enum { PASS_VALUE, PASS_LIST, PASS_SWITCH };  // --name=V; --name=V for each V given; --name alone
typedef struct {
    const char *name;
    int form;  // PASS_*
    unsigned kinds;
    const char *help;
    char *value;          // set with a value
    ls_strlist_t values;  // list flags
    int on;               // switches: given
} launcher_pass_t;

extern launcher_t launcher_state;
extern launcher_node_t launcher_nodes[LAUNCHER_MAX_NODES];
extern launcher_actor_t launcher_actors[LAUNCHER_MAX_ACTORS];
extern launcher_pass_t launcher_pass[];
extern const size_t launcher_npass;  // entries of launcher_pass

// launcher.c
void launcher_stop(int status, const char *why);  // stop the graph; the launcher exits with the worst status
void launcher_whole(void);                        // every actor this launcher counts is Ready: say so
void launcher_group_stop(const launcher_actor_t *lost);  // a worker is lost: stop this node's other ranks of its group

// plan.c
int plan_build(void);
launcher_actor_t *plan_find(const char *name);
int plan_local(const void *actor);  // runs on this node
char **plan_argv(const launcher_actor_t *a);  // NULL-terminated, each string and the array malloc'd
int plan_write_graph(void);
int plan_make_keys(void);

// nodes.c
int nodes_setup(void);
void nodes_send_to(const char *identity, const ls_msg_t *m);
void nodes_report(const launcher_actor_t *a, int up, const char *reason);
void nodes_announce(const launcher_actor_t *a, int up, const char *reason);
int nodes_of(const char *launcher);
void nodes_down(int k, const char *why, uint64_t now);
void nodes_ping(int k, uint64_t seq, uint64_t now);
void nodes_heard(int k, uint64_t now);
void nodes_upstream_lost(const char *why);
void nodes_upstream_heard(const ls_msg_t *m, uint64_t now);
int nodes_on_actor_status(ls_actor_t *self, ls_in_t *in, void *state);
int nodes_on_peer_status(ls_actor_t *self, ls_in_t *in, void *state);

#endif
