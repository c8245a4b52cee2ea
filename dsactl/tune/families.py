"""The tunable kernel families as plain data: which kernel module, which definitions, where its table is.
Imports neither torch nor triton (`dsactl list` reads the tables through it)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from dsactl.errors import DsactlError
from dsactl.kernels import tuned
from dsactl.kernels.cuda_library import kernels_root


@dataclass(frozen=True)
class Family:
    name: str
    module: str  # the kernel module under kernels/, whose TUNED table it fills
    definitions: str  # fnmatch pattern over definition names
    knobs: str  # what a candidate varies, for `dsactl list` and the docs
    # The attention dispatch's name for the kernel (kernels/attention/dispatch.py): a definition's workload
    # is tuned by the family of the kernel that serves it on the GPU; "" outside the attention.
    implementation: str = ""

    @property
    def table_path(self) -> Path:
        return tuned.table_path(kernels_root().resolve() / (self.module.replace(".", "/") + ".py"))

    @property
    def kernel_name(self) -> str:
        return self.module.rpartition(".")[2]


FAMILIES = (
    Family("attention-triton", "attention.triton_sparse_mla", "dsa_sparse_attention_*",
           "block_n, num_warps, num_stages, num_splits", "triton"),
    Family("attention-hopper", "attention.hopper_mla", "dsa_sparse_attention_*", "num_splits", "hopper"),
    Family("attention-mma", "attention.mma_mla", "dsa_sparse_attention_*", "num_splits", "mma"),
    Family("indexer-score", "indexer.score", "dsa_topk_indexer_*",
           "block_n, num_warps, num_stages, programs_per_sm"),
)


def for_definition(definition: str, implementation: str = "triton") -> Family | None:
    """The family that tunes a definition's calls; for the attention, that of the kernel the dispatch sends
    them to (the Triton kernel unless named)."""
    return next((f for f in FAMILIES if fnmatch(definition, f.definitions) and f.implementation in
                 (implementation, "")), None)


def get(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise DsactlError(f"unknown kernel family {name!r} (known: {', '.join(f.name for f in FAMILIES)})")


def config_sources(family: Family) -> str:
    """Where a family's launches take their configuration from: per GPU, the tuned entries, or hand-picked."""
    try:
        entries = tuned.read(family.table_path)
    except (OSError, ValueError) as e:
        return f"hand-picked (the table {family.table_path.name} is unreadable: {e})"
    per_gpu = Counter(f"{e.gpu} (sm_{e.capability[0]}{e.capability[1]})" for e in entries)
    tuned_for = "; ".join(f"tuned table for {gpu}: {n} bucket{'' if n == 1 else 's'}" for gpu, n in per_gpu.items())
    return (tuned_for + ", hand-picked elsewhere") if tuned_for else "hand-picked (no tuned entries)"
