// Data-parallel groups in one graph: launch/loraserve --dp-size 2 on the demo model (CPU),
// driven over HTTP.
//   requests        — the four demo adapters and the base model, several at once, each with the
//                     text a one-group graph gives (greedy); both groups served requests
//                     (the dispatcher's per-group counters and each scheduler's own, in /metrics)
//   api_adapter     — an adapter loaded through the API is resident in both groups' schedulers
//                     and serves requests
//   group_restart   — scheduler-1 killed: requests in flight are answered (none waits), new
//                     ones complete on group 0; once it is back it holds every adapter again
//                     (re-loaded by the dispatcher) and serves the API-loaded one
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

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "test_util.h"

static char s_dir[64], s_run_dir[128];
static pid_t s_launcher;
static int s_port;

// curl with args, its stdout to out_path, in the background.
static pid_t s_curl_start(const char *out_path, const char *const args[]) {
    pid_t pid = tu_curl_start(out_path, args);
    assert_true(pid > 0);
    return pid;
}

static char *s_curl_wait(pid_t pid, const char *out_path) {
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *text = tu_read_file(out_path, NULL);
    assert_non_null(text);
    return text;
}

// A greedy completion for model in the background; its answer goes to OUT/<slot>.json.
static pid_t s_complete_start(int slot, const char *model, const char *prompt, int max_tokens) {
    char url[96], body[384], out[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", s_port);
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0%s}", model, prompt,
             max_tokens, max_tokens > 100 ? ",\"ignore_eos\":true" : "");
    snprintf(out, sizeof out, "%s/%d.json", s_dir, slot);
    return s_curl_start(out, (const char *[]){"-d", body, url, NULL});
}

// The text of the answer in OUT/<slot>.json (malloc'd); NULL when it is not a completion.
static char *s_complete_text(pid_t pid, int slot) {
    char out[128];
    snprintf(out, sizeof out, "%s/%d.json", s_dir, slot);
    char *body = s_curl_wait(pid, out);
    cJSON *j = cJSON_Parse(body);
    free(body);
    const cJSON *text = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
    char *r = cJSON_IsString(text) ? strdup(text->valuestring) : NULL;
    cJSON_Delete(j);
    return r;
}

// The demo's tasks on its usual prompt: what each model answers, greedy, with one group.
#define PROMPT "input: 5 leaf road 1 red\\noutput:"
static const struct {
    const char *model, *text;
} s_expect[] = {
    {"reverse", " red 1 road leaf 5"}, {"upper", " 5 LEAF ROAD 1 RED"},     {"sort", " 1 5 leaf red road"},
    {"digits", " five leaf road one red"}, {"demo", " 5 leaf road 1 red"},
};
#define NEXPECT (int)(sizeof s_expect / sizeof *s_expect)

// Each model twice at once; every answer must be its text.
static void s_all_models(const char *extra_model) {
    pid_t pids[2 * NEXPECT + 2];
    int n = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < NEXPECT; i++, n++)
            pids[n] = s_complete_start(n, s_expect[i].model, PROMPT, 12);
    if (extra_model)
        for (int k = 0; k < 2; k++, n++)
            pids[n] = s_complete_start(n, extra_model, PROMPT, 12);
    for (int i = 0; i < n; i++) {
        char *text = s_complete_text(pids[i], i);
        const char *want = i < 2 * NEXPECT ? s_expect[i % NEXPECT].text : " 5 LEAF ROAD 1 RED";  // extra: upper's weights
        if (!text || strcmp(text, want))
            fail_msg("request %d: got '%s', want '%s'", i, text ? text : "(no completion)", want);
        free(text);
    }
}

// A sample of /metrics: loraserve_<name>{actor="<actor>"}; -1 when absent.
static double s_metric(const char *name, const char *actor) {
    char url[64], out[128], key[160];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/metrics", s_port);
    snprintf(out, sizeof out, "%s/metrics.txt", s_dir);
    char *page = s_curl_wait(s_curl_start(out, (const char *[]){url, NULL}), out);
    snprintf(key, sizeof key, "\nloraserve_%s{actor=\"%s\"} ", name, actor);
    const char *at = strstr(page, key);
    double v = at ? atof(at + strlen(key)) : -1;
    free(page);
    return v;
}

static void s_wait_metric(const char *name, const char *actor, double want, double seconds) {
    double t0 = tu_now_s(), v = -1;
    while (tu_now_s() - t0 < seconds && (v = s_metric(name, actor)) != want)
        usleep(100000);
    if (v != want)
        fail_msg("%s of %s is %g after %g s, want %g", name, actor, v, seconds, want);
}

