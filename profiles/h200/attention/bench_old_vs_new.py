"""Side-by-side H200 timing of two versions of the sparse MLA Triton launcher.

    python3 profiles/h200/attention/bench_old_vs_new.py OLD.py OUTDIR

OLD.py is a saved copy of an earlier kernels/attention/triton_sparse_mla.py (e.g.
`git show <rev>:kernels/attention/triton_sparse_mla.py > OLD.py`); "new" is the checkout's.
Both are timed in this one process with bench's own method (CUPTI kernel time summed over the
call's launches, cold L2 before every call, median of ITERS), on the same inputs:
the contest attention workloads, production shapes (topk 2048, full rows) and, for the new
launcher, a split-count sweep. Writes OUTDIR/old_vs_new.csv, OUTDIR/split_sweep.csv and
OUTDIR/kernels.csv (registers, spills, shared memory of every compiled configuration) and
prints the tables.
"""

from __future__ import annotations

import csv
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

from dsactl.bench.timing import L2Flusher, measure, pick_method
from dsactl.definitions import get
from dsactl.kernels.attention import triton_sparse_mla as new
from dsactl.workloads import Workload, make_inputs, suite

ITERS = 20
WARMUP = 3
TOPK = 2048
NUM_PAGES = 8192
# Measured on this H200 by `dsactl bench` (profiles/h200/bench-contest-attention.csv header).
PEAK_TFLOPS = 787.2
PEAK_GBPS = 4265.0
PRODUCTION = [(16, 1), (16, 2), (16, 4), (16, 8), (16, 16), (64, 128), (128, 1), (128, 8), (128, 32),
              (128, 128)]  # (heads, tokens)
SWEEP = [(1, (8, 16, 32)), (2, (8, 16, 32)), (6, (11, 16, 22)), (8, (8, 16, 32))]  # h16 bf16: tokens, splits


