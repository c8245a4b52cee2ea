"""DecodeStep: one DSA decode step (indexer, top-k, sparse MLA attention) over a workspace built once.

    step = DecodeStep(batch=32, max_context=32768, heads=128, kv_format="fp8", next_n=1, device="cuda")
    output, lse = step(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table,
                       q_nope, q_pe, sm_scale, kv_cache=kv_cache)

Built once per (batch, max context, attention heads, KV format, next_n, topk, device), which it checks
then, each with a KernelInputError naming the argument. A call checks its tensors' dtypes, shapes,
devices and layout against that configuration (attribute reads only), runs dsactl::indexer_topk_out
into the step's top-k buffer and dsactl::sparse_mla_decode_out from it into the step's output and lse,
and returns those two buffers: the next call overwrites them. The ids stay on the device between the
stages, in the contract's form (physical token ids, -1 padded), and nothing waits for the host, so a
call can be captured in a CUDA graph (after one warm-up call, which compiles the kernels) and replayed
on new values copied into the same input tensors. The kernels' own scratch (scores, split partials)
comes from PyTorch's caching allocator, stream-ordered, and from the graph's pool under capture. A
block-table page outside the caches is masked, never read, and counted on the device, not reported by
the call (that would sync): ops.bad_index_counters(device) gives the counters, for the engine to read
when it chooses, and ops.reset_bad_index_counters(device) zeroes them.

Inputs (B = batch, N = next_n, T = B * N query tokens, P = max_pages = ceil(max_context / 64)):
  q_index_fp8       float8_e4m3fn [B, index_heads, 128] (N = 1) or [B, N, index_heads, 128], contiguous
  k_index_cache_fp8 int8 [num_pages, 64, 1, 132], contiguous (the paged FP8 indexer K cache)
  weights           float32 [B, index_heads] (N = 1) or [B, N, index_heads], contiguous
  seq_lens          int32 [B], each in [next_n, max_context]; block_table int32 [B, P], unit column stride
  q_nope            bf16 [T, heads, 512], q_pe bf16 [T, heads, 64] (last dimension contiguous)
  kv_cache          int8 [num_pages, 64, 656] (kv_format "fp8"), or ckv_cache bf16 [num_pages, 64, 512]
                    and kpe_cache bf16 [num_pages, 64, 64] (kv_format "bf16"), pages named by block_table
  sm_scale          float; attn_sink (optional) float32 [heads]
Outputs: output bf16 [T, heads, 512], lse float32 [T, heads] (base 2, or e with lse_base_e); token
t = b * N + j is query token j of request b.
"""

from __future__ import annotations

import torch

from . import ops
from .attention.triton_sparse_mla import HEADS as ATTENTION_HEADS
from .step_checks import ANY, Checks
from .fp8 import INDEX_HEAD_DIM, INDEX_PAGE_BYTES, MLA_CKV_DIM, MLA_KPE_DIM, MLA_TOKEN_BYTES, PAGE_SIZE
from .indexer.shapes import HEADS as INDEX_HEADS
from .indexer.shapes import NEXT_NS, TOPKS

