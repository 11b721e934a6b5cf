#!/usr/bin/env bash
# The adapter tiers end to end: launch/loraserve on the demo model with a CPU tier of 3
# adapters (--max-loaded-loras 3) and the demo's four --lora-paths, plus --lora-dirs with six
# more. Over HTTP:
#   startup — all four --lora-paths are served (idle ones are evicted for the others, reloaded
#             on demand), none refused at start
#   burst   — six requests at once, each naming a different adapter not loaded yet: every one
#             loads on demand (the loads wait for room in the tier) and answers right; no 429
# Usage: tiers.sh BIN_DIR LAUNCH_SCRIPT DEMO_DIR
set -euo pipefail
bin=$1 launch=$2 demo=$3
run=$(mktemp -d /tmp/ls-tiers-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -n 30 "$run/graph/logs/registry.log" "$run/graph/logs/scheduler.log" >&2; exit 1; }
# dirs/a1..a6: copies of the demo's adapters, so their answers are known
mkdir -p "$run/dirs"
src=(reverse reverse upper upper sort digits)
for i in 1 2 3 4 5 6; do cp -r "$demo/adapters/${src[$((i - 1))]}" "$run/dirs/a$i"; done
graph_start "$bin" "$launch" "$run" --max-loaded-loras 3 --lora-dirs "$run/dirs"
answer() { # MODEL WANT: one completion, checked
    local body
    body=$(curl -s -w '\n%{http_code}' "$url/v1/completions" \
        -d "{\"model\":\"$1\",\"prompt\":\"input: 5 leaf road 1 red\\noutput:\",\"max_tokens\":24,\"temperature\":0}")
    case $body in
        *"\"text\":\" $2\""*200) ;;
        *) echo "$1: $body" >"$run/fail.$1"; return 1 ;;
    esac
}
want_reverse='red 1 road leaf 5' want_upper='5 LEAF ROAD 1 RED' want_sort='1 5 leaf red road'
want_digits='five leaf road one red'
for m in reverse upper sort digits; do
    w=want_$m
    answer "$m" "${!w}" || fail "startup adapter $m: $(cat "$run/fail.$m")"
done
echo "startup: 4 --lora-paths served from a tier of 3"
pids=()
for i in 1 2 3 4 5 6; do
    w=want_${src[$((i - 1))]}
    answer "a$i" "${!w}" &
    pids+=($!)
done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
[ "$bad" = 0 ] || fail "$bad of 6 on-demand loads at once failed: $(cat "$run"/fail.* 2>/dev/null)"
grep -q 'level=error' "$run/graph/logs/registry.log" && fail "the registry logged errors"
echo "burst: 6 on-demand loads at once into a tier of 3, all served"
# Ten adapters through a tier of three: at least seven evictions made the room.
ev=$(curl -s "$url/metrics" | awk '$1 == "loraserve_adapter_cpu_evictions{actor=\"scheduler\"}" {print $2}')
[ "${ev:-0}" -ge 7 ] || fail "only ${ev:-0} CPU-tier evictions: the tier was not exercised"
echo "the scheduler evicted $ev idle adapters to make room"
