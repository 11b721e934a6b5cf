// loraserve-bench — the multi-LoRA serving benchmark: SGLang's bench_serving / vLLM's
// benchmark_serving (their flag names and JSON keys) for many adapters. Open loop (Poisson
// arrivals at --request-rate) and/or closed loop (--max-concurrency), adapter popularity
// uniform, Zipf, single or base over --num-adapters, TTFT/TPOT/ITL/E2E percentiles, failures by
// kind, SLO attainment and the server's adapter counters over the run. `--help` lists the flags;
// docs/tools.md describes the report.
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "client.h"
#include "grow.h"
#include "prom.h"
#include "report.h"
#include "workload.h"

enum { EXIT_RUN = 1, EXIT_USAGE = 2 };

static const char s_usage[] =
    "usage: loraserve-bench [flags]\n"
    "\n"
    "server\n"
    "  --base-url URL            the server (default http://HOST:PORT)\n"
    "  --host H, --port P        default 127.0.0.1, 30000\n"
    "  --backend B               loraserve: POST /generate with input_ids and lora_path (default);\n"
    "                            openai: POST /v1/completions with model = the adapter\n"
    "  --model NAME              openai: the base model's name (default: from GET /v1/models)\n"
    "  --api-key KEY             bearer key (default $LORASERVE_API_KEY, else $OPENAI_API_KEY)\n"
    "  --timeout S               a request not answered by then fails as \"timeout\" (default 21600)\n"
    "traffic\n"
    "  --num-prompts N           requests (default 1000; with --dataset: one per line)\n"
    "  --request-rate R|inf      Poisson arrivals at R requests/s; inf sends all at once (default)\n"
    "  --max-concurrency C       requests in flight at most (default no cap)\n"
    "  --warmup-requests W       the first prompt sent W times to the base model first (default 1)\n"
    "  --seed S                  fixes prompts, lengths, adapters and arrivals (default 1)\n"
    "prompts\n"
    "  --input-len N, --output-len N   tokens (default 1024 each); --random-input-len, --random-output-len too\n"
    "  --range-ratio X           lengths uniform in [len*X, len] (default 0; --random-range-ratio too)\n"
    "  --vocab-size V            random ids come from [m, V-m), m = min(1000, V/8) (default: the\n"
    "                            server's GET /get_model_info)\n"
    "  --dataset FILE            JSONL: {\"prompt\": text | \"input_ids\": [...], \"output_len\": n,\n"
    "                            \"adapter\": name | null} per line, instead of random prompts\n"
    "  --disable-ignore-eos      let requests stop at EOS (default: exactly the output length)\n"
    "structured output (a request with it stops where its grammar ends, EOS allowed)\n"
    "  --json-schema FILE        the JSON schema in FILE: response_format on /v1/completions, SGLang's\n"
    "                            json_schema on /generate\n"
    "  --regex RE                the regex RE: guided_regex on /v1/completions, regex on /generate\n"
    "  --structured-output-ratio X  the share of requests that ask for it, drawn by the seed (default 1)\n"
    "adapters\n"
    "  --adapter-dist D          uniform (default), zipf:ALPHA, single (the first adapter) or base\n"
    "  --num-adapters N          how many adapters the distribution covers\n"
    "  --adapter-prefix P        adapters named P-0 ... P-(N-1) (loraserve-make-adapters' names)\n"
    "  --adapters A,B,...        adapters by name; without this and --adapter-prefix, those the\n"
    "                            server lists in GET /v1/models\n"
    "report\n"
    "  --output-file F           append the report to F as one JSON line\n"
    "  --save-outputs F          write every request's input, answer, timings and error to F (JSONL)\n"
    "  --slo-ttft-ms MS, --slo-tpot-ms MS   SLO attainment: the share of requests within both\n"
    "  --disable-stream          ask for whole answers (TTFT and ITL then mean nothing)\n"
    "  --disable-tqdm            no progress line on stderr\n"
    "\n"
    "exit status: 0 the run finished (failed requests are in the report), 1 the run could not be\n"
    "made (server unreachable, warm-up failed), 2 bad flags or dataset\n";

