/*  msggen — generate the loraserve message code and docs from messages/schema.msg.

        msggen schema.msg --header ls_msg_gen.h --source ls_msg_gen.c
        msggen schema.msg --docs messages.md

    The schema is line based; '#' starts a comment line, and the text after a line's
    fixed tokens is its documentation (required: it is what docs/messages.md shows).

        version 1
        enum ErrorCode  Why a request failed.
          1 BAD_REQUEST  the request's values are invalid
        record SamplingParams  How the next token is chosen.
          1 temperature f32  0 means greedy
        message Error 4  any actor -> sender of a message it could not handle
          1 code enum ErrorCode  what went wrong
          2 message str  detail for humans
          3 retired  (a removed field: its id stays taken)
          > Lines starting with '>' add a paragraph to the block's docs.
        retired 12  (a removed message: its type id stays taken)

    Field types: bool i32 u32 u64 i64 f32 f64 str bytes i32[] u32[] u64[] f32[] str[],
    a record Name, Name[], or enum Name. Records and enums must be declared before they
    are used, which also rules out recursive records.

    The word `measured` after a field's type declares a measurement (a duration read from
    the clock, not decided from the inputs): replay leaves it out when it compares a
    replayed message with the recorded one (ls_msg_equal_unmeasured).

          3 elapsed_us u64 measured  forward and sampling time

    Every check the codec relies on is made here, before any output file is opened, so a
    bad schema never leaves a half-written file behind: duplicate ids, names, enum values
    and derived C identifiers are refused with the line of both declarations.
*/
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BANNER "generated from messages/schema.msg by msggen — do not edit"
#define MAX_FIELDS 64 // ls_msg.c tracks seen fields in a uint64_t bitmap
#define MAX_ID 65535  // message types are uint16_t on the wire and in ls_msg_t

typedef enum { B_ENUM, B_RECORD, B_MESSAGE, B_RETIRED } s_what_t;

//  Member types. The first rows map 1:1 to a schema spelling; the last four carry a
//  reference to another block (or none, for a retired id).
typedef enum {
    K_BOOL,
    K_I32,
    K_U32,
    K_U64,
    K_I64,
    K_F32,
    K_F64,
    K_STR,
    K_BYTES,
    K_I32S,
    K_U32S,
    K_U64S,
    K_F32S,
    K_STRS,
    K_TEXT,
    K_TEXTS,
    K_ENUM,
    K_RECORD,
    K_RECORDS,
    K_RETIRED
} s_kind_t;

static const struct {
    const char *schema; // spelling in schema.msg
    const char *ctype;  // C member type; NULL when derived from the reference
    const char *lsm;    // lsm_kind_t constant
} s_kinds[] = {{"bool", "bool", "LSM_BOOL"},
               {"i32", "int32_t", "LSM_I32"},
               {"u32", "uint32_t", "LSM_U32"},
               {"u64", "uint64_t", "LSM_U64"},
               {"i64", "int64_t", "LSM_I64"},
               {"f32", "float", "LSM_F32"},
               {"f64", "double", "LSM_F64"},
               {"str", "char *", "LSM_STR"},
               {"bytes", "ls_bytes_t", "LSM_BYTES"},
               {"i32[]", "ls_i32s_t", "LSM_I32S"},
               {"u32[]", "ls_u32s_t", "LSM_U32S"},
               {"u64[]", "ls_u64s_t", "LSM_U64S"},
               {"f32[]", "ls_f32s_t", "LSM_F32S"},
               {"str[]", "ls_strs_t", "LSM_STRS"},
               {"text", "ls_text_t", "LSM_TEXT"},
               {"text[]", "ls_texts_t", "LSM_TEXTS"},
               {"enum", "uint32_t", "LSM_ENUM"}, // uint32_t, not the C enum: unknown values survive
               {NULL, NULL, "LSM_RECORD"},
               {NULL, NULL, "LSM_RECORDS"},
               {NULL, NULL, NULL}};

typedef struct {
    int line;
    uint32_t id; // field id or enum value
    char *name;  // NULL when retired
    char *doc;
    s_kind_t kind; // fields only
    bool measured; // fields only: a measurement, not compared by replay
    size_t ref;    // block index for K_ENUM, K_RECORD, K_RECORDS
} s_member_t;

