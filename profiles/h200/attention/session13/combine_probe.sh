#!/usr/bin/env bash
# The split combine on the H200: combine_sweep.py (every variant in the Hopper calls that combine), then
# Nsight Compute on the shipped combine where it was slow and where it was not, for the same 8 MB of
# partials: h64 T=4 at 32 splits (bf16 partials, 7.8 us in the split sweep), h64 T=8 at 16 (bf16, 5.5),
# h128 T=1 at 32 (fp32, 3.5). Carry ["build/sm90a", ".carry"] (for CUPTI timing), then
#   bash profiles/h200/attention/session13/combine_probe.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: combine_probe.sh OUTDIR}
P=profiles/h200/attention
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. profiles/h200/cupti_env.sh
mkdir -p "$OUT"
timeout 300 python3 $P/session13/combine_sweep.py "$OUT" > "$OUT/combine_sweep.log" 2>&1 || tail -5 "$OUT/combine_sweep.log"
for case in 64-2048-4-bf16-32-full 64-2048-8-bf16-16-full 128-2048-1-bf16-32-full; do
  timeout 100 ncu -f -o "$OUT/ncu-combine-$case" -k regex:combine -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats python3 $P/hopper_check.py "$case" > "$OUT/ncu-$case.log" 2>&1 ||
    tail -5 "$OUT/ncu-$case.log"
  ncu --import "$OUT/ncu-combine-$case.ncu-rep" --page details > "$OUT/ncu-combine-$case-details.txt" 2>&1
  echo "== $case"
  grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Grid Size|Block Size" \
    "$OUT/ncu-combine-$case-details.txt" | head -12
done
cat "$OUT/combine_sweep.log" | tail -30
