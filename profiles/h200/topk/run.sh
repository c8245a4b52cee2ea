#!/usr/bin/env bash
# The H200 call behind profiles/h200/topk/ (run 3, session 4): the whole GPU test suite on the
# build under test, side-by-side timing of builds, Nsight Compute with per-instruction stall
# samples, compute-sanitizer. Run from the repository root on the GPU machine with build/sm90a
# (dsactl build --arch sm90a) and .carry/ (the cupti-python wheel; the baseline and variant builds
# in .carry/topk/, made as README.md says) carried:
#   bash profiles/h200/topk/run.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: run.sh OUTDIR}
LOGS=$(mktemp -d)/logs
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 COLUMNS=200
. profiles/h200/cupti_env.sh
V=.carry/topk
T=profiles/h200/topk
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
step() {  # step NAME SECONDS CMD...: time-limited, logged to NAME.log, logs packed into $OUT after each
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  printf '%-16s rc=%-3s %4ss  %s\n' "$name" "$?" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-150)"
  tar czf "$OUT/logs.tgz" -C "$LOGS/.." logs
}
LIBS=(--lib new=build/sm90a/libtopk.so --lib base=$V/libtopk_base.so)
for f in $V/libtopk_*.so; do
  n=$(basename "$f" .so); n=${n#libtopk_}
  [ "$n" = base ] || LIBS+=(--lib "$n=$f:$(cat "$V/$n.scope" 2>/dev/null || echo all)")
done
step pytest-gpu 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests
step sweep 150 python3 $T/sweep.py --csv "$OUT/sweep-topk.csv" "${LIBS[@]}"
for shape in bf16:1x5824 fp32:64x131072; do  # the second (warm) launch of each shape
  name=ncu-${shape/:/-}
  step "$name" 60 ncu -f -o "$OUT/$name" -k regex:topk --launch-skip 1 -c 1 --import-source yes --set full \
    python3 $T/profile_shape.py "$shape"
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$OUT/$name-source.csv.gz"
done
ncu --import "$OUT/ncu-fp32-64x131072.ncu-rep" --page details > "$OUT/ncu-details.txt" 2>&1
step e2e 120 env PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} python3 profiles/h200/indexer/topk_in_e2e.py \
  --lib new=build/sm90a/libtopk.so --lib base=$V/libtopk_base.so --csv "$OUT/topk_in_e2e.csv"
step bench 100 python3 -m dsactl bench --suite scale -d 'dsa_topk_page_transform*' --no-reference --trials 1 \
  --iters 20 --csv "$OUT/bench-scale-topk.csv" --plot "$OUT/plots"
step memcheck 90 compute-sanitizer --tool memcheck --kernel-name kns=topk --error-exitcode 9 python3 $T/check_paths.py
step racecheck-cluster 60 compute-sanitizer --tool racecheck --kernel-name kns=topk_page_transform_kernel \
  --error-exitcode 9 python3 $T/check_paths.py --only cluster-wide-cached
step racecheck-row 60 compute-sanitizer --tool racecheck --kernel-name kns=topk_row_kernel \
  --error-exitcode 9 python3 $T/check_paths.py --only row
grep -h "WRONG\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY\|Internal Sanitizer\|passed\|failed" "$LOGS"/*.log | head -30
cat "$LOGS/e2e.log" "$LOGS/sweep.log"
