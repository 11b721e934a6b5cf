// loraserve-make-adapters — writes N random PEFT LoRA adapters for a base model, for
// benchmarks and tests at scale (docs/tools.md).
//
//   loraserve-make-adapters --model-path DIR --output DIR --num-adapters N [--ranks 8,16,32,64]
//       [--targets q,k,v,o | all | q_proj,v_proj,...] [--seed S] [--jobs J] ...
//
// Adapter i is OUTPUT/{prefix}-{i} with rank ranks[i % len(ranks)], so a rank list gives an
// exact, deterministic mix; its values depend only on (seed, i), so any --jobs and any split
// by --start give the same bytes (tools/make_adapters/adapter_gen.h says how they are drawn).
// One thread per adapter in flight generates it straight into the output dtype in one buffer
// and writes it with the engine's safetensors writer. OUTPUT/adapters.jsonl lists the
// adapters this run wrote, one JSON object a line.
//
// Exit status: 0; 2 for a bad flag or flag value; 1 when the model's config.json, the output
// directory or the disk fails. Each failure is one sentence on stderr.
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "adapter_gen.h"
#include "ls_flags.h"
#include "model_config.h"

#define S_PROG "loraserve-make-adapters"
#define S_MAX_RANKS 64
#define S_MAX_RANK 65536
#define S_DEFAULT_B_SCALE "0.5"
#define S_UNSET INT_MIN // --num-adapters has no default

typedef struct {
    char *model_path, *output, *ranks, *targets, *dtype, *prefix;
    int num_adapters, seed, start, jobs, overwrite, use_rslora, quiet;
    double lora_alpha, alpha_ratio, b_scale;
} s_opts_t;

// The state the writer threads share. Adapter k of this run is index start + k.
typedef struct {
    const s_opts_t *o;
    const mkad_spec_t *spec;
    const int *ranks;
    int nranks;
    const char *out_dir;
    size_t buf_bytes; // the largest adapter's tensors: one buffer per thread
    atomic_long next;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running;           // threads not yet finished
    long done;             // complete adapters
    size_t bytes;          // their bytes on disk
    size_t *adapter_bytes; // per adapter of this run; 0 until it is complete
    bool failed;
    int err_no;
    char err[1024];
} s_run_t;

// Exit statuses: a bad flag or flag value; a failure of the model, the output or the disk.
#define S_USAGE 2
#define S_FAILED 1

// Says one sentence on stderr and returns status (S_USAGE or S_FAILED).
static int s_error(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_error(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, S_PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return status;
}

// A byte count as "%.1f %s" arguments: MB below a GB, GB above.
#define S_SIZE(b) ((b) < 1e9 ? (b) / 1e6 : (b) / 1e9), ((b) < 1e9 ? "MB" : "GB")

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// "8,16,32" into ranks. 0, or S_USAGE (said).
static int s_parse_ranks(const char *text, int *ranks, int *n)
{
    *n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long r = strtol(p, &end, 10);
        if (end == p || errno || r <= 0 || r > S_MAX_RANK || (*end && *end != ','))
            return s_error(S_USAGE,
                           "--ranks \"%s\" is not a comma-separated list of positive ranks (at most %d)",
                           text, S_MAX_RANK);
        if (*n == S_MAX_RANKS)
            return s_error(S_USAGE, "--ranks lists more than %d ranks", S_MAX_RANKS);
        ranks[(*n)++] = (int)r;
        if (!*end)
            return 0;
        p = end + 1;
    }
}

// "q,k,v,o", "all" or full names ("q_proj,v_proj") into a target mask. 0, or S_USAGE (said).
static int s_parse_targets(const char *text, unsigned *mask)
{
    static const char *const short_names[LS_TARGET_COUNT] = {"q", "k", "v", "o", "gate", "up", "down"};
    *mask = 0;
    if (!strcmp(text, "all")) {
        *mask = (1u << LS_TARGET_COUNT) - 1;
        return 0;
    }
    char *copy = strdup(text), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int t = ls_target_from_name(tok);
        for (int s = 0; t < 0 && s < LS_TARGET_COUNT; s++)
            if (!strcmp(tok, short_names[s]))
                t = s;
        if (t < 0) {
            int rc = s_error(S_USAGE,
                             "--targets: unknown target \"%s\" (use q,k,v,o,gate,up,down, their _proj "
                             "names, or all)",
                             tok);
            free(copy);
            return rc;
        }
        *mask |= 1u << t;
    }
    free(copy);
    if (!*mask)
        return s_error(S_USAGE, "--targets \"%s\" names no target", text);
    return 0;
}

