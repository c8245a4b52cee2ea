"""Compile options every Triton kernel here is launched with, and built ahead of time with (dsactl build).

FP_FUSION: multiply-adds fused into FMA instructions. The kernels were tuned and verified that way, which
is Triton's default through 3.9; from 3.10 fusion is off unless the launch asks for it (or the process
sets TRITON_DEFAULT_FP_FUSION), which would change their speed and rounding under the user's feet.
"""

FP_FUSION = True
