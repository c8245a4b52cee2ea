"""The errors users see: a clear message, no traceback unless --debug."""

from dsactl.kernels.errors import KernelError


class DsactlError(Exception):
    """A user-facing failure: bad option, bad input, missing build or tool."""


# What the command line reports as one line: the tool's own failures, and the kernels' (bad input to a
# launcher, a missing or stale build), which the kernels raise without knowing about dsactl.
USER_ERRORS = (DsactlError, KernelError)
