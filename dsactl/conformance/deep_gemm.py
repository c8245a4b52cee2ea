"""DeepGEMM's own indexer tests (tests/test_attention.py: test_mqa_logits, test_paged_mqa_logits) against
dsactl.compat.deep_gemm. `deep_gemm` resolves to a module whose kernel calls are the drop-in's and whose
`testing` and `utils` are the checkout's own files; its compiled extension (`_C`) is not there, and the names
the helpers import from it raise if called (the indexer tests never call them).

Only the case selection is ours. Each test loops over the cases its own enumeration yields, through its hook
`sample_mqa_cases`; the hook is made to return one case, so each sm_90 case is one call of the unmodified test
function with its own outcome: PASSED, FAILED (an assertion: DeepGEMM's references, tolerances and bitwise
self-consistency), NOT_SERVED (the drop-in's CompatError) or ERROR (anything else raised). The cases DeepGEMM
runs on sm_100 alone (FP4, varlen rows, other heads, pages and dims) are listed as not served, never run.

Timing: each case ends with DeepGEMM's bench_kineto, which finds kernels by DeepGEMM's own kernel names (ours
are Triton's, so a time would be 0 and the test's figures divide by it). DeepGEMM's switch DG_USE_NVIDIA_TOOLS=1
makes bench_kineto return 1 s without profiling, and the figures the tests print are dropped: a case here checks
correctness only. deep_gemm_timing (`--time`) times the same cases at that call, ours beside DeepGEMM built from
the checkout, with bench's timer.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import random
import sys
import traceback
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterator
from unittest.mock import patch

import torch

from dsactl.compat import deep_gemm as drop_in
from dsactl.conformance.report import ERROR, FAILED, NOT_SERVED, PASSED, Report, checkout_commit

SUITES = {"deep_gemm.mqa_logits": "test_mqa_logits", "deep_gemm.paged_mqa_logits": "test_paged_mqa_logits"}
TEST_FILE = "tests/test_attention.py"
GENERATORS_FILE = "tests/generators.py"  # imported by the test file as `generators`
HELPER_PACKAGES = ("testing", "utils")  # deep_gemm's pure-Python subpackages, loaded from the checkout
TEST_MODULE = "deep_gemm_conformance_test_attention"  # a name no other test file's module takes
CASE_HOOK = "sample_mqa_cases"  # the test file's case selection: (name, cases) -> the cases to run
ARCH_HOOK = "get_arch_major"  # what the enumerations branch on
SERVED_ARCH = 9  # the drop-in serves DeepGEMM's sm_90 path (FP8)
OTHER_ARCHES = (10,)  # whose own cases are listed as not served
SEED = 0  # what test_attention.py's __main__ seeds; each case starts from it
DEEPGEMM_ENV = {"DG_USE_NVIDIA_TOOLS": "1"}  # bench_kineto returns 1 s without profiling


class _Listed(Exception):
    """Raised by the case hook to stop a test once its enumeration has handed over the cases."""

    def __init__(self, cases: list[tuple]):
        super().__init__(f"{len(cases)} cases")
        self.cases = cases


def _ours(name: str) -> bool:
    return name == "deep_gemm" or name.startswith("deep_gemm.") or name in ("generators", TEST_MODULE)


def _load(name: str, path: Path, package: bool = False) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        name, path, submodule_search_locations=[str(path.parent)] if package else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _extension_stub() -> ModuleType:
    """deep_gemm._C: every name the checkout's helpers import from it, each raising if called."""
    ext = ModuleType("deep_gemm._C")

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            raise NotImplementedError(f"deep_gemm._C.{name}: DeepGEMM's compiled extension is not loaded "
                                      "(dsactl.compat.deep_gemm serves the indexer calls alone)")
        return call
    ext.__getattr__ = missing
    return ext


def _assemble(checkout: Path) -> ModuleType:
    """Register `deep_gemm` in sys.modules: the drop-in's functions, the stub extension, and the checkout's
    deep_gemm/testing and deep_gemm/utils packages."""
    module = ModuleType("deep_gemm", "DeepGEMM's API served by dsactl.compat.deep_gemm (dsactl.conformance)")
    module.__path__ = []  # a package whose submodules are only the ones registered here
    for name, obj in vars(drop_in).items():
        if inspect.isfunction(obj) and obj.__module__ == drop_in.__name__ and not name.startswith("_"):
            setattr(module, name, obj)
    sys.modules["deep_gemm"] = module
    module._C = sys.modules["deep_gemm._C"] = _extension_stub()
    for sub in HELPER_PACKAGES:
        setattr(module, sub, _load(f"deep_gemm.{sub}", checkout / "deep_gemm" / sub / "__init__.py", package=True))
    return module


