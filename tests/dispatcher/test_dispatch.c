// Dispatcher core tests: no sockets; the test plays the groups' schedulers and the senders.
//   adapter_affinity  — an adapter's requests stay with the group that serves it
//   prefix_affinity   — a base-model prompt with a known first block goes where it went
//   imbalance_bound   — affinity yields to load past disp_imbalance_bound; the spread stays
//                       within it under a flood for one adapter
//   relay_and_ends    — a group's Error reaches the sender; RequestEnded ends the load;
//                       Abort goes to the request's group, or to every group when unknown
//   fan_out           — a load answered once when every group answered; a partial failure
//                       is told, and the group that loaded is told to unload; lists merge
//   dead_group        — its requests are answered (TokenOut ERROR), new ones avoid it, a
//                       fan-out stops waiting for it; none live: UNAVAILABLE at once
//   reload_on_restart — a restarted group gets every adapter before it takes requests
//   tensors_refused   — a load from tensors is answered BAD_REQUEST at once, reaches no group
//                       and is not kept for a restarted group
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dispatch.h"
#include "ls_log.h"

#define S_MAX_OUT 256

// What the core emitted: destination and a copy of the message's type, rid and a few fields.
typedef struct {
    disp_dest_t dest;
    int type;
    uint64_t rid;
    bool ok;
    uint32_t code;
    uint32_t finish;
    char adapter_id[64];
    size_t nlisted;
    bool resident;
} out_t;

static out_t s_out[S_MAX_OUT];
static int s_nout, s_released;

static void s_emit(void *arg, const disp_dest_t *d, const ls_msg_t *m) {
    assert_true(s_nout < S_MAX_OUT);
    out_t *o = &s_out[s_nout++];
    memset(o, 0, sizeof *o);
    o->dest = *d;
    o->type = m->type;
    o->rid = m->rid;
    switch (m->type) {
    case LS_MSG_ADAPTER_LOADED:
        o->ok = m->u.adapter_loaded.ok;
        o->code = m->u.adapter_loaded.code;
        break;
    case LS_MSG_ADAPTER_UNLOADED:
        o->ok = m->u.adapter_unloaded.ok;
        break;
    case LS_MSG_ERROR:
        o->code = m->u.error.code;
        break;
    case LS_MSG_TOKEN_OUT:
        o->finish = m->u.token_out.finish;
        break;
    case LS_MSG_LOAD_ADAPTER:
        snprintf(o->adapter_id, sizeof o->adapter_id, "%s", m->u.load_adapter.adapter_id ? m->u.load_adapter.adapter_id : "");
        break;
    case LS_MSG_ADAPTER_LIST:
        o->nlisted = m->u.adapter_list.adapters.n;
        o->resident = o->nlisted && m->u.adapter_list.adapters.v[0].cpu_resident;
        break;
    default:
        break;
    }
}

static void s_release(void *arg, void *reply) { s_released++; }

static disp_t *s_new(int groups) {
    s_nout = s_released = 0;
    const disp_config_t cfg = {.groups = groups, .block_size = 4};
    const disp_io_t io = {.emit = s_emit, .release = s_release};
    disp_t *d = disp_new(&cfg, &io);
    assert_non_null(d);
    return d;
}

static int s_handle = 1;  // any non-NULL pointer stands for a route

// A request with prompt tokens base, base+1, …; returns the group it went to (-1: refused).
static int s_request(disp_t *d, uint64_t rid, const char *adapter, int ntok, int base) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = rid;
    m.u.tokenized_req.adapter_id = adapter ? ls_msg_strdup(adapter) : NULL;
    m.u.tokenized_req.input_ids.v = calloc((size_t)ntok, sizeof(int32_t));
    m.u.tokenized_req.input_ids.n = (size_t)ntok;
    for (int i = 0; i < ntok; i++)
        m.u.tokenized_req.input_ids.v[i] = base + i;
    int before = s_nout;
    disp_on_request(d, 0, &m, &s_handle);
    ls_msg_clear(&m);
    assert_int_equal(s_nout, before + 1);
    const out_t *o = &s_out[s_nout - 1];
    return o->dest.kind == DISP_TO_GROUP && o->type == LS_MSG_TOKENIZED_REQ ? o->dest.group : -1;
}

