"""Launcher of the warp-specialized Hopper sparse MLA decode kernel (hopper_mla.cu): input checks,
arch check, split choice, the split partials, then the kernel and, with several splits that do not
merge in the kernel (merges_in_cluster), the Triton combine.

Contract: the sparse attention operator (docs/design.md, Contracts; as triton_sparse_mla.py), for
the shapes this kernel serves: 16, 32, 64 or 128 heads (a CTA owns 64 heads of one token; below 64 its
tile's other rows are zero q, never written), topk a multiple of 64 up to 16384, bf16 KV (ckv_cache +
kpe_cache) or FP8 KV (kv_cache, 656-byte tokens) in pages (below), LSE base 2 or e, -1 indices anywhere,
empty rows (output 0, lse -inf or empty_lse), topk_length, the attention sink and max_logits, q in
requests ([B, S, H, 512]; where q or the ids do not view as tokens, the kernel steps requests and positions
by their own strides). FP8 KV is
dequantized to fp16 and multiplied in fp16 (Q converted once), as bf16 rounding of the dequantized values fails
the contest tolerance (hopper_mla.cu says why); rows of Q and tokens with values past fp16's range are scaled
into it by powers of two and scaled back in fp32 (exact), up to token values of 2^31. Pages may be padded by
rows (FlashMLA's tests allocate block_size + 1 rows a block) where they hold a power of two of tokens:
the kernel maps an id to its row by a shift and a mask (page_map). Not served: other page sizes of padded
pages, whose ids would need a division (the Triton kernel serves them). Runs only on compute capability
9.0 (sm_90a: wgmma, setmaxnreg); any other GPU is refused before the library is loaded.

Alignment: every tensor's base is 16-byte aligned and every row stride (q, caches, output) a
multiple of 8 elements, so each 16-byte copy of the kernel is aligned; a view that breaks this is
refused with the reason (the Triton kernel takes it).

Splits: split s of S takes the row positions s, s + S, ... exactly as the Triton kernel. The partials
are merged one of two ways: written in the Triton launcher's partial layout (triton_sparse_mla.
scaled_split_partials: fp16 with a power-of-two factor per half row) that the Triton combine()
reduces, or, with exactly CLUSTER_SPLITS (2) splits, inside the kernel: the two splits of one
(token, head group) form a thread-block cluster and merge through distributed shared memory (no
partials in global memory, no combine launch). merges_in_cluster() says when. A grid a little past whole waves
of CTAs runs as two launches, a head of whole waves and a tail split over every SM (plan_for).

Staging: the whole FP8 cache is first converted into the fp16 rows the FP8 path would write to shared
memory, and the kernel copies those rows instead of converting every gather: the same output bits, one
pass over the cache instead of a conversion per gather (fp8_staging.py). It pays where a call gathers
each cached token many times (prefill); stages_cache() says where, staged=True/False asks.

Serving: the shipped attention entries (solution.py) send a call here when dispatch.py says this kernel
serves it (fits() checks the limits and alignment); the entries below name it directly (sm_90 only), so
that it can be timed and checked beside the Triton kernel.
"""

from __future__ import annotations

import ctypes
import math
from functools import lru_cache

import torch

from ..bad_index import checking
from ..cuda_library import load_library
from ..errors import KernelBuildError, KernelError, KernelInputError
from ..fp8 import MLA_TOKEN_BYTES
from ..tuned import Table, table_path
from . import fp8_staging
from . import triton_sparse_mla as tsm
from .alignment import check_aligned
from .dispatch import HOPPER_CAPABILITY, HOPPER_HEADS, HOPPER_MAX_TOPK
from .entries import entries

