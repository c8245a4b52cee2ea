"""A conformance run's outcome as plain data: every case a peer's own test suite ran against dsactl's drop-in
module, by outcome, and the JSON file (profiles/<gpu>/conformance.json) that keeps one report per suite."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASSED = "passed"
FAILED = "failed"  # the peer's own check said no
ERROR = "error"  # the call raised where it should have served
NOT_SERVED = "not served"  # outside what the drop-in serves (listed by reason, never counted as passed)
OUTCOMES = (PASSED, FAILED, ERROR, NOT_SERVED)
UNKNOWN = "unknown"  # the source of a checkout that names no commit


@dataclass
class Case:
    name: str  # the peer's own description of the case (its test parameters)
    outcome: str
    reason: str = ""  # why it failed, raised or is not served


@dataclass
class Report:
    suite: str  # e.g. "flash_mla.sparse_decode"
    source: str  # the peer checkout's commit
    cases: list[Case] = field(default_factory=list)

    def add(self, name: str, outcome: str, reason: str = "") -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        self.cases.append(Case(name, outcome, reason))

    def count(self, outcome: str) -> int:
        return sum(c.outcome == outcome for c in self.cases)

    @property
    def served(self) -> int:
        """The cases run against the drop-in (all but the ones outside what it serves)."""
        return len(self.cases) - self.count(NOT_SERVED)

    def summary(self) -> dict:
        not_served: dict[str, int] = {}
        for c in self.cases:
            if c.outcome == NOT_SERVED:
                not_served[c.reason] = not_served.get(c.reason, 0) + 1
        return {"suite": self.suite, "source": self.source, "passed": self.count(PASSED), "total": self.served,
                "failed": self.count(FAILED), "errors": self.count(ERROR), "not_served": not_served}


def write(path: Path, reports: list[Report]) -> None:
    """Merge the reports into the JSON file at path: one entry per suite (a suite run again replaces its
    entry), each with its summary and every case that did not pass."""
    data = json.loads(path.read_text()) if path.exists() else {}
    for r in reports:
        data[r.suite] = {**r.summary(),
                         "cases": [asdict(c) for c in r.cases if c.outcome not in (PASSED, NOT_SERVED)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(data.items())), indent=1) + "\n")


def checkout_commit(checkout: Path) -> str:
    """git's HEAD where the checkout is a work tree of its own (not a folder inside another repository), else
    the first line of its COMMIT file, else 'unknown'."""
    try:
        top, head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--show-toplevel", "HEAD"],
                                   capture_output=True, text=True, check=True).stdout.splitlines()
        if Path(top).resolve() == checkout.resolve():
            return head
    except (OSError, ValueError, subprocess.CalledProcessError):
        pass
    commit = checkout / "COMMIT"
    lines = commit.read_text().split() if commit.is_file() else []
    return lines[0] if lines else UNKNOWN
