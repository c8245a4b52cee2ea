"""The DSA stages as PyTorch custom operators in the `dsactl` namespace (torch.library).

Each op has a fake implementation (shapes and dtypes only), so torch.compile(fullgraph=True) traces a
call without a graph break, and CUDA graphs capture it like any other launch (the kernels never
synchronize with the host). Each has a functional form that allocates its outputs and an out form that
writes caller buffers in place (marked (aN!) in its schema). The optional tensors are positional in the
schemas (an op schema's keyword-only arguments cannot be tensors); pass them by keyword.

  dsactl::indexer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk) -> Tensor
  dsactl::indexer_topk_out(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)
      The lightning indexer and its exact top-k (kernels/indexer/solution.py): q float8_e4m3fn [B, H, 128]
      or [B, next_n, H, 128], the paged FP8 index K cache int8 [num_pages, 64, 1, 132], weights float32
      [B, (next_n,) H], seq_lens int32 [B], block_table int32 [B, max_num_pages]; topk_indices int32
      [B, (next_n,) topk]: physical token ids block_table[b, i // 64] * 64 + i % 64, -1 padded.

  dsactl::prefill_topk(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk, max_row_keys=None,
                       logits_bytes=2**30) -> Tensor
  dsactl::prefill_topk_out(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk_indices, ...the same)
      The prefill indexer and its exact top-k (kernels/indexer/prefill_topk.py): q float8_e4m3fn [T, H, D], the
      prompt's index keys float8_e4m3fn [S, D] and their float32 scales [S], weights float32 [T, H], each row's
      key range ks, ke int32 [T]; topk_indices int32 [T, topk]: key ids of the row's range, -1 padded. The
      logits go through row chunks of at most logits_bytes (never [T, S] at once).

  dsactl::sparse_mla_decode(q_nope, q_pe, sparse_indices, sm_scale, kv_cache=None, ckv_cache=None,
                            kpe_cache=None, topk_length=None, attn_sink=None, lse_base_e=False)
      -> (output, lse)
  dsactl::sparse_mla_decode_out(q_nope, q_pe, sparse_indices, sm_scale, output, lse, ...the same optionals)
      Sparse MLA attention through the dispatch (kernels/attention/solution.py): q_nope bf16 [T, H, 512],
      q_pe bf16 [T, H, 64], either kv_cache int8 [num_pages, page_size, 656] (FP8) or ckv_cache bf16
      [num_pages, page_size, 512] and kpe_cache bf16 [num_pages, page_size, 64] (pages of any size, any
      stride apart), sparse_indices int32 [T, topk] (the indexer's ids, page * page_size + offset); output
      bf16 [T, H, 512], lse float32 [T, H] (base 2, or e with lse_base_e).

The launchers check every input and raise KernelInputError naming the argument. An id outside its cache
is masked, never read, and counted on the device (kernels/bad_index.py): bad_index_counters(device)
gives the live counters by stage, to be read whenever the engine chooses (a read syncs; the kernels
never do), and reset_bad_index_counters(device) zeroes them with device ops, which a CUDA graph may
capture. The ops are for inference: no autograd formula, and a written output's version counter is not
bumped. They are defined with torch.library.define, impl and register_fake from schemas written out,
not with torch.library.custom_op, whose Python wrappers (autograd, version bumps found by walking the
schema) cost a call many times the dispatcher's own host time (docs/design.md, Engine API;
tests/test_ops.py holds an op call to a bound); an eager decode step makes two calls. Registration
happens once per process: importing this module again (a reload, or the kernels folder under another
package name) finds the ops defined and leaves them as they are. No CUDA library is loaded here; a
launcher loads its own on its first call.
"""

from __future__ import annotations

import torch

from .attention.solution import sparse_mla_attention
from .attention.triton_sparse_mla import BAD_INDICES
from .fp8 import MLA_CKV_DIM
from .indexer import prefill_topk as prefill
from .indexer.score import BAD_PAGES, query_shape
from .indexer.solution import dsa_topk_indexer
from .topk.launcher import BAD_IDS

