"""A peer's checkout for the conformance runners' CPU tests: the files a test names, written under a folder."""

from __future__ import annotations

import textwrap
from pathlib import Path


def write_checkout(root: Path, files: dict[str, str]) -> Path:
    """Each file (path relative to root: its text, dedented) written under root; root."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text).lstrip())
    return root
