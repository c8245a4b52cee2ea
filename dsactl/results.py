"""Result tables, rendered from the committed results under profiles/<gpu>/.

Each table in README.md sits between `<!-- results:NAME -->` and `<!-- /results -->` and shows the README's GPU,
each of README_TABLES that its results hold; `<!-- results:NAME GPU -->` shows GPU's instead (a run only that
GPU has made).
`render(NAME, GPU)` makes it from the CSV or JSON that profiles/reproduce.sh wrote; `python -m dsactl.results
--write README.md` rewrites every marked table and `--check README.md` exits 1 naming each one that differs, so
a published figure cannot drift from its source (a CPU test runs the check). `--print GPU` prints the tables
of any GPU's results.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable, Sequence

from dsactl.bench.metrics import stage
from dsactl.bench.report import read_csv
from dsactl.bench.runner import Result
from dsactl.definitions import get as get_definition
from dsactl.fp8 import PAGE_SIZE
from dsactl.workloads import suite

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
README_GPU = "h100-80gb-hbm3"  # the GPU whose results README.md shows
BLOCK = re.compile(r"(<!-- results:(?P<name>[a-z0-9-]+)(?: (?P<gpu>[a-z0-9-]+))? -->\n)"
                   r"(?P<body>.*?)(<!-- /results -->)", re.S)


def _rows(folder: Path, file: str) -> list[Result]:
    return read_csv(folder / file).results


@lru_cache(maxsize=None)
def _axes() -> dict[str, dict[str, int]]:
    """Workload id -> its axes, over every timed suite (the CSVs name workloads by id)."""
    return {w.uuid: w.axes for name in ("all", "prefill") for w in suite(name)}


def _md(header: Sequence[str], rows: Iterable[Sequence[str]], right_from: int = 1) -> str:
    """A markdown table; columns from `right_from` on are numbers, aligned right."""
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _us(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f}" if v >= 100 else f"{v:.2f}"


def _gmean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _family(definition: str) -> str:
    return stage(get_definition(definition))


def contest(folder: Path) -> str:
    """Per stage and contender on the contest suite: mean and max latency, and both means of the
    per-workload speedups (the contest's score is the arithmetic one)."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in _rows(folder, "contest.csv"):
        groups.setdefault((_family(r.definition), r.solution), []).append(r)
    out = []
    for (family, solution), rs in groups.items():
        speedups = [r.speedup for r in rs if r.speedup is not None and r.kind != "reference"]
        out.append((family, solution, str(len(rs)), _us(statistics.fmean(r.median_us for r in rs)),
                    _us(max(r.median_us for r in rs)),
                    f"{statistics.fmean(speedups):.1f}x" if speedups else "1x",
                    f"{_gmean(speedups):.1f}x" if speedups else "1x"))
    return _md(["stage", "contender", "workloads", "mean us", "max us", "speedup, arithmetic mean",
                "speedup, geometric mean"], out, right_from=2)


# Under 64 heads sparse decode does too little math per gathered byte to be bound by the tensor cores:
# its yardstick is the copy bandwidth (docs/design.md, "Kernels").
MEMORY_BOUND_BELOW_HEADS = 64


Cells = dict[tuple[int, str], dict[int, Result]]


def _attention_cells(folder: Path, file: str, fp8: bool) -> tuple[Cells, list[int]]:
    """One KV format's attention rows: (heads, solution) -> query tokens -> result, and the token counts."""
    axes = _axes()
    cells: Cells = {}
    for r in _rows(folder, file):
        p = get_definition(r.definition).params
        if p["fp8kv"] == fp8:
            cells.setdefault((p["heads"], r.solution), {})[axes[r.workload]["num_tokens"]] = r
    return cells, sorted({t for by_tokens in cells.values() for t in by_tokens})


def _ours(cells: Cells, heads: int) -> dict[int, Result]:
    return next((v for (h, s), v in cells.items() if h == heads and s.startswith("dsactl-attention")), {})


def _times(by_tokens: dict[int, Result], ts: Sequence[int]) -> list[str]:
    return [_us(by_tokens[t].median_us) if t in by_tokens else _us(None) for t in ts]


def _ratio(num: dict[int, Result], den: dict[int, Result], t: int) -> str:
    return f"{num[t].median_us / den[t].median_us:.2f}" if t in num and t in den else "—"


def _attention(folder: Path, fp8: bool) -> str:
    """Production attention, one KV format: latency per heads x tokens for our kernel and FlashMLA timed in
    the same run, FlashMLA's time over ours, and the implementation that served our rows."""
    cells, ts = _attention_cells(folder, "attention.csv", fp8)
    heads = sorted({h for h, _ in cells})
    rows = []
    for h in heads:
        ours = _ours(cells, h)
        theirs = cells.get((h, "flashmla"), {})
        impl = sorted({r.impl for r in ours.values()} - {""})
        times = _times(ours, ts)
        if h < MEMORY_BOUND_BELOW_HEADS:  # the share of the copy bandwidth beside the time
            times = [f"{c} ({ours[t].pct_copy_bw:.0f}%)" if t in ours and ours[t].pct_copy_bw else c
                     for c, t in zip(times, ts)]
        rows.append((f"{h}", "dsactl" + (f" ({', '.join(impl)})" if impl else ""), *times))
        if theirs:
            rows.append((f"{h}", "FlashMLA" + (" (padded to 64 heads)" if h < 64 else ""), *_times(theirs, ts)))
            rows.append((f"{h}", "FlashMLA / dsactl", *(_ratio(theirs, ours, t) for t in ts)))
    return _md(["heads", "contender, us", *(f"T={t}" for t in ts)], rows, right_from=2)


def attention_fp8(folder: Path) -> str:
    return _attention(folder, True)


def attention_bf16(folder: Path) -> str:
    return _attention(folder, False)


def prefill(folder: Path) -> str:
    """Prefill sizes, per heads: our bf16 and FP8 KV paths against FlashMLA's sparse prefill kernel, which reads
    bf16 KV only, timed in the same run; on an FP8 cache also against that kernel behind the upconversion an
    engine runs first (bench's flashmla-upconvert), where the run has it."""
    bf16, ts = _attention_cells(folder, "prefill.csv", False)
    fp8, _ = _attention_cells(folder, "prefill.csv", True)
    rows = []
    for h in sorted({h for h, _ in bf16}):
        ours, ours_fp8, theirs = _ours(bf16, h), _ours(fp8, h), bf16.get((h, "flashmla"), {})
        rows += [(f"{h}", "dsactl, bf16 KV", *_times(ours, ts)),
                 (f"{h}", "FlashMLA, bf16 KV", *_times(theirs, ts)),
                 (f"{h}", "FlashMLA / dsactl, bf16 KV", *(_ratio(theirs, ours, t) for t in ts)),
                 (f"{h}", "dsactl, FP8 KV", *_times(ours_fp8, ts)),
                 (f"{h}", "dsactl FP8 KV / FlashMLA bf16 KV", *(_ratio(ours_fp8, theirs, t) for t in ts))]
        upconverted = fp8.get((h, "flashmla-upconvert"))
        if upconverted:
            rows += [(f"{h}", "FlashMLA, FP8 KV upconverted to bf16", *_times(upconverted, ts)),
                     (f"{h}", "FlashMLA upconverted / dsactl, FP8 KV",
                      *(_ratio(upconverted, ours_fp8, t) for t in ts))]
    return _md(["heads", "contender, us", *(f"T={t}" for t in ts)], rows, right_from=2)


PREFILL_INDEXER_CONTENDERS = {"dsactl-prefill-indexer": "dsactl, logits in row chunks",
                               "dsactl-prefill-indexer-fused": "dsactl fused, no logits in memory",
                               "deepgemm": "DeepGEMM logits + dsactl top-k"}


def prefill_indexer(folder: Path) -> str:
    """The prefill indexer and its top-k over whole causal prompts: each contender's time, rate and what one call
    allocates beyond its inputs and outputs, and DeepGEMM's time over it (DeepGEMM's logits under our chunks and
    top-k, timed in the same run)."""
    axes = _axes()
    cells: dict[tuple[int, str], Result] = {}
    for r in _rows(folder, "prefill-indexer.csv"):
        if r.solution in PREFILL_INDEXER_CONTENDERS:
            cells[(axes[r.workload]["num_tokens"], r.solution)] = r
    rows = []
    for t in sorted({t for t, _ in cells}):
        theirs = cells.get((t, "deepgemm"))
        for name, label in PREFILL_INDEXER_CONTENDERS.items():
            r = cells.get((t, name))
            if r is None:
                continue
            ratio = f"{theirs.median_us / r.median_us:.2f}" if theirs is not None and name != "deepgemm" else "—"
            rate = f"{r.tflops:.0f}" if r.tflops is not None else "—"
            mib = f"{r.allocated_mib:.0f}" if r.allocated_mib is not None else "—"
            rows.append((f"{t // 1024}K", label, _us(r.median_us), rate, mib, ratio))
    return _md(["prompt", "contender", "us", "TFLOP/s", "MiB a call", "DeepGEMM / it"], rows, right_from=2)


ROWS_SHOWN = (1, 32, 128)  # batch sizes the README shows of the scale suite's five


def _pivot(folder: Path, file: str, row_axis: str, columns: tuple[str, Callable[[dict[str, int]], int]],
           solutions: dict[str, str], keep: Callable[[Result], bool] = lambda r: True) -> str:
    """Latency of named contenders, one row per (row axis, contender), one column per value of
    columns = (title, value from a workload's axes)."""
    axes = _axes()
    table: dict[tuple[int, str], dict[int, float]] = {}
    cols: set[int] = set()
    for r in _rows(folder, file):
        if r.solution not in solutions or not keep(r):
            continue
        a = axes[r.workload]
        if a[row_axis] not in ROWS_SHOWN:
            continue
        col = columns[1](a)
        cols.add(col)
        table.setdefault((a[row_axis], r.solution), {})[col] = r.median_us
    cs = sorted(cols)
    order = list(solutions)
    rows = [(str(k), solutions[s], *(_us(v.get(c)) for c in cs))
            for (k, s), v in sorted(table.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1])))]
    return _md([row_axis.replace("_", " "), "contender, us", *(f"{columns[0]} {c}" for c in cs)], rows, right_from=2)


