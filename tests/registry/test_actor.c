// The registry actor as a process, over ipc: the test is its launcher (a control ROUTER that
// hears Ready), its client (a DEALER) and its scheduler (a raw ROUTER that answers LoadAdapter
// and UnloadAdapter as the test tells it, or stays silent).
//   startup_ready  — Ready only once every startup adapter has been answered; a bad one is
//                    logged and skipped without holding Ready
//   load_paths     — load success, rollback (the scheduler's failure reaches the client, nothing
//                    registered), timeout (TIMEOUT, then the late load is unloaded), on-demand
//                    load, counters; a restart restores exactly the loads answered ok
//   restart        — the journal restores the adapter set, ids included, across a restart
//   restart_unload — a --lora-paths adapter a client unloaded stays unloaded across restarts,
//                    until a client loads it again
//   hostile_files  — a FIFO config and linked files are refused at once; the next load works
#include "fixtures.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "test_msg.h"
#include "test_util.h"
#include <czmq.h>

#include "ls_msg.h"
#include "ls_log.h"

static char D[64];
static zsock_t *s_control, *s_sched;
static int s_spawns;
static pid_t s_live;  // the registry process running now, killed by the teardown if a test fails

typedef struct {
    pid_t pid;
    zsock_t *client;
} reg_proc_t;

static const char *s_path(const char *rel) {
    static char p[8][256];
    static int k;
    char *out = p[k++ % 8];
    snprintf(out, 256, "%s/%s", D, rel);
    return out;
}

// Start the registry with the common flags plus extra (NULL-terminated); connect a client.
static void s_spawn(reg_proc_t *r, const char *const *extra) {
    char bind[128], control[128], peer[160], model[160], roots[160];
    snprintf(bind, sizeof bind, "ipc://%s/registry-%d.sock", D, ++s_spawns);
    snprintf(control, sizeof control, "ipc://%s/control.sock", D);
    snprintf(peer, sizeof peer, "scheduler=ipc://%s/scheduler.sock", D);
    snprintf(model, sizeof model, "%s/model", D);
    snprintf(roots, sizeof roots, "%s/adapters", D);
    const char *argv[40] = {LS_REGISTRY_BIN, "--name", "registry", "--bind", bind, "--control", control,
                            "--peer", peer, "--model-path", model, "--lora-roots", roots, "--heartbeat-ms", "0",
                            "--log-level", "error"};
    int n = 17;
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    r->pid = fork();
    assert_true(r->pid >= 0);
    if (r->pid == 0) {
        tu_child_dies_with_parent();
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    s_live = r->pid;
    r->client = zsock_new_dealer(bind);
    assert_non_null(r->client);
    zsock_set_rcvtimeo(r->client, 5000);
}

static void s_send(zsock_t *s, ls_msg_t *m) {
    assert_int_equal(tm_send(s, m), 0);
    ls_msg_clear(m);
}

// The client's next answer; it must be of this type and rid.
static void s_recv(reg_proc_t *r, ls_msg_t *m, int type, uint64_t rid) {
    zframe_t *f = zframe_recv(r->client);
    if (!f)
        fail_msg("the registry did not answer (expected %s)", ls_msg_type_name(type));
    assert_int_equal(ls_msg_decode(zframe_data(f), zframe_size(f), m, NULL), 0);
    zframe_destroy(&f);
    if ((int)m->type != type)
        fail_msg("got %s, expected %s", ls_msg_type_name(m->type), ls_msg_type_name(type));
    assert_int_equal(m->rid, rid);
}

static void s_client_load(reg_proc_t *r, uint64_t rid, const char *name, const char *path, bool pinned) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = rid;
    m.u.load_adapter.name = ls_msg_strdup(name);
    m.u.load_adapter.path = ls_msg_strdup(path);
    m.u.load_adapter.pinned = pinned;
    s_send(r->client, &m);
}

static void s_client_simple(reg_proc_t *r, int type, uint64_t rid, const char *name) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    if (type == LS_MSG_ACQUIRE_ADAPTER)
        m.u.acquire_adapter.name = ls_msg_strdup(name);
    else if (type == LS_MSG_UNLOAD_ADAPTER)
        m.u.unload_adapter.name = ls_msg_strdup(name);
    s_send(r->client, &m);
}

// Names of the listed adapters joined by ',', "name*" when pinned; ids into ids (may be NULL).
static void s_sched_recv(ls_msg_t *m, int type);
static void s_sched_send(ls_msg_t *m);

