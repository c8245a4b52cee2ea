"""One bench run: every contender on every workload, trials with fresh inputs.

Per workload and trial, inputs are prepared once (dsactl.harness.prepare with
seed = trial) and every contender is timed on them, so all see the same data.
The reference is a per-row Python loop: it is timed with REFERENCE_ITERS
iterations after REFERENCE_WARMUP, and the output says so. Speedup = reference
latency / contender latency; the contest score of a solution is the arithmetic
mean of its per-workload speedups (docs/design.md, "Timing method").
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from dsactl import solutions
from dsactl.bench import baselines, metrics, served, timing
from dsactl.bench.baselines import Contender, Skipped
from dsactl.definitions import get as get_definition
from dsactl.errors import DsactlError
from dsactl.harness import Call, prepare
from dsactl.workloads import Workload

REFERENCE_ITERS = 3
REFERENCE_WARMUP = 1
LOST = "(every contender)"  # the name a workload whose worker died is reported under

# (bound callable, iterations, warmup) -> (method used, per-call microseconds)
Timer = Callable[[Callable[[], Any], int, int], tuple[str, list[float]]]


@dataclass
class Settings:
    warmup: int = 10
    iters: int = 50
    trials: int = 3
    method: str = "auto"
    include_reference: bool = True
    baselines: list[str] | None = None  # None: every baseline serving the definition
    solutions: list[str] | None = None  # None: every registered solution serving the definition


def check_settings(settings: Settings) -> None:
    """Raise DsactlError on the first invalid setting; needs no GPU, so a run fails before it starts."""
    for name, low in (("warmup", 0), ("iters", 1), ("trials", 1)):
        if getattr(settings, name) < low:
            raise DsactlError(f"{name} must be at least {low}, got {getattr(settings, name)}")
    timing.check_method(settings.method)
    check_solution_names(settings.solutions)
    if settings.baselines is not None:
        baselines.check_names(settings.baselines)


@dataclass(kw_only=True)
class Result:
    """One row: a contender on a workload. Columns an older CSV lacks take their defaults."""

    solution: str
    kind: str
    impl: str = ""  # the implementation that served the row (dsactl.bench.served)
    definition: str
    workload: str
    label: str
    axes: str
    method: str
    iters: int
    trials: int
    median_us: float
    min_us: float
    max_us: float
    spread_us: float
    trial_medians_us: list[float]
    size: int
    needed_bytes: int | None = None  # bytes the call must touch (dsactl.bench.metrics)
    needed_flops: int | None = None  # FLOPs the call must do; None where it does no arithmetic
    speedup: float | None = None  # reference median / this median
    gbps: float | None = None  # needed_bytes / median, 1e9 B/s
    pct_copy_bw: float | None = None  # gbps over the measured device-to-device copy bandwidth, %
    tflops: float | None = None  # needed_flops / median, 1e12 FLOP/s
    pct_bf16_peak: float | None = None  # tflops over the measured bf16 matmul rate, %
    active_sms: int | None = None
    allocated_mib: float | None = None  # what one call allocated at its peak (metrics); None: not measured here
    gpu: str = ""  # the GPU that timed it, its UUID and host
    gpu_uuid: str = ""
    host: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Score:
    """One solution on one definition, over its workloads."""

    solution: str
    definition: str
    workloads: int
    mean_latency_us: float  # arithmetic mean of the per-workload medians
    arith_mean_speedup: float | None  # the contest score; None without reference times
    geo_mean_speedup: float | None


@dataclass
class BenchRun:
    meta: dict[str, Any]
    results: list[Result] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    gpu_meta: dict[str, dict[str, Any]] = field(default_factory=dict)  # GPU name -> the header its rows carry

    def scores(self) -> list[Score]:
        """Per (solution, definition) other than the reference, in first-seen order: mean latency
        over its workloads, arithmetic and geometric mean of the speedups of those that have one."""
        groups: dict[tuple[str, str], list[Result]] = {}
        for r in self.results:
            if r.kind != "reference":
                groups.setdefault((r.solution, r.definition), []).append(r)
        scores = []
        for (s, d), rows in groups.items():
            speedups = [r.speedup for r in rows if r.speedup is not None]
            scores.append(Score(s, d, len(rows), statistics.fmean(r.median_us for r in rows),
                                statistics.fmean(speedups) if speedups else None,
                                statistics.geometric_mean(speedups) if speedups else None))
        return scores

    def failed_solutions(self) -> list[Skipped]:
        """Solutions that raised on a workload (not those that cannot run here at all)."""
        return [s for s in self.skipped if s.kind == "solution" and s.workload]


def describe_axes(w: Workload) -> str:
    return " ".join(f"{k}={v}" for k, v in w.axes.items())


def contenders_for(definition: str, settings: Settings) -> tuple[list[Contender], list[Skipped]]:
    """The registered solutions (filtered by settings.solutions) plus baselines, for one definition."""
    d = get_definition(definition)
    found: list[Contender] = []
    skipped: list[Skipped] = []
    for s in solutions.for_definition(definition):
        if settings.solutions is not None and s.name not in settings.solutions:
            continue
        ok, why = s.availability()
        if not ok:
            skipped.append(Skipped(s.name, "solution", definition, why))
            continue
        try:
            found.append(baselines.solution_contender(s))
        except DsactlError as e:
            skipped.append(Skipped(s.name, "solution", definition, str(e)))
    extra, extra_skipped = baselines.resolve(d, settings.baselines, settings.include_reference)
    return found + extra, skipped + extra_skipped


def check_solution_names(names: Sequence[str] | None) -> None:
    for n in names or ():
        solutions.get(n)  # raises DsactlError naming the known ones


def _rates(r: Result, peaks: Any) -> None:
    seconds = r.median_us * 1e-6
    r.gbps = r.needed_bytes / seconds / 1e9
    r.tflops = r.needed_flops / seconds / 1e12 if r.needed_flops is not None else None
    if peaks is not None:
        r.pct_copy_bw = 100.0 * r.gbps / peaks.copy_gbps
        r.pct_bf16_peak = 100.0 * r.tflops / peaks.bf16_tflops if r.tflops is not None else None


def impl_of(c: Contender, call: Call) -> str:
    """A solution's serving implementation; a reference or plug-in is its own name."""
    return served.served_by(c.solution, call) if c.solution is not None else c.name


