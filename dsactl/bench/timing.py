"""Kernel time of one call, from CUPTI activity records where possible.

CUDA events around a call count its launch overhead, a large share of a short
kernel's time (docs/design.md, "Timing method"), so bench sums the device time
of the kernels the call launched:

  cupti           cupti-python activity records: launch API records inside the
                  call's CPU bracket, joined by correlation id to the kernel,
                  memcpy and memset records they caused.
  torch-profiler  torch.profiler (also CUPTI): each call runs inside its own
                  record_function range, which ends after a synchronize; its
                  device time is the kernels, copies and memsets that started
                  inside the range. By time, not by the op that launched them:
                  on the H200 (torch 2.11) a Triton call's range, whose kernels
                  are launched through the driver API, showed no device time.
  cuda-graph      the call captured once as a CUDA graph, replays timed with
                  events (launch overhead of one graph launch remains); a call
                  that cannot be captured is timed with plain events and its
                  method is recorded as cuda-events.

measure_graph_span gives a graph-captured call's span instead: its first kernel's
start to its last one's end per replay (CUPTI), the gaps between kernels included.

The first available method in that order is used unless one is requested; the
method is stored with every result. Every iteration starts with a cold L2: a
buffer larger than L2 is written before the call, outside the timed kernels.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dsactl.errors import DsactlError

METHODS = ("cupti", "torch-profiler", "cuda-graph")
KERNEL_METHODS = ("cupti", "torch-profiler")  # the methods that sum a call's kernels' device time
EVENTS_FALLBACK = "cuda-events"  # what cuda-graph becomes for a call that cannot be captured

# Written before every timed call; several times L2 so that no line of the
# previous call survives (L2 replacement is not strict LRU).
FLUSH_L2_MULTIPLE = 4
FLUSH_MIN_BYTES = 256 * 2**20  # when the driver does not report the L2 size
MARK = "dsactl_bench_iter_"  # record_function label of one timed call
# torch.profiler's activity types of device work (its GPU-side copies of record_function ranges,
# "gpu_user_annotation", would count a call twice).
PROFILER_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
CUPTI_BUFFER_BYTES = 8 * 2**20


@dataclass
class Stats:
    """Latency statistics of one (contender, workload) over trials x iterations, in us."""

    median_us: float
    min_us: float
    max_us: float
    trial_medians_us: list[float] = field(default_factory=list)

    @property
    def spread_us(self) -> float:
        """Run-to-run spread: the range of the per-trial medians."""
        return max(self.trial_medians_us) - min(self.trial_medians_us) if self.trial_medians_us else 0.0


def summarize(trials: Sequence[Sequence[float]]) -> Stats:
    """Median, min and max over every iteration of every trial, plus each trial's median."""
    samples = [s for trial in trials for s in trial]
    if not samples:
        raise DsactlError("no timing samples to summarize")
    return Stats(statistics.median(samples), min(samples), max(samples), [statistics.median(t) for t in trials])


def _owners(brackets: Sequence[tuple[int, int]], launches: Sequence[tuple[int, int]]) -> dict[int, int]:
    """correlation id -> index of the bracket in which its launch API call began."""
    starts = [b[0] for b in brackets]
    owner: dict[int, int] = {}
    for cpu_start, corr in launches:
        i = bisect.bisect_right(starts, cpu_start) - 1
        if i >= 0 and cpu_start <= brackets[i][1]:
            owner[corr] = i
    return owner


def sum_by_bracket(brackets: Sequence[tuple[int, int]], launches: Sequence[tuple[int, int]],
                   activities: Sequence[tuple[int, int]]) -> list[int]:
    """Device time per bracket, in ns.

    brackets: (cpu_start, cpu_end) of each timed call, sorted, not overlapping.
    launches: (cpu_start, correlation_id) of every launch API record.
    activities: (correlation_id, duration) of every kernel/memcpy/memset record.
    A device activity counts for the bracket in which its launch API call began;
    work launched outside every bracket (the L2 flush) counts for none.
    """
    owner = _owners(brackets, launches)
    totals = [0] * len(brackets)
    for corr, duration in activities:
        i = owner.get(corr)
        if i is not None:
            totals[i] += duration
    return totals


def span_by_bracket(brackets: Sequence[tuple[int, int]], launches: Sequence[tuple[int, int]],
                    activities: Sequence[tuple[int, int, int]]) -> list[int]:
    """Per bracket, ns from the start of its first device activity to the end of its last (0 without any):
    its kernels' time plus the gaps between them. Activities are (correlation_id, start, end), owned as in
    sum_by_bracket (the kernels of a graph replay share the graph launch's correlation id)."""
    owner = _owners(brackets, launches)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for corr, start, end in activities:
        i = owner.get(corr)
        if i is not None:
            first[i] = min(first.get(i, start), start)
            last[i] = max(last.get(i, end), end)
    return [last[i] - first[i] if i in first else 0 for i in range(len(brackets))]


