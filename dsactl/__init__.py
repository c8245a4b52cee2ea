"""dsactl: kernels and tooling for DeepSeek Sparse Attention (DSA)."""

__version__ = "0.1.0"
