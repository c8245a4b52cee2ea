"""The files a solution's entry point runs: its Python import closure inside kernels/, plus the CUDA
sources its launchers load. A bundle is a plain copy of them, at their paths in the repository.

Read statically with `ast`, never run: `import` and `from ... import`, at module level or inside
functions. The kernels import each other relatively, so the walk follows relative imports only; any
other import is external, and only torch, triton and the standard library are allowed. A package's
__init__ belongs to the closure whenever one of its modules does (Python runs it first). Not
followed: imports under `if TYPE_CHECKING:` (never run), importlib or __import__ with computed names,
and data files opened through __file__ other than the tuned-config tables below.

CUDA: a launcher loads library <name> by calling load_library("<name>") (a string literal or a
module-level string constant); the closure ships kernels/<stage>/<name>.cu, the headers of its
folder and those of kernels/, the convention of kernels/cuda_library.py, which builds them on first use
in a bundle.

Tables: a module that names its tuned-config table with table_path(__file__) (kernels/tuned.py) reads
<its folder>/tuned/<its name>.json at run time; the closure ships that file where the checkout has it.

The walk treats the files as one package, BUNDLE_ROOT, as flashinfer-bench and load_bundle import a
bundle (fib_python_<hash>.main): the same walk reads the checkout (pack) and a bundle (check.py).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Mapping

from dsactl.errors import DsactlError
from dsactl.kernels import cuda_library
from dsactl.kernels.tuned import table_path

# The kernels' folder at the repository root, and in a bundle; dsactl imports it as dsactl.kernels.
KERNELS = "kernels"
INSTALLED_KERNELS = "dsactl.kernels"
# A bundle runs where only these and the standard library are installed.
ALLOWED_EXTERNAL = ("torch", "triton")
LOAD_LIBRARY = "load_library"
TABLE_PATH = "table_path"
# The package a bundle's files are imported under when walked (flashinfer-bench: fib_python_<hash>).
BUNDLE_ROOT = "__bundle__"


@dataclass(frozen=True)
class ModuleFile:
    name: str  # dotted module name
    is_package: bool
    source: str  # "" for a package without an __init__ or with an empty one: nothing to ship
    path: str  # the file's path inside a bundle
    origin: str  # where it was read, for messages

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.name if self.is_package else self.name.rpartition(".")[0]


Finder = Callable[[str], "ModuleFile | None"]


@dataclass
class Closure:
    modules: dict[str, ModuleFile] = field(default_factory=dict)  # in discovery order
    via: dict[str, str] = field(default_factory=dict)  # module -> path of the file that first imported it
    external: dict[str, str] = field(default_factory=dict)  # top-level name -> path of its first importer
    cuda_libs: dict[str, str] = field(default_factory=dict)  # library -> path of the first file loading it
    computed_cuda: list[str] = field(default_factory=list)  # "file:line" of load_library(<not a constant>)
    tables: dict[str, str] = field(default_factory=dict)  # path of a tuned table -> the module reading it


def checkout_files() -> dict[str, str]:
    """Every Python file of the kernels in this checkout or installation, by its path in a bundle."""
    root = cuda_library.kernels_root()
    return {f"{KERNELS}/{path.relative_to(root).as_posix()}": _read_text(path)
            for path in sorted(root.rglob("*.py")) if "__pycache__" not in path.parts}


def bundle_finder(files: Mapping[str, str], root: str) -> Finder:
    """Modules of a bundle's files, named root.<path>; resolved the way Python does it:
    a package's __init__, then a module file, then a folder (namespace package)."""

    def find(name: str) -> ModuleFile | None:
        if name != root and not name.startswith(root + "."):
            return None
        rel = name[len(root) + 1:].replace(".", "/")
        init = f"{rel}/__init__.py" if rel else "__init__.py"
        if init in files:
            return ModuleFile(name, True, files[init], init, init)
        if rel and f"{rel}.py" in files:
            return ModuleFile(name, False, files[f"{rel}.py"], f"{rel}.py", f"{rel}.py")
        if not rel or any(p.startswith(rel + "/") for p in files):
            return ModuleFile(name, True, "", init, rel + "/")
        return None

    return find


