#!/usr/bin/env bash
# The gateway end to end: launch/loraserve on the demo model (its four adapters), then curl
# and the official OpenAI client (openai_client.mjs) against it. Usage: e2e.sh BIN_DIR LAUNCH_SCRIPT CLIENT
set -euo pipefail
bin=$1 launch=$2 client=$3
run=$(mktemp -d /tmp/ls-gw-e2e-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
graph_start "$bin" "$launch" "$run"
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