LIBRARY = "hopper_mla"
HEADS = HOPPER_HEADS
HEADS_PER_CTA = 64  # wgmma M: one consumer warpgroup's accumulator rows
BLOCK_TOKENS = 64  # tokens per shared-memory ring stage
MAX_TOPK = HOPPER_MAX_TOPK
CAPABILITY = HOPPER_CAPABILITY
# The split formula of the Triton kernel, with this kernel's tile: 64 heads x 64 tokens per step,
# one CTA per SM (its 227 KB of shared memory fill one).
TILE = tsm.Config(block_h=HEADS_PER_CTA, block_n=BLOCK_TOKENS, num_warps=12, num_stages=2)
MAX_SPLITS = tsm.SCALED_MAX_SPLITS  # a split per 64-token block of topk 2048; the combine's limit for its partials
MAX_TOKENS = 65535  # tokens are the kernel grid's z dimension
CLUSTER_SPLITS = 2  # the one split count merged in a cluster (hopper_mla.cu, kClusterSplits, says why)
KV_BF16, KV_FP8, KV_STAGED = 0, 1, 2  # the kernel's kv_format (hopper_mla.cu, KvFormat)
SMALLEST_DENORMAL = 2.0 ** -149  # the logit scale that stands for sm_scale 0 (sparse_mla_attention says why)


WHO = "Hopper sparse MLA attention"


def _fail(message: str) -> None:
    raise KernelInputError(f"{WHO}: {message}")


def _check(cond: bool, message: str) -> None:
    if not cond:
        _fail(message)


def _device_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def check_arch(device: torch.device) -> None:
    """Refuse any GPU that is not sm_90 (the kernel's wgmma body is compiled for sm_90a only)."""
    _check(device.type == "cuda", f"needs CUDA tensors (got {device}); the kernel runs on sm_90 GPUs only")
    capability = tuple(_device_capability(device))
    _check(capability == CAPABILITY,
           f"runs only on compute capability 9.0 (H100/H200, sm_90a); this GPU is {capability[0]}.{capability[1]}: "
           f"use the Triton kernel (triton_sparse_mla.py)")


# A CTA's partial (64 heads x 512 fp16 values and their scales) written and read back by the combine costs
# about PARTIAL_TILES tiles spread over the SMs: without the term small grids split into more partials than
# they save, with too large a one they split too little (fitted to a split sweep: docs/design.md, "Measured
# choices").
PARTIAL_TILES = 3.0


def num_splits_for(num_tokens: int, heads: int, topk: int, num_sms: int) -> int:
    """Splits per (token, head group): the Triton kernel's formula (the count that minimizes the
    busiest SM's work, one CTA per SM at a time) with this kernel's 64 x 64 tile and the cost of
    its partials. Two splits merge in a cluster instead (merges_in_cluster), at a cost of their own; the
    term still counts partials there (docs/design.md, "Measured choices")."""
    return tsm.num_splits_for(num_tokens, heads, topk, TILE, num_sms, PARTIAL_TILES, max_splits=MAX_SPLITS,
                              row_ids_max=MAX_TOPK)


# `dsactl tune`'s table (kernels/tuned.py): per GPU and shape bucket, the split count that beat the formula.
TUNED = Table(table_path(__file__))


def launch_splits(num_tokens: int, heads: int, topk: int, fp8kv: bool, device: torch.device) -> int:
    """Splits of a launch: this GPU's tuned entry for the call's bucket, else num_splits_for()."""
    return tsm.launch_splits(TUNED, num_tokens, heads, topk, fp8kv, device, MAX_SPLITS,
                             lambda num_sms: num_splits_for(num_tokens, heads, topk, num_sms))


# A grid a little past whole waves (one CTA an SM) leaves most SMs idle through its last wave of whole rows
# (FlashMLA's batch-74 decode case: 148 tokens x 2 head groups, 2.24 waves of one split on 132 SMs). Such a
# call runs as two launches: a head of whole waves, then the tail, whose few rows split over every SM; where
# the split formula's costs of the two, plus LAUNCH_TILES for the second launch, are lower than one launch's,
# on grids of up to PLAN_MAX_WAVES waves of one split: the calls measured (docs/design.md, "Measured choices";
# past them a last wave is a smaller share of the time, and prefill's are unmeasured).
LAUNCH_TILES = 1.0
PLAN_MAX_WAVES = 5


