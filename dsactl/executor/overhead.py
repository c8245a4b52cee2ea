"""What an executor adds to a sweep: `dsactl verify` over one suite run in its own process ("plain"), on a
worker process ("gpus": --gpus 0) and on a Ray cluster ("ray": --ray ADDRESS, a local cluster this process
starts for the measurement and stops after it), in turns after a warm-up run, each run's wall time split
into its pairs' own seconds (what the JSON reports per solution x workload pair) and the rest.

    python -m dsactl.executor.overhead --suite scale --rounds 2 --csv profiles/<gpu>/executor.csv

The warm-up pays the first Triton compiles and CUDA-library loads, which would otherwise land on whichever
mode runs first; the turns rotate the modes' order so that drift in the GPU's clocks spreads over all of
them. Overhead is a mode's mean wall time over the plain runs' mean. The CSV is rewritten after every run,
so a measurement cut short (a machine's time limit) keeps the runs it finished and says how many it planned.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Sequence

# verify's arguments per mode. "ray" joins the cluster measure() starts: a sweep on a running cluster is
# what a user of --ray runs; starting the cluster is a cost paid once, outside any sweep.
MODES: dict[str, Callable[[str], list[str]]] = {
    "plain": lambda ray_address: [],
    "gpus": lambda ray_address: ["--gpus", "0"],
    "ray": lambda ray_address: ["--ray", ray_address],
}
WARMUP = "warmup"  # the first run's mode name: a plain run whose time is not counted


@dataclass(frozen=True)
class Run:
    mode: str
    round: int  # 0: the warm-up
    wall_s: float
    pairs_s: float  # the sum of the per-pair seconds the run's JSON reports
    passed: int
    failed: int
    errors: int
    rc: int

    @property
    def outside_s(self) -> float:
        """Wall time spent outside the pairs: start-up, workers, placement, result transport."""
        return self.wall_s - self.pairs_s


def verify_command(suite: str, json_path: Path, mode_args: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "dsactl", "verify", "--suite", suite, "--json", str(json_path),
            *mode_args, *extra]


def run_once(mode: str, round_: int, command: list[str], json_path: Path) -> Run:
    """Time one verify run from process start to exit and read its pairs back."""
    start = time.perf_counter()
    rc = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - start
    results = json.loads(json_path.read_text())["results"] if json_path.is_file() else []
    status = [r["status"] for r in results]
    return Run(mode, round_, wall, sum(r["seconds"] or 0.0 for r in results), status.count("passed"),
               status.count("failed"), status.count("error"), rc)


def schedule(modes: Sequence[str], rounds: int) -> list[tuple[str, int]]:
    """(mode, round) in run order: round r starts r modes further along, so each mode runs first once every
    len(modes) rounds."""
    return [(modes[(r + i) % len(modes)], r + 1) for r in range(rounds) for i in range(len(modes))]


def ray_cluster() -> tuple[str, Callable[[], None]]:
    """A Ray cluster on this machine, owned by this process, for verify --ray to join: its address and what
    stops it. It has the GPUs the driver reports (with none, verify's actors take one CPU each)."""
    import ray

    from dsactl.device import driver_gpu_count

    context = ray.init(address="local", num_gpus=driver_gpu_count(), include_dashboard=False,
                       logging_level="error", log_to_driver=False)
    return context.address_info["gcs_address"], ray.shutdown


def measure(suite: str, modes: Sequence[str], rounds: int, extra: Sequence[str] = (),
            progress: Callable[[Run], None] = lambda run: None) -> list[Run]:
    """A warm-up run, then every mode once per round in rotating order."""
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"unknown modes {unknown}: choose from {sorted(MODES)}")
    address, stop = ray_cluster() if "ray" in modes else ("", lambda: None)
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for mode, round_ in [(WARMUP, 0), *schedule(modes, rounds)]:
                path = Path(tmp) / f"{mode}-{round_}.json"
                args = MODES["plain" if mode == WARMUP else mode](address)
                runs.append(run_once(mode, round_, verify_command(suite, path, args, extra), path))
                progress(runs[-1])
    finally:
        stop()
    return runs


def overheads(runs: Sequence[Run]) -> dict[str, float]:
    """Each timed mode's mean wall time over the plain runs' mean, minus one (0.03: 3% slower)."""
    walls: dict[str, list[float]] = {}
    for run in runs:
        if run.mode != WARMUP:
            walls.setdefault(run.mode, []).append(run.wall_s)
    if "plain" not in walls:  # cut short before a plain run
        return {}
    plain = statistics.fmean(walls["plain"])
    return {mode: statistics.fmean(w) / plain - 1.0 for mode, w in walls.items() if mode != "plain"}


COLUMNS = [f.name for f in fields(Run)] + ["outside_s"]


def write_csv(runs: Sequence[Run], path: Path, command: str, planned: int | None = None) -> None:
    """The runs so far; planned: how many the measurement has, for a "# partial" line while fewer are done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(f"# command: {json.dumps(command)}\n")
        if planned is not None and len(runs) < planned:
            f.write(f"# partial: {len(runs)} of {planned} runs\n")
        for mode, value in overheads(runs).items():
            f.write(f"# overhead {mode}: {value:+.2%}\n")
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for run in runs:
            row = {**asdict(run), "outside_s": run.outside_s}
            writer.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsactl.executor.overhead",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="scale")
    parser.add_argument("--modes", default="plain,gpus,ray", help="comma-separated: " + ", ".join(MODES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--csv", type=Path, required=True)
    parser.add_argument("verify_args", nargs="*", help="more verify arguments, after --, e.g. -- -w WORKLOAD")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "plain" not in modes:
        parser.error("--modes must include plain: the overhead is measured against it")

    command = " ".join(["python -m dsactl.executor.overhead", *(argv or sys.argv[1:])])
    planned = 1 + len(schedule(modes, args.rounds))
    done: list[Run] = []

    def show(run: Run) -> None:
        print(f"{run.mode:7s} round {run.round}: {run.wall_s:7.1f} s wall, {run.pairs_s:7.1f} s in pairs, "
              f"{run.outside_s:6.2f} s outside; {run.passed} passed, {run.failed} failed, {run.errors} errors"
              + (f", exit {run.rc}" if run.rc else ""), flush=True)
        done.append(run)
        write_csv(done, args.csv, command, planned)

    runs = measure(args.suite, modes, args.rounds, args.verify_args, show)
    for mode, value in overheads(runs).items():
        print(f"{mode}: {value:+.1%} wall time against plain")
    return 1 if any(r.rc or r.failed or r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
