"""The contest's comparison rules (docs/design.md, Contracts), one verdict per call.

Dense outputs (attention): an element fails only if |a - r| > atol AND
|a - r| / (|r| + 1e-8) > rtol; every element must match unless the tolerance's
matched_ratio allows otherwise. Any NaN or inf fails, except -inf in the lse of
an empty row (one whose reference lse is -inf). An element whose reference is
NaN or inf otherwise (NaN or inf in the inputs) has no answer and is not judged.

Top-k id outputs (indexer, top-k): set semantics. A row is the ids its query
may choose from: the physical ids of its first `visible` logical positions,
translated through its request's block table. The row is right when it holds
min(topk, visible) distinct ids of the row, -1 in the other slots (anywhere),
and its chosen scores, sorted, equal the sorted top scores of the row: for the
indexer within tolerance (scores are recomputed here in float32, as the
reference does, and a kernel's own float arithmetic may swap near-equal
tokens); for the top-k stage exactly, since the scores are its input and
the contract is an exact top-k. Any legal tie order passes.

Bad values are masked as the definitions say: a position whose page is outside
the cache (or whose row's batch is outside the block table) is a masked
position; it ranks by its score (-inf for the indexer, whose kernel never reads
its key) and, when chosen, is written as -1. So a row may hold -1 in place of
up to that many due ids, provided the ids it holds plus the best masked
positions are a top set. Lengths are clamped to the block table's pages.

Every problem is a sentence that says what is wrong and where.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from dsactl.definitions import Definition
from dsactl.definitions.prefill_indexer import keys_logits, row_keys
from dsactl.definitions.topk import rank_key
from dsactl.errors import DsactlError
from dsactl.fp8 import INDEX_HEAD_DIM, PAGE_SIZE, dequantize_index_k
from dsactl.harness import INT_POISON
from dsactl.kernels.bad_index import MAX_PAGES

# Denominator floor of the relative error, as flashinfer-bench computes it.
REL_EPS = 1e-8
# A verdict keeps this many problem sentences; the rest are only counted.
MAX_PROBLEMS = 8


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-2
    rtol: float = 1e-2
    matched_ratio: float = 1.0  # fraction of compared elements that must be within tolerance

    def __post_init__(self) -> None:
        # A NaN or infinite tolerance would pass every element (a comparison with NaN is false);
        # a negative one means nothing.
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise DsactlError(f"{name} must be a finite number >= 0, got {value:g}")
        if not 0 <= self.matched_ratio <= 1:
            raise DsactlError(f"matched_ratio must be between 0 and 1, got {self.matched_ratio:g}")


@dataclass
class Verdict:
    passed: bool = True
    max_abs: float = 0.0
    max_rel: float = 0.0
    matched: float = 1.0  # fraction of compared elements (or id slots) that are right
    problems: list[str] = field(default_factory=list)
    more_problems: int = 0  # problems beyond MAX_PROBLEMS, counted but not described

    def fail(self, message: str) -> None:
        self.passed = False
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(message)
        else:
            self.more_problems += 1

    def absorb(self, other: "Verdict") -> None:
        self.passed &= other.passed
        self.max_abs = max(self.max_abs, other.max_abs)
        self.max_rel = max(self.max_rel, other.max_rel)
        self.matched = min(self.matched, other.matched)
        for p in other.problems:
            self.fail(p)
        self.more_problems += other.more_problems


def _stage(d: Definition) -> str:
    return next(t for t in d.tags if t.startswith("stage:")).removeprefix("stage:")


def check(d: Definition, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor],
          tol: Tolerance = Tolerance()) -> Verdict:
    """Judge one call's outputs against the definition's ground truth for these inputs."""
    stage = _stage(d)
    if stage == "attention":
        return check_attention(d, inputs, outputs, tol)
    if stage == "indexer":
        return check_topk_ids(outputs["topk_indices"], _indexer_rows(d, inputs), tol, exact=False)
    if stage == "topk":
        return check_topk_ids(outputs["topk_indices"], _topk_rows(inputs), tol, exact=True)
    if stage == "prefill_indexer":
        return check_prefill_ids(outputs["topk_indices"], inputs, tol)
    raise ValueError(f"no comparison rule for stage {stage!r}")


# ---------------------------------------------------------------- dense outputs

def _where(flat_index: int, shape: torch.Size) -> list[int]:
    out = []
    for size in reversed(shape):
        out.append(flat_index % size)
        flat_index //= size
    return out[::-1]


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def compare_close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance,
                  empty: torch.Tensor | None = None) -> Verdict:
    """Elementwise rule on one float output. `empty` marks elements where -inf is due
    (the lse of a row with no valid index); everywhere else NaN and inf fail."""
    v = Verdict()
    a = actual.detach().float().cpu()
    r = expected.detach().float().cpu()
    shape = a.shape
    a, r = a.reshape(-1), r.reshape(-1)
    empty = torch.zeros_like(a, dtype=torch.bool) if empty is None else empty.detach().cpu().reshape(-1)
    total = a.numel()

    undefined = ~torch.isfinite(r) & ~empty  # no answer: NaN or inf reached the reference
    nan = torch.isnan(a) & ~undefined
    inf = torch.isinf(a) & ~(empty & (a == float("-inf"))) & ~undefined
    for mask, what in ((nan, "NaN"), (inf, "inf")):
        count = int(mask.sum())
        if count:
            i = int(mask.nonzero()[0])
            v.fail(f"{name}: {count} {what} of {total} elements, first at {_where(i, shape)}")
    owed = empty & ~(a == float("-inf")) & ~nan & ~inf
    if int(owed.sum()):
        i = int(owed.nonzero()[0])
        v.fail(f"{name}: {int(owed.sum())} elements of rows with no valid index are not -inf, first at "
               f"{_where(i, shape)} ({_fmt(float(a[i]))}); an empty row's lse must be -inf")

    compared = ~empty & ~undefined & torch.isfinite(a) & torch.isfinite(r)
    err = (a - r).abs()
    rel = err / (r.abs() + REL_EPS)
    bad = compared & (err > tol.atol) & (rel > tol.rtol)
    if bool(compared.any()):
        v.max_abs = float(err[compared].max())
        v.max_rel = float(rel[compared].max())
    wrong = int(bad.sum()) + int(nan.sum()) + int(inf.sum()) + int(owed.sum())
    v.matched = 1.0 - wrong / total if total else 1.0
    if int(bad.sum()):
        i = int(torch.where(bad, err, -1.0).argmax())
        message = (f"{name}: {int(bad.sum())} of {total} elements outside tolerance (atol {tol.atol:g}, "
                   f"rtol {tol.rtol:g}); worst at {_where(i, shape)}: got {_fmt(float(a[i]))}, "
                   f"expected {_fmt(float(r[i]))}")
        if 1.0 - int(bad.sum()) / total < tol.matched_ratio:
            v.fail(message)
    return v


def _lse_hint(actual: torch.Tensor, expected: torch.Tensor, base: float, tol: Tolerance) -> str | None:
    """Name the classic lse bug: the right log-sum-exp in the wrong base."""
    a, r = actual.float().cpu(), expected.float().cpu()
    finite = torch.isfinite(a) & torch.isfinite(r)
    if not bool(finite.any()):
        return None
    a, r = a[finite], r[finite]
    # lse_base = lse_e / ln(base): base e given where base 2 is due means a == r * ln 2.
    for given, factor in (("e (natural log)", math.log(base)), ("2", math.log(base) / math.log(2.0))):
        if abs(factor - 1.0) < 1e-6:
            continue
        scaled = r * factor
        if bool(((a - scaled).abs() <= tol.atol + tol.rtol * scaled.abs()).all()):
            due = "e (natural log)" if abs(base - math.e) < 1e-9 else f"{base:g}"
            return f"lse: the values are the log-sum-exp in base {given}, but base {due} is due"
    return None


def check_attention(d: Definition, inputs: Mapping[str, Any], outputs: Mapping[str, torch.Tensor],
                    tol: Tolerance) -> Verdict:
    expected = d.run_reference(inputs)
    v = Verdict()
    empty_rows = expected["lse"] == float("-inf")
    v.absorb(compare_close("output", outputs["output"], expected["output"], tol))
    lse = compare_close("lse", outputs["lse"], expected["lse"], tol, empty=empty_rows)
    if not lse.passed:
        hint = _lse_hint(outputs["lse"], expected["lse"], d.params["lse_base"], tol)
        if hint:
            lse.problems.insert(0, hint)
    v.absorb(lse)
    return v


# ---------------------------------------------------------------- top-k id outputs

@dataclass
class Row:
    """What one output row may contain: `where` names it in messages (its index in the
    output), `pages` the block table prefix its ids translate through, `scores` its valid
    scores by logical position (visible = len(scores)), `describe` how its length was derived."""

    where: list[int]
    pages: torch.Tensor  # int64 [ceil(visible / 64)] physical page ids, MASKED_PAGE where masked
    scores: torch.Tensor  # [visible] float32 scores (indexer) or float64 rank keys (top-k)
    describe: str
    masked: torch.Tensor | None = None  # bool [visible]: positions whose id is due as -1 (None: none)


# A page id no physical id maps to (ids are >= 0), standing for a masked page.
MASKED_PAGE = -2


def _indexer_rows(d: Definition, inputs: Mapping[str, Any]) -> list[Row]:
    """Recompute the reference's float32 scores per (request, query token), over the
    tokens each may see: token j of next_n sees seq_len - next_n + j + 1 tokens, at most
    the block table's pages; tokens on pages outside the cache are masked and score -inf."""
    next_n = d.params["next_n"]
    q, cache, w = inputs["q_index_fp8"], inputs["k_index_cache_fp8"], inputs["weights"]
    batch, heads = q.shape[0], q.shape[-2]
    q = q.float().reshape(batch, next_n, heads, INDEX_HEAD_DIM)
    w = w.float().reshape(batch, next_n, heads)
    seq_lens = inputs["seq_lens"].cpu()
    table = inputs["block_table"]
    max_len, num_pages_in_cache = table.shape[1] * PAGE_SIZE, cache.shape[0]
    rows = []
    for b in range(batch):
        seq_len = int(seq_lens[b])
        tokens = min(max(seq_len, 0), max_len)
        pages = table[b, : (tokens + PAGE_SIZE - 1) // PAGE_SIZE].long()
        in_cache = (pages >= 0) & (pages < num_pages_in_cache)
        masked = ~in_cache.repeat_interleave(PAGE_SIZE)[:tokens]
        k = None
        if bool(in_cache.any()):
            k = dequantize_index_k(cache[pages.clamp(0, num_pages_in_cache - 1)]).reshape(-1, INDEX_HEAD_DIM)[:tokens]
        for j in range(next_n):
            visible = max(0, min(seq_len - next_n + j + 1, max_len))
            scores = torch.full((visible,), float("-inf"), device=q.device)
            if visible and k is not None:
                scores = (torch.relu(q[b, j] @ k[:visible].T) * w[b, j][:, None]).sum(dim=0)
                scores = scores.masked_fill(masked[:visible], float("-inf"))
            where = [b, j] if next_n > 1 else [b]
            describe = (f"token {j} of {next_n} sees seq_len {seq_len} - {next_n} + {j} + 1 = {visible} tokens"
                        if next_n > 1 else f"seq_len {seq_len}")
            if seq_len > max_len:
                describe += f", clamped to the block table's {max_len}"
            # The request's pages: an id past a causal row's visible tokens but on one of
            # them is reported as a position past the row, which names the bug.
            rows.append(Row(where, torch.where(in_cache, pages, MASKED_PAGE).cpu(), scores.cpu(), describe,
                            masked[:visible].cpu()))
    return rows


def check_prefill_ids(actual: torch.Tensor, inputs: Mapping[str, Any], tol: Tolerance) -> Verdict:
    """The prefill indexer's rule: row t holds a top-k set of the keys of its range [ks, ke) (clamped to the
    keys) by the reference's float32 logits, as key ids, -1 padded. Rows are first judged in blocks on the
    inputs' device (_right_prefill_rows); every row that block check cannot pass is judged as the indexer's rows
    are (check_row), its ids counted from the range's start, an id outside the range named apart."""
    q, w = inputs["q_index_fp8"], inputs["weights"]  # made float a block or a row at a time (2 GiB at 64K rows)
    k, scale = inputs["k_index_fp8"].float(), inputs["k_index_scale"].float()
    num_keys = k.shape[0]
    v = Verdict()
    topk = actual.shape[-1]
    flat = actual.detach().reshape(-1, topk)
    right, v.max_abs, v.max_rel = _right_prefill_rows(flat, q, k, w, scale, inputs["ks"], inputs["ke"], tol)
    ks, ke = inputs["ks"].cpu(), inputs["ke"].cpu()
    flat = flat.cpu().long()
    wrong = 0
    for t in (~right.cpu()).nonzero().flatten().tolist():
        start, end = row_keys(ks, ke, t, num_keys)
        scores = keys_logits(q[t:t + 1].float(), k[start:end], w[t:t + 1].float(), scale[start:end])[0]
        ids = flat[t]
        outside = (ids >= 0) & ((ids < start) | (ids >= end))
        if bool(outside.any()):
            v.fail(f"row {t}: id {int(ids[outside][0])} is outside the row's keys [{start}, {end})"
                   + _and_more(int(outside.sum()), "are outside them too"))
            wrong += int(outside.sum())
        relative = torch.where(ids >= 0, torch.where(outside, -1, ids - start), ids)
        pages = torch.arange((end - start + PAGE_SIZE - 1) // PAGE_SIZE)
        row = Row([t], pages, scores.cpu(), f"keys [{start}, {end}), ids counted from {start}")
        wrong += _judge_row(v, check_row(relative, row, topk, tol, exact=False))
    v.matched = 1.0 - min(wrong, flat.numel()) / flat.numel() if flat.numel() else 1.0
    return v


# The block check's float32 [rows, heads, keys] product stays under this many elements (512 MiB).
PREFILL_CHECK_ELEMENTS = 1 << 27


def _right_prefill_rows(ids: torch.Tensor, q, k, w, scale, ks, ke, tol: Tolerance
                        ) -> tuple[torch.Tensor, float, float]:
    """Which rows are plainly right, and the largest score errors over them: rows whose logits are all finite
    and whose ids are distinct keys of the range, min(topk, keys) of them, -1 in every other slot, scoring
    within tolerance of the row's top scores everywhere. A block of rows shares one matmul, so a 64K-token
    prompt is judged in seconds; what this does not pass (any doubt) is left to check_row, which says why."""
    num_tokens, topk = ids.shape
    num_keys, heads = k.shape[0], q.shape[1]
    device = ids.device
    start = ks.to(device).long().clamp(0, num_keys)
    end = torch.maximum(ke.to(device).long().clamp(max=num_keys), start)
    right = torch.zeros(num_tokens, dtype=torch.bool, device=device)
    max_abs = max_rel = 0.0
    rows = max(1, PREFILL_CHECK_ELEMENTS // (heads * max(num_keys, 1)))
    for t0 in range(0, num_tokens, rows):
        t1 = min(t0 + rows, num_tokens)
        lo, hi = int(start[t0:t1].min()), int(end[t0:t1].max())
        first, last = start[t0:t1, None], end[t0:t1, None]
        block = ids[t0:t1].long()
        due = torch.clamp(last - first, max=topk).squeeze(1)
        chosen = block >= 0
        ok = ((block == -1) | (chosen & (block >= first) & (block < last))).all(1) & (chosen.sum(1) == due)
        ordered = torch.sort(torch.where(chosen, block, -1 - torch.arange(topk, device=device)), 1).values
        ok &= (ordered[:, 1:] != ordered[:, :-1]).all(1)  # distinct ids (each -1 slot made distinct above)
        if hi > lo:
            logits = keys_logits(q[t0:t1].float(), k[lo:hi], w[t0:t1].float(), scale[lo:hi])
            key = torch.arange(lo, hi, device=device)
            inside = (key >= first) & (key < last)
            ok &= torch.where(inside, logits.isfinite(), True).all(1)
            ranked = torch.where(inside, logits, float("-inf"))
            width = min(topk, hi - lo)
            best = torch.topk(ranked, width, 1).values
            got = torch.gather(ranked, 1, torch.where(ok[:, None] & chosen, block, lo) - lo)
            got = torch.sort(torch.where(chosen, got, float("-inf")), 1, descending=True).values[:, :width]
            due_slot = torch.arange(width, device=device) < due[:, None]
            err = torch.where(due_slot, (got - best).abs(), 0.0)
            rel = err / (best.abs() + REL_EPS)
            ok &= ~((err > tol.atol) & (rel > tol.rtol)).any(1)
            if bool(ok.any()):
                max_abs = max(max_abs, float(err[ok].max()))
                max_rel = max(max_rel, float(torch.where(due_slot, rel, 0.0)[ok].max()))
        right[t0:t1] = ok
    return right, max_abs, max_rel


def _topk_rows(inputs: Mapping[str, Any]) -> list[Row]:
    """Row r ranks its first lengths[r] scores (clamped to the block table's pages) and translates
    through the block table of request row_to_batch[r]; its order is rank_key's (NaN below -inf).
    Page ids outside [0, MAX_PAGES) and rows whose request is not a block-table row are masked."""
    scores, table = inputs["scores"], inputs["block_table"].cpu()
    lengths, row_to_batch = inputs["lengths"].cpu(), inputs["row_to_batch"].cpu()
    batch, max_pages = table.shape
    limit = min(scores.shape[1], max_pages * PAGE_SIZE)
    rows = []
    for r in range(scores.shape[0]):
        length, b = min(max(0, int(lengths[r])), limit), int(row_to_batch[r])
        num_pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
        if 0 <= b < batch:
            pages = table[b, :num_pages].long()
            in_table = (pages >= 0) & (pages < MAX_PAGES)
        else:
            pages = torch.full((num_pages,), MASKED_PAGE, dtype=torch.long)
            in_table = torch.zeros(num_pages, dtype=torch.bool)
        masked = ~in_table.repeat_interleave(PAGE_SIZE)[:length]
        rows.append(Row([r], torch.where(in_table, pages, MASKED_PAGE), rank_key(scores[r, :length]).cpu(),
                        f"length {length}, request {b}", masked))
    return rows


def _positions(ids: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """Logical position of each physical id in a row, -1 when its page is not the row's."""
    if pages.numel() == 0 or ids.numel() == 0:
        return torch.full_like(ids, -1)
    sorted_pages, slot_of = torch.sort(pages, stable=True)  # a repeated page keeps its first slot
    page = ids // PAGE_SIZE
    at = torch.searchsorted(sorted_pages, page).clamp_max(pages.numel() - 1)
    found = sorted_pages[at] == page
    return torch.where(found, slot_of[at] * PAGE_SIZE + ids % PAGE_SIZE, -1)


def _times(n: int) -> str:
    return {2: "twice", 3: "three times"}.get(n, f"{n} times")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _and_more(n: int, what: str) -> str:
    return f"; {_count(n - 1, 'more id')} {what}" if n > 1 else ""


def check_row(ids: torch.Tensor, row: Row, topk: int, tol: Tolerance,
              exact: bool) -> tuple[list[str], int, float, float]:
    """Problems of one row, the number of wrong slots, and the score errors."""
    problems: list[str] = []
    name = f"row {row.where[0]}" if len(row.where) == 1 else f"row {row.where}"
    visible = row.scores.numel()
    due = min(topk, visible)
    ids = ids.long()
    wrong_slots = 0

    poisoned = ids == INT_POISON
    if bool(poisoned.any()):
        slots = poisoned.nonzero().flatten().tolist()
        problems.append(f"{name}: {_count(len(slots), 'slot')} never written (still holding the poison value "
                        f"{INT_POISON}), first slot {slots[0]}")
        wrong_slots += len(slots)
    invalid = (ids < -1) & ~poisoned
    if bool(invalid.any()):
        slot = int(invalid.nonzero()[0])
        problems.append(f"{name}: slot {slot} holds {int(ids[slot])}, which is neither a token id nor -1")
        wrong_slots += int(invalid.sum())

    chosen = ids[ids >= 0]
    unique, counts = torch.unique(chosen, return_counts=True)
    repeated = (counts > 1).nonzero().flatten().tolist()
    for i in repeated[:3]:
        problems.append(f"{name}: id {int(unique[i])} appears {_times(int(counts[i]))}")
    if len(repeated) > 3:
        problems.append(f"{name}: {len(repeated)} ids in all appear more than once")
    wrong_slots += int((counts - 1).clamp_min(0).sum())

    pos = _positions(unique, row.pages)
    off_page = (pos < 0).nonzero().flatten().tolist()
    if off_page:
        token = int(unique[off_page[0]])
        problems.append(f"{name}: id {token} is on page {token // PAGE_SIZE}, which is not one of the row's "
                        f"{row.pages.numel()} pages (block_table prefix {_pages_text(row.pages)}; {row.describe})"
                        + _and_more(len(off_page), "are on pages that are not the row's"))
    beyond = (pos >= visible).nonzero().flatten().tolist()
    if beyond:
        token, p = int(unique[beyond[0]]), int(pos[beyond[0]])
        problems.append(f"{name}: id {token} is logical position {p}, past the row's {visible} visible tokens "
                        f"({row.describe})" + _and_more(len(beyond), "are past them too"))
    wrong_slots += len(off_page) + len(beyond)

    legal = pos[(pos >= 0) & (pos < visible)]
    masked = row.masked if row.masked is not None else torch.zeros(visible, dtype=torch.bool)
    short = due - legal.numel()  # -1 slots that may stand for chosen masked positions
    if short > int(masked.sum()):
        missing = short - int(masked.sum())
        message = (f"{name}: {_count(due, 'valid id')} {'is' if due == 1 else 'are'} due ({row.describe}) "
                   f"but only {legal.numel()} given")
        if bool(masked.any()):
            message += f" and {int(masked.sum())} masked"
        padding = int((ids == -1).sum())
        if padding:
            held = min(missing, padding)
            message += f": {_count(held, 'slot')} {'holds' if held == 1 else 'hold'} -1 where a valid id is due"
        problems.append(message)
        wrong_slots += missing
    max_abs = max_rel = 0.0
    if 0 <= short <= int(masked.sum()) and due:
        # The masked positions the -1 slots stand for: the best ones make the best set.
        chosen = torch.cat([row.scores[legal], torch.topk(row.scores[masked], short).values])
        got = torch.sort(chosen, descending=True).values
        best = torch.topk(row.scores, due).values
        if exact:
            bad = got != best
        else:
            err = (got - best).abs()
            rel = err / (best.abs() + REL_EPS)
            bad = (err > tol.atol) & (rel > tol.rtol)
            max_abs, max_rel = float(err.max()), float(rel.max())
        if bool(bad.any()) and (exact or 1.0 - int(bad.sum()) / due < tol.matched_ratio):
            problems.append(_not_top_message(name, row, legal, due, int(bad.sum()), exact))
            wrong_slots += int(bad.sum())
    return problems, wrong_slots, max_abs, max_rel


def _pages_text(pages: torch.Tensor) -> str:
    shown = pages[:6].tolist()
    return str(shown)[:-1] + (", ...]" if pages.numel() > 6 else "]")


def _not_top_message(name: str, row: Row, legal: torch.Tensor, due: int, bad: int, exact: bool) -> str:
    """Name a token that was left out although it ranks above a chosen one."""
    chosen = torch.zeros(row.scores.numel(), dtype=torch.bool)
    chosen[legal] = True
    left_out = torch.where(chosen, float("-inf"), row.scores.double())
    in_best = int(left_out.argmax())
    picked = torch.where(chosen, row.scores.double(), float("inf"))
    in_worst = int(picked.argmin())
    rule = "exactly" if exact else "beyond tolerance"

    def token(p: int) -> str:
        physical = int(row.pages[p // PAGE_SIZE]) * PAGE_SIZE + p % PAGE_SIZE
        value = float(row.scores[p])
        if exact:  # rank keys: undo rank_key's mapping for the message
            value = math.nan if value == -math.inf else -math.inf if value == torch.finfo(torch.float64).min else value
        return f"position {p} (id {physical}, score {_fmt(value)})"

    return (f"{name}: the chosen ids are not a top-{due} set ({bad} of {due} sorted scores differ {rule}): "
            f"{token(in_best)} was left out while {token(in_worst)} was chosen")


def _judge_row(v: Verdict, checked: tuple[list[str], int, float, float]) -> int:
    """One row's check_row result into the verdict (its problems, the largest errors); its wrong slots."""
    problems, wrong_slots, max_abs, max_rel = checked
    for problem in problems:
        v.fail(problem)
    v.max_abs, v.max_rel = max(v.max_abs, max_abs), max(v.max_rel, max_rel)
    return wrong_slots


def check_topk_ids(actual: torch.Tensor, rows: list[Row], tol: Tolerance, exact: bool) -> Verdict:
    v = Verdict()
    topk = actual.shape[-1]
    flat = actual.detach().cpu().reshape(-1, topk)
    wrong = 0
    for r, row in enumerate(rows):
        wrong += _judge_row(v, check_row(flat[r], row, topk, tol, exact))
    v.matched = 1.0 - min(wrong, flat.numel()) / flat.numel() if flat.numel() else 1.0
    return v
