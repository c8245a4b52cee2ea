"""The top-k part of the indexer end to end, on the scores the scoring kernel really writes:
times the solution, its scoring alone and the top-k alone on those scores, beside the top-k on the
scale suite's random rows of the same shape, for each --lib build of kernels/topk (same process,
CUPTI kernel time, cold L2, median). Also prints, per row, how many scores share the first radix
level's threshold bin (11 bits: sign, exponent, 2 mantissa bits), which decides the cluster
kernel's path (cached / compacted / re-read), and the real scores' spread.

    PYTHONPATH=$PWD python3 profiles/h200/indexer/topk_in_e2e.py --lib new=build/sm90a/libtopk.so \
        [--lib NAME=PATH ...] [--csv OUT.csv]
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import functools
import statistics
from pathlib import Path

import torch

from dsactl.bench.timing import L2Flusher, measure
from dsactl.harness import prepare
from dsactl.kernels.indexer import solution
from dsactl.kernels.indexer.score import score
from dsactl.kernels.topk import launcher
from dsactl.kernels.topk.model import levels, radix_keys
from dsactl.workloads import Workload, make_inputs, suite

TOPK = 2048
LEVEL0_SHIFT = levels(32)[0][0]  # fp32 key bits above this: the first level's 11-bit digit


def threshold_bin_sizes(scores: torch.Tensor, lengths: torch.Tensor) -> list[int]:
    """Per row: the number of valid scores in the level-0 bin that holds the topk-th largest."""
    out = []
    for r in range(scores.shape[0]):
        k = radix_keys(scores[r, : int(lengths[r])])
        kth = torch.topk(k, TOPK).values[-1]
        digit = k >> LEVEL0_SHIFT
        out.append(int((digit == (kth >> LEVEL0_SHIFT)).sum()))
    return out


def timed(fn, iters, flusher) -> float:
    _, samples = measure(fn, "cupti", iters, 3, flusher)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--csv")
    args = ap.parse_args()
    libs = {}
    for spec in args.lib:
        name, path = spec.split("=", 1)
        libs[name] = launcher.bind(ctypes.CDLL(str(Path(path).resolve())))
    flusher = L2Flusher()
    rows = []
    for uuid in ("scale-indexer-b64-ctx131072", "scale-indexer-b128-ctx131072"):
        w = next(w for w in suite("scale") if w.uuid == uuid)
        call = prepare(w, "cuda", seed=0)
        a = call.args()
        q, kc, wts, seq_lens, table, out = a
        batch = q.shape[0]
        max_len = table.shape[1] * 64
        scores = torch.empty(batch, max_len, dtype=torch.float32, device="cuda")
        lengths = torch.empty(batch, dtype=torch.int32, device="cuda")
        r2b = torch.arange(batch, dtype=torch.int32, device="cuda")
        score_us = timed(functools.partial(score, q, kc, wts, seq_lens, table, scores, lengths, skip_len=TOPK),
                         args.iters, flusher)
        sizes = threshold_bin_sizes(scores, lengths)
        valid = scores[:, : int(lengths.min())]
        print(f"{uuid}: score {score_us:.2f} us; scores mean {valid.mean():.4g} std {valid.std():.4g} "
              f"min {valid.min():.4g} max {valid.max():.4g}; level-0 threshold bin per row: "
              f"median {statistics.median(sizes)} max {max(sizes)}", flush=True)
        rand = make_inputs(Workload(f"rand-{batch}", "dsa_topk_page_transform_topk2048_ps64", "scale", "x",
                                    {"num_rows": batch, "max_len": max_len}, {"lengths": (max_len,) * batch}),
                           "cuda", seed=0)
        topk_out = torch.empty(batch, TOPK, dtype=torch.int32, device="cuda")
        for name, lib in libs.items():
            launcher._library = lambda lib=lib: lib
            e2e = timed(functools.partial(solution.dsa_topk_indexer, *a), args.iters, flusher)
            real = timed(functools.partial(launcher.topk_page_transform, scores, lengths, table, r2b, topk_out, TOPK),
                         args.iters, flusher)
            randn = timed(functools.partial(launcher.topk_page_transform, rand["scores"], rand["lengths"],
                                            rand["block_table"], rand["row_to_batch"], topk_out, TOPK),
                          args.iters, flusher)
            row = {"workload": uuid, "lib": name, "e2e_us": round(e2e, 2), "score_us": round(score_us, 2),
                   "topk_real_us": round(real, 2), "topk_randn_us": round(randn, 2),
                   "bin0_median": statistics.median(sizes), "bin0_max": max(sizes)}
            rows.append(row)
            print(row, flush=True)
        del call
        torch.cuda.empty_cache()
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
