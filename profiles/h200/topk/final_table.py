"""The committed top-k build's latency per shape, from the session-4 sweep on the H200
(sweep-run5.csv, README.md): `new` (this build) beside `base` (the previous build, same run),
torch.topk + translation (sweep-run1.csv, same shapes and inputs) and the issue's FlashInfer
figures. Writes final-topk.csv and final-topk.png, prints a markdown table.

    python3 profiles/h200/topk/final_table.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from sweep import CONTEST_TARGET_US, FLASHINFER  # noqa: E402

HERE = Path(__file__).resolve().parent
TARGET_FACTOR = 1.2  # the issue: within 1.2x of FlashInfer


def load(name: str) -> dict[tuple[str, str], dict]:
    with open(HERE / name) as f:
        return {(r["contender"], r["workload"]): r for r in csv.DictReader(f)}


def main() -> None:
    run, torch_run = load("sweep-run5.csv"), load("sweep-run1.csv")
    rows = []
    for (contender, workload), r in run.items():
        if contender != "new":
            continue
        fi = FLASHINFER.get((r["dtype"], int(r["rows"]), int(r["max_len"]))) if r["kind"] == "grid" else None
        target = TARGET_FACTOR * fi if fi else (CONTEST_TARGET_US if r["kind"] == "contest" else None)
        us, base = float(r["median_us"]), float(run[("base", workload)]["median_us"])
        score_bytes = int(r["rows"]) * int(r["max_len"]) * (2 if r["dtype"] == "bf16" else 4)
        rows.append({
            "kind": r["kind"], "workload": workload, "dtype": r["dtype"], "rows": r["rows"], "max_len": r["max_len"],
            "kernel": r["plan"], "us": us, "base_us": base, "speedup_vs_base": round(base / us, 2),
            "torch_us": float(torch_run[("torch", workload)]["median_us"]),
            "gbps": round(score_bytes / us / 1e3, 1),
            "flashinfer_us": fi or "", "target_us": round(target, 2) if target else "",
            "met": ("yes" if us <= target else "no") if target else "",
        })
    with open(HERE / "final-topk.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print("| dtype | rows x max_len | kernel | us | base us | torch us | GB/s | FlashInfer | target | met |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        shape = f"{r['rows']} x {r['max_len']}" + (" (random lengths)" if r["kind"] == "contest" else "")
        print(f"| {r['dtype']} | {shape} | {r['kernel']} | {r['us']:.2f} | {r['base_us']:.2f} | {r['torch_us']:.1f} | "
              f"{r['gbps']} | {r['flashinfer_us']} | {r['target_us']} | {r['met']} |")
    plot(rows)


def plot(rows: list[dict]) -> None:
    grid = [r for r in rows if r["kind"] == "grid"]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5), sharey=True)
    for ax, dtype in zip(axes, ("fp32", "bf16")):
        sel = [r for r in grid if r["dtype"] == dtype]
        x = range(len(sel))
        ax.plot(x, [r["base_us"] for r in sel], "o-", label="previous build (same run)", color="0.6")
        ax.plot(x, [r["us"] for r in sel], "o-", label="this build", color="C0")
        fi = [(i, r["flashinfer_us"]) for i, r in enumerate(sel) if r["flashinfer_us"] != ""]
        ax.plot([i for i, _ in fi], [v for _, v in fi], "k^", label="FlashInfer 0.7.2 (issue 4)")
        ax.set_xticks(list(x), [f"{r['rows']}x{r['max_len']}" for r in sel], rotation=90, fontsize=7)
        ax.set_yscale("log")
        ax.set_title(f"top-k + page translation, {dtype} scores, H200 (CUPTI, cold L2)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("kernel time (us)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(HERE / "final-topk.png", dpi=110)


if __name__ == "__main__":
    main()
