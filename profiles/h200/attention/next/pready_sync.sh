#!/usr/bin/env bash
# The prepared Hopper patch next/pready_sync.patch (consumer 0 syncs on kBarPReady instead of arriving)
# on the H200: racecheck RUNS times (default 3) on the calls that reported the rescale-factor hand-off
# (session 12: the bf16 cp.async kernel; session 13: the FP8 cluster kernel), shipped build then patched,
# the attention GPU tests on the patched tree, and its A/B/A against the shipped build (session13/ab.sh).
# Prepared on the CPU machine from a clean tree (venv active):
#   mkdir -p .carry/shipped .carry/pready_sync
#   python -m dsactl build --arch sm90a && cp build/sm90a/libhopper_mla.so build/sm90a/manifest.json .carry/shipped/
#   git apply profiles/h200/attention/next/pready_sync.patch && python -m dsactl build --arch sm90a
#   cp build/sm90a/libhopper_mla.so build/sm90a/manifest.json .carry/pready_sync/
#   git apply -R profiles/h200/attention/next/pready_sync.patch && python -m dsactl build --arch sm90a
# (and the cupti wheel in .carry/, session11/prepare_carry.sh), then carry ["build/sm90a", ".carry"]:
#   bash profiles/h200/attention/next/pready_sync.sh OUTDIR
set -uo pipefail
OUT=${1:?usage: pready_sync.sh OUTDIR}
P=profiles/h200/attention
PATCH=$P/next/pready_sync.patch
CASES="128-2048-16-fp8-4-scattered 128-2048-32-fp8-2-scattered 128-1024-2-bf16-2-empty-cluster"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for f in .carry/shipped/libhopper_mla.so .carry/pready_sync/libhopper_mla.so .carry/pready_sync/manifest.json; do
  [ -f "$f" ] || { echo "missing $f: see this script's header"; exit 2; }
done
mkdir -p "$OUT"
racecheck() {  # racecheck NAME: RUNS runs, one process per case (a cut-off run keeps the others)
  for i in $(seq "${RUNS:-3}"); do
    for c in $CASES; do
      timeout 150 compute-sanitizer --tool racecheck --error-exitcode 1 python3 $P/hopper_check.py "$c" \
        > "$OUT/racecheck-$1-$c-$i.txt" 2>&1
      echo "$1 run $i $c: rc=$? $(grep -h 'RACECHECK SUMMARY' "$OUT/racecheck-$1-$c-$i.txt" | cut -c1-80)"
    done
  done
}
racecheck shipped
git apply "$PATCH" || exit 1
cp .carry/pready_sync/libhopper_mla.so .carry/pready_sync/manifest.json build/sm90a/
racecheck patched
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py > "$OUT/pytest.txt" 2>&1
echo "patched tests: $(tail -1 "$OUT/pytest.txt")"
PATCH=$PATCH PREV=.carry/shipped TITLE="consumer 0 syncs on kBarPReady" bash $P/session13/ab.sh "$OUT/ab"
git apply -R "$PATCH"
cp .carry/shipped/libhopper_mla.so .carry/shipped/manifest.json build/sm90a/