typedef struct {
    int line;
    s_what_t what;
    char *name;  // NULL when retired
    char *snake; // GenerateReq -> generate_req
    char *upper; // GenerateReq -> GENERATE_REQ
    uint32_t id; // message type id
    char *doc;
    char *prose; // '>' lines, joined; may be NULL
    s_member_t *members;
    size_t count;
    bool used_as_array; // a Name[] field refers to this record
} s_block_t;

//  Records and messages are ls_msg_<name>_t, so they never collide with the types of the
//  code that uses them (the engine has its own sampling params); enums stay ls_<name>_t
//  beside their LS_<ENUM>_* constants.
static const char *s_prefix(const s_block_t *block) {
    return block->what == B_ENUM ? "ls_" : "ls_msg_";
}

typedef struct {
    const char *path;
    int version; // 0 until the version line
    s_block_t *blocks;
    size_t count;
} s_schema_t;

static const char *s_path;

static void s_fail(int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (line > 0)
        fprintf(stderr, "%s:%d: ", s_path, line);
    else
        fprintf(stderr, "msggen: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *s_alloc(size_t size) {
    void *p = calloc(1, size);
    if (!p)
        s_fail(0, "out of memory");
    return p;
}

static char *s_strdup(const char *s) {
    char *copy = s_alloc(strlen(s) + 1);
    strcpy(copy, s);
    return copy;
}

//  Cut the next whitespace-separated token out of *cursor; NULL at end of line.
static char *s_token(char **cursor) {
    char *p = *cursor;
    while (isspace((unsigned char)*p))
        p++;
    if (!*p)
        return NULL;
    char *start = p;
    while (*p && !isspace((unsigned char)*p))
        p++;
    if (*p)
        *p++ = 0;
    *cursor = p;
    return start;
}

//  The rest of the line, trimmed; every declaration must say what it is for.
static char *s_doc(char *cursor, int line, const char *what) {
    while (isspace((unsigned char)*cursor))
        cursor++;
    size_t len = strlen(cursor);
    while (len && isspace((unsigned char)cursor[len - 1]))
        cursor[--len] = 0;
    if (!len)
        s_fail(line, "%s needs a doc text after it", what);
    return s_strdup(cursor);
}

static uint32_t s_number(const char *token, int line, const char *what, uint32_t max) {
    if (!token || !isdigit((unsigned char)*token))
        s_fail(line, "expected %s (a number), got '%s'", what, token ? token : "end of line");
    errno = 0;
    char *end;
    unsigned long long value = strtoull(token, &end, 10);
    if (*end || errno || value > max)
        s_fail(line, "%s '%s' is not a number in 0..%u", what, token, max);
    return (uint32_t)value;
}

//  Check token against a name shape: 'T' TypeName, 'f' field_name, 'E' ENUM_VALUE.
static const char *s_name(const char *token, int line, char shape) {
    static const char *keywords[] = {
        "auto",     "break",  "case",   "char",     "const",    "continue", "default",  "do",
        "double",   "else",   "enum",   "extern",   "float",    "for",      "goto",     "if",
        "inline",   "int",    "long",   "register", "restrict", "return",   "short",    "signed",
        "sizeof",   "static", "struct", "switch",   "typedef",  "union",    "unsigned", "void",
        "volatile", "while",  "bool",   "true",     "false",    NULL};
    const char *expect = shape == 'T'   ? "a CamelCase type name"
                         : shape == 'f' ? "a lower_snake field name"
                                        : "an UPPER_SNAKE value name";
    if (!token)
        s_fail(line, "expected %s, got end of line", expect);
    bool ok = shape == 'T'   ? isupper((unsigned char)token[0])
              : shape == 'f' ? islower((unsigned char)token[0])
                             : isupper((unsigned char)token[0]);
    for (const char *p = token; *p && ok; p++) {
        unsigned char c = *p;
        ok = shape == 'T'   ? isalnum(c)
             : shape == 'f' ? islower(c) || isdigit(c) || c == '_'
                            : isupper(c) || isdigit(c) || c == '_';
    }
    if (!ok || strlen(token) > 60)
        s_fail(line, "'%s' is not %s", token, expect);
    for (int i = 0; shape == 'f' && keywords[i]; i++)
        if (strcmp(token, keywords[i]) == 0)
            s_fail(line, "'%s' is a C keyword and cannot name a field", token);
    return token;
}

//  GenerateReq -> generate_req (upper: GENERATE_REQ); an acronym stays one word,
//  HTTPReq -> http_req.
static char *s_snake(const char *name, bool upper) {
    char *out = s_alloc(2 * strlen(name) + 1);
    char *q = out;
    for (size_t i = 0; name[i]; i++) {
        unsigned char c = name[i];
        if (i > 0 && isupper(c)) {
            unsigned char prev = name[i - 1], next = name[i + 1];
            if (!isupper(prev) || (next && islower(next)))
                *q++ = '_';
        }
        *q++ = upper ? toupper(c) : tolower(c);
    }
    return out;
}

static s_block_t *s_find_block(s_schema_t *schema, const char *name) {
    for (size_t i = 0; i < schema->count; i++)
        if (schema->blocks[i].name && strcmp(schema->blocks[i].name, name) == 0)
            return &schema->blocks[i];
    return NULL;
}

static s_block_t *s_new_block(s_schema_t *schema, s_what_t what, int line) {
    schema->blocks = realloc(schema->blocks, (schema->count + 1) * sizeof(s_block_t));
    if (!schema->blocks)
        s_fail(0, "out of memory");
    s_block_t *block = &schema->blocks[schema->count++];
    memset(block, 0, sizeof *block);
    block->what = what;
    block->line = line;
    return block;
}

//  A field's type: one token, or two for "enum Name".
static void s_parse_type(s_schema_t *schema, s_member_t *member, char **cursor, int line) {
    char *type = s_token(cursor);
    if (!type)
        s_fail(line, "field '%s' needs a type", member->name);
    for (int k = K_BOOL; k <= K_TEXTS; k++)
        if (strcmp(type, s_kinds[k].schema) == 0) {
            member->kind = k;
            return;
        }
    bool is_enum = strcmp(type, "enum") == 0;
    if (is_enum && !(type = s_token(cursor)))
        s_fail(line, "'enum' needs an enum name after it");
    size_t len = strlen(type);
    bool is_array = !is_enum && len > 2 && strcmp(type + len - 2, "[]") == 0;
    if (is_array)
        type[len - 2] = 0;
    s_block_t *ref = s_find_block(schema, type);
    if (!ref || ref->what == B_MESSAGE)
        s_fail(line, "unknown %s '%s' (declare it above its first use)", is_enum ? "enum" : "type", type);
    if (is_enum != (ref->what == B_ENUM))
        s_fail(line, is_enum ? "'%s' is a record, not an enum" : "'%s' is an enum: write 'enum %s'", type,
               type);
    member->kind = is_enum ? K_ENUM : is_array ? K_RECORDS : K_RECORD;
    member->ref = ref - schema->blocks;
    ref->used_as_array |= is_array;
}

static void s_parse_member(s_schema_t *schema, s_block_t *block, char *cursor, int line) {
    if (block->what == B_RETIRED)
        s_fail(line, "a retired message id has no members");
    if (block->count == MAX_FIELDS && block->what != B_ENUM)
        s_fail(line, "%s has more than %d fields", block->name, MAX_FIELDS);
    block->members = realloc(block->members, (block->count + 1) * sizeof(s_member_t));
    if (!block->members)
        s_fail(0, "out of memory");
    s_member_t *member = &block->members[block->count++];
    memset(member, 0, sizeof *member);
    member->line = line;
    bool is_enum = block->what == B_ENUM;
    //  enum values become C enum constants, which must fit an int
    member->id =
        s_number(s_token(&cursor), line, is_enum ? "enum value" : "field id", is_enum ? INT32_MAX : MAX_ID);
    if (!is_enum && member->id == 0)
        s_fail(line, "field ids start at 1");
    char *name = s_token(&cursor);
    if (name && strcmp(name, "retired") == 0)
        member->kind = K_RETIRED;
    else {
        member->name = s_strdup(s_name(name, line, is_enum ? 'E' : 'f'));
        if (!is_enum)
            s_parse_type(schema, member, &cursor, line);
        //  peeked, not taken with s_token, which would cut the doc's first word
        while (!is_enum && isspace((unsigned char)*cursor))
            cursor++;
        if (!is_enum && strncmp(cursor, "measured", 8) == 0 &&
            (!cursor[8] || isspace((unsigned char)cursor[8]))) {
            member->measured = true;
            cursor += 8;
        }
    }
    member->doc = s_doc(cursor, line, member->name ? member->name : "retired id");

    for (size_t i = 0; i + 1 < block->count; i++) {
        s_member_t *other = &block->members[i];
        if (other->id == member->id)
            s_fail(line, "duplicate %s %u in %s (first at line %d)", is_enum ? "value" : "field id",
                   member->id, block->name, other->line);
        if (member->name && other->name && strcmp(other->name, member->name) == 0)
            s_fail(line, "duplicate name '%s' in %s (first at line %d)", member->name, block->name,
                   other->line);
    }
}

static void s_parse(s_schema_t *schema, FILE *file) {
    char text[1024];
    int line = 0;
    s_block_t *block = NULL;
    while (fgets(text, sizeof text, file)) {
        line++;
        if (!strchr(text, '\n') && !feof(file))
            s_fail(line, "line longer than %zu characters", sizeof text - 2);
        char *cursor = text;
        while (isspace((unsigned char)*cursor))
            cursor++;
        if (*cursor == 0 || *cursor == '#')
            continue;
        if (*cursor == '>') {
            if (!block)
                s_fail(line, "'>' prose line outside a block");
            char *more = s_doc(cursor + 1, line, "'>'");
            size_t have = block->prose ? strlen(block->prose) : 0;
            block->prose = realloc(block->prose, have + strlen(more) + 2);
            if (!block->prose)
                s_fail(0, "out of memory");
            sprintf(block->prose + have, "%s%s", have ? " " : "", more);
            free(more);
            continue;
        }
        if (isdigit((unsigned char)*cursor)) {
            if (!block)
                s_fail(line, "member line outside an enum, record or message");
            s_parse_member(schema, block, cursor, line);
            continue;
        }
        char *keyword = s_token(&cursor);
        if (strcmp(keyword, "version") == 0) {
            if (schema->version)
                s_fail(line, "version given twice");
            schema->version = s_number(s_token(&cursor), line, "version", MAX_ID);
            if (schema->version == 0 || s_token(&cursor))
                s_fail(line, "expected 'version N' with N >= 1");
            continue;
        }
        if (!schema->version)
            s_fail(line, "the schema must start with 'version N'");
        s_what_t what = strcmp(keyword, "enum") == 0      ? B_ENUM
                        : strcmp(keyword, "record") == 0  ? B_RECORD
                        : strcmp(keyword, "message") == 0 ? B_MESSAGE
                        : strcmp(keyword, "retired") == 0 ? B_RETIRED
                                                          : (s_what_t)-1;
        if (what == (s_what_t)-1)
            s_fail(line,
                   "unknown keyword '%s' (expected enum, record, message, retired, "
                   "version, or a member line starting with its id)",
                   keyword);
        block = s_new_block(schema, what, line);
        if (what != B_RETIRED) {
            const char *name = s_name(s_token(&cursor), line, 'T');
            s_block_t *other = s_find_block(schema, name);
            if (other)
                s_fail(line, "duplicate name '%s' (first at line %d)", name, other->line);
            block->name = s_strdup(name);
            block->snake = s_snake(name, false);
            block->upper = s_snake(name, true);
        }
        if (what == B_MESSAGE || what == B_RETIRED) {
            block->id = s_number(s_token(&cursor), line, "message type id", MAX_ID);
            if (block->id == 0)
                s_fail(line, "message type ids start at 1");
            for (size_t i = 0; i + 1 < schema->count; i++) {
                s_block_t *other = &schema->blocks[i];
                if ((other->what == B_MESSAGE || other->what == B_RETIRED) && other->id == block->id)
                    s_fail(line, "duplicate message type id %u (first at line %d)", block->id, other->line);
            }
        }
        block->doc = s_doc(cursor, line, block->name ? block->name : "retired id");
    }
    if (!schema->version)
        s_fail(line, "no 'version N' line");
}

//  The C identifiers the schema generates must not collide with each other or with
//  the hand-written API (GenerateReq and Generate_Req are both fine names, but they
//  cannot both become ls_msg_generate_req_t).
typedef struct {
    char *ident;
    int line;
} s_ident_t;

static void s_claim(s_ident_t *idents, size_t *count, char *ident, int line) {
    for (size_t i = 0; i < *count; i++)
        if (strcmp(idents[i].ident, ident) == 0) {
            if (idents[i].line)
                s_fail(line, "generated C name '%s' clashes with line %d", ident, idents[i].line);
            s_fail(line, "generated C name '%s' is taken by the ls_msg.h API", ident);
        }
    idents[(*count)++] = (s_ident_t){ident, line};
}

static char *s_printf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int size = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *out = s_alloc(size + 1);
    va_start(ap, fmt);
    vsnprintf(out, size + 1, fmt, ap);
    va_end(ap);
    return out;
}

