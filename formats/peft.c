// PEFT LoRA adapter loading. See peft.h for the matching rules and what is refused.
#include "peft.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "added_vocab.h"
#include "ls_err.h"
#include "ls_file.h"
#include "ls_par.h"
#include "safetensors.h"

// --- small growable string -------------------------------------------------------------------

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} s_str_t;

static void s_put(s_str_t *s, const char *txt, size_t n)
{
    if (s->oom)
        return;
    if (s->len + n + 1 > s->cap) {
        size_t cap = (s->len + n + 1) * 2;
        char *p = realloc(s->p, cap);
        if (!p) {
            s->oom = true;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->len, txt, n);
    s->len += n;
    s->p[s->len] = '\0';
}

static void s_puts(s_str_t *s, const char *txt)
{
    s_put(s, txt, strlen(txt));
}

// --- Python regex -> POSIX ERE ---------------------------------------------------------------

// Adds the members of a Python class escape (\d \w \s and their negations) to set.
static bool s_class_escape(char c, bool set[256])
{
    bool neg = isupper((unsigned char)c);
    int (*is)(int);
    switch (tolower((unsigned char)c)) {
    case 'd': is = isdigit; break;
    case 's': is = isspace; break;
    case 'w': is = isalnum; break;
    default: return false;
    }
    for (int b = 1; b < 256; b++) {
        bool in = b < 128 && (is(b) || (tolower((unsigned char)c) == 'w' && b == '_'));
        if (in != neg)
            set[b] = true;
    }
    return true;
}

// Emits one literal byte so that ERE reads it literally.
static void s_ere_literal(s_str_t *o, unsigned char c)
{
    char buf[4];
    if (c == '{' || c == '}') {
        snprintf(buf, sizeof buf, "[%c]", c);  // braces are interval syntax in ERE
    } else if (strchr(".[]()*+?|^$\\", c)) {
        buf[0] = '\\';
        buf[1] = (char)c;
        buf[2] = '\0';
    } else {
        buf[0] = (char)c;
        buf[1] = '\0';
    }
    s_puts(o, buf);
}

// Parses a Python bracket expression starting after '[' at *pp; emits an equivalent POSIX one
// built from the explicit member set (so escapes and ranges need no translation rules).
static int s_bracket(const char **pp, s_str_t *o, const char **why)
{
    const char *p = *pp;
    bool set[256] = {false};
    bool neg = *p == '^';
    if (neg)
        p++;
    bool first = true;
    for (;;) {
        if (*p == '\0') {
            *why = "an unterminated [ ]";
            return -1;
        }
        if (*p == ']' && !first)
            break;
        first = false;
        int lo;
        if (*p == '\\') {
            p++;
            if (s_class_escape(*p, set)) {
                p++;
                continue;
            }
            if (!ispunct((unsigned char)*p) && *p != ' ') {
                *why = "an escape inside [ ] other than \\d \\w \\s or punctuation";
                return -1;
            }
        }
        lo = (unsigned char)*p++;
        int hi = lo;
        if (p[0] == '-' && p[1] != ']' && p[1] != '\0') {
            p++;
            if (*p == '\\') {
                p++;
                if (!ispunct((unsigned char)*p)) {
                    *why = "a range ending in an escape other than punctuation";
                    return -1;
                }
            }
            hi = (unsigned char)*p++;
            if (hi < lo) {
                *why = "a reversed range inside [ ]";
                return -1;
            }
        }
        for (int b = lo; b <= hi; b++)
            set[b] = true;
    }
    *pp = p + 1;
    int n = 0, only = 0;
    for (int b = 1; b < 256; b++)
        if (set[b]) {
            n++;
            only = b;
        }
    if (n == 0) {
        *why = "an empty [ ]";
        return -1;
    }
    if (n == 1 && !neg) {
        s_ere_literal(o, (unsigned char)only);
        return 0;
    }
    // POSIX bracket rules: ']' must come first, '-' last, '^' anywhere but first.
    s_puts(o, neg ? "[^" : "[");
    if (set[']'])
        s_puts(o, "]");
    bool any = set[']'];
    for (int b = 1; b < 256; b++) {
        if (!set[b] || b == ']' || b == '^' || b == '-')
            continue;
        char c = (char)b;
        s_put(o, &c, 1);
        any = true;
    }
    if (set['^'] && set['-'] && !any) {
        s_puts(o, "-^]");
        return 0;
    }
    if (set['^'])
        s_puts(o, "^");
    if (set['-'])
        s_puts(o, "-");
    s_puts(o, "]");
    return 0;
}

// glibc's regcomp copies a repeated subexpression once per repeat ("x{3}" is "xxx", "x+" is
// "xx*"), so nested or stacked repeats grow its tree exponentially: "m+++...+" or
// "((x{200}){200}){200}" in an adapter_config.json would exhaust the registry's memory. Module
// names are short, and no real target pattern comes near these bounds.
#define S_RE_MAX_LEN 1024        // characters of one pattern
#define S_RE_MAX_DEPTH 8         // nested groups
#define S_RE_MAX_COPIES 1024     // product of the {m,n} repeat bounds in a pattern

// Translates Python regex py into POSIX ERE appended to o; *why explains a refusal.
static int s_pyre_to_ere(const char *py, s_str_t *o, const char **why)
{
    const char *p = py;
    int depth = 0;
    bool after_repeat = false;  // the last item was a quantifier
    unsigned long copies = 1;
    if (strlen(py) > S_RE_MAX_LEN) {
        *why = "a pattern longer than 1024 characters";
        return -1;
    }
    while (*p) {
        char c = *p;
        bool repeat = c == '*' || c == '+' || c == '?' || c == '{';
        if (repeat && after_repeat && (c != '{' || isdigit((unsigned char)p[1]) || p[1] == ',')) {
            *why = "a repeat of a repeat (Python's \"multiple repeat\"; possessive quantifiers are not "
                   "supported)";
            return -1;
        }
        after_repeat = false;
        if (c == '\\') {
            char e = p[1];
            bool set[256] = {false};
            if (e == '\0') {
                *why = "a trailing backslash";
                return -1;
            }
            if (s_class_escape(e, set)) {
                const char *cls = e == 'd' ? "[0-9]" : e == 'D' ? "[^0-9]"
                                : e == 'w' ? "[[:alnum:]_]" : e == 'W' ? "[^[:alnum:]_]"
                                : e == 's' ? "[[:space:]]" : "[^[:space:]]";
                s_puts(o, cls);
            } else if (ispunct((unsigned char)e) || e == ' ') {
                s_ere_literal(o, (unsigned char)e);
            } else {
                *why = "an escape other than \\d \\w \\s (and negations) or punctuation "
                       "(anchors, backreferences and \\b are not supported)";
                return -1;
            }
            p += 2;
        } else if (c == '[') {
            p++;
            if (s_bracket(&p, o, why) != 0)
                return -1;
        } else if (c == '(') {
            if (p[1] == '?') {
                if (p[2] != ':') {
                    *why = "a (?...) group other than (?:...) (lookarounds and inline flags are "
                           "not supported)";
                    return -1;
                }
                p += 3;
            } else {
                p++;
            }
            if (++depth > S_RE_MAX_DEPTH) {
                *why = "groups nested more than 8 deep";
                return -1;
            }
            s_puts(o, "(");
        } else if (c == ')') {
            depth -= depth > 0;
            s_put(o, p, 1);
            p++;
        } else if (c == '*' || c == '+' || c == '?') {
            s_put(o, p, 1);
            p++;
            if (*p == '?')  // lazy: same language, so the same whole-name answer
                p++;
            after_repeat = true;
        } else if (c == '{') {
            // Python reads {m}, {m,}, {,n}, {m,n} as a repeat and any other '{' as a literal.
            const char *q = p + 1;
            const char *lo = q;
            while (isdigit((unsigned char)*q))
                q++;
            size_t nlo = (size_t)(q - lo);
            const char *hi = NULL;
            size_t nhi = 0;
            bool comma = *q == ',';
            if (comma) {
                hi = ++q;
                while (isdigit((unsigned char)*q))
                    q++;
                nhi = (size_t)(q - hi);
            }
            if (*q != '}' || p[1] == '}') {
                s_ere_literal(o, '{');
                p++;
                continue;
            }
            unsigned long bound = nhi ? strtoul(hi, NULL, 10) : nlo ? strtoul(lo, NULL, 10) : 1;
            if (nlo > 4 || nhi > 4 || (copies *= bound ? bound : 1) > S_RE_MAX_COPIES) {
                *why = "repeat counts whose product is above 1024";
                return -1;
            }
            s_puts(o, "{");
            if (nlo)
                s_put(o, lo, nlo);
            else
                s_puts(o, "0");
            if (comma) {
                s_puts(o, ",");
                s_put(o, hi, nhi);
            }
            s_puts(o, "}");
            p = q + 1;
            if (*p == '?')
                p++;
            after_repeat = true;
        } else if (c == '}') {
            s_ere_literal(o, '}');
            p++;
        } else {
            s_put(o, p, 1);
            p++;
        }
    }
    return 0;
}

// Compiles py anchored as ^(prefix)(py)$ where prefix is "" (fullmatch) or "(.*\.)?" (PEFT's
// rank/alpha pattern form).
static int s_regex_compile(regex_t *re, const char *py, bool pattern_key, const char **why)
{
    s_str_t o = {0};
    s_puts(&o, pattern_key ? "^(.*\\.)?(" : "^(");
    int rc = s_pyre_to_ere(py, &o, why);
    s_puts(&o, ")$");
    if (rc == 0 && o.oom) {
        *why = "out of memory";
        rc = -1;
    }
    if (rc == 0 && regcomp(re, o.p, REG_EXTENDED | REG_NOSUB) != 0) {
        *why = "an invalid regular expression";
        rc = -1;
    }
    free(o.p);
    return rc;
}

static bool s_regex_match(const regex_t *re, const char *s)
{
    return regexec(re, s, 0, NULL, 0) == 0;
}

// --- the base model's module names -----------------------------------------------------------

// Every module PEFT would see in model.named_modules() of the base model; target is the LoRA
// target or -1 for modules we cannot adapt (norms, containers, rotary embeddings).
typedef struct {
    char name[80];
    int layer;
    int target;
} s_module_t;

static int s_modules(const ls_model_config_t *cfg, s_module_t **out, size_t *n)
{
    static const char *const globals[] = {"", "model", "model.embed_tokens", "model.layers",
                                          "model.norm", "model.rotary_emb", "lm_head"};
    static const char *const per_layer[] = {"", ".self_attn", ".mlp", ".mlp.act_fn",
                                            ".input_layernorm", ".post_attention_layernorm",
                                            ".self_attn.q_norm", ".self_attn.k_norm"};
    size_t nper_other = cfg->qk_norm ? 8 : 6;
    size_t ng = sizeof globals / sizeof *globals;
    size_t cap = ng + (size_t)cfg->num_hidden_layers * (nper_other + LS_TARGET_COUNT);
    s_module_t *m = calloc(cap, sizeof *m);
    if (!m)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < ng; i++) {
        snprintf(m[k].name, sizeof m[k].name, "%s", globals[i]);
        m[k].layer = -1;
        m[k++].target = !strcmp(globals[i], "model.embed_tokens") ? LS_TARGET_EMBED
                        : !strcmp(globals[i], "lm_head")          ? LS_TARGET_LM_HEAD
                                                                  : -1;
    }
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        for (size_t i = 0; i < nper_other; i++) {
            snprintf(m[k].name, sizeof m[k].name, "model.layers.%d%s", l, per_layer[i]);
            m[k].layer = l;
            m[k++].target = -1;
        }
        for (int t = 0; t < LS_TARGET_COUNT; t++) {
            snprintf(m[k].name, sizeof m[k].name, "model.layers.%d.%s.%s", l,
                     ls_target_parent((ls_target_t)t), ls_target_name((ls_target_t)t));
            m[k].layer = l;
            m[k++].target = t;
        }
    }
    *out = m;
    *n = k;
    return 0;
}

