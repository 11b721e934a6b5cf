// jinja_eval — the interpreter: statements write into an output buffer, expressions evaluate to
// values, with @huggingface/jinja's semantics (scopes: a for loop and a macro call open one, an
// if does not; macros see the caller's variables; `==` is JavaScript's `==`; arithmetic on
// undefined or none is an error). Bounded: depth, steps, memory and output (jinja.h).
#define _GNU_SOURCE  // memmem
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"
#include "ls_err.h"

struct jscope {
    jscope_t *parent;
    jdict_t vars;
};

typedef enum { S_NORMAL, S_BREAK, S_CONTINUE } sflow_t;

static jscope_t *s_scope_new(jrun_t *r, jscope_t *parent) {
    jscope_t *s = jx_alloc(r->x, sizeof *s);
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

static void s_scope_set(jrun_t *r, jscope_t *s, const char *k, size_t kn, jv_t v) { jv_dict_set(r->x, &s->vars, k, kn, v); }

static jv_t s_lookup(jrun_t *r, jscope_t *s, const char *k, size_t kn) {
    for (; s; s = s->parent) {
        const jv_t *v = jv_dict_get(&s->vars, k, kn);
        if (v)
            return *v;
    }
    char name[32];
    if (kn >= sizeof name || memchr(k, 0, kn))
        return jv_undef();
    memcpy(name, k, kn);
    name[kn] = 0;
    return jbuiltin_global(r, name);
}

void jrun_charge(jrun_t *r, uint64_t n, uint32_t pos) {
    r->steps += n;
    if (r->steps > LS_JINJA_MAX_STEPS)
        jx_fail(r->x, pos, "the template runs too long (more than %d steps)", LS_JINJA_MAX_STEPS);
}

static void s_step(jrun_t *r, uint32_t pos) { jrun_charge(r, 1, pos); }

static void s_enter(jrun_t *r, uint32_t pos) {
    if (++r->depth > LS_JINJA_MAX_DEPTH)
        jx_fail(r->x, pos, "the template nests or recurses deeper than %d levels", LS_JINJA_MAX_DEPTH);
    s_step(r, pos);
}

static sflow_t s_exec_block(jrun_t *r, const jnodes_t *body, jscope_t *sc, ls_buf_t *out);

// A block rendered into a string of its own (set blocks, macro bodies, filter blocks).
static jv_t s_capture(jrun_t *r, const jnodes_t *body, jscope_t *sc, uint32_t pos) {
    ls_buf_t b = {0};
    if (s_exec_block(r, body, sc, &b) != S_NORMAL)
        jx_fail(r->x, pos, "break or continue outside a loop");
    return jx_buf_take(r->x, &b);
}

// ---- arguments and calls -------------------------------------------------------------------------

void jargs_eval(jrun_t *r, const jnodes_t *args, jscope_t *sc, jargs_t *out) {
    size_t cap = args->n ? args->n : 1;
    out->pos = jx_alloc(r->x, cap * sizeof *out->pos);
    out->npos = 0;
    out->kw = jv_dict_new(r->x);
    for (size_t i = 0; i < args->n; i++) {
        const jnode_t *a = args->v[i];
        if (a->kind == N_SPREAD) {
            jv_t v = jeval(r, a->a, sc);
            if (v.t != JV_LIST)
                jx_fail(r->x, a->pos, "Cannot unpack non-iterable type: %s", jv_type_name(v.t));
            cap += v.u.l->n;
            out->pos = jx_grow(r->x, out->pos, out->npos * sizeof *out->pos, cap * sizeof *out->pos);
            for (size_t k = 0; k < v.u.l->n; k++)
                out->pos[out->npos++] = v.u.l->v[k];
        } else if (a->kind != N_KWARG && a->kind != N_KWSPREAD) {
            out->pos[out->npos++] = jeval(r, a, sc);
        }
    }
    for (size_t i = 0; i < args->n; i++) {
        const jnode_t *a = args->v[i];
        if (a->kind == N_KWARG) {
            if (jv_dict_get(out->kw, a->s, a->n))
                jx_fail(r->x, a->pos, "Got multiple values for keyword argument '%.*s'", (int)a->n, a->s);
            jv_dict_set(r->x, out->kw, a->s, a->n, jeval(r, a->a, sc));
        } else if (a->kind == N_KWSPREAD) {
            jv_t v = jeval(r, a->a, sc);
            if (v.t != JV_DICT)
                jx_fail(r->x, a->pos, "Argument after ** must be a mapping, not %s", jv_type_name(v.t));
            for (size_t k = 0; k < v.u.d->n; k++) {
                if (jv_dict_get(out->kw, v.u.d->e[k].k, v.u.d->e[k].kn))
                    jx_fail(r->x, a->pos, "Got multiple values for keyword argument '%.*s'", (int)v.u.d->e[k].kn,
                            v.u.d->e[k].k);
                jv_dict_set(r->x, out->kw, v.u.d->e[k].k, v.u.d->e[k].kn, v.u.d->e[k].v);
            }
        }
    }
}

jv_t *jargs_get(jargs_t *a, size_t i, const char *kw) {
    if (i < a->npos)
        return &a->pos[i];
    return kw ? jv_dict_get(a->kw, kw, strlen(kw)) : NULL;
}

// Binds arguments to the parameters of a macro or call block in scope sc: positionals in order,
// then keywords by name, then defaults (evaluated in sc, so they see earlier parameters).
// Extra arguments are in `varargs` and `kwargs`, as Jinja2 gives them.
static void s_bind(jrun_t *r, const jnodes_t *params, jargs_t *a, jscope_t *sc) {
    jv_t extra_kw = {.t = JV_DICT, .u.d = jv_dict_new(r->x)};
    for (size_t i = 0; i < a->kw->n; i++) {
        const jentry_t *k = &a->kw->e[i];
        bool is_param = false;
        for (size_t j = a->npos; j < params->n && !is_param; j++)
            is_param = params->v[j]->n == k->kn && memcmp(params->v[j]->s, k->k, k->kn) == 0;
        if (!is_param)
            jv_dict_set(r->x, extra_kw.u.d, k->k, k->kn, k->v);
    }
    for (size_t i = 0; i < params->n; i++) {
        const jnode_t *p = params->v[i];
        const jv_t *given = i < a->npos ? &a->pos[i] : jv_dict_get(a->kw, p->s, p->n);
        s_scope_set(r, sc, p->s, p->n, given ? *given : jv_undef());
    }
    for (size_t i = a->npos; i < params->n; i++) {
        const jnode_t *p = params->v[i];
        if (p->kind == N_KWARG && !jv_dict_get(a->kw, p->s, p->n))
            s_scope_set(r, sc, p->s, p->n, jeval(r, p->a, sc));
    }
    jv_t extra_pos = {.t = JV_LIST, .u.l = jv_list_new(r->x, 0)};
    for (size_t i = params->n; i < a->npos; i++)
        jv_list_push(r->x, extra_pos.u.l, a->pos[i]);
    s_scope_set(r, sc, "kwargs", 6, extra_kw);
    s_scope_set(r, sc, "varargs", 7, extra_pos);
}

// Calls fn; sc is the scope of the call site (a macro's body sees the caller's variables).
static jv_t s_call(jrun_t *r, jv_t fn, jargs_t *a, jscope_t *sc, uint32_t pos) {
    if (fn.t != JV_FUNC)
        jx_fail(r->x, pos, "Cannot call something that is not a function: got %s", jv_type_name(fn.t));
    const jfunc_t *f = fn.u.fn;
    if (f->kind == JF_BUILTIN)
        return jbuiltin_call(r, f, a, pos);
    const jnode_t *n = f->node;
    jscope_t *inner = s_scope_new(r, f->kind == JF_CALLER ? f->env : sc);
    const jnodes_t *params = &n->list;
    s_bind(r, params, a, inner);
    return s_capture(r, &n->list2, inner, n->pos);
}

// ---- expressions -------------------------------------------------------------------------------

static jv_t s_slice(jrun_t *r, jv_t obj, const jnode_t *e, jscope_t *sc) {
    if (obj.t != JV_LIST && obj.t != JV_STR)
        jx_fail(r->x, e->pos, "Slice object must be an array or string");
    const jnode_t *parts[3] = {e->a, e->b, e->c};
    const char *names[3] = {"start", "stop", "step"};
    bool has[3];
    int64_t v[3] = {0, 0, 1};
    for (int k = 0; k < 3; k++) {
        jv_t x = parts[k] ? jeval(r, parts[k], sc) : jv_undef();
        if (x.t != JV_INT && x.t != JV_UNDEF)
            jx_fail(r->x, e->pos, "Slice %s must be numeric or undefined", names[k]);
        has[k] = x.t == JV_INT;
        if (has[k])
            v[k] = x.u.i;
    }
    // the items: a list's values, or a string's code points as offsets
    size_t n;
    size_t *offs = NULL;
    jrun_charge(r, (obj.t == JV_LIST ? obj.u.l->n : obj.u.s.n) / 16, e->pos);
    if (obj.t == JV_LIST) {
        n = obj.u.l->n;
    } else {
        n = 0;
        offs = jx_alloc(r->x, (obj.u.s.n + 1) * sizeof *offs);
        for (size_t i = 0; i < obj.u.s.n;) {
            offs[n++] = i;
            jstr_next(obj.u.s.p, obj.u.s.n, &i);
        }
        offs[n] = obj.u.s.n;
    }
    int64_t len = (int64_t)n, step = has[2] ? v[2] : 1, start, stop;
    if (step >= 0) {
        start = !has[0] ? 0 : v[0] < 0 ? (len + v[0] > 0 ? len + v[0] : 0) : (v[0] < len ? v[0] : len);
        stop = !has[1] ? len : v[1] < 0 ? (len + v[1] > 0 ? len + v[1] : 0) : (v[1] < len ? v[1] : len);
    } else {
        start = !has[0] ? len - 1 : v[0] < 0 ? (len + v[0] > -1 ? len + v[0] : -1) : (v[0] < len - 1 ? v[0] : len - 1);
        stop = !has[1] ? -1 : v[1] < -1 ? (len + v[1] > -1 ? len + v[1] : -1) : (v[1] < len - 1 ? v[1] : len - 1);
    }
    int dir = step > 0 ? 1 : step < 0 ? -1 : 0;
    if (obj.t == JV_LIST) {
        jv_t out = {.t = JV_LIST, .u.l = jv_list_new(r->x, 0)};
        for (int64_t i = start; dir * i < dir * stop; i += step)
            jv_list_push(r->x, out.u.l, obj.u.l->v[i]);
        return out;
    }
    ls_buf_t b = {0};
    for (int64_t i = start; dir * i < dir * stop; i += step)
        jx_put(r->x, &b, obj.u.s.p + offs[i], offs[i + 1] - offs[i]);
    return jx_buf_take(r->x, &b);
}

// The code point at index i of a string (negative: from the end), or undefined.
static jv_t s_str_index(jrun_t *r, jv_t s, int64_t i, uint32_t pos) {
    jrun_charge(r, s.u.s.n / 64, pos);
    size_t n = 0, off = 0;
    for (size_t k = 0; k < s.u.s.n; n++)
        jstr_next(s.u.s.p, s.u.s.n, &k);
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || i >= (int64_t)n)
        return jv_undef();
    for (int64_t k = 0; k < i; k++)
        jstr_next(s.u.s.p, s.u.s.n, &off);
    size_t end = off;
    jstr_next(s.u.s.p, s.u.s.n, &end);
    return jv_str(jx_strdup(r->x, s.u.s.p + off, end - off), end - off);
}

