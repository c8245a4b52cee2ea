import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from dsactl import probe, solutions, workloads
from dsactl.bench import baselines, compare, metrics, plot, report, runner, served, timing
from dsactl.bench.runner import BenchRun, Result, Settings
from dsactl.cli import app
from dsactl.definitions import CONTEST, CONTEST_INDEXER, get
from dsactl.definitions.topk import rank_key
from dsactl.errors import DsactlError
from dsactl.fp8 import PAGE_SIZE
from dsactl import harness
from dsactl.harness import Call, prepare, run
from dsactl.verify.rules import check
from dsactl.kernels.attention import solution as attention_entry
from dsactl.kernels.topk.torch_baseline import topk_page_transform

TOPK_DEF = "dsa_topk_page_transform_topk2048_ps64"


def _result(solution="s", workload="w", median=10.0, trial_medians=(10.0, 10.0), kind="solution", label="short",
            size=100, speedup=None, definition=TOPK_DEF):
    return Result(solution=solution, kind=kind, definition=definition, workload=workload, label=label,
                  axes="num_rows=3 max_len=5", method="torch-profiler", iters=50, trials=len(trial_medians),
                  median_us=median, min_us=median * 0.9, max_us=median * 1.2,
                  spread_us=max(trial_medians) - min(trial_medians), trial_medians_us=list(trial_medians),
                  size=size, needed_bytes=4096, needed_flops=None, speedup=speedup, gbps=409.6, pct_copy_bw=9.5,
                  impl="python")


# --- statistics and CUPTI record correlation -------------------------------------------------

def test_summarize_pools_iterations_and_keeps_trial_medians():
    s = timing.summarize([[3.0, 1.0, 2.0], [5.0, 4.0, 9.0]])
    assert s.median_us == 3.5 and s.min_us == 1.0 and s.max_us == 9.0
    assert s.trial_medians_us == [2.0, 5.0] and s.spread_us == 3.0
    assert timing.summarize([[7.0, 7.0]]).spread_us == 0.0
    with pytest.raises(DsactlError):
        timing.summarize([[]])


def test_device_time_counts_only_work_launched_inside_each_call():
    brackets = [(100, 200), (300, 400)]
    launches = [(50, 1),  # the L2 flush, launched before the call: excluded
                (110, 2), (150, 3),  # two kernels of call 0
                (250, 4),  # between calls: excluded
                (310, 5), (310, 6)]  # a runtime and a driver record of call 1
    activities = [(1, 1000), (2, 7), (3, 5), (4, 1000), (5, 20), (6, 1), (99, 1000)]
    assert timing.sum_by_bracket(brackets, launches, activities) == [12, 21]


def test_span_runs_from_a_calls_first_kernel_start_to_its_last_end():
    brackets = [(100, 200), (300, 400), (500, 600)]
    launches = [(50, 1),  # the L2 flush, launched before the call: excluded
                (110, 2),  # a graph launch: both its kernels carry its correlation id
                (310, 5)]  # one kernel of call 1; call 2 launches nothing
    activities = [(1, 0, 5000), (2, 1000, 1007), (2, 1010, 1030), (5, 2000, 2020), (99, 0, 9999)]
    assert timing.span_by_bracket(brackets, launches, activities) == [30, 20, 0]


def test_profiler_device_time_counts_work_that_starts_inside_each_call():
    intervals = [(100, 200), (300, 400)]
    work = [(50, 40),  # the L2 flush, before the call: excluded
            (120, 7), (150, 5),  # two kernels of call 0
            (250, 1000),  # between calls: excluded
            (300, 20), (399, 1)]  # call 1, at its edges
    assert timing.sum_by_interval(intervals, work) == [12, 21]


def test_profiler_calls_are_read_from_the_ranges_this_run_marked():
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(3):
            with record_function(f"{timing.MARK}{i}"):
                torch.ones(64).sum()
    intervals, work = timing.profiler_calls(prof.profiler.kineto_results.events(), 3)
    assert all(a < b for a, b in intervals) and all(b <= c for (_, b), (c, _) in zip(intervals, intervals[1:]))
    assert work == []  # CPU ops are not device work
    with pytest.raises(DsactlError, match=r"timed calls \[3\]"):
        timing.profiler_calls(prof.profiler.kineto_results.events(), 4)


class _Event:
    """A kineto event as torch 2.11 has it: no activity_type()."""

    def __init__(self, name, device, start, duration):
        self._name, self._device, self._start, self._duration = name, device, start, duration

    def name(self):
        return self._name

    def device_type(self):
        return self._device

    def start_ns(self):
        return self._start

    def duration_ns(self):
        return self._duration


def test_profiler_calls_without_activity_types_skip_the_marks_gpu_copies():
    from torch.autograd import DeviceType

    events = [_Event(f"{timing.MARK}0", DeviceType.CPU, 100, 50),
              _Event(f"{timing.MARK}0", DeviceType.CUDA, 110, 40),  # the range's GPU copy: not work
              _Event("my_kernel", DeviceType.CUDA, 120, 7),
              _Event("Memset (Device)", DeviceType.CUDA, 130, 2)]
    assert timing.profiler_calls(events, 1) == ([(100, 150)], [(120, 7), (130, 2)])


# --- timing method fallback order ------------------------------------------------------------

def _availability(monkeypatch, **present):
    for m in timing.METHODS:
        monkeypatch.setitem(timing.AVAILABLE, m, lambda m=m: present.get(m.replace("-", "_"), False))


def test_methods_fall_back_in_order_cupti_profiler_graph(monkeypatch):
    _availability(monkeypatch, cupti=True, torch_profiler=True, cuda_graph=True)
    assert timing.pick_method() == "cupti"
    _availability(monkeypatch, torch_profiler=True, cuda_graph=True)
    assert timing.pick_method("auto") == "torch-profiler"
    _availability(monkeypatch, cuda_graph=True)
    assert timing.pick_method() == "cuda-graph"
    _availability(monkeypatch)
    with pytest.raises(DsactlError, match="needs a CUDA GPU"):
        timing.pick_method()


def test_a_requested_method_must_exist_and_work_here(monkeypatch):
    _availability(monkeypatch, torch_profiler=True, cuda_graph=True)
    assert timing.pick_method("cuda-graph") == "cuda-graph"
    with pytest.raises(DsactlError, match="not available here"):
        timing.pick_method("cupti")
    with pytest.raises(DsactlError, match="unknown timing method"):
        timing.pick_method("stopwatch")


