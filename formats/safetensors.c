// safetensors reader and writer. See safetensors.h for the format and the guarantees.
#include "safetensors.h"

#include "ls_err.h"
#include "ls_file.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// The reference implementation caps headers at 100 MB; a header larger than that is a corrupt
// length field, not a model, and parsing it would only burn memory.
#define S_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
// JSON numbers are doubles; integers above 2^53 would silently lose precision.
#define S_MAX_JSON_INT 9007199254740992.0

typedef struct {
    char *path;
    uint8_t *map;
    size_t size;
} s_file_t;

struct ls_st {
    char *path;  // as given to ls_st_open
    s_file_t *files;
    size_t nfiles;
    ls_st_tensor_t *tensors;  // sorted by name once loading is complete
    size_t ntensors, cap;
};

size_t ls_dtype_size(ls_dtype_t dtype)
{
    return dtype == LS_DTYPE_F32 ? 4 : dtype == LS_DTYPE_F8E4M3 ? 1 : 2;
}

const char *ls_dtype_name(ls_dtype_t dtype)
{
    switch (dtype) {
    case LS_DTYPE_F32: return "F32";
    case LS_DTYPE_F16: return "F16";
    case LS_DTYPE_BF16: return "BF16";
    case LS_DTYPE_F8E4M3: return "F8_E4M3";
    }
    return "?";
}

static int s_dtype_parse(const char *s, ls_dtype_t *out)
{
    if (strcmp(s, "F32") == 0)
        *out = LS_DTYPE_F32;
    else if (strcmp(s, "F16") == 0)
        *out = LS_DTYPE_F16;
    else if (strcmp(s, "BF16") == 0)
        *out = LS_DTYPE_BF16;
    else if (strcmp(s, "F8_E4M3") == 0)
        *out = LS_DTYPE_F8E4M3;
    else
        return -1;
    return 0;
}

float ls_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float ls_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);  // inf or NaN (payload kept)
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        // Subnormal half: normalise the mantissa into an f32 normal.
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t ls_bf16_from_f32(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40);  // quiet NaN; rounding could turn it into inf
    bits += 0x7fffu + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

uint16_t ls_f16_from_f32(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return sign | 0x7e00;
    if (abs >= 0x477ff000u)  // rounds to >= 65520: overflow to inf
        return sign | 0x7c00;
    if (abs < 0x38800000u) {
        // Result is subnormal (or zero): shift the implicit-1 mantissa into place, RNE.
        if (abs < 0x33000000u)  // below half the smallest subnormal
            return sign;
        uint32_t e = abs >> 23;
        uint32_t m = (abs & 0x7fffff) | 0x800000;
        // The half subnormal is q * 2^-24 and the input is m * 2^(e - 150), so q = m >> (126 - e).
        uint32_t shift = 126 - e;
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return sign | (uint16_t)q;
    }
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1) - (112u << 23);
    return sign | (uint16_t)(r >> 13);
}

void ls_f32_narrow(void *dst, ls_dtype_t dtype, const float *src, size_t n)
{
    assert(dtype == LS_DTYPE_F32 || dtype == LS_DTYPE_F16 || dtype == LS_DTYPE_BF16);
    uint16_t *h = dst;
    if (dtype == LS_DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++)
            h[i] = dtype == LS_DTYPE_BF16 ? ls_bf16_from_f32(src[i]) : ls_f16_from_f32(src[i]);
}

// E4M3: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m·2^-9),
// S.1111.111 is NaN, and there are no infinities.
float ls_e4m3_to_f32(uint8_t q)
{
    int e = (q >> 3) & 0xf, m = q & 7;
    float v;
    if (e == 0xf && m == 7)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8 + m), e - 10);
    return q & 0x80 ? -v : v;
}

uint8_t ls_e4m3_from_f32(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    uint8_t sign = (uint8_t)((bits >> 24) & 0x80);
    float a = fabsf(f);
    if (isnan(f))
        return sign | 0x7f;
    if (a >= 448.0f)
        return sign | 0x7e;
    if (a < 0x1p-6f) // subnormal (or zero): a multiple of 2^-9; m = 8 is the smallest normal
        return sign | (uint8_t)nearbyintf(a * 0x1p9f);
    // normal: round the fp32 mantissa to 3 bits (nearest even; a carry moves into the
    // exponent), then rebias 127 -> 7. Below 448 nothing rounds past 448 (464 would).
    uint32_t abits = bits & 0x7fffffffu;
    uint32_t r = (abits + 0x7ffffu + ((abits >> 20) & 1)) >> 20;
    return sign | (uint8_t)(r - (120u << 3));
}

