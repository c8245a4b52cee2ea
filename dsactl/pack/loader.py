"""load_bundle: a Solution JSON as a dsactl Solution, for `dsactl verify --bundle`.

The bundle is checked, unpacked into a temporary folder (removed at exit) as the package
dsactl_bundle_<hash of the JSON>, and its entry imported from there: the bundle's own
files run, not the installed dsactl's. CUDA parts build on first call with the bundle's own
kernels/cuda_library.py, so availability asks for nvcc rather than for a `dsactl build`.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dsactl.pack.bundle import read_bundle
from dsactl.pack.check import check_bundle
from dsactl.pack.unpack import unpack
from dsactl.solutions import Solution

PACKAGE_PREFIX = "dsactl_bundle_"
HASH_CHARS = 16  # 64 bits of sha256 tell bundles loaded by one process apart

_unpacked: dict[str, Path] = {}  # package -> the folder on sys.path that holds it


@dataclass(frozen=True)
class BundleSolution(Solution):
    builds: tuple[str, ...] = ()  # the CUDA libraries it builds from its own sources with nvcc on first use

    def availability(self) -> tuple[bool, str]:
        ok, why = super().availability()
        if not self.builds:
            return ok, why
        libraries = f"CUDA librar{'ies' if len(self.builds) > 1 else 'y'} {', '.join(self.builds)}"
        if not ok:
            return False, f"{why} (it builds {libraries} on first use; the Triton interpreter runs no CUDA)"
        from dsactl.kernels.cuda_library import find_nvcc
        from dsactl.kernels.errors import KernelBuildError

        try:
            find_nvcc()
        except KernelBuildError as e:
            return False, f"builds {libraries} on first use: {e}"
        return ok, why


def load_bundle(path: str | Path) -> BundleSolution:
    data = read_bundle(path)
    report = check_bundle(data)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()[:HASH_CHARS]
    package = PACKAGE_PREFIX + digest
    if package not in _unpacked:  # the same bundle loaded again imports from its first folder
        root = Path(tempfile.mkdtemp(prefix="dsactl-bundle-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        unpack(data, root / package)
        sys.path.insert(0, str(root))
        _unpacked[package] = root
    entry_file, _, func = data["spec"]["entry_point"].partition("::")
    module = ".".join([package, *entry_file.removesuffix(".py").removesuffix("/__init__").split("/")])
    return BundleSolution(
        name=data["name"],
        definitions=(data["definition"],),
        language="cuda" if any(f.kind == "cuda" for f in report.files) else data["spec"]["language"],
        entry=f"{module}:{func}",
        description=data.get("description") or f"bundle {Path(path).name}",
        needs_gpu="cpu" not in data["spec"]["target_hardware"],
        builds=report.cuda_libs,
    )