def run_bench(workloads: Sequence[Workload], settings: Settings, timer: Timer, *, device: str = "cuda",
              sm_count: int | None = None, peaks: Any = None, meta: dict[str, Any] | None = None,
              progress: Callable[[str], None] | None = None,
              on_workload: Callable[[BenchRun], None] | None = None) -> BenchRun:
    """Time every contender on every workload; progress(text) is called once per (workload, trial),
    on_workload(run so far) once per finished workload (so a cut-off run can keep its rows)."""
    run = BenchRun(meta=dict(meta or {}))
    by_definition: dict[str, list[Workload]] = {}
    for w in workloads:
        by_definition.setdefault(w.definition, []).append(w)
    for definition, group in by_definition.items():
        contenders, skipped = contenders_for(definition, settings)
        run.skipped.extend(skipped)
        for w in group:
            rows = _bench_workload(w, contenders, settings, timer, device, sm_count, run.skipped, progress)
            _finish(rows, peaks)
            run.results.extend(rows)
            if on_workload:
                on_workload(run)
    return run


def _finish(rows: list[Result], peaks: Any) -> None:
    """Rates against the peaks, and speedups over the workload's reference row."""
    for r in rows:
        _rates(r, peaks)
    reference = next((r for r in rows if r.kind == "reference"), None)
    if reference is not None:
        for r in rows:
            r.speedup = reference.median_us / r.median_us