typedef struct {
    const char *base_url, *host, *backend, *model, *api_key, *dataset, *dist_str, *prefix, *adapters;
    const char *output_file, *save_outputs, *json_schema_file, *regex;
    char *json_schema;  // the file's schema as compact JSON
    int port, input_len, output_len, warmup, stream, ignore_eos, progress;
    long num_prompts, num_adapters, max_concurrency;
    double request_rate, range_ratio, slo_ttft_ms, slo_tpot_ms, timeout_s, structured_ratio;
    unsigned long long seed;
    long vocab_size;
    bs_dist_t dist;
} s_opts_t;

static void s_die(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("loraserve-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (code == EXIT_USAGE)
        fputs("usage: loraserve-bench [flags]   (--help lists them)\n", stderr);
    exit(code);
}

static long s_long(const char *flag, const char *v, long min) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < min)
        s_die(EXIT_USAGE, "%s wants an integer >= %ld, not '%s'", flag, min, v);
    return x;
}

static double s_double(const char *flag, const char *v, double min) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= min) || !isfinite(x))
        s_die(EXIT_USAGE, "%s wants a number >= %g, not '%s'", flag, min, v);
    return x;
}

// The whole of a small file (at most 1 MiB: a schema), malloc'd; NULL with errno set.
static char *s_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc((1 << 20) + 1);
    *n = buf ? fread(buf, 1, (1 << 20) + 1, f) : 0;
    int bad = !buf || ferror(f) || *n > (1 << 20);
    fclose(f);
    if (bad) {
        free(buf);
        errno = buf ? EFBIG : ENOMEM;
        return NULL;
    }
    return buf;
}

enum {
    O_BASE_URL = 256, O_HOST, O_PORT, O_BACKEND, O_MODEL, O_API_KEY, O_TIMEOUT, O_NUM_PROMPTS, O_RATE, O_CONC,
    O_WARMUP, O_SEED, O_INPUT_LEN, O_OUTPUT_LEN, O_RANGE, O_VOCAB, O_DATASET, O_NO_EOS, O_DIST, O_NUM_ADAPTERS,
    O_PREFIX, O_ADAPTERS, O_OUTPUT_FILE, O_SAVE, O_SLO_TTFT, O_SLO_TPOT, O_NO_STREAM, O_NO_TQDM, O_HELP,
    O_JSON_SCHEMA, O_REGEX, O_STRUCTURED_RATIO
};

