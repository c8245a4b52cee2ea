"""Peers' Python APIs served by dsactl's kernels, so an engine switches with one import:
`import dsactl.compat.flash_mla as flash_mla` (sparse MLA decode and prefill) and
`import dsactl.compat.deep_gemm as deep_gemm` (the lightning indexer's logits). Each peer's own tests run
against them in dsactl.conformance."""
