"""The small-head FP8 sparse MLA kernel (kernels/attention/mma_mla.cu + mma_mla.py).

CPU: it builds for sm_90a, sm_100a and sm_120a with zero spills, zero stack and local memory, its
fp16/bf16 mma.sync, e4m3 converts and bulk copies in the SASS; the library refuses bad arguments
before any CUDA call; the launcher's input checks and arch refusal; the dispatch's choice of kernel;
the split choice; the entries' signatures. GPU (compute capability 9.0 or later): every served FP8
variant at 16 and 32 heads against the float32 reference on poisoned outputs, index patterns, topk
sizes, split counts, ids outside the cache, strided q, determinism, and the dispatch running it.
"""

from __future__ import annotations

import ctypes
import inspect
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from attention_cases import (assert_matches_reference, assert_repeatable, build_library, case_inputs,
                             definition_name, poisoned_outputs)

from dsactl import fp8
from dsactl.build import arch as arch_table
from dsactl.build import cuda as build_cuda
from dsactl.build import cuobjdump
from dsactl.definitions import get
from dsactl.kernels import cuda_library
from dsactl.kernels.attention import dispatch, hopper_mla, mma_mla, solution
from dsactl.kernels.attention.entries import VARIANTS
from dsactl.kernels.errors import KernelBuildError, KernelInputError

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
on_gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= mma_mla.MIN_CAPABILITY),
    reason="the small-head kernel needs compute capability 9.0 or later")
on_sm90 = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
                             reason="the dispatch sends calls to the small-head kernel on compute capability 9.0")
# Every FP8 variant flag, alone and all together (mma_mla.SERVED_VARIANTS has all 8).
SERVED = ("_fp8kv", "_fp8kv_lsee", "_fp8kv_topklen", "_fp8kv_sink", "_fp8kv_lsee_topklen_sink")
ARCHES = ("sm90a", "sm100a", "sm120a")
KERNEL = "mma_mla::mma_mla_fp8_kernel"
# A head group's warps: one per FP8 scale group of a token (mma_mla.cu: warp w owns scale group w).
WARPS_PER_GROUP = fp8.MLA_NUM_SCALES
H200_SMS = 132


def _definition(heads: int, topk: int, suffix: str = "_fp8kv") -> str:
    return definition_name(heads, topk, suffix)


def _launch(definition: str, named: dict, num_splits: int | None = None, **kwargs) -> None:
    """The launcher on the definition's named tensors, with its variant's keyword arguments."""
    d = get(definition)
    mma_mla.sparse_mla_attention(**{name: named[name] for name in d.signature},
                                 lse_base_e=d.params["lse_base"] != 2.0, num_splits=num_splits, **kwargs)


def _call(definition: str, inputs: dict, num_splits: int | None = None, **kwargs) -> dict:
    """The launcher on poisoned outputs."""
    outputs = poisoned_outputs(definition, inputs)
    _launch(definition, {**inputs, **outputs}, num_splits, **kwargs)
    return outputs


def _assert_empty(outputs: dict, rows) -> None:
    """Rows without a valid id: output 0, lse -inf (also with a sink)."""
    assert bool((outputs["output"][rows] == 0).all()) and bool((outputs["lse"][rows] == float("-inf")).all())


# ------------------------------------------------------------------ build (CPU, needs nvcc)

@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """mma_mla built for ARCHES into a private build root: {arch: (rows, arch_dir)}."""
    return build_library(tmp_path_factory.mktemp("build"), mma_mla.LIBRARY, ARCHES)


