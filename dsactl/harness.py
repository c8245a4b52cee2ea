"""One way to call a solution: fresh inputs, poisoned preallocated outputs,
destination-passing call. verify, bench, profile and pack all go through here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from dsactl.definitions import Definition, get
from dsactl.workloads import Workload, make_inputs

# Poison values that no correct kernel writes: NaN for floats; for ints the
# most negative int32, which is neither a token id nor the -1 padding.
INT_POISON = -(2**31)


@dataclass
class Call:
    definition: Definition
    workload: Workload
    inputs: dict[str, Any]
    outputs: dict[str, torch.Tensor]

    def args(self) -> list[Any]:
        merged = {**self.inputs, **self.outputs}
        return [merged[name] for name in self.definition.signature]


def poison(outputs: dict[str, torch.Tensor]) -> None:
    for t in outputs.values():
        t.fill_(float("nan") if t.dtype.is_floating_point else INT_POISON)


def prepare(workload: Workload, device: str | torch.device = "cuda", seed: int = 0) -> Call:
    """Inputs for one trial and poisoned outputs, shapes checked against the definition."""
    d = get(workload.definition)
    inputs = make_inputs(workload, device, seed)
    axes = d.check_inputs(inputs)
    outputs = d.allocate_outputs(axes, device)
    poison(outputs)
    return Call(d, workload, inputs, outputs)


def run(fn: Callable, call: Call) -> dict[str, torch.Tensor]:
    """Poison the outputs, call fn in destination-passing style, return the outputs."""
    poison(call.outputs)
    fn(*call.args())
    return call.outputs