static void s_parse(int argc, char **argv, s_opts_t *o) {
    static const struct option longopts[] = {
        {"base-url", 1, 0, O_BASE_URL},       {"host", 1, 0, O_HOST},
        {"port", 1, 0, O_PORT},               {"backend", 1, 0, O_BACKEND},
        {"model", 1, 0, O_MODEL},             {"api-key", 1, 0, O_API_KEY},
        {"timeout", 1, 0, O_TIMEOUT},         {"num-prompts", 1, 0, O_NUM_PROMPTS},
        {"request-rate", 1, 0, O_RATE},       {"max-concurrency", 1, 0, O_CONC},
        {"warmup-requests", 1, 0, O_WARMUP},  {"seed", 1, 0, O_SEED},
        {"input-len", 1, 0, O_INPUT_LEN},     {"random-input-len", 1, 0, O_INPUT_LEN},
        {"output-len", 1, 0, O_OUTPUT_LEN},   {"random-output-len", 1, 0, O_OUTPUT_LEN},
        {"range-ratio", 1, 0, O_RANGE},       {"random-range-ratio", 1, 0, O_RANGE},
        {"vocab-size", 1, 0, O_VOCAB},        {"dataset", 1, 0, O_DATASET},
        {"disable-ignore-eos", 0, 0, O_NO_EOS}, {"adapter-dist", 1, 0, O_DIST},
        {"num-adapters", 1, 0, O_NUM_ADAPTERS}, {"adapter-prefix", 1, 0, O_PREFIX},
        {"adapters", 1, 0, O_ADAPTERS},       {"output-file", 1, 0, O_OUTPUT_FILE},
        {"save-outputs", 1, 0, O_SAVE},       {"slo-ttft-ms", 1, 0, O_SLO_TTFT},
        {"slo-tpot-ms", 1, 0, O_SLO_TPOT},    {"disable-stream", 0, 0, O_NO_STREAM},
        {"disable-tqdm", 0, 0, O_NO_TQDM},    {"help", 0, 0, O_HELP},
        {"json-schema", 1, 0, O_JSON_SCHEMA}, {"regex", 1, 0, O_REGEX},
        {"structured-output-ratio", 1, 0, O_STRUCTURED_RATIO},
        {0, 0, 0, 0},
    };
    *o = (s_opts_t){.host = "127.0.0.1", .port = 30000, .backend = "loraserve", .input_len = 1024,
                    .output_len = 1024, .warmup = 1, .stream = 1, .ignore_eos = 1, .progress = 1,
                    .num_prompts = -1, .num_adapters = -1, .request_rate = INFINITY, .timeout_s = 21600,
                    .seed = 1, .dist_str = "uniform", .structured_ratio = 1};
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *flag = optind > 1 ? argv[optind - 1] : "?";
        switch (c) {
        case O_BASE_URL: o->base_url = optarg; break;
        case O_HOST: o->host = optarg; break;
        case O_PORT:
            if ((o->port = (int)s_long("--port", optarg, 1)) > 65535)
                s_die(EXIT_USAGE, "--port wants a port number up to 65535, not '%s'", optarg);
            break;
        case O_BACKEND: o->backend = optarg; break;
        case O_MODEL: o->model = optarg; break;
        case O_API_KEY: o->api_key = optarg; break;
        case O_TIMEOUT: o->timeout_s = s_double("--timeout", optarg, 0.001); break;
        case O_NUM_PROMPTS: o->num_prompts = s_long("--num-prompts", optarg, 1); break;
        case O_RATE:
            o->request_rate = !strcmp(optarg, "inf") ? INFINITY : s_double("--request-rate", optarg, 1e-9);
            break;
        case O_CONC: o->max_concurrency = s_long("--max-concurrency", optarg, 1); break;
        case O_WARMUP: o->warmup = (int)s_long("--warmup-requests", optarg, 0); break;
        case O_SEED: o->seed = (unsigned long long)s_long("--seed", optarg, 0); break;
        case O_INPUT_LEN: o->input_len = (int)s_long("--input-len", optarg, 1); break;
        case O_OUTPUT_LEN: o->output_len = (int)s_long("--output-len", optarg, 1); break;
        case O_RANGE:
            o->range_ratio = s_double("--range-ratio", optarg, 0);
            if (o->range_ratio > 1)
                s_die(EXIT_USAGE, "--range-ratio is a fraction in [0, 1], not '%s'", optarg);
            break;
        case O_VOCAB: o->vocab_size = s_long("--vocab-size", optarg, 2); break;
        case O_DATASET: o->dataset = optarg; break;
        case O_NO_EOS: o->ignore_eos = 0; break;
        case O_DIST: o->dist_str = optarg; break;
        case O_NUM_ADAPTERS: o->num_adapters = s_long("--num-adapters", optarg, 1); break;
        case O_PREFIX: o->prefix = optarg; break;
        case O_ADAPTERS: o->adapters = optarg; break;
        case O_OUTPUT_FILE: o->output_file = optarg; break;
        case O_SAVE: o->save_outputs = optarg; break;
        case O_SLO_TTFT: o->slo_ttft_ms = s_double("--slo-ttft-ms", optarg, 1e-9); break;
        case O_SLO_TPOT: o->slo_tpot_ms = s_double("--slo-tpot-ms", optarg, 1e-9); break;
        case O_NO_STREAM: o->stream = 0; break;
        case O_NO_TQDM: o->progress = 0; break;
        case O_JSON_SCHEMA: o->json_schema_file = optarg; break;
        case O_REGEX: o->regex = optarg; break;
        case O_STRUCTURED_RATIO:
            if ((o->structured_ratio = s_double("--structured-output-ratio", optarg, 0)) > 1)
                s_die(EXIT_USAGE, "--structured-output-ratio is a fraction in [0, 1], not '%s'", optarg);
            break;
        case 'h':
        case O_HELP: fputs(s_usage, stdout); exit(0);
        default: s_die(EXIT_USAGE, "unknown flag or missing value: %s", flag);
        }
    }
    if (optind < argc)
        s_die(EXIT_USAGE, "unexpected argument '%s'", argv[optind]);
    if (strcmp(o->backend, "loraserve") && strcmp(o->backend, "openai"))
        s_die(EXIT_USAGE, "--backend is loraserve or openai, not '%s'", o->backend);
    if (bs_dist_parse(o->dist_str, &o->dist) < 0)
        s_die(EXIT_USAGE, "--adapter-dist is uniform, zipf:ALPHA (ALPHA > 0), single or base, not '%s'", o->dist_str);
    if (o->prefix && o->adapters)
        s_die(EXIT_USAGE, "--adapter-prefix and --adapters both name the adapters: give one");
    if (o->prefix && o->num_adapters < 0)
        s_die(EXIT_USAGE, "--adapter-prefix needs --num-adapters");
    if (!o->api_key)
        o->api_key = getenv("LORASERVE_API_KEY") ? getenv("LORASERVE_API_KEY") : getenv("OPENAI_API_KEY");
    if (o->json_schema_file && o->regex)
        s_die(EXIT_USAGE, "--json-schema and --regex both give the structured output: give one");
    if (o->json_schema_file) {
        size_t n;
        char *text = s_read_file(o->json_schema_file, &n);
        cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
        if (!cJSON_IsObject(j) || !(o->json_schema = cJSON_PrintUnformatted(j)))
            s_die(EXIT_USAGE, "--json-schema %s: %s", o->json_schema_file, text ? "not a JSON object" : strerror(errno));
        cJSON_Delete(j);
        free(text);
    }
}