// "bf16" (or "bfloat16"), "f16", "f32" into dtype. 0, or S_USAGE (said).
static int s_parse_dtype(const char *text, ls_dtype_t *dtype)
{
    static const struct {
        const char *name;
        ls_dtype_t dtype;
    } names[] = {{"bf16", LS_DTYPE_BF16}, {"bfloat16", LS_DTYPE_BF16}, {"f16", LS_DTYPE_F16},
                 {"fp16", LS_DTYPE_F16},  {"float16", LS_DTYPE_F16},   {"f32", LS_DTYPE_F32},
                 {"fp32", LS_DTYPE_F32},  {"float32", LS_DTYPE_F32}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(text, names[i].name)) {
            *dtype = names[i].dtype;
            return 0;
        }
    return s_error(S_USAGE, "--dtype \"%s\" is not one of bf16, f16, f32", text);
}

// The flag values that need no model: 0, or the exit status of a usage error.
static int s_check_opts(const s_opts_t *o)
{
    if (!o->model_path || !o->output)
        return s_error(S_USAGE, "--model-path and --output are required (see --help)");
    if (o->num_adapters == S_UNSET)
        return s_error(S_USAGE, "--num-adapters is required (see --help)");
    if (o->num_adapters <= 0)
        return s_error(S_USAGE, "--num-adapters must be a positive number of adapters, got %d",
                       o->num_adapters);
    if (o->start < 0 || (long)o->start + o->num_adapters > INT_MAX)
        return s_error(S_USAGE, "--start must be 0 or more, with --start + --num-adapters below %d", INT_MAX);
    if (o->jobs < 0)
        return s_error(S_USAGE, "--jobs must be 0 (one per online CPU) or more, got %d", o->jobs);
    if (!*o->prefix || strchr(o->prefix, '/') || o->prefix[0] == '.' || strlen(o->prefix) > 64)
        return s_error(S_USAGE,
                       "--prefix \"%s\" must be a plain file name (no '/', not starting with '.', at most "
                       "64 characters)",
                       o->prefix);
    if (!(o->lora_alpha >= 0) || !isfinite(o->lora_alpha) || !(o->alpha_ratio >= 0) ||
        !isfinite(o->alpha_ratio))
        return s_error(S_USAGE, "--lora-alpha and --alpha-ratio must be positive numbers");
    if (o->lora_alpha > 0 && o->alpha_ratio > 0)
        return s_error(S_USAGE,
                       "give --lora-alpha (one alpha for every rank) or --alpha-ratio (alpha = X × r), "
                       "not both");
    if (!(o->b_scale > 0) || !isfinite(o->b_scale))
        return s_error(S_USAGE,
                       "--b-scale must be a positive number (0 would make every adapter a no-op), got %g",
                       o->b_scale);
    return 0;
}

// A rank above a target's smaller dimension is no longer low rank: refused (usage).
static int s_check_ranks(const ls_model_config_t *cfg, unsigned mask, const int *ranks, int nranks)
{
    for (int t = 0; t < LS_TARGET_COUNT; t++) {
        if (!(mask & (1u << t)))
            continue;
        int in, out;
        ls_model_config_target_dims(cfg, (ls_target_t)t, &in, &out);
        int dim = in < out ? in : out;
        for (int k = 0; k < nranks; k++)
            if (ranks[k] > dim)
                return s_error(S_USAGE,
                               "--ranks: rank %d is larger than %s's smaller dimension %d in this model "
                               "(%d -> %d); use a rank of at most %d",
                               ranks[k], ls_target_name((ls_target_t)t), dim, in, out, dim);
    }
    return 0;
}

