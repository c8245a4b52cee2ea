"""Jobs for the executor tests, in a module that imports neither torch nor dsactl, so that a worker
process starts in a fraction of a second."""

from __future__ import annotations

import os
import time


def square(x: int) -> tuple[int, str, float, float]:
    """x * x, the worker's pinned GPU and when the job started and ended."""
    start = time.monotonic()
    time.sleep(0.05)
    return x * x, os.environ.get("CUDA_VISIBLE_DEVICES", ""), start, time.monotonic()


def die_once(marker: str, fn, job):
    """fn(job), except that the first call of the whole run (over every process) kills its worker."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return fn(job)
    os.close(fd)
    os._exit(3)


def always_die(job):
    os._exit(4)


def torch_threads(job):
    """The threads this worker's torch runs CPU work on (torch is imported here, not at the top)."""
    import torch

    return torch.get_num_threads()