// The adapters requests are drawn from: the list, the prefix's names, or the server's.
typedef struct {
    char **v;
    size_t n, cap;
    const char *source;  // "list", "prefix", "server", or "none"
} s_names_t;

static void s_names_add(s_names_t *names, const char *name, size_t len) {
    if (bs_grow(&names->v, &names->cap, names->n + 1, sizeof *names->v) < 0 || !(names->v[names->n] = strndup(name, len)))
        s_die(EXIT_RUN, "out of memory");
    names->n++;
}

static void s_names_free(s_names_t *names) {
    for (size_t i = 0; i < names->n; i++)
        free(names->v[i]);
    free(names->v);
}

// GET path as JSON; NULL (with the reason in why) when it is not a 200 with JSON.
static cJSON *s_get_json(bs_client_t *c, const char *path, char *why, size_t cap) {
    char *body = NULL;
    size_t n;
    int status = bs_client_get(c, path, &body, &n, why, cap);
    cJSON *j = NULL;
    if (status == 200 && !(j = cJSON_ParseWithLength(body, n)))
        snprintf(why, cap, "GET %s: the answer is not JSON", path);
    else if (status >= 0 && status != 200)
        snprintf(why, cap, "GET %s: HTTP %d%s", path, status,
                 status == 401 ? ", the server wants an API key: --api-key, or $LORASERVE_API_KEY" : "");
    free(body);
    return j;
}

// The base model's name and its adapters, from GET /v1/models: adapters are the entries with a
// parent (SGLang's, vLLM's and our server's way of listing them).
static void s_server_models(bs_client_t *c, s_names_t *names, int want_adapters, char **base) {
    char why[512] = "";
    cJSON *j = s_get_json(c, "/v1/models", why, sizeof why);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data"), *m;
    if (!cJSON_IsArray(data))
        s_die(EXIT_RUN, "cannot list the server's models (%s); name them with --model and --adapters",
              why[0] ? why : "no \"data\" list in GET /v1/models");
    cJSON_ArrayForEach(m, data) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
        const cJSON *parent = cJSON_GetObjectItemCaseSensitive(m, "parent");
        if (!cJSON_IsString(id))
            continue;
        if (cJSON_IsString(parent)) {
            if (want_adapters)
                s_names_add(names, id->valuestring, strlen(id->valuestring));
        } else if (!*base && !(*base = strdup(id->valuestring)))
            s_die(EXIT_RUN, "out of memory");
    }
    cJSON_Delete(j);
}

