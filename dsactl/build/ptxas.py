"""Parse `ptxas -v` output (from nvcc -Xptxas -v, or Triton's ptxas log) into per-kernel resources."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Triton ships ptxas as "ptxas" and "ptxas-blackwell"; both prefix their lines with their own name.
_PREFIX = r"^ptxas[\w-]*\s+info\s*:\s*"
_ENTRY = re.compile(_PREFIX + r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(_PREFIX + r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(_PREFIX + r"Used (\d+) registers(.*)")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARRIERS = re.compile(r"used (\d+) barriers")


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one entry function (a __global__ kernel)."""

    name: str  # as ptxas prints it: mangled for C++ kernels
    target: str  # "sm_90a"
    registers: int
    barriers: int
    shared_static: int  # bytes
    stack_frame: int  # bytes per thread; holds local arrays and spills
    spill_stores: int  # bytes
    spill_loads: int  # bytes


def parse(log: str) -> list[KernelResources]:
    """Every entry function in the log, in order; device functions and other lines are ignored."""
    kernels: list[KernelResources] = []
    fields: dict | None = None
    properties_for: str | None = None

    def finish() -> None:
        if fields is not None:
            missing = {"registers", "stack_frame"} - fields.keys()
            if missing:
                raise ValueError(f"ptxas log for {fields['name']} lacks {sorted(missing)}")
            kernels.append(KernelResources(**{"barriers": 0, "shared_static": 0, **fields}))

    for line in log.splitlines():
        if match := _ENTRY.match(line):
            finish()
            fields = {"name": match.group(1), "target": match.group(2)}
            properties_for = None
        elif match := _PROPERTIES.match(line):
            properties_for = match.group(1)
        elif (match := _FRAME.search(line)) and fields is not None and properties_for == fields["name"]:
            fields.update(
                stack_frame=int(match.group(1)), spill_stores=int(match.group(2)), spill_loads=int(match.group(3))
            )
            properties_for = None
        elif (match := _USED.match(line)) and fields is not None:
            fields["registers"] = int(match.group(1))
            rest = match.group(2)
            if smem := _SMEM.search(rest):
                fields["shared_static"] = int(smem.group(1))
            if barriers := _BARRIERS.search(rest):
                fields["barriers"] = int(barriers.group(1))
    finish()
    return kernels
