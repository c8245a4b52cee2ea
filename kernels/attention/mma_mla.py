"""Launcher of the small-head FP8 sparse MLA decode kernel (mma_mla.cu): input checks, split choice,
the split partials, then the kernel and, with several splits, the Triton combine.

Contract: the sparse attention operator (docs/design.md, Contracts; as triton_sparse_mla.py) for the
calls this kernel serves: 16 or 32 heads, FP8 KV (kv_cache, 656-byte tokens), topk up to 2048, every
variant (LSE base 2 or e, topk_length, attention sink), -1 ids anywhere, empty rows (output 0, lse
-inf). Ids outside the cache are masked and counted in the operator's one counter (bad_index_count).
Needs compute capability 9.0 or later with sm_90/sm_100's shared memory (MIN_CAPABILITY); 16-byte
aligned tensors and row strides of multiples of 8 elements (alignment.py), as the Hopper kernel.

Splits: split s of S takes the row positions s, s + S, ... as the Triton kernel, and its partials go
through the Triton combine (triton_sparse_mla.split_partials / combine).
"""

from __future__ import annotations

import ctypes
import math
from functools import lru_cache

import torch

from ..bad_index import checking
from ..cuda_library import load_library
from ..errors import KernelBuildError, KernelError, KernelInputError
from ..tuned import Table, table_path
from . import triton_sparse_mla as tsm
from .alignment import check_aligned
from .entries import Variant, entries

LIBRARY = "mma_mla"
WHO = "small-head FP8 sparse MLA attention"
HEADS = (16, 32)
HEADS_PER_GROUP = 16  # mma.sync M: 4 warps own 16 heads of one token; 32 heads are two groups in one CTA
BLOCK_TOKENS = 64  # gathered tokens a tile
MAX_TOPK = 2048  # the ids of a split sit in shared memory (dispatch.MMA_MAX_TOPK)
MAX_SPLITS = tsm.MAX_SPLITS  # the combine kernel's limit
# Up to this many splits merge in a cluster (a portable cluster's CTAs) instead of by the combine kernel:
# no fp32 partials through memory and no second launch.
MAX_CLUSTER_SPLITS = 8
# The split count merged in its cluster unless a call says otherwise: at 2 the merge saves the combine's
# traffic and launch; from 3 on split 0 merges its peers one after another and a larger cluster waits for
# that many free SMs of one GPC, and the combine kernel wins (docs/design.md, "Measured choices").
CLUSTER_DEFAULT_SPLITS = 2
MAX_TOKENS = 65535  # tokens are the kernel grid's z dimension
# Bulk copies and mbarrier transactions (and cvt from e4m3: 8.9); the library also refuses a GPU whose
# per-CTA shared memory is below the kernel's (sm_120).
MIN_CAPABILITY = (9, 0)
# CTAs an SM (the kernel's launch bounds and shared memory): 16 heads 2, 32 heads (two head groups a CTA) 1.
CTAS_PER_SM = {16: 2, 32: 1}
# A CTA's fp32 partial (16 heads x 512 values, 32 KB a head group), written and read back by the combine,
# in tile-times of the split formula: the partials' traffic against the split's parallelism (checked
# against a split sweep: docs/design.md, "Measured choices").
PARTIAL_TILES_PER_GROUP = 3.0


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise KernelInputError(f"{WHO}: {message}")


def num_splits_for(num_tokens: int, heads: int, topk: int, num_sms: int) -> int:
    """Splits per token: the Triton kernel's formula with this kernel's CTA (every head of a token, tiles
    of BLOCK_TOKENS), CTAS_PER_SM CTAs an SM and the cost of its partials."""
    groups = heads // HEADS_PER_GROUP
    cta = tsm.Config(block_h=heads, block_n=BLOCK_TOKENS, num_warps=4 * groups, num_stages=1)
    return tsm.num_splits_for(num_tokens, heads, topk, cta, num_sms * CTAS_PER_SM[heads],
                              PARTIAL_TILES_PER_GROUP * groups)


# `dsactl tune`'s table (kernels/tuned.py): per GPU and shape bucket, the split count that beat the formula.
TUNED = Table(table_path(__file__))


