"""dsactl pack: closure, bundle, check, unpack, load_bundle, the bundle's CUDA builder, interop."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import dsactl.kernels.topk
from dsactl import definitions, harness, solutions, workloads
from dsactl.cli import app
from dsactl.errors import DsactlError
from dsactl.pack import jit_runtime
from dsactl.pack.bundle import build_bundle, pack, project_defaults, read_bundle, write_bundle
from dsactl.pack.check import MAX_BUNDLE_BYTES, check_bundle
from dsactl.pack.closure import repo_finder
from dsactl.pack.loader import load_bundle
from dsactl.pack.rewrite import relative_name
from dsactl.pack.unpack import unpack
from dsactl.solutions import Solution

TOPK = "dsa_topk_page_transform_topk2048_ps64"
TINY_WORKLOAD = "edge-topk-len65"  # three rows of at most 65 scores: the float32 reference runs in milliseconds
REF_MODULE = "reference_dps"
REF_PATH = f"dsactl/kernels/topk/{REF_MODULE}.py"
# A reference-like solution: the definition's reference in destination-passing style, with
# every import form pack rewrites (from-import, submodule from a package, import-as, lazy),
# and one that never runs (TYPE_CHECKING), which must neither ship nor change.
REF_SOURCE = '''"""Test solution: the top-k reference, in destination-passing style."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dsactl.definitions.base as base
from dsactl import errors

if TYPE_CHECKING:
    from dsactl.harness import Call


def topk_reference_dps(scores, lengths, block_table, row_to_batch, topk_indices):
    from dsactl.definitions.topk import reference

    if topk_indices.dtype != base.DTYPES["int32"]:
        raise errors.DsactlError("topk_indices must be int32")
    topk_indices.copy_(reference(scores, lengths, block_table, row_to_batch, topk=topk_indices.shape[1]))
'''
ABSOLUTE_DSACTL_IMPORT = re.compile(r"^\s*(?:from|import)\s+dsactl\b.*$", re.MULTILINE)
TYPE_CHECKING_ONLY = "    from dsactl.harness import Call"
# The kernel folders a stage's solution may ship: the indexer operator ends with the top-k.
KERNELS_OF_STAGE = {"indexer": ("indexer", "topk"), "topk": ("topk",), "attention": ("attention",)}
NOT_IN_BUNDLES = ("dsactl/cli/", "dsactl/workloads/", "dsactl/harness.py", "dsactl/solutions.py",
                  "dsactl/build/runtime.py", "dsactl/pack/bundle.py", "dsactl/pack/check.py")

# Runs in a fresh interpreter (-I: no PYTHONPATH, no user site) where importing the installed
# dsactl raises: an unpacked bundle must run on its own files.
ALONE = '''
import importlib, importlib.abc, sys
import torch

class NoInstalledDsactl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "dsactl" or name.startswith("dsactl."):
            raise ImportError("the bundle imported the installed dsactl: " + name)

sys.meta_path.insert(0, NoInstalledDsactl())
root, package, *args = sys.argv[1:]
sys.path.insert(0, root)
'''
RUN_ALONE = ALONE + '''
module, func, io = args
fn = getattr(importlib.import_module(package + "." + module), func)
call = torch.load(io)
fn(*call["args"])
torch.save({"args": call["args"], "modules": sorted(sys.modules)}, io)
'''
BUILD_ALONE = ALONE + '''
arch, *libraries = args
jit = importlib.import_module(package + ".dsactl.pack.jit_runtime")
for library in libraries:
    jit.load_library(library, arch=arch)
