"""DeepGEMM's indexer API, the FP8 (e4m3) path, served by dsactl's kernels: `import dsactl.compat.deep_gemm as
deep_gemm` where an engine imports deep_gemm for the lightning indexer's logits.

Names, arguments, defaults and outputs are DeepGEMM's (its csrc/apis/attention.hpp): logits come back as a
[T, S] (or compressed [T, max_seqlen_k]) view of rows padded to whole key tiles, float32 unless
`logits_dtype` says bfloat16. Served: `fp8_mqa_logits`, `fp8_fp4_mqa_logits` with an FP8 q (`(q, None)`),
`get_num_sms` / `set_num_sms`. What is not served yet raises CompatError naming it: FP4 inputs, and the paged
decode forms (`get_paged_mqa_logits_metadata`, `fp8_paged_mqa_logits`, `fp8_fp4_paged_mqa_logits`), whose
kernel is dsactl's own decode indexer behind its own contract (dsactl.ops.indexer_topk) for now.
"""

from __future__ import annotations

from typing import Optional

import torch

from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.indexer.mqa_logits import mqa_logits

# Logits rows are padded to whole key tiles of this many elements (DeepGEMM pads to its block and to
# 1024-byte rows): the kernel's stores never straddle a row.
ROW_ALIGN = 256

_num_sms: Optional[int] = None


class CompatError(KernelInputError):
    """A DeepGEMM call dsactl does not serve (yet)."""


def set_num_sms(num_sms: int) -> None:
    """The SM count get_num_sms reports (DeepGEMM's knob for leaving SMs to other work)."""
    global _num_sms
    if not 0 < num_sms <= torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count:
        raise CompatError(f"set_num_sms: {num_sms} is not between 1 and this GPU's SM count")
    _num_sms = num_sms


def get_num_sms() -> int:
    if _num_sms is not None:
        return _num_sms
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _padded(rows: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    stride = -(-max(width, 1) // ROW_ALIGN) * ROW_ALIGN
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
    k, k_scale = kv
    if max_seqlen_k < 0:
        raise CompatError(f"fp8_fp4_mqa_logits: max_seqlen_k {max_seqlen_k} < 0")
    compressed = max_seqlen_k > 0
    if compressed and clean_logits:
        raise CompatError("fp8_fp4_mqa_logits: compressed logits (max_seqlen_k > 0) take clean_logits=False")
    width = max_seqlen_k if compressed else k.shape[0]
    logits = _padded(q_fp.shape[0], width, logits_dtype, q_fp.device)
    mqa_logits(q_fp, k, k_scale, weights, cu_seq_len_k_start, cu_seq_len_k_end, logits, clean=clean_logits,
               compressed=compressed)
    return logits


def fp8_mqa_logits(q: torch.Tensor, kv, weights: torch.Tensor, cu_seq_len_k_start: torch.Tensor,
                   cu_seq_len_k_end: torch.Tensor, clean_logits: bool = True, max_seqlen_k: int = 0) -> torch.Tensor:
    """DeepGEMM's older name: fp8_fp4_mqa_logits with an FP8 q and float32 logits."""
    return fp8_fp4_mqa_logits((q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                              max_seqlen_k, torch.float32)


def _paged_not_served(name: str):
    def refuse(*args, **kwargs):
        raise CompatError(f"{name}: the paged decode logits are not served through the DeepGEMM API yet; "
                          "dsactl.ops.indexer_topk scores and selects a paged FP8 cache in one call")
    refuse.__name__ = name
    return refuse


get_paged_mqa_logits_metadata = _paged_not_served("get_paged_mqa_logits_metadata")
fp8_paged_mqa_logits = _paged_not_served("fp8_paged_mqa_logits")
fp8_fp4_paged_mqa_logits = _paged_not_served("fp8_fp4_paged_mqa_logits")
