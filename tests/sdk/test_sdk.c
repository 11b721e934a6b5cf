// SDK and CLI tests against the fake tokenizer (fake_tokenizer.h): no model, no graph.
//   blocking     — text, token ids, logprobs, finish, usage, n > 1, max_tokens
//   encoding     — every request field reaches the wire as the protocol says
//   streaming    — callback and iterator pieces add up to the blocking answer
//   errors       — server refusals map to codes with the server's text; local checks
//   abort        — by id from another thread, by stream, by callback; unknown id
//   timeouts     — server-side timeout, a silent server, an unanswered admin call
//   concurrency  — threads share one client, each gets exactly its own answers
//   admin        — list, load, unload, ping, and their refusals
//   lost         — the server going away fails running calls with LS_ERR_UNAVAILABLE
//   run_dir      — connecting through graph.json
//   cli          — loraserve-cli output and exit codes
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_util.h"

#include "fake_tokenizer.h"
#include "loraserve.h"
#include "run.h"

static char s_dir[64];
static char s_endpoint[128];
static zactor_t *s_fake;
static ls_client_t *s_client;

static int s_setup(void **state) {
    assert_int_equal(tu_tmpdir(s_dir, sizeof s_dir, "sdk"), 0);
    snprintf(s_endpoint, sizeof s_endpoint, "ipc://%s/tokenizer.sock", s_dir);
    s_fake = fake_tokenizer_new(s_endpoint);
    assert_non_null(s_fake);
    const char *err = NULL;
    s_client = ls_client_new(s_endpoint, &err);
    assert_non_null(s_client);
    return 0;
}

static int s_teardown(void **state) {
    ls_client_destroy(&s_client);
    ls_client_destroy(&s_client);  // idempotent
    assert_null(s_client);
    zactor_destroy(&s_fake);
    assert_int_equal(tu_rmrf(s_dir), 0);
    return 0;
}

// Generate prompt (blocking) and return the first completion's text (malloc'd).
static char *s_text(const ls_request_t *req, int expect_rc) {
    ls_result_t *r = NULL;
    int rc = ls_client_generate(s_client, req, &r);
    if (rc != expect_rc)
        fail_msg("generate: got %d (%s: %s), expected %d", rc, ls_strerror(rc), ls_last_error(), expect_rc);
    char *text = r && r->n_completions ? strdup(r->completions[0].text) : NULL;
    ls_result_destroy(&r);
    return text;
}

// ---------------------------------------------------------------------------------------------

static void test_blocking(void **state) {
    ls_request_t req = {.prompt = "hello world", .logprobs = true, .top_logprobs = 2};
    ls_result_t *r = NULL;
    assert_int_equal(ls_client_generate(s_client, &req, &r), LS_OK);
    assert_int_equal(r->n_completions, 1);
    ls_completion_t *c = &r->completions[0];
    assert_string_equal(c->text, "[base] hello world");
    assert_int_equal(c->n_tokens, strlen(c->text));
    for (size_t i = 0; i < c->n_tokens; i++) {
        assert_int_equal(c->token_ids[i], (unsigned char)c->text[i]);
        assert_float_equal(c->logprobs[i], -0.01f * (float)i, 1e-6);
        assert_int_equal(c->top_ids[i * 2 + 1], c->token_ids[i] + 2);
    }
    assert_int_equal(c->n_top, 2);
    assert_int_equal(c->finish, LS_FINISH_STOP);
    assert_string_equal(ls_finish_name(c->finish), "stop");
    assert_int_equal(c->error, LS_OK);
    assert_int_equal(r->prompt_tokens, 11);
    assert_int_equal(r->completion_tokens, strlen(c->text));
    assert_true(r->id > 0);
    ls_result_destroy(&r);
    ls_result_destroy(&r);
    assert_null(r);

    // An adapter, a budget that cuts the answer, and n completions.
    ls_request_t req2 = {.prompt = "abcdefghijkl", .adapter = "reverse", .max_tokens = 14, .n = 3};
    assert_int_equal(ls_client_generate(s_client, &req2, &r), LS_OK);
    assert_int_equal(r->n_completions, 3);
    for (int i = 0; i < 3; i++) {
        assert_string_equal(r->completions[i].text, "[reverse] abcd");
        assert_int_equal(r->completions[i].finish, LS_FINISH_LENGTH);
        assert_null(r->completions[i].logprobs);
    }
    assert_int_equal(r->completion_tokens, 3 * 14);
    ls_result_destroy(&r);
    ls_request_t req3 = {.prompt = "x", .n = 2};
    assert_int_equal(ls_client_generate(s_client, &req3, &r), LS_OK);
    assert_string_equal(r->completions[0].text, "[base] x#0");
    assert_string_equal(r->completions[1].text, "[base] x#1");
    ls_result_destroy(&r);
}

