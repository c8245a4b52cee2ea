#!/usr/bin/env bash
# A prepared Hopper-kernel patch (next/NAME.patch) against the shipped build, on the H200: shipped /
# patched / shipped again, each through bench_hopper.py; the patched tree also through the attention
# GPU tests and, unless SANITIZE=0, memcheck, racecheck and synccheck on the patch's cases (below).
# The patched library is built on the CPU machine with its manifest, since the launcher refuses a
# library whose recorded source fingerprint is not the (then patched) source's:
#   bash profiles/h200/attention/session11/prepare_carry.sh     # .carry/NAME/ for every patch here
# then, carrying ["build/sm90a", ".carry"]:
#   bash profiles/h200/attention/next/hopper_patch_ab.sh NAME OUTDIR
# Writes OUTDIR/{shipped,patched,shipped-again}/hopper_vs_triton.csv and OUTDIR/NAME.csv (hopper_us per
# shape and run); restores the tree and the build.
set -uo pipefail
NAME=${1:?usage: hopper_patch_ab.sh NAME OUTDIR}
OUT=${2:?usage: hopper_patch_ab.sh NAME OUTDIR}
P=profiles/h200/attention
case "$NAME" in
  # The 16-split shapes whose partials the patch halves, bf16 and FP8.
  bf16_partials) CASES=(128-2048-4-bf16-16-scattered 64-2048-8-fp8-16-scattered 128-2048-2-fp8-16-scattered) ;;
  *) echo "unknown patch $NAME (bf16_partials)"; exit 2 ;;
esac
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. profiles/h200/cupti_env.sh
for f in libhopper_mla.so manifest.json; do
  [ -f ".carry/$NAME/$f" ] || { echo "missing .carry/$NAME/$f: see this script's header"; exit 2; }
done
mkdir -p "$OUT"
cp build/sm90a/libhopper_mla.so /tmp/libhopper_mla.shipped.so
cp build/sm90a/manifest.json /tmp/manifest.shipped.json
python3 $P/bench_hopper.py "$OUT/shipped" > "$OUT/shipped.log" 2>&1 || tail -3 "$OUT/shipped.log"
git apply "$P/next/$NAME.patch" || exit 1
cp ".carry/$NAME/libhopper_mla.so" ".carry/$NAME/manifest.json" build/sm90a/
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py tests/test_attention.py \
  > "$OUT/pytest.txt" 2>&1
echo "patched tests: $(tail -1 "$OUT/pytest.txt")"
python3 $P/bench_hopper.py "$OUT/patched" > "$OUT/patched.log" 2>&1 || tail -3 "$OUT/patched.log"
[ "${SANITIZE:-1}" = 0 ] && tools=() || tools=(memcheck racecheck synccheck)
for tool in "${tools[@]}"; do
  timeout 150 compute-sanitizer --tool "$tool" --error-exitcode 1 python3 $P/hopper_check.py "${CASES[@]}" \
    > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$? $(grep -h 'SUMMARY' "$OUT/$tool.log" | tail -1)"
done
git apply -R "$P/next/$NAME.patch"
cp /tmp/libhopper_mla.shipped.so build/sm90a/libhopper_mla.so
cp /tmp/manifest.shipped.json build/sm90a/manifest.json
python3 $P/bench_hopper.py "$OUT/shipped-again" > "$OUT/shipped-again.log" 2>&1 || tail -3 "$OUT/shipped-again.log"
python3 - "$OUT" "$NAME" <<'PY'
import csv, sys
out, name = sys.argv[1:]
runs = ("shipped", "patched", "shipped-again")
tables = {r: list(csv.DictReader(open(f"{out}/{r}/hopper_vs_triton.csv"))) for r in runs}
rows = [["heads", "tokens", "kv", "splits"] + [f"{r}_us" for r in runs]]
for i, row in enumerate(tables["shipped"]):
    rows.append([row["heads"], row["tokens"], row["kv"], row["hopper_splits"]] + [tables[r][i]["hopper_us"] for r in runs])
csv.writer(open(f"{out}/{name}.csv", "w", newline="")).writerows(rows)
for r in rows:
    print("".join(f"{c:>15}" for c in r))
PY
