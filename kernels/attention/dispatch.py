"""Which implementation serves a sparse attention call: a pure function of the call's facts, and the
table of it that `dsactl list` prints.

The Hopper kernel (hopper_mla.cu) serves sm_90 GPUs at 64 and 128 heads without topk_length or a
sink, within its limits (topk a multiple of 64 up to 2048, at most 65535 tokens, 16-byte aligned
rows); it was faster than the Triton kernel on every such shape measured on an H200 (1.08x at the
closest: 64 heads, 2 tokens, bf16 KV). The Triton kernel serves every other call. Where the Hopper
kernel should serve and its library is not built, the call fails naming the build to run: it never
falls back to the slower kernel unasked. Asking for the Triton kernel (ATTENTION_KERNEL_ENV=triton,
or implementation="triton") always runs it; "hopper" runs the Hopper kernel or fails saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import KernelInputError

HOPPER = "hopper"
TRITON = "triton"
IMPLEMENTATIONS = (HOPPER, TRITON)
ATTENTION_KERNEL_ENV = "DSA_ATTENTION_KERNEL"
HOPPER_CAPABILITY = (9, 0)  # wgmma and setmaxnreg: sm_90a only
HOPPER_HEADS = (64, 128)  # a CTA owns 64 heads of one token


@dataclass(frozen=True)
class Row:
    implementation: str
    source: str
    gpus: str
    heads: str
    serves: str


TABLE = (
    Row(HOPPER, "kernels/attention/hopper_mla.cu (CUDA)", "sm_90", "64, 128",
        "bf16 or FP8 KV, LSE base 2 or e, no topk_length or sink; topk a multiple of 64 up to 2048, "
        "at most 65535 tokens, 16-byte aligned rows"),
    Row(TRITON, "kernels/attention/triton_sparse_mla.py (Triton)", "any", "16, 32, 64, 128",
        "every variant; every call the row above does not take"),
)


def implementation_for(heads: int, capability: tuple[int, int] | None, *, topk_length: bool, sink: bool,
                       within_hopper_limits: bool, requested: str | None = None) -> str:
    """HOPPER or TRITON for a call (module docstring); capability is None off a CUDA GPU."""
    if requested is not None:
        if requested not in IMPLEMENTATIONS:
            raise KernelInputError(f"sparse attention: unknown implementation {requested!r} "
                                   f"(choose {' or '.join(IMPLEMENTATIONS)})")
        return requested
    hopper = (capability == HOPPER_CAPABILITY and heads in HOPPER_HEADS and not topk_length and not sink
              and within_hopper_limits)
    return HOPPER if hopper else TRITON
