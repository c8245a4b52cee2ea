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
    parser.add_argument("--time", type=Path, metavar="CSV",
                        help="flash_mla: instead, time FlashMLA's own V3.2 performance cases with dsactl's module and "
                             "with FlashMLA built in the checkout, into CSV (profiles/<gpu>/flashmla-cases.csv)")
    args = parser.parse_args(argv)
    if not (args.checkout / "tests").is_dir():
        parser.error(f"{args.checkout} has no tests/ folder: pass the peer's checkout")
    if args.time:
        if args.runner != "flash_mla":
            parser.error("--time times FlashMLA's cases: use it with flash_mla")
        return time_flash_mla(args.checkout, args.time)
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


def time_flash_mla(checkout: Path, csv_path: Path) -> int:
    """FlashMLA's performance cases, ours beside FlashMLA built in the checkout (its module imported before
    `flash_mla` is resolved to ours), one CSV row a case and a line each."""
    import csv

    import torch

    from . import flash_mla

    sys.path.insert(0, str(checkout))
    try:
        real = importlib.import_module("flash_mla")
    except ImportError:
        real = None
    if not hasattr(real, "flash_mla_with_kvcache") or not hasattr(real, "cuda"):
        print(f"{checkout}: FlashMLA does not import from there (build it: profiles/reproduce.sh flashmla-cases, "
              f"docs/design.md Baselines)", file=sys.stderr)
        return 2
    del sys.modules["flash_mla"]
    rows = flash_mla.time_performance_cases(checkout, real)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        f.write(f"# command: python -m dsactl.conformance flash_mla --checkout {checkout} --time {csv_path}\n"
                f"# gpu: {torch.cuda.get_device_name()}\n# flashmla: {flash_mla.checkout_commit(checkout)}\n")
        writer = csv.DictWriter(f, flash_mla.TIMING_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    for r in rows:
        print(f"{r['test']:8s} {r['layout']:7s} {r['dsactl_us']:10.1f} {r['flashmla_us']:10.1f} {r['speedup']:6.3f}  "
              f"{r['case'][:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
