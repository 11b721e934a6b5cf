// loraserve-trace — read trace files written with --record-trace and print them with the
// messages' own printer, or export them as JSON lines (--json).
//
//   loraserve-trace RUN/trace/scheduler.trace
//   +0.000 ms  meta    {"actor":"scheduler","pid":4242,...}
//   +0.105 ms  socket  #0 router ROUTER ipc:///tmp/.../scheduler.sock
//   +3.220 ms  in  #0 router from tokenizer  TokenizedReq v1 g0 rid=7 {...}
//
// A torn last record (the actor died mid-write) ends the listing with a warning and exit 0;
// a record that is corrupt before the end also stops it, with exit 1.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "ls_msg.h"
#include "ls_trace.h"

#define S_MAX_SOCKS 256

typedef struct {
    char name[64];
    int is_router;
} s_sock_info_t;

static const char *s_kind_name(int kind) {
    static const char *names[] = {"?", "meta", "socket", "msg", "timer", "signal", "job"};
    return kind >= 1 && kind <= 6 ? names[kind] : "?";
}

static void s_text(const ls_trace_record_t *rec, const s_sock_info_t *socks, uint64_t t0) {
    double ms = (double)(rec->t_ns - t0) / 1e6;
    if (rec->kind == LS_TRACE_META) {
        printf("+%.3f ms  meta    %.*s\n", ms, (int)rec->frames[0].len, (const char *)rec->frames[0].data);
        return;
    }
    if (rec->kind == LS_TRACE_SOCKET) {
        printf("+%.3f ms  socket  #%u", ms, rec->aux);
        for (uint32_t i = 0; i < rec->nframes; i++)
            printf(" %.*s", (int)rec->frames[i].len, (const char *)rec->frames[i].data);
        printf("\n");
        return;
    }
    if (rec->kind != LS_TRACE_MSG) {
        printf("+%.3f ms  %-6s  %u\n", ms, s_kind_name(rec->kind), rec->aux);
        return;
    }
    const s_sock_info_t *s = &socks[rec->sock % S_MAX_SOCKS];
    uint32_t body = s->is_router ? 1 : 0;
    printf("+%.3f ms  %-3s #%u %s", ms, rec->dir == LS_TRACE_IN ? "in" : "out", rec->sock, s->name);
    if (s->is_router && rec->nframes > 0) {
        const unsigned char *id = rec->frames[0].data;
        printf(" %s ", rec->dir == LS_TRACE_IN ? "from" : "to");
        for (size_t i = 0; i < rec->frames[0].len; i++)
            printf(id[i] >= 0x21 && id[i] < 0x7f ? "%c" : "\\x%02x", id[i]);
    }
    ls_msg_t m;
    ls_msgerr_t err;
    if (body < rec->nframes && ls_msg_decode(rec->frames[body].data, rec->frames[body].len, &m, &err) == 0) {
        char line[4096];
        ls_msg_format(&m, line, sizeof line);
        printf("  %s", line);
        ls_msg_clear(&m);
    } else
        printf("  <undecodable: %s>", body < rec->nframes ? err.text : "no body frame");
    if (rec->nframes > body + 1)
        printf(" +%u bulk frame(s)", rec->nframes - body - 1);
    printf("\n");
}

static void s_json(const ls_trace_record_t *rec, const s_sock_info_t *socks) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "t_ns", (double)rec->t_ns);
    cJSON_AddStringToObject(o, "kind", s_kind_name(rec->kind));
    cJSON_AddNumberToObject(o, "aux", rec->aux);
    if (rec->kind == LS_TRACE_MSG) {
        const s_sock_info_t *s = &socks[rec->sock % S_MAX_SOCKS];
        uint32_t body = s->is_router ? 1 : 0;
        cJSON_AddStringToObject(o, "dir", rec->dir == LS_TRACE_IN ? "in" : "out");
        cJSON_AddNumberToObject(o, "sock", rec->sock);
        cJSON_AddStringToObject(o, "sock_name", s->name);
        ls_msg_t m;
        ls_msgerr_t err;
        if (body < rec->nframes && ls_msg_decode(rec->frames[body].data, rec->frames[body].len, &m, &err) == 0) {
            cJSON_AddItemToObject(o, "msg", ls_msg_to_json(&m));
            ls_msg_clear(&m);
        } else
            cJSON_AddStringToObject(o, "error", body < rec->nframes ? err.text : "no body frame");
        cJSON_AddNumberToObject(o, "frames", rec->nframes);
    } else if (rec->kind == LS_TRACE_META && rec->nframes)
        cJSON_AddItemToObject(o, "meta", cJSON_ParseWithLength(rec->frames[0].data, rec->frames[0].len));
    char *text = cJSON_PrintUnformatted(o);
    puts(text);
    free(text);
    cJSON_Delete(o);
}

static int s_dump(const char *path, int json) {
    char err[512];
    ls_trace_reader_t *r = ls_trace_reader_new(path, err, sizeof err);
    if (!r) {
        fprintf(stderr, "loraserve-trace: %s\n", err);
        return 1;
    }
    static s_sock_info_t socks[S_MAX_SOCKS];
    memset(socks, 0, sizeof socks);
    static ls_trace_record_t rec;
    uint64_t t0 = 0;
    int first = 1, rc, status = 0;
    while ((rc = ls_trace_read(r, &rec, err, sizeof err)) == 1) {
        if (first)
            t0 = rec.t_ns, first = 0;
        if (rec.kind == LS_TRACE_SOCKET && rec.aux < S_MAX_SOCKS && rec.nframes >= 2) {
            snprintf(socks[rec.aux].name, sizeof socks[rec.aux].name, "%.*s", (int)rec.frames[0].len,
                     (const char *)rec.frames[0].data);
            socks[rec.aux].is_router = rec.frames[1].len == 6 && !memcmp(rec.frames[1].data, "ROUTER", 6);
        }
        if (json)
            s_json(&rec, socks);
        else
            s_text(&rec, socks, t0);
    }
    if (rc < 0) {
        // A torn last record is the normal trace of a crash (exit 0); corruption is not.
        fprintf(stderr, "loraserve-trace: warning: %s; stopped reading there\n", err);
        status = strstr(err, "torn") ? 0 : 1;
    }
    ls_trace_reader_destroy(&r);
    return status;
}

int main(int argc, char **argv) {
    int json = 0, status = 0, files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: loraserve-trace [--json] FILE.trace...\n"
                   "Prints every record of each trace file (messages with their printer); --json writes one\n"
                   "JSON object per record. Format: docs/trace-format.md.\n");
            return 0;
        }
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--json")) {
            files++;
            status |= s_dump(argv[i], json);
        }
    if (!files) {
        fprintf(stderr, "usage: loraserve-trace [--json] FILE.trace...\n");
        return 2;
    }
    return status;
}
