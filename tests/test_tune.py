"""dsactl tune and the tuned-config tables: the table round-trips, the launchers use a matching entry and
fall back to the hand-picked choice otherwise, candidates are verified before they are timed, and the
fastest verified one is written with the hand-picked choice's time when it beats it by the margin. The GPU
tests tune real shapes, one with planted faster, slower and wrong candidates under bench's timer."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
import torch

from dsactl.errors import DsactlError
from dsactl.kernels import tuned
from dsactl.kernels.attention import hopper_mla, mma_mla
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.kernels.indexer import score
from dsactl.tune import families, search, space, sweep
from dsactl.workloads import Workload

H200 = ("NVIDIA H200", (9, 0))
SMS = tsm.H200_NUM_SMS
# A small attention call the interpreter runs in well under a second: 16 heads, topk 128, two tokens.
SMALL = "dsa_sparse_attention_h16_ckv512_kpe64_topk128_ps64"
SMALL_BUCKET = tsm.tuning_bucket(2, 16, 128, False)
TUNED_KNOBS = {"block_h": 16, "block_n": 32, "num_warps": 4, "num_stages": 1, "f16": False, "num_splits": 2}
ATTENTION = families.get("attention-triton")
# The CUDA attention kernels' split-count tables, each with a shape it serves: (tokens, heads, topk, fp8kv).
SPLIT_KERNELS = [pytest.param(hopper_mla, (8, 64, 2048, True), id="hopper"),
                 pytest.param(mma_mla, (8, 16, 2048, True), id="mma")]


def _entry(bucket=SMALL_BUCKET, config=TUNED_KNOBS, gpu=H200):
    return tuned.Entry(gpu[0], gpu[1], bucket, dict(config), {"command": "dsactl tune", "us": 1.0})


@pytest.fixture
def attention_table(monkeypatch, tmp_path):
    """tsm.TUNED read from a file of the test's own, on a CPU device taken for an H200."""
    path = tmp_path / "triton_sparse_mla.json"
    monkeypatch.setattr(tsm, "TUNED", tuned.Table(path))
    monkeypatch.setattr(tsm, "device_identity", lambda device: H200)
    return path


def test_table_round_trips_and_merges_per_gpu(tmp_path):
    path = tmp_path / "t.json"
    entries = [_entry(), _entry("h16-bf16-topk128-t4"), _entry(gpu=("NVIDIA B200", (10, 0)))]
    tuned.write(path, "triton_sparse_mla", entries)
    assert tuned.read(path) == sorted(entries, key=lambda e: e.key)
    text = path.read_text()
    tuned.write(path, "triton_sparse_mla", tuned.read(path))
    assert path.read_text() == text  # byte for byte: a re-write is no diff
    newer = _entry(config={**TUNED_KNOBS, "num_splits": 1})
    merged = tuned.merge(tuned.read(path), [newer])
    assert len(merged) == 3 and newer in merged and _entry() not in merged
    assert tuned.read(tmp_path / "absent.json") == []


def test_shipped_tables_are_well_formed():
    for family in families.FAMILIES:
        assert family.table_path.is_file(), family.table_path
        tuned.read(family.table_path)
        assert json.loads(family.table_path.read_text())["kernel"] == family.kernel_name


def test_attention_launcher_uses_the_matching_entry(attention_table):
    tuned.write(attention_table, "triton_sparse_mla", [_entry()])
    assert tsm.launch_plan(2, 16, 128, False, torch.device("cpu")) == (tsm.Config(16, 32, 4, 1), 2)
    # Another bucket of the same GPU: the hand-picked choice, unchanged.
    assert tsm.launch_plan(8, 16, 128, False, torch.device("cpu")) == tsm.hand_picked(8, 16, 128, False, SMS)


@pytest.mark.parametrize("identity", [("NVIDIA B200", (9, 0)), ("NVIDIA H200", (10, 0)), None],
                         ids=["other-name", "other-capability", "no-gpu"])
def test_attention_launcher_falls_back_on_an_unknown_gpu(attention_table, monkeypatch, identity):
    tuned.write(attention_table, "triton_sparse_mla", [_entry()])
    monkeypatch.setattr(tsm, "device_identity", lambda device: identity)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tsm.launch_plan(2, 16, 128, False, torch.device("cpu")) == tsm.hand_picked(2, 16, 128, False, SMS)


@pytest.mark.parametrize("text", ["{not json", '{"entries": {}}', '{"entries": [{"gpu": 1}]}', ""],
                         ids=["syntax", "entries-not-a-list", "bad-entry", "empty-file"])
