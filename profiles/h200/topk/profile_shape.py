"""Calls the top-k on the scale suite's inputs for a few shapes, so that Nsight Compute can profile
exactly those launches (one warm-up call and one profiled call per shape, both listed):

    ncu -k regex:topk --launch-skip-before-match 0 ... python3 profiles/h200/topk/profile_shape.py \
        bf16:1x5824 bf16:1x131072 fp32:64x131072 [--lib PATH]
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from dsactl.kernels.topk import launcher  # noqa: E402
from dsactl.workloads import Workload, make_inputs  # noqa: E402

TOPK = 2048


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+", help="DTYPE:ROWSxLEN, e.g. bf16:1x131072")
    ap.add_argument("--lib", help="a libtopk.so to run instead of the dsactl build")
    args = ap.parse_args()
    if args.lib:
        lib = launcher.bind(ctypes.CDLL(str(Path(args.lib).resolve())))
        launcher._library = lambda: lib
    for spec in args.shapes:
        dtype, dims = spec.split(":")
        rows, length = (int(x) for x in dims.split("x"))
        name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if dtype == "bf16" else "")
        w = Workload(f"profile-{dtype}-{rows}x{length}", name, "scale", spec,
                     {"num_rows": rows, "max_len": length}, {"lengths": (length,) * rows})
        inputs = make_inputs(w, "cuda", seed=0)
        out = torch.empty(rows, TOPK, dtype=torch.int32, device="cuda")
        for _ in range(2):
            launcher.dsa_topk_page_transform(inputs["scores"], inputs["lengths"], inputs["block_table"],
                                             inputs["row_to_batch"], out)
        torch.cuda.synchronize()
        plan = launcher.launch_plan(inputs["scores"].dtype, rows, length)
        print(spec, "row kernel" if plan == 0 else f"cluster of {plan}", flush=True)


if __name__ == "__main__":
    main()