static void test_encoding(void **state) {
    const char *stops[] = {"\n", "END"};
    const int32_t stop_ids[] = {7, 9};
    const int32_t ids[] = {1, 2, 3};
    ls_request_t req = {.input_ids = ids, .n_input_ids = 3, .adapter = "reverse", .max_tokens = 9, .min_tokens = 2,
                        .temperature = 0.5f, .top_p = 0.9f, .top_k = 40, .min_p = 0.05f, .repetition_penalty = 1.1f,
                        .frequency_penalty = 0.2f, .presence_penalty = 0.3f, .has_seed = true, .seed = 0,
                        .stop = stops, .n_stop = 2, .stop_token_ids = stop_ids, .n_stop_token_ids = 2,
                        .ignore_eos = true, .logprobs = true, .top_logprobs = 3, .n = 2,
                        .timeout_ms = 5000};
    free(s_text(&req, LS_OK));
    ls_msg_t m;
    assert_int_equal(fake_tokenizer_last_request(&m), 0);
    ls_msg_generate_req_t *g = &m.u.generate_req;
    ls_msg_sampling_params_t *s = &g->sampling;
    assert_null(g->text.s);
    assert_int_equal(g->input_ids.n, 3);
    assert_int_equal(g->input_ids.v[2], 3);
    assert_string_equal(g->adapter, "reverse");
    assert_int_equal(s->max_new_tokens, 9);
    assert_int_equal(s->min_new_tokens, 2);
    assert_float_equal(s->temperature, 0.5, 1e-6);
    assert_float_equal(s->top_p, 0.9, 1e-6);
    assert_int_equal(s->top_k, 40);
    assert_float_equal(s->min_p, 0.05, 1e-6);
    assert_float_equal(s->repetition_penalty, 1.1, 1e-6);
    assert_float_equal(s->frequency_penalty, 0.2, 1e-6);
    assert_float_equal(s->presence_penalty, 0.3, 1e-6);
    assert_true(s->has_seed);
    assert_int_equal(s->stop.n, 2);
    assert_string_equal(s->stop.v[1].s, "END");
    assert_int_equal(s->stop_token_ids.n, 2);
    assert_int_equal(s->stop_token_ids.v[1], 9);
    assert_true(s->ignore_eos && s->skip_special_tokens && s->logprobs);
    assert_int_equal(s->top_logprobs, 3);
    assert_int_equal(s->n, 2);
    assert_false(g->stream);
    assert_true(g->return_token_ids);
    assert_int_equal(g->timeout_ms, 5000);
    ls_msg_clear(&m);

    // A chat becomes the messages JSON; the fake answers "role:content|…".
    ls_chat_message_t chat[] = {{"system", "be brief"}, {"user", "say \"hi\""}};
    ls_request_t creq = {.messages = chat, .n_messages = 2, .keep_special_tokens = true};
    char *text = s_text(&creq, LS_OK);
    assert_string_equal(text, "[base] system:be brief|user:say \"hi\"");
    free(text);
    assert_int_equal(fake_tokenizer_last_request(&m), 0);
    assert_true(m.u.generate_req.chat);
    assert_false(m.u.generate_req.sampling.skip_special_tokens);
    assert_string_equal(m.u.generate_req.messages,
                        "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"say \\\"hi\\\"\"}]");
    ls_msg_clear(&m);
}

typedef struct {
    char text[512];
    int pieces, finals, abort_after;
} collect_t;

static int s_collect(const ls_piece_t *p, void *arg) {
    collect_t *c = arg;
    strcat(c->text, p->text);
    c->pieces++;
    c->finals += p->finish != LS_FINISH_NONE;
    return c->abort_after && c->pieces >= c->abort_after;
}

