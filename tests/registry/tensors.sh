#!/usr/bin/env bash
# Adapters loaded from tensors, end to end: launch/loraserve on the demo model, over HTTP.
#   load      — upper's files sent as lora_config + lora_tensors (base64) under a new name
#               serve upper's greedy text; the registry's copy lies under RUN/state/tensors
#   sglang    — SGLang's /load_lora_adapter_from_tensors takes the same body; config_dict too
#   refusals  — bad base64, no or bad config, both a path and tensors, pickled tensors, a
#               truncated and a hostile safetensors, a config the checks refuse, a name in use,
#               more than --max-lora-tensor-mb: each a 400 naming the field, no copy left,
#               and the graph still serves
#   restart   — the same run directory: the adapter is back and serves
#   unload    — its copy is removed, and after another restart it stays gone
#   dp        — with --dp-size 2 a load from tensors loads in both groups
# Usage: tensors.sh BIN_DIR LAUNCH_SCRIPT DEMO_DIR
set -euo pipefail
bin=$1 launch=$2 demo=$3
run=$(mktemp -d /tmp/ls-tensors-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
logs() { tail -n 30 "$run/graph/logs/registry.log" "$run/graph/logs/gateway.log" >&2 || true; }
fail() { echo "FAIL: $*" >&2; logs; exit 1; }
# The launcher's flags for this test: a small tensor limit, so "too large" is cheap to send.
flags=(--max-lora-tensor-mb 1)
# Stop the graph, keeping its run directory (state/) for the next start; the logs move aside, so
# graph_start reads the new gateway's port.
runs=0
stop() {
    kill -INT "$pid"
    wait "$pid" || true
    pid=
    rm -f "$run/graph/graph.json"
    runs=$((runs + 1))
    mv "$run/graph/logs" "$run/logs.$runs"
}

# body.py NAME CONFIG_FILE WEIGHTS_FILE [KEY=JSON...]: a load body, upper's files by default.
body() {
    python3 - "$@" <<'PY'
import base64, json, sys
name, cfg, weights = sys.argv[1:4]
b = {"lora_name": name, "lora_config": json.load(open(cfg)),
     "lora_tensors": base64.b64encode(open(weights, "rb").read()).decode()}
for kv in sys.argv[4:]:
    k, v = kv.split("=", 1)
    if v == "DEL":
        b.pop(k, None)
    else:
        b[k] = json.loads(v)
print(json.dumps(b))
PY
}
up=$demo/adapters/upper
post() { # ROUTE BODY_FILE: prints "STATUS BODY"
    curl -s -o "$run/resp" -w '%{http_code}' "$url$1" -H 'Content-Type: application/json' --data-binary "@$2" >"$run/code"
    echo "$(cat "$run/code") $(cat "$run/resp")"
}
answer() { # MODEL WANT
    local out
    out=$(curl -s -w '\n%{http_code}' "$url/v1/completions" \
        -d "{\"model\":\"$1\",\"prompt\":\"input: 5 leaf road 1 red\\noutput:\",\"max_tokens\":24,\"temperature\":0}")
    case $out in
        *"\"text\":\" $2\""*200) ;;
        *) fail "$1 did not answer \"$2\": $out" ;;
    esac
}
want_upper='5 LEAF ROAD 1 RED'
copies() { find "$run/graph/state/tensors" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }

graph_start "$bin" "$launch" "$run" "${flags[@]}"
body t_upper "$up/adapter_config.json" "$up/adapter_model.safetensors" >"$run/b"
r=$(post /v1/load_lora_adapter "$run/b")
[ "${r%% *}" = 200 ] || fail "load from tensors: $r"
answer t_upper "$want_upper"
answer upper "$want_upper"
[ "$(copies)" = 1 ] || fail "expected one copy under state/tensors, found $(copies)"
copy=$(find "$run/graph/state/tensors" -mindepth 1 -maxdepth 1)
cmp -s "$copy/adapter_model.safetensors" "$up/adapter_model.safetensors" || fail "the copy's weights differ"
[ "$(stat -c %a "$copy")" = 700 ] && [ "$(stat -c %a "$copy/adapter_model.safetensors")" = 600 ] ||
    fail "the copy is not private: $(stat -c '%a %n' "$copy" "$copy"/*)"
curl -s "$url/v1/models" | grep -q '"id":"t_upper"' || fail "t_upper is not listed"
echo "load: upper's files as tensors serve upper's text; one private copy in state/tensors"

body s_upper "$up/adapter_config.json" "$up/adapter_model.safetensors" >"$run/b"
python3 -c "import json,sys; b=json.load(open(sys.argv[1])); b['config_dict']=b.pop('lora_config'); json.dump(b,open(sys.argv[1],'w'))" "$run/b"
r=$(post /load_lora_adapter_from_tensors "$run/b")
case $r in '200 {"success":true'*) ;; *) fail "SGLang's route: $r" ;; esac
answer s_upper "$want_upper"
echo "sglang: /load_lora_adapter_from_tensors with config_dict serves"

