"""dsactl doctor: what this machine has and what can run here."""

from __future__ import annotations

import typer

from dsactl.cli.paths import output_file
from dsactl.cli.render import console, table, write_json


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(json_path: str = typer.Option(None, "--json", help="Also write the facts as JSON.")) -> None:
        """GPU, clocks, memory, toolchain versions, buildable archs, runnable solutions."""
        output_file(json_path, "--json")
        from dsactl import device, solutions

        info = device.machine()
        if info.gpus:
            console.print(table("GPU", ["#", "name", "cc", "SMs", "memory GiB", "L2 MiB", "SM MHz (now/max)",
                                        "mem MHz", "driver"],
                                ((i, g.name, f"{g.capability[0]}.{g.capability[1]}", g.sm_count, f"{g.memory_gib:.0f}",
                                  f"{g.l2_mib:.0f}" if g.l2_mib else "?", f"{g.sm_clock_mhz}/{g.max_sm_clock_mhz}",
                                  g.mem_clock_mhz, g.driver) for i, g in enumerate(info.gpus))))
        else:
            console.print(f"[yellow]GPU: none ({info.gpu_problem})[/yellow]")
        console.print(table("tools", ["tool", "version", "detail"],
                            ((t.name, t.version or "[red]missing[/red]", t.detail) for t in info.tools)))
        archs = ", ".join(a.removeprefix("compute_") for a in info.nvcc_archs) or "none (no nvcc)"
        console.print(f"nvcc can target: {archs}")
        avail = [(s.name, *solutions.runs_here(s)) for s in solutions.SOLUTIONS]
        console.print(table("solutions on this machine", ["solution", "runs here", "why"], avail))
        if any(runs == "interpreted" for _, runs, _ in avail):
            console.print("interpreted: `dsactl verify` runs these on the CPU under the Triton interpreter "
                          "(slow, so a --quick subset); bench and profile need a GPU")
        if json_path:
            import dataclasses

            write_json(json_path, {**dataclasses.asdict(info),
                                   "solutions": {n: {"ok": runs == "yes", "runs": runs, "reason": why}
                                                 for n, runs, why in avail}})
