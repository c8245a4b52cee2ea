"""dsactl build: arch table, report parsers, a real nvcc build with gates and incremental no-op,
Triton AOT, and the run-time loader's errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dsactl.build import arch as arch_table
from dsactl.build import cuobjdump, ptxas, triton_aot
from dsactl.kernels import cuda_library as runtime
from dsactl.kernels.errors import KernelBuildError
from dsactl.build.cuda import split_kernel_name
from dsactl.build.pipeline import build_arch
from dsactl.build.report import ReportRow, gate_failures
from dsactl.cli import app
from dsactl.errors import DsactlError

FIXTURES = Path(__file__).parent / "fixtures"
SPILL_FIXTURE = FIXTURES / "spill_kernel.cu"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")

# Real outputs, captured from nvcc 13.0 (-Xptxas -v,-warn-spills,-warn-lmem-usage) and Triton 3.9's ptxas.
NVCC_PTXAS_LOG = """\
ptxas warning : Local memory used for function 'spill', size of stack frame: 1120 bytes
ptxas warning : Registers are spilled to local memory in function 'spill', 164 bytes spill stores, 168 bytes spill loads
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z4tinyPf' for 'sm_90a'
ptxas info    : Function properties for _Z4tinyPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 128 bytes smem
ptxas info    : Compile time = 4.090 ms
ptxas info    : Compiling entry function 'spill' for 'sm_90a'
ptxas info    : Function properties for spill
    1120 bytes stack frame, 164 bytes spill stores, 168 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 1120 bytes cumulative stack size
