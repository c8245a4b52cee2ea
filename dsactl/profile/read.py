"""python -m dsactl.profile.read OUT_DIR COMMAND REPORT...: analyze() in its own
process (see analyze_in_child), plus the roofs as JSON for the parent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsactl.profile import ROOFS_FILE, analyze


def main(argv: list[str]) -> None:
    out_dir, command, *reports = argv
    a = analyze([Path(r) for r in reports], Path(out_dir), command)
    r = a.roofs
    (Path(out_dir) / ROOFS_FILE).write_text(json.dumps(
        {"dram_bytes_per_s": r.dram_bytes_per_s, "compute": r.compute, "source": r.source, "device": a.device}))


if __name__ == "__main__":
    main(sys.argv[1:])
