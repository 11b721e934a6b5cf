// ls_actor — the actor runtime every loraserve process is built on.
//
// One actor = one process = one libev loop. The actor binds one ROUTER socket (its address:
// clients and other actors send to it), opens one DEALER per peer it talks to (created on
// first use, identity = the actor's name), and one DEALER to the launcher's control endpoint.
// Inbound messages are decoded once and dispatched through the actor's table (message type →
// handler); Heartbeat, Shutdown and GetMetrics have built-in handlers that a table may
// override. Unknown or malformed messages are counted, logged and answered with an Error.
//
// ZeroMQ signals readiness through ZMQ_FD, which is edge-triggered: the runtime drains a
// socket while ZMQ_EVENTS says POLLIN, at most LS_DRAIN_CAP messages, or messages for
// LS_DRAIN_BUDGET_NS, per loop turn so one busy socket cannot starve the others, the timers and
// the job completions (a worker with the next plan always waiting runs one step a turn), and
// re-checks after every send (a send can consume the edge). Lifecycle: on_start, then Ready to the launcher, Heartbeat on a timer, and on Shutdown
// or SIGTERM/SIGINT: on_shutdown (which answers every in-flight request), close, exit 0.
//
// Determinism for replay: handlers read time only through ls_actor_now_ns(), the time of the
// event being handled, which is recorded in the trace with the event. Anything else an actor
// takes from outside its messages goes through a recorded hook: ls_actor_input (start-up
// reads such as a journal), ls_actor_job_result (what a background job read). Replay mode
// (--replay FILE, docs/debugging.md) runs the same actor code with no sockets: the trace's
// inbound messages, timer firings, job completions and signals are dispatched in record order
// with their recorded times, and every message the actor sends is compared with the next
// recorded one (ls_msg_equal_unmeasured); the first difference is printed and the process
// exits LS_REPLAY_DIVERGED.
#ifndef LS_ACTOR_H
#define LS_ACTOR_H

#include <czmq.h>
#include <stdint.h>

#include "ls_flags.h"
#include "ls_log.h"
#include "ls_msg.h"

#define LS_DRAIN_CAP 64
#define LS_DRAIN_BUDGET_NS 1000000
#define LS_MAX_COUNTERS 128
#define LS_MAX_INFO 16
#define LS_MAX_PEERS 64

typedef struct ls_actor ls_actor_t;
typedef struct ls_sock ls_sock_t;
typedef struct ls_timer ls_timer_t;

// Where a message came from, kept by a handler that answers later (e.g. after a step).
typedef struct ls_route ls_route_t;

// One inbound message as a handler sees it. Everything is owned by the runtime and valid until
// the handler returns; a handler keeps the message by moving it out (memcpy, then ls_msg_init
// the original) and keeps the bulk frames by taking the pointer (set in->bulk to NULL).
typedef struct {
    ls_sock_t *sock;     // socket it arrived on
    zframe_t *identity;  // ROUTER: the sender's routing identity; NULL on a DEALER
    const char *from;    // printable sender: its identity (ROUTER) or the peer's name (DEALER)
    ls_msg_t *msg;       // the decoded message
    zmsg_t *bulk;        // frames after the body (bulk data); NULL when none
    uint64_t now_ns;     // recorded time of this event (monotonic)
} ls_in_t;

// A handler returns 0, or -1 after answering the sender itself (the runtime only counts it).
typedef int (*ls_handler_fn)(ls_actor_t *a, ls_in_t *in, void *state);

typedef struct {
    uint16_t type;  // ls_msg_type_t
    ls_handler_fn fn;
} ls_dispatch_t;  // a table ends with {0, NULL}

