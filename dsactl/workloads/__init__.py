"""Workload suites (contest, scale, prefill, edge, hostile), flashinfer-bench datasets, and input making."""

from __future__ import annotations

from typing import Any, Sequence

from dsactl.workloads.suites import SUITES, suite
from dsactl.workloads.workload import Workload

__all__ = ["Workload", "SUITES", "suite", "load_dataset", "make_inputs", "select"]


# The suites are plain data; making inputs and reading datasets import torch, on first use.
def make_inputs(workload: Workload, device="cuda", seed: int = 0) -> dict[str, Any]:
    """Fresh inputs for one call: tensors on `device`, scalars as Python floats."""
    if "inputs" in workload.params:
        from dsactl.workloads.dataset import make_dataset_inputs

        return make_dataset_inputs(workload, device, seed)
    from dsactl.workloads.generate import make_generated_inputs

    return make_generated_inputs(workload, device, seed)


def load_dataset(path) -> list[Workload]:
    """The workloads of a flashinfer-bench dataset folder (dataset.load_dataset)."""
    from dsactl.workloads import dataset

    return dataset.load_dataset(path)


def select(suite_name: str | None = None, dataset: str | None = None, definition: str | None = None,
           workload_ids: Sequence[str] = ()) -> list[Workload]:
    """The workloads a command iterates over: one suite or a dataset, filtered by definition
    pattern and, when given, by workload ids (in the suite's order; an unknown id is an error).
    With neither a suite nor a dataset named, ids are looked up in every embedded suite, and
    without ids the suite is contest."""
    from fnmatch import fnmatch

    from dsactl.errors import DsactlError

    if dataset:
        workloads = load_dataset(dataset)
    elif suite_name or not workload_ids:
        workloads = suite(suite_name or "contest")
    else:
        workloads = [w for name in SUITES for w in suite(name)]
    if definition:
        workloads = [w for w in workloads if fnmatch(w.definition, definition)]
    if workload_ids:
        known = {w.uuid for w in workloads}
        missing = [i for i in workload_ids if i not in known]
        if missing:
            where = dataset or (suite_name and f"suite {suite_name}") or "any suite"
            raise DsactlError(f"no workload {', '.join(map(repr, missing))} in {where}"
                              + (f" for definition {definition!r}" if definition else "")
                              + ("" if dataset else _found_elsewhere(missing, definition)))
        workloads = [w for w in workloads if w.uuid in set(workload_ids)]
    if not workloads:
        raise DsactlError("no workload matches the given suite/dataset and definition")
    return workloads


def _found_elsewhere(ids: Sequence[str], definition: str | None) -> str:
    """'; edge has X' for the ids another suite holds, so the error says which --suite to pass."""
    from fnmatch import fnmatch

    holders = {}
    for name in SUITES:
        for w in suite(name):
            if w.uuid in ids and (definition is None or fnmatch(w.definition, definition)):
                holders.setdefault(name, []).append(w.uuid)
    return "".join(f"; --suite {name} has {', '.join(found)}" for name, found in holders.items())