def indexer(folder: Path) -> str:
    return _pivot(folder, "indexer.csv", "batch_size", ("ctx", lambda a: a["max_num_pages"] * PAGE_SIZE),
                  {"dsactl-indexer": "dsactl", "torch-indexer": "torch (vectorized)"})


def pipeline(folder: Path) -> str:
    """The whole decode step at 128 attention heads, FP8 KV, one query token: replayed from a CUDA graph (events,
    then its span on the GPU) and the sum of its kernels, per batch size (rows) and context (columns)."""
    from dsactl.bench.pipeline import read_csv as read_pipeline

    rows, _ = read_pipeline(folder / "pipeline.csv")
    shown = [r for r in rows if r.heads == 128 and r.kv_format == "fp8" and r.next_n == 1 and r.batch in ROWS_SHOWN]
    contexts = sorted({r.context for r in shown})
    contenders = (("step, CUDA graph", lambda r: r.graph_us), ("its span on the GPU", lambda r: r.graph_span_us),
                  ("its kernels, summed", lambda r: r.kernels_us))
    cell = {(r.batch, r.context): r for r in shown}
    table = [(str(b), name, *(_us(value(cell[b, c])) if (b, c) in cell else _us(None) for c in contexts))
             for b in sorted({r.batch for r in shown}) for name, value in contenders]
    return _md(["batch size", "contender, us", *(f"ctx {c}" for c in contexts)], table, right_from=2)


