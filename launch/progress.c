// progress — load progress on the launcher's console (contract in progress.h).
#include "progress.h"

#include <stdlib.h>
#include <string.h>

#define S_MAX_LOADS 72  // one load at a time per actor (LAUNCHER_MAX_ACTORS), kept by its actor
#define S_WHAT 65

typedef struct {
    char actor[32];
    char what[S_WHAT];
    uint64_t first_ns, first_done, done, total;
    uint64_t shown_ns;  // when a line was last shown
    int shown_pct;      // its percent; -1: none yet
} s_load_t;

struct progress {
    FILE *out;
    bool tty;
    s_load_t *open;  // the load whose line is open on the terminal (no newline yet), or NULL
    s_load_t loads[S_MAX_LOADS];
    int nloads;
};

progress_t *progress_new(FILE *out, bool tty) {
    progress_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->out = out;
    p->tty = tty;
    return p;
}

void progress_break(void *arg) {
    progress_t *p = arg;
    if (p && p->open) {
        fputc('\n', p->out);
        p->open = NULL;
    }
}

void progress_destroy(progress_t **p) {
    if (!p || !*p)
        return;
    progress_break(*p);
    free(*p);
    *p = NULL;
}

// An actor's load entry, made when new (the oldest reused when the table is full).
static s_load_t *s_load(progress_t *p, const char *actor) {
    for (int i = 0; i < p->nloads; i++)
        if (!strcmp(p->loads[i].actor, actor))
            return &p->loads[i];
    s_load_t *l = &p->loads[p->nloads < S_MAX_LOADS ? p->nloads++ : 0];
    if (p->open == l)
        p->open = NULL;
    memset(l, 0, sizeof *l);
    snprintf(l->actor, sizeof l->actor, "%s", actor);
    return l;
}

// Bytes as the console shows them: in the unit of the load's total.
static void s_size(char *out, size_t cap, uint64_t done, uint64_t total) {
    double unit = total >= 1000000000 ? 1e9 : total >= 1000000 ? 1e6 : 1e3;
    const char *name = unit == 1e9 ? "GB" : unit == 1e6 ? "MB" : "kB";
    snprintf(out, cap, "%.1f/%.1f %s", (double)done / unit, (double)total / unit, name);
}

static void s_show(progress_t *p, s_load_t *l, int pct, uint64_t now_ns) {
    char size[64], rate[32] = "";
    s_size(size, sizeof size, l->done, l->total);
    double secs = (double)(now_ns - l->first_ns) / 1e9;
    if (secs >= 0.001) {
        double bps = (double)(l->done - l->first_done) / secs;
        if (bps >= 1e9)
            snprintf(rate, sizeof rate, ", %.1f GB/s", bps / 1e9);
        else
            snprintf(rate, sizeof rate, ", %.0f %s", bps >= 1e6 ? bps / 1e6 : bps / 1e3, bps >= 1e6 ? "MB/s" : "kB/s");
    }
    if (p->tty) {
        if (p->open != l)
            progress_break(p);  // another actor's line stays as it was
        fprintf(p->out, "\r\033[K%s: loading %s %s (%d%%)%s", l->actor, l->what, size, pct, rate);
        p->open = pct == 100 ? NULL : l;
        if (pct == 100)
            fputc('\n', p->out);
    } else
        fprintf(p->out, "%s: loading %s %s (%d%%)%s\n", l->actor, l->what, size, pct, rate);
    fflush(p->out);
    l->shown_ns = now_ns;
    l->shown_pct = pct;
}

int progress_note(progress_t *p, const char *actor, const char *what, uint64_t done, uint64_t total, uint64_t now_ns) {
    if ((total && done > total) || (!total && done))
        return -1;
    char shown[S_WHAT];
    size_t n = 0;
    for (; what && what[n] && n + 1 < sizeof shown; n++)
        shown[n] = what[n] >= 0x20 && what[n] < 0x7f ? what[n] : '?';
    shown[n] = 0;
    s_load_t *l = s_load(p, actor);
    bool named = l->first_ns && !strcmp(l->what, shown);
    if (!(named && (l->total == 0 || (l->total == total && done >= l->done)))) {
        // A new load: a start, or the first we hear of one (the rate counts from here), or the
        // same one again from lower down (its actor restarted).
        if (p->open == l)
            progress_break(p);
        snprintf(l->what, sizeof l->what, "%s", shown);
        l->first_ns = now_ns ? now_ns : 1;
        l->first_done = done;
        l->shown_pct = -1;
        l->shown_ns = 0;
    }
    l->done = done;
    l->total = total;
    if (!total)
        return 0;  // a start: nothing to show until its size is known
    int pct = (int)(done * 100 / total);
    bool due = p->tty ? now_ns - l->shown_ns >= (uint64_t)PROGRESS_TTY_MS * 1000000
                      : pct / 10 > l->shown_pct / 10 || now_ns - l->shown_ns >= (uint64_t)PROGRESS_PIPE_S * 1000000000;
    if (pct != l->shown_pct && (pct == 100 || l->shown_pct < 0 || due))
        s_show(p, l, pct, now_ns);
    return 0;
}