static jv_t s_member(jrun_t *r, const jnode_t *e, jscope_t *sc) {
    jv_t obj = jeval(r, e->a, sc), prop;
    if (e->flag) {
        if (e->b->kind == N_SLICE)
            return s_slice(r, obj, e->b, sc);
        prop = jeval(r, e->b, sc);
    } else if (e->b->kind == N_INT) {
        prop = jv_int(e->b->i);
    } else {
        prop = jv_str(e->b->s, e->b->n);
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        if (prop.t != JV_STR)
            jx_fail(r->x, e->pos, "Cannot access property with non-string: got %s", jv_type_name(prop.t));
        const jv_t *v = jv_dict_get(obj.u.d, prop.u.s.p, prop.u.s.n);
        if (v)
            return *v;
        return obj.t == JV_DICT ? jmethod_get(r, obj, prop.u.s.p, prop.u.s.n) : jv_undef();
    }
    if (obj.t == JV_LIST || obj.t == JV_STR) {
        if (prop.t == JV_INT) {
            if (obj.t == JV_STR)
                return s_str_index(r, obj, prop.u.i, e->pos);
            int64_t i = prop.u.i < 0 ? prop.u.i + (int64_t)obj.u.l->n : prop.u.i;
            return i >= 0 && i < (int64_t)obj.u.l->n ? obj.u.l->v[i] : jv_undef();
        }
        if (prop.t == JV_STR)
            return jmethod_get(r, obj, prop.u.s.p, prop.u.s.n);
        jx_fail(r->x, e->pos, "Cannot access property with non-string/non-number: got %s", jv_type_name(prop.t));
    }
    if (prop.t != JV_STR)
        jx_fail(r->x, e->pos, "Cannot access property with non-string: got %s", jv_type_name(prop.t));
    return jmethod_get(r, obj, prop.u.s.p, prop.u.s.n);
}

