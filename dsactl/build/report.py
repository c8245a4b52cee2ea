"""The resource report: one row per kernel x configuration, build/<arch>/report.json, and the gates."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from dsactl.build.arch import MAX_REGISTERS_PER_BLOCK, by_name

REPORT_FILE = "report.json"


@dataclass(frozen=True)
class ReportRow:
    arch: str
    kind: str  # "cuda" | "triton"
    unit: str  # what one compile produces: the CUDA library, or the Triton kernel module
    kernel: str
    configuration: str  # CUDA: template arguments; Triton: the aot_specs name
    registers: int  # per thread
    shared_static: int  # bytes per block, as ptxas reports it
    shared_dynamic: int | None  # bytes per block; None for CUDA, where the launcher picks it
    stack_frame: int  # bytes per thread
    local: int  # bytes per thread, as cuobjdump reports it
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    compile_s: float  # wall time of the compile that produced it (a whole library for CUDA)
    options: dict = field(default_factory=dict)  # Triton: num_warps, num_stages, constexprs

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    @property
    def shared_total(self) -> int:
        """Shared memory per block at launch: static, plus dynamic where the build knows it."""
        return self.shared_static + (self.shared_dynamic or 0)

    @property
    def threads(self) -> int | None:
        """Threads per block, known for Triton (num_warps); a CUDA launcher picks its own."""
        warps = self.options.get("num_warps")
        return None if warps is None else warps * 32

    def launch_problems(self) -> list[str]:
        """Why this kernel cannot launch on its arch (over a per-block limit); empty when it can."""
        problems = []
        limit = by_name(self.arch).max_shared_per_block
        if self.shared_total > limit:
            problems.append(f"needs {self.shared_total} B of shared memory per block > {limit} B on {self.arch}")
        if self.threads is not None and self.registers * self.threads > MAX_REGISTERS_PER_BLOCK:
            problems.append(f"needs {self.registers} registers x {self.threads} threads per block "
                            f"> {MAX_REGISTERS_PER_BLOCK}")
        return problems

    @property
    def label(self) -> str:
        config = f" [{self.configuration}]" if self.configuration else ""
        return f"{self.kernel}{config} ({self.kind} {self.unit}, {self.arch})"


def write(arch_dir: Path, arch: str, toolchain: dict[str, str], rows: list[ReportRow]) -> Path:
    path = arch_dir / REPORT_FILE
    payload = {"arch": arch, "toolchain": toolchain, "kernels": [dataclasses.asdict(r) for r in rows]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def gate_failures(rows: list[ReportRow], *, fail_on_spills: bool, max_registers: int | None) -> list[str]:
    """One message per violated gate, naming kernel and configuration; empty when all pass.
    A kernel that cannot launch on its arch always fails; spills and registers when asked."""
    failures = []
    for row in rows:
        failures += [f"{row.label} cannot launch: {problem}" for problem in row.launch_problems()]
        if fail_on_spills and row.spills:
            failures.append(f"{row.label} spills {row.spill_stores} B stores, {row.spill_loads} B loads")
        if max_registers is not None and row.registers > max_registers:
            failures.append(f"{row.label} uses {row.registers} registers > {max_registers}")
    return failures
