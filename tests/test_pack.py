"""dsactl pack: closure, bundle, check, unpack, load_bundle, the kernels' standalone rule, interop."""

import ast
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import dsactl
from dsactl import definitions, harness, solutions, workloads
from dsactl.cli import app
from dsactl.cli.verify import EXIT_NOTHING_RAN
from dsactl.errors import DsactlError
from dsactl.kernels import cuda_library
from dsactl.kernels.errors import KernelBuildError
from dsactl.pack.bundle import build_bundle, pack, project_defaults, read_bundle, write_bundle
from dsactl.pack.check import MAX_BUNDLE_BYTES, check_bundle
from dsactl.pack.loader import load_bundle
from dsactl.pack.unpack import unpack

TOPK = "dsa_topk_page_transform_topk2048_ps64"
TINY_WORKLOAD = "edge-topk-len65"  # three rows of at most 65 scores: the float32 reference runs in milliseconds
KERNELS = Path(cuda_library.__file__).resolve().parent
TOPK_CUDA = ["kernels/topk/topk.cu", "kernels/topk/topk_cluster.cuh", "kernels/topk/topk_common.cuh",
             "kernels/topk/topk_row.cuh", "kernels/ptx.cuh"]
# Both indexer solutions run solution.py, which holds the fused entry beside the default one: both CUDA
# libraries of kernels/topk, each source once, their folder's headers and kernels/'s with the first.
INDEXER_FILES = [
    "kernels/__init__.py", "kernels/bad_index.py", "kernels/cuda_library.py", "kernels/errors.py",
    "kernels/fp8.py", "kernels/indexer/fused.py", "kernels/indexer/passthrough.py", "kernels/indexer/score.py",
    "kernels/indexer/shapes.py", "kernels/indexer/solution.py", "kernels/launch_math.py", "kernels/topk/launcher.py",
    "kernels/triton_options.py", "kernels/tuned.py", "kernels/indexer/tuned/score.json",
    "kernels/topk/indexer_topk.cu", "kernels/topk/topk_cluster.cuh", "kernels/topk/topk_common.cuh",
    "kernels/topk/topk_row.cuh", "kernels/ptx.cuh", "kernels/topk/topk.cu"]
