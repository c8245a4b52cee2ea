"""build/<arch>/manifest.json: which libraries a build holds and the source fingerprint each was made from."""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST_FILE = "manifest.json"


def read(arch_dir: Path) -> dict[str, str]:
    """library name -> source fingerprint; empty when nothing was built there."""
    path = arch_dir / MANIFEST_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text())["libraries"]


def write(arch_dir: Path, arch: str, libraries: dict[str, str]) -> None:
    payload = {"arch": arch, "libraries": dict(sorted(libraries.items()))}
    (arch_dir / MANIFEST_FILE).write_text(json.dumps(payload, indent=2) + "\n")
