#!/usr/bin/env bash
# The H200 call behind profiles/h200/topk/: GPU tests, side-by-side timing of builds, dsactl bench
# against torch.topk, compute-sanitizer. Run from the repository root on the GPU machine with
# build/sm90a (dsactl build --arch sm90a) and .carry/ (the cupti-python wheel; the baseline and
# variant builds in .carry/topk/, made as README.md says) carried:
#   bash profiles/h200/topk/run.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: run.sh OUTDIR}
LOGS=$(mktemp -d)/logs
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 COLUMNS=200
python3 -m pip install -q --no-deps --no-index --target /tmp/cupti .carry/cupti_python-*.whl >/dev/null 2>&1 &&
  export PYTHONPATH=/tmp/cupti${PYTHONPATH:+:$PYTHONPATH}
V=.carry/topk
CHECK=profiles/h200/topk/check_paths.py
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader
step() {  # step NAME SECONDS CMD...: time-limited, logged to NAME.log, logs packed into $OUT after each
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  printf '%-16s rc=%-3s %4ss  %s\n' "$name" "$?" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-150)"
  tar czf "$OUT/logs.tgz" -C "$LOGS/.." logs
}
step pytest 100 python3 -m pytest -q -m gpu --maxfail=5 -p no:cacheprovider tests/test_topk.py
step sweep 100 python3 profiles/h200/topk/sweep.py --csv "$OUT/sweep-topk.csv" \
  --lib new=build/sm90a/libtopk.so --lib old=$V/libtopk_old.so --lib t512=$V/libtopk_t512.so:short \
  --lib nopf=$V/libtopk_nopf.so:short --lib c8=$V/libtopk_c8.so:long
step bench 100 python3 -m dsactl bench --suite scale -d 'dsa_topk_page_transform*' --no-reference --trials 1 \
  --iters 20 --csv "$OUT/bench-scale-topk.csv" --plot "$OUT/plots"
step memcheck 60 compute-sanitizer --tool memcheck --kernel-name kns=topk --error-exitcode 9 python3 $CHECK
step racecheck-row 40 compute-sanitizer --tool racecheck --kernel-name kns=topk_row_kernel --error-exitcode 9 \
  python3 $CHECK --only row
step racecheck-cluster 60 compute-sanitizer --tool racecheck --kernel-name kns=topk_page_transform_kernel \
  --error-exitcode 9 python3 $CHECK --only cluster-cached
grep -q "Internal Sanitizer Error" "$LOGS/racecheck-cluster.log" &&  # the same case on the previous build
  step racecheck-old 40 compute-sanitizer --tool racecheck --kernel-name kns=topk_page_transform_kernel \
    --error-exitcode 9 python3 $CHECK --only cluster-cached --lib $V/libtopk_old.so
grep -h "WRONG\|FAILED\|ERROR SUMMARY\|RACECHECK SUMMARY\|Internal Sanitizer\|passed\|failed" "$LOGS"/*.log | head -30
cat "$LOGS/sweep.log"