static void s_check_names(s_schema_t *schema) {
    static const char *reserved[] = {"ls_msg_t",   "ls_msg_type_t", "ls_msgerr_t", "ls_msgerr_code_t",
                                     "ls_bytes_t", "ls_i32s_t",     "ls_u32s_t",   "ls_u64s_t",
                                     "ls_f32s_t",  "ls_strs_t",     "ls_text_t",   "ls_texts_t",
                                     NULL};
    size_t total = 16;
    for (size_t b = 0; b < schema->count; b++)
        total += 4 + schema->blocks[b].count;
    s_ident_t *idents = s_alloc(total * sizeof *idents);
    size_t count = 0;
    for (int i = 0; reserved[i]; i++)
        s_claim(idents, &count, (char *)reserved[i], 0);
    for (size_t b = 0; b < schema->count; b++) {
        s_block_t *block = &schema->blocks[b];
        if (block->what == B_RETIRED)
            continue;
        //  ls_msg_* is the API's own prefix (ls_msg_type_name, ls_msg_clear ...)
        if (strncmp(block->snake, "msg", 3) == 0 && (block->snake[3] == 0 || block->snake[3] == '_'))
            s_fail(block->line, "type names starting with 'Msg' are reserved");
        s_claim(idents, &count, s_printf("%s%s_t", s_prefix(block), block->snake), block->line);
        if (block->used_as_array)
            s_claim(idents, &count, s_printf("%s%ss_t", s_prefix(block), block->snake), block->line);
        if (block->what == B_MESSAGE)
            s_claim(idents, &count, s_printf("LS_MSG_%s", block->upper), block->line);
        if (block->what == B_ENUM) {
            s_claim(idents, &count, s_printf("ls_%s_name", block->snake), block->line);
            for (size_t m = 0; m < block->count; m++)
                if (block->members[m].name)
                    s_claim(idents, &count, s_printf("LS_%s_%s", block->upper, block->members[m].name),
                            block->members[m].line);
        }
        size_t live = 0;
        for (size_t m = 0; m < block->count; m++)
            live += block->members[m].name != NULL;
        if (live == 0 && block->what != B_MESSAGE)
            s_fail(block->line, "%s has no members", block->name);
    }
    free(idents);
}

