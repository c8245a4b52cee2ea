"""The --gpus / --ray options verify, bench and tune share, their executor, and the line that says which GPUs
ran the rows."""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable, Optional

import typer

GPUS_HELP = ("Run on the GPUs of this host, one worker process each: all, or indices like 0,1 "
             "(without a GPU: that many CPU workers under the Triton interpreter).")
RAY_HELP = ("Run on a Ray cluster, one actor per GPU: auto (the running cluster), local (start one here) "
            "or its address; needs pip install 'dsactl\\[ray]'.")


def gpus_option() -> Optional[str]:
    return typer.Option(None, "--gpus", help=GPUS_HELP)


def ray_option() -> Optional[str]:
    return typer.Option(None, "--ray", help=RAY_HELP)


def executor(ctx: typer.Context, gpus: Optional[str], ray: Optional[str]) -> Any:
    """The executor the options ask for. Its workers start now, to warm up while the command prepares; it is
    closed when the command ends, however it ends (the command may close it sooner: closing twice is fine)."""
    from dsactl import executor as executors

    run_on = executors.choose(gpus, ray)
    ctx.call_on_close(run_on.close)
    return run_on


def placements_line(rows: Iterable) -> str:
    """'ran on 2 devices: NVIDIA H200 GPU-1a2b... on node1 (12 rows), ...'; rows have gpu, gpu_uuid, host."""
    counts = Counter((r.gpu, r.gpu_uuid, r.host) for r in rows if r.gpu)
    parts = [f"{gpu}{f' {uuid}' if uuid else ''} on {host} ({n} rows)" for (gpu, uuid, host), n in counts.items()]
    return f"ran on {len(counts)} device{'' if len(counts) == 1 else 's'}: " + ", ".join(parts)
