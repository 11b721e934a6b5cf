// Gateway tests at the HTTP level: the real loraserve-gateway process against fake_graph (a
// tokenizer and a scheduler without a model), driven by raw HTTP over TCP.
//   completions, chat, generate  — JSON shapes, SSE framing and [DONE], what reaches the tokenizer
//   errors_upstream              — unknown adapter 404, prompt too long 400, queues full 429,
//                                  the graph unable now 503 (both with Retry-After);
//                                  answers with rid 0 dropped
//   unsupported                  — each known but unimplemented field (ebnf, structural_tag, a bad
//                                  response_format, logit_bias, tool_choice, suffix, best_of, …) 400 naming it;
//                                  no-op values, harmless and unknown fields served
//   models, adapters             — /v1/models, load/unload under vLLM's and SGLang's names
//   model_info                   — /get_model_info from the model's config.json
//   health, metrics              — ping relay, Prometheus text that parses (tests/common/test_prom),
//                                  other actors' counters typed; the tokenizer's histograms (the
//                                  base under its served name, a series given twice shown once,
//                                  a malformed one left out); the inference gateway's vllm:*
//                                  series (escaped, capped lists)
//   api_key                      — 401 without the key, /health and /health/live open; the key
//                                  from --api-key, --api-key-file or LORASERVE_API_KEY, the
//                                  last two never on the command line; two at once refused
//   malformed                    — bad request line, headers 431, body 413, bad chunked, bad JSON,
//                                  wrong types, unknown paths: 4xx, and the gateway keeps serving
//   pipelining, concurrency      — answers in order on one connection; many connections at once
//   slow_clients                 — with --max-connections 4, half-sent requests are answered 408
//                                  and new clients are served again
//   disconnect                   — a client that leaves mid-stream makes the gateway send Abort
//   admission                    — fan-out over the request cap 400; over the tenant's share 429
//                                  with Retry-After while other tenants are served
//   shutdown_admin               — a load in flight when the gateway stops: 503 outcome_unknown,
//                                  not a failure the registry may contradict
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <http_parser.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_prom.h"
#include "test_util.h"

#include "fake_graph.h"

static char s_dir[64];
static zactor_t *s_fake;
static char s_tok_ep[128], s_sched_ep[128];

typedef struct {
    pid_t pid;
    int port;
} gw_t;

static gw_t s_gw;  // the default gateway

static double s_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

