"""Peers' Python APIs served by dsactl's kernels, so an engine switches with one import:
`import dsactl.compat.deep_gemm as deep_gemm` (the lightning indexer's logits)."""