static void s_resolve_adapters(const s_opts_t *o, bs_client_t *c, s_names_t *names, char **base) {
    int openai = !strcmp(o->backend, "openai");
    int want_server = !o->adapters && !o->prefix && (o->dist.kind != BS_DIST_BASE || o->dataset);
    names->source = "none";
    if (o->adapters) {
        names->source = "list";
        for (const char *p = o->adapters; *p;) {
            size_t len = strcspn(p, ",");
            if (len)
                s_names_add(names, p, len);
            p += len + (p[len] == ',');
        }
    } else if (o->prefix) {
        names->source = "prefix";
        for (long i = 0; i < o->num_adapters; i++) {
            char name[512];
            int len = snprintf(name, sizeof name, "%s-%ld", o->prefix, i);
            s_names_add(names, name, (size_t)len);
        }
    } else if (want_server)
        names->source = "server";
    // OpenAI's API names the base model too.
    if (want_server || (openai && !o->model))
        s_server_models(c, names, want_server, base);
    if (o->model && !(*base = strdup(o->model)))
        s_die(EXIT_RUN, "out of memory");
    if (o->num_adapters > 0 && (size_t)o->num_adapters > names->n)
        s_die(names->n ? EXIT_USAGE : EXIT_RUN, "--num-adapters %ld, but only %zu adapters are named (%s)",
              o->num_adapters, names->n, names->source);
    if (o->num_adapters > 0)
        while (names->n > (size_t)o->num_adapters)
            free(names->v[--names->n]);
    if (o->dist.kind != BS_DIST_BASE && !names->n && !o->dataset)
        s_die(EXIT_RUN, "no adapters to draw requests from: the server lists none; use --adapters, "
                        "--adapter-prefix, or --adapter-dist base");
    if (openai && !*base)
        s_die(EXIT_RUN, "the server names no base model in GET /v1/models; pass --model");
}

// The vocabulary size from SGLang's GET /get_model_info, for random prompt ids.
static long s_server_vocab(bs_client_t *c) {
    char why[512] = "";
    cJSON *j = s_get_json(c, "/get_model_info", why, sizeof why);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "vocab_size");
    long vocab = cJSON_IsNumber(v) && v->valuedouble >= 2 ? (long)v->valuedouble : -1;
    cJSON_Delete(j);
    if (vocab < 0)
        s_die(EXIT_USAGE, "the server does not say its vocabulary size (%s); pass --vocab-size",
              why[0] ? why : "GET /get_model_info has no vocab_size");
    return vocab;
}

static bs_prom_t *s_scrape(bs_client_t *c) {
    char *body = NULL, why[512];
    size_t n;
    int status = bs_client_get(c, "/metrics", &body, &n, why, sizeof why);
    bs_prom_t *p = status == 200 ? bs_prom_parse(body, n) : NULL;
    free(body);
    return p;
}

static double s_cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

typedef struct {
    size_t total;
} s_bar_t;

static void s_progress(void *arg, size_t done, size_t failed, double elapsed_s) {
    const s_bar_t *bar = arg;
    enum { W = 30 };
    char cells[W + 1];
    size_t fill = bar->total ? done * W / bar->total : W;
    for (size_t i = 0; i < W; i++)
        cells[i] = i < fill ? '#' : '.';
    cells[W] = 0;
    fprintf(stderr, "\r%zu/%zu [%s] %5.1f req/s  failed %zu  %.1fs ", done, bar->total, cells,
            elapsed_s > 0 ? (double)done / elapsed_s : 0.0, failed, elapsed_s);
    if (done == bar->total)
        fputc('\n', stderr);
    fflush(stderr);
}

// Every stream is a socket: lift the descriptor limit to its hard cap (SGLang does the same).
static void s_raise_nofile(void) {
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl) && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