// B's values must stay finite and nonzero in the dtype: f16 tops out at 65504 and flushes
// below 6e-8, bf16 and f32 span 1e±38. 0, or S_USAGE (said).
static int s_check_b_range(const mkad_spec_t *spec, const int *ranks, int nranks)
{
    double lo = spec->dtype == LS_DTYPE_F16 ? 1e-3 : 1e-30, hi = spec->dtype == LS_DTYPE_F16 ? 1e4 : 1e30;
    for (int k = 0; k < nranks; k++) {
        double b = mkad_b_bound(spec, ranks[k]);
        if (!(b >= lo && b <= hi))
            return s_error(S_USAGE,
                           "with --b-scale %g and lora_alpha %g, B's values at rank %d reach %g, which %s "
                           "does not hold well; use a --b-scale or --lora-alpha nearer the defaults",
                           spec->b_scale, mkad_alpha(spec, ranks[k]), ranks[k], b, ls_dtype_name(spec->dtype));
    }
    return 0;
}

// mkdir -p. 0, or -1 with errno set.
static int s_mkdirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return errno = ENAMETOOLONG, -1;
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    if (mkdir(buf, 0755) < 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (stat(buf, &st) < 0)
        return -1;
    return S_ISDIR(st.st_mode) ? 0 : (errno = ENOTDIR, -1);
}

static void s_adapter_name(const s_opts_t *o, long k, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s-%ld", o->prefix, (long)o->start + k);
}

static int s_adapter_rank(const s_run_t *r, long k)
{
    return r->ranks[(r->o->start + k) % r->nranks];
}

// Refuses to replace adapters without --overwrite, and to start what the disk cannot hold.
// 0, or the exit status.
static int s_check_output(const s_run_t *r)
{
    const s_opts_t *o = r->o;
    long existing = 0, first = -1;
    double need = 0, freed = 0;
    for (long k = 0; k < o->num_adapters; k++) {
        char name[128], path[PATH_MAX + 160];
        struct stat st;
        s_adapter_name(o, k, name, sizeof name);
        snprintf(path, sizeof path, "%s/%s", r->out_dir, name);
        if (lstat(path, &st) == 0) {
            if (first < 0)
                first = k;
            existing++;
            freed += (double)mkad_dir_bytes(path);
        }
        need += (double)mkad_disk_bytes(r->spec, s_adapter_rank(r, k));
    }
    if (existing && !o->overwrite) {
        char name[128];
        s_adapter_name(o, first, name, sizeof name);
        return s_error(
            S_FAILED,
            "%s/%s already exists (%ld of the %d adapter names are taken); pass --overwrite to replace "
            "them, or choose another --output, --prefix or --start",
            r->out_dir, name, existing, o->num_adapters);
    }
    struct statvfs vfs;
    if (statvfs(r->out_dir, &vfs) == 0) {
        double avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
        if (need - freed > avail)
            return s_error(
                S_FAILED,
                "%s has %.1f %s free but the %d adapters need about %.1f %s; free space or write fewer "
                "or smaller adapters (--num-adapters, --ranks, --targets)",
                r->out_dir, S_SIZE(avail), o->num_adapters, S_SIZE(need - freed));
    }
    return 0;
}

