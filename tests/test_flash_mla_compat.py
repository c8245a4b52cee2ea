"""dsactl.compat.flash_mla against FlashMLA's reference formulas (its tests' ref.py, restated here in float64):
sparse decode on the V3.2 FP8 cache and sparse prefill on bf16 KV, in the layouts FlashMLA's tests use (padded
blocks of odd sizes, every tensor a strided view, several query tokens a request), with its conventions (lse in
natural log, +inf and output 0 for a row with no valid index, max_logits, sinks of any sign or infinite, indices
negative or past the cache as padding). Under the Triton interpreter on a CPU, natively on a GPU; FlashMLA's own
test files run against the module in dsactl.conformance.flash_mla."""

from __future__ import annotations

import math

import pytest
import torch

from dsactl.compat import flash_mla
from dsactl.kernels.attention import solution
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.kernels.fp8 import MLA_TOKEN_BYTES, dequantize_mla_kv, quantize_mla_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
POISON_BYTE = 0x7F  # e4m3 NaN: a cache row the kernel must never read


def _padded(shape: tuple[int, ...], dtype, fill=0) -> torch.Tensor:
    """A view of `shape` inside a larger buffer (every dim one longer, the last 128 longer), as FlashMLA's
    tests make every input non-contiguous."""
    big = torch.full([n + (128 if i == len(shape) - 1 else 1) for i, n in enumerate(shape)], fill, dtype=dtype)
    return big[tuple(slice(0, n) for n in shape)]