static void test_streaming(void **state) {
    ls_request_t req = {.prompt = "the quick brown fox", .adapter = "reverse", .logprobs = true};
    char *blocking = s_text(&req, LS_OK);

    collect_t c = {0};
    ls_result_t *r = NULL;
    assert_int_equal(ls_client_generate_stream(s_client, &req, s_collect, &c, &r), LS_OK);
    assert_string_equal(c.text, blocking);
    assert_true(c.pieces > 3);
    assert_int_equal(c.finals, 1);
    assert_string_equal(r->completions[0].text, blocking);
    assert_int_equal(r->completions[0].n_tokens, strlen(blocking));
    assert_float_equal(r->completions[0].logprobs[5], -0.05, 1e-6);
    ls_result_destroy(&r);
    ls_msg_t m;
    assert_int_equal(fake_tokenizer_last_request(&m), 0);
    assert_true(m.u.generate_req.stream);
    ls_msg_clear(&m);

    // The iterator gives the same pieces, then 0 once, then 0 again.
    ls_stream_t *s;
    assert_int_equal(ls_stream_open(s_client, &req, &s), LS_OK);
    assert_true(ls_stream_id(s) > 0);
    char text[512] = "";
    ls_piece_t p;
    int rc, finish = LS_FINISH_NONE;
    while ((rc = ls_stream_next(s, &p)) == 1) {
        strcat(text, p.text);
        finish = p.finish;
        assert_int_equal(p.n_tokens, strlen(p.text));
    }
    assert_int_equal(rc, 0);
    assert_int_equal(ls_stream_next(s, &p), 0);
    assert_int_equal(finish, LS_FINISH_STOP);
    assert_string_equal(text, blocking);
    ls_stream_destroy(&s);
    ls_stream_destroy(&s);
    assert_null(s);
    free(blocking);

    // n = 2 streamed: pieces of both completions, each ending once.
    ls_request_t req2 = {.prompt = "interleaved answers", .n = 2};
    memset(&c, 0, sizeof c);
    assert_int_equal(ls_client_generate_stream(s_client, &req2, s_collect, &c, &r), LS_OK);
    assert_int_equal(c.finals, 2);
    assert_string_equal(r->completions[1].text, "[base] interleaved answers#1");
    ls_result_destroy(&r);
}

static void s_expect_error(const ls_request_t *req, int code, const char *text) {
    ls_result_t *r = NULL;
    int rc = ls_client_generate(s_client, req, &r);
    assert_int_equal(rc, code);
    if (text && !strstr(ls_last_error(), text))
        fail_msg("error text '%s' lacks '%s'", ls_last_error(), text);
    ls_result_destroy(&r);
    // The iterator reports the same.
    ls_stream_t *s;
    ls_piece_t p;
    if (ls_stream_open(s_client, req, &s) == LS_OK) {
        while ((rc = ls_stream_next(s, &p)) == 1)
            ;
        assert_int_equal(rc, code);
        ls_stream_destroy(&s);
    }
}

