"""Whether a peer's kernel runs here, asked of a child process first.

A peer built against another CUDA or torch can import cleanly and still crash the process on its first kernel
call (a segmentation fault in its extension, as a DeepGEMM build has done): in-process, that takes a bench or
conformance run down with everything it had measured. A child Python makes the same first call; its death is
a reason to skip the peer, in one line.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from typing import Sequence

# A first call may compile its kernel (DeepGEMM's JIT runs nvcc), which takes seconds to a minute.
TIMEOUT_S = 300

# DeepGEMM: one small ragged logits call (64 query rows of 64 heads over 256 keys), the call bench and the
# conformance timing make first.
DEEP_GEMM = """
import torch, deep_gemm
f8, n = torch.float8_e4m3fn, torch.zeros(64, dtype=torch.int32, device="cuda")
kv = (torch.ones(256, 128, device="cuda").to(f8), torch.ones(256, device="cuda"))
deep_gemm.fp8_mqa_logits(torch.ones(64, 64, 128, device="cuda").to(f8), kv, torch.ones(64, 64, device="cuda"),
                         n, n + 256, clean_logits=False)
torch.cuda.synchronize()
"""


def failure(code: str, paths: Sequence[str] = (), timeout_s: float = TIMEOUT_S) -> str:
    """'' when `code` runs to its end in a child Python that has `paths` ahead of this process's sys.path; else
    why not, in one line: the signal that killed it, the last line it wrote to stderr, or the timeout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *(p for p in sys.path if p)])}
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"a first call in a child process did not finish in {timeout_s:g} s"
    if done.returncode == 0:
        return ""
    if done.returncode < 0:
        return f"a first call in a child process was killed by {signal.Signals(-done.returncode).name}"
    lines = done.stderr.strip().splitlines()
    return f"a first call in a child process failed: {lines[-1] if lines else f'exit status {done.returncode}'}"


@functools.lru_cache(maxsize=None)
def cached_failure(code: str) -> str:
    """failure(code), asked once a process for each code (bench resolves its plug-ins per definition)."""
    return failure(code)