static void s_group_says(disp_t *d, int g, int type, uint64_t rid, bool ok) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    if (type == LS_MSG_ADAPTER_LOADED) {
        m.u.adapter_loaded.ok = ok;
        m.u.adapter_loaded.code = ok ? 0 : LS_ERROR_CODE_BAD_REQUEST;
        m.u.adapter_loaded.reason = ok ? NULL : ls_msg_strdup("rank too large");
    } else if (type == LS_MSG_ADAPTER_UNLOADED)
        m.u.adapter_unloaded.ok = ok;
    else if (type == LS_MSG_ERROR)
        m.u.error.code = LS_ERROR_CODE_OVERLOADED;
    disp_on_group_message(d, 0, g, &m);
    ls_msg_clear(&m);
}

static void s_end(disp_t *d, int g, uint64_t rid) { s_group_says(d, g, LS_MSG_REQUEST_ENDED, rid, true); }

// Fans out a command; returns the rid the groups got (the dispatcher's own).
static uint64_t s_command(disp_t *d, int type, const char *id, uint64_t rid) {
    ls_msg_t m;
    ls_msg_init(&m, type);
    m.rid = rid;
    if (type == LS_MSG_LOAD_ADAPTER) {
        m.u.load_adapter.name = ls_msg_strdup(id);
        m.u.load_adapter.adapter_id = ls_msg_strdup(id);
        m.u.load_adapter.path = ls_msg_strdup("/adapters/x");
    } else if (type == LS_MSG_UNLOAD_ADAPTER) {
        m.u.unload_adapter.name = ls_msg_strdup(id);
        m.u.unload_adapter.adapter_id = ls_msg_strdup(id);
    }
    int before = s_nout;
    disp_on_adapter_command(d, 0, &m, &s_handle);
    ls_msg_clear(&m);
    return s_nout > before && s_out[before].dest.kind == DISP_TO_GROUP ? s_out[before].rid : 0;
}

static void test_adapter_affinity(void **unused) {
    disp_t *d = s_new(2);
    int ga = s_request(d, 1, "A", 3, 0);
    int gb = s_request(d, 2, "B", 3, 100);
    assert_int_not_equal(ga, gb);  // new adapters spread over idle groups
    for (uint64_t rid = 3; rid < 6; rid++)
        assert_int_equal(s_request(d, rid, "A", 3, (int)rid * 10), ga);
    // Sticky once its requests ended: the group still holds it in its CPU tier.
    for (uint64_t rid = 1; rid < 6; rid++)
        s_end(d, rid == 2 ? gb : ga, rid);
    assert_int_equal(disp_stats(d)->load[0] + disp_stats(d)->load[1], 0);
    assert_int_equal(s_request(d, 6, "B", 3, 7), gb);
    assert_int_equal(s_request(d, 7, "A", 3, 7), ga);
    assert_true(disp_stats(d)->by[DISP_BY_ADAPTER] >= 5);
    disp_shutdown(d, 0);
    disp_destroy(&d);
    assert_null(d);
}

static void test_prefix_affinity(void **unused) {
    disp_t *d = s_new(2);
    int g0 = s_request(d, 1, NULL, 9, 500);  // two whole blocks of 4
    s_request(d, 2, NULL, 9, 900);           // another prefix: the other group
    s_end(d, g0, 1);
    // Same first block, different rest: the first block's key still matches.
    int before = (int)disp_stats(d)->by[DISP_BY_PREFIX];
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = 3;
    int32_t ids[] = {500, 501, 502, 503, 7, 7, 7, 7, 7};
    m.u.tokenized_req.input_ids.v = malloc(sizeof ids);
    memcpy(m.u.tokenized_req.input_ids.v, ids, sizeof ids);
    m.u.tokenized_req.input_ids.n = 9;
    disp_on_request(d, 0, &m, &s_handle);
    ls_msg_clear(&m);
    assert_int_equal(s_out[s_nout - 1].dest.group, g0);
    assert_int_equal((int)disp_stats(d)->by[DISP_BY_PREFIX], before + 1);
    // A prompt shorter than a block has no prefix key: by load.
    assert_int_equal(s_request(d, 4, NULL, 3, 500), 1 - g0);  // loads 1 and 1: the one dispatched fewer
    disp_shutdown(d, 0);
    disp_destroy(&d);
}

