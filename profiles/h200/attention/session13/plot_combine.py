"""combine/combine_sweep.csv as a picture: the combine's time per launch variant on every Hopper call that
combines (H200). Run by hand: python3 profiles/h200/attention/session13/plot_combine.py"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent / "combine"


def main() -> None:
    rows = list(csv.DictReader(open(HERE / "combine_sweep.csv")))
    shapes = list(dict.fromkeys((r["heads"], r["tokens"], r["kv"], r["splits"], r["partials"]) for r in rows))
    variants = list(dict.fromkeys((r["kernel"], r["block_d"], r["warps"]) for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(15, 8), sharey=True)
    for ax, partials in zip(axes, ("fp32", "bf16")):
        mine = [s for s in shapes if s[4] == partials]
        width = 0.8 / len(variants)
        for i, v in enumerate(variants):
            us = [next(float(r["combine_us"]) for r in rows if (r["heads"], r["tokens"], r["kv"], r["splits"],
                                                                  r["partials"]) == s and (r["kernel"], r["block_d"],
                                                                                           r["warps"]) == v)
                  for s in mine]
            ax.bar([j + i * width for j in range(len(mine))], us, width, label=f"{v[0]} D{v[1]} w{v[2]}",
                   color=plt.cm.tab20(i))
        ax.set_xticks([j + 0.4 for j in range(len(mine))], [f"h{s[0]} T={s[1]} {s[2]}\nS={s[3]}" for s in mine],
                      fontsize=7)
        ax.set_title(f"{partials} partials")
        ax.set_ylabel("combine us (call - call without combine)")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=7)
    fig.suptitle("Split combine launch variants inside the Hopper calls (H200, CUPTI, cold L2); first = shipped before")
    fig.tight_layout()
    fig.savefig(HERE / "combine_sweep.png", dpi=110)


if __name__ == "__main__":
    main()