def _quantize(blocked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The V3.2 FP8 cache (dsactl's quantizer, power-of-two scales) of values [blocks, block_size, 576], each
    block padded by one token as FlashMLA's tests allocate it: (cache [blocks, block_size, 1, 656]
    float8_e4m3fn, the values it holds, dequantized)."""
    blocks, size, _ = blocked.shape
    cache = torch.empty(blocks, size + 1, MLA_TOKEN_BYTES, dtype=torch.int8)[:, :size]
    cache.copy_(quantize_mla_kv(blocked[..., :512], blocked[..., 512:], "ue8m0"))
    ckv, kpe = dequantize_mla_kv(cache)
    return cache.view(torch.float8_e4m3fn).unsqueeze(2), torch.cat([ckv, kpe], dim=-1)


def _reference(q, rows, ids, valid, sm_scale, sink):
    """FlashMLA's ref.py in float64: (out [T, H, 512], lse [T, H] natural log, +inf where no index is valid,
    max_logits [T, H], -inf there)."""
    gathered = rows.double()[ids.long().clamp(0, rows.shape[0] - 1)]
    logits = torch.einsum("thd,tkd->thk", q.double(), gathered) * sm_scale
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, -1)
    weights = torch.exp(logits - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("thk,tkd->thd", weights, gathered[..., :512])
    if sink is not None:
        out = out / (1 + torch.exp(sink.double()[None, :] - lse))[..., None]
    empty = lse == -math.inf
    out[empty] = 0.0
    return out, lse.masked_fill(empty, math.inf), logits.amax(-1)


def _assert_close(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """Equal infinities in the same places, finite values within tol (relative to the largest)."""
    got, want = got.double().cpu(), want.double().cpu()
    assert torch.equal(torch.isposinf(got), torch.isposinf(want)) and torch.equal(torch.isneginf(got),
                                                                                     torch.isneginf(want))
    assert not got.isnan().any()
    finite = want.isfinite()
    assert torch.allclose(got[finite], want[finite], rtol=tol, atol=tol * max(1.0, want[finite].abs().max().item()))


def _sinks(heads: int, g: torch.Generator) -> torch.Tensor:
    sink = torch.randn(heads, generator=g)
    pick = torch.randn(heads, generator=g)
    sink[pick > 0.5], sink[pick < -0.5] = math.inf, -math.inf
    return sink


@pytest.mark.parametrize("heads, s_q, block_size, topk, lengths", [
    (64, 2, 5, 128, True),  # padded odd blocks, two tokens a request (q not flattenable), a length a request
    (128, 1, 64, 64, False),  # engine layout: 64-token blocks, one token a request
    (64, 3, 61, 64, False),
])
def test_sparse_decode_matches_flash_mla_reference(heads, s_q, block_size, topk, lengths):
    g = torch.Generator().manual_seed(heads + s_q + block_size)
    batch, blocks = 3, 12
    cache, dequantized = _quantize((torch.randn(blocks, block_size, 576, generator=g) / 10).clamp(-1, 1))
    tokens = blocks * block_size
    ids = torch.randint(0, tokens, (batch, s_q, topk), generator=g, dtype=torch.int32)
    ids[torch.rand(batch, s_q, topk, generator=g) < 0.2] = -1
    ids[1, -1] = -1  # a row with no valid index
    topk_length = torch.tensor([topk, topk // 2, 0][:batch], dtype=torch.int32) if lengths else None
    read = (ids >= 0) & ((torch.arange(topk)[None, None, :] < topk_length[:, None, None]) if lengths else True)
    unread = torch.ones(tokens, dtype=torch.bool)
    unread[ids[read].long()] = False
    cache.view(torch.uint8).view(blocks, block_size, MLA_TOKEN_BYTES)[unread.view(blocks, block_size)] = POISON_BYTE
    q = _padded((batch, s_q, heads, 576), torch.bfloat16)
    q.copy_(torch.randn(batch, s_q, heads, 576, generator=g).clamp(-1, 1))
    indices = _padded((batch, s_q, topk), torch.int32, fill=7)
    indices.copy_(ids)
    sink = _sinks(heads, g)
    sm_scale = 576 ** -0.55
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731 - keeps the views' strides
    meta, _ = flash_mla.get_mla_metadata()

    out, lse = flash_mla.flash_mla_with_kvcache(
        to(q), to(cache), None, None, 512, meta, None, sm_scale, False, True, to(indices), to(sink),
        topk_length=to(topk_length))

    assert out.shape == (batch, s_q, heads, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (batch, heads, s_q) and lse.dtype == torch.float32
    want_out, want_lse, _ = _reference(q.float().reshape(-1, heads, 576), dequantized.reshape(tokens, 576),
                                       ids.reshape(-1, topk), read.expand(batch, s_q, topk).reshape(-1, topk),
                                       sm_scale, sink)
    _assert_close(out.reshape(-1, heads, 512), want_out, 1e-2)
    _assert_close(lse.transpose(1, 2).reshape(-1, heads), want_lse, 1e-5)


@pytest.mark.parametrize("heads, topk, lengths", [(64, 128, True), (128, 64, False)])
def test_sparse_prefill_matches_flash_mla_reference(heads, topk, lengths):
    g = torch.Generator().manual_seed(heads + topk)
    s_q, s_kv = 5, 300
    kv = _padded((s_kv, 1, 576), torch.bfloat16)
    kv.copy_(torch.randn(s_kv, 1, 576, generator=g) / 10)
    q = _padded((s_q, heads, 576), torch.bfloat16)
    q.copy_(torch.randn(s_q, heads, 576, generator=g))
    ids = torch.randint(0, s_kv, (s_q, topk), generator=g, dtype=torch.int32)
    padding = torch.tensor([-2147483648, -123456, -1, s_kv, 114514, 2147483647], dtype=torch.int32)
    pad = torch.rand(s_q, topk, generator=g) < 0.3
    ids[pad] = padding[torch.randint(0, len(padding), (int(pad.sum()),), generator=g)]
    ids[2] = s_kv + 3  # no valid index
    indices = _padded((s_q, 1, topk), torch.int32)
    indices.copy_(ids[:, None])
    topk_length = torch.tensor([topk, 3, topk, 0, topk // 2], dtype=torch.int32) if lengths else None
    sink = _sinks(heads, g)
    to = lambda t: None if t is None else t.to(DEVICE)  # noqa: E731

    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(to(q), to(kv), to(indices), 0.5, attn_sink=to(sink),
                                                          topk_length=to(topk_length))

    valid = (ids >= 0) & (ids < s_kv)
    if lengths:
        valid &= torch.arange(topk)[None, :] < topk_length[:, None]
    want_out, want_lse, want_max = _reference(q.float(), kv[:, 0].float(), ids, valid, 0.5, sink)
    assert out.shape == (s_q, heads, 512) and max_logits.shape == lse.shape == (s_q, heads)
    _assert_close(out, want_out, 1e-2)
    _assert_close(lse, want_lse, 1e-5)
    _assert_close(max_logits, want_max, 1e-5)


def test_the_kernels_read_the_callers_tensors_in_place(monkeypatch):
    """No copy of q, the cache or the indices: what reaches the launcher are views of the caller's memory."""
    seen = {}
    monkeypatch.setattr(solution, "sparse_mla_attention", lambda *a, **kw: seen.update(args=a, kwargs=kw))
    cache = torch.zeros(4, 9, 1, MLA_TOKEN_BYTES, dtype=torch.float8_e4m3fn)[:, :7]
    q = _padded((2, 2, 64, 576), torch.bfloat16)
    indices = _padded((2, 2, 64), torch.int32)
    flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, flash_mla.get_mla_metadata()[0], is_fp8_kvcache=True,
                                     indices=indices, topk_length=torch.zeros(2, dtype=torch.int32))
    q_nope, q_pe, ids = seen["args"][:3]
    assert q_nope.data_ptr() == q.data_ptr() and q_pe.data_ptr() == q.data_ptr() + 512 * 2
    assert ids.data_ptr() == indices.data_ptr() and seen["kwargs"]["kv_cache"].data_ptr() == cache.data_ptr()
    assert seen["kwargs"]["check"] is False and seen["kwargs"]["count_bad_ids"] is False


