"""FlashMLA's sparse attention API served by dsactl's kernels: `import dsactl.compat.flash_mla as flash_mla` where
an engine imports flash_mla for DeepSeek V3.2's sparse MLA.

Names, arguments, defaults and outputs are FlashMLA's (flash_mla/flash_mla_interface.py and its tests' ref.py):
- get_mla_metadata() -> (FlashMLASchedMeta(), None); flash_mla_with_kvcache(...) for sparse decode on the V3.2
  FP8 cache (656-byte tokens: 512 e4m3, 4 fp32 scales, 64 bf16 rope; d_qk 576, d_v 512): q [b, s_q, h_q, 576]
  bf16, k_cache [num_blocks, block_size, 1, 656] (float8_e4m3fn, int8 or uint8; blocks any stride apart, a
  block's tokens contiguous), indices [b, s_q, topk] int32 of flat token ids block * block_size + offset (-1:
  none), topk_length [b], attn_sink [h_q]. Returns out [b, s_q, h_q, 512] bf16 and lse [b, h_q, s_q] fp32
  (natural log, a view of [b, s_q, h_q]).
- flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length) for sparse prefill on bf16 KV:
  q [s_q, h_q, 576], kv [s_kv, 1, 576], indices [s_q, 1, topk] (negative or >= s_kv: none), topk_length
  [s_q]. Returns (out [s_q, h_q, 512] bf16, max_logits [s_q, h_q], lse [s_q, h_q]).
A query row with no valid index gets output 0, lse +inf and max_logits -inf; the sink scales the output by
exp(lse) / (exp(lse) + exp(sink)) and leaves lse alone. Heads 16, 32, 64 and 128 are served (FlashMLA: 64,
128); topk a multiple of 64 from 64 to 16384. Any layout of q, indices and the caches whose last dimension is
contiguous is read in place: no copy, no host synchronization (CUDA-graph capturable for fixed shapes).
Indices outside the cache are FlashMLA's way of saying "none", so they are not counted as bad indices
(dsactl.ops.bad_index_counters).

Not served, each raising CompatError naming the argument: the MODEL1 layout (d_qk 512), extra_k_cache /
extra_indices_in_kvcache / extra_topk_length, dense decode (indices None), a bf16 cache in
flash_mla_with_kvcache, and FlashMLA's dense prefill (flash_attn_varlen_*).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from dsactl.kernels.attention import solution
from dsactl.kernels.attention.triton_sparse_mla import requests_view_as_tokens
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.fp8 import MLA_CKV_DIM, MLA_KPE_DIM, MLA_TOKEN_BYTES

D_QK = MLA_CKV_DIM + MLA_KPE_DIM  # 576: V3.2's q and k head dim (d_v 512 the ckv part)
TOPK_STEP = 64  # FlashMLA's topk granularity, one block of its sparse kernels
MAX_TOPK = 16384  # the largest topk FlashMLA's tests and engines use
FP8_CACHE_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)


class CompatError(KernelInputError):
    """A FlashMLA call dsactl does not serve (yet)."""


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduling metadata object. dsactl's kernels schedule themselves, so it only records the
    first call's shapes, and later calls that reuse it must match them (as FlashMLA asserts)."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """An empty FlashMLASchedMeta (arguments ignored, as FlashMLA's current interface does)."""
    return FlashMLASchedMeta(), None


def _refuse(who: str, message: str) -> None:
    raise CompatError(f"{who}: {message}")


def _check_topk(who: str, topk: int) -> None:
    if topk % TOPK_STEP or not TOPK_STEP <= topk <= MAX_TOPK:
        _refuse(who, f"topk {topk} is not a multiple of {TOPK_STEP} in [{TOPK_STEP}, {MAX_TOPK}]")


def _check_q(who: str, q: torch.Tensor) -> None:
    if q.shape[-1] != D_QK:
        _refuse(who, f"q's head dim {q.shape[-1]} is not served (V3.2's {D_QK}; MODEL1's 512 is not served)")


def _record(meta: FlashMLASchedMeta, config: FlashMLASchedMeta.Config) -> None:
    if not isinstance(meta, FlashMLASchedMeta):
        _refuse("flash_mla_with_kvcache", "tile_scheduler_metadata must come from get_mla_metadata()")
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, config
    elif meta.config != config:
        _refuse("flash_mla_with_kvcache", f"the call does not match tile_scheduler_metadata's first call "
                                          f"({meta.config} != {config}): use one metadata object per shape")


def flash_mla_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, block_table: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor],
    head_dim_v: int, tile_scheduler_metadata: FlashMLASchedMeta, num_splits: None = None,
    softmax_scale: Optional[float] = None, causal: bool = False, is_fp8_kvcache: bool = False,
    indices: Optional[torch.Tensor] = None, attn_sink: Optional[torch.Tensor] = None,
    extra_k_cache: Optional[torch.Tensor] = None, extra_indices_in_kvcache: Optional[torch.Tensor] = None,
    topk_length: Optional[torch.Tensor] = None, extra_topk_length: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode over the V3.2 FP8 cache (module docstring): (out [b, s_q, h_q, 512], lse [b, h_q, s_q])."""
    who = "flash_mla_with_kvcache"
    if indices is None:
        _refuse(who, "dense decode (indices=None) is not served: pass the sparse indices")
    for name, value in (("extra_k_cache", extra_k_cache), ("extra_indices_in_kvcache", extra_indices_in_kvcache),
                        ("extra_topk_length", extra_topk_length)):
        if value is not None:
            _refuse(who, f"{name} is not served")
    if num_splits is not None:
        _refuse(who, "num_splits must be None")
    if causal:
        _refuse(who, "causal must be False with sparse indices")
    if not is_fp8_kvcache:
        _refuse(who, "sparse decode reads the FP8 cache: is_fp8_kvcache must be True")
    if head_dim_v != MLA_CKV_DIM:
        _refuse(who, f"head_dim_v {head_dim_v} is not served (only {MLA_CKV_DIM})")
    if q.dim() != 4:
        _refuse(who, f"q must be [b, s_q, h_q, {D_QK}], got {list(q.shape)}")
    _check_q(who, q)
    if k_cache.dim() != 4 or k_cache.shape[2] != 1 or k_cache.shape[3] != MLA_TOKEN_BYTES:
        _refuse(who, f"k_cache must be [num_blocks, block_size, 1, {MLA_TOKEN_BYTES}] (V3.2's FP8 layout), "
                     f"got {list(k_cache.shape)}")
    if k_cache.dtype not in FP8_CACHE_DTYPES:
        _refuse(who, f"k_cache must be float8_e4m3fn, int8 or uint8 bytes, got {k_cache.dtype}")
    b, s_q, h_q, _ = q.shape
    topk = indices.shape[-1]
    _check_topk(who, topk)
    _record(tile_scheduler_metadata, FlashMLASchedMeta.Config(
        b, s_q, h_q, k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache, topk, None, None))
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5

    out = torch.empty(b, s_q, h_q, MLA_CKV_DIM, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(b, s_q, h_q, dtype=torch.float32, device=q.device)
    if (s_q == 1 or topk_length is None) and requests_view_as_tokens(q) and requests_view_as_tokens(indices):
        # One length a token (or none), and requests that flatten to tokens as views: the form every
        # kernel takes (the Triton kernel also reads [b, s_q, ...] in place).
        q, indices = q.view(b * s_q, *q.shape[2:]), indices.view(b * s_q, topk)
    solution.sparse_mla_attention(
        q[..., :MLA_CKV_DIM], q[..., MLA_CKV_DIM:], indices, softmax_scale,
        out.view(b * s_q, h_q, MLA_CKV_DIM), lse.view(b * s_q, h_q),
        kv_cache=k_cache[:, :, 0].view(torch.int8), topk_length=topk_length, attn_sink=attn_sink,
        lse_base_e=True, empty_lse=math.inf, check=False, count_bad_ids=False)
    return out, lse.transpose(1, 2)


def flash_mla_sparse_fwd(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
    attn_sink: Optional[torch.Tensor] = None, topk_length: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill on bf16 KV (module docstring): (out [s_q, h_q, 512], max_logits [s_q, h_q], lse [s_q, h_q])."""
    who = "flash_mla_sparse_fwd"
    if d_v != MLA_CKV_DIM:
        _refuse(who, f"d_v {d_v} is not served (only {MLA_CKV_DIM})")
    if q.dim() != 3 or kv.dim() != 3 or indices.dim() != 3:
        _refuse(who, f"q, kv and indices must be [s_q, h_q, d_qk], [s_kv, h_kv, d_qk], [s_q, h_kv, topk]; got "
                     f"{list(q.shape)}, {list(kv.shape)}, {list(indices.shape)}")
    _check_q(who, q)
    if kv.shape[1] != 1 or indices.shape[1] != 1:
        _refuse(who, f"h_kv must be 1 (MQA), got kv {list(kv.shape)} and indices {list(indices.shape)}")
    if kv.shape[2] != D_QK:
        _refuse(who, f"kv's head dim {kv.shape[2]} is not {D_QK}")
    _check_topk(who, indices.shape[-1])
    s_q, h_q, _ = q.shape
    out = torch.empty(s_q, h_q, MLA_CKV_DIM, dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=q.device)
    # kv's tokens as one page [1, s_kv, ...]: token ids are rows.
    rows = kv[:, 0].unsqueeze(0)
    solution.sparse_mla_attention(
        q[..., :MLA_CKV_DIM], q[..., MLA_CKV_DIM:], indices[:, 0], sm_scale, out, lse,
        ckv_cache=rows[..., :MLA_CKV_DIM], kpe_cache=rows[..., MLA_CKV_DIM:], topk_length=topk_length,
        attn_sink=attn_sink, lse_base_e=True, max_logits=max_logits, empty_lse=math.inf, check=False,
        count_bad_ids=False)
    return out, max_logits, lse


def flash_attn_varlen_func(*args, **kwargs):
    _refuse("flash_attn_varlen_func", "FlashMLA's dense prefill is not served")


def flash_attn_varlen_qkvpacked_func(*args, **kwargs):
    _refuse("flash_attn_varlen_qkvpacked_func", "FlashMLA's dense prefill is not served")


def flash_attn_varlen_kvpacked_func(*args, **kwargs):
    _refuse("flash_attn_varlen_kvpacked_func", "FlashMLA's dense prefill is not served")