static void test_imbalance_bound(void **unused) {
    assert_int_equal(disp_imbalance_bound(0), 4);
    assert_int_equal(disp_imbalance_bound(32), 4);
    assert_int_equal(disp_imbalance_bound(80), 10);
    disp_t *d = s_new(3);
    // A flood for one adapter: affinity keeps it on one group only until that group is the
    // bound ahead of the idlest; then the others take their turn.
    uint64_t rid = 1;
    for (; rid <= 200; rid++) {
        s_request(d, rid, "hot", 5, (int)rid);
        const disp_stats_t *st = disp_stats(d);
        uint64_t total = st->load[0] + st->load[1] + st->load[2], lo = st->load[0], hi = st->load[0];
        for (int g = 1; g < 3; g++) {
            lo = st->load[g] < lo ? st->load[g] : lo;
            hi = st->load[g] > hi ? st->load[g] : hi;
        }
        assert_true(hi - lo <= disp_imbalance_bound(total));
    }
    assert_true(disp_stats(d)->bound_overrides > 0);
    for (int g = 0; g < 3; g++)
        assert_true(disp_stats(d)->load[g] >= 50);
    disp_shutdown(d, 0);
    assert_int_equal(s_released, 200);
    disp_destroy(&d);
}

static void test_relay_and_ends(void **unused) {
    disp_t *d = s_new(2);
    int g = s_request(d, 7, "A", 4, 0);
    // The group refuses it (429): the sender hears the Error; the load lasts until RequestEnded.
    s_group_says(d, g, LS_MSG_ERROR, 7, false);
    assert_int_equal(s_out[s_nout - 1].dest.kind, DISP_TO_REPLY);
    assert_int_equal(s_out[s_nout - 1].code, LS_ERROR_CODE_OVERLOADED);
    assert_int_equal(disp_stats(d)->load[g], 1);
    s_group_says(d, 1 - g, LS_MSG_REQUEST_ENDED, 7, true);  // not that group's: ignored
    assert_int_equal(disp_stats(d)->load[g], 1);
    s_end(d, g, 7);
    assert_int_equal(disp_stats(d)->load[g], 0);
    assert_int_equal(s_released, 1);
    // A rid in use is refused here, never reaching a group.
    s_request(d, 8, NULL, 2, 0);
    assert_int_equal(s_request(d, 8, NULL, 2, 0), -1);
    assert_int_equal(s_out[s_nout - 1].code, LS_ERROR_CODE_BAD_REQUEST);
    // Abort: the request's group; unknown: every group.
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = 8;
    int before = s_nout;
    disp_on_abort(d, 0, &m);
    assert_int_equal(s_nout, before + 1);
    m.rid = 99;
    disp_on_abort(d, 0, &m);
    assert_int_equal(s_nout, before + 3);
    ls_msg_clear(&m);
    disp_shutdown(d, 0);
    disp_destroy(&d);
}

