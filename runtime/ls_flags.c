// ls_flags — see ls_flags.h.
#include "ls_flags.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void s_list_clear(ls_strlist_t *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static int s_list_push(ls_strlist_t *l, const char *value) {
    char **v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v)
        return -1;
    l->v = v;
    if (!(l->v[l->n] = strdup(value)))
        return -1;
    l->n++;
    return 0;
}

// Store one textual value into a flag. Returns -1 when the text is not of the flag's kind.
static int s_set(ls_flag_t *f, const char *value, char *err, size_t errlen) {
    char *end = NULL;
    errno = 0;
    switch (f->kind) {
    case LS_FLAG_KIND_INT: {
        long v = strtol(value, &end, 10);
        if (errno || end == value || *end || v < -2147483647L || v > 2147483647L) {
            snprintf(err, errlen, "--%s expects an integer, got \"%s\"", f->name, value);
            return -1;
        }
        *(int *)f->ptr = (int)v;
        return 0;
    }
    case LS_FLAG_KIND_DOUBLE: {
        double v = strtod(value, &end);
        if (errno || end == value || *end) {
            snprintf(err, errlen, "--%s expects a number, got \"%s\"", f->name, value);
            return -1;
        }
        *(double *)f->ptr = v;
        return 0;
    }
    case LS_FLAG_KIND_BOOL:
        if (!strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "on"))
            *(int *)f->ptr = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "off"))
            *(int *)f->ptr = 0;
        else {
            snprintf(err, errlen, "--%s expects true or false, got \"%s\"", f->name, value);
            return -1;
        }
        return 0;
    case LS_FLAG_KIND_STR: {
        char *copy = strdup(value);
        if (!copy) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        free(*(char **)f->ptr);
        *(char **)f->ptr = copy;
        return 0;
    }
    case LS_FLAG_KIND_LIST:
        if (s_list_push(f->ptr, value) < 0) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        return 0;
    }
    return -1;
}

static ls_flag_t *s_find(ls_flag_t *const *tables, const char *name, size_t len) {
    for (size_t t = 0; tables[t]; t++)
        for (ls_flag_t *f = tables[t]; f->name; f++)
            if (strlen(f->name) == len && !strncmp(f->name, name, len))
                return f;
    return NULL;
}

int ls_flags_parse(ls_flag_t *const *tables, int argc, char **argv, char *err, size_t errlen) {
    for (size_t t = 0; tables[t]; t++)
        for (ls_flag_t *f = tables[t]; f->name; f++) {
            if (f->kind == LS_FLAG_KIND_STR)
                *(char **)f->ptr = NULL;
            if (f->kind == LS_FLAG_KIND_LIST)
                *(ls_strlist_t *)f->ptr = (ls_strlist_t){0};
            else if (f->def && s_set(f, f->def, err, errlen) < 0)
                return -1;
        }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h"))
            return 1;
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(err, errlen, "unexpected argument \"%s\" (flags start with --)", arg);
            return -1;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        ls_flag_t *f = s_find(tables, name, len);
        if (!f) {
            snprintf(err, errlen, "unknown flag --%.*s (see --help)", (int)len, name);
            return -1;
        }
        if (eq) {
            if (s_set(f, eq + 1, err, errlen) < 0)
                return -1;
        } else if (f->kind == LS_FLAG_KIND_BOOL) {
            *(int *)f->ptr = 1;
        } else if (f->kind == LS_FLAG_KIND_LIST) {
            int taken = 0;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (s_set(f, argv[++i], err, errlen) < 0)
                    return -1;
                taken++;
            }
            if (!taken) {
                snprintf(err, errlen, "--%s needs at least one value", f->name);
                return -1;
            }
        } else {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "--%s needs a value", f->name);
                return -1;
            }
            if (s_set(f, argv[++i], err, errlen) < 0)
                return -1;
        }
    }
    return 0;
}

void ls_flags_usage(ls_flag_t *const *tables, const char *prog, const char *about) {
    printf("usage: %s [flags]\n%s\n\nflags:\n", prog, about ? about : "");
    for (size_t t = 0; tables[t]; t++)
        for (ls_flag_t *f = tables[t]; f->name; f++) {
            static const char *kinds[] = {"N", "X", "TEXT", "", "VALUE..."};
            char left[64];
            snprintf(left, sizeof left, "--%s %s", f->name, kinds[f->kind]);
            printf("  %-34s %s", left, f->help);
            if (f->def && f->kind != LS_FLAG_KIND_BOOL)
                printf(" (default: %s)", f->def);
            printf("\n");
        }
}

void ls_flags_free(ls_flag_t *const *tables) {
    for (size_t t = 0; tables[t]; t++)
        for (ls_flag_t *f = tables[t]; f->name; f++) {
            if (f->kind == LS_FLAG_KIND_STR) {
                free(*(char **)f->ptr);
                *(char **)f->ptr = NULL;
            } else if (f->kind == LS_FLAG_KIND_LIST)
                s_list_clear(f->ptr);
        }
}
