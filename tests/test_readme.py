"""Every `dsactl ...` command the README shows is run here: those a CPU runs in seconds on every
test run, those that take minutes on a CPU as slow tests, and those that need a GPU are listed
explicitly and must say so in one line on a CPU. On a GPU, --sanitize and --compare run here (the
other GPU examples run in profiles/reproduce.sh's areas). A README example missing from these lists
fails the first test, so a new example cannot go untested."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dsactl.cli import app
from dsactl.device import gpu_slug
from dsactl.errors import DsactlError
from dsactl.kernels.cuda_library import BUILD_DIR_ENV
from dsactl.results import README_GPU

REPO = Path(__file__).resolve().parents[1]

# Seconds on a CPU (the files they write land in a temporary folder).
FAST = (
    "dsactl list",
    "dsactl doctor",
    "dsactl verify --suite edge --workload edge-topk-mtp --save-failures repro/",
    "dsactl profile --import tests/fixtures/ncu/attention.ncu-rep",
    "dsactl pack -d dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64 -o attention.json",
    "dsactl pack --check attention.json",
)
# Minutes on a CPU (every kernel compiled, or Triton interpreted over whole suites).
SLOW = (
    "dsactl build --arch sm90a",
    "dsactl build --arch sm100a --jobs 2",
    "dsactl verify --suite contest",
    "dsactl verify --suite edge --json verify.json --gpus 0",
    "dsactl verify --bundle attention.json",
    "dsactl verify --suite all",
)
SANITIZE = "dsactl verify --quick --sanitize"
# The committed contest run of the README's GPU: a comparison means something against a run of the same GPU.
COMPARE = f"dsactl bench --compare profiles/{README_GPU}/contest.csv"
# Need a CUDA GPU (timing, Nsight Compute, compute-sanitizer): on a CPU, one line that says so.
GPU_ONLY = (
    SANITIZE,
    "dsactl bench --suite scale -d 'dsa_sparse_attention_h128*' --no-reference -b flashmla",
    COMPARE,
    "dsactl bench --pipeline --heads 128 --batch 32",
    "dsactl tune -d 'dsa_sparse_attention_*' --suite scale --json tune.json",
    "dsactl profile --ncu warps --definition 'dsa_sparse_attention_h64*' -w scale-attention-h64-t128-fp8 -b flashmla",
)
# Commands that read a file an earlier example writes: run after it.
NEEDS = {"dsactl pack --check attention.json": "dsactl pack -d dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64 "
                                               "-o attention.json",
         "dsactl verify --bundle attention.json": "dsactl pack -d dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64 "
                                                  "-o attention.json"}


def readme_commands() -> list[str]:
    """The dsactl commands of the README's indented blocks (split at &&, comments dropped) and inline code."""
    text = (REPO / "README.md").read_text()
    found = []
    for line in text.splitlines():
        if line.startswith("    "):
            for part in line.split("&&"):
                command = re.sub(r"\s+#.*$", "", part).strip()
                if command.startswith("dsactl "):
                    found.append(command)
    found += re.findall(r"`(dsactl [^`]*)`", text)
    return list(dict.fromkeys(found))


def _command(item) -> str:
    return item.values[0] if hasattr(item, "values") else item


def test_every_readme_command_is_run_here():
    listed = FAST + tuple(map(_command, SLOW)) + GPU_ONLY
    assert len(set(listed)) == len(listed)
    assert set(readme_commands()) == set(listed)


def test_the_compare_example_names_a_committed_contest_run_of_the_readmes_gpu():
    from dsactl.bench import report

    run = report.read_csv(REPO / shlex.split(COMPARE)[-1])
    assert gpu_slug(run.meta["gpu"]) == README_GPU and {r.workload for r in run.results} >= {"contest-attention-000"}


@pytest.fixture
def gpu_workdir(tmp_path, monkeypatch):
    """A folder to run in, with the checkout's tests/ and profiles/ to read, and profile and bench output
    (profiles/<gpu>/ by default) kept in it; the checkout's build (`dsactl build`) is the one loaded."""
    for name in ("tests", "profiles"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("dsactl.device.profiles_dir", lambda gpu: tmp_path / "out" / "profiles")
    return tmp_path


@pytest.fixture
def workdir(gpu_workdir, monkeypatch):
    """gpu_workdir, with builds made in it rather than in the checkout."""
    monkeypatch.setenv(BUILD_DIR_ENV, str(gpu_workdir / "build"))
    return gpu_workdir


def run(command: str):
    args = shlex.split(command)[1:]
    if command in NEEDS:
        done = CliRunner().invoke(app, shlex.split(NEEDS[command])[1:])
        assert done.exit_code == 0, done.output
    return CliRunner().invoke(app, args, env={"COLUMNS": "100"})


@pytest.mark.parametrize("command", FAST)
def test_fast_readme_commands_run(workdir, command):
    result = run(command)
    assert result.exit_code == 0, result.output + repr(result.exception)


@pytest.mark.slow
@pytest.mark.parametrize("command", SLOW)
def test_slow_readme_commands_run(workdir, command):
    # A child process as a user runs it: `build` refuses the interpreter the CPU tests switch on.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    for step in filter(None, (NEEDS.get(command), command)):
        done = subprocess.run([sys.executable, "-m", "dsactl", *shlex.split(step)[1:]], cwd=workdir, env=env,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU these run (the tests below, profiles/reproduce.sh)")
@pytest.mark.parametrize("command", GPU_ONLY)
def test_gpu_only_readme_commands_say_so_on_a_cpu(workdir, command):
    result = run(command)
    assert result.exit_code != 0
    message = str(result.exception) if isinstance(result.exception, DsactlError) else result.output
    assert "GPU" in message and "\n" not in message.strip(), message


@pytest.mark.gpu
@pytest.mark.slow  # compute-sanitizer replays every call of the quick subset under memcheck, then racecheck: minutes
def test_gpu_readme_sanitize_example_verifies_and_finds_no_sanitizer_errors(gpu_workdir):
    result = run(SANITIZE)
    assert result.exit_code == 0, result.output  # 1: a failed pair or a sanitizer error; 3: nothing ran
    assert "memcheck" in result.output and "racecheck" in result.output, result.output


@pytest.mark.gpu
@pytest.mark.slow  # the contest suite, every solution, baseline and the reference, three trials each: minutes
def test_gpu_readme_compare_example_compares_every_row_of_this_gpus_run(gpu_workdir):
    """On the README's GPU, its --compare line as it stands; on another, the same against that GPU's own
    committed run (none: skipped). Every committed row is compared, with no warning that the GPU or the
    timing method differ, and the exit status is 1 exactly when a regression is reported."""
    from dsactl.bench import report

    command = COMPARE.replace(f"profiles/{README_GPU}/", f"profiles/{gpu_slug(torch.cuda.get_device_name())}/")
    committed = REPO / shlex.split(command)[-1]
    if not committed.is_file():
        pytest.skip(f"no committed contest run of this GPU ({committed.relative_to(REPO)})")
    result = run(command)
    assert "differs" not in result.output, result.output
    compared = re.search(r"compared (\d+) rows: (\d+) regressions", result.output)
    assert compared and int(compared[1]) == len(report.read_csv(committed).results), result.output
    assert result.exit_code == (1 if int(compared[2]) else 0), result.output
