// tensors — the registry's copies of adapters sent as tensors (see tensors.h).
#define _GNU_SOURCE
#include "tensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ls_err.h"
#include "ls_file.h"
#include "ls_hash.h"
#include "ls_log.h"

#define S_HEX 16
#define S_TMP ".tmp-"

static const char *const s_files[] = {"adapter_config.json", "adapter_model.safetensors"};

void tensors_path(const char *root, const char *name, uint64_t now_ns, uint64_t counter, char *out, size_t cap) {
    uint64_t h = ls_hash_fnv1a(LS_HASH_FNV_BASIS, name, strlen(name) + 1);
    h = ls_hash_fnv1a(h, &now_ns, sizeof now_ns);
    h = ls_hash_fnv1a(h, &counter, sizeof counter);
    snprintf(out, cap, "%s/%0*llx", root, S_HEX, (unsigned long long)h);
}

// The last component of path, and its parent's length; NULL when path has no '/'.
static const char *s_base(const char *path, size_t *parent_len) {
    const char *slash = strrchr(path, '/');
    if (slash)
        *parent_len = (size_t)(slash - path);
    return slash ? slash + 1 : NULL;
}

bool tensors_owns(const char *root, const char *path) {
    size_t n = strlen(root), parent;
    const char *base = path ? s_base(path, &parent) : NULL;
    if (!base || parent != n || strncmp(path, root, n) != 0 || strlen(base) != S_HEX)
        return false;
    return strspn(base, "0123456789abcdef") == S_HEX;
}

// dir/name into out; -1 with errno ENAMETOOLONG when it does not fit (a cut path would name
// another file).
static int s_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return 0;
}

// Remove dir's files and dir; 0, or -1 with errno (a part already gone is not an error).
static int s_remove(const char *dir) {
    char file[PATH_MAX];
    for (size_t i = 0; i < sizeof s_files / sizeof *s_files; i++) {
        if (s_join(file, sizeof file, dir, s_files[i]) < 0 || (unlink(file) < 0 && errno != ENOENT))
            return -1;
    }
    return rmdir(dir) < 0 && errno != ENOENT ? -1 : 0;
}

void tensors_remove(const char *dir) {
    if (s_remove(dir) < 0)
        ls_error(0, "cannot remove %s, the copy of an adapter sent as tensors: %s", dir, strerror(errno));
}

static int s_write_file(const char *dir, const char *name, const void *p, size_t len) {
    char path[PATH_MAX];
    if (s_join(path, sizeof path, dir, name) < 0)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    int rc = ls_file_write_all(fd, p, len) < 0 || fsync(fd) < 0 ? -1 : 0;
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

int tensors_write(const char *dir, const char *config, size_t config_len, const void *weights, size_t weights_len,
                  char *err, size_t errlen) {
    char root[PATH_MAX], tmp[PATH_MAX];
    size_t parent;
    const char *base = s_base(dir, &parent);
    if (!base || snprintf(root, sizeof root, "%.*s", (int)parent, dir) >= (int)sizeof root ||
        snprintf(tmp, sizeof tmp, "%s/" S_TMP "%s", root, base) >= (int)sizeof tmp) {
        ls_err_set(err, errlen, "%s: not a directory under the state directory", dir);
        errno = EINVAL;
        return -1;
    }
    const char *step = "create";
    int rc = mkdir(root, 0700) < 0 && errno != EEXIST ? -1 : 0;
    if (rc == 0 && (rc = s_remove(tmp)) == 0 && (rc = mkdir(tmp, 0700)) == 0) {
        step = "write";
        rc = s_write_file(tmp, s_files[0], config, config_len);
        if (rc == 0)
            rc = s_write_file(tmp, s_files[1], weights, weights_len);
        if (rc == 0)
            rc = ls_file_sync_dir(tmp);
        // rename(2) will not replace a directory that has files: an existing dir stays whole.
        if (rc == 0 && (step = "rename", rc = rename(tmp, dir)) == 0)
            rc = ls_file_sync_dir(root);
    }
    if (rc == 0)
        return 0;
    int saved = errno;
    ls_err_set(err, errlen, "cannot %s %s, the registry's copy of the adapter: %s", step, dir, strerror(saved));
    s_remove(tmp);
    errno = saved;
    return -1;
}

void tensors_sweep(const char *root, const char *const *keep, size_t n) {
    DIR *d = opendir(root);
    if (!d) {
        if (errno != ENOENT)
            ls_error(0, "cannot list %s: %s", root, strerror(errno));
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        bool kept = false;
        for (size_t i = 0; i < n && !kept; i++)
            kept = keep[i] && !strcmp(keep[i], path);
        if (kept)
            continue;
        if (tensors_owns(root, path) || !strncmp(e->d_name, S_TMP, strlen(S_TMP))) {
            ls_warn(0, "removing %s: a copy of an adapter sent as tensors that no journal record names (left by "
                       "a crash between a load or unload and its record)", path);
            tensors_remove(path);
        } else
            ls_warn(0, "%s: not a copy the registry made; left alone", path);
    }
    closedir(d);
}
