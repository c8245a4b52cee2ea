"""Side-by-side H200 timing of the Hopper sparse MLA kernel (hopper_mla.cu) and the Triton kernel.

    python3 profiles/h200/attention/bench_hopper.py OUTDIR [--sweep]

Both launchers run in this one process on the same inputs (topk 2048, full rows, 8192 pages of
64 tokens), timed with bench's own method (CUPTI kernel time summed over a call's launches, so
the combine launch counts; cold L2 before every call; median of ITERS). Shapes: the issue-7
decode shapes, 64 and 128 heads, bf16 and FP8 KV. FlashMLA's figures are the ones issue 7
quotes for this same H200 (FlashMLA 9241ae3, FP8 KV, CUDA events, cold L2); they are not
re-measured here. To compare builds of the kernel library, bench_builds.sh runs this script once
per build (two builds in one process fail to launch: see that script). --sweep also times the
Hopper kernel at every split count in SWEEP_SPLITS for the small-token shapes (the data behind its
split formula), the whole call and the kernel alone (the combine launch skipped).

Writes OUTDIR/hopper_vs_triton.csv (+ split_sweep_hopper.csv with --sweep) and
OUTDIR/hopper_vs_triton.png, and prints the table last.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Callable

import torch

from dsactl.bench.timing import L2Flusher, measure, pick_method
from dsactl.definitions import get
from dsactl.kernels.attention import hopper_mla
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.workloads import Workload, make_inputs

from bench_old_vs_new import write_csv  # this folder's sibling script (run as a script, its folder is on sys.path)

ITERS = 10
WARMUP = 2
TOPK = 2048
NUM_PAGES = 8192
FLOPS_PER_TOKEN_HEAD = 2 * TOPK * (576 + 512)  # QK^T over 576 dims + PV over 512
SHAPES = [(64, 1), (64, 2), (64, 4), (64, 8), (64, 16), (64, 32), (64, 128), (128, 1), (128, 2), (128, 4), (128, 8),
          (128, 16), (128, 32), (128, 64), (128, 128), (128, 256)]
# (heads, tokens); 128 x 256 is the 128 requests x 2 tokens
FLASHMLA_FP8_US = {(128, 1): 21.6, (128, 8): 30.5, (128, 32): 67.3, (128, 128): 191.0, (128, 256): 371.0,
                   (64, 128): 122.0}  # issue 7, measured on this H200
SWEEP_SHAPES = [(64, 1), (64, 2), (64, 4), (64, 8), (64, 16), (64, 32), (128, 1), (128, 2), (128, 4), (128, 8),
                (128, 16), (128, 32), (128, 64)]
SWEEP_SPLITS = (1, 2, 4, 8, 16, 32)  # 64 (32-token splits of 64-token blocks) lost on every shape of session 6


def workload(heads: int, tokens: int, fp8: bool) -> Workload:
    definition = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{TOPK}_ps64" + ("_fp8kv" if fp8 else "")
    return Workload(f"h{heads}-t{tokens}-{'fp8' if fp8 else 'bf16'}", definition, "bench", "full",
                    {"num_tokens": tokens, "num_pages": NUM_PAGES}, {"pattern": "full"})


def caller(launcher, inputs: dict, outputs: dict, fp8: bool, **kwargs):
    kv = {"kv_cache": inputs["kv_cache"]} if fp8 else {"ckv_cache": inputs["ckv_cache"],
                                                       "kpe_cache": inputs["kpe_cache"]}

    def call():
        launcher(inputs["q_nope"], inputs["q_pe"], inputs["sparse_indices"], inputs["sm_scale"], outputs["output"],
                 outputs["lse"], **kv, **kwargs)
    return call


def plot(path: Path, rows: list[dict], device: str | None = None) -> None:
    """The table as TFLOPS per shape; device: the GPU's name for the title (default: this one's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, heads in zip(axes, (64, 128)):
        for kv, style in (("bf16", "--"), ("fp8", "-")):
            mine = [r for r in rows if r["heads"] == heads and r["kv"] == kv]
            t = [r["tokens"] for r in mine]
            ax.plot(t, [r["hopper_tflops"] for r in mine], "o" + style, color="tab:blue", label=f"Hopper {kv}")
            ax.plot(t, [r["triton_tflops"] for r in mine], "s" + style, color="tab:orange", label=f"Triton {kv}")
        fm = sorted((t, FLOPS_PER_TOKEN_HEAD * heads * t / us / 1e6) for (h, t), us in FLASHMLA_FP8_US.items()
                    if h == heads)
        if fm:
            ax.plot(*zip(*fm), "^-", color="tab:green", label="FlashMLA fp8 (issue 7 figures)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("query tokens (topk 2048)")
        ax.set_title(f"{heads} heads")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("TFLOPS (useful: 2 x tokens x heads x 2048 x 1088)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Sparse MLA decode on {device or torch.cuda.get_device_name()}: CUPTI kernel time, cold L2")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cold_l2_timer(iters: int = ITERS, warmup: int = WARMUP) -> Callable[[Callable[[], None]], float]:
    """time_us(fn): the median kernel time of `iters` cold-L2 calls of fn, with bench's method (printed once)."""
    method = pick_method()
    flusher = L2Flusher()
    print(f"{torch.cuda.get_device_name()} timing {method}, {iters} iters, cold L2", flush=True)

    def time_us(fn: Callable[[], None]) -> float:
        return statistics.median(measure(fn, method, iters, warmup, flusher)[1])
    return time_us


def main(out: str, sweep: bool) -> None:
    if os.environ.get("BENCH_COMBINE_ONLY") == "1":  # bench_builds.sh ",combine": a build without the merge
        hopper_mla.merges_in_cluster = lambda *args: False
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    time_us = cold_l2_timer()

    rows, sweep_rows = [], []
    for fp8 in (False, True):
        for heads, tokens in SHAPES:
            w = workload(heads, tokens, fp8)
            d = get(w.definition)
            inputs = make_inputs(w, "cuda", 0)
            outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
            hopper_us = time_us(caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8))
            triton_us = time_us(caller(tsm.sparse_mla_attention, inputs, outputs, fp8))
            flops = FLOPS_PER_TOKEN_HEAD * heads * tokens
            flashmla = FLASHMLA_FP8_US.get((heads, tokens)) if fp8 else None
            row = {"heads": heads, "tokens": tokens, "kv": "fp8" if fp8 else "bf16",
                   "hopper_splits": hopper_mla.num_splits_for(tokens, heads, TOPK, num_sms),
                   "hopper_us": round(hopper_us, 2), "triton_us": round(triton_us, 2),
                   "speedup_vs_triton": round(triton_us / hopper_us, 3),
                   "hopper_tflops": round(flops / hopper_us / 1e6, 1),
                   "triton_tflops": round(flops / triton_us / 1e6, 1),
                   "flashmla_us_issue7": flashmla if flashmla else ""}
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            write_csv(out_dir / "hopper_vs_triton.csv", rows)
            if sweep and (heads, tokens) in SWEEP_SHAPES:
                for splits in SWEEP_SPLITS:
                    call = caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8, num_splits=splits)
                    us = time_us(call)
                    combine, tsm.combine = tsm.combine, lambda *args, **kwargs: None
                    try:
                        kernel_us = time_us(call)
                    finally:
                        tsm.combine = combine
                    sweep_rows.append({"heads": heads, "tokens": tokens, "kv": row["kv"], "splits": splits,
                                       "hopper_us": round(us, 2), "kernel_us": round(kernel_us, 2)})
                write_csv(out_dir / "split_sweep_hopper.csv", sweep_rows)
            del inputs, outputs
    plot(out_dir / "hopper_vs_triton.png", rows)

    if sweep_rows:
        print("\nsplit sweep (us):")
        for heads, tokens in SWEEP_SHAPES:
            for kv in ("bf16", "fp8"):
                r = {s["splits"]: s["hopper_us"] for s in sweep_rows
                     if (s["heads"], s["tokens"], s["kv"]) == (heads, tokens, kv)}
                print(f"  h{heads} T={tokens} {kv}: " + " ".join(f"S{s}={us}" for s, us in r.items()))
    print("\nheads tokens kv    S  hopper_us triton_us  speedup  hopper_TFLOPS  FlashMLA_us(issue)")
    for r in rows:
        print(f"{r['heads']:5d} {r['tokens']:6d} {r['kv']:4s} {r['hopper_splits']:3d} {r['hopper_us']:10.2f} "
              f"{r['triton_us']:9.2f} {r['speedup_vs_triton']:7.2f}x {r['hopper_tflops']:13.1f}  "
              f"{r['flashmla_us_issue7']}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    args = [a for a in argv if not a.startswith("--")]
    main(args[0] if args else "profiles/h200/attention", "--sweep" in argv)
