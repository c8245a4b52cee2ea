"""`dsactl build`: compile every kernel per GPU arch and report its resources.

CUDA sources under kernels/ go through nvcc driven by a generated ninja file,
Triton kernels that ship configurations are compiled ahead of time, and each
kernel x configuration gets a resource report. `runtime` is the only part the
kernels import at run time: it loads the build that matches the current GPU.
"""
