#!/usr/bin/env bash
# tests/gpu/serve.sh — the whole actor graph on a GPU, measured end to end, in one call.
#
#   tests/gpu/serve.sh prepare   here (nvcc, no GPU): builds the CUDA build ($LS_BUILD_DIR,
#                                default build-cuda), bundles every actor, the launcher,
#                                loraserve-bench, loraserve-make-adapters and
#                                bench_serve_engine with the libraries a bare GPU machine lacks,
#                                and a Llama-3-8B directory without weights
#                                (tools/make_dummy_model.py: config.json and a 128K tokenizer),
#                                into .device-serve/
#   tests/gpu/serve.sh [STAGE…]  on the GPU machine: runs the stages (default: all), logs and
#                                JSON reports to $OUT (default ./serve-logs), the summary last.
#
# Stages (each prints its rows as it ends; the summary table repeats them):
#   overhead  the same closed-loop workload (128 prompt + 128 new tokens, greedy, ignore_eos)
#             on the engine alone (bench_serve_engine: the scheduler core and the worker's step
#             in one process) and through the graph over HTTP (loraserve-bench), at 64 and 128
#             concurrent requests, base model and 8 adapters: graph / engine; and where the
#             graph's time goes (each actor's busy time, the scheduler's step round trips
#             against the workers' step time)
#   adapters  Zipf(1) over 1, 8, 100, 1000 and 2000 adapters (ranks 8, 16, 32, 64 mixed;
#             q,k,v,o and, separately, all seven targets), loaded on demand from --lora-dirs,
#             closed loop at 128 concurrent (saturating) and Poisson at 70% of the base
#             model's request rate: throughput / base, p99 TTFT, cold loads
#   coldload  rank-16 adapters on all seven targets (84 MB) loaded on demand one at a time
#             while 64 base-model requests decode: their time to first token, the worker's
#             load time, the base requests' TPOT with and without the loads
#   slo       (not in the default set) throughput at the same p99 TTFT SLO: Poisson arrivals
#             with no client cap at rising rates (LS_SERVE_SLO_RATES, default 1.0-1.4: fractions
#             of the base model's closed-loop rate at 128 concurrent; LS_SERVE_SLO_PROMPTS, 2048,
#             requests each: shorter runs end before a queue builds), one q,k,v,o adapter
#             against Zipf(1) over 1,000 (LS_SERVE_SLO_ADAPTERS, "1 1000"; "1 1000 2000" needs
#             a second call's time), ranks 8-64 mixed; each one's goodput is the rate where its
#             p99 TTFT crosses LS_SERVE_SLO_TTFT_MS (1000), linear between the rates around it
#             (a failed request counts as past it), and its ratio to the first's is printed
#             last; each configuration is warmed first with as many requests of its mix, and
#             each rate's row counts the adapters its run loaded from disk ("disk")
#   recovery  (not in the default set) the worker SIGKILLed under load: time until it is Ready
#             and /health answers again, the requests in flight answered, none hanging
#   hops      (not in the default set) a traced run: where a step's hop between the
#             scheduler and the worker goes
#   kernels   (not in the default set) the engine alone (LS_SERVE_KERNEL_SPECS), by default at
#             64 concurrent, base and 8 adapters
#             in slots of rank 64 and 16, with a CUPTI trace: kernel time per kind of step
#             (with prompt tokens, decode only) and kernel
#   dp        (not in the default set; 2 GPUs, e.g. kind nvidia-h100-x2) --dp-size 2 against
#             one group: Zipf(1) over 100 q,k,v,o adapters, closed loop at 128 concurrent per
#             group, then Poisson at 70% of one group's rate per group: throughput ratio, p99
#             TTFT and median TPOT of each
#   structured (not in the default set) the grammar masks' cost: 64 concurrent base-model
#             requests plain, then each under a JSON schema (a string of 1,000 characters)
#             twice — the first run computes the masks of the states it reaches, the second finds
#             them cached — then plain again: median TPOT against the first plain run's
#   paging    (not in the default set; needs the baseline, below) one GPU pool of pages for
#             the KV cache and the adapters (docs/memory.md) against the baseline's split
#             pools at the same memory: the baseline's KV cache of LS_SERVE_PAGING_KV_MB
#             (16384) and LS_SERVE_PAGING_SLOTS (32) slots of rank 64 on all seven targets,
#             against one pool of their sum with LS_SERVE_PAGING_HANDLES (128) handles. Zipf(1)
#             over 100 adapters of ranks 8/16/32/64 (all seven targets), 1024 + 256 tokens
#             (LS_SERVE_PAGING_LEN), closed loop at 256: the most requests running at once and
#             adapters in GPU slots (/metrics sampled every 0.2 s), throughput, p99 TTFT,
#             median TPOT; then 8
#             adapters of rank 16 against the base model at 64 concurrent, 128 + 128 tokens,
#             on each side: the decode ratio (tok/s over base) of each
#   tpnodes   (not in the default set; 2 GPUs) the demo model with --tp-size 2 over two
#             launchers as two hosts on this machine (127.0.0.1 and 127.0.0.2, tcp, CURVE)
#             against one worker: the greedy text of the base model and each demo adapter
#
# The model is Llama-3-8B shaped with random weights (--load-format dummy); outputs are
# meaningless, timings are real. Adapter names beyond the distinct adapters written are hard
# links to them (2,000 distinct files of mixed ranks need ~100 GB, more than the machine's
# disk): the server has no content dedupe, so each name is loaded, held and uploaded on its own.
#
# LS_SERVE_BASELINE_BUILD=DIR at `prepare`: DIR is a CUDA build of a baseline tree (before the
# adapters were paged) with the launcher and the actors built; they are bundled into
# .device-serve/baseline/ for the paging stage.
#
# Through the device tool, after `prepare`:
#   run(command="tests/gpu/serve.sh", carry=[".device-serve"])
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
source tests/gpu/bundle.sh
bundle=.device-serve
bins=(loraserve-launch loraserve-gateway loraserve-tokenizer loraserve-registry loraserve-scheduler
      loraserve-worker loraserve-detokenizer loraserve-dispatcher loraserve-bench loraserve-make-adapters bench_serve_engine
      loraserve-trace)

if [[ ${1:-} == prepare ]]; then
  set -e
  build=${LS_BUILD_DIR:-build-cuda}
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  # LS_SERVE_TESTS="test_gpu_ops test_gpu_model": GPU tests too (run first on the device), to
  # check what the serving run depends on in the same call
  read -r -a extra <<<"${LS_SERVE_TESTS:-}"
  bins+=("${extra[@]}")
  cmake --build "$build" -j"$(nproc)" --target "${bins[@]}"
  rm -rf "$bundle"
  ../shared/tools/device-bundle "$bundle" "${bins[@]/#/$build/bin/}"
  python3 tools/make_dummy_model.py "$bundle/model"
  if [[ -n ${LS_SERVE_BASELINE_BUILD:-} ]]; then
    base=(loraserve-launch loraserve-gateway loraserve-tokenizer loraserve-registry loraserve-scheduler
          loraserve-worker loraserve-detokenizer loraserve-dispatcher)
    ../shared/tools/device-bundle "$bundle/baseline" "${base[@]/#/$LS_SERVE_BASELINE_BUILD/bin/}"
    for f in "$bundle"/baseline/lib/*; do  # found in this tree's lib/: what travels is capped
      if cmp -s "$f" "$bundle/lib/${f##*/}"; then rm "$f"; fi
    done
    bundle_pack "$bundle/baseline"
  fi
  bundle_pack "$bundle"
  exit 0
