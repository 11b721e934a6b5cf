/*  fuzz_grammar.c — libFuzzer target for structured output's compilers (text/grammar.h).

    The first byte picks the source kind (even: a regex, odd: a JSON schema); the rest is the
    source. Any source may be refused, with a reason. A grammar that compiles must walk the
    input's own bytes, agree with ls_grammar_matches, and give a token mask for the states it
    passes through over a small vocabulary made from the input.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "grammar.h"

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    ls_grammar_src_t kind = data [0] & 1 ? LS_GRAMMAR_SRC_JSON_SCHEMA : LS_GRAMMAR_SRC_REGEX;
    const char *src = (const char *) data + 1;
    size_t len = size - 1;
    char err [512] = "";
    ls_grammar_t *g = ls_grammar_compile_kind (kind, src, len, err, sizeof err);
    if (!g) {
        if (!err [0])
            s_die ("refused without a reason");
        return 0;
    }
    // a vocabulary of the input's 1..4-byte slices
    enum { V = 64 };
    const char *toks [V];
    uint32_t lens [V];
    for (int v = 0; v < V; v++) {
        size_t at = len ? (size_t) v * 7 % len : 0;
        toks [v] = src + at;
        lens [v] = (uint32_t) (len - at < (size_t) (v % 4 + 1) ? len - at : (size_t) (v % 4 + 1));
    }
    ls_token_masker_t *m = ls_token_masker_new (V, toks, lens, 4096);
    int state = ls_grammar_start (g);
    for (size_t i = 0; i < len && state >= 0; i++) {
        if (m && !ls_token_masker_mask (m, g, state))
            s_die ("no mask for a live state");
        state = ls_grammar_step (g, state, (uint8_t) src [i]);
    }
    if (ls_grammar_accepting (g, state) != ls_grammar_matches (g, src, len))
        s_die ("walk and match disagree");
    if (m)
        ls_token_masker_detach (m, g);
    ls_token_masker_destroy (&m);
    ls_grammar_destroy (&g);
    return 0;
}
