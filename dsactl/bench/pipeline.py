"""The whole DSA decode step timed end to end (`dsactl bench --pipeline`).

A DecodeStep (kernels/step.py: indexer scores, top-k with page translation, sparse MLA attention, the ids
passing between them on the device) over serving shapes, each timed four ways in one run, every call
after a cold-L2 flush:

  graph_us      the step captured once as a CUDA graph, its replays timed with CUDA events (the graph's own
                launch latency included: graph_us beside graph_span_us in profiles/<gpu>/pipeline.csv)
  graph_span_us the same replays on the GPU's clock (CUPTI): first kernel's start to last kernel's end, the
                gaps between the step's kernels included. An engine captures every layer's step in one
                graph, so this, not graph_us, is what one step adds to it
  eager_us      the step called as is, timed with CUDA events: its per-call checks and launch gaps count
  kernels_us    the device time of the step's kernels (CUPTI, else torch.profiler), and per stage:
                indexer_us (scores + top-k) and attention_us (sparse MLA + its split combine)
  reference_us  the vectorized PyTorch stages an engine could write (the torch indexer baseline, then the
                torch attention baseline on its ids), timed with CUDA events

graph_span_us / kernels_us is what the launch gaps left in a graph cost. Every request holds the shape's whole
context (seq_lens = context), so the indexer scores every row.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from dsactl import png
from dsactl.bench.report import read_meta, write_meta
from dsactl.errors import DsactlError


@dataclass(frozen=True)
class PipelineShape:
    batch: int
    context: int
    heads: int
    kv_format: str = "fp8"
    next_n: int = 1
    topk: int = 2048
    index_heads: int = 64

    @property
    def label(self) -> str:
        return f"b{self.batch} ctx{self.context // 1024}K h{self.heads} {self.kv_format} n{self.next_n}"


# Serving shapes: batch x context at the head counts of TP8 (16) and one GPU (128), FP8 KV, with and
# without one speculative token (next_n 2).
SHAPES = tuple(PipelineShape(batch, context, heads, "fp8", next_n)
               for heads in (16, 128) for next_n in (1, 2) for batch in (1, 32, 128)
               for context in (4096, 32768, 131072))


@dataclass
class PipelineRow:
    batch: int
    context: int
    heads: int
    kv_format: str
    next_n: int
    topk: int
    graph_us: float
    graph_span_us: float | None
    eager_us: float
    kernels_us: float | None
    indexer_us: float | None
    attention_us: float | None
    reference_us: float | None
    graph_method: str  # cuda-graph, or cuda-events where the step could not be captured
    kernel_method: str | None  # cupti or torch-profiler; None: no kernel timer here

    @property
    def label(self) -> str:
        return PipelineShape(self.batch, self.context, self.heads, self.kv_format, self.next_n, self.topk).label

    @property
    def graph_over_kernels(self) -> float | None:
        return self.graph_us / self.kernels_us if self.kernels_us else None

    @property
    def span_over_kernels(self) -> float | None:
        return self.graph_span_us / self.kernels_us if self.kernels_us and self.graph_span_us else None


COLUMNS = [f.name for f in fields(PipelineRow)]


class Timer(Protocol):
    """Per-call times in us of a function, each call after a cold-L2 flush."""

    kernel_method: str | None

    def kernels(self, fn: Callable[[], Any]) -> list[float] | None: ...

    def graph(self, fn: Callable[[], Any]) -> tuple[str, list[float]]: ...

    def graph_span(self, fn: Callable[[], Any]) -> list[float] | None: ...

    def events(self, fn: Callable[[], Any]) -> list[float]: ...


class CudaTimer:
    """Timer on the current CUDA device, through dsactl.bench.timing."""

    def __init__(self, iters: int, warmup: int, kernel_method: str | None = None) -> None:
        from dsactl.bench import timing

        self._timing, self.iters, self.warmup = timing, iters, warmup
        self.flusher = timing.L2Flusher("cuda")
        if kernel_method is None:
            kernel_method = next((m for m in timing.available_methods() if m in timing.KERNEL_METHODS), None)
        elif kernel_method not in timing.KERNEL_METHODS:
            raise DsactlError(f"the step's kernels are timed with one of {', '.join(timing.KERNEL_METHODS)}, "
                              f"not {kernel_method!r}")
        self.kernel_method = kernel_method

    def kernels(self, fn):
        if self.kernel_method is None:
            return None
        return self._timing.measure(fn, self.kernel_method, self.iters, self.warmup, self.flusher)[1]

    def graph(self, fn):
        return self._timing.measure(fn, "cuda-graph", self.iters, self.warmup, self.flusher)

    def graph_span(self, fn):
        if self.kernel_method != "cupti":
            return None
        return self._timing.measure_graph_span(fn, self.iters, self.warmup, self.flusher)

    def events(self, fn):
        return self._timing.measure_events(fn, self.iters, self.warmup, self.flusher)


def _median(times: Sequence[float] | None) -> float | None:
    return statistics.median(times) if times else None


def time_shape(shape: PipelineShape, timer: Timer, device: Any = "cuda", *, seed: int = 0,
               reference: bool = True) -> PipelineRow:
    """One shape's row: a DecodeStep and its inputs built here, then every column of the module docstring."""
    import torch

    from dsactl.kernels import ops
    from dsactl.kernels.attention.torch_baseline import sparse_mla_attention as torch_attention
    from dsactl.kernels.indexer.torch_baseline import dsa_topk_indexer_torch
    from dsactl.kernels.step import DecodeStep
    from dsactl.workloads.step_inputs import INDEX_NAMES, caches, call_step, step_inputs

    step = DecodeStep(batch=shape.batch, max_context=shape.context, heads=shape.heads, kv_format=shape.kv_format,
                      next_n=shape.next_n, topk=shape.topk, index_heads=shape.index_heads, device=device)
    inputs = step_inputs(step, seed, seq_lens=[shape.context] * shape.batch)
    index_args = [inputs[k] for k in INDEX_NAMES]
    ids = step.topk_indices.view(step.num_tokens, shape.topk)
    attention_args = (inputs["q_nope"], inputs["q_pe"], ids, inputs["sm_scale"], step.output, step.lse)

    def run_step():
        call_step(step, inputs)

    def run_indexer():
        ops.indexer_topk_out(*index_args, step.topk_indices)

    def run_attention():
        ops.sparse_mla_decode_out(*attention_args, **caches(inputs))

    graph_method, graph = timer.graph(run_step)
    reference_us = None
    if reference:
        ref_ids, ref_out, ref_lse = (torch.empty_like(t) for t in (step.topk_indices, step.output, step.lse))

        def run_reference():
            dsa_topk_indexer_torch(*index_args, ref_ids)
            torch_attention(inputs["q_nope"], inputs["q_pe"], ref_ids.view_as(ids), inputs["sm_scale"], ref_out,
                            ref_lse, **caches(inputs))

        reference_us = _median(timer.events(run_reference))
    return PipelineRow(shape.batch, shape.context, shape.heads, shape.kv_format, shape.next_n, shape.topk,
                       graph_us=_median(graph), graph_span_us=_median(timer.graph_span(run_step)),
                       eager_us=_median(timer.events(run_step)),
                       kernels_us=_median(timer.kernels(run_step)), indexer_us=_median(timer.kernels(run_indexer)),
                       attention_us=_median(timer.kernels(run_attention)), reference_us=reference_us,
                       graph_method=graph_method, kernel_method=timer.kernel_method)