// The fake scheduler answers the registry's residency question: every adapter in the CPU
// tier, the first one also in GPU slot 3.
static void s_sched_residency(void) {
    ls_msg_t q, m;
    s_sched_recv(&q, LS_MSG_LIST_ADAPTERS);
    ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
    m.rid = q.rid;
    ls_msg_clear(&q);
    s_sched_send(&m);
}

static void s_list(reg_proc_t *r, char *out, size_t cap, char ids[][40]) {
    s_client_simple(r, LS_MSG_LIST_ADAPTERS, 77, NULL);
    s_sched_residency();
    ls_msg_t m;
    s_recv(r, &m, LS_MSG_ADAPTER_LIST, 77);
    out[0] = 0;
    for (size_t i = 0; i < m.u.adapter_list.adapters.n; i++) {
        const ls_msg_adapter_info_t *a = &m.u.adapter_list.adapters.v[i];
        assert_int_equal(a->state, LS_ADAPTER_STATE_READY);
        snprintf(out + strlen(out), cap - strlen(out), "%s%s%s", i ? "," : "", a->name, a->pinned ? "*" : "");
        if (ids)
            snprintf(ids[i], 40, "%s", a->adapter_id);
    }
    ls_msg_clear(&m);
}

// The next request the registry sent the scheduler.
static void s_sched_recv(ls_msg_t *m, int type) {
    zmsg_t *zm = zmsg_recv(s_sched);
    if (!zm)
        fail_msg("the scheduler heard nothing (expected %s)", ls_msg_type_name(type));
    zframe_t *id = zmsg_pop(zm), *body = zmsg_pop(zm);
    assert_non_null(body);
    assert_int_equal(ls_msg_decode(zframe_data(body), zframe_size(body), m, NULL), 0);
    if ((int)m->type != type)
        fail_msg("scheduler got %s, expected %s", ls_msg_type_name(m->type), ls_msg_type_name(type));
    zframe_destroy(&id);
    zframe_destroy(&body);
    zmsg_destroy(&zm);
}

// The scheduler's answer to req (LoadAdapter or UnloadAdapter).
static void s_sched_answer(const ls_msg_t *req, bool ok, uint32_t code, const char *reason) {
    ls_msg_t m;
    bool load = req->type == LS_MSG_LOAD_ADAPTER;
    ls_msg_init(&m, load ? LS_MSG_ADAPTER_LOADED : LS_MSG_ADAPTER_UNLOADED);
    m.rid = req->rid;
    if (load) {
        m.u.adapter_loaded.ok = ok;
        m.u.adapter_loaded.name = ls_msg_strdup(req->u.load_adapter.name);
        m.u.adapter_loaded.adapter_id = ls_msg_strdup(req->u.load_adapter.adapter_id);
        m.u.adapter_loaded.rank = 4;
        m.u.adapter_loaded.code = code;
        m.u.adapter_loaded.reason = ls_msg_strdup(reason);
    } else {
        m.u.adapter_unloaded.ok = ok;
        m.u.adapter_unloaded.name = ls_msg_strdup(req->u.unload_adapter.name);
        m.u.adapter_unloaded.adapter_id = ls_msg_strdup(req->u.unload_adapter.adapter_id);
    }
    s_sched_send(&m);
}

// Sends m (then clears it) from the fake scheduler to the registry.
static void s_sched_send(ls_msg_t *m) {
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(m, &buf, &len), 0);
    ls_msg_clear(m);
    zmsg_t *zm = zmsg_new();
    zmsg_addstr(zm, "registry");  // the registry's DEALER identity is its name
    zmsg_addmem(zm, buf, len);
    free(buf);
    assert_int_equal(zmsg_send(&zm, s_sched), 0);
}

// 1 when the registry said Ready within ms, 0 when not.
static int s_ready_within(int ms) {
    zsock_set_rcvtimeo(s_control, ms);
    zmsg_t *zm = zmsg_recv(s_control);
    if (!zm)
        return 0;
    zframe_t *id = zmsg_pop(zm), *body = zmsg_pop(zm);
    ls_msg_t m;
    assert_int_equal(ls_msg_decode(zframe_data(body), zframe_size(body), &m, NULL), 0);
    assert_int_equal(m.type, LS_MSG_READY);
    assert_string_equal(m.u.ready.actor, "registry");
    ls_msg_clear(&m);
    zframe_destroy(&id);
    zframe_destroy(&body);
    zmsg_destroy(&zm);
    return 1;
}