static void test_errors(void **state) {
    s_expect_error(&(ls_request_t){.prompt = "hi", .adapter = "missing"}, LS_ERR_NOT_FOUND, "unknown adapter 'missing'");
    s_expect_error(&(ls_request_t){.prompt = "refuse:8"}, LS_ERR_TOO_LARGE, "refused with code 8");
    s_expect_error(&(ls_request_t){.prompt = "refuse:5"}, LS_ERR_UNAVAILABLE, NULL);
    s_expect_error(&(ls_request_t){.prompt = "refuse:7"}, LS_ERR_UNAVAILABLE, NULL);
    s_expect_error(&(ls_request_t){.prompt = "refuse:1"}, LS_ERR_BAD_REQUEST, NULL);
    s_expect_error(&(ls_request_t){.prompt = "refuse:9"}, LS_ERR_INTERNAL, NULL);
    s_expect_error(&(ls_request_t){.prompt = "refuse:0"}, LS_ERR_INTERNAL, NULL);
    s_expect_error(&(ls_request_t){.prompt = "error-msg"}, LS_ERR_PROTOCOL, "does not handle GenerateReq");

    // The refused completion carries its error in the result too.
    ls_result_t *r = NULL;
    assert_int_equal(ls_client_generate(s_client, &(ls_request_t){.prompt = "hi", .adapter = "missing"}, &r),
                     LS_ERR_NOT_FOUND);
    assert_non_null(r);
    assert_int_equal(r->completions[0].finish, LS_FINISH_ERROR);
    assert_int_equal(r->completions[0].error, LS_ERR_NOT_FOUND);
    assert_string_equal(r->completions[0].error_message, "unknown adapter 'missing'");
    ls_result_destroy(&r);

    // Checked before anything is sent.
    const int32_t ids[] = {1};
    s_expect_error(&(ls_request_t){0}, LS_ERR_BAD_REQUEST, "exactly one");
    s_expect_error(&(ls_request_t){.prompt = "a", .input_ids = ids, .n_input_ids = 1}, LS_ERR_BAD_REQUEST, "exactly one");
    s_expect_error(&(ls_request_t){.prompt = "a", .n_stop = 1}, LS_ERR_BAD_REQUEST, "NULL");
    ls_chat_message_t bad[] = {{"user", NULL}};
    s_expect_error(&(ls_request_t){.messages = bad, .n_messages = 1}, LS_ERR_BAD_REQUEST, "role and a content");
    // mixes of adapters (docs/lora-mixing.md): the rules every actor applies, here first
    const char *mix_ads[] = {"reverse", "upper", "reverse"};
    const float mix_ok[] = {0.7f, 0.3f, 1.0f}, mix_zero[] = {0.7f, 0.0f, 1.0f};
    s_expect_error(&(ls_request_t){.prompt = "a", .mix_adapters = mix_ads, .mix_weights = mix_zero, .n_mix = 2},
                   LS_ERR_BAD_REQUEST, "a weight is a number above 0");
    s_expect_error(&(ls_request_t){.prompt = "a", .mix_adapters = mix_ads, .mix_weights = mix_ok, .n_mix = 3},
                   LS_ERR_BAD_REQUEST, "named twice");
    s_expect_error(&(ls_request_t){.prompt = "a", .adapter = "sort", .mix_adapters = mix_ads, .mix_weights = mix_ok,
                                   .n_mix = 2},
                   LS_ERR_BAD_REQUEST, "not both");
    s_expect_error(&(ls_request_t){.prompt = "a", .n_mix = 2}, LS_ERR_BAD_REQUEST, "NULL");
    assert_int_equal(ls_client_generate(s_client, NULL, &r), LS_ERR_BAD_REQUEST);
    assert_null(r);

    const char *err = NULL;
    assert_null(ls_client_new("", &err));
    assert_non_null(strstr(err, "no endpoint"));
    assert_null(ls_client_new("nonsense://x", &err));
    assert_non_null(strstr(err, "cannot connect"));
    assert_string_equal(ls_strerror(LS_ERR_NOT_FOUND), "adapter or request not found");
    assert_string_equal(ls_strerror(12345), "unknown error");
}

typedef struct {
    uint64_t id;
    int rc;
    ls_finish_t finish;
} hang_t;

static void *s_hang(void *arg) {
    hang_t *h = arg;
    ls_result_t *r = NULL;
    h->rc = ls_client_generate(s_client, &(ls_request_t){.prompt = "hang", .id = h->id}, &r);
    h->finish = r && r->n_completions ? r->completions[0].finish : LS_FINISH_NONE;
    ls_result_destroy(&r);
    return NULL;
}

