"""The dsactl command line: options in, tables out. Each subcommand lives in its
own module (dsactl/cli/<command>.py, exposing register(app)); the work lives in
library functions."""

from __future__ import annotations

import importlib
import sys

import typer

from dsactl.errors import USER_ERRORS

app = typer.Typer(
    name="dsactl",
    help="Build, check, time, profile and pack DeepSeek Sparse Attention kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = ("catalog", "doctor", "build", "profile", "verify", "pack", "bench", "tune")

_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _state["debug"] = debug


for _name in COMMAND_MODULES:
    importlib.import_module(f"dsactl.cli.{_name}").register(app)


def main() -> None:
    # Standalone mode: typer/click handle usage errors (exit 2) and --help;
    # A user-facing failure (DsactlError, or a kernel's KernelError) becomes one line on stderr, and so does
    # an OSError (a disk full or a folder gone while writing the outputs).
    try:
        app()
    except (*USER_ERRORS, OSError) as e:
        if _state["debug"]:
            raise
        print(f"error: {_message(e)}", file=sys.stderr)
        sys.exit(2)


def _message(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return str(e)
