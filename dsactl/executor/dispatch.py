"""The loop the host and Ray executors share: keep every worker busy with one job, collect what finishes.

One job in flight per worker means a worker's death is charged to exactly the job it was running: that
job goes back to the front of the queue for the next free worker (another GPU's, or the dead one's
replacement) until it has cost `retries` workers, then comes back as failed with the reason. Every job
is yielded exactly once.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Callable, Generic, Iterator, Protocol, Sequence, TypeVar

from dsactl.executor import Done, Placement

W = TypeVar("W")  # a worker handle
F = TypeVar("F")  # a job in flight


class WorkerLost(Exception):
    """The worker died while it ran the job; the message says which worker and how."""


class Workers(Protocol, Generic[W, F]):
    def start(self) -> list[W]:
        ...

    def submit(self, worker: W, fn: Callable[[Any], Any], job: Any) -> F:
        ...

    def wait(self, running: list[F]) -> list[F]:
        """Block until at least one is finished; return the finished ones."""
        ...

    def collect(self, worker: W, future: F) -> tuple[Any, Placement]:
        """The job's result and where it ran; WorkerLost when its worker died, any other exception
        when the job itself raised."""
        ...

    def replace(self, worker: W) -> W | None:
        """After worker died: a worker for the same GPU, or None when that GPU is given up."""
        ...


def dispatch(workers: Workers, fn: Callable[[Any], Any], jobs: Sequence[Any], retries: int,
             started: Callable[[int], None] | None = None) -> Iterator[Done]:
    queue = deque(range(len(jobs)))
    losses: Counter[int] = Counter()
    idle = list(workers.start())
    running: dict[Any, tuple[int, Any]] = {}
    last_loss = ""
    while queue or running:
        while idle and queue:
            worker, index = idle.pop(0), queue.popleft()
            if started:
                started(index)
            running[workers.submit(worker, fn, jobs[index])] = (index, worker)
        if not running:
            for index in queue:
                yield Done(index, None, None, f"not run: every worker was lost (last: {last_loss})")
            return
        for future in workers.wait(list(running)):
            index, worker = running.pop(future)
            try:
                result, placement = workers.collect(worker, future)
            except WorkerLost as e:
                last_loss = str(e)
                losses[index] += 1
                if losses[index] > retries:
                    times = "" if losses[index] == 1 else f" ({losses[index]} workers lost on it)"
                    yield Done(index, None, None, f"{e}{times}")
                else:
                    queue.appendleft(index)
                replacement = workers.replace(worker)
                if replacement is not None:
                    idle.append(replacement)
                continue
            except Exception as e:  # the job function itself raised: its failure, reported once, not retried
                idle.append(worker)
                yield Done(index, None, None, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
                continue
            idle.append(worker)
            yield Done(index, result, placement)
