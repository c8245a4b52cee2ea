"""build/<arch>/manifest.json: which libraries a build holds and the source fingerprint each was made from
(the kernels' loader, kernels/cuda_library.py, reads it to refuse a stale build)."""

from __future__ import annotations

import json
from pathlib import Path

from dsactl.kernels.cuda_library import MANIFEST_FILE


def write(arch_dir: Path, arch: str, libraries: dict[str, str]) -> None:
    payload = {"arch": arch, "libraries": dict(sorted(libraries.items()))}
    (arch_dir / MANIFEST_FILE).write_text(json.dumps(payload, indent=2) + "\n")
