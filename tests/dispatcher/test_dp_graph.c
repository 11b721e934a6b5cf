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
//   dispatcher_restart — the dispatcher killed (one host): requests in flight are answered;
//                     once the launcher has it back, /health is 200, it knows the 5 adapters
//                     again (the registry re-sends them, the dispatcher being its scheduler)
//                     and the base model, the demo adapters and the API-loaded one complete
// With --nnodes 2 (ctest multinode_graph) the same graph runs as two hosts on this machine, one
// launcher each: node 0 on 127.0.0.1 (the front and group 0), node 1 on 127.0.0.2 (group 1),
// tcp with one shared set of CURVE keys (--make-keys). The tests above run on it, and
//   nodes           — scheduler-1 is node 1's, bound on 127.0.0.2, and answers no client without
//                     the keys; node 1's launcher stopped: /health on node 0 is 503 and its log
//                     names node 1; node 1 started again: /health 200 and every model's text
//   node0_dies      — node 0's launcher SIGKILLed (its actors die with it): node 1's launcher
//                     finds it silent, stops node 1's actors (none left, by pid, within 20 s)
//                     and exits 1 saying why; started again (as a supervisor would) before
//                     node 0 is back, it waits for node 0, and the graph serves every model
// With --nnodes 2 --tp-across (ctest multinode_tp) one group of --tp-size 2 spans the two
// hosts: worker-0 with the front on node 0, worker-1 on node 1 (CPU tensor parallelism meets
// in shared memory, so the two hosts must be one machine, as here), and
//   tp_requests     — worker-1 is node 1's; every model answers the text one worker gives
//   tp_rank_restart — worker-1 SIGKILLed under load: requests in flight are answered, node 0's
//                     launcher stops worker-0 with its group, both come back (a new pid for
//                     worker-0), /health is 200 and every model answers its text again
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

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <cmocka.h>
#include <czmq.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "test_util.h"

static char s_dir[64], s_run_dir[128];
static pid_t s_launcher, s_node1;
static int s_port, s_nnodes = 1;
static char s_base[16], s_keys[128];
// the graph's shape: two groups of one worker, or (--tp-across) one group of two
static const char *s_dp = "2", *s_tp = "1";

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

// Node 0's graph.json, parsed.
static cJSON *s_graph(void) {
    char path[192];
    snprintf(path, sizeof path, "%s/graph.json", s_run_dir);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

// A field of an actor in node 0's graph.json (malloc'd text).
static char *s_actor_field(const char *name, const char *field) {
    cJSON *j = s_graph();
    char *r = NULL;
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(j, "actors")) {
        const cJSON *n = cJSON_GetObjectItem(a, "name");
        const cJSON *f = !strcmp(field, "router") ? cJSON_GetObjectItem(cJSON_GetObjectItem(a, "endpoints"), "router")
                                                 : cJSON_GetObjectItem(a, field);
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name) && f)
            r = cJSON_IsString(f) ? strdup(f->valuestring) : cJSON_PrintUnformatted(f);
    }
    cJSON_Delete(j);
    assert_non_null(r);
    return r;
}

