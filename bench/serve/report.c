#include "report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "stats.h"

#define S_ADAPTER_PREFIX "loraserve_adapter_"

static const char *s_stat_names[] = {"mean", "median", "std", "p50", "p90", "p95", "p99", "max"};

static void s_add_summary(cJSON *o, const char *metric, double *v, size_t n) {
    bs_summary_t s;
    bs_stats_summarize(v, n, &s);
    const double vals[] = {s.mean, s.median, s.std, s.p50, s.p90, s.p95, s.p99, s.max};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s_%s_ms", s_stat_names[i], metric);
        cJSON_AddNumberToObject(o, key, vals[i]);
    }
}

static double s_tpot(const bs_result_t *r) {
    return r->output_tokens > 1 ? (r->e2e_ms - r->ttft_ms) / (double)(r->output_tokens - 1) : -1;
}

// Each loraserve_adapter_* series' delta over the run (a gauge's value at its end: a level's
// change says nothing), by series, and summed per metric name (without "loraserve_") at the
// top level: adapter_cold_loads and whatever else the server counts.
static void s_add_adapter_metrics(cJSON *o, const bs_prom_t *before, const bs_prom_t *after) {
    if (!before || !after) {
        cJSON_AddNullToObject(o, "adapter_metrics");
        return;
    }
    cJSON *series = cJSON_AddObjectToObject(o, "adapter_metrics");
    cJSON *sums = cJSON_CreateObject();
    for (size_t i = 0; i < bs_prom_size(after); i++) {
        const char *s = bs_prom_series(after, i);
        if (strncmp(s, S_ADAPTER_PREFIX, strlen(S_ADAPTER_PREFIX)))
            continue;
        double b = 0;
        if (!bs_prom_is_gauge(after, s))
            bs_prom_get(before, s, &b);  // a series born during the run started at 0
        double delta = bs_prom_value(after, i) - b;
        cJSON_AddNumberToObject(series, s, delta);
        char name[128];
        size_t len = bs_prom_name_len(s) - strlen("loraserve_");
        snprintf(name, sizeof name, "%.*s", (int)len, s + strlen("loraserve_"));
        cJSON *sum = cJSON_GetObjectItemCaseSensitive(sums, name);
        if (sum)
            cJSON_SetNumberValue(sum, sum->valuedouble + delta);
        else
            cJSON_AddNumberToObject(sums, name, delta);
    }
    // A server counter named like one of the report's own keys is left in adapter_metrics only.
    cJSON *it;
    while ((it = sums->child)) {
        cJSON_DetachItemViaPointer(sums, it);
        if (cJSON_HasObjectItem(o, it->string))
            cJSON_Delete(it);
        else
            cJSON_AddItemToObject(o, it->string, it);
    }
    cJSON_Delete(sums);
}

