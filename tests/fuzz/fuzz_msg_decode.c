/*  fuzz_msg_decode.c — libFuzzer target for ls_msg_decode.

    Any input may be refused, but only with -1, an error code and a reason. An input
    that decodes must survive the printer and JSON, and re-encode to bytes that decode
    to an equal message and re-encode to the very same bytes.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cJSON.h>

#include "ls_msg.h"

static void
s_die (const char *what, const char *detail)
{
    fprintf (stderr, "fuzz_msg_decode: %s %s\n", what, detail? detail: "");
    abort ();
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    ls_msg_t m, back;
    ls_msgerr_t err;
    if (ls_msg_decode (data, size, &m, &err) != 0) {
        if (err.code == LS_MSGERR_NONE || !err.text [0] || m.type != 0)
            s_die ("refused without a reason or left m filled:", err.text);
        return 0;
    }
    char line [512];
    ls_msg_format (&m, line, sizeof line);
    cJSON_Delete (ls_msg_to_json (&m));

    char *buf, *buf2;
    size_t len, len2;
    if (ls_msg_encode (&m, &buf, &len) != 0)
        s_die ("a decoded message does not encode", NULL);
    if (ls_msg_decode (buf, len, &back, &err) != 0)
        s_die ("re-encoded message does not decode:", err.text);
    if (!ls_msg_equal (&m, &back))
        s_die ("round trip changed the message", NULL);
    if (ls_msg_encode (&back, &buf2, &len2) != 0 || len != len2 || memcmp (buf, buf2, len))
        s_die ("encoding is not deterministic", NULL);
    free (buf);
    free (buf2);
    ls_msg_clear (&m);
    ls_msg_clear (&back);
    return 0;
}