int ls_st_tensor_to_f32(const ls_st_tensor_t *t, float *dst)
{
    const uint8_t *src = t->data;
    switch (t->dtype) {
    case LS_DTYPE_F32:
        memcpy(dst, src, t->numel * 4);
        break;
    case LS_DTYPE_F16:
        for (size_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = ls_f16_to_f32(h);
        }
        break;
    case LS_DTYPE_BF16:
        for (size_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = ls_bf16_to_f32(h);
        }
        break;
    case LS_DTYPE_F8E4M3:
        for (size_t i = 0; i < t->numel; i++)
            dst[i] = ls_e4m3_to_f32(src[i]);
        break;
    }
    int rc = 0;
    for (size_t i = 0; i < t->numel; i++)
        if (!isfinite(dst[i]))
            rc = -1;
    return rc;
}

static void s_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t at = 0;
    at += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (at < len)
        snprintf(buf + at, len - at, "]");
}

int ls_st_tensor_check_shape(const ls_st_tensor_t *t, int ndim, const int64_t *shape,
                             char *err, size_t errlen)
{
    bool ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = t->shape[i] == shape[i];
    if (ok)
        return 0;
    char have[160], want[160];
    s_shape_str(have, sizeof have, t->ndim, t->shape);
    s_shape_str(want, sizeof want, ndim, shape);
    ls_err_set(err, errlen, "%s: tensor \"%s\": shape %s does not match the expected %s", t->file,
          t->name, have, want);
    return -1;
}

// --- reading ---------------------------------------------------------------------------------

static bool s_json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= S_MAX_JSON_INT) || d != floor(d))
        return false;
    *out = (uint64_t)d;
    return true;
}

static ls_st_tensor_t *s_push(ls_st_t *st)
{
    if (st->ntensors == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 64;
        ls_st_tensor_t *n = realloc(st->tensors, cap * sizeof *n);
        if (!n)
            return NULL;
        st->tensors = n;
        st->cap = cap;
    }
    ls_st_tensor_t *t = &st->tensors[st->ntensors];
    memset(t, 0, sizeof *t);
    return t;
}

