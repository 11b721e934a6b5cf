// client.c — ls_client_t: the connection, its I/O thread, the calls table, errors, and the
// admin calls (adapters, ping).
//
// Threads. czmq sockets are not thread-safe, so exactly one thread touches the DEALER: the
// client's I/O thread (a zactor). Callers hand it encoded messages over the actor's pipe —
// one pipe end shared by every caller, so sending on it is serialised by send_lock — and
// wait on their call's condition variable. The I/O thread decodes every answer and appends
// it to the call registered under the answer's rid (the demultiplexer); answers for no
// registered call (a call that gave up) are dropped. A socket monitor tells the I/O thread
// when the connection drops: the server forgets a disconnected client's requests, so every
// call whose message left fails with LS_ERR_UNAVAILABLE instead of waiting forever.
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <czmq.h>

#include "sdk_internal.h"

#define LS_DEFAULT_TIMEOUT_MS 60000

typedef struct s_answer {
    ls_msg_t msg;
    struct s_answer *next;
} s_answer_t;

struct _ls_call_t {
    ls_client_t *client;
    uint64_t rid;
    ls_call_t *prev, *next;     // the client's calls list
    pthread_cond_t cond;        // signalled when an answer or a failure arrives
    s_answer_t *head, *tail;    // answers not taken yet, in arrival order
    bool sent;                  // the I/O thread passed the message to the connection
    bool abort_asked;
    int failed;                 // LS_OK, or why no more answers will come
    char why[256];
};

struct _ls_client_t {
    char *endpoint;
    zcert_t *curve_mine, *curve_server;  // tcp to a launched graph: CURVE with its client key
    zactor_t *io;
    pthread_mutex_t send_lock;  // one caller at a time on the actor pipe
    pthread_mutex_t lock;       // the calls list and every call's fields
    ls_call_t *calls;
    atomic_uint_fast64_t last_rid;
    atomic_uint timeout_ms;
    atomic_int io_errno;        // set by the I/O thread when it cannot start
};

// ---------------------------------------------------------------------------------------------
// errors

static _Thread_local char s_last_error[512];

const char *ls_last_error(void) {
    return s_last_error;
}

int ls_sdk_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_last_error, sizeof s_last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *ls_strerror(int code) {
    switch (code) {
    case LS_OK: return "success";
    case LS_ERR_BAD_REQUEST: return "bad request";
    case LS_ERR_NOT_FOUND: return "adapter or request not found";
    case LS_ERR_TOO_LARGE: return "request too large";
    case LS_ERR_UNAVAILABLE: return "server unavailable";
    case LS_ERR_TIMEOUT: return "timed out";
    case LS_ERR_ABORTED: return "aborted";
    case LS_ERR_INTERNAL: return "server error";
    case LS_ERR_PROTOCOL: return "protocol error";
    case LS_ERR_NO_MEMORY: return "out of memory";
    case LS_ERR_OUTCOME_UNKNOWN: return "the outcome is unknown: list the adapters";
    default: return "unknown error";
    }
}

int ls_sdk_err_from_server(uint32_t code) {
    switch (code) {
    case LS_ERROR_CODE_BAD_REQUEST: return LS_ERR_BAD_REQUEST;
    case LS_ERROR_CODE_NOT_FOUND: return LS_ERR_NOT_FOUND;
    case LS_ERROR_CODE_TOO_LARGE: return LS_ERR_TOO_LARGE;
    case LS_ERROR_CODE_TIMEOUT: return LS_ERR_TIMEOUT;
    // All mean "not now": a retry later (or on a restarted graph) may succeed.
    case LS_ERROR_CODE_UNAVAILABLE:
    case LS_ERROR_CODE_OVERLOADED:
    case LS_ERROR_CODE_SHUTTING_DOWN: return LS_ERR_UNAVAILABLE;
    // The server could not read our message or does not handle it: a version mismatch, or
    // an actor that is not serving requests yet.
    case LS_ERROR_CODE_MALFORMED:
    case LS_ERROR_CODE_UNKNOWN_TYPE: return LS_ERR_PROTOCOL;
    case LS_ERROR_CODE_OUTCOME_UNKNOWN: return LS_ERR_OUTCOME_UNKNOWN;
    default: return LS_ERR_INTERNAL;
    }
}