//  C member type of a field, e.g. "ls_i32s_t" or "ls_sampling_params_t".
static char *s_ctype(s_schema_t *schema, s_member_t *member) {
    if (member->kind == K_RECORD || member->kind == K_RECORDS)
        return s_printf("%s%s%s_t", s_prefix(&schema->blocks[member->ref]), schema->blocks[member->ref].snake,
                        member->kind == K_RECORDS ? "s" : "");
    return s_strdup(s_kinds[member->kind].ctype);
}

static void s_emit_header(s_schema_t *schema, FILE *out) {
    fprintf(out,
            "//  ls_msg_gen.h — " BANNER ".\n"
            "//  Include ls_msg.h, which defines the types used here, not this file.\n"
            "#ifndef LS_MSG_H\n#error \"include ls_msg.h, not ls_msg_gen.h\"\n#endif\n"
            "#ifndef LS_MSG_GEN_H\n#define LS_MSG_GEN_H\n\n"
            "#define LS_SCHEMA_VERSION %d\n",
            schema->version);
    uint32_t max_type = 0;
    for (size_t b = 0; b < schema->count; b++) {
        s_block_t *block = &schema->blocks[b];
        if (block->what == B_RETIRED)
            continue;
        if (block->what == B_MESSAGE) {
            fprintf(out, "\n//  %s (type %u): %s\n", block->name, block->id, block->doc);
            max_type = block->id > max_type ? block->id : max_type;
        } else
            fprintf(out, "\n//  %s: %s\n", block->name, block->doc);
        fprintf(out, "typedef %s {\n", block->what == B_ENUM ? "enum" : "struct");
        size_t live = 0;
        for (size_t m = 0; m < block->count; m++) {
            s_member_t *member = &block->members[m];
            if (!member->name)
                continue;
            live++;
            if (block->what == B_ENUM) {
                char *decl = s_printf("LS_%s_%s = %u,", block->upper, member->name, member->id);
                fprintf(out, "    %-40s // %s\n", decl, member->doc);
                free(decl);
            } else {
                char *ctype = s_ctype(schema, member);
                char *decl =
                    s_printf("%s%s%s;", ctype, ctype[strlen(ctype) - 1] == '*' ? "" : " ", member->name);
                bool is_enum = member->kind == K_ENUM;
                fprintf(out, "    %-40s // %u: %s%s%s%s\n", decl, member->id, is_enum ? "enum " : "",
                        is_enum ? schema->blocks[member->ref].name : "", is_enum ? ": " : "", member->doc);
                free(ctype);
                free(decl);
            }
        }
        if (live == 0)
            fprintf(out, "    char none_;    // no fields yet: C forbids an empty struct\n");
        fprintf(out, "} %s%s_t;\n", s_prefix(block), block->snake);
        if (block->what == B_ENUM)
            fprintf(out, "const char *ls_%s_name (uint32_t value);    // NULL if unknown\n", block->snake);
        if (block->used_as_array)
            fprintf(out, "typedef struct { ls_msg_%s_t *v; size_t n; } ls_msg_%ss_t;\n", block->snake,
                    block->snake);
    }
    fprintf(out, "\ntypedef enum {\n");
    for (size_t b = 0; b < schema->count; b++)
        if (schema->blocks[b].what == B_MESSAGE)
            fprintf(out, "    LS_MSG_%s = %u,\n", schema->blocks[b].upper, schema->blocks[b].id);
    fprintf(out,
            "} ls_msg_type_t;\n\n"
            "//  Largest type id: a dispatch table indexed by type has LS_MSG_TYPE_MAX + 1 slots.\n"
            "#define LS_MSG_TYPE_MAX %u\n\n"
            "typedef struct ls_msg {\n"
            "    uint16_t type;      // ls_msg_type_t\n"
            "    uint16_t version;   // schema version it was encoded with\n"
            "    uint32_t group;     // scheduler+worker group (data parallel); 0 by default\n"
            "    uint64_t rid;       // request or correlation id; 0 when none\n"
            "    union {\n",
            max_type);
    for (size_t b = 0; b < schema->count; b++)
        if (schema->blocks[b].what == B_MESSAGE)
            fprintf(out, "        ls_msg_%s_t %s;\n", schema->blocks[b].snake, schema->blocks[b].snake);
    fprintf(out, "    } u;\n} ls_msg_t;\n\n#endif\n");
}

