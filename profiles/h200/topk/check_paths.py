"""Every top-k kernel path once, small, checked against the reference; run it bare (a quick
correctness check of a build) or under compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool racecheck --error-exitcode 9 python3 profiles/h200/topk/check_paths.py [--lib PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from dsactl.harness import INT_POISON  # noqa: E402
from dsactl.kernels.topk import launcher  # noqa: E402
from test_topk import TOPK, assert_same_topk, make_case, reference  # noqa: E402

# (name, lengths, pattern, make_case options): which kernel and path each exercises.
CASES = [
    ("row-upto4096", [2049, 3000, 100, 4096], "random", {}),
    ("row-upto4096-nan", [2049, 4096, 1], "nan", {"rows_per_request": 2}),
    ("row-upto8192", [5824, 8192, 2048, 1], "random", {}),
    ("row-upto8192-ties", [8192, 6145], "two_values", {}),
    ("row-upto8192-one-bin", [8192, 7000], "fine_bin", {}),
    ("row-unaligned", [5000, 2049, 9], "random", {"max_len": 5003}),
    ("cluster-cached", [40000], "two_values", {}),
    ("cluster-wide-cached", [131072], "random", {}),  # one row: the largest cluster
    ("cluster-wide-uncached-compact", [1 << 20], "random", {}),
    ("cluster-wide-uncached-overflow", [1 << 20], "all_equal", {}),
    ("cluster1-uncached-compact", [65536] + [10] * 132, "random", {}),  # more rows than SMs: one CTA per row
    ("cluster1-uncached-overflow", [65536] + [10] * 132, "all_equal", {}),
    ("cluster-structural", [1, 64, 2048, 20000], "random", {}),
]


def run(name: str, lengths: list[int], pattern: str, options: dict, dtype: torch.dtype) -> None:
    options = dict(options)
    max_len = options.pop("max_len", None)
    case = make_case(lengths, dtype, pattern, device="cuda", max_len=max_len, **options)
    if max_len is not None:  # rows 3 elements off 16-byte alignment: the scalar loads
        wide = torch.randn(len(lengths), max_len + 9, device="cuda").to(dtype)
        wide[:, 3:max_len + 3] = case["scores"]
        case["scores"] = wide[:, 3:max_len + 3]
    out = torch.full((len(lengths), TOPK), INT_POISON, dtype=torch.int32, device="cuda")
    launcher.topk_page_transform(case["scores"], case["lengths"], case["block_table"], case["row_to_batch"], out,
                                 TOPK)
    torch.cuda.synchronize()
    assert_same_topk(out, reference(case, TOPK), case, TOPK, name)
    print("ok", name, str(dtype).removeprefix("torch."), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", help="a libtopk.so to check instead of the dsactl build")
    ap.add_argument("--only", help="only the cases whose name starts with this (row, cluster, ...)")
    args = ap.parse_args()
    if args.lib:
        lib = ctypes.CDLL(str(Path(args.lib).resolve()))
        try:
            launcher.bind(lib)
        except AttributeError:  # a build older than dsa_topk_launch_plan: the rest is bound
            pass
        launcher._library = lambda: lib
    for dtype in (torch.float32, torch.bfloat16):
        for name, lengths, pattern, options in CASES:
            if args.only is None or name.startswith(args.only):
                run(name, lengths, pattern, options, dtype)


if __name__ == "__main__":
    main()
