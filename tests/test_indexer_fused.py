"""The fused indexer + top-k (kernels/topk/indexer_topk.cu + kernels/indexer/fused.py).

CPU: it builds for sm_90a, sm_100a and sm_120a with zero spills and no stack; the library refuses bad
arguments before any CUDA call; the launcher's checks; which calls it serves. GPU (compute capability 9.0
or later): against the float32 reference on poisoned outputs (heads, topk, next_n, rows that fit in topk,
page boundaries, the largest block table), ties and all-equal keys, pages outside the cache, repeatability
over 1000 calls, CUDA-graph replay with new inputs, and which entry takes it.
"""

from __future__ import annotations

import ctypes
import shutil

import pytest
import torch

from attention_cases import build_library
from dsactl.fp8 import PAGE_SIZE
from dsactl.harness import INT_POISON
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.indexer import fused, solution
from dsactl.kernels.indexer import score as score_mod
from dsactl.kernels.topk import launcher as topk_launcher
from test_indexer import assert_indexer_output, make_case, plant_out_of_range_pages

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
on_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)),
                            reason="the fused kernel needs compute capability 9.0 or later")
ARCHES = ("sm90a", "sm100a", "sm120a")
KERNEL = "topk::indexer_topk_kernel"
# The C ABI's error codes (indexer_topk.cu).
BAD_TOPK, BAD_HEADS, BAD_SHAPE, NULL_POINTER, BAD_PAGES, MISALIGNED = -1, -2, -3, -4, -5, -6


# ------------------------------------------------------------------ build and checks (CPU)

@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    return build_library(tmp_path_factory.mktemp("build"), fused.LIBRARY, ARCHES)


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHES)
def test_builds_without_spills_or_stack(builds, arch):
    rows, _ = builds[arch]
    # (heads, keys a thread in the select): 32 and 64 heads, rows of up to 4096 and 8192 keys.
    assert sorted(r.configuration for r in rows) == ["32, 16", "32, 8", "64, 16", "64, 8"]
    for row in rows:
        assert row.kernel == KERNEL
        assert (row.spill_stores, row.spill_loads, row.stack_frame, row.local) == (0, 0, 0, 0), row


@needs_nvcc
def test_library_refuses_bad_arguments_before_any_cuda_call(builds):
    lib = fused.bind(ctypes.CDLL(str(builds["sm90a"][1] / f"lib{fused.LIBRARY}.so")))
    fake = ctypes.c_void_p(256)  # never dereferenced: every call below is refused first

    def call(heads=64, max_pages=40, topk=2048, batch=2, next_n=1, stride=None, num_pages=100, q=fake, out=fake):
        return lib.dsa_indexer_topk(q, fake, fake, fake, fake, max_pages if stride is None else stride, batch,
                                    next_n, heads, max_pages, num_pages, fake, fake, out, topk, None)

    assert call(topk=0) == BAD_TOPK and call(topk=2049) == BAD_TOPK
    assert call(heads=48) == BAD_HEADS
    assert call(max_pages=fused.MAX_PAGES + 1) == BAD_SHAPE and call(max_pages=0) == BAD_SHAPE
    assert call(next_n=0) == BAD_SHAPE and call(stride=39) == BAD_SHAPE and call(batch=-1) == BAD_SHAPE
    assert call(num_pages=2**25 + 1) == BAD_PAGES
    assert call(q=None) == NULL_POINTER and call(out=None) == NULL_POINTER
    assert call(q=ctypes.c_void_p(264)) == MISALIGNED
    assert call(batch=0) == 0
    assert b"2048" in lib.dsa_indexer_topk_error_string(BAD_TOPK)


def _call(inputs, topk):
    batch = inputs["q_index_fp8"].shape[0]
    next_n = inputs["q_index_fp8"].shape[1] if inputs["q_index_fp8"].dim() == 4 else 1
    out = torch.full((batch * next_n, topk), INT_POISON, dtype=torch.int32, device=inputs["q_index_fp8"].device)
    fused.indexer_topk(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
                       inputs["block_table"], out)
    return out


def test_launcher_refuses_bad_shapes_before_the_device():
    inputs = make_case([3000, 100], device="cpu")
    with pytest.raises(KernelInputError, match="out must be contiguous int32"):
        fused.indexer_topk(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"],
                           inputs["seq_lens"], inputs["block_table"], torch.empty(3, 2048, dtype=torch.int32))
    with pytest.raises(KernelInputError, match="topk must be in"):
        _call(inputs, 4096)
    wide = dict(inputs, block_table=torch.zeros(2, fused.MAX_PAGES + 1, dtype=torch.int32))
    with pytest.raises(KernelInputError, match="pages a row"):
        _call(wide, 2048)
    with pytest.raises(KernelInputError, match="CUDA tensors only"):
        _call(inputs, 2048)


def test_serves_no_cpu_call():
    inputs = make_case([3000, 100], device="cpu")
    assert not fused.serves(inputs["q_index_fp8"], inputs["block_table"], 2048)  # no GPU tensors


# ------------------------------------------------------------------ GPU

