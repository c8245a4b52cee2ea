"""`dsactl unpack`: a bundle's sources written to a folder, byte for byte (UTF-8, newlines untouched)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsactl.errors import DsactlError
from dsactl.pack.check import validate_schema


def unpack(data: Any, out: str | Path) -> list[Path]:
    """Write every source under out, which must be empty or absent; the paths written."""
    validate_schema(data)
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DsactlError(f"{out} exists and is not an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    root = out.resolve()
    written = []
    for source in data["sources"]:
        target = out / source["path"]
        if not target.resolve().is_relative_to(root):  # validate_schema rejects this; a symlink could not escape
            raise DsactlError(f"source path {source['path']!r} leaves {out}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source["content"].encode("utf-8"))
        written.append(target)
    return written