def sum_by_interval(intervals: Sequence[tuple[int, int]], activities: Sequence[tuple[int, int]]) -> list[int]:
    """Device time per interval, in ns.

    intervals: (start, end) of each timed call, sorted, not overlapping; each ends
    after a synchronize, so the call's device work both starts and ends inside it.
    activities: (start, duration) of every kernel/memcpy/memset, on the same clock.
    An activity counts for the interval its start falls in; work outside every
    interval (the L2 flush, written and synchronized before the call) for none.
    """
    starts = [i[0] for i in intervals]
    totals = [0] * len(intervals)
    for start, duration in activities:
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and start <= intervals[i][1]:
            totals[i] += duration
    return totals


def profiler_calls(events: Any, iters: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(intervals of the MARK ranges 0..iters-1, (start, duration) of device work), in ns, from
    torch.profiler's kineto events."""
    from torch.autograd import DeviceType

    marks: dict[int, tuple[int, int]] = {}
    work: list[tuple[int, int]] = []
    for e in events:
        if e.device_type() == DeviceType.CPU and e.name().startswith(MARK):
            marks[int(e.name()[len(MARK):])] = (e.start_ns(), e.start_ns() + e.duration_ns())
        elif e.device_type() != DeviceType.CPU and _is_device_work(e):
            work.append((e.start_ns(), e.duration_ns()))
    missing = sorted(set(range(iters)) - set(marks))
    if missing:
        raise DsactlError(f"torch-profiler: no record of timed calls {missing} (the profiler dropped events)")
    return [marks[i] for i in range(iters)], work


def _is_device_work(event: Any) -> bool:
    """A device-side kineto event is a kernel, copy or set rather than a GPU copy of a MARK range."""
    if hasattr(event, "activity_type"):
        return event.activity_type() in PROFILER_DEVICE_WORK
    # torch < 2.12 (the H200's 2.11) has no activity_type; there a device event is one of those three
    # or a range's GPU copy, which carries the range's name.
    return not event.name().startswith(MARK)


def _cupti_available() -> bool:
    import torch

    try:
        from cupti import cupti  # noqa: F401
    except Exception:  # not installed, or its CUDA libraries do not load
        return False
    return torch.cuda.is_available()


def _torch_profiler_available() -> bool:
    import torch
    from torch.profiler import ProfilerActivity, supported_activities

    return torch.cuda.is_available() and ProfilerActivity.CUDA in supported_activities()


def _cuda_graph_available() -> bool:
    import torch

    return torch.cuda.is_available()


AVAILABLE: dict[str, Callable[[], bool]] = {
    "cupti": _cupti_available,
    "torch-profiler": _torch_profiler_available,
    "cuda-graph": _cuda_graph_available,
}


def available_methods() -> list[str]:
    return [m for m in METHODS if AVAILABLE[m]()]


def check_method(requested: str | None) -> None:
    """Raise DsactlError unless requested is None, auto or one of METHODS (no GPU needed)."""
    if requested not in (None, "auto", *METHODS):
        raise DsactlError(f"unknown timing method {requested!r}; choose auto, {', '.join(METHODS)}")


def pick_method(requested: str | None = None) -> str:
    """The requested method if it works here, else the first available in METHODS order."""
    check_method(requested)
    if requested not in (None, "auto"):
        if not AVAILABLE[requested]():
            raise DsactlError(f"timing method {requested} is not available here (available: "
                              f"{', '.join(available_methods()) or 'none'})")
        return requested
    found = available_methods()
    if not found:
        raise DsactlError("no timing method available: bench needs a CUDA GPU")
    return found[0]


class L2Flusher:
    """A device buffer larger than L2, written before every timed call."""

    def __init__(self, device: Any = None) -> None:
        import torch

        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", 0)
        self.nbytes = max(FLUSH_L2_MULTIPLE * l2, FLUSH_MIN_BYTES) if l2 else FLUSH_MIN_BYTES
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=device)

    def flush(self) -> None:
        self.buffer.fill_(1)


