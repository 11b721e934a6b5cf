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

void gw_prom_label(gw_buf_t *b, const char *v) {
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            gw_buf_printf(b, "\\%c", *v);
        else if (*v == '\n')
            gw_buf_add(b, "\\n", 2);
        else
            gw_buf_add(b, v, 1);
    }
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
    // The counters, then those read from the clock (busy_us_total …), alike; each name's
    // samples from the first actor that reports it on, typed gauge where that actor says it is
    // one.
    for (size_t i = 0; i < n; i++)
        for (int set = 0; set < 2; set++) {
            char **names;
            size_t nn = s_metric_names(&answers[i].u.metrics, set, &names);
            for (size_t k = 0; k < nn; k++) {
                const char *nm = names[k] ? names[k] : "unnamed";
                bool seen = s_metric_find(&answers[i].u.metrics, set, nm) < (long)k;  // listed twice
                for (size_t j = 0; j < i && !seen; j++)
                    seen = s_metric_find(&answers[j].u.metrics, set, nm) >= 0;
                if (seen)
                    continue;
                char name[128];
                s_prom_name(name, sizeof name, nm);
                if (set == 0 && s_strs_has(&answers[i].u.metrics.gauges, nm))
                    gw_buf_printf(b, "# TYPE loraserve_%s gauge\n", name);
                for (size_t j = i; j < n; j++) {
                    const ls_msg_metrics_t *m = &answers[j].u.metrics;
                    long at = s_metric_find(m, set, nm);
                    if (at < 0)
                        continue;
                    gw_buf_printf(b, "loraserve_%s{actor=\"", name);
                    gw_prom_label(b, m->actor ? m->actor : "?");
                    gw_buf_printf(b, "\"} %llu\n", (unsigned long long)(set ? m->measured_values.v : m->values.v)[at]);
                }
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
