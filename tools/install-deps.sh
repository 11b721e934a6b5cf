#!/usr/bin/env bash
# Install the Debian packages loraserve builds and tests with (BRIEF §7). Idempotent: does
# nothing when they are all present. CUDA, cuBLAS and NCCL come from /usr/local/cuda when
# there; without them the CPU backend alone is built.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git python3
      libzmq3-dev libczmq-dev libmsgpack-dev libev-dev libhttp-parser-dev libcjson-dev libjansson-dev
      libpcre2-dev libutf8proc-dev libopenblas-dev libcmocka-dev libcurl4-openssl-dev
      clang libclang-rt-14-dev procps)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    # apt's resolver has refused a whole set at once on a machine where each package alone
    # installed ("held broken packages"): then one at a time, naming the one that fails
    if ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        echo "install-deps: the set at once failed; installing one at a time" >&2
        for p in "${missing[@]}"; do
            $sudo apt-get install -y -qq --no-install-recommends "$p" >/dev/null ||
                { echo "install-deps: cannot install $p" >&2; exit 1; }
        done
    fi
fi

