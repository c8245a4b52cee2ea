"""FP8 paged scoring kernel of the lightning indexer (Triton), one launch per call: a pipelined
loop of key steps per program, a few programs per SM streaming each request's keys; choose_config
sizes the split per shape.

Contract (B requests, N = next_n query tokens per request, H heads, S = max_num_pages * 64):
  q        float8_e4m3fn [B, N, H, 128] contiguous ([B, H, 128] when N = 1)
  cache    int8 [num_pages, 64, 1, 132]: per 8448-byte page, 64 x 128 e4m3 key bytes, then
           64 fp32 per-token scales (kernels/fp8.py). Read in place through the block table.
  weights  float32 [B, N, H] contiguous (q scale and softmax scale already folded in)
  seq_lens int32 [B]; block_table int32 [B, max_num_pages] (entries past a row's pages may be garbage;
           an entry of a row's pages outside [0, num_pages) is never read: its keys score -inf, counted)
  scores   float32 [B * N, >= S], unit column stride           (written)
  lengths  int32 [B * N]                                        (written)

Row r = b * N + j is query token j of request b; it sees visible = seq_len - N + j + 1 tokens (with
seq_lens int32 [B, N], each row's own visible = seq_lens[b, j] and seq_len their maximum) and
  scores[r, s] = scale[s] * sum_h w[b, j, h] * relu(q[b, j, h] . k8[s])   for s < visible,
  scores[r, s] = -inf                                                   for visible <= s < seq_len,
and lengths[r] = max(visible, 0). Positions >= seq_len are not written: the top-k reads only the
first lengths[r] scores of a row (clamped to S). Nor are positions >= S: a seq_len past the block
table's pages never reads an entry past them or writes a score past S. The per-token scale is positive, so it factors out of the ReLU
and is applied once after the head sum.

Requests with seq_len <= skip_len are not scored at all (lengths are still written): with
skip_len = topk, their top-k keeps every visible token whatever the scores, so the top-k stage
maps them structurally and reading their keys would be wasted traffic.

Score dtype: float32. The reference ranks float32 scores; bf16 scores would halve the top-k's
read (4 -> 2 bytes per token, against the 132 bytes per token this kernel reads) but round
scores within 2^-8 of each other to the same value, so the selected set near the k-th score
would differ from the reference's more often, for ~3% less traffic overall.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from ..bad_index import BadIndexCounter
from ..errors import KernelInputError
from ..fp8 import INDEX_HEAD_DIM, INDEX_PAGE_BYTES, INDEX_SCALE_OFFSET, PAGE_SIZE
from ..launch_math import cdiv, next_power_of_2
from ..triton_options import FP_FUSION
from ..tuned import Table, device_identity, table_path
from .shapes import HEADS, NEXT_NS

MAX_NEXT_N = max(NEXT_NS)


@triton.jit
def _query(q_ptr, w_ptr, b, read_rows, NEXT_N: tl.constexpr, NQ: tl.constexpr, HEADS: tl.constexpr,
           DIM: tl.constexpr):
    """All NEXT_N query tokens of request b as one [128, NQ * HEADS] operand and its weights:
    each key tile is read once and multiplied by every query row (padding rows are zero, weight
    zero). Keys are the M side of the dot, so the head sum stays inside a thread's row.
    Only the first read_rows rows are read: NEXT_N * HEADS, or 0 for a program with nothing to score."""
    qh = tl.arange(0, NQ * HEADS)
    d = tl.arange(0, DIM)
    real_qh = qh < read_rows
    q = tl.load(q_ptr + (b * NEXT_N * HEADS + qh)[:, None] * DIM + d[None, :], mask=real_qh[:, None], other=0.0)
    w = tl.load(w_ptr + b * NEXT_N * HEADS + qh, mask=real_qh, other=0.0)
    return tl.trans(q), w


@triton.jit
def _score_tile(k, scale, qt, w, tok, live, in_cache, visible, rows, real_j, scores_ptr, scores_stride,
                BLOCK_N: tl.constexpr, NQ: tl.constexpr, HEADS: tl.constexpr):
    """Scores of BLOCK_N keys for every query token of the request, stored where live; keys whose page
    is not in the cache score -inf, as invisible ones."""
    logits = tl.dot(k, qt)  # [BLOCK_N, NQ * HEADS] fp32
    weighted = tl.maximum(logits, 0.0) * w[None, :]
    per_query = tl.sum(tl.reshape(weighted, (BLOCK_N, NQ, HEADS)), axis=2) * scale[:, None]  # [BLOCK_N, NQ]
    per_query = tl.where(in_cache[:, None] & (tok[:, None] < visible[None, :]), per_query, float("-inf"))
    tl.store(scores_ptr + rows[None, :].to(tl.int64) * scores_stride + tok[:, None], per_query,
             mask=live[:, None] & real_j[None, :])


@triton.jit(do_not_specialize=["num_pages", "max_len"])
def indexer_score_kernel(
    q_ptr,  # *fp8e4nv [B, NEXT_N, HEADS, 128]
    k_ptr,  # *fp8e4nv: the cache's bytes
    scale_ptr,  # *fp32: the same bytes as fp32 words
    w_ptr,  # *fp32 [B, NEXT_N, HEADS]
    seq_lens_ptr,  # *i32 [B], or [B * NEXT_N] with ROW_LENS
    block_table_ptr,  # *i32 [B, bt_stride]
    scores_ptr,  # *fp32 [B * NEXT_N, scores_stride]
    lengths_ptr,  # *i32 [B * NEXT_N]
    bad_count_ptr,  # *i32 [1]: counts the block-table entries outside [0, num_pages) met
    bt_stride,
    scores_stride,
    tokens_per_program,  # a multiple of BLOCK_N
    skip_len,
    num_pages,
    max_len,  # S: tokens the block table's pages hold
    HEADS: tl.constexpr,
    NEXT_N: tl.constexpr,
    NQ: tl.constexpr,  # NEXT_N rounded up to a power of two (tl.arange sizes)
    BLOCK_N: tl.constexpr,  # tokens per step, whole pages
    STAGES: tl.constexpr,  # software pipeline depth of the key loop
    PAGE: tl.constexpr,
    DIM: tl.constexpr,
    PAGE_BYTES: tl.constexpr,
    SCALE_OFFSET: tl.constexpr,
    ROW_LENS: tl.constexpr = False,  # seq_lens holds each query row's own visible length [B * NEXT_N]
):
    """Long rows: program (b, split) walks tokens_per_program tokens of request b in BLOCK_N steps."""
    tl.static_assert(BLOCK_N % PAGE == 0, "a step covers whole pages")
    tl.static_assert(PAGE_BYTES % 4 == 0 and SCALE_OFFSET % 4 == 0, "scales are fp32-aligned in the page")
    tl.static_assert(NQ >= NEXT_N, "NQ pads NEXT_N")
    b = tl.program_id(0)
    split = tl.program_id(1)
    j = tl.arange(0, NQ)
    rows = b * NEXT_N + j
    real_j = j < NEXT_N
    if ROW_LENS:
        visible = tl.load(seq_lens_ptr + rows, mask=real_j, other=0)  # [NQ]
        seq_len = tl.max(tl.where(real_j, visible, 0), 0)
    else:
        seq_len = tl.load(seq_lens_ptr + b)
        visible = seq_len - NEXT_N + 1 + j  # [NQ]
    if split == 0:
        tl.store(lengths_ptr + rows, tl.maximum(visible, 0), mask=real_j)

    stop = tl.minimum(seq_len, max_len)  # a seq_len past the pages reads no block-table entry past them
    start = split * tokens_per_program
    end = tl.minimum(start + tokens_per_program, stop)
    end = tl.where(seq_len <= skip_len, start, end)
    qt, w = _query(q_ptr, w_ptr, b, NEXT_N * HEADS, NEXT_N, NQ, HEADS, DIM)
    # Per lane, summed once after the loop: a sum across the tile every step costs a reduction a step.
    bad_pages = tl.zeros([BLOCK_N], tl.int32)

    # tl.range's num_stages marks every load of the loop for the pipeliner, the scales
    # included (a plain range pipelines only the loads that feed the dot, and the scale
    # load then costs one synchronous memory round trip per step): the block-table entries
    # of a step are fetched STAGES - 1 steps ahead, its keys and scales STAGES - 2 ahead.
    for tok0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
        tok = tok0 + tl.arange(0, BLOCK_N)
        live = tok < stop  # block table entries past the row's pages are not page ids
        page = tl.load(block_table_ptr + b * bt_stride + tok // PAGE, mask=live, other=0)
        slot = tok % PAGE
        # A page id outside the cache is never dereferenced; its entry is counted once (at its slot 0,
        # which is live whenever any token of the page is; splits own disjoint pages).
        in_cache = (page >= 0) & (page < num_pages)
        bad_pages += (live & ~in_cache & (slot == 0)).to(tl.int32)
        read = live & in_cache
        page = page.to(tl.int64)
        d = tl.arange(0, DIM)
        k = tl.load(k_ptr + (page * PAGE_BYTES + slot * DIM)[:, None] + d[None, :], mask=read[:, None], other=0.0)
        scale = tl.load(scale_ptr + page * (PAGE_BYTES // 4) + SCALE_OFFSET // 4 + slot, mask=read, other=0.0)
        _score_tile(k, scale, qt, w, tok, live, in_cache, visible, rows, real_j, scores_ptr, scores_stride, BLOCK_N,
                    NQ, HEADS)
    bad_total = tl.sum(bad_pages, 0)
    if bad_total > 0:  # after the loop: no branch inside the pipelined one
        tl.atomic_add(bad_count_ptr, bad_total)


# ---------------------------------------------------------------------------------------------
# Launch configuration
# ---------------------------------------------------------------------------------------------

H200_SMS = 132  # used when no GPU is present (interpreter, AOT builds)
# Accumulator budget per thread: block_n * NQ * HEADS fp32 values over 32 * num_warps threads.
# Above 64 values per thread the epilogue's reductions spill at 4 warps.
ACC_PER_THREAD = 64
MAX_WARPS = 8  # two warpgroups; wider query operands (MTP) take fewer keys per tile instead

# Keys per step: two pages, a 128-row wgmma A tile.
KEYS_PER_STEP = 128
# Software pipeline depth: block-table entries STAGES - 1 steps ahead, keys and scales
# STAGES - 2 steps ahead (one 16.5 KB tile in flight per program at 3).
NUM_STAGES = 3
# Programs per SM that the split targets: 4 are resident at once (~42 KB of shared memory and
# ~110 registers x 128 threads each), so a small batch of long rows fills every SM in one wave
# with 4 programs' loads in flight per SM: more bytes in flight than fewer programs keep
# (docs/design.md, "Measured choices").
PROGRAMS_PER_SM = 4
# Fewest steps per program. One: short rows are latency-bound, so more programs of one step each
# beat fewer, longer ones, and the same looped kernel serves every shape
# (docs/design.md, "Measured choices").
MIN_STEPS_PER_PROGRAM = 1
# Large calls (batch x max_len keys at least LARGE_KEYS) are pure streaming: a deeper pipeline
# with fewer programs per SM keeps more bytes in flight per program, at a latency cost below
# LARGE_KEYS (docs/design.md, "Measured choices").
LARGE_KEYS = 64 * 32768
LARGE_STAGES = 5
LARGE_PROGRAMS_PER_SM = 3


@dataclass(frozen=True)
class ScoreConfig:
    block_n: int  # keys per step, whole pages
    num_warps: int
    num_stages: int
    tokens_per_program: int  # a multiple of block_n
    splits: int  # programs per request


def _nq(next_n: int) -> int:
    """Query tokens padded to a power of two (tl.arange sizes); next_n = 3 computes a zero row."""
    return next_power_of_2(next_n)


def _fit(block_n: int, num_warps: int, width: int) -> tuple[int, int]:
    """More warps, then fewer keys, until the block_n x width accumulator fits ACC_PER_THREAD."""
    while block_n * width // (32 * num_warps) > ACC_PER_THREAD and num_warps < MAX_WARPS:
        num_warps *= 2
    while block_n * width // (32 * num_warps) > ACC_PER_THREAD and block_n > PAGE_SIZE:
        block_n //= 2
    return block_n, num_warps


def choose_config(batch: int, next_n: int, heads: int, max_len: int, num_sms: int = H200_SMS,
                  block_n: int | None = None, large: bool | None = None) -> ScoreConfig:
    """One launch configuration per shape (block_n and large override the choice, for tests,
    builds and tuning sweeps).

    Tiles: block_n keys (the wgmma M side) against all NQ * heads query rows (the N side), so
    the head sum is a per-thread row reduction. The accumulator is block_n x NQ*heads fp32:
    for 64 heads and one query token that is 64 values per thread at 4 warps; wider q (MTP:
    NQ * heads up to 256) takes 8 warps, then one-page tiles, to stay at ACC_PER_THREAD.

    Split: requests are cut into `splits` equal chunks so that batch * splits fills
    PROGRAMS_PER_SM programs on every SM in one wave (LARGE_PROGRAMS_PER_SM, with a deeper
    pipeline, for calls of at least LARGE_KEYS keys), with at least MIN_STEPS_PER_PROGRAM steps
    per program. The grid is static (from max_len, known on the host): no device sync; a
    request shorter than max_len leaves some programs idle.

    The alternatives (one-page steps, 8 warps, 4 stages, keys prefetched by hand into registers,
    TMA descriptor loads) gain nothing: docs/design.md, "Measured choices".
    """
    width = _nq(next_n) * heads
    if large is None:
        large = batch * max_len >= LARGE_KEYS
    stages, per_sm = (LARGE_STAGES, LARGE_PROGRAMS_PER_SM) if large else (NUM_STAGES, PROGRAMS_PER_SM)
    block_n, num_warps = _fit(block_n or KEYS_PER_STEP, 4, width)
    return _split(batch, max_len, block_n, num_warps, stages, per_sm, num_sms)


def _split(batch: int, max_len: int, block_n: int, num_warps: int, stages: int, per_sm: int,
           num_sms: int) -> ScoreConfig:
    """The launch of per_sm programs an SM over batch requests of max_len tokens (choose_config)."""
    steps = cdiv(max_len, block_n)
    splits = max(1, min(num_sms * per_sm // max(batch, 1), steps // MIN_STEPS_PER_PROGRAM))
    steps_per_program = cdiv(steps, splits)
    splits = cdiv(steps, steps_per_program)
    return ScoreConfig(block_n, num_warps, stages, steps_per_program * block_n, splits)


# `dsactl tune`'s table (kernels/tuned.py): per GPU and shape bucket, the knobs that beat choose_config
# there; the split follows from programs_per_sm as in choose_config, so one entry fits every length of
# its bucket.
TUNED = Table(table_path(__file__))
TUNED_KNOBS = ("block_n", "num_warps", "num_stages", "programs_per_sm")
# What a tuned configuration may ask for: one page or the two-page step (longer steps were never measured),
# the warps _fit can pick, and a pipeline depth and residency around the measured ones.
TUNED_BLOCK_N = (PAGE_SIZE, KEYS_PER_STEP)
TUNED_WARPS = (4, MAX_WARPS)
TUNED_STAGES = (2, 3, 4, 5, 6)
TUNED_PROGRAMS_PER_SM = (1, 2, 3, 4, 6, 8)


def tuning_bucket(batch: int, next_n: int, heads: int, max_len: int) -> str:
    """A call's bucket in the table: heads, next_n, and batch and length rounded up to powers of two."""
    return f"h{heads}-n{next_n}-b{next_power_of_2(batch)}-len{next_power_of_2(max_len)}"