static void test_abort(void **state) {
    // A blocking call aborted by id from another thread.
    hang_t h = {.id = ls_client_request_id(s_client)};
    pthread_t t;
    pthread_create(&t, NULL, s_hang, &h);
    int rc;
    // The abort is NOT_FOUND until the call has registered its id.
    while ((rc = ls_client_abort(s_client, h.id)) == LS_ERR_NOT_FOUND)
        usleep(1000);
    assert_int_equal(rc, LS_OK);
    pthread_join(t, NULL);
    assert_int_equal(h.rc, LS_ERR_ABORTED);
    assert_int_equal(h.finish, LS_FINISH_ABORT);
    assert_int_equal(ls_client_abort(s_client, h.id), LS_ERR_NOT_FOUND);
    assert_int_equal(ls_client_abort(s_client, 999999), LS_ERR_NOT_FOUND);

    // A stream aborted: its final piece says ABORT, then the stream ends with ABORTED.
    ls_stream_t *s;
    assert_int_equal(ls_stream_open(s_client, &(ls_request_t){.prompt = "hang"}, &s), LS_OK);
    assert_int_equal(ls_stream_abort(s), LS_OK);
    ls_piece_t p;
    assert_int_equal(ls_stream_next(s, &p), 1);
    assert_int_equal(p.finish, LS_FINISH_ABORT);
    assert_int_equal(p.error, LS_ERR_ABORTED);
    assert_int_equal(ls_stream_next(s, &p), LS_ERR_ABORTED);
    assert_int_equal(ls_stream_next(s, &p), 0);
    assert_int_equal(ls_stream_abort(s), LS_OK);  // ended: nothing to do
    ls_stream_destroy(&s);

    // A callback that returns nonzero aborts; the partial text is in the result.
    collect_t c = {.abort_after = 2};
    ls_result_t *r = NULL;
    ls_request_t req = {.prompt = "a long answer that the callback stops early"};
    assert_int_equal(ls_client_generate_stream(s_client, &req, s_collect, &c, &r), LS_ERR_ABORTED);
    assert_int_equal(c.pieces, 2);
    assert_int_equal(r->completions[0].finish, LS_FINISH_ABORT);
    assert_true(strlen(r->completions[0].text) < strlen("[base] a long answer that the callback stops early"));
    ls_result_destroy(&r);

    // Destroying an unfinished stream aborts it on the server (the fake then forgets it).
    assert_int_equal(ls_stream_open(s_client, &(ls_request_t){.prompt = "hang"}, &s), LS_OK);
    ls_stream_destroy(&s);
    // A request id already running is refused.
    uint64_t id = ls_client_request_id(s_client);
    ls_stream_t *s2;
    assert_int_equal(ls_stream_open(s_client, &(ls_request_t){.prompt = "hang", .id = id}, &s), LS_OK);
    assert_int_equal(ls_stream_open(s_client, &(ls_request_t){.prompt = "hang", .id = id}, &s2), LS_ERR_BAD_REQUEST);
    ls_stream_destroy(&s);
}

static void test_timeouts(void **state) {
    // The server ends the request at its timeout (finish ERROR, code TIMEOUT).
    ls_result_t *r = NULL;
    int64_t t0 = zclock_mono();
    assert_int_equal(ls_client_generate(s_client, &(ls_request_t){.prompt = "hang", .timeout_ms = 200}, &r),
                     LS_ERR_TIMEOUT);
    assert_true(zclock_mono() - t0 >= 200);
    assert_int_equal(r->completions[0].finish, LS_FINISH_ERROR);
    assert_int_equal(r->completions[0].error, LS_ERR_TIMEOUT);
    ls_result_destroy(&r);

    // A server that never answers: the client gives up after the timeout and a grace.
    t0 = zclock_mono();
    assert_int_equal(ls_client_generate(s_client, &(ls_request_t){.prompt = "silent", .timeout_ms = 100}, &r),
                     LS_ERR_TIMEOUT);
    int64_t took = zclock_mono() - t0;
    assert_true(took >= 100 && took < 5000);
    assert_non_null(strstr(ls_last_error(), "within 100 ms"));
    ls_result_destroy(&r);

    // Admin calls wait for the client's timeout.
    ls_client_set_timeout(s_client, 200);
    assert_int_equal(ls_client_adapter_load(s_client, "slow", "/x", false, NULL), LS_ERR_TIMEOUT);
    assert_non_null(strstr(ls_last_error(), "LoadAdapter: no answer"));
    ls_client_set_timeout(s_client, 60000);
}

#define N_THREADS 8
#define N_REQS 25

typedef struct {
    int thread;
    int bad;
} worker_t;

static void *s_worker(void *arg) {
    worker_t *w = arg;
    for (int j = 0; j < N_REQS; j++) {
        char prompt[64], want[128];
        snprintf(prompt, sizeof prompt, "thread %d request %d", w->thread, j);
        const char *adapter = j % 3 ? "reverse" : NULL;
        snprintf(want, sizeof want, "[%s] %s", adapter ? adapter : "base", prompt);
        ls_request_t req = {.prompt = prompt, .adapter = adapter};
        ls_result_t *r = NULL;
        int rc;
        if (j % 2) {
            collect_t c = {0};
            rc = ls_client_generate_stream(s_client, &req, s_collect, &c, &r);
            w->bad += strcmp(c.text, want) != 0;
        } else
            rc = ls_client_generate(s_client, &req, &r);
        w->bad += rc != LS_OK || strcmp(r->completions[0].text, want) != 0;
        ls_result_destroy(&r);
    }
    return NULL;
}

