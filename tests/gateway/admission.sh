#!/usr/bin/env bash
# Admission control end to end (docs/scheduling.md, "Admission and fair share"): launch/loraserve
# on the demo model with small queues, then over HTTP:
#   dos        — 1,024 prompts x n = 64 in one 33 KB request: a 400 at once, nothing queued
#   flood      — 16 clients flood the base model; they get 429s with Retry-After, while every
#                request for the adapter `reverse` meanwhile gets its right answer within a bound
#   disconnect — a client leaves a request of 2 prompts x n = 4: all 8 completions are aborted
#                at the scheduler, the queues empty
# Usage: admission.sh BIN_DIR LAUNCH_SCRIPT
set -euo pipefail
bin=$1 launch=$2
run=$(mktemp -d /tmp/ls-gw-adm-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
flooders=()
cleanup() {
    touch "$run/stop"
    for p in "${flooders[@]}"; do kill "$p" 2>/dev/null || true; done
    [ ${#flooders[@]} = 0 ] || wait "${flooders[@]}" 2>/dev/null || true
    graph_cleanup
}
trap cleanup EXIT
graph_start "$bin" "$launch" "$run" --max-running-requests 4 --max-tenant-waiting 8 --max-waiting-requests 64 \
    --max-request-completions 16 --max-tenant-completions 16
fail() { echo "FAIL: $*" >&2; tail -n 20 "$run/graph/logs/gateway.log" "$run/graph/logs/scheduler.log" >&2; exit 1; }
# metric NAME ACTOR: a counter from /metrics (0 before it first counts)
metric() { curl -s "$url/metrics" | awk -v k="loraserve_$1{actor=\"$2\"}" '$1 == k {v = $2} END {print v + 0}'; }
# until_idle: the scheduler's queues empty within 10 s
until_idle() {
    for _ in $(seq 100); do
        [ "$(metric queue_length scheduler)" = 0 ] && [ "$(metric running_requests scheduler)" = 0 ] && return 0
        sleep 0.1
    done
    fail "the scheduler still has work 10 s later: queue $(metric queue_length scheduler), running $(metric running_requests scheduler)"
}
prompt='input: 5 leaf road 1 red\noutput:'
victim='{"model":"reverse","prompt":"'$prompt'","max_tokens":24,"temperature":0}'

# dos: refused whole and at once, before anything goes upstream.
prompts=$(printf '"input: a b c d e f g\\noutput:",%.0s' $(seq 1024))
printf '{"model":"demo","prompt":[%s],"n":64,"max_tokens":16}' "${prompts%,}" >"$run/dos.json"
out=$(curl -s -o "$run/dos.out" -w '%{http_code} %{time_total}' "$url/v1/completions" -d @"$run/dos.json")
read -r code secs <<<"$out"
[ "$code" = 400 ] || fail "the DoS request: $code $(cat "$run/dos.out")"
grep -q '"code":"too_many_completions"' "$run/dos.out" || fail "the DoS answer names no reason: $(cat "$run/dos.out")"
# At once: ~50 ms under ASan on two cores (3 ms without); the bound leaves room for a loaded CI
# machine, and that nothing went upstream is the tokenizer's count below.
awk -v s="$secs" 'BEGIN {exit !(s < 2)}' || fail "the DoS request took $secs s to refuse"
[ "$(metric requests_total tokenizer)" = 0 ] || fail "the DoS request reached the tokenizer"
echo "dos: 400 in $secs s: $(cat "$run/dos.out")"

# flood: the base model's tenant floods; reverse's requests are served meanwhile.
alone=$(curl -s -o /dev/null -w '%{time_total}' "$url/v1/completions" -d "$victim")
flood='{"model":"demo","prompt":"'$prompt'","n":4,"max_tokens":64,"ignore_eos":true}'
for i in $(seq 16); do
    # A refused client pauses a moment: the clients run on the server's two cores here, and a
    # thousand curl processes a second would measure the machine, not the scheduler.
    (while [ ! -f "$run/stop" ]; do
        curl -s -D - -o /dev/null "$url/v1/completions" -d "$flood" >"$run/flood.$i.last" || true
        cat "$run/flood.$i.last" >>"$run/flood.$i"
        grep -q '^HTTP/1.1 429' "$run/flood.$i.last" && sleep 0.1
    done) &
    flooders+=($!)
done
sleep 1
worst=0
for i in $(seq 8); do
    out=$(curl -s -o "$run/victim.out" -w '%{http_code} %{time_total}' "$url/v1/completions" -d "$victim")
    read -r code secs <<<"$out"
    [ "$code" = 200 ] || fail "reverse under the flood: $code $(cat "$run/victim.out")"
    grep -q '"text":" red 1 road leaf 5"' "$run/victim.out" || fail "reverse under the flood answered $(cat "$run/victim.out")"
    worst=$(awk -v a="$worst" -v b="$secs" 'BEGIN {print (b > a ? b : a)}')
done
queued=$(metric queue_length scheduler)
touch "$run/stop"
wait "${flooders[@]}" || true
flooders=()
ok=$(cat "$run"/flood.? "$run"/flood.?? | grep -c '^HTTP/1.1 200' || true)
limited=$(cat "$run"/flood.? "$run"/flood.?? | grep -c '^HTTP/1.1 429' || true)
retry=$(cat "$run"/flood.? "$run"/flood.?? | grep -ci '^Retry-After: 1' || true)
echo "flood: $ok served, $limited answered 429 ($retry with Retry-After); reverse's slowest answer $worst s, alone $alone s (scheduler queue $queued)"
[ "$limited" -gt 0 ] || fail "the flood was never limited"
[ "$retry" = "$limited" ] || fail "a 429 without Retry-After"
[ "$ok" -gt 0 ] || fail "the flooding tenant got nothing served"
# Every one of reverse's requests was served, none refused. How long they took depends on the
# machine (tests run in parallel on two cores; under ASan beside a compile, 34 s was seen):
# the bound here only catches a hang; the order
# that puts them at the next free running place is test_fair_share's (tests/scheduler).
awk -v s="$worst" 'BEGIN {exit !(s < 60)}' || fail "reverse waited $worst s under the flood"
until_idle

# disconnect: every child of the request is aborted at the scheduler (8 completions: 4 run,
# 4 wait, within every limit).
aborted=$(metric requests_aborted scheduler)
curl -s -o "$run/left.out" "$url/v1/completions" \
    -d '{"model":"upper","prompt":["a","b"],"n":4,"max_tokens":240,"ignore_eos":true}' &
client=$!
for _ in $(seq 100); do  # the client leaves once its completions run
    [ "$(metric running_requests scheduler)" -gt 0 ] && break
    sleep 0.1
done
kill "$client"
wait "$client" 2>/dev/null || true
[ ! -s "$run/left.out" ] || fail "the request that should still run when its client leaves was answered"
until_idle
now=$(metric requests_aborted scheduler)
[ $((now - aborted)) = 8 ] || fail "the client left, and $((now - aborted)) of its 8 completions were aborted"
[ "$(metric requests_active tokenizer)" = 0 ] || fail "the tokenizer still holds the request"
echo "disconnect: 8 of 8 completions aborted"
