"""Fresh, realistic random inputs for a workload of an embedded suite.

Inputs are drawn on the target device from a seed (same seed, same inputs),
never zeros. Block tables use shuffled, non-contiguous page ids; cache pages
that no request references hold random bytes, so a kernel that reads the wrong
page produces garbage instead of a lucky match.
"""

from __future__ import annotations

from typing import Any

import torch

from dsactl.definitions import Definition, get
from dsactl.definitions.attention import CONTEST_SM_SCALE
from dsactl.fp8 import MLA_TOKEN_BYTES, PAGE_SIZE, quantize_index_k, quantize_mla_kv
from dsactl.workloads import hostile
from dsactl.workloads.workload import Workload

# Scale of random q/k so that fp8 values spread over the e4m3 range and
# indexer scores land at magnitudes like the model's (order 1-100).
Q_STD = 1.0
K_STD = 1.0


def _generator(device: torch.device | str, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _randn(shape, g, device, std=1.0):
    return torch.randn(shape, generator=g, device=device) * std


def _block_table(seq_lens: list[int], max_num_pages: int, num_pages: int, g, device, pad: int | None) -> torch.Tensor:
    """Distinct shuffled page ids per request; unused slots hold `pad` (or random valid ids if None)."""
    needed = sum((s + PAGE_SIZE - 1) // PAGE_SIZE for s in seq_lens)
    if needed > num_pages:
        raise ValueError(f"workload needs {needed} pages, cache has {num_pages}")
    perm = torch.randperm(num_pages, generator=g, device=device).to(torch.int32)
    table = torch.randint(0, num_pages, (len(seq_lens), max_num_pages), generator=g, device=device, dtype=torch.int32)
    if pad is not None:
        table.fill_(pad)
    start = 0
    for b, s in enumerate(seq_lens):
        n = (s + PAGE_SIZE - 1) // PAGE_SIZE
        table[b, :n] = perm[start : start + n]
        start += n
    return table


def _random_bytes(shape, g, device) -> torch.Tensor:
    return torch.randint(-128, 128, shape, generator=g, device=device, dtype=torch.int8)


def indexer_inputs(d: Definition, w: Workload, device, seed: int) -> dict[str, Any]:
    g = _generator(device, seed)
    p = w.params
    heads, next_n = d.params["heads"], d.params["next_n"]
    seq_lens = list(p["seq_lens"])
    batch, num_pages, max_num_pages = len(seq_lens), w.axes["num_pages"], w.axes["max_num_pages"]
    mtp = (next_n,) if next_n > 1 else ()
    table = _block_table(seq_lens, max_num_pages, num_pages, g, device, p.get("table_pad"))
    cache = _random_bytes((num_pages, PAGE_SIZE, 1, 132), g, device)
    used = torch.cat([table[b, : (s + PAGE_SIZE - 1) // PAGE_SIZE] for b, s in enumerate(seq_lens)]).long()
    if p.get("pattern") == "ties":
        # Every key of a request identical: all scores of a row tie.
        k = _randn((1, 1, 128), g, device, K_STD).expand(used.numel(), PAGE_SIZE, 128)
    else:
        k = _randn((used.numel(), PAGE_SIZE, 128), g, device, K_STD)
    cache[used] = quantize_index_k(k)
    q = _randn((batch, *mtp, heads, 128), g, device, Q_STD).to(torch.float8_e4m3fn)
    weights = _randn((batch, *mtp, heads), g, device, 1.0 / heads**0.5)
    return {
        "q_index_fp8": q,
        "k_index_cache_fp8": cache,
        "weights": weights,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device),
        "block_table": table,
    }


def _sparse_indices(p: dict, num_tokens: int, topk: int, num_slots: int, g, device) -> torch.Tensor:
    """Distinct token ids per row, then -1 padding by pattern: 'full', 'tail' (valid
    first, -1 after), 'scattered' (-1 anywhere), 'empty' (all -1), 'duplicates'."""
    pattern = p.get("pattern", "full")
    idx = torch.stack([torch.randperm(num_slots, generator=g, device=device)[:topk] for _ in range(num_tokens)]).to(torch.int32)
    valid = torch.tensor(p.get("valid", [topk] * num_tokens), device=device)
    pos = torch.arange(topk, device=device)
    if pattern == "duplicates":
        idx[:, 1::2] = idx[:, 0::2]
    if pattern == "empty":
        idx.fill_(-1)
    elif pattern == "scattered":
        keep = torch.rand((num_tokens, topk), generator=g, device=device).argsort(dim=1) < valid[:, None]
        idx = torch.where(keep, idx, -1)
    else:
        idx = torch.where(pos[None, :] < valid[:, None], idx, -1)
    return idx.to(torch.int32)


def _mla_kv_cache(ckv, kpe, scales: str, g) -> torch.Tensor:
    """The FP8 cache with `scales` of quantize_mla_kv, or "mixed": each token's scales of either kind."""
    if scales != "mixed":
        return quantize_mla_kv(ckv, kpe, scales)
    pow2 = torch.rand(ckv.shape[:-1], generator=g, device=ckv.device) < 0.5
    return torch.where(pow2[..., None], quantize_mla_kv(ckv, kpe, "ue8m0"), quantize_mla_kv(ckv, kpe))


def _padded_pages(cache: torch.Tensor) -> torch.Tensor:
    """The cache [pages, tokens, D] as a view into pages of tokens + 1 rows (the extra row NaN-poisoned bf16,
    0x7f e4m3 bytes: no kernel may read it)."""
    pages, tokens, dim = cache.shape
    fill = float("nan") if cache.dtype == torch.bfloat16 else 0x7F
    padded = torch.full((pages, tokens + 1, dim), fill, dtype=cache.dtype, device=cache.device)
    padded[:, :tokens] = cache
    return padded[:, :tokens]


def attention_inputs(d: Definition, w: Workload, device, seed: int) -> dict[str, Any]:
    g = _generator(device, seed)
    p = w.params
    heads, topk = d.params["heads"], d.params["topk"]
    num_tokens, num_pages = w.axes["num_tokens"], w.axes["num_pages"]
    # q_scale (a power of two, so exact in bf16) takes q past fp16's range; the workload divides
    # sm_scale by as much, which keeps the logits (and the contest tolerance's meaning).
    q_scale = float(p.get("q_scale", 1.0))
    out: dict[str, Any] = {
        "q_nope": _randn((num_tokens, heads, 512), g, device, q_scale).to(torch.bfloat16),
        "q_pe": _randn((num_tokens, heads, 64), g, device, q_scale).to(torch.bfloat16),
    }
    page_size = d.params["page_size"]
    ckv = _randn((num_pages, page_size, 512), g, device).to(torch.bfloat16)
    kpe = _randn((num_pages, page_size, 64), g, device).to(torch.bfloat16)
    if d.params["fp8kv"]:
        caches = {"kv_cache": _mla_kv_cache(ckv, kpe, p.get("kv_scales", "fp32"), g)}
        assert caches["kv_cache"].shape[-1] == MLA_TOKEN_BYTES
    else:
        caches = {"ckv_cache": ckv, "kpe_cache": kpe}
    if p.get("padded_pages"):  # each page a token longer than it holds, as FlashMLA's tests allocate blocks
        caches = {name: _padded_pages(c) for name, c in caches.items()}
    out.update(caches)
    out["sparse_indices"] = _sparse_indices(p, num_tokens, topk, num_pages * page_size, g, device)
    out["sm_scale"] = float(p.get("sm_scale", CONTEST_SM_SCALE))
    if d.params["has_topk_length"]:
        out["topk_length"] = torch.randint(0, topk + 1, (num_tokens,), generator=g, device=device, dtype=torch.int32)
    if d.params["has_sink"]:
        out["attn_sink"] = _randn((heads,), g, device, 2.0)
    return out


def _scores_row(pattern: str, length: int, g, device) -> torch.Tensor:
    if pattern == "all_equal":
        return torch.full((length,), 0.75, device=device)
    if pattern == "two_values":
        return torch.where(torch.rand(length, generator=g, device=device) < 0.5, 1.5, -2.0).to(device)
    if pattern == "one_bin":
        # Values differing only in the lowest mantissa bits: one coarse and one fine radix bin.
        base = torch.tensor(1.0, device=device).view(torch.int32)
        low = torch.randint(0, 256, (length,), generator=g, device=device, dtype=torch.int32)
        return (base + low).view(torch.float32)
    if pattern == "ascending":
        return torch.linspace(-5, 5, length, device=device)
    if pattern == "descending":
        return torch.linspace(5, -5, length, device=device)
    row = _randn((length,), g, device, 4.0)
    if pattern == "neg_inf_tail":
        row[length // 3 :] = float("-inf")
    elif pattern == "nan":
        row[torch.rand(length, generator=g, device=device) < 0.1] = float("nan")
    return row


def topk_inputs(d: Definition, w: Workload, device, seed: int) -> dict[str, Any]:
    g = _generator(device, seed)
    p = w.params
    lengths = list(p["lengths"])
    max_len = w.axes["max_len"]
    rows_per_request = p.get("rows_per_request", 1)
    batch = (len(lengths) + rows_per_request - 1) // rows_per_request
    max_num_pages = (max_len + PAGE_SIZE - 1) // PAGE_SIZE
    request_lens = [max(lengths[b * rows_per_request : (b + 1) * rows_per_request]) for b in range(batch)]
    num_pages = sum((s + PAGE_SIZE - 1) // PAGE_SIZE for s in request_lens) + 16
    scores = _randn((len(lengths), max_len), g, device, 4.0)  # beyond length: random, must be ignored
    for r, length in enumerate(lengths):
        scores[r, :length] = _scores_row(p.get("pattern", "random"), length, g, device)
    dtype = torch.bfloat16 if d.params["bf16"] else torch.float32
    return {
        "scores": scores.to(dtype),
        "lengths": torch.tensor(lengths, dtype=torch.int32, device=device),
        "block_table": _block_table(request_lens, max_num_pages, num_pages, g, device, None),
        "row_to_batch": (torch.arange(len(lengths), device=device) // rows_per_request).to(torch.int32),
    }


def prefill_ranges(prompts: tuple[int, ...], queries: tuple[int, ...] | None) -> tuple[list[int], list[int]]:
    """(ks, ke) of causal prompts packed one after another: the last queries[i] tokens of prompt i (all of them
    when queries is None) each see the prompt's keys up to themselves."""
    ks, ke, start = [], [], 0
    for i, length in enumerate(prompts):
        first = length - (queries[i] if queries else length)
        ks += [start] * (length - first)
        ke += [start + j + 1 for j in range(first, length)]
        start += length
    return ks, ke


def prefill_indexer_inputs(d: Definition, w: Workload, device, seed: int) -> dict[str, Any]:
    g = _generator(device, seed)
    p = w.params
    heads, dim = d.params["heads"], d.params["dim"]
    num_tokens, num_keys = w.axes["num_tokens"], w.axes["num_keys"]
    ks, ke = prefill_ranges(tuple(p["prompts"]), p.get("queries"))
    if p.get("pattern") == "ties":  # every key identical: all logits of a row tie
        k = _randn((1, dim), g, device, K_STD).expand(num_keys, dim)
    else:
        k = _randn((num_keys, dim), g, device, K_STD)
    return {
        "q_index_fp8": _randn((num_tokens, heads, dim), g, device, Q_STD).to(torch.float8_e4m3fn),
        "k_index_fp8": k.to(torch.float8_e4m3fn),
        "k_index_scale": torch.rand(num_keys, generator=g, device=device) * 0.02 + 0.001,
        "weights": _randn((num_tokens, heads), g, device, 1.0 / heads**0.5),
        "ks": torch.tensor(ks, dtype=torch.int32, device=device),
        "ke": torch.tensor(ke, dtype=torch.int32, device=device),
    }


GENERATORS = {"stage:indexer": indexer_inputs, "stage:topk": topk_inputs, "stage:attention": attention_inputs,
              "stage:prefill_indexer": prefill_indexer_inputs}


def make_generated_inputs(w: Workload, device, seed: int) -> dict[str, Any]:
    d = get(w.definition)
    kind = w.params.get("hostile")
    if kind == "empty":
        return hostile.empty_inputs(d, w, device, seed)
    stage = next(t for t in d.tags if t.startswith("stage:"))
    inputs = GENERATORS[stage](d, w, device, seed)
    return hostile.corrupt(d, w, inputs) if kind else inputs
