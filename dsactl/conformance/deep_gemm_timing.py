"""DeepGEMM's own indexer cases timed: every sm_90 FP8 case of test_mqa_logits and test_paged_mqa_logits, with
dsactl.compat.deep_gemm and with DeepGEMM built from the checkout, in turn, with bench's timer.

A case runs as the conformance run runs it (deep_gemm.run_case: the unmodified test function, its case hook
returning that one case, from SEED), but with the test's `deep_gemm` the real module, so that its inputs, its
checks and the paged test's schedule are DeepGEMM's own. It is timed where the test times it, at its
bench_kineto(fn, ...) call, whose fn is the test's own kernel call with its arguments: fn is measured (CUPTI kernel
time, cold L2, warm-up first) with the test's `deep_gemm` resolved to dsactl's module, then to DeepGEMM's, and
bench_kineto returns what it returns under DeepGEMM's DG_USE_NVIDIA_TOOLS (the test's own figures are dropped).
A time is the whole call, every kernel it launches, as an engine pays it: DeepGEMM's clean_logits kernel beside
its logits kernel, and our masked fill and bf16 conversion (DeepGEMM's own figures count its logits kernel alone).

The paged test calls get_paged_mqa_logits_metadata once a case, outside the call it times (a schedule serves every
layer of a decode step), so it is not timed here either; dsactl's call is handed DeepGEMM's schedule and ignores it.

FLOPs are the test's own count for the case: the local it divides by its time (TFLOP_LOCALS), read from the test's
frame at its bench_kineto call.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
from typing import Callable
from unittest.mock import patch

from . import deep_gemm as conformance
from .flash_mla import TIMING_ITERS, TIMING_TRIALS, TIMING_WARMUP  # one timer setting for both peers' cases
from .report import PASSED

TIMING_HOOK = "bench_kineto"  # the test's timing call: bench_kineto(fn, kernel_names, ...)
MODULE_NAME = "deep_gemm"  # the test module's global its kernel calls go through
# What DeepGEMM built from the checkout must have: the calls the tests make (its __init__ leaves them out, without
# failing, where its extension lacks them).
REAL_NEEDS = ("fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata", "fp8_fp4_paged_mqa_logits", "get_num_sms")
# The test's FLOP count of a case over 1e12, the figure it divides by its time to print TFLOPS.
TFLOP_LOCALS = {"test_mqa_logits": "tflops", "test_paged_mqa_logits": "tflops_calc"}
OURS, THEIRS = "dsactl", "deepgemm"
TIMING_COLUMNS = ("test", "case", "dsactl_us", "deepgemm_us", "speedup", "dsactl_tflops", "deepgemm_tflops",
                  "pct_fp8_peak")


@dataclass
class Timings:
    """The rows, the cases that could not be timed (name, why), and what the rates were taken against."""
    method: str
    fp8_tflops: float  # the GPU's measured FP8 matmul rate (dsactl/bench/peaks.py), pct_fp8_peak's base
    rows: list[dict] = field(default_factory=list)
    untimed: list[tuple[str, str]] = field(default_factory=list)


def case_flops(frame: FrameType | None, test_name: str) -> float:
    """The test's FLOP count of the case being timed, from the frame of the test function up the stack."""
    while frame is not None and frame.f_code.co_name != test_name:
        frame = frame.f_back
    local = TFLOP_LOCALS[test_name]
    if frame is None or local not in frame.f_locals:
        raise RuntimeError(f"{conformance.TEST_FILE}: {test_name} holds no `{local}` at its {TIMING_HOOK} call "
                           "(the FLOP count it divides by its time)")
    return float(frame.f_locals[local]) * 1e12


