"""`dsactl pack`: flashinfer-bench Solution bundles that carry exactly what the entry point needs.

closure    the files a solution's entry runs (relative imports within kernels/, CUDA sources)
bundle     the Solution JSON: those files copied as they are, and a generated main.py
check      what `dsactl pack --check` validates
unpack     sources -> a folder, byte for byte
loader     load_bundle(path): a bundle as a dsactl Solution (for `dsactl verify --bundle`)
"""
