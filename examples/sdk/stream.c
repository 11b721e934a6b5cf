// stream — streaming with the iterator: print each piece of text as the server produces it.
//
//   sdk-example-stream TARGET [ADAPTER [PROMPT]]
//
// Same arguments as sdk-example-generate; the printed line equals that program's.
#include <stdio.h>
#include <string.h>

#include "loraserve.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TARGET [ADAPTER [PROMPT]]\n", argv[0]);
        return 2;
    }
    const char *err;
    ls_client_t *client = strstr(argv[1], "://") ? ls_client_new(argv[1], &err) : ls_client_new_run_dir(argv[1], &err);
    if (!client) {
        fprintf(stderr, "connect: %s\n", err);
        return 1;
    }
    ls_request_t req = {
        .prompt = argc > 3 ? argv[3] : "input: 5 leaf road 1 red\noutput:",
        .adapter = argc > 2 && strcmp(argv[2], "base") ? argv[2] : NULL,
        .max_tokens = 32,
        .timeout_ms = 30000,
    };
    ls_stream_t *stream;
    int rc = ls_stream_open(client, &req, &stream);
    ls_piece_t piece;
    int pieces = 0;
    while (rc == LS_OK && (rc = ls_stream_next(stream, &piece)) == 1) {
        fputs(piece.text, stdout);
        fflush(stdout);
        pieces++;
        rc = LS_OK;
    }
    printf("\n");
    if (rc == LS_OK)
        fprintf(stderr, "%d pieces\n", pieces);
    else
        fprintf(stderr, "stream: %s: %s\n", ls_strerror(rc), ls_last_error());
    ls_stream_destroy(&stream);
    ls_client_destroy(&client);
    return rc == LS_OK ? 0 : 1;
}
