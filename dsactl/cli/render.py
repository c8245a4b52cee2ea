"""Shared rendering helpers: rich console and tables, JSON output."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.table import Table

# Width of tables written to a file or pipe (a CI log, `| tee`), where rich would otherwise fold every
# long definition name into 80 columns; a terminal, or COLUMNS when set, keeps its own width.
NON_TERMINAL_WIDTH = 200


def _width(stream: Any) -> int | None:
    if "COLUMNS" in os.environ or (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return NON_TERMINAL_WIDTH


console = Console(width=_width(sys.stdout))
err_console = Console(stderr=True, width=_width(sys.stderr))


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def write_json(path: str | Path, payload: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
