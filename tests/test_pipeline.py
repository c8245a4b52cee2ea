"""The end-to-end decode-step benchmark (dsactl/bench/pipeline.py) and the step inputs it shares with the
DecodeStep tests (dsactl/workloads/step_inputs.py).

On a CPU: the shape table, the inputs' page sharing, a whole timed shape under the Triton interpreter
with a timer that counts calls instead of timing them, and the CSV/JSON/PNG files. On a GPU: a small
sweep with the real timers."""

from __future__ import annotations

import os

import pytest
import torch

from dsactl.bench import pipeline, timing
from dsactl.errors import DsactlError
from dsactl.fp8 import PAGE_SIZE
from dsactl.kernels.step import DecodeStep
from dsactl.workloads import step_inputs as si

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
# Rows that fit in topk (the indexer's structural path): small enough for the interpreter.
TINY = pipeline.PipelineShape(batch=2, context=512, heads=16, kv_format="fp8", next_n=2, topk=512, index_heads=32)


def test_the_sweep_covers_the_serving_grid_once():
    shapes = pipeline.SHAPES
    assert len(shapes) == len(set(shapes)) == 2 * 2 * 3 * 3
    assert {(s.batch, s.context, s.heads, s.next_n) for s in shapes} == {
        (b, c, h, n) for b in (1, 32, 128) for c in (4096, 32768, 131072) for h in (16, 128) for n in (1, 2)}
    assert {s.kv_format for s in shapes} == {"fp8"}
    assert len({s.label for s in shapes}) == len(shapes)


def test_select_filters_by_field_and_refuses_an_empty_choice():
    chosen = pipeline.select(heads=[128], batch=[32], context=[32768])
    assert [s.label for s in chosen] == ["b32 ctx32K h128 fp8 n1", "b32 ctx32K h128 fp8 n2"]
    assert pipeline.select() == list(pipeline.SHAPES)
    with pytest.raises(DsactlError, match="no pipeline shape"):
        pipeline.select(heads=[64])


def test_step_inputs_share_one_page_table_and_draw_caches_in_chunks(monkeypatch):
    monkeypatch.setattr(si, "CHUNK_PAGES", 5)  # several chunks, the last one partial
    step = DecodeStep(batch=3, max_context=700, heads=16, kv_format="fp8", next_n=1, topk=512, index_heads=32,
                      device="cpu")
    inputs = si.step_inputs(step, seed=4)
    num_pages = 3 * step.max_pages + si.SPARE_PAGES
    table = inputs["block_table"]
    assert table.shape == (3, step.max_pages) and table.unique().numel() == table.numel()
    assert int(table.min()) >= 0 and int(table.max()) < num_pages
    assert inputs["k_index_cache_fp8"].shape == (num_pages, PAGE_SIZE, 1, 132)
    assert inputs["kv_cache"].shape == (num_pages, PAGE_SIZE, 656)
    for cache in (inputs["k_index_cache_fp8"], inputs["kv_cache"]):
        per_page = cache.view(num_pages, -1).abs().sum(dim=1)
        assert bool((per_page > 0).all()), "every page is drawn, the last chunk's included"
    scales = inputs["kv_cache"].view(torch.uint8)[..., 512:528].contiguous().view(torch.float32)
    assert torch.equal(scales, torch.exp2(torch.log2(scales).round())), "ue8m0 scales, as the model writes"
    lengths = inputs["seq_lens"].tolist()
    assert all(1 <= s <= 700 for s in lengths)
    again = si.step_inputs(step, seed=4)
    assert all(torch.equal(inputs[k], again[k]) for k in si.INDEX_NAMES[:-1] + ("q_nope", "kv_cache"))
    with pytest.raises(ValueError, match="seq_lens must be 3 lengths"):
        si.step_inputs(step, seed=4, seq_lens=[701, 5, 5])


class CountingTimer:
    """Runs each function once per timing and reports fixed times: what time_shape asks and assembles."""

    kernel_method = "cupti"

    def __init__(self):
        self.calls = []

    def kernels(self, fn):
        self.calls.append("kernels")
        fn()
        return [10.0, 12.0, 11.0]

    def graph(self, fn):
        self.calls.append("graph")
        fn()
        return "cuda-graph", [30.0]

    def graph_span(self, fn):
        self.calls.append("graph_span")
        fn()
        return [25.0, 27.0, 26.0]

    def events(self, fn):
        self.calls.append("events")
        fn()
        return [40.0, 44.0]