// The pid of an actor, from graph.json (node 0's: a remote actor's pid on its node).
static pid_t s_actor_pid(const char *name) {
    char *text = s_actor_field(name, "pid");
    pid_t pid = (pid_t)atoi(text);
    free(text);
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

// Long generations in flight (OUT/<slot>…<slot+3>.json), then actor dies (SIGKILL); its pid.
static pid_t s_kill_under_load(const char *actor, int slot, pid_t pids[4]) {
    for (int i = 0; i < 4; i++)
        pids[i] = s_complete_start(slot + i, i % 2 ? "reverse" : "demo", PROMPT, 240);
    usleep(300000);
    pid_t victim = s_actor_pid(actor);
    assert_true(victim > 0);
    assert_int_equal(kill(victim, SIGKILL), 0);
    return victim;
}

// Every request in flight is answered (a completion or an error), within a minute.
static void s_all_answered(const pid_t pids[4], int slot) {
    double t0 = tu_now_s();
    for (int i = 0; i < 4; i++) {
        char out[128];
        snprintf(out, sizeof out, "%s/%d.json", s_dir, slot + i);
        free(s_curl_wait(pids[i], out));
    }
    assert_true(tu_now_s() - t0 < 60);
}

static void test_group_restart(void **state) {
    pid_t pids[4];
    s_kill_under_load("scheduler-1", 100, pids);
    s_wait_metric("group_deaths", "dispatcher", 1, 10);
    // A completion (group 0's) or an error (group 1's).
    s_all_answered(pids, 100);
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

static int s_health(void);
static void s_wait_health(int want, double seconds);

static void test_dispatcher_restart(void **state) {
    if (s_nnodes > 1)
        skip();
    pid_t pids[4], victim = s_kill_under_load("dispatcher", 200, pids);
    s_all_answered(pids, 200);
    double t0 = tu_now_s();
    // graph.json is written anew once the graph is whole again: the new dispatcher is in it.
    while (s_actor_pid("dispatcher") == victim && tu_now_s() - t0 < 60)
        usleep(100000);
    assert_true(s_actor_pid("dispatcher") != victim);
    s_wait_health(200, 30);
    s_wait_metric("adapters_kept", "dispatcher", 5, 30);
    s_all_models("up2");
}

// The HTTP status of GET /health on node 0.
static int s_health(void) {
    char url[64], out[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", s_port);
    snprintf(out, sizeof out, "%s/health.out", s_dir);
    char *code = s_curl_wait(s_curl_start(out, (const char *[]){"-o", "/dev/null", "-w", "%{http_code}", url, NULL}), out);
    int c = atoi(code);
    free(code);
    return c;
}

static void s_wait_health(int want, double seconds) {
    double t0 = tu_now_s();
    int c = 0;
    while (tu_now_s() - t0 < seconds && (c = s_health()) != want)
        usleep(200000);
    if (c != want)
        fail_msg("/health is %d after %g s, want %d", c, seconds, want);
}

// Node K's launcher: the same graph flags, its rank, the shared keys; no wait for its graph.
static pid_t s_node_start(int rank, const char *run_dir, double seconds) {
    char log[160], r[8];
    snprintf(log, sizeof log, "%s/node%d.out", s_dir, rank);
    snprintf(r, sizeof r, "%d", rank);
    const char *args[] = {"--port", "0", "--dp-size", s_dp, "--tp-size", s_tp, "--transport", "tcp", "--nnodes", "2",
                          "--node-addrs", "127.0.0.1,127.0.0.2", "--tcp-base-port", s_base, "--curve-dir", s_keys,
                          "--node-rank", r, "--actor-heartbeat-ms", "300", "--hang-timeout-ms", "4000", NULL};
    return tu_graph_start(LS_LAUNCH_SCRIPT, LS_BIN_DIR, run_dir, log, args, seconds);
}

// Node K's launcher's console has what.
static void s_node_said(int rank, const char *what) {
    char log[160];
    snprintf(log, sizeof log, "%s/node%d.out", s_dir, rank);
    char *out = tu_read_file(log, NULL);
    assert_non_null(out);
    if (!strstr(out, what))
        fail_msg("%s does not say '%s'", log, what);
    free(out);
}

static void test_nodes(void **state) {
    if (s_nnodes < 2)
        skip();
    char *node = s_actor_field("scheduler-1", "node"), *ep = s_actor_field("scheduler-1", "router");
    assert_string_equal(node, "1");
    assert_true(!strncmp(ep, "tcp://127.0.0.2:", 16));
    // A client without the graph's keys gets nothing from a node-1 actor, not even an Error.
    zsock_t *plain = zsock_new_dealer(ep);
    assert_non_null(plain);
    zsock_set_rcvtimeo(plain, 1500);
    zstr_send(plain, "hello");
    zframe_t *f = zframe_recv(plain);
    if (f)
        fail_msg("%s answered a client without keys", ep);
    zsock_destroy(&plain);
    free(node);
    free(ep);

    // Node 1 stops: node 0 finds it silent and the graph is not ready.
    assert_int_equal(tu_graph_stop(s_node1), 0);
    s_wait_health(503, 30);
    s_node_said(0, "node 1 (127.0.0.2) is silent");
    // Back: its actors report Ready, node 0's graph is whole again and serves every model.
    char run1[160];
    snprintf(run1, sizeof run1, "%s/run1", s_dir);
    s_node1 = s_node_start(1, run1, 0);
    assert_true(s_node1 > 0);
    s_wait_health(200, 150);
    s_all_models(NULL);
}

// Whether pid is a live process (a zombie is dead: its parent may be gone).
static bool s_alive(pid_t pid) {
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = 0;
    const char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X';
}

// Every actor's pid from node 0's graph.json (node 1's actors: their pids on node 1).
static int s_all_pids(pid_t *out, int cap) {
    cJSON *j = s_graph();
    int n = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItem(j, "actors")) if (n < cap) out[n++] =
        (pid_t)cJSON_GetObjectItem(a, "pid")->valuedouble;
    cJSON_Delete(j);
    return n;
}

static void test_node0_dies(void **state) {
    if (s_nnodes < 2)
        skip();
    pid_t pids[16];
    int n = s_all_pids(pids, 16);
    assert_true(n >= 9);
    assert_int_equal(kill(s_launcher, SIGKILL), 0);
    assert_int_equal(waitpid(s_launcher, NULL, 0), s_launcher);
    // Node 1's launcher stops its actors once node 0 is silent for --hang-timeout-ms (4 s),
    // then exits 1; node 0's actors are gone with their launcher.
    int status;
    double t0 = tu_now_s();
    while (waitpid(s_node1, &status, WNOHANG) == 0 && tu_now_s() - t0 < 20)
        usleep(100000);
    assert_true(tu_now_s() - t0 < 20);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    for (int i = 0; i < n; i++)
        while (s_alive(pids[i]) && tu_now_s() - t0 < 20)
            usleep(100000);
    for (int i = 0; i < n; i++)
        if (s_alive(pids[i]))
            fail_msg("actor pid %d outlived node 0's launcher by %.0f s", (int)pids[i], tu_now_s() - t0);
    s_node_said(1, "node 0's launcher (127.0.0.1) is silent");
    // A supervisor starts node 1 again: it waits for node 0. Node 0 back (its gateway on a new
    // port): the graph is whole and serves.
    char run1[160], gw[192];
    snprintf(run1, sizeof run1, "%s/run1", s_dir);
    s_node1 = s_node_start(1, run1, 0);
    assert_true(s_node1 > 0);
    usleep(2000000);
    assert_int_equal(waitpid(s_node1, NULL, WNOHANG), 0);
    // The dead graph's files must not pass for the new one's: its graph.json, its port.
    snprintf(gw, sizeof gw, "%s/logs/gateway.log", s_run_dir);
    unlink(gw);
    snprintf(gw, sizeof gw, "%s/graph.json", s_run_dir);
    unlink(gw);
    s_launcher = s_node_start(0, s_run_dir, 180);
    assert_true(s_launcher > 0);
    s_port = tu_gateway_port(s_run_dir);
    assert_true(s_port > 0);
    s_wait_health(200, 60);
    s_all_models(NULL);
}

// --nnodes 2: ports free on both addresses from a base this process picks, in 26000..28999
// (29000..31999 with --tp-across): below Linux's ephemeral range, and apart from the launcher
// test's tcp graph (20000..25999) and the other mode's, which may start at the same moment
// under ctest -j (a free-port check cannot see a port the other test is about to bind).
static int s_free_base(void) {
    int lo = strcmp(s_tp, "2") ? 26000 : 29000;
    for (int base = lo + (int)(getpid() % 150) * 20, tries = 0; tries < 150;
         tries++, base = lo + (base - lo + 20) % 3000) {
        int ok = 1;
        for (int p = 0; p < 20 && ok; p++)
            for (int h = 1; h <= 2 && ok; h++) {
                struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + p))};
                sa.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)h);
                int fd = socket(AF_INET, SOCK_STREAM, 0);
                ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
                if (fd >= 0)
                    close(fd);
            }
        if (ok)
            return base;
    }
    return -1;
}

