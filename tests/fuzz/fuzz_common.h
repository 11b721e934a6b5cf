/*  fuzz_common.h — what the fuzz targets share: failing loudly (libFuzzer keeps the input of
    an abort as a crash), and a private scratch directory for the targets whose input is a
    file (safetensors, adapter_config.json): tmpfs when there is one, removed at exit.
*/
#ifndef LS_FUZZ_COMMON_H
#define LS_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

//  A broken promise of the code under test: report it (with the target's file) and abort.
#define s_die(what) fuzz_die(__FILE__, (what))
static inline void __attribute__((noreturn)) fuzz_die(const char *file, const char *what) {
    fprintf(stderr, "%s: %s\n", file, what);
    abort();
}

static inline const char *s_scratch_dir(void);

static inline void s_scratch_remove(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_scratch_dir());
    if (system(cmd) != 0)
        fprintf(stderr, "fuzz: could not remove %s\n", s_scratch_dir());
}

//  The directory, created on first use.
static inline const char *s_scratch_dir(void) {
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/ls-fuzz-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(dir))
            abort();
        atexit(s_scratch_remove);
    }
    return dir;
}

//  Writes data to scratch/name; the path into path (cap bytes).
static inline void s_scratch_write(const char *name, const void *data, size_t size, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", s_scratch_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0)
        abort();
}

#endif