# --- regression logic ------------------------------------------------------------------------

def test_regression_needs_more_than_5_percent_and_more_than_the_spread():
    old = [_result("a", median=100.0, trial_medians=(99.0, 101.0)),  # spread 2 us
           _result("b", median=100.0, trial_medians=(90.0, 110.0)),  # spread 20 us
           _result("c", median=100.0), _result("d", median=100.0)]
    new = [_result("a", median=110.0, trial_medians=(109.0, 111.0)),  # +10% and beyond 2 us: regression
           _result("b", median=110.0, trial_medians=(109.0, 111.0)),  # +10% but within the old 20 us spread
           _result("c", median=104.0),  # +4%: under the bar
           _result("d", median=80.0)]  # -20%: improvement
    c = compare.compare(old, new)
    assert [d.solution for d in c.regressions] == ["a"]
    assert [d.solution for d in c.improvements] == ["d"]


def test_compare_reports_missing_rows_and_incomparable_runs():
    old = [_result("a", "w1"), _result("a", "w2")]
    new = [_result("a", "w1"), _result("a", "w3")]
    c = compare.compare(old, new, {"gpu": "NVIDIA H200", "timing_method": "cupti"},
                        {"gpu": "NVIDIA B200", "timing_method": "cupti"})
    assert c.only_old == [("a", TOPK_DEF, "w2")] and c.only_new == [("a", TOPK_DEF, "w3")]
    assert len(c.deltas) == 1 and not c.regressions
    assert len(c.warnings) == 1 and "gpu differs" in c.warnings[0]


# --- files -----------------------------------------------------------------------------------

def _run():
    meta = {"command": "dsactl bench --suite edge --definition 'dsa_topk_*'", "gpu": "NVIDIA H200",
            "sm_clock_mhz": 1980, "versions": {"torch": "2.11.0"}, "timing_method": "torch-profiler"}
    rows = [_result("reference", "w1", 900.0, kind="reference", speedup=1.0, size=10),
            _result("torch-topk", "w1", 30.0, (29.5, 30.5), kind="baseline", speedup=30.0, size=10),
            _result("reference", "w2", 1900.0, kind="reference", label="long", speedup=1.0, size=1000),
            _result("torch-topk", "w2", 95.0, (94.0, 96.0), kind="baseline", label="long", speedup=20.0, size=1000)]
    rows[1].tflops = None
    rows[1].active_sms = 17
    return BenchRun(meta=meta, results=rows,
                    skipped=[baselines.Skipped("flashinfer", "plugin", TOPK_DEF, "cannot import flashinfer")])


def test_csv_round_trip_keeps_header_and_rows(tmp_path):
    run_ = _run()
    path = report.write_csv(tmp_path / "sub" / "bench.csv", run_)
    text = path.read_text()
    assert text.startswith("# command: ") and "NVIDIA H200" in text
    back = report.read_csv(path)
    assert back.meta == run_.meta
    assert back.results == run_.results


# torch-topk in _run(): 30 us at 30x, 95 us at 20x.
SCORE = {"solution": "torch-topk", "definition": TOPK_DEF, "workloads": 2, "mean_latency_us": 62.5,
         "arith_mean_speedup": 25.0, "geo_mean_speedup": pytest.approx(600 ** 0.5)}


def test_csv_names_its_columns_and_carries_the_scores(tmp_path):
    text = report.write_csv(tmp_path / "bench.csv", _run()).read_text()
    header = next(line for line in text.splitlines() if not line.startswith("#"))
    assert header.split(",") == [
        "solution", "kind", "impl", "definition", "workload", "label", "axes", "method", "iters", "trials",
        "median_us", "min_us", "max_us", "spread_us", "trial_medians_us", "size", "needed_bytes", "needed_flops",
        "speedup", "gbps", "pct_copy_bw", "tflops", "pct_bf16_peak", "active_sms", "allocated_mib", "gpu", "gpu_uuid",
        "host"]
    (scores,) = [line for line in text.splitlines() if line.startswith("# scores: ")]
    assert json.loads(scores.removeprefix("# scores: ")) == [SCORE]
    row = next(r for r in text.splitlines() if r.startswith("torch-topk,"))
    assert ",4096,," in row  # needed_flops of a top-k: an empty cell, not 0


def test_json_round_trip_adds_scores_and_skipped(tmp_path):
    run_ = _run()
    path = report.write_json(tmp_path / "bench.json", run_)
    data = json.loads(path.read_text())
    assert data["scores"] == [SCORE]
    back = report.read_json(path)
    assert back.results == run_.results and back.skipped == run_.skipped and back.meta == run_.meta


def test_the_prefill_indexer_table_puts_each_contender_beside_deepgemm_from_the_csv(tmp_path):
    """results' prefill-indexer table, from a bench CSV: per prompt, each contender's time, rate and MiB a call,
    and DeepGEMM's time over each of ours; a contender a run lacks is left out, never shown as zero."""
    from dsactl import results

    def row(solution, uuid, us, mib):
        return Result(solution=solution, kind="plugin" if solution == "deepgemm" else "solution",
                      definition="dsa_prefill_indexer_fp8_h64_d128_topk2048", workload=uuid, label="", axes="",
                      method="cupti", iters=5, trials=2, median_us=us, min_us=us, max_us=us, spread_us=0.0,
                      trial_medians_us=[us], size=1, needed_flops=int(us * 5e8), tflops=500.0, allocated_mib=mib)

    run_ = BenchRun(meta={}, results=[
        row("dsactl-prefill-indexer", "prefill-indexer-s65536", 50000.0, 1064.0),
        row("dsactl-prefill-indexer-fused", "prefill-indexer-s65536", 40000.0, 2304.0),
        row("deepgemm", "prefill-indexer-s65536", 60000.0, 1100.0),
        row("dsactl-prefill-indexer", "prefill-indexer-s4096", 380.0, 104.0)])
    report.write_csv(tmp_path / "prefill-indexer.csv", run_)
    lines = results.prefill_indexer(tmp_path).splitlines()
    assert lines[0] == "| prompt | contender | us | TFLOP/s | MiB a call | DeepGEMM / it |"
    assert lines[2:] == [
        "| 4K | dsactl, logits in row chunks | 380.0 | 500 | 104 | — |",
        "| 64K | dsactl, logits in row chunks | 50000.0 | 500 | 1064 | 1.20 |",
        "| 64K | dsactl fused, no logits in memory | 40000.0 | 500 | 2304 | 1.50 |",
        "| 64K | DeepGEMM logits + dsactl top-k | 60000.0 | 500 | 1100 | — |"]


