"""The one loader of the kernels' CUDA libraries: the build `dsactl build` made, or, where there is
none to make (a packed bundle), a build of the sources beside this file, made here on first use.

Sources: every kernels/<stage>/<name>.cu whose name does not start with "_" builds lib<name>.so;
the headers of its folder and those of kernels/ itself (PTX wrappers the stages share) are its
dependencies. Their hash (fingerprint) tells a build is stale.

Where lib<name>.so comes from depends on where these sources live:
- in a source checkout (pyproject.toml beside kernels/: <repo>/build), installed as the package
  dsactl.kernels (~/.cache/dsactl/build), or wherever $DSACTL_BUILD_DIR says: the prebuilt
  <root>/<arch>/lib<name>.so that `dsactl build` listed in <root>/<arch>/manifest.json with the
  fingerprint of the current sources. It is never built here: a missing or stale build is a
  KernelBuildError naming the `dsactl build --arch <arch>` command that makes it, so a tool that
  times or profiles the kernels never times a build it did not ask for.
- anywhere else (a bundle, a plain copy of kernels/): built with nvcc on first use and cached under
  $DSACTL_JIT_CACHE (default ~/.cache/dsactl/jit)/<arch>/<name>-<hash>/, the hash covering the
  sources and the nvcc flags; a build is written under a temporary name and renamed, so a
  concurrent process never loads half a library.
Both build with the same nvcc flags (nvcc_flags); `dsactl build` adds only ptxas's report.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import KernelBuildError

# The arch-specific build each GPU loads ("a": that exact GPU's features, wgmma and setmaxnreg on sm_90a).
ARCH_FOR_CAPABILITY = {(9, 0): "sm90a", (10, 0): "sm100a", (10, 3): "sm103a", (12, 0): "sm120a"}
# Code generation shared by `dsactl build` and the build on first use.
NVCC_FLAGS = ("-O3", "-lineinfo", "--shared", "-Xcompiler", "-fPIC")
HEADER_SUFFIXES = (".cuh", ".h")
PRIVATE_PREFIX = "_"

BUILD_DIR_ENV = "DSACTL_BUILD_DIR"
INSTALLED_BUILD_DIR = Path.home() / ".cache" / "dsactl" / "build"
MANIFEST_FILE = "manifest.json"
JIT_CACHE_ENV = "DSACTL_JIT_CACHE"
DEFAULT_JIT_CACHE = Path.home() / ".cache" / "dsactl" / "jit"
# 64 bits of sha256 name a build on one machine: collisions among its builds are not a concern.
JIT_HASH_CHARS = 16
# nvcc's error output can be long; its end names the failing line.
NVCC_ERROR_CHARS = 4000

_loaded: dict[tuple[str, str], ctypes.CDLL] = {}


@dataclass(frozen=True)
class CudaSource:
    name: str
    path: Path

    @property
    def library_file(self) -> str:
        return f"lib{self.name}.so"

    @property
    def headers(self) -> list[Path]:
        """Its folder's headers, then those of kernels/ (shared by every stage)."""
        return [*_headers(self.path.parent), *_headers(self.path.parent.parent)]

    def fingerprint(self) -> str:
        """Hash of the .cu and its headers: what a built library was made from."""
        digest = hashlib.sha256()
        for path in [self.path, *self.headers]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()


def _headers(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in HEADER_SUFFIXES)


def kernels_root() -> Path:
    """The kernels/ folder holding the sources (not resolved: dsactl/kernels stays dsactl/kernels)."""
    return Path(__file__).parent


def discover() -> list[CudaSource]:
    """Every buildable kernels/<stage>/<name>.cu."""
    found = [CudaSource(p.stem, p) for p in sorted(kernels_root().glob("*/*.cu"))
             if not p.name.startswith(PRIVATE_PREFIX)]
    by_name: dict[str, Path] = {}
    for source in found:
        if source.name in by_name:
            raise KernelBuildError(f"two CUDA sources would both build lib{source.name}.so: "
                                   f"{by_name[source.name]} and {source.path}")
        by_name[source.name] = source.path
    return found


def find(name: str) -> CudaSource:
    sources = discover()
    for source in sources:
        if source.name == name:
            return source
    known = ", ".join(s.name for s in sources) or "none"
    raise KernelBuildError(f"no CUDA source kernels/<stage>/{name}.cu (CUDA libraries here: {known})")


def gencode(arch: str) -> str:
    """nvcc's -gencode value of an arch name: sm90a -> arch=compute_90a,code=sm_90a."""
    target = arch.removeprefix("sm")
    return f"arch=compute_{target},code=sm_{target}"


