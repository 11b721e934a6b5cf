// ls_confine — where adapter files may be read from, checked by every actor that is handed a
// path (the scheduler and the workers as well as the registry): a LoadAdapter is obeyed only
// for a directory that, resolved (realpath, so no symlink leads out), lies under a
// --lora-roots or --lora-dirs directory, is one of the operator's --lora-paths, or lies under
// --lora-tensors-dir (the registry's copies of adapters sent as tensors, RUN_DIR/state/tensors).
// Whoever sent the message — the registry, or anyone who reached the socket — is not taken on
// trust.
#ifndef LS_CONFINE_H
#define LS_CONFINE_H

#include <stddef.h>

#include "ls_flags.h"

typedef struct ls_confine ls_confine_t;

// The registry's copies of adapters sent as tensors lie in this folder of its --state-dir; the
// launcher passes RUN_DIR/state/LS_CONFINE_TENSORS_DIR to the readers as --lora-tensors-dir.
#define LS_CONFINE_TENSORS_DIR "tensors"

// The flag of the registry's copies, for the actors that read adapters (scheduler, workers).
#define LS_LORA_TENSORS_DIR_FLAG(var)                                                               \
    LS_FLAG_STR("lora-tensors-dir", (var), NULL,                                                    \
                "the registry's copies of adapters sent as tensors (RUN_DIR/state/tensors): adapters under it may be read")

// From the flags as given (--lora-paths entries in lora_spec's forms). Entries that do not
// exist are left out with a warning, except tensors_dir (NULL: none), which the registry
// creates with its first copy: it is resolved at each check. NULL when out of memory or when a
// --lora-paths value is malformed (logged, naming it).
ls_confine_t *ls_confine_new(const ls_strlist_t *roots, const ls_strlist_t *dirs, const ls_strlist_t *lora_paths,
                             const char *tensors_dir);
void ls_confine_destroy(ls_confine_t **self_p);
// Nothing was configured: the actor runs alone (tests, by hand) and checks no path.
int ls_confine_open(const ls_confine_t *self);
// 0 when path may be read; else -1 and a sentence in err.
int ls_confine_check(const ls_confine_t *self, const char *path, char *err, size_t errlen);

#endif
