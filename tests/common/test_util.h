// test_util — small helpers every test folder needs (files, temporary directories, JSON id
// arrays, a substring assertion), kept once here.
#ifndef LS_TEST_UTIL_H
#define LS_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

// The whole file, NUL-terminated (malloc'd); NULL when it cannot be read. len may be NULL.
char *tu_read_file(const char *path, size_t *len);
// Creates /tmp/ls-<tag>-XXXXXX into out (cap bytes). 0, or -1 when it cannot.
int tu_tmpdir(char *out, size_t cap, const char *tag);
// Removes dir and everything in it. 0, or -1 (said on stderr).
int tu_rmrf(const char *dir);
// In a child the test forked: die with the test (SIGTERM when it exits), so a failed
// assertion that skips the test's own cleanup leaves no actor behind.
void tu_child_dies_with_parent(void);
// `curl -s -m 60 ARGS…` (curl is a test dependency; no shell, so bodies need no quoting) in
// the background, its stdout to out_path (NULL: nowhere); -1 when it cannot fork.
pid_t tu_curl_start(const char *out_path, const char *const args[]);
// Seconds on the monotonic clock.
double tu_now_s(void);
// The whole graph: launch_script --run-dir run_dir ARGS… (args NULL-terminated, may be NULL)
// with LORASERVE_BIN=bin_dir, its output into log, in a child that dies with the test; then
// wait up to `seconds` for RUN_DIR/graph.json, which the launcher writes once every actor is
// Ready (seconds <= 0: no wait). The launcher's pid, or -1 (said on stderr: it exited first, or
// time ran out).
pid_t tu_graph_start(const char *launch_script, const char *bin_dir, const char *run_dir, const char *log,
                     const char *const args[], double seconds);
// Stop it as Ctrl-C does: its exit status (0: every actor stopped cleanly), or -1.
int tu_graph_stop(pid_t launcher);
// The port of a gateway log's "listening on http://127.0.0.1:PORT (model ...)" line (as
// --port 0 logs it) in text read while the log may still be written: 0 until that line is
// there with its port whole (the space after it read too).
int tu_listen_port(const char *log_text);
// The gateway's HTTP port, from RUN_DIR/logs/gateway.log (tu_listen_port); 0 until it is there.
int tu_gateway_port(const char *run_dir);
// A graph for a test that speaks HTTP to it: a fresh directory /tmp/ls-<tag>-*, the graph in
// its run/ (tu_graph_start with --port 0, so that tests in parallel never share a port, then
// args; 120 s to be Ready), the gateway's port.
typedef struct {
    char dir[64], run_dir[128];
    pid_t launcher;
    int port;
} tu_http_graph_t;
// 0, or -1 (said on stderr).
int tu_http_graph_up(tu_http_graph_t *g, const char *launch_script, const char *bin_dir, const char *tag,
                     const char *const args[]);
// Stops it (as Ctrl-C does) and removes its directory: 0 when both went cleanly, else -1.
int tu_http_graph_down(tu_http_graph_t *g);
// `curl -s -m 60 ARGS…` to its end: its stdout (malloc'd; through dir/curl.out), or NULL when
// curl failed.
char *tu_curl(const char *dir, const char *const args[]);
// POST body to http://127.0.0.1:port/path: the HTTP status, or -1.
int tu_http_post(int port, const char *dir, const char *path, const char *body);
// POST body (JSON) to the graph's gateway at path: the answer's body (malloc'd; NULL when curl
// failed) and *status its HTTP status. A status other than 200 is printed with the body.
char *tu_http_post_body(const tu_http_graph_t *g, const char *path, const char *body, int *status);
// The integers of a JSON array into out (at most cap); returns how many.
int tu_json_ids(const cJSON *arr, int32_t *out, int cap);

#endif

// With cmocka (outside the include guard, so a file that included this before cmocka.h gets it
// by including this again after): fail unless hay contains needle, showing both.
#if defined(cmocka_unit_test) && !defined(assert_contains)
#include <string.h>
#define assert_contains(hay, needle)                                                    \
    do {                                                                                \
        const char *h_ = (hay);                                                         \
        if (!h_ || !strstr(h_, (needle)))                                               \
            fail_msg("\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", (needle));     \
    } while (0)
#endif