refused() { # WHAT ROUTE BODY_FILE PARAM TEXT
    local r
    r=$(post "$2" "$3")
    case $r in
        "400 "*"\"param\":\"$4\""*) ;;
        *) fail "$1: expected 400 naming $4, got $r" ;;
    esac
    case $r in *"$5"*) ;; *) fail "$1: the answer does not say \"$5\": $r" ;; esac
}
n0=$(copies)
printf '{"lora_name":"x","lora_config":{},"lora_tensors":"Zm9v\\nYmFy"}' >"$run/b"
refused "bad base64" /v1/load_lora_adapter "$run/b" lora_tensors "not valid base64"
body x "$up/adapter_config.json" "$up/adapter_model.safetensors" lora_config=DEL >"$run/b"
refused "no config" /v1/load_lora_adapter "$run/b" lora_config "adapter_config.json object"
body x "$up/adapter_config.json" "$up/adapter_model.safetensors" 'lora_config=[1]' >"$run/b"
refused "config not an object" /v1/load_lora_adapter "$run/b" lora_config "adapter_config.json object"
body x "$up/adapter_config.json" "$up/adapter_model.safetensors" 'lora_path="/x"' >"$run/b"
refused "path and tensors" /v1/load_lora_adapter "$run/b" lora_tensors "not both"
body x "$up/adapter_config.json" "$up/adapter_model.safetensors" 'serialized_tensors="gASV"' >"$run/b"
refused "pickled tensors" /load_lora_adapter_from_tensors "$run/b" serialized_tensors "pickled"
head -c 1000 "$up/adapter_model.safetensors" >"$run/trunc"
body x "$up/adapter_config.json" "$run/trunc" >"$run/b"
refused "truncated safetensors" /v1/load_lora_adapter "$run/b" lora_name "exceeds the file"
# A header that promises more than the file holds, and offsets that overlap.
python3 - "$run/hostile" <<'PY'
import json, struct, sys
h = json.dumps({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight":
                {"dtype": "F32", "shape": [65536, 65536], "data_offsets": [0, 17179869184]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"\0" * 64)
PY
body x "$up/adapter_config.json" "$run/hostile" >"$run/b"
refused "hostile safetensors" /v1/load_lora_adapter "$run/b" lora_name "exceed the data section"
body x "$up/adapter_config.json" "$up/adapter_model.safetensors" 'lora_config={"peft_type":"LORA","r":512,"lora_alpha":16,"target_modules":["q_proj"]}' >"$run/b"
refused "rank above the limit" /v1/load_lora_adapter "$run/b" lora_name "rank"
body t_upper "$up/adapter_config.json" "$up/adapter_model.safetensors" >"$run/b"
refused "name in use" /v1/load_lora_adapter "$run/b" lora_name "already loaded"
head -c $((1024 * 1024 + 3)) /dev/zero >"$run/big"
body x "$up/adapter_config.json" "$run/big" >"$run/b"
r=$(post /v1/load_lora_adapter "$run/b")
case $r in '400 '*'"param":"lora_tensors"'*'"code":"too_large"'*) ;; *) fail "over --max-lora-tensor-mb: $r" ;; esac
case $r in *"--max-lora-tensor-mb"*) ;; *) fail "the too-large answer does not name the flag: $r" ;; esac
sleep 0.5  # removals follow the answers by a moment at most
[ "$(copies)" = "$n0" ] || fail "refused loads left copies: $(copies), not $n0"
answer t_upper "$want_upper"
echo "refusals: bad base64, bad config, path and tensors, pickles, truncated, hostile, rank, name, size: 400s, no copies, still serving"

stop
graph_start "$bin" "$launch" "$run" "${flags[@]}"
answer t_upper "$want_upper"
answer s_upper "$want_upper"
echo "restart: both adapters from tensors are back and serve"

printf '{"lora_name":"t_upper"}' >"$run/b"
r=$(post /v1/unload_lora_adapter "$run/b")
[ "${r%% *}" = 200 ] || fail "unload: $r"
[ ! -e "$copy" ] || fail "the unloaded adapter's copy $copy is still there"
stop
mkdir -p "$run/graph/state/tensors/.tmp-0123456789abcdef"  # a crash's leftover, swept at start
graph_start "$bin" "$launch" "$run" "${flags[@]}"
r=$(curl -s -w ' %{http_code}' "$url/v1/completions" -d '{"model":"t_upper","prompt":"x","max_tokens":2}')
case $r in *404) ;; *) fail "t_upper after unload and restart: $r" ;; esac
[ "$(copies)" = 1 ] || fail "expected only s_upper's copy after the restart, found $(copies)"
answer s_upper "$want_upper"
echo "unload: the copy is gone, the adapter stays gone after a restart, a crash's leftover is swept"

stop
graph_start "$bin" "$launch" "$run" "${flags[@]}" --dp-size 2
body dp_upper "$up/adapter_config.json" "$up/adapter_model.safetensors" >"$run/b"
r=$(post /v1/load_lora_adapter "$run/b")
[ "${r%% *}" = 200 ] || fail "load from tensors with --dp-size 2: $r"
for g in 0 1; do
    grep -q "dp_upper" "$run/graph/logs/scheduler-$g.log" || fail "group $g's scheduler never heard of dp_upper"
done
for _ in 1 2 3 4; do answer dp_upper "$want_upper"; done
echo "dp: a load from tensors loads in both groups and serves"
