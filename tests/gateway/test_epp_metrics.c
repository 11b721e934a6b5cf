// The model-server protocol of Kubernetes' inference gateway (Gateway API Inference Extension),
// as its endpoint picker reads it: the real graph (launch/loraserve on the demo model, on the
// CPU, --max-running-requests 2 so that requests queue) scraped at /metrics, the text parsed
// here as a Prometheus client parses it (families, TYPE lines, labels with their escapes).
//   exposition — the whole page parses: every TYPE line once and before its samples, no family
//                split, no label twice
//   idle       — each vllm:* series exists with the picker's labels: waiting and running 0, KV
//                usage in 0..1, lora info with max_lora 8 (the default slots), empty lists, a
//                Unix-time value; cache config with block_size 16 and the KV blocks
//   load       — long generations for reverse, for an adapter named q"x (escaped in the label)
//                and for one named c,d (never listed: a comma-separated list cannot hold it):
//                running > 0 with reverse in running_lora_adapters, requests waiting with their
//                adapters in waiting_lora_adapters, KV in use, lists never over max_lora, the
//                stamp never going back
//   drained    — once they finished: running and waiting 0, both lists empty, no KV held
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_util.h"

#define PROMPT "input: 5 leaf road 1 red\\noutput:"
// The demo's context is 256 tokens; the prompt takes 11 of them.
#define LONG_TOKENS 240

static char s_dir[64], s_run_dir[128];
static pid_t s_launcher;
static int s_port;

// ---------------------------------------------------------------------------------------------
// HTTP through curl (a test dependency): no shell, so bodies need no quoting

// Start curl with args (after the common ones); its stdout goes to out_path (NULL: nowhere).
static pid_t s_curl_start(const char *out_path, const char *const args[]) {
    pid_t pid = tu_curl_start(out_path, args);
    assert_true(pid > 0);
    return pid;
}

// Run curl to the end; its stdout (malloc'd) is returned.
static char *s_curl(const char *const args[]) {
    char out[128];
    snprintf(out, sizeof out, "%s/curl.out", s_dir);
    int status;
    waitpid(s_curl_start(out, args), &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *text = tu_read_file(out, NULL);
    assert_non_null(text);
    return text;
}

static char *s_get_metrics(void) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", s_port);
    return s_curl((const char *[]){url, NULL});
}

// POST body to path; the HTTP status.
static int s_post(const char *path, const char *body) {
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s_port, path);
    char *code = s_curl((const char *[]){"-o", "/dev/null", "-w", "%{http_code}", "-d", body, url, NULL});
    int status = atoi(code);
    free(code);
    return status;
}

// A generation of LONG_TOKENS tokens for model (a JSON string's inside), in the background.
static pid_t s_generate_start(const char *model) {
    char url[96], body[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", s_port);
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"" PROMPT "\",\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0}", model,
             LONG_TOKENS);
    return s_curl_start(NULL, (const char *[]){"-d", body, url, NULL});
}

// ---------------------------------------------------------------------------------------------
// the text format, parsed as a Prometheus client does

#define MAX_LABELS 4
#define MAX_SAMPLES 2048
#define MAX_FAMILIES 1024

typedef struct {
    char name[128];
    char label[MAX_LABELS][2][1024];  // name, value (unescaped)
    int nlabels;
    double value;
} sample_t;

typedef struct {
    char name[128];
    char type[32];  // "" until a TYPE line
    bool has_samples, closed;
} family_t;

typedef struct {
    sample_t *s;
    int n;
    family_t f[MAX_FAMILIES];
    int nf;
} page_t;

