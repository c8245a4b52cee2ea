"""Vectorized PyTorch indexer: the bench baseline a user could write in a few lines.

Gathers every request's pages through the block table, dequantizes, scores all rows with one
einsum, masks beyond each row's visible length, and takes torch.topk, then translates logical
positions to physical ids. Same destination-passing signature as the definitions; float32
math like the reference, but batched instead of per row.
"""

from __future__ import annotations

import torch

from ..fp8 import INDEX_HEAD_DIM, INDEX_PAGE_BYTES, INDEX_SCALE_OFFSET, PAGE_SIZE
from .score import query_shape


def dsa_topk_indexer_torch(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices) -> None:
    batch, next_n, heads = query_shape(q_index_fp8)
    topk = topk_indices.shape[-1]
    max_pages = block_table.shape[1]
    max_len = max_pages * PAGE_SIZE
    pages = k_index_cache_fp8.view(torch.uint8).view(-1, INDEX_PAGE_BYTES)[block_table.long().clamp_min(0)]
    keys = pages[..., :INDEX_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float()
    scales = pages[..., INDEX_SCALE_OFFSET:].contiguous().view(torch.float32)
    k = keys.view(batch, max_len, INDEX_HEAD_DIM) * scales.reshape(batch, max_len, 1)
    q = q_index_fp8.float().view(batch, next_n, heads, INDEX_HEAD_DIM)
    w = weights.view(batch, next_n, heads)
    logits = torch.einsum("bnhd,bsd->bnhs", q, k).relu_()
    scores = torch.einsum("bnhs,bnh->bns", logits, w)
    visible = seq_lens[:, None] - next_n + 1 + torch.arange(next_n, device=seq_lens.device)  # [B, N]
    pos = torch.arange(max_len, device=seq_lens.device)
    scores = scores.masked_fill(pos >= visible[..., None], float("-inf"))
    k_sel = min(topk, max_len)
    chosen = scores.topk(k_sel, dim=-1).indices  # [B, N, k]
    physical = torch.gather(block_table.long()[:, None, :].expand(batch, next_n, max_pages), 2,
                            chosen // PAGE_SIZE) * PAGE_SIZE + chosen % PAGE_SIZE
    out = topk_indices.view(batch, next_n, topk)
    out[..., :k_sel] = torch.where(chosen < visible[..., None], physical, -1)
    out[..., k_sel:] = -1
