/*  loraserve.h — the loraserve C client SDK: the one header an application includes.

    A client talks to a running loraserve graph over ZeroMQ (the tokenizer actor's ROUTER,
    docs/client-protocol.md). It generates text — blocking, streaming with a callback, or
    streaming through an iterator —, aborts requests, loads, unloads and lists LoRA adapters,
    and pings the server. docs/sdk.md is the reference, with examples in examples/sdk/.

    Threads: one ls_client_t may be used by any number of threads at once. Each client owns
    one connection and one internal I/O thread; every call hands its messages to that thread
    and waits only for the answers carrying its own request id. A stream object belongs to
    the thread using it. ls_client_destroy must not race with calls on the same client.

    Errors: calls return LS_OK (0) or a negative ls_err_t. ls_strerror names a code;
    ls_last_error gives the message of the latest failed call in the calling thread — the
    server's own text when the server refused, else the SDK's.

    Memory: everything the SDK returns is owned by an object with a destroy function
    (ls_result_destroy, ls_adapter_list_destroy, ls_stream_destroy); destroy functions take
    the address of the pointer, accept NULL and clear the pointer, so calling them twice is
    safe. Nothing in this header needs ZeroMQ, czmq or msgpack headers.
*/
#ifndef LORASERVE_H
#define LORASERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

//  Every error a call can return. The server's refusal codes (docs/messages.md, ErrorCode)
//  map onto these; ls_last_error has the detail.
typedef enum {
    LS_OK = 0,
    LS_ERR_BAD_REQUEST = -1,    // invalid arguments or request values (checked here or by the server)
    LS_ERR_NOT_FOUND = -2,      // unknown adapter, or no such request to abort
    LS_ERR_TOO_LARGE = -3,      // the prompt or request exceeds a server limit (e.g. context length)
    LS_ERR_UNAVAILABLE = -4,    // the server cannot serve now: queues full, shutting down, connection lost
    LS_ERR_TIMEOUT = -5,        // no complete answer within the timeout
    LS_ERR_ABORTED = -6,        // the request was aborted (ls_client_abort, ls_stream_abort, a callback)
    LS_ERR_INTERNAL = -7,       // the server failed while serving the request (its logs say why)
    LS_ERR_PROTOCOL = -8,       // an answer the SDK cannot use, or a server that does not handle the request
    LS_ERR_NO_MEMORY = -9,      // out of memory in the client
    LS_ERR_OUTCOME_UNKNOWN = -10  // a load or unload whose answer was lost: it may have taken effect; list to know
} ls_err_t;

//  A short fixed description of code: "adapter or request not found" for LS_ERR_NOT_FOUND.
const char *ls_strerror (int code);

//  The message of the latest call that failed in this thread ("" if none). The text stays
//  valid until the next failing call in the same thread.
const char *ls_last_error (void);

//  Why a completion ended.
typedef enum {
    LS_FINISH_NONE = 0,         // not finished: more pieces follow
    LS_FINISH_STOP = 1,         // end of sequence, a stop token id or a stop string
    LS_FINISH_LENGTH = 2,       // reached max_tokens or the model's context
    LS_FINISH_ABORT = 3,        // aborted (by the client, or by the server stopping)
    LS_FINISH_ERROR = 4         // failed; the completion's error says why
} ls_finish_t;

//  "stop", "length", "abort", "error", or "" for LS_FINISH_NONE.
const char *ls_finish_name (ls_finish_t finish);

// ---------------------------------------------------------------------------------------------
// the client

typedef struct _ls_client_t ls_client_t;

//  Connect to a tokenizer endpoint ("ipc:///tmp/x/sock/tokenizer.sock",
//  "tcp://127.0.0.1:25504"). ZeroMQ connects in the background, so this succeeds even when
//  nothing listens yet; ls_client_ping checks that a server answers. Returns NULL on
//  failure with *err (err may be NULL) pointing at the message (ls_last_error's text).
ls_client_t *ls_client_new (const char *endpoint, const char **err);

//  Connect to the graph a launcher runs in run_dir: reads run_dir/graph.json (written once
//  every actor is ready) and connects to the tokenizer's router endpoint. NULL with *err
//  when graph.json is missing or has no tokenizer.
ls_client_t *ls_client_new_run_dir (const char *run_dir, const char **err);

//  Stop the I/O thread, close the connection and free the client; *self_p becomes NULL.
//  Destroy the client's streams first (that aborts their requests); no other thread may be
//  inside a call on this client.
void ls_client_destroy (ls_client_t **self_p);

//  The endpoint this client connects to.
const char *ls_client_endpoint (ls_client_t *self);

//  How long admin calls (adapter load, unload, list) and pings wait for their answer, in
//  ms; default 60000 (a cold adapter load reads weights from disk). Generate waits as long
//  as its request's timeout_ms says.
void ls_client_set_timeout (ls_client_t *self, uint32_t timeout_ms);

