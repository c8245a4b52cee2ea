"""PrefillStep (kernels/prefill_step.py): the prefill indexer's top-k, then sparse attention over its ids, as
one step over a packed prompt batch. Construction and per-call checks on a CPU; the whole step under the Triton
interpreter there (the CUDA top-k's torch baseline standing in) and natively on a GPU."""

import pytest
import torch
from test_prefill_topk import assert_exact_top_keys, cuda_topk_or_its_baseline  # noqa: F401 (a fixture)

from dsactl.definitions import get
from dsactl.fp8 import quantize_mla_kv
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.prefill_step import PrefillStep
from dsactl.verify.rules import check

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Two causal prompts of 100 and 156 keys; query tokens: the first 5 of the first (fewer keys than topk) and
# the last 20 of each.
PROMPTS = ((0, 100), (100, 256))
TOKENS = [(0, t) for t in range(5)] + [(p, t) for p in range(2) for t in range(PROMPTS[p][1] - PROMPTS[p][0] - 20,
                                                                                 PROMPTS[p][1] - PROMPTS[p][0])]
TINY = dict(num_tokens=len(TOKENS), num_keys=PROMPTS[-1][1], heads=16, topk=64, index_heads=32, index_dim=64)


def _inputs(step: PrefillStep, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    T, S = step.num_tokens, step.num_keys
    starts = [PROMPTS[p][0] for p, _ in TOKENS]
    inputs = {
        "q_index_fp8": torch.randn(T, step.index_heads, step.index_dim, generator=g).to(torch.float8_e4m3fn),
        "k_index_fp8": torch.randn(S, step.index_dim, generator=g).to(torch.float8_e4m3fn),
        "k_index_scale": torch.rand(S, generator=g) * 0.02 + 0.001,
        "weights": torch.randn(T, step.index_heads, generator=g) / step.index_heads,
        "ks": torch.tensor(starts, dtype=torch.int32),
        "ke": torch.tensor([s + t + 1 for s, (_, t) in zip(starts, TOKENS)], dtype=torch.int32),
        "q_nope": torch.randn(T, step.heads, 512, generator=g).bfloat16(),
        "q_pe": torch.randn(T, step.heads, 64, generator=g).bfloat16(),
    }
    kv = torch.randn(S, 576, generator=g).bfloat16()
    if step.kv_format == "fp8":
        inputs["kv_cache"] = quantize_mla_kv(kv[:, :512].float(), kv[:, 512:].float())
    else:
        inputs["ckv_cache"], inputs["kpe_cache"] = kv[:, :512], kv[:, 512:]  # views of one [S, 576] tensor
    return {name: t.to(DEVICE) for name, t in inputs.items()}


def _call(step: PrefillStep, inputs: dict, sm_scale: float = 0.07):
    index = [inputs[n] for n in ("q_index_fp8", "k_index_fp8", "k_index_scale", "weights", "ks", "ke")]
    caches = {n: inputs[n] for n in ("kv_cache", "ckv_cache", "kpe_cache") if n in inputs}
    return step(*index, inputs["q_nope"], inputs["q_pe"], sm_scale, **caches)


@pytest.mark.parametrize("kv_format, lse_base_e", [("bf16", False), ("fp8", True)])
def test_step_matches_the_chained_references(kv_format, lse_base_e):
    step = PrefillStep(**TINY, kv_format=kv_format, lse_base_e=lse_base_e, logits_bytes=8 * 256 * 4, device=DEVICE)
    inputs = _inputs(step, seed=11)
    step.topk_indices.fill_(-7)
    step.output.fill_(float("nan"))
    step.lse.fill_(float("nan"))
    output, lse = _call(step, inputs)
    assert output is step.output and lse is step.lse
    index = [inputs[n] for n in ("q_index_fp8", "k_index_fp8", "k_index_scale", "weights", "ks", "ke")]
    assert_exact_top_keys(index, step.topk_indices)
    attention = get(f"dsa_sparse_attention_h{step.heads}_ckv512_kpe64_topk{step.topk}_ps{step.num_keys}"
                    + ("_fp8kv" if kv_format == "fp8" else "") + ("_lsee" if lse_base_e else ""))
    caches = {n: inputs[n].unsqueeze(0) for n in ("kv_cache", "ckv_cache", "kpe_cache") if n in inputs}
    attention_inputs = {"q_nope": inputs["q_nope"], "q_pe": inputs["q_pe"], **caches,
                        "sparse_indices": step.topk_indices, "sm_scale": 0.07}
    verdict = check(attention, attention_inputs, {"output": output, "lse": lse})
    assert verdict.passed, "\n".join(verdict.problems)


@pytest.mark.parametrize("change, named", [
    (dict(num_tokens=0), "num_tokens must be a positive integer"),
    (dict(heads=48), "heads must be one of"),
    (dict(kv_format="fp16"), "kv_format must be one of"),
    (dict(topk=100), "topk must be a multiple of 64"),
    (dict(topk=4096), "topk must be a multiple of 64 up to 2048"),
    (dict(index_heads=16), "index_heads must be one of"),
    (dict(index_dim=96), "index_dim must be one of"),
    (dict(max_row_keys=0), "max_row_keys must be a positive integer"),
    (dict(lse_base_e=1), "lse_base_e must be a bool"),
])
def test_construction_names_the_bad_argument(change, named):
    with pytest.raises(KernelInputError, match=f"PrefillStep: {named}"):
        PrefillStep(**{**TINY, "kv_format": "bf16", "device": "cpu", **change})


@pytest.mark.parametrize("case", ["q_index_fp8", "ks", "weights", "ckv_cache", "kv_cache", "sm_scale", "attn_sink"])
def test_a_call_names_the_bad_argument(case):
    step = PrefillStep(**TINY, kv_format="bf16", device="cpu")
    inputs = {n: t.cpu() for n, t in _inputs(step, seed=1).items()}
    extra, sm_scale = {}, 0.07
    if case == "q_index_fp8":
        inputs[case] = inputs[case].float()
    elif case == "ks":
        inputs[case] = inputs[case][:-1]
    elif case == "weights":
        inputs[case] = inputs[case].t().contiguous().t()
    elif case == "ckv_cache":
        inputs[case] = inputs[case][:-1]
    elif case == "kv_cache":
        extra["kv_cache"] = torch.zeros(step.num_keys, 656, dtype=torch.int8)
    elif case == "sm_scale":
        sm_scale = "0.07"
    else:
        extra["attn_sink"] = torch.zeros(step.heads + 1)
    index = [inputs[n] for n in ("q_index_fp8", "k_index_fp8", "k_index_scale", "weights", "ks", "ke")]
    with pytest.raises(KernelInputError, match=f"PrefillStep: {case}"):
        step(*index, inputs["q_nope"], inputs["q_pe"], sm_scale, ckv_cache=inputs["ckv_cache"],
             kpe_cache=inputs["kpe_cache"], **extra)
    assert "PrefillStep(num_tokens=45" in repr(step)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_format", ["bf16", "fp8"])
def test_gpu_cuda_graph_replay_on_new_inputs_matches_eager(kv_format):
    """Captured once after a warm-up call, replayed on new values copied into the same inputs: the same ids,
    output and lse as an eager call on those values."""
    step = PrefillStep(**TINY, kv_format=kv_format, logits_bytes=8 * 256 * 4, device="cuda")
    inputs = _inputs(step, seed=3)
    _call(step, inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _call(step, inputs)
    fresh = _inputs(step, seed=4)
    for name, t in inputs.items():
        t.copy_(fresh[name])
    graph.replay()
    replayed = [t.clone() for t in (step.topk_indices, step.output, step.lse)]
    _call(step, fresh)
    eager = (step.topk_indices, step.output, step.lse)
    assert torch.equal(replayed[0].sort(dim=1).values, eager[0].sort(dim=1).values)
    assert torch.equal(replayed[1], eager[1]) and torch.equal(replayed[2], eager[2])