int64_t ls_sdk_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// the calls table (every function here runs with self->lock held)

static ls_call_t *s_call_find(ls_client_t *self, uint64_t rid) {
    for (ls_call_t *c = self->calls; c; c = c->next)
        if (c->rid == rid)
            return c;
    return NULL;
}

static void s_call_fail(ls_call_t *call, int code, const char *why) {
    if (call->failed)
        return;
    call->failed = code;
    snprintf(call->why, sizeof call->why, "%s", why);
    pthread_cond_signal(&call->cond);
}

// ---------------------------------------------------------------------------------------------
// the I/O thread

static void s_io_deliver(ls_client_t *self, zframe_t *frame) {
    s_answer_t *a = calloc(1, sizeof *a);
    if (!a)
        return;
    // An answer that does not decode cannot be routed: it has no trustworthy rid. The call
    // it belonged to runs into its timeout.
    if (ls_msg_decode(zframe_data(frame), zframe_size(frame), &a->msg, NULL) < 0) {
        free(a);
        return;
    }
    pthread_mutex_lock(&self->lock);
    ls_call_t *call = s_call_find(self, a->msg.rid);
    if (call) {
        if (call->tail)
            call->tail->next = a;
        else
            call->head = a;
        call->tail = a;
        pthread_cond_signal(&call->cond);
        a = NULL;
    }
    pthread_mutex_unlock(&self->lock);
    if (a) {
        ls_msg_clear(&a->msg);
        free(a);
    }
}

// A command from a caller: "SEND", rid, body. Returns -1 on $TERM (or a broken pipe).
static int s_io_command(ls_client_t *self, zsock_t *pipe, zsock_t *dealer) {
    zmsg_t *cmd = zmsg_recv(pipe);
    if (!cmd)
        return -1;
    char *verb = zmsg_popstr(cmd);
    int rc = 0;
    if (!verb || streq(verb, "$TERM"))
        rc = -1;
    else if (streq(verb, "SEND") && zmsg_size(cmd) == 2) {
        zframe_t *rid_frame = zmsg_pop(cmd);
        zframe_t *body = zmsg_pop(cmd);
        uint64_t rid = 0;
        if (zframe_size(rid_frame) == sizeof rid)
            memcpy(&rid, zframe_data(rid_frame), sizeof rid);
        int sent = zframe_send(&body, dealer, 0);
        pthread_mutex_lock(&self->lock);
        ls_call_t *call = s_call_find(self, rid);
        if (call && sent == 0)
            call->sent = true;
        else if (call)
            s_call_fail(call, LS_ERR_UNAVAILABLE, "cannot send: the connection's queue is full");
        pthread_mutex_unlock(&self->lock);
        zframe_destroy(&body);
        zframe_destroy(&rid_frame);
    }
    free(verb);
    zmsg_destroy(&cmd);
    return rc;
}

static void s_io_disconnected(ls_client_t *self, zsock_t *monitor) {
    zmsg_t *event = zmsg_recv(monitor);
    zmsg_destroy(&event);
    char why[256];
    snprintf(why, sizeof why, "lost the connection to %s", self->endpoint);
    pthread_mutex_lock(&self->lock);
    for (ls_call_t *c = self->calls; c; c = c->next)
        if (c->sent)
            s_call_fail(c, LS_ERR_UNAVAILABLE, why);
    pthread_mutex_unlock(&self->lock);
}

