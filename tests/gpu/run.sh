#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU tests (CUDA backend vs CPU backend) in one call.
#
#   tests/gpu/run.sh prepare   here, on the build machine (nvcc, no GPU): builds the CUDA
#                              parts into build-cuda/ and bundles the test binaries with the
#                              libraries a bare GPU machine lacks into .device-bundle/
#   tests/gpu/run.sh           on the GPU machine: runs the bundled binaries (or, without a
#                              bundle, configures and builds build-gpu/ there first), logs
#                              to $OUT (default ./gpu-logs), prints the summary table last.
#
# Through the device tool, after `prepare`:
#   run(command="tests/gpu/run.sh", carry=[".device-bundle"])
# Exit status: 0 when every test passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
tests=(test_gpu_ops)

if [[ ${1:-} == prepare ]]; then
  set -e
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-cuda -j"$(nproc)" --target "${tests[@]}"
  rm -rf .device-bundle
  ../shared/tools/device-bundle .device-bundle "${tests[@]/#/build-cuda/bin/}"
  exit 0
fi

out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv 2>&1 || true
} | tee "$out/device.txt"

if [[ -x .device-bundle/bin/${tests[0]} ]]; then
  export LD_LIBRARY_PATH=$root/.device-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  bindir=.device-bundle/bin
else
  echo "no .device-bundle: building here" | tee -a "$out/build.log"
  if ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
         cmake --build build-gpu -j"$(nproc)" --target "${tests[@]}"; } >>"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    echo "BUILD FAILED"
    exit 2
  fi
  bindir=build-gpu/bin
fi

status=0
for t in "${tests[@]}"; do
  echo "== $t"
  start=$(date +%s%N)
  LS_GPU_BENCH=1 "$bindir/$t" >"$out/$t.log" 2>&1
  rc=$?
  end=$(date +%s%N)
  # the table is the tail of the log; show the rows that failed first, then the table
  grep -E "FAIL|mismatch|failed" "$out/$t.log" | grep -v "^===" | head -40
  sed -n '/=== LoRA decode timing/,/^bench:/p' "$out/$t.log"
  sed -n '/=== summary/,$p' "$out/$t.log"
  [[ $rc == 0 ]] || { tail -5 "$out/$t.log"; status=1; }
  echo "$t: exit $rc, $(( (end - start) / 1000000 )) ms"
done
exit $status
