/*  ls_msg.c — encode, decode, print, compare, JSON and random fill for every message,
    driven by the descriptor tables msggen generates from messages/schema.msg.

    One generic walker per operation instead of generated code per message: the schema
    gives each field a kind and an offset, and every operation below is a switch over
    kinds. A new message or field therefore needs no code here, and every operation is
    tested on every message by the same tests.

    Decoding untrusted input has one rule: every problem goes to one malformed path that
    returns -1 with a reason, never an assert. Memory use is bounded:
      - msgpack-c allocates count * sizeof (msgpack_object) as soon as it reads an array
        or map header, before the elements arrive, so a five-byte body could ask for
        100 GB. s_prescan walks the headers first and refuses any that promise more items
        than there are bytes left; msgpack-c's own tree then stays below ~48 bytes per
        input byte (one msgpack_object_kv per two bytes of map).
      - the decoded message is charged against a budget of 16 bytes per input byte plus
        1 MiB (s_dec_alloc). The slack covers small bodies whose records are mostly zero
        (an all-zero StepItem is one byte on the wire and ~200 in memory).
*/
#include "ls_msg.h"
#include "ls_msg_desc.h"

#include <cJSON.h>
#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ls_limits.h"

#define DECODE_BYTES_PER_INPUT_BYTE 16
#define DECODE_SLACK_BYTES (1u << 20)
#define FORMAT_MAX_ITEMS 8  // array items the printer shows before "...+N"
#define FORMAT_MAX_CHARS 48 // string bytes (and bytes bytes) the printer shows

static const lsm_struct_t *s_message(int type) {
    return type > 0 && (size_t)type < lsm_messages_limit ? lsm_messages[type] : NULL;
}

static bool s_is_array(lsm_kind_t kind) {
    return kind >= LSM_I32S;
}

static lsm_kind_t s_elem_kind(lsm_kind_t kind) {
    switch (kind) {
    case LSM_I32S: return LSM_I32;
    case LSM_U32S: return LSM_U32;
    case LSM_U64S: return LSM_U64;
    case LSM_F32S: return LSM_F32;
    case LSM_STRS: return LSM_STR;
    case LSM_TEXTS: return LSM_TEXT;
    case LSM_RECORDS: return LSM_RECORD;
    default: return kind;
    }
}

//  C size of one value of a non-array kind.
static size_t s_value_size(const lsm_field_t *f, lsm_kind_t kind) {
    switch (kind) {
    case LSM_BOOL: return sizeof(bool);
    case LSM_I32:
    case LSM_U32:
    case LSM_ENUM:
    case LSM_F32: return 4;
    case LSM_U64:
    case LSM_I64:
    case LSM_F64: return 8;
    case LSM_STR: return sizeof(char *);
    case LSM_BYTES: return sizeof(ls_bytes_t);
    case LSM_TEXT: return sizeof(ls_text_t);
    case LSM_RECORD: return f->record->size;
    default: return sizeof(lsm_array_t);
    }
}

//  Every array type is {T *v; size_t n;}; memcpy keeps this free of aliasing tricks.
static lsm_array_t s_array(const void *p) {
    lsm_array_t a;
    memcpy(&a, p, sizeof a);
    return a;
}

#define S_AT(base, offset) ((char *)(base) + (offset))
#define S_CAT(base, offset) ((const char *)(base) + (offset))

//  --------------------------------------------------------------------------
//  Clear

static void s_free_struct(const lsm_struct_t *st, void *base);

static void s_free_value(const lsm_field_t *f, lsm_kind_t kind, void *p) {
    if (kind == LSM_STR)
        free(*(char **)p);
    else if (kind == LSM_BYTES)
        free(((ls_bytes_t *)p)->data);
    else if (kind == LSM_TEXT)
        free(((ls_text_t *)p)->s);
    else if (kind == LSM_RECORD)
        s_free_struct(f->record, p);
    else if (s_is_array(kind)) {
        lsm_array_t a = s_array(p);
        lsm_kind_t elem = s_elem_kind(kind);
        size_t size = s_value_size(f, elem);
        for (size_t i = 0; i < a.n && a.v; i++)
            s_free_value(f, elem, S_AT(a.v, i * size));
        free(a.v);
    }
}

static void s_free_struct(const lsm_struct_t *st, void *base) {
    for (size_t i = 0; i < st->count; i++)
        s_free_value(&st->fields[i], st->fields[i].kind, S_AT(base, st->fields[i].offset));
}

void ls_msg_init(ls_msg_t *m, ls_msg_type_t type) {
    memset(m, 0, sizeof *m);
    m->type = (uint16_t)type;
    m->version = LS_SCHEMA_VERSION;
}

void ls_msg_clear(ls_msg_t *m) {
    const lsm_struct_t *st = s_message(m->type);
    if (st)
        s_free_struct(st, &m->u);
    memset(m, 0, sizeof *m);
}

ls_text_t ls_msg_textdup(const char *s, size_t len) {
    ls_text_t t = {NULL, 0};
    if (s && (t.s = malloc(len + 1))) {
        memcpy(t.s, s, len);
        t.s[len] = 0;
        t.len = len;
    }
    return t;
}

char *ls_msg_strdup(const char *s) {
    if (!s)
        return NULL;
    size_t size = strlen(s) + 1;
    char *copy = malloc(size);
    if (copy)
        memcpy(copy, s, size);
    return copy;
}

const char *lsm_enum_name(const lsm_enum_t *e, uint32_t v) {
    for (size_t i = 0; i < e->count; i++)
        if (e->values[i].value == v)
            return e->values[i].name;
    return NULL;
}

