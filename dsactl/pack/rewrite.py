"""Make a module's dsactl imports relative, so a bundle never imports an installed dsactl.

A bundle keeps the dsactl package layout (dsactl/kernels/topk/x.py is module
dsactl.kernels.topk.x) beside its main.py, and is always imported as a package:
flashinfer-bench imports `fib_python_<hash>.main`, load_bundle `dsactl_bundle_<hash>.main`.
Relative imports resolve inside the bundle under any such parent, and an installed dsactl,
even one already imported by the same process, is never touched.

Only the import statements change, each replaced in place by its relative form (and
dsactl.build.runtime by the bundle's jit_runtime); every other byte stays as it was.
Imports under `if TYPE_CHECKING:` never run and stay as they are.
`import dsactl.x` without `as` binds the name `dsactl` itself, which has no relative
form: write `from dsactl import x` or `import dsactl.x as x`.
"""

from __future__ import annotations

import ast
from typing import Mapping

from dsactl.errors import DsactlError
from dsactl.pack.closure import REDIRECTS, ROOT, ModuleFile, absolute_base, parse, repo_finder, runtime_nodes


def relative_name(package: str, target: str) -> str:
    """How package refers to target relatively: ("dsactl.kernels.topk", "dsactl.errors") -> "...errors"."""
    p, t = package.split("."), target.split(".")
    common = 0
    while common < min(len(p), len(t)) and p[common] == t[common]:
        common += 1
    return "." * (len(p) - common + 1) + ".".join(t[common:])


def rewrite_imports(module: ModuleFile) -> str:
    """module's source with every import of a dsactl module in relative form."""
    redirects = REDIRECTS
    tree = parse(module)
    edits = []
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            new = _rewrite_import(node, module, redirects)
        elif isinstance(node, ast.ImportFrom):
            new = _rewrite_from(node, module, redirects)
        else:
            continue
        if new is not None:
            edits.append((node, new))
    return _splice(module.source, edits)


def _rewrite_import(node: ast.Import, module: ModuleFile, redirects: Mapping[str, str]) -> str | None:
    if not any(_inside(alias.name) for alias in node.names):
        return None
    parts = []
    for alias in node.names:
        if not _inside(alias.name):
            parts.append(f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""))
            continue
        target = redirects.get(alias.name, alias.name)
        if alias.asname is None or target == ROOT:
            raise DsactlError(
                f"{module.origin}:{node.lineno}: `import {alias.name}` binds the name {ROOT}, which a bundle "
                f"cannot provide: write `from {alias.name.rpartition('.')[0] or ROOT} import "
                f"{alias.name.rpartition('.')[2]}` or `import {alias.name} as <name>`")
        parent, _, last = target.rpartition(".")
        parts.append(_from(module.package, parent, [(last, alias.asname)]))
    return "; ".join(parts)


def _rewrite_from(node: ast.ImportFrom, module: ModuleFile, redirects: Mapping[str, str]) -> str | None:
    base = absolute_base(node, module)
    if not _inside(base):
        return None
    redirected = base in redirects or any(f"{base}.{a.name}" in redirects for a in node.names)
    if node.level > 0 and not redirected:
        return None  # already relative
    if base in redirects:
        _check_provided(redirects[base], base, [a.name for a in node.names], module, node)
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in redirects:
            parent, _, last = redirects[submodule].rpartition(".")
            groups.setdefault(parent, []).append((last, alias.asname or alias.name))
        else:
            groups.setdefault(redirects.get(base, base), []).append((alias.name, alias.asname))
    return "; ".join(_from(module.package, target, names) for target, names in groups.items())


def _from(package: str, target: str, names: list[tuple[str, str | None]]) -> str:
    shown = ", ".join(name if asname in (None, name) else f"{name} as {asname}" for name, asname in names)
    return f"from {relative_name(package, target)} import {shown}"


def _inside(name: str) -> bool:
    return name.partition(".")[0] == ROOT


def _check_provided(replacement: str, base: str, names: list[str], module: ModuleFile, node: ast.ImportFrom) -> None:
    """The replacement module defines every name imported from the module it replaces."""
    body = parse(repo_finder(replacement)).body
    defined = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [n for n in names if n not in defined]
    if missing:
        public = ", ".join(sorted(n for n in defined if not n.startswith("_")))
        raise DsactlError(f"{module.origin}:{node.lineno}: imports {', '.join(missing)} from {base}, which "
                          f"bundles replace with {replacement} (it provides {public})")


def _splice(source: str, edits: list[tuple[ast.stmt, str]]) -> str:
    """Replace each node's exact source span (ast offsets are UTF-8 byte columns)."""
    data = source.encode("utf-8")
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        begin = starts[node.lineno - 1] + node.col_offset
        end = starts[node.end_lineno - 1] + node.end_col_offset
        data = data[:begin] + new.encode("utf-8") + data[end:]
    return data.decode("utf-8")
