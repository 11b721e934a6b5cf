// loraserve-trace — list, filter and print trace files written with --record-trace, with the
// messages' own printer, or export them as JSON lines (--json).
//
//   loraserve-trace RUN/trace/scheduler.trace
//   #0     +0.000 ms  meta    {"actor":"scheduler","pid":4242,...}
//   #1     +0.105 ms  socket  #0 router ROUTER ipc:///tmp/.../scheduler.sock
//   #7     +3.220 ms  in#3    #0 router from tokenizer  TokenizedReq v1 g0 rid=7 {...}
//
// A PATH is a trace file or a directory of them (every *.trace, by name; --actor NAME picks
// one). Each line starts with the record number (#N, counted from the file's start, as replay
// reports positions) and the time since the file's first record; inbound messages carry
// their ordinal in the run (in#K: `loraserve-replay --until K-1` pauses just before it).
// Filters select message records: --rid N (the header's rid, or N as any rid inside: a
// StepPlan's items), --type Name (repeatable), --from-ms / --to-ms (time since the first
// record). With a filter, records other than messages are left out.
//
// A torn last record (the actor died mid-write) ends the listing with a warning and exit 0;
// a record that is corrupt before the end also stops it, with exit 1.
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ls_msg.h"
#include "ls_trace.h"

#define S_MAX_SOCKS 256
#define S_MAX_TYPES 32

typedef struct {
    char name[64];
    int is_router;
} s_sock_info_t;

typedef struct {
    int json;
    int has_rid;
    uint64_t rid;
    int types[S_MAX_TYPES];
    int ntypes;
    double from_ms, to_ms;  // to_ms < 0: no bound
    const char *actor;
} s_filter_t;

static const char *s_kind_name(int kind) {
    static const char *names[] = {"?",      "meta",         "socket",       "msg",
                                  "timer",  "signal",       "job",          "input",
                                  "send-failed", "stream-listen", "stream-open", "stream-data",
                                  "stream-close"};
    return kind >= 1 && kind <= LS_TRACE_STREAM_CLOSE ? names[kind] : "?";
}

static int s_filtering(const s_filter_t *f) { return f->has_rid || f->ntypes || f->from_ms > 0 || f->to_ms >= 0; }

// Any "rid" member anywhere in the message's JSON equal to rid.
static int s_json_has_rid(const cJSON *j, uint64_t rid) {
    for (const cJSON *c = j ? j->child : NULL; c; c = c->next) {
        if (c->string && !strcmp(c->string, "rid") &&
            ((cJSON_IsNumber(c) && (uint64_t)c->valuedouble == rid) ||
             (cJSON_IsString(c) && strtoull(c->valuestring, NULL, 10) == rid)))
            return 1;
        if (s_json_has_rid(c, rid))
            return 1;
    }
    return 0;
}

// Does the decoded message pass the filters? (Time is checked by the caller.)
static int s_select(const s_filter_t *f, const ls_msg_t *m) {
    if (f->ntypes) {
        int hit = 0;
        for (int i = 0; i < f->ntypes; i++)
            hit |= m && m->type == f->types[i];
        if (!hit)
            return 0;
    }
    if (!f->has_rid)
        return 1;
    if (!m)
        return 0;
    if (m->rid == f->rid)
        return 1;
    cJSON *j = ls_msg_to_json(m);
    int hit = s_json_has_rid(j, f->rid);
    cJSON_Delete(j);
    return hit;
}

