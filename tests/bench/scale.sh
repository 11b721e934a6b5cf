#!/usr/bin/env bash
# Serving at scale on the CPU: loraserve-make-adapters writes 200 random adapters for the demo
# model, the graph serves them from --lora-dirs (loaded on their first request) through a host
# tier of 16 and 4 adapter slots, and loraserve-bench sends Zipf(1) traffic over all 200. The
# run must complete every request, count cold loads, report every key, and give each adapter
# its own answers: for 10 distinct adapters the saved answer equals the same request sent
# alone, and the same prompt gets different answers from different adapters.
# Usage: scale.sh BIN_DIR LAUNCH_SCRIPT
set -euo pipefail
bin=$1 launch=$2
run=$(mktemp -d /tmp/ls-bench-scale-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
demo=$(cd "$(dirname "$launch")/../examples/demo" && pwd)
"$bin/loraserve-make-adapters" --model-path "$demo" --output "$run/adapters" --num-adapters 200 --ranks 8,16 \
    --targets all --seed 1 --quiet
graph_start "$bin" "$launch" "$run" --lora-dirs "$run/adapters" \
    --max-loaded-loras 16 --max-loras-per-batch 4

# Four prompts, cycled over 400 requests whose adapters Zipf draws: each prompt meets many
# adapters. The concurrency (32) is above the host tier (16): loads that find the tier full of
# adapters in use wait for room, and no request is refused for it.
python3 -c '
import random
random.seed(5)
for _ in range(4):
    print("{\"input_ids\": %s, \"output_len\": 8}" % [random.randrange(103, 721) for _ in range(16)])
' >"$run/prompts.jsonl"
"$bin/loraserve-bench" --base-url "$url" --adapter-dist zipf:1 --num-adapters 200 --adapter-prefix lora \
    --dataset "$run/prompts.jsonl" --num-prompts 400 --max-concurrency 32 --disable-tqdm \
    --output-file "$run/report.jsonl" --save-outputs "$run/out.jsonl" >"$run/table.txt"
cat "$run/table.txt"

PYTHONPATH=$(dirname "$0") python3 - "$url" "$run" <<'EOF'
import sys
from bench_check import check_alone_generate, check_clean, reports, rows
url, run = sys.argv[1], sys.argv[2]
(r,) = reports(f"{run}/report.jsonl")
check_clean(r, "the report")
assert r["num_adapters"] == 200 and r["adapter_source"] == "prefix" and r["distinct_adapters"] >= 50, r
assert r["adapter_cold_loads"] > 0 and r["adapter_demand_loads_total"] > 0, r["adapter_metrics"]
out = rows(f"{run}/out.jsonl")
assert len(out) == 400
sample, seen = [], set()
for row in out:  # ten distinct adapters, the popular head and the tail
    if row["adapter"] not in seen and (len(sample) < 5 or int(row["adapter"].split("-")[1]) >= 20):
        seen.add(row["adapter"])
        sample.append(row)
    if len(sample) == 10:
        break
assert len(sample) == 10, [s["adapter"] for s in sample]
for row in sample:
    check_alone_generate(url, row)
answers = {}
for row in out:
    answers.setdefault(tuple(row["input_ids"]), {})[row["adapter"]] = tuple(row["output_ids"])
assert any(len(set(by_adapter.values())) >= 2 for by_adapter in answers.values()), "every adapter answered alike"
print(f"scale: {len(out)} requests over {r['distinct_adapters']} adapters, {r['adapter_cold_loads']:.0f} cold loads,"
      f" {r['adapter_demand_loads_total']:.0f} loads from disk: ok")
EOF