static cJSON *s_config_json(const s_opts_t *o, const char *base_url, const char *base, const s_names_t *names,
                            const bs_workload_t *w) {
    cJSON *j = cJSON_CreateObject();
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(j, "tool", "loraserve-bench");
    cJSON_AddStringToObject(j, "date", date);
    cJSON_AddStringToObject(j, "backend", o->backend);
    cJSON_AddStringToObject(j, "base_url", base_url);
    cJSON_AddStringToObject(j, "model", base ? base : "");
    cJSON_AddStringToObject(j, "dataset_name", o->dataset ? "jsonl" : "random");
    if (o->dataset)
        cJSON_AddStringToObject(j, "dataset_path", o->dataset);
    else
        cJSON_AddNullToObject(j, "dataset_path");
    cJSON_AddNumberToObject(j, "num_prompts", (double)bs_workload_size(w));
    if (isfinite(o->request_rate))
        cJSON_AddNumberToObject(j, "request_rate", o->request_rate);
    else
        cJSON_AddStringToObject(j, "request_rate", "inf");  // JSON has no Infinity
    if (o->max_concurrency > 0)
        cJSON_AddNumberToObject(j, "max_concurrency", (double)o->max_concurrency);
    else
        cJSON_AddNullToObject(j, "max_concurrency");
    cJSON_AddNumberToObject(j, "seed", (double)o->seed);
    cJSON_AddNumberToObject(j, "random_input_len", o->input_len);
    cJSON_AddNumberToObject(j, "random_output_len", o->output_len);
    cJSON_AddNumberToObject(j, "random_range_ratio", o->range_ratio);
    cJSON_AddNumberToObject(j, "vocab_size", (double)o->vocab_size);
    cJSON_AddStringToObject(j, "adapter_dist", o->dist_str);
    cJSON_AddNumberToObject(j, "num_adapters", (double)names->n);
    cJSON_AddStringToObject(j, "adapter_source", names->source);
    if (o->prefix)
        cJSON_AddStringToObject(j, "adapter_prefix", o->prefix);
    else
        cJSON_AddNullToObject(j, "adapter_prefix");
    // Distinct adapters the requests name (the base model not counted).
    size_t na = bs_workload_adapter_count(w), distinct = 0;
    char *seen = calloc(na + 1, 1);
    for (size_t i = 0; seen && i < bs_workload_size(w); i++) {
        int a = bs_workload_req(w, i)->adapter;
        if (a >= 0 && !seen[a])
            seen[a] = 1, distinct++;
    }
    free(seen);
    cJSON_AddNumberToObject(j, "distinct_adapters", (double)distinct);
    cJSON_AddNumberToObject(j, "warmup_requests", o->warmup);
    cJSON_AddBoolToObject(j, "stream", o->stream);
    cJSON_AddBoolToObject(j, "ignore_eos", o->ignore_eos);
    if (o->json_schema || o->regex) {
        cJSON_AddStringToObject(j, "structured_output", o->json_schema ? "json_schema" : "regex");
        cJSON_AddNumberToObject(j, "structured_output_ratio", o->structured_ratio);
    } else
        cJSON_AddNullToObject(j, "structured_output");
    if (o->slo_ttft_ms > 0)
        cJSON_AddNumberToObject(j, "slo_ttft_ms", o->slo_ttft_ms);
    else
        cJSON_AddNullToObject(j, "slo_ttft_ms");
    if (o->slo_tpot_ms > 0)
        cJSON_AddNumberToObject(j, "slo_tpot_ms", o->slo_tpot_ms);
    else
        cJSON_AddNullToObject(j, "slo_tpot_ms");
    cJSON_AddNumberToObject(j, "timeout_s", o->timeout_s);
    return j;
}

// Sends the first prompt warmup times to the base model — an adapter loaded here would be
// missing from the run's cold loads. The run is pointless when none of them succeeds.
static void s_warmup(bs_client_t *c, const bs_workload_t *w, const s_opts_t *o) {
    size_t n = (size_t)o->warmup, inflight;
    size_t *order = calloc(n, sizeof *order);
    bs_result_t *res = calloc(n, sizeof *res);
    double dur;
    if (!order || !res)
        s_die(EXIT_RUN, "out of memory");
    bs_run_t run = {order, n, 0, o->max_concurrency > 0 ? (size_t)o->max_concurrency : 0, 1, NULL, NULL};
    if (bs_client_run(c, w, &run, res, &dur, &inflight) < 0)
        s_die(EXIT_RUN, "the HTTP client failed during the warm-up");
    int any = 0;
    for (size_t i = 0; i < n; i++)
        any |= res[i].ok;
    if (!any)
        s_die(EXIT_RUN, "warm-up failed: %s: %s", res[0].err_kind, res[0].err_msg ? res[0].err_msg : "");
    for (size_t i = 0; i < n; i++)
        bs_result_clear(&res[i]);
    free(res);
    free(order);
}