static bool s_num(jv_t v) { return v.t == JV_INT || v.t == JV_FLOAT; }
static double s_dbl(jv_t v) { return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : v.u.b; }

static jv_t s_arith(jrun_t *r, jop_t op, jv_t a, jv_t b, uint32_t pos) {
    bool fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    if (!fl && op != OP_DIV) {
        int64_t x = a.u.i, y = b.u.i, z;
        bool over = false;
        switch (op) {
        case OP_ADD:
            over = __builtin_add_overflow(x, y, &z);
            break;
        case OP_SUB:
            over = __builtin_sub_overflow(x, y, &z);
            break;
        case OP_MUL:
            over = __builtin_mul_overflow(x, y, &z);
            break;
        case OP_FLOORDIV:
        case OP_MOD:
            if (y == 0)
                jx_fail(r->x, pos, "division by zero");
            if (x == INT64_MIN && y == -1)
                jx_fail(r->x, pos, "integer overflow");
            if (op == OP_MOD) {
                z = x % y;  // JavaScript's %: the sign of the dividend
            } else {
                z = x / y;
                if ((x % y != 0) && ((x < 0) != (y < 0)))
                    z--;  // Math.floor
            }
            break;
        default:
            z = 0;
        }
        if (over)
            jx_fail(r->x, pos, "integer overflow");
        return jv_int(z);
    }
    double x = s_dbl(a), y = s_dbl(b);
    switch (op) {
    case OP_ADD:
        return jv_float(x + y);
    case OP_SUB:
        return jv_float(x - y);
    case OP_MUL:
        return jv_float(x * y);
    case OP_DIV:
        return jv_float(x / y);
    case OP_FLOORDIV:
        return jv_float(floor(x / y));
    default:
        return jv_float(fmod(x, y));
    }
}

