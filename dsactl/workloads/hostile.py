"""Inputs of the hostile suite: a valid generated call, then values outside the contract.

A hostile workload names its corruption in params["hostile"]; every one is something a
kernel must survive without touching memory outside its inputs, answering on the valid
part of each row (the references define the rest: docs/design.md, Contracts, and the
definitions' docstrings):

- "bad_pages" (indexer, top-k): block-table entries of the rows' own pages outside the cache
  (past it, negative, INT32_MIN, far past int32 ids): those tokens give -1;
- "bad_batch" (top-k): row_to_batch values outside the block table: the row gives -1;
- "seq_lens" (indexer) / "lengths" (top-k): lengths replaced by params["values"], negative or past
  the block table's pages: a row sees at most its pages;
- "bad_ids" (attention): ids past the cache, negative other than -1, INT32_MIN: counted as -1;
- "topk_length" (attention): topk_length replaced by params["values"] (negative, past topk): clamped;
- "nan" (all): NaN and inf in q, the caches or the scores: elements whose reference is not finite
  are not judged, every other element is;
- "empty" (all): a batch of no rows (the axes in the workload are zero).
"""

from __future__ import annotations

from typing import Any

import torch

from dsactl.definitions import Definition
from dsactl.definitions.attention import CONTEST_SM_SCALE
from dsactl.fp8 import MLA_CKV_DIM, PAGE_SIZE
from dsactl.workloads.workload import Workload

KINDS = ("bad_pages", "bad_batch", "seq_lens", "lengths", "bad_ids", "topk_length", "nan", "empty")
INT32_MIN = -(2**31)
FAR = 50_000_000  # a page or token id far past any cache the suite makes
E4M3_NAN = 0x7F  # the e4m3fn byte of NaN (e4m3fn has no inf)


