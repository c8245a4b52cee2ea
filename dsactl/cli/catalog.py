"""dsactl list: definitions, solutions (with the attention dispatch table and where each tunable kernel's
launch configuration comes from) and suites."""

from __future__ import annotations

import typer

from dsactl.cli.render import console, table
from dsactl.kernels.attention import dispatch


def register(app: typer.Typer) -> None:
    @app.command("list")
    def list_(
        what: str = typer.Argument("all", help="definitions | solutions | suites | all"),
        contest_only: bool = typer.Option(False, "--contest", help="Only the two contest definitions."),
    ) -> None:
        """List definitions, solutions and workload suites."""
        from dsactl import definitions, solutions, workloads
        from dsactl.errors import DsactlError

        if what not in ("definitions", "solutions", "suites", "all"):
            raise DsactlError(f"cannot list {what!r}; choose definitions, solutions, suites or all")
        if what in ("definitions", "all"):
            defs = [definitions.get(n) for n in definitions.CONTEST] if contest_only else definitions.all_definitions()
            console.print(table(f"definitions ({len(defs)})", ["name", "stage", "description"],
                                ((d.name, next(t for t in d.tags if t.startswith("stage:"))[6:], d.description)
                                 for d in defs)))
        if what in ("solutions", "all"):
            console.print(table("solutions", ["name", "language", "serves", "runs here", "description"],
                                ((s.name, s.language, " ".join(s.definitions),
                                  ": ".join(filter(None, solutions.runs_here(s))), s.description)
                                 for s in solutions.SOLUTIONS)))
            console.print(table("attention dispatch (which kernel the dsactl-attention entries run)",
                                ["implementation", "source", "GPUs", "heads", "serves"],
                                ((r.implementation, r.source, r.gpus, r.heads, r.serves) for r in dispatch.TABLE)))
            from dsactl.tune import families

            console.print(table("launch configurations (dsactl tune writes the tables)",
                                ["family", "kernel", "knobs", "configuration from"],
                                ((f.name, f"kernels/{f.module.replace('.', '/')}.py", f.knobs,
                                  families.config_sources(f)) for f in families.FAMILIES)))
        if what in ("suites", "all"):
            rows = []
            for name in workloads.SUITES:
                ws = workloads.suite(name)
                defs = sorted({w.definition for w in ws})
                rows.append((name, len(ws), len(defs), ", ".join(sorted({w.label for w in ws}))))
            console.print(table("suites", ["suite", "workloads", "definitions", "classes"], rows))