static jv_t s_binary(jrun_t *r, const jnode_t *e, jscope_t *sc) {
    jop_t op = (jop_t)e->op;
    jv_t a = jeval(r, e->a, sc);
    if (op == OP_AND)
        return jv_truthy(a) ? jeval(r, e->b, sc) : a;
    if (op == OP_OR)
        return jv_truthy(a) ? a : jeval(r, e->b, sc);
    jv_t b = jeval(r, e->b, sc);
    if (op == OP_EQ || op == OP_NE)
        return jv_bool(jv_loose_eq(a, b) == (op == OP_EQ));
    static const char *names[] = {"+", "-", "~", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "in", "not in"};
    if (a.t == JV_UNDEF || b.t == JV_UNDEF) {
        if (b.t == JV_UNDEF && (op == OP_IN || op == OP_NOTIN))
            return jv_bool(op == OP_NOTIN);
        jx_fail(r->x, e->pos, "Cannot perform operation %s on undefined values", names[op]);
    }
    if (a.t == JV_NONE || b.t == JV_NONE)
        jx_fail(r->x, e->pos, "Cannot perform operation on null values");
    if (op == OP_CONCAT || (op == OP_ADD && (a.t == JV_STR || b.t == JV_STR) && !(s_num(a) && s_num(b)) &&
                            !(a.t == JV_LIST && b.t == JV_LIST) && b.t != JV_LIST)) {
        ls_buf_t out = {0};
        jv_print_raw(r->x, &out, a);
        jv_print_raw(r->x, &out, b);
        return jx_buf_take(r->x, &out);
    }
    bool an = s_num(a) || a.t == JV_BOOL, bn = s_num(b) || b.t == JV_BOOL;
    if (op == OP_POW && an && bn) {
        double x = s_dbl(a), y = s_dbl(b), z = pow(x, y);
        if (x == 0 && y < 0)
            jx_fail(r->x, e->pos, "0.0 cannot be raised to a negative power");
        if (!isfinite(z))
            jx_fail(r->x, e->pos, "Exponentiation result is not a finite real number");
        if (a.t == JV_FLOAT || b.t == JV_FLOAT || y < 0 || fabs(z) > 9e18)
            return jv_float(z);
        return jv_int((int64_t)z);
    }
    if (s_num(a) && s_num(b)) {
        switch (op) {
        case OP_LT:
            return jv_bool(s_dbl(a) < s_dbl(b));
        case OP_GT:
            return jv_bool(s_dbl(a) > s_dbl(b));
        case OP_LE:
            return jv_bool(s_dbl(a) <= s_dbl(b));
        case OP_GE:
            return jv_bool(s_dbl(a) >= s_dbl(b));
        case OP_ADD:
        case OP_SUB:
        case OP_MUL:
        case OP_DIV:
        case OP_FLOORDIV:
        case OP_MOD:
            return s_arith(r, op, a, b, e->pos);
        default:
            break;
        }
    } else if (a.t == JV_LIST && b.t == JV_LIST) {
        if (op == OP_ADD) {
            jv_t out = {.t = JV_LIST, .u.l = jv_list_new(r->x, a.u.l->n + b.u.l->n)};
            for (size_t i = 0; i < a.u.l->n; i++)
                jv_list_push(r->x, out.u.l, a.u.l->v[i]);
            for (size_t i = 0; i < b.u.l->n; i++)
                jv_list_push(r->x, out.u.l, b.u.l->v[i]);
            return out;
        }
    }
    if (b.t == JV_LIST && (op == OP_IN || op == OP_NOTIN)) {
        jrun_charge(r, b.u.l->n, e->pos);
        bool found = false;
        for (size_t i = 0; i < b.u.l->n && !found; i++)
            found = jv_strict_eq(b.u.l->v[i], a);
        return jv_bool(found == (op == OP_IN));
    }
    if (a.t == JV_STR && b.t == JV_STR && (op == OP_IN || op == OP_NOTIN)) {
        bool found = a.u.s.n == 0 || (b.u.s.n >= a.u.s.n && memmem(b.u.s.p, b.u.s.n, a.u.s.p, a.u.s.n) != NULL);
        return jv_bool(found == (op == OP_IN));
    }
    if (a.t == JV_STR && b.t == JV_DICT && (op == OP_IN || op == OP_NOTIN))
        return jv_bool((jv_dict_get(b.u.d, a.u.s.p, a.u.s.n) != NULL) == (op == OP_IN));
    jx_fail(r->x, e->pos, "Unknown operator \"%s\" between %s and %s", names[op], jv_type_name(a.t), jv_type_name(b.t));
}

