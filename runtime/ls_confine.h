// ls_confine — where adapter files may be read from, checked by every actor that is handed a
// path (the scheduler and the workers as well as the registry): a LoadAdapter is obeyed only
// for a directory that, resolved (realpath, so no symlink leads out), lies under a
// --lora-roots or --lora-dirs directory or is one of the operator's --lora-paths. Whoever sent
// the message — the registry, or anyone who reached the socket — is not taken on trust.
#ifndef LS_CONFINE_H
#define LS_CONFINE_H

#include <stddef.h>

#include "ls_flags.h"

typedef struct ls_confine ls_confine_t;

// From the flags as given (--lora-paths entries in lora_spec's forms). Entries that do not
// exist are left out with a warning. NULL when out of memory or when a --lora-paths value is
// malformed (logged, naming it).
ls_confine_t *ls_confine_new(const ls_strlist_t *roots, const ls_strlist_t *dirs, const ls_strlist_t *lora_paths);
void ls_confine_destroy(ls_confine_t **self_p);
// Nothing was configured: the actor runs alone (tests, by hand) and checks no path.
int ls_confine_open(const ls_confine_t *self);
// 0 when path may be read; else -1 and a sentence in err.
int ls_confine_check(const ls_confine_t *self, const char *path, char *err, size_t errlen);

#endif
