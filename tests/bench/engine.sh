#!/usr/bin/env bash
# bench_serve_engine on the CPU: the serving workload on the engine alone (the scheduler's core
# and the worker's step in one process), base model and Zipf over 12 generated adapters. Every
# request completes with the tokens it asked for, the step accounting adds up, and one seed
# gives one set of requests (loraserve-bench's workload generator) whatever the adapters. Usage: engine.sh BIN_DIR DEMO_DIR
set -euo pipefail
bin=$1 demo=$2
run=$(mktemp -d /tmp/ls-bench-engine-XXXXXX)
trap 'rm -rf "$run"' EXIT
"$bin/loraserve-make-adapters" --model-path "$demo" --output "$run/adapters" --num-adapters 12 --ranks 8,16 \
    --targets all --seed 2 --quiet
common=(--model-path "$demo" --num-prompts 24 --max-concurrency 8 --input-len 24 --output-len 6 --range-ratio 0.5
        --seed 3 --max-lora-rank 16 --kv-cache-mb 64 --warmup-requests 4)
"$bin/bench_serve_engine" "${common[@]}" --output-file "$run/r.jsonl" >"$run/base.txt"
for i in 1 2; do
    "$bin/bench_serve_engine" "${common[@]}" --adapter-dist zipf:1 --num-adapters 12 --lora-dir "$run/adapters" \
        --max-loras-per-batch 4 --output-file "$run/r.jsonl" >"$run/zipf$i.txt"
done
cat "$run/base.txt" "$run/zipf1.txt"
python3 - "$run/r.jsonl" <<'PY'
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert len(rs) == 3, rs
for r in rs:
    assert r["completed"] == 24 and r["failed"] == 0, r
    # range ratio 0.5: lengths in [len/2, len]; ignore_eos: every token asked for comes
    assert r["total_output_tokens"] == r["requested_output_tokens"], r
    assert 24 * 3 <= r["total_output_tokens"] <= 24 * 6 and 24 * 12 <= r["total_input_tokens"] <= 24 * 24, r
    assert r["output_throughput"] > 0 and r["steps"] > 0 and r["prefill_steps"] > 0, r
    assert abs(r["step_s"] + r["sched_s"] + r["other_s"] - r["duration"]) < 1e-3 * r["duration"] + 1e-4, r
assert rs[0]["adapter_dist"] == "base" and rs[1]["adapter_dist"] == "zipf:1", rs
for k in ("total_input_tokens", "total_output_tokens"):  # one seed, one set of requests
    assert rs[0][k] == rs[1][k] == rs[2][k], (k, rs)
print("engine alone: 3 runs, %d requests each: ok" % rs[0]["completed"])
PY