def _bench_workload(w: Workload, contenders: list[Contender], settings: Settings, timer: Timer, device: str,
                    sm_count: int | None, skipped: list[Skipped], progress) -> list[Result]:
    samples: dict[str, list[list[float]]] = {c.name: [] for c in contenders}
    methods: dict[str, str] = {}
    failed: set[str] = set()
    work = None
    grids: dict[str, int | None] = {}
    impls: dict[str, str] = {}
    allocated: dict[str, float | None] = {}
    for trial in range(settings.trials):
        if progress:
            progress(f"{w.uuid} trial {trial + 1}/{settings.trials}")
        call = prepare(w, device, seed=trial)
        if work is None:
            work = metrics.work(call.definition, call.inputs)
        for c in contenders:
            if c.name in failed:
                continue
            reference = c.kind == "reference"
            iters = REFERENCE_ITERS if reference else settings.iters
            warmup = REFERENCE_WARMUP if reference else settings.warmup
            try:
                fn = c.bind(call)
                if c.name not in grids:
                    grids[c.name] = metrics.active_sms(c.entry, call.args(), sm_count) if c.entry and sm_count else None
                    impls[c.name] = impl_of(c, call)
                    # Not the reference: a call of its loops costs as much as its timed ones.
                    measured = device.startswith("cuda") and not reference
                    allocated[c.name] = metrics.allocated_mib(fn, device) if measured else None
                methods[c.name], got = timer(fn, iters, warmup)
            except Exception as e:  # a failing contender is reported, the run goes on
                failed.add(c.name)
                skipped.append(Skipped(c.name, c.kind, w.definition, f"{type(e).__name__}: {e}", w.uuid))
                continue
            samples[c.name].append(got)
        del call
    rows = []
    for c in contenders:
        if c.name in failed:
            continue
        stats = timing.summarize(samples[c.name])
        reference = c.kind == "reference"
        rows.append(Result(
            solution=c.name, kind=c.kind, impl=impls[c.name], definition=w.definition, workload=w.uuid, label=w.label,
            axes=describe_axes(w), method=methods[c.name],
            iters=REFERENCE_ITERS if reference else settings.iters, trials=settings.trials,
            median_us=stats.median_us, min_us=stats.min_us, max_us=stats.max_us, spread_us=stats.spread_us,
            trial_medians_us=stats.trial_medians_us, size=work.size, needed_bytes=work.needed_bytes,
            needed_flops=work.needed_flops,
            active_sms=grids.get(c.name), allocated_mib=allocated.get(c.name)))
    return rows


def checked_method(requested: str | None, peaks: Any, flusher: Any,
                   self_check: Callable[..., Any] | None = None) -> tuple[str, Any, list[Any]]:
    """The timing method and its passing self-check: (method, check, rejected checks).

    With auto (requested None or "auto"), a method whose self-check is off is rejected and the
    next available one is tried: once torch.profiler has run in a process, the cupti-python
    activity records can read more than the kernels' time for the rest of it
    (docs/design.md, "Measured choices"). A requested method is kept whatever its check says
    (bench then flags it)."""
    from dsactl.bench import peaks as peaks_mod

    check_fn = self_check or peaks_mod.copy_self_check
    first = timing.pick_method(requested)
    if requested not in (None, "auto"):
        return first, check_fn(first, peaks, flusher), []
    rejected = []
    for method in [first] + [m for m in timing.available_methods() if m != first]:
        check = check_fn(method, peaks, flusher)
        if check.ok:
            return method, check, rejected
        rejected.append(check)
    return first, rejected[0], rejected[1:]


def environment(command: str, method: str, settings: Settings, peaks: Any, self_check: Any,
                rejected: Sequence[Any] = ()) -> dict[str, Any]:
    """The header of every CSV/JSON: what ran, where, how it was timed."""
    import platform

    import torch

    from dsactl import __version__, device

    found, problem = device.gpus()
    gpu = found[torch.cuda.current_device()] if found else None
    return {
        "command": command,
        "gpu": gpu.name if gpu else problem,
        "capability": f"{gpu.capability[0]}.{gpu.capability[1]}" if gpu else None,
        "sm_count": gpu.sm_count if gpu else None,
        "sm_clock_mhz": gpu.sm_clock_mhz if gpu else None,
        "max_sm_clock_mhz": gpu.max_sm_clock_mhz if gpu else None,
        "mem_clock_mhz": gpu.mem_clock_mhz if gpu else None,
        "driver": gpu.driver if gpu else None,
        "versions": {"dsactl": __version__, "python": platform.python_version(),
                     **{t.name: t.version for t in device.tools()}, "cuda": torch.version.cuda},
        "timing_method": method,
        "warmup": settings.warmup,
        "iters": settings.iters,
        "trials": settings.trials,
        "reference_iters": REFERENCE_ITERS,
        "reference_warmup": REFERENCE_WARMUP,
        "peaks": asdict(peaks) if peaks is not None else None,
        "self_check": self_check.to_json() if self_check is not None else None,
        "self_check_rejected": [c.to_json() for c in rejected],
    }


