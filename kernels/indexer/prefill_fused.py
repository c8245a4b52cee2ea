"""The prefill indexer's top-k with no logits matrix in memory (Triton): prefill_topk.py's contract, each row's
logits selected a segment at a time, as they are computed.

Contract: prefill_topk.py's (q [T, H, D], k [S, D], k_scale [S], weights [T, H], ks, ke [T] -> out int32
[T, topk]: the keys of row i's range with the topk largest logits, mqa_logits.py's logit, -1 padded where the
range holds fewer; every id -1 or in the row's clamped range). Ties go to the lower key id, so out is one exact
set, in an order of the kernel's own (no particular one), the same bits on every call.

How: a program scores BLOCK_M = 128 // H query rows against the key tiles of its rows' ranges, a segment of
SEGMENT_KEYS keys at a time. The segment's tiles run mqa_logits.py's loop, storing each tile's logits into
the program's segment buffer (a few KiB, which stays in L2) with nothing else in the pipelined loop. Then each
row's segment is filtered at once: every logit and its key id are packed into one int64 that orders by logit,
then by the lower id, and the row's list keeps those above its threshold (the topk-th best kept so far; every
key until topk are kept). A list that could not take another segment is cut to its best topk (_cut_list: a
select, not a sort), which raises the threshold; the last cut leaves the answer. The lists, CAP int64 a row,
and the segment buffers live in a scratch of at most SCRATCH_BYTES that rows use in chunks: a 64K-token
prompt's fp32 logits would be 16 GiB, its lists and segments 2.25 GiB and a chunk of them SCRATCH_BYTES.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from ..launch_math import cdiv, next_power_of_2
from ..triton_options import FP_FUSION
from .mqa_logits import (BLOCK_KEYS, DIMS, HEADS, NUM_STAGES, NUM_WARPS, ROWS_X_HEADS, check_inputs, row_block_query,
                         row_block_ranges, tile_logits)
from .prefill_topk import check_out

WHO = "fused prefill top-k"
# The lists and segment buffers of one chunk of rows: 7280 rows of topk 2048 (36 KiB a row).
SCRATCH_BYTES = 1 << 28
# Below every packed (logit, id): an empty slot of a list, and the threshold before a list holds topk keys.
EMPTY = tl.constexpr(-(1 << 63) + 1)
SIGN = tl.constexpr(1 << 63)  # flips a packed int64 into the unsigned form of the same order
# The most slots a list takes: a cut holds them in registers, 16 int64 a thread at 8 warps (more spilled).
MAX_CAPACITY = 4096
TOPKS = (512, 1024, 2048)  # the prefill indexer definitions' (built ahead of time; others compile on first use)


def capacity(topk: int) -> int:
    """A list's slots: at least two tiles past topk, and up to four times topk (at most MAX_CAPACITY, whose cut
    holds the list in registers), so that a cut frees more slots than it keeps: of n keys about
    topk * (1 + ln(n / topk)) ever pass the threshold."""
    return max(next_power_of_2(topk + 2 * BLOCK_KEYS), min(4 * next_power_of_2(topk), MAX_CAPACITY))


def segment_keys(topk: int) -> int:
    """Keys a row filters at once: a power of two of whole tiles, at most half the slots a cut frees, so that a
    list is cut once it could not take another segment and cuts come at most every other segment."""
    return max(BLOCK_KEYS, next_power_of_2((capacity(topk) - topk) // 2 + 1) // 2)


@triton.jit
def _pack(logit, pos):
    """(logit, key id) as one int64 ordered by logit, then by the lower id: the float's bits as an ordered int32
    (negative floats' magnitude bits flipped; NaN the lowest, below -inf, as the definition ranks it) over
    2^31 - id (ids below 2^31 - 1, so the low word is >= 2)."""
    bits = logit.to(tl.int32, bitcast=True)
    key = tl.where(logit != logit, -2147483648, tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF))
    return key.to(tl.int64) * 4294967296 + (2147483648 - pos.to(tl.int64))


@triton.jit
def _cut_list(buf_ptr, row, fill, thr, TOPK: tl.constexpr, CAP: tl.constexpr):
    """A row's list of `fill` entries cut in place to its best TOPK where it holds more: (entries, threshold)
    after. The TOPK-th best is found a byte at a time from the top, in the packed values' unsigned form: a
    histogram of the byte over the entries that match the bytes found so far picks the byte's bin holding the
    TOPK-th, and the search stops at the first bin that holds exactly the entries still needed: within the
    logit's four bytes unless logits tie, eight passes at most. The entries at or above it keep their order."""
    kept = tl.minimum(fill, TOPK)
    if fill > TOPK:
        tl.debug_barrier()  # the entries were stored by other threads of the program
        c = tl.arange(0, CAP)
        ptrs = buf_ptr + row.to(tl.int64) * CAP + c
        valid = c < fill
        u = tl.load(ptrs, mask=valid, other=EMPTY).to(tl.uint64, bitcast=True) ^ SIGN
        bins = tl.arange(0, 256)
        kth = tl.zeros([], tl.uint64)  # the bytes found so far
        high = tl.zeros([], tl.uint64)  # their bits
        need = tl.full([], TOPK, tl.int32)  # entries still to take among those that match kth's bytes
        shift = tl.full([], 56, tl.uint64)
        searching = tl.full([], True, tl.int1)
        while searching:
            h = tl.histogram(((u >> shift) & 255).to(tl.int32), 256, mask=valid & ((u & high) == kth))
            at_or_above = tl.cumsum(h, 0, reverse=True)
            b = tl.max(tl.where(at_or_above >= need, bins, -1), 0)
            need -= tl.sum(tl.where(bins > b, h, 0), 0)
            # Packed values are distinct, so the last byte's bin holds exactly the entries needed.
            searching = (tl.sum(tl.where(bins == b, h, 0), 0) != need) & (shift > 0)
            kth = kth | (b.to(tl.uint64) << shift)
            high = high | (tl.full([], 255, tl.uint64) << shift)
            shift = shift - 8
        keep = valid & (u >= kth)  # exactly TOPK: b's bin holds exactly those still needed
        slot = tl.cumsum(keep.to(tl.int32), 0) - 1
        tl.debug_barrier()  # every thread has read the list before any overwrites it
        tl.store(buf_ptr + row.to(tl.int64) * CAP + slot, (u ^ SIGN).to(tl.int64, bitcast=True), mask=keep)
        thr = (kth ^ SIGN).to(tl.int64, bitcast=True)
    return kept, thr


@triton.jit
def _cut(buf_ptr, row0, j, fill, thr, limit, BLOCK_M: tl.constexpr, TOPK: tl.constexpr, CAP: tl.constexpr):
    """The lists of rows row0 .. + BLOCK_M that hold more than limit entries cut (_cut_list): (fill, thr)
    after."""
    for r in range(BLOCK_M):  # a loop, not unrolled: each row's cut holds its list in registers
        row_fill = tl.sum(tl.where(j == r, fill, 0))
        if row_fill > limit:
            row_thr = tl.sum(tl.where(j == r, thr, 0))
            row_fill, row_thr = _cut_list(buf_ptr, row0 + r, row_fill, row_thr, TOPK, CAP)
            fill = tl.where(j == r, row_fill, fill)
            thr = tl.where(j == r, row_thr, thr)
    tl.debug_barrier()  # the cut lists before any thread appends to them
    return fill, thr


@triton.jit(do_not_specialize=["num_rows", "num_keys"])
def prefill_fused_topk_kernel(
    q_ptr,  # *fp8e4nv [T, HEADS, DIM]
    k_ptr,  # *fp8e4nv [S, DIM]
    k_scale_ptr,  # *fp32 [S]
    w_ptr,  # *fp32 [T, w_stride]
    ks_ptr, ke_ptr,  # *i32 [T]
    out_ptr,  # *i32 [T, out_stride]
    buf_ptr,  # *i64 [cdiv(T, BLOCK_M) * BLOCK_M, CAP]: the rows' lists
    seg_ptr,  # *fp32 [cdiv(T, BLOCK_M) * BLOCK_M, SEGMENT_KEYS]: the rows' segment buffers
    w_stride, out_stride,
    num_rows, num_keys,  # T, S
    HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KEYS: tl.constexpr,
    TOPK: tl.constexpr, CAP: tl.constexpr, SEGMENT_KEYS: tl.constexpr, STAGES: tl.constexpr,
):
    """Program r: query rows r * BLOCK_M .. + BLOCK_M over every key tile their ranges touch, from the last
    row block (the longest ranges of a causal prompt) to the first."""
    tl.static_assert(SEGMENT_KEYS % BLOCK_KEYS == 0, "a segment is whole key tiles")
    tl.static_assert(CAP >= TOPK + SEGMENT_KEYS, "a cut list must take a whole segment of keys")
    SEGMENT: tl.constexpr = SEGMENT_KEYS // BLOCK_KEYS
    rb = tl.num_programs(0) - 1 - tl.program_id(0)
    rows, real_row, _, ks, ke, lo, hi = row_block_ranges(ks_ptr, ke_ptr, rb, num_rows, num_keys, BLOCK_M)
    qt, w = row_block_query(q_ptr, w_ptr, w_stride, rb, num_rows, HEADS, DIM, BLOCK_M)
    j = tl.arange(0, BLOCK_M)
    c = tl.arange(0, SEGMENT_KEYS)
    key = tl.arange(0, BLOCK_KEYS)
    segment = seg_ptr + rows.to(tl.int64) * SEGMENT_KEYS
    lists = buf_ptr + rows.to(tl.int64) * CAP

    fill = tl.zeros([BLOCK_M], tl.int32)
    thr = tl.full([BLOCK_M], EMPTY, tl.int64)
    t_hi = tl.cdiv(hi, BLOCK_KEYS)
    for seg in range(lo // BLOCK_KEYS, t_hi, SEGMENT):
        # The tiles' logits into the segment buffer: the pipelined loop holds nothing else.
        for t in tl.range(seg, tl.minimum(seg + SEGMENT, t_hi), num_stages=STAGES):
            _pos, logit = tile_logits(k_ptr, k_scale_ptr, t, qt, w, num_keys, HEADS, DIM, BLOCK_M, BLOCK_KEYS)
            tl.store(segment[None, :] + ((t - seg) * BLOCK_KEYS + key)[:, None], logit)
        tl.debug_barrier()  # the segment was stored by other threads of the program
        # Tiles past t_hi were not stored this segment: their keys are past every row's range.
        pos = seg * BLOCK_KEYS + c
        seen = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None]) & real_row[:, None]
        packed = _pack(tl.load(segment[:, None] + c[None, :]), pos[None, :])
        take = seen & (packed > thr[:, None])
        slot = fill[:, None] + tl.cumsum(take.to(tl.int32), axis=1) - 1
        tl.store(lists[:, None] + slot, packed, mask=take)
        fill += tl.sum(take.to(tl.int32), axis=1)
        fill, thr = _cut(buf_ptr, rb * BLOCK_M, j, fill, thr, CAP - SEGMENT_KEYS, BLOCK_M, TOPK, CAP)

    fill, thr = _cut(buf_ptr, rb * BLOCK_M, j, fill, thr, TOPK, BLOCK_M, TOPK, CAP)
    c = tl.arange(0, CAP)
    for r in tl.static_range(BLOCK_M):
        row = rb * BLOCK_M + r
        row_fill = tl.sum(tl.where(j == r, fill, 0))
        packed = tl.load(buf_ptr + row.to(tl.int64) * CAP + c, mask=c < row_fill, other=0)
        ids = tl.where(c < row_fill, 2147483648 - (packed & 0xFFFFFFFF), -1).to(tl.int32)
        tl.store(out_ptr + row.to(tl.int64) * out_stride + c, ids, mask=(c < TOPK) & (row + 0 * c < num_rows))