static family_t *s_family(page_t *p, const char *name, bool add) {
    for (int i = 0; i < p->nf; i++)
        if (!strcmp(p->f[i].name, name))
            return &p->f[i];
    if (!add)
        return NULL;
    assert_true(p->nf < MAX_FAMILIES);
    family_t *f = &p->f[p->nf++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

// The family a sample belongs to: a histogram's or summary's _bucket, _sum, _count are its own.
static family_t *s_family_of(page_t *p, const char *sample) {
    static const char *suffixes[] = {"_bucket", "_sum", "_count"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(sample), m = strlen(suffixes[k]);
        if (n > m && !strcmp(sample + n - m, suffixes[k])) {
            char base[128];
            snprintf(base, sizeof base, "%.*s", (int)(n - m), sample);
            family_t *f = s_family(p, base, false);
            if (f && (!strcmp(f->type, "histogram") || !strcmp(f->type, "summary")))
                return f;
        }
    }
    return s_family(p, sample, true);
}

static bool s_name_char(char c, bool first, bool colon) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':') ||
           (!first && c >= '0' && c <= '9');
}

// A metric or label name at *at, into out; fails the test when there is none.
static void s_parse_name(const char **at, char *out, size_t cap, bool colon, const char *line) {
    size_t n = 0;
    while (s_name_char((*at)[n], n == 0, colon) && n + 1 < cap) {
        out[n] = (*at)[n];
        n++;
    }
    out[n] = 0;
    if (!n)
        fail_msg("no name at '%s' in: %s", *at, line);
    *at += n;
}

static void s_parse_sample(page_t *p, const char *line) {
    assert_true(p->n < MAX_SAMPLES);
    sample_t *s = &p->s[p->n++];
    memset(s, 0, sizeof *s);
    const char *at = line;
    s_parse_name(&at, s->name, sizeof s->name, true, line);
    if (*at == '{') {
        at++;
        while (*at != '}') {
            if (s->nlabels == MAX_LABELS)
                fail_msg("too many labels: %s", line);
            char *name = s->label[s->nlabels][0], *value = s->label[s->nlabels][1];
            s_parse_name(&at, name, sizeof s->label[0][0], false, line);
            for (int i = 0; i < s->nlabels; i++)
                if (!strcmp(s->label[i][0], name))
                    fail_msg("label %s twice: %s", name, line);
            if (at[0] != '=' || at[1] != '"')
                fail_msg("no =\" after label %s: %s", name, line);
            at += 2;
            size_t n = 0;
            for (; *at != '"'; at++) {
                char c = *at;
                if (!c)
                    fail_msg("unterminated label value: %s", line);
                if (c == '\\') {
                    at++;
                    if (*at == 'n')
                        c = '\n';
                    else if (*at == '\\' || *at == '"')
                        c = *at;
                    else
                        fail_msg("bad escape \\%c: %s", *at, line);
                }
                assert_true(n + 1 < sizeof s->label[0][1]);
                value[n++] = c;
            }
            value[n] = 0;
            at++;
            s->nlabels++;
            if (*at == ',')
                at++;
            else if (*at != '}')
                fail_msg("no , or } after a label: %s", line);
        }
        at++;
    }
    if (*at != ' ')
        fail_msg("no value: %s", line);
    char *end;
    s->value = strtod(at + 1, &end);
    if (end == at + 1 || (*end && *end != ' '))
        fail_msg("bad value: %s", line);
    family_t *f = s_family_of(p, s->name);
    if (f->closed)
        fail_msg("family %s split: its samples are not together (at %s)", f->name, line);
    // Every other family that had samples is over.
    for (int i = 0; i < p->nf; i++)
        if (&p->f[i] != f && p->f[i].has_samples)
            p->f[i].closed = true;
    f->has_samples = true;
}

static void s_parse(page_t *p, const char *text) {
    memset(p->f, 0, sizeof p->f);
    p->nf = p->n = 0;
    char *copy = strdup(text), *save;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            char name[128], type[32];
            if (sscanf(line, "# TYPE %127s %31s", name, type) == 2) {
                family_t *f = s_family(p, name, true);
                if (f->type[0])
                    fail_msg("a second TYPE line for %s", name);
                if (f->has_samples)
                    fail_msg("TYPE line for %s after its samples", name);
                if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram") &&
                    strcmp(type, "summary") && strcmp(type, "untyped"))
                    fail_msg("unknown type %s of %s", type, name);
                snprintf(f->type, sizeof f->type, "%s", type);
            }
            continue;
        }
        s_parse_sample(p, line);
    }
    free(copy);
}