@on_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("heads,topk,next_n,seq_lens", [
    (64, 2048, 1, [3000, 100, 2049, 5400, 2048]),  # contest-like: scored rows and rows that fit
    (64, 2048, 1, [8192, 8191, 4097]),  # the largest block table: 128 pages, the 16-keys-a-thread select
    (32, 512, 4, [513, 600, 4, 1000, 3]),  # next_n: rows of one request on both sides of topk, empty rows
    (64, 1024, 2, [1025, 1100, 64 * 7 + 1]),
    (32, 2048, 3, [2100, 2113]),  # three rows a request, one page past topk
    (64, 512, 1, [577, 640]),  # 10 pages: clusters of 8 CTAs holding 1-2 pages each
])
def test_matches_reference(heads, topk, next_n, seq_lens):
    inputs = make_case(seq_lens, heads=heads, topk=topk, next_n=next_n, table_pad=-1, seed=topk + len(seq_lens),
                       extra_pages=0 if max(seq_lens) == fused.MAX_PAGES * PAGE_SIZE else 1, device="cuda")
    assert fused.serves(inputs["q_index_fp8"], inputs["block_table"], topk)
    assert_indexer_output(_call(inputs, topk), inputs, topk, next_n)


def _all_equal_keys(inputs, distinct: int) -> None:
    """Every token's key and scale become one of `distinct` rows: scores tie in `distinct` groups."""
    cache = inputs["k_index_cache_fp8"].view(inputs["k_index_cache_fp8"].shape[0], -1)
    keys = cache[:, : PAGE_SIZE * 128].view(-1, PAGE_SIZE, 128)
    scales = cache[:, PAGE_SIZE * 128:].view(torch.float32)
    keys.copy_(keys[0, torch.arange(PAGE_SIZE, device=cache.device) % distinct][None])
    scales.copy_(scales[0, torch.arange(PAGE_SIZE, device=cache.device) % distinct][None])


@on_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("distinct", [1, 3])
def test_ties_are_exact_and_repeatable(distinct):
    seq_lens, topk = [5000, 2500, 300], 2048
    inputs = make_case(seq_lens, topk=topk, seed=40 + distinct, device="cuda")
    _all_equal_keys(inputs, distinct)
    first = _call(inputs, topk)
    assert_indexer_output(first, inputs, topk, 1)
    for _ in range(1000):
        assert torch.equal(_call(inputs, topk), first)


@on_gpu
@pytest.mark.gpu
def test_pages_outside_the_cache_are_masked_and_counted():
    seq_lens, topk = [3000, 4000, 1000], 2048  # the last request fits in topk: its pages are not counted
    inputs = make_case(seq_lens, topk=topk, table_pad=-1, seed=17, device="cuda")
    num_pages = inputs["k_index_cache_fp8"].shape[0]
    inputs["block_table"], planted = plant_out_of_range_pages(inputs["block_table"], seq_lens[:2], num_pages)
    score_mod.reset_bad_index_count("cuda")
    topk_launcher.reset_bad_index_count("cuda")
    out = _call(inputs, topk)
    assert score_mod.bad_index_count("cuda") == planted
    assert topk_launcher.bad_index_count("cuda") == 0  # the rows have enough tokens in the cache
    for b, visible in enumerate(seq_lens[:2]):
        pos = torch.arange(visible, device="cuda")
        pages = inputs["block_table"][b, pos // PAGE_SIZE]
        in_cache = (pages >= 0) & (pages < num_pages)
        valid = (pages.long() * PAGE_SIZE + pos % PAGE_SIZE)[in_cache]
        assert out[b].unique().numel() == topk and torch.isin(out[b].long(), valid).all()


@on_gpu
@pytest.mark.gpu
def test_graph_replay_reads_new_inputs():
    topk, names = 2048, ("q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table")
    inputs = make_case([4000, 3000], topk=topk, seed=21, device="cuda")
    fresh = make_case([4000, 3000], topk=topk, seed=22, device="cuda")  # same shapes, new values
    fresh["seq_lens"] = torch.tensor([3500, 2100], dtype=torch.int32, device="cuda")
    args = [inputs[n] for n in names]
    out = torch.full((2, topk), INT_POISON, dtype=torch.int32, device="cuda")
    fused.indexer_topk(*args, out)  # loads the library outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused.indexer_topk(*args, out)
    for name, t in zip(names, args):
        t.copy_(fresh[name])
    out.fill_(INT_POISON)
    graph.replay()
    torch.cuda.synchronize()
    assert_indexer_output(out, dict(zip(names, args)), topk, 1)


@on_gpu
@pytest.mark.gpu
def test_fused_entry_takes_the_kernel_where_it_serves_and_the_default_entry_never(monkeypatch):
    calls = []
    monkeypatch.setattr(fused, "indexer_topk", lambda *args: calls.append(args[-1].shape[0]))
    for entry, pages in ((solution.dsa_topk_indexer_fused, 40), (solution.dsa_topk_indexer_fused, 200),
                         (solution.dsa_topk_indexer, 40)):
        inputs = make_case([pages * PAGE_SIZE - 10] * 3, extra_pages=0, seed=pages, device="cuda")
        out = torch.full((3, 2048), INT_POISON, dtype=torch.int32, device="cuda")
        entry(inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"], inputs["seq_lens"],
              inputs["block_table"], out)
        if entry is solution.dsa_topk_indexer or pages > fused.MAX_PAGES:
            assert_indexer_output(out, inputs, 2048, 1)  # the two kernels ran
    assert calls == [3]  # only the fused entry at 40 pages
