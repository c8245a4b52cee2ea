"""Which implementation serves a sparse attention call: a pure function of the call's facts, and the
table of it that `dsactl list` prints.

On sm_90 GPUs two CUDA kernels serve the shapes they were built for, each within its limits:
- the Hopper kernel (hopper_mla.cu), every variant (topk a multiple of 64 up to HOPPER_MAX_TOPK, token ids
  that are rows or pages of a power of two of tokens padded by rows, at most 65535 tokens, 16-byte aligned
  rows), from HOPPER_MIN_TOKENS query tokens per (heads,
  KV format) up to HOPPER_MAX_TOKENS; below 64 heads it computes a whole 64-row tile, and serves 16 and 32
  heads where that still wins. A sink or topk_length changes only its epilogue and row lengths, so the
  thresholds measured without them hold;
- the small-head kernel (mma_mla.cu) at 16 and 32 heads with FP8 KV, every variant (topk up to MMA_MAX_TOPK),
  from MMA_MIN_TOKENS query tokens (below them the Triton kernel's shorter launch wins), where the Hopper
  kernel does not serve.
The thresholds are where each kernel measured fastest (profiles/h100-80gb-hbm3/dispatch.csv, from `bash
profiles/reproduce.sh dispatch`, which times every head count x 1-128 tokens x KV format with each kernel
forced; docs/design.md, "Measured choices"; tests/test_dispatch.py holds the dispatch to every such CSV).
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
HOPPER_HEADS = (16, 32, 64, 128)  # a CTA owns 64 heads of one token (below 64, rows of zero q)
# The fewest query tokens the Hopper kernel serves, per (heads, FP8 KV); a pair missing is never served by it.
# 16 heads with bf16 KV: the definition is the contest's, whose bundle stays free of CUDA (it runs wherever
# Triton does, and verifies on CPU under the interpreter).
HOPPER_MIN_TOKENS = {(16, True): 16, (32, False): 4, (32, True): 4, (64, False): 1, (64, True): 1, (128, False): 1,
                     (128, True): 1}
# The most query tokens it serves where another kernel wins past them: 16 heads with FP8 KV, the small-head kernel.
HOPPER_MAX_TOKENS = {(16, True): 32}


def hopper_heads(fp8kv: bool) -> tuple[int, ...]:
    """The head counts the dispatch may send to the Hopper kernel with this KV format."""
    return tuple(h for h in HOPPER_HEADS if (h, fp8kv) in HOPPER_MIN_TOKENS)


# The Hopper kernel reads its ids from global memory as it gathers: any row length up to FlashMLA's largest.
HOPPER_MAX_TOPK = 16384
# The small-head kernel stages a split's ids in shared memory: rows of more ids are another kernel's (mma_mla's
# MAX_TOPK; mma_mla keeps its own, so that its bundles carry no dispatch).
MMA_MAX_TOPK = 2048

MMA_CAPABILITY = (9, 0)  # where it was measured against the Triton kernel (it runs on sm_90 and sm_100)
MMA_HEADS = (16, 32)
# The fewest query tokens the small-head kernel serves, per head count (FP8 KV, full rows).
MMA_MIN_TOKENS = {16: 8, 32: 16}


@dataclass(frozen=True)
class Row:
    implementation: str
    source: str
    gpus: str
    heads: str
    serves: str


TABLE = (
    Row(HOPPER, "kernels/attention/hopper_mla.cu (CUDA)", "sm_90", "16, 32, 64, 128",
        "bf16 or FP8 KV (32 heads from 4 tokens; 16 heads FP8 only, 16-32 tokens; prefill-sized FP8 calls stage "
        "the cache as fp16 rows), every variant; topk a multiple of 64 up to 16384, token ids that are rows or "
        "pages of 2^k tokens padded by rows, at most 65535 tokens, 16-byte aligned rows"),
    Row(MMA, "kernels/attention/mma_mla.cu (CUDA)", "sm_90", "16, 32",
        f"FP8 KV, every call the row above does not take, from {MMA_MIN_TOKENS[16]} tokens at 16 heads and "
        f"{MMA_MIN_TOKENS[32]} at 32; topk up to 2048, at most 65535 tokens, 16-byte aligned rows"),
    Row(TRITON, "kernels/attention/triton_sparse_mla.py (Triton)", "any", "16, 32, 64, 128",
        "every variant; every call the rows above do not take"),
)


def implementation_for(heads: int, capability: tuple[int, int] | None, *, fp8kv: bool, num_tokens: int,
                       fits: Collection[str], requested: str | None = None) -> str:
    """One of IMPLEMENTATIONS for a call (module docstring); capability is None off a CUDA GPU, fits
    names the CUDA kernels whose limits and alignment the call's tensors meet."""
    if requested is not None:
        if requested not in IMPLEMENTATIONS:
            raise KernelInputError(f"sparse attention: unknown implementation {requested!r} "
                                   f"(choose {', '.join(IMPLEMENTATIONS)})")
        return requested
    least = HOPPER_MIN_TOKENS.get((heads, fp8kv))
    if (capability == HOPPER_CAPABILITY and least is not None and least <= num_tokens
            and num_tokens <= HOPPER_MAX_TOKENS.get((heads, fp8kv), num_tokens) and HOPPER in fits):
        return HOPPER
    if (capability == MMA_CAPABILITY and heads in MMA_HEADS and fp8kv and num_tokens >= MMA_MIN_TOKENS[heads]
            and MMA in fits):
        return MMA
    return TRITON
