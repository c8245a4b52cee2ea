"""dsa_topk_page_transform: top-k over score rows fused with page-table translation.

The middle stage of DSA as its own operator, so the top-k kernel is verified and
timed alone. Row r belongs to request row_to_batch[r] (several query rows per
request for MTP); its first lengths[r] scores are valid. Output: physical ids
block_table[b, i // 64] * 64 + i % 64 of the top min(topk, length) positions,
-1 padded, in any order. Scores are fp32 (or bf16 with the `_bf16` suffix).

NaN rule: a NaN score ranks below every number, -inf included; it is selected
only when the row has fewer than topk non-NaN scores.

Bad values (outside the constraints) are masked, never translated: lengths are
clamped to [0, min(max_len, max_num_pages * 64)]; a chosen position whose page id
is outside [0, 2**25) (an id past int32) gives -1, as does every slot of a row
whose row_to_batch value is not a block_table row. Selection ignores page ids.
"""


from __future__ import annotations

import re
from typing import TYPE_CHECKING

from dsactl.definitions.base import Definition, TensorSpec
from dsactl.fp8 import PAGE_SIZE

if TYPE_CHECKING:  # annotations only: listing definitions imports no torch
    import torch

MAX_TOPK = 2048
NAME_RE = re.compile(r"^dsa_topk_page_transform_topk(\d+)_ps64(_bf16)?$")


def rank_key(scores: torch.Tensor) -> torch.Tensor:
    """float64 keys whose order is the contract's order: -inf becomes the lowest
    finite double so that NaN, mapped to -inf, ranks below it."""
    import torch

    key = scores.double()
    key = torch.where(key == float("-inf"), torch.finfo(torch.float64).min, key)
    return torch.where(torch.isnan(key), float("-inf"), key)


def reference(scores, lengths, block_table, row_to_batch, topk=2048):
    """Per row: top min(topk, length) of the valid scores by rank_key, translated
    through the row's request's block table, -1 padded; bad values masked as the
    module docstring says."""
    import torch

    num_rows, max_len = scores.shape
    batch_size, max_num_pages = block_table.shape
    max_pages = 2**25  # page ids whose token ids fit int32
    out = torch.full((num_rows, topk), -1, dtype=torch.int32, device=scores.device)
    for r in range(num_rows):
        length = min(max(int(lengths[r]), 0), max_len, max_num_pages * PAGE_SIZE)
        b = int(row_to_batch[r])
        if length == 0 or not 0 <= b < batch_size:
            continue
        chosen = torch.topk(rank_key(scores[r, :length]), min(topk, length)).indices
        page = block_table[b, chosen // PAGE_SIZE].long()
        physical = torch.where((page >= 0) & (page < max_pages), page * PAGE_SIZE + chosen % PAGE_SIZE, -1)
        out[r, : chosen.numel()] = physical.to(torch.int32)
    return out


def make(topk: int = 2048, bf16: bool = False) -> Definition:
    if not 0 < topk <= MAX_TOPK:
        raise ValueError(f"top-k must be in [1, {MAX_TOPK}], got {topk}")
    return Definition(
        name=f"dsa_topk_page_transform_topk{topk}_ps64" + ("_bf16" if bf16 else ""),
        op_type="dsa_topk",
        description=(f"exact top-{topk} of {'bf16' if bf16 else 'fp32'} score rows fused with page-table "
                     "translation; NaN ranks below -inf"),
        const_axes={"topk": topk, "page_size": PAGE_SIZE},
        var_axes=("num_rows", "max_len", "batch_size", "max_num_pages"),
        inputs=(
            TensorSpec("scores", ("num_rows", "max_len"), "bfloat16" if bf16 else "float32"),
            TensorSpec("lengths", ("num_rows",), "int32"),
            TensorSpec("block_table", ("batch_size", "max_num_pages"), "int32"),
            TensorSpec("row_to_batch", ("num_rows",), "int32"),
        ),
        outputs=(TensorSpec("topk_indices", ("num_rows", "topk"), "int32", "physical ids, -1 padded, any order"),),
        constraints=("all((lengths >= 0) & (lengths <= min(max_len, max_num_pages * page_size)))",
                     "all((row_to_batch >= 0) & (row_to_batch < batch_size))"),
        reference=reference,
        reference_helpers=(rank_key,),
        params={"topk": topk, "bf16": bf16},
        tags=("stage:topk",),
    )


def parse(name: str) -> Definition | None:
    m = NAME_RE.match(name)
    return make(int(m.group(1)), bool(m.group(2))) if m else None


def variants() -> list[Definition]:
    return [make(k, bf) for k in (2048, 1024, 512) for bf in (False, True)]