const char *ls_msg_type_name(int type) {
    const lsm_struct_t *st = s_message(type);
    return st ? st->name : NULL;
}

int ls_msg_type_from_name(const char *name) {
    for (size_t type = 1; name && type < lsm_messages_limit; type++)
        if (lsm_messages[type] && strcmp(lsm_messages[type]->name, name) == 0)
            return (int)type;
    return -1;
}

//  --------------------------------------------------------------------------
//  Encode. A field at its zero value is left out, as the decoder reads a missing
//  field as zero. Floats count as zero only when every bit is, so -0.0 survives.

static bool s_is_zero_struct(const lsm_struct_t *st, const void *base);

static bool s_is_zero(const lsm_field_t *f, const void *p) {
    uint32_t bits32;
    uint64_t bits64;
    switch (f->kind) {
    case LSM_BOOL: return !*(const bool *)p;
    case LSM_I32:
    case LSM_U32:
    case LSM_ENUM:
    case LSM_F32: memcpy(&bits32, p, 4); return bits32 == 0;
    case LSM_U64:
    case LSM_I64:
    case LSM_F64: memcpy(&bits64, p, 8); return bits64 == 0;
    case LSM_STR: return *(char *const *)p == NULL;
    case LSM_BYTES: return ((const ls_bytes_t *)p)->len == 0;
    case LSM_TEXT: return ((const ls_text_t *)p)->s == NULL;
    case LSM_RECORD: return s_is_zero_struct(f->record, p);
    default: return s_array(p).n == 0;
    }
}

static bool s_is_zero_struct(const lsm_struct_t *st, const void *base) {
    for (size_t i = 0; i < st->count; i++)
        if (!s_is_zero(&st->fields[i], S_CAT(base, st->fields[i].offset)))
            return false;
    return true;
}

static int s_pack_struct(msgpack_packer *pk, const lsm_struct_t *st, const void *base);

//  Returns 0, or non-zero when the buffer could not grow or an array is too long for
//  msgpack's 32-bit counts.
static int s_pack_value(msgpack_packer *pk, const lsm_field_t *f, lsm_kind_t kind, const void *p) {
    switch (kind) {
    case LSM_BOOL: return *(const bool *)p ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case LSM_I32: return msgpack_pack_int32(pk, *(const int32_t *)p);
    case LSM_U32:
    case LSM_ENUM: return msgpack_pack_uint32(pk, *(const uint32_t *)p);
    case LSM_U64: return msgpack_pack_uint64(pk, *(const uint64_t *)p);
    case LSM_I64: return msgpack_pack_int64(pk, *(const int64_t *)p);
    case LSM_F32: return msgpack_pack_float(pk, *(const float *)p);
    case LSM_F64: return msgpack_pack_double(pk, *(const double *)p);
    case LSM_STR: {
        const char *s = *(char *const *)p;
        if (!s)
            return msgpack_pack_nil(pk); // a NULL inside str[]
        size_t len = strlen(s);
        return msgpack_pack_str(pk, len) | msgpack_pack_str_body(pk, s, len);
    }
    case LSM_TEXT: {
        const ls_text_t *t = p;
        if (!t->s)
            return msgpack_pack_nil(pk); // a NULL inside text[]
        return msgpack_pack_str(pk, t->len) | msgpack_pack_str_body(pk, t->s, t->len);
    }
    case LSM_BYTES: {
        const ls_bytes_t *bytes = p;
        return msgpack_pack_bin(pk, bytes->len) |
               (bytes->len ? msgpack_pack_bin_body(pk, bytes->data, bytes->len) : 0);
    }
    case LSM_RECORD: return s_pack_struct(pk, f->record, p);
    default: {
        lsm_array_t a = s_array(p);
        lsm_kind_t elem = s_elem_kind(kind);
        size_t size = s_value_size(f, elem);
        if (a.n > UINT32_MAX)
            return -1;
        int rc = msgpack_pack_array(pk, a.n);
        for (size_t i = 0; i < a.n && rc == 0; i++)
            rc = s_pack_value(pk, f, elem, S_CAT(a.v, i * size));
        return rc;
    }
    }
}

static int s_pack_struct(msgpack_packer *pk, const lsm_struct_t *st, const void *base) {
    size_t present = 0;
    for (size_t i = 0; i < st->count; i++)
        present += !s_is_zero(&st->fields[i], S_CAT(base, st->fields[i].offset));
    int rc = msgpack_pack_map(pk, present);
    for (size_t i = 0; i < st->count && rc == 0; i++) {
        const lsm_field_t *f = &st->fields[i];
        if (!s_is_zero(f, S_CAT(base, f->offset)))
            rc = msgpack_pack_uint32(pk, f->id) | s_pack_value(pk, f, f->kind, S_CAT(base, f->offset));
    }
    return rc;
}

int ls_msg_encode(const ls_msg_t *m, char **buf, size_t *len) {
    const lsm_struct_t *st = s_message(m->type);
    if (!st)
        return -1;
    msgpack_sbuffer sbuf;
    msgpack_sbuffer_init(&sbuf);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sbuf, msgpack_sbuffer_write);
    int rc = msgpack_pack_array(&pk, 5) | msgpack_pack_uint16(&pk, LS_SCHEMA_VERSION) |
             msgpack_pack_uint16(&pk, m->type) | msgpack_pack_uint32(&pk, m->group) |
             msgpack_pack_uint64(&pk, m->rid);
    if (rc == 0)
        rc = s_pack_struct(&pk, st, &m->u);
    //  the peer would refuse it, so refuse it here where the caller can still react
    if (rc || sbuf.size > LS_MSG_MAX_BYTES) {
        msgpack_sbuffer_destroy(&sbuf);
        return -1;
    }
    *buf = sbuf.data; // sbuffer allocates with malloc/realloc: free() releases it
    *len = sbuf.size;
    return 0;
}

