"""Side-by-side kernel time of top-k builds on one GPU, in one process: CUPTI, cold L2, the
timing of `dsactl bench` (dsactl.bench.timing), on the inputs `dsactl bench` makes.

    python3 profiles/h200/topk/sweep.py --lib new=build/sm90a/libtopk.so --lib old=OLD.so \
        [--lib NAME=PATH:SCOPE ...] [--torch] --csv OUT.csv

Each --lib is a build of kernels/topk/topk.cu with the same C ABI (a variant differs in one
constant); SCOPE limits it to short (max_len <= 8192) or long shapes. Shapes: the issue's grid
(rows {1, 8, 32, 64, 128} x lengths {2049, 5824, 8192, 32768, 131072}, fp32 and bf16, every row
full) and contest-like fp32 batches (rows {1, 8, 13, 31}, random lengths up to max_len).
Before timing, every build's output on each shape is checked against the reference (set
semantics; rows of 131072 only when rows <= 8, to keep the CPU-side check short). The plan
column is the kernel the first build launches (launcher.launch_plan).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import random
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from dsactl.bench.timing import L2Flusher, measure  # noqa: E402
from dsactl.kernels.topk import launcher, torch_baseline  # noqa: E402
from dsactl.workloads import Workload, make_inputs  # noqa: E402
from test_topk import assert_same_topk, reference  # noqa: E402

TOPK = 2048
GRID_ROWS = (1, 8, 32, 64, 128)
GRID_LENGTHS = (2049, 5824, 8192, 32768, 131072)
CONTEST_ROWS = (1, 8, 13, 31)
CONTEST_MAX_LENS = (2112, 4096, 5824)  # 33, 64 and 91 pages
SHORT_MAX_LEN = 8192
# FlashInfer 0.7.2 top_k_page_table_transform on this H200 (issue 4), us; the target is 1.2x.
FLASHINFER = {("bf16", 1, 2049): 6.1, ("bf16", 128, 2049): 6.3, ("bf16", 1, 5824): 6.9, ("bf16", 128, 5824): 7.7,
              ("bf16", 1, 32768): 15.5, ("bf16", 128, 32768): 23.7, ("bf16", 1, 131072): 14.3,
              ("bf16", 64, 131072): 46.9, ("bf16", 128, 131072): 91.5, ("fp32", 1, 131072): 15.4,
              ("fp32", 128, 131072): 71.7}
CONTEST_TARGET_US = 6.0


def workloads() -> list[tuple[str, Workload]]:
    out = []
    for bf16 in (False, True):
        name = "dsa_topk_page_transform_topk2048_ps64" + ("_bf16" if bf16 else "")
        tag = "bf16" if bf16 else "fp32"
        for rows in GRID_ROWS:
            for length in GRID_LENGTHS:
                out.append(("grid", Workload(f"r{rows}-len{length}-{tag}", name, "scale", f"len{length}",
                                             {"num_rows": rows, "max_len": length}, {"lengths": (length,) * rows})))
    rng = random.Random(0)
    for rows in CONTEST_ROWS:
        for max_len in CONTEST_MAX_LENS:
            lengths = [max_len] + [rng.randint(1, max_len) for _ in range(rows - 1)]
            out.append(("contest", Workload(f"contest-r{rows}-max{max_len}-fp32", "dsa_topk_page_transform_topk2048_ps64",
                                            "contest", f"max{max_len}", {"num_rows": rows, "max_len": max_len},
                                            {"lengths": tuple(lengths)})))
    return out


def in_scope(scope: str, max_len: int) -> bool:
    return scope == "all" or (scope == "short") == (max_len <= SHORT_MAX_LEN)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH[:all|short|long]")
    ap.add_argument("--torch", action="store_true", help="also time the torch.topk baseline")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--csv", required=True)
    args = ap.parse_args()
    libs = {}
    for spec in args.lib:
        name, rest = spec.split("=", 1)
        path, _, scope = rest.partition(":")
        lib = ctypes.CDLL(str(Path(path).resolve()))
        try:
            launcher.bind(lib)
        except AttributeError:  # a build older than dsa_topk_launch_plan: the rest is bound
            pass
        libs[name] = (lib, scope or "all")
    first = libs[next(iter(libs))][0]  # the launch plan column is the first build's
    contenders = list(libs) + (["torch"] if args.torch else [])
    flusher = L2Flusher()
    rows_out = []
    header = f"{'kind':8} {'workload':28} " + " ".join(f"{c:>8}" for c in contenders) + "  FlashInfer target  plan"
    print(header, flush=True)
    for kind, w in workloads():
        inputs = make_inputs(w, "cuda", seed=0)
        dtype = "bf16" if inputs["scores"].dtype == torch.bfloat16 else "fp32"
        rows, max_len = w.axes["num_rows"], w.axes["max_len"]
        out = torch.empty(rows, TOPK, dtype=torch.int32, device="cuda")
        args_ = (inputs["scores"], inputs["lengths"], inputs["block_table"], inputs["row_to_batch"], out)
        check = rows <= 8 or max_len < 131072
        ref = reference(inputs, TOPK) if check else None
        times = {}
        for name in contenders:
            if name == "torch":
                fn = lambda: torch_baseline.topk_page_transform(*args_)  # noqa: E731
            else:
                lib, scope = libs[name]
                if not in_scope(scope, max_len):
                    continue
                launcher._library = lambda lib=lib: lib
                fn = lambda: launcher.dsa_topk_page_transform(*args_)  # noqa: E731
            if check:
                out.fill_(-7)
                fn()
                torch.cuda.synchronize()
                try:
                    assert_same_topk(out, ref, inputs, TOPK, f"{name} {w.uuid}")
                except AssertionError as e:  # reported and not timed; the other contenders go on
                    print(f"WRONG {name} {w.uuid}: {str(e).splitlines()[0]}", flush=True)
                    continue
            _, samples = measure(fn, "cupti", args.iters, args.warmup, flusher)
            times[name] = samples
            rows_out.append({"contender": name, "kind": kind, "workload": w.uuid, "dtype": dtype, "rows": rows,
                             "max_len": max_len, "lengths": "full" if kind == "grid" else "random",
                             "median_us": round(statistics.median(samples), 3), "min_us": round(min(samples), 3),
                             "max_us": round(max(samples), 3), "iters": len(samples), "checked": check, "plan": ""})
        launcher._library = lambda: first
        plan = launcher.launch_plan(inputs["scores"].dtype, rows, max_len)
        for r in rows_out:
            if r["workload"] == w.uuid:
                r["plan"] = "row" if plan == 0 else f"cluster{plan}"
        fi = FLASHINFER.get((dtype, rows, max_len)) if kind == "grid" else None
        target = 1.2 * fi if fi else (CONTEST_TARGET_US if kind == "contest" else None)
        cells = " ".join(f"{statistics.median(times[c]):8.2f}" if c in times else f"{'-':>8}" for c in contenders)
        print(f"{kind:8} {w.uuid:28} {cells}  {fi or '':>10} {f'{target:.1f}' if target else '':>6}  "
              f"{'row' if plan == 0 else f'cluster{plan}'}", flush=True)
        with open(args.csv, "w", newline="") as f:  # rewritten per workload: a cut-off run keeps its rows
            writer = csv.DictWriter(f, fieldnames=list(rows_out[0]))
            writer.writeheader()
            writer.writerows(rows_out)


if __name__ == "__main__":
    main()
