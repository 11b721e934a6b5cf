// The front door end to end: launch/loraserve starts the whole graph on the demo model (the four
// adapters loaded), and this test is a client with a DEALER to the tokenizer:
//   mixed      — base + every adapter, streaming and not, all in flight: each text is the rule's
//                answer (eval.json), streamed pieces concatenated equal the non-streamed text
//   chat       — the prompt as the user message of the ChatML template gives the same answers
//   refusals   — unknown adapter NOT_FOUND, too long TOO_LARGE, bad messages BAD_REQUEST
//   abort      — an Abort mid-stream ends it with ABORT; the registry's in_flight is back to 0
//   stop       — a stop string ends with STOP + matched_stop, the text cut before it
//   n2         — n = 2 gives completions 0 and 1, the request's last TextOut marked
//   timeout    — timeout_ms ends a long request with ERROR TIMEOUT
//   admin      — LoadAdapter / ListAdapters / UnloadAdapter relayed to the registry
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

#define MAX_OUTS 256

static const char *s_models[5] = {"", "reverse", "upper", "sort", "digits"};
static char s_prompts[16][128];
static char s_expected[5][16][128];

static void s_read_cases(void) {
    FILE *f = fopen(LS_DEMO_DIR "/eval.json", "r");
    assert_non_null(f);
    static char text[1 << 20];
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    cJSON *root = cJSON_Parse(text);
    for (int m = 0; m < 5; m++) {
        cJSON *model = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "results"), m ? s_models[m] : "base"), *p;
        int k = 0;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(model, "prompts")) {
            snprintf(s_prompts[k], sizeof s_prompts[k], "%s", cJSON_GetObjectItem(p, "prompt")->valuestring);
            snprintf(s_expected[m][k], sizeof s_expected[m][k], "%s", cJSON_GetObjectItem(p, "expected")->valuestring);
            k++;
        }
        assert_int_equal(k, 16);
    }
    cJSON_Delete(root);
}

// ---------------------------------------------------------------------------------------------
// the graph

static char s_dir[64];
static pid_t s_launcher;
static zsock_t *s_client;
static char s_endpoint[256];  // the tokenizer's ROUTER
static uint64_t s_rid;
// --max-client-requests of the graph: above what test_mixed has open at once (40).
#define MAX_CLIENT_REQUESTS 48
#define S_STR(x) #x
#define S_XSTR(x) S_STR(x)

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int s_start(void **unused) {
    s_read_cases();
    if (tu_tmpdir(s_dir, sizeof s_dir, "fd") < 0)
        return -1;
    char out[128], graph[128];
    snprintf(out, sizeof out, "%s/launcher.out", s_dir);
    snprintf(graph, sizeof graph, "%s/graph.json", s_dir);
    s_launcher = fork();
    if (s_launcher == 0) {
        tu_child_dies_with_parent();
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("LORASERVE_BIN", LS_BIN_DIR, 0);  // an outer LORASERVE_BIN wins
        // --lora-roots lets clients load from the demo's adapters (admin test)
        execl(LS_LAUNCH_SCRIPT, LS_LAUNCH_SCRIPT, "--run-dir", s_dir, "--lora-roots", LS_DEMO_DIR "/adapters",
              "--max-loras-per-batch", "6", "--max-client-requests", S_XSTR(MAX_CLIENT_REQUESTS), "--port", "0",
              (char *)NULL);  // any free port: tests run in parallel
        _exit(127);
    }
    cJSON *g = NULL;
    for (double t0 = s_now(); !g && s_now() - t0 < 60; usleep(50000)) {
        FILE *f = fopen(graph, "r");
        if (f) {
            char text[16384];
            text[fread(text, 1, sizeof text - 1, f)] = 0;
            fclose(f);
            g = cJSON_Parse(text);
        }
        if (waitpid(s_launcher, NULL, WNOHANG) == s_launcher) {
            fprintf(stderr, "the launcher exited; see %s\n", out);
            return -1;
        }
    }
    if (!g)
        return -1;
    cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(g, "actors")) if (!strcmp(cJSON_GetObjectItem(a, "name")->valuestring,
                                                                          "tokenizer")) {
        snprintf(s_endpoint, sizeof s_endpoint, "%s",
                 cJSON_GetObjectItem(cJSON_GetObjectItem(a, "endpoints"), "router")->valuestring);
        s_client = zsock_new_dealer(s_endpoint);
    }
    cJSON_Delete(g);
    if (!s_client)
        return -1;
    zsock_set_rcvtimeo(s_client, 20000);
    return 0;
}

