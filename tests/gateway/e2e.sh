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

# A NUL inside JSON text reaches the tokenizer whole. The prompt with "\u0000" is tokenized as
# loraserve-tokenize (jansson, HF-identical ids: tests/text) tokenizes it — 12 ids, not the 5 of
# the text before the NUL — and generates exactly what those ids generate as input_ids.
js() { node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);process.stdout.write(String(eval(process.argv[1])) + "\n")})' "$1"; }
here=$(cd "$(dirname "$0")/../.." && pwd)
nul='input: 5 leaf\u0000 road 1 red\noutput:'
ids=$(printf '"%s"\n' "$nul" | "$bin/loraserve-tokenize" encode --jsonl --add-special-tokens \
      --tokenizer "$here/examples/demo/tokenizer.json")
[ "$ids" = "[0,277,29,329,470,192,471,331,488,202,279,29]" ] || fail "loraserve-tokenize: NUL prompt gave $ids"
params='"sampling_params":{"temperature":0,"max_new_tokens":24}'
by_text=$(curl -s "$url/generate" -d "{\"text\":\"$nul\",$params}")
by_ids=$(curl -s "$url/generate" -d "{\"input_ids\":$ids,$params}")
[ "$(printf '%s' "$by_text" | js j.meta_info.prompt_tokens)" = 12 ] || fail "/generate NUL prompt: $by_text"
[ "$(printf '%s' "$by_text" | js j.text)" = "$(printf '%s' "$by_ids" | js j.text)" ] ||
    fail "/generate NUL prompt: text gives $by_text, its ids give $by_ids"
# Completions and chat content: the text after the NUL is counted (a cut prompt counts fewer).
for p in '"a"' '"a\u0000b c"'; do
    curl -s "$url/v1/completions" -d "{\"model\":\"demo\",\"prompt\":$p,\"max_tokens\":1}" | js j.usage.prompt_tokens
    curl -s "$url/v1/chat/completions" -d "{\"model\":\"demo\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":$p}]}" |
        js j.usage.prompt_tokens
done > "$run/nul_counts"
read -r comp_a chat_a comp_nul chat_nul <<<"$(tr '\n' ' ' < "$run/nul_counts")"
[ "$comp_nul" -gt "$comp_a" ] && [ "$chat_nul" -gt "$chat_a" ] ||
    fail "a NUL cut the prompt: prompt_tokens a=$comp_a/$chat_a, a\\0b c=$comp_nul/$chat_nul (completions/chat)"

node "$client" "$url/v1" || fail "the OpenAI client"