def prefill_topk_fused(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                       ks: torch.Tensor, ke: torch.Tensor, out: torch.Tensor, *,
                       scratch_bytes: int = SCRATCH_BYTES) -> None:
    """Write out (module contract); the rows' lists and segment buffers take at most scratch_bytes (at least one
    program's rows)."""
    num_rows, heads, dim, num_keys = check_inputs(q, k, k_scale, weights, ks, ke)
    topk = check_out(out, num_rows, q.device, WHO)
    if num_keys >= 2 ** 31 - 1:
        raise KernelInputError(f"{WHO}: key ids must stay below 2^31 - 1, got {num_keys} keys")
    if num_rows == 0:
        return
    if num_keys == 0:
        out.fill_(-1)
        return
    block_m = ROWS_X_HEADS // heads
    cap, seg_keys = capacity(topk), segment_keys(topk)
    chunk = max(1, scratch_bytes // ((cap * 8 + seg_keys * 4) * block_m)) * block_m
    chunk = min(chunk, cdiv(num_rows, block_m) * block_m)
    lists = torch.empty(chunk * cap, dtype=torch.int64, device=q.device)
    segments = torch.empty(chunk * seg_keys, dtype=torch.float32, device=q.device)
    for r0 in range(0, num_rows, chunk):
        r1 = min(r0 + chunk, num_rows)
        prefill_fused_topk_kernel[(cdiv(r1 - r0, block_m),)](
            q[r0:r1], k, k_scale, weights[r0:r1], ks[r0:r1], ke[r0:r1], out[r0:r1], lists, segments,
            weights.stride(0),
            out.stride(0), r1 - r0, num_keys, HEADS=heads, DIM=dim, BLOCK_M=block_m, BLOCK_KEYS=BLOCK_KEYS,
            TOPK=topk, CAP=cap, SEGMENT_KEYS=seg_keys, STAGES=NUM_STAGES, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES, enable_fp_fusion=FP_FUSION)


def dsa_prefill_indexer_fused(q_index_fp8: torch.Tensor, k_index_fp8: torch.Tensor, k_index_scale: torch.Tensor,
                              weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor,
                              topk_indices: torch.Tensor) -> None:
    """Solution entry for dsa_prefill_indexer_fp8_h{H}_d{D}_topk{K}: the definition's signature (inputs, then the
    preallocated output)."""
    prefill_topk_fused(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk_indices)


_SIGNATURE = {
    "q_ptr": "*fp8e4nv", "k_ptr": "*fp8e4nv", "k_scale_ptr": "*fp32", "w_ptr": "*fp32", "ks_ptr": "*i32",
    "ke_ptr": "*i32", "out_ptr": "*i32", "buf_ptr": "*i64", "seg_ptr": "*fp32", "w_stride": "i32", "out_stride": "i32",
    "num_rows": "i32", "num_keys": "i32",
}


def aot_specs() -> list[dict]:
    """Every (heads, head dim, topk) configuration of the prefill indexer definitions, for `dsactl build`."""
    specs = []
    for heads in HEADS:
        for dim in DIMS:
            for topk in TOPKS:
                constexprs = {"HEADS": heads, "DIM": dim, "BLOCK_M": ROWS_X_HEADS // heads, "BLOCK_KEYS": BLOCK_KEYS,
                              "TOPK": topk, "CAP": capacity(topk), "SEGMENT_KEYS": segment_keys(topk),
                              "STAGES": NUM_STAGES}
                specs.append({
                    "name": f"prefill_fused_topk_h{heads}_d{dim}_topk{topk}",
                    "fn": prefill_fused_topk_kernel,
                    "signature": {**_SIGNATURE, **{k: "constexpr" for k in constexprs}},
                    "constexprs": constexprs,
                    "num_warps": NUM_WARPS,
                    "num_stages": NUM_STAGES,
                })
    return specs
