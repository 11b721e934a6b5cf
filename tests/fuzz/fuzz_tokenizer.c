/*  fuzz_tokenizer.c — libFuzzer target for tokenizer.json loading (ls_tokenizer_parse).

    Any input may be refused, with a reason. A tokenizer that loads must encode a fixed text
    (with and without special tokens), decode what it gave, and stream the same ids through
    the incremental detokenizer with a stop string, without a sanitizer finding.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer.h"

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    char err [512] = "";
    ls_tokenizer_t *t = ls_tokenizer_parse ((const char *) data, size, "fuzz", err, sizeof err);
    if (!t) {
        if (!err [0])
            s_die ("refused without a reason");
        return 0;
    }
    static const char text [] = "Hello wörld 123 <s> \0 \xff\xfe tab\tend";
    static const char *const stops [] = { "ld", "\xe2" };
    for (unsigned flags = 0; flags <= LS_TOKENIZE_ADD_SPECIAL; flags += LS_TOKENIZE_ADD_SPECIAL) {
        ls_token_ids_t ids = { 0 };
        if (ls_tokenizer_encode (t, text, sizeof text - 1, flags, &ids, err, sizeof err) == 0) {
            size_t len;
            free (ls_tokenizer_decode (t, ids.ids, ids.n, 0, &len, err, sizeof err));
            free (ls_tokenizer_decode (t, ids.ids, ids.n, LS_DETOK_SKIP_SPECIAL, &len, err, sizeof err));
            ls_detok_t *d = ls_detok_new (t, 0, stops, NULL, 2);
            const char *piece;
            for (size_t i = 0; d && i < ids.n; i++)
                ls_detok_push (d, ids.ids [i], &piece, &len);
            if (d)
                ls_detok_finish (d, &piece, &len);
            ls_detok_destroy (&d);
        }
        ls_token_ids_free (&ids);
    }
    //  every id of a small vocabulary, and a few outside it
    int32_t vocab = ls_tokenizer_vocab_size (t), some [64];
    size_t n = 0;
    for (int32_t id = -2; id < vocab + 2 && n < 64; id++)
        some [n++] = id;
    size_t len;
    free (ls_tokenizer_decode (t, some, n, 0, &len, err, sizeof err));
    ls_tokenizer_destroy (&t);
    return 0;
}
