// adapter_gen — see adapter_gen.h.
#define _GNU_SOURCE
#include "adapter_gen.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "safetensors.h"

#define S_GOLDEN 0x9e3779b97f4a7c15ULL
#define S_NAME_MAX 96
#define S_BLOCK 1024  // values made per block: 4 KB of floats, in L1

// splitmix64's output function: a bijection on 64 bits that passes BigCrush on a counter.
static inline uint64_t s_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// The key of one tensor's stream, from everything that names it and nothing else.
static uint64_t s_tensor_key(uint64_t seed, long index, int layer, ls_target_t t, int is_b)
{
    uint64_t k = s_mix64(seed + S_GOLDEN);
    k = s_mix64(k ^ (uint64_t)index);
    return s_mix64(k ^ ((uint64_t)(layer * LS_TARGET_COUNT + (int)t) << 1 | (uint64_t)is_b));
}

// bf16 by round to nearest even: what ls_bf16_from_f32 does for finite values (the only
// ones made here), inline so the loop over a block vectorizes instead of calling per value.
static inline uint16_t s_bf16_rne(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);
}

// n uniform values on [-bound, bound) into dst in dtype, made a block at a time and converted
// as they are made (bf16 and f16 round to nearest even), so no fp32 copy of the adapter exists.
// Values 2p and 2p+1 are the two signed 32-bit halves of splitmix64 at counter p, scaled to
// bound: uniform, always finite, and a pure function of (key, index).
static void s_fill(void *dst, ls_dtype_t dtype, size_t n, uint64_t key, float bound)
{
    float scale = bound * 0x1p-31f, block[S_BLOCK];
    for (size_t i0 = 0; i0 < n; i0 += S_BLOCK) {
        size_t m = n - i0 < S_BLOCK ? n - i0 : S_BLOCK;
        for (size_t j = 0; j < m; j += 2) {  // S_BLOCK is even: block[j + 1] exists
            uint64_t z = s_mix64(key + (uint64_t)((i0 + j) / 2 + 1) * S_GOLDEN);
            block[j] = (float)(int32_t)(uint32_t)z * scale;
            block[j + 1] = (float)(int32_t)(uint32_t)(z >> 32) * scale;
        }
        switch (dtype) {
        case LS_DTYPE_F32:
            memcpy((float *)dst + i0, block, m * sizeof(float));
            break;
        case LS_DTYPE_BF16:
            for (size_t j = 0; j < m; j++)
                ((uint16_t *)dst)[i0 + j] = s_bf16_rne(block[j]);
            break;
        case LS_DTYPE_F16:
            for (size_t j = 0; j < m; j++)
                ((uint16_t *)dst)[i0 + j] = ls_f16_from_f32(block[j]);
            break;
        case LS_DTYPE_F8E4M3:
            for (size_t j = 0; j < m; j++)
                ((uint8_t *)dst)[i0 + j] = ls_e4m3_from_f32(block[j]);
            break;
        }
    }
}

double mkad_alpha(const mkad_spec_t *s, int rank)
{
    return s->lora_alpha > 0 ? s->lora_alpha : s->alpha_ratio * rank;
}

double mkad_b_bound(const mkad_spec_t *s, int rank)
{
    double scaling = mkad_alpha(s, rank) / (s->use_rslora ? sqrt(rank) : rank);
    return sqrt(3.0) * s->b_scale / (scaling * sqrt(rank));
}

static int s_num_targets(const mkad_spec_t *s)
{
    return __builtin_popcount(s->target_mask & ((1u << LS_TARGET_COUNT) - 1));
}

size_t mkad_tensor_bytes(const mkad_spec_t *s, int rank)
{
    size_t per_layer = 0;
    for (int t = 0; t < LS_TARGET_COUNT; t++)
        if (s->target_mask & (1u << t)) {
            int in, out;
            ls_model_config_target_dims(s->cfg, (ls_target_t)t, &in, &out);
            per_layer += (size_t)rank * ((size_t)in + (size_t)out);
        }
    return per_layer * (size_t)s->cfg->num_hidden_layers * ls_dtype_size(s->dtype);
}

size_t mkad_disk_bytes(const mkad_spec_t *s, int rank)
{
    // a header entry is under 160 bytes; adapter_config.json under 2 KB
    size_t tensors = (size_t)s->cfg->num_hidden_layers * (size_t)s_num_targets(s) * 2;
    return mkad_tensor_bytes(s, rank) + tensors * 160 + 2048;
}

static int s_rmrf_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

int mkad_rmrf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return -1;
    return nftw(path, s_rmrf_one, 16, FTW_DEPTH | FTW_PHYS);
}

cJSON *mkad_target_list(unsigned target_mask)
{
    cJSON *list = cJSON_CreateArray();
    for (int t = 0; t < LS_TARGET_COUNT; t++)
        if (target_mask & (1u << t))
            cJSON_AddItemToArray(list, cJSON_CreateString(ls_target_name((ls_target_t)t)));
    return list;
}