NAMESPACE = "dsactl"
_PREFILL_INPUTS = "Tensor q_index_fp8, Tensor k_index_fp8, Tensor k_index_scale, Tensor weights, Tensor ks, Tensor ke"
_PREFILL_OPTIONALS = f"SymInt? max_row_keys=None, int logits_bytes={prefill.LOGITS_BYTES}"
_MLA_OPTIONALS = ("Tensor? kv_cache=None, Tensor? ckv_cache=None, Tensor? kpe_cache=None, Tensor? topk_length=None, "
                  "Tensor? attn_sink=None, bool lse_base_e=False")
# Each op's schema; (aN!) marks the arguments an out form writes.
SCHEMAS = {
    "indexer_topk": "(Tensor q_index_fp8, Tensor k_index_cache_fp8, Tensor weights, Tensor seq_lens, "
                    "Tensor block_table, SymInt topk) -> Tensor",
    "indexer_topk_out": "(Tensor q_index_fp8, Tensor k_index_cache_fp8, Tensor weights, Tensor seq_lens, "
                        "Tensor block_table, Tensor(a5!) topk_indices) -> ()",
    "prefill_topk": f"({_PREFILL_INPUTS}, SymInt topk, {_PREFILL_OPTIONALS}) -> Tensor",
    "prefill_topk_out": f"({_PREFILL_INPUTS}, Tensor(a6!) topk_indices, {_PREFILL_OPTIONALS}) -> ()",
    "sparse_mla_decode": f"(Tensor q_nope, Tensor q_pe, Tensor sparse_indices, float sm_scale, {_MLA_OPTIONALS}) "
                         f"-> (Tensor, Tensor)",
    "sparse_mla_decode_out": f"(Tensor q_nope, Tensor q_pe, Tensor sparse_indices, float sm_scale, "
                             f"Tensor(a4!) output, Tensor(a5!) lse, {_MLA_OPTIONALS}) -> ()",
}
OPS = tuple(SCHEMAS)
# The counters of masked ids, by the stage that met them: block-table pages outside the indexer K cache
# (scoring and the structural path count each once per request), ids the top-k wrote as -1 because their
# page was outside the cache, and attention ids outside the MLA cache.
BAD_INDEX_COUNTERS = {"indexer": BAD_PAGES, "topk": BAD_IDS, "attention": BAD_INDICES}


def _indexer_shape(q_index_fp8: torch.Tensor, topk: int) -> tuple[int, ...]:
    """The indexer output's shape: q's leading axes (batch, and next_n where q has it), then topk."""
    query_shape(q_index_fp8)  # one-line error for a q that is neither [B, H, 128] nor [B, N, H, 128]
    return (*q_index_fp8.shape[:-2], topk)


