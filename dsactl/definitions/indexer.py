"""dsa_topk_indexer: FP8 lightning indexer scores + top-k + page-table translation.

Contest contract (docs/design.md, Contracts): dsa_topk_indexer_fp8_h64_d128_topk2048_ps64.
Variants: heads {32, 64}, topk {512, 1024, 2048}, next_n 1-4 query tokens per
request (name suffix `_nextnN`; q, weights and the output gain a next_n axis and
token j of n sees seq_len - n + j + 1 tokens).
"""

from __future__ import annotations

import math
import re

from dsactl.definitions.base import Definition, TensorSpec
from dsactl.definitions.topk import rank_key
from dsactl.fp8 import INDEX_HEAD_DIM, PAGE_SIZE, dequantize_index_k
from dsactl.kernels.indexer.shapes import HEADS, NEXT_NS, TOPKS

NAME_RE = re.compile(r"^dsa_topk_indexer_fp8_h(\d+)_d128_topk(\d+)_ps64(?:_nextn(\d+))?$")


def reference(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk=2048, next_n=1):
    """Per request, per query token: dequantize the keys of its pages, score
    I[s] = sum_h w[h] * relu(q[h] . k[s]) over the tokens it may see, keep the
    top-k (ranked by rank_key: NaN below -inf), translate logical positions to
    physical ids, pad with -1. Bad values are masked, as the kernels mask them: a
    row sees at most max_num_pages * 64 tokens; a token whose page id is outside
    [0, num_pages) scores -inf and, if chosen, gives -1."""
    import torch

    batch_size, heads = q_index_fp8.shape[0], q_index_fp8.shape[-2]
    q = q_index_fp8.float().reshape(batch_size, next_n, heads, INDEX_HEAD_DIM)
    w = weights.float().reshape(batch_size, next_n, heads)
    k_all = dequantize_index_k(k_index_cache_fp8)  # [num_pages, 64, 128]
    num_pages_in_cache, max_len = k_all.shape[0], block_table.shape[1] * PAGE_SIZE
    out = torch.full((batch_size, next_n, topk), -1, dtype=torch.int32, device=q.device)
    for b in range(batch_size):
        seq_len = int(seq_lens[b])
        for j in range(next_n):
            visible = min(seq_len - next_n + j + 1, max_len)
            if visible <= 0:
                continue
            pos = torch.arange(visible, device=q.device)
            page = block_table[b, pos // PAGE_SIZE].long()  # [visible]
            in_cache = (page >= 0) & (page < num_pages_in_cache)
            scores = torch.full((visible,), -math.inf, device=q.device)
            if bool(in_cache.any()):
                k = k_all[page[in_cache], pos[in_cache] % PAGE_SIZE]  # [valid, 128]
                scores[in_cache] = (torch.relu(q[b, j] @ k.T) * w[b, j][:, None]).sum(dim=0)
            chosen = torch.topk(rank_key(scores), min(topk, visible)).indices
            physical = torch.where(in_cache[chosen], page[chosen] * PAGE_SIZE + chosen % PAGE_SIZE, -1)
            out[b, j, : chosen.numel()] = physical.to(torch.int32)
    return out.reshape(batch_size, topk) if next_n == 1 else out


def make(heads: int = 64, topk: int = 2048, next_n: int = 1) -> Definition:
    if heads not in HEADS:
        raise ValueError(f"indexer heads must be one of {HEADS}, got {heads}")
    if topk not in TOPKS:
        raise ValueError(f"indexer topk must be one of {TOPKS}, got {topk}")
    if next_n not in NEXT_NS:
        raise ValueError(f"indexer next_n must be one of {NEXT_NS}, got {next_n}")
    mtp = ("next_n",) if next_n > 1 else ()
    name = f"dsa_topk_indexer_fp8_h{heads}_d128_topk{topk}_ps64" + (f"_nextn{next_n}" if next_n > 1 else "")
    consts = {"num_index_heads": heads, "index_head_dim": INDEX_HEAD_DIM, "page_size": PAGE_SIZE,
              "kv_cache_num_heads": 1, "head_dim_with_scale": 132, "topk": topk}
    if next_n > 1:
        consts["next_n"] = next_n
    return Definition(
        name=name,
        op_type="dsa_paged",
        description=(
            f"DSA lightning indexer, {heads} FP8 heads of dim 128 over a paged FP8 K cache "
            f"(8448-byte pages), top-{topk} with translation to physical token ids"
            + (f", {next_n} query tokens per request (causal: token j sees seq_len - {next_n} + j + 1 tokens)"
               if next_n > 1 else "")
        ),
        const_axes=consts,
        var_axes=("batch_size", "num_pages", "max_num_pages"),
        inputs=(
            TensorSpec("q_index_fp8", ("batch_size", *mtp, "num_index_heads", "index_head_dim"), "float8_e4m3fn"),
            TensorSpec("k_index_cache_fp8", ("num_pages", "page_size", "kv_cache_num_heads", "head_dim_with_scale"),
                       "int8", "per page: 64x128 e4m3 bytes, then 64 fp32 scales"),
            TensorSpec("weights", ("batch_size", *mtp, "num_index_heads"), "float32", "q scale and softmax scale folded in"),
            TensorSpec("seq_lens", ("batch_size",), "int32"),
            TensorSpec("block_table", ("batch_size", "max_num_pages"), "int32"),
        ),
        outputs=(
            TensorSpec("topk_indices", ("batch_size", *mtp, "topk"), "int32", "physical token ids, -1 padded, any order"),
        ),
        # Python expressions over axes and inputs (the flashinfer-bench convention).
        constraints=(
            "all(1 <= seq_lens[b] <= max_num_pages * page_size for b in range(batch_size))",
            "all(0 <= block_table[b, p] < num_pages for b in range(batch_size) "
            "for p in range((seq_lens[b] + page_size - 1) // page_size))",
        ) + (("all(seq_lens[b] >= next_n for b in range(batch_size))",) if next_n > 1 else ()),
        reference=reference,
        reference_helpers=(rank_key,),
        params={"heads": heads, "topk": topk, "next_n": next_n},
        tags=("stage:indexer",) + (("contest",) if (heads, topk, next_n) == (64, 2048, 1) else ()),
    )


def parse(name: str) -> Definition | None:
    m = NAME_RE.match(name)
    if not m:
        return None
    return make(int(m.group(1)), int(m.group(2)), int(m.group(3) or 1))


def variants() -> list[Definition]:
    return [make(h, k, n) for h in (64, 32) for k in (2048, 1024, 512) for n in NEXT_NS]