static void s_emit_source(s_schema_t *schema, FILE *out) {
    fprintf(out, "//  ls_msg_gen.c — " BANNER ".\n"
                 "//  Descriptor tables read by the codec in ls_msg.c (see ls_msg_desc.h).\n"
                 "#include \"ls_msg.h\"\n#include \"ls_msg_desc.h\"\n");
    for (size_t b = 0; b < schema->count; b++) {
        s_block_t *block = &schema->blocks[b];
        if (block->what == B_RETIRED)
            continue;
        size_t live = 0;
        for (size_t m = 0; m < block->count; m++)
            live += block->members[m].name != NULL;
        if (live)
            fprintf(out, "\nstatic const %s s_%s__%s [] = {\n",
                    block->what == B_ENUM ? "lsm_enum_value_t" : "lsm_field_t", block->snake,
                    block->what == B_ENUM ? "values" : "fields");
        for (size_t m = 0; m < block->count; m++) {
            s_member_t *member = &block->members[m];
            if (!member->name)
                continue;
            if (block->what == B_ENUM) {
                fprintf(out, "    { %u, \"%s\" },\n", member->id, member->name);
                continue;
            }
            const char *ref = member->kind == K_ENUM || member->kind == K_RECORD || member->kind == K_RECORDS
                                  ? schema->blocks[member->ref].snake
                                  : NULL;
            fprintf(out, "    { %u, \"%s\", %s, offsetof (ls_msg_%s_t, %s), ", member->id, member->name,
                    s_kinds[member->kind].lsm, block->snake, member->name);
            if (member->kind == K_ENUM)
                fprintf(out, "NULL, &s_%s, ", ref);
            else if (ref)
                fprintf(out, "&s_%s, NULL, ", ref);
            else
                fprintf(out, "NULL, NULL, ");
            fprintf(out, "%s },\n", member->measured ? "true" : "false");
        }
        if (live)
            fprintf(out, "};\n");
        if (block->what == B_ENUM)
            fprintf(out,
                    "static const lsm_enum_t s_%s = { \"%s\", s_%s__values, %zu };\n\n"
                    "const char *\nls_%s_name (uint32_t value)\n{\n"
                    "    return lsm_enum_name (&s_%s, value);\n}\n",
                    block->snake, block->name, block->snake, live, block->snake, block->snake);
        else if (live)
            fprintf(out,
                    "static const lsm_struct_t s_%s = {\n"
                    "    \"%s\", sizeof (ls_msg_%s_t), s_%s__fields, %zu\n};\n",
                    block->snake, block->name, block->snake, block->snake, live);
        else
            fprintf(out, "\nstatic const lsm_struct_t s_%s = { \"%s\", sizeof (ls_msg_%s_t), NULL, 0 };\n",
                    block->snake, block->name, block->snake);
    }
    fprintf(out, "\nconst lsm_struct_t *const lsm_messages [] = {\n");
    for (size_t b = 0; b < schema->count; b++)
        if (schema->blocks[b].what == B_MESSAGE)
            fprintf(out, "    [%u] = &s_%s,\n", schema->blocks[b].id, schema->blocks[b].snake);
    fprintf(out, "};\nconst size_t lsm_messages_limit = sizeof lsm_messages / sizeof lsm_messages [0];\n");
}

