#!/usr/bin/env bash
# Added vocabulary end to end: launch/loraserve on the demo model (vocab_size 824, tied
# embeddings) with --lora-extra-vocab-size 4, an adapter directory as PEFT saves one after
# tokenizer.add_tokens and resize_token_embeddings: upper's LoRA, a tokenizer.json adding
# " LEAF2" (id 824) and "<road2>" (825, special), trainable_token_indices [824, 825] with their
# rows: LEAF's and ROAD's rows times 1.5 (so where upper answers LEAF or ROAD, the adapter
# answers its new token).
#   tokenize    — /tokenize with the adapter turns " LEAF2" into 824; the base does not
#   detokenize  — /detokenize with the adapter gives the added tokens' text; the base refuses
#   generate    — the adapter's greedy answer has " LEAF2" where upper's has " LEAF"; a prompt
#                 holding the added tokens (as text and as input_ids) runs
#   stop        — the added token's text is a stop string like any other
#   skip        — the adapter's answer holds "<road2>" where upper's holds " ROAD": left out by
#                 skip_special_tokens (the default), there with it false (text and logprobs)
#   base        — input_ids with 824 for the base model (and upper): a 400
#   capacity    — five added tokens against the four a slot holds: a 400 naming the flag
# Usage: vocab.sh BIN_DIR LAUNCH_SCRIPT DEMO_DIR
set -euo pipefail
bin=$1 launch=$2 demo=$3
run=$(mktemp -d)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
fail() { echo "FAIL: $*" >&2; tail -n 30 "$run/graph/logs/registry.log" "$run/graph/logs/worker-0.log" "$run/graph/logs/tokenizer.log" >&2 || true; exit 1; }

# adapter DIR N: upper's LoRA in DIR with N added tokens (the first two as in the header, then
# " EXTRAk"), trainable_token_indices naming all of them, rows scaled copies of base rows
adapter() {
    PYTHONPATH="$(dirname "$0")/../common" python3 - "$demo" "$@" <<'PY'
import json, os, struct, sys
from upper_rows import embedding, with_rows
demo, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(out, exist_ok=True)
vocab, hidden, table = embedding(demo)
def bf16(i): return struct.unpack("<%dH" % hidden, table[i * hidden * 2:(i + 1) * hidden * 2])
def f32(h16): return struct.unpack("<f", struct.pack("<I", h16 << 16))[0]
def to16(x): return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
rows = bytearray()
src = [(642, 1.5), (767, 1.5)] + [(100 + k, 1.0) for k in range(n - 2)]  # LEAF, ROAD, others
for i, scale in src[:n]:
    rows += struct.pack("<%dH" % hidden, *[to16(f32(v) * scale) for v in bf16(i)])
st, cfg = with_rows(demo, rows, range(vocab, vocab + n))
open(out + "/adapter_model.safetensors", "wb").write(st)
json.dump(cfg, open(out + "/adapter_config.json", "w"))
tok = json.load(open(demo + "/tokenizer.json"))
names = [" LEAF2", "<road2>"] + [" EXTRA%d" % k for k in range(n - 2)]
for k, c in enumerate(names[:n]):
    tok["added_tokens"].append({"id": vocab + k, "content": c, "single_word": False, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": c == "<road2>"})
json.dump(tok, open(out + "/tokenizer.json", "w"))
PY
}
post() { # ROUTE JSON: prints "STATUS BODY"
    curl -s -o "$run/resp" -w '%{http_code}' "$url$1" -H 'Content-Type: application/json' -d "$2" >"$run/code"
    echo "$(cat "$run/code") $(cat "$run/resp")"
}
prompt='input: 5 leaf road 1 red\noutput:'

mkdir -p "$run/adapters"
adapter "$run/adapters/vocab" 2
adapter "$run/adapters/five" 5
graph_start "$bin" "$launch" "$run" --lora-extra-vocab-size 4 --lora-roots "$run/adapters"
r=$(post /v1/load_lora_adapter "{\"lora_name\":\"vocab\",\"lora_path\":\"$run/adapters/vocab\"}")
[ "${r%% *}" = 200 ] || fail "load: $r"

r=$(post /tokenize '{"model":"vocab","prompt":"input: 5 LEAF2 <road2> 1"}')
case $r in '200 '*',824,'*',825,'*) ;; *) fail "tokenize with the adapter: $r" ;; esac
r=$(post /tokenize '{"model":"demo","prompt":"input: 5 LEAF2 <road2> 1"}')
case $r in '200 '*824*|'200 '*825*) fail "the base tokenized an added token: $r" ;; '200 '*) ;; *) fail "tokenize: $r" ;; esac
echo "tokenize: the adapter's added tokens are its ids; the base's text stays plain"

