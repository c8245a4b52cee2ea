"""Work of one call: bytes it must move and FLOPs it must do, per definition stage.

Counted from the call's actual inputs (valid tokens, row lengths), so datasets
and embedded suites are measured alike. Bytes are the compulsory traffic: every
input byte the operator has to read once plus every output byte it writes;
FLOPs are the multiply-adds of the operator's math (2 per multiply-add). `size`
is the workload's natural size (tokens scored, tokens attended, scores ranked),
the x axis of latency plots.

Active SMs: a solution's entry function may carry a `grid_ctas` attribute, a
callable taking the same arguments as the solution that returns the number of
CTAs of its largest launch; bench then reports min(CTAs, SMs).
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
MLA_BF16_TOKEN_BYTES = MLA_QK_DIM * BF16_BYTES


@dataclass(frozen=True)
class Work:
    bytes: int
    flops: int  # 0 where the operator has no arithmetic worth a rate (top-k)
    size: int
    size_name: str


SIZE_NAMES = {"indexer": "visible tokens", "attention": "attended tokens", "topk": "scores ranked"}


def stage(d: Definition) -> str:
    return next(t for t in d.tags if t.startswith("stage:"))[len("stage:"):]


def indexer_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """Keys of every cached token of each request read once (132 B each), q and
    weights, the pages of the block table in use, the top-k output; FLOPs of
    q.k over every visible token and head, plus the weighted head sum."""
    heads, next_n, topk = d.params["heads"], d.params["next_n"], d.params["topk"]
    seq_lens = inputs["seq_lens"].long()
    batch = seq_lens.numel()
    j = torch.arange(next_n, device=seq_lens.device)
    visible = int((seq_lens[:, None] - next_n + j[None, :] + 1).clamp(min=0).sum())
    tokens = int(seq_lens.sum())
    pages = int(((seq_lens + PAGE_SIZE - 1) // PAGE_SIZE).sum())
    nbytes = (tokens * INDEX_TOKEN_BYTES
              + inputs["q_index_fp8"].numel() + inputs["weights"].numel() * FP32_BYTES
              + batch * INT32_BYTES + pages * INT32_BYTES
              + batch * next_n * topk * INT32_BYTES)
    flops = 2 * heads * (INDEX_HEAD_DIM + 1) * visible
    return Work(nbytes, flops, visible, SIZE_NAMES["indexer"])


def attention_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """Gathered KV of every valid index (duplicates gathered twice), q, output
    and lse, the index rows; FLOPs 2 x heads x valid x (576 + 512)."""
    heads, topk = d.params["heads"], d.params["topk"]
    idx = inputs["sparse_indices"]
    num_tokens = idx.shape[0]
    valid_mask = idx != -1
    if d.params["has_topk_length"]:
        pos = torch.arange(topk, device=idx.device)
        valid_mask &= pos[None, :] < inputs["topk_length"].long()[:, None]
    valid = int(valid_mask.sum())
    token_bytes = MLA_TOKEN_BYTES if d.params["fp8kv"] else MLA_BF16_TOKEN_BYTES
    nbytes = (valid * token_bytes
              + num_tokens * heads * MLA_QK_DIM * BF16_BYTES
              + num_tokens * heads * (MLA_CKV_DIM * BF16_BYTES + FP32_BYTES)
              + idx.numel() * INT32_BYTES)
    flops = 2 * heads * valid * (MLA_QK_DIM + MLA_CKV_DIM)
    return Work(nbytes, flops, valid, SIZE_NAMES["attention"])


def topk_work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    """The valid scores read once, lengths and the top-k output."""
    scores, lengths = inputs["scores"], inputs["lengths"]
    ranked = int(lengths.long().sum())
    nbytes = (ranked * scores.element_size() + lengths.numel() * INT32_BYTES
              + lengths.numel() * d.params["topk"] * INT32_BYTES)
    return Work(nbytes, 0, ranked, SIZE_NAMES["topk"])


WORK: dict[str, Callable[[Definition, Mapping[str, Any]], Work]] = {
    "indexer": indexer_work,
    "attention": attention_work,
    "topk": topk_work,
}


def work(d: Definition, inputs: Mapping[str, Any]) -> Work:
    return WORK[stage(d)](d, inputs)


def active_sms(fn: Callable, args: list[Any], sm_count: int) -> int | None:
    """min(CTAs, SMs) where the solution reports its grid (see module doc), else None."""
    grid = getattr(fn, "grid_ctas", None)
    if not callable(grid):
        return None
    return min(int(grid(*args)), sm_count)
