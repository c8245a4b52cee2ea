"""dsactl.conformance: the reports' JSON and how the FlashMLA runner takes a test file's cases without running
its own loop. The peers' cases themselves need a GPU (profiles/reproduce.sh conformance)."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from dsactl.conformance import flash_mla as runner
from dsactl.conformance.report import ERROR, FAILED, NOT_SERVED, PASSED, Report, write


def test_reports_merge_into_one_file_a_suite_each_with_the_cases_that_did_not_pass(tmp_path):
    path = tmp_path / "conformance.json"
    first = Report("peer.decode", "abc")
    for outcome in (PASSED, PASSED, FAILED, ERROR):
        first.add(f"case-{outcome}", outcome, "why" if outcome != PASSED else "")
    first.add("model1", NOT_SERVED, "MODEL1 layout")
    other = Report("peer.prefill", "abc")
    other.add("only", PASSED)
    write(path, [first, other])
    rerun = Report("peer.decode", "def")
    rerun.add("again", PASSED)
    write(path, [rerun])

    data = json.loads(path.read_text())
    assert data["peer.prefill"]["passed"] == data["peer.prefill"]["total"] == 1
    assert data["peer.decode"] == {"suite": "peer.decode", "source": "def", "passed": 1, "total": 1, "failed": 0,
                                   "errors": 0, "not_served": {}, "cases": []}
    summary = first.summary()
    assert (summary["passed"], summary["total"], summary["failed"], summary["errors"]) == (2, 4, 1, 1)
    assert summary["not_served"] == {"MODEL1 layout": 1}
    with pytest.raises(ValueError):
        first.add("x", "skipped")


def test_the_prefill_file_is_loaded_with_its_case_lists_and_without_its_loop(tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / f"{runner.PREFILL_TEST}.py").write_text(textwrap.dedent('''
        ran = []
        def run_test(p):
            ran.append(p)
            return True
        if __name__ == '__main__':
            correctness_cases = [1, 2]
            testcases = correctness_cases + [3]
            for test in testcases:
                run_test(test)
            raise SystemExit(1)
    '''))
    monkeypatch.delitem(sys.modules, runner.PREFILL_TEST, raising=False)
    module = runner.load_prefill(tmp_path)
    assert module.correctness_cases == [1, 2] and module.testcases == [1, 2, 3]
    assert module.ran == [] and module.run_test(5) and module.ran == [5]


def test_the_timed_cases_are_the_v32_performance_cases_with_the_seeds_flash_mla_gives_them(tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    fake_kk = textwrap.dedent('''
        import dataclasses

        class kk:  # kernelkit's Counter
            class Counter:
                def __init__(self):
                    self.n = -1
                def next(self):
                    self.n += 1
                    return self.n

        @dataclasses.dataclass
        class P:
            d_qk: int
            num_runs: int = 0
            seed: int = -1
    ''')
    (tests / f"{runner.DECODE_TEST}.py").write_text(fake_kk + textwrap.dedent('''
        _counter = kk.Counter()

        @dataclasses.dataclass
        class Raw:
            d_qk: int
            num_runs: int
            def to_test_param(self):
                return P(self.d_qk, self.num_runs)

        def gen_testcase():
            return [Raw(576, 0), Raw(512, 10), Raw(576, 10)]
    '''))
    (tests / f"{runner.PREFILL_TEST}.py").write_text(fake_kk + textwrap.dedent('''
        _counter = kk.Counter()
        if __name__ == '__main__':
            correctness_cases = [P(576), P(512)]
            correctness_cases_with_features = []
            corner_cases = [P(576)]
            performance_cases = [P(576, 10), P(512, 10), P(576, 10)]
            for test in correctness_cases:
                pass
    '''))
    monkeypatch.syspath_prepend(str(tests))
    for name in (runner.DECODE_TEST, runner.PREFILL_TEST):
        monkeypatch.delitem(sys.modules, name, raising=False)
    cases = runner.performance_cases(tmp_path)
    assert [(test, p.d_qk, p.seed) for test, p in cases] == [("decode", 576, 2), ("prefill", 576, 3),
                                                             ("prefill", 576, 5)]


def test_the_engine_layout_holds_the_same_values_in_contiguous_pages_q_and_indices():
    """FlashMLA's tests pad each FP8 cache page by a row and pad q and the indices in every dimension; the engine
    layout times the same values as engines allocate them."""
    @dataclasses.dataclass
    class Scope:  # the fields of lib.KVScope the layout touches
        blocked_k_quantized: torch.Tensor
        indices_in_kvcache: torch.Tensor
        block_table: torch.Tensor

    @dataclasses.dataclass
    class Case:  # lib.TestcaseForDecode's
        q: torch.Tensor
        kv_scope: Scope
        extra_kv_scope: Scope | None

    g = torch.Generator().manual_seed(3)
    padded = torch.randint(-128, 128, (5, 65, 1, 656), generator=g, dtype=torch.int8)[:, :64]
    q = torch.randn(3, 3, 17, 704, generator=g)[:2, :2, :16, :576]
    ids = torch.randint(-1, 320, (3, 3, 192), generator=g, dtype=torch.int32)[:2, :2, :64]
    table = torch.arange(5, dtype=torch.int32)
    case = Case(q, Scope(padded, ids, table), None)
    engine = runner.engine_layout(case)
    assert engine.q.is_contiguous() and torch.equal(engine.q, q)
    assert engine.kv_scope.blocked_k_quantized.is_contiguous() and torch.equal(engine.kv_scope.blocked_k_quantized, padded)
    assert engine.kv_scope.indices_in_kvcache.is_contiguous() and torch.equal(engine.kv_scope.indices_in_kvcache, ids)
    assert engine.kv_scope.block_table is table and engine.extra_kv_scope is None
    assert not case.q.is_contiguous() and case.kv_scope.blocked_k_quantized is padded  # the tests' layout kept
    assert case.kv_scope.indices_in_kvcache is ids
    both = runner.engine_layout(Case(q, Scope(padded, ids, table), Scope(padded[:2], ids[:1], table)))
    assert both.extra_kv_scope.blocked_k_quantized.is_contiguous()
    assert both.extra_kv_scope.indices_in_kvcache.is_contiguous()


def test_timing_without_flash_mla_built_in_the_checkout_says_so(tmp_path, capsys, monkeypatch):
    from dsactl.conformance.__main__ import main

    (tmp_path / "tests").mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["flash_mla", "--checkout", str(tmp_path), "--time", str(tmp_path / "t.csv")]) == 2
    assert "FlashMLA does not import from there" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()


def test_outputs_apart_is_the_largest_difference_with_equal_infinities_and_nans_at_zero():
    inf, nan = float("inf"), float("nan")
    ours = (torch.tensor([1.0, -inf, nan, 2.0]), torch.tensor([[inf, 0.5]]).bfloat16())
    same = (torch.tensor([1.0, -inf, nan, 2.0]), torch.tensor([[inf, 0.5]]).bfloat16())
    assert runner.max_abs_diff(ours, same) == 0.0
    assert runner.max_abs_diff(ours, (torch.tensor([1.25, -inf, nan, 1.5]), same[1])) == 0.5
    for far in (torch.tensor([1.0, inf, nan, 2.0]), torch.tensor([1.0, -inf, 0.0, 2.0]),
                torch.tensor([1.0, 3.0, nan, 2.0])):
        assert runner.max_abs_diff(ours, (far, same[1])) == inf
    assert runner.max_abs_diff(ours, (torch.zeros(5), same[1])) == inf  # another shape
    with pytest.raises(ValueError):
        runner.max_abs_diff(ours, same[:1])  # another number of outputs


def test_each_timed_case_compares_the_two_modules_outputs_of_that_call(monkeypatch):
    """The timing run calls each module once untimed and records how far the outputs lie apart, per case and
    layout, beside the times (a fake FlashMLA lib and timer: the real ones need a GPU)."""
    from dsactl.bench import timing
    from dsactl.compat import flash_mla as ours

    real = types.SimpleNamespace(get_mla_metadata=lambda: (object(), None))
    lib = types.ModuleType("lib")
    lib.generate_testcase_for_decode = lambda p: torch.full((2, 3), float(p))
    lib.generate_testcase = lambda p: torch.full((4,), float(p))
    # ours answers the test case's values, FlashMLA those values + 0.25 in its second output.
    lib.run_flash_mla_decode = lambda p, t, meta, splits: (t, t + (0.25 if lib.flash_mla is real else 0.0))
    lib.run_flash_mla_sparse_fwd = lambda p, t, p_sum: (t, t, t if lib.flash_mla is ours else -t)
    monkeypatch.setitem(sys.modules, "lib", lib)
    monkeypatch.setattr(runner, "install", lambda checkout: None)
    monkeypatch.setattr(runner, "performance_cases", lambda checkout: [("decode", 1), ("prefill", 3)])
    monkeypatch.setattr(runner, "engine_layout", lambda t: t.clone())
    monkeypatch.setattr(timing, "pick_method", lambda: "fake")
    monkeypatch.setattr(timing, "L2Flusher", lambda: None)
    monkeypatch.setattr(timing, "measure", lambda fn, method, iters, warmup, flusher: (
        method, [10.0 if lib.flash_mla is ours else 20.0] * iters))
    so_far = []
    rows = runner.time_performance_cases(Path("."), real, lambda done: so_far.append(len(done)))
    assert so_far == [1, 2, 3]  # each row handed on as it is timed
    seen = [(r["test"], r["layout"], r["dsactl_us"], r["flashmla_us"], r["speedup"], r["max_abs_diff"]) for r in rows]
    assert seen == [("decode", runner.TESTS_LAYOUT, 10.0, 20.0, 2.0, 0.25),
                    ("decode", runner.ENGINE_LAYOUT, 10.0, 20.0, 2.0, 0.25),
                    ("prefill", runner.TESTS_LAYOUT, 10.0, 20.0, 2.0, 6.0)]
    assert set(rows[0]) == set(runner.TIMING_COLUMNS)


def test_a_timing_run_cut_short_keeps_the_cases_it_finished(tmp_path, monkeypatch, capsys):
    from dsactl.conformance import __main__ as cli

    row = {"test": "decode", "layout": runner.TESTS_LAYOUT, "case": "P(b=2)", "dsactl_us": 10.0, "flashmla_us": 12.0,
           "speedup": 1.2, "max_abs_diff": 0.0}

    def cut_short(checkout, real, after_row):
        after_row([row])
        raise KeyboardInterrupt  # the machine's time limit

    monkeypatch.setattr(cli, "_import_built", lambda checkout, name, needs: (object(), ""))
    monkeypatch.setattr(runner, "time_performance_cases", cut_short)
    monkeypatch.setattr(runner, "checkout_commit", lambda checkout: "9241ae3")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    (tmp_path / "tests").mkdir()
    path = tmp_path / "cases.csv"
    with pytest.raises(KeyboardInterrupt):
        cli.main(["flash_mla", "--checkout", str(tmp_path), "--time", str(path)])
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# command: python -m dsactl.conformance flash_mla") and "# gpu: NVIDIA H100" in lines[1]
    assert lines[3] == ",".join(runner.TIMING_COLUMNS) and lines[4].startswith("decode,tests,P(b=2),10.0,12.0,1.2,0.0")
    assert "1.200" in capsys.readouterr().out
