#!/usr/bin/env bash
# The H200 session that produced everything under profiles/h200/.
# Run from the repository root on the GPU machine (no install needed: the
# checkout imports as is, with the image's torch/triton):
#   bash profiles/h200/run.sh check OUTDIR   # doctor, GPU tests, verify contest + edge
#   bash profiles/h200/run.sh perf  OUTDIR   # contest bench, ncu profiles, top-k scale bench
# The build is made beforehand (`dsactl build --arch sm90a`, same nvcc 13.0) and
# carried. CUPTI timing uses the cupti-python wheel when one is carried in .carry/.
set -uo pipefail
MODE=${1:?usage: run.sh check|perf OUTDIR}
OUT=${2:-/tmp/dsactl-h200}
P=profiles/h200
mkdir -p "$OUT" "$P"
export PYTHONUNBUFFERED=1 COLUMNS=200
DSACTL="python3 -m dsactl"
if ls .carry/cupti_python-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/cupti .carry/cupti_python-*.whl >/dev/null 2>&1 &&
    export PYTHONPATH=/tmp/cupti${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-18s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-150)"
  cp "$OUT/$name.log" "$P/logs-$MODE-$name.txt"
  tar czf "$OUT/results-$MODE.tgz" "$P" 2>/dev/null  # refreshed per step: a cut-off run still returns what it made
}

if [ "$MODE" = check ]; then
  step doctor 60 $DSACTL doctor --json "$P/doctor.json"
  cp "$OUT/doctor.log" "$P/doctor.txt"
  step pytest-gpu 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  step verify-contest 100 $DSACTL verify --suite contest --trials 1 --json "$P/verify-contest.json"
  step verify-edge 60 $DSACTL verify --suite edge --trials 1 --json "$P/verify-edge.json"
else
  step pytest-bench 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_bench.py
  step bench-contest-attention 120 $DSACTL bench --suite contest -d 'dsa_sparse_attention*' \
    --csv "$P/bench-contest-attention.csv" --plot "$P/plots-contest-attention"
  step bench-contest-indexer 230 $DSACTL bench --suite contest -d 'dsa_topk_indexer*' \
    --csv "$P/bench-contest-indexer.csv" --plot "$P/plots-contest-indexer"
  step profile-contest 80 $DSACTL profile --ncu roofline --suite contest \
    --workload contest-indexer-100 --workload contest-attention-001 -o "$P/ncu-contest"
  step bench-scale-topk 60 $DSACTL bench --suite scale -d 'dsa_topk_page_transform*' --no-reference --trials 1 \
    --iters 20 --csv "$P/bench-scale-topk.csv" --plot "$P/plots-scale-topk"
fi
tar czf "$OUT/results-$MODE.tgz" "$P" build/sm90a/report.json 2>/dev/null
