// ls_file — confined, non-blocking opens of model and adapter files (see ls_file.h).
#define _GNU_SOURCE
#include "ls_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ls_err.h"

uint64_t ls_file_limit(ls_file_kind_t kind)
{
    switch (kind) {
    // Configs are a few KB; a 16 MB one is a mistake or an attack, and it is parsed in memory.
    case LS_FILE_JSON: return (uint64_t)16 << 20;
    // The largest tokenizer.json files in use (256k-entry vocabularies) are about 35 MB.
    case LS_FILE_TOKENIZER: return (uint64_t)64 << 20;
    // Mapped, not read, so only a bound on what a header may promise: larger than any
    // single-file checkpoint in use (a 405B model is sharded into ~5 GB files).
    case LS_FILE_SAFETENSORS: return (uint64_t)512 << 30;
    }
    return 0;
}

static const char *s_kind_name(mode_t mode)
{
    return S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISLNK(mode)  ? "a symbolic link"
                          : "not a regular file";
}

// Why component comp (a child of fd) could not be opened: a link is named as one.
static void s_open_failed(int fd, const char *comp, int saved, const char *dir, const char *name,
                          char *err, size_t errlen)
{
    struct stat sb;
    if (fstatat(fd, comp, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode)) {
        ls_err_set(err, errlen,
                   "%s/%s: \"%s\" is a symbolic link; files are opened only inside %s, never "
                   "through a link",
                   dir, name, comp, dir);
        errno = ELOOP;
        return;
    }
    ls_err_set(err, errlen, "%s/%s: cannot open: %s", dir, name, strerror(saved));
    errno = saved;
}

int ls_file_open(const char *dir, const char *name, ls_file_kind_t kind, uint64_t *size,
                 char *err, size_t errlen)
{
    size_t n = strlen(name);
    bool bad_comp = false;
    for (const char *p = name; !bad_comp;) {
        size_t len = strcspn(p, "/");
        bad_comp = len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.');
        if (!p[len])
            break;
        p += len + 1;
    }
    if (n == 0 || n >= 4096 || name[0] == '/') {
        ls_err_set(err, errlen, "%s/%s: not a relative file name", dir, name);
        errno = EINVAL;
        return -1;
    }
    if (bad_comp) {
        ls_err_set(err, errlen, "%s/%s: empty, \".\" or \"..\" components are not allowed", dir, name);
        errno = EINVAL;
        return -1;
    }
    char comp[4096];
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int saved = errno;
        ls_err_set(err, errlen, "%s/%s: cannot open: %s", dir, name, strerror(saved));
        errno = saved;
        return -1;
    }
    for (const char *p = name;;) {
        size_t len = strcspn(p, "/");
        memcpy(comp, p, len);
        comp[len] = 0;
        bool last = p[len] == 0;
        // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY |
                    (last ? O_NONBLOCK : O_DIRECTORY);
        int next = openat(fd, comp, flags);
        if (next < 0) {
            s_open_failed(fd, comp, errno, dir, name, err, errlen);
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        close(fd);
        fd = next;
        if (last)
            break;
        p += len + 1;
    }
    struct stat sb = {0};
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        ls_err_set(err, errlen, "%s/%s: is %s; only regular files are read", dir, name,
                   s_kind_name(sb.st_mode));
        close(fd);
        errno = EINVAL;
        return -1;
    }
    uint64_t limit = ls_file_limit(kind);
    if ((uint64_t)sb.st_size > limit) {
        ls_err_set(err, errlen, "%s/%s: %llu bytes, larger than the %llu-byte limit for this file",
                   dir, name, (unsigned long long)sb.st_size, (unsigned long long)limit);
        close(fd);
        errno = EFBIG;
        return -1;
    }
    // Reads of a regular file ignore O_NONBLOCK; cleared so the descriptor behaves as usual.
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *size = (uint64_t)sb.st_size;
    return fd;
}

// Splits path into its directory ("." when it has none) and its last component.
static int s_split(const char *path, char *dir, size_t cap, const char **name, char *err,
                   size_t errlen)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(dir, cap, ".");
        *name = path;
        return 0;
    }
    size_t n = (size_t)(slash - path);
    if (n >= cap) {
        ls_err_set(err, errlen, "%.64s...: path too long", path);
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = 0;
    if (n == 0)
        snprintf(dir, cap, "/");
    *name = slash + 1;
    return 0;
}

int ls_file_open_path(const char *path, ls_file_kind_t kind, uint64_t *size, char *err,
                      size_t errlen)
{
    char dir[4096];
    const char *name;
    if (s_split(path, dir, sizeof dir, &name, err, errlen) < 0)
        return -1;
    return ls_file_open(dir, name, kind, size, err, errlen);
}

char *ls_file_read(const char *dir, const char *name, ls_file_kind_t kind, size_t *len,
                   char *err, size_t errlen)
{
    uint64_t size;
    int fd = ls_file_open(dir, name, kind, &size, err, errlen);
    if (fd < 0)
        return NULL;
    char *buf = malloc((size_t)size + 1);
    size_t got = 0;
    int rerr = 0;
    while (buf && got < size && !rerr) {
        ssize_t r = read(fd, buf + got, (size_t)size - got);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0)
            rerr = EIO;  // the file shrank while it was read
        else if (errno != EINTR)
            rerr = errno;
    }
    close(fd);
    if (!buf || rerr) {
        rerr = buf ? rerr : ENOMEM;
        ls_err_set(err, errlen, "%s/%s: %s", dir, name, strerror(rerr));
        free(buf);
        errno = rerr;
        return NULL;
    }
    buf[size] = 0;
    *len = (size_t)size;
    return buf;
}

char *ls_file_read_path(const char *path, ls_file_kind_t kind, size_t *len, char *err,
                        size_t errlen)
{
    char dir[4096];
    const char *name;
    if (s_split(path, dir, sizeof dir, &name, err, errlen) < 0)
        return NULL;
    return ls_file_read(dir, name, kind, len, err, errlen);
}

int ls_file_write_all(int fd, const void *p, size_t len)
{
    const char *b = p;
    while (len) {
        ssize_t n = write(fd, b, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            errno = n == 0 ? EIO : errno;
            return -1;
        }
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

int ls_file_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}
