/*  ls_msg.h — loraserve messages: types and codec API.

    Every message is declared once in messages/schema.msg. msggen turns that file into
    ls_msg_gen.h (the structs, the ls_msg_t union, enum constants) and ls_msg_gen.c (field
    descriptor tables); the table-driven code in ls_msg.c encodes, decodes, prints,
    compares and converts to JSON every message from those tables. docs/messages.md is
    generated from the same file and lists every message and field.

    Wire format: one msgpack array [schema_version, type, group, rid, {field_id: value}].
    Fields holding their zero value (0, false, NULL string, empty array) are left out;
    missing and nil fields decode as zero; unknown field ids are skipped, so adding a
    field or a message never breaks an older reader. Bulk data (tensor bytes) travels in
    extra ZeroMQ frames next to the body and is not handled here.

    Ownership: every pointer inside a filled or decoded ls_msg_t is owned by the message
    (malloc) and freed by ls_msg_clear. Fill string fields with ls_msg_strdup, text fields with ls_msg_textdup.
*/
#ifndef LS_MSG_H
#define LS_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

//  Larger bodies are refused by both the encoder and the decoder.
#define LS_MSG_MAX_BYTES (64u << 20)
//  Completions one GenerateReq may ask for (SamplingParams.n), OpenAI's own bound: the
//  tokenizer refuses more from any client, the gateway before anything goes upstream.
#define LS_MSG_MAX_N 128

//  Field value types shared by every message. Arrays are {v, n}; v is NULL when n is 0.
typedef struct { uint8_t *data; size_t len; } ls_bytes_t;
typedef struct { int32_t *v; size_t n; } ls_i32s_t;
typedef struct { uint32_t *v; size_t n; } ls_u32s_t;
typedef struct { uint64_t *v; size_t n; } ls_u64s_t;
typedef struct { float *v; size_t n; } ls_f32s_t;
typedef struct { char **v; size_t n; } ls_strs_t;
//  Text that may hold NUL bytes (a prompt, a stop string): len bytes at s, then a NUL that
//  len does not count, so s also reads as a C string up to its first NUL. s NULL: absent.
typedef struct { char *s; size_t len; } ls_text_t;
typedef struct { ls_text_t *v; size_t n; } ls_texts_t;

//  Generated: LS_SCHEMA_VERSION, enums, one struct per record and message, the
//  ls_msg_type_t constants (LS_MSG_<NAME>) and ls_msg_t with its union.
#include "ls_msg_gen.h"

typedef enum {
    LS_MSGERR_NONE = 0,
    LS_MSGERR_MALFORMED,        // not a valid body: bad msgpack, wrong types, truncated
    LS_MSGERR_TOO_LARGE,        // body above LS_MSG_MAX_BYTES
    LS_MSGERR_VERSION,          // encoded with a newer schema version than this build
    LS_MSGERR_UNKNOWN_TYPE      // well-formed, but the type id is not in this schema
} ls_msgerr_code_t;

typedef struct {
    ls_msgerr_code_t code;
    char text[256];             // e.g. "malformed: field 3 (input_ids) of GenerateReq: ..."
} ls_msgerr_t;

//  Zero everything, then set type and version (LS_SCHEMA_VERSION).
void ls_msg_init (ls_msg_t *m, ls_msg_type_t type);

//  Free every owned pointer and zero m. Idempotent: a cleared message has type 0.
void ls_msg_clear (ls_msg_t *m);

//  Encode m into a malloc'd buffer (free it with free()). Always writes the current
//  LS_SCHEMA_VERSION. Returns 0, or -1 on an unknown type, out of memory, or a body
//  above LS_MSG_MAX_BYTES.
int ls_msg_encode (const ls_msg_t *m, char **buf, size_t *len);

//  Decode untrusted bytes. m is an output only: its previous content is overwritten,
//  not freed. Returns 0, or -1 with m cleared and err (may be NULL) saying why. Never
//  asserts; allocations stay below a small multiple of len (see ls_msg.c).
int ls_msg_decode (const void *buf, size_t len, ls_msg_t *m, ls_msgerr_t *err);

//  A deep copy of src into dst (an output only, as for ls_msg_decode), through the codec, which
//  owns every field's layout. Returns 0, or -1 (out of memory, or src not encodable) with dst
//  cleared.
int ls_msg_copy (ls_msg_t *dst, const ls_msg_t *src);

//  "GenerateReq" for LS_MSG_GENERATE_REQ; NULL if unknown.
const char *ls_msg_type_name (int type);
//  LS_MSG_GENERATE_REQ for "GenerateReq"; -1 if unknown.
int ls_msg_type_from_name (const char *name);

//  One line: `GenerateReq v1 g0 rid=7 {text="hi" input_ids=[1,2,3]}`. Zero-valued fields
//  are left out, as on the wire; long strings and arrays are cut with a count of what
//  was left out. Returns the length the whole line has (like snprintf); out always
//  holds a NUL-terminated prefix when cap > 0.
int ls_msg_format (const ls_msg_t *m, char *out, size_t cap);

//  ls_msg_format plus a newline.
void ls_msg_print (const ls_msg_t *m, FILE *f);

//  Every field, zero or not, for trace export: {"type":"Ready","version":1,"group":0,
//  "rid":7,"body":{...}}. bytes are base64; enums are names (numbers if unknown);
//  64-bit integers above 2^53 are decimal strings so no digit is lost. NULL on error.
struct cJSON *ls_msg_to_json (const ls_msg_t *m);

//  Deep equality of header (type, group, rid; not version) and every field. Floats
//  compare by bit pattern, so NaN equals itself and 0.0 differs from -0.0.
bool ls_msg_equal (const ls_msg_t *a, const ls_msg_t *b);

//  ls_msg_equal, except for the fields schema.msg declares `measured` (clock readings such
//  as StepResult.elapsed_us): what replay compares, since a replayed actor decides the same
//  but does not run equally fast.
bool ls_msg_equal_unmeasured (const ls_msg_t *a, const ls_msg_t *b);

//  For tests and fuzz corpora: ls_msg_init(m, type), then fill every field with
//  pseudo-random values derived from seed (same seed, same message).
void ls_msg_fill_random (ls_msg_t *m, ls_msg_type_t type, uint64_t seed);
//  The same fill with the bits taken from next(arg), 64 a call (a fuzzer's input): every
//  field is set from them, so any value of every field can be reached.
typedef uint64_t (*ls_msg_bits_fn) (void *arg);
void ls_msg_fill (ls_msg_t *m, ls_msg_type_t type, ls_msg_bits_fn next, void *arg);

//  malloc'd copy of s, NULL for NULL (or out of memory).
char *ls_msg_strdup (const char *s);
//  malloc'd copy of len bytes at s (NUL-terminated after them); {NULL, 0} for NULL.
ls_text_t ls_msg_textdup (const char *s, size_t len);

//  The rules of a mix of adapters (MixPart[]: docs/lora-mixing.md), which every actor that
//  takes one applies: 1 .. LS_LORA_MIX_MAX components, each with a non-empty name (and, with
//  ids, a non-empty adapter_id), a weight above 0 and finite, no name twice. 0, or -1 with err
//  naming the first component that breaks a rule.
int ls_msg_mix_check (const ls_msg_mix_parts_t *mix, bool ids, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