static void s_stop(reg_proc_t *r) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_SHUTDOWN);
    m.u.shutdown.reason = ls_msg_strdup("test over");
    // From the launcher's side (the test's control socket): a client's Shutdown is refused.
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(&m, &buf, &len), 0);
    ls_msg_clear(&m);
    zmsg_t *zm = zmsg_new();
    zmsg_addstr(zm, "registry");
    zmsg_addmem(zm, buf, len);
    free(buf);
    assert_int_equal(zmsg_send(&zm, s_control), 0);
    int status = -1;
    for (int i = 0; i < 1000 && waitpid(r->pid, &status, WNOHANG) == 0; i++)
        usleep(10000);
    if (!WIFEXITED(status)) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, &status, 0);
        fail_msg("the registry did not exit on Shutdown");
    }
    s_live = 0;
    assert_int_equal(WEXITSTATUS(status), 0);
    zsock_destroy(&r->client);
}

// A failed test leaves its registry running: kill it, or it holds the test's stdout open.
static int s_teardown(void **unused) {
    if (s_live) {
        kill(s_live, SIGKILL);
        waitpid(s_live, NULL, 0);
        s_live = 0;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------

static void test_startup_ready(void **unused) {
    char a[200], bad[200], b[200];
    snprintf(a, sizeof a, "a=%s", s_path("adapters/a"));
    snprintf(bad, sizeof bad, "bad=%s", s_path("adapters/rank99"));
    snprintf(b, sizeof b, "b=%s:pinned", s_path("adapters/b"));
    const char *extra[] = {"--state-dir", s_path("st1"), "--lora-paths", a, bad, b, NULL};
    reg_proc_t r;
    s_spawn(&r, extra);
    ls_msg_t la, lb;
    s_sched_recv(&la, LS_MSG_LOAD_ADAPTER);  // bad failed its check; a and b were dispatched
    s_sched_recv(&lb, LS_MSG_LOAD_ADAPTER);
    assert_string_equal(la.u.load_adapter.name, "a");
    assert_string_equal(lb.u.load_adapter.name, "b");
    assert_true(lb.u.load_adapter.pinned);
    assert_int_equal(lb.u.load_adapter.slot, -1);
    assert_int_equal(s_ready_within(300), 0);  // not Ready while loads are unanswered
    s_sched_answer(&la, true, 0, NULL);
    assert_int_equal(s_ready_within(300), 0);
    s_sched_answer(&lb, true, 0, NULL);
    assert_int_equal(s_ready_within(5000), 1);
    char names[256];
    s_list(&r, names, sizeof names, NULL);
    assert_string_equal(names, "a,b*");
    ls_msg_clear(&la);
    ls_msg_clear(&lb);
    s_stop(&r);
}

static void test_load_paths(void **unused) {
    const char *extra[] = {"--state-dir", s_path("st2"), "--load-timeout-ms", "300", "--lora-dirs",
                           s_path("adapters"), NULL};
    reg_proc_t r;
    s_spawn(&r, extra);
    assert_int_equal(s_ready_within(5000), 1);  // nothing to load: Ready at once
    ls_msg_t req, m;

    // Success: answered only after the scheduler confirmed.
    s_client_load(&r, 1, "a", s_path("adapters/a"), false);
    s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
    assert_string_equal(req.u.load_adapter.name, "a");
    assert_int_equal(strlen(req.u.load_adapter.adapter_id), 36);
    s_sched_answer(&req, true, 0, NULL);
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 1);
    assert_true(m.u.adapter_loaded.ok);
    assert_string_equal(m.u.adapter_loaded.adapter_id, req.u.load_adapter.adapter_id);
    ls_msg_clear(&m);
    s_client_simple(&r, LS_MSG_ACQUIRE_ADAPTER, 2, "a");
    s_recv(&r, &m, LS_MSG_ADAPTER_ACQUIRED, 2);
    assert_true(m.u.adapter_acquired.ok);
    assert_string_equal(m.u.adapter_acquired.adapter_id, req.u.load_adapter.adapter_id);
    ls_msg_t rel;
    ls_msg_init(&rel, LS_MSG_RELEASE_ADAPTER);
    rel.u.release_adapter.adapter_id = ls_msg_strdup(m.u.adapter_acquired.adapter_id);
    s_send(r.client, &rel);
    ls_msg_clear(&m);
    ls_msg_clear(&req);

    // Rollback: a worker failed, the scheduler undid the others and says why.
    s_client_load(&r, 3, "b", s_path("adapters/b"), false);
    s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
    s_sched_answer(&req, false, LS_ERROR_CODE_BAD_REQUEST,
                   "worker 1: lora_B of q_proj has NaN; rolled back on worker 0");
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 3);
    assert_false(m.u.adapter_loaded.ok);
    assert_int_equal(m.u.adapter_loaded.code, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m.u.adapter_loaded.reason, "rolled back on worker 0");
    ls_msg_clear(&m);
    ls_msg_clear(&req);
    char names[256];
    s_list(&r, names, sizeof names, NULL);
    assert_string_equal(names, "a");

    // Timeout: the scheduler is silent; the client hears TIMEOUT; the late load is undone.
    s_client_load(&r, 4, "c", s_path("adapters/b"), false);
    s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 4);
    assert_int_equal(m.u.adapter_loaded.code, LS_ERROR_CODE_TIMEOUT);
    ls_msg_clear(&m);
    s_sched_answer(&req, true, 0, NULL);
    ls_msg_t un;
    s_sched_recv(&un, LS_MSG_UNLOAD_ADAPTER);
    assert_string_equal(un.u.unload_adapter.adapter_id, req.u.load_adapter.adapter_id);
    s_sched_answer(&un, true, 0, NULL);
    ls_msg_clear(&un);
    ls_msg_clear(&req);
    s_list(&r, names, sizeof names, NULL);
    assert_string_equal(names, "a");

    // On demand: an unregistered name found under --lora-dirs is loaded, then served.
    s_client_simple(&r, LS_MSG_ACQUIRE_ADAPTER, 5, "oproj");
    s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
    assert_string_equal(req.u.load_adapter.name, "oproj");
    s_sched_answer(&req, true, 0, NULL);
    s_recv(&r, &m, LS_MSG_ADAPTER_ACQUIRED, 5);
    assert_true(m.u.adapter_acquired.ok);
    assert_string_equal(m.u.adapter_acquired.adapter_id, req.u.load_adapter.adapter_id);
    ls_msg_clear(&m);
    ls_msg_clear(&req);
    s_client_simple(&r, LS_MSG_ACQUIRE_ADAPTER, 6, "nowhere");
    s_recv(&r, &m, LS_MSG_ADAPTER_ACQUIRED, 6);
    assert_int_equal(m.u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
    ls_msg_clear(&m);

    // The counters reach GetMetrics.
    s_client_simple(&r, LS_MSG_GET_METRICS, 7, NULL);
    s_recv(&r, &m, LS_MSG_METRICS, 7);
    int seen = 0;
    for (size_t i = 0; i < m.u.metrics.names.n; i++) {
        const char *n = m.u.metrics.names.v[i];
        uint64_t v = m.u.metrics.values.v[i];
        if (!strcmp(n, "adapter_loads_total"))
            assert_int_equal(v, 2), seen++;
        else if (!strcmp(n, "adapter_load_failures_total"))
            assert_int_equal(v, 2), seen++;
        else if (!strcmp(n, "adapter_demand_loads_total"))
            assert_int_equal(v, 1), seen++;
        else if (!strcmp(n, "adapter_acquire_misses_total"))
            assert_int_equal(v, 1), seen++;
        else if (!strcmp(n, "adapters_in_flight"))
            assert_int_equal(v, 1), seen++;
    }
    assert_int_equal(seen, 5);
    ls_msg_clear(&m);
    s_stop(&r);

    // What the journal committed is exactly what was answered ok: a restart restores a and
    // oproj, not c (answered TIMEOUT, its late load undone) nor b (refused).
    s_spawn(&r, extra);
    char restored[64] = "";
    for (int i = 0; i < 2; i++) {
        s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
        strcat(restored, i ? "," : "");
        strcat(restored, req.u.load_adapter.name);
        s_sched_answer(&req, true, 0, NULL);
        ls_msg_clear(&req);
    }
    assert_string_equal(restored, "a,oproj");
    assert_int_equal(s_ready_within(5000), 1);
    s_list(&r, names, sizeof names, NULL);
    assert_string_equal(names, "a,oproj");
    s_stop(&r);
}