//  --------------------------------------------------------------------------
//  Decode

//  Walk the msgpack headers without building anything (see the file header). Returns
//  NULL when every header fits in the bytes left, else why not.
static const char *s_prescan(const uint8_t *p, size_t len) {
    size_t pos = 0;
    uint64_t pending = 1; // items still to read
    while (pending) {
        if (pos >= len)
            return "truncated";
        uint8_t b = p[pos++];
        uint64_t items = 0, payload = 0;
        size_t width = 0; // bytes of the big-endian length that follows b
        char what = 0;    // 's' str/bin, 'e' ext, 'a' array, 'm' map
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
            ; // fixint, nil, false, true: just the byte
        else if (b <= 0x8f)
            items = 2 * (b & 0x0f);
        else if (b <= 0x9f)
            items = b & 0x0f;
        else if (b <= 0xbf)
            payload = b & 0x1f;
        else
            switch (b) {
            case 0xc4:
            case 0xd9:
                width = 1;
                what = 's';
                break;
            case 0xc5:
            case 0xda:
                width = 2;
                what = 's';
                break;
            case 0xc6:
            case 0xdb:
                width = 4;
                what = 's';
                break;
            case 0xc7:
                width = 1;
                what = 'e';
                break;
            case 0xc8:
                width = 2;
                what = 'e';
                break;
            case 0xc9:
                width = 4;
                what = 'e';
                break;
            case 0xdc:
                width = 2;
                what = 'a';
                break;
            case 0xdd:
                width = 4;
                what = 'a';
                break;
            case 0xde:
                width = 2;
                what = 'm';
                break;
            case 0xdf:
                width = 4;
                what = 'm';
                break;
            case 0xcc:
            case 0xd0: payload = 1; break;
            case 0xcd:
            case 0xd1:
            case 0xd4: payload = 2; break; // d4..d8: fixext, type byte included
            case 0xd5: payload = 3; break;
            case 0xce:
            case 0xd2:
            case 0xca: payload = 4; break;
            case 0xd6: payload = 5; break;
            case 0xcf:
            case 0xd3:
            case 0xcb: payload = 8; break;
            case 0xd7: payload = 9; break;
            case 0xd8: payload = 17; break;
            default: return "reserved byte 0xc1";
            }
        if (width) {
            if (len - pos < width)
                return "truncated";
            uint64_t n = 0;
            for (size_t i = 0; i < width; i++)
                n = (n << 8) | p[pos++];
            if (what == 'a')
                items = n;
            else if (what == 'm')
                items = 2 * n;
            else
                payload = n + (what == 'e'); // ext: a type byte, then n bytes
        }
        if (payload > len - pos)
            return "truncated";
        pos += payload;
        pending = pending - 1 + items;
        if (pending > len - pos)
            return "truncated (a header promises more items than bytes are left)";
    }
    return pos == len ? NULL : "trailing bytes after the body";
}

typedef struct {
    size_t budget; // bytes the decoder may still allocate
    char why[200]; // what went wrong, outermost context first
} s_dec_t;

static int s_bad(s_dec_t *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->why, sizeof d->why, fmt, ap);
    va_end(ap);
    return -1;
}

//  Put context in front of the reason while a failure unwinds: "field 2 (items) of
//  StepPlan: item 0: field 4 (token_ids) of StepItem: expected array of int32, got str".
static int s_wrap(s_dec_t *d, const char *fmt, ...) {
    char head[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    size_t shift = strlen(head) + 2; // "head: ", always shorter than why
    size_t tail = strlen(d->why);
    if (shift + tail >= sizeof d->why)
        tail = sizeof d->why - 1 - shift;
    memmove(d->why + shift, d->why, tail);
    d->why[shift + tail] = 0;
    memcpy(d->why, head, shift - 2);
    memcpy(d->why + shift - 2, ": ", 2);
    return -1;
}

static void *s_dec_alloc(s_dec_t *d, size_t count, size_t size) {
    if (count > d->budget / size) {
        s_bad(d, "needs more memory than a body this size may (%zu x %zu bytes)", count, size);
        return NULL;
    }
    d->budget -= count * size;
    void *p = calloc(count, size);
    if (!p)
        s_bad(d, "out of memory");
    return p;
}

static const char *s_obj_name(const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    default: return "ext";
    }
}

static const char *s_kind_name(lsm_kind_t kind) {
    static const char *names[] = {"bool",  "int32", "uint32", "uint64",      "int64", "float",
                                  "float", "str",   "bin",    "enum (uint)", "map",   "str"};
    return kind <= LSM_TEXT ? names[kind] : "array";
}

//  o as an integer in [min, max], returned as its uint64_t bit pattern.
static int s_int(s_dec_t *d, const msgpack_object *o, int64_t min, uint64_t max, lsm_kind_t kind,
                 uint64_t *value) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > max)
            return s_bad(d, "%llu is out of range for %s", (unsigned long long)o->via.u64, s_kind_name(kind));
        *value = o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (o->via.i64 < min)
            return s_bad(d, "%lld is out of range for %s", (long long)o->via.i64, s_kind_name(kind));
        *value = (uint64_t)o->via.i64;
        return 0;
    }
    return s_bad(d, "expected %s, got %s", s_kind_name(kind), s_obj_name(o));
}

static int s_unpack_struct(s_dec_t *d, const lsm_struct_t *st, const msgpack_object *o, void *base);

