// worker — one per device: runs step plans on its backend; its work comes with the
// scheduler/worker issue. Accepts now: the lifecycle messages every actor handles (Heartbeat,
// Shutdown, GetMetrics). Emits: Ready (with its --rank), Heartbeat, Metrics, Error.
#include "ls_actor.h"

static const ls_dispatch_t s_dispatch[] = {{0, NULL}};

int main(int argc, char **argv) {
    const ls_actor_def_t def = {.name = "worker", .about = "loraserve worker", .dispatch = s_dispatch};
    return ls_actor_main(argc, argv, &def);
}