HOPPER_CUDA = ["kernels/attention/hopper_mla.cu", "kernels/attention/hopper_mla_ptx.cuh", "kernels/ptx.cuh"]
# A CUDA source builds with every header of its folder and of kernels/ (cuda_library), so the small-head
# kernel carries the Hopper kernel's PTX header too.
MMA_CUDA = ["kernels/attention/mma_mla.cu", "kernels/attention/hopper_mla_ptx.cuh", "kernels/ptx.cuh"]
# Every file of each bundle after main.py: the Python it runs (sorted), the tuned tables it reads, then the
# CUDA it builds.
ATTENTION_TABLE = "kernels/attention/tuned/triton_sparse_mla.json"
HOPPER_TABLE = "kernels/attention/tuned/hopper_mla.json"
MMA_TABLE = "kernels/attention/tuned/mma_mla.json"
EXPECTED_FILES = {
    ("dsactl-indexer", "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"): INDEXER_FILES,
    ("dsactl-indexer-fused", "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"): INDEXER_FILES,
    ("dsactl-topk", TOPK): [
        "kernels/__init__.py", "kernels/bad_index.py", "kernels/cuda_library.py", "kernels/errors.py",
        "kernels/fp8.py", "kernels/topk/launcher.py", *TOPK_CUDA],
    ("torch-topk", TOPK): ["kernels/__init__.py", "kernels/bad_index.py", "kernels/errors.py", "kernels/fp8.py",
                           "kernels/topk/torch_baseline.py"],
    # The contest's 16 heads with bf16 KV, every variant: no CUDA kernel serves them, so no CUDA and no dispatch.
    ("dsactl-attention", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"): [
        "kernels/__init__.py", "kernels/attention/entries.py", "kernels/attention/triton_entries.py",
        "kernels/attention/triton_sparse_mla.py", "kernels/bad_index.py", "kernels/errors.py", "kernels/fp8.py",
        "kernels/launch_math.py", "kernels/triton_options.py", "kernels/tuned.py", ATTENTION_TABLE],
    ("dsactl-attention-topklen-sink", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_topklen_sink"): [
        "kernels/__init__.py", "kernels/attention/entries.py", "kernels/attention/triton_entries.py",
        "kernels/attention/triton_sparse_mla.py", "kernels/bad_index.py", "kernels/errors.py", "kernels/fp8.py",
        "kernels/launch_math.py", "kernels/triton_options.py", "kernels/tuned.py", ATTENTION_TABLE],
    # FP8 KV at any head count may go to either CUDA kernel: the dispatch and both.
    ("dsactl-attention-fp8kv", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64_fp8kv"): [
        "kernels/__init__.py", "kernels/attention/alignment.py", "kernels/attention/dispatch.py",
        "kernels/attention/entries.py", "kernels/attention/fp8_staging.py", "kernels/attention/hopper_mla.py",
        "kernels/attention/mma_mla.py", "kernels/attention/solution.py", "kernels/attention/triton_sparse_mla.py",
        "kernels/bad_index.py", "kernels/cuda_library.py", "kernels/errors.py", "kernels/fp8.py",
        "kernels/launch_math.py", "kernels/triton_options.py", "kernels/tuned.py", HOPPER_TABLE, MMA_TABLE,
        ATTENTION_TABLE, *HOPPER_CUDA, "kernels/attention/mma_mla.cu"],
    ("dsactl-attention-hopper", "dsa_sparse_attention_h128_ckv512_kpe64_topk2048_ps64"): [
        "kernels/__init__.py", "kernels/attention/alignment.py", "kernels/attention/dispatch.py",
        "kernels/attention/entries.py", "kernels/attention/fp8_staging.py", "kernels/attention/hopper_mla.py",
        "kernels/attention/triton_sparse_mla.py", "kernels/bad_index.py", "kernels/cuda_library.py",
        "kernels/errors.py", "kernels/fp8.py", "kernels/launch_math.py", "kernels/triton_options.py",
        "kernels/tuned.py", HOPPER_TABLE, ATTENTION_TABLE, *HOPPER_CUDA],
    ("dsactl-attention-mma-fp8kv-sink", "dsa_sparse_attention_h32_ckv512_kpe64_topk2048_ps64_fp8kv_sink"): [
        "kernels/__init__.py", "kernels/attention/alignment.py", "kernels/attention/entries.py",
        "kernels/attention/mma_mla.py", "kernels/attention/triton_sparse_mla.py", "kernels/bad_index.py",
        "kernels/cuda_library.py", "kernels/errors.py", "kernels/fp8.py", "kernels/launch_math.py",
        "kernels/triton_options.py", "kernels/tuned.py", MMA_TABLE, ATTENTION_TABLE, *MMA_CUDA],
    ("torch-attention", "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"): [
        "kernels/__init__.py", "kernels/attention/entries.py", "kernels/attention/torch_baseline.py",
        "kernels/fp8.py"],
}
REF_PATH = "kernels/topk/torch_baseline.py"
ATTENTION_H16 = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"

# Runs in a fresh interpreter (-I: no PYTHONPATH, no user site) where importing the installed dsactl
# raises, with only the folder holding the unpacked bundle on sys.path: a bundle runs on its own files.
ALONE = '''
import importlib, importlib.abc, sys

class NoInstalledDsactl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "dsactl" or name.startswith("dsactl."):
            raise ImportError("the bundle imported the installed dsactl: " + name)

sys.meta_path.insert(0, NoInstalledDsactl())
root, package, *args = sys.argv[1:]
sys.path[:] = [root] + [p for p in sys.path if "site-packages" in p or "lib/python" in p]
import torch
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
loader = importlib.import_module(package + ".kernels.cuda_library")
assert loader.build_root() is None
for library in libraries:
    loader.load_library(library, arch=arch)
assert not [m for m in sys.modules if m == "dsactl" or m.startswith("dsactl.")]
'''


