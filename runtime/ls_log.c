// ls_log — see ls_log.h.
#include "ls_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char s_actor[64] = "-";
static ls_log_level_t s_level = LS_LOG_INFO;
// Worker threads (adapter disk reads) log too; one lock keeps each line whole.
static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *s_names[] = {"debug", "info", "warn", "error"};

void ls_log_init(const char *actor, ls_log_level_t level) {
    snprintf(s_actor, sizeof s_actor, "%s", actor ? actor : "-");
    s_level = level;
}

int ls_log_level_parse(const char *text, ls_log_level_t *level) {
    for (int i = 0; i < 4; i++)
        if (text && strcmp(text, s_names[i]) == 0) {
            *level = (ls_log_level_t)i;
            return 0;
        }
    return -1;
}

ls_log_level_t ls_log_level(void) { return s_level; }

// A line being built: text past cap is dropped (the line still ends with its newline).
typedef struct {
    char *p;
    size_t n, cap;
} s_line_t;

static void s_put(s_line_t *l, const char *s, size_t len) {
    len = len < l->cap - l->n ? len : l->cap - l->n;
    memcpy(l->p + l->n, s, len);
    l->n += len;
}

// printf into the line (p holds cap + 1 bytes, so vsnprintf's NUL always fits)
static void s_putf(s_line_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_putf(s_line_t *l, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->p + l->n, l->cap - l->n + 1, fmt, ap);
    va_end(ap);
    if (n > 0)
        l->n += (size_t)n < l->cap - l->n ? (size_t)n : l->cap - l->n;
}

// Quote for logfmt: escape backslash, quote and control characters so one event is one line.
static void s_put_quoted(s_line_t *l, const char *text) {
    s_put(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            s_putf(l, "\\%c", *p);
        else if (*p == '\n')
            s_put(l, "\\n", 2);
        else if (*p < 0x20)
            s_putf(l, "\\x%02x", *p);
        else
            s_put(l, (const char *)p, 1);
    }
    s_put(l, "\"", 1);
}

static void (*s_before)(void *arg);
static void *s_before_arg;

void ls_log_set_before(void (*fn)(void *arg), void *arg) {
    s_before = fn;
    s_before_arg = arg;
}

void ls_log(ls_log_level_t level, uint64_t rid, const char *fmt, ...) {
    if (level < s_level)
        return;
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);

    // The line is built whole and written by one write(2): a reader of the log file (a test
    // waiting for "listening on ...", a supervisor tailing it) never sees half of it, and
    // processes appending to one file do not interleave within a line.
    char buf[sizeof text * 4 + 256];
    s_line_t l = {buf, 0, sizeof buf - 1};
    s_putf(&l, "ts=%s.%03dZ level=%s actor=%s pid=%d", ts, (int)(tv.tv_usec / 1000),
           s_names[level], s_actor, (int)getpid());
    if (rid)
        s_putf(&l, " rid=%llu", (unsigned long long)rid);
    s_put(&l, " msg=", 5);
    s_put_quoted(&l, text);
    buf[l.n++] = '\n';

    pthread_mutex_lock(&s_lock);
    if (s_before)
        s_before(s_before_arg);
    fflush(stderr); // what stdio holds for stderr goes first, in order
    for (size_t off = 0; off < l.n;) {
        ssize_t w = write(STDERR_FILENO, buf + off, l.n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break; // stderr closed or full: the line is lost, as fprintf's would be
        off += (size_t)w;
    }
    pthread_mutex_unlock(&s_lock);
}
