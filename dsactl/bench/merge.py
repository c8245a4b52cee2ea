"""Rows timed on several GPU types, split per type: profiles/<gpu>/ holds only what that GPU measured.

A run on one GPU type writes exactly what it always did. A run whose workloads were spread over a mixed
cluster (an H100 node and an H200 node) gets one CSV/JSON per type, each with the header (clocks,
driver, timing method, peaks) of a GPU of that type, so that every file compares like with like.
"""

from __future__ import annotations

from pathlib import Path

from dsactl.bench import report
from dsactl.bench.runner import BenchRun
from dsactl.device import gpu_slug


def by_gpu_type(run: BenchRun) -> dict[str, BenchRun]:
    """slug -> the rows of that GPU type, with the run's header overlaid by that type's own environment;
    rows that name no GPU are the run's GPU's."""
    fallback = run.meta.get("gpu") or "gpu"
    names: dict[str, str] = {}
    rows: dict[str, list] = {}
    for r in run.results:
        name = r.gpu or fallback
        slug = gpu_slug(name)
        names.setdefault(slug, name)
        rows.setdefault(slug, []).append(r)
    return {slug: BenchRun(meta={**run.meta, **run.gpu_meta.get(names[slug], {})}, results=part,
                           skipped=list(run.skipped))
            for slug, part in rows.items()}


def targets(run: BenchRun, stem: str, csv_path: str | None, json_path: str | None,
            defaults: bool) -> list[tuple[str, Path, BenchRun]]:
    """(format, path, rows) of every file to write: a path given on the command line gets every row;
    the default place, profiles/<gpu>/<stem>.csv|json, gets each GPU type's own rows."""
    parts = by_gpu_type(run) if defaults else {}
    out = []
    for index, (kind, given) in enumerate((("csv", csv_path), ("json", json_path))):
        if given:
            out.append((kind, Path(given), run))
        elif defaults:
            for slug, part in parts.items():
                out.append((kind, report.default_paths(slug, stem)[index], part))
    return out


def write(run: BenchRun, stem: str, csv_path: str | None, json_path: str | None, defaults: bool) -> list[Path]:
    writers = {"csv": report.write_csv, "json": report.write_json}
    return [writers[kind](path, part) for kind, path, part in targets(run, stem, csv_path, json_path, defaults)]
