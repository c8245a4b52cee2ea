"""Nsight Compute profiling: collect reports (collect, worker), read them into
tables (report), chart them (plot); analyze() turns reports into the written outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

OUTPUTS = ("kernels.csv", "kernels.md", "classes.csv", "classes.md", "roofline.png", "utilisation.png")


@dataclass
class Analysis:
    kernels: object  # pandas DataFrame, one row per launch (report.COLUMNS)
    classes: object  # pandas DataFrame, one row per (solution, kernel, class) (report.CLASS_COLUMNS)
    roofs: object  # plot.Roofs
    device: str
    files: list[Path] = field(default_factory=list)


def analyze(reports: list[Path], out_dir: Path, command: str, bench_cache: Path | None = None) -> Analysis:
    """Tables (CSV, markdown) and charts (PNG) of the given reports, written to out_dir with the command."""
    from dsactl.profile import plot, report

    launches = report.load(reports)
    device = str(launches["_device"].dropna().iloc[0]) if launches["_device"].notna().any() else "unknown GPU"
    roofs = plot.roofs(launches, device, bench_cache)
    kernels = launches[list(report.COLUMNS)]
    classes = report.by_class(launches)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / name for name in OUTPUTS]
    kernels.to_csv(files[0], index=False)
    files[1].write_text(report.to_markdown(kernels))
    classes.to_csv(files[2], index=False)
    files[3].write_text(report.to_markdown(classes))
    title = f"{device}: {', '.join(p.name for p in reports)}"
    plot.roofline(classes, roofs, files[4], title)
    plot.utilisation(classes, files[5], title)
    (out_dir / "command.txt").write_text(command + "\n")
    return Analysis(kernels, classes, roofs, device, files + [out_dir / "command.txt"])


ROOFS_FILE = "roofs.json"


def analyze_in_child(reports: list[Path], out_dir: Path, command: str) -> Analysis:
    """analyze() in a fresh Python without torch, then the written tables read back.

    Right after a collection the reports are read with the ncu_report module that
    ships with ncu; on a GPU machine (ncu 2025.3, torch 2.11) loading it into a process that holds torch and
    CUDA crashed (SIGSEGV) after the reports were written. A crash in the child
    loses nothing: the error names the reports and how to read them elsewhere.
    """
    import json
    import subprocess
    import sys

    import pandas as pd

    from dsactl.errors import DsactlError
    from dsactl.profile import plot

    done = subprocess.run([sys.executable, "-m", "dsactl.profile.read", str(out_dir), command, *map(str, reports)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = f"signal {-done.returncode}" if done.returncode < 0 else done.stderr.strip().splitlines()[-1:] or "?"
        imports = " ".join(f"--import {r}" for r in reports)
        raise DsactlError(f"the reports were written ({', '.join(map(str, reports))}) but reading them failed ({why}); "
                          f"read them where `pip install ncu-report` works: dsactl profile {imports}")
    saved = json.loads((out_dir / ROOFS_FILE).read_text())
    roofs = plot.Roofs(saved["dram_bytes_per_s"], tuple(map(tuple, saved["compute"])), saved["source"])
    files = [out_dir / name for name in OUTPUTS] + [out_dir / "command.txt"]
    return Analysis(pd.read_csv(files[0]), pd.read_csv(files[2]), roofs, saved["device"], files)
