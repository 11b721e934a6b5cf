// latency — per-adapter latency histograms (contract in latency.h).
#include "latency.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ls_series.h"

#define S_MAX_BUCKETS 22

// vLLM's buckets (vllm/v1/metrics/loggers.py), in microseconds, so that dashboards made for
// vLLM read ours alike.
static const uint64_t s_ttft_le[] = {1000,    5000,     10000,    20000,    40000,    60000,     80000,     100000,
                                     250000,  500000,   750000,   1000000,  2500000,  5000000,   7500000,   10000000,
                                     20000000, 40000000, 80000000, 160000000, 640000000, 2560000000};
static const uint64_t s_itl_le[] = {10000,   25000,   50000,   75000,    100000,   150000,   200000,
                                    300000,  400000,  500000,  750000,   1000000,  2500000,  5000000,
                                    7500000, 10000000, 20000000, 40000000, 80000000};
static const uint64_t s_e2e_le[] = {300000,   500000,   800000,    1000000,   1500000,   2000000,   2500000,
                                    5000000,  10000000, 15000000,  20000000,  30000000,  40000000,  50000000,
                                    60000000, 120000000, 240000000, 480000000, 960000000, 1920000000, 7680000000};

static const struct {
    const char *name, *help;
    const uint64_t *le;
    size_t n;
} s_kinds[LATENCY_KINDS] = {
    [LATENCY_TTFT] = {"time_to_first_token_seconds",
                      "time from a request's arrival at the tokenizer to a completion's first token", s_ttft_le,
                      sizeof s_ttft_le / sizeof *s_ttft_le},
    [LATENCY_ITL] = {"inter_token_latency_seconds",
                     "time between a completion's tokens, one observation per token after the first", s_itl_le,
                     sizeof s_itl_le / sizeof *s_itl_le},
    [LATENCY_E2E] = {"e2e_request_latency_seconds",
                     "time from a request's arrival at the tokenizer to a completion's end (stopped or at its length)",
                     s_e2e_le, sizeof s_e2e_le / sizeof *s_e2e_le},
};

typedef struct {
    uint64_t counts[S_MAX_BUCKETS + 1];  // per bucket, the last above every bound
    uint64_t sum_us;
} s_hist_t;

struct latency {
    ls_series_t *series;
    s_hist_t (*h)[LATENCY_KINDS];  // per series
};

latency_t *latency_new(int max_adapters) {
    latency_t *l = calloc(1, sizeof *l);
    if (!l || !(l->series = ls_series_new(max_adapters)) ||
        !(l->h = calloc((size_t)ls_series_slots(l->series), sizeof *l->h))) {
        if (l)
            ls_series_destroy(&l->series);
        free(l);
        return NULL;
    }
    return l;
}

void latency_destroy(latency_t **p) {
    if (!p || !*p)
        return;
    ls_series_destroy(&(*p)->series);
    free((*p)->h);
    free(*p);
    *p = NULL;
}

// Series i's data into "other"'s, and cleared for its next adapter.
static void s_fold(latency_t *l, int i) {
    for (int k = 0; k < LATENCY_KINDS; k++) {
        s_hist_t *from = &l->h[i][k], *to = &l->h[LS_SERIES_OTHER][k];
        for (size_t b = 0; b <= s_kinds[k].n; b++)
            to->counts[b] += from->counts[b];
        to->sum_us += from->sum_us;
    }
    memset(l->h[i], 0, sizeof l->h[i]);
}

void latency_observe(latency_t *l, const char *adapter, latency_kind_t kind, uint64_t us, uint32_t times) {
    if (!times)
        return;
    int fold, i = ls_series_take(l->series, adapter, &fold);
    if (fold >= 0)
        s_fold(l, fold);
    size_t b = 0;
    while (b < s_kinds[kind].n && us > s_kinds[kind].le[b])
        b++;
    l->h[i][kind].counts[b] += times;
    l->h[i][kind].sum_us += us * times;
}

void latency_forget(latency_t *l, const char *adapter) {
    int i = ls_series_drop(l->series, adapter);
    if (i >= 0)
        s_fold(l, i);
}

static bool s_observed(const latency_t *l, int i) {
    for (int k = 0; k < LATENCY_KINDS; k++)
        for (size_t b = 0; b <= s_kinds[k].n; b++)
            if (l->h[i][k].counts[b])
                return true;
    return false;
}

int latency_export(const latency_t *l, ls_msg_metrics_t *m) {
    ls_msg_histograms_t *out = &m->histograms;
    size_t slots = (size_t)ls_series_slots(l->series);
    if (!(out->v = calloc(slots * LATENCY_KINDS + 1, sizeof *out->v)))
        return -1;
    // Family by family, so that a reader's groups come in order.
    for (int k = 0; k < LATENCY_KINDS; k++)
        for (size_t i = 0; i < slots; i++) {
            const char *name = ls_series_name(l->series, (int)i);
            if (!name || !s_observed(l, (int)i))
                continue;
            ls_msg_histogram_t *h = &out->v[out->n++];
            size_t n = s_kinds[k].n;
            h->name = ls_msg_strdup(s_kinds[k].name);
            h->adapter = ls_msg_strdup(name);
            h->help = ls_msg_strdup(s_kinds[k].help);
            h->le_us.v = malloc(n * sizeof *h->le_us.v);
            h->counts.v = malloc((n + 1) * sizeof *h->counts.v);
            if (!h->name || !h->adapter || !h->help || !h->le_us.v || !h->counts.v)
                return -1;  // what is there goes with the message (ls_msg_clear)
            memcpy(h->le_us.v, s_kinds[k].le, n * sizeof *h->le_us.v);
            memcpy(h->counts.v, l->h[i][k].counts, (n + 1) * sizeof *h->counts.v);
            h->le_us.n = n;
            h->counts.n = n + 1;
            h->sum_us = l->h[i][k].sum_us;
        }
    return 0;
}
