// ls_series — the bounded set of adapters with metric series (contract in ls_series.h).
#include "ls_series.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;     // NULL: free
    uint64_t used;  // s->tick at its last take: the smallest is the least recently used
} s_entry_t;

struct ls_series {
    int max;
    uint64_t tick;
    s_entry_t *e;  // max adapters' entries; entry i is series i + 2
};

ls_series_t *ls_series_new(int max) {
    ls_series_t *s = calloc(1, sizeof *s);
    if (!s || max < 0 || !(s->e = calloc((size_t)max + 1, sizeof *s->e))) {
        free(s);
        return NULL;
    }
    s->max = max;
    return s;
}

void ls_series_destroy(ls_series_t **p) {
    if (!p || !*p)
        return;
    for (int i = 0; i < (*p)->max; i++)
        free((*p)->e[i].name);
    free((*p)->e);
    free(*p);
    *p = NULL;
}

int ls_series_slots(const ls_series_t *s) {
    return s->max + 2;
}

static int s_find(const ls_series_t *s, const char *name) {
    for (int i = 0; i < s->max; i++)
        if (s->e[i].name && !strcmp(s->e[i].name, name))
            return i;
    return -1;
}

int ls_series_take(ls_series_t *s, const char *name, int *fold) {
    *fold = -1;
    if (!name || !*name)
        return LS_SERIES_BASE;
    if (!strcmp(name, "other") || !s->max)
        return LS_SERIES_OTHER;
    int i = s_find(s, name);
    if (i < 0) {
        // A free entry, else the least recently used one, whose data goes to "other".
        int victim = 0;
        for (i = 0; i < s->max && s->e[i].name; i++)
            if (s->e[i].used < s->e[victim].used)
                victim = i;
        if (i == s->max) {
            i = victim;
            *fold = i + 2;
        }
        char *copy = strdup(name);
        if (!copy) {  // out of memory: counted under "other", which needs nothing
            *fold = -1;
            return LS_SERIES_OTHER;
        }
        free(s->e[i].name);
        s->e[i].name = copy;
    }
    s->e[i].used = ++s->tick;
    return i + 2;
}

int ls_series_drop(ls_series_t *s, const char *name) {
    int i = name && *name ? s_find(s, name) : -1;
    if (i < 0)
        return -1;
    free(s->e[i].name);
    s->e[i].name = NULL;
    return i + 2;
}

const char *ls_series_name(const ls_series_t *s, int i) {
    if (i == LS_SERIES_BASE)
        return "";
    if (i == LS_SERIES_OTHER)
        return "other";
    return i >= 2 && i < s->max + 2 ? s->e[i - 2].name : NULL;
}
