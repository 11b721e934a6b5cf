// dispatcher — the front of several data-parallel groups (--dp-size N): what the tokenizer,
// the registry and the detokenizer see as the scheduler (docs/scheduling.md, "Data-parallel
// groups").
//
// Accepts: TokenizedReq, Abort (tokenizer, detokenizer, or a test client, on the ROUTER);
//          LoadAdapter, UnloadAdapter, ListAdapters (the registry);
//          RequestEnded, Error, TokenOut (with the schedulers' --output route), AdapterLoaded,
//          AdapterUnloaded, AdapterList (from scheduler-0 … scheduler-(N-1));
//          PeerStatus (the launcher: a group's scheduler or worker went down or came back);
//          and the lifecycle messages every actor handles (Heartbeat, Shutdown, GetMetrics).
// Emits:   TokenizedReq, Abort, LoadAdapter, UnloadAdapter, ListAdapters (to the groups'
//          schedulers); Error, TokenOut (relayed to a request's sender), AdapterLoaded,
//          AdapterUnloaded, AdapterList (one answer to the registry); TokenOut ERROR for the
//          requests of a group that died (to the detokenizer, or the sender with --output route);
//          Ready, Heartbeat, Metrics.
//
// Every decision is the core's (dispatch.c, which has no sockets); this file wires the
// sockets, flags and counters to it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "ls_actor.h"

typedef struct {
    int groups, block_size;
    char *output;
    int output_route;  // a dead group's TokenOut ERROR goes back on the request's route
    ls_actor_t *actor;
    disp_t *core;
} app_t;

static app_t s_app;

static ls_flag_t s_flags[] = {
    LS_FLAG_INT("dp-size", &s_app.groups, "2", "data-parallel groups: their schedulers are scheduler-0 … scheduler-(N-1)"),
    LS_FLAG_INT("block-size", &s_app.block_size, "16", "tokens per KV block, as the workers': prefix affinity hashes whole blocks"),
    LS_FLAG_STR("output", &s_app.output, "detokenizer",
                "the schedulers' --output: where a dead group's requests are answered (detokenizer or route)"),
    LS_FLAG_END,
};

static void s_emit(void *arg, const disp_dest_t *d, const ls_msg_t *msg) {
    app_t *app = arg;
    switch (d->kind) {
    case DISP_TO_GROUP: {
        char name[32];
        snprintf(name, sizeof name, "scheduler-%d", d->group);
        ls_actor_send_peer(app->actor, name, msg, NULL);
        return;
    }
    case DISP_TO_OUTPUT:
        if (!app->output_route) {
            ls_actor_send_peer(app->actor, "detokenizer", msg, NULL);
            return;
        }
        break;
    case DISP_TO_REPLY:
        break;
    }
    if (d->reply)
        ls_actor_send_route(app->actor, d->reply, msg, NULL);
}

static void s_release(void *arg, void *reply) {
    ls_route_t *route = reply;
    ls_route_destroy(&route);
}

// After every event: the core's counters, per group by name.
static void s_sync(app_t *app) {
    const disp_stats_t *st = disp_stats(app->core);
    char name[64];
    for (int g = 0; g < app->groups; g++) {
        snprintf(name, sizeof name, "group_%d_load", g);
        ls_actor_gauge_set(app->actor, name, st->load[g]);
        snprintf(name, sizeof name, "group_%d_dispatched", g);
        ls_actor_counter_set(app->actor, name, st->dispatched[g]);
    }
    const struct {
        const char *name;
        uint64_t v;
        bool gauge;
    } c[] = {
        {"dispatched_by_adapter", st->by[DISP_BY_ADAPTER], false},
        {"dispatched_by_prefix", st->by[DISP_BY_PREFIX], false},
        {"dispatched_by_load", st->by[DISP_BY_LOAD], false},
        {"imbalance_bound_overrides", st->bound_overrides, false},
        {"groups_dead", st->groups_dead, true},
        {"group_deaths", st->group_deaths, false},
        {"requests_failed", st->requests_failed, false},
        {"adapters_kept", st->adapters, true},
        {"adapter_reloads", st->reloads, false},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        (c[i].gauge ? ls_actor_gauge_set : ls_actor_counter_set)(app->actor, c[i].name, c[i].v);
    }
}

// The group of a name: scheduler-G (worker -1) or worker-G-R; -1 for anyone else.
static int s_group_of(const app_t *app, const char *name, int *worker) {
    int g, r, n = -1;
    *worker = -1;
    if (sscanf(name, "scheduler-%d%n", &g, &n) == 1 && n == (int)strlen(name) && g >= 0 && g < app->groups)
        return g;
    n = -1;
    if (sscanf(name, "worker-%d-%d%n", &g, &r, &n) == 2 && n == (int)strlen(name) && g >= 0 && g < app->groups && r >= 0) {
        *worker = r;
        return g;
    }
    return -1;
}