fi

# Logs and reports go to a work directory; $OUT gets the summary, every JSON report in one
# file and the logs as one archive (the device tool brings back few files).
dest=${OUT:-$root/serve-logs}
out=/tmp/serve-work
rm -rf "$out"
mkdir -p "$out" "$dest"
bundle_unpack "$bundle"
export LD_LIBRARY_PATH=$root/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ -d $bundle/baseline/bin ]]; then  # the paging stage's baseline: its libraries not in ours
  bundle_unpack "$bundle/baseline"
  LD_LIBRARY_PATH+=:$root/$bundle/baseline/lib
fi
bin=$root/$bundle/bin
# LS_SERVE_MODEL / _BACKEND / _LOAD_FORMAT / _PROMPTS_PER_SLOT: a smoke run of this script on a
# machine without a GPU (the demo model on the CPU backend, few prompts)
model=${LS_SERVE_MODEL:-$root/$bundle/model}
backend=${LS_SERVE_BACKEND:-cuda}
format=${LS_SERVE_LOAD_FORMAT:-dummy}
per_slot=${LS_SERVE_PROMPTS_PER_SLOT:-6}
kv_mb=${LS_SERVE_KV_MB:-16384}
cpu_lora_mb=${LS_SERVE_CPU_LORA_MB:-49152}
# adapter slots: as many as requests run at once (128), so the LoRA constraint never holds a
# request back; 128 slots of rank 64 on all seven targets take 43 GB (an H200; on an H100
# LS_SERVE_SLOTS=64)
slots=${LS_SERVE_SLOTS:-128}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
card=${card:-$backend}
echo "date: $(date -u +%FT%TZ); card: $card" | tee "$out/device.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv >>"$out/device.txt" 2>&1

