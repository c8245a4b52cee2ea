"""Tile configurations of a saved sparse MLA launcher at 16 heads, bf16 KV (the contest's), timed like bench.

    python3 profiles/h200/attention/config_sweep.py LAUNCHER.py

LAUNCHER.py: a copy of kernels/attention/triton_sparse_mla.py (its config() is replaced per variant).
Prints the median CUPTI kernel time (cold L2) per variant at 1, 2, 6 and 8 tokens, topk 2048, full rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_old_vs_new as bench  # noqa: E402
from dsactl.bench.timing import L2Flusher, pick_method  # noqa: E402

TOKENS = (1, 2, 6, 8)


def main(path: str) -> None:
    module = bench.load_old(path)
    method, flusher = pick_method(), L2Flusher()
    default = module.config
    variants = {"default": None, "stages3": module.Config(16, 64, 8, 3), "n32s3": module.Config(16, 32, 8, 3),
                "w4s3": module.Config(16, 64, 4, 3)}
    for name, cfg in variants.items():
        module.config = default if cfg is None else (lambda heads, fp8kv, cfg=cfg: cfg)
        module.num_splits_for.cache_clear()
        times = []
        for tokens in TOKENS:
            inputs, outputs = bench.prepared(bench.production_workload(16, tokens, False))
            us = bench.time_us(bench.launcher_call(module, inputs, outputs, False), method, flusher)
            times.append(f"T={tokens} {us:.2f}")
        print(name, " ".join(times), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