def measure(fn: Callable[[], Any], method: str, iters: int, warmup: int, flusher: L2Flusher) -> tuple[str, list[float]]:
    """Warm up, then time `iters` cold-L2 calls of fn; returns (method used, per-call us)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if method == "cupti":
        return method, _measure_cupti(fn, iters, flusher)
    if method == "torch-profiler":
        return method, _measure_torch_profiler(fn, iters, flusher)
    if method == "cuda-graph":
        return _measure_cuda_graph(fn, iters, flusher)
    raise DsactlError(f"unknown timing method {method!r}")


def _no_kernels(method: str) -> DsactlError:
    return DsactlError(f"{method}: a timed call launched no GPU work (is the solution running on the CPU?)")


# CUPTI holds one pair of buffer callbacks per process, and torch.profiler
# registers its own: register ours before every measurement and point the sink
# at that measurement's record lists.
_cupti = {"sink": None}


def _cupti_requested():
    return CUPTI_BUFFER_BYTES, 0  # 0: as many records as fit


def _cupti_completed(records):
    sink = _cupti["sink"]
    if sink is not None:
        sink(records)


def _cupti_records(fn: Callable[[], Any], iters: int, flusher: L2Flusher
                   ) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int, int]]]:
    """`iters` cold-L2 calls of fn under CUPTI: (CPU brackets of the calls, launch API records as
    (cpu_start, correlation_id), device activities as (correlation_id, start, end)), in ns."""
    import torch
    from cupti import cupti

    launch_kinds = {int(cupti.ActivityKind.RUNTIME), int(cupti.ActivityKind.DRIVER)}
    device_kinds = {int(cupti.ActivityKind.CONCURRENT_KERNEL), int(cupti.ActivityKind.MEMCPY),
                    int(cupti.ActivityKind.MEMSET)}
    # Sets: a record delivered twice (seen on the H200 when CUPTI is enabled again in one
    # process, which doubled a copy's time) must count once.
    launches: set[tuple[int, int]] = set()
    activities: set[tuple[int, int, int]] = set()

    def sink(records):
        for r in records:
            kind = int(r.kind)
            if kind in launch_kinds:
                launches.add((r.start, r.correlation_id))
            elif kind in device_kinds:
                activities.add((r.correlation_id, r.start, r.end))

    cupti.activity_register_callbacks(_cupti_requested, _cupti_completed)
    kinds = [cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER, cupti.ActivityKind.CONCURRENT_KERNEL,
             cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET]
    brackets: list[tuple[int, int]] = []
    _cupti["sink"] = sink
    enabled = []
    try:
        for kind in kinds:
            cupti.activity_enable(kind)
            enabled.append(kind)
        for _ in range(iters):
            flusher.flush()
            torch.cuda.synchronize()
            start = cupti.get_timestamp()
            fn()
            end = cupti.get_timestamp()
            torch.cuda.synchronize()
            brackets.append((start, end))
        cupti.activity_flush_all(1)
    finally:
        for kind in enabled:
            cupti.activity_disable(kind)
        _cupti["sink"] = None
    return brackets, sorted(launches), sorted(activities)


def _measure_cupti(fn: Callable[[], Any], iters: int, flusher: L2Flusher) -> list[float]:
    brackets, launches, activities = _cupti_records(fn, iters, flusher)
    totals = sum_by_bracket(brackets, launches, [(c, end - start) for c, start, end in activities])
    if not all(totals):
        raise _no_kernels("cupti")
    return [t / 1e3 for t in totals]


def measure_graph_span(fn: Callable[[], Any], iters: int, warmup: int, flusher: L2Flusher) -> list[float] | None:
    """fn captured once as a CUDA graph; per cold-L2 replay, us from its first kernel's start to its last one's
    end (CUPTI): the device time the call holds inside a larger graph, the gaps between its kernels included,
    the graph's own launch latency not. None where CUPTI is missing or fn cannot be captured."""
    import torch

    if not _cupti_available():
        return None
    graph = _capture(fn)
    if graph is None:
        return None
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    spans = span_by_bracket(*_cupti_records(graph.replay, iters, flusher))
    if not all(spans):
        raise _no_kernels("cupti")
    return [t / 1e3 for t in spans]


def _measure_torch_profiler(fn: Callable[[], Any], iters: int, flusher: L2Flusher) -> list[float]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iters):
            flusher.flush()
            torch.cuda.synchronize()
            with record_function(f"{MARK}{i}"):
                fn()
                torch.cuda.synchronize()
    intervals, work = profiler_calls(prof.profiler.kineto_results.events(), iters)
    totals = sum_by_interval(intervals, work)
    if not all(totals):
        raise _no_kernels("torch-profiler")
    return [t / 1e3 for t in totals]


def _capture(fn: Callable[[], Any]) -> Any:
    """fn captured once as a CUDA graph, or None when it cannot be (it synchronizes or allocates on the host)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:
        torch.cuda.synchronize()
        return None
    return graph


def _measure_cuda_graph(fn: Callable[[], Any], iters: int, flusher: L2Flusher) -> tuple[str, list[float]]:
    graph = _capture(fn)
    if graph is None:
        return EVENTS_FALLBACK, _time_with_events(fn, iters, flusher)
    return "cuda-graph", _time_with_events(graph.replay, iters, flusher)


def measure_events(fn: Callable[[], Any], iters: int, warmup: int, flusher: L2Flusher) -> list[float]:
    """Warm up, then time `iters` cold-L2 calls of fn with CUDA events around each (what a caller waits,
    launch overhead and host work included), per-call us."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _time_with_events(fn, iters, flusher)


def _time_with_events(run: Callable[[], Any], iters: int, flusher: L2Flusher) -> list[float]:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(iters):
        flusher.flush()
        start.record()
        run()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3)
    return out
