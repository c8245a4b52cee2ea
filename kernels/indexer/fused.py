"""Python entry of the fused indexer + top-k (CUDA library `indexer_topk`, kernels/topk/indexer_topk.cu):
each row is scored and selected in one launch, and no score goes through global memory.

`indexer_topk(q, cache, weights, seq_lens, block_table, out)` writes what dsa_topk_indexer writes
(solution.py): per row the physical ids of its top-topk keys, -1 padded, the same ids in the same order on
every call. It serves the calls `serves` accepts: a GPU of compute capability 9.0 or later whose per-block
shared memory holds the kernel's CTA, and block tables of at most MAX_PAGES pages. One launch, no
allocation, no host synchronization: CUDA-graph capturable.

Bad values are masked as the two-kernel path masks them and counted in its counters: block-table entries
outside the cache of a scored request in score.BAD_PAGES, ids written as -1 in the top-k's BAD_IDS.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from ..bad_index import MAX_PAGES as MAX_CACHE_PAGES
from ..cuda_library import load_library
from ..errors import KernelBuildError, KernelError, KernelInputError
from ..fp8 import PAGE_SIZE
from ..topk.launcher import BAD_IDS, MAX_TOPK
from .score import BAD_PAGES, check_inputs

LIBRARY = "indexer_topk"
# The select holds a row's keys in one CTA's registers: 8192 keys, 128 pages.
MAX_PAGES = 128
# Bulk copies read q, the cache and the weights in 16-byte units.
ALIGNMENT = 16


@lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    return bind(load_library(LIBRARY))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the C ABI of indexer_topk.cu on a loaded library."""
    lib.dsa_indexer_topk.restype = ctypes.c_int
    lib.dsa_indexer_topk.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,  # q, cache, weights, seq_lens
        ctypes.c_void_p, ctypes.c_longlong,  # block_table, row stride
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,  # batch, next_n, heads, max_pages, pages
        ctypes.c_void_p, ctypes.c_void_p,  # bad-page and bad-id counters
        ctypes.c_void_p, ctypes.c_int,  # out, topk
        ctypes.c_void_p,  # cudaStream_t
    ]
    lib.dsa_indexer_topk_error_string.restype = ctypes.c_char_p
    lib.dsa_indexer_topk_error_string.argtypes = [ctypes.c_int]
    lib.dsa_indexer_topk_max_pages.restype = ctypes.c_int
    lib.dsa_indexer_topk_shared_bytes.restype = ctypes.c_int
    lib.dsa_indexer_topk_shared_bytes.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    if lib.dsa_indexer_topk_max_pages() != MAX_PAGES:
        raise KernelBuildError(f"lib{LIBRARY}.so was built with a different page limit: rebuild it with `dsactl build`")
    return lib


@lru_cache(maxsize=None)
def _fits(device: torch.device, heads: int, max_pages: int) -> bool:
    """Whether one CTA of the kernel for this shape fits the device's per-block shared memory."""
    lib = _library()
    needed = ctypes.c_int(0)
    with torch.cuda.device(device):
        code = lib.dsa_indexer_topk_shared_bytes(heads, max_pages, ctypes.byref(needed))
    if code != 0:
        raise KernelError(f"indexer top-k: {lib.dsa_indexer_topk_error_string(code).decode()} (code {code})")
    return needed.value <= torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def serves(q: torch.Tensor, block_table: torch.Tensor, topk: int) -> bool:
    """Whether a call of these shapes takes the fused kernel (module docstring)."""
    device = q.device
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (9, 0):
        return False
    heads, max_pages = q.shape[-2], block_table.shape[1]
    return (heads in (32, 64) and topk < max_pages * PAGE_SIZE and max_pages <= MAX_PAGES
            and _fits(device, heads, max_pages))


def indexer_topk(q: torch.Tensor, cache: torch.Tensor, weights: torch.Tensor, seq_lens: torch.Tensor,
                 block_table: torch.Tensor, out: torch.Tensor) -> None:
    """Write the top-k ids of every row into out [batch * next_n, topk] (module docstring); one launch."""
    batch, next_n, heads = check_inputs(q, cache, weights, seq_lens, block_table, out=out)
    rows = batch * next_n
    if out.dtype != torch.int32 or out.dim() != 2 or out.shape[0] != rows or not out.is_contiguous():
        raise KernelInputError(f"indexer top-k: out must be contiguous int32 [{rows}, topk], "
                               f"got {out.dtype} {list(out.shape)}")
    topk, max_pages = out.shape[1], block_table.shape[1]
    if not 1 <= topk <= MAX_TOPK:
        raise KernelInputError(f"indexer top-k: topk must be in [1, {MAX_TOPK}], got {topk}")
    if not 1 <= max_pages <= MAX_PAGES:
        raise KernelInputError(f"indexer top-k: block_table has {max_pages} pages a row; the fused kernel takes "
                               f"1 to {MAX_PAGES}")
    for name, t in (("q", q), ("k cache", cache), ("weights", weights)):
        if t.data_ptr() % ALIGNMENT:
            raise KernelInputError(f"indexer top-k: {name} must be {ALIGNMENT}-byte aligned")
    if q.device.type != "cuda":
        raise KernelInputError("indexer top-k: the fused kernel runs on CUDA tensors only")
    if rows == 0:
        return
    lib = _library()
    device = q.device
    with torch.cuda.device(device):
        code = lib.dsa_indexer_topk(
            q.data_ptr(), cache.data_ptr(), weights.data_ptr(), seq_lens.data_ptr(),
            block_table.data_ptr(), block_table.stride(0),
            batch, next_n, heads, max_pages, min(cache.shape[0], MAX_CACHE_PAGES),
            BAD_PAGES.tensor(device).data_ptr(), BAD_IDS.tensor(device).data_ptr(),
            out.data_ptr(), topk,
            torch.cuda.current_stream(device).cuda_stream,
        )
    if code != 0:
        raise KernelError(f"indexer top-k launch failed: {lib.dsa_indexer_topk_error_string(code).decode()} "
                          f"(code {code})")
