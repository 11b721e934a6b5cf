/*  ls_msg_desc.h — the descriptor tables msggen writes into ls_msg_gen.c, read by the
    table-driven codec in ls_msg.c. Private to the ls_messages library: actors use
    ls_msg.h only.

    A record or message body is described by an lsm_struct_t: its C size and its fields,
    each with its wire id, name, kind and byte offset in the C struct. Every array type
    (ls_i32s_t, ls_strs_t, ls_texts_t, ls_<record>s_t ...) has the layout {T *v; size_t n;}, so the
    codec reaches all of them as lsm_array_t.
*/
#ifndef LS_MSG_DESC_H
#define LS_MSG_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    LSM_BOOL, LSM_I32, LSM_U32, LSM_U64, LSM_I64, LSM_F32, LSM_F64,
    LSM_STR, LSM_BYTES, LSM_ENUM, LSM_RECORD, LSM_TEXT,
    //  arrays: LSM_I32S holds LSM_I32 values, and so on (s_elem_kind in ls_msg.c)
    LSM_I32S, LSM_U32S, LSM_U64S, LSM_F32S, LSM_STRS, LSM_RECORDS, LSM_TEXTS
} lsm_kind_t;

typedef struct { uint32_t value; const char *name; } lsm_enum_value_t;

typedef struct {
    const char *name;                   // schema name, "ErrorCode"
    const lsm_enum_value_t *values;
    size_t count;
} lsm_enum_t;

typedef struct lsm_struct lsm_struct_t;

typedef struct {
    uint32_t id;                        // wire id, the map key
    const char *name;                   // schema name, also the C member name
    lsm_kind_t kind;
    size_t offset;                      // offsetof the member in the C struct
    const lsm_struct_t *record;         // LSM_RECORD, LSM_RECORDS
    const lsm_enum_t *enumer;           // LSM_ENUM
    bool measured;                      // a measurement: ls_msg_equal_unmeasured skips it
} lsm_field_t;

struct lsm_struct {
    const char *name;                   // schema name, "GenerateReq"
    size_t size;                        // sizeof the C struct
    const lsm_field_t *fields;          // in schema order; NULL when count is 0
    size_t count;
};

typedef struct { void *v; size_t n; } lsm_array_t;

//  Message bodies indexed by type id; holes are NULL.
extern const lsm_struct_t *const lsm_messages[];
extern const size_t lsm_messages_limit;

//  Name of value v in e; NULL if e has no such value.
const char *lsm_enum_name (const lsm_enum_t *e, uint32_t v);

#endif