typedef struct {
    const char *name;                 // default actor name ("scheduler")
    const char *about;                // one line for --help
    const ls_dispatch_t *dispatch;    // this actor's handlers
    ls_flag_t *flags;                 // this actor's own flags (may be NULL)
    void *state;                      // passed to every hook and handler
    // After sockets are set up, before Ready. Return 0 to be Ready now; LS_READY_LATER when
    // readiness waits on messages (startup adapters loading): the actor then calls
    // ls_actor_ready itself; -1 (after logging why) to exit 1.
    int (*on_start)(ls_actor_t *a, void *state);
    // Shutdown began: answer or fail every in-flight request now (the sockets still work).
    void (*on_shutdown)(ls_actor_t *a, void *state);
    // Release what on_start acquired; called once, after the loop ends.
    void (*on_destroy)(ls_actor_t *a, void *state);
    // GetMetrics is about to be answered: set what costs too much to keep current after every
    // event (a list built by walking the queues, ls_actor_info), and fill the answer's fields
    // that the runtime does not (histograms); the runtime then adds its counters, gauges and
    // facts to m. May be NULL.
    void (*on_metrics)(ls_actor_t *a, ls_msg_metrics_t *m, void *state);
} ls_actor_def_t;

typedef struct {
    const char *name;          // actor name: log field, trace file name, DEALER identity
    const char *bind;          // ROUTER endpoint to bind, or NULL for none
    const char *control;       // launcher's control endpoint, or NULL
    const char *control_key;   // tcp: the name of its CURVE key (NULL: "launcher"; node K's: launcher-K)
    const ls_strlist_t *peers; // "name=endpoint" entries
    const char *trace_dir;     // record a trace there, or NULL
    const char *curve_dir;     // CURVE keys for tcp endpoints (ls_curve.h), or NULL
    int heartbeat_ms;          // period of Heartbeat to the control endpoint (0: none)
    int rank;                  // reported in Ready
    int process;               // 1: own the process: default loop, SIGINT/SIGTERM handlers
    int argc;                  // the command line, recorded in the trace's meta record
    const char *const *argv;
    const char *replay;        // replay this trace file instead of opening sockets, or NULL
    int replay_run;            // which run of the file, from 1; 0: the last
    uint64_t replay_until;     // pause for a debugger after this many inbound messages; 0: never
} ls_actor_opts_t;

#define LS_REPLAY_DIVERGED 3  // exit status of a replay that diverged from its recording

// Create an actor: bind, connect, open the trace. NULL on failure (logged).
ls_actor_t *ls_actor_new(const ls_actor_def_t *def, const ls_actor_opts_t *opts);
void ls_actor_destroy(ls_actor_t **self_p);
// on_start, Ready, then the loop until shutdown completes. 0 on a clean stop, -1 if on_start
// failed.
int ls_actor_run(ls_actor_t *self);
// The whole process: parse the common flags plus def->flags, log setup, new, run, destroy.
// Returns the process exit status.
int ls_actor_main(int argc, char **argv, const ls_actor_def_t *def);

#define LS_READY_LATER 1
// Tell the launcher this actor is Ready (once; later calls do nothing). ls_actor_run does it
// after on_start unless on_start returned LS_READY_LATER.
void ls_actor_ready(ls_actor_t *self);

// Begin a graceful shutdown from inside the actor (as if Shutdown had arrived).
void ls_actor_shutdown(ls_actor_t *self, const char *reason);

// Supervision. The launcher tells every Ready actor when another goes down or is Ready again
// (PeerStatus, accepted only on the control socket; an actor without a handler ignores it).
// ls_actor_supervised: this actor has a launcher (--control), so PeerStatus will come.
int ls_actor_supervised(const ls_actor_t *self);

const char *ls_actor_name(const ls_actor_t *self);
int ls_actor_rank(const ls_actor_t *self);  // --rank: a worker's place in its group
uint64_t ls_actor_now_ns(const ls_actor_t *self);
// The monotonic clock itself, for measurements reported in messages (step time); decisions
// use ls_actor_now_ns, which replay reproduces.
uint64_t ls_mono_ns(void);
struct ev_loop *ls_actor_loop(ls_actor_t *self);

