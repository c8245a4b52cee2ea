"""`dsactl pack --check`: is a Solution JSON a bundle that runs anywhere?

Checked statically, nothing is run: the schema (flashinfer-bench's Solution, destination
passing style); every source path relative, normalized, without `..`; the entry function
exists and takes the definition's inputs then outputs, by name; the bundle is
self-contained (its Python reaches only its own files, torch, triton and the standard
library; every CUDA library it loads has its source inside); and its size.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from dsactl import definitions
from dsactl.errors import DsactlError
from dsactl.kernels.cuda_library import HEADER_SUFFIXES
from dsactl.pack.closure import ALLOWED_EXTERNAL, BUNDLE_ROOT, KERNELS, ModuleFile, bundle_finder, parse, python_closure

# dsactl's largest closures (entries, launchers, kernels, CUDA sources) are around 200 KiB;
# five times that means a closure pulled in what it should not.
MAX_BUNDLE_BYTES = 1 << 20
REQUIRED = ("name", "definition", "author", "spec", "sources")
OPTIONAL = ("description",)
SPEC_REQUIRED = ("language", "target_hardware", "entry_point")
SPEC_OPTIONAL = ("dependencies", "destination_passing_style", "binding")
LANGUAGES = ("python", "triton", "cpp", "cuda", "tilelang")
BINDINGS = (None, "tvm-ffi", "torch")
INSTALLED = "dsactl"  # a bundle that imports it would run the installed tool's files, not its own


@dataclass(frozen=True)
class FileRow:
    path: str
    kind: str  # python | cuda | other
    size: int  # bytes (UTF-8)
    reached: str  # the file that imports it, "entry point", "library <name> (...)", or "not reached"


@dataclass(frozen=True)
class Report:
    name: str
    definition: str
    author: str
    language: str
    entry_point: str
    signature: list[str]
    files: list[FileRow]
    cuda_libs: tuple[str, ...] = ()  # the CUDA libraries it loads, each built from its sources on first use

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def safe_path(path: str) -> None:
    """A path that stays inside the folder it is written to, whatever the platform."""
    pure = PurePosixPath(path)
    if (not path or "\\" in path or "\0" in path or pure.is_absolute() or ".." in pure.parts
            or str(pure) != path or pure.parts[0].endswith(":")):
        raise DsactlError(f"unsafe source path {path!r}: paths are relative, normalized, with / and no '..'")


def validate_schema(data: Any) -> None:
    """flashinfer-bench's Solution schema, with destination passing style, and safe unique paths."""
    _keys(data, "bundle", REQUIRED, OPTIONAL)
    for key in ("name", "definition", "author"):
        _text(data[key], key)
    if data.get("description") is not None and not isinstance(data["description"], str):
        raise DsactlError("description must be a string")
    spec = data["spec"]
    _keys(spec, "spec", SPEC_REQUIRED, SPEC_OPTIONAL)
    if spec["language"] not in LANGUAGES:
        raise DsactlError(f"spec.language {spec['language']!r} is not one of {', '.join(LANGUAGES)}")
    if not isinstance(spec["target_hardware"], list) or not spec["target_hardware"]:
        raise DsactlError("spec.target_hardware must be a non-empty list")
    for item in spec["target_hardware"] + spec.get("dependencies", []):
        _text(item, "spec.target_hardware/dependencies entry")
    _text(spec["entry_point"], "spec.entry_point")
    if spec["entry_point"].count("::") != 1:
        raise DsactlError(f"spec.entry_point {spec['entry_point']!r} must be 'file.py::function'")
    if spec.get("destination_passing_style", True) is not True:
        raise DsactlError("spec.destination_passing_style must be true: dsactl calls outputs preallocated")
    if spec.get("binding") not in BINDINGS:
        raise DsactlError(f"spec.binding {spec['binding']!r} is not one of {BINDINGS}")
    sources = data["sources"]
    if not isinstance(sources, list) or not sources:
        raise DsactlError("sources must be a non-empty list")
    seen = set()
    for source in sources:
        _keys(source, "source", ("path", "content"), ())
        _text(source["path"], "source path")
        _text(source["content"], f"content of {source['path']}")
        try:
            source["content"].encode("utf-8")
        except UnicodeEncodeError:
            raise DsactlError(f"content of {source['path']} is not valid Unicode text") from None
        safe_path(source["path"])
        if source["path"] in seen:
            raise DsactlError(f"source {source['path']} appears twice")
        seen.add(source["path"])