def tuned_config(knobs: dict, batch: int, max_len: int, num_sms: int) -> ScoreConfig:
    """A table entry's launch for this call, held to the values above, else KernelInputError."""
    if sorted(knobs) != sorted(TUNED_KNOBS) or not all(type(knobs[k]) is int for k in TUNED_KNOBS):
        raise KernelInputError(f"indexer: a tuned entry names the integer knobs {', '.join(TUNED_KNOBS)}")
    allowed = (TUNED_BLOCK_N, TUNED_WARPS, TUNED_STAGES, TUNED_PROGRAMS_PER_SM)
    if any(knobs[k] not in values for k, values in zip(TUNED_KNOBS, allowed)):
        raise KernelInputError(f"indexer: tuned knobs {knobs} outside {dict(zip(TUNED_KNOBS, allowed))}")
    return _split(batch, max_len, knobs["block_n"], knobs["num_warps"], knobs["num_stages"],
                  knobs["programs_per_sm"], num_sms)


def launch_config(batch: int, next_n: int, heads: int, max_len: int, device: torch.device) -> ScoreConfig:
    """This GPU's tuned entry for the call's bucket, else choose_config()."""
    num_sms = _num_sms(device)
    return TUNED.choose(device_identity(device), tuning_bucket(batch, next_n, heads, max_len),
                        lambda knobs: tuned_config(knobs, batch, max_len, num_sms),
                        lambda: choose_config(batch, next_n, heads, max_len, num_sms), KernelInputError)