// --- adapter_config.json ---------------------------------------------------------------------

// A module selector: target_modules or exclude_modules.
typedef struct {
    const cJSON *list;  // list form, or NULL
    bool is_regex;
    bool all_linear;
    regex_t re;
} s_selector_t;

typedef struct {
    int rank;
    float scaling;
} s_plan_entry_t;

// The resolved per-module rank and scaling; rank 0 = not targeted.
typedef struct {
    int nl;
    s_plan_entry_t *e;  // e[s_mod_index(nl, layer, target)]
    ls_adapter_info_t info;
    // trainable tokens of the embedding ([0]) and lm_head ([1]): their ids, and whether the
    // rows come in a tensor of their own (else lm_head's are the embedding's: tied); with added
    // vocabulary, the ids listed first (tok_listed of them, their rows in that tensor), then
    // the added ids not listed (their rows from new_embeddings.safetensors or the resized
    // matrix)
    int32_t *tok_ids[2];
    int tok_n[2], tok_listed[2];
    bool tok_own[2];
    bool tok_tied;            // lm_head's ids and rows are the embedding's
    ls_added_vocab_t added;   // the tokenizer's tokens past vocab_size
    bool new_emb;             // new_embeddings.safetensors is there
} s_plan_t;

// Modules are indexed layer by layer, target by target, then the global targets (embedding,
// lm_head; layer ignored).
static size_t s_mod_index(int nl, int layer, int t)
{
    return t < LS_TARGET_COUNT ? (size_t)layer * LS_TARGET_COUNT + (size_t)t
                               : (size_t)nl * LS_TARGET_COUNT + (size_t)(t - LS_TARGET_COUNT);
}

static size_t s_mod_count(int nl)
{
    return s_mod_index(nl, 0, LS_TARGET_ALL);
}

// PEFT's list rule: the module name equals the entry or ends with "." + entry.
static bool s_entry_match(const char *entry, const char *key)
{
    size_t kl = strlen(key), tl = strlen(entry);
    return strcmp(key, entry) == 0 ||
           (kl > tl && key[kl - tl - 1] == '.' && strcmp(key + kl - tl, entry) == 0);
}

static bool s_list_match(const cJSON *list, const char *key)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, list) {
        if (s_entry_match(it->valuestring, key))
            return true;
    }
    return false;
}

static bool s_selector_match(const s_selector_t *s, const s_module_t *m)
{
    if (s->all_linear)  // every linear layer but the output layer: no embedding, no lm_head
        return m->target >= 0 && m->target < LS_TARGET_COUNT;
    if (s->is_regex)
        return s_regex_match(&s->re, m->name);
    return s->list && s_list_match(s->list, m->name);
}

static void s_selector_free(s_selector_t *s)
{
    if (s->is_regex)
        regfree(&s->re);
    s->is_regex = false;
}

