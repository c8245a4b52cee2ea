"""Side-by-side H200 timing of the indexer kernels, old (a saved copy of the committed
kernels/indexer, package `old_indexer` under .carry/indexer_old) against the working tree.

  sweep    scoring alone on the DeepGEMM shapes and a few contest workloads, every
           configuration variant below; each variant's scores checked against the old kernel's
  contest  all 128 contest indexer workloads: old and new solution, and per kernel for the
           scored ones (old score, new score as chosen, top-k alone)
  e2e      score + top-k (the whole solution) at 64 and 128 x 131072

Timing: dsactl.bench.timing.measure, CUPTI kernel time (the sum of the call's kernels), cold L2
(an L2Flusher buffer written before every call), median of --iters after --warmup calls.
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / ".carry" / "indexer_old"))

from dsactl.bench.timing import L2Flusher, measure  # noqa: E402
from dsactl.fp8 import PAGE_SIZE  # noqa: E402
from dsactl.harness import prepare  # noqa: E402
from dsactl.kernels.indexer import score as new_score  # noqa: E402
from dsactl.kernels.indexer import solution as new_solution  # noqa: E402
from dsactl.kernels.indexer.score import ScoreConfig, choose_config  # noqa: E402
from dsactl.kernels.topk.launcher import topk_page_transform  # noqa: E402
from dsactl.workloads import make_inputs, suite  # noqa: E402
from old_indexer import score as old_score  # noqa: E402
from old_indexer import solution as old_solution  # noqa: E402

TOPK = 2048
BYTES_PER_TOKEN = 132  # 128 fp8 key bytes + one fp32 scale
# DeepGEMM 54e2261 sm90 fp8_paged_mqa_logits on this H200 (issue 5), us.
DEEPGEMM = {"scale-indexer-b1-ctx4096": 3.9, "scale-indexer-b32-ctx4096": 9.9, "scale-indexer-b8-ctx32768": 15.5,
            "scale-indexer-b64-ctx32768": 78.2, "scale-indexer-b1-ctx131072": 9.7,
            "scale-indexer-b64-ctx131072": 279.0, "scale-indexer-b128-ctx131072": 546.0}
SWEEP_CONTEST = ["contest-indexer-100", "contest-indexer-080", "contest-indexer-069", "contest-indexer-090",
                 "contest-indexer-098"]

FLUSHER = None
SMS = 132


def timed(fn, iters, warmup) -> tuple[float, float]:
    _, samples = measure(fn, "cupti", iters, warmup, FLUSHER)
    return statistics.median(samples), min(samples)


def stream(batch, max_len, block_n=128, stages=3, pps=4, min_steps=2, warps=4) -> ScoreConfig:
    steps = triton.cdiv(max_len, block_n)
    splits = max(1, min(SMS * pps // batch, steps // min_steps))
    per = triton.cdiv(steps, splits)
    return ScoreConfig(block_n, warps, stages, per * block_n, triton.cdiv(steps, per))


VARIANTS = {  # name -> config builder (batch, max_len); None: the old kernel's own choice
    "old": None,
    "new": lambda b, n: choose_config(b, 1, 64, n, SMS),
    "stream-s3p4": lambda b, n: stream(b, n),
    "stream-s3p4m1": lambda b, n: stream(b, n, min_steps=1),
    "stream-s5p3": lambda b, n: stream(b, n, stages=5, pps=3),
    "stream-s4p3m1": lambda b, n: stream(b, n, stages=4, pps=3, min_steps=1),
    "stream-64s5p4": lambda b, n: stream(b, n, block_n=64, stages=5, pps=4),
}


def score_args(inputs):
    batch = inputs["q_index_fp8"].shape[0]
    max_len = inputs["block_table"].shape[1] * PAGE_SIZE
    scores = torch.full((batch, max_len), float("nan"), device="cuda")
    lengths = torch.empty(batch, dtype=torch.int32, device="cuda")
    return [inputs[k] for k in ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")] + \
        [scores, lengths]


def mismatches(scores, ref, seq_lens, skip_len) -> tuple[int, int]:
    """(scored positions differing from the old kernel's, positions written that must not be)."""
    col = torch.arange(scores.shape[1], device=scores.device)[None, :]
    sl = seq_lens.long()[:, None]
    inside = (col < sl) & (sl > skip_len)
    a, b = scores[inside], ref[inside]
    wrong = a.isnan() | (((a - b).abs() > 1e-3 + 1e-4 * b.abs()) & (a != b))
    return int(wrong.sum()), int((~inside & ~scores.isnan()).sum())


def sweep(args, out):
    shapes = [w for w in suite("scale") if w.uuid in DEEPGEMM]
    shapes += [w for w in suite("contest") if w.uuid in SWEEP_CONTEST]
    rows = []
    for w in shapes:
        inputs = make_inputs(w, "cuda", seed=0)
        skip = TOPK if w.uuid.startswith("contest") else 0
        batch, max_len = inputs["q_index_fp8"].shape[0], inputs["block_table"].shape[1] * PAGE_SIZE
        tokens = sum(int(s) for s in inputs["seq_lens"].tolist() if s > skip)
        ref = score_args(inputs)
        old_score.score(*ref, skip_len=skip)
        for name, build in VARIANTS.items():
            cfg = None if build is None else build(batch, max_len)
            a = score_args(inputs)
            if cfg is None:
                fn = functools.partial(old_score.score, *a, skip_len=skip)
            else:
                fn = functools.partial(new_score.score, *a, skip_len=skip, config=cfg)
            fn()
            torch.cuda.synchronize()
            bad, stray = mismatches(a[5], ref[5], inputs["seq_lens"], skip)
            med, low = timed(fn, args.iters, args.warmup)
            dg = DEEPGEMM.get(w.uuid)
            row = {"workload": w.uuid, "batch": batch, "max_len": max_len, "variant": name,
                   "block_n": cfg.block_n if cfg else "",
                   "warps": cfg.num_warps if cfg else "", "stages": cfg.num_stages if cfg else "",
                   "tokens_per_program": cfg.tokens_per_program if cfg else "",
                   "programs": batch * cfg.splits if cfg else "", "median_us": round(med, 3),
                   "min_us": round(low, 3), "gbps": round(tokens * BYTES_PER_TOKEN / med / 1e3, 1),
                   "deepgemm_us": dg or "", "x_deepgemm": round(med / dg, 3) if dg else "",
                   "mismatches": bad, "stray_writes": stray}
            rows.append(row)
            write(out / "sweep.csv", rows)
            print(f"{w.uuid:30s} {name:14s} s{row['stages'] or '-'} {med:9.2f} us  {row['gbps']:7.1f} GB/s  "
                  f"x{row['x_deepgemm']}  bad={bad} stray={stray}", flush=True)
        del inputs, ref
        torch.cuda.empty_cache()
    print("\nscoring alone: old, new and the fastest variant per shape")
    for uuid in dict.fromkeys(r["workload"] for r in rows):
        sel = {r["variant"]: r for r in rows if r["workload"] == uuid}
        best = min(sel.values(), key=lambda r: r["median_us"])
        print(f"{uuid:30s} old {sel['old']['median_us']:8.2f}  new {sel['new']['median_us']:8.2f} "
              f"(s{sel['new']['stages']})  best {best['variant']} {best['median_us']:8.2f}  "
              f"DeepGEMM {sel['new']['deepgemm_us'] or '-'}")


def contest(args, out):
    rows = []
    for w in [w for w in suite("contest") if w.uuid.startswith("contest-indexer")]:
        call = prepare(w, "cuda", seed=0)
        a = call.args()
        outputs = {}
        row = {"workload": w.uuid, "batch": w.axes["batch_size"], "max_num_pages": w.axes["max_num_pages"]}
        for name, fn in (("old", old_solution.dsa_topk_indexer), ("new", new_solution.dsa_topk_indexer)):
            o = torch.full_like(a[-1], -(2**31))
            f = functools.partial(fn, *a[:-1], o)
            f()
            torch.cuda.synchronize()
            outputs[name] = o.sort(dim=-1).values
            row[f"{name}_us"] = round(timed(f, args.iters, args.warmup)[0], 3)
        row["rows_differ"] = int((outputs["old"] != outputs["new"]).any(dim=-1).sum())
        scored = w.axes["max_num_pages"] * PAGE_SIZE > TOPK
        row["kind"] = "scored" if scored else "passthrough"
        if scored:
            inputs = call.inputs
            batch, max_len = inputs["q_index_fp8"].shape[0], w.axes["max_num_pages"] * PAGE_SIZE
            s = score_args(inputs)
            row["old_score_us"] = round(timed(functools.partial(old_score.score, *s, skip_len=TOPK),
                                              args.iters, args.warmup)[0], 3)
            f = functools.partial(new_score.score, *s, skip_len=TOPK)
            row["new_score_us"] = round(timed(f, args.iters, args.warmup)[0], 3)
            r2b = torch.arange(batch, dtype=torch.int32, device="cuda")
            o = torch.empty(batch, TOPK, dtype=torch.int32, device="cuda")
            f = functools.partial(topk_page_transform, s[5], s[6], inputs["block_table"], r2b, o, TOPK)
            row["topk_us"] = round(timed(f, args.iters, args.warmup)[0], 3)
        rows.append(row)
        write(out / "contest.csv", rows)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        del call
    for kind in ("passthrough", "scored", None):
        sel = [r for r in rows if kind is None or r["kind"] == kind]
        print(f"{kind or 'all':12s} n={len(sel):3d}  old mean {statistics.fmean(r['old_us'] for r in sel):7.3f} us"
              f"  new mean {statistics.fmean(r['new_us'] for r in sel):7.3f} us"
              f"  new max {max(r['new_us'] for r in sel):7.3f} us")


def e2e(args, out):
    rows = []
    for uuid in ("scale-indexer-b64-ctx131072", "scale-indexer-b128-ctx131072"):
        w = next(w for w in suite("scale") if w.uuid == uuid)
        call = prepare(w, "cuda", seed=0)
        a = call.args()
        for name, fn in (("old", old_solution.dsa_topk_indexer), ("new", new_solution.dsa_topk_indexer)):
            med, low = timed(functools.partial(fn, *a), args.iters, args.warmup)
            rows.append({"workload": uuid, "solution": name, "median_us": round(med, 2), "min_us": round(low, 2)})
            write(out / "e2e.csv", rows)
            print(rows[-1], flush=True)
        del call
        torch.cuda.empty_cache()


def write(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {torch.cuda.get_device_name()} "
                f"torch {torch.__version__} triton {triton.__version__}; cupti, cold L2, median\n")
        writer = csv.DictWriter(f, keys)
        writer.writeheader()
        writer.writerows(rows)


def main() -> None:
    global FLUSHER, SMS
    p = argparse.ArgumentParser()
    p.add_argument("modes", nargs="+", choices=["sweep", "contest", "e2e"])
    p.add_argument("--out", default=".")
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    FLUSHER = L2Flusher()
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mode in args.modes:
        t0 = time.time()
        {"sweep": sweep, "contest": contest, "e2e": e2e}[mode](args, out)
        print(f"{mode}: {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
