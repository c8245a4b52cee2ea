"""Workload: one set of axis values plus how to make its inputs, as plain data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Workload:
    uuid: str
    definition: str
    suite: str
    label: str  # workload class for tables and plots, e.g. "passthrough", "short", "long"
    axes: dict[str, int]
    # Generator parameters for embedded suites (e.g. seq_lens, index pattern);
    # for datasets, the flashinfer-bench input specs under "inputs" and "root".
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.axes.items())
        return f"{self.uuid} [{self.label}] {shown}"
