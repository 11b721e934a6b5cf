#!/usr/bin/env bash
# The gateway end to end: launch/loraserve on the demo model (its four adapters), then curl
# and the official OpenAI client (openai_client.mjs) against it. Usage: e2e.sh BIN_DIR LAUNCH_SCRIPT CLIENT
set -euo pipefail
bin=$1 launch=$2 client=$3
run=$(mktemp -d /tmp/ls-gw-e2e-XXXXXX)
cleanup() {
    if [ -n "${pid:-}" ]; then kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$run"
}
trap cleanup EXIT
# --port 0: the gateway takes a free port (tests run in parallel) and logs it.
LORASERVE_BIN=$bin "$launch" --run-dir "$run/graph" --port 0 --served-model-name demo >"$run/launch.out" 2>&1 &
pid=$!
for _ in $(seq 600); do
    [ -f "$run/graph/graph.json" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$run/launch.out"; echo "the graph did not start" >&2; exit 1; }
    sleep 0.1
done
[ -f "$run/graph/graph.json" ] || { cat "$run/launch.out"; echo "the graph was not ready in 60 s" >&2; exit 1; }
port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$run/graph/logs/gateway.log" | head -1 | cut -d: -f3)
url=http://127.0.0.1:$port
echo "gateway at $url"
fail() { echo "FAIL: $*" >&2; tail -n 20 "$run/graph/logs/gateway.log" "$run/graph/logs/tokenizer.log" >&2; exit 1; }

# curl: /health, and the README's completion for the base model and each adapter.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] || fail "/health"
prompt='input: 5 leaf road 1 red\noutput:'
while read -r model want; do
    body=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\":\"$model\",\"prompt\":\"$prompt\",\"max_tokens\":24,\"temperature\":0}")
    got=$(printf '%s' "$body" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).choices[0].text))')
    [ "$got" = " $want" ] || fail "curl $model: got '$got' from $body, want ' $want'"
done <<'ANSWERS'
demo 5 leaf road 1 red
reverse red 1 road leaf 5
upper 5 LEAF ROAD 1 RED
sort 1 5 leaf red road
digits five leaf road one red
ANSWERS
# SGLang's /generate, a list with a base entry.
body=$(curl -s "$url/generate" -d "{\"text\":[\"$prompt\",\"$prompt\"],\"lora_path\":[null,\"reverse\"],\"sampling_params\":{\"temperature\":0,\"max_new_tokens\":24}}")
case $body in *'"text":" 5 leaf road 1 red"'*'"text":" red 1 road leaf 5"'*) ;; *) fail "/generate list: $body" ;; esac
# /metrics carries the other actors' counters.
metrics=$(curl -s "$url/metrics")
case $metrics in *'actor="scheduler"'*) ;; *) fail "/metrics has no scheduler counters" ;; esac

node "$client" "$url/v1" || fail "the OpenAI client"