// Start a gateway with extra flags; its port is read from its log.
static gw_t s_start(const char *tag, const char *const *extra) {
    char log[128], tok[160], sched[160], name[64];
    snprintf(log, sizeof log, "%s/%s.log", s_dir, tag);
    snprintf(name, sizeof name, "--name=%s", tag);  // its identity at the tokenizer: one per gateway
    snprintf(tok, sizeof tok, "--peer=tokenizer=%s", s_tok_ep);
    snprintf(sched, sizeof sched, "--peer=scheduler=%s", s_sched_ep);
    gw_t g = {0};
    g.pid = fork();
    if (g.pid == 0) {
        tu_child_dies_with_parent();
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        const char *argv[32] = {LS_BIN_DIR "/loraserve-gateway", name, tok, sched, "--port=0",
                                "--served-model-name=demo", "--heartbeat-ms=0"};
        int n = 7;
        for (int i = 0; extra && extra[i]; i++)
            argv[n++] = extra[i];
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    for (double t0 = s_now(); s_now() - t0 < 10 && !g.port; usleep(20000)) {
        char *text = tu_read_file(log, NULL);
        g.port = tu_listen_port(text);
        free(text);
    }
    if (!g.port)
        fail_msg("the gateway did not start; see %s", log);
    return g;
}

static void s_stop(gw_t *g) {
    int status;
    kill(g->pid, SIGTERM);
    waitpid(g->pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// ---------------------------------------------------------------------------------------------
// a small HTTP client

typedef struct {
    int status;
    char content_type[128];
    char *body;  // decoded (chunked framing removed)
    size_t len;
    int complete;
    char retry_after[16];  // the Retry-After header
    char field[64];
    int in_ct, in_retry;
} resp_t;

static int s_on_status(http_parser *p, const char *at, size_t len) {
    ((resp_t *)p->data)->status = p->status_code;
    return 0;
}
static int s_on_field(http_parser *p, const char *at, size_t len) {
    resp_t *r = p->data;
    r->in_ct = len == 12 && !strncasecmp(at, "Content-Type", 12);
    r->in_retry = len == 11 && !strncasecmp(at, "Retry-After", 11);
    return 0;
}
static int s_on_value(http_parser *p, const char *at, size_t len) {
    resp_t *r = p->data;
    if (r->in_ct)
        snprintf(r->content_type, sizeof r->content_type, "%.*s", (int)len, at);
    if (r->in_retry)
        snprintf(r->retry_after, sizeof r->retry_after, "%.*s", (int)len, at);
    return 0;
}
static int s_on_body(http_parser *p, const char *at, size_t len) {
    resp_t *r = p->data;
    r->body = realloc(r->body, r->len + len + 1);
    memcpy(r->body + r->len, at, len);
    r->len += len;
    r->body[r->len] = 0;
    return 0;
}
static int s_on_complete(http_parser *p) {
    resp_t *r = p->data;
    r->status = p->status_code;
    r->complete = 1;
    http_parser_pause(p, 1);
    return 0;
}
static const http_parser_settings s_settings = {.on_status = s_on_status, .on_header_field = s_on_field,
                                                .on_header_value = s_on_value, .on_body = s_on_body,
                                                .on_message_complete = s_on_complete};

static int s_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static void s_write(int fd, const char *data, size_t len) {
    while (len) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;  // the gateway may close early (a 413 before the body)
        data += n;
        len -= (size_t)n;
    }
}

// A connection with a parser, for reading several answers in turn.
typedef struct {
    int fd;
    http_parser p;
    char buf[1 << 16];
    size_t have, off;
} conn_t;

static void s_conn_open(conn_t *c, int port) {
    c->fd = s_connect(port);
    http_parser_init(&c->p, HTTP_RESPONSE);
    c->have = c->off = 0;
}

// Read one answer; status 0 when the connection closed first (or 10 s passed).
static void s_read(conn_t *c, resp_t *r) {
    memset(r, 0, sizeof *r);
    c->p.data = r;
    http_parser_pause(&c->p, 0);
    for (double t0 = s_now(); !r->complete && s_now() - t0 < 10;) {
        if (c->off == c->have) {
            struct pollfd pfd = {c->fd, POLLIN, 0};
            if (poll(&pfd, 1, 10000) <= 0)
                break;
            ssize_t n = recv(c->fd, c->buf, sizeof c->buf, 0);
            if (n <= 0) {
                http_parser_execute(&c->p, &s_settings, NULL, 0);  // a body ended by close
                break;
            }
            c->have = (size_t)n;
            c->off = 0;
        }
        c->off += http_parser_execute(&c->p, &s_settings, c->buf + c->off, c->have - c->off);
        if (HTTP_PARSER_ERRNO(&c->p) != HPE_OK && HTTP_PARSER_ERRNO(&c->p) != HPE_PAUSED)
            break;
    }
    if (!r->complete)
        r->status = 0;
}

static void s_resp_free(resp_t *r) { free(r->body); }

// One raw request on a fresh connection.
static void s_raw(int port, const char *raw, size_t len, resp_t *r) {
    conn_t c;
    s_conn_open(&c, port);
    s_write(c.fd, raw, len);
    s_read(&c, r);
    close(c.fd);
}

static void s_call(int port, const char *method, const char *path, const char *json, const char *extra, resp_t *r) {
    char *raw;
    int n = asprintf(&raw, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, path, extra ? extra : "", json ? strlen(json) : 0, json ? json : "");
    assert_true(n > 0);
    s_raw(port, raw, (size_t)n, r);
    free(raw);
}

static cJSON *s_post(const char *path, const char *json, int want) {
    resp_t r;
    s_call(s_gw.port, "POST", path, json, NULL, &r);
    if (r.status != want)
        fail_msg("POST %s %s: status %d, want %d: %s", path, json, r.status, want, r.body ? r.body : "");
    cJSON *j = cJSON_Parse(r.body);
    if (!j)
        fail_msg("POST %s: not JSON: %s", path, r.body ? r.body : "");
    s_resp_free(&r);
    return j;
}

// Dotted path into JSON: "choices.0.text".
static cJSON *s_at(cJSON *j, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *save, *part = strtok_r(buf, ".", &save); part && j; part = strtok_r(NULL, ".", &save))
        j = cJSON_IsArray(j) ? cJSON_GetArrayItem(j, atoi(part)) : cJSON_GetObjectItem(j, part);
    return j;
}

static const char *s_str(cJSON *j, const char *path) {
    cJSON *v = s_at(j, path);
    if (!cJSON_IsString(v))
        fail_msg("%s is not a string in %s", path, cJSON_PrintUnformatted(j));
    return v->valuestring;
}

static double s_num(cJSON *j, const char *path) {
    cJSON *v = s_at(j, path);
    if (!cJSON_IsNumber(v))
        fail_msg("%s is not a number in %s", path, cJSON_PrintUnformatted(j));
    return v->valuedouble;
}

// The SSE events of a stream body: each "data: ..." payload, in order.
static int s_events(const char *body, char ev[][2048], int cap) {
    int n = 0;
    const char *p = body;
    while (p && *p && n < cap) {
        const char *end = strstr(p, "\n\n");
        if (!end)
            fail_msg("SSE event not ended by a blank line: %s", p);
        if (strncmp(p, "data: ", 6))
            fail_msg("SSE line without 'data: ': %.*s", (int)(end - p), p);
        snprintf(ev[n++], 2048, "%.*s", (int)(end - p - 6), p + 6);
        p = end + 2;
    }
    return n;
}

static void s_last_req(ls_msg_t *m) { assert_int_equal(fake_graph_last_request(m), 0); }

// ---------------------------------------------------------------------------------------------
// tests

static void test_completions(void **state) {
    cJSON *j = s_post("/v1/completions", "{\"model\":\"demo\",\"prompt\":\"hello\",\"max_tokens\":5,\"temperature\":0}", 200);
    assert_string_equal(s_str(j, "object"), "text_completion");
    assert_string_equal(s_str(j, "model"), "demo");
    assert_true(!strncmp(s_str(j, "id"), "cmpl-", 5));
    assert_true(s_num(j, "created") > 1.6e9);
    assert_string_equal(s_str(j, "choices.0.text"), " base ok");
    assert_string_equal(s_str(j, "choices.0.finish_reason"), "stop");
    assert_int_equal((int)s_num(j, "choices.0.index"), 0);
    assert_true(cJSON_IsNull(s_at(j, "choices.0.logprobs")));
    assert_int_equal((int)s_num(j, "usage.prompt_tokens"), 5);
    assert_int_equal((int)s_num(j, "usage.completion_tokens"), 2);
    assert_int_equal((int)s_num(j, "usage.total_tokens"), 7);
    cJSON_Delete(j);
    ls_msg_t m;
    s_last_req(&m);
    assert_string_equal(m.u.generate_req.text.s, "hello");
    assert_true(!m.u.generate_req.adapter || !*m.u.generate_req.adapter);
    assert_int_equal(m.u.generate_req.sampling.max_new_tokens, 5);
    assert_true(m.u.generate_req.sampling.temperature == 0);
    ls_msg_clear(&m);

    // Every sampling parameter reaches the tokenizer; n, length and logprobs shape the answer.
    j = s_post("/v1/completions",
               "{\"model\":\"demo:reverse\",\"prompt\":[\"a\",\"bc\"],\"max_tokens\":1,\"n\":2,\"top_p\":0.5,"
               "\"stop\":[\"x\",\"y\"],\"seed\":7,\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"top_k\":3,"
               "\"min_p\":0.1,\"repetition_penalty\":1.2,\"ignore_eos\":true,\"min_tokens\":1,\"logprobs\":2}",
               200);
    assert_int_equal(cJSON_GetArraySize(s_at(j, "choices")), 4);
    for (int i = 0; i < 4; i++) {
        char path[64];
        snprintf(path, sizeof path, "choices.%d.index", i);
        assert_int_equal((int)s_num(j, path), i);
        snprintf(path, sizeof path, "choices.%d.text", i);
        assert_string_equal(s_str(j, path), " reverse");
        snprintf(path, sizeof path, "choices.%d.finish_reason", i);
        assert_string_equal(s_str(j, path), "length");
    }
    // Tokens are named by the detokenizer's texts ("tN" in the fake graph), by id without them.
    assert_string_equal(s_str(j, "choices.0.logprobs.tokens.0"), "t100");
    assert_true(s_num(j, "choices.0.logprobs.token_logprobs.0") == -0.5);
    assert_true(s_num(j, "choices.0.logprobs.top_logprobs.0.t101") == -1.5);
    assert_string_equal(s_str(j, "choices.2.logprobs.tokens.0"), "token_id:100");
    assert_true(s_num(j, "choices.2.logprobs.top_logprobs.0.token_id:101") == -1.5);
    assert_int_equal((int)s_num(j, "usage.prompt_tokens"), 3);
    assert_int_equal((int)s_num(j, "usage.completion_tokens"), 4);
    cJSON_Delete(j);
    s_last_req(&m);
    const ls_msg_sampling_params_t *sp = &m.u.generate_req.sampling;
    assert_string_equal(m.u.generate_req.adapter, "reverse");
    assert_string_equal(m.u.generate_req.text.s, "bc");
    assert_int_equal(sp->n, 2);
    assert_true(sp->top_p == 0.5f && sp->temperature == 1.0f && sp->min_p == 0.1f);
    assert_int_equal(sp->stop.n, 2);
    assert_string_equal(sp->stop.v[1].s, "y");
    assert_true(sp->has_seed && sp->seed == 7);
    assert_true(sp->presence_penalty == 0.5f && sp->frequency_penalty == -1.0f && sp->repetition_penalty == 1.2f);
    assert_int_equal(sp->top_k, 3);
    assert_true(sp->ignore_eos && sp->min_new_tokens == 1 && sp->logprobs && sp->top_logprobs == 2);
    ls_msg_clear(&m);

    // Token-id prompts; a single stop string.
    j = s_post("/v1/completions", "{\"model\":\"upper\",\"prompt\":[1,2,3],\"stop\":\"z\"}", 200);
    cJSON_Delete(j);
    s_last_req(&m);
    assert_int_equal(m.u.generate_req.input_ids.n, 3);
    assert_int_equal(m.u.generate_req.sampling.max_new_tokens, 16);  // OpenAI's default
    assert_int_equal(m.u.generate_req.sampling.stop.n, 1);
    ls_msg_clear(&m);

    // A NUL inside JSON text is kept, in the prompt and in stop strings.
    j = s_post("/v1/completions", "{\"prompt\":\"a\\u0000b nul inside\",\"stop\":[\"\\u0000\",\"x\\u0000y\"]}", 200);
    cJSON_Delete(j);
    s_last_req(&m);
    assert_int_equal(m.u.generate_req.text.len, 14);
    assert_memory_equal(m.u.generate_req.text.s, "a\0b nul inside", 14);
    assert_int_equal(m.u.generate_req.sampling.stop.n, 2);
    assert_int_equal(m.u.generate_req.sampling.stop.v[0].len, 1);
    assert_memory_equal(m.u.generate_req.sampling.stop.v[1].s, "x\0y", 4);
    ls_msg_clear(&m);
    // A name may not hold one: it would be cut there and name another adapter.
    j = s_post("/v1/completions", "{\"model\":\"reverse\\u0000x\",\"prompt\":\"a\"}", 400);
    assert_string_equal(s_str(j, "error.param"), "model");
    assert_contains(s_str(j, "error.message"), "without NUL characters");
    cJSON_Delete(j);

    // Generated text and the matched stop string keep their NUL bytes (\u0000), whole and
    // streamed, in every API's shape.
    resp_t r;
    const struct {
        const char *path, *body, *want[2];
    } nul[] = {
        {"/v1/completions", "{\"prompt\":\"nul\"}", {"\"text\":\"a\\u0000b\"", "\"stop_reason\":\"\\u0000x\""}},
        {"/v1/completions", "{\"prompt\":\"nul\",\"stream\":true}", {"\"text\":\"a\\u0000b\"", "\"finish_reason\":\"stop\""}},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"nul\"}],\"stream\":true}",
         {"\"content\":\"a\\u0000b\"", "\"finish_reason\":\"stop\""}},
        {"/generate", "{\"text\":\"nul\"}", {"\"text\":\"a\\u0000b\"", "\"matched\":\"\\u0000x\""}},
        // Streamed logprobs name each piece's tokens by their texts too.
        {"/v1/completions", "{\"prompt\":\"p\",\"stream\":true,\"logprobs\":1}",
         {"\"tokens\":[\"t100\"]", "\"top_logprobs\":[{\"t101\":"}},
        {"/v1/chat/completions",
         "{\"messages\":[{\"role\":\"user\",\"content\":\"p\"}],\"stream\":true,\"logprobs\":true,\"top_logprobs\":1}",
         {"\"token\":\"t101\",\"logprob\":-1,\"bytes\":[116,49,48,49]", "\"top_logprobs\":[{\"token\":\"t100\""}},
    };
    for (size_t i = 0; i < sizeof nul / sizeof *nul; i++) {
        s_call(s_gw.port, "POST", nul[i].path, nul[i].body, NULL, &r);
        assert_int_equal(r.status, 200);
        for (int k = 0; k < 2; k++)
            if (!strstr(r.body, nul[i].want[k]))
                fail_msg("POST %s %s: no %s in %s", nul[i].path, nul[i].body, nul[i].want[k], r.body);
        s_resp_free(&r);
    }

    // Streaming: SSE chunks, finish in the last chunk of the choice, usage chunk, [DONE].
    s_call(s_gw.port, "POST", "/v1/completions",
           "{\"model\":\"demo\",\"prompt\":\"hi\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(!strncmp(r.content_type, "text/event-stream", 17));
    static char ev[16][2048];
    int n = s_events(r.body, ev, 16);
    assert_true(n >= 4);
    assert_string_equal(ev[n - 1], "[DONE]");
    char text[256] = "";
    for (int i = 0; i < n - 2; i++) {
        cJSON *c = cJSON_Parse(ev[i]);
        assert_non_null(c);
        assert_string_equal(s_str(c, "object"), "text_completion");
        strcat(text, s_str(c, "choices.0.text"));
        if (i == n - 3)
            assert_string_equal(s_str(c, "choices.0.finish_reason"), "stop");
        else
            assert_true(cJSON_IsNull(s_at(c, "choices.0.finish_reason")));
        cJSON_Delete(c);
    }
    assert_string_equal(text, " base ok");
    cJSON *u = cJSON_Parse(ev[n - 2]);
    assert_int_equal(cJSON_GetArraySize(s_at(u, "choices")), 0);
    assert_int_equal((int)s_num(u, "usage.completion_tokens"), 2);
    cJSON_Delete(u);
    s_resp_free(&r);
}

static void test_chat(void **state) {
    cJSON *j = s_post("/v1/chat/completions",
                      "{\"model\":\"reverse\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\","
                      "\"content\":[{\"type\":\"text\",\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]}],"
                      "\"logprobs\":true,\"top_logprobs\":1,\"max_completion_tokens\":9}",
                      200);
    assert_string_equal(s_str(j, "object"), "chat.completion");
    assert_true(!strncmp(s_str(j, "id"), "chatcmpl-", 9));
    assert_string_equal(s_str(j, "choices.0.message.role"), "assistant");
    assert_string_equal(s_str(j, "choices.0.message.content"), " chat:reverse ok");
    assert_string_equal(s_str(j, "choices.0.logprobs.content.1.token"), "t101");
    assert_string_equal(s_str(j, "choices.0.logprobs.content.1.top_logprobs.0.token"), "t101");
    // bytes: the UTF-8 bytes of the token's text, "t101".
    assert_int_equal(cJSON_GetArraySize(s_at(j, "choices.0.logprobs.content.1.bytes")), 4);
    assert_int_equal((int)s_num(j, "choices.0.logprobs.content.1.bytes.0"), 't');
    assert_int_equal((int)s_num(j, "choices.0.logprobs.content.1.top_logprobs.0.bytes.3"), '1');
    assert_int_equal((int)s_num(j, "usage.prompt_tokens"), 7);
    cJSON_Delete(j);
    ls_msg_t m;
    s_last_req(&m);
    assert_true(m.u.generate_req.chat);
    // the messages whole: the chat template reads the parts (and any other key)
    assert_string_equal(m.u.generate_req.messages,
                        "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                        "\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]}]");
    assert_null(m.u.generate_req.tools);
    assert_int_equal(m.u.generate_req.sampling.max_new_tokens, 9);
    ls_msg_clear(&m);

    resp_t r;
    s_call(s_gw.port, "POST", "/v1/chat/completions",
           "{\"model\":\"demo\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":true}", NULL, &r);
    assert_int_equal(r.status, 200);
    static char ev[16][2048];
    int n = s_events(r.body, ev, 16);
    assert_string_equal(ev[n - 1], "[DONE]");
    cJSON *first = cJSON_Parse(ev[0]);
    assert_string_equal(s_str(first, "object"), "chat.completion.chunk");
    assert_string_equal(s_str(first, "choices.0.delta.role"), "assistant");
    cJSON_Delete(first);
    char text[256] = "";
    for (int i = 0; i < n - 1; i++) {
        cJSON *c = cJSON_Parse(ev[i]);
        cJSON *content = s_at(c, "choices.0.delta.content");
        if (cJSON_IsString(content))
            strcat(text, content->valuestring);
        if (i == n - 2)
            assert_string_equal(s_str(c, "choices.0.finish_reason"), "stop");
        cJSON_Delete(c);
    }
    assert_string_equal(text, " chat:base ok");
    s_resp_free(&r);
}

