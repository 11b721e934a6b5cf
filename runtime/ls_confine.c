// ls_confine — adapter path confinement for actors handed a path (see ls_confine.h).
#include "ls_confine.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lora_spec.h"
#include "ls_log.h"

struct ls_confine {
    char **under;  // real paths: a directory under one of these may be read
    size_t n_under;
    char **exact;  // real paths of the operator's --lora-paths
    size_t n_exact;
    char *tensors;  // --lora-tensors-dir as given, resolved when checked; NULL when none
};

static int s_add(char ***list, size_t *n, const char *path, const char *flag) {
    char real[PATH_MAX];
    if (!realpath(path, real)) {
        ls_warn(0, "%s %s: %s; no adapter is read from there", flag, path, strerror(errno));
        return 0;
    }
    char **grown = realloc(*list, (*n + 1) * sizeof **list);
    if (!grown || !(grown[*n] = strdup(real))) {
        if (grown)
            *list = grown;
        return -1;
    }
    *list = grown;
    (*n)++;
    return 0;
}

ls_confine_t *ls_confine_new(const ls_strlist_t *roots, const ls_strlist_t *dirs, const ls_strlist_t *lora_paths,
                             const char *tensors_dir) {
    ls_confine_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    int rc = tensors_dir && *tensors_dir && !(self->tensors = strdup(tensors_dir)) ? -1 : 0;
    for (size_t i = 0; roots && i < roots->n && rc == 0; i++)
        rc = s_add(&self->under, &self->n_under, roots->v[i], "--lora-roots");
    for (size_t i = 0; dirs && i < dirs->n && rc == 0; i++)
        rc = s_add(&self->under, &self->n_under, dirs->v[i], "--lora-dirs");
    for (size_t i = 0; lora_paths && i < lora_paths->n && rc == 0; i++) {
        lora_spec_t spec;
        char err[1024];
        if (lora_spec_parse(lora_paths->v[i], &spec, err, sizeof err) < 0) {
            ls_error(0, "--lora-paths: %s", err);
            rc = -1;
            break;
        }
        rc = s_add(&self->exact, &self->n_exact, spec.path, "--lora-paths");
        lora_spec_clear(&spec);
    }
    if (rc < 0)
        ls_confine_destroy(&self);
    return self;
}

void ls_confine_destroy(ls_confine_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_confine_t *self = *self_p;
    for (size_t i = 0; i < self->n_under; i++)
        free(self->under[i]);
    for (size_t i = 0; i < self->n_exact; i++)
        free(self->exact[i]);
    free(self->under);
    free(self->exact);
    free(self->tensors);
    free(self);
    *self_p = NULL;
}

int ls_confine_open(const ls_confine_t *self) {
    return !self || (self->n_under == 0 && self->n_exact == 0 && !self->tensors);
}

// Is path root itself or inside it, comparing whole components?
static int s_under(const char *path, const char *root) {
    size_t n = strlen(root);
    if (n == 1)  // "/"
        return path[0] == '/';
    return strncmp(path, root, n) == 0 && (path[n] == 0 || path[n] == '/');
}

int ls_confine_check(const ls_confine_t *self, const char *path, char *err, size_t errlen) {
    if (ls_confine_open(self))
        return 0;
    char real[PATH_MAX];
    if (!path || !*path || !realpath(path, real)) {
        snprintf(err, errlen, "adapter path \"%s\" cannot be resolved: %s", path ? path : "",
                 path && *path ? strerror(errno) : "empty");
        return -1;
    }
    for (size_t i = 0; i < self->n_under; i++)
        if (s_under(real, self->under[i]))
            return 0;
    for (size_t i = 0; i < self->n_exact; i++)
        if (!strcmp(real, self->exact[i]))
            return 0;
    char tensors[PATH_MAX];
    if (self->tensors && realpath(self->tensors, tensors) && s_under(real, tensors))
        return 0;
    snprintf(err, errlen,
             "adapter path \"%s\" (%s) is outside --lora-roots, --lora-dirs, --lora-paths and --lora-tensors-dir: "
             "refused",
             path, real);
    return -1;
}