static void s_text(const ls_trace_record_t *rec, const ls_msg_t *m, const char *merr, const s_sock_info_t *socks,
                   uint64_t t0, uint64_t number, uint64_t inbound, const char *prefix) {
    double ms = (double)(rec->t_ns - t0) / 1e6;
    printf("%s#%-5llu +%.3f ms  ", prefix, (unsigned long long)number, ms);
    if (rec->kind == LS_TRACE_META) {
        printf("meta    %.*s\n", (int)rec->frames[0].len, (const char *)rec->frames[0].data);
        return;
    }
    if (rec->kind == LS_TRACE_SOCKET || rec->kind == LS_TRACE_INPUT) {
        printf("%-7s", s_kind_name(rec->kind));
        if (rec->kind == LS_TRACE_SOCKET)
            printf(" #%u", rec->aux);
        for (uint32_t i = 0; i < rec->nframes && i < 3; i++)
            printf(" %.*s", (int)(rec->frames[i].len > 80 ? 80 : rec->frames[i].len), (const char *)rec->frames[i].data);
        if (rec->kind == LS_TRACE_INPUT)
            printf(" (%u frame(s))", rec->nframes ? rec->nframes - 1 : 0);
        printf("\n");
        return;
    }
    if (rec->kind != LS_TRACE_MSG) {
        printf("%-7s %u", s_kind_name(rec->kind), rec->aux);
        if (rec->kind == LS_TRACE_JOB && rec->nframes)
            printf(" (result: %zu bytes)", rec->frames[0].len);
        printf("\n");
        return;
    }
    const s_sock_info_t *s = &socks[rec->sock % S_MAX_SOCKS];
    uint32_t body = s->is_router ? 1 : 0;
    char dir[24];
    if (rec->dir == LS_TRACE_IN)
        snprintf(dir, sizeof dir, "in#%llu", (unsigned long long)inbound);
    else
        snprintf(dir, sizeof dir, "out");
    printf("%-7s #%u %s", dir, rec->sock, s->name);
    if (s->is_router && rec->nframes > 0) {
        const unsigned char *id = rec->frames[0].data;
        printf(" %s ", rec->dir == LS_TRACE_IN ? "from" : "to");
        for (size_t i = 0; i < rec->frames[0].len; i++)
            printf(id[i] >= 0x21 && id[i] < 0x7f ? "%c" : "\\x%02x", id[i]);
    }
    if (m) {
        char line[8192];
        ls_msg_format(m, line, sizeof line);
        printf("  %s", line);
    } else
        printf("  <undecodable: %s>", merr);
    if (rec->nframes > body + 1)
        printf(" +%u bulk frame(s)", rec->nframes - body - 1);
    printf("\n");
}

static void s_json(const ls_trace_record_t *rec, const ls_msg_t *m, const char *merr, const s_sock_info_t *socks,
                   const char *actor, uint64_t number, uint64_t inbound) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "actor", actor);
    cJSON_AddNumberToObject(o, "record", (double)number);
    cJSON_AddNumberToObject(o, "t_ns", (double)rec->t_ns);
    cJSON_AddStringToObject(o, "kind", s_kind_name(rec->kind));
    cJSON_AddNumberToObject(o, "aux", rec->aux);
    if (rec->kind == LS_TRACE_MSG) {
        const s_sock_info_t *s = &socks[rec->sock % S_MAX_SOCKS];
        cJSON_AddStringToObject(o, "dir", rec->dir == LS_TRACE_IN ? "in" : "out");
        if (rec->dir == LS_TRACE_IN)
            cJSON_AddNumberToObject(o, "inbound", (double)inbound);
        cJSON_AddNumberToObject(o, "sock", rec->sock);
        cJSON_AddStringToObject(o, "sock_name", s->name);
        if (m)
            cJSON_AddItemToObject(o, "msg", ls_msg_to_json(m));
        else
            cJSON_AddStringToObject(o, "error", merr);
        cJSON_AddNumberToObject(o, "frames", rec->nframes);
    } else if (rec->kind == LS_TRACE_META && rec->nframes)
        cJSON_AddItemToObject(o, "meta", cJSON_ParseWithLength(rec->frames[0].data, rec->frames[0].len));
    else if ((rec->kind == LS_TRACE_INPUT || rec->kind == LS_TRACE_SOCKET) && rec->nframes) {
        char first[256];
        snprintf(first, sizeof first, "%.*s", (int)rec->frames[0].len, (const char *)rec->frames[0].data);
        cJSON_AddStringToObject(o, rec->kind == LS_TRACE_INPUT ? "key" : "name", first);
    }
    char *text = cJSON_PrintUnformatted(o);
    puts(text);
    free(text);
    cJSON_Delete(o);
}