def test_attention_launcher_falls_back_on_a_malformed_table_and_warns_once(attention_table, text):
    attention_table.write_text(text)
    hand = tsm.hand_picked(2, 16, 128, False, SMS)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert tsm.launch_plan(2, 16, 128, False, torch.device("cpu")) == hand
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tsm.launch_plan(2, 16, 128, False, torch.device("cpu")) == hand


def test_an_entry_whose_launch_failed_is_dropped_once_for_the_process(tmp_path):
    """Table.drop: the entry in play is forgotten with one warning and lookups fall back; no entry, another
    GPU's, or a forced configuration (tune's candidate) is not dropped, so the launcher re-raises."""
    path = tmp_path / "t.json"
    tuned.write(path, "triton_sparse_mla", [_entry()])
    table = tuned.Table(path)
    with table.forced(TUNED_KNOBS):
        assert not table.drop(H200, SMALL_BUCKET, "out of shared memory")
    assert not table.drop(("NVIDIA B200", (10, 0)), SMALL_BUCKET, "out of shared memory")
    assert not table.drop(None, SMALL_BUCKET, "out of shared memory")
    assert table.lookup(H200, SMALL_BUCKET) == TUNED_KNOBS
    with pytest.warns(RuntimeWarning, match=f"entry {SMALL_BUCKET} did not launch .out of shared memory"):
        assert table.drop(H200, SMALL_BUCKET, "out of shared memory")
    assert table.lookup(H200, SMALL_BUCKET) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not table.drop(H200, SMALL_BUCKET, "out of shared memory")  # already gone: the hand-picked failed
    assert tuned.read(path) == [_entry()]  # the file is left as it is


def test_a_missing_table_is_the_hand_picked_choice_silently(attention_table):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tsm.launch_plan(2, 16, 128, False, torch.device("cpu")) == tsm.hand_picked(2, 16, 128, False, SMS)


@pytest.mark.parametrize("change", [{"block_n": 48}, {"num_splits": 0}, {"num_splits": 65}, {"f16": True},
                                    {"block_h": 32}, {"num_warps": 2}, {"num_stages": 7}, {"block_n": "32"},
                                    {"extra": 1}])
def test_attention_entries_outside_the_invariants_are_refused(attention_table, change):
    tuned.write(attention_table, "triton_sparse_mla", [_entry(config={**TUNED_KNOBS, **change})])
    with pytest.warns(RuntimeWarning, match="refused"):
        assert tsm.launch_plan(2, 16, 128, False, torch.device("cpu")) == tsm.hand_picked(2, 16, 128, False, SMS)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tsm.launch_plan(2, 16, 128, False, torch.device("cpu"))


def test_a_call_with_a_tuned_entry_still_matches_the_reference(attention_table, monkeypatch):
    from dsactl.verify import runner

    tuned.write(attention_table, "triton_sparse_mla", [_entry()])
    used = []
    plan = tsm.launch_plan
    monkeypatch.setattr(tsm, "launch_plan", lambda *a: used.append(plan(*a)) or used[-1])
    w = Workload("small", SMALL, "test", "full", {"num_tokens": 2, "num_pages": 8})
    result = runner.verify_pair(runner.Candidate("triton", fn=search.solution_for(SMALL).load()), w, 1,
                                device="cpu")
    assert result.status == runner.PASSED, result.problems
    assert used == [(tsm.Config(16, 32, 4, 1), 2)]


def _splits(kernel, shape) -> int:
    num_tokens, heads, topk, fp8kv = shape
    device = torch.device("cpu")
    if kernel is mma_mla:  # FP8 KV only
        return kernel.launch_splits(num_tokens, heads, topk, device)
    return kernel.launch_splits(num_tokens, heads, topk, fp8kv, device)


@pytest.fixture
def split_table(monkeypatch, tmp_path):
    """A CUDA kernel's TUNED read from a file of the test's own, on a CPU device taken for an H200."""
    def install(kernel):
        path = tmp_path / f"{kernel.LIBRARY}.json"
        monkeypatch.setattr(kernel, "TUNED", tuned.Table(path))
        return path

    monkeypatch.setattr(tsm, "device_identity", lambda device: H200)
    return install