static void test_restart(void **unused) {
    const char *extra[] = {"--state-dir", s_path("st3"), NULL};
    reg_proc_t r;
    s_spawn(&r, extra);
    assert_int_equal(s_ready_within(5000), 1);
    const char *loads[][2] = {{"a", "adapters/a"}, {"p", "adapters/b"}, {"e", "adapters/oproj"}};
    for (int i = 0; i < 3; i++) {
        ls_msg_t req, m;
        s_client_load(&r, 10 + (uint64_t)i, loads[i][0], s_path(loads[i][1]), i == 1);
        s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
        s_sched_answer(&req, true, 0, NULL);
        s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 10 + (uint64_t)i);
        assert_true(m.u.adapter_loaded.ok);
        ls_msg_clear(&m);
        ls_msg_clear(&req);
    }
    ls_msg_t req, m;
    s_client_simple(&r, LS_MSG_UNLOAD_ADAPTER, 20, "a");
    s_sched_recv(&req, LS_MSG_UNLOAD_ADAPTER);
    s_sched_answer(&req, true, 0, NULL);
    s_recv(&r, &m, LS_MSG_ADAPTER_UNLOADED, 20);
    assert_true(m.u.adapter_unloaded.ok);
    ls_msg_clear(&m);
    ls_msg_clear(&req);
    char names[256], ids[4][40];
    s_list(&r, names, sizeof names, ids);
    assert_string_equal(names, "p*,e");
    s_stop(&r);

    // The restarted registry restores p and e with their ids before it says Ready.
    s_spawn(&r, extra);
    ls_msg_t lp, le;
    s_sched_recv(&lp, LS_MSG_LOAD_ADAPTER);
    s_sched_recv(&le, LS_MSG_LOAD_ADAPTER);
    assert_string_equal(lp.u.load_adapter.name, "p");
    assert_true(lp.u.load_adapter.pinned);
    assert_string_equal(lp.u.load_adapter.adapter_id, ids[0]);
    assert_string_equal(le.u.load_adapter.adapter_id, ids[1]);
    assert_int_equal(s_ready_within(200), 0);
    s_sched_answer(&lp, true, 0, NULL);
    s_sched_answer(&le, true, 0, NULL);
    assert_int_equal(s_ready_within(5000), 1);
    char names2[256], ids2[4][40];
    s_list(&r, names2, sizeof names2, ids2);
    assert_string_equal(names2, "p*,e");
    assert_string_equal(ids2[0], ids[0]);
    assert_string_equal(ids2[1], ids[1]);
    ls_msg_clear(&lp);
    ls_msg_clear(&le);
    s_stop(&r);
}

