// test_util — see test_util.h.
#define _GNU_SOURCE
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

int tu_json_ids(const cJSON *arr, int32_t *out, int cap) {
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if (n < cap) out[n++] = (int32_t)x->valuedouble;
    return n;
}
