"""The argument checks the DSA steps (step.py, prefill_step.py) share: each failure one KernelInputError
naming the step and the argument; per-call checks read attributes only."""

from __future__ import annotations

import numbers

import torch

from .errors import KernelInputError

ANY = None  # a shape entry any size meets (a cache's page or key count): only ever the first


def meets(got: torch.Size, shape: tuple) -> bool:
    """Whether a tensor's shape is `shape`, an ANY first entry met by any size."""
    return got[1:] == shape[1:] and len(got) == len(shape) if shape and shape[0] is ANY else got == shape


def describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)} on {t.device}"


class Checks:
    """The checks of one step, its errors prefixed by `who`."""

    def __init__(self, who: str) -> None:
        self.who = who

    def fail(self, message: str) -> None:
        raise KernelInputError(f"{self.who}: {message}")

    def device(self, device: torch.device | str) -> torch.device:
        """The device with its index: tensors report cuda:N, so per-call checks compare like with like."""
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            self.fail(f"device {device!r} is not a device ({e})")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                self.fail(f"device {device} asks for CUDA, but no CUDA GPU is visible")
            if device.index is None:
                device = torch.device("cuda", torch.cuda.current_device())
        return device

    def choice(self, name: str, value, allowed: tuple) -> None:
        if isinstance(value, bool) or value not in allowed:
            self.fail(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")

    def positive_int(self, name: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail(f"{name} must be a positive integer, got {value!r}")

    def flag(self, name: str, value) -> None:
        if not isinstance(value, bool):
            self.fail(f"{name} must be a bool, got {value!r}")

    def real(self, name: str, value) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            self.fail(f"{name} must be a real number, got {value!r}")

    def inputs(self, given: dict, specs: tuple, kv_format: str, device: torch.device) -> None:
        """Every tensor of specs ((name, dtype, shape, contiguous), the step's own for its KV format) present and
        as specified (tensor), and no KV cache of the other format given."""
        for name, dtype, shape, contiguous in specs:
            if given[name] is None:
                self.fail(f"{name} is required (kv_format {kv_format!r})")
            self.tensor(name, given[name], dtype, shape, contiguous, device)
        for name in ("kv_cache",) if kv_format == "bf16" else ("ckv_cache", "kpe_cache"):
            if given[name] is not None:
                self.fail(f"{name} is not an input of a step with kv_format {kv_format!r}")

    def tensor(self, name: str, t, dtype: torch.dtype, shape: tuple, contiguous: bool, device: torch.device) -> None:
        """dtype, shape, device, and layout: the whole tensor contiguous, or its last dimension."""
        if not isinstance(t, torch.Tensor):
            self.fail(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dtype != dtype or t.device != device or not meets(t.shape, shape):
            want = f"{str(dtype).removeprefix('torch.')} {['*' if s is ANY else s for s in shape]} on {device}"
            self.fail(f"{name} must be {want}, got {describe(t)}")
        if contiguous and not t.is_contiguous():
            self.fail(f"{name} must be contiguous, got strides {t.stride()}")
        if not contiguous and t.stride(-1) != 1:
            self.fail(f"{name} must have a contiguous last dimension, got strides {t.stride()}")
