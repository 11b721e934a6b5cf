// prom — /metrics from the actors' Metrics answers (contract in prom.h).
#include "prom.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static void s_prom_name(char *out, size_t cap, const char *name) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++)
        out[i] = isalnum((unsigned char)name[i]) || name[i] == '_' || name[i] == ':' ? name[i] : '_';
    out[i] = 0;
}

// v with the text format's escapes: \\ and \n, and \" in a label value (quoted).
static void s_escape(gw_buf_t *b, const char *v, bool quoted) {
    for (; *v; v++) {
        if (*v == '\\' || (quoted && *v == '"'))
            gw_buf_printf(b, "\\%c", *v);
        else if (*v == '\n')
            gw_buf_add(b, "\\n", 2);
        else
            gw_buf_add(b, v, 1);
    }
}

void gw_prom_label(gw_buf_t *b, const char *v) {
    s_escape(b, v, true);
}

// An actor's counter names (set 0) or its clock-read ones (set 1): how many have a value (a
// malformed answer's names past its values are dropped), the names in *names.
static size_t s_metric_names(const ls_msg_metrics_t *m, int set, char ***names) {
    const ls_strs_t *n = set ? &m->measured_names : &m->names;
    size_t nv = set ? m->measured_values.n : m->values.n;
    *names = n->v;
    return n->n < nv ? n->n : nv;
}

static bool s_strs_has(const ls_strs_t *l, const char *s) {
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i] && !strcmp(l->v[i], s))
            return true;
    return false;
}

// Where `name` is among an actor's names of that set (with a value), else -1.
static long s_metric_find(const ls_msg_metrics_t *m, int set, const char *name) {
    char **v;
    size_t n = s_metric_names(m, set, &v);
    for (size_t k = 0; k < n; k++)
        if (!strcmp(v[k] ? v[k] : "unnamed", name))
            return (long)k;
    return -1;
}

// Where answer i reports `name` in either set (a counter, or one read from the clock): *set and
// the index; -1 when it does not.
static long s_metric_any(const ls_msg_metrics_t *m, const char *name, int *set) {
    for (*set = 0; *set < 2; ++*set) {
        long at = s_metric_find(m, *set, name);
        if (at >= 0)
            return at;
    }
    return -1;
}

void gw_prom_actors(gw_buf_t *b, const ls_msg_t *answers, size_t n) {
    // The gateway's own series carry loraserve_gateway_, so no name here is shared with a
    // different label set.
    gw_buf_printf(b, "# HELP loraserve_actor_up the actor answered GetMetrics in time\n"
                     "# TYPE loraserve_actor_up gauge\n");
    for (size_t i = 0; i < n; i++) {
        const ls_msg_metrics_t *m = &answers[i].u.metrics;
        gw_buf_printf(b, "loraserve_actor_up{actor=\"");
        gw_prom_label(b, m->actor ? m->actor : "?");
        gw_buf_printf(b, "\"} 1\n");
    }
    // Each name once, at its first report, with its samples from every actor that reports it,
    // in either set (the counters, and those read from the clock: busy_us_total …), so that a
    // family's lines come together; typed gauge where that first actor says it is one, else
    // counter.
    for (size_t i = 0; i < n; i++)
        for (int set = 0; set < 2; set++) {
            char **names;
            size_t nn = s_metric_names(&answers[i].u.metrics, set, &names);
            for (size_t k = 0; k < nn; k++) {
                const char *nm = names[k] ? names[k] : "unnamed";
                int first_set;
                long first = s_metric_any(&answers[i].u.metrics, nm, &first_set);
                bool seen = first_set < set || first < (long)k;  // listed before in this answer
                for (size_t j = 0; j < i && !seen; j++)
                    seen = s_metric_any(&answers[j].u.metrics, nm, &first_set) >= 0;
                if (seen)
                    continue;
                char name[128];
                s_prom_name(name, sizeof name, nm);
                bool gauge = set == 0 && s_strs_has(&answers[i].u.metrics.gauges, nm);
                gw_buf_printf(b, "# TYPE loraserve_%s %s\n", name, gauge ? "gauge" : "counter");
                for (size_t j = i; j < n; j++) {
                    const ls_msg_metrics_t *m = &answers[j].u.metrics;
                    int at_set;
                    long at = s_metric_any(m, nm, &at_set);
                    if (at < 0)
                        continue;
                    gw_buf_printf(b, "loraserve_%s{actor=\"", name);
                    gw_prom_label(b, m->actor ? m->actor : "?");
                    gw_buf_printf(b, "\"} %llu\n",
                                  (unsigned long long)(at_set ? m->measured_values.v : m->values.v)[at]);
                }
            }
        }
}

