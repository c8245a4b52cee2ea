"""dsactl profile: Nsight Compute roofline and SM/L1/L2/DRAM utilisation tables and charts."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

from dsactl.cli.paths import output_dir
from dsactl.cli.render import console, table
from dsactl.cli.suites import SUITE_HELP

MAX_PRINTED_LAUNCHES = 40
CLASS_SHOWN = ("solution", "kernel", "class", "launches", "duration_us", "active_sms", "sms", "sm_pct", "l1_pct",
               "l2_pct", "dram_pct", "tensor_pct", "occupancy_pct", "theoretical_occupancy_pct", "tflops", "dram_gbs",
               "intensity")
KERNEL_SHOWN = ("workload", "class", "kernel", "duration_us", "grid", "block", "registers", "active_sms", "sm_pct",
                "l1_pct", "l2_pct", "dram_pct", "tensor_pct", "occupancy_pct", "tflops", "dram_gbs", "intensity")


def _default_out(gpu_name: str, what: str) -> Path:
    from dsactl.device import profiles_dir

    return profiles_dir(gpu_name) / f"ncu-{what}"


def register(app: typer.Typer) -> None:
    @app.command()
    def profile(
        ncu: str = typer.Option(None, "--ncu", help="Collect this Nsight Compute section set: roofline, or "
                                 "warps (roofline, plus stall reasons, issue rate, instructions, bank conflicts)."),
        reports: list[Path] = typer.Option(None, "--import", help="Read existing .ncu-rep reports instead (no GPU "
                                                                  "or ncu needed); repeatable."),
        definition: str = typer.Option(None, "--definition", help="Only definitions matching this pattern."),
        solution: str = typer.Option(None, "--solution", help="Only this solution (default: every shipped one)."),
        baseline: list[str] = typer.Option(None, "--baseline", "-b", help="Also profile this baseline kernel on the "
                                           "same workloads, as bench runs it (e.g. flashmla); repeatable."),
        suite: str = typer.Option(None, "--suite", help=f"{SUITE_HELP} Default: contest."),
        dataset: str = typer.Option(None, "--dataset", help="A flashinfer-bench dataset folder instead of a suite."),
        workload: list[str] = typer.Option(None, "--workload", "-w", help="Only this workload id; repeatable."),
        seed: int = typer.Option(0, "--seed", help="Seed of the generated inputs."),
        out: Path = typer.Option(None, "-o", "--out", help="Output folder (default profiles/<gpu>/ncu-<what>)."),
    ) -> None:
        """Profile solutions, and baselines beside them, under Nsight Compute (or read reports) into roofline and
        utilisation tables and plots."""
        from dsactl.errors import DsactlError
        from dsactl.profile import analyze, analyze_in_child

        if (ncu is None) == (not reports):
            raise DsactlError("give either --ncu roofline|warps (collect) or --import REPORT.ncu-rep (read)")
        output_dir(out, "--out")
        command = shlex.join(["dsactl", *sys.argv[1:]])
        if reports:
            if out is None:
                from dsactl.profile import report

                out = _default_out(report.device_name(reports[0]), reports[0].name.removesuffix(".ncu-rep"))
            _show(analyze(list(reports), out, command))
        else:
            paths, out = _collect(ncu, definition, solution, tuple(baseline or ()), suite, dataset,
                                  tuple(workload or ()), seed, out)
            _show(analyze_in_child(paths, out, command))


def _collect(ncu_set, definition, solution, baselines, suite, dataset, workloads, seed, out):
    import torch

    from dsactl.errors import DsactlError
    from dsactl.profile import collect

    if ncu_set not in collect.SETS:
        raise DsactlError(f"unknown section set {ncu_set!r} for --ncu; dsactl collects: {', '.join(collect.SETS)}")
    collect.check_baselines(baselines)
    collect.find_ncu()
    if not torch.cuda.is_available():
        raise DsactlError("collecting a profile needs a CUDA GPU; `dsactl profile --import` reads reports anywhere")
    if out is None:
        what = Path(dataset).name if dataset else (suite or "contest")
        out = _default_out(torch.cuda.get_device_name(), what)
    selection = collect.Selection(suite, dataset, definition, workloads, solution, baselines)
    results = collect.collect(selection, out, ncu_set, seed, progress=lambda m: console.print(f"[dim]{m}[/dim]"))
    for r in results:
        for what, why in r.skipped:
            console.print(f"[yellow]skipped {what}: {why}[/yellow]")
    paths = [r.report for r in results if r.report is not None]
    if not paths:
        raise DsactlError("no selected solution or baseline can run here (see the skipped lines above)")
    return paths, out


def _show(a) -> None:
    from dsactl.profile import report

    if len(a.kernels) <= MAX_PRINTED_LAUNCHES:
        k = a.kernels[list(KERNEL_SHOWN)]
        console.print(table(f"kernel launches on {a.device}", k.columns, report.formatted(k)))
    else:
        console.print(f"{len(a.kernels)} kernel launches: see kernels.csv")
    c = a.classes[list(CLASS_SHOWN)]
    console.print(table("per kernel and workload class (utilisation time-weighted; TFLOP/s, GB/s over total time)",
                        c.columns, report.formatted(c)))
    r = a.roofs
    compute = ", ".join(f"{name} {peak / 1e12:.0f} TFLOP/s" for name, peak in r.compute)
    console.print(f"roofs ({r.source}): DRAM {r.dram_bytes_per_s / 1e12:.2f} TB/s, {compute}")
    console.print("wrote " + ", ".join(str(f) for f in a.files))