KV_FORMATS = ("bf16", "fp8")
# The indexer K cache viewed per token: 8448-byte pages as [64, 1, 132] (kernels/fp8.py).
INDEX_TOKEN_VIEW = (PAGE_SIZE, 1, INDEX_PAGE_BYTES // PAGE_SIZE)
CHECKS = Checks("DecodeStep")


class DecodeStep:
    """One decode step of a DSA layer over a preallocated workspace (module docstring)."""

    def __init__(self, batch: int, max_context: int, heads: int, kv_format: str, *, next_n: int = 1,
                 topk: int = 2048, index_heads: int = 64, lse_base_e: bool = False,
                 device: torch.device | str = "cuda") -> None:
        CHECKS.positive_int("batch", batch)
        CHECKS.positive_int("max_context", max_context)
        CHECKS.choice("heads", heads, ATTENTION_HEADS)
        CHECKS.choice("kv_format", kv_format, KV_FORMATS)
        CHECKS.choice("next_n", next_n, NEXT_NS)
        CHECKS.choice("topk", topk, TOPKS)
        CHECKS.choice("index_heads", index_heads, INDEX_HEADS)
        if max_context < next_n:
            CHECKS.fail(f"max_context must be at least next_n ({next_n}): each request holds its {next_n} query "
                        f"tokens, got {max_context}")
        CHECKS.flag("lse_base_e", lse_base_e)
        self.batch, self.max_context, self.heads, self.kv_format = batch, max_context, heads, kv_format
        self.next_n, self.topk, self.index_heads, self.lse_base_e = next_n, topk, index_heads, lse_base_e
        self.device = CHECKS.device(device)
        self.max_pages = -(-max_context // PAGE_SIZE)
        self.num_tokens = batch * next_n

        # The workspace: written by every call, read by the caller after it (ids for inspection).
        self.topk_indices = torch.empty(batch, next_n, topk, dtype=torch.int32, device=self.device)
        self.output = torch.empty(self.num_tokens, heads, MLA_CKV_DIM, dtype=torch.bfloat16, device=self.device)
        self.lse = torch.empty(self.num_tokens, heads, dtype=torch.float32, device=self.device)
        self._sparse_indices = self.topk_indices.view(self.num_tokens, topk)  # one row per query token

        mtp = (next_n,) if next_n > 1 else ()
        self._index_inputs = (
            ("q_index_fp8", torch.float8_e4m3fn, (batch, *mtp, index_heads, INDEX_HEAD_DIM), True),
            ("k_index_cache_fp8", torch.int8, (ANY, *INDEX_TOKEN_VIEW), True),
            ("weights", torch.float32, (batch, *mtp, index_heads), True),
            ("seq_lens", torch.int32, (batch,), True),
            ("block_table", torch.int32, (batch, self.max_pages), False),
        )
        self._queries = (
            ("q_nope", torch.bfloat16, (self.num_tokens, heads, MLA_CKV_DIM), False),
            ("q_pe", torch.bfloat16, (self.num_tokens, heads, MLA_KPE_DIM), False),
        )
        if kv_format == "fp8":
            self._caches = (("kv_cache", torch.int8, (ANY, PAGE_SIZE, MLA_TOKEN_BYTES), True),)
        else:
            self._caches = (("ckv_cache", torch.bfloat16, (ANY, PAGE_SIZE, MLA_CKV_DIM), False),
                            ("kpe_cache", torch.bfloat16, (ANY, PAGE_SIZE, MLA_KPE_DIM), False))

    def __repr__(self) -> str:
        return (f"DecodeStep(batch={self.batch}, max_context={self.max_context}, heads={self.heads}, "
                f"kv_format={self.kv_format!r}, next_n={self.next_n}, topk={self.topk}, "
                f"index_heads={self.index_heads}, lse_base_e={self.lse_base_e}, device={str(self.device)!r})")

    def check_inputs(self, q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, q_nope, q_pe, sm_scale,
                     kv_cache=None, ckv_cache=None, kpe_cache=None, attn_sink=None) -> None:
        """The per-call checks (__call__ runs them): a KernelInputError naming the first bad argument."""
        given = {"q_index_fp8": q_index_fp8, "k_index_cache_fp8": k_index_cache_fp8, "weights": weights,
                 "seq_lens": seq_lens, "block_table": block_table, "q_nope": q_nope, "q_pe": q_pe,
                 "kv_cache": kv_cache, "ckv_cache": ckv_cache, "kpe_cache": kpe_cache}
        CHECKS.inputs(given, self._index_inputs + self._queries + self._caches, self.kv_format, self.device)
        if self.kv_format == "bf16" and kpe_cache.shape[0] != ckv_cache.shape[0]:
            CHECKS.fail(f"kpe_cache has {kpe_cache.shape[0]} pages, ckv_cache {ckv_cache.shape[0]}: a token id must "
                        f"name a row of both")
        CHECKS.real("sm_scale", sm_scale)
        if attn_sink is not None:
            CHECKS.tensor("attn_sink", attn_sink, torch.float32, (self.heads,), True, self.device)

    def __call__(self, q_index_fp8: torch.Tensor, k_index_cache_fp8: torch.Tensor, weights: torch.Tensor,
                 seq_lens: torch.Tensor, block_table: torch.Tensor, q_nope: torch.Tensor, q_pe: torch.Tensor,
                 sm_scale: float, *, kv_cache: torch.Tensor | None = None, ckv_cache: torch.Tensor | None = None,
                 kpe_cache: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step; returns the step's (output, lse) buffers (module docstring)."""
        self.check_inputs(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, q_nope, q_pe, sm_scale,
                          kv_cache, ckv_cache, kpe_cache, attn_sink)
        ops.indexer_topk_out(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, self.topk_indices)
        ops.sparse_mla_decode_out(q_nope, q_pe, self._sparse_indices, sm_scale, self.output, self.lse,
                                  kv_cache=kv_cache, ckv_cache=ckv_cache, kpe_cache=kpe_cache, attn_sink=attn_sink,
                                  lse_base_e=self.lse_base_e)
        return self.output, self.lse
