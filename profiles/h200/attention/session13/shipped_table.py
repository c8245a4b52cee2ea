"""The headline Hopper-vs-Triton table of session 13, from its second A/B (ab-combine/), run by hand:

    python3 profiles/h200/attention/session13/shipped_table.py

That A/B timed two combine launches for bf16 partials; only the 16-split one shipped (2 warps; 2, 4 and 8
splits kept the previous launch). So the shipped code's times are the `new` run's on the shapes whose
combine reads bf16 partials of 16 or more splits and the `previous` run's elsewhere, both measured in the
same device call (previous, new, previous again, one process each). Writes ../hopper_vs_triton.csv and
.png (the plot as bench_hopper.py draws it) and ab-combine/shipped.csv with a column saying which run
each row came from.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench_hopper
sys.path.insert(0, str(HERE.parents[3]))  # the repository root: dsactl
from bench_hopper import TOPK, plot  # noqa: E402

from dsactl.kernels.attention import hopper_mla  # noqa: E402
from dsactl.kernels.attention import triton_sparse_mla as tsm  # noqa: E402


def main() -> None:
    runs = {r: list(csv.DictReader(open(HERE / "ab-combine" / r / "hopper_vs_triton.csv"))) for r in ("previous", "new")}
    rows = []
    for prev, new in zip(runs["previous"], runs["new"], strict=True):
        heads, tokens = int(prev["heads"]), int(prev["tokens"])
        splits = hopper_mla.num_splits_for(tokens, heads, TOPK, tsm.H200_NUM_SMS)
        combined = splits > 1 and not hopper_mla.merges_in_cluster(splits, heads, prev["kv"] == "fp8")
        bf16 = combined and hopper_mla.bf16_partials_for(tokens, heads, splits, tsm.H200_NUM_SMS)
        changed = bf16 and tsm.combine_config(splits, heads, True).num_warps != tsm.COMBINE_WARPS
        row = dict(new if changed else prev)
        rows.append(row | {"run": "new" if changed else "previous"})
    for row in rows:
        for k in ("heads", "tokens", "hopper_splits"):
            row[k] = int(row[k])
        for k in ("hopper_tflops", "triton_tflops"):
            row[k] = float(row[k])
    fields = list(runs["previous"][0])
    with open(HERE / "ab-combine" / "shipped.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields + ["run"])
        w.writeheader()
        w.writerows(rows)
    with open(HERE.parent / "hopper_vs_triton.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plot(HERE.parent / "hopper_vs_triton.png", rows, "NVIDIA H200")
    for r in rows:
        print(r["heads"], r["tokens"], r["kv"], r["hopper_splits"], r["hopper_us"], r["triton_us"], r["run"])


if __name__ == "__main__":
    main()
