// ls_replay — replay of a recorded run (--replay, docs/debugging.md): the trace stands in for
// the sockets, the clock, the job thread and the streams. A room of its own because it is the
// other side of every recording the rooms beside it make: what they write live, this reads
// back and checks, and it never touches the outside.
//
// The recorded run is read whole, then consumed in order. Inbound records are dispatched with
// their recorded time; every record the actor's own behaviour produces (sockets opened,
// messages sent, inputs taken, stream writes and closes) must be the next one in the trace.
#define _GNU_SOURCE
#include "ls_actor_impl.h"

__attribute__((noinline)) void ls_replay_break(void) {
    // gdb's breakpoint for loraserve-replay --gdb; the asm keeps the call from being folded away.
    __asm__ volatile("");
}

// A debugger is attached (TracerPid in /proc/self/status is not 0).
static int s_traced(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int pid = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "TracerPid: %d", &pid) == 1)
            break;
    if (f)
        fclose(f);
    return pid != 0;
}

static const char *s_sock_label(const ls_actor_t *self, uint16_t index) {
    if (index >= self->nsocks)
        return "?";
    return self->socks[index]->is_router ? "router" : self->socks[index]->peer;
}

// One message as `out #1 worker-0 [to id]  StepPlan v1 ...`, from its frames.
static void s_describe_msg(const ls_actor_t *self, int is_router, uint16_t sock, ls_trace_dir_t dir,
                           const ls_frame_ref_t *frames, uint32_t n, char *out, size_t cap) {
    size_t o = (size_t)snprintf(out, cap, "%s #%u %s", dir == LS_TRACE_IN ? "in" : "out", sock,
                                s_sock_label(self, sock));
    uint32_t body = is_router ? 1 : 0;
    if (is_router && n > 0 && o < cap)
        o += (size_t)snprintf(out + o, cap - o, " %s %.*s", dir == LS_TRACE_IN ? "from" : "to",
                              (int)frames[0].len, (const char *)frames[0].data);
    ls_msg_t m;
    ls_msgerr_t err;
    if (o >= cap)
        return;
    if (body < n && ls_msg_decode(frames[body].data, frames[body].len, &m, &err) == 0) {
        o += (size_t)snprintf(out + o, cap - o, "  ");
        if (o < cap)
            ls_msg_format(&m, out + o, cap - o);
        ls_msg_clear(&m);
    } else
        snprintf(out + o, cap - o, "  <undecodable: %s>", body < n ? err.text : "no body frame");
}

static void s_describe_rec(const ls_actor_t *self, const s_rec_t *rec, char *out, size_t cap) {
    static const char *kinds[] = {"?",   "meta",  "socket",      "msg",           "timer",       "signal",      "job",
                                  "input", "send-failed", "stream-listen", "stream-open", "stream-data", "stream-close"};
    const char *kind = rec->kind <= LS_TRACE_STREAM_CLOSE ? kinds[rec->kind] : "?";
    if (rec->kind == LS_TRACE_STREAM_DATA || rec->kind == LS_TRACE_STREAM_CLOSE || rec->kind == LS_TRACE_STREAM_OPEN) {
        const char *dir = rec->kind == LS_TRACE_STREAM_OPEN ? "" : rec->dir == LS_TRACE_IN ? " in" : " out";
        size_t len = rec->nframes ? rec->frames[0].len : 0;
        snprintf(out, cap, "%s%s #%u (%zu bytes) \"%.*s\"", kind, dir, rec->aux, len, (int)(len < 4000 ? len : 4000),
                 rec->nframes ? (const char *)rec->frames[0].data : "");
    } else if (rec->kind == LS_TRACE_MSG) {
        int is_router = rec->sock < self->nsocks && self->socks[rec->sock]->is_router;
        s_describe_msg(self, is_router, rec->sock, rec->dir, rec->frames, rec->nframes, out, cap);
    } else if ((rec->kind == LS_TRACE_SOCKET || rec->kind == LS_TRACE_INPUT) && rec->nframes)
        snprintf(out, cap, "%s %.*s", kind, (int)rec->frames[0].len, (const char *)rec->frames[0].data);
    else
        snprintf(out, cap, "%s %u", kind, rec->aux);
}