static int s_dump(const char *path, const s_filter_t *f, int prefixed) {
    char err[512];
    ls_trace_reader_t *r = ls_trace_reader_new(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "loraserve-trace: %s\n", err);
        return 1;
    }
    // The actor's name: the file's, until its meta record says.
    char actor[64], prefix[80] = "";
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    snprintf(actor, sizeof actor, "%.*s", (int)(strstr(base, ".trace") ? strstr(base, ".trace") - base : 63), base);
    if (prefixed)
        snprintf(prefix, sizeof prefix, "%-12s ", actor);
    static s_sock_info_t socks[S_MAX_SOCKS];
    memset(socks, 0, sizeof socks);
    static ls_trace_record_t rec;
    uint64_t t0 = 0, number = 0, inbound = 0;
    int first = 1, rc, status = 0;
    for (; (rc = ls_trace_read(r, &rec, err, sizeof err)) == 1; number++) {
        if (first)
            t0 = rec.t_ns, first = 0;
        if (rec.kind == LS_TRACE_META) {
            inbound = 0;  // a new run: sockets and inbound ordinals start over
            memset(socks, 0, sizeof socks);
        }
        if (rec.kind == LS_TRACE_SOCKET && rec.aux < S_MAX_SOCKS && rec.nframes >= 2) {
            snprintf(socks[rec.aux].name, sizeof socks[rec.aux].name, "%.*s", (int)rec.frames[0].len,
                     (const char *)rec.frames[0].data);
            socks[rec.aux].is_router = rec.frames[1].len == 6 && !memcmp(rec.frames[1].data, "ROUTER", 6);
        }
        int is_in = rec.kind == LS_TRACE_MSG && rec.dir == LS_TRACE_IN;
        inbound += is_in;
        ls_msg_t m, *mp = NULL;
        ls_msgerr_t merr = {0};
        uint32_t body = socks[rec.sock % S_MAX_SOCKS].is_router ? 1 : 0;
        if (rec.kind == LS_TRACE_MSG) {
            if (body >= rec.nframes)
                snprintf(merr.text, sizeof merr.text, "no body frame");
            else if (ls_msg_decode(rec.frames[body].data, rec.frames[body].len, &m, &merr) == 0)
                mp = &m;
        }
        double ms = (double)(rec.t_ns - t0) / 1e6;
        int show = !s_filtering(f) || (rec.kind == LS_TRACE_MSG && ms >= f->from_ms &&
                                       (f->to_ms < 0 || ms <= f->to_ms) && s_select(f, mp));
        if (show && f->json)
            s_json(&rec, mp, merr.text, socks, actor, number, inbound);
        else if (show)
            s_text(&rec, mp, merr.text, socks, t0, number, inbound, prefix);
        if (mp)
            ls_msg_clear(mp);
    }
    if (rc < 0) {
        // A torn last record is the normal trace of a crash (exit 0); corruption is not.
        fprintf(stderr, "loraserve-trace: warning: %s; stopped reading there\n", err);
        status = strstr(err, "torn") ? 0 : 1;
    }
    ls_trace_reader_destroy(&r);
    return status;
}

static int s_by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }
static int s_is_trace(const struct dirent *d) {
    size_t n = strlen(d->d_name);
    return n > 6 && !strcmp(d->d_name + n - 6, ".trace");
}

// A file, or every trace of a directory (only --actor's when given).
static int s_path(const char *path, const s_filter_t *f, int many) {
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return s_dump(path, f, many);
    char file[4096];
    if (f->actor) {
        snprintf(file, sizeof file, "%s/%s.trace", path, f->actor);
        return s_dump(file, f, many);
    }
    struct dirent **list;
    int n = scandir(path, &list, s_is_trace, s_by_name), status = 0;
    if (n < 0) {
        fprintf(stderr, "loraserve-trace: cannot list %s\n", path);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        snprintf(file, sizeof file, "%s/%s", path, list[i]->d_name);
        status |= s_dump(file, f, 1);
        free(list[i]);
    }
    free(list);
    return status;
}

static void s_usage(FILE *out) {
    fprintf(out, "usage: loraserve-trace [--json] [--actor NAME] [--rid N] [--type Name]... [--from-ms T]"
                 " [--to-ms T] PATH...\n"
                 "Prints the records of trace files (PATH: a .trace file, or a directory of them) with the\n"
                 "message printer; --json writes one JSON object per record. Filters keep matching messages:\n"
                 "--rid (the rid or any rid inside), --type (repeatable), --from-ms/--to-ms (since the file's\n"
                 "first record). --actor NAME picks DIR/NAME.trace. Format: docs/trace-format.md.\n");
}

int main(int argc, char **argv) {
    s_filter_t f = {.to_ms = -1};
    const char *paths[256];
    int npaths = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            f.json = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            s_usage(stdout);
            return 0;
        } else if (v && !strcmp(a, "--rid"))
            f.has_rid = 1, f.rid = strtoull(v, NULL, 10), i++;
        else if (v && !strcmp(a, "--type")) {
            int t = ls_msg_type_from_name(v);
            if (t < 0 || f.ntypes == S_MAX_TYPES) {
                fprintf(stderr, "loraserve-trace: unknown message type %s (names as in docs/messages.md)\n", v);
                return 2;
            }
            f.types[f.ntypes++] = t, i++;
        } else if (v && !strcmp(a, "--from-ms"))
            f.from_ms = atof(v), i++;
        else if (v && !strcmp(a, "--to-ms"))
            f.to_ms = atof(v), i++;
        else if (v && !strcmp(a, "--actor"))
            f.actor = v, i++;
        else if (a[0] == '-') {
            s_usage(stderr);
            return 2;
        } else if (npaths < 256)
            paths[npaths++] = a;
    }
    if (!npaths) {
        s_usage(stderr);
        return 2;
    }
    int status = 0;
    for (int i = 0; i < npaths; i++)
        status |= s_path(paths[i], &f, npaths > 1);
    return status;
}
