"""dsactl: kernels and tooling for DeepSeek Sparse Attention (DSA).

An engine imports dsactl.ops (the torch ops, DecodeStep, the masked-id counters). This package imports
neither torch nor triton, so the command line starts without them.
"""

__version__ = "0.1.0"
