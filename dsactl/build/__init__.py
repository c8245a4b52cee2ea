"""`dsactl build`: compile every kernel per GPU arch and report its resources.

CUDA sources under kernels/ go through nvcc driven by a generated ninja file,
Triton kernels that ship configurations are compiled ahead of time, and each
kernel x configuration gets a resource report. The kernels load what it builds
through their own loader (kernels/cuda_library.py), which never imports dsactl.
"""