static void test_fan_out(void **unused) {
    disp_t *d = s_new(2);
    uint64_t op = s_command(d, LS_MSG_LOAD_ADAPTER, "A", 41);
    assert_int_equal(s_nout, 2);  // one to each group
    s_group_says(d, 0, LS_MSG_ADAPTER_LOADED, op, true);
    assert_int_equal(s_nout, 2);  // waits for the other
    s_group_says(d, 1, LS_MSG_ADAPTER_LOADED, op, true);
    assert_int_equal(s_out[s_nout - 1].type, LS_MSG_ADAPTER_LOADED);
    assert_int_equal(s_out[s_nout - 1].rid, 41);
    assert_true(s_out[s_nout - 1].ok);
    assert_int_equal(disp_stats(d)->adapters, 1);
    // A partial failure: one answer, not ok, with the failure's code; group 0 unloads it again.
    op = s_command(d, LS_MSG_LOAD_ADAPTER, "B", 42);
    s_group_says(d, 0, LS_MSG_ADAPTER_LOADED, op, true);
    int before = s_nout;
    s_group_says(d, 1, LS_MSG_ADAPTER_LOADED, op, false);
    assert_int_equal(s_nout, before + 2);
    assert_int_equal(s_out[before].type, LS_MSG_UNLOAD_ADAPTER);
    assert_int_equal(s_out[before].dest.group, 0);
    assert_int_equal(s_out[before + 1].rid, 42);
    assert_false(s_out[before + 1].ok);
    assert_int_equal(s_out[before + 1].code, LS_ERROR_CODE_BAD_REQUEST);
    assert_int_equal(disp_stats(d)->adapters, 1);
    // A listing merges the groups' residency.
    op = s_command(d, LS_MSG_LIST_ADAPTERS, NULL, 43);
    for (int g = 0; g < 2; g++) {
        ls_msg_t m;
        ls_msg_init(&m, LS_MSG_ADAPTER_LIST);
        m.rid = op;
        m.u.adapter_list.adapters.v = calloc(1, sizeof *m.u.adapter_list.adapters.v);
        m.u.adapter_list.adapters.n = 1;
        m.u.adapter_list.adapters.v[0].adapter_id = ls_msg_strdup("A");
        m.u.adapter_list.adapters.v[0].cpu_resident = g == 1;
        disp_on_group_message(d, 0, g, &m);
        ls_msg_clear(&m);
    }
    assert_int_equal(s_out[s_nout - 1].type, LS_MSG_ADAPTER_LIST);
    assert_int_equal(s_out[s_nout - 1].rid, 43);
    assert_int_equal(s_out[s_nout - 1].nlisted, 1);
    assert_true(s_out[s_nout - 1].resident);
    // Unload: every group, then the adapter is no longer kept.
    op = s_command(d, LS_MSG_UNLOAD_ADAPTER, "A", 44);
    s_group_says(d, 0, LS_MSG_ADAPTER_UNLOADED, op, true);
    s_group_says(d, 1, LS_MSG_ADAPTER_UNLOADED, op, true);
    assert_true(s_out[s_nout - 1].ok);
    assert_int_equal(disp_stats(d)->adapters, 0);
    assert_int_equal(s_released, 4);
    disp_destroy(&d);
}

static void test_dead_group(void **unused) {
    disp_t *d = s_new(2);
    int g = s_request(d, 1, "A", 4, 0);
    s_request(d, 2, "B", 4, 50);
    uint64_t op = s_command(d, LS_MSG_LOAD_ADAPTER, "C", 60);
    s_group_says(d, 1 - g, LS_MSG_ADAPTER_LOADED, op, true);
    int before = s_nout;
    disp_on_group_status(d, 0, g, -1, false, 0, "killed");
    // Its request is answered on the output path, and the load no longer waits for it.
    assert_int_equal(s_out[before].type, LS_MSG_TOKEN_OUT);
    assert_int_equal(s_out[before].dest.kind, DISP_TO_OUTPUT);
    assert_int_equal(s_out[before].rid, 1);
    assert_int_equal(s_out[before].finish, LS_FINISH_REASON_ERROR);
    assert_int_equal(s_out[s_nout - 1].type, LS_MSG_ADAPTER_LOADED);
    assert_true(s_out[s_nout - 1].ok);
    assert_int_equal(disp_stats(d)->load[g], 0);
    assert_int_equal(disp_stats(d)->groups_dead, 1);
    assert_false(disp_group_live(d, g));
    // New requests avoid it, even for its adapter.
    for (uint64_t rid = 10; rid < 20; rid++)
        assert_int_equal(s_request(d, rid, "A", 4, (int)rid), 1 - g);
    // A worker of the other group down too: nothing is live, requests are refused at once.
    disp_on_group_status(d, 0, 1 - g, 0, false, 0, "worker died");
    assert_int_equal(s_request(d, 30, NULL, 4, 0), -1);
    assert_int_equal(s_out[s_nout - 1].code, LS_ERROR_CODE_UNAVAILABLE);
    disp_on_group_status(d, 0, 1 - g, 0, true, 1, NULL);
    assert_int_equal(s_request(d, 31, NULL, 4, 0), 1 - g);
    disp_shutdown(d, 0);
    disp_destroy(&d);
}

