"""dsactl verify: check solutions against the references with the contest's rules."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer

from dsactl.cli import workers
from dsactl.cli.paths import output_dir, output_file
from dsactl.cli.render import console, table, write_json
from dsactl.cli.suites import SUITE_HELP
from dsactl.errors import DsactlError

# Exit codes: 0 every verified pair passed; 1 a failure, an error or a sanitizer finding;
# 2 a usage error (DsactlError); 3 nothing could be verified here (everything skipped).
EXIT_FAILED = 1
EXIT_NOTHING_RAN = 3
MAX_PROBLEMS_SHOWN = 6
STATUS_STYLE = {"passed": "green", "failed": "bold red", "error": "bold red"}


def _num(x: float | None, digits: int = 3) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def _candidates(solution_names: list[str], bundle: Path | None, definitions: set[str]):
    from dsactl import solutions
    from dsactl.verify import runner

    chosen = [runner.candidate(solutions.get(n)) for n in solution_names]
    if bundle is not None:
        try:
            from dsactl.pack.loader import load_bundle
        except ImportError as e:
            raise DsactlError(f"--bundle needs dsactl.pack.loader.load_bundle, missing here ({e})") from None
        chosen.append(runner.candidate(load_bundle(bundle), selector=("--bundle", str(bundle))))
    if chosen:
        for c in chosen:
            if not any(c.serves(d) for d in definitions):
                raise DsactlError(f"solution {c.name} serves none of the chosen definitions "
                                  f"({', '.join(sorted(definitions))})")
        return chosen, True
    return [runner.candidate(s) for s in solutions.SOLUTIONS if any(s.serves(d) for d in definitions)], False


def sanitized_solutions(names: list[str], explicit: bool, cands) -> list[str]:
    """The --solution names the sanitizer's child runs: those named, else every verified one but
    the PyTorch baselines (they launch only PyTorch's kernels, not ours to sanitize, and double
    the sanitizer's run time); an empty list means every verified candidate."""
    if explicit:
        return names
    return [c.name for c in cands if c.solution is not None and not c.solution.baseline]


def _selection(definition, solution_names, suite, dataset, bundle, workload, quick) -> list[str]:
    """The command-line options that choose the same pairs again (for the sanitizer's child)."""
    args = ["--dataset", str(dataset)] if dataset else ["--suite", suite] if suite else []
    if definition:
        args += ["--definition", definition]
    for name in solution_names:
        args += ["--solution", name]
    if bundle:
        args += ["--bundle", str(bundle)]
    for w in workload:
        args += ["--workload", w]
    if quick:
        args.append("--quick")
    return args


def _render(report) -> None:
    from dsactl.verify.runner import EVERY_SOLUTION, PASSED

    for definition in dict.fromkeys(r.definition for r in report.results):
        rows = [(r.solution, r.workload, r.label, f"[{STATUS_STYLE[r.status]}]{r.status}[/]", _num(r.max_abs),
                 _num(r.max_rel), f"{100 * r.matched:.2f}%", _num(r.call_ms, 4), f"{r.seconds:.1f}")
                for r in report.results if r.definition == definition]
        console.print(table(definition, ["solution", "workload", "class", "status", "max abs", "max rel", "matched",
                                         "call ms", "time s"], rows))
    baselines = {r.solution for r in report.results if r.baseline}
    if report.skipped:
        console.print(table("skipped (not run, never counted as passed)",
                            ["solution", "definition", "workloads", "reason"],
                            (("(every solution)" if s.solution == EVERY_SOLUTION else s.solution, s.definition,
                              s.workloads, s.reason) for s in report.skipped)))
    console.print(table("summary", ["definition / solution", "pass", "fail", "error", "skip", "max abs", "max rel",
                                    "time s"], _summary_rows(report.summary(), baselines)))
    for r in report.results:
        if r.status == PASSED:
            continue
        seed = "" if r.failing_seed is None else f", trial seed {r.failing_seed}"
        console.print(f"\n[{STATUS_STYLE[r.status]}]{r.status}[/] {r.solution} on {r.workload} ({r.definition}{seed})",
                      soft_wrap=True)
        for p in r.problems[:MAX_PROBLEMS_SHOWN]:
            console.print(f"  - {p}", markup=False, highlight=False, soft_wrap=True)
        if len(r.problems) > MAX_PROBLEMS_SHOWN:
            console.print(f"  - ... {len(r.problems) - MAX_PROBLEMS_SHOWN} more in --json")
        if r.saved:
            console.print(f"  inputs saved: {r.saved}", markup=False, soft_wrap=True)
        if r.repro:
            console.print(f"  reproduce: {r.repro}", markup=False, highlight=False, soft_wrap=True)


def _summary_rows(summary, baselines: set[str]) -> list[tuple]:
    # One name column (each definition, then its solutions indented; summary() sorts by definition)
    # leaves the width of a second long-name column to the numbers on a 100-column terminal.
    from dsactl.verify.runner import EVERY_SOLUTION

    rows, definition = [], None
    for s in summary:
        if s.definition != definition:
            definition = s.definition
            rows.append((f"[bold]{definition}[/]",) + ("",) * 7)
        name = "(every solution)" if s.solution == EVERY_SOLUTION else s.solution
        ran = s.passed + s.failed + s.errors
        rows.append((f"  {name}" + (" (baseline)" if s.solution in baselines else ""), s.passed, s.failed, s.errors,
                     s.skipped, _num(s.max_abs) if ran else "", _num(s.max_rel) if ran else "",
                     f"{s.seconds:.1f}" if ran else ""))
    return rows


def _render_sanitize(reports) -> None:
    rows = []
    for rep in reports:
        for kernel, n in sorted(rep.per_kernel.items(), key=lambda kv: -kv[1]):
            rows.append((rep.tool, kernel, n))
        rows.append((rep.tool, "[bold]all kernels (summary line)[/]",
                     f"{rep.errors} errors" + (f", {rep.warnings} warnings" if rep.warnings else "")))
    console.print(table("compute-sanitizer", ["tool", "kernel", "errors shown"], rows))
    for rep in reports:
        if rep.problem:
            console.print(f"[bold red]{rep.tool}[/]: {rep.problem}; last lines of its log:")
            for line in rep.log_tail:
                console.print(f"  {line}", markup=False, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("verify")
    def verify(
        ctx: typer.Context,
        definition: Optional[str] = typer.Option(None, "--definition", "-d",
                                                 help="Definition name or pattern (fnmatch), e.g. 'dsa_topk_*'."),
        solution: Optional[List[str]] = typer.Option(None, "--solution", "-s",
                                                     help="Registered solution to verify (repeatable); default: "
                                                          "every solution serving the chosen definitions."),
        suite: Optional[str] = typer.Option(None, "--suite",
                                            help=f"{SUITE_HELP} Default: contest; --workload ids are looked "
                                                 "up in every suite unless given."),
        dataset: Optional[Path] = typer.Option(None, "--dataset", help="flashinfer-bench dataset folder "
                                                                       "(replaces --suite)."),
        bundle: Optional[Path] = typer.Option(None, "--bundle", help="Solution JSON bundle (dsactl pack) to verify."),
        workload: list[str] = typer.Option(None, "--workload", "-w", help="Only this workload (uuid); repeatable."),
        quick: bool = typer.Option(False, "--quick", help="A few small workloads per definition "
                                                          "(always on without a GPU, unless --workload or "
                                                          "--suite hostile)."),
        trials: int = typer.Option(3, "--trials", min=1,
                                   help="Calls per workload, each on fresh inputs (seed = trial)."),
        atol: float = typer.Option(1e-2, "--atol", help="Absolute tolerance."),
        rtol: float = typer.Option(1e-2, "--rtol", help="Relative tolerance."),
        matched_ratio: float = typer.Option(1.0, "--matched-ratio", min=0.0, max=1.0,
                                            help="Fraction of elements that must be within tolerance."),
        json_path: Optional[Path] = typer.Option(None, "--json", help="Write the full report as JSON to this file."),
        save_failures: Optional[Path] = typer.Option(None, "--save-failures",
                                                     help="Save each failing call's inputs (safetensors dataset) "
                                                          "under this folder."),
        sanitize: bool = typer.Option(False, "--sanitize/--no-sanitize",
                                      help="Also run the calls under compute-sanitizer memcheck and racecheck."),
        calls_only: bool = typer.Option(False, "--calls-only", hidden=True,
                                        help="One call per pair, nothing judged (the sanitizer's child run)."),
        gpus: Optional[str] = workers.gpus_option(),
        ray: Optional[str] = workers.ray_option(),
    ) -> None:
        """Check solutions against the references: tolerance per element, top-k set semantics,
        poisoned outputs, fresh inputs per trial. Exit 0: all verified pairs passed; 1: a failure;
        3: nothing could run here."""
        output_file(json_path, "--json")
        output_dir(save_failures, "--save-failures")
        run_on = workers.executor(ctx, gpus, ray)
        from dsactl import executor as executors
        from dsactl.device import has_cuda_gpu

        gpu_here = has_cuda_gpu()
        if not gpu_here:
            # Triton kernels decorated in this process from here on run on the CPU under the interpreter.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from dsactl.verify import rules

        tol = rules.Tolerance(atol, rtol, matched_ratio)
        if sanitize:
            from dsactl.verify import sanitize as sanitizer

            if not gpu_here:
                raise DsactlError("--sanitize needs a CUDA GPU (compute-sanitizer watches device code)")
            sanitizer.find_sanitizer()

        from dsactl import workloads as wl
        from dsactl.verify import runner
        from dsactl.workloads.suites import INTERPRETER_SIZED

        names = list(solution or [])
        workload = list(workload or ())
        chosen = wl.select(suite, str(dataset) if dataset else None, definition, workload)
        cands, explicit = _candidates(names, bundle, {w.definition for w in chosen})
        if explicit:
            chosen = [w for w in chosen if any(c.serves(w.definition) for c in cands)]
        # The workers' devices size the sweep, not this process's; asked now, after the selection, which
        # their warm-up overlaps.
        gpu = executors.on_gpus(run_on)
        use_quick = quick or (not gpu and not workload and suite not in INTERPRETER_SIZED)
        left_out = []
        if use_quick:
            chosen, left_out = runner.quick_subset(
                chosen, "outside the --quick subset" + ("" if quick else ", on without a GPU: --workload picks any"))

        if calls_only:
            def show(c, w, error):
                if error:
                    console.print(f"error: {c.name} on {w.uuid}: {error}", markup=False)

            calls = []
            failures = runner.run_once(cands, chosen, on_call=lambda c, w, e: (calls.append(w), show(c, w, e)))
            console.print(f"calls-only: {len(calls)} calls, {failures} raised")
            raise typer.Exit(EXIT_FAILED if failures else 0)

        if explicit and run_on.local and not json_path:
            # What was asked for cannot run on this machine: one line says why (a --json report lists it).
            unavailable = [f"{c.name}: {why}" for c in cands for ok, why in [c.availability()] if not ok]
            if len(unavailable) == len(cands):
                console.print(f"verify: nothing can run here; {'; '.join(unavailable)}", soft_wrap=True)
                raise typer.Exit(EXIT_NOTHING_RAN)

        device = "cuda" if gpu else "cpu"
        note = "" if gpu else " (no CUDA GPU: Triton runs under the interpreter)"
        quick_note = f" of {len(chosen) + sum(s.workloads for s in left_out)} (--quick)" if left_out else ""
        console.print(f"verify: {len(chosen)}{quick_note} workloads, {len(cands)} solutions, {trials} trials, "
                      f"atol {atol:g} rtol {rtol:g} matched-ratio {matched_ratio:g}, device {device}{note}")

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        if not run_on.local:
            console.print(f"on {run_on.describe()}")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("verify", total=len(chosen))
            report = runner.verify(cands, chosen, trials, tol, device, save_dir=save_failures,
                                   on_start=lambda w, index, total: progress.update(task, description=w.uuid),
                                   on_workload=lambda w, results: progress.advance(task),
                                   left_out=left_out, executor=run_on)
        run_on.close()  # before the sanitizer's child runs: the workers would hold their GPUs
        _render(report)
        if not run_on.local:
            console.print(workers.placements_line(report.results), soft_wrap=True)

        sanitize_reports = []
        if sanitize:
            ours = sanitized_solutions(names, explicit, cands)
            console.print("compute-sanitizer: memcheck and racecheck over the same calls (one per pair) of "
                          + (", ".join(ours) if ours else "every verified solution") + " ...")
            sanitize_reports = sanitizer.run(_selection(definition, ours, suite, dataset, bundle, workload,
                                                        use_quick))
            _render_sanitize(sanitize_reports)

        if json_path:
            payload = report.to_json()
            payload["selection"] = {"suite": None if dataset else suite, "dataset": str(dataset) if dataset else None,
                                    "definition": definition, "solutions": names,
                                    "bundle": str(bundle) if bundle else None, "workload": workload,
                                    "quick": use_quick}
            if sanitize:
                from dataclasses import asdict

                payload["sanitize"] = [asdict(r) for r in sanitize_reports]
            write_json(json_path, payload)

        console.print(f"\nverify: {report.headline()}", soft_wrap=True)
        if not report.ok or any(not r.clean for r in sanitize_reports):
            raise typer.Exit(EXIT_FAILED)
        if not report.results:
            console.print("nothing was verified here: every solution was skipped (see the reasons above)")
            raise typer.Exit(EXIT_NOTHING_RAN)
