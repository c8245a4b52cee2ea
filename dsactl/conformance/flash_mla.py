"""FlashMLA's own sparse attention tests against dsactl.compat.flash_mla.

From a FlashMLA checkout, tests/test_flash_mla_sparse_decoding.py and tests/test_flash_mla_sparse_prefill.py
run with `flash_mla` resolved to dsactl.compat.flash_mla: FlashMLA's case lists, generators (tests/lib.py,
kernelkit), references (tests/ref.py) and tolerances, unmodified. Ours is the selection: every V3.2 case
(d_qk 576) runs; MODEL1 cases (d_qk 512) are listed as not served. The performance cases run for their
correctness check only (num_runs 0): FlashMLA's timing finds its own kernels by name, and dsactl times the same
shapes with its own timer (dsactl bench -b flashmla). Each case gets the seed FlashMLA's own run gives it (its
counter advances over the cases left out too). Needs a CUDA GPU: the tests allocate there.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import sys
import types
from pathlib import Path
from typing import Callable

from .report import ERROR, FAILED, NOT_SERVED, PASSED, Report, checkout_commit

MODULE = "flash_mla"
DECODE_TEST = "test_flash_mla_sparse_decoding"
PREFILL_TEST = "test_flash_mla_sparse_prefill"
SERVED_D_QK = 576
NOT_SERVED_REASON = "MODEL1 layout (d_qk 512)"
# The prefill test's case lists, in its own order (its __main__ block concatenates them).
PREFILL_LISTS = ("correctness_cases", "correctness_cases_with_features", "corner_cases", "performance_cases")
TAIL_LINES = 6  # of a failing case's printed output, kept as its reason


def install(checkout: Path) -> None:
    """Resolve `flash_mla` to dsactl's module and put the checkout's tests (lib, ref, quant, kernelkit) on the
    path; FlashMLA's tests then set torch's defaults as their main() does."""
    import torch

    from dsactl.compat import flash_mla

    sys.modules[MODULE] = flash_mla
    tests = str(checkout / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    torch.set_default_dtype(torch.bfloat16)
    torch.set_default_device(torch.device("cuda:0"))
    torch.cuda.set_device(0)
    torch.set_float32_matmul_precision("high")


def load_prefill(checkout: Path) -> types.ModuleType:
    """The prefill test as a module whose namespace also holds its case lists: the file's top level, then its
    __main__ block up to the loop that runs the cases (the block sets the device defaults and builds the
    lists; the loop is replaced by run_cases below)."""
    path = checkout / "tests" / f"{PREFILL_TEST}.py"
    tree = ast.parse(path.read_text(), str(path))
    main = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    if len(main) != 1:
        raise RuntimeError(f"{path}: expected one `if __name__ == '__main__':` block")
    body = [node for node in tree.body if node is not main[0]]
    head = []
    for node in main[0].body:
        if isinstance(node, ast.For):
            break
        head.append(node)
    module = types.ModuleType(PREFILL_TEST)
    module.__file__ = str(path)
    sys.modules[PREFILL_TEST] = module
    exec(compile(ast.Module(body + head, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module


def _run_case(report: Report, name: str, run) -> None:
    """Run one case, its printed output captured: PASSED where the test's own check says so."""
    from dsactl.compat.flash_mla import CompatError

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            correct = run()
    except CompatError as e:
        report.add(name, NOT_SERVED, str(e))
        return
    except Exception as e:  # noqa: BLE001 - any other failure of a served case is an error, reported as such
        report.add(name, ERROR, f"{type(e).__name__}: {e}")
        return
    tail = " | ".join(printed.getvalue().strip().splitlines()[-TAIL_LINES:])
    report.add(name, PASSED if correct else FAILED, "" if correct else tail)


def run_decode(checkout: Path, source: str) -> Report:
    import importlib

    test = importlib.import_module(DECODE_TEST)
    report = Report(f"{MODULE}.sparse_decode", source)
    for raw in test.gen_testcase():
        p = raw.to_test_param()
        p.seed = test._counter.next()  # the seed FlashMLA's own run gives this case
        if p.d_qk != SERVED_D_QK:
            report.add(str(raw), NOT_SERVED, NOT_SERVED_REASON)
            continue
        p = dataclasses.replace(p, num_runs=0)
        _run_case(report, str(raw), lambda: test.test_flash_mla(p).is_correct)
    return report


def run_prefill(checkout: Path, source: str) -> Report:
    test = load_prefill(checkout)
    report = Report(f"{MODULE}.sparse_prefill", source)
    for p in (p for name in PREFILL_LISTS for p in getattr(test, name)):
        p.seed = test._counter.next()
        if p.d_qk != SERVED_D_QK:
            report.add(str(p), NOT_SERVED, NOT_SERVED_REASON)
            continue
        p = dataclasses.replace(p, num_runs=0)
        _run_case(report, str(p), lambda: test.run_test(p))
    return report


def run(checkout: Path) -> list[Report]:
    """Both test files' cases against dsactl.compat.flash_mla, one Report each."""
    checkout = Path(checkout)
    source = checkout_commit(checkout)
    install(checkout)
    return [run_decode(checkout, source), run_prefill(checkout, source)]


