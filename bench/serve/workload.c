// The request sequence of a run. Each random choice has its own stream derived from the seed
// (prompts, adapters, arrivals), so runs that differ only in the adapter distribution send
// the same prompts at the same times — the comparison the multi-LoRA matrix makes.
#include "workload.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grow.h"

// xoshiro256** seeded by splitmix64: the same sequence on every platform, unlike rand().
typedef struct {
    uint64_t s[4];
} s_rng_t;

static uint64_t s_splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void s_rng_seed(s_rng_t *r, uint64_t seed, uint64_t stream) {
    uint64_t x = seed ^ (stream * 0xD1B54A32D192ED03ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = s_splitmix(&x);
}

static uint64_t s_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t s_rng_next(s_rng_t *r) {
    uint64_t *s = r->s, out = s_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = s_rotl(s[3], 45);
    return out;
}

// Uniform in [0, 1), 53 bits.
static double s_rng_unit(s_rng_t *r) { return (double)(s_rng_next(r) >> 11) * 0x1.0p-53; }

// Uniform integer in [lo, hi] (hi - lo far below 2^32, so the modulo bias is negligible).
static int64_t s_rng_range(s_rng_t *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(s_rng_next(r) % (uint64_t)(hi - lo + 1));
}

enum { S_STREAM_PROMPT = 1, S_STREAM_ADAPTER, S_STREAM_ARRIVAL, S_STREAM_CONSTRAINED };

struct bs_workload_t {
    bs_req_t *reqs;
    size_t n, cap;
    char **names;
    size_t nnames, capnames;
};

int bs_dist_parse(const char *s, bs_dist_t *out) {
    *out = (bs_dist_t){0};
    if (!strcmp(s, "uniform"))
        out->kind = BS_DIST_UNIFORM;
    else if (!strcmp(s, "single"))
        out->kind = BS_DIST_SINGLE;
    else if (!strcmp(s, "base"))
        out->kind = BS_DIST_BASE;
    else if (!strncmp(s, "zipf:", 5)) {
        char *end;
        errno = 0;
        out->kind = BS_DIST_ZIPF;
        out->alpha = strtod(s + 5, &end);
        if (errno || end == s + 5 || *end || !(out->alpha > 0) || !isfinite(out->alpha))
            return -1;
    } else
        return -1;
    return 0;
}

void bs_workload_token_range(uint32_t vocab_size, uint32_t *lo, uint32_t *hi) {
    uint32_t margin = vocab_size / 8 < 1000 ? vocab_size / 8 : 1000;
    *lo = margin;
    *hi = vocab_size - margin;
}

static void s_err(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

static int s_name_index(bs_workload_t *w, const char *name) {
    for (size_t i = 0; i < w->nnames; i++)
        if (!strcmp(w->names[i], name))
            return (int)i;
    if (bs_grow(&w->names, &w->capnames, w->nnames + 1, sizeof *w->names) < 0 || !(w->names[w->nnames] = strdup(name)))
        return -2;
    return (int)w->nnames++;
}

static int s_len(s_rng_t *r, int len, double ratio) {
    int lo = (int)(len * ratio);  // truncated, as SGLang's int(len * ratio)
    if (lo < 1)
        lo = 1;
    return lo >= len ? len : (int)s_rng_range(r, lo, len);
}

// One dataset line into req; adapter is -2 when the line names none (the distribution picks).
static int s_dataset_line(bs_workload_t *w, const char *line, size_t len, int default_output, bs_req_t *req,
                          char *why, size_t cap) {
    cJSON *o = cJSON_ParseWithLength(line, len);
    int rc = -1;
    if (!o || !cJSON_IsObject(o)) {
        s_err(why, cap, o ? "not a JSON object" : "not valid JSON");
        goto out;
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "input_ids");
    const cJSON *olen = cJSON_GetObjectItemCaseSensitive(o, "output_len");
    const cJSON *adapter = cJSON_GetObjectItemCaseSensitive(o, "adapter");
    if (!prompt == !ids) {
        s_err(why, cap, "needs exactly one of \"prompt\" (text) and \"input_ids\" (a list of token ids)");
        goto out;
    }
    if (prompt) {
        if (!cJSON_IsString(prompt) || !*prompt->valuestring) {
            s_err(why, cap, "\"prompt\" must be a non-empty string");
            goto out;
        }
        req->text = strdup(prompt->valuestring);
    } else {
        int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        if (n < 1) {
            s_err(why, cap, "\"input_ids\" must be a non-empty list of token ids");
            goto out;
        }
        req->ids = malloc((size_t)n * sizeof *req->ids);
        req->nids = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, ids) {
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > UINT32_MAX ||
                id->valuedouble != floor(id->valuedouble)) {
                s_err(why, cap, "\"input_ids\"[%zu] is not a token id (a non-negative integer)", req->nids);
                goto out;
            }
            if (req->ids)
                req->ids[req->nids++] = (uint32_t)id->valuedouble;
        }
    }
    if (!req->text && !req->ids) {
        s_err(why, cap, "out of memory");
        goto out;
    }
    req->output_len = default_output;
    if (olen) {
        if (!cJSON_IsNumber(olen) || olen->valuedouble < 1 || olen->valuedouble > 1e9 ||
            olen->valuedouble != floor(olen->valuedouble)) {
            s_err(why, cap, "\"output_len\" must be a positive integer");
            goto out;
        }
        req->output_len = (int)olen->valuedouble;
    }
    req->adapter = -2;
    if (adapter && cJSON_IsNull(adapter))
        req->adapter = -1;
    else if (adapter) {
        if (!cJSON_IsString(adapter) || !*adapter->valuestring) {
            s_err(why, cap, "\"adapter\" must be an adapter's name, or null for the base model");
            goto out;
        }
        if ((req->adapter = s_name_index(w, adapter->valuestring)) < -1) {
            s_err(why, cap, "out of memory");
            goto out;
        }
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

static void s_req_clear(bs_req_t *r) {
    free(r->ids);
    free(r->text);
    *r = (bs_req_t){0};
}

// The dataset's requests in file order, blank lines skipped.
static int s_dataset_read(bs_workload_t *w, const bs_workload_cfg_t *cfg, char *err, size_t errcap) {
    FILE *f = fopen(cfg->dataset, "r");
    if (!f) {
        s_err(err, errcap, "%s: %s", cfg->dataset, strerror(errno));
        return -1;
    }
    char *line = NULL, why[256];
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (size_t lineno = 1; (len = getline(&line, &cap, f)) >= 0; lineno++) {
        size_t i = 0;
        while (i < (size_t)len && strchr(" \t\r\n", line[i]))
            i++;
        if (i == (size_t)len)
            continue;
        if (bs_grow(&w->reqs, &w->cap, w->n + 1, sizeof *w->reqs) < 0) {
            s_err(err, errcap, "out of memory");
            rc = -1;
            break;
        }
        bs_req_t *req = &w->reqs[w->n];
        *req = (bs_req_t){0};
        if (s_dataset_line(w, line, (size_t)len, cfg->output_len, req, why, sizeof why) < 0) {
            s_req_clear(req);
            s_err(err, errcap, "%s:%zu: %s", cfg->dataset, lineno, why);
            rc = -1;
            break;
        }
        w->n++;
    }
    free(line);
    fclose(f);
    if (!rc && !w->n) {
        s_err(err, errcap, "%s: no requests in the file", cfg->dataset);
        rc = -1;
    }
    return rc;
}

// Repeats the dataset's lines cyclically up to n requests (or cuts it to n).
static int s_dataset_fit(bs_workload_t *w, size_t n) {
    size_t lines = w->n;
    if (n <= lines) {
        while (w->n > n)
            s_req_clear(&w->reqs[--w->n]);
        return 0;
    }
    if (bs_grow(&w->reqs, &w->cap, n, sizeof *w->reqs) < 0)
        return -1;
    for (; w->n < n; w->n++) {
        const bs_req_t *src = &w->reqs[w->n % lines];
        bs_req_t *dst = &w->reqs[w->n];
        *dst = *src;
        dst->text = src->text ? strdup(src->text) : NULL;
        dst->ids = src->ids ? malloc(src->nids * sizeof *dst->ids) : NULL;
        if ((src->text && !dst->text) || (src->ids && !dst->ids)) {
            s_req_clear(dst);
            return -1;
        }
        if (src->ids)
            memcpy(dst->ids, src->ids, src->nids * sizeof *dst->ids);
    }
    return 0;
}

// Draws adapter indices 0..n-1 by the distribution: a cumulative table searched by bisection
// (thousands of adapters, one draw per request).
typedef struct {
    bs_dist_t dist;
    size_t n;
    double *cdf;
} s_picker_t;

static int s_picker_init(s_picker_t *p, bs_dist_t dist, size_t n) {
    *p = (s_picker_t){dist, n, NULL};
    if (dist.kind != BS_DIST_ZIPF)
        return 0;
    if (!(p->cdf = malloc(n * sizeof *p->cdf)))
        return -1;
    double sum = 0;
    for (size_t k = 0; k < n; k++)
        p->cdf[k] = sum += pow((double)(k + 1), -dist.alpha);
    for (size_t k = 0; k < n; k++)
        p->cdf[k] /= sum;
    return 0;
}

static int s_picker_draw(const s_picker_t *p, s_rng_t *r) {
    switch (p->dist.kind) {
    case BS_DIST_BASE: return -1;
    case BS_DIST_SINGLE: return 0;
    case BS_DIST_UNIFORM: return (int)s_rng_range(r, 0, (int64_t)p->n - 1);
    case BS_DIST_ZIPF: break;
    }
    double u = s_rng_unit(r);
    size_t lo = 0, hi = p->n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return (int)lo;
}

static int s_random_prompts(bs_workload_t *w, const bs_workload_cfg_t *cfg, char *err, size_t errcap) {
    uint32_t lo, hi;
    bs_workload_token_range(cfg->vocab_size, &lo, &hi);
    if (hi <= lo) {
        s_err(err, errcap, "a vocabulary of %u tokens is too small for random prompts", cfg->vocab_size);
        return -1;
    }
    if (bs_grow(&w->reqs, &w->cap, cfg->num_prompts, sizeof *w->reqs) < 0) {
        s_err(err, errcap, "out of memory");
        return -1;
    }
    memset(w->reqs, 0, cfg->num_prompts * sizeof *w->reqs);
    s_rng_t r;
    s_rng_seed(&r, cfg->seed, S_STREAM_PROMPT);
    for (; w->n < cfg->num_prompts; w->n++) {
        bs_req_t *req = &w->reqs[w->n];
        req->nids = (size_t)s_len(&r, cfg->input_len, cfg->range_ratio);
        req->output_len = s_len(&r, cfg->output_len, cfg->range_ratio);
        req->adapter = -2;
        if (!(req->ids = malloc(req->nids * sizeof *req->ids))) {
            s_err(err, errcap, "out of memory");
            return -1;
        }
        for (size_t i = 0; i < req->nids; i++)
            req->ids[i] = (uint32_t)s_rng_range(&r, lo, (int64_t)hi - 1);
    }
    return 0;
}

bs_workload_t *bs_workload_new(const bs_workload_cfg_t *cfg, const char *const *names, size_t nnames, char *err,
                               size_t errcap) {
    bs_workload_t *w = calloc(1, sizeof *w);
    if (!w) {
        s_err(err, errcap, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < nnames; i++)
        if (s_name_index(w, names[i]) < 0) {
            s_err(err, errcap, "out of memory");
            goto fail;
        }
    if (cfg->dataset) {
        if (s_dataset_read(w, cfg, err, errcap) < 0)
            goto fail;
        if (cfg->num_prompts && s_dataset_fit(w, cfg->num_prompts) < 0) {
            s_err(err, errcap, "out of memory");
            goto fail;
        }
    } else if (s_random_prompts(w, cfg, err, errcap) < 0)
        goto fail;

    // The distribution picks the adapter of every request that does not name its own.
    int need_pick = 0;
    for (size_t i = 0; i < w->n; i++)
        need_pick |= w->reqs[i].adapter == -2;
    if (need_pick && cfg->dist.kind != BS_DIST_BASE && !nnames) {
        s_err(err, errcap, "no adapters to draw from (--adapters, --adapter-prefix, or a server that lists some)");
        goto fail;
    }
    s_picker_t pick;
    bs_dist_t dist = nnames ? cfg->dist : (bs_dist_t){BS_DIST_BASE, 0};
    if (s_picker_init(&pick, dist, nnames) < 0) {
        s_err(err, errcap, "out of memory");
        goto fail;
    }
    s_rng_t ra, rt, rc;
    s_rng_seed(&ra, cfg->seed, S_STREAM_ADAPTER);
    s_rng_seed(&rt, cfg->seed, S_STREAM_ARRIVAL);
    s_rng_seed(&rc, cfg->seed, S_STREAM_CONSTRAINED);
    // Poisson arrivals: exponential gaps; the first request at 0, as SGLang sends it.
    int paced = cfg->request_rate > 0 && isfinite(cfg->request_rate);
    double t = 0;
    for (size_t i = 0; i < w->n; i++) {
        bs_req_t *req = &w->reqs[i];
        int drawn = s_picker_draw(&pick, &ra);  // drawn for every request, so the sequence stays aligned
        if (req->adapter == -2)
            req->adapter = drawn;
        req->arrival_s = t;
        req->constrained = s_rng_unit(&rc) < cfg->constrained_ratio;
        if (paced)
            t += -log(1.0 - s_rng_unit(&rt)) / cfg->request_rate;
    }
    free(pick.cdf);
    return w;
fail:
    bs_workload_destroy(&w);
    return NULL;
}

void bs_workload_destroy(bs_workload_t **pw) {
    bs_workload_t *w = *pw;
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        s_req_clear(&w->reqs[i]);
    free(w->reqs);
    for (size_t i = 0; i < w->nnames; i++)
        free(w->names[i]);
    free(w->names);
    free(w);
    *pw = NULL;
}

size_t bs_workload_size(const bs_workload_t *w) { return w->n; }
const bs_req_t *bs_workload_req(const bs_workload_t *w, size_t i) { return i < w->n ? &w->reqs[i] : NULL; }
size_t bs_workload_adapter_count(const bs_workload_t *w) { return w->nnames; }
const char *bs_workload_adapter_name(const bs_workload_t *w, int adapter) {
    return adapter >= 0 && (size_t)adapter < w->nnames ? w->names[adapter] : NULL;
}
