// loraserve-cli — talk to a running loraserve graph from the shell, through the C SDK:
// generate text (blocking or streamed), load, unload and list adapters, check health.
// `loraserve-cli --help` lists commands, flags and exit codes.
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loraserve.h"

// Exit codes, one per error class, so scripts can tell "fix the request" from "try later".
enum {
    EXIT_OK = 0,
    EXIT_OTHER = 1,       // out of memory, anything not below
    EXIT_USAGE = 2,       // bad command line
    EXIT_NOT_FOUND = 3,   // unknown adapter
    EXIT_REQUEST = 4,     // the server refused the request's values, or it is too large
    EXIT_UNAVAILABLE = 5, // no server, or it cannot serve now
    EXIT_TIMEOUT = 6,
    EXIT_ABORTED = 7,
    EXIT_SERVER = 8       // the server failed, or spoke a protocol the CLI does not understand
};

static const char s_usage[] =
    "usage: loraserve-cli [--endpoint E | --run-dir DIR] [--timeout-ms MS] COMMAND [ARGS]\n"
    "\n"
    "Connects to the tokenizer endpoint E, or to the graph in DIR (DIR/graph.json); without\n"
    "either, to the graph in $LORASERVE_RUN_DIR.\n"
    "\n"
    "commands:\n"
    "  generate [TEXT]        generate from TEXT, or from stdin when TEXT is absent or -\n"
    "      --adapter NAME     use a LoRA adapter (default: the base model)\n"
    "      --stream           print the text as it is produced\n"
    "      --max-tokens N     new tokens at most (default: the server's)\n"
    "      --temperature T    0 is greedy (default)\n"
    "      --top-p P, --top-k K, --seed S, --stop STR (repeatable)\n"
    "      --chat             TEXT is a user message, rendered with the model's chat template\n"
    "      --system TEXT      with --chat: a system message before it\n"
    "      --usage            print finish reason and token counts to stderr\n"
    "  load NAME PATH [--pinned]   load the PEFT adapter in directory PATH as NAME\n"
    "  unload NAME            unload an adapter\n"
    "  list                   list the adapters\n"
    "  health                 ping the server\n"
    "\n"
    "--timeout-ms MS bounds every call (generate: the whole request; default no limit for\n"
    "generate, 60000 for the others).\n"
    "\n"
    "exit codes: 0 ok, 1 other error, 2 usage, 3 not found, 4 bad or too large request,\n"
    "5 server unavailable, 6 timeout, 7 aborted, 8 server or protocol error\n";

typedef struct {
    const char *endpoint, *run_dir;
    uint32_t timeout_ms;
    ls_request_t req;
    const char *stops[16];
    bool stream, chat, usage, pinned;
    const char *system;
} opts_t;

static int s_exit_code(int rc) {
    switch (rc) {
    case LS_OK: return EXIT_OK;
    case LS_ERR_NOT_FOUND: return EXIT_NOT_FOUND;
    case LS_ERR_BAD_REQUEST:
    case LS_ERR_TOO_LARGE: return EXIT_REQUEST;
    case LS_ERR_UNAVAILABLE:
    case LS_ERR_OUTCOME_UNKNOWN: return EXIT_UNAVAILABLE;
    case LS_ERR_TIMEOUT: return EXIT_TIMEOUT;
    case LS_ERR_ABORTED: return EXIT_ABORTED;
    case LS_ERR_INTERNAL:
    case LS_ERR_PROTOCOL: return EXIT_SERVER;
    default: return EXIT_OTHER;
    }
}

static int s_fail(const char *what, int rc) {
    fprintf(stderr, "loraserve-cli: %s: %s (%s)\n", what, ls_last_error(), ls_strerror(rc));
    return s_exit_code(rc);
}

static int s_usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "loraserve-cli: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(loraserve-cli --help for usage)\n");
    return EXIT_USAGE;
}

// All of stdin, NUL bytes included (its length in *len_p), NUL-terminated; NULL when out of memory.
static char *s_read_stdin(size_t *len_p) {
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len - 1, stdin)) > 0) {
        len += got;
        if (cap - len < 2) {
            char *more = realloc(buf, cap *= 2);
            if (!more)
                free(buf);
            buf = more;
        }
    }
    if (buf)
        buf[len] = 0;
    *len_p = len;
    return buf;
}

static int s_print_piece(const ls_piece_t *piece, void *arg) {
    fwrite(piece->text, 1, piece->text_len, stdout);
    fflush(stdout);
    return 0;
}

