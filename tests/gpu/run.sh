#!/usr/bin/env bash
# tests/gpu/run.sh — the GPU tests (CUDA backend vs CPU backend) in one call.
#
#   tests/gpu/run.sh prepare   here, on the build machine (nvcc, no GPU): builds the CUDA
#                              parts into $LS_BUILD_DIR (default build-cuda/) and bundles the test and benchmark
#                              binaries with the libraries a bare GPU machine lacks into
#                              .device-bundle/
#   tests/gpu/run.sh prepare tp  the same with test_gpu_tp alone (for a 2-GPU kind: all
#                              binaries together outgrow what the device tool carries)
#   tests/gpu/run.sh prepare fp8 the same with the FP8 checks' binaries: test_gpu_ops,
#                              test_gpu_model, bench_base_cuda, dev_fp8
#   tests/gpu/run.sh prepare prefill  the same with prefill attention's binaries:
#                              test_gpu_ops, test_gpu_model, dev_attention, dev_prefill,
#                              bench_base_cuda
#   tests/gpu/run.sh prefill   on the GPU machine, after `prepare prefill`: test_gpu_ops (its
#                              attention and prefill rows shown), test_gpu_model, dev_attention and
#                              dev_prefill (their tables), bench_base_cuda --quick (prefill
#                              2K and chunked beside the decode points), ~5 min
#   tests/gpu/run.sh fp8       on the GPU machine, after `prepare fp8`: test_gpu_ops (every
#                              op; its FP8 rows shown), test_gpu_model --fp8 and
#                              bench_base_cuda --fp8 (bf16 vs FP8 decode steps), then
#                              dev_fp8 (the FP8 GEMMs at T = 1..64 and their crossover), ~4 min
#   tests/gpu/run.sh prepare paging [PROGRAM…]  the unified-paging checks: test_gpu_ops,
#                              test_gpu_model, the PROGRAMs of this tree (default: the dev
#                              bench's LoRA programs, dev_prefill and the LoRA benchmarks), and
#                              the same programs of a baseline (before the adapters were paged)
#                              from LS_GPU_BASELINE_BUILD, a CUDA build directory of it with
#                              those targets built, into .device-bundle/baseline/ (without the
#                              libraries this tree's bundle already holds, byte for byte: what
#                              travels is capped)
#   tests/gpu/run.sh paging [PROGRAM…]  on the GPU machine, after `prepare paging`: the tests,
#                              then baseline and this tree's programs alternately, twice (the
#                              spread between the rounds is the noise; LS_GPU_PAGING_ROUNDS):
#                              the PROGRAMs named, or those bundled — of dev_shrink, dev_expand,
#                              dev_fused, dev_prefill (the prefill attention on pages),
#                              bench_lora_cuda --serve and --step, bench_decode_cuda (decode
#                              ratios)
#   tests/gpu/run.sh           on the GPU machine: runs the bundled binaries (or, without a
#                              bundle, configures and builds build-gpu/ there first), logs
#                              to $OUT (default ./gpu-logs), prints the summary table last.
#                              Tests first (test_gpu_ops: every op vs the CPU backend;
#                              test_gpu_model: the whole model vs the HF fixtures and the
#                              demo; test_gpu_tp: TP=2 vs TP=1, on a machine with 2 GPUs;
#                              the dev bench's programs, whose versions of each kernel must
#                              match the CPU references), then the benchmarks
#                              (bench_lora_cuda, bench_decode_cuda) unless
#                              LS_GPU_NO_BENCH=1; with a bundle, the binaries it holds.
#
# Through the device tool, after `prepare`:
#   run(command="tests/gpu/run.sh", carry=[".device-bundle"])
# Exit status: 0 when every test passed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
source tests/gpu/bundle.sh
tests=(test_gpu_ops test_gpu_model)
# kernels/cuda/dev: every version of each op checked against the CPU reference, then timed
devs=(dev_shrink dev_expand dev_fused dev_attention dev_prefill dev_fp8 dev_gemv dev_silu dev_silu_lora
      dev_layer)
benches=(bench_lora_cuda bench_decode_cuda)

# tensor parallelism on two GPUs (NCCL): built where NCCL is, run where 2 GPUs are
tp=test_gpu_tp
# paging: the LoRA programs and the prefill attention's timed against the baseline's
paging=(dev_shrink dev_expand dev_fused dev_prefill bench_lora_cuda bench_decode_cuda)

