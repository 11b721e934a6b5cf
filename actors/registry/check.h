// check — what the registry verifies about an adapter before a load is dispatched.
//
// Two kinds of rules. Names are checked on the loop (pure string rules). Everything that
// touches the filesystem — resolving and confining the path, reading adapter_config.json —
// runs in check_adapter, which the actor calls on its job thread so the loop never blocks on
// disk; it reads only its arguments and the immutable check_env_t.
//
// Confinement (the HTTP API must not become a way to read or probe files): a client's path
// must be absolute, have no ".." component, lie under a root as written, and still lie under
// that root's real path after realpath (a symlink inside a root that points outside is
// refused). Whether a path exists is only revealed for paths under a root. An on-demand name
// is looked up as DIR/name in each --lora-dirs DIR with the same symlink rule.
#ifndef LS_REGISTRY_CHECK_H
#define LS_REGISTRY_CHECK_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "added_vocab.h"
#include "model_config.h"

#define CHECK_REASON_MAX 768
#define CHECK_NAME_MAX 128

typedef struct {
    const char *given;  // as configured
    const char *real;   // realpath of it
} check_root_t;

// What the checks need; set once at start and never changed, so the job thread may read it.
typedef struct {
    const check_root_t *roots;  // client paths must lie under one (--lora-roots)
    size_t n_roots;
    const check_root_t *dirs;  // on-demand names are looked up here (--lora-dirs)
    size_t n_dirs;
    const ls_model_config_t *model;  // NULL without --model-path: nothing can be validated
    int max_lora_rank;
    unsigned targets;  // bit (1u << ls_target_t) per target --lora-target-modules enables
    int extra_vocab_size;  // rows a slot holds for trainable tokens (--lora-extra-vocab-size)
} check_env_t;

typedef enum {
    CHECK_TRUSTED = 0,  // operator input (--lora-paths, the journal): the path as given
    CHECK_CONFINED,     // a client's path: must lie under a root
    CHECK_DEMAND,       // a client's adapter name: DIR/name under one of the dirs
    CHECK_TENSORS,      // the registry's copy of an adapter a client sent as tensors: the host
                        // writes it to path first; then checked as given, like CHECK_TRUSTED
} check_mode_t;

typedef struct {
    uint32_t code;  // 0 when valid, else an LS_ERROR_CODE_* for the answer
    char reason[CHECK_REASON_MAX];
    char path[PATH_MAX];  // the resolved directory
    uint32_t rank;        // largest rank over the adapted modules
    float alpha;          // lora_alpha (PEFT's default 8 when absent)
    unsigned targets;     // bit (1u << ls_target_t) per target it adapts
    uint32_t token_rows;  // rows of the embedding or lm_head it replaces (trainable tokens) or
                          // adds (added vocabulary)
    ls_added_vocab_t added;  // its tokenizer's tokens past vocab_size; reg_load_checked takes
                             // them, ls_added_vocab_free frees what it left
} check_result_t;

// 0 when name can be registered: 1..CHECK_NAME_MAX bytes, no '/', '\\' or control
// characters, not "." or "..". Otherwise -1 and a sentence in reason.
int check_name(const char *name, char *reason, size_t cap);

// Resolve and validate one adapter; out->code says whether it passed.
void check_adapter(const check_env_t *env, check_mode_t mode, const char *name, const char *path,
                   check_result_t *out);

// "q_proj, v_proj" for a target mask, into out.
void check_targets_format(unsigned targets, char *out, size_t cap);

#endif
