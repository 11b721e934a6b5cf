// generate — the smallest loraserve SDK program: connect, generate once, print the answer.
//
//   sdk-example-generate TARGET [ADAPTER [PROMPT]]
//
// TARGET is a run directory (launch/loraserve --run-dir DIR) or a tokenizer endpoint
// (ipc://… or tcp://…). ADAPTER "" or "base" is the base model. The default prompt is one
// the demo model (examples/demo) answers by each adapter's rule.
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
    const char *adapter = argc > 2 && strcmp(argv[2], "base") ? argv[2] : NULL;
    ls_request_t req = {
        .prompt = argc > 3 ? argv[3] : "input: 5 leaf road 1 red\noutput:",
        .adapter = adapter,
        .max_tokens = 32,     // temperature 0: greedy
        .timeout_ms = 30000,
    };
    ls_result_t *result = NULL;
    int rc = ls_client_generate(client, &req, &result);
    if (rc == LS_OK) {
        ls_completion_t *c = &result->completions[0];
        printf("%s\n", c->text);
        fprintf(stderr, "finish=%s tokens=%zu prompt_tokens=%u completion_tokens=%u\n", ls_finish_name(c->finish),
                c->n_tokens, result->prompt_tokens, result->completion_tokens);
    } else
        fprintf(stderr, "generate: %s: %s\n", ls_strerror(rc), ls_last_error());
    ls_result_destroy(&result);
    ls_client_destroy(&client);
    return rc == LS_OK ? 0 : 1;
}
