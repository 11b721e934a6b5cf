// test_util — see test_util.h.
#define _GNU_SOURCE
#include "test_util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>

char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    // Read to the end rather than trust the size: /proc files say 0.
    size_t n = 0, cap = 4096;
    char *buf = malloc(cap + 1);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *more = realloc(buf, 2 * cap + 1);
            if (!more) {
                free(buf);
                buf = NULL;
            }
            buf = more;
            cap *= 2;
        }
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        if (len)
            *len = n;
    }
    return buf;
}

int tu_tmpdir(char *out, size_t cap, const char *tag) {
    if ((size_t)snprintf(out, cap, "/tmp/ls-%s-XXXXXX", tag) >= cap)
        return -1;
    return mkdtemp(out) ? 0 : -1;
}

int tu_rmrf(const char *dir) {
    char *cmd;
    if (asprintf(&cmd, "rm -rf '%s'", dir) < 0)
        return -1;
    int rc = system(cmd);
    free(cmd);
    if (rc != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc == 0 ? 0 : -1;
}

void tu_child_dies_with_parent(void) {
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)  // the test died before prctl took effect
        _exit(1);
}

double tu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

pid_t tu_curl_start(const char *out_path, const char *const args[]) {
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    tu_child_dies_with_parent();
    int fd = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    const char *argv[24] = {"curl", "-s", "-m", "60"};
    int n = 4;
    for (int i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    execvp("curl", (char **)argv);
    _exit(127);
}

pid_t tu_graph_start(const char *launch_script, const char *bin_dir, const char *run_dir, const char *log,
                     const char *const args[], double seconds) {
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        tu_child_dies_with_parent();
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("LORASERVE_BIN", bin_dir, 1);
        const char *argv[64] = {launch_script, "--run-dir", run_dir};
        int n = 3;
        for (int i = 0; args && args[i] && n < 63; i++)
            argv[n++] = args[i];
        execv(launch_script, (char **)argv);
        _exit(127);
    }
    if (seconds <= 0)
        return pid;
    char graph[512];
    snprintf(graph, sizeof graph, "%s/graph.json", run_dir);
    for (int i = 0; i < (int)(seconds * 10) && access(graph, R_OK) != 0; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            fprintf(stderr, "the launcher exited before the graph was ready (see %s)\n", log);
            return -1;
        }
        usleep(100000);
    }
    if (access(graph, R_OK) != 0) {
        fprintf(stderr, "no graph.json after %.0f s (see %s)\n", seconds, log);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

int tu_graph_stop(pid_t launcher) {
    int status;
    if (kill(launcher, SIGINT) < 0 || waitpid(launcher, &status, 0) != launcher)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int tu_listen_port(const char *log_text) {
    static const char at_text[] = "listening on http://127.0.0.1:";
    const char *at = log_text ? strstr(log_text, at_text) : NULL;
    if (!at)
        return 0;
    char *end;
    long port = strtol(at + sizeof at_text - 1, &end, 10);
    return *end == ' ' && port > 0 && port < 65536 ? (int)port : 0;
}

int tu_gateway_port(const char *run_dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/logs/gateway.log", run_dir);
    char *text = tu_read_file(path, NULL);
    int port = tu_listen_port(text);
    free(text);
    return port;
}

int tu_json_ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if (n < cap) out[n++] = (int32_t)x->valuedouble;
    return n;
}

int tu_http_graph_up(tu_http_graph_t *g, const char *launch_script, const char *bin_dir, const char *tag,
                     const char *const args[]) {
    memset(g, 0, sizeof *g);
    g->launcher = -1;
    if (tu_tmpdir(g->dir, sizeof g->dir, tag) < 0)
        return -1;
    snprintf(g->run_dir, sizeof g->run_dir, "%s/run", g->dir);
    char log[160];
    snprintf(log, sizeof log, "%s/launcher.out", g->dir);
    const char *all[64] = {"--port", "0"};
    int n = 2;
    for (int i = 0; args && args[i] && n < 63; i++)
        all[n++] = args[i];
    g->launcher = tu_graph_start(launch_script, bin_dir, g->run_dir, log, all, 120);
    if (g->launcher < 0)
        return -1;
    g->port = tu_gateway_port(g->run_dir);
    if (g->port <= 0) {
        fprintf(stderr, "no gateway port in %s/logs/gateway.log\n", g->run_dir);
        return -1;
    }
    return 0;
}

int tu_http_graph_down(tu_http_graph_t *g) {
    int rc = g->launcher > 0 ? tu_graph_stop(g->launcher) : 0;
    g->launcher = -1;
    return rc == 0 && tu_rmrf(g->dir) == 0 ? 0 : -1;
}

char *tu_curl(const char *dir, const char *const args[]) {
    char out[256];
    snprintf(out, sizeof out, "%s/curl.out", dir);
    pid_t pid = tu_curl_start(out, args);
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return NULL;
    return tu_read_file(out, NULL);
}

char *tu_http_post_body(const tu_http_graph_t *g, const char *path, const char *body, int *status) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", g->port, path);
    char *text = tu_curl(g->dir, (const char *[]){"-H", "Content-Type: application/json", "-d", body, "-w",
                                                  "\n%{http_code}", url, NULL});
    char *nl = text ? strrchr(text, '\n') : NULL;
    if (!nl) {
        free(text);
        return NULL;
    }
    *status = atoi(nl + 1);
    *nl = 0;
    if (*status != 200)
        printf("%s -> %d: %s\n", path, *status, text);
    return text;
}

int tu_http_post(int port, const char *dir, const char *path, const char *body) {
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    char *code = tu_curl(dir, (const char *[]){"-o", "/dev/null", "-w", "%{http_code}", "-d", body, url, NULL});
    int status = code ? atoi(code) : -1;
    free(code);
    return status;
}
