"""Bench output: rich tables on the console, CSV and JSON files with a header.

Files go to profiles/<gpu-slug>/ by default. The CSV header is comment lines
`# key: <json>` (the exact command line, GPU, clocks, driver, tool versions,
timing method, peaks, self-check), then `# scores: <json list>` (runner.Score per
solution and definition), then one row per (contender, workload) with the
columns of runner.Result. The JSON holds the same plus the skipped contenders.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Iterable

from rich.table import Table

from dsactl.bench.baselines import Skipped
from dsactl.bench.runner import BenchRun, Result
from dsactl.cli.render import table
from dsactl.errors import DsactlError

COLUMNS = [f.name for f in fields(Result)]
_INT = {"iters", "trials", "size"}
_OPTIONAL_INT = {"needed_bytes", "needed_flops", "active_sms"}
_FLOAT = {"median_us", "min_us", "max_us", "spread_us"}
_OPTIONAL_FLOAT = {"speedup", "gbps", "pct_copy_bw", "tflops", "pct_bf16_peak", "allocated_mib"}
_LIST = {"trial_medians_us"}
LIST_SEPARATOR = ";"
SCORES_KEY = "scores"  # the CSV header line of the scores; derived from the rows, not kept as meta


def check_writable(path: str | Path) -> None:
    """Raise DsactlError unless a file can be written at path: not a directory, its parent
    created now (the write would create it anyway; making it is the only sure test, e.g. under
    /proc or as root) and writable."""
    path = Path(path)
    if path.is_dir():
        raise DsactlError(f"cannot write {path}: it is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise DsactlError(f"cannot write {path}: {path.parent} is not a directory") from None
    except OSError as e:
        raise DsactlError(f"cannot write {path}: cannot create {path.parent} ({e.strerror or e})") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise DsactlError(f"cannot write {path}: {path.parent} is not writable")


def default_stem(source: str, definition: str | None, solutions: list[str] | None) -> str:
    parts = ["bench", Path(source).stem if "/" in source or "." in source else source]
    if definition:
        parts.append(definition)
    if solutions:
        parts.extend(solutions)
    return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "-", p).strip("-") for p in parts)


def default_paths(gpu: str, stem: str) -> tuple[Path, Path]:
    from dsactl.device import profiles_dir

    folder = profiles_dir(gpu)
    return folder / f"{stem}.csv", folder / f"{stem}.json"


def _cell(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name in _LIST:
        return LIST_SEPARATOR.join(repr(float(v)) for v in value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _parse(name: str, text: str) -> Any:
    if name in _LIST:
        return [float(v) for v in text.split(LIST_SEPARATOR)] if text else []
    if name in _INT:
        return int(text)
    if name in _FLOAT:
        return float(text)
    if name in _OPTIONAL_INT:
        return int(text) if text else None
    if name in _OPTIONAL_FLOAT:
        return float(text) if text else None
    return text


def write_meta(out: io.StringIO, meta: dict[str, Any]) -> None:
    """A results CSV's header: one `# key: json value` line per item of meta."""
    for key, value in meta.items():
        out.write(f"# {key}: {json.dumps(value, default=str)}\n")


def read_meta(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """A results CSV's header (write_meta) and the CSV lines after it."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise DsactlError(f"cannot read {path}: {e.strerror}") from None
    meta: dict[str, Any] = {}
    body = []
    for line in lines:
        if line.startswith("# "):
            key, _, value = line[2:].partition(": ")
            meta[key] = json.loads(value)
        else:
            body.append(line)
    return meta, body


def write_csv(path: str | Path, run: BenchRun) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    write_meta(out, run.meta)
    out.write(f"# {SCORES_KEY}: {json.dumps([asdict(s) for s in run.scores()])}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in run.results:
        d = r.to_dict()
        writer.writerow([_cell(c, d[c]) for c in COLUMNS])
    path.write_text(out.getvalue())
    return path


def read_csv(path: str | Path) -> BenchRun:
    meta, body = read_meta(path)
    reader = csv.DictReader(body)
    if reader.fieldnames is None or not {"solution", "workload", "median_us"} <= set(reader.fieldnames):
        raise DsactlError(f"{path} is not a dsactl bench CSV (no solution/workload/median_us columns)")
    meta.pop(SCORES_KEY, None)
    known = set(COLUMNS)
    results = [Result(**{k: _parse(k, v) for k, v in row.items() if k in known}) for row in reader]
    return BenchRun(meta=meta, results=results)


def to_json(run: BenchRun) -> dict[str, Any]:
    return {
        "meta": run.meta,
        "results": [r.to_dict() for r in run.results],
        "skipped": [asdict(s) for s in run.skipped],
        "scores": [asdict(s) for s in run.scores()],
    }


def write_json(path: str | Path, run: BenchRun) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(run), indent=2, default=str) + "\n")
    return path


def read_json(path: str | Path) -> BenchRun:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DsactlError(f"cannot read {path}: {e}") from None
    known = set(COLUMNS)
    return BenchRun(meta=data["meta"], results=[Result(**{k: v for k, v in r.items() if k in known})
                                                for r in data["results"]],
                    skipped=[Skipped(**s) for s in data.get("skipped", [])])


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _rate(value: float | None, fmt: str, pct: float | None) -> str:
    return _num(value, fmt) + (f" ({pct:.0f}%)" if pct is not None else "")


def results_table(results: Iterable[Result]) -> Table:
    rows = []
    for r in results:
        name = {"solution": r.solution, "reference": f"reference ({r.iters} iters)"}.get(r.kind, f"{r.solution} ({r.kind})")
        rows.append((r.workload, r.label, name, r.impl, _num(r.median_us, ".2f"),
                     f"{r.min_us:.2f}-{r.max_us:.2f}", _num(r.spread_us, ".2f"), _num(r.speedup, ".2f"),
                     _rate(r.gbps, ".0f", r.pct_copy_bw), _rate(r.tflops, ".1f", r.pct_bf16_peak),
                     _num(r.active_sms, "d"), r.method))
    return table("latency; GB/s and TFLOP/s of the bytes and FLOPs each call must touch and do",
                 ["workload", "class", "solution", "impl", "median us", "min-max us", "trial spread us", "speedup",
                  "GB/s (% copy)", "TFLOP/s (% bf16 matmul)", "active SMs", "method"], rows)


def scores_table(run: BenchRun) -> Table:
    return table("per solution: mean latency; speedup over the reference (contest score: arithmetic mean)",
                 ["solution", "definition", "workloads", "mean latency us", "arithmetic mean speedup",
                  "geometric mean speedup"],
                 ((s.solution, s.definition, s.workloads, f"{s.mean_latency_us:.2f}",
                   _num(s.arith_mean_speedup, ".2f"), _num(s.geo_mean_speedup, ".2f")) for s in run.scores()))


def skipped_table(skipped: Iterable[Skipped]) -> Table:
    return table("skipped", ["name", "kind", "definition", "workload", "why"],
                 ((s.name, s.kind, s.definition, s.workload or "all", s.reason) for s in skipped))