def run_pipeline(shapes: Sequence[PipelineShape], timer: Timer, device: Any = "cuda", *, seed: int = 0,
                 reference: bool = True, on_row: Callable[[PipelineRow], None] = lambda row: None
                 ) -> list[PipelineRow]:
    """time_shape over the shapes in order; each shape's tensors are freed before the next is built."""
    import gc

    import torch

    rows = []
    for shape in shapes:
        rows.append(time_shape(shape, timer, device, seed=seed, reference=reference))
        on_row(rows[-1])
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def select(shapes: Sequence[PipelineShape] = SHAPES, *, heads: Sequence[int] = (), batch: Sequence[int] = (),
           context: Sequence[int] = (), next_n: Sequence[int] = ()) -> list[PipelineShape]:
    """The shapes whose fields are among those given (an empty filter keeps every value)."""
    chosen = [s for s in shapes if (not heads or s.heads in heads) and (not batch or s.batch in batch)
              and (not context or s.context in context) and (not next_n or s.next_n in next_n)]
    if not chosen:
        raise DsactlError("no pipeline shape matches the filters given")
    return chosen


# ------------------------------------------------------------------ files

def _cell(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _parse(name: str, text: str) -> Any:
    kind = PipelineRow.__dataclass_fields__[name].type
    if text == "":
        return None
    if kind == "int":
        return int(text)
    if kind.startswith("float"):
        return float(text)
    return text


def write_csv(path: str | Path, rows: Sequence[PipelineRow], meta: dict[str, Any]) -> Path:
    """Rows under `# key: value` lines of meta (the command, the GPU, the timing methods)."""
    path = Path(path)
    out = io.StringIO()
    write_meta(out, meta)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow([_cell(getattr(row, c)) for c in COLUMNS])
    path.write_text(out.getvalue())
    return path


def read_csv(path: str | Path) -> tuple[list[PipelineRow], dict[str, Any]]:
    meta, body = read_meta(path)
    reader = csv.DictReader(body)
    if reader.fieldnames != COLUMNS:
        raise DsactlError(f"{path} is not a dsactl pipeline CSV (columns {reader.fieldnames})")
    return [PipelineRow(**{k: _parse(k, v) for k, v in r.items()}) for r in reader], meta


def write_json(path: str | Path, rows: Sequence[PipelineRow], meta: dict[str, Any]) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1, default=str) + "\n")
    return path


