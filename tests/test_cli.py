import json
import os
import subprocess
import sys

import pytest
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


# --- output paths, one-line errors, lazy imports, table widths -----------------------------

@pytest.mark.parametrize("args", [
    ["pack", "-d", "dsa_topk_page_transform_topk2048_ps64", "-o", "{dir}"],
    ["doctor", "--json", "{dir}"],
    ["profile", "--import", "missing.ncu-rep", "-o", "{file}"],
    ["verify", "--json", "{file}/report.json"],
    ["verify", "--json", "{dir}"],
], ids=["pack-dir", "doctor-dir", "profile-file", "verify-under-a-file", "verify-dir"])
def test_bad_output_paths_are_one_line_before_any_work(tmp_path, args):
    a_file = tmp_path / "plain"
    a_file.write_text("")
    r = _dsactl(*(a.format(dir=tmp_path, file=a_file) for a in args))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: --") and r.stdout == ""  # nothing ran: no header, no table


def test_an_oserror_while_writing_is_one_line(monkeypatch, capsys, tmp_path):
    from dsactl import cli

    def full_disk(path, payload):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(sys, "argv", ["dsactl", "doctor", "--json", str(tmp_path / "facts.json")])
    monkeypatch.setattr("dsactl.cli.doctor.write_json", full_disk)
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 2
    assert capsys.readouterr().err == f"error: No space left on device: {tmp_path / 'facts.json'}\n"


HELP_IMPORTS = """
import sys
from dsactl.cli import app
try:
    app(sys.argv[1:])
except SystemExit:
    pass
print(sorted(m for m in ("torch", "triton", "numpy", "pandas") if m in sys.modules))
"""


@pytest.mark.parametrize("command", ["", "list", "doctor", "build", "verify", "bench", "pack", "profile"])
def test_help_imports_no_torch(command):
    r = subprocess.run([sys.executable, "-c", HELP_IMPORTS, *filter(None, [command]), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_doctor_names_what_verify_interprets(tmp_path):
    import torch

    r = runner.invoke(app, ["doctor", "--json", str(tmp_path / "facts.json")], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    facts = json.loads((tmp_path / "facts.json").read_text())["solutions"]
    if torch.cuda.is_available():
        return
    assert facts["dsactl-attention"]["runs"] == "interpreted"  # pure Triton
    assert facts["dsactl-indexer"]["runs"] == "no"  # loads the CUDA top-k
    assert facts["torch-topk"]["runs"] == "yes"
    assert "verify --quick interprets it" in r.output


def test_tables_fit_100_columns_with_whole_numbers():
    from rich.console import Console

    from dsactl.cli.render import table

    console = Console(width=100, record=True)
    long_name = "dsa_sparse_attention_h128_ckv512_kpe64_topk2048_ps64_fp8kv_lsee_topklen_sink"
    console.print(table("t", ["definition", "solution", "passed", "skipped", "max abs", "matched", "call ms"],
                        [(long_name, "dsactl-attention-fp8kv-lsee-topklen-sink", 12, 147, "0.00390625",
                          "[green]100.00%[/]", "1234.5")]))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100
    for number in ("147", "0.00390625", "100.00%", "1234.5"):
        assert any(number in line for line in lines), number
    assert "max abs" in lines[2] and "matched" in lines[2]  # headers of numbers stay on one line
