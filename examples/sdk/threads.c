// threads — one client shared by several threads: each generates with its own adapter at the
// same time, and each gets its own answer.
//
//   sdk-example-threads TARGET [PROMPT]
//
// Prints one line per model, "base: …", "reverse: …", in this fixed order.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "loraserve.h"

static const char *s_models[] = {"base", "reverse", "upper", "sort", "digits"};
#define N_MODELS (sizeof s_models / sizeof s_models[0])

typedef struct {
    ls_client_t *client;    // shared by every thread: the SDK makes that safe
    const char *prompt;
    const char *model;
    int rc;
    char text[256];
} job_t;

static void *s_run(void *arg) {
    job_t *job = arg;
    ls_request_t req = {
        .prompt = job->prompt,
        .adapter = strcmp(job->model, "base") ? job->model : NULL,
        .max_tokens = 32,
        .timeout_ms = 60000,
    };
    ls_result_t *result = NULL;
    job->rc = ls_client_generate(job->client, &req, &result);
    snprintf(job->text, sizeof job->text, "%s",
             job->rc == LS_OK ? result->completions[0].text : ls_last_error());
    ls_result_destroy(&result);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s TARGET [PROMPT]\n", argv[0]);
        return 2;
    }
    const char *err;
    ls_client_t *client = strstr(argv[1], "://") ? ls_client_new(argv[1], &err) : ls_client_new_run_dir(argv[1], &err);
    if (!client) {
        fprintf(stderr, "connect: %s\n", err);
        return 1;
    }
    job_t jobs[N_MODELS];
    pthread_t threads[N_MODELS];
    for (size_t i = 0; i < N_MODELS; i++) {
        jobs[i] = (job_t){.client = client,
                          .prompt = argc > 2 ? argv[2] : "input: 5 leaf road 1 red\noutput:",
                          .model = s_models[i]};
        pthread_create(&threads[i], NULL, s_run, &jobs[i]);
    }
    int failed = 0;
    for (size_t i = 0; i < N_MODELS; i++) {
        pthread_join(threads[i], NULL);
        printf("%s:%s%s\n", jobs[i].model, jobs[i].rc == LS_OK ? "" : " error: ", jobs[i].text);
        failed += jobs[i].rc != LS_OK;
    }
    ls_client_destroy(&client);
    return failed ? 1 : 0;
}