// Reads target_modules / exclude_modules: null, a list of strings, or a regex string.
static int s_selector_parse(const char *file, const cJSON *j, const char *key, bool allow_all,
                            s_selector_t *s, char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    if (!j || cJSON_IsNull(j))
        return 0;
    if (cJSON_IsString(j)) {
        if (allow_all && strcasecmp(j->valuestring, "all-linear") == 0) {
            s->all_linear = true;
            return 0;
        }
        const char *why = NULL;
        if (s_regex_compile(&s->re, j->valuestring, false, &why) != 0) {
            ls_err_set(err, errlen, "%s: \"%s\" regex \"%s\" uses %s", file, key, j->valuestring,
                  why);
            return -1;
        }
        s->is_regex = true;
        return 0;
    }
    if (cJSON_IsArray(j)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (!cJSON_IsString(it)) {
                ls_err_set(err, errlen, "%s: \"%s\" must be a list of module names or a regex", file,
                      key);
                return -1;
            }
        }
        s->list = j;
        return 0;
    }
    ls_err_set(err, errlen, "%s: \"%s\" must be a list of module names or a regex", file, key);
    return -1;
}

// A compiled rank_pattern / alpha_pattern, in file order.
typedef struct {
    int n;
    regex_t *re;
    const cJSON **val;
} s_patterns_t;

static void s_patterns_free(s_patterns_t *p)
{
    for (int i = 0; i < p->n; i++)
        regfree(&p->re[i]);
    free(p->re);
    free(p->val);
    memset(p, 0, sizeof *p);
}

static int s_patterns_parse(const char *file, const cJSON *j, const char *key, bool is_rank,
                            s_patterns_t *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!j || cJSON_IsNull(j))
        return 0;
    if (!cJSON_IsObject(j)) {
        ls_err_set(err, errlen, "%s: \"%s\" must be an object", file, key);
        return -1;
    }
    int n = cJSON_GetArraySize(j);
    p->re = calloc((size_t)n + 1, sizeof *p->re);
    p->val = calloc((size_t)n + 1, sizeof *p->val);
    if (!p->re || !p->val) {
        ls_err_set(err, errlen, "%s: out of memory", file);
        s_patterns_free(p);
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        double v = it->valuedouble;
        bool ok = cJSON_IsNumber(it) && isfinite(v) &&
                  (!is_rank || (v >= 1 && v == floor(v) && v <= 1e6));
        if (!ok) {
            ls_err_set(err, errlen, "%s: \"%s\" key \"%s\" must map to %s", file, key, it->string,
                  is_rank ? "a positive integer rank" : "a finite number");
            s_patterns_free(p);
            return -1;
        }
        const char *why = NULL;
        if (s_regex_compile(&p->re[p->n], it->string, true, &why) != 0) {
            ls_err_set(err, errlen, "%s: \"%s\" key \"%s\" uses %s", file, key, it->string, why);
            s_patterns_free(p);
            return -1;
        }
        p->val[p->n++] = it;
    }
    return 0;
}

// PEFT's get_pattern_key: the first key whose regex matches, else the default.
static double s_pattern_value(const s_patterns_t *p, const char *module, double def)
{
    for (int i = 0; i < p->n; i++)
        if (s_regex_match(&p->re[i], module))
            return p->val[i]->valuedouble;
    return def;
}

static bool s_exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

// Checks the files next to the config: the weights must be a safetensors file that ls_file
// would open (so a link or a FIFO is refused here, before a load is dispatched); reads the
// added vocabulary (added_vocab.h) into the plan.
static int s_check_files(const char *dir, const ls_model_config_t *cfg, s_plan_t *plan, char *err,
                         size_t errlen)
{
    uint64_t size;
    int fd = ls_file_open(dir, "adapter_model.safetensors", LS_FILE_SAFETENSORS, &size, err, errlen);
    if (fd < 0 && errno == ENOENT) {
        if (s_exists(dir, "adapter_model.bin"))
            ls_err_set(err, errlen,
                  "%s/adapter_model.bin: pickled .bin adapters are not loaded; convert to "
                  "safetensors",
                  dir);
        else
            ls_err_set(err, errlen, "%s/adapter_model.safetensors: file is missing", dir);
    }
    if (fd < 0)
        return -1;
    close(fd);
    if (ls_added_vocab_read(dir, cfg->vocab_size, &plan->added, err, errlen) != 0)
        return -1;
    plan->new_emb = s_exists(dir, "new_embeddings.safetensors");
    if (plan->new_emb && plan->added.n == 0) {
        ls_err_set(err, errlen, "%s/new_embeddings.safetensors: no tokenizer.json or "
                   "added_tokens.json beside it adds tokens past the base vocab_size %d, so its "
                   "rows belong to no token", dir, cfg->vocab_size);
        return -1;
    }
    return 0;
}

// Keys that change what the adapter computes in ways we do not implement: each must be absent,
// null, false, or an empty list/object.
static int s_check_unsupported(const char *file, const cJSON *root, char *err, size_t errlen)
{
    static const struct {
        const char *key, *why;
    } keys[] = {
        {"use_dora", "DoRA adapters are not supported"},
        {"lora_bias", "LoRA bias terms are not supported"},
        {"fan_in_fan_out", "fan_in_fan_out (Conv1D-style weights) is not supported"},
        {"modules_to_save", "fully trained extra modules (modules_to_save) are not supported"},
        {"layers_to_transform", "layers_to_transform is not supported"},
        {"layer_replication", "layer_replication is not supported"},
        {"target_parameters", "LoRA on parameters (target_parameters) is not supported"},
        {"alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) is not supported"},
        {"use_qalora", "QA-LoRA is not supported"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, keys[i].key);
        bool unset = !j || cJSON_IsNull(j) || cJSON_IsFalse(j) ||
                     ((cJSON_IsArray(j) || cJSON_IsObject(j)) && cJSON_GetArraySize(j) == 0);
        if (!unset) {
            ls_err_set(err, errlen, "%s: \"%s\" is set: %s", file, keys[i].key, keys[i].why);
            return -1;
        }
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0) {
        ls_err_set(err, errlen, "%s: \"peft_type\" is %s%s%s; only LORA adapters are supported", file,
              cJSON_IsString(pt) ? "\"" : "", cJSON_IsString(pt) ? pt->valuestring : "missing",
              cJSON_IsString(pt) ? "\"" : "");
        return -1;
    }
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(root, "task_type");
    if (tt && !cJSON_IsNull(tt) &&
        !(cJSON_IsString(tt) && strcmp(tt->valuestring, "CAUSAL_LM") == 0)) {
        ls_err_set(err, errlen, "%s: \"task_type\" must be CAUSAL_LM (or null)", file);
        return -1;
    }
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (bias && !cJSON_IsNull(bias) &&
        !(cJSON_IsString(bias) && strcmp(bias->valuestring, "none") == 0)) {
        ls_err_set(err, errlen, "%s: \"bias\" is %s%s%s; only \"none\" is supported", file,
              cJSON_IsString(bias) ? "\"" : "", cJSON_IsString(bias) ? bias->valuestring : "set",
              cJSON_IsString(bias) ? "\"" : "");
        return -1;
    }
    return 0;
}

#define S_TARGETS "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, embed_tokens, lm_head"