// Records how adapter k ended (rc 0: complete, bytes on disk); the first failure stops the run.
static void s_record(s_run_t *r, long k, int rc, size_t bytes, int err_no, const char *err)
{
    pthread_mutex_lock(&r->mu);
    if (rc == 0) {
        r->adapter_bytes[k] = bytes;
        r->done++;
        r->bytes += bytes;
    } else {
        if (!r->failed) {
            r->failed = true;
            r->err_no = err_no;
            snprintf(r->err, sizeof r->err, "%s", err);
        }
        atomic_store(&r->stop, true);
    }
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void *s_worker(void *arg)
{
    s_run_t *r = arg;
    void *buf = malloc(r->buf_bytes);
    if (!buf) {
        char err[128];
        snprintf(err, sizeof err, "out of memory for a %.1f MB adapter buffer (try fewer --jobs)",
                 r->buf_bytes / 1e6);
        s_record(r, -1, -1, 0, ENOMEM, err);
    }
    while (buf && !atomic_load(&r->stop)) {
        long k = atomic_fetch_add(&r->next, 1);
        if (k >= r->o->num_adapters)
            break;
        char name[128], err[1024];
        size_t bytes = 0;
        int err_no = 0;
        s_adapter_name(r->o, k, name, sizeof name);
        int rc = mkad_write(r->spec, (long)r->o->start + k, s_adapter_rank(r, k), r->out_dir, name,
                            r->o->overwrite, buf, &bytes, &err_no, err, sizeof err);
        s_record(r, k, rc, bytes, err_no, err);
    }
    free(buf);
    pthread_mutex_lock(&r->mu);
    r->running--;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

// One JSON line per complete adapter, in index order, into OUT/adapters.jsonl (through a
// temporary name, so a reader never sees a partial list). 0, or -1 with the reason on stderr.
static int s_write_jsonl(const s_run_t *r)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.adapters.jsonl.tmp", r->out_dir);
    snprintf(path, sizeof path, "%s/adapters.jsonl", r->out_dir);
    FILE *fp = fopen(tmp, "w");
    bool ok = fp != NULL;
    for (long k = 0; ok && k < r->o->num_adapters; k++) {
        if (!r->adapter_bytes[k])
            continue;
        char name[128], dir[PATH_MAX + 160];
        int rank = s_adapter_rank(r, k);
        s_adapter_name(r->o, k, name, sizeof name);
        snprintf(dir, sizeof dir, "%s/%s", r->out_dir, name);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "name", name);
        cJSON_AddStringToObject(j, "path", dir);
        cJSON_AddNumberToObject(j, "rank", rank);
        cJSON_AddItemToObject(j, "targets", mkad_target_list(r->spec->target_mask));
        cJSON_AddNumberToObject(j, "lora_alpha", mkad_alpha(r->spec, rank));
        cJSON_AddNumberToObject(j, "bytes", (double)r->adapter_bytes[k]);
        char *line = cJSON_PrintUnformatted(j);
        cJSON_Delete(j);
        ok = line && fputs(line, fp) >= 0 && fputc('\n', fp) != EOF;
        free(line);
    }
    if (fp && fclose(fp) != 0)
        ok = false;
    if (ok && rename(tmp, path) == 0)
        return 0;
    fprintf(stderr, S_PROG ": cannot write %s: %s\n", path, strerror(errno));
    unlink(tmp);
    return -1;
}

static void s_progress(const s_run_t *r, double t0, const char *end)
{
    double dt = s_now() - t0;
    fprintf(stderr, "\r" S_PROG ": %ld/%d adapters, %.1f MB, %.0f MB/s%s", r->done, r->o->num_adapters,
            r->bytes / 1e6, dt > 0 ? r->bytes / 1e6 / dt : 0.0, end);
}

