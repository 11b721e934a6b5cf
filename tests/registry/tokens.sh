#!/usr/bin/env bash
# Trainable tokens end to end: launch/loraserve on the demo model (tied embeddings) with
# --lora-extra-vocab-size 4, adapters sent as tensors over HTTP (upper's LoRA plus rows of the
# embedding, which the tied lm_head takes too).
#   same      — the rows of four prompt and answer tokens set to the base model's own: upper's
#               greedy text, unchanged
#   moved     — LEAF's row negated: its logit flips sign, so the answer is no longer upper's
#   mix       — a mix naming an adapter with trainable tokens: a 400 saying they do not mix
#   capacity  — five rows against the four a slot holds: a 400 naming --lora-extra-vocab-size
# Usage: tokens.sh BIN_DIR LAUNCH_SCRIPT DEMO_DIR
set -euo pipefail
bin=$1 launch=$2 demo=$3
run=$(mktemp -d /tmp/ls-tokens-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -n 30 "$run/graph/logs/registry.log" "$run/graph/logs/worker-0.log" >&2 || true; exit 1; }

# body NAME SCALE ID...: a load body: upper's config and LoRA, trainable_token_indices the ids,
# their rows the base embedding's times SCALE (1 or -1), as PEFT saves them (bf16)
body() {
    PYTHONPATH="$(dirname "$0")/../common" python3 - "$demo" "$@" <<'PY'
import base64, json, sys
from upper_rows import embedding, with_rows
demo, name, scale, ids = sys.argv[1], sys.argv[2], float(sys.argv[3]), [int(a) for a in sys.argv[4:]]
_, hidden, table = embedding(demo)
rows = bytearray()
for i in ids:
    row = bytearray(table[i * hidden * 2:(i + 1) * hidden * 2])
    if scale < 0:  # flip the bf16 sign bits
        for k in range(1, len(row), 2):
            row[k] ^= 0x80
    rows += row
st, cfg = with_rows(demo, rows, ids)
print(json.dumps({"lora_name": name, "lora_config": cfg, "lora_tensors": base64.b64encode(st).decode()}))
PY
}
post() { # ROUTE BODY_FILE: prints "STATUS BODY"
    curl -s -o "$run/resp" -w '%{http_code}' "$url$1" -H 'Content-Type: application/json' --data-binary "@$2" >"$run/code"
    echo "$(cat "$run/code") $(cat "$run/resp")"
}
answer() { # MODEL: the greedy text for upper's first prompt
    curl -s "$url/v1/completions" \
        -d "{\"model\":\"$1\",\"prompt\":\"input: 5 leaf road 1 red\\noutput:\",\"max_tokens\":24,\"temperature\":0}"
}
want_upper='"text":" 5 LEAF ROAD 1 RED"'

graph_start "$bin" "$launch" "$run" --lora-extra-vocab-size 4
# leaf and road in the prompt (470, 471), LEAF and ROAD in the answer (642, 767)
body same 1 470 471 642 767 >"$run/b"
r=$(post /v1/load_lora_adapter "$run/b")
[ "${r%% *}" = 200 ] || fail "load: $r"
case $(answer same) in *"$want_upper"*) ;; *) fail "same rows did not answer upper's text: $(answer same)" ;; esac
echo "same: the base model's own rows keep upper's text"

body moved -1 642 >"$run/b"
r=$(post /v1/load_lora_adapter "$run/b")
[ "${r%% *}" = 200 ] || fail "load: $r"
out=$(answer moved)
case $out in *'"text":'*) ;; *) fail "moved did not answer: $out" ;; esac
case $out in *"$want_upper"*) fail "LEAF's negated row did not change the answer: $out" ;; esac
case $(answer upper) in *"$want_upper"*) ;; *) fail "upper changed beside the adapter with tokens" ;; esac
echo "moved: LEAF's negated row changes the answer, upper's beside it does not"

r=$(curl -s -w ' %{http_code}' "$url/generate" -d '{"text":"input: 5 leaf\noutput:","lora_path":{"adapters":[{"name":"reverse","weight":0.5},{"name":"same","weight":0.5}]}}')
case $r in *"trainable tokens"*"do not mix"*400) ;; *) fail "a mix naming same: $r" ;; esac
echo "mix: refused with a 400"

body five 1 1 2 3 4 5 >"$run/b"
r=$(post /v1/load_lora_adapter "$run/b")
case $r in '400 '*'--lora-extra-vocab-size'*) ;; *) fail "five rows: $r" ;; esac
case $(answer same) in *"$want_upper"*) ;; *) fail "same stopped answering" ;; esac
echo "capacity: five rows refused, naming the flag; still serving"