int main(int argc, char **argv) {
    s_opts_t o;
    s_parse(argc, argv, &o);
    s_raise_nofile();
    char base_url[1024], err[1024];
    if (o.base_url) {
        size_t len = strlen(o.base_url);
        while (len && o.base_url[len - 1] == '/')
            len--;
        snprintf(base_url, sizeof base_url, "%.*s", (int)len, o.base_url);
    } else
        snprintf(base_url, sizeof base_url, "http://%s:%d", o.host, o.port);

    bs_client_cfg_t ccfg = {base_url, o.api_key, strcmp(o.backend, "openai") ? BS_API_GENERATE : BS_API_OPENAI,
                            o.stream, o.ignore_eos, o.timeout_s, o.save_outputs != NULL, NULL,
                            o.json_schema, o.regex};
    bs_client_t *c = bs_client_new(&ccfg);
    if (!c)
        s_die(EXIT_RUN, "cannot start libcurl");
    // Any HTTP answer means a server listens; no answer ends the run before it starts.
    char *body = NULL;
    size_t n;
    if (bs_client_get(c, "/health", &body, &n, err, sizeof err) < 0)
        s_die(EXIT_RUN, "cannot reach the server at %s: %s", base_url, err);
    free(body);

    s_names_t names = {0};
    char *base = NULL;
    s_resolve_adapters(&o, c, &names, &base);
    bs_client_set_model(c, base);
    if (!o.dataset && !o.vocab_size)
        o.vocab_size = s_server_vocab(c);

    bs_workload_cfg_t wcfg = {
        .num_prompts = o.num_prompts > 0 ? (size_t)o.num_prompts : o.dataset ? 0 : 1000,
        .input_len = o.input_len,
        .output_len = o.output_len,
        .range_ratio = o.range_ratio,
        .vocab_size = (uint32_t)o.vocab_size,
        .dataset = o.dataset,
        .dist = o.dist,
        .request_rate = o.request_rate,
        .constrained_ratio = o.json_schema || o.regex ? o.structured_ratio : 0,
        .seed = o.seed,
    };
    bs_workload_t *w = bs_workload_new(&wcfg, (const char *const *)names.v, names.n, err, sizeof err);
    if (!w)
        s_die(EXIT_USAGE, "%s", err);
    size_t total = bs_workload_size(w);
    fprintf(stderr, "loraserve-bench: %zu requests to %s%s, %zu adapters (%s), rate %s, concurrency %s\n", total,
            base_url, ccfg.api == BS_API_GENERATE ? "/generate" : "/v1/completions", names.n, o.dist_str,
            isfinite(o.request_rate) ? "Poisson" : "inf", o.max_concurrency > 0 ? "capped" : "not capped");

    if (o.warmup)
        s_warmup(c, w, &o);
    bs_prom_t *before = s_scrape(c);
    bs_result_t *res = calloc(total, sizeof *res);
    if (!res)
        s_die(EXIT_RUN, "out of memory");
    s_bar_t bar = {total};
    bs_run_t run = {NULL, total, isfinite(o.request_rate), o.max_concurrency > 0 ? (size_t)o.max_concurrency : 0, 0,
                    o.progress ? s_progress : NULL, &bar};
    double dur, cpu0 = s_cpu_s();
    size_t max_inflight;
    if (bs_client_run(c, w, &run, res, &dur, &max_inflight) < 0)
        s_die(EXIT_RUN, "the HTTP client failed (out of memory, or libcurl)");
    double cpu = s_cpu_s() - cpu0;
    bs_prom_t *after = s_scrape(c);
    if (!before || !after)
        fprintf(stderr, "loraserve-bench: the server's /metrics could not be read; no adapter counters in the report\n");

    bs_run_data_t d = {w, res, total, dur, o.slo_ttft_ms, o.slo_tpot_ms, before, after, cpu, max_inflight};
    cJSON *report = s_config_json(&o, base_url, base, &names, w);
    if (!report || bs_report_fill(report, &d) < 0)
        s_die(EXIT_RUN, "out of memory");
    bs_report_print(stdout, report);
    int rc = 0;
    if (o.output_file && bs_report_append(o.output_file, report, err, sizeof err) < 0)
        fprintf(stderr, "loraserve-bench: %s\n", err), rc = EXIT_RUN;
    if (o.save_outputs && bs_report_save_outputs(o.save_outputs, &d, err, sizeof err) < 0)
        fprintf(stderr, "loraserve-bench: %s\n", err), rc = EXIT_RUN;

    cJSON_Delete(report);
    for (size_t i = 0; i < total; i++)
        bs_result_clear(&res[i]);
    free(res);
    bs_prom_destroy(&before);
    bs_prom_destroy(&after);
    bs_workload_destroy(&w);
    s_names_free(&names);
    free(base);
    bs_client_destroy(&c);
    return rc;
}