def test_the_prefill_table_adds_flashmlas_upconverted_fp8_path_where_the_run_has_it(tmp_path):
    from dsactl import results

    d = "dsa_sparse_attention_h64_ckv512_kpe64_topk2048_ps64"

    def row(solution, fp8, us):
        return Result(solution=solution, kind="solution", definition=d + ("_fp8kv" if fp8 else ""),
                      workload=f"prefill-attention-h64-t1024-{'fp8' if fp8 else 'bf16'}", label="", axes="",
                      method="cupti", iters=5, trials=2, median_us=us, min_us=us, max_us=us, spread_us=0.0,
                      trial_medians_us=[us], size=1)

    rows = [row("dsactl-attention", False, 600.0), row("flashmla", False, 580.0),
            row("dsactl-attention-fp8kv", True, 640.0)]
    report.write_csv(tmp_path / "prefill.csv", BenchRun(meta={}, results=rows))
    without = results.prefill(tmp_path).splitlines()
    assert len(without) == 2 + 5 and not any("upconverted" in line for line in without)
    rows.append(row("flashmla-upconvert", True, 620.0))
    report.write_csv(tmp_path / "prefill.csv", BenchRun(meta={}, results=rows))
    assert results.prefill(tmp_path).splitlines()[-2:] == [
        "| 64 | FlashMLA, FP8 KV upconverted to bf16 | 620.0 |",
        "| 64 | FlashMLA upconverted / dsactl, FP8 KV | 0.97 |"]


def test_scores_without_a_reference_keep_the_mean_latency():
    rows = [r for r in _run().results if r.kind != "reference"]
    for r in rows:
        r.speedup = None
    (score,) = BenchRun(meta={}, results=rows).scores()
    assert (score.mean_latency_us, score.arith_mean_speedup, score.geo_mean_speedup) == (62.5, None, None)


def test_an_older_csv_still_loads_for_compare(tmp_path):
    """Files written before the impl and needed_* columns: the rows load, the new columns empty."""
    old = tmp_path / "old.csv"
    old.write_text(
        '# gpu: "NVIDIA H200"\n'
        "solution,kind,definition,workload,label,axes,method,iters,trials,median_us,min_us,max_us,spread_us,"
        "trial_medians_us,size,bytes,flops,speedup,gbps,tflops,pct_peak_bw,pct_peak_flops,active_sms\n"
        f"dsactl-topk,solution,{TOPK_DEF},w1,len2049,num_rows=1,cupti,20,1,3.8,3.7,3.9,0.0,3.8,2049,16392,0,,"
        "4.3,,0.1,,\n")
    (r,) = report.read_csv(old).results
    assert (r.solution, r.median_us, r.impl, r.needed_bytes, r.pct_copy_bw) == ("dsactl-topk", 3.8, "", None, None)
    (delta,) = compare.compare([r], [_result("dsactl-topk", "w1", median=3.8)]).deltas
    assert delta.change == 0.0