static int s_stop(void **unused) {
    zsock_destroy(&s_client);
    kill(s_launcher, SIGTERM);
    int status;
    waitpid(s_launcher, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the launcher stopped with status %d; logs in %s\n", status, s_dir);
        return -1;
    }
    if (getenv("LS_FRONTDOOR_KEEP"))  // keep the run directory (logs) for a look
        return 0;
    return tu_rmrf(s_dir) == 0 ? 0 : -1;
}

static void s_send(ls_msg_t *m) {
    assert_int_equal(tm_send(s_client, m), 0);
    ls_msg_clear(m);
}

static int s_recv(ls_msg_t *m) {
    if (tm_recv(s_client, m) < 0)
        fail_msg("the tokenizer did not answer (logs in %s/logs)", s_dir);
    return m->type;
}

// ---------------------------------------------------------------------------------------------
// requests

typedef struct {
    uint64_t rid;
    char text[2][512];  // per completion index
    int pieces[2];
    uint32_t finish[2], code[2];
    char matched[2][64];
    int finals, last;
} out_t;

static out_t s_outs[MAX_OUTS];
static int s_nouts;

typedef struct {
    const char *text, *adapter, *messages, *stop;
    bool stream, ignore_eos;
    uint32_t n, max_new, timeout_ms;
} gen_t;

static out_t *s_gen(const gen_t *q) {
    out_t *o = &s_outs[s_nouts++];
    memset(o, 0, sizeof *o);
    o->rid = ++s_rid;
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GENERATE_REQ);
    m.rid = o->rid;
    ls_msg_generate_req_t *g = &m.u.generate_req;
    if (q->text)
        g->text = ls_msg_textdup(q->text, strlen(q->text));
    g->adapter = ls_msg_strdup(q->adapter);
    if (q->messages) {
        g->chat = true;
        g->messages = ls_msg_strdup(q->messages);
    }
    g->stream = q->stream;
    g->timeout_ms = q->timeout_ms;
    g->sampling.n = q->n;
    g->sampling.max_new_tokens = q->max_new;
    g->sampling.ignore_eos = q->ignore_eos;
    g->sampling.skip_special_tokens = true;
    if (q->stop) {
        g->sampling.stop.v = calloc(1, sizeof *g->sampling.stop.v);
        g->sampling.stop.v[0] = ls_msg_textdup(q->stop, strlen(q->stop));
        g->sampling.stop.n = 1;
    }
    s_send(&m);
    return o;
}

static out_t *s_find(uint64_t rid) {
    for (int i = 0; i < s_nouts; i++)
        if (s_outs[i].rid == rid)
            return &s_outs[i];
    return NULL;
}

// One message from the tokenizer, filed under its request when it is a TextOut; else returned
// to the caller in *other (when not NULL).
static out_t *s_pump(ls_msg_t *other) {
    ls_msg_t m;
    int type = s_recv(&m);
    out_t *o = s_find(m.rid);
    if (type == LS_MSG_TEXT_OUT && o) {
        const ls_msg_text_out_t *t = &m.u.text_out;
        assert_true(t->index < 2);
        assert_false(o->last);  // nothing after the last
        strncat(o->text[t->index], t->text.s ? t->text.s : "", sizeof o->text[0] - strlen(o->text[t->index]) - 1);
        o->pieces[t->index]++;
        if (t->finish) {
            o->finals++;
            o->finish[t->index] = t->finish;
            o->code[t->index] = t->error_code;
            snprintf(o->matched[t->index], sizeof o->matched[0], "%s", t->matched_stop.s ? t->matched_stop.s : "");
        }
        o->last = t->last;
        ls_msg_clear(&m);
        return o;
    }
    if (other)
        *other = m;
    else {
        fprintf(stderr, "unexpected %s rid %llu\n", ls_msg_type_name(type), (unsigned long long)m.rid);
        ls_msg_clear(&m);
    }
    return NULL;
}

