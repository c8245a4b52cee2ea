"""Vectorized PyTorch sparse MLA attention: the bench baseline (no per-row loop).

Same contract and keyword API as the Triton launcher (triton_sparse_mla.sparse_mla_attention):
gather every selected token at once, two einsums for the logits, a masked softmax, one
einsum for the output; float32 math, outputs written in place.
"""

from __future__ import annotations

import math

import torch

from ..fp8 import MLA_CKV_DIM, MLA_KPE_DIM, MLA_TOKEN_BYTES, dequantize_mla_kv
from .entries import Variant, entries


def sparse_mla_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, sparse_indices: torch.Tensor, sm_scale: float,
    output: torch.Tensor, lse: torch.Tensor, *, ckv_cache: torch.Tensor | None = None,
    kpe_cache: torch.Tensor | None = None, kv_cache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
    lse_base_e: bool = False,
) -> None:
    topk = sparse_indices.shape[1]
    cache = kv_cache if kv_cache is not None else ckv_cache
    valid = (sparse_indices >= 0) & (sparse_indices < cache.shape[0] * cache.shape[1])  # outside the cache: as -1
    if topk_length is not None:
        valid &= torch.arange(topk, device=valid.device)[None, :] < topk_length[:, None]
    ids = torch.where(valid, sparse_indices, 0).long()  # [T, topk]
    if kv_cache is not None:
        ckv, kpe = dequantize_mla_kv(kv_cache.reshape(-1, MLA_TOKEN_BYTES)[ids])
    else:
        ckv = ckv_cache.reshape(-1, MLA_CKV_DIM)[ids].float()  # [T, topk, 512]
        kpe = kpe_cache.reshape(-1, MLA_KPE_DIM)[ids].float()
    logits = (torch.einsum("thd,tkd->thk", q_nope.float(), ckv)
              + torch.einsum("thd,tkd->thk", q_pe.float(), kpe)) * float(sm_scale)
    logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
    lse_e = torch.logsumexp(logits, dim=-1)  # [T, H]; -inf for a row with no valid index
    # An empty row would give exp(-inf - (-inf)) = NaN: subtract 0 there instead, so p = 0.
    p = torch.exp(logits - torch.where(torch.isinf(lse_e), 0.0, lse_e)[..., None])
    out = torch.einsum("thk,tkd->thd", p, ckv)
    if attn_sink is not None:
        out = out / (1.0 + torch.exp(attn_sink.float()[None, :] - lse_e))[..., None]
    output.copy_(out)
    lse.copy_(lse_e if lse_base_e else lse_e * math.log2(math.e))


# Entries with the definitions' signatures, bf16 and FP8 KV (the bench baseline needs no other variant).
globals().update(entries(sparse_mla_attention, "torch_sparse_attention", (Variant(), Variant(fp8kv=True))))
