// SSE framing (the WHATWG event-stream rules the gateway's streams need: data and comment
// lines, LF, CRLF or CR line ends, a blank line ending the event) and the two APIs' events.
#include "sse.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"

struct bs_sse_t {
    bs_buf_t line;  // a line whose end has not arrived yet
    bs_buf_t data;  // the event's data lines so far, each followed by '\n'
    size_t max;
    int cr;        // the last byte fed was '\r': a '\n' first in the next feed ends nothing
};

bs_sse_t *bs_sse_new(size_t max_event_bytes) {
    bs_sse_t *s = calloc(1, sizeof *s);
    if (s)
        s->max = max_event_bytes;
    return s;
}

void bs_sse_destroy(bs_sse_t **ps) {
    bs_sse_t *s = *ps;
    if (!s)
        return;
    free(s->line.d);
    free(s->data.d);
    free(s);
    *ps = NULL;
}

void bs_sse_reset(bs_sse_t *s) { s->line.n = s->data.n = 0, s->cr = 0; }

// Appends to a buffer that may not pass max bytes.
static int s_append(bs_buf_t *b, const char *p, size_t len, size_t max) {
    return b->n + len > max ? -1 : bs_buf_add(b, p, len);
}

static int s_dispatch(bs_sse_t *s, bs_sse_event_fn fn, void *arg) {
    if (!s->data.n)
        return 0;  // a blank line with no data before it dispatches nothing
    size_t n = s->data.n - 1;  // without the last line's '\n'
    s->data.n = 0;
    return fn(arg, s->data.d, n) ? -1 : 0;
}

// One whole line (without its end).
static int s_line(bs_sse_t *s, const char *p, size_t n, bs_sse_event_fn fn, void *arg) {
    if (!n)
        return s_dispatch(s, fn, arg);
    if (p[0] == ':')
        return 0;  // a comment (keep-alive)
    const char *colon = memchr(p, ':', n);
    size_t flen = colon ? (size_t)(colon - p) : n;
    if (flen != 4 || memcmp(p, "data", 4))
        return 0;  // event:, id:, retry: and unknown fields say nothing the benchmark uses
    const char *v = colon ? colon + 1 : p + n;
    if (v < p + n && *v == ' ')
        v++;
    size_t vlen = (size_t)(p + n - v);
    return s_append(&s->data, v, vlen, s->max) < 0 || s_append(&s->data, "\n", 1, s->max + 1) < 0 ? -1 : 0;
}

int bs_sse_feed(bs_sse_t *s, const char *buf, size_t n, bs_sse_event_fn fn, void *arg) {
    const char *p = buf, *e = buf + n;
    if (s->cr && p < e && *p == '\n')
        p++;
    s->cr = 0;
    while (p < e) {
        const char *end = p;
        while (end < e && *end != '\n' && *end != '\r')
            end++;
        if (end == e) {  // no line end yet: keep the piece
            if (s_append(&s->line, p, (size_t)(e - p), s->max) < 0)
                return -1;
            break;
        }
        int rc;
        if (s->line.n) {
            if (s_append(&s->line, p, (size_t)(end - p), s->max) < 0)
                return -1;
            rc = s_line(s, s->line.d, s->line.n, fn, arg);
            s->line.n = 0;
        } else
            rc = s_line(s, p, (size_t)(end - p), fn, arg);
        if (rc < 0)
            return -1;
        if (*end == '\r') {
            if (end + 1 == e)
                s->cr = 1;
            else if (end[1] == '\n')
                end++;
        }
        p = end + 1;
    }
    return 0;
}

int bs_sse_finish(bs_sse_t *s, bs_sse_event_fn fn, void *arg) {
    int rc = 0;
    if (s->line.n) {
        rc = s_line(s, s->line.d, s->line.n, fn, arg);
        s->line.n = 0;
    }
    if (!rc)
        rc = s_dispatch(s, fn, arg);
    return rc;
}

static long long s_count(bs_span_t obj, const char *key) {
    bs_span_t v;
    long long x;
    return !bs_json_member(obj, key, &v) && !bs_json_int(v, &x) ? x : -1;
}

int bs_chunk_parse(bs_api_t api, const char *data, size_t n, bs_chunk_t *out) {
    *out = (bs_chunk_t){.completion_tokens = -1, .prompt_tokens = -1};
    bs_span_t root, v, meta, choice;
    if (bs_json_root(data, n, &root) < 0)
        return -1;
    if (root.n == 6 && !memcmp(root.p, "[DONE]", 6)) {
        out->done = 1;
        return 0;
    }
    if (root.p[0] != '{')
        return -1;
    if (!bs_json_member(root, "error", &v) && !bs_json_is_null(v)) {
        out->error = 1;
        if (v.p[0] == '"')
            out->message = v;
        else
            bs_json_member(v, "message", &out->message);
        return 0;
    }
    if (api == BS_API_GENERATE) {
        if (bs_json_member(root, "meta_info", &meta) < 0)
            return -1;
        out->completion_tokens = s_count(meta, "completion_tokens");
        out->prompt_tokens = s_count(meta, "prompt_tokens");
        out->finished = !bs_json_member(meta, "finish_reason", &v) && !bs_json_is_null(v);
        bs_json_member(root, "text", &out->text);
        return 0;
    }
    if (bs_json_member(root, "choices", &v) < 0)
        return -1;
    if (!bs_json_element(v, 0, &choice)) {
        bs_json_member(choice, "text", &out->text);
        out->finished = !bs_json_member(choice, "finish_reason", &v) && !bs_json_is_null(v);
    }
    if (!bs_json_member(root, "usage", &v) && !bs_json_is_null(v)) {
        out->completion_tokens = s_count(v, "completion_tokens");
        out->prompt_tokens = s_count(v, "prompt_tokens");
    }
    return 0;
}

int bs_chunk_has_text(const bs_chunk_t *c) { return c->text.n > 2 && c->text.p[0] == '"'; }