//  Markdown table cells cannot hold a bare '|'.
static void s_md(FILE *out, const char *text) {
    for (; *text; text++)
        fputs(*text == '|' ? "\\|" : (char[2]){*text, 0}, out);
}

static void s_md_type(FILE *out, s_schema_t *schema, s_member_t *member) {
    if (member->kind == K_RETIRED)
        fprintf(out, "*retired*");
    else if (member->kind < K_ENUM)
        fprintf(out, "`%s`", s_kinds[member->kind].schema);
    else {
        s_block_t *ref = &schema->blocks[member->ref];
        fprintf(out, "%s[%s](#%s-%s)%s", member->kind == K_ENUM ? "enum " : "", ref->name,
                member->kind == K_ENUM ? "enum" : "record", ref->snake,
                member->kind == K_RECORDS ? "[]" : "");
    }
}

static void s_md_block(FILE *out, s_schema_t *schema, s_block_t *block) {
    const char *kind = block->what == B_ENUM ? "enum" : block->what == B_RECORD ? "record" : "msg";
    fprintf(out, "<a id=\"%s-%s\"></a>\n", kind, block->snake);
    if (block->what == B_MESSAGE)
        fprintf(out, "### %s — type %u\n\n", block->name, block->id);
    else
        fprintf(out, "### %s\n\n", block->name);
    fprintf(out, "%s\n\n", block->doc);
    if (block->prose)
        fprintf(out, "%s\n\n", block->prose);
    if (block->what == B_MESSAGE)
        fprintf(out, "C: `LS_MSG_%s`, `ls_msg_%s_t`, `m.u.%s`.\n\n", block->upper, block->snake,
                block->snake);
    else if (block->what == B_RECORD)
        fprintf(out, "C: `ls_msg_%s_t`%s.\n\n", block->snake,
                block->used_as_array ? s_printf(", arrays `ls_msg_%ss_t`", block->snake) : "");
    else
        fprintf(out, "C: `ls_%s_t`, constants `LS_%s_*`, `ls_%s_name()`.\n\n", block->snake, block->upper,
                block->snake);
    if (block->count == 0) {
        fprintf(out, "No fields.\n\n");
        return;
    }
    if (block->what == B_ENUM)
        fprintf(out, "| value | name | meaning |\n|---:|---|---|\n");
    else
        fprintf(out, "| id | field | type | meaning |\n|---:|---|---|---|\n");
    for (size_t m = 0; m < block->count; m++) {
        s_member_t *member = &block->members[m];
        fprintf(out, "| %u | %s%s%s | ", member->id, member->name ? "`" : "",
                member->name ? member->name : "*retired*", member->name ? "`" : "");
        if (block->what != B_ENUM) {
            s_md_type(out, schema, member);
            fprintf(out, " | ");
        }
        s_md(out, member->doc);
        if (member->measured)
            fprintf(out, " *(measured: replay does not compare it)*");
        fprintf(out, " |\n");
    }
    fprintf(out, "\n");
}