# FlashMLA's performance cases timed, ours beside its own: the same inputs from its generator, the same call
# through its tests' lib (run_flash_mla_decode, run_flash_mla_sparse_fwd), dsactl's timer (bench: CUPTI kernel
# time, cold L2, warm-up first), each module in turn. Decode cases are timed twice: as its tests lay them out
# (TESTS_LAYOUT: every cache page padded by a row, q and indices padded in every dimension) and as engines
# allocate them (ENGINE_LAYOUT, the same values in contiguous pages, q and indices: engine_layout). Each row
# also holds how far the two modules' outputs of that call lie apart (max_abs_diff), so a timed call is one
# whose results were compared.
TIMING_ITERS, TIMING_WARMUP, TIMING_TRIALS = 20, 3, 2
TESTS_LAYOUT, ENGINE_LAYOUT = "tests", "engine"
TIMING_COLUMNS = ("test", "layout", "case", "dsactl_us", "flashmla_us", "speedup", "max_abs_diff")


def max_abs_diff(ours, theirs) -> float:
    """The largest |ours - theirs| over every tensor of two calls' outputs (out, lse, max_logits), in fp32:
    elements equal in value (infinities of one sign included) or both NaN count 0, an infinity or a NaN
    against anything else counts inf."""
    import torch

    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            return float("inf")
        a, b = a.float(), b.float()
        apart = torch.where((a == b) | (a.isnan() & b.isnan()), 0.0, (a - b).abs())
        apart = apart.nan_to_num(nan=float("inf"), posinf=float("inf"))
        if apart.numel():
            worst = max(worst, float(apart.max()))
    return worst


def performance_cases(checkout: Path) -> list[tuple[str, object]]:
    """(test, TestParam) of every V3.2 performance case of both test files, seeded as FlashMLA's own run seeds
    them (each file's counter advances over every case from a fresh start)."""
    import importlib

    decode = importlib.import_module(DECODE_TEST)
    counter = decode.kk.Counter()
    cases = []
    for raw in decode.gen_testcase():
        p = raw.to_test_param()
        p.seed = counter.next()
        if p.d_qk == SERVED_D_QK and p.num_runs > 0:  # its correctness cases run 0 times
            cases.append(("decode", p))
    prefill = load_prefill(checkout)
    counter = prefill.kk.Counter()
    for name in PREFILL_LISTS:
        for p in getattr(prefill, name):
            p.seed = counter.next()
            if p.d_qk == SERVED_D_QK and name == "performance_cases":
                cases.append(("prefill", p))
    return cases


def engine_layout(t):
    """A decode testcase of FlashMLA's tests (lib.TestcaseForDecode) with the same values laid out as an engine
    allocates them: the FP8 caches' pages contiguous (its tests pad each page by a row), q and the indices
    contiguous (its tests pad every dimension of both; an engine's indices are its top-k's output)."""
    def contiguous(scope):
        return scope and dataclasses.replace(scope, blocked_k_quantized=scope.blocked_k_quantized.contiguous(),
                                             indices_in_kvcache=scope.indices_in_kvcache.contiguous())

    return dataclasses.replace(t, q=t.q.contiguous(), kv_scope=contiguous(t.kv_scope),
                               extra_kv_scope=contiguous(t.extra_kv_scope))


def time_performance_cases(checkout: Path, real: types.ModuleType,
                           after_row: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """One row a case and layout: its median time with dsactl.compat.flash_mla and with `real` (FlashMLA built
    from the checkout), in us, FlashMLA's time over ours, and how far the two outputs lie apart. after_row
    sees the rows so far after each one (a run cut short keeps what it finished)."""
    import torch

    from dsactl.bench.timing import L2Flusher, measure, pick_method, summarize
    from dsactl.compat import flash_mla as ours

    install(Path(checkout))
    import lib

    method, flusher, rows = pick_method(), L2Flusher(), []
    for test, p in performance_cases(Path(checkout)):
        if test == "decode":
            t = lib.generate_testcase_for_decode(p)
            layouts = ((TESTS_LAYOUT, t), (ENGINE_LAYOUT, engine_layout(t)))
        else:
            layouts = ((TESTS_LAYOUT, lib.generate_testcase(p)),)
        for layout, t in layouts:
            times, outputs = {}, {}
            for label, module in (("dsactl", ours), ("flashmla", real)):
                lib.flash_mla = module
                if test == "decode":
                    meta = module.get_mla_metadata()[0]
                    call = lambda: lib.run_flash_mla_decode(p, t, meta, None)  # noqa: E731
                else:
                    call = lambda: lib.run_flash_mla_sparse_fwd(p, t, False)  # noqa: E731
                outputs[label] = call()
                trials = [measure(call, method, TIMING_ITERS, TIMING_WARMUP, flusher)[1]
                          for _ in range(TIMING_TRIALS)]
                times[label] = summarize(trials).median_us
            lib.flash_mla = ours
            rows.append({"test": test, "layout": layout, "case": str(p), "dsactl_us": round(times["dsactl"], 2),
                         "flashmla_us": round(times["flashmla"], 2),
                         "speedup": round(times["flashmla"] / times["dsactl"], 3),
                         "max_abs_diff": max_abs_diff(outputs["dsactl"], outputs["flashmla"])})
            after_row(rows)
            del outputs
        del t, layouts
        torch.cuda.empty_cache()
    return rows
