#!/usr/bin/env bash
# Session 13's Hopper change (bf16 split partials on grids over half the SMs) against the previous
# commit's kernel, on the H200, A/B/A in separate processes: previous / this tree (+ the split sweep) /
# previous again, each through bench_hopper.py; this tree also through the attention GPU tests. The
# previous tree is this one with .carry/bf16_gate.patch reverse-applied, and its build .carry/head/
# (both made on the CPU machine from 22817e1, the commit before the change: `git diff 22817e1 -- kernels
# tests` and `dsactl build --arch sm90a` in a worktree of 22817e1). Carry ["build/sm90a", ".carry"], then
#   bash profiles/h200/attention/session13/ab.sh OUTDIR
# Another change the same way: PATCH (its diff against the previous tree), PREV (the folder with the
# previous tree's build; the carried build itself when the change leaves the library alone) and TITLE.
# The combine launches (second A/B of the session; its patch then also changed the 2-8 split launches,
# which the shipped tree keeps as before):
#   git diff 2eb29c2 -- kernels tests > .carry/combine.patch; mkdir -p .carry/same
#   cp build/sm90a/libhopper_mla.so build/sm90a/manifest.json .carry/same/
#   PATCH=.carry/combine.patch PREV=.carry/same TITLE="the combine's launch for bf16 partials" \
#     bash profiles/h200/attention/session13/ab.sh OUTDIR
# Writes OUTDIR/{previous,new,previous-again}/hopper_vs_triton.csv, OUTDIR/ab.csv (hopper_us per shape and
# run) and OUTDIR/ab.png; leaves the tree and build/sm90a as they came.
set -uo pipefail
OUT=${1:?usage: ab.sh OUTDIR}
P=profiles/h200/attention
PATCH=${PATCH:-.carry/bf16_gate.patch}
PREV=${PREV:-.carry/head}
export TITLE=${TITLE:-bf16 partials on grids over half the SMs}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
. profiles/h200/cupti_env.sh
for f in "$PATCH" "$PREV/libhopper_mla.so" "$PREV/manifest.json"; do
  [ -f "$f" ] || { echo "missing $f: see this script's header"; exit 2; }
done
mkdir -p "$OUT" /tmp/ab-new
cp build/sm90a/libhopper_mla.so build/sm90a/manifest.json /tmp/ab-new/
previous() { git apply -R "$PATCH" && cp "$PREV/libhopper_mla.so" "$PREV/manifest.json" build/sm90a/; }
current() { git apply "$PATCH" && cp /tmp/ab-new/libhopper_mla.so /tmp/ab-new/manifest.json build/sm90a/; }
bench() {  # bench NAME [--sweep]
  python3 $P/bench_hopper.py "$OUT/$1" ${2:-} > "$OUT/$1.log" 2>&1 || tail -3 "$OUT/$1.log"
}

previous || exit 1
bench previous
current || exit 1
python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_hopper.py tests/test_attention.py \
  > "$OUT/pytest.txt" 2>&1
echo "new tests: $(tail -1 "$OUT/pytest.txt")"
bench new --sweep
previous || exit 1
bench previous-again
current || exit 1
python3 - "$OUT" <<'PY'
import csv, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
runs = ("previous", "new", "previous-again")
tables = {r: list(csv.DictReader(open(f"{out}/{r}/hopper_vs_triton.csv"))) for r in runs}
rows = [["heads", "tokens", "kv", "splits"] + [f"{r}_us" for r in runs] + ["new_over_previous"]]
for i, row in enumerate(tables["previous"]):
    us = [float(tables[r][i]["hopper_us"]) for r in runs]
    base = (us[0] + us[2]) / 2
    rows.append([row["heads"], row["tokens"], row["kv"], row["hopper_splits"]] + us + [round(us[1] / base, 3)])
csv.writer(open(f"{out}/ab.csv", "w", newline="")).writerows(rows)
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
for ax, kv in zip(axes, ("bf16", "fp8")):
    sel = [r for r in rows[1:] if r[2] == kv]
    labels = [f"h{r[0]}\nT={r[1]}" for r in sel]
    ax.bar(range(len(sel)), [r[-1] for r in sel], color=["tab:green" if r[-1] < 0.98 else "tab:gray" for r in sel])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(sel)), labels, fontsize=7)
    ax.set_title(f"{kv} KV: new / previous (mean of both previous runs)")
axes[0].set_ylabel("time ratio (lower is faster)")
fig.suptitle(f"Hopper kernel, {os.environ['TITLE']} (H200, CUPTI, cold L2)")
fig.tight_layout()
fig.savefig(f"{out}/ab.png", dpi=120)
for r in rows:
    print("".join(f"{c:>15}" for c in r))
PY
