// ls_trace — per-actor message trace files (writer and reader).
//
// With --record-trace DIR every actor appends to DIR/<actor>.trace each message it receives
// and sends (raw ZeroMQ frames), each timer it fires and each signal it handles, stamped with
// the monotonic clock. Replay feeds these records back into a fresh actor; the actor's
// decisions depend only on them. The byte format is in docs/trace-format.md:
//
//   record  = u32 magic "LSTR" | u32 payload_len | u32 crc32(payload) | payload
//   payload = u8 kind | u8 dir | u16 sock | u32 aux | u64 t_ns | u32 nframes
//             | nframes × (u32 len | len bytes)
//
// All integers little-endian. A torn last record (short, or a CRC mismatch) ends reading with
// a warning; it is never fatal.
#ifndef LS_TRACE_H
#define LS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#define LS_TRACE_MAGIC 0x5254534Cu  // "LSTR" little-endian
#define LS_TRACE_MAX_FRAMES 4096
#define LS_TRACE_MAX_PAYLOAD (2u << 30)

typedef enum {
    LS_TRACE_META = 1,    // frame 0: JSON {"actor","pid","schema_version","format","exe","argv"}
    LS_TRACE_SOCKET = 2,  // aux = socket index; frames: name, type ("ROUTER"/"DEALER"), endpoint
    LS_TRACE_MSG = 3,     // dir in/out; sock = socket index; frames as on the wire
    LS_TRACE_TIMER = 4,   // aux = timer id (creation order within the actor)
    LS_TRACE_SIGNAL = 5,  // aux = signal number
    LS_TRACE_JOB = 6,     // aux = job id (submission order): a background job's completion ran;
                          // frame 0: the job's result (ls_actor_job_result), else no frame
    LS_TRACE_INPUT = 7,   // frame 0: key; then the frames the actor read (ls_actor_input)
    LS_TRACE_SEND_FAILED = 8,  // aux = errno: the message of the previous record was not sent
    LS_TRACE_STREAM_LISTEN = 9,  // aux = the port bound; frame 0: "host:port" as asked
    LS_TRACE_STREAM_OPEN = 10,   // aux = connection id (accept order, from 1); frame 0: the client's address
    LS_TRACE_STREAM_DATA = 11,   // dir in (read) / out (written); aux = connection id; frame 0: the bytes
    LS_TRACE_STREAM_CLOSE = 12,  // aux = connection id; in: the client left (frame 0: why); out: the actor closed
} ls_trace_kind_t;

typedef enum { LS_TRACE_IN = 0, LS_TRACE_OUT = 1 } ls_trace_dir_t;

typedef struct {
    const void *data;
    size_t len;
} ls_frame_ref_t;

typedef struct ls_trace_writer ls_trace_writer_t;

// Create or append to DIR/NAME.trace (DIR is created if missing). NULL with err on failure.
ls_trace_writer_t *ls_trace_writer_new(const char *dir, const char *name, char *err, size_t errlen);
void ls_trace_writer_destroy(ls_trace_writer_t **self_p);
// Append one record with one write(2), so a crash leaves at most one torn record at the end.
int ls_trace_write(ls_trace_writer_t *self, ls_trace_kind_t kind, ls_trace_dir_t dir, uint16_t sock,
                   uint32_t aux, uint64_t t_ns, const ls_frame_ref_t *frames, uint32_t nframes);
const char *ls_trace_writer_path(const ls_trace_writer_t *self);

typedef struct {
    ls_trace_kind_t kind;
    ls_trace_dir_t dir;
    uint16_t sock;
    uint32_t aux;
    uint64_t t_ns;
    uint32_t nframes;
    ls_frame_ref_t frames[LS_TRACE_MAX_FRAMES];  // point into the reader's buffer
    uint64_t offset;                             // byte offset of the record in the file
} ls_trace_record_t;

typedef struct ls_trace_reader ls_trace_reader_t;

ls_trace_reader_t *ls_trace_reader_new(const char *path, char *err, size_t errlen);
void ls_trace_reader_destroy(ls_trace_reader_t **self_p);
// 1: a record was read into rec (valid until the next call); 0: clean end of file;
// -1: a torn or corrupt record — reading stops there and err says where and why.
int ls_trace_read(ls_trace_reader_t *self, ls_trace_record_t *rec, char *err, size_t errlen);

uint32_t ls_crc32(const void *data, size_t len);

#endif