static void s_io_actor(zsock_t *pipe, void *arg) {
    ls_client_t *self = arg;
    static atomic_uint s_monitors;
    char monitor_ep[64];
    snprintf(monitor_ep, sizeof monitor_ep, "inproc://ls-sdk-monitor-%u", atomic_fetch_add(&s_monitors, 1));

    zsock_t *dealer = zsock_new(ZMQ_DEALER);
    zsock_t *monitor = NULL;
    if (dealer) {
        // Never block the I/O thread on a full queue: that call fails instead. A short linger
        // lets the last Aborts leave when the client is destroyed. ZMTP heartbeats find a
        // silently dead tcp peer, which the monitor then reports as a disconnect.
        zsock_set_sndtimeo(dealer, 0);
        zsock_set_linger(dealer, 200);
        zsock_set_heartbeat_ivl(dealer, 2000);
        zsock_set_heartbeat_timeout(dealer, 6000);
        // zmq_socket_monitor binds a PAIR at monitor_ep itself; ours connects to it.
        if (zmq_socket_monitor(zsock_resolve(dealer), monitor_ep, ZMQ_EVENT_DISCONNECTED) == 0)
            monitor = zsock_new(ZMQ_PAIR);
        if (monitor && zsock_connect(monitor, "%s", monitor_ep) < 0)
            zsock_destroy(&monitor);
    }
    if (dealer && self->curve_mine) {
        zcert_apply(self->curve_mine, dealer);
        zsock_set_curve_serverkey(dealer, zcert_public_txt(self->curve_server));
    }
    if (!dealer || !monitor || zsock_connect(dealer, "%s", self->endpoint) < 0) {
        atomic_store(&self->io_errno, zmq_errno());
        zsock_destroy(&monitor);
        zsock_destroy(&dealer);
        zsock_signal(pipe, 1);
        return;
    }
    zsock_signal(pipe, 0);

    zmq_pollitem_t items[] = {{zsock_resolve(pipe), 0, ZMQ_POLLIN, 0},
                              {zsock_resolve(dealer), 0, ZMQ_POLLIN, 0},
                              {zsock_resolve(monitor), 0, ZMQ_POLLIN, 0}};
    while (true) {
        if (zmq_poll(items, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if ((items[0].revents & ZMQ_POLLIN) && s_io_command(self, pipe, dealer) < 0)
            break;
        while (zsock_events(dealer) & ZMQ_POLLIN) {
            zframe_t *frame = zframe_recv(dealer);
            if (!frame)
                break;
            s_io_deliver(self, frame);
            zframe_destroy(&frame);
        }
        if (items[2].revents & ZMQ_POLLIN)
            s_io_disconnected(self, monitor);
    }
    zmq_socket_monitor(zsock_resolve(dealer), NULL, 0);
    zsock_destroy(&monitor);
    zsock_destroy(&dealer);
}

// ---------------------------------------------------------------------------------------------
// the client

// czmq catches SIGINT and SIGTERM for the whole process the first time it starts, and an
// application that links this SDK would then ignore Ctrl-C. Tell czmq to leave signals alone.
static pthread_once_t s_czmq_once = PTHREAD_ONCE_INIT;
static void s_czmq_setup(void) {
    zsys_handler_set(NULL);
}

// keys: a launched graph's key directory (RUN_DIR/keys) for a tcp endpoint, else NULL.
static ls_client_t *s_client_new(const char *endpoint, const char *keys, const char **err) {
    int rc = LS_OK;
    ls_client_t *self = NULL;
    char path[4200];
    if (!endpoint || !*endpoint)
        rc = ls_sdk_fail(LS_ERR_BAD_REQUEST, "no endpoint given");
    else if (!(self = calloc(1, sizeof *self)) || !(self->endpoint = strdup(endpoint)))
        rc = ls_sdk_fail(LS_ERR_NO_MEMORY, "out of memory");
    if (rc == LS_OK && keys) {
        snprintf(path, sizeof path, "%s/secret/client.key", keys);
        self->curve_mine = zcert_load(path);
        snprintf(path, sizeof path, "%s/public/tokenizer.pub", keys);
        self->curve_server = zcert_load(path);
        if (!self->curve_mine || !self->curve_server)
            rc = ls_sdk_fail(LS_ERR_UNAVAILABLE, "cannot read the graph's CURVE keys in %s (tcp needs them)", keys);
    }
    if (rc == LS_OK) {
        pthread_once(&s_czmq_once, s_czmq_setup);
        pthread_mutex_init(&self->send_lock, NULL);
        pthread_mutex_init(&self->lock, NULL);
        atomic_init(&self->last_rid, 0);
        atomic_init(&self->timeout_ms, LS_DEFAULT_TIMEOUT_MS);
        // zactor_new returns once the actor signalled, but not whether it started: the actor
        // leaves its errno in the client (the signal orders that write before our read).
        self->io = zactor_new(s_io_actor, self);
        int io_errno = self->io ? atomic_load(&self->io_errno) : zmq_errno();
        if (!self->io || io_errno)
            rc = ls_sdk_fail(LS_ERR_BAD_REQUEST, "cannot connect to '%s': %s", endpoint, zmq_strerror(io_errno));
    }
    if (rc == LS_OK)
        return self;
    ls_client_destroy(&self);
    if (err)
        *err = s_last_error;
    return NULL;
}

ls_client_t *ls_client_new(const char *endpoint, const char **err) { return s_client_new(endpoint, NULL, err); }

ls_client_t *ls_client_new_run_dir(const char *run_dir, const char **err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/graph.json", run_dir ? run_dir : "");
    char *text = NULL;
    FILE *f = fopen(path, "r");
    if (f) {
        long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        text = n >= 0 ? malloc((size_t)n + 1) : NULL;
        if (text && fseek(f, 0, SEEK_SET) == 0)
            text[fread(text, 1, (size_t)n, f)] = 0;
        fclose(f);
    }
    cJSON *graph = text ? cJSON_Parse(text) : NULL;
    free(text);
    const char *endpoint = NULL;
    cJSON *actor;
    cJSON_ArrayForEach(actor, cJSON_GetObjectItem(graph, "actors")) {
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(actor, "kind"));
        if (kind && streq(kind, "tokenizer")) {
            endpoint = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(actor, "endpoints"), "router"));
            break;
        }
    }
    ls_client_t *self = NULL;
    if (!f)
        ls_sdk_fail(LS_ERR_UNAVAILABLE, "cannot read %s: %s (is loraserve running with --run-dir %s?)", path,
                    strerror(errno), run_dir ? run_dir : "");
    else if (!graph)
        ls_sdk_fail(LS_ERR_PROTOCOL, "%s is not valid JSON", path);
    else if (!endpoint)
        ls_sdk_fail(LS_ERR_PROTOCOL, "%s names no tokenizer router endpoint", path);
    else {
        // Over tcp the graph speaks CURVE only: the launcher left a client key in the run dir.
        snprintf(path, sizeof path, "%s/keys", run_dir);
        self = s_client_new(endpoint, strncmp(endpoint, "tcp://", 6) == 0 ? path : NULL, err);
    }
    cJSON_Delete(graph);
    if (!self && err)
        *err = s_last_error;
    return self;
}

