"""The child process ncu profiles: `python -m dsactl.profile.worker --solution S | --baseline B [selection]
[--seed N]`.

Per workload: fresh inputs and poisoned outputs through dsactl.harness, one
warm-up call (compilation, autotuning), then one call inside the NVTX ranges
that ncu's filter selects. A baseline is bound to the call first, as bench binds
it (q padded to 64 heads, caches in the plug-in's layout), so only its kernels
run inside the ranges. Nothing else runs inside them.
"""

from __future__ import annotations

import argparse
import sys

from dsactl.errors import USER_ERRORS
from dsactl.profile.collect import NVTX_RANGE, SKIP_PREFIX, Selection, plan, range_name


def bound_call(target, w, seed: int, device: str = "cuda"):
    """The zero-argument call to profile on workload w, warmed up: the solution on poisoned outputs, or the
    baseline bound as bench binds it. None (after printing why) when it cannot run on w."""
    import functools

    from dsactl import harness
    from dsactl.bench import baselines
    from dsactl.definitions import get

    try:
        call = harness.prepare(w, device, seed)
        if target.solution is not None:
            fn = target.solution.load()
            harness.run(fn, call)
            harness.poison(call.outputs)
            return functools.partial(fn, *call.args())
        found, skipped = baselines.resolve(get(w.definition), [target.name], include_reference=False)
        if not found:
            print(f"{SKIP_PREFIX} {w.uuid}: {skipped[0].reason}", flush=True)
            return None
        bound = found[0].bind(call)
        bound()
        return bound
    except USER_ERRORS as e:
        print(f"{SKIP_PREFIX} {w.uuid}: {e}", flush=True)
        return None


def profile_calls(selection: Selection, seed: int) -> None:
    import torch

    (target,) = plan(selection, solutions_too=False)
    for w in target.workloads:
        fn = bound_call(target, w, seed)
        if fn is None:
            continue
        torch.cuda.synchronize()
        with torch.cuda.nvtx.range(NVTX_RANGE), torch.cuda.nvtx.range(range_name(target.name, w.uuid, w.label)):
            fn()
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None) -> tuple[Selection, int]:
    """The inverse of collect.worker_command."""
    p = argparse.ArgumentParser(prog="python -m dsactl.profile.worker", description=__doc__)
    for name in ("suite", "dataset", "definition"):
        p.add_argument(f"--{name}")
    p.add_argument("--workload", action="append", default=[])
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--solution")
    who.add_argument("--baseline", action="append", default=[])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    return Selection(a.suite, a.dataset, a.definition, tuple(a.workload), a.solution, tuple(a.baseline)), a.seed


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
