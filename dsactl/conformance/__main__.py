"""python -m dsactl.conformance RUNNER --checkout PATH [--json FILE]: a peer's own tests against dsactl's
drop-in (RUNNER: flash_mla or deep_gemm), a summary line per suite, exit 1 unless every served case passed."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .report import write

RUNNERS = ("flash_mla", "deep_gemm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsactl.conformance", description=__doc__)
    parser.add_argument("runner", choices=RUNNERS)
    parser.add_argument("--checkout", type=Path, required=True, help="the peer's repository (a work tree)")
    parser.add_argument("--json", type=Path, help="merge the reports into this file (profiles/<gpu>/conformance.json)")
    args = parser.parse_args(argv)
    if not (args.checkout / "tests").is_dir():
        parser.error(f"{args.checkout} has no tests/ folder: pass the peer's checkout")
    reports = importlib.import_module(f"{__package__}.{args.runner}").run(args.checkout)
    if args.json:
        write(args.json, reports)
    ok = True
    for r in reports:
        s = r.summary()
        skipped = sum(s["not_served"].values())
        print(f"{r.suite}: {s['passed']}/{s['total']} passed, {s['failed']} failed, {s['errors']} errors"
              f" ({skipped} cases not served: {', '.join(f'{k} x{v}' for k, v in s['not_served'].items()) or '-'})")
        for c in r.cases:
            if c.outcome not in ("passed", "not served"):
                print(f"  {c.outcome}: {c.name}: {c.reason}"[:400])
        ok &= s["passed"] == s["total"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
