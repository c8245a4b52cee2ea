"""DeepGEMM's indexer API, the FP8 (e4m3) path, served by dsactl's kernels: `import dsactl.compat.deep_gemm as
deep_gemm` where an engine imports deep_gemm for the lightning indexer's logits.

Names, arguments, defaults and outputs are DeepGEMM's (its csrc/apis/attention.hpp): logits come back as a
[T, S] (or compressed [T, max_seqlen_k]) view of rows padded to whole key tiles, float32 unless
`logits_dtype` says bfloat16. Served, with an FP8 q (`(q, None)`): the ragged prefill logits
(`fp8_mqa_logits`, `fp8_fp4_mqa_logits`, on kernels/indexer/mqa_logits.py) and the paged decode logits
(`get_paged_mqa_logits_metadata`, `fp8_paged_mqa_logits`, `fp8_fp4_paged_mqa_logits`, on the decode indexer's
scoring kernel, kernels/indexer/score.py: 64-token blocks, 32/64 heads of dim 128, 1-4 rows a request);
`get_num_sms` / `set_num_sms`. What is not served raises CompatError naming it: FP4 inputs, other block
sizes, varlen rows (`indices`). bfloat16 logits are the float32 ones converted (a second pass).
"""

from __future__ import annotations

from typing import Optional

import torch

from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.launch_math import cdiv
from dsactl.kernels.indexer import mqa_logits as ragged
from dsactl.kernels.indexer.score import score
from dsactl.kernels.indexer.shapes import HEADS as PAGED_HEADS

# Logits rows are padded to whole key tiles of this many elements, so the kernel's stores never straddle a
# row (1024 bytes of fp32; DeepGEMM pads bf16 rows to 1024 bytes too, 512 elements).
ROW_ALIGN = 256

_num_sms: Optional[int] = None


class CompatError(KernelInputError):
    """A DeepGEMM call dsactl does not serve (yet)."""


def _device_sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def set_num_sms(num_sms: int) -> None:
    """The SM count get_num_sms reports (DeepGEMM's knob for leaving SMs to other work)."""
    global _num_sms
    if not 0 < num_sms <= _device_sms():
        raise CompatError(f"set_num_sms: {num_sms} is not between 1 and this GPU's SM count")
    _num_sms = num_sms


def get_num_sms() -> int:
    return _num_sms if _num_sms is not None else _device_sms()


