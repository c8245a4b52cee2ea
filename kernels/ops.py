"""The DSA stages as PyTorch custom operators in the `dsactl` namespace (torch.library.custom_op).

Each op has a fake implementation (shapes and dtypes only), so torch.compile(fullgraph=True) traces a
call without a graph break, and CUDA graphs capture it like any other launch (the kernels never
synchronize with the host). Each has a functional form that allocates its outputs and an out form that
writes caller buffers in place (declared in mutates_args). The optional tensors are positional in the
schemas (custom ops take no keyword-only tensors); pass them by keyword.

  dsactl::indexer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk) -> Tensor
  dsactl::indexer_topk_out(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)
      The lightning indexer and its exact top-k (kernels/indexer/solution.py): q float8_e4m3fn [B, H, 128]
      or [B, next_n, H, 128], the paged FP8 index K cache int8 [num_pages, 64, 1, 132], weights float32
      [B, (next_n,) H], seq_lens int32 [B], block_table int32 [B, max_num_pages]; topk_indices int32
      [B, (next_n,) topk]: physical token ids block_table[b, i // 64] * 64 + i % 64, -1 padded.

  dsactl::sparse_mla_decode(q_nope, q_pe, sparse_indices, sm_scale, kv_cache=None, ckv_cache=None,
                            kpe_cache=None, topk_length=None, attn_sink=None, lse_base_e=False)
      -> (output, lse)
  dsactl::sparse_mla_decode_out(q_nope, q_pe, sparse_indices, sm_scale, output, lse, ...the same optionals)
      Sparse MLA attention through the dispatch (kernels/attention/solution.py): q_nope bf16 [T, H, 512],
      q_pe bf16 [T, H, 64], either kv_cache int8 [num_pages, 64, 656] (FP8) or ckv_cache bf16
      [num_pages, 64, 512] and kpe_cache bf16 [num_pages, 64, 64], sparse_indices int32 [T, topk] (the
      indexer's ids); output bf16 [T, H, 512], lse float32 [T, H] (base 2, or e with lse_base_e).

The launchers check every input and raise KernelInputError naming the argument. Registration happens
once per process: importing this module again (a reload, or the kernels folder under another package
name) finds the ops defined and leaves them as they are. No CUDA library is loaded here; a launcher
loads its own on its first call.
"""

# No `from __future__ import annotations`: custom_op infers each schema from the evaluated type hints.
from typing import Optional

import torch

from .attention.solution import sparse_mla_attention
from .fp8 import MLA_CKV_DIM
from .indexer.score import query_shape
from .indexer.solution import dsa_topk_indexer

NAMESPACE = "dsactl"
OPS = ("indexer_topk", "indexer_topk_out", "sparse_mla_decode", "sparse_mla_decode_out")


def _indexer_shape(q_index_fp8: torch.Tensor, topk: int) -> tuple[int, ...]:
    """The indexer output's shape: q's leading axes (batch, and next_n where q has it), then topk."""
    query_shape(q_index_fp8)  # one-line error for a q that is neither [B, H, 128] nor [B, N, H, 128]
    return (*q_index_fp8.shape[:-2], topk)


def _mla_shapes(q_nope: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(output, lse) shapes of a sparse attention call: [T, H, 512] and [T, H]."""
    num_tokens, heads = q_nope.shape[0], q_nope.shape[1]
    return (num_tokens, heads, MLA_CKV_DIM), (num_tokens, heads)


def _defined(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


def _register() -> tuple:
    """Define the ops unless this process already has them; returns the definitions made."""
    if all(_defined(name) for name in OPS):
        return ()

    @torch.library.custom_op(f"{NAMESPACE}::indexer_topk_out", mutates_args=("topk_indices",))
    def indexer_topk_out(q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor,
                         seq_lens: torch.Tensor, block_table: torch.Tensor, topk_indices: torch.Tensor) -> None:
        dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)

    @indexer_topk_out.register_fake
    def _(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::indexer_topk", mutates_args=())
    def indexer_topk(q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor,
                     seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int) -> torch.Tensor:
        out = torch.empty(_indexer_shape(q_index_fp8, topk), dtype=torch.int32, device=q_index_fp8.device)
        dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, out)
        return out

    @indexer_topk.register_fake
    def _(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk):
        return q_index_fp8.new_empty(_indexer_shape(q_index_fp8, topk), dtype=torch.int32)

    @torch.library.custom_op(f"{NAMESPACE}::sparse_mla_decode_out", mutates_args=("output", "lse"))
    def sparse_mla_decode_out(q_nope: torch.Tensor, q_pe: torch.Tensor, sparse_indices: torch.Tensor,
                              sm_scale: float, output: torch.Tensor, lse: torch.Tensor,
                              kv_cache: Optional[torch.Tensor] = None, ckv_cache: Optional[torch.Tensor] = None,
                              kpe_cache: Optional[torch.Tensor] = None, topk_length: Optional[torch.Tensor] = None,
                              attn_sink: Optional[torch.Tensor] = None, lse_base_e: bool = False) -> None:
        sparse_mla_attention(q_nope, q_pe, sparse_indices, sm_scale, output, lse, kv_cache=kv_cache,
                             ckv_cache=ckv_cache, kpe_cache=kpe_cache, topk_length=topk_length, attn_sink=attn_sink,
                             lse_base_e=lse_base_e)

    @sparse_mla_decode_out.register_fake
    def _(q_nope, q_pe, sparse_indices, sm_scale, output, lse, kv_cache=None, ckv_cache=None, kpe_cache=None,
          topk_length=None, attn_sink=None, lse_base_e=False) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::sparse_mla_decode", mutates_args=())
    def sparse_mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, sparse_indices: torch.Tensor, sm_scale: float,
                          kv_cache: Optional[torch.Tensor] = None, ckv_cache: Optional[torch.Tensor] = None,
                          kpe_cache: Optional[torch.Tensor] = None, topk_length: Optional[torch.Tensor] = None,
                          attn_sink: Optional[torch.Tensor] = None, lse_base_e: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        out_shape, lse_shape = _mla_shapes(q_nope)
        output = torch.empty(out_shape, dtype=torch.bfloat16, device=q_nope.device)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q_nope.device)
        sparse_mla_attention(q_nope, q_pe, sparse_indices, sm_scale, output, lse, kv_cache=kv_cache,
                             ckv_cache=ckv_cache, kpe_cache=kpe_cache, topk_length=topk_length, attn_sink=attn_sink,
                             lse_base_e=lse_base_e)
        return output, lse

    @sparse_mla_decode.register_fake
    def _(q_nope, q_pe, sparse_indices, sm_scale, kv_cache=None, ckv_cache=None, kpe_cache=None,
          topk_length=None, attn_sink=None, lse_base_e=False):
        out_shape, lse_shape = _mla_shapes(q_nope)
        return q_nope.new_empty(out_shape, dtype=torch.bfloat16), q_nope.new_empty(lse_shape, dtype=torch.float32)

    return indexer_topk_out, indexer_topk, sparse_mla_decode_out, sparse_mla_decode


# Held for the life of the process: the dispatcher's registrations belong to these definitions.
_DEFINITIONS = _register()

# The registered operators (OpOverloadPackets), whichever import of this module defined them.
indexer_topk = torch.ops.dsactl.indexer_topk
indexer_topk_out = torch.ops.dsactl.indexer_topk_out
sparse_mla_decode = torch.ops.dsactl.sparse_mla_decode
sparse_mla_decode_out = torch.ops.dsactl.sparse_mla_decode_out