// Validates target_modules against the base: each list entry must select something, and
// nothing selected may be a module without LoRA support (norms, containers ...).
static int s_check_targets(const char *file, const ls_model_config_t *cfg,
                           const s_selector_t *tgt, const s_selector_t *exc,
                           const s_module_t *mods, size_t nmods, char *err, size_t errlen)
{
    if (tgt->list) {
        const cJSON *it;
        cJSON_ArrayForEach(it, tgt->list) {
            bool found = false;
            for (size_t i = 0; i < nmods && !found; i++)
                found = s_entry_match(it->valuestring, mods[i].name);
            if (!found) {
                ls_err_set(err, errlen,
                      "%s: \"target_modules\" entry \"%s\" matches no module of %s (supported "
                      "targets: " S_TARGETS ")",
                      file, it->valuestring, ls_arch_name(cfg->arch));
                return -1;
            }
        }
    }
    int selected = 0;
    for (size_t i = 0; i < nmods; i++) {
        if (!s_selector_match(tgt, &mods[i]) || s_selector_match(exc, &mods[i]))
            continue;
        if (mods[i].target < 0) {
            ls_err_set(err, errlen,
                  "%s: \"target_modules\" selects module \"%s\", which is not a supported LoRA "
                  "target (" S_TARGETS ")",
                  file, mods[i].name);
            return -1;
        }
        selected++;
    }
    if (selected == 0) {
        ls_err_set(err, errlen, "%s: \"target_modules\" selects no module of %s", file,
              ls_arch_name(cfg->arch));
        return -1;
    }
    return 0;
}

static void s_plan_free(s_plan_t *p)
{
    free(p->e);
    p->e = NULL;
    if (p->tok_ids[1] != p->tok_ids[0])
        free(p->tok_ids[1]);
    free(p->tok_ids[0]);
    p->tok_ids[0] = p->tok_ids[1] = NULL;
    ls_added_vocab_free(&p->added);
}

// --- trainable tokens ------------------------------------------------------------------------

static int s_cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// Reads the token ids of one module (`module`: how the config names it) into *ids and *n.
static int s_token_ids(const char *file, const cJSON *j, const char *module,
                       const ls_model_config_t *cfg, int n_added, int32_t **ids, int *n, char *err,
                       size_t errlen)
{
    if (!cJSON_IsArray(j)) {
        ls_err_set(err, errlen, "%s: \"trainable_token_indices\"%s%s must be a list of token ids",
                   file, *module ? " entry " : "", module);
        return -1;
    }
    int cnt = cJSON_GetArraySize(j), k = 0;
    int32_t *v = malloc(((size_t)cnt + 1) * sizeof *v), *sorted = malloc(((size_t)cnt + 1) * sizeof *v);
    if (!v || !sorted) {
        free(v);
        free(sorted);
        ls_err_set(err, errlen, "%s: out of memory", file);
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        double d = it->valuedouble;
        if (!cJSON_IsNumber(it) || d < 0 || d != floor(d)) {
            ls_err_set(err, errlen, "%s: \"trainable_token_indices\"%s%s must hold non-negative "
                       "integer token ids", file, *module ? " entry " : "", module);
            goto fail;
        }
        if (d >= (double)cfg->vocab_size + n_added) {
            ls_err_set(err, errlen, "%s: \"trainable_token_indices\" lists token id %.0f, at or "
                       "past the base vocab_size %d and not one of the %d tokens the adapter's "
                       "tokenizer adds (added vocabulary: docs/adapters.md)", file, d,
                       cfg->vocab_size, n_added);
            goto fail;
        }
        v[k++] = (int32_t)d;
    }
    // PEFT writes the rows with index_copy, whose result for a repeated index is undefined
    memcpy(sorted, v, (size_t)k * sizeof *v);
    qsort(sorted, (size_t)k, sizeof *sorted, s_cmp_i32);
    for (int i = 1; i < k; i++)
        if (sorted[i] == sorted[i - 1]) {
            ls_err_set(err, errlen, "%s: \"trainable_token_indices\" lists token id %d twice",
                       file, (int)sorted[i]);
            goto fail;
        }
    free(sorted);
    *ids = v;
    *n = k;
    return 0;
fail:
    free(v);
    free(sorted);
    return -1;
}

// Which module a trainable_token_indices key names: 0 the embedding, 1 lm_head, -1 neither.
// PEFT wraps every module whose name ends with the key; only the two names and their dotted
// suffixes ("embed_tokens", "model.embed_tokens", "lm_head") name one of them and nothing else.
static int s_token_module(const char *key)
{
    return s_entry_match(key, "model.embed_tokens") ? 0 : s_entry_match(key, "lm_head") ? 1 : -1;
}

// Reads trainable_token_indices into the plan (ids, their count and where their rows come
// from) and refuses what PEFT cannot run: LoRA on a module that has trainable tokens.
static int s_tokens_plan(const char *file, const cJSON *root, const ls_model_config_t *cfg,
                         s_plan_t *plan, char *err, size_t errlen)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, "trainable_token_indices");
    if (!j || cJSON_IsNull(j))
        return 0;
    if (cJSON_IsArray(j)) {  // the input embedding
        if (s_token_ids(file, j, "", cfg, plan->added.n, &plan->tok_ids[0], &plan->tok_n[0], err,
                        errlen) != 0)
            return -1;
        plan->tok_own[0] = true;
    } else if (cJSON_IsObject(j)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            int m = s_token_module(it->string);
            if (m < 0 || plan->tok_own[m]) {
                ls_err_set(err, errlen, "%s: \"trainable_token_indices\" key \"%s\" %s", file,
                           it->string, m < 0 ? "names neither embedding of the model (embed_tokens, lm_head)"
                                             : "names a module another key names too");
                return -1;
            }
            if (s_token_ids(file, it, it->string, cfg, plan->added.n, &plan->tok_ids[m],
                            &plan->tok_n[m], err, errlen) != 0)
                return -1;
            plan->tok_own[m] = true;
        }
    } else {
        ls_err_set(err, errlen, "%s: \"trainable_token_indices\" must be a list of token ids or "
                   "an object of module name -> token ids", file);
        return -1;
    }
    if (cfg->tie_word_embeddings && !plan->tok_own[1]) {  // PEFT ties lm_head to the embedding's
        plan->tok_ids[1] = plan->tok_ids[0];
        plan->tok_n[1] = plan->tok_n[0];
    }
    for (int m = 0; m < 2; m++) {
        ls_target_t t = m ? LS_TARGET_LM_HEAD : LS_TARGET_EMBED;
        if (plan->tok_n[m] > 0 && plan->e[s_mod_index(plan->nl, 0, t)].rank > 0) {
            ls_err_set(err, errlen, "%s: trainable tokens%s and LoRA on %s in one adapter: PEFT "
                       "cannot run that (its trainable-tokens layer wraps the LoRA layer and takes "
                       "only a plain Embedding or Linear)", file,
                       m && !plan->tok_own[1] ? " (lm_head's, tied to the embedding's)" : "",
                       ls_target_name(t));
            return -1;
        }
        if (plan->tok_n[m] > plan->info.token_rows)
            plan->info.token_rows = plan->tok_n[m];
    }
    return 0;
}

