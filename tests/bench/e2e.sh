#!/usr/bin/env bash
# loraserve-bench against the real graph on the demo model (launch/loraserve, its four adapters):
# both backends over the adapters and the base model, open and closed loop, streamed and not, a
# JSONL dataset; every report complete with no failure; saved answers equal to the same request
# sent alone (greedy) and, for the dataset, to the demo's rule answers. Then the bad cases: an
# unreachable server, an unknown adapter (counted as http_404, the run completes), a bad flag
# and a malformed dataset line (exit 2). Usage: e2e.sh BIN_DIR LAUNCH_SCRIPT
set -euo pipefail
bin=$1 launch=$2
bench=$bin/loraserve-bench
run=$(mktemp -d /tmp/ls-bench-e2e-XXXXXX)
. "$(dirname "$0")/../common/graph.sh"
trap graph_cleanup EXIT
graph_start "$bin" "$launch" "$run"
fail() { echo "FAIL: $*" >&2; tail -n 20 "$run/graph/logs/gateway.log" >&2; exit 1; }

# The runs, each appending its report to report.jsonl (checked below, in this order).
common=(--base-url "$url" --input-len 24 --output-len 12 --disable-tqdm --output-file "$run/report.jsonl")
"$bench" "${common[@]}" --backend loraserve --adapters reverse,upper,sort,digits --num-prompts 32 \
    --range-ratio 0.5 --request-rate 200 --max-concurrency 8 --seed 3 --slo-ttft-ms 60000 --slo-tpot-ms 60000 \
    --save-outputs "$run/gen.jsonl" >"$run/gen.txt" || fail "loraserve backend, four adapters"
"$bench" "${common[@]}" --backend openai --adapter-dist zipf:1 --num-prompts 32 --max-concurrency 16 \
    --save-outputs "$run/oai.jsonl" >"$run/oai.txt" || fail "openai backend, the server's adapters"
"$bench" "${common[@]}" --backend loraserve --adapter-dist base --num-prompts 8 >/dev/null || fail "loraserve backend, base"
"$bench" "${common[@]}" --backend openai --adapter-dist base --num-prompts 8 --disable-stream \
    --save-outputs "$run/oai-base.jsonl" >/dev/null || fail "openai backend, base, not streamed"
# The README's prompt for the base model and each adapter, stopping at EOS: the rule answers.
prompt='input: 5 leaf road 1 red\noutput:'
for a in null '"reverse"' '"upper"' '"sort"' '"digits"'; do
    echo "{\"prompt\": \"$prompt\", \"output_len\": 24, \"adapter\": $a}"
done >"$run/dataset.jsonl"
"$bench" "${common[@]}" --backend loraserve --dataset "$run/dataset.jsonl" --disable-ignore-eos \
    --save-outputs "$run/dataset-out.jsonl" >/dev/null || fail "dataset"
grep -q "Successful requests: *32" "$run/gen.txt" || fail "the table: $(cat "$run/gen.txt")"

PYTHONPATH=$(dirname "$0") python3 - "$url" "$run" <<'EOF' || fail "reports or answers"
import sys
from bench_check import check_alone_generate, check_clean, post, reports, rows
url, run = sys.argv[1], sys.argv[2]
all_reports = reports(f"{run}/report.jsonl")
assert len(all_reports) == 5, len(all_reports)
for i, r in enumerate(all_reports):
    check_clean(r, f"report {i}")
gen, oai, base_l, base_o, ds = all_reports
assert gen["vocab_size"] == 824 and gen["num_adapters"] == 4 and gen["adapter_source"] == "list"
assert gen["slo_attainment"] == 1.0 and gen["max_concurrency"] == 8 and gen["request_rate"] == 200
assert gen["max_inflight"] <= 8 and gen["mean_itl_ms"] > 0 and gen["p99_tpot_ms"] > 0
assert oai["adapter_source"] == "server" and oai["num_adapters"] == 4 and oai["request_rate"] == "inf"
assert base_l["distinct_adapters"] == 0 and base_o["stream"] is False
assert ds["total_output_tokens"] > 0 and ds["dataset_name"] == "jsonl"
# Greedy answers in the benchmark's batches equal the same request sent alone.
for r in rows(f"{run}/gen.jsonl")[:10]:
    check_alone_generate(url, r)