def plot_stages(rows: Sequence[PipelineRow], path: str | Path) -> Path:
    """Per shape, the graph-replayed step (its span; graph_us where no span was taken) as its stages' kernel times,
    each timed alone, plus what the replay takes beyond them (the gaps between kernels, and whatever the stages
    cost more inside the step), with the replay's event time and the eager step's time marked: one horizontal
    bar a shape, log time axis."""
    from dsactl.bench.plot import _pyplot

    plt = _pyplot()
    timed = [r for r in rows if r.indexer_us is not None and r.attention_us is not None]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(timed) + 1.5))
    ys = range(len(timed))
    indexer = [r.indexer_us for r in timed]
    attention = [r.attention_us for r in timed]
    gaps = [max((r.graph_span_us or r.graph_us) - r.indexer_us - r.attention_us, 0.0) for r in timed]
    ax.barh(ys, indexer, color="tab:blue", label="indexer + top-k kernels")
    ax.barh(ys, attention, left=indexer, color="tab:orange", label="attention kernels")
    ax.barh(ys, gaps, left=[i + a for i, a in zip(indexer, attention)], color="tab:gray",
            label="graph span beyond the stages timed alone")
    ax.scatter([r.graph_us for r in timed], ys, marker="x", color="tab:red", s=25,
               label="graph replay, its launch included (events)", zorder=3)
    ax.scatter([r.eager_us for r in timed], ys, marker="|", color="black", s=80, label="eager step", zorder=3)
    ax.set_yticks(list(ys), [r.label for r in timed], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("us")
    ax.set_title("DSA decode step: where the time goes", fontsize=9)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    # Below the axes: inside, the legend would cover the last shapes' bars.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.5 / len(timed) - 0.04), ncol=3)
    fig.tight_layout()
    png.save(fig, path)
    plt.close(fig)
    return Path(path)
