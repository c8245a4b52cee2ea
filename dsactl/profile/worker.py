"""The child process ncu profiles: `python -m dsactl.profile.worker --solution S [selection] [--seed N]`.

Per workload: fresh inputs and poisoned outputs through dsactl.harness, one
warm-up call (compilation, autotuning), then one call inside the NVTX ranges
that ncu's filter selects. Nothing else runs inside the ranges.
"""

from __future__ import annotations

import argparse
import sys

from dsactl.errors import USER_ERRORS
from dsactl.profile.collect import NVTX_RANGE, SKIP_PREFIX, Selection, plan, range_name


def profile_calls(selection: Selection, seed: int) -> None:
    import torch

    from dsactl import harness

    (target,) = plan(selection)
    fn = target.solution.load()
    for w in target.workloads:
        try:
            call = harness.prepare(w, "cuda", seed)
            harness.run(fn, call)
        except USER_ERRORS as e:
            print(f"{SKIP_PREFIX} {w.uuid}: {e}", flush=True)
            continue
        harness.poison(call.outputs)
        args = call.args()
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range(NVTX_RANGE), torch.cuda.nvtx.range(range_name(target.solution.name, w.uuid,
                                                                                   w.label)):
            fn(*args)
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None) -> tuple[Selection, int]:
    """The inverse of collect.worker_command."""
    p = argparse.ArgumentParser(prog="python -m dsactl.profile.worker", description=__doc__)
    for name in ("suite", "dataset", "definition"):
        p.add_argument(f"--{name}")
    p.add_argument("--workload", action="append", default=[])
    p.add_argument("--solution", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    return Selection(a.suite, a.dataset, a.definition, tuple(a.workload), a.solution), a.seed


def main(argv: list[str] | None = None) -> int:
    selection, seed = parse_args(argv)
    try:
        profile_calls(selection, seed)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