static void test_generate(void **state) {
    cJSON *j = s_post("/generate", "{\"text\":\"abc\",\"sampling_params\":{\"max_new_tokens\":8,\"temperature\":0}}", 200);
    assert_string_equal(s_str(j, "text"), " base ok");
    assert_int_equal(cJSON_GetArraySize(s_at(j, "output_ids")), 2);
    assert_int_equal((int)s_num(j, "output_ids.1"), 101);
    assert_int_equal((int)s_num(j, "meta_info.prompt_tokens"), 3);
    assert_int_equal((int)s_num(j, "meta_info.completion_tokens"), 2);
    assert_string_equal(s_str(j, "meta_info.finish_reason.type"), "stop");
    cJSON_Delete(j);

    // A list, with a base entry (null) among the adapters, and logprobs.
    j = s_post("/generate",
               "{\"text\":[\"a\",\"b\"],\"lora_path\":[\"reverse\",null],\"return_logprob\":true,"
               "\"sampling_params\":{\"max_new_tokens\":1}}",
               200);
    assert_true(cJSON_IsArray(j));
    assert_int_equal(cJSON_GetArraySize(j), 2);
    assert_string_equal(s_str(j, "0.text"), " reverse");
    assert_string_equal(s_str(j, "1.text"), " base");
    assert_string_equal(s_str(j, "1.meta_info.finish_reason.type"), "length");
    assert_true(s_num(j, "0.meta_info.output_token_logprobs.0.0") == -0.5);
    assert_int_equal((int)s_num(j, "0.meta_info.output_token_logprobs.0.1"), 100);
    cJSON_Delete(j);

    j = s_post("/generate", "{\"input_ids\":[5,6,7,8]}", 200);
    assert_int_equal((int)s_num(j, "meta_info.prompt_tokens"), 4);
    cJSON_Delete(j);

    // Streaming as SGLang: cumulative text, then [DONE].
    resp_t r;
    s_call(s_gw.port, "POST", "/generate", "{\"text\":\"q\",\"lora_path\":\"upper\",\"stream\":true}", NULL, &r);
    assert_int_equal(r.status, 200);
    static char ev[16][2048];
    int n = s_events(r.body, ev, 16);
    assert_string_equal(ev[n - 1], "[DONE]");
    cJSON *a = cJSON_Parse(ev[0]), *b = cJSON_Parse(ev[n - 2]);
    assert_string_equal(s_str(a, "text"), " upper");
    assert_string_equal(s_str(b, "text"), " upper ok");
    assert_string_equal(s_str(b, "meta_info.finish_reason.type"), "stop");
    cJSON_Delete(a);
    cJSON_Delete(b);
    s_resp_free(&r);
}

