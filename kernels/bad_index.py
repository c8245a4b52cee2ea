"""Device-side counters of out-of-range ids that the kernels masked, and the opt-in host validation.

A kernel that meets an id outside its cache treats it as padding (never dereferenced) and adds it to
an int32 counter on the device, so a bad input costs neither a host synchronization nor the CUDA
context; the launcher modules each keep one counter per device and expose bad_index_count (which
synchronizes) and reset_bad_index_count. With check=True on a launcher, or DSACTL_CHECK=1 in the
environment, the launcher validates the ids on the host side first (a synchronization) and raises a
KernelInputError naming the first bad position instead.
"""

from __future__ import annotations

import os

import torch

from .errors import KernelInputError
from .fp8 import PAGE_SIZE

CHECK_ENV = "DSACTL_CHECK"
# ids past this cannot be int32 token ids: a larger cache bounds nothing, so kernels get this bound.
MAX_INT32 = 2**31 - 1
# Page ids [0, MAX_PAGES) give token ids up to MAX_INT32: the bound of a block table without a known cache.
MAX_PAGES = (MAX_INT32 + 1) // PAGE_SIZE


def checking(check: bool | None) -> bool:
    """Whether a launcher validates ids on the host: its check argument, else DSACTL_CHECK=1."""
    return check if check is not None else os.environ.get(CHECK_ENV) == "1"


class BadIndexCounter:
    """One int32 counter per device; tensors live as long as the module, so a captured CUDA graph's
    pointer stays valid."""

    def __init__(self) -> None:
        self._counts: dict[torch.device, torch.Tensor] = {}

    def tensor(self, device: torch.device | str) -> torch.Tensor:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self._counts:
            self._counts[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return self._counts[device]

    def count(self, device: torch.device | str) -> int:
        return int(self.tensor(device).item())

    def reset(self, device: torch.device | str) -> None:
        self.tensor(device).zero_()


def check_ids(who: str, name: str, ids: torch.Tensor, limit: int, read: torch.Tensor | None = None,
              padding: bool = True) -> None:
    """Raise naming the first position of ids [R, C] (among those `read` marks, if given) outside
    [0, limit) and, where padding, not -1."""
    bad = (ids < 0) | (ids >= limit)
    if padding:
        bad &= ids != -1
    if read is not None:
        bad &= read
    if bool(bad.any()):
        row, col = (int(x) for x in bad.nonzero()[0])
        raise KernelInputError(f"{who}: {name}[{row}, {col}] = {int(ids[row, col])} is outside [0, {limit})"
                               + (" and is not -1" if padding else ""))
