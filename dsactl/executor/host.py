"""Every GPU of this host: one worker process per GPU, its CUDA_VISIBLE_DEVICES pinned to that GPU.

Each worker is a single-process pool (concurrent.futures, spawn: never fork a process that may hold a
CUDA context), so a worker keeps its imports and compiled kernels from one job to the next, and a dead
worker breaks only its own pool: the job it ran goes to another worker and the GPU gets a fresh one.
The workers start when the executor is made, each importing torch and opening its GPU while the command
still selects its workloads, so that start-up is not paid again after it; closing ends them at once (_Worker.stop),
so that their teardown is not paid after the last result either.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from dsactl.errors import DsactlError
from dsactl.executor import Done, Placement
from dsactl.executor.dispatch import WorkerLost, dispatch
from dsactl.executor.placement import capability, cpu_share, host_cpus, warm_up

RETRIES = 1  # workers a job may cost before it is reported as failed (a kernel that kills its process)
RESTARTS = 2  # fresh workers a GPU gets after losing one; then its jobs go to the other GPUs


def host_gpus(ids: list[str] | None) -> list[str]:
    """The GPU indices to run on (as torch numbers them here), checked against the driver's count.
    Without a GPU the indices name CPU worker processes, which run Triton under the interpreter."""
    from dsactl.device import driver_gpu_count

    count = driver_gpu_count()
    if ids is None:
        if count == 0:
            raise DsactlError("--gpus all: the driver reports no CUDA GPU on this host")
        return [str(i) for i in range(count)]
    outside = [i for i in ids if count and int(i) >= count]
    if outside:
        raise DsactlError(f"--gpus {','.join(ids)}: this host has {count} GPUs (0-{count - 1}), "
                          f"no GPU {', '.join(outside)}")
    return ids


def _pin(visible: str, threads: int) -> None:
    # Runs first in the worker, before torch can initialize CUDA.
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    from dsactl.executor.placement import use_interpreter_without_gpu, use_threads

    use_interpreter_without_gpu()
    use_threads(threads)


def _run(fn: Callable[[Any], Any], job: Any) -> tuple[Any, Placement]:
    from dsactl.executor.placement import here

    return fn(job), here()


def _visible(gpu: str) -> str:
    """The CUDA_VISIBLE_DEVICES entry of GPU index `gpu` as this process numbers it."""
    outer = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not outer:
        return gpu
    entries = [e.strip() for e in outer.split(",")]
    return entries[int(gpu)] if int(gpu) < len(entries) else gpu


@dataclass
class _Worker:
    gpu: str
    pool: ProcessPoolExecutor
    warm: Future  # its process id once warmed up
    restarts: int = 0

    def stop(self) -> None:
        """Cancel what is queued and end the process at once: a closing worker holds no result, and its
        interpreter's teardown (torch, its CUDA context) would stand between the last result and the
        command's end."""
        if self.warm.done() and self.warm.exception() is None:
            try:
                os.kill(self.warm.result(), signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class _HostWorkers:
    gpus: list[str]
    restarts: int
    live: list[_Worker] = field(default_factory=list)
    started: bool = False

    def _spawn(self, gpu: str, restarts: int = 0) -> _Worker:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_pin,
                                   initargs=(_visible(gpu), cpu_share(host_cpus(), len(self.gpus))))
        warm = pool.submit(warm_up)  # starts the process now; one that dies warming up is lost by its first job
        worker = _Worker(gpu, pool, warm, restarts)
        self.live.append(worker)
        return worker

    def start(self) -> list[_Worker]:
        # Started once and kept for the next map(): a worker keeps its imports and compiled kernels.
        if not self.started:
            self.started = True
            for gpu in self.gpus:
                self._spawn(gpu)
        return list(self.live)

    def submit(self, worker: _Worker, fn: Callable[[Any], Any], job: Any) -> Future:
        return worker.pool.submit(_run, fn, job)

    def wait(self, running: list[Future]) -> list[Future]:
        return list(wait(running, return_when=FIRST_COMPLETED).done)

    def collect(self, worker: _Worker, future: Future) -> tuple[Any, Placement]:
        try:
            return future.result()
        except BrokenProcessPool:
            raise WorkerLost(f"the worker process of GPU {worker.gpu} died while running it") from None

    def replace(self, worker: _Worker) -> _Worker | None:
        worker.pool.shutdown(wait=False, cancel_futures=True)
        self.live.remove(worker)
        if worker.restarts >= self.restarts:
            return None
        return self._spawn(worker.gpu, worker.restarts + 1)

    def close(self) -> None:
        for worker in self.live:
            worker.stop()
        self.live.clear()


class HostExecutor:
    local = False

    def __init__(self, gpus: Sequence[str], retries: int = RETRIES, restarts: int = RESTARTS):
        if not gpus:
            raise DsactlError("no GPU to run on")
        self.gpus = list(gpus)
        self.retries = retries
        self._workers = _HostWorkers(self.gpus, restarts)
        self._workers.start()

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any],
            started: Callable[[int], None] | None = None) -> Iterator[Done]:
        return dispatch(self._workers, fn, jobs, self.retries, started)

    def capabilities(self) -> list[tuple[int, int] | None]:
        found = []
        for worker in self._workers.start():
            try:  # asked of the worker (queued behind its warm-up): its torch may see no GPU where the driver does
                found.append(worker.pool.submit(capability).result())
            except BrokenProcessPool:  # it died warming up: its job will find out, and its GPU get a fresh one
                continue
        return found

    def describe(self) -> str:
        return f"{len(self.gpus)} worker processes, one per GPU ({','.join(self.gpus)})"

    def close(self) -> None:
        self._workers.close()