def _tune(folder: Path, suite_name: str) -> str:
    """One suite's `dsactl tune --json` (reproduce.sh runs it as a dry run), per kernel family: its shape
    buckets, how many a searched configuration beat the hand-picked one by tune's margin (what tune writes),
    and the gain, the hand-picked time over the fastest verified candidate's (1.00 where the hand-picked
    choice was fastest)."""
    data = json.loads((folder / f"tune-{suite_name}.json").read_text())
    families: dict[str, list[dict]] = {}
    for b in data["buckets"]:
        families.setdefault(b["family"], []).append(b)
    rows = []
    for family, buckets in families.items():
        gains = [b["gain"] for b in buckets if b["gain"]]
        top = max((b for b in buckets if b["gain"]), key=lambda b: b["gain"], default=None)
        rows.append((family, str(len(buckets)), str(sum(b["written"] for b in buckets)),
                     str(sum(b["hand_picked_us"] is None for b in buckets)),
                     f"{_gmean(gains):.3f}" if gains else "—",
                     f"{top['gain']:.3f} in `{top['bucket']}`" if top else "—"))
    return _md(["kernel family", "buckets", f"beaten by {data['min_gain']:.0%}+", "hand-picked refused",
                "gain, geometric mean", "largest gain"], rows)


def tune_contest(folder: Path) -> str:
    return _tune(folder, "contest")


def tune_scale(folder: Path) -> str:
    return _tune(folder, "scale")


