"""Facts about this machine's GPU and tools, gathered without assuming a GPU or a driver."""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GpuInfo:
    name: str
    capability: tuple[int, int]
    sm_count: int
    memory_gib: float
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    driver: str | None = None
    l2_mib: float | None = None


@dataclass
class ToolInfo:
    name: str
    version: str | None  # None when missing
    detail: str = ""


@dataclass
class MachineInfo:
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_problem: str | None = None  # why no GPU is visible
    tools: list[ToolInfo] = field(default_factory=list)
    nvcc_archs: list[str] = field(default_factory=list)


def gpu_slug(name: str) -> str:
    """Folder name for a GPU model under profiles/: 'NVIDIA H200' -> 'h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia").strip()).strip("-") or "gpu"


def profiles_dir(gpu_name: str) -> Path:
    """profiles/<gpu>/ of the source checkout when running from one, else under the working directory."""
    repo = Path(__file__).resolve().parents[1]
    root = repo if (repo / "pyproject.toml").is_file() else Path.cwd()
    return root / "profiles" / gpu_slug(gpu_name)


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _nvml_clocks(index: int) -> dict:
    """SM/memory clocks and driver from NVML; empty when there is no driver (nvmlInit raises)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: NVML simply has nothing to say
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
        }
    except Exception:
        return {}
    finally:
        pynvml.nvmlShutdown()


def driver_gpu_count() -> int:
    """CUDA devices the driver reports (libcuda through ctypes: milliseconds, no torch); 0 without a driver."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


@functools.lru_cache(maxsize=None)
def has_cuda_gpu() -> bool:
    """Whether torch can use a CUDA GPU here. The driver is asked first, so a machine without one (CI, a
    laptop) answers without importing torch."""
    if driver_gpu_count() == 0:
        return False
    import torch

    return torch.cuda.is_available()


def gpus() -> tuple[list[GpuInfo], str | None]:
    import torch

    if not torch.cuda.is_available():
        reason = "no CUDA GPU visible to torch"
        if torch.version.cuda is None:
            reason += f" (torch {torch.__version__} is a CPU build)"
        return [], reason
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(GpuInfo(name=p.name, capability=(p.major, p.minor), sm_count=p.multi_processor_count,
                           memory_gib=p.total_memory / 2**30,
                           l2_mib=getattr(p, "L2_cache_size", 0) / 2**20 or None, **_nvml_clocks(i)))
    return out, None


def _version(cmd: list[str], pattern: str) -> str | None:
    text = _run(cmd)
    if text is None:
        return None
    m = re.search(pattern, text)
    return m.group(1) if m else text.strip().splitlines()[-1] if text.strip() else "unknown"


def nvcc_archs() -> list[str]:
    text = _run(["nvcc", "--list-gpu-arch"]) or ""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("compute_")]


def tools() -> list[ToolInfo]:
    import torch
    import triton

    cuda = torch.version.cuda or "none (CPU build)"
    return [
        ToolInfo("torch", torch.__version__, f"CUDA {cuda}"),
        ToolInfo("triton", triton.__version__),
        ToolInfo("nvcc", _version(["nvcc", "--version"], r"release ([\d.]+)")),
        ToolInfo("ncu", _version(["ncu", "--version"], r"Version ([\d.]+)")),
        ToolInfo("compute-sanitizer", _version(["compute-sanitizer", "--version"], r"Version ([\d.]+)")),
        ToolInfo("ninja", _version(["ninja", "--version"], r"(\d+(?:\.\d+)*)")),
    ]


def machine() -> MachineInfo:
    found, problem = gpus()
    return MachineInfo(gpus=found, gpu_problem=problem, tools=tools(), nvcc_archs=nvcc_archs())