void ls_client_destroy(ls_client_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_client_t *self = *self_p;
    zactor_destroy(&self->io);
    zcert_destroy(&self->curve_mine);
    zcert_destroy(&self->curve_server);
    pthread_mutex_destroy(&self->send_lock);
    pthread_mutex_destroy(&self->lock);
    free(self->endpoint);
    free(self);
    *self_p = NULL;
}

const char *ls_client_endpoint(ls_client_t *self) {
    return self->endpoint;
}

void ls_client_set_timeout(ls_client_t *self, uint32_t timeout_ms) {
    atomic_store(&self->timeout_ms, timeout_ms);
}

uint64_t ls_client_request_id(ls_client_t *self) {
    return atomic_fetch_add(&self->last_rid, 1) + 1;
}

// Hand an encoded message to the I/O thread.
static int s_send(ls_client_t *self, const ls_msg_t *m) {
    char *buf;
    size_t len;
    if (ls_msg_encode(m, &buf, &len) < 0)
        return ls_sdk_fail(LS_ERR_TOO_LARGE, "cannot encode %s (above %u bytes?)", ls_msg_type_name(m->type),
                           LS_MSG_MAX_BYTES);
    uint64_t rid = m->rid;
    pthread_mutex_lock(&self->send_lock);
    int rc = zsock_send(self->io, "sbb", "SEND", &rid, sizeof rid, buf, len);
    pthread_mutex_unlock(&self->send_lock);
    free(buf);
    return rc == 0 ? LS_OK : ls_sdk_fail(LS_ERR_UNAVAILABLE, "the client's I/O thread is gone");
}

