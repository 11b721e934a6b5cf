/*  fake_actor.h — a socket-free stand-in for the runtime's streams and timers (fake_actor.c),
    for fuzzing the gateway's HTTP server. Link it instead of ls_runtime.
*/
#ifndef LS_FAKE_ACTOR_H
#define LS_FAKE_ACTOR_H

#include <stddef.h>
#include <stdint.h>

#include "ls_actor.h"

//  A client connects: the listener's on_open, with a fresh stream.
ls_stream_t *fake_actor_open (void);
//  Bytes from the client; 1 once the server closed the stream.
int fake_actor_data (ls_stream_t *s, const char *data, size_t len);
//  The client leaves (on_close unless the server closed it first); frees the stream.
void fake_actor_gone (ls_stream_t *s);
//  Fires the earliest timer due within max_ms; 1 when one fired.
int fake_actor_run_timer (double max_ms);
void fake_actor_advance (uint64_t ns);

#endif
