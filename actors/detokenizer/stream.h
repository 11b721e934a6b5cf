// stream — the detokenizer's decisions without sockets: one incremental detokenizer (ls_detok)
// per request, TokenOut in, TextOut out, and an Abort to the scheduler when a stop string ends a
// request the scheduler is still generating. The actor (main.c) only wires it to its sockets;
// tests/frontdoor drives it directly.
#ifndef LS_DETOK_STREAM_H
#define LS_DETOK_STREAM_H

#include <stdint.h>

#include "ls_msg.h"
#include "tokenizer.h"

typedef struct dstream dstream_t;

typedef struct {
    void *host;
    // Sends msg to the named peer: "tokenizer" (TextOut) or "scheduler" (Abort). msg stays the
    // caller's.
    void (*send)(void *host, const char *peer, const ls_msg_t *msg);
} dstream_host_t;

typedef struct {
    uint64_t active;          // requests with state here (gauge)
    uint64_t requests;        // requests seen (their first TokenOut)
    uint64_t tokens;          // tokens decoded
    uint64_t stop_matches;    // requests ended by a stop string
    uint64_t dropped;         // TokenOuts for no known request (after a stop string, or stray)
    uint64_t failed;          // requests ended here with an error (id outside the vocabulary,
                              // added tokens that cannot be taken)
} dstream_stats_t;

// tok must outlive the stream, and be used on the stream's thread only (an adapter's added
// tokens are taken over it per request).
dstream_t *dstream_new(ls_tokenizer_t *tok, const dstream_host_t *host);
void dstream_destroy(dstream_t **self_p);
// One TokenOut from the scheduler (rid = the tokenizer's request id).
void dstream_on_token_out(dstream_t *self, const ls_msg_t *msg);
// The actor is stopping: every request still here gets a final TextOut ERROR SHUTTING_DOWN.
void dstream_shutdown(dstream_t *self);
// Forget every request without a word: the scheduler or the tokenizer went down, and the
// tokenizer answers the requests' clients itself.
void dstream_drop_all(dstream_t *self);
const dstream_stats_t *dstream_stats(const dstream_t *self);

#endif