@pytest.mark.parametrize("kernel, shape", SPLIT_KERNELS)
def test_cuda_launchers_take_their_tables_split_count_and_fall_back(split_table, monkeypatch, kernel, shape):
    num_tokens, heads, topk, fp8kv = shape
    formula = kernel.num_splits_for(num_tokens, heads, topk, SMS)
    tuned.write(split_table(kernel), kernel.LIBRARY, [_entry(tsm.tuning_bucket(*shape), {"num_splits": formula + 3})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _splits(kernel, shape) == formula + 3
        longer = (num_tokens * 8, heads, topk, fp8kv)  # another bucket of the same GPU: the formula
        assert _splits(kernel, longer) == kernel.num_splits_for(num_tokens * 8, heads, topk, SMS)
        monkeypatch.setattr(tsm, "device_identity", lambda device: ("NVIDIA B200", (10, 0)))
        assert _splits(kernel, shape) == formula


@pytest.mark.parametrize("kernel, shape", SPLIT_KERNELS)
@pytest.mark.parametrize("config", [{"num_splits": 0}, {"num_splits": 65}, {"num_splits": 2.0}, {"num_splits": True},
                                    {"num_splits": 2, "num_warps": 4}, {}])
def test_cuda_split_entries_outside_the_combines_range_are_refused(split_table, kernel, shape, config):
    tuned.write(split_table(kernel), kernel.LIBRARY, [_entry(tsm.tuning_bucket(*shape), config)])
    formula = kernel.num_splits_for(*shape[:3], SMS)
    with pytest.warns(RuntimeWarning, match="refused"):
        assert _splits(kernel, shape) == formula
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _splits(kernel, shape) == formula


def test_indexer_launcher_uses_the_matching_entry_and_falls_back(monkeypatch, tmp_path):
    path = tmp_path / "score.json"
    monkeypatch.setattr(score, "TUNED", tuned.Table(path))
    monkeypatch.setattr(score, "device_identity", lambda device: H200)
    knobs = {"block_n": 64, "num_warps": 8, "num_stages": 4, "programs_per_sm": 2}
    tuned.write(path, "score", [_entry(score.tuning_bucket(8, 1, 64, 4096), knobs)])
    got = score.launch_config(8, 1, 64, 4096, torch.device("cpu"))
    assert (got.block_n, got.num_warps, got.num_stages) == (64, 8, 4)
    assert got.splits * got.tokens_per_program >= 4096 and got.splits <= SMS * 2 // 8
    assert score.launch_config(8, 1, 64, 32768, torch.device("cpu")) == score.choose_config(8, 1, 64, 32768, SMS)
    monkeypatch.setattr(score, "device_identity", lambda device: ("NVIDIA H100", (9, 0)))
    assert score.launch_config(8, 1, 64, 4096, torch.device("cpu")) == score.choose_config(8, 1, 64, 4096, SMS)
    monkeypatch.setattr(score, "device_identity", lambda device: H200)
    tuned.write(path, "score", [_entry(score.tuning_bucket(8, 1, 64, 4096), {**knobs, "block_n": 96})])
    score.TUNED.reload()
    with pytest.warns(RuntimeWarning, match="refused"):
        assert score.launch_config(8, 1, 64, 4096, torch.device("cpu")) == score.choose_config(8, 1, 64, 4096, SMS)


def test_candidate_spaces_hold_the_hand_picked_choice_and_only_what_the_launchers_accept():
    contest = [Workload(f"c{t}", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64", "t", "full",
                        {"num_tokens": t, "num_pages": 64}) for t in (6, 8)]
    found = space.candidates(ATTENTION, contest, SMS)
    assert found[0] is None and len(found) == len({json.dumps(k, sort_keys=True) for k in found[1:]}) + 1
    hand = tsm.hand_picked(8, 16, 2048, False, SMS)
    assert {**{k: getattr(hand[0], k) for k in tsm.TUNED_KNOBS[:-1]}, "num_splits": hand[1]} in found[1:]
    for k in found[1:]:
        tsm.tuned_launch(k, 16, 2048, False)
    one_shape = space.candidates(ATTENTION, contest[1:], SMS)
    assert len(one_shape) == len(found) - 1  # the hand-picked knobs are the hand-picked choice itself
    indexer = families.get("indexer-score")
    w = Workload("i", "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "t", "scored",
                 {"batch_size": 8, "num_pages": 600, "max_num_pages": 64}, {"seq_lens": (4096,) * 8})
    assert space.bucket(indexer, w) == score.tuning_bucket(8, 1, 64, 4096)
    found = space.candidates(indexer, [w], SMS)
    assert found[0] is None and len(found) > 3
    for k in found[1:]:
        score.tuned_config(k, 8, 4096, SMS)
    short = Workload("s", w.definition, "t", "passthrough", {**w.axes, "max_num_pages": 32}, {"seq_lens": (2048,)})
    assert space.bucket(indexer, short) is None
    for kernel, name, heads in ((hopper_mla, "attention-hopper", 64), (mma_mla, "attention-mma", 16)):
        calls = [Workload(f"s{t}", f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk2048_ps64_fp8kv", "t", "h",
                          {"num_tokens": t, "num_pages": 64}) for t in (100, 128)]
        family = families.get(name)
        assert space.bucket(family, calls[1]) == tsm.tuning_bucket(128, heads, 2048, True)
        found = space.candidates(family, calls, SMS)
        formula = kernel.num_splits_for(128, heads, 2048, SMS)
        assert found[0] is None and {"num_splits": formula} in found[1:] and {"num_splits": 1} in found[1:]
        assert len(found) == len({k["num_splits"] for k in found[1:]}) + 1
        assert all(tsm.tuned_splits(k, kernel.MAX_SPLITS) == k["num_splits"] for k in found[1:])


class FakeTimer:
    """Times nothing: a call's "us" is a function of the configuration the launcher ran with."""

    def __init__(self, monkeypatch, cost):
        self.timed = []
        self.cost = cost
        plan = tsm.launch_plan
        monkeypatch.setattr(tsm, "launch_plan", lambda *a: self.seen.append(plan(*a)) or self.seen[-1])
        self.seen = []

    def __call__(self, fn, iters, warmup):
        self.seen.clear()
        fn()
        self.timed.append(self.seen[-1])
        return "fake", [self.cost(*self.seen[-1])] * iters


def test_tune_verifies_before_timing_and_writes_the_fastest_verified_candidate(monkeypatch, tmp_path):
    w = Workload("small", SMALL, "test", "full", {"num_tokens": 2, "num_pages": 8})
    found = space.candidates(ATTENTION, [w], SMS)
    hand = tsm.hand_picked(2, 16, 128, False, SMS)
    fastest = next(k for k in found[1:] if k["num_warps"] != hand[0].num_warps)
    broken = found[-1] if found[-1] is not fastest else found[-2]
    real_forced = search.forced

    def forced(table, knobs, fn):  # the broken candidate computes with the right knobs, then spoils its output
        run = real_forced(table, knobs, fn)
        if knobs is not broken:
            return run
        return lambda *args: (run(*args), args[-2].zero_())

    monkeypatch.setattr(search, "forced", forced)
    broken_plan = tsm.tuned_launch(broken, 16, 128, False)
    fastest_plan = tsm.tuned_launch(fastest, 16, 128, False)
    # The broken candidate would be the fastest of all, were it timed.
    timer = FakeTimer(monkeypatch, lambda cfg, splits: {broken_plan: 1.0, fastest_plan: 5.0}.get((cfg, splits),
                                                                                                  10.0 + splits))
    settings = search.Settings(warmup=0, iters=2, trials=1, verify_trials=1)
    result = search.tune_bucket(ATTENTION, SMALL_BUCKET, [w], found, timer, settings, "cpu")
    refused = [t for t in result.tried if t.problem]
    assert [t.knobs for t in refused] == [broken] and "small" in refused[0].problem
    assert broken_plan not in timer.timed and len(timer.timed) == len(found) - 1
    assert result.winner.knobs == fastest and result.chosen is result.winner
    assert result.default.knobs is None and result.default.total_us == 10.0 + hand[1]

    result.gpu, result.capability = H200
    new = sweep.entries([result], "dsactl tune -d x", date="2026-01-02")
    [entry] = new["attention-triton"]
    assert entry.config == fastest and entry.bucket == SMALL_BUCKET and entry.key[:2] == H200
    assert entry.source == {"command": "dsactl tune -d x", "date": "2026-01-02", "method": "fake", "us": 5.0,
                            "default_us": 10.0 + hand[1], "workloads": ["small"]}
    [bucket] = sweep.report([result], "dsactl tune -d x")["buckets"]
    assert (bucket["bucket"], bucket["best"], bucket["written"]) == (SMALL_BUCKET, result.winner.label, True)
    assert bucket["hand_picked_us"] == 10.0 + hand[1] and bucket["best_us"] == 5.0
    assert bucket["gain"] == round((10.0 + hand[1]) / 5.0, 4)
    assert [c["knobs"] for c in bucket["candidates"]] == [None, *found[1:]]
    assert [c["us"] is None for c in bucket["candidates"]] == [c is broken for c in [None, *found[1:]]]
    assert "small" in next(c["problem"] for c in bucket["candidates"] if c["knobs"] is broken)
    other_gpu = _entry(gpu=("NVIDIA B200", (10, 0)))
    tuned.write(tmp_path / "triton_sparse_mla.json", "triton_sparse_mla", [other_gpu])
    [path] = sweep.write(new, out=tmp_path)
    assert tuned.read(path) == [other_gpu, entry]  # merged: the other GPU's entry kept


@pytest.mark.parametrize("ratio, written", [(1 + search.MIN_GAIN, False), (1 - search.MIN_GAIN / 2, False),
                                            (1 - 2 * search.MIN_GAIN, True)],
                         ids=["slower", "faster-within-the-margin", "faster-beyond-the-margin"])
def test_tune_replaces_the_hand_picked_choice_only_with_a_candidate_faster_by_the_margin(monkeypatch, ratio, written):
    """One candidate beside the hand-picked choice, timed at ratio x its time: a slower one never wins; one
    faster by less than MIN_GAIN ranks first but is not written, and the bucket counts as settled (an old
    entry for it goes); one faster by more is written."""
    w = Workload("small", SMALL, "test", "full", {"num_tokens": 2, "num_pages": 8})
    hand = tsm.hand_picked(2, 16, 128, False, SMS)
    knobs = next(k for k in space.candidates(ATTENTION, [w], SMS)[1:] if tsm.tuned_launch(k, 16, 128, False) != hand)
    timer = FakeTimer(monkeypatch, lambda cfg, splits: 10.0 if (cfg, splits) == hand else 10.0 * ratio)
    settings = search.Settings(warmup=0, iters=2, trials=1, verify_trials=1)
    result = search.tune_bucket(ATTENTION, SMALL_BUCKET, [w], [None, knobs], timer, settings, "cpu")
    result.gpu, result.capability = H200
    assert [t.total_us for t in result.tried] == pytest.approx([10.0, 10.0 * ratio])
    assert result.winner is result.tried[1 if ratio < 1 else 0]
    new = sweep.entries([result], "c").get("attention-triton", [])
    assert [(e.key, e.config) for e in new] == ([((*H200, SMALL_BUCKET), knobs)] if written else [])
    assert sweep.settled([result]) == ({} if written else {"attention-triton": {(*H200, SMALL_BUCKET)}})


def test_the_results_table_counts_each_familys_beaten_buckets_and_its_gains(tmp_path, monkeypatch):
    from dsactl import results

    def bucket(family, name, hand_us, best_us):
        return search.BucketResult(family, name, ["w"], [
            search.Tried(None, "" if hand_us else "w: wrong", {"w": hand_us} if hand_us else {}),
            search.Tried(dict(TUNED_KNOBS), "", {"w": best_us})], gpu=H200[0], capability=H200[1])

    found = [bucket("attention-triton", "h16-small", 10.0, 8.0), bucket("attention-triton", "h16-large", 10.0, 9.9),
             bucket("attention-triton", "h64", 10.0, 10.0), bucket("attention-hopper", "h128", None, 7.0)]
    (tmp_path / "tune-scale.json").write_text(json.dumps(sweep.report(found, "dsactl tune --suite scale")))
    lines = results.tune_scale(tmp_path).splitlines()
    assert lines[0] == ("| kernel family | buckets | beaten by 2%+ | hand-picked refused | gain, geometric mean "
                        "| largest gain |")
    gmean = (1.25 * 10.0 / 9.9 * 1.0) ** (1 / 3)
    assert lines[2] == f"| attention-triton | 3 | 1 | 0 | {gmean:.3f} | 1.250 in `h16-small` |"
    assert lines[3] == "| attention-hopper | 1 | 0 | 1 | — | — |", "no gain where the hand-picked choice failed"
    (tmp_path / "some-gpu").mkdir()
    (tmp_path / "tune-scale.json").rename(tmp_path / "some-gpu" / "tune-scale.json")
    monkeypatch.setattr(results, "PROFILES", tmp_path)
    assert results.available("some-gpu") == ["tune-scale"]
    assert results.render("tune-scale", "some-gpu").splitlines()[2] == lines[2]


def test_a_winner_within_the_noise_or_a_failing_hand_picked_choice_writes_nothing():
    def result(default_us, best_us, default_problem=""):
        return search.BucketResult("attention-triton", "b", ["w"], [
            search.Tried(None, default_problem, {} if default_problem else {"w": default_us}),
            search.Tried(dict(TUNED_KNOBS), "", {"w": best_us})], gpu=H200[0], capability=H200[1])

    assert result(10.0, 9.9).chosen is None
    assert result(10.0, 9.0).chosen is not None
    assert result(10.0, 5.0, default_problem="w: wrong").chosen is None
    assert sweep.entries([result(10.0, 9.9)], "c") == {}


def test_a_retuned_bucket_the_hand_picked_choice_holds_loses_its_stale_entry(tmp_path):
    """A bucket tuned again where nothing beats the hand-picked choice (by MIN_GAIN) drops the entry an earlier
    tune wrote for that GPU; other GPUs' and other buckets' entries stay, and an unverified hand-picked
    choice settles nothing."""
    def result(bucket, default_us, best_us, default_problem=""):
        return search.BucketResult("attention-triton", bucket, ["w"], [
            search.Tried(None, default_problem, {} if default_problem else {"w": default_us}),
            search.Tried(dict(TUNED_KNOBS), "", {"w": best_us})], gpu=H200[0], capability=H200[1])

    path = tmp_path / "triton_sparse_mla.json"
    kept_gpu, stale, other = _entry(gpu=("NVIDIA B200", (10, 0))), _entry(), _entry(bucket="h16-bf16-topk2048-t8")
    unverified = _entry(bucket="h16-bf16-topk2048-t2")
    tuned.write(path, "triton_sparse_mla", [kept_gpu, stale, other, unverified])
    results = [result(SMALL_BUCKET, 10.0, 9.9), result(unverified.bucket, 10.0, 5.0, default_problem="w: wrong")]
    assert sweep.settled(results) == {"attention-triton": {stale.key}}
    assert sweep.write(sweep.entries(results, "c"), sweep.settled(results), out=tmp_path) == [path]
    assert sorted(tuned.read(path), key=lambda e: e.key) == sorted([kept_gpu, other, unverified], key=lambda e: e.key)
    assert sweep.write({}, sweep.settled(results), out=tmp_path) == []  # nothing left to remove: no write


def test_plan_tunes_each_call_with_the_kernel_the_dispatch_sends_it_to():
    from dsactl import workloads

    chosen = workloads.select("scale", None, "dsa_*")
    p = sweep.plan(chosen, search.Settings(), "c", (9, 0))
    assert "no tunable kernel" in dict(p.skipped)["scale-topk-r1-len2049-fp32"]
    family_of = {w: j.family for j in p.jobs for w in (x.uuid for x in j.workloads)}
    assert family_of["scale-attention-h128-t8-bf16"] == "attention-hopper"
    assert family_of["scale-attention-h16-t8-fp8"] == "attention-mma"
    assert family_of["scale-attention-h16-t8-bf16"] == "attention-triton"
    buckets = {(j.family, j.bucket) for j in p.jobs}
    assert ("attention-triton", tsm.tuning_bucket(8, 16, 2048, False)) in buckets
    assert ("attention-hopper", tsm.tuning_bucket(128, 64, 2048, True)) in buckets
    assert ("indexer-score", score.tuning_bucket(32, 1, 64, 32768)) in buckets
    cpu = sweep.plan(chosen, search.Settings(), "c", None)  # no GPU: the Triton kernel serves every call
    assert {j.family for j in cpu.jobs} == {"attention-triton", "indexer-score"}


def test_tune_runs_each_bucket_as_an_executor_job_and_renders(monkeypatch, capsys):
    import functools

    from dsactl.cli.tune import _render

    ws = [Workload("small", SMALL, "test", "full", {"num_tokens": 2, "num_pages": 8}),
          Workload("short", "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64", "test", "passthrough",
                   {"batch_size": 2, "num_pages": 40, "max_num_pages": 8}, {"seq_lens": (100, 200)})]
    timer = FakeTimer(monkeypatch, lambda cfg, splits: 10.0 + cfg.num_warps + splits)
    monkeypatch.setattr(sweep, "run_job", functools.partial(sweep.run_job, timer=timer, device="cpu", num_sms=SMS))
    started = []
    plan, [result] = sweep.tune(ws, search.Settings(warmup=0, iters=1, trials=1, verify_trials=1), "c",
                                on_start=started.append)
    assert [j.bucket for j in started] == [SMALL_BUCKET] and plan.skipped[0][0] == "short"
    assert all(not t.problem for t in result.tried) and len(timer.timed) == len(result.tried)
    _render(plan, [result])
    out = capsys.readouterr().out
    assert SMALL_BUCKET in out and "passthrough" in out


def test_tune_without_a_gpu_is_one_line_exit_2(monkeypatch, capsys):
    from dsactl import cli

    monkeypatch.setattr("dsactl.device.has_cuda_gpu", lambda: False)
    monkeypatch.setattr(sys, "argv", ["dsactl", "tune", "-d", "dsa_sparse_attention_*", "--suite", "contest"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    out = capsys.readouterr()
    assert out.err == f"error: {sweep.NO_GPU}\n" and out.out == ""


def test_tune_refuses_a_bad_out_json_or_method_in_one_line(monkeypatch, capsys, tmp_path):
    from dsactl import cli

    monkeypatch.setattr("dsactl.device.has_cuda_gpu", lambda: True)
    a_file = tmp_path / "f"
    a_file.write_text("")
    for args in (["--out", str(a_file)], ["--json", str(tmp_path)], ["--method", "stopwatch"]):
        monkeypatch.setattr(sys, "argv", ["dsactl", "tune", *args])
        with pytest.raises(SystemExit) as exit_:
            cli.main()
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_merging_into_a_malformed_table_is_an_error(tmp_path):
    (tmp_path / "triton_sparse_mla.json").write_text("{")
    with pytest.raises(DsactlError, match="cannot merge"):
        sweep.write({"attention-triton": [_entry()]}, out=tmp_path)


def _contest_attention():
    from dsactl import workloads

    return [w for w in workloads.suite("contest") if w.uuid in ("contest-attention-000", "contest-attention-001")]


@pytest.mark.gpu
def test_gpu_tune_ranks_candidates_by_their_measured_time_and_refuses_a_wrong_one_however_fast(monkeypatch):
    """bench's timer and the real verification on a contest bucket, with planted differences: the hand-picked
    choice and a copy of its knobs made to run twice must time slower than the knobs run once, which win and
    are written; a candidate that skips the kernel (its output left the poison) is refused and never timed."""
    from dsactl.bench import runner as bench

    [job] = sweep.plan(_contest_attention()[:1], search.Settings(warmup=3, iters=20, trials=2, verify_trials=1),
                       "pytest", torch.cuda.get_device_capability()).jobs
    num_tokens, heads, topk, fp8kv = space.bucket_shape(ATTENTION, job.workloads[0])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cfg, splits = tsm.hand_picked(num_tokens, heads, topk, fp8kv, sms, tsm.compact_for(torch.device("cuda:0")))
    once = {**{k: getattr(cfg, k) for k in tsm.TUNED_KNOBS[:-1]}, "num_splits": splits}
    twice, skipped = dict(once), dict(once)
    real_forced = search.forced
    steps, skipped_at = [], []  # tune's steps; the step under way at each call of the skipping candidate

    def forced(table, knobs, fn):
        run = real_forced(table, knobs, fn)
        if knobs is skipped:
            return lambda *args: skipped_at.append(steps[-1])
        if knobs is None or knobs is twice:
            return lambda *args: (run(*args), run(*args))
        return run

    monkeypatch.setattr(search, "forced", forced)
    s = job.settings
    timer = bench.timing_setup(bench.Settings(s.warmup, s.iters, s.trials, s.method), "pytest").timer
    assert job.family == ATTENTION.name
    r = search.tune_bucket(ATTENTION, job.bucket, job.workloads, [None, twice, once, skipped], timer, s, "cuda",
                           on_step=steps.append)
    default, slow, fast, wrong = r.tried
    assert not (default.problem or slow.problem or fast.problem), [t.problem for t in r.tried]
    assert wrong.problem and wrong.total_us is None
    assert skipped_at and set(skipped_at) == {f"{job.bucket}: verify {wrong.label}"}  # verified, never timed
    assert r.winner is fast and r.chosen is fast
    assert slow.total_us > fast.total_us * (1 + search.MIN_GAIN)


@pytest.mark.gpu
def test_tune_on_the_gpu_writes_entries_the_dispatcher_then_uses(tmp_path, monkeypatch):
    """Two contest shapes tuned end to end on this GPU; once an entry is in the table, a call on this GPU
    runs it and still verifies."""
    from dsactl.verify import runner

    chosen = _contest_attention()
    settings = search.Settings(warmup=3, iters=10, trials=1, verify_trials=1)
    plan, results = sweep.tune(chosen, settings, "pytest")
    assert len(results) == 2 and all(r.default.total_us is not None for r in results)
    for r in results:
        assert r.gpu == torch.cuda.get_device_name() and r.capability == torch.cuda.get_device_capability()
    r = results[0]
    # The winner, or (when the hand-picked choice won) the fastest explicit candidate: what the table holds.
    entry_knobs = min((t for t in r.tried if t.knobs is not None and t.total_us is not None),
                      key=lambda t: t.total_us).knobs
    path = tmp_path / "triton_sparse_mla.json"
    tuned.write(path, "triton_sparse_mla", [tuned.Entry(r.gpu, r.capability, r.bucket, entry_knobs)])
    monkeypatch.setattr(tsm, "TUNED", tuned.Table(path))
    w = next(w for w in chosen if w.uuid in r.workloads)
    num_tokens, heads, topk, fp8kv = space.bucket_shape(ATTENTION, w)
    expected = tsm.tuned_launch(entry_knobs, heads, topk, fp8kv)
    assert tsm.launch_plan(num_tokens, heads, topk, fp8kv, torch.device("cuda:0")) == expected
    used = []
    plan_fn = tsm.launch_plan
    monkeypatch.setattr(tsm, "launch_plan", lambda *a: used.append(plan_fn(*a)) or used[-1])
    result = runner.verify_pair(runner.Candidate("tuned", fn=search.solution_for(w.definition).load()), w, 1)
    assert result.status == runner.PASSED, result.problems
    assert used and all(u == expected for u in used)


@pytest.mark.gpu
def test_gpu_an_entry_this_triton_cannot_compile_gives_way_to_the_hand_picked_choice(tmp_path, monkeypatch):
    """An entry whose tiles need more shared memory than the GPU gives (256 bf16 tokens: 346 KB on an H100,
    which gives 227; a table written under another compiler can hold one) is dropped with one warning; the
    call runs the hand-picked configuration and verifies, and the next call goes straight to it."""
    from dsactl.verify import runner

    w = Workload("w", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64", "t", "h",
                 {"num_tokens": 1, "num_pages": 64})
    knobs = {"block_h": 16, "block_n": 256, "num_warps": 8, "num_stages": 1, "f16": False, "num_splits": 8}
    tsm.tuned_launch(knobs, 16, 2048, False)  # the entry passes the launcher's own checks
    identity = tuned.device_identity(torch.device("cuda:0"))
    bucket = tsm.tuning_bucket(1, 16, 2048, False)
    path = tmp_path / "triton_sparse_mla.json"
    tuned.write(path, "triton_sparse_mla", [tuned.Entry(*identity, bucket, knobs)])
    monkeypatch.setattr(tsm, "TUNED", tuned.Table(path))
    candidate = runner.Candidate("tuned", fn=search.solution_for(w.definition).load())
    with pytest.warns(RuntimeWarning, match=f"entry {bucket} did not launch"):
        result = runner.verify_pair(candidate, w, 2)
    assert result.status == runner.PASSED, result.problems
    assert tsm.TUNED.lookup(identity, bucket) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert runner.verify_pair(candidate, w, 1).status == runner.PASSED


@pytest.mark.gpu
@pytest.mark.parametrize("kernel, shape", SPLIT_KERNELS)
def test_gpu_cuda_launchers_run_the_tuned_split_count_and_still_verify(kernel, shape, tmp_path, monkeypatch):
    """An entry for this GPU's bucket sets the split count of a call the dispatch sends to the CUDA kernel."""
    from dsactl.verify import runner

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("the dispatch sends these calls to the CUDA kernels on compute capability 9.0")
    num_tokens, heads, topk, fp8kv = shape
    definition = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps64{'_fp8kv' if fp8kv else ''}"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = kernel.num_splits_for(num_tokens, heads, topk, sms) + 3
    identity = tuned.device_identity(torch.device("cuda:0"))
    path = tmp_path / f"{kernel.LIBRARY}.json"
    tuned.write(path, kernel.LIBRARY, [tuned.Entry(*identity, tsm.tuning_bucket(*shape), {"num_splits": splits})])
    monkeypatch.setattr(kernel, "TUNED", tuned.Table(path))
    used = []
    for name in ("split_partials", "scaled_split_partials"):  # the Hopper kernel's are scaled
        partials = getattr(tsm, name)
        monkeypatch.setattr(tsm, name, lambda device, t, s, *a, partials=partials:
                            used.append(s) or partials(device, t, s, *a))
    w = Workload("w", definition, "t", "h", {"num_tokens": num_tokens, "num_pages": 64})
    result = runner.verify_pair(runner.Candidate("tuned", fn=search.solution_for(definition).load()), w, 1)
    assert result.status == runner.PASSED, result.problems
    assert used and set(used) == {splits}
