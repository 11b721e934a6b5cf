#!/usr/bin/env bash
# The fault suite (docs/operations.md, "Faults tried"): the demo graph on the CPU, loopback only,
# under a steady load of small completions; every actor SIGKILLed and SIGSTOPped in turn, a
# corrupt journal, a full disk for the registry, the DoS request. chaos.py asserts no request
# hung, no acknowledged adapter load lost, the service back within 10 s of each death, and prints
# the figures last. Usage: chaos.sh BIN_DIR LAUNCH_SCRIPT
set -euo pipefail
bin=$1 launch=$2
run=$(mktemp -d /tmp/ls-chaos-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
# Faults come faster than a production budget allows; hangs are found within 2 s.
graph_start "$bin" "$launch" "$run" --max-restarts 100 --actor-heartbeat-ms 250 --hang-timeout-ms 2000
DEMO_ADAPTERS=$(cd "$(dirname "$launch")/../examples/demo/adapters" && pwd) \
    python3 "$(dirname "$0")/chaos.py" "$url" "$run/graph" || {
    echo "--- launcher output ---" >&2
    tail -n 40 "$run/launch.out" >&2
    exit 1
}