// Writes every adapter on `jobs` threads, showing progress. 0, or -1 with r->err set.
static int s_run(s_run_t *r, int jobs)
{
    pthread_t *threads = calloc((size_t)jobs, sizeof *threads);
    double t0 = s_now(), shown = t0;
    int started = 0;
    // held while starting, so no thread can count itself finished before it is counted
    pthread_mutex_lock(&r->mu);
    while (threads && started < jobs && pthread_create(&threads[started], NULL, s_worker, r) == 0)
        started++;
    r->running = started;
    if (!started) {
        r->failed = true;
        snprintf(r->err, sizeof r->err, "cannot start a writer thread");
    }
    while (r->running > 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &until);
        if (!r->o->quiet && s_now() - shown >= 0.25) {
            s_progress(r, t0, "");
            shown = s_now();
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (int j = 0; j < started; j++)
        pthread_join(threads[j], NULL);
    free(threads);
    double dt = s_now() - t0;
    if (!r->o->quiet) {
        s_progress(r, t0, "\n");
        if (!r->failed)
            fprintf(stderr,
                    S_PROG ": wrote %ld adapters (%.1f MB) to %s in %.2f s: %.0f MB/s, %.1f adapters/s, "
                           "%d jobs\n",
                    r->done, r->bytes / 1e6, r->out_dir, dt, dt > 0 ? r->bytes / 1e6 / dt : 0.0,
                    dt > 0 ? r->done / dt : 0.0, started);
    }
    return r->failed ? -1 : 0;
}

// --jobs 0 means one per online CPU; never more than the adapters, nor more buffers than a
// quarter of the machine's memory holds.
static int s_jobs(const s_opts_t *o, size_t buf_bytes)
{
    long jobs = o->jobs ? o->jobs : sysconf(_SC_NPROCESSORS_ONLN);
    if (jobs < 1)
        jobs = 1;
    if (jobs > o->num_adapters)
        jobs = o->num_adapters;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0 && buf_bytes > 0) {
        double fit = (double)pages * (double)page / 4 / (double)buf_bytes;
        if (jobs > fit)
            jobs = fit >= 1 ? (long)fit : 1;
    }
    return (int)jobs;
}

// Writes the adapters the checked flags describe into out_dir, then adapters.jsonl, and says
// how it ended. 0, or S_FAILED.
static int s_write_all(const s_opts_t *o, const mkad_spec_t *spec, const int *ranks, int nranks,
                       const char *out_dir)
{
    int max_rank = 0, rc;
    for (int k = 0; k < nranks; k++)
        max_rank = ranks[k] > max_rank ? ranks[k] : max_rank;
    s_run_t r = {.o = o,
                 .spec = spec,
                 .ranks = ranks,
                 .nranks = nranks,
                 .out_dir = out_dir,
                 .buf_bytes = mkad_tensor_bytes(spec, max_rank)};
    if ((rc = s_check_output(&r)))
        return rc;
    if (!(r.adapter_bytes = calloc((size_t)o->num_adapters, sizeof *r.adapter_bytes)))
        return s_error(S_FAILED, "out of memory");
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    int run = s_run(&r, s_jobs(o, r.buf_bytes));
    int listed = s_write_jsonl(&r);
    if (run < 0) {
        bool full = r.err_no == ENOSPC || r.err_no == EDQUOT;
        rc = s_error(S_FAILED, "%s%s; %ld of %d adapters are complete%s, none is half written; %s",
                     full ? "the disk is full: " : "", r.err, r.done, o->num_adapters,
                     listed == 0 ? " (listed in adapters.jsonl)" : "",
                     full ? "free space or write fewer adapters, then run again with --overwrite"
                          : "fix the cause and run again with --overwrite");
    } else if (listed < 0) {
        rc = S_FAILED;
    }
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    free(r.adapter_bytes);
    return rc;
}

// Checks everything that can be checked before writing (flags, the model's config.json, the
// output directory), then writes. Returns the exit status.
static int s_main(const s_opts_t *o)
{
    int rc = s_check_opts(o);
    if (rc)
        return rc;
    int ranks[S_MAX_RANKS], nranks;
    unsigned mask;
    if ((rc = s_parse_ranks(o->ranks, ranks, &nranks)) || (rc = s_parse_targets(o->targets, &mask)))
        return rc;
    char err[1024];
    ls_model_config_t cfg;
    if (ls_model_config_load(o->model_path, &cfg, err, sizeof err) < 0)
        return s_error(S_FAILED, "cannot read the model's config.json: %s", err);
    mkad_spec_t spec = {
        .cfg = &cfg,
        .base_model = o->model_path,
        .target_mask = mask,
        .dtype = cfg.torch_dtype,
        .seed = (uint64_t)(uint32_t)o->seed,
        .lora_alpha = o->lora_alpha,
        .alpha_ratio = o->alpha_ratio > 0 ? o->alpha_ratio : 2.0,
        .use_rslora = o->use_rslora,
        .b_scale = o->b_scale,
    };
    if ((o->dtype && (rc = s_parse_dtype(o->dtype, &spec.dtype))) ||
        (rc = s_check_ranks(&cfg, mask, ranks, nranks)) || (rc = s_check_b_range(&spec, ranks, nranks)))
        return rc;
    if (s_mkdirs(o->output) < 0)
        return s_error(S_FAILED, "cannot create the output directory %s: %s", o->output, strerror(errno));
    char out_dir[PATH_MAX];
    if (!realpath(o->output, out_dir))
        return s_error(S_FAILED, "cannot resolve the output directory %s: %s", o->output, strerror(errno));
    if (access(out_dir, W_OK | X_OK) < 0)
        return s_error(S_FAILED, "the output directory %s is not writable: %s", out_dir, strerror(errno));
    return s_write_all(o, &spec, ranks, nranks, out_dir);
}