static void s_expect_error(const char *path, const char *json, int status, const char *param) {
    cJSON *j = s_post(path, json, status);
    cJSON *e = cJSON_GetObjectItem(j, "error");
    if (!e)
        fail_msg("%s: no error object: %s", json, cJSON_PrintUnformatted(j));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    assert_non_null(cJSON_GetObjectItem(e, "code"));
    cJSON *p = cJSON_GetObjectItem(e, "param");
    assert_non_null(p);
    if (param)
        assert_string_equal(p->valuestring, param);
    cJSON_Delete(j);
}

static void test_errors_upstream(void **state) {
    s_expect_error("/v1/completions", "{\"model\":\"missing\",\"prompt\":\"x\"}", 404, "model");
    s_expect_error("/v1/completions", "{\"model\":\"missing\",\"prompt\":\"x\",\"stream\":true}", 404, "model");
    s_expect_error("/v1/chat/completions", "{\"model\":\"demo:missing\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                   404, "model");
    s_expect_error("/generate", "{\"text\":[\"a\",\"b\"],\"lora_path\":[null,\"missing\"]}", 404, "lora_path");
    s_expect_error("/v1/completions", "{\"prompt\":\"long\"}", 400, "prompt");
    s_expect_error("/v1/completions", "{\"prompt\":\"long\",\"stream\":true}", 400, "prompt");
    cJSON *long_j = s_post("/generate", "{\"text\":\"long\"}", 400);
    assert_string_equal(s_str(long_j, "error.code"), "context_length_exceeded");
    assert_string_equal(s_str(long_j, "error.param"), "text");
    assert_string_equal(s_str(long_j, "error.type"), "invalid_request_error");
    cJSON_Delete(long_j);
    s_expect_error("/v1/completions", "{\"prompt\":\"full\"}", 429, NULL);
    s_expect_error("/v1/completions", "{\"prompt\":\"busy\"}", 503, NULL);
    // both say when to come back
    for (int i = 0; i < 2; i++) {
        resp_t r;
        s_call(s_gw.port, "POST", "/v1/completions", i ? "{\"prompt\":\"busy\"}" : "{\"prompt\":\"full\"}",
               NULL, &r);
        assert_string_equal(r.retry_after, "1");
        s_resp_free(&r);
    }
    // Answers with rid 0 answer nothing: dropped with a log line, the request still served.
    cJSON *j = s_post("/v1/completions", "{\"prompt\":\"rid0\"}", 200);
    assert_string_equal(s_str(j, "choices.0.text"), " base ok");
    cJSON_Delete(j);
}

// Nothing silently ignored: each field the server knows but does not implement is a 400 naming
// it, unless its value asks for nothing; harmless fields and unknown ones are accepted.
static void test_unsupported(void **state) {
    static const struct {
        const char *path, *extra, *param;
    } refused[] = {
        // structured output beyond regexes and JSON schemas (bad ones: test_structured.c)
        {"/v1/chat/completions", "\"response_format\":{\"type\":\"grammar\"}", "response_format"},
        {"/v1/chat/completions", "\"ebnf\":\"root ::= x\"", "ebnf"},
        {"/v1/completions", "\"guided_grammar\":\"x\"", "guided_grammar"},
        {"/v1/completions", "\"logit_bias\":{\"50\":-100}", "logit_bias"},
        {"/v1/chat/completions", "\"tool_choice\":\"auto\"", "tool_choice"},
        {"/v1/chat/completions", "\"functions\":[{\"name\":\"f\"}]", "functions"},
        {"/v1/completions", "\"suffix\":\"end\"", "suffix"},
        {"/v1/completions", "\"best_of\":3", "best_of"},
        {"/v1/chat/completions", "\"n\":2,\"best_of\":4", "best_of"},
        {"/v1/completions", "\"use_beam_search\":true", "use_beam_search"},
        {"/v1/completions", "\"prompt_logprobs\":1", "prompt_logprobs"},
        {"/v1/chat/completions", "\"chat_template\":\"{{x}}\"", "chat_template"},
        {"/generate", "\"sampling_params\":{\"structural_tag\":\"{}\"}", "structural_tag"},
        {"/generate", "\"sampling_params\":{\"logit_bias\":{\"1\":2}}", "logit_bias"},
    };
    char body[512];
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const char *input = !strcmp(refused[i].path, "/generate")      ? "\"text\":[\"x\"]"
                            : !strcmp(refused[i].path, "/v1/completions") ? "\"prompt\":\"x\""
                                                                         : "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]";
        snprintf(body, sizeof body, "{%s,%s}", input, refused[i].extra);
        cJSON *j = s_post(refused[i].path, body, 400);
        if (!s_str(j, "error.param") || strcmp(s_str(j, "error.param"), refused[i].param))
            fail_msg("%s %s: %s", refused[i].path, body, cJSON_PrintUnformatted(j));
        assert_string_equal(s_str(j, "error.type"), "invalid_request_error");
        assert_string_equal(s_str(j, "error.code"), "unsupported_parameter");
        assert_non_null(strstr(s_str(j, "error.message"), refused[i].param));
        cJSON_Delete(j);
    }
    // Values that ask for nothing, harmless fields (user, store, metadata, service_tier,
    // parallel_tool_calls) and unknown ones are served.
    cJSON *j = s_post("/v1/chat/completions",
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"text\"},"
                      "\"logit_bias\":{},\"tools\":[],\"tool_choice\":\"none\",\"user\":\"u1\",\"store\":false,"
                      "\"metadata\":{\"k\":\"v\"},\"service_tier\":\"auto\",\"parallel_tool_calls\":true,\"json_schema\":null,"
                      "\"no_such_field\":1}",
                      200);
    assert_string_equal(s_str(j, "choices.0.message.content"), " chat:base ok");
    cJSON_Delete(j);
    j = s_post("/v1/completions", "{\"prompt\":\"x\",\"n\":2,\"best_of\":2,\"suffix\":null,\"user\":\"u1\"}", 200);
    assert_string_equal(s_str(j, "choices.1.text"), " base ok");
    cJSON_Delete(j);
    j = s_post("/generate", "{\"text\":\"x\",\"sampling_params\":{\"json_schema\":null,\"logit_bias\":{}}}", 200);
    assert_string_equal(s_str(j, "text"), " base ok");
    cJSON_Delete(j);
}

