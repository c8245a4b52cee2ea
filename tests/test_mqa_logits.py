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


def _close(got, want, dtype):
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    return torch.allclose(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()))


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
    assert torch.allclose(got[finite], want[finite], rtol=1e-4, atol=1e-3)


def test_deep_gemm_api_refuses_what_it_does_not_serve_in_one_line():
    with pytest.raises(deep_gemm.CompatError, match="FP4 q"):
        deep_gemm.fp8_fp4_mqa_logits((None, torch.zeros(1)), (None, None), None, None, None)
    with pytest.raises(deep_gemm.CompatError, match="clean_logits=False"):
        deep_gemm.fp8_fp4_mqa_logits((None, None), (None, None), None, None, None, clean_logits=True,
                                     max_seqlen_k=4)
    for name in ("get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits"):
        with pytest.raises(deep_gemm.CompatError, match=f"^{name}: the paged decode logits are not served"):
            getattr(deep_gemm, name)()