// ---------------------------------------------------------------------------------------------
// calls

int ls_call_start(ls_client_t *self, const ls_msg_t *m, ls_call_t **call_p) {
    ls_call_t *call = calloc(1, sizeof *call);
    if (!call)
        return ls_sdk_fail(LS_ERR_NO_MEMORY, "out of memory");
    call->client = self;
    call->rid = m->rid;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&call->cond, &attr);
    pthread_condattr_destroy(&attr);

    pthread_mutex_lock(&self->lock);
    bool taken = s_call_find(self, call->rid) != NULL;
    if (!taken) {
        call->next = self->calls;
        if (self->calls)
            self->calls->prev = call;
        self->calls = call;
    }
    pthread_mutex_unlock(&self->lock);
    if (taken) {
        pthread_cond_destroy(&call->cond);
        free(call);
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "request id %llu is already running on this client",
                           (unsigned long long)m->rid);
    }
    int rc = s_send(self, m);
    if (rc < 0)
        ls_call_end(&call);
    *call_p = call;
    return rc;
}

int ls_call_wait(ls_call_t *call, int64_t deadline_ns, ls_msg_t *out) {
    ls_client_t *self = call->client;
    struct timespec ts = {deadline_ns / 1000000000, deadline_ns % 1000000000};
    int rc = LS_ERR_TIMEOUT;
    pthread_mutex_lock(&self->lock);
    while (!call->head && !call->failed) {
        if (!deadline_ns)
            pthread_cond_wait(&call->cond, &self->lock);
        else if (pthread_cond_timedwait(&call->cond, &self->lock, &ts) == ETIMEDOUT)
            break;
    }
    s_answer_t *a = call->head;
    if (a) {
        call->head = a->next;
        if (!call->head)
            call->tail = NULL;
        *out = a->msg;
        free(a);
        rc = 1;
    } else if (call->failed)
        rc = ls_sdk_fail(call->failed, "%s", call->why);
    pthread_mutex_unlock(&self->lock);
    return rc;
}

bool ls_call_abort_asked(ls_call_t *call) {
    pthread_mutex_lock(&call->client->lock);
    bool asked = call->abort_asked;
    pthread_mutex_unlock(&call->client->lock);
    return asked;
}

void ls_call_end(ls_call_t **call_p) {
    if (!call_p || !*call_p)
        return;
    ls_call_t *call = *call_p;
    ls_client_t *self = call->client;
    pthread_mutex_lock(&self->lock);
    if (call->prev)
        call->prev->next = call->next;
    else if (self->calls == call)
        self->calls = call->next;
    if (call->next)
        call->next->prev = call->prev;
    pthread_mutex_unlock(&self->lock);
    while (call->head) {
        s_answer_t *a = call->head;
        call->head = a->next;
        ls_msg_clear(&a->msg);
        free(a);
    }
    pthread_cond_destroy(&call->cond);
    free(call);
    *call_p = NULL;
}

