// Serving end to end: the real scheduler and worker processes on the demo model, driven by this
// test as the scheduler's client (TokenizedReq in, TokenOut back with --output route).
//   mixed_batch       — base + every demo adapter at once: each request gets exactly its answer
//   lora_constraint   — 2 slots for 5 adapters: everything finishes right, the aging bound
//                       holds, base-model requests are not held back by the constraint
//   preemption        — a KV cache too small for everyone: requests are preempted and still
//                       finish with the right answers
//   prefix_cache      — a repeated prompt hits the cache under its adapter, misses under
//                       another adapter and under the base model; outputs stay right
//   abort             — in the queue, mid-prefill and mid-decode: answered, KV and adapter
//                       references freed
//   worker_killed     — the worker dies mid-step: every in-flight request is answered with an
//                       error, new ones are refused, the scheduler keeps answering
//   load_rollback     — two workers; a load one of them refuses is undone on the other
//   tp_mixed_batch    — --tp-size 2 (each worker holds half the model and half of every
//                       adapter slot): base + every adapter at once give exactly the outputs
//                       of --tp-size 1 (eval.json's, which mixed_batch checks TP=1 against)
//   tp_rank_killed    — a rank of the group dies mid-decode: rank 0 fails the step at its
//                       next collective (it sees the process gone), every request gets an error
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_msg.h"
#include "test_util.h"
#include <czmq.h>

#include "ls_msg.h"

#define MAX_REQS 128
#define MAX_OUT 256

// ---------------------------------------------------------------------------------------------
// the demo's held-out prompts

typedef struct {
    char adapter[32];  // "" for the base model; else reverse, upper, sort, digits
    int32_t prompt[128];
    int n_prompt;
    int32_t expected[48];  // without the final stop token
    int n_expected;
} case_t;

static case_t s_cases[5][16];  // [model][prompt]: base, reverse, upper, sort, digits
static const char *s_models[5] = {"", "reverse", "upper", "sort", "digits"};

static void s_read_cases(void) {
    FILE *f = fopen(LS_DEMO_DIR "/eval.json", "r");
    assert_non_null(f);
    static char text[1 << 20];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    for (int m = 0; m < 5; m++) {
        cJSON *model = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "results"), m ? s_models[m] : "base");
        assert_non_null(model);
        cJSON *p;
        int k = 0;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(model, "prompts")) {
            case_t *c = &s_cases[m][k++];
            snprintf(c->adapter, sizeof c->adapter, "%s", s_models[m]);
            cJSON *raw = cJSON_GetObjectItem(p, "raw");
            c->n_prompt = tu_json_ids(cJSON_GetObjectItem(raw, "prompt_ids"), c->prompt, 128);
            c->n_expected = tu_json_ids(cJSON_GetObjectItem(raw, "output_ids"), c->expected, 48) - 1;  // drop the stop
        }
        assert_int_equal(k, 16);
    }
    cJSON_Delete(root);
}

// ---------------------------------------------------------------------------------------------
// the graph: one scheduler, one worker

static char s_dir[64];
static pid_t s_sched_pid, s_worker_pids[4];
static int s_nworkers;
static zsock_t *s_client;
static uint64_t s_rid;

