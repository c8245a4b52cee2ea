"""dsa_topk_indexer: the complete lightning indexer (score + top-k + page translation).

Entry point for every indexer definition (heads 32/64, topk 512/1024/2048, next_n 1-4),
destination-passing style: dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens,
block_table, topk_indices) writes topk_indices [B, topk] or [B, next_n, topk] (physical ids, -1
padded, any order) and returns nothing.

Two launches at most, no host sync:
- every row fits in topk (max_num_pages * 64 <= topk, known from shapes on the host): the
  structural mapping alone (passthrough.py), no key is read;
- dsa_topk_indexer_fused only, block tables of up to 128 pages on a GPU that runs it: the fused
  kernel (fused.py), which scores and selects each row in one launch. It is exact and deterministic
  but no faster than the two kernels (docs/design.md, "Measured choices"), so the default entry
  does not take it;
- otherwise the scoring kernel (score.py) writes fp32 scores and each row's visible length
  into scratch allocated per call, skipping requests whose rows all fit in topk, and the exact CUDA
  top-k (kernels/topk, CUDA library `topk`) selects and translates per
  row; a row that fits keeps all its tokens, so its unwritten scores never decide anything.
A block-table page outside the cache is never read and gives -1 on both paths (its keys score -inf,
so the top-k picks its tokens only when a row has fewer valid ones than topk, and masks them).
"""

from __future__ import annotations

import torch

from ..errors import KernelInputError
from ..fp8 import PAGE_SIZE
from ..launch_math import next_power_of_2
from ..topk.launcher import topk_page_transform
from . import fused
from .passthrough import passthrough
from .score import query_shape, score


# arange(rows) // next_n per next_n, grown on demand to powers of two. A tensor handed out is never
# freed: a CUDA graph captured with it keeps reading it after a later call grows the cache.
_ROW_TO_BATCH: dict[tuple[torch.device, int], list[torch.Tensor]] = {}


def _row_to_batch(device: torch.device, rows: int, next_n: int) -> torch.Tensor:
    handed_out = _ROW_TO_BATCH.setdefault((device, next_n), [])
    if not handed_out or handed_out[-1].numel() < rows:
        size = max(next_power_of_2(rows), 1)  # a power of two >= rows: few tensors kept
        handed_out.append((torch.arange(size, device=device, dtype=torch.int32) // next_n).contiguous())
    return handed_out[-1][:rows]


def dsa_topk_indexer(q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor,
                     seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices: torch.Tensor) -> None:
    _indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices, fuse=False)


def dsa_topk_indexer_fused(q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor,
                           seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices: torch.Tensor) -> None:
    """As dsa_topk_indexer, taking the fused kernel for every call it serves (fused.serves)."""
    _indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices, fuse=True)


def _indexer(q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor,
             seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices: torch.Tensor, fuse: bool) -> None:
    batch, next_n, _ = query_shape(q_index_fp8)
    topk = topk_indices.shape[-1]
    if topk_indices.dtype != torch.int32 or topk_indices.numel() != batch * next_n * topk \
            or not topk_indices.is_contiguous():
        raise KernelInputError(f"topk_indices must be contiguous int32 [{batch}, {next_n}, topk], "
                          f"got {topk_indices.dtype} {list(topk_indices.shape)}")
    out = topk_indices.view(batch * next_n, topk)
    max_len = block_table.shape[1] * PAGE_SIZE
    if max_len <= topk:
        passthrough(seq_lens, block_table, out, next_n, k_index_cache_fp8.shape[0])
        return
    if fuse and fused.serves(q_index_fp8, block_table, topk):
        fused.indexer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, out)
        return
    # Scratch per call from the caching allocator: stream-ordered, and a CUDA graph owns what it captured.
    rows, device = batch * next_n, q_index_fp8.device
    scores = torch.empty(rows, max_len, dtype=torch.float32, device=device)
    lengths = torch.empty(rows, dtype=torch.int32, device=device)
    row_to_batch = _row_to_batch(device, rows, next_n)
    score(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, scores, lengths, skip_len=topk)
    topk_page_transform(scores, lengths, block_table, row_to_batch, out, topk, num_pages=k_index_cache_fp8.shape[0])