// Validates one header entry and appends it. data/dsize describe the file's data section.
static int s_parse_entry(ls_st_t *st, const s_file_t *f, const cJSON *e, const uint8_t *data,
                         size_t dsize, char *err, size_t errlen)
{
    const char *name = e->string;
    if (!cJSON_IsObject(e)) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": header entry is not a JSON object", f->path, name);
        return -1;
    }
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd)) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": \"dtype\" is missing or not a string", f->path,
              name);
        return -1;
    }
    ls_dtype_t dtype;
    if (s_dtype_parse(jd->valuestring, &dtype) != 0) {
        ls_err_set(err, errlen,
              "%s: tensor \"%s\": dtype \"%s\" is not supported (only BF16, F16, F32 "
              "and F8_E4M3 are loaded)",
              f->path, name, jd->valuestring);
        return -1;
    }
    if (!cJSON_IsArray(js)) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": \"shape\" is missing or not an array", f->path,
              name);
        return -1;
    }
    int ndim = cJSON_GetArraySize(js);
    if (ndim > LS_ST_MAX_DIMS) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": shape has %d dimensions, more than the %d supported",
              f->path, name, ndim, LS_ST_MAX_DIMS);
        return -1;
    }
    int64_t shape[LS_ST_MAX_DIMS];
    size_t numel = 1;
    int i = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, js) {
        uint64_t v;
        if (!s_json_uint(d, &v)) {
            ls_err_set(err, errlen,
                  "%s: tensor \"%s\": shape entry %d is not a non-negative integer", f->path,
                  name, i);
            return -1;
        }
        shape[i++] = (int64_t)v;
        if (__builtin_mul_overflow(numel, (size_t)v, &numel)) {
            ls_err_set(err, errlen, "%s: tensor \"%s\": shape element count overflows", f->path, name);
            return -1;
        }
    }
    size_t nbytes;
    if (__builtin_mul_overflow(numel, ls_dtype_size(dtype), &nbytes)) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": shape byte size overflows", f->path, name);
        return -1;
    }
    uint64_t begin, end;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 ||
        !s_json_uint(cJSON_GetArrayItem(jo, 0), &begin) ||
        !s_json_uint(cJSON_GetArrayItem(jo, 1), &end)) {
        ls_err_set(err, errlen,
              "%s: tensor \"%s\": \"data_offsets\" is not an array of two non-negative integers",
              f->path, name);
        return -1;
    }
    if (begin > end || end > dsize) {
        ls_err_set(err, errlen,
              "%s: tensor \"%s\": data offsets [%llu, %llu) exceed the data section (%zu bytes)",
              f->path, name, (unsigned long long)begin, (unsigned long long)end, dsize);
        return -1;
    }
    if (end - begin != nbytes) {
        char sh[160];
        s_shape_str(sh, sizeof sh, ndim, shape);
        ls_err_set(err, errlen,
              "%s: tensor \"%s\": data offsets [%llu, %llu) hold %llu bytes but %s %s needs %zu",
              f->path, name, (unsigned long long)begin, (unsigned long long)end,
              (unsigned long long)(end - begin), ls_dtype_name(dtype), sh, nbytes);
        return -1;
    }
    ls_st_tensor_t *t = s_push(st);
    char *nm = t ? strdup(name) : NULL;
    if (!nm) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": out of memory", f->path, name);
        return -1;
    }
    t->name = nm;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
    t->numel = numel;
    t->data = data + begin;
    t->nbytes = nbytes;
    t->file = f->path;
    st->ntensors++;
    return 0;
}

static int s_parse_header(ls_st_t *st, const s_file_t *f, char *err, size_t errlen)
{
    if (f->size < 8) {
        ls_err_set(err, errlen, "%s: file is %zu bytes, too short for the 8-byte header length",
              f->path, f->size);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | f->map[i];
    if (n > f->size - 8) {
        ls_err_set(err, errlen, "%s: header length %llu exceeds the file (%zu bytes)", f->path,
              (unsigned long long)n, f->size);
        return -1;
    }
    if (n > S_MAX_HEADER) {
        ls_err_set(err, errlen, "%s: header length %llu is above the 100 MB limit", f->path,
              (unsigned long long)n);
        return -1;
    }
    const char *hdr = (const char *)f->map + 8;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)n, &end, 0);
    if (!root) {
        ls_err_set(err, errlen, "%s: header is not valid JSON (error near byte %td of %llu)", f->path,
              end ? end - hdr : (ptrdiff_t)0, (unsigned long long)n);
        return -1;
    }
    int rc = -1;
    // Writers pad the header with spaces to align the data; anything else is corruption.
    for (const char *p = end; p < hdr + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            ls_err_set(err, errlen, "%s: header has trailing bytes after the JSON object (byte %td)",
                  f->path, p - hdr);
            goto out;
        }
    }
    if (!cJSON_IsObject(root)) {
        ls_err_set(err, errlen, "%s: header is not a JSON object", f->path);
        goto out;
    }
    const uint8_t *data = f->map + 8 + n;
    size_t dsize = f->size - 8 - (size_t)n;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) {
                ls_err_set(err, errlen, "%s: \"__metadata__\" is not a JSON object", f->path);
                goto out;
            }
            continue;
        }
        if (s_parse_entry(st, f, e, data, dsize, err, errlen) != 0)
            goto out;
    }
    rc = 0;
out:
    cJSON_Delete(root);
    return rc;
}