ptxas info    : Compile time = 639.543 ms
"""
NOINLINE_PTXAS_LOG = """\
ptxas warning : Local memory used for function 'caller', size of stack frame: 32 bytes
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'caller' for 'sm_100a'
ptxas info    : Function properties for caller
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 32 bytes cumulative stack size
ptxas info    : Compile time = 8.583 ms
ptxas info    : Function properties for _Z6helperf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""
TRITON_PTXAS_LOG = """\
ptxas-blackwell info    : 11 bytes gmem
ptxas-blackwell info    : Compiling entry function '_sparse_mla_split_kernel' for 'sm_90a'
ptxas-blackwell info    : Function properties for _sparse_mla_split_kernel
    1064 bytes stack frame, 1092 bytes spill stores, 1104 bytes spill loads
ptxas-blackwell info    : Used 255 registers, used 1 barriers, 1064 bytes cumulative stack size
ptxas-blackwell info    : Compile time = 817.724 ms

"""
CUOBJDUMP_OUTPUT = """\

Fatbin elf code:
================
arch = sm_90a
code version = [1,8]
host = linux
compile_size = 64bit
identifier = spill.cu

Resource usage:
 Common:
  GLOBAL:0
 Function _Z4tinyPf:
  REG:10 STACK:0 SHARED:1152 LOCAL:0 CONSTANT[0]:536 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function spill:
  REG:255 STACK:1120 SHARED:0 LOCAL:0 CONSTANT[0]:548 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


# --- arch table ---------------------------------------------------------------------------


@needs_nvcc
def test_arch_table_maps_names_to_gencode_and_triton_targets():
    (sm90a,) = arch_table.resolve("sm90a")
    assert sm90a.gencode == "arch=compute_90a,code=sm_90a" and sm90a.triton_cc == 90
    (sm103a,) = arch_table.resolve("sm103a")
    assert sm103a.gencode == "arch=compute_103a,code=sm_103a" and sm103a.triton_cc == 103
    names = [a.name for a in arch_table.resolve("all")]
    assert {"sm90a", "sm100a", "sm103a", "sm120a"} <= set(names)
    assert arch_table.ARCH_FOR_CAPABILITY[(10, 0)] == "sm100a"


@needs_nvcc
def test_unknown_arch_names_what_is_supported():
    with pytest.raises(DsactlError, match=r"unknown arch 'sm80': choose one of sm90a, sm100a.*or all"):
        arch_table.resolve("sm80")


@pytest.fixture
def fake_nvcc(monkeypatch):
    """Stand in for `nvcc --list-gpu-arch` and `nvcc --version`: fake(listed, version)."""

    def fake(listed: str, version: tuple[int, int]) -> None:
        monkeypatch.setattr(arch_table, "_nvcc", lambda *args: listed)
        monkeypatch.setattr(arch_table, "nvcc_version", lambda: version)
        arch_table.supported_arches.cache_clear()

    yield fake
    arch_table.supported_arches.cache_clear()


def test_arch_the_installed_nvcc_cannot_target_is_refused(fake_nvcc):
    fake_nvcc("compute_80\ncompute_90\n", (12, 8))
    assert [a.name for a in arch_table.supported_arches()] == ["sm90a"]
    with pytest.raises(DsactlError, match=r"nvcc 12\.8 cannot target sm100a: it supports sm90a$"):
        arch_table.resolve("sm100a")


def test_family_targets_need_nvcc_12_9(fake_nvcc):
    for version, family in (((12, 8), False), ((12, 9), True)):
        fake_nvcc("compute_90\ncompute_100\ncompute_120\n", version)
        names = {a.name for a in arch_table.supported_arches()}
        assert ({"sm100f", "sm120f"} <= names) is family


# --- parsers ------------------------------------------------------------------------------


def test_ptxas_parser_reads_every_entry_function():
    tiny, spill = ptxas.parse(NVCC_PTXAS_LOG)
    assert tiny == ptxas.KernelResources("_Z4tinyPf", "sm_90a", registers=10, barriers=1, shared_static=128,
                                         stack_frame=0, spill_stores=0, spill_loads=0)
    assert spill == ptxas.KernelResources("spill", "sm_90a", registers=255, barriers=0, shared_static=0,
                                          stack_frame=1120, spill_stores=164, spill_loads=168)


def test_ptxas_parser_ignores_device_functions_and_reads_triton_logs():
    (caller,) = ptxas.parse(NOINLINE_PTXAS_LOG)
    assert (caller.name, caller.target, caller.registers, caller.stack_frame) == ("caller", "sm_100a", 16, 32)
    (triton_kernel,) = ptxas.parse(TRITON_PTXAS_LOG)
    assert (triton_kernel.registers, triton_kernel.spill_stores, triton_kernel.spill_loads) == (255, 1092, 1104)


def test_cuobjdump_parser():
    found = cuobjdump.parse(CUOBJDUMP_OUTPUT)
    assert found == {
        "_Z4tinyPf": cuobjdump.BinaryResources(registers=10, stack=0, shared=1152, local=0),
        "spill": cuobjdump.BinaryResources(registers=255, stack=1120, shared=0, local=0),
    }


def test_kernel_names_split_into_kernel_and_template_configuration():
    assert split_kernel_name("void (anonymous namespace)::topk_kernel<(anonymous namespace)::Bf16>"
                             "((anonymous namespace)::Params)") == ("topk_kernel", "Bf16")
    assert split_kernel_name("void ns::k<512, (bool)1>(float const*, int*)") == ("ns::k", "512, (bool)1")
    assert split_kernel_name("spill_kernel") == ("spill_kernel", "")


# --- a real nvcc build: report, gates, incremental no-op, run-time loading ----------------


@pytest.fixture
def spill_tree(tmp_path, monkeypatch):
    """A kernels folder holding only the spill fixture, and an empty build root."""
    kernels = tmp_path / "kernels"
    (kernels / "fixture").mkdir(parents=True)
    shutil.copy(SPILL_FIXTURE, kernels / "fixture" / "spill_kernel.cu")
    monkeypatch.setattr(runtime, "kernels_root", lambda: kernels)
    monkeypatch.setenv(runtime.BUILD_DIR_ENV, str(tmp_path / "build"))
    return kernels


def _arch(name: str) -> arch_table.Arch:
    (found,) = [a for a in arch_table.ARCHES if a.name == name]
    return found


def _build(arch_name: str):
    return build_arch(_arch(arch_name), cuda_sources=runtime.discover(), triton_configs=[], jobs=2,
                      on_progress=lambda *event: None)


@needs_nvcc
def test_spill_fixture_gates_report_incremental_and_loading(spill_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(triton_aot, "discover", lambda: [])
    with pytest.raises(KernelBuildError, match=r"^no build of spill_kernel for sm90a: run `dsactl build --arch sm90a`$"):
        runtime.load_library("spill_kernel", arch="sm90a")

    runner = CliRunner()
    failed = runner.invoke(app, ["build", "--arch", "sm90a", "--fail-on-spills", "--jobs", "2"])
    assert failed.exit_code != 0 and isinstance(failed.exception, DsactlError)
    message = str(failed.exception)
    assert "spill_kernel (cuda spill_kernel, sm90a) spills" in message and "reverse_kernel" not in message
    assert "compiled 1 CUDA libraries" in failed.output
    assert '"spill_kernel"' in (tmp_path / "build" / "sm90a" / "report.json").read_text()

    rebuilt = _build("sm90a")
    assert rebuilt.up_to_date and rebuilt.compiled_cuda == 0
    rows = {row.kernel: row for row in rebuilt.rows}
    assert set(rows) == {"spill_kernel", "reverse_kernel"}
    spill, reverse = rows["spill_kernel"], rows["reverse_kernel"]
    assert spill.registers == 255 and spill.spill_stores > 0 and spill.spill_loads > 0 and spill.stack_frame > 0
    assert reverse.configuration == "32" and reverse.shared_static == 32 * 4 and not reverse.spills
    assert reverse.shared_dynamic is None and reverse.compile_s > 0
    (too_many,) = gate_failures(rebuilt.rows, fail_on_spills=False, max_registers=128)
    assert too_many == "spill_kernel (cuda spill_kernel, sm90a) uses 255 registers > 128"

    passed = runner.invoke(app, ["build", "--arch", "sm90a", "--max-registers", "255"])
    assert passed.exit_code == 0, passed.output
    assert "sm90a: up to date (2 kernels)" in passed.output

    library = runtime.load_library("spill_kernel", arch="sm90a")
    assert hasattr(library, "spill_fixture_reverse")
    # A header in the source's folder is a dependency: adding one makes the build stale.
    (spill_tree / "fixture" / "tuning.cuh").write_text("#pragma once\n")
    with pytest.raises(KernelBuildError, match=r"build of spill_kernel is stale .*: run `dsactl build --arch sm90a`$"):
        runtime.library_path("spill_kernel", "sm90a")


@needs_nvcc
def test_nothing_to_build_is_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "kernels_root", lambda: tmp_path)
    monkeypatch.setattr(triton_aot, "discover", lambda: [])
    monkeypatch.setenv(runtime.BUILD_DIR_ENV, str(tmp_path / "build"))
    result = CliRunner().invoke(app, ["build", "--arch", "sm100a"])
    assert result.exit_code == 0, result.output
    assert "sm100a: nothing to build" in result.output
    assert not (tmp_path / "build").exists()


def test_load_library_names_known_libraries_for_an_unknown_name(spill_tree):
    with pytest.raises(KernelBuildError, match=r"no CUDA source kernels/<stage>/nope\.cu \(CUDA libraries here: spill_kernel\)"):
        runtime.load_library("nope", arch="sm90a")


def test_build_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(runtime.BUILD_DIR_ENV, str(tmp_path))
    assert runtime.arch_dir("sm100a") == tmp_path / "sm100a"
    monkeypatch.delenv(runtime.BUILD_DIR_ENV)
    assert runtime.build_root() == Path(runtime.__file__).resolve().parents[1] / "build"  # the checkout's


def test_a_plain_copy_of_the_kernels_builds_its_own_libraries(monkeypatch, tmp_path):
    """Outside a checkout or a dsactl installation (a bundle) there is no build root: the loader
    builds the sources beside it on first use."""
    monkeypatch.delenv(runtime.BUILD_DIR_ENV, raising=False)
    copy = tmp_path / "bundle" / "kernels"
    shutil.copytree(Path(runtime.__file__).resolve().parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
              "m = importlib.import_module('kernels.cuda_library'); print(m.build_root())")
    out = subprocess.run([sys.executable, "-I", "-c", script, str(tmp_path / "bundle")], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "None"


# --- Triton AOT ---------------------------------------------------------------------------

TRITON_MODULE = '''
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x, y, n, factor, BLOCK: tl.constexpr):
    if tl.full([1], 1, tl.int32) > 0:  # a one-element block as a condition: Triton warns as it compiles
        factor = factor * 1.0
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y + offsets, tl.load(x + offsets, mask=mask) * factor, mask=mask)


def aot_specs():
    return [
        {"name": f"scale_b{block}", "fn": scale_kernel,
         "signature": {"x": "*fp32", "y": "*fp32", "n": "N_TYPE", "factor": "fp32", "BLOCK": "constexpr"},
         "constexprs": {"BLOCK": block}, "num_warps": 4, "num_stages": 1}
        for block in (BLOCK_SIZES)
    ]
'''


def _triton_module(tmp_path, monkeypatch, block_sizes: str, n_type: str = "i32") -> list[triton_aot.TritonConfig]:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    package = tmp_path / "aot_fixture"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "scale.py").write_text(
        textwrap.dedent(TRITON_MODULE).replace("BLOCK_SIZES", block_sizes).replace("N_TYPE", n_type))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("aot_fixture.scale", "aot_fixture"):
        sys.modules.pop(name, None)
    return triton_aot.discover("aot_fixture")


COMPILE_WARNING = "If conditional called with multidimensional Tensor"
FP_FUSION_WARNING = "TRITON_DEFAULT_FP_FUSION is unset"


@pytest.mark.filterwarnings(f"ignore:{COMPILE_WARNING}")
def test_triton_configurations_compile_ahead_of_time_and_only_when_changed(tmp_path, monkeypatch, capfd):
    arch_dir = tmp_path / "build" / "sm100a"
    sm100a = _arch("sm100a")
    configs = _triton_module(tmp_path, monkeypatch, "128, 1024")
    assert [c.name for c in configs] == ["scale_b128", "scale_b1024"]

    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows, compiled = triton_aot.build(configs, sm100a, arch_dir, jobs=2, on_compiled=lambda *event: None)
    assert compiled == 2
    # Each worker process meets the compile's warnings; the build passes each on once. The build asks for
    # FP fusion itself, so Triton's warning about its changing default never comes.
    err = capfd.readouterr().err
    passed_on = [str(w.message) for w in caught]
    assert COMPILE_WARNING not in err and sum(COMPILE_WARNING in m for m in passed_on) == 1, passed_on
    assert FP_FUSION_WARNING not in err and not any(FP_FUSION_WARNING in m for m in passed_on)
    for row, block in zip(rows, (128, 1024)):
        assert (row.kind, row.unit, row.kernel, row.configuration) == ("triton", "aot_fixture.scale",
                                                                      "scale_kernel", f"scale_b{block}")
        assert 0 < row.registers <= 255 and not row.spills and row.shared_dynamic is not None
        assert row.options == {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True,
                               "constexprs": {"BLOCK": block}}
        assert (arch_dir / "triton" / "aot_fixture.scale" / f"scale_b{block}.cubin").stat().st_size > 0

    again, compiled = triton_aot.build(configs, sm100a, arch_dir, jobs=2, on_compiled=lambda *event: None)
    assert compiled == 0 and again == rows

    changed = _triton_module(tmp_path, monkeypatch, "128, 256")
    _, compiled = triton_aot.build(changed, sm100a, arch_dir, jobs=2, on_compiled=lambda *event: None)
    assert compiled == 1


def test_every_triton_launch_asks_for_the_fp_fusion_the_build_compiles_with():
    """Triton 3.10 turns FP fusion off unless a launch asks: every launch in kernels/ (kernel[grid](...), the
    kernel a @triton.jit function of the module or one a call returns) passes FP_FUSION, as the ahead-of-time
    build does, so both compile one kernel."""
    import ast

    from dsactl.kernels.triton_options import FP_FUSION

    def jitted(node) -> bool:
        return any("triton.jit" in ast.unparse(d) for d in getattr(node, "decorator_list", ()))

    kernels = Path(triton_aot.__file__).resolve().parents[2] / "kernels"
    launches = {}
    for path in sorted(kernels.rglob("*.py")):
        tree = ast.parse(path.read_text())
        jit_names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and jitted(n)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and (
                    isinstance(node.func.value, ast.Call)
                    or (isinstance(node.func.value, ast.Name) and node.func.value.id in jit_names)):
                asked = [ast.unparse(k.value) for k in node.keywords if k.arg == "enable_fp_fusion"]
                launches[f"{path.relative_to(kernels)}:{node.lineno}"] = asked
    assert len(launches) >= 4, launches  # the indexer's two kernels, attention's split and combine kernels
    assert all(asked == ["FP_FUSION"] for asked in launches.values()), launches
    assert FP_FUSION is True


@pytest.mark.filterwarnings(f"ignore:{COMPILE_WARNING}")
def test_a_divisible_integer_hint_builds_the_kernel_the_jit_runs(tmp_path, monkeypatch):
    # n a multiple of 16 (as the JIT specializes it): the masked loads and stores widen to 16 bytes.
    sass = {}
    for n_type in ("i32", "i32:16"):
        configs = _triton_module(tmp_path, monkeypatch, "1024,", n_type)
        arch_dir = tmp_path / "build" / n_type.replace(":", "_")
        triton_aot.build(configs, _arch("sm90a"), arch_dir, jobs=1, on_compiled=lambda *event: None)
        cubin = arch_dir / "triton" / "aot_fixture.scale" / "scale_b1024.cubin"
        sass[n_type] = subprocess.run([str(cuobjdump.cuobjdump_path()), "-sass", str(cubin)], check=True,
                                      capture_output=True, text=True).stdout
    assert "LDG.E.128" in sass["i32:16"] and "LDG.E.128" not in sass["i32"]


def test_bad_aot_specs_are_refused(tmp_path, monkeypatch):
    (config,) = _triton_module(tmp_path, monkeypatch, "128,")
    spec = dict(config.spec)
    with pytest.raises(DsactlError, match=r"keys must be .* missing \['num_stages'\], unknown \['stages'\]"):
        triton_aot.module_configs("m", [{**{k: v for k, v in spec.items() if k != "num_stages"}, "stages": 1}])
    with pytest.raises(DsactlError, match="names must be unique"):
        triton_aot.module_configs("m", [spec, spec])
    with pytest.raises(DsactlError, match="fn must be a @triton.jit function"):
        triton_aot.module_configs("m", [{**spec, "fn": lambda: None}])
    for bad in ("i32:8", "fp32:16"):
        with pytest.raises(DsactlError, match=r"the only signature hint is ':16' on an integer or pointer type; "
                                              rf"got \['n: {bad}'\]"):
            triton_aot.module_configs("m", [{**spec, "signature": {**spec["signature"], "n": bad}}])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(DsactlError, match="TRITON_INTERPRET is set: unset it to build"):
        triton_aot.discover("aot_fixture")


def test_a_spec_meant_for_more_shared_memory_is_not_built_where_blocks_get_less(tmp_path, monkeypatch):
    (config,) = _triton_module(tmp_path, monkeypatch, "128,")
    (large,) = triton_aot.module_configs("m", [{**config.spec, "min_shared": 232448}])
    assert config.launches_on(_arch("sm120a")) and large.launches_on(_arch("sm90a"))
    assert not large.launches_on(_arch("sm120a")), "sm120a blocks get 99 KB"


# --- the shipped kernels ------------------------------------------------------------------

SHIPPED_CUDA = sorted(runtime.discover(), key=lambda s: s.name)


@needs_nvcc
@pytest.mark.skipif(not SHIPPED_CUDA, reason="no CUDA sources under kernels/ yet")
def test_shipped_cuda_builds_for_sm90a_and_sm100a_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv(runtime.BUILD_DIR_ENV, str(tmp_path))
    with ThreadPoolExecutor(2) as pool:  # one nvcc per arch, side by side
        builds = list(pool.map(_build, ["sm90a", "sm100a"]))
    for result in builds:
        assert {row.unit for row in result.rows} == {s.name for s in SHIPPED_CUDA}
        assert gate_failures(result.rows, fail_on_spills=True, max_registers=None) == []


@needs_nvcc
def test_every_shipped_kernel_builds_for_sm90a_and_sm100a_without_spills(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env[runtime.BUILD_DIR_ENV] = str(tmp_path)
    for arch in ("sm90a", "sm100a"):
        done = subprocess.run([sys.executable, "-m", "dsactl", "build", "--arch", arch, "--fail-on-spills"],
                              env=env, capture_output=True, text=True)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        rows = json.loads((tmp_path / arch / "report.json").read_text())["kernels"]
        assert {r["unit"] for r in rows} >= {"topk", "attention.triton_sparse_mla", "indexer.score",
                                              "indexer.passthrough"}
        assert not [r["configuration"] for r in rows if r["spill_stores"] or r["spill_loads"]]


# Compiles the Triton attention's configurations whose names match argv[3] for the arches in argv[2] (comma
# separated) into argv[1]; prints one JSON line a configuration: arch, name, registers, spill bytes.
ATTENTION_BUILD = """
import json, re, sys
from pathlib import Path
from dsactl.build import arch, triton_aot
configs = [c for c in triton_aot.discover()
           if c.unit == "attention.triton_sparse_mla" and re.search(sys.argv[3], c.name)]
