"""The split combine's tile and warp count, timed inside the Hopper kernel's calls on the H200.

    python3 profiles/h200/attention/session13/combine_sweep.py OUTDIR

Session 13's split sweep (ab/new/split_sweep_hopper.csv: each call timed whole and with the combine
skipped) put the combine at 5.5 us of h64 T=8 bf16's 15.7 (16 splits, bf16 partials, 8 MB) and 7.8 of
h64 T=4's 15.9 at 32 splits, against 3.1 for the same bytes at 8 splits or in fp32. This times every
decode shape whose Hopper call combines, once per combine variant (column block BLOCK_D and warps; heads
per program as many as the 8192-value tile holds, as combine_blocks() then did; the shipped kernel and a
variant that adds the splits one by one, _combine_loop_kernel) in place of
triton_sparse_mla.combine, plus once with no combine; each variant's output is checked against the
shipped combine's. Bench's timing (CUPTI kernel time summed over the call, cold L2, median of 10).
Writes OUTDIR/combine_sweep.csv and prints, per shape, the combine's time per variant.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench_hopper, bench_old_vs_new
from bench_hopper import TOPK, caller, cold_l2_timer, workload  # noqa: E402
from bench_old_vs_new import write_csv  # noqa: E402

from dsactl.definitions import get  # noqa: E402
from dsactl.kernels.attention import hopper_mla  # noqa: E402
from dsactl.kernels.attention import triton_sparse_mla as tsm  # noqa: E402
from dsactl.workloads import make_inputs  # noqa: E402

SHAPES = [(64, 1), (64, 2), (64, 4), (64, 8), (64, 16), (64, 32), (128, 1), (128, 2), (128, 4), (128, 8),
          (128, 16), (128, 32)]
# (kernel, BLOCK_D, warps); first = shipped. "tile": the shipped kernel (one [heads, splits, columns] load,
# reduced over splits); "loop": _combine_loop_kernel below (a [heads, columns] load per split, unrolled).
VARIANTS = [("tile", 64, 4), ("tile", 64, 8), ("tile", 64, 2), ("tile", 32, 4), ("tile", 128, 4), ("tile", 128, 8),
            ("tile", 256, 4), ("tile", 256, 8), ("loop", 64, 4), ("loop", 64, 2), ("loop", 128, 4), ("loop", 128, 2),
            ("loop", 256, 4), ("loop", 256, 8)]


@triton.jit(do_not_specialize=["num_splits", "has_sink"])
def _combine_loop_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, sink_ptr, out_ptr, lse_ptr,
    lse_scale, num_heads, num_splits, has_sink, stride_out_t, stride_out_h, stride_lse_t, stride_lse_h,
    SPLITS_PAD: tl.constexpr, BLOCK_HC: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """The shipped combine's merge with no reduction across threads: the weights from the [heads, splits]
    maxima, then per split (unrolled) a [heads, columns] tile added in registers."""
    chunk = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_HC + tl.arange(0, BLOCK_HC)
    t = tl.program_id(2)
    s = tl.arange(0, SPLITS_PAD)
    m = tl.load(part_m_ptr + (t * num_splits + s[None, :]) * num_heads + heads[:, None],
                mask=(s < num_splits)[None, :], other=float("-inf"))
    m_all = tl.max(m, 1)
    ref = tl.where(m_all == float("-inf"), 0.0, m_all)
    d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_HC, BLOCK_D], dtype=tl.float32)
    l_all = tl.zeros([BLOCK_HC], dtype=tl.float32)
    for i in tl.static_range(SPLITS_PAD):
        used = tl.full([BLOCK_HC], i, tl.int32) < num_splits  # a tensor: the interpreter takes no scalar mask
        row = (t * num_splits + i) * num_heads + heads
        w = tl.exp2(tl.load(part_m_ptr + row, mask=used, other=float("-inf")) - ref)  # unused, empty: 0
        part = tl.load(part_acc_ptr + row[:, None].to(tl.int64) * tsm._D_CKV + d[None, :], mask=used[:, None], other=0.0)
        acc += w[:, None] * part.to(tl.float32)
        l_all += w * tl.load(part_l_ptr + row, mask=used, other=0.0)
    out, lse = tsm._finalize(acc, m_all, l_all, sink_ptr, heads, has_sink, lse_scale)
    tl.store(out_ptr + t * stride_out_t + heads[:, None] * stride_out_h + d[None, :], out.to(tl.bfloat16))
    if chunk == 0:
        tl.store(lse_ptr + t * stride_lse_t + heads * stride_lse_h, lse)


def variant(kind: str, block_d: int, warps: int):
    kernel = tsm._sparse_mla_combine_kernel if kind == "tile" else _combine_loop_kernel

    def combine(partials, attn_sink, output, lse, lse_scale, heads, splits, num_tokens):
        part_acc, part_m, part_l = partials
        splits_pad = max(2, triton.next_power_of_2(splits))
        block_hc = min(heads, tsm.COMBINE_TILE // (splits_pad * block_d))
        assert block_hc >= 1
        kernel[(tsm.MLA_CKV_DIM // block_d, heads // block_hc, num_tokens)](
            part_acc, part_m, part_l, attn_sink if attn_sink is not None else lse, output, lse,
            lse_scale, heads, splits, int(attn_sink is not None),
            output.stride(0), output.stride(1), lse.stride(0), lse.stride(1),
            SPLITS_PAD=splits_pad, BLOCK_HC=block_hc, BLOCK_D=block_d, num_warps=warps)
    return combine


def main(out: str) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    time_us = cold_l2_timer()
    shipped = tsm.combine
    rows = []
    for fp8 in (False, True):
        for heads, tokens in SHAPES:
            splits = hopper_mla.num_splits_for(tokens, heads, TOPK, num_sms)
            if splits == 1 or hopper_mla.merges_in_cluster(splits, heads, fp8):
                continue
            w = workload(heads, tokens, fp8)
            d = get(w.definition)
            inputs = make_inputs(w, "cuda", 0)
            outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
            call = caller(hopper_mla.sparse_mla_attention, inputs, outputs, fp8)
            call()
            expected = outputs["output"].float().clone(), outputs["lse"].clone()
            tsm.combine = lambda *args, **kwargs: None
            kernel_us = time_us(call)
            bf16 = hopper_mla.bf16_partials_for(tokens, heads, splits, num_sms)
            line = []
            for kind, block_d, warps in VARIANTS:
                tsm.combine = variant(kind, block_d, warps)
                try:
                    outputs["output"].fill_(float("nan"))
                    call()
                    err = (outputs["output"].float() - expected[0]).abs().max().item()
                    lse_err = (outputs["lse"] - expected[1]).abs().nan_to_num(0.0).max().item()
                    us = time_us(call)
                finally:
                    tsm.combine = shipped
                rows.append({"heads": heads, "tokens": tokens, "kv": "fp8" if fp8 else "bf16", "splits": splits,
                             "partials": "bf16" if bf16 else "fp32", "kernel": kind, "block_d": block_d, "warps": warps,
                             "call_us": round(us, 2), "kernel_us": round(kernel_us, 2),
                             "combine_us": round(us - kernel_us, 2), "max_out_diff": err, "max_lse_diff": lse_err})
                line.append(f"{kind[0]}D{block_d}w{warps}={us - kernel_us:.2f}" + ("" if err <= 1e-2 else f"(ERR {err:.3g})"))
            print(f"h{heads} T={tokens} {'fp8' if fp8 else 'bf16'} S={splits} {'bf16' if bf16 else 'fp32'} "
                  f"partials, kernel {kernel_us:.2f}: " + " ".join(line), flush=True)
            write_csv(out_dir / "combine_sweep.csv", rows)
            del inputs, outputs


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "profiles/h200/attention/session13/combine")
