"""dsactl verify: the rules catch every planted bug with a message that says what is
wrong, correct solutions and any legal tie order pass, skipped solutions never pass."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
from typer.testing import CliRunner

import broken_solutions as bs
from dsactl import solutions
from dsactl.cli import app
from dsactl.cli.verify import EXIT_FAILED, EXIT_NOTHING_RAN
from dsactl.definitions import CONTEST_ATTENTION, CONTEST_INDEXER, get
from dsactl.errors import DsactlError
from dsactl.harness import INT_POISON, prepare
from dsactl.solutions import Solution
from dsactl.verify import repro, rules, runner, sanitize
from dsactl.workloads import Workload, load_dataset, suite

DEVICE = runner.default_device()
TOPK = "dsa_topk_page_transform_topk2048_ps64"
INDEXER_NEXTN2 = CONTEST_INDEXER + "_nextn2"
ATTENTION_ALL = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_fp8kv_lsee_topklen_sink"


def _pages(n: int) -> int:
    return (n + 63) // 64


def indexer_workload(seq_lens, definition=CONTEST_INDEXER, **params) -> Workload:
    pages = max(_pages(s) for s in seq_lens)
    return Workload("t-indexer", definition, "test", "test",
                    {"batch_size": len(seq_lens), "num_pages": sum(_pages(s) for s in seq_lens) + 8,
                     "max_num_pages": pages}, {"seq_lens": tuple(seq_lens), **params})


def topk_workload(lengths, pattern="random", rows_per_request=1) -> Workload:
    return Workload("t-topk", TOPK, "test", "test", {"num_rows": len(lengths), "max_len": max(lengths) + 3},
                    {"lengths": tuple(lengths), "pattern": pattern, "rows_per_request": rows_per_request})


def attention_workload(definition=CONTEST_ATTENTION, valid=(0, 100, 2048)) -> Workload:
    return Workload("t-attention", definition, "test", "test", {"num_tokens": len(valid), "num_pages": 40},
                    {"pattern": "scattered", "valid": tuple(valid)})


SHORT = indexer_workload([37, 700, 2000])  # every row fits in top-k: all valid tokens are due
LONG = indexer_workload([2100, 3000, 130])  # two rows need a real top-k


def check(fn, w, trials=1) -> runner.WorkloadResult:
    return runner.verify_pair(runner.candidate(fn), w, trials=trials, device=DEVICE)


def problems(result) -> str:
    return "\n".join(result.problems)


# ---------------------------------------------------------------- correct solutions pass

@pytest.mark.parametrize("fn,w", [
    (bs.correct_indexer, SHORT),
    (bs.correct_indexer, LONG),
    (bs.correct_indexer, indexer_workload([2, 2049, 2100], INDEXER_NEXTN2)),
    (bs.correct_topk, topk_workload([3000, 64, 0, 2048])),
    (bs.correct_topk, topk_workload([3000, 2500, 1000, 4000], "nan", rows_per_request=2)),
    (bs.correct_attention, attention_workload()),
    (bs.reference_solution(ATTENTION_ALL), attention_workload(ATTENTION_ALL)),
], ids=["indexer-short", "indexer-long", "indexer-nextn2", "topk", "topk-nan-mtp", "attention", "attention-variants"])
def test_correct_solutions_pass(fn, w):
    result = check(fn, w, trials=2)
    assert result.status == "passed", problems(result)
    assert result.trials == 2 and result.matched == 1.0


# ---------------------------------------------------------------- planted bugs are caught, with what is wrong

@pytest.mark.parametrize("fn,w,says", [
    (bs.drops_index, topk_workload([3000, 5000]), "was left out while"),
    (bs.drops_index, topk_workload([100, 1000]), "slot holds -1 where a valid id is due"),
    (bs.duplicates_one, LONG, "appears twice"),
    (bs.off_by_one_page, SHORT, "which is not one of the row's"),
    (bs.minus_one_where_due, SHORT, "slots hold -1 where a valid id is due"),
    (bs.never_writes_last, attention_workload(), "output: 1 element never written"),
    (bs.returns_nan, attention_workload(), "output: 1 NaN of"),
    (bs.lse_base_e, attention_workload(), "log-sum-exp in base e (natural log), but base 2 is due"),
], ids=["drops-index-long", "drops-index-short", "duplicates", "off-by-one-page", "minus-one", "never-writes-last",
        "nan", "lse-base-e"])
def test_broken_solutions_are_caught(fn, w, says):
    result = check(fn, w)
    assert result.status == "failed"
    assert says in problems(result), problems(result)
    assert result.failing_seed == 0


def test_messages_name_the_row_and_the_id():
    text = problems(check(bs.duplicates_one, LONG))
    assert "row 0: id " in text and "appears twice" in text
    never = check(bs.never_writes_last, attention_workload(valid=(5, 6)))
    assert "first at [1, 15, 511]" in problems(never)


def test_an_error_in_the_solution_is_reported_not_raised():
    def raises(*args):
        raise RuntimeError("bad launch\nsecond line")

    result = check(raises, SHORT)
    assert result.status == "error"
    assert "RuntimeError: bad launch" in problems(result) and "second line" not in problems(result)
    missing = runner.verify_pair(runner.candidate(_solution("no_such_function")), SHORT, device=DEVICE)
    assert missing.status == "error" and "cannot load" in problems(missing) and missing.trials == 0


# ---------------------------------------------------------------- ties: any legal order passes

@pytest.mark.parametrize("pattern", ["all_equal", "two_values"])
def test_topk_any_legal_tie_order_passes(pattern):
    w = topk_workload([5000, 3000, 100], pattern)
    inputs = prepare(w, DEVICE, seed=0).args()[:-1]
    ours, theirs = torch.empty(3, 2048, dtype=torch.int32), torch.empty(3, 2048, dtype=torch.int32)
    bs.correct_topk(*inputs, ours)
    bs.other_tie_order(*inputs, theirs)
    assert not torch.equal(ours.sort(dim=1).values, theirs.sort(dim=1).values)  # a different legal set
    result = check(bs.other_tie_order, w, trials=2)
    assert result.status == "passed", problems(result)


def test_indexer_any_legal_tie_order_passes():
    w = indexer_workload([3000, 2500], pattern="ties")
    result = check(bs.other_tie_order_indexer, w)
    assert result.status == "passed", problems(result)


# ---------------------------------------------------------------- the rules themselves

def test_an_element_fails_only_beyond_both_tolerances():
    tol = rules.Tolerance()
    expected = torch.tensor([100.0, 0.001, 5.0])
    ok = rules.compare_close("x", torch.tensor([100.5, 0.0105, 5.0]), expected, tol)  # rel 0.005; abs 0.0095
    assert ok.passed and ok.max_abs == pytest.approx(0.5)
    bad = rules.compare_close("x", torch.tensor([102.0, 0.001, 5.0]), expected, tol)
    assert not bad.passed and "1 of 3 elements outside tolerance" in bad.problems[0]
    loose = rules.compare_close("x", torch.tensor([102.0, 0.001, 5.0]), expected, rules.Tolerance(matched_ratio=0.6))
    assert loose.passed and loose.matched == pytest.approx(2 / 3)


def test_lse_minus_inf_only_for_empty_rows():
    tol = rules.Tolerance()
    expected = torch.tensor([-math.inf, 3.0])
    empty = expected == -math.inf
    assert rules.compare_close("lse", torch.tensor([-math.inf, 3.0]), expected, tol, empty=empty).passed
    owed = rules.compare_close("lse", torch.tensor([0.0, 3.0]), expected, tol, empty=empty)
    assert not owed.passed and "must be -inf" in owed.problems[0]
    inf = rules.compare_close("lse", torch.tensor([-math.inf, -math.inf]), expected, tol, empty=empty)
    assert not inf.passed and "1 inf of 2 elements, first at [1]" in inf.problems[0]


def _row(visible=200, pages=(7, 3, 9, 11)):
    return rules.Row([2], torch.tensor(pages), torch.arange(visible, dtype=torch.float32), "seq_len 200")


def test_row_rules_name_each_fault():
    row, k = _row(), 256
    good = torch.full((k,), -1)
    good[56:] = torch.tensor([[7, 3, 9, 11][p // 64] * 64 + p % 64 for p in range(200)])
    assert rules.check_row(good, row, k, rules.Tolerance(), exact=True)[0] == []
    poisoned = good.clone()
    poisoned[-1] = INT_POISON
    text = rules.check_row(poisoned, row, k, rules.Tolerance(), True)[0][0]
    assert "row 2: 1 slot never written (still holding the poison value" in text
    beyond = good.clone()
    beyond[56] = 11 * 64 + 63  # on the row's last page, but position 255 >= 200
    text = "\n".join(rules.check_row(beyond, row, k, rules.Tolerance(), True)[0])
    assert f"id {11 * 64 + 63} is logical position 255, past the row's 200 visible tokens" in text


def test_next_n_rows_see_causal_lengths():
    w = indexer_workload([130, 2100], INDEXER_NEXTN2)
    call = prepare(w, DEVICE, seed=1)
    bs.correct_indexer(*call.args())
    out = call.outputs["topk_indices"]
    # Token 0 of request 0 sees 129 tokens: claim the 130th as well.
    last = int(call.inputs["block_table"][0, 2]) * 64 + 1
    out[0, 0, 129] = last
    text = "\n".join(rules.check(call.definition, call.inputs, call.outputs).problems)
    assert f"row [0, 0]: id {last} is logical position 129, past the row's 129 visible tokens" in text
    assert "token 0 of 2 sees seq_len 130 - 2 + 0 + 1 = 129 tokens" in text


# ---------------------------------------------------------------- runner: solutions, skips, quick, repro

def _solution(func: str, definitions=(TOPK,), needs_gpu=False) -> Solution:
    name = f"test-{func}" + ("-gpu" if needs_gpu else "")
    return Solution(name, definitions, "python", f"{bs.__name__}:{func}", "test", needs_gpu=needs_gpu)


def test_solutions_run_through_their_entry_and_skips_never_pass():
    gpu_only = _solution("correct_topk", needs_gpu=True)
    w = topk_workload([3000, 100])
    report = runner.verify([_solution("correct_topk"), _solution("drops_index"), gpu_only], [w], trials=1)
    status = {r.solution: r.status for r in report.results}
    assert status["test-correct_topk"] == "passed" and status["test-drops_index"] == "failed"
    if not torch.cuda.is_available():
        assert gpu_only.name not in status
        assert [(s.solution, s.reason, s.workloads) for s in report.skipped] == [(gpu_only.name, "needs a CUDA GPU", 1)]
        row = next(r for r in report.summary() if r.solution == gpu_only.name)
        assert (row.passed, row.skipped) == (0, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_without_gpu_pure_triton_runs_interpreted(monkeypatch):
    triton = Solution("t", (TOPK,), "triton", "m:f", "test")
    with_lib = Solution("t", (TOPK,), "triton", "m:f", "test", cuda_libs=("topk",))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert runner.candidate(triton).availability() == (False, "needs a CUDA GPU")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert runner.candidate(triton).availability() == (True, "runs under the Triton interpreter")
    assert not runner.candidate(with_lib).availability()[0]


def test_quick_keeps_a_few_small_workloads_of_each_class():
    ws = suite("contest")
    picked = runner.quick(ws)
    for d in {w.definition for w in ws}:
        mine = [w for w in picked if w.definition == d]
        assert 1 <= len(mine) <= runner.QUICK_PER_DEFINITION
        assert {w.label for w in mine} == {w.label for w in ws if w.definition == d}
    for w in picked:  # contest has two classes per definition: each pick is the smallest of its class
        same = [x for x in ws if x.definition == w.definition and x.label == w.label]
        assert runner._cost(w) == min(runner._cost(x) for x in same)


def test_a_failure_is_saved_and_reproduces(tmp_path):
    w = Workload("edge-attention-duplicates", CONTEST_ATTENTION, "edge", "duplicates",
                 {"num_tokens": 2, "num_pages": 40}, {"pattern": "duplicates"})
    sol = _solution("lse_base_e", definitions=(CONTEST_ATTENTION,))
    result = runner.verify_pair(runner.candidate(sol), w, trials=2, device=DEVICE, save_dir=tmp_path)
    assert result.status == "failed" and result.saved
    assert result.repro == (f"dsactl verify --solution test-lse_base_e --dataset {result.saved} "
                            f"--workload {w.uuid} --trials 1")
    (saved,) = load_dataset(result.saved)
    again = runner.verify_pair(runner.candidate(sol), saved, trials=1, device=DEVICE)
    assert again.status == "failed" and again.problems == result.problems
    unsaved = runner.verify_pair(runner.candidate(sol), w, trials=1, device=DEVICE)
    assert unsaved.repro == f"dsactl verify --solution test-lse_base_e --suite edge --workload {w.uuid} --trials 1"
    assert repro.command((), w, 0, rules.Tolerance()) == ""


# ---------------------------------------------------------------- sanitizer log parsing

MEMCHECK_LOG = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at void topk_kernel<4>(const float *, int *)+0x2c80 in /src/topk.cu:61
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f0 is out of bounds
=========
========= Invalid __global__ write of size 2 bytes
=========     at 0x70 in /src/attn.cu:12:void attn_fwd(bf16 *)
=========     by thread (0,0,0) in block (1,0,0)
=========
========= Invalid __global__ read of size 4 bytes
=========     at indexer_score_kernel+0x120 in score.py:88
=========
========= ERROR SUMMARY: 3 errors
"""