static int s_setup(void **state) {
    assert_int_equal(tu_tmpdir(s_dir, sizeof s_dir, "dp"), 0);
    snprintf(s_run_dir, sizeof s_run_dir, "%s/run", s_dir);
    char log[160];
    snprintf(log, sizeof log, "%s/launcher.out", s_dir);
    if (s_nnodes > 1) {
        int base = s_free_base();
        assert_true(base > 0);
        snprintf(s_base, sizeof s_base, "%d", base);
        snprintf(s_keys, sizeof s_keys, "%s/keys", s_dir);
        char cmd[512], run1[160];
        snprintf(cmd, sizeof cmd, "LORASERVE_BIN=%s %s --make-keys --curve-dir %s --transport tcp --dp-size %s "
                 "--tp-size %s --nnodes 2 --node-addrs 127.0.0.1,127.0.0.2 2>/dev/null", LS_BIN_DIR, LS_LAUNCH_SCRIPT,
                 s_keys, s_dp, s_tp);
        assert_int_equal(system(cmd), 0);
        snprintf(run1, sizeof run1, "%s/run1", s_dir);
        s_node1 = s_node_start(1, run1, 0);
        assert_true(s_node1 > 0);
        s_launcher = s_node_start(0, s_run_dir, 180);
    } else {
        const char *args[] = {"--port", "0", "--dp-size", "2", NULL};
        s_launcher = tu_graph_start(LS_LAUNCH_SCRIPT, LS_BIN_DIR, s_run_dir, log, args, 120);
    }
    assert_true(s_launcher > 0);
    s_port = tu_gateway_port(s_run_dir);
    assert_true(s_port > 0);
    return 0;
}

