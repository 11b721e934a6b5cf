// run — start a program, feed it stdin, collect its stdout, stderr and exit code (the SDK
// tests run loraserve-cli and the examples this way).
#ifndef SDK_TEST_RUN_H
#define SDK_TEST_RUN_H

typedef struct {
    int code;           // exit status, or 128 + signal
    char out[8192];     // stdout, NUL-terminated (cut at the buffer's size)
    char err[8192];     // stderr
} run_t;

//  Run argv (NULL-terminated) with stdin from input (NULL: empty), LORASERVE_RUN_DIR set to
//  run_dir (NULL: unset). scratch is a directory for the output files.
void run_program (run_t *r, const char *scratch, const char *input, const char *run_dir, const char *const argv[]);

#endif
