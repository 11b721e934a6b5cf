// lora_spec — one adapter loaded at start, as the operator writes it in --lora-paths (SGLang)
// or --lora-modules (vLLM). The one parser of these values: the launcher checks them before
// anything starts, the registry loads them, the scheduler and the workers allow their paths.
//
// Accepted forms:
//   name=path[:pinned]                      SGLang and vLLM
//   path                                    SGLang: the name is the directory's basename
//   {"lora_name": N, "lora_path": P, "pinned": B}   SGLang's JSON ("pinned" optional)
//   {"name": N, "path": P, "base_model_name": M}    vLLM's JSON (M optional, not used: one
//                                                   base model is served)
#ifndef LS_LORA_SPEC_H
#define LS_LORA_SPEC_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *name;  // owned
    char *path;  // owned
    bool pinned;
} lora_spec_t;

// Parse one value. Returns 0, or -1 with a message naming the value in err (spec left empty).
int lora_spec_parse(const char *value, lora_spec_t *spec, char *err, size_t errlen);
// Free what lora_spec_parse allocated; safe on an empty or cleared spec.
void lora_spec_clear(lora_spec_t *spec);

#endif