def _split_choice(num_tokens: int, heads: int, topk: int, num_sms: int) -> tuple[int, float]:
    return tsm.split_choice(num_tokens, heads, topk, TILE, num_sms, PARTIAL_TILES, max_splits=MAX_SPLITS,
                            row_ids_max=MAX_TOPK)


@lru_cache(maxsize=None)
def plan_for(num_tokens: int, heads: int, topk: int, num_sms: int, unit: int = 1) -> tuple[tuple[int, int], ...]:
    """(tokens, splits) of each launch of a call, in token order, cut between groups of `unit` tokens (a
    request's): one launch at num_splits_for()'s splits, or a head of whole waves and a tail (LAUNCH_TILES,
    PLAN_MAX_WAVES)."""
    splits, cost = _split_choice(num_tokens, heads, topk, num_sms)
    head = num_tokens * groups(heads) // num_sms * num_sms // groups(heads) // unit * unit
    if 0 < head < num_tokens and num_tokens * groups(heads) <= PLAN_MAX_WAVES * num_sms:
        (head_splits, head_cost), (tail_splits, tail_cost) = (_split_choice(n, heads, topk, num_sms)
                                                              for n in (head, num_tokens - head))
        if head_cost + tail_cost + LAUNCH_TILES < cost:
            return (head, head_splits), (num_tokens - head, tail_splits)
    return ((num_tokens, splits),)


def launch_plan(num_tokens: int, heads: int, topk: int, fp8kv: bool, device: torch.device,
                unit: int = 1) -> tuple[tuple[int, int], ...]:
    """(tokens, splits) of each launch of a call: one launch at this GPU's tuned entry for the call's
    bucket, else plan_for()."""
    return tsm.tuned_or_hand_picked(TUNED, num_tokens, heads, topk, fp8kv, device,
                                    lambda knobs: ((num_tokens, tsm.tuned_splits(knobs, MAX_SPLITS)),),
                                    lambda num_sms: plan_for(num_tokens, heads, topk, num_sms, unit))


# Staging costs a pass over the whole cache (fp8_staging.py) and saves part of every gather's conversion,
# so it pays where a call gathers each cached token often (docs/design.md, "Measured choices", has the
# measurements behind each threshold below). A call stages from STAGE_GATHERS ids a cached token, the
# ratio every measured win reached, and from STAGE_MIN_TOKENS query tokens, the fewest measured (a decode
# batch's rows are mostly padding when its cache is small, so its ids overstate the gathers).
STAGE_GATHERS = 8
STAGE_MIN_TOKENS = 256
STAGE_HEADS = (64, 128)  # the head counts measured; 32 heads runs the same tile, unmeasured
# The largest cache staged: on the larger cache measured the gain shrank to the run-to-run spread, while
# the staged copy a call allocates (1156 B a token) grows with the cache; sizes in between are unmeasured.
STAGE_MAX_CACHE_TOKENS = 1 << 17


def stages_cache(num_tokens: int, heads: int, topk: int, cache_tokens: int) -> bool:
    """Whether an FP8 call stages its cache (module docstring, Staging): prefill-sized calls that gather
    each cached token at least STAGE_GATHERS times, on caches of at most STAGE_MAX_CACHE_TOKENS."""
    return (heads in STAGE_HEADS and num_tokens >= STAGE_MIN_TOKENS and cache_tokens <= STAGE_MAX_CACHE_TOKENS
            and num_tokens * topk >= STAGE_GATHERS * cache_tokens)


