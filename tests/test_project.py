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
    assert found == listed, f"pyproject packages differ: missing {found - listed}, extra {listed - found}"


def test_kernel_sources_ship_as_package_data():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dsactl.kernels"]
    for src in (ROOT / "kernels").rglob("*.cu*"):
        rel = src.relative_to(ROOT / "kernels").as_posix()
        assert any(re.fullmatch(p.replace(".", r"\.").replace("*", r"[^/]*"), rel) for p in cfg), rel
