"""The GPU's measured peaks (copy bandwidth, bf16 and FP8 matmul rates) and the timing self-check.

Peaks are measured once per GPU and cached in ~/.cache/dsactl/peaks.json, keyed
by GPU name. They are timed with CUDA events over many back-to-back calls, so
launch overhead is amortized and the measurement does not depend on the
kernel-time methods it is then used to check: the self-check times one copy
kernel of a known size with bench's own method and expects bytes / bandwidth.

The self-check copies with an SM kernel (an elementwise negation), not with
cudaMemcpy: once torch.profiler has run in a process, device-to-device memcpy
can run slower for the rest of it (docs/design.md, "Measured choices"), while
kernels do not slow down. The memcpy rate stays the bandwidth roof (copy_gbps);
the kernel's own rate (kernel_copy_gbps) is what the self-check expects.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dsactl.bench.timing import L2Flusher, measure

CACHE = Path.home() / ".cache" / "dsactl" / "peaks.json"
COPY_BYTES = 2**30  # far beyond L2, long enough that launch gaps vanish
COPY_MEMORY_FRACTION = 8  # use at most 1/8 of free memory per buffer
COPY_REPS = 20
MATMUL_N = 8192  # square bf16 and FP8 matmuls of 2 N^3 FLOPs: compute-bound on any tensor-core GPU
MATMUL_REPS = 20
ROUNDS = 3  # best of: the peak is what the hardware can do, not the average
SELF_CHECK_BYTES = 256 * 2**20  # large enough to run at full bandwidth, small enough to be quick
SELF_CHECK_TOLERANCE = 0.10
SELF_CHECK_ITERS = 10


@dataclass
class Peaks:
    gpu: str
    copy_gbps: float  # cudaMemcpy device to device: bytes read + bytes written per second, 1e9
    bf16_tflops: float
    measured_at: str
    torch: str
    kernel_copy_gbps: float | None = None  # the self-check's copy kernel, same units; None: not yet measured
    fp8_tflops: float | None = None  # e4m3 matmul (torch._scaled_mm), 1e12 FLOP/s; None: no FP8 tensor cores


@dataclass
class SelfCheck:
    method: str
    nbytes: int
    measured_us: float
    expected_us: float

    @property
    def deviation(self) -> float:
        return self.measured_us / self.expected_us - 1.0

    @property
    def ok(self) -> bool:
        return abs(self.deviation) <= SELF_CHECK_TOLERANCE

    def describe(self) -> str:
        verdict = "ok" if self.ok else f"OFF by {self.deviation:+.0%}: latencies from {self.method} are suspect"
        return (f"timing self-check ({self.method}): copy kernel over {self.nbytes / 2**20:.0f} MiB took "
                f"{self.measured_us:.1f} us, expected {self.expected_us:.1f} us from the measured bandwidth: {verdict}")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "deviation": self.deviation, "ok": self.ok}


def _events_time_us(fn, reps: int) -> float:
    """Mean time of back-to-back calls, best of ROUNDS."""
    import torch

    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(ROUNDS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / reps)
    return best


def copy_bytes_moved(nbytes: int) -> int:
    """A copy of N bytes reads N and writes N."""
    return 2 * nbytes


def _copy_gbps(nbytes: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return copy_bytes_moved(nbytes) / _events_time_us(lambda: dst.copy_(src), COPY_REPS) / 1e3


def copy_kernel(nbytes: int):
    """An SM kernel that reads nbytes and writes nbytes (fp32 negation; the values do not matter)."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    return lambda: torch.neg(src, out=dst)


def _kernel_copy_gbps(nbytes: int) -> float:
    return copy_bytes_moved(nbytes) / _events_time_us(copy_kernel(nbytes), COPY_REPS) / 1e3


def _bf16_tflops(n: int) -> float:
    import torch

    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    c = torch.empty_like(a)
    return 2 * n**3 / _events_time_us(lambda: torch.mm(a, b, out=c), MATMUL_REPS) / 1e6


FP8_CAPABILITY = (8, 9)  # the first GPUs with e4m3 tensor cores (Ada, then Hopper)


def _fp8_tflops(n: int) -> float | None:
    """The e4m3 tensor-core rate as cuBLASLt reaches it: fast accumulation (the tensor pipe alone), unit scales,
    bf16 out; None on a GPU without FP8 tensor cores."""
    import torch

    if tuple(torch.cuda.get_device_capability()) < FP8_CAPABILITY:
        return None

    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    c = torch.empty(n, n, dtype=torch.bfloat16, device="cuda")
    return 2 * n**3 / _events_time_us(
        lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True, out=c),
        MATMUL_REPS) / 1e6


def measure_peaks() -> Peaks:
    import torch

    free, _ = torch.cuda.mem_get_info()
    nbytes = min(COPY_BYTES, free // COPY_MEMORY_FRACTION)
    return Peaks(gpu=torch.cuda.get_device_name(), copy_gbps=_copy_gbps(nbytes),
                 bf16_tflops=_bf16_tflops(MATMUL_N), measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
                 torch=torch.__version__, kernel_copy_gbps=_kernel_copy_gbps(nbytes), fp8_tflops=_fp8_tflops(MATMUL_N))


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def load_or_measure(path: Path = CACHE, refresh: bool = False) -> Peaks:
    """This GPU's peaks from the cache, measured and stored on first use."""
    import torch

    name = torch.cuda.get_device_name()
    cached = _read_cache(path)
    if not refresh and name in cached:
        try:
            peaks = Peaks(**cached[name])
            if peaks.kernel_copy_gbps is not None and "fp8_tflops" in cached[name]:  # else cached before it existed
                return peaks
        except TypeError:  # written by another dsactl version: measure again
            pass
    peaks = measure_peaks()
    cached[name] = asdict(peaks)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole and renamed: the worker processes of several GPUs may measure at the same time.
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(cached, indent=2) + "\n")
    os.replace(partial, path)
    return peaks


def copy_self_check(method: str, peaks: Peaks, flusher: L2Flusher, nbytes: int = SELF_CHECK_BYTES) -> SelfCheck:
    """Time one copy kernel of nbytes the way bench times kernels; compare with bytes / its bandwidth."""
    import statistics

    if peaks.kernel_copy_gbps is None:
        raise ValueError("peaks without kernel_copy_gbps: load them with load_or_measure()")
    used, samples = measure(copy_kernel(nbytes), method, SELF_CHECK_ITERS, warmup=2, flusher=flusher)
    expected_us = copy_bytes_moved(nbytes) / (peaks.kernel_copy_gbps * 1e3)
    return SelfCheck(used, nbytes, statistics.median(samples), expected_us)
