"""Sparse MLA decode attention in Triton: every variant, split-KV, exact combine.

Contract (docs/design.md, Contracts), per query token t:
- q_nope [T, H, 512] bf16, q_pe [T, H, 64] bf16 (last dim contiguous; token/head strides free,
  so q may be a view of one [T, H, 576] tensor); H in {16, 32, 64, 128}. Or requests of S tokens:
  [B, S, H, ...] views that need not flatten (FlashMLA's decode layout), T = B * S.
- KV, one latent head shared by all query heads, in pages [pages, page_tokens, ...] (page and token
  strides free, last dim contiguous; token id = page * page_tokens + offset): either bf16 ckv [.., 512]
  and kpe [.., 64], or the FP8 cache: 656 contiguous bytes per token (512 e4m3, 4 fp32 scales one per
  128 values, 64 bf16 rope), pages 16-byte aligned.
- sparse_indices [T, topk] (or [B, S, topk]) int32: token ids, -1 = padding anywhere; duplicates count
  twice (as in the reference); topk_length (optional, one per row of the leading dim: [T], or [B])
  keeps only the first entries.
- output [T, H, 512] bf16 = softmax(sm_scale * (q_nope.ckv + q_pe.kpe)) . ckv over the valid
  ids; lse [T, H] fp32 in base 2 or e; an empty row gives output 0 and lse -inf (or empty_lse); the
  optional sink scales the output by 1 / (1 + exp(sink[h] - lse_e)) and leaves lse untouched; the
  optional max_logits [T, H] gets the largest scaled logit (-inf for an empty row).

Work split: a program owns BLOCK_H heads of one token and one split of its index row.
Split s of S takes the row positions s, s + S, s + 2S, ... (strided, so a row whose valid
ids sit at the front still spreads them over every split) in tiles of BLOCK_N. With one
split the program writes the final output; otherwise it writes fp32 partials (unnormalized
output, running max, running sum) and a second launch combines them exactly. No program
ever waits for another.

FP8 KV: under 64 heads the e4m3 values, exact in bf16, feed tl.dot as they are and each token's
four fp32 scales multiply its logits and its p per 128-value group (_sparse_mla_fp8_kernel); at 64
and 128 heads each group is dequantized to fp16 and one p feeds every dot, with fp16's range kept by
powers of two (_sparse_mla_fp8_f16_kernel).

Numerics: online softmax in the log2 domain (logits pre-multiplied by sm_scale * log2 e);
every exponent is taken against a finite reference, so a row or split with no valid id
yields p = 0, sum = 0 and never (-inf) - (-inf).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, replace
from typing import Callable, TypeVar

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..bad_index import MAX_INT32, BadIndexCounter, check_ids, checking
from ..errors import KernelInputError
from ..fp8 import (MLA_CKV_DIM, MLA_KPE_DIM, MLA_KPE_OFFSET, MLA_NUM_SCALES, MLA_SCALE_GROUP, MLA_SCALE_OFFSET,
                    MLA_TOKEN_BYTES)
from ..launch_math import cdiv, next_power_of_2
from ..triton_options import FP_FUSION
from ..tuned import Table, device_identity, table_path

# The Triton that builds these kernels, (major, minor): the configurations below depend on its compiler (config()).
TRITON_VERSION = tuple(int(x) for x in triton.__version__.split(".")[:2])
T = TypeVar("T")

# Triton's CPU interpreter computes bf16 tl.dot wrongly (errors near 1e10, silently): upcast to fp32 there.
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"

HEADS = (16, 32, 64, 128)
# The split formula's SM count when the tensors are not on a GPU (interpreter): the H200's.
H200_NUM_SMS = 132
# Rows of the combine tile: the most splits a launch may use. 64 splits of topk 2048 leave
# each split one 32-token tile (the small-grid configuration's); more would spend more on the
# combine than they save.
MAX_SPLITS = 64
# A combine program reduces a [heads, splits, COMBINE_BLOCK_D] block of partials of at most
# COMBINE_TILE values, all loaded before they are summed; fewer splits, more heads. The fastest column
# block and tile on the contest suite (docs/design.md, Measured choices, "Triton attention kernel").
# Two forms, by partials. fp32 partials (split_partials: this kernel's and mma_mla's, up to 64 splits) are
# reduced as one [heads, splits, columns] tile, faster than summing them split by split (same section).
# Scaled partials (the Hopper kernel's fp16, up to 32 splits) are summed split by split, unrolled, each
# thread holding every split's values, max, sum and factor: the tile's shuffles and shared memory were
# slower there.
COMBINE_BLOCK_D = 64
COMBINE_TILE = 8192
COMBINE_WARPS = 4
# Scaled partials (scaled_split_partials: the Hopper kernel's, whose splits hold a 64-token block at least,
# 32 of topk 2048) come in at most this many splits: at 64 a thread would hold each split's values, max, sum
# and factor, 256 registers, which spills.
SCALED_MAX_SPLITS = 32

# The most index positions a split holds at once (the split kernels load their split's ids once,
# before the loop; see _split_ids): tl.gather stages them in shared memory, 4 bytes each, 8 KB beside
# the 216 KB of the 64-head bf16 tiles. The contracts' largest topk is 2048,
# one split; longer rows take at least cdiv(topk, ROW_IDS_MAX) splits (num_splits_for).
ROW_IDS_MAX = 2048
# The fewest ids a program loads (ROW_PAD): shorter shares are padded up to it (masked, -1), one or two
# registers a thread, so that a kernel is built for 4 row lengths (256-2048), not 7 or 8 (fewest_ids).
ROW_IDS_MIN = 256

_LOG2E = tl.constexpr(1.4426950408889634)
_COMBINE_TILE = tl.constexpr(COMBINE_TILE)
# Scaled partials (scaled_split_partials): fp16 values, each half row with its own power-of-two factor.
SCALE_COLUMNS = MLA_CKV_DIM // 2
_SCALE_COLUMNS = tl.constexpr(SCALE_COLUMNS)
_D_CKV = tl.constexpr(MLA_CKV_DIM)
_D_KPE = tl.constexpr(MLA_KPE_DIM)
_TOKEN_BYTES = tl.constexpr(MLA_TOKEN_BYTES)
_NUM_SCALES = tl.constexpr(MLA_NUM_SCALES)
_SCALE_GROUP = tl.constexpr(MLA_SCALE_GROUP)
# FP8 tokens are addressed in 16-byte units (their alignment, which the vector loads keep knowing through the
# page arithmetic); within a token, its scales as 4-byte words and its rope values as 2-byte words.
UNIT_BYTES = 16
_UNIT_BYTES = tl.constexpr(UNIT_BYTES)
_TOKEN_UNITS = tl.constexpr(MLA_TOKEN_BYTES // UNIT_BYTES)
_SCALE_WORD32 = tl.constexpr(MLA_SCALE_OFFSET // 4)
_KPE_WORD16 = tl.constexpr(MLA_KPE_OFFSET // 2)
# The split kernels' runtime values that the JIT must not specialize on (a new build per value or per
# value's divisibility would buy nothing): the row's length and split count, the flags, the cache's size.
NOT_SPECIALIZED = ["topk", "num_splits", "has_topk_length", "has_sink", "has_max", "cache_tokens"]
# fp16's range on the fp16-tile FP8 path: fp16 ends at 65504, bf16 q and the fp32 scales do not.
_FP16_MAX = tl.constexpr(65504.0)
_BF16_PAST_FP16 = tl.constexpr(65536.0)  # a bf16 value rounds to fp16 inf from here (below: at most 65280)
_E4M3_MAX = tl.constexpr(448.0)
_MAX_TOKEN_SHIFT = tl.constexpr(15)  # P (<= 1) times 2^15 stays inside fp16


@triton.jit
def _finalize(acc, m, l, sink_ptr, heads, has_sink, lse_scale, empty_lse):
    """(unnormalized output [R, C], max [R], sum [R]) of R rows -> (output, lse); a row with no valid id
    gets output 0 and lse empty_lse."""
    empty = l == 0.0
    l_safe = tl.where(empty, 1.0, l)
    lse2 = m + tl.log2(l_safe)
    out = acc / l_safe[:, None]
    if has_sink:
        # 1 / (1 + exp(sink - lse_e)) in base 2. An empty row keeps its output of 0 unscaled: its lse is
        # -inf, and a sink of -inf would make the factor NaN.
        sink = tl.load(sink_ptr + heads)
        out = out / tl.where(empty, 1.0, 1.0 + tl.exp2(sink * _LOG2E - tl.where(empty, 0.0, lse2)))[:, None]
    return out, tl.where(empty, empty_lse, lse2 * lse_scale)


@triton.jit
def _row_share(topk_length_ptr, topk, req, split, num_splits, has_topk_length):
    """How many positions of a row of request req split `split` owns: split, split + S, ... below the
    request's length."""
    n_valid = topk
    if has_topk_length:
        n_valid = tl.maximum(tl.minimum(tl.load(topk_length_ptr + req), topk), 0)
    return (n_valid - split + num_splits - 1) // num_splits  # >= 0 as split < num_splits


@triton.jit
def _split_ids(row_ptr, n_mine, num_splits, cache_tokens, bad_count_ptr, ROW_PAD: tl.constexpr):
    """The ids of a split's n_mine positions [ROW_PAD], -1 past them, loaded once before the loop. Loaded
    per tile inside the loop instead, each tile's id load sat in the chain that leads to its rows' copies;
    hoisted, the pipelined loop only gathers them from shared memory (faster: docs/design.md, Measured
    choices, "Triton attention kernel").
    An id outside [0, cache_tokens) becomes -1 here, the one place ids enter, so no input value makes
    a gather leave the cache; all but -1 are added to *bad_count_ptr by the first head group only (every
    group loads the same ids), an atomic on the bad path alone."""
    jr = tl.arange(0, ROW_PAD)
    ids = tl.load(row_ptr + jr * num_splits, mask=jr < n_mine, other=-1)
    outside = (ids < 0) | (ids >= cache_tokens)
    n_bad = tl.sum((outside & (ids != -1)).to(tl.int32), 0)
    if (n_bad > 0) & (tl.program_id(0) == 0):
        tl.atomic_add(bad_count_ptr, n_bad)
    return tl.where(outside, -1, ids)


