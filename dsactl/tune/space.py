"""Each family's shape buckets and candidate configurations: the hand-picked choice and its neighbours.

The space is small on purpose: the hand-picked configuration of a bucket's largest workload, then each
knob moved one step either way with the others held (block_n halved and doubled, the other warp count,
one stage fewer and more, the split count halved and doubled; the indexer: the other step, warps, a
stage either way, the next residency either way), plus the attention's other hand-picked configurations
for its head count; the CUDA attention kernels' split count: the formula's, one either way, halved,
doubled and 1. A candidate the launcher would refuse (tuned_launch / tuned_config / tuned_splits) is
left out.
A candidate is a dict of the launcher's knobs; None is the hand-picked choice itself, per call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from dsactl.definitions import get as get_definition
from dsactl.kernels.errors import KernelInputError
from dsactl.kernels.fp8 import PAGE_SIZE
from dsactl.tune.families import Family
from dsactl.workloads import Workload

Knobs = dict[str, Any]


def _attention_shape(w: Workload) -> tuple[int, int, int, bool]:
    p = get_definition(w.definition).params
    return w.axes["num_tokens"], p["heads"], p["topk"], p["fp8kv"]


def _indexer_shape(w: Workload) -> tuple[int, int, int, int, int]:
    p = get_definition(w.definition).params
    return w.axes["batch_size"], p["next_n"], p["heads"], w.axes["max_num_pages"] * PAGE_SIZE, p["topk"]


def bucket(family: Family, w: Workload) -> str | None:
    """The workload's bucket in the family's table; None where the family's kernel never runs on it
    (an indexer call whose rows all fit in topk takes the passthrough)."""
    if family.implementation:
        from dsactl.kernels.attention import triton_sparse_mla as tsm

        return tsm.tuning_bucket(*_attention_shape(w))
    from dsactl.kernels.indexer import score

    batch, next_n, heads, max_len, topk = _indexer_shape(w)
    return score.tuning_bucket(batch, next_n, heads, max_len) if max_len > topk else None


def _attention_candidates(workloads: list[Workload], num_sms: int, compact: bool) -> list[Knobs]:
    from dsactl.kernels.attention import triton_sparse_mla as tsm

    num_tokens, heads, topk, fp8kv = max(_attention_shape(w) for w in workloads)
    base, base_splits = tsm.hand_picked(num_tokens, heads, topk, fp8kv, num_sms, compact)

    def knobs(cfg, splits=None) -> Knobs:
        splits = splits or tsm.num_splits_for(num_tokens, heads, topk, cfg, num_sms)
        return {"block_h": cfg.block_h, "block_n": cfg.block_n, "num_warps": cfg.num_warps,
                "num_stages": cfg.num_stages, "f16": cfg.f16, "num_splits": splits}

    found = [knobs(base, base_splits)]
    found += [knobs(replace(base, block_n=n)) for n in (base.block_n // 2, base.block_n * 2)]
    found += [knobs(replace(base, num_warps=w), base_splits) for w in tsm.TUNED_WARPS if w != base.num_warps]
    found += [knobs(replace(base, num_stages=base.num_stages + d), base_splits) for d in (-1, 1)]
    found += [knobs(base, s) for s in (base_splits // 2, base_splits * 2) if s >= 1]
    found += [knobs(cfg) for cfg in tsm.configs(heads, fp8kv, compact) if cfg != base]
    return _accepted(found, lambda k: tsm.tuned_launch(k, heads, topk, fp8kv))


def _split_candidates(module: str, workloads: list[Workload], num_sms: int) -> list[Knobs]:
    """A CUDA kernel's one knob: the formula's split count, one either way, halved, doubled, and 1."""
    import importlib

    from dsactl.kernels.attention import triton_sparse_mla as tsm

    kernel = importlib.import_module(f"dsactl.kernels.{module}")
    num_tokens, heads, topk, _ = max(_attention_shape(w) for w in workloads)
    base = kernel.num_splits_for(num_tokens, heads, topk, num_sms)
    found = [{"num_splits": s} for s in (base, base - 1, base + 1, base // 2, base * 2, 1)]
    return _accepted(found, lambda k: tsm.tuned_splits(k, kernel.MAX_SPLITS))


def _indexer_candidates(workloads: list[Workload], num_sms: int) -> list[Knobs]:
    from dsactl.kernels.indexer import score

    batch, next_n, heads, max_len, _ = max(_indexer_shape(w) for w in workloads)
    cfg = score.choose_config(batch, next_n, heads, max_len, num_sms)
    large = batch * max_len >= score.LARGE_KEYS
    base = {"block_n": cfg.block_n, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
            "programs_per_sm": score.LARGE_PROGRAMS_PER_SM if large else score.PROGRAMS_PER_SM}
    found = [base]
    for knob, values in zip(score.TUNED_KNOBS, (score.TUNED_BLOCK_N, score.TUNED_WARPS, score.TUNED_STAGES,
                                                score.TUNED_PROGRAMS_PER_SM)):
        if base[knob] not in values:
            continue
        at = values.index(base[knob])
        found += [{**base, knob: values[i]} for i in (at - 1, at + 1) if 0 <= i < len(values)]
    return _accepted(found, lambda k: score.tuned_config(k, batch, max_len, num_sms))


def _accepted(found: list[Knobs], check: Callable[[Knobs], Any]) -> list[Knobs]:
    """The candidates the launcher's own check of a table entry accepts."""
    accepted = []
    for k in found:
        try:
            check(k)
        except KernelInputError:
            continue
        accepted.append(k)
    return accepted


def candidates(family: Family, workloads: list[Workload], num_sms: int,
               compact: bool = False) -> list[Knobs | None]:
    """The hand-picked choice (None) first, then the distinct explicit candidates of the bucket's largest
    workload (compact: for a GPU that takes the Triton attention's COMPACT tiles). The hand-picked knobs
    written out are a candidate too unless every workload of the bucket has that shape (then they are the
    hand-picked choice itself)."""
    if family.name == "attention-triton":
        found = _attention_candidates(workloads, num_sms, compact)
    elif family.implementation:
        found = _split_candidates(family.module, workloads, num_sms)
    else:
        found = _indexer_candidates(workloads, num_sms)
    one_shape = len({bucket_shape(family, w) for w in workloads}) == 1
    distinct = []
    for i, k in enumerate(found):
        if k not in distinct and not (i == 0 and one_shape):
            distinct.append(k)
    return [None, *distinct]


def bucket_shape(family: Family, w: Workload) -> tuple:
    return _attention_shape(w) if family.implementation else _indexer_shape(w)


def table(family: Family):
    """The family's kernels.tuned.Table, as its launcher holds it."""
    import importlib

    return importlib.import_module(f"dsactl.kernels.{family.module}").TUNED
