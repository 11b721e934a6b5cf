/*  fuzz_gen_parse.c — libFuzzer target for JSON → message conversion: OpenAI completions and
    chat completions and SGLang /generate bodies (gw_gen_parse, actors/gateway/api_req.c) into
    GenerateReq messages, and vLLM's /tokenize and /detokenize bodies (gw_tokenize_parse) into a
    TokenizeReq. The first byte picks the API; the rest is the body.

    A body is accepted (every message it gives encodes and decodes back equal, text lengths
    kept) or refused with a reason.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "api.h"

// A message parsed from a body must survive the codec (one larger than a message may be is
// answered 400 by the gateway).
static void
s_round_trip (const ls_msg_t *m)
{
    char *buf;
    size_t len;
    ls_msg_t back;
    if (ls_msg_encode (m, &buf, &len) != 0)
        return;
    if (ls_msg_decode (buf, len, &back, NULL) != 0 || !ls_msg_equal (m, &back))
        s_die ("a parsed request does not survive the codec");
    ls_msg_clear (&back);
    free (buf);
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const gw_api_t apis [] = { GW_COMPLETIONS, GW_CHAT, GW_GENERATE, GW_TOKENIZE, GW_TOKENIZE };
    gw_api_t api = apis [data [0] % 5];
    char err [256] = "";
    const char *param;
    if (api == GW_TOKENIZE) {
        ls_msg_t m;
        const char *code;
        char *model;
        if (gw_tokenize_parse (&m, data [0] % 5 == 4, (const char *) data + 1, size - 1, "demo", &model, err,
                               sizeof err, &param, &code) < 0) {
            if (!err [0])
                s_die ("refused without a reason");
            return 0;
        }
        s_round_trip (&m);
        ls_msg_clear (&m);
        free (model);
        return 0;
    }
    gw_gen_t g;
    if (gw_gen_parse (&g, api, (const char *) data + 1, size - 1, "demo", err, sizeof err,
                      &param) < 0) {
        if (!err [0])
            s_die ("refused without a reason");
        gw_gen_clear (&g);
        return 0;
    }
    for (size_t i = 0; i < g.nreqs; i++)
        s_round_trip (&g.reqs [i]);
    gw_gen_clear (&g);
    return 0;
}
