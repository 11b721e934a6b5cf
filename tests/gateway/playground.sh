#!/usr/bin/env bash
# The playground page (GET /) in a real headless Chromium (playground.mjs) against the real
# graph on the demo model with an API key: the page is served without the key and with its
# security headers, every API call needs the key; in the browser the key is entered, a chat with
# reverse streams the answer the API gives directly, an adapter is loaded, answers and is
# unloaded through the page, the metrics move, and an adapter named in HTML stays text.
# Chromium is a test dependency (tools/install-test-deps.sh): without it this test fails.
# Usage: playground.sh BIN_DIR LAUNCH_SCRIPT
set -euo pipefail
bin=$1 launch=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
run=$(mktemp -d /tmp/ls-gw-play-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
key=play-$RANDOM$RANDOM
graph_start "$bin" "$launch" "$run" --api-key "$key"
fail() { echo "FAIL: $*" >&2; tail -n 20 "$run/graph/logs/gateway.log" >&2; exit 1; }
command -v "${CHROMIUM:-chromium}" >/dev/null || fail "no chromium: run tools/install-test-deps.sh"

# The page without the key, with its headers; the API behind the key.
headers=$(curl -s -D - -o "$run/page.html" "$url/")
cmp -s "$run/page.html" "$here/actors/gateway/playground.html" || fail "GET / is not playground.html"
for h in "HTTP/1.1 200" "Content-Type: text/html; charset=utf-8" "Content-Security-Policy: default-src 'none';" \
         "connect-src 'self'" "X-Content-Type-Options: nosniff" "frame-ancestors 'none'"; do
    case $headers in *"$h"*) ;; *) fail "GET / lacks '$h': $headers" ;; esac
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/models")" = 401 ] || fail "/v1/models without the key is not 401"

# What the API answers directly, as the page asks (temperature 0, top_p 1, max_tokens 64).
answer() {
    curl -s "$url/v1/chat/completions" -H "Authorization: Bearer $key" \
        -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"input: 5 leaf road 1 red\\noutput:\"}],\"temperature\":0,\"top_p\":1,\"max_tokens\":64}" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).choices[0].message.content))'
}
want_reverse=$(answer reverse) want_upper=$(answer upper)
[ "$want_reverse" = " red 1 road leaf 5" ] || fail "the API's reverse answer is '$want_reverse'"
node "$(dirname "$0")/playground.mjs" "$url" "$key" "$here/examples/demo/adapters/upper" "$want_reverse" "$want_upper" ||
    fail "the page in Chromium"
echo "playground: ok"