// Where two messages' JSON differ, as paths with both values (`items[1].token_ids[0]: 7 / 8`),
// at most `room` of them: the one-line printer cuts long arrays, which may hide the difference.
static void s_json_diff(const cJSON *a, const cJSON *b, const char *path, char *out, size_t cap, int *room) {
    if (*room <= 0)
        return;
    if (cJSON_IsObject(a) && cJSON_IsObject(b)) {
        for (const cJSON *x = a->child; x; x = x->next) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", x->string);
            s_json_diff(x, cJSON_GetObjectItemCaseSensitive(b, x->string), sub, out, cap, room);
        }
        return;
    }
    if (cJSON_IsArray(a) && cJSON_IsArray(b) && cJSON_GetArraySize(a) == cJSON_GetArraySize(b)) {
        int i = 0;
        for (const cJSON *x = a->child, *y = b->child; x && y; x = x->next, y = y->next, i++) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
            s_json_diff(x, y, sub, out, cap, room);
        }
        return;
    }
    if (a && b && cJSON_Compare(a, b, 1))
        return;
    char *x = a ? cJSON_PrintUnformatted(a) : NULL, *y = b ? cJSON_PrintUnformatted(b) : NULL;
    size_t o = strlen(out);
    snprintf(out + o, cap - o, "\n  differs:  %s: recorded %.200s, replayed %.200s", path, x ? x : "(absent)",
             y ? y : "(absent)");
    free(x);
    free(y);
    (*room)--;
}

// The first difference between the replayed actor and its recording: print both sides with
// their position, stop at ls_replay_break (a debugger sees the stack that diverged), exit 3.
void actor_replay_diverge(ls_actor_t *self, const char *why, const char *replayed) {
    s_replay_t *r = self->replay;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    char recorded[8192] = "(the recording ends here)";
    if (rec)
        s_describe_rec(self, rec, recorded, sizeof recorded);
    fprintf(stderr,
            "replay: %s DIVERGES from %s at record %llu, after inbound message %llu, t=+%.3f ms: %s\n"
            "  recorded: %s\n"
            "  replayed: %s\n",
            self->name, r->path, (unsigned long long)(rec ? rec->number : r->recs[r->n - 1].number + 1),
            (unsigned long long)r->inbound, (double)(self->now_ns - self->start_ns) / 1e6, why, recorded,
            replayed ? replayed : "(nothing)");
    fflush(stderr);
    ls_replay_break();
    exit(LS_REPLAY_DIVERGED);
}

void actor_replay_socket(ls_actor_t *self, ls_sock_t *sock) {
    s_replay_t *r = self->replay;
    const char *name = sock->is_router ? "router" : sock->peer;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    if (!rec || rec->kind != LS_TRACE_SOCKET || rec->aux != sock->index || rec->nframes < 1 ||
        rec->frames[0].len != strlen(name) || memcmp(rec->frames[0].data, name, rec->frames[0].len)) {
        char replayed[128];
        snprintf(replayed, sizeof replayed, "socket %s (#%u)", name, sock->index);
        actor_replay_diverge(self, "the actor opened a socket the recording did not", replayed);
    }
    r->pos++;
}