// adapter_config.json with the keys every PEFT release since rsLoRA (0.7) knows, so older
// and newer PEFT both read it; the rest take PEFT's defaults.
static int s_write_config(const char *path, const mkad_spec_t *s, int rank, char *err, size_t errlen)
{
    // keys in PEFT's order (it writes them sorted)
    cJSON *c = cJSON_CreateObject();
    cJSON_AddObjectToObject(c, "alpha_pattern");
    cJSON_AddStringToObject(c, "base_model_name_or_path", s->base_model);
    cJSON_AddStringToObject(c, "bias", "none");
    cJSON_AddBoolToObject(c, "fan_in_fan_out", false);
    cJSON_AddBoolToObject(c, "inference_mode", true);
    cJSON_AddBoolToObject(c, "init_lora_weights", true);
    cJSON_AddNullToObject(c, "layers_pattern");
    cJSON_AddNullToObject(c, "layers_to_transform");
    cJSON_AddNumberToObject(c, "lora_alpha", mkad_alpha(s, rank));
    cJSON_AddNumberToObject(c, "lora_dropout", 0);
    cJSON_AddNullToObject(c, "modules_to_save");
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddNumberToObject(c, "r", rank);
    cJSON_AddObjectToObject(c, "rank_pattern");
    cJSON_AddNullToObject(c, "revision");
    cJSON_AddItemToObject(c, "target_modules", mkad_target_list(s->target_mask));
    cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
    cJSON_AddBoolToObject(c, "use_dora", false);
    cJSON_AddBoolToObject(c, "use_rslora", s->use_rslora);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    if (!text) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    FILE *fp = fopen(path, "w");
    bool ok = fp && fputs(text, fp) >= 0 && fputc('\n', fp) != EOF;
    if (fp && fclose(fp) != 0)
        ok = false;
    free(text);
    if (!ok)
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return ok ? 0 : -1;
}

// The tensors of the adapter, generated into buf (mkad_tensor_bytes) in file order: layer by
// layer, targets in model order, A before B. names holds S_NAME_MAX bytes per tensor.
static size_t s_tensors(const mkad_spec_t *s, long index, int rank, void *buf, char *names,
                        ls_st_write_tensor_t *ts)
{
    size_t n = 0, esize = ls_dtype_size(s->dtype);
    char *p = buf;
    for (int l = 0; l < s->cfg->num_hidden_layers; l++)
        for (int t = 0; t < LS_TARGET_COUNT; t++) {
            if (!(s->target_mask & (1u << t)))
                continue;
            int in, out;
            ls_model_config_target_dims(s->cfg, (ls_target_t)t, &in, &out);
            // uniform on [-b, b) has std b / sqrt(3)
            float bound[2] = {(float)(sqrt(3.0) / sqrt(in)), (float)mkad_b_bound(s, rank)};
            for (int is_b = 0; is_b < 2; is_b++) {
                ls_st_write_tensor_t *w = &ts[n];
                char *name = names + n * S_NAME_MAX;
                snprintf(name, S_NAME_MAX, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l,
                         ls_target_parent((ls_target_t)t), ls_target_name((ls_target_t)t), is_b ? 'B' : 'A');
                // A is (r, in), B is (out, r)
                *w = (ls_st_write_tensor_t){name, s->dtype, 2, {is_b ? out : rank, is_b ? rank : in}, p};
                size_t numel = (size_t)rank * (size_t)(is_b ? out : in);
                s_fill(p, s->dtype, numel, s_tensor_key(s->seed, index, l, (ls_target_t)t, is_b),
                       bound[is_b]);
                p += numel * esize;
                n++;
            }
        }
    return n;
}

size_t mkad_dir_bytes(const char *dir)
{
    static const char *const files[] = {"adapter_model.safetensors", "adapter_config.json"};
    size_t sum = 0;
    for (int i = 0; i < 2; i++) {
        char path[PATH_MAX + 32];
        struct stat st;
        snprintf(path, sizeof path, "%.*s/%s", PATH_MAX - 1, dir, files[i]);
        if (stat(path, &st) == 0)
            sum += (size_t)st.st_size;
    }
    return sum;
}

int mkad_write(const mkad_spec_t *s, long index, int rank, const char *out_dir, const char *name,
               bool overwrite, void *buf, size_t *bytes, int *err_no, char *err, size_t errlen)
{
    char tmp[PATH_MAX], final[PATH_MAX], old[PATH_MAX], path[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", out_dir, name);
    snprintf(final, sizeof final, "%s/%s", out_dir, name);
    snprintf(old, sizeof old, "%s/.%s.old", out_dir, name);
    size_t cap = (size_t)s->cfg->num_hidden_layers * LS_TARGET_COUNT * 2;
    ls_st_write_tensor_t *ts = malloc(cap * sizeof *ts);
    char *names = malloc(cap * S_NAME_MAX);
    int rc = -1;
    *err_no = 0;
    if (!ts || !names) {
        *err_no = ENOMEM;
        snprintf(err, errlen, "%s: out of memory", name);
        goto out;
    }
    // a .tmp here is the leftover of an interrupted run: never a complete adapter
    if ((mkad_rmrf(tmp) < 0 && errno != ENOENT) || mkdir(tmp, 0755) < 0) {
        *err_no = errno;
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    size_t n = s_tensors(s, index, rank, buf, names, ts);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", tmp);
    errno = 0;
    if (ls_st_write(path, ts, n, err, errlen) < 0) {
        *err_no = errno;
        goto out;
    }
    snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
    if (s_write_config(path, s, rank, err, errlen) < 0) {
        *err_no = errno;
        goto out;
    }
    *bytes = mkad_dir_bytes(tmp);
    // rename() cannot replace a non-empty directory: the old adapter steps aside first
    if (overwrite &&
        ((mkad_rmrf(old) < 0 && errno != ENOENT) || (rename(final, old) < 0 && errno != ENOENT))) {
        *err_no = errno;
        snprintf(err, errlen, "cannot move the existing %s aside: %s", final, strerror(errno));
        goto out;
    }
    if (rename(tmp, final) < 0) {
        *err_no = errno;
        snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        goto out;
    }
    if (overwrite && mkad_rmrf(old) < 0 && errno != ENOENT) {
        *err_no = errno;
        snprintf(err, errlen, "%s is written, but the replaced copy %s could not be removed: %s", final, old,
                 strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (rc < 0) {
        int keep = errno;
        mkad_rmrf(tmp);
        errno = keep;
    }
    free(ts);
    free(names);
    return rc;
}
