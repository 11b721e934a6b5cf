#!/usr/bin/env python3
"""tests/gpu/timeline.py — read a kernel timeline (bench_decode_cuda --trace CSV, or
bench_lora_cuda --step CSV with --ops) and say where a decode step's time goes when kernels
overlap.

For each workload label: the steps (each ends with the sampler's kernels: k_sample_finish and
any k_sample_* right after it, k_sample_draw where a row samples), and
for the median step: its span, the busy time and kernel sum of each stream, the main
stream's idle gaps (waiting on a join, or on launches) summed by the kernels around them,
and per kernel name on each stream the time it ran. The main stream is the one running the
GEMMs (most kernel time).

    python3 tests/gpu/timeline.py [--layer N] trace.csv [label ...]

--layer N also lists, for the median step, every kernel from the N-th attention kernel to the
next one (one decoder layer, from its attention on) in start order: start and end in us from
the window's start, stream, name; so the critical path through a layer can be read off.

    python3 tests/gpu/timeline.py --ops trace.csv [label ...]

--ops reads bench_lora_cuda's trace instead (9 replays of a graph of the LoRA ops alone per
label, such as "ours" or "read"): the replay of median span cut into 128 ops (32 layers x
qkv, o, gate_up, down); per group and kernel position within the op, the median duration,
the median start relative to the previous kernel's end (negative: it overlapped), and the
op's period (its last kernel's end minus the previous op's). Times in us.
"""
import collections
import csv
import re
import statistics
import sys


def short(name):
    m = re.match(r"_Z(\d+)", name)  # CUPTI gives mangled names: the identifier after _Z<len>
    if m:
        n = int(m.group(1))
        return name[m.end():m.end() + n]
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"<.*", "", name)
    return name[:48]


def steps_of(rows):
    rows.sort(key=lambda r: r[1])
    steps, cur, sampled = [], [], False
    for r in rows:
        if sampled and "k_sample_" not in r[3]:
            steps.append(cur)
            cur, sampled = [], False
        cur.append(r)
        sampled = sampled or "k_sample_finish" in r[3]
    if sampled:
        steps.append(cur)
    return steps


def layer_window(st, n):
    att = [r for r in st if "attention" in r[3]]
    if len(att) <= n + 1:
        print(f"  (no attention kernel {n + 1} in the step)")
        return
    t0, t1 = att[n][1], att[n + 1][1]
    print(f"  layer window: attention {n} to {n + 1}, {(t1 - t0) / 1e3:.1f} us")
    for r in sorted((r for r in st if t0 <= r[1] < t1), key=lambda r: r[1]):
        print(f"    {(r[1] - t0) / 1e3:8.1f} {(r[2] - t0) / 1e3:8.1f}  s{r[0]:<4} {short(r[3])}")


def report(label, rows, layer=None):
    steps = steps_of(rows)
    if not steps:
        print(f"== {label}: no complete step")
        return
    spans = [s[-1][2] - s[0][1] for s in steps]
    med = sorted(range(len(steps)), key=lambda i: spans[i])[len(steps) // 2]
    st = steps[med]
    span = spans[med]
    by_stream = collections.defaultdict(list)
    for r in st:
        by_stream[r[0]].append(r)
    main = max(by_stream, key=lambda s: sum(r[2] - r[1] for r in by_stream[s]))
    print(f"\n== {label}: {len(steps)} steps, median span {span / 1e3:.1f} us "
          f"(all: {min(spans) / 1e3:.0f}..{max(spans) / 1e3:.0f} us)")
    for s, rs in sorted(by_stream.items(), key=lambda kv: kv[0] != main):
        ksum = sum(r[2] - r[1] for r in rs)
        print(f"  stream {s}{' (main)' if s == main else ''}: {len(rs)} kernels, "
              f"{ksum / 1e3:.1f} us of kernels = {100 * ksum / span:.0f}% of the span")
    rs = by_stream[main]
    gaps = collections.Counter()
    gap_n = collections.Counter()
    total_gap = 0
    for a, b in zip(rs, rs[1:]):
        g = b[1] - a[2]
        if g > 0:
            key = f"{short(a[3])} -> {short(b[3])}"
            gaps[key] += g
            gap_n[key] += 1
            total_gap += g
    if layer is not None:
        layer_window(st, layer)
    print(f"  main-stream gaps: {total_gap / 1e3:.1f} us in all; largest by neighbours:")
    for k, g in gaps.most_common(12):
        print(f"    {g / 1e3:8.1f} us {gap_n[k]:4d}x  {k}")
    for s, rs in sorted(by_stream.items(), key=lambda kv: kv[0] != main):
        per = collections.Counter()
        cnt = collections.Counter()
        for r in rs:
            per[short(r[3])] += r[2] - r[1]
            cnt[short(r[3])] += 1
        print(f"  stream {s} kernels:")
        for k, t in per.most_common(10):
            print(f"    {t / 1e3:8.1f} us {cnt[k]:4d}x {t / cnt[k] / 1e3:7.2f} us  {k}")


GROUPS = ("qkv", "o", "gate_up", "down")
OPS = 32 * len(GROUPS)
REPLAYS = 9


def ops_report(label, rows):
    ks = sorted(rows, key=lambda r: r[1])
    if not ks or len(ks) % (REPLAYS * OPS):
        print(f"{label}: {len(ks)} kernels, not {REPLAYS} replays of {OPS} ops")
        return
    n = len(ks) // REPLAYS
    steps = [ks[i * n:(i + 1) * n] for i in range(REPLAYS)]
    spans = [s[-1][2] - s[0][1] for s in steps]
    step = steps[sorted(range(REPLAYS), key=lambda i: spans[i])[REPLAYS // 2]]
    per = n // OPS  # kernels per op
    print(f"\n== {label}: step span {statistics.median(spans) / 1e3:.1f} us (median of "
          f"{REPLAYS}), {per} kernel(s) per op")
    print(f"{'group':8} {'kernel':24} {'dur':>7} {'start-prev_end':>15} {'op period':>10}")
    total = 0.0
    for g, gname in enumerate(GROUPS):
        ops = range(g, OPS, len(GROUPS))
        period = [step[i * per + per - 1][2] - step[i * per - 1][2] for i in ops if i > 0]
        for q in range(per):
            dur = [step[i * per + q][2] - step[i * per + q][1] for i in ops]
            lead = [step[i * per + q][1] - step[i * per + q - 1][2] for i in ops if i * per + q > 0]
            op = f"{statistics.median(period) / 1e3:10.2f}" if q == per - 1 else ""
            print(f"{gname:8} {short(step[g * per + q][3])[:24]:24} "
                  f"{statistics.median(dur) / 1e3:7.2f} {statistics.median(lead) / 1e3:15.2f} {op}")
        total += statistics.median(period)
    print(f"sum of the groups' median periods x 32: {total * 32 / 1e3:.1f} us")


def main():
    args = sys.argv[1:]
    layer, ops = None, False
    if args[:1] == ["--layer"]:
        layer = int(args[1])
        args = args[2:]
    elif args[:1] == ["--ops"]:
        ops = True
        args = args[1:]
    if not args:
        print(__doc__)
        return 2
    path = args[0]
    want = args[1:]
    by_label = collections.defaultdict(list)
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["label"]:
                by_label[r["label"]].append((r["stream"], int(r["start_ns"]),
                                             int(r["end_ns"]), r["name"]))
    for label, rows in by_label.items():
        if not want or label in want:
            if ops:
                ops_report(label, rows)
            else:
                report(label, rows, layer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
