"""dsa_prefill_indexer: the lightning indexer at prefill and its top-k, over a prompt batch packed as engines
pack it for DeepGEMM's fp8_mqa_logits: T query tokens, S keys, query token t seeing keys ks[t] <= s < ke[t].

Name: dsa_prefill_indexer_fp8_h{H}_d{D}_topk{K}; H in {32, 64} index heads of dim D in {32, 64, 128}, K in
{512, 1024, 2048}. The output is key ids (rows of the prompt's keys, as the sparse attention reads them as one
page), -1 padded, in any order.
"""

from __future__ import annotations

import re

from dsactl.definitions.base import Definition, TensorSpec
from dsactl.definitions.topk import rank_key
from dsactl.kernels.indexer.shapes import HEADS, TOPKS
from dsactl.kernels.indexer.shapes import PREFILL_DIMS as DIMS

NAME_RE = re.compile(r"^dsa_prefill_indexer_fp8_h(\d+)_d(\d+)_topk(\d+)$")


def row_keys(ks, ke, t: int, num_keys: int) -> tuple[int, int]:
    """Row t's keys [start, end): its range clamped to the S keys (an empty range where ke <= ks)."""
    start = min(max(int(ks[t]), 0), num_keys)
    return start, min(max(int(ke[t]), start), num_keys)


def keys_logits(q, k, w, scale):
    """float32 logits [R, S'] of query rows q [R, H, D] over keys k [S', D] (w [R, H], scale [S'], all float):
    scale[s] * sum_h w[h] * relu(q[h] . k[s])."""
    return ((q @ k.T).relu() * w[:, :, None]).sum(dim=1) * scale


def row_logits(q, k, w, scale, t: int, start: int, end: int):
    """Row t's float32 logits over keys [start, end) (q [T, H, D], k [S, D], w [T, H], scale [S] as float)."""
    return keys_logits(q[t:t + 1], k[start:end], w[t:t + 1], scale[start:end])[0]


def reference(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk=2048):
    """Per query token: over the keys of its range (clamped to [0, S]), the logit
    I[s] = k_index_scale[s] * sum_h w[h] * relu(q[h] . k[s]) in float32, the top-k of them (ranked by
    rank_key: NaN below -inf) as key ids, -1 padded."""
    import torch

    num_tokens, num_keys = q_index_fp8.shape[0], k_index_fp8.shape[0]
    q, k, w, scale = q_index_fp8.float(), k_index_fp8.float(), weights.float(), k_index_scale.float()
    out = torch.full((num_tokens, topk), -1, dtype=torch.int32, device=q.device)
    for t in range(num_tokens):
        start, end = row_keys(ks, ke, t, num_keys)
        if end == start:
            continue
        logits = row_logits(q, k, w, scale, t, start, end)
        chosen = torch.topk(rank_key(logits), min(topk, end - start)).indices
        out[t, : chosen.numel()] = (chosen + start).to(torch.int32)
    return out


def make(heads: int = 64, dim: int = 128, topk: int = 2048) -> Definition:
    if heads not in HEADS:
        raise ValueError(f"prefill indexer heads must be one of {HEADS}, got {heads}")
    if dim not in DIMS:
        raise ValueError(f"prefill indexer head dim must be one of {DIMS}, got {dim}")
    if topk not in TOPKS:
        raise ValueError(f"prefill indexer topk must be one of {TOPKS}, got {topk}")
    return Definition(
        name=f"dsa_prefill_indexer_fp8_h{heads}_d{dim}_topk{topk}",
        op_type="dsa_ragged",
        description=(f"DSA lightning indexer at prefill, {heads} FP8 heads of dim {dim}, each query token over its own "
                     f"range of a contiguous FP8 key array (DeepGEMM's fp8_mqa_logits layout), top-{topk} as key ids"),
        const_axes={"num_index_heads": heads, "index_head_dim": dim, "topk": topk},
        var_axes=("num_tokens", "num_keys"),
        inputs=(
            TensorSpec("q_index_fp8", ("num_tokens", "num_index_heads", "index_head_dim"), "float8_e4m3fn"),
            TensorSpec("k_index_fp8", ("num_keys", "index_head_dim"), "float8_e4m3fn"),
            TensorSpec("k_index_scale", ("num_keys",), "float32", "one positive dequant scale a key"),
            TensorSpec("weights", ("num_tokens", "num_index_heads"), "float32", "q scale and softmax scale folded in"),
            TensorSpec("ks", ("num_tokens",), "int32", "the first key a query token sees"),
            TensorSpec("ke", ("num_tokens",), "int32", "one past the last key it sees"),
        ),
        outputs=(TensorSpec("topk_indices", ("num_tokens", "topk"), "int32", "key ids, -1 padded, any order"),),
        constraints=("all(0 <= ks[t] <= ke[t] <= num_keys for t in range(num_tokens))",),
        reference=reference,
        reference_helpers=(rank_key, row_keys, keys_logits, row_logits),
        params={"heads": heads, "dim": dim, "topk": topk},
        tags=("stage:prefill_indexer",),
    )


def parse(name: str) -> Definition | None:
    m = NAME_RE.match(name)
    if not m:
        return None
    return make(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def variants() -> list[Definition]:
    return [make(h, 128, k) for h in (64, 32) for k in (2048, 1024, 512)]