def check_bundle(data: Any) -> Report:
    validate_schema(data)
    files = {s["path"]: s["content"] for s in data["sources"]}
    entry_file, _, func = data["spec"]["entry_point"].partition("::")
    if entry_file not in files:
        raise DsactlError(f"entry file {entry_file} is not among the sources")
    if not entry_file.endswith(".py"):
        raise DsactlError(f"entry file {entry_file} is not Python: dsactl bundles have Python entry points")
    d = definitions.get(data["definition"])
    signature = entry_signature(files[entry_file], func, entry_file)
    if signature != d.signature:
        raise DsactlError(f"{entry_file}::{func} takes ({', '.join(signature)}); {d.name} calls it with its inputs "
                          f"then outputs ({', '.join(d.signature)})")
    reached, libraries = _reached(files, entry_file)
    rows = [FileRow(path, _kind(path), len(content.encode("utf-8")), reached.get(path, "not reached"))
            for path, content in files.items()]
    report = Report(data["name"], d.name, data["author"], data["spec"]["language"], data["spec"]["entry_point"],
                    signature, rows, libraries)
    if report.size > MAX_BUNDLE_BYTES:
        raise DsactlError(f"the bundle is {report.size} bytes, over the {MAX_BUNDLE_BYTES} limit")
    return report


def entry_signature(source: str, func: str, path: str) -> list[str]:
    """The parameter names of module-level `def func`, which must be callable with exactly them."""
    tree = parse(ModuleFile(path, False, source, path, path))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func]
    if not defs:
        raise DsactlError(f"{path} has no module-level `def {func}`")
    args = defs[-1].args
    if args.vararg or args.kwarg:
        raise DsactlError(f"{path}::{func} takes *args/**kwargs: name the definition's arguments instead")
    required_kw = [a.arg for a, default in zip(args.kwonlyargs, args.kw_defaults) if default is None]
    if required_kw:
        raise DsactlError(f"{path}::{func} has required keyword-only arguments {', '.join(required_kw)}")
    return [a.arg for a in args.posonlyargs + args.args]


def _reached(files: dict[str, str], entry_file: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """path -> how the entry point reaches it, and the CUDA libraries it loads; raises when the bundle
    is not self-contained."""
    module = entry_file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    if not all(part.isidentifier() for part in module.split(".")):
        raise DsactlError(f"entry file {entry_file} is not importable as a module")
    closure = python_closure(f"{BUNDLE_ROOT}.{module}", bundle_finder(files, BUNDLE_ROOT))
    if INSTALLED in closure.external:
        raise DsactlError(f"{closure.external[INSTALLED]} imports the installed {INSTALLED}: bundle files import "
                          "each other relatively (pack bundles with `dsactl pack`)")
    foreign = sorted(set(closure.external) - set(ALLOWED_EXTERNAL))
    if foreign:
        shown = ", ".join(f"{top} ({closure.external[top]})" for top in foreign)
        raise DsactlError(f"the bundle imports {shown}; bundles may import only {', '.join(ALLOWED_EXTERNAL)} "
                          "and the standard library")
    reached = {m.path: ("entry point" if m.path == entry_file else closure.via[name])
               for name, m in closure.modules.items() if m.source}
    for path, reader in closure.tables.items():
        if path in files:
            reached.setdefault(path, f"tuned table, read by {reader}")
    for library, loader in closure.cuda_libs.items():
        folders = [PurePosixPath(p).parent for p in files
                   if PurePosixPath(p).parent.parent == PurePosixPath(KERNELS) and p.endswith(f"/{library}.cu")]
        if len(folders) != 1:
            raise DsactlError(f"{loader} loads CUDA library {library}, but the bundle has "
                              f"{len(folders) or 'no'} {KERNELS}/<stage>/{library}.cu")
        for path in files:  # the source, its folder's headers and the shared ones of kernels/ (cuda_library)
            p = PurePosixPath(path)
            header = p.suffix in HEADER_SUFFIXES and p.parent in (folders[0], PurePosixPath(KERNELS))
            if (p.parent == folders[0] and p.name == f"{library}.cu") or header:
                reached.setdefault(path, f"library {library}, loaded by {loader}")
    return reached, tuple(sorted(closure.cuda_libs))


def _kind(path: str) -> str:
    suffix = PurePosixPath(path).suffix
    return "python" if suffix == ".py" else "cuda" if suffix == ".cu" or suffix in HEADER_SUFFIXES else "other"


def _keys(obj: Any, what: str, required: tuple[str, ...], optional: tuple[str, ...]) -> None:
    if not isinstance(obj, dict):
        raise DsactlError(f"{what} must be a JSON object")
    missing = [k for k in required if k not in obj]
    unknown = [k for k in obj if k not in required + optional]
    problems = [f"{label} {', '.join(keys)}" for label, keys in (("missing", missing), ("unknown", unknown)) if keys]
    if problems:
        raise DsactlError(f"{what}: {'; '.join(problems)}")


def _text(value: Any, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise DsactlError(f"{what} must be a non-empty string")
