import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run under the CPU interpreter when there is no GPU; the flag
    # must be set before any module decorates a kernel with @triton.jit.
    os.environ.setdefault("TRITON_INTERPRET", "1")


# GPU cycles a held-back launch sleeps first on its stream (about 1 ms on an H200): long enough for
# another stream's whole kernel to run in between.
HOLD_CYCLES = 1 << 21


@pytest.fixture
def hold_back(monkeypatch):
    """hold_back(module, name): module.name, for this test, first sleeps HOLD_CYCLES on the current
    stream, so that work on another stream lands between the call's earlier launches and that one."""
    def patch(module, name: str) -> None:
        launch = getattr(module, name)

        def held(*args, **kwargs):
            torch.cuda._sleep(HOLD_CYCLES)
            return launch(*args, **kwargs)
        monkeypatch.setattr(module, name, held)
    return patch


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    elif int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # A timing test's yardstick is this GPU's own speed, which other workers' kernels would take a share of.
        alone = pytest.mark.skip(reason="times the GPU against its own speed: run it without -n, on a GPU of its own")
        for item in items:
            if "gpu_alone" in item.keywords:
                item.add_marker(alone)
