"""First-light diagnosis of the Hopper sparse MLA kernel (hopper_mla.cu) on an sm_90 GPU.

One case per process (a hang or a fault costs only that case; run it under `timeout`):
    python3 profiles/h200/attention/hopper_check.py CASE [CASE ...]
    python3 profiles/h200/attention/hopper_check.py --list
A case is HEADS-TOPK-TOKENS-KV[-SPLITS][-PATTERN][-cluster], e.g. 64-64-1-bf16-1-full (SPLITS 0: the
formula's; -cluster: the splits merged in a cluster, not by the combine kernel). For each it prints the
largest output/lse errors against the float32 reference and where the wrong outputs sit: by
16-head warp slice (wgmma accumulator rows), by 64-column chunk (consumer 0 owns chunks 0-3,
consumer 1 chunks 4-7) and by token, which is what tells a descriptor or layout bug from a
softmax or hand-off bug.
"""

from __future__ import annotations

import sys
import time

import torch

from dsactl.definitions import get
from dsactl.harness import poison
from dsactl.kernels.attention import hopper_mla
from dsactl.verify.rules import check
from dsactl.workloads import Workload, make_inputs

CASES = ("64-64-1-bf16-1-full", "64-64-1-fp8-1-full", "64-128-1-bf16-1-full", "64-2048-1-bf16-1-scattered",
         "128-2048-2-bf16-0-scattered", "64-2048-1-fp8-1-scattered", "128-2048-8-fp8-0-scattered")
ATOL = RTOL = 1e-2  # the contest tolerance (DESIGN.md section 3)
NUM_PAGES = 2048  # 131072 token slots: the KV (86 MB FP8, 151 MB bf16) does not fit the 60 MB L2


def run(case: str) -> bool:
    heads, topk, tokens, kv, *rest = case.split("-")
    in_cluster = rest[-1:] == ["cluster"]
    rest = rest[:-1] if in_cluster else rest
    heads, topk, tokens = int(heads), int(topk), int(tokens)
    splits = int(rest[0]) if rest and rest[0] != "0" else None
    pattern = rest[1] if len(rest) > 1 else "scattered"
    suffix = "_fp8kv" if kv == "fp8" else ""
    definition = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps64{suffix}"
    d = get(definition)
    w = Workload(f"check-{case}", definition, "check", "check", {"num_tokens": tokens, "num_pages": NUM_PAGES},
                 {"pattern": pattern, "valid": [topk * 3 // 4] * tokens} if pattern == "scattered"
                 else {"pattern": pattern})
    inputs = make_inputs(w, "cuda", 1)
    outputs = d.allocate_outputs(d.check_inputs(inputs), torch.device("cuda"))
    poison(outputs)
    named = {**inputs, **outputs}
    t0 = time.perf_counter()
    hopper_mla.sparse_mla_attention(**{n: named[n] for n in d.signature}, num_splits=splits,
                                    reduce_in_cluster=in_cluster or None)
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    verdict = check(d, inputs, outputs)
    ref = d.run_reference(inputs)
    out, lse = outputs["output"].float(), outputs["lse"]
    want_out, want_lse = ref["output"].float(), ref["lse"]
    bad = ~torch.isclose(out, want_out, atol=ATOL, rtol=RTOL)  # NaN poison counts as bad
    print(f"== {case}: {'PASS' if verdict.passed else 'FAIL'} ({ms:.1f} ms first call) "
          f"max|out err| {(out - want_out).abs().nan_to_num(float('inf')).max().item():.4g} "
          f"max|lse err| {(lse - want_lse).abs().nan_to_num(float('inf')).max().item():.4g} "
          f"bad outputs {int(bad.sum())}/{bad.numel()} NaN {int(out.isnan().sum())}")
    if bad.any():
        per_warp = bad.view(tokens, heads // 16, 16, 512).sum(dim=(0, 2, 3)).tolist()
        per_chunk = bad.view(tokens, heads, 8, 64).sum(dim=(0, 1, 3)).tolist()
        per_token = bad.sum(dim=(1, 2)).tolist()
        print(f"   bad by 16-head slice {per_warp}\n   bad by 64-col chunk {per_chunk}\n   bad by token {per_token}")
        t, h, c = (int(i) for i in bad.nonzero()[0])
        print(f"   first bad [t={t}, h={h}, c={c}]: got {out[t, h, c].item():.5g} want {want_out[t, h, c].item():.5g}; "
              f"row got {out[t, h, :6].tolist()} want {want_out[t, h, :6].tolist()}")
        print(f"   lse got {lse[t, :4].tolist()} want {want_lse[t, :4].tolist()}")
    for problem in verdict.problems[:3]:
        print(f"   {problem}")
    return verdict.passed


def main() -> int:
    if sys.argv[1:] == ["--list"]:
        print("\n".join(CASES))
        return 0
    results = [run(case) for case in sys.argv[1:] or CASES]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
