"""The errors the kernels raise for a caller to act on: each message says what to change."""


class KernelError(Exception):
    """A failure the caller can fix: inputs outside a kernel's contract, or no usable CUDA library."""


class KernelInputError(KernelError, ValueError):
    """Tensors or arguments outside a kernel's contract (shape, dtype, device, layout, limits)."""


class KernelBuildError(KernelError, RuntimeError):
    """No usable CUDA library: no GPU, an unsupported one, a missing or stale build, or nvcc failed."""
