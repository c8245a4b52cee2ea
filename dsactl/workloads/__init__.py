"""Workload suites (contest, scale, edge), flashinfer-bench datasets, and input making."""

from __future__ import annotations

from typing import Any

from dsactl.workloads.dataset import load_dataset, make_dataset_inputs
from dsactl.workloads.generate import make_generated_inputs
from dsactl.workloads.suites import SUITES, suite
from dsactl.workloads.workload import Workload

__all__ = ["Workload", "SUITES", "suite", "load_dataset", "make_inputs", "select"]


def make_inputs(workload: Workload, device="cuda", seed: int = 0) -> dict[str, Any]:
    """Fresh inputs for one call: tensors on `device`, scalars as Python floats."""
    if "inputs" in workload.params:
        return make_dataset_inputs(workload, device, seed)
    return make_generated_inputs(workload, device, seed)


def select(suite_name: str | None = None, dataset: str | None = None, definition: str | None = None,
           workload_id: str | None = None) -> list[Workload]:
    """The workloads a command iterates over: one suite or a dataset, filtered."""
    from fnmatch import fnmatch

    from dsactl.errors import DsactlError

    workloads = load_dataset(dataset) if dataset else suite(suite_name or "contest")
    if definition:
        workloads = [w for w in workloads if fnmatch(w.definition, definition)]
    if workload_id:
        workloads = [w for w in workloads if w.uuid == workload_id]
        if not workloads:
            raise DsactlError(f"no workload {workload_id!r} in {dataset or suite_name or 'contest'}")
    if not workloads:
        raise DsactlError("no workload matches the given suite/dataset and definition")
    return workloads
