#!/usr/bin/env python3
"""tests/tools/test_timeline.py — tests/gpu/timeline.py on a made-up kernel trace: a step ends
after the sampler's kernels whether a row samples (k_sample_draw) or all are greedy
(k_sample_finish last), and the report names the median step and the layer window."""
import csv
import io
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "gpu", "timeline.py")
sys.path.insert(0, os.path.join(HERE, "..", "gpu"))
import timeline  # noqa: E402

failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += not ok


def step(t0, tail):
    """a decode step from t0 (ns): two layers of attention and a GEMM, then the sampler"""
    rows, t = [], t0
    for name in ["k_embedding", "k_attention_tc", "k_gemv", "k_attention_tc", "k_gemv",
                 "k_sample_stats"] + tail:
        rows.append(("7", t, t + 1000, name))
        t += 1500
    return rows, t


def steps(n, tail):
    rows, t = [], 0
    for _ in range(n):
        r, t = step(t, tail)
        rows += r
    return rows


greedy = timeline.steps_of(steps(3, ["k_sample_finish"]))
check(len(greedy) == 3 and all(s[-1][3] == "k_sample_finish" and s[0][3] == "k_embedding"
                               for s in greedy), "greedy steps end with k_sample_finish: %d" % len(greedy))
sampled = timeline.steps_of(steps(4, ["k_sample_finish", "k_sample_select", "k_sample_draw"]))
check(len(sampled) == 4 and all(s[-1][3] == "k_sample_draw" and len(s) == 9 for s in sampled),
      "sampled steps keep the select and draw after finish: %d" % len(sampled))
partial = timeline.steps_of(steps(2, ["k_sample_finish"])[:-3])
check(len(partial) == 1, "a step cut before its sampler is not a step: %d" % len(partial))

# the whole tool on a CSV: labels, the median step's span, the layer window
buf = io.StringIO()
w = csv.writer(buf)
w.writerow(["label", "stream", "start_ns", "end_ns", "name"])
for r in steps(3, ["k_sample_finish"]):
    w.writerow(["base"] + list(r))
with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
    f.write(buf.getvalue())
    path = f.name
out = subprocess.run([sys.executable, TOOL, "--layer", "0", path], capture_output=True, text=True)
os.unlink(path)
check(out.returncode == 0 and "== base: 3 steps, median span 10.0 us" in out.stdout and
      "layer window: attention 0 to 1, 3.0 us" in out.stdout,
      "report: %r" % out.stdout.splitlines()[:3])
sys.exit(1 if failed else 0)
