"""Reproduce a failing case: a one-line command, and optionally its exact inputs.

The inputs are saved as a one-workload flashinfer-bench dataset (the definition's
JSON, one workloads line whose tensors point into a safetensors blob, scalars
inline), so `dsactl verify --dataset FOLDER` re-runs exactly that call with no
other tooling, and the folder can be attached to a bug report as it is.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Sequence

import torch

from dsactl import harness
from dsactl.verify.rules import Tolerance
from dsactl.workloads import SUITES, Workload

BLOB_FOLDER = "blob"


def save(call: harness.Call, directory: str | Path, seed: int) -> Path:
    """Write the call's inputs under directory/<workload>-seed<seed>/ and return that folder."""
    from safetensors.torch import save_file

    d, w = call.definition, call.workload
    root = Path(directory) / f"{w.uuid}-seed{seed}"
    blob = Path(BLOB_FOLDER) / f"{w.uuid}.safetensors"
    (root / BLOB_FOLDER).mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().cpu().contiguous() for name, t in call.inputs.items() if isinstance(t, torch.Tensor)}
    save_file(tensors, str(root / blob))
    specs = {
        name: {"type": "safetensors", "path": blob.as_posix(), "tensor_key": name} if name in tensors
        else {"type": "scalar", "value": float(value)}
        for name, value in call.inputs.items()
    }
    axes = d.axis_values(call.inputs)
    line = {"uuid": w.uuid, "axes": {k: axes[k] for k in d.var_axes if k in axes}, "inputs": specs}
    for folder, suffix, text in (("definitions", ".json", json.dumps(d.to_json(), indent=2) + "\n"),
                                 ("workloads", ".jsonl", json.dumps(line) + "\n")):
        path = root / folder / d.op_type / f"{d.name}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def command(selector: Sequence[str], w: Workload, seed: int, tol: Tolerance, dataset: str | Path | None = None) -> str:
    """`dsactl verify ...` that re-runs this (solution, workload) up to the failing trial;
    empty when the solution has no command-line form (a bare callable) or the workload
    comes from neither a suite nor a dataset."""
    if not selector:
        return ""
    if dataset is not None:
        source, trials = ["--dataset", str(dataset)], 1  # saved inputs: the same call every trial
    elif "root" in w.params:
        source, trials = ["--dataset", str(w.params["root"])], seed + 1
    elif w.suite in SUITES:
        source, trials = ["--suite", w.suite], seed + 1
    else:
        return ""
    default = Tolerance()
    extra = []
    for flag, value, usual in (("--atol", tol.atol, default.atol), ("--rtol", tol.rtol, default.rtol),
                               ("--matched-ratio", tol.matched_ratio, default.matched_ratio)):
        if value != usual:
            extra += [flag, f"{value:g}"]
    return shlex.join(["dsactl", "verify", *selector, *source, "--workload", w.uuid, "--trials", str(trials), *extra])