static pid_t s_spawn(const char *log, char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        tu_child_dies_with_parent();
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

// extra: flags, NULL-terminated, each "who:--flag=value" with who "s" (the scheduler), "w"
// (every worker) or a digit (that worker's rank only). tp workers form the group.
static void s_start_tp(const char *const *extra, int tp) {
    assert_int_equal(tu_tmpdir(s_dir, sizeof s_dir, "serving"), 0);
    char sep[128], s_bind[160], s_peers[4][160], s_log[128], w_bind[4][160], w_peer[160], w_log[4][128],
        w_name[4][32], w_rank[4][32], tp_flag[32];
    snprintf(sep, sizeof sep, "ipc://%s/scheduler.sock", s_dir);
    snprintf(s_bind, sizeof s_bind, "--bind=%s", sep);
    snprintf(s_log, sizeof s_log, "%s/scheduler.log", s_dir);
    snprintf(w_peer, sizeof w_peer, "--peer=scheduler=%s", sep);
    snprintf(tp_flag, sizeof tp_flag, "--tp-size=%d", tp);
    char *sargv[40] = {LS_BIN_DIR "/loraserve-scheduler", "--name=scheduler", s_bind, "--output=route",
                       "--step-timeout-ms=3000", tp_flag};
    int ns = 6;
    for (int r = 0; r < tp; r++) {
        snprintf(s_peers[r], sizeof s_peers[r], "--peer=worker-%d=ipc://%s/worker-%d.sock", r, s_dir, r);
        sargv[ns++] = s_peers[r];
    }
    for (int i = 0; extra && extra[i]; i++)
        if (extra[i][0] == 's')
            sargv[ns++] = (char *)extra[i] + 2;
    s_sched_pid = s_spawn(s_log, sargv);
    s_nworkers = tp;
    for (int r = 0; r < tp; r++) {
        snprintf(w_bind[r], sizeof w_bind[r], "--bind=ipc://%s/worker-%d.sock", s_dir, r);
        snprintf(w_log[r], sizeof w_log[r], "%s/worker-%d.log", s_dir, r);
        snprintf(w_name[r], sizeof w_name[r], "--name=worker-%d", r);
        snprintf(w_rank[r], sizeof w_rank[r], "--rank=%d", r);
        char *wargv[40] = {LS_BIN_DIR "/loraserve-worker", w_name[r], w_rank[r], tp_flag, w_bind[r], w_peer,
                           "--model-path=" LS_DEMO_DIR, "--max-lora-rank=16", "--threads=1"};
        int nw = 9;
        for (int i = 0; extra && extra[i]; i++)
            if (extra[i][0] == 'w' || extra[i][0] == '0' + r)
                wargv[nw++] = (char *)extra[i] + 2;
        s_worker_pids[r] = s_spawn(w_log[r], wargv);
    }
    s_client = zsock_new_dealer(sep);
    assert_non_null(s_client);
    zsock_set_rcvtimeo(s_client, 20000);
}

static void s_start(const char *const *extra) { s_start_tp(extra, 1); }

static void s_stop(void) {
    int status;
    for (int r = 0; r < s_nworkers; r++)
        if (s_worker_pids[r] > 0) {
            kill(s_worker_pids[r], SIGTERM);
            waitpid(s_worker_pids[r], &status, 0);
        }
    kill(s_sched_pid, SIGTERM);
    waitpid(s_sched_pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // a clean stop, no crash
    zsock_destroy(&s_client);
    assert_int_equal(tu_rmrf(s_dir), 0);
}

static void s_send(const ls_msg_t *m) { assert_int_equal(tm_send(s_client, m), 0); }

static int s_recv(ls_msg_t *m) {
    if (tm_recv(s_client, m) < 0)
        fail_msg("the scheduler did not answer (logs in %s)", s_dir);
    return m->type;
}

// Loads adapter dir under name; returns the answer's ok and copies its reason.
static int s_try_load(const char *name, const char *dir, char *reason, size_t cap) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.rid = ++s_rid;
    m.u.load_adapter.name = ls_msg_strdup(name);
    m.u.load_adapter.adapter_id = ls_msg_strdup(name);
    char path[256];
    snprintf(path, sizeof path, "%s/adapters/%s", LS_DEMO_DIR, dir);
    m.u.load_adapter.path = ls_msg_strdup(path);
    s_send(&m);
    ls_msg_clear(&m);
    assert_int_equal(s_recv(&m), LS_MSG_ADAPTER_LOADED);
    int ok = m.u.adapter_loaded.ok;
    snprintf(reason, cap, "%s", m.u.adapter_loaded.reason ? m.u.adapter_loaded.reason : "");
    ls_msg_clear(&m);
    return ok;
}

static void s_load(const char *name, const char *dir) {
    char reason[512];
    if (!s_try_load(name, dir, reason, sizeof reason))
        fail_msg("load %s: %s", name, reason);
}

static uint64_t s_metric(const char *name) {
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GET_METRICS);
    m.rid = ++s_rid;
    s_send(&m);
    ls_msg_clear(&m);
    while (s_recv(&m) != LS_MSG_METRICS)
        ls_msg_clear(&m);
    uint64_t v = UINT64_MAX;
    for (size_t i = 0; i < m.u.metrics.names.n; i++)
        if (!strcmp(m.u.metrics.names.v[i], name))
            v = m.u.metrics.values.v[i];
    ls_msg_clear(&m);
    if (v == UINT64_MAX)
        fail_msg("the scheduler has no counter %s", name);
    return v;
}

