// ls_log — see ls_log.h.
#include "ls_log.h"

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

// Quote for logfmt: escape backslash, quote and control characters so one event is one line.
static void s_put_quoted(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') {
            fputc('\\', f);
            fputc(*p, f);
        } else if (*p == '\n')
            fputs("\\n", f);
        else if (*p < 0x20)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
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

    pthread_mutex_lock(&s_lock);
    if (s_before)
        s_before(s_before_arg);
    fprintf(stderr, "ts=%s.%03dZ level=%s actor=%s pid=%d", ts, (int)(tv.tv_usec / 1000),
            s_names[level], s_actor, (int)getpid());
    if (rid)
        fprintf(stderr, " rid=%llu", (unsigned long long)rid);
    fputs(" msg=", stderr);
    s_put_quoted(stderr, text);
    fputc('\n', stderr);
    fflush(stderr);
    pthread_mutex_unlock(&s_lock);
}