int bs_report_fill(cJSON *o, const bs_run_data_t *d) {
    size_t n = d->n, completed = 0, nitl = 0, chunks = 0;
    long long in_tokens = 0, out_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        nitl += d->res[i].nitl;
        chunks += d->res[i].chunks;
    }
    double *ttft = malloc((n + 1) * sizeof *ttft), *tpot = malloc((n + 1) * sizeof *tpot);
    double *e2e = malloc((n + 1) * sizeof *e2e), *itl = malloc((nitl + 1) * sizeof *itl);
    if (!ttft || !tpot || !e2e || !itl) {
        free(ttft), free(tpot), free(e2e), free(itl);
        return -1;
    }
    size_t nttft = 0, ntpot = 0, ne2e = 0, slo_met = 0;
    double e2e_sum = 0;
    cJSON *errors = cJSON_CreateObject(), *samples = cJSON_CreateObject();
    nitl = 0;
    for (size_t i = 0; i < n; i++) {
        const bs_result_t *r = &d->res[i];
        if (!r->ok) {
            cJSON *k = cJSON_GetObjectItemCaseSensitive(errors, r->err_kind);
            if (k)
                cJSON_SetNumberValue(k, k->valuedouble + 1);
            else {
                cJSON_AddNumberToObject(errors, r->err_kind, 1);
                cJSON_AddStringToObject(samples, r->err_kind, r->err_msg ? r->err_msg : "");
            }
            continue;
        }
        const bs_req_t *req = bs_workload_req(d->w, i);
        completed++;
        in_tokens += r->prompt_tokens >= 0 ? r->prompt_tokens : (long long)req->nids;
        out_tokens += r->output_tokens;
        if (r->ttft_ms >= 0)
            ttft[nttft++] = r->ttft_ms;
        double t = s_tpot(r);
        if (t >= 0)
            tpot[ntpot++] = t;
        if (r->nitl)
            memcpy(itl + nitl, r->itl_ms, r->nitl * sizeof *itl);
        nitl += r->nitl;
        e2e[ne2e++] = r->e2e_ms;
        e2e_sum += r->e2e_ms;
        slo_met += (d->slo_ttft_ms <= 0 || (r->ttft_ms >= 0 && r->ttft_ms <= d->slo_ttft_ms)) &&
                   (d->slo_tpot_ms <= 0 || t < 0 || t <= d->slo_tpot_ms);
    }
    double dur = d->duration_s > 0 ? d->duration_s : 1e-9;
    cJSON_AddNumberToObject(o, "duration", d->duration_s);
    cJSON_AddNumberToObject(o, "completed", (double)completed);
    cJSON_AddNumberToObject(o, "failed", (double)(n - completed));
    cJSON_AddItemToObject(o, "errors", errors);
    cJSON_AddItemToObject(o, "error_samples", samples);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)in_tokens);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)out_tokens);
    cJSON_AddNumberToObject(o, "request_throughput", (double)completed / dur);
    cJSON_AddNumberToObject(o, "input_throughput", (double)in_tokens / dur);
    cJSON_AddNumberToObject(o, "output_throughput", (double)out_tokens / dur);
    cJSON_AddNumberToObject(o, "total_throughput", (double)(in_tokens + out_tokens) / dur);
    s_add_summary(o, "ttft", ttft, nttft);
    s_add_summary(o, "tpot", tpot, ntpot);
    s_add_summary(o, "itl", itl, nitl);
    s_add_summary(o, "e2e_latency", e2e, ne2e);
    cJSON_AddNumberToObject(o, "concurrency", e2e_sum / 1000.0 / dur);
    // Of every request sent: a failed one misses its SLO.
    if (d->slo_ttft_ms > 0 || d->slo_tpot_ms > 0)
        cJSON_AddNumberToObject(o, "slo_attainment", n ? (double)slo_met / (double)n : 0);
    else
        cJSON_AddNullToObject(o, "slo_attainment");
    s_add_adapter_metrics(o, d->before, d->after);
    cJSON_AddNumberToObject(o, "total_chunks", (double)chunks);
    cJSON_AddNumberToObject(o, "max_inflight", (double)d->max_inflight);
    cJSON_AddNumberToObject(o, "bench_cpu_s", d->cpu_s);
    cJSON_AddNumberToObject(o, "bench_cpu_us_per_request", n ? d->cpu_s * 1e6 / (double)n : 0);
    cJSON_AddNumberToObject(o, "bench_cpu_us_per_chunk", chunks ? d->cpu_s * 1e6 / (double)chunks : 0);
    free(ttft), free(tpot), free(e2e), free(itl);
    return 0;
}

static double s_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

// A config value as text (numbers, strings, null as "not set").
static void s_text(const cJSON *o, const char *key, char *out, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsString(v))
        snprintf(out, cap, "%s", v->valuestring);
    else if (cJSON_IsNumber(v))
        snprintf(out, cap, "%g", v->valuedouble);
    else if (cJSON_IsBool(v))
        snprintf(out, cap, "%s", cJSON_IsTrue(v) ? "yes" : "no");
    else
        snprintf(out, cap, "not set");
}