jv_t jeval(jrun_t *r, const jnode_t *e, jscope_t *sc) {
    s_enter(r, e->pos);
    jv_t v;
    switch (e->kind) {
    case N_STR:
        v = jv_str(e->s, e->n);
        break;
    case N_INT:
        v = jv_int(e->i);
        break;
    case N_FLOAT:
        v = jv_float(e->f);
        break;
    case N_LIST:
    case N_TUPLE:
        v = (jv_t){.t = JV_LIST, .u.l = jv_list_new(r->x, e->list.n)};
        for (size_t i = 0; i < e->list.n; i++)
            jv_list_push(r->x, v.u.l, jeval(r, e->list.v[i], sc));
        break;
    case N_DICT:
        v = (jv_t){.t = JV_DICT, .u.d = jv_dict_new(r->x)};
        for (size_t i = 0; i < e->list.n; i++) {
            jv_t k = jeval(r, e->list.v[i], sc);
            if (k.t != JV_STR)
                jx_fail(r->x, e->list.v[i]->pos, "Object keys must be strings: got %s", jv_type_name(k.t));
            jv_dict_set(r->x, v.u.d, k.u.s.p, k.u.s.n, jeval(r, e->list2.v[i], sc));
        }
        break;
    case N_NAME:
        v = s_lookup(r, sc, e->s, e->n);
        break;
    case N_MEMBER:
        v = s_member(r, e, sc);
        break;
    case N_CALL: {
        jargs_t a;
        jargs_eval(r, &e->list, sc, &a);
        v = s_call(r, jeval(r, e->a, sc), &a, sc, e->pos);
        break;
    }
    case N_UNARY: {
        jv_t x = jeval(r, e->a, sc);
        if (e->op == OP_NOT) {
            v = jv_bool(!jv_truthy(x));
        } else if (x.t == JV_INT || x.t == JV_BOOL) {
            int64_t i = x.t == JV_BOOL ? x.u.b : x.u.i;
            if (e->op == OP_NEG && i == INT64_MIN)
                jx_fail(r->x, e->pos, "integer overflow");
            v = jv_int(e->op == OP_NEG ? -i : i);
        } else if (x.t == JV_FLOAT) {
            v = jv_float(e->op == OP_NEG ? -x.u.f : x.u.f);
        } else {
            jx_fail(r->x, e->pos, "Unknown operator \"%s\" for %s", e->op == OP_NEG ? "-" : "+", jv_type_name(x.t));
        }
        break;
    }
    case N_BINARY:
        v = s_binary(r, e, sc);
        break;
    case N_FILTER:
        v = jfilter_apply(r, jeval(r, e->a, sc), e->b, sc);
        break;
    case N_TEST: {
        jv_t x = jeval(r, e->a, sc), arg = e->list.n ? jeval(r, e->list.v[0], sc) : jv_undef();
        v = jv_bool(jtest_apply(r, e->s, e->n, x, e->list.n ? &arg : NULL, e->pos) != e->flag);
        break;
    }
    case N_SELECT:
        v = jv_truthy(jeval(r, e->b, sc)) ? jeval(r, e->a, sc) : jv_undef();
        break;
    case N_TERNARY:
        v = jv_truthy(jeval(r, e->a, sc)) ? jeval(r, e->b, sc) : jeval(r, e->c, sc);
        break;
    default:
        jx_fail(r->x, e->pos, "this expression cannot stand here");
    }
    r->depth--;
    return v;
}

