"""dsactl tune: search the kernels' launch knobs per shape bucket and write the per-GPU tables."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Optional

import typer

from dsactl.cli import workers
from dsactl.cli.paths import output_dir, output_file
from dsactl.cli.render import console, table, write_json
from dsactl.cli.suites import SUITE_HELP


def _us(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}"


def _render(plan, results) -> None:
    rows = []
    for r in results:
        chosen, default, best = r.chosen, r.default if r.tried else None, r.winner
        verified = sum(not t.problem for t in r.tried)
        gain = f"{default.total_us / chosen.total_us:.3f}x" if chosen else ""
        rows.append((r.family, r.bucket, len(r.workloads), f"{verified}/{len(r.tried)}",
                     _us(default.total_us) if default else "", _us(best.total_us) if best else "",
                     chosen.label if chosen else (r.method if not r.tried else "hand-picked stays"), gain))
    console.print(table("tune (us: sum of the bucket's per-workload medians)",
                        ["family", "bucket", "workloads", "verified", "hand-picked us", "best us", "written",
                         "gain"], rows))
    refused = [(r.bucket, t.label, t.problem) for r in results for t in r.tried if t.problem]
    if refused:
        console.print(table("candidates refused (one that fails verification is never timed)",
                            ["bucket", "candidate", "problem"], refused))
    if plan.skipped:
        console.print(table("not tuned", ["workload", "why"], plan.skipped))


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune(
        ctx: typer.Context,
        definition: Optional[str] = typer.Option(None, "--definition", "-d", help="Definition name or glob."),
        suite: str = typer.Option("contest", "--suite", help=f"{SUITE_HELP} Default: contest."),
        warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed calls before each trial."),
        iters: int = typer.Option(50, "--iters", min=1, help="Timed calls per trial."),
        trials: int = typer.Option(3, "--trials", min=1, help="Timing trials, each with fresh inputs."),
        verify_trials: int = typer.Option(3, "--verify-trials", min=1,
                                          help="Verification calls per workload and candidate, fresh inputs each."),
        method: str = typer.Option("auto", "--method", help="Timing method, as bench: auto, cupti, "
                                                            "torch-profiler or cuda-graph."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the winners; write no table."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Write every bucket's candidates, times "
                                                                    "and gain to this JSON file."),
        out: Optional[Path] = typer.Option(None, "--out", help="Write the tables into this folder instead of "
                                                                "beside the kernels (kernels/<stage>/tuned/)."),
        gpus: Optional[str] = workers.gpus_option(),
        ray: Optional[str] = workers.ray_option(),
    ) -> None:
        """Verify, then time, the candidate launch configurations of each shape bucket of the suite's
        workloads, and write the winners into this GPU's entries of the tuned tables."""
        from dsactl.tune import sweep

        output_dir(out, "--out")
        output_file(json_out, "--json")
        from dsactl import workloads as wl
        from dsactl.bench import timing
        from dsactl.tune.search import Settings

        timing.check_method(method)
        chosen = wl.select(suite, None, definition)
        command = shlex.join(["dsactl", *sys.argv[1:]])
        run_on = workers.executor(ctx, gpus, ray)
        sweep.require_gpu(run_on)
        settings = Settings(warmup, iters, trials, verify_trials, method)
        with console.status("tune") as status:
            plan, results = sweep.tune(chosen, settings, command, run_on,
                                       on_start=lambda job: status.update(f"tune {job.family} {job.bucket}"))
        run_on.close()
        _render(plan, results)
        if json_out is not None:
            write_json(json_out, sweep.report(results, command))
        new = sweep.entries(results, command)
        stale = sweep.settled(results)
        count = sum(len(v) for v in new.values())
        if dry_run:
            console.print(f"{count} entr{'y' if count == 1 else 'ies'} (--dry-run: nothing written)")
            return
        paths = sweep.write(new, stale, out)
        if not paths:
            console.print(f"{count} entr{'y' if count == 1 else 'ies'} to write: the tables stay as they are")
        for path in paths:
            console.print(f"wrote {path}", markup=False)
