import math

import pytest
import torch

from dsactl import definitions
from dsactl.definitions import attention, indexer, topk
from dsactl.errors import DsactlError
from dsactl.fp8 import dequantize_index_k, quantize_index_k
from dsactl.workloads import Workload, make_inputs

CONTEST_SM_SCALE = 0.1352337788608801


def test_contest_contracts_match_design():
    d = definitions.get(definitions.CONTEST_INDEXER)
    assert d.signature == ["q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table", "topk_indices"]
    assert [t.dtype for t in d.inputs] == ["float8_e4m3fn", "int8", "float32", "int32", "int32"]
    assert d.const_axes["num_index_heads"] == 64 and d.const_axes["topk"] == 2048
    a = definitions.get(definitions.CONTEST_ATTENTION)
    assert a.signature == ["q_nope", "q_pe", "ckv_cache", "kpe_cache", "sparse_indices", "sm_scale", "output", "lse"]
    assert a.const_axes["num_qo_heads"] == 16


def test_variant_names_round_trip():
    for d in definitions.all_definitions():
        assert definitions.get(d.name).name == d.name
    d = definitions.get("dsa_sparse_attention_h128_ckv512_kpe64_topk1536_ps64_fp8kv_lsee")
    assert d.params["topk"] == 1536 and d.params["fp8kv"] and d.params["lse_base"] == math.e
    assert "kv_cache" in d.input_names and "ckv_cache" not in d.input_names


@pytest.mark.parametrize("name", ["dsa_nope", "dsa_sparse_attention_h48_ckv512_kpe64_topk2048_ps64",
                                  "dsa_topk_indexer_fp8_h64_d128_topk4096_ps64"])
def test_unknown_or_invalid_definitions_raise(name):
    with pytest.raises(DsactlError):
        definitions.get(name)


def test_check_inputs_names_dtype_and_shape_problems():
    d = definitions.get(definitions.CONTEST_INDEXER)
    w = Workload("t", d.name, "test", "t", {"batch_size": 2, "num_pages": 8, "max_num_pages": 2}, {"seq_lens": (100, 7)})
    inputs = make_inputs(w, "cpu", 0)
    assert d.check_inputs(inputs)["batch_size"] == 2
    with pytest.raises(DsactlError, match="weights must be float32"):
        d.check_inputs({**inputs, "weights": inputs["weights"].half()})
    with pytest.raises(DsactlError, match="axis batch_size"):
        d.check_inputs({**inputs, "seq_lens": inputs["seq_lens"][:1]})
    with pytest.raises(DsactlError, match="num_index_heads"):
        d.check_inputs({**inputs, "weights": inputs["weights"][:, :32]})


