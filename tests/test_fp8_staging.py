"""The FP8 cache staged as fp16 rows (kernels/attention/fp8_staging.py): the Triton kernel against a torch
emulation of the Hopper kernel's own conversion (store_fp8), bit for bit; and upconverted to bf16 rows, as
engines do before FlashMLA's bf16 prefill kernel."""

from __future__ import annotations

import pytest
import torch

from dsactl import fp8
from dsactl.kernels.attention import fp8_staging
from dsactl.kernels.errors import KernelInputError

# A Triton kernel reads CPU tensors only under its interpreter, which runs where no GPU is.
DEVICES = [pytest.param("cpu", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's case")),
           pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
               not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _expected(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What hopper_mla.cu's store_fp8 writes for each token, as (rows [N, 576] fp16, factors [N] fp32)."""
    raw = kv_cache.view(torch.uint8).reshape(-1, fp8.MLA_TOKEN_BYTES)
    e = raw[:, :fp8.MLA_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn).float().reshape(-1, 4, 128)
    scales = raw[:, fp8.MLA_SCALE_OFFSET:fp8.MLA_KPE_OFFSET].contiguous().view(torch.float32)
    kpe = raw[:, fp8.MLA_KPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    largest = torch.maximum(scales.abs().amax(1) * fp8.E4M3_MAX, kpe.abs().amax(1))
    exponent = ((largest.view(torch.int32) >> 23) & 0xFF) - 127
    shift = torch.where(largest >= 65504.0, (exponent - 14).clamp(max=15), torch.zeros_like(exponent))
    down = torch.exp2(-shift.float())
    ckv = (e * (scales * down[:, None])[..., None]).to(torch.float16).reshape(-1, fp8.MLA_CKV_DIM)
    return torch.cat([ckv, (kpe * down[:, None]).to(torch.float16)], 1), torch.exp2(shift.float())


def _cache(pages: int, device: str, seed: int) -> torch.Tensor:
    """An FP8 MLA cache whose tokens span the range the kernel serves (values below 2^31): most ordinary,
    some with ckv or rope values past 65504 by different powers of two (shifts 1 to the cap of 15), some
    with power-of-two scales."""
    g = torch.Generator().manual_seed(seed)
    tokens = pages * fp8.PAGE_SIZE
    ckv = torch.randn(tokens, fp8.MLA_CKV_DIM, generator=g).clamp(-4, 4)
    kpe = torch.randn(tokens, fp8.MLA_KPE_DIM, generator=g).clamp(-4, 4)
    big = torch.randperm(tokens, generator=g)[: tokens // 4]
    up = torch.exp2(12 + torch.arange(len(big)) % 17).float()[:, None]  # 2^12 .. 2^28, times |x| <= 4
    ckv[big[::2]] *= up[::2]
    kpe[big[1::2]] *= up[1::2]
    cache = fp8.quantize_mla_kv(ckv, kpe)
    pow2 = fp8.quantize_mla_kv(ckv[: tokens // 8], kpe[: tokens // 8], scales="ue8m0")
    cache[-(tokens // 8):] = pow2
    return cache.view(pages, fp8.PAGE_SIZE, fp8.MLA_TOKEN_BYTES).to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_staged_rows_are_the_fp8_paths_fp16_values_bit_for_bit(device):
    cache = _cache(5, device, seed=11)
    rows, factors = fp8_staging.stage(cache)
    want_rows, want_factors = _expected(cache.cpu())
    assert rows.shape == (5 * 64, fp8_staging.ROW_DIM) and rows.dtype == torch.float16
    assert torch.equal(factors.cpu(), want_factors) and bool((factors > 1).any())
    assert torch.equal(rows.cpu().view(torch.int16), want_rows.view(torch.int16))
    # Undoing the shifts gives the dequantized cache, to fp16's rounding (an ulp of 2^-10 relative, and
    # fp16's subnormal step 2^-24 times the token's factor).
    ckv, kpe = fp8.dequantize_mla_kv(cache.cpu().reshape(-1, fp8.MLA_TOKEN_BYTES))
    want = torch.cat([ckv, kpe], 1)
    error = (rows.cpu().float() * factors.cpu()[:, None] - want).abs()
    assert bool((error <= 2.0**-10 * want.abs() + 2.0**-24 * factors.cpu()[:, None]).all())


@pytest.mark.parametrize("device", DEVICES)
def test_upconverted_rows_are_the_dequantized_cache_rounded_once_to_bf16(device):
    cache = _cache(5, device, seed=12)
    rows = fp8_staging.upconvert(cache)
    ckv, kpe = fp8.dequantize_mla_kv(cache.cpu().reshape(-1, fp8.MLA_TOKEN_BYTES))
    full = torch.cat([ckv, kpe], 1)  # fp32; the rope values are bf16 already
    if device == "cpu":  # Triton's interpreter rounds fp32 -> bf16 toward zero, a GPU to the nearest even
        want = (full.view(torch.int32) >> 16).to(torch.int16)
    else:
        want = full.to(torch.bfloat16).view(torch.int16)
    assert rows.shape == (5 * 64, fp8_staging.ROW_DIM) and rows.dtype == torch.bfloat16
    assert torch.equal(rows.cpu().view(torch.int16), want)


@pytest.mark.parametrize("convert", [fp8_staging.stage, fp8_staging.upconvert])
def test_both_forms_refuse_what_is_not_a_contiguous_fp8_cache(convert):
    cache = _cache(2, "cpu", seed=1)
    for bad in (cache.view(torch.uint8), cache[..., :640], cache.transpose(0, 1)):
        with pytest.raises(KernelInputError, match="kv_cache must be"):
            convert(bad)
    empty = convert(cache[:0])
    assert (empty[0] if isinstance(empty, tuple) else empty).shape == (0, fp8_staging.ROW_DIM)