// The pid of an actor, from RUN_DIR/graph.json.
static pid_t s_actor_pid(const char *name) {
    char path[192];
    snprintf(path, sizeof path, "%s/graph.json", s_run_dir);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    pid_t pid = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(j, "actors")) {
        const cJSON *n = cJSON_GetObjectItem(a, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
            pid = (pid_t)cJSON_GetObjectItem(a, "pid")->valuedouble;
    }
    cJSON_Delete(j);
    return pid;
}

static void test_requests(void **state) {
    s_all_models(NULL);
    for (int g = 0; g < 2; g++) {
        char name[64], sched[32];
        snprintf(name, sizeof name, "group_%d_dispatched", g);
        snprintf(sched, sizeof sched, "scheduler-%d", g);
        assert_true(s_metric(name, "dispatcher") > 0);
        assert_true(s_metric("requests_finished", sched) > 0);
        snprintf(name, sizeof name, "group_%d_load", g);
        s_wait_metric(name, "dispatcher", 0, 10);  // every request ended: RequestEnded came back
    }
}

static void test_api_adapter(void **state) {
    char url[96], out[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/load_lora_adapter", s_port);
    snprintf(out, sizeof out, "%s/load.out", s_dir);
    char *code = s_curl_wait(s_curl_start(out, (const char *[]){"-o", "/dev/null", "-w", "%{http_code}", "-d",
                                                               "{\"lora_name\":\"up2\",\"lora_path\":\"" LS_DEMO_DIR
                                                               "/adapters/upper\"}",
                                                               url, NULL}),
                             out);
    assert_int_equal(atoi(code), 200);
    free(code);
    // The demo's four and up2, in each group's CPU tier.
    assert_true(s_metric("adapter_cpu_resident", "scheduler-0") == 5);
    assert_true(s_metric("adapter_cpu_resident", "scheduler-1") == 5);
    assert_true(s_metric("adapters_kept", "dispatcher") == 5);
    s_all_models("up2");
}

static void test_group_restart(void **state) {
    // Long generations in flight, then scheduler-1 dies.
    pid_t pids[4];
    for (int i = 0; i < 4; i++)
        pids[i] = s_complete_start(100 + i, i % 2 ? "reverse" : "demo", PROMPT, 240);
    usleep(300000);
    pid_t victim = s_actor_pid("scheduler-1");
    assert_true(victim > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    s_wait_metric("group_deaths", "dispatcher", 1, 10);
    // Every request in flight is answered: a completion (group 0's) or an error (group 1's).
    double t0 = tu_now_s();
    for (int i = 0; i < 4; i++) {
        char out[128];
        snprintf(out, sizeof out, "%s/%d.json", s_dir, 100 + i);
        free(s_curl_wait(pids[i], out));
    }
    assert_true(tu_now_s() - t0 < 60);
    // While group 1 is down or reloading, requests complete on group 0; after, on both.
    s_all_models("up2");
    s_wait_metric("groups_dead", "dispatcher", 0, 30);
    assert_true(s_metric("adapter_reloads", "dispatcher") >= 5);
    assert_true(s_metric("adapter_cpu_resident", "scheduler-1") == 5);
    double before = s_metric("group_1_dispatched", "dispatcher");
    s_all_models("up2");
    s_all_models("up2");
    assert_true(s_metric("group_1_dispatched", "dispatcher") > before);
}

static int s_setup(void **state) {
    assert_int_equal(tu_tmpdir(s_dir, sizeof s_dir, "dp"), 0);
    snprintf(s_run_dir, sizeof s_run_dir, "%s/run", s_dir);
    char log[160];
    snprintf(log, sizeof log, "%s/launcher.out", s_dir);
    const char *args[] = {"--port", "0", "--dp-size", "2", NULL};
    s_launcher = tu_graph_start(LS_LAUNCH_SCRIPT, LS_BIN_DIR, s_run_dir, log, args, 120);
    assert_true(s_launcher > 0);
    s_port = tu_gateway_port(s_run_dir);
    assert_true(s_port > 0);
    return 0;
}

static int s_teardown(void **state) {
    assert_int_equal(tu_graph_stop(s_launcher), 0);
    assert_int_equal(tu_rmrf(s_dir), 0);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_api_adapter),
        cmocka_unit_test(test_group_restart),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
