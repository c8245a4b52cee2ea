import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under the CPU interpreter when there is no GPU; the flag
    # must be set before any module decorates a kernel with @triton.jit.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
