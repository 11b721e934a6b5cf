// Server-sent events, as the two generation APIs stream them: the framing (data: lines, events
// ended by a blank line, bytes split anywhere by the network) and what one event says —
// SGLang's /generate (cumulative text, output_ids and meta_info) or OpenAI's completions
// (text deltas, usage in a last chunk).
#ifndef BS_SSE_H
#define BS_SSE_H

#include <stddef.h>

#include "jscan.h"

typedef struct bs_sse_t bs_sse_t;

// Called with each event's data (its data: lines joined by '\n'); nonzero stops the feed.
typedef int (*bs_sse_event_fn)(void *arg, const char *data, size_t n);

// max_event_bytes bounds one event (a runaway stream is an error, not unbounded memory).
bs_sse_t *bs_sse_new(size_t max_event_bytes);
void bs_sse_destroy(bs_sse_t **ps);
// Forget a partial event: the parser is reused for the next request.
void bs_sse_reset(bs_sse_t *s);
// Feed received bytes; events complete in them are delivered in order. -1 when an event is over
// the limit or fn stopped the feed.
int bs_sse_feed(bs_sse_t *s, const char *buf, size_t n, bs_sse_event_fn fn, void *arg);
// The stream ended: an event whose blank line never came is delivered too (servers that close
// right after the last data: line). -1 as for bs_sse_feed.
int bs_sse_finish(bs_sse_t *s, bs_sse_event_fn fn, void *arg);

typedef enum { BS_API_GENERATE, BS_API_OPENAI } bs_api_t;

// What one event (or a whole non-streamed answer) says. Counts are -1 when it does not say.
typedef struct {
    int done;               // data: [DONE]
    int error;              // {"error": …}: message holds its message (a JSON string) when given
    bs_span_t message;
    int finished;           // a finish_reason
    long long completion_tokens, prompt_tokens;  // generate: meta_info (cumulative); openai: usage
    bs_span_t text;         // the text: cumulative (generate) or this chunk's piece (openai), a JSON string
} bs_chunk_t;

// 0, or -1 when the data is not a JSON object of the API's shape.
int bs_chunk_parse(bs_api_t api, const char *data, size_t n, bs_chunk_t *out);
// Whether a chunk's text is non-empty (a JSON string longer than "").
int bs_chunk_has_text(const bs_chunk_t *c);

#endif
