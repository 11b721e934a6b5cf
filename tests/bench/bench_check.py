"""Checks shared by the loraserve-bench end-to-end tests (e2e.sh, scale.sh): a report is
complete and clean, saved answers are well formed, and a saved answer equals the same request
sent alone."""
import json
import urllib.request

STATS = ("mean", "median", "std", "p50", "p90", "p95", "p99", "max")
KEYS = ["backend", "request_rate", "max_concurrency", "duration", "completed", "failed", "errors",
        "error_samples", "total_input_tokens", "total_output_tokens", "request_throughput",
        "input_throughput", "output_throughput", "total_throughput", "concurrency", "slo_attainment",
        "adapter_metrics", "adapter_cold_loads", "num_prompts", "seed", "adapter_dist", "num_adapters",
        "adapter_source", "distinct_adapters", "base_url", "date", "vocab_size", "total_chunks",
        "bench_cpu_us_per_request", "bench_cpu_us_per_chunk", "max_inflight"]
KEYS += [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2e_latency") for s in STATS]


def reports(path):
    return [json.loads(line) for line in open(path)]


def check_clean(r, what):
    """Every key present, every request completed, throughput counted, TTFT within E2E."""
    missing = [k for k in KEYS if k not in r]
    assert not missing, f"{what}: missing {missing}"
    assert r["completed"] == r["num_prompts"] and r["failed"] == 0 and r["errors"] == {}, (what, r["errors"])
    for k in ("request_throughput", "output_throughput", "total_throughput", "duration"):
        assert r[k] > 0, (what, k, r[k])
    assert r["mean_ttft_ms"] <= r["mean_e2e_latency_ms"] and r["max_ttft_ms"] <= r["max_e2e_latency_ms"], what
    assert isinstance(r["adapter_metrics"], dict) and r["adapter_metrics"], what


def rows(path):
    """The --save-outputs lines, each without error and with TTFT within E2E."""
    out = [json.loads(line) for line in open(path)]
    for r in out:
        assert r["error"] is None and 0 <= r["ttft_ms"] <= r["e2e_ms"], r
    return out


def post(url, path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


def check_alone_generate(url, r):
    """A saved /generate answer equals the same greedy request sent alone."""
    alone = post(url, "/generate", {"input_ids": r["input_ids"], "lora_path": r["adapter"],
                                    "sampling_params": {"max_new_tokens": r["output_len"], "temperature": 0,
                                                        "ignore_eos": True}})
    assert alone["output_ids"] == r["output_ids"], (r["index"], r["adapter"], alone["output_ids"], r["output_ids"])
    assert len(r["output_ids"]) == r["output_tokens"] == r["output_len"], r