// Maps dir/name (opened by ls_file's rules) and appends its tensors. The file is recorded in
// st before parsing so that ls_st_destroy unmaps it whatever happens. ENOENT stays in errno
// when the file does not exist.
static int s_add_file(ls_st_t *st, const char *dir, const char *name, char *err, size_t errlen)
{
    uint64_t size;
    int fd = ls_file_open(dir, name, LS_FILE_SAFETENSORS, &size, err, errlen);
    if (fd < 0)
        return -1;
    s_file_t *nf = realloc(st->files, (st->nfiles + 1) * sizeof *nf);
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = nf ? malloc(n) : NULL;
    if (nf)
        st->files = nf;
    if (!path) {
        ls_err_set(err, errlen, "%s/%s: out of memory", dir, name);
        close(fd);
        return -1;
    }
    snprintf(path, n, "%s/%s", dir, name);
    s_file_t *f = &st->files[st->nfiles++];
    memset(f, 0, sizeof *f);
    f->path = path;
    f->size = (size_t)size;
    if (f->size > 0) {
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ls_err_set(err, errlen, "%s: cannot map: %s", path, strerror(errno));
            close(fd);
            f->size = 0;
            return -1;
        }
        f->map = m;
    }
    close(fd);
    return s_parse_header(st, f, err, errlen);
}

static int s_cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const ls_st_tensor_t *)a)->name, ((const ls_st_tensor_t *)b)->name);
}

static int s_cmp_key(const void *key, const void *b)
{
    return strcmp(key, ((const ls_st_tensor_t *)b)->name);
}

static int s_sort_and_check(ls_st_t *st, char *err, size_t errlen)
{
    if (st->ntensors > 1)
        qsort(st->tensors, st->ntensors, sizeof *st->tensors, s_cmp_tensor);
    for (size_t i = 1; i < st->ntensors; i++) {
        const ls_st_tensor_t *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->name, b->name) != 0)
            continue;
        if (a->file == b->file)
            ls_err_set(err, errlen, "%s: tensor \"%s\" is defined twice in the header", a->file,
                  a->name);
        else
            ls_err_set(err, errlen, "%s: tensor \"%s\" is also defined in %s", b->file, b->name,
                  a->file);
        return -1;
    }
    return 0;
}

// The index is input: its shard names go through ls_file, which keeps them inside the
// directory (no absolute names, "..", or links).
static int s_load_index(ls_st_t *st, const char *dir, const char *index, char *err,
                        size_t errlen)
{
    size_t len;
    char *text = ls_file_read(dir, index, LS_FILE_JSON, &len, err, errlen);
    if (!text && errno == ENOENT)
        ls_err_set(err, errlen, "%s: directory holds neither model.safetensors nor %s", dir, index);
    if (!text)
        return -1;
    int rc = -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *map = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        ls_err_set(err, errlen, "%s/%s: not valid JSON with a \"weight_map\" object", dir, index);
        goto out;
    }
    const cJSON *e;
    // Open each distinct shard once, in first-mention order.
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e)) {
            ls_err_set(err, errlen, "%s/%s: tensor \"%s\": shard name is not a string", dir, index,
                       e->string);
            goto out;
        }
        bool seen = false;
        for (const cJSON *p = map->child; p != e && !seen; p = p->next)
            seen = strcmp(p->valuestring, e->valuestring) == 0;
        if (seen)
            continue;
        if (s_add_file(st, dir, e->valuestring, err, errlen) != 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", err ? err : "");
            ls_err_set(err, errlen, "%s/%s: tensor \"%s\": shard \"%s\": %s", dir, index, e->string,
                       e->valuestring, why);
            goto out;
        }
    }
    if (s_sort_and_check(st, err, errlen) != 0)
        goto out;
    // Every tensor the index promises must be in the shard it names.
    cJSON_ArrayForEach(e, map) {
        const ls_st_tensor_t *t = ls_st_find(st, e->string);
        size_t dl = strlen(dir);
        bool ok = t && strncmp(t->file, dir, dl) == 0 && t->file[dl] == '/' &&
                  strcmp(t->file + dl + 1, e->valuestring) == 0;
        if (!ok) {
            ls_err_set(err, errlen, "%s/%s: tensor \"%s\": not found in its shard \"%s\"", dir,
                       index, e->string, e->valuestring);
            goto out;
        }
    }
    rc = 0;
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