// ---------------------------------------------------------------------------------------------
// requests

typedef struct {
    uint64_t rid;
    const case_t *c;
    char adapter_id[32];
    int32_t out[MAX_OUT];
    int n_out;
    uint32_t finish, cached;
    int error;           // answered with Error (refused)
    int first_seen;      // order of its first TokenOut among all TokenOuts
    char reason[256];
} req_t;

static req_t s_reqs[MAX_REQS];
static int s_nreqs, s_tokenouts;

static req_t *s_submit(const case_t *c, const char *adapter_id, int ignore_eos, uint32_t max_new) {
    req_t *r = &s_reqs[s_nreqs++];
    memset(r, 0, sizeof *r);
    r->rid = 1000 + (uint64_t)s_nreqs;
    r->c = c;
    r->first_seen = -1;
    snprintf(r->adapter_id, sizeof r->adapter_id, "%s", adapter_id ? adapter_id : c->adapter);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_TOKENIZED_REQ);
    m.rid = r->rid;
    ls_msg_tokenized_req_t *t = &m.u.tokenized_req;
    t->input_ids.v = malloc(sizeof(int32_t) * (size_t)c->n_prompt);
    memcpy(t->input_ids.v, c->prompt, sizeof(int32_t) * (size_t)c->n_prompt);
    t->input_ids.n = (size_t)c->n_prompt;
    if (*r->adapter_id) {
        t->adapter_id = ls_msg_strdup(r->adapter_id);
        t->adapter_name = ls_msg_strdup(r->adapter_id);
    }
    t->sampling.max_new_tokens = max_new;
    t->sampling.ignore_eos = ignore_eos;
    s_send(&m);
    ls_msg_clear(&m);
    return r;
}

static req_t *s_find(uint64_t rid) {
    for (int i = 0; i < s_nreqs; i++)
        if (s_reqs[i].rid == rid)
            return &s_reqs[i];
    return NULL;
}

static int s_done(const req_t *r) { return r->error || r->finish != LS_FINISH_REASON_NONE; }

// Takes one answer from the scheduler and files it under its request. Returns that request.
static req_t *s_pump(void) {
    ls_msg_t m;
    int type = s_recv(&m);
    req_t *r = s_find(m.rid);
    if (r && type == LS_MSG_TOKEN_OUT) {
        if (r->first_seen < 0)
            r->first_seen = s_tokenouts;
        s_tokenouts++;
        for (size_t i = 0; i < m.u.token_out.token_ids.n && r->n_out < MAX_OUT; i++)
            r->out[r->n_out++] = m.u.token_out.token_ids.v[i];
        r->finish = m.u.token_out.finish;
        if (m.u.token_out.first)
            r->cached = m.u.token_out.cached_tokens;
        if (m.u.token_out.error)
            snprintf(r->reason, sizeof r->reason, "%s", m.u.token_out.error);
    } else if (r && type == LS_MSG_ERROR) {
        r->error = 1;
        snprintf(r->reason, sizeof r->reason, "%s", m.u.error.message ? m.u.error.message : "");
    }
    ls_msg_clear(&m);
    return r;
}

static void s_wait_all(void) {
    for (int i = 0; i < s_nreqs; i++)
        while (!s_done(&s_reqs[i]))
            s_pump();
}

// The request's answer equals the rule's (eval.json), ending on the stop token.
static void s_check_answer(const req_t *r) {
    const case_t *c = r->c;
    if (r->error || r->finish != LS_FINISH_REASON_STOP || r->n_out != c->n_expected + 1 ||
        memcmp(r->out, c->expected, sizeof(int32_t) * (size_t)c->n_expected) != 0)
        fail_msg("request %llu (adapter \"%s\"): finish %u, %d tokens, expected %d + stop; %s",
                 (unsigned long long)r->rid, r->adapter_id, r->finish, r->n_out, c->n_expected, r->reason);
}

// Waits for every request, then checks each answer against the rule's.
static void s_wait_answers(void) {
    s_wait_all();
    for (int i = 0; i < s_nreqs; i++)
        s_check_answer(&s_reqs[i]);
}

