"""Destination-passing entries for every dsa_sparse_attention_* definition variant (entries.py), each
sending its call to the implementation dispatch.py picks: the Hopper CUDA kernel, the small-head CUDA
kernel or the Triton kernel.

The entry suffix names the variant: sparse_attention_fp8kv_lsee serves
dsa_sparse_attention_h*_ckv512_kpe64_topk*_ps64_fp8kv_lsee, and so on. A definition no CUDA kernel ever
serves (bf16 KV at 16 heads) needs only triton_entries.py, which imports no CUDA.
"""

from __future__ import annotations

import os
from typing import Callable

import torch

from ..errors import KernelBuildError
from . import dispatch, hopper_mla, mma_mla, triton_sparse_mla
from .entries import entries

LAUNCHERS: dict[str, Callable[..., None]] = {
    dispatch.HOPPER: hopper_mla.sparse_mla_attention,
    dispatch.MMA: mma_mla.sparse_mla_attention,
    dispatch.TRITON: triton_sparse_mla.sparse_mla_attention,
}
# The CUDA kernels' launcher modules, whose library() is loaded before a call they serve (a missing build
# is an error naming it).
CUDA_LAUNCHERS = {dispatch.HOPPER: hopper_mla, dispatch.MMA: mma_mla}


def implementation_for(q_nope, q_pe, sparse_indices, output, lse, *, ckv_cache=None, kpe_cache=None, kv_cache=None,
                       max_logits=None, empty_lse=float("-inf"), implementation: str | None = None, **_) -> str:
    """One of dispatch.IMPLEMENTATIONS for one call, from its tensors' shapes, layout and device;
    implementation (else $DSA_ATTENTION_KERNEL) asks for one. Loads nothing. The small-head kernel writes
    neither max_logits nor another lse for rows with no valid id (FlashMLA's conventions)."""
    device = q_nope.device
    on_gpu = device.type == "cuda"
    capability = tuple(torch.cuda.get_device_capability(device)) if on_gpu else None
    heads = q_nope.shape[-2] if q_nope.dim() >= 3 else 0
    num_tokens = sparse_indices.numel() // max(1, sparse_indices.shape[-1]) if sparse_indices.dim() >= 2 else 0
    has_kv = kv_cache is not None or (ckv_cache is not None and kpe_cache is not None)
    # The limits are read only where they can matter; a call without its KV is the contract check's to refuse.
    fits = set()
    if on_gpu and has_kv and heads in dispatch.HOPPER_HEADS and hopper_mla.fits(
            q_nope, q_pe, sparse_indices, output, ckv_cache, kpe_cache, kv_cache):
        fits.add(dispatch.HOPPER)
    mma_outputs = max_logits is None and empty_lse == float("-inf")
    if on_gpu and mma_outputs and heads in dispatch.MMA_HEADS and mma_mla.fits(q_nope, q_pe, sparse_indices, output,
                                                                                kv_cache):
        fits.add(dispatch.MMA)
    return dispatch.implementation_for(
        heads, capability, fp8kv=kv_cache is not None, num_tokens=num_tokens, fits=fits,
        requested=implementation or os.environ.get(dispatch.ATTENTION_KERNEL_ENV) or None)


def sparse_mla_attention(q_nope, q_pe, sparse_indices, sm_scale, output, lse, *, implementation: str | None = None,
                         **kwargs) -> None:
    """Run the implementation implementation_for picks; keyword arguments as
    triton_sparse_mla.sparse_mla_attention. Where a CUDA kernel serves the call, its library must be
    built: the error names the build, and the way to run the Triton kernel instead."""
    chosen = implementation_for(q_nope, q_pe, sparse_indices, output, lse, implementation=implementation, **kwargs)
    if chosen in CUDA_LAUNCHERS:
        try:
            CUDA_LAUNCHERS[chosen].library()
        except KernelBuildError as e:
            raise KernelBuildError(f"the {chosen} kernel serves this call: {e} (or set "
                                   f"{dispatch.ATTENTION_KERNEL_ENV}=triton to run the Triton kernel)") from None
    LAUNCHERS[chosen](q_nope, q_pe, sparse_indices, sm_scale, output, lse, **kwargs)


globals().update(entries(sparse_mla_attention, "sparse_attention"))