// The one sample of a family with no other; fails unless it is a gauge with exactly one sample.
static const sample_t *s_only(const page_t *p, const char *name) {
    const family_t *f = NULL;
    for (int i = 0; i < p->nf && !f; i++)
        if (!strcmp(p->f[i].name, name))
            f = &p->f[i];
    if (!f)
        fail_msg("no family %s", name);
    if (strcmp(f->type, "gauge"))
        fail_msg("%s is typed '%s', not gauge", name, f->type);
    const sample_t *one = NULL;
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].name, name)) {
            if (one)
                fail_msg("%s has more than one series", name);
            one = &p->s[i];
        }
    if (!one)
        fail_msg("%s has no sample", name);
    return one;
}

static const char *s_label(const sample_t *s, const char *name) {
    for (int i = 0; i < s->nlabels; i++)
        if (!strcmp(s->label[i][0], name))
            return s->label[i][1];
    fail_msg("%s has no label %s", s->name, name);
    return NULL;
}

// Whether a comma-separated list (split as the picker splits it) has name.
static bool s_listed(const char *list, const char *name) {
    char copy[1024], *save;
    snprintf(copy, sizeof copy, "%s", list);
    for (char *n = strtok_r(copy, ",", &save); n; n = strtok_r(NULL, ",", &save))
        if (!strcmp(n, name))
            return true;
    return false;
}

static int s_count(const char *list) {
    int n = *list != 0;
    for (; *list; list++)
        n += *list == ',';
    return n;
}

// What the picker reads from one scrape.
typedef struct {
    double waiting, running, kv, stamp;
    int max_lora;
    char run[1024], wait[1024];
    int block_size, blocks;
} epp_t;

static page_t s_page;

static epp_t s_scrape(void) {
    char *text = s_get_metrics();
    s_parse(&s_page, text);
    free(text);
    epp_t e;
    e.waiting = s_only(&s_page, "vllm:num_requests_waiting")->value;
    e.running = s_only(&s_page, "vllm:num_requests_running")->value;
    e.kv = s_only(&s_page, "vllm:kv_cache_usage_perc")->value;
    const sample_t *lora = s_only(&s_page, "vllm:lora_requests_info");
    assert_int_equal(lora->nlabels, 3);
    e.max_lora = atoi(s_label(lora, "max_lora"));
    snprintf(e.run, sizeof e.run, "%s", s_label(lora, "running_lora_adapters"));
    snprintf(e.wait, sizeof e.wait, "%s", s_label(lora, "waiting_lora_adapters"));
    e.stamp = lora->value;
    const sample_t *cache = s_only(&s_page, "vllm:cache_config_info");
    assert_int_equal(cache->nlabels, 2);
    assert_true(cache->value == 1);
    e.block_size = atoi(s_label(cache, "block_size"));
    e.blocks = atoi(s_label(cache, "num_gpu_blocks"));
    // What holds in every scrape.
    assert_true(e.waiting >= 0 && e.running >= 0 && e.running <= 2);  // --max-running-requests 2
    assert_true(e.kv >= 0 && e.kv <= 1);
    assert_true(s_count(e.run) <= e.max_lora && s_count(e.wait) <= e.max_lora);
    for (int k = 0; k < 2; k++) {
        const char *list = k ? e.wait : e.run;
        if (s_listed(list, "c") || s_listed(list, "d"))
            fail_msg("the adapter c,d is listed, so split in two: '%s'", list);
    }
    return e;
}

// ---------------------------------------------------------------------------------------------