def _indexer_scores_per_head_loop(q, cache, weights, table, seq_len, b):
    """Independent formulation: explicit loops over heads and tokens."""
    k = dequantize_index_k(cache)
    scores = []
    for s in range(seq_len):
        key = k[table[b, s // 64], s % 64]
        total = 0.0
        for h in range(q.shape[1]):
            total += float(weights[b, h]) * max(0.0, float(q[b, h].float() @ key))
        scores.append(total)
    return torch.tensor(scores, dtype=torch.float64)


def test_indexer_reference_matches_per_head_loop():
    d = indexer.make(heads=32, topk=512)
    w = Workload("t", d.name, "test", "t", {"batch_size": 2, "num_pages": 30, "max_num_pages": 12},
                 {"seq_lens": (700, 130)})
    x = make_inputs(w, "cpu", 5)
    out = d.run_reference(x)["topk_indices"]
    for b, seq_len in enumerate((700, 130)):
        scores = _indexer_scores_per_head_loop(x["q_index_fp8"], x["k_index_cache_fp8"], x["weights"],
                                               x["block_table"], seq_len, b)
        want = min(512, seq_len)
        row = out[b]
        assert (row[want:] == -1).all() and (row[:want] >= 0).all()
        # Map physical ids back to logical positions through the block table.
        phys_to_logical = {int(x["block_table"][b, p]) * 64 + o: p * 64 + o for p in range((seq_len + 63) // 64)
                           for o in range(64)}
        logical = torch.tensor([phys_to_logical[int(i)] for i in row[:want]])
        assert len(set(logical.tolist())) == want
        top = torch.sort(scores, descending=True).values[:want]
        torch.testing.assert_close(torch.sort(scores[logical], descending=True).values, top, rtol=1e-4, atol=1e-4)


def test_indexer_next_n_is_causal():
    d = indexer.make(heads=64, topk=512, next_n=3)
    w = Workload("t", d.name, "test", "t", {"batch_size": 1, "num_pages": 4, "max_num_pages": 2}, {"seq_lens": (66,)})
    x = make_inputs(w, "cpu", 1)
    out = d.run_reference(x)["topk_indices"]
    assert out.shape == (1, 3, 512)
    # Token j of 3 sees 66 - 3 + j + 1 tokens: 64, 65, 66.
    assert [(out[0, j] >= 0).sum().item() for j in range(3)] == [64, 65, 66]
    page1 = int(x["block_table"][0, 1]) * 64
    assert page1 not in out[0, 0].tolist() and page1 in out[0, 1].tolist() and page1 + 1 in out[0, 2].tolist()


def test_indexer_hand_computed_tiny_case():
    # Page 5 of 6 holds three tokens; 32 heads: only head 0 has weight; q[0] . k is easy to compute by hand.
    k = torch.zeros(6, 64, 128)
    k[5, 0, 0], k[5, 1, 0], k[5, 2, 0] = 1.0, 2.0, -4.0
    cache = quantize_index_k(k)
    q = torch.zeros(1, 32, 128)
    q[0, 0, 0] = 1.0
    w = torch.zeros(1, 32)
    w[0, 0] = 1.0
    out = indexer.reference(q.to(torch.float8_e4m3fn), cache, w, torch.tensor([3], dtype=torch.int32),
                            torch.tensor([[5]], dtype=torch.int32), topk=512)
    # Scores 1, 2, relu(-4)=0 -> order 1, 0, 2 -> physical 5*64 + i.
    assert out[0, :3].tolist() == [321, 320, 322] and (out[0, 3:] == -1).all()


def _attention_dense(q_nope, q_pe, ckv_flat, kpe_flat, idx, sm_scale, lse_base):
    """Independent formulation: logits against the whole cache, mask, softmax."""
    logits = (q_nope.float() @ ckv_flat.T + q_pe.float() @ kpe_flat.T) * sm_scale  # [H, N]
    counts = torch.zeros(ckv_flat.shape[0])
    for i in idx.tolist():
        if i >= 0:
            counts[i] += 1
    # Duplicated indices count twice: softmax weight multiplies by the count.
    weights = torch.where(counts > 0, counts.log(), torch.tensor(-math.inf))
    masked = logits + weights
    lse = torch.logsumexp(masked, -1)
    return torch.softmax(masked, -1) @ ckv_flat, lse / math.log(lse_base)


@pytest.mark.parametrize("pattern", ["scattered", "duplicates", "tail"])
def test_attention_reference_matches_dense_masked(pattern):
    d = attention.make(heads=16, topk=128)
    w = Workload("t", d.name, "test", "t", {"num_tokens": 3, "num_pages": 6}, {"pattern": pattern, "valid": (1, 64, 127)})
    x = make_inputs(w, "cpu", 3)
    ref = d.run_reference(x)
    ckv, kpe = x["ckv_cache"].reshape(-1, 512).float(), x["kpe_cache"].reshape(-1, 64).float()
    for t in range(3):
        out, lse = _attention_dense(x["q_nope"][t], x["q_pe"][t], ckv, kpe, x["sparse_indices"][t], x["sm_scale"], 2.0)
        torch.testing.assert_close(ref["output"][t].float(), out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(ref["lse"][t], lse, atol=1e-4, rtol=1e-5)


def test_attention_empty_row_sink_lse_base_and_topk_length():
    d = attention.make(heads=32, topk=64, fp8kv=True, lse_base_e=True, topk_length=True, sink=True)
    w = Workload("t", d.name, "test", "t", {"num_tokens": 2, "num_pages": 3}, {"pattern": "full"})
    x = make_inputs(w, "cpu", 9)
    x["topk_length"] = torch.tensor([0, 10], dtype=torch.int32)
    ref = d.run_reference(x)
    assert (ref["output"][0] == 0).all() and torch.isneginf(ref["lse"][0]).all()
    base = attention.make(heads=32, topk=64, fp8kv=True)
    x2 = {k: v for k, v in x.items() if k not in ("topk_length", "attn_sink")}
    x2["sparse_indices"] = x["sparse_indices"].clone()
    x2["sparse_indices"][:, 10:] = -1
    plain = base.run_reference(x2)
    # lse in base e = base-2 lse * ln 2; the sink scales the output by 1/(1+exp(sink - lse_e)).
    torch.testing.assert_close(ref["lse"][1], plain["lse"][1] * math.log(2))
    factor = 1 / (1 + torch.exp(x["attn_sink"] - ref["lse"][1]))
    torch.testing.assert_close(ref["output"][1].float(), plain["output"][1].float() * factor[:, None], atol=1e-2, rtol=1e-2)


def test_topk_nan_ranks_below_neg_inf_and_ties_fill_exactly():
    scores = torch.tensor([[float("nan"), float("-inf"), 1.0, 1.0, 1.0, float("nan")]])
    table = torch.tensor([[7]], dtype=torch.int32)
    out = topk.reference(scores, torch.tensor([6], dtype=torch.int32), table, torch.tensor([0], dtype=torch.int32), topk=4)
    assert sorted(out[0].tolist()) == sorted([7 * 64 + 1, 7 * 64 + 2, 7 * 64 + 3, 7 * 64 + 4])
    out = topk.reference(scores, torch.tensor([6], dtype=torch.int32), table, torch.tensor([0], dtype=torch.int32), topk=2)
    assert set(out[0].tolist()) <= {450, 451, 452} and len(set(out[0].tolist())) == 2


def test_to_json_is_flashinfer_shaped():
    j = definitions.get(definitions.CONTEST_ATTENTION).to_json()
    assert j["axes"]["num_qo_heads"] == {"type": "const", "value": 16}
    assert j["axes"]["num_tokens"] == {"type": "var"}
    assert j["inputs"]["sm_scale"]["shape"] is None
    assert j["inputs"]["q_nope"]["shape"] == ["num_tokens", "num_qo_heads", "ckv_dim"]
    assert "def reference" in j["reference"]


@pytest.mark.parametrize("name", [definitions.CONTEST_INDEXER, "dsa_topk_page_transform_topk512_ps64_bf16",
                                  "dsa_sparse_attention_h32_ckv512_kpe64_topk128_ps64_fp8kv_lsee_topklen_sink",
                                  "dsa_prefill_indexer_fp8_h32_d64_topk512"])
def test_json_reference_is_self_contained_and_computes_the_same(name):
    d = definitions.get(name)
    j = d.to_json()
    namespace: dict = {}
    exec(compile(j["reference"], f"<{name}>", "exec"), namespace)  # no dsactl import inside
    assert "dsactl" not in j["reference"]
    small = {"dsa_topk_indexer": {"batch_size": 2, "num_pages": 10, "max_num_pages": 3},
             "dsa_topk_page": {"num_rows": 2, "max_len": 700},
             "dsa_sparse_attention": {"num_tokens": 2, "num_pages": 4},
             "dsa_prefill_indexer": {"num_tokens": 40, "num_keys": 700}}
    axes = next(v for k, v in small.items() if name.startswith(k))
    params = {"seq_lens": (150, 9), "lengths": (700, 5), "pattern": "scattered", "valid": (3, 100),
              "prompts": (600, 100), "queries": (30, 10)}
    x = make_inputs(Workload("t", name, "test", "t", axes, params), "cpu", 4)
    want = d.run_reference(x)
    got = namespace["run"](**{n: x[n] for n in d.input_names})
    got = got if isinstance(got, tuple) else (got,)
    for (key, w), g in zip(want.items(), got):
        assert torch.equal(w, g), key


def test_json_validates_with_flashinfer_bench_model():
    fib = pytest.importorskip("flashinfer_bench.data")
    for d in definitions.all_definitions()[::7]:
        fib.Definition.model_validate(d.to_json())


def test_attention_names_carry_any_page_size_and_topk_up_to_16384_served_by_the_same_solutions():
    from dsactl import solutions

    get = definitions.get
    d = get("dsa_sparse_attention_h64_ckv512_kpe64_topk16384_ps2_fp8kv_lsee")
    assert (d.params["page_size"], d.params["topk"], d.const_axes["page_size"]) == (2, 16384, 2)
    for bad in ("topk16448_ps64", "topk100_ps64", "topk128_ps0"):
        with pytest.raises(DsactlError):
            get(f"dsa_sparse_attention_h64_ckv512_kpe64_{bad}")
    at_64 = "dsa_sparse_attention_h64_ckv512_kpe64_topk16384_ps64_fp8kv_lsee"
    assert [s.name for s in solutions.for_definition(d.name, True)] == [
        s.name for s in solutions.for_definition(at_64, True)]
    # The variant flags still tell the solutions apart at any page size.
    assert not any(s.serves("dsa_sparse_attention_h64_ckv512_kpe64_topk128_ps61_fp8kv")
                   for s in solutions.for_definition("dsa_sparse_attention_h64_ckv512_kpe64_topk128_ps61", True))
