// The model-server protocol of Kubernetes' inference gateway (Gateway API Inference Extension),
// as its endpoint picker reads it: the real graph (launch/loraserve on the demo model, on the
// CPU, --max-running-requests 2 so that requests queue) scraped at /metrics, the text parsed
// as a Prometheus client parses it (tests/common/test_prom.h: families, TYPE lines, labels with
// their escapes, histograms).
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

#include "test_prom.h"
#include "test_util.h"

#define PROMPT "input: 5 leaf road 1 red\\noutput:"
// The demo's context is 256 tokens; the prompt takes 11 of them.
#define LONG_TOKENS 240

static tu_http_graph_t s_g;

static char *s_get_metrics(void) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", s_g.port);
    char *text = tu_curl(s_g.dir, (const char *[]){url, NULL});
    assert_non_null(text);
    return text;
}

// A generation of LONG_TOKENS tokens for model (a JSON string's inside), in the background.
static pid_t s_generate_start(const char *model) {
    char url[96], body[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", s_g.port);
    snprintf(body, sizeof body,
             "{\"model\":\"%s\",\"prompt\":\"" PROMPT "\",\"max_tokens\":%d,\"ignore_eos\":true,\"temperature\":0}", model,
             LONG_TOKENS);
    pid_t pid = tu_curl_start(NULL, (const char *[]){"-d", body, url, NULL});
    assert_true(pid > 0);
    return pid;
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

static tp_page_t *s_page;

static epp_t s_scrape(void) {
    char *text = s_get_metrics();
    tp_parse(s_page, text);
    tp_check_histograms(s_page);
    free(text);
    epp_t e;
    e.waiting = tp_only(s_page, "vllm:num_requests_waiting")->value;
    e.running = tp_only(s_page, "vllm:num_requests_running")->value;
    e.kv = tp_only(s_page, "vllm:kv_cache_usage_perc")->value;
    const tp_sample_t *lora = tp_only(s_page, "vllm:lora_requests_info");
    assert_int_equal(lora->nlabels, 3);
    e.max_lora = atoi(tp_label(lora, "max_lora"));
    snprintf(e.run, sizeof e.run, "%s", tp_label(lora, "running_lora_adapters"));
    snprintf(e.wait, sizeof e.wait, "%s", tp_label(lora, "waiting_lora_adapters"));
    e.stamp = lora->value;
    const tp_sample_t *cache = tp_only(s_page, "vllm:cache_config_info");
    assert_int_equal(cache->nlabels, 2);
    assert_true(cache->value == 1);
    e.block_size = atoi(tp_label(cache, "block_size"));
    e.blocks = atoi(tp_label(cache, "num_gpu_blocks"));
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
    s_page = tp_page_new();
    const char *args[] = {"--max-running-requests", "2", NULL};
    assert_int_equal(tu_http_graph_up(&s_g, LS_LAUNCH_SCRIPT, LS_BIN_DIR, "epp", args), 0);
    return 0;
}

static int s_teardown(void **state) {
    assert_int_equal(tu_http_graph_down(&s_g), 0);
    tp_page_destroy(&s_page);
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
    for (int i = 0; i < tp_count(s_page) && !own; i++)
        own = !strcmp(tp_sample(s_page, i)->name, "loraserve_queue_length");
    assert_true(own);
}

static void test_load(void **state) {
    // Two adapters whose names the lists must treat with care, from the demo's directories
    // (launch/loraserve lets clients load from there).
    assert_int_equal(tu_http_post(s_g.port, s_g.dir, "/v1/load_lora_adapter",
                            "{\"lora_name\":\"q\\\"x\",\"lora_path\":\"" LS_DEMO_DIR "/adapters/upper\"}"),
                     200);
    assert_int_equal(tu_http_post(s_g.port, s_g.dir, "/v1/load_lora_adapter",
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
