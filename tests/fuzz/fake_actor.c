/*  fake_actor.c — the runtime calls the gateway's HTTP server makes (ls_actor.h), without a
    loop or sockets, so fuzz_http can feed it bytes directly. One listener; timers are kept in
    a list and fired by the fuzzer (fake_actor_run_timers); time is a counter it advances.
*/
#include "fake_actor.h"

#include <stdlib.h>

struct ls_stream {
    void *data;
    int closed, paused;
    size_t written;
};

struct ls_timer {
    ls_timer_fn fn;
    void *arg;
    double after_ms;
    ls_timer_t *next;
};

static ls_stream_def_t s_def;
static void *s_arg;
static ls_timer_t *s_timers;
static uint64_t s_now;

uint64_t ls_actor_now_ns(const ls_actor_t *self) {
    (void)self;
    return s_now;
}

int ls_actor_stream_listen(ls_actor_t *self, const char *host, int port, const ls_stream_def_t *def,
                           void *arg) {
    (void)self, (void)host, (void)port;
    s_def = *def;
    s_arg = arg;
    return 8080;
}

void ls_stream_write(ls_stream_t *s, const void *data, size_t len) {
    (void)data;
    s->written += len;
}
void ls_stream_close(ls_stream_t *s) {
    s->closed = 1;
}
void ls_stream_pause(ls_stream_t *s, int paused) {
    s->paused = paused;
}
void ls_stream_set_data(ls_stream_t *s, void *data) {
    s->data = data;
}
void *ls_stream_data(const ls_stream_t *s) {
    return s->data;
}

ls_timer_t *ls_actor_timer_start(ls_actor_t *self, double after_ms, double repeat_ms, ls_timer_fn fn,
                                 void *arg) {
    (void)self, (void)repeat_ms;
    ls_timer_t *t = calloc(1, sizeof *t);
    if (!t)
        abort();
    *t = (ls_timer_t){fn, arg, after_ms, s_timers};
    s_timers = t;
    return t;
}

void ls_actor_timer_again(ls_actor_t *self, ls_timer_t *t, double after_ms) {
    (void)self;
    t->after_ms = after_ms;
}

void ls_actor_timer_stop(ls_actor_t *self, ls_timer_t *t) {
    (void)self;
    for (ls_timer_t **p = &s_timers; *p; p = &(*p)->next)
        if (*p == t) {
            *p = t->next;
            free(t);
            return;
        }
    abort(); // stopping a timer that is not running: a bug in the caller
}

ls_stream_t *fake_actor_open(void) {
    ls_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        abort();
    s_def.on_open(NULL, s, s_arg);
    return s;
}

int fake_actor_data(ls_stream_t *s, const char *data, size_t len) {
    if (!s->closed)
        s_def.on_data(NULL, s, data, len, s_arg);
    return s->closed;
}

void fake_actor_gone(ls_stream_t *s) {
    if (!s->closed)
        s_def.on_close(NULL, s, "fuzz: client gone", s_arg);
    free(s);
}

//  Fires the first timer due within max_ms (the time moves to it); 1 when one fired. A timer
//  stays armed after it fires, as a libev timer without repeat is not: the callback's own
//  stop/again calls decide, so it is unlinked only if the callback stops it.
int fake_actor_run_timer(double max_ms) {
    ls_timer_t *due = NULL;
    for (ls_timer_t *t = s_timers; t; t = t->next)
        if (t->after_ms <= max_ms && (!due || t->after_ms < due->after_ms))
            due = t;
    if (!due)
        return 0;
    s_now += (uint64_t)(due->after_ms * 1e6);
    double fired_at = due->after_ms;
    due->after_ms = 1e300; // spent until re-armed
    for (ls_timer_t *t = s_timers; t; t = t->next)
        if (t != due && t->after_ms < 1e299)
            t->after_ms -= fired_at;
    due->fn(NULL, due, due->arg);
    return 1;
}

void fake_actor_advance(uint64_t ns) {
    s_now += ns;
}
