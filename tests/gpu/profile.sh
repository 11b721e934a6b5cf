#!/usr/bin/env bash
# tests/gpu/profile.sh — where a decode step's time goes, kernel by kernel, on the GPU machine.
#
# Runs bench_decode_cuda (from .device-bundle, see tests/gpu/run.sh prepare) under Nsight
# Compute with only the kernel duration collected (clocks and caches left as they are, so a
# kernel runs as it does in serving, but one at a time: overlap between kernels is not seen),
# over the bench's "base" and "8 distinct" NVTX ranges (graph nodes profiled one by one), and
# prints per range the kernels by total time: the step splits into GEMMs, attention, LoRA,
# conversions. Needs ncu on the machine (/usr/local/cuda/bin there).
#   run(command="tests/gpu/profile.sh", carry=[".device-bundle"])
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$PWD
source tests/gpu/bundle.sh
out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
[[ -n $ncu ]] || { echo "profile.sh: no ncu on this machine"; exit 2; }
bundle_unpack .device-bundle
export LD_LIBRARY_PATH=$root/.device-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ranges=${LS_PROFILE_RANGES:-base/,8 distinct/}
args=()
IFS=, read -ra rs <<<"$ranges"
for r in "${rs[@]}"; do args+=(--nvtx-include "$r"); done
"$ncu" --nvtx "${args[@]}" --metrics gpu__time_duration.sum --cache-control none \
  --clock-control none --csv --page raw --print-units base \
  .device-bundle/bin/bench_decode_cuda --steps 1 >"$out/ncu.csv" 2>"$out/ncu.err"
rc=$?
[[ $rc == 0 ]] || { tail -20 "$out/ncu.err"; tail -5 "$out/ncu.csv"; exit 1; }
python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections, re
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.DictReader(lines))
if not rows:
    sys.exit("profile.sh: no kernels in the ncu output")
cols = list(rows[0].keys())
rng = next((c for c in cols if "Push/Pop" in c), None)
by = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0]))
for r in rows:
    try:  # ncu writes thousands separators; the units row does not parse
        t = float(r["gpu__time_duration.sum"].replace(",", ""))
    except ValueError:
        continue
    m = re.search(r"<default domain>:([^:]*):", r[rng]) if rng else None
    e = by[m.group(1) if m else "all"][r["Kernel Name"][:100]]
    e[0] += t
    e[1] += 1
for key, ks in by.items():
    tot = sum(v[0] for v in ks.values())
    print(f"\n== {key}: {tot / 1e6:.3f} ms of kernels, {sum(v[1] for v in ks.values())} launches "
          "(warm-up and timed steps together: 1 + 3 steps; ncu runs kernels one at a time)")
    for name, (t, n) in sorted(ks.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"{t / 1e6:9.3f} ms {n:6d}x {t / n / 1e3:8.2f} us  {name}")
PY