static void s_load_demo_adapters(void) {
    for (int m = 1; m < 5; m++)
        s_load(s_models[m], s_models[m]);
}

static int setup(void **unused) {
    s_nreqs = s_tokenouts = 0;
    return 0;
}

// ---------------------------------------------------------------------------------------------

static void test_mixed_batch(void **unused) {
    const char *extra[] = {"w:--max-loras-per-batch=4", NULL};
    s_start(extra);
    s_load_demo_adapters();
    // interleaved: base, reverse, upper, sort, digits, base, …, all in flight together
    for (int k = 0; k < 16; k++)
        for (int m = 0; m < 5; m++)
            s_submit(&s_cases[m][k], NULL, 0, 0);
    s_wait_answers();
    assert_true(s_metric("steps") < 40);  // batched: one prefill step, then decodes together
    assert_int_equal(s_metric("kv_blocks_used"), 0);  // nothing held (cached blocks are counted apart)
    s_stop();
}

static void test_lora_constraint(void **unused) {
    const char *extra[] = {"w:--max-loras-per-batch=2", "s:--max-skip-steps=4", NULL};
    s_start(extra);
    s_load_demo_adapters();
    s_load("reverse-b", "reverse");  // a fifth adapter: the same weights under another id
    // 5 adapters × 4 prompts, then 4 base-model prompts behind them in the queue
    for (int k = 0; k < 4; k++)
        for (int m = 1; m < 5; m++)
            s_submit(&s_cases[m][k], NULL, 0, 0);
    for (int k = 4; k < 8; k++)
        s_submit(&s_cases[1][k], "reverse-b", 0, 0);
    for (int k = 0; k < 4; k++)
        s_submit(&s_cases[0][k], NULL, 0, 0);
    s_wait_answers();
    // Aging: no request was passed over more than --max-skip-steps steps.
    uint64_t skipped = s_metric("max_skipped_steps");
    assert_true(skipped <= 4);
    // Base-model requests start in the first step although queued behind adapter requests
    // whose adapters did not fit: their first tokens come before any of the last adapter's.
    int first_base = 0, last_adapter_first = 0;
    for (int i = 0; i < s_nreqs; i++) {
        if (!*s_reqs[i].adapter_id && s_reqs[i].first_seen > first_base)
            first_base = s_reqs[i].first_seen;
        if (!strcmp(s_reqs[i].adapter_id, "reverse-b") && s_reqs[i].first_seen > last_adapter_first)
            last_adapter_first = s_reqs[i].first_seen;
    }
    assert_true(first_base < last_adapter_first);
    assert_true(s_metric("adapter_cold_loads") >= 5);  // slots changed hands
    s_stop();
}

static void test_preemption(void **unused) {
    // Blocks of 4 tokens; a request needs 3 for its prompt and up to 5 with its answer. The
    // pool's pages are KV blocks and adapters alike (docs/memory.md): a page is 16 KiB here (4
    // tokens of K and V, 4 layers of 4 KV heads of 32, f32), so the four adapters take 37 + 37
    // + 74 + 37 pages (rank 8, 8, 16, 8 on all seven targets) and leave 24 blocks. Those hold
    // 8 prompts but not 8 answers: decodes run out and preempt the newest (the adapters, all
    // running, keep their pages).
    const char *extra[] = {"w:--kv-blocks=209", "w:--block-size=4", "w:--max-loras-per-batch=4", NULL};
    s_start(extra);
    s_load_demo_adapters();
    // max_new_tokens 8 (answers are at most 6 tokens and a stop): a request that could never
    // fit the whole cache is refused at arrival, and 128 (the default) would not.
    for (int k = 0; k < 2; k++)
        for (int m = 1; m < 5; m++)
            s_submit(&s_cases[m][k], NULL, 0, 8);
    s_wait_answers();
    assert_true(s_metric("preemptions") > 0);
    assert_int_equal(s_metric("kv_blocks_used"), 0);
    s_stop();
}