// A 50-column rule with a centred title, as SGLang's table.
static void s_rule(FILE *f, const char *title, char fill) {
    int len = (int)strlen(title), left = (50 - len) / 2;
    for (int i = 0; i < left; i++)
        fputc(fill, f);
    fputs(title, f);
    for (int i = left + len; i < 50; i++)
        fputc(fill, f);
    fputc('\n', f);
}

void bs_report_print(FILE *f, const cJSON *o) {
    char a[256], b[256];
    s_rule(f, " Serving Benchmark Result ", '=');
    s_text(o, "backend", a, sizeof a);
    fprintf(f, "%-40s %s\n", "Backend:", a);
    s_text(o, "request_rate", a, sizeof a);
    fprintf(f, "%-40s %s\n", "Traffic request rate:", a);
    s_text(o, "max_concurrency", a, sizeof a);
    fprintf(f, "%-40s %s\n", "Max request concurrency:", a);
    s_text(o, "num_adapters", a, sizeof a);
    s_text(o, "adapter_dist", b, sizeof b);
    fprintf(f, "%-40s %s (%s)\n", "Adapters (popularity):", a, b);
    fprintf(f, "%-40s %.0f\n", "Successful requests:", s_num(o, "completed"));
    fprintf(f, "%-40s %.0f\n", "Failed requests:", s_num(o, "failed"));
    fprintf(f, "%-40s %.2f\n", "Benchmark duration (s):", s_num(o, "duration"));
    fprintf(f, "%-40s %.0f\n", "Total input tokens:", s_num(o, "total_input_tokens"));
    fprintf(f, "%-40s %.0f\n", "Total generated tokens:", s_num(o, "total_output_tokens"));
    fprintf(f, "%-40s %.2f\n", "Request throughput (req/s):", s_num(o, "request_throughput"));
    fprintf(f, "%-40s %.2f\n", "Input token throughput (tok/s):", s_num(o, "input_throughput"));
    fprintf(f, "%-40s %.2f\n", "Output token throughput (tok/s):", s_num(o, "output_throughput"));
    fprintf(f, "%-40s %.2f\n", "Total token throughput (tok/s):", s_num(o, "total_throughput"));
    fprintf(f, "%-40s %.2f\n", "Concurrency:", s_num(o, "concurrency"));
    const cJSON *slo = cJSON_GetObjectItemCaseSensitive(o, "slo_attainment");
    if (cJSON_IsNumber(slo))
        fprintf(f, "%-40s %.2f%%\n", "SLO attainment:", slo->valuedouble * 100);
    static const char *const metrics[][2] = {{"e2e_latency", "End-to-End Latency"},
                                             {"ttft", "Time to First Token"},
                                             {"tpot", "Time per Output Token (excl. 1st token)"},
                                             {"itl", "Inter-Token Latency"}};
    static const char *const shown[][2] = {{"mean", "Mean"}, {"median", "Median"}, {"p90", "P90"},
                                           {"p99", "P99"},   {"max", "Max"}};
    for (size_t m = 0; m < sizeof metrics / sizeof *metrics; m++) {
        s_rule(f, metrics[m][1], '-');
        for (size_t s = 0; s < sizeof shown / sizeof *shown; s++) {
            char key[64], label[64];
            snprintf(key, sizeof key, "%s_%s_ms", shown[s][0], metrics[m][0]);
            snprintf(label, sizeof label, "%s %s (ms):", shown[s][1],
                     m == 0 ? "E2E Latency" : m == 1 ? "TTFT" : m == 2 ? "TPOT" : "ITL");
            fprintf(f, "%-40s %.2f\n", label, s_num(o, key));
        }
    }
    const cJSON *errors = cJSON_GetObjectItemCaseSensitive(o, "errors"), *e;
    const cJSON *samples = cJSON_GetObjectItemCaseSensitive(o, "error_samples");
    if (errors && errors->child) {
        s_rule(f, "Errors (by kind)", '-');
        cJSON_ArrayForEach(e, errors) {
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(samples, e->string);
            fprintf(f, "%-40s %.0f  e.g. %.200s\n", e->string, e->valuedouble, cJSON_IsString(msg) ? msg->valuestring : "");
        }
    }
    const cJSON *am = cJSON_GetObjectItemCaseSensitive(o, "adapter_metrics");
    s_rule(f, "Adapter counters (change)", '-');
    if (cJSON_IsObject(am))
        cJSON_ArrayForEach(e, am) fprintf(f, "%-60s %.0f\n", e->string, e->valuedouble);
    else
        fprintf(f, "%-40s\n", "(the server's /metrics could not be read)");
    s_rule(f, "Benchmark client", '-');
    fprintf(f, "%-40s %.1f\n", "CPU per request (us):", s_num(o, "bench_cpu_us_per_request"));
    fprintf(f, "%-40s %.1f\n", "CPU per chunk (us):", s_num(o, "bench_cpu_us_per_chunk"));
    fprintf(f, "%-40s %.0f\n", "Max requests in flight:", s_num(o, "max_inflight"));
    s_rule(f, "", '=');
}