static void s_emit_docs(s_schema_t *schema, FILE *out) {
    fprintf(
        out,
        "<!-- " BANNER "; regenerate with: cmake --build build --target messages-docs -->\n"
        "# Messages\n\n"
        "Every message the actors exchange, generated from `messages/schema.msg` by `msggen`.\n"
        "Do not edit this page: change the schema, then run\n"
        "`cmake --build build --target messages-docs`. The `messages_docs_current` test fails\n"
        "while this page and the schema disagree.\n\n"
        "Schema version: **%d**.\n\n"
        "## Wire format\n\n"
        "A message body is one msgpack array `[schema_version, type, group, rid, {field_id: value, "
        "...}]`:\n\n"
        "- `schema_version` — the version the sender was built with. Versions 1 up to the\n"
        "  receiver's own are accepted; a newer one is refused (`LS_MSGERR_VERSION`).\n"
        "- `type` — the message type id below.\n"
        "- `group` — the scheduler+worker group the message belongs to (data parallel); 0 by default.\n"
        "- `rid` — request or correlation id: an answer carries the rid of what it answers; 0 when none.\n"
        "- the map — field id to value. Fields holding their zero value (0, false, absent\n"
        "  string, empty array) are left out; missing or nil fields decode as zero; unknown\n"
        "  field ids are skipped. Enums travel as unsigned integers, records as nested maps.\n\n"
        "Bodies above 64 MiB (`LS_MSG_MAX_BYTES`) are refused. Bulk data (adapter weights\n"
        "sent as tensors) travels in extra ZeroMQ frames after the body, never inside it.\n"
        "`str` values are UTF-8 without NUL bytes (names, ids, paths: a NUL is refused as\n"
        "malformed). `text` values (prompts, stop strings, generated text) are the same msgpack\n"
        "str on the wire but may hold NUL bytes: in C they are `ls_text_t` {`s`, `len`}, `s`\n"
        "NUL-terminated after its `len` bytes.\n\n"
        "## Compatibility rules\n\n"
        "- Message type ids, field ids and enum values only grow. A removed one is kept in\n"
        "  the schema as `retired` so it is never reused (msggen refuses duplicates).\n"
        "- Adding a message, a field or an enum value is compatible: older readers skip\n"
        "  what they do not know and keep unknown enum values as numbers. Bump `version`\n"
        "  only when older readers must refuse the new messages.\n\n"
        "## Index\n\n| type | message | from → to, purpose |\n|---:|---|---|\n",
        schema->version);
    for (size_t b = 0; b < schema->count; b++) {
        s_block_t *block = &schema->blocks[b];
        if (block->what == B_MESSAGE) {
            fprintf(out, "| %u | [%s](#msg-%s) | ", block->id, block->name, block->snake);
            s_md(out, block->doc);
            fprintf(out, " |\n");
        } else if (block->what == B_RETIRED) {
            fprintf(out, "| %u | *retired* | ", block->id);
            s_md(out, block->doc);
            fprintf(out, " |\n");
        }
    }
    static const struct {
        s_what_t what;
        const char *title;
    } sections[] = {{B_MESSAGE, "Messages"}, {B_RECORD, "Records"}, {B_ENUM, "Enums"}};
    for (size_t s = 0; s < sizeof sections / sizeof sections[0]; s++) {
        fprintf(out, "\n## %s\n\n", sections[s].title);
        for (size_t b = 0; b < schema->count; b++)
            if (schema->blocks[b].what == sections[s].what)
                s_md_block(out, schema, &schema->blocks[b]);
    }
}