static void test_prefix_cache(void **unused) {
    const char *extra[] = {"w:--block-size=4", "w:--max-loras-per-batch=4", NULL};
    s_start(extra);
    s_load_demo_adapters();
    const case_t *rev = &s_cases[1][3], *up = &s_cases[2][3], *base = &s_cases[0][3];
    // the same prompt ids under each model (eval.json's raw prompts are the same text)
    assert_int_equal(rev->n_prompt, up->n_prompt);
    assert_memory_equal(rev->prompt, up->prompt, sizeof(int32_t) * (size_t)rev->n_prompt);
    req_t *a = s_submit(rev, NULL, 0, 0);
    s_wait_all();
    req_t *b = s_submit(rev, NULL, 0, 0);   // same adapter: hit
    s_wait_all();
    req_t *c = s_submit(up, NULL, 0, 0);    // another adapter: miss
    s_wait_all();
    req_t *d = s_submit(base, NULL, 0, 0);  // base model: miss
    s_wait_all();
    assert_int_equal(a->cached, 0);
    assert_true(b->cached >= 4 && b->cached < (uint32_t)rev->n_prompt);  // full blocks, never the last token
    assert_int_equal(c->cached, 0);
    assert_int_equal(d->cached, 0);
    s_check_answer(a);
    s_check_answer(b);
    s_check_answer(c);
    s_check_answer(d);
    assert_true(s_metric("prefix_hit_tokens") == b->cached);
    s_stop();
}

static void test_abort(void **unused) {
    // One request decodes at a time, so the second waits in the queue; chunks of 4 prompt
    // tokens make the third's prefill span steps.
    const char *extra[] = {"s:--max-running-requests=1", "s:--chunked-prefill-size=4", "w:--max-loras-per-batch=4",
                           NULL};
    s_start(extra);
    s_load_demo_adapters();
    req_t *decoding = s_submit(&s_cases[1][0], NULL, 1, 200);  // ignore_eos: a long answer
    req_t *queued = s_submit(&s_cases[2][0], NULL, 0, 0);
    while (decoding->n_out < 3 && !s_done(decoding))
        s_pump();
    assert_false(s_done(decoding));
    ls_msg_t m;
    uint64_t victims[] = {queued->rid, decoding->rid};
    for (int i = 0; i < 2; i++) {
        ls_msg_init(&m, LS_MSG_ABORT);
        m.rid = victims[i];
        m.u.abort.reason = ls_msg_strdup("test abort");
        m.u.abort.finish = LS_FINISH_REASON_ABORT;
        s_send(&m);
        ls_msg_clear(&m);
    }
    s_wait_all();
    assert_int_equal(queued->finish, LS_FINISH_REASON_ABORT);
    assert_int_equal(queued->n_out, 0);
    assert_int_equal(decoding->finish, LS_FINISH_REASON_ABORT);
    assert_true(decoding->n_out < 200);
    // mid-prefill: abort as soon as it is submitted; its 11-token prompt takes three steps
    req_t *prefilling = s_submit(&s_cases[3][1], NULL, 0, 0);
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = prefilling->rid;
    m.u.abort.finish = LS_FINISH_REASON_ABORT;
    s_send(&m);
    ls_msg_clear(&m);
    s_wait_all();
    assert_int_equal(prefilling->finish, LS_FINISH_REASON_ABORT);
    // everything freed: no KV held by requests, no adapter references, nothing queued
    assert_int_equal(s_metric("kv_blocks_used"), 0);
    assert_int_equal(s_metric("adapter_request_refs"), 0);
    assert_int_equal(s_metric("queue_length"), 0);
    assert_int_equal(s_metric("running_requests"), 0);
    assert_int_equal(s_metric("requests_aborted"), 3);
    // and it still serves
    req_t *after = s_submit(&s_cases[4][2], NULL, 0, 0);
    s_wait_all();
    s_check_answer(after);
    s_stop();
}

// Starts a group of tp workers with the demo adapters, puts two long answers (ignore_eos) in
// flight and SIGKILLs worker `victim` while they decode; their requests come back in r[2].
static void s_kill_mid_decode(const char *const *extra, int tp, int victim, req_t *r[2]) {
    s_start_tp(extra, tp);
    s_load_demo_adapters();
    r[0] = s_submit(&s_cases[1][0], NULL, 1, 200);
    r[1] = s_submit(&s_cases[0][1], NULL, 1, 200);
    while (r[0]->n_out < 2 && !s_done(r[0]))
        s_pump();
    assert_false(s_done(r[0]));
    kill(s_worker_pids[victim], SIGKILL);
    int status;
    waitpid(s_worker_pids[victim], &status, 0);
    s_worker_pids[victim] = -1;
}

