"""Ragged MQA logits of the lightning indexer at prefill (Triton): every query row scored against a
contiguous FP8 key array, each row over its own key range [ks, ke), the form DeepGEMM's fp8_mqa_logits
computes for engines' prefill.

Contract (T query rows, H heads, D head dim, S keys):
  q        float8_e4m3fn [T, H, D] contiguous, H in HEADS, D in DIMS
  k        float8_e4m3fn [S, D] contiguous; k_scale float32 [S] (one positive dequant scale a key)
  weights  float32 [T, H], heads contiguous (the row stride is free)
  ks, ke   int32 [T]: row i sees keys ks[i] <= s < ke[i] (clamped to [0, S])
  logits   float32 or bfloat16 [T, W], unit column stride                       (written)

  logit(i, s) = k_scale[s] * sum_h weights[i, h] * relu(q[i, h] . k[s])   (fp32 accumulation)

Full form (W = S): logits[i, s] = logit(i, s) inside the row's range; outside it -inf where `clean`,
else left as they were (the caller ignores them, as DeepGEMM's callers do). Compressed form (W <
S, `compressed`): logits[i, j] = logit(i, ks[i] + j) for 0 <= j < ke[i] - ks[i] (and j < W); the rest
of the row is left as it was. The per-key scale is positive, so it factors out of the ReLU and is
applied once after the head sum. Every element is computed by one program in a fixed order: the
same inputs give the same bits on every call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from ..launch_math import cdiv
from ..triton_options import FP_FUSION
from .score import _num_sms
from .shapes import HEADS as INDEX_HEADS
from .shapes import PREFILL_DIMS

HEADS = INDEX_HEADS  # sm_90's index head counts (DeepGEMM's too)
DIMS = PREFILL_DIMS
LOGITS_DTYPES = (torch.float32, torch.bfloat16)
# Query rows x heads of a program: the N side of one 128-wide dot, so each key tile read from memory
# feeds 128 // H query rows.
ROWS_X_HEADS = 128
BLOCK_KEYS = 128  # keys per step: the M side of the dot
NUM_WARPS = 8  # a 128 x 128 fp32 accumulator is 64 values a thread at 8 warps
NUM_STAGES = 3
PROGRAMS_PER_SM = 4  # the key range is split until the grid covers the SMs this many times


@triton.jit
def _store_inf(logits_ptr, stride, rows, real_row, tile0, num_keys, BLOCK_KEYS: tl.constexpr, BLOCK_M: tl.constexpr):
    pos = tile0 + tl.arange(0, BLOCK_KEYS)
    tl.store(logits_ptr + rows[None, :].to(tl.int64) * stride + pos[:, None],
             tl.full([BLOCK_KEYS, BLOCK_M], float("-inf"), logits_ptr.dtype.element_ty),
             mask=(pos < num_keys)[:, None] & real_row[None, :])


@triton.jit
def row_block_ranges(ks_ptr, ke_ptr, rb, num_rows, num_keys, BLOCK_M: tl.constexpr):
    """Row block rb's rows, which are real (< num_rows), their raw starts, ranges clamped to the keys [ks, ke),
    and the keys any of them sees [lo, hi) (an empty block sees [num_keys, 0))."""
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    real_row = rows < num_rows
    ks_raw = tl.load(ks_ptr + rows, mask=real_row, other=0)
    ks = tl.minimum(tl.maximum(ks_raw, 0), num_keys)
    ke = tl.minimum(tl.maximum(tl.load(ke_ptr + rows, mask=real_row, other=0), ks), num_keys)
    lo = tl.min(tl.where(real_row & (ke > ks), ks, num_keys), 0)
    hi = tl.max(tl.where(real_row & (ke > ks), ke, 0), 0)
    return rows, real_row, ks_raw, ks, ke, lo, hi


@triton.jit
def row_block_query(q_ptr, w_ptr, w_stride, rb, num_rows, HEADS: tl.constexpr, DIM: tl.constexpr,
                    BLOCK_M: tl.constexpr):
    """Row block rb's q transposed, [DIM, BLOCK_M * HEADS] (keys are the dot's M side, so the head sum stays in
    a thread's row), and its weights [BLOCK_M * HEADS]; rows past num_rows zero."""
    qh = tl.arange(0, BLOCK_M * HEADS)
    d = tl.arange(0, DIM)
    real_qh = (rb * BLOCK_M + qh // HEADS) < num_rows
    q = tl.load(q_ptr + (rb * BLOCK_M * HEADS + qh).to(tl.int64)[:, None] * DIM + d[None, :],
                mask=real_qh[:, None], other=0.0)
    w = tl.load(w_ptr + (rb * BLOCK_M + qh // HEADS).to(tl.int64) * w_stride + qh % HEADS, mask=real_qh, other=0.0)
    return tl.trans(q), w


@triton.jit
def tile_logits(k_ptr, k_scale_ptr, t, qt, w, num_keys, HEADS: tl.constexpr, DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_KEYS: tl.constexpr):
    """Key tile t against a row block: (its key positions [BLOCK_KEYS], their logits [BLOCK_KEYS, BLOCK_M])."""
    pos = t * BLOCK_KEYS + tl.arange(0, BLOCK_KEYS)
    live = pos < num_keys
    k = tl.load(k_ptr + pos.to(tl.int64)[:, None] * DIM + tl.arange(0, DIM)[None, :], mask=live[:, None], other=0.0)
    scale = tl.load(k_scale_ptr + pos, mask=live, other=0.0)
    s = tl.dot(k, qt)  # [BLOCK_KEYS, BLOCK_M * HEADS] fp32
    weighted = tl.maximum(s, 0.0) * w[None, :]
    return pos, tl.sum(tl.reshape(weighted, (BLOCK_KEYS, BLOCK_M, HEADS)), axis=2) * scale[:, None]


@triton.jit(do_not_specialize=["num_rows", "num_keys", "width", "tiles_per_program"])
def mqa_logits_kernel(
    q_ptr,  # *fp8e4nv [T, HEADS, DIM]
    k_ptr,  # *fp8e4nv [S, DIM]
    k_scale_ptr,  # *fp32 [S]
    w_ptr,  # *fp32 [T, w_stride]
    ks_ptr, ke_ptr,  # *i32 [T]
    logits_ptr,  # *fp32 | *bf16 [T, logits_stride]
    w_stride, logits_stride,
    num_rows, num_keys, width,  # T, S, W
    tiles_per_program,  # key tiles of BLOCK_KEYS a program owns, contiguous
    HEADS: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_KEYS: tl.constexpr,
    STAGES: tl.constexpr, CLEAN: tl.constexpr, COMPRESSED: tl.constexpr,
):
    """Program (r, c): query rows r * BLOCK_M .. + BLOCK_M against the c-th run of key tiles; tiles no
    row of the block sees are not read (and filled with -inf where CLEAN)."""
    tl.static_assert(not (CLEAN and COMPRESSED), "a compressed row has no outside to clean")
    rb = tl.program_id(0)
    chunk = tl.program_id(1)
    rows, real_row, ks_raw, ks, ke, lo, hi = row_block_ranges(ks_ptr, ke_ptr, rb, num_rows, num_keys, BLOCK_M)
    qt, w = row_block_query(q_ptr, w_ptr, w_stride, rb, num_rows, HEADS, DIM, BLOCK_M)

    first = chunk * tiles_per_program
    last = tl.minimum(first + tiles_per_program, tl.cdiv(num_keys, BLOCK_KEYS))  # tile indices [first, last)
    t_lo = tl.maximum(first, lo // BLOCK_KEYS)
    t_hi = tl.minimum(last, tl.cdiv(hi, BLOCK_KEYS))
    t_hi = tl.maximum(t_hi, t_lo)
    for t in tl.range(t_lo, t_hi, num_stages=STAGES):
        pos, logit = tile_logits(k_ptr, k_scale_ptr, t, qt, w, num_keys, HEADS, DIM, BLOCK_M, BLOCK_KEYS)
        live = pos < num_keys
        seen = (pos[:, None] >= ks[None, :]) & (pos[:, None] < ke[None, :]) & real_row[None, :]
        if COMPRESSED:
            col = pos[:, None] - ks_raw[None, :]
            tl.store(logits_ptr + rows[None, :].to(tl.int64) * logits_stride + col,
                     logit.to(logits_ptr.dtype.element_ty), mask=seen & (col >= 0) & (col < width))
        else:
            out = tl.where(seen, logit, float("-inf"))
            if CLEAN:
                written = live[:, None] & real_row[None, :]
            else:
                written = seen
            tl.store(logits_ptr + rows[None, :].to(tl.int64) * logits_stride + pos[:, None],
                     out.to(logits_ptr.dtype.element_ty), mask=written)
    if CLEAN:
        for t in range(first, t_lo):
            _store_inf(logits_ptr, logits_stride, rows, real_row, t * BLOCK_KEYS, num_keys, BLOCK_KEYS, BLOCK_M)
        for t in range(t_hi, last):
            _store_inf(logits_ptr, logits_stride, rows, real_row, t * BLOCK_KEYS, num_keys, BLOCK_KEYS, BLOCK_M)


def check_inputs(q, k, k_scale, weights, ks, ke, logits=None) -> tuple[int, int, int, int]:
    """(T, H, D, S) of a valid call, else KernelInputError naming the tensor (logits None: the inputs only)."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise KernelInputError(f"mqa_logits: {what}")

    need(q.dim() == 3 and q.dtype == torch.float8_e4m3fn and q.is_contiguous(),
         f"q must be float8_e4m3fn [T, H, D] contiguous (got {q.dtype} {tuple(q.shape)})")
    T, H, D = q.shape
    need(H in HEADS, f"{H} heads: served are {HEADS}")
    need(D in DIMS, f"head dim {D}: served are {DIMS}")
    need(k.dim() == 2 and k.dtype == torch.float8_e4m3fn and k.is_contiguous() and k.shape[1] == D,
         f"k must be float8_e4m3fn [S, {D}] contiguous (got {k.dtype} {tuple(k.shape)})")
    S = k.shape[0]
    need(k_scale.shape == (S,) and k_scale.dtype == torch.float32 and k_scale.is_contiguous(),
         f"k_scale must be float32 [{S}] contiguous (got {k_scale.dtype} {tuple(k_scale.shape)})")
    need(weights.shape == (T, H) and weights.dtype == torch.float32 and weights.stride(1) == 1,
         f"weights must be float32 [{T}, {H}] with contiguous heads (got {weights.dtype} {tuple(weights.shape)})")
    for name, t in (("ks", ks), ("ke", ke)):
        need(t.shape == (T,) and t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be int32 [{T}] contiguous")
    if logits is not None:
        need(logits.dim() == 2 and logits.shape[0] == T and logits.dtype in LOGITS_DTYPES and logits.stride(1) == 1,
             f"logits must be float32 or bfloat16 [{T}, W] with unit column stride (got {logits.dtype} "
             f"{tuple(logits.shape)})")
    devices = {t.device for t in (q, k, k_scale, weights, ks, ke, logits) if t is not None}
    need(len(devices) == 1, f"tensors on several devices: {sorted(map(str, devices))}")
    return T, H, D, S


def mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor, ks: torch.Tensor,
               ke: torch.Tensor, logits: torch.Tensor, *, clean: bool = True, compressed: bool = False) -> None:
    """Write the logits of the module contract into `logits` ([T, S], or [T, W] when compressed)."""
    T, H, D, S = check_inputs(q, k, k_scale, weights, ks, ke, logits)
    width = logits.shape[1]
    if compressed and clean:
        raise KernelInputError("mqa_logits: a compressed row has no outside to clean (clean=False)")
    if not compressed and width != S:
        raise KernelInputError(f"mqa_logits: full-form logits are [T, {S}] (got width {width}; compressed=True "
                               "for rows relative to their start)")
    if T == 0 or width == 0:
        return
    block_m = ROWS_X_HEADS // H
    row_blocks = cdiv(T, block_m)
    tiles = cdiv(S, BLOCK_KEYS) if S else 1
    chunks = max(1, min(tiles, cdiv(_num_sms(q.device) * PROGRAMS_PER_SM, row_blocks)))
    per_program = cdiv(tiles, chunks)
    chunks = cdiv(tiles, per_program)
    mqa_logits_kernel[(row_blocks, chunks)](
        q, k, k_scale, weights, ks, ke, logits, weights.stride(0), logits.stride(0), T, S, width, per_program,
        HEADS=H, DIM=D, BLOCK_M=block_m, BLOCK_KEYS=BLOCK_KEYS, STAGES=NUM_STAGES, CLEAN=clean,
        COMPRESSED=compressed, num_warps=NUM_WARPS, num_stages=NUM_STAGES, enable_fp_fusion=FP_FUSION)


_SIGNATURE = {
    "q_ptr": "*fp8e4nv", "k_ptr": "*fp8e4nv", "k_scale_ptr": "*fp32", "w_ptr": "*fp32", "ks_ptr": "*i32",
    "ke_ptr": "*i32", "logits_ptr": "*fp32", "w_stride": "i32", "logits_stride": "i32", "num_rows": "i32",
    "num_keys": "i32", "width": "i32", "tiles_per_program": "i32",
}
# The forms an engine's prefill calls: full rows cleaned (DeepGEMM's default), full rows left, compressed rows.
FORMS = {"clean": (True, False), "full": (False, False), "compressed": (False, True)}


def aot_specs() -> list[dict]:
    """Every (heads, head dim, form) configuration with float32 logits, for `dsactl build`."""
    specs = []
    for heads in HEADS:
        for dim in DIMS:
            for form, (clean, compressed) in FORMS.items():
                constexprs = {"HEADS": heads, "DIM": dim, "BLOCK_M": ROWS_X_HEADS // heads, "BLOCK_KEYS": BLOCK_KEYS,
                              "STAGES": NUM_STAGES, "CLEAN": clean, "COMPRESSED": compressed}
                specs.append({
                    "name": f"mqa_logits_h{heads}_d{dim}_{form}",
                    "fn": mqa_logits_kernel,
                    "signature": {**_SIGNATURE, **{k: "constexpr" for k in constexprs}},
                    "constexprs": constexprs,
                    "num_warps": NUM_WARPS,
                    "num_stages": NUM_STAGES,
                })
    return specs