def python_closure(entry: str, find: Finder, root: str = BUNDLE_ROOT) -> Closure:
    """Every module under `root` reachable from module `entry` through imports."""
    closure = Closure()
    todo: list[tuple[str, str]] = [(entry, "the entry point")]
    while todo:
        name, importer = todo.pop(0)
        if name in closure.modules:
            continue
        found = find(name)
        if found is None:
            raise DsactlError(f"{importer} imports {name.removeprefix(root + '.')}, which is not in the bundle")
        closure.modules[name] = found
        closure.via[name] = importer
        parent = name.rpartition(".")[0]
        if parent:
            todo.append((parent, found.path))
        tree = parse(found)
        constants = _string_constants(tree)
        for node in runtime_nodes(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _follow(closure, todo, alias.name, found.path, root)
            elif isinstance(node, ast.ImportFrom):
                base = absolute_base(node, found)
                if not _follow(closure, todo, base, found.path, root):
                    continue
                package = find(base)
                if package is not None and package.is_package:
                    for alias in node.names:
                        if alias.name != "*" and find(f"{base}.{alias.name}") is not None:
                            todo.append((f"{base}.{alias.name}", found.path))
            elif isinstance(node, ast.Call) and _callee(node.func) == LOAD_LIBRARY:
                library = _library_name(node, constants)
                if library is None:
                    closure.computed_cuda.append(f"{found.origin}:{node.lineno}")
                else:
                    closure.cuda_libs.setdefault(library, found.path)
            elif isinstance(node, ast.Call) and _callee(node.func) == TABLE_PATH and _names_own_file(node):
                closure.tables.setdefault(table_of(found.path), found.path)
    return closure


def parse(module: ModuleFile) -> ast.Module:
    try:
        return ast.parse(module.source, filename=module.origin)
    except SyntaxError as e:
        raise DsactlError(f"{module.origin}:{e.lineno}: not valid Python ({e.msg})") from None


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, as ast.walk, except inside `if TYPE_CHECKING:` bodies."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _callee(node.test) == "TYPE_CHECKING":
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def absolute_base(node: ast.ImportFrom, module: ModuleFile) -> str:
    """The module named after `from`, made absolute."""
    if node.level == 0:
        return node.module or ""
    parts = module.package.split(".")
    if node.level > len(parts):
        raise DsactlError(f"{module.origin}:{node.lineno}: relative import goes above the {parts[0]} package")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _follow(closure: Closure, todo: list[tuple[str, str]], target: str, importer: str, root: str) -> bool:
    """Queue target when it lies under root, else note it as external; whether it was queued."""
    top = target.partition(".")[0]
    if top == root:
        todo.append((target, importer))
        return True
    if top != "__future__" and top not in sys.stdlib_module_names:
        closure.external.setdefault(top, importer)
    return False


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _names_own_file(call: ast.Call) -> bool:
    return len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id == "__file__"


def table_of(module_path: str) -> str:
    """The tuned table of the module at module_path (a bundle path): kernels/tuned.py's table_path."""
    return table_path(module_path).as_posix()


def checkout_tables(closure: Closure) -> dict[str, str]:
    """Bundle path -> text of each table the closure reads that this checkout has."""
    root = cuda_library.kernels_root()
    found = {path: root / PurePosixPath(path).relative_to(KERNELS) for path in sorted(closure.tables)}
    return {path: _read_text(file) for path, file in found.items() if file.is_file()}


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """NAME = "text" at module level."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _library_name(call: ast.Call, constants: dict[str, str]) -> str | None:
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "name"), None)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name):
        return constants.get(arg.id)
    return None


def _read_text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DsactlError(f"{path} is not UTF-8 text: a bundle carries sources as text") from None


@dataclass(frozen=True)
class CudaFile:
    path: str  # inside the bundle
    source: Path  # in the checkout
    library: str

    def read(self) -> str:
        return _read_text(self.source)


def solution_closure(entry: str, declared_libs: tuple[str, ...] = ()) -> tuple[Closure, list[CudaFile]]:
    """The closure of a solution's entry ("dsactl.kernels.x.y:func") in this checkout, checked
    self-contained: outside kernels/ it imports only torch, triton and the standard library."""
    module = entry.partition(":")[0]
    if not module.startswith(INSTALLED_KERNELS + "."):
        raise DsactlError(f"entry {entry} is outside {INSTALLED_KERNELS}: a bundle carries kernels/ only")
    files = checkout_files()
    closure = python_closure(f"{BUNDLE_ROOT}.{KERNELS}.{module.removeprefix(INSTALLED_KERNELS + '.')}",
                             bundle_finder(files, BUNDLE_ROOT))
    foreign = {top: via for top, via in closure.external.items() if top not in ALLOWED_EXTERNAL}
    if foreign:
        shown = ", ".join(f"{top} (imported by {via})" for top, via in sorted(foreign.items()))
        raise DsactlError(f"{entry} needs {shown}; kernels import only {', '.join(ALLOWED_EXTERNAL)}, the "
                          f"standard library and, relatively, each other")
    libraries = dict(closure.cuda_libs)
    for lib in declared_libs:
        libraries.setdefault(lib, "the solution's cuda_libs")
    if closure.computed_cuda and not declared_libs:
        raise DsactlError(f"load_library with a computed name at {', '.join(closure.computed_cuda)}: "
                          "list the libraries in the solution's cuda_libs")
    return closure, _cuda_files(libraries)


def _cuda_files(libraries: dict[str, str]) -> list[CudaFile]:
    root = cuda_library.kernels_root()
    files: dict[str, CudaFile] = {}
    for lib in sorted(libraries):
        source = cuda_library.find(lib)
        for path in (source.path, *source.headers):
            rel = f"{KERNELS}/{path.relative_to(root).as_posix()}"
            files.setdefault(rel, CudaFile(rel, path, lib))
    return list(files.values())
