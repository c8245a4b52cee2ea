"""FP8 / bf16 time of the Triton kernels per query-token count (fp8-f16/fp8_f16.csv, H200):
    python profiles/h200/attention/session12/plot_fp8_f16.py   # writes fp8-f16/fp8_f16.png"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).parent / "fp8-f16"
SERIES = {"fp8_over_bf16": "bf16-dot FP8 kernel (session 11)",
          "fp8_f16_n64_over_bf16": "fp16-tile FP8, 64-token tiles (shipped)",
          "fp8_f16_n32_over_bf16": "fp16-tile FP8, 32-token tiles"}
TARGET = 1.15  # issue 6: FP8 KV within 1.15x of bf16 KV

rows = pd.read_csv(HERE / "fp8_f16.csv")
fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
for ax, (heads, group) in zip(axes, rows.groupby("heads")):
    for column, label in SERIES.items():
        ax.plot(group["tokens"], group[column], marker="o", label=label)
    ax.axhline(TARGET, color="grey", linestyle="--", label="target 1.15x")
    ax.set_xscale("log", base=2)
    ax.set_title(f"{heads} heads, topk 2048")
    ax.set_xlabel("query tokens")
axes[0].set_ylabel("FP8 time / bf16 time (Triton, CUPTI, cold L2)")
axes[0].legend(fontsize=8)
fig.suptitle("Triton sparse MLA on the H200: FP8 KV against bf16 KV")
fig.tight_layout()
fig.savefig(HERE / "fp8_f16.png", dpi=120)