def machine(folder: Path) -> str:
    """The GPU and software the results were measured with, from the environment.json of `dsactl doctor`."""
    env = json.loads((folder / "environment.json").read_text())
    card = env["gpus"][0]
    tools = {t["name"]: t for t in env["tools"]}
    software = ", ".join(f"{name} {tools[name]['version']}" for name in ("torch", "triton", "nvcc") if name in tools)
    return (f"Measured on one {card['name']} ({card['sm_count']} SMs, driver {card['driver']}; {software}); "
            f"source: `profiles/{folder.name}/`.\n")


def verify(folder: Path) -> str:
    """Per suite: (solution, workload) pairs that passed, failed or errored, from verify.json."""
    data = json.loads((folder / "verify.json").read_text())
    counts: dict[str, dict[str, int]] = {}
    for case in data["results"]:
        c = counts.setdefault(case["suite"], {"passed": 0, "failed": 0, "error": 0})
        c[case["status"]] += 1
    return _md(["suite", "passed", "failed", "errors"],
               ((s, str(c["passed"]), str(c["failed"]), str(c["error"])) for s, c in counts.items()))


def conformance(folder: Path) -> str:
    """Per peer suite: its cases dsactl's drop-in served and passed, out of those, and the ones left out by
    reason, from conformance.json (python -m dsactl.conformance)."""
    data = json.loads((folder / "conformance.json").read_text())
    return _md(["suite", "commit", "not served: why", "passed", "not served"],
               ((suite, r["source"][:7], "; ".join(dict.fromkeys(why.split(" (")[0] for why in r["not_served"])) or "-",
                 f"{r['passed']} / {r['total']}", str(sum(r["not_served"].values())))
                for suite, r in data.items()), right_from=3)


# Each table and the file under profiles/<gpu>/ it is rendered from.
TABLES: dict[str, tuple[str, Callable[[Path], str]]] = {
    "machine": ("environment.json", machine), "contest": ("contest.csv", contest),
    "attention-fp8": ("attention.csv", attention_fp8), "attention-bf16": ("attention.csv", attention_bf16), "prefill": ("prefill.csv", prefill),
    "indexer": ("indexer.csv", indexer), "pipeline": ("pipeline.csv", pipeline), "verify": ("verify.json", verify),
    "tune-contest": ("tune-contest.json", tune_contest), "tune-scale": ("tune-scale.json", tune_scale),
    "conformance": ("conformance.json", conformance), "prefill-indexer": ("prefill-indexer.csv", prefill_indexer),
}


# The tables README.md shows; tune's gains stay under --print.
README_TABLES = ("conformance", "machine", "verify", "contest", "attention-fp8", "attention-bf16", "prefill", "indexer",
                 "pipeline")


def folder_of(gpu: str) -> Path:
    return PROFILES / gpu


def available(gpu: str) -> list[str]:
    """The tables whose results profiles/<gpu>/ holds."""
    return [name for name, (source, _) in TABLES.items() if (folder_of(gpu) / source).is_file()]


def render(name: str, gpu: str = README_GPU) -> str:
    return TABLES[name][1](folder_of(gpu))


def _block(m: re.Match) -> str:
    return render(m.group("name"), m.group("gpu") or README_GPU)


def rewrite(text: str) -> str:
    """The text with every marked table rendered anew from its GPU's results (README_GPU's unless named)."""
    return BLOCK.sub(lambda m: m.group(1) + _block(m) + m.group(5), text)


def stale(text: str) -> list[str]:
    """The names of the marked tables whose text differs from their rendering."""
    return [m.group("name") for m in BLOCK.finditer(text) if m.group("body") != _block(m)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsactl.results", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="README", type=Path, help="rewrite the marked tables in place")
    mode.add_argument("--check", metavar="README", type=Path, help="exit 1 if a marked table differs")
    mode.add_argument("--print", metavar="GPU", dest="gpu",
                      help="print every table profiles/GPU/ has results for (e.g. h100-80gb-hbm3)")
    args = parser.parse_args(argv)
    if args.gpu:
        names = available(args.gpu)
        for name in names:
            print(f"{name} ({TABLES[name][0]}):\n\n{render(name, args.gpu)}")
        if not names:
            print(f"profiles/{args.gpu}/ holds none of: {', '.join(sorted({s for s, _ in TABLES.values()}))}",
                  file=sys.stderr)
        return 0 if names else 1
    path = args.write or args.check
    text = path.read_text()
    if args.write:
        path.write_text(rewrite(text))
        return 0
    bad = stale(text)
    for name in bad:
        print(f"{path}: table {name!r} differs from profiles/{README_GPU}/ "
              f"(python -m dsactl.results --write {path})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
