// tensors — adapters sent in a LoadAdapter (from_tensors), kept as files the registry owns.
//
// Such an adapter is written, before it is checked, as an ordinary PEFT directory under the
// registry's state directory, STATE/tensors/<16 hex digits>/{adapter_config.json,
// adapter_model.safetensors}, and from then on is an adapter with a path: checked and read
// exactly like a directory an operator gave, journaled by its path, re-read by the workers when
// their CPU tier evicted it or they restarted, loaded by every data-parallel group. The
// registry alone writes and removes what lies under STATE/tensors (the workers only read it).
//
// Writes are atomic: both files go into STATE/tensors/.tmp-<hex> (mode 0700, files 0600),
// each is fsync'd, then the directory, which is renamed into place, and STATE/tensors is
// fsync'd. A directory is therefore whole or absent, and whole before any journal record can
// name it.
//
// Lifetime, so that a crash at any point leaves nothing that matters and never loses an
// acknowledged load: a load is acknowledged only after the journal took its record, which is
// after the directory is durable; the directory is removed only after the journal recorded the
// unload (or dropped the adapter), or when the load failed (never journaled). A crash between
// the two steps leaves a directory no journal record names: tensors_sweep removes such
// directories (and any .tmp-*) at the next start, before the journal's adapters are loaded.
#ifndef LS_REGISTRY_TENSORS_H
#define LS_REGISTRY_TENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// root = STATE/tensors (LS_CONFINE_TENSORS_DIR, where the scheduler and workers may read). The directory for a load: root/<16 hex> from a hash of its inputs
// (the name, the event time, a per-registry counter), so a replay derives the same path.
void tensors_path(const char *root, const char *name, uint64_t now_ns, uint64_t counter, char *out, size_t cap);

// Write the adapter to dir (a tensors_path) atomically, creating root as needed. 0, or -1 with a
// sentence in err (errno set: ENOSPC for a full disk).
int tensors_write(const char *dir, const char *config, size_t config_len, const void *weights, size_t weights_len,
                  char *err, size_t errlen);

// Is path a directory tensors_path made under root (and so the registry's to remove)?
bool tensors_owns(const char *root, const char *path);

// Remove dir and its two files; a part already gone is not an error. Failures are logged.
void tensors_remove(const char *dir);

// Remove every entry of root that is not one of keep[0..n) (the journal's adapters): the
// leftovers of a crash. Logged; a root that does not exist is empty.
void tensors_sweep(const char *root, const char *const *keep, size_t n);

#endif
