#!/usr/bin/env bash
# bench/base.sh — the base-path benchmark and its PyTorch peer on one GPU in one call
# (docs/benchmarks.md, "The base path").
#
#   bench/base.sh prepare    here, on the build machine (nvcc, no GPU): builds bench_base_cuda
#                            into $LS_BUILD_DIR (default build-cuda/) and bundles it, with the
#                            libraries a bare GPU machine lacks, into .device-bundle-base/
#   bench/base.sh [--quick]  on the GPU machine: bench_base_cuda, then bench/peer_torch.py on
#                            the same GPU, then their join ("ours / peer / floor" a point, and
#                            the targets), printed last. Without a bundle it builds build-gpu/
#                            there first. Logs and JSON lines go to $OUT (default ./gpu-logs):
#                            base.log, base.jsonl, peer.log, peer.jsonl, join.txt.
#
# Through the device tool, after `prepare`:
#   run(command="bench/base.sh", carry=[".device-bundle-base"])
# Both sides idle LS_BASE_SETTLE seconds (default 1) before each point (--settle: a point right
# after a large one, whose memory was just freed, runs slower; docs/benchmarks.md). Each side
# stops starting points after its --max-seconds and is killed at its timeout, so the whole
# call ends within ~8 minutes. Exit status: 0 when both sides ran to the end.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
source tests/gpu/bundle.sh
bundle=.device-bundle-base

if [[ ${1:-} == prepare ]]; then
  set -e
  build=${LS_BUILD_DIR:-build-cuda}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build" -j"${LS_BUILD_JOBS:-2}" --target bench_base_cuda
  rm -rf "$bundle"
  ../shared/tools/device-bundle "$bundle" "$build/bin/bench_base_cuda"
  bundle_pack "$bundle"
  exit 0
fi
flags=(--settle "${LS_BASE_SETTLE:-1}")
case ${1:-} in
  "") ;;
  --quick) flags+=(--quick) ;;
  *) echo "usage: bench/base.sh [prepare | --quick]" >&2; exit 2 ;;
esac

out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm \
    --format=csv 2>&1 || true
} | tee "$out/device.txt"

if compgen -G "$bundle/bin/*" >/dev/null; then
  bundle_unpack "$bundle"
  export LD_LIBRARY_PATH=$root/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  bin=$bundle/bin/bench_base_cuda
else
  echo "no $bundle: building here" | tee -a "$out/build.log"
  if ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
         cmake --build build-gpu -j"$(nproc)" --target bench_base_cuda; } >>"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    echo "BUILD FAILED"
    exit 2
  fi
  bin=build-gpu/bin/bench_base_cuda
fi

status=0
echo "== bench_base_cuda ${flags[*]}"
start=$(date +%s)
timeout 250 "$bin" "${flags[@]}" --max-seconds 200 --output-file "$out/base.jsonl" >"$out/base.log" 2>&1
rc=$?
# the progress lines but the decode points' (the join has every point), then the chunked table
grep -E "^\[" "$out/base.log" | grep -vE "\] decode batch [0-9]+ ctx [0-9]+: base" | head -40
sed -n '/^== chunked/,/^$/p' "$out/base.log"
[[ $rc == 0 ]] || { tail -5 "$out/base.log"; echo "bench_base_cuda FAILED"; status=1; }
echo "bench_base_cuda: exit $rc, $(( $(date +%s) - start )) s"

echo "== peer_torch.py ${flags[*]}"
start=$(date +%s)
PYTHONUNBUFFERED=1 timeout 190 python3 bench/peer_torch.py "${flags[@]}" --max-seconds 150 \
  --output-file "$out/peer.jsonl" >"$out/peer.log" 2>&1
rc=$?
grep -E "self-check|skipped|attention|Error|error" "$out/peer.log" | head -20
[[ $rc == 0 ]] || { tail -5 "$out/peer.log"; echo "peer_torch.py FAILED"; status=1; }
echo "peer_torch.py: exit $rc, $(( $(date +%s) - start )) s"

if [[ -s $out/base.jsonl ]]; then
  echo "== ours / peer / floor"
  [[ -s $out/peer.jsonl ]] || : >"$out/peer.jsonl"
  python3 bench/peer_torch.py --join "$out/base.jsonl" "$out/peer.jsonl" | tee "$out/join.txt"
fi
exit $status
