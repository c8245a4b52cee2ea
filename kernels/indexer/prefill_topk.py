"""The prefill indexer's top-k: every query row's exact top-k keys of its own key range, as key ids.

Contract (T query rows, H index heads, D head dim, S keys, as mqa_logits.py):
  q        float8_e4m3fn [T, H, D] contiguous; k float8_e4m3fn [S, D] contiguous, k_scale float32 [S]
  weights  float32 [T, H], heads contiguous
  ks, ke   int32 [T]: row i sees keys ks[i] <= s < ke[i], clamped to [0, S]
  out      int32 [T, topk], topk <= 2048, unit column stride                     (written)

  out[i] = the keys s of row i's range with the topk largest logits (mqa_logits.py's logit), -1 padded where
  the range holds fewer, in no particular order; ties at the threshold fill the remaining slots. Every id is
  -1 or in [ks[i], ke[i]) of the clamped range, whatever the inputs' values.

How: rows in chunks, each chunk's logits relative to its rows' starts (mqa_logits' compressed form, at most
max_row_keys wide) in a workspace of at most logits_bytes, then the exact CUDA top-k over each row's length
(topk/launcher.py, through an identity page table: positions stay positions) and the start added back. The
chunk bounds the logits' memory: a 64K-token prompt's whole [T, S] matrix would be 16 GiB in fp32, a chunk
of it is logits_bytes. Nothing waits for the host, so a call captures in a CUDA graph for fixed shapes.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from ..errors import KernelInputError
from ..fp8 import PAGE_SIZE
from ..launch_math import cdiv
from ..topk.launcher import MAX_TOPK, topk_page_transform
from .mqa_logits import check_inputs, mqa_logits

# The logits one chunk of rows may hold: a 64K-key row is 256 KiB, so 4096 rows of it a chunk.
LOGITS_BYTES = 1 << 30
LOGITS_DTYPE = torch.float32  # the top-k's exactness is over these values
WHO = "prefill top-k"


def _fail(message: str) -> None:
    raise KernelInputError(f"{WHO}: {message}")


def check_out(out: torch.Tensor, num_rows: int, device: torch.device, who: str = WHO) -> int:
    """topk of out, which must be int32 [num_rows, topk] with unit column stride on the inputs' device, topk in
    [1, MAX_TOPK]."""
    if (out.dim() != 2 or out.shape[0] != num_rows or out.dtype != torch.int32 or out.stride(1) != 1
            or out.device != device):
        raise KernelInputError(f"{who}: out must be int32 [{num_rows}, topk] with unit column stride on {device}, "
                               f"got {out.dtype} {list(out.shape)} on {out.device}")
    topk = out.shape[1]
    if not 0 < topk <= MAX_TOPK:
        raise KernelInputError(f"{who}: topk must be in [1, {MAX_TOPK}], got {topk}")
    return topk


def row_width(num_keys: int, max_row_keys: int | None) -> int:
    """The logits' width: max_row_keys (every row's range must fit it, as DeepGEMM's max_seqlen_k), else S."""
    if max_row_keys is None:
        return num_keys
    if not 0 < max_row_keys:
        _fail(f"max_row_keys must be positive, got {max_row_keys}")
    return min(max_row_keys, num_keys)


def chunk_rows(num_rows: int, width: int, logits_bytes: int = LOGITS_BYTES) -> int:
    """Rows a chunk holds within logits_bytes (at least one)."""
    if logits_bytes <= 0:
        _fail(f"logits_bytes must be positive, got {logits_bytes}")
    return max(1, min(num_rows, logits_bytes // (max(width, 1) * LOGITS_DTYPE.itemsize)))


# A chunk's logits from another kernel: (q, k, k_scale, weights, start, end, width) of the chunk's rows -> float32
# [rows, width] with unit column stride, entry j of row i the logit of key start[i] + j for j < end[i] - start[i]
# (mqa_logits' compressed form; the rest unread). Lets bench time a peer's logits under this top-k.
RowLogits = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int],
                     torch.Tensor]