static void s_wait(out_t *o) {
    while (!o->last)
        s_pump(NULL);
}

// Sends an admin message and returns the tokenizer's relayed answer (same rid).
static void s_admin(ls_msg_t *req, ls_msg_t *answer) {
    uint64_t rid = req->rid = ++s_rid;
    s_send(req);
    for (;;) {
        ls_msg_init(answer, LS_MSG_ERROR);
        if (!s_pump(answer) && answer->rid == rid)
            return;
        ls_msg_clear(answer);
    }
}

static uint32_t s_in_flight(const char *name) {
    ls_msg_t m, a;
    ls_msg_init(&m, LS_MSG_LIST_ADAPTERS);
    s_admin(&m, &a);
    assert_int_equal(a.type, LS_MSG_ADAPTER_LIST);
    uint32_t n = UINT32_MAX;
    for (size_t i = 0; i < a.u.adapter_list.adapters.n; i++)
        if (!strcmp(a.u.adapter_list.adapters.v[i].name, name))
            n = a.u.adapter_list.adapters.v[i].in_flight;
    ls_msg_clear(&a);
    return n;
}

// ---------------------------------------------------------------------------------------------

static void test_mixed(void **unused) {
    out_t *outs[2][4][5];
    for (int k = 0; k < 4; k++)
        for (int m = 0; m < 5; m++)
            for (int stream = 0; stream < 2; stream++)
                outs[stream][k][m] = s_gen(&(gen_t){.text = s_prompts[k], .adapter = s_models[m], .stream = stream});
    for (int k = 0; k < 4; k++)
        for (int m = 0; m < 5; m++)
            for (int stream = 0; stream < 2; stream++) {
                out_t *o = outs[stream][k][m];
                s_wait(o);
                if (strcmp(o->text[0], s_expected[m][k]) || o->finish[0] != LS_FINISH_REASON_STOP)
                    fail_msg("prompt %d, adapter \"%s\", stream %d: \"%s\" (finish %u), expected \"%s\"", k,
                             s_models[m], stream, o->text[0], o->finish[0], s_expected[m][k]);
                assert_int_equal(o->finals, 1);
                // streamed: several pieces; not streamed: exactly one TextOut
                if (stream)
                    assert_true(o->pieces[0] > 2);
                else
                    assert_int_equal(o->pieces[0], 1);
            }
    for (int m = 1; m < 5; m++)
        assert_int_equal(s_in_flight(s_models[m]), 0);
}

static void test_chat(void **unused) {
    out_t *outs[2][5];
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 5; m++) {
            cJSON *msgs = cJSON_CreateArray(), *u = cJSON_CreateObject();
            cJSON_AddStringToObject(u, "role", "user");
            cJSON_AddStringToObject(u, "content", s_prompts[k + 5]);
            cJSON_AddItemToArray(msgs, u);
            char *json = cJSON_PrintUnformatted(msgs);
            outs[k][m] = s_gen(&(gen_t){.messages = json, .adapter = s_models[m], .stream = k});
            free(json);
            cJSON_Delete(msgs);
        }
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 5; m++) {
            s_wait(outs[k][m]);
            assert_string_equal(outs[k][m]->text[0], s_expected[m][k + 5]);
            assert_int_equal(outs[k][m]->finish[0], LS_FINISH_REASON_STOP);
        }
}