// Start a registry with --lora-paths x and y; answer the loads the scheduler gets (their names,
// joined by ',', into got) and wait for Ready.
static void s_spawn_xy(reg_proc_t *r, char *got, size_t cap) {
    static char x[200], y[200];
    snprintf(x, sizeof x, "x=%s", s_path("adapters/a"));
    snprintf(y, sizeof y, "y=%s", s_path("adapters/b"));
    const char *extra[] = {"--state-dir", s_path("st4"), "--lora-paths", x, y, NULL};
    s_spawn(r, extra);
    got[0] = 0;
    while (s_ready_within(300) == 0) {
        ls_msg_t req;
        s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
        snprintf(got + strlen(got), cap - strlen(got), "%s%s", *got ? "," : "", req.u.load_adapter.name);
        s_sched_answer(&req, true, 0, NULL);
        ls_msg_clear(&req);
    }
}

static void test_restart_unload(void **unused) {
    reg_proc_t r;
    char got[64], names[256];
    s_spawn_xy(&r, got, sizeof got);
    assert_string_equal(got, "x,y");
    ls_msg_t req, m;
    s_client_simple(&r, LS_MSG_UNLOAD_ADAPTER, 30, "x");
    s_sched_recv(&req, LS_MSG_UNLOAD_ADAPTER);
    s_sched_answer(&req, true, 0, NULL);
    s_recv(&r, &m, LS_MSG_ADAPTER_UNLOADED, 30);
    assert_true(m.u.adapter_unloaded.ok);
    ls_msg_clear(&m);
    ls_msg_clear(&req);
    s_stop(&r);
    // Twice: the journal remembers, whatever the flag says.
    for (int i = 0; i < 2; i++) {
        s_spawn_xy(&r, got, sizeof got);
        assert_string_equal(got, "y");
        s_list(&r, names, sizeof names, NULL);
        assert_string_equal(names, "y");
        s_stop(&r);
    }
    // A client loads it again: registered, and restored from the journal from then on.
    s_spawn_xy(&r, got, sizeof got);
    s_client_load(&r, 31, "x", s_path("adapters/a"), false);
    s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
    s_sched_answer(&req, true, 0, NULL);
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 31);
    assert_true(m.u.adapter_loaded.ok);
    ls_msg_clear(&m);
    ls_msg_clear(&req);
    s_stop(&r);
    s_spawn_xy(&r, got, sizeof got);
    assert_string_equal(got, "y,x");  // the journal's, in load order
    s_stop(&r);
}