@pytest.mark.parametrize("call, message", [
    (lambda q, c, i, m: flash_mla.flash_mla_with_kvcache(q[..., :512], c, None, None, 512, m, is_fp8_kvcache=True,
                                                         indices=i), "head dim 512"),
    (lambda q, c, i, m: flash_mla.flash_mla_with_kvcache(q, c, None, None, 512, m, is_fp8_kvcache=True, indices=i,
                                                         extra_k_cache=c), "extra_k_cache"),
    (lambda q, c, i, m: flash_mla.flash_mla_with_kvcache(q, c, None, None, 512, m, is_fp8_kvcache=True), "dense"),
    (lambda q, c, i, m: flash_mla.flash_mla_with_kvcache(q, c, None, None, 512, m, is_fp8_kvcache=True,
                                                         indices=i[..., :100]), "topk 100"),
    (lambda q, c, i, m: flash_mla.flash_mla_with_kvcache(q, c, None, None, 512, m, indices=i), "is_fp8_kvcache"),
    (lambda q, c, i, m: flash_mla.flash_attn_varlen_func(q, q, q, i, i, 1, 1), "dense prefill"),
])
def test_calls_outside_what_is_served_are_refused_naming_the_argument(call, message):
    q = torch.zeros(2, 1, 64, 576, dtype=torch.bfloat16)
    cache = torch.zeros(3, 64, 1, MLA_TOKEN_BYTES, dtype=torch.float8_e4m3fn)
    indices = torch.zeros(2, 1, 128, dtype=torch.int32)
    with pytest.raises(flash_mla.CompatError, match=message):
        call(q, cache, indices, flash_mla.get_mla_metadata()[0])