static void test_concurrency(void **state) {
    pthread_t t[N_THREADS];
    worker_t w[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        w[i] = (worker_t){.thread = i};
        pthread_create(&t[i], NULL, s_worker, &w[i]);
    }
    int bad = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(t[i], NULL);
        bad += w[i].bad;
    }
    assert_int_equal(bad, 0);
}

static void test_admin(void **state) {
    ls_adapter_list_t *list;
    assert_int_equal(ls_client_adapter_list(s_client, &list), LS_OK);
    assert_int_equal(list->n_adapters, 1);
    assert_string_equal(list->adapters[0].name, "reverse");
    assert_string_equal(list->adapters[0].path, "/adapters/reverse");
    assert_int_equal(list->adapters[0].status, LS_ADAPTER_READY);
    assert_string_equal(ls_adapter_status_name(list->adapters[0].status), "ready");
    ls_adapter_list_destroy(&list);
    ls_adapter_list_destroy(&list);

    uint32_t rank = 0;
    assert_int_equal(ls_client_adapter_load(s_client, "mine", "/some/dir", true, &rank), LS_OK);
    assert_int_equal(rank, 8);
    assert_int_equal(ls_client_adapter_load(s_client, "bad", "/some/dir", false, NULL), LS_ERR_BAD_REQUEST);
    assert_non_null(strstr(ls_last_error(), "rank 128 above max_lora_rank 64"));
    assert_int_equal(ls_client_adapter_load(s_client, "", "/x", false, NULL), LS_ERR_BAD_REQUEST);
    assert_int_equal(ls_client_adapter_list(s_client, &list), LS_OK);
    assert_int_equal(list->n_adapters, 2);
    assert_string_equal(list->adapters[1].name, "mine");
    ls_adapter_list_destroy(&list);
    assert_int_equal(ls_client_adapter_unload(s_client, "mine"), LS_OK);
    assert_int_equal(ls_client_adapter_unload(s_client, "mine"), LS_ERR_NOT_FOUND);
    assert_non_null(strstr(ls_last_error(), "no adapter by that name"));

    ls_health_t h;
    assert_int_equal(ls_client_ping(s_client, &h), LS_OK);
    assert_string_equal(h.actor, "fake-tokenizer");
    assert_int_equal(h.uptime_ms, 1234);
    assert_int_equal(ls_client_ping(s_client, NULL), LS_OK);
    assert_string_equal(ls_client_endpoint(s_client), s_endpoint);
}

static void *s_hang_on(void *arg) {
    ls_client_t *client = arg;
    static int rc;
    rc = ls_client_generate(client, &(ls_request_t){.prompt = "hang"}, NULL);
    return &rc;
}

static void test_lost(void **state) {
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/lost.sock", s_dir);
    zactor_t *fake = fake_tokenizer_new(ep);
    ls_client_t *client = ls_client_new(ep, NULL);
    assert_int_equal(ls_client_ping(client, NULL), LS_OK);  // connected
    pthread_t t;
    pthread_create(&t, NULL, s_hang_on, client);
    usleep(200000);
    zactor_destroy(&fake);  // the server goes away mid-request
    void *rc;
    pthread_join(t, &rc);
    assert_int_equal(*(int *)rc, LS_ERR_UNAVAILABLE);
    ls_client_destroy(&client);

    // No server at all: a ping times out.
    client = ls_client_new(ep, NULL);
    ls_client_set_timeout(client, 100);
    assert_int_equal(ls_client_ping(client, NULL), LS_ERR_TIMEOUT);
    ls_client_destroy(&client);
}

static void s_write_graph(const char *dir, const char *endpoint) {
    char path[256];
    snprintf(path, sizeof path, "%s/graph.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"run_dir\":\"%s\",\"actors\":[{\"name\":\"registry\",\"kind\":\"registry\",\"endpoints\":{\"router\":"
            "\"ipc:///nowhere\"}},{\"name\":\"tokenizer\",\"kind\":\"tokenizer\",\"endpoints\":{\"router\":\"%s\"}}]}",
            dir, endpoint);
    fclose(f);
}

static void test_run_dir(void **state) {
    s_write_graph(s_dir, s_endpoint);
    const char *err = NULL;
    ls_client_t *client = ls_client_new_run_dir(s_dir, &err);
    assert_non_null(client);
    assert_string_equal(ls_client_endpoint(client), s_endpoint);
    assert_int_equal(ls_client_ping(client, NULL), LS_OK);
    ls_client_destroy(&client);
    assert_null(ls_client_new_run_dir("/nonexistent-run-dir", &err));
    assert_non_null(strstr(err, "/nonexistent-run-dir/graph.json"));
}

