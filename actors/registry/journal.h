// journal — the registry's adapter set on disk, so registrations survive a restart.
//
// STATE_DIR/registry.journal is append-only: one record per confirmed load (a LoadAdapter
// message: name, path, pinned, adapter_id) or unload (an UnloadAdapter: name, adapter_id),
// framed like the trace files (runtime/ls_trace.h):
//
//   record = u32 magic "LSRJ" | u32 payload_len | u32 crc32(payload) | payload (msgpack message)
//
// little-endian, written with one write(2) and fsync'd before the append returns. Replay
// keeps the loads not undone by a later unload, in load order, and the names unloaded and not
// loaded again (so that the registry does not bring back a --lora-paths adapter a client
// unloaded). Damage is never fatal: a torn last record (a crash mid-append) is skipped with a
// warning, a corrupt one in the middle with an error naming its offset and, when its payload
// still decodes, the adapter it seems to record; replay resynchronises on the next intact
// record, the damaged file is kept as registry.journal.damaged, and the file is rewritten
// clean. It is also rewritten (temp file, fsync, rename, fsync of the directory) when it holds
// more than twice the live and unloaded sets plus JOURNAL_SLACK records.
//
// Known limit: appends are synchronous on the actor's loop. A record is a few hundred bytes
// and loads/unloads are rare admin operations, so the fsync's stall is accepted in exchange
// for answering a load only once it is durable.
#ifndef LS_REGISTRY_JOURNAL_H
#define LS_REGISTRY_JOURNAL_H

#include <stddef.h>

#include "ls_msg.h"

#define JOURNAL_FILE "registry.journal"
#define JOURNAL_MAGIC 0x4a52534cu  // "LSRJ" little-endian
#define JOURNAL_SLACK 64
#define JOURNAL_MAX_RECORD (1u << 20)

typedef struct journal journal_t;

// Open (creating dir and file) and replay. On success *live is a malloc'd array of *n_live
// LoadAdapter messages, the registered adapters in load order, for the caller to ls_msg_clear
// and free. NULL + err when the directory or file cannot be created, read or rewritten.
journal_t *journal_open(const char *dir, ls_msg_t **live, size_t *n_live, char *err, size_t errlen);
void journal_destroy(journal_t **self_p);

// Append a LoadAdapter or UnloadAdapter record and fsync; compacts when due. 0, or -1 (logged):
// the registry keeps serving, but the change may not survive a restart.
int journal_append(journal_t *self, const ls_msg_t *record);

// The names unloaded and not loaded since, i in 0..; NULL past the end.
const char *journal_unloaded(const journal_t *self, size_t i);
// Stop remembering that name was unloaded (dropped from the file at its next rewrite).
void journal_forget(journal_t *self, const char *name);

// Records the file holds now (live set plus history since the last rewrite).
size_t journal_records(const journal_t *self);
const char *journal_path(const journal_t *self);

#endif
