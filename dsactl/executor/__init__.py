"""Where a sweep runs: this process, one worker process per GPU of this host, or a Ray cluster.

verify and bench hand their work to an executor as a list of jobs (plain data, one per workload) and a
module-level function; the executor runs `fn(job)` somewhere and yields a `Done` per job as it
finishes, stamped with the GPU that ran it. Every job comes back exactly once: with its result, or,
when the worker running it died and the retries ran out, with the reason instead. A worker runs one job
at a time, so no two jobs ever share a GPU at the same moment (what makes a benchmark trustworthy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from dsactl.errors import DsactlError


@dataclass(frozen=True)
class Placement:
    """The device that ran a job: GPU name ("cpu" under the Triton interpreter), UUID, host."""

    gpu: str
    uuid: str = ""
    host: str = ""


@dataclass
class Done:
    index: int  # the job's position in the list handed to map()
    result: Any  # fn(job); None when error is set
    placement: Placement | None  # None when no worker finished it
    error: str | None = None  # why the job has no result: its worker died and the retries ran out


class Executor(Protocol):
    local: bool  # runs in this process (the caller's device settings apply as they are)

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any],
            started: Callable[[int], None] | None = None) -> Iterator[Done]:
        """Run fn on every job; started(index) when a job is handed to a worker; Done in completion order."""
        ...

    def capabilities(self) -> list[tuple[int, int] | None]:
        """Each live worker's GPU compute capability, None for a worker on the CPU (Triton under the
        interpreter): what the workers run on, which need not be what this process has."""
        ...

    def describe(self) -> str:
        ...

    def close(self) -> None:
        ...


def on_gpus(executor: Executor) -> bool:
    """Whether every worker runs on a GPU: a sweep is sized for the GPU only then (a CPU worker runs
    Triton under the interpreter, where full-size workloads take hours)."""
    found = executor.capabilities()
    return bool(found) and all(c is not None for c in found)


def parse_gpus(text: str) -> list[str] | None:
    """--gpus: "all" -> None (every GPU the driver reports), "0,1" -> ["0", "1"]."""
    if text.strip() == "all":
        return None
    ids = [part.strip() for part in text.split(",")]
    if not ids or not all(i.isdigit() for i in ids):
        raise DsactlError(f"--gpus takes all or GPU indices like 0,1; got {text!r}")
    if len(set(ids)) != len(ids):
        raise DsactlError(f"--gpus names a GPU twice: {text!r} (one worker per GPU)")
    return ids


def choose(gpus: str | None = None, ray: str | None = None) -> Executor:
    """The executor the --gpus / --ray options ask for; neither: this process."""
    if gpus is not None and ray is not None:
        raise DsactlError("--gpus and --ray exclude each other: Ray places its actors on the cluster's GPUs itself")
    if ray is not None:
        from dsactl.executor.ray_cluster import RayExecutor

        return RayExecutor(ray)
    if gpus is not None:
        from dsactl.executor.host import HostExecutor, host_gpus

        return HostExecutor(host_gpus(parse_gpus(gpus)))
    from dsactl.executor.local import LocalExecutor

    return LocalExecutor()
