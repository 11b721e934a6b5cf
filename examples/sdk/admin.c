// admin — adapter administration: list the adapters, unload one, load it back, use it.
//
//   sdk-example-admin TARGET NAME PATH
//
// NAME is an adapter the server has loaded from PATH (for the demo graph: digits and
// examples/demo/adapters/digits).
#include <stdio.h>
#include <string.h>

#include "loraserve.h"

static void s_list(ls_client_t *client) {
    ls_adapter_list_t *list;
    int rc = ls_client_adapter_list(client, &list);
    if (rc < 0) {
        fprintf(stderr, "list: %s: %s\n", ls_strerror(rc), ls_last_error());
        return;
    }
    printf("adapters:");
    for (size_t i = 0; i < list->n_adapters; i++)
        printf(" %s(rank %u, %s)", list->adapters[i].name, list->adapters[i].rank,
               ls_adapter_status_name(list->adapters[i].status));
    printf("\n");
    ls_adapter_list_destroy(&list);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TARGET NAME PATH\n", argv[0]);
        return 2;
    }
    const char *err, *name = argv[2], *path = argv[3];
    ls_client_t *client = strstr(argv[1], "://") ? ls_client_new(argv[1], &err) : ls_client_new_run_dir(argv[1], &err);
    if (!client) {
        fprintf(stderr, "connect: %s\n", err);
        return 1;
    }
    s_list(client);
    int rc = ls_client_adapter_unload(client, name);
    printf("unload %s: %s\n", name, rc == LS_OK ? "ok" : ls_last_error());

    // An unloaded adapter is unknown to the server: generating with it is LS_ERR_NOT_FOUND.
    ls_request_t req = {.prompt = "input: 5 leaf road 1 red\noutput:", .adapter = name, .max_tokens = 32};
    ls_result_t *result = NULL;
    rc = ls_client_generate(client, &req, &result);
    printf("generate with %s: %s\n", name, rc == LS_ERR_NOT_FOUND ? "not found" : ls_strerror(rc));
    ls_result_destroy(&result);

    uint32_t rank = 0;
    rc = ls_client_adapter_load(client, name, path, false, &rank);
    if (rc == LS_OK)
        printf("load %s: ok (rank %u)\n", name, rank);
    else
        printf("load %s: %s\n", name, ls_last_error());
    s_list(client);
    if (rc == LS_OK && (rc = ls_client_generate(client, &req, &result)) == LS_OK)
        printf("%s:%s\n", name, result->completions[0].text);
    ls_result_destroy(&result);
    ls_client_destroy(&client);
    return rc == LS_OK ? 0 : 1;
}
