// journal — append-only registry journal with replay and compaction (see journal.h).
#define _GNU_SOURCE
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ls_file.h"
#include "ls_log.h"
#include "ls_trace.h"

#define S_HEADER 12

struct journal {
    char *dir, *path, *tmp;
    int fd;
    ls_msg_t *live;  // LoadAdapter records of the registered adapters, in load order
    size_t n_live, cap_live;
    ls_msg_t *gone;  // UnloadAdapter records of names unloaded and not loaded since
    size_t n_gone, cap_gone;
    size_t records;  // in the file
};

static void s_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t s_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// One framed record of m, malloc'd; NULL when m does not encode or is too large.
static uint8_t *s_frame(const ls_msg_t *m, size_t *len) {
    char *body;
    size_t blen;
    if (ls_msg_encode(m, &body, &blen) < 0 || blen > JOURNAL_MAX_RECORD)
        return NULL;
    uint8_t *rec = malloc(S_HEADER + blen);
    if (rec) {
        s_put32(rec, JOURNAL_MAGIC);
        s_put32(rec + 4, (uint32_t)blen);
        s_put32(rec + 8, ls_crc32(body, blen));
        memcpy(rec + S_HEADER, body, blen);
        *len = S_HEADER + blen;
    }
    free(body);
    return rec;
}

// ---------------------------------------------------------------------------------------------
// the live set

static ls_msg_t *s_live_find(journal_t *self, const char *key, bool by_name) {
    for (size_t i = 0; i < self->n_live; i++) {
        const ls_msg_load_adapter_t *la = &self->live[i].u.load_adapter;
        const char *have = by_name ? la->name : la->adapter_id;
        if (have && key && !strcmp(have, key))
            return &self->live[i];
    }
    return NULL;
}

static ls_msg_t *s_gone_find(journal_t *self, const char *name) {
    for (size_t i = 0; i < self->n_gone; i++)
        if (name && !strcmp(self->gone[i].u.unload_adapter.name, name))
            return &self->gone[i];
    return NULL;
}

// Remove m from the set (live or gone) it is in.
static void s_set_remove(ls_msg_t *set, size_t *n, ls_msg_t *m) {
    ls_msg_clear(m);
    size_t i = (size_t)(m - set);
    memmove(m, m + 1, (*n - i - 1) * sizeof *m);
    (*n)--;
}

// Append m (taking its contents) to a set.
static void s_set_add(ls_msg_t **set, size_t *n, size_t *cap, ls_msg_t *m) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        ls_msg_t *v = realloc(*set, *cap * sizeof *v);
        if (!v) {
            ls_error(0, "registry out of memory");
            abort();
        }
        *set = v;
    }
    (*set)[(*n)++] = *m;
    ls_msg_init(m, (ls_msg_type_t)m->type);
}