r=$(post /detokenize '{"model":"vocab","tokens":[642, 824, 825]}')
case $r in '200 '*'"prompt":" LEAF LEAF2<road2>"'*) ;; *) fail "detokenize with the adapter: $r" ;; esac
r=$(post /detokenize '{"model":"demo","tokens":[642, 824]}')
case $r in '400 '*) ;; *) fail "the base decoded an added id: $r" ;; esac
echo "detokenize: the adapter's ids decode to its tokens' text; the base refuses them"

upper=$(post /v1/completions "{\"model\":\"upper\",\"prompt\":\"$prompt\",\"max_tokens\":12,\"temperature\":0}")
case $upper in *'"text":" 5 LEAF ROAD 1 RED'*) ;; *) fail "upper: $upper" ;; esac
out=$(post /v1/completions "{\"model\":\"vocab\",\"prompt\":\"$prompt\",\"max_tokens\":12,\"temperature\":0}")
case $out in '200 '*'"text":" 5 LEAF2'*) ;; *) fail "the adapter's answer has no LEAF2 where upper's has LEAF: $out" ;; esac
r=$(post /v1/completions "{\"model\":\"vocab\",\"prompt\":\"input: 5 LEAF2 <road2> 1 red\\noutput:\",\"max_tokens\":8,\"temperature\":0}")
case $r in '200 '*'"text":'*) ;; *) fail "a prompt with the added tokens: $r" ;; esac
r=$(post /generate '{"lora_path":"vocab","input_ids":[0, 824, 825, 470],"sampling_params":{"temperature":0,"max_new_tokens":4}}')
case $r in '200 '*'"text":'*) ;; *) fail "input_ids with the added ids for the adapter: $r" ;; esac
echo "generate: the adapter answers its added token where upper answers LEAF; prompts holding them run"

r=$(post /v1/completions "{\"model\":\"vocab\",\"prompt\":\"$prompt\",\"max_tokens\":12,\"temperature\":0,\"stop\":[\" LEAF2\"]}")
case $r in '200 '*'"text":" 5"'*'"finish_reason":"stop"'*) ;; *) fail "the added token as a stop string: $r" ;; esac
echo "stop: the added token's text stops the answer"

case $out in *'"text":" 5 LEAF2 1 RED"'*) ;; *) fail "the special <road2> was not skipped: $out" ;; esac
r=$(post /v1/completions "{\"model\":\"vocab\",\"prompt\":\"$prompt\",\"max_tokens\":12,\"temperature\":0,\"skip_special_tokens\":false,\"logprobs\":1}")
case $r in '200 '*'"text":" 5 LEAF2<road2> 1 RED'*'"tokens":[" 5"," LEAF2","<road2>"'*) ;; *) fail "skip_special_tokens false: $r" ;; esac
r=$(post /detokenize '{"model":"vocab","tokens":[825, 642]}')
case $r in '200 '*'"prompt":"<road2> LEAF"'*) ;; *) fail "detokenize keeps the special token: $r" ;; esac
echo "skip: special added tokens follow skip_special_tokens"

for model in '' '"lora_path":"upper",'; do
    r=$(post /generate "{$model\"input_ids\":[0, 824, 470],\"sampling_params\":{\"max_new_tokens\":2}}")
    case $r in '400 '*vocabulary*) ;; *) fail "input_ids with 824 without the adapter ($model): $r" ;; esac
done
echo "base: an added id without its adapter is a 400"

r=$(post /v1/load_lora_adapter "{\"lora_name\":\"five\",\"lora_path\":\"$run/adapters/five\"}")
case $r in '400 '*'--lora-extra-vocab-size'*) ;; *) fail "five added tokens: $r" ;; esac
case $(post /v1/completions "{\"model\":\"vocab\",\"prompt\":\"$prompt\",\"max_tokens\":4,\"temperature\":0}") in
    '200 '*) ;; *) fail "vocab stopped answering" ;; esac
echo "capacity: five added tokens refused, naming the flag; still serving"
