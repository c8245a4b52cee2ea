"""PrefillStep: one DSA prefill step (indexer, top-k, sparse MLA attention) over a prompt batch, with the
logits never whole in memory.

    step = PrefillStep(num_tokens=8192, num_keys=8192, heads=128, kv_format="bf16", device="cuda")
    output, lse = step(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, q_nope, q_pe, sm_scale,
                       ckv_cache=ckv, kpe_cache=kpe)

The prompts are packed as engines pack a prefill batch for DeepGEMM's fp8_mqa_logits: T query tokens, S keys
(the prompts' tokens, cached or new), query token t seeing keys ks[t] <= s < ke[t] (its request's keys up to
itself for causal prefill). Built once per configuration (tokens, keys, heads, KV format, index heads and dim,
topk, device), which it checks then, each with a KernelInputError naming the argument. A call checks its
tensors against that configuration (attribute reads only), runs dsactl::prefill_topk_out into the step's
top-k buffer (the ragged logits in row chunks of at most logits_bytes, then the exact top-k of each row's
range: kernels/indexer/prefill_topk.py) and dsactl::sparse_mla_decode_out over those ids into the step's
output and lse, and returns those two buffers: the next call overwrites them. The ids are key ids (rows of
the prompt's KV), -1 padded, and stay on the device; nothing waits for the host, so a call captures in a
CUDA graph after one warm-up call.

Inputs (T = num_tokens, S = num_keys, H = index_heads, D = index_dim):
  q_index_fp8    float8_e4m3fn [T, H, D] contiguous; k_index_fp8 float8_e4m3fn [S, D] contiguous and
                 k_index_scale float32 [S] (the indexer's keys and their dequant scales)
  weights        float32 [T, H], heads contiguous; ks, ke int32 [T] contiguous (clamped to [0, S])
  q_nope         bf16 [T, heads, 512], q_pe bf16 [T, heads, 64] (last dimension contiguous)
  kv_cache       int8 [S, 656] contiguous (kv_format "fp8"), or ckv_cache bf16 [S, 512] and kpe_cache bf16
                 [S, 64] (kv_format "bf16"; rows any stride apart, e.g. views of one [S, 576] tensor)
  sm_scale       float; attn_sink (optional) float32 [heads]
Outputs: output bf16 [T, heads, 512], lse float32 [T, heads] (base 2, or e with lse_base_e).
"""

from __future__ import annotations

import torch

from . import ops
from .attention.triton_sparse_mla import HEADS as ATTENTION_HEADS
from .fp8 import MLA_CKV_DIM, MLA_KPE_DIM, MLA_TOKEN_BYTES
from .indexer.mqa_logits import DIMS as INDEX_DIMS
from .indexer.mqa_logits import HEADS as INDEX_HEADS
from .indexer.prefill_topk import LOGITS_BYTES, MAX_TOPK
from .step import KV_FORMATS
from .step_checks import Checks

CHECKS = Checks("PrefillStep")


