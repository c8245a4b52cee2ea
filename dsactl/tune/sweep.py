"""`dsactl tune` over a suite: bucket its workloads per family, tune each bucket (a job for the executor,
one worker per GPU), and turn the winners into table entries for the GPU that timed them."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from dsactl.errors import DsactlError
from dsactl.kernels import tuned
from dsactl.tune import families, space
from dsactl.tune.search import MIN_GAIN, BucketResult, Settings, Timer, tune_bucket
from dsactl.workloads import Workload

NO_GPU = "dsactl tune needs a CUDA GPU: it times candidates on the GPU whose table it writes"


def workers_capability(executor: Any) -> tuple[int, int] | None:
    """The one compute capability the workers' GPUs share (None: they run on the CPU). The plan picks each
    workload's kernel for it, so workers of two capabilities are refused rather than given a plan made
    for the other."""
    found = set(executor.capabilities())
    if len(found) > 1:
        shown = ", ".join("CPU" if c is None else f"{c[0]}.{c[1]}" for c in sorted(found, key=lambda c: c or (0, 0)))
        raise DsactlError(f"tune: the workers' GPUs differ in compute capability ({shown}); the dispatch picks "
                          "kernels per capability, so tune one GPU type a run (--gpus naming GPUs of one type)")
    return found.pop() if found else None


def require_gpu(executor: Any) -> None:
    """Every worker of executor (this process, or those --gpus / --ray start) runs on a GPU of one capability."""
    if workers_capability(executor) is None:
        raise DsactlError(NO_GPU)


@dataclass(frozen=True)
class Job:
    """One bucket: what a worker verifies and times on its GPU."""

    family: str
    bucket: str
    workloads: tuple[Workload, ...]
    settings: Settings
    command: str


@dataclass
class Plan:
    jobs: list[Job] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (workload, why it is not tuned)


def _implementation(w: Workload, capability: tuple[int, int] | None) -> str:
    """The attention kernel the dispatch sends w to on this GPU (its shapes taken as aligned and its CUDA
    libraries as built: those are what a serving call has); "triton" off a GPU and outside the attention."""
    from dsactl.definitions import get
    from dsactl.kernels.attention import dispatch

    p = get(w.definition).params
    if "fp8kv" not in p:  # not an attention definition
        return dispatch.TRITON
    return dispatch.implementation_for(p["heads"], capability, fp8kv=p["fp8kv"], num_tokens=w.axes["num_tokens"],
                                       fits={dispatch.HOPPER, dispatch.MMA} if capability else set())


def plan(workloads: Sequence[Workload], settings: Settings, command: str,
         capability: tuple[int, int] | None) -> Plan:
    """The buckets to tune, in the suite's order, and the workloads left out with the reason."""
    out = Plan()
    groups: dict[tuple[str, str], list[Workload]] = {}
    for w in workloads:
        family = families.for_definition(w.definition, _implementation(w, capability))
        if family is None:
            out.skipped.append((w.uuid, "no tunable kernel serves its definition"))
            continue
        bucket = space.bucket(family, w)
        if bucket is None:
            out.skipped.append((w.uuid, "every row fits in topk: the passthrough serves it, no kernel to tune"))
            continue
        groups.setdefault((family.name, bucket), []).append(w)
    out.jobs = [Job(f, b, tuple(ws), settings, command) for (f, b), ws in groups.items()]
    return out


def run_job(job: Job, timer: Timer | None = None, device: str = "cuda",
            num_sms: int | None = None) -> BucketResult:
    """Tune one bucket on this process's device: bench's timer, the GPU's SM count and tile class unless given."""
    family = families.get(job.family)
    compact = False
    if timer is None:
        import torch

        from dsactl.bench import runner as bench
        from dsactl.kernels.attention.triton_sparse_mla import compact_for

        s = job.settings
        timer = bench.timing_setup(bench.Settings(s.warmup, s.iters, s.trials, s.method), job.command).timer
        num_sms = torch.cuda.get_device_properties(0).multi_processor_count
        compact = compact_for(torch.device("cuda", 0))
    result = tune_bucket(family, job.bucket, list(job.workloads),
                         space.candidates(family, list(job.workloads), num_sms or 132, compact), timer, job.settings,
                         device)
    identity = tuned.device_identity(_device(device))
    if identity is not None:
        result.gpu, result.capability = identity
    return result


def _device(device: str) -> Any:
    import torch

    return torch.device(device if device != "cuda" else "cuda:0")


