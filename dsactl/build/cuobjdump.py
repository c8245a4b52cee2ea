"""`cuobjdump --dump-resource-usage` on a built .so or cubin: per-function REG/STACK/SHARED/LOCAL.

The CUDA toolkit may lack cuobjdump (the CI image's does); Triton's wheel ships one.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dsactl.errors import DsactlError

_FUNCTION = re.compile(r"^\s*Function (\S+):\s*$")
_FIELD = re.compile(r"([A-Z]+(?:\[\d+\])?):(\d+)")


@dataclass(frozen=True)
class BinaryResources:
    registers: int
    stack: int
    shared: int  # static shared memory as the binary declares it, including what the system reserves
    local: int


def cuobjdump_path() -> Path:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if bundled.is_file():
        return bundled
    found = shutil.which("cuobjdump")
    if found is None:
        raise DsactlError("cuobjdump not found in Triton's wheel nor on PATH")
    return Path(found)


def parse(text: str) -> dict[str, BinaryResources]:
    """Function name -> resources, from `cuobjdump --dump-resource-usage` output."""
    found: dict[str, BinaryResources] = {}
    name: str | None = None
    for line in text.splitlines():
        if match := _FUNCTION.match(line):
            name = match.group(1)
        elif name is not None:
            fields = dict((k, int(v)) for k, v in _FIELD.findall(line))
            found[name] = BinaryResources(fields["REG"], fields["STACK"], fields["SHARED"], fields["LOCAL"])
            name = None
    return found


def resource_usage(binary: Path) -> dict[str, BinaryResources]:
    result = subprocess.run(
        [str(cuobjdump_path()), "--dump-resource-usage", str(binary)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise DsactlError(f"cuobjdump failed on {binary}: {result.stderr.strip()}")
    return parse(result.stdout)
