"""Sparse MLA attention: the Triton kernel (under the interpreter on CPU, compiled on the GPU),
the vectorized PyTorch baseline, the entries and their Solution registrations.

The interpreter must be switched on before Triton is first imported. tests/conftest.py does so
on machines without a GPU, and the interpreter cases then run in-process; anywhere else
(a GPU machine) test_kernel_under_interpreter runs them in a child pytest process with
TRITON_INTERPRET=1.
"""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys

import pytest
import torch
from attention_cases import (assert_matches_reference, assert_repeatable, case_inputs, definition_name,
                             poisoned_outputs)

from dsactl import solutions
from dsactl.definitions import get
from dsactl.definitions.attention import reference as attention_reference
from dsactl.fp8 import dequantize_mla_kv
from dsactl.kernels.errors import KernelError, KernelInputError
from dsactl.harness import poison
from dsactl.kernels.attention import entries, hopper_mla, solution, torch_baseline, triton_entries
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.verify.rules import check
from dsactl.workloads import make_inputs, suite

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
CONTEST_SM_SCALE = 0.1352337788608801


def _run(fn, definition: str, inputs: dict, **kwargs) -> dict:
    """Call fn in destination-passing style on poisoned outputs; return the outputs."""
    outputs = poisoned_outputs(definition, inputs)
    fn(*[{**inputs, **outputs}[name] for name in get(definition).signature], **kwargs)
    return outputs


def _launcher_kwargs(definition: str, num_splits: int | None):
    """The Triton launcher with the keyword arguments of a definition variant."""
    d = get(definition)

    def run(*args, **kwargs):
        named = dict(zip(d.signature, args))
        tsm.sparse_mla_attention(**named, lse_base_e=d.params["lse_base"] != 2.0, num_splits=num_splits, **kwargs)

    return run


# ------------------------------------------------------------------ interpreter (CPU)

INTERPRETER_CASES = {
    # name: (definition, num_tokens, num_pages, generator params, num_splits (None: the formula))
    "combine": (definition_name(16, 128), 2, 4, {}, None),
    "one_split": (definition_name(16, 128), 2, 4, {}, 1),
    "fp8kv_prefetch": (definition_name(16, 128, "_fp8kv"), 2, 4, {}, 3),
    "fp8kv_64_heads": (definition_name(64, 64, "_fp8kv"), 1, 2, {}, 1),
    "fp8kv_64_heads_every_option": (definition_name(64, 128, "_fp8kv_lsee_topklen_sink"), 2, 4,
                                    {"pattern": "scattered", "valid": (128, 9)}, 3),
    "lsee_sink": (definition_name(16, 128, "_lsee_sink"), 2, 4, {}, 2),
    "topklen_scattered": (definition_name(16, 192, "_topklen"), 3, 4,
                          {"pattern": "scattered", "valid": (1, 100, 150)}, 5),
    "empty_rows_combine": (definition_name(16, 128), 3, 4, {"pattern": "empty"}, 2),
    "empty_rows_sink": (definition_name(16, 128, "_fp8kv_lsee_sink"), 2, 4, {"pattern": "empty"}, 1),
    "tail_front_valid": (definition_name(16, 256), 2, 8, {"pattern": "tail", "valid": (3, 70)}, 4),
    "duplicates_32_heads": (definition_name(32, 128), 2, 4, {"pattern": "duplicates"}, 4),
    # More split counts (odd ones, up to MAX_SPLITS) at 16 to 128 heads, bf16 and FP8 KV.
    "splits_7_fp8kv": (definition_name(16, 128, "_fp8kv_sink"), 2, 4, {"pattern": "scattered", "valid": (128, 9)}, 7),
    "splits_13_64_heads": (definition_name(64, 64, "_lsee"), 1, 2, {}, 13),
    "splits_32_tail": (definition_name(16, 128, "_topklen"), 2, 4, {"pattern": "tail", "valid": (40, 128)}, 32),
    "splits_64_tail": (definition_name(16, 128, "_topklen"), 2, 4, {"pattern": "tail", "valid": (40, 128)}, 64),
    "splits_32_64_heads_fp8kv": (definition_name(128, 64, "_fp8kv"), 1, 2, {}, 32),
    "splits_20_32_heads": (definition_name(32, 64), 1, 2, {"pattern": "duplicates"}, 20),
    # A split's share exactly fills its ids (ROW_PAD 256): the FP8 kernel's prefetch past the last tile
    # and the pipeliner's gathers past the loop read clamped positions of valid ids.
    "share_fills_ids_fp8kv": (definition_name(16, 256, "_fp8kv"), 1, 4, {}, 1),
    "share_fills_ids_64_heads": (definition_name(64, 256, "_lsee"), 1, 4, {"pattern": "scattered"}, 1),
}


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("case", list(INTERPRETER_CASES))
def test_interpreted_kernel_matches_reference(case):
    definition, num_tokens, num_pages, params, num_splits = INTERPRETER_CASES[case]
    inputs = case_inputs(definition, num_tokens, num_pages, "cpu", seed=len(case), **params)
    outputs = _run(_launcher_kwargs(definition, num_splits), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)
    if params.get("pattern") == "empty":
        assert bool((outputs["output"] == 0).all()) and bool((outputs["lse"] == float("-inf")).all())


def plant_out_of_range_ids(inputs: dict) -> tuple[dict, dict, int]:
    """(inputs whose rows hold ids past the cache (5e7, one past its last), -7, and its last id, the same
    inputs with the out-of-range ids replaced by -1, how many were planted)."""
    cache = inputs["kv_cache"] if "kv_cache" in inputs else inputs["ckv_cache"]
    tokens = cache.shape[0] * cache.shape[1]
    bad = inputs["sparse_indices"].clone()
    assert bad.shape[0] >= 2 and bad.shape[1] >= 8
    bad[0, 1], bad[0, 5], bad[1, 2], bad[1, 3] = 50_000_000, -7, tokens, tokens - 1
    bad[-1, -1] = tokens
    replaced = torch.where((bad >= 0) & (bad < tokens), bad, -1)
    planted = int(((bad != -1) & (replaced == -1)).sum())
    assert planted == 4
    return {**inputs, "sparse_indices": bad}, {**inputs, "sparse_indices": replaced}, planted


OUT_OF_RANGE_CASES = {
    # name: (definition, num_tokens, num_pages, num_splits): every split kernel, one and several splits,
    # and two head groups (128 heads) that must count an id once.
    "bf16_one_split": (definition_name(16, 128), 2, 4, 1),
    "bf16_splits": (definition_name(16, 128, "_lsee_sink"), 2, 4, 3),
    "bf16_128_heads": (definition_name(128, 64), 2, 2, 2),
    "fp8kv_prefetch": (definition_name(16, 128, "_fp8kv"), 2, 4, 3),
    "fp8kv_64_heads": (definition_name(64, 64, "_fp8kv"), 2, 2, 1),
}


def check_out_of_range_ids(definition: str, inputs: dict, launcher, counts) -> None:
    """Out-of-range ids give the reference of their -1 replacements and are counted; check=True refuses
    them naming the first one. counts: (bad_index_count, reset_bad_index_count) of the launcher's module."""
    bad, replaced, planted = plant_out_of_range_ids(inputs)
    device = inputs["q_nope"].device
    count, reset = counts
    reset(device)
    outputs = _run(launcher, definition, bad)
    assert_matches_reference(definition, replaced, outputs)
    assert count(device) == planted
    with pytest.raises(KernelError, match=r"sparse_indices\[0, 1\] = 50000000 is outside \[0, "):
        _run(launcher, definition, bad, check=True)
    assert count(device) == planted  # refused before any launch


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("case", list(OUT_OF_RANGE_CASES))
def test_interpreted_ids_outside_the_cache_are_masked_and_counted(case):
    definition, num_tokens, num_pages, num_splits = OUT_OF_RANGE_CASES[case]
    inputs = case_inputs(definition, num_tokens, num_pages, "cpu", seed=len(case), pattern="scattered")
    check_out_of_range_ids(definition, inputs, _launcher_kwargs(definition, num_splits),
                           (tsm.bad_index_count, tsm.reset_bad_index_count))


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
def test_interpreted_check_env_refuses_ids_outside_the_cache(monkeypatch):
    definition = definition_name(16, 64)
    bad, _, _ = plant_out_of_range_ids(case_inputs(definition, 2, 1, "cpu"))
    monkeypatch.setenv("DSACTL_CHECK", "1")
    with pytest.raises(KernelError, match=r"sparse_indices\[0, 1\]"):
        _run(_launcher_kwargs(definition, None), definition, bad)
    with_topk_length = definition_name(16, 64, "_topklen")
    bad, replaced, _ = plant_out_of_range_ids(case_inputs(with_topk_length, 2, 1, "cpu"))
    bad["topk_length"] = replaced["topk_length"] = torch.tensor([1, 2], dtype=torch.int32)
    outputs = _run(_launcher_kwargs(with_topk_length, None), with_topk_length, bad)  # past the lengths: unread
    assert_matches_reference(with_topk_length, replaced, outputs)


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("cfg", [tsm.config(16, False), tsm._SMALL_GRID, tsm._ONE_TILE], ids=str)
def test_interpreted_16_head_configurations_match_reference(cfg, monkeypatch):
    """Every tile a 16-head bf16 launch can pick (the one-tile one even where this Triton would not
    pick it), over several tiles a split."""
    monkeypatch.setattr(tsm, "launch_config", lambda *args: cfg)
    definition = definition_name(16, 512, "_topklen")
    inputs = case_inputs(definition, 2, 16, "cpu", seed=cfg.block_n, pattern="scattered", valid=(500, 300))
    outputs = _run(_launcher_kwargs(definition, 2), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("scaled", ["q", "kv", "both"])
def test_interpreted_fp16_tiles_keep_values_past_the_fp16_range(scaled):
    """The FP8 kernel at 64+ heads multiplies in fp16: q rows and tokens past 65504 are scaled into its
    range by powers of two and back (the inputs and check of the Hopper kernel's range tests)."""
    from test_attention_hopper import _check_past_fp16, _scaled_past_fp16

    assert tsm.config(64, True).f16
    definition = definition_name(64, 128, "_fp8kv")
    base = case_inputs(definition, 2, 4, "cpu", seed=11, pattern="scattered", valid=(128, 9))
    inputs, factor = _scaled_past_fp16(base, scaled)
    _check_past_fp16(definition, base, inputs, factor, _run(_launcher_kwargs(definition, 2), definition, inputs))


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("scaled, splits", [(False, n) for n in (2, 4, 8, 16, 32, 45, 64)]
                         + [(True, n) for n in (2, 4, 8, 16, 32)])
def test_interpreted_combine_merges_partials(splits, scaled):
    """Partials through the combine, each split count with its own launch (combine_config): the exact
    merge, a row empty in every split and one split of a row empty; fp32: one tile of every split; scaled:
    fp16 values times their half row's factor (the Hopper kernel's, at most SCALED_MAX_SPLITS splits),
    values past fp16's range included."""
    num_tokens, heads = 2, (64 if splits <= 8 else 16)  # fewer heads, fewer interpreted programs
    gen = torch.Generator().manual_seed(splits)
    device = torch.device("cpu")
    if scaled:
        acc, m, l, scale = tsm.scaled_split_partials(device, num_tokens, splits, heads)
        k = torch.randint(-3, 4, (num_tokens, splits, heads, 2), generator=gen).float()
        k[0] += 20  # the first token's values past fp16's range
        scale.copy_(torch.exp2(k).flatten())
    else:
        acc, m, l = tsm.split_partials(device, num_tokens, splits, heads)
    acc.copy_(torch.randn(acc.shape, generator=gen))
    m.copy_(torch.randn(m.shape, generator=gen) * 4)
    l.copy_(torch.rand(l.shape, generator=gen) * 8 + 0.5)
    m.view(num_tokens, splits, heads)[0, :, 3] = float("-inf")
    l.view(num_tokens, splits, heads)[0, :, 3] = 0.0
    m.view(num_tokens, splits, heads)[1, splits - 1, 5] = float("-inf")
    l.view(num_tokens, splits, heads)[1, splits - 1, 5] = 0.0
    output = torch.empty(num_tokens, heads, tsm.MLA_CKV_DIM, dtype=torch.bfloat16)
    lse = torch.empty(num_tokens, heads)
    poison({"output": output, "lse": lse})
    tsm.combine((acc, m, l, scale) if scaled else (acc, m, l), None, output, lse, 1.0, heads, splits, num_tokens)

    pm, pl = m.view(num_tokens, splits, heads), l.view(num_tokens, splits, heads)
    pacc = acc.view(num_tokens, splits, heads, -1).float()
    if scaled:
        pacc = (pacc.unflatten(-1, (2, -1)) * scale.view(num_tokens, splits, heads, 2, 1)).flatten(-2)
    m_all = pm.amax(1)
    w = torch.exp2(pm - torch.where(m_all == float("-inf"), 0.0, m_all)[:, None])
    l_all = (w * pl).sum(1)
    want = (w[..., None] * pacc).sum(1) / torch.where(l_all == 0, 1.0, l_all)[..., None]
    want_lse = torch.where(l_all == 0, float("-inf"), m_all + torch.log2(torch.where(l_all == 0, 1.0, l_all)))
    torch.testing.assert_close(output.float(), want.bfloat16().float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    assert bool((output[0, 3] == 0).all()) and lse[0, 3] == float("-inf")


@pytest.mark.parametrize("requests, positions", [(b, s) for b in (0, 1, 2, 3) for s in (0, 1, 2, 3)])
def test_requests_view_as_tokens_exactly_where_torch_views_them(requests, positions):
    """The rule the launchers test instead of trying a view (a failed view raises, slowly): [B, S, ...] merges
    into [B * S, ...] without a copy exactly where torch's view does."""
    base = torch.randn(4, 4, 6, 8, generator=torch.Generator().manual_seed(requests * 4 + positions))
    layouts = (base, base.transpose(0, 1), base[:, :, :3], base[::2], base.transpose(0, 2).transpose(1, 2))
    for layout in layouts:
        t = layout[:requests, :positions]
        try:
            t.view(-1, *t.shape[2:])
            views = True
        except RuntimeError:
            views = False
        assert tsm.requests_view_as_tokens(t) == views, (t.shape, t.stride())


def test_combine_launch_tiles_the_row_inside_the_combine_tile():
    for splits in range(2, tsm.MAX_SPLITS + 1):
        for heads in tsm.HEADS:
            cfg = tsm.combine_config(splits, heads)
            assert cfg.splits_pad >= splits and heads % cfg.block_hc == 0
            assert tsm.MLA_CKV_DIM % cfg.block_d == 0 and cfg.block_d == tsm.COMBINE_BLOCK_D
            assert cfg.splits_pad * cfg.block_hc * cfg.block_d <= tsm.COMBINE_TILE
            assert cfg.num_warps == tsm.COMBINE_WARPS
    with pytest.raises(KernelInputError, match=f"1 to {tsm.MAX_SPLITS} splits"):
        tsm.combine_config(tsm.MAX_SPLITS + 1, 16)


def test_combine_refuses_scaled_partials_past_their_split_limit():
    splits = tsm.SCALED_MAX_SPLITS + 1
    device = torch.device("cpu")
    output, lse = torch.empty(1, 16, tsm.MLA_CKV_DIM, dtype=torch.bfloat16), torch.empty(1, 16)
    with pytest.raises(KernelInputError, match=f"scaled partials of at most {tsm.SCALED_MAX_SPLITS} splits"):
        tsm.combine(tsm.scaled_split_partials(device, 1, splits, 16), None, output, lse, 1.0, 16, splits, 1)
    assert hopper_mla.MAX_SPLITS <= tsm.SCALED_MAX_SPLITS  # the kernel that writes them never asks for more


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
def test_interpreted_kernel_reads_strided_views():
    """q_nope/q_pe and ckv/kpe as slices of one 576-wide tensor, as MLA stores them."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 16, 576, generator=g).bfloat16()
    cache = torch.randn(4, 64, 576, generator=g).bfloat16()
    idx = torch.randperm(256, generator=g)[:128].int().repeat(2, 1)
    idx[1, ::3] = -1
    inputs = {"q_nope": q[..., :512], "q_pe": q[..., 512:], "ckv_cache": cache[..., :512],
              "kpe_cache": cache[..., 512:], "sparse_indices": idx, "sm_scale": CONTEST_SM_SCALE}
    definition = definition_name(16, 128)
    outputs = _run(_launcher_kwargs(definition, 3), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("suffix, num_splits", [("_sink", 1), ("_fp8kv_lsee_sink", 2)])
def test_interpreted_infinite_sinks_zero_or_keep_rows_and_empty_rows_stay_zero(suffix, num_splits):
    """A sink of +inf zeroes its head's output, -inf leaves it as without a sink; a row with no valid id
    stays 0 whatever its sinks (1 / (1 + exp(-inf - -inf)) would be NaN)."""
    definition = definition_name(16, 128, suffix)
    inputs = case_inputs(definition, 3, 4, "cpu", seed=11)
    inputs["sparse_indices"][1] = -1
    inputs["attn_sink"][:4], inputs["attn_sink"][4:8] = float("inf"), float("-inf")
    outputs = _run(_launcher_kwargs(definition, num_splits), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)
    assert bool((outputs["output"][1] == 0).all()) and bool((outputs["output"][:, :4] == 0).all())


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("fp8kv", [False, True])
def test_interpreted_kernel_reads_padded_pages_and_requests_of_several_tokens(fp8kv):
    """Pages of 5 tokens 6 rows apart (ids page * 5 + offset), q and ids as [requests, tokens, ...] views
    that do not flatten, one topk_length a request, max_logits: as the reference reads the same tokens."""
    g = torch.Generator().manual_seed(13)
    pages, page_tokens, requests, s_q, heads, topk = 6, 5, 2, 3, 16, 64
    if fp8kv:
        rows = case_inputs(definition_name(16, 64, "_fp8kv"), 1, 1, "cpu", seed=13)["kv_cache"].reshape(-1, 656)
        padded = rows[:pages * (page_tokens + 1)].reshape(pages, page_tokens + 1, 656)
        caches = {"kv_cache": padded[:, :page_tokens]}
    else:
        padded = torch.randn(pages, page_tokens + 1, 576, generator=g).bfloat16()
        caches = {"ckv_cache": padded[:, :page_tokens, :512], "kpe_cache": padded[:, :page_tokens, 512:]}
    q = torch.randn(requests, s_q + 1, heads, 576, generator=g).bfloat16()[:, :s_q]
    ids = torch.randint(-1, pages * page_tokens, (requests, s_q + 2, topk), generator=g, dtype=torch.int32)[:, :s_q]
    lengths = torch.tensor([topk, 17], dtype=torch.int32)
    output = torch.full((requests * s_q, heads, 512), float("nan"), dtype=torch.bfloat16)
    lse, max_logits = torch.full((requests * s_q, heads), float("nan")), torch.full((requests * s_q, heads), 7.0)
    tsm.sparse_mla_attention(q[..., :512], q[..., 512:], ids, 0.1, output, lse, **caches, topk_length=lengths,
                             max_logits=max_logits, lse_base_e=True, num_splits=2)
    flat = {name: c.reshape(-1, c.shape[-1]).unsqueeze(1) for name, c in caches.items()}  # the tokens in id order
    want_out, want_lse = attention_reference(q[..., :512].reshape(-1, heads, 512), q[..., 512:].reshape(-1, heads, 64),
                                             ids.reshape(-1, topk), 0.1, **flat,
                                             topk_length=lengths.repeat_interleave(s_q), lse_base=math.e)
    assert torch.allclose(output.float(), want_out.float(), atol=2e-2, rtol=2e-2)
    assert torch.allclose(lse, want_lse, atol=1e-4, rtol=1e-4)
    if fp8kv:
        ckv, kpe = dequantize_mla_kv(flat["kv_cache"].reshape(-1, 656))
    else:
        ckv, kpe = flat["ckv_cache"].reshape(-1, 512).float(), flat["kpe_cache"].reshape(-1, 64).float()
    read = ids.reshape(-1, topk).long()
    valid = (read >= 0) & (torch.arange(topk)[None, :] < lengths.repeat_interleave(s_q)[:, None])
    logits = 0.1 * (torch.einsum("thd,tkd->thk", q[..., :512].reshape(-1, heads, 512).float(), ckv[read.clamp(0)])
                    + torch.einsum("thd,tkd->thk", q[..., 512:].reshape(-1, heads, 64).float(), kpe[read.clamp(0)]))
    want_max = logits.masked_fill(~valid[:, None, :], float("-inf")).amax(-1)
    assert torch.allclose(max_logits, want_max, atol=1e-4, rtol=1e-4)


PAGE_WORKLOADS = [w for w in suite("edge") if w.label == "pages"]


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("workload", [pytest.param(w, id=w.uuid) for w in PAGE_WORKLOADS
                                      if get(w.definition).params["topk"] <= 2048])  # 16384 ids: minutes here
def test_interpreted_entry_serves_flash_mla_layouts_of_the_edge_suite(workload):
    """Pages of 2, 61 and 576 tokens, each padded by a poisoned row, through the shipped entry."""
    inputs = make_inputs(workload, "cpu", seed=2)
    cache = inputs.get("kv_cache", inputs.get("ckv_cache"))
    assert cache.stride(0) == (cache.shape[1] + 1) * cache.stride(1)
    outputs = _run(solutions.leading(workload.definition).load(), workload.definition, inputs)
    assert_matches_reference(workload.definition, inputs, outputs)


def test_verify_leaves_padded_pages_of_other_sizes_to_the_triton_kernel(monkeypatch):
    """The CUDA kernels' solutions serve these definitions, not every padded page: the Hopper kernel maps ids
    through padded pages of a power of two of tokens (and takes rows of 16384 ids), the small-head kernel
    none; verify skips the other pairs, saying why."""
    from dsactl.verify import runner

    monkeypatch.setattr(runner.Candidate, "availability", lambda self: (True, "ok"))
    candidates = [runner.candidate(s) for s in solutions.SOLUTIONS
                  if any(s.serves(w.definition) for w in PAGE_WORKLOADS)]
    pairs, skipped = runner.plan(candidates, PAGE_WORKLOADS)
    cuda = {s.name for s in solutions.SOLUTIONS if s.language == "cuda" and s.refuses}
    assert cuda & {c.name for c in candidates}

    def page_size(w):
        return get(w.definition).params["page_size"]

    odd = {w.uuid for w in PAGE_WORKLOADS if w.params.get("padded_pages") and page_size(w) & (page_size(w) - 1)}
    assert odd and odd != {w.uuid for w in PAGE_WORKLOADS if w.params.get("padded_pages")}
    assert {w.uuid for c, w in pairs if c.name in cuda} == {w.uuid for w in PAGE_WORKLOADS} - odd
    assert {(s.definition, s.reason) for s in skipped if s.solution in cuda} == {
        (w.definition, f"padded pages of {page_size(w)} tokens, not a power of two (the Triton kernel's)")
        for w in PAGE_WORKLOADS if w.uuid in odd}
    assert {w.uuid for c, w in pairs if c.name.startswith("dsactl-attention")} == {w.uuid for w in PAGE_WORKLOADS}
    # The small-head kernel keeps a split's ids in shared memory (longer rows are another kernel's) and reads
    # caches whose ids are rows.
    mma = next(s for s in solutions.SOLUTIONS if s.name.startswith("dsactl-attention-mma"))
    assert mma.refuses({"topk": 2048, "page_size": 64}, {}) is None
    assert mma.refuses({"topk": 4096, "page_size": 64}, {}) == "topk over 2048 (the Hopper or Triton kernel's)"
    assert mma.refuses({"topk": 2048, "page_size": 64}, {"padded_pages": True}) == solutions.PADDED_PAGES


@pytest.mark.skipif(INTERPRETING, reason="the interpreter cases run in this process")
def test_kernel_under_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", "interpreted"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout.splitlines()[-1], result.stdout[-2000:]


# ------------------------------------------------------------------ CPU: baseline, launcher, entries

@pytest.mark.parametrize("suffix", ["", "_fp8kv_lsee", "_topklen_sink", "_fp8kv_lsee_topklen_sink"])
def test_torch_baseline_matches_reference(suffix):
    definition = definition_name(16, 128, suffix)
    inputs = case_inputs(definition, 4, 4, "cpu", seed=3, pattern="scattered", valid=(0, 1, 64, 128))
    entry = entries.make_entry(torch_baseline.sparse_mla_attention, "torch_sparse_attention",
                               entries.Variant(**_flags(suffix)))
    outputs = _run(entry, definition, inputs)
    assert_matches_reference(definition, inputs, outputs)


@pytest.mark.parametrize("suffix", ["", "_fp8kv"])
def test_torch_baseline_reads_ids_outside_the_cache_as_padding(suffix):
    """Ids past the cache or negative ones other than -1 are masked like -1 (the reference's meaning), not
    gathered out of bounds."""
    definition = definition_name(16, 128, suffix)
    inputs = case_inputs(definition, 3, 4, "cpu", seed=5, pattern="scattered", valid=(1, 64, 128))
    hostile = dict(inputs, sparse_indices=inputs["sparse_indices"].clone())
    hostile["sparse_indices"][0, 0] = 4 * 64 + 7
    hostile["sparse_indices"][2, 5] = -9
    masked = dict(inputs, sparse_indices=torch.where((hostile["sparse_indices"] < 0)
                                                     | (hostile["sparse_indices"] >= 4 * 64), -1,
                                                     hostile["sparse_indices"]))
    entry = entries.make_entry(torch_baseline.sparse_mla_attention, "torch_sparse_attention",
                               entries.Variant(**_flags(suffix)))
    got, want = _run(entry, definition, hostile), _run(entry, definition, masked)
    assert all(torch.equal(got[k], want[k]) for k in got)


def _flags(suffix: str) -> dict:
    return {"fp8kv": "_fp8kv" in suffix, "lse_e": "_lsee" in suffix, "topk_length": "_topklen" in suffix,
            "sink": "_sink" in suffix}


def test_every_variant_has_an_entry_with_its_signature():
    for suffix in solutions.ATTENTION_VARIANTS:
        definition = get(definition_name(64, 2048, suffix))
        entry = getattr(solution, "sparse_attention" + suffix)
        assert list(inspect.signature(entry).parameters) == definition.signature
        triton_only = getattr(triton_entries, "sparse_attention" + suffix)
        assert list(inspect.signature(triton_only).parameters) == definition.signature
        served = [s for s in solutions.for_definition(definition.name) if s.language == "triton"]
        assert [s.entry for s in served] == [f"dsactl.kernels.attention.solution:sparse_attention{suffix}"]
        assert served[0].load() is entry


def test_split_count_fills_the_gpu():
    sms = 132
    for heads in tsm.HEADS:
        for fp8kv in (False, True):
            cfg = tsm.config(heads, fp8kv)
            most_splits = min(2048 // cfg.block_n, tsm.MAX_SPLITS)
            for num_tokens in (1, 2, 6, 7, 8):  # the contest's token counts: most SMs busy, one wave
                groups = num_tokens * (heads // cfg.block_h)
                programs = groups * tsm.num_splits_for(num_tokens, heads, 2048, cfg, sms)
                assert min(sms // 2, groups * most_splits) <= programs <= sms
            for num_tokens in (256, 1024):  # the grid is full without splitting: no combine
                assert tsm.num_splits_for(num_tokens, heads, 2048, cfg, sms) == 1
    assert tsm.num_splits_for(8, 16, 2048, tsm.config(16, False), sms) == 16
    assert tsm.num_splits_for(1, 16, 2048, tsm.config(16, False), sms) == 32
    assert tsm.num_splits_for(128, 128, 2048, tsm.config(128, False), sms) == 1
    assert tsm.num_splits_for(1, 16, 64, tsm.config(16, False), sms) == 1  # one tile: nothing to split


def _spec_name(heads: int, fp8kv: bool, cfg) -> str:
    return f"sparse_mla_h{heads}_{'fp8kv' if fp8kv else 'bf16kv'}" + (
        "" if cfg == tsm.config(heads, fp8kv) else f"_n{cfg.block_n}w{cfg.num_warps}")


def test_every_launch_passes_a_row_pad_that_holds_its_share_and_was_built():
    built = {spec["name"] for spec in tsm.aot_specs()}
    for heads in tsm.HEADS:
        for fp8kv, compact in ((f, c) for f in (False, True) for c in (False, True)):
            for cfg in tsm.configs(heads, fp8kv, compact):
                pads = tsm.row_pads(cfg)
                assert pads == sorted(pads) and pads[-1] == tsm.ROW_IDS_MAX
                assert {f"{_spec_name(heads, fp8kv, cfg)}_ids{pad}" for pad in pads} <= built
                for topk in (1, 63, 64, 100, 576, 2047, 2048):
                    for splits in range(1, min(tsm.MAX_SPLITS, topk) + 1):
                        pad = tsm.row_pad(topk, splits, cfg)
                        assert pad in pads and pad % cfg.block_n == 0 and pad >= -(-topk // splits)
    assert tsm.row_pad(2048, 1, tsm.config(128, False)) == 2048
    assert tsm.row_pad(2048, 32, tsm.config(128, False)) == tsm.ROW_IDS_MIN  # 64 positions, padded up


def test_gpus_with_less_shared_memory_take_compact_tiles_from_32_heads():
    for heads in (32, 64, 128):
        for fp8kv in (False, True):
            assert tsm.configs(heads, fp8kv, True) == [tsm.COMPACT]
            for num_tokens in (1, 8, 128):
                assert tsm.launch_config(num_tokens, heads, 2048, fp8kv, 188, True) == tsm.COMPACT
            knobs = {**vars(tsm.COMPACT), "num_splits": 4}
            assert tsm.tuned_launch(knobs, heads, 2048, fp8kv) == (tsm.COMPACT, 4), "a table may name them"
    for fp8kv in (False, True):
        assert tsm.configs(16, fp8kv, True) == tsm.configs(16, fp8kv)
    assert not tsm.compact_for(torch.device("cpu"))
    # Every arch builds what such a GPU launches; only arches with Hopper-sized shared memory build the rest.
    compact = {_spec_name(h, f, c) for h in tsm.HEADS for f in (False, True) for c in tsm.configs(h, f, True)}
    for spec in tsm.aot_specs():
        if spec["name"].startswith("sparse_mla_h"):
            meant = spec["name"].rsplit("_ids", 1)[0] in compact
            assert spec.get("min_shared") == (None if meant else tsm.HOPPER_SHARED_PER_BLOCK), spec["name"]


@pytest.mark.skipif(not INTERPRETING, reason="runs where TRITON_INTERPRET=1 (see test_kernel_under_interpreter)")
@pytest.mark.parametrize("heads, suffix", [(64, ""), (128, "_fp8kv")])
def test_interpreted_compact_tiles_match_reference(heads, suffix, monkeypatch):
    """COMPACT (GPUs with less shared memory a block) over several head groups and tiles a split."""
    monkeypatch.setattr(tsm, "launch_config", lambda *args: tsm.COMPACT)
    definition = definition_name(heads, 256, suffix)
    inputs = case_inputs(definition, 2, 8, "cpu", seed=heads, pattern="scattered", valid=(250, 77))
    outputs = _run(_launcher_kwargs(definition, 2), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)


def test_rows_longer_than_a_split_holds_take_more_splits_or_are_refused():
    sms, cfg = 132, tsm.config(128, False)
    for topk in (2049, 4096, 10000):
        fewest = -(-topk // tsm.ROW_IDS_MAX)
        for num_tokens in (1, 8, 128, 1024):
            splits = tsm.num_splits_for(num_tokens, 128, topk, cfg, sms)
            assert splits >= fewest and tsm.row_pad(topk, splits, cfg) <= tsm.ROW_IDS_MAX
    with pytest.raises(KernelError, match="topk 4096 in 1 splits leaves 4096 positions a split, over the 2048 "
                                          "a split holds: use at least 2 splits"):
        tsm.row_pad(4096, 1, cfg)
    definition = definition_name(16, 128)
    inputs = case_inputs(definition, 1, 80, "cpu")
    long_rows = torch.arange(4096, dtype=torch.int32)[None]
    d = get(definition)
    outputs = d.allocate_outputs(d.check_inputs(inputs), "cpu")
    with pytest.raises(KernelError, match="use at least 2 splits"):
        tsm.sparse_mla_attention(**{**inputs, **outputs, "sparse_indices": long_rows}, num_splits=1)


def test_a_partial_cost_never_adds_splits():
    # Counting each program's partial (num_splits_for's partial_tiles) can only trade splits for fewer,
    # longer programs; it never splits more, and with one split there is no partial to count.
    cfg = tsm.config(128, False, version=(3, 6))  # 64 heads a program
    for num_sms in (132, 148):
        for topk in (64, 512, 2048):
            for num_tokens in range(1, 160):
                for heads in (64, 128):
                    free = tsm.num_splits_for(num_tokens, heads, topk, cfg, num_sms)
                    for partial_tiles in (1.0, 3.0, 10.0):
                        assert tsm.num_splits_for(num_tokens, heads, topk, cfg, num_sms, partial_tiles) <= free
    assert tsm.num_splits_for(2, 128, 2048, cfg, 132) == 32  # 128 programs of one tile
    assert tsm.num_splits_for(2, 128, 2048, cfg, 132, 3.0) == 16  # 64 programs of two


def test_small_grids_at_16_heads_take_twice_the_splits_of_half_the_tiles():
    sms = 132
    small = tsm.launch_config(1, 16, 2048, False, sms)
    assert (small.block_n, small.num_warps) == (32, 4) and small in tsm.configs(16, False)
    assert tsm.num_splits_for(1, 16, 2048, small, sms) == 64  # one 32-token tile a program
    assert tsm.launch_config(2, 16, 2048, False, sms) == small  # 64 programs of 64 tokens: half the SMs idle
    for num_tokens, heads, fp8kv in ((3, 16, False), (8, 16, False), (1, 32, False), (1, 16, True), (1, 128, False)):
        assert tsm.launch_config(num_tokens, heads, 2048, fp8kv, sms) == tsm.config(heads, fp8kv)
    assert tsm.launch_config(8, 16, 256, False, sms) == small  # short rows: 32 programs of 64 tokens


def test_grids_under_one_wave_at_16_heads_take_one_128_token_tile_where_it_builds_cleanly():
    sms = 132
    assert tsm.num_splits_for(8, 16, 2048, tsm._ONE_TILE, sms) == 16  # 128 programs of one tile
    assert tsm.num_splits_for(6, 16, 2048, tsm._ONE_TILE, sms) == 16  # 96 programs of one tile
    assert tsm.launch_config(4, 16, 2048, False, sms) == tsm.config(16, False)  # 128 programs of 64 tokens
    assert tsm.launch_config(9, 16, 2048, False, sms) == tsm.config(16, False)  # 144 tiles: over a wave
    one_tile = tsm.launch_config(8, 16, 2048, False, sms)
    if not tsm._ONE_TILE_BUILDS_CLEANLY:  # Triton >= 3.7 spills it: the 64-token tile stays
        assert one_tile == tsm.config(16, False) and len(tsm.configs(16, False)) == 2
        return
    assert one_tile == tsm._ONE_TILE and (one_tile.block_n, one_tile.num_stages) == (128, 1)
    assert one_tile in tsm.configs(16, False) and tsm.launch_config(6, 16, 2048, False, sms) == one_tile


def test_launcher_rejects_malformed_inputs():
    definition = definition_name(16, 128)
    inputs = case_inputs(definition, 2, 4, "cpu")
    d = get(definition)
    outputs = d.allocate_outputs(d.check_inputs(inputs), "cpu")
    base = {**inputs, **outputs}
    bad_cases = {
        "q_nope must be torch.bfloat16": {"q_nope": inputs["q_nope"].float()},
        "heads must be one of": {"q_nope": inputs["q_nope"][:, :8], "q_pe": inputs["q_pe"][:, :8]},
        "sparse_indices must be torch.int32": {"sparse_indices": inputs["sparse_indices"].long()},
        "contiguous last dimension": {"q_pe": inputs["q_pe"].repeat_interleave(2, dim=-1)[..., ::2]},
        "pass either kv_cache": {"kv_cache": torch.zeros(4, 64, 656, dtype=torch.int8)},
        "lse has shape": {"lse": outputs["lse"][:1]},
        "kpe_cache has \\[3, 64\\] pages x tokens": {"kpe_cache": inputs["kpe_cache"][:3]},
    }
    for message, change in bad_cases.items():
        with pytest.raises(KernelError, match=message):
            tsm.sparse_mla_attention(**{**base, **change})


# ------------------------------------------------------------------ GPU

def _gpu_solution(definition: str):
    (sol,) = [s for s in solutions.for_definition(definition) if s.language == "triton"]
    return sol.load()


# The shipped entry dispatches (on sm_90 the Hopper kernel takes 64/128 heads), so the GPU tests
# run it and the Triton launcher itself, which serves those shapes on every other GPU.
IMPLEMENTATIONS = {"entry": _gpu_solution, "triton": lambda definition: _launcher_kwargs(definition, None)}


SUITES = ("contest", "edge", "scale", "prefill", "dispatch")
# One test a workload, so that pytest -n spreads each suite over its workers.
SUITE_WORKLOADS = {name: [w for w in suite(name) if w.definition.startswith("dsa_sparse_attention")]
                   for name in SUITES}


def test_every_suite_has_attention_workloads():
    assert all(SUITE_WORKLOADS.values())


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("workload", [pytest.param(w, id=w.uuid) for ws in SUITE_WORKLOADS.values() for w in ws])
def test_gpu_suites_match_reference(workload, impl):
    inputs = make_inputs(workload, "cuda", seed=1)
    outputs = _run(IMPLEMENTATIONS[impl](workload.definition), workload.definition, inputs)
    verdict = check(get(workload.definition), inputs, outputs)
    assert verdict.passed, "\n".join(verdict.problems)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("heads", tsm.HEADS)
@pytest.mark.parametrize("suffix", solutions.ATTENTION_VARIANTS)
def test_gpu_every_variant_matches_reference(heads, suffix, impl):
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, 5, 256, "cuda", seed=heads, pattern="scattered", valid=(0, 1, 700, 2047, 2048))
    assert_matches_reference(definition, inputs, _run(IMPLEMENTATIONS[impl](definition), definition, inputs))


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("topk", [64, 576, 1536])
@pytest.mark.parametrize("suffix", ["", "_fp8kv"])
def test_gpu_other_topk_sizes(heads, topk, suffix, impl):
    definition = definition_name(heads, topk, suffix)
    inputs = case_inputs(definition, 3, 64, "cuda", seed=topk, pattern="scattered", valid=(topk, topk // 2, 1))
    assert_matches_reference(definition, inputs, _run(IMPLEMENTATIONS[impl](definition), definition, inputs))


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [1, 2, 7, 32, 64])
@pytest.mark.parametrize("suffix", ["_sink", "_fp8kv_lsee_topklen"])
def test_gpu_any_split_count_is_exact(num_splits, suffix):
    definition = definition_name(128, 2048, suffix)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=num_splits, pattern="tail", valid=(2048, 5, 0, 1000))
    outputs = _run(_launcher_kwargs(definition, num_splits), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)


@pytest.mark.gpu
@pytest.mark.parametrize("suffix", ["_lsee", "_fp8kv_sink"])
def test_gpu_grid_far_larger_than_the_gpu_is_exact(suffix):
    """3072 split programs, many waves, and the largest combine."""
    definition = definition_name(128, 2048, suffix)
    inputs = case_inputs(definition, 48, 256, "cuda", seed=11, pattern="scattered", valid=(2048, 1, 0, 1500) * 12)
    outputs = _run(_launcher_kwargs(definition, 32), definition, inputs)
    assert_matches_reference(definition, inputs, outputs)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", tsm.HEADS)
@pytest.mark.parametrize("suffix", ["", "_fp8kv"])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_gpu_ids_outside_the_cache_are_masked_and_counted(heads, suffix, num_splits):
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 64, "cuda", seed=heads, pattern="scattered")
    check_out_of_range_ids(definition, inputs, _launcher_kwargs(definition, num_splits),
                           (tsm.bad_index_count, tsm.reset_bad_index_count))


@pytest.mark.gpu
def test_gpu_repeated_calls_are_bitwise_identical():
    """The split partials and their combine are deterministic: a race would move the result."""
    definition = definition_name(16, 2048)
    inputs = case_inputs(definition, 8, 512, "cuda", seed=9)
    for num_splits in (None, 3, 32):
        fn = _launcher_kwargs(definition, num_splits)
        assert_repeatable(lambda: _run(fn, definition, inputs), definition, inputs, 200)


@pytest.mark.gpu
def test_gpu_call_is_graph_capturable_and_repeatable():
    """No host sync inside a call: it captures into a CUDA graph and replays. The graph owns the split
    partials it captured: a later, larger eager call must not free them under it. A tensor the size of
    the captured partials, allocated right after that call, takes any block it freed (the caching
    allocator fits exactly), so a replay writing freed memory would change it."""
    definition = definition_name(16, 2048)
    inputs = case_inputs(definition, 8, 512, "cuda", seed=5)
    fn = _gpu_solution(definition)
    eager = _run(fn, definition, inputs)
    d = get(definition)
    outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
    poison(outputs)
    args = [{**inputs, **outputs}[name] for name in d.signature]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = tsm.num_splits_for(8, 16, 2048, tsm.launch_config(8, 16, 2048, False, sms), sms)
    assert splits > 1, "the captured call must use split partials"
    # 64 tokens x 64 splits: far more partials than captured (the split formula keeps its grids near
    # 128 programs, so left to it a larger call can need exactly as many).
    larger = case_inputs(definition, 64, 512, "cuda", seed=6)
    larger_outputs = _run(_launcher_kwargs(definition, tsm.MAX_SPLITS), definition, larger)
    canary = torch.full((8 * splits * 16 * (tsm.MLA_CKV_DIM + 2),), 7.0, device="cuda")  # the captured partials
    for _ in range(100):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(outputs["output"], eager["output"]) and torch.equal(outputs["lse"], eager["lse"])
    assert bool((canary == 7.0).all()), "a graph replay wrote memory the graph does not own"
    assert_matches_reference(definition, larger, larger_outputs)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("suffix", ["", "_fp8kv"])
def test_gpu_calls_on_concurrent_streams_keep_their_own_partials(suffix, impl, hold_back):
    """Split calls on two streams at once each get their own partials. Each call's combine is held
    back on its stream, so the other stream's split kernel runs in between: partials shared between
    the calls would hand one call's combine the other's."""
    hold_back(tsm, "combine")  # both launchers call tsm.combine
    definition = definition_name(128, 2048, suffix)
    fn = IMPLEMENTATIONS[impl](definition)
    d = get(definition)
    streams = [torch.cuda.Stream() for _ in range(2)]
    calls = []
    for k, stream in enumerate(streams):
        inputs = case_inputs(definition, 4, 256, "cuda", seed=20 + k, pattern="scattered", valid=(2048, 900, 1, 0))
        outputs = d.allocate_outputs(d.check_inputs(inputs), "cuda")
        poison(outputs)
        calls.append((stream, inputs, outputs, [{**inputs, **outputs}[name] for name in d.signature]))
    torch.cuda.synchronize()
    for _ in range(3):
        for stream, _, _, args in calls:
            with torch.cuda.stream(stream):
                fn(*args)
    torch.cuda.synchronize()
    for _, inputs, outputs, _ in calls:
        assert_matches_reference(definition, inputs, outputs)
