"""The repository keeps its promises: README commands, CI, packaging."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    return [line.strip() for line in text.splitlines() if line.startswith("    python -m pip install")]


def test_readme_has_exactly_two_setup_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2
    main, tests = commands
    assert "dsactl verify" in main and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_every_python_package_is_installed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = set()
    for init in (ROOT / "dsactl").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in (ROOT / "kernels").rglob("__init__.py"):
        found.add(".".join(("dsactl", *init.parent.relative_to(ROOT).parts)))
    for tables in (ROOT / "kernels").rglob("tuned"):  # data packages: importable folders, so listed (no warning)
        if tables.is_dir():
            found.add(".".join(("dsactl", *tables.relative_to(ROOT).parts)))
    assert found == listed, f"pyproject packages differ: missing {found - listed}, extra {listed - found}"


def test_kernel_sources_ship_as_package_data():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dsactl.kernels"]
    for src in (ROOT / "kernels").rglob("*.cu*"):
        rel = src.relative_to(ROOT / "kernels").as_posix()
        assert any(re.fullmatch(p.replace(".", r"\.").replace("*", r"[^/]*"), rel) for p in cfg), rel


def test_readme_result_tables_are_rendered_from_the_committed_results():
    from dsactl import results

    text = (ROOT / "README.md").read_text()
    names = [m.group("name") for m in results.BLOCK.finditer(text) if not m.group("gpu")]
    shown = [name for name in results.README_TABLES if name in results.available(results.README_GPU)]
    assert names == shown, "the README shows, in order, each of README_TABLES that its GPU has results for"
    # A table of another GPU's: a run the README's GPU has not made.
    for m in results.BLOCK.finditer(text):
        if m.group("gpu"):
            assert m.group("name") in results.available(m.group("gpu")), m.group(0)
            assert m.group("name") not in shown, f"{m.group('name')} is shown from the README's GPU already"
    tables = [m for m in results.BLOCK.finditer(text) if m.group("name") != "machine"]
    assert all(m.group("body").count("\n|") >= 2 for m in tables), "no empty table"
    assert results.stale(text) == [], "run: python -m dsactl.results --write README.md"


def test_every_committed_profile_renders_its_tables(capsys):
    from dsactl import results

    gpus = sorted(_profile_folders())
    assert results.README_GPU in gpus
    for gpu in gpus:
        names = results.available(gpu)
        assert names, f"profiles/{gpu}/ holds no results"
        assert results.main(["--print", gpu]) == 0
        out = capsys.readouterr().out
        for name in names:
            assert f"{name} ({results.TABLES[name][0]}):\n\n{results.render(name, gpu)}" in out
    assert results.main(["--print", "no-such-gpu"]) == 1
    assert "holds none of" in capsys.readouterr().err


def test_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _tracked() -> list[Path]:
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]
    return [ROOT / p for p in out.decode().split("\0") if p]


def _profile_folders() -> dict[str, list[Path]]:
    """profiles/<gpu>/ -> its tracked files (those present)."""
    folders: dict[str, list[Path]] = {}
    for p in _tracked():
        if p.is_relative_to(ROOT / "profiles") and p.parent != ROOT / "profiles" and p.exists():
            folders.setdefault(p.relative_to(ROOT / "profiles").parts[0], []).append(p)
    return folders


# A GPU's folder holds every reproduce.sh area's current results (CSVs, their charts, the Nsight tables): small
# enough that the repository stays a quick clone.
PROFILE_BYTES = 4 * 2**20


def test_profiles_hold_current_results_only():
    files = [p for p in _tracked() if p.is_relative_to(ROOT / "profiles") and p.exists()]
    for gpu, held in _profile_folders().items():
        assert len(held) <= 80 and sum(p.stat().st_size for p in held) <= PROFILE_BYTES, f"profiles/{gpu}/ is small"
    logs = [p for p in files if p.suffix in (".patch", ".log", ".ncu-rep") or (p.suffix == ".txt" and p.name != "command.txt")]
    assert not logs, f"no logs, patches or reports under profiles/: {logs}"


def test_no_work_log_labels_in_the_tree():
    """The tree says what is and why; when and in which work period it was done is git history's."""
    label = re.compile(r"\b(sessions? ?\d+|session\d+|issues? #?\d+|the H200 image)\b", re.I)
    found = []
    for path in _tracked():
        if path.suffix in (".py", ".cu", ".cuh", ".md", ".sh", ".toml", ".txt", ".json", ".csv") and path.exists():
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if label.search(line) and path.name != "test_project.py":
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not found, "\n".join(found[:20])
