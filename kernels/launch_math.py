"""Integer arithmetic of launch planning on the host, in plain Python.

Triton's cdiv and next_power_of_2 are constexpr functions: called from host code they go through a
wrapper that unwraps each argument, many times the cost of the arithmetic, and a launch plans
with a dozen of them (docs/design.md, "Measured choices"). These give the same values for the non-negative
integers the launchers pass.
"""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """a / b rounded up."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for 0, as Triton's)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