// Added vocabulary (added_vocab.h): each module's ids grow by the added ids it does not list
// (their rows come from new_embeddings.safetensors or the resized matrix, s_added_rows), so
// every added id has a row of the embedding and of lm_head; lm_head tied to the embedding
// shares its ids. Refuses what cannot be served exactly: LoRA on the embedding or lm_head of a
// resized vocabulary (its A or B spans the added ids), and trainable tokens of lm_head of a
// tied model beside added ids (the rows of the ids lm_head does not list would be the tied
// embedding's rows before its own trainable tokens, another layout).
static int s_added_plan(const char *file, const ls_model_config_t *cfg, s_plan_t *plan, char *err,
                        size_t errlen)
{
    plan->tok_tied = cfg->tie_word_embeddings && !plan->tok_own[1];
    for (int m = 0; m < 2; m++)
        plan->tok_listed[m] = plan->tok_own[m] ? plan->tok_n[m] : 0;
    int n_add = plan->added.n;
    if (n_add == 0)
        return 0;
    for (int m = 0; m < 2; m++) {
        ls_target_t t = m ? LS_TARGET_LM_HEAD : LS_TARGET_EMBED;
        if (plan->e[s_mod_index(plan->nl, 0, t)].rank > 0) {
            ls_err_set(err, errlen, "%s: LoRA on %s beside added vocabulary (%d tokens past the "
                       "base vocab_size %d) is not supported: its %s spans the resized vocabulary",
                       file, ls_target_name(t), n_add, cfg->vocab_size, m ? "B" : "A");
            return -1;
        }
    }
    if (cfg->tie_word_embeddings && plan->tok_own[1]) {
        ls_err_set(err, errlen, "%s: trainable tokens of lm_head on a model with tied embeddings "
                   "beside added vocabulary are not supported", file);
        return -1;
    }
    for (int m = 0; m < (plan->tok_tied ? 1 : 2); m++) {
        int listed = plan->tok_listed[m], n = listed;
        int32_t *ids = realloc(plan->tok_ids[m], ((size_t)listed + (size_t)n_add) * sizeof *ids);
        if (!ids) {
            ls_err_set(err, errlen, "%s: out of memory", file);
            return -1;
        }
        plan->tok_ids[m] = ids;
        for (int k = 0; k < n_add; k++) {
            int32_t id = cfg->vocab_size + k;
            bool in = false;
            for (int i = 0; i < listed && !in; i++)
                in = ids[i] == id;
            if (!in)
                ids[n++] = id;
        }
        plan->tok_n[m] = n;
    }
    if (plan->tok_tied) {
        plan->tok_ids[1] = plan->tok_ids[0];
        plan->tok_n[1] = plan->tok_n[0];
    }
    for (int m = 0; m < 2; m++)
        if (plan->tok_n[m] > plan->info.token_rows)
            plan->info.token_rows = plan->tok_n[m];
    plan->info.added_tokens = n_add;
    return 0;
}

// Reads and validates the config and resolves every module's rank and scaling.
static int s_plan(const char *dir, const ls_model_config_t *cfg, int max_lora_rank, s_plan_t *plan,
                  char *err, size_t errlen)
{
    memset(plan, 0, sizeof *plan);
    char file[4096];
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    size_t len;
    char *text = ls_file_read(dir, "adapter_config.json", LS_FILE_JSON, &len, err, errlen);
    if (!text)
        return -1;
    int rc = -1;
    s_module_t *mods = NULL;
    size_t nmods = 0;
    s_selector_t tgt = {0}, exc = {0};
    s_patterns_t rp = {0}, ap = {0};
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        ls_err_set(err, errlen, "%s: not a valid JSON object", file);
        goto out;
    }
    if (s_check_unsupported(file, root, err, errlen) != 0 ||
        s_check_files(dir, cfg, plan, err, errlen) != 0)
        goto out;
    const cJSON *jr = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *ja = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *jrs = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
    // PEFT's LoraConfig defaults: r=8, lora_alpha=8, use_rslora=false.
    double r = 8, alpha = 8;
    if (jr && (!cJSON_IsNumber(jr) || jr->valuedouble < 1 || jr->valuedouble > 1e6 ||
               jr->valuedouble != floor(jr->valuedouble))) {
        ls_err_set(err, errlen, "%s: \"r\" must be a positive integer", file);
        goto out;
    }
    if (jr)
        r = jr->valuedouble;
    if (ja && (!cJSON_IsNumber(ja) || !isfinite(ja->valuedouble))) {
        ls_err_set(err, errlen, "%s: \"lora_alpha\" must be a finite number", file);
        goto out;
    }
    if (ja)
        alpha = ja->valuedouble;
    if (jrs && !cJSON_IsBool(jrs) && !cJSON_IsNull(jrs)) {
        ls_err_set(err, errlen, "%s: \"use_rslora\" must be true or false", file);
        goto out;
    }
    bool rslora = cJSON_IsTrue(jrs);
    plan->info.alpha = (float)alpha;
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    if (s_selector_parse(file, jt, "target_modules", true, &tgt, err, errlen) != 0 ||
        s_selector_parse(file, cJSON_GetObjectItemCaseSensitive(root, "exclude_modules"),
                         "exclude_modules", false, &exc, err, errlen) != 0 ||
        s_patterns_parse(file, cJSON_GetObjectItemCaseSensitive(root, "rank_pattern"),
                         "rank_pattern", true, &rp, err, errlen) != 0 ||
        s_patterns_parse(file, cJSON_GetObjectItemCaseSensitive(root, "alpha_pattern"),
                         "alpha_pattern", false, &ap, err, errlen) != 0)
        goto out;
    if (!jt || cJSON_IsNull(jt)) {
        // PEFT's default for all four architectures (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING).
        cJSON *def = cJSON_CreateStringArray((const char *const[]){"q_proj", "v_proj"}, 2);
        if (!def || !cJSON_AddItemToObject(root, "target_modules", def)) {
            cJSON_Delete(def);
            ls_err_set(err, errlen, "%s: out of memory", file);
            goto out;
        }
        tgt.list = def;
    }
    if (s_modules(cfg, &mods, &nmods) != 0) {
        ls_err_set(err, errlen, "%s: out of memory", file);
        goto out;
    }
    if (s_check_targets(file, cfg, &tgt, &exc, mods, nmods, err, errlen) != 0)
        goto out;
    plan->nl = cfg->num_hidden_layers;
    plan->e = calloc(s_mod_count(plan->nl), sizeof *plan->e);
    if (!plan->e) {
        ls_err_set(err, errlen, "%s: out of memory", file);
        goto out;
    }
    for (size_t i = 0; i < nmods; i++) {
        const s_module_t *m = &mods[i];
        if (m->target < 0 || !s_selector_match(&tgt, m) || s_selector_match(&exc, m))
            continue;
        int mr = (int)s_pattern_value(&rp, m->name, r);
        double ma = s_pattern_value(&ap, m->name, alpha);
        if (mr > max_lora_rank) {
            ls_err_set(err, errlen, "%s: module \"%s\" has rank %d, above max_lora_rank %d", file,
                  m->name, mr, max_lora_rank);
            goto out;
        }
        s_plan_entry_t *e = &plan->e[s_mod_index(plan->nl, m->layer, m->target)];
        e->rank = mr;
        e->scaling = (float)(rslora ? ma / sqrt((double)mr) : ma / mr);
        plan->info.num_modules++;
        plan->info.target_mask |= 1u << m->target;
        if (mr > plan->info.max_rank)
            plan->info.max_rank = mr;
    }
    if (s_tokens_plan(file, root, cfg, plan, err, errlen) != 0 ||
        s_added_plan(file, cfg, plan, err, errlen) != 0)
        goto out;
    rc = 0;
out:
    if (rc != 0)
        s_plan_free(plan);
    s_patterns_free(&rp);
    s_patterns_free(&ap);
    s_selector_free(&tgt);
    s_selector_free(&exc);
    free(mods);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int ls_adapter_config_read(const char *dir, const ls_model_config_t *cfg, int max_lora_rank,
                           ls_adapter_info_t *info, char *err, size_t errlen)
{
    s_plan_t plan;
    if (s_plan(dir, cfg, max_lora_rank, &plan, err, errlen) != 0)
        return -1;
    if (info)
        *info = plan.info;
    s_plan_free(&plan);
    return 0;
}

// --- weights ---------------------------------------------------------------------------------

