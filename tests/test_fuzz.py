"""Property-based fuzzing (hypothesis) of the definitions' validators and the three operators'
launchers on CPU: whatever the shapes, dtypes and values, a call either raises one line naming
the argument (DsactlError for the definitions, KernelInputError for the launchers) or runs and
gives the reference answer, bad ids masked as -1 and counted. Triton kernels run under the
interpreter (tests/conftest.py), so shapes stay tiny; the CUDA top-k is fuzzed through its host
checks and its CPU model. Seeded (derandomize) and bounded: the file runs in well under a minute.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsactl.definitions import get
from dsactl.errors import DsactlError
from dsactl.fp8 import PAGE_SIZE, dequantize_index_k, quantize_index_k, quantize_mla_kv
from dsactl.harness import INT_POISON
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.indexer import score as indexer_score
from dsactl.kernels.indexer.passthrough import passthrough
from dsactl.kernels.topk import launcher as topk_launcher
from dsactl.kernels.topk import torch_baseline as topk_baseline
from dsactl.kernels.topk.model import topk_page_transform_model
from dsactl.verify.rules import check

settings.register_profile("dsactl-fuzz", derandomize=True, database=None, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    return settings(settings.get_profile("dsactl-fuzz"), max_examples=examples)


# The Triton kernels take these CPU tensors only under the interpreter (tests/conftest.py: no GPU).
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="fuzzes the Triton kernels under the interpreter, on a machine without a GPU")

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64, torch.int32,
          torch.int8, torch.uint8, torch.bool)
NOT_TENSORS = (None, 3, 2.5, "x", [1, 2])


def one_line(e: Exception) -> str:
    message = str(e)
    assert message and "\n" not in message, repr(message)
    return message


@st.composite
def replacements(draw, like: torch.Tensor | None):
    """Something to put where a tensor goes: another dtype, another shape, a strided view or not a tensor."""
    kind = draw(st.sampled_from(("dtype", "shape", "strided", "not_tensor") if like is not None else
                                ("shape", "not_tensor")))
    if kind == "not_tensor":
        return draw(st.sampled_from(NOT_TENSORS))
    dtype = like.dtype if like is not None else torch.float32
    if kind == "dtype":
        return torch.zeros(like.shape, dtype=draw(st.sampled_from(DTYPES)))
    if kind == "strided" and like.dim() >= 1 and like.shape[-1] > 1:
        wide = torch.zeros(*like.shape[:-1], like.shape[-1] * 2, dtype=like.dtype)
        return wide[..., ::2]
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    if like is not None and like.dim() and draw(st.booleans()):  # one axis off by a little
        shape = list(like.shape)
        axis = draw(st.integers(0, len(shape) - 1))
        shape[axis] = max(0, shape[axis] + draw(st.sampled_from((-1, 1, 2))))
    return torch.zeros(shape, dtype=dtype)


# ---------------------------------------------------------------- definitions

DEFINITIONS = ("dsa_topk_page_transform_topk64_ps64", "dsa_topk_indexer_fp8_h32_d128_topk512_ps64_nextn2",
               "dsa_sparse_attention_h16_ckv512_kpe64_topk64_ps64_fp8kv_topklen_sink",
               "dsa_sparse_attention_h16_ckv512_kpe64_topk128_ps64")
NAME_PIECES = ("dsa_", "topk", "_indexer", "_fp8", "_h", "_d128", "_ps64", "_nextn", "_bf16", "_sparse_attention",
               "_ckv512_kpe64", "_fp8kv", "_lsee", "_topklen", "_sink", "page_transform", "0", "7", "64", "2048",
               "99999999999999999999", "-", "")


def valid_tensors(d, sizes: dict[str, int]) -> dict:
    """Zero tensors of the definition's shapes for these axis sizes (scalars: a float)."""
    axes = {**d.const_axes, **sizes}
    return {s.name: 1.0 if s.is_scalar else
            torch.zeros([a if isinstance(a, int) else axes[a] for a in s.shape], dtype=s.torch_dtype)
            for s in d.inputs + d.outputs}


@fuzz(150)
@given(st.lists(st.sampled_from(NAME_PIECES), max_size=8).map("".join) | st.text(max_size=40))
def test_definition_names_resolve_or_raise_one_line(name):
    try:
        d = get(name)
    except DsactlError as e:
        one_line(e)
    else:
        assert d.name == name