ls_st_t *ls_st_open(const char *path, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        ls_err_set(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    ls_st_t *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        ls_err_set(err, errlen, "%s: out of memory", path);
        ls_st_destroy(&st);
        return NULL;
    }
    int rc;
    if (S_ISDIR(sb.st_mode)) {
        // Same preference as transformers: the single file first, then the sharded index.
        // nfiles stays 0 when model.safetensors could not be opened at all.
        rc = s_add_file(st, path, "model.safetensors", err, errlen);
        if (rc != 0 && st->nfiles == 0 && errno == ENOENT)
            rc = s_load_index(st, path, "model.safetensors.index.json", err, errlen);
        else if (rc == 0) {
            rc = s_sort_and_check(st, err, errlen);
        }
    } else {
        char dir[4096];
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
        rc = s_add_file(st, slash == path ? "/" : dir, slash ? slash + 1 : path, err, errlen);
        if (rc == 0)
            rc = s_sort_and_check(st, err, errlen);
    }
    if (rc != 0)
        ls_st_destroy(&st);
    return st;
}

void ls_st_destroy(ls_st_t **pst)
{
    if (!pst || !*pst)
        return;
    ls_st_t *st = *pst;
    for (size_t i = 0; i < st->ntensors; i++)
        free((char *)st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->nfiles; i++) {
        if (st->files[i].map)
            munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->path);
    free(st);
    *pst = NULL;
}

const char *ls_st_path(const ls_st_t *st)
{
    return st->path;
}

size_t ls_st_count(const ls_st_t *st)
{
    return st->ntensors;
}

const ls_st_tensor_t *ls_st_at(const ls_st_t *st, size_t i)
{
    return i < st->ntensors ? &st->tensors[i] : NULL;
}

const ls_st_tensor_t *ls_st_find(const ls_st_t *st, const char *name)
{
    if (st->ntensors == 0)
        return NULL;
    return bsearch(name, st->tensors, st->ntensors, sizeof *st->tensors, s_cmp_key);
}

// --- writing ---------------------------------------------------------------------------------

int ls_st_write(const char *path, const ls_st_write_tensor_t *tensors, size_t n, char *err,
                size_t errlen)
{
    int rc = -1;
    char *hdr = NULL;
    FILE *fp = NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!meta || !cJSON_AddStringToObject(meta, "format", "pt"))
        goto oom;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const ls_st_write_tensor_t *t = &tensors[i];
        if (t->ndim < 0 || t->ndim > LS_ST_MAX_DIMS || !t->name ||
            strcmp(t->name, "__metadata__") == 0) {
            ls_err_set(err, errlen, "%s: tensor %zu (\"%s\"): invalid name or ndim %d", path, i,
                  t->name ? t->name : "(null)", t->ndim);
            goto out;
        }
        uint64_t numel = 1;
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *shape = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        if (!shape || !cJSON_AddStringToObject(e, "dtype", ls_dtype_name(t->dtype)))
            goto oom;
        for (int d = 0; d < t->ndim; d++) {
            cJSON *v = cJSON_CreateNumber((double)t->shape[d]);
            if (!v || !cJSON_AddItemToArray(shape, v))
                goto oom;
            numel *= (uint64_t)t->shape[d];
        }
        uint64_t end = off + numel * ls_dtype_size(t->dtype);
        double offs[2] = {(double)off, (double)end};
        cJSON *jo = cJSON_CreateDoubleArray(offs, 2);
        if (!jo || !cJSON_AddItemToObject(e, "data_offsets", jo))
            goto oom;
        off = end;
    }
    hdr = cJSON_PrintUnformatted(root);
    if (!hdr)
        goto oom;
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) & ~(size_t)7;  // keeps the data section 8-byte aligned
    fp = fopen(path, "wb");
    if (!fp) {
        ls_err_set(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(le, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++)
        ok = fputc(' ', fp) != EOF;
    for (size_t i = 0; ok && i < n; i++) {
        const ls_st_write_tensor_t *t = &tensors[i];
        size_t nb = ls_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            nb *= (size_t)t->shape[d];
        ok = nb == 0 || fwrite(t->data, 1, nb, fp) == nb;
    }
    if (fclose(fp) != 0)
        ok = false;
    fp = NULL;
    if (!ok) {
        ls_err_set(err, errlen, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
    goto out;
oom:
    ls_err_set(err, errlen, "%s: out of memory while building the header", path);
out:
    if (fp)
        fclose(fp);
    free(hdr);
    cJSON_Delete(root);
    return rc;
}
