"""Which device this process runs its jobs on, asked once per worker process."""

from __future__ import annotations

import functools
import os
import socket

from dsactl.executor import Placement


@functools.lru_cache(maxsize=None)
def here() -> Placement:
    """The first GPU this process sees (a worker sees one: its CUDA_VISIBLE_DEVICES is pinned), else the CPU."""
    from dsactl.device import has_cuda_gpu

    host = socket.gethostname()
    if not has_cuda_gpu():
        return Placement("cpu", "", host)
    import torch

    props = torch.cuda.get_device_properties(0)
    uuid = getattr(props, "uuid", None)
    return Placement(props.name, f"GPU-{uuid}" if uuid is not None else "", host)


def capability() -> tuple[int, int] | None:
    """The compute capability of the first GPU this process sees, None without one."""
    from dsactl.device import has_cuda_gpu

    if not has_cuda_gpu():
        return None
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return major, minor


def use_interpreter_without_gpu() -> None:
    """Triton kernels run under the CPU interpreter when this process has no GPU; the flag must be set
    before the first kernel is decorated, so a worker sets it before it imports any solution."""
    from dsactl.device import has_cuda_gpu

    if not has_cuda_gpu():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def cpu_share(cpus: float, workers: int) -> int:
    """A worker's torch threads: its host's CPUs split evenly among the host's workers, at least one."""
    return max(1, int(cpus) // max(1, workers))


def host_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def use_threads(threads: int) -> None:
    """Run this worker's torch CPU work on `threads` threads. verify's rules compare outputs with the references
    on the CPU, which torch spreads over its threads: a worker left one thread (as Ray leaves an actor that
    reserves no CPU, through OMP_NUM_THREADS) runs a verify sweep far slower than the plain run
    (docs/design.md, "Measured choices"), and workers that each take every CPU of a many-GPU host would
    oversubscribe it."""
    import torch

    torch.set_num_threads(threads)


def warm_up() -> int:
    """A worker's start: the imports (torch, the harness that makes every job's inputs and calls) and the CUDA
    context every job needs, paid while the command still selects its workloads. Returns the process id."""
    import importlib

    import torch

    importlib.import_module("dsactl.harness")
    if torch.cuda.is_available():
        torch.cuda.init()
    return os.getpid()
