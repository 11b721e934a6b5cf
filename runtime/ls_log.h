// ls_log — structured logging: one line per event, logfmt (key=value), to stderr.
//
//   ts=2026-11-22T01:02:03.123Z level=info actor=scheduler pid=4242 rid=17 msg="step planned" ...
//
// The actor name is process-wide (one actor per process), so library code such as the engine
// can log without an actor handle. Wall-clock time appears only in log lines, never in decisions.
// Each line goes out in one write(2), so lines of processes sharing a log file do not interleave
// and a reader polling the file (a test waiting for "listening on ...") never reads half a line.
#ifndef LS_LOG_H
#define LS_LOG_H

#include <stdint.h>

typedef enum { LS_LOG_DEBUG = 0, LS_LOG_INFO, LS_LOG_WARN, LS_LOG_ERROR } ls_log_level_t;

// Set the actor name and minimum level for this process. Safe to call again.
void ls_log_init(const char *actor, ls_log_level_t level);
// Parse "debug", "info", "warn", "error"; returns -1 for anything else.
int ls_log_level_parse(const char *text, ls_log_level_t *level);
ls_log_level_t ls_log_level(void);

// Log one event. rid 0 means "no request". The formatted text becomes the quoted msg= value.
void ls_log(ls_log_level_t level, uint64_t rid, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// fn(arg) runs before each line is written (NULL: nothing): a console that keeps a line open
// (the launcher's load progress, updated in place on a terminal) ends it first. Set it before
// other threads log.
void ls_log_set_before(void (*fn)(void *arg), void *arg);

#define ls_debug(rid, ...) ls_log(LS_LOG_DEBUG, (rid), __VA_ARGS__)
#define ls_info(rid, ...) ls_log(LS_LOG_INFO, (rid), __VA_ARGS__)
#define ls_warn(rid, ...) ls_log(LS_LOG_WARN, (rid), __VA_ARGS__)
#define ls_error(rid, ...) ls_log(LS_LOG_ERROR, (rid), __VA_ARGS__)

#endif
