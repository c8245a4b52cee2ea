"""dsactl.conformance: the reports' JSON and how the FlashMLA runner takes a test file's cases without running
its own loop. The peers' cases themselves need a GPU (profiles/reproduce.sh conformance)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

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
