"""A pure-PyTorch model of topk.cu's algorithm, step for step, for CPU tests.

Same keys (order-preserving, -0.0 == +0.0, NaN key 1 below -inf, key 0 free for positions past
a row's length), same 11-bit levels, same choice of kernel (max_len <= ROW_MAX_LEN: one CTA per
row with every key on chip; longer: a cluster per row), same split of a row into cluster chunks
and same per-chunk source (shared-memory key cache, global memory, or compacted candidates),
same threshold search, same emission rule (strictly greater elements take [0, k - k_rem), ties
share the k_rem remaining slots). The histograms are torch.bincount and the chunks run one
after another, which is the only difference: the kernel's output *order* may differ, its set
may not. `trace` records which path each row and chunk took so tests can prove they exercised
the register-resident kernel and the candidate overflow fallback.
"""

from __future__ import annotations

import torch

from ..bad_index import MAX_PAGES
from ..fp8 import PAGE_SIZE

DIGIT_BITS = 11
BINS = 1 << DIGIT_BITS
CHUNK_ALIGN = 8
CANDIDATE_BYTES = 8
ROW_MAX_LEN = 8192  # topk_row.cuh kRowMaxLen: up to this max_len the register-resident kernel runs
NAN_KEY = 1  # topk_common.cuh kNanKey


def key_bits(dtype: torch.dtype) -> int:
    if dtype == torch.float32:
        return 32
    if dtype == torch.bfloat16:
        return 16
    raise ValueError(f"scores must be float32 or bfloat16, got {dtype}")


def radix_keys(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys whose unsigned order is the contract's order of the scores."""
    bits = key_bits(scores.dtype)
    full = (1 << bits) - 1
    sign = 1 << (bits - 1)
    raw = scores.view(torch.int32 if bits == 32 else torch.int16).to(torch.int64) & full
    raw = torch.where(raw == sign, 0, raw)  # -0.0 -> +0.0
    key = torch.where(raw & sign != 0, ~raw & full, raw | sign)
    return torch.where(torch.isnan(scores), NAN_KEY, key)  # NaN below -inf, whose key is 2**(bits - 9) - 1


def levels(bits: int) -> list[tuple[int, int]]:
    """(shift, digit mask in key position) per level: fp32 11+11+10 bits, bf16 11+5."""
    out, top = [], bits
    while top > 0:
        shift = max(top - DIGIT_BITS, 0)
        out.append((shift, ((1 << (top - shift)) - 1) << shift))
        top = shift
    return out


def find_threshold(hist: torch.Tensor, k_rem: int) -> tuple[int, int]:
    """The bin T with count(bins above T) < k_rem <= count(bins >= T); returns (T, above)."""
    at_or_above = hist.flip(0).cumsum(0).flip(0)
    above = at_or_above - hist
    bin_ = int(torch.nonzero((above < k_rem) & (k_rem <= at_or_above))[0])
    return bin_, int(above[bin_])


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def select_row(keys: torch.Tensor, k: int, bits: int, cluster_size: int, region_bytes: int,
               trace: list[str] | None = None) -> torch.Tensor:
    """Logical positions of the top k of one row's keys (len(keys) > k), in emission order."""
    length = keys.numel()
    chunk = ceil_div(ceil_div(length, cluster_size), CHUNK_ALIGN) * CHUNK_ALIGN
    cached = chunk * (bits // 8) <= region_bytes  # the shared-memory cache holds the chunk's keys
    candidate_capacity = region_bytes // CANDIDATE_BYTES
    # Per chunk: the positions its passes visit (all of the chunk, or the compacted candidates).
    source = [torch.arange(min(r * chunk, length), min(r * chunk + chunk, length)) for r in range(cluster_size)]
    compacted = [False] * cluster_size
    emitted: list[torch.Tensor] = []  # strictly greater elements written by compaction passes

    mask = value = 0
    k_rem = k
    lvls = levels(bits)
    for level, (shift, digit_mask) in enumerate(lvls):
        local = []
        for r in range(cluster_size):
            active = source[r][(keys[source[r]] & mask) == value]
            local.append(torch.bincount((keys[active] & digit_mask) >> shift, minlength=BINS))
        total = torch.stack(local).sum(0)
        bin_, above = find_threshold(total, k_rem)
        k_rem -= above
        mask |= digit_mask
        value |= bin_ << shift
        if int(total[bin_]) == k_rem or level + 1 == len(lvls):
            break
        for r in range(cluster_size):
            local_eq = int(local[r][bin_])
            if not cached and not compacted[r] and local_eq <= candidate_capacity:
                # Compaction pass: write everything above the prefix, keep the prefix's elements.
                chunk_pos = source[r]
                masked = keys[chunk_pos] & mask
                emitted.append(chunk_pos[masked > value])
                source[r] = chunk_pos[masked == value]
                compacted[r] = True
                if trace is not None:
                    trace.append(f"compact level={level} chunk={r} candidates={local_eq}")
            elif not cached and not compacted[r] and trace is not None:
                trace.append(f"overflow level={level} chunk={r} candidates={local_eq} capacity={candidate_capacity}")

    greater, ties = [*emitted], []
    for r in range(cluster_size):
        masked = keys[source[r]] & mask
        greater.append(source[r][masked > value])
        ties.append(source[r][masked == value])
    tie_positions = torch.cat(ties)[:k_rem]  # chunks claim tie slots in turn, as the kernel's counter does
    chosen = torch.cat([*greater, tie_positions])
    assert chosen.numel() == k, "the threshold search must account for exactly k elements"
    return chosen


def topk_page_transform_model(scores: torch.Tensor, lengths: torch.Tensor, block_table: torch.Tensor,
                              row_to_batch: torch.Tensor | None, topk: int, cluster_size: int = 1,
                              region_bytes: int = 206 * 1024, trace: list[str] | None = None,
                              num_pages: int = MAX_PAGES) -> tuple[torch.Tensor, int]:
    """(int32 [rows, topk], masked ids): the model's output and device count for the launcher's
    contract (launcher.py), bad batches and pages outside [0, num_pages) masked as -1.
    cluster_size and region_bytes are the cluster kernel's launch (the launcher derives them
    from the GPU); rows of max_len <= ROW_MAX_LEN take the register-resident kernel instead:
    one CTA, every key on chip, so the search never leaves the chip."""
    rows, max_len = scores.shape
    keys = radix_keys(scores)
    bits = key_bits(scores.dtype)
    if max_len <= ROW_MAX_LEN:
        cluster_size, region_bytes = 1, ceil_div(max_len, CHUNK_ALIGN) * CHUNK_ALIGN * bits // 8
        if trace is not None:
            trace.append(f"row-kernel max_len={max_len}")
    out = torch.full((rows, topk), -1, dtype=torch.int32)
    masked = 0
    for r in range(rows):
        length = min(max(int(lengths[r]), 0), max_len, block_table.shape[1] * PAGE_SIZE)
        b = r if row_to_batch is None else int(row_to_batch[r])
        if not 0 <= b < block_table.shape[0]:  # the row's block-table row is never read
            masked += min(length, topk)
            continue
        if length <= topk:
            chosen = torch.arange(length)
        else:
            chosen = select_row(keys[r, :length], topk, bits, cluster_size, region_bytes, trace)
        page = block_table[b, chosen // PAGE_SIZE].long()
        in_cache = (page >= 0) & (page < num_pages)
        masked += int((~in_cache).sum())
        out[r, : chosen.numel()] = torch.where(in_cache, page * PAGE_SIZE + chosen % PAGE_SIZE, -1).int()
    return out, masked
