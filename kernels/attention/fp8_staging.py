"""An FP8 MLA cache staged as fp16 rows for the Hopper kernel, where a call gathers each cached token many times.

The Hopper kernel's FP8 path dequantizes every gathered token in its producer warpgroup, and that work
bounds it. A call with many query tokens (prefill) gathers each cached token many times over: T x topk
gathers from a cache of N tokens. Staging converts the cache once (N x 656 bytes read, N x 1156 written)
into exactly what the FP8 path's producer would have written to shared memory (hopper_mla.cu,
store_fp8), so the kernel's staged form copies rows as its bf16 path does and runs the FP8 path's fp16
MMAs on the same values: the same output bits as the FP8 path, without its per-gather conversion.

Contract: kv_cache int8 [P, 64, 656] contiguous (the FP8 MLA token layout, kernels/fp8.py) -> rows fp16
[P * 64, 576] (ckv then rope) and factors fp32 [P * 64]. A token whose values could reach fp16's limit
(448 x its largest scale, or its largest rope value, at 65504 or more) is stored scaled down by
2^-shift, shift = min(exponent - 14, 15), and its factor is 2^shift (else 1): the kernel scales its
logits and P back. ckv values are e4m3 x (scale x 2^-shift) rounded once, fp32 -> fp16; rope values
bf16 x 2^-shift, likewise.

`upconvert` is the other form, what an engine does before FlashMLA's bf16-only sparse prefill kernel (vLLM's
"upconvert the FP8 cache to BF16, then the prefill kernel"): bf16 rows [P * 64, 576] of ckv values e4m3 x scale
rounded once, fp32 -> bf16, then the rope values as they are. dsactl's own path never needs it; bench's
flashmla-upconvert baseline times it with that kernel (dsactl/bench/baselines.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from ..fp8 import MLA_CKV_DIM, MLA_KPE_DIM, MLA_SCALE_GROUP, MLA_TOKEN_BYTES
from ..launch_math import cdiv
from ..triton_options import FP_FUSION
from .triton_sparse_mla import _TOKEN_UNITS, _fp8_scales_rope, _fp8_tokens, _token_shift

ROW_DIM = MLA_CKV_DIM + MLA_KPE_DIM  # 576: a staged row, ckv then rope
# Tokens per program: 16 x 656 bytes in, 16 x 1156 out, enough bytes in flight per SM at 4 warps (the pass's
# rate, no other tile measured: docs/design.md, "Measured choices").
BLOCK_TOKENS = 16
NUM_WARPS = 4

_GROUP = tl.constexpr(MLA_SCALE_GROUP)
_CKV = tl.constexpr(MLA_CKV_DIM)
_KPE = tl.constexpr(MLA_KPE_DIM)
_ROW = tl.constexpr(ROW_DIM)


@triton.jit(do_not_specialize=["num_tokens"])
def fp8_stage_kernel(kv_ptr, rows_ptr, factors_ptr, num_tokens, BLOCK_T: tl.constexpr):
    tl.static_assert(_CKV == 4 * _GROUP, "one fp32 scale per 128 of the 512 ckv values")
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, _GROUP)
    r = tl.arange(0, _KPE)
    # The token loads and the per-token shift of the Triton kernel's FP8 path, which are hopper_mla.cu's.
    # A contiguous cache: pages of one token, a token's 656 bytes apart.
    valid, unit, e_ptr = _fp8_tokens(kv_ptr, tl.where(tok < num_tokens, tok, -1), c, 1, _TOKEN_UNITS)
    tok = tok.to(tl.int64)
    sc0, sc1, sc2, sc3, kpe = _fp8_scales_rope(kv_ptr, unit, valid, r)
    kpe = kpe.to(tl.float32)
    shift = _token_shift(sc0, sc1, sc2, sc3, kpe)
    down = ((127 - shift) << 23).to(tl.float32, bitcast=True)  # 2^-shift and 2^shift, exact
    tl.store(factors_ptr + tok, ((127 + shift) << 23).to(tl.float32, bitcast=True), mask=valid)
    row_ptr = rows_ptr + tok[:, None] * _ROW
    for g in tl.static_range(4):
        sc = tl.where(g == 0, sc0, tl.where(g == 1, sc1, tl.where(g == 2, sc2, sc3))) * down
        e = tl.load(e_ptr + g * _GROUP, mask=valid[:, None], other=0.0).to(tl.float32)
        tl.store(row_ptr + g * _GROUP + c[None, :], (e * sc[:, None]).to(tl.float16), mask=valid[:, None])
    tl.store(row_ptr + _CKV + r[None, :], (kpe * down[:, None]).to(tl.float16), mask=valid[:, None])


@triton.jit(do_not_specialize=["num_tokens"])
def fp8_upconvert_kernel(kv_ptr, rows_ptr, num_tokens, BLOCK_T: tl.constexpr):
    tl.static_assert(_CKV == 4 * _GROUP, "one fp32 scale per 128 of the 512 ckv values")
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.arange(0, _GROUP)
    r = tl.arange(0, _KPE)
    valid, unit, e_ptr = _fp8_tokens(kv_ptr, tl.where(tok < num_tokens, tok, -1), c, 1, _TOKEN_UNITS)
    sc0, sc1, sc2, sc3, kpe = _fp8_scales_rope(kv_ptr, unit, valid, r)
    row_ptr = rows_ptr + tok.to(tl.int64)[:, None] * _ROW
    for g in tl.static_range(4):
        sc = tl.where(g == 0, sc0, tl.where(g == 1, sc1, tl.where(g == 2, sc2, sc3)))
        e = tl.load(e_ptr + g * _GROUP, mask=valid[:, None], other=0.0).to(tl.float32)
        tl.store(row_ptr + g * _GROUP + c[None, :], (e * sc[:, None]).to(tl.bfloat16), mask=valid[:, None])
    tl.store(row_ptr + _CKV + r[None, :], kpe, mask=valid[:, None])


def _check_cache(kv_cache: torch.Tensor) -> int:
    """The cache's token count, once its dtype, shape and layout are the FP8 MLA cache's."""
    if kv_cache.dtype != torch.int8 or kv_cache.dim() != 3 or kv_cache.shape[2] != MLA_TOKEN_BYTES:
        raise KernelInputError(f"kv_cache must be int8 [pages, 64, {MLA_TOKEN_BYTES}], got {kv_cache.dtype} "
                               f"{list(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        raise KernelInputError(f"kv_cache must be contiguous ({MLA_TOKEN_BYTES} bytes per token)")
    return kv_cache.shape[0] * kv_cache.shape[1]


def upconvert(kv_cache: torch.Tensor) -> torch.Tensor:
    """bf16 rows [P * 64, 576], a new tensor, of an FP8 MLA cache (module docstring)."""
    num_tokens = _check_cache(kv_cache)
    rows = torch.empty(num_tokens, ROW_DIM, dtype=torch.bfloat16, device=kv_cache.device)
    if num_tokens:
        fp8_upconvert_kernel[(cdiv(num_tokens, BLOCK_TOKENS),)](
            kv_cache, rows, num_tokens, BLOCK_T=BLOCK_TOKENS, num_warps=NUM_WARPS, num_stages=1,
            enable_fp_fusion=FP_FUSION)
    return rows


def stage(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows fp16 [P * 64, 576], factors fp32 [P * 64]), new tensors, of an FP8 MLA cache (module docstring)."""
    num_tokens = _check_cache(kv_cache)
    rows = torch.empty(num_tokens, ROW_DIM, dtype=torch.float16, device=kv_cache.device)
    factors = torch.empty(num_tokens, dtype=torch.float32, device=kv_cache.device)
    if num_tokens:
        fp8_stage_kernel[(cdiv(num_tokens, BLOCK_TOKENS),)](
            kv_cache, rows, factors, num_tokens, BLOCK_T=BLOCK_TOKENS, num_warps=NUM_WARPS, num_stages=1,
            enable_fp_fusion=FP_FUSION)
    return rows, factors


def aot_specs() -> list[dict]:
    """Each kernel's one configuration, for `dsactl build`."""
    signature = {"kv_ptr": "*i8", "rows_ptr": "*fp16", "factors_ptr": "*fp32", "num_tokens": "i32",
                 "BLOCK_T": "constexpr"}
    upconverted = {"kv_ptr": "*i8", "rows_ptr": "*bf16", "num_tokens": "i32", "BLOCK_T": "constexpr"}
    return [{"name": "fp8_stage", "fn": fp8_stage_kernel, "signature": signature,
             "constexprs": {"BLOCK_T": BLOCK_TOKENS}, "num_warps": NUM_WARPS, "num_stages": 1},
            {"name": "fp8_upconvert", "fn": fp8_upconvert_kernel, "signature": upconverted,
             "constexprs": {"BLOCK_T": BLOCK_TOKENS}, "num_warps": NUM_WARPS, "num_stages": 1}]
