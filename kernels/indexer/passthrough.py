"""Structural top-k of the indexer for requests that fit in top-k (Triton).

When a row sees at most topk tokens, the top-k keeps all of them whatever their scores, so
the output is the page-table mapping of its visible positions and no key is read:

  out[b * N + j, i] = block_table[b, i // 64] * 64 + i % 64   for i < visible = seq_len[b] - N + j + 1
  out[b * N + j, i] = -1                                       for visible <= i < topk

Contract: seq_lens int32 [B]; block_table int32 [B, max_num_pages] (entries past a row's pages
may be -1 or garbage: they are read, never written out); out int32 [B * N, topk] contiguous. The
caller guarantees max_num_pages * 64 <= topk (every row fits) — the launcher checks it from shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..bad_index import MAX_PAGES, checking
from ..errors import KernelInputError
from ..fp8 import PAGE_SIZE
from ..launch_math import cdiv
from ..topk.launcher import check_values
from ..triton_options import FP_FUSION
from .score import BAD_PAGES
from .shapes import NEXT_NS, TOPKS

# Output slots per program: 2048-wide rows take two programs, so B * N * 2 programs cover
# the contest's batches of 1-31 in one wave on 132 SMs.
BLOCK = 1024


@triton.jit(do_not_specialize=["num_pages"])
def indexer_passthrough_kernel(seq_lens_ptr, block_table_ptr, out_ptr, bad_count_ptr, bt_stride, max_len, num_pages,
                               NEXT_N: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr,
                               PAGE: tl.constexpr):
    row = tl.program_id(0)
    b = row // NEXT_N
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    # The block-table read is masked by the table's width, not by seq_len, so it does not wait
    # for seq_len: both loads are in flight at once (one memory round trip, not two). An entry
    # past the row's pages is inside the table and dropped by the select below.
    page = tl.load(block_table_ptr + b * bt_stride + i // PAGE, mask=i < max_len, other=0)
    visible = tl.load(seq_lens_ptr + b) - NEXT_N + 1 + row % NEXT_N
    # A page outside the cache translates to -1, as the top-k does; its entry is counted once, by the
    # request's last row (which sees every page of the request) at the page's first slot.
    in_cache = (page >= 0) & (page < num_pages)
    seen = (i < visible) & (i < max_len)
    n_bad = tl.sum((seen & ~in_cache & (i % PAGE == 0)).to(tl.int32), 0)
    if (n_bad > 0) & (row % NEXT_N == NEXT_N - 1):
        tl.atomic_add(bad_count_ptr, n_bad)
    tl.store(out_ptr + row.to(tl.int64) * TOPK + i, tl.where(seen & in_cache, page * PAGE + i % PAGE, -1),
             mask=i < TOPK)


def passthrough(seq_lens: torch.Tensor, block_table: torch.Tensor, out: torch.Tensor, next_n: int,
                num_pages: int, check: bool | None = None) -> None:
    """Write the structural top-k of every row (module docstring; pages outside [0, num_pages) give -1,
    counted in score.BAD_PAGES); one launch, no host sync. check (default: DSACTL_CHECK=1) refuses such a
    page on the host first, as the scoring path does."""
    if out.dtype != torch.int32 or out.dim() != 2 or not out.is_contiguous():
        raise KernelInputError(f"passthrough output must be contiguous int32 [rows, topk], "
                               f"got {out.dtype} {list(out.shape)}")
    rows, topk = out.shape
    batch = seq_lens.shape[0]
    if rows != batch * next_n:
        raise KernelInputError(f"passthrough output has {rows} rows, expected {batch} x next_n {next_n}")
    if block_table.shape[1] * PAGE_SIZE > topk:
        raise KernelInputError(f"passthrough needs max_num_pages * {PAGE_SIZE} <= topk, got "
                          f"{block_table.shape[1]} pages for topk {topk}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise KernelInputError(f"block_table must be int32 [batch, max_num_pages], got {block_table.dtype} "
                               f"{list(block_table.shape)}")
    if block_table.shape[0] < batch:
        raise KernelInputError(f"block_table has {block_table.shape[0]} rows for a batch of {batch}")
    if block_table.stride(1) != 1:
        raise KernelInputError("block_table must have unit column stride")
    if rows == 0:
        return
    if checking(check):  # each request reads the pages that hold its seq_len tokens
        check_values(seq_lens, block_table[:batch], None, block_table.shape[1] * PAGE_SIZE,
                     min(num_pages, MAX_PAGES))
    indexer_passthrough_kernel[(rows, cdiv(topk, BLOCK))](
        seq_lens, block_table, out, BAD_PAGES.tensor(out.device), block_table.stride(0),
        block_table.shape[1] * PAGE_SIZE, num_pages,
        NEXT_N=next_n, TOPK=topk, BLOCK=BLOCK, PAGE=PAGE_SIZE, num_warps=4, num_stages=1,
        enable_fp_fusion=FP_FUSION,
    )


def aot_specs() -> list[dict]:
    """Every (next_n, topk) configuration of the indexer definitions, for `dsactl build`."""
    signature = {"seq_lens_ptr": "*i32", "block_table_ptr": "*i32", "out_ptr": "*i32", "bad_count_ptr": "*i32",
                 "bt_stride": "i32", "max_len": "i32", "num_pages": "i32", "NEXT_N": "constexpr", "TOPK": "constexpr", "BLOCK": "constexpr",
                 "PAGE": "constexpr"}
    return [
        {"name": f"indexer_passthrough_topk{topk}_nextn{next_n}", "fn": indexer_passthrough_kernel,
         "signature": signature, "constexprs": {"NEXT_N": next_n, "TOPK": topk, "BLOCK": BLOCK, "PAGE": PAGE_SIZE},
         "num_warps": 4, "num_stages": 1}
        for topk in TOPKS for next_n in NEXT_NS
    ]
