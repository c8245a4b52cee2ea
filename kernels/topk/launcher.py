"""Python entry of the CUDA top-k (topk.cu): input checks, then one launch on the current stream.

`topk_page_transform(scores, lengths, block_table, row_to_batch, out, topk)` writes
out[r, :] = the physical ids block_table[b, i // 64] * 64 + i % 64 of the top
min(topk, lengths[r]) positions i of scores[r, :lengths[r]] (b = row_to_batch[r], or r when
row_to_batch is None), -1 padded, in no particular order. Exact for every input: ties at the
threshold fill the remaining slots, NaN ranks below -inf (the definition's rule), -0.0 equals
+0.0. Rows of max_len <= 8192 get the same ids in the same order on every call, ties included.
topk <= 2048 (the algorithm has no other limit on k; 2048 is the contract's maximum and what is
tested). Lengths are clamped to [0, min(max_len, max_num_pages * 64)].

Bad values never become ids outside the cache: a chosen position whose block-table entry is
outside [0, num_pages) is written as -1, and a row whose row_to_batch value is outside
[0, block_table rows) is all -1; each -1 written in place of a due id is counted on the device
(bad_index_count). Selection never depends on page ids. num_pages defaults to MAX_PAGES, the
pages whose ids fit int32.

Two kernels (topk.cu): rows of max_len <= 8192 run one CTA per row with the keys in registers;
longer rows a thread-block cluster per row (`launch_plan` says which, and the cluster size).
Neither needs a global workspace (a row spread over several CTAs meets in the cluster's
distributed shared memory), and the library caches the per-device facts it needs on its first
call, so a call allocates nothing and never synchronizes: CUDA-graph capturable.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from ..bad_index import MAX_PAGES, BadIndexCounter, check_ids, checking
from ..cuda_library import load_library
from ..errors import KernelBuildError, KernelError, KernelInputError
from ..fp8 import PAGE_SIZE

LIBRARY = "topk"
MAX_TOPK = 2048
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}


@lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    return bind(load_library(LIBRARY))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the C ABI of topk.cu on a loaded library."""
    lib.dsa_topk_page_transform.restype = ctypes.c_int
    lib.dsa_topk_page_transform.argtypes = [
        ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong,  # scores, dtype, row stride
        ctypes.c_void_p,  # lengths
        ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_int,  # block_table, row stride, rows, max_pages
        ctypes.c_void_p,  # row_to_batch or NULL
        ctypes.c_int, ctypes.c_void_p,  # num_pages, bad-id counter
        ctypes.c_void_p, ctypes.c_longlong,  # out, row stride
        ctypes.c_int, ctypes.c_int, ctypes.c_int,  # rows, max_len, topk
        ctypes.c_void_p,  # cudaStream_t
    ]
    lib.dsa_topk_error_string.restype = ctypes.c_char_p
    lib.dsa_topk_error_string.argtypes = [ctypes.c_int]
    lib.dsa_topk_max_topk.restype = ctypes.c_int
    if not hasattr(lib, "dsa_topk_max_pages"):
        raise KernelBuildError(f"lib{LIBRARY}.so predates page masking: rebuild it with `dsactl build`")
    lib.dsa_topk_max_pages.restype = ctypes.c_int
    if lib.dsa_topk_max_topk() != MAX_TOPK or lib.dsa_topk_max_pages() != MAX_PAGES:
        raise KernelBuildError(f"lib{LIBRARY}.so was built with different top-k or page limits: "
                               "rebuild it with `dsactl build`")
    lib.dsa_topk_launch_plan.restype = ctypes.c_int
    lib.dsa_topk_launch_plan.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int,  # dtype, rows, max_len
                                         ctypes.POINTER(ctypes.c_int)]  # out: 0 (row kernel) or cluster size
    return lib