// ---- statements ---------------------------------------------------------------------------------

static void s_assign(jrun_t *r, const jnode_t *target, jv_t v, jscope_t *sc) {
    if (target->kind == N_NAME) {
        s_scope_set(r, sc, target->s, target->n, v);
    } else if (target->kind == N_TUPLE) {
        if (v.t != JV_LIST)
            jx_fail(r->x, target->pos, "Cannot unpack non-iterable type in set: %s", jv_type_name(v.t));
        if (v.u.l->n != target->list.n)
            jx_fail(r->x, target->pos, "Too %s items to unpack in set", target->list.n > v.u.l->n ? "few" : "many");
        for (size_t i = 0; i < target->list.n; i++) {
            const jnode_t *t = target->list.v[i];
            if (t->kind != N_NAME)
                jx_fail(r->x, t->pos, "Cannot unpack to non-identifier in set");
            s_scope_set(r, sc, t->s, t->n, v.u.l->v[i]);
        }
    } else if (target->kind == N_MEMBER) {
        jv_t obj = jeval(r, target->a, sc);
        if (obj.t != JV_NS)
            jx_fail(r->x, target->pos, "cannot assign attribute on non-namespace object");
        if (target->flag || target->b->kind != N_NAME)
            jx_fail(r->x, target->pos, "Cannot assign to member with non-identifier property");
        jv_dict_set(r->x, obj.u.d, target->b->s, target->b->n, v);
    } else {
        jx_fail(r->x, target->pos, "Invalid left-hand side of an assignment");
    }
}

static void s_bind_loopvar(jrun_t *r, const jnode_t *target, jv_t item, jscope_t *sc) {
    if (target->kind == N_NAME) {
        s_scope_set(r, sc, target->s, target->n, item);
        return;
    }
    if (item.t != JV_LIST)
        jx_fail(r->x, target->pos, "Cannot unpack non-iterable type: %s", jv_type_name(item.t));
    if (item.u.l->n != target->list.n)
        jx_fail(r->x, target->pos, "Too %s items to unpack", target->list.n > item.u.l->n ? "few" : "many");
    for (size_t i = 0; i < target->list.n; i++)
        s_scope_set(r, sc, target->list.v[i]->s, target->list.v[i]->n, item.u.l->v[i]);
}

