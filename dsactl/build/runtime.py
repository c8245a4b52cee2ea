"""Run time: load the CUDA library built for the current GPU, or say exactly which build to run.

Never falls back: a missing or stale build is a DsactlError naming the
`dsactl build --arch ...` command that fixes it.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from dsactl.build import manifest
from dsactl.build.arch import ARCH_FOR_CAPABILITY
from dsactl.build.sources import find_cuda
from dsactl.errors import DsactlError

BUILD_DIR_ENV = "DSACTL_BUILD_DIR"
USER_CACHE = Path.home() / ".cache" / "dsactl" / "build"

_loaded: dict[tuple[str, str], ctypes.CDLL] = {}


def build_root() -> Path:
    """$DSACTL_BUILD_DIR, else <repo>/build in a source checkout, else ~/.cache/dsactl/build."""
    override = os.environ.get(BUILD_DIR_ENV)
    if override:
        return Path(override)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / "build"
    return USER_CACHE


def arch_dir(arch: str) -> Path:
    return build_root() / arch


def build_command(arch: str) -> str:
    return f"dsactl build --arch {arch}"


def current_arch() -> str:
    """The build this process's GPU loads, from torch's device capability."""
    import torch

    if not torch.cuda.is_available():
        raise DsactlError("no CUDA GPU visible: the CUDA kernels need one")
    capability = torch.cuda.get_device_capability()
    if capability not in ARCH_FOR_CAPABILITY:
        supported = ", ".join(f"{c[0]}.{c[1]} ({a})" for c, a in ARCH_FOR_CAPABILITY.items())
        raise DsactlError(
            f"{torch.cuda.get_device_name()} has compute capability {capability[0]}.{capability[1]}; "
            f"dsactl builds for {supported}"
        )
    return ARCH_FOR_CAPABILITY[capability]


def library_path(name: str, arch: str) -> Path:
    """The built lib<name>.so for arch, checked present and built from the current sources."""
    source = find_cuda(name)
    built = manifest.read(arch_dir(arch))
    path = arch_dir(arch) / source.library_file
    if name not in built or not path.is_file():
        raise DsactlError(f"no build of {name} for {arch}: run `{build_command(arch)}`")
    if built[name] != source.fingerprint():
        raise DsactlError(
            f"the {arch} build of {name} is stale ({source.path.name} or its headers changed since): "
            f"run `{build_command(arch)}`"
        )
    return path


def load_library(name: str, arch: str | None = None) -> ctypes.CDLL:
    """lib<name>.so built for arch (default: the current GPU's), loaded once per process."""
    arch = current_arch() if arch is None else arch
    key = (name, arch)
    if key not in _loaded:
        _loaded[key] = ctypes.CDLL(str(library_path(name, arch)))
    return _loaded[key]