if [[ ${1:-} == prepare ]]; then
  set -e
  build=${LS_BUILD_DIR:-build-cuda}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  bins=("${tests[@]}" "${devs[@]}" "${benches[@]}")
  if [[ ${2:-} == tp ]]; then
    [[ $(cmake --build "$build" --target help) == *"$tp"* ]] ||
      { echo "no $tp target here (NCCL missing?)"; exit 2; }
    bins=("$tp")
  elif [[ ${2:-} == fp8 ]]; then
    bins=(test_gpu_ops test_gpu_model bench_base_cuda dev_fp8)
  elif [[ ${2:-} == paging ]]; then
    [[ $# -gt 2 ]] && paging=("${@:3}")
    bins=(test_gpu_ops test_gpu_model "${paging[@]}")
    base=${LS_GPU_BASELINE_BUILD:?a CUDA build directory of the baseline, with ${paging[*]} built}
    for b in "${paging[@]}"; do [[ -x $base/bin/$b ]] || { echo "$base/bin/$b: not built"; exit 2; }; done
  elif [[ ${2:-} == prefill ]]; then
    bins=(test_gpu_ops test_gpu_model dev_attention dev_prefill bench_base_cuda)
  fi
  cmake --build "$build" -j"$(nproc)" --target "${bins[@]}"
  rm -rf .device-bundle
  ../shared/tools/device-bundle .device-bundle "${bins[@]/#/$build/bin/}"
  if [[ ${2:-} == paging ]]; then
    ../shared/tools/device-bundle .device-bundle/baseline "${paging[@]/#/$base/bin/}"
    for f in .device-bundle/baseline/lib/*; do  # found in this tree's lib/ (LD_LIBRARY_PATH)
      if cmp -s "$f" ".device-bundle/lib/${f##*/}"; then rm "$f"; fi
    done
    bundle_pack .device-bundle/baseline
  fi
  bundle_pack .device-bundle
  exit 0
fi

out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv 2>&1 || true
} | tee "$out/device.txt"

if compgen -G ".device-bundle/bin/*" >/dev/null; then
  bundle_unpack .device-bundle
  export LD_LIBRARY_PATH=$root/.device-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  bindir=.device-bundle/bin
else
  echo "no .device-bundle: building here" | tee -a "$out/build.log"
  if ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
         cmake --build build-gpu -j"$(nproc)" --target "${tests[@]}" "${devs[@]}" "${benches[@]}"; } \
       >>"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    echo "BUILD FAILED"
    exit 2
  fi
  bindir=build-gpu/bin
fi

