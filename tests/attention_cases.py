"""What the sparse attention tests share: definition names, fresh seeded inputs from the workload
generator, poisoned outputs, the verify rule as an assertion, and a private build of one CUDA library."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pytest
import torch

from dsactl.build import arch as arch_table
from dsactl.build.pipeline import build_arch
from dsactl.definitions import get
from dsactl.harness import poison
from dsactl.kernels import cuda_library
from dsactl.verify.rules import check
from dsactl.workloads import Workload, make_inputs

BASE = "dsa_sparse_attention_h{heads}_ckv512_kpe64_topk{topk}_ps64{suffix}"


def definition_name(heads: int, topk: int, suffix: str = "") -> str:
    return BASE.format(heads=heads, topk=topk, suffix=suffix)


def case_inputs(definition: str, num_tokens: int, num_pages: int, device, seed: int = 0, **params) -> dict:
    """Inputs of a test workload: the generator's pattern params (pattern=, valid=, q_scale=...) apply."""
    w = Workload(f"test-{definition}-{num_tokens}", definition, "test", "test",
                 {"num_tokens": num_tokens, "num_pages": num_pages}, params)
    return make_inputs(w, device, seed)


def poisoned_outputs(definition: str, inputs: dict) -> dict:
    d = get(definition)
    outputs = d.allocate_outputs(d.check_inputs(inputs), inputs["q_nope"].device)
    poison(outputs)
    return outputs


def assert_matches_reference(definition: str, inputs: dict, outputs: dict) -> None:
    verdict = check(get(definition), inputs, outputs)
    assert verdict.passed, "\n".join(verdict.problems)


def assert_repeatable(call: Callable[[], dict], definition: str, inputs: dict, repeats: int) -> None:
    """call() passes the reference, then gives the same output and lse bit for bit `repeats` times more:
    a race in a kernel would move them."""
    first = call()
    assert_matches_reference(definition, inputs, first)
    for _ in range(repeats):
        again = call()
        assert torch.equal(again["output"], first["output"]) and torch.equal(again["lse"], first["lse"])


def build_library(root: Path, library: str, arches: tuple[str, ...]) -> dict:
    """lib<library>.so built for each arch into a private build root: {arch: (report rows, arch_dir)}."""
    source = cuda_library.find(library)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cuda_library.BUILD_DIR_ENV, str(root))
        chosen = [a for a in arch_table.ARCHES if a.name in arches]
        with ThreadPoolExecutor(len(chosen)) as pool:  # one nvcc per arch, side by side
            done = list(pool.map(lambda a: build_arch(a, cuda_sources=[source], triton_configs=[], jobs=1,
                                                      on_progress=lambda *event: None), chosen))
    return {b.arch.name: (b.rows, root / b.arch.name) for b in done}