struct ls_adapter {
    int nl;
    ls_lora_weights_t *w;  // w[s_mod_index(nl, layer, target)]
    // trainable tokens of the embedding ([0]) and lm_head ([1]); lm_head's may be the
    // embedding's (tied: the same ids and rows, owned once)
    ls_token_rows_t tok[2];
    int32_t *tok_ids[2];
    float *tok_rows[2];    // the rows of a tensor of its own, NULL until read
    const ls_st_tensor_t *resized[2];  // the resized embedding / lm_head matrix, during a load
    ls_adapter_info_t info;
    size_t bytes;
};

void ls_adapter_destroy(ls_adapter_t **pa)
{
    if (!pa || !*pa)
        return;
    ls_adapter_t *a = *pa;
    for (size_t i = 0; a->w && i < s_mod_count(a->nl); i++) {
        free((float *)a->w[i].A);
        free((float *)a->w[i].B);
    }
    free(a->w);
    if (a->tok_ids[1] != a->tok_ids[0])
        free(a->tok_ids[1]);
    free(a->tok_ids[0]);
    free(a->tok_rows[0]);
    free(a->tok_rows[1]);
    free(a);
    *pa = NULL;
}

const ls_lora_weights_t *ls_adapter_layer_target(const ls_adapter_t *a, int layer,
                                                 ls_target_t t)
{
    assert(layer >= 0 && layer < a->nl && t >= 0 && t < LS_TARGET_COUNT);
    return &a->w[s_mod_index(a->nl, layer, t)];
}

const ls_lora_weights_t *ls_adapter_global_target(const ls_adapter_t *a, ls_target_t t)
{
    assert(t >= LS_TARGET_COUNT && t < LS_TARGET_ALL);
    return &a->w[s_mod_index(a->nl, 0, t)];
}

const ls_token_rows_t *ls_adapter_token_rows(const ls_adapter_t *a, ls_target_t t)
{
    assert(t == LS_TARGET_EMBED || t == LS_TARGET_LM_HEAD);
    return &a->tok[t == LS_TARGET_LM_HEAD];
}

ls_adapter_info_t ls_adapter_info(const ls_adapter_t *a)
{
    return a->info;
}

size_t ls_adapter_bytes(const ls_adapter_t *a)
{
    return a->bytes;
}

// Parses what follows a module name and ".": "{A|B}[.{adapter}]" + tail after `lora_` (or
// `lora_embedding_`), the adapter-name infix being how older PEFT and some tools save.
// which: 0 = A, 1 = B. Returns 0, or -1 for anything else.
static int s_parse_ab(const char *q, const char *prefix, const char *tail, int *which)
{
    size_t n = strlen(prefix);
    if (strncmp(q, prefix, n) != 0 || (q[n] != 'A' && q[n] != 'B'))
        return -1;
    *which = q[n] == 'B';
    q += n + 1;
    if (strcmp(q, tail) == 0)
        return 0;
    const char *dot = q[0] == '.' ? strchr(q + 1, '.') : NULL;
    if (*tail == '\0')  // ".{adapter}" to the end
        return q[0] == '.' && q[1] && !dot ? 0 : -1;
    return dot && dot != q + 1 && strcmp(dot, tail) == 0 ? 0 : -1;
}

// Which LoRA tensor a name is. Per-layer targets:
// "[base_model.model.]model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}[.{adapter}].weight";
// the embedding: "[base_model.model.]model.embed_tokens.lora_embedding_{A|B}[.{adapter}]"
// (PEFT's Embedding layer keeps them as parameters, not Linear weights); lm_head:
// "[base_model.model.]lm_head.lora_{A|B}[.{adapter}].weight". which: 0 = A, 1 = B, 2 = the
// "{module}.base_layer.weight" PEFT saves beside a targeted embed_tokens or lm_head (its
// save_embedding_layers="auto": a copy of the base weight), 3 = the trainable tokens' rows of
// either, "{module}.token_adapter.trainable_tokens_delta[.{adapter}]", 4 = the whole matrix of
// either, "{module}.weight" or "{module}.token_adapter.base_layer.weight" (what PEFT's
// save_embedding_layers="auto" saves of a resized vocabulary). Returns 0 with layer (-1 for
// the global targets), target and which, or -1 for any other name.
static int s_parse_name(const char *name, int nl, int *layer, int *target, int *which)
{
    const char *p = name;
    if (strncmp(p, "base_model.model.", 17) == 0)
        p += 17;
    static const struct {
        const char *module, *prefix, *tail;
        ls_target_t t;
    } globals[] = {
        {"model.embed_tokens.", "lora_embedding_", "", LS_TARGET_EMBED},
        {"lm_head.", "lora_", ".weight", LS_TARGET_LM_HEAD},
    };
    for (size_t g = 0; g < sizeof globals / sizeof *globals; g++) {
        size_t n = strlen(globals[g].module);
        if (strncmp(p, globals[g].module, n) != 0)
            continue;
        *layer = -1;
        *target = globals[g].t;
        if (strcmp(p + n, "base_layer.weight") == 0) {
            *which = 2;
            return 0;
        }
        if (strcmp(p + n, "weight") == 0 || strcmp(p + n, "token_adapter.base_layer.weight") == 0) {
            *which = 4;
            return 0;
        }
        static const char tok[] = "token_adapter.trainable_tokens_delta";
        const char *q = p + n + sizeof tok - 1;
        if (strncmp(p + n, tok, sizeof tok - 1) == 0 &&
            (*q == '\0' || (q[0] == '.' && q[1] && !strchr(q + 1, '.')))) {
            *which = 3;
            return 0;
        }
        return s_parse_ab(p + n, globals[g].prefix, globals[g].tail, which);
    }
    if (strncmp(p, "model.layers.", 13) != 0)
        return -1;
    p += 13;
    if (!isdigit((unsigned char)*p) || (p[0] == '0' && isdigit((unsigned char)p[1])))
        return -1;
    long l = 0;
    while (isdigit((unsigned char)*p) && l < nl)
        l = l * 10 + (*p++ - '0');
    if (*p++ != '.' || l >= nl)
        return -1;
    for (int t = 0; t < LS_TARGET_COUNT; t++) {
        char mod[48];
        int n = snprintf(mod, sizeof mod, "%s.%s.", ls_target_parent((ls_target_t)t),
                         ls_target_name((ls_target_t)t));
        if (strncmp(p, mod, (size_t)n) != 0)
            continue;
        *layer = (int)l;
        *target = t;
        return s_parse_ab(p + n, "lora_", ".weight", which);
    }
    return -1;
}

// Why a tensor that is not a plain LoRA A/B weight of a supported target is refused.
static const char *s_refusal(const char *name)
{
    if (strstr(name, "trainable_tokens"))
        return "a trainable tokens tensor other than the rows of embed_tokens or lm_head "
               "(….token_adapter.trainable_tokens_delta)";
    if (strstr(name, "embed_tokens") || strstr(name, "lm_head"))
        return "trained embed_tokens/lm_head weights (modules_to_save) are not supported; LoRA "
               "on them (lora_embedding_A/B, lora_A/B), trainable tokens and added vocabulary are";
    if (strstr(name, "lora_magnitude_vector"))
        return "DoRA magnitude vectors are not supported";
    if (strstr(name, ".lora_B.") && strstr(name, ".bias"))
        return "LoRA bias terms are not supported";
    return "not a LoRA A/B weight of a supported target (" S_TARGETS ") of the base model";
}

