"""The ragged prefill logits (kernels/indexer/mqa_logits.py) and DeepGEMM's API over them
(dsactl.compat.deep_gemm): against a float64 reference of the contract, under the Triton interpreter on a
CPU and natively on a GPU."""

import pytest
import torch

from dsactl.compat import deep_gemm
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.indexer import mqa_logits as ml

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, H, D, S, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g).to(torch.float8_e4m3fn)
    k = torch.randn(S, D, generator=g).to(torch.float8_e4m3fn)
    k_scale = torch.rand(S, generator=g) * 0.02 + 0.001
    weights = torch.randn(T, H, generator=g) / H
    starts = torch.randint(-3, S + 3, (T,), generator=g)
    ends = starts + torch.randint(-2, S // 2 + 3, (T,), generator=g)
    starts[0], ends[0] = 0, S  # a whole row
    ks, ke = starts.to(torch.int32), ends.to(torch.int32)
    return [t.to(DEVICE) for t in (q, k, k_scale, weights, ks, ke)]


def _reference(q, k, k_scale, weights, ks, ke):
    """float64 logits [T, S] and the mask of the keys each row sees (ks, ke clamped to [0, S])."""
    s = torch.einsum("thd,sd->ths", q.double(), k.double()).relu()
    logits = (s * weights.double()[:, :, None]).sum(1) * k_scale.double()[None, :]
    pos = torch.arange(k.shape[0], device=q.device)
    lo, hi = ks.long().clamp(0, k.shape[0]), ke.long().clamp(0, k.shape[0])
    seen = (pos[None] >= lo[:, None]) & (pos[None] < hi[:, None])
    return logits, seen


# fp32 logits: the interpreter multiplies in fp32, exactly; a GPU's FP8 tensor cores accumulate in fewer bits
# than fp32 (on an H100, errors near 2e-4 of the largest logit), as DeepGEMM's kernels do.
FP32_TOL = 1e-3 if DEVICE == "cuda" else 1e-5
BF16_TOL = 1e-2


def _close(got, want, dtype):
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    return torch.allclose(got.double(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("heads, dim", [(h, d) for h in ml.HEADS for d in ml.DIMS])
def test_full_rows_match_the_reference_and_every_element_is_written(heads, dim):
    q, k, k_scale, weights, ks, ke = _inputs(7, heads, dim, 300, seed=heads + dim)
    want, seen = _reference(q, k, k_scale, weights, ks, ke)
    logits = torch.full((7, 300), float("nan"), device=DEVICE)
    ml.mqa_logits(q, k, k_scale, weights, ks, ke, logits, clean=True)
    assert not logits.isnan().any()
    assert torch.equal(torch.isneginf(logits), ~seen)
    assert _close(logits[seen], want[seen], torch.float32)


@pytest.mark.parametrize("dtype", ml.LOGITS_DTYPES)
def test_unclean_and_compressed_rows_write_only_the_keys_each_row_sees(dtype):
    q, k, k_scale, weights, ks, ke = _inputs(9, 32, 64, 260, seed=5)
    want, seen = _reference(q, k, k_scale, weights, ks, ke)
    logits = torch.full((9, 260), float("nan"), device=DEVICE, dtype=dtype)
    ml.mqa_logits(q, k, k_scale, weights, ks, ke, logits, clean=False)
    assert logits[~seen].isnan().all() and _close(logits[seen], want[seen], dtype)

    width = int(seen.sum(1).max())
    packed = torch.full((9, width), float("nan"), device=DEVICE, dtype=dtype)
    ml.mqa_logits(q, k, k_scale, weights, ks.clamp(min=0), ke, packed, clean=False, compressed=True)
    for i in range(9):
        cols = seen[i].nonzero().flatten()
        n = len(cols)
        assert _close(packed[i, :n], want[i, cols], dtype), i
        assert packed[i, n:].isnan().all(), i


def test_the_same_inputs_give_the_same_bits_and_row_strided_weights_are_read_in_place():
    q, k, k_scale, weights, ks, ke = _inputs(6, 64, 128, 400, seed=11)
    wide = torch.randn(6, 80, device=DEVICE)
    wide[:, 3:67] = weights
    first, again = (torch.empty(6, 400, device=DEVICE) for _ in range(2))
    ml.mqa_logits(q, k, k_scale, weights, ks, ke, first)
    ml.mqa_logits(q, k, k_scale, wide[:, 3:67], ks, ke, again)
    assert torch.equal(first.view(torch.int32), again.view(torch.int32))


def test_calls_outside_the_contract_are_refused_naming_the_argument():
    q, k, k_scale, weights, ks, ke = _inputs(2, 32, 64, 64, seed=2)
    out = torch.empty(2, 64, device=DEVICE)
    with pytest.raises(KernelInputError, match="48 heads"):
        ml.mqa_logits(torch.zeros(2, 48, 64, device=DEVICE).to(torch.float8_e4m3fn), k, k_scale, weights, ks, ke, out)
    with pytest.raises(KernelInputError, match="k_scale"):
        ml.mqa_logits(q, k, k_scale.double(), weights, ks, ke, out)
    with pytest.raises(KernelInputError, match="no outside to clean"):
        ml.mqa_logits(q, k, k_scale, weights, ks, ke, out[:, :10], clean=True, compressed=True)
    with pytest.raises(KernelInputError, match="full-form logits"):
        ml.mqa_logits(q, k, k_scale, weights, ks, ke, out[:, :10], clean=False)


def _deepgemm_reference(q, kv, weights, ks, ke):
    """DeepGEMM's tests' reference (ref_fp8_mqa_logits): einsum over heads, -inf outside [ks, ke)."""
    score = torch.einsum("mhd,nd->hmn", q, kv)
    logits = torch.einsum("hmn,hm->mn", score.relu(), weights.transpose(0, 1))
    pos = torch.arange(kv.shape[0], device=q.device)
    mask = (pos[None, :] >= ks[:, None]) & (pos[None, :] < ke[:, None])
    return logits.masked_fill(~mask, float("-inf"))


@pytest.mark.parametrize("max_seqlen_k", [0, 1])
def test_deep_gemm_api_matches_deep_gemms_reference_formula(max_seqlen_k):
    T, H, D, S = 8, 64, 128, 256
    g = torch.Generator().manual_seed(max_seqlen_k)
    q = torch.randn(T, H, D, generator=g).to(DEVICE)
    kv = torch.randn(S, D, generator=g).to(DEVICE)
    weights = torch.randn(T, H, generator=g).to(DEVICE)
    ks = torch.zeros(T, dtype=torch.int32, device=DEVICE)
    ke = (torch.arange(T, dtype=torch.int32, device=DEVICE) + S - T)
    scale = kv.abs().amax(1).clamp(min=1e-4) / 448.0  # per key, as DeepGEMM's per_custom_dims_cast_to_fp8
    kv_fp8 = (kv / scale[:, None]).to(torch.float8_e4m3fn)
    q_fp8 = q.to(torch.float8_e4m3fn)
    want = _deepgemm_reference(q_fp8.float(), kv_fp8.float() * scale[:, None], weights, ks, ke)
    width = int((ke - ks).max()) if max_seqlen_k else 0
    got = deep_gemm.fp8_mqa_logits(q_fp8, (kv_fp8, scale), weights, ks, ke, clean_logits=not width,
                                   max_seqlen_k=width)
    if width:
        assert got.shape == (T, width)
        full = torch.full((T, S), float("-inf"), device=DEVICE)
        for i in range(T):
            full[i, ks[i]:ke[i]] = got[i, :ke[i] - ks[i]]
        got = full
    assert got.shape == (T, S) and torch.equal(torch.isneginf(got), torch.isneginf(want))
    finite = ~torch.isneginf(want)
    assert torch.allclose(got[finite], want[finite], rtol=max(1e-4, FP32_TOL),
                          atol=max(1e-3, FP32_TOL * want[finite].abs().max().item()))


def _fused_cache(kv):
    """DeepGEMM's paged FP8 cache (its tests' kv_cache_cast_to_fp8): per block, the e4m3 keys then one fp32
    scale a key, as uint8 [blocks, block_kv, 1, D + 4]; and the keys it encodes, dequantized."""
    blocks, block_kv, _, dim = kv.shape
    scale = kv.abs().float().amax(dim=3, keepdim=True).clamp(1e-4) / 448.0
    fp8 = (kv * (1.0 / scale)).to(torch.float8_e4m3fn)
    fused = torch.empty(blocks, block_kv * (dim + 4), dtype=torch.uint8, device=kv.device)
    fused[:, :block_kv * dim] = fp8.view(blocks, block_kv * dim).view(torch.uint8)
    fused[:, block_kv * dim:] = scale.view(blocks, block_kv).view(torch.uint8)
    return fused.view(blocks, block_kv, 1, dim + 4), fp8.float() * scale


def _deepgemm_paged_reference(q, keys, weights, visible, block_table):
    """DeepGEMM's tests' paged reference, per row: keys gathered through the block table, ReLU, weighted
    head sum; -inf at and past the row's visible count."""
    rows, heads = weights.shape
    next_n = rows // q.shape[0]
    width = block_table.shape[1] * keys.shape[1]
    out = torch.full((rows, width), float("-inf"), dtype=torch.float64, device=q.device)
    for r in range(rows):
        b, j = divmod(r, next_n)
        k = keys[block_table[b].long()].reshape(width, -1).double()
        s = (q[b, j].double() @ k.T).relu()  # [heads, width]
        n = int(visible[r])
        out[r, :n] = (s * weights[r].double()[:, None]).sum(0)[:n]
    return out


@pytest.mark.parametrize("row_lens, dtype, clean", [(False, torch.float32, False), (True, torch.float32, True),
                                                    (True, torch.bfloat16, False)])
def test_deep_gemm_paged_logits_match_deep_gemms_reference_formula(row_lens, dtype, clean):
    B, N, H, D, blocks_per_row = 3, 2, 64, 128, 3
    g = torch.Generator().manual_seed(7 + row_lens)
    q = torch.randn(B, N, H, D, generator=g).to(torch.float8_e4m3fn).to(DEVICE)
    weights = torch.randn(B * N, H, generator=g).to(DEVICE)
    cache, keys = _fused_cache(torch.randn(B * blocks_per_row + 2, 64, 1, D, generator=g).to(DEVICE))
    block_table = torch.randperm(B * blocks_per_row + 2, generator=g)[:B * blocks_per_row].view(B, -1)
    block_table = block_table.to(torch.int32).to(DEVICE)
    context = torch.tensor([150, 64 * blocks_per_row, 7], dtype=torch.int32, device=DEVICE)
    if row_lens:
        lens = torch.stack([context // 2, context], 1).to(torch.int32).contiguous()
        visible = lens.flatten()
    else:
        lens = context
        visible = (context[:, None] - N + 1 + torch.arange(N, device=DEVICE)[None, :]).flatten()
    width = blocks_per_row * 64
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, 64, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32  # DeepGEMM's schedule shape
    got = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, block_table, meta, width,
                                             clean_logits=clean, logits_dtype=dtype)
    want = _deepgemm_paged_reference(q.float(), keys.squeeze(2), weights, visible, block_table)
    assert got.shape == (B * N, width) and got.dtype == dtype
    pos = torch.arange(width, device=DEVICE)[None, :]
    seen = pos < visible[:, None]
    assert _close(got[seen], want[seen], dtype)
    longest = visible.view(B, N).amax(1).repeat_interleave(N)[:, None]
    assert torch.isneginf(got[~seen & (pos < longest)]).all()
    if clean:
        assert torch.isneginf(got[~seen]).all()


def test_deep_gemm_api_refuses_what_it_does_not_serve_in_one_line():
    with pytest.raises(deep_gemm.CompatError, match="FP4 q"):
        deep_gemm.fp8_fp4_mqa_logits((None, torch.zeros(1)), (None, None), None, None, None)
    q = torch.zeros(1, 64, 128).to(torch.float8_e4m3fn)
    weights = torch.zeros(1, 64)
    with pytest.raises(deep_gemm.CompatError, match="clean_logits=False"):
        deep_gemm.fp8_fp4_mqa_logits((q, None), (None, None), weights, None, None, clean_logits=True, max_seqlen_k=4)
    # DeepGEMM's sm_100-only shapes, named.
    for q_, w_, message in ((q[:, :16], weights[:, :16], "16 heads"), (q, weights.bfloat16(), "bfloat16 weights"),
                            (torch.zeros(1, 64, 256).to(torch.float8_e4m3fn), weights, "head dim 256")):
        with pytest.raises(deep_gemm.CompatError, match=message):
            deep_gemm.fp8_fp4_mqa_logits((q_, None), (None, None), w_, None, None)
    lens = torch.ones(2, dtype=torch.int32)
    with pytest.raises(deep_gemm.CompatError, match="block_kv 32 is not served"):
        deep_gemm.get_paged_mqa_logits_metadata(lens, 32, 132)
    with pytest.raises(deep_gemm.CompatError, match="varlen rows"):
        deep_gemm.get_paged_mqa_logits_metadata(lens, 64, 132, indices=lens)
    with pytest.raises(deep_gemm.CompatError, match="FP4 q"):
        deep_gemm.fp8_fp4_paged_mqa_logits((None, lens), None, None, lens, None, None, 64)