@triton.jit
def _tile_ids(ids, start, offs_n, ROW_PAD: tl.constexpr):
    """The ids of the tile at `start` [BLOCK_N]. The pipeliner computes the gathers of the tiles past the
    loop's end too (only their loads are predicated off), and the FP8 kernel's hand prefetch reads one
    tile past it, so positions are clamped into the ids; inside the loop no clamp applies, as ROW_PAD is
    a multiple of BLOCK_N and at least the split's share (row_pad)."""
    return tl.gather(ids, tl.minimum(start + offs_n, ROW_PAD - 1), 0)


@triton.jit
def _request(t, s_q):
    """Query token t's (request, position in it), int64 (offsets from them overflow int32 past
    2^31 / (128 x 576) tokens): s_q tokens a request (1: every token its own)."""
    req = t // s_q
    return req.to(tl.int64), (t - req * s_q).to(tl.int64)


@triton.jit
def _token_rows(idx, page_tokens, stride_page, stride_token):
    """The offsets of tokens idx [N] in a cache of pages of page_tokens tokens, stride_page apart, their
    tokens stride_token apart (int64: ids times a row overflow int32 on large caches). A cache whose pages
    are evenly strided is passed as pages of one token, which the JIT folds to idx * stride_page."""
    return ((idx // page_tokens).to(tl.int64) * stride_page
            + (idx % page_tokens).to(tl.int64) * stride_token)


@triton.jit
def _softmax_step(m_i, l_i, s, valid, sm_scale_log2):
    """Online softmax over one tile of raw logits s [H, N]: (new max, rescale of the old sums, p, new sum)."""
    s = tl.where(valid[None, :], s * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # finite: exp2(-inf - m_ref) = 0, never NaN
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    return m_new, alpha, p, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _write(acc, cols, m, l, t, split, heads, num_splits, has_sink, has_max, lse_scale, empty_lse, sink_ptr,
           out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h,
           stride_lse_t, stride_lse_h, HEADS: tl.constexpr, WITH_STATS: tl.constexpr):
    """Columns `cols` of a program's rows: the final output with one split, else the fp32 partial;
    WITH_STATS also writes lse and, where has_max, the largest scaled logit (or the partial max and sum)."""
    if num_splits == 1:
        out, lse = _finalize(acc, m, l, sink_ptr, heads, has_sink, lse_scale, empty_lse)
        t64 = t.to(tl.int64)  # t x the row stride overflows int32 past 2^31 / (128 x 512) tokens
        tl.store(out_ptr + t64 * stride_out_t + heads[:, None] * stride_out_h + cols[None, :], out.to(tl.bfloat16))
        if WITH_STATS:
            tl.store(lse_ptr + t64 * stride_lse_t + heads * stride_lse_h, lse)
            if has_max:
                tl.store(max_ptr + t64 * stride_lse_t + heads * stride_lse_h, m / _LOG2E)
    else:
        part = (t * num_splits + split) * HEADS + heads
        tl.store(part_acc_ptr + part[:, None].to(tl.int64) * _D_CKV + cols[None, :], acc)
        if WITH_STATS:
            tl.store(part_m_ptr + part, m)
            tl.store(part_l_ptr + part, l)


@triton.jit
def _write_groups(acc0, acc1, acc2, acc3, c, m, l, t, split, heads, num_splits, has_sink, has_max, lse_scale,
                  empty_lse, sink_ptr, out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t,
                  stride_out_h, stride_lse_t, stride_lse_h, HEADS: tl.constexpr):
    """_write of the FP8 kernels' four scale-group accumulators (columns c + g * 128), lse once."""
    _write(acc0, c, m, l, t, split, heads, num_splits, has_sink, has_max, lse_scale, empty_lse, sink_ptr, out_ptr,
           lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h, stride_lse_t,
           stride_lse_h, HEADS, True)
    _write(acc1, c + _SCALE_GROUP, m, l, t, split, heads, num_splits, has_sink, has_max, lse_scale, empty_lse,
           sink_ptr, out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h,
           stride_lse_t, stride_lse_h, HEADS, False)
    _write(acc2, c + 2 * _SCALE_GROUP, m, l, t, split, heads, num_splits, has_sink, has_max, lse_scale, empty_lse,
           sink_ptr, out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h,
           stride_lse_t, stride_lse_h, HEADS, False)
    _write(acc3, c + 3 * _SCALE_GROUP, m, l, t, split, heads, num_splits, has_sink, has_max, lse_scale, empty_lse,
           sink_ptr, out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h,
           stride_lse_t, stride_lse_h, HEADS, False)


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _sparse_mla_bf16_kernel(
    q_nope_ptr, q_pe_ptr, ckv_ptr, kpe_ptr, indices_ptr, topk_length_ptr, sink_ptr,
    out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, bad_count_ptr,
    sm_scale_log2, lse_scale, empty_lse, topk, num_splits, has_topk_length, has_sink, has_max, cache_tokens,
    s_q, page_tokens, stride_qn_b, stride_qn_s, stride_qn_h, stride_qp_b, stride_qp_s, stride_qp_h,
    stride_ckv_page, stride_ckv, stride_kpe_page, stride_kpe, stride_idx_b, stride_idx_s,
    stride_out_t, stride_out_h, stride_lse_t, stride_lse_h,
    HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST_DOT: tl.constexpr,
    ROW_PAD: tl.constexpr,
):
    """bf16 KV: ckv rows of 512 and kpe rows of 64 values, in pages of page_tokens tokens (_token_rows).
    q and the ids of query token t sit at (request, position) = _request(t, s_q). ROW_PAD: a power of two,
    a multiple of BLOCK_N, at least the split's share of the row (_split_ids)."""
    tl.static_assert(HEADS % BLOCK_H == 0, "a head group must not run past the last head")
    tl.static_assert(BLOCK_H >= 16 and BLOCK_N >= 16, "tl.dot needs tiles of at least 16")
    tl.static_assert(ROW_PAD % BLOCK_N == 0, "a tile inside the loop must not run past the split's ids")
    group = tl.program_id(0)  # fastest: the head groups of one (token, split) share gathered rows in L2
    split = tl.program_id(1)
    t = tl.program_id(2)
    req, pos = _request(t, s_q)
    # The interpreter also rounds fp32 -> bf16 toward zero, so its dot operands stay fp32 throughout.
    dot_dtype: tl.constexpr = tl.float32 if UPCAST_DOT else tl.bfloat16

    heads = group * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, _D_CKV)
    r = tl.arange(0, _D_KPE)
    q_nope = tl.load(q_nope_ptr + req * stride_qn_b + pos * stride_qn_s + heads[:, None] * stride_qn_h
                     + d[None, :]).to(dot_dtype)
    q_pe = tl.load(q_pe_ptr + req * stride_qp_b + pos * stride_qp_s + heads[:, None] * stride_qp_h
                   + r[None, :]).to(dot_dtype)
    n_mine = _row_share(topk_length_ptr, topk, req, split, num_splits, has_topk_length)
    ids = _split_ids(indices_ptr + req * stride_idx_b + pos * stride_idx_s + split, n_mine, num_splits,
                     cache_tokens, bad_count_ptr, ROW_PAD)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, _D_CKV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_mine, BLOCK_N):
        idx = _tile_ids(ids, start, offs_n, ROW_PAD)
        valid = idx >= 0
        ckv_rows = _token_rows(idx, page_tokens, stride_ckv_page, stride_ckv)
        kpe_rows = _token_rows(idx, page_tokens, stride_kpe_page, stride_kpe)
        kv = tl.load(ckv_ptr + ckv_rows[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(dot_dtype)
        kpe = tl.load(kpe_ptr + kpe_rows[:, None] + r[None, :], mask=valid[:, None], other=0.0).to(dot_dtype)
        s = tl.dot(q_pe, tl.trans(kpe), tl.dot(q_nope, tl.trans(kv)))
        m_i, alpha, p, l_i = _softmax_step(m_i, l_i, s, valid, sm_scale_log2)
        acc = tl.dot(p.to(dot_dtype), kv, acc * alpha[:, None])

    _write(acc, d, m_i, l_i, t, split, heads, num_splits, has_sink, has_max, lse_scale, empty_lse, sink_ptr,
           out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t, stride_out_h,
           stride_lse_t, stride_lse_h, HEADS, True)


@triton.jit
def _fp8_tokens(kv_ptr, idx, c, page_tokens, page_units):
    """One tile's FP8 tokens from their ids [N]: valid, where each token starts (int64, in 16-byte units:
    pages of page_tokens tokens, page_units apart; page_tokens 1: tokens 656 bytes apart) and the pointers
    [N, 128] to their first group of e4m3 values (group g at + g * 128)."""
    valid = idx >= 0
    if page_tokens == 1:  # one run of tokens (the JIT's constant): a constant stride, which keeps the 32-head
        unit = idx.to(tl.int64) * _TOKEN_UNITS  # tile in registers where a runtime one spills
    else:
        unit = _token_rows(idx, page_tokens, page_units, _TOKEN_UNITS)
    e_ptr = kv_ptr.to(tl.pointer_type(tl.float8e4nv)) + unit[:, None] * _UNIT_BYTES + c[None, :]
    return valid, unit, e_ptr


@triton.jit
def _fp8_scales_rope(kv_ptr, unit, valid, r):
    """The 4 fp32 scales [N] and rope values [N, 64] bf16 of the tokens that start at `unit`."""
    sc_ptr = kv_ptr.to(tl.pointer_type(tl.float32)) + unit * (_UNIT_BYTES // 4) + _SCALE_WORD32
    sc0 = tl.load(sc_ptr, mask=valid, other=0.0)
    sc1 = tl.load(sc_ptr + 1, mask=valid, other=0.0)
    sc2 = tl.load(sc_ptr + 2, mask=valid, other=0.0)
    sc3 = tl.load(sc_ptr + 3, mask=valid, other=0.0)
    kpe = tl.load(kv_ptr.to(tl.pointer_type(tl.bfloat16)) + unit[:, None] * (_UNIT_BYTES // 2) + _KPE_WORD16
                  + r[None, :], mask=valid[:, None], other=0.0)
    return sc0, sc1, sc2, sc3, kpe


@triton.jit
def _gather_fp8(kv_ptr, idx, c, r, page_tokens, page_units):
    """One tile of FP8 tokens (ids idx [N]), raw: valid, the 4 groups of 128 e4m3 values [N, 128],
    their 4 fp32 scales [N], the rope values [N, 64] bf16."""
    valid, unit, e_ptr = _fp8_tokens(kv_ptr, idx, c, page_tokens, page_units)
    e0 = tl.load(e_ptr, mask=valid[:, None], other=0.0)
    e1 = tl.load(e_ptr + _SCALE_GROUP, mask=valid[:, None], other=0.0)
    e2 = tl.load(e_ptr + 2 * _SCALE_GROUP, mask=valid[:, None], other=0.0)
    e3 = tl.load(e_ptr + 3 * _SCALE_GROUP, mask=valid[:, None], other=0.0)
    sc0, sc1, sc2, sc3, kpe = _fp8_scales_rope(kv_ptr, unit, valid, r)
    return valid, e0, e1, e2, e3, sc0, sc1, sc2, sc3, kpe


@triton.jit
def _load_q_groups(q_nope_ptr, q_pe_ptr, req, pos, heads, c, r, stride_qn_b, stride_qn_s, stride_qn_h,
                   stride_qp_b, stride_qp_s, stride_qp_h, dtype: tl.constexpr):
    """The q of a request's token for the FP8 kernels, as dtype: the four 128-value ckv groups [heads, 128]
    and the rope values [heads, 64] (c and r: the column ranges of each)."""
    q_ptr = q_nope_ptr + req * stride_qn_b + pos * stride_qn_s + heads[:, None] * stride_qn_h + c[None, :]
    q0 = tl.load(q_ptr).to(dtype)
    q1 = tl.load(q_ptr + _SCALE_GROUP).to(dtype)
    q2 = tl.load(q_ptr + 2 * _SCALE_GROUP).to(dtype)
    q3 = tl.load(q_ptr + 3 * _SCALE_GROUP).to(dtype)
    q_pe = tl.load(q_pe_ptr + req * stride_qp_b + pos * stride_qp_s + heads[:, None] * stride_qp_h
                   + r[None, :]).to(dtype)
    return q0, q1, q2, q3, q_pe


@triton.jit
def _fp8_program(HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, ROW_PAD: tl.constexpr):
    """What both FP8 kernels assume, checked, and where a program sits: (split, token, its heads [BLOCK_H],
    a scale group's columns [128], the rope columns [64])."""
    tl.static_assert(HEADS % BLOCK_H == 0, "a head group must not run past the last head")
    tl.static_assert(BLOCK_H >= 16 and BLOCK_N >= 16, "tl.dot needs tiles of at least 16")
    tl.static_assert(_NUM_SCALES == 4 and _NUM_SCALES * _SCALE_GROUP == _D_CKV,
                     "the kernel spells out 4 scale groups that tile the 512 ckv values")
    tl.static_assert(_TOKEN_BYTES % _UNIT_BYTES == 0, "FP8 tokens are whole 16-byte units")
    tl.static_assert(ROW_PAD % BLOCK_N == 0, "a tile inside the loop must not run past the split's ids")
    heads = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)  # axis 0 fastest: head groups share rows in L2
    return tl.program_id(1), tl.program_id(2), heads, tl.arange(0, _SCALE_GROUP), tl.arange(0, _D_KPE)


@triton.jit
def _fp8_state(BLOCK_H: tl.constexpr):
    """An empty online softmax of the FP8 kernels: row maxima, row sums, one accumulator per scale group."""
    return (tl.full([BLOCK_H], float("-inf"), tl.float32), tl.zeros([BLOCK_H], tl.float32),
            tl.zeros([BLOCK_H, _SCALE_GROUP], tl.float32), tl.zeros([BLOCK_H, _SCALE_GROUP], tl.float32),
            tl.zeros([BLOCK_H, _SCALE_GROUP], tl.float32), tl.zeros([BLOCK_H, _SCALE_GROUP], tl.float32))


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _sparse_mla_fp8_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, unused_ptr, indices_ptr, topk_length_ptr, sink_ptr,
    out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, bad_count_ptr,
    sm_scale_log2, lse_scale, empty_lse, topk, num_splits, has_topk_length, has_sink, has_max, cache_tokens,
    s_q, page_tokens, stride_qn_b, stride_qn_s, stride_qn_h, stride_qp_b, stride_qp_s, stride_qp_h,
    stride_kv_page16, unused_stride_a, unused_stride_b, unused_stride_c, stride_idx_b, stride_idx_s,
    stride_out_t, stride_out_h, stride_lse_t, stride_lse_h,
    HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST_DOT: tl.constexpr,
    ROW_PAD: tl.constexpr,
):
    """FP8 KV under 64 heads (656-byte tokens in pages stride_kv_page16 x 16 bytes apart; otherwise the
    bf16 kernel's arguments, the second cache and its strides unused). The e4m3 values are exact in bf16, so
    the tiles feed tl.dot undequantized and each group's fp32 scale multiplies its part of the logits and of
    p instead: the result equals fp32 dequantization up to the rounding of p, as in the bf16 path (rounding
    dequantized values to bf16 instead fails the contest tolerance on peaked rows)."""
    split, t, heads, c, r = _fp8_program(HEADS, BLOCK_H, BLOCK_N, ROW_PAD)
    dot_dtype: tl.constexpr = tl.float32 if UPCAST_DOT else tl.bfloat16

    req, pos = _request(t, s_q)
    q0, q1, q2, q3, q_pe = _load_q_groups(q_nope_ptr, q_pe_ptr, req, pos, heads, c, r, stride_qn_b, stride_qn_s,
                                          stride_qn_h, stride_qp_b, stride_qp_s, stride_qp_h, dot_dtype)
    n_mine = _row_share(topk_length_ptr, topk, req, split, num_splits, has_topk_length)
    ids = _split_ids(indices_ptr + req * stride_idx_b + pos * stride_idx_s + split, n_mine, num_splits,
                     cache_tokens, bad_count_ptr, ROW_PAD)

    m_i, l_i, acc0, acc1, acc2, acc3 = _fp8_state(BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    # With mma.sync tiles Triton's pipeliner does not prefetch a load that reaches tl.dot through a
    # conversion, so the next tile's bytes are loaded into registers by hand while this one computes.
    nv, ne0, ne1, ne2, ne3, ns0, ns1, ns2, ns3, nkpe = _gather_fp8(kv_ptr, _tile_ids(ids, 0, offs_n, ROW_PAD), c, r,
                                                                   page_tokens, stride_kv_page16)
    for start in range(0, n_mine, BLOCK_N):
        valid, e0, e1, e2, e3, sc0, sc1, sc2, sc3, kpe = nv, ne0, ne1, ne2, ne3, ns0, ns1, ns2, ns3, nkpe
        nv, ne0, ne1, ne2, ne3, ns0, ns1, ns2, ns3, nkpe = _gather_fp8(
            kv_ptr, _tile_ids(ids, start + BLOCK_N, offs_n, ROW_PAD), c, r, page_tokens, stride_kv_page16)
        e0 = e0.to(dot_dtype)
        e1 = e1.to(dot_dtype)
        e2 = e2.to(dot_dtype)
        e3 = e3.to(dot_dtype)
        s = tl.dot(q_pe, tl.trans(kpe.to(dot_dtype)))
        s += tl.dot(q0, tl.trans(e0)) * sc0[None, :]
        s += tl.dot(q1, tl.trans(e1)) * sc1[None, :]
        s += tl.dot(q2, tl.trans(e2)) * sc2[None, :]
        s += tl.dot(q3, tl.trans(e3)) * sc3[None, :]
        m_i, alpha, p, l_i = _softmax_step(m_i, l_i, s, valid, sm_scale_log2)
        acc0 = tl.dot((p * sc0[None, :]).to(dot_dtype), e0, acc0 * alpha[:, None])
        acc1 = tl.dot((p * sc1[None, :]).to(dot_dtype), e1, acc1 * alpha[:, None])
        acc2 = tl.dot((p * sc2[None, :]).to(dot_dtype), e2, acc2 * alpha[:, None])
        acc3 = tl.dot((p * sc3[None, :]).to(dot_dtype), e3, acc3 * alpha[:, None])

    _write_groups(acc0, acc1, acc2, acc3, c, m_i, l_i, t, split, heads, num_splits, has_sink, has_max, lse_scale,
                  empty_lse, sink_ptr, out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t,
                  stride_out_h, stride_lse_t, stride_lse_h, HEADS)


@triton.jit
def _exponent(x):
    """floor(log2(x)) of positive normal fp32 values, exactly (from the bits)."""
    return ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _token_shift(sc0, sc1, sc2, sc3, kpe):
    """Per token [N], the power of two its fp16 values are scaled down by: min(E - 14, 15) where its largest
    dequantized value (448 x its largest scale) or rope value (kpe, fp32 [N, 64]) reaches 65504, else 0."""
    largest = tl.maximum(tl.maximum(tl.abs(sc0), tl.abs(sc1)), tl.maximum(tl.abs(sc2), tl.abs(sc3)))
    largest = tl.maximum(largest * _E4M3_MAX, tl.max(tl.abs(kpe), 1))
    return tl.where(largest >= _FP16_MAX, tl.minimum(_exponent(largest) - 14, _MAX_TOKEN_SHIFT), 0)


@triton.jit
def _dequant_f16(e_ptr, valid, scale, dot_dtype: tl.constexpr):
    """One group of e4m3 values [N, 128] times its tokens' scales [N] (shift included), rounded once to fp16."""
    e = tl.load(e_ptr, mask=valid[:, None], other=0.0)
    return (e.to(tl.float32) * scale[:, None]).to(tl.float16).to(dot_dtype)


@triton.jit
def _to_f16(x, down, dot_dtype: tl.constexpr):
    """fp32 rows [R, C] times their powers of two down [R], rounded to fp16."""
    return (x * down[:, None]).to(tl.float16).to(dot_dtype)


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _sparse_mla_fp8_f16_kernel(
    q_nope_ptr, q_pe_ptr, kv_ptr, unused_ptr, indices_ptr, topk_length_ptr, sink_ptr,
    out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, bad_count_ptr,
    sm_scale_log2, lse_scale, empty_lse, topk, num_splits, has_topk_length, has_sink, has_max, cache_tokens,
    s_q, page_tokens, stride_qn_b, stride_qn_s, stride_qn_h, stride_qp_b, stride_qp_s, stride_qp_h,
    stride_kv_page16, unused_stride_a, unused_stride_b, unused_stride_c, stride_idx_b, stride_idx_s,
    stride_out_t, stride_out_h, stride_lse_t, stride_lse_h,
    HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST_DOT: tl.constexpr,
    ROW_PAD: tl.constexpr,
):
    """FP8 KV at 64+ heads (the FP8 kernel's arguments). Each token's 128-value groups are dequantized to
    fp16 (e4m3 x fp32 scale, rounded once: bf16 rounding fails the contest tolerance, hopper_mla.cu), q is
    converted to fp16 once, the five logit dots chain into one accumulator and one fp16 p feeds the four
    output dots. fp16's range as in the Hopper kernel: a q row whose largest value reaches 2^16 is scaled
    by 2^-(E - 15), a token whose largest dequantized or rope value reaches 65504 by 2^-min(E - 14, 15),
    both undone in fp32 on the logits and the token's shift on its p before the fp16 rounding (exact up to
    token values of 2^31). Per group, not one [N, 512] tile: the whole tile's fp32 values beside the
    accumulator spilled 364 bytes (Triton 3.6, sm_90a)."""
    split, t, heads, c, r = _fp8_program(HEADS, BLOCK_H, BLOCK_N, ROW_PAD)
    # Rounded to fp16 in any case (the interpreter, whose bf16 dot is wrong, then multiplies in fp32).
    dot_dtype: tl.constexpr = tl.float32 if UPCAST_DOT else tl.float16

    req, pos = _request(t, s_q)
    q0, q1, q2, q3, q_pe = _load_q_groups(q_nope_ptr, q_pe_ptr, req, pos, heads, c, r, stride_qn_b, stride_qn_s,
                                          stride_qn_h, stride_qp_b, stride_qp_s, stride_qp_h, tl.float32)
    q_max = tl.maximum(tl.maximum(tl.max(tl.abs(q0), 1), tl.max(tl.abs(q1), 1)),
                       tl.maximum(tl.max(tl.abs(q2), 1), tl.max(tl.abs(q3), 1)))
    q_max = tl.maximum(q_max, tl.max(tl.abs(q_pe), 1))
    q_shift = tl.where(q_max >= _BF16_PAST_FP16, _exponent(q_max) - 15, 0).to(tl.float32)
    q_down = tl.exp2(-q_shift)
    q0 = _to_f16(q0, q_down, dot_dtype)
    q1 = _to_f16(q1, q_down, dot_dtype)
    q2 = _to_f16(q2, q_down, dot_dtype)
    q3 = _to_f16(q3, q_down, dot_dtype)
    q_pe = _to_f16(q_pe, q_down, dot_dtype)
    q_up = tl.exp2(q_shift)
    n_mine = _row_share(topk_length_ptr, topk, req, split, num_splits, has_topk_length)
    ids = _split_ids(indices_ptr + req * stride_idx_b + pos * stride_idx_s + split, n_mine, num_splits,
                     cache_tokens, bad_count_ptr, ROW_PAD)

    m_i, l_i, acc0, acc1, acc2, acc3 = _fp8_state(BLOCK_H)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_mine, BLOCK_N):
        valid, unit, e_ptr = _fp8_tokens(kv_ptr, _tile_ids(ids, start, offs_n, ROW_PAD), c, page_tokens,
                                         stride_kv_page16)
        sc0, sc1, sc2, sc3, kpe = _fp8_scales_rope(kv_ptr, unit, valid, r)
        kpe = kpe.to(tl.float32)
        k_shift = _token_shift(sc0, sc1, sc2, sc3, kpe)
        k_down = tl.exp2(-k_shift.to(tl.float32))
        k_up = tl.exp2(k_shift.to(tl.float32))
        # Each group dequantized next to its dot, so that one group's fp32 values are live at a time.
        s = tl.dot(q_pe, tl.trans(_to_f16(kpe, k_down, dot_dtype)))
        kv0 = _dequant_f16(e_ptr, valid, sc0 * k_down, dot_dtype)
        s = tl.dot(q0, tl.trans(kv0), s)
        kv1 = _dequant_f16(e_ptr + _SCALE_GROUP, valid, sc1 * k_down, dot_dtype)
        s = tl.dot(q1, tl.trans(kv1), s)
        kv2 = _dequant_f16(e_ptr + 2 * _SCALE_GROUP, valid, sc2 * k_down, dot_dtype)
        s = tl.dot(q2, tl.trans(kv2), s)
        kv3 = _dequant_f16(e_ptr + 3 * _SCALE_GROUP, valid, sc3 * k_down, dot_dtype)
        s = tl.dot(q3, tl.trans(kv3), s)
        s = s * q_up[:, None] * k_up[None, :]
        m_i, alpha, p, l_i = _softmax_step(m_i, l_i, s, valid, sm_scale_log2)
        p = (p * k_up[None, :]).to(tl.float16).to(dot_dtype)
        acc0 = tl.dot(p, kv0, acc0 * alpha[:, None])
        acc1 = tl.dot(p, kv1, acc1 * alpha[:, None])
        acc2 = tl.dot(p, kv2, acc2 * alpha[:, None])
        acc3 = tl.dot(p, kv3, acc3 * alpha[:, None])

    _write_groups(acc0, acc1, acc2, acc3, c, m_i, l_i, t, split, heads, num_splits, has_sink, has_max, lse_scale,
                  empty_lse, sink_ptr, out_ptr, lse_ptr, max_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, stride_out_t,
                  stride_out_h, stride_lse_t, stride_lse_h, HEADS)


@triton.jit(do_not_specialize=["num_splits", "has_sink", "has_max"])
def _sparse_mla_combine_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, part_scale_ptr, sink_ptr, out_ptr, lse_ptr, max_ptr,
    lse_scale, empty_lse, num_heads, num_splits, has_sink, has_max, stride_out_t, stride_out_h, stride_lse_t,
    stride_lse_h,
    SPLITS_PAD: tl.constexpr, BLOCK_HC: tl.constexpr, BLOCK_D: tl.constexpr, SCALED: tl.constexpr,
):
    """Program (column block, head block, token): reduce the splits' partials exactly (SCALED: fp16
    values times their half row's factor)."""
    tl.static_assert(_D_CKV % BLOCK_D == 0, "the column blocks tile the output row exactly")
    tl.static_assert(_SCALE_COLUMNS % BLOCK_D == 0, "a column block lies in one scaled half row")
    tl.static_assert(SPLITS_PAD * BLOCK_HC * BLOCK_D <= _COMBINE_TILE, "the partial tile fits in registers")
    chunk = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_HC + tl.arange(0, BLOCK_HC)
    t = tl.program_id(2).to(tl.int64)
    d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
    if SCALED:  # split by split, unrolled: every split's loads issued before their sums
        half = chunk * BLOCK_D // _SCALE_COLUMNS
        m_all = tl.full([BLOCK_HC], float("-inf"), tl.float32)
        for s in tl.static_range(SPLITS_PAD):
            part = (t * num_splits + s) * num_heads + heads
            live = tl.full([BLOCK_HC], s, tl.int32) < num_splits  # a tensor: the interpreter takes no scalar mask
            m_all = tl.maximum(m_all, tl.load(part_m_ptr + part, mask=live, other=float("-inf")))
        ref = tl.where(m_all == float("-inf"), 0.0, m_all)  # empty splits weigh 0
        acc = tl.zeros([BLOCK_HC, BLOCK_D], tl.float32)
        l_all = tl.zeros([BLOCK_HC], tl.float32)
        for s in tl.static_range(SPLITS_PAD):
            part = (t * num_splits + s) * num_heads + heads
            live = tl.full([BLOCK_HC], s, tl.int32) < num_splits
            values = tl.load(part_acc_ptr + part[:, None].to(tl.int64) * _D_CKV + d[None, :], mask=live[:, None],
                             other=0.0)
            w = tl.exp2(tl.load(part_m_ptr + part, mask=live, other=float("-inf")) - ref)
            l_all += w * tl.load(part_l_ptr + part, mask=live, other=0.0)
            w *= tl.load(part_scale_ptr + part * (_D_CKV // _SCALE_COLUMNS) + half, mask=live, other=0.0)
            acc += w[:, None] * values.to(tl.float32)
    else:  # one [heads, splits, columns] tile, every load issued before any is used
        s = tl.arange(0, SPLITS_PAD)
        in_use = s < num_splits
        # Splits second: Triton lays warps along the first axis, so the reduction over splits stays in
        # registers (with splits first it went through shared memory).
        part = (t * num_splits + s[None, :]) * num_heads + heads[:, None]
        values = tl.load(part_acc_ptr + part[:, :, None].to(tl.int64) * _D_CKV + d[None, None, :],
                         mask=in_use[None, :, None], other=0.0)
        m = tl.load(part_m_ptr + part, mask=in_use[None, :], other=float("-inf"))
        l = tl.load(part_l_ptr + part, mask=in_use[None, :], other=0.0)
        m_all = tl.max(m, 1)
        w = tl.exp2(m - tl.where(m_all == float("-inf"), 0.0, m_all)[:, None])  # empty splits weigh 0
        acc = tl.sum(w[:, :, None] * values, 1)
        l_all = tl.sum(w * l, 1)
    out, lse = _finalize(acc, m_all, l_all, sink_ptr, heads, has_sink, lse_scale, empty_lse)
    tl.store(out_ptr + t * stride_out_t + heads[:, None] * stride_out_h + d[None, :], out.to(tl.bfloat16))
    if chunk == 0:
        tl.store(lse_ptr + t * stride_lse_t + heads * stride_lse_h, lse)
        if has_max:
            tl.store(max_ptr + t * stride_lse_t + heads * stride_lse_h, m_all / _LOG2E)


@dataclass(frozen=True)
class Config:
    block_h: int  # heads per program
    block_n: int  # gathered tokens per step
    num_warps: int
    num_stages: int
    f16: bool = False  # FP8 KV: _sparse_mla_fp8_f16_kernel (fp16 tiles) instead of _sparse_mla_fp8_kernel


# The opt-in shared memory a block gets on the GPUs the configurations below were built for (sm_90, sm_100:
# 227 KB). On a GPU with less (sm_120, RTX 50 and RTX PRO Blackwell: 99 KB), where Triton issues no
# wgmma, those tiles need 114-240 KB even at one stage (sm120a builds, Triton 3.6): from 32 heads a launch there
# takes COMPACT, 32 heads x 32 tokens a program (72 KB FP8, 80 KB bf16, no spills), more head groups at 64+.
HOPPER_SHARED_PER_BLOCK = 232448
COMPACT = Config(block_h=32, block_n=32, num_warps=8, num_stages=2)

# The configurations depend on the Triton that builds them: its code and its ptxas decide whether a tile fits
# in 255 registers, so config() keys them on TRITON_VERSION. Each choice builds without spills for sm90a and
# sm100a under its Triton (tests/test_build.py); the measured ones are Triton 3.6's, the GPU image's.
WIDE_TILE_TRITON = ((3, 6), (3, 8))  # the first and last (major, minor) that build 64 heads x 64 tokens cleanly


def config(heads: int, fp8kv: bool, compact: bool = False, version: tuple[int, int] = TRITON_VERSION) -> Config:
    """Tile configuration per head count for grids that fill the GPU, under Triton `version`. 64 heads x 64
    tokens with 8 warps is the only shape where Triton issues wgmma (docs/design.md, Measured choices, "Triton
    attention kernel", for it and the FP8 kernel's tiles and stages). Fewer heads keep the whole head axis in
    one program, as every extra head group re-gathers the same KV rows. Under 64 heads FP8 tiles are 32
    tokens: the hand-prefetched next tile would not fit in registers at 64. compact: COMPACT from 32 heads.
    Where a Triton spills the measured tile it takes the nearest that fits (not yet timed on a GPU; row_tile()
    for one row length):
    - 64+ heads outside WIDE_TILE_TRITON: 32 heads a program (180-253 registers). 3.5's code spills the 64-head
      tiles (104-144 bytes at sm_90a), and from 3.9 ptxas 13, which then assembles sm_90 too (244-284 bytes);
    - 16 heads with bf16 KV from 3.7, whose ptxas 13 for sm_100a spills the 8-warp tile (12 bytes at one row
      length): 4 warps (185-208 registers)."""
    if compact and heads >= COMPACT.block_h:
        return COMPACT
    if heads >= 64:
        block_h = 64 if WIDE_TILE_TRITON[0] <= version <= WIDE_TILE_TRITON[1] else 32
        if fp8kv:
            return Config(block_h=block_h, block_n=64, num_warps=8, num_stages=3, f16=True)
        return Config(block_h=block_h, block_n=64, num_warps=8, num_stages=2)
    if fp8kv:
        return Config(block_h=heads, block_n=32, num_warps=8, num_stages=2)
    return Config(block_h=heads, block_n=64, num_warps=4 if heads == 16 and version >= (3, 7) else 8, num_stages=2)


def fewest_ids(cfg: Config, version: tuple[int, int] = TRITON_VERSION) -> int:
    """The fewest index positions a split of `cfg` loads under Triton `version` (ROW_PAD's smallest):
    ROW_IDS_MIN, more where that Triton's build of the 32-head FP8 tile (COMPACT too: the same tile) spills
    at a short row (more masked ids; ptxas allocates each row length's kernel differently)."""
    if cfg == config(32, True, version=version) and version == (3, 8):
        return 1024  # 512 ids spill 4 bytes at sm_100a
    if cfg == config(32, True, version=version) and version >= (3, 9):
        return 512  # 256 ids spill 8 bytes at sm_90a
    return ROW_IDS_MIN


def row_tile(cfg: Config, pad: int, version: tuple[int, int] = TRITON_VERSION) -> Config:
    """The tile a launch of `cfg` with ROW_PAD `pad` builds under Triton `version`: cfg, but the 64-head FP8
    tile (64 tokens, 3 stages) spills 12-24 bytes at 2048 ids (sm_90a, 3.6-3.8), so a split of over 1024 ids
    takes 32-token tiles at 4 stages (no spills at sm90a or sm100a)."""
    if cfg == config(64, True, version=version) and cfg.block_h == 64 and pad > 1024:
        return replace(cfg, block_n=32, num_stages=4)
    return cfg


# Grids under one wave at 16 heads with bf16 KV. A program's time is its chain of dependent loads
# (indices, then rows), so below a full wave fewer, larger loads per program win (docs/design.md,
# Measured choices, "Triton attention kernel", for the measurements):
# - small grids, where even one program per 64-token tile leaves over half of the SMs idle:
#   32-token tiles, 4 warps, twice the splits;
# - grids of one 64-token tile a program in one wave keep config();
# - beyond that, while one program per 128-token tile fits in one wave: that one tile, all its rows
#   requested at once (one stage: two of 108 KB do not fit). Loading the next tile's rows by hand
#   instead (a prefetch as the FP8 kernel's) was slower.
# At 32 heads the 4-warp accumulator alone would take 128 registers a thread, and the one-tile
# configuration (233 registers at 16 heads) has no room for the 32 more its accumulator would need.
SMALL_GRID_HEADS = 16
_SMALL_GRID = Config(block_h=SMALL_GRID_HEADS, block_n=32, num_warps=4, num_stages=2)
_ONE_TILE = Config(block_h=SMALL_GRID_HEADS, block_n=128, num_warps=8, num_stages=1)
# Triton 3.6 builds the one-tile configuration in 233 registers; 3.7 and later spill it (544 bytes of stack at
# sm_90a), so they keep the 64-token tile.
_ONE_TILE_BUILDS_CLEANLY = TRITON_VERSION < (3, 7)


def launch_config(num_tokens: int, heads: int, topk: int, fp8kv: bool, num_sms: int,
                  compact: bool = False) -> Config:
    """The configuration a launch uses: config(), or at 16 heads with bf16 KV one for grids under
    one wave (above)."""
    cfg = config(heads, fp8kv, compact)
    if fp8kv or heads != SMALL_GRID_HEADS:
        return cfg
    programs_of_one_tile = num_tokens * cdiv(topk, cfg.block_n)
    if programs_of_one_tile <= num_sms // 2:
        return _SMALL_GRID
    if (_ONE_TILE_BUILDS_CLEANLY and programs_of_one_tile > num_sms
            and num_tokens * cdiv(topk, _ONE_TILE.block_n) <= num_sms):
        return _ONE_TILE
    return cfg


def configs(heads: int, fp8kv: bool, compact: bool = False) -> list[Config]:
    """Every configuration launch_config() can pick for this head count and KV form."""
    if fp8kv or heads != SMALL_GRID_HEADS:
        return [config(heads, fp8kv, compact)]
    return [config(heads, fp8kv), _SMALL_GRID] + ([_ONE_TILE] if _ONE_TILE_BUILDS_CLEANLY else [])


# Per-program cost beyond its tiles (loading q, writing the partial), in tiles, for the split choice.
PROGRAM_OVERHEAD_TILES = 1


def num_splits_for(num_tokens: int, heads: int, topk: int, cfg: Config, num_sms: int,
                   partial_tiles: float = 0.0, *, max_splits: int = MAX_SPLITS, row_ids_max: int = ROW_IDS_MAX) -> int:
    """Splits per (token, head group), so that the grid fills the SMs: split_choice()'s count."""
    return split_choice(num_tokens, heads, topk, cfg, num_sms, partial_tiles, max_splits=max_splits,
                        row_ids_max=row_ids_max)[0]


@functools.lru_cache(maxsize=None)
def split_choice(num_tokens: int, heads: int, topk: int, cfg: Config, num_sms: int,
                 partial_tiles: float = 0.0, *, max_splits: int = MAX_SPLITS,
                 row_ids_max: int = ROW_IDS_MAX) -> tuple[int, float]:
    """(splits, cost): the split count per (token, head group) that minimizes
    waves x (tiles per split + PROGRAM_OVERHEAD_TILES) + partial_tiles x programs / SMs, where
    waves = ceil(programs / SMs), one program per SM at a time (the large configurations fill an
    SM's shared memory), and the last term (with more than one split) is the partials' write and
    combine read, partial_tiles tiles a program spread over the SMs; ties go to fewer splits (less
    combine). This launcher leaves partial_tiles at 0: without it its picks were the fastest measured
    (docs/design.md, Measured choices, "Triton attention kernel"). The Hopper kernel's larger partials need it
    (hopper_mla.PARTIAL_TILES).
    Contest T=8 at 16 heads: 16 splits, 128 programs of 2 tiles; 128 heads at T=128: 1 split. Rows over
    ROW_IDS_MAX take at least the splits that hold them (past MAX_SPLITS the launcher refuses them).
    Another kernel passes its own split limit and the most ids a split of it holds. The cost is the busiest
    SM's, in tiles, so that a launcher can compare ways to cut a call into launches."""
    tiles = cdiv(topk, cfg.block_n)
    fewest = cdiv(topk, row_ids_max)
    rows = num_tokens * cdiv(heads, cfg.block_h)  # a tile wider than the heads still takes a program

    def cost(splits: int) -> tuple[float, int]:
        programs = rows * splits
        partials = partial_tiles * programs / num_sms if splits > 1 else 0.0
        return cdiv(programs, num_sms) * (cdiv(tiles, splits) + PROGRAM_OVERHEAD_TILES) + partials, splits

    best = min(range(fewest, max(fewest, min(tiles, max_splits)) + 1), key=cost)
    return best, cost(best)[0]


# `dsactl tune`'s table (kernels/tuned.py): per GPU and shape bucket, the knobs that beat the hand-picked
# configuration there. An entry holds every knob of a launch: a Config and the split count.
TUNED = Table(table_path(__file__))
TUNED_KNOBS = ("block_h", "block_n", "num_warps", "num_stages", "f16", "num_splits")
# The warps and stages a tuned configuration may ask for: those the hand-picked ones use, and one stage more
# (a fourth stage of 64-token bf16 tiles, 74 KB each, passes the 228 KB of shared memory of a Hopper SM).
TUNED_WARPS = (4, 8)
TUNED_STAGES = (1, 2, 3)


def tuning_bucket(num_tokens: int, heads: int, topk: int, fp8kv: bool) -> str:
    """A call's bucket in the table: heads, KV format, topk, and the tokens rounded up to a power of two
    (the hand-picked choice changes at powers of two of the grid, too)."""
    return f"h{heads}-{'fp8' if fp8kv else 'bf16'}-topk{topk}-t{next_power_of_2(num_tokens)}"


def hand_picked(num_tokens: int, heads: int, topk: int, fp8kv: bool, num_sms: int,
                compact: bool = False) -> tuple[Config, int]:
    """(config, splits) without a table: launch_config() and the split formula."""
    cfg = launch_config(num_tokens, heads, topk, fp8kv, num_sms, compact)
    return cfg, num_splits_for(num_tokens, heads, topk, cfg, num_sms)


def tuned_launch(knobs: dict, heads: int, topk: int, fp8kv: bool) -> tuple[Config, int]:
    """A table entry's (config, splits), held to what the hand-picked ones satisfy, else KernelInputError:
    the KV format's kernel, whole head groups of at least 16 (tl.dot), power-of-two tiles whose row
    padding they divide, warps and stages as above, a split count the combine and the id staging take."""
    _check(sorted(knobs) == sorted(TUNED_KNOBS), f"a tuned entry names the knobs {', '.join(TUNED_KNOBS)}")
    _check(type(knobs["f16"]) is bool and all(type(knobs[k]) is int for k in TUNED_KNOBS if k != "f16"),
           "tuned knobs are integers (f16: a boolean)")
    cfg = Config(*(knobs[k] for k in TUNED_KNOBS[:-1]))
    splits = knobs["num_splits"]
    _check(cfg.f16 in (config(heads, fp8kv).f16, config(heads, fp8kv, compact=True).f16),
           f"f16 tiles {cfg.f16} do not match the KV format's kernel")
    _check(cfg.block_h >= 16 and heads % cfg.block_h == 0 and cfg.block_h & (cfg.block_h - 1) == 0,
           f"block_h {cfg.block_h} does not tile {heads} heads")
    _check(16 <= cfg.block_n <= ROW_IDS_MIN and cfg.block_n & (cfg.block_n - 1) == 0,
           f"block_n {cfg.block_n} is not a power of two in [16, {ROW_IDS_MIN}]")
    _check(cfg.num_warps in TUNED_WARPS and cfg.num_stages in TUNED_STAGES,
           f"{cfg.num_warps} warps and {cfg.num_stages} stages are outside {TUNED_WARPS} and {TUNED_STAGES}")
    _check(1 <= splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {splits}")
    row_pad(topk, splits, cfg)
    return cfg, splits


def launch_plan(num_tokens: int, heads: int, topk: int, fp8kv: bool, device: torch.device) -> tuple[Config, int]:
    """(config, splits) of a launch: this GPU's tuned entry for the call's bucket, else hand_picked()."""
    return TUNED.choose(device_identity(device), tuning_bucket(num_tokens, heads, topk, fp8kv),
                        lambda knobs: tuned_launch(knobs, heads, topk, fp8kv),
                        lambda: hand_picked(num_tokens, heads, topk, fp8kv, _num_sms(device), compact_for(device)),
                        KernelInputError)


# The CUDA kernels' tables (hopper_mla, mma_mla) tune one knob, the split count.
SPLIT_KNOBS = ("num_splits",)


def tuned_splits(knobs: dict, max_splits: int) -> int:
    """A split-count table entry's splits, else KernelInputError."""
    _check(sorted(knobs) == list(SPLIT_KNOBS), f"a tuned entry names the knob {SPLIT_KNOBS[0]} only")
    splits = knobs["num_splits"]
    _check(type(splits) is int and 1 <= splits <= max_splits,
           f"num_splits must be an integer in [1, {max_splits}], got {splits!r}")
    return splits


def launch_splits(table: Table, num_tokens: int, heads: int, topk: int, fp8kv: bool, device: torch.device,
                  max_splits: int, hand_picked: Callable[[int], int]) -> int:
    """The split count of a CUDA kernel's launch: this GPU's entry in `table` for the call's bucket, else
    hand_picked(number of SMs)."""
    return tuned_or_hand_picked(table, num_tokens, heads, topk, fp8kv, device,
                                lambda knobs: tuned_splits(knobs, max_splits), hand_picked)


def tuned_or_hand_picked(table: Table, num_tokens: int, heads: int, topk: int, fp8kv: bool, device: torch.device,
                         tuned: Callable[[dict], T], hand_picked: Callable[[int], T]) -> T:
    """tuned(knobs) of this GPU's entry in `table` for the call's bucket, else hand_picked(number of SMs)."""
    return table.choose(device_identity(device), tuning_bucket(num_tokens, heads, topk, fp8kv), tuned,
                        lambda: hand_picked(_num_sms(device)), KernelInputError)


@dataclass(frozen=True)
class CombineConfig:
    splits_pad: int  # splits padded to a power of two
    block_hc: int  # heads per program: as many as fit in COMBINE_TILE
    block_d: int  # columns per program
    num_warps: int


@functools.lru_cache(maxsize=None)
def combine_config(num_splits: int, heads: int) -> CombineConfig:
    """The combine's launch for `num_splits` splits of `heads` heads (fp32 or scaled fp16 partials)."""
    _check(1 <= num_splits <= MAX_SPLITS, f"the combine merges 1 to {MAX_SPLITS} splits, got {num_splits}")
    splits_pad = max(2, next_power_of_2(num_splits))
    block_hc = min(heads, COMBINE_TILE // (splits_pad * COMBINE_BLOCK_D))
    return CombineConfig(splits_pad, block_hc, COMBINE_BLOCK_D, COMBINE_WARPS)


@functools.lru_cache(maxsize=None)
def compact_for(device: torch.device) -> bool:
    """Whether this GPU's blocks get less shared memory than the Hopper-sized configurations need (COMPACT)."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin < HOPPER_SHARED_PER_BLOCK


@functools.lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def split_partials(device: torch.device, num_tokens: int, splits: int,
                   heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(acc, m, l): fp32 partials of `splits` splits, row (token * splits + split) * heads + head; acc
    has MLA_CKV_DIM values a row.
    Any kernel that writes this layout can be finished by combine(). Allocated per call from
    PyTorch's caching allocator (no cudaMalloc once warm): its blocks are stream-ordered, so calls on
    concurrent streams never share partials, and a CUDA graph captures blocks of its own pool, which
    no later call can free or grow under it (a buffer kept across calls could be both)."""
    rows = num_tokens * splits * heads
    ws = torch.empty(rows * (MLA_CKV_DIM + 2), dtype=torch.float32, device=device)  # one allocation a call
    return ws.split([rows * MLA_CKV_DIM, rows, rows])  # MLA_CKV_DIM floats a row: m and l start 16-byte aligned


def scaled_split_partials(device: torch.device, num_tokens: int, splits: int,
                          heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(acc, m, l, scale): split_partials() with acc in fp16, each half row (SCALE_COLUMNS values) to
    be multiplied by its factor in scale [rows * 2] (fp32), as the Hopper kernel writes them."""
    rows = num_tokens * splits * heads
    halves = MLA_CKV_DIM // SCALE_COLUMNS
    ws = torch.empty(rows * (MLA_CKV_DIM // 2 + 2 + halves), dtype=torch.float32, device=device)
    acc, m, l, scale = ws.split([rows * MLA_CKV_DIM // 2, rows, rows, rows * halves])
    return acc.view(torch.float16), m, l, scale  # 1024 bytes a row: the fp32 tail stays aligned


def combine(partials: tuple[torch.Tensor, ...], attn_sink: torch.Tensor | None, output: torch.Tensor,
            lse: torch.Tensor, lse_scale: float, heads: int, splits: int, num_tokens: int, *,
            max_logits: torch.Tensor | None = None, empty_lse: float = float("-inf")) -> None:
    """Merge split_partials() or scaled_split_partials() into output and lse (exact fp32 log-sum-exp
    merge, sink included) and, if given, max_logits (lse's layout)."""
    part_acc, part_m, part_l, *scale = partials
    if scale and splits > SCALED_MAX_SPLITS:  # formatted only on failure: this runs on every split call
        _fail(f"the combine merges scaled partials of at most {SCALED_MAX_SPLITS} splits, got {splits}")
    cfg = combine_config(splits, heads)
    _sparse_mla_combine_kernel[(MLA_CKV_DIM // cfg.block_d, heads // cfg.block_hc, num_tokens)](
        part_acc, part_m, part_l, scale[0] if scale else part_m, attn_sink if attn_sink is not None else lse,
        output, lse, max_logits if max_logits is not None else lse, lse_scale, empty_lse, heads, splits,
        int(attn_sink is not None), int(max_logits is not None),
        output.stride(0), output.stride(1), lse.stride(0), lse.stride(1),
        SPLITS_PAD=cfg.splits_pad, BLOCK_HC=cfg.block_hc, BLOCK_D=cfg.block_d, SCALED=bool(scale),
        num_warps=cfg.num_warps, enable_fp_fusion=FP_FUSION,
    )


def _fail(message: str, who: str = "sparse MLA attention") -> None:
    raise KernelInputError(f"{who}: {message}")


def _check(cond: bool, message: str, who: str = "sparse MLA attention") -> None:
    if not cond:
        _fail(message, who)


def _check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple, device: torch.device,
                  who: str = "sparse MLA attention") -> None:
    # The messages are formatted only on failure, and a fully given shape is compared at once: these
    # checks run on every launch.
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a tensor", who)
    if t.dtype != dtype:
        _fail(f"{name} must be {dtype}, got {t.dtype}", who)
    if t.device != device:
        _fail(f"{name} is on {t.device}, q_nope on {device}", who)
    if t.shape != shape and (t.dim() != len(shape) or not all(s is None or s == n for s, n in zip(shape, t.shape))):
        _fail(f"{name} has shape {list(t.shape)}, expected {['*' if s is None else s for s in shape]}", who)
    if t.dim() != 0 and t.stride(-1) != 1:
        _fail(f"{name} must have a contiguous last dimension", who)


def check_inputs(q_nope, q_pe, sparse_indices, output, lse, ckv_cache, kpe_cache, kv_cache, topk_length,
                 attn_sink, heads_served: tuple[int, ...] = HEADS, who: str = "sparse MLA attention"
                 ) -> tuple[int, int, int, bool]:
    """The operator's contract on the host, for every kernel that implements it:
    (num_tokens, heads, topk, fp8kv), or a KernelInputError that starts with `who`. Query tokens come as
    q_nope [T, H, 512], sparse_indices [T, topk] and topk_length [T], or in requests of S tokens as
    q_nope [B, S, H, 512], sparse_indices [B, S, topk] and topk_length [B] (one length a request); output
    [B * S, H, 512] and lse [B * S, H] either way. The caches hold pages of tokens [pages, page_tokens, ...],
    token id = page * page_tokens + offset; a page's tokens are one stride apart, pages any stride apart
    (FP8: whole 656-byte tokens, pages 16-byte aligned)."""
    _check(isinstance(q_nope, torch.Tensor) and q_nope.dim() in (3, 4),
           "q_nope must be a [T, H, 512] or [B, S, H, 512] tensor", who)
    device = q_nope.device
    *lead, heads, _ = q_nope.shape
    lead = tuple(lead)
    num_tokens = math.prod(lead)
    if heads not in heads_served:
        _fail(f"heads must be one of {heads_served}, got {heads}", who)
    _check_tensor("q_nope", q_nope, torch.bfloat16, (*lead, heads, MLA_CKV_DIM), device, who)
    _check_tensor("q_pe", q_pe, torch.bfloat16, (*lead, heads, MLA_KPE_DIM), device, who)
    _check(isinstance(sparse_indices, torch.Tensor) and sparse_indices.dim() == len(lead) + 1,
           f"sparse_indices must be a [{'T' if len(lead) == 1 else 'B, S'}, topk] tensor, as q_nope", who)
    topk = sparse_indices.shape[-1]
    _check(topk > 0, "topk must be positive", who)
    _check_tensor("sparse_indices", sparse_indices, torch.int32, (*lead, topk), device, who)
    _check_tensor("output", output, torch.bfloat16, (num_tokens, heads, MLA_CKV_DIM), device, who)
    _check_tensor("lse", lse, torch.float32, (num_tokens, heads), device, who)
    fp8kv = kv_cache is not None
    _check(fp8kv != (ckv_cache is not None or kpe_cache is not None),
           "pass either kv_cache (FP8) or ckv_cache and kpe_cache (bf16)", who)
    if fp8kv:
        _check_tensor("kv_cache", kv_cache, torch.int8, (None, None, MLA_TOKEN_BYTES), device, who)
        page_tokens, page_stride, token_stride = page_geometry(kv_cache)
        _check(token_stride == MLA_TOKEN_BYTES,
               f"kv_cache tokens must be {MLA_TOKEN_BYTES} contiguous bytes (strides {kv_cache.stride()})", who)
        _check(kv_cache.data_ptr() % UNIT_BYTES == 0 and page_stride % UNIT_BYTES == 0,
               f"kv_cache pages must start {UNIT_BYTES}-byte aligned (strides {kv_cache.stride()})", who)
    else:
        _check(ckv_cache is not None and kpe_cache is not None, "the bf16 form needs both ckv_cache and kpe_cache",
               who)
        _check_tensor("ckv_cache", ckv_cache, torch.bfloat16, (None, None, MLA_CKV_DIM), device, who)
        _check_tensor("kpe_cache", kpe_cache, torch.bfloat16, (None, None, MLA_KPE_DIM), device, who)
        if kpe_cache.shape[:2] != ckv_cache.shape[:2]:
            _fail(f"kpe_cache has {list(kpe_cache.shape[:2])} pages x tokens, ckv_cache {list(ckv_cache.shape[:2])}: "
                  f"every token id must name a row of both", who)
    if topk_length is not None:
        _check_tensor("topk_length", topk_length, torch.int32, (lead[0],), device, who)
    if attn_sink is not None:
        _check_tensor("attn_sink", attn_sink, torch.float32, (heads,), device, who)
    return num_tokens, heads, topk, fp8kv


def requests_view_as_tokens(t: torch.Tensor) -> bool:
    """Whether t's requests [B, S, ...] view as tokens [B * S, ...]: torch's rule for merging two dims, tested
    rather than tried (a failed view raises, which costs more than a small decode call's kernel)."""
    return t.shape[0] <= 1 or t.shape[1] <= 1 or t.stride(0) == t.shape[1] * t.stride(1)


def page_geometry(cache: torch.Tensor) -> tuple[int, int, int]:
    """(page_tokens, page stride, token stride) of a cache [pages, tokens, ...] as the kernels address it,
    in its elements: a cache whose pages are evenly strided (each page right after the last) is one run of
    tokens, passed as pages of one token, which the kernels address without a division."""
    pages, tokens = cache.shape[:2]
    if pages == 1 or tokens == 1 or cache.stride(0) == tokens * cache.stride(1):
        token_stride = cache.stride(1) if tokens > 1 or pages == 1 else cache.stride(0)
        return 1, token_stride, token_stride
    return tokens, cache.stride(0), cache.stride(1)


def ids_are_rows(ckv_cache: torch.Tensor | None, kpe_cache: torch.Tensor | None,
                 kv_cache: torch.Tensor | None) -> bool:
    """Whether every cache is one run of equally strided tokens (page_geometry's pages of one token) and an
    FP8 cache's tokens are contiguous: what the CUDA kernels address (id x token stride)."""
    if kv_cache is not None:
        return page_geometry(kv_cache) == (1, MLA_TOKEN_BYTES, MLA_TOKEN_BYTES)
    return page_geometry(ckv_cache)[0] == 1 and page_geometry(kpe_cache)[0] == 1


# Ids outside the cache that the kernels masked (_split_ids), per device; the Hopper kernel adds to the same.
BAD_INDICES = BadIndexCounter()
# Where calls that use out-of-range ids as padding on purpose (count_bad_ids=False) count them: never read.
UNCOUNTED = BadIndexCounter()


def bad_index_tensor(device: torch.device, count_bad_ids: bool) -> torch.Tensor:
    """The counter a launch adds masked out-of-range ids to: BAD_INDICES, or UNCOUNTED."""
    return (BAD_INDICES if count_bad_ids else UNCOUNTED).tensor(device)


def bad_index_count(device: torch.device | str) -> int:
    """How many out-of-range attention ids the kernels on `device` masked since the last reset (syncs)."""
    return BAD_INDICES.count(device)


def reset_bad_index_count(device: torch.device | str) -> None:
    BAD_INDICES.reset(device)


def cache_tokens(ckv_cache: torch.Tensor | None, kv_cache: torch.Tensor | None) -> int:
    """The token ids the cache holds, [0, this): pages x tokens a page, at most the largest int32 id."""
    cache = kv_cache if kv_cache is not None else ckv_cache
    return min(cache.shape[0] * cache.shape[1], MAX_INT32)


def check_max_logits(max_logits: torch.Tensor, lse: torch.Tensor, num_tokens: int, heads: int,
                     who: str = "sparse MLA attention") -> None:
    """max_logits [T, H] fp32, written at lse's offsets."""
    _check_tensor("max_logits", max_logits, torch.float32, (num_tokens, heads), lse.device, who)
    _check(max_logits.stride() == lse.stride(), "max_logits must have lse's strides", who)


def check_ids_in_cache(sparse_indices: torch.Tensor, topk_length: torch.Tensor | None, tokens: int,
                       who: str = "sparse MLA attention") -> None:
    """The host-side validation (check=True): every id a kernel reads is -1 or in the cache (ids [T, topk],
    or [B, S, topk] with a topk_length a request)."""
    topk = sparse_indices.shape[-1]
    read = None
    if topk_length is not None:
        lengths = topk_length.repeat_interleave(sparse_indices.numel() // topk // max(1, topk_length.numel()))
        read = torch.arange(topk, device=sparse_indices.device)[None, :] < lengths[:, None]
    check_ids(who, "sparse_indices", sparse_indices.reshape(-1, topk), tokens, read)


def row_pad(topk: int, splits: int, cfg: Config) -> int:
    """ROW_PAD of a launch: its splits' share of the row, to a power of two, a whole tile and the fewest ids
    the configuration loads (fewest_ids)."""
    share = cdiv(topk, splits)
    _check(share <= ROW_IDS_MAX, f"topk {topk} in {splits} splits leaves {share} positions a split, over the "
                                 f"{ROW_IDS_MAX} a split holds: use at least {cdiv(topk, ROW_IDS_MAX)} splits")
    return max(next_power_of_2(share), cfg.block_n, fewest_ids(cfg))


def row_pads(cfg: Config) -> list[int]:
    """Every ROW_PAD a launch of this configuration can pass (row_pad)."""
    smallest = max(cfg.block_n, fewest_ids(cfg))
    return [1 << b for b in range(smallest.bit_length() - 1, ROW_IDS_MAX.bit_length())]


def _kernel(fp8kv: bool, cfg: Config) -> triton.runtime.JITFunction:
    """The split kernel a configuration launches."""
    if not fp8kv:
        return _sparse_mla_bf16_kernel
    return _sparse_mla_fp8_f16_kernel if cfg.f16 else _sparse_mla_fp8_kernel


def sparse_mla_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, sparse_indices: torch.Tensor, sm_scale: float,
    output: torch.Tensor, lse: torch.Tensor, *, ckv_cache: torch.Tensor | None = None,
    kpe_cache: torch.Tensor | None = None, kv_cache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
    lse_base_e: bool = False, max_logits: torch.Tensor | None = None, empty_lse: float = float("-inf"),
    num_splits: int | None = None, check: bool | None = None, count_bad_ids: bool = True,
) -> None:
    """Write output and lse in place (check_inputs for the shapes). Exactly one KV form: ckv_cache +
    kpe_cache (bf16) or kv_cache (FP8 656-byte tokens). max_logits (lse's shape), if given, gets each row's
    largest logit times sm_scale (-inf where no id is valid); empty_lse is the lse of such a row.
    num_splits overrides the split formula (tests, tuning). An id outside the cache is masked as -1 and,
    where count_bad_ids, counted (bad_index_count); check (default: DSACTL_CHECK=1) refuses it on the host
    first."""
    num_tokens, heads, topk, fp8kv = check_inputs(q_nope, q_pe, sparse_indices, output, lse, ckv_cache, kpe_cache,
                                                  kv_cache, topk_length, attn_sink)
    if max_logits is not None:
        check_max_logits(max_logits, lse, num_tokens, heads)
    device = q_nope.device
    tokens_in_cache = cache_tokens(ckv_cache, kv_cache)
    if checking(check):
        check_ids_in_cache(sparse_indices, topk_length, tokens_in_cache)
    if num_tokens == 0:
        return
    s_q = q_nope.shape[1] if q_nope.dim() == 4 else 1
    if fp8kv:
        page_tokens, page_stride, _ = page_geometry(kv_cache)
        caches = (kv_cache, kv_cache, page_stride // UNIT_BYTES, 0, 0, 0)
    else:
        geometry = [page_geometry(c) for c in (ckv_cache, kpe_cache)]
        if geometry[0][0] != geometry[1][0]:  # one evenly strided, the other not: address both by page
            geometry = [(c.shape[1], c.stride(0), c.stride(1)) for c in (ckv_cache, kpe_cache)]
        (page_tokens, ckv_page, ckv_token), (_, kpe_page, kpe_token) = geometry
        caches = (ckv_cache, kpe_cache, ckv_page, ckv_token, kpe_page, kpe_token)
    plan = dict(sm_scale=sm_scale, caches=caches, tokens_in_cache=tokens_in_cache, page_tokens=page_tokens, s_q=s_q,
                topk=topk, heads=heads, fp8kv=fp8kv, attn_sink=attn_sink, num_splits=num_splits,
                lse_scale=1.0 / math.log2(math.e) if lse_base_e else 1.0, empty_lse=empty_lse,
                bad_count=bad_index_tensor(device, count_bad_ids))
    if num_tokens <= MAX_GRID_TOKENS:
        _launch(q_nope, q_pe, sparse_indices, topk_length, output, lse, max_logits, **plan)
        return
    # The grid's token axis takes at most MAX_GRID_TOKENS: longer calls run in slices of whole requests.
    step = MAX_GRID_TOKENS // s_q
    for r0 in range(0, q_nope.shape[0], step):
        r1, t0, t1 = r0 + step, r0 * s_q, (r0 + step) * s_q
        _launch(q_nope[r0:r1], q_pe[r0:r1], sparse_indices[r0:r1], None if topk_length is None else topk_length[r0:r1],
                output[t0:t1], lse[t0:t1], None if max_logits is None else max_logits[t0:t1], **plan)


# CUDA's limit on a grid's third axis, which carries the query tokens.
MAX_GRID_TOKENS = 65535


def _launch(q_nope, q_pe, sparse_indices, topk_length, output, lse, max_logits, *, sm_scale, caches,
            tokens_in_cache, page_tokens, s_q, topk, heads, fp8kv, attn_sink, num_splits, lse_scale,
            empty_lse, bad_count) -> None:
    """One launch of the split kernel (and the combine) over at most MAX_GRID_TOKENS checked tokens."""
    device = q_nope.device
    num_tokens = output.shape[0]
    # Absent optional inputs: a pointer of the same dtype that the kernel never reads.
    topk_length_arg = topk_length if topk_length is not None else sparse_indices
    sink_arg = attn_sink if attn_sink is not None else lse
    max_arg = max_logits if max_logits is not None else lse
    # A request's strides; with one token a request the position's stride is never used.
    q_strides = [x for t in (q_nope, q_pe) for x in (t.stride(0), t.stride(1) if s_q > 1 else 0, t.stride(-2))]
    idx_strides = (sparse_indices.stride(0), sparse_indices.stride(1) if s_q > 1 else 0)

    def run(plan: tuple[Config, int]) -> None:
        cfg, planned_splits = plan
        splits = num_splits or planned_splits
        _check(1 <= splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {splits}")
        pad = row_pad(topk, splits, cfg)
        tile = row_tile(cfg, pad)
        # splits == 1: the program writes the final output; the partial pointers are never read.
        partials = (lse, lse, lse) if splits == 1 else split_partials(device, num_tokens, splits, heads)
        part_acc, part_m, part_l = partials
        _kernel(fp8kv, tile)[(heads // tile.block_h, splits, num_tokens)](
            q_nope, q_pe, caches[0], caches[1], sparse_indices, topk_length_arg, sink_arg,
            output, lse, max_arg, part_acc, part_m, part_l, bad_count,
            float(sm_scale) * math.log2(math.e), lse_scale, empty_lse, topk, splits,
            int(topk_length is not None), int(attn_sink is not None), int(max_logits is not None), tokens_in_cache,
            s_q, page_tokens, *q_strides, *caches[2:], *idx_strides,
            output.stride(0), output.stride(1), lse.stride(0), lse.stride(1),
            HEADS=heads, BLOCK_H=tile.block_h, BLOCK_N=tile.block_n, UPCAST_DOT=INTERPRETING, ROW_PAD=pad,
            num_warps=tile.num_warps, num_stages=tile.num_stages, enable_fp_fusion=FP_FUSION,
        )
        if splits > 1:
            combine(partials, attn_sink, output, lse, lse_scale, heads, splits, num_tokens, max_logits=max_logits,
                    empty_lse=empty_lse)

    try:
        run(launch_plan(num_tokens, heads, topk, fp8kv, device))
    except OutOfResources as e:  # raised before the kernel runs: a tuned entry this Triton cannot compile
        if not TUNED.drop(device_identity(device), tuning_bucket(num_tokens, heads, topk, fp8kv), e):
            raise
        run(launch_plan(num_tokens, heads, topk, fp8kv, device))


def aot_specs() -> list[dict]:
    """Every configuration a launch can pick, for `dsactl build` to compile ahead of time."""
    # The split kernels' argument types as the launcher passes them for the operator's contract: contiguous
    # tensors, one token a request, evenly strided pages (s_q and page_tokens 1, which the JIT makes
    # constants), integers the JIT specializes as multiples of 16 marked ":16" (every stride but lse's head
    # stride, 1, and the FP8 page stride in 16-byte units, 41); topk, num_splits, the flags and cache_tokens
    # are never specialized (NOT_SPECIALIZED).
    arg_types = {
        "q_nope_ptr": "*bf16", "q_pe_ptr": "*bf16", "indices_ptr": "*i32", "topk_length_ptr": "*i32",
        "sink_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "max_ptr": "*fp32", "part_acc_ptr": "*fp32",
        "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "bad_count_ptr": "*i32", "sm_scale_log2": "fp32",
        "lse_scale": "fp32", "empty_lse": "fp32", **{name: "i32" for name in NOT_SPECIALIZED},
        "stride_lse_h": "i32", "stride_kv_page16": "i32",
    }
    contract = {"s_q": 1, "page_tokens": 1}
    specs = []
    for heads in HEADS:
        # Both GPU classes' configurations; those only a GPU of Hopper-sized shared memory launches say so
        # (min_shared), and builds for arches with less skip them.
        launched = [(f, c) for f in (False, True) for c in dict.fromkeys(configs(heads, f) + configs(heads, f, True))]
        for fp8kv, cfg, pad in [(f, c, p) for f, c in launched for p in row_pads(c)]:
            tile = row_tile(cfg, pad)
            kernel = _kernel(fp8kv, tile)
            cache = "*i8" if fp8kv else "*bf16"
            constexprs = {"HEADS": heads, "BLOCK_H": tile.block_h, "BLOCK_N": tile.block_n, "UPCAST_DOT": False,
                          "ROW_PAD": pad, **contract}
            # In the kernel's argument order, constants in place.
            types = {n: "constexpr" if n in constexprs else
                     arg_types.get(n, cache if n in ("ckv_ptr", "kpe_ptr", "kv_ptr", "unused_ptr") else "i32:16")
                     for n in kernel.arg_names}
            specs.append({
                "name": f"sparse_mla_h{heads}_{'fp8kv' if fp8kv else 'bf16kv'}"
                        + ("" if cfg == config(heads, fp8kv) else f"_n{cfg.block_n}w{cfg.num_warps}") + f"_ids{pad}",
                "fn": kernel,
                "signature": types,
                "constexprs": constexprs, "num_warps": tile.num_warps, "num_stages": tile.num_stages,
                **({} if cfg in configs(heads, fp8kv, True) else {"min_shared": HOPPER_SHARED_PER_BLOCK}),
            })
    combine_args = {
        "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_scale_ptr": "*fp32",
        "sink_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "max_ptr": "*fp32", "lse_scale": "fp32",
        "empty_lse": "fp32", "num_heads": "i32:16", "num_splits": "i32", "has_sink": "i32", "has_max": "i32",
        "stride_out_t": "i32:16",
        "stride_out_h": "i32:16", "stride_lse_t": "i32:16", "stride_lse_h": "i32",
    }
    combines = sorted({combine_config(splits, heads) for heads in HEADS for splits in range(2, MAX_SPLITS + 1)},
                      key=lambda c: (c.splits_pad, c.block_hc))
    for scaled in (False, True):  # fp32 partials, and the Hopper kernel's scaled fp16 ones
        for cfg in (c for c in combines if not scaled or c.splits_pad <= SCALED_MAX_SPLITS):
            constexprs = {"SPLITS_PAD": cfg.splits_pad, "BLOCK_HC": cfg.block_hc, "BLOCK_D": cfg.block_d,
                          "SCALED": scaled}
            specs.append({
                "name": f"sparse_mla_combine_s{cfg.splits_pad}_h{cfg.block_hc}" + ("_scaled" if scaled else ""),
                "fn": _sparse_mla_combine_kernel,
                "signature": {**combine_args, "part_acc_ptr": "*fp16" if scaled else "*fp32",
                              **{k: "constexpr" for k in constexprs}},
                "constexprs": constexprs, "num_warps": cfg.num_warps, "num_stages": 1,
            })
    return specs
