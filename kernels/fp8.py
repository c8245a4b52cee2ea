"""Byte layouts of the two FP8 caches, with quantize and dequantize.

Indexer K cache page (8448 bytes): 64 tokens x 128 e4m3 bytes (8192 B), then 64
fp32 per-token scales (256 B). The page is viewed as int8 [num_pages, 64, 1, 132];
that view is NOT indexable per token (token t's bytes are not row t).

MLA FP8 KV token (656 bytes): 512 e4m3 values of ckv, 4 fp32 scales (one per
128 values), 64 bf16 rope values (kpe), kept in bf16 because rope is precision
sensitive. The cache is int8 [num_pages, 64, 656].

Scales are absmax / 448 (448 is the largest finite e4m3 value), so the largest
magnitude maps to the top of the e4m3 range. An MLA cache may instead take that
rounded up to a power of two ("ue8m0"), as DeepSeek V3.2 writes its cache (and
FlashMLA's tests quantize it); the kernels serve any positive fp32 scale.

The functions import torch where they run, so that reading the layouts (the definitions, a catalog)
imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import torch

PAGE_SIZE = 64
INDEX_HEAD_DIM = 128
INDEX_PAGE_BYTES = PAGE_SIZE * INDEX_HEAD_DIM + PAGE_SIZE * 4  # 8448
INDEX_SCALE_OFFSET = PAGE_SIZE * INDEX_HEAD_DIM  # 8192: scales follow the fp8 block

MLA_CKV_DIM = 512
MLA_KPE_DIM = 64
MLA_SCALE_GROUP = 128  # one scale per 128 ckv values
MLA_NUM_SCALES = MLA_CKV_DIM // MLA_SCALE_GROUP  # 4
MLA_TOKEN_BYTES = MLA_CKV_DIM + MLA_NUM_SCALES * 4 + MLA_KPE_DIM * 2  # 656
MLA_SCALE_OFFSET = MLA_CKV_DIM  # 512
MLA_KPE_OFFSET = MLA_CKV_DIM + MLA_NUM_SCALES * 4  # 528

E4M3_MAX = 448.0
# Floor for a scale, so an all-zero token quantizes to zeros instead of NaN.
MIN_SCALE = 1e-12


def _scale(absmax: torch.Tensor) -> torch.Tensor:
    return (absmax / E4M3_MAX).clamp_min(MIN_SCALE)


def quantize_index_k(k: torch.Tensor) -> torch.Tensor:
    """k: float [num_pages, 64, 128] -> int8 cache [num_pages, 64, 1, 132]."""
    import torch

    if k.dim() != 3 or k.shape[1:] != (PAGE_SIZE, INDEX_HEAD_DIM):
        raise ValueError(f"k must be [num_pages, {PAGE_SIZE}, {INDEX_HEAD_DIM}], got {list(k.shape)}")
    k = k.float()
    scale = _scale(k.abs().amax(dim=-1))  # [P, 64]
    fp8 = (k / scale[..., None]).to(torch.float8_e4m3fn)
    num_pages = k.shape[0]
    page = torch.empty(num_pages, INDEX_PAGE_BYTES, dtype=torch.uint8, device=k.device)
    page[:, :INDEX_SCALE_OFFSET] = fp8.view(torch.uint8).reshape(num_pages, -1)
    page[:, INDEX_SCALE_OFFSET:] = scale.contiguous().view(torch.uint8).reshape(num_pages, -1)
    return page.view(torch.int8).view(num_pages, PAGE_SIZE, 1, INDEX_PAGE_BYTES // PAGE_SIZE)


def index_k_fp8_and_scales(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 cache [P, 64, 1, 132] -> (e4m3 [P, 64, 128], fp32 scales [P, 64])."""
    import torch

    num_pages = cache.shape[0]
    raw = cache.view(torch.uint8).reshape(num_pages, INDEX_PAGE_BYTES)
    fp8 = raw[:, :INDEX_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn)
    scales = raw[:, INDEX_SCALE_OFFSET:].contiguous().view(torch.float32)
    return fp8.view(num_pages, PAGE_SIZE, INDEX_HEAD_DIM), scales.view(num_pages, PAGE_SIZE)


def dequantize_index_k(cache: torch.Tensor) -> torch.Tensor:
    """int8 cache [P, 64, 1, 132] -> float32 [P, 64, 128]."""
    fp8, scales = index_k_fp8_and_scales(cache)
    return fp8.float() * scales[..., None]


MLA_SCALE_FORMATS = ("fp32", "ue8m0")


def quantize_mla_kv(ckv: torch.Tensor, kpe: torch.Tensor, scales: str = "fp32") -> torch.Tensor:
    """ckv [..., 512], kpe [..., 64] -> int8 [..., 656] in the FP8 MLA token layout; scales "fp32"
    (absmax / 448) or "ue8m0" (that rounded up to a power of two)."""
    import torch

    if ckv.shape[-1] != MLA_CKV_DIM or kpe.shape[-1] != MLA_KPE_DIM or ckv.shape[:-1] != kpe.shape[:-1]:
        raise ValueError(f"ckv [..., 512] and kpe [..., 64] expected, got {list(ckv.shape)}, {list(kpe.shape)}")
    if scales not in MLA_SCALE_FORMATS:
        raise ValueError(f"scales must be one of {MLA_SCALE_FORMATS}, got {scales!r}")
    lead = ckv.shape[:-1]
    groups = ckv.float().reshape(*lead, MLA_NUM_SCALES, MLA_SCALE_GROUP)
    scale = _scale(groups.abs().amax(dim=-1))  # [..., 4]
    if scales == "ue8m0":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    fp8 = (groups / scale[..., None]).to(torch.float8_e4m3fn).reshape(*lead, MLA_CKV_DIM)
    out = torch.empty(*lead, MLA_TOKEN_BYTES, dtype=torch.uint8, device=ckv.device)
    out[..., :MLA_SCALE_OFFSET] = fp8.view(torch.uint8)
    out[..., MLA_SCALE_OFFSET:MLA_KPE_OFFSET] = scale.contiguous().view(torch.uint8)
    out[..., MLA_KPE_OFFSET:] = kpe.to(torch.bfloat16).contiguous().view(torch.uint8)
    return out.view(torch.int8)


def dequantize_mla_kv(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [..., 656] -> (ckv float32 [..., 512], kpe float32 [..., 64])."""
    import torch

    raw = cache.view(torch.uint8)
    lead = raw.shape[:-1]
    fp8 = raw[..., :MLA_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn)
    scale = raw[..., MLA_SCALE_OFFSET:MLA_KPE_OFFSET].contiguous().view(torch.float32)
    kpe = raw[..., MLA_KPE_OFFSET:].contiguous().view(torch.bfloat16)
    ckv = fp8.float().reshape(*lead, MLA_NUM_SCALES, MLA_SCALE_GROUP) * scale[..., None]
    return ckv.reshape(*lead, MLA_CKV_DIM), kpe.float()
