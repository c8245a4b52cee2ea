import pytest
import torch

from dsactl import fp8


def test_index_page_layout_and_round_trip():
    g = torch.Generator().manual_seed(1)
    k = torch.randn(5, 64, 128, generator=g) * 3
    cache = fp8.quantize_index_k(k)
    assert cache.shape == (5, 64, 1, 132) and cache.dtype == torch.int8
    assert cache[0].numel() == fp8.INDEX_PAGE_BYTES == 8448
    raw = cache.view(torch.uint8).reshape(5, -1)
    # Scales sit after the 8192 fp8 bytes of the page, absmax / 448 per token.
    scales = raw[:, 8192:].contiguous().view(torch.float32)
    torch.testing.assert_close(scales, k.abs().amax(-1) / 448.0)
    back = fp8.dequantize_index_k(cache)
    # e4m3 keeps 3 mantissa bits: relative error per element under 2^-4 of the token's absmax.
    assert ((back - k).abs() <= k.abs().amax(-1, keepdim=True) / 16).all()
    assert (back - k).norm() / k.norm() < 0.05


def test_index_token_of_page_is_not_row_of_view():
    k = torch.randn(1, 64, 128, generator=torch.Generator().manual_seed(2))
    cache = fp8.quantize_index_k(k)
    fp8_bytes, _ = fp8.index_k_fp8_and_scales(cache)
    # Token 1's fp8 bytes start at byte 128 of the page, i.e. inside row 0 of the [64, 132] view.
    assert torch.equal(cache.view(torch.uint8).reshape(-1)[128:256], fp8_bytes[0, 1].view(torch.uint8))


def test_mla_token_layout_and_round_trip():
    g = torch.Generator().manual_seed(3)
    ckv, kpe = torch.randn(2, 64, 512, generator=g), torch.randn(2, 64, 64, generator=g)
    cache = fp8.quantize_mla_kv(ckv, kpe)
    assert cache.shape == (2, 64, 656) and cache.dtype == torch.int8
    raw = cache.view(torch.uint8)
    scales = raw[..., 512:528].contiguous().view(torch.float32)
    torch.testing.assert_close(scales, ckv.reshape(2, 64, 4, 128).abs().amax(-1) / 448.0)
    assert torch.equal(raw[..., 528:].contiguous().view(torch.bfloat16), kpe.bfloat16())
    ckv2, kpe2 = fp8.dequantize_mla_kv(cache)
    assert (ckv2 - ckv).norm() / ckv.norm() < 0.05
    torch.testing.assert_close(kpe2, kpe.bfloat16().float())


def test_zero_token_quantizes_without_nan():
    cache = fp8.quantize_index_k(torch.zeros(1, 64, 128))
    assert torch.isfinite(fp8.dequantize_index_k(cache)).all()


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        fp8.quantize_index_k(torch.randn(64, 128))
    with pytest.raises(ValueError):
        fp8.quantize_mla_kv(torch.randn(3, 500), torch.randn(3, 64))


def test_mla_ue8m0_scales_are_the_fp32_scales_rounded_up_to_powers_of_two():
    g = torch.Generator().manual_seed(5)
    ckv = torch.randn(3, 64, 512, generator=g) * torch.exp2(torch.randint(-12, 12, (3, 64, 1), generator=g).float())
    kpe = torch.randn(3, 64, 64, generator=g)
    scales = {f: fp8.quantize_mla_kv(ckv, kpe, f).view(torch.uint8)[..., 512:528].contiguous().view(torch.float32)
              for f in ("fp32", "ue8m0")}
    assert torch.equal(scales["ue8m0"], torch.exp2(torch.log2(scales["ue8m0"]).round()))  # powers of two
    assert (scales["ue8m0"] >= scales["fp32"]).all() and (scales["ue8m0"] < 2 * scales["fp32"]).all()
    ckv2, _ = fp8.dequantize_mla_kv(fp8.quantize_mla_kv(ckv, kpe, "ue8m0"))
    assert ((ckv2 - ckv).norm(dim=-1) / ckv.norm(dim=-1)).max() < 0.1
    with pytest.raises(ValueError, match="scales"):
        fp8.quantize_mla_kv(ckv, kpe, "bf16")
