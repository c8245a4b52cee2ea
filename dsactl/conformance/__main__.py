"""python -m dsactl.conformance RUNNER --checkout PATH [--json FILE | --time CSV]: a peer's own tests against
dsactl's drop-in (RUNNER: flash_mla or deep_gemm), a summary line per suite, exit 1 unless every served case
passed; with --time, the peer's own cases timed with dsactl's module and with the peer built in the checkout."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from dsactl import probe

from .report import write

RUNNERS = ("flash_mla", "deep_gemm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsactl.conformance", description=__doc__)
    parser.add_argument("runner", choices=RUNNERS)
    parser.add_argument("--checkout", type=Path, required=True, help="the peer's repository (a work tree)")
    parser.add_argument("--json", type=Path, help="merge the reports into this file (profiles/<gpu>/conformance.json)")
    parser.add_argument("--time", type=Path, metavar="CSV",
                        help="instead, time the peer's own cases with dsactl's module and with the peer built in the "
                             "checkout, into CSV. flash_mla: FlashMLA's V3.2 performance cases "
                             "(profiles/<gpu>/flashmla-cases.csv); deep_gemm: every sm_90 FP8 case of DeepGEMM's "
                             "test_mqa_logits and test_paged_mqa_logits (profiles/<gpu>/deepgemm-cases.csv)")
    args = parser.parse_args(argv)
    if not (args.checkout / "tests").is_dir():
        parser.error(f"{args.checkout} has no tests/ folder: pass the peer's checkout")
    if args.time:
        return TIMERS[args.runner](args.checkout, args.time)
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


def _import_built(checkout: Path, name: str, needs: tuple[str, ...], first_call: str = ""):
    """(the peer's module built in the checkout, "") or (None, why not) where it does not import from there with
    `needs`, or where first_call, code run in a child process with the checkout on its path, fails or crashes
    (dsactl.probe); taken out of sys.modules, so that the name can then resolve to dsactl's drop-in."""
    sys.path.insert(0, str(checkout))
    try:
        module = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - not built, or its extension fails to load or initialise: each is told
        return None, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
    finally:
        sys.modules.pop(name, None)
    missing = [n for n in needs if not hasattr(module, n)]
    if missing:
        return None, f"it has no {', '.join(missing)}"
    why = probe.failure(first_call, [str(checkout)]) if first_call else ""
    return (None, why) if why else (module, "")


def _write_csv(csv_path: Path, comments: dict[str, str], columns: tuple[str, ...], rows: list[dict]) -> None:
    """The rows under '# key: value' lines that say how they were made."""
    import csv

    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        f.writelines(f"# {k}: {v}\n" for k, v in comments.items())
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def time_flash_mla(checkout: Path, csv_path: Path) -> int:
    """FlashMLA's performance cases, ours beside FlashMLA built in the checkout (its module imported before
    `flash_mla` is resolved to ours), one CSV row a case and a line each, written as each case is timed (a run
    cut short keeps the cases it finished)."""
    import torch

    from . import flash_mla

    real, why = _import_built(checkout, "flash_mla", ("flash_mla_with_kvcache", "cuda"))
    if real is None:
        print(f"{checkout}: FlashMLA does not import from there ({why}; build it: profiles/reproduce.sh "
              f"flashmla-cases, docs/design.md Baselines)", file=sys.stderr)
        return 2
    made = {"command": f"python -m dsactl.conformance flash_mla --checkout {checkout} --time {csv_path}",
            "gpu": torch.cuda.get_device_name(), "flashmla": flash_mla.checkout_commit(checkout)}

    def write(rows: list[dict]) -> None:
        _write_csv(csv_path, made, flash_mla.TIMING_COLUMNS, rows)
        r = rows[-1]
        print(f"{r['test']:8s} {r['layout']:7s} {r['dsactl_us']:10.1f} {r['flashmla_us']:10.1f} {r['speedup']:6.3f}  "
              f"max |diff| {r['max_abs_diff']:.3g}  {r['case'][:80]}", flush=True)

    if not flash_mla.time_performance_cases(checkout, real, write):
        _write_csv(csv_path, made, flash_mla.TIMING_COLUMNS, [])
    return 0


def time_deep_gemm(checkout: Path, csv_path: Path) -> int:
    """DeepGEMM's sm_90 indexer cases, ours beside DeepGEMM built in the checkout (its module imported before
    `deep_gemm` resolves to ours), one CSV row a case and a line each; exit 1 where a case could not be timed.
    The CSV is rewritten after each case, so a run cut short keeps the cases it finished."""
    import torch

    from . import deep_gemm_timing
    from .report import checkout_commit

    real, why = _import_built(checkout, "deep_gemm", deep_gemm_timing.REAL_NEEDS, probe.DEEP_GEMM)
    if real is None:
        print(f"{checkout}: DeepGEMM does not import or run from there ({why}; build it: profiles/reproduce.sh "
              f"deepgemm-cases, docs/design.md Baselines)", file=sys.stderr)
        return 2

    made = {"command": f"python -m dsactl.conformance deep_gemm --checkout {checkout} --time {csv_path}",
            "gpu": torch.cuda.get_device_name(), "deepgemm": checkout_commit(checkout)}

    def write(t) -> None:
        peak = f"{t.fp8_tflops:.0f} TFLOP/s (pct_fp8_peak's base)"
        _write_csv(csv_path, {**made, "timer": t.method, "fp8 peak": peak}, deep_gemm_timing.TIMING_COLUMNS, t.rows)

    t = deep_gemm_timing.time_cases(checkout, real, write)
    write(t)
    for r in t.rows:
        print(f"{r['test']:22s} {r['dsactl_us']:10.1f} {r['deepgemm_us']:10.1f} {r['speedup']:6.3f} "
              f"{r['pct_fp8_peak']:5.1f}%  {r['case'][:90]}")
    for name, why in t.untimed:
        print(f"not timed: {name}: {why}"[:400])
    return 1 if t.untimed else 0


TIMERS = {"flash_mla": time_flash_mla, "deep_gemm": time_deep_gemm}


if __name__ == "__main__":
    sys.exit(main())
