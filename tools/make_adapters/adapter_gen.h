// adapter_gen — one random PEFT LoRA adapter for a base model, as PEFT lays it out on disk:
// adapter_config.json + adapter_model.safetensors with
// base_model.model.model.layers.{l}.{self_attn|mlp}.{proj}.lora_A.weight  (r, in) and
// ...lora_B.weight (out, r), shapes from the model's config.json.
//
// Values are a pure function of (seed, adapter index, layer, target, A or B): a counter-based
// generator (splitmix64 of a per-tensor key plus the element index) fills each tensor straight
// in the output dtype, so the same seed gives byte-identical files whichever thread writes
// them, and adapter i is the same whether it is written alone (--start) or among thousands.
//
//   A ~ uniform, std 1/sqrt(in): A x keeps the rms of x (the scale of PEFT's kaiming init).
//   B ~ uniform, std b_scale / (scaling * sqrt(r)): scaling * B (A x) then has about b_scale
//       times the rms of x, whatever the rank, alpha or rslora. PEFT starts B at zero, which
//       would make every adapter a no-op; a nonzero B makes each adapter change the model.
//
// An adapter is written into OUT/.NAME.tmp and renamed to OUT/NAME when both files are
// complete, so a directory named like an adapter is never half written (a crash leaves only
// the hidden .tmp, which the next run removes).
#ifndef LS_TOOLS_ADAPTER_GEN_H
#define LS_TOOLS_ADAPTER_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "model_config.h"

typedef struct {
    const ls_model_config_t *cfg;
    const char *base_model; // adapter_config.json's base_model_name_or_path
    unsigned target_mask;   // bits (1u << ls_target_t)
    ls_dtype_t dtype;
    uint64_t seed;
    double lora_alpha; // > 0: every adapter's alpha; 0: alpha_ratio * r
    double alpha_ratio;
    bool use_rslora;
    double b_scale;
} mkad_spec_t;

// lora_alpha of an adapter of rank r.
double mkad_alpha(const mkad_spec_t *s, int rank);
// B's values of an adapter of rank r lie in [-bound, bound).
double mkad_b_bound(const mkad_spec_t *s, int rank);
// Bytes of the tensors of an adapter of rank r (the data section of its safetensors file):
// the scratch buffer mkad_write needs.
size_t mkad_tensor_bytes(const mkad_spec_t *s, int rank);
// About the whole adapter on disk: tensors, the safetensors header and adapter_config.json.
size_t mkad_disk_bytes(const mkad_spec_t *s, int rank);

// Writes adapter `index` of rank r as out_dir/name, replacing an existing out_dir/name only
// when overwrite is set. buf holds mkad_tensor_bytes(s, rank) bytes of scratch. On success 0
// and *bytes = the size of both files; otherwise -1, one sentence in err and *err_no = the
// errno of the failed call (ENOSPC when the disk is full), and never a half-written adapter
// under name.
int mkad_write(const mkad_spec_t *s, long index, int rank, const char *out_dir, const char *name,
               bool overwrite, void *buf, size_t *bytes, int *err_no, char *err, size_t errlen);

// The names of the targets of mask, in model order, as a JSON array (PEFT's target_modules).
cJSON *mkad_target_list(unsigned target_mask);

// Bytes of the two files of an adapter directory (0 for those missing).
size_t mkad_dir_bytes(const char *dir);

// Removes path and, for a directory, everything under it. 0, or -1 with errno set.
int mkad_rmrf(const char *path);

#endif
