# Sourced by the tests that run the whole graph (gateway, loraserve-bench). graph_start BIN_DIR LAUNCH_SCRIPT RUN [launcher flags...]
# starts launch/loraserve (the demo model, served as "demo") in RUN/graph on a free port and
# sets pid (the launcher's) and url; graph_cleanup, the scripts' EXIT trap, stops it and
# removes RUN.
graph_start() {
    local bin=$1 launch=$2 run=$3
    shift 3
    # --port 0: the gateway takes a free port (tests run in parallel) and logs it.
    LORASERVE_BIN=$bin "$launch" --run-dir "$run/graph" --port 0 --served-model-name demo "$@" >"$run/launch.out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [ -f "$run/graph/graph.json" ] && break
        kill -0 "$pid" 2>/dev/null || { cat "$run/launch.out"; echo "the graph did not start" >&2; exit 1; }
        sleep 0.1
    done
    [ -f "$run/graph/graph.json" ] || { cat "$run/launch.out"; echo "the graph was not ready in 60 s" >&2; exit 1; }
    local port
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$run/graph/logs/gateway.log" | head -1 | cut -d: -f3)
    url=http://127.0.0.1:$port
    echo "gateway at $url"
}

graph_cleanup() {
    if [ -n "${pid:-}" ]; then kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$run"
}
