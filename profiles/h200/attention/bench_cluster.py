"""The Hopper kernel's two split merges side by side on the H200: the combine kernel (fp32 partials
through global memory, a second launch) and the cluster merge (the splits of one (token, head group)
in one thread-block cluster, merged through distributed shared memory in the same launch).

    python3 profiles/h200/attention/bench_cluster.py OUTDIR [--tokens 1,2,4,8,16,32]

Per shape (64 and 128 heads, bf16 and FP8 KV, topk 2048, full rows): the launcher as shipped (its
split formula and merge), then every split count of SPLITS merged both ways, in one process on the
same inputs, timed as bench_hopper.py (CUPTI kernel time summed over a call's launches, cold L2,
median of its ITERS). Every cluster-merged output is compared with the shipped call's (max abs diff).
Writes OUTDIR/cluster_merge.csv and prints the table last.

The kernel now merges only 2 splits in a cluster. The 4, 8 and 16 columns of
session9/cluster-merge/cluster_merge-2to16.csv came from the build that merged any power of two up
to 16 (reduce_cluster templated on the count, 16-CTA clusters non-portable), measured and dropped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dsactl.definitions import get
from dsactl.kernels.attention import hopper_mla
from dsactl.workloads import make_inputs

from bench_hopper import TOPK, caller, cold_l2_timer, workload  # this folder's sibling scripts
from bench_old_vs_new import write_csv

SPLITS = (hopper_mla.CLUSTER_SPLITS,)
TOKENS = (1, 2, 4, 8, 16, 32)


def main(out: str, tokens: tuple[int, ...]) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    timer = cold_l2_timer()

    def time_us(fn) -> float:
        return round(timer(fn), 2)

    rows = []
    for fp8 in (False, True):
        for heads in hopper_mla.HEADS:
            for t in tokens:
                w = workload(heads, t, fp8)
                d = get(w.definition)
                inputs = make_inputs(w, "cuda", 0)
                outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
                shipped = caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8)
                row = {"heads": heads, "tokens": t, "kv": "fp8" if fp8 else "bf16",
                       "shipped_splits": hopper_mla.num_splits_for(t, heads, TOPK, num_sms),
                       "shipped_us": time_us(shipped)}
                shipped()
                reference = outputs["output"].float().clone()
                for s in SPLITS:
                    row[f"combine_s{s}"] = time_us(caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8,
                                                          num_splits=s, reduce_in_cluster=False))
                    merged = caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8, num_splits=s,
                                    reduce_in_cluster=True)
                    try:
                        row[f"cluster_s{s}"] = time_us(merged)
                        outputs["output"].fill_(float("nan"))
                        merged()
                        row[f"diff_s{s}"] = float((outputs["output"].float() - reference).abs().max())
                    except Exception as e:  # a cluster the GPU cannot schedule: recorded, not fatal
                        row[f"cluster_s{s}"] = f"error: {e}"[:80]
                rows.append(row)
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
                write_csv(out_dir / "cluster_merge.csv", rows)
                del inputs, outputs

    print("\nheads tokens kv   shipped(S,us)   " + "   ".join(f"S{s}: combine/cluster" for s in SPLITS))
    for r in rows:
        cells = "   ".join(f"{r[f'combine_s{s}']:>7}/{str(r[f'cluster_s{s}'])[:7]:>7}" for s in SPLITS)
        print(f"{r['heads']:5d} {r['tokens']:6d} {r['kv']:4s} {r['shipped_splits']:3d} {r['shipped_us']:8.2f}   {cells}")


if __name__ == "__main__":
    argv = sys.argv[1:]
    args = [a for a in argv if not a.startswith("--")]
    chosen = TOKENS
    if "--tokens" in argv:
        chosen = tuple(int(x) for x in argv[argv.index("--tokens") + 1].split(","))
        args = [a for a in args if a != argv[argv.index("--tokens") + 1]]
    main(args[0] if args else "profiles/h200/attention", chosen)
