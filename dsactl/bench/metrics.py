"""The work one call must do: bytes it must touch and FLOPs it must compute.

One function per definition family, counted from the call's actual inputs (valid
ids, row lengths), so datasets and embedded suites are measured alike:

  needed_bytes  every input byte the operator needs, read once, plus every output
                byte it writes. What an implementation may skip by the operator's
                structure is not needed: a top-k row of at most topk candidates keeps
                all of them whatever their scores, so neither its scores nor (in the
                indexer) the keys behind them are needed. Scratch an implementation
                writes and reads back (the indexer's score rows) is not counted.
  needed_flops  2 per multiply-add of the operator's math over the needed data;
                None where the call does no arithmetic worth a rate (top-k, an
                indexer batch whose rows all fit in top-k, an attention call
                with no valid index).
  size          the workload's natural size (tokens visible, tokens attended, scores
                in the rows), the x axis of latency plots; it does not shrink
                where work is skipped.

Achieved rates divide these by the measured latency (runner), so a GB/s figure
says how close a call came to moving its compulsory bytes at the copy bandwidth.

Active SMs: a solution's entry function may carry a `grid_ctas` attribute, a
callable taking the same arguments as the solution that returns the number of
CTAs of its largest launch; bench then reports min(CTAs, SMs).

Allocated memory: what one call takes from torch's CUDA caching allocator at its
peak beyond what it was given (workspaces, chunks of logits, a peer's own output
tensors), measured on a call of its own, outside the timed ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from dsactl.definitions import Definition
from dsactl.fp8 import INDEX_HEAD_DIM, INDEX_PAGE_BYTES, MLA_CKV_DIM, MLA_KPE_DIM, MLA_TOKEN_BYTES, PAGE_SIZE

INDEX_TOKEN_BYTES = INDEX_PAGE_BYTES // PAGE_SIZE  # 132: 128 e4m3 key bytes + one fp32 scale per token
INT32_BYTES = 4
FP32_BYTES = 4
BF16_BYTES = 2
MLA_QK_DIM = MLA_CKV_DIM + MLA_KPE_DIM  # 576: logits over [ckv; kpe]
MLA_BF16_TOKEN_BYTES = MLA_QK_DIM * BF16_BYTES  # 1152: ckv and kpe in bf16


@dataclass(frozen=True)
class Work:
    needed_bytes: int
    needed_flops: int | None  # None: no arithmetic to rate (see module doc)
    size: int
    size_name: str


SIZE_NAMES = {"indexer": "visible tokens", "attention": "attended tokens", "topk": "scores in the rows",
              "prefill_indexer": "keys the rows see"}


def stage(d: Definition) -> str:
    return next(t for t in d.tags if t.startswith("stage:"))[len("stage:"):]


def _pages(lengths: torch.Tensor) -> torch.Tensor:
    return (lengths + PAGE_SIZE - 1) // PAGE_SIZE


def _flops_or_none(flops: int) -> int | None:
    return flops or None


def indexer_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """Row j of N of request b sees visible = seq_len[b] - N + j + 1 tokens; a row scores
    only when visible > topk (otherwise its top-k is every visible token). A request
    with any such row (seq_len > topk) needs all seq_len keys, each read once for
    all its rows.

      bytes = sum over requests with seq_len > topk of seq_len x 132 (128 B key + 4 B scale)
            + scored rows x heads x (128 B q + 4 B weight)
            + B x 4 (seq_lens) + sum over requests of ceil(seq_len / 64) x 4 (block table in use)
            + B x N x topk x 4 (ids written)
      flops = 2 x heads x (128 + 1) x sum of visible over scored rows  (q.k, then the weighted head sum)

    When every row fits (the structural passthrough), flops is None and the bytes
    are the lengths, the block table and the ids written."""
    heads, next_n, topk = d.params["heads"], d.params["next_n"], d.params["topk"]
    seq_lens = inputs["seq_lens"].long()
    batch = seq_lens.numel()
    j = torch.arange(next_n, device=seq_lens.device)
    visible = (seq_lens[:, None] - next_n + j[None, :] + 1).clamp(min=0)  # [B, N]
    scored = visible > topk
    keys = int(seq_lens[seq_lens > topk].sum())
    nbytes = (keys * INDEX_TOKEN_BYTES
              + int(scored.sum()) * heads * (INDEX_HEAD_DIM + FP32_BYTES)
              + batch * INT32_BYTES + int(_pages(seq_lens).sum()) * INT32_BYTES
              + batch * next_n * topk * INT32_BYTES)
    flops = 2 * heads * (INDEX_HEAD_DIM + 1) * int(visible[scored].sum())
    return Work(nbytes, _flops_or_none(flops), int(visible.sum()), SIZE_NAMES["indexer"])


def attention_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """valid = ids != -1 (and, with topk_length, before it), duplicates counted each time
    they are gathered; T query tokens, H heads.

      bytes = valid x token bytes (656 for the FP8 cache, (512 + 64) x 2 for bf16)
            + T x H x 576 x 2 (q_nope, q_pe) + T x H x (512 x 2 + 4) (output, lse)
            + T x topk x 4 (the id rows) [+ T x 4 topk_length] [+ H x 4 attn_sink]
      flops = 2 x H x valid x (576 + 512)  (q.k over [ckv; kpe], then P.v over ckv)"""
    heads, topk = d.params["heads"], d.params["topk"]
    idx = inputs["sparse_indices"]
    num_tokens = idx.shape[0]
    valid_mask = idx != -1
    extra = 0
    if d.params["has_topk_length"]:
        pos = torch.arange(topk, device=idx.device)
        valid_mask &= pos[None, :] < inputs["topk_length"].long()[:, None]
        extra += num_tokens * INT32_BYTES
    if d.params["has_sink"]:
        extra += heads * FP32_BYTES
    valid = int(valid_mask.sum())
    token_bytes = MLA_TOKEN_BYTES if d.params["fp8kv"] else MLA_BF16_TOKEN_BYTES
    nbytes = (valid * token_bytes
              + num_tokens * heads * MLA_QK_DIM * BF16_BYTES
              + num_tokens * heads * (MLA_CKV_DIM * BF16_BYTES + FP32_BYTES)
              + idx.numel() * INT32_BYTES + extra)
    flops = 2 * heads * valid * (MLA_QK_DIM + MLA_CKV_DIM)
    return Work(nbytes, _flops_or_none(flops), valid, SIZE_NAMES["attention"])


def topk_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """Rows of length > topk are ranked; shorter rows keep every position unread.

      bytes = sum over rows with length > topk of length x score bytes (4 fp32, 2 bf16)
            + rows x 8 (lengths, row_to_batch)
            + sum over requests of max over its rows of ceil(length / 64) x 4 (block table in use)
            + rows x topk x 4 (ids written)
      flops = None (comparisons, no arithmetic to rate)"""
    scores, lengths, row_to_batch = inputs["scores"], inputs["lengths"].long(), inputs["row_to_batch"].long()
    topk, rows = d.params["topk"], lengths.numel()
    ranked = int(lengths[lengths > topk].sum())
    pages = torch.zeros(inputs["block_table"].shape[0], dtype=torch.long, device=lengths.device)
    pages.scatter_reduce_(0, row_to_batch, _pages(lengths), "amax")
    nbytes = (ranked * scores.element_size() + rows * 2 * INT32_BYTES
              + int(pages.sum()) * INT32_BYTES + rows * topk * INT32_BYTES)
    return Work(nbytes, None, int(lengths.sum()), SIZE_NAMES["topk"])


def prefill_indexer_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """Row t sees seen[t] = its range's keys (ks, ke clamped to the S keys); T rows, H heads of dim D.

      bytes = S x (D + 4) (keys and their scales, each read once) + T x H x (D + 4) (q, weights)
            + T x 8 (ks, ke) + T x topk x 4 (ids written)
      flops = 2 x H x (D + 1) x sum of seen  (q.k, then the weighted head sum)"""
    heads, dim, topk = d.params["heads"], d.params["dim"], d.params["topk"]
    num_keys, num_tokens = inputs["k_index_fp8"].shape[0], inputs["ks"].numel()
    start = inputs["ks"].long().clamp(0, num_keys)
    seen = int((inputs["ke"].long().clamp(max=num_keys) - start).clamp(min=0).sum())
    nbytes = (num_keys * (dim + FP32_BYTES) + num_tokens * heads * (dim + FP32_BYTES)
              + num_tokens * 2 * INT32_BYTES + num_tokens * topk * INT32_BYTES)
    return Work(nbytes, _flops_or_none(2 * heads * (dim + 1) * seen), seen, SIZE_NAMES["prefill_indexer"])


WORK: dict[str, Callable[[Definition, Mapping[str, Any]], Work]] = {
    "indexer": indexer_work,
    "attention": attention_work,
    "topk": topk_work,
    "prefill_indexer": prefill_indexer_work,
}


def work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    return WORK[stage(d)](d, inputs)


def allocated_mib(fn: Callable[[], Any], device: str) -> float:
    """MiB one call of fn allocated at its peak on the CUDA device beyond what was allocated before it (module
    doc)."""
    import torch

    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def active_sms(fn: Callable, args: list[Any], sm_count: int) -> int | None:
    """min(CTAs, SMs) where the solution reports its grid (see module doc), else None."""
    grid = getattr(fn, "grid_ctas", None)
    if not callable(grid):
        return None
    return min(int(grid(*args)), sm_count)
