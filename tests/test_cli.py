import os
import subprocess
import sys

from typer.testing import CliRunner

from dsactl.cli import app

runner = CliRunner()


def test_list_shows_definitions_solutions_and_suites():
    r = runner.invoke(app, ["list"], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64" in r.output
    assert "contest" in r.output and "edge" in r.output and "solutions" in r.output


def test_doctor_works_without_a_gpu():
    r = runner.invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "torch" in r.output and "nvcc" in r.output
    assert "GPU" in r.output


def _dsactl(*args):
    return subprocess.run([sys.executable, "-m", "dsactl", *args], capture_output=True, text=True, timeout=120)


def test_errors_are_one_line_on_stderr_with_nonzero_exit():
    r = _dsactl("list", "gadgets")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: cannot list 'gadgets'")
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_debug_shows_the_traceback():
    r = _dsactl("--debug", "list", "gadgets")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_unknown_command_is_a_usage_error():
    r = _dsactl("frobnicate")
    assert r.returncode == 2 and "No such command" in r.stderr


def test_tables_written_to_a_pipe_keep_long_names_on_one_line():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-m", "dsactl", "list"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64" in r.stdout
    again = subprocess.run([sys.executable, "-m", "dsactl", "list"], capture_output=True, text=True, timeout=120,
                           env={**env, "COLUMNS": "60"})
    assert "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64" not in again.stdout  # COLUMNS still rules