static void s_for(jrun_t *r, const jnode_t *e, jscope_t *sc, ls_buf_t *out) {
    jscope_t *scope = s_scope_new(r, sc);
    const jnode_t *cond = NULL;
    jv_t it;
    if (e->b->kind == N_SELECT) {
        it = jeval(r, e->b->a, scope);
        cond = e->b->b;
    } else {
        it = jeval(r, e->b, scope);
    }
    if (it.t == JV_DICT) {
        jv_t keys = {.t = JV_LIST, .u.l = jv_list_new(r->x, it.u.d->n)};
        for (size_t i = 0; i < it.u.d->n; i++)
            jv_list_push(r->x, keys.u.l, jv_str(it.u.d->e[i].k, it.u.d->e[i].kn));
        it = keys;
    }
    if (it.t != JV_LIST)
        jx_fail(r->x, e->b->pos, "Expected iterable or object type in for loop: got %s", jv_type_name(it.t));
    // Without a condition the list itself is iterated (no template can change a list in place).
    jlist_t *items = cond ? jv_list_new(r->x, it.u.l->n) : it.u.l;
    for (size_t i = 0; cond && i < it.u.l->n; i++) {
        jscope_t *ls = s_scope_new(r, scope);
        s_bind_loopvar(r, e->a, it.u.l->v[i], ls);
        if (jv_truthy(jeval(r, cond, ls)))
            jv_list_push(r->x, items, it.u.l->v[i]);
    }
    bool none_ran = true;
    size_t n = items->n;
    // One loop object updated in place: an iteration allocates nothing of its own, so a long
    // loop meets the step bound, not the memory bound.
    jv_t loop = {.t = JV_DICT, .u.d = jv_dict_new(r->x)};
    jdict_t *d = loop.u.d;
    for (size_t i = 0; i < n; i++) {
        s_step(r, e->pos);  // an empty body is work too
        jv_dict_set(r->x, d, "index", 5, jv_int((int64_t)i + 1));
        jv_dict_set(r->x, d, "index0", 6, jv_int((int64_t)i));
        jv_dict_set(r->x, d, "revindex", 8, jv_int((int64_t)(n - i)));
        jv_dict_set(r->x, d, "revindex0", 9, jv_int((int64_t)(n - i - 1)));
        jv_dict_set(r->x, d, "first", 5, jv_bool(i == 0));
        jv_dict_set(r->x, d, "last", 4, jv_bool(i == n - 1));
        jv_dict_set(r->x, d, "length", 6, jv_int((int64_t)n));
        jv_dict_set(r->x, d, "previtem", 8, i > 0 ? items->v[i - 1] : jv_undef());
        jv_dict_set(r->x, d, "nextitem", 8, i + 1 < n ? items->v[i + 1] : jv_undef());
        s_scope_set(r, scope, "loop", 4, loop);
        s_bind_loopvar(r, e->a, items->v[i], scope);
        sflow_t f = s_exec_block(r, &e->list, scope, out);
        if (f == S_BREAK)
            break;
        if (f == S_CONTINUE)
            continue;  // as @huggingface/jinja: an iteration cut by continue does not count
        none_ran = false;
    }
    if (none_ran && s_exec_block(r, &e->list2, scope, out) != S_NORMAL)
        jx_fail(r->x, e->pos, "break or continue outside a loop");
}

