// Registry core, checks and journal, with no sockets: the core's host is a recorder, checks
// run synchronously when the test says so, the scheduler's answers are made up here.
//   acquire_unload   — acquires/releases against an unload: it waits for the last release,
//                      acquires after it are refused, unknown releases are counted
//   unload_timeouts  — drain timeout → READY; dispatched timeout → OUTCOME_UNKNOWN, UNLOADING until answered
//   validation       — every load rule with its code and message, pinned limit included
//   confinement      — client paths: "..", relative, absolute outside, symlink escape
//   confinement_names — resolved paths reach the workers; no roots, no client paths; startup
//                      paths trusted; on-demand names with '/' or escaping symlinks refused
//   on_demand        — acquires of DIR/name share one load; failures answer all of them
//   rollback         — the scheduler's failure reaches the client, nothing stays registered
//   load_timeout     — TIMEOUT to the client, a late success is unloaded and never journaled
//   ids              — same inputs, same ids; uuid v4 layout
//   journal          — replay, torn tail, corrupt middle record, compaction
//   startup          — Ready only after every startup load is answered; a failed restore
//                      leaves the journal
//   list_lru         — ListAdapters fields and LRU order
//   forget           — what leaves for good is forgotten (the host removes its copies of
//                      adapters sent as tensors), after its journal record; a restore that
//                      failed transiently is not
#include "fixtures.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_util.h"

#include "check.h"
#include "core.h"
#include "journal.h"
#include "ls_log.h"

#define MAXR 128

static char D[64];  // fixtures: D/model, D/adapters/<name>, D/outside/x
static ls_model_config_t s_model;

typedef struct {
    reg_t *reg;
    check_env_t env;
    check_root_t roots[1];
    uintptr_t next_w;
    ls_msg_t sent[MAXR];
    int n_sent;
    uintptr_t ans_w[MAXR];
    ls_msg_t ans[MAXR];
    int n_ans, dropped;
    struct {
        uint64_t op;
        check_mode_t mode;
        char name[256], path[512];
    } chk[MAXR];
    int n_chk, chk_done;
    ls_msg_t journal[MAXR];
    int n_journal;
    int armed, cancelled, ready;
    struct {
        char path[512];
        int journal;  // records written before it was forgotten
    } forgot[MAXR];
    int n_forgot;
    bool journal_full;  // h_journal fails, as on a full disk
    uint64_t last_armed;  // op of the latest timer
} rec_t;

static rec_t R;

static void s_copy(const ls_msg_t *m, ls_msg_t *out) {
    char *buf;
    size_t len;
    assert_int_equal(ls_msg_encode(m, &buf, &len), 0);
    assert_int_equal(ls_msg_decode(buf, len, out, NULL), 0);
    free(buf);
}

static void h_check(void *h, uint64_t op, check_mode_t mode, const char *name, const char *path) {
    assert_true(R.n_chk < MAXR);
    R.chk[R.n_chk].op = op;
    R.chk[R.n_chk].mode = mode;
    snprintf(R.chk[R.n_chk].name, sizeof R.chk[0].name, "%s", name ? name : "");
    snprintf(R.chk[R.n_chk].path, sizeof R.chk[0].path, "%s", path ? path : "");
    R.n_chk++;
}

static int h_send(void *h, const ls_msg_t *m) {
    assert_true(R.n_sent < MAXR);
    s_copy(m, &R.sent[R.n_sent++]);
    return 0;
}

static void h_answer(void *h, void *w, ls_msg_t *m) {
    if (!m) {
        R.dropped++;
        return;
    }
    assert_true(R.n_ans < MAXR);
    R.ans_w[R.n_ans] = (uintptr_t)w;
    s_copy(m, &R.ans[R.n_ans++]);
}

static void *h_arm(void *h, uint64_t op, uint32_t ms) {
    R.armed++;
    R.last_armed = op;
    return (void *)(uintptr_t)op;
}

static void h_cancel(void *h, void *t) { R.cancelled++; }

static int h_journal(void *h, const ls_msg_t *m) {
    if (R.journal_full)
        return -1;
    assert_true(R.n_journal < MAXR);
    s_copy(m, &R.journal[R.n_journal++]);
    return 0;
}

static void h_ready(void *h) { R.ready++; }

static void h_forget(void *h, const char *path) {
    assert_true(R.n_forgot < MAXR);
    snprintf(R.forgot[R.n_forgot].path, sizeof R.forgot[0].path, "%s", path ? path : "");
    R.forgot[R.n_forgot++].journal = R.n_journal;
}

static void s_reset(void) {
    reg_destroy(&R.reg);
    for (int i = 0; i < R.n_sent; i++)
        ls_msg_clear(&R.sent[i]);
    for (int i = 0; i < R.n_ans; i++)
        ls_msg_clear(&R.ans[i]);
    for (int i = 0; i < R.n_journal; i++)
        ls_msg_clear(&R.journal[i]);
    free((char *)R.roots[0].real);
    memset(&R, 0, sizeof R);
}

// A fresh core over the fixtures: roots and dirs = D/adapters, every target, rank ≤ 16.
static void s_new(int max_loras_per_batch, bool on_demand) {
    s_reset();
    static char given[128];
    snprintf(given, sizeof given, "%s/adapters", D);
    R.roots[0].given = given;
    R.roots[0].real = realpath(given, NULL);
    R.env = (check_env_t){.roots = R.roots, .n_roots = 1, .dirs = R.roots, .n_dirs = 1, .model = &s_model,
                          .max_lora_rank = 16, .targets = (1u << LS_TARGET_COUNT) - 1};
    reg_config_t cfg = {.max_loras_per_batch = max_loras_per_batch, .on_demand = on_demand,
                        .load_timeout_ms = 1000, .unload_timeout_ms = 1000};
    reg_host_t host = {.check = h_check, .send = h_send, .answer = h_answer, .arm = h_arm, .cancel = h_cancel,
                       .journal = h_journal, .ready = h_ready, .forget = h_forget};
    R.reg = reg_new(&cfg, &host);
    assert_non_null(R.reg);
}

static void *s_w(void) { return (void *)++R.next_w; }

// Run the checks the core asked for, in order, as the job thread would.
static void s_checks(void) {
    while (R.chk_done < R.n_chk) {
        check_result_t res;
        int i = R.chk_done++;
        check_adapter(&R.env, R.chk[i].mode, R.chk[i].name, R.chk[i].path, &res);
        reg_load_checked(R.reg, 1000, R.chk[i].op, &res);
    }
}

// The answer the waiter got (asserts there is exactly one).
static const ls_msg_t *s_ans(void *w) {
    const ls_msg_t *found = NULL;
    for (int i = 0; i < R.n_ans; i++)
        if (R.ans_w[i] == (uintptr_t)w) {
            assert_null(found);
            found = &R.ans[i];
        }
    if (!found)
        fail_msg("waiter %lu has no answer", (unsigned long)(uintptr_t)w);
    return found;
}