assert not [m for m in sys.modules if m == "dsactl" or m.startswith("dsactl.")]
'''


def _alone(script, root, package, *args, cwd, env=None):
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **(env or {})}
    return subprocess.run([sys.executable, "-I", "-c", script, str(root), package, *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.fixture
def ref_solution(tmp_path, monkeypatch):
    """A solution module that lives outside the checkout but inside dsactl.kernels.topk."""
    folder = tmp_path / "extra_topk"
    folder.mkdir()
    (folder / f"{REF_MODULE}.py").write_text(REF_SOURCE)
    monkeypatch.setattr(dsactl.kernels.topk, "__path__", [*dsactl.kernels.topk.__path__, str(folder)])
    yield Solution("test-topk-reference", ("dsa_topk_page_transform_*",), "python",
                   f"dsactl.kernels.topk.{REF_MODULE}:topk_reference_dps", "reference in DPS", needs_gpu=False)
    sys.modules.pop(f"dsactl.kernels.topk.{REF_MODULE}", None)


@pytest.fixture
def ref_bundle(ref_solution):
    return build_bundle(ref_solution, TOPK, "test_topk_reference", "tester")


def _tiny_call(seed=0):
    w = workloads.select("edge", workload_ids=[TINY_WORKLOAD])[0]
    return harness.prepare(w, "cpu", seed)


def _expected(call):
    return call.definition.run_reference(call.inputs)["topk_indices"]


def _sources(bundle):
    return {s["path"]: s["content"] for s in bundle["sources"]}


def test_relative_names():
    assert relative_name("dsactl.kernels.topk", "dsactl.errors") == "...errors"
    assert relative_name("dsactl.kernels.topk", "dsactl.kernels.topk.launcher") == ".launcher"
    assert relative_name("dsactl.kernels.topk", "dsactl") == "..."
    assert relative_name("dsactl", "dsactl.fp8") == ".fp8"


def test_pack_check_unpack_round_trip_is_byte_identical(ref_bundle, tmp_path):
    report = check_bundle(ref_bundle)
    assert report.entry_point == "main.py::run"
    assert report.signature == definitions.get(TOPK).signature
    assert all(f.reached != "not reached" for f in report.files)
    path = tmp_path / "solution.json"
    write_bundle(ref_bundle, path)
    assert read_bundle(path) == ref_bundle
    written = unpack(read_bundle(path), tmp_path / "out")
    assert len(written) == len(ref_bundle["sources"])
    for source in ref_bundle["sources"]:
        assert (tmp_path / "out" / source["path"]).read_bytes() == source["content"].encode("utf-8")
    # a file without dsactl imports ships as it is in the checkout
    assert _sources(ref_bundle)["dsactl/errors.py"].encode() == Path(repo_finder("dsactl.errors").origin).read_bytes()


def test_bundle_imports_are_relative_and_layout_follows_modules(ref_bundle):
    sources = _sources(ref_bundle)
    assert ref_bundle["sources"][0]["path"] == "main.py"  # the entry first
    assert f"from .dsactl.kernels.topk.{REF_MODULE} import topk_reference_dps as _solution" in sources["main.py"]
    assert "def run(scores, lengths, block_table, row_to_batch, topk_indices):" in sources["main.py"]
    absolute = [line for content in sources.values() for line in ABSOLUTE_DSACTL_IMPORT.findall(content)]
    assert absolute == [TYPE_CHECKING_ONLY]
    entry = sources[REF_PATH]
    assert "import dsactl.definitions.base as base" not in entry
    assert "from ...definitions import base as base" in entry or "from ...definitions import base" in entry
    assert "from ... import errors" in entry and "    from ...definitions.topk import reference" in entry
    # every other byte is unchanged
    assert entry.split("def topk_reference_dps")[1] == REF_SOURCE.split("def topk_reference_dps")[1].replace(
        "from dsactl.definitions.topk", "from ...definitions.topk")


def test_pack_is_deterministic(ref_solution):
    assert build_bundle(ref_solution, TOPK, "n", "a") == build_bundle(ref_solution, TOPK, "n", "a")


def test_closure_ships_what_the_entry_needs_and_nothing_else(ref_bundle):
    paths = set(_sources(ref_bundle))
    assert {REF_PATH, "dsactl/errors.py", "dsactl/definitions/base.py", "dsactl/definitions/topk.py",
            "dsactl/fp8.py"} <= paths
    kernels = {p for p in paths if p.startswith("dsactl/kernels/")}
    assert kernels == {REF_PATH}  # no other kernel, not even its own stage's
    assert not [p for p in paths if p.startswith(NOT_IN_BUNDLES) or p.startswith("dsactl/pack/")]
    assert "dsactl/definitions/attention.py" in paths  # dsactl.definitions runs it: the package's __init__ imports it


def _served_definition(solution):
    return next((d for d in definitions.all_definitions() if solution.serves(d.name)), None)


@pytest.mark.parametrize("solution", solutions.SOLUTIONS, ids=lambda s: s.name)
def test_every_registered_solution_packs_self_contained(solution):
    d = _served_definition(solution)
    if d is None:
        pytest.skip(f"{solution.name} serves no listed definition")
    bundle = build_bundle(solution, d.name, "n", "a")
    report = check_bundle(bundle)
    paths = [f.path for f in report.files]
    stage = next(t for t in d.tags if t.startswith("stage:"))[len("stage:"):]
    allowed = tuple(f"dsactl/kernels/{s}/" for s in KERNELS_OF_STAGE[stage])
    assert not [p for p in paths if p.startswith("dsactl/kernels/") and not p.startswith(allowed)]
    assert not [p for p in paths if p.startswith(NOT_IN_BUNDLES)]
    assert all(f.reached != "not reached" for f in report.files)
    cuda = [p for p in paths if p.endswith(".cu")]
    assert bool(cuda) == ("dsactl/pack/jit_runtime.py" in paths)
    if solution.language == "cuda":
        assert cuda, "a CUDA solution ships its .cu"


def test_unpacked_bundle_runs_alone_and_gives_the_reference_result(ref_bundle, tmp_path):
    package = "unpacked_bundle"
    unpack(ref_bundle, tmp_path / "root" / package)
    call = _tiny_call(seed=3)
    io = tmp_path / "call.pt"
    torch.save({"args": call.args()}, io)
    r = _alone(RUN_ALONE, tmp_path / "root", package, "main", "run", io, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = torch.load(io)
    assert not [m for m in result["modules"] if m == "dsactl" or m.startswith("dsactl.")]
    assert f"{package}.dsactl.definitions.topk" in result["modules"]
    out = result["args"][call.definition.signature.index("topk_indices")]
    assert torch.equal(out, _expected(call))


CUDA_SOLUTIONS = [s for s in solutions.SOLUTIONS if s.language == "cuda"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("solution", CUDA_SOLUTIONS, ids=lambda s: s.name)
def test_unpacked_cuda_bundle_builds_its_libraries_alone(solution, tmp_path):
    bundle = build_bundle(solution, _served_definition(solution).name, "n", "a")
    libraries = [Path(s["path"]).stem for s in bundle["sources"] if s["path"].endswith(".cu")]
    unpack(bundle, tmp_path / "root" / "cuda_bundle")
    r = _alone(BUILD_ALONE, tmp_path / "root", "cuda_bundle", "sm90a", *libraries, cwd=tmp_path,
               env={jit_runtime.CACHE_ENV: str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "cache" / "sm90a").glob("*/*.so")) == sorted(
        f"lib{lib}.so" for lib in libraries)


def test_load_bundle_runs_the_bundle_files(ref_bundle, tmp_path):
    path = tmp_path / "solution.json"
    write_bundle(ref_bundle, path)
    solution = load_bundle(path)
    assert solution.serves(TOPK) and solution.availability() == (True, "ok")
    fn = solution.load()
    assert fn.__module__.startswith("dsactl_bundle_")
    assert not Path(sys.modules[fn.__module__].__file__).is_relative_to(Path(dsactl.__file__).parents[1])
    call = _tiny_call(seed=1)
    assert torch.equal(harness.run(fn, call)["topk_indices"], _expected(call))


def _hand_made(ref_bundle, **sources):
    bundle = json.loads(json.dumps(ref_bundle))
    bundle["sources"] += [{"path": p, "content": c} for p, c in sources.items()]
    return bundle


@pytest.mark.parametrize("path", ["../evil.py", "dsactl/../../evil.py", "/tmp/evil.py", "dsactl\\..\\evil.py",
                                  "./dsactl/x.py", "dsactl//x.py", "C:/evil.py", "dsactl/x/"])
def test_unsafe_paths_are_rejected_by_check_and_unpack(ref_bundle, tmp_path, path):
    bundle = _hand_made(ref_bundle, **{path: "x = 1\n"})
    with pytest.raises(DsactlError, match="unsafe source path"):
        check_bundle(bundle)
    with pytest.raises(DsactlError, match="unsafe source path"):
        unpack(bundle, tmp_path / "out")
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "out").exists()


def test_check_rejects_a_wrong_entry_signature(ref_bundle):
    bundle = json.loads(json.dumps(ref_bundle))
    entry = bundle["sources"][0]
    entry["content"] = entry["content"].replace("row_to_batch, topk_indices):", "topk_indices, row_to_batch):")
    with pytest.raises(DsactlError, match="inputs then outputs"):
        check_bundle(bundle)
    bundle["spec"]["entry_point"] = "main.py::missing"
    with pytest.raises(DsactlError, match="no module-level `def missing`"):
        check_bundle(bundle)


def test_check_rejects_bundles_that_are_not_self_contained(ref_bundle):
    bundle = json.loads(json.dumps(ref_bundle))
    entry = _sources(bundle)[REF_PATH]
    bundle["sources"][[s["path"] for s in bundle["sources"]].index(REF_PATH)]["content"] = entry.replace(
        "from ... import errors", "from dsactl import errors")
    with pytest.raises(DsactlError, match="imports the installed dsactl"):
        check_bundle(bundle)
    bundle = json.loads(json.dumps(ref_bundle))
    bundle["sources"] = [s for s in bundle["sources"] if s["path"] != "dsactl/errors.py"]
    with pytest.raises(DsactlError, match="imports dsactl.errors, which is not in the bundle"):
        check_bundle(bundle)
    bundle = json.loads(json.dumps(ref_bundle))
    bundle["sources"][0]["content"] += "\nimport pandas\n"
    with pytest.raises(DsactlError, match="imports pandas"):
        check_bundle(bundle)


def test_check_rejects_schema_errors_and_oversized_bundles(ref_bundle):
    for broken in ({**ref_bundle, "extra": 1}, {k: v for k, v in ref_bundle.items() if k != "author"},
                   {**ref_bundle, "spec": {**ref_bundle["spec"], "destination_passing_style": False}},
                   {**ref_bundle, "spec": {**ref_bundle["spec"], "entry_point": "main.py"}},
                   _hand_made(ref_bundle, **{REF_PATH: "x = 1\n"})):
        with pytest.raises(DsactlError):
            check_bundle(broken)
    with pytest.raises(DsactlError, match="over the"):
        check_bundle(_hand_made(ref_bundle, **{"notes.txt": "x" * MAX_BUNDLE_BYTES}))


def test_flashinfer_bench_builds_and_runs_our_bundle(ref_bundle, tmp_path, monkeypatch):
    fib = pytest.importorskip("flashinfer_bench.data")
    from flashinfer_bench.compile.builders.python_builder import PythonBuilder

    for registered in solutions.SOLUTIONS:
        d = _served_definition(registered)
        if d is not None:
            fib.Solution.model_validate(build_bundle(registered, d.name, "n", "a"))
    solution = fib.Solution.model_validate(ref_bundle)
    assert solution.get_entry_symbol() == "run"
    # dsactl's Definition JSON does not yet pass flashinfer-bench's Definition model (it wants the
    # reference named `run` and constraints that are Python expressions); the builder needs only
    # the definition's name and arity.
    fib_definition = definitions.get(TOPK).to_json()
    fib_definition["reference"] = fib_definition["reference"].replace("def reference(", "def run(", 1)
    fib_definition["constraints"] = []
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib"))
    runnable = PythonBuilder().build(fib.Definition.model_validate(fib_definition), solution)
    call = _tiny_call(seed=2)
    runnable(*call.args())
    assert torch.equal(call.outputs["topk_indices"], _expected(call))


def test_defaults_come_from_tool_dsactl(ref_solution, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.dsactl]\nauthor = "alice"\nname_prefix = "acme"\n')
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert project_defaults() == {"author": "alice", "name_prefix": "acme"}
    monkeypatch.setattr(solutions, "SOLUTIONS", [ref_solution])
    bundle = pack(TOPK)
    assert bundle["author"] == "alice" and bundle["name"] == f"acme_test-topk-reference_{TOPK}"
    assert pack(TOPK, name="mine", author="bob")["name"] == "mine"


def test_cli_pack_check_unpack(ref_solution, tmp_path, monkeypatch):
    monkeypatch.setattr(solutions, "SOLUTIONS", [ref_solution])
    runner = CliRunner()
    out = tmp_path / "solution.json"
    r = runner.invoke(app, ["pack", "--definition", TOPK, "-o", str(out), "--author", "tester"],
                      env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert REF_PATH in r.output and "entry point" in r.output
    r = runner.invoke(app, ["pack", "--check", str(out)], env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "ok" in r.output and "dsactl/definitions/topk.py" in r.output
    r = runner.invoke(app, ["unpack", str(out), "-o", str(tmp_path / "src")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "src" / REF_PATH).read_text() == _sources(read_bundle(out))[REF_PATH]


TINY_CU = '''extern "C" int tiny_answer() { return 42; }
__global__ void tiny_kernel(float* x) { x[threadIdx.x] = TINY_VALUE; }
'''


@pytest.fixture
def tiny_cuda(tmp_path, monkeypatch):
    stage = tmp_path / "kernels" / "stage"
    stage.mkdir(parents=True)
    (stage / "tiny.cu").write_text('#include "tiny.cuh"\n' + TINY_CU)
    (stage / "tiny.cuh").write_text("#define TINY_VALUE 1.0f\n")
    monkeypatch.setattr(jit_runtime, "kernels_root", lambda: tmp_path / "kernels")
    monkeypatch.setenv(jit_runtime.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(jit_runtime, "_loaded", {})
    return stage


def test_jit_runtime_says_nvcc_is_missing(tiny_cuda, monkeypatch):
    monkeypatch.setenv("PATH", str(tiny_cuda))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DsactlError, match="builds its CUDA library tiny with nvcc on first use: nvcc not found"):
        jit_runtime.load_library("tiny", arch="sm90a")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_jit_runtime_builds_once_per_source_and_arch(tiny_cuda, monkeypatch):
    lib = jit_runtime.load_library("tiny", arch="sm90a")
    assert lib.tiny_answer() == 42
    built = jit_runtime.build("tiny", "sm90a")
    assert built.parent.parent == jit_runtime.cache_root() / "sm90a"

    def no_nvcc(*args, **kwargs):
        raise AssertionError("rebuilt an unchanged source")

    monkeypatch.setattr(jit_runtime.subprocess, "run", no_nvcc)
    assert jit_runtime.build("tiny", "sm90a") == built
    (tiny_cuda / "tiny.cuh").write_text("#define TINY_VALUE 2.0f\n")  # a header change is a new build
    with pytest.raises(AssertionError, match="rebuilt"):
        jit_runtime.build("tiny", "sm90a")
