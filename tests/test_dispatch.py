"""The attention dispatch's token thresholds agree with their measurement.

profiles/<gpu>/dispatch.csv (`bash profiles/reproduce.sh dispatch`) times the shipped entry beside each kernel
forced, at every head count and 1-128 tokens, bf16 and FP8 KV. On each GPU measured, the kernel the dispatch
picks for each row must be the one that served the entry there, and no slower than the fastest kernel it may
pick by more than the margin below; a threshold that drifted from its measurement fails here, on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsactl.bench.report import read_csv
from dsactl.definitions import get as get_definition
from dsactl.kernels.attention import dispatch
from dsactl.workloads import suite

ROOT = Path(__file__).resolve().parents[1]
MEASURED = sorted((ROOT / "profiles").glob("*/dispatch.csv"))
FORCED = {f"dsactl-{impl}": impl for impl in dispatch.IMPLEMENTATIONS}
# A pick within 5% of the fastest, or 0.5 us at the shortest calls, is a tie: two runs differ by as much.
MARGIN, SLACK_US = 1.05, 0.5
# Kernels the dispatch never picks for a (heads, FP8 KV) pair on purpose, whatever they measure: the
# 16-head bf16 definition is the contest's, and its bundle stays free of CUDA.
POLICY = {(16, False): {dispatch.HOPPER}}


def _rows():
    axes = {w.uuid: w.axes for w in suite("dispatch")}
    for path in MEASURED:
        by_workload: dict[str, dict[str, object]] = {}
        for r in read_csv(path).results:
            by_workload.setdefault(r.workload, {})[r.solution] = r
        for workload, row in sorted(by_workload.items()):
            p = get_definition(next(iter(row.values())).definition).params
            yield pytest.param(p["heads"], p["fp8kv"], axes[workload]["num_tokens"], row,
                               id=f"{path.parent.name}-{workload}")


ROWS = list(_rows())


def _pick(heads: int, fp8: bool, tokens: int) -> str:
    return dispatch.implementation_for(heads, dispatch.HOPPER_CAPABILITY, fp8kv=fp8, num_tokens=tokens,
                                       fits={dispatch.HOPPER, dispatch.MMA})


@pytest.mark.skipif(not MEASURED, reason="no profiles/<gpu>/dispatch.csv yet: bash profiles/reproduce.sh dispatch")
def test_a_measurement_covers_every_pair_the_dispatch_decides():
    measured = {(p.values[0], p.values[1]) for p in ROWS}
    assert measured == {(h, fp8) for h in dispatch.HOPPER_HEADS for fp8 in (False, True)}
    assert {p.values[2] for p in ROWS} == set(suite_tokens := {w.axes["num_tokens"] for w in suite("dispatch")})
    assert min(suite_tokens) == 1 and max(suite_tokens) >= max(dispatch.MMA_MIN_TOKENS.values())


@pytest.mark.parametrize("heads, fp8, tokens, row", ROWS)
def test_the_dispatch_picks_the_fastest_kernel_it_may(heads, fp8, tokens, row):
    pick = _pick(heads, fp8, tokens)
    entry = row["dsactl-attention-fp8kv" if fp8 else "dsactl-attention"]
    assert entry.impl == pick, f"the entry ran {entry.impl} where the dispatch picks {pick}"
    times = {FORCED[name]: r.median_us for name, r in row.items() if name in FORCED}
    assert pick in times, f"{pick} was not timed"
    allowed = {impl: us for impl, us in times.items() if impl not in POLICY.get((heads, fp8), set())}
    best = min(allowed, key=allowed.get)
    assert times[pick] <= max(allowed[best] * MARGIN, allowed[best] + SLACK_US), \
        f"picks {pick} ({times[pick]:.2f} us) where {best} takes {allowed[best]:.2f} us ({times})"