// A message on the DEALER to a group's scheduler: its answer or news of a request.
static int s_from_group(const app_t *app, const ls_in_t *in) {
    int worker = -1;
    int g = in->identity ? -1 : s_group_of(app, in->from, &worker);
    return worker < 0 ? g : -1;
}

static int s_on_request(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    disp_on_request(app->core, in->now_ns, in->msg, ls_route_new(in));
    s_sync(app);
    return 0;
}

static int s_on_abort(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    disp_on_abort(app->core, in->now_ns, in->msg);
    return 0;
}

static int s_on_adapter_command(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    // A load from tensors is refused by the core: its frames go nowhere.
    disp_on_adapter_command(app->core, in->now_ns, in->msg, ls_route_new(in));
    s_sync(app);
    return 0;
}

// Answers and request news come from the groups' schedulers only.
static int s_on_group_message(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    int g = s_from_group(app, in);
    if (g < 0) {
        if (in->msg->type == LS_MSG_ERROR)
            ls_warn(in->msg->rid, "%s refused %s: %s", in->from, ls_msg_type_name((int)in->msg->u.error.ref_type),
                    in->msg->u.error.message ? in->msg->u.error.message : "");
        else
            ls_warn(in->msg->rid, "%s from %s ignored: only the groups' schedulers send it", ls_msg_type_name(in->msg->type),
                    in->from);
        return 0;
    }
    disp_on_group_message(app->core, in->now_ns, g, in->msg);
    s_sync(app);
    return 0;
}

static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    app_t *app = state;
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    int worker, g = ps->actor ? s_group_of(app, ps->actor, &worker) : -1;
    if (g < 0)
        return 0;
    if (!ps->up)
        ls_warn(0, "%s went down: group %d %s", ps->actor, g,
                worker < 0 ? "fails its requests and takes no new ones" : "takes no new requests until it is back");
    disp_on_group_status(app->core, in->now_ns, g, worker, ps->up, ps->restarts, ps->reason);
    s_sync(app);
    return 0;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_TOKENIZED_REQ, s_on_request},
    {LS_MSG_ABORT, s_on_abort},
    {LS_MSG_LOAD_ADAPTER, s_on_adapter_command},
    {LS_MSG_UNLOAD_ADAPTER, s_on_adapter_command},
    {LS_MSG_LIST_ADAPTERS, s_on_adapter_command},
    {LS_MSG_REQUEST_ENDED, s_on_group_message},
    {LS_MSG_ERROR, s_on_group_message},
    {LS_MSG_TOKEN_OUT, s_on_group_message},
    {LS_MSG_ADAPTER_LOADED, s_on_group_message},
    {LS_MSG_ADAPTER_UNLOADED, s_on_group_message},
    {LS_MSG_ADAPTER_LIST, s_on_group_message},
    {0, NULL},
};

static int s_start(ls_actor_t *a, void *state) {
    app_t *app = state;
    app->actor = a;
    if (app->groups < 1 || app->groups > DISP_MAX_GROUPS || app->block_size < 1 ||
        (strcmp(app->output, "detokenizer") && strcmp(app->output, "route"))) {
        ls_error(0, "bad flags: --dp-size 1..%d, --block-size at least 1, --output detokenizer|route", DISP_MAX_GROUPS);
        return -1;
    }
    app->output_route = !strcmp(app->output, "route");
    for (int g = 0; g < app->groups; g++) {
        char name[32];
        snprintf(name, sizeof name, "scheduler-%d", g);
        if (!ls_actor_has_peer(a, name))
            ls_warn(0, "no --peer %s=…: requests sent to group %d have nowhere to go", name, g);
    }
    const disp_config_t cfg = {.groups = app->groups, .block_size = app->block_size};
    const disp_io_t io = {.emit = s_emit, .release = s_release, .arg = app};
    if (!(app->core = disp_new(&cfg, &io))) {
        ls_error(0, "cannot create the dispatcher core");
        return -1;
    }
    s_sync(app);
    return 0;
}

static void s_shutdown(ls_actor_t *a, void *state) {
    app_t *app = state;
    if (app->core)
        disp_shutdown(app->core, ls_actor_now_ns(a));
}

static void s_destroy(ls_actor_t *a, void *state) { disp_destroy(&((app_t *)state)->core); }

int main(int argc, char **argv) {
    const ls_actor_def_t def = {
        .name = "dispatcher",
        .about = "loraserve dispatcher: routes requests over data-parallel groups by adapter, prefix and load",
        .dispatch = s_dispatch,
        .flags = s_flags,
        .state = &s_app,
        .on_start = s_start,
        .on_shutdown = s_shutdown,
        .on_destroy = s_destroy,
    };
    return ls_actor_main(argc, argv, &def);
}
