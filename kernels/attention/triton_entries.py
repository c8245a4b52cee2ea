"""Entries of the Triton kernel alone for every dsa_sparse_attention_* variant (entries.py): what serves
the definitions the Hopper kernel never takes (16 or 32 heads, topk_length, sink; dispatch.py), with
no CUDA library to build or ship."""

from __future__ import annotations

from .entries import entries
from .triton_sparse_mla import sparse_mla_attention

globals().update(entries(sparse_mla_attention, "sparse_attention"))