static int s_generate(ls_client_t *client, opts_t *o, const char *text, size_t len) {
    ls_chat_message_t chat[2];
    if (o->chat) {
        size_t n = 0;
        if (o->system)
            chat[n++] = (ls_chat_message_t){"system", o->system};
        chat[n++] = (ls_chat_message_t){"user", text};
        o->req.messages = chat;
        o->req.n_messages = n;
    } else
        o->req.prompt = text, o->req.prompt_len = len;
    o->req.timeout_ms = o->timeout_ms;
    ls_result_t *result = NULL;
    int rc = o->stream ? ls_client_generate_stream(client, &o->req, s_print_piece, NULL, &result)
                       : ls_client_generate(client, &o->req, &result);
    if (result && result->n_completions && !o->stream)
        fwrite(result->completions[0].text, 1, result->completions[0].text_len, stdout);
    // End the output line, unless nothing was printed (a refused request).
    if (result && result->n_completions && (rc == LS_OK || *result->completions[0].text))
        putchar('\n');
    if (o->usage && result && result->n_completions)
        fprintf(stderr, "finish=%s prompt_tokens=%u completion_tokens=%u cached_tokens=%u\n",
                ls_finish_name(result->completions[0].finish), result->prompt_tokens, result->completion_tokens,
                result->cached_tokens);
    ls_result_destroy(&result);
    return rc < 0 ? s_fail("generate", rc) : EXIT_OK;
}

static int s_list(ls_client_t *client) {
    ls_adapter_list_t *list;
    int rc = ls_client_adapter_list(client, &list);
    if (rc < 0)
        return s_fail("list", rc);
    printf("%-20s %-10s %4s %-6s %9s %s\n", "NAME", "STATUS", "RANK", "PINNED", "IN_FLIGHT", "PATH");
    for (size_t i = 0; i < list->n_adapters; i++) {
        ls_adapter_t *a = &list->adapters[i];
        printf("%-20s %-10s %4u %-6s %9u %s\n", a->name ? a->name : "", ls_adapter_status_name(a->status), a->rank,
               a->pinned ? "yes" : "no", a->in_flight, a->path ? a->path : "-");
    }
    ls_adapter_list_destroy(&list);
    return EXIT_OK;
}

static int s_run(ls_client_t *client, opts_t *o, int argc, char **argv) {
    const char *cmd = argv[0];
    if (!strcmp(cmd, "generate")) {
        if (argc > 2)
            return s_usage_error("generate takes one TEXT argument (quote it)%s", "");
        if (argc == 2 && strcmp(argv[1], "-"))
            return s_generate(client, o, argv[1], strlen(argv[1]));
        size_t len;
        char *text = s_read_stdin(&len);
        if (!text)
            return s_fail("reading stdin", LS_ERR_NO_MEMORY);
        int code = s_generate(client, o, text, len);
        free(text);
        return code;
    }
    if (!strcmp(cmd, "load")) {
        if (argc != 3)
            return s_usage_error("load takes NAME PATH%s", "");
        uint32_t rank = 0;
        int rc = ls_client_adapter_load(client, argv[1], argv[2], o->pinned, &rank);
        if (rc < 0)
            return s_fail("load", rc);
        printf("loaded %s (rank %u)\n", argv[1], rank);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "unload")) {
        if (argc != 2)
            return s_usage_error("unload takes NAME%s", "");
        int rc = ls_client_adapter_unload(client, argv[1]);
        if (rc < 0)
            return s_fail("unload", rc);
        printf("unloaded %s\n", argv[1]);
        return EXIT_OK;
    }
    if (!strcmp(cmd, "list"))
        return argc == 1 ? s_list(client) : s_usage_error("list takes no arguments%s", "");
    if (!strcmp(cmd, "health")) {
        ls_health_t h;
        int rc = ls_client_ping(client, &h);
        if (rc < 0)
            return s_fail("health", rc);
        printf("ok: %s at %s answered in %.3f ms (up %.1f s)\n", h.actor, ls_client_endpoint(client),
               h.rtt_us / 1000.0, h.uptime_ms / 1000.0);
        return EXIT_OK;
    }
    return s_usage_error("unknown command '%s'", cmd);
}

// Numbers from flags: the whole argument must parse.
static bool s_number(const char *s, double lo, double hi, double *v) {
    char *end;
    *v = strtod(s, &end);
    return *s && !*end && *v >= lo && *v <= hi;
}

