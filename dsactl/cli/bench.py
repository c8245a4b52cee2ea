"""dsactl bench: kernel latency, speedup over the reference and baselines, regressions."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dsactl.cli import workers
from dsactl.cli.render import console, err_console
from dsactl.cli.suites import SUITE_HELP
from dsactl.errors import DsactlError

# Exit codes: 0 ok; 1 a regression against --compare, or a solution failed to run;
# 2 a usage error (DsactlError, from dsactl.cli.main).
EXIT_REGRESSION = 1


def _command_line() -> str:
    return shlex.join(["dsactl", *sys.argv[1:]])


def _render_comparison(comparison) -> None:
    from dsactl.cli.render import table

    for w in comparison.warnings:
        console.print(f"[yellow]warning: {w}[/yellow]")
    changed = [d for d in comparison.deltas if d.regression or d.improvement]
    if changed:
        console.print(table("changes beyond 5% and the run-to-run spread",
                            ["solution", "workload", "old us", "new us", "change", "noise us", "verdict"],
                            ((d.solution, d.workload, f"{d.old_us:.2f}", f"{d.new_us:.2f}", f"{d.change:+.1%}",
                              f"{d.noise_us:.2f}",
                              "[bold red]regression[/]" if d.regression else "[green]improvement[/]")
                             for d in changed)))
    console.print(f"compared {len(comparison.deltas)} rows: {len(comparison.regressions)} regressions, "
                  f"{len(comparison.improvements)} improvements"
                  + (f"; {len(comparison.only_old)} only in the old run" if comparison.only_old else "")
                  + (f"; {len(comparison.only_new)} new" if comparison.only_new else ""))


def _bench_pipeline(heads, batch, context, warmup: int, iters: int, method: str, no_reference: bool,
                    csv_path: Optional[str], json_path: Optional[str], no_save: bool, plot_dir: Optional[str]) -> None:
    """bench --pipeline: the decode step over the pipeline shapes, a row printed as each finishes."""
    from dsactl.bench import pipeline, report, timing
    from dsactl.cli.render import table
    from dsactl.device import has_cuda_gpu

    shapes = pipeline.select(heads=heads, batch=batch, context=context)
    timing.check_method(method)
    for path in (csv_path, json_path):
        if path:
            report.check_writable(path)
    if not has_cuda_gpu():
        raise DsactlError("bench --pipeline times the step on a CUDA GPU; none is visible here")
    import torch

    from dsactl.device import gpu_slug

    timer = pipeline.CudaTimer(iters, warmup, None if method == "auto" else method)
    gpu = torch.cuda.get_device_name()
    meta = {"command": _command_line(), "gpu": gpu, "kernel_method": timer.kernel_method,
            "iters": iters, "warmup": warmup}
    console.print(f"GPU {gpu}; {len(shapes)} shapes; step kernels timed with {timer.kernel_method or 'nothing'}, "
                  f"{warmup} warmup + {iters} iterations, cold L2")

    def us(value) -> str:
        return "-" if value is None else f"{value:.1f}"

    rows = pipeline.run_pipeline(shapes, timer, "cuda", reference=not no_reference,
                                 on_row=lambda r: err_console.print(f"{r.label}: graph {us(r.graph_us)} us"))
    ratio = [f"{r.span_over_kernels:.2f}" if r.span_over_kernels else "-" for r in rows]
    console.print(table("decode step, us", ["shape", "graph", "graph span", "eager", "kernels", "indexer",
                                            "attention", "span/kernels", "PyTorch"],
                        ((r.label, us(r.graph_us), us(r.graph_span_us), us(r.eager_us), us(r.kernels_us),
                          us(r.indexer_us), us(r.attention_us), q, us(r.reference_us)) for r, q in zip(rows, ratio))))
    default_csv = None if no_save else Path("profiles") / gpu_slug(gpu) / "pipeline.csv"
    csv_out = Path(csv_path) if csv_path else default_csv
    json_out = Path(json_path) if json_path else (csv_out.with_suffix(".json") if csv_out else None)
    for path, write in ((csv_out, pipeline.write_csv), (json_out, pipeline.write_json)):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            console.print(f"wrote {write(path, rows, meta)}")
    if plot_dir:
        Path(plot_dir).mkdir(parents=True, exist_ok=True)
        console.print(f"wrote {pipeline.plot_stages(rows, Path(plot_dir) / 'stages.png')}")


def register(app: typer.Typer) -> None:
    @app.command()
    def bench(
        ctx: typer.Context,
        definition: Optional[str] = typer.Option(None, "--definition", "-d", help="Definition name or glob."),
        solution: Optional[List[str]] = typer.Option(None, "--solution", "-s",
                                                     help="Only these registered solutions (repeatable)."),
        suite: str = typer.Option("contest", "--suite", help=f"{SUITE_HELP} Default: contest."),
        dataset: Optional[str] = typer.Option(None, "--dataset", help="A flashinfer-bench dataset folder instead."),
        workload: list[str] = typer.Option(None, "--workload", "-w", help="Only this workload uuid; repeatable."),
        baseline: Optional[List[str]] = typer.Option(
            None, "--baseline", "-b",
            help="Baselines to time besides the reference (repeatable): a baseline solution, flashinfer, "
                 "flashmla. Default: every one serving the definition."),
        no_reference: bool = typer.Option(False, "--no-reference", help="Skip the (slow) reference: no speedups."),
        warmup: int = typer.Option(10, "--warmup", min=0, help="Untimed calls before each trial."),
        iters: int = typer.Option(50, "--iters", min=1, help="Timed calls per trial."),
        trials: int = typer.Option(3, "--trials", min=1, help="Trials, each with fresh inputs (seed = trial)."),
        method: str = typer.Option("auto", "--method",
                                   help="Timing: auto, cupti, torch-profiler or cuda-graph (auto: first that works)."),
        csv_path: Optional[str] = typer.Option(None, "--csv", help="CSV path (default profiles/<gpu>/bench-....csv)."),
        json_path: Optional[str] = typer.Option(None, "--json", help="JSON path (default next to the CSV)."),
        no_save: bool = typer.Option(False, "--no-save", help="Write no CSV/JSON unless --csv/--json are given."),
        compare_path: Optional[str] = typer.Option(None, "--compare",
                                                   help="Older bench CSV: flag regressions, exit 1 on any."),
        plot_dir: Optional[str] = typer.Option(None, "--plot", help="Write latency and speedup PNGs here."),
        gpus: Optional[str] = workers.gpus_option(),
        ray: Optional[str] = workers.ray_option(),
        pipeline: bool = typer.Option(False, "--pipeline",
                                      help="Time the whole decode step (DecodeStep: indexer, top-k, attention) over "
                                           "serving shapes: CUDA-graph replay, eager, its kernels per stage, and "
                                           "the PyTorch stages. Takes --heads/--batch/--context, --iters, "
                                           "--warmup, --method (its kernel timer), --no-reference, --csv, --json, "
                                           "--plot."),
        heads: Optional[List[int]] = typer.Option(None, "--heads", help="--pipeline: only these attention heads."),
        batch: Optional[List[int]] = typer.Option(None, "--batch", help="--pipeline: only these batch sizes."),
        context: Optional[List[int]] = typer.Option(None, "--context", help="--pipeline: only these contexts."),
    ) -> None:
        """Time solutions, the reference and baselines on a suite; report latency, speedup, GB/s, TFLOP/s."""
        if pipeline:
            if gpus or ray:
                raise DsactlError("--pipeline times the step on this process's GPU: --gpus and --ray do not apply")
            return _bench_pipeline(heads or (), batch or (), context or (), warmup, iters, method, no_reference,
                                   csv_path, json_path, no_save, plot_dir)
        if heads or batch or context:
            raise DsactlError("--heads, --batch and --context choose pipeline shapes: they need --pipeline")
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from dsactl import workloads as wl
        from dsactl.bench import compare, merge, plot, report, runner

        settings = runner.Settings(warmup=warmup, iters=iters, trials=trials, method=method,
                                   include_reference=not no_reference, baselines=baseline or None,
                                   solutions=solution or None)
        runner.check_settings(settings)
        run_on = workers.executor(ctx, gpus, ray)
        for path in (csv_path, json_path):
            if path:
                report.check_writable(path)
        selected = wl.select(suite, dataset, definition, workload or ())
        old = report.read_csv(compare_path) if compare_path else None

        stem = report.default_stem(dataset or suite, definition, solution or None)
        defaults = not no_save  # profiles/<gpu>/<stem>.csv|json, one pair per GPU type

        def ready(meta) -> None:
            nonlocal defaults
            if old is not None and old.meta.get("gpu") not in (None, meta["gpu"]):
                raise DsactlError(f"--compare {compare_path} was measured on {old.meta['gpu']}, this run is on "
                                  f"{meta['gpu']}: compare runs of one GPU")
            default_csv = report.default_paths(meta["gpu"], stem)[0]
            if (defaults and old is not None and not csv_path
                    and default_csv.resolve() == Path(compare_path).resolve()):
                defaults = False  # the run compared against is the default file: keep it
                console.print(f"{compare_path} is the file compared against: this run is not written over it "
                              f"(--csv PATH keeps it elsewhere)")
            if defaults:  # the default files that --csv / --json do not replace
                for given, path in zip((csv_path, json_path), report.default_paths(meta["gpu"], stem)):
                    if not given:
                        report.check_writable(path)
            console.print(f"GPU {meta['gpu']} ({meta['sm_count']} SMs, SM clock {meta['sm_clock_mhz']}/"
                          f"{meta['max_sm_clock_mhz']} MHz, driver {meta['driver']}); timing: {meta['timing_method']}, "
                          f"{warmup} warmup + {iters} iterations x {trials} trials, cold L2")
            if settings.include_reference:
                console.print(f"the reference is timed with {runner.REFERENCE_ITERS} iterations after "
                              f"{runner.REFERENCE_WARMUP} warmup (a slow per-row Python loop)")
            peaks = meta["peaks"]
            console.print(f"peaks: copy {peaks['copy_gbps']:.0f} GB/s, bf16 matmul {peaks['bf16_tflops']:.0f} TFLOP/s")
            for off in meta.get("self_check_rejected", []):
                console.print(f"[yellow]timing self-check ({off['method']}): copy kernel read {off['measured_us']:.1f} us, "
                              f"expected {off['expected_us']:.1f} us ({off['deviation']:+.1%}): {off['method']} "
                              f"not used[/]")
            check = meta["self_check"]
            style = "green" if check["ok"] else "bold red"
            console.print(f"[{style}]timing self-check ({check['method']}): copy kernel over {check['nbytes'] / 2**20:.0f} MiB "
                          f"took {check['measured_us']:.1f} us, expected {check['expected_us']:.1f} us "
                          f"({check['deviation']:+.1%}){'' if check['ok'] else ': latencies are suspect'}[/]")

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        where = None
        if not run_on.local:
            where = run_on.describe()
            console.print(f"on {where}")
        with Progress(*columns, console=err_console, transient=True) as bar:
            task = bar.add_task("bench", total=len(selected))
            finished = [0]

            def keep(partial) -> None:  # rewrite the files as each workload finishes: a cut-off run keeps its rows
                finished[0] += 1
                bar.update(task, completed=finished[0])
                partial.meta["complete"] = f"{len({r.workload for r in partial.results})} of {len(selected)} workloads"
                merge.write(partial, stem, csv_path, json_path, defaults)

            run = runner.bench(selected, settings, _command_line(), progress=lambda text: bar.update(
                                   task, description=text), on_ready=ready, on_workload=keep, executor=run_on)
            run.meta.pop("complete", None)
        run_on.close()
        if where:
            run.meta["workers"] = where

        if run.results:
            console.print(report.results_table(run.results))
            if run.scores():
                console.print(report.scores_table(run))
        if run.skipped:
            console.print(report.skipped_table(run.skipped))

        if not run_on.local and run.results:
            console.print(workers.placements_line(run.results), soft_wrap=True)
        for written in merge.write(run, stem, csv_path, json_path, defaults):
            console.print(f"wrote {written}")
        if plot_dir:
            for path in plot.plot(run.results, plot_dir):
                console.print(f"wrote {path}")

        failed = run.failed_solutions()
        regressed = False
        if old is not None:
            comparison = compare.compare(old.results, run.results, old.meta, run.meta)
            _render_comparison(comparison)
            regressed = bool(comparison.regressions)
        if failed:
            console.print(f"[bold red]{len(failed)} solution run(s) failed (see skipped)[/]")
        if regressed or failed:
            raise typer.Exit(EXIT_REGRESSION)