static void test_reload_on_restart(void **unused) {
    disp_t *d = s_new(2);
    const char *ids[] = {"A", "B"};
    for (int i = 0; i < 2; i++) {
        uint64_t op = s_command(d, LS_MSG_LOAD_ADAPTER, ids[i], 70 + (uint64_t)i);
        s_group_says(d, 0, LS_MSG_ADAPTER_LOADED, op, true);
        s_group_says(d, 1, LS_MSG_ADAPTER_LOADED, op, true);
    }
    disp_on_group_status(d, 0, 1, -1, false, 0, "killed");
    int before = s_nout;
    disp_on_group_status(d, 0, 1, -1, true, 1, NULL);
    // Both adapters go to the restarted group, in load order, before it is live.
    assert_int_equal(s_nout, before + 2);
    assert_int_equal(s_out[before].type, LS_MSG_LOAD_ADAPTER);
    assert_int_equal(s_out[before].dest.group, 1);
    assert_string_equal(s_out[before].adapter_id, "A");
    assert_string_equal(s_out[before + 1].adapter_id, "B");
    assert_false(disp_group_live(d, 1));
    assert_int_equal(s_request(d, 1, "A", 4, 0), 0);
    s_group_says(d, 1, LS_MSG_ADAPTER_LOADED, s_out[before].rid, true);
    assert_false(disp_group_live(d, 1));
    s_group_says(d, 1, LS_MSG_ADAPTER_LOADED, s_out[before + 1].rid, true);
    assert_true(disp_group_live(d, 1));
    assert_int_equal(disp_stats(d)->reloads, 2);
    assert_int_equal(s_request(d, 2, NULL, 4, 0), 1);  // the idle group takes the next
    disp_shutdown(d, 0);
    disp_destroy(&d);
}

static void test_tensors_refused(void **unused) {
    disp_t *d = s_new(2);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = 80;
    m.u.load_adapter.name = ls_msg_strdup("T");
    m.u.load_adapter.adapter_id = ls_msg_strdup("T");
    m.u.load_adapter.from_tensors = true;
    disp_on_adapter_command(d, 0, &m, &s_handle);
    ls_msg_clear(&m);
    assert_int_equal(s_nout, 1);
    assert_int_equal(s_out[0].dest.kind, DISP_TO_REPLY);
    assert_int_equal(s_out[0].type, LS_MSG_ADAPTER_LOADED);
    assert_int_equal(s_out[0].rid, 80);
    assert_false(s_out[0].ok);
    assert_int_equal(s_out[0].code, LS_ERROR_CODE_BAD_REQUEST);
    assert_int_equal(s_released, 1);
    assert_int_equal(disp_stats(d)->adapters, 0);
    disp_on_group_status(d, 0, 1, -1, false, 0, "killed");
    disp_on_group_status(d, 0, 1, -1, true, 1, NULL);
    assert_int_equal(s_nout, 1);  // nothing to re-load
    assert_true(disp_group_live(d, 1));
    disp_shutdown(d, 0);
    disp_destroy(&d);
}

int main(void) {
    ls_log_init("test_dispatch", LS_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adapter_affinity), cmocka_unit_test(test_prefix_affinity),
        cmocka_unit_test(test_imbalance_bound),  cmocka_unit_test(test_relay_and_ends),
        cmocka_unit_test(test_fan_out),          cmocka_unit_test(test_dead_group),
        cmocka_unit_test(test_reload_on_restart),
        cmocka_unit_test(test_tensors_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