// Apply one record to the live set (takes m's contents). -1 for a record that is not a
// LoadAdapter or UnloadAdapter with an id.
// An unload leaves its name in the gone set (so a --lora-paths adapter a client unloaded stays
// unloaded across restarts); a later load of the name takes it out.
static int s_live_apply(journal_t *self, ls_msg_t *m) {
    if (m->type == LS_MSG_UNLOAD_ADAPTER && m->u.unload_adapter.adapter_id && m->u.unload_adapter.name) {
        ls_msg_t *have = s_live_find(self, m->u.unload_adapter.adapter_id, false);
        if (have)
            s_set_remove(self->live, &self->n_live, have);
        if (m->u.unload_adapter.dropped) {
            ls_msg_clear(m);
            return 0;
        }
        ls_msg_t *was = s_gone_find(self, m->u.unload_adapter.name);
        if (was)
            s_set_remove(self->gone, &self->n_gone, was);
        s_set_add(&self->gone, &self->n_gone, &self->cap_gone, m);
        return 0;
    }
    if (m->type != LS_MSG_LOAD_ADAPTER || !m->u.load_adapter.adapter_id || !m->u.load_adapter.name) {
        ls_msg_clear(m);
        return -1;
    }
    ls_msg_t *same = s_live_find(self, m->u.load_adapter.name, true);
    if (same) {  // the registry never registers a name twice; should a file say so, the later wins
        ls_warn(0, "journal: %s loaded twice without an unload; keeping the later load", m->u.load_adapter.name);
        s_set_remove(self->live, &self->n_live, same);
    }
    ls_msg_t *was = s_gone_find(self, m->u.load_adapter.name);
    if (was)
        s_set_remove(self->gone, &self->n_gone, was);
    s_set_add(&self->live, &self->n_live, &self->cap_live, m);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// replay

// Is there an intact record at off? Decodes it into m when so.
static bool s_record_at(const uint8_t *buf, size_t len, size_t off, size_t *next, ls_msg_t *m) {
    if (len - off < S_HEADER || s_get32(buf + off) != JOURNAL_MAGIC)
        return false;
    uint32_t plen = s_get32(buf + off + 4);
    if (plen > JOURNAL_MAX_RECORD || plen > len - off - S_HEADER)
        return false;
    const uint8_t *payload = buf + off + S_HEADER;
    if (ls_crc32(payload, plen) != s_get32(buf + off + 8) || ls_msg_decode(payload, plen, m, NULL) < 0)
        return false;
    *next = off + S_HEADER + plen;
    return true;
}

// Name what a damaged stretch at off recorded, when its header is whole and its payload still
// decodes (the checksum failed, so nothing in it is trusted): "the load of NAME from PATH".
static void s_damage_what(const uint8_t *buf, size_t len, size_t off, char *out, size_t cap) {
    snprintf(out, cap, "what it recorded cannot be read");
    if (len - off < S_HEADER || s_get32(buf + off) != JOURNAL_MAGIC)
        return;
    uint32_t plen = s_get32(buf + off + 4);
    ls_msg_t m;
    if (plen > JOURNAL_MAX_RECORD || plen > len - off - S_HEADER || ls_msg_decode(buf + off + S_HEADER, plen, &m, NULL) < 0)
        return;
    if (m.type == LS_MSG_LOAD_ADAPTER && m.u.load_adapter.name)
        snprintf(out, cap, "it seems to record the load of adapter %s from %s", m.u.load_adapter.name,
                 m.u.load_adapter.path ? m.u.load_adapter.path : "?");
    else if (m.type == LS_MSG_UNLOAD_ADAPTER && m.u.unload_adapter.name)
        snprintf(out, cap, "it seems to record the unload of adapter %s", m.u.unload_adapter.name);
    ls_msg_clear(&m);
    for (char *c = out; *c; c++)  // damaged bytes stay out of the log line
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
            *c = '?';
}

// Replay buf; returns the number of damaged stretches skipped.
static int s_replay(journal_t *self, const uint8_t *buf, size_t len) {
    int damaged = 0;
    size_t off = 0;
    while (off < len) {
        ls_msg_t m;
        size_t next;
        if (s_record_at(buf, len, off, &next, &m)) {
            if (s_live_apply(self, &m) < 0) {
                ls_warn(0, "journal %s: record at offset %zu is neither a load nor an unload; skipped", self->path,
                        off);
                damaged++;
            }
            self->records++;
            off = next;
            continue;
        }
        size_t resync = off + 1;
        while (resync < len && !s_record_at(buf, len, resync, &next, &m))
            resync++;
        damaged++;
        char what[600];
        s_damage_what(buf, len, off, what, sizeof what);
        if (resync >= len) {
            // A crash mid-append tears the last record: the change was never answered as done.
            ls_warn(0, "journal %s: torn or corrupt last %zu bytes at offset %zu ignored (%s)", self->path, len - off,
                    off, what);
            break;
        }
        ls_msg_clear(&m);
        ls_error(0, "journal %s: corrupt record of %zu bytes at offset %zu is not restored (%s); the records after it "
                    "are; an adapter it loaded is gone until loaded again (a --lora-paths one loads from its flag)",
                 self->path, resync - off, off, what);
        off = resync;
    }
    return damaged;
}

// Rewrite the file with the live set only.
static int s_compact(journal_t *self) {
    int fd = open(self->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < self->n_live + self->n_gone && rc == 0; i++) {
        size_t len;
        uint8_t *rec = s_frame(i < self->n_live ? &self->live[i] : &self->gone[i - self->n_live], &len);
        rc = rec ? ls_file_write_all(fd, rec, len) : -1;
        free(rec);
    }
    if (rc == 0)
        rc = fsync(fd);
    close(fd);
    if (rc == 0)
        rc = rename(self->tmp, self->path);
    if (rc == 0)
        rc = ls_file_sync_dir(self->dir);
    if (rc < 0) {
        ls_error(0, "journal: cannot rewrite %s: %s", self->path, strerror(errno));
        unlink(self->tmp);
        return -1;
    }
    if (self->fd >= 0)
        close(self->fd);
    self->fd = open(self->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    self->records = self->n_live + self->n_gone;
    return self->fd < 0 ? -1 : 0;
}

static uint8_t *s_read_file(const char *path, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? calloc(1, 1) : NULL;
    uint8_t *buf = NULL;
    size_t cap = 0;
    for (;;) {
        if (*len == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            uint8_t *b = realloc(buf, cap);
            if (!b)
                break;
            buf = b;
        }
        size_t n = fread(buf + *len, 1, cap - *len, f);
        *len += n;
        if (n == 0)
            break;
    }
    bool bad = ferror(f) || *len == cap;
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    return buf;
}

// Before a damaged file is rewritten clean, its bytes are kept beside it (the last damaged one
// only), so that what the damage took can still be looked for.
static void s_keep_damaged(const journal_t *self, const uint8_t *buf, size_t len) {
    char *copy;
    if (asprintf(&copy, "%s.damaged", self->path) < 0)
        return;
    int fd = open(copy, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ls_file_write_all(fd, buf, len) < 0 || fsync(fd) < 0)
        ls_error(0, "journal: cannot keep the damaged journal as %s: %s", copy, strerror(errno));
    else
        ls_warn(0, "journal: the damaged journal is kept as %s", copy);
    if (fd >= 0)
        close(fd);
    free(copy);
}

journal_t *journal_open(const char *dir, ls_msg_t **live, size_t *n_live, char *err, size_t errlen) {
    *live = NULL;
    *n_live = 0;
    journal_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->fd = -1;
    if (asprintf(&self->path, "%s/%s", dir, JOURNAL_FILE) < 0 || asprintf(&self->tmp, "%s.tmp", self->path) < 0 ||
        !(self->dir = strdup(dir))) {
        journal_destroy(&self);
        return NULL;
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create the state directory %s: %s", dir, strerror(errno));
        journal_destroy(&self);
        return NULL;
    }
    size_t len;
    uint8_t *buf = s_read_file(self->path, &len);
    if (!buf) {
        snprintf(err, errlen, "cannot read the journal %s: %s", self->path, strerror(errno));
        journal_destroy(&self);
        return NULL;
    }
    int damaged = s_replay(self, buf, len);
    if (damaged)
        s_keep_damaged(self, buf, len);
    free(buf);
    // Damage is rewritten away so that appends follow intact records; a bloated file is trimmed.
    if (damaged || self->records > 2 * (self->n_live + self->n_gone) + JOURNAL_SLACK) {
        if (s_compact(self) < 0) {
            snprintf(err, errlen, "cannot rewrite the journal %s: %s", self->path, strerror(errno));
            journal_destroy(&self);
            return NULL;
        }
    } else {
        self->fd = open(self->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (self->fd < 0 || ls_file_sync_dir(dir) < 0) {
            snprintf(err, errlen, "cannot open the journal %s: %s", self->path, strerror(errno));
            journal_destroy(&self);
            return NULL;
        }
    }
    ls_info(0, "journal %s: %zu records, %zu adapters registered", self->path, self->records, self->n_live);
    *live = calloc(self->n_live ? self->n_live : 1, sizeof **live);
    if (!*live) {
        journal_destroy(&self);
        return NULL;
    }
    for (size_t i = 0; i < self->n_live; i++)
        if (ls_msg_copy(&(*live)[i], &self->live[i]) < 0) {
            for (size_t k = 0; k < i; k++)
                ls_msg_clear(&(*live)[k]);
            free(*live);
            *live = NULL;
            journal_destroy(&self);
            return NULL;
        }
    *n_live = self->n_live;
    return self;
}

void journal_destroy(journal_t **self_p) {
    journal_t *self = *self_p;
    if (!self)
        return;
    if (self->fd >= 0)
        close(self->fd);
    for (size_t i = 0; i < self->n_live; i++)
        ls_msg_clear(&self->live[i]);
    free(self->live);
    for (size_t i = 0; i < self->n_gone; i++)
        ls_msg_clear(&self->gone[i]);
    free(self->gone);
    free(self->dir);
    free(self->path);
    free(self->tmp);
    free(self);
    *self_p = NULL;
}

int journal_append(journal_t *self, const ls_msg_t *record) {
    size_t len;
    uint8_t *rec = s_frame(record, &len);
    ls_msg_t copy;
    off_t end = self->fd >= 0 ? lseek(self->fd, 0, SEEK_END) : -1;
    int rc = rec && end >= 0 ? ls_file_write_all(self->fd, rec, len) : -1;
    if (rc == 0)
        rc = fsync(self->fd);
    free(rec);
    if (rc < 0) {
        int err = errno;
        // Half a record (the disk filled up mid-write) would make every later one unreadable:
        // the file goes back to its last whole record.
        if (end >= 0 && ftruncate(self->fd, end) < 0)
            ls_error(0, "journal: cannot cut %s back to its last whole record: %s", self->path, strerror(errno));
        ls_error(0, "journal: cannot append to %s: %s", self->path, strerror(err));
        return -1;
    }
    self->records++;
    if (ls_msg_copy(&copy, record) == 0)
        s_live_apply(self, &copy);
    // The record is written: a compaction that fails (the disk is full) leaves the file whole
    // and is tried again at the next append; it does not undo what is already recorded.
    if (self->records > 2 * (self->n_live + self->n_gone) + JOURNAL_SLACK && s_compact(self) < 0)
        ls_warn(0, "journal: %s keeps its %zu records until a compaction succeeds", self->path, self->records);
    return 0;
}

const char *journal_unloaded(const journal_t *self, size_t i) {
    return i < self->n_gone ? self->gone[i].u.unload_adapter.name : NULL;
}

void journal_forget(journal_t *self, const char *name) {
    ls_msg_t *was = s_gone_find(self, name);
    if (was)
        s_set_remove(self->gone, &self->n_gone, was);
}

size_t journal_records(const journal_t *self) { return self->records; }
const char *journal_path(const journal_t *self) { return self->path; }