# Block-table entries outside [0, num_pages) that the score kernel met (not read: their keys score -inf).
BAD_PAGES = BadIndexCounter()


def bad_index_count(device: torch.device | str) -> int:
    """How many out-of-range block-table entries the score kernel on `device` met since the last reset
    (syncs)."""
    return BAD_PAGES.count(device)


def reset_bad_index_count(device: torch.device | str) -> None:
    BAD_PAGES.reset(device)


@lru_cache(maxsize=None)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def query_shape(q: torch.Tensor) -> tuple[int, int, int]:
    """(batch, next_n, heads) of q [B, H, 128] or [B, N, H, 128]."""
    if q.dim() == 3:
        return q.shape[0], 1, q.shape[1]
    if q.dim() == 4:
        return q.shape[0], q.shape[1], q.shape[2]
    raise KernelInputError(f"indexer q must be [B, H, 128] or [B, next_n, H, 128], got {list(q.shape)}")


def check_inputs(q, cache, weights, seq_lens, block_table, *, row_lens: bool = False,
                 **outputs) -> tuple[int, int, int]:
    """Checks the inputs against the contract above and that every one of `outputs` (name=tensor) is a tensor
    on the inputs' device; a one-line KernelInputError names the first bad argument. Returns (batch, next_n,
    heads). row_lens: seq_lens holds each query row's visible length, [batch, next_n]."""
    named = (("q", q), ("k cache", cache), ("weights", weights), ("seq_lens", seq_lens), ("block_table", block_table),
             *outputs.items())
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise KernelInputError(f"indexer {name} must be a tensor, got {type(t).__name__}")
    batch, next_n, heads = query_shape(q)
    if q.dtype != torch.float8_e4m3fn or q.shape[-1] != INDEX_HEAD_DIM or not q.is_contiguous():
        raise KernelInputError(f"indexer q must be contiguous float8_e4m3fn [..., {INDEX_HEAD_DIM}], "
                          f"got {q.dtype} {list(q.shape)}")
    if heads not in HEADS:
        raise KernelInputError(f"indexer heads must be one of {HEADS}, got {heads}")
    if not 1 <= next_n <= MAX_NEXT_N:
        raise KernelInputError(f"indexer next_n must be 1..{MAX_NEXT_N}, got {next_n}")
    if cache.dtype != torch.int8 or cache.dim() != 4 or cache.shape[1:] != (PAGE_SIZE, 1, INDEX_PAGE_BYTES // PAGE_SIZE) \
            or not cache.is_contiguous():
        raise KernelInputError(f"indexer k cache must be contiguous int8 [num_pages, {PAGE_SIZE}, 1, "
                          f"{INDEX_PAGE_BYTES // PAGE_SIZE}], got {cache.dtype} {list(cache.shape)}")
    if weights.dtype != torch.float32 or weights.numel() != batch * next_n * heads or not weights.is_contiguous():
        raise KernelInputError(f"indexer weights must be contiguous float32 with {batch}x{next_n}x{heads} values, "
                          f"got {weights.dtype} {list(weights.shape)}")
    lens_shape = (batch, next_n) if row_lens else (batch,)
    if seq_lens.dtype != torch.int32 or seq_lens.shape != lens_shape or not seq_lens.is_contiguous():
        raise KernelInputError(f"seq_lens must be contiguous int32 {list(lens_shape)}, got {seq_lens.dtype} "
                               f"{list(seq_lens.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch \
            or block_table.stride(1) != 1:
        raise KernelInputError(f"block_table must be int32 [{batch}, max_num_pages] with unit column stride, "
                          f"got {block_table.dtype} {list(block_table.shape)}")
    devices = {t.device for _, t in named}
    if len(devices) != 1:
        raise KernelInputError(f"indexer tensors must share one device, got {sorted(map(str, devices))}")
    return batch, next_n, heads


def _check(q, cache, weights, seq_lens, block_table, scores, lengths) -> tuple[int, int, int]:
    row_lens = isinstance(seq_lens, torch.Tensor) and seq_lens.dim() == 2
    batch, next_n, heads = check_inputs(q, cache, weights, seq_lens, block_table, row_lens=row_lens, scores=scores,
                                        lengths=lengths)
    max_len = block_table.shape[1] * PAGE_SIZE
    if scores.dtype != torch.float32 or scores.dim() != 2 or scores.shape[0] != batch * next_n \
            or scores.shape[1] < max_len or scores.stride(1) != 1:
        raise KernelInputError(f"scores must be float32 [{batch * next_n}, >= {max_len}] with unit column stride, "
                          f"got {scores.dtype} {list(scores.shape)}")
    if lengths.dtype != torch.int32 or lengths.shape != (batch * next_n,):
        raise KernelInputError(f"lengths must be int32 [{batch * next_n}], got {lengths.dtype} {list(lengths.shape)}")
    return batch, next_n, heads


def score(q: torch.Tensor, cache: torch.Tensor, weights: torch.Tensor, seq_lens: torch.Tensor,
          block_table: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, skip_len: int = 0,
          config: ScoreConfig | None = None) -> None:
    """Write the indexer scores and per-row visible lengths (module docstring); one launch. seq_lens [B] or,
    each query row's own length, [B, next_n]. `config` overrides choose_config (for tuning sweeps)."""
    batch, next_n, heads = _check(q, cache, weights, seq_lens, block_table, scores, lengths)
    max_len = block_table.shape[1] * PAGE_SIZE
    if batch == 0 or max_len == 0:
        lengths.zero_()
        return

    def run(cfg: ScoreConfig) -> None:
        if (cfg.tokens_per_program % cfg.block_n or cfg.block_n % PAGE_SIZE
                or cfg.splits * cfg.tokens_per_program < max_len):
            raise KernelInputError(f"indexer score config {cfg} does not tile rows of {max_len} tokens")
        indexer_score_kernel[(batch, cfg.splits)](
            q, cache.view(torch.float8_e4m3fn), cache.view(torch.float32), weights, seq_lens, block_table, scores,
            lengths, BAD_PAGES.tensor(q.device), block_table.stride(0), scores.stride(0), cfg.tokens_per_program,
            skip_len, cache.shape[0], max_len,
            HEADS=heads, NEXT_N=next_n, NQ=_nq(next_n), BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, PAGE=PAGE_SIZE,
            DIM=INDEX_HEAD_DIM, PAGE_BYTES=INDEX_PAGE_BYTES, SCALE_OFFSET=INDEX_SCALE_OFFSET,
            ROW_LENS=seq_lens.dim() == 2, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            enable_fp_fusion=FP_FUSION)

    if config is not None:
        run(config)
        return
    try:
        run(launch_config(batch, next_n, heads, max_len, q.device))
    except OutOfResources as e:  # raised before the kernel runs: a tuned entry this Triton cannot compile
        if not TUNED.drop(device_identity(q.device), tuning_bucket(batch, next_n, heads, max_len), e):
            raise
        run(launch_config(batch, next_n, heads, max_len, q.device))


# tokens_per_program is a multiple of BLOCK_N (whole 64-token pages), so the JIT always specializes it as
# a multiple of 16 (":16"); the strides, skip_len, num_pages and max_len follow the workload.
_SIGNATURE = {
    "q_ptr": "*fp8e4nv", "k_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "w_ptr": "*fp32", "seq_lens_ptr": "*i32",
    "block_table_ptr": "*i32", "scores_ptr": "*fp32", "lengths_ptr": "*i32", "bad_count_ptr": "*i32",
    "bt_stride": "i32", "scores_stride": "i32", "tokens_per_program": "i32:16", "skip_len": "i32", "num_pages": "i32",
    "max_len": "i32",
}


def aot_specs() -> list[dict]:
    """Every (heads, next_n, pipeline) configuration choose_config can return, for `dsactl build`."""
    specs = []
    for large in (False, True):
        for heads in HEADS:
            for next_n in range(1, MAX_NEXT_N + 1):
                cfg = choose_config(1, next_n, heads, PAGE_SIZE, large=large)
                constexprs = {"HEADS": heads, "NEXT_N": next_n, "NQ": _nq(next_n), "BLOCK_N": cfg.block_n,
                              "STAGES": cfg.num_stages, "PAGE": PAGE_SIZE, "DIM": INDEX_HEAD_DIM,
                              "PAGE_BYTES": INDEX_PAGE_BYTES, "SCALE_OFFSET": INDEX_SCALE_OFFSET, "ROW_LENS": False}
                specs.append({
                    "name": f"indexer_score_h{heads}_nextn{next_n}_s{cfg.num_stages}",
                    "fn": indexer_score_kernel,
                    "signature": {**_SIGNATURE, **{k: "constexpr" for k in constexprs}},
                    "constexprs": constexprs,
                    "num_warps": cfg.num_warps,
                    "num_stages": cfg.num_stages,
                })
    return specs
