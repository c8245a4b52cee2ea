"""dsactl pack / unpack: flashinfer-bench Solution bundles."""

from __future__ import annotations

from pathlib import Path

import typer

from dsactl.cli.paths import output_file
from dsactl.cli.render import console, table


def register(app: typer.Typer) -> None:
    @app.command()
    def pack(
        definition: str = typer.Option(None, "--definition", "-d", help="The definition the bundle solves."),
        solution: str = typer.Option(None, "--solution", "-s",
                                     help="Solution to pack (default: the one dsactl serves the definition with, "
                                          "which verify and bench lead with)."),
        output: Path = typer.Option(Path("solution.json"), "--output", "-o", help="Where to write the bundle."),
        name: str = typer.Option(None, "--name", help="Bundle name (default: <name_prefix>_<solution>_<definition>)."),
        author: str = typer.Option(None, "--author", help="Author (default: [tool.dsactl] author in pyproject.toml)."),
        check: Path = typer.Option(None, "--check", help="Check this bundle instead of packing one."),
    ) -> None:
        """Pack a solution and exactly the files its entry point needs into a Solution JSON, or --check one."""
        from dsactl import solutions
        from dsactl.errors import DsactlError
        from dsactl.pack.bundle import choose_solution, read_bundle, write_bundle
        from dsactl.pack.bundle import pack as make_bundle
        from dsactl.pack.check import check_bundle

        if check is not None:
            if definition or solution or name or author:
                raise DsactlError("--check takes only the bundle to check")
            _show(check_bundle(read_bundle(check)), f"{check}: ok")
            return
        if definition is None:
            raise DsactlError("pass --definition (or --check BUNDLE)")
        output_file(output, "--output")
        chosen = choose_solution(definition, solution)
        data = make_bundle(definition, chosen.name, name, author)
        if solution is None:
            others = [s.name for s in solutions.for_definition(data["definition"]) if s.name != chosen.name]
            console.print(f"packing {chosen.name}, the solution dsactl serves {data['definition']} with"
                          + (f" (--solution {' or '.join(others)} packs another)" if others else ""), soft_wrap=True)
        write_bundle(data, output)
        _show(check_bundle(data), f"wrote {output}")

    @app.command()
    def unpack(
        bundle: Path = typer.Argument(..., help="The Solution JSON."),
        output: Path = typer.Option(..., "--output", "-o", help="Folder to write the sources to (empty or new)."),
    ) -> None:
        """Write a bundle's sources to a folder, byte for byte."""
        from dsactl.pack.bundle import read_bundle
        from dsactl.pack.unpack import unpack as write_sources

        written = write_sources(read_bundle(bundle), output)
        console.print(f"wrote {len(written)} files under {output}")


def _show(report, headline: str) -> None:
    from dsactl.pack.check import MAX_BUNDLE_BYTES

    console.print(table(f"{report.name}: {report.definition}", ["path", "kind", "bytes", "reached from"],
                        ((f.path, f.kind, f.size, f.reached) for f in report.files)))
    console.print(f"entry {report.entry_point} ({', '.join(report.signature)}), language {report.language}, "
                  f"author {report.author}")
    console.print(f"{headline}: {len(report.files)} files, {report.size} bytes (limit {MAX_BUNDLE_BYTES})")
