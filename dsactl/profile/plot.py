"""Roofline and utilisation charts (PNG) from the per-class table of report.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dsactl import png

UTILISATION = (("sm_pct", "SM"), ("l1_pct", "L1/TEX"), ("l2_pct", "L2"), ("dram_pct", "DRAM"))


@dataclass(frozen=True)
class Roofs:
    """The ceilings drawn on a roofline, and where they come from."""

    dram_bytes_per_s: float
    compute: tuple[tuple[str, float], ...]  # (name, FLOP/s), e.g. ("bf16 tensor", 7.9e14)
    source: str

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the highest compute roof meets the DRAM roof."""
        return max(peak for _, peak in self.compute) / self.dram_bytes_per_s


def _label(row) -> str:
    kernel = row["kernel"] if len(row["kernel"]) <= 32 else row["kernel"][:29] + "..."
    return f"{row['solution']}:{kernel} [{row['class']}]"


def roofline(classes, roofs: Roofs, path: Path, title: str) -> Path:
    """Log-log roofline: DRAM and compute roofs, one point per (solution, kernel, class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = classes[(classes["intensity"] > 0) & (classes["tflops"] > 0)]
    span = list(pts["intensity"]) + [roofs.ridge]
    lo, hi = min(span) / 8, max(span) * 8
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(9, 6))
    styles = ("-", "--", "-.", ":")
    for (name, peak), style in zip(roofs.compute, styles):
        ax.plot(xs, [min(peak, x * roofs.dram_bytes_per_s) / 1e12 for x in xs], style, color="black", lw=1.2,
                label=f"{name} roof {peak / 1e12:.0f} TFLOP/s")
    ax.plot([], [], " ", label=f"DRAM roof {roofs.dram_bytes_per_s / 1e12:.2f} TB/s")
    markers = "os^Dvp*hX"
    for i, (_, row) in enumerate(pts.iterrows()):
        ax.scatter(row["intensity"], row["tflops"], marker=markers[i % len(markers)], s=60, zorder=3,
                   label=_label(row))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"{title}\nroofs: {roofs.source}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    png.save(fig, path)
    plt.close(fig)
    return path


def utilisation(classes, path: Path, title: str) -> Path:
    """Grouped bars: SM, L1/TEX, L2 and DRAM throughput (% of peak) per (solution, kernel, class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(classes)
    width = 0.8 / len(UTILISATION)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * n + 2), 5))
    for j, (col, name) in enumerate(UTILISATION):
        values = [0 if math.isnan(v) else v for v in classes[col]]
        ax.bar([i + (j - (len(UTILISATION) - 1) / 2) * width for i in range(n)], values, width, label=name)
    ax.set_xticks(range(n))
    ax.set_xticklabels([_label(r) for _, r in classes.iterrows()], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_ylabel("% of peak throughput (time-weighted)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    png.save(fig, path)
    plt.close(fig)
    return path


def _median(launches, col) -> float | None:
    v = launches[col].dropna()
    v = v[v > 0]
    return float(v.median()) if len(v) else None


def _bench_peaks(device: str, cache: Path):
    """dsactl bench's measured peaks for this GPU, if it has measured them (never measures here)."""
    import json

    from dsactl.bench.peaks import Peaks

    try:
        entry = json.loads(cache.read_text()).get(device)
        return Peaks(**entry) if entry else None
    except (OSError, ValueError, TypeError):
        return None


def roofs(launches, device: str, bench_cache: Path | None = None) -> Roofs:
    """DRAM and bf16 roofs measured by `dsactl bench` when it has measured this GPU, else as ncu reports them;
    fp8 tensor and FP32 roofs as ncu reports them (peak_sustained at the profiled clocks, median over launches)."""
    from dsactl.bench.peaks import CACHE

    bench = _bench_peaks(device, bench_cache or CACHE)
    ncu = {c: _median(launches, f"_{c}") for c in ("dram_peak_bps", "bf16_peak_flops", "fp8_peak_flops",
                                                   "fp32_peak_flops")}
    dram = bench.copy_gbps * 1e9 if bench else ncu["dram_peak_bps"]
    bf16 = bench.bf16_tflops * 1e12 if bench else ncu["bf16_peak_flops"]
    compute = [("fp8 tensor", ncu["fp8_peak_flops"]), ("bf16 tensor", bf16), ("FP32", ncu["fp32_peak_flops"])]
    compute = tuple((n, p) for n, p in compute if p)
    if not dram or not compute:
        from dsactl.errors import DsactlError

        raise DsactlError("the report holds no DRAM or compute peaks (was it collected with --set roofline?)")
    where = "ncu peak_sustained at the profiled clocks"
    source = (f"DRAM copy and bf16 matmul measured by dsactl bench ({bench.measured_at}), others {where}"
              if bench else where)
    return Roofs(dram, tuple(sorted(compute, key=lambda c: -c[1])), source)