def empty_inputs(d: Definition, w: Workload, device, seed: int) -> dict[str, Any]:
    """Inputs of the definition's shapes at the workload's axes (a batch axis of 0), random where not empty."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    axes = {**d.const_axes, **w.axes}
    out: dict[str, Any] = {}
    for spec in d.inputs:
        if spec.is_scalar:
            out[spec.name] = CONTEST_SM_SCALE
            continue
        shape = [a if isinstance(a, int) else axes[a] for a in spec.shape]
        if spec.torch_dtype == torch.int8:
            out[spec.name] = torch.randint(-128, 128, shape, generator=g, device=device, dtype=torch.int8)
        elif spec.torch_dtype == torch.int32:
            out[spec.name] = torch.zeros(shape, dtype=torch.int32, device=device)
        else:
            out[spec.name] = torch.randn(shape, generator=g, device=device).to(spec.torch_dtype)
    return out


def _row_pages(lengths: list[int]) -> list[tuple[int, int]]:
    """(row, page) of every page a row of these lengths owns, page 0 of each row left valid."""
    return [(b, p) for b, n in enumerate(lengths) for p in range(1, (n + PAGE_SIZE - 1) // PAGE_SIZE)]


def _plant(table: torch.Tensor, spots: list[tuple[int, int]], values: list[int]) -> None:
    """Spread the values over each row's spots (as many as it has), so every row with a spot meets some."""
    for b in dict.fromkeys(b for b, _ in spots):
        mine = [p for row, p in spots if row == b]
        step = max(1, len(mine) // len(values))
        for p, value in zip(mine[::step], values):
            table[b, p] = value


def _bad_pages(table: torch.Tensor, lengths: list[int], num_pages: int) -> None:
    _plant(table, _row_pages(lengths), [FAR, -7, num_pages, INT32_MIN, -1, 2**25])


def _nan_indexer(inputs: dict[str, Any], seq_lens: list[int]) -> None:
    q = inputs["q_index_fp8"].view(torch.uint8)
    q.view(q.shape[0], -1)[0, :128] = E4M3_NAN  # request 0: one head's query all NaN
    page = int(inputs["block_table"][len(seq_lens) - 1, 0])  # the last request's first page
    flat = inputs["k_index_cache_fp8"][page].view(-1)  # the page's bytes (its rows are not its tokens)
    flat[128:256] = E4M3_NAN  # token 1's key NaN
    scales = flat[PAGE_SIZE * 128:].view(torch.float32)
    scales[2] = float("inf")  # token 2's scale inf
    scales[3] = float("nan")


def _nan_attention(inputs: dict[str, Any]) -> None:
    ids = inputs["sparse_indices"]
    inputs["q_nope"][0, 0, 5] = float("nan")  # token 0, head 0: its other heads keep an answer
    if inputs["q_pe"].shape[0] > 1:
        inputs["q_pe"][1, 1, 3] = float("inf")  # token 1, head 1
    # Two cache tokens only the last row attends to, so the other rows keep an answer.
    own = ids[-1][(ids[-1] >= 0) & ~torch.isin(ids[-1], ids[:-1])]
    if own.numel() < 2:
        return
    first, second = own[:2].tolist()
    if "kv_cache" in inputs:
        flat = inputs["kv_cache"].view(-1, inputs["kv_cache"].shape[-1])
        flat[first, 7] = E4M3_NAN  # an e4m3 NaN value
        flat[second, MLA_CKV_DIM:MLA_CKV_DIM + 4].view(torch.float32)[0] = float("inf")  # an inf scale
    else:
        inputs["ckv_cache"].view(-1, MLA_CKV_DIM)[first, 9] = float("nan")
        inputs["kpe_cache"].view(-1, inputs["kpe_cache"].shape[-1])[second, 1] = float("-inf")


def _bad_ids(ids: torch.Tensor, cache_tokens: int) -> None:
    bad = torch.tensor([FAR, cache_tokens, -7, INT32_MIN, -2, 2**31 - 1], dtype=torch.int32, device=ids.device)
    for t in range(ids.shape[0]):
        slots = torch.arange(len(bad), device=ids.device) * max(1, ids.shape[1] // len(bad)) + t
        ids[t, slots % ids.shape[1]] = bad


def corrupt(d: Definition, w: Workload, inputs: dict[str, Any]) -> dict[str, Any]:
    """Apply w.params["hostile"] to valid generated inputs, in place; return them."""
    kind = w.params["hostile"]
    stage = next(t for t in d.tags if t.startswith("stage:")).removeprefix("stage:")
    device = next(v.device for v in inputs.values() if isinstance(v, torch.Tensor))
    if stage == "indexer":
        seq_lens = list(w.params["seq_lens"])
        if kind == "bad_pages":
            _bad_pages(inputs["block_table"], seq_lens, inputs["k_index_cache_fp8"].shape[0])
        elif kind == "seq_lens":
            inputs["seq_lens"] = torch.tensor(w.params["values"], dtype=torch.int32, device=device)
        elif kind == "nan":
            _nan_indexer(inputs, seq_lens)
    elif stage == "topk":
        if kind == "bad_pages":
            _bad_pages(inputs["block_table"], list(w.params["lengths"]), 2**25)
        elif kind == "bad_batch":
            batch, every_other = inputs["block_table"].shape[0], inputs["row_to_batch"][::2]
            bad = torch.tensor([batch, -1, INT32_MIN, batch + 5], dtype=torch.int32, device=device)
            every_other.copy_(bad.repeat(every_other.numel())[: every_other.numel()])
        elif kind == "lengths":
            inputs["lengths"] = torch.tensor(w.params["values"], dtype=torch.int32, device=device)
        elif kind == "nan":
            scores = inputs["scores"]
            scores[:, 1::3] = float("nan")
            scores[:, 2::5] = float("inf")
            scores[:, 3::7] = float("-inf")
    elif stage == "attention":
        if kind == "bad_ids":
            cache = inputs.get("kv_cache", inputs.get("ckv_cache"))
            _bad_ids(inputs["sparse_indices"], cache.shape[0] * cache.shape[1])
        elif kind == "topk_length":
            inputs["topk_length"] = torch.tensor(w.params["values"], dtype=torch.int32, device=device)
        elif kind == "nan":
            _nan_attention(inputs)
    return inputs