// The loader thread is never blocked by a file: a FIFO named adapter_config.json, and an
// adapter whose files are links out of the roots, are refused within the client's receive
// timeout, and the next load goes through.
static void test_hostile_files(void **unused) {
    const char *extra[] = {"--state-dir", s_path("st5"), NULL};
    reg_proc_t r;
    s_spawn(&r, extra);
    assert_int_equal(s_ready_within(5000), 1);
    ls_msg_t req, m;
    s_client_load(&r, 1, "fifo", s_path("adapters/fifo"), false);
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 1);
    assert_false(m.u.adapter_loaded.ok);
    assert_contains(m.u.adapter_loaded.reason, "adapter_config.json: is a FIFO");
    ls_msg_clear(&m);
    s_client_load(&r, 2, "links", s_path("adapters/links"), false);
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 2);
    assert_false(m.u.adapter_loaded.ok);
    assert_contains(m.u.adapter_loaded.reason, "is a symbolic link");
    ls_msg_clear(&m);
    s_client_load(&r, 3, "a", s_path("adapters/a"), false);
    s_sched_recv(&req, LS_MSG_LOAD_ADAPTER);
    s_sched_answer(&req, true, 0, NULL);
    s_recv(&r, &m, LS_MSG_ADAPTER_LOADED, 3);
    assert_true(m.u.adapter_loaded.ok);
    ls_msg_clear(&m);
    ls_msg_clear(&req);
    s_stop(&r);
}

int main(void) {
    ls_log_init("test", LS_LOG_ERROR);
    fx_tmpdir(D, sizeof D);
    char cfg[512];
    fx_model(s_path("model"));
    fx_mkdir(s_path("adapters"));
    fx_adapter_ok(s_path("adapters/a"));
    fx_adapter_ok(s_path("adapters/b"));
    fx_adapter(s_path("adapters/oproj"), fx_config(cfg, sizeof cfg, 8, "[\"o_proj\"]", NULL));
    fx_adapter(s_path("adapters/rank99"), fx_config(cfg, sizeof cfg, 99, "[\"q_proj\"]", NULL));
    fx_mkdir(s_path("adapters/fifo"));
    fx_mkdir(s_path("adapters/links"));
    fx_mkdir(s_path("outside"));
    fx_adapter_ok(s_path("outside/x"));
    if (mkfifo(s_path("adapters/fifo/adapter_config.json"), 0644) < 0 ||
        symlink(s_path("outside/x/adapter_config.json"), s_path("adapters/links/adapter_config.json")) < 0 ||
        symlink(s_path("outside/x/adapter_model.safetensors"), s_path("adapters/links/adapter_model.safetensors")) < 0)
        return 1;
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/control.sock", D);
    s_control = zsock_new_router(ep);
    snprintf(ep, sizeof ep, "ipc://%s/scheduler.sock", D);
    s_sched = zsock_new_router(ep);
    if (!s_control || !s_sched)
        return 1;
    zsock_set_rcvtimeo(s_sched, 5000);
    // A restarted registry connects with the identity of the one before it.
    zsock_set_router_handover(s_sched, 1);
    zsock_set_router_handover(s_control, 1);
    alarm(50);                              // a hang is a failure, not a stuck CI job
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_startup_ready, s_teardown),
        cmocka_unit_test_teardown(test_load_paths, s_teardown),
        cmocka_unit_test_teardown(test_restart, s_teardown),
        cmocka_unit_test_teardown(test_restart_unload, s_teardown),
        cmocka_unit_test_teardown(test_hostile_files, s_teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    zsock_destroy(&s_control);
    zsock_destroy(&s_sched);
    fx_rmdir(D);
    return failed;
}