def find_nvcc() -> Path:
    found = shutil.which("nvcc")
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if found is None and home and (Path(home) / "bin" / "nvcc").is_file():
            found = str(Path(home) / "bin" / "nvcc")
    if found is None:
        raise KernelBuildError("nvcc not found on PATH or in $CUDA_HOME/bin: install the CUDA toolkit (13.0)")
    return Path(found)


def nvcc_flags(arch: str) -> tuple[str, ...]:
    return ("-gencode", gencode(arch), *NVCC_FLAGS)


def build_root() -> Path | None:
    """Where `dsactl build` puts the libraries of these sources (module docstring), or None where
    nothing does (a bundle), and the sources are built on first use."""
    override = os.environ.get(BUILD_DIR_ENV)
    if override:
        return Path(override)
    folder = Path(__file__).resolve().parent.parent
    if (folder / "pyproject.toml").is_file():
        return folder / "build"
    if folder.name == "dsactl" and (folder / "__init__.py").is_file():
        return INSTALLED_BUILD_DIR
    return None


def arch_dir(arch: str) -> Path:
    root = build_root()
    if root is None:
        raise KernelBuildError(f"{kernels_root()} is not in a dsactl checkout or installation: "
                               f"its libraries build on first use, set ${BUILD_DIR_ENV} to use prebuilt ones")
    return root / arch


def build_command(arch: str) -> str:
    return f"dsactl build --arch {arch}"


def read_manifest(folder: Path) -> dict[str, str]:
    """library name -> source fingerprint of the build in folder; empty when nothing was built there."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text())["libraries"]


def current_arch() -> str:
    """The build this process's GPU loads, from torch's device capability."""
    import torch

    if not torch.cuda.is_available():
        raise KernelBuildError("no CUDA GPU visible: the CUDA kernels need one")
    capability = torch.cuda.get_device_capability()
    if capability not in ARCH_FOR_CAPABILITY:
        supported = ", ".join(f"{c[0]}.{c[1]} ({a})" for c, a in ARCH_FOR_CAPABILITY.items())
        raise KernelBuildError(f"{torch.cuda.get_device_name()} has compute capability "
                               f"{capability[0]}.{capability[1]}; the CUDA kernels build for {supported}")
    return ARCH_FOR_CAPABILITY[capability]


def prebuilt_path(name: str, arch: str) -> Path:
    """lib<name>.so that `dsactl build` made for arch, checked present and built from the current sources."""
    source = find(name)
    folder = arch_dir(arch)
    built = read_manifest(folder)
    path = folder / source.library_file
    if name not in built or not path.is_file():
        raise KernelBuildError(f"no build of {name} for {arch}: run `{build_command(arch)}`")
    if built[name] != source.fingerprint():
        raise KernelBuildError(f"the {arch} build of {name} is stale ({source.path.name} or its headers changed "
                               f"since): run `{build_command(arch)}`")
    return path


def jit_cache_root() -> Path:
    return Path(os.environ.get(JIT_CACHE_ENV) or DEFAULT_JIT_CACHE)


def jit_path(name: str, arch: str) -> Path:
    """lib<name>.so for arch built from the sources here: from the cache, or built now."""
    if arch not in ARCH_FOR_CAPABILITY.values():
        raise KernelBuildError(f"unknown arch {arch!r}: choose one of {', '.join(ARCH_FOR_CAPABILITY.values())}")
    source = find(name)
    flags = nvcc_flags(arch)
    key = hashlib.sha256((" ".join(flags) + "\0" + source.fingerprint()).encode()).hexdigest()[:JIT_HASH_CHARS]
    out_dir = jit_cache_root() / arch / f"{name}-{key}"
    library = out_dir / source.library_file
    if library.is_file():
        return library
    try:
        nvcc = find_nvcc()
    except KernelBuildError as e:
        raise KernelBuildError(f"the CUDA library {name} is built with nvcc on first use here: {e}") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = out_dir / f".{source.library_file}.{os.getpid()}"
    result = subprocess.run([str(nvcc), *flags, str(source.path), "-o", str(partial)], capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise KernelBuildError(f"nvcc could not build {name} for {arch}:\n{result.stderr[-NVCC_ERROR_CHARS:]}")
    os.replace(partial, library)
    return library


def library_path(name: str, arch: str) -> Path:
    return jit_path(name, arch) if build_root() is None else prebuilt_path(name, arch)


def load_library(name: str, arch: str | None = None) -> ctypes.CDLL:
    """lib<name>.so for arch (default: this process's GPU's), loaded once per process."""
    arch = current_arch() if arch is None else arch
    key = (name, arch)
    if key not in _loaded:
        _loaded[key] = ctypes.CDLL(str(library_path(name, arch)))
    return _loaded[key]
