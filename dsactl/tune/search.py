"""One bucket of one family: verify every candidate against the reference, time those that pass, pick.

A candidate runs through the solution's own entry with the family's table forced to its knobs
(kernels/tuned.py, Table.forced), so what is verified and timed is exactly what the launcher will run
once the knobs are in the table. A candidate is verified (dsactl.verify: fresh inputs, poisoned outputs,
the contest's rules) on every workload of the bucket before it is timed; one that fails is never timed.
The survivors are timed as bench times (the timer bench's timing setup picks: cold L2, kernel time), all on
the same inputs per trial, and ranked by the sum of their per-workload medians.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dsactl import harness, solutions
from dsactl.errors import DsactlError
from dsactl.tune import space
from dsactl.tune.families import Family
from dsactl.verify import rules, runner
from dsactl.workloads import Workload

# A candidate replaces the hand-picked choice only when it is this much faster over the bucket, so that the
# noise between timings of equally fast configurations never writes an entry.
MIN_GAIN = 0.02
HAND_PICKED = "hand-picked"

# (bound call, iterations, warmup) -> (method used, per-call us): dsactl.bench.runner's Timer.
Timer = Callable[[Callable[[], Any], int, int], tuple[str, list[float]]]


@dataclass(frozen=True)
class Settings:
    warmup: int = 10
    iters: int = 50
    trials: int = 3  # timing trials, fresh inputs each
    verify_trials: int = 3  # verification trials per workload, fresh inputs each
    method: str = "auto"
    tolerance: rules.Tolerance = rules.Tolerance()


@dataclass
class Tried:
    knobs: dict[str, Any] | None  # None: the hand-picked choice
    problem: str = ""  # why verification refused it ("" when it passed)
    us: dict[str, float] = field(default_factory=dict)  # workload -> median us

    @property
    def label(self) -> str:
        return HAND_PICKED if self.knobs is None else " ".join(f"{k}={v}" for k, v in self.knobs.items())

    @property
    def total_us(self) -> float | None:
        return sum(self.us.values()) if self.us else None


@dataclass
class BucketResult:
    family: str
    bucket: str
    workloads: list[str]
    tried: list[Tried]
    method: str = ""
    gpu: str = ""  # the device that timed it: name and compute capability
    capability: tuple[int, int] | None = None

    @property
    def default(self) -> Tried:
        return self.tried[0]

    @property
    def winner(self) -> Tried | None:
        timed = [t for t in self.tried if t.total_us is not None]
        return min(timed, key=lambda t: t.total_us) if timed else None

    @property
    def chosen(self) -> Tried | None:
        """The candidate to write: a winner that beats a verified hand-picked choice by MIN_GAIN."""
        best, default = self.winner, self.default
        if best is None or best.knobs is None or default.total_us is None:
            return None
        return best if best.total_us <= default.total_us * (1 - MIN_GAIN) else None


def solution_for(definition: str) -> solutions.Solution:
    """The shipped Triton solution of a definition: the entry whose launchers read the tables (the
    attention's dispatches to the CUDA kernels too)."""
    found = [s for s in solutions.for_definition(definition) if s.language == "triton"]
    if len(found) != 1:
        raise DsactlError(f"{definition}: {len(found)} Triton solutions serve it, tune needs one")
    return found[0]


def forced(table: Any, knobs: dict[str, Any] | None, fn: Callable) -> Callable:
    """fn with the table forced to knobs for the duration of each call."""
    def call(*args):
        with table.forced(knobs):
            fn(*args)
    return call


def tune_bucket(family: Family, bucket: str, workloads: Sequence[Workload], candidates: Sequence[dict | None],
                timer: Timer, settings: Settings, device: str,
                on_step: Callable[[str], None] | None = None) -> BucketResult:
    """Verify each candidate on every workload, time the survivors, return them all (candidates[0]: None)."""
    table = space.table(family)
    entries = {w.definition: solution_for(w.definition).load() for w in workloads}
    tried = [Tried(k) for k in candidates]
    for t in tried:
        if on_step:
            on_step(f"{bucket}: verify {t.label}")
        for w in workloads:
            check = runner.Candidate(t.label, fn=forced(table, t.knobs, entries[w.definition]))
            result = runner.verify_pair(check, w, settings.verify_trials, settings.tolerance, device)
            if result.status != runner.PASSED:
                t.problem = f"{w.uuid}: {result.problems[0] if result.problems else result.status}"
                break
    samples: dict[int, dict[str, list[float]]] = {id(t): {w.uuid: [] for w in workloads} for t in tried}
    method = ""
    for trial in range(settings.trials):
        for w in workloads:
            call = harness.prepare(w, device, seed=trial)
            for t in tried:
                if t.problem:
                    continue
                if on_step:
                    on_step(f"{bucket}: time {t.label} on {w.uuid}, trial {trial + 1}/{settings.trials}")
                fn = forced(table, t.knobs, entries[w.definition])
                try:
                    method, got = timer(functools.partial(fn, *call.args()), settings.iters, settings.warmup)
                except Exception as e:  # a candidate that cannot be timed drops out, as a contender in bench
                    t.problem = f"timing {w.uuid} raised {type(e).__name__}: {e}"
                    continue
                samples[id(t)][w.uuid].extend(got)
            del call
    for t in tried:
        if not t.problem:
            t.us = {uuid: statistics.median(us) for uuid, us in samples[id(t)].items()}
    return BucketResult(family.name, bucket, [w.uuid for w in workloads], tried, method)
