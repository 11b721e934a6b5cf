// jinja_internal: what the parser (jinja_parse.c), the values (jinja_value.c) and the
// interpreter (jinja_eval.c, jinja_filter.c) share. Not a public header.
//
// Memory: everything of a parse (tokens, the tree) and everything of a render (values, scopes,
// texts) comes from one arena, freed at once at the end; nothing is freed piecemeal. Errors:
// the parser and the interpreter stop with jx_fail(), which longjmps to the entry point that
// owns the arena, so no error path has to unwind partial structures by hand.
#ifndef LS_JINJA_INTERNAL_H
#define LS_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"
#include "text_utf8.h"

// ---- arena and failure --------------------------------------------------------------------

typedef struct jchunk jchunk_t;

typedef struct {
    jchunk_t *chunks;
    size_t used, limit;  // bytes handed out / allowed
    jmp_buf *fail;       // where jx_fail() returns to
    char *err;
    size_t errlen;
    const char *src;     // the original template source, for line/column in messages
    const uint32_t *map; // preprocessed offset -> source offset
    size_t map_n;
} jx_t;

void *jx_alloc(jx_t *x, size_t n);
void *jx_grow(jx_t *x, void *old, size_t old_n, size_t new_n);
char *jx_strdup(jx_t *x, const char *s, size_t n);
void jx_free_all(jx_t *x);
// Sets err to the sentence (with the line and column of pos, unless pos is UINT32_MAX) and
// longjmps to x->fail.
_Noreturn void jx_fail(jx_t *x, uint32_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// ---- syntax tree ---------------------------------------------------------------------------

typedef enum {
    // expressions
    N_STR,       // s,n
    N_INT,       // i
    N_FLOAT,     // f
    N_LIST,      // list: items
    N_TUPLE,     // list: items
    N_DICT,      // list: keys, list2: values
    N_NAME,      // s,n
    N_MEMBER,    // a: object, b: property, flag: computed (x[...]); a dot property is N_NAME or N_INT
    N_SLICE,     // a, b, c: start, stop, step (NULL: absent)
    N_CALL,      // a: callee, list: arguments
    N_UNARY,     // op, a
    N_BINARY,    // op, a, b
    N_FILTER,    // a: operand, b: the filter (N_NAME, or N_CALL of an N_NAME)
    N_TEST,      // a: operand, s,n: test name, flag: negated, list: its argument (0 or 1)
    N_SELECT,    // a: value, b: condition (`a if b` with no else: undefined when false)
    N_TERNARY,   // a: condition, b: if true, c: if false
    N_KWARG,     // s,n: name, a: value
    N_SPREAD,    // a: *a
    N_KWSPREAD,  // a: **a
    // statements
    N_IF,        // a: test, list: body, list2: else
    N_FOR,       // a: target (N_NAME or N_TUPLE), b: iterable (N_SELECT for `for x in y if c`),
                 // list: body, list2: else
    N_SET,       // a: target, b: value (NULL: the block list), list: block
    N_MACRO,     // s,n: name, list: parameters (N_NAME or N_KWARG), list2: body
    N_CALLBLOCK, // a: the N_CALL, list: caller's parameters, list2: body
    N_FILTERBLOCK,  // b: filter, list: body
    N_BREAK,
    N_CONTINUE,
    N_COMMENT,
} jnode_kind_t;

typedef enum {
    OP_ADD, OP_SUB, OP_CONCAT, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE, OP_GE, OP_IN, OP_NOTIN, OP_AND, OP_OR,
    OP_NOT, OP_NEG, OP_POS,
} jop_t;

typedef struct jnode jnode_t;

typedef struct {
    jnode_t **v;
    size_t n;
} jnodes_t;

struct jnode {
    uint8_t kind, op;
    bool flag;
    uint32_t pos;  // offset in the preprocessed source
    const char *s;
    size_t n;
    int64_t i;
    double f;
    jnode_t *a, *b, *c;
    jnodes_t list, list2;
};

struct ls_jinja {
    jx_t x;      // owns everything below, and the source copy with its offset map
    jnodes_t body;
};

// Parses src into t->body; fails through t->x.
void jparse_run(ls_jinja_t *t, const char *src, size_t len);

// ---- values -------------------------------------------------------------------------------

typedef enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC,
} jv_type_t;

typedef struct jlist jlist_t;
typedef struct jdict jdict_t;
typedef struct jfunc jfunc_t;

typedef struct {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        jlist_t *l;
        jdict_t *d;  // JV_DICT and JV_NS
        jfunc_t *fn;
    } u;
} jv_t;

struct jlist {
    jv_t *v;
    size_t n, cap;
};

typedef struct {
    const char *k;
    size_t kn;
    jv_t v;
} jentry_t;

struct jdict {
    jentry_t *e;
    size_t n, cap;
};

static inline jv_t jv_undef(void) { return (jv_t){.t = JV_UNDEF}; }
static inline jv_t jv_none(void) { return (jv_t){.t = JV_NONE}; }
static inline jv_t jv_bool(bool b) { return (jv_t){.t = JV_BOOL, .u.b = b}; }
static inline jv_t jv_int(int64_t i) { return (jv_t){.t = JV_INT, .u.i = i}; }
static inline jv_t jv_float(double f) { return (jv_t){.t = JV_FLOAT, .u.f = f}; }
static inline jv_t jv_str(const char *p, size_t n) { return (jv_t){.t = JV_STR, .u.s = {p, n}}; }