@pytest.mark.skipif(not INTERPRETING, reason="runs the Triton kernels under TRITON_INTERPRET=1 (CPU machines)")
def test_a_shape_is_timed_every_way_on_one_step():
    timer = CountingTimer()
    row = pipeline.time_shape(TINY, timer, "cpu", seed=3)
    assert sorted(timer.calls) == ["events", "events", "graph", "graph_span", "kernels", "kernels", "kernels"]
    assert (row.batch, row.context, row.heads, row.kv_format, row.next_n, row.topk) == (2, 512, 16, "fp8", 2, 512)
    assert row.graph_us == 30.0 and row.eager_us == 42.0 and row.reference_us == 42.0
    assert row.kernels_us == row.indexer_us == row.attention_us == 11.0
    assert row.graph_method == "cuda-graph" and row.kernel_method == "cupti"
    assert row.graph_over_kernels == pytest.approx(30.0 / 11.0)
    assert row.graph_span_us == 26.0 and row.span_over_kernels == pytest.approx(26.0 / 11.0)
    no_reference = pipeline.time_shape(TINY, CountingTimer(), "cpu", seed=3, reference=False)
    assert no_reference.reference_us is None


def _rows():
    full = pipeline.PipelineRow(32, 32768, 128, "fp8", 1, 2048, graph_us=101.5, graph_span_us=98.0,
                                eager_us=130.25, kernels_us=97.0, indexer_us=41.0, attention_us=56.0, reference_us=3021.0, graph_method="cuda-graph",
                                kernel_method="cupti")
    bare = pipeline.PipelineRow(1, 4096, 16, "fp8", 2, 2048, graph_us=20.0, graph_span_us=None, eager_us=35.0,
                                kernels_us=None, indexer_us=None, attention_us=None, reference_us=None, graph_method="cuda-events",
                                kernel_method=None)
    return [full, bare]


def test_csv_round_trips_and_json_holds_the_rows(tmp_path):
    rows, meta = _rows(), {"gpu": "NVIDIA H200", "command": "dsactl bench --pipeline"}
    path = pipeline.write_csv(tmp_path / "pipeline.csv", rows, meta)
    back, back_meta = pipeline.read_csv(path)
    assert back == rows and back_meta == meta
    assert back[0].graph_over_kernels == pytest.approx(101.5 / 97.0) and back[1].graph_over_kernels is None
    assert back[0].span_over_kernels == pytest.approx(98.0 / 97.0) and back[1].span_over_kernels is None
    data = pipeline.write_json(tmp_path / "pipeline.json", rows, meta).read_text()
    assert '"graph_us": 101.5' in data and '"kernel_method": null' in data
    (tmp_path / "other.csv").write_text("solution,workload,median_us\nx,y,1\n")
    with pytest.raises(DsactlError, match="not a dsactl pipeline CSV"):
        pipeline.read_csv(tmp_path / "other.csv")


def test_stage_plot_is_written(tmp_path):
    path = pipeline.plot_stages(_rows(), tmp_path / "stages.png")
    assert path.stat().st_size > 5000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.gpu
def test_gpu_sweep_times_a_step_and_its_graph_stays_near_its_kernels():
    shapes = [pipeline.PipelineShape(4, 8192, 128), pipeline.PipelineShape(4, 8192, 16, next_n=2)]
    rows = pipeline.run_pipeline(shapes, pipeline.CudaTimer(iters=5, warmup=2), "cuda")
    for row in rows:
        assert row.graph_method == "cuda-graph"
        assert 0 < row.kernels_us <= row.graph_us * 1.05 and row.eager_us > 0 and row.reference_us > row.kernels_us
        # The span holds every kernel of one replay and excludes the graph's launch; it is read from CUPTI.
        if "cupti" in timing.available_methods():
            assert row.kernels_us * 0.95 <= row.graph_span_us <= row.graph_us * 1.05
        else:
            assert row.graph_span_us is None
        assert row.indexer_us > 0 and row.attention_us > 0


def _bench_cli(*args):
    from typer.testing import CliRunner

    from dsactl.cli import app

    return CliRunner().invoke(app, ["bench", *args])


@pytest.mark.parametrize("args,message", [
    (["--pipeline", "--heads", "64"], "no pipeline shape matches the filters given"),
    (["--heads", "16"], "--heads, --batch and --context choose pipeline shapes: they need --pipeline"),
    (["--pipeline", "--method", "bogus"], "unknown timing method 'bogus'; choose auto, cupti, torch-profiler, "
                                          "cuda-graph"),
    (["--pipeline", "--gpus", "0"], "--pipeline times the step on this process's GPU: --gpus and --ray do not apply"),
])
def test_cli_refuses_bad_pipeline_options_before_any_work(args, message):
    r = _bench_cli(*args)
    assert isinstance(r.exception, DsactlError) and str(r.exception) == message and r.output == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where CUDA is missing")
def test_cli_pipeline_without_a_gpu_says_so(tmp_path):
    r = _bench_cli("--pipeline", "--csv", str(tmp_path / "p.csv"))
    assert isinstance(r.exception, DsactlError) and "none is visible here" in str(r.exception)
    assert not (tmp_path / "p.csv").exists()