def load_old(path: str):
    spec = importlib.util.spec_from_file_location("old_triton_sparse_mla", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def launcher_call(module, inputs: dict, outputs: dict, fp8: bool, num_splits: int | None = None):
    kv = {"kv_cache": inputs["kv_cache"]} if fp8 else {"ckv_cache": inputs["ckv_cache"],
                                                       "kpe_cache": inputs["kpe_cache"]}
    optional = {k: inputs[k] for k in ("topk_length", "attn_sink") if k in inputs}

    def call():
        module.sparse_mla_attention(inputs["q_nope"], inputs["q_pe"], inputs["sparse_indices"], inputs["sm_scale"],
                                    outputs["output"], outputs["lse"], num_splits=num_splits, **kv, **optional)
    return call


def time_us(fn, method: str, flusher: L2Flusher) -> float:
    return statistics.median(measure(fn, method, ITERS, WARMUP, flusher)[1])


def prepared(w: Workload):
    d = get(w.definition)
    inputs = make_inputs(w, "cuda", 0)
    return inputs, d.allocate_outputs(d.check_inputs(inputs), "cuda")


def production_workload(heads: int, tokens: int, fp8: bool) -> Workload:
    definition = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{TOPK}_ps64" + ("_fp8kv" if fp8 else "")
    return Workload(f"h{heads}-t{tokens}-{'fp8' if fp8 else 'bf16'}", definition, "bench", "full",
                    {"num_tokens": tokens, "num_pages": NUM_PAGES}, {"pattern": "full"})


def kernel_rows(module, label: str) -> list[dict]:
    """Registers, spills and shared memory of every configuration this process compiled."""
    rows = []
    for name in ("_sparse_mla_bf16_kernel", "_sparse_mla_fp8_kernel", "_sparse_mla_combine_kernel"):
        fn = getattr(module, name, None)
        for cache in getattr(fn, "device_caches", {}).values():
            for compiled in cache[0].values():
                rows.append({"version": label, "kernel": name, "constants": str(getattr(compiled, "constants", "")),
                             "registers": compiled.n_regs, "spills": compiled.n_spills,
                             "shared_bytes": compiled.metadata.shared})
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(old_path: str, out: str) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    old = load_old(old_path)
    method = pick_method()
    flusher = L2Flusher()
    print(f"{torch.cuda.get_device_name()} timing {method}, {ITERS} iters, cold L2", flush=True)

    rows = []
    contest = [w for w in suite("contest") if w.definition.startswith("dsa_sparse_attention")]
    cases = [("contest", w, False) for w in contest]
    cases += [("production", production_workload(h, t, fp8), fp8) for h, t in PRODUCTION for fp8 in (False, True)]
    for group, w, fp8 in cases:
        inputs, outputs = prepared(w)
        tokens, heads = inputs["q_nope"].shape[:2]
        old_us = time_us(launcher_call(old, inputs, outputs, fp8), method, flusher)
        new_us = time_us(launcher_call(new, inputs, outputs, fp8), method, flusher)
        flops = 2 * tokens * heads * TOPK * (576 + 512)
        kv_bytes = tokens * TOPK * (656 if fp8 else 1152)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        cfg = new.launch_config(tokens, heads, TOPK, fp8, sms)
        row = {"group": group, "workload": w.uuid, "tokens": tokens, "heads": heads, "kv": "fp8" if fp8 else "bf16",
               "splits": new.num_splits_for(tokens, heads, TOPK, cfg, sms),
               "old_us": round(old_us, 3), "new_us": round(new_us, 3), "speedup": round(old_us / new_us, 3),
               "new_tflops": round(flops / new_us / 1e6, 1),
               "new_pct_peak_flops": round(100 * flops / new_us / 1e6 / PEAK_TFLOPS, 1),
               "new_kv_gbps": round(kv_bytes / new_us / 1e3, 1),
               "new_pct_peak_bw": round(100 * kv_bytes / new_us / 1e3 / PEAK_GBPS, 1)}
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        write_csv(out_dir / "old_vs_new.csv", rows)

    sweep = []
    for tokens, options in SWEEP:
        w = production_workload(16, tokens, False)
        inputs, outputs = prepared(w)
        for splits in options:
            us = time_us(launcher_call(new, inputs, outputs, False, splits), method, flusher)
            sweep.append({"heads": 16, "tokens": tokens, "kv": "bf16", "splits": splits, "new_us": round(us, 3)})
            print(f"sweep h16 T={tokens} S={splits}: {us:.2f} us", flush=True)
    write_csv(out_dir / "split_sweep.csv", sweep)

    print("\nworkload                      T    H  kv   S   old_us   new_us  speedup  TFLOPS")
    for r in rows:
        print(f"{r['workload']:28s} {r['tokens']:4d} {r['heads']:4d} {r['kv']:4s} {r['splits']:3d} {r['old_us']:8.2f} "
              f"{r['new_us']:8.2f} {r['speedup']:7.2f}x {r['new_tflops']:7.1f}")
    for label in ("old", "new"):
        c = [r[f"{label}_us"] for r in rows if r["group"] == "contest"]
        print(f"contest {label}: mean {statistics.mean(c):.2f} us, max {max(c):.2f} us")
    by_shape = {(r["heads"], r["tokens"], r["kv"]): r["new_us"] for r in rows if r["group"] == "production"}
    for h, t in PRODUCTION:
        print(f"fp8/bf16 h{h} T={t}: {by_shape[(h, t, 'fp8')] / by_shape[(h, t, 'bf16')]:.2f}")
    try:  # CompiledKernel's attributes differ between Triton versions: informative only
        kernels = kernel_rows(old, "old") + kernel_rows(new, "new")
        write_csv(out_dir / "kernels.csv", kernels)
        for k in kernels:
            print(k)
    except Exception as e:  # noqa: BLE001
        print(f"kernel resources unavailable: {e!r}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
