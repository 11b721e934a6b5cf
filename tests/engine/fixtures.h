// Shared fixture helpers for the loader tests: a private temporary directory per test, and
// small file writers. Header-only (static functions) so each test stays one source file.
#ifndef LS_TESTS_ENGINE_FIXTURES_H
#define LS_TESTS_ENGINE_FIXTURES_H

#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static inline int fx_rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// Creates a fresh directory under $TMPDIR (or /tmp); the caller removes it with fx_rmdir.
static inline char *fx_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char tmpl[4096];
    snprintf(tmpl, sizeof tmpl, "%s/ls_engine_test_XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    char *copy = d ? strdup(d) : NULL;
    if (!copy) {
        perror("mkdtemp");
        abort();  // no directory, no test: fail loudly rather than run on a NULL path
    }
    return copy;
}

static inline void fx_rmdir(char **dir)
{
    if (*dir)
        nftw(*dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(*dir);
    *dir = NULL;
}

// dir + "/" + name into a static-size buffer owned by the caller.
static inline const char *fx_path(char *buf, size_t len, const char *dir, const char *name)
{
    snprintf(buf, len, "%s/%s", dir, name);
    return buf;
}

static inline int fx_write(const char *dir, const char *name, const void *data, size_t len)
{
    char p[4096];
    FILE *fp = fopen(fx_path(p, sizeof p, dir, name), "wb");
    if (!fp)
        return -1;
    size_t n = fwrite(data, 1, len, fp);
    return fclose(fp) == 0 && n == len ? 0 : -1;
}

static inline int fx_write_str(const char *dir, const char *name, const char *text)
{
    return fx_write(dir, name, text, strlen(text));
}

// Deterministic values in (-1, 1) so tests can recompute what they wrote.
static inline float fx_value(unsigned seed, size_t i)
{
    unsigned x = seed * 2654435761u ^ (unsigned)(i * 40503u + 12345u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return (float)((double)(x % 20001u) / 10000.0 - 1.0);
}

#endif