// ---------------------------------------------------------------------------------------------
// latency histograms

static bool s_hist_ok(const ls_msg_histogram_t *h) {
    if (!h->name || !*h->name || h->counts.n != h->le_us.n + 1)
        return false;
    for (size_t i = 1; i < h->le_us.n; i++)
        if (h->le_us.v[i] <= h->le_us.v[i - 1])
            return false;
    return true;
}

// The j-th histogram of answer i, when it is well-formed and of family `name`.
static const ls_msg_histogram_t *s_hist(const ls_msg_t *answers, size_t i, size_t j, const char *name) {
    const ls_msg_histogram_t *h = &answers[i].u.metrics.histograms.v[j];
    return s_hist_ok(h) && (!name || !strcmp(h->name, name)) ? h : NULL;
}

static const char *s_hist_label(const ls_msg_histogram_t *h, const char *base) {
    return h->adapter && *h->adapter ? h->adapter : base;
}

// Whether a well-formed histogram before (i, j) is of the same family and, with label, the same
// label: the family or the series was shown with that one.
static bool s_hist_before(const ls_msg_t *answers, size_t i, size_t j, bool label, const char *base) {
    const ls_msg_histogram_t *h = &answers[i].u.metrics.histograms.v[j];
    for (size_t p = 0; p <= i; p++)
        for (size_t q = 0; q < (p == i ? j : answers[p].u.metrics.histograms.n); q++) {
            const ls_msg_histogram_t *o = s_hist(answers, p, q, h->name);
            if (o && (!label || !strcmp(s_hist_label(o, base), s_hist_label(h, base))))
                return true;
        }
    return false;
}

static void s_hist_series(gw_buf_t *b, const char *family, const char *label, const char *value,
                          const ls_msg_histogram_t *h) {
    uint64_t total = 0;
    for (size_t k = 0; k <= h->le_us.n; k++) {
        total += h->counts.v[k];
        gw_buf_printf(b, "%s_bucket{%s=\"", family, label);
        gw_prom_label(b, value);
        if (k < h->le_us.n)
            gw_buf_printf(b, "\",le=\"%.6g\"} %llu\n", (double)h->le_us.v[k] / 1e6, (unsigned long long)total);
        else
            gw_buf_printf(b, "\",le=\"+Inf\"} %llu\n", (unsigned long long)total);
    }
    gw_buf_printf(b, "%s_sum{%s=\"", family, label);
    gw_prom_label(b, value);
    gw_buf_printf(b, "\"} %.6f\n%s_count{%s=\"", (double)h->sum_us / 1e6, family, label);
    gw_prom_label(b, value);
    gw_buf_printf(b, "\"} %llu\n", (unsigned long long)total);
}

void gw_prom_histograms(gw_buf_t *b, const ls_msg_t *answers, size_t n, const char *base) {
    static const char *const forms[][2] = {{"loraserve_", "adapter"}, {"vllm:", "model_name"}};
    for (int f = 0; f < 2; f++)
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < answers[i].u.metrics.histograms.n; j++) {
                // A family at its first well-formed series: its header, then each of its series.
                const ls_msg_histogram_t *first = s_hist(answers, i, j, NULL);
                if (!first || s_hist_before(answers, i, j, false, base))
                    continue;
                char family[160];
                snprintf(family, sizeof family, "%s", forms[f][0]);
                s_prom_name(family + strlen(family), sizeof family - strlen(family), first->name);
                gw_buf_printf(b, "# HELP %s ", family);
                s_escape(b, first->help && *first->help ? first->help : first->name, false);
                gw_buf_printf(b, "\n# TYPE %s histogram\n", family);
                for (size_t p = i; p < n; p++)
                    for (size_t q = p == i ? j : 0; q < answers[p].u.metrics.histograms.n; q++) {
                        const ls_msg_histogram_t *h = s_hist(answers, p, q, first->name);
                        if (h && !s_hist_before(answers, p, q, true, base))
                            s_hist_series(b, family, forms[f][1], s_hist_label(h, base), h);
                    }
            }
}

