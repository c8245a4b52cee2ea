"""dsactl: kernels and tooling for DeepSeek Sparse Attention (DSA)."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Imported on first use: the command line's start-up imports neither torch nor triton.
    if name == "DecodeStep":
        from dsactl.kernels.step import DecodeStep

        return DecodeStep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
