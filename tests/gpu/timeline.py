#!/usr/bin/env python3
"""tests/gpu/timeline.py — read a kernel timeline (bench_decode_cuda --trace CSV) and say
where a decode step's time goes when kernels overlap.

For each workload label: the steps (each ends with the sampling kernel k_sample_draw), and
for the median step: its span, the busy time and kernel sum of each stream, the main
stream's idle gaps (waiting on a join, or on launches) summed by the kernels around them,
and per kernel name on each stream the time it ran. The main stream is the one running the
GEMMs (most kernel time).

    python3 tests/gpu/timeline.py [--layer N] trace.csv [label ...]

--layer N also lists, for the median step, every kernel from the N-th attention kernel to the
next one (one decoder layer, from its attention on) in start order: start and end in us from
the window's start, stream, name; so the critical path through a layer can be read off.
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
    steps, cur = [], []
    for r in rows:
        cur.append(r)
        if "k_sample_draw" in r[3]:
            steps.append(cur)
            cur = []
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


def main():
    args = sys.argv[1:]
    layer = None
    if args[:1] == ["--layer"]:
        layer = int(args[1])
        args = args[2:]
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
            report(label, rows, layer)


if __name__ == "__main__":
    main()