def launch_splits(num_tokens: int, heads: int, topk: int, device: torch.device) -> int:
    """Splits of a launch: this GPU's tuned entry for the call's bucket (FP8 KV), else num_splits_for()."""
    return tsm.launch_splits(TUNED, num_tokens, heads, topk, True, device, MAX_SPLITS,
                             lambda num_sms: num_splits_for(num_tokens, heads, topk, num_sms))


@lru_cache(maxsize=None)
def library() -> ctypes.CDLL:
    """lib{LIBRARY}.so for this GPU, bound; a KernelBuildError names the build to run when it is missing."""
    return bind(load_library(LIBRARY))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the C ABI of mma_mla.cu on a loaded library."""
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_float
    lib.dsa_mma_mla_decode.restype = i32
    lib.dsa_mma_mla_decode.argtypes = [
        p, i64, i64,  # q_nope, strides (token, head)
        p, i64, i64,  # q_pe, strides
        p,  # kv (FP8 656-byte tokens)
        p, i64,  # indices, row stride
        p, p,  # topk_length, sink (nullable)
        i32, i32, i32, i32, i32,  # num_tokens, heads, topk, num_splits, reduce_in_cluster
        f32, f32,  # sm_scale * log2(e), lse scale
        p, i64, i64,  # output, strides
        p, i64, i64,  # lse, strides
        p, p, p,  # partials: acc, m, l
        i64, p,  # cache_tokens (ids are valid below it), int32 counter of the masked out-of-range ids
        p,  # cudaStream_t
    ]
    lib.dsa_mma_mla_error_string.restype = ctypes.c_char_p
    lib.dsa_mma_mla_error_string.argtypes = [i32]
    for name in ("max_splits", "max_cluster_splits", "max_tokens", "max_topk", "heads_per_group"):
        getattr(lib, f"dsa_mma_mla_{name}").restype = i32
    limits = (lib.dsa_mma_mla_max_splits(), lib.dsa_mma_mla_max_cluster_splits(), lib.dsa_mma_mla_max_tokens(),
              lib.dsa_mma_mla_max_topk(), lib.dsa_mma_mla_heads_per_group())
    if limits != (MAX_SPLITS, MAX_CLUSTER_SPLITS, MAX_TOKENS, MAX_TOPK, HEADS_PER_GROUP):
        raise KernelBuildError(f"lib{LIBRARY}.so was built with different limits: rebuild it with `dsactl build`")
    return lib


def _check_limits(q_nope, q_pe, sparse_indices, output, kv_cache) -> None:
    """What this kernel needs beyond the operator's contract: FP8 KV, its token and topk limits, 16-byte
    alignment. Reads only the leading dims, so it may run before the contract check."""
    _check(kv_cache is not None, "serves FP8 KV (kv_cache) only: use the Triton kernel for bf16 KV")
    _check(q_nope.dim() == 3 and sparse_indices.dim() == 2, "takes [T, H, 512] q and [T, topk] ids (one token "
                                                             "a request): use the Triton kernel")
    _check(tsm.ids_are_rows(None, None, kv_cache), "reads FP8 caches whose token ids are rows (evenly strided "
                                                   "pages of contiguous tokens): use the Triton kernel")
    num_tokens, topk = sparse_indices.shape[0], sparse_indices.shape[-1]
    _check(num_tokens <= MAX_TOKENS, f"at most {MAX_TOKENS} query tokens per call, got {num_tokens}")
    _check(topk <= MAX_TOPK, f"topk must be at most {MAX_TOPK}, got {topk}")
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("output", output)):
        check_aligned(WHO, name, t, 2)
    check_aligned(WHO, "kv_cache", kv_cache, 0)


def fits(q_nope, q_pe, sparse_indices, output, kv_cache=None) -> bool:
    """Whether the call is within this kernel's limits and alignment, for the dispatch. No GPU needed."""
    try:
        _check_limits(q_nope, q_pe, sparse_indices, output, kv_cache)
    except KernelInputError:
        return False
    return True


def check_arch(device: torch.device) -> None:
    _check(device.type == "cuda", f"needs CUDA tensors (got {device})")
    capability = tuple(torch.cuda.get_device_capability(device))
    _check(capability >= MIN_CAPABILITY, f"needs compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or "
                                         f"later; this GPU is {capability[0]}.{capability[1]}")