int ls_client_abort_rid(ls_client_t *self, uint64_t rid) {
    pthread_mutex_lock(&self->lock);
    ls_call_t *call = s_call_find(self, rid);
    if (call)
        call->abort_asked = true;
    pthread_mutex_unlock(&self->lock);
    if (!call)
        return ls_sdk_fail(LS_ERR_NOT_FOUND, "no running request with id %llu", (unsigned long long)rid);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = rid;
    m.u.abort.reason = ls_msg_strdup("aborted by the client");
    m.u.abort.finish = LS_FINISH_REASON_ABORT;
    int rc = s_send(self, &m);
    ls_msg_clear(&m);
    return rc;
}

int ls_client_abort(ls_client_t *self, uint64_t request_id) {
    return ls_client_abort_rid(self, request_id);
}

// ---------------------------------------------------------------------------------------------
// admin calls: one request, one answer of a known type (or an Error), within the timeout

static int s_ask(ls_client_t *self, ls_msg_t *req, int answer_type, ls_msg_t *answer) {
    req->rid = ls_client_request_id(self);
    ls_call_t *call;
    int rc = ls_call_start(self, req, &call);
    if (rc < 0)
        return rc;
    uint32_t timeout_ms = atomic_load(&self->timeout_ms);
    int64_t deadline = timeout_ms ? ls_sdk_now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    while ((rc = ls_call_wait(call, deadline, answer)) == 1) {
        if (answer->type == answer_type) {
            rc = LS_OK;
            break;
        }
        if (answer->type == LS_MSG_ERROR) {
            rc = ls_sdk_fail(ls_sdk_err_from_server(answer->u.error.code), "%s",
                             answer->u.error.message ? answer->u.error.message : "refused by the server");
            ls_msg_clear(answer);
            break;
        }
        ls_msg_clear(answer);
    }
    if (rc == LS_ERR_TIMEOUT)
        ls_sdk_fail(rc, "%s: no answer from %s within %u ms", ls_msg_type_name(req->type), self->endpoint,
                    timeout_ms);
    ls_call_end(&call);
    return rc;
}

// A refused admin answer: its code and reason become the call's error.
static int s_refused(uint32_t code, const char *reason, const char *what, const char *name) {
    return ls_sdk_fail(code ? ls_sdk_err_from_server(code) : LS_ERR_INTERNAL, "%s %s: %s", what, name,
                       reason ? reason : "refused by the server");
}

int ls_client_adapter_load(ls_client_t *self, const char *name, const char *path, bool pinned, uint32_t *rank) {
    if (!name || !*name || !path || !*path)
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "adapter load needs a name and a path");
    ls_msg_t req, ans;
    ls_msg_init(&req, LS_MSG_LOAD_ADAPTER);
    req.u.load_adapter.name = ls_msg_strdup(name);
    req.u.load_adapter.path = ls_msg_strdup(path);
    req.u.load_adapter.pinned = pinned;
    int rc = s_ask(self, &req, LS_MSG_ADAPTER_LOADED, &ans);
    ls_msg_clear(&req);
    if (rc < 0)
        return rc;
    if (!ans.u.adapter_loaded.ok)
        rc = s_refused(ans.u.adapter_loaded.code, ans.u.adapter_loaded.reason, "load", name);
    else if (rank)
        *rank = ans.u.adapter_loaded.rank;
    ls_msg_clear(&ans);
    return rc;
}

int ls_client_adapter_unload(ls_client_t *self, const char *name) {
    if (!name || !*name)
        return ls_sdk_fail(LS_ERR_BAD_REQUEST, "adapter unload needs a name");
    ls_msg_t req, ans;
    ls_msg_init(&req, LS_MSG_UNLOAD_ADAPTER);
    req.u.unload_adapter.name = ls_msg_strdup(name);
    int rc = s_ask(self, &req, LS_MSG_ADAPTER_UNLOADED, &ans);
    ls_msg_clear(&req);
    if (rc < 0)
        return rc;
    if (!ans.u.adapter_unloaded.ok)
        rc = s_refused(ans.u.adapter_unloaded.code, ans.u.adapter_unloaded.reason, "unload", name);
    ls_msg_clear(&ans);
    return rc;
}

