/*  fuzz_gen_parse.c — libFuzzer target for JSON → message conversion: OpenAI completions and
    chat completions and SGLang /generate bodies (gw_gen_parse, actors/gateway/api.c) into
    GenerateReq messages. The first byte picks the API; the rest is the body.

    A body is accepted (every message it gives encodes and decodes back equal, text lengths
    kept) or refused with a reason.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "api.h"

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const gw_api_t apis [] = { GW_COMPLETIONS, GW_CHAT, GW_GENERATE };
    gw_gen_t g;
    char err [256] = "";
    const char *param;
    if (gw_gen_parse (&g, apis [data [0] % 3], (const char *) data + 1, size - 1, "demo", err, sizeof err,
                      &param) < 0) {
        if (!err [0])
            s_die ("refused without a reason");
        gw_gen_clear (&g);
        return 0;
    }
    for (size_t i = 0; i < g.nreqs; i++) {
        char *buf;
        size_t len;
        ls_msg_t back;
        if (ls_msg_encode (&g.reqs [i], &buf, &len) != 0)
            continue;       // larger than a message may be: the gateway answers 400 for it
        if (ls_msg_decode (buf, len, &back, NULL) != 0 || !ls_msg_equal (&g.reqs [i], &back))
            s_die ("a parsed request does not survive the codec");
        ls_msg_clear (&back);
        free (buf);
    }
    gw_gen_clear (&g);
    return 0;
}
