// check — adapter names, path confinement and adapter_config.json validation (see check.h).
#define _GNU_SOURCE
#include "check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ls_msg.h"
#include "peft.h"

static void s_fail(check_result_t *out, uint32_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void s_fail(check_result_t *out, uint32_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out->reason, sizeof out->reason, fmt, ap);
    va_end(ap);
    out->code = code;
}

int check_name(const char *name, char *reason, size_t cap) {
    size_t len = name ? strlen(name) : 0;
    const char *why = NULL;
    if (len == 0)
        why = "is empty";
    else if (len > CHECK_NAME_MAX)
        why = "is longer than 128 bytes";
    else if (!strcmp(name, ".") || !strcmp(name, ".."))
        why = "is a path component, not a name";
    else if (strpbrk(name, "/\\"))
        why = "contains '/' or '\\' (a name is never a path)";
    for (size_t i = 0; !why && i < len; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            why = "contains a control character";
    if (!why)
        return 0;
    snprintf(reason, cap, "adapter name \"%.*s\" %s", (int)(len > 64 ? 64 : len), name ? name : "", why);
    return -1;
}

void check_targets_format(unsigned targets, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int t = 0; t < LS_TARGET_ALL; t++)
        if (targets >> t & 1) {
            int w = snprintf(out + n, cap - n, "%s%s", n ? ", " : "", ls_target_name((ls_target_t)t));
            if (w < 0 || (size_t)w >= cap - n)
                return;
            n += (size_t)w;
        }
}

// Is path (no trailing slash needed) root itself or inside it, comparing whole components?
static bool s_under(const char *path, const char *root) {
    size_t n = strlen(root);
    while (n > 1 && root[n - 1] == '/')
        n--;
    if (strncmp(path, root, n) != 0)
        return false;
    return path[n] == 0 || path[n] == '/' || (n == 1 && root[0] == '/');
}

static bool s_has_dotdot(const char *path) {
    for (const char *p = path; (p = strstr(p, "..")); p += 2) {
        bool starts = p == path || p[-1] == '/';
        bool ends = p[2] == 0 || p[2] == '/';
        if (starts && ends)
            return true;
    }
    return false;
}

static void s_roots_format(const check_root_t *roots, size_t n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int w = snprintf(out + k, cap - k, "%s%s", i ? ", " : "", roots[i].given);
        if (w < 0 || (size_t)w >= cap - k)
            return;
        k += (size_t)w;
    }
}

// A client's path: confined to the roots. 0 with out->path set, or -1 with out failed.
static int s_confine(const check_env_t *env, const char *path, check_result_t *out) {
    char roots[512];
    s_roots_format(env->roots, env->n_roots, roots, sizeof roots);
    if (env->n_roots == 0) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST,
               "loading adapters by path is disabled: the registry has no adapter roots; start it with "
               "--lora-roots DIR (or --lora-dirs DIR) to allow directories under DIR");
        return -1;
    }
    if (path[0] != '/') {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter path \"%s\" is not absolute; give a directory under %s", path,
               roots);
        return -1;
    }
    if (s_has_dotdot(path)) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter path \"%s\" contains \"..\"; give a directory under %s",
               path, roots);
        return -1;
    }
    const check_root_t *root = NULL;
    for (size_t i = 0; i < env->n_roots && !root; i++)
        if (s_under(path, env->roots[i].given) || s_under(path, env->roots[i].real))
            root = &env->roots[i];
    if (!root) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter path \"%s\" is outside the adapter roots (%s)", path, roots);
        return -1;
    }
    if (!realpath(path, out->path)) {
        if (errno == ENOENT || errno == ENOTDIR)
            s_fail(out, LS_ERROR_CODE_NOT_FOUND, "adapter directory %s does not exist", path);
        else
            s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter directory %s: %s", path, strerror(errno));
        return -1;
    }
    // Under the real root that the lexical check matched — or any other: roots may nest.
    for (size_t i = 0; i < env->n_roots; i++)
        if (s_under(out->path, env->roots[i].real))
            return 0;
    s_fail(out, LS_ERROR_CODE_BAD_REQUEST,
           "adapter path \"%s\" resolves to %s, outside the adapter roots (%s): a symlink escapes them", path,
           out->path, roots);
    return -1;
}