//  A fresh request id of this client, for ls_request_t.id: a thread that fills id before
//  calling ls_client_generate lets another thread abort that call with ls_client_abort.
uint64_t ls_client_request_id (ls_client_t *self);

// ---------------------------------------------------------------------------------------------
// requests

//  One chat message: role "system", "user" or "assistant", and its content.
typedef struct {
    const char *role;
    const char *content;
} ls_chat_message_t;

//  A generation request. Zero-initialise it and set what you need: zero means the default
//  (greedy decoding, the server's max tokens, the base model, no limit). The SDK copies
//  what it needs; nothing here must outlive the call that takes it.
typedef struct {
    //  The prompt: messages (a chat, rendered with the model's chat template), else
    //  input_ids (pre-tokenized), else prompt (text). Exactly one must be given.
    const char *prompt;
    size_t prompt_len;              // bytes of prompt, NUL bytes included; 0: up to its first NUL
    const int32_t *input_ids;
    size_t n_input_ids;
    const ls_chat_message_t *messages;
    size_t n_messages;

    const char *adapter;            // LoRA adapter name; NULL or "" is the base model
    //  A mix of adapters instead of adapter (docs/lora-mixing.md): n_mix (1 .. 8) of them, the
    //  output that of the base model plus Σ mix_weights[i] · (adapter mix_adapters[i]'s delta);
    //  weights above 0, no adapter twice.
    const char *const *mix_adapters;
    const float *mix_weights;
    size_t n_mix;

    //  Sampling (SGLang / OpenAI meanings).
    uint32_t max_tokens;            // new tokens at most; 0 = the server's default
    uint32_t min_tokens;            // end-of-sequence and stop ids are masked until this many
    float temperature;              // 0 = greedy
    float top_p;                    // 0 or 1 keeps all
    int32_t top_k;                  // 0 or -1 keeps all
    float min_p;                    // 0 keeps all
    float repetition_penalty;       // 0 or 1 is off
    float frequency_penalty;
    float presence_penalty;
    bool has_seed;                  // seed is set (0 is a valid seed)
    uint64_t seed;
    const char *const *stop;        // stop strings, n_stop of them
    size_t n_stop;
    const int32_t *stop_token_ids;  // stop token ids besides the model's end of sequence
    size_t n_stop_token_ids;
    bool ignore_eos;                // keep going past end of sequence
    bool keep_special_tokens;       // leave special tokens (end of text …) in the text
    bool logprobs;                  // return each sampled token's logprob
    uint32_t top_logprobs;          // and this many most likely alternatives per token
    uint32_t n;                     // completions for the prompt; 0 means 1

    //  The whole request must end within this many ms, else the server aborts it and the
    //  call returns LS_ERR_TIMEOUT with what was produced so far; 0 = no limit.
    uint32_t timeout_ms;
    //  0: the SDK picks one. Otherwise an id from ls_client_request_id, so another thread can
    //  abort the call by id.
    uint64_t id;
} ls_request_t;

//  One completion of a result (one per n).
typedef struct {
    char *text;                     // the whole generated text, NUL-terminated after text_len
    size_t text_len;                // its bytes, NUL bytes the model generated included
    int32_t *token_ids;             // the generated token ids, n_tokens of them
    size_t n_tokens;
    float *logprobs;                // n_tokens logprobs, with request.logprobs; else NULL
    int32_t *top_ids;               // [n_tokens][n_top] alternatives, with request.top_logprobs
    float *top_logprobs;            // their logprobs, same layout
    uint32_t n_top;                 // alternatives per token (request.top_logprobs)
    ls_finish_t finish;
    char *matched_stop;             // the stop string that ended it, or NULL
    size_t matched_stop_len;        // its bytes, NUL bytes included
    uint32_t completion_tokens;
    int error;                      // LS_OK, or why this completion failed
    char *error_message;            // the server's text with error, else NULL
} ls_completion_t;

//  What a generate produced.
typedef struct {
    uint64_t id;                    // the request id
    ls_completion_t *completions;   // n_completions of them, by index
    size_t n_completions;
    uint32_t prompt_tokens;         // usage: prompt length
    uint32_t completion_tokens;     // usage: generated tokens, all completions together
    uint32_t cached_tokens;         // prompt tokens served from the prefix cache
} ls_result_t;

//  Free a result; *self_p becomes NULL.
void ls_result_destroy (ls_result_t **self_p);

//  Generate and wait for the whole answer. On LS_OK *result holds every completion. On an
//  error *result may still be set (what was produced before an abort or a timeout, the
//  server's answer for a refused request): destroy it in every case.
int ls_client_generate (ls_client_t *self, const ls_request_t *request, ls_result_t **result);