//  Decode o into the value at p, which is zero on entry. nil means zero for every kind,
//  so other msgpack writers may send it for an absent value.
static int s_unpack_value(s_dec_t *d, const lsm_field_t *f, lsm_kind_t kind, const msgpack_object *o,
                          void *p) {
    if (o->type == MSGPACK_OBJECT_NIL)
        return 0;
    uint64_t v;
    switch (kind) {
    case LSM_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return s_bad(d, "expected bool, got %s", s_obj_name(o));
        *(bool *)p = o->via.boolean;
        return 0;
    case LSM_I32:
        if (s_int(d, o, INT32_MIN, INT32_MAX, kind, &v))
            return -1;
        *(int32_t *)p = (int32_t)(int64_t)v;
        return 0;
    case LSM_U32:
    case LSM_ENUM:
        //  an enum value this build does not know is kept: printers show the number
        if (s_int(d, o, 0, UINT32_MAX, kind, &v))
            return -1;
        *(uint32_t *)p = (uint32_t)v;
        return 0;
    case LSM_U64: return s_int(d, o, 0, UINT64_MAX, kind, (uint64_t *)p);
    case LSM_I64:
        if (s_int(d, o, INT64_MIN, INT64_MAX, kind, &v))
            return -1;
        *(int64_t *)p = (int64_t)v;
        return 0;
    case LSM_F32:
    case LSM_F64: {
        double x;
        if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
            x = o->via.f64;
        else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            x = (double)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            x = (double)o->via.i64;
        else
            return s_bad(d, "expected float, got %s", s_obj_name(o));
        if (kind == LSM_F32)
            *(float *)p = (float)x;
        else
            *(double *)p = x;
        return 0;
    }
    case LSM_STR: {
        if (o->type != MSGPACK_OBJECT_STR)
            return s_bad(d, "expected str, got %s", s_obj_name(o));
        //  msgpack-c gives an empty string a NULL pointer, which memchr and
        //  memcpy must not see
        uint32_t len = o->via.str.size;
        if (len && memchr(o->via.str.ptr, 0, len))
            return s_bad(d, "string holds a NUL byte");
        char *s = s_dec_alloc(d, (size_t)len + 1, 1);
        if (!s)
            return -1;
        if (len)
            memcpy(s, o->via.str.ptr, len);
        *(char **)p = s;
        return 0;
    }
    case LSM_TEXT: {
        if (o->type != MSGPACK_OBJECT_STR)
            return s_bad(d, "expected str, got %s", s_obj_name(o));
        //  NUL bytes are kept: len says where the text ends
        uint32_t len = o->via.str.size;
        ls_text_t *t = p;
        if (!(t->s = s_dec_alloc(d, (size_t)len + 1, 1)))
            return -1;
        if (len)
            memcpy(t->s, o->via.str.ptr, len);
        t->len = len;
        return 0;
    }
    case LSM_BYTES: {
        if (o->type != MSGPACK_OBJECT_BIN)
            return s_bad(d, "expected bin, got %s", s_obj_name(o));
        ls_bytes_t *bytes = p;
        if (o->via.bin.size == 0)
            return 0;
        if (!(bytes->data = s_dec_alloc(d, o->via.bin.size, 1)))
            return -1;
        memcpy(bytes->data, o->via.bin.ptr, o->via.bin.size);
        bytes->len = o->via.bin.size;
        return 0;
    }
    case LSM_RECORD: return s_unpack_struct(d, f->record, o, p);
    default: {
        lsm_kind_t elem = s_elem_kind(kind);
        if (o->type != MSGPACK_OBJECT_ARRAY)
            return s_bad(d, "expected array of %s, got %s", s_kind_name(elem), s_obj_name(o));
        size_t size = s_value_size(f, elem);
        lsm_array_t a = {NULL, o->via.array.size};
        if (a.n == 0)
            return 0;
        if (!(a.v = s_dec_alloc(d, a.n, size)))
            return -1;
        //  stored before the items are decoded, so a failure part-way is freed by
        //  ls_msg_clear like any other array
        memcpy(p, &a, sizeof a);
        for (size_t i = 0; i < a.n; i++)
            if (s_unpack_value(d, f, elem, &o->via.array.ptr[i], S_AT(a.v, i * size)))
                return s_wrap(d, "item %zu", i);
        return 0;
    }
    }
}

