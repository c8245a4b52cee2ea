"""`dsactl pack`: flashinfer-bench Solution bundles that carry exactly what the entry point needs.

closure    the files reachable from a solution's entry (Python imports within dsactl, CUDA sources)
rewrite    absolute `dsactl` imports -> relative ones, so a bundle never imports an installed dsactl
bundle     the Solution JSON
check      what `dsactl pack --check` validates
unpack     sources -> a folder, byte for byte
loader     load_bundle(path): a bundle as a dsactl Solution (for `dsactl verify --bundle`)
jit_runtime  shipped inside every bundle with CUDA parts: builds them with nvcc on first use

This file imports nothing: jit_runtime ships inside bundles, and with it this package's __init__.
"""
