"""Prepared, not yet timed on a GPU: the Triton FP8 kernel with fp16 tiles, for issue 6's "FP8 KV within
1.15x of bf16 KV" (the shipped FP8 kernel takes 1.8x at 64/128 heads).

    python3 profiles/h200/attention/next/triton_fp8_f16.py OUTDIR     # H200: checks, then the bench
    TRITON_INTERPRET=1 python profiles/h200/attention/next/triton_fp8_f16.py --check   # CPU, small shapes
    python profiles/h200/attention/next/triton_fp8_f16.py --compile   # sm_90a registers and spills (CPU too)

Why it might: the shipped FP8 kernel (triton_sparse_mla._sparse_mla_fp8_kernel) keeps bf16 exactness by
feeding the e4m3 values to tl.dot undequantized and scaling each 128-value group's logits and P by its
scale: four partial logit tiles to scale and sum, four P x scale conversions a tile. Here, as in the Hopper
kernel, each group is dequantized to fp16 (e4m3 x fp32 scale, rounded once; bf16 rounding fails the
contest tolerance, hopper_mla.cu), q is converted to fp16 once, the five logit dots chain into one
accumulator and one fp16 P feeds the four output dots. fp16's range is kept as the Hopper kernel keeps it:
a q row whose largest value reaches 2^16 is scaled by 2^-(E - 15), a token whose largest dequantized or
rope value reaches 65504 by 2^-min(E - 14, 15), and both are undone in fp32 on the logits (and on the
token's P before its fp16 rounding).

Per group, not one [tokens, 512] tile: dequantized whole, the tile's fp32 values took 128 registers a
thread beside the 128 of the accumulator, and Triton 3.6 (the H200's; also installed on the CPU machine,
where `--compile` gives the same figures) spilled 364 bytes at 64 tokens (session11/fp8-f16-compile.log).
Per group it spills 20 bytes at 64 tokens and none at 32 (the shipped FP8 kernel: 16 at 32). Both are
timed (CONFIGS).

The H200 run writes OUTDIR/fp8_f16.csv: for 64 and 128 heads and T in TOKENS, the shipped bf16 and FP8
Triton calls and this one per configuration (us, CUPTI, cold L2), each FP8 / bf16, and this kernel's verdict
against the reference on the bench inputs; the checks before it cover 1 and 3 splits and inputs past
fp16's range (tests/test_attention_hopper.py's).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from dsactl.definitions import get
from dsactl.fp8 import MLA_KPE_OFFSET, MLA_NUM_SCALES, MLA_SCALE_GROUP, MLA_SCALE_OFFSET, MLA_TOKEN_BYTES
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.kernels.attention.triton_sparse_mla import _row_share, _softmax_step, _write_groups
from dsactl.verify.rules import check
from dsactl.workloads import Workload, make_inputs

HEADS = (64, 128)
TOKENS = (1, 8, 32, 128)
# 64 tokens: the bf16 kernel's tile at 64+ heads; 32: the shipped FP8 kernel's, and no spills here.
CONFIGS = {"n64": tsm.Config(block_h=64, block_n=64, num_warps=8, num_stages=2),
           "n32": tsm.Config(block_h=64, block_n=32, num_warps=8, num_stages=2)}
_TOKEN_BYTES = tl.constexpr(MLA_TOKEN_BYTES)
_SCALE_WORD32 = tl.constexpr(MLA_SCALE_OFFSET // 4)
_TOKEN_WORDS32 = tl.constexpr(MLA_TOKEN_BYTES // 4)
_KPE_WORD16 = tl.constexpr(MLA_KPE_OFFSET // 2)
_TOKEN_WORDS16 = tl.constexpr(MLA_TOKEN_BYTES // 2)
_GROUP = tl.constexpr(MLA_SCALE_GROUP)
_NUM_SCALES = tl.constexpr(MLA_NUM_SCALES)
_FP16_MAX = tl.constexpr(65504.0)
_BF16_PAST_FP16 = tl.constexpr(65536.0)  # a bf16 value rounds to fp16 inf from here (below: at most 65280)
_E4M3_MAX = tl.constexpr(448.0)
_MAX_TOKEN_SHIFT = tl.constexpr(15)  # P (<= 1) times 2^15 stays inside fp16


@triton.jit
def _exponent(x):
    """floor(log2(x)) of positive normal fp32 values, exactly (from the bits)."""
    return ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _dequant_f16(e_ptr, valid, scale, dot_dtype: tl.constexpr):
    """One group of e4m3 values [N, 128] times its tokens' scales [N] (shift included), rounded once to fp16."""
    e = tl.load(e_ptr, mask=valid[:, None], other=0.0)
    return (e.to(tl.float32) * scale[:, None]).to(tl.float16).to(dot_dtype)