static void test_refusals(void **unused) {
    char text[4096] = "input:";
    for (int i = 0; i < 300; i++)
        strcat(text, " cup");
    out_t *missing = s_gen(&(gen_t){.text = s_prompts[0], .adapter = "no-such-adapter"});
    out_t *big = s_gen(&(gen_t){.text = text, .adapter = "reverse"});
    out_t *bad = s_gen(&(gen_t){.messages = "[{\"role\": \"user\", \"content\": ", .stream = true});
    out_t *none = s_gen(&(gen_t){.stream = true});
    const struct {
        out_t *o;
        uint32_t code;
    } want[] = {{missing, LS_ERROR_CODE_NOT_FOUND},
                {big, LS_ERROR_CODE_TOO_LARGE},
                {bad, LS_ERROR_CODE_BAD_REQUEST},
                {none, LS_ERROR_CODE_BAD_REQUEST}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        s_wait(want[i].o);
        assert_int_equal(want[i].o->finals, 1);
        assert_int_equal(want[i].o->finish[0], LS_FINISH_REASON_ERROR);
        assert_int_equal(want[i].o->code[0], want[i].code);
    }
    assert_int_equal(s_in_flight("reverse"), 0);
}

static void test_abort(void **unused) {
    out_t *o = s_gen(&(gen_t){.text = s_prompts[1], .adapter = "upper", .stream = true, .ignore_eos = true,
                              .max_new = 200});
    while (o->pieces[0] < 3 && !o->last)
        s_pump(NULL);
    assert_false(o->last);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_ABORT);
    m.rid = o->rid;
    m.u.abort.reason = ls_msg_strdup("changed my mind");
    s_send(&m);
    s_wait(o);
    assert_int_equal(o->finish[0], LS_FINISH_REASON_ABORT);
    assert_int_equal(s_in_flight("upper"), 0);
}

static void test_stop(void **unused) {
    // base model, prompt 0: " 5 leaf road 1 red"
    assert_string_equal(s_expected[0][0], " 5 leaf road 1 red");
    out_t *streamed = s_gen(&(gen_t){.text = s_prompts[0], .stop = "road", .stream = true});
    out_t *whole = s_gen(&(gen_t){.text = s_prompts[0], .stop = "road"});
    s_wait(streamed);
    s_wait(whole);
    for (out_t *o = streamed; o; o = o == streamed ? whole : NULL) {
        assert_string_equal(o->text[0], " 5 leaf ");
        assert_int_equal(o->finish[0], LS_FINISH_REASON_STOP);
        assert_string_equal(o->matched[0], "road");
    }
}

static void test_n2(void **unused) {
    for (int stream = 0; stream < 2; stream++) {
        out_t *o = s_gen(&(gen_t){.text = s_prompts[2], .adapter = "sort", .n = 2, .stream = stream});
        s_wait(o);
        assert_int_equal(o->finals, 2);
        for (int i = 0; i < 2; i++) {
            assert_string_equal(o->text[i], s_expected[3][2]);  // greedy: both the same
            assert_int_equal(o->finish[i], LS_FINISH_REASON_STOP);
        }
    }
    assert_int_equal(s_in_flight("sort"), 0);
}

static void test_timeout(void **unused) {
    out_t *o = s_gen(&(gen_t){.text = s_prompts[3], .adapter = "digits", .ignore_eos = true, .max_new = 200,
                              .timeout_ms = 1});
    s_wait(o);
    assert_int_equal(o->finish[0], LS_FINISH_REASON_ERROR);
    assert_int_equal(o->code[0], LS_ERROR_CODE_TIMEOUT);
    // A timeout while the adapter is still being acquired answers the client at once; the
    // registry's grant, when it comes, goes straight back (tokenizer s_on_acquired), so the
    // count returns to 0 a moment later rather than before the answer.
    uint32_t n = s_in_flight("digits");
    for (int i = 0; i < 500 && n; i++) {
        zclock_sleep(10);
        n = s_in_flight("digits");
    }
    assert_int_equal(n, 0);
}

