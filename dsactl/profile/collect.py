"""Collect Nsight Compute reports of solutions on their workloads.

Each solution, and each baseline asked for (bench's baselines: FlashMLA, FlashInfer, the baseline
solutions), runs in its own child process (`python -m dsactl.profile.worker`) under ncu, which writes
one `<name>.ncu-rep`. The worker prepares inputs and warms up outside any NVTX range, then wraps each
profiled call in a push/pop range named NVTX_RANGE with a nested range naming the contender, workload
and class; ncu's `--nvtx-include "dsactl/"` filter makes it profile only kernels launched inside it,
so input generation, poisoning, layout conversions, compilation and autotuning never show up in a
report, and ours and a baseline's kernels on the same workloads land in one table.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dsactl.errors import DsactlError

if TYPE_CHECKING:
    from dsactl.solutions import Solution
    from dsactl.workloads import Workload

NVTX_RANGE = "dsactl"
SETS = ("roofline", "warps")
# --set roofline records neither occupancy nor launch statistics (grid, registers).
_ROOFLINE = ("--set", "roofline", "--section", "Occupancy", "--section", "LaunchStats")
# Why a kernel waits: every stall reason per issued instruction (they add up to about the warp cycles an
# issued instruction costs), the schedulers' issue rate, the instructions executed, shared-memory bank conflicts.
STALL_METRICS = r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
SET_SECTIONS = {
    "roofline": _ROOFLINE,
    "warps": (*_ROOFLINE, "--section", "WarpStateStats", "--section", "SchedulerStats", "--section", "InstructionStats",
              "--section", "MemoryWorkloadAnalysis_Tables", "--metrics", STALL_METRICS),
}
NCU_OPTIONS = (
    "--clock-control", "none",  # profile at the clocks the GPU runs at; never change them
    "--print-units", "base",
    "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/",
    "--force-overwrite",
)
_RANGE_FORMAT = "solution={solution} workload={workload} class={label}"
_RANGE_RE = re.compile(r"^solution=(?P<solution>\S+) workload=(?P<workload>\S+) class=(?P<label>\S*)$")
SKIP_PREFIX = "dsactl-profile skipped"
_SKIP_RE = re.compile(rf"^{SKIP_PREFIX} (\S+): (.*)$", re.MULTILINE)
_EXCEPTION = re.compile(r"^[A-Za-z_.]*(Error|Exception)\b")

NCU_MISSING = (
    "Nsight Compute (ncu) is not on PATH: install it (it ships with the CUDA toolkit, e.g. /usr/local/cuda/bin, "
    "and from https://developer.nvidia.com/nsight-compute) and put its folder on PATH. To read a report made "
    "elsewhere, run `dsactl profile --import REPORT.ncu-rep` (needs no ncu and no GPU)."
)
NO_COUNTER_PERMISSION = (
    "ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run the command as root (sudo -E), or "
    "allow every user to profile by loading the driver with NVreg_RestrictProfilingToAdminUsers=0 "
    "(https://developer.nvidia.com/ERR_NVGPUCTRPERM)."
)
NO_PROFILER = (
    "ncu could not start its profiler here ({detail}): this machine does not expose the GPU's hardware counters "
    "(sandboxed runtimes such as gVisor do not). Profile on a machine that gives ncu the counters, then "
    "`dsactl profile --import` the report."
)


def range_name(solution: str, workload: str, label: str) -> str:
    """The NVTX range naming one profiled call; report.py reads it back with parse_range_name."""
    return _RANGE_FORMAT.format(solution=solution, workload=workload, label=label)


def parse_range_name(name: str) -> dict[str, str] | None:
    m = _RANGE_RE.match(name)
    return m.groupdict() if m else None


@dataclass(frozen=True)
class Selection:
    """What to profile: the workloads of a suite or dataset, filtered; the solution (default: every shipped one
    serving them) and the baselines (bench's names) to profile on them. A worker's selection names one
    contender: a solution, or a single baseline."""

    suite: str | None = None
    dataset: str | None = None
    definition: str | None = None
    workloads: tuple[str, ...] = ()  # workload ids; empty = all
    solution: str | None = None
    baselines: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        out = [a for k in ("suite", "dataset", "definition", "solution") if getattr(self, k) is not None
               for a in (f"--{k}", getattr(self, k))]
        out += [a for b in self.baselines for a in ("--baseline", b)]
        return out + [a for w in self.workloads for a in ("--workload", w)]


@dataclass(frozen=True)
class Target:
    name: str
    solution: Solution | None  # None: a baseline (bench.baselines), profiled through its bound call
    workloads: tuple[Workload, ...]


def check_baselines(names: tuple[str, ...]) -> None:
    """The baselines profile takes: bench's, less the reference (a float32 PyTorch loop, not a kernel)."""
    from dsactl.bench import baselines

    kernels = [n for n in baselines.known_names() if n != baselines.REFERENCE]
    if baselines.REFERENCE in names:
        raise DsactlError(f"the reference is a float32 PyTorch loop, not a kernel to profile: name a baseline "
                          f"kernel ({', '.join(kernels)})")
    baselines.check_names(list(names), kernels)


def plan(selection: Selection, solutions_too: bool = True) -> list[Target]:
    """(contender, its workloads) pairs: the named solution, else every shipped one serving a workload
    (unless solutions_too is False), then each named baseline."""
    from dsactl import solutions, workloads
    from dsactl.bench import baselines
    from dsactl.definitions import get

    check_baselines(selection.baselines)
    ws = workloads.select(selection.suite, selection.dataset, selection.definition, selection.workloads)
    if selection.solution:
        chosen = [solutions.get(selection.solution)]
    else:
        chosen = [s for s in solutions.SOLUTIONS if not s.baseline] if solutions_too else []
    targets = [Target(s.name, s, tuple(w for w in ws if s.serves(w.definition))) for s in chosen]
    targets = [t for t in targets if t.workloads]
    # A named baseline stays even where it serves none of the workloads: collect reports it skipped.
    targets += [Target(b, None, tuple(w for w in ws if baselines.serves(b, get(w.definition))))
                for b in selection.baselines]
    if not any(t.workloads for t in targets):
        defs = ", ".join(sorted({w.definition for w in ws})[:4])
        named = [f"solution {selection.solution!r}"] if selection.solution else []
        named += [f"baseline {b!r}" for b in selection.baselines]
        if len(named) > 1:
            who = f"none of {', '.join(named)} serves any of"
        else:
            who = f"{named[0] if named else 'no shipped solution'} serves none of"
        raise DsactlError(f"{who} the {len(ws)} selected workloads (definitions: {defs}, ...)")
    return targets


def find_ncu() -> str:
    ncu = shutil.which("ncu")
    if ncu is None:
        raise DsactlError(NCU_MISSING)
    return ncu


def ncu_command(ncu: str, report: Path, program: list[str], ncu_set: str = "roofline") -> list[str]:
    if ncu_set not in SETS:
        raise DsactlError(f"unknown ncu section set {ncu_set!r}; dsactl collects: {', '.join(SETS)}")
    return [ncu, *SET_SECTIONS[ncu_set], *NCU_OPTIONS, "--export", str(report), *program]


def worker_command(selection: Selection, seed: int) -> list[str]:
    return [sys.executable, "-m", "dsactl.profile.worker", *selection.argv(), "--seed", str(seed)]


def check_output(returncode: int, text: str, log: Path | None) -> None:
    """Turn ncu's known failures into one clear DsactlError."""
    where = f" (full output: {log})" if log else ""
    if "ERR_NVGPUCTRPERM" in text:
        raise DsactlError(NO_COUNTER_PERMISSION)
    m = re.search(r"Failed to initialize the profiler:?\s*(.*)", text)
    if m or "LibraryNotLoaded" in text:
        raise DsactlError(NO_PROFILER.format(detail=(m.group(1).strip() if m else "LibraryNotLoaded") or "no detail"))
    if returncode != 0:
        # The profiled program's own error says more than ncu's "application returned an error code".
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        cause = ([ln for ln in lines if ln.startswith("error: ")] or [ln for ln in lines if _EXCEPTION.match(ln)]
                 or [ln for ln in lines if ln.startswith("==ERROR==")] or lines or ["no output"])[-1]
        raise DsactlError(f"profiling failed (exit {returncode}): {cause.removeprefix('error: ')}{where}")
    if "No kernels were profiled" in text:
        raise DsactlError(f"ncu profiled no kernel: none was launched inside the {NVTX_RANGE!r} NVTX range{where}")


@dataclass(frozen=True)
class Collected:
    solution: str
    report: Path | None  # None when the solution cannot run here
    log: Path | None
    workloads: int
    skipped: tuple[tuple[str, str], ...]  # (workload or solution, why)


def _availability(t: Target) -> tuple[bool, str]:
    """Whether t can run here: the solution's own check, or whether the baseline resolves on this machine
    (a plug-in that does not import is skipped with the reason)."""
    if t.solution is not None:
        return t.solution.availability()
    from dsactl.bench import baselines
    from dsactl.definitions import get

    found, skipped = baselines.resolve(get(t.workloads[0].definition), [t.name], include_reference=False)
    return (True, "") if found else (False, skipped[0].reason if skipped else "does not run here")


def worker_selection(selection: Selection, t: Target) -> Selection:
    """The worker's selection for one target: its solution, or its one baseline."""
    if t.solution is not None:
        return Selection(**{**vars(selection), "solution": t.name, "baselines": ()})
    return Selection(**{**vars(selection), "solution": None, "baselines": (t.name,)})


def collect(selection: Selection, out_dir: Path, ncu_set: str = "roofline", seed: int = 0,
            progress=lambda msg: None) -> list[Collected]:
    """Profile every planned solution and baseline in its own ncu child process; one report each."""
    ncu = find_ncu()
    targets = plan(selection)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for t in targets:
        name = t.name
        ok, why = _availability(t) if t.workloads else (False, "serves none of the selected workloads")
        if not ok:
            results.append(Collected(name, None, None, len(t.workloads), ((name, why),)))
            continue
        report, log = out_dir / f"{name}.ncu-rep", out_dir / f"{name}.ncu.log"
        progress(f"profiling {name} on {len(t.workloads)} workloads (ncu log: {log})")
        cmd = ncu_command(ncu, report, worker_command(worker_selection(selection, t), seed), ncu_set)
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        text = log.read_text()
        check_output(rc, text, log)
        results.append(Collected(name, report, log, len(t.workloads),
                                 tuple(_SKIP_RE.findall(text))))
    return results
