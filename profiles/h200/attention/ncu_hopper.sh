#!/usr/bin/env bash
# Nsight Compute on the Hopper sparse MLA kernel: h128 T=128 (1 split, the throughput shape) and
# h128 T=8 (split-KV, the latency shape), FP8 KV. Writes OUTDIR/ncu-hopper.ncu-rep, the details
# page and the raw stall-reason / pipe metrics as CSV.
#   bash profiles/h200/attention/ncu_hopper.sh OUTDIR
set -euo pipefail
OUTDIR=${1:?usage: ncu_hopper.sh OUTDIR}
mkdir -p "$OUTDIR"
ncu -f -o "$OUTDIR/ncu-hopper" -k regex:hopper_mla_kernel -c 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
  python3 profiles/h200/attention/hopper_check.py 128-2048-128-fp8-1-full 128-2048-8-fp8-0-full
ncu --import "$OUTDIR/ncu-hopper.ncu-rep" --page details > "$OUTDIR/ncu-hopper-details.txt"
ncu --import "$OUTDIR/ncu-hopper.ncu-rep" --page raw --csv > "$OUTDIR/ncu-hopper-raw.csv"
# The headline: tensor pipe busy and the warp stall breakdown, per profiled launch.
python3 - "$OUTDIR/ncu-hopper-raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, data = rows[0], rows[2:]
keep = [i for i, h in enumerate(head) if "pipe_tensor" in h and "pct" in h or "warp_latency_issue_stalled" in h
        and h.endswith(".ratio") or h in ("gpu__time_duration.sum", "Grid Size", "Block Size")]
for r in data:
    print("----", r[head.index("Kernel Name")][:60] if "Kernel Name" in head else "")
    pairs = sorted(((head[i], r[i]) for i in keep), key=lambda p: p[0])
    for k, v in pairs:
        print(f"  {k:90s} {v}")
PY
