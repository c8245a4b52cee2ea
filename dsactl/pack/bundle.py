"""The flashinfer-bench Solution JSON of one dsactl solution for one definition.

Sources: first main.py, the entry point, a generated `def run(<inputs>, <outputs>)` that
calls the solution, so that every bundle's entry is a plain function with the definition's
signature however the solution builds its callable; then, copied byte for byte at their paths in
the repository (kernels/topk/launcher.py), the files the solution's entry for this definition runs
(closure.py), the tuned-config tables they read and the CUDA sources their launchers load. The kernels
import each other relatively, so they run as they are under whatever package a bundle is imported as
(flashinfer-bench: fib_python_<hash>). Language: a launcher that builds CUDA with kernels/cuda_library.py
on first use and calls it through ctypes is, to flashinfer-bench, a Python entry point ("cuda" there means
a C++ symbol that it binds itself). Defaults for author and name prefix come from [tool.dsactl] in
pyproject.toml: the nearest one from the current folder upward, else dsactl's own.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsactl import definitions, solutions
from dsactl.errors import DsactlError
from dsactl.pack.closure import INSTALLED_KERNELS, KERNELS, checkout_tables, solution_closure
from dsactl.solutions import Solution

FIB_LANGUAGE = {"python": "python", "triton": "triton", "cuda": "python"}
ENTRY_FILE = "main.py"
ENTRY_FUNCTION = "run"
ENTRY_TEMPLATE = '''"""Entry point of bundle {name}.

{definition}, destination-passing style: the inputs, then the preallocated outputs,
which it writes. Packed by dsactl from {entry}.
"""

from {module} import {func} as _solution


def {run}({args}):
    _solution({args})
'''
CONFIG_TABLE = "dsactl"
CONFIG_FILE = "pyproject.toml"


def choose_solution(definition: str, name: str | None = None) -> Solution:
    """--solution, else the solution dsactl serves definition with (solutions.leading)."""
    definition = definitions.get(definition).name
    if name is None:
        return solutions.leading(definition)
    chosen = solutions.get(name)
    if not chosen.serves(definition):
        raise DsactlError(f"solution {name} does not serve {definition} "
                          f"(it serves {', '.join(chosen.definitions)})")
    return chosen


def project_defaults() -> dict[str, Any]:
    """[tool.dsactl] of the nearest pyproject.toml that has one, from the current folder
    upward, else from dsactl's own checkout."""
    import dsactl

    here = Path.cwd().resolve()
    folders = [here, *here.parents, Path(dsactl.__file__).resolve().parents[1]]
    for folder in folders:
        path = folder / CONFIG_FILE
        if path.is_file():
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise DsactlError("reading [tool.dsactl] needs Python 3.11 (tomllib): "
                                  "pass --name and --author") from None
            try:
                table = tomllib.loads(path.read_text()).get("tool", {}).get(CONFIG_TABLE)
            except tomllib.TOMLDecodeError as e:
                raise DsactlError(f"{path}: {e}") from None
            if table is not None:
                return table
    return {}


def build_bundle(solution: Solution, definition: str, name: str, author: str) -> dict[str, Any]:
    """The Solution JSON (as a dict) of solution for definition."""
    d = definitions.get(definition)
    if not solution.serves(d.name):
        raise DsactlError(f"solution {solution.name} does not serve {d.name}")
    if solution.language not in FIB_LANGUAGE:
        raise DsactlError(f"solution {solution.name}: cannot pack language {solution.language!r} "
                          f"(dsactl packs {', '.join(FIB_LANGUAGE)})")
    entry = solution.entry_for(d.name)
    check_signature(solution, d.signature, entry)
    closure, cuda = solution_closure(entry, solution.cuda_libs)
    module, _, func = entry.partition(":")
    main = ENTRY_TEMPLATE.format(name=name, definition=d.name, entry=entry,
                                 module="." + KERNELS + module.removeprefix(INSTALLED_KERNELS), func=func,
                                 run=ENTRY_FUNCTION, args=", ".join(d.signature))
    python = sorted((m for m in closure.modules.values() if m.source), key=lambda m: m.path)
    sources = [{"path": ENTRY_FILE, "content": main}]
    sources += [{"path": m.path, "content": m.source} for m in python]
    sources += [{"path": path, "content": text} for path, text in checkout_tables(closure).items()]
    sources += [{"path": f.path, "content": f.read()} for f in cuda]
    return {
        "name": name,
        "definition": d.name,
        "author": author,
        "spec": {
            "language": FIB_LANGUAGE[solution.language],
            "target_hardware": ["cuda"] if solution.needs_gpu else ["cpu", "cuda"],
            "entry_point": f"{ENTRY_FILE}::{ENTRY_FUNCTION}",
            "dependencies": [],
            "destination_passing_style": True,
            "binding": None,
        },
        "sources": sources,
        "description": solution.description,
    }


def check_signature(solution: Solution, signature: list[str], entry: str) -> None:
    """The entry's callable takes the definition's inputs then outputs, by these names."""
    params = inspect.signature(replace(solution, entry=entry).load()).parameters.values()
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_kw = [p.name for p in params if p.kind == p.KEYWORD_ONLY and p.default is p.empty]
    if named != signature or required_kw:
        raise DsactlError(f"{entry} takes ({', '.join(named + required_kw)}); the definition calls it with "
                          f"its inputs then outputs ({', '.join(signature)})")


def pack(definition: str, solution: str | None = None, name: str | None = None,
         author: str | None = None) -> dict[str, Any]:
    """`dsactl pack`: the checked bundle of the chosen solution, defaults from [tool.dsactl]."""
    from dsactl.pack.check import check_bundle

    chosen = choose_solution(definition, solution)
    defaults = project_defaults() if name is None or author is None else {}
    if author is None:
        author = defaults.get("author")
        if not author:
            raise DsactlError("no author: pass --author or set author in [tool.dsactl] of pyproject.toml")
    if name is None:
        prefix = defaults.get("name_prefix")
        # A solution already named with the prefix (dsactl-topk) does not repeat it.
        if prefix and chosen.name.startswith(prefix):
            prefix = None
        name = "_".join(p for p in (prefix, chosen.name, definition) if p)
    data = build_bundle(chosen, definition, name, author)
    check_bundle(data)
    return data


def write_bundle(data: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_bundle(path: str | Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DsactlError(f"no bundle at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DsactlError(f"{path} is not a JSON bundle: {e}") from None
    if not isinstance(data, dict):
        raise DsactlError(f"{path}: a bundle is a JSON object, got {type(data).__name__}")
    return data