// The trainable tokens' rows of the embedding (m 0) or lm_head (m 1): shape-checked, and a
// buffer made for them (filled by s_convert).
static int s_load_token_rows(ls_adapter_t *a, const s_plan_t *plan, const ls_model_config_t *cfg,
                             const ls_st_tensor_t *t, int m, char *err, size_t errlen)
{
    if (!plan->tok_own[m]) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": adapter_config.json trainable_token_indices "
                   "lists no tokens for this module", t->file, t->name);
        return -1;
    }
    if (a->tok_rows[m]) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": the trainable tokens of this module are given "
                   "twice", t->file, t->name);
        return -1;
    }
    int64_t shape[2] = {plan->tok_listed[m], cfg->hidden_size};
    if (ls_st_tensor_check_shape(t, 2, shape, err, errlen) != 0) {
        size_t n = strlen(err);
        if (n < errlen)
            snprintf(err + n, errlen - n, " (%d token ids in trainable_token_indices, hidden_size "
                     "%d)", plan->tok_listed[m], cfg->hidden_size);
        return -1;
    }
    // room for the added ids the config does not list too (s_added_rows)
    size_t numel = (size_t)plan->tok_n[m] * (size_t)cfg->hidden_size;
    if (!(a->tok_rows[m] = malloc((numel ? numel : 1) * sizeof(float)))) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": out of memory", t->file, t->name);
        return -1;
    }
    a->bytes += numel * sizeof(float);
    return 0;
}

// The whole embedding or lm_head matrix (m 0 or 1) of a resized vocabulary: only its added
// rows are read (s_added_rows); its first vocab_size rows are the base model's own, since PEFT
// keeps the base layer frozen (a trained one would be modules_to_save, refused).
static int s_load_resized(ls_adapter_t *a, const s_plan_t *plan, const ls_model_config_t *cfg,
                          const ls_st_tensor_t *t, int m, char *err, size_t errlen)
{
    if (plan->added.n == 0) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": %s", t->file, t->name, s_refusal(t->name));
        return -1;
    }
    if (a->resized[m]) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": the resized %s is given twice", t->file,
                   t->name, m ? "lm_head" : "embedding");
        return -1;
    }
    int64_t shape[2] = {(int64_t)cfg->vocab_size + plan->added.n, cfg->hidden_size};
    if (ls_st_tensor_check_shape(t, 2, shape, err, errlen) != 0) {
        size_t n = strlen(err);
        if (n < errlen)
            snprintf(err + n, errlen - n, " (the resized vocabulary: vocab_size %d and the %d "
                     "tokens the adapter's tokenizer adds; a resize padded past them is not "
                     "supported)", cfg->vocab_size, plan->added.n);
        return -1;
    }
    a->resized[m] = t;
    return 0;
}

static int s_load_tensor(ls_adapter_t *a, const s_plan_t *plan, const ls_model_config_t *cfg,
                         const ls_st_tensor_t *t, char *err, size_t errlen)
{
    int layer, target, which;
    if (s_parse_name(t->name, cfg->num_hidden_layers, &layer, &target, &which) != 0) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": %s", t->file, t->name, s_refusal(t->name));
        return -1;
    }
    if (which == 3)
        return s_load_token_rows(a, plan, cfg, t, target == LS_TARGET_LM_HEAD, err, errlen);
    if (which == 4)
        return s_load_resized(a, plan, cfg, t, target == LS_TARGET_LM_HEAD, err, errlen);
    size_t m = s_mod_index(plan->nl, layer, target);
    const s_plan_entry_t *pe = &plan->e[m];
    if (pe->rank == 0) {
        ls_err_set(err, errlen,
              "%s: tensor \"%s\": adapter_config.json target_modules does not select this module",
              t->file, t->name);
        return -1;
    }
    int in, out;
    ls_model_config_target_dims(cfg, (ls_target_t)target, &in, &out);
    if (which == 2) {
        // PEFT's copy of the base weight: the served model's own is used, so only its shape
        // is checked (a resized vocabulary is added vocabulary)
        int64_t base[2] = {cfg->vocab_size, cfg->hidden_size};
        if (ls_st_tensor_check_shape(t, 2, base, err, errlen) != 0) {
            size_t n = strlen(err);
            if (n < errlen)
                snprintf(err + n, errlen - n, " (a copy of the base weight; LoRA on a resized "
                         "vocabulary is not supported)");
            return -1;
        }
        return 0;
    }
    ls_lora_weights_t *w = &a->w[m];
    if ((which ? w->B : w->A) != NULL) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": %s%c of this module is given twice", t->file,
              t->name, target == LS_TARGET_EMBED ? "lora_embedding_" : "lora_", which ? 'B' : 'A');
        return -1;
    }
    int64_t shape[2] = {which ? out : pe->rank, which ? pe->rank : in};  // A (r, in), B (out, r)
    if (ls_st_tensor_check_shape(t, 2, shape, err, errlen) != 0) {
        size_t n = strlen(err);
        if (n < errlen)
            snprintf(err + n, errlen - n, " (rank %d from adapter_config.json, %s dims %d -> %d)",
                     pe->rank, ls_target_name((ls_target_t)target), in, out);
        return -1;
    }
    float *buf = malloc(t->numel * sizeof(float));
    if (!buf) {
        ls_err_set(err, errlen, "%s: tensor \"%s\": out of memory", t->file, t->name);
        return -1;
    }
    if (which)
        w->B = buf;
    else
        w->A = buf;
    a->bytes += t->numel * sizeof(float);
    w->rank = pe->rank;
    w->scaling = pe->scaling;
    return 0;
}

// The conversion of every tensor (the bulk of a load: its values widened and checked), on
// several threads; tensor i goes to the buffer s_load_tensor made for it.
typedef struct {
    ls_adapter_t *a;
    const ls_st_t *st;
    const ls_model_config_t *cfg;
    _Atomic size_t bad;  // first tensor found holding NaN or infinities, or SIZE_MAX
} s_convert_t;

static void s_convert(void *arg, size_t i) {
    s_convert_t *c = arg;
    const ls_st_tensor_t *t = ls_st_at(c->st, i);
    int layer, target, which;
    if (s_parse_name(t->name, c->cfg->num_hidden_layers, &layer, &target, &which) != 0 ||
        which == 2 || which == 4)
        return;
    const ls_lora_weights_t *w = &c->a->w[s_mod_index(c->a->nl, layer, target)];
    float *dst = which == 3 ? c->a->tok_rows[target == LS_TARGET_LM_HEAD]
                            : (float *)(which ? w->B : w->A);
    if (ls_st_tensor_to_f32(t, dst) != 0) {
        size_t cur = atomic_load(&c->bad);
        while (i < cur && !atomic_compare_exchange_weak(&c->bad, &cur, i))
            ;
    }
}

// Row r of a 2-D tensor t into dst (hidden floats); -1 when it holds NaN or infinities.
static int s_row_f32(const ls_st_tensor_t *t, int64_t r, float *dst)
{
    ls_st_tensor_t row = *t;
    size_t cols = (size_t)t->shape[1], esize = ls_dtype_size(t->dtype);
    row.data = (const char *)t->data + (size_t)r * cols * esize;
    row.numel = cols;
    row.nbytes = cols * esize;
    row.ndim = 1;
    row.shape[0] = t->shape[1];
    return ls_st_tensor_to_f32(&row, dst);
}