def tune(workloads: Sequence[Workload], settings: Settings, command: str, executor: Any = None,
         on_start: Callable[[Job], None] | None = None,
         on_done: Callable[[BucketResult], None] | None = None) -> tuple[Plan, list[BucketResult]]:
    """Every bucket of workloads through executor (default: this process), planned for its workers'
    compute capability; results in plan order."""
    from dsactl.executor.local import LocalExecutor

    executor = executor or LocalExecutor()
    p = plan(workloads, settings, command, workers_capability(executor))
    results: list[BucketResult | None] = [None] * len(p.jobs)
    for done in executor.map(run_job, p.jobs, lambda i: on_start and on_start(p.jobs[i])):
        job = p.jobs[done.index]
        if done.error is not None:
            results[done.index] = BucketResult(job.family, job.bucket, [w.uuid for w in job.workloads], [],
                                               method=f"lost: {done.error}")
        else:
            results[done.index] = done.result
        if on_done:
            on_done(results[done.index])
    return p, [r for r in results if r is not None]


def entries(results: Sequence[BucketResult], command: str, date: str | None = None) -> dict[str, list[tuned.Entry]]:
    """Family name -> the table entries of the buckets whose winner beat the hand-picked choice."""
    date = date or datetime.date.today().isoformat()
    out: dict[str, list[tuned.Entry]] = {}
    for r in results:
        chosen = r.chosen
        if chosen is None or r.capability is None:
            continue
        source = {"command": command, "date": date, "method": r.method, "us": round(chosen.total_us, 3),
                  "default_us": round(r.default.total_us, 3), "workloads": r.workloads}
        out.setdefault(r.family, []).append(tuned.Entry(r.gpu, r.capability, r.bucket, chosen.knobs, source))
    return out


def report(results: Sequence[BucketResult], command: str) -> dict[str, Any]:
    """The sweep as plain data (tune --json): per bucket, every candidate tried (its knobs, why verification
    refused it, its summed per-workload median us), the hand-picked choice's time, the fastest verified
    candidate's, and whether it was written (it beat the hand-picked choice by MIN_GAIN)."""
    def us(t: Any) -> float | None:
        return None if t is None or t.total_us is None else round(t.total_us, 3)

    buckets = []
    for r in results:
        best = r.winner
        hand, fastest = us(r.default), us(best)
        buckets.append({
            "family": r.family, "bucket": r.bucket, "gpu": r.gpu,
            "capability": list(r.capability) if r.capability else None, "method": r.method,
            "workloads": r.workloads, "hand_picked_us": hand,
            "best": None if best is None else best.label, "best_us": fastest,
            "gain": round(hand / fastest, 4) if hand and fastest else None,
            "written": r.chosen is not None,
            "candidates": [{"knobs": t.knobs, "problem": t.problem, "us": us(t)} for t in r.tried],
        })
    return {"command": command, "min_gain": MIN_GAIN, "buckets": buckets}


def table_file(family: families.Family, out: Path | None) -> Path:
    return family.table_path if out is None else out / f"{family.kernel_name}{tuned.TABLE_SUFFIX}"


def settled(results: Sequence[BucketResult]) -> dict[str, set[tuple]]:
    """Family name -> the table keys (gpu, capability, bucket) of the buckets whose verified hand-picked
    choice no candidate beat: an entry an earlier tune wrote there is stale (the kernel or the hand-picked
    choice changed since) and goes."""
    out: dict[str, set[tuple]] = {}
    for r in results:
        if r.capability is not None and r.default.total_us is not None and r.chosen is None:
            out.setdefault(r.family, set()).add((r.gpu, r.capability, r.bucket))
    return out


def write(new: dict[str, list[tuned.Entry]], stale: dict[str, set[tuple]] | None = None,
          out: Path | None = None) -> list[Path]:
    """Merge each family's new entries into its table (other GPUs' entries kept) and remove its stale keys
    (settled()); the files that changed. The launchers of this process read the tables written beside
    them again."""
    stale = stale or {}
    written = []
    for name in sorted(set(new) | set(stale)):
        family = families.get(name)
        path = table_file(family, out)
        try:
            old = tuned.read(path)
        except ValueError as e:
            raise DsactlError(f"{path}: cannot merge into it ({e}); fix or remove it first") from None
        gone = stale.get(name, set())
        merged = [e for e in tuned.merge(old, new.get(name, [])) if e.key not in gone]
        if merged == old:
            continue
        tuned.write(path, family.kernel_name, merged)
        written.append(path)
        if out is None and name in _loaded_families():
            space.table(family).reload()
    return written


def _loaded_families() -> set[str]:
    import sys

    return {f.name for f in families.FAMILIES if f"dsactl.kernels.{f.module}" in sys.modules}
