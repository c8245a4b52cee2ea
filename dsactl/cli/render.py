"""Shared rendering helpers: rich console and tables, JSON output."""

from __future__ import annotations

import json
import os
import re
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


# A cell that reads as a number: 12, -3.5e-05, 100.00%, 12/255, inf; rich markup around it allowed.
_NUMBER = re.compile(r"^(\[[^\]]*\])?[-+]?(\d[\d.,]*(e[-+]?\d+)?%?(/\d+)?|inf|nan)(\[/[^\]]*\])?$")


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    """Numbers stay whole on one line, right-aligned; names and text fold to fit the width."""
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        column = [r[i] for r in cells if r[i]]
        numeric = bool(column) and all(_NUMBER.match(v) for v in column)
        t.add_column(c, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    for r in cells:
        t.add_row(*r)
    return t


def write_json(path: str | Path, payload: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