const char *jv_type_name(jv_type_t t);  // @huggingface/jinja's names: "StringValue", ...
jv_t jv_cstr(jx_t *x, const char *s);   // a copy of s
jlist_t *jv_list_new(jx_t *x, size_t cap);
void jv_list_push(jx_t *x, jlist_t *l, jv_t v);
jdict_t *jv_dict_new(jx_t *x);
jv_t *jv_dict_get(const jdict_t *d, const char *k, size_t kn);
void jv_dict_set(jx_t *x, jdict_t *d, const char *k, size_t kn, jv_t v);
bool jv_truthy(jv_t v);
// JavaScript's == and === on the values, as @huggingface/jinja compares them.
bool jv_loose_eq(jv_t a, jv_t b);
bool jv_strict_eq(jv_t a, jv_t b);
// A JSON document as values (objects keep their key order).
jv_t jv_from_json(jx_t *x, const json_t *j);

// How a value prints ({{ v }}); undefined and none print nothing (the caller skips them).
void jv_print(jx_t *x, ls_buf_t *out, jv_t v);
// JavaScript's String(v.value), which `+` and `~` concatenate.
void jv_print_raw(jx_t *x, ls_buf_t *out, jv_t v);
// JSON.stringify as the tojson filter writes it. indent 0: on one line.
typedef struct {
    int indent;
    bool ensure_ascii, sort_keys, undefined_as_null;
    const char *item_sep, *key_sep;  // NULL: the defaults for indent
} jjson_opts_t;
void jv_to_json(jx_t *x, ls_buf_t *out, jv_t v, const jjson_opts_t *o, int depth);
// Appends a number as JavaScript's Number#toString writes it.
void jv_put_number(jx_t *x, ls_buf_t *out, double f);
// A checked append: fails through x when out of memory or past LS_JINJA_MAX_OUTPUT.
void jx_put(jx_t *x, ls_buf_t *out, const void *p, size_t n);
// An ls_buf_t that the arena frees (its bytes are copied in, as a string value).
jv_t jx_buf_take(jx_t *x, ls_buf_t *b);

// ---- strings (code points; case maps and whitespace as JavaScript's) -----------------------

// Whether cp is JavaScript's \s (what String#trim removes).
bool jstr_is_space(uint32_t cp);
// Decodes the code point at *i (advancing it); invalid bytes decode as themselves, one by one.
uint32_t jstr_next(const char *s, size_t n, size_t *i);
size_t jstr_utf16_len(const char *s, size_t n);
void jstr_trim(const char **s, size_t *n, bool left, bool right);

// ---- the interpreter (jinja_eval.c) and its filters, tests, methods (jinja_filter.c) --------

typedef struct jscope jscope_t;

typedef struct {
    jx_t *x;
    const ls_jinja_t *t;
    jscope_t *globals;
    int64_t now_s;
    uint32_t depth;
    uint64_t steps;
} jrun_t;

// Evaluated call arguments: positional values, then keywords in call order.
typedef struct {
    jv_t *pos;
    size_t npos;
    jdict_t *kw;
} jargs_t;

jv_t jeval(jrun_t *r, const jnode_t *e, jscope_t *sc);
// Counts n steps of work against LS_JINJA_MAX_STEPS (work inside one built-in: comparisons of
// a sort, items of a filter, bytes scanned), failing past it.
void jrun_charge(jrun_t *r, uint64_t n, uint32_t pos);
void jargs_eval(jrun_t *r, const jnodes_t *args, jscope_t *sc, jargs_t *out);
// The value of a keyword argument or of positional i; NULL when neither is given.
jv_t *jargs_get(jargs_t *a, size_t i, const char *kw);

jv_t jfilter_apply(jrun_t *r, jv_t v, const jnode_t *filter, jscope_t *sc);
bool jtest_apply(jrun_t *r, const char *name, size_t n, jv_t v, const jv_t *arg, uint32_t pos);
// The built-in attribute `name` of v (a string's methods, a dict's get/items/...), or undefined.
jv_t jmethod_get(jrun_t *r, jv_t v, const char *name, size_t n);
// Calls a built-in function value (methods, range, namespace, raise_exception, ...).
jv_t jbuiltin_call(jrun_t *r, const jfunc_t *fn, jargs_t *a, uint32_t pos);
// The callable global built-ins, by name; jv_undef() when there is none.
jv_t jbuiltin_global(jrun_t *r, const char *name);

typedef enum { JF_BUILTIN, JF_MACRO, JF_CALLER } jfunc_kind_t;

struct jfunc {
    uint8_t kind;
    int builtin;             // JF_BUILTIN: which one (jinja_filter.c's table)
    jv_t self;               // JF_BUILTIN: the value a method is bound to
    const jnode_t *node;     // JF_MACRO: the N_MACRO; JF_CALLER: the N_CALLBLOCK
    jscope_t *env;           // JF_CALLER: the scope of the call block
};

#endif
