// gateway — the HTTP front end (OpenAI and SGLang APIs); its HTTP server comes with the
// gateway issue. Accepts now: the lifecycle messages every actor handles (Heartbeat,
// Shutdown, GetMetrics). Emits: Ready, Heartbeat, Metrics, Error.
#include "ls_actor.h"

static const ls_dispatch_t s_dispatch[] = {{0, NULL}};

int main(int argc, char **argv) {
    const ls_actor_def_t def = {.name = "gateway", .about = "loraserve HTTP gateway", .dispatch = s_dispatch};
    return ls_actor_main(argc, argv, &def);
}
