// fake_tokenizer — a stand-in for the tokenizer actor's ROUTER that speaks
// docs/client-protocol.md, for testing the SDK and CLI without a model.
//
// GenerateReq: the answer text is "[ADAPTER] PROMPT" ("[base] …" without an adapter; a chat
// becomes "role:content|role:content"), one token per byte (id = byte value, logprob
// -0.01 * position, top alternatives id+1, id+2 …), cut at max_new_tokens bytes (finish
// LENGTH, else STOP); with n > 1 completion i ends in "#i". Streamed in 4-byte pieces, one
// piece per active request per turn (so requests interleave), else whole.
// Prompts that script failures:
//   hang          never produces; an Abort ends it with finish ABORT, timeout_ms passing with
//                 finish ERROR and error_code TIMEOUT (as the tokenizer does)
//   silent        never answers anything, even after timeout_ms
//   refuse:CODE   a final TextOut with finish ERROR and error_code CODE
//   error-msg     an Error message (UNKNOWN_TYPE), as an actor that does not serve requests
// Adapter "missing" is refused with NOT_FOUND. Admin: adapters start with "reverse"
// (rank 8); LoadAdapter "bad" fails (BAD_REQUEST), "slow" is never answered; UnloadAdapter of
// an unknown name fails with NOT_FOUND; Heartbeat is answered as "fake-tokenizer".
#ifndef FAKE_TOKENIZER_H
#define FAKE_TOKENIZER_H

#include <czmq.h>

#include "ls_msg.h"

//  Start the fake bound at endpoint; NULL if the bind fails.
zactor_t *fake_tokenizer_new (const char *endpoint);

//  A copy of the last GenerateReq it received (the caller clears it); -1 if none yet.
int fake_tokenizer_last_request (ls_msg_t *out);

#endif