//  One piece of a streamed answer. Pointers stay valid until the next ls_stream_next (or
//  until the callback returns).
typedef struct {
    uint32_t index;                 // which completion (0 .. n-1)
    const char *text;               // new text since this completion's previous piece
    size_t text_len;                // its bytes, NUL bytes included (NUL-terminated after them)
    const int32_t *token_ids;       // the tokens it came from
    size_t n_tokens;
    const float *logprobs;          // with request.logprobs; else NULL
    const int32_t *top_ids;         // [n_tokens][n_top], with request.top_logprobs
    const float *top_logprobs;
    uint32_t n_top;
    ls_finish_t finish;             // LS_FINISH_NONE until this completion's last piece
    const char *matched_stop;       // with finish STOP on a stop string; else NULL
    size_t matched_stop_len;        // its bytes, NUL bytes included
    uint32_t prompt_tokens;
    uint32_t completion_tokens;     // this completion's tokens so far
    uint32_t cached_tokens;
    int error;                      // with finish ERROR or ABORT: why (LS_ERR_TIMEOUT, LS_ERR_ABORTED …)
    const char *error_message;
} ls_piece_t;

//  Called once per piece; return nonzero to abort the request (the call then returns
//  LS_ERR_ABORTED).
typedef int (ls_piece_fn) (const ls_piece_t *piece, void *arg);

//  Generate, streaming: fn sees every piece as it arrives, in order per completion. result
//  may be NULL; when given it receives the whole answer as ls_client_generate would.
int ls_client_generate_stream (ls_client_t *self, const ls_request_t *request, ls_piece_fn *fn, void *arg,
                               ls_result_t **result);

//  The iterator form of streaming: open, call ls_stream_next until it returns 0 or an
//  error, destroy.
typedef struct _ls_stream_t ls_stream_t;

//  Send the request and return its stream in *stream.
int ls_stream_open (ls_client_t *client, const ls_request_t *request, ls_stream_t **stream);

//  Wait for the next piece. Returns 1 with *piece filled; 0 when every completion has ended
//  well; or, once, a negative code when the request ended badly (the server refused it, it
//  was aborted, timed out, or the connection was lost) — the final pieces with their errors
//  come first when the server sent them.
int ls_stream_next (ls_stream_t *self, ls_piece_t *piece);

//  The stream's request id.
uint64_t ls_stream_id (ls_stream_t *self);

//  Ask the server to stop the request; its final pieces arrive with LS_FINISH_ABORT.
int ls_stream_abort (ls_stream_t *self);

//  Abort a request that has not ended and free the stream; *self_p becomes NULL.
void ls_stream_destroy (ls_stream_t **self_p);

//  Abort the request with this id (a stream's id, or a blocking call's request.id). The
//  waiting call returns LS_ERR_ABORTED. LS_ERR_NOT_FOUND if no such request is running.
int ls_client_abort (ls_client_t *self, uint64_t request_id);

// ---------------------------------------------------------------------------------------------
// adapters and health

//  Where an adapter is in its life at the server's registry.
typedef enum {
    LS_ADAPTER_LOADING = 1,         // a load is under way
    LS_ADAPTER_READY = 2,           // requests may use it
    LS_ADAPTER_UNLOADING = 3,       // unload asked: waiting for its requests to end
    LS_ADAPTER_FAILED = 4           // its last load failed
} ls_adapter_status_t;

//  "loading", "ready", "unloading", "failed" (or "unknown").
const char *ls_adapter_status_name (int status);

typedef struct {
    char *name;
    char *adapter_id;               // the registry's uuid
    char *path;                     // PEFT directory it came from, or NULL
    bool pinned;                    // kept resident in a GPU slot
    uint32_t rank;
    float alpha;
    char **target_modules;
    size_t n_target_modules;
    uint32_t in_flight;             // requests holding it now
    int status;                     // ls_adapter_status_t
    uint64_t last_used_ms;          // registry clock time of its last use
} ls_adapter_t;

typedef struct {
    ls_adapter_t *adapters;         // in load order
    size_t n_adapters;
} ls_adapter_list_t;

void ls_adapter_list_destroy (ls_adapter_list_t **self_p);

//  Load the PEFT adapter at path (a directory the server's workers can read) under name;
//  pinned keeps it in a GPU slot. *rank (may be NULL) receives its LoRA rank.
int ls_client_adapter_load (ls_client_t *self, const char *name, const char *path, bool pinned, uint32_t *rank);

//  Unload an adapter once no request holds it. LS_ERR_NOT_FOUND if the server has none by
//  that name.
int ls_client_adapter_unload (ls_client_t *self, const char *name);

//  Every adapter the server knows, in *list.
int ls_client_adapter_list (ls_client_t *self, ls_adapter_list_t **list);

//  What a ping learned.
typedef struct {
    char actor[32];                 // who answered ("tokenizer")
    uint64_t uptime_ms;             // its uptime
    uint64_t rtt_us;                // round-trip time of the ping
} ls_health_t;

//  Ping the server: LS_OK once it answers; LS_ERR_TIMEOUT if it does not within the client's
//  timeout. health may be NULL.
int ls_client_ping (ls_client_t *self, ls_health_t *health);

#ifdef __cplusplus
}
#endif

#endif
