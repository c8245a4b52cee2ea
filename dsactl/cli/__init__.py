"""The dsactl command line: options in, tables out. Each subcommand lives in its
own module (dsactl/cli/<command>.py, exposing register(app)); the work lives in
library functions."""

from __future__ import annotations

import importlib
import sys

import typer

from dsactl.errors import DsactlError

app = typer.Typer(
    name="dsactl",
    help="Build, check, time, profile and pack DeepSeek Sparse Attention kernels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMAND_MODULES = ("catalog", "doctor")

_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    _state["debug"] = debug


for _name in COMMAND_MODULES:
    importlib.import_module(f"dsactl.cli.{_name}").register(app)


def main() -> None:
    try:
        app(standalone_mode=False)
    except DsactlError as e:
        if _state["debug"]:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # click usage errors and the like
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Exit):
            sys.exit(e.exit_code)
        raise
