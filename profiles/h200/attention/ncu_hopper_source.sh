#!/usr/bin/env bash
# Nsight Compute with per-instruction source counters (stall samples, executed instructions) on the
# Hopper sparse MLA kernel: h128 T=128 FP8 and bf16 (1 split, the throughput shape) and h128 T=8
# FP8 (split-KV, the latency shape), or the hopper_check.py CASEs given. Writes
# OUTDIR/ncu-src-CASE-details.txt and the SASS source page as OUTDIR/ncu-src-CASE-source.csv.gz (the
# reports themselves stay in /tmp).
#   bash profiles/h200/attention/ncu_hopper_source.sh OUTDIR [CASE ...]
set -uo pipefail
OUTDIR=${1:?usage: ncu_hopper_source.sh OUTDIR [CASE ...]}; shift
mkdir -p "$OUTDIR"
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(128-2048-128-fp8-1-full 128-2048-128-bf16-1-full 128-2048-8-fp8-0-full)
for case in "${cases[@]}"; do
  rep="/tmp/ncu-src-$case"
  timeout 120 ncu -f -o "$rep" -k regex:hopper_mla_kernel -c 1 --set full --import-source yes \
    python3 profiles/h200/attention/hopper_check.py "$case" | tail -3
  ncu --import "$rep.ncu-rep" --page details > "$OUTDIR/ncu-src-$case-details.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUTDIR/ncu-src-$case-source.csv.gz"
done
