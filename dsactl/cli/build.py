"""dsactl build: compile every kernel for a GPU arch, print the resource report, apply the gates."""

from __future__ import annotations

import os

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from dsactl.build import triton_aot
from dsactl.build.arch import ALL, ARCHES, resolve
from dsactl.build.pipeline import ArchBuild, build_arch
from dsactl.build.report import ReportRow, gate_failures
from dsactl.cli.render import console
from dsactl.errors import DsactlError
from dsactl.kernels.cuda_library import KernelBuildError, current_arch
from dsactl.kernels.cuda_library import discover as discover_cuda

COLUMNS = ["unit", "kernel", "configuration", "regs", "smem", "dyn smem", "stack", "local", "spill st/ld",
           "compile s"]
LOG_WIDTH = 200


def register(app: typer.Typer) -> None:
    @app.command()
    def build(
        arch: str = typer.Option(
            None, "--arch",
            help=f"{', '.join(a.name for a in ARCHES)} or {ALL} (default: this machine's GPU).",
        ),
        jobs: int = typer.Option(
            os.cpu_count() or 1, "--jobs", "-j", min=1,
            help="Parallel compiles: nvcc jobs under ninja, and as many Triton worker processes.",
        ),
        fail_on_spills: bool = typer.Option(False, "--fail-on-spills", help="Exit non-zero if any kernel spills."),
        max_registers: int = typer.Option(
            None, "--max-registers", min=1, help="Exit non-zero if any kernel uses more registers per thread."
        ),
    ) -> None:
        """Compile every kernel for a GPU arch; report registers, shared memory and spills."""
        arches = resolve(arch if arch is not None else _this_gpu_arch())
        cuda_sources = discover_cuda()
        triton_configs = triton_aot.discover()
        rows: list[ReportRow] = []
        for target in arches:
            with _Display() as display:
                result = build_arch(target, cuda_sources=cuda_sources, triton_configs=triton_configs, jobs=jobs,
                                    on_progress=display.update)
            _show(result)
            rows += result.rows
        failures = gate_failures(rows, fail_on_spills=fail_on_spills, max_registers=max_registers)
        if failures:
            raise DsactlError(f"{len(failures)} gate failure(s):\n  " + "\n  ".join(failures))


def _this_gpu_arch() -> str:
    try:
        return current_arch()
    except KernelBuildError as e:
        raise DsactlError(f"{e}; pass --arch ({', '.join(a.name for a in ARCHES)} or {ALL})") from None


def _show(result: ArchBuild) -> None:
    name = result.arch.name
    if result.report_path is None:
        console.print(f"{name}: nothing to build (no kernels/<stage>/*.cu, no kernel module defines aot_specs())")
        return
    # Logs and CI keep whole rows (rich assumes 80 columns off a terminal); a terminal folds long names.
    (console if console.is_terminal else Console(width=LOG_WIDTH)).print(_table(result))
    if result.up_to_date:
        console.print(f"{name}: up to date ({len(result.rows)} kernels)")
    else:
        console.print(f"{name}: compiled {result.compiled_cuda} CUDA libraries, "
                      f"{result.compiled_triton} Triton configurations")
    console.print(f"report: {result.report_path}")
    unlaunchable = [row for row in result.rows if row.launch_problems()]
    if unlaunchable:
        console.print(f"[bold red]{name}: {len(unlaunchable)} configurations cannot launch (over the arch's "
                      f"per-block limits; listed below)[/]")


def _table(result: ArchBuild) -> Table:
    t = Table(title=f"{result.arch.name} kernel resources (bytes; registers per thread)", title_justify="left",
              header_style="bold")
    for column in COLUMNS:
        numeric = column not in ("unit", "kernel", "configuration")
        t.add_column(column, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    rows = result.rows
    for i, row in enumerate(rows):
        last_of_unit = i + 1 == len(rows) or (rows[i + 1].kind, rows[i + 1].unit) != (row.kind, row.unit)
        t.add_row(*_cells(row), end_section=last_of_unit)
    return t


def _cells(row: ReportRow) -> list[str]:
    spills = f"{row.spill_stores}/{row.spill_loads}"
    cells = [f"{row.kind}:{row.unit}", row.kernel, row.configuration, str(row.registers), str(row.shared_static),
             "-" if row.shared_dynamic is None else str(row.shared_dynamic), str(row.stack_frame), str(row.local),
             f"[red]{spills}[/red]" if row.spills else spills, f"{row.compile_s:.1f}"]
    if row.launch_problems():
        cells[2] = f"[bold red]{row.configuration} (cannot launch)[/]"
    return cells


class _Display:
    """A progress bar per kind of compile, created when its first compile starts."""

    def __init__(self) -> None:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("{task.fields[label]}"), TimeElapsedColumn(), console=console,
                                  transient=True)
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> "_Display":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def update(self, kind: str, label: str, done: int, total: int) -> None:
        if kind not in self._tasks:
            self._tasks[kind] = self._progress.add_task({"cuda": "nvcc", "triton": "triton"}[kind], total=total,
                                                        label=label)
        self._progress.update(self._tasks[kind], completed=done, total=total, label=label)