def _alone(script, root, package, *args, cwd, env=None):
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", cuda_library.BUILD_DIR_ENV)},
           **(env or {})}
    return subprocess.run([sys.executable, "-I", "-c", script, str(root), package, *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.fixture
def ref_solution():
    """A solution that runs on CPU: the vectorized PyTorch top-k, as a shipped (not baseline) solution."""
    return dataclasses.replace(solutions.get("torch-topk"), name="test-topk-reference", baseline=False)


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


def test_bundle_is_a_plain_copy_of_the_checkout_files(ref_bundle):
    sources = _sources(ref_bundle)
    assert ref_bundle["sources"][0]["path"] == "main.py"  # the entry first
    assert "from .kernels.topk.torch_baseline import topk_page_transform as _solution" in sources["main.py"]
    assert "def run(scores, lengths, block_table, row_to_batch, topk_indices):" in sources["main.py"]
    for path, content in sources.items():
        if path != "main.py":
            assert content.encode() == (KERNELS.parent / path).read_bytes(), path


def test_pack_is_deterministic(ref_solution):
    assert build_bundle(ref_solution, TOPK, "n", "a") == build_bundle(ref_solution, TOPK, "n", "a")


@pytest.mark.parametrize("solution, definition", list(EXPECTED_FILES), ids=lambda x: x)
def test_bundle_carries_exactly_the_files_its_entry_runs(solution, definition):
    bundle = build_bundle(solutions.get(solution), definition, "n", "a")
    assert [s["path"] for s in bundle["sources"]] == ["main.py", *EXPECTED_FILES[solution, definition]]
    assert all(f.reached != "not reached" for f in check_bundle(bundle).files)


def _served_definition(solution):
    return next((d for d in definitions.all_definitions() if solution.serves(d.name)), None)


@pytest.mark.parametrize("solution", solutions.SOLUTIONS, ids=lambda s: s.name)
def test_every_registered_solution_packs_self_contained(solution):
    d = _served_definition(solution)
    if d is None:
        pytest.skip(f"{solution.name} serves no listed definition")
    report = check_bundle(build_bundle(solution, d.name, "n", "a"))
    paths = [f.path for f in report.files]
    assert all(p == "main.py" or p.startswith("kernels/") for p in paths)
    assert all(f.reached != "not reached" for f in report.files)
    cuda = [p for p in paths if p.endswith(".cu")]
    assert bool(cuda) == ("kernels/cuda_library.py" in paths)
    if solution.language == "cuda":
        assert cuda, "a CUDA solution ships its .cu"


def _kernel_modules():
    return sorted(p for p in KERNELS.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_kernel_module_imports_dsactl_or_kernels_absolutely():
    for path in _kernel_modules():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                top = name.partition(".")[0]
                assert top in ("torch", "triton", "__future__") or top in sys.stdlib_module_names, \
                    f"{path.relative_to(KERNELS.parent)}:{node.lineno} imports {name}"


def test_a_copy_of_the_kernels_folder_imports_alone(tmp_path):
    shutil.copytree(KERNELS, tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    modules = [".".join(p.relative_to(KERNELS.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in _kernel_modules()]
    script = ALONE + "for name in args: importlib.import_module(name)\n"
    r = subprocess.run([sys.executable, "-I", "-c", script, str(tmp_path), "kernels", *modules], capture_output=True,
                       text=True, cwd=tmp_path, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=600)
    assert r.returncode == 0, r.stderr


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
    assert f"{package}.kernels.topk.torch_baseline" in result["modules"]
    out = result["args"][call.definition.signature.index("topk_indices")]
    assert torch.equal(out, _expected(call))


def test_the_contest_attention_bundle_runs_alone_under_the_interpreter(tmp_path):
    """The 16-head contest bundle (Triton only) from a folder holding only it, on CPU tensors."""
    bundle = build_bundle(solutions.get("dsactl-attention"), ATTENTION_H16, "n", "a")
    unpack(bundle, tmp_path / "root" / "attention_bundle")
    w = next(w for w in workloads.suite("edge") if w.definition == ATTENTION_H16)
    call = harness.prepare(w, "cpu", 0)
    io = tmp_path / "call.pt"
    torch.save({"args": call.args()}, io)
    r = _alone(RUN_ALONE, tmp_path / "root", "attention_bundle", "main", "run", io, cwd=tmp_path,
               env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr
    result = torch.load(io)
    assert "attention_bundle.kernels.attention.triton_sparse_mla" in result["modules"]
    assert not [m for m in result["modules"] if m.startswith("attention_bundle.") and ("hopper" in m or "cuda" in m)]
    outputs = dict(zip(call.definition.signature, result["args"]))
    expected = call.definition.run_reference(call.inputs)
    for name in ("output", "lse"):
        torch.testing.assert_close(outputs[name].float(), expected[name].float(), atol=1e-2, rtol=1e-2)


CUDA_SOLUTIONS = [s for s in solutions.SOLUTIONS if s.language == "cuda"]


def _kernel_module(solution) -> str:
    return solution.entry.split(":")[0]


def _first_of_each_module(solutions_):
    first = {}
    for s in solutions_:
        first.setdefault(_kernel_module(s), s)
    return list(first.values())


# A kernel module's solutions (the attention's sink, topk_length and lse variants) pack the same files but for
# main.py's entry (checked below), so one of each module builds its libraries for all.
CUDA_BUILDS = _first_of_each_module(CUDA_SOLUTIONS)


def _bundle_files_past_the_entry(solution) -> list[dict]:
    bundle = build_bundle(solution, _served_definition(solution).name, "n", "a")
    return [s for s in bundle["sources"] if s["path"] != "main.py"]


@pytest.mark.parametrize("solution", CUDA_SOLUTIONS, ids=lambda s: s.name)
def test_cuda_bundles_of_one_kernel_module_differ_only_in_their_entry(solution):
    built = next(s for s in CUDA_BUILDS if _kernel_module(s) == _kernel_module(solution))
    assert _bundle_files_past_the_entry(solution) == _bundle_files_past_the_entry(built)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("solution", CUDA_BUILDS, ids=lambda s: s.name)
def test_unpacked_cuda_bundle_builds_its_libraries_alone(solution, tmp_path):
    bundle = build_bundle(solution, _served_definition(solution).name, "n", "a")
    libraries = [Path(s["path"]).stem for s in bundle["sources"] if s["path"].endswith(".cu")]
    unpack(bundle, tmp_path / "root" / "cuda_bundle")
    r = _alone(BUILD_ALONE, tmp_path / "root", "cuda_bundle", "sm90a", *libraries, cwd=tmp_path,
               env={cuda_library.JIT_CACHE_ENV: str(tmp_path / "cache")})
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
        "from ..errors import", "from dsactl.errors import")
    with pytest.raises(DsactlError, match="imports the installed dsactl"):
        check_bundle(bundle)
    bundle = json.loads(json.dumps(ref_bundle))
    bundle["sources"] = [s for s in bundle["sources"] if s["path"] != "kernels/errors.py"]
    with pytest.raises(DsactlError, match="imports kernels.errors, which is not in the bundle"):
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


def test_every_definition_passes_flashinfer_benchs_definition_model():
    fib = pytest.importorskip("flashinfer_bench.data")
    for d in definitions.all_definitions():
        fib.Definition.model_validate(d.to_json())


def test_flashinfer_bench_builds_and_runs_our_bundle(ref_bundle, tmp_path, monkeypatch):
    fib = pytest.importorskip("flashinfer_bench.data")
    from flashinfer_bench.compile.builders.python_builder import PythonBuilder

    for registered in solutions.SOLUTIONS:
        d = _served_definition(registered)
        if d is not None:
            fib.Solution.model_validate(build_bundle(registered, d.name, "n", "a"))
    solution = fib.Solution.model_validate(ref_bundle)
    assert solution.get_entry_symbol() == "run"
    monkeypatch.setenv("FIB_CACHE_PATH", str(tmp_path / "fib"))
    runnable = PythonBuilder().build(fib.Definition.model_validate(definitions.get(TOPK).to_json()), solution)
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
    assert "ok" in r.output and "kernels/fp8.py" in r.output
    r = runner.invoke(app, ["unpack", str(out), "-o", str(tmp_path / "src")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "src" / REF_PATH).read_text() == _sources(read_bundle(out))[REF_PATH]


INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def _dsactls_own(definition):
    """The solution dsactl serves each family with: the indexer of two kernels, the top-k, the attention
    entry that dispatches (not one of the CUDA kernels it dispatches to), and the prefill indexer."""
    stage = next(t.removeprefix("stage:") for t in definitions.get(definition).tags if t.startswith("stage:"))
    variant = definition.partition("_ps64")[2].replace("_", "-")
    return {"indexer": "dsactl-indexer", "topk": "dsactl-topk", "attention": f"dsactl-attention{variant}",
            "prefill_indexer": "dsactl-prefill-indexer"}[stage]


def test_every_definition_leads_with_dsactls_own_solution():
    shared = [d.name for d in definitions.all_definitions() if len(solutions.for_definition(d.name)) > 1]
    assert INDEXER in shared
    for d in definitions.all_definitions():
        assert solutions.leading(d.name).name == _dsactls_own(d.name), d.name


def test_pack_packs_the_leading_solution_unless_one_is_named():
    default = _sources(pack(INDEXER, author="a"))["main.py"]
    assert "import dsa_topk_indexer as _solution" in default
    fused = _sources(pack(INDEXER, "dsactl-indexer-fused", author="a"))["main.py"]
    assert "import dsa_topk_indexer_fused as _solution" in fused
    with pytest.raises(DsactlError, match="does not serve"):
        pack(INDEXER, "dsactl-topk", author="a")


# One small workload per definition family (stage): the bundle dsactl packs for it, verified on it.
FAMILY_WORKLOADS = {"indexer": "edge-indexer-len1", "topk": "edge-topk-len65",
                    "attention": "edge-attention-duplicates-h16-bf16", "prefill_indexer": "edge-prefill-indexer-whole"}


def test_every_family_has_a_bundle_workload():
    stages = {t.removeprefix("stage:") for d in definitions.all_definitions() for t in d.tags
              if t.startswith("stage:")}
    assert stages == set(FAMILY_WORKLOADS)


@pytest.mark.parametrize("family", FAMILY_WORKLOADS)
def test_a_packed_bundle_verifies_where_its_solution_runs_else_says_why_in_one_line(family, tmp_path):
    workload = FAMILY_WORKLOADS[family]
    definition = next(w.definition for w in workloads.suite("edge") if w.uuid == workload)
    leading = solutions.leading(definition)
    path = tmp_path / "bundle.json"
    packed = CliRunner().invoke(app, ["pack", "-d", definition, "-o", str(path), "--author", "tester"],
                                env={"COLUMNS": "250"})
    assert packed.exit_code == 0, packed.output
    named = packed.output.splitlines()[0]
    assert named.startswith(f"packing {leading.name}, the solution dsactl serves {definition} with")
    others = [s.name for s in solutions.for_definition(definition) if s.name != leading.name]
    assert all(f"--solution {o}" in named or f" or {o}" in named for o in others)
    where, why = solutions.runs_here(leading)
    if not torch.cuda.is_available():  # the attention entry is pure Triton; the others select in CUDA
        assert (where == "interpreted") == (family == "attention"), (where, why)
    r = CliRunner().invoke(app, ["verify", "--bundle", str(path), "--workload", workload, "--trials", "1"])
    if where == "no":
        assert r.exit_code == EXIT_NOTHING_RAN, r.output
        assert r.output.count("\n") == 1 and r.output.startswith("verify: nothing can run here; "), r.output
        assert why in r.output and "builds CUDA librar" in r.output
    else:
        assert r.exit_code == 0, r.output
        assert "1 passed, 0 failed, 0 errors" in r.output


TINY_CU = '''extern "C" int tiny_answer() { return 42; }
__global__ void tiny_kernel(float* x) { x[threadIdx.x] = TINY_VALUE; }
'''


@pytest.fixture
def tiny_cuda(tmp_path, monkeypatch):
    stage = tmp_path / "kernels" / "stage"
    stage.mkdir(parents=True)
    (stage / "tiny.cu").write_text('#include "tiny.cuh"\n' + TINY_CU)
    (stage / "tiny.cuh").write_text("#define TINY_VALUE 1.0f\n")
    monkeypatch.setattr(cuda_library, "kernels_root", lambda: tmp_path / "kernels")
    monkeypatch.setattr(cuda_library, "build_root", lambda: None)  # as in a bundle
    monkeypatch.setenv(cuda_library.JIT_CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cuda_library, "_loaded", {})
    return stage


def test_a_bundle_says_nvcc_is_missing(tiny_cuda, monkeypatch):
    monkeypatch.setenv("PATH", str(tiny_cuda))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(KernelBuildError, match="library tiny is built with nvcc on first use here: nvcc not found"):
        cuda_library.load_library("tiny", arch="sm90a")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_bundle_builds_once_per_source_and_arch(tiny_cuda, monkeypatch):
    lib = cuda_library.load_library("tiny", arch="sm90a")
    assert lib.tiny_answer() == 42
    built = cuda_library.jit_path("tiny", "sm90a")
    assert built.parent.parent == cuda_library.jit_cache_root() / "sm90a"

    def no_nvcc(*args, **kwargs):
        raise AssertionError("rebuilt an unchanged source")

    monkeypatch.setattr(cuda_library.subprocess, "run", no_nvcc)
    assert cuda_library.jit_path("tiny", "sm90a") == built
    (tiny_cuda / "tiny.cuh").write_text("#define TINY_VALUE 2.0f\n")  # a header change is a new build
    with pytest.raises(AssertionError, match="rebuilt"):
        cuda_library.jit_path("tiny", "sm90a")
