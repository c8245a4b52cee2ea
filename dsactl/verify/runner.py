"""Run solutions over workloads and judge every call with the contest's rules.

Each (solution, workload) pair runs `trials` calls, each on fresh inputs
(harness.prepare with seed = trial) into outputs poisoned before the call; the
first failing trial stops the pair and names its seed. A solution that cannot
run here is never called: it is listed as skipped with Solution.availability()'s
reason, never counted as passed (without a GPU, pure-Triton solutions run under
the Triton interpreter). A candidate is a registered Solution or a bare callable
with the definition's destination-passing signature.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from dsactl import harness
from dsactl.definitions import get
from dsactl.errors import DsactlError
from dsactl.solutions import Solution, interpretable
from dsactl.verify import repro, rules
from dsactl.workloads import Workload

# --quick: this many workloads per definition, the smallest of each workload class first
# (two: on CPU a contest attention workload materializes a 1 GB cache per trial).
QUICK_PER_DEFINITION = 2
# A second poison for the never-written diagnostic, finite so it cannot be mistaken for
# the first (NaN); any float dtype rounds it to some representable value, compared as such.
SECOND_FLOAT_POISON = -12345.0

PASSED, FAILED, ERROR = "passed", "failed", "error"
INTERPRETED = "runs under the Triton interpreter"
# Skipped.solution of a workload that ran for no solution: none serves it, or --quick left it out.
EVERY_SOLUTION = "-"
NO_SERVER = "no solution serves this definition"
# The PyTorch baselines time the contract's calls; values outside it (the hostile suite) are for our kernels.
HOSTILE_BASELINE = "a baseline: not built for inputs outside the contract"


@dataclass(frozen=True)
class Candidate:
    """What verify calls: a registered Solution, or a bare callable (serves everything)."""

    name: str
    solution: Solution | None = None
    fn: Callable | None = None
    selector: tuple[str, ...] = ()  # command-line options that select it again (reproduction)

    @property
    def baseline(self) -> bool:
        return self.solution is not None and self.solution.baseline

    def serves(self, definition: str) -> bool:
        return self.solution is None or self.solution.serves(definition)

    def refuses(self, w: Workload) -> str | None:
        """Why its kernel does not take this workload of a definition it serves (Solution.refuses), else None."""
        if self.solution is None or self.solution.refuses is None:
            return None
        return self.solution.refuses(get(w.definition).params, w.params)

    def availability(self) -> tuple[bool, str]:
        if self.solution is None:
            return True, "ok"
        ok, reason = self.solution.availability()
        if not ok and interpretable(self.solution) and os.environ.get("TRITON_INTERPRET") == "1":
            return True, INTERPRETED
        return ok, reason

    def load(self) -> Callable:
        return self.fn if self.solution is None else self.solution.load()


def candidate(obj: Solution | Callable | Candidate, selector: Sequence[str] | None = None) -> Candidate:
    if isinstance(obj, Candidate):
        return obj
    if isinstance(obj, Solution):
        return Candidate(obj.name, solution=obj,
                         selector=tuple(selector) if selector is not None else ("--solution", obj.name))
    if callable(obj):
        return Candidate(getattr(obj, "__name__", repr(obj)), fn=obj, selector=tuple(selector or ()))
    raise TypeError(f"cannot verify {obj!r}: expected a Solution or a callable")


@dataclass
class WorkloadResult:
    solution: str
    definition: str
    workload: str
    suite: str
    label: str
    status: str  # passed | failed | error
    trials: int  # trials run (a failing trial ends the pair)
    max_abs: float
    max_rel: float
    matched: float  # worst fraction of matching elements (or id slots) over the trials
    seconds: float  # wall time of the pair: inputs, calls, reference, comparison
    call_ms: float | None  # median wall time of one solution call (synchronized)
    problems: list[str] = field(default_factory=list)
    failing_seed: int | None = None
    repro: str = ""  # one-line command that re-runs this case
    saved: str | None = None  # folder with the failing inputs, when saved
    baseline: bool = False
    gpu: str = ""  # the device that ran it ("cpu" under the interpreter), its UUID and host
    gpu_uuid: str = ""
    host: str = ""


@dataclass
class Skipped:
    solution: str  # EVERY_SOLUTION: the workloads ran for no solution
    definition: str
    reason: str
    workloads: int


@dataclass
class SummaryRow:
    definition: str
    solution: str
    passed: int
    failed: int
    errors: int
    skipped: int
    max_abs: float
    max_rel: float
    seconds: float


@dataclass
class Report:
    device: str
    tolerance: rules.Tolerance
    trials: int
    results: list[WorkloadResult] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    selected: int = 0  # workloads chosen, those --quick left out included

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def workloads_ran(self) -> int:
        return len({(r.definition, r.workload) for r in self.results})

    def not_run(self) -> Counter[str]:
        """Workloads that ran for no solution, counted per reason; together with
        workloads_ran they account for every selected workload."""
        reasons: Counter[str] = Counter()
        for s in self.skipped:
            if s.solution == EVERY_SOLUTION:
                reasons[s.reason] += s.workloads
        idle = self.selected - self.workloads_ran - sum(reasons.values())
        if idle:
            reasons["every solution serving it was skipped"] += idle
        return reasons

    def headline(self) -> str:
        """One line: workloads run and not run, pair outcomes, pair skips, each with its reasons."""
        not_run = self.not_run()
        skips: Counter[str] = Counter()
        for s in self.skipped:
            if s.solution != EVERY_SOLUTION:
                skips[s.reason] += s.workloads
        text = f"{self.workloads_ran} of {self.selected} workloads ran"
        if not_run:
            text += f", {sum(not_run.values())} did not ({_reasons(not_run)})"
        text += (f"; {self.count(PASSED)} passed, {self.count(FAILED)} failed, {self.count(ERROR)} errors, "
                 f"{sum(skips.values())} skipped")
        return text + (f" ({_reasons(skips)})" if skips else "")

    @property
    def ok(self) -> bool:
        return all(r.status == PASSED for r in self.results)

    def summary(self) -> list[SummaryRow]:
        keys = sorted({(r.definition, r.solution) for r in self.results}
                      | {(s.definition, s.solution) for s in self.skipped})
        rows = []
        for d, s in keys:
            mine = [r for r in self.results if (r.definition, r.solution) == (d, s)]
            rows.append(SummaryRow(
                d, s, sum(r.status == PASSED for r in mine), sum(r.status == FAILED for r in mine),
                sum(r.status == ERROR for r in mine),
                sum(k.workloads for k in self.skipped if (k.definition, k.solution) == (d, s)),
                max((r.max_abs for r in mine), default=0.0), max((r.max_rel for r in mine), default=0.0),
                sum(r.seconds for r in mine)))
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "tolerance": asdict(self.tolerance),
            "trials": self.trials,
            "counts": {s: self.count(s) for s in (PASSED, FAILED, ERROR)}
            | {"skipped": sum(s.workloads for s in self.skipped), "workloads_selected": self.selected,
               "workloads_ran": self.workloads_ran},
            "summary": [asdict(r) for r in self.summary()],
            "results": [asdict(r) for r in self.results],
            "skipped": [asdict(s) for s in self.skipped],
        }


def _reasons(counts: Counter[str]) -> str:
    return "; ".join(f"{n} {reason}" for reason, n in counts.most_common())


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cost(w: Workload) -> tuple[int, int]:
    """Size of a workload for --quick: input elements, then the tokens its rows cover
    (suites describe rows by seq_lens / lengths; cache sizes often tie)."""
    d = get(w.definition)
    axes = {**d.const_axes, **w.axes}
    elements = sum(math.prod(a if isinstance(a, int) else axes.get(a, 1) for a in s.shape) for s in d.inputs)
    tokens = sum(w.params.get("seq_lens") or w.params.get("lengths") or ())
    return elements, tokens


def quick(workloads: Iterable[Workload], per_definition: int = QUICK_PER_DEFINITION) -> list[Workload]:
    """A few small workloads per definition: the smallest of each class, then by size."""
    by_definition: dict[str, list[Workload]] = {}
    for w in workloads:
        by_definition.setdefault(w.definition, []).append(w)
    out = []
    for ws in by_definition.values():
        ranked = sorted(ws, key=_cost)
        smallest: dict[str, Workload] = {}
        for w in ranked:
            smallest.setdefault(w.label, w)
        firsts = list(smallest.values())
        out.extend((firsts + [w for w in ranked if w not in firsts])[:per_definition])
    return out


def quick_subset(workloads: Sequence[Workload], why: str) -> tuple[list[Workload], list[Skipped]]:
    """quick()'s workloads, and the rest as skipped for every solution, counted per definition."""
    chosen = quick(workloads)
    left: Counter[str] = Counter(w.definition for w in workloads if w not in chosen)
    return chosen, [Skipped(EVERY_SOLUTION, d, why, n) for d, n in left.items()]


