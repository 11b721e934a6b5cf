// fake_graph — what the gateway talks to, without a model: a tokenizer ROUTER speaking
// docs/client-protocol.md and a scheduler ROUTER that answers GetMetrics, in one thread.
//
// GenerateReq: each completion is the pieces " <adapter or base>" and " ok" (" chat:<adapter>"
// first for a chat), one token each (ids 100, 101; logprob -0.5 per position; top alternatives
// id, id+1, ...), cut at max_new_tokens (finish LENGTH, else STOP); streamed piece by piece,
// else whole; n completions with their index. Prompt counts: the text's bytes, the ids, or 7
// for a chat. Scripted prompts: "hang" streams one piece and waits for an Abort (answered with
// finish ABORT); "long" is refused TOO_LARGE, "busy" UNAVAILABLE; "rid0" is preceded by one
// message of every answer type with rid 0; adapter "missing" NOT_FOUND.
// Admin: ListAdapters lists reverse and upper (READY) and gone (UNLOADING); LoadAdapter "bad"
// fails BAD_REQUEST, "hang" is never answered; UnloadAdapter "nope" fails NOT_FOUND; Heartbeat is answered unless muted.
#ifndef FAKE_GRAPH_H
#define FAKE_GRAPH_H

#include <czmq.h>
#include <stdint.h>

#include "ls_msg.h"

// Bind the fake tokenizer and scheduler at these endpoints.
zactor_t *fake_graph_new(const char *tokenizer, const char *scheduler);
// A copy of the last GenerateReq (the caller clears it); -1 if none yet.
int fake_graph_last_request(ls_msg_t *out);
// Aborts received so far.
int fake_graph_aborts(void);
// 1: Heartbeats go unanswered (a stuck tokenizer).
void fake_graph_mute(int mute);

#endif