static int s_unpack_struct(s_dec_t *d, const lsm_struct_t *st, const msgpack_object *o, void *base) {
    if (o->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (o->type != MSGPACK_OBJECT_MAP)
        return s_bad(d, "expected map (%s), got %s", st->name, s_obj_name(o));
    uint64_t seen = 0; // msggen caps a struct at 64 fields
    for (uint32_t k = 0; k < o->via.map.size; k++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[k];
        if (kv->key.type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return s_bad(d, "%s: expected a field id as key, got %s", st->name, s_obj_name(&kv->key));
        size_t i = 0;
        while (i < st->count && st->fields[i].id != kv->key.via.u64)
            i++;
        if (i == st->count)
            continue; // a field from a newer schema: skip it
        const lsm_field_t *f = &st->fields[i];
        //  a second copy would leak (or silently win over) the first
        if (seen & (1ull << i))
            return s_bad(d, "field %u (%s) of %s: given twice", f->id, f->name, st->name);
        seen |= 1ull << i;
        if (s_unpack_value(d, f, f->kind, &kv->val, S_AT(base, f->offset)))
            return s_wrap(d, "field %u (%s) of %s", f->id, f->name, st->name);
    }
    return 0;
}

static int s_refuse(ls_msgerr_t *err, ls_msgerr_code_t code, const char *fmt, ...) {
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->text, sizeof err->text, fmt, ap);
    va_end(ap);
    return -1;
}

//  The header [version, type, group, rid, body], then the body.
static int s_decode_root(const msgpack_object *root, ls_msg_t *m, s_dec_t *d, ls_msgerr_t *err) {
    if (root->type != MSGPACK_OBJECT_ARRAY || root->via.array.size < 5)
        return s_refuse(err, LS_MSGERR_MALFORMED,
                        "malformed: expected [version, type, group, rid, {fields}], got %s",
                        s_obj_name(root));
    const msgpack_object *h = root->via.array.ptr; // more than 5 items: a newer header, skipped
    uint64_t version, type, group, rid;
    if (s_int(d, &h[0], 0, UINT16_MAX, LSM_U32, &version))
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: schema version: %s", d->why);
    if (version == 0)
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: schema version 0 is not a version");
    if (version > LS_SCHEMA_VERSION)
        return s_refuse(err, LS_MSGERR_VERSION,
                        "version: encoded with schema version %llu, "
                        "this build reads 1..%d",
                        (unsigned long long)version, LS_SCHEMA_VERSION);
    if (s_int(d, &h[1], 0, UINT64_MAX, LSM_U64, &type))
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: message type: %s", d->why);
    const lsm_struct_t *st = type < lsm_messages_limit ? lsm_messages[type] : NULL;
    if (!st)
        return s_refuse(err, LS_MSGERR_UNKNOWN_TYPE, "unknown message type %llu", (unsigned long long)type);
    if (s_int(d, &h[2], 0, UINT32_MAX, LSM_U32, &group) || s_int(d, &h[3], 0, UINT64_MAX, LSM_U64, &rid))
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: %s header: %s", st->name, d->why);
    m->type = (uint16_t)type;
    m->version = (uint16_t)version;
    m->group = (uint32_t)group;
    m->rid = rid;
    if (h[4].type != MSGPACK_OBJECT_MAP && h[4].type != MSGPACK_OBJECT_NIL)
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: %s: expected a map of fields, got %s", st->name,
                        s_obj_name(&h[4]));
    if (s_unpack_struct(d, st, &h[4], &m->u))
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: %s", d->why);
    return 0;
}

