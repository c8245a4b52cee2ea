#!/usr/bin/env bash
# The H200 session that produced everything under profiles/h200/.
# Run from the repository root on the GPU machine (no install needed: the
# checkout imports as is, with the image's torch/triton):
#   bash profiles/h200/run.sh check OUTDIR   # build, GPU tests, verify, sanitizers
#   bash profiles/h200/run.sh perf  OUTDIR   # bench (contest + scale), ncu profiles
set -uo pipefail
MODE=${1:?usage: run.sh check|perf OUTDIR}
OUT=${2:-/tmp/dsactl-h200}
P=profiles/h200
mkdir -p "$OUT" "$P"
export PYTHONUNBUFFERED=1
DSACTL="python3 -m dsactl"

step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-18s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$(grep -v '^\s*$' "$OUT/$name.log" | tail -1 | cut -c1-150)"
}

if [ "$MODE" = check ]; then
  step doctor 60 $DSACTL doctor --json "$P/doctor.json"
  cp "$OUT/doctor.log" "$P/doctor.txt"
  step build 300 $DSACTL build --arch sm90a --fail-on-spills
  cp build/sm90a/report.json "$P/build-sm90a-report.json" 2>/dev/null
  step pytest-gpu 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests
  step verify-contest 240 $DSACTL verify --suite contest --trials 1 --json "$P/verify-contest.json"
  step verify-edge 200 $DSACTL verify --suite edge --trials 1 --json "$P/verify-edge.json"
  step sanitize 240 $DSACTL verify --suite edge --quick --sanitize --json "$P/sanitize-edge.json"
else
  step bench-contest 240 $DSACTL bench --suite contest --csv "$P/bench-contest.csv" --plot "$P/plots-contest"
  step bench-scale 300 $DSACTL bench --suite scale --no-reference --trials 2 --iters 30 --csv "$P/bench-scale.csv" --plot "$P/plots-scale"
  step profile-contest 240 $DSACTL profile --ncu roofline --suite contest \
    --workload contest-indexer-000 --workload contest-indexer-100 --workload contest-attention-001 -o "$P/ncu-contest"
fi
tar czf "$OUT/results-$MODE.tgz" "$P" build/sm90a/report.json 2>/dev/null