static int s_setup(void **state) {
    s_page.s = calloc(MAX_SAMPLES, sizeof *s_page.s);
    assert_non_null(s_page.s);
    assert_int_equal(tu_tmpdir(s_dir, sizeof s_dir, "epp"), 0);
    snprintf(s_run_dir, sizeof s_run_dir, "%s/run", s_dir);
    char log[160];
    snprintf(log, sizeof log, "%s/launcher.out", s_dir);
    // --port 0: tests run in parallel, each graph's gateway takes any free port
    const char *args[] = {"--port", "0", "--max-running-requests", "2", NULL};
    s_launcher = tu_graph_start(LS_LAUNCH_SCRIPT, LS_BIN_DIR, s_run_dir, log, args, 120);
    assert_true(s_launcher > 0);
    s_port = tu_gateway_port(s_run_dir);
    assert_true(s_port > 0);
    return 0;
}

static int s_teardown(void **state) {
    assert_int_equal(tu_graph_stop(s_launcher), 0);
    assert_int_equal(tu_rmrf(s_dir), 0);
    free(s_page.s);
    return 0;
}

static void test_idle(void **state) {
    epp_t e = s_scrape();
    assert_true(e.waiting == 0 && e.running == 0 && e.kv == 0);
    assert_int_equal(e.max_lora, 8);
    assert_string_equal(e.run, "");
    assert_string_equal(e.wait, "");
    double unix_now = (double)time(NULL);
    assert_true(e.stamp > unix_now - 60 && e.stamp < unix_now + 60);
    assert_int_equal(e.block_size, 16);
    assert_true(e.blocks > 0);
    // Our own names stay beside the picker's.
    bool own = false;
    for (int i = 0; i < s_page.n && !own; i++)
        own = !strcmp(s_page.s[i].name, "loraserve_queue_length");
    assert_true(own);
}

static void test_load(void **state) {
    // Two adapters whose names the lists must treat with care, from the demo's directories
    // (launch/loraserve lets clients load from there).
    assert_int_equal(s_post("/v1/load_lora_adapter",
                            "{\"lora_name\":\"q\\\"x\",\"lora_path\":\"" LS_DEMO_DIR "/adapters/upper\"}"),
                     200);
    assert_int_equal(s_post("/v1/load_lora_adapter",
                            "{\"lora_name\":\"c,d\",\"lora_path\":\"" LS_DEMO_DIR "/adapters/sort\"}"),
                     200);
    static const char *models[] = {"reverse", "reverse", "reverse", "q\\\"x", "q\\\"x", "c,d", "demo"};
    enum { N = sizeof models / sizeof *models };
    pid_t pids[N] = {0};
    bool running = false, waiting = false, quoted = false, kv = false;
    double last = 0, t0 = tu_now_s();
    while (!(running && waiting && quoted && kv)) {
        if (tu_now_s() - t0 > 90)
            fail_msg("the load was not seen: running %d, waiting %d, q\"x listed %d, KV in use %d", running, waiting,
                     quoted, kv);
        // A new round of generations once the last one is over: the demo model is fast.
        int open = 0;
        for (int i = 0; i < N; i++)
            if (pids[i] && waitpid(pids[i], NULL, WNOHANG) == 0)
                open++;
            else
                pids[i] = 0;
        if (!open)
            for (int i = 0; i < N; i++)
                pids[i] = s_generate_start(models[i]);
        epp_t e = s_scrape();
        assert_true(e.stamp >= last);
        last = e.stamp;
        running |= e.running > 0 && s_listed(e.run, "reverse");
        waiting |= e.waiting > 0 && e.wait[0];
        quoted |= s_listed(e.run, "q\"x") || s_listed(e.wait, "q\"x");
        kv |= e.kv > 0;
    }
    for (int i = 0; i < N; i++)
        if (pids[i])
            waitpid(pids[i], NULL, 0);
    // Drained: every generation answered, so none runs or waits any more.
    epp_t e = s_scrape();
    assert_true(e.waiting == 0 && e.running == 0 && e.kv == 0);
    assert_string_equal(e.run, "");
    assert_string_equal(e.wait, "");
    assert_true(e.stamp >= last);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle),
        cmocka_unit_test(test_load),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
