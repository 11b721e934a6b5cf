// ls_file — the one way loaders open the files of a model or adapter directory.
//
// Directories are confined by whoever names them (the registry's --lora-roots check, the
// operator's --model-path); this module confines the files inside them. A file is named by
// a directory and a relative name, and is opened only if:
//   - the name is relative and has no empty, "." or ".." component;
//   - no component of the name is a symbolic link (each is opened with O_NOFOLLOW from the
//     one before, so a link cannot lead out of the directory, nor to a file inside it under
//     another name);
//   - it is a regular file (checked with fstat on the open descriptor; the open itself uses
//     O_NONBLOCK, so a FIFO never blocks the thread and a device is refused, not read);
//   - it is no larger than the limit of its kind, below — the one place each limit is set.
// The directory itself is opened as given (symlinks in it are followed).
//
// Known limit: a Hugging Face cache snapshot (files that are links into ../../blobs) is
// refused; point at a directory of real files (`huggingface-cli download --local-dir`).
#ifndef LS_FILE_H
#define LS_FILE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    LS_FILE_JSON,         // config.json, adapter_config.json, *_config.json, index files
    LS_FILE_TOKENIZER,    // tokenizer.json (large vocabularies and merge lists)
    LS_FILE_SAFETENSORS,  // weights: mapped, not read, so the limit is a sanity bound
} ls_file_kind_t;

// The largest file of a kind, in bytes.
uint64_t ls_file_limit(ls_file_kind_t kind);

// Opens dir/name for reading under the rules above. Returns the descriptor (O_CLOEXEC) and its
// size, or -1 with a sentence naming the file in err; errno is ENOENT when the file (or a
// directory on the way) does not exist, so callers can treat optional files as absent.
int ls_file_open(const char *dir, const char *name, ls_file_kind_t kind, uint64_t *size,
                 char *err, size_t errlen);

// ls_file_open on a path: its directory part is the directory, its last component the name.
int ls_file_open_path(const char *path, ls_file_kind_t kind, uint64_t *size, char *err,
                      size_t errlen);

// The whole file, NUL-terminated (the NUL is not counted in *len). NULL + err (errno as
// ls_file_open) on failure; the caller frees.
char *ls_file_read(const char *dir, const char *name, ls_file_kind_t kind, size_t *len,
                   char *err, size_t errlen);
char *ls_file_read_path(const char *path, ls_file_kind_t kind, size_t *len, char *err,
                        size_t errlen);

// Durable writes, for the files the registry itself keeps (its journal, its copies of adapters
// sent as tensors). All of p to fd, through short writes and EINTR: 0, or -1 with errno.
int ls_file_write_all(int fd, const void *p, size_t len);
// fsync directory dir, so that names created or renamed in it survive a crash: 0, or -1 with
// errno.
int ls_file_sync_dir(const char *dir);

#endif