@fuzz(120)
@given(st.sampled_from(DEFINITIONS), st.data())
def test_definition_validator_names_the_tensor_or_accepts(name, data):
    d = get(name)
    sizes = {a: data.draw(st.integers(1, 3), label=a) for a in d.var_axes}
    tensors = valid_tensors(d, sizes)
    assert d.check_inputs(tensors, with_outputs=True) == {**d.const_axes, **sizes}
    target = data.draw(st.sampled_from([s.name for s in d.inputs + d.outputs]), label="target")
    spec = next(s for s in d.inputs + d.outputs if s.name == target)
    tensors[target] = data.draw(replacements(None if spec.is_scalar else tensors[target]), label="replacement")
    try:
        axes = d.check_inputs(tensors, with_outputs=True)
    except DsactlError as e:
        assert target in one_line(e)
    else:  # accepted: the replacement must agree with every axis
        assert all(axes[a] == v for a, v in sizes.items())


# ---------------------------------------------------------------- top-k (CUDA kernel: host checks, CPU model)

def topk_args(rows: int, max_len: int, batch: int, topk: int) -> dict:
    g = torch.Generator().manual_seed(rows * 131 + max_len)
    pages = -(-max_len // PAGE_SIZE)
    return {"scores": torch.randn(rows, max_len, generator=g), "lengths": torch.full((rows,), max_len, dtype=torch.int32),
            "block_table": torch.randint(0, 100, (batch, pages), generator=g, dtype=torch.int32),
            "row_to_batch": torch.randint(0, batch, (rows,), generator=g, dtype=torch.int32),
            "out": torch.empty(rows, topk, dtype=torch.int32), "topk": topk, "num_pages": 100}


@fuzz(150)
@given(st.sampled_from(("scores", "lengths", "block_table", "row_to_batch", "out")), st.data())
def test_topk_host_checks_name_the_argument(target, data):
    args = topk_args(data.draw(st.integers(1, 4)), data.draw(st.integers(1, 200)), data.draw(st.integers(1, 3)),
                     data.draw(st.integers(1, 70)))
    assert topk_launcher.check_inputs(**args) == 100
    args[target] = data.draw(replacements(args[target]))
    try:
        topk_launcher.check_inputs(**args)
    except KernelInputError as e:
        assert any(name in one_line(e) for name in ("scores", "lengths", "block_table", "row_to_batch", "out"))
    with pytest.raises(KernelInputError):  # on CPU the launcher refuses after its checks, never crashes
        topk_launcher.topk_page_transform(**args)


@st.composite
def topk_values(draw):
    """Distinct scores (a unique top set) and values that range past the contract: lengths negative or
    past the pages, page ids negative or past the cache, row_to_batch outside the block table."""
    rows, max_len, batch = draw(st.integers(0, 4)), draw(st.integers(0, 300)), draw(st.integers(0, 3))
    pages = draw(st.integers(0, 6))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    rank = torch.randperm(max(rows * max_len, 1), generator=g)[: rows * max_len].view(rows, max_len)
    bf16 = draw(st.booleans())
    # Distinct values: integers in fp32, consecutive positive bit patterns in bf16.
    scores = (rank + 0x3000).to(torch.int16).view(torch.bfloat16) if bf16 else rank.float() - 50
    lengths = torch.randint(-5, max(max_len, pages * PAGE_SIZE) + 20, (rows,), generator=g, dtype=torch.int32)
    table = torch.randint(-3, 12, (batch, pages), generator=g, dtype=torch.int32)
    r2b = torch.randint(-1, batch + 2, (rows,), generator=g, dtype=torch.int32)
    return scores, lengths, table, r2b, draw(st.sampled_from((1, 5, 64, 128))), draw(st.integers(0, 12))


@fuzz(120)
@given(topk_values())
def test_topk_model_and_baseline_mask_bad_values_as_the_reference(values):
    scores, lengths, table, r2b, topk, num_pages = values
    bf16 = scores.dtype == torch.bfloat16
    ref_table = torch.where((table >= 0) & (table < num_pages), table, 2**25)  # the reference masks past 2**25
    name = f"dsa_topk_page_transform_topk{topk}_ps64" + ("_bf16" if bf16 else "")
    want = get(name).reference(scores, lengths, ref_table, r2b, topk=topk)
    got, masked = topk_page_transform_model(scores, lengths, table, r2b, topk, 2, 256, num_pages=num_pages)
    assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)
    clamped = lengths.long().clamp(0, min(scores.shape[1], table.shape[1] * PAGE_SIZE)).clamp(max=topk)
    assert masked == int(clamped.sum()) - int((want != -1).sum())
    base = torch.full((scores.shape[0], topk), INT_POISON, dtype=torch.int32)
    topk_baseline.topk_page_transform(scores, lengths, table, r2b, base, num_pages=num_pages)
    assert torch.equal(base.sort(dim=1).values, want.sort(dim=1).values)
    # check=True refuses exactly the calls whose bad values the kernel meets.
    out = torch.empty(scores.shape[0], topk, dtype=torch.int32)
    try:
        topk_launcher.check_inputs(scores, lengths, table, r2b, out, topk, num_pages, check=True)
    except KernelInputError as e:
        assert "row_to_batch" in one_line(e) or "block_table" in str(e)
    else:
        assert masked == 0