@triton.jit
def _to_f16(x, down, dot_dtype: tl.constexpr):
    """fp32 rows [R, C] times their powers of two down [R], rounded to fp16."""
    return (x * down[:, None]).to(tl.float16).to(dot_dtype)


@triton.jit(do_not_specialize=["topk", "num_splits", "has_topk_length", "has_sink"])
def _fp8_f16_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, unused_ptr, indices_ptr, topk_length_ptr, sink_ptr,
    out_ptr, lse_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    sm_scale_log2, lse_scale, topk, num_splits, has_topk_length, has_sink,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, unused_stride_a, unused_stride_b, stride_idx_t,
    stride_out_t, stride_out_h, stride_lse_t, stride_lse_h,
    HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    tl.static_assert(HEADS % BLOCK_H == 0, "a head group must not run past the last head")
    tl.static_assert(BLOCK_H >= 16 and BLOCK_N >= 16, "tl.dot needs tiles of at least 16")
    tl.static_assert(_NUM_SCALES == 4 and _NUM_SCALES * _GROUP == 512,
                     "the kernel spells out 4 scale groups that tile the 512 ckv values")
    group = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2)
    # Rounded to fp16 in any case (the interpreter, whose bf16 dot is wrong, then multiplies in fp32).
    dot_dtype: tl.constexpr = tl.float32 if UPCAST_DOT else tl.float16

    heads = group * BLOCK_H + tl.arange(0, BLOCK_H)
    r = tl.arange(0, 64)
    c = tl.arange(0, _GROUP)
    q_ptr = q_nope_ptr + t * stride_qn_t + heads[:, None] * stride_qn_h + c[None, :]
    q0 = tl.load(q_ptr).to(tl.float32)
    q1 = tl.load(q_ptr + _GROUP).to(tl.float32)
    q2 = tl.load(q_ptr + 2 * _GROUP).to(tl.float32)
    q3 = tl.load(q_ptr + 3 * _GROUP).to(tl.float32)
    q_pe = tl.load(q_pe_ptr + t * stride_qp_t + heads[:, None] * stride_qp_h + r[None, :]).to(tl.float32)
    q_max = tl.maximum(tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1)),
                       tl.maximum(tl.max(tl.abs(q2), 1), tl.max(tl.abs(q3), 1)))
    q_max = tl.maximum(q_max, tl.max(tl.abs(q_pe), 1))
    q_shift = tl.where(q_max >= _BF16_PAST_FP16, _exponent(q_max) - 15, 0).to(tl.float32)
    q_down = tl.exp2(-q_shift)
    q0 = _to_f16(q0, q_down, dot_dtype)
    q1 = _to_f16(q1, q_down, dot_dtype)
    q2 = _to_f16(q2, q_down, dot_dtype)
    q3 = _to_f16(q3, q_down, dot_dtype)
    q_pe = _to_f16(q_pe, q_down, dot_dtype)
    q_up = tl.exp2(q_shift)
    n_mine = _row_share(topk_length_ptr, topk, t, split, num_splits, has_topk_length)
    row_ptr = indices_ptr + t * stride_idx_t + split

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, _GROUP], tl.float32)
    acc1 = tl.zeros([BLOCK_H, _GROUP], tl.float32)
    acc2 = tl.zeros([BLOCK_H, _GROUP], tl.float32)
    acc3 = tl.zeros([BLOCK_H, _GROUP], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_mine, BLOCK_N):
        j = start + offs_n
        idx = tl.load(row_ptr + j * num_splits, mask=j < n_mine, other=-1)
        valid = idx >= 0
        tok = idx.to(tl.int64)
        e_ptr = kv_ptr.to(tl.pointer_type(tl.float8e4nv)) + tok[:, None] * _TOKEN_BYTES + c[None, :]
        sc_ptr = kv_ptr.to(tl.pointer_type(tl.float32)) + tok * _TOKEN_WORDS32 + _SCALE_WORD32
        sc0 = tl.load(sc_ptr, mask=valid, other=0.0)
        sc1 = tl.load(sc_ptr + 1, mask=valid, other=0.0)
        sc2 = tl.load(sc_ptr + 2, mask=valid, other=0.0)
        sc3 = tl.load(sc_ptr + 3, mask=valid, other=0.0)
        kpe = tl.load(kv_ptr.to(tl.pointer_type(tl.bfloat16)) + tok[:, None] * _TOKEN_WORDS16 + _KPE_WORD16
                      + r[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        largest = tl.maximum(tl.maximum(tl.abs(sc0), tl.abs(sc1)), tl.maximum(tl.abs(sc2), tl.abs(sc3))) * _E4M3_MAX
        largest = tl.maximum(largest, tl.max(tl.abs(kpe), 1))
        k_shift = tl.where(largest >= _FP16_MAX, tl.minimum(_exponent(largest) - 14, _MAX_TOKEN_SHIFT), 0)
        k_down = tl.exp2(-k_shift.to(tl.float32))
        k_up = tl.exp2(k_shift.to(tl.float32))
        # Each group dequantized next to its dot, so that one group's fp32 values are live at a time.
        s = tl.dot(q_pe, tl.trans(_to_f16(kpe, k_down, dot_dtype)))
        kv0 = _dequant_f16(e_ptr, valid, sc0 * k_down, dot_dtype)
        s = tl.dot(q0, tl.trans(kv0), s)
        kv1 = _dequant_f16(e_ptr + _GROUP, valid, sc1 * k_down, dot_dtype)
        s = tl.dot(q1, tl.trans(kv1), s)
        kv2 = _dequant_f16(e_ptr + 2 * _GROUP, valid, sc2 * k_down, dot_dtype)
        s = tl.dot(q2, tl.trans(kv2), s)
        kv3 = _dequant_f16(e_ptr + 3 * _GROUP, valid, sc3 * k_down, dot_dtype)
        s = tl.dot(q3, tl.trans(kv3), s)
        s = s * q_up[:, None] * k_up[None, :]
        m_i, alpha, p, l_i = _softmax_step(m_i, l_i, s, valid, sm_scale_log2)
        p = (p * k_up[None, :]).to(tl.float16).to(dot_dtype)
        acc0 = tl.dot(p, kv0, acc0 * alpha[:, None])
        acc1 = tl.dot(p, kv1, acc1 * alpha[:, None])
        acc2 = tl.dot(p, kv2, acc2 * alpha[:, None])
        acc3 = tl.dot(p, kv3, acc3 * alpha[:, None])

    _write_groups(acc0, acc1, acc2, acc3, c, m_i, l_i, t, split, heads, num_splits, has_sink, lse_scale, sink_ptr,
                  out_ptr, lse_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h, stride_lse_t,
                  stride_lse_h, HEADS)


def sparse_mla_attention_f16(q_nope, q_pe, sparse_indices, sm_scale, output, lse, *, kv_cache,
                             lse_base_e: bool = False, num_splits: int | None = None,
                             config: str = "n64") -> None:
    """The shipped launcher's flow (triton_sparse_mla.sparse_mla_attention) with this kernel; FP8, 64+ heads."""
    num_tokens, heads, topk, _ = tsm.check_inputs(q_nope, q_pe, sparse_indices, output, lse, None, None, kv_cache,
                                                 None, None, heads_served=HEADS, who="fp8 f16 experiment")
    if num_tokens == 0:
        return
    num_sms = tsm._num_sms(q_nope.device)
    cfg = CONFIGS[config]
    splits = num_splits or tsm.num_splits_for(num_tokens, heads, topk, cfg, num_sms)
    partials = (lse, lse, lse) if splits == 1 else tsm.split_partials(q_nope.device, num_tokens, splits, heads)
    lse_scale = 1.0 / math.log2(math.e) if lse_base_e else 1.0
    _fp8_f16_kernel[(heads // cfg.block_h, splits, num_tokens)](
        q_nope, q_pe, kv_cache, kv_cache, sparse_indices, sparse_indices, lse, output, lse, *partials,
        float(sm_scale) * math.log2(math.e), lse_scale, topk, splits, 0, 0,
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), MLA_TOKEN_BYTES, MLA_TOKEN_BYTES,
        sparse_indices.stride(0), output.stride(0), output.stride(1), lse.stride(0), lse.stride(1),
        HEADS=heads, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, UPCAST_DOT=tsm.INTERPRETING,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if splits > 1:
        tsm.combine(partials, None, output, lse, lse_scale, heads, splits, num_tokens)


def _workload(heads: int, tokens: int, topk: int, fp8: bool, pages: int) -> Workload:
    definition = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps64" + ("_fp8kv" if fp8 else "")
    return Workload(f"f16-h{heads}-t{tokens}", definition, "next", "full",
                    {"num_tokens": tokens, "num_pages": pages}, {"pattern": "scattered"})


def _launch(launcher, definition: str, inputs: dict, outputs: dict, **kwargs) -> None:
    kv = {"kv_cache": inputs["kv_cache"]} if "kv_cache" in inputs else {"ckv_cache": inputs["ckv_cache"],
                                                                      "kpe_cache": inputs["kpe_cache"]}
    launcher(inputs["q_nope"], inputs["q_pe"], inputs["sparse_indices"], inputs["sm_scale"], outputs["output"],
             outputs["lse"], lse_base_e=get(definition).params["lse_base"] != 2.0, **kv, **kwargs)


def _run(launcher, definition: str, inputs: dict, **kwargs) -> dict:
    """One call into freshly poisoned outputs (NaN: an element the kernel leaves unwritten fails)."""
    d = get(definition)
    outputs = d.allocate_outputs(d.check_inputs(inputs), inputs["q_nope"].device)
    for o in outputs.values():
        o.fill_(float("nan"))
    _launch(launcher, definition, inputs, outputs, **kwargs)
    return outputs


def _checks(device: str, topk: int, pages: int) -> list[str]:
    """This kernel against the reference, per configuration: scattered rows at 1 and several splits, and
    inputs past fp16."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests"))
    import test_attention_hopper as th  # its fp16-range inputs

    problems = []
    for heads in HEADS:
        w = _workload(heads, 3, topk, True, pages)
        inputs = make_inputs(w, device, 1)
        for config in CONFIGS:
            for splits in (1, 3):
                verdict = check(get(w.definition), inputs, _run(sparse_mla_attention_f16, w.definition, inputs,
                                                                num_splits=splits, config=config))
                problems += [f"h{heads} {config} splits {splits}: {p}" for p in verdict.problems]
            for scaled in ("q", "kv", "both"):
                scaled_inputs, factor = th._scaled_past_fp16(inputs, scaled)
                out = _run(sparse_mla_attention_f16, w.definition, scaled_inputs, num_splits=2, config=config)
                verdict = th._past_fp16_verdict(w.definition, inputs, scaled_inputs, factor, out)
                problems += [f"h{heads} {config} past fp16 ({scaled}): {p}" for p in verdict.problems]
    return problems


def _compile() -> None:
    """sm_90a registers and spills of this kernel, compiled here as `dsactl build` compiles the shipped ones."""
    import tempfile

    from dsactl.build import arch as arch_table
    from dsactl.build.triton_aot import TritonConfig, compile_config

    spec = next(s for s in tsm.aot_specs() if s["name"] == "sparse_mla_h128_fp8kv")
    specs = [spec]
    for name, cfg in CONFIGS.items():
        constexprs = {"HEADS": 128, "BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n, "UPCAST_DOT": False}
        signature = {n: ty for n, ty in spec["signature"].items() if n not in ("PREFETCH",)}
        signature.update({k: "constexpr" for k in constexprs})
        specs.append({"name": f"fp8_f16_h128_{name}", "fn": _fp8_f16_kernel, "signature": signature,
                      "constexprs": constexprs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    arch = next(a for a in arch_table.ARCHES if a.name == "sm90a")
    with tempfile.TemporaryDirectory() as tmp:
        for s in specs:
            row = compile_config(TritonConfig("next.triton_fp8_f16", s), arch, Path(tmp))
            print(f"{s['name']}: {row.registers} registers, {row.spill_stores} B spilled, "
                  f"{row.shared_dynamic} B shared (triton {triton.__version__})")


def main(out: str) -> None:
    from bench_hopper import cold_l2_timer  # profiles/h200/attention, on sys.path below
    from bench_old_vs_new import write_csv

    problems = _checks("cuda", 2048, 512)
    print("checks:", "all passed" if not problems else "\n  ".join(["FAILED"] + problems), flush=True)
    timer = cold_l2_timer()
    rows = []
    for heads in HEADS:
        for tokens in TOKENS:
            row = {"heads": heads, "tokens": tokens}
            contenders = [("bf16", False, tsm.sparse_mla_attention, {}), ("fp8", True, tsm.sparse_mla_attention, {})]
            contenders += [(f"fp8_f16_{c}", True, sparse_mla_attention_f16, {"config": c}) for c in CONFIGS]
            for name, fp8, launcher, kwargs in contenders:
                w = _workload(heads, tokens, 2048, fp8, 8192)
                inputs = make_inputs(w, "cuda", 0)
                outputs = _run(launcher, w.definition, inputs, **kwargs)
                if launcher is sparse_mla_attention_f16:
                    row[f"{name}_passes"] = check(get(w.definition), inputs, outputs).passed
                # Only the launcher is timed: the poisoning fills would add their kernels to every row.
                row[f"{name}_us"] = round(timer(lambda: _launch(launcher, w.definition, inputs, outputs, **kwargs)), 2)
            for name, *_ in contenders[1:]:
                row[f"{name}_over_bf16"] = round(row[f"{name}_us"] / row["bf16_us"], 3)
            rows.append(row)
            print(row, flush=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_csv(Path(out) / "fp8_f16.csv", rows)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if sys.argv[1:] == ["--check"]:
        found = _checks("cpu", 128, 8)
        print("checks:", "all passed" if not found else "\n  ".join(["FAILED"] + found))
        sys.exit(1 if found else 0)
    if sys.argv[1:] == ["--compile"]:
        _compile()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "profiles/h200/attention/next")