stages=("$@")
[[ ${#stages[@]} == 0 ]] && stages=(overhead coldload adapters)
summary=$out/summary.txt
: >"$summary"
row() { printf '%s\n' "$*" | tee -a "$summary"; }

# The graph's common flags: a Llama-3-8B with random weights on GPU 0, room for 128 requests
# of 256 tokens, $slots adapter slots of rank 64 and a host tier of $cpu_lora_mb MB.
graph_flags=(--model-path "$model" --load-format "$format" --backend "$backend" --port 30000 --kv-cache-mb "$kv_mb"
             --max-loras-per-batch "$slots" --max-lora-rank 64 --max-cpu-lora-mb "$cpu_lora_mb" --max-running-requests 256
             --ready-timeout 600 --actor-log-level warn)
# LS_SERVE_GRAPH_FLAGS: more launcher flags for every graph of the run (e.g. --disable-overlap-schedule)
read -r -a more_flags <<<"${LS_SERVE_GRAPH_FLAGS:-}"
graph_flags+=("${more_flags[@]}")
url=http://127.0.0.1:30000
gpid=

graph_start() {  # RUN_DIR [extra flags]
  local rd=$1
  shift
  rm -rf "$rd"
  "$bin/loraserve-launch" --bin-dir "$bin" --run-dir "$rd" "${graph_flags[@]}" "$@" >"$rd.launch.log" 2>&1 &
  gpid=$!
  for _ in $(seq 1200); do
    [[ -f $rd/graph.json ]] && return 0
    kill -0 "$gpid" 2>/dev/null || break
    sleep 0.5
  done
  echo "the graph did not start:"; tail -20 "$rd.launch.log"; tail -n 5 "$rd"/logs/*.log
  return 1
}

graph_start_with() {  # RUN_DIR FLAGS…: the same, with only the given flags (another model)
  local saved=("${graph_flags[@]}")
  graph_flags=()
  graph_start "$@"
  local rc=$?
  graph_flags=("${saved[@]}")
  return $rc
}

graph_stop() {
  [[ -n $gpid ]] && { kill -INT "$gpid" 2>/dev/null; wait "$gpid" 2>/dev/null; }
  gpid=
}
trap graph_stop EXIT

# Each actor's busy time and the scheduler's step accounting over a run: the change of their
# /metrics series between two snapshots, over the run's wall time.
snap() { env -u LD_LIBRARY_PATH curl -s "$url/metrics" >"$1"; }
graph_time() {  # LABEL BEFORE AFTER WALL_S
  python3 - "$@" <<'EOF'
import re, sys
label, before, after, wall = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def read(path):
    v = {}
    for line in open(path):
        m = re.match(r"loraserve_(\w+)\{actor=\"([\w-]+)\"\} (\d+)", line)
        if m:
            v[(m.group(1), m.group(2))] = int(m.group(3))
    return v
b, a = read(before), read(after)
d = {k: a[k] - b.get(k, 0) for k in a}
busy = " ".join("%s %.0f%%" % (actor, 100 * d[(n, actor)] / 1e6 / wall)
                for (n, actor) in sorted(d) if n == "busy_us_total")
rt, wk, st = (d.get((k, "scheduler"), 0) for k in ("step_roundtrip_us_total", "step_worker_us_total", "steps"))
st = max(st, 1)
# A step's round trip (with overlap scheduling it holds the step before it too) and the worker's
# own time; a step every wall/steps, and the gap between steps (the hops a step waits for, what
# overlap scheduling leaves of them; the run's ramp up and down included)
print("%s: busy (share of %.1f s) %s; %d steps: round trip %.3f ms, worker %.3f ms; one every %.3f ms (gap %.3f)"
      % (label, wall, busy, st, rt / st / 1e3, wk / st / 1e3, wall * 1e3 / st, wall * 1e3 / st - wk / st / 1e3))
EOF
}

per_load() {  # LOADS US_TOTAL: mean ms per load, "-" without loads
  python3 -c 'import sys; n = float(sys.argv[1]); print("%.1f" % (float(sys.argv[2]) / 1e3 / n) if n > 0 else "-")' \
    "$1" "$2" 2>/dev/null || echo -
}

jget() {  # FILE KEY: the key of the last JSON line
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1]).get(sys.argv[2], "nan"))' "$1" "$2"
}

common=(--input-len 128 --output-len 128 --range-ratio 1 --seed 7)

stage_overhead() {
  row "== overhead: engine alone vs the graph over HTTP ($card; 128+128 tokens, greedy, closed loop)"
  mkdir -p /tmp/ad-ov
  "$bin/loraserve-make-adapters" --model-path "$model" --output /tmp/ad-ov --num-adapters 8 --ranks 16 \
    --targets all --seed 3 --quiet --overwrite
  # the graph as it runs by default (overlap scheduling) and with one step in flight
  row "$(printf '%-22s %10s %10s %8s %10s %8s %14s %14s' workload engine graph ratio 'graph-1' ratio-1 'p99ttft eng' 'p99ttft graph')"
  for adapters in base 8; do
    local sel=(--adapter-dist base)
    [[ $adapters == 8 ]] && sel=(--adapter-dist uniform --num-adapters 8 --adapter-prefix lora)
    for c in 64 128; do
      local np=$((c * per_slot)) tag=${adapters}_c$c
      "$bin/bench_serve_engine" --model-path "$model" --load-format "$format" --backend "$backend" --kv-cache-mb "$kv_mb" \
        --max-loras-per-batch "$slots" --max-lora-rank 64 --max-cpu-lora-mb 8192 --lora-dir /tmp/ad-ov \
        "${sel[@]}" --num-prompts $np --warmup-requests $c --max-concurrency $c \
        "${common[@]}" --output-file "$out/engine_$tag.json" >"$out/engine_$tag.log" 2>&1 ||
        { tail -n 5 "$out/engine_$tag.log"; }
      local mode
      for mode in overlap one; do
        local flags=(--lora-dirs /tmp/ad-ov) suffix=
        [[ $mode == one ]] && flags+=(--disable-overlap-schedule) suffix=_one
        graph_start /tmp/ls-ov "${flags[@]}" || return 1
        # the engine loads its adapters before the clock starts: so does the graph here
        [[ $adapters == 8 ]] && "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" --num-prompts 32 \
          --max-concurrency 32 --input-len 16 --output-len 2 --disable-tqdm >/dev/null 2>&1
        snap "$out/m0"
        local t0=$(date +%s.%N)
        "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" --num-prompts $np --warmup-requests $c --max-concurrency $c --request-rate inf "${common[@]}" \
          --disable-tqdm --output-file "$out/graph_$tag$suffix.json" >"$out/graph_$tag$suffix.log" 2>&1 ||
          { tail -n 5 "$out/graph_$tag$suffix.log"; }
        local t1=$(date +%s.%N)
        snap "$out/m1"
        graph_time "graph $tag $mode" "$out/m0" "$out/m1" "$(python3 -c "print($t1 - $t0)")" >"$out/time_$tag$suffix.txt"
        graph_stop
      done
      local e g g1
      e=$(jget "$out/engine_$tag.json" output_throughput)
      g=$(jget "$out/graph_$tag.json" output_throughput)
      g1=$(jget "$out/graph_${tag}_one.json" output_throughput)
      row "$(printf '%-22s %10.1f %10.1f %8.3f %10.1f %8.3f %14.1f %14.1f' "$adapters c=$c tok/s" "$e" "$g" \
        "$(python3 -c "print($g / $e)")" "$g1" "$(python3 -c "print($g1 / $e)")" "$(jget "$out/engine_$tag.json" p99_ttft_ms)" \
        "$(jget "$out/graph_$tag.json" p99_ttft_ms)")"
      row "  $(cat "$out/time_$tag.txt")"
      row "  $(cat "$out/time_${tag}_one.txt")"
    done
  done
}

# Kernel time by kind of step and kernel (CUPTI trace of the engine alone). Each spec of
# LS_SERVE_KERNEL_SPECS (default: base, then 8 adapters of rank 16 on all seven targets in
# slots of rank 64 and 16, at 64 concurrent) is ADAPTERS:RMAX[:RANK[:TARGETS[:CONCURRENCY]]]
# (ADAPTERS "base", a count (uniform over them), or qkvoN / allN: Zipf(1) over N names of the
# adapters stage's mixed-rank sets, in $slots slots; RANK and TARGETS are then unused).
stage_kernels() {
  local specs
  read -r -a specs <<<"${LS_SERVE_KERNEL_SPECS:-base:64 8:64 8:16}"
  row "== kernels: kernel time per step kind, the engine alone ($card)"
  local engine=${LS_SERVE_ENGINE:-$bin/bench_serve_engine}  # another build, to compare
  for v in "${specs[@]}"; do
    local adapters rmax rank targets conc
    IFS=: read -r adapters rmax rank targets conc <<<"$v"
    rank=${rank:-16} targets=${targets:-all} conc=${conc:-64}
    local tag=kernels_${v//[:,]/_} dir=/tmp/ad-k-$rank-${targets//,/} n_slots=64 cpu_mb=8192
    local sel=(--adapter-dist base)
    if [[ $adapters =~ ^(qkvo|all)([0-9]+)$ ]]; then
      local prefix=${BASH_REMATCH[1]}
      dir=/tmp/ad-$prefix n_slots=$slots cpu_mb=$cpu_lora_mb
      sel=(--adapter-dist zipf:1 --num-adapters "${BASH_REMATCH[2]}" --adapter-prefix "$prefix")
      if [[ ! -d $dir ]]; then
        if [[ $prefix == qkvo ]]; then make_set qkvo q,k,v,o 200 2000; else make_set all all 80 2000; fi || return 1
      fi
    else
      [[ -d $dir ]] || "$bin/loraserve-make-adapters" --model-path "$model" --output "$dir" --num-adapters 8 \
        --ranks "$rank" --targets "$targets" --seed 3 --quiet --overwrite
      [[ $adapters != base ]] && sel=(--adapter-dist uniform --num-adapters "$adapters" --adapter-prefix lora)
    fi
    "$engine" --model-path "$model" --load-format "$format" --backend "$backend" --kv-cache-mb "$kv_mb" \
      --max-loras-per-batch "$n_slots" --max-lora-rank "$rmax" --max-cpu-lora-mb "$cpu_mb" --lora-dir "$dir" \
      "${sel[@]}" --num-prompts $((2 * conc)) --warmup-requests "$conc" --max-concurrency "$conc" --trace "$out/$tag.csv" \
      "${common[@]}" --output-file "$out/$tag.json" >"$out/$tag.log" 2>&1 || tail -n 5 "$out/$tag.log"
    row "$v: $(grep -E 'prompt tokens' "$out/$tag.log" | tr -s ' ')"
    python3 - "$out/$tag.csv" <<'EOF' | tee -a "$summary"
import collections, csv, re, sys
def short(n):
    m = re.match(r"_Z(\d+)", n)
    return n[m.end():m.end() + int(m.group(1))] if m else re.sub(r"<.*|\(.*|^void ", "", n)
tot = collections.defaultdict(float); cnt = collections.Counter(); lab = collections.defaultdict(float)
for row in csv.reader(open(sys.argv[1])):
    if len(row) < 5 or not row[2].isdigit():
        continue
    d = (int(row[3]) - int(row[2])) / 1e6
    tot[(row[0], short(row[4]))] += d; cnt[(row[0], short(row[4]))] += 1; lab[row[0]] += d
for l in sorted(lab):
    print("  %s: kernels %.1f ms in all" % (l, lab[l]))
    for (ll, k), t in sorted(tot.items(), key=lambda x: -x[1])[:40]:
        if ll == l and t > 0.02 * lab[l]:
            print("    %-40s %8.1f ms %6d launches %7.1f us each" % (k, t, cnt[(ll, k)], 1e3 * t / cnt[(ll, k)]))
EOF
  done
}

make_set() {  # PREFIX TARGETS DISTINCT NAMES
  local prefix=$1 targets=$2 distinct=$3 names=$4 dir=/tmp/ad-$1
  rm -rf "$dir"
  "$bin/loraserve-make-adapters" --model-path "$model" --output "$dir" --num-adapters "$distinct" \
    --ranks 8,16,32,64 --targets "$targets" --prefix "$prefix" --seed 11 --quiet || return 1
  for ((i = distinct; i < names; i++)); do
    mkdir "$dir/$prefix-$i"
    ln "$dir/$prefix-$((i % distinct))"/* "$dir/$prefix-$i/"
  done
  echo "$dir: $names names over $distinct distinct adapters, $(du -sh "$dir" | cut -f1)"
}

# The worker killed under load: 64 concurrent base-model requests, SIGKILL to the worker 5 s
# in; how long until the launcher has it Ready again and /health answers 200, what became of
# the requests in flight (answered with an error, none hanging: the benchmark ends), and that
# the requests after it complete.
stage_recovery() {
  row "== recovery: the worker killed under load ($card)"
  graph_start /tmp/ls-rec || return 1
  # LS_SERVE_KILL_AFTER_S (default 5): when the kill comes; later, the worker has pinned more of
  # its host tier (its maker thread pins 1 GiB at a time from the start), which its exit unpins
  local after=${LS_SERVE_KILL_AFTER_S:-5} np
  np=$((240 * (after + 5)))
  "$bin/loraserve-bench" --base-url "$url" --adapter-dist base --num-prompts "$np" --max-concurrency 64 \
    --request-rate inf "${common[@]}" --disable-tqdm --output-file "$out/recovery.json" >"$out/recovery.log" 2>&1 &
  local bench=$!
  sleep "$after"
  local wpid
  wpid=$(pgrep -f "$bin/loraserve-worker" | head -1)
  [[ -n $wpid ]] || { echo "recovery: no worker process"; graph_stop; return 1; }
  kill -9 "$wpid"
  python3 - "$url" <<'EOF2' | tee -a "$summary"
import sys, time, urllib.request
url, t0, down = sys.argv[1], time.monotonic(), None
while time.monotonic() - t0 < 120:
    try:
        ok = urllib.request.urlopen(url + "/health", timeout=2).status == 200
    except Exception:
        ok = False
    if not ok and down is None:
        down = time.monotonic() - t0
    if ok and down is not None:
        print("worker SIGKILLed: /health not ready %.2f s after the kill, ready again %.2f s after it"
              % (down, time.monotonic() - t0))
        break
    time.sleep(0.05)
else:
    print("worker SIGKILLed: /health %s within 120 s" % ("never went down" if down is None else "not ready again"))
EOF2
  local waited=0
  while kill -0 "$bench" 2>/dev/null && ((waited < 240)); do sleep 1; waited=$((waited + 1)); done
  kill "$bench" 2>/dev/null && row "recovery: the benchmark was still running 240 s later (a request hangs)"
  wait "$bench" 2>/dev/null
  grep -h "is ready again after restart" /tmp/ls-rec.launch.log /tmp/ls-rec/logs/*.log 2>/dev/null | head -2 |
    sed 's/.*msg="//; s/"$//' | while read -r l; do row "launcher: $l"; done
  row "requests under the kill ($after s in): $(jget "$out/recovery.json" completed) completed, $(jget "$out/recovery.json" failed) failed of $np (those in flight at the kill or sent while it was down fail, with an error)"
  "$bin/loraserve-bench" --base-url "$url" --adapter-dist base --num-prompts 128 --max-concurrency 64 \
    --request-rate inf "${common[@]}" --disable-tqdm --output-file "$out/recovery_after.json" >"$out/recovery_after.log" 2>&1
  row "requests after it: $(jget "$out/recovery_after.json" completed) completed, $(jget "$out/recovery_after.json" failed) failed of 128"
  graph_stop
  cp /tmp/ls-rec.launch.log "$out/recovery_launcher.log"
  cp /tmp/ls-rec/logs/worker-0.log "$out/recovery_worker.log" 2>/dev/null
}

# Where a hop goes: the graph at 64 concurrent (base model) with --record-trace, and from the
# scheduler's and the worker's traces (one clock) per step: result in at the scheduler -> plan
# in at the worker (the scheduler's work and the way there), the worker's step (elapsed_us),
# its end -> result in at the scheduler (the way back); medians. Tracing itself costs a write
# per message, so the figures are upper bounds.
stage_hops() {
  row "== hops: a step's way between the scheduler and the worker, traced ($card)"
  graph_start /tmp/ls-hops --record-trace "$out/trace" || return 1
  "$bin/loraserve-bench" --base-url "$url" --adapter-dist base --num-prompts 192 --warmup-requests 64 \
    --max-concurrency 64 --request-rate inf "${common[@]}" --disable-tqdm >"$out/hops.log" 2>&1 || tail -n 5 "$out/hops.log"
  graph_stop
  "$bin/loraserve-trace" --json --type StepPlan --type StepResult "$out/trace" >"$out/hops.jsonl" 2>/dev/null
  python3 - "$out/hops.jsonl" <<'EOF' | tee -a "$summary"
import json, statistics, sys
plan_in, res_in, elapsed, items = {}, {}, {}, []
for line in open(sys.argv[1]):
    r = json.loads(line)
    m = r.get("msg") or {}
    if r.get("dir") != "in" or "type" not in m:
        continue
    body = m["body"]
    if m["type"] == "StepPlan" and r["actor"].startswith("worker"):
        plan_in[body["step"]] = r["t_ns"]
        items.append(len(body["items"]))
    elif m["type"] == "StepResult" and r["actor"] == "scheduler":
        res_in[body["step"]] = r["t_ns"]
        elapsed[body["step"]] = body.get("elapsed_us", 0) * 1000
steps = sorted(s for s in res_in if s in plan_in and s + 1 in plan_in)
there = [(plan_in[s + 1] - res_in[s]) / 1e3 for s in steps]
back = [(res_in[s] - plan_in[s] - elapsed[s]) / 1e3 for s in steps]
work = [elapsed[s] / 1e3 for s in steps]
if steps:
    print("%d steps of %.0f items (median): result in -> next plan in at the worker %.0f us; the worker's step %.0f "
          "us; its end -> result in at the scheduler %.0f us" % (len(steps), statistics.median(items),
          statistics.median(there), statistics.median(work), statistics.median(back)))
else:
    print("no steps found in the traces")
EOF
}

# A cold adapter's way to its GPU slot, and what loads cost the decode steps beside them:
# rank-16 adapters on all seven targets (84 MB each, in the page cache), requested one at a
# time (one token each) while 64 base-model requests decode; each one's time to first token
# (the registry's check, the worker's read and image build, the slot upload, a one-token
# prefill) and the worker's own load time from its log; the base requests' TPOT with and
# without the loads.
stage_coldload() {
  row "== cold loads: rank-16 adapters on all seven targets (84 MB), from the page cache ($card)"
  local dir=/tmp/ad-cold
  rm -rf "$dir"
  "$bin/loraserve-make-adapters" --model-path "$model" --output "$dir" --num-adapters 4 --ranks 16 \
    --targets all --prefix cold --seed 5 --quiet || return 1
  for ((i = 4; i < 40; i++)); do mkdir "$dir/cold-$i"; ln "$dir/cold-$((i % 4))"/* "$dir/cold-$i/"; done
  cat "$dir"/cold-*/adapter_model.safetensors >/dev/null
  graph_start /tmp/ls-cold --lora-dirs "$dir" --actor-log-level info || return 1
  local base=(--base-url "$url" --adapter-dist base --num-prompts 640 --warmup-requests 64 --max-concurrency 64
              --request-rate inf "${common[@]}" --disable-tqdm)
  "$bin/loraserve-bench" "${base[@]}" --output-file "$out/cold_quiet.json" >/dev/null 2>&1
  "$bin/loraserve-bench" "${base[@]}" --output-file "$out/cold_loads.json" >/dev/null 2>&1 &
  local bpid=$!
  sleep 3
  : >"$out/cold_ttft.txt"
  for ((i = 0; i < 32; i++)); do
    kill -0 $bpid 2>/dev/null || break
    env -u LD_LIBRARY_PATH curl -s -o /dev/null -w '%{time_total}\n' "$url/generate" \
      -d "{\"input_ids\":[1000,1001,1002,1003],\"lora_path\":\"cold-$i\",\"sampling_params\":{\"max_new_tokens\":1,\"temperature\":0}}" \
      >>"$out/cold_ttft.txt"
    sleep 0.2
  done
  wait $bpid
  graph_stop
  grep -ho 'adapter cold-[0-9]* loaded from [^:]*: rank [0-9]*, [0-9.]* MB in the CPU tier, [0-9.]* ms' \
    /tmp/ls-cold/logs/worker-0.log | sed 's/.* \([0-9.]*\) ms$/\1/' >"$out/cold_worker_ms.txt"
  python3 - "$out" <<'EOF' | tee -a "$summary"
import json, statistics, sys
out = sys.argv[1]
ttft = [1e3 * float(x) for x in open(out + "/cold_ttft.txt") if x.strip()]
work = [float(x) for x in open(out + "/cold_worker_ms.txt") if x.strip()]
q, l = (json.loads(open(out + "/cold_%s.json" % k).read().splitlines()[-1]) for k in ("quiet", "loads"))
print("%d cold requests: time to first token median %.1f ms (max %.1f); the worker's read + image build median %.1f ms "
      "(max %.1f); base decode beside them: median TPOT %.2f ms against %.2f without loads (%+.1f%%), p99 %.2f / %.2f"
      % (len(ttft), statistics.median(ttft), max(ttft), statistics.median(work) if work else -1,
         max(work) if work else -1, l["median_tpot_ms"], q["median_tpot_ms"],
         100 * (l["median_tpot_ms"] / q["median_tpot_ms"] - 1), l["p99_tpot_ms"], q["p99_tpot_ms"]))
EOF
}

stage_adapters() {
  row "== adapters: Zipf(1) over N adapters, ranks 8/16/32/64 mixed, on demand from disk ($card)"
  make_set qkvo q,k,v,o 200 2000 || return 1
  make_set all all 80 2000 || return 1
  row "$(printf '%-22s %9s %8s %9s %9s %7s %9s %6s' workload tok/s 'vs base' 'p99 ttft' 'p50 tpot' 'disk ld' 'ms/ld' failed)"
  graph_start /tmp/ls-ad --lora-dirs /tmp/ad-qkvo /tmp/ad-all || return 1
  local base_tok base_rps specs
  for load in sat below; do
    local rate=(--request-rate inf)
    specs=(base:0 qkvo:1 qkvo:8 qkvo:100 qkvo:1000 qkvo:2000 all:8 all:100 all:1000 all:2000)
    if [[ $load == below ]]; then
      rate=(--request-rate "$(python3 -c "print(0.7 * $base_rps)")")
      specs=(base:0 qkvo:1 qkvo:100 qkvo:1000 qkvo:2000 all:1000)
    fi
    for spec in "${specs[@]}"; do
      local prefix=${spec%%:*} n=${spec##*:} tag=${load}_${spec/:/_}
      local sel=(--adapter-dist zipf:1 --num-adapters "$n" --adapter-prefix "$prefix")
      [[ $prefix == base ]] && sel=(--adapter-dist base)
      snap "$out/m0"
      local t0=$(date +%s.%N)
      "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" \
        --num-prompts $((128 * per_slot * 2 / 3)) --warmup-requests 0 --max-concurrency 128 "${rate[@]}" "${common[@]}" \
        --disable-tqdm --output-file "$out/adapters_$tag.json" >"$out/adapters_$tag.log" 2>&1 ||
        { tail -n 5 "$out/adapters_$tag.log"; }
      local tok
      tok=$(jget "$out/adapters_$tag.json" output_throughput)
      if [[ $prefix == base ]]; then
        base_tok=$tok
        [[ $load == sat ]] && base_rps=$(jget "$out/adapters_$tag.json" request_throughput)
      fi
      local loads us
      loads=$(jget "$out/adapters_$tag.json" adapter_cpu_loads)
      us=$(jget "$out/adapters_$tag.json" adapter_cpu_load_us_total)
      row "$(printf '%-22s %9.1f %8.3f %9.1f %9.2f %7s %9s %6s' "$load $spec" "$tok" "$(python3 -c "print($tok / $base_tok)")" \
        "$(jget "$out/adapters_$tag.json" p99_ttft_ms)" "$(jget "$out/adapters_$tag.json" median_tpot_ms)" "$loads" \
        "$(per_load "$loads" "$us")" \
        "$(jget "$out/adapters_$tag.json" failed)")"
      local t1=$(date +%s.%N)
      snap "$out/m1"
      graph_time "  $tag" "$out/m0" "$out/m1" "$(python3 -c "print($t1 - $t0)")" >>"$summary"
    done
  done
  graph_stop
}

stage_slo() {
  local slo=${LS_SERVE_SLO_TTFT_MS:-1000} np=${LS_SERVE_SLO_PROMPTS:-2048} fr ns
  read -r -a fr <<<"${LS_SERVE_SLO_RATES:-1.0 1.1 1.2 1.3 1.4}"
  read -r -a ns <<<"${LS_SERVE_SLO_ADAPTERS:-1 1000}"
  row "== slo: goodput at p99 TTFT <= $slo ms, Poisson with no client cap, q,k,v,o adapters, Zipf(1) ($card)"
  [[ -d /tmp/ad-qkvo ]] || make_set qkvo q,k,v,o 200 2000 || return 1
  graph_start /tmp/ls-slo --lora-dirs /tmp/ad-qkvo || return 1
  # the unit of the rates: the base model's closed-loop rate at 128 concurrent
  "$bin/loraserve-bench" --base-url "$url" --adapter-dist base --num-prompts $((128 * per_slot * 2 / 3)) \
    --warmup-requests 0 --max-concurrency 128 --request-rate inf "${common[@]}" --disable-tqdm \
    --output-file "$out/slo_base.json" >"$out/slo_base.log" 2>&1 || { tail -n 5 "$out/slo_base.log"; return 1; }
  local unit
  unit=$(jget "$out/slo_base.json" request_throughput)
  row "base, closed loop at 128: $unit req/s, $(jget "$out/slo_base.json" output_throughput) tok/s"
  row "$(printf '%-10s %6s %8s %9s %9s %9s %6s %6s %5s' adapters x rate tok/s 'p99 ttft' 'p50 tpot' 'slo %' failed disk)"
  local n f
  for n in "${ns[@]}"; do
    local sel=(--adapter-dist zipf:1 --num-adapters "$n" --adapter-prefix qkvo)
    # the host tier and the slots warmed with the same mix and as many requests as a rate, not
    # measured, so that a rate's run loads few adapters from disk (its "disk" column): 256
    # warm-up requests over 1,000 names leave ~370 of a rate's ~490 names to load
    "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" --num-prompts "$np" --max-concurrency 128 \
      --request-rate inf "${common[@]}" --disable-tqdm >"$out/slo_warm_$n.log" 2>&1
    for f in "${fr[@]}"; do
      local rate p99 tag=slo_${n}_$f
      rate=$(python3 -c "print(round($f * $unit, 3))")
      "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" --num-prompts "$np" \
        --warmup-requests 0 --request-rate "$rate" --slo-ttft-ms "$slo" "${common[@]}" --disable-tqdm \
        --output-file "$out/$tag.json" >"$out/$tag.log" 2>&1 || { tail -n 5 "$out/$tag.log"; }
      p99=$(jget "$out/$tag.json" p99_ttft_ms)
      row "$(printf '%-10s %6s %8s %9.1f %9.1f %9.2f %6.1f %6s %5s' "$n" "$f" "$rate" \
        "$(jget "$out/$tag.json" output_throughput)" "$p99" "$(jget "$out/$tag.json" median_tpot_ms)" \
        "$(python3 -c "print(100 * float('$(jget "$out/$tag.json" slo_attainment)'))")" \
        "$(jget "$out/$tag.json" failed)" "$(jget "$out/$tag.json" adapter_cpu_loads)")"
      # past 3 x the SLO the queue only grows: the higher rates are not run
      python3 -c "import sys; sys.exit(0 if float('$p99') <= 3 * $slo else 1)" || break
    done
  done
  graph_stop
  python3 - "$out" "$slo" "${ns[*]}" "${fr[@]}" <<'EOF' | tee -a "$summary"
import json, sys
out, slo, ns, fr = sys.argv[1], float(sys.argv[2]), [int(n) for n in sys.argv[3].split()], sys.argv[4:]
# a config's goodput: the rate where its p99 TTFT crosses the SLO, linear between the last
# rate within it and the first past it (a rate with a failed request counts as past it);
# bound: "=" found, ">=" every rate within the SLO (at least the highest), None not found
good, bound = {}, {}
for n in ns:
    pts = []
    for f in fr:
        try:
            r = json.loads(open("%s/slo_%d_%s.json" % (out, n, f)).read().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            break
        p99 = r.get("p99_ttft_ms") if r.get("failed", 1) == 0 else None
        pts.append((float(r["request_rate"]), p99 if isinstance(p99, (int, float)) else float("inf")))
    within = [k for k, (_, p) in enumerate(pts) if p <= slo]
    if not pts or not within or within[0] != 0:
        good[n], bound[n] = None, None
        print("goodput, %d adapter%s: below the lowest rate (or not measured)" % (n, "s"[n == 1:]))
        continue
    k = next((k for k, (_, p) in enumerate(pts) if p > slo), None)
    if k is None:
        good[n], bound[n] = pts[-1][0], ">="
        print("goodput, %d adapter%s: at least %.2f req/s (every rate within the SLO)"
              % (n, "s"[n == 1:], pts[-1][0]))
        continue
    (r0, p0), (r1, p1) = pts[k - 1], pts[k]
    g = r0 + (r1 - r0) * (slo - p0) / (p1 - p0) if p1 != float("inf") else r0
    good[n], bound[n] = g, "="
    print("goodput, %d adapter%s: %.2f req/s (p99 TTFT %.0f ms at %.2f, %.0f at %.2f)"
          % (n, "s"[n == 1:], g, p0, r0, p1, r1))
# the ratio to the first configuration: exact where both crossed, a bound where one did not
rel = {("=", "="): "=", ("=", ">="): "<=", (">=", "="): ">="}
for n in ns[1:]:
    how = rel.get((bound[n], bound[ns[0]]))
    if how:
        print("%d adapters / %d at p99 TTFT <= %.0f ms: %s %.3f" % (n, ns[0], slo, how, good[n] / good[ns[0]]))
    else:
        print("%d adapters / %d at p99 TTFT <= %.0f ms: not bracketed by these rates" % (n, ns[0], slo))
EOF
}

# GPUs here; a smoke run on the CPU backend (LS_SERVE_BACKEND=cpu) counts as two
ngpus() { [[ $backend == cpu ]] && echo 2 || nvidia-smi -L 2>/dev/null | grep -c '^GPU'; }

stage_dp() {
  row "== dp: --dp-size 2 against one group, Zipf(1) over 100 q,k,v,o adapters ($card)"
  row "   closed loop at 128 concurrent a group, then Poisson at 70% of one group's rate a group"
  [[ $(ngpus) -ge 2 ]] || { row "not run: $(ngpus) GPU(s), it needs 2"; return 0; }
  [[ -d /tmp/ad-qkvo ]] || make_set qkvo q,k,v,o 200 2000 || return 1
  row "$(printf '%-16s %9s %8s %9s %9s %6s' load tok/s ratio 'p99 ttft' 'p50 tpot' failed)"
  local one one_rps one_below dp load
  for dp in 1 2; do
    graph_start /tmp/ls-dp$dp --lora-dirs /tmp/ad-qkvo --dp-size $dp || return 1
    for load in sat below; do
      local c=$((128 * dp)) f=$out/dp_${dp}_$load.json rate=(--request-rate inf)
      [[ $load == below ]] && rate=(--request-rate "$(python3 -c "print(0.7 * $one_rps * $dp)")")
      "$bin/loraserve-bench" --base-url "$url" --adapter-dist zipf:1 --num-adapters 100 --adapter-prefix qkvo \
        --num-prompts $((c * per_slot * 2 / 3)) --warmup-requests $c --max-concurrency $c "${rate[@]}" "${common[@]}" \
        --disable-tqdm --output-file "$f" >"$out/dp_${dp}_$load.log" 2>&1 || tail -n 5 "$out/dp_${dp}_$load.log"
      local tok
      tok=$(jget "$f" output_throughput)
      if [[ $dp == 1 ]]; then
        [[ $load == sat ]] && { one=$tok; one_rps=$(jget "$f" request_throughput); }
        [[ $load == below ]] && one_below=$tok
      fi
      local ref=$one
      [[ $load == below ]] && ref=$one_below
      row "$(printf '%-16s %9.1f %8.3f %9.1f %9.2f %6s' "dp $dp $load" "$tok" "$(python3 -c "print($tok / $ref)")" \
        "$(jget "$f" p99_ttft_ms)" "$(jget "$f" median_tpot_ms)" "$(jget "$f" failed)")"
    done
    graph_stop
  done
}

# The worker's step split over a run, per step: the forward's call, the grammar masks, the
# sampling call (which waits for the GPU), and the masks found cached / computed.
step_split() {  # LABEL BEFORE AFTER
  python3 - "$@" <<'EOF'
import re, sys
label, before, after = sys.argv[1:4]
def read(path):
    v = {}
    for line in open(path):
        m = re.match(r"loraserve_(\w+)\{actor=\"worker-0\"\} (\d+)", line)
        if m:
            v[m.group(1)] = int(m.group(2))
    return v
b, a = read(before), read(after)
d = {k: a[k] - b.get(k, 0) for k in a}
st = max(d.get("steps", 0), 1)
print("%s: %d steps; a step: forward call %.3f ms, masks %.3f ms, sampling %.3f ms; masks cached %d, computed %d"
      % (label, st, d.get("step_forward_us_total", 0) / st / 1e3, d.get("step_masks_us_total", 0) / st / 1e3,
         d.get("step_sample_us_total", 0) / st / 1e3, d.get("grammar_mask_hits", 0), d.get("grammar_mask_misses", 0)))
EOF
}

stage_structured() {
  row "== structured: grammar masks, 64 concurrent base-model requests, a JSON schema on each ($card)"
  local schema=$out/schema.json
  # a string longer than 128 tokens can spell: every constrained request runs its 128 tokens, as
  # the plain ones do, so the runs differ by the masks alone (not by requests ending early)
  echo '{"type":"object","properties":{"text":{"type":"string","minLength":1000,"maxLength":1000}},"required":["text"]}' >"$schema"
  graph_start /tmp/ls-structured || return 1
  row "$(printf '%-22s %9s %9s %9s %6s' run tok/s 'p50 tpot' 'vs plain' failed)"
  local plain run
  # settle: a first plain run, since the graph's first minute of work runs slower (figures
  # compare with the plain run right after it)
  for run in settle plain cold warm again; do
    local f=$out/structured_$run.json grammar=()
    [[ $run == cold || $run == warm ]] && grammar=(--json-schema "$schema")
    snap "$out/m0"
    "$bin/loraserve-bench" --base-url "$url" --adapter-dist base --num-prompts 256 --warmup-requests 64 \
      --max-concurrency 64 --request-rate inf "${common[@]}" "${grammar[@]}" --disable-tqdm --output-file "$f" \
      >"$out/structured_$run.log" 2>&1 || tail -n 5 "$out/structured_$run.log"
    snap "$out/m1"
    step_split "  $run" "$out/m0" "$out/m1" >>"$summary"
    local tpot
    tpot=$(jget "$f" median_tpot_ms)
    [[ $run == settle || $run == plain ]] && plain=$tpot
    row "$(printf '%-22s %9.1f %9.2f %9.3f %6s' "$run" "$(jget "$f" output_throughput)" "$tpot" \
      "$(python3 -c "print($tpot / $plain)")" "$(jget "$f" failed)")"
  done
  graph_stop
}

# The demo's prompt for the base model and each demo adapter, greedy: "model<TAB>text" lines.
demo_texts() {  # PORT
  python3 - "$1" <<'EOF'
import json, sys, urllib.request
for model in ("demo", "reverse", "upper", "sort", "digits"):
    body = json.dumps({"model": model, "prompt": "input: 5 leaf road 1 red\noutput:", "max_tokens": 12,
                       "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1], body,
                                 {"Content-Type": "application/json"})
    try:
        print("%s\t%r" % (model, json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]["text"]))
    except Exception as e:
        print("%s\t(no completion: %s)" % (model, e))
EOF
}

stage_tpnodes() {
  row "== tpnodes: the demo model, --tp-size 2 over two launchers (two hosts on one machine) against one worker ($card)"
  [[ $(ngpus) -ge 2 ]] || { row "not run: $(ngpus) GPU(s), it needs 2"; return 0; }
  local demo=$root/examples/demo
  local flags=(--model-path "$demo" --backend "$backend" --max-lora-rank 16 --lora-roots "$demo/adapters" --lora-paths
               "reverse=$demo/adapters/reverse" "upper=$demo/adapters/upper" "sort=$demo/adapters/sort"
               "digits=$demo/adapters/digits" --ready-timeout 300 --actor-log-level warn)
  graph_start_with /tmp/ls-tp1 --port 30100 "${flags[@]}" || return 1
  demo_texts 30100 >"$out/tp1.txt"
  graph_stop
  local nodes=(--transport tcp --tp-size 2 --nnodes 2 --node-addrs 127.0.0.1,127.0.0.2 --curve-dir /tmp/ls-tp-keys)
  rm -rf /tmp/ls-tp-keys /tmp/ls-tp2-n1
  "$bin/loraserve-launch" --bin-dir "$bin" --make-keys "${nodes[@]}" >"$out/tp_keys.log" 2>&1 || { cat "$out/tp_keys.log"; return 1; }
  CUDA_VISIBLE_DEVICES=1 "$bin/loraserve-launch" --bin-dir "$bin" --run-dir /tmp/ls-tp2-n1 --port 30101 "${flags[@]}" \
    "${nodes[@]}" --node-rank 1 \
    >/tmp/ls-tp2-n1.launch.log 2>&1 &
  local n1=$!
  # two hosts of one GPU each: each launcher's workers see their own GPU as device 0
  CUDA_VISIBLE_DEVICES=0 graph_start_with /tmp/ls-tp2 --port 30102 "${flags[@]}" "${nodes[@]}" --node-rank 0 ||
    { kill -INT $n1; return 1; }
  demo_texts 30102 >"$out/tp2.txt"
  local where
  where=$(python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); print(" ".join("%s@node%s" % (a["name"], a["node"]) for a in g["actors"] if a["name"].startswith("worker")))' /tmp/ls-tp2/graph.json)
  graph_stop
  wait $n1 2>/dev/null
  row "tp 2 over two launchers: $where"
  paste "$out/tp1.txt" "$out/tp2.txt" | while IFS=$'\t' read -r m a _ b; do
    row "$(printf '  %-8s tp1 %-30s tp2 %-30s %s' "$m" "$a" "$b" "$([[ $a == "$b" ]] && echo same || echo DIFFERENT)")"
  done
  cp /tmp/ls-tp2.launch.log "$out/tp2_node0.log"
  cp /tmp/ls-tp2-n1.launch.log "$out/tp2_node1.log"
  cmp -s "$out/tp1.txt" "$out/tp2.txt"
}

# GPU memory of one adapter slot of rank R on all seven targets padded to R, as the baseline's
# split pool holds it (A: R rows of each slice's input; B: each output row's R columns), MB
slot_mb() {  # RANK
  python3 - "$model/config.json" "$1" <<'EOF'
import json, sys
c, r = json.load(open(sys.argv[1])), int(sys.argv[2])
h, i, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
d = c.get("head_dim") or h // c["num_attention_heads"]
q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
a = 3 * h + q + 2 * h + i              # qkv, o, gate_up, down: rows of their inputs
b = (q + 2 * kv) + h + 2 * i + h       # their outputs
print((a + b) * r * 2 * L // (1 << 20) + 1)
EOF
}

# Samples /metrics every 0.2 s into FILE until killed: the gauges' peaks of a run.
metrics_poll() {  # FILE
  while true; do
    env -u LD_LIBRARY_PATH curl -s "$url/metrics" >>"$1"
    sleep 0.2
  done
}

peaks() {  # FILE: the largest value of each gauge that matters here
  python3 - "$1" <<'EOF'
import re, sys
names = ("running_requests", "adapter_gpu_resident", "kv_blocks_used", "kv_blocks_adapters", "kv_blocks_total")
peak = {}
for line in open(sys.argv[1]):
    m = re.match(r'loraserve_(\w+)\{actor="scheduler[\w-]*"\} (\d+)', line)
    if m and m.group(1) in names:
        peak[m.group(1)] = max(peak.get(m.group(1), 0), int(m.group(2)))
print(" ".join("%s=%d" % (k, peak.get(k, -1)) for k in names))
EOF
}

stage_paging() {
  local base_bin=$root/$bundle/baseline/bin
  [[ -x $base_bin/loraserve-launch ]] || { row "paging: no baseline (LS_SERVE_BASELINE_BUILD at prepare)"; return 1; }
  [[ -d /tmp/ad-all ]] || make_set all all 80 2000 || return 1
  [[ -d /tmp/ad-ov ]] || "$bin/loraserve-make-adapters" --model-path "$model" --output /tmp/ad-ov --num-adapters 8 \
    --ranks 16 --targets all --seed 3 --quiet --overwrite
  local kv=${LS_SERVE_PAGING_KV_MB:-16384} split=${LS_SERVE_PAGING_SLOTS:-32} handles=${LS_SERVE_PAGING_HANDLES:-128}
  local long
  read -r -a long <<<"${LS_SERVE_PAGING_LEN:-1024 256}"  # the Zipf run's prompt and output tokens
  local pool=$((kv + split * $(slot_mb 64)))
  row "== paging: split pools (KV $kv MB + $split slots of rank 64 on all seven targets) vs one pool of $pool MB ($handles handles), $card"
  local flags=(--model-path "$model" --load-format "$format" --backend "$backend" --port 30000 --max-lora-rank 64
               --max-cpu-lora-mb "$cpu_lora_mb" --max-running-requests 256 --ready-timeout 600 --actor-log-level warn
               --lora-dirs /tmp/ad-all /tmp/ad-ov)
  row "$(printf '%-26s %9s %9s %9s %7s %7s  %s' workload tok/s 'p99 ttft' 'p50 tpot' failed ratio 'peaks (/metrics)')"
  local side
  for side in split unified; do
    local side_flags=(--kv-cache-mb "$pool" --max-loras-per-batch "$handles") launch_bin=$bin
    [[ $side == split ]] && side_flags=(--kv-cache-mb "$kv" --max-loras-per-batch "$split") launch_bin=$base_bin
    local saved=$bin
    bin=$launch_bin
    graph_start_with /tmp/ls-pg "${flags[@]}" "${side_flags[@]}"
    local rc=$?
    bin=$saved
    ((rc == 0)) || return 1
    local base_tok= w
    for w in zipf100 base lora8; do
      local tag=paging_${side}_$w sel len=(--input-len 128 --output-len 128) conc=64 np=$((64 * per_slot))
      case $w in
        zipf100) sel=(--adapter-dist zipf:1 --num-adapters 100 --adapter-prefix all)
                 len=(--input-len "${long[0]}" --output-len "${long[1]}") conc=256 np=$((256 * 3)) ;;
        base) sel=(--adapter-dist base) ;;
        lora8) sel=(--adapter-dist uniform --num-adapters 8 --adapter-prefix lora) ;;
      esac
      # the adapters into the CPU tier before the clock starts (cold loads are the adapters stage's)
      [[ $w != base ]] && "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" --num-prompts 200 --max-concurrency 64 \
        --input-len 16 --output-len 2 --disable-tqdm >/dev/null 2>&1
      : >"$out/$tag.metrics"
      metrics_poll "$out/$tag.metrics" &
      local poller=$!
      "$bin/loraserve-bench" --base-url "$url" "${sel[@]}" --num-prompts $np --warmup-requests 0 --max-concurrency $conc \
        --request-rate inf "${len[@]}" --range-ratio 1 --seed 7 --disable-tqdm --output-file "$out/$tag.json" \
        >"$out/$tag.log" 2>&1 || tail -n 5 "$out/$tag.log"
      kill "$poller" 2>/dev/null
      wait "$poller" 2>/dev/null
      local tok ratio=-
      tok=$(jget "$out/$tag.json" output_throughput)
      [[ $w == base ]] && base_tok=$tok
      [[ $w == lora8 && -n $base_tok ]] && ratio=$(python3 -c "print('%.3f' % ($tok / $base_tok))")
      row "$(printf '%-26s %9.1f %9.1f %9.2f %7s %7s  %s' "$side $w c=$conc" "$tok" "$(jget "$out/$tag.json" p99_ttft_ms)" \
        "$(jget "$out/$tag.json" median_tpot_ms)" "$(jget "$out/$tag.json" failed)" "$ratio" "$(peaks "$out/$tag.metrics")")"
    done
    graph_stop
  done
  row "  (split: adapter_gpu_resident -1 and kv_blocks_adapters -1: the baseline has no such gauges; its adapters in slots are at most $split)"
}

status=0
export LS_FIXTURES_DIR=$root/tests/fixtures LS_DEMO_DIR=$root/examples/demo
for t in test_gpu_ops test_gpu_model; do
  [[ -x $bin/$t ]] || continue
  "$bin/$t" >"$out/$t.log" 2>&1 || { status=1; tail -n 5 "$out/$t.log"; }
  grep -E "FAIL" "$out/$t.log" | head -20
  row "$t: $(grep -oE '[0-9]+ (tests|checks), [0-9]+ failed|PASSED|FAILED' "$out/$t.log" | tail -2 | tr '\n' ' ')"
done
for s in "${stages[@]}"; do
  "stage_$s" || status=1
done
cat "$out"/*.json >"$dest/reports.jsonl" 2>/dev/null
cp "$summary" "$out/device.txt" "$dest/"
tar -czf "$dest/logs.tar.gz" -C "$out" . 2>/dev/null
echo
echo "=== summary ($card) ==="
cat "$summary"
exit $status
