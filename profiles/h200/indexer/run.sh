#!/usr/bin/env bash
# The H200 measurements of profiles/h200/indexer/ (README.md there).
#   bash profiles/h200/indexer/run.sh prepare      # here: the baseline copy of kernels/indexer (BASE, default HEAD)
#                                                  # into .carry/indexer_old, then `dsactl build --arch sm90a`
#   bash profiles/h200/indexer/run.sh device OUT   # on the H200 (device `run`, carry build/sm90a and .carry)
set -uo pipefail
MODE=${1:?usage: run.sh prepare|device OUT}
HERE=profiles/h200/indexer
if [ "$MODE" = prepare ]; then
  BASE=${BASE:-$(git rev-parse --short HEAD)}
  mkdir -p .carry/indexer_old/old_indexer
  for f in score passthrough solution; do
    git show "$BASE:kernels/indexer/$f.py" | sed -e 's/dsactl\.kernels\.indexer\.passthrough/old_indexer.passthrough/' \
      -e 's/dsactl\.kernels\.indexer\.score/old_indexer.score/' > ".carry/indexer_old/old_indexer/$f.py"
  done
  echo "\"\"\"kernels/indexer at $BASE (imports rewritten): the baseline of $HERE.\"\"\"" \
    > .carry/indexer_old/old_indexer/__init__.py
  exec python -m dsactl build --arch sm90a
fi
OUT=${2:?OUT}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. profiles/h200/cupti_env.sh
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the scripts import dsactl from the checkout
# The solution calls the CUDA top-k: its build must match the sources that travelled (kernels/topk is
# edited concurrently), else it is rebuilt here.
if ! python3 -c "from dsactl.kernels.topk.launcher import _library; _library()" 2>/dev/null; then
  echo "top-k build stale or missing: dsactl build --arch sm90a on the device"
  python3 -m dsactl build --arch sm90a -j 16 >"$OUT/build.log" 2>&1 || { tail -5 "$OUT/build.log"; exit 1; }
fi
t0=$SECONDS
# Correctness first, the two at once (neither is timed): the GPU tests and memcheck.
(timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_indexer.py >"$OUT/pytest-gpu.log" 2>&1
 echo "rc=$?" >>"$OUT/pytest-gpu.log") &
(PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 110 compute-sanitizer --tool memcheck --error-exitcode 1 \
   python3 $HERE/memcheck.py >"$OUT/memcheck.log" 2>&1
 echo "rc=$?" >>"$OUT/memcheck.log") &
wait
echo "correctness: $((SECONDS - t0)) s"
tail -2 "$OUT/pytest-gpu.log"; grep -E "ERROR SUMMARY|ok$|rc=" "$OUT/memcheck.log"
# Timing alone on the GPU.
timeout "${BENCH_LIMIT:-150}" python3 $HERE/bench_indexer.py ${BENCH_MODES:-sweep e2e contest} --out "$OUT" \
  >"$OUT/bench.log" 2>&1
echo "bench rc=$? total $((SECONDS - t0)) s"
grep -A40 "^scoring alone" "$OUT/bench.log"; grep -E "^(passthrough|scored|all) |^\{|: [0-9.]+ s$" "$OUT/bench.log"