static void test_models(void **state) {
    resp_t r;
    s_call(s_gw.port, "GET", "/v1/models", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    cJSON *j = cJSON_Parse(r.body);
    s_resp_free(&r);
    assert_string_equal(s_str(j, "object"), "list");
    assert_int_equal(cJSON_GetArraySize(s_at(j, "data")), 3);  // the unloading one is left out
    assert_string_equal(s_str(j, "data.0.id"), "demo");
    assert_true(cJSON_IsNull(s_at(j, "data.0.parent")));
    assert_string_equal(s_str(j, "data.1.id"), "reverse");
    assert_string_equal(s_str(j, "data.1.parent"), "demo");
    assert_string_equal(s_str(j, "data.1.root"), "/adapters/reverse");
    assert_string_equal(s_str(j, "data.2.object"), "model");
    cJSON_Delete(j);
}

// SGLang's GET /get_model_info from the model directory's config.json; without a model
// directory, the answer says no vocabulary size.
static void test_model_info(void **state) {
    char dir[128], path[160], flag[160];
    snprintf(dir, sizeof dir, "%s/model", s_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"vocab_size\": 824, \"max_position_embeddings\": 256, \"model_type\": \"llama\"}", f);
    fclose(f);
    snprintf(flag, sizeof flag, "--model-path=%s", dir);
    const char *extra[] = {flag, NULL};
    gw_t g = s_start("gateway-info", extra);
    resp_t r;
    s_call(g.port, "GET", "/get_model_info", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    cJSON *j = cJSON_Parse(r.body);
    s_resp_free(&r);
    assert_int_equal((int)s_at(j, "vocab_size")->valuedouble, 824);
    assert_int_equal((int)s_at(j, "max_context")->valuedouble, 256);
    assert_true(cJSON_IsTrue(s_at(j, "is_generation")));
    assert_string_equal(s_str(j, "model_path"), dir);
    cJSON_Delete(j);
    s_stop(&g);
    s_call(s_gw.port, "GET", "/get_model_info", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    j = cJSON_Parse(r.body);
    s_resp_free(&r);
    assert_null(s_at(j, "vocab_size"));
    cJSON_Delete(j);
}

static void test_adapters(void **state) {
    resp_t r;
    s_call(s_gw.port, "POST", "/v1/load_lora_adapter", "{\"lora_name\":\"a1\",\"lora_path\":\"/x/a1\"}", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.body, "Success: LoRA adapter 'a1' added successfully.");
    s_resp_free(&r);
    s_expect_error("/v1/load_lora_adapter", "{\"lora_name\":\"bad\",\"lora_path\":\"/x/bad\"}", 400, "lora_name");
    s_expect_error("/v1/load_lora_adapter", "{\"lora_name\":\"a1\"}", 400, "lora_path");
    s_call(s_gw.port, "POST", "/v1/unload_lora_adapter", "{\"lora_name\":\"a1\"}", NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_expect_error("/v1/unload_lora_adapter", "{\"lora_name\":\"nope\"}", 404, "lora_name");
    // A load whose answer was lost upstream may have taken effect: 503 outcome_unknown, no failure.
    cJSON *lost = s_post("/v1/load_lora_adapter", "{\"lora_name\":\"lost\",\"lora_path\":\"/x/lost\"}", 503);
    assert_string_equal(s_str(lost, "error.code"), "outcome_unknown");
    assert_contains(s_str(lost, "error.message"), "list the adapters");
    cJSON_Delete(lost);

    cJSON *j = s_post("/load_lora_adapter", "{\"lora_name\":\"a2\",\"lora_path\":\"/x/a2\",\"pinned\":true}", 200);
    assert_true(cJSON_IsTrue(s_at(j, "success")));
    cJSON_Delete(j);
    j = s_post("/load_lora_adapter", "{\"lora_name\":\"bad\",\"lora_path\":\"/x\"}", 400);
    assert_true(cJSON_IsFalse(s_at(j, "success")));
    assert_string_equal(s_str(j, "error_message"), "rank 128 above max_lora_rank 64");
    cJSON_Delete(j);
    j = s_post("/unload_lora_adapter", "{\"lora_name\":\"nope\"}", 404);
    assert_true(cJSON_IsFalse(s_at(j, "success")));
    cJSON_Delete(j);
}

static void test_health(void **state) {
    resp_t r;
    s_call(s_gw.port, "GET", "/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    fake_graph_mute(1);
    double t0 = s_now();
    s_call(s_gw.port, "GET", "/health", NULL, NULL, &r);
    fake_graph_mute(0);
    assert_int_equal(r.status, 503);
    assert_true(s_now() - t0 < 3);
    s_resp_free(&r);
}

static void test_metrics(void **state) {
    resp_t r;
    s_call(s_gw.port, "POST", "/v1/completions", "{\"model\":\"reverse\",\"prompt\":\"hi\",\"stream\":true}", NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_call(s_gw.port, "GET", "/metrics", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_true(!strncmp(r.content_type, "text/plain", 10));
    // The page parses as a Prometheus client parses it, histograms included.
    tp_page_t *page = tp_page_new();
    tp_parse(page, r.body);
    tp_check_histograms(page);
    assert_true(tp_count(page) > 20);
    assert_non_null(strstr(r.body, "loraserve_gateway_requests_total{model=\"reverse\"} "));
    assert_non_null(strstr(r.body, "loraserve_gateway_generation_tokens_total{model=\"reverse\"} "));
    assert_non_null(strstr(r.body, "loraserve_gateway_http_responses_total{code=\"200\"} "));
    // the tokenizer's histograms: cumulative buckets in seconds, the base under its served name,
    // both forms; the series given twice once, the malformed one not at all
    assert_contains(r.body, "# HELP loraserve_time_to_first_token_seconds latency \\\\ of \"tests\"\\nsecond line\n"
                            "# TYPE loraserve_time_to_first_token_seconds histogram\n"
                            "loraserve_time_to_first_token_seconds_bucket{adapter=\"demo\",le=\"0.001\"} 1\n"
                            "loraserve_time_to_first_token_seconds_bucket{adapter=\"demo\",le=\"0.01\"} 3\n"
                            "loraserve_time_to_first_token_seconds_bucket{adapter=\"demo\",le=\"+Inf\"} 3\n"
                            "loraserve_time_to_first_token_seconds_sum{adapter=\"demo\"} 0.011500\n"
                            "loraserve_time_to_first_token_seconds_count{adapter=\"demo\"} 3\n");
    assert_contains(r.body, "loraserve_time_to_first_token_seconds_count{adapter=\"reverse\"} 2\n");
    assert_contains(r.body, "loraserve_time_to_first_token_seconds_count{adapter=\"q\\\"x\"} 1\n");
    assert_contains(r.body, "vllm:time_to_first_token_seconds_count{model_name=\"reverse\"} 2\n");
    assert_null(strstr(r.body, "_count{adapter=\"reverse\"} 27"));
    assert_null(strstr(r.body, "e2e_request_latency_seconds"));
    double count, sum;
    assert_true(tp_histogram(page, "vllm:time_to_first_token_seconds", "model_name", "demo", &count, &sum));
    assert_true(count == 3 && sum == 0.0115);
    tp_page_destroy(&page);
    assert_non_null(strstr(r.body, "loraserve_queue_length{actor=\"scheduler\"} 3"));
    assert_non_null(strstr(r.body, "loraserve_kv_used_blocks{actor=\"tokenizer\"} 7"));
    // gauges typed as the actors said, before their samples; the others counters
    const char *qt = strstr(r.body, "# TYPE loraserve_queue_length gauge\n");
    assert_non_null(qt);
    assert_true(qt < strstr(r.body, "loraserve_queue_length{"));
    assert_contains(r.body, "# TYPE loraserve_kv_used_blocks counter\nloraserve_kv_used_blocks{actor=\"tokenizer\"} 7\n");
    // a name that several actors report: one TYPE line, then all its samples together
    const char *at = strstr(r.body, "# TYPE loraserve_requests_active gauge\n");
    assert_non_null(at);
    assert_null(strstr(at + 1, "# TYPE loraserve_requests_active"));
    const char *s1 = at + strlen("# TYPE loraserve_requests_active gauge\n"), *s2 = strchr(s1, '\n') + 1;
    assert_true(!strncmp(s1, "loraserve_requests_active{actor=\"", 33) && !strncmp(s2, "loraserve_requests_active{actor=\"", 33));
    assert_true(strstr(r.body, "loraserve_requests_active{actor=\"scheduler\"} 4\n") &&
                strstr(r.body, "loraserve_requests_active{actor=\"tokenizer\"} 8\n"));
    // the inference gateway's series, from the scheduler's answer: names escaped, each list
    // cut at max_lora names, a name listed once
    assert_contains(r.body, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n");
    assert_contains(r.body, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n");
    assert_contains(r.body, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.25\n");
    assert_contains(r.body, "# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"3\","
                            "running_lora_adapters=\"q\\\"x,b\\\\s,n\\nl\",waiting_lora_adapters=\"a,b,c\"} ");
    assert_contains(r.body, "# TYPE vllm:cache_config_info gauge\n"
                            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4\"} 1\n");
    double stamp = atof(strstr(r.body, "waiting_lora_adapters=\"a,b,c\"} ") + strlen("waiting_lora_adapters=\"a,b,c\"} "));
    assert_true(stamp > (double)time(NULL) - 60 && stamp < (double)time(NULL) + 60);
    s_resp_free(&r);
}

// A gateway whose key is "sekret", however it was given: the key is required everywhere but
// the health probes.
static void s_check_keyed(const char *tag, const char *const *extra) {
    gw_t g = s_start(tag, extra);
    resp_t r;
    const char *body = "{\"prompt\":\"x\"}";
    s_call(g.port, "POST", "/v1/completions", body, NULL, &r);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.body, "invalid_api_key"));
    s_resp_free(&r);
    s_call(g.port, "POST", "/v1/completions", body, "Authorization: Bearer wrong\r\n", &r);
    assert_int_equal(r.status, 401);
    s_resp_free(&r);
    s_call(g.port, "GET", "/metrics", NULL, NULL, &r);
    assert_int_equal(r.status, 401);
    s_resp_free(&r);
    s_call(g.port, "POST", "/v1/completions", body, "Authorization: Bearer sekret\r\n", &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_call(g.port, "GET", "/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_call(g.port, "GET", "/health/live", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    // Only the --api-key form may show the key on the command line (ps).
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)g.pid);
    size_t n;
    char *cmd = tu_read_file(path, &n);
    assert_non_null(cmd);
    for (size_t i = 0; i < n; i++)
        cmd[i] = cmd[i] ? cmd[i] : ' ';
    if (strstr(tag, "flag") == NULL && strstr(cmd, "sekret"))
        fail_msg("the key is on the command line: %s", cmd);
    free(cmd);
    s_stop(&g);
}

static void test_api_key(void **state) {
    const char *flag[] = {"--api-key=sekret", NULL};
    s_check_keyed("keyed-flag", flag);
    char file[128], arg[160];
    snprintf(file, sizeof file, "%s/api-key", s_dir);
    FILE *f = fopen(file, "w");
    fputs("sekret\n", f);
    fclose(f);
    chmod(file, 0600);
    snprintf(arg, sizeof arg, "--api-key-file=%s", file);
    const char *from_file[] = {arg, NULL};
    s_check_keyed("keyed-file", from_file);
    setenv("LORASERVE_API_KEY", "sekret", 1);
    s_check_keyed("keyed-env", NULL);
    // Two sources at once (the environment and a file) are refused: the gateway does not start.
    pid_t pid = fork();
    if (pid == 0) {
        const char *argv[] = {LS_BIN_DIR "/loraserve-gateway", "--name=both", "--port=0", arg, NULL};
        snprintf(file, sizeof file, "%s/both.log", s_dir);
        int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    snprintf(file, sizeof file, "%s/both.log", s_dir);
    char *log = tu_read_file(file, NULL);
    assert_contains(log, "give one of --api-key, --api-key-file and LORASERVE_API_KEY");
    free(log);
    unsetenv("LORASERVE_API_KEY");
}

static void s_raw_expect(const char *raw, size_t len, int status) {
    resp_t r;
    s_raw(s_gw.port, raw, len, &r);
    if (r.status != status)
        fail_msg("%.60s...: status %d, want %d (%s)", raw, r.status, status, r.body ? r.body : "");
    if (status >= 400) {
        cJSON *j = cJSON_Parse(r.body);
        assert_non_null(cJSON_GetObjectItem(j, "error"));
        cJSON_Delete(j);
    }
    s_resp_free(&r);
    // ... and the gateway goes on serving.
    s_call(s_gw.port, "GET", "/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
}

static void test_malformed(void **state) {
    static const char bad_line[] = "GARBAGE\r\n\r\n";
    s_raw_expect(bad_line, sizeof bad_line - 1, 400);
    static const char bad_version[] = "GET /health HTTP/9x\r\n\r\n";
    s_raw_expect(bad_version, sizeof bad_version - 1, 400);
    // Headers over --max-header-bytes (4096 here).
    char big[8192];
    int n = snprintf(big, sizeof big, "GET /health HTTP/1.1\r\nX-Big: ");
    memset(big + n, 'a', 6000);
    n += 6000;
    n += snprintf(big + n, sizeof big - (size_t)n, "\r\n\r\n");
    s_raw_expect(big, (size_t)n, 431);
    // Too many headers.
    char many[8192];
    n = snprintf(many, sizeof many, "GET /health HTTP/1.1\r\n");
    for (int i = 0; i < 120; i++)
        n += snprintf(many + n, sizeof many - (size_t)n, "X-%d: 1\r\n", i);
    n += snprintf(many + n, sizeof many - (size_t)n, "\r\n");
    s_raw_expect(many, (size_t)n, 431);
    // A body over --max-body-bytes (65536 here), declared, and chunked.
    static const char declared[] = "POST /v1/completions HTTP/1.1\r\nContent-Length: 100000\r\n\r\n{}";
    s_raw_expect(declared, sizeof declared - 1, 413);
    static char chunked[200000];
    n = snprintf(chunked, sizeof chunked, "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 10; i++) {
        n += snprintf(chunked + n, sizeof chunked - (size_t)n, "2710\r\n");
        memset(chunked + n, ' ', 10000);
        n += 10000;
        n += snprintf(chunked + n, sizeof chunked - (size_t)n, "\r\n");
    }
    n += snprintf(chunked + n, sizeof chunked - (size_t)n, "0\r\n\r\n");
    s_raw_expect(chunked, (size_t)n, 413);
    static const char bad_chunk[] = "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n";
    s_raw_expect(bad_chunk, sizeof bad_chunk - 1, 400);
    // A good chunked body is fine.
    static const char good_chunk[] = "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                     "7\r\n{\"promp\r\n7\r\nt\":\"x\"}\r\n0\r\n\r\n";
    s_raw_expect(good_chunk, sizeof good_chunk - 1, 200);
    static const char smuggle[] = "POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
                                  "0\r\n\r\n";
    s_raw_expect(smuggle, sizeof smuggle - 1, 400);
    // JSON that is not JSON, or of the wrong types.
    s_expect_error("/v1/completions", "{\"prompt\": \"x\",", 400, NULL);
    s_expect_error("/v1/completions", "[1,2]", 400, NULL);
    s_expect_error("/v1/completions", "{\"prompt\": 5}", 400, "prompt");
    s_expect_error("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": \"many\"}", 400, "max_tokens");
    s_expect_error("/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1.5}", 400, "max_tokens");
    s_expect_error("/v1/completions", "{\"prompt\": \"x\", \"temperature\": -1}", 400, "temperature");
    s_expect_error("/v1/completions", "{\"prompt\": \"x\", \"stop\": [1]}", 400, "stop");
    s_expect_error("/v1/completions", "{\"prompt\": \"x\", \"stream\": \"yes\"}", 400, "stream");
    s_expect_error("/v1/completions", "{\"prompt\": \"x\", \"model\": 3}", 400, "model");
    s_expect_error("/v1/chat/completions", "{\"messages\": \"hi\"}", 400, "messages");
    s_expect_error("/v1/chat/completions", "{\"messages\": [{\"content\": \"hi\"}]}", 400, "messages");
    s_expect_error("/generate", "{\"text\": [\"a\"], \"lora_path\": [\"x\", \"y\"]}", 400, "lora_path");
    s_expect_error("/generate", "{\"sampling_params\": {}}", 400, "text");
    s_expect_error("/generate", "{\"text\": \"a\", \"sampling_params\": {\"top_k\": \"x\"}}", 400, "top_k");
    resp_t r;
    s_call(s_gw.port, "GET", "/nowhere", NULL, NULL, &r);
    assert_int_equal(r.status, 404);
    s_resp_free(&r);
    s_call(s_gw.port, "GET", "/v1/completions", NULL, NULL, &r);
    assert_int_equal(r.status, 405);
    s_resp_free(&r);
}

static void test_pipelining(void **state) {
    // Three requests in one write: three answers, in order, on one keep-alive connection.
    const char *body = "{\"model\":\"upper\",\"prompt\":\"p\"}";
    char raw[2048];
    int n = snprintf(raw, sizeof raw,
                     "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s"
                     "GET /nowhere HTTP/1.1\r\n\r\n"
                     "GET /health HTTP/1.1\r\n\r\n",
                     strlen(body), body);
    conn_t c;
    s_conn_open(&c, s_gw.port);
    s_write(c.fd, raw, (size_t)n);
    resp_t r;
    s_read(&c, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, " upper ok"));
    s_resp_free(&r);
    s_read(&c, &r);
    assert_int_equal(r.status, 404);
    s_resp_free(&r);
    s_read(&c, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    // The connection is still open for more.
    static const char again[] = "GET /health HTTP/1.1\r\n\r\n";
    s_write(c.fd, again, sizeof again - 1);
    s_read(&c, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    close(c.fd);
}

static void test_concurrency(void **state) {
    enum { N = 64 };
    static conn_t c[N];
    char raw[512];
    for (int i = 0; i < N; i++) {
        s_conn_open(&c[i], s_gw.port);
        char body[128];
        snprintf(body, sizeof body, "{\"model\":\"a%d\",\"prompt\":\"p\",\"stream\":%s}", i, i % 2 ? "true" : "false");
        int n = snprintf(raw, sizeof raw, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(body),
                         body);
        s_write(c[i].fd, raw, (size_t)n);
    }
    for (int i = 0; i < N; i++) {
        resp_t r;
        s_read(&c[i], &r);
        assert_int_equal(r.status, 200);
        char want[32];
        snprintf(want, sizeof want, " a%d", i);
        assert_non_null(strstr(r.body, want));
        s_resp_free(&r);
        close(c[i].fd);
    }
}

static void test_slow_clients(void **state) {
    // a request timeout long enough that no slow client runs out before the fifth is refused
    // on a loaded machine (sanitizers, parallel tests), where 600 ms may not be
    const char *extra[] = {"--max-connections=4", "--request-timeout-ms=2000", "--idle-timeout-ms=5000", NULL};
    gw_t g = s_start("slow", extra);
    // Four clients send half a request and wait: they hold every slot...
    int slow[4];
    for (int i = 0; i < 4; i++) {
        slow[i] = s_connect(g.port);
        static const char half[] = "POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pro";
        s_write(slow[i], half, sizeof half - 1);
    }
    usleep(100000);
    // ... so a fifth is turned away at once,
    resp_t r;
    s_call(g.port, "GET", "/health", NULL, NULL, &r);
    assert_int_equal(r.status, 503);
    s_resp_free(&r);
    // until the slow ones run out of time (408),
    for (int i = 0; i < 4; i++) {
        conn_t c = {.fd = slow[i]};
        http_parser_init(&c.p, HTTP_RESPONSE);
        s_read(&c, &r);
        assert_int_equal(r.status, 408);
        s_resp_free(&r);
        close(slow[i]);
    }
    // and new clients are served.
    usleep(100000);
    s_call(g.port, "GET", "/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_stop(&g);
}

// A streamed request the fake graph holds open (its prompt is "hang"): the connection, once
// the first piece arrived.
static int s_hang_open(int port, const char *body) {
    conn_t c;
    s_conn_open(&c, port);
    char raw[256];
    int n = snprintf(raw, sizeof raw, "POST /v1/completions HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s", strlen(body),
                     body);
    s_write(c.fd, raw, (size_t)n);
    char buf[4096];
    size_t got = 0;
    for (double t0 = s_now(); s_now() - t0 < 5 && !memmem(buf, got, " hi", 3);) {
        ssize_t k = recv(c.fd, buf + got, sizeof buf - got, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    assert_non_null(memmem(buf, got, " hi", 3));
    return c.fd;
}

// The client of a hanging request leaves: the gateway sends the Abort.
static void s_hang_close(int fd) {
    int before = fake_graph_aborts();
    close(fd);
    for (double t0 = s_now(); s_now() - t0 < 5 && fake_graph_aborts() == before;)
        usleep(20000);
    assert_int_equal(fake_graph_aborts(), before + 1);
}

static void test_disconnect(void **state) {
    s_hang_close(s_hang_open(s_gw.port, "{\"prompt\":\"hang\",\"stream\":true}"));
    // The gateway is fine.
    resp_t r;
    s_call(s_gw.port, "GET", "/health", NULL, NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
}

// --max-request-completions: more prompts x n is a 400 at once. --max-tenant-completions: while
// the base model's requests hold its share, its next one is a 429 with Retry-After and an
// adapter's request is served; the share is back once the holder's client left.
static void test_admission(void **state) {
    const char *extra[] = {"--max-request-completions=4", "--max-tenant-completions=4", NULL};
    gw_t g = s_start("admission", extra);
    resp_t r;
    s_call(g.port, "POST", "/v1/completions", "{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":2}", NULL, &r);
    assert_int_equal(r.status, 400);
    assert_contains(r.body, "\"code\":\"too_many_completions\"");
    s_resp_free(&r);
    int fd = s_hang_open(g.port, "{\"prompt\":\"hang\",\"n\":4,\"stream\":true}");
    s_call(g.port, "POST", "/v1/completions", "{\"prompt\":\"x\"}", NULL, &r);
    assert_int_equal(r.status, 429);
    assert_string_equal(r.retry_after, "1");
    assert_contains(r.body, "\"code\":\"overloaded\"");
    s_resp_free(&r);
    s_call(g.port, "POST", "/v1/completions", "{\"model\":\"reverse\",\"prompt\":\"x\"}", NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_hang_close(fd);
    s_call(g.port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"n\":4}", NULL, &r);
    assert_int_equal(r.status, 200);
    s_resp_free(&r);
    s_stop(&g);
}

// A load still in flight when the gateway stops is not called failed: the registry may still
// complete it.
static void test_shutdown_admin(void **state) {
    gw_t g = s_start("stopping", NULL);
    conn_t c;
    s_conn_open(&c, g.port);
    static const char body[] = "{\"lora_name\":\"hang\",\"lora_path\":\"/x/hang\"}";
    char raw[256];
    int n = snprintf(raw, sizeof raw, "POST /v1/load_lora_adapter HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s",
                     sizeof body - 1, body);
    s_write(c.fd, raw, (size_t)n);
    usleep(200000);
    s_stop(&g);
    resp_t r;
    s_read(&c, &r);
    assert_int_equal(r.status, 503);
    assert_contains(r.body, "\"code\":\"outcome_unknown\"");
    assert_contains(r.body, "may still complete");
    s_resp_free(&r);
    close(c.fd);
}

static int s_setup(void **state) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(s_dir, sizeof s_dir, "/tmp/ls-gateway-XXXXXX");
    assert_non_null(mkdtemp(s_dir));
    snprintf(s_tok_ep, sizeof s_tok_ep, "ipc://%s/tokenizer.sock", s_dir);
    snprintf(s_sched_ep, sizeof s_sched_ep, "ipc://%s/scheduler.sock", s_dir);
    s_fake = fake_graph_new(s_tok_ep, s_sched_ep);
    assert_non_null(s_fake);
    const char *extra[] = {"--max-header-bytes=4096", "--max-body-bytes=65536", NULL};
    s_gw = s_start("gateway", extra);
    return 0;
}

static int s_teardown(void **state) {
    s_stop(&s_gw);
    zactor_destroy(&s_fake);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    return system(cmd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_completions), cmocka_unit_test(test_chat),      cmocka_unit_test(test_generate),
        cmocka_unit_test(test_errors_upstream), cmocka_unit_test(test_unsupported), cmocka_unit_test(test_models), cmocka_unit_test(test_model_info),
        cmocka_unit_test(test_adapters),
        cmocka_unit_test(test_health),      cmocka_unit_test(test_metrics),   cmocka_unit_test(test_api_key),
        cmocka_unit_test(test_malformed),   cmocka_unit_test(test_pipelining), cmocka_unit_test(test_concurrency),
        cmocka_unit_test(test_slow_clients), cmocka_unit_test(test_disconnect), cmocka_unit_test(test_admission),
        cmocka_unit_test(test_shutdown_admin),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