// Sending. The message is only read (encode); bulk, when given, is consumed (*bulk_p = NULL).
// Returns -1 when the message cannot be encoded or the socket refuses it (peer gone, queue
// full); the failure is logged and counted, never fatal.
int ls_actor_send(ls_actor_t *self, ls_sock_t *sock, zframe_t *identity, const ls_msg_t *msg,
                  zmsg_t **bulk_p);
// Send to a named peer from --peer (its DEALER is created on first use).
int ls_actor_send_peer(ls_actor_t *self, const char *peer, const ls_msg_t *msg, zmsg_t **bulk_p);
// Answer the sender of `in` on the socket it came from.
int ls_actor_reply(ls_actor_t *self, const ls_in_t *in, const ls_msg_t *msg);
// Answer the sender of `in` with an Error carrying in's rid.
int ls_actor_reply_error(ls_actor_t *self, const ls_in_t *in, uint32_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int ls_actor_send_control(ls_actor_t *self, const ls_msg_t *msg);
ls_sock_t *ls_actor_peer(ls_actor_t *self, const char *peer);
// The actor's own ROUTER (NULL without --bind); send to a peer on it by its identity.
ls_sock_t *ls_actor_router(ls_actor_t *self);
int ls_actor_has_peer(const ls_actor_t *self, const char *peer);
// The i-th peer's name in --peer order, for i < ls_actor_peer_count; NULL past the end.
int ls_actor_peer_count(const ls_actor_t *self);
const char *ls_actor_peer_name(const ls_actor_t *self, int i);

// Routes: copy where `in` came from, to answer later.
ls_route_t *ls_route_new(const ls_in_t *in);
void ls_route_destroy(ls_route_t **self_p);
int ls_actor_send_route(ls_actor_t *self, const ls_route_t *route, const ls_msg_t *msg, zmsg_t **bulk_p);
int ls_actor_route_error(ls_actor_t *self, const ls_route_t *route, uint64_t rid, uint32_t code,
                         uint32_t ref_type, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

// Timers: fire after `after_ms`, then every `repeat_ms` (0: once; re-arm with _again). Each
// firing is a recorded event. Timers live until stopped or the actor is destroyed.
typedef void (*ls_timer_fn)(ls_actor_t *a, ls_timer_t *timer, void *arg);
ls_timer_t *ls_actor_timer_start(ls_actor_t *self, double after_ms, double repeat_ms, ls_timer_fn fn,
                                 void *arg);
void ls_actor_timer_again(ls_actor_t *self, ls_timer_t *timer, double after_ms);
void ls_actor_timer_stop(ls_actor_t *self, ls_timer_t *timer);

// Jobs: slow work (disk reads of adapters) runs on the actor's one background thread, in
// submission order; `done` then runs on the loop, one job at a time and in the same order,
// as a recorded event. `work` must not touch actor state; it hands results over in `arg`.
typedef void (*ls_job_work_fn)(void *arg);
typedef void (*ls_job_done_fn)(ls_actor_t *a, void *arg);
int ls_actor_job(ls_actor_t *self, ls_job_work_fn work, ls_job_done_fn done, void *arg);
// A job whose work reads the outside (files) and leaves everything the actor then uses in
// result[0..result_size) (plain bytes: no pointers). The result is recorded with the job's
// completion; in replay the work does not run and the recorded result is put in its place.
// A plain ls_actor_job's work runs again in replay: keep it to reading model files.
int ls_actor_job_result(ls_actor_t *self, ls_job_work_fn work, ls_job_done_fn done, void *arg, void *result,
                        size_t result_size);

// Raw byte streams (the gateway's HTTP clients): the runtime owns the listening socket and its
// connections, so that everything the actor sees of them is a recorded event. Live: every
// accepted connection (stream-open), every read (stream-data in) and every loss of the client
// (stream-close in: EOF, reset, a failed write, output left unread) is recorded and handed to
// the callbacks; every write and close of the actor is recorded (stream-data out,
// stream-close out). Replay: no socket; the recorded opens, reads and losses are fed to the
// callbacks at their recorded times, and writes and closes are compared like sent messages.
// What the kernel does with the bytes (partial writes, backpressure, the linger before close)
// stays in the runtime: the actor's decisions never depend on it.
typedef struct ls_stream ls_stream_t;
typedef struct {
    void (*on_open)(ls_actor_t *a, ls_stream_t *s, void *arg);
    void (*on_data)(ls_actor_t *a, ls_stream_t *s, const char *data, size_t len, void *arg);
    // The client is gone (why: for the log); the stream is freed when this returns.
    void (*on_close)(ls_actor_t *a, ls_stream_t *s, const char *why, void *arg);
    size_t max_unsent;  // written bytes a client may leave unread before it is dropped
    int stall_ms;       // a client that reads none of its pending output this long is dropped
} ls_stream_def_t;
// Listen on host:port (port 0: any free port). One listener per actor. Returns the port bound
// (the recorded one in replay), or -1 (logged).
int ls_actor_stream_listen(ls_actor_t *self, const char *host, int port, const ls_stream_def_t *def, void *arg);
// Queue bytes for the client. Never calls back: a failure is reported later through on_close.
void ls_stream_write(ls_stream_t *s, const void *data, size_t len);
// The actor is done with the stream (no callback follows): the runtime sends what is queued,
// shuts the write side and drains the input a moment, so the client reads the last answer
// instead of a reset.
void ls_stream_close(ls_stream_t *s);
// Stop (1) or resume (0) reading: input the actor cannot take yet waits in the kernel.
void ls_stream_pause(ls_stream_t *s, int paused);
void ls_stream_set_data(ls_stream_t *s, void *data);
void *ls_stream_data(const ls_stream_t *s);
uint32_t ls_stream_id(const ls_stream_t *s);  // connection id, as in the trace

// Replay. ls_actor_replaying: the actor is being replayed; it must then leave the outside
// alone (write no journal, bind nothing) and take its inputs from ls_actor_input.
int ls_actor_replaying(const ls_actor_t *self);
// An input read on the loop from outside the messages (at start-up: a journal's contents).
// Recording: *frames_p, as the actor read it, is written to the trace under `key`. Replay:
// *frames_p is replaced by the recorded frames (the actor skipped the reading). Not
// replaying or recording: nothing. Returns 0; a replay that finds no such input here exits
// as a divergence.
int ls_actor_input(ls_actor_t *self, const char *key, zmsg_t **frames_p);
// Called where a replay pauses (--replay-until) and where it diverges, so that a debugger's
// breakpoint lands there (loraserve-replay --gdb sets it).
void ls_replay_break(void);

// Counters exposed through GetMetrics (and later /metrics). The pointer stays valid for the
// actor's life; NULL only when the table is full (logged once).
uint64_t *ls_actor_counter(ls_actor_t *self, const char *name);
// The same for a gauge: a level that moves both ways (a queue's length, bytes in use), which
// /metrics types as such, so that a reader takes its value rather than its increase.
uint64_t *ls_actor_gauge(ls_actor_t *self, const char *name);
void ls_actor_count(ls_actor_t *self, const char *name, uint64_t n);
// A counter or a gauge set to value: for a core that keeps its own counts, published as they are.
void ls_actor_counter_set(ls_actor_t *self, const char *name, uint64_t value);
void ls_actor_gauge_set(ls_actor_t *self, const char *name, uint64_t value);
uint64_t ls_actor_counter_get(ls_actor_t *self, const char *name);
// A fact that is text, not a number (the scheduler's running_lora_adapters), reported in
// Metrics.info_*: set to value, replacing the last one. -1 when the table (LS_MAX_INFO) is full
// (logged) or memory is.
int ls_actor_info(ls_actor_t *self, const char *name, const char *value);
// A counter read from the clock (durations): reported in Metrics.measured_*, which replay does
// not compare. Every actor has busy_us_total, the time its message handlers took.
void ls_actor_measure(ls_actor_t *self, const char *name, uint64_t n);

#endif