def time_case(tests: ModuleType, test_name: str, case: tuple, modules: dict[str, ModuleType],
              timer: Callable[[Callable[[], object]], float]) -> tuple[dict[str, float], str]:
    """One case through its unmodified test with `deep_gemm` resolved to modules[THEIRS], its kernel call timed
    at the test's bench_kineto with each of `modules` in turn: ({label: us, "flops": ...}, why not timed or "")."""
    timed: dict[str, float] = {}
    bench_kineto = getattr(tests, TIMING_HOOK)

    def hook(fn, kernel_names, *args, **kwargs):
        timed["flops"] = case_flops(inspect.currentframe(), test_name)
        for label, module in modules.items():
            with patch.object(tests, MODULE_NAME, module):
                timed[label] = timer(fn)
        return bench_kineto(fn, kernel_names, *args, **kwargs)

    with patch.object(tests, MODULE_NAME, modules[THEIRS]), patch.object(tests, TIMING_HOOK, hook):
        outcome, reason = conformance.run_case(tests, test_name, case)
    if outcome != PASSED:
        return {}, f"{outcome}: {reason}"
    if set(modules) - set(timed):
        return {}, f"{test_name} made no {TIMING_HOOK} call"
    return timed, ""


def row(test_name: str, name: str, timed: dict[str, float], fp8_tflops: float) -> dict:
    """A case's CSV row: median us of each module, DeepGEMM's time over ours, and TFLOP/s of the test's FLOPs."""
    ours, theirs = timed[OURS], timed[THEIRS]
    rate = {label: timed["flops"] / timed[label] / 1e6 for label in (OURS, THEIRS)}
    return {"test": test_name, "case": name, "dsactl_us": round(ours, 2), "deepgemm_us": round(theirs, 2),
            "speedup": round(theirs / ours, 3), "dsactl_tflops": round(rate[OURS], 1),
            "deepgemm_tflops": round(rate[THEIRS], 1), "pct_fp8_peak": round(100 * rate[OURS] / fp8_tflops, 1)}


def run_timings(tests: ModuleType, modules: dict[str, ModuleType], timer: Callable[[Callable[[], object]], float],
                timings: Timings, after_case: Callable[[Timings], None] = lambda t: None) -> Timings:
    """Every sm_90 case of both tests (the conformance run's plan), progress on stderr and to after_case."""
    for test_name in conformance.SUITES.values():
        cases = conformance.plan(tests, test_name)
        for i, case in enumerate(cases.served, 1):
            name = cases.name(case)
            timed, why = time_case(tests, test_name, case, modules, timer)
            if why:
                timings.untimed.append((name, why))
                line = f"NOT TIMED: {name}: {why}"
            else:
                timings.rows.append(row(test_name, name, timed, timings.fp8_tflops))
                line = f"{name}: dsactl {timed[OURS]:.1f} us, DeepGEMM {timed[THEIRS]:.1f} us"
            print(f"{test_name} {i}/{len(cases.served)} {line}", file=sys.stderr, flush=True)
            after_case(timings)
    return timings


def bench_timer(method: str, flusher) -> Callable[[Callable[[], object]], float]:
    """bench's timer over a call: the median us of TIMING_TRIALS runs of TIMING_ITERS cold-L2 calls each."""
    from dsactl.bench.timing import measure, summarize

    def timer(fn: Callable[[], object]) -> float:
        trials = [measure(fn, method, TIMING_ITERS, TIMING_WARMUP, flusher)[1] for _ in range(TIMING_TRIALS)]
        return summarize(trials).median_us
    return timer


def time_cases(checkout: Path, real: ModuleType, after_case: Callable[[Timings], None] = lambda t: None) -> Timings:
    """DeepGEMM's sm_90 cases with dsactl's module and with `real` (DeepGEMM built from the checkout, imported
    before `deep_gemm` resolves to ours), the timings so far handed to after_case after each. Needs a CUDA GPU."""
    from dsactl.bench.peaks import load_or_measure
    from dsactl.bench.timing import L2Flusher, pick_method

    method = pick_method()
    timings = Timings(method, load_or_measure().fp8_tflops)
    with conformance.deep_gemm_tests(Path(checkout)) as tests:
        modules = {OURS: tests.deep_gemm, THEIRS: real}
        return run_timings(tests, modules, bench_timer(method, L2Flusher()), timings, after_case)
