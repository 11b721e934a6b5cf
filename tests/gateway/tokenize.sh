#!/usr/bin/env bash
# vLLM's /tokenize and /detokenize on the real graph (the demo model), each answer checked
# against loraserve-tokenize, the tokenizer library from the command line: a text with and
# without special tokens, a chat through the model's chat template (with and without the
# generation prompt), token strings, a detokenize round trip, and the errors (unknown model 404,
# bad bodies 400 naming the field, a chat template error 400 naming it).
# Usage: tokenize.sh BIN_DIR LAUNCH_SCRIPT
set -euo pipefail
bin=$1 launch=$2
here=$(cd "$(dirname "$0")/../.." && pwd)
demo=$here/examples/demo
run=$(mktemp -d /tmp/ls-gw-tok-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
graph_start "$bin" "$launch" "$run"
fail() { echo "FAIL: $*" >&2; tail -n 20 "$run/graph/logs/gateway.log" "$run/graph/logs/tokenizer.log" >&2; exit 1; }
# js EXPR: EXPR over the JSON on stdin (j), printed as JSON.
js() { node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{const j=JSON.parse(s);process.stdout.write(JSON.stringify(eval(process.argv[1])) + "\n")})' "$1"; }
post() { curl -s -w '\n%{http_code}' "$url$1" -d "$2"; }
# expect PATH BODY STATUS: the answer's body, failing unless its status is STATUS.
expect() {
    local out
    out=$(post "$1" "$2")
    [ "${out##*$'\n'}" = "$3" ] || fail "$1 $2: status ${out##*$'\n'}, want $3: ${out%$'\n'*}"
    printf '%s' "${out%$'\n'*}"
}

# A text: the ids loraserve-tokenize gives, with the BOS (vLLM's default) and without.
text='input: 5 leaf road 1 red\noutput:'
for special in true false; do
    want=$(printf '"%s"\n' "$text" | "$bin/loraserve-tokenize" encode --jsonl --tokenizer "$demo/tokenizer.json" \
           $([ $special = true ] && echo --add-special-tokens))
    got=$(expect /tokenize "{\"model\":\"demo\",\"prompt\":\"$text\",\"add_special_tokens\":$special}" 200)
    [ "$(printf '%s' "$got" | js j.tokens)" = "$want" ] || fail "/tokenize add_special_tokens=$special: $got, want $want"
    [ "$(printf '%s' "$got" | js j.count)" = "$(printf '%s' "$want" | js j.length)" ] || fail "count: $got"
    [ "$(printf '%s' "$got" | js j.max_model_len)" = 256 ] || fail "max_model_len: $got"
    [ "$(printf '%s' "$got" | js j.token_strs)" = null ] || fail "token_strs without return_token_strs: $got"
done
# Any adapter's name tokenizes alike (adapters add no vocabulary); token strings are the vocabulary's.
got=$(expect /tokenize "{\"model\":\"reverse\",\"prompt\":\"$text\",\"return_token_strs\":true}" 200)
ids=$(printf '%s' "$got" | js j.tokens)
want=$(printf '"%s"\n' "$text" | "$bin/loraserve-tokenize" encode --jsonl --add-special-tokens --tokenizer "$demo/tokenizer.json")
[ "$ids" = "$want" ] || fail "/tokenize for reverse: $got, want $want"
[ "$(printf '%s' "$got" | js 'j.token_strs.slice(0,3)')" = '["<|begin_of_text|>","input",":"]' ] || fail "token_strs: $got"

# The detokenize round trip: the text back, BOS kept (HF's decode with special tokens).
got=$(expect /detokenize "{\"model\":\"demo\",\"tokens\":$ids}" 200)
[ "$(printf '%s' "$got" | js j.prompt)" = "$(printf '"<|begin_of_text|>%s"' "$text")" ] || fail "/detokenize: $got"
want=$(printf '%s\n' "$ids" | "$bin/loraserve-tokenize" decode --jsonl --tokenizer "$demo/tokenizer.json")
[ "$(printf '%s' "$got" | js j.prompt)" = "$want" ] || fail "/detokenize: $got, loraserve-tokenize gives $want"
[ "$(expect /detokenize '{"tokens":[]}' 200)" = '{"prompt":""}' ] || fail "/detokenize of no tokens"

# A chat: the model's template rendered as loraserve-tokenize chat renders it, then encoded
# without adding specials (vLLM's default for messages; the template has them).
msgs='[{"role":"system","content":"Be brief."},{"role":"user","content":"input: cup 8 shoe\noutput:"},{"role":"assistant","content":" cup 8 shoe"},{"role":"user","content":"héllo ✓"}]'
for gen in true false; do
    rendered=$(printf '%s' "$msgs" | "$bin/loraserve-tokenize" chat --tokenizer-config "$demo" \
               $([ $gen = true ] && echo --add-generation-prompt) | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.stringify(s)))')
    want=$(printf '%s\n' "$rendered" | "$bin/loraserve-tokenize" encode --jsonl --tokenizer "$demo/tokenizer.json")
    got=$(expect /tokenize "{\"model\":\"upper\",\"messages\":$msgs,\"add_generation_prompt\":$gen}" 200)
    [ "$(printf '%s' "$got" | js j.tokens)" = "$want" ] || fail "/tokenize messages (generation prompt $gen): $got, want $want"
done
# The chat's ids are the prompt a chat completion counts.
n=$(expect /tokenize "{\"messages\":$msgs}" 200 | js j.count)
usage=$(expect /v1/chat/completions "{\"model\":\"demo\",\"messages\":$msgs,\"max_tokens\":1}" 200 | js j.usage.prompt_tokens)
[ "$n" = "$usage" ] || fail "/tokenize counts $n chat tokens, the completion $usage"

# Errors.
check_error() {  # PATH BODY STATUS PARAM TEXT
    local body
    body=$(expect "$1" "$2" "$3")
    [ "$(printf '%s' "$body" | js j.error.param)" = "$4" ] || fail "$1 $2: param in $body, want $4"
    case $body in *"$5"*) ;; *) fail "$1 $2: $body does not say '$5'" ;; esac
}
check_error /tokenize '{"model":"nope","prompt":"a"}' 404 '"model"' 'does not exist'
check_error /detokenize '{"model":"demo:nope","tokens":[1]}' 404 '"model"' 'does not exist'
check_error /tokenize '{"prompt":"a","messages":[]}' 400 '"prompt"' "exactly one of"
check_error /tokenize '{}' 400 '"messages"' "exactly one of"
check_error /tokenize '{"prompt":["a"]}' 400 '"prompt"' "must be a string"
check_error /tokenize 'not json' 400 null "not valid JSON"
check_error /tokenize '{"messages":[{"content":"a"}]}' 400 '"messages"' "'role'"
check_error /tokenize '{"prompt":"a","add_special_tokens":1}' 400 '"add_special_tokens"' "boolean"
check_error /tokenize '{"messages":[{"role":"user","content":"a"}],"chat_template":"x"}' 400 '"chat_template"' "not supported"
check_error /tokenize '{"messages":[{"role":"user","content":null}]}' 400 '"messages"' "chat template: "
check_error /detokenize '{"tokens":[1,99999]}' 400 '"tokens"' "tokens[1] = 99999 is outside the vocabulary"
check_error /detokenize '{"tokens":"1 2"}' 400 '"tokens"' "list of token ids"
check_error /detokenize '{"tokens":[-1]}' 400 '"tokens"' "list of token ids"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/tokenize")" = 405 ] || fail "GET /tokenize is not 405"
echo "tokenize: ok"
