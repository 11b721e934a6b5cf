// ls_trace — see ls_trace.h and docs/trace-format.md.
#define _GNU_SOURCE
#include "ls_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_HEADER 12        // magic, payload_len, crc
#define S_PAYLOAD_FIXED 24 // kind, dir, sock, aux, t_ns, nframes

struct ls_trace_writer {
    int fd;
    char *path;
};

struct ls_trace_reader {
    FILE *f;
    char *path;
    uint8_t *buf;
    size_t cap;
    uint64_t offset;
};

uint32_t ls_crc32(const void *data, size_t len) {
    static uint32_t table[256];
    static int ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = 1;
    }
    uint32_t c = 0xFFFFFFFFu;
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++)
        c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static void s_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void s_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t s_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t s_get64(const uint8_t *p) { return (uint64_t)s_get32(p) | (uint64_t)s_get32(p + 4) << 32; }

ls_trace_writer_t *ls_trace_writer_new(const char *dir, const char *name, char *err, size_t errlen) {
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create trace directory %s: %s", dir, strerror(errno));
        return NULL;
    }
    ls_trace_writer_t *self = calloc(1, sizeof *self);
    if (!self || asprintf(&self->path, "%s/%s.trace", dir, name) < 0) {
        free(self);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->fd = open(self->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (self->fd < 0) {
        snprintf(err, errlen, "cannot open trace file %s: %s", self->path, strerror(errno));
        free(self->path);
        free(self);
        return NULL;
    }
    return self;
}

void ls_trace_writer_destroy(ls_trace_writer_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_trace_writer_t *self = *self_p;
    close(self->fd);
    free(self->path);
    free(self);
    *self_p = NULL;
}

const char *ls_trace_writer_path(const ls_trace_writer_t *self) { return self->path; }

int ls_trace_write(ls_trace_writer_t *self, ls_trace_kind_t kind, ls_trace_dir_t dir, uint16_t sock,
                   uint32_t aux, uint64_t t_ns, const ls_frame_ref_t *frames, uint32_t nframes) {
    size_t payload = S_PAYLOAD_FIXED;
    for (uint32_t i = 0; i < nframes; i++)
        payload += 4 + frames[i].len;
    if (payload > LS_TRACE_MAX_PAYLOAD || nframes > LS_TRACE_MAX_FRAMES)
        return -1;
    uint8_t *rec = malloc(S_HEADER + payload);
    if (!rec)
        return -1;
    uint8_t *p = rec + S_HEADER;
    p[0] = (uint8_t)kind;
    p[1] = (uint8_t)dir;
    p[2] = (uint8_t)sock;
    p[3] = (uint8_t)(sock >> 8);
    s_put32(p + 4, aux);
    s_put64(p + 8, t_ns);
    s_put32(p + 16, nframes);
    s_put32(p + 20, 0);  // reserved, keeps frames 8-byte aligned in the record
    p += S_PAYLOAD_FIXED;
    for (uint32_t i = 0; i < nframes; i++) {
        s_put32(p, (uint32_t)frames[i].len);
        if (frames[i].len)
            memcpy(p + 4, frames[i].data, frames[i].len);
        p += 4 + frames[i].len;
    }
    s_put32(rec, LS_TRACE_MAGIC);
    s_put32(rec + 4, (uint32_t)payload);
    s_put32(rec + 8, ls_crc32(rec + S_HEADER, payload));
    size_t total = S_HEADER + payload, done = 0;
    while (done < total) {
        ssize_t n = write(self->fd, rec + done, total - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(rec);
            return -1;
        }
        done += (size_t)n;
    }
    free(rec);
    return 0;
}

ls_trace_reader_t *ls_trace_reader_new(const char *path, char *err, size_t errlen) {
    ls_trace_reader_t *self = calloc(1, sizeof *self);
    if (!self) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->f = fopen(path, "rb");
    if (!self->f) {
        snprintf(err, errlen, "cannot open trace file %s: %s", path, strerror(errno));
        free(self);
        return NULL;
    }
    self->path = strdup(path);
    return self;
}

void ls_trace_reader_destroy(ls_trace_reader_t **self_p) {
    if (!self_p || !*self_p)
        return;
    ls_trace_reader_t *self = *self_p;
    fclose(self->f);
    free(self->path);
    free(self->buf);
    free(self);
    *self_p = NULL;
}

int ls_trace_read(ls_trace_reader_t *self, ls_trace_record_t *rec, char *err, size_t errlen) {
    uint8_t head[S_HEADER];
    size_t got = fread(head, 1, S_HEADER, self->f);
    if (got == 0 && feof(self->f))
        return 0;
    const uint64_t at = self->offset;
    if (got < S_HEADER) {
        snprintf(err, errlen, "%s: torn record at byte %llu (header cut short after %zu bytes)",
                 self->path, (unsigned long long)at, got);
        return -1;
    }
    uint32_t magic = s_get32(head), len = s_get32(head + 4), crc = s_get32(head + 8);
    if (magic != LS_TRACE_MAGIC || len < S_PAYLOAD_FIXED || len > LS_TRACE_MAX_PAYLOAD) {
        snprintf(err, errlen, "%s: corrupt record at byte %llu (bad magic or length %u)", self->path,
                 (unsigned long long)at, len);
        return -1;
    }
    if (len > self->cap) {
        uint8_t *buf = realloc(self->buf, len);
        if (!buf) {
            snprintf(err, errlen, "%s: out of memory reading a %u-byte record", self->path, len);
            return -1;
        }
        self->buf = buf;
        self->cap = len;
    }
    got = fread(self->buf, 1, len, self->f);
    if (got < len) {
        snprintf(err, errlen, "%s: torn record at byte %llu (%zu of %u payload bytes)", self->path,
                 (unsigned long long)at, got, len);
        return -1;
    }
    if (ls_crc32(self->buf, len) != crc) {
        snprintf(err, errlen, "%s: record at byte %llu fails its checksum", self->path,
                 (unsigned long long)at);
        return -1;
    }
    const uint8_t *p = self->buf;
    rec->kind = p[0];
    rec->dir = p[1];
    rec->sock = (uint16_t)(p[2] | p[3] << 8);
    rec->aux = s_get32(p + 4);
    rec->t_ns = s_get64(p + 8);
    rec->nframes = s_get32(p + 16);
    rec->offset = at;
    if (rec->nframes > LS_TRACE_MAX_FRAMES) {
        snprintf(err, errlen, "%s: record at byte %llu claims %u frames", self->path,
                 (unsigned long long)at, rec->nframes);
        return -1;
    }
    size_t off = S_PAYLOAD_FIXED;
    for (uint32_t i = 0; i < rec->nframes; i++) {
        if (len - off < 4 || len - off - 4 < s_get32(p + off)) {
            snprintf(err, errlen, "%s: record at byte %llu has frame %u past its end", self->path,
                     (unsigned long long)at, i);
            return -1;
        }
        rec->frames[i].len = s_get32(p + off);
        rec->frames[i].data = p + off + 4;
        off += 4 + rec->frames[i].len;
    }
    self->offset += S_HEADER + len;
    return 1;
}