static int s_teardown(void **state) {
    assert_int_equal(tu_graph_stop(s_launcher), 0);
    // Node 0 stopping stops node 1's launcher too (Shutdown).
    if (s_node1 > 0)
        assert_int_equal(waitpid(s_node1, NULL, 0), s_node1);
    assert_int_equal(tu_rmrf(s_dir), 0);
    return 0;
}

static void test_tp_requests(void **state) {
    char *node = s_actor_field("worker-1", "node"), *ep = s_actor_field("worker-1", "router");
    assert_string_equal(node, "1");
    assert_true(!strncmp(ep, "tcp://127.0.0.2:", 16));
    free(node);
    free(ep);
    s_all_models(NULL);
}

static void test_tp_rank_restart(void **state) {
    pid_t pids[4], rank0 = s_actor_pid("worker-0");
    s_kill_under_load("worker-1", 300, pids);
    s_all_answered(pids, 300);
    // graph.json is written anew once the graph is whole again: worker-0 is a new process.
    double t0 = tu_now_s();
    while (s_actor_pid("worker-0") == rank0 && tu_now_s() - t0 < 90)
        usleep(200000);
    assert_true(s_actor_pid("worker-0") != rank0);
    s_node_said(0, "stopping worker-0");
    s_wait_health(200, 60);
    s_all_models(NULL);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--nnodes") && i + 1 < argc)
            s_nnodes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tp-across"))
            s_dp = "1", s_tp = "2";
    if (s_nnodes > 1 && !strcmp(s_tp, "2")) {
        const struct CMUnitTest tp[] = {cmocka_unit_test(test_tp_requests), cmocka_unit_test(test_tp_rank_restart)};
        return cmocka_run_group_tests(tp, s_setup, s_teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests),
        cmocka_unit_test(test_api_adapter),
        cmocka_unit_test(test_group_restart),
        cmocka_unit_test(test_dispatcher_restart),
        cmocka_unit_test(test_nodes),
        cmocka_unit_test(test_node0_dies),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
