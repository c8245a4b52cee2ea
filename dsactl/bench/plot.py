"""--plot DIR: per definition, latency vs workload size per solution, mean speedup over the
reference per workload class, and for attention (the memory-bound stage) achieved bandwidth vs
workload size against the measured copy bandwidth (matplotlib, Agg backend)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from dsactl import png
from dsactl.bench.metrics import SIZE_NAMES, stage
from dsactl.bench.runner import Result
from dsactl.definitions import get as get_definition


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on GPU machines or CI
    import matplotlib.pyplot as plt

    return plt


def latency_plot(results: Sequence[Result], definition: str, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in dict.fromkeys(r.solution for r in results):
        mine = sorted((r for r in results if r.solution == name), key=lambda r: (r.size, r.median_us))
        xs = [max(r.size, 1) for r in mine]
        ax.errorbar(xs, [r.median_us for r in mine],
                    yerr=[[r.median_us - r.min_us for r in mine], [r.max_us - r.median_us for r in mine]],
                    marker="o", markersize=3, linewidth=1, capsize=2, label=name)
    ax.set_yscale("log")
    return _save_size_plot(plt, fig, ax, definition, "latency, us (median, min-max bars)", path)


def _save_size_plot(plt, fig, ax, definition: str, ylabel: str, path: Path) -> Path:
    """The frame every per-size plot shares: log size axis named by the stage, title, grid, legend; saved."""
    ax.set_xscale("log")
    ax.set_xlabel(SIZE_NAMES[stage(get_definition(definition))])
    ax.set_ylabel(ylabel)
    ax.set_title(definition, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.save(fig, path)
    plt.close(fig)
    return path


def speedup_plot(results: Sequence[Result], definition: str, path: Path) -> Path:
    plt = _pyplot()
    timed = [r for r in results if r.kind != "reference" and r.speedup is not None]
    classes = list(dict.fromkeys(r.label for r in timed))
    names = list(dict.fromkeys(r.solution for r in timed))
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(classes) * max(1, len(names)) / 2), 5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        means = []
        for c in classes:
            v = [r.speedup for r in timed if r.solution == name and r.label == c]
            means.append(statistics.fmean(v) if v else 0.0)
        ax.bar([j + i * width for j in range(len(classes))], means, width, label=name)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(classes))], classes)
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("workload class")
    ax.set_ylabel("mean speedup over the reference")
    ax.set_title(definition, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.save(fig, path)
    plt.close(fig)
    return path


def bandwidth_plot(results: Sequence[Result], definition: str, path: Path) -> Path | None:
    """GB/s of the bytes each call must touch vs size per solution, with the copy bandwidth measured in the
    same run as the line a kernel cannot pass; None where no row has both."""
    rated = [r for r in results if r.gbps is not None and r.pct_copy_bw]
    if not rated:
        return None
    copy_gbps = rated[0].gbps * 100.0 / rated[0].pct_copy_bw
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for name in dict.fromkeys(r.solution for r in rated):
        mine = sorted((r for r in rated if r.solution == name), key=lambda r: r.size)
        ax.plot([max(r.size, 1) for r in mine], [r.gbps for r in mine], marker="o", markersize=3, linewidth=1,
                label=name)
    ax.axhline(copy_gbps, color="gray", linestyle="--", linewidth=1, label=f"copy {copy_gbps:.0f} GB/s")
    ax.set_ylim(0, copy_gbps * 1.08)
    return _save_size_plot(plt, fig, ax, definition, "GB/s of the bytes each call must touch", path)


def plot(results: Sequence[Result], folder: str | Path) -> list[Path]:
    """Up to three PNGs per definition: latency; speedup where speedups exist; bandwidth for attention."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for definition in dict.fromkeys(r.definition for r in results):
        mine = [r for r in results if r.definition == definition]
        written.append(latency_plot(mine, definition, folder / f"latency-{definition}.png"))
        if any(r.speedup is not None and r.kind != "reference" for r in mine):
            written.append(speedup_plot(mine, definition, folder / f"speedup-{definition}.png"))
        if stage(get_definition(definition)) == "attention":
            found = bandwidth_plot(mine, definition, folder / f"bandwidth-{definition}.png")
            written += [found] if found else []
    return written
