// sdk_internal.h — what the SDK's files share and users never see: the client's calls table
// (one entry per request waiting for answers) and the error helpers.
#ifndef LS_SDK_INTERNAL_H
#define LS_SDK_INTERNAL_H

#include <stdint.h>

#include "loraserve.h"
#include "ls_msg.h"

//  Nothing declared here leaves the shared library: it exports loraserve.h only.
#pragma GCC visibility push(hidden)

//  A request waiting for answers: registered under its rid before its message leaves, so
//  no answer can arrive before someone waits for it. Owned by the calling thread; the I/O
//  thread only appends answers to it, under the client's lock.
typedef struct _ls_call_t ls_call_t;

//  Register a call for m->rid (set by the caller, unique among the client's running calls),
//  then hand m to the I/O thread. LS_OK with *call, or an error (LS_ERR_BAD_REQUEST when
//  the rid is already running).
int ls_call_start (ls_client_t *client, const ls_msg_t *m, ls_call_t **call);

//  Take the call's next answer into *out (the caller clears it). Returns 1, LS_ERR_TIMEOUT
//  when deadline_ns (CLOCK_MONOTONIC; 0 = none) passes first (no message set), or the
//  call's failure (connection lost ...) with ls_last_error set, once every answer that came
//  before it was taken.
int ls_call_wait (ls_call_t *call, int64_t deadline_ns, ls_msg_t *out);

//  Whether someone asked to abort the call (ls_client_abort, ls_stream_abort).
bool ls_call_abort_asked (ls_call_t *call);

//  Unregister the call, drop answers nobody took, free it; *call_p becomes NULL.
void ls_call_end (ls_call_t **call_p);

//  Send Abort for rid, marking its call (when registered) as aborted by the client.
//  LS_ERR_NOT_FOUND when no call has that rid.
int ls_client_abort_rid (ls_client_t *client, uint64_t rid);

//  Monotonic clock in ns.
int64_t ls_sdk_now_ns (void);

//  Set this thread's ls_last_error text and return code.
int ls_sdk_fail (int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

//  The SDK code for a server ErrorCode (LS_ERR_INTERNAL for 0 or an unknown one).
int ls_sdk_err_from_server (uint32_t code);

#pragma GCC visibility pop

#endif
