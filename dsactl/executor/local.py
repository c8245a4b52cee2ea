"""The executor of a plain run: every job in this process, one after another, in order."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

from dsactl.executor import Done


class LocalExecutor:
    local = True

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any],
            started: Callable[[int], None] | None = None) -> Iterator[Done]:
        from dsactl.executor.placement import here

        for index, job in enumerate(jobs):
            if started:
                started(index)
            yield Done(index, fn(job), here())

    def capabilities(self) -> list[tuple[int, int] | None]:
        from dsactl.executor.placement import capability

        return [capability()]

    def describe(self) -> str:
        return "this process"

    def close(self) -> None:
        pass