// new_embeddings.safetensors (vLLM's legacy form of added vocabulary): "input_embeddings" and
// "output_embeddings", (n_added, hidden) each, row k for the id vocab_size + k; nothing else.
// A model with tied embeddings has no lm_head of its own, so output_embeddings is refused there.
static int s_new_embeddings(const s_plan_t *plan, const ls_model_config_t *cfg, const ls_st_t *st,
                            const ls_st_tensor_t *out[2], char *err, size_t errlen)
{
    static const char *names[2] = {"input_embeddings", "output_embeddings"};
    for (size_t i = 0; i < ls_st_count(st); i++) {
        const ls_st_tensor_t *t = ls_st_at(st, i);
        int m = strcmp(t->name, names[0]) == 0 ? 0 : strcmp(t->name, names[1]) == 0 ? 1 : -1;
        if (m < 0 || (m == 1 && cfg->tie_word_embeddings)) {
            ls_err_set(err, errlen, "%s: tensor \"%s\": %s", t->file, t->name,
                       m < 0 ? "not input_embeddings or output_embeddings"
                             : "the model ties lm_head to the embedding, so lm_head's rows of the "
                               "added tokens are input_embeddings");
            return -1;
        }
        int64_t shape[2] = {plan->added.n, cfg->hidden_size};
        if (ls_st_tensor_check_shape(t, 2, shape, err, errlen) != 0) {
            size_t n = strlen(err);
            if (n < errlen)
                snprintf(err + n, errlen - n, " (%d added tokens, hidden_size %d)", plan->added.n,
                         cfg->hidden_size);
            return -1;
        }
        out[m] = t;
    }
    return 0;
}

// The rows of the added ids a module does not list in trainable_token_indices (plan->tok_ids[m]
// past tok_listed[m]): from new_embeddings.safetensors, else from the resized matrix in
// adapter_model.safetensors; an id with neither is refused.
static int s_added_rows(ls_adapter_t *a, const s_plan_t *plan, const ls_model_config_t *cfg,
                        const char *dir, char *err, size_t errlen)
{
    if (plan->added.n == 0)
        return 0;
    ls_st_t *st = NULL;
    const ls_st_tensor_t *emb[2] = {NULL, NULL};
    char file[4096];
    snprintf(file, sizeof file, "%s/new_embeddings.safetensors", dir);
    if (plan->new_emb && (!(st = ls_st_open(file, err, errlen)) ||
                          s_new_embeddings(plan, cfg, st, emb, err, errlen) != 0)) {
        ls_st_destroy(&st);
        return -1;
    }
    size_t H = (size_t)cfg->hidden_size;
    int rc = 0;
    for (int m = 0; m < (plan->tok_tied ? 1 : 2) && rc == 0; m++) {
        int n = plan->tok_n[m];
        if (!a->tok_rows[m]) {  // no trainable tokens tensor made room for them
            if (!(a->tok_rows[m] = malloc((size_t)n * H * sizeof(float)))) {
                ls_err_set(err, errlen, "%s: out of memory", dir);
                rc = -1;
                break;
            }
            a->bytes += (size_t)n * H * sizeof(float);
        }
        for (int k = plan->tok_listed[m]; k < n && rc == 0; k++) {
            int32_t id = plan->tok_ids[m][k];
            const ls_added_token_t *tok = &plan->added.tokens[id - cfg->vocab_size];
            const ls_st_tensor_t *t = emb[m] ? emb[m] : a->resized[m];
            int64_t r = emb[m] ? id - cfg->vocab_size : id;
            if (!t) {
                ls_err_set(err, errlen, "%s: added token %d (\"%.64s\") has no %s row: list it "
                           "in trainable_token_indices, give new_embeddings.safetensors (%s) or "
                           "save the resized %s (PEFT's save_embedding_layers)", dir, (int)id,
                           tok->content, m ? "lm_head" : "embedding",
                           m ? "output_embeddings" : "input_embeddings",
                           m ? "lm_head.weight" : "embed_tokens.weight");
                rc = -1;
            } else if (s_row_f32(t, r, a->tok_rows[m] + (size_t)k * H) != 0) {
                ls_err_set(err, errlen, "%s: tensor \"%s\": holds NaN or infinite values",
                           t->file, t->name);
                rc = -1;
            }
        }
    }
    ls_st_destroy(&st);
    return rc;
}

ls_adapter_t *ls_adapter_load(const char *dir, const ls_model_config_t *cfg, int max_lora_rank,
                              char *err, size_t errlen)
{
    s_plan_t plan;
    if (s_plan(dir, cfg, max_lora_rank, &plan, err, errlen) != 0)
        return NULL;
    char file[4096];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    ls_st_t *st = ls_st_open(file, err, errlen);
    ls_adapter_t *a = st ? calloc(1, sizeof *a) : NULL;
    if (st && !a)
        ls_err_set(err, errlen, "%s: out of memory", file);
    if (!a)
        goto fail;
    a->nl = plan.nl;
    a->info = plan.info;
    a->w = calloc(s_mod_count(plan.nl), sizeof *a->w);
    if (!a->w) {
        ls_err_set(err, errlen, "%s: out of memory", file);
        goto fail;
    }
    for (size_t i = 0; i < ls_st_count(st); i++)
        if (s_load_tensor(a, &plan, cfg, ls_st_at(st, i), err, errlen) != 0)
            goto fail;
    s_convert_t conv = {.a = a, .st = st, .cfg = cfg};
    atomic_init(&conv.bad, SIZE_MAX);
    ls_par_for(ls_st_count(st), 0, s_convert, &conv);
    if (conv.bad != SIZE_MAX) {
        const ls_st_tensor_t *t = ls_st_at(st, conv.bad);
        ls_err_set(err, errlen, "%s: tensor \"%s\": holds NaN or infinite values", t->file, t->name);
        goto fail;
    }
    for (int l = 0; l < plan.nl; l++) {
        for (int t = 0; t < LS_TARGET_ALL; t++) {
            if (t >= LS_TARGET_COUNT && l > 0)
                break;  // the global targets: once
            size_t m = s_mod_index(plan.nl, l, t);
            const ls_lora_weights_t *w = &a->w[m];
            if (plan.e[m].rank == 0 || (w->A && w->B))
                continue;
            char mod[80];
            if (t < LS_TARGET_COUNT)
                snprintf(mod, sizeof mod, "model.layers.%d.%s.%s", l,
                         ls_target_parent((ls_target_t)t), ls_target_name((ls_target_t)t));
            else
                snprintf(mod, sizeof mod, "%s", t == LS_TARGET_EMBED ? "model.embed_tokens" : "lm_head");
            ls_err_set(err, errlen,
                  "%s: module \"%s\" is selected by target_modules but its %s%c weight is missing",
                  file, mod, t == LS_TARGET_EMBED ? "lora_embedding_" : "lora_", w->A ? 'B' : 'A');
            goto fail;
        }
    }
    for (int m = 0; m < 2; m++) {
        if (plan.tok_own[m] && plan.tok_listed[m] > 0 && !a->tok_rows[m]) {
            ls_err_set(err, errlen, "%s: trainable_token_indices lists %d token ids for %s but "
                       "tensor \"….%s.token_adapter.trainable_tokens_delta\" is missing", file,
                       plan.tok_listed[m], m ? "lm_head" : "embed_tokens",
                       m ? "lm_head" : "model.embed_tokens");
            goto fail;
        }
    }
    if (s_added_rows(a, &plan, cfg, dir, err, errlen) != 0)
        goto fail;
    for (int m = 0; m < 2; m++) {  // the ids move from the plan; lm_head tied to the
                                   // embedding shares its ids and rows
        a->tok_ids[m] = plan.tok_ids[m];
        a->tok[m] = (ls_token_rows_t){plan.tok_n[m], plan.tok_ids[m],
                                      plan.tok_tied && m ? a->tok_rows[0] : a->tok_rows[m]};
    }
    plan.tok_ids[0] = plan.tok_ids[1] = NULL;
    ls_st_destroy(&st);
    s_plan_free(&plan);
    return a;
fail:
    ls_adapter_destroy(&a);
    ls_st_destroy(&st);
    s_plan_free(&plan);
    return NULL;
}