@contextmanager
def deep_gemm_tests(checkout: Path) -> Iterator[ModuleType]:
    """The checkout's tests/test_attention.py, imported with `deep_gemm` assembled (_assemble) and `generators` from
    the checkout, run with DEEPGEMM_ENV; sys.modules and the environment are put back on exit."""
    saved = {k: v for k, v in sys.modules.items() if _ours(k)}
    try:
        with patch.dict(os.environ, DEEPGEMM_ENV):
            _assemble(checkout)
            _load("generators", checkout / GENERATORS_FILE)
            yield _load(TEST_MODULE, checkout / TEST_FILE)
    finally:
        for k in [k for k in sys.modules if _ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


def _show(value) -> str:
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else str(value)


@dataclass
class Plan:
    """A test's cases: its own parameter names, the sm_90 cases (DeepGEMM's order) and the sm_100-only ones,
    each with why it is not served."""
    fields: tuple[str, ...]
    served: list[tuple]
    not_served: list[tuple[tuple, str]]

    def name(self, case: tuple) -> str:
        return ", ".join(f"{f}={_show(v)}" for f, v in zip(self.fields, case))


def case_fields(tests: ModuleType, test_name: str) -> tuple[str, ...]:
    """The names the test gives a case's parameters: the targets of its `for ... in sample_mqa_cases(...)`."""
    tree = ast.parse(Path(tests.__file__).read_text())
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == test_name:
            for node in ast.walk(fn):
                if (isinstance(node, ast.For) and isinstance(node.iter, ast.Call)
                        and getattr(node.iter.func, "id", None) == CASE_HOOK and isinstance(node.target, ast.Tuple)):
                    return tuple(elt.id for elt in node.target.elts)
    raise RuntimeError(f"{TEST_FILE}: {test_name} has no `for (...) in {CASE_HOOK}(...)` loop to select cases by")


def listed_cases(tests: ModuleType, test_name: str, arch: int) -> list[tuple]:
    """The cases the test's own enumeration yields on an arch (major version): the test runs up to its case
    hook, which stops it. Nothing before the hook touches a GPU."""
    def stop(name, cases):
        raise _Listed(cases)

    with open(os.devnull, "w") as devnull, redirect_stdout(devnull), \
            patch.multiple(tests, **{ARCH_HOOK: lambda: arch, CASE_HOOK: stop}):
        try:
            getattr(tests, test_name)()
        except _Listed as listed:
            return listed.cases
    raise RuntimeError(f"{TEST_FILE}: {test_name} returned without calling {CASE_HOOK}")


def plan(tests: ModuleType, test_name: str) -> Plan:
    fields = case_fields(tests, test_name)
    served = listed_cases(tests, test_name, SERVED_ARCH)
    seen = [{case[i] for case in served} for i in range(len(fields))]
    not_served, listed = [], set(served)
    for arch in OTHER_ARCHES:
        for case in listed_cases(tests, test_name, arch):
            if case not in listed:
                listed.add(case)
                outside = next((f"{f}={_show(v)}" for f, v, s in zip(fields, case, seen) if v not in s), "")
                not_served.append((case, f"DeepGEMM runs it on sm_{arch}0 only" + (f" ({outside})" if outside else "")))
    return Plan(fields, served, not_served)


def _failure(e: AssertionError, test_file: str) -> str:
    """The test's line that failed, and the assertion's message where it has one."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == test_file]
    where = f"{Path(TEST_FILE).name}:{frames[-1].lineno}: {frames[-1].line}" if frames else "assertion"
    message = str(e).strip()
    return f"{where}: {message}" if message else where


def run_case(tests: ModuleType, test_name: str, case: tuple) -> tuple[str, str]:
    """One case through the unmodified test function, its case hook returning that case alone, from SEED:
    (outcome, reason)."""
    def only(name, cases):
        if case not in cases:
            raise RuntimeError(f"{test_name}'s enumeration no longer yields this case")
        return [case]

    random.seed(SEED)
    torch.manual_seed(SEED)
    with open(os.devnull, "w") as devnull, redirect_stdout(devnull), \
            patch.multiple(tests, **{ARCH_HOOK: lambda: SERVED_ARCH, CASE_HOOK: only}):
        try:
            getattr(tests, test_name)()
        except AssertionError as e:
            return FAILED, _failure(e, tests.__file__)
        except drop_in.CompatError as e:
            return NOT_SERVED, str(e)
        except Exception as e:  # noqa: BLE001 - any other raise is the case's outcome, the run goes on
            first = str(e).strip().splitlines()
            return ERROR, f"{type(e).__name__}: {first[0]}" if first else type(e).__name__
    return PASSED, ""


def run_suite(tests: ModuleType, suite: str, test_name: str, source: str) -> Report:
    """Every case of one test: the sm_90 ones run (progress on stderr), the sm_100-only ones listed."""
    report, cases = Report(suite, source), plan(tests, test_name)
    for i, case in enumerate(cases.served, 1):
        outcome, reason = run_case(tests, test_name, case)
        report.add(cases.name(case), outcome, reason)
        print(f"{suite} {i}/{len(cases.served)} {outcome}: {cases.name(case)}" + (f": {reason}" if reason else ""),
              file=sys.stderr, flush=True)
    for case, reason in cases.not_served:
        report.add(cases.name(case), NOT_SERVED, reason)
    return report


def run(checkout: Path) -> list[Report]:
    """One report per DeepGEMM test (SUITES). Needs a CUDA GPU: DeepGEMM's tests allocate on 'cuda'."""
    if not torch.cuda.is_available():
        raise RuntimeError("DeepGEMM's tests allocate their inputs on 'cuda': run the conformance suite on a GPU")
    source = checkout_commit(checkout)
    with deep_gemm_tests(checkout) as tests:
        return [run_suite(tests, suite, test_name, source) for suite, test_name in SUITES.items()]
