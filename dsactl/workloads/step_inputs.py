"""Inputs of one DecodeStep call (kernels/step.py): both stages' tensors over one shared page table.

A page id names the same 64 tokens in the indexer's FP8 K cache and in the MLA KV cache, so the ids the
indexer selects are rows of the attention's cache. Values are seeded and non-zero; the pages are shuffled
and a few pages no request names hold values too. The FP8 MLA cache has power-of-two (ue8m0) scales, as
DeepSeek V3.2 writes its cache. Caches are drawn in chunks of pages, so a serving-sized
step (128 requests x 128K tokens: 262K pages, 11 GB of FP8 KV) never holds its float32 values at once.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dsactl.fp8 import PAGE_SIZE, quantize_index_k, quantize_mla_kv

SM_SCALE = 1.0 / math.sqrt(576)  # 1 / sqrt(d_qk), as the model's
KV_SCALES = "ue8m0"  # the FP8 MLA cache's scales (fp8.MLA_SCALE_FORMATS), as the model's
SPARE_PAGES = 3  # pages no request names
CHUNK_PAGES = 4096  # pages drawn at once: 4096 x 64 x 576 float32 values are 604 MB
INDEX_NAMES = ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")
MLA_NAMES = ("q_nope", "q_pe", "sm_scale")
CACHE_NAMES = ("kv_cache", "ckv_cache", "kpe_cache")


def _randn(shape, g: torch.Generator, std: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=g.device) * std


def _chunks(num_pages: int):
    for start in range(0, num_pages, CHUNK_PAGES):
        yield slice(start, min(start + CHUNK_PAGES, num_pages))


def step_inputs(step: Any, seed: int, seq_lens: list[int] | None = None) -> dict[str, Any]:
    """The inputs of one call of `step` (a DecodeStep) on its device: batch x max_pages shuffled pages of
    its own per request plus SPARE_PAGES, lengths seq_lens (default: random in [next_n, max_context])."""
    device = step.device
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    b, n, p = step.batch, step.next_n, step.max_pages
    num_pages = b * p + SPARE_PAGES
    if seq_lens is None:
        seq_lens = torch.randint(n, step.max_context + 1, (b,), generator=g, device=device).tolist()
    if len(seq_lens) != b or not all(n <= s <= step.max_context for s in seq_lens):
        raise ValueError(f"seq_lens must be {b} lengths in [{n}, {step.max_context}], got {seq_lens}")
    mtp = (n,) if n > 1 else ()
    k_index = torch.empty(num_pages, PAGE_SIZE, 1, 132, dtype=torch.int8, device=device)
    for pages in _chunks(num_pages):
        k_index[pages] = quantize_index_k(_randn((pages.stop - pages.start, PAGE_SIZE, 128), g))
    inputs = {
        "q_index_fp8": _randn((b, *mtp, step.index_heads, 128), g).to(torch.float8_e4m3fn),
        "k_index_cache_fp8": k_index,
        "weights": _randn((b, *mtp, step.index_heads), g, 1.0 / step.index_heads**0.5),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device),
        "block_table": torch.randperm(num_pages, generator=g, device=device)[: b * p].view(b, p).to(torch.int32),
        "q_nope": _randn((step.num_tokens, step.heads, 512), g).to(torch.bfloat16),
        "q_pe": _randn((step.num_tokens, step.heads, 64), g).to(torch.bfloat16),
        "sm_scale": SM_SCALE,
    }
    fp8 = step.kv_format == "fp8"
    if fp8:
        inputs["kv_cache"] = torch.empty(num_pages, PAGE_SIZE, 656, dtype=torch.int8, device=device)
    else:
        inputs["ckv_cache"] = torch.empty(num_pages, PAGE_SIZE, 512, dtype=torch.bfloat16, device=device)
        inputs["kpe_cache"] = torch.empty(num_pages, PAGE_SIZE, 64, dtype=torch.bfloat16, device=device)
    for pages in _chunks(num_pages):
        count = pages.stop - pages.start
        ckv, kpe = _randn((count, PAGE_SIZE, 512), g), _randn((count, PAGE_SIZE, 64), g)
        if fp8:
            inputs["kv_cache"][pages] = quantize_mla_kv(ckv, kpe, KV_SCALES)
        else:
            inputs["ckv_cache"][pages], inputs["kpe_cache"][pages] = ckv, kpe
    return inputs


def caches(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The MLA cache keyword arguments present in `inputs`."""
    return {k: inputs[k] for k in CACHE_NAMES if k in inputs}


def call_step(step: Any, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """step(...) on the inputs step_inputs made."""
    return step(*(inputs[k] for k in INDEX_NAMES + MLA_NAMES), **caches(inputs))