def groups(heads: int) -> int:
    """CTAs per (token, split): one per 64 heads, one below 64."""
    return -(-heads // HEADS_PER_CTA)


def merges_in_cluster(splits: int, heads: int, fp8kv: bool) -> bool:
    """Whether the splits merge in a cluster rather than through the combine kernel: at 2 splits, the
    count the formula gives grids of 64 (token, head group) pairs (h128 T=32, h64 T=64), except FP8 at
    128 heads, whose head groups already share their gather in a 2-CTA cluster (one cluster kind at a
    time; sharing the gather was worth more: docs/design.md, "Measured choices")."""
    return splits == CLUSTER_SPLITS and not (fp8kv and heads == 2 * HEADS_PER_CTA)


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """lib{LIBRARY}.so for this GPU, bound; a KernelBuildError names the build to run when it is missing."""
    return bind(load_library(LIBRARY))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the C ABI of hopper_mla.cu on a loaded library."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_float
    lib.dsa_hopper_mla_decode.restype = i32
    lib.dsa_hopper_mla_decode.argtypes = [
        p, i64, i64,  # q_nope, strides (token, head)
        p, i64, i64,  # q_pe, strides
        i32,  # KV format: KV_BF16, KV_FP8 or KV_STAGED
        p, i64, p, i64,  # kv_a + row stride, kv_b + row stride
        p, i64,  # indices, row stride
        i32, i32, i32, i32, i32,  # num_tokens, heads, topk, num_splits, reduce_in_cluster
        f32, f32,  # sm_scale * log2(e), lse scale
        p, i64, i64,  # output, strides
        p, i64, i64,  # lse, strides
        p, p, p, p,  # partials: acc, m, l, scale
        i64, p,  # cache_tokens (ids are valid below it), int32 counter of the masked out-of-range ids
        p, p, p, i32, f32,  # attn_sink, max_logits, topk_length (each null: none), tokens a length, empty rows' lse
        i32, i64,  # page_shift, page_rows (page_map)
        i32, i64, i64, i64,  # positions a request, q_nope's, q_pe's and the ids' position strides (_token_layout)
        p,  # cudaStream_t
    ]
    lib.dsa_hopper_mla_error_string.restype = ctypes.c_char_p
    lib.dsa_hopper_mla_error_string.argtypes = [i32]
    lib.dsa_hopper_mla_max_splits.restype = i32
    lib.dsa_hopper_mla_smem_bytes.restype = i32
    lib.dsa_hopper_mla_max_tokens.restype = i32
    lib.dsa_hopper_mla_cluster_splits.restype = i32
    limits = (lib.dsa_hopper_mla_max_splits(), lib.dsa_hopper_mla_max_tokens(), lib.dsa_hopper_mla_cluster_splits())
    if limits != (MAX_SPLITS, MAX_TOKENS, CLUSTER_SPLITS):
        raise KernelBuildError(f"lib{LIBRARY}.so was built with different limits: rebuild it with `dsactl build`")
    return lib


def check_inputs(q_nope, q_pe, sparse_indices, output, lse, ckv_cache, kpe_cache, kv_cache, topk_length,
                 attn_sink) -> tuple[int, int, int, bool]:
    """Every check that needs no GPU: (num_tokens, heads, topk, fp8kv), or a KernelInputError."""
    checked = tsm.check_inputs(q_nope, q_pe, sparse_indices, output, lse, ckv_cache, kpe_cache, kv_cache, topk_length,
                               attn_sink, HEADS, WHO)
    _check_limits(q_nope, q_pe, sparse_indices, output, ckv_cache, kpe_cache, kv_cache)
    return checked


def _tokens(t: torch.Tensor, dims: int) -> torch.Tensor | None:
    """t with dims dims, or a view of its requests ([B, S, ...]) as tokens ([B * S, ...]); None where the
    requests do not flatten without a copy."""
    if t.dim() == dims:
        return t
    return t.flatten(0, 1) if t.dim() == dims + 1 and tsm.requests_view_as_tokens(t) else None


MAX_PAGE_SHIFT = 30  # hopper_mla.cu's kMaxPageShift
ROW_LIMIT = 1 << 32  # token_row is 32-bit


def page_map(ckv_cache, kpe_cache, kv_cache) -> tuple[int, int] | None:
    """(page_shift, page_rows): the cache as pages of 2^page_shift tokens, page_rows token rows apart, each
    token one row (FP8: 656 contiguous bytes; bf16: ckv and kpe rows of one row stride each), whose rows all
    have 32-bit numbers; (0, 1) where ids are rows. None where the kernel cannot address the cache that way."""
    caches = (kv_cache,) if kv_cache is not None else (ckv_cache, kpe_cache)
    maps = set()
    for cache in caches:
        page_tokens, page_stride, token_stride = tsm.page_geometry(cache)
        if kv_cache is not None and token_stride != MLA_TOKEN_BYTES:
            return None
        if page_tokens == 1:
            maps.add((0, 1))
        elif page_tokens & (page_tokens - 1) or token_stride <= 0 or page_stride % token_stride:
            return None
        else:
            maps.add((page_tokens.bit_length() - 1, page_stride // token_stride))
    if len(maps) != 1:
        return None
    shift, rows = maps.pop()
    last = tsm.cache_tokens(ckv_cache, kv_cache) - 1
    if shift > MAX_PAGE_SHIFT or rows < 1 << shift or (last >= 0 and (last >> shift) * rows + (1 << shift) > ROW_LIMIT):
        return None
    return shift, rows


def _token_views(q_nope, q_pe, sparse_indices) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """q_nope, q_pe and the ids as views of tokens ([T, ...]), or None where one of them does not view so."""
    views = (_tokens(q_nope, 3), _tokens(q_pe, 3), _tokens(sparse_indices, 2))
    # `is`, not `None in views`: `in` compares each tensor with None elementwise, a tensor the size of q.
    return None if any(v is None for v in views) else views


def _in_requests(q_nope, q_pe, sparse_indices) -> bool:
    """Whether q and the ids come as requests ([B, S, ...]) rather than tokens."""
    return q_nope.dim() == 4 and q_pe.dim() == 4 and sparse_indices.dim() == 3


def strided_requests(q_nope, q_pe, sparse_indices) -> bool:
    """Whether q and the ids are requests ([B, S, ...]) that do not view as tokens (FlashMLA's tests pad every
    dimension of both): the kernel then steps a request and a position by their own strides."""
    return _in_requests(q_nope, q_pe, sparse_indices) and _token_views(q_nope, q_pe, sparse_indices) is None


def _token_layout(q_nope, q_pe, sparse_indices) -> tuple[int, tuple[int, int, int], tuple[int, int, int],
                                                         tuple[int, int]]:
    """(positions, q_nope's and q_pe's (request, position, head) strides, the ids' (request, position)
    strides) of a call _check_limits passed: the kernel's view of the tokens; positions 1 where they view as
    tokens (no position strides)."""
    views = _token_views(q_nope, q_pe, sparse_indices)
    if views is None:
        return q_nope.shape[1], q_nope.stride()[:3], q_pe.stride()[:3], sparse_indices.stride()[:2]
    q_nope, q_pe, sparse_indices = views
    return (1, (q_nope.stride(0), 0, q_nope.stride(1)), (q_pe.stride(0), 0, q_pe.stride(1)),
            (sparse_indices.stride(0), 0))


def _check_limits(q_nope, q_pe, sparse_indices, output, ckv_cache, kpe_cache, kv_cache) -> None:
    """What this kernel needs beyond the operator's contract (tsm.check_inputs): q and ids as tokens or
    requests, its token and topk limits and 16-byte alignment. Reads only the leading dims, so it may run
    before the contract."""
    views = _token_views(q_nope, q_pe, sparse_indices)
    _check(views is not None or _in_requests(q_nope, q_pe, sparse_indices),
           "takes q and ids as tokens ([T, H, 512], [T, topk]) or in requests ([B, S, H, 512], [B, S, topk])")
    if views is not None:
        q_nope, q_pe, sparse_indices = views
    _check(page_map(ckv_cache, kpe_cache, kv_cache) is not None,
           "reads caches of evenly strided pages, or of pages of a power of two of tokens padded by whole rows, "
           "FP8 tokens contiguous: use the Triton kernel")
    num_tokens, topk = sparse_indices.shape[:-1].numel(), sparse_indices.shape[-1]
    _check(num_tokens <= MAX_TOKENS, f"at most {MAX_TOKENS} query tokens per call, got {num_tokens}")
    _check(topk % BLOCK_TOKENS == 0 and topk <= MAX_TOPK,
           f"topk must be a multiple of {BLOCK_TOKENS} in [{BLOCK_TOKENS}, {MAX_TOPK}], got {topk}")
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("output", output)):
        check_aligned(WHO, name, t, t.dim() - 1)
    if kv_cache is not None:
        check_aligned(WHO, "kv_cache", kv_cache, 0)
    else:
        for name, cache in (("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache)):
            check_aligned(WHO, name, cache, 2)


def fits(q_nope, q_pe, sparse_indices, output, ckv_cache=None, kpe_cache=None, kv_cache=None) -> bool:
    """Whether the call is within this kernel's limits and alignment (_check_limits), for the dispatch:
    a call outside them goes to the Triton kernel. Needs no GPU and no library."""
    try:
        _check_limits(q_nope, q_pe, sparse_indices, output, ckv_cache, kpe_cache, kv_cache)
    except KernelInputError:
        return False
    return True


def _rows(t: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    """t's dim-0 entries [start, stop): t itself where that is all of it (a view costs host time every call)."""
    return t if t is None or (start == 0 and stop == t.shape[0]) else t[start:stop]


def sparse_mla_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, sparse_indices: torch.Tensor, sm_scale: float,
    output: torch.Tensor, lse: torch.Tensor, *, ckv_cache: torch.Tensor | None = None,
    kpe_cache: torch.Tensor | None = None, kv_cache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
    lse_base_e: bool = False, max_logits: torch.Tensor | None = None, empty_lse: float = float("-inf"),
    num_splits: int | None = None, reduce_in_cluster: bool | None = None,
    staged: bool | None = None, check: bool | None = None, count_bad_ids: bool = True,
) -> None:
    """Write output and lse in place (keyword arguments as triton_sparse_mla.sparse_mla_attention; requests
    whose q or ids do not view as tokens are read through their strides, strided_requests). num_splits overrides
    the split formula, reduce_in_cluster the choice of merging the splits in a cluster rather than by the
    combine kernel, staged the choice of staging an FP8 cache as fp16 rows first (stages_cache). Ids outside
    the cache are masked and counted in the Triton launcher's counter (bad_index_count); check (default:
    DSACTL_CHECK=1) refuses them on the host first."""
    num_tokens, heads, topk, fp8kv = check_inputs(q_nope, q_pe, sparse_indices, output, lse, ckv_cache,
                                                  kpe_cache, kv_cache, topk_length, attn_sink)
    if max_logits is not None:
        tsm.check_max_logits(max_logits, lse, num_tokens, heads, WHO)
    device = q_nope.device
    check_arch(device)
    tokens_in_cache = tsm.cache_tokens(ckv_cache, kv_cache)
    if checking(check):
        tsm.check_ids_in_cache(sparse_indices, topk_length, tokens_in_cache, WHO)
    tokens_per_length = q_nope.shape[1] if q_nope.dim() == 4 else 1  # a length a request
    if num_tokens == 0:
        return
    page_shift, page_rows = page_map(ckv_cache, kpe_cache, kv_cache)
    # Staging writes one row an id: from a cache whose ids are rows.
    staged = fp8kv and page_shift == 0 and (stages_cache(num_tokens, heads, topk, tokens_in_cache) if staged is None
                                            else staged)

    def cluster(splits: int) -> bool:
        # Staged rows are gathered per CTA, as bf16's: no head-group cluster to keep the splits' cluster from.
        return (merges_in_cluster(splits, heads, fp8kv and not staged) if reduce_in_cluster is None
                else reduce_in_cluster)

    # Forced knobs (tests, tuning) take one launch; else the plan, cut between requests.
    if num_splits is not None or reduce_in_cluster is not None:
        plan = ((num_tokens, num_splits or launch_splits(num_tokens, heads, topk, fp8kv, device)),)
    else:
        plan = launch_plan(num_tokens, heads, topk, fp8kv, device, tokens_per_length)
    for _, splits in plan:
        _check(1 <= splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {splits}")
        _check(not cluster(splits) or splits == CLUSTER_SPLITS,
               f"splits merged in a cluster must number exactly {CLUSTER_SPLITS}, got {splits}")
    if staged:
        rows, factors = fp8_staging.stage(kv_cache)
        kv_format, kv_a, stride_a, kv_b, stride_b = KV_STAGED, rows, rows.stride(0), factors, 0
    elif fp8kv:
        kv_format, kv_a, stride_a, kv_b, stride_b = KV_FP8, kv_cache, MLA_TOKEN_BYTES, None, 0
    else:
        kv_format, kv_a, stride_a = KV_BF16, ckv_cache, tsm.page_geometry(ckv_cache)[2]
        kv_b, stride_b = kpe_cache, tsm.page_geometry(kpe_cache)[2]

    # The kernel applies a positive logit scale to each block's raw maximum (one multiply a row, not one
    # a logit): a negative sm_scale flips q's sign instead (exact; a copy, off the served path), and 0
    # becomes the smallest denormal, which keeps a masked -inf at -inf and every finite logit within a
    # denormal of 0 (a weight of exactly 1).
    if sm_scale < 0:
        q_nope, q_pe, sm_scale = -q_nope, -q_pe, -sm_scale
    scale_log2 = float(sm_scale) * math.log2(math.e) or SMALLEST_DENORMAL
    lse_scale = 1.0 / math.log2(math.e) if lse_base_e else 1.0
    bad_count = tsm.bad_index_tensor(device, count_bad_ids)
    lib = library()

    def launch(r0: int, r1: int, splits: int) -> None:
        """The kernel (and the combine) over dim 0's entries [r0, r1) of q and the ids (tokens, or requests of
        tokens_per_length tokens)."""
        in_cluster = cluster(splits)
        t0, t1 = r0 * tokens_per_length, r1 * tokens_per_length
        q_n, q_p, ids, lengths = (_rows(t, r0, r1) for t in (q_nope, q_pe, sparse_indices, topk_length))
        out, lse_, max_ = (_rows(t, t0, t1) for t in (output, lse, max_logits))
        # One split, or splits merged in the cluster: the kernel writes the final output; else the Triton
        # launcher's partials layout.
        combined = splits > 1 and not in_cluster
        partials = (tsm.scaled_split_partials(device, t1 - t0, splits, heads) if combined
                    else (None, None, None, None))
        positions, q_nope_strides, q_pe_strides, ids_strides = _token_layout(q_n, q_p, ids)
        with torch.cuda.device(device):
            code = lib.dsa_hopper_mla_decode(
                q_n.data_ptr(), q_nope_strides[0], q_nope_strides[2],
                q_p.data_ptr(), q_pe_strides[0], q_pe_strides[2],
                kv_format, kv_a.data_ptr(), stride_a, None if kv_b is None else kv_b.data_ptr(), stride_b,
                ids.data_ptr(), ids_strides[0],
                t1 - t0, heads, topk, splits, int(in_cluster),
                scale_log2, lse_scale,
                out.data_ptr(), out.stride(0), out.stride(1),
                lse_.data_ptr(), lse_.stride(0), lse_.stride(1),
                *(None if t is None else t.data_ptr() for t in partials),
                tokens_in_cache, bad_count.data_ptr(),
                *(None if t is None else t.data_ptr() for t in (attn_sink, max_, lengths)),
                tokens_per_length, empty_lse, page_shift, page_rows, positions, q_nope_strides[1], q_pe_strides[1],
                ids_strides[1], torch.cuda.current_stream(device).cuda_stream,
            )
        if code != 0:
            raise KernelError(f"{WHO}: kernel launch failed: {lib.dsa_hopper_mla_error_string(code).decode()} "
                              f"(code {code})")
        if combined:
            tsm.combine(partials, attn_sink, out, lse_, lse_scale, heads, splits, t1 - t0, max_logits=max_,
                        empty_lse=empty_lse)

    start = 0
    for tokens, splits in plan:
        launch(start // tokens_per_length, (start + tokens) // tokens_per_length, splits)
        start += tokens


# One counter for the operator, whichever kernel served the call.
bad_index_count = tsm.bad_index_count
reset_bad_index_count = tsm.reset_bad_index_count

# Entries with the definitions' signatures, one per variant.
globals().update(entries(sparse_mla_attention, "sparse_attention"))