def test_a_csv_that_is_not_from_bench_is_refused(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(DsactlError, match="not a dsactl bench CSV"):
        report.read_csv(p)


def test_default_paths_are_per_gpu_under_profiles():
    csv_path, json_path = report.default_paths("NVIDIA H200", report.default_stem("contest", None, None))
    assert csv_path.parent.name == "h200" and csv_path.parent.parent.name == "profiles"
    assert csv_path.name == "bench-contest.csv" and json_path.name == "bench-contest.json"
    assert report.default_stem("/data/ds", "dsa_topk_*", ["a"]) == "bench-ds-dsa_topk_-a"


def test_plot_writes_latency_and_speedup_pngs(tmp_path):
    written = plot.plot(_run().results, tmp_path / "plots")
    names = sorted(p.name for p in written)
    assert names == [f"latency-{TOPK_DEF}.png", f"speedup-{TOPK_DEF}.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_plot_draws_attention_bandwidth_against_the_copy_line(tmp_path):
    """Attention (the memory-bound stage) also gets GB/s vs size with the copy bandwidth of the run."""
    d = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_fp8kv"
    rows = [_result(name, f"w{t}", median=5.0 * t, size=2048 * t, definition=d)
            for name in ("dsactl-attention-fp8kv", "flashmla") for t in (1, 8, 32)]
    written = plot.plot(rows, tmp_path)
    assert sorted(p.name for p in written) == [f"bandwidth-{d}.png", f"latency-{d}.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
    unrated = [_result(definition=d)]
    unrated[0].gbps = None
    assert plot.bandwidth_plot(unrated, d, tmp_path / "none.png") is None


# --- work metrics ----------------------------------------------------------------------------

def test_attention_work_counts_the_gathered_rows_of_valid_ids():
    d = get("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64")
    idx = torch.full((2, 2048), -1, dtype=torch.int32)
    idx[0, :100] = torch.arange(100)
    idx[1, 7:10] = 5  # duplicates are gathered (and computed) every time
    w = metrics.attention_work(d, {"sparse_indices": idx})
    # 103 valid x 1152 B (bf16 ckv + kpe) + q 2x16x576x2 + output 2x16x512x2 + lse 2x16x4 + ids 2x2048x4
    assert (w.size, w.needed_bytes) == (103, 118656 + 36864 + 32768 + 128 + 16384)
    assert w.needed_flops == 3586048  # 2 x 16 heads x 103 x (576 + 512)
    fp8 = get("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_fp8kv_topklen")
    w = metrics.attention_work(fp8, {"sparse_indices": idx, "topk_length": torch.tensor([50, 2048], dtype=torch.int32)})
    # 50 + 3 valid ids before topk_length x 656 B, the same q/output/lse/ids, topk_length 2 x 4
    assert (w.size, w.needed_bytes, w.needed_flops) == (53, 34768 + 86144 + 8, 2 * 16 * 53 * 1088)


def test_attention_with_no_valid_id_has_no_flops():
    d = get("dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_sink")
    w = metrics.attention_work(d, {"sparse_indices": torch.full((1, 2048), -1, dtype=torch.int32)})
    # q 16x576x2 + output 16x512x2 + lse 16x4 + ids 2048x4 + attn_sink 16x4
    assert (w.size, w.needed_bytes, w.needed_flops) == (0, 18432 + 16384 + 64 + 8192 + 64, None)


def test_indexer_work_scores_only_rows_longer_than_topk():
    d = get("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64_nextn2")
    # Rows see seq_len - 2 + j + 1 tokens: [99, 100], [2048, 2049], [2999, 3000]; scored: 2049, 2999, 3000.
    w = metrics.indexer_work(d, {"seq_lens": torch.tensor([100, 2049, 3000], dtype=torch.int32)})
    assert w.size == 99 + 100 + 2048 + 2049 + 2999 + 3000
    # keys of requests 1 and 2: (2049 + 3000) x 132 B; q + weights of 3 rows: 3 x 64 x (128 + 4);
    # seq_lens 3 x 4; block table pages 2 + 33 + 47, x 4; ids 3 x 2 x 2048 x 4
    assert w.needed_bytes == 666468 + 25344 + 12 + 328 + 49152
    assert w.needed_flops == 132888576  # 2 x 64 x (128 + 1) x (2049 + 2999 + 3000)


def test_indexer_passthrough_has_no_flops_and_reads_no_key():
    d = get("dsa_topk_indexer_fp8_h64_d128_topk2048_ps64")
    w = metrics.indexer_work(d, {"seq_lens": torch.tensor([1, 100, 2048], dtype=torch.int32)})
    # seq_lens 3 x 4; block table pages 1 + 2 + 32, x 4; ids 3 x 2048 x 4
    assert (w.size, w.needed_bytes, w.needed_flops) == (2149, 12 + 140 + 24576, None)


def test_a_contest_passthrough_workload_reports_no_flops():
    """Contest indexer workloads whose rows all fit in top-k: every valid token is returned unscored."""
    w = next(w for w in workloads.suite("contest")
             if w.definition == CONTEST_INDEXER and w.axes["max_num_pages"] * PAGE_SIZE <= 2048)
    call = prepare(w, "cpu", seed=0)
    work = metrics.work(call.definition, call.inputs)
    seq_lens = call.inputs["seq_lens"].long()
    batch, pages = seq_lens.numel(), int(((seq_lens + PAGE_SIZE - 1) // PAGE_SIZE).sum())
    assert work.needed_flops is None
    assert work.needed_bytes == batch * 4 + pages * 4 + batch * 2048 * 4


def test_topk_work_reads_the_scores_of_ranked_rows_only():
    d = get(TOPK_DEF + "_bf16")
    w = metrics.topk_work(d, {"scores": torch.empty(3, 9000, dtype=torch.bfloat16),
                              "lengths": torch.tensor([9000, 2048, 1], dtype=torch.int32),
                              "row_to_batch": torch.tensor([0, 1, 1], dtype=torch.int32),
                              "block_table": torch.zeros(2, 141, dtype=torch.int32)})
    # scores of the one row over topk 9000 x 2 B; lengths + row_to_batch 3 x 8;
    # block table pages 141 (request 0) + max(32, 1) (request 1), x 4; ids 3 x 2048 x 4
    assert (w.size, w.needed_bytes, w.needed_flops) == (11049, 18000 + 24 + 692 + 24576, None)


def test_active_sms_only_where_the_solution_reports_its_grid():
    def plain(*args):
        pass

    def gridded(*args):
        pass

    gridded.grid_ctas = lambda *args: len(args) * 100
    assert metrics.active_sms(plain, [1, 2], 132) is None
    assert metrics.active_sms(gridded, [1], 132) == 100
    assert metrics.active_sms(gridded, [1, 2], 132) == 132


# --- which implementation served a row ---------------------------------------------------------

def _attention_call(heads=64):
    d = get(f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk2048_ps64")
    inputs = {"q_nope": torch.zeros(1, heads, 512, dtype=torch.bfloat16),
              "q_pe": torch.zeros(1, heads, 64, dtype=torch.bfloat16),
              "ckv_cache": torch.zeros(1, 64, 512, dtype=torch.bfloat16),
              "kpe_cache": torch.zeros(1, 64, 64, dtype=torch.bfloat16),
              "sparse_indices": torch.full((1, 2048), -1, dtype=torch.int32), "sm_scale": 0.1}
    return Call(d, None, inputs, d.allocate_outputs(d.check_inputs(inputs), "cpu"))


def test_served_by_names_the_implementation_the_attention_solution_dispatches_to(monkeypatch):
    from dsactl.kernels.attention import dispatch

    shipped = solutions.get("dsactl-attention")
    assert served.served_by(shipped, _attention_call()) == dispatch.TRITON  # no sm_90 GPU here
    monkeypatch.setenv(dispatch.ATTENTION_KERNEL_ENV, dispatch.HOPPER)
    assert served.served_by(shipped, _attention_call()) == dispatch.HOPPER
    # A baseline in the same module is not dispatched.
    assert served.served_by(solutions.get("torch-attention"), _attention_call()) == "python"


def test_served_by_falls_back_to_the_language_without_a_dispatch_function(monkeypatch):
    assert served.served_by(solutions.get("dsactl-topk"), None) == "cuda"
    monkeypatch.setattr(served, "DISPATCH", "renamed_elsewhere")
    assert served.served_by(solutions.get("dsactl-attention"), _attention_call()) == "triton"


# --- the torch top-k baseline ----------------------------------------------------------------

def _logical(call, ids_row, r):
    b = int(call.inputs["row_to_batch"][r])
    pages = (int(call.inputs["lengths"][r]) + PAGE_SIZE - 1) // PAGE_SIZE
    where = {int(p): i for i, p in enumerate(call.inputs["block_table"][b, :pages].tolist())}
    return [where[i // PAGE_SIZE] * PAGE_SIZE + i % PAGE_SIZE for i in ids_row.tolist() if i != -1]


@pytest.mark.parametrize("uuid", ["edge-topk-nan-fp32", "edge-topk-neg_inf_tail-bf16", "edge-topk-two_values-fp32",
                                  "edge-topk-len2049", "edge-topk-len1", "edge-topk-mtp"])
def test_torch_topk_baseline_selects_the_reference_scores(uuid):
    (w,) = [w for w in workloads.suite("edge") if w.uuid == uuid]
    call = prepare(w, "cpu", seed=3)
    got = run(topk_page_transform, call)["topk_indices"].clone()
    want = call.definition.run_reference(call.inputs)["topk_indices"]
    for r in range(got.shape[0]):
        mine, ref = _logical(call, got[r], r), _logical(call, want[r], r)
        assert len(set(mine)) == len(mine) == len(ref)
        scores = call.inputs["scores"][r]
        assert sorted(rank_key(scores[mine]).tolist()) == sorted(rank_key(scores[ref]).tolist())
    assert ((got == -1) | (got >= 0)).all()


# --- baselines and the run orchestration -----------------------------------------------------

def test_baseline_names_resolve_and_missing_plugins_are_skipped():
    d = get(TOPK_DEF)
    found, skipped = baselines.resolve(d)
    assert [c.name for c in found][:1] == ["reference"] and "torch-topk" in [c.name for c in found]
    assert any(s.name == "flashinfer" and s.kind == "plugin" for s in skipped) or "flashinfer" in [c.name for c in found]
    found, skipped = baselines.resolve(d, ["torch-topk", "flashmla"], include_reference=False)
    assert [c.name for c in found] == ["torch-topk"]
    assert [(s.name, s.reason) for s in skipped] == [("flashmla", "does not serve this definition")]
    with pytest.raises(DsactlError, match="unknown baseline 'nope'"):
        baselines.resolve(d, ["nope"])


def test_a_plugin_whose_first_call_crashes_a_child_process_is_skipped_with_the_signal(monkeypatch):
    """A plug-in that imports but whose first call kills the process (a DeepGEMM build has): found in a child
    process before the plug-in runs any call here, then listed as skipped with the reason."""
    assert next(p for p in baselines.PLUGINS if p.name == "deepgemm").first_call == probe.DEEP_GEMM
    crashing = baselines.Plugin("crashing", "json", lambda d: True, lambda module, call: None,
                                first_call="import ctypes, json; ctypes.string_at(0)")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(DsactlError, match="json imports, but a first call in a child process was killed by SIGSEGV"):
        crashing.contender()
    monkeypatch.setattr(baselines, "PLUGINS", (crashing,))
    found, skipped = baselines.resolve(get(TOPK_DEF), ["crashing"], include_reference=False)
    assert found == [] and [(s.name, s.kind) for s in skipped] == [("crashing", "plugin")]
    assert skipped[0].reason.endswith("killed by SIGSEGV")


def _fake_timer(fn, iters, warmup):
    fn()  # the bound call must really run
    latency = 1000.0 if iters == runner.REFERENCE_ITERS else 40.0
    return "fake", [latency + i for i in range(iters)]


def test_run_bench_times_every_contender_and_scores_speedups():
    ws = [w for w in workloads.suite("edge") if w.uuid in ("edge-topk-len65", "edge-topk-len2049")]
    settings = Settings(warmup=1, iters=5, trials=2, baselines=["torch-topk"])
    seen = []
    peaks = SimpleNamespace(copy_gbps=4000.0, bf16_tflops=800.0)
    result = runner.run_bench(ws, settings, _fake_timer, device="cpu", peaks=peaks, progress=seen.append)
    assert seen == ["edge-topk-len65 trial 1/2", "edge-topk-len65 trial 2/2",
                    "edge-topk-len2049 trial 1/2", "edge-topk-len2049 trial 2/2"]
    by = {(r.solution, r.workload): r for r in result.results}
    ref, base = by[("reference", "edge-topk-len65")], by[("torch-topk", "edge-topk-len65")]
    assert ref.iters == runner.REFERENCE_ITERS and ref.median_us == 1001.0 and ref.speedup == 1.0
    assert base.kind == "baseline" and base.median_us == 42.0 and base.method == "fake"
    assert base.speedup == pytest.approx(1001.0 / 42.0)
    assert base.trial_medians_us == [42.0, 42.0] and base.spread_us == 0.0
    assert base.size == 65 + 1 + 64 and base.gbps == pytest.approx(base.needed_bytes / 42e-6 / 1e9)
    assert base.pct_copy_bw == pytest.approx(100 * base.gbps / 4000.0)
    assert base.needed_flops is base.tflops is base.pct_bf16_peak is None  # top-k: no arithmetic
    assert (ref.impl, base.impl) == ("reference", "python")
    (score,) = [s for s in result.scores() if s.solution == "torch-topk"]
    assert score.workloads == 2 and score.arith_mean_speedup == pytest.approx(1001.0 / 42.0)
    assert score.mean_latency_us == 42.0
    gpu_only = [s for s in result.skipped if s.kind == "solution"]
    assert all(s.reason == "needs a CUDA GPU" for s in gpu_only)


def test_a_failing_contender_is_reported_and_the_run_goes_on(monkeypatch):
    def broken(call):
        raise RuntimeError("illegal memory access")

    real = runner.contenders_for

    def with_broken(definition, settings):
        found, skipped = real(definition, settings)
        return found + [baselines.Contender("broken", "solution", broken)], skipped

    monkeypatch.setattr(runner, "contenders_for", with_broken)
    ws = [w for w in workloads.suite("edge") if w.uuid == "edge-topk-len65"]
    result = runner.run_bench(ws, Settings(iters=2, trials=1, baselines=["torch-topk"]), _fake_timer, device="cpu")
    assert {r.solution for r in result.results} == {"reference", "torch-topk"}
    (failed,) = result.failed_solutions()
    assert failed.name == "broken" and "illegal memory access" in failed.reason and failed.workload == "edge-topk-len65"


def test_a_cut_off_bench_keeps_the_rows_of_finished_workloads(monkeypatch, tmp_path):
    """The CSV is rewritten after each workload: a run killed by a time limit keeps what it measured."""
    ids = ("edge-topk-len65", "edge-topk-len2049")

    def bench_then_die(workloads_, settings, command, progress=None, on_ready=None, on_workload=None, executor=None):
        meta = {"command": command, "gpu": "Fake GPU", "sm_count": 1, "sm_clock_mhz": 1, "max_sm_clock_mhz": 1,
                "driver": "x", "timing_method": "fake", "peaks": {"copy_gbps": 1.0, "bf16_tflops": 1.0},
                "self_check": {"ok": True, "method": "fake", "nbytes": 2**20, "measured_us": 1.0, "expected_us": 1.0,
                               "deviation": 0.0}}
        on_ready(meta)

        def dying(run_so_far):
            on_workload(run_so_far)
            raise TimeoutError("the time limit hits after the first workload")

        return runner.run_bench(workloads_, settings, _fake_timer, device="cpu", meta=meta, on_workload=dying)

    monkeypatch.setattr(runner, "bench", bench_then_die)
    out = tmp_path / "b.csv"
    r = CliRunner().invoke(app, ["bench", "--suite", "edge", "-d", TOPK_DEF, "-w", ids[0], "--csv", str(out),
                                 "--json", str(tmp_path / "b.json"), "--iters", "2", "--trials", "1",
                                 "-b", "torch-topk"])
    assert isinstance(r.exception, TimeoutError)
    kept = report.read_csv(out)
    assert {x.workload for x in kept.results} == {ids[0]} and {x.solution for x in kept.results} >= {"torch-topk"}
    assert kept.meta["complete"] == "1 of 1 workloads"
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["complete"] == "1 of 1 workloads"
    assert not report.default_paths("Fake GPU", "x")[0].parent.exists(), "--csv and --json leave profiles/ alone"


def test_auto_timing_skips_a_method_whose_self_check_is_off(monkeypatch):
    from dsactl.bench.peaks import SelfCheck

    monkeypatch.setitem(timing.AVAILABLE, "cupti", lambda: True)
    monkeypatch.setitem(timing.AVAILABLE, "torch-profiler", lambda: True)
    monkeypatch.setitem(timing.AVAILABLE, "cuda-graph", lambda: False)
    reads = {"cupti": 265.0, "torch-profiler": 126.0}

    def check(method, peaks, flusher):
        return SelfCheck(method, 2**28, reads[method], 127.0)

    method, ok, rejected = runner.checked_method("auto", None, None, self_check=check)
    assert (method, ok.method) == ("torch-profiler", "torch-profiler") and ok.ok
    assert [r.method for r in rejected] == ["cupti"] and not rejected[0].ok
    # A method asked for by name is kept, its failing check reported.
    method, off, rejected = runner.checked_method("cupti", None, None, self_check=check)
    assert method == "cupti" and not off.ok and rejected == []
    # Nothing passes: the first method, flagged.
    reads["torch-profiler"] = 300.0
    method, off, rejected = runner.checked_method(None, None, None, self_check=check)
    assert method == "cupti" and not off.ok and [r.method for r in rejected] == ["torch-profiler"]


def _bench_cli(*args):
    return CliRunner().invoke(app, ["bench", "--suite", "edge", "-d", TOPK_DEF, "-w", "edge-topk-len65", *args])


def test_an_unknown_timing_method_fails_at_once_naming_the_valid_ones():
    done = subprocess.run([sys.executable, "-m", "dsactl", "bench", "--no-save", "--method", "bogus"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "error: unknown timing method 'bogus'; choose auto, cupti, torch-profiler, cuda-graph\n"


def test_unusable_output_paths_fail_before_timing(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    r = _bench_cli("--csv", str(tmp_path))
    assert isinstance(r.exception, DsactlError) and str(r.exception) == f"cannot write {tmp_path}: it is a directory"
    r = _bench_cli("--json", str(tmp_path / "a_file" / "b.json"))
    assert str(r.exception) == f"cannot write {tmp_path / 'a_file' / 'b.json'}: {tmp_path / 'a_file'} is not a directory"
    r = _bench_cli("--json", str(tmp_path / "a_file" / "c" / "b.json"))
    assert str(r.exception) == f"cannot write {tmp_path / 'a_file' / 'c' / 'b.json'}: cannot create " \
                               f"{tmp_path / 'a_file' / 'c'} (Not a directory)"
    report.check_writable(tmp_path / "new" / "deeper" / "b.csv")  # missing folders are made by the check
    assert (tmp_path / "new" / "deeper").is_dir()
    monkeypatch.setattr(report.os, "access", lambda path, mode: False)
    with pytest.raises(DsactlError, match=f"^cannot write .*: {tmp_path} is not writable$"):
        report.check_writable(tmp_path / "b.csv")


def test_settings_are_checked_before_any_gpu_is_needed():
    for bad, message in ((Settings(iters=0), "iters must be at least 1, got 0"),
                         (Settings(warmup=-1), "warmup must be at least 0, got -1"),
                         (Settings(baselines=["nope"]), "unknown baseline 'nope'"),
                         (Settings(solutions=["nope"]), "unknown solution 'nope'")):
        with pytest.raises(DsactlError, match=message):
            runner.check_settings(bad)
    assert "unknown baseline 'nope'" in str(_bench_cli("-b", "nope").exception)


def test_bench_without_a_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = CliRunner().invoke(app, ["bench", "--no-save", "--definition", TOPK_DEF, "--suite", "edge"])
    assert isinstance(r.exception, DsactlError) and "needs a CUDA GPU" in str(r.exception)


def test_cached_peaks_without_a_rate_measured_since_are_measured_again(tmp_path, monkeypatch):
    from dataclasses import asdict

    from dsactl.bench import peaks

    cache = tmp_path / "peaks.json"
    old = {"gpu": "GPU", "copy_gbps": 1.0, "bf16_tflops": 2.0, "measured_at": "t", "torch": "x",
           "kernel_copy_gbps": 3.0}
    cache.write_text(json.dumps({"GPU": old}))
    fresh = peaks.Peaks(**{**old, "fp8_tflops": 4.0})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "GPU")
    monkeypatch.setattr(peaks, "measure_peaks", lambda: fresh)
    assert peaks.load_or_measure(cache) == fresh and json.loads(cache.read_text())["GPU"] == asdict(fresh)
    monkeypatch.setattr(peaks, "measure_peaks", lambda: pytest.fail("measured again"))
    assert peaks.load_or_measure(cache).fp8_tflops == 4.0
    # A GPU without FP8 tensor cores has no FP8 rate, and keeps it.
    cache.write_text(json.dumps({"GPU": {**old, "fp8_tflops": None}}))
    assert peaks.load_or_measure(cache).fp8_tflops is None


# --- GPU -------------------------------------------------------------------------------------

def _in_a_fresh_process(code: str) -> None:
    """Run code in a new Python: CUPTI's state is per process, and torch.profiler (used by other
    tests in this one) leaves cupti-python reading twice the kernels' time."""
    import subprocess
    import sys
    import textwrap

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_copy_self_check_lands_within_10_percent(tmp_path):
    _in_a_fresh_process(f"""
        import json
        from pathlib import Path
        from dsactl.bench import peaks, runner, timing

        flusher = timing.L2Flusher()
        p = peaks.load_or_measure(Path({str(tmp_path / "peaks.json")!r}))
        assert p.copy_gbps > 100 and p.bf16_tflops > 10 and p.kernel_copy_gbps > 100
        assert p.fp8_tflops > p.bf16_tflops  # FP8 tensor cores do twice bf16's work a cycle
        cached = json.loads(Path({str(tmp_path / "peaks.json")!r}).read_text())[p.gpu]
        assert cached["kernel_copy_gbps"] == p.kernel_copy_gbps
        check = peaks.copy_self_check(timing.pick_method(), p, flusher)
        assert check.ok, check.describe()
        if "torch-profiler" in timing.available_methods():
            # After torch.profiler, auto timing still ends on a method whose check passes.
            timing.measure(peaks.copy_kernel(2**20), "torch-profiler", iters=2, warmup=1, flusher=flusher)
            method, again, rejected = runner.checked_method("auto", p, flusher)
            assert again.ok, (again.describe(), [r.describe() for r in rejected])
        """)


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_every_available_method_agrees_on_a_copy():
    _in_a_fresh_process("""
        import statistics
        from dsactl.bench import timing
        from dsactl.bench.peaks import SELF_CHECK_BYTES, copy_kernel

        flusher = timing.L2Flusher()
        copy = copy_kernel(SELF_CHECK_BYTES)
        medians = {}
        for m in timing.available_methods():
            used, samples = timing.measure(copy, m, iters=10, warmup=2, flusher=flusher)
            assert used == m
            medians[m] = statistics.median(samples)
        # The CUPTI-based methods read kernel time and agree; graph replay timed with events
        # also counts the replay's launch, so it may read more, never less.
        exact = {m: v for m, v in medians.items() if m != "cuda-graph"}
        best = min(exact.values())
        assert all(v < 1.1 * best for v in exact.values()), medians
        if "cuda-graph" in medians:
            assert 0.9 * best < medians["cuda-graph"] < 1.5 * best, medians
        """)


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_every_available_method_times_a_triton_kernel():
    # Triton launches its kernels through the driver API: every method must still see their device time.
    _in_a_fresh_process("""
        import statistics
        import torch
        from dsactl.bench import timing
        from dsactl.definitions import get
        from dsactl.kernels.attention import triton_sparse_mla as tsm
        from dsactl.workloads import suite, make_inputs

        w = next(w for w in suite("contest") if w.definition.startswith("dsa_sparse_attention"))
        d = get(w.definition)
        inputs = make_inputs(w, "cuda", 0)
        out = d.allocate_outputs(d.check_inputs(inputs), "cuda")
        call = lambda: tsm.sparse_mla_attention(inputs["q_nope"], inputs["q_pe"], inputs["sparse_indices"],
                                                inputs["sm_scale"], out["output"], out["lse"],
                                                ckv_cache=inputs["ckv_cache"], kpe_cache=inputs["kpe_cache"])
        flusher = timing.L2Flusher()
        medians = {m: statistics.median(timing.measure(call, m, iters=10, warmup=2, flusher=flusher)[1])
                   for m in timing.available_methods() if m != "cuda-graph"}
        assert "torch-profiler" in medians, timing.available_methods()
        assert max(medians.values()) < 1.2 * min(medians.values()), medians
        """)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_rows_report_what_one_call_allocates():
    """allocated_mib: the chunked prefill indexer's logits chunk and the fused one's lists at least; none for the
    reference, whose call is not repeated to measure it."""
    from dsactl.kernels.indexer import prefill_fused as pf

    w = next(w for w in workloads.suite("edge") if w.uuid == "edge-prefill-indexer-whole")
    q, k = (harness.prepare(w, "cpu", seed=0).inputs[n] for n in ("q_index_fp8", "k_index_fp8"))
    T, S, topk = q.shape[0], k.shape[0], get(w.definition).params["topk"]
    result = runner.bench([w], Settings(warmup=1, iters=2, trials=1, baselines=[],
                                        solutions=["dsactl-prefill-indexer", "dsactl-prefill-indexer-fused"]), "pytest")
    rows = {r.solution: r for r in result.results}
    assert rows["reference"].allocated_mib is None
    assert rows["dsactl-prefill-indexer"].allocated_mib >= T * S * 4 / 2**20
    fused_lists = T * (pf.capacity(topk) * 8 + pf.segment_keys(topk) * 4)
    assert rows["dsactl-prefill-indexer-fused"].allocated_mib >= fused_lists / 2**20


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_one_contest_workload_per_definition_end_to_end():
    ws = [next(w for w in workloads.suite("contest") if w.definition == d) for d in CONTEST]
    result = runner.bench(ws, Settings(warmup=2, iters=5, trials=2), "pytest")
    assert result.meta["self_check"]["ok"], result.meta["self_check"]
    for d in CONTEST:
        rows = [r for r in result.results if r.definition == d]
        assert {r.kind for r in rows} >= {"reference"} and len(rows) >= 2, (rows, result.skipped)
        for r in rows:
            assert r.method in timing.METHODS + (timing.EVENTS_FALLBACK,)
            assert 0 < r.min_us <= r.median_us <= r.max_us and r.speedup > 0 and r.gbps > 0
            assert r.impl
            if r.solution == "dsactl-attention":
                assert r.impl in ("hopper", "triton")


def test_forced_kernel_plugins_serve_where_their_kernel_takes_the_call_and_run_that_kernel():
    """dsactl-<kernel> times the shipped entry with one kernel forced (the dispatch suite's contenders):
    each serves the heads and KV formats its kernel takes, and its bound call runs that kernel, verified."""
    def served(name):
        return {n for n in ("dsactl-hopper", "dsactl-mma", "dsactl-triton") if baselines.serves(n, get(name))}

    base = "dsa_sparse_attention_h{}_ckv512_kpe64_topk2048_ps64"
    assert served(base.format(16)) == {"dsactl-hopper", "dsactl-triton"}
    assert served(base.format(32) + "_fp8kv") == {"dsactl-hopper", "dsactl-mma", "dsactl-triton"}
    assert served(base.format(128) + "_fp8kv_sink") == {"dsactl-triton"}
    assert served(TOPK_DEF) == set()
    workload = next(w for w in workloads.suite("edge") if w.uuid == "edge-attention-duplicates-h16-bf16")
    call = harness.prepare(workload, "cpu", seed=3)
    plugin = next(p for p in baselines.PLUGINS if p.name == "dsactl-triton")
    seen = []
    module = SimpleNamespace(sparse_mla_attention=lambda *a, **kw: seen.append(kw["implementation"]) or
                             attention_entry.sparse_mla_attention(*a, **kw))
    harness.poison(call.outputs)
    plugin.adapter(module, call)()
    assert seen == ["triton"]
    verdict = check(call.definition, call.inputs, call.outputs)
    assert verdict.passed, "\n".join(verdict.problems)


def test_flashmla_upconvert_plugin_times_the_caches_bf16_rows_then_flashmlas_prefill_kernel():
    """flashmla-upconvert: FP8 caches of 64-token pages at FlashMLA's head counts (padded below 64); its bound
    call converts the cache to bf16 rows, the dequantized cache, each call, and hands them with q padded to 64
    heads and the ids as [T, 1, topk] to flash_mla_sparse_fwd."""
    from dsactl.fp8 import dequantize_mla_kv

    base = "dsa_sparse_attention_h{}_ckv512_kpe64_topk2048_ps{}"
    assert baselines.serves("flashmla-upconvert", get(base.format(16, 64) + "_fp8kv"))
    assert baselines.serves("flashmla-upconvert", get(base.format(128, 64) + "_fp8kv_sink"))
    assert not baselines.serves("flashmla-upconvert", get(base.format(128, 64)))
    assert not baselines.serves("flashmla-upconvert", get(base.format(64, 32) + "_fp8kv"))
    workload = next(w for w in workloads.suite("edge") if w.uuid == "edge-attention-mixed-scales-h16-fp8")
    # 40 pages, 2560 tokens, hold the 2048 ids: a small cache, converted fast under the interpreter.
    workload = dataclasses.replace(workload, axes={**workload.axes, "num_pages": 40})
    call = harness.prepare(workload, "cuda" if torch.cuda.is_available() else "cpu", seed=4)
    x = call.inputs
    seen = []
    module = SimpleNamespace(flash_mla_sparse_fwd=lambda *a, **kw: seen.append((a, kw)))
    bound = next(p for p in baselines.PLUGINS if p.name == "flashmla-upconvert").adapter(module, call)
    bound()
    bound()
    assert len(seen) == 2, "the conversion and the kernel run on every timed call"
    (q, kv, indices, scale, d_v), kw = seen[0]
    assert kw == {} and d_v == 512 and scale == x["sm_scale"]
    assert q.shape[1] == 64 and torch.equal(q[:, :16, :512], x["q_nope"]) and not bool(q[:, 16:].any())
    assert torch.equal(indices[:, 0], x["sparse_indices"])
    ckv, kpe = dequantize_mla_kv(x["kv_cache"].flatten(0, 1))
    full = torch.cat([ckv, kpe], 1)
    assert kv.shape == (full.shape[0], 1, 576) and kv.dtype == torch.bfloat16
    # bf16 rounding (the interpreter truncates, a GPU rounds to nearest: tests/test_fp8_staging.py, bit for bit)
    assert torch.allclose(kv[:, 0].float(), full, rtol=2**-7, atol=0)


def test_deepgemm_plugin_serves_the_prefill_indexer_with_its_logits_under_the_chunked_top_k(monkeypatch):
    """deepgemm: DeepGEMM's fp8_mqa_logits (compressed rows, max_seqlen_k the width) for each chunk, then the
    chunked path's own top-k; the bound call gives the definition's answer."""
    from dsactl.kernels.indexer import mqa_logits as ml, prefill_topk as pt

    assert baselines.serves("deepgemm", get("dsa_prefill_indexer_fp8_h64_d128_topk2048"))
    assert not baselines.serves("deepgemm", get(TOPK_DEF)) and not baselines.serves("deepgemm", get(CONTEST_INDEXER))
    monkeypatch.setattr(pt, "topk_page_transform",  # the CUDA top-k's torch baseline, the same contract, on a CPU
                        lambda scores, lengths, table, rows, out, topk, num_pages:
                        topk_page_transform(scores, lengths, table, rows, out, num_pages=num_pages))
    seen = []

    def fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
        seen.append((clean_logits, max_seqlen_k))
        logits = torch.full((q.shape[0], max_seqlen_k), float("nan"))
        ml.mqa_logits(q, *kv, weights, ks, ke, logits, clean=False, compressed=True)
        return logits

    workload = next(w for w in workloads.suite("edge") if w.uuid == "edge-prefill-indexer-prompts")
    call = harness.prepare(workload, "cpu", seed=2)
    plugin = next(p for p in baselines.PLUGINS if p.name == "deepgemm")
    harness.poison(call.outputs)
    plugin.adapter(SimpleNamespace(fp8_mqa_logits=fp8_mqa_logits), call)()
    assert seen and all(s == (False, call.inputs["k_index_fp8"].shape[0]) for s in seen)
    verdict = check(call.definition, call.inputs, call.outputs)
    assert verdict.passed, "\n".join(verdict.problems)


def _fake_bench_on(gpu: str):
    """runner.bench that reports running on `gpu`, times with _fake_timer on the CPU, and returns the run."""
    def fake(workloads_, settings, command, progress=None, on_ready=None, on_workload=None, executor=None):
        meta = {"command": command, "gpu": gpu, "sm_count": 1, "sm_clock_mhz": 1, "max_sm_clock_mhz": 1,
                "driver": "x", "timing_method": "fake", "peaks": {"copy_gbps": 1.0, "bf16_tflops": 1.0},
                "self_check": {"ok": True, "method": "fake", "nbytes": 2**20, "measured_us": 1.0, "expected_us": 1.0,
                               "deviation": 0.0}}
        on_ready(meta)
        return runner.run_bench(workloads_, settings, _fake_timer, device="cpu", meta=meta)
    return fake


def test_compare_keeps_the_file_it_compares_against_and_refuses_another_gpus(monkeypatch, tmp_path):
    """`bench --compare profiles/<gpu>/<stem>.csv` (the README's example) leaves that file as it was, and a CSV
    measured on another GPU is refused before anything is timed."""
    from dsactl import device

    monkeypatch.setattr(device, "profiles_dir", lambda gpu: tmp_path / "profiles" / device.gpu_slug(gpu))
    args = ["--iters", "2", "--trials", "1", "-b", "torch-topk"]
    monkeypatch.setattr(runner, "bench", _fake_bench_on("Fake GPU"))
    first = _bench_cli(*args)
    assert first.exit_code in (0, 1), first.output
    (baseline,) = (tmp_path / "profiles").rglob("*.csv")
    before = baseline.read_bytes()
    again = _bench_cli("--compare", str(baseline), *args)
    assert "is the file compared against" in again.output and baseline.read_bytes() == before
    monkeypatch.setattr(runner, "bench", _fake_bench_on("Other GPU"))
    other = _bench_cli("--compare", str(baseline), *args)
    assert "measured on Fake GPU, this run is on Other GPU" in str(other.exception) + other.output
    assert other.exit_code != 0 and len(list((tmp_path / "profiles").rglob("*.csv"))) == 1