def test_metadata_reused_for_another_shape_is_refused(monkeypatch):
    monkeypatch.setattr(solution, "sparse_mla_attention", lambda *a, **kw: None)
    meta, _ = flash_mla.get_mla_metadata()
    cache = torch.zeros(3, 64, 1, MLA_TOKEN_BYTES, dtype=torch.float8_e4m3fn)
    for batch in (2, 2, 3):
        q = torch.zeros(batch, 1, 64, 576, dtype=torch.bfloat16)
        indices = torch.zeros(batch, 1, 128, dtype=torch.int32)
        if batch == 3:
            with pytest.raises(flash_mla.CompatError, match="tile_scheduler_metadata"):
                flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices)
        else:
            flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices)


def test_calls_past_the_grids_token_axis_run_in_slices_of_whole_requests(monkeypatch):
    """A call of more query tokens than one launch's grid takes gives what one launch gives (the slice size
    shrunk to 2 requests, 3 tokens each)."""
    g = torch.Generator().manual_seed(5)
    batch, s_q, heads, topk = 5, 3, 16, 64
    cache, _ = _quantize((torch.randn(4, 16, 576, generator=g) / 10))
    kv = cache[:, :, 0].view(torch.int8).to(DEVICE)
    q = torch.randn(batch, s_q + 1, heads, 576, generator=g).to(torch.bfloat16)[:, :s_q].to(DEVICE)
    ids = torch.randint(-1, 64, (batch, s_q, topk), generator=g, dtype=torch.int32).to(DEVICE)
    lengths = torch.randint(0, topk + 1, (batch,), generator=g, dtype=torch.int32).to(DEVICE)
    results = []
    for limit in (tsm.MAX_GRID_TOKENS, 2 * s_q + 1):
        monkeypatch.setattr(tsm, "MAX_GRID_TOKENS", limit)
        out = torch.full((batch * s_q, heads, 512), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        lse = torch.full((batch * s_q, heads), float("nan"), device=DEVICE)
        top = torch.full_like(lse, float("nan"))
        tsm.sparse_mla_attention(q[..., :512], q[..., 512:], ids, 0.1, out, lse, kv_cache=kv, topk_length=lengths,
                                 max_logits=top, lse_base_e=True, empty_lse=math.inf)
        results.append((out, lse, top))
    for a, b in zip(*results):
        assert not a.isnan().any() and torch.equal(a, b)


def _decode_call(seed: int, heads: int = 128, batch: int = 4, s_q: int = 2, topk: int = 256):
    """A flash_mla_with_kvcache call's inputs as an engine holds them (64-token blocks, contiguous), on the GPU."""
    g = torch.Generator().manual_seed(seed)
    blocks = 40
    cache, _ = _quantize((torch.randn(blocks, 64, 576, generator=g) / 10).clamp(-1, 1))
    inputs = {"q": torch.randn(batch, s_q, heads, 576, generator=g).clamp(-1, 1).to(torch.bfloat16),
              "k_cache": cache.contiguous(),
              "indices": torch.randint(-1, blocks * 64, (batch, s_q, topk), generator=g, dtype=torch.int32),
              "attn_sink": _sinks(heads, g)}
    return {name: t.to("cuda") for name, t in inputs.items()}


def _call(x: dict, meta):
    return flash_mla.flash_mla_with_kvcache(x["q"], x["k_cache"], None, None, 512, meta, None, 0.1, False, True,
                                            x["indices"], x["attn_sink"])


@pytest.mark.gpu
def test_gpu_a_decode_call_never_waits_for_the_host_and_replays_from_a_cuda_graph_on_new_values():
    static = _decode_call(seed=1)
    meta, _ = flash_mla.get_mla_metadata()
    _call(static, meta)  # warm-up: kernels compiled
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _call(static, meta)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _call(static, meta)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = _call(static, meta)
    for seed in (2, 3):
        fresh = _decode_call(seed)
        for name, t in fresh.items():
            static[name].copy_(t)
        graph.replay()
        want_out, want_lse = _call(fresh, flash_mla.get_mla_metadata()[0])
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
