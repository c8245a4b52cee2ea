"""The 16-byte alignment the CUDA attention kernels' vector copies need, checked on the host with the
tensor named (the Triton kernel takes any layout of the contract)."""

from __future__ import annotations

import torch

from ..errors import KernelInputError

ALIGN_BYTES = 16  # cp.async and vector loads move 16 bytes
ROW_ALIGN_ELEMS = ALIGN_BYTES // 2  # bf16 elements per 16 bytes


def check_aligned(who: str, name: str, t: torch.Tensor, row_dims: int) -> None:
    """Base 16-byte aligned; the strides of the first row_dims dims keep every row 16-byte aligned
    (a dim of size 1 is never stepped over, so its stride does not matter)."""
    if t.data_ptr() % ALIGN_BYTES:
        raise KernelInputError(f"{who}: {name} must start 16-byte aligned (got a view at an odd offset)")
    bad = [s for s, n in zip(t.stride()[:row_dims], t.shape) if n > 1 and s % ROW_ALIGN_ELEMS]
    if bad:
        raise KernelInputError(f"{who}: {name} row strides must be multiples of {ROW_ALIGN_ELEMS} elements, "
                               f"got {t.stride()}")