def _check_matrix(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise KernelInputError(f"top-k: {name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise KernelInputError(f"top-k: {name} must be {want}, got {str(t.dtype).removeprefix('torch.')}")
    if t.device != device:
        raise KernelInputError(f"top-k: {name} is on {t.device}, scores on {device}")
    if t.dim() != 2:
        raise KernelInputError(f"top-k: {name} must be 2-D, got shape {list(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise KernelInputError(f"top-k: {name} rows must be contiguous (stride(1) == 1), got strides {t.stride()}")
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise KernelInputError(f"top-k: {name} rows must not overlap (stride(0) >= {t.shape[1]}), "
                               f"got strides {t.stride()}")


def _check_vector(name: str, t: torch.Tensor, rows: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != rows:
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise KernelInputError(f"top-k: {name} must be int32 [{rows}], got {got}")
    if t.device != device:
        raise KernelInputError(f"top-k: {name} is on {t.device}, scores on {device}")
    if rows > 1 and t.stride(0) != 1:
        raise KernelInputError(f"top-k: {name} must be contiguous")


# Ids the kernels wrote as -1 because their page was outside the cache or their row's batch outside the
# block table, per device.
BAD_IDS = BadIndexCounter()


def bad_index_count(device: torch.device | str) -> int:
    """How many due ids the top-k on `device` masked as -1 since the last reset (syncs)."""
    return BAD_IDS.count(device)


def reset_bad_index_count(device: torch.device | str) -> None:
    BAD_IDS.reset(device)


def read_pages(lengths: torch.Tensor, block_table: torch.Tensor, row_to_batch: torch.Tensor | None,
               max_len: int) -> torch.Tensor:
    """bool [batch, max_pages]: the block-table entries some row translates through (its first
    ceil(clamped length / 64) pages); rows whose batch is outside the table read none."""
    batch, max_pages = block_table.shape
    rows = lengths.shape[0]
    clamped = lengths.long().clamp(0, min(max_len, max_pages * PAGE_SIZE))
    pages_read = (clamped + PAGE_SIZE - 1) // PAGE_SIZE
    b = torch.arange(rows, device=lengths.device) if row_to_batch is None else row_to_batch.long()
    inside = (b >= 0) & (b < batch)
    per_batch = torch.zeros(batch, dtype=torch.long, device=lengths.device)
    per_batch.scatter_reduce_(0, b[inside], pages_read[inside], "amax")
    return torch.arange(max_pages, device=lengths.device)[None, :] < per_batch[:, None]


def check_values(lengths: torch.Tensor, block_table: torch.Tensor, row_to_batch: torch.Tensor | None,
                 max_len: int, num_pages: int) -> None:
    """The host-side validation (check=True): every row's batch is a block-table row, every page a row
    translates through is in the cache."""
    if row_to_batch is not None and row_to_batch.numel():
        check_ids("top-k", "row_to_batch", row_to_batch[None, :], block_table.shape[0], padding=False)
    if block_table.numel():
        read = read_pages(lengths, block_table, row_to_batch, max_len)
        check_ids("top-k", "block_table", block_table, num_pages, read, padding=False)


def check_inputs(scores: torch.Tensor, lengths: torch.Tensor, block_table: torch.Tensor,
                 row_to_batch: torch.Tensor | None, out: torch.Tensor, topk: int, num_pages: int | None,
                 check: bool | None = None) -> int:
    """Every shape, dtype, device and layout relation of a call, on any device (one-line
    KernelInputError naming the argument); with check, the values too (check_values). Returns the page
    bound the kernel gets."""
    if not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        raise KernelInputError(f"top-k: topk must be an integer in [1, {MAX_TOPK}], got {topk!r}")
    if num_pages is None:
        num_pages = MAX_PAGES
    if not isinstance(num_pages, int) or num_pages < 0:
        raise KernelInputError(f"top-k: num_pages must be an integer >= 0, got {num_pages!r}")
    if not isinstance(scores, torch.Tensor):
        raise KernelInputError(f"top-k: scores must be a tensor, got {type(scores).__name__}")
    device = scores.device
    _check_matrix("scores", scores, tuple(_DTYPE_CODES), device)
    _check_matrix("block_table", block_table, (torch.int32,), device)
    _check_matrix("out", out, (torch.int32,), device)
    rows, max_len = scores.shape
    if tuple(out.shape) != (rows, topk):
        raise KernelInputError(f"top-k: out must be [{rows}, {topk}] (rows, topk), got {list(out.shape)}")
    _check_vector("lengths", lengths, rows, device)
    if row_to_batch is None:
        if block_table.shape[0] < rows:
            raise KernelInputError(
                f"top-k: without row_to_batch row r uses block_table row r, but block_table has "
                f"{block_table.shape[0]} rows for {rows} score rows"
            )
    else:
        _check_vector("row_to_batch", row_to_batch, rows, device)
    num_pages = min(num_pages, MAX_PAGES)
    if checking(check):
        check_values(lengths, block_table, row_to_batch, max_len, num_pages)
    return num_pages


def topk_page_transform(scores: torch.Tensor, lengths: torch.Tensor, block_table: torch.Tensor,
                        row_to_batch: torch.Tensor | None, out: torch.Tensor, topk: int,
                        num_pages: int | None = None, check: bool | None = None) -> None:
    """Write the exact top-k of every row, translated to physical ids (module docstring). num_pages is
    the cache's page count (default MAX_PAGES; larger values are clamped to it). check (default:
    DSACTL_CHECK=1) refuses bad row_to_batch values and block-table entries on the host first, which
    needs a host synchronization."""
    num_pages = check_inputs(scores, lengths, block_table, row_to_batch, out, topk, num_pages, check)
    device = scores.device
    if device.type != "cuda":
        raise KernelInputError("top-k: scores must be a CUDA tensor")
    rows, max_len = scores.shape
    if rows == 0:
        return
    lib = _library()
    with torch.cuda.device(device):
        code = lib.dsa_topk_page_transform(
            scores.data_ptr(), _DTYPE_CODES[scores.dtype], scores.stride(0),
            lengths.data_ptr(),
            block_table.data_ptr(), block_table.stride(0), block_table.shape[0], block_table.shape[1],
            None if row_to_batch is None else row_to_batch.data_ptr(),
            num_pages, BAD_IDS.tensor(device).data_ptr(),
            out.data_ptr(), out.stride(0),
            rows, max_len, topk,
            torch.cuda.current_stream(device).cuda_stream,
        )
    if code != 0:
        raise KernelError(f"top-k kernel launch failed: {lib.dsa_topk_error_string(code).decode()} (code {code})")


def launch_plan(dtype: torch.dtype, rows: int, max_len: int) -> int:
    """Which kernel a call with these shapes launches on the current CUDA device: 0 for the
    register-resident row kernel (max_len <= 8192), else the cluster kernel's CTAs per row."""
    if dtype not in _DTYPE_CODES:
        raise KernelInputError(f"top-k: scores dtype must be float32 or bfloat16, got {dtype}")
    lib = _library()
    cluster_size = ctypes.c_int(-1)
    code = lib.dsa_topk_launch_plan(_DTYPE_CODES[dtype], rows, max_len, ctypes.byref(cluster_size))
    if code != 0:
        raise KernelError(f"top-k launch plan failed: {lib.dsa_topk_error_string(code).decode()} (code {code})")
    return cluster_size.value


def dsa_topk_page_transform(scores: torch.Tensor, lengths: torch.Tensor, block_table: torch.Tensor,
                            row_to_batch: torch.Tensor, topk_indices: torch.Tensor) -> None:
    """Solution entry for dsa_topk_page_transform_topk{K}_ps64[_bf16]: the definition's
    signature (inputs, then the preallocated output); k is the output's width."""
    if not isinstance(topk_indices, torch.Tensor) or topk_indices.dim() != 2:
        raise KernelInputError("top-k: topk_indices must be a 2-D int32 tensor [num_rows, topk]")
    topk_page_transform(scores, lengths, block_table, row_to_batch, topk_indices, int(topk_indices.shape[1]))
