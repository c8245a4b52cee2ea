"""Output paths checked before any work starts, so that a bad -o or --json is one line of
error at once rather than a traceback after a long run."""

from __future__ import annotations

import os
from pathlib import Path

from dsactl.errors import DsactlError


def output_file(path: Path | str | None, option: str) -> Path | None:
    """A file the command will write: not a folder, in a folder that exists or can be made."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        raise DsactlError(f"{option} {path}: is a folder; give a file path")
    if path.exists() and not os.access(path, os.W_OK):
        raise DsactlError(f"{option} {path}: the file is not writable")
    _creatable(path.parent, option, path)
    return path


def output_dir(path: Path | str | None, option: str) -> Path | None:
    """A folder the command will write into: a folder, or a path where one can be made."""
    if path is None:
        return None
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DsactlError(f"{option} {path}: is a file; give a folder")
    _creatable(path, option, path)
    return path


def _creatable(folder: Path, option: str, given: Path) -> None:
    # The nearest existing ancestor decides: the rest of the path is made on writing.
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise DsactlError(f"{option} {given}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DsactlError(f"{option} {given}: cannot write in {existing}")