for name in sys.argv[2].split(","):
    target = next(a for a in arch.ARCHES if a.name == name)
    launched = [c for c in configs if c.launches_on(target)]
    rows, _ = triton_aot.build(launched, target, Path(sys.argv[1]) / name, jobs=2, on_compiled=lambda *event: None)
    for r in rows:
        print(json.dumps([name, r.configuration, r.registers, r.spill_stores + r.spill_loads]))
"""


def _build_attention(tmp_path, arches: str, names: str) -> list[list]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a child: this process may interpret
    done = subprocess.run([sys.executable, "-c", ATTENTION_BUILD, str(tmp_path), arches, names], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_64_and_128_head_attention_tiles_build_without_spills_under_this_triton(tmp_path):
    """The Triton attention's 64- and 128-head tiles, which serve those heads on every GPU but sm_90 (and every
    call with a sink or topk_length there), at the longest and shortest rows a launch of them holds: the
    configurations config() and row_tile() choose for the installed Triton fit their registers on sm_90a."""
    import triton

    from dsactl.kernels.attention import triton_sparse_mla as tsm

    names = [f"sparse_mla_h{h}_{'fp8kv' if f else 'bf16kv'}_ids{pad}" for h in (64, 128) for f in (False, True)
             for pad in (tsm.row_pads(tsm.config(h, f))[0], tsm.row_pads(tsm.config(h, f))[-1])]
    built = _build_attention(tmp_path, "sm90a", "^(" + "|".join(names) + ")$")
    assert sorted(name for _, name, *_ in built) == sorted(names)
    spilling = [(name, registers, spilled) for _, name, registers, spilled in built if spilled]
    assert not spilling, f"triton {triton.__version__}: {spilling}"


def test_the_gpu_images_triton_keeps_the_measured_tiles():
    """Triton 3.6 (the GPU image's) builds the measured tiles without spills, but for the 64-head FP8 tile at
    2048 ids: only those launches take another tile; Triton 3.9 (CI's) spills every 64-head tile."""
    from dsactl.kernels.attention import triton_sparse_mla as tsm

    old = (3, 6)
    assert tsm.config(64, False, version=old) == tsm.Config(block_h=64, block_n=64, num_warps=8, num_stages=2)
    fp8 = tsm.config(128, True, version=old)
    assert fp8 == tsm.Config(block_h=64, block_n=64, num_warps=8, num_stages=3, f16=True)
    assert [tsm.row_tile(fp8, pad, old) == fp8 for pad in (256, 512, 1024, 2048)] == [True, True, True, False]
    assert tsm.config(16, False, version=old).num_warps == 8 and tsm.fewest_ids(tsm.COMPACT, old) == tsm.ROW_IDS_MIN
    assert {tsm.config(h, f, version=(3, 9)).block_h for h in (64, 128) for f in (False, True)} == {32}


@pytest.mark.slow  # every attention configuration for two arches: minutes
def test_every_attention_configuration_builds_without_spills_under_this_triton(tmp_path):
    import triton

    built = _build_attention(tmp_path, "sm90a,sm100a", "^sparse_mla_")
    assert {arch for arch, *_ in built} == {"sm90a", "sm100a"}
    spilling = [(arch, name, spilled) for arch, name, _, spilled in built if spilled]
    assert not spilling, f"triton {triton.__version__}: {spilling}"


@pytest.mark.gpu
@pytest.mark.skipif(not SHIPPED_CUDA, reason="no CUDA sources under kernels/")
def test_the_build_for_this_gpu_loads():
    arch = runtime.current_arch()
    for source in SHIPPED_CUDA:
        library = runtime.load_library(source.name)
        assert library is runtime.load_library(source.name, arch=arch)
        assert Path(library._name) == runtime.arch_dir(arch) / source.library_file


# --- per-arch launch limits -----------------------------------------------------------------

def _row(arch: str, shared: int, registers: int = 192, warps: int | None = 8) -> ReportRow:
    return ReportRow(arch, "triton", "attention.mla", "mla_kernel", "big", registers, 0, shared, 0, 0, 0, 0, 1.0,
                     {} if warps is None else {"num_warps": warps})


def test_a_configuration_over_the_arch_limits_cannot_launch():
    assert _arch("sm120a").max_shared_per_block == 101376 and _arch("sm90a").max_shared_per_block == 232448
    fits_hopper = _row("sm90a", 114688)
    assert fits_hopper.launch_problems() == []
    assert gate_failures([fits_hopper, _row("sm120a", 114688), _row("sm100a", 65536, registers=255, warps=16)],
                         fail_on_spills=False, max_registers=None) == [
        "mla_kernel [big] (triton attention.mla, sm120a) cannot launch: needs 114688 B of shared memory per "
        "block > 101376 B on sm120a",
        "mla_kernel [big] (triton attention.mla, sm100a) cannot launch: needs 255 registers x 512 threads per "
        "block > 65536",
    ]
    assert _row("sm120a", 0, registers=255, warps=None).launch_problems() == []  # a CUDA launcher's block: unknown


def test_build_reports_configurations_that_cannot_launch_as_errors(tmp_path, monkeypatch):
    from dsactl.build.pipeline import ArchBuild
    from dsactl.cli import build as build_cli

    rows = [_row("sm120a", 114688), _row("sm120a", 4096)]
    monkeypatch.setattr(build_cli, "resolve", lambda spec: [_arch(spec)])
    monkeypatch.setattr(build_cli, "discover_cuda", lambda: [])
    monkeypatch.setattr(triton_aot, "discover", lambda: [])
    monkeypatch.setattr(build_cli, "build_arch",
                        lambda arch, **_: ArchBuild(arch, rows, 0, 2, tmp_path / "report.json"))
    result = CliRunner().invoke(app, ["build", "--arch", "sm120a"], env={"COLUMNS": "200"})
    assert isinstance(result.exception, DsactlError), result.output
    assert str(result.exception).startswith("1 gate failure(s):") and "114688 B of shared memory" in str(result.exception)
    assert "big (cannot launch)" in result.output and "1 configurations cannot launch" in result.output


def _loads_in_flight(cubin: Path) -> list[int]:
    """For each global load of the cubin's SASS, in program order, how many loads were in flight (issued,
    their destination register not yet read) when its destination is first read. Straight-line code
    only (the combine kernel has no loop), and only a load's first destination register is followed."""
    sass = subprocess.run([str(cuobjdump.cuobjdump_path()), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    pending: set[str] = set()
    found = []
    for line in sass.splitlines():
        match = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?P\w+\s+)?(\S+)\s*([^;]*);", line)
        if not match:
            continue
        opcode, operands = match.groups()
        dest, _, sources = operands.partition(",")
        read = set(re.findall(r"\bR\d+\b", sources))
        if opcode.startswith(("LDG", "STG")):
            read |= set(re.findall(r"\[(R\d+)", operands))  # addresses are read
        for register in pending & read:
            found.append(len(pending))
            pending.discard(register)
        if opcode.startswith("LDG") and (written := re.findall(r"\bR\d+\b", dest)):
            pending.add(written[0])
    return found


# Compiles the combine's configurations for sm_90a into argv[1]; prints name, SPLITS_PAD, cubin, spills.
COMBINE_BUILD = """
import json, sys
from pathlib import Path
from dsactl.build import arch, triton_aot
configs = [c for c in triton_aot.discover()
           if c.unit == "attention.triton_sparse_mla" and c.name.startswith("sparse_mla_combine_")]
sm90a = next(a for a in arch.ARCHES if a.name == "sm90a")
rows, _ = triton_aot.build(configs, sm90a, Path(sys.argv[1]), jobs=2, on_compiled=lambda *event: None)
spills = {r.configuration: r.spills for r in rows}
for c in configs:
    print(json.dumps([c.name, c.spec["constexprs"]["SPLITS_PAD"], str(c.out_dir(Path(sys.argv[1])) / f"{c.name}.cubin"),
                      spills[c.name]]))
"""


def test_the_attention_combine_issues_its_splits_loads_before_their_sums(tmp_path):
    """Each configuration of the split-by-split form (scaled partials) sums with every split's loads already
    in flight: a load's value is first read with at least splits / 2 loads outstanding (median). (A runtime
    loop over groups of splits compiles to one split's loads, its sums, the next split's loads: two in
    flight.) Every configuration builds without spills. The fp32 partials' one-tile form, whose loads ptxas
    interleaves with the reduction, is held to its measured time instead (docs/design.md, Measured choices,
    "Triton attention kernel")."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # a child: this process may interpret
    done = subprocess.run([sys.executable, "-c", COMBINE_BUILD, str(tmp_path)], env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    built = [json.loads(line) for line in done.stdout.splitlines()]
    assert built and not any(spills for *_, spills in built)
    scaled = [(name, splits, cubin) for name, splits, cubin, _ in built if name.endswith("_scaled")]
    assert scaled
    for name, splits, cubin in scaled:
        in_flight = sorted(_loads_in_flight(Path(cubin)))
        assert in_flight[len(in_flight) // 2] >= splits // 2, (name, in_flight)
