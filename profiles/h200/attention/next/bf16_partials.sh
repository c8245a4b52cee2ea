#!/usr/bin/env bash
# The Hopper kernel's split partials in bf16 (next/bf16_partials.patch) against the shipped fp32 ones, on
# the H200: shipped / patched / shipped again, each through bench_hopper.py, the patched tree also through
# the attention GPU tests and the sanitizers. Needs build/sm90a built from the shipped tree and
# .carry/bf16p/libhopper_mla.so built from the patched one, both on the CPU machine:
#   git apply profiles/h200/attention/next/bf16_partials.patch && python -m dsactl build --arch sm90a
#   mkdir -p .carry/bf16p && cp build/sm90a/libhopper_mla.so build/sm90a/manifest.json .carry/bf16p/
#   git apply -R profiles/h200/attention/next/bf16_partials.patch && python -m dsactl build --arch sm90a
# then, carrying ["build/sm90a", ".carry"]:
#   bash profiles/h200/attention/next/bf16_partials.sh OUTDIR
# BF16P_SANITIZE=0 leaves out the sanitizers (for a call that only decides whether the patch pays).
set -uo pipefail
OUT=${1:?usage: bf16_partials.sh OUTDIR}
P=profiles/h200/attention
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. profiles/h200/cupti_env.sh
for f in libhopper_mla.so manifest.json; do
  [ -f .carry/bf16p/$f ] || { echo "missing .carry/bf16p/$f: see this script's header"; exit 2; }
done
mkdir -p "$OUT"
# The patched library comes with its build manifest: the launcher refuses a library whose recorded source
# fingerprint is not the (now patched) source's.
cp build/sm90a/libhopper_mla.so /tmp/libhopper_mla.shipped.so
cp build/sm90a/manifest.json /tmp/manifest.shipped.json
python3 $P/bench_hopper.py "$OUT/fp32" > "$OUT/fp32.log" 2>&1 || tail -3 "$OUT/fp32.log"
git apply $P/next/bf16_partials.patch || exit 1
cp .carry/bf16p/libhopper_mla.so .carry/bf16p/manifest.json build/sm90a/
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py tests/test_attention.py \
  > "$OUT/pytest.txt" 2>&1
echo "patched tests: $(tail -1 "$OUT/pytest.txt")"
python3 $P/bench_hopper.py "$OUT/bf16" > "$OUT/bf16.log" 2>&1 || tail -3 "$OUT/bf16.log"
[ "${BF16P_SANITIZE:-1}" = 0 ] && tools=() || tools=(memcheck racecheck synccheck)
for tool in "${tools[@]}"; do
  timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 $P/hopper_check.py \
    128-2048-4-bf16-16-scattered 64-2048-8-fp8-16-scattered 128-2048-2-fp8-16-scattered > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$? $(grep -h 'SUMMARY' "$OUT/$tool.log" | tail -1)"
done
git apply -R $P/next/bf16_partials.patch
cp /tmp/libhopper_mla.shipped.so build/sm90a/libhopper_mla.so
cp /tmp/manifest.shipped.json build/sm90a/manifest.json
python3 $P/bench_hopper.py "$OUT/fp32-again" > "$OUT/fp32-again.log" 2>&1 || tail -3 "$OUT/fp32-again.log"
python3 - "$OUT" <<'PY'
import csv, sys
out = sys.argv[1]
runs = ("fp32", "bf16", "fp32-again")
tables = {r: list(csv.DictReader(open(f"{out}/{r}/hopper_vs_triton.csv"))) for r in runs}
rows = [["heads", "tokens", "kv", "splits"] + [f"{r}_us" for r in runs]]
for i, row in enumerate(tables["fp32"]):
    rows.append([row["heads"], row["tokens"], row["kv"], row["hopper_splits"]] + [tables[r][i]["hopper_us"] for r in runs])
csv.writer(open(f"{out}/bf16_partials.csv", "w", newline="")).writerows(rows)
for r in rows:
    print("".join(f"{c:>12}" for c in r))
PY
