"""The registry of operator definitions: contest contracts and production variants.

`get(name)` accepts any name in the naming scheme (so e.g. attention topk 1536 or
a variant combination not listed by `all_definitions()` still resolves).
"""

from __future__ import annotations

from functools import lru_cache

from dsactl.definitions import attention, indexer, prefill_indexer, topk
from dsactl.definitions.base import Definition, TensorSpec
from dsactl.errors import DsactlError

CONTEST_INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
CONTEST_ATTENTION = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
CONTEST = (CONTEST_INDEXER, CONTEST_ATTENTION)
_MODULES = (indexer, topk, attention, prefill_indexer)

__all__ = ["Definition", "TensorSpec", "get", "all_definitions", "CONTEST", "CONTEST_INDEXER", "CONTEST_ATTENTION"]


@lru_cache(maxsize=None)
def get(name: str) -> Definition:
    for module in _MODULES:
        try:
            found = module.parse(name)
        except ValueError as e:
            raise DsactlError(f"definition {name!r}: {e}") from None
        if found is not None:
            return found
    raise DsactlError(
        f"unknown definition {name!r}; `dsactl list` shows them (contest: {', '.join(CONTEST)})"
    )


def all_definitions() -> list[Definition]:
    return [d for module in _MODULES for d in module.variants()]
