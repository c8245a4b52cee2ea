"""The runtime a bundle uses in place of dsactl.build.runtime: it builds each CUDA library
from the sources shipped in the bundle, with nvcc, on first use, for this process's GPU.

Sources: kernels/<stage>/<name>.cu beside this package (dsactl/kernels/ in a bundle), its
folder's headers as dependencies, the `dsactl build` convention. Builds are cached under
$DSACTL_JIT_CACHE (default ~/.cache/dsactl/jit)/<arch>/<name>-<hash>/lib<name>.so; the hash
covers the sources and the nvcc flags, so a changed source rebuilds, and a build is written
under a temporary name and renamed, so a concurrent process never loads half a library.
It offers what launchers use from dsactl.build.runtime: load_library and current_arch.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
from pathlib import Path

from dsactl.build.arch import ARCH_FOR_CAPABILITY, ARCHES, nvcc_path
from dsactl.errors import DsactlError

CACHE_ENV = "DSACTL_JIT_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "dsactl" / "jit"
# The code generation of `dsactl build` (dsactl/build/cuda.py), without its ptxas report.
NVCC_FLAGS = ("-O3", "-lineinfo", "--shared", "-Xcompiler", "-fPIC")
HEADER_SUFFIXES = (".cuh", ".h")
# 64 bits of sha256 name a build: collisions among one machine's builds are not a concern.
HASH_CHARS = 16
# nvcc's error output can be long; the end names the failing line.
NVCC_ERROR_CHARS = 4000

_loaded: dict[tuple[str, str], ctypes.CDLL] = {}


def kernels_root() -> Path:
    from dsactl import kernels

    return Path(next(iter(kernels.__path__)))


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def current_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise DsactlError("no CUDA GPU visible: the CUDA kernels need one")
    capability = torch.cuda.get_device_capability()
    if capability not in ARCH_FOR_CAPABILITY:
        raise DsactlError(f"{torch.cuda.get_device_name()} has compute capability {capability[0]}.{capability[1]}; "
                          f"this bundle builds for {', '.join(ARCH_FOR_CAPABILITY.values())}")
    return ARCH_FOR_CAPABILITY[capability]


def source_files(name: str) -> list[Path]:
    """<name>.cu, then its folder's headers."""
    found = sorted(kernels_root().glob(f"*/{name}.cu"))
    if len(found) != 1:
        what = "no" if not found else "more than one"
        raise DsactlError(f"this bundle has {what} CUDA source kernels/<stage>/{name}.cu for library {name}")
    headers = sorted(p for p in found[0].parent.iterdir() if p.suffix in HEADER_SUFFIXES)
    return [found[0], *headers]


def fingerprint(files: list[Path]) -> str:
    digest = hashlib.sha256(" ".join(NVCC_FLAGS).encode() + b"\0")
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:HASH_CHARS]


def build(name: str, arch: str) -> Path:
    """lib<name>.so for arch, from the cache or built now."""
    target = next((a for a in ARCHES if a.name == arch), None)
    if target is None:
        raise DsactlError(f"unknown arch {arch!r}: choose one of {', '.join(a.name for a in ARCHES)}")
    files = source_files(name)
    out_dir = cache_root() / arch / f"{name}-{fingerprint(files)}"
    library = out_dir / f"lib{name}.so"
    if library.is_file():
        return library
    try:
        nvcc = nvcc_path()
    except DsactlError as e:
        raise DsactlError(f"this bundle builds its CUDA library {name} with nvcc on first use: {e}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".lib{name}.so.{os.getpid()}"
    command = [str(nvcc), "-gencode", target.gencode, *NVCC_FLAGS, str(files[0]), "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise DsactlError(f"nvcc could not build {name} for {arch}:\n{result.stderr[-NVCC_ERROR_CHARS:]}")
    os.replace(partial, library)
    return library


def load_library(name: str, arch: str | None = None) -> ctypes.CDLL:
    """lib<name>.so built for arch (default: the current GPU's), loaded once per process."""
    arch = current_arch() if arch is None else arch
    key = (name, arch)
    if key not in _loaded:
        _loaded[key] = ctypes.CDLL(str(build(name, arch)))
    return _loaded[key]
