#!/usr/bin/env bash
# Several builds of the Hopper kernel library, each timed by bench_hopper.py in its own process (two
# builds loaded into one process fail with "invalid argument" once both launch through
# cudaLaunchKernelEx, as every build since the FP8 cluster does) and each run through the kernel's
# GPU tests. Builds run in the order given; repeat one (e.g. the baseline first and last) to see the
# run-to-run spread. NAME=build/sm90a/libhopper_mla.so names the build carried in place.
#   bash profiles/h200/attention/bench_builds.sh OUTDIR NAME=LIB.so[,combine] [NAME=LIB.so ...]
# ",combine": the launcher never merges splits in a cluster (a build from before that merge refuses it).
# Writes OUTDIR/NAME/hopper_vs_triton.csv (+ log) per build and OUTDIR/builds.csv (hopper_us per
# shape and build), and prints the FP8 rows last. Restores build/sm90a/libhopper_mla.so at the end.
set -uo pipefail
OUT=${1:?usage: bench_builds.sh OUTDIR NAME=LIB.so ...}; shift
P=profiles/h200/attention
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. profiles/h200/cupti_env.sh
LIB=build/sm90a/libhopper_mla.so
cp "$LIB" /tmp/libhopper_mla.shipped.so
names=()
for spec in "$@"; do
  name=${spec%%=*}; lib=${spec#*=}; names+=("$name")
  combine_only=0; [ "${lib%,combine}" != "$lib" ] && combine_only=1 && lib=${lib%,combine}
  mkdir -p "$OUT/$name"
  if [ "$lib" -ef "$LIB" ]; then cp /tmp/libhopper_mla.shipped.so "$LIB"; else cp "$lib" "$LIB"; fi
  python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py > "$OUT/$name/pytest.txt" 2>&1
  echo "$name: $(tail -1 "$OUT/$name/pytest.txt")"
  BENCH_COMBINE_ONLY=$combine_only python3 $P/bench_hopper.py "$OUT/$name" > "$OUT/$name/log.txt" 2>&1 ||
    tail -3 "$OUT/$name/log.txt"
done
cp /tmp/libhopper_mla.shipped.so "$LIB"
python3 - "$OUT" "${names[@]}" <<'PY'
import csv, sys
out, names = sys.argv[1], sys.argv[2:]
tables = {n: list(csv.DictReader(open(f"{out}/{n}/hopper_vs_triton.csv"))) for n in names}
keys = [(r["heads"], r["tokens"], r["kv"]) for r in tables[names[0]]]
rows = [["heads", "tokens", "kv"] + names]
for i, k in enumerate(keys):
    rows.append(list(k) + [tables[n][i]["hopper_us"] for n in names])
csv.writer(open(f"{out}/builds.csv", "w", newline="")).writerows(rows)
for r in rows:
    if r[2] in ("kv", "fp8"):
        print(" ".join(f"{c:>8}" for c in r))
PY