def _sass(arch_dir) -> str:
    return subprocess.run([str(cuobjdump.cuobjdump_path()), "-sass", str(arch_dir / "libmma_mla.so")],
                          capture_output=True, text=True, check=True).stdout


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHES)
def test_builds_without_spills_stack_or_local_memory(builds, arch):
    rows, arch_dir = builds[arch]
    # One kernel per head count, its template argument the head groups a CTA.
    groups = {str(heads // mma_mla.HEADS_PER_GROUP): heads for heads in mma_mla.HEADS}
    assert sorted((r.kernel, r.configuration) for r in rows) == sorted((KERNEL, g) for g in groups)
    for row in rows:
        assert (row.spill_stores, row.spill_loads, row.stack_frame, row.local) == (0, 0, 0, 0), row
        # CTAS_PER_SM CTAs an SM: their registers fit its 64K-register file (on these arches the per-block
        # limit too); __launch_bounds__ holds ptxas to it.
        heads = groups[row.configuration]
        threads = 32 * WARPS_PER_GROUP * (heads // mma_mla.HEADS_PER_GROUP)
        assert row.registers * threads * mma_mla.CTAS_PER_SM[heads] <= arch_table.MAX_REGISTERS_PER_BLOCK, row
    log = build_cuda.log_path(arch_dir, cuda_library.find(mma_mla.LIBRARY)).read_text()
    assert "warning" not in log, log
    sass = _sass(arch_dir)
    # fp16 MMAs on the raw e4m3 values (SASS names no input type for fp16), bf16 MMAs on the rope part,
    # e4m3 -> fp16 converts, and the ring's bulk copies completing on mbarriers.
    for instruction in ("HMMA.16816.F32 ", "HMMA.16816.F32.BF16 ", "F2FP.F16.E4M3.UNPACK_B", "UBLKCP.S.G",
                        "SYNCS.PHASECHK"):
        assert instruction in sass, instruction
    assert "LDL" not in sass and "STL" not in sass


@needs_nvcc
def test_library_refuses_bad_arguments_before_any_cuda_call(builds):
    _, arch_dir = builds["sm90a"]
    lib = mma_mla.bind(ctypes.CDLL(str(arch_dir / "libmma_mla.so")))
    fake = 1 << 20  # an aligned address that is never dereferenced: every call below fails its checks first

    def call(heads=16, topk=2048, splits=1, num_tokens=2, q_stride=576, token_stride=None, q=fake, kv=fake,
             out=fake, parts=(fake, fake, fake), cache_tokens=4096, bad_count=fake, in_cluster=0):
        token_stride = q_stride * heads if token_stride is None else token_stride
        return lib.dsa_mma_mla_decode(q, token_stride, q_stride, fake, token_stride, q_stride, kv, fake, topk,
                                      None, None, num_tokens, heads, topk, splits, in_cluster, 1.0, 1.0, out,
                                      512 * heads, 512, fake, heads, 1, *parts, cache_tokens, bad_count, None)

    bad_shape, bad_alignment, null, unsupported_arch, bad_cluster = -1, -2, -3, -4, -5
    assert call(heads=64) == bad_shape and call(heads=8) == bad_shape and call(heads=128) == bad_shape
    assert call(topk=0) == bad_shape and call(topk=4096) == bad_shape and call(topk=mma_mla.MAX_TOPK + 1) == bad_shape
    assert call(splits=0) == bad_shape and call(splits=mma_mla.MAX_SPLITS + 1) == bad_shape
    assert call(num_tokens=-1) == bad_shape and call(num_tokens=mma_mla.MAX_TOKENS + 1) == bad_shape
    assert call(cache_tokens=-1) == bad_shape
    assert call(heads=64, kv=None, q_stride=580) == bad_shape  # shape first, then pointers, then alignment
    assert call(num_tokens=0, kv=None) == 0  # nothing to do: no pointer read, no CUDA call
    assert call(q=None) == null and call(kv=None) == null and call(out=None) == null
    assert call(bad_count=None) == null and call(splits=2, parts=(None, None, None)) == null
    assert call(kv=None, q_stride=580) == null
    # One split needs no partials: past the pointer checks, to the alignment ones.
    assert call(parts=(None, None, None), q_stride=580) == bad_alignment
    assert call(q_stride=580) == bad_alignment and call(token_stride=16 * 576 + 4) == bad_alignment
    assert call(q=fake + 8) == bad_alignment and call(kv=fake + 8) == bad_alignment
    assert call(out=fake + 2) == bad_alignment and call(splits=2, parts=(fake + 4, fake, fake)) == bad_alignment
    assert call(cache_tokens=0, q_stride=580) == bad_alignment  # an empty cache is valid: every id is masked
    # Splits merged in a cluster: 2 to 8 of them, and no partials needed.
    for splits in (1, mma_mla.MAX_CLUSTER_SPLITS + 1, 64):
        assert call(splits=splits, in_cluster=1) == bad_cluster
    for splits in (2, mma_mla.MAX_CLUSTER_SPLITS):
        assert call(splits=splits, in_cluster=1, parts=(None, None, None), q_stride=580) == bad_alignment
    messages = {code: lib.dsa_mma_mla_error_string(code).decode()
                for code in (bad_shape, bad_alignment, null, unsupported_arch, bad_cluster)}
    assert "heads must be 16 or 32" in messages[bad_shape] and f"topk in [1, {mma_mla.MAX_TOPK}]" in messages[bad_shape]
    assert "16-byte aligned" in messages[bad_alignment] and "null" in messages[null]
    assert "compute capability 9.0" in messages[unsupported_arch]
    assert "2 to 8" in messages[bad_cluster]
    assert lib.dsa_mma_mla_error_string(0).decode() == "ok"
    assert lib.dsa_mma_mla_error_string(-99).decode() == "unknown error"


@needs_nvcc
def test_a_library_built_with_other_limits_is_refused(builds, monkeypatch):
    _, arch_dir = builds["sm90a"]
    monkeypatch.setattr(mma_mla, "MAX_SPLITS", mma_mla.MAX_SPLITS // 2)
    with pytest.raises(KernelBuildError, match="rebuild it with `dsactl build`"):
        mma_mla.bind(ctypes.CDLL(str(arch_dir / "libmma_mla.so")))


# ------------------------------------------------------------------ launcher (CPU)

def _cpu_call(definition: str, change: dict, **kwargs) -> None:
    inputs = case_inputs(definition, 2, 40, "cpu", pattern="scattered", valid=(100, 3))
    named = {**inputs, **poisoned_outputs(definition, inputs), **change}
    _launch(definition, named, **kwargs)


def test_launcher_rejects_malformed_inputs_with_one_line_messages():
    definition = _definition(16, 2048)
    inputs = case_inputs(definition, 2, 40, "cpu")
    outputs = poisoned_outputs(definition, inputs)
    q = torch.zeros(2, 16, 520, dtype=torch.bfloat16)  # rows 1040 bytes apart: aligned
    odd = torch.zeros(inputs["kv_cache"].numel() + 8, dtype=torch.int8)[8:].view(inputs["kv_cache"].shape)
    bad_cases = {
        "topk must be at most 2048, got 4096": {"sparse_indices": inputs["sparse_indices"].repeat(1, 2)},
        "q_nope must start 16-byte aligned": {"q_nope": q[..., 1:513]},
        "q_nope row strides must be multiples of 8": {"q_nope": torch.zeros(2, 16, 516).bfloat16()[..., :512]},
        "q_pe row strides must be multiples of 8": {"q_pe": torch.zeros(2, 16, 68).bfloat16()[..., :64]},
        "output must start 16-byte aligned": {"output": q[..., 1:513]},
        "kv_cache pages must start 16-byte aligned": {"kv_cache": odd},
        "sparse_indices must be torch.int32": {"sparse_indices": inputs["sparse_indices"].long()},
        "lse has shape": {"lse": outputs["lse"][:1]},
    }
    for message, change in bad_cases.items():
        with pytest.raises(KernelInputError, match=message) as refused:
            _cpu_call(definition, change)
        assert "\n" not in str(refused.value)
    with pytest.raises(KernelInputError, match=r"serves FP8 KV \(kv_cache\) only") as refused:
        _cpu_call(_definition(16, 128, ""), {})  # bf16 KV: ckv_cache and kpe_cache
    assert "\n" not in str(refused.value)
    with pytest.raises(KernelInputError, match=r"heads must be one of \(16, 32\), got 64") as refused:
        _cpu_call(_definition(64, 128), {})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("heads", mma_mla.HEADS)
def test_valid_cpu_inputs_pass_every_check_then_need_a_gpu(heads):
    for variant in mma_mla.SERVED_VARIANTS:
        definition = _definition(heads, 192, variant.suffix)
        inputs = case_inputs(definition, 2, 40, "cpu", pattern="scattered", valid=(0, 100))
        outputs = poisoned_outputs(definition, inputs)
        assert mma_mla.fits(inputs["q_nope"], inputs["q_pe"], inputs["sparse_indices"], outputs["output"],
                            inputs["kv_cache"])
        with pytest.raises(KernelInputError, match="needs CUDA tensors"):
            _launch(definition, {**inputs, **outputs})
        assert bool(outputs["output"].isnan().all()) and bool(outputs["lse"].isnan().all())  # nothing written


def test_fits_names_the_calls_outside_the_kernels_limits():
    definition = _definition(16, 2048)
    inputs = case_inputs(definition, 2, 40, "cpu")
    outputs = poisoned_outputs(definition, inputs)
    call = dict(q_nope=inputs["q_nope"], q_pe=inputs["q_pe"], sparse_indices=inputs["sparse_indices"],
                output=outputs["output"], kv_cache=inputs["kv_cache"])
    assert mma_mla.fits(**call)
    assert not mma_mla.fits(**{**call, "kv_cache": None})  # bf16 KV
    assert not mma_mla.fits(**{**call, "sparse_indices": call["sparse_indices"].repeat(1, 2)})
    assert not mma_mla.fits(**{**call, "q_nope": torch.zeros(2, 16, 520).bfloat16()[..., 1:513]})


def test_any_gpu_below_compute_capability_9_is_refused(monkeypatch):
    with pytest.raises(KernelInputError, match=r"needs CUDA tensors \(got cpu\)"):
        mma_mla.check_arch(torch.device("cpu"))
    for capability in ((8, 0), (8, 9)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        with pytest.raises(KernelInputError, match=rf"compute capability 9\.0 or later; this GPU is "
                                                   rf"{capability[0]}\.{capability[1]}"):
            mma_mla.check_arch(torch.device("cuda", 0))
    for capability in ((9, 0), (10, 0), (10, 3)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        mma_mla.check_arch(torch.device("cuda", 0))


def test_split_choice_fills_the_gpu_without_splitting_full_grids():
    sms = H200_SMS
    for heads in mma_mla.HEADS:
        slots = sms * mma_mla.CTAS_PER_SM[heads]  # CTAs resident at once (a CTA serves every head of a token)
        for topk in (1, 64, 100, 576, 1536, 2048):
            blocks = -(-topk // mma_mla.BLOCK_TOKENS)
            for num_tokens in (1, 2, 3, 8, 40, 131, 132, 264, 1000, mma_mla.MAX_TOKENS):
                splits = mma_mla.num_splits_for(num_tokens, heads, topk, sms)
                # No split without a 64-token block of its own, none past the combine's limit.
                assert 1 <= splits <= min(blocks, mma_mla.MAX_SPLITS), (heads, topk, num_tokens, splits)
        # One token: a CTA per block; grids already full (or nearly) are never split, so never combined.
        assert mma_mla.num_splits_for(1, heads, 2048, sms) == 2048 // mma_mla.BLOCK_TOKENS
        for num_tokens in (slots, 2 * slots, 1024, 4096):
            assert mma_mla.num_splits_for(num_tokens, heads, 2048, sms) == 1
        # Small batches, the decode shapes: one wave of CTAs over a third of the slots or more.
        for num_tokens in range(dispatch.MMA_MIN_TOKENS[heads], 65):
            ctas = num_tokens * mma_mla.num_splits_for(num_tokens, heads, 2048, sms)
            assert slots // 3 <= ctas <= slots, (heads, num_tokens, ctas)
    assert mma_mla.num_splits_for(256, 16, 2048, sms) == 1
    assert mma_mla.num_splits_for(8, 16, 2048, sms) == 16  # the contest shape: 128 CTAs of 2 blocks


def test_entries_take_the_served_definitions_signatures():
    assert {v.suffix for v in mma_mla.SERVED_VARIANTS} == {v.suffix for v in VARIANTS if v.fp8kv}
    for variant in mma_mla.SERVED_VARIANTS:
        entry = getattr(mma_mla, "sparse_attention" + variant.suffix)
        for heads in mma_mla.HEADS:
            assert list(inspect.signature(entry).parameters) == get(_definition(heads, 2048, variant.suffix)).signature


# ------------------------------------------------------------------ dispatch (CPU)

def test_dispatch_sends_small_head_fp8_calls_from_the_token_threshold_to_the_mma_kernel():
    for heads in dispatch.MMA_HEADS:
        least = dispatch.MMA_MIN_TOKENS[heads]
        at = dict(fp8kv=True, num_tokens=least, fits={dispatch.MMA})
        for num_tokens in (least, 4 * least, mma_mla.MAX_TOKENS):
            assert dispatch.implementation_for(heads, (9, 0), **dict(at, num_tokens=num_tokens)) == dispatch.MMA
        assert dispatch.implementation_for(heads, (9, 0), **{**at, "num_tokens": least - 1}) == dispatch.TRITON
        assert dispatch.implementation_for(heads, (9, 0), **{**at, "fp8kv": False}) == dispatch.TRITON
        assert dispatch.implementation_for(heads, None, **at) == dispatch.TRITON  # off a GPU
        assert dispatch.implementation_for(heads, (9, 0), **{**at, "fits": set()}) == dispatch.TRITON
        # Where the Hopper kernel serves (its token range), it goes first.
        hopper = (dispatch.HOPPER if dispatch.HOPPER_MIN_TOKENS.get((heads, True), least + 1) <= least
                  <= dispatch.HOPPER_MAX_TOKENS.get((heads, True), least) else dispatch.TRITON)
        assert dispatch.implementation_for(heads, (9, 0), **{**at, "fits": {dispatch.HOPPER}}) == hopper
        assert dispatch.implementation_for(heads, (9, 0), **{**at, "fits": {dispatch.HOPPER, dispatch.MMA}}) == (
            dispatch.MMA if hopper == dispatch.TRITON else hopper)
        # Measured against the Triton kernel on sm_90 only.
        assert dispatch.implementation_for(heads, (10, 0), **at) == dispatch.TRITON
        # Asked for, it runs whatever the facts (or fails in its launcher, saying why).
        assert dispatch.implementation_for(heads, None, **{**at, "num_tokens": 1, "fits": set()},
                                           requested="mma") == dispatch.MMA
    assert dispatch.implementation_for(64, (9, 0), **{**at, "num_tokens": 64}) == dispatch.TRITON
    assert {row.implementation for row in dispatch.TABLE} == set(dispatch.IMPLEMENTATIONS)


def _named(heads: int, suffix: str, num_tokens: int) -> dict:
    """A call's tensors (CPU) as solution.implementation_for takes them."""
    definition = _definition(heads, 128, suffix)
    inputs = case_inputs(definition, num_tokens, 8, "cpu", pattern="scattered")
    return {**inputs, **poisoned_outputs(definition, inputs)}


def test_solution_on_cpu_tensors_picks_triton_unless_asked(monkeypatch):
    monkeypatch.delenv(dispatch.ATTENTION_KERNEL_ENV, raising=False)
    for heads in dispatch.MMA_HEADS:
        for suffix in ("_fp8kv", "_fp8kv_lsee_topklen_sink", ""):
            call = _named(heads, suffix, dispatch.MMA_MIN_TOKENS[heads])
            assert solution.implementation_for(**call) == dispatch.TRITON
    call = _named(16, "_fp8kv", 8)
    assert solution.implementation_for(**call, implementation="mma") == dispatch.MMA
    monkeypatch.setenv(dispatch.ATTENTION_KERNEL_ENV, "mma")
    assert solution.implementation_for(**call) == dispatch.MMA


def test_a_gpu_without_the_build_is_an_error_naming_the_build(monkeypatch):
    """No silent fallback: where the small-head kernel serves the call, a missing library is an error
    that names the build to run and how to ask for the Triton kernel instead."""
    def missing():
        raise KernelBuildError("no build of mma_mla for sm90a: run `dsactl build --arch sm90a`")

    monkeypatch.setattr(solution, "implementation_for", lambda *args, **kwargs: dispatch.MMA)
    monkeypatch.setattr(mma_mla, "library", missing)
    definition = _definition(16, 128)
    inputs = case_inputs(definition, 8, 8, "cpu", pattern="scattered")
    named = {**inputs, **poisoned_outputs(definition, inputs)}
    with pytest.raises(KernelBuildError, match=r"dsactl build --arch sm90a.*DSA_ATTENTION_KERNEL=triton"):
        solution.sparse_attention_fp8kv(**{name: named[name] for name in get(definition).signature})


# ------------------------------------------------------------------ GPU (compute capability 9.0+)

VALID = (2048, 1, 700, 2047, 0, 64, 1500, 63)  # valid ids a row: full, one, partial, none, one block


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
@pytest.mark.parametrize("num_tokens", [1, 8, 40])
@pytest.mark.parametrize("suffix", SERVED)
def test_gpu_matches_reference(heads, num_tokens, suffix):
    definition = _definition(heads, 2048, suffix)
    valid = tuple(VALID[i % len(VALID)] for i in range(num_tokens))
    inputs = case_inputs(definition, num_tokens, 128, "cuda", seed=heads + num_tokens, pattern="scattered", valid=valid)
    outputs = _call(definition, inputs)
    assert_matches_reference(definition, inputs, outputs)
    _assert_empty(outputs, [t for t, n in enumerate(valid) if n == 0])


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("pattern", ["empty", "duplicates", "tail", "full", "scattered"])
@pytest.mark.parametrize("suffix", ["_fp8kv", "_fp8kv_lsee_topklen_sink"])
def test_gpu_index_patterns(pattern, suffix):
    definition = _definition(32, 2048, suffix)
    params = {"pattern": pattern, **({"valid": (3, 2048, 65)} if pattern in ("tail", "scattered") else {})}
    inputs = case_inputs(definition, 3, 128, "cuda", seed=len(pattern), **params)
    for num_splits in (None, 1):
        outputs = _call(definition, inputs, num_splits)
        assert_matches_reference(definition, inputs, outputs)
        if pattern == "empty":
            _assert_empty(outputs, slice(None))


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
def test_gpu_ids_clustered_in_one_page(heads):
    """Every id of a row in one 64-token page, each many times over: the same rows gathered again and
    again into one tile."""
    definition = _definition(heads, 512)
    inputs = case_inputs(definition, 3, 64, "cuda", seed=heads)
    g = torch.Generator(device="cuda").manual_seed(heads)
    page_size = inputs["kv_cache"].shape[1]
    ids = 37 * page_size + torch.randint(0, page_size, (3, 512), generator=g, device="cuda", dtype=torch.int32)
    ids[1, ::5] = -1
    inputs["sparse_indices"] = ids
    for num_splits in (None, 1, 4):
        assert_matches_reference(definition, inputs, _call(definition, inputs, num_splits))


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
@pytest.mark.parametrize("suffix", ["_fp8kv", "_fp8kv_lsee_topklen_sink"])
@pytest.mark.parametrize("factor", [-1.0, 0.0, -0.0])
def test_gpu_negative_and_zero_sm_scale(heads, suffix, factor):
    """The kernel folds sm_scale's sign into q and scales each tile's raw maximum by its magnitude:
    a negative scale reverses the softmax, 0 makes it uniform, and masked logits stay -inf."""
    definition = _definition(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=heads, pattern="scattered", valid=(2048, 5, 0, 1000))
    inputs["sm_scale"] = factor * inputs["sm_scale"]
    for num_splits in (None, 1, 3):
        outputs = _call(definition, inputs, num_splits)
        assert_matches_reference(definition, inputs, outputs)


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
def test_gpu_topk_length_zero_negative_and_past_topk(heads):
    """topk_length clamps to [0, topk]: rows of length 0 (or below) are empty, with their sink."""
    definition = _definition(heads, 2048, "_fp8kv_lsee_topklen_sink")
    inputs = case_inputs(definition, 5, 128, "cuda", seed=heads)
    inputs["topk_length"] = torch.tensor([0, 2048, -3, 65, 5000], dtype=torch.int32, device="cuda")
    for num_splits in (None, 1, 5):
        outputs = _call(definition, inputs, num_splits)
        assert_matches_reference(definition, inputs, outputs)
        _assert_empty(outputs, [0, 2])


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
@pytest.mark.parametrize("topk", [64, 100, 576, 1536, 2048])
def test_gpu_topk_sizes(heads, topk):
    """Any topk up to 2048, a multiple of the 64-token tile or not (100: the definitions' topk 128 with
    its last 28 positions cut off; the reference reads them as -1 padding, the contract's meaning)."""
    wide = -(-topk // 64) * 64
    definition = _definition(heads, wide, "_fp8kv_lsee")
    inputs = case_inputs(definition, 3, 64, "cuda", seed=topk, pattern="scattered", valid=(wide, wide // 2, 1))
    outputs = poisoned_outputs(definition, inputs)
    ids = inputs["sparse_indices"][:, :topk]  # a row stride of `wide`: strided rows, as the contract allows
    _launch(definition, {**inputs, **outputs, "sparse_indices": ids})
    padded = F.pad(ids, (0, wide - topk), value=-1)
    assert_matches_reference(definition, {**inputs, "sparse_indices": padded}, outputs)


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
@pytest.mark.parametrize("num_splits", [1, 2, 7, 31, 64])
@pytest.mark.parametrize("suffix", ["_fp8kv", "_fp8kv_lsee_topklen_sink"])
def test_gpu_any_split_count_is_exact(heads, num_splits, suffix):
    """7 splits: 4-5 tiles a split; 31: 66-67 ids, a second tile of 2-3; 64: half a tile. Rows full,
    nearly empty, empty and partial."""
    definition = _definition(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=num_splits, pattern="scattered", valid=(2048, 5, 0, 1000))
    assert_matches_reference(definition, inputs, _call(definition, inputs, num_splits))


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
@pytest.mark.parametrize("num_splits", [2, 5, mma_mla.MAX_CLUSTER_SPLITS])
@pytest.mark.parametrize("suffix", ["_fp8kv", "_fp8kv_lsee_topklen_sink"])
def test_gpu_splits_merged_in_a_cluster_match_the_combine(heads, num_splits, suffix):
    """The splits of a token merged in their cluster against the
    reference and against the combine kernel's merge of the same splits; rows full, short enough to leave
    splits empty, and empty."""
    definition = _definition(heads, 2048, suffix)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=num_splits, pattern="scattered", valid=(2048, 5, 0, 1000))
    merged = _call(definition, inputs, num_splits, reduce_in_cluster=True)
    assert_matches_reference(definition, inputs, merged)
    _assert_empty(merged, [2])
    combined = _call(definition, inputs, num_splits, reduce_in_cluster=False)
    assert torch.allclose(merged["output"].float(), combined["output"].float(), rtol=2**-6, atol=2**-6)
    assert torch.allclose(merged["lse"], combined["lse"], rtol=1e-5, atol=1e-5)
    for splits in (1, mma_mla.MAX_CLUSTER_SPLITS + 1):
        with pytest.raises(KernelInputError, match=rf"must number 2 to {mma_mla.MAX_CLUSTER_SPLITS}, got {splits}"):
            _call(definition, inputs, splits, reduce_in_cluster=True)


@pytest.mark.gpu
@on_gpu
def test_gpu_by_default_two_splits_merge_in_their_cluster_and_more_by_the_combine(monkeypatch):
    """CLUSTER_DEFAULT_SPLITS splits merge in their cluster unless the call says otherwise; any other split
    count goes through the combine kernel."""
    definition = _definition(16, 2048)
    inputs = case_inputs(definition, 4, 128, "cuda", seed=3, pattern="scattered")
    combines = []
    combine = mma_mla.tsm.combine
    monkeypatch.setattr(mma_mla.tsm, "combine", lambda *args: (combines.append(args[6]), combine(*args)))
    for splits in (mma_mla.CLUSTER_DEFAULT_SPLITS, mma_mla.CLUSTER_DEFAULT_SPLITS + 1):
        assert_matches_reference(definition, inputs, _call(definition, inputs, splits))
    _call(definition, inputs, mma_mla.CLUSTER_DEFAULT_SPLITS, reduce_in_cluster=False)
    assert combines == [mma_mla.CLUSTER_DEFAULT_SPLITS + 1, mma_mla.CLUSTER_DEFAULT_SPLITS]


@pytest.mark.gpu
@on_gpu
def test_gpu_split_counts_past_the_combines_limit_are_refused():
    definition = _definition(16, 2048)
    inputs = case_inputs(definition, 2, 64, "cuda")
    for num_splits in (mma_mla.MAX_SPLITS + 1, -1):
        outputs = poisoned_outputs(definition, inputs)
        with pytest.raises(KernelInputError, match=rf"num_splits must be in \[1, 64\], got {num_splits}"):
            _launch(definition, {**inputs, **outputs}, num_splits)
        assert bool(outputs["output"].isnan().all())


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_gpu_ids_outside_the_cache_are_masked_and_counted(heads, num_splits):
    definition = _definition(heads, 512)
    inputs = case_inputs(definition, 4, 64, "cuda", seed=heads, pattern="scattered", valid=(512, 300, 7, 0))
    kv = inputs["kv_cache"]
    tokens = kv.shape[0] * kv.shape[1]
    bad = inputs["sparse_indices"].clone()
    # Far past the cache, negative but not -1, one past the last id (in rows partial and empty), and
    # the last id, which is valid.
    bad[0, 1], bad[0, 5], bad[1, 2], bad[1, 3], bad[3, 7] = 10**8, -5, tokens, tokens - 1, 10**8
    replaced = torch.where((bad >= 0) & (bad < tokens), bad, -1)
    planted = int(((bad != -1) & (replaced == -1)).sum())
    assert planted == 4
    device = kv.device
    mma_mla.reset_bad_index_count(device)
    outputs = _call(definition, {**inputs, "sparse_indices": bad}, num_splits)
    assert_matches_reference(definition, {**inputs, "sparse_indices": replaced}, outputs)
    _assert_empty(outputs, [3])
    assert mma_mla.bad_index_count(device) == planted  # each once, whatever the splits and head groups
    with pytest.raises(KernelInputError, match=rf"sparse_indices\[0, 1\] = 100000000 is outside \[0, {tokens}\)"):
        _call(definition, {**inputs, "sparse_indices": bad}, num_splits, check=True)
    assert mma_mla.bad_index_count(device) == planted  # refused before any launch
    outputs = _call(definition, {**inputs, "sparse_indices": replaced}, num_splits, check=True)
    assert_matches_reference(definition, {**inputs, "sparse_indices": replaced}, outputs)
    assert mma_mla.bad_index_count(device) == planted


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
def test_gpu_strided_views_of_one_576_wide_q(heads):
    """q_nope and q_pe as slices of one [T, H, 576] tensor, as MLA stores them."""
    definition = _definition(heads, 512)
    inputs = case_inputs(definition, 3, 64, "cuda", seed=7, pattern="scattered", valid=(512, 100, 3))
    q = torch.cat([inputs["q_nope"], inputs["q_pe"]], -1)
    views = {**inputs, "q_nope": q[..., :512], "q_pe": q[..., 512:]}
    assert not views["q_nope"].is_contiguous() and not views["q_pe"].is_contiguous()
    for num_splits in (1, 3):
        assert_matches_reference(definition, views, _call(definition, views, num_splits))


@pytest.mark.gpu
@on_gpu
@pytest.mark.parametrize("heads", mma_mla.HEADS)
def test_gpu_repeated_calls_are_bitwise_identical(heads):
    """A race on the ring, the partial logits' exchange or the id buffer would move the result."""
    definition = _definition(heads, 2048, "_fp8kv_sink")
    inputs = case_inputs(definition, 8, 128, "cuda", seed=9, pattern="scattered", valid=(2048, 1000, 1, 0) * 2)
    for num_splits in (None, 1):
        assert_repeatable(lambda: _call(definition, inputs, num_splits), definition, inputs, 20)


@pytest.mark.gpu
@on_sm90
def test_gpu_solution_runs_the_mma_kernel_at_16_heads_from_8_tokens(monkeypatch):
    monkeypatch.delenv(dispatch.ATTENTION_KERNEL_ENV, raising=False)
    ran = []

    def mma_launcher(*args, **kwargs):
        ran.append(True)
        mma_mla.sparse_mla_attention(*args, **kwargs)

    monkeypatch.setitem(solution.LAUNCHERS, dispatch.MMA, mma_launcher)
    definition = _definition(16, 2048)
    num_tokens = dispatch.MMA_MIN_TOKENS[16]
    inputs = case_inputs(definition, num_tokens, 128, "cuda", seed=3, pattern="scattered", valid=VALID[:num_tokens])
    outputs = poisoned_outputs(definition, inputs)
    named = {**inputs, **outputs}
    assert solution.implementation_for(**named) == dispatch.MMA
    solution.sparse_attention_fp8kv(**{name: named[name] for name in get(definition).signature})
    assert ran
    assert_matches_reference(definition, inputs, outputs)


def test_the_cuda_kernels_topk_limits_are_the_ones_the_solutions_plan_with():
    from dsactl.definitions import attention

    assert mma_mla.MAX_TOPK == dispatch.MMA_MAX_TOPK
    assert hopper_mla.MAX_TOPK == dispatch.HOPPER_MAX_TOPK == attention.MAX_TOPK