RACECHECK_LOG = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void topk_kernel<4>(const float *, int *)+0x140 in topk.cu:13
=========     and Read access at void topk_kernel<4>(const float *, int *)+0xe0 in topk.cu:40 [4 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_sanitizer_logs_give_errors_per_kernel():
    mem = sanitize.parse("memcheck", MEMCHECK_LOG)
    assert mem.per_kernel == {"topk_kernel<4>": 1, "attn_fwd": 1, "indexer_score_kernel": 1}
    assert mem.errors == 3 and not mem.clean
    race = sanitize.parse("racecheck", RACECHECK_LOG)
    assert race.per_kernel == {"topk_kernel<4>": 1} and race.errors == 1
    clean = sanitize.parse("memcheck", "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    assert clean.clean
    crashed = sanitize.parse("racecheck", "========= COMPUTE-SANITIZER\nSegmentation fault\n", exit_code=139)
    assert not crashed.clean and "did not finish" in crashed.problem


def test_missing_sanitizer_says_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(sanitize.Path, "is_file", lambda self: False)
    with pytest.raises(DsactlError, match="needs compute-sanitizer .* not on PATH"):
        sanitize.find_sanitizer()


# ---------------------------------------------------------------- the command

@pytest.fixture
def registered(monkeypatch):
    def register(*entries):
        monkeypatch.setattr(solutions, "SOLUTIONS", list(entries))
    return register


def _cli(*args):
    return CliRunner().invoke(app, ["verify", "--suite", "edge", "--definition", TOPK, "--trials", "1", *args])


def test_cli_passes_fails_and_reports_json(registered, tmp_path):
    registered(_solution("correct_topk"), _solution("drops_index"))
    ok = _cli("--solution", "test-correct_topk", "--quick", "--json", str(tmp_path / "ok.json"))
    assert ok.exit_code == 0, ok.output
    report = json.loads((tmp_path / "ok.json").read_text())
    assert report["counts"]["passed"] == len(report["results"]) >= 1 and report["counts"]["failed"] == 0
    assert "summary" in ok.output and "workloads" in ok.output

    bad = _cli("--quick", "--json", str(tmp_path / "bad.json"))
    assert bad.exit_code == EXIT_FAILED, bad.output
    report = json.loads((tmp_path / "bad.json").read_text())
    failed = [r for r in report["results"] if r["status"] == "failed"]
    assert failed and all(r["solution"] == "test-drops_index" for r in failed)
    assert "reproduce: dsactl verify --solution test-drops_index --suite edge --workload" in bad.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cli_without_gpu_lists_skips_and_runs_nothing_as_passed(registered):
    registered(_solution("correct_topk", needs_gpu=True))
    result = _cli()
    assert result.exit_code == EXIT_NOTHING_RAN, result.output
    assert "needs a CUDA GPU" in result.output and "0 passed" in result.output
    sanitize_run = _cli("--sanitize")
    assert isinstance(sanitize_run.exception, DsactlError) and "needs a CUDA GPU" in str(sanitize_run.exception)


BUNDLE_TOPK = '''import torch


def run(scores, lengths, block_table, row_to_batch, topk_indices):
    k = topk_indices.shape[-1]
    topk_indices.fill_(-1)
    for r in range(scores.shape[0]):
        n, b = int(lengths[r]), int(row_to_batch[r])
        if n <= 0:
            continue
        key = scores[r, :n].double()
        key = torch.where(key == float("-inf"), torch.finfo(torch.float64).min, key)
        key = torch.where(torch.isnan(key), float("-inf"), key)
        chosen = torch.topk(key, min(k, n)).indices{drop}
        ids = block_table[b, chosen // 64] * 64 + chosen % 64
        topk_indices[r, : ids.numel()] = ids.to(torch.int32)
'''


@pytest.mark.parametrize("drop,code", [("", 0), ("[1:]", 1)], ids=["correct", "drops-best"])
def test_cli_verifies_a_bundle(tmp_path, drop, code):
    pytest.importorskip("dsactl.pack.loader")
    bundle = tmp_path / "topk.json"
    bundle.write_text(json.dumps({
        "name": f"bundle-topk{drop and '-broken'}", "definition": TOPK, "author": "test",
        "spec": {"language": "python", "target_hardware": ["cpu", "cuda"], "entry_point": "main.py::run",
                 "dependencies": [], "destination_passing_style": True},
        "sources": [{"path": "main.py", "content": BUNDLE_TOPK.replace("{drop}", drop)}],
        "description": "torch.topk in a bundle"}))
    result = _cli("--bundle", str(bundle), "--quick")
    assert result.exit_code == code, result.output
    assert ("0 failed" in result.output) == (code == 0)
    if code:
        assert f"reproduce: dsactl verify --bundle {bundle} --suite edge --workload" in result.output


FAKE_SANITIZER = """#!/bin/sh
# Stands in for compute-sanitizer: runs the command, then prints the tool's summary line.
tool=$2
shift 2
if [ "$1" = "--print-limit" ]; then shift 2; fi
"$@"
rc=$?
if [ "$tool" = racecheck ]; then
  echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: 0 errors"
fi
exit $rc
"""


def test_sanitizer_skips_the_pytorch_baselines_unless_named():
    from dsactl.cli.verify import _candidates, sanitized_solutions

    cands, explicit = _candidates([], None, {TOPK})
    assert {c.name for c in cands} >= {"dsactl-topk", "torch-topk"} and not explicit
    assert sanitized_solutions([], explicit, cands) == ["dsactl-topk"]
    cands, explicit = _candidates(["torch-topk"], None, {TOPK})
    assert sanitized_solutions(["torch-topk"], explicit, cands) == ["torch-topk"]


def test_sanitize_runs_the_same_calls_in_a_child(tmp_path, monkeypatch):
    pytest.importorskip("dsactl.pack.loader")
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    bundle = tmp_path / "topk.json"
    bundle.write_text(json.dumps({
        "name": "bundle-topk", "definition": TOPK, "author": "test",
        "spec": {"language": "python", "target_hardware": ["cpu", "cuda"], "entry_point": "main.py::run"},
        "sources": [{"path": "main.py", "content": BUNDLE_TOPK.replace("{drop}", "")}]}))
    reports = sanitize.run(["--suite", "edge", "--definition", TOPK, "--bundle", str(bundle), "--quick"])
    assert [r.tool for r in reports] == ["memcheck", "racecheck"]
    assert all(r.clean for r in reports), [(r.problem, r.log_tail) for r in reports]
    assert any("calls-only: 2 calls, 0 raised" in line for line in reports[0].log_tail)


@pytest.mark.parametrize("option,value", [("--atol", "-1"), ("--rtol", "-0.5"), ("--atol", "nan"), ("--rtol", "inf")])
def test_cli_refuses_a_meaningless_tolerance(option, value):
    result = _cli(option, value)
    assert isinstance(result.exception, DsactlError), result.output
    assert str(result.exception).startswith(f"{option[2:]} must be a finite number >= 0")
    assert "verify:" not in result.output  # refused before anything ran


def test_a_workload_id_is_found_in_any_suite_unless_one_is_named():
    from dsactl import workloads

    (w,) = workloads.select(workload_ids=["edge-topk-mtp"])
    assert (w.uuid, w.suite) == ("edge-topk-mtp", "edge")
    with pytest.raises(DsactlError, match=r"no workload 'edge-topk-mtp' in suite contest; --suite edge has "
                                          r"edge-topk-mtp$"):
        workloads.select("contest", workload_ids=["edge-topk-mtp"])
    assert len(workloads.select()) == len(suite("contest"))


def test_the_headline_accounts_for_every_selected_workload():
    gpu_only = _solution("correct_topk", needs_gpu=True)
    ws = [topk_workload([3000, 100]), topk_workload([70, 9]), topk_workload([5, 5, 5])]
    ws = [Workload(f"t-{i}", w.definition, w.suite, w.label, w.axes, w.params) for i, w in enumerate(ws)]
    chosen, left_out = runner.quick_subset(ws, "outside the --quick subset")
    assert len(chosen) == runner.QUICK_PER_DEFINITION and left_out[0].workloads == 1
    report = runner.verify([_solution("correct_topk"), gpu_only], chosen, trials=1, left_out=left_out)
    assert report.selected == 3 and report.workloads_ran == 2
    assert report.not_run() == {"outside the --quick subset": 1}
    if not torch.cuda.is_available():
        assert report.headline() == ("2 of 3 workloads ran, 1 did not (1 outside the --quick subset); "
                                     "2 passed, 0 failed, 0 errors, 2 skipped (2 needs a CUDA GPU)")
    alone = runner.verify([gpu_only], chosen, trials=1)
    if not torch.cuda.is_available():
        assert alone.not_run() == {"every solution serving it was skipped": 2}


# ---------------------------------------------------------------- the hostile suite

HOSTILE = suite("hostile")


def _hostile(label: str | None = None, stage: str | None = None) -> list[Workload]:
    return [w for w in HOSTILE if (label is None or w.label == label) and (stage is None or stage in w.definition)]


@pytest.mark.parametrize("w", HOSTILE, ids=lambda w: w.uuid)
def test_hostile_references_pass_the_rules(w):
    # The rules and the references agree on what masked values give (the same as -1).
    call = prepare(w, "cpu", 0)
    verdict = rules.check(call.definition, call.inputs, call.definition.run_reference(call.inputs))
    assert verdict.passed, verdict.problems


def test_hostile_suite_covers_every_corruption_and_ends_clean():
    from dsactl.workloads.hostile import KINDS

    kinds = {w.params.get("hostile") for w in HOSTILE}
    assert kinds - {None} == set(KINDS)
    stages = ("indexer", "attention", "topk")
    assert all(any(s in w.definition for w in _hostile("empty")) for s in stages)
    tail = HOSTILE[-len(_hostile("clean")):]
    assert {w.label for w in tail} == {"clean"} and all(any(s in w.definition for w in tail) for s in stages)


@pytest.mark.parametrize("w", _hostile(stage="topk_page"), ids=lambda w: w.uuid)
def test_hostile_topk_model_of_the_kernel_passes(w):
    from dsactl.kernels.topk.model import topk_page_transform_model

    call = prepare(w, "cpu", 0)
    i = call.inputs
    out, _ = topk_page_transform_model(i["scores"], i["lengths"], i["block_table"], i["row_to_batch"], 2048, 2,
                                       8192)
    verdict = rules.check(call.definition, i, {"topk_indices": out})
    assert verdict.passed, verdict.problems


def test_hostile_rules_refuse_unmasked_and_missing_ids():
    w = next(w for w in HOSTILE if w.uuid == "hostile-topk-bad-pages-fp32")
    call = prepare(w, "cpu", 0)
    i = call.inputs
    ref = call.definition.run_reference(i)["topk_indices"]
    assert (ref == -1).any()
    raw = ref.clone()  # an id of no page of the row where a masked one is due
    row, slot = (int(x) for x in (ref[:, :100] == -1).nonzero()[0])
    raw[row, slot] = 2**31 - 1
    assert any("not one of the row's" in p for p in rules.check(call.definition, i, {"topk_indices": raw}).problems)
    short = ref.clone()  # a due valid id dropped: its -1 cannot stand for a masked position as good
    short[0, (short[0] != -1).nonzero()[0]] = -1
    assert any("not a top-2048 set" in p for p in rules.check(call.definition, i, {"topk_indices": short}).problems)
    clean = prepare(HOSTILE[-1], "cpu", 0)  # no masked position: a -1 for a due id is named as such
    out = clean.definition.run_reference(clean.inputs)["topk_indices"]
    out[2, (out[2] != -1).nonzero()[0]] = -1
    assert any("row 2: 100 valid ids are due" in p
               for p in rules.check(clean.definition, clean.inputs, {"topk_indices": out}).problems)


def test_hostile_nan_elements_without_an_answer_are_not_judged():
    w = next(w for w in HOSTILE if w.uuid == "hostile-attention-nan-h16-bf16")
    call = prepare(w, "cpu", 0)
    expected = call.definition.run_reference(call.inputs)
    assert not torch.isfinite(expected["output"].float()).all()
    garbage = {"output": torch.where(torch.isfinite(expected["output"]), expected["output"], 7.0).bfloat16(),
               "lse": expected["lse"]}
    assert rules.check(call.definition, call.inputs, garbage).passed
    wrong = {"output": expected["output"].clone(), "lse": expected["lse"]}
    wrong["output"][2, 0, 0] += 1.0  # a row without NaN
    assert not rules.check(call.definition, call.inputs, wrong).passed


def test_hostile_skips_baselines_with_the_reason():
    torch_topk = runner.candidate(solutions.get("torch-topk"))
    pairs, skipped = runner.plan([torch_topk], _hostile(stage="topk_page"))
    assert [w.label for _, w in pairs] == ["clean"]
    assert {s.reason for s in skipped} == {runner.HOSTILE_BASELINE}


@pytest.mark.gpu
def test_hostile_suite_passes_on_the_gpu_and_a_clean_workload_after_it():
    report = runner.verify([runner.candidate(s) for s in solutions.SOLUTIONS if not s.baseline], HOSTILE, trials=2)
    assert report.ok and report.count("passed") >= len(HOSTILE), [r.problems for r in report.results
                                                                  if r.status != "passed"]
    torch.cuda.synchronize()


@pytest.mark.parametrize("w", _hostile(stage="indexer"), ids=lambda w: w.uuid)
def test_hostile_indexer_solution_passes(w, monkeypatch):
    from dsactl.kernels.indexer import solution
    from dsactl.kernels.topk import torch_baseline

    if DEVICE == "cpu":  # the CUDA top-k cannot run here: its torch baseline masks the same way
        monkeypatch.setattr(solution, "topk_page_transform",
                            lambda scores, lengths, table, r2b, out, k, num_pages: torch_baseline.topk_page_transform(
                                scores, lengths, table, r2b, out, num_pages=num_pages))
    call = prepare(w, DEVICE, 0)
    solution.dsa_topk_indexer(*call.args())
    verdict = rules.check(call.definition, call.inputs, call.outputs)
    assert verdict.passed, verdict.problems


def test_cli_hostile_suite_runs_whole_and_lists_each_skip():
    result = CliRunner().invoke(app, ["verify", "--suite", "hostile", "--definition", "dsa_topk_page_transform*",
                                      "--trials", "1"])
    assert result.exit_code == 0, result.output
    assert "--quick" not in result.output.split("verify:")[-1]  # no subset: every workload accounted for
    if DEVICE == "cpu":
        assert runner.HOSTILE_BASELINE in " ".join(result.output.split()) and "needs a CUDA GPU" in result.output


@pytest.mark.parametrize("solution,workload", [("dsactl-attention", "edge-attention-scattered-h16-bf16"),
                                               ("dsactl-topk", "edge-topk-len65")])
def test_cli_bundle_runs_where_plain_verify_runs(tmp_path, solution, workload):
    # A packed bundle runs exactly where its registered solution runs: interpreted on a CPU for
    # pure Triton, skipped with the same reason for CUDA (built from the bundle's sources on a GPU).
    definition = get(next(w.definition for w in suite("edge") if w.uuid == workload)).name
    bundle = tmp_path / "bundle.json"
    packed = CliRunner().invoke(app, ["pack", "-d", definition, "-s", solution, "-o", str(bundle)])
    assert packed.exit_code == 0, packed.output
    common = ["verify", "--workload", workload, "--trials", "1"]
    plain = CliRunner().invoke(app, [*common, "--solution", solution])
    packed_run = CliRunner().invoke(app, [*common, "--bundle", str(bundle)])
    assert packed_run.exit_code == plain.exit_code, packed_run.output
    headline = [r.output.split("verify: ")[-1].split(";")[0] for r in (plain, packed_run)]
    assert headline[0] == headline[1], headline
    if DEVICE == "cpu":
        ran = solution == "dsactl-attention"
        assert ("1 passed" in packed_run.output) == ran and ("needs a CUDA GPU" in packed_run.output) != ran