int ls_msg_decode(const void *buf, size_t len, ls_msg_t *m, ls_msgerr_t *err) {
    ls_msgerr_t scratch;
    if (!err)
        err = &scratch;
    err->code = LS_MSGERR_NONE;
    err->text[0] = 0;
    memset(m, 0, sizeof *m);
    if (len > LS_MSG_MAX_BYTES)
        return s_refuse(err, LS_MSGERR_TOO_LARGE, "too large: %zu bytes, the limit is %u", len,
                        LS_MSG_MAX_BYTES);
    const char *why = buf ? s_prescan(buf, len) : "no buffer";
    if (why)
        return s_refuse(err, LS_MSGERR_MALFORMED, "malformed: %s", why);

    msgpack_unpacked result;
    msgpack_unpacked_init(&result);
    size_t offset = 0;
    msgpack_unpack_return rc = msgpack_unpack_next(&result, buf, len, &offset);
    s_dec_t d = {.budget = DECODE_BYTES_PER_INPUT_BYTE * len + DECODE_SLACK_BYTES};
    int status;
    if (rc == MSGPACK_UNPACK_SUCCESS && offset == len)
        status = s_decode_root(&result.data, m, &d, err);
    else // after s_prescan, only nesting deeper than msgpack-c's stack or memory
        status = s_refuse(err, LS_MSGERR_MALFORMED, "malformed: %s",
                          rc == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory" : "nested too deeply");
    msgpack_unpacked_destroy(&result);
    if (status)
        ls_msg_clear(m);
    return status;
}

int ls_msg_copy(ls_msg_t *dst, const ls_msg_t *src) {
    char *buf;
    size_t len;
    if (ls_msg_encode(src, &buf, &len) < 0) {
        memset(dst, 0, sizeof *dst);
        return -1;
    }
    int rc = ls_msg_decode(buf, len, dst, NULL);
    free(buf);
    return rc;
}

//  --------------------------------------------------------------------------
//  Compare

static bool s_equal_struct(const lsm_struct_t *st, const void *a, const void *b, bool measured);

static bool s_equal_value(const lsm_field_t *f, lsm_kind_t kind, const void *a, const void *b,
                          bool measured) {
    switch (kind) {
    case LSM_BOOL: return *(const bool *)a == *(const bool *)b;
    case LSM_STR: {
        const char *x = *(char *const *)a, *y = *(char *const *)b;
        return x == y || (x && y && strcmp(x, y) == 0);
    }
    case LSM_BYTES: {
        const ls_bytes_t *x = a, *y = b;
        return x->len == y->len && (x->len == 0 || memcmp(x->data, y->data, x->len) == 0);
    }
    case LSM_TEXT: {
        const ls_text_t *x = a, *y = b;
        return (!x->s && !y->s) || (x->s && y->s && x->len == y->len && memcmp(x->s, y->s, x->len) == 0);
    }
    case LSM_RECORD: return s_equal_struct(f->record, a, b, measured);
    default:
        if (!s_is_array(kind)) // numbers, bit for bit
            return memcmp(a, b, s_value_size(f, kind)) == 0;
        lsm_array_t x = s_array(a), y = s_array(b);
        lsm_kind_t elem = s_elem_kind(kind);
        size_t size = s_value_size(f, elem);
        if (x.n != y.n)
            return false;
        for (size_t i = 0; i < x.n; i++)
            if (!s_equal_value(f, elem, S_CAT(x.v, i * size), S_CAT(y.v, i * size), measured))
                return false;
        return true;
    }
}

//  measured: compare the fields the schema declares `measured` too
static bool s_equal_struct(const lsm_struct_t *st, const void *a, const void *b, bool measured) {
    for (size_t i = 0; i < st->count; i++) {
        const lsm_field_t *f = &st->fields[i];
        if ((measured || !f->measured) &&
            !s_equal_value(f, f->kind, S_CAT(a, f->offset), S_CAT(b, f->offset), measured))
            return false;
    }
    return true;
}

static bool s_equal(const ls_msg_t *a, const ls_msg_t *b, bool measured) {
    const lsm_struct_t *st = s_message(a->type);
    return a->type == b->type && a->group == b->group && a->rid == b->rid &&
           (!st || s_equal_struct(st, &a->u, &b->u, measured));
}

bool ls_msg_equal(const ls_msg_t *a, const ls_msg_t *b) {
    return s_equal(a, b, true);
}

bool ls_msg_equal_unmeasured(const ls_msg_t *a, const ls_msg_t *b) {
    return s_equal(a, b, false);
}

//  --------------------------------------------------------------------------
//  Print

typedef struct {
    char *out;
    size_t cap;
    size_t len; // the whole line's length, even past cap
} s_line_t;

static void s_put(s_line_t *line, const char *fmt, ...) {
    size_t room = line->len < line->cap ? line->cap - line->len : 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(room ? line->out + line->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        line->len += n;
}

static void s_put_quoted(s_line_t *line, const char *s, size_t len) {
    s_put(line, "\"");
    for (size_t i = 0; i < len && i < FORMAT_MAX_CHARS; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\')
            s_put(line, "\\%c", c);
        else if (c == '\n')
            s_put(line, "\\n");
        else if (c < 0x20 || c == 0x7f)
            s_put(line, "\\x%02x", c);
        else
            s_put(line, "%c", c);
    }
    s_put(line, len > FORMAT_MAX_CHARS ? "\"...+%zu" : "\"", len - FORMAT_MAX_CHARS);
}

static void s_format_struct(s_line_t *line, const lsm_struct_t *st, const void *base);

static void s_format_value(s_line_t *line, const lsm_field_t *f, lsm_kind_t kind, const void *p) {
    switch (kind) {
    case LSM_BOOL: s_put(line, *(const bool *)p ? "true" : "false"); break;
    case LSM_I32: s_put(line, "%d", *(const int32_t *)p); break;
    case LSM_U32: s_put(line, "%u", *(const uint32_t *)p); break;
    case LSM_U64: s_put(line, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case LSM_I64: s_put(line, "%lld", (long long)*(const int64_t *)p); break;
    case LSM_F32: s_put(line, "%g", *(const float *)p); break;
    case LSM_F64: s_put(line, "%g", *(const double *)p); break;
    case LSM_ENUM: {
        uint32_t value = *(const uint32_t *)p;
        const char *name = lsm_enum_name(f->enumer, value);
        if (name)
            s_put(line, "%s", name);
        else
            s_put(line, "%u", value);
        break;
    }
    case LSM_STR: {
        const char *s = *(char *const *)p;
        if (s)
            s_put_quoted(line, s, strlen(s));
        else
            s_put(line, "null");
        break;
    }
    case LSM_TEXT: {
        const ls_text_t *t = p;
        if (t->s)
            s_put_quoted(line, t->s, t->len);
        else
            s_put(line, "null");
        break;
    }
    case LSM_BYTES: {
        const ls_bytes_t *bytes = p;
        s_put(line, "0x");
        for (size_t i = 0; i < bytes->len && i < FORMAT_MAX_CHARS / 2; i++)
            s_put(line, "%02x", bytes->data[i]);
        if (bytes->len > FORMAT_MAX_CHARS / 2)
            s_put(line, "...+%zu", bytes->len - FORMAT_MAX_CHARS / 2);
        break;
    }
    case LSM_RECORD: s_format_struct(line, f->record, p); break;
    default: {
        lsm_array_t a = s_array(p);
        lsm_kind_t elem = s_elem_kind(kind);
        size_t size = s_value_size(f, elem);
        s_put(line, "[");
        for (size_t i = 0; i < a.n && i < FORMAT_MAX_ITEMS; i++) {
            s_put(line, i ? "," : "");
            s_format_value(line, f, elem, S_CAT(a.v, i * size));
        }
        if (a.n > FORMAT_MAX_ITEMS)
            s_put(line, ",...+%zu", a.n - FORMAT_MAX_ITEMS);
        s_put(line, "]");
    }
    }
}

static void s_format_struct(s_line_t *line, const lsm_struct_t *st, const void *base) {
    s_put(line, "{");
    bool first = true;
    for (size_t i = 0; i < st->count; i++) {
        const lsm_field_t *f = &st->fields[i];
        if (s_is_zero(f, S_CAT(base, f->offset)))
            continue;
        s_put(line, "%s%s=", first ? "" : " ", f->name);
        s_format_value(line, f, f->kind, S_CAT(base, f->offset));
        first = false;
    }
    s_put(line, "}");
}

int ls_msg_format(const ls_msg_t *m, char *out, size_t cap) {
    s_line_t line = {out, cap, 0};
    if (cap)
        out[0] = 0;
    const lsm_struct_t *st = s_message(m->type);
    if (st)
        s_put(&line, "%s", st->name);
    else
        s_put(&line, "Unknown(%u)", (unsigned)m->type);
    s_put(&line, " v%u g%u rid=%llu ", (unsigned)m->version, m->group, (unsigned long long)m->rid);
    if (st)
        s_format_struct(&line, st, &m->u);
    else
        s_put(&line, "{}");
    return line.len > INT32_MAX ? INT32_MAX : (int)line.len;
}

void ls_msg_print(const ls_msg_t *m, FILE *f) {
    char text[1024];
    int len = ls_msg_format(m, text, sizeof text);
    char *big = (size_t)len >= sizeof text ? malloc((size_t)len + 1) : NULL;
    if (big)
        ls_msg_format(m, big, (size_t)len + 1);
    fprintf(f, "%s\n", big ? big : text);
    free(big);
}

//  --------------------------------------------------------------------------
//  JSON

//  A double holds integers up to 2^53 exactly; above that, a string keeps every digit.
#define JSON_EXACT_MAX (1ull << 53)

static cJSON *s_json_uint(uint64_t v) {
    char text[24];
    snprintf(text, sizeof text, "%llu", (unsigned long long)v);
    return v <= JSON_EXACT_MAX ? cJSON_CreateNumber((double)v) : cJSON_CreateString(text);
}

static cJSON *s_json_int(int64_t v) {
    char text[24];
    snprintf(text, sizeof text, "%lld", (long long)v);
    bool exact = v >= -(int64_t)JSON_EXACT_MAX && v <= (int64_t)JSON_EXACT_MAX;
    return exact ? cJSON_CreateNumber((double)v) : cJSON_CreateString(text);
}

static cJSON *s_json_base64(const uint8_t *data, size_t len) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *text = malloc(4 * ((len + 2) / 3) + 1);
    if (!text)
        return NULL;
    char *q = text;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t group = (uint32_t)data[i] << 16;
        if (i + 1 < len)
            group |= (uint32_t)data[i + 1] << 8;
        if (i + 2 < len)
            group |= data[i + 2];
        *q++ = digits[(group >> 18) & 63];
        *q++ = digits[(group >> 12) & 63];
        *q++ = i + 1 < len ? digits[(group >> 6) & 63] : '=';
        *q++ = i + 2 < len ? digits[group & 63] : '=';
    }
    *q = 0;
    cJSON *json = cJSON_CreateString(text);
    free(text);
    return json;
}

static cJSON *s_json_struct(const lsm_struct_t *st, const void *base);

static cJSON *s_json_value(const lsm_field_t *f, lsm_kind_t kind, const void *p) {
    switch (kind) {
    case LSM_BOOL: return cJSON_CreateBool(*(const bool *)p);
    case LSM_I32: return cJSON_CreateNumber(*(const int32_t *)p);
    case LSM_U32: return cJSON_CreateNumber(*(const uint32_t *)p);
    case LSM_U64: return s_json_uint(*(const uint64_t *)p);
    case LSM_I64: return s_json_int(*(const int64_t *)p);
    case LSM_F32: return cJSON_CreateNumber(*(const float *)p);
    case LSM_F64: return cJSON_CreateNumber(*(const double *)p);
    case LSM_ENUM: {
        uint32_t value = *(const uint32_t *)p;
        const char *name = lsm_enum_name(f->enumer, value);
        return name ? cJSON_CreateString(name) : cJSON_CreateNumber(value);
    }
    case LSM_STR: {
        const char *s = *(char *const *)p;
        return s ? cJSON_CreateString(s) : cJSON_CreateNull();
    }
    case LSM_TEXT: {
        //  cJSON strings end at a NUL: the JSON view shows text up to its first one
        const char *s = ((const ls_text_t *)p)->s;
        return s ? cJSON_CreateString(s) : cJSON_CreateNull();
    }
    case LSM_BYTES: return s_json_base64(((const ls_bytes_t *)p)->data, ((const ls_bytes_t *)p)->len);
    case LSM_RECORD: return s_json_struct(f->record, p);
    default: {
        lsm_array_t a = s_array(p);
        lsm_kind_t elem = s_elem_kind(kind);
        size_t size = s_value_size(f, elem);
        cJSON *array = cJSON_CreateArray();
        for (size_t i = 0; array && i < a.n; i++) {
            cJSON *item = s_json_value(f, elem, S_CAT(a.v, i * size));
            if (!item || !cJSON_AddItemToArray(array, item)) {
                cJSON_Delete(item);
                cJSON_Delete(array);
                return NULL;
            }
        }
        return array;
    }
    }
}

//  Add item to object, or delete it; false when either was NULL or adding failed.
static bool s_json_add(cJSON *object, const char *name, cJSON *item) {
    if (object && item && cJSON_AddItemToObject(object, name, item))
        return true;
    cJSON_Delete(item);
    return false;
}

static cJSON *s_json_struct(const lsm_struct_t *st, const void *base) {
    cJSON *object = cJSON_CreateObject();
    for (size_t i = 0; i < st->count; i++) {
        const lsm_field_t *f = &st->fields[i];
        if (!s_json_add(object, f->name, s_json_value(f, f->kind, S_CAT(base, f->offset)))) {
            cJSON_Delete(object);
            return NULL;
        }
    }
    return object;
}

cJSON *ls_msg_to_json(const ls_msg_t *m) {
    const lsm_struct_t *st = s_message(m->type);
    if (!st)
        return NULL;
    cJSON *json = cJSON_CreateObject();
    if (s_json_add(json, "type", cJSON_CreateString(st->name)) &&
        s_json_add(json, "version", cJSON_CreateNumber(m->version)) &&
        s_json_add(json, "group", cJSON_CreateNumber(m->group)) &&
        s_json_add(json, "rid", s_json_uint(m->rid)) && s_json_add(json, "body", s_json_struct(st, &m->u)))
        return json;
    cJSON_Delete(json);
    return NULL;
}

//  --------------------------------------------------------------------------
//  Random fill, for round-trip tests and fuzz seeds

//  Where a fill takes its bits: next(arg) returns the next 64 of them.
typedef struct {
    ls_msg_bits_fn next;
    void *arg;
} s_source_t;

static uint64_t s_rand(s_source_t *src) {
    return src->next(src->arg);
}

//  splitmix64: tiny, and the same sequence on every platform.
static uint64_t s_splitmix(void *arg) {
    uint64_t *state = arg;
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

//  Random bits of random width, so small and large integers both occur (msgpack
//  encodes them differently).
static uint64_t s_rand_int(s_source_t *state) {
    uint64_t v = s_rand(state);
    return v >> (s_rand(state) % 64);
}

static void s_fill_struct(s_source_t *state, const lsm_struct_t *st, void *base);

static void s_fill_value(s_source_t *state, const lsm_field_t *f, lsm_kind_t kind, void *p) {
    uint64_t sign = s_rand(state) & 1 ? ~0ull : 0;
    switch (kind) {
    case LSM_BOOL: *(bool *)p = s_rand(state) & 1; break;
    case LSM_I32: *(int32_t *)p = (int32_t)(s_rand_int(state) ^ sign); break;
    case LSM_U32: *(uint32_t *)p = (uint32_t)s_rand_int(state); break;
    case LSM_U64: *(uint64_t *)p = s_rand_int(state); break;
    case LSM_I64: *(int64_t *)p = (int64_t)(s_rand_int(state) ^ sign); break;
    case LSM_F32: *(float *)p = (float)((int32_t)s_rand(state) / 1024.0); break;
    case LSM_F64: *(double *)p = (double)(int64_t)s_rand(state) / 3.0; break;
    case LSM_ENUM: *(uint32_t *)p = f->enumer->values[s_rand(state) % f->enumer->count].value; break;
    case LSM_STR: {
        if (s_rand(state) % 8 == 0)
            break; // NULL, also inside str[]
        size_t len = s_rand(state) % 24;
        char *s = malloc(len + 1);
        for (size_t i = 0; s && i < len; i++) {
            uint8_t c = (uint8_t)s_rand(state);
            s[i] = (char)(c ? c : 1); // any byte but NUL
        }
        if (s)
            s[len] = 0;
        *(char **)p = s;
        break;
    }
    case LSM_TEXT: {
        if (s_rand(state) % 8 == 0)
            break; // NULL, also inside text[]
        ls_text_t *t = p;
        size_t len = s_rand(state) % 24;
        t->s = malloc(len + 1);
        for (size_t i = 0; t->s && i < len; i++)
            t->s[i] = (char)(s_rand(state) % 256); // NUL bytes too
        if (t->s)
            t->s[len] = 0;
        t->len = t->s ? len : 0;
        break;
    }
    case LSM_BYTES: {
        ls_bytes_t *bytes = p;
        size_t len = s_rand(state) % 40;
        bytes->data = len ? malloc(len) : NULL;
        for (size_t i = 0; bytes->data && i < len; i++)
            bytes->data[i] = (uint8_t)s_rand(state);
        bytes->len = bytes->data ? len : 0;
        break;
    }
    case LSM_RECORD: s_fill_struct(state, f->record, p); break;
    default: {
        lsm_kind_t elem = s_elem_kind(kind);
        size_t size = s_value_size(f, elem);
        lsm_array_t a = {NULL, s_rand(state) % 6};
        a.v = a.n ? calloc(a.n, size) : NULL;
        a.n = a.v ? a.n : 0;
        for (size_t i = 0; i < a.n; i++)
            s_fill_value(state, f, elem, S_AT(a.v, i * size));
        memcpy(p, &a, sizeof a);
    }
    }
}

static void s_fill_struct(s_source_t *state, const lsm_struct_t *st, void *base) {
    for (size_t i = 0; i < st->count; i++)
        s_fill_value(state, &st->fields[i], st->fields[i].kind, S_AT(base, st->fields[i].offset));
}

void ls_msg_fill(ls_msg_t *m, ls_msg_type_t type, ls_msg_bits_fn next, void *arg) {
    ls_msg_init(m, type);
    s_source_t src = {next, arg};
    m->group = (uint32_t)s_rand_int(&src);
    m->rid = s_rand_int(&src);
    const lsm_struct_t *st = s_message(type);
    if (st)
        s_fill_struct(&src, st, &m->u);
}

void ls_msg_fill_random(ls_msg_t *m, ls_msg_type_t type, uint64_t seed) {
    ls_msg_fill(m, type, s_splitmix, &seed);
}

int ls_msg_mix_check(const ls_msg_mix_parts_t *mix, bool ids, char *err, size_t errlen) {
    if (mix->n < 1 || mix->n > LS_LORA_MIX_MAX) {
        snprintf(err, errlen, "a mix has 1 to %d adapters, not %zu", LS_LORA_MIX_MAX, mix->n);
        return -1;
    }
    for (size_t i = 0; i < mix->n; i++) {
        const ls_msg_mix_part_t *p = &mix->v[i];
        if (!p->name || !*p->name) {
            snprintf(err, errlen, "adapter %zu of the mix has no name", i);
            return -1;
        }
        if (ids && (!p->adapter_id || !*p->adapter_id)) {
            snprintf(err, errlen, "adapter '%.64s' of the mix has no adapter_id", p->name);
            return -1;
        }
        if (!(p->weight > 0.0f) || !isfinite(p->weight)) {
            snprintf(err, errlen, "adapter '%.64s' of the mix has weight %g; a weight is a number above 0",
                     p->name, (double)p->weight);
            return -1;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(mix->v[j].name, p->name)) {
                snprintf(err, errlen, "adapter '%.64s' is named twice in the mix", p->name);
                return -1;
            }
    }
    return 0;
}