# ---------------------------------------------------------------- indexer (Triton, interpreted)

def indexer_case(seq_lens: list[int], max_pages: int, num_pages: int, next_n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    batch, heads = len(seq_lens), 32
    keys = torch.randn(num_pages, PAGE_SIZE, 128, generator=g)
    return {"q": torch.randn(batch, next_n, heads, 128, generator=g).to(torch.float8_e4m3fn),
            "cache": quantize_index_k(keys) if num_pages else torch.empty(0, PAGE_SIZE, 1, 132, dtype=torch.int8),
            "weights": torch.randn(batch, next_n, heads, generator=g),
            "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
            "block_table": torch.randint(-2, num_pages + 3, (batch, max_pages), generator=g, dtype=torch.int32)}


@interpreted
@fuzz(100)
@given(st.sampled_from(("q", "cache", "weights", "seq_lens", "block_table", "scores", "lengths")), st.data())
def test_indexer_host_checks_name_the_argument(target, data):
    c = indexer_case([70, 5], 2, 4, 1, seed=1)
    args = {**c, "scores": torch.empty(2, 128), "lengths": torch.empty(2, dtype=torch.int32)}
    args[target] = data.draw(replacements(args[target]))
    try:
        indexer_score.score(args["q"], args["cache"], args["weights"], args["seq_lens"], args["block_table"],
                            args["scores"], args["lengths"])
    except KernelInputError as e:
        message = one_line(e)
        assert any(n in message for n in ("q", "cache", "weights", "seq_lens", "block_table", "scores", "lengths"))


@interpreted
@fuzz(20)
@given(st.lists(st.integers(-3, 200), min_size=1, max_size=2), st.integers(1, 3), st.integers(0, 5),
       st.integers(1, 2), st.integers(0, 2**16))
def test_indexer_scores_pages_in_the_cache_and_masks_the_rest(seq_lens, max_pages, num_pages, next_n, seed):
    c = indexer_case(seq_lens, max_pages, num_pages, next_n, seed)
    rows, width = len(seq_lens) * next_n, max_pages * PAGE_SIZE
    scores = torch.full((rows, width), float("nan"))
    lengths = torch.full((rows,), INT_POISON, dtype=torch.int32)
    indexer_score.reset_bad_index_count("cpu")
    indexer_score.score(c["q"], c["cache"], c["weights"], c["seq_lens"], c["block_table"], scores, lengths)
    keys = dequantize_index_k(c["cache"]) if num_pages else torch.zeros(1, PAGE_SIZE, 128)
    planted = 0
    for b, seq_len in enumerate(seq_lens):
        seen = min(max(seq_len, 0), width)
        page = c["block_table"][b, torch.arange(seen) // PAGE_SIZE].long()
        in_cache = (page >= 0) & (page < num_pages)
        planted += int((~in_cache[::PAGE_SIZE]).sum())
        k = keys[page.clamp(0, max(num_pages - 1, 0)), torch.arange(seen) % PAGE_SIZE]
        for j in range(next_n):
            r, visible = b * next_n + j, seq_len - next_n + j + 1
            assert int(lengths[r]) == max(visible, 0)
            want = (torch.relu(c["q"][b, j].float() @ k.T) * c["weights"][b, j][:, None]).sum(0)
            want = torch.where(in_cache & (torch.arange(seen) < visible), want, float("-inf"))
            torch.testing.assert_close(scores[r, :seen], want, rtol=1e-4, atol=1e-3)
    assert indexer_score.bad_index_count("cpu") == planted


@interpreted
@fuzz(15)
@given(st.lists(st.integers(-70, 600), min_size=0, max_size=3), st.integers(0, 8), st.integers(1, 4),
       st.integers(0, 2**16))
def test_passthrough_maps_pages_in_the_cache_and_masks_the_rest(seq_lens, max_pages, next_n, seed):
    g = torch.Generator().manual_seed(seed)
    num_pages, topk = 6, 512
    table = torch.randint(-2, num_pages + 2, (len(seq_lens), max_pages), generator=g, dtype=torch.int32)
    out = torch.full((len(seq_lens) * next_n, topk), INT_POISON, dtype=torch.int32)
    passthrough(torch.tensor(seq_lens, dtype=torch.int32), table, out, next_n, num_pages)
    i = torch.arange(topk)
    for r in range(out.shape[0]):
        visible = min(seq_lens[r // next_n] - next_n + r % next_n + 1, max_pages * PAGE_SIZE)
        page = table[r // next_n, (i // PAGE_SIZE).clamp(max=max(max_pages - 1, 0))] if max_pages else i * 0 - 1
        want = torch.where((i < visible) & (page >= 0) & (page < num_pages), page * PAGE_SIZE + i % PAGE_SIZE, -1)
        assert torch.equal(out[r].long(), want.long()), f"row {r}"


# ---------------------------------------------------------------- sparse MLA attention (Triton, interpreted)

ATTENTION_ARGS = ("q_nope", "q_pe", "sparse_indices", "output", "lse", "ckv_cache", "kpe_cache", "kv_cache",
                  "topk_length", "attn_sink")


def attention_case(tokens: int, pages: int, topk: int, fp8kv: bool, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    heads = 16
    ckv = torch.randn(pages, PAGE_SIZE, 512, generator=g).bfloat16()
    kpe = torch.randn(pages, PAGE_SIZE, 64, generator=g).bfloat16()
    case = {"q_nope": torch.randn(tokens, heads, 512, generator=g).bfloat16(),
            "q_pe": torch.randn(tokens, heads, 64, generator=g).bfloat16(),
            "sparse_indices": torch.randint(-3, pages * PAGE_SIZE + 3, (tokens, topk), generator=g, dtype=torch.int32),
            "sm_scale": 0.1}
    if fp8kv:
        case["kv_cache"] = quantize_mla_kv(ckv, kpe)
    else:
        case["ckv_cache"], case["kpe_cache"] = ckv, kpe
    return case


@fuzz(100)
@given(st.sampled_from(ATTENTION_ARGS), st.booleans(), st.data())
def test_attention_host_checks_name_the_argument(target, fp8kv, data):
    case = attention_case(2, 2, 64, fp8kv, seed=3)
    args = {name: case.get(name) for name in ATTENTION_ARGS}
    args["output"] = torch.empty(2, 16, 512, dtype=torch.bfloat16)
    args["lse"] = torch.empty(2, 16)
    args[target] = data.draw(replacements(args[target]))
    try:
        tsm.check_inputs(*(args[name] for name in ATTENTION_ARGS))
    except KernelInputError as e:
        message = one_line(e)
        assert any(n in message for n in ATTENTION_ARGS + ("heads", "KV form", "bf16 form")), message


@interpreted
@fuzz(12)
@given(st.integers(1, 2), st.integers(1, 3), st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_attention_masks_ids_outside_the_cache_and_matches_the_reference(tokens, pages, fp8kv, topk_length, seed):
    topk = 64
    suffix = ("_fp8kv" if fp8kv else "") + ("_topklen" if topk_length else "")
    d = get(f"dsa_sparse_attention_h16_ckv512_kpe64_topk{topk}_ps64{suffix}")
    case = attention_case(tokens, pages, topk, fp8kv, seed)
    case["sparse_indices"][0, : min(4, topk)] = torch.tensor([-7, 50_000_000, pages * PAGE_SIZE, -1],
                                                             dtype=torch.int32)
    if topk_length:
        case["topk_length"] = torch.randint(-2, topk + 3, (tokens,), generator=torch.Generator().manual_seed(seed),
                                            dtype=torch.int32)
    outputs = {"output": torch.full((tokens, 16, 512), float("nan"), dtype=torch.bfloat16),
               "lse": torch.full((tokens, 16), float("nan"))}
    tsm.reset_bad_index_count("cpu")
    tsm.sparse_mla_attention(case["q_nope"], case["q_pe"], case["sparse_indices"], case["sm_scale"],
                             outputs["output"], outputs["lse"], ckv_cache=case.get("ckv_cache"),
                             kpe_cache=case.get("kpe_cache"), kv_cache=case.get("kv_cache"),
                             topk_length=case.get("topk_length"))
    verdict = check(d, case, outputs)
    assert verdict.passed, verdict.problems
    ids = case["sparse_indices"].long()
    read = torch.arange(topk)[None, :] < (case["topk_length"].long().clamp(0, topk)[:, None] if topk_length else topk)
    bad = read & (ids != -1) & ((ids < 0) | (ids >= pages * PAGE_SIZE))
    assert tsm.bad_index_count("cpu") == int(bad.sum())