int main(int argc, char **argv)
{
    s_opts_t o = {.num_adapters = S_UNSET};
    ls_flag_t flags[] = {
        LS_FLAG_STR("model-path", &o.model_path, NULL,
                    "base model directory; its config.json gives the shapes (required)"),
        LS_FLAG_STR("output", &o.output, NULL,
                    "directory to write the adapters into, created if missing (required)"),
        LS_FLAG_INT("num-adapters", &o.num_adapters, NULL, "number of adapters to write (required)"),
        LS_FLAG_STR("ranks", &o.ranks, "8,16,32,64", "LoRA ranks; adapter i gets ranks[i % count]"),
        LS_FLAG_STR("targets", &o.targets, "q,k,v,o",
                    "target modules: q,k,v,o,gate,up,down, their _proj names, or all"),
        LS_FLAG_INT("seed", &o.seed, "0", "seed of the values: the same seed gives the same bytes"),
        LS_FLAG_DOUBLE("lora-alpha", &o.lora_alpha, NULL,
                       "lora_alpha of every adapter (default: --alpha-ratio × r)"),
        LS_FLAG_DOUBLE("alpha-ratio", &o.alpha_ratio, NULL,
                       "lora_alpha = X × r (default: 2, so alpha = 2×r)"),
        LS_FLAG_BOOL("use-rslora", &o.use_rslora,
                     "write use_rslora: true (scaling alpha/sqrt(r) instead of alpha/r)"),
        LS_FLAG_STR("dtype", &o.dtype, NULL,
                    "tensor dtype, bf16, f16 or f32 (default: the model's torch_dtype)"),
        LS_FLAG_STR("prefix", &o.prefix, "lora", "adapter names are PREFIX-0, PREFIX-1, ..."),
        LS_FLAG_INT("start", &o.start, "0", "index of the first adapter (PREFIX-START ...)"),
        LS_FLAG_INT("jobs", &o.jobs, "0",
                    "adapters written at once, one thread each (0: one per online CPU, "
                    "fewer when their buffers would pass a quarter of RAM)"),
        LS_FLAG_BOOL("overwrite", &o.overwrite, "replace adapters that already exist"),
        LS_FLAG_DOUBLE("b-scale", &o.b_scale, S_DEFAULT_B_SCALE,
                       "size of each adapter's effect: a target's LoRA output has about X times the rms "
                       "of its input"),
        LS_FLAG_BOOL("quiet", &o.quiet, "no progress line and no summary on stderr"),
        LS_FLAG_END,
    };
    ls_flag_t *tables[] = {flags, NULL};
    char err[512];
    int rc = ls_flags_parse(tables, argc, argv, err, sizeof err);
    if (rc == 1) {
        ls_flags_usage(
            tables, S_PROG,
            "Writes N random PEFT LoRA adapters for a base model: OUTPUT/PREFIX-I/adapter_config.json +\n"
            "adapter_model.safetensors in PEFT's layout, and OUTPUT/adapters.jsonl listing them.\n"
            "Exit status 0; 2 for a bad flag; 1 when the model, the output directory or the disk fails.");
        rc = 0;
    } else if (rc < 0) {
        rc = s_error(S_USAGE, "%s", err);
    } else {
        rc = s_main(&o);
    }
    ls_flags_free(tables);
    return rc;
}
