"""A pure-PyTorch model of hopper_mla.cu's FP8-path numerics, for CPU tests: what the kernel rounds, and where.

Per split (split s of S takes the row positions s, s + S, ..., as the kernel): q and the dequantized tokens in
the mma dtype (fp16: bf16 fails the contest tolerance, hopper_mla.cu says why), fp32 logits in the log2
domain, P rounded to the mma dtype for P.V and the sum taken from unrounded P. Rows of q and tokens past
fp16's range are shifted into it by powers of two and scaled back in fp32 (exact). One split is finished as
the kernel finishes it; several are stored as the kernel stores them (scale_partial: fp16, a power-of-two
factor per half row, in triton_sparse_mla.scaled_split_partials' layout) and merged by the shipped
triton_sparse_mla.combine, as the launcher merges them. Only the order of the fp32 sums and exp2's
approximation differ from the kernel.
"""

from __future__ import annotations

import math

import torch

from ..fp8 import MLA_CKV_DIM, MLA_KPE_OFFSET, MLA_SCALE_OFFSET, MLA_TOKEN_BYTES, dequantize_mla_kv
from . import triton_sparse_mla as tsm

E4M3_MAX = 448  # the largest FP8 value: a token's bound is its largest scale times this
FP16_MAX = 65504


def _exponent(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(torch.log2(x.clamp_min(2.0**-126)))


def split_partials(inputs: dict, splits: int = 1, mma_dtype: torch.dtype = torch.float16,
                   shifts: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(acc [T, S, H, 512] unnormalized, m [T, S, H] the log2-domain max, l [T, S, H] the sum) of each split
    of an FP8-KV call. With `shifts`, as the kernel keeps fp16's range: a row of q whose largest value has
    exponent E >= 16 is scaled by 2^-(E - 15), a token whose bound (448 times its largest scale, or its
    largest rope value) reaches 65504 by 2^-min(E - 14, 15), and the logits (and that token's P) scaled back."""
    q = torch.cat([inputs["q_nope"], inputs["q_pe"]], -1).float()
    tokens = inputs["kv_cache"].reshape(-1, MLA_TOKEN_BYTES)
    ckv, kpe = dequantize_mla_kv(tokens)
    k = torch.cat([ckv, kpe], -1)
    scales = tokens.view(torch.uint8)[:, MLA_SCALE_OFFSET:MLA_KPE_OFFSET].contiguous().view(torch.float32)
    q_max = q.abs().amax(-1, keepdim=True)
    k_max = torch.maximum(scales.abs().amax(-1, keepdim=True) * E4M3_MAX, kpe.abs().amax(-1, keepdim=True))
    q_shift = torch.where(q_max >= 2.0**16, _exponent(q_max) - 15, 0.0) * shifts
    k_shift = torch.where(k_max >= FP16_MAX, (_exponent(k_max) - 14).clamp(max=15), 0.0) * shifts
    q = (q * torch.exp2(-q_shift)).to(mma_dtype).float() * torch.exp2(q_shift)
    k = (k * torch.exp2(-k_shift)).to(mma_dtype).float()
    idx = inputs["sparse_indices"]
    rows = k[idx.clamp_min(0).long()]
    factor = torch.exp2(k_shift[..., 0])[idx.clamp_min(0).long()][:, None, :]  # [T, 1, topk]
    logits = torch.einsum("thd,tnd->thn", q, rows) * factor * inputs["sm_scale"] * math.log2(math.e)
    logits = logits.masked_fill((idx < 0)[:, None, :], -math.inf)
    parts = []
    for s in range(splits):
        mine = logits[..., s::splits]
        m = mine.amax(-1)
        p = torch.exp2(mine - torch.where(m == -math.inf, 0.0, m)[..., None])
        acc = torch.einsum("thn,tnd->thd", (p * factor[..., s::splits]).to(mma_dtype).float(),
                           rows[:, s::splits, :MLA_CKV_DIM])
        parts.append((acc, m, p.sum(-1)))
    return tuple(torch.stack(x, 1) for x in zip(*parts))


def scale_partial(acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A partial [..., 512] as the kernel stores it: (fp16 values, fp32 factors [..., 2]), each half row
    (tsm.SCALE_COLUMNS values) divided by the power of two that puts its largest magnitude in [2^14, 2^15)."""
    halves = acc.unflatten(-1, (-1, tsm.SCALE_COLUMNS))
    amax = halves.abs().amax(-1)
    k = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 14, 0.0).clamp(-126, 126)
    return (halves * torch.exp2(-k)[..., None]).half().flatten(-2), torch.exp2(k)


def finish(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, lse_base_e: bool) -> dict:
    """One split's (acc, m, l) [T, 1, H, ...] to the outputs, as the kernel writes them (empty rows: 0, -inf)."""
    acc, m, l = acc[:, 0], m[:, 0], l[:, 0]
    out = torch.where(l[..., None] > 0, acc / l.clamp_min(1e-30)[..., None], 0.0)
    lse = torch.where(l > 0, m + torch.log2(l.clamp_min(1e-30)), -math.inf)
    return {"output": out.bfloat16(), "lse": lse / (math.log2(math.e) if lse_base_e else 1.0)}


def combine(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor, lse_base_e: bool, scaled: bool = True) -> dict:
    """Several splits' (acc, m, l) merged by triton_sparse_mla.combine: acc stored as the kernel stores it
    (scale_partial), or, with scaled=False, as the fp32 partials the other kernels write."""
    num_tokens, splits, heads = m.shape
    if scaled:
        partials = tsm.scaled_split_partials(acc.device, num_tokens, splits, heads)
        values, factors = scale_partial(acc)
        partials[0].copy_(values.reshape(-1))
        partials[3].copy_(factors.reshape(-1))
    else:
        partials = tsm.split_partials(acc.device, num_tokens, splits, heads)
        partials[0].copy_(acc.reshape(-1))
    partials[1].copy_(m.reshape(-1))
    partials[2].copy_(l.reshape(-1))
    output = torch.full((num_tokens, heads, MLA_CKV_DIM), math.nan, dtype=torch.bfloat16, device=acc.device)
    lse = torch.full((num_tokens, heads), math.nan, device=acc.device)
    tsm.combine(partials, None, output, lse, 1.0 / math.log2(math.e) if lse_base_e else 1.0, heads, splits,
                num_tokens)
    return {"output": output, "lse": lse}


def attention(inputs: dict, lse_base_e: bool, splits: int = 1, mma_dtype: torch.dtype = torch.float16,
              shifts: bool = True) -> dict:
    """The outputs of an FP8-KV call as the kernel computes them with `splits` splits."""
    parts = split_partials(inputs, splits, mma_dtype, shifts)
    return finish(*parts, lse_base_e) if splits == 1 else combine(*parts, lse_base_e)
