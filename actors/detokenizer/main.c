// detokenizer — turns the scheduler's token ids into text, incrementally: UTF-8 safe (never half
// a character), SentencePiece spaces and byte-fallback runs as the full decode has them,
// skip_special_tokens, and stop strings held back until resolved so none is ever partly
// streamed. The decisions are in stream.c (per-request ls_detok state); see docs/frontdoor.md.
//
// Accepts on its ROUTER, from the scheduler:
//   TokenOut {token_ids, logprobs, top_*, finish, first (+ sampling: stop, skip_special_tokens)}
//            state is created on `first` and freed at the request's end
// Accepts on its control DEALER: PeerStatus (the scheduler or tokenizer went down: streams dropped).
// Accepts on its DEALER to the scheduler: Error (an Abort for a request that had ended): logged.
// Emits to the tokenizer peer: TextOut (rid = the tokenizer's request id) per TokenOut: the text
//   now final, the tokens it came from, their logprobs and (with logprobs) each token's and
//   alternative's text decoded alone; the last one has finish (+ error,
//   error_code for ERROR), or finish STOP + matched_stop when a stop string ended it.
// Emits to the scheduler peer: Abort {finish STOP} when a stop string matched while it was still
//   generating (its later TokenOuts for that request are dropped), Abort {finish ABORT} when a
//   token is outside the vocabulary.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ls_actor.h"
#include "ls_limits.h"
#include "stream.h"

typedef struct {
    char *model_path;
    char *scheduler;  // --scheduler: the peer that plays the scheduler's role
    ls_actor_t *actor;
    ls_tokenizer_t *tok;
    dstream_t *stream;
} detok_app_t;

static detok_app_t s_app;

static void s_publish(detok_app_t *app) {
    const dstream_stats_t *st = dstream_stats(app->stream);
    const struct {
        const char *name;
        uint64_t v;
    } c[] = {
        {"requests_total", st->requests},          {"tokens_total", st->tokens},
        {"stop_string_matches_total", st->stop_matches}, {"token_outs_dropped_total", st->dropped},
        {"requests_failed_total", st->failed},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        ls_actor_counter_set(app->actor, c[i].name, c[i].v);
    }
    ls_actor_gauge_set(app->actor, "requests_active", st->active);
}

// The stream names roles ("tokenizer", "scheduler"); the scheduler's role is --scheduler's peer.
static void s_send(void *host, const char *peer, const ls_msg_t *msg) {
    detok_app_t *app = host;
    ls_actor_send_peer(app->actor, strcmp(peer, "scheduler") ? peer : app->scheduler, msg, NULL);
}

static int s_on_token_out(ls_actor_t *a, ls_in_t *in, void *state) {
    detok_app_t *app = state;
    dstream_on_token_out(app->stream, in->msg);
    s_publish(app);
    return 0;
}

// The scheduler answers an Abort for a request it no longer has with nothing; anything else it
// refuses is only worth a line in the log.
static int s_on_error(ls_actor_t *a, ls_in_t *in, void *state) {
    const ls_msg_error_t *e = &in->msg->u.error;
    ls_warn(in->msg->rid, "%s refused %s: %s", in->from, ls_msg_type_name((int)e->ref_type) ? ls_msg_type_name((int)e->ref_type) : "a message",
            e->message ? e->message : "");
    return 0;
}

// The launcher's news of the graph: with the scheduler or the tokenizer gone, no stream here
// will be finished or read (the tokenizer has answered their clients).
static int s_on_peer_status(ls_actor_t *a, ls_in_t *in, void *state) {
    detok_app_t *app = state;
    const ls_msg_peer_status_t *ps = &in->msg->u.peer_status;
    if (!ps->up && ps->actor && (!strcmp(ps->actor, app->scheduler) || !strcmp(ps->actor, "tokenizer"))) {
        ls_warn(0, "%s went down: dropping %llu streams", ps->actor,
                (unsigned long long)dstream_stats(app->stream)->active);
        dstream_drop_all(app->stream);
        s_publish(app);
    }
    return 0;
}

static const ls_dispatch_t s_dispatch[] = {
    {LS_MSG_PEER_STATUS, s_on_peer_status},
    {LS_MSG_TOKEN_OUT, s_on_token_out},
    {LS_MSG_ERROR, s_on_error},
    {0, NULL},
};

static int s_start(ls_actor_t *a, void *state) {
    detok_app_t *app = state;
    app->actor = a;
    if (!app->model_path) {
        ls_error(0, "--model-path is required: the model directory holding tokenizer.json (or that file)");
        return -1;
    }
    char path[4096], err[512];
    struct stat st;
    if (stat(app->model_path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof path, "%s/tokenizer.json", app->model_path);
    else
        snprintf(path, sizeof path, "%s", app->model_path);
    if (!(app->tok = ls_tokenizer_load(path, err, sizeof err))) {
        ls_error(0, "--model-path: %s", err);
        return -1;
    }
    const dstream_host_t host = {.host = app, .send = s_send};
    if (!(app->stream = dstream_new(app->tok, &host))) {
        ls_error(0, "detokenizer out of memory");
        return -1;
    }
    if (!ls_actor_has_peer(a, "tokenizer") || !ls_actor_has_peer(a, app->scheduler))
        ls_warn(0, "no --peer tokenizer=… or %s=…: text or stop-string aborts have nowhere to go", app->scheduler);
    s_publish(app);
    return 0;
}

static void s_shutdown(ls_actor_t *a, void *state) {
    detok_app_t *app = state;
    if (app->stream)
        dstream_shutdown(app->stream);
}

static void s_destroy(ls_actor_t *a, void *state) {
    detok_app_t *app = state;
    dstream_destroy(&app->stream);
    ls_tokenizer_destroy(&app->tok);
}

int main(int argc, char **argv) {
    ls_flag_t flags[] = {
        LS_FLAG_STR("model-path", &s_app.model_path, NULL, "model directory holding tokenizer.json, or that file"),
        LS_SCHEDULER_FLAG(&s_app.scheduler),
        LS_FLAG_END,
    };
    const ls_actor_def_t def = {.name = "detokenizer",
                                .about = "loraserve detokenizer: token ids to streamed text, stop strings",
                                .dispatch = s_dispatch,
                                .flags = flags,
                                .state = &s_app,
                                .on_start = s_start,
                                .on_shutdown = s_shutdown,
                                .on_destroy = s_destroy};
    return ls_actor_main(argc, argv, &def);
}