class PrefillStep:
    """One prefill step of a DSA layer over a preallocated workspace (module docstring)."""

    def __init__(self, num_tokens: int, num_keys: int, heads: int, kv_format: str, *, topk: int = 2048,
                 index_heads: int = 64, index_dim: int = 128, max_row_keys: int | None = None,
                 logits_bytes: int = LOGITS_BYTES, lse_base_e: bool = False,
                 device: torch.device | str = "cuda") -> None:
        CHECKS.positive_int("num_tokens", num_tokens)
        CHECKS.positive_int("num_keys", num_keys)
        CHECKS.choice("heads", heads, ATTENTION_HEADS)
        CHECKS.choice("kv_format", kv_format, KV_FORMATS)
        CHECKS.positive_int("topk", topk)
        if topk > MAX_TOPK or topk % 64:
            CHECKS.fail(f"topk must be a multiple of 64 up to {MAX_TOPK}, got {topk}")
        CHECKS.choice("index_heads", index_heads, INDEX_HEADS)
        CHECKS.choice("index_dim", index_dim, INDEX_DIMS)
        if max_row_keys is not None:
            CHECKS.positive_int("max_row_keys", max_row_keys)
        CHECKS.positive_int("logits_bytes", logits_bytes)
        CHECKS.flag("lse_base_e", lse_base_e)
        self.num_tokens, self.num_keys, self.heads, self.kv_format = num_tokens, num_keys, heads, kv_format
        self.topk, self.index_heads, self.index_dim = topk, index_heads, index_dim
        self.max_row_keys, self.logits_bytes, self.lse_base_e = max_row_keys, logits_bytes, lse_base_e
        self.device = CHECKS.device(device)

        # The workspace: written by every call, read by the caller after it (ids for inspection).
        self.topk_indices = torch.empty(num_tokens, topk, dtype=torch.int32, device=self.device)
        self.output = torch.empty(num_tokens, heads, MLA_CKV_DIM, dtype=torch.bfloat16, device=self.device)
        self.lse = torch.empty(num_tokens, heads, dtype=torch.float32, device=self.device)

        self._index_inputs = (
            ("q_index_fp8", torch.float8_e4m3fn, (num_tokens, index_heads, index_dim), True),
            ("k_index_fp8", torch.float8_e4m3fn, (num_keys, index_dim), True),
            ("k_index_scale", torch.float32, (num_keys,), True),
            ("weights", torch.float32, (num_tokens, index_heads), False),
            ("ks", torch.int32, (num_tokens,), True),
            ("ke", torch.int32, (num_tokens,), True),
        )
        self._queries = (
            ("q_nope", torch.bfloat16, (num_tokens, heads, MLA_CKV_DIM), False),
            ("q_pe", torch.bfloat16, (num_tokens, heads, MLA_KPE_DIM), False),
        )
        if kv_format == "fp8":
            self._caches = (("kv_cache", torch.int8, (num_keys, MLA_TOKEN_BYTES), True),)
        else:
            self._caches = (("ckv_cache", torch.bfloat16, (num_keys, MLA_CKV_DIM), False),
                            ("kpe_cache", torch.bfloat16, (num_keys, MLA_KPE_DIM), False))

    def __repr__(self) -> str:
        return (f"PrefillStep(num_tokens={self.num_tokens}, num_keys={self.num_keys}, heads={self.heads}, "
                f"kv_format={self.kv_format!r}, topk={self.topk}, index_heads={self.index_heads}, "
                f"index_dim={self.index_dim}, max_row_keys={self.max_row_keys}, logits_bytes={self.logits_bytes}, "
                f"lse_base_e={self.lse_base_e}, device={str(self.device)!r})")

    def check_inputs(self, q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, q_nope, q_pe, sm_scale,
                     kv_cache=None, ckv_cache=None, kpe_cache=None, attn_sink=None) -> None:
        """The per-call checks (__call__ runs them): a KernelInputError naming the first bad argument."""
        given = {"q_index_fp8": q_index_fp8, "k_index_fp8": k_index_fp8, "k_index_scale": k_index_scale,
                 "weights": weights, "ks": ks, "ke": ke, "q_nope": q_nope, "q_pe": q_pe, "kv_cache": kv_cache,
                 "ckv_cache": ckv_cache, "kpe_cache": kpe_cache}
        CHECKS.inputs(given, self._index_inputs + self._queries + self._caches, self.kv_format, self.device)
        CHECKS.real("sm_scale", sm_scale)
        if attn_sink is not None:
            CHECKS.tensor("attn_sink", attn_sink, torch.float32, (self.heads,), True, self.device)

    def __call__(self, q_index_fp8: torch.Tensor, k_index_fp8: torch.Tensor, k_index_scale: torch.Tensor,
                 weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, q_nope: torch.Tensor, q_pe: torch.Tensor,
                 sm_scale: float, *, kv_cache: torch.Tensor | None = None, ckv_cache: torch.Tensor | None = None,
                 kpe_cache: torch.Tensor | None = None, attn_sink: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step; returns the step's (output, lse) buffers (module docstring)."""
        self.check_inputs(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, q_nope, q_pe, sm_scale,
                          kv_cache, ckv_cache, kpe_cache, attn_sink)
        ops.prefill_topk_out(q_index_fp8, k_index_fp8, k_index_scale, weights, ks, ke, self.topk_indices,
                             max_row_keys=self.max_row_keys, logits_bytes=self.logits_bytes)
        # The keys as one page of S tokens: key ids are its rows.
        pages = {name: None if t is None else t.unsqueeze(0)
                 for name, t in (("kv_cache", kv_cache), ("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache))}
        ops.sparse_mla_decode_out(q_nope, q_pe, self.topk_indices, sm_scale, self.output, self.lse, **pages,
                                  attn_sink=attn_sink, lse_base_e=self.lse_base_e)
        return self.output, self.lse
