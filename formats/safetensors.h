// safetensors: read-only, validated access to HF .safetensors checkpoints, plus a small writer.
//
// A file is an 8-byte little-endian header length N, N bytes of JSON header, then the data
// section. Every header entry is validated (dtype, shape, offsets, sizes) before any tensor is
// exposed, so callers never see a tensor whose bytes lie outside the mapping. Files are mapped
// read-only (mmap); tensor data points into the mapping and stays valid until ls_st_destroy.
//
// Known limits: only BF16, F16, F32 and F8_E4M3 tensors are accepted (a checkpoint with an
// integer or other fp8 tensor is refused, naming it); tensor data is not necessarily aligned (the format does
// not require it), so read it with memcpy or ls_st_tensor_to_f32.
#ifndef LS_SAFETENSORS_H
#define LS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    LS_DTYPE_F32 = 0,
    LS_DTYPE_F16,
    LS_DTYPE_BF16,
    LS_DTYPE_F8E4M3, // float8_e4m3fn: no infinities, 0x7f and 0xff are NaN, ±448 at most
} ls_dtype_t;

// Bytes per element (4, 2, 2, 1).
size_t ls_dtype_size(ls_dtype_t dtype);
// The safetensors spelling: "F32", "F16", "BF16", "F8_E4M3".
const char *ls_dtype_name(ls_dtype_t dtype);

// Scalar conversions. The *_from_f32 ones round to nearest even and keep NaN a NaN.
float ls_bf16_to_f32(uint16_t h);
float ls_f16_to_f32(uint16_t h);
uint16_t ls_bf16_from_f32(float f);
uint16_t ls_f16_from_f32(float f);
// dst (n values of dtype F32, F16 or BF16) = src (n fp32 values), rounded as above.
void ls_f32_narrow(void *dst, ls_dtype_t dtype, const float *src, size_t n);
// E4M3 (float8_e4m3fn). ls_e4m3_from_f32 rounds to nearest even and saturates: anything of
// magnitude >= 448 (infinities too) becomes ±448, as fp8 quantizers clamp before they cast;
// NaN becomes 0x7f (with the sign).
float ls_e4m3_to_f32(uint8_t q);
uint8_t ls_e4m3_from_f32(float f);

#define LS_ST_MAX_DIMS 8

typedef struct {
    const char *name;
    ls_dtype_t dtype;
    int ndim;
    int64_t shape[LS_ST_MAX_DIMS];
    size_t numel;
    const void *data;  // numel elements of dtype, possibly unaligned, inside the mapping
    size_t nbytes;     // numel * ls_dtype_size(dtype)
    const char *file;  // path of the file that holds the tensor
} ls_st_tensor_t;

typedef struct ls_st ls_st_t;

// Opens a .safetensors file, or a directory holding model.safetensors or (when that is absent)
// model.safetensors.index.json and its shards. Every file is opened by ls_file's rules (a
// regular file, no symbolic link, no ".." or absolute shard name, within the size limit).
// Returns NULL and writes one sentence naming the file (and the tensor or key) into err.
ls_st_t *ls_st_open(const char *path, char *err, size_t errlen);
void ls_st_destroy(ls_st_t **st);

// The path given to ls_st_open (file or directory), for messages about the whole checkpoint.
const char *ls_st_path(const ls_st_t *st);

// Tensors are kept sorted by name; ls_st_at(st, i) for i < ls_st_count(st) iterates them.
size_t ls_st_count(const ls_st_t *st);
const ls_st_tensor_t *ls_st_at(const ls_st_t *st, size_t i);
// NULL when absent.
const ls_st_tensor_t *ls_st_find(const ls_st_t *st, const char *name);

// Converts the tensor to f32 into dst (numel floats). Returns 0 when every value is finite,
// -1 when at least one is NaN or infinite (dst is still fully written), so loaders that must
// refuse non-finite weights get the check for free.
int ls_st_tensor_to_f32(const ls_st_tensor_t *t, float *dst);

// 0 when t has exactly the expected shape; otherwise -1 and an error such as
// `x.safetensors: tensor "w": shape [4, 8] does not match the expected [4, 16]`.
int ls_st_tensor_check_shape(const ls_st_tensor_t *t, int ndim, const int64_t *shape,
                             char *err, size_t errlen);

// One tensor for ls_st_write: data holds numel elements already in dtype (use the scalar
// conversions above to produce bf16/f16).
typedef struct {
    const char *name;
    ls_dtype_t dtype;
    int ndim;
    int64_t shape[LS_ST_MAX_DIMS];
    const void *data;
} ls_st_write_tensor_t;

// Writes n tensors to path as a safetensors file (header padded to 8 bytes, data contiguous in
// the given order, "__metadata__": {"format": "pt"} as HF writes it). Returns 0 or -1 + err.
int ls_st_write(const char *path, const ls_st_write_tensor_t *tensors, size_t n,
                char *err, size_t errlen);

#endif