// ---------------------------------------------------------------------------------------------
// the CLI

// Run loraserve-cli with args (NULL-terminated), stdin from input (may be NULL).
static run_t s_cli(const char *input, const char *env_run_dir, ...) {
    const char *argv[32] = {LS_CLI};
    int n = 1;
    va_list ap;
    va_start(ap, env_run_dir);
    for (const char *a; (a = va_arg(ap, const char *));)
        argv[n++] = a;
    va_end(ap);
    run_t r;
    run_program(&r, s_dir, input, env_run_dir, argv);
    return r;
}

static void test_cli(void **state) {
    const char *E = "--endpoint";
    run_t r = s_cli(NULL, NULL, E, s_endpoint, "generate", "hello", NULL);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "[base] hello\n");
    r = s_cli(NULL, NULL, E, s_endpoint, "generate", "--adapter", "reverse", "--stream", "--usage", "hello", NULL);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "[reverse] hello\n");
    assert_non_null(strstr(r.err, "finish=stop prompt_tokens=5 completion_tokens=15"));
    r = s_cli("from stdin", NULL, E, s_endpoint, "generate", "--max-tokens", "10", "--temperature", "0.7", NULL);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "[base] fro\n");
    r = s_cli(NULL, NULL, E, s_endpoint, "generate", "--chat", "--system", "sys", "hi there", NULL);
    assert_string_equal(r.out, "[base] system:sys|user:hi there\n");

    // Exit codes per error class.
    r = s_cli(NULL, NULL, E, s_endpoint, "generate", "--adapter", "missing", "hello", NULL);
    assert_int_equal(r.code, 3);
    assert_non_null(strstr(r.err, "unknown adapter 'missing'"));
    assert_int_equal(s_cli(NULL, NULL, E, s_endpoint, "generate", "refuse:8", NULL).code, 4);
    assert_int_equal(s_cli(NULL, NULL, E, s_endpoint, "generate", "refuse:5", NULL).code, 5);
    assert_int_equal(s_cli(NULL, NULL, E, s_endpoint, "generate", "--timeout-ms", "100", "hang", NULL).code, 6);
    assert_int_equal(s_cli(NULL, NULL, E, s_endpoint, "generate", "refuse:9", NULL).code, 8);
    assert_int_equal(s_cli(NULL, NULL, E, s_endpoint, "frobnicate", NULL).code, 2);
    assert_int_equal(s_cli(NULL, NULL, "generate", "x", NULL).code, 2);  // no server named
    assert_int_equal(s_cli(NULL, NULL, E, s_endpoint, "--max-tokens", "many", "generate", "x", NULL).code, 2);
    assert_int_equal(s_cli(NULL, NULL, "--run-dir", "/nonexistent", "list", NULL).code, 5);
    r = s_cli(NULL, NULL, "--help", NULL);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "exit codes"));

    // Admin commands, the server found through LORASERVE_RUN_DIR.
    s_write_graph(s_dir, s_endpoint);
    r = s_cli(NULL, s_dir, "load", "cli-adapter", "/p/cli", "--pinned", NULL);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "loaded cli-adapter (rank 8)\n");
    r = s_cli(NULL, s_dir, "list", NULL);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "NAME"));
    assert_non_null(strstr(r.out, "cli-adapter"));
    assert_non_null(strstr(r.out, "ready"));
    assert_int_equal(s_cli(NULL, s_dir, "load", "bad", "/p/bad", NULL).code, 4);
    r = s_cli(NULL, s_dir, "unload", "cli-adapter", NULL);
    assert_int_equal(r.code, 0);
    assert_string_equal(r.out, "unloaded cli-adapter\n");
    assert_int_equal(s_cli(NULL, s_dir, "unload", "cli-adapter", NULL).code, 3);
    r = s_cli(NULL, s_dir, "health", NULL);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "ok: fake-tokenizer"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_blocking),  cmocka_unit_test(test_encoding), cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_errors),    cmocka_unit_test(test_abort),    cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_concurrency), cmocka_unit_test(test_admin),  cmocka_unit_test(test_lost),
        cmocka_unit_test(test_run_dir),   cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