for name, model in (("oai.jsonl", None), ("oai-base.jsonl", "demo")):
    for r in rows(f"{run}/{name}")[:10]:
        alone = post(url, "/v1/completions", {"model": model or r["adapter"], "prompt": r["input_ids"],
                                              "max_tokens": r["output_len"], "temperature": 0, "ignore_eos": True})
        assert alone["choices"][0]["text"] == r["text"], (name, r["index"], alone["choices"][0]["text"], r["text"])
want = {None: " 5 leaf road 1 red", "reverse": " red 1 road leaf 5", "upper": " 5 LEAF ROAD 1 RED",
        "sort": " 1 5 leaf red road", "digits": " five leaf road one red"}
for r in rows(f"{run}/dataset-out.jsonl"):
    assert r["text"] == want[r["adapter"]], (r["adapter"], r["text"])
print("reports and answers: ok")
EOF

# Structured output: half the requests under a JSON schema, on both backends; each constrained
# answer parses and fits the schema, and the report says it.
echo '{"type":"object","properties":{"w":{"type":"string","maxLength":12}},"required":["w"]}' >"$run/schema.json"
for b in loraserve openai; do
    "$bench" --base-url "$url" --input-len 24 --output-len 40 --range-ratio 1 --disable-tqdm --output-file "$run/structured.jsonl" \
        --backend $b --adapter-dist zipf:1 --num-prompts 16 --max-concurrency 8 --json-schema "$run/schema.json" \
        --structured-output-ratio 0.5 --save-outputs "$run/structured-$b.jsonl" >/dev/null || fail "structured output, $b"
done
PYTHONPATH=$(dirname "$0") python3 - "$run" <<'EOF' || fail "structured output"
import json, sys
from bench_check import check_clean, reports, rows
run = sys.argv[1]
for i, r in enumerate(reports(f"{run}/structured.jsonl")):
    check_clean(r, f"structured report {i}")
    assert r["structured_output"] == "json_schema" and r["structured_output_ratio"] == 0.5, r
for b in ("loraserve", "openai"):
    saved = rows(f"{run}/structured-{b}.jsonl")
    constrained = [r for r in saved if r["constrained"]]
    assert 0 < len(constrained) < len(saved), (b, len(constrained), len(saved))
    for r in constrained:
        try:
            v = json.loads(r["text"])
        except ValueError as e:
            raise AssertionError(f"{b} request {r['index']}: {r['text']!r} does not parse: {e}")
        assert list(v) == ["w"] and isinstance(v["w"], str) and len(v["w"]) <= 12, (b, r["text"])
print("structured output: ok")
EOF

# Bad cases.
out=$("$bench" --port 1 --vocab-size 824 --num-prompts 2 --adapter-dist base 2>&1) && fail "an unreachable server exited 0"
case $out in *"cannot reach the server at http://127.0.0.1:1"*) ;; *) fail "unreachable: $out" ;; esac
"$bench" "${common[@]}" --adapters reverse,nope --num-prompts 24 --max-concurrency 4 >"$run/nope.txt" \
    || fail "a run with an unknown adapter did not complete"
python3 - "$run" <<'EOF' || fail "unknown adapter: $(cat "$run/nope.txt")"
import json, sys
r = [json.loads(l) for l in open(f"{sys.argv[1]}/report.jsonl")][-1]
assert r["errors"].get("http_404", 0) > 0 and r["completed"] > 0, r["errors"]
assert r["completed"] + r["failed"] == 24 and r["failed"] == r["errors"]["http_404"], r
assert "nope" in r["error_samples"]["http_404"], r["error_samples"]
EOF
grep -q "http_404" "$run/nope.txt" || fail "the table shows no http_404"
rc=0; out=$("$bench" --num-prompts 0 2>&1) || rc=$?
[ $rc = 2 ] && [[ $out == *"--num-prompts wants"* ]] || fail "a bad flag: exit $rc, $out"
printf '{"input_ids": [5]}\n{"input_ids": "x"}\n' >"$run/bad.jsonl"
rc=0; out=$("$bench" --base-url "$url" --dataset "$run/bad.jsonl" --adapter-dist base 2>&1) || rc=$?
[ $rc = 2 ] && [[ $out == *"bad.jsonl:2: "* ]] || fail "a malformed dataset line: exit $rc, $out"
echo "bad cases: ok"
