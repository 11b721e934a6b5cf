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

int tu_gateway_port(const char *run_dir) {
    static const char at_text[] = "listening on http://127.0.0.1:";
    char path[512];
    snprintf(path, sizeof path, "%s/logs/gateway.log", run_dir);
    char *text = tu_read_file(path, NULL);
    const char *at = text ? strstr(text, at_text) : NULL;
    int port = at ? atoi(at + sizeof at_text - 1) : 0;
    free(text);
    return port;
}

int tu_json_ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if (n < cap) out[n++] = (int32_t)x->valuedouble;
    return n;
}