@dataclass
class _TimingSetup:
    """A process's timing setup (method, self-check, peaks, L2 flusher), made for its first workload."""

    key: tuple
    meta: dict[str, Any]
    timer: Timer
    sm_count: int
    peaks: Any
    device: str = "cuda"


_timing_setup: list[_TimingSetup] = []  # at most one: a worker process serves one run


def timing_setup(settings: Settings, command: str) -> _TimingSetup:
    import torch

    from dsactl.bench import peaks as peaks_mod

    key = (command, settings.method, settings.warmup, settings.iters, settings.trials)
    if _timing_setup and _timing_setup[0].key == key:
        return _timing_setup[0]
    if not torch.cuda.is_available():
        raise DsactlError("bench needs a CUDA GPU (torch sees none)")
    flusher = timing.L2Flusher()
    peaks = peaks_mod.load_or_measure()
    method, check, rejected = checked_method(settings.method, peaks, flusher)

    def timer(fn: Callable[[], Any], iters: int, warmup: int) -> tuple[str, list[float]]:
        return timing.measure(fn, method, iters, warmup, flusher)

    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    meta = environment(command, method, settings, peaks, check, rejected)
    _timing_setup[:] = [_TimingSetup(key, meta, timer, sm_count, peaks)]
    return _timing_setup[0]


@dataclass(frozen=True)
class Job:
    """One workload: what a worker times, every contender on the same inputs."""

    workload: Workload
    settings: Settings
    command: str


@dataclass
class Outcome:
    rows: list[Result]
    skipped: list[Skipped]
    meta: dict[str, Any]  # the header of the GPU that timed it


def run_job(job: Job) -> Outcome:
    s = timing_setup(job.settings, job.command)
    contenders, skipped = contenders_for(job.workload.definition, job.settings)
    rows = _bench_workload(job.workload, contenders, job.settings, s.timer, s.device, s.sm_count, skipped, None)
    _finish(rows, s.peaks)
    return Outcome(rows, skipped, s.meta)


def bench(workloads: Sequence[Workload], settings: Settings, command: str,
          progress: Callable[[str], None] | None = None,
          on_ready: Callable[[dict[str, Any]], None] | None = None,
          on_workload: Callable[[BenchRun], None] | None = None, executor: Any = None) -> BenchRun:
    """The real run, one job per workload through executor (default: this process, on its GPU).
    Each worker picks its timing method, loads its peaks and self-checks once. on_ready(meta) is
    called once the environment is known (in this process: before the long part; elsewhere: with the
    first result), progress(workload id) as a workload is handed out, on_workload(run so far) as one
    comes back; rows stay in the order of a plain run, each stamped with the GPU that timed it."""
    from dsactl.executor.local import LocalExecutor

    check_settings(settings)
    executor = executor or LocalExecutor()
    run = BenchRun(meta={})
    if executor.local:
        run.meta = dict(timing_setup(settings, command).meta)
        if on_ready:
            on_ready(run.meta)
    # Grouped by definition, as run_bench orders its rows.
    definitions = dict.fromkeys(w.definition for w in workloads)
    jobs = [Job(w, settings, command) for d in definitions for w in workloads if w.definition == d]
    outcomes: list[Outcome | None] = [None] * len(jobs)

    def started(index: int) -> None:
        if progress:
            progress(jobs[index].workload.uuid)

    for done in executor.map(run_job, jobs, started):
        w = jobs[done.index].workload
        if done.error is not None:
            outcome = Outcome([], [Skipped(LOST, "solution", w.definition, done.error, w.uuid)], {})
        else:
            outcome = done.result
            place = done.placement
            for r in outcome.rows:
                r.gpu, r.gpu_uuid, r.host = place.gpu, place.uuid, place.host
            run.gpu_meta.setdefault(place.gpu, outcome.meta)
            if not run.meta:
                run.meta = dict(outcome.meta)
                if on_ready:
                    on_ready(run.meta)
        outcomes[done.index] = outcome
        run.results = [r for o in outcomes if o is not None for r in o.rows]
        run.skipped = list(dict.fromkeys(s for o in outcomes if o is not None for s in o.skipped))
        if on_workload:
            on_workload(run)
    return run
