// SDK end to end: the real graph (launch/loraserve on the demo model with its adapters
// reverse, upper, sort, digits), driven by the examples in examples/sdk/, the SDK itself and
// loraserve-cli, as a user would.
//   examples  — each example prints the demo's rule answers for base and every adapter
//   stream    — a streaming generate's pieces add up to the blocking answer (text and ids)
//   nul_prompt — a prompt with a NUL inside (prompt_len) is tokenized whole, as over HTTP
//   cli       — generate, list, unload (then the adapter is unknown), load back, health
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <cJSON.h>

#include "test_util.h"

#include "loraserve.h"
#include "run.h"

#define PROMPT "input: 5 leaf road 1 red\noutput:"

static const char *s_models[] = {"base", "reverse", "upper", "sort", "digits"};
static const char *s_answers[] = {" 5 leaf road 1 red", " red 1 road leaf 5", " 5 LEAF ROAD 1 RED", " 1 5 leaf red road",
                                  " five leaf road one red"};

static char s_dir[64], s_run_dir[128];
static pid_t s_launcher;

static int s_setup(void **state) {
    assert_int_equal(tu_tmpdir(s_dir, sizeof s_dir, "sdk-graph"), 0);
    snprintf(s_run_dir, sizeof s_run_dir, "%s/run", s_dir);
    char log[160];
    snprintf(log, sizeof log, "%s/launcher.out", s_dir);
    // --lora-roots: clients may load adapters from the demo's folder (load by path).
    // --port 0: tests run in parallel, each graph's gateway takes any free port
    const char *args[] = {"--lora-roots", LS_DEMO_DIR "/adapters", "--port", "0", NULL};
    s_launcher = tu_graph_start(LS_LAUNCH_SCRIPT, LS_BIN_DIR, s_run_dir, log, args, 120);
    assert_true(s_launcher > 0);
    return 0;
}

static int s_teardown(void **state) {
    assert_int_equal(tu_graph_stop(s_launcher), 0);
    assert_int_equal(tu_rmrf(s_dir), 0);
    return 0;
}

static run_t s_run(const char *input, const char *first, ...) {
    const char *argv[32] = {first};
    int n = 1;
    va_list ap;
    va_start(ap, first);
    for (const char *a; (a = va_arg(ap, const char *));)
        argv[n++] = a;
    va_end(ap);
    run_t r;
    run_program(&r, s_dir, input, NULL, argv);
    return r;
}

// text is the answer, followed by end (the newline a program prints after it, or "").
static void s_expect_answer(const char *what, const char *text, const char *answer, const char *end) {
    char want[128];
    snprintf(want, sizeof want, "%s%s", answer, end);
    if (strcmp(text, want) != 0)
        fail_msg("%s: got '%s', expected '%s'", what, text, want);
}

static void test_examples(void **state) {
    for (int m = 0; m < 5; m++) {
        run_t g = s_run(NULL, LS_BIN_DIR "/sdk-example-generate", s_run_dir, s_models[m], NULL);
        if (g.code != 0)
            fail_msg("generate %s: exit %d: %s", s_models[m], g.code, g.err);
        s_expect_answer(s_models[m], g.out, s_answers[m], "\n");
        run_t s = s_run(NULL, LS_BIN_DIR "/sdk-example-stream", s_run_dir, s_models[m], NULL);
        assert_int_equal(s.code, 0);
        assert_string_equal(s.out, g.out);
    }
    run_t t = s_run(NULL, LS_BIN_DIR "/sdk-example-threads", s_run_dir, NULL);
    if (t.code != 0)
        fail_msg("threads: exit %d: %s %s", t.code, t.out, t.err);
    for (int m = 0; m < 5; m++) {
        char want[64];
        snprintf(want, sizeof want, "%s:%s\n", s_models[m], s_answers[m]);
        if (!strstr(t.out, want))
            fail_msg("threads: no '%s' in:\n%s", want, t.out);
    }
    run_t a = s_run(NULL, LS_BIN_DIR "/sdk-example-admin", s_run_dir, "digits", LS_DEMO_DIR "/adapters/digits", NULL);
    if (a.code != 0)
        fail_msg("admin: exit %d: %s %s", a.code, a.out, a.err);
    assert_non_null(strstr(a.out, "unload digits: ok"));
    assert_non_null(strstr(a.out, "generate with digits: not found"));
    assert_non_null(strstr(a.out, "load digits: ok"));
    assert_non_null(strstr(a.out, "digits: five leaf road one red\n"));
}

static void test_stream(void **state) {
    const char *err;
    ls_client_t *client = ls_client_new_run_dir(s_run_dir, &err);
    assert_non_null(client);
    ls_health_t h;
    assert_int_equal(ls_client_ping(client, &h), LS_OK);
    assert_string_equal(h.actor, "tokenizer");
    for (int m = 0; m < 5; m++) {
        ls_request_t req = {.prompt = PROMPT, .adapter = m ? s_models[m] : NULL, .max_tokens = 32, .logprobs = true,
                           .timeout_ms = 20000};
        ls_result_t *blocking = NULL, *streamed = NULL;
        assert_int_equal(ls_client_generate(client, &req, &blocking), LS_OK);
        s_expect_answer(s_models[m], blocking->completions[0].text, s_answers[m], "");
        assert_int_equal(ls_client_generate_stream(client, &req, NULL, NULL, &streamed), LS_OK);
        ls_completion_t *b = &blocking->completions[0], *s = &streamed->completions[0];
        assert_string_equal(s->text, b->text);
        assert_int_equal(s->n_tokens, b->n_tokens);
        assert_memory_equal(s->token_ids, b->token_ids, b->n_tokens * sizeof(int32_t));
        assert_int_equal(s->finish, b->finish);
        assert_int_equal(streamed->prompt_tokens, blocking->prompt_tokens);
        assert_true(blocking->prompt_tokens > 0);
        assert_int_equal(blocking->completion_tokens, b->n_tokens);
        assert_non_null(b->logprobs);
        ls_result_destroy(&blocking);
        ls_result_destroy(&streamed);
    }
    // An unknown adapter is refused with NOT_FOUND.
    ls_result_t *r = NULL;
    assert_int_equal(ls_client_generate(client, &(ls_request_t){.prompt = PROMPT, .adapter = "nope", .timeout_ms = 20000}, &r),
                     LS_ERR_NOT_FOUND);
    ls_result_destroy(&r);
    ls_client_destroy(&client);
}

