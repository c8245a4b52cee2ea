"""Entries with the exact signature of each dsa_sparse_attention_* variant, around a launcher that takes
the optional tensors by keyword.

A variant is named by its suffix, flags in this order: _fp8kv (one FP8 kv_cache instead of ckv_cache +
kpe_cache), _lsee (natural-log LSE), _topklen (per-row topk_length), _sink (per-head attention sink).
Its signature: q_nope, q_pe, the KV caches, sparse_indices, sm_scale, topk_length, attn_sink (each
only in its variant), then the preallocated outputs output and lse. Heads and topk come from the
tensors, so one entry serves every head count and topk of its variant.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Variant:
    fp8kv: bool = False
    lse_e: bool = False
    topk_length: bool = False
    sink: bool = False

    @property
    def suffix(self) -> str:
        return (("_fp8kv" if self.fp8kv else "") + ("_lsee" if self.lse_e else "")
                + ("_topklen" if self.topk_length else "") + ("_sink" if self.sink else ""))

    @property
    def signature(self) -> list[str]:
        caches = ["kv_cache"] if self.fp8kv else ["ckv_cache", "kpe_cache"]
        return (["q_nope", "q_pe", *caches, "sparse_indices", "sm_scale"]
                + (["topk_length"] if self.topk_length else []) + (["attn_sink"] if self.sink else [])
                + ["output", "lse"])


VARIANTS = tuple(Variant(fp8kv, lse_e, topk_length, sink) for fp8kv in (False, True) for lse_e in (False, True)
                 for topk_length in (False, True) for sink in (False, True))


def make_entry(run: Callable[..., None], prefix: str, variant: Variant) -> Callable[..., None]:
    """An entry named prefix + suffix, with the variant's signature, that calls run with keywords."""
    signature = inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in variant.signature])

    def entry(*args, **kwargs) -> None:
        run(**signature.bind(*args, **kwargs).arguments, lse_base_e=variant.lse_e)

    entry.__name__ = entry.__qualname__ = prefix + variant.suffix
    entry.__signature__ = signature
    entry.__doc__ = (f"dsa_sparse_attention_h*_ckv512_kpe64_topk*_ps64{variant.suffix}: "
                     f"({', '.join(variant.signature)}), writes output and lse in place.")
    return entry


def entries(run: Callable[..., None], prefix: str, variants: tuple[Variant, ...] = VARIANTS) -> dict[str, Callable]:
    """name -> entry for each variant, for a module's globals()."""
    made = [make_entry(run, prefix, v) for v in variants]
    return {e.__name__: e for e in made}