// An on-demand name: the first DIR/name that exists, confined to its DIR.
static int s_find(const check_env_t *env, const char *name, check_result_t *out) {
    for (size_t i = 0; i < env->n_dirs; i++) {
        char candidate[PATH_MAX];
        if (snprintf(candidate, sizeof candidate, "%s/%s", env->dirs[i].real, name) >= (int)sizeof candidate)
            continue;
        if (!realpath(candidate, out->path)) {
            if (errno == ENOENT || errno == ENOTDIR)
                continue;
            s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter %s under %s: %s", name, env->dirs[i].given,
                   strerror(errno));
            return -1;
        }
        if (!s_under(out->path, env->dirs[i].real)) {
            s_fail(out, LS_ERROR_CODE_BAD_REQUEST,
                   "adapter %s under %s resolves to %s, outside that directory: a symlink escapes it", name,
                   env->dirs[i].given, out->path);
            return -1;
        }
        return 0;
    }
    char dirs[512];
    s_roots_format(env->dirs, env->n_dirs, dirs, sizeof dirs);
    s_fail(out, LS_ERROR_CODE_NOT_FOUND, "adapter %s is not loaded, and no directory %s exists under --lora-dirs (%s)",
           name, name, dirs);
    return -1;
}

void check_adapter(const check_env_t *env, check_mode_t mode, const char *name, const char *path,
                   check_result_t *out) {
    memset(out, 0, sizeof *out);
    if (mode == CHECK_DEMAND) {
        if (s_find(env, name, out) < 0)
            return;
    } else if (mode == CHECK_CONFINED) {
        if (s_confine(env, path, out) < 0)
            return;
    } else if (!realpath(path, out->path)) {
        if (errno == ENOENT || errno == ENOTDIR)
            s_fail(out, LS_ERROR_CODE_NOT_FOUND, "adapter directory %s does not exist", path);
        else
            s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter directory %s: %s", path, strerror(errno));
        return;
    }
    struct stat st;
    if (stat(out->path, &st) < 0 || !S_ISDIR(st.st_mode)) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter path %s is not a directory", out->path);
        return;
    }
    if (!env->model) {
        s_fail(out, LS_ERROR_CODE_UNAVAILABLE,
               "the registry has no base model config to validate adapters against (start it with --model-path)");
        return;
    }
    ls_adapter_info_t info;
    char err[CHECK_REASON_MAX];
    if (ls_adapter_config_read(out->path, env->model, env->max_lora_rank, &info, err, sizeof err) < 0) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter %s: %s", name, err);
        return;
    }
    unsigned off = info.target_mask & ~env->targets;
    if (off) {
        char bad[128], on[128];
        check_targets_format(off, bad, sizeof bad);
        check_targets_format(env->targets, on, sizeof on);
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST,
               "adapter %s adapts %s, which --lora-target-modules does not enable (enabled: %s)", name, bad, on);
        return;
    }
    if (info.token_rows > env->extra_vocab_size) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST,
               "adapter %s replaces or adds %d rows of the embedding or lm_head "
               "(trainable_token_indices, %d added tokens); the workers hold %d a slot "
               "(--lora-extra-vocab-size)", name, info.token_rows, info.added_tokens,
               env->extra_vocab_size);
        return;
    }
    // the added tokens themselves, for the tokenizer (AdapterAcquired.added_tokens)
    if (info.added_tokens > 0 &&
        ls_added_vocab_read(out->path, env->model->vocab_size, &out->added, err, sizeof err) < 0) {
        s_fail(out, LS_ERROR_CODE_BAD_REQUEST, "adapter %s: %s", name, err);
        return;
    }
    out->rank = (uint32_t)info.max_rank;
    out->targets = info.target_mask;
    out->alpha = info.alpha;
    out->token_rows = (uint32_t)info.token_rows;
}
