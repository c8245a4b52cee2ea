"""dsactl.probe: a peer's first call made in a child process, whose failure or death is one line of reason."""

from dsactl import probe

CRASH = "import ctypes; ctypes.string_at(0)"  # a read of address 0: the child dies of SIGSEGV


def test_code_that_runs_to_its_end_has_no_failure():
    assert probe.failure("import sys; sys.stdout.write('fine')") == ""


def test_a_child_killed_by_a_signal_is_named_by_it():
    assert probe.failure(CRASH) == "a first call in a child process was killed by SIGSEGV"


def test_a_child_that_fails_gives_its_last_line_of_stderr():
    why = probe.failure("import sys; print('detail', file=sys.stderr); raise RuntimeError('no kernel for sm_80')")
    assert why == "a first call in a child process failed: RuntimeError: no kernel for sm_80"
    assert probe.failure("import sys; sys.exit(3)") == "a first call in a child process failed: exit status 3"


def test_the_child_finds_modules_on_the_given_paths_first(tmp_path):
    (tmp_path / "peer_under_probe.py").write_text("def call():\n    return 1\n")
    code = "import peer_under_probe; assert peer_under_probe.call() == 1"
    assert probe.failure(code, [str(tmp_path)]) == ""
    assert "ModuleNotFoundError: No module named 'peer_under_probe'" in probe.failure(code)


def test_a_child_that_hangs_is_given_up_after_the_timeout():
    assert probe.failure("import time; time.sleep(30)", timeout_s=0.5) == (
        "a first call in a child process did not finish in 0.5 s")