def prefill_topk(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
                 ke: torch.Tensor, out: torch.Tensor, *, max_row_keys: int | None = None,
                 logits_bytes: int = LOGITS_BYTES, logits: torch.Tensor | None = None,
                 row_logits: RowLogits | None = None) -> None:
    """Write out (module contract). max_row_keys bounds every row's range length (the caller knows it without
    a sync; rows past it see only its first max_row_keys keys); logits (float32 [rows, width], unit column
    stride) is a workspace to chunk through instead of one taken from the caching allocator; row_logits
    computes each chunk's logits instead of mqa_logits (which then takes no workspace: it returns its own)."""
    num_rows, _, _, num_keys = check_inputs(q, k, k_scale, weights, ks, ke)
    topk = check_out(out, num_rows, q.device)
    width = row_width(num_keys, max_row_keys)
    if num_rows == 0:
        return
    if num_keys == 0:
        out.fill_(-1)
        return
    rows = chunk_rows(num_rows, width, logits_bytes)
    if row_logits is not None:
        if logits is not None:
            _fail("a workspace (logits) and row_logits exclude each other: row_logits returns its own logits")
    else:
        if logits is None:
            logits = torch.empty(rows, width, dtype=LOGITS_DTYPE, device=q.device)
        elif (logits.dim() != 2 or logits.dtype != LOGITS_DTYPE or logits.shape[1] != width
              or logits.stride(1) != 1 or logits.device != q.device):
            _fail(f"logits must be float32 [rows, {width}] with unit column stride on {q.device}, got "
                  f"{logits.dtype} {list(logits.shape)}")
        rows = min(rows, logits.shape[0])
        if rows == 0:
            _fail("logits has no rows")
        row_logits = functools.partial(_logits_into, logits)
    # Clamped once: the logits are computed relative to these starts, so every position a row's length
    # covers is written, and start + position stays inside the keys; ends within the width (max_row_keys), so
    # no logits kernel writes past it.
    start = ks.clamp(0, num_keys)
    lengths = (torch.maximum(ke.clamp(max=num_keys), start) - start).clamp_(max=width)
    end = start + lengths
    pages = cdiv(width, PAGE_SIZE)
    identity = torch.arange(pages, dtype=torch.int32, device=q.device).view(1, pages)
    first_row = torch.zeros(rows, dtype=torch.int32, device=q.device)
    for r0 in range(0, num_rows, rows):
        r1 = min(r0 + rows, num_rows)
        chunk = row_logits(q[r0:r1], k, k_scale, weights[r0:r1], start[r0:r1], end[r0:r1], width)
        if (chunk.shape != (r1 - r0, width) or chunk.dtype != LOGITS_DTYPE or chunk.stride(1) != 1
                or chunk.device != q.device):
            _fail(f"row_logits must return float32 [{r1 - r0}, {width}] with unit column stride on {q.device}, "
                  f"got {chunk.dtype} {list(chunk.shape)}")
        ids = out[r0:r1]
        topk_page_transform(chunk, lengths[r0:r1], identity, first_row[: r1 - r0], ids, topk, num_pages=pages)
        ids.add_(torch.where(ids >= 0, start[r0:r1, None], 0))


def _logits_into(workspace: torch.Tensor, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor,
                 weights: torch.Tensor, start: torch.Tensor, end: torch.Tensor, width: int) -> torch.Tensor:
    """The default RowLogits: mqa_logits' compressed rows in the workspace's first rows."""
    chunk = workspace[: q.shape[0]]
    mqa_logits(q, k, k_scale, weights, start, end, chunk, clean=False, compressed=True)
    return chunk


def dsa_prefill_indexer(q_index_fp8: torch.Tensor, k_index_fp8: torch.Tensor, k_index_scale: torch.Tensor,
                        weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk_indices: torch.Tensor) -> None:
    """Solution entry for dsa_prefill_indexer_fp8_h{H}_d{D}_topk{K}: the definition's signature (inputs, then the
    preallocated output)."""
    prefill_topk(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk_indices)
