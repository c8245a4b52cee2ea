"""Destination-passing entries for every dsa_sparse_attention_* definition variant.

Each entry takes its definition's signature (dsactl/definitions/attention.py), positionally
or by keyword: the inputs (q_nope, q_pe, ckv_cache + kpe_cache or kv_cache for `_fp8kv`,
sparse_indices, sm_scale, then topk_length for `_topklen`, attn_sink for `_sink`), then the
preallocated outputs (output, lse), and writes the outputs in place. Heads and topk come
from the tensors, so one entry serves every head count and topk of its variant. The entry
suffix names the variant: sparse_attention_fp8kv_lsee serves
dsa_sparse_attention_h*_ckv512_kpe64_topk*_ps64_fp8kv_lsee, and so on.
"""

from __future__ import annotations

import inspect
from typing import Callable

from dsactl.definitions import attention
from dsactl.kernels.attention import torch_baseline, triton_sparse_mla


def implementation_for(q_nope, q_pe, sparse_indices, output, lse, **kwargs) -> Callable[..., None]:
    """The launcher for one call: the Hopper kernel (hopper_mla.py) wherever it serves the call
    (sm_90, 64 or 128 heads, no topk_length or sink, aligned views, library built), as it was
    faster than the Triton kernel on every such shape measured on the H200 (1.08x at the closest,
    64 heads, 2 tokens, bf16: profiles/h200/attention/hopper_vs_triton.csv); the Triton kernel
    everywhere else."""
    from dsactl.kernels.attention import hopper_mla  # it imports this module's _entry

    if hopper_mla.serves(q_nope, q_pe, sparse_indices, output, lse, **kwargs):
        return hopper_mla.sparse_mla_attention
    return triton_sparse_mla.sparse_mla_attention


def sparse_mla_attention(q_nope, q_pe, sparse_indices, sm_scale, output, lse, **kwargs) -> None:
    """Dispatch by shape (implementation_for); keyword arguments as triton_sparse_mla.sparse_mla_attention."""
    impl = implementation_for(q_nope, q_pe, sparse_indices, output, lse, **kwargs)
    impl(q_nope, q_pe, sparse_indices, sm_scale, output, lse, **kwargs)


def _entry(run: Callable[..., None], prefix: str, fp8kv: bool = False, lse_e: bool = False,
           topk_length: bool = False, sink: bool = False) -> Callable[..., None]:
    """An entry with the variant's exact signature (heads and topk do not change it)."""
    definition = attention.make(fp8kv=fp8kv, lse_base_e=lse_e, topk_length=topk_length, sink=sink)
    signature = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in definition.signature])

    def entry(*args, **kwargs) -> None:
        run(**signature.bind(*args, **kwargs).arguments, lse_base_e=lse_e)

    suffix = definition.name.removeprefix(attention.make().name)
    entry.__name__ = entry.__qualname__ = prefix + suffix
    entry.__signature__ = signature
    entry.__doc__ = f"dsa_sparse_attention_h*_ckv512_kpe64_topk*_ps64{suffix}: {definition.description}"
    return entry


# The shipped kernels (through the dispatcher).
sparse_attention = _entry(sparse_mla_attention, "sparse_attention")
sparse_attention_lsee = _entry(sparse_mla_attention, "sparse_attention", lse_e=True)
sparse_attention_topklen = _entry(sparse_mla_attention, "sparse_attention", topk_length=True)
sparse_attention_lsee_topklen = _entry(sparse_mla_attention, "sparse_attention", lse_e=True, topk_length=True)
sparse_attention_sink = _entry(sparse_mla_attention, "sparse_attention", sink=True)
sparse_attention_lsee_sink = _entry(sparse_mla_attention, "sparse_attention", lse_e=True, sink=True)
sparse_attention_topklen_sink = _entry(sparse_mla_attention, "sparse_attention", topk_length=True, sink=True)
sparse_attention_lsee_topklen_sink = _entry(sparse_mla_attention, "sparse_attention", lse_e=True, topk_length=True,
                                            sink=True)
sparse_attention_fp8kv = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True)
sparse_attention_fp8kv_lsee = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, lse_e=True)
sparse_attention_fp8kv_topklen = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, topk_length=True)
sparse_attention_fp8kv_lsee_topklen = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, lse_e=True,
                                             topk_length=True)
sparse_attention_fp8kv_sink = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, sink=True)
sparse_attention_fp8kv_lsee_sink = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, lse_e=True, sink=True)
sparse_attention_fp8kv_topklen_sink = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, topk_length=True,
                                             sink=True)
sparse_attention_fp8kv_lsee_topklen_sink = _entry(sparse_mla_attention, "sparse_attention", fp8kv=True, lse_e=True,
                                                  topk_length=True, sink=True)

# The vectorized PyTorch baseline, for bench.
torch_sparse_attention = _entry(torch_baseline.sparse_mla_attention, "torch_sparse_attention")
torch_sparse_attention_fp8kv = _entry(torch_baseline.sparse_mla_attention, "torch_sparse_attention", fp8kv=True)
