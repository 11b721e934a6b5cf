// loraserve-replay — run one actor of a recorded session again from its trace and check that it
// does exactly what it did (docs/debugging.md).
//
//   loraserve-replay RUN/trace --actor scheduler [--until N] [--gdb] [--run K] [-- EXTRA FLAGS]
//
// Reads TRACE_DIR/NAME.trace, takes the actor's binary and command line from the run's meta
// record, and execs that binary with the same flags plus --replay FILE (the runtime's replay
// mode: no sockets, the trace's inbound messages, timers, job completions and signals fed in
// with their recorded times, every outbound message compared). Flags that name sockets stay:
// the replayed actor opens the same sockets, only without ZeroMQ behind them; --record-trace
// stays too and is ignored, since a replay never records. Exit status: the actor's — 0 when
// the replay matched, 3 at the first divergence (printed by the runtime), 1 on other errors.
//
// --until N pauses after N inbound messages: under --gdb at a breakpoint on ls_replay_break,
// otherwise stopped with SIGSTOP and its pid printed, for `gdb -p PID`.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ls_trace.h"

static void s_usage(FILE *f) {
    fprintf(f, "usage: loraserve-replay TRACE_DIR --actor NAME [--until N] [--gdb] [--run K] [--exe PATH]"
               " [-- EXTRA...]\n"
               "Replays TRACE_DIR/NAME.trace into a fresh instance of the actor and compares every message it\n"
               "sends with the recording. --until N: pause after N inbound messages for a debugger; --gdb: run\n"
               "under gdb with a breakpoint where it pauses or diverges; --run K: the K-th run in the file\n"
               "(default: the last); --exe: another build of the actor's binary; EXTRA: more actor flags\n"
               "(e.g. --log-level=debug). Exit 0: no divergence; 3: diverged; 1: error.\n");
}

// The meta record of run `run` (1-based; 0: the last). Returns the parsed JSON or NULL.
static cJSON *s_meta(const char *path, int run) {
    char err[512];
    ls_trace_reader_t *r = ls_trace_reader_new(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "loraserve-replay: %s\n", err);
        return NULL;
    }
    static ls_trace_record_t rec;
    cJSON *meta = NULL;
    int runs = 0;
    while (ls_trace_read(r, &rec, err, sizeof err) == 1)
        if (rec.kind == LS_TRACE_META && rec.nframes && (run == 0 || ++runs == run)) {
            cJSON_Delete(meta);
            meta = cJSON_ParseWithLength(rec.frames[0].data, rec.frames[0].len);
            if (run)
                break;
        }
    ls_trace_reader_destroy(&r);
    if (!meta)
        fprintf(stderr, "loraserve-replay: %s has no run %d\n", path, run);
    return meta;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *actor = NULL, *exe = NULL;
    int until = 0, gdb = 0, run = 0, extra = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--actor") && i + 1 < argc)
            actor = argv[++i];
        else if (!strcmp(argv[i], "--until") && i + 1 < argc)
            until = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--run") && i + 1 < argc)
            run = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exe") && i + 1 < argc)
            exe = argv[++i];
        else if (!strcmp(argv[i], "--gdb"))
            gdb = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            s_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--")) {
            extra = i + 1;
            break;
        } else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            s_usage(stderr);
            return 1;
        }
    }
    if (!dir || !actor || until < 0 || run < 0) {
        s_usage(stderr);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.trace", dir, actor);
    cJSON *meta = s_meta(path, run);
    if (!meta)
        return 1;
    const cJSON *rec_exe = cJSON_GetObjectItem(meta, "exe"), *rec_argv = cJSON_GetObjectItem(meta, "argv");
    if (!cJSON_IsArray(rec_argv) || cJSON_GetArraySize(rec_argv) < 1 || (!exe && !cJSON_IsString(rec_exe))) {
        fprintf(stderr, "loraserve-replay: %s was recorded without its command line (an older runtime)\n", path);
        return 1;
    }
    if (!exe)
        exe = rec_exe->valuestring;

    int n = cJSON_GetArraySize(rec_argv);
    char **args = calloc((size_t)(n + (argc - extra) + 16), sizeof *args);
    int k = 0;
    if (gdb) {
        args[k++] = "gdb";
        args[k++] = "-q";
        args[k++] = "-ex";
        args[k++] = "break ls_replay_break";
        args[k++] = "-ex";
        args[k++] = "run";
        args[k++] = "--args";
    }
    args[k++] = (char *)exe;
    for (int i = 1; i < n; i++)
        args[k++] = cJSON_GetArrayItem(rec_argv, i)->valuestring;
    char replay_flag[4200], run_flag[32], until_flag[48];
    snprintf(replay_flag, sizeof replay_flag, "--replay=%s", path);
    snprintf(run_flag, sizeof run_flag, "--replay-run=%d", run);
    snprintf(until_flag, sizeof until_flag, "--replay-until=%d", until);
    args[k++] = replay_flag;
    args[k++] = run_flag;
    args[k++] = until_flag;
    for (int i = extra; i < argc; i++)
        args[k++] = argv[i];
    execvp(args[0], args);
    fprintf(stderr, "loraserve-replay: cannot run %s: %s\n", args[0], strerror(errno));
    return 1;
}
