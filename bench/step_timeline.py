#!/usr/bin/env python3
"""bench/step_timeline.py — where the decode step's LoRA time goes, kernel by kernel, from
`bench_lora_cuda --step CSV` (CUPTI start/end of every kernel of 9 replays of each graph).

For each label (a whole-step row such as "ours", and "read", the read-only chain): the
replay of median span, cut into 128 ops (32 layers x qkv, o, gate_up, down) of n kernels
each; per group and kernel position within the op, the median duration, the median start
relative to the previous kernel's end (negative: it overlapped), and the op's period (its
last kernel's end minus the previous op's). Times in us.

    python3 bench/step_timeline.py trace.csv [label ...]
"""
import collections
import csv
import re
import statistics
import sys

GROUPS = ("qkv", "o", "gate_up", "down")
OPS = 32 * len(GROUPS)
REPLAYS = 9


def short(name):
    m = re.match(r"_Z(\d+)", name)  # mangled: the identifier after _Z<len>
    if m:
        return name[m.end():m.end() + int(m.group(1))]
    return re.sub(r"\(.*", "", name).replace("void ", "")


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    rows = collections.defaultdict(list)
    with open(argv[1]) as f:
        for r in csv.DictReader(f):
            if r["label"]:
                rows[r["label"]].append((int(r["start_ns"]), int(r["end_ns"]), short(r["name"])))
    for label in argv[2:] or rows:
        ks = sorted(rows.get(label, []))
        if not ks or len(ks) % (REPLAYS * OPS):
            print(f"{label}: {len(ks)} kernels, not {REPLAYS} replays of {OPS} ops")
            continue
        n = len(ks) // REPLAYS
        steps = [ks[i * n:(i + 1) * n] for i in range(REPLAYS)]
        spans = [s[-1][1] - s[0][0] for s in steps]
        step = steps[sorted(range(REPLAYS), key=lambda i: spans[i])[REPLAYS // 2]]
        per = n // OPS  # kernels per op
        print(f"\n== {label}: step span {statistics.median(spans) / 1e3:.1f} us (median of "
              f"{REPLAYS}), {per} kernel(s) per op")
        print(f"{'group':8} {'kernel':24} {'dur':>7} {'start-prev_end':>15} {'op period':>10}")
        total = 0.0
        for g, gname in enumerate(GROUPS):
            period = []
            for i in range(g, OPS, len(GROUPS)):
                if i > 0:
                    period.append(step[i * per + per - 1][1] - step[i * per - 1][1])
            for q in range(per):
                dur, lead = [], []
                for i in range(g, OPS, len(GROUPS)):
                    s, e, _ = step[i * per + q]
                    dur.append(e - s)
                    if i * per + q > 0:
                        lead.append(s - step[i * per + q - 1][1])
                name = step[g * per + q][2][:24]
                op = f"{statistics.median(period) / 1e3:10.2f}" if q == per - 1 else ""
                print(f"{gname:8} {name:24} {statistics.median(dur) / 1e3:7.2f} "
                      f"{statistics.median(lead) / 1e3:15.2f} {op}")
            total += statistics.median(period)
        print(f"sum of the groups' median periods x 32: {total * 32 / 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