static bool s_answered(void *w) {
    for (int i = 0; i < R.n_ans; i++)
        if (R.ans_w[i] == (uintptr_t)w)
            return true;
    return false;
}

static const ls_msg_t *s_last_sent(int type) {
    assert_true(R.n_sent > 0);
    assert_int_equal(R.sent[R.n_sent - 1].type, type);
    return &R.sent[R.n_sent - 1];
}

// The scheduler answers the request with this rid.
static void s_sched(uint64_t rid, int type, bool ok, uint32_t code, const char *reason) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    if (type == LS_MSG_ADAPTER_LOADED) {
        m.u.adapter_loaded.ok = ok;
        m.u.adapter_loaded.code = code;
        m.u.adapter_loaded.reason = ls_msg_strdup(reason);
    } else {
        m.u.adapter_unloaded.ok = ok;
        m.u.adapter_unloaded.code = code;
        m.u.adapter_unloaded.reason = ls_msg_strdup(reason);
    }
    reg_answered(R.reg, 2000, &m);
    ls_msg_clear(&m);
}

static const char *s_adapter(const char *name) {
    static char p[8][256];
    static int k;
    char *out = p[k++ % 8];
    snprintf(out, 256, "%s/adapters/%s", D, name);
    return out;
}

// A client load that goes through: checked, dispatched, confirmed. Returns the id.
static const char *s_load_ok(const char *name, const char *path, bool pinned) {
    static char id[64];
    void *w = s_w();
    int sent = R.n_sent;
    reg_load(R.reg, 1000, REG_FROM_CLIENT, name, path, pinned, NULL, w);
    s_checks();
    assert_int_equal(R.n_sent, sent + 1);
    const ls_msg_t *la = s_last_sent(LS_MSG_LOAD_ADAPTER);
    assert_string_equal(la->u.load_adapter.name, name);
    assert_int_equal(la->u.load_adapter.slot, -1);
    s_sched(la->rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    const ls_msg_t *a = s_ans(w);
    if (!a->u.adapter_loaded.ok)
        fail_msg("load of %s failed: %s", name, a->u.adapter_loaded.reason);
    snprintf(id, sizeof id, "%s", a->u.adapter_loaded.adapter_id);
    assert_string_equal(id, la->u.load_adapter.adapter_id);
    return id;
}

// A client load that is refused; returns the AdapterLoaded.
static const ls_msg_t *s_load_refused(const char *name, const char *path, bool pinned, uint32_t code) {
    void *w = s_w();
    int sent = R.n_sent;
    reg_load(R.reg, 1000, REG_FROM_CLIENT, name, path, pinned, NULL, w);
    s_checks();
    assert_int_equal(R.n_sent, sent);  // nothing reached the scheduler
    const ls_msg_t *a = s_ans(w);
    assert_false(a->u.adapter_loaded.ok);
    if (a->u.adapter_loaded.code != code)
        fail_msg("code %u, expected %u: %s", a->u.adapter_loaded.code, code, a->u.adapter_loaded.reason);
    if (name && !strcmp(name, "fresh"))
        assert_false(reg_has(R.reg, "fresh"));
    return a;
}

static const ls_msg_t *s_acquire(const char *name) {
    void *w = s_w();
    reg_acquire(R.reg, 1500000000, name, w);  // 1.5 s on the event clock
    return s_ans(w);
}

// ---------------------------------------------------------------------------------------------

static void test_acquire_unload(void **unused) {
    s_new(8, false);
    char id[64], idb[64];
    snprintf(id, sizeof id, "%s", s_load_ok("a", s_adapter("a"), false));
    snprintf(idb, sizeof idb, "%s", s_load_ok("b", s_adapter("b"), false));
    assert_int_equal(R.n_journal, 2);
    assert_int_equal(R.journal[0].type, LS_MSG_LOAD_ADAPTER);

    const ls_msg_t *base = s_acquire("");
    assert_true(base->u.adapter_acquired.ok);
    assert_null(base->u.adapter_acquired.adapter_id);
    for (int i = 0; i < 3; i++) {
        const ls_msg_t *m = s_acquire("a");
        assert_true(m->u.adapter_acquired.ok);
        assert_string_equal(m->u.adapter_acquired.adapter_id, id);
        assert_int_equal(m->u.adapter_acquired.rank, 4);
    }
    assert_true(s_acquire("b")->u.adapter_acquired.ok);
    assert_int_equal(reg_stats(R.reg)->in_flight, 4);

    // The unload waits for the three holders; nothing goes to the scheduler yet.
    void *uw = s_w();
    int sent = R.n_sent;
    reg_unload(R.reg, 1600, "a", uw);
    assert_int_equal(R.n_sent, sent);
    assert_false(s_answered(uw));
    const ls_msg_t *late = s_acquire("a");
    assert_false(late->u.adapter_acquired.ok);
    assert_int_equal(late->u.adapter_acquired.code, LS_ERROR_CODE_UNAVAILABLE);
    assert_contains(late->u.adapter_acquired.reason, "being unloaded");
    assert_true(s_acquire("b")->u.adapter_acquired.ok);  // others are untouched
    // A second unload of the same name shares the first one's outcome.
    void *uw2 = s_w();
    reg_unload(R.reg, 1600, "a", uw2);

    reg_release(R.reg, id, "a");
    reg_release(R.reg, id, "a");
    assert_int_equal(R.n_sent, sent);
    reg_release(R.reg, idb, "b");
    assert_int_equal(R.n_sent, sent);
    reg_release(R.reg, id, "a");  // the last holder: now the unload is dispatched
    assert_int_equal(R.n_sent, sent + 1);
    const ls_msg_t *ua = s_last_sent(LS_MSG_UNLOAD_ADAPTER);
    assert_string_equal(ua->u.unload_adapter.adapter_id, id);
    assert_false(s_answered(uw));
    s_sched(ua->rid, LS_MSG_ADAPTER_UNLOADED, true, 0, NULL);
    assert_true(s_ans(uw)->u.adapter_unloaded.ok);
    assert_true(s_ans(uw2)->u.adapter_unloaded.ok);
    assert_false(reg_has(R.reg, "a"));
    assert_int_equal(R.journal[R.n_journal - 1].type, LS_MSG_UNLOAD_ADAPTER);

    const ls_msg_t *gone = s_acquire("a");
    assert_int_equal(gone->u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
    assert_contains(gone->u.adapter_acquired.reason, "not loaded");
    // Releases of unknown ids, or more than were acquired, are counted, never fatal.
    reg_release(R.reg, id, "a");
    reg_release(R.reg, "no-such-id", "x");
    reg_release(R.reg, NULL, NULL);
    reg_release(R.reg, idb, "b");
    reg_release(R.reg, idb, "b");  // b was held twice
    const reg_stats_t *st = reg_stats(R.reg);
    assert_int_equal(st->releases_unknown, 4);
    assert_int_equal(st->in_flight, 0);
    assert_int_equal(st->acquires, 5);
    assert_int_equal(st->acquire_misses, 1);
    assert_int_equal(st->loads, 2);
    assert_int_equal(st->unloads, 1);
    // Unloading an unknown name: NOT_FOUND.
    void *uw3 = s_w();
    reg_unload(R.reg, 1700, "a", uw3);
    assert_int_equal(s_ans(uw3)->u.adapter_unloaded.code, LS_ERROR_CODE_NOT_FOUND);
    s_reset();
}

static void test_unload_timeouts(void **unused) {
    s_new(8, false);
    char id[64];
    snprintf(id, sizeof id, "%s", s_load_ok("a", s_adapter("a"), false));
    assert_true(s_acquire("a")->u.adapter_acquired.ok);
    // Still held when the timeout fires: the unload is abandoned, a stays usable.
    void *uw = s_w();
    reg_unload(R.reg, 2000, "a", uw);
    reg_timeout(R.reg, 3000, R.last_armed);
    const ls_msg_t *t = s_ans(uw);
    assert_int_equal(t->u.adapter_unloaded.code, LS_ERROR_CODE_TIMEOUT);
    assert_contains(t->u.adapter_unloaded.reason, "still hold");
    assert_true(s_acquire("a")->u.adapter_acquired.ok);
    reg_release(R.reg, id, "a");
    reg_release(R.reg, id, "a");

    // Dispatched and unconfirmed: OUTCOME_UNKNOWN to the caller (the workers may still free it),
    // and a takes no requests until the scheduler says what happened.
    void *uw2 = s_w();
    reg_unload(R.reg, 4000, "a", uw2);
    const ls_msg_t *ua = s_last_sent(LS_MSG_UNLOAD_ADAPTER);
    uint64_t rid = ua->rid;
    reg_timeout(R.reg, 5000, rid);
    assert_int_equal(s_ans(uw2)->u.adapter_unloaded.code, LS_ERROR_CODE_OUTCOME_UNKNOWN);
    assert_int_equal(s_acquire("a")->u.adapter_acquired.code, LS_ERROR_CODE_UNAVAILABLE);
    void *uw3 = s_w();
    reg_unload(R.reg, 5100, "a", uw3);
    assert_contains(s_ans(uw3)->u.adapter_unloaded.reason, "waiting on the scheduler");
    s_sched(rid, LS_MSG_ADAPTER_UNLOADED, false, LS_ERROR_CODE_INTERNAL, "worker 1 is busy");
    assert_true(s_acquire("a")->u.adapter_acquired.ok);  // refused by the workers: READY again
    reg_release(R.reg, id, "a");
    void *uw4 = s_w();
    reg_unload(R.reg, 6000, "a", uw4);
    rid = s_last_sent(LS_MSG_UNLOAD_ADAPTER)->rid;
    reg_timeout(R.reg, 7000, rid);
    assert_int_equal(s_ans(uw4)->u.adapter_unloaded.code, LS_ERROR_CODE_OUTCOME_UNKNOWN);  // not "failed":
    s_sched(rid, LS_MSG_ADAPTER_UNLOADED, true, 0, NULL);  // late, but freed: gone, and journaled
    assert_false(reg_has(R.reg, "a"));
    assert_int_equal(R.journal[R.n_journal - 1].type, LS_MSG_UNLOAD_ADAPTER);
    // An answer to nothing pending is counted and ignored.
    s_sched(rid, LS_MSG_ADAPTER_UNLOADED, true, 0, NULL);
    assert_int_equal(reg_stats(R.reg)->answers_unknown, 1);
    s_reset();
}

static void test_validation(void **unused) {
    s_new(3, false);
    const ls_msg_t *m;
    m = s_load_refused("", s_adapter("a"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "is empty");
    m = s_load_refused("x/y", s_adapter("a"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "contains '/'");
    m = s_load_refused("..", s_adapter("a"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "path component");
    m = s_load_refused("fresh", NULL, false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "has no path");
    m = s_load_refused("fresh", s_adapter("missing"), false, LS_ERROR_CODE_NOT_FOUND);
    assert_contains(m->u.adapter_loaded.reason, "does not exist");
    m = s_load_refused("fresh", s_adapter("file"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "not a directory");
    m = s_load_refused("fresh", s_adapter("noconfig"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "adapter_config.json");
    m = s_load_refused("fresh", s_adapter("badjson"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "adapter_config.json");
    m = s_load_refused("fresh", s_adapter("rank32"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "max_lora_rank");
    m = s_load_refused("fresh", s_adapter("fc1"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "fc1");
    m = s_load_refused("fresh", s_adapter("vocab"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "trainable_token_indices");
    assert_contains(m->u.adapter_loaded.reason, "added vocabulary");
    // Trainable tokens need as many rows a slot (--lora-extra-vocab-size).
    m = s_load_refused("fresh", s_adapter("tokens"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "replaces or adds 2 rows of the embedding or lm_head");
    assert_contains(m->u.adapter_loaded.reason, "the workers hold 0 a slot (--lora-extra-vocab-size)");
    R.env.extra_vocab_size = 2;
    s_load_ok("tok", s_adapter("tokens"), false);
    R.env.extra_vocab_size = 0;
    m = s_load_refused("fresh", s_adapter("dora"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "use_dora");
    m = s_load_refused("fresh", s_adapter("mts"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "modules_to_save");
    // Every target must be enabled by --lora-target-modules.
    R.env.targets = 1u << LS_TARGET_Q | 1u << LS_TARGET_V;
    m = s_load_refused("fresh", s_adapter("oproj"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "adapts o_proj, which --lora-target-modules does not enable");
    assert_contains(m->u.adapter_loaded.reason, "enabled: q_proj, v_proj");
    s_load_ok("a", s_adapter("a"), false);  // q and v only: fine
    R.env.targets = (1u << LS_TARGET_COUNT) - 1;
    // Name taken; the same path under another name is allowed (with a warning).
    m = s_load_refused("a", s_adapter("b"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "already loaded");
    s_load_ok("a2", s_adapter("a"), false);
    // Pinned: at most max_loras_per_batch − 1 = 2.
    s_load_ok("p1", s_adapter("b"), true);
    s_load_ok("p2", s_adapter("b"), true);
    m = s_load_refused("p3", s_adapter("b"), true, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "at most 2");
    s_load_ok("u3", s_adapter("b"), false);  // unpinned still fine
    // No base model config: nothing can be validated.
    R.env.model = NULL;
    m = s_load_refused("fresh", s_adapter("b"), false, LS_ERROR_CODE_UNAVAILABLE);
    assert_contains(m->u.adapter_loaded.reason, "--model-path");
    assert_int_equal(reg_stats(R.reg)->load_failures, 18);
    s_reset();
}

static void test_confinement(void **unused) {
    s_new(8, true);
    const ls_msg_t *m;
    char p[512];
    snprintf(p, sizeof p, "%s/adapters/../outside/x", D);
    m = s_load_refused("fresh", p, false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "contains \"..\"");
    snprintf(p, sizeof p, "%s/outside/x", D);
    m = s_load_refused("fresh", p, false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "outside the adapter roots");
    // Whether a file exists outside the roots is not revealed.
    m = s_load_refused("fresh", "/etc/no-such-dir", false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "outside the adapter roots");
    m = s_load_refused("fresh", "adapters/a", false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "not absolute");
    // A prefix that is not a whole component is not inside: D/adapters-evil.
    snprintf(p, sizeof p, "%s/adapters-evil", D);
    m = s_load_refused("fresh", p, false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "outside the adapter roots");
    m = s_load_refused("fresh", s_adapter("escape"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "a symlink escapes them");
    // A symlink that stays inside is fine, and the resolved path is what the workers get.
    s_reset();
}

static void test_confinement_names(void **unused) {
    s_new(8, true);
    s_load_ok("inlink", s_adapter("inlink"), false);
    char want[600];
    snprintf(want, sizeof want, "%s/a", R.roots[0].real);
    assert_string_equal(s_last_sent(LS_MSG_LOAD_ADAPTER)->u.load_adapter.path, want);
    // Without roots a client cannot load by path at all.
    R.env.n_roots = 0;
    const ls_msg_t *m = s_load_refused("fresh", s_adapter("a"), false, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "--lora-roots");
    // Startup paths are trusted operator input: no roots needed.
    reg_load(R.reg, 1000, REG_FROM_STARTUP, "boot", s_adapter("b"), false, NULL, NULL);
    s_checks();
    assert_string_equal(s_last_sent(LS_MSG_LOAD_ADAPTER)->u.load_adapter.name, "boot");
    // On-demand names: '/' never reaches the filesystem; a symlink out of the dir is refused.
    int checks = R.n_chk;
    const ls_msg_t *a = s_acquire("../outside/x");
    assert_int_equal(a->u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
    assert_int_equal(R.n_chk, checks);
    void *w = s_w();
    reg_acquire(R.reg, 1500, "escape", w);
    s_checks();
    assert_int_equal(s_ans(w)->u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
    assert_contains(s_ans(w)->u.adapter_acquired.reason, "a symlink escapes it");
    s_reset();
}

static void test_on_demand(void **unused) {
    s_new(8, true);
    void *w1 = s_w(), *w2 = s_w(), *w3 = s_w();
    reg_acquire(R.reg, 1000, "b", w1);
    reg_acquire(R.reg, 1001, "b", w2);  // waits on the same load
    assert_int_equal(R.n_chk, 1);
    assert_int_equal(R.chk[0].mode, CHECK_DEMAND);
    s_checks();
    assert_int_equal(R.n_sent, 1);
    reg_acquire(R.reg, 1002, "b", w3);
    assert_false(s_answered(w1) || s_answered(w2) || s_answered(w3));
    s_sched(R.sent[0].rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    const char *id = R.sent[0].u.load_adapter.adapter_id;
    void *ws[] = {w1, w2, w3};
    for (int i = 0; i < 3; i++) {
        assert_true(s_ans(ws[i])->u.adapter_acquired.ok);
        assert_string_equal(s_ans(ws[i])->u.adapter_acquired.adapter_id, id);
    }
    assert_int_equal(reg_stats(R.reg)->in_flight, 3);
    assert_int_equal(reg_stats(R.reg)->demand_loads, 1);
    assert_int_equal(R.n_journal, 1);  // an on-demand load is registered like any other

    // Not under the dir: every waiter hears NOT_FOUND.
    void *n1 = s_w(), *n2 = s_w();
    reg_acquire(R.reg, 1100, "nope", n1);
    reg_acquire(R.reg, 1100, "nope", n2);
    s_checks();
    for (int i = 0; i < 2; i++) {
        const ls_msg_t *m = s_ans(i ? n2 : n1);
        assert_int_equal(m->u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
        assert_contains(m->u.adapter_acquired.reason, "no directory nope exists under --lora-dirs");
    }
    assert_false(reg_has(R.reg, "nope"));
    assert_int_equal(reg_stats(R.reg)->acquire_misses, 2);
    // Found but refused by the workers: every waiter hears it.
    void *f1 = s_w(), *f2 = s_w();
    reg_acquire(R.reg, 1200, "a", f1);
    reg_acquire(R.reg, 1200, "a", f2);
    s_checks();
    s_sched(s_last_sent(LS_MSG_LOAD_ADAPTER)->rid, LS_MSG_ADAPTER_LOADED, false, LS_ERROR_CODE_UNAVAILABLE,
            "worker 0: CPU tier full");
    assert_int_equal(s_ans(f1)->u.adapter_acquired.code, LS_ERROR_CODE_UNAVAILABLE);
    assert_contains(s_ans(f2)->u.adapter_acquired.reason, "CPU tier full");
    assert_false(reg_has(R.reg, "a"));
    // Without --lora-dirs an unknown name is simply NOT_FOUND.
    s_new(8, false);
    assert_int_equal(s_acquire("b")->u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
    assert_int_equal(R.n_chk, 0);
    s_reset();
}

static void test_rollback(void **unused) {
    s_new(8, false);
    void *w = s_w(), *acq = s_w();
    reg_load(R.reg, 1000, REG_FROM_CLIENT, "a", s_adapter("a"), false, NULL, w);
    reg_acquire(R.reg, 1000, "a", acq);  // waits for the load
    s_checks();
    const ls_msg_t *la = s_last_sent(LS_MSG_LOAD_ADAPTER);
    s_sched(la->rid, LS_MSG_ADAPTER_LOADED, false, LS_ERROR_CODE_BAD_REQUEST,
            "worker 1: tensor q_proj.lora_B has NaN; rolled back on worker 0");
    const ls_msg_t *m = s_ans(w);
    assert_false(m->u.adapter_loaded.ok);
    assert_int_equal(m->u.adapter_loaded.code, LS_ERROR_CODE_BAD_REQUEST);
    assert_contains(m->u.adapter_loaded.reason, "rolled back on worker 0");
    assert_int_equal(s_ans(acq)->u.adapter_acquired.code, LS_ERROR_CODE_NOT_FOUND);
    assert_false(reg_has(R.reg, "a"));
    assert_int_equal(R.n_journal, 0);
    assert_int_equal(reg_stats(R.reg)->load_failures, 1);
    // The name is free again.
    s_load_ok("a", s_adapter("a"), false);
    s_reset();
}

static void test_load_timeout(void **unused) {
    s_new(8, false);
    void *w = s_w();
    reg_load(R.reg, 1000, REG_FROM_CLIENT, "a", s_adapter("a"), false, NULL, w);
    s_checks();
    const ls_msg_t *la = s_last_sent(LS_MSG_LOAD_ADAPTER);
    uint64_t rid = la->rid;
    char id[64];
    snprintf(id, sizeof id, "%s", la->u.load_adapter.adapter_id);
    reg_timeout(R.reg, 5000, rid);
    assert_int_equal(s_ans(w)->u.adapter_loaded.code, LS_ERROR_CODE_TIMEOUT);
    assert_contains(s_ans(w)->u.adapter_loaded.reason, "--load-timeout-ms");
    assert_false(reg_has(R.reg, "a"));
    // The late success is undone: an unload of exactly that id.
    int sent = R.n_sent;
    s_sched(rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    assert_int_equal(R.n_sent, sent + 1);
    const ls_msg_t *ua = s_last_sent(LS_MSG_UNLOAD_ADAPTER);
    assert_string_equal(ua->u.unload_adapter.adapter_id, id);
    s_sched(ua->rid, LS_MSG_ADAPTER_UNLOADED, true, 0, NULL);
    assert_int_equal(R.n_journal, 0);
    // A late failure needs nothing undone.
    void *w2 = s_w();
    reg_load(R.reg, 6000, REG_FROM_CLIENT, "b", s_adapter("b"), false, NULL, w2);
    s_checks();
    rid = s_last_sent(LS_MSG_LOAD_ADAPTER)->rid;
    reg_timeout(R.reg, 9000, rid);
    sent = R.n_sent;
    s_sched(rid, LS_MSG_ADAPTER_LOADED, false, LS_ERROR_CODE_INTERNAL, "gone");
    assert_int_equal(R.n_sent, sent);
    // Timed out while still on disk: nothing is dispatched once the check completes.
    void *w3 = s_w();
    reg_load(R.reg, 10000, REG_FROM_CLIENT, "c", s_adapter("b"), false, NULL, w3);
    reg_timeout(R.reg, 12000, R.chk[R.n_chk - 1].op);
    assert_int_equal(s_ans(w3)->u.adapter_loaded.code, LS_ERROR_CODE_TIMEOUT);
    s_checks();
    assert_int_equal(R.n_sent, sent);
    assert_int_equal(reg_stats(R.reg)->load_failures, 3);
    s_reset();
}

static void test_ids(void **unused) {
    char a[40], b[40], c[40];
    reg_id_derive("sql", "/a/sql", 0, 123456789, a);
    reg_id_derive("sql", "/a/sql", 0, 123456789, b);
    assert_string_equal(a, b);
    reg_id_derive("sql", "/a/sql", 1, 123456789, c);
    assert_string_not_equal(a, c);
    reg_id_derive("sql", "/a/sql", 0, 123456790, c);
    assert_string_not_equal(a, c);
    reg_id_derive("sq", "l/a/sql", 0, 123456789, c);
    assert_string_not_equal(a, c);
    assert_int_equal(strlen(a), 36);
    for (int i = 0; i < 36; i++)
        if (i == 8 || i == 13 || i == 18 || i == 23)
            assert_int_equal(a[i], '-');
        else
            assert_non_null(strchr("0123456789abcdef", a[i]));
    assert_int_equal(a[14], '4');
    assert_non_null(strchr("89ab", a[19]));
    // Two registries fed the same events give the same ids.
    char first[3][64];
    for (int run = 0; run < 2; run++) {
        s_new(8, false);
        const char *names[] = {"x", "y", "z"};
        for (int i = 0; i < 3; i++) {
            const char *id = s_load_ok(names[i], s_adapter("a"), false);
            if (run == 0)
                snprintf(first[i], sizeof first[i], "%s", id);
            else
                assert_string_equal(first[i], id);
        }
    }
    assert_string_not_equal(first[0], first[1]);
    s_reset();
}

// ---------------------------------------------------------------------------------------------
// journal

static void s_rec(ls_msg_t *m, bool load, const char *name, const char *id) {
    ls_msg_init(m, load ? LS_MSG_LOAD_ADAPTER : LS_MSG_UNLOAD_ADAPTER);
    if (load) {
        m->u.load_adapter.name = ls_msg_strdup(name);
        m->u.load_adapter.path = ls_msg_strdup("/adapters/x");
        m->u.load_adapter.adapter_id = ls_msg_strdup(id);
        m->u.load_adapter.pinned = !strcmp(name, "pinned");
    } else {
        m->u.unload_adapter.name = ls_msg_strdup(name);
        m->u.unload_adapter.adapter_id = ls_msg_strdup(id);
    }
}

static void s_append(journal_t *j, bool load, const char *name, const char *id) {
    ls_msg_t m;
    s_rec(&m, load, name, id);
    assert_int_equal(journal_append(j, &m), 0);
    ls_msg_clear(&m);
}

// Open the journal in dir; the live names joined by ',' into out.
static journal_t *s_open(const char *dir, char *out, size_t cap) {
    ls_msg_t *live;
    size_t n;
    char err[256];
    journal_t *j = journal_open(dir, &live, &n, err, sizeof err);
    if (!j)
        fail_msg("journal_open: %s", err);
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? "," : "", live[i].u.load_adapter.name);
        ls_msg_clear(&live[i]);
    }
    free(live);
    return j;
}

static long s_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (long)st.st_size;
}

static void test_journal(void **unused) {
    char dir[128], names[256], path[200];
    snprintf(dir, sizeof dir, "%s/state", D);
    snprintf(path, sizeof path, "%s/registry.journal", dir);
    journal_t *j = s_open(dir, names, sizeof names);  // creates dir and file
    assert_string_equal(names, "");
    s_append(j, true, "a", "id-a");
    s_append(j, true, "b", "id-b");
    s_append(j, true, "pinned", "id-p");
    s_append(j, false, "a", "id-a");
    s_append(j, true, "c", "id-c");
    journal_destroy(&j);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "b,pinned,c");
    assert_int_equal(journal_records(j), 5);
    // a was unloaded and not loaded since: remembered (a --lora-paths adapter stays unloaded).
    assert_string_equal(journal_unloaded(j, 0), "a");
    assert_null(journal_unloaded(j, 1));
    s_append(j, true, "a", "id-a2");  // loaded again: no longer unloaded
    assert_null(journal_unloaded(j, 0));
    s_append(j, false, "a", "id-a2");
    s_append(j, true, "e", "id-e");
    s_append(j, false, "e", "id-e");
    assert_string_equal(journal_unloaded(j, 1), "e");
    journal_forget(j, "e");  // in memory; the file forgets it at its next rewrite
    assert_null(journal_unloaded(j, 1));
    journal_destroy(&j);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "b,pinned,c");
    assert_string_equal(journal_unloaded(j, 0), "a");
    assert_string_equal(journal_unloaded(j, 1), "e");
    // A restored adapter that no longer loads leaves the journal without being "unloaded".
    for (int k = 0; k < 3; k++) {
        const char *name = k == 0 ? "a" : k == 1 ? "e" : "c";
        if (k < 2)
            s_append(j, true, name, "id-c");
        ls_msg_t drop;
        s_rec(&drop, false, name, "id-c");
        drop.u.unload_adapter.dropped = true;
        assert_int_equal(journal_append(j, &drop), 0);
        ls_msg_clear(&drop);
    }
    assert_null(journal_unloaded(j, 0));
    s_append(j, true, "c", "id-c");  // c's load is the last record again, for what follows
    journal_destroy(&j);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "b,pinned,c");
    assert_null(journal_unloaded(j, 0));
    journal_destroy(&j);

    // Torn last record (a crash mid-append): c is lost, the rest restored, the file rewritten.
    assert_int_equal(truncate(path, s_size(path) - 5), 0);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "b,pinned");
    assert_int_equal(journal_records(j), 2);
    s_append(j, true, "d", "id-d");  // appends follow intact records
    journal_destroy(&j);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "b,pinned,d");
    journal_destroy(&j);

    // A corrupt record in the middle: skipped with an error, the ones after it still count,
    // and the damaged file is kept beside the clean one.
    char damaged[220];
    snprintf(damaged, sizeof damaged, "%s.damaged", path);
    unlink(damaged);
    long size = s_size(path);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, size / 2, SEEK_SET);  // inside "pinned", the middle record of three
    fputc(0xff ^ fgetc(f), f);
    fclose(f);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "b,d");
    journal_destroy(&j);
    assert_int_equal(s_size(damaged), size);

    // Garbage only: an empty registry, never a failure.
    fx_write(path, "not a journal at all");
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "");
    assert_int_equal(s_size(path), 0);
    // Compaction keeps the file near the live set.
    s_append(j, true, "keep", "id-keep");
    for (int i = 0; i < 200; i++) {
        char id[32];
        snprintf(id, sizeof id, "id-%d", i);
        s_append(j, true, "churn", id);
        s_append(j, false, "churn", id);
        assert_true(journal_records(j) <= 2 * 2 + JOURNAL_SLACK + 1);  // keep, and churn unloaded
    }
    journal_destroy(&j);
    j = s_open(dir, names, sizeof names);
    assert_string_equal(names, "keep");
    journal_destroy(&j);
    fx_rmdir(dir);
}

static void test_startup(void **unused) {
    s_new(8, false);
    // Journal restores keep their ids; startup paths get new ones; Ready waits for all.
    reg_load(R.reg, 1000, REG_FROM_JOURNAL, "j1", s_adapter("a"), false, "11111111-1111-4111-8111-111111111111", NULL);
    reg_load(R.reg, 1000, REG_FROM_JOURNAL, "gone", s_adapter("missing"), false, "22222222-2222-4222-8222-222222222222",
             NULL);
    reg_load(R.reg, 1000, REG_FROM_STARTUP, "s1", s_adapter("b"), true, NULL, NULL);
    reg_load(R.reg, 1000, REG_FROM_STARTUP, "bad", s_adapter("rank32"), false, NULL, NULL);
    reg_startup_seal(R.reg);
    assert_int_equal(R.ready, 0);
    s_checks();
    assert_int_equal(R.n_sent, 2);  // j1 and s1; gone and bad failed their checks
    assert_int_equal(R.ready, 0);
    assert_string_equal(R.sent[0].u.load_adapter.adapter_id, "11111111-1111-4111-8111-111111111111");
    // The restore that no longer loads leaves the journal; the other restore is not re-written.
    assert_int_equal(R.n_journal, 1);
    assert_int_equal(R.journal[0].type, LS_MSG_UNLOAD_ADAPTER);
    assert_string_equal(R.journal[0].u.unload_adapter.name, "gone");
    s_sched(R.sent[0].rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    assert_int_equal(R.ready, 0);
    s_sched(R.sent[1].rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    assert_int_equal(R.ready, 1);
    assert_int_equal(R.n_journal, 2);  // s1 is new to the journal
    assert_string_equal(R.journal[1].u.load_adapter.name, "s1");
    assert_true(s_acquire("j1")->u.adapter_acquired.ok);
    assert_true(s_acquire("s1")->u.adapter_acquired.ok);
    // Nothing to restore: Ready at once. A startup load that times out does not hold Ready.
    s_new(8, false);
    reg_startup_seal(R.reg);
    assert_int_equal(R.ready, 1);
    s_new(8, false);
    reg_load(R.reg, 1000, REG_FROM_STARTUP, "slow", s_adapter("a"), false, NULL, NULL);
    reg_startup_seal(R.reg);
    s_checks();
    reg_timeout(R.reg, 9000, s_last_sent(LS_MSG_LOAD_ADAPTER)->rid);
    assert_int_equal(R.ready, 1);
    // Shutdown answers whoever waits, and destroy forgets nobody silently.
    void *w = s_w();
    reg_load(R.reg, 9100, REG_FROM_CLIENT, "late", s_adapter("b"), false, NULL, w);
    reg_shutdown(R.reg);
    assert_int_equal(s_ans(w)->u.adapter_loaded.code, LS_ERROR_CODE_SHUTTING_DOWN);
    assert_int_equal(s_acquire("x")->u.adapter_acquired.code, LS_ERROR_CODE_SHUTTING_DOWN);
    int sent = R.n_sent;
    s_checks();  // a load checked after shutdown began is not dispatched
    assert_int_equal(R.n_sent, sent);
    assert_false(reg_has(R.reg, "late"));
    s_reset();
}

static void test_list_lru(void **unused) {
    s_new(8, false);
    s_load_ok("a", s_adapter("a"), false);
    s_load_ok("b", s_adapter("oproj"), true);
    s_load_ok("c", s_adapter("a"), false);
    void *w = s_w();
    reg_load(R.reg, 1000, REG_FROM_CLIENT, "d", s_adapter("b"), false, NULL, w);  // still loading
    assert_string_equal(reg_lru_at(R.reg, 0), "a");
    s_acquire("a");
    s_acquire("b");
    assert_string_equal(reg_lru_at(R.reg, 0), "c");
    assert_string_equal(reg_lru_at(R.reg, 1), "d");
    assert_string_equal(reg_lru_at(R.reg, 2), "a");
    assert_string_equal(reg_lru_at(R.reg, 3), "b");
    assert_null(reg_lru_at(R.reg, 4));
    ls_msg_t list;
    ls_msg_init(&list, LS_MSG_ADAPTER_LIST);
    reg_list(R.reg, &list);
    const ls_msg_adapter_infos_t *v = &list.u.adapter_list.adapters;
    assert_int_equal(v->n, 4);
    assert_string_equal(v->v[0].name, "a");  // load order
    assert_string_equal(v->v[3].name, "d");
    assert_int_equal(v->v[3].state, LS_ADAPTER_STATE_LOADING);
    const ls_msg_adapter_info_t *b = &v->v[1];
    assert_int_equal(b->state, LS_ADAPTER_STATE_READY);
    assert_true(b->pinned);
    assert_int_equal(b->rank, 8);
    assert_true(b->alpha == 16.0f);
    assert_int_equal(b->in_flight, 1);
    assert_int_equal(b->last_used_ms, 1500);
    assert_int_equal(b->target_modules.n, 1);
    assert_string_equal(b->target_modules.v[0], "o_proj");
    assert_non_null(strstr(b->path, "/adapters/oproj"));
    assert_int_equal(strlen(b->adapter_id), 36);
    ls_msg_clear(&list);
    s_reset();
    assert_int_equal(R.dropped, 0);
}

// ---------------------------------------------------------------------------------------------

// Supervision: the scheduler goes down. Every registered adapter is loaded again into its
// restart and is LOADING until that confirms it (an acquire waits meanwhile instead of reaching
// a scheduler that does not know it); a load in flight keeps its op, so its waiter gets the new
// scheduler's answer; unloads are done (the workers dropped every adapter), whether already
// dispatched or still waiting for requests. A restore that fails drops the adapter, which the
// journal keeps. A tokenizer that went down leaves no holds, and the unload that waited on
// them goes ahead.
static void test_peer_restarts(void **unused) {
    s_new(8, false);
    char ida[64], idb[64];
    snprintf(ida, sizeof ida, "%s", s_load_ok("a", s_adapter("a"), false));
    snprintf(idb, sizeof idb, "%s", s_load_ok("b", s_adapter("b"), true));
    s_load_ok("rank32x", s_adapter("oproj"), false);
    // oproj: dispatched, not answered yet. b: an unload the scheduler has taken. rank32x: an
    // unload waiting for the request that holds it.
    void *lw = s_w(), *uw = s_w(), *uw2 = s_w();
    reg_load(R.reg, 1000, REG_FROM_CLIENT, "oproj", s_adapter("oproj"), false, NULL, lw);
    s_checks();
    uint64_t load_op = s_last_sent(LS_MSG_LOAD_ADAPTER)->rid;
    reg_unload(R.reg, 1100, "b", uw);
    s_last_sent(LS_MSG_UNLOAD_ADAPTER);
    assert_true(s_acquire("rank32x")->u.adapter_acquired.ok);
    reg_unload(R.reg, 1100, "rank32x", uw2);
    int journal = R.n_journal, sent = R.n_sent;

    reg_scheduler_lost(R.reg, 5000);
    assert_true(s_ans(uw)->u.adapter_unloaded.ok);
    assert_true(s_ans(uw2)->u.adapter_unloaded.ok);
    assert_false(reg_has(R.reg, "b"));
    assert_false(reg_has(R.reg, "rank32x"));
    assert_int_equal(R.journal[journal].type, LS_MSG_UNLOAD_ADAPTER);  // the unloads are kept
    assert_int_equal(R.journal[journal + 1].type, LS_MSG_UNLOAD_ADAPTER);
    assert_int_equal(R.n_sent, sent + 2);  // a and oproj
    const ls_msg_t *ra = NULL, *ro = NULL;
    for (int i = sent; i < R.n_sent; i++) {
        assert_int_equal(R.sent[i].type, LS_MSG_LOAD_ADAPTER);
        if (!strcmp(R.sent[i].u.load_adapter.name, "a"))
            ra = &R.sent[i];
        else
            ro = &R.sent[i];
    }
    assert_non_null(ra);
    assert_non_null(ro);
    assert_string_equal(ra->u.load_adapter.adapter_id, ida);
    assert_string_equal(ra->u.load_adapter.path, s_adapter("a"));
    assert_int_equal(ro->rid, load_op);
    assert_false(s_answered(lw));
    // a is LOADING: an acquire waits for the restarted scheduler's answer.
    void *aw = s_w();
    reg_acquire(R.reg, 6000, "a", aw);
    assert_false(s_answered(aw));
    s_sched(ra->rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    assert_true(s_ans(aw)->u.adapter_acquired.ok);
    assert_string_equal(s_ans(aw)->u.adapter_acquired.adapter_id, ida);
    assert_int_equal(R.n_journal, journal + 2);  // a restore writes no record
    s_sched(load_op, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    assert_true(s_ans(lw)->u.adapter_loaded.ok);

    // Down again; this time oproj's restore is refused for good: it is dropped, and the
    // journal says so; a stays.
    sent = R.n_sent;
    reg_scheduler_lost(R.reg, 7000);
    assert_int_equal(R.n_sent, sent + 2);
    for (int i = sent; i < R.n_sent; i++)
        s_sched(R.sent[i].rid, LS_MSG_ADAPTER_LOADED, strcmp(R.sent[i].u.load_adapter.name, "oproj") != 0,
                LS_ERROR_CODE_BAD_REQUEST, "the files are gone");
    assert_false(reg_has(R.reg, "oproj"));
    assert_true(reg_has(R.reg, "a"));
    assert_int_equal(R.journal[R.n_journal - 1].type, LS_MSG_UNLOAD_ADAPTER);

    // Two holds of a; an unload waits for them; the tokenizer goes down.
    assert_true(s_acquire("a")->u.adapter_acquired.ok);
    assert_true(s_acquire("a")->u.adapter_acquired.ok);
    void *uw3 = s_w();
    sent = R.n_sent;
    reg_unload(R.reg, 8000, "a", uw3);
    assert_int_equal(R.n_sent, sent);
    reg_holders_lost(R.reg);
    assert_int_equal(reg_stats(R.reg)->in_flight, 0);
    assert_int_equal(R.n_sent, sent + 1);
    s_sched(s_last_sent(LS_MSG_UNLOAD_ADAPTER)->rid, LS_MSG_ADAPTER_UNLOADED, true, 0, NULL);
    assert_true(s_ans(uw3)->u.adapter_unloaded.ok);
    // A late release from a request of the old tokenizer is counted, not fatal.
    uint64_t unknown = reg_stats(R.reg)->releases_unknown;
    reg_release(R.reg, ida, "a");
    assert_int_equal(reg_stats(R.reg)->releases_unknown, unknown + 1);
    s_reset();
}

// A full disk: the journal cannot take a load's record, so the load is not acknowledged
// (it would vanish at the next restart) and is undone at the scheduler.
static void test_journal_full(void **unused) {
    s_new(8, false);
    R.journal_full = true;
    void *w = s_w();
    reg_load(R.reg, 1000, REG_FROM_CLIENT, "a", s_adapter("a"), false, NULL, w);
    s_checks();
    const ls_msg_t *la = s_last_sent(LS_MSG_LOAD_ADAPTER);
    s_sched(la->rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    const ls_msg_t *a = s_ans(w);
    assert_false(a->u.adapter_loaded.ok);
    assert_int_equal(a->u.adapter_loaded.code, LS_ERROR_CODE_UNAVAILABLE);
    assert_contains(a->u.adapter_loaded.reason, "journal");
    assert_false(reg_has(R.reg, "a"));
    assert_string_equal(s_last_sent(LS_MSG_UNLOAD_ADAPTER)->u.unload_adapter.adapter_id, la->u.load_adapter.adapter_id);
    // With room again, the same load goes through.
    R.journal_full = false;
    s_load_ok("a", s_adapter("a"), false);
    assert_int_equal(R.n_journal, 1);
    s_reset();
}

static void s_fixtures(void) {
    fx_tmpdir(D, sizeof D);
    char p[256], cfg[512];
    snprintf(p, sizeof p, "%s/model", D);
    fx_model(p);
    char err[256];
    snprintf(p, sizeof p, "%s/model/config.json", D);
    if (ls_model_config_load(p, &s_model, err, sizeof err) < 0) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
    snprintf(p, sizeof p, "%s/adapters", D);
    fx_mkdir(p);
    snprintf(p, sizeof p, "%s/outside", D);
    fx_mkdir(p);
    snprintf(p, sizeof p, "%s/adapters-evil", D);
    fx_mkdir(p);
    snprintf(p, sizeof p, "%s/outside/x", D);
    fx_adapter_ok(p);
    fx_adapter_ok(s_adapter("a"));
    fx_adapter(s_adapter("b"), fx_config(cfg, sizeof cfg, 8, "[\"q_proj\", \"k_proj\", \"down_proj\"]", NULL));
    fx_adapter(s_adapter("oproj"), fx_config(cfg, sizeof cfg, 8, "[\"o_proj\"]", NULL));
    fx_adapter(s_adapter("rank32"), fx_config(cfg, sizeof cfg, 32, "[\"q_proj\"]", NULL));
    fx_adapter(s_adapter("fc1"), fx_config(cfg, sizeof cfg, 4, "[\"fc1\"]", NULL));
    fx_adapter(s_adapter("dora"), fx_config(cfg, sizeof cfg, 4, "[\"q_proj\"]", ", \"use_dora\": true"));
    fx_adapter(s_adapter("mts"), fx_config(cfg, sizeof cfg, 4, "[\"q_proj\"]", ", \"modules_to_save\": [\"lm_head\"]"));
    fx_adapter(s_adapter("vocab"),
               fx_config(cfg, sizeof cfg, 4, "[\"q_proj\"]", ", \"trainable_token_indices\": [40]"));
    fx_adapter(s_adapter("tokens"),
               fx_config(cfg, sizeof cfg, 4, "[\"q_proj\"]", ", \"trainable_token_indices\": [3, 5]"));
    fx_adapter(s_adapter("badjson"), "{\"r\": 4, ");
    fx_adapter(s_adapter("noconfig"), "{}");
    snprintf(p, sizeof p, "%s/adapter_config.json", s_adapter("noconfig"));
    unlink(p);
    fx_write(s_adapter("file"), "not a directory");
    snprintf(p, sizeof p, "%s/outside/x", D);
    if (symlink(p, s_adapter("escape")) < 0 || symlink(s_adapter("a"), s_adapter("inlink")) < 0)
        abort();
}

static void test_forget(void **unused) {
    s_new(8, false);
    char *real = realpath(s_adapter("a"), NULL);
    // A load from tensors: its check is the host's (CHECK_TENSORS); journaled, kept.
    void *w = s_w();
    reg_load(R.reg, 1000, REG_FROM_TENSORS, "t", s_adapter("a"), false, NULL, w);
    assert_int_equal(R.chk[R.n_chk - 1].mode, CHECK_TENSORS);
    s_checks();
    s_sched(s_last_sent(LS_MSG_LOAD_ADAPTER)->rid, LS_MSG_ADAPTER_LOADED, true, 0, NULL);
    assert_true(s_ans(w)->u.adapter_loaded.ok);
    assert_int_equal(R.n_journal, 1);
    assert_int_equal(R.n_forgot, 0);
    // Unloaded: forgotten once the unload is in the journal.
    w = s_w();
    reg_unload(R.reg, 1000, "t", w);
    s_sched(s_last_sent(LS_MSG_UNLOAD_ADAPTER)->rid, LS_MSG_ADAPTER_UNLOADED, true, 0, NULL);
    assert_true(s_ans(w)->u.adapter_unloaded.ok);
    assert_int_equal(R.n_forgot, 1);
    assert_int_equal(R.forgot[0].journal, 2);
    assert_string_equal(R.forgot[0].path, real);
    // Refused by the workers (a hostile safetensors): forgotten, never journaled.
    w = s_w();
    reg_load(R.reg, 1000, REG_FROM_TENSORS, "t2", s_adapter("a"), false, NULL, w);
    s_checks();
    s_sched(s_last_sent(LS_MSG_LOAD_ADAPTER)->rid, LS_MSG_ADAPTER_LOADED, false, LS_ERROR_CODE_BAD_REQUEST, "bad");
    assert_false(s_ans(w)->u.adapter_loaded.ok);
    assert_int_equal(R.n_forgot, 2);
    assert_int_equal(R.n_journal, 2);
    // Refused by its check: forgotten.
    w = s_w();
    reg_load(R.reg, 1000, REG_FROM_TENSORS, "t3", s_adapter("missing"), false, NULL, w);
    s_checks();
    assert_int_equal(s_ans(w)->u.adapter_loaded.code, LS_ERROR_CODE_NOT_FOUND);
    assert_int_equal(R.n_forgot, 3);
    assert_string_equal(R.forgot[2].path, s_adapter("missing"));
    // Timed out while its check writes it: forgotten at the timeout and again once the check
    // is done, since the copy may have been written after the first.
    w = s_w();
    reg_load(R.reg, 1000, REG_FROM_TENSORS, "t4", s_adapter("a"), false, NULL, w);
    reg_timeout(R.reg, 1000, R.last_armed);
    assert_int_equal(s_ans(w)->u.adapter_loaded.code, LS_ERROR_CODE_TIMEOUT);
    assert_int_equal(R.n_forgot, 4);
    s_checks();
    assert_int_equal(R.n_forgot, 5);
    assert_string_equal(R.forgot[4].path, real);
    // A journal restore that fails transiently stays in the journal: not forgotten.
    reg_load(R.reg, 1000, REG_FROM_JOURNAL, "j", s_adapter("a"), false, NULL, NULL);
    s_checks();
    s_sched(s_last_sent(LS_MSG_LOAD_ADAPTER)->rid, LS_MSG_ADAPTER_LOADED, false, LS_ERROR_CODE_UNAVAILABLE, "down");
    assert_int_equal(R.n_forgot, 5);
    assert_int_equal(R.n_journal, 2);
    // One that fails for good leaves the journal (dropped), then is forgotten.
    reg_load(R.reg, 1000, REG_FROM_JOURNAL, "j", s_adapter("a"), false, NULL, NULL);
    s_checks();
    s_sched(s_last_sent(LS_MSG_LOAD_ADAPTER)->rid, LS_MSG_ADAPTER_LOADED, false, LS_ERROR_CODE_BAD_REQUEST, "bad");
    assert_int_equal(R.n_journal, 3);
    assert_true(R.journal[2].u.unload_adapter.dropped);
    assert_int_equal(R.n_forgot, 6);
    assert_int_equal(R.forgot[5].journal, 3);
    free(real);
}

int main(void) {
    ls_log_init("test", LS_LOG_ERROR);
    s_fixtures();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_acquire_unload),
        cmocka_unit_test(test_unload_timeouts),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_confinement),
        cmocka_unit_test(test_confinement_names),
        cmocka_unit_test(test_on_demand),
        cmocka_unit_test(test_rollback),
        cmocka_unit_test(test_load_timeout),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_journal),
        cmocka_unit_test(test_startup),
        cmocka_unit_test(test_list_lru),
        cmocka_unit_test(test_peer_restarts),
        cmocka_unit_test(test_journal_full),
        cmocka_unit_test(test_forget),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_rmdir(D);
    return failed;
}
