"""The executor-overhead measurement: its run order, its arithmetic, and a whole measurement on the CPU."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys

import pytest

from dsactl.executor import overhead
from dsactl.executor.overhead import Run


def test_each_mode_runs_first_in_turn():
    order = overhead.schedule(["plain", "gpus", "ray"], rounds=3)
    assert order == [("plain", 1), ("gpus", 1), ("ray", 1), ("gpus", 2), ("ray", 2), ("plain", 2),
                     ("ray", 3), ("plain", 3), ("gpus", 3)]


def test_overhead_is_each_modes_mean_wall_time_over_the_plain_mean_and_skips_the_warmup():
    def run(mode, round_, wall):
        return Run(mode, round_, wall, pairs_s=wall - 1.0, passed=3, failed=0, errors=0, rc=0)

    runs = [run("warmup", 0, 500.0), run("plain", 1, 100.0), run("gpus", 1, 103.0), run("plain", 2, 104.0),
            run("gpus", 2, 107.0)]
    assert overhead.overheads(runs) == {"gpus": 105.0 / 102.0 - 1.0}
    assert runs[1].outside_s == 1.0


def test_a_measurement_runs_every_mode_after_a_warmup_and_writes_its_csv(tmp_path):
    modes = ["plain", "gpus"] + (["ray"] if importlib.util.find_spec("ray") else [])
    path = tmp_path / "executor.csv"
    r = subprocess.run([sys.executable, "-m", "dsactl.executor.overhead", "--suite", "hostile", "--rounds", "1",
                        "--modes", ",".join(modes), "--csv", str(path), "--",
                        "-w", "hostile-after-topk", "-w", "hostile-attention-empty-h16-bf16"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# command: ") and "--modes" in lines[0]
    assert [line.split(":")[0] for line in lines[1:len(modes)]] == [f"# overhead {m}" for m in modes[1:]]
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    assert [(row["mode"], row["round"]) for row in rows] == [("warmup", "0")] + [(m, "1") for m in modes]
    for row in rows:
        assert int(row["rc"]) == 0 and int(row["failed"]) == int(row["errors"]) == 0
        assert int(row["passed"]) == int(rows[0]["passed"]) > 0, "every mode checks the same pairs"
        assert float(row["wall_s"]) >= float(row["pairs_s"]) > 0
    for mode in modes[1:]:
        assert f"{mode}: " in r.stdout


def test_modes_outside_the_table_are_refused():
    with pytest.raises(ValueError, match="cloud"):
        overhead.measure("hostile", ["plain", "cloud"], rounds=1)


def test_a_measurement_cut_short_keeps_the_runs_it_finished(tmp_path, monkeypatch):
    """The CSV is rewritten after each run: a measurement killed mid-way (a machine's time limit) leaves its
    finished runs and a line saying how many were planned; none is left once every run is done."""
    def measure(suite, modes, rounds, extra, progress):
        progress(Run("warmup", 0, 220.0, 215.0, 3, 0, 0, 0))
        progress(Run("plain", 1, 141.0, 135.0, 3, 0, 0, 0))
        raise KeyboardInterrupt  # where a timeout's signal would end the process

    monkeypatch.setattr(overhead, "measure", measure)
    path = tmp_path / "executor.csv"
    with pytest.raises(KeyboardInterrupt):
        overhead.main(["--modes", "plain,gpus", "--rounds", "1", "--csv", str(path)])
    lines = path.read_text().splitlines()
    assert lines[1] == "# partial: 2 of 3 runs"
    rows = list(csv.DictReader(line for line in lines if not line.startswith("#")))
    assert [(row["mode"], row["round"]) for row in rows] == [("warmup", "0"), ("plain", "1")]

    def whole(suite, modes, rounds, extra, progress):
        runs = [Run("warmup", 0, 220.0, 215.0, 3, 0, 0, 0), Run("plain", 1, 141.0, 135.0, 3, 0, 0, 0),
                Run("gpus", 1, 133.0, 128.0, 3, 0, 0, 0)]
        for run in runs:
            progress(run)
        return runs

    monkeypatch.setattr(overhead, "measure", whole)
    assert overhead.main(["--modes", "plain,gpus", "--rounds", "1", "--csv", str(path)]) == 0
    lines = path.read_text().splitlines()
    assert not any(line.startswith("# partial") for line in lines)
    assert lines[1] == f"# overhead gpus: {133.0 / 141.0 - 1.0:+.2%}"