// ---------------------------------------------------------------------------------------------
// the endpoint picker's series

// A counter's value in one answer; 0 when it does not report it.
static uint64_t s_value(const ls_msg_metrics_t *m, const char *name) {
    long at = s_metric_find(m, 0, name);
    return at < 0 ? 0 : m->values.v[at];
}

// A text fact of one answer; "" when it does not report it.
static const char *s_info(const ls_msg_metrics_t *m, const char *name) {
    size_t n = m->info_names.n < m->info_values.n ? m->info_names.n : m->info_values.n;
    for (size_t i = 0; i < n; i++)
        if (m->info_names.v[i] && m->info_values.v[i] && !strcmp(m->info_names.v[i], name))
            return m->info_values.v[i];
    return "";
}

// Whether the comma-separated list has the name [name, name + len).
static bool s_list_has(const char *list, const char *name, size_t len) {
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, ",");
        if (k == len && !memcmp(p, name, len))
            return true;
        p += k + (p[k] == ',');
    }
    return false;
}

// Add the names of a scheduler's list to out, each once, while out has fewer than max: with
// several schedulers the lists stay as bounded as one's.
static void s_list_merge(gw_buf_t *out, int *count, int max, const char *list) {
    for (const char *p = list; *p && *count < max;) {
        size_t k = strcspn(p, ",");
        if (k && !s_list_has(out->d ? out->d : "", p, k)) {
            if (*count)
                gw_buf_add(out, ",", 1);
            gw_buf_add(out, p, k);
            ++*count;
        }
        p += k + (p[k] == ',');
    }
}

void gw_prom_epp(gw_buf_t *b, const ls_msg_t *answers, size_t n, double now_s) {
    uint64_t waiting = 0, running = 0, used = 0, total = 0, block_size = 0, slots = 0;
    size_t groups = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_msg_metrics_t *m = &answers[i].u.metrics;
        if (s_metric_find(m, 0, "running_requests") < 0)
            continue;
        groups++;
        waiting += s_value(m, "queue_length");
        running += s_value(m, "running_requests");
        used += s_value(m, "kv_blocks_used");
        total += s_value(m, "kv_blocks_total");
        slots += s_value(m, "lora_slots");
        if (!block_size)
            block_size = s_value(m, "kv_block_size");  // one --block-size for the whole graph
    }
    if (!groups)
        return;
    gw_buf_t run = {0}, wait = {0};
    int nrun = 0, nwait = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_msg_metrics_t *m = &answers[i].u.metrics;
        if (s_metric_find(m, 0, "running_requests") < 0)
            continue;
        s_list_merge(&run, &nrun, (int)slots, s_info(m, "running_lora_adapters"));
        s_list_merge(&wait, &nwait, (int)slots, s_info(m, "waiting_lora_adapters"));
    }
    gw_buf_printf(b,
                  "# HELP vllm:num_requests_waiting requests waiting to be scheduled\n"
                  "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting %llu\n"
                  "# HELP vllm:num_requests_running requests in the running batch (prefilling or decoding)\n"
                  "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %llu\n"
                  "# HELP vllm:kv_cache_usage_perc fraction of KV cache blocks held by requests (1 is full)\n"
                  "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc %.6g\n",
                  (unsigned long long)waiting, (unsigned long long)running, total ? (double)used / (double)total : 0.0);
    gw_buf_printf(b, "# HELP vllm:lora_requests_info adapters of the running and waiting requests; the value is "
                     "the time of this answer (Unix seconds)\n"
                     "# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"%llu\",running_lora_adapters=\"",
                  (unsigned long long)slots);
    gw_prom_label(b, run.d ? run.d : "");
    gw_buf_printf(b, "\",waiting_lora_adapters=\"");
    gw_prom_label(b, wait.d ? wait.d : "");
    gw_buf_printf(b, "\"} %.3f\n", now_s);
    gw_buf_printf(b,
                  "# HELP vllm:cache_config_info the KV cache's configuration, in labels\n"
                  "# TYPE vllm:cache_config_info gauge\n"
                  "vllm:cache_config_info{block_size=\"%llu\",num_gpu_blocks=\"%llu\"} 1\n",
                  (unsigned long long)block_size, (unsigned long long)total);
    gw_buf_free(&run);
    gw_buf_free(&wait);
}
