"""The one error type users see: a clear message, no traceback unless --debug."""


class DsactlError(Exception):
    """A user-facing failure: bad option, bad input, missing build or tool."""
