"""Regression tracking: this run against an older bench CSV.

A (solution, definition, workload) regresses when its median latency grew by
more than REGRESSION_THRESHOLD *and* by more than the measured run-to-run
spread (the larger of the two runs' ranges of per-trial medians): slower than
both the 5% bar and the noise. It improves under the mirrored rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from dsactl.bench.runner import Result

REGRESSION_THRESHOLD = 0.05
# Header facts that make two runs incomparable when they differ.
MUST_MATCH = ("gpu", "timing_method")


@dataclass(frozen=True)
class Delta:
    solution: str
    definition: str
    workload: str
    old_us: float
    new_us: float
    noise_us: float

    @property
    def change(self) -> float:
        return self.new_us / self.old_us - 1.0

    @property
    def regression(self) -> bool:
        return self.change > REGRESSION_THRESHOLD and self.new_us - self.old_us > self.noise_us

    @property
    def improvement(self) -> bool:
        return self.change < -REGRESSION_THRESHOLD and self.old_us - self.new_us > self.noise_us


@dataclass
class Comparison:
    deltas: list[Delta]
    only_old: list[tuple[str, str, str]]  # in the old run, missing from the new one
    only_new: list[tuple[str, str, str]]
    warnings: list[str]

    @property
    def regressions(self) -> list[Delta]:
        return [d for d in self.deltas if d.regression]

    @property
    def improvements(self) -> list[Delta]:
        return [d for d in self.deltas if d.improvement]


def _key(r: Result) -> tuple[str, str, str]:
    return (r.solution, r.definition, r.workload)


def compare(old: Sequence[Result], new: Sequence[Result], old_meta: dict[str, Any] | None = None,
            new_meta: dict[str, Any] | None = None) -> Comparison:
    old_by = {_key(r): r for r in old}
    new_by = {_key(r): r for r in new}
    deltas = [Delta(*k, old_by[k].median_us, r.median_us, max(old_by[k].spread_us, r.spread_us))
              for k, r in new_by.items() if k in old_by]
    warnings = []
    for field in MUST_MATCH:
        a, b = (old_meta or {}).get(field), (new_meta or {}).get(field)
        if a is not None and b is not None and a != b:
            warnings.append(f"{field} differs: {a} (old) vs {b} (new); the comparison may not mean much")
    return Comparison(deltas, [k for k in old_by if k not in new_by], [k for k in new_by if k not in old_by], warnings)