int main(int argc, char **argv) {
    enum { O_ENDPOINT = 1, O_RUN_DIR, O_TIMEOUT, O_ADAPTER, O_STREAM, O_MAX_TOKENS, O_TEMPERATURE, O_TOP_P,
           O_TOP_K, O_SEED, O_STOP, O_CHAT, O_SYSTEM, O_USAGE, O_PINNED, O_HELP };
    static const struct option longopts[] = {
        {"endpoint", required_argument, 0, O_ENDPOINT}, {"run-dir", required_argument, 0, O_RUN_DIR},
        {"timeout-ms", required_argument, 0, O_TIMEOUT}, {"adapter", required_argument, 0, O_ADAPTER},
        {"stream", no_argument, 0, O_STREAM},           {"max-tokens", required_argument, 0, O_MAX_TOKENS},
        {"temperature", required_argument, 0, O_TEMPERATURE}, {"top-p", required_argument, 0, O_TOP_P},
        {"top-k", required_argument, 0, O_TOP_K},       {"seed", required_argument, 0, O_SEED},
        {"stop", required_argument, 0, O_STOP},         {"chat", no_argument, 0, O_CHAT},
        {"system", required_argument, 0, O_SYSTEM},     {"usage", no_argument, 0, O_USAGE},
        {"pinned", no_argument, 0, O_PINNED},           {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0}};
    opts_t o = {0};
    o.req.stop = o.stops;
    int c;
    double v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_ENDPOINT: o.endpoint = optarg; break;
        case O_RUN_DIR: o.run_dir = optarg; break;
        case O_ADAPTER: o.req.adapter = optarg; break;
        case O_STREAM: o.stream = true; break;
        case O_CHAT: o.chat = true; break;
        case O_SYSTEM: o.system = optarg; break;
        case O_USAGE: o.usage = true; break;
        case O_PINNED: o.pinned = true; break;
        case O_STOP:
            if (o.req.n_stop == sizeof o.stops / sizeof o.stops[0])
                return s_usage_error("too many --stop strings (16 at most)%s", "");
            o.stops[o.req.n_stop++] = optarg;
            break;
        case O_TIMEOUT:
            if (!s_number(optarg, 0, UINT32_MAX, &v))
                return s_usage_error("bad --timeout-ms '%s'", optarg);
            o.timeout_ms = (uint32_t)v;
            break;
        case O_MAX_TOKENS:
            if (!s_number(optarg, 0, UINT32_MAX, &v))
                return s_usage_error("bad --max-tokens '%s'", optarg);
            o.req.max_tokens = (uint32_t)v;
            break;
        case O_TEMPERATURE:
            if (!s_number(optarg, 0, 100, &v))
                return s_usage_error("bad --temperature '%s'", optarg);
            o.req.temperature = (float)v;
            break;
        case O_TOP_P:
            if (!s_number(optarg, 0, 1, &v))
                return s_usage_error("bad --top-p '%s'", optarg);
            o.req.top_p = (float)v;
            break;
        case O_TOP_K:
            if (!s_number(optarg, -1, INT32_MAX, &v))
                return s_usage_error("bad --top-k '%s'", optarg);
            o.req.top_k = (int32_t)v;
            break;
        case O_SEED: {
            char *end;
            o.req.seed = strtoull(optarg, &end, 10);
            if (!*optarg || *end)
                return s_usage_error("bad --seed '%s'", optarg);
            o.req.has_seed = true;
            break;
        }
        case O_HELP:
        case 'h': fputs(s_usage, stdout); return EXIT_OK;
        default: return s_usage_error("unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return s_usage_error("no command given%s", "");
    if (o.endpoint && o.run_dir)
        return s_usage_error("give --endpoint or --run-dir, not both%s", "");
    const char *run_dir = o.run_dir ? o.run_dir : getenv("LORASERVE_RUN_DIR");
    if (!o.endpoint && !run_dir)
        return s_usage_error("no server: give --endpoint, --run-dir or LORASERVE_RUN_DIR%s", "");

    const char *err;
    ls_client_t *client = o.endpoint ? ls_client_new(o.endpoint, &err) : ls_client_new_run_dir(run_dir, &err);
    if (!client) {
        fprintf(stderr, "loraserve-cli: %s\n", err);
        return EXIT_UNAVAILABLE;
    }
    if (o.timeout_ms)
        ls_client_set_timeout(client, o.timeout_ms);
    int code = s_run(client, &o, argc - optind, argv + optind);
    ls_client_destroy(&client);
    return code;
}
