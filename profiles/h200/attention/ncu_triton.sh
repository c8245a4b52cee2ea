#!/usr/bin/env bash
# Nsight Compute with per-instruction source counters on the Triton sparse MLA kernel at the issue-6
# throughput shape: 128 heads x 128 tokens, topk 2048, bf16 and FP8 KV (one split: the kernel alone,
# no combine). Writes OUTDIR/ncu-triton-CASE-details.txt and the SASS source page as
# OUTDIR/ncu-triton-CASE-source.csv.gz (the reports stay in /tmp).
#   bash profiles/h200/attention/ncu_triton.sh OUTDIR
set -uo pipefail
OUTDIR=${1:?usage: ncu_triton.sh OUTDIR}
mkdir -p "$OUTDIR"
HERE=$(dirname "$0")
for kv in bf16 fp8; do
  rep="/tmp/ncu-triton-h128-t128-$kv"
  # The first launch of each kernel compiles it; -c 1 after --launch-skip 1 profiles a warm launch.
  timeout 150 ncu -f -o "$rep" -k regex:_sparse_mla_ --launch-skip 1 -c 1 --set full --import-source yes \
    python3 - "$HERE" "$kv" <<'PY' | tail -2
import sys
sys.path.insert(0, sys.argv[1])
import torch
import bench_old_vs_new as bo
from dsactl.kernels.attention import triton_sparse_mla as mla
fp8 = sys.argv[2] == "fp8"
inputs, outputs = bo.prepared(bo.production_workload(128, 128, fp8))
call = bo.launcher_call(mla, inputs, outputs, fp8)
for _ in range(2):
    call()
torch.cuda.synchronize()
print("ran h128 T=128", sys.argv[2])
PY
  ncu --import "$rep.ncu-rep" --page details > "$OUTDIR/ncu-triton-h128-t128-$kv-details.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > \
    "$OUTDIR/ncu-triton-h128-t128-$kv-source.csv.gz"
done
