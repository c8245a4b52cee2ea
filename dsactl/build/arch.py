"""The GPU architectures dsactl builds for, and which of them the installed nvcc can target."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from dsactl.errors import DsactlError
from dsactl.kernels import cuda_library
from dsactl.kernels.cuda_library import find_nvcc as nvcc_path

ALL = "all"
# Family-specific targets (compute_100f: every 10.x GPU) first shipped in CUDA 12.9;
# `nvcc --list-gpu-arch` lists only the plain compute_XX names, so the version decides.
FAMILY_MIN_NVCC = (12, 9)
# Per-block limits every arch of the table shares (CUDA programming guide, compute capabilities).
MAX_REGISTERS_PER_BLOCK = 65536
# The most shared memory one block may use (static + dynamic, with the opt-in attribute), bytes.
SHARED_PER_BLOCK_DATACENTER = 232448  # sm_90, sm_100, sm_103: 227 KB
SHARED_PER_BLOCK_CONSUMER = 101376  # sm_120 (RTX 50, RTX PRO Blackwell): 99 KB


@dataclass(frozen=True)
class Arch:
    name: str  # what users type: "sm90a"
    capability: tuple[int, int]  # the device capability the build runs on (a family: its first member)
    suffix: str  # "a": this exact GPU, arch-specific features; "f": the whole family
    max_shared_per_block: int  # bytes; a kernel asking for more cannot launch

    @property
    def number(self) -> str:
        return f"{self.capability[0]}{self.capability[1]}"

    @property
    def gencode(self) -> str:
        return cuda_library.gencode(self.name)

    @property
    def triton_cc(self) -> int:
        """Triton has no family targets: for one it compiles for the family's first member."""
        return self.capability[0] * 10 + self.capability[1]

    @property
    def is_family(self) -> bool:
        return self.suffix == "f"


ARCHES = (
    Arch("sm90a", (9, 0), "a", SHARED_PER_BLOCK_DATACENTER),
    Arch("sm100a", (10, 0), "a", SHARED_PER_BLOCK_DATACENTER),
    Arch("sm103a", (10, 3), "a", SHARED_PER_BLOCK_DATACENTER),
    Arch("sm120a", (12, 0), "a", SHARED_PER_BLOCK_CONSUMER),
    Arch("sm100f", (10, 0), "f", SHARED_PER_BLOCK_DATACENTER),
    Arch("sm120f", (12, 0), "f", SHARED_PER_BLOCK_CONSUMER),
)
# The build a GPU loads at run time (the kernels' loader decides): the arch-specific one for its capability.
ARCH_FOR_CAPABILITY = cuda_library.ARCH_FOR_CAPABILITY



def by_name(name: str) -> Arch:
    for a in ARCHES:
        if a.name == name:
            return a
    raise DsactlError(f"unknown arch {name!r}: choose one of {', '.join(a.name for a in ARCHES)}")

@lru_cache(maxsize=None)
def nvcc_version() -> tuple[int, int]:
    out = _nvcc("--version")
    match = re.search(r"release (\d+)\.(\d+)", out)
    if match is None:
        raise DsactlError(f"cannot read the CUDA release from `nvcc --version`:\n{out}")
    return int(match.group(1)), int(match.group(2))


@lru_cache(maxsize=None)
def supported_arches() -> tuple[Arch, ...]:
    """The arches of the table that the installed nvcc can compile for."""
    listed = set(_nvcc("--list-gpu-arch").split())
    family_ok = nvcc_version() >= FAMILY_MIN_NVCC
    return tuple(
        a for a in ARCHES if f"compute_{a.number}" in listed and (family_ok or not a.is_family)
    )


def resolve(spec: str) -> list[Arch]:
    """`--arch` value -> the arches to build; a clear error for anything nvcc cannot do."""
    supported = supported_arches()
    names = ", ".join(a.name for a in supported)
    if spec == ALL:
        return list(supported)
    known = {a.name: a for a in ARCHES}
    if spec not in known:
        raise DsactlError(f"unknown arch {spec!r}: choose one of {names}, or {ALL}")
    if known[spec] not in supported:
        major, minor = nvcc_version()
        raise DsactlError(f"nvcc {major}.{minor} cannot target {spec}: it supports {names}")
    return [known[spec]]


def _nvcc(*args: str) -> str:
    result = subprocess.run([str(nvcc_path()), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise DsactlError(f"`nvcc {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout
