"""The warp-specialized Hopper sparse MLA kernel (kernels/attention/hopper_mla.cu + hopper_mla.py).

CPU: it builds for sm_90a with zero spills, zero local memory and no wgmma serialization, and for
sm_100a (where its body traps and the launcher refuses); the library refuses bad arguments before
any CUDA call; the launcher's input checks, arch refusal and split choice; the model of its numerics
(hopper_model.py, splits merged by the shipped combine) shows what its roundings and shifts buy. GPU
(sm_90 only): every served variant against the float32 reference on poisoned outputs, index patterns,
split counts.
"""

from __future__ import annotations

import ctypes
import inspect
import math
import re
import shutil
import subprocess

import pytest
import torch
from attention_cases import (assert_matches_reference, assert_repeatable, build_library, case_inputs,
                             definition_name, poisoned_outputs)

from dsactl.build import cuda as build_cuda
from dsactl.build import cuobjdump
from dsactl import fp8
from dsactl.definitions import get
from dsactl.definitions.attention import reference as attention_reference
from dsactl.kernels.errors import KernelError
from dsactl.kernels import cuda_library
from dsactl.kernels.attention import dispatch, hopper_mla, hopper_model
from dsactl.kernels.attention.entries import VARIANTS
from dsactl.kernels.attention import triton_sparse_mla as tsm
from dsactl.verify.rules import check

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
on_sm90 = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                             reason="the Hopper kernel runs on compute capability 9.0 only")
SERVED = tuple(v.suffix for v in VARIANTS)  # every variant
SMEM_LIMIT = 227 * 1024  # sm_90's per-block opt-in shared memory
# ptxas remarks that would make the kernel slow without failing: wgmma serialized (C7514/C7515)
# or setmaxnreg ignored (C7508).
PTXAS_PERF_REMARKS = ("C7508", "C7514", "C7515")


def _call(definition: str, inputs: dict, num_splits: int | None = None, **kwargs) -> dict:
    """The launcher on poisoned outputs, with the definition variant's keyword arguments."""
    d = get(definition)
    outputs = poisoned_outputs(definition, inputs)
    named = {**inputs, **outputs}
    hopper_mla.sparse_mla_attention(**{name: named[name] for name in d.signature},
                                    lse_base_e=d.params["lse_base"] != 2.0, num_splits=num_splits, **kwargs)
    return outputs


# ------------------------------------------------------------------ build (CPU, needs nvcc)

@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """hopper_mla built for sm90a and sm100a into a private build root: {arch: (rows, arch_dir)}."""
    return build_library(tmp_path_factory.mktemp("build"), hopper_mla.LIBRARY, ("sm90a", "sm100a"))


@needs_nvcc
def test_builds_for_sm90a_without_spills_local_memory_or_serialized_wgmma(builds):
    rows, arch_dir = builds["sm90a"]
    # (FP8 KV, CTAs sharing one gather, Q by TMA, FP8 staged as fp16 rows, L2 prefetch): bf16 alone, Q by
    # cp.async (below 64 heads, several positions a request) or TMA (the rest); FP8 alone (64 heads), with the
    # L2 prefetch (whole rows) and in 2-CTA clusters (128); FP8 staged, alone.
    kernel = "hopper_mla::hopper_mla_kernel"
    assert {(r.kernel, r.configuration) for r in rows} == {(kernel, "false, 1, false, false, false"),
                                                           (kernel, "false, 1, true, false, false"),
                                                           (kernel, "true, 1, false, false, false"),
                                                           (kernel, "true, 1, false, false, true"),
                                                           (kernel, "true, 2, false, false, false"),
                                                           (kernel, "true, 1, false, true, false")}
    for row in rows:
        assert (row.spill_stores, row.spill_loads, row.stack_frame, row.local) == (0, 0, 0, 0), row
        # __launch_bounds__(384, 1): the entry register count is the file's 65536 / 384, rounded down to 8.
        assert row.registers == 168, row
    log = build_cuda.log_path(arch_dir, cuda_library.find(hopper_mla.LIBRARY)).read_text()
    assert not [r for r in PTXAS_PERF_REMARKS if r in log], log
    assert "warning" not in log, log
    sass = subprocess.run([str(cuobjdump.cuobjdump_path()), "-sass", str(arch_dir / "libhopper_mla.so")],
                          capture_output=True, text=True, check=True).stdout
    # bf16 KV: bf16 MMAs; FP8 KV: fp16 MMAs (SASS names no input type for fp16).
    for instruction in ("HGMMA.64x64x16.F32.BF16 ", "HGMMA.64x256x16.F32.BF16 ", "HGMMA.64x64x16.F32 ",
                        "HGMMA.64x256x16.F32 ", ".tnspB", "USETMAXREG.DEALLOC", "USETMAXREG.TRY_ALLOC",
                        "SYNCS.PHASECHK", "LDGSTS"):
        assert instruction in sass, instruction
    assert "LDL" not in sass and "STL" not in sass
    # bf16 of whole 64-head groups takes Q by TMA: the 8 ckv boxes and the kpe box, in that kernel alone.
    kernels = dict(re.findall(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    tma = [name for name, body in kernels.items() if "UTMALDG.3D" in body]
    assert len(tma) == 1 and "ILb0ELi1ELb1ELb0ELb0E" in tma[0], list(kernels)
    assert kernels[tma[0]].count("UTMALDG.3D") == 9
    # Copied rows (bf16, both Q loads; FP8 staged) are published as their copies land
    # (cp.async.mbarrier.arrive), the producer never waiting for them: only the bf16 kernel that loads Q
    # by cp.async waits for a copy group (that Q).
    arriving = {re.search(r"ILb\dELi\dELb\dELb\dELb\dE", name).group(0) for name, body in kernels.items()
                if "ARRIVES.LDGSTSBAR" in body}
    assert arriving == {"ILb0ELi1ELb0ELb0ELb0E", "ILb0ELi1ELb1ELb0ELb0E", "ILb1ELi1ELb0ELb1ELb0E"}, arriving
    assert sum(body.count("LDGDEPBAR") for body in kernels.values()) == 1
    # The L2 prefetch (prefetch.global.L2) in the FP8 kernel that asks for it alone.
    prefetching = [name for name, body in kernels.items() if "CCTL.E.PF2" in body]
    assert len(prefetching) == 1 and "ILb1ELi1ELb0ELb0ELb1E" in prefetching[0], list(kernels)


@needs_nvcc
def test_builds_for_sm100a_with_a_trapping_body(builds):
    rows, arch_dir = builds["sm100a"]
    assert len(rows) == 6 and all(not r.spills and r.local == 0 for r in rows)
    assert "warning" not in build_cuda.log_path(arch_dir, cuda_library.find(hopper_mla.LIBRARY)).read_text()
    sass = subprocess.run([str(cuobjdump.cuobjdump_path()), "-sass", str(arch_dir / "libhopper_mla.so")],
                          capture_output=True, text=True, check=True).stdout
    assert "GMMA" not in sass and "BPT.TRAP" in sass


@needs_nvcc
def test_library_refuses_bad_arguments_before_any_cuda_call(builds):
    _, arch_dir = builds["sm90a"]
    lib = hopper_mla.bind(ctypes.CDLL(str(arch_dir / "libhopper_mla.so")))
    assert lib.dsa_hopper_mla_smem_bytes() <= SMEM_LIMIT
    fake = 1 << 20  # an aligned address that is never dereferenced: every call below fails its checks first

    def call(heads=64, topk=2048, splits=1, num_tokens=1, q_stride=576, kv_a=fake, parts=(fake,) * 4,
             in_cluster=0, cache_tokens=4096, bad_count=fake, scale_log2=1.0,
             kv_format=hopper_mla.KV_BF16, kv_b=fake, kv_a_stride=512, topk_length=None, tokens_per_length=1,
             page_shift=0, page_rows=1, positions=1, position_stride=0):
        return lib.dsa_hopper_mla_decode(fake, q_stride * heads, q_stride, fake, q_stride * heads, q_stride,
                                         kv_format, kv_a, kv_a_stride, kv_b, 64, fake, topk, num_tokens, heads, topk,
                                         splits, in_cluster, scale_log2, 1.0, fake, 512 * heads, 512,
                                         fake, heads, 1, *parts, cache_tokens, bad_count, None, None, topk_length,
                                         tokens_per_length, float("-inf"), page_shift, page_rows, positions,
                                         position_stride, position_stride, position_stride, None)

    bad_shape, bad_alignment, null, bad_cluster, bad_scale, bad_format, bad_pages = -1, -2, -3, -5, -7, -8, -9
    # Pages of 2^page_shift tokens at least that many rows apart, every row of the cache's ids below 2^32;
    # staged rows are one an id.
    assert call(page_shift=6, page_rows=65, num_tokens=0) == 0
    assert call(page_shift=-1) == bad_pages and call(page_shift=31, page_rows=1 << 31) == bad_pages
    assert call(page_shift=6, page_rows=63) == bad_pages and call(page_shift=6, page_rows=1 << 40) == bad_pages
    assert call(page_shift=6, page_rows=1 << 26, cache_tokens=1 << 12, num_tokens=0) == 0  # rows below 2^32
    assert call(page_shift=6, page_rows=1 << 26, cache_tokens=(1 << 12) + 1, num_tokens=0) == bad_pages
    assert call(kv_format=hopper_mla.KV_STAGED, kv_a_stride=576, page_shift=6, page_rows=65) == bad_pages
    assert call(kv_format=3) == bad_format and call(kv_format=-1) == bad_format
    # FP8 staged: fp16 rows of 576 (16-byte aligned, strides of 8 elements) and 4-byte aligned factors.
    staged = hopper_mla.KV_STAGED
    assert call(kv_format=staged, kv_a_stride=576, num_tokens=0) == 0
    assert call(kv_format=staged, kv_a_stride=576, kv_b=None) == null
    assert call(kv_format=staged, kv_a_stride=580) == bad_alignment
    assert call(kv_format=staged, kv_b=fake + 2) == bad_alignment
    assert call(kv_format=staged, kv_a=fake + 8) == bad_alignment
    assert call(heads=8) == bad_shape and call(heads=48) == bad_shape and call(heads=96) == bad_shape
    assert call(topk=100) == bad_shape and call(topk=16384 + 64) == bad_shape and call(topk=0) == bad_shape
    assert call(topk=16384, num_tokens=0) == 0
    # A row length a request: at least one token a request.
    assert call(topk_length=fake, tokens_per_length=0) == bad_shape
    assert call(topk_length=fake, tokens_per_length=2, num_tokens=0) == 0
    # Requests of `positions` tokens: at least one, dividing the tokens; a position stride stepped over
    # (several positions) keeps q's rows aligned.
    assert call(positions=0) == bad_shape and call(positions=2, num_tokens=3) == bad_shape
    assert call(positions=2, num_tokens=4, position_stride=12) == bad_alignment
    assert call(splits=0) == bad_shape and call(splits=hopper_mla.MAX_SPLITS + 1) == bad_shape
    assert call(num_tokens=-1) == bad_shape and call(cache_tokens=-1) == bad_shape
    assert call(num_tokens=65536) == bad_shape
    assert call(num_tokens=0) == 0  # nothing to do: no CUDA call at all
    assert call(kv_a=0) == null and call(splits=2, parts=(None,) * 4) == null
    assert call(splits=2, parts=(fake, fake, fake, None)) == null  # the partials' scales too
    assert call(bad_count=None) == null
    assert call(cache_tokens=0, q_stride=580) == bad_alignment  # an empty cache is valid: every id is masked
    assert call(q_stride=580) == bad_alignment and call(kv_a=fake + 8) == bad_alignment
    # Splits merged in a cluster: exactly 2 of them, and no partials needed.
    for splits in (1, 3, 4, 16, 32):
        assert call(splits=splits, in_cluster=1) == bad_cluster
    assert call(splits=2, in_cluster=1, parts=(None,) * 4, q_stride=580) == bad_alignment
    # The kernel scales raw maxima: a positive logit scale only (the launcher maps sm_scale <= 0 onto one).
    for scale_log2 in (0.0, -0.0, -1.0, float("nan")):
        assert call(scale_log2=scale_log2) == bad_scale
    assert call(scale_log2=2.0 ** -149, q_stride=580) == bad_alignment
    for code in (bad_shape, bad_alignment, null, -4, bad_cluster, -6, bad_scale, bad_format):
        assert lib.dsa_hopper_mla_error_string(code).decode() not in ("ok", "unknown error")


# ------------------------------------------------------------------ launcher (CPU)

def _cpu_call(definition: str, change: dict, **kwargs) -> None:
    inputs = case_inputs(definition, 2, 40, "cpu")
    outputs = poisoned_outputs(definition, inputs)
    named = {**inputs, **outputs, **change}
    d = get(definition)
    hopper_mla.sparse_mla_attention(**{name: named[name] for name in d.signature}, **kwargs)


def test_launcher_rejects_malformed_inputs_with_clear_messages():
    definition = definition_name(64, 128)
    inputs = case_inputs(definition, 2, 40, "cpu")
    outputs = poisoned_outputs(definition, inputs)
    q = torch.zeros(2, 64, 520, dtype=torch.bfloat16)  # rows 1040 bytes apart: aligned
    q_odd = torch.zeros(2, 64, 516, dtype=torch.bfloat16)  # rows 1032 bytes apart: not
    bad_cases = {
        "heads must be one of \\(16, 32, 64, 128\\), got 8": {"q_nope": inputs["q_nope"][:, :8],
                                                            "q_pe": inputs["q_pe"][:, :8]},
        "q_nope must be torch.bfloat16": {"q_nope": inputs["q_nope"].float()},
        "topk must be a multiple of 64": {"sparse_indices": inputs["sparse_indices"][:, :100]},
        "sparse_indices must be torch.int32": {"sparse_indices": inputs["sparse_indices"].long()},
        "contiguous last dimension": {"q_pe": inputs["q_pe"].repeat_interleave(2, dim=-1)[..., ::2]},
        "q_nope must start 16-byte aligned": {"q_nope": q[..., 1:513]},
        "q_nope row strides must be multiples of 8": {"q_nope": q_odd[..., :512]},
        "lse has shape": {"lse": outputs["lse"][:1]},
        "output must be torch.bfloat16": {"output": outputs["output"].float()},
    }
    for message, change in bad_cases.items():
        with pytest.raises(KernelError, match=message):
            _cpu_call(definition, change)
    with pytest.raises(KernelError, match="pass either kv_cache"):
        _cpu_call(definition, {}, kv_cache=torch.zeros(4, 64, 656, dtype=torch.int8))
    with pytest.raises(KernelError, match="topk_length has shape"):
        _cpu_call(definition, {}, topk_length=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(KernelError, match="attn_sink has shape"):
        _cpu_call(definition, {}, attn_sink=torch.zeros(32))
    with pytest.raises(KernelError, match="max_logits must have lse's strides"):
        _cpu_call(definition, {}, max_logits=torch.zeros(2, 128)[:, :64])
    # Requests of 2 tokens: q and ids must view as tokens (a view that does not is the Triton kernel's).
    requests = {"q_nope": inputs["q_nope"].view(1, 2, 64, 512), "q_pe": inputs["q_pe"].view(1, 2, 64, 64),
                "sparse_indices": inputs["sparse_indices"].view(1, 2, 128)}
    with pytest.raises(KernelError, match="needs CUDA tensors"):
        _cpu_call(definition, requests, topk_length=torch.zeros(1, dtype=torch.int32))
    padded = torch.zeros(5, 2, 62, 576, dtype=torch.bfloat16)[:, :, :61]  # pages of 61 tokens, 62 rows apart
    with pytest.raises(KernelError, match="pages of a power of two of tokens padded by whole rows"):
        _cpu_call(definition, {"ckv_cache": padded[..., :512].flatten(0, 1), "kpe_cache": padded[..., 512:].flatten(0, 1)})
    fp8 = definition_name(128, 64, "_fp8kv")
    with pytest.raises(KernelError, match="kv_cache tokens must be 656 contiguous bytes"):
        _cpu_call(fp8, {"kv_cache": case_inputs(fp8, 2, 40, "cpu")["kv_cache"].transpose(0, 1)})


def test_page_map_addresses_rows_and_padded_pages_of_a_power_of_two():
    """(page_shift, page_rows) of the caches the kernel reads, None for the ones it leaves to the Triton kernel."""
    def fp8_cache(pages, tokens, rows):
        return torch.zeros(pages, rows, 656, dtype=torch.int8)[:, :tokens]

    def bf16_caches(pages, tokens, rows, kpe_rows=None):
        both = torch.zeros(pages, rows, 576, dtype=torch.bfloat16)[:, :tokens]
        kpe = both[..., 512:] if kpe_rows is None else torch.zeros(pages, kpe_rows, 64, dtype=torch.bfloat16)[:, :tokens]
        return both[..., :512], kpe

    assert hopper_mla.page_map(None, None, fp8_cache(8, 64, 64)) == (0, 1)  # evenly strided: ids are rows
    assert hopper_mla.page_map(None, None, fp8_cache(8, 64, 65)) == (6, 65)  # FlashMLA's tests' blocks
    assert hopper_mla.page_map(None, None, fp8_cache(8, 2, 3)) == (1, 3)
    assert hopper_mla.page_map(None, None, fp8_cache(8, 61, 62)) is None  # a division per id
    assert hopper_mla.page_map(None, None, torch.zeros(8, 64, 672, dtype=torch.int8)[..., :656]) is None
    assert hopper_mla.page_map(*bf16_caches(8, 64, 64), None) == (0, 1)
    assert hopper_mla.page_map(*bf16_caches(8, 256, 257), None) == (8, 257)
    assert hopper_mla.page_map(*bf16_caches(8, 64, 65, kpe_rows=66), None) is None  # one map for both caches
    assert hopper_mla.page_map(*bf16_caches(8, 64, 64, kpe_rows=65), None) is None
    # Every row of the cache's ids fits 32 bits: pages of 64 tokens 200 rows apart, up to 21474837 pages.
    def huge(pages):  # shapes and strides only
        return torch.empty_strided((pages, 64, 656), (200 * 656, 656, 1), dtype=torch.int8, device="meta")

    assert hopper_mla.page_map(None, None, huge(21474837)) == (6, 200)
    assert hopper_mla.page_map(None, None, huge(21474838)) is None


@pytest.mark.parametrize("requests", [1, 2, 3])
@pytest.mark.parametrize("positions", [1, 2, 3])
def test_requests_take_their_own_strides_exactly_where_they_do_not_view_as_tokens(requests, positions):
    """The kernel reads [B, S, ...] requests through a request and a position stride where torch cannot view
    them as [B * S, ...] tokens, and as those tokens' views where it can (the rule is checked, not tried)."""
    g = torch.Generator().manual_seed(requests * 10 + positions)
    q = torch.randn(4, 4, 32, 576, generator=g).bfloat16()
    ids = torch.randint(0, 99, (4, 4, 128), generator=g, dtype=torch.int32)
    layouts = {"contiguous": (q, ids), "transposed": (q.transpose(0, 1), ids.transpose(0, 1)),
               "padded": (q[:, :, :16], ids[:, :, :64]), "every other request": (q[::2], ids[::2])}
    for name, (q_all, ids_all) in layouts.items():
        q_view, ids_view = q_all[:requests, :positions], ids_all[:requests, :positions]
        views = []
        for t in (q_view, ids_view):
            try:
                views.append(t.view(-1, *t.shape[2:]))
            except RuntimeError:
                views.append(None)
        q_nope, q_pe = q_view[..., :512], q_view[..., 512:]
        positions_seen, nope_strides, pe_strides, id_strides = hopper_mla._token_layout(q_nope, q_pe, ids_view)
        if None in views:
            assert hopper_mla.strided_requests(q_nope, q_pe, ids_view), name
            assert (positions_seen, nope_strides, id_strides) == (positions, q_nope.stride()[:3], ids_view.stride()[:2])
        else:
            assert not hopper_mla.strided_requests(q_nope, q_pe, ids_view), name
            assert (positions_seen, nope_strides, id_strides) == (
                1, (views[0].stride(0), 0, views[0].stride(1)), (views[1].stride(0), 0)), name
        assert pe_strides[2] == q_pe.stride(2)


def test_valid_cpu_inputs_pass_every_check_then_need_a_gpu():
    for suffix in SERVED:
        definition = definition_name(128, 192, suffix)
        inputs = case_inputs(definition, 2, 40, "cpu", pattern="scattered", valid=(0, 100))
        outputs = poisoned_outputs(definition, inputs)
        assert hopper_mla.check_inputs(inputs["q_nope"], inputs["q_pe"], inputs["sparse_indices"],
                                       outputs["output"], outputs["lse"], inputs.get("ckv_cache"),
                                       inputs.get("kpe_cache"), inputs.get("kv_cache"), None, None) == (
            2, 128, 192, "fp8kv" in suffix)
        named = {**inputs, **outputs}
        with pytest.raises(KernelError, match="needs CUDA tensors"):
            hopper_mla.sparse_mla_attention(**{name: named[name] for name in get(definition).signature})
        assert bool(outputs["output"].isnan().all())  # refused before anything was written


def test_any_gpu_but_sm90_is_refused(monkeypatch):
    for capability in ((8, 0), (8, 9), (10, 0), (10, 3), (12, 0)):
        monkeypatch.setattr(hopper_mla, "_device_capability", lambda device, c=capability: c)
        expected = rf"compute capability 9\.0 .*this GPU is {capability[0]}\.{capability[1]}"
        with pytest.raises(KernelError, match=expected):
            hopper_mla.check_arch(torch.device("cuda", 0))
    monkeypatch.setattr(hopper_mla, "_device_capability", lambda device: (9, 0))
    hopper_mla.check_arch(torch.device("cuda", 0))


def test_split_choice_fills_the_gpu_without_splitting_full_grids():
    sms = 132
    for heads in hopper_mla.HEADS:
        groups_per_token = hopper_mla.groups(heads)
        for num_tokens in (1, 2, 3, 4, 6, 8):  # small batches: one wave of CTAs over a third of the SMs or more
            splits = hopper_mla.num_splits_for(num_tokens, heads, 2048, sms)
            ctas = num_tokens * groups_per_token * splits
            most = num_tokens * groups_per_token * (2048 // hopper_mla.BLOCK_TOKENS)  # a CTA per 64-token block
            assert min(sms // 3, most) <= ctas <= sms and 1 <= splits <= hopper_mla.MAX_SPLITS
        for num_tokens in (132, 256, 1024):  # the grid is full without splitting: no combine
            assert hopper_mla.num_splits_for(num_tokens, heads, 2048, sms) == 1
    assert hopper_mla.num_splits_for(1, 128, 2048, sms) == 32
    assert hopper_mla.num_splits_for(8, 128, 2048, sms) == 8
    # Rows up to 16384 ids: within the kernel's split limit (the Triton kernel's share of a row does not
    # bound it), and a full grid stays unsplit.
    for topk in (4096, 16384):
        assert hopper_mla.num_splits_for(1, 64, topk, sms) == hopper_mla.MAX_SPLITS
        assert hopper_mla.num_splits_for(592, 128, topk, sms) == 1
    # Where the partials' cost decides (PARTIAL_TILES): 64 CTAs of 2 blocks, not 128 of one (H200: 14.2
    # against 17.1 us at h128 T=2, 14.1 against 17.1 at h64 T=4).
    assert hopper_mla.num_splits_for(2, 128, 2048, sms) == 16
    assert hopper_mla.num_splits_for(4, 64, 2048, sms) == 16
    assert hopper_mla.num_splits_for(1, 64, 64, sms) == 1  # one block: nothing to split


def test_a_grid_past_whole_waves_runs_as_a_head_of_whole_waves_and_a_split_tail():
    sms = 132
    for heads in hopper_mla.HEADS:
        per_wave = sms // hopper_mla.groups(heads)  # tokens whose rows fill a wave
        for topk in (2048, 16384):
            for num_tokens in range(1, (hopper_mla.PLAN_MAX_WAVES + 2) * per_wave + 1):
                for unit in (1, 2, 3):
                    if num_tokens % unit:
                        continue
                    plan = hopper_mla.plan_for(num_tokens, heads, topk, sms, unit)
                    assert sum(tokens for tokens, _ in plan) == num_tokens
                    assert all(tokens % unit == 0 and 1 <= splits <= hopper_mla.MAX_SPLITS for tokens, splits in plan)
                    if len(plan) == 2:  # a head of whole waves (less what the cut between requests leaves off)
                        (head, _), (tail, tail_splits) = plan
                        assert head == num_tokens // per_wave * per_wave // unit * unit and tail_splits > 1
                        assert num_tokens <= hopper_mla.PLAN_MAX_WAVES * per_wave  # the grids measured
                    else:
                        assert plan == ((num_tokens, hopper_mla.num_splits_for(num_tokens, heads, topk, sms)),)
    # FlashMLA's batch-74 decode case (2 tokens a request): 2 waves of one split, and 16 tokens in 4 splits
    # (128 CTAs) instead of 592 CTAs of 2 splits (4.5 waves); a call of whole waves stays one launch.
    assert hopper_mla.plan_for(148, 128, 2048, sms, 2) == ((132, 1), (16, 4))
    assert hopper_mla.plan_for(148, 64, 2048, sms, 2) == ((132, 1), (16, 8))
    assert hopper_mla.plan_for(264, 128, 2048, sms, 2) == ((264, 1),)
    assert hopper_mla.plan_for(256, 128, 2048, sms, 2) == ((256, 1),)  # 3.9 waves: a tail of 58 would fill one
    assert hopper_mla.plan_for(8, 128, 2048, sms) == ((8, 8),)  # less than a wave: splits alone


def test_entries_take_the_served_definitions_signatures():
    for suffix in SERVED:
        entry = getattr(hopper_mla, "sparse_attention" + suffix)
        for heads in hopper_mla.HEADS:
            assert list(inspect.signature(entry).parameters) == get(definition_name(heads, 2048, suffix)).signature


# The model of the kernel's numerics (kernels/attention/hopper_model.py), its splits merged by the shipped
# combine: what the choices the kernel makes (fp16 mmas, scaled fp16 partials, power-of-two shifts) buy,
# shown against the choice not taken on inputs that tell them apart.

@pytest.mark.parametrize("splits, suffix", [(2, "_fp8kv"), (3, "_fp8kv_lsee"), (8, "_fp8kv")])
def test_model_partials_keep_the_tolerance_where_splits_cancel(splits, suffix):
    """Why the kernel's split partials are scaled fp16: on rows of 2 or 3 valid tokens each split holds
    one token, and splits of opposite sign cancel in the merge. The kernel's numerics with its partials,
    merged by the combine, pass the contest tolerance there; rounded to bf16 (2^-9 of each value) they do not."""
    definition = definition_name(16, 128, suffix)
    inputs = case_inputs(definition, 8, 16, "cpu", seed=3, pattern="tail", valid=(3, 2) * 4)
    lse_base_e = suffix.endswith("_lsee")
    verdict = check(get(definition), inputs, hopper_model.attention(inputs, lse_base_e, splits))
    assert verdict.passed, verdict.problems
    acc, m, l = hopper_model.split_partials(inputs, splits)
    rounded = hopper_model.combine(acc.bfloat16().float(), m, l, lse_base_e, scaled=False)
    assert not check(get(definition), inputs, rounded).passed


def test_model_partial_keeps_eleven_bits_of_any_range():
    """The scaled fp16 partial: within 2^-11 of each value's half-row maximum at any magnitude (past
    fp16's 65504 and far below its smallest normal), and exactly 0 for an all-zero half row."""
    gen = torch.Generator().manual_seed(5)
    for magnitude in (2.0**-60, 1e-3, 1.0, 7e4, 2.0**100):
        acc = torch.randn(4, 512, generator=gen, dtype=torch.float64).float() * magnitude
        acc[1, 256:] = 0.0
        values, factors = hopper_model.scale_partial(acc)
        assert values.dtype == torch.float16 and factors.shape == (4, 2)
        got = (values.float().unflatten(-1, (2, 256)) * factors[..., None]).flatten(-2)
        bound = acc.unflatten(-1, (2, 256)).abs().amax(-1, keepdim=True).expand(-1, -1, 256).flatten(-2)
        assert bool(((got - acc).abs() <= bound * 2.0**-11).all()) and bool(torch.isfinite(got).all())
        assert bool((got[1, 256:] == 0).all())


UP = 2.0**17  # scales q and the FP8 tokens past fp16's 65504


def _scaled_past_fp16(base: dict, scaled: str) -> tuple[dict, float]:
    """(inputs, output factor): `base` with values past fp16's range and sm_scale scaled to keep the
    logits. "q": every other head's q times 2^17, the others' times 2^9 (below 2^16), sm_scale / 2^17,
    so rows with and without a shift share a CTA (output factor 1: checked as they are). "kv": every
    token's ckv and rope values times 2^17 (tokens of different exponents, so different shifts),
    sm_scale / 2^17: the logits unchanged and the output 2^17 times base's (fp16 cannot hold it);
    "both": also every head's q times 2^17, sm_scale / 2^34."""
    inputs = dict(base)
    if scaled == "q":
        heads = base["q_nope"].shape[1]
        rows = torch.full((heads, 1), UP, device=base["q_nope"].device)
        rows[::2] = 2.0**9
        inputs["q_nope"] = (base["q_nope"].float() * rows).bfloat16()
        inputs["q_pe"] = (base["q_pe"].float() * rows).bfloat16()
        inputs["sm_scale"] = base["sm_scale"] / UP
        return inputs, 1.0
    ckv, kpe = fp8.dequantize_mla_kv(base["kv_cache"])
    inputs["kv_cache"] = fp8.quantize_mla_kv(ckv * UP, kpe * UP)
    inputs["sm_scale"] = base["sm_scale"] / UP
    if scaled == "both":
        inputs["q_nope"] = (base["q_nope"].float() * UP).bfloat16()
        inputs["q_pe"] = (base["q_pe"].float() * UP).bfloat16()
        inputs["sm_scale"] /= UP
    return inputs, UP


def _past_fp16_verdict(definition: str, base: dict, inputs: dict, factor: float, outputs: dict):
    """outputs on (inputs, factor) = _scaled_past_fp16(base, ...) against the reference, scaled back (exact)
    where the output was scaled, so the tolerance keeps its meaning."""
    if factor == 1.0:
        return check(get(definition), inputs, outputs)
    return check(get(definition), base, {"output": (outputs["output"].float() / factor).bfloat16(),
                                         "lse": outputs["lse"]})


def _check_past_fp16(definition: str, base: dict, inputs: dict, factor: float, outputs: dict) -> None:
    verdict = _past_fp16_verdict(definition, base, inputs, factor, outputs)
    assert verdict.passed, "\n".join(verdict.problems)


@pytest.mark.parametrize("scaled", ["q", "kv", "both"])
def test_model_fp8_values_past_the_fp16_range_need_the_kernels_shifts(scaled):
    """The kernel's power-of-two shifts (hopper_mla.cu, top) keep q and tokens past 65504 exact: the model
    of its numerics passes the contest tolerance with them; without them fp16 overflows."""
    definition = definition_name(64, 512, "_fp8kv")
    base = case_inputs(definition, 3, 64, "cpu", seed=5, pattern="scattered", valid=(512, 7, 300))
    inputs, factor = _scaled_past_fp16(base, scaled)
    _check_past_fp16(definition, base, inputs, factor, hopper_model.attention(inputs, False))
    with pytest.raises(AssertionError):
        _check_past_fp16(definition, base, inputs, factor, hopper_model.attention(inputs, False, shifts=False))


@pytest.mark.parametrize("suffix", ["_fp8kv", "_fp8kv_lsee"])
def test_model_fp8_path_needs_fp16_mmas_not_bf16(suffix):
    """Why the FP8 path multiplies in fp16 (hopper_mla.cu): dequantized values rounded to bf16
    fail the contest tolerance on these inputs (rows of 1 to 3 valid tokens show it), fp16 passes."""
    definition = definition_name(128, 2048, suffix)
    inputs = case_inputs(definition, 8, 256, "cpu", seed=3, pattern="scattered",
                         valid=(2048, 1, 2, 3, 700, 0, 64, 1500))
    lse_e = suffix.endswith("_lsee")
    assert check(get(definition), inputs, hopper_model.attention(inputs, lse_e)).passed
    assert not check(get(definition), inputs, hopper_model.attention(inputs, lse_e, mma_dtype=torch.bfloat16)).passed


# ------------------------------------------------------------------ GPU (sm_90 only)

@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("num_tokens", [1, 2, 8, 64])
@pytest.mark.parametrize("suffix", SERVED)
def test_gpu_matches_reference(heads, num_tokens, suffix):
    definition = definition_name(heads, 2048, suffix)
    valid = tuple((2048, 1, 700, 2047, 0, 64, 1500, 63)[i % 8] for i in range(num_tokens))
    inputs = case_inputs(definition, num_tokens, 256, "cuda", seed=heads + num_tokens, pattern="scattered", valid=valid)
    outputs = _call(definition, inputs)
    assert_matches_reference(definition, inputs, outputs)
    empty = [t for t, n in enumerate(valid) if n == 0]
    assert bool((outputs["output"][empty] == 0).all()) and bool((outputs["lse"][empty] == float("-inf")).all())


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("fp8kv", [False, True])
@pytest.mark.parametrize("num_splits, in_cluster", [(1, False), (2, True), (3, False), (None, None)])
def test_gpu_flashmla_conventions_on_every_path_that_finishes_a_row(heads, fp8kv, num_splits, in_cluster):
    """Sinks (finite, +inf, -inf), row lengths from 0 to topk a request of 2 tokens ([B, S] views),
    max_logits and +inf for empty rows, finished by one split, the cluster merge and the combine: output
    and lse as the reference, max_logits as the Triton kernel's, empty rows 0, +inf and -inf."""
    suffix = "_fp8kv_lsee_topklen_sink" if fp8kv else "_lsee_topklen_sink"
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, 8, 256, "cuda", seed=heads, pattern="scattered",
                         valid=(2048, 2048, 700, 700, 0, 0, 2048, 2048))
    lengths = torch.tensor([2048, 0, 1500, 63], dtype=torch.int32, device="cuda")
    inputs["topk_length"] = lengths.repeat_interleave(2)  # the reference's: one a token
    sink = inputs["attn_sink"]
    sink[::4], sink[1::4] = float("inf"), float("-inf")
    d = get(definition)
    outputs = poisoned_outputs(definition, inputs)
    max_logits = torch.full_like(outputs["lse"], float("nan"))
    requests = {name: inputs[name].view(4, 2, *inputs[name].shape[1:]) for name in ("q_nope", "q_pe", "sparse_indices")}
    named = {**inputs, **outputs, **requests, "topk_length": lengths}
    hopper_mla.sparse_mla_attention(**{name: named[name] for name in d.signature}, lse_base_e=True,
                                    max_logits=max_logits, empty_lse=float("inf"), num_splits=num_splits,
                                    reduce_in_cluster=in_cluster)
    empty = outputs["lse"] == float("inf")
    read = torch.arange(2048, device="cuda")[None, :] < inputs["topk_length"][:, None]
    no_valid_id = ~((inputs["sparse_indices"] >= 0) & read).any(1)
    assert bool(no_valid_id[2:4].all()) and torch.equal(empty, no_valid_id[:, None].expand_as(empty))
    assert bool((outputs["output"][2:4] == 0).all()) and bool((max_logits[2:4] == float("-inf")).all())
    reference = {**outputs, "lse": torch.where(empty, float("-inf"), outputs["lse"])}
    assert_matches_reference(definition, inputs, reference)
    triton_max = torch.full_like(max_logits, float("nan"))
    tsm.sparse_mla_attention(**{name: named[name] for name in d.signature}, lse_base_e=True,
                             max_logits=triton_max, empty_lse=float("inf"))
    torch.testing.assert_close(max_logits, triton_max, atol=1e-2, rtol=1e-3)


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("fp8kv", [False, True])
def test_gpu_a_call_cut_into_a_head_and_a_tail_is_exact(heads, fp8kv):
    """A call of whole waves and a few tokens more in requests of 2 tokens (FlashMLA's batch-74 decode case on
    132 SMs), a topk_length a request and the sink: two launches (plan_for), the tail's splits combined, output
    and lse as the reference and max_logits as one launch's."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    num_tokens = sms // 2 * 2 + 16
    plan = hopper_mla.plan_for(num_tokens, heads, 2048, sms, 2)
    assert len(plan) == 2 and plan[1][1] > 1, plan
    suffix = "_fp8kv_lsee_topklen_sink" if fp8kv else "_lsee_topklen_sink"
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, num_tokens, 4096, "cuda", seed=heads + fp8kv, pattern="scattered")
    lengths = torch.randint(0, 2049, (num_tokens // 2,), dtype=torch.int32, device="cuda",
                            generator=torch.Generator("cuda").manual_seed(7))
    inputs["topk_length"] = lengths.repeat_interleave(2)  # the reference's: one a token
    d = get(definition)
    requests = {name: inputs[name].view(num_tokens // 2, 2, *inputs[name].shape[1:])
                for name in ("q_nope", "q_pe", "sparse_indices")}
    results = []
    for num_splits in (None, 1):
        outputs = poisoned_outputs(definition, inputs)
        max_logits = torch.full_like(outputs["lse"], float("nan"))
        named = {**inputs, **outputs, **requests, "topk_length": lengths}
        hopper_mla.sparse_mla_attention(**{name: named[name] for name in d.signature}, lse_base_e=True,
                                        max_logits=max_logits, num_splits=num_splits)
        results.append((outputs, max_logits))
    (planned, planned_max), (_, one_launch_max) = results
    assert_matches_reference(definition, inputs, planned)
    torch.testing.assert_close(planned_max, one_launch_max, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("suffix", ["", "_fp8kv_lsee"])
@pytest.mark.parametrize("factor", [-1.0, 0.0, -0.0])
def test_gpu_negative_and_zero_sm_scale(heads, suffix, factor):
    """The kernel scales each block's raw maximum, so the launcher must turn a negative sm_scale into
    a sign flip of q and 0 into a scale that keeps masked logits at -inf: softmax reversed, uniform."""
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=heads, pattern="scattered", valid=(2048, 5, 0, 1000))
    inputs["sm_scale"] = factor * inputs["sm_scale"]
    for num_splits in (None, 1, 2):
        outputs = _call(definition, inputs, num_splits)
        assert_matches_reference(definition, inputs, outputs)
        assert bool((outputs["lse"][2] == float("-inf")).all())


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("suffix, staged", [("", None), ("_fp8kv", False), ("_fp8kv", True)])
@pytest.mark.parametrize("num_splits", [None, 1, 2, 3])
def test_gpu_ids_outside_the_cache_are_masked_and_counted(heads, suffix, staged, num_splits):
    from test_attention import check_out_of_range_ids
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 64, "cuda", seed=heads, pattern="scattered")
    d = get(definition)

    def launcher(*args, **kwargs):
        hopper_mla.sparse_mla_attention(**dict(zip(d.signature, args)), num_splits=num_splits, staged=staged, **kwargs)

    check_out_of_range_ids(definition, inputs, launcher,
                           (hopper_mla.bad_index_count, hopper_mla.reset_bad_index_count))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("pattern", ["empty", "duplicates", "tail", "full"])
@pytest.mark.parametrize("suffix", ["", "_fp8kv_lsee"])
def test_gpu_index_patterns(pattern, suffix):
    definition = definition_name(128, 2048, suffix)
    params = {"pattern": pattern, **({"valid": (3, 2048, 65)} if pattern == "tail" else {})}
    inputs = case_inputs(definition, 3, 256, "cuda", seed=len(pattern), **params)
    for num_splits in (None, 1):
        outputs = _call(definition, inputs, num_splits)
        assert_matches_reference(definition, inputs, outputs)
        if pattern == "empty":
            assert bool((outputs["output"] == 0).all()) and bool((outputs["lse"] == float("-inf")).all())


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("num_splits", [1, 2, 7, 31, 32])
@pytest.mark.parametrize("suffix", ["_lsee", "_fp8kv"])
def test_gpu_any_split_count_is_exact(heads, num_splits, suffix):
    """FP8 at 128 heads runs in 2-CTA clusters from 2 blocks a CTA: 31 splits leave 66-67 tokens a
    split (a second block of 2-3 valid tokens, clustered), 32 splits (the most) one block (alone). Every
    split count but 2 writes fp16 partials with a power of two per half row through shared memory; 2
    splits merge in a cluster (but FP8 at 128 heads, combined)."""
    definition = definition_name(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=num_splits, pattern="scattered", valid=(2048, 5, 0, 1000))
    assert_matches_reference(definition, inputs, _call(definition, inputs, num_splits))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("pattern", ["scattered", "duplicates", "tail", "empty"])
@pytest.mark.parametrize("suffix", ["_fp8kv", "_fp8kv_lsee"])
def test_gpu_fp8_rows_gathered_with_the_l2_prefetch_are_exact(heads, pattern, suffix):
    """One split of a 2048-token row at 32 or 64 heads with FP8 KV takes the producer that also asks the L2
    for the tokens a block ahead: its second index stream stops where the row's ids stop."""
    definition = definition_name(heads, 2048, suffix)
    params = {"pattern": pattern, **({"valid": (2048, 1, 65, 2047, 0, 1000)} if pattern == "tail" else {})}
    inputs = case_inputs(definition, 6, 128, "cuda", seed=heads + len(pattern), **params)
    assert_matches_reference(definition, inputs, _call(definition, inputs, 1))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("suffix", ["_lsee", "_fp8kv"])
def test_gpu_splits_merged_in_a_cluster_are_exact(heads, suffix):
    """The cluster merge against the reference, rows full, nearly empty, empty and partial, and against
    the combine kernel's merge of the same splits: the cluster merges fp32 partials, the combine fp16
    ones (2^-11 of a half row's largest value), so their bf16 outputs may round one unit apart. FP8 at
    128 heads then runs without the head-group cluster."""
    definition = definition_name(heads, 2048, suffix)
    splits = hopper_mla.CLUSTER_SPLITS
    inputs = case_inputs(definition, 4, 128, "cuda", seed=heads, pattern="scattered", valid=(2048, 5, 0, 1000))
    merged = _call(definition, inputs, splits, reduce_in_cluster=True)
    assert_matches_reference(definition, inputs, merged)
    assert bool((merged["output"][2] == 0).all()) and bool((merged["lse"][2] == float("-inf")).all())
    combined = _call(definition, inputs, splits, reduce_in_cluster=False)
    torch.testing.assert_close(merged["output"].float(), combined["output"].float(), atol=1e-2, rtol=2**-7)
    torch.testing.assert_close(merged["lse"], combined["lse"], atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("topk", [64, 192, 576])
@pytest.mark.parametrize("suffix", ["", "_fp8kv"])
def test_gpu_cluster_merge_of_short_splits(topk, suffix):
    """Two splits of half a block (topk 64), of one block and a half (192 / 2 = 96) and of four blocks
    and a half (576 / 2 = 288)."""
    definition = definition_name(64, topk, suffix)
    inputs = case_inputs(definition, 3, 64, "cuda", seed=topk, pattern="scattered", valid=(topk, topk // 2, 1))
    outputs = _call(definition, inputs, hopper_mla.CLUSTER_SPLITS, reduce_in_cluster=True)
    assert_matches_reference(definition, inputs, outputs)


def test_two_splits_merge_in_a_cluster_unless_fp8_head_groups_share_their_gather():
    assert hopper_mla.merges_in_cluster(2, 64, False) and hopper_mla.merges_in_cluster(2, 128, False)
    assert hopper_mla.merges_in_cluster(2, 64, True) and not hopper_mla.merges_in_cluster(2, 128, True)
    assert not any(hopper_mla.merges_in_cluster(splits, 64, False) for splits in (1, 3, 4, 16, 32))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("topk", [64, 576, 1536])
@pytest.mark.parametrize("suffix", ["", "_fp8kv"])
def test_gpu_other_topk_sizes(topk, suffix):
    definition = definition_name(128, topk, suffix)
    inputs = case_inputs(definition, 3, 64, "cuda", seed=topk, pattern="scattered", valid=(topk, topk // 2, 1))
    assert_matches_reference(definition, inputs, _call(definition, inputs))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("page_size", [2, 64, 256])
@pytest.mark.parametrize("heads", [32, 64, 128])
@pytest.mark.parametrize("suffix", ["_lsee_topklen_sink", "_fp8kv", "_fp8kv_lsee_topklen_sink"])
def test_gpu_padded_pages_of_a_power_of_two(page_size, heads, suffix):
    """Pages padded by a poisoned row, as FlashMLA's tests allocate blocks: ids reach their rows through the
    page map on every producer (bf16 rows, FP8 with and without the L2 prefetch, the 128-head cluster)."""
    definition = f"dsa_sparse_attention_h{heads}_ckv512_kpe64_topk2048_ps{page_size}{suffix}"
    inputs = case_inputs(definition, 3, 8192 // page_size, "cuda", seed=page_size, pattern="scattered",
                         valid=(2048, 700, 0), padded_pages=True)
    caches = [inputs.get(name) for name in ("ckv_cache", "kpe_cache", "kv_cache")]
    assert hopper_mla.page_map(*caches) == (page_size.bit_length() - 1, page_size + 1)
    for num_splits in (None, 1, 3):
        assert_matches_reference(definition, inputs, _call(definition, inputs, num_splits))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("fp8kv", [False, True])
def test_gpu_requests_that_do_not_view_as_tokens_run_through_their_strides(heads, fp8kv):
    """FlashMLA's tests' layout: q and ids padded in every dimension ([B, S] does not flatten), pages of 64
    tokens 65 rows apart, one topk_length a request, a sink and max_logits; as the reference reads the same
    tokens in id order."""
    g = torch.Generator(device="cuda").manual_seed(heads + fp8kv)
    pages, page_tokens, requests, s_q, topk = 40, 64, 5, 3, 512
    definition = definition_name(heads, topk, "_fp8kv" if fp8kv else "")
    if fp8kv:
        rows = case_inputs(definition, 1, pages + 1, "cuda", seed=3)["kv_cache"].reshape(-1, 656)
        padded = rows[:pages * (page_tokens + 1)].reshape(pages, page_tokens + 1, 656)
        caches = {"kv_cache": padded[:, :page_tokens]}
    else:
        padded = torch.randn(pages, page_tokens + 1, 576, generator=g, device="cuda").bfloat16()
        caches = {"ckv_cache": padded[:, :page_tokens, :512], "kpe_cache": padded[:, :page_tokens, 512:]}
    q = torch.randn(requests + 1, s_q + 1, heads + 1, 704, generator=g, device="cuda").bfloat16()[:requests, :s_q, :heads, :576]
    ids = torch.randint(-1, pages * page_tokens, (requests + 1, s_q + 1, topk + 128), generator=g, device="cuda",
                        dtype=torch.int32)[:requests, :s_q, :topk]
    lengths = torch.tensor([topk, 17, 0, 300, 64], dtype=torch.int32, device="cuda")
    sink = torch.tensor([0.5, float("inf"), float("-inf"), -1.0] * (heads // 4), device="cuda")
    tokens = requests * s_q
    output = torch.full((tokens, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse, max_logits = (torch.full((tokens, heads), float("nan"), device="cuda") for _ in range(2))
    assert hopper_mla.strided_requests(q[..., :512], q[..., 512:], ids)
    assert hopper_mla.fits(q[..., :512], q[..., 512:], ids, output, **caches)
    hopper_mla.sparse_mla_attention(q[..., :512], q[..., 512:], ids, 0.1, output, lse, **caches, topk_length=lengths,
                                    attn_sink=sink, max_logits=max_logits, lse_base_e=True, empty_lse=float("inf"))
    flat = {name: c.reshape(-1, c.shape[-1]).unsqueeze(1) for name, c in caches.items()}  # the tokens in id order
    want_out, want_lse = attention_reference(q[..., :512].reshape(-1, heads, 512), q[..., 512:].reshape(-1, heads, 64),
                                             ids.reshape(-1, topk), 0.1, **flat,
                                             topk_length=lengths.repeat_interleave(s_q), lse_base=math.e)
    want_lse = torch.where(want_lse == float("-inf"), float("inf"), want_lse)
    keep = 1 / (1 + torch.exp(sink[None, :] - want_lse))  # the sink scales the output, never the lse
    want_out = torch.where(want_lse[..., None] == float("inf"), 0.0, want_out.float() * keep[..., None])
    assert torch.allclose(output.float(), want_out, atol=2e-2, rtol=2e-2)
    assert torch.allclose(lse, want_lse, atol=1e-3, rtol=1e-3)
    triton_max = torch.full_like(max_logits, float("nan"))  # the Triton kernel's, held to the reference elsewhere
    tsm.sparse_mla_attention(q[..., :512], q[..., 512:], ids, 0.1, torch.empty_like(output), torch.empty_like(lse),
                             **caches, topk_length=lengths, attn_sink=sink, max_logits=triton_max, lse_base_e=True)
    assert torch.equal(max_logits.isinf(), triton_max.isinf()) and bool((max_logits == float("-inf")).any())
    assert torch.allclose(max_logits, triton_max, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@on_sm90
def test_gpu_strided_views_of_one_576_wide_tensor():
    """q_nope/q_pe and ckv/kpe as slices of one [.., 576] tensor, as MLA stores them."""
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(2, 64, 576, generator=g, device="cuda").bfloat16()
    cache = torch.randn(8, 64, 576, generator=g, device="cuda").bfloat16()
    idx = torch.randperm(512, generator=g, device="cuda")[:256].int().repeat(2, 1)
    idx[1, ::3] = -1
    inputs = {"q_nope": q[..., :512], "q_pe": q[..., 512:], "ckv_cache": cache[..., :512],
              "kpe_cache": cache[..., 512:], "sparse_indices": idx, "sm_scale": 0.1352337788608801}
    definition = definition_name(64, 256)
    for num_splits in (1, 3):
        assert_matches_reference(definition, inputs, _call(definition, inputs, num_splits))


@pytest.mark.gpu
@on_sm90
def test_gpu_repeated_calls_are_bitwise_identical():
    """A race between the warpgroups (ring, P exchange, row maxima) would move the result."""
    definition = definition_name(128, 2048, "_fp8kv")
    inputs = case_inputs(definition, 8, 512, "cuda", seed=9, pattern="scattered", valid=(2048, 1000, 1, 0) * 2)
    for num_splits in (None, 1):
        assert_repeatable(lambda: _call(definition, inputs, num_splits), definition, inputs, 50)


@pytest.mark.gpu
@on_sm90
def test_gpu_fp8_scales_below_the_fp16_range_stay_exact():
    """Tokens whose ckv was quantized from tiny values (scales below fp16's smallest normal, 2^-14)
    beside ordinary ones: the scale multiply runs in fp32, only the product is rounded to fp16."""
    g = torch.Generator(device="cuda").manual_seed(11)
    ckv = torch.randn(4096, 512, generator=g, device="cuda")
    ckv[::2] *= 1e-3  # absmax ~4e-3: scale ~1e-5 (< 2^-14)
    kpe = torch.randn(4096, 64, generator=g, device="cuda").bfloat16()
    kv_cache = fp8.quantize_mla_kv(ckv, kpe).view(64, 64, fp8.MLA_TOKEN_BYTES)
    scales = kv_cache.view(-1, fp8.MLA_TOKEN_BYTES)[:, fp8.MLA_SCALE_OFFSET:fp8.MLA_KPE_OFFSET].contiguous()
    scales = scales.view(torch.float32)
    assert bool((scales[::2] < 2.0**-14).all()) and bool((scales[1::2] > 2.0**-14).all())
    definition = definition_name(64, 512, "_fp8kv")
    inputs = case_inputs(definition, 3, 64, "cuda", seed=11, pattern="scattered", valid=(512, 7, 300))
    inputs["kv_cache"] = kv_cache
    for num_splits in (1, 4):
        assert_matches_reference(definition, inputs, _call(definition, inputs, num_splits))


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("scaled", ["q", "kv", "both"])
def test_gpu_fp8_values_past_the_fp16_range_stay_exact(heads, scaled):
    """q and FP8 tokens past fp16's range (_scaled_past_fp16), one split (8 blocks a CTA; at 128 heads in
    2-CTA clusters) and 4."""
    definition = definition_name(heads, 512, "_fp8kv")
    base = case_inputs(definition, 3, 64, "cuda", seed=heads, pattern="scattered", valid=(512, 7, 300))
    inputs, factor = _scaled_past_fp16(base, scaled)
    for num_splits in (1, 4):
        outputs = _call(definition, inputs, num_splits)
        assert bool(outputs["output"].isfinite().all())
        _check_past_fp16(definition, base, inputs, factor, outputs)


def test_dispatch_reads_the_facts_of_a_call_from_its_tensors(monkeypatch):
    """solution.implementation_for: off a GPU every call is the Triton kernel's; on one, the Hopper
    kernel's limits decide with the heads and variant (fits: an unaligned view is the Triton kernel's)."""
    from dsactl.kernels.attention import solution

    def named(heads: int, suffix: str = "") -> dict:
        definition = definition_name(heads, 128, suffix)
        inputs = case_inputs(definition, 2, 8, "cpu", pattern="scattered", valid=(100, 3))
        return {k: v for k, v in {**inputs, **poisoned_outputs(definition, inputs)}.items() if k != "sm_scale"}

    assert {solution.implementation_for(**named(h)) for h in (16, 32, 64, 128)} == {dispatch.TRITON}
    call = named(64)
    assert hopper_mla.fits(call["q_nope"], call["q_pe"], call["sparse_indices"], call["output"],
                           call["ckv_cache"], call["kpe_cache"])
    q = torch.randn(2, 64, 513).bfloat16()[..., 1:]
    assert not hopper_mla.fits(q, call["q_pe"], call["sparse_indices"], call["output"],
                               call["ckv_cache"], call["kpe_cache"])
    # Requests ([B, S, ...]) that view as tokens run as tokens; interleaved ones through their own strides.
    ids = call["sparse_indices"]
    caches = (call["ckv_cache"], call["kpe_cache"])
    q = torch.randn(2, 2, 64, 576).bfloat16()
    requests = (q[..., :512], q[..., 512:], ids.repeat(2, 1).view(2, 2, -1))
    assert hopper_mla.fits(*requests, call["output"], *caches) and not hopper_mla.strided_requests(*requests)
    q = q.transpose(0, 1)
    requests = (q[..., :512], q[..., 512:], ids.repeat(2, 1).view(2, 2, -1))
    assert hopper_mla.fits(*requests, call["output"], *caches) and hopper_mla.strided_requests(*requests)
    assert not hopper_mla.fits(q[..., :512], q[..., 512:], ids.repeat(2, 1).view(2, 2, 1, -1), call["output"], *caches)
    assert solution.implementation_for(**call, implementation="hopper") == dispatch.HOPPER
    monkeypatch.setenv(dispatch.ATTENTION_KERNEL_ENV, "hopper")
    assert solution.implementation_for(**call) == dispatch.HOPPER


def test_dispatch_is_a_pure_function_of_the_call():
    served = dict(fp8kv=False, num_tokens=8, fits={dispatch.HOPPER})
    assert dispatch.implementation_for(64, (9, 0), **served) == dispatch.HOPPER
    assert dispatch.implementation_for(128, (9, 0), **served, requested="triton") == dispatch.TRITON
    # Under 64 heads, from HOPPER_MIN_TOKENS per (heads, FP8 KV) up to HOPPER_MAX_TOKENS; 16 heads bf16 never.
    assert dispatch.implementation_for(16, (9, 0), **served) == dispatch.TRITON
    assert dispatch.implementation_for(16, (9, 0), **{**served, "num_tokens": 512}) == dispatch.TRITON
    assert dispatch.implementation_for(32, (9, 0), **{**served, "num_tokens": 1}) == dispatch.TRITON
    assert dispatch.implementation_for(32, (9, 0), **{**served, "num_tokens": 4}) == dispatch.HOPPER
    assert dispatch.implementation_for(32, (9, 0), **{**served, "fp8kv": True, "num_tokens": 3}) == dispatch.TRITON
    assert dispatch.implementation_for(32, (9, 0), **{**served, "fp8kv": True}) == dispatch.HOPPER
    assert dispatch.implementation_for(16, (9, 0), **{**served, "fp8kv": True, "num_tokens": 16}) == dispatch.HOPPER
    assert dispatch.implementation_for(16, (9, 0), **{**served, "fp8kv": True, "num_tokens": 33}) == dispatch.TRITON
    for heads in dispatch.HOPPER_HEADS:
        for fp8kv in (False, True):
            least = dispatch.HOPPER_MIN_TOKENS.get((heads, fp8kv))
            if least is not None:
                # Past the most tokens of a pair without its own, the kernel's limit (fits) decides.
                most = dispatch.HOPPER_MAX_TOKENS.get((heads, fp8kv), hopper_mla.MAX_TOKENS)
                past = (most + 1,) if (heads, fp8kv) in dispatch.HOPPER_MAX_TOKENS else ()
                for num_tokens in (least - 1, least, most, *past):
                    got = dispatch.implementation_for(heads, (9, 0), **{**served, "fp8kv": fp8kv,
                                                                        "num_tokens": num_tokens})
                    assert (got == dispatch.HOPPER) == (least <= num_tokens <= most), (heads, fp8kv, num_tokens)
    assert dispatch.implementation_for(64, None, **served) == dispatch.TRITON
    assert dispatch.implementation_for(64, (9, 0), **{**served, "fits": set()}) == dispatch.TRITON
    with pytest.raises(KernelError, match="unknown implementation 'cutlass'"):
        dispatch.implementation_for(64, (9, 0), **served, requested="cutlass")
    assert {row.implementation for row in dispatch.TABLE} == set(dispatch.IMPLEMENTATIONS)


def test_an_sm90_gpu_without_the_build_is_an_error_naming_the_build(monkeypatch):
    """No silent fallback: where the Hopper kernel serves the call, a missing library is an error that
    names the build to run and how to ask for the Triton kernel instead."""
    from dsactl.kernels.attention import solution
    from dsactl.kernels.errors import KernelBuildError

    def missing():
        raise KernelBuildError("no build of hopper_mla for sm90a: run `dsactl build --arch sm90a`")

    monkeypatch.setattr(solution, "implementation_for", lambda *args, **kwargs: dispatch.HOPPER)
    monkeypatch.setattr(hopper_mla, "library", missing)
    definition = definition_name(64, 128)
    inputs = case_inputs(definition, 2, 8, "cpu", pattern="scattered", valid=(100, 3))
    named = {**inputs, **poisoned_outputs(definition, inputs)}
    with pytest.raises(KernelBuildError, match=r"dsactl build --arch sm90a.*DSA_ATTENTION_KERNEL=triton"):
        solution.sparse_attention(**named)


# ------------------------------------------------------------------ FP8 staged as fp16 rows

@pytest.mark.parametrize("tokens, heads, cache_tokens, stages", [
    (256, 64, 65536, True), (4096, 128, 65536, True),  # measured wins
    (128, 128, 65536, False),  # 4 gathers a cached token
    (1024, 64, 524288, False), (4096, 128, 524288, False),  # a large cache: a loss, and wins within the noise
    (128, 128, 4096, False),  # decode-sized: too few tokens, whatever the cache
    (4096, 32, 65536, False), (4096, 16, 65536, False),  # unmeasured head counts
])
def test_fp8_calls_stage_their_cache_where_the_h200_measured_a_win(tokens, heads, cache_tokens, stages):
    assert hopper_mla.stages_cache(tokens, heads, 2048, cache_tokens) is stages


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", hopper_mla.HEADS)
@pytest.mark.parametrize("scaled", [None, "kv", "both"])
def test_gpu_staged_fp8_equals_the_fp8_path_bit_for_bit(heads, scaled):
    """Staging the cache as fp16 rows moves the conversion ahead of the kernel without changing a value:
    output and lse equal the FP8 path's bit for bit, tokens past fp16's range included, with one split and
    with the combine kernel's three."""
    definition = definition_name(heads, 2048, "_fp8kv")
    base = case_inputs(definition, 6, 128, "cuda", seed=heads, pattern="scattered", valid=(2048, 5, 0, 1000, 64, 2047))
    inputs, factor = _scaled_past_fp16(base, scaled) if scaled else (base, 1.0)
    for num_splits in (1, 3):
        direct = _call(definition, inputs, num_splits, staged=False, reduce_in_cluster=False)
        staged = _call(definition, inputs, num_splits, staged=True, reduce_in_cluster=False)
        assert torch.equal(staged["output"], direct["output"]) and torch.equal(staged["lse"], direct["lse"])
    _check_past_fp16(definition, base, inputs, factor, staged)


@pytest.mark.gpu
@on_sm90
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("pattern", ["duplicates", "empty", "tail"])
def test_gpu_staged_prefill_matches_the_reference(heads, pattern):
    """A prefill call (1024 tokens over a 4096-token cache) on staged rows matches the reference and repeats
    bit for bit, with every split choice."""
    definition = definition_name(heads, 2048, "_fp8kv_lsee")
    tail = {"valid": (3, 2048, 65, 0) * 256}  # a length for each of the 1024 rows
    params = {"pattern": pattern, **(tail if pattern == "tail" else {})}
    inputs = case_inputs(definition, 1024, 64, "cuda", seed=heads + len(pattern), **params)
    assert_repeatable(lambda: _call(definition, inputs, staged=True), definition, inputs, 2)
    for num_splits, in_cluster in ((2, True), (2, False), (5, False)):
        outputs = _call(definition, inputs, num_splits, staged=True, reduce_in_cluster=in_cluster)
        assert_matches_reference(definition, inputs, outputs)