static void test_admin(void **unused) {
    ls_msg_t m, a;
    ls_msg_init(&m, LS_MSG_LOAD_ADAPTER);
    m.u.load_adapter.name = ls_msg_strdup("reverse-2");
    m.u.load_adapter.path = ls_msg_strdup(LS_DEMO_DIR "/adapters/reverse");
    s_admin(&m, &a);
    assert_int_equal(a.type, LS_MSG_ADAPTER_LOADED);
    if (!a.u.adapter_loaded.ok)
        fail_msg("load: %s", a.u.adapter_loaded.reason);
    ls_msg_clear(&a);
    assert_int_equal(s_in_flight("reverse-2"), 0);
    out_t *o = s_gen(&(gen_t){.text = s_prompts[4], .adapter = "reverse-2"});
    s_wait(o);
    assert_string_equal(o->text[0], s_expected[1][4]);
    ls_msg_init(&m, LS_MSG_UNLOAD_ADAPTER);
    m.u.unload_adapter.name = ls_msg_strdup("reverse-2");
    s_admin(&m, &a);
    assert_int_equal(a.type, LS_MSG_ADAPTER_UNLOADED);
    assert_true(a.u.adapter_unloaded.ok);
    ls_msg_clear(&a);
    assert_int_equal(s_in_flight("reverse-2"), UINT32_MAX);  // gone from the list
    o = s_gen(&(gen_t){.text = s_prompts[4], .adapter = "reverse-2"});
    s_wait(o);
    assert_int_equal(o->code[0], LS_ERROR_CODE_NOT_FOUND);
}

// One client's open requests are bounded (--max-client-requests): the one over is refused
// OVERLOADED at once, while another client is served; once the client's requests end, it is
// served again.
static void test_client_bound(void **unused) {
    out_t *open[MAX_CLIENT_REQUESTS];
    for (int i = 0; i < MAX_CLIENT_REQUESTS; i++)
        open[i] = s_gen(&(gen_t){.text = s_prompts[1], .stream = true, .ignore_eos = true, .max_new = 200});
    out_t *over = s_gen(&(gen_t){.text = s_prompts[0]});
    s_wait(over);
    assert_int_equal(over->finish[0], LS_FINISH_REASON_ERROR);
    assert_int_equal(over->code[0], LS_ERROR_CODE_OVERLOADED);

    zsock_t *other = zsock_new_dealer(s_endpoint);
    assert_non_null(other);
    zsock_set_rcvtimeo(other, 20000);
    ls_msg_t m;
    ls_msg_init(&m, LS_MSG_GENERATE_REQ);
    m.rid = 1;
    m.u.generate_req.text = ls_msg_textdup(s_prompts[0], strlen(s_prompts[0]));
    m.u.generate_req.sampling.skip_special_tokens = true;
    assert_int_equal(tm_send(other, &m), 0);
    ls_msg_clear(&m);
    assert_int_equal(tm_recv(other, &m), 0);
    assert_int_equal(m.type, LS_MSG_TEXT_OUT);
    assert_true(m.u.text_out.last);
    assert_int_equal(m.u.text_out.finish, LS_FINISH_REASON_STOP);
    assert_string_equal(m.u.text_out.text.s, s_expected[0][0]);
    ls_msg_clear(&m);
    zsock_destroy(&other);

    for (int i = 0; i < MAX_CLIENT_REQUESTS; i++) {
        ls_msg_init(&m, LS_MSG_ABORT);
        m.rid = open[i]->rid;
        s_send(&m);
    }
    for (int i = 0; i < MAX_CLIENT_REQUESTS; i++) {
        s_wait(open[i]);
        assert_int_equal(open[i]->finish[0], LS_FINISH_REASON_ABORT);
    }
    out_t *again = s_gen(&(gen_t){.text = s_prompts[0]});
    s_wait(again);
    assert_string_equal(again->text[0], s_expected[0][0]);
}

int main(void) {
    alarm(170);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_mixed),  cmocka_unit_test(test_chat),
        cmocka_unit_test(test_abort),  cmocka_unit_test(test_stop), cmocka_unit_test(test_n2),
        cmocka_unit_test(test_timeout), cmocka_unit_test(test_admin), cmocka_unit_test(test_client_bound),
    };
    return cmocka_run_group_tests(tests, s_start, s_stop);
}