const char *ls_adapter_status_name(int status) {
    static const char *names[] = {"unknown", "loading", "ready", "unloading", "failed"};
    return status >= LS_ADAPTER_LOADING && status <= LS_ADAPTER_FAILED ? names[status] : names[0];
}

static char *s_take(char **s) {
    char *v = *s;
    *s = NULL;
    return v;
}

int ls_client_adapter_list(ls_client_t *self, ls_adapter_list_t **list) {
    *list = NULL;
    ls_msg_t req, ans;
    ls_msg_init(&req, LS_MSG_LIST_ADAPTERS);
    int rc = s_ask(self, &req, LS_MSG_ADAPTER_LIST, &ans);
    ls_msg_clear(&req);
    if (rc < 0)
        return rc;
    ls_msg_adapter_infos_t *infos = &ans.u.adapter_list.adapters;
    ls_adapter_list_t *l = calloc(1, sizeof *l);
    if (l && infos->n)
        l->adapters = calloc(infos->n, sizeof *l->adapters);
    if (!l || (infos->n && !l->adapters)) {
        free(l);
        ls_msg_clear(&ans);
        return ls_sdk_fail(LS_ERR_NO_MEMORY, "out of memory");
    }
    // Move the decoded strings over rather than copy them: ls_msg_clear skips NULLs.
    for (size_t i = 0; i < infos->n; i++) {
        ls_msg_adapter_info_t *in = &infos->v[i];
        ls_adapter_t *out = &l->adapters[i];
        out->name = s_take(&in->name);
        out->adapter_id = s_take(&in->adapter_id);
        out->path = s_take(&in->path);
        out->pinned = in->pinned;
        out->rank = in->rank;
        out->alpha = in->alpha;
        out->target_modules = in->target_modules.v;
        out->n_target_modules = in->target_modules.n;
        in->target_modules.v = NULL;
        in->target_modules.n = 0;
        out->in_flight = in->in_flight;
        out->status = (int)in->state;
        out->last_used_ms = in->last_used_ms;
    }
    l->n_adapters = infos->n;
    ls_msg_clear(&ans);
    *list = l;
    return LS_OK;
}

void ls_adapter_list_destroy(ls_adapter_list_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_adapter_list_t *self = *self_p;
    for (size_t i = 0; i < self->n_adapters; i++) {
        ls_adapter_t *a = &self->adapters[i];
        free(a->name);
        free(a->adapter_id);
        free(a->path);
        for (size_t j = 0; j < a->n_target_modules; j++)
            free(a->target_modules[j]);
        free(a->target_modules);
    }
    free(self->adapters);
    free(self);
    *self_p = NULL;
}

int ls_client_ping(ls_client_t *self, ls_health_t *health) {
    ls_msg_t req, ans;
    ls_msg_init(&req, LS_MSG_HEARTBEAT);
    req.u.heartbeat.actor = ls_msg_strdup("sdk");
    int64_t t0 = ls_sdk_now_ns();
    int rc = s_ask(self, &req, LS_MSG_HEARTBEAT, &ans);
    ls_msg_clear(&req);
    if (rc < 0)
        return rc;
    if (health) {
        snprintf(health->actor, sizeof health->actor, "%s", ans.u.heartbeat.actor ? ans.u.heartbeat.actor : "");
        health->uptime_ms = ans.u.heartbeat.uptime_ms;
        health->rtt_us = (uint64_t)(ls_sdk_now_ns() - t0) / 1000;
    }
    ls_msg_clear(&ans);
    return LS_OK;
}
