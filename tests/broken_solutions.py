"""Deliberately broken solutions (and correct ones) that dsactl verify must judge right.

Each broken one is the reference plus one classic bug of shipped DSA kernels. They
take the definitions' destination-passing signatures, so the runner calls them
exactly like real kernels. Tests only.
"""

from __future__ import annotations

import math

import torch

from dsactl.definitions import get
from dsactl.definitions import indexer as indexer_def
from dsactl.definitions import topk as topk_def
from dsactl.definitions.attention import reference as attention_reference
from dsactl.fp8 import PAGE_SIZE, dequantize_index_k


def reference_solution(definition: str):
    """Any definition's reference as a destination-passing solution."""
    d = get(definition)

    def solve(*args):
        n = len(d.input_names)
        expected = d.run_reference(dict(zip(d.input_names, args[:n])))
        for out, name in zip(args[n:], d.output_names):
            out.copy_(expected[name])

    solve.__name__ = f"reference[{definition}]"
    return solve


def _indexer(q, k, w, seq_lens, block_table, topk_indices):
    next_n = q.shape[1] if q.dim() == 4 else 1
    return indexer_def.reference(q, k, w, seq_lens, block_table, topk=topk_indices.shape[-1], next_n=next_n)


def correct_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    topk_indices.copy_(_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices))


def correct_topk(scores, lengths, block_table, row_to_batch, topk_indices):
    topk_indices.copy_(topk_def.reference(scores, lengths, block_table, row_to_batch, topk=topk_indices.shape[-1]))


def correct_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse):
    out, l2 = attention_reference(q_nope, q_pe, sparse_indices, sm_scale, ckv_cache=ckv_cache, kpe_cache=kpe_cache)
    output.copy_(out)
    lse.copy_(l2)


# ---------------------------------------------------------------- broken top-k / indexer

def drops_index(scores, lengths, block_table, row_to_batch, topk_indices):
    """Loses each row's best token: an off-by-one that keeps ranks 2..k+1."""
    k = topk_indices.shape[-1]
    ranked = topk_def.reference(scores, lengths, block_table, row_to_batch, topk=k + 1)  # descending rank order
    topk_indices.copy_(ranked[:, 1:])


def duplicates_one(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    """Writes a row's first id into its second slot too."""
    out = _indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)
    out[..., 1] = torch.where(out[..., 1] >= 0, out[..., 0], out[..., 1])
    topk_indices.copy_(out)


def off_by_one_page(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    """Translates through the next page id: block_table[b, p] + 1."""
    out = _indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices)
    topk_indices.copy_(torch.where(out >= 0, out + PAGE_SIZE, out))


def minus_one_where_due(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    """Counts whole pages only (seq_len // 64): the last partial page's tokens become -1."""
    whole = seq_lens // PAGE_SIZE * PAGE_SIZE
    out = _indexer(q_index_fp8, k_index_cache_fp8, weights, whole, block_table, topk_indices)
    topk_indices.copy_(out)


def other_tie_order(scores, lengths, block_table, row_to_batch, topk_indices):
    """A legal answer the reference does not give: among equal scores prefer later
    positions, and write the ids back to front with the -1 padding first."""
    k = topk_indices.shape[-1]
    topk_indices.fill_(-1)
    for r in range(scores.shape[0]):
        length, b = int(lengths[r]), int(row_to_batch[r])
        if length <= 0:
            continue
        key = topk_def.rank_key(scores[r, :length]).flip(0)
        chosen = length - 1 - torch.argsort(key, descending=True, stable=True)[: min(k, length)]
        physical = block_table[b, chosen // PAGE_SIZE] * PAGE_SIZE + chosen % PAGE_SIZE
        topk_indices[r, k - chosen.numel():] = physical.flip(0).to(torch.int32)


def other_tie_order_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, topk_indices):
    """The indexer's scores computed here, then other_tie_order's choice among ties."""
    batch, k = q_index_fp8.shape[0], topk_indices.shape[-1]
    heads = q_index_fp8.shape[-2]
    max_len = block_table.shape[1] * PAGE_SIZE
    scores = torch.full((batch, max_len), float("-inf"))
    for b in range(batch):
        seq_len = int(seq_lens[b])
        pages = block_table[b, : (seq_len + PAGE_SIZE - 1) // PAGE_SIZE].long()
        keys = dequantize_index_k(k_index_cache_fp8[pages]).reshape(-1, 128)[:seq_len]
        q = q_index_fp8[b].float().reshape(heads, 128)
        scores[b, :seq_len] = (torch.relu(q @ keys.T) * weights[b].float()[:, None]).sum(dim=0)
    rows = torch.arange(batch, dtype=torch.int32)
    other_tie_order(scores, seq_lens, block_table, rows, topk_indices.view(batch, k))


# ---------------------------------------------------------------- broken attention

def never_writes_last(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse):
    """Stops one element short: the last output element keeps what the buffer held."""
    out, l2 = attention_reference(q_nope, q_pe, sparse_indices, sm_scale, ckv_cache=ckv_cache, kpe_cache=kpe_cache)
    output.view(-1)[:-1].copy_(out.reshape(-1)[:-1])
    lse.copy_(l2)


def returns_nan(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse):
    """Computes a NaN (0/0) in one element."""
    correct_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse)
    zero = torch.zeros((), device=output.device)
    output[0, 0, 0] = zero / zero


def lse_base_e(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse):
    """Returns the natural-log lse where the contract asks for base 2."""
    correct_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, output, lse)
    lse.mul_(math.log(2.0))