def _mla_shapes(q_nope: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(output, lse) shapes of a sparse attention call: [T, H, 512] and [T, H]."""
    num_tokens, heads = q_nope.shape[0], q_nope.shape[1]
    return (num_tokens, heads, MLA_CKV_DIM), (num_tokens, heads)


# The implementations, called by the dispatcher with the schema's arguments in order (trailing defaults
# left out, so the optionals keep theirs here).

def _indexer_topk_out(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)


def _indexer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk):
    out = torch.empty(_indexer_shape(q_index_fp8, topk), dtype=torch.int32, device=q_index_fp8.device)
    dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, out)
    return out


def _prefill_topk_out(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk_indices, max_row_keys=None,
                      logits_bytes=prefill.LOGITS_BYTES):
    prefill.prefill_topk(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk_indices,
                         max_row_keys=max_row_keys, logits_bytes=logits_bytes)


def _prefill_topk(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk, max_row_keys=None,
                  logits_bytes=prefill.LOGITS_BYTES):
    out = torch.empty(q_index_fp8.shape[0], topk, dtype=torch.int32, device=q_index_fp8.device)
    _prefill_topk_out(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, out, max_row_keys, logits_bytes)
    return out


def _sparse_mla_decode_out(q_nope, q_pe, sparse_indices, sm_scale, output, lse, kv_cache=None, ckv_cache=None,
                           kpe_cache=None, topk_length=None, attn_sink=None, lse_base_e=False):
    sparse_mla_attention(q_nope, q_pe, sparse_indices, sm_scale, output, lse, kv_cache=kv_cache, ckv_cache=ckv_cache,
                         kpe_cache=kpe_cache, topk_length=topk_length, attn_sink=attn_sink, lse_base_e=lse_base_e)


def _sparse_mla_decode(q_nope, q_pe, sparse_indices, sm_scale, kv_cache=None, ckv_cache=None, kpe_cache=None,
                       topk_length=None, attn_sink=None, lse_base_e=False):
    out_shape, lse_shape = _mla_shapes(q_nope)
    output = torch.empty(out_shape, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q_nope.device)
    _sparse_mla_decode_out(q_nope, q_pe, sparse_indices, sm_scale, output, lse, kv_cache, ckv_cache, kpe_cache,
                           topk_length, attn_sink, lse_base_e)
    return output, lse


# The fake implementations: shapes and dtypes only, for FakeTensorMode, make_fx and torch.compile.

def _fake_indexer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk):
    return q_index_fp8.new_empty(_indexer_shape(q_index_fp8, topk), dtype=torch.int32)


def _fake_prefill_topk(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, topk, max_row_keys=None,
                       logits_bytes=prefill.LOGITS_BYTES):
    return q_index_fp8.new_empty((q_index_fp8.shape[0], topk), dtype=torch.int32)


def _fake_sparse_mla_decode(q_nope, q_pe, sparse_indices, sm_scale, kv_cache=None, ckv_cache=None, kpe_cache=None,
                            topk_length=None, attn_sink=None, lse_base_e=False):
    out_shape, lse_shape = _mla_shapes(q_nope)
    return q_nope.new_empty(out_shape, dtype=torch.bfloat16), q_nope.new_empty(lse_shape, dtype=torch.float32)


def _writes_only(*args, **kwargs) -> None:
    return None


_IMPLEMENTATIONS = {
    "indexer_topk": (_indexer_topk, _fake_indexer_topk),
    "indexer_topk_out": (_indexer_topk_out, _writes_only),
    "prefill_topk": (_prefill_topk, _fake_prefill_topk),
    "prefill_topk_out": (_prefill_topk_out, _writes_only),
    "sparse_mla_decode": (_sparse_mla_decode, _fake_sparse_mla_decode),
    "sparse_mla_decode_out": (_sparse_mla_decode_out, _writes_only),
}


def _defined(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


def _register() -> None:
    """Define the ops unless this process already has them. torch.library keeps them for the life of the
    process (no Library object here to hold)."""
    if all(_defined(name) for name in OPS):
        return
    for name, schema in SCHEMAS.items():
        implementation, fake = _IMPLEMENTATIONS[name]
        qualname = f"{NAMESPACE}::{name}"
        torch.library.define(qualname, schema)
        torch.library.impl(qualname, "default", implementation)  # every device: the launchers refuse a CPU
        torch.library.register_fake(qualname, fake)


_register()

# The registered operators (OpOverloadPackets), whichever import of this module defined them.
indexer_topk = torch.ops.dsactl.indexer_topk
indexer_topk_out = torch.ops.dsactl.indexer_topk_out
prefill_topk = torch.ops.dsactl.prefill_topk
prefill_topk_out = torch.ops.dsactl.prefill_topk_out
sparse_mla_decode = torch.ops.dsactl.sparse_mla_decode
sparse_mla_decode_out = torch.ops.dsactl.sparse_mla_decode_out


def bad_index_counters(device: torch.device | str) -> dict[str, torch.Tensor]:
    """The int32 [1] counters on `device` that the kernels add masked ids to, by stage (BAD_INDEX_COUNTERS).
    The tensors are the kernels' own, kept for the life of the process: hold them and read them when you
    choose (a read syncs with the device; getting them does not). The first get on a device allocates and
    zeroes those a call has not yet made, so get them before capturing a CUDA graph."""
    return {stage: counter.tensor(device) for stage, counter in BAD_INDEX_COUNTERS.items()}


def reset_bad_index_counters(device: torch.device | str) -> None:
    """Zero every stage's counter on `device`: device ops on the current stream (no host sync), so they
    order with the kernels around them and a CUDA graph may capture them."""
    for counter in BAD_INDEX_COUNTERS.values():
        counter.reset(device)
