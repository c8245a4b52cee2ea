"""Shapes for compute-sanitizer: the Triton launcher on a few split layouts, checked against the reference.

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 profiles/h200/attention/sanitize_attention.py all
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 profiles/h200/attention/sanitize_attention.py contest

Cases: the contest shape with the formula's splits (one wave), an FP8 variant at 128 heads with
topk_length and sink on an odd split count (the combine's 8 x 16-head tiles), a grid of many
waves (64 heads, 32 splits), and two tokens at 16 heads (the small-grid configuration: 64
splits of one 32-token tile). Exits 1 if an output misses the reference.
"""

from __future__ import annotations

import sys

import torch

from dsactl.definitions import get
from dsactl.harness import poison
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.verify.rules import check
from dsactl.workloads import Workload, make_inputs

BASE = "dsa_sparse_attention_h{heads}_ckv512_kpe64_topk2048_ps64"
CASES = {  # name: (heads, suffix, tokens, pages, generator params, num_splits or None for the formula)
    "contest": (16, "", 8, 512, {"pattern": "tail", "valid": (2048, 1000, 5, 2048, 64, 2047, 700, 1)}, None),
    "fp8_variant": (128, "_fp8kv_lsee_topklen_sink", 4, 256, {"pattern": "scattered", "valid": (2048, 0, 3, 900)}, 7),
    "many_waves": (64, "", 40, 256, {"pattern": "full"}, 32),
    "small_grid": (16, "_topklen", 2, 512, {"pattern": "scattered", "valid": (2048, 300)}, None),  # 64 splits of 32
}


def run(name: str) -> bool:
    heads, suffix, tokens, pages, params, num_splits = CASES[name]
    definition = BASE.format(heads=heads) + suffix
    d = get(definition)
    w = Workload(f"sanitize-{name}", definition, "sanitize", "sanitize", {"num_tokens": tokens, "num_pages": pages},
                 params)
    inputs = make_inputs(w, "cuda", 3)
    outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
    poison(outputs)
    named = {**inputs, **outputs}
    tsm.sparse_mla_attention(*[named[n] for n in ("q_nope", "q_pe", "sparse_indices", "sm_scale", "output", "lse")],
                             **{k: named[k] for k in ("ckv_cache", "kpe_cache", "kv_cache", "topk_length",
                                                      "attn_sink") if k in named},
                             lse_base_e=d.params["lse_base"] != 2.0, num_splits=num_splits)
    torch.cuda.synchronize()
    verdict = check(d, inputs, outputs)
    print(f"{name}: {'ok' if verdict.passed else 'FAILED ' + '; '.join(verdict.problems)[:300]}", flush=True)
    return verdict.passed


if __name__ == "__main__":
    names = list(CASES) if sys.argv[1:] in ([], ["all"]) else sys.argv[1:]
    sys.exit(0 if all([run(n) for n in names]) else 1)
