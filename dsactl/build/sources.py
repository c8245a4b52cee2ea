"""Which CUDA sources `dsactl build` compiles, and the fingerprint that tells a build is stale.

Convention: every kernels/<stage>/<name>.cu whose name does not start with "_"
builds to lib<name>.so; the headers in the same folder are its dependencies.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from dsactl.errors import DsactlError

HEADER_SUFFIXES = (".cuh", ".h")
PRIVATE_PREFIX = "_"


@dataclass(frozen=True)
class CudaSource:
    name: str
    path: Path

    @property
    def library_file(self) -> str:
        return f"lib{self.name}.so"

    @property
    def headers(self) -> list[Path]:
        return sorted(p for p in self.path.parent.iterdir() if p.suffix in HEADER_SUFFIXES)

    def fingerprint(self) -> str:
        """Hash of the .cu and its folder's headers: what the built library was made from."""
        digest = hashlib.sha256()
        for path in [self.path, *self.headers]:
            digest.update(path.name.encode() + b"\0")
            digest.update(path.read_bytes())
            digest.update(b"\0")
        return digest.hexdigest()


def kernels_dir() -> Path:
    from dsactl import kernels

    return Path(kernels.__file__).parent


def discover_cuda() -> list[CudaSource]:
    """Every buildable .cu under the kernels folder's <stage>/ folders."""
    found = [
        CudaSource(path.stem, path)
        for path in sorted(kernels_dir().glob("*/*.cu"))
        if not path.name.startswith(PRIVATE_PREFIX)
    ]
    by_name: dict[str, Path] = {}
    for source in found:
        if source.name in by_name:
            raise DsactlError(
                f"two CUDA sources would both build lib{source.name}.so: {by_name[source.name]} and {source.path}"
            )
        by_name[source.name] = source.path
    return found


def find_cuda(name: str) -> CudaSource:
    sources = discover_cuda()
    for source in sources:
        if source.name == name:
            return source
    known = ", ".join(s.name for s in sources) or "none"
    raise DsactlError(f"no CUDA source kernels/<stage>/{name}.cu (CUDA libraries: {known})")