export LS_FIXTURES_DIR=$root/tests/fixtures LS_DEMO_DIR=$root/examples/demo
if [[ ${1:-} == paging ]]; then
  [[ -d .device-bundle/baseline/bin ]] || { echo "no baseline: tests/gpu/run.sh prepare paging"; exit 2; }
  bundle_unpack .device-bundle/baseline
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$root/.device-bundle/baseline/lib
  status=0
  for t in test_gpu_ops test_gpu_model; do
    echo "== $t"
    "$bindir/$t" >"$out/$t.log" 2>&1 || status=1
    grep -E "FAIL|mismatch|failed" "$out/$t.log" | grep -v "^===" | head -40
    grep -iE "lora|local" "$out/$t.log" | grep -vE " ok$|^\[" | head -20
    sed -n '/=== summary/,$p' "$out/$t.log"
    tail -2 "$out/$t.log"
  done
  # what each program prints that says its speed
  key() {
    case $1 in
      dev_prefill) grep -E "nmse|^(512|2048|8192) |^[0-9]+ x |^prompt of|^16 " "$2" ;;
      dev_*) grep -E "tiles\):| us |FAIL|CPU reference" "$2" ;;
      bench_lora_cuda) grep -E "^serve n=|^step |^whole step|^read +step" "$2" ;;
      bench_decode_cuda) grep -E "decode ratio|distinct adapters|base model|floor" "$2" ;;
    esac
  }
  progs=("${@:2}")
  [[ ${#progs[@]} == 0 ]] && for p in "${paging[@]}"; do
    [[ -x .device-bundle/baseline/bin/$p ]] && progs+=("$p")
  done
  for ((round = 1; round <= ${LS_GPU_PAGING_ROUNDS:-2}; round++)); do
    for p in "${progs[@]}"; do
      args=()
      [[ $p == bench_lora_cuda ]] && args=(--serve)
      for side in baseline paged; do
        dir=.device-bundle/baseline/bin
        [[ $side == paged ]] && dir=$bindir
        log=$out/${p}_${side}_$round.log
        timeout 240 "$dir/$p" "${args[@]}" >"$log" 2>&1 || { status=1; tail -5 "$log"; }
        if [[ $p == bench_lora_cuda ]]; then
          timeout 120 "$dir/$p" --step >>"$log" 2>&1 || { status=1; tail -5 "$log"; }
        fi
        echo "== round $round, $p, $side"
        key "$p" "$log"
      done
    done
  done
  exit $status
fi
if [[ ${1:-} == fp8 ]]; then
  status=0
  echo "== test_gpu_ops"
  "$bindir/test_gpu_ops" >"$out/test_gpu_ops.log" 2>&1 || status=1
  grep -E "fp8|FAIL" "$out/test_gpu_ops.log"
  tail -2 "$out/test_gpu_ops.log"
  echo "== test_gpu_model --fp8"
  "$bindir/test_gpu_model" --fp8 >"$out/test_gpu_model_fp8.log" 2>&1 || status=1
  grep -vE "greedy token" "$out/test_gpu_model_fp8.log"
  echo "== bench_base_cuda --fp8"
  timeout 240 "$bindir/bench_base_cuda" --fp8 --steps 10 >"$out/bench_base_cuda_fp8.log" 2>&1 || status=1
  cat "$out/bench_base_cuda_fp8.log"
  echo "== dev_fp8"
  timeout 240 "$bindir/dev_fp8" >"$out/dev_fp8.log" 2>&1 || status=1
  grep -vE " ok$" "$out/dev_fp8.log"
  exit $status
fi
if [[ ${1:-} == prefill ]]; then
  status=0
  echo "== test_gpu_ops"
  "$bindir/test_gpu_ops" >"$out/test_gpu_ops.log" 2>&1 || status=1
  sed -n '/=== summary/,$p' "$out/test_gpu_ops.log" | grep -E "attention|prefill|FAIL"
  tail -1 "$out/test_gpu_ops.log"
  echo "== test_gpu_model"
  "$bindir/test_gpu_model" >"$out/test_gpu_model.log" 2>&1 || status=1
  grep -vE "greedy token" "$out/test_gpu_model.log"
  for d in dev_attention dev_prefill; do
    echo "== $d"
    timeout 240 "$bindir/$d" >"$out/$d.log" 2>&1 || status=1
    cat "$out/$d.log"
  done
  echo "== bench_base_cuda --quick"
  timeout 240 "$bindir/bench_base_cuda" --quick >"$out/bench_base_cuda.log" 2>&1 || status=1
  cat "$out/bench_base_cuda.log"
  exit $status
fi
status=0
have() { [[ -x $bindir/$1 ]] || { echo "== $1: not in the bundle"; return 1; }; }
for t in "${tests[@]}"; do
  have "$t" || continue
  echo "== $t"
  start=$(date +%s%N)
  "$bindir/$t" >"$out/$t.log" 2>&1
  rc=$?
  end=$(date +%s%N)
  # the rows that failed first, then the summary
  grep -E "FAIL|mismatch|failed" "$out/$t.log" | grep -v "^===" | head -40
  sed -n '/=== summary/,$p' "$out/$t.log"
  [[ $rc == 0 ]] || { tail -5 "$out/$t.log"; status=1; }
  echo "$t: exit $rc, $(( (end - start) / 1000000 )) ms"
done
# TP=2 against TP=1 on the parity fixtures, when this machine has two GPUs (nvidia-h200-x2)
n_gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ ! -x $bindir/$tp ]]; then
  echo "== $tp: not in the bundle (tests/gpu/run.sh prepare tp)"
elif [[ $n_gpus -ge 2 ]]; then
  echo "== $tp"
  "$bindir/$tp" >"$out/$tp.log" 2>&1
  rc=$?
  grep -E "FAIL|PASSED|FAILED|max" "$out/$tp.log" | tail -12
  [[ $rc == 0 ]] || { tail -5 "$out/$tp.log"; status=1; }
  echo "$tp: exit $rc"
else
  echo "== $tp: not run here ($n_gpus GPU(s); it needs 2, e.g. kind nvidia-h200-x2)"
fi
for d in "${devs[@]}"; do
  have "$d" || continue
  echo "== $d"
  timeout 300 "$bindir/$d" >"$out/$d.log" 2>&1
  rc=$?
  grep -E "FAIL" "$out/$d.log" | head -20
  tail -1 "$out/$d.log"
  [[ $rc == 0 ]] || { tail -5 "$out/$d.log"; status=1; }
  echo "$d: exit $rc"
done
if [[ ${LS_GPU_NO_BENCH:-0} != 1 ]]; then
  for b in "${benches[@]}"; do
    have "$b" || continue
    echo "== $b"
    start=$(date +%s%N)
    timeout 240 "$bindir/$b" >"$out/$b.log" 2>&1
    rc=$?
    end=$(date +%s%N)
    sed -n '/=== summary/,$p' "$out/$b.log"
    grep -E "decode ratio|distinct adapters|base model|^bench_decode" "$out/$b.log"
    [[ $rc == 0 ]] || { tail -5 "$out/$b.log"; status=1; }
    echo "$b: exit $rc, $(( (end - start) / 1000000 )) ms"
  done
fi
exit $status