static int s_frames_equal(const ls_frame_ref_t *a, const ls_frame_ref_t *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

// Bodies equal as bytes, or decoded except for `measured` fields (schema.msg).
static int s_bodies_equal(const ls_frame_ref_t *a, const ls_frame_ref_t *b) {
    if (s_frames_equal(a, b))
        return 1;
    ls_msg_t x, y;
    if (ls_msg_decode(a->data, a->len, &x, NULL) < 0)
        return 0;
    if (ls_msg_decode(b->data, b->len, &y, NULL) < 0) {
        ls_msg_clear(&x);
        return 0;
    }
    int same = ls_msg_equal_unmeasured(&x, &y);
    ls_msg_clear(&x);
    ls_msg_clear(&y);
    return same;
}

// A message the replayed actor sends: it must be the next recorded record. 0, or -1 when the
// recorded send failed (the actor sees the same failure). *bytes becomes the recorded size:
// a `measured` field's encoding may differ in length, and bytes_out (which GetMetrics
// reports) must count what the recording sent.
int actor_replay_out(ls_actor_t *self, ls_sock_t *sock, zmsg_t *zm, size_t *bytes) {
    s_replay_t *r = self->replay;
    ls_frame_ref_t frames[LS_TRACE_MAX_FRAMES];
    uint32_t n = 0;
    for (zframe_t *f = zmsg_first(zm); f && n < LS_TRACE_MAX_FRAMES; f = zmsg_next(zm))
        frames[n++] = (ls_frame_ref_t){zframe_data(f), zframe_size(f)};
    if (r->pos >= r->n && (r->torn || !self->stopping)) {
        // The recording was cut (the file torn, or the actor killed mid-event): what the actor
        // goes on to send was never recorded, so there is nothing to compare.
        r->unrecorded++;
        return 0;
    }
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    const char *why = NULL;
    if (!rec || rec->kind != LS_TRACE_MSG || rec->dir != LS_TRACE_OUT)
        why = "the actor sent a message where the recording has none";
    else if (rec->sock != sock->index)
        why = "the actor sent on another socket";
    else if (rec->nframes != n)
        why = "the messages have different numbers of frames";
    else {
        uint32_t body = sock->is_router ? 1 : 0;
        for (uint32_t i = 0; i < n && !why; i++)
            if (i == body ? !s_bodies_equal(&rec->frames[i], &frames[i]) : !s_frames_equal(&rec->frames[i], &frames[i]))
                why = i == body ? "the messages differ" : i < body ? "the messages go to different peers"
                                                                  : "the messages' bulk frames differ";
    }
    if (why) {
        char replayed[16384];
        s_describe_msg(self, sock->is_router, sock->index, LS_TRACE_OUT, frames, n, replayed, 8192);
        uint32_t body = sock->is_router ? 1 : 0;
        ls_msg_t x, y;
        if (rec && rec->kind == LS_TRACE_MSG && body < n && body < rec->nframes &&
            ls_msg_decode(rec->frames[body].data, rec->frames[body].len, &x, NULL) == 0) {
            if (ls_msg_decode(frames[body].data, frames[body].len, &y, NULL) == 0) {
                cJSON *jx = ls_msg_to_json(&x), *jy = ls_msg_to_json(&y);
                int room = 4;
                s_json_diff(jx, jy, "", replayed, sizeof replayed, &room);
                cJSON_Delete(jx);
                cJSON_Delete(jy);
                ls_msg_clear(&y);
            }
            ls_msg_clear(&x);
        }
        actor_replay_diverge(self, why, replayed);
    }
    *bytes = 0;
    for (uint32_t i = 0; i < rec->nframes; i++)
        *bytes += rec->frames[i].len;
    r->pos++;
    if (r->pos < r->n && r->recs[r->pos].kind == LS_TRACE_SEND_FAILED) {
        errno = (int)r->recs[r->pos].aux;
        r->pos++;
        return -1;
    }
    return 0;
}

// A write or close of a stream: it must be the next recorded record.
void actor_replay_stream_out(ls_actor_t *self, ls_trace_kind_t kind, uint32_t id, const void *data, size_t len) {
    s_replay_t *r = self->replay;
    if (r->pos >= r->n && (r->torn || !self->stopping)) {
        r->unrecorded++;  // a cut recording, as for messages
        return;
    }
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    const char *why = NULL;
    if (!rec || (rec->kind != LS_TRACE_STREAM_DATA && rec->kind != LS_TRACE_STREAM_CLOSE) || rec->dir != LS_TRACE_OUT)
        why = kind == LS_TRACE_STREAM_DATA ? "the actor wrote to a stream where the recording did not"
                                           : "the actor closed a stream where the recording did not";
    else if (rec->aux != id)
        why = "the actor used another connection";
    else if (rec->kind != kind)
        why = kind == LS_TRACE_STREAM_DATA ? "the actor wrote where the recording closed" : "the actor closed where the recording wrote";
    else if (kind == LS_TRACE_STREAM_DATA && !s_frames_equal(&rec->frames[0], &(ls_frame_ref_t){data, len}))
        why = "the bytes written differ";
    if (why) {
        char replayed[8192];
        if (kind == LS_TRACE_STREAM_DATA)
            snprintf(replayed, sizeof replayed, "stream-data out #%u (%zu bytes) \"%.*s\"", id, len,
                     (int)(len < 4000 ? len : 4000), (const char *)data);
        else
            snprintf(replayed, sizeof replayed, "stream-close out #%u", id);
        actor_replay_diverge(self, why, replayed);
    }
    r->pos++;
}

int actor_replay_listen(ls_actor_t *self) {
    s_replay_t *r = self->replay;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    if (!rec || rec->kind != LS_TRACE_STREAM_LISTEN)
        actor_replay_diverge(self, "the actor listens where the recording did not", "stream-listen");
    r->pos++;
    return (int)rec->aux;
}

// A recorded stream event from outside: a connection opened, bytes read, the client gone.
static void s_replay_stream_in(ls_actor_t *self, const s_rec_t *rec) {
    char why[160];
    if (!self->listening) {
        snprintf(why, sizeof why, "connection %u has an event, but the actor listens nowhere", rec->aux);
        actor_replay_diverge(self, why, NULL);
    }
    ls_stream_t *s = rec->kind == LS_TRACE_STREAM_OPEN ? NULL : actor_stream_find(self, rec->aux);
    if (rec->kind != LS_TRACE_STREAM_OPEN && !s) {
        snprintf(why, sizeof why, "connection %u has an event, but the actor closed it", rec->aux);
        actor_replay_diverge(self, why, NULL);
    }
    self->replay->pos++;
    self->now_ns = rec->t_ns;
    const ls_stream_def_t *def = &self->stream_def;
    if (rec->kind == LS_TRACE_STREAM_OPEN) {
        s = actor_stream_new(self, rec->aux, -1);
        self->next_stream_id = rec->aux;
        def->on_open(self, s, self->stream_arg);
    } else if (rec->kind == LS_TRACE_STREAM_DATA) {
        def->on_data(self, s, rec->nframes ? rec->frames[0].data : "", rec->nframes ? rec->frames[0].len : 0,
                     self->stream_arg);
    } else {
        char text[256];
        snprintf(text, sizeof text, "%.*s", rec->nframes ? (int)rec->frames[0].len : 0,
                 rec->nframes ? (const char *)rec->frames[0].data : "");
        def->on_close(self, s, text, self->stream_arg);
        actor_stream_free(s);
    }
}

int ls_actor_replaying(const ls_actor_t *self) { return self->replay != NULL; }

int ls_actor_input(ls_actor_t *self, const char *key, zmsg_t **frames_p) {
    if (self->trace) {
        ls_frame_ref_t frames[LS_TRACE_MAX_FRAMES];
        uint32_t n = 0;
        frames[n++] = (ls_frame_ref_t){key, strlen(key)};
        for (zframe_t *f = zmsg_first(*frames_p); f && n < LS_TRACE_MAX_FRAMES; f = zmsg_next(*frames_p))
            frames[n++] = (ls_frame_ref_t){zframe_data(f), zframe_size(f)};
        if (ls_trace_write(self->trace, LS_TRACE_INPUT, LS_TRACE_IN, 0, 0, self->now_ns, frames, n) < 0)
            ls_actor_count(self, "trace_write_errors", 1);
    }
    if (!self->replay)
        return 0;
    s_replay_t *r = self->replay;
    const s_rec_t *rec = r->pos < r->n ? &r->recs[r->pos] : NULL;
    if (!rec || rec->kind != LS_TRACE_INPUT || rec->nframes < 1 || rec->frames[0].len != strlen(key) ||
        memcmp(rec->frames[0].data, key, rec->frames[0].len)) {
        char replayed[160];
        snprintf(replayed, sizeof replayed, "input %s", key);
        actor_replay_diverge(self, "the actor took an input the recording does not have here", replayed);
    }
    zmsg_destroy(frames_p);
    *frames_p = zmsg_new();
    for (uint32_t i = 1; i < rec->nframes; i++)
        zmsg_addmem(*frames_p, rec->frames[i].data, rec->frames[i].len);
    r->pos++;
    return 0;
}

void actor_replay_destroy(s_replay_t **self_p) {
    s_replay_t *self = *self_p;
    if (!self)
        return;
    for (size_t i = 0; i < self->n; i++) {
        for (uint32_t k = 0; k < self->recs[i].nframes; k++)
            free((void *)self->recs[i].frames[k].data);
        free(self->recs[i].frames);
    }
    free(self->recs);
    free(self->path);
    free(self);
    *self_p = NULL;
}

// Read run `run` (1-based; 0: the last) of the trace file: its meta record and what follows
// up to the next meta record. NULL (logged) when the file or the run cannot be read.
s_replay_t *actor_replay_load(const char *path, int run, uint64_t until) {
    char err[512];
    ls_trace_reader_t *reader = ls_trace_reader_new(path, err, sizeof err);
    if (!reader) {
        ls_error(0, "replay: %s", err);
        return NULL;
    }
    s_replay_t *self = calloc(1, sizeof *self);
    self->path = strdup(path);
    self->until = until;
    static ls_trace_record_t rec;  // 64 KiB of frame refs: not on the stack
    size_t cap = 0;
    int runs = 0, rc;
    uint64_t number = 0;
    while ((rc = ls_trace_read(reader, &rec, err, sizeof err)) == 1) {
        if (rec.kind == LS_TRACE_META) {
            runs++;
            if (run == 0 || runs == run) {  // a later run replaces the one kept so far
                for (size_t i = 0; i < self->n; i++) {
                    for (uint32_t k = 0; k < self->recs[i].nframes; k++)
                        free((void *)self->recs[i].frames[k].data);
                    free(self->recs[i].frames);
                }
                self->n = 0;
            }
        }
        if (runs > 0 && (run == 0 || runs == run)) {
            if (self->n == cap) {
                cap = cap ? cap * 2 : 1024;
                self->recs = realloc(self->recs, cap * sizeof *self->recs);
            }
            s_rec_t *r = &self->recs[self->n++];
            *r = (s_rec_t){.kind = rec.kind, .dir = rec.dir, .sock = rec.sock, .aux = rec.aux, .t_ns = rec.t_ns,
                           .nframes = rec.nframes, .number = number};
            r->frames = calloc(rec.nframes + 1, sizeof *r->frames);
            for (uint32_t k = 0; k < rec.nframes; k++) {
                void *copy = malloc(rec.frames[k].len + 1);
                memcpy(copy, rec.frames[k].data, rec.frames[k].len);
                r->frames[k] = (ls_frame_ref_t){copy, rec.frames[k].len};
            }
        }
        number++;
    }
    ls_trace_reader_destroy(&reader);
    if (rc < 0) {
        ls_warn(0, "replay: %s; replaying up to there", err);
        self->torn = 1;
    }
    if (self->n == 0) {
        ls_error(0, "replay: %s has %d run(s), not run %d", path, runs, run);
        actor_replay_destroy(&self);
    }
    return self;
}

// The recorded start: the meta record's time is the actor's start time, its pid the pid that
// Ready reports.
int actor_replay_begin(ls_actor_t *self) {
    s_replay_t *r = self->replay;
    const s_rec_t *meta = &r->recs[0];
    cJSON *json = meta->nframes ? cJSON_ParseWithLength(meta->frames[0].data, meta->frames[0].len) : NULL;
    const cJSON *name = cJSON_GetObjectItem(json, "actor"), *pid = cJSON_GetObjectItem(json, "pid"),
                *version = cJSON_GetObjectItem(json, "schema_version");
    int ok = cJSON_IsString(name) && cJSON_IsNumber(pid) && cJSON_IsNumber(version);
    if (!ok)
        ls_error(0, "replay: %s: the run's meta record is not the runtime's", r->path);
    else if (strcmp(name->valuestring, self->name) != 0) {
        ls_error(0, "replay: %s is the trace of %s, not of %s (give --name %s)", r->path, name->valuestring,
                 self->name, name->valuestring);
        ok = 0;
    } else if (version->valueint != LS_SCHEMA_VERSION)
        ls_warn(0, "replay: recorded with message schema %d, replaying with %d", version->valueint, LS_SCHEMA_VERSION);
    if (ok) {
        self->pid = pid->valueint;
        self->start_ns = self->now_ns = meta->t_ns;
        r->pos = 1;
    }
    cJSON_Delete(json);
    return ok ? 0 : -1;
}

static ls_timer_t *s_timer_find(ls_actor_t *self, uint32_t id) {
    for (ls_timer_t *t = self->timers; t; t = t->next)
        if (t->id == id)
            return t;
    return NULL;
}

// Drive the actor from the trace: the replay's counterpart of ev_run.
void actor_replay_run(ls_actor_t *self) {
    s_replay_t *r = self->replay;
    char why[160];
    while (r->pos < r->n && !self->stopping) {
        const s_rec_t *rec = &r->recs[r->pos];
        if (rec->kind == LS_TRACE_META)
            break;  // the next run
        if (rec->kind == LS_TRACE_MSG && rec->dir == LS_TRACE_IN) {
            if (r->until && r->inbound == r->until) {
                fprintf(stderr,
                        "replay: %s paused after %llu inbound messages, before record %llu (t=+%.3f ms); pid %d\n",
                        self->name, (unsigned long long)r->inbound, (unsigned long long)rec->number,
                        (double)(rec->t_ns - self->start_ns) / 1e6, (int)getpid());
                // Without a debugger, wait for one: gdb -p PID, then `continue` goes on.
                if (!s_traced()) {
                    fprintf(stderr, "replay: waiting for a debugger: gdb -p %d (SIGCONT resumes)\n", (int)getpid());
                    raise(SIGSTOP);
                }
                ls_replay_break();
            }
            if (rec->sock >= self->nsocks) {
                snprintf(why, sizeof why, "a message arrives on socket #%u, which the actor never opened", rec->sock);
                actor_replay_diverge(self, why, NULL);
            }
            r->pos++;
            r->inbound++;
            zmsg_t *zm = zmsg_new();
            for (uint32_t i = 0; i < rec->nframes; i++)
                zmsg_addmem(zm, rec->frames[i].data, rec->frames[i].len);
            actor_handle(self->socks[rec->sock], &zm, rec->t_ns);
        } else if (rec->kind == LS_TRACE_TIMER) {
            ls_timer_t *t = s_timer_find(self, rec->aux);
            if (!t) {
                snprintf(why, sizeof why, "timer %u fires in the recording, but the actor has no such timer",
                         rec->aux);
                actor_replay_diverge(self, why, NULL);
            }
            r->pos++;
            self->now_ns = rec->t_ns;
            t->fn(self, t, t->arg);
        } else if (rec->kind == LS_TRACE_JOB) {
            s_job_t *job = self->jobs;
            if (!job || job->id != rec->aux) {
                snprintf(why, sizeof why, "job %u completes in the recording; the actor's next job is %s%u", rec->aux,
                         job ? "" : "none, ", job ? job->id : 0);
                actor_replay_diverge(self, why, NULL);
            }
            if (job->result && (rec->nframes != 1 || rec->frames[0].len != job->result_size)) {
                snprintf(why, sizeof why, "job %u's recorded result is not %zu bytes (another build?)", job->id,
                         job->result_size);
                actor_replay_diverge(self, why, NULL);
            }
            r->pos++;
            self->jobs = job->next;
            if (!self->jobs)
                self->jobs_tail = NULL;
            // A recorded result stands for what the work read; other work (an adapter's weights,
            // which are model files) runs again, here, where the recording completed it.
            if (job->result)
                memcpy(job->result, rec->frames[0].data, job->result_size);
            else
                job->work(job->arg);
            self->now_ns = rec->t_ns;
            if (!self->stopping)
                job->done(self, job->arg);
            free(job);
        } else if ((rec->kind == LS_TRACE_STREAM_OPEN || rec->kind == LS_TRACE_STREAM_DATA ||
                    rec->kind == LS_TRACE_STREAM_CLOSE) &&
                   rec->dir == LS_TRACE_IN) {
            s_replay_stream_in(self, rec);
        } else if (rec->kind == LS_TRACE_SIGNAL) {
            r->pos++;
            self->now_ns = rec->t_ns;
            ls_actor_shutdown(self, rec->aux == SIGINT ? "SIGINT" : "SIGTERM");
        } else
            actor_replay_diverge(self, rec->kind == LS_TRACE_MSG || rec->kind == LS_TRACE_STREAM_DATA
                                       ? "the recording sent this, the actor did not"
                                                             : "the recording has this here, the actor did not do it",
                             NULL);
    }
    if (r->pos < r->n && r->recs[r->pos].kind != LS_TRACE_META)
        actor_replay_diverge(self, "the actor stopped; the recording goes on", NULL);
    if (r->unrecorded)
        ls_warn(0, "replay: %d message(s) sent after the recording ends (it was cut short); not compared",
                r->unrecorded);
    fprintf(stderr, "replay: %s matches %s: %llu inbound messages, %zu records, no divergence\n", self->name,
            r->path, (unsigned long long)r->inbound, r->pos);
}

