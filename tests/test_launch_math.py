"""The launchers' host arithmetic (kernels/launch_math.py) gives Triton's values, which the launch plans,
the tuned tables' buckets and the ahead-of-time builds were made with."""

from __future__ import annotations

import triton

from dsactl.kernels.launch_math import cdiv, next_power_of_2


def test_next_power_of_2_is_tritons():
    for n in [*range(0, 4200), 65535, 65536, 65537, 131072, 2**31 - 1]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n


def test_cdiv_is_tritons():
    for a in [*range(0, 2100), 65535, 131072, 2**31 - 1]:
        for b in (1, 2, 3, 16, 64, 100, 128, 2048):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