int bs_report_append(const char *path, const cJSON *report, char *err, size_t errcap) {
    char *line = cJSON_PrintUnformatted(report);
    FILE *f = line ? fopen(path, "a") : NULL;
    int rc = f && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
    if (f && fclose(f))
        rc = -1;
    if (rc)
        snprintf(err, errcap, "%s: %s", path, line ? strerror(errno) : "out of memory");
    free(line);
    return rc;
}

static cJSON *s_ids(const uint32_t *ids, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

int bs_report_save_outputs(const char *path, const bs_run_data_t *d, char *err, size_t errcap) {
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errcap, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < d->n && !rc; i++) {
        const bs_req_t *q = bs_workload_req(d->w, i);
        const bs_result_t *r = &d->res[i];
        const char *adapter = bs_workload_adapter_name(d->w, q->adapter);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", (double)i);
        if (adapter)
            cJSON_AddStringToObject(o, "adapter", adapter);
        else
            cJSON_AddNullToObject(o, "adapter");
        if (q->text)
            cJSON_AddStringToObject(o, "prompt", q->text);
        else
            cJSON_AddItemToObject(o, "input_ids", s_ids(q->ids, q->nids));
        cJSON_AddNumberToObject(o, "output_len", q->output_len);
        cJSON_AddBoolToObject(o, "constrained", q->constrained);
        if (r->output_ids)
            cJSON_AddItemToObject(o, "output_ids", s_ids(r->output_ids, r->noutput_ids));
        if (r->text)
            cJSON_AddStringToObject(o, "text", r->text);
        cJSON_AddNumberToObject(o, "prompt_tokens", (double)r->prompt_tokens);
        cJSON_AddNumberToObject(o, "output_tokens", (double)r->output_tokens);
        cJSON_AddNumberToObject(o, "send_ms", r->send_ms);
        cJSON_AddNumberToObject(o, "ttft_ms", r->ttft_ms);
        cJSON_AddNumberToObject(o, "e2e_ms", r->e2e_ms);
        cJSON *itl = cJSON_AddArrayToObject(o, "itl_ms");
        for (size_t k = 0; k < r->nitl; k++)
            cJSON_AddItemToArray(itl, cJSON_CreateNumber(r->itl_ms[k]));
        if (r->ok)
            cJSON_AddNullToObject(o, "error");
        else {
            cJSON *e = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(e, "kind", r->err_kind);
            cJSON_AddStringToObject(e, "message", r->err_msg ? r->err_msg : "");
        }
        char *line = cJSON_PrintUnformatted(o);
        rc = line && fprintf(f, "%s\n", line) > 0 ? 0 : -1;
        free(line);
        cJSON_Delete(o);
    }
    if (fclose(f))
        rc = -1;
    if (rc)
        snprintf(err, errcap, "%s: could not write (%s)", path, strerror(errno));
    return rc;
}