// A macro (its N_MACRO) or a call block's caller (its N_CALLBLOCK and the scope it runs in).
static jv_t s_func_new(jrun_t *r, jfunc_kind_t kind, const jnode_t *node, jscope_t *env) {
    jfunc_t *f = jx_alloc(r->x, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = node;
    f->env = env;
    return (jv_t){.t = JV_FUNC, .u.fn = f};
}

static sflow_t s_exec(jrun_t *r, const jnode_t *e, jscope_t *sc, ls_buf_t *out) {
    switch (e->kind) {
    case N_STR:
        jx_put(r->x, out, e->s, e->n);
        return S_NORMAL;
    case N_COMMENT:
        return S_NORMAL;
    case N_BREAK:
        return S_BREAK;
    case N_CONTINUE:
        return S_CONTINUE;
    case N_IF:
        return s_exec_block(r, jv_truthy(jeval(r, e->a, sc)) ? &e->list : &e->list2, sc, out);
    case N_FOR:
        s_for(r, e, sc, out);
        return S_NORMAL;
    case N_SET:
        s_assign(r, e->a, e->b ? jeval(r, e->b, sc) : s_capture(r, &e->list, sc, e->pos), sc);
        return S_NORMAL;
    case N_MACRO:
        s_scope_set(r, sc, e->s, e->n, s_func_new(r, JF_MACRO, e, NULL));
        return S_NORMAL;
    case N_CALLBLOCK: {
        jv_t caller = s_func_new(r, JF_CALLER, e, sc);
        jargs_t a;
        jargs_eval(r, &e->a->list, sc, &a);
        jv_t fn = jeval(r, e->a->a, sc);
        jscope_t *with_caller = s_scope_new(r, sc);
        s_scope_set(r, with_caller, "caller", 6, caller);
        jv_t v = s_call(r, fn, &a, with_caller, e->pos);
        if (v.t != JV_UNDEF && v.t != JV_NONE)
            jv_print(r->x, out, v);
        return S_NORMAL;
    }
    case N_FILTERBLOCK: {
        jv_t v = jfilter_apply(r, s_capture(r, &e->list, sc, e->pos), e->b, sc);
        if (v.t != JV_UNDEF && v.t != JV_NONE)
            jv_print(r->x, out, v);
        return S_NORMAL;
    }
    default: {
        jv_t v = jeval(r, e, sc);
        if (v.t != JV_UNDEF && v.t != JV_NONE)
            jv_print(r->x, out, v);
        return S_NORMAL;
    }
    }
}

static sflow_t s_exec_block(jrun_t *r, const jnodes_t *body, jscope_t *sc, ls_buf_t *out) {
    for (size_t i = 0; i < body->n; i++) {
        s_enter(r, body->v[i]->pos);
        sflow_t f = s_exec(r, body->v[i], sc, out);
        r->depth--;
        if (f != S_NORMAL)
            return f;
    }
    return S_NORMAL;
}

// ---- entry points ---------------------------------------------------------------------------------

static int s_parse(ls_jinja_t *t, const char *src, size_t len) {
    jmp_buf fail;
    t->x.fail = &fail;
    if (setjmp(fail))
        return -1;
    jparse_run(t, src, len);
    return 0;
}

ls_jinja_t *ls_jinja_parse(const char *src, size_t len, char *err, size_t errlen) {
    ls_jinja_t *t = calloc(1, sizeof *t);
    if (!t) {
        ls_err_set(err, errlen, "out of memory");
        return NULL;
    }
    t->x.err = err;
    t->x.errlen = errlen;
    t->x.limit = LS_JINJA_MAX_MEMORY;
    if (s_parse(t, src ? src : "", src ? len : 0) < 0) {
        ls_jinja_destroy(&t);
        return NULL;
    }
    t->x.fail = NULL;
    t->x.err = NULL;
    return t;
}

void ls_jinja_destroy(ls_jinja_t **t_p) {
    if (!t_p || !*t_p)
        return;
    jx_free_all(&(*t_p)->x);
    free(*t_p);
    *t_p = NULL;
}

// The render proper; setjmp lives here so that nothing it returns to is a local of this frame.
static int s_run(jx_t *x, const ls_jinja_t *t, const json_t *vars, int64_t now_s, ls_buf_t *out) {
    jmp_buf fail;
    x->fail = &fail;
    if (setjmp(fail))
        return -1;
    jrun_t r = {.x = x, .t = t, .now_s = now_s};
    r.globals = s_scope_new(&r, NULL);
    if (vars && json_is_object(vars)) {
        const char *k;
        size_t kn;
        json_t *v;
        void *tmp;
        json_object_keylen_foreach_safe((json_t *)vars, tmp, k, kn, v) {
            s_scope_set(&r, r.globals, jx_strdup(x, k, kn), kn, jv_from_json(x, v));
        }
    }
    if (s_exec_block(&r, &t->body, r.globals, out) != S_NORMAL)
        jx_fail(x, UINT32_MAX, "break or continue outside a loop");
    return 0;
}

char *ls_jinja_render(const ls_jinja_t *t, const json_t *vars, int64_t now_s, size_t *len, char *err, size_t errlen) {
    jx_t x = {.limit = LS_JINJA_MAX_MEMORY, .err = err, .errlen = errlen, .src = t->x.src, .map = t->x.map,
              .map_n = t->x.map_n};
    ls_buf_t out = {0};
    char *text = NULL;
    if (s_run(&x, t, vars, now_s, &out) == 0) {
        if ((text = malloc(out.n + 1))) {
            if (out.n)
                memcpy(text, out.s, out.n);
            text[out.n] = 0;
            if (len)
                *len = out.n;
        } else {
            ls_err_set(err, errlen, "out of memory");
        }
    }
    jx_free_all(&x);
    return text;
}