def _padded(rows: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    stride = cdiv(max(width, 1), ROW_ALIGN) * ROW_ALIGN
    return torch.empty(rows, stride, dtype=dtype, device=device)[:, :width]


def fp8_fp4_mqa_logits(q, kv, weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor,
                       cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True, max_seqlen_k: int = 0,
                       logits_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Ragged prefill logits: q = (float8_e4m3fn [T, H, D], None), kv = (float8_e4m3fn [S, D], float32 [S]),
    weights float32 [T, H]; row i scores keys [cu_seq_len_k_start[i], cu_seq_len_k_end[i]). max_seqlen_k 0:
    logits [T, S], -inf outside each row's keys where clean_logits; else compressed [T, max_seqlen_k], entry j
    of row i the key cu_seq_len_k_start[i] + j (clean_logits must then be False, as in DeepGEMM)."""
    q_fp, q_sf = q
    if q_sf is not None:
        raise CompatError("fp8_fp4_mqa_logits: FP4 q (a scale tensor in q) is not served; pass (q_fp8, None)")
    _check_sm90("fp8_fp4_mqa_logits", q_fp, weights, ragged.HEADS, ragged.DIMS)
    k, k_scale = kv
    if max_seqlen_k < 0:
        raise CompatError(f"fp8_fp4_mqa_logits: max_seqlen_k {max_seqlen_k} < 0")
    compressed = max_seqlen_k > 0
    if compressed and clean_logits:
        raise CompatError("fp8_fp4_mqa_logits: compressed logits (max_seqlen_k > 0) take clean_logits=False")
    width = max_seqlen_k if compressed else k.shape[0]
    logits = _padded(q_fp.shape[0], width, logits_dtype, q_fp.device)
    ragged.mqa_logits(q_fp, k, k_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, logits, clean=clean_logits,
                      compressed=compressed)
    return logits


def fp8_mqa_logits(q: torch.Tensor, kv, weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor,
                   cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
    """DeepGEMM's older name: fp8_fp4_mqa_logits with an FP8 q and float32 logits."""
    return fp8_fp4_mqa_logits((q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                              max_seqlen_k, torch.float32)


PAGED_BLOCK_KV = 64  # the index cache page dsactl's decode indexer reads (8448 bytes: 64 x 128 e4m3, 64 fp32 scales)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DeepGEMM's schedule for fp8_paged_mqa_logits, in its shape (int32 [num_sms + 1, 2]) for callers that
    keep or check it. dsactl's kernel splits the rows itself and never reads it, so it holds zeros; the call
    checks what the logits call will need."""
    _check_paged(block_kv, indices)
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)


PAGED_HEAD_DIM = 128  # the index cache's key dim


def _check_sm90(who: str, q: torch.Tensor, weights: torch.Tensor, heads: tuple[int, ...],
                dims: tuple[int, ...]) -> None:
    """What DeepGEMM serves on sm_100 only (other head counts and dims, bf16 weights) is refused here, naming it."""
    if q.shape[-2] not in heads:
        raise CompatError(f"{who}: {q.shape[-2]} heads are DeepGEMM's sm_100 path, not served (only {heads})")
    if q.shape[-1] not in dims:
        raise CompatError(f"{who}: head dim {q.shape[-1]} is DeepGEMM's sm_100 path, not served (only {dims})")
    if weights.dtype != torch.float32:
        raise CompatError(f"{who}: {weights.dtype} weights are DeepGEMM's sm_100 path, not served (float32 only)")


def _check_paged(block_kv: int, indices) -> None:
    if block_kv != PAGED_BLOCK_KV:
        raise CompatError(f"paged mqa logits: block_kv {block_kv} is not served (only {PAGED_BLOCK_KV})")
    if indices is not None:
        raise CompatError("paged mqa logits: varlen rows (indices) are not served")


def fp8_fp4_paged_mqa_logits(q, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                             block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                             clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32,
                             indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode logits over a paged FP8 index cache: q = (float8_e4m3fn [B, next_n, H, 128], None), kv_cache
    uint8 [num_blocks, 64, 1, 132], weights float32 [B * next_n, H], context_lens int32 [B, next_n] (each row its
    own count; DeepGEMM's form) or [B] (earlier DeepGEMM's: token j of a request sees context_len - next_n + j + 1
    keys), block_table
    int32 [B, max_blocks]. Returns logits [B * next_n, max_context_len]: each row's visible keys scored,
    -inf past them up to the request's longest row, and -inf everywhere past that where clean_logits (else
    unspecified there, as in DeepGEMM)."""
    q_fp, q_sf = q
    if q_sf is not None:
        raise CompatError("fp8_fp4_paged_mqa_logits: FP4 q (a scale tensor in q) is not served; pass (q_fp8, None)")
    _check_paged(kv_cache.shape[1] if kv_cache.dim() == 4 else -1, indices)
    _check_sm90("fp8_fp4_paged_mqa_logits", q_fp, weights, PAGED_HEADS, (PAGED_HEAD_DIM,))
    if logits_dtype not in (torch.float32, torch.bfloat16):
        raise CompatError(f"fp8_fp4_paged_mqa_logits: logits_dtype {logits_dtype} is not float32 or bfloat16")
    rows = q_fp.shape[0] * q_fp.shape[1]
    width = max(max_context_len, block_table.shape[1] * PAGED_BLOCK_KV)
    scores = _padded(rows, width, torch.float32, q_fp.device)
    lengths = torch.empty(rows, dtype=torch.int32, device=q_fp.device)
    score(q_fp, kv_cache.view(torch.int8), weights, context_lens, block_table, scores, lengths)
    logits = scores[:, :max_context_len]
    if clean_logits:
        past = torch.arange(max_context_len, device=q_fp.device)[None, :] >= lengths[:, None]
        logits.masked_fill_(past, float("-inf"))
    return logits if logits_dtype == torch.float32 else logits.to(logits_dtype)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor, schedule_meta: torch.Tensor,
                         max_context_len: int, clean_logits: bool = False,
                         indices: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DeepGEMM's older name: fp8_fp4_paged_mqa_logits with an FP8 q and float32 logits."""
    return fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table, schedule_meta,
                                    max_context_len, clean_logits, torch.float32, indices)
