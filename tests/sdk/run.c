// run.c — see run.h.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"
#include "run.h"

static void s_read_all(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    buf[0] = 0;
    if (f) {
        buf[fread(buf, 1, cap - 1, f)] = 0;
        fclose(f);
    }
}

void run_program(run_t *r, const char *scratch, const char *input, const char *run_dir, const char *const argv[]) {
    char out[512], err[512], in[512];
    snprintf(out, sizeof out, "%s/run.out", scratch);
    snprintf(err, sizeof err, "%s/run.err", scratch);
    snprintf(in, sizeof in, "%s/run.in", scratch);
    FILE *f = fopen(in, "w");
    if (f) {
        fputs(input ? input : "", f);
        fclose(f);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        tu_child_dies_with_parent();
        dup2(open(in, O_RDONLY), 0);
        dup2(open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), 1);
        dup2(open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644), 2);
        if (run_dir)
            setenv("LORASERVE_RUN_DIR", run_dir, 1);
        else
            unsetenv("LORASERVE_RUN_DIR");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    s_read_all(out, r->out, sizeof r->out);
    s_read_all(err, r->err, sizeof r->err);
}