def plan(candidates: Sequence[Candidate], workloads: Sequence[Workload]
         ) -> tuple[list[tuple[Candidate, Workload]], list[Skipped]]:
    """The pairs that can run here, and what is skipped with its reason."""
    available = [c.availability() for c in candidates]
    pairs: list[tuple[Candidate, Workload]] = []
    skipped: Counter[tuple[str, str, str]] = Counter()
    for w in workloads:
        serving = [(c, a) for c, a in zip(candidates, available) if c.serves(w.definition)]
        if not serving:
            skipped[EVERY_SOLUTION, w.definition, NO_SERVER] += 1
        for c, (ok, reason) in serving:
            if ok and c.baseline and "hostile" in w.params:
                ok, reason = False, HOSTILE_BASELINE
            elif ok and (refused := c.refuses(w)):
                ok, reason = False, refused
            if ok:
                pairs.append((c, w))
            else:
                skipped[c.name, w.definition, reason] += 1
    return pairs, [Skipped(s, d, reason, n) for (s, d, reason), n in skipped.items()]


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _timed_call(fn: Callable, call: harness.Call, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    harness.run(fn, call)
    _sync(device)
    return time.perf_counter() - start


def _error_text(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
    first_line = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first_line}{where}"


def never_written(fn: Callable, call: harness.Call) -> list[str]:
    """Tell unwritten float elements from computed NaNs: call again over a second,
    finite poison; an element that kept both poisons was never written."""
    first = {name: t.clone() for name, t in call.outputs.items() if t.dtype.is_floating_point}
    if not first:
        return []
    for name in first:
        call.outputs[name].fill_(SECOND_FLOAT_POISON)
    try:
        fn(*call.args())
    except Exception:  # the diagnostic is best effort; the failure is already reported
        return []
    problems = []
    for name, before in first.items():
        after = call.outputs[name]
        marker = torch.full((), SECOND_FLOAT_POISON, dtype=after.dtype, device=after.device)
        kept = (torch.isnan(before) & (after == marker)).cpu()
        if bool(kept.any()):
            where = rules._where(int(kept.reshape(-1).nonzero()[0]), kept.shape)
            n = int(kept.sum())
            problems.append(f"{name}: {n} element{'' if n == 1 else 's'} never written (keeping whatever the "
                            f"buffer held), first at {where}")
    return problems


def verify_pair(c: Candidate, w: Workload, trials: int = 3, tol: rules.Tolerance = rules.Tolerance(),
                device: str | None = None, save_dir: str | Path | None = None) -> WorkloadResult:
    """Run one solution on one workload for `trials` fresh inputs and judge each call."""
    device = device or default_device()
    start = time.perf_counter()
    result = WorkloadResult(c.name, w.definition, w.uuid, w.suite, w.label, PASSED, 0, 0.0, 0.0, 1.0, 0.0, None,
                            baseline=c.baseline)
    times: list[float] = []
    failing_call = None
    try:
        fn = c.load()
    except Exception as e:  # importing a solution may raise anything
        fn = None
        result.status = ERROR
        result.problems.append(str(e) if isinstance(e, DsactlError) else f"cannot load it: {_error_text(e)}")
    for seed in range(trials if fn is not None else 0):
        result.trials = seed + 1
        try:
            call = harness.prepare(w, device, seed)
        except Exception as e:  # the workload cannot be made here (e.g. out of memory)
            result.status, result.failing_seed = ERROR, seed
            result.problems.append(f"making the inputs failed: {_error_text(e)}")
            break
        try:
            times.append(_timed_call(fn, call, device))
        except Exception as e:  # a solution may raise anything; it is the solution's error
            result.status, result.failing_seed, failing_call = ERROR, seed, call
            result.problems.append(f"the call raised {_error_text(e)}")
            break
        verdict = rules.check(call.definition, call.inputs, call.outputs, tol)
        result.max_abs = max(result.max_abs, verdict.max_abs)
        result.max_rel = max(result.max_rel, verdict.max_rel)
        result.matched = min(result.matched, verdict.matched)
        if not verdict.passed:
            result.status, result.failing_seed, failing_call = FAILED, seed, call
            result.problems = verdict.problems + never_written(fn, call)
            if verdict.more_problems:
                result.problems.append(f"... and {verdict.more_problems} more problems")
            break
    result.call_ms = statistics.median(times) * 1e3 if times else None
    if result.status != PASSED:
        seed = result.failing_seed or 0
        if save_dir is not None and failing_call is not None:
            result.saved = str(repro.save(failing_call, save_dir, seed))
        result.repro = repro.command(c.selector, w, seed, tol, dataset=result.saved)
    result.seconds = time.perf_counter() - start
    return result


@dataclass(frozen=True)
class Job:
    """One workload and every candidate: what a worker verifies. The worker plans the pairs itself,
    so which solutions can run is decided on the GPU that runs them."""

    candidates: tuple[Candidate, ...]
    workload: Workload
    trials: int
    tol: rules.Tolerance
    device: str | None  # None: the worker's default
    save_dir: str | None


@dataclass
class Outcome:
    results: list[WorkloadResult]
    skipped: list[Skipped]


def run_job(job: Job) -> Outcome:
    pairs, skipped = plan(job.candidates, [job.workload])
    return Outcome([verify_pair(c, w, job.trials, job.tol, job.device, job.save_dir) for c, w in pairs], skipped)


def lost(job: Job, why: str) -> Outcome:
    """A job whose worker died: an error row for every candidate serving its workload, with the reason."""
    w = job.workload
    return Outcome([WorkloadResult(c.name, w.definition, w.uuid, w.suite, w.label, ERROR, 0, 0.0, 0.0, 0.0, 0.0, None,
                                   problems=[why], baseline=c.baseline)
                    for c in job.candidates if c.serves(w.definition)], [])


def _merge_skipped(groups: Iterable[Sequence[Skipped]]) -> list[Skipped]:
    """Per-workload skips summed per (solution, definition, reason), in first-seen order."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for group in groups:
        for s in group:
            counts[s.solution, s.definition, s.reason] += s.workloads
    return [Skipped(s, d, reason, n) for (s, d, reason), n in counts.items()]


def verify(candidates: Sequence[Solution | Callable | Candidate], workloads: Sequence[Workload], trials: int = 3,
           tol: rules.Tolerance = rules.Tolerance(), device: str | None = None,
           save_dir: str | Path | None = None,
           on_start: Callable[[Workload, int, int], None] | None = None,
           on_workload: Callable[[Workload, list[WorkloadResult]], None] | None = None,
           left_out: Sequence[Skipped] = (), executor: Any = None) -> Report:
    """Verify every runnable (solution, workload) pair; list the rest as skipped, with
    left_out: the selected workloads not passed in (quick_subset's).
    executor (dsactl.executor; default: this process) runs one job per workload; results come back
    in the order of a plain run, each stamped with the GPU that produced it.
    on_start(workload, index, total) as a workload is handed out, on_workload(workload, its results) as
    each comes back."""
    from dsactl.executor.local import LocalExecutor

    executor = executor or LocalExecutor()
    device = device or default_device()
    cands = tuple(candidate(c) for c in candidates)
    jobs = [Job(cands, w, trials, tol, device if executor.local else None,
                None if save_dir is None else str(save_dir)) for w in workloads]
    outcomes: list[Outcome | None] = [None] * len(jobs)

    def started(index: int) -> None:
        if on_start:
            on_start(jobs[index].workload, index, len(jobs))

    for done in executor.map(run_job, jobs, started):
        outcome = done.result if done.error is None else lost(jobs[done.index], done.error)
        for r in outcome.results:
            if done.placement is not None:
                r.gpu, r.gpu_uuid, r.host = done.placement.gpu, done.placement.uuid, done.placement.host
        outcomes[done.index] = outcome
        if on_workload:
            on_workload(jobs[done.index].workload, outcome.results)
    finished = [o for o in outcomes if o is not None]
    return Report(device, tol, trials, results=[r for o in finished for r in o.results],
                  skipped=[*left_out, *_merge_skipped(o.skipped for o in finished)],
                  selected=len(workloads) + sum(s.workloads for s in left_out))


def run_once(candidates: Sequence[Candidate], workloads: Sequence[Workload], device: str | None = None,
             on_call: Callable[[Candidate, Workload, str | None], None] | None = None) -> int:
    """One call per runnable pair, nothing judged (what a sanitizer watches); returns
    the number of calls that raised."""
    device = device or default_device()
    pairs, _ = plan(candidates, workloads)
    failures = 0
    for c, w in pairs:
        error = None
        try:
            call = harness.prepare(w, device, 0)
            harness.run(c.load(), call)
            _sync(device)
        except Exception as e:  # reported per call; the sanitizer's log says the rest
            error = _error_text(e)
            failures += 1
        if on_call:
            on_call(c, w, error)
    return failures
