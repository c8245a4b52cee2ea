"""Solutions: an implementation of one or more definitions, as plain data.

A solution's entry is "module:function"; the function takes the definition's
signature (inputs, then preallocated outputs) and writes the outputs in place.
Kernel authors add their entry to SOLUTIONS.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Callable

from dsactl.errors import DsactlError


@dataclass(frozen=True)
class Solution:
    name: str
    definitions: tuple[str, ...]  # fnmatch patterns over definition names
    language: str  # "python" | "triton" | "cuda"
    entry: str  # "package.module:function"
    description: str
    needs_gpu: bool = True
    cuda_libs: tuple[str, ...] = ()  # libraries from `dsactl build` that it loads
    baseline: bool = False  # a comparison point (bench), not a shipped kernel

    def serves(self, definition: str) -> bool:
        return any(fnmatch(definition, p) for p in self.definitions)

    def load(self) -> Callable:
        module, _, func = self.entry.partition(":")
        try:
            return getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError) as e:
            raise DsactlError(f"solution {self.name}: cannot load {self.entry} ({e})") from None

    def availability(self) -> tuple[bool, str]:
        """Whether it can run on this machine, and why not."""
        import torch

        if self.needs_gpu and not torch.cuda.is_available():
            return False, "needs a CUDA GPU"
        if self.cuda_libs:
            from dsactl.build.runtime import load_library

            for lib in self.cuda_libs:
                try:
                    load_library(lib)
                except DsactlError as e:
                    return False, str(e)
        return True, "ok"


SOLUTIONS: list[Solution] = []


def get(name: str) -> Solution:
    for s in SOLUTIONS:
        if s.name == name:
            return s
    raise DsactlError(f"unknown solution {name!r}; `dsactl list` shows them ({', '.join(s.name for s in SOLUTIONS)})")


def for_definition(definition: str, include_baselines: bool = False) -> list[Solution]:
    return [s for s in SOLUTIONS if s.serves(definition) and (include_baselines or not s.baseline)]
