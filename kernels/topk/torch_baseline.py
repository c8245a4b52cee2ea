"""Vectorized PyTorch top-k + page-table translation: bench's torch baseline.

Contract: dsa_topk_page_transform_topk{K}_ps64[_bf16] (docs/design.md, Contracts).
scores [num_rows, max_len] fp32/bf16, lengths/row_to_batch [num_rows] int32,
block_table [batch, max_num_pages] int32 -> topk_indices [num_rows, K] int32:
physical ids of the top min(K, length) valid scores, -1 padded.

One torch.topk over all rows at once on float64 keys that encode the contract's
order: finite scores keep their value; -inf and NaN move below every float32
(NaN lowest of the valid), and positions at or beyond the row length become
-inf so that they rank below every valid score and are never kept. Bad values are
masked as the kernel masks them (launcher.py): pages outside [0, num_pages) and rows
whose batch is not a block-table row give -1.
"""

from __future__ import annotations

import torch

from ..bad_index import MAX_PAGES
from ..errors import KernelInputError
from ..fp8 import PAGE_SIZE

# Below every float32 (whose lowest finite value is about -3.4e38), ordered:
NEG_INF_KEY = -1e300  # a valid -inf score
NAN_KEY = -1e301  # a valid NaN ranks below -inf


def topk_page_transform(scores: torch.Tensor, lengths: torch.Tensor, block_table: torch.Tensor,
                        row_to_batch: torch.Tensor, topk_indices: torch.Tensor, *, num_pages: int = MAX_PAGES) -> None:
    num_rows, max_len = scores.shape
    topk = topk_indices.shape[1]
    if topk_indices.shape[0] != num_rows:
        raise KernelInputError(f"topk_indices has {topk_indices.shape[0]} rows, scores {num_rows}")
    if block_table.numel() == 0:  # no row has a page to translate through
        topk_indices.fill_(-1)
        return
    # Lengths clamp to the block table's pages, and a row whose batch is not a block-table row has none.
    batch, max_pages = block_table.shape
    b = row_to_batch.long()
    lengths = torch.where((b >= 0) & (b < batch), lengths.long().clamp(max=max_pages * PAGE_SIZE), 0)
    key = scores.double()
    key = torch.where(key == float("-inf"), NEG_INF_KEY, key)
    key = torch.where(torch.isnan(key), NAN_KEY, key)
    pos = torch.arange(max_len, device=scores.device)
    key.masked_fill_(pos[None, :] >= lengths[:, None], float("-inf"))
    k = min(topk, max_len)
    chosen = torch.topk(key, k, dim=1).indices  # [num_rows, k], best first
    # Positions at or past the length are never kept (rank >= length); clamp so the gather stays in bounds.
    page = block_table.long()[b.clamp(0, batch - 1)[:, None], (chosen // PAGE_SIZE).clamp_(max=max_pages - 1)]
    physical = torch.where((page >= 0) & (page < min(num_pages, MAX_PAGES)), page * PAGE_SIZE + chosen % PAGE_SIZE, -1)
    rank = torch.arange(k, device=scores.device)
    physical = torch.where(rank[None, :] < lengths[:, None], physical, -1)
    topk_indices[:, :k] = physical.to(torch.int32)
    topk_indices[:, k:] = -1