static void test_worker_killed(void **unused) {
    const char *extra[] = {"w:--max-loras-per-batch=4", NULL};
    req_t *r[2];
    s_kill_mid_decode(extra, 1, 0, r);
    req_t *r1 = r[0], *r2 = r[1];
    s_wait_all();  // within the 3 s step timeout, not never
    assert_int_equal(r1->finish, LS_FINISH_REASON_ERROR);
    assert_int_equal(r2->finish, LS_FINISH_REASON_ERROR);
    assert_true(strlen(r1->reason) > 0);
    // a new request is refused at once rather than left hanging
    req_t *late = s_submit(&s_cases[0][2], NULL, 0, 0);
    s_wait_all();
    assert_true(late->error || late->finish == LS_FINISH_REASON_ERROR);
    assert_true(s_metric("step_timeouts") >= 1);
    s_stop();
}

// A load that fails on one worker of the group is rolled back on the others: worker-1 takes
// adapters up to rank 8, so the rank-16 "sort" loads on worker-0 and fails on worker-1.
static void test_load_rollback(void **unused) {
    const char *extra[] = {"w:--max-loras-per-batch=4", "1:--max-lora-rank=8", NULL};
    s_start_tp(extra, 2);
    s_load("reverse", "reverse");  // rank 8: fits both
    char reason[512];
    assert_false(s_try_load("sort", "sort", reason, sizeof reason));
    assert_non_null(strstr(reason, "rank"));
    // not registered anywhere: a request for it is refused, the good adapter still serves
    req_t *gone = s_submit(&s_cases[3][0], NULL, 0, 0);
    req_t *ok = s_submit(&s_cases[1][0], NULL, 0, 0);
    s_wait_all();
    assert_true(gone->error || gone->finish == LS_FINISH_REASON_ERROR);
    s_check_answer(ok);
    // and worker-0 dropped its copy: loading it again fails the same way, not "already there"
    assert_false(s_try_load("sort", "sort", reason, sizeof reason));
    s_stop();
}

static void test_tp_mixed_batch(void **unused) {
    const char *extra[] = {"w:--max-loras-per-batch=4", NULL};
    s_start_tp(extra, 2);
    s_load_demo_adapters();
    for (int k = 0; k < 16; k++)
        for (int m = 0; m < 5; m++)
            s_submit(&s_cases[m][k], NULL, 0, 0);
    s_wait_answers();
    // and prompts one after another, so that decode-only steps of one sequence run too
    for (int m = 0; m < 5; m++) {
        req_t *r = s_submit(&s_cases[m][5], NULL, 0, 0);
        s_wait_all();
        s_check_answer(r);
    }
    assert_int_equal(s_metric("kv_blocks_used"), 0);
    s_stop();
}

static void test_tp_rank_killed(void **unused) {
    const char *extra[] = {"w:--max-loras-per-batch=4", "w:--tp-timeout-ms=2000", NULL};
    req_t *r[2];
    s_kill_mid_decode(extra, 2, 1, r);
    req_t *r1 = r[0], *r2 = r[1];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s_wait_all();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    print_message("tp_rank_killed: requests failed %.2f s after rank 1 died: %s\n", s, r1->reason);
    assert_int_equal(r1->finish, LS_FINISH_REASON_ERROR);
    assert_int_equal(r2->finish, LS_FINISH_REASON_ERROR);
    assert_true(s < 3.0);  // within the tensor-parallel timeout, not the 3 s step timeout
    s_stop();
}

int main(void) {
    alarm(300);
    s_read_cases();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_mixed_batch, setup),
        cmocka_unit_test_setup(test_lora_constraint, setup),
        cmocka_unit_test_setup(test_preemption, setup),
        cmocka_unit_test_setup(test_prefix_cache, setup),
        cmocka_unit_test_setup(test_abort, setup),
        cmocka_unit_test_setup(test_worker_killed, setup),
        cmocka_unit_test_setup(test_load_rollback, setup),
        cmocka_unit_test_setup(test_tp_mixed_batch, setup),
        cmocka_unit_test_setup(test_tp_rank_killed, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