int main(int argc, char **argv) {
    const char *header = NULL, *source = NULL, *docs = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--header") == 0)
            header = argv[i + 1];
        else if (strcmp(argv[i], "--source") == 0)
            source = argv[i + 1];
        else if (strcmp(argv[i], "--docs") == 0)
            docs = argv[i + 1];
        else
            header = source = docs = NULL, i = argc;
    }
    if (argc < 4 || argc % 2 || !(header || source || docs)) {
        fprintf(stderr, "usage: msggen SCHEMA [--header OUT.h] [--source OUT.c] [--docs OUT.md]\n");
        return 2;
    }
    s_path = argv[1];
    FILE *file = fopen(s_path, "r");
    if (!file)
        s_fail(0, "cannot read %s: %s", s_path, strerror(errno));
    s_schema_t schema = {.path = s_path};
    s_parse(&schema, file);
    fclose(file);
    s_check_names(&schema);

    const struct {
        const char *path;
        void (*emit)(s_schema_t *, FILE *);
    } outputs[] = {{header, s_emit_header}, {source, s_emit_source}, {docs, s_emit_docs}};
    for (size_t i = 0; i < 3; i++) {
        if (!outputs[i].path)
            continue;
        FILE *out = fopen(outputs[i].path, "w");
        if (!out)
            s_fail(0, "cannot write %s: %s", outputs[i].path, strerror(errno));
        outputs[i].emit(&schema, out);
        if (ferror(out) | fclose(out))
            s_fail(0, "cannot write %s", outputs[i].path);
    }
    return 0;
}