// The gateway's answer to one POST (Connection: close), its body parsed; NULL if it is not JSON.
static cJSON *s_http_post(const char *path, const char *body) {
    int port = tu_gateway_port(s_run_dir);
    assert_true(port > 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    char req[1024];
    int n = snprintf(req, sizeof req, "POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
                     path, strlen(body), body);
    assert_int_equal(write(fd, req, (size_t)n), n);
    static char resp[65536];
    size_t have = 0;
    for (ssize_t got; have < sizeof resp - 1 && (got = read(fd, resp + have, sizeof resp - 1 - have)) > 0;)
        have += (size_t)got;
    close(fd);
    resp[have] = 0;
    const char *json = strstr(resp, "\r\n\r\n");
    assert_non_null(json);
    return cJSON_Parse(json + 4);
}

// A prompt is bytes with a length: with a NUL inside, the SDK's prompt (prompt_len) is tokenized
// whole and exactly as the same text over HTTP (\u0000 in its JSON): the same prompt length and
// the same greedy tokens, where the text cut at the NUL is shorter.
static void test_nul_prompt(void **state) {
    static const char text[] = "input: 5 leaf\0 road 1 red\noutput:";
    const char *err;
    ls_client_t *client = ls_client_new_run_dir(s_run_dir, &err);
    assert_non_null(client);
    ls_request_t req = {.prompt = text, .prompt_len = sizeof text - 1, .max_tokens = 8, .timeout_ms = 20000};
    ls_result_t *whole = NULL, *cut = NULL;
    assert_int_equal(ls_client_generate(client, &req, &whole), LS_OK);
    req.prompt_len = 0;  // up to the first NUL
    assert_int_equal(ls_client_generate(client, &req, &cut), LS_OK);
    assert_true(whole->prompt_tokens > cut->prompt_tokens);

    cJSON *j = s_http_post("/generate", "{\"text\":\"input: 5 leaf\\u0000 road 1 red\\noutput:\","
                                        "\"sampling_params\":{\"max_new_tokens\":8,\"temperature\":0}}");
    assert_non_null(j);
    cJSON *meta = cJSON_GetObjectItem(j, "meta_info"), *ids = cJSON_GetObjectItem(j, "output_ids");
    assert_non_null(meta);
    assert_int_equal((int)cJSON_GetObjectItem(meta, "prompt_tokens")->valuedouble, (int)whole->prompt_tokens);
    const ls_completion_t *c = &whole->completions[0];
    assert_int_equal(cJSON_GetArraySize(ids), (int)c->n_tokens);
    for (size_t i = 0; i < c->n_tokens; i++)
        assert_int_equal(cJSON_GetArrayItem(ids, (int)i)->valueint, c->token_ids[i]);
    cJSON_Delete(j);
    ls_result_destroy(&whole);
    ls_result_destroy(&cut);
    ls_client_destroy(&client);
}

static void test_cli(void **state) {
    const char *cli = LS_BIN_DIR "/loraserve-cli";
    run_t r = s_run(PROMPT, cli, "--run-dir", s_run_dir, "--timeout-ms", "20000", "generate", "--adapter", "upper", NULL);
    assert_int_equal(r.code, 0);
    s_expect_answer("cli upper", r.out, s_answers[2], "\n");
    r = s_run(NULL, cli, "--run-dir", s_run_dir, "--timeout-ms", "20000", "generate", "--stream", "--adapter", "reverse", PROMPT, NULL);
    assert_int_equal(r.code, 0);
    s_expect_answer("cli stream reverse", r.out, s_answers[1], "\n");
    r = s_run(NULL, cli, "--run-dir", s_run_dir, "list", NULL);
    assert_int_equal(r.code, 0);
    for (int m = 1; m < 5; m++)
        assert_non_null(strstr(r.out, s_models[m]));
    assert_int_equal(s_run(NULL, cli, "--run-dir", s_run_dir, "unload", "sort", NULL).code, 0);
    assert_int_equal(s_run(NULL, cli, "--run-dir", s_run_dir, "--timeout-ms", "20000", "generate", "--adapter", "sort", PROMPT, NULL).code, 3);
    r = s_run(NULL, cli, "--run-dir", s_run_dir, "load", "sort", LS_DEMO_DIR "/adapters/sort", NULL);
    if (r.code != 0)
        fail_msg("cli load: exit %d: %s", r.code, r.err);
    r = s_run(NULL, cli, "--run-dir", s_run_dir, "--timeout-ms", "20000", "generate", "--adapter", "sort", PROMPT, NULL);
    assert_int_equal(r.code, 0);
    s_expect_answer("cli sort after reload", r.out, s_answers[3], "\n");
    r = s_run(NULL, cli, "--run-dir", s_run_dir, "health", NULL);
    assert_int_equal(r.code, 0);
    assert_non_null(strstr(r.out, "ok: tokenizer"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_examples), cmocka_unit_test(test_stream),
                                       cmocka_unit_test(test_nul_prompt), cmocka_unit_test(test_cli)};
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
