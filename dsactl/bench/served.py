"""Which implementation served a bench row.

A solution may choose its kernel per call: the sparse attention solution's module
has a dispatch function that takes the call's arguments by name and returns the
name of the implementation it would run (docs/design.md, "Dispatch"): `hopper` or
`triton`, which the row records. A solution whose module
has no dispatch function is named by its language; a baseline solution is never
dispatched, even where its entry shares the module of a dispatching one.
"""

from __future__ import annotations

import importlib

from dsactl.harness import Call
from dsactl.solutions import Solution

DISPATCH = "implementation_for"  # the dispatch function's name in a solution's entry module


def served_by(solution: Solution, call: Call) -> str:
    """The implementation that serves this call, else the solution's language."""
    if solution.baseline:
        return solution.language
    choose = getattr(importlib.import_module(solution.entry.partition(":")[0]), DISPATCH, None)
    if choose is None:
        return solution.language
    return choose(**call.inputs, **call.outputs)
