#!/usr/bin/env bash
# One H200 session for the sparse MLA attention kernel: GPU tests, old-vs-new timing,
# compute-sanitizer, contest bench. Run from the repository root on the GPU machine:
#   bash profiles/h200/attention/run_h200.sh OLD.py OUTDIR
# OLD.py: the launcher to compare against (git show <rev>:kernels/attention/triton_sparse_mla.py).
# CUPTI timing uses the cupti-python wheel when one is carried in .carry/.
set -uo pipefail
OLD=${1:?usage: run_h200.sh OLD.py OUTDIR}
OUT=${2:?usage: run_h200.sh OLD.py OUTDIR}
mkdir -p "$OUT/logs"
# The scripts under profiles/ import dsactl from the checkout (no install).
export PYTHONUNBUFFERED=1 COLUMNS=200 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ls .carry/cupti_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/cupti .carry/cupti_python-*.whl >/dev/null 2>&1 &&
    export PYTHONPATH=/tmp/cupti${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/logs/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  printf '%-10s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -1 | cut -c1-150)" | tee -a "$OUT/summary.txt"
  tar czf "$OUT/logs.tgz" -C "$OUT" logs  # refreshed per step: a cut-off run still returns what it made
}

P=profiles/h200/attention
step pytest 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py
step timing 110 python3 $P/bench_old_vs_new.py "$OLD" "$OUT"
step memcheck 45 compute-sanitizer --tool memcheck --error-exitcode 1 python3 $P/sanitize_attention.py all
step bench 40 python3 -m dsactl bench --suite contest -d 'dsa_sparse_attention*' --no-reference --trials 1 \
  --iters 20 --csv "$OUT/bench-contest-attention.csv"
step racecheck 35 compute-sanitizer --tool racecheck --error-exitcode 1 python3 $P/sanitize_attention.py contest
grep -A60 '^workload ' "$OUT/logs/timing.log" | cut -c1-100
cat "$OUT/summary.txt"