def sparse_mla_attention(
    q_nope: torch.Tensor, q_pe: torch.Tensor, sparse_indices: torch.Tensor, sm_scale: float,
    output: torch.Tensor, lse: torch.Tensor, *, ckv_cache: torch.Tensor | None = None,
    kpe_cache: torch.Tensor | None = None, kv_cache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None,
    lse_base_e: bool = False, max_logits: torch.Tensor | None = None, empty_lse: float = float("-inf"),
    num_splits: int | None = None, reduce_in_cluster: bool | None = None,
    check: bool | None = None, count_bad_ids: bool = True,
) -> None:
    """Write output and lse in place (keyword arguments as triton_sparse_mla.sparse_mla_attention; FP8 KV
    only). num_splits overrides the split formula, reduce_in_cluster the choice of merging the splits in
    a cluster (2 to MAX_CLUSTER_SPLITS of them; by default CLUSTER_DEFAULT_SPLITS) rather than by the
    combine kernel. Ids outside the cache are masked and counted (bad_index_count); check (default:
    DSACTL_CHECK=1) refuses them on the host first."""
    _check(max_logits is None and empty_lse == float("-inf"),
           "max_logits and an empty row's lse other than -inf are not served here: use the Triton kernel")
    num_tokens, heads, topk, _ = tsm.check_inputs(q_nope, q_pe, sparse_indices, output, lse, ckv_cache, kpe_cache,
                                                  kv_cache, topk_length, attn_sink, HEADS, WHO)
    _check_limits(q_nope, q_pe, sparse_indices, output, kv_cache)
    device = q_nope.device
    check_arch(device)
    tokens_in_cache = tsm.cache_tokens(None, kv_cache)
    if checking(check):
        tsm.check_ids_in_cache(sparse_indices, topk_length, tokens_in_cache, WHO)
    if num_tokens == 0:
        return
    splits = num_splits or launch_splits(num_tokens, heads, topk, device)
    _check(1 <= splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {splits}")
    clusterable = 2 <= splits <= MAX_CLUSTER_SPLITS
    in_cluster = splits == CLUSTER_DEFAULT_SPLITS if reduce_in_cluster is None else reduce_in_cluster
    _check(not in_cluster or clusterable,
           f"splits merged in a cluster must number 2 to {MAX_CLUSTER_SPLITS}, got {splits}")
    lse_scale = 1.0 / math.log2(math.e) if lse_base_e else 1.0
    combined = splits > 1 and not in_cluster
    partials = tsm.split_partials(device, num_tokens, splits, heads) if combined else (None, None, None)

    lib = library()
    with torch.cuda.device(device):
        code = lib.dsa_mma_mla_decode(
            q_nope.data_ptr(), q_nope.stride(0), q_nope.stride(1),
            q_pe.data_ptr(), q_pe.stride(0), q_pe.stride(1), kv_cache.data_ptr(),
            sparse_indices.data_ptr(), sparse_indices.stride(0),
            None if topk_length is None else topk_length.data_ptr(),
            None if attn_sink is None else attn_sink.data_ptr(),
            num_tokens, heads, topk, splits, int(in_cluster), float(sm_scale) * math.log2(math.e), lse_scale,
            output.data_ptr(), output.stride(0), output.stride(1),
            lse.data_ptr(), lse.stride(0), lse.stride(1),
            *(None if t is None else t.data_ptr() for t in partials),
            tokens_in_cache, tsm.bad_index_tensor(device, count_bad_ids).data_ptr(),
            torch.cuda.current_stream(device).cuda_stream,
        )
    if code != 0:
        raise KernelError(f"{WHO}: kernel launch failed: {lib.dsa_mma_mla_error_string(code).decode()} "
                          f"(code {code})")
    if combined:
        tsm.combine(partials, attn_sink, output, lse, lse_scale, heads, splits, num_tokens)


# One counter for the operator, whichever kernel served the call.
bad_index_count = tsm.bad_index_count
reset_bad_index_count = tsm.reset_bad_index_count

# Entries with the definitions' signatures, for the variants served (FP8 KV).
SERVED_VARIANTS = tuple(Variant(True, lse_e, topk_length, sink) for lse_e in (False, True)
                        for topk_length in (False, True) for sink in (False, True))
globals().update(entries(sparse_mla_attention, "sparse_attention", SERVED_VARIANTS))
