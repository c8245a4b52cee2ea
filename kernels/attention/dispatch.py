"""Which implementation serves a sparse attention call: a pure function of the call's facts, and the
table of it that `dsactl list` prints.

On sm_90 GPUs two CUDA kernels serve the shapes they were built for, each within its limits:
- the Hopper kernel (hopper_mla.cu) at 64 and 128 heads without topk_length or a sink (topk a multiple
  of 64 up to 2048, at most 65535 tokens, 16-byte aligned rows); it was faster than the Triton kernel
  on every such shape measured on an H200 (1.08x at the closest: 64 heads, 2 tokens, bf16 KV);
- the small-head kernel (mma_mla.cu) at 16 and 32 heads with FP8 KV, every variant, from
  MMA_MIN_TOKENS query tokens (below them the Triton kernel's shorter launch wins; MMA_MIN_TOKENS says
  where it was measured).
The Triton kernel serves every other call. Where a CUDA kernel should serve and its library is not
built, the call fails naming the build to run: it never falls back to the slower kernel unasked.
Asking for an implementation (ATTENTION_KERNEL_ENV, or implementation=...) always runs it, or fails
saying why.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ..errors import KernelInputError

HOPPER = "hopper"
MMA = "mma"
TRITON = "triton"
IMPLEMENTATIONS = (HOPPER, MMA, TRITON)
ATTENTION_KERNEL_ENV = "DSA_ATTENTION_KERNEL"
HOPPER_CAPABILITY = (9, 0)  # wgmma and setmaxnreg: sm_90a only
HOPPER_HEADS = (64, 128)  # a CTA owns 64 heads of one token
MMA_CAPABILITY = (9, 0)  # where it was measured against the Triton kernel (it runs on sm_90 and sm_100)
MMA_HEADS = (16, 32)
# The fewest query tokens the small-head kernel serves, per head count: H200, FP8 KV, topk 2048, full
# rows; at 16 heads 19.1 us against the Triton kernel's 21.0 at 8 tokens (12.8 against 9.4 at 1), at 32
# heads 54.0 against 82.5 at 32 tokens (31.5 against 27.3 at 8; 16 tokens, between the two, not measured).
MMA_MIN_TOKENS = {16: 8, 32: 16}


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
    Row(MMA, "kernels/attention/mma_mla.cu (CUDA)", "sm_90", "16, 32",
        f"FP8 KV, every variant, from {MMA_MIN_TOKENS[16]} tokens at 16 heads and {MMA_MIN_TOKENS[32]} at 32; "
        "topk up to 2048, at most 65535 tokens, 16-byte aligned rows"),
    Row(TRITON, "kernels/attention/triton_sparse_mla.py (Triton)", "any", "16, 32, 64, 128",
        "every variant; every call the rows above do not take"),
)


def implementation_for(heads: int, capability: tuple[int, int] | None, *, fp8kv: bool, num_tokens: int,
                       topk_length: bool, sink: bool, fits: Collection[str], requested: str | None = None) -> str:
    """One of IMPLEMENTATIONS for a call (module docstring); capability is None off a CUDA GPU, fits
    names the CUDA kernels whose limits and alignment the call's tensors meet."""
    if requested is not None:
        if requested not in IMPLEMENTATIONS:
            raise KernelInputError(f"sparse attention: unknown implementation {requested!r} "
                                   f"(choose {', '.join(IMPLEMENTATIONS)})")
        return requested
    if (capability == HOPPER_CAPABILITY and heads in HOPPER_HEADS and not topk_length and not sink
            and HOPPER in fits):
        return HOPPER
    if (capability == MMA_CAPABILITY and heads in MMA_HEADS and fp8kv and num_tokens >= MMA_MIN_TOKENS[heads]
            and MMA in fits):
        return MMA
    return TRITON
