// grammar_internal — the DFA's layout, shared by grammar.c (construction) and
// grammar_mask.c (the walks behind token masks).
#ifndef LS_GRAMMAR_INTERNAL_H
#define LS_GRAMMAR_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"
#include "text_utf8.h"

struct ls_grammar {
    int n_states, n_cls;
    int cls[256];        // byte -> its class (column)
    int *trans;          // (n_states, n_cls): next state, or -1
    uint8_t *accept;     // (n_states)
    uint8_t *final;      // (n_states): accepting with no way on
    // the token masker's cache of this grammar (grammar_mask.c): per state, its LRU entry
    struct s_mask_entry **masks;
};

// ls_grammar_compile without the bound on the source's length (for regexes made from a schema,
// whose sources were bounded instead).
ls_grammar_t *ls_grammar_compile_unbounded(const char *regex, size_t len, char *err, size_t errlen);

#endif
